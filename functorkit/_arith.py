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
from collections.abc import Callable, Sequence
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
    describe_device,
    device_of,
    is_array,
    is_inexact_array,
    namespace,
)
from .adapters import adapter_of

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
    if type(c) is float or (type(c) is int and -(2**63) <= c < 2**63):
        return c  # the common case, a real Python number in range: nothing to convert or refuse
    if isinstance(c, (bool, np.bool_)):
        msg = f"fk.{fname}: `{what}` must be a number or a 0-d array, got the bool {c!r}; pass 1 or 0 instead."
        raise TypeError(msg)
    if type(c) in _PY_SCALARS:
        out = c
    elif isinstance(c, np.generic) and c.dtype.kind in "iufc":
        kind = c.dtype.kind
        out = int(c) if kind in "iu" else float(c) if kind == "f" else complex(c)  # longdouble too
    elif isinstance(c, np.generic) and type(c).__module__.startswith("ml_dtypes") and type(c).__name__.startswith(
        ("float", "bfloat")
    ):
        out = float(c)  # an ml_dtypes scalar (bfloat16, float8_*: NumPy kind "V"), as a NumPy float scalar
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
    if type(out) is int and not -(2**63) <= out < 2**63:
        # beyond every array library's integers (torch converts a Python int coefficient to int64):
        # the float it stands for, as NumPy takes it for a float array
        try:
            out = float(out)
        except OverflowError:
            msg = (
                f"fk.{fname}: `{what}` is an int of {out.bit_length()} bits, larger than any float; "
                "expected a finite number."
            )
            raise ValueError(msg) from None
    if real and (type(out) is complex or (is_array(out) and _is_complex(out))):
        msg = f"fk.{fname}: `{what}` must be real, got {out!r}."
        raise TypeError(msg)
    return out


def _check_coefficient(path: KeyPath, x: Any, c: Any, what: str, fname: str) -> None:
    """A coefficient must not change the parameter's dtype, namespace or device (SPEC 12): Python
    numbers are weak; a 0-d array must be floating (complex only for complex parameters), of the
    parameters' namespace and device; it is then cast to the parameter's dtype (`weak`)."""
    if (type(c) is complex or (is_array(c) and _is_complex(c))) and not _is_complex(x):
        msg = (
            f"at {path.display}: fk.{fname}: `{what}` is complex ({c!r}) but the parameter is a real "
            f"{_describe(x)}; a complex coefficient would silently make it complex. Expected a real "
            "coefficient for real parameters; fix: pass a real number, or make the parameters complex first."
        )
        raise PolicyError(msg)
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
            f"at {path.display}: fk.{fname}: `{what}` is on {describe_device(device_of(c))} but the parameter is "
            f"on {describe_device(device_of(x))}. Expected the same device; fix: move the coefficient, or pass a "
            "Python number."
        )
        raise PolicyError(msg)
    if not is_inexact_array(c):
        msg = (
            f"at {path.display}: fk.{fname}: `{what}` is a 0-d array of dtype {_dtype_name(c.dtype)}, not a "
            f"floating one, for the parameter {_describe(x)}. Expected a 0-d array of the parameter's kind "
            "(floating; complex for complex parameters), which is cast to the parameter's dtype; fix: pass "
            "a Python number (int(c) or float(c)), or cast the coefficient to a floating dtype."
        )
        raise PolicyError(msg)


class _Weak:
    """One coefficient as each parameter gets it: checked (`_check_coefficient`) and cast by the
    adapter's ``weak`` (SPEC 12), once per parameter type, dtype and (for 0-d arrays) device."""

    __slots__ = ("array", "c", "fname", "known", "real", "what")

    def __init__(self, c: Any, what: str, fname: str) -> None:
        self.c, self.what, self.fname = c, what, fname
        #: a real Python number: weak for every parameter, so checking it can find nothing (the
        #: check before the first write is skipped; `get` still gives it to each parameter)
        self.real = type(c) is float or type(c) is int
        self.array = not self.real and is_array(c)
        self.known: dict[Any, Any] = {}

    def get(self, path: KeyPath, x: Any) -> Any:
        ad = adapter_of(x)
        key = (type(x), x.dtype, ad.device(x)) if self.array else (type(x), x.dtype)
        hit = self.known.get(key, _NONE)
        if hit is _NONE:
            _check_coefficient(path, x, self.c, self.what, self.fname)
            hit = self.known[key] = ad.weak(self.c, x.dtype)
        return hit


_NONE = object()

#: (prefix, n) -> ``(f"{prefix}[0]", ..., f"{prefix}[n-1]")``: the operands' names in messages, made
#: once for the usual numbers of models (at most `_NAMED` of them)
_NAMES: dict[tuple[str, int], tuple[str, ...]] = {}
_NAMED = 16


def _indexed(prefix: str, n: int) -> tuple[str, ...]:
    hit = _NAMES.get((prefix, n))
    if hit is None:
        hit = tuple(f"{prefix}[{i}]" for i in range(n))
        if n <= _NAMED:
            _NAMES[(prefix, n)] = hit
    return hit


def _many(kind: str, ws: Sequence[_Weak] = ()) -> Callable[[list[Any], list[list[Any]], bool], bool]:
    """``out=``'s batch for `kind` (``adapter.arith_many_``; lerp: `t` in `ws`): on the column path (`checked`), with
    real Python coefficients, every row in one adapter call when `outs` is the first model's arrays
    (in place) or shares none with the models (a term that is `out` itself goes row by row)."""

    def batch(outs: list[Any], cols: list[list[Any]], checked: bool) -> bool:
        if not checked or not all(w.real for w in ws) or any(outs is c for c in cols[1:]):
            return False
        return bool(adapter_of(outs[0]).arith_many_(kind, outs, cols, [w.c for w in ws]))

    return batch


# --------------------------------------------------------------------------- elementwise arithmetic


def add(a: T, b: T, /, *, trainable_only: bool = True, out: T | None = None) -> T:
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
    out
        None (default): a new model. Else a model of `a`'s structure whose
        parameters are writable arrays of the result's shapes, dtypes and
        devices: the result is written into them (the same values as without
        `out`, bit for bit; torch: under ``no_grad``) and `out` is returned;
        its constants are left alone. `out` may be `a` or `b` itself (an
        in-place update); any other memory overlap with an input is a
        `StructureError`. Every check is made before the first write.

    Returns
    -------
    model : Any
        A new model of `a`'s node types (or `out`): parameters are ``a + b``,
        of `a`'s dtypes; every other leaf comes from `a` (arrays copied,
        anything else shared). Inputs are never mutated (unless passed as
        `out`); no result array shares memory with an input.

    Raises
    ------
    StructureError
        The models (or `out`) differ in structure or in a parameter's shape
        (the message names the path); `out` overlaps an input.
    PolicyError
        A parameter's dtype, namespace or device differs between the models.
    TypeError
        `out`'s arrays cannot be written (JAX, Dask, read-only NumPy): use
        the functional form.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.add({"w": np.array([1.0, 2.0]), "n": 3}, {"w": np.array([10.0, 20.0]), "n": 4})
    {'w': array([11., 22.]), 'n': 3}
    >>> a = {"w": np.array([1.0, 2.0])}
    >>> fk.add(a, a, out=a) is a, a["w"]
    (True, array([2., 4.]))
    """

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_add(x, others[0], o)

    return _map_params("add", ("a", "b"), (a, b), fn, trainable_only, operator.add, out=out, batch=_many("add"))


def sub(a: T, b: T, /, *, trainable_only: bool = True, out: T | None = None) -> T:
    """The model ``a - b``: parameters subtracted, constants taken from `a`.

    See `add` for the rules (and `out`).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.sub({"w": np.array([1.0, 2.0])}, {"w": np.array([10.0, 20.0])})
    {'w': array([ -9., -18.])}
    """

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_sub(x, others[0], o)

    return _map_params("sub", ("a", "b"), (a, b), fn, trainable_only, operator.sub, out=out, batch=_many("sub"))


def scale(c: Any, a: T, /, *, trainable_only: bool = True, out: T | None = None) -> T:
    """The model ``c * a``: every parameter multiplied by the number `c`.

    Parameters
    ----------
    c
        A Python int/float/complex (NumPy scalars are treated as Python
        numbers), which never changes a parameter's dtype (weak, as in the
        array API: float32 parameters stay float32, bfloat16 stay bfloat16),
        or a floating 0-d array of the parameters' namespace and device,
        cast to each parameter's dtype. A complex `c` on real parameters
        raises `PolicyError`.
    a
        The model.
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.
    out
        As for `add` (``fk.scale(c, a, out=a)`` scales `a` in place).

    Returns
    -------
    model : Any
        A new model (or `out`); constants come from `a` (arrays copied).
        ``scale(1, a)`` is a copy of `a`'s parameters, never `a`'s own arrays.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> out = fk.scale(0.5, {"w": np.array([1.0, 4.0], dtype=np.float32)})
    >>> out["w"], out["w"].dtype
    (array([0.5, 2. ], dtype=float32), dtype('float32'))
    """
    w = _Weak(_coefficient(c, "c", "scale"), "c", "scale")
    get = w.get

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_scale(x, get(path, x), o)

    c_ = w.c

    def op(x: Any) -> Any:  # a real Python `c` (weak for every parameter): no path needed
        return adapter_of(x).op_scale(x, c_)

    return _map_params(
        "scale",
        ("a",),
        (a,),
        fn,
        trainable_only,
        op if w.real else None,
        check=None if w.real else get,
        out=out,
        batch=_many("scale", [w]),
        check_devices=w.array,
    )


def lincomb(
    coefficients: Sequence[Any], models: Sequence[T], /, *, trainable_only: bool = True, out: T | None = None
) -> T:
    """The model ``sum(c * m for c, m in zip(coefficients, models))``; constants from ``models[0]``.

    Parameters
    ----------
    coefficients
        One number per model: Python numbers, NumPy scalars or 0-d arrays, as
        for `scale` (none changes a parameter's dtype).
    models
        At least one model; all of the same structure, their parameters
        agreeing in shape, dtype, namespace and device.
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.
    out
        As for `add`; `out` may be one of `models`.

    Returns
    -------
    model : Any
        A new model of ``models[0]``'s node types (or `out`). Each parameter is
        computed in one pass over that leaf of every model (NumPy: in blocks
        that stay in cache; torch: accumulated in place into the result).
        Ties survive.

    Raises
    ------
    ValueError
        `coefficients` and `models` differ in length, or are empty.
    StructureError, PolicyError, TypeError
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
    whats = _indexed("coefficients", len(coefs))
    ws = [_Weak(_coefficient(c, what, "lincomb"), what, "lincomb") for c, what in zip(coefs, whats)]
    names = _indexed("models", len(mods))

    def check(path: KeyPath, x: Any) -> None:
        for w in ws:
            w.get(path, x)

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_lincomb((x, *others), [w.get(path, x) for w in ws], o)

    real = all(w.real for w in ws)
    cs = [w.c for w in ws]

    def op(*xs: Any) -> Any:  # real Python coefficients (weak for every parameter): no path needed
        return adapter_of(xs[0]).op_lincomb(xs, cs)

    return _map_params(
        "lincomb",
        names,
        mods,
        fn,
        trainable_only,
        op if real else None,
        check=None if real else check,
        out=out,
        late=1,
        batch=_many("lincomb", ws),
        check_devices=any(w.array for w in ws),
    )


def mean(models: Sequence[T], /, *, trainable_only: bool = True, out: T | None = None) -> T:
    """The average model ``(m1 + ... + mn) / n``; constants from ``models[0]``.

    The parameters are summed, then divided by ``n`` (a Python int, so the
    dtype is kept). See `lincomb` for the rules (and `out`). With
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
    names = _indexed("models", len(mods))

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_mean((x, *others), o)

    def op(*xs: Any) -> Any:
        return adapter_of(xs[0]).op_mean(xs)

    return _map_params("mean", names, mods, fn, trainable_only, op, out=out, late=2, batch=_many("mean"))


def lerp(a: T, b: T, t: Any, /, *, trainable_only: bool = True, out: T | None = None) -> T:
    """Linear interpolation ``a + t * (b - a)`` between two models; constants from `a`.

    Computed as torch does (``torch.lerp``): ``a + t * (b - a)`` for
    ``t < 0.5`` and ``b - (1 - t) * (b - a)`` otherwise, so ``t = 0`` gives
    exactly `a`'s values and ``t = 1`` exactly `b`'s (as new arrays). ``t``
    outside ``[0, 1]`` extrapolates. ``fk.lerp(ema, model, 0.001, out=ema)``
    is an exponential-moving-average step, in place.

    Parameters
    ----------
    a, b
        Models of the same structure (see `add`).
    t
        A real Python number (or NumPy scalar), or a real floating 0-d array
        of the parameters' namespace and device, cast to each parameter's
        dtype (then ``a + t * (b - a)``; torch: ``torch.lerp``).
    trainable_only
        True (default): parameters only, as described above. False: every
        floating or complex array (buffers, frozen parameters) too.
    out
        As for `add`; `out` may be `a` or `b`.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.lerp({"w": np.array([0.0, 10.0])}, {"w": np.array([1.0, 20.0])}, 0.25)
    {'w': array([ 0.25, 12.5 ])}
    >>> ema, model = {"w": np.array([0.0])}, {"w": np.array([1.0])}
    >>> fk.lerp(ema, model, 0.5, out=ema)["w"], ema["w"]
    (array([0.5]), array([0.5]))
    """
    w = _Weak(_coefficient(t, "t", "lerp", real=True), "t", "lerp")
    get = w.get

    def fn(path: KeyPath, x: Any, others: list[Any], o: Any) -> Any:
        return adapter_of(x).op_lerp(x, others[0], get(path, x), o)

    t_ = w.c

    def op(x: Any, y: Any) -> Any:  # a real Python `t` (weak for every parameter): no path needed
        return adapter_of(x).op_lerp(x, y, t_)

    many = _many("lerp", [w])

    def batch(outs: list[Any], cols: list[list[Any]], checked: bool) -> bool:
        """In-place rows (each of `outs` is `a`'s array there) of one array type with a Python `t`:
        one ``lerp_many_`` (True), else nothing written (False); on the column path (`checked`:
        every check made) `out` another model's arrays: ``arith_many_`` (a line of models
        interpolated into one buffer)."""
        tt = w.c
        if (type(tt) is not float and type(tt) is not int) or len(outs) < 2:
            return False
        if checked and outs is not cols[0]:
            return many(outs, cols, checked)
        if not checked and len(set(map(type, outs))) != 1:  # (`out_fast` passed: one type)
            return False
        return bool(adapter_of(outs[0]).lerp_many_(outs, cols[1], tt, checked))

    return _map_params(
        "lerp",
        ("a", "b"),
        (a, b),
        fn,
        trainable_only,
        op if w.real else None,
        check=None if w.real else get,
        out=out,
        batch=batch,
        check_devices=w.array,
    )


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
