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

import numbers
import operator
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ._errors import PolicyError
from ._keypath import KeyPath
from ._lockstep import (
    _coefficient_list,
    _describe,
    _dtype_name,
    _is_complex,
    _map_params,
    _model_list,
    _ns_name,
    _same_device,
    copy_array,
)
from ._typing import Tree as T
from ._walk import _map
from ._xp import (
    device_of,
    is_array,
    namespace,
)
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
    return cast(T, _map((tree,), copy_array, arrays=True))  # fmap, under the unknown-holder rule
