"""Array classification through the array API: which objects are arrays, their namespace, which
are floating (parameter candidates) or complex; cached per type (and dtype).

Below the adapters and the core alike (it imports no functorkit module): an adapter warms these
caches when it is imported (``adapters/torch.py``), and ``functorkit._xp`` re-exports every name
here with the descriptions and the device helpers (docs/adapters.md, "Import layering").
``np.matrix`` is refused here, where a leaf is classified, with a `TypeError` that says how to fix
it (callers add the path).
"""

from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, NamedTuple

import array_api_compat
import numpy as np

__all__ = [
    "MATRIX_MESSAGE",
    "Kind",
    "inexact_flags",
    "inexact_one_type",
    "is_array",
    "is_complex",
    "is_inexact_array",
    "namespace",
    "promote_dtypes",
]

_IS_ARRAY: dict[type, bool] = {}
_NAMESPACE: dict[type, Any] = {}
# per array type, per dtype: a traced (torch.compile) lookup for a tensor then meets torch dtypes
# only, never a NumPy dtype of another library (ml_dtypes' float4/float6 dtypes: Dynamo cannot
# compare them, and a lookup in a dict holding one broke the graph: tests/test_compile.py)
_INEXACT: dict[type, dict[Any, bool]] = {}
_COMPLEX: dict[type, dict[Any, bool]] = {}
_DTYPE_OF = operator.attrgetter("dtype")

#: why ``np.matrix`` is refused (a constant: one text wherever it is met)
MATRIX_MESSAGE = (
    "found an np.matrix, which is not an array API array (it is always 2-D and `*` is a matrix "
    "product), so functorkit cannot treat it as a parameter or as an array constant. Expected an "
    "array of an array API library; fix: convert it with np.asarray(m) (same values, an ndarray)."
)


class Kind(NamedTuple):
    """Namespace, dtype and device of an array (device None: unknown, e.g. a JAX tracer)."""

    xp: Any
    dtype: Any
    device: Any


# ---------------------------------------------------------------- classification


def is_array(x: Any) -> bool:
    """True for an array of any array-API backend (NumPy scalars are not arrays).

    Raises
    ------
    TypeError
        For an ``np.matrix`` (see `MATRIX_MESSAGE`).
    """
    t = type(x)
    try:
        return _IS_ARRAY[t]
    except KeyError:
        pass
    if issubclass(t, np.matrix):
        raise TypeError(MATRIX_MESSAGE)
    out = bool(array_api_compat.is_array_api_obj(x)) and not isinstance(x, np.generic)
    _IS_ARRAY[t] = out
    return out


def namespace(x: Any) -> Any:
    """The array API namespace of array `x` (array_api_compat), cached per type."""
    t = type(x)
    try:
        return _NAMESPACE[t]
    except KeyError:
        xp = array_api_compat.array_namespace(x)
        _NAMESPACE[t] = xp
        return xp


def is_inexact_array(x: Any) -> bool:
    """True for a real-floating or complex-floating array (any byte order): a parameter candidate."""
    if not is_array(x):
        return False
    try:
        return _INEXACT[type(x)][x.dtype]
    except KeyError:
        out = _is_kind(namespace(x), x.dtype, ("real floating", "complex floating"))
        _INEXACT.setdefault(type(x), {})[x.dtype] = out
        return out


def inexact_flags(leaves: list[Any]) -> list[bool]:
    """``is_inexact_array`` of each leaf; when every leaf is an array, in C-level passes over the
    leaves and one classification per (type, dtype) (bench_scale ``fk.destructure(d)`` and ``fk.add(d, d)`` rows)."""
    types = list(map(type, leaves))
    for t, x in dict(zip(types, leaves)).items():  # one leaf of each type
        if t not in _IS_ARRAY:
            is_array(x)  # classifies the type (and refuses np.matrix)
        if not _IS_ARRAY[t]:
            return list(map(is_inexact_array, leaves))
    dtypes = list(map(_DTYPE_OF, leaves))
    if len(set(types)) == 1:  # one array type: classify each dtype once, no tuple per leaf
        by_dtype = {}
        for dt, x in dict(zip(dtypes, leaves)).items():
            by_dtype[dt] = is_inexact_array(x)
        return list(map(by_dtype.__getitem__, dtypes))
    keys = list(zip(types, dtypes))
    by_key = {key: is_inexact_array(x) for key, x in dict(zip(keys, leaves)).items()}
    return list(map(by_key.__getitem__, keys))


def inexact_one_type(leaves: list[Any]) -> tuple[list[bool], list[Any]] | None:
    """``(is_inexact_array of each leaf, each leaf's dtype)`` when `leaves` are arrays of one type
    (the common model): one C-level pass over the types, one over the dtypes, and one cached
    lookup per dtype. None for no leaves, several types, or leaves that are not arrays (then
    `inexact_flags`)."""
    if not leaves:
        return None
    t0 = type(leaves[0])
    if not all(map(operator.is_, map(type, leaves), repeat(t0))):
        return None
    ok = _IS_ARRAY.get(t0)
    if ok is None:
        ok = is_array(leaves[0])  # classifies the type (and refuses np.matrix)
    if not ok:
        return None
    dtypes = list(map(_DTYPE_OF, leaves))
    known = _INEXACT.get(t0)
    if known is None:  # (no new dict made per call)
        known = _INEXACT.setdefault(t0, {})
    try:
        return list(map(known.__getitem__, dtypes)), dtypes
    except KeyError:  # a dtype met for the first time: classified once, into `known`
        for dt, x in dict(zip(dtypes, leaves)).items():
            if dt not in known:
                is_inexact_array(x)
    return list(map(known.__getitem__, dtypes)), dtypes


def _is_kind(xp: Any, dtype: Any, kind: Any) -> bool:
    if isinstance(dtype, np.dtype):
        if not dtype.isnative:
            dtype = dtype.newbyteorder("=")  # array_api_compat knows native dtypes only
        if dtype.kind in "Vf" and _ml_float(dtype):
            # ml_dtypes' bfloat16/float8 (NumPy and Dask arrays of checkpoints): real floating, which
            # the array API's isdtype does not know; without this they would be silent constants
            # (kind "V" for most, "f" for float8_e5m2: both)
            return "real floating" in ((kind,) if isinstance(kind, str) else kind)
    try:
        return bool(xp.isdtype(dtype, kind))
    except (TypeError, ValueError):  # a dtype outside the array API (structured, object, string)
        return False


def _ml_float(dtype: np.dtype[Any]) -> bool:
    """A floating dtype of the ``ml_dtypes`` package (``bfloat16``, ``float8_*``...)."""
    return dtype.type.__module__.startswith("ml_dtypes") and dtype.name.startswith(("float", "bfloat"))


def is_complex(x: Any) -> bool:
    """True if array `x` (or a `Kind`) has a complex floating dtype (cached per type and dtype)."""
    if type(x) is Kind:
        return _is_kind(x.xp, x.dtype, "complex floating")
    try:
        return _COMPLEX[type(x)][x.dtype]
    except KeyError:
        out = _COMPLEX.setdefault(type(x), {})[x.dtype] = _is_kind(namespace(x), x.dtype, "complex floating")
        return out


# Python's own leaf types are classified now: a first call traced by torch.compile would
# otherwise classify them through array_api_compat's lru_cache, which Dynamo warns about.
_v: object
for _v in (None, False, 0, 0.0, 0j, "", b"", [], (), {}):
    is_array(_v)
del _v


def promote_dtypes(xp: Any, dtypes: list[Any]) -> Any:
    """``xp.result_type`` of distinct floating/complex `dtypes`, and where the library has no promotion
    between two of them (NumPy's ml_dtypes bfloat16 with float16, torch's float8 with anything) the
    narrow floating dtypes (under 32 bits) taken as float32 first: bfloat16 with float16 is float32
    (as torch promotes them), float8 with float64 float64, with complex64 complex64. One rule for
    every operation that builds one array of several parameters' dtypes (`fk.destructure`,
    `fk.stack`, the reductions)."""
    if len(dtypes) == 1:
        return dtypes[0]
    try:
        return xp.result_type(*dtypes)
    except (TypeError, ValueError, RuntimeError):  # NumPy's DTypePromotionError; torch's float8 RuntimeError
        wide = [xp.float32 if getattr(d, "itemsize", 4) < 4 else d for d in dtypes]
        return xp.result_type(*dict.fromkeys(wide))
