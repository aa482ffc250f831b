"""Comparing whole models: `allclose`, `assert_allclose`, `all_finite` (SPEC section 16).

`allclose` records both trees once (`record_plain`), compares their tree definitions (node
types, keys, aux data, ties, trainable flags: `TreeDef` equality), then every pair of array
leaves in two phases: a quick test per leaf (``|a - b| - (atol + rtol * |b|) <= 0``, all
entries), whose 0-d results are stacked and reduced once per namespace and device (one host
synchronisation on torch, one ``compute`` on Dask); only when that says "not all close" are the
failing leaves checked exactly, with NumPy's ``isclose`` rule (equal infinities are close, NaN is
not unless ``equal_nan``), leaf by leaf. Every leaf is compared by value: floats narrower than 32
bits (float16, bfloat16, float8) in float32 (`_by_value`, on their device, before anything else:
torch has no float8 arithmetic, and torch's host copies of bfloat16/float8 are bit patterns),
integers in float64 (`_close_mask`, after an exact test); non-numeric arrays (str, datetime64,
structured...) by ``==`` in the same two phases, object arrays element by element on the host
(`_object_unequal`). The decisions are in ``docs/tools.md``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np

from . import _program as program
from ._errors import PolicyError, StructureError, known_shape
from ._keypath import KeyPath
from ._lockstep import _as_array, _reduce_params
from ._record import record_plain
from ._reduce import sharded_total
from ._treedef import TreeDef
from ._xp import (
    describe_array,
    describe_device,
    describe_dtype,
    describe_namespace,
    device_of,
    is_array,
    namespace,
    same_device,
)
from .adapters import adapter_of

__all__ = ["all_finite", "allclose", "assert_allclose"]

_NAMESPACES = ("same", "any")


# --------------------------------------------------------------------------- arguments


def _check_args(fname: str, rtol: Any, atol: Any, equal_nan: Any, namespaces: Any) -> tuple[float, float]:
    out = []
    for name, v in (("rtol", rtol), ("atol", atol)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
            msg = f"fk.{fname}: `{name}` must be a real number, got {type(v).__name__} ({v!r})."
            raise TypeError(msg)
        f = float(v)
        if math.isnan(f) or f < 0:
            msg = f"fk.{fname}: `{name}` must be a non-negative number, got {v!r}."
            raise ValueError(msg)
        out.append(f)
    if type(equal_nan) is not bool:
        msg = f"fk.{fname}: `equal_nan` must be True or False, got {type(equal_nan).__name__} ({equal_nan!r})."
        raise TypeError(msg)
    if namespaces not in _NAMESPACES:
        msg = (
            f"fk.{fname}: `namespaces` must be 'same' (default: both models' arrays in one library and "
            f"on one device) or 'any' (compare across libraries and devices, on the host), got {namespaces!r}."
        )
        raise ValueError(msg)
    return out[0], out[1]


# --------------------------------------------------------------------------- structure


def _structure_difference(ta: TreeDef, tb: TreeDef, b: Any) -> str:
    """Where and how two unequal tree definitions differ (the first difference, in walk order)."""
    try:
        ta.flatten_up_to(b, names=("a", "b"))
    except StructureError as e:
        return str(e)
    order = program.key_order_difference(ta, tb)
    if order is not None:
        idx, ka, kb = order
        return (
            f"at {ta.entry_path(idx).display}: the keys are in another order: {ka} in `a` vs {kb} in `b` "
            "(key order is structure). Expected the same keys in the same order; fix: build both models "
            "with one key order."
        )
    pa = ta._ties() or range(ta.num_positions)
    pb = tb._ties() or range(tb.num_positions)
    if ta.num_positions == tb.num_positions and list(pa) != list(pb):
        paths = ta.position_paths()
        for p, (ja, jb) in enumerate(zip(pa, pb, strict=True)):
            if ja != jb:
                first_a = paths[list(pa).index(ja)]
                first_b = paths[list(pb).index(jb)]
                return (
                    f"at {paths[p].display}: the ties differ: in `a` this is the leaf first met at "
                    f"{first_a.display}, in `b` the one first met at {first_b.display}. Expected the same "
                    "arrays shared at the same places (fk.copy and re(p) keep ties)."
                )
    if ta.trainable != tb.trainable:
        for path, fa, fb in zip(ta.paths, ta.trainable, tb.trainable, strict=True):
            if fa != fb:

                def word(f: bool) -> str:
                    return "trainable" if f else "frozen"

                return (
                    f"at {path.display}: {word(fa)} in `a` but {word(fb)} in `b` (e.g. requires_grad). "
                    "Expected the same trainable leaves."
                )
    aux = program.aux_difference(ta, tb)
    if aux is not None:
        idx, cls = aux
        return (
            f"at {ta.entry_path(idx).display}: the static (aux) data of the {cls.__qualname__} node "
            "differs (e.g. a module's training flag or plain attributes, a dataclass's static fields). "
            "Expected equal static data."
        )
    return "the tree definitions differ (node types, keys, aux data, ties or trainable flags)."


# --------------------------------------------------------------------------- leaves


def _isdtype(xp: Any, dt: Any, kind: str, np_kinds: str) -> bool:
    """``xp.isdtype(dt, kind)``, else (a namespace or dtype it does not know) the NumPy kind test."""
    try:
        return bool(xp.isdtype(dt, kind))
    except (TypeError, ValueError, AttributeError):
        return isinstance(dt, np.dtype) and dt.kind in np_kinds


def _is_int(xp: Any, dt: Any) -> bool:
    return _isdtype(xp, dt, "integral", "iu")


def _is_unsigned(xp: Any, dt: Any) -> bool:
    return _isdtype(xp, dt, "unsigned integer", "u")


def _is_bool(xp: Any, dt: Any) -> bool:
    return _isdtype(xp, dt, "bool", "b")


def _exact_kind(dt: Any) -> bool:
    """A non-numeric dtype (NumPy's str, bytes, StringDType, object, datetime64, timedelta64,
    structured/void; not ml_dtypes' numbers): compared exactly, with ``==``, no tolerance."""
    return isinstance(dt, np.dtype) and dt.kind in "USTOMmV" and not dt.type.__module__.startswith("ml_dtypes")


def _exact_mask(x: Any, y: Any, equal_nan: bool) -> Any:
    """Entry by entry equality of two arrays of one non-numeric dtype, with the arrays' own ``==``
    (NumPy's or Dask's); NaT (unequal to itself) equal to NaT when `equal_nan`."""
    eq = x == y
    if equal_nan and x.dtype.kind in "Mm":
        eq = eq | ((x != x) & (y != y))
    return eq


def _object_unequal(x: Any, y: Any, equal_nan: bool) -> int:
    """How many entries of two object arrays differ, each pair compared as Python objects with
    `_scalar_equal` (``==``; an ``==`` that raises or answers no bool means unequal), on the host."""
    hx, hy = adapter_of(x).to_host(x), adapter_of(y).to_host(y)
    return sum(not _scalar_equal(p, q, equal_nan) for p, q in zip(hx.reshape(-1).tolist(), hy.reshape(-1).tolist()))


def _by_value(ad: Any, x: Any) -> Any:
    """`x` (of adapter `ad`) as the comparison computes with it: a float narrower than 32 bits
    (float16, bfloat16, float8) in float32 on its device (the adapter's `accumulate_dtype`; float32
    holds each of their values exactly), so that tolerances and differences are those of the
    values, never rounded to the narrow type, and torch float8 (no arithmetic) and host copies
    (torch's are bit patterns) work; any other dtype as it is (a dict lookup per leaf)."""
    wide = ad.accumulate_dtype(x.dtype)
    return x if wide is None else ad.xp.astype(x, wide)


def _wide_float(xp: Any) -> Any:
    """The float integers are compared in: float64 (NumPy's ``isclose``), or float32 where the
    namespace has none (JAX without x64)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return xp.float64
    return info().dtypes(kind="real floating").get("float64", xp.float32)


def _quick(xp: Any, x: Any, y: Any, rtol: float, atol: float) -> Any:
    """A 0-d bool: every entry close (True is exact; False may still be close: infinities, NaN)."""
    dt = x.dtype
    if _is_bool(xp, dt) or _is_int(xp, dt) or _exact_kind(dt):
        return xp.all(x == y)
    # d <= tol, except where tol is infinite (y = +-inf): there d - tol is NaN, left to `_exact`
    return xp.all((xp.abs(x - y) - (xp.abs(y) * rtol + atol)) <= 0)


def _close_mask(xp: Any, x: Any, y: Any, rtol: float, atol: float, equal_nan: bool) -> Any:
    """NumPy's ``isclose(x, y, rtol, atol, equal_nan)`` entry by entry, without broadcasting."""
    dt = x.dtype
    if _is_bool(xp, dt):
        return x == y
    if _exact_kind(dt):
        return _exact_mask(x, y, equal_nan)
    if _is_int(xp, dt):
        # NumPy's isclose on the float64 values: no unsigned wrap-around, no signed overflow
        # (int8 100 - -100); the exact test came first (`_quick`). float64 holds integers exactly
        # only below 2**53: for signed 64-bit integers, where it calls two of them close, their
        # difference is also taken exactly where it cannot overflow (one sign; of two signs it is
        # at least |y|, which float64 tells apart): 2**62 and 2**62 + 1 are not close at zero
        # tolerance (torch.allclose agrees). (Unsigned 64-bit: float64 only; torch cannot compare them.)
        wide = _wide_float(xp)
        xf, yf = xp.astype(x, wide), xp.astype(y, wide)
        tol = atol + rtol * xp.abs(yf)
        close = xp.abs(xf - yf) <= tol
        if _is_unsigned(xp, dt) or getattr(dt, "itemsize", 8) < 8:
            return close
        d = xp.abs(xp.where((x >= 0) == (y >= 0), x - y, xp.zeros_like(x)))
        return (x == y) | (close & (xp.astype(d, wide) <= tol))
    d = xp.abs(x - y)
    close = ((d <= atol + rtol * xp.abs(y)) & xp.isfinite(y)) | (x == y)
    if equal_nan:
        close = close | (xp.isnan(x) & xp.isnan(y))
    return close


def _differences(xp: Any, x: Any, y: Any, close: Any) -> tuple[int, float, float]:
    """(entries not close, largest |x - y|, largest |x - y| / |y|) over the entries not close."""
    ad = adapter_of(x)
    c = ad.to_host(close)
    hx, hy = ad.to_host(x), ad.to_host(y)
    bad = ~c
    with np.errstate(all="ignore"):
        if hx.dtype.kind in "iu":  # the entries not close, as Python ints: exact differences, no overflow
            by = hy[bad].astype(object)
            d = np.abs(hx[bad].astype(object) - by).astype(np.float64)
            r = d / np.abs(by.astype(np.float64))
        else:
            if hx.dtype.kind == "b":
                hx, hy = hx.astype(np.float64), hy.astype(np.float64)
            d = np.abs(hx - hy)[bad]
            r = d / np.abs(hy[bad])
    n = int(np.count_nonzero(bad))
    if n == 0:
        return 0, 0.0, 0.0
    return (
        n,
        float(np.nanmax(d)) if not np.all(np.isnan(d)) else math.nan,
        (float(np.nanmax(r)) if not np.all(np.isnan(r)) else math.nan),
    )


def _sized(shape: tuple[Any, ...]) -> bool:
    """Whether every size of `shape` is an int (one C call for the common case; `known_shape`
    checks the others and names a Dask array's unknown ``nan`` sizes)."""
    try:
        return type(math.prod(shape)) is int
    except TypeError:  # None sizes
        return False


def _dtype_text(dt: Any) -> str:
    """A dtype for messages: NumPy's own spelling for the non-numeric ones ('<U3', not 'str96')."""
    return str(dt) if _exact_kind(dt) else describe_dtype(dt)


def _exact_text(x: Any) -> str:
    return f"{x.dtype} array of shape {tuple(x.shape)}, compared exactly: a non-numeric dtype has no tolerance"


class _Verdict:
    """What `_compare` found: None when all close, else the first difference and the count."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.first: str | None = None
        self.count = 0

    def add(self, msg: str) -> None:
        if self.first is None:
            self.first = msg
        self.count += 1


def _same_place(x: Any, y: Any) -> bool:
    return namespace(x) is namespace(y) and (
        adapter_of(x).one_device or same_device(adapter_of(x).device(x), adapter_of(y).device(y))
    )


def _scalar_equal(x: Any, y: Any, equal_nan: bool) -> bool:
    if type(x) is float and type(y) is float and math.isnan(x) and math.isnan(y):
        return equal_nan  # even one NaN object at both places (Python's `is` shortcut would say equal)
    if x is y:
        return True
    try:
        r = x == y
    except Exception:  # noqa: BLE001 -- an __eq__ that raises means "not equal" here
        return False
    return r is True or (type(r) is np.bool_ and bool(r))


def _compare(
    fname: str, a: Any, b: Any, rtol: float, atol: float, equal_nan: bool, namespaces: str, full: bool
) -> _Verdict | None:
    """None when `a` and `b` are close; else a `_Verdict` (stopping at the first difference unless
    `full`). Sharded models (torch DTensor) are compared shard by shard on each rank, and the ranks
    agree on the answer with one all-reduce (``any_rank``, docs/sharded.md), so every rank returns
    the same."""
    seen: list[Any] = []
    verdict = _compare_here(fname, a, b, rtol, atol, equal_nan, namespaces, full, seen)
    any_rank = _any_rank_hook(seen[0]) if seen else None
    if any_rank is None:
        return verdict
    if any_rank(verdict is not None) and verdict is None:
        verdict = _Verdict()
        verdict.add(
            "the shards on this rank are close, but another rank found a difference in its shards "
            "(its message names the path)."
        )
    return verdict


def _any_rank_hook(leaves: list[Any]) -> Any:
    """The ``any_rank(flag) -> bool`` of the first adapter among `leaves`' array types that has
    sharded arrays in these leaves (torch DTensor), or None (one look per leaf type)."""
    for x in dict(zip(map(type, leaves), leaves)).values():
        if is_array(x):
            hook = getattr(adapter_of(x), "any_rank", None)
            if hook is not None:
                found = hook(leaves)
                if found is not None:
                    return found
    return None


def _compare_here(
    fname: str,
    a: Any,
    b: Any,
    rtol: float,
    atol: float,
    equal_nan: bool,
    namespaces: str,
    full: bool,
    seen: list[Any],
) -> _Verdict | None:
    """`_compare` on this process's arrays (a DTensor: its local shard); `seen` gets `a`'s leaves."""
    la, ta = record_plain(a, track=True)
    seen.append(la)
    lb, tb = record_plain(b, track=True)
    ta.refuse_holders(la)  # SPEC 12: arrays inside an unknown object cannot be compared
    tb.refuse_holders(lb)
    verdict = _Verdict()
    if ta != tb:
        verdict.add(_structure_difference(ta, tb, b))
        return verdict
    paths: tuple[KeyPath, ...] | None = None

    def path(j: int) -> KeyPath:
        nonlocal paths
        if paths is None:
            paths = ta.paths
        return paths[j]

    # (position, x, y, `a`'s leaf as the message describes it): x and y by value (`_by_value`)
    pairs: list[tuple[int, Any, Any, Any]] = []  # leaves compared on the device
    host: list[tuple[int, Any, Any, Any]] = []  # namespaces="any" across libraries/devices: on the host
    for j, (x, y) in enumerate(zip(la, lb, strict=True)):
        xa, ya = is_array(x), is_array(y)
        if not (xa or ya):
            if not _scalar_equal(x, y, equal_nan):
                verdict.add(f"at {path(j).display}: {x!r} in `a` vs {y!r} in `b` (compared with ==).")
                if not full:
                    return verdict
            continue
        if not (xa and ya):
            what = describe_array(x) if xa else describe_array(y)
            other = type(y if xa else x).__name__
            side, oside = ("a", "b") if xa else ("b", "a")
            verdict.add(f"at {path(j).display}: an array in `{side}` ({what}) but a {other} in `{oside}`.")
            if not full:
                return verdict
            continue
        same = _same_place(x, y)
        if not same and namespaces == "same":
            xn, yn = namespace(x), namespace(y)
            where = (
                f"a {describe_namespace(xn)} array in `a` and a {describe_namespace(yn)} array in `b`"
                if xn is not yn
                else f"device {describe_device(device_of(x))} in `a` and {describe_device(device_of(y))} in `b`"
            )
            msg = (
                f"at {path(j).display}: fk.{fname}: {where}. Expected both models in one library and on one "
                "device: functorkit does not convert silently; fix: pass namespaces='any' to compare on the "
                "host (copies), or move one model first."
            )
            raise PolicyError(msg)
        sx, sy = tuple(x.shape), tuple(y.shape)
        if not (_sized(sx) and _sized(sy)):  # Dask's nan sizes: a StructureError, as fk.summary's
            sx = known_shape(x, f"fk.{fname}: at {path(j).display}, the array of `a`")
            sy = known_shape(y, f"fk.{fname}: at {path(j).display}, the array of `b`")
        if sx != sy:
            verdict.add(f"at {path(j).display}: shape {sx} in `a` vs {sy} in `b` (no broadcasting).")
            if not full:
                return verdict
            continue
        exact = _exact_kind(x.dtype)
        if (
            (not _exact_kind(y.dtype) or x.dtype != y.dtype)  # '<U3' vs '<U5', two structured dtypes
            if exact
            else describe_dtype(x.dtype) != describe_dtype(y.dtype)
        ):
            verdict.add(f"at {path(j).display}: dtype {_dtype_text(x.dtype)} in `a` vs {_dtype_text(y.dtype)} in `b`.")
            if not full:
                return verdict
            continue
        ad = adapter_of(x)
        if not (ad.readable(ad.device(x)) and adapter_of(y).readable(adapter_of(y).device(y))):
            msg = (
                f"at {path(j).display}: fk.{fname}: {describe_array(x)} vs {describe_array(y)}: arrays on a device "
                "that holds no values (torch 'meta') cannot be compared; fix: materialise the model first."
            )
            raise TypeError(msg)
        local = getattr(ad, "local_pair", None)  # sharded arrays (torch DTensor): their local shards
        if local is not None:
            lxy = local(x, y)
            if isinstance(lxy, str):  # shards that hold different elements: not comparable here
                verdict.add(f"at {path(j).display}: {lxy}.")
                if not full:
                    return verdict
                continue
            x, y = lxy
        if exact and x.dtype.kind == "O":  # Python objects: compared one by one with ==
            n = _object_unequal(x, y, equal_nan)
            if n:
                verdict.add(f"at {path(j).display}: {n} of {math.prod(sx)} entries differ ({_exact_text(x)}).")
                if not full:
                    return verdict
            continue
        # no autograd history for the comparison's temporaries (torch: detached views, no copies)
        ay = adapter_of(y)
        (pairs if same else host).append((j, _by_value(ad, ad.detach(x)), _by_value(ay, ay.detach(y)), x))
    for j, x, y, x0 in host:  # widened on their devices first: the host copies hold values, not bits
        pairs.append((j, adapter_of(x).to_host(x), adapter_of(y).to_host(y), x0))
    failing = _quick_failures(pairs, rtol, atol)
    for k in failing:
        j, x, y, x0 = pairs[k]
        xp = namespace(x)
        close = _close_mask(xp, x, y, rtol, atol, equal_nan)
        if bool(xp.all(close)):
            continue
        size = math.prod(int(s) for s in x.shape)
        if _exact_kind(x.dtype):
            n = int(np.count_nonzero(~adapter_of(x).to_host(close)))
            verdict.add(f"at {path(j).display}: {n} of {size} entries differ ({_exact_text(x0)}).")
            if not full:
                return verdict
            continue
        n, dmax, rmax = _differences(xp, x, y, close)
        verdict.add(
            f"at {path(j).display}: {n} of {size} entries differ ({describe_array(x0)});\n"
            f"largest absolute difference {dmax:.6g}, largest relative difference {rmax:.6g} "
            f"(rtol={rtol:g}, atol={atol:g})."
        )
        if not full:
            return verdict
    return None if verdict.first is None else verdict


def _quick_failures(pairs: list[tuple[int, Any, Any, Any]], rtol: float, atol: float) -> list[int]:
    """Indices into `pairs` whose quick test fails, in order: the quick tests of one namespace and
    device are stacked and reduced once (one synchronisation), and read back only if one fails."""
    groups: dict[Any, list[int]] = {}
    results: list[Any] = []
    for k, (_, x, y, _) in enumerate(pairs):
        results.append(_quick(namespace(x), x, y, rtol, atol))
        ad = adapter_of(x)
        key = (type(x), None if ad.one_device else str(ad.device(x)))
        groups.setdefault(key, []).append(k)
    failing: list[int] = []
    for ks in groups.values():
        x0 = pairs[ks[0]][1]
        xp = namespace(x0)
        if len(ks) == 1:
            if not bool(results[ks[0]]):
                failing.append(ks[0])
            continue
        stacked = xp.stack([results[k] for k in ks])
        if bool(xp.all(stacked)):
            continue
        flags = adapter_of(x0).to_host(stacked)
        failing.extend(k for k, ok in zip(ks, flags.tolist(), strict=True) if not ok)
    failing.sort()
    return failing


# --------------------------------------------------------------------------- public


def allclose(
    a: Any,
    b: Any,
    /,
    *,
    rtol: float = 1e-05,
    atol: float = 1e-08,
    equal_nan: bool = False,
    namespaces: Literal["same", "any"] = "same",
) -> bool:
    """True when two models have the same structure and every array leaf is close.

    The structure is `TreeDef` equality (node types, keys, static/aux data,
    ties, trainable flags). Every array leaf is compared, parameters,
    buffers and integer arrays alike, with NumPy's rule
    ``|a - b| <= atol + rtol * |b|`` entry by entry (`b` is the reference;
    equal infinities are close; NaN is unequal to NaN unless
    ``equal_nan=True``), on the values: floats narrower than 32 bits
    (float16, bfloat16, float8) in float32, integers in float64 (no
    overflow); shapes and dtypes must be equal (never
    broadcasting, never promoting); arrays of a non-numeric dtype (str,
    object, datetime64, structured...) exactly (NaT equal to NaT only
    with ``equal_nan``); non-array leaves are compared with ``==``. A
    difference in structure, shape, dtype or value gives ``False``, never
    an exception.

    Parameters
    ----------
    a, b
        The models.
    rtol, atol
        Relative and absolute tolerance (NumPy's defaults).
    equal_nan
        Count NaN as equal to NaN (also for float leaves).
    namespaces
        ``"same"`` (default): each pair of arrays must be of one library
        and on one device, else `PolicyError` (functorkit converts nothing
        silently). ``"any"``: such pairs are copied to the host as NumPy
        arrays and compared there (dtypes compared by name).

    Returns
    -------
    bool
        A Python bool. The leaves' quick tests are reduced on their device
        and read back once (one host synchronisation on torch, one
        ``compute`` on Dask).

    Raises
    ------
    PolicyError
        Two arrays at one path of different libraries or devices, with
        ``namespaces="same"``.
    StructureError
        Either model holds an object no registry knows that holds arrays
        (SPEC 12: its arrays cannot be compared); register it, or
        ``fk.register_leaf`` it to compare it with ``==``. Or a Dask array
        of unknown sizes (after boolean indexing; call
        ``x.compute_chunk_sizes()`` first).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> a = {"w": np.array([1.0, 2.0]), "step": np.array(3)}
    >>> fk.allclose(a, {"w": np.array([1.0, 2.0 + 1e-9]), "step": np.array(3)})
    True
    >>> fk.allclose(a, {"w": np.array([1.0, 2.1]), "step": np.array(3)})
    False
    >>> fk.allclose(a, {"w": np.array([1.0, 2.0])})  # a different structure
    False
    """
    r, t = _check_args("allclose", rtol, atol, equal_nan, namespaces)
    with np.errstate(all="ignore"):  # inf - inf and NaN in NumPy arithmetic are expected here
        return _compare("allclose", a, b, r, t, equal_nan, namespaces, full=False) is None


def assert_allclose(
    a: Any,
    b: Any,
    /,
    *,
    rtol: float = 1e-07,
    atol: float = 0.0,
    equal_nan: bool = False,
    namespaces: Literal["same", "any"] = "same",
) -> None:
    """Raise `AssertionError` unless `allclose` holds; the message names the first differing path.

    Same rules as `allclose` (with ``numpy.testing.assert_allclose``'s
    default tolerances). The message names the first path where the models
    differ (in structure, ties, trainable flags, shape, dtype or values),
    what each side has there, for values the number of entries that differ
    and the largest absolute and relative differences, and how many leaves
    differ in all.

    Raises
    ------
    AssertionError
        The models differ.
    PolicyError
        Two arrays at one path of different libraries or devices, with
        ``namespaces="same"``.
    StructureError
        Either model holds an object no registry knows that holds arrays
        (SPEC 12: its arrays cannot be compared); register it, or
        ``fk.register_leaf`` it to compare it with ``==``. Or a Dask array
        of unknown sizes (call ``x.compute_chunk_sizes()`` first).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.assert_allclose({"w": np.array([1.0, 2.0])}, {"w": np.array([1.0, 2.0])})
    >>> try:
    ...     fk.assert_allclose({"w": np.array([1.0, 2.0])}, {"w": np.array([1.0, 2.5])})
    ... except AssertionError as e:
    ...     print(e)
    models differ (1 leaf); the first:
    at w: 1 of 2 entries differ (float64 array of shape (2,) on cpu);
    largest absolute difference 0.5, largest relative difference 0.2 (rtol=1e-07, atol=0).
    """
    __tracebackhide__ = True
    r, t = _check_args("assert_allclose", rtol, atol, equal_nan, namespaces)
    with np.errstate(all="ignore"):
        v = _compare("assert_allclose", a, b, r, t, equal_nan, namespaces, full=True)
    if v is not None:
        leaves = "leaf" if v.count == 1 else "leaves"
        msg = f"models differ ({v.count} {leaves}); the first:\n{v.first}"
        raise AssertionError(msg)


def _same(x: Any) -> Any:
    return x


def _finite(x: Any) -> Any:
    xp = namespace(x)
    ad = adapter_of(x)
    if x.dtype in ad.operator_less:  # torch float8: no isfinite of its own; float32 holds its values
        x = xp.astype(x, ad.compute_dtype(x.dtype))
    return xp.all(xp.isfinite(x))


def all_finite(model: Any, /, *, trainable_only: bool = True) -> Any:
    """Are all of a model's parameters finite (no NaN, no infinity)? A 0-d bool array.

    One ``all(isfinite(x))`` per distinct parameter (a tie once), stacked
    and reduced on the device: a 0-d bool array in the parameters'
    namespace and on their device, with no host synchronisation (call
    ``bool()`` yourself). Traceable by ``jax.jit`` and by
    ``torch.compile(fullgraph=True)`` without graph breaks.
    ``trainable_only=False`` looks at every floating or complex array
    (buffers, frozen parameters) too. A model with no such arrays gives
    ``numpy.asarray(True)`` (a 0-d NumPy array: there is no namespace to
    take).

    Raises
    ------
    PolicyError
        The parameters span several namespaces or devices (no single place
        for the result).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> m = {"w": np.array([1.0, 2.0]), "b": np.array([np.inf])}
    >>> fk.all_finite(m)
    array(False)
    >>> bool(fk.all_finite({"w": np.ones(2)})), bool(fk.all_finite({"step": 3}))
    (True, True)
    """
    try:
        # the parameters themselves (`_same`): a sharded model is reduced by the adapter below
        xp, xs = _reduce_params("all_finite", ("model",), (model,), None, trainable_only, _same)
    except ValueError as e:
        if type(e) is ValueError and "has no parameters" in str(e):
            return np.asarray(True)
        raise
    total = sharded_total("all_finite", ("model",), (model,), trainable_only, adapter_of(xs[0]), xs, None, 0.0)
    if total is not None:  # sharded (torch DTensor): local shards, one all-reduce (docs/sharded.md)
        return _as_array(total)
    parts = list(map(_finite, xs))
    if len(parts) == 1:
        return _as_array(parts[0])
    return _as_array(xp.all(xp.stack(parts)))
