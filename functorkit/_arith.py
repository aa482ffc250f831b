"""Arithmetic on whole models: add, sub, scale, lincomb, lerp, mean, dot, norm, normalize, copy.

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
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import numpy as np

from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._typing import Tree as T
from ._walk import BUILD_NONE, BUILD_SAME, fmap, walk
from ._xp import (
    describe_array,
    describe_dtype,
    describe_namespace,
    device_of,
    is_array,
    is_complex,
    is_inexact_array,
    namespace,
    same_device,
)
from .adapters._base import adapter_of

__all__ = [
    "add",
    "copy",
    "copy_array",
    "dot",
    "filter_normalize",
    "lerp",
    "lincomb",
    "mean",
    "norm",
    "normalize",
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


def _map_params(
    fname: str,
    names: Sequence[str],
    models: Sequence[T],
    fn: Callable[[KeyPath, Any, list[Any]], Any],
    trainable_only: bool = True,
) -> T:
    """Rebuild the first model with ``fn(path, x, others)`` at every operand; constants copied."""
    every = not _check_trainable_only(trainable_only, fname)

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
) -> tuple[Any, list[Any]]:
    """``(xp, [fn(xp, x, others) per distinct parameter])``; all parameters in one namespace and device."""
    parts: list[Any] = []
    first: list[Any] = []  # [path, x, type, adapter, device, namespace] of the first parameter
    every = not _check_trainable_only(trainable_only, fname)

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
    return _map_params("add", ("a", "b"), (a, b), lambda p, x, o: x + o[0], trainable_only)


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
    return _map_params("sub", ("a", "b"), (a, b), lambda p, x, o: x - o[0], trainable_only)


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


# --------------------------------------------------------------------------- reductions


def _check_ord(ord: Any, fname: str) -> float:
    if isinstance(ord, (bool, np.bool_)) or not isinstance(ord, (int, float, np.integer, np.floating)):
        msg = f"fk.{fname}: `ord` must be a real number (2, 1, math.inf, -math.inf, 0 or any p), got {ord!r}."
        raise TypeError(msg)
    o = float(ord)
    if math.isnan(o):
        msg = f"fk.{fname}: `ord` must not be NaN."
        raise ValueError(msg)
    return o


def _vector_norm(xp: Any, x: Any, *, axis: Any = None, keepdims: bool = False, ord: float = 2.0) -> Any:
    """``xp.linalg.vector_norm``, or the same computed by hand where a namespace lacks it."""
    linalg = getattr(xp, "linalg", None)
    vn = getattr(linalg, "vector_norm", None)
    o: float | int = int(ord) if ord.is_integer() else ord
    if vn is not None:
        return vn(x, axis=axis, keepdims=keepdims, ord=o)
    ax = x if axis is not None else xp.reshape(x, (-1,))
    ab = xp.abs(ax)
    if ord == math.inf:
        return xp.max(ab, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return xp.min(ab, axis=axis, keepdims=keepdims)
    if ord == 0:
        return xp.sum(xp.astype(ab != 0, ab.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return xp.sum(ab, axis=axis, keepdims=keepdims)
    if ord == 2:
        return xp.sqrt(xp.sum(ab * ab, axis=axis, keepdims=keepdims))
    return xp.sum(ab**o, axis=axis, keepdims=keepdims) ** (1.0 / o)


def _flat(xp: Any, x: Any) -> Any:
    return xp.reshape(x, (-1,))


def _leaf_dot(xp: Any, x: Any, others: list[Any]) -> Any:
    return adapter_of(x).vdot(x, others[0])


def dot(a: T, b: T, /, *, trainable_only: bool = True) -> Any:
    """The inner product of two models' parameters: ``sum(vdot(pa, pb))``, a 0-d array.

    Like ``numpy.vdot`` (and the array API ``vecdot``), the first argument is
    conjugated for complex parameters. A tied parameter (one array at several
    places) counts once. The result is a 0-d array in the parameters'
    namespace and on their device, of the dtype their values promote to;
    nothing is moved to the host (call ``float()`` yourself).
    ``trainable_only=False`` includes every floating array (buffers too).

    Raises
    ------
    ValueError
        The models have no parameters.
    StructureError, PolicyError
        As for `add`; `PolicyError` also when the parameters span
        several namespaces or devices (no single place for the result).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> a = {"w": np.array([1.0, 2.0]), "b": np.array([3.0])}
    >>> float(fk.dot(a, a))
    14.0
    """
    xp, parts = _reduce_params("dot", ("a", "b"), (a, b), _leaf_dot, trainable_only)
    if len(parts) == 1:
        return _as_array(parts[0])
    return _as_array(xp.sum(xp.stack(parts)))


def norm(a: Any, /, *, ord: float = 2, trainable_only: bool = True) -> Any:
    """The vector norm of all of a model's parameters taken together, a 0-d array.

    Equal to ``numpy.linalg.norm`` of the concatenation of every distinct
    parameter (a tie counts once), for the vector orders of the array API's
    ``vector_norm``; absolute values are always taken.

    Parameters
    ----------
    a
        The model.
    ord
        ``2`` (default, Euclidean), ``1``, ``math.inf`` (largest absolute
        value), ``-math.inf`` (smallest), ``0`` (number of non-zero entries,
        as a float) or any other real ``p`` (``sum(|x|**p) ** (1/p)``).
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Returns
    -------
    norm : array
        A 0-d array in the parameters' namespace and on their device (real
        dtype for complex parameters); nothing is moved to the host.

    Raises
    ------
    ValueError
        The model has no parameters, or `ord` is NaN.
    PolicyError
        The parameters span several namespaces or devices.

    Notes
    -----
    Gradients are finite everywhere, also where arrays or the whole model
    are zero (zero-initialised biases): for ``ord=2`` the squares of every
    array are summed first and one square root is taken (a norm of
    per-array norms has no gradient at an all-zero array), and the root is
    guarded so that the gradient at an all-zero model is 0, the subgradient
    ``torch.linalg.vector_norm`` uses. Other powers ``p`` likewise sum
    ``|x|**p`` before the one root.

    Examples
    --------
    >>> import math
    >>> import numpy as np
    >>> import functorkit as fk
    >>> m = {"w": np.array([3.0, -4.0]), "b": np.array([12.0])}
    >>> float(fk.norm(m)), float(fk.norm(m, ord=1)), float(fk.norm(m, ord=math.inf))
    (13.0, 19.0, 12.0)
    """
    o = _check_ord(ord, "norm")
    return _norm(a, o, "norm", trainable_only)


#: small arrays are concatenated into chunks of about this many elements for one dot product each
_CHUNK = 1 << 16


def _sums_of_squares(ad: Any, arrays: list[Any]) -> list[Any]:
    """``sum(|x|**2)`` of every array, as a few 0-d partial sums: arrays of at least ``_CHUNK``
    elements one dot product each; smaller ones concatenated into chunks first (a million tiny
    arrays cost a million dot products otherwise: bench_scale's ``fk.norm`` row)."""
    xp = ad.xp
    out: list[Any] = []
    chunk: list[Any] = []
    size = 0
    for x in arrays:
        n = _numel(x)
        if n >= _CHUNK:
            out.append(ad.sum_squares(x))
            continue
        chunk.append(xp.reshape(x, (-1,)))
        size += n
        if size >= _CHUNK:
            out.append(ad.sum_squares(xp.concat(chunk) if len(chunk) > 1 else chunk[0]))
            chunk, size = [], 0
    if chunk:
        out.append(ad.sum_squares(xp.concat(chunk) if len(chunk) > 1 else chunk[0]))
    return out


def _numel(x: Any) -> int:
    n = 1
    for d in x.shape:
        n *= int(d)
    return n


def _norm(a: Any, o: float, fname: str, trainable_only: bool = True) -> Any:
    power = o not in (0.0, 1.0, math.inf, -math.inf)  # summed as |x|**o, then one root

    def leaf(xp: Any, x: Any, others: list[Any]) -> Any:
        if o == 2:
            return x  # reduced below, many small arrays at once
        if power:
            return xp.sum(xp.abs(x) ** o)
        return _vector_norm(xp, x, ord=o)

    xp, parts = _reduce_params(fname, ("a",), (a,), leaf, trainable_only)
    if o == 2:
        ad = adapter_of(parts[0])
        sq = _sums_of_squares(ad, parts)
        total = sq[0] if len(sq) == 1 else xp.sum(xp.stack(sq))
        return _as_array(_root(xp, ad, total, 2.0))
    if len(parts) == 1 and not power:
        return _as_array(parts[0])
    stacked = xp.stack(parts)
    if power:
        return _as_array(_root(xp, adapter_of(parts[0]), xp.sum(stacked), o))
    if o == 0:
        return _as_array(xp.sum(stacked))
    return _as_array(_vector_norm(xp, stacked, ord=o))


def _root(xp: Any, ad: Any, total: Any, o: float) -> Any:
    """``total ** (1/o)`` with a finite gradient at ``total == 0`` on backends with autodiff
    (the gradient there is 0: ``where`` on a safe input, so no ``inf * 0``)."""
    if not ad.autodiff:
        return xp.sqrt(total) if o == 2 else total ** (1.0 / o)
    zero = total == 0
    safe = xp.where(zero, xp.ones_like(total), total)
    root = xp.sqrt(safe) if o == 2 else safe ** (1.0 / o)
    return xp.where(zero, xp.zeros_like(root), root)


def normalize(a: T, /, *, ord: float = 2, trainable_only: bool = True) -> T:
    """The model ``a / norm(a, ord=ord)``: parameters scaled to unit norm; constants from `a`.

    The norm is computed once, on the device, and cast to each parameter's
    (real) dtype, so no dtype changes. A model whose norm is 0 comes back as
    zeros (a copy), with a finite gradient, not as NaNs (0/0): the division
    is by ``where(n == 0, 1, n)``, on the device, without a host
    synchronisation. ``trainable_only=False`` normalises every floating
    array (buffers too) by their joint norm.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.normalize({"w": np.array([3.0, 4.0])})
    {'w': array([0.6, 0.8])}
    """
    o = _check_ord(ord, "normalize")
    n = _norm(a, o, "normalize", trainable_only)
    xn = namespace(n)
    n = xn.where(n == 0, xn.ones_like(n), n)
    casts: dict[Any, Any] = {}

    def fn(path: KeyPath, x: Any, others: list[Any]) -> Any:
        xp = namespace(x)
        target = _real_dtype(xp, x.dtype)
        k = casts.get(target)
        if k is None:
            k = casts[target] = n if n.dtype == target else xp.astype(n, target)
        return x / k

    return _map_params("normalize", ("a",), (a,), fn, trainable_only)


def filter_normalize(
    direction: T,
    reference: T,
    /,
    *,
    ord: float = 2,
    one_d: Literal["zero", "keep", "normalize"] = "zero",
    axis: int = 0,
    trainable_only: bool = True,
) -> T:
    """Filter-wise normalisation of a direction against a reference model (Li et al., 2018).

    For "Visualizing the Loss Landscape of Neural Nets": every filter of the
    direction is rescaled to the norm of the same filter of the reference,
    so that a step along the direction is comparable across layers whatever
    their scale. A filter is a slice along `axis` (the output axis: a row of
    a ``Linear`` weight, one output channel of a ``Conv`` kernel).

    All filter norms are computed at once from the un-rescaled direction
    (``vector_norm`` over every axis but `axis`, absolute values included for
    odd orders); nothing is written in place and nothing is moved to the
    host. A filter of the direction that is all zeros stays zero (no NaN).

    Parameters
    ----------
    direction
        The model to normalise (e.g. a random model).
    reference
        The model whose filter norms are matched (e.g. the trained weights);
        same structure, shapes, dtypes, namespace and devices as `direction`.
    ord
        The vector order of the filter norms (default 2, Frobenius).
    one_d
        What to do with parameters of one or zero dimensions (biases, norm
        scales): ``"zero"`` (default, as in the paper) sets them to zero,
        ``"keep"`` leaves the direction's values, ``"normalize"`` rescales
        the whole vector to the reference's norm.
    axis
        The filter axis of parameters with two or more dimensions (0 for
        PyTorch layouts; -1 for JAX/Flax kernels ``(..., in, out)``).
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.

    Returns
    -------
    model : Any
        A new model of `direction`'s node types; constants come from `direction`
        (arrays copied). Dtypes are kept.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> d = {"w": np.array([[3.0, 4.0], [0.0, -1.0]]), "b": np.array([1.0, 1.0])}
    >>> ref = {"w": np.array([[1.0, 0.0], [0.0, 2.0]]), "b": np.array([5.0, 5.0])}
    >>> out = fk.filter_normalize(d, ref)
    >>> out["w"], out["b"]
    (array([[ 0.6,  0.8],
           [ 0. , -2. ]]), array([0., 0.]))
    """
    o = _check_ord(ord, "filter_normalize")
    if one_d not in ("zero", "keep", "normalize"):
        msg = f"fk.filter_normalize: `one_d` must be 'zero', 'keep' or 'normalize', got {one_d!r}."
        raise ValueError(msg)
    if isinstance(axis, bool) or not isinstance(axis, int):
        msg = f"fk.filter_normalize: `axis` must be an int, got {type(axis).__name__}."
        raise TypeError(msg)

    def rescale(xp: Any, d: Any, r: Any, axes: Any) -> Any:
        keep = axes is not None
        dn = _vector_norm(xp, d, axis=axes, keepdims=keep, ord=o)
        rn = _vector_norm(xp, r, axis=axes, keepdims=keep, ord=o)
        safe = xp.where(dn == 0, xp.ones_like(dn), dn)
        return d * (rn / safe)

    def fn(path: KeyPath, d: Any, others: list[Any]) -> Any:
        xp = namespace(d)
        nd = d.ndim
        if nd >= 2:
            if not -nd <= axis < nd:
                msg = (
                    f"at {path.display}: fk.filter_normalize: `axis={axis}` is out of range for a parameter "
                    f"of {nd} dimensions ({_describe(d)}). Expected a filter axis every parameter with two "
                    "or more dimensions has."
                )
                raise ValueError(msg)
            ax = axis % nd
            return rescale(xp, d, others[0], tuple(i for i in range(nd) if i != ax))
        if one_d == "zero":
            return xp.zeros_like(d)
        if one_d == "keep":
            return d * 1
        return rescale(xp, d, others[0], None)

    return _map_params("filter_normalize", ("direction", "reference"), (direction, reference), fn, trainable_only)


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
