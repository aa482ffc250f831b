"""Model merging: slerp, task arithmetic, TIES, DARE and model stock (mergekit's formulas).

Each method is a per-tensor function of the aligned parameters, run by the arithmetic's
lock-step engine (`_lockstep._map_params`): the structure, shape, dtype, namespace and device
checks and their messages, ties merged once, constants from the first model (the base), unknown
holders refused. Per tensor, the arithmetic is done in a working dtype (float32 for floats
narrower than 32 bits, see `_pertensor.work`) and the result cast once to the first model's
dtype. Reductions (norms, dots, thresholds) are 0-d arrays of the tensor's namespace: on Dask
(`fk.open` models) every result is lazy and `fk.save` streams it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ._errors import StructureError
from ._keypath import KeyPath
from ._lockstep import _map_params, _model_list
from ._pertensor import (
    DOT_THRESHOLD,
    EPS_NORM,
    EPS_RESCALE,
    EPS_STOCK,
    Schedule,
    cast_back,
    check_density,
    check_real,
    check_whole,
    count_kept,
    elementwise,
    keep_mask,
    kth_largests,
    mask_keys,
    per_model,
    select,
    sums,
    work,
)
from ._typing import Tree as T
from ._xp import namespace
from .adapters import adapter_of
from .adapters._sharding import new_array_device

__all__ = ["dare", "model_stock", "slerp", "task_arithmetic", "ties"]


def _scalar(xp: Any, v: float, like: Any) -> Any:
    """A 0-d array of `like`'s dtype and device (``where`` on 0-d reductions takes no Python numbers)."""
    return xp.asarray(v, dtype=like.dtype, device=new_array_device(adapter_of(like), like))


def _models(models: Any, fname: str, least: int = 1) -> list[Any]:
    mods = _model_list(models, fname)
    if len(mods) < least:
        msg = (
            f"fk.{fname}: expected at least {least} model{'s' if least > 1 else ''} besides the base, got "
            f"{len(mods)}. Fix: pass fk.{fname}(base, [m1{', m2' if least > 1 else ''}, ...], ...)."
        )
        raise ValueError(msg)
    return mods


def _names(n: int) -> tuple[str, ...]:
    return ("base", *(f"models[{i}]" for i in range(n)))


# --------------------------------------------------------------------------- slerp


def slerp(a: T, b: T, t: Any, /, *, trainable_only: bool = True) -> T:
    """Spherical linear interpolation between two models, tensor by tensor (mergekit's ``slerp``).

    For each parameter pair ``(x, y)`` (flattened), with ``c = <x, y> / (|x| |y|)``
    (a norm not above ``1e-8`` counts as 1) and ``theta = arccos(c)``::

        slerp = sin((1 - t) theta) / sin(theta) * x + sin(t theta) / sin(theta) * y
        lerp  = (1 - t) * x + t * y          used where |c| > 0.9995 (nearly parallel)

    Parameters
    ----------
    a, b
        Models of the same structure (as for `fk.add`); `a` gives the constants.
    t
        The interpolation parameter (``0`` gives `a`, ``1`` gives `b`): a real number, or a
        dict from path globs to numbers for per-layer schedules (first match wins; a glob
        matches ``str(path)`` or the dotted state-dict key; a path that no glob matches
        raises `StructureError`).
    trainable_only
        True (default): parameters only; False: every floating array (buffers too).

    Returns
    -------
    model : Any
        A new model of `a`'s node types; each parameter has `a`'s dtype (computed in
        float32 for narrower floats, then cast once). Lazy on Dask models.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> a, b = {"w": np.array([1.0, 0.0])}, {"w": np.array([0.0, 1.0])}
    >>> fk.slerp(a, b, 0.5)["w"].round(4)
    array([0.7071, 0.7071])
    """
    ts = Schedule(t, "t", "slerp")

    def fn(path: KeyPath, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real("slerp", path, x)
        xp = namespace(x)
        tt = ts.get(path)
        y = others[0]
        v0 = work(xp, x)
        # the products summed are computed in pieces; on Dask the three sums read each block once (`sums`)
        s0, s1, dot = sums(xp, (_sq_first, _sq_second, _prod), (x, y), v0.dtype)
        n0, n1 = xp.sqrt(s0), xp.sqrt(s1)
        one = _scalar(xp, 1.0, v0)
        d0 = xp.where(n0 > EPS_NORM, n0, one)
        d1 = xp.where(n1 > EPS_NORM, n1, one)
        c = dot / (d0 * d1)
        parallel = xp.abs(c) > DOT_THRESHOLD
        theta = xp.acos(xp.clip(c, -1.0, 1.0))
        s = xp.where(parallel, one, xp.sin(theta))
        c0 = xp.where(parallel, _scalar(xp, 1.0 - tt, v0), xp.sin((1.0 - tt) * theta) / s)
        c1 = xp.where(parallel, _scalar(xp, tt, v0), xp.sin(tt * theta) / s)
        return elementwise(xp, _slerp_body, (x, others[0]), (c0, c1))

    return _map_params("slerp", ("a", "b"), (a, b), fn, trainable_only)


def _slerp_body(xp: Any, x: Any, y: Any, c0: Any, c1: Any) -> Any:
    return cast_back(xp, c0 * work(xp, x) + c1 * work(xp, y), x)


def _sq(xp: Any, x: Any) -> Any:
    v = work(xp, x)
    return v * v


def _sq_first(xp: Any, x: Any, y: Any) -> Any:
    return _sq(xp, x)


def _sq_second(xp: Any, x: Any, y: Any) -> Any:
    return _sq(xp, y)


def _prod(xp: Any, x: Any, y: Any) -> Any:
    return work(xp, x) * work(xp, y)


def _abs_delta(xp: Any, x: Any, o: Any) -> Any:
    return xp.abs(work(xp, o) - work(xp, x))


def _abs_deltas(sel: Sequence[int], x: Any, *others: Any) -> list[Any]:
    """``[|others[i] - x| for i in sel]`` in the working dtype (`kth_largests`' multi-output `fn`:
    TIES's magnitudes; the base cast once for all of them)."""
    xp = namespace(x)
    b = work(xp, x)
    return [xp.abs(work(xp, others[i]) - b) for i in sel]


def _abs_delta_of(xp: Any, x: Any, o: Any, keep: Any) -> Any:
    return _abs_delta(xp, x, o)


def _abs_kept(xp: Any, x: Any, o: Any, keep: Any) -> Any:
    return xp.abs(select(xp, keep, work(xp, o) - work(xp, x)))


def _off_prod(xp: Any, x: Any, o1: Any, o2: Any) -> Any:
    b = work(xp, x)
    return (work(xp, o1) - b) * (work(xp, o2) - b)


def _off_prod_at(i: int, j: int, xp: Any, x: Any, *others: Any) -> Any:
    """`_off_prod` of the models at positions `i` and `j` (``functools.partial`` of it: picklable)."""
    return _off_prod(xp, x, others[i], others[j])


# --------------------------------------------------------------------------- task vectors


def _mix(
    fname: str,
    base: T,
    models: Any,
    weights: Any,
    scale: Any,
    sparsify: Any,
    consensus: bool,
    normalize: bool,
    trainable_only: bool,
) -> T:
    """``base + scale * mix(w_i * sparsify_i(m_i - base))`` per tensor (mergekit's generalized
    task arithmetic). `sparsify` is ``prepare(xp, path, x, others)``: per model ``None`` (the whole
    delta kept) or ``(arrays, constants, kind)``: masks; thresholds and factors (lazy reductions
    on Dask); how they apply (`_apply`). The merge itself is one `elementwise` body
    (`_mix_block`), whose options are one tuple of numbers and names, so that Dask tokenizes it
    by value (a closure would be pickled, with whatever it holds, for every tensor)."""
    mods = _models(models, fname)
    ws = per_model(weights, len(mods), "weights", fname)
    sc = Schedule(scale, "scale", fname)

    def fn(path: KeyPath, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real(fname, path, x)
        if sparsify is not None:
            check_whole(fname, path, x)  # thresholds and masks need the whole tensor (not a shard)
        xp = namespace(x)
        wv = tuple(ws[i].get(path) for i in range(len(others)))
        lam = sc.get(path)
        kinds: list[Any] = []
        arrays: list[Any] = []
        consts: list[Any] = []
        if sparsify is not None:
            for prep in sparsify(xp, path, x, others):
                if prep is None:
                    kinds.append(None)
                    continue
                kinds.append((prep[2], len(prep[0]), len(prep[1])))
                arrays.extend(prep[0])
                consts.extend(prep[1])
        spec = (len(others), len(arrays), wv, lam, tuple(kinds), consensus, normalize)
        body = functools.partial(_mix_block, spec)
        return elementwise(xp, body, (x, *others, *arrays), tuple(consts))

    return cast(T, _map_params(fname, _names(len(mods)), (base, *mods), fn, trainable_only))


#: TIES's divisor on NumPy blocks from a table of every agreement pattern (False: the formula's passes)
WEIGHT_TABLE = True


def _divisors(wv: Sequence[float], dtype: Any) -> Any:
    """`_divisor_table` of `wv` in `dtype`, computed once per weights and dtype (a Dask body runs
    on row pieces: about ``2**models * models`` scalar operations per piece otherwise). Weights
    equal as numbers share a table (``0.0`` and ``-0.0`` too: a zero addend leaves a nonzero sum
    as it is, and a zero sum becomes 1 whatever its sign)."""
    return _divisor_table(tuple(wv), np.dtype(dtype).str)


@functools.lru_cache(maxsize=64)
def _divisor_table(wv: tuple[float, ...], dtype: str) -> Any:
    """The divisor of `_mix_block`'s normalised sign election for every agreement pattern ``c``
    (bit ``i`` set where model ``i`` agrees): the agreeing weights summed in the models' order
    (``+0.0`` for the others), a zero sum made 1, in `dtype`: the formula's float operations on
    scalars, so ``table[c]`` has the bits the formula gives each element of pattern ``c``. NumPy
    blocks take the divisor from it (one gather) instead of about six passes per model and three."""
    dt = np.dtype(dtype)
    out = np.empty(1 << len(wv), dtype=dt)
    with np.errstate(all="ignore"):
        for c in range(out.shape[0]):
            div = None
            for i, w in enumerate(wv):
                wm = dt.type(1.0) * dt.type(w) if c >> i & 1 else dt.type(0.0)
                div = wm if div is None else div + wm
            assert div is not None
            out[c] = div + dt.type(div == 0)
    out.setflags(write=False)  # shared by every caller
    return out


def _apply(kind: Any, xp: Any, d: Any, arrays: Sequence[Any], consts: Sequence[Any]) -> Any:
    """Model `i`'s kept delta: ``("trim",)``: ``|d| >= consts[0]`` (TIES); ``("mask", factor)``:
    ``d`` where ``arrays[0]``, times ``consts[0]`` (factor ``"l1"``), a number, or nothing (None)."""
    if kind[0] == "trim":
        return select(xp, xp.abs(d) >= consts[0], d)
    kept = select(xp, arrays[0], d)
    factor = kind[1]
    if factor == "l1":
        return kept * consts[0]
    if factor is not None:
        return kept * factor
    return kept


def _mix_block(spec: tuple[Any, ...], xp: Any, x: Any, *rest: Any) -> Any:
    """The merge of `_mix` on arrays (one block, or whole eager tensors): `spec` is ``(models,
    masks, weights, scale, kinds, consensus, normalize)``; `rest` the models, their masks, then
    the 0-d constants."""
    m, na, wv, lam, kinds, consensus, normalize = spec
    others, arrays, consts = rest[:m], rest[m : m + na], rest[m + na :]
    b = work(xp, x)
    wd = []
    ai = ci = 0
    for i, o in enumerate(others):
        d = work(xp, o) - b
        kind = kinds[i] if kinds else None
        if kind is not None:
            d = _apply(kind[0], xp, d, arrays[ai : ai + kind[1]], consts[ci : ci + kind[2]])
            ai, ci = ai + kind[1], ci + kind[2]
        wd.append(d * wv[i])
    if consensus:
        total = wd[0]
        for d in wd[1:]:
            total = total + d
        plus = total >= 0  # mergekit: the majority sign is + where the weighted sum is >= 0
        mixed = None
        div = None
        code = None  # the table path: bit i set where model i agrees
        table = WEIGHT_TABLE and normalize and type(total) is np.ndarray and len(wd) <= 8
        minus = ~plus
        for i, (d, w) in enumerate(zip(wd, wv, strict=True)):
            # sign(d) == majority (a zero delta never agrees): where(plus, d > 0, d < 0) without a select
            agree = (plus & (d > 0)) | (minus & (d < 0))
            kept = select(xp, agree, d)
            mixed = kept if mixed is None else mixed + kept
            if table:
                bit = agree.view(np.uint8)
                code = bit.copy() if code is None else np.bitwise_or(code, bit << np.uint8(i), out=code)
            elif normalize:
                # where(agree, w, 0): w or +0.0 (the 1.0 or 0.0 of the mask times w, zeros made +0.0)
                wm = select(xp, agree, xp.astype(agree, d.dtype) * w)
                div = wm if div is None else div + wm
        assert mixed is not None
        if table:
            mixed = mixed / _divisors(wv, mixed.dtype)[code]
        elif normalize:
            assert div is not None
            # where(div == 0, 1, div): a zero divisor (+0.0 or -0.0) plus 1 is 1, any other plus 0 itself
            mixed = mixed / (div + xp.astype(div == 0, div.dtype))
    else:
        mixed = wd[0]
        for d in wd[1:]:
            mixed = mixed + d
        if normalize:
            s = sum(wv)
            mixed = mixed / (1.0 if abs(s) < 1e-8 else s)
    if lam != 1.0:
        mixed = mixed * lam
    return cast_back(xp, b + mixed, x)


def task_arithmetic(
    base: T, models: Sequence[T], weights: Any, /, *, scale: Any = 1.0, trainable_only: bool = True
) -> T:
    """Task arithmetic: ``base + scale * sum(w_i * (m_i - base))``, tensor by tensor.

    mergekit's ``task_arithmetic`` (its ``lambda`` is `scale`; no normalisation, its default).

    Parameters
    ----------
    base
        The model the task vectors are taken from; it gives the constants.
    models
        The fine-tuned models, each of `base`'s structure.
    weights
        One weight per model (a list), or one weight for every model; each a real number
        or a dict from path globs to numbers (first match wins; a glob matches ``str(path)``
        or the dotted state-dict key; an unmatched path raises `StructureError`).
    scale
        The factor of the summed task vectors: a number or a dict of path globs.
    trainable_only
        True (default): parameters only; False: every floating array (buffers too).

    Returns
    -------
    model : Any
        A new model of `base`'s node types and dtypes (computed in float32 for narrower
        floats, cast once). Lazy on Dask models.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> base = {"w": np.array([1.0, 1.0])}
    >>> ms = [{"w": np.array([2.0, 1.0])}, {"w": np.array([1.0, 3.0])}]
    >>> fk.task_arithmetic(base, ms, [1.0, 0.5])
    {'w': array([2., 2.])}
    """
    return _mix("task_arithmetic", base, models, weights, scale, None, False, False, trainable_only)


def _magnitude(densities: list[Schedule]) -> Any:
    def prepare(xp: Any, path: KeyPath, x: Any, others: Sequence[Any]) -> list[Any]:
        n = 1
        for s in x.shape:
            n *= int(s)
        preps: list[Any] = [None] * len(others)
        trim = []  # an empty tensor: nothing to trim (its merge is empty)
        for i in range(len(others)):
            dens = densities[i].get(path)
            if dens < 1.0 and n:
                trim.append((i, count_kept(n, dens)))
        if trim:
            # every model's threshold in one selection (on Dask: each base block read once for all)
            arrays = (x, *(others[i] for i, _ in trim))
            got = kth_largests(xp, _abs_deltas, arrays, [k for _, k in trim], work(xp, x).dtype)
            for (i, _), t in zip(trim, got, strict=True):
                preps[i] = ((), (t,), ("trim",))
        return preps

    return prepare


def ties(
    base: T,
    models: Sequence[T],
    weights: Any,
    /,
    *,
    density: Any,
    normalize: bool = True,
    trainable_only: bool = True,
) -> T:
    """TIES merging: trim each task vector, elect a sign per element, average the agreeing ones.

    Per tensor (mergekit's ``ties``): ``d_i = m_i - base`` keeps its
    ``max(1, floor(density * n))`` largest magnitudes (every element whose magnitude equals
    the threshold, the k-th largest, is kept too: more than k survive only on exact ties);
    ``e_i = w_i * d_i``; the elected sign is ``+`` where ``sum(e_i) >= 0``, else ``-``;
    ``merged = base + sum(e_i [sign(e_i) = elected]) / sum(w_i [sign(e_i) = elected])`` (the
    division only with `normalize`; a zero divisor counts as 1).

    Parameters
    ----------
    base, models, weights
        As for `task_arithmetic`.
    density
        The share of each task vector kept, in ``(0, 1]``: a number, a dict of path globs,
        or a list of those (one per model).
    normalize
        Divide by the summed weights of the agreeing models (default True, mergekit's).
    trainable_only
        True (default): parameters only; False: every floating array (buffers too).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> base = {"w": np.zeros(3)}
    >>> ms = [{"w": np.array([1.0, -2.0, 0.1])}, {"w": np.array([3.0, 1.0, -0.2])}]
    >>> fk.ties(base, ms, [1.0, 1.0], density=0.67)
    {'w': array([ 2., -2.,  0.])}
    """
    mods = _models(models, "ties")
    dens = per_model(density, len(mods), "density", "ties", check_density)
    _check_bool(normalize, "normalize", "ties")
    return _mix("ties", base, mods, weights, 1.0, _magnitude(dens), True, normalize, trainable_only)


def _check_bool(v: Any, name: str, fname: str) -> None:
    if type(v) is not bool:
        msg = f"fk.{fname}: `{name}` must be True or False, got {type(v).__name__} ({v!r})."
        raise TypeError(msg)


def _bernoulli(densities: list[Schedule], seed: int, rescale: Any) -> Any:
    drawn: dict[str, KeyPath] = {}  # dotted key -> the path whose masks it keys (one merge)

    def prepare_one(xp: Any, path: KeyPath, i: int, x: Any, o: Any) -> Any:
        dens = densities[i].get(path)
        kp = path if isinstance(path, KeyPath) else path.path  # the walk's lazy path (_walk._PathAt)
        prev = drawn.setdefault(kp.dotted, kp)
        if prev != kp:  # two tensors would draw one mask (the masks are keyed by the dotted path)
            msg = (
                f"fk.dare: the paths {prev.display} and {kp.display} both read {kp.dotted!r} in dotted form, and "
                "DARE's masks are keyed by that form (so that a module, its state dict and its checkpoint draw "
                "the same masks): the two tensors would be masked alike. Expected each parameter to have its "
                "own dotted key; fix: rename one of the keys (e.g. a dict key holding a '.' or a run of digits)."
            )
            raise StructureError(msg)
        if dens >= 1.0:
            return None
        keep = keep_mask(xp, x, dens, mask_keys(seed, i, path), path)  # of x: no task waits for the delta
        if keep.shape != x.shape:
            keep = xp.reshape(keep, x.shape)
        if rescale is True:  # mergekit: the kept delta's L1 norm made the original's
            wdt = work(xp, x).dtype
            # both L1 norms in one reduction on Dask (`sums`: each block read once)
            before, after = sums(xp, (_abs_delta_of, _abs_kept), (x, o, keep), wdt)
            ok = (before >= EPS_RESCALE) & (after >= EPS_RESCALE)
            one = _scalar(xp, 1.0, before)
            return (keep,), (xp.where(ok, before / xp.where(ok, after, one), one),), ("mask", "l1")
        if type(rescale) is str:  # "inverse" (checked): the DARE paper's 1 / density
            return (keep,), (), ("mask", 1.0 / dens)
        return (keep,), (), ("mask", None)

    def prepare(xp: Any, path: KeyPath, x: Any, others: Sequence[Any]) -> list[Any]:
        return [prepare_one(xp, path, i, x, o) for i, o in enumerate(others)]

    return prepare


def dare(
    base: T,
    models: Sequence[T],
    weights: Any,
    /,
    *,
    density: Any,
    seed: int,
    rescale: Any = True,
    sign_consensus: bool = False,
    trainable_only: bool = True,
) -> T:
    """DARE: drop a random share of each task vector's elements, rescale the rest, add them up.

    Per tensor (mergekit's ``dare_linear``; ``dare_ties`` with `sign_consensus`):
    ``d_i = mask_i * (m_i - base)`` with ``mask_i ~ Bernoulli(density)``, rescaled so that
    ``|d_i|_1`` equals ``|m_i - base|_1`` (`rescale` True; skipped when either is below
    ``1e-7``), by ``1 / density`` (``"inverse"``, the paper's rule) or not at all (False);
    ``merged = base + sum(w_i d_i)`` (with `sign_consensus`, only the ``w_i d_i`` whose sign
    agrees with the sign of ``sum(w_i d_i)``, as in `ties`, without normalisation).

    The masks come from a counter-based generator: element ``j`` of the tensor at ``path`` of
    ``models[i]`` is kept when a 32-bit hash of ``(seed, i, str(path), j)`` falls below
    ``density``. They are the same whatever the order the tensors are computed in, the Dask
    chunking, the number of processes or the backend (integer array operations on int32
    words, bit for bit). Reordering `models` changes the masks (the position is part of the key).

    Parameters
    ----------
    base, models, weights
        As for `task_arithmetic`.
    density
        The keep probability, in ``(0, 1]``: a number, a dict of path globs, or a list of
        those (one per model). A density of 1 keeps the whole delta.
    seed
        A Python int: the generator's key.
    rescale
        True (L1, mergekit's), ``"inverse"`` (1/density) or False.
    sign_consensus
        Keep only the contributions that agree with the elected sign (DARE-TIES).
    trainable_only
        True (default): parameters only; False: every floating array (buffers too).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> base = {"w": np.zeros(6)}
    >>> ms = [{"w": np.ones(6)}, {"w": np.full(6, 2.0)}]
    >>> out = fk.dare(base, ms, [0.5, 0.5], density=0.5, seed=0, rescale="inverse")
    >>> sorted(set(out["w"].tolist())) <= [0.0, 1.0, 2.0, 3.0]
    True
    """
    mods = _models(models, "dare")
    dens = per_model(density, len(mods), "density", "dare", check_density)
    if isinstance(seed, bool) or not isinstance(seed, int):
        msg = f"fk.dare: `seed` must be a Python int, got {type(seed).__name__} ({seed!r:.60})."
        raise TypeError(msg)
    if not (rescale is True or rescale is False or (type(rescale) is str and rescale == "inverse")):
        msg = f"fk.dare: `rescale` must be True (L1), 'inverse' (1/density) or False, got {rescale!r:.60}."
        raise ValueError(msg)
    _check_bool(sign_consensus, "sign_consensus", "dare")
    return _mix(
        "dare", base, mods, weights, 1.0, _bernoulli(dens, seed, rescale), sign_consensus, False, trainable_only
    )


# --------------------------------------------------------------------------- model stock


def model_stock(base: T, models: Sequence[T], /, *, trainable_only: bool = True) -> T:
    """Model stock: interpolate between the base and the models' average by their agreement.

    Per tensor (mergekit's ``model_stock``, ``filter_wise=False``): with ``o_i = m_i - base``
    flattened, ``c`` the mean over pairs ``i < j`` of
    ``clip(<o_i, o_j> / max(|o_i| |o_j|, 1e-6), -1, 1)`` and ``N = len(models)``,
    ``t = N c / (1 + (N - 1) c)`` (0 where the
    denominator is 0, which mergekit leaves as inf/NaN) and ``merged = t * mean(m_i) + (1 - t) * base``.

    Parameters
    ----------
    base
        The pre-trained model (the anchor); it gives the constants.
    models
        At least two fine-tuned models of `base`'s structure.
    trainable_only
        True (default): parameters only; False: every floating array (buffers too).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> base = {"w": np.zeros(2)}
    >>> ms = [{"w": np.array([1.0, 0.0])}, {"w": np.array([0.0, 1.0])}]
    >>> fk.model_stock(base, ms)  # orthogonal task vectors: t = 0, the base
    {'w': array([0., 0.])}
    """
    mods = _models(models, "model_stock", least=2)
    n = len(mods)

    def fn(path: KeyPath, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real("model_stock", path, x)
        xp = namespace(x)
        wdt = work(xp, x).dtype
        # every norm and dot of the deltas in one reduction on Dask (`sums`: each block read once)
        pairs_ij = [(i, j) for i in range(n) for j in range(i + 1, n)]
        fns = [functools.partial(_off_prod_at, i, j) for i, j in [(i, i) for i in range(n)] + pairs_ij]
        got = sums(xp, fns, (x, *others), wdt)
        norms = [xp.sqrt(v) for v in got[:n]]
        dots = dict(zip(pairs_ij, got[n:], strict=True))
        cos = None
        pairs = 0
        for i in range(n):
            for j in range(i + 1, n):
                den = xp.maximum(norms[i] * norms[j], _scalar(xp, EPS_STOCK, norms[i]))
                dot = dots[i, j]
                cij = xp.clip(dot / den, -1.0, 1.0)
                cos = cij if cos is None else cos + cij
                pairs += 1
        assert cos is not None
        cos = cos / pairs
        den = 1 + (n - 1) * cos
        zero = den == 0  # c = -1/(N-1) exactly (e.g. two opposite 1-element deltas): t = 0, the base
        t = xp.where(zero, _scalar(xp, 0.0, den), (n * cos) / xp.where(zero, _scalar(xp, 1.0, den), den))
        return elementwise(xp, _stock_body, (x, *others), (t,))

    return cast(T, _map_params("model_stock", _names(n), (base, *mods), fn, trainable_only))


def _stock_body(xp: Any, x: Any, *rest: Any) -> Any:
    *others, t = rest
    b = work(xp, x)
    ws = [work(xp, o) for o in others]
    avg = ws[0]
    for w in ws[1:]:
        avg = avg + w
    avg = avg / len(ws)
    return cast_back(xp, t * avg + (1 - t) * b, x)
