"""Arithmetic on whole models: add, sub, scale, lincomb, lerp, mean, copy (reductions: ``_reduce.py``).

Every function walks its models once, in lock-step, with the one walk
(`functorkit._walk.walk`, ``track=True``). At each *parameter* (a
floating or complex array reached through trainable children, decided on the
first model) the models' arrays must agree in shape, dtype, namespace and
device, and the operation is done with that array's namespace; every other
leaf comes from the first model (arrays copied, anything else shared).
With ``trainable_only=False`` every floating or complex array is an operand
(buffers such as batch-norm running statistics, frozen parameters); integer
and boolean arrays (``num_batches_tracked``) still come from the first model,
copied: a model soup or task vector never changes a dtype.
Results are fresh arrays: no input is written to and no result shares memory
with an input. ``dot``/``norm`` reduce on the device and return a 0-d array;
nothing here moves a value to the host.

Where the array's adapter allows it (``inplace_ok``: NumPy, plain torch
tensors outside ``torch.func`` transforms) the accumulating operations
(``lincomb``, ``mean``) add into the fresh result in place: one allocation
per leaf instead of one per term, and autograd records it like the
hand-written expression. Every backend-specific operation (in-place
accumulation, ``lerp``, ``vdot``, copies) is a method of the adapter.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np

from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._record import record_plain
from ._treedef import _MISS
from ._typing import Tree as T
from ._walk import BUILD_NONE, BUILD_SAME, fmap, walk
from ._xp import (
    describe_array,
    describe_dtype,
    describe_namespace,
    device_of,
    inexact_flags,
    is_array,
    is_complex,
    is_inexact_array,
    namespace,
    same_device,
)
from .adapters import tracing
from .adapters._base import adapter_of

__all__ = [
    "add",
    "copy",
    "copy_array",
    "lerp",
    "lincomb",
    "mean",
    "scale",
    "sub",
]

_PY_SCALARS = (int, float, complex)


# --------------------------------------------------------------------------- helpers

_dtype_name = describe_dtype
_describe = describe_array
_is_complex = is_complex


def _ns_name(xp: Any) -> str:
    return describe_namespace(xp)


def _as_array(x: Any) -> Any:
    """NumPy reductions and 0-d arithmetic give NumPy scalars: make them 0-d arrays."""
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


def _real_dtype(xp: Any, dt: Any) -> Any:
    if xp.isdtype(dt, "complex floating"):
        return xp.float32 if dt == xp.complex64 else xp.float64
    return dt


def _same_device(a: Any, b: Any) -> bool:
    ad = adapter_of(a)
    return same_device(ad.device(a), adapter_of(b).device(b))


def copy_array(x: Any) -> Any:
    """An independent copy of array `x` (anything else is returned as it is).

    The adapter's ``clone_leaf``: NumPy arrays keep their subclass and memory
    order and come back writeable; torch tensors are copied detached from
    autograd history (like ``copy.deepcopy``): an ``nn.Parameter`` gives an
    ``nn.Parameter`` and a tensor that required grad gives a new leaf that
    requires grad.
    """
    if not is_array(x):
        return x
    return adapter_of(x).clone_leaf(x)


def _model_list(models: Any, fname: str, what: str = "models") -> list[Any]:
    """`models` as a list of models; a single model (dict, array, dataclass...) is a TypeError."""
    single = (
        isinstance(models, (Mapping, str, bytes))
        or is_array(models)
        or (dataclasses.is_dataclass(models) and not isinstance(models, type))
    )
    if not single:
        try:
            return list(models)
        except TypeError:
            single = True
    msg = (
        f"fk.{fname}: `{what}` must be a list (or tuple) of models, got a {type(models).__name__}, which "
        f"looks like a single model. Expected e.g. fk.{fname}("
        + ("[c1, c2], [m1, m2]" if fname == "lincomb" else "[m1, m2, m3]")
        + f"); fix: wrap it in a list, e.g. fk.{fname}("
        + ("[1.0], [model]" if fname == "lincomb" else "[model]")
        + ")."
    )
    raise TypeError(msg)


def _coefficient_list(coefficients: Any) -> list[Any]:
    """`coefficients` as a list; a single number or array is a TypeError that shows the fix."""
    if (
        isinstance(coefficients, (Mapping, str, bytes))
        or is_array(coefficients)
        or isinstance(coefficients, numbers.Number)
    ):
        single = True
    else:
        try:
            return list(coefficients)
        except TypeError:
            single = True
    assert single
    msg = (
        f"fk.lincomb: `coefficients` must be a list of numbers, one per model, got a "
        f"{type(coefficients).__name__} ({coefficients!r}). Expected e.g. fk.lincomb([0.5, 0.5], [m1, m2]); "
        "fix: wrap it in a list (fk.lincomb([c], [model])) or use fk.scale(c, model) for one model."
    )
    raise TypeError(msg)


# --------------------------------------------------------------------------- coefficients


def _coefficient(c: Any, what: str, fname: str, *, real: bool = False) -> Any:
    """A Python number (NumPy scalars become Python numbers: weak typing) or a 0-d array."""
    if isinstance(c, (bool, np.bool_)):
        msg = f"fk.{fname}: `{what}` must be a number or a 0-d array, got the bool {c!r}; pass 1 or 0 instead."
        raise TypeError(msg)
    if type(c) in _PY_SCALARS:
        out = c
    elif isinstance(c, np.generic) and c.dtype.kind in "iufc":
        kind = c.dtype.kind
        out = int(c) if kind in "iu" else float(c) if kind == "f" else complex(c)  # longdouble too
    elif isinstance(c, numbers.Number) and not is_array(c):
        if isinstance(c, numbers.Integral):
            out = int(c)
        elif isinstance(c, numbers.Real):
            out = float(c)
        elif isinstance(c, numbers.Complex):
            out = complex(c)
        else:
            msg = f"fk.{fname}: `{what}` is a {type(c).__name__}; expected a Python int, float or complex."
            raise TypeError(msg)
    elif is_array(c):
        if c.ndim != 0:
            msg = (
                f"fk.{fname}: `{what}` must be a Python number or a 0-d array, got an array of shape "
                f"{tuple(c.shape)}; to weight each parameter differently use fk.fmap."
            )
            raise ValueError(msg)
        out = c
    else:
        msg = f"fk.{fname}: `{what}` must be a Python number or a 0-d array, got {type(c).__name__}."
        raise TypeError(msg)
    if real and (type(out) is complex or (is_array(out) and _is_complex(out))):
        msg = f"fk.{fname}: `{what}` must be real, got {out!r}."
        raise TypeError(msg)
    return out


def _check_coefficient(path: KeyPath, x: Any, c: Any, what: str, fname: str) -> None:
    """A coefficient must not change the parameter's dtype, namespace or device."""
    if type(c) is complex:
        if not _is_complex(x):
            msg = (
                f"at {path.display}: fk.{fname}: `{what}` is complex ({c!r}) but the parameter is a real "
                f"{_describe(x)}; a complex coefficient would silently make it complex. Expected a real "
                "coefficient for real parameters; fix: pass a real number, or make the parameters complex first."
            )
            raise PolicyError(msg)
        return
    if not is_array(c):
        return
    xp = namespace(x)
    if namespace(c) is not xp:
        msg = (
            f"at {path.display}: fk.{fname}: `{what}` is a {_ns_name(namespace(c))} array but the parameter "
            f"is a {_ns_name(xp)} array. Expected a coefficient of the parameters' namespace; fix: pass a "
            "Python number or a 0-d array made with the parameters' namespace."
        )
        raise PolicyError(msg)
    if not _same_device(c, x):
        msg = (
            f"at {path.display}: fk.{fname}: `{what}` is on {device_of(c)} but the parameter is on "
            f"{device_of(x)}. Expected the same device; fix: move the coefficient, or pass a Python number."
        )
        raise PolicyError(msg)
    if xp.result_type(c.dtype, x.dtype) != x.dtype:
        msg = (
            f"at {path.display}: fk.{fname}: `{what}` has dtype {_dtype_name(c.dtype)}, which would promote "
            f"the parameter ({_describe(x)}) to {_dtype_name(xp.result_type(c.dtype, x.dtype))}. Expected a "
            "coefficient that keeps the parameter's dtype; fix: cast the coefficient to the parameters' "
            "dtype, or pass a Python number (weakly typed)."
        )
        raise PolicyError(msg)


# --------------------------------------------------------------------------- the lock-step engine

_SHAPE_OF = operator.attrgetter("shape")
_DTYPE_OF = operator.attrgetter("dtype")
#: the column path of `_columns` is on (tests turn it off to compare both paths)
COLUMNS = [True]


def _check_same(fname: str, names: Sequence[str], path: KeyPath, x: Any, others: Sequence[Any]) -> None:
    """Each other model's array at a parameter position matches the first model's."""
    xp = namespace(x)
    for j, o in enumerate(others, start=1):
        if (
            type(o) is type(x)
            and o.shape == x.shape
            and o.dtype == x.dtype
            and (adapter_of(x).one_device or _same_device(o, x))
        ):
            continue  # the common case, in one test
        if not is_array(o):
            msg = (
                f"at {path.display}: fk.{fname}: `{names[0]}` has a parameter here ({_describe(x)}) but "
                f"`{names[j]}` has a {type(o).__name__}. Expected an array of the same shape and dtype in "
                "every model; fix: pass models of the same structure."
            )
            raise StructureError(msg)
        if namespace(o) is not xp:
            msg = (
                f"at {path.display}: fk.{fname}: `{names[0]}` has a {_ns_name(xp)} array here but "
                f"`{names[j]}` a {_ns_name(namespace(o))} array. Expected one namespace; functorkit does "
                "not convert between libraries silently; fix: convert one model first (e.g. with fk.fmap)."
            )
            raise PolicyError(msg)
        if tuple(o.shape) != tuple(x.shape):
            msg = (
                f"at {path.display}: fk.{fname}: shape {tuple(x.shape)} in `{names[0]}` vs "
                f"{tuple(o.shape)} in `{names[j]}`. Expected equal shapes (no broadcasting between "
                "models); fix: pass models of the same architecture."
            )
            raise StructureError(msg)
        if o.dtype != x.dtype:
            msg = (
                f"at {path.display}: fk.{fname}: dtype {_dtype_name(x.dtype)} in `{names[0]}` vs "
                f"{_dtype_name(o.dtype)} in `{names[j]}`. Expected equal dtypes: functorkit never promotes "
                "between models; fix: cast one model first, e.g. fk.fmap(lambda x: xp.astype(x, dtype), model)."
            )
            raise PolicyError(msg)
        if not _same_device(o, x):
            msg = (
                f"at {path.display}: fk.{fname}: device {device_of(x)} in `{names[0]}` vs "
                f"{device_of(o)} in `{names[j]}`. Expected one device per parameter; fix: move one model first."
            )
            raise PolicyError(msg)


def _run(fname: str, names: Sequence[str], models: Sequence[Any], visit: Callable[..., Any], build: int) -> Any:
    return walk(tuple(models), visit, build=build, with_path=True, track=True, names=tuple(names))


def _check_trainable_only(trainable_only: Any, fname: str) -> bool:
    if type(trainable_only) is not bool:
        msg = (
            f"fk.{fname}: `trainable_only` must be True or False, got {type(trainable_only).__name__} "
            f"({trainable_only!r}). True: parameters only; False: every floating array (buffers too)."
        )
        raise TypeError(msg)
    return trainable_only


def _columns(
    models: Sequence[Any], names: Sequence[str], every: bool
) -> tuple[Any, list[Any], list[int], list[list[Any]]] | None:
    """The common case of the lock-step engine in C-level passes over the leaves: the first model's
    definition and leaves, the indices of its operands, and the other models' operands, when there
    are no ties or shared sub-trees and every other operand has the first one's type, shape, dtype
    and device. None otherwise: the per-leaf path then runs and names what differs
    (bench_scale ``fk.add(d, d)`` row; tests/test_arith.py turns this path off to compare)."""
    if not COLUMNS[0] or tracing():  # under torch.compile the per-leaf path traces without breaks
        return None
    leaves, td = record_plain(models[0], track=True)
    if td._pos_leaf is not None or td._refs:
        return None
    flags = inexact_flags(leaves)
    if not every and td._trainable is not None:
        flags = list(map(operator.and_, flags, td._trainable))
    idx = list(itertools.compress(range(len(leaves)), flags))
    xs = list(map(leaves.__getitem__, idx))
    one_device = all(adapter_of(x).one_device for x in {type(x): x for x in xs}.values())
    devices = None if one_device else list(map(device_of, xs))
    sig = (list(map(type, xs)), list(map(_SHAPE_OF, xs)), list(map(_DTYPE_OF, xs)))
    cols: list[list[Any]] = []
    for j, m in enumerate(models[1:], start=1):
        fm = td._fast_match
        o = fm(m, False) if fm is not None else _MISS
        if o is _MISS:
            o = td._match(m, j, tuple(names))
        if type(o) is int:
            return None
        col = list(map(cast(list[Any], o).__getitem__, idx))
        if (list(map(type, col)), list(map(_SHAPE_OF, col)), list(map(_DTYPE_OF, col))) != sig:
            return None
        if devices is not None and list(map(device_of, col)) != devices:
            return None  # (a device that cannot be determined, None, is left to the per-leaf test too)
        cols.append(col)
    return td, leaves, idx, cols


def _map_params(
    fname: str,
    names: Sequence[str],
    models: Sequence[T],
    fn: Callable[[KeyPath, Any, list[Any]], Any],
    trainable_only: bool = True,
    op: Callable[..., Any] | None = None,
) -> T:
    """Rebuild the first model with ``fn(path, x, others)`` at every operand; constants copied.
    `op` (``op(x, *others)``, the same values as `fn`, needing no path) allows the column path."""
    every = not _check_trainable_only(trainable_only, fname)
    cols = _columns(models, names, every) if op is not None else None
    if cols is not None and op is not None:
        td, leaves, idx, others = cols
        out = list(map(op, map(leaves.__getitem__, idx), *others))
        if len(idx) < len(leaves) or any(issubclass(t, np.generic) for t in set(map(type, out))):
            res = list(map(copy_array, leaves))  # constants: arrays copied, anything else shared
            for i, r in zip(idx, out, strict=True):
                res[i] = _as_array(r)
            out = res
        return cast(T, td.build(out))

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> Any:
        if (trainable or every) and is_inexact_array(x):
            if others:
                _check_same(fname, names, path, x, others)
            return _as_array(fn(path, x, others))
        return copy_array(x)

    return cast(T, _run(fname, names, models, visit, BUILD_SAME))


def _reduce_params(
    fname: str,
    names: Sequence[str],
    models: Sequence[Any],
    fn: Callable[[Any, Any, list[Any]], Any],
    trainable_only: bool = True,
    op: Callable[..., Any] | None = None,
) -> tuple[Any, list[Any]]:
    """``(xp, [fn(xp, x, others) per distinct parameter])``; all parameters in one namespace and device.
    `op` (``op(x, *others)``, the same values as `fn`) allows the column path of `_columns`."""
    parts: list[Any] = []
    first: list[Any] = []  # [path, x, type, adapter, device, namespace] of the first parameter
    every = not _check_trainable_only(trainable_only, fname)
    cols = _columns(models, names, every) if op is not None else None
    if cols is not None and op is not None and cols[2]:
        _, leaves, idx, others = cols
        xs = list(map(leaves.__getitem__, idx))
        if len(set(map(type, xs))) == 1:  # one namespace; then one device, or the per-leaf path names two
            devices = None if adapter_of(xs[0]).one_device else list(map(device_of, xs))
            if devices is None or devices == [devices[0]] * len(devices):
                return namespace(xs[0]), list(map(op, xs, *others))

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> None:
        if not ((trainable or every) and is_inexact_array(x)):
            return
        if others:
            _check_same(fname, names, path, x, others)
        if first and type(x) is first[2] and first[3].device(x) == first[4]:
            parts.append(fn(first[5], x, others))  # the first parameter's type, namespace and device
            return
        xp = namespace(x)
        if not first:
            ad = adapter_of(x)
            first.extend((path, x, type(x), ad, ad.device(x), xp))
        else:
            p0, x0 = first[0], first[1]
            if namespace(x0) is not xp or not _same_device(x0, x):
                msg = (
                    f"at {p0.display} and {path.display}: fk.{fname} reduces over every parameter, but "
                    f"these are {_ns_name(namespace(x0))} on {device_of(x0)} and {_ns_name(xp)} on "
                    f"{device_of(x)}. Expected one namespace and device for the 0-d result; fix: move the "
                    "model to one device first."
                )
                raise PolicyError(msg)
        parts.append(fn(xp, x, others))

    _run(fname, names, models, visit, BUILD_NONE)
    if not parts:
        msg = (
            f"fk.{fname}: `{names[0]}` has no parameters (floating or complex arrays reached through "
            "trainable children), so there is no namespace or device for the 0-d result. Expected at "
            "least one parameter; check the model with fk.leaves_with_path."
        )
        raise ValueError(msg)
    return namespace(first[1]), parts


# --------------------------------------------------------------------------- elementwise arithmetic


def add(a: T, b: T, /, *, trainable_only: bool = True) -> T:
    """The model ``a + b``: parameters added, constants taken from `a`.

    Parameters
    ----------
    a, b
        Models of the same structure whose parameters (floating or complex
        arrays reached through trainable children of `a`) agree in shape,
        dtype, namespace and device.
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Returns
    -------
    model : Any
        A new model of `a`'s node types: parameters are ``a + b``; every other
        leaf comes from `a` (arrays copied, anything else shared). Inputs are
        never mutated; no result array shares memory with an input.

    Raises
    ------
    StructureError
        The models differ in structure or in a parameter's shape (the message
        names the path).
    PolicyError
        A parameter's dtype, namespace or device differs between the models.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.add({"w": np.array([1.0, 2.0]), "n": 3}, {"w": np.array([10.0, 20.0]), "n": 4})
    {'w': array([11., 22.]), 'n': 3}
    """
    return _map_params("add", ("a", "b"), (a, b), lambda p, x, o: x + o[0], trainable_only, operator.add)


def sub(a: T, b: T, /, *, trainable_only: bool = True) -> T:
    """The model ``a - b``: parameters subtracted, constants taken from `a`.

    See `add` for the rules.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.sub({"w": np.array([1.0, 2.0])}, {"w": np.array([10.0, 20.0])})
    {'w': array([ -9., -18.])}
    """
    return _map_params("sub", ("a", "b"), (a, b), lambda p, x, o: x - o[0], trainable_only, operator.sub)


def scale(c: Any, a: T, /, *, trainable_only: bool = True) -> T:
    """The model ``c * a``: every parameter multiplied by the number `c`.

    Parameters
    ----------
    c
        A Python int/float/complex (NumPy scalars are treated as Python
        numbers), which never changes a parameter's dtype (array API scalar
        rules: float32 parameters stay float32), or a 0-d array of the
        parameters' namespace and device whose dtype does not promote them.
        A complex `c` on real parameters raises `PolicyError`.
    a
        The model.
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Returns
    -------
    model : Any
        A new model; constants come from `a` (arrays copied). ``scale(1, a)``
        is a copy of `a`'s parameters, never `a`'s own arrays.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> out = fk.scale(0.5, {"w": np.array([1.0, 4.0], dtype=np.float32)})
    >>> out["w"], out["w"].dtype
    (array([0.5, 2. ], dtype=float32), dtype('float32'))
    """
    c = _coefficient(c, "c", "scale")

    def fn(path: KeyPath, x: Any, others: list[Any]) -> Any:
        _check_coefficient(path, x, c, "c", "scale")
        return x * c

    return _map_params("scale", ("a",), (a,), fn, trainable_only)


def lincomb(coefficients: Sequence[Any], models: Sequence[T], /, *, trainable_only: bool = True) -> T:
    """The model ``sum(c * m for c, m in zip(coefficients, models))``; constants from ``models[0]``.

    Parameters
    ----------
    coefficients
        One number per model: Python numbers, NumPy scalars or 0-d arrays, as
        for `scale` (none may change a parameter's dtype).
    models
        At least one model; all of the same structure, their parameters
        agreeing in shape, dtype, namespace and device.
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Returns
    -------
    model : Any
        A new model of ``models[0]``'s node types. Each parameter is computed in
        one pass over that leaf of every model (on torch, accumulated in place
        into the fresh result). Ties survive.

    Raises
    ------
    ValueError
        `coefficients` and `models` differ in length, or are empty.
    StructureError, PolicyError
        As for `add`; also when a coefficient would change a dtype.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> origin, d1, d2 = ({"w": np.array([x, 0.0])} for x in (1.0, 2.0, 4.0))
    >>> fk.lincomb([1, 0.5, -0.25], [origin, d1, d2])
    {'w': array([1., 0.])}
    """
    coefs = _coefficient_list(coefficients)
    mods: list[T] = _model_list(models, "lincomb")
    if len(coefs) != len(mods) or not mods:
        msg = (
            f"fk.lincomb: expected one coefficient per model and at least one model, got "
            f"{len(coefs)} coefficients and {len(mods)} models."
        )
        raise ValueError(msg)
    coefs = [_coefficient(c, f"coefficients[{i}]", "lincomb") for i, c in enumerate(coefs)]
    names = tuple(f"models[{i}]" for i in range(len(mods)))
    arrays_c = [c for c in coefs if is_array(c)]

    def fn(path: KeyPath, x: Any, others: list[Any]) -> Any:
        for i, c in enumerate(coefs):
            _check_coefficient(path, x, c, f"coefficients[{i}]", "lincomb")
        xs = (x, *others)
        ad = adapter_of(x)
        inplace = ad.inplace_ok((*xs, *arrays_c))
        acc = x * coefs[0]
        for xk, ck in zip(xs[1:], coefs[1:], strict=True):
            acc = ad.axpy(acc, xk, ck, inplace)
        return acc

    return _map_params("lincomb", names, mods, fn, trainable_only)


def mean(models: Sequence[T], /, *, trainable_only: bool = True) -> T:
    """The average model ``(m1 + ... + mn) / n``; constants from ``models[0]``.

    The parameters are summed, then divided by ``n`` (a Python int, so the
    dtype is kept). See `lincomb` for the rules. With
    ``trainable_only=False`` buffers (batch-norm running statistics) are
    averaged too, as a model soup does; integer buffers come from
    ``models[0]``.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.mean([{"w": np.array([1.0])}, {"w": np.array([2.0])}, {"w": np.array([6.0])}])
    {'w': array([3.])}
    """
    mods: list[T] = _model_list(models, "mean")
    if not mods:
        msg = "fk.mean: expected at least one model, got none."
        raise ValueError(msg)
    n = len(mods)
    names = tuple(f"models[{i}]" for i in range(n))

    def fn(path: KeyPath, x: Any, others: list[Any]) -> Any:
        if not others:
            return x / 1
        ad = adapter_of(x)
        inplace = ad.inplace_ok((x, *others))
        acc = x + others[0]
        for o in others[1:]:
            acc = ad.add(acc, o, inplace)
        return ad.div(acc, n, inplace)

    return _map_params("mean", names, mods, fn, trainable_only)


def lerp(a: T, b: T, t: Any, /, *, trainable_only: bool = True) -> T:
    """Linear interpolation ``a + t * (b - a)`` between two models; constants from `a`.

    Computed as torch does (``torch.lerp``): ``a + t * (b - a)`` for
    ``t < 0.5`` and ``b - (1 - t) * (b - a)`` otherwise, so ``t = 0`` gives
    exactly `a`'s values and ``t = 1`` exactly `b`'s (as new arrays). ``t``
    outside ``[0, 1]`` extrapolates.

    Parameters
    ----------
    a, b
        Models of the same structure (see `add`).
    t
        A real Python number (or NumPy scalar), or a real 0-d array of the
        parameters' namespace and device whose dtype does not promote them
        (then ``a + t * (b - a)`` is used).
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.lerp({"w": np.array([0.0, 10.0])}, {"w": np.array([1.0, 20.0])}, 0.25)
    {'w': array([ 0.25, 12.5 ])}
    """
    t = _coefficient(t, "t", "lerp", real=True)
    python_t = not is_array(t)

    def fn(path: KeyPath, x: Any, others: list[Any]) -> Any:
        _check_coefficient(path, x, t, "t", "lerp")
        y = others[0]
        if python_t:
            return adapter_of(x).lerp(x, y, t)
        return x + (y - x) * t

    return _map_params("lerp", ("a", "b"), (a, b), fn, trainable_only)


# --------------------------------------------------------------------------- copy


def copy(tree: T, /) -> T:
    """An independent deep copy of every array in `tree` (parameters and constants); ties kept.

    Node types are kept (a module comes back as a new module of its class);
    an array met twice is copied once and the copy placed at both positions,
    and a shared sub-tree stays shared; non-array leaves are shared, not
    copied. On torch the copies are detached from autograd history, like
    ``copy.deepcopy``: an ``nn.Parameter`` stays an ``nn.Parameter`` with
    its ``requires_grad``.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.array([1.0, 2.0])
    >>> tree = {"a": w, "b": w, "name": "mlp"}
    >>> c = fk.copy(tree)
    >>> c["a"] is c["b"], c["a"] is w, np.shares_memory(c["a"], w)
    (True, False, False)
    """
    return fmap(copy_array, tree)
