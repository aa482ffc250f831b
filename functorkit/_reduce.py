"""Reductions and normalisation of whole models: dot, norm, normalize, filter_normalize.

Built on the lock-step engine of ``_arith.py`` (`_reduce_params` for the 0-d results,
`_map_params` for the rescaled models), with its rules: operands are the parameters (or
every floating array with ``trainable_only=False``), one namespace and device per result,
nothing moved to the host. ``fk.norm`` sums ``|x|**p`` over every array before one guarded
root, so its gradients are finite at zero arrays and at an all-zero model.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from ._errors import PolicyError
from ._keypath import KeyPath
from ._lockstep import _as_array, _describe, _map_params, _real_dtype, _reduce_params, _run
from ._typing import Tree as T
from ._walk import BUILD_NONE
from ._xp import is_complex, is_inexact_array, namespace, promote_dtypes
from .adapters import adapter_of, tracing
from .adapters._sharding import ShardRefusal, sharded_reduce

__all__ = ["dot", "filter_normalize", "norm", "normalize"]


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
    # (`_pair` as the op: the column path of `_reduce_params`, C-level passes over the leaves)
    xp, pairs = _reduce_params("dot", ("a", "b"), (a, b), None, trainable_only, _pair)
    if tracing():  # (torch.compile cannot trace an itemgetter, and traces the comprehensions)
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    else:
        xs, ys = list(map(_FIRST, pairs)), list(map(_SECOND, pairs))
    ad = adapter_of(xs[0])
    r = sharded_total("dot", ("a", "b"), (a, b), trainable_only, ad, xs, ys, 2.0)
    if r is None:
        parts = list(map(ad.vdot, xs, ys))
        r = parts[0] if len(parts) == 1 else xp.sum(xp.stack(parts))
    return _as_array(_narrow_back(xp, ad, r, _promoted(xp, xs)))


_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def _pair(x: Any, y: Any) -> tuple[Any, Any]:
    return x, y


def sharded_total(
    fname: str,
    names: tuple[str, ...],
    models: tuple[Any, ...],
    trainable_only: bool,
    ad: Any,
    xs: list[Any],
    ys: list[Any] | None,
    o: float,
    then: Callable[[Any], Any] | None = None,
) -> Any:
    """The total over sharded parameters made by their adapter with at most one reduction across
    ranks (``adapters._sharding``), `then` applied to it, or None when none is sharded; a refusal
    names the path."""
    try:
        kind = "all_finite" if fname == "all_finite" else "dot" if ys is not None else "norm"
        return sharded_reduce(ad, kind, xs, ys, o, then)
    except ShardRefusal as e:
        path = _param_paths(fname, names, models, trainable_only)[e.index]
        msg = f"at {path.display}: fk.{fname} on a sharded model: {e.why}."
        raise PolicyError(msg) from None


def _param_paths(fname: str, names: tuple[str, ...], models: tuple[Any, ...], trainable_only: bool) -> list[KeyPath]:
    """The paths of the parameters `_reduce_params` visits, in its order (for messages only)."""
    paths: list[KeyPath] = []

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> None:
        if (trainable or not trainable_only) and is_inexact_array(x):
            paths.append(path)

    _run(fname, names, models, visit, BUILD_NONE)
    return paths


def _promoted(xp: Any, xs: list[Any]) -> Any:
    """The dtype the parameters' values promote to (``result_type`` of their dtypes): the dtype of a
    reduction over all of them, whatever their order (a float16 parameter before a complex one
    must not make the total float16). Dtypes without a promotion between them: `promote_dtypes`."""
    # (a C-level pass; torch.compile cannot trace an attrgetter, and traces the comprehension)
    dtypes = list(dict.fromkeys([x.dtype for x in xs] if tracing() else map(_DTYPE_OF, xs)))
    return promote_dtypes(xp, dtypes)


def _narrow_back(xp: Any, ad: Any, r: Any, dtype: Any) -> Any:
    """The 0-d result `r` of parameters of a narrow `dtype` (float16, bfloat16, float8), accumulated
    in float32 (``accumulate_dtype``), rounded once to `dtype` (SPEC 12: dtypes are kept)."""
    if ad.accumulate_dtype(dtype) is None:
        return r
    r = _as_array(r)
    return r if r.dtype == dtype else xp.astype(r, dtype)


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


_SHAPE_OF = operator.attrgetter("shape")
_DTYPE_OF = operator.attrgetter("dtype")
#: small arrays are concatenated into chunks of about this many elements for one dot product each
_CHUNK = 1 << 16


def _same(x: Any) -> Any:
    return x


def _sums_of_squares(ad: Any, arrays: list[Any]) -> list[Any]:
    """``sum(|x|**2)`` of every array, as a few 0-d partial sums: arrays of at least ``_CHUNK``
    elements one dot product each; smaller ones concatenated into chunks first (a million tiny
    arrays cost a million dot products otherwise: bench_scale's ``fk.norm`` row)."""
    if not ad.autodiff:  # (the adapter's new_flat carries no autograd history: only where arrays carry none)
        sizes = list(map(math.prod, map(_SHAPE_OF, arrays)))
        if len(set(map(_DTYPE_OF, arrays))) == 1 and set(map(type, sizes)) == {int}:
            return _chunked_sums_of_squares(ad, arrays, sizes)
    xp = ad.xp
    out: list[Any] = []
    chunks: dict[Any, tuple[list[Any], int]] = {}  # per dtype: one concatenation never mixes dtypes
    for x in arrays:
        n = _numel(x)
        if n >= _CHUNK:
            out.append(ad.sum_squares(x))
            continue
        chunk, size = chunks.get(x.dtype, ([], 0))
        chunk.append(xp.reshape(x, (-1,)))
        size += n
        if size >= _CHUNK:
            out.append(ad.sum_squares(xp.concat(chunk) if len(chunk) > 1 else chunk[0]))
            chunk, size = [], 0
        chunks[x.dtype] = (chunk, size)
    for chunk, _ in chunks.values():
        if chunk:
            out.append(ad.sum_squares(xp.concat(chunk) if len(chunk) > 1 else chunk[0]))
    return out


def _chunked_sums_of_squares(ad: Any, arrays: list[Any], sizes: list[int]) -> list[Any]:
    """`_sums_of_squares` for arrays of one dtype and known sizes: each chunk of small arrays is
    one vector made by the adapter's ``new_flat`` (NumPy: one concatenate, no reshape per array)."""
    out: list[Any] = []
    small: list[int] = []
    for i, n in enumerate(sizes):
        if n >= _CHUNK:
            out.append(ad.sum_squares(arrays[i]))
        else:
            small.append(i)
    x0 = arrays[0]
    dtype, device = x0.dtype, ad.device(x0)
    start = 0
    while start < len(small):
        end, total = start, 0
        while end < len(small) and total < _CHUNK:
            total += sizes[small[end]]
            end += 1
        members = small[start:end]
        chunk = list(map(arrays.__getitem__, members))
        offsets = list(itertools.accumulate((sizes[i] for i in members), initial=0))[:-1]
        shapes = [tuple(x.shape) for x in chunk]
        out.append(ad.sum_squares(ad.new_flat(dtype, device, total, chunk, offsets, shapes)))
        start = end
    return out


def _numel(x: Any) -> int:
    n = 1
    for d in x.shape:
        n *= int(d)
    return n


def _norm(a: Any, o: float, fname: str, trainable_only: bool = True, keep: bool = True) -> Any:
    """The norm; narrow dtypes accumulated in float32 and (`keep`) rounded once to their dtype."""
    r, dt = _norm_acc(a, o, fname, trainable_only)
    if not keep:
        return r
    return _as_array(_narrow_back(namespace(r), adapter_of(r), r, dt))


def _norm_acc(a: Any, o: float, fname: str, trainable_only: bool) -> tuple[Any, Any]:
    power = o not in (0.0, 1.0, math.inf, -math.inf)  # summed as |x|**o, then one root
    xp, xs = _reduce_params(fname, ("a",), (a,), _first, trainable_only, _same)
    ad = adapter_of(xs[0])
    whole = _promoted(xp, xs)  # of every parameter, not the first one's (its order is no rule)
    # (complex iff one of them is), asked of one parameter per dtype (a C-level pass) outside tracing
    reps = xs if tracing() else dict(zip(map(_DTYPE_OF, xs), xs)).values()
    dt = _real_dtype(xp, whole) if any(map(is_complex, reps)) else whole
    # sharded: the global sum (or max, min, count) on every rank, its root taken by the adapter on
    # the plain global value (`then`: no sharded-array operators for a 0-d result)
    then = _Root(xp, ad, o) if power or o == 2 else None
    total = sharded_total(fname, ("a",), (a,), trainable_only, ad, xs, None, o, then)
    if total is not None:
        return _as_array(total), (whole if o == 2 else dt)
    if o == 2:
        sq = _sums_of_squares(ad, xs)
        total = sq[0] if len(sq) == 1 else xp.sum(xp.stack(sq))
        return _as_array(_root(xp, ad, total, 2.0)), whole
    parts = [_leaf_norm(xp, x, o, power) for x in xs]
    if len(parts) == 1 and not power:
        return _as_array(parts[0]), dt
    stacked = xp.stack(parts)
    if power:
        return _as_array(_root(xp, ad, xp.sum(stacked), o)), dt
    if o == 0:
        return _as_array(xp.sum(stacked)), dt
    return _as_array(_vector_norm(xp, stacked, ord=o)), dt


def _first(xp: Any, x: Any, others: list[Any]) -> Any:
    return x


def _leaf_norm(xp: Any, x: Any, o: float, power: bool) -> Any:
    """One parameter's part of a norm of order `o` (not 2): ``sum(|x|**o)`` or its vector norm."""
    ad = adapter_of(x)
    acc = ad.accumulate_dtype(x.dtype)
    if acc is not None:
        x = xp.astype(x, acc)
    if power:
        a = xp.abs(x)
        if o >= 1 or not ad.autodiff:
            return xp.sum(a ** o)
        # below 1 the derivative of |x|**o is infinite at 0 (times abs's 0: NaN): the zero entries are
        # taken apart, as torch's vector_norm does (0 for 0 < o < 1; for o < 0 a zero makes the norm 0,
        # every gradient 0), ``where`` on a safe input so that no inf * 0 reaches the gradient
        zero = a == 0
        part = xp.where(zero, xp.ones_like(a), a) ** o
        return xp.sum(xp.where(zero, xp.full_like(a, 0.0 if o > 0 else math.inf), part))
    return _vector_norm(xp, x, ord=o)


class _Root:
    """The root of a sharded norm's global total, applied by the adapter (`sharded_total`'s `then`):
    called, `_root` (guarded: a finite gradient at 0); `plain`, for a total that carries no derivative
    (a gradient's norm, ``no_grad``: one kernel, no guard needed where no gradient flows)."""

    __slots__ = ("ad", "o", "xp")

    def __init__(self, xp: Any, ad: Any, o: float) -> None:
        self.xp, self.ad, self.o = xp, ad, o

    # equal for one namespace, adapter and order (`then` of the protocol: an adapter may compile it
    # with the reduction, as a static argument: JAX's jitted program then compiles once)
    def __eq__(self, other: object) -> bool:
        return type(other) is _Root and (self.xp, self.ad, self.o) == (other.xp, other.ad, other.o)

    def __hash__(self) -> int:
        return hash((id(self.xp), id(self.ad), self.o))

    def __call__(self, total: Any) -> Any:
        return _root(self.xp, self.ad, total, self.o)

    def plain(self, total: Any) -> Any:
        return self.xp.sqrt(total) if self.o == 2 else total ** (1.0 / self.o)


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
    n = _norm(a, o, "normalize", trainable_only, keep=False)  # narrow dtypes: the float32 norm
    xn = namespace(n)
    n = xn.where(n == 0, xn.ones_like(n), n)
    casts: dict[Any, Any] = {}

    def fn(path: KeyPath, x: Any, others: list[Any], out: Any) -> Any:
        ad = adapter_of(x)
        target = _real_dtype(ad.xp, x.dtype) if is_complex(x) else x.dtype
        k = casts.get(target)
        if k is None:
            k = casts[target] = ad.weak(n, target)  # the kernels' compute dtype, else the parameter's
        return ad.op_div(x, k, out)

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

    def fn(path: KeyPath, d: Any, others: list[Any], out: Any) -> Any:
        ad = adapter_of(d)
        cd = ad.compute_dtype(d.dtype)
        if cd is None:
            return _filter(path, d, others)
        xp = ad.xp  # narrow dtypes: computed in float32, rounded once (SPEC 12)
        return xp.astype(_filter(path, xp.astype(d, cd), [xp.astype(others[0], cd)]), d.dtype)

    def _filter(path: KeyPath, d: Any, others: list[Any]) -> Any:
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
