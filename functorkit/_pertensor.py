"""Per-tensor building blocks of the merge methods (``_merge.py``): working dtypes, per-path
schedules (path globs), per-tensor reductions, top-k thresholds and DARE's counter-based masks.

Everything here acts on one array through its array API namespace (no backend is imported):
the same code builds an eager result on NumPy/torch/JAX and a lazy graph on Dask. Reductions
give 0-d arrays of the tensor's namespace and device; nothing moves to the host.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import StructureError
from ._keypath import KeyPath
from ._lockstep import _describe
from ._xp import is_complex, namespace
from .adapters import adapter_of
from .adapters._sharding import new_array_device, settle, whole_tensor_problem

#: the tolerances of mergekit's formulas (named where they are used)
EPS_NORM = 1e-8  # slerp: a tensor is normalised only when its norm exceeds this
DOT_THRESHOLD = 0.9995  # slerp: |cos| above this is treated as parallel (lerp)
EPS_RESCALE = 1e-7  # DARE L1 rescale: skipped when either L1 norm is below this
EPS_STOCK = 1e-6  # model stock: the product of norms is clamped to at least this


# --------------------------------------------------------------------------- working dtype


def work(xp: Any, x: Any) -> Any:
    """`x` in its working dtype: floats narrower than 32 bits (float16, bfloat16, float8) are
    computed in float32 (as mergekit computes slerp, and far faster than NumPy's element-wise
    ml_dtypes loops); float32/float64 as they are. The result is cast back once (`cast_back`)."""
    size = getattr(x.dtype, "itemsize", 4)
    if size < 4:
        return xp.astype(x, xp.float32)
    return x


#: `select` masks the bits of NumPy float32/float64 arrays (False: ``where`` everywhere; bench_merge's "off" rows)
BIT_SELECT = True
_UINT = {4: np.uint32, 8: np.uint64}


def select(xp: Any, m: Any, v: Any) -> Any:
    """``where(m, v, +0.0)`` for a boolean `m` and a floating `v` of one shape, bit for bit.

    NumPy float32/float64 (a Dask block, an eager NumPy array): the bits of `v` ANDed with
    ``-uint(m)`` (all ones where `m`, zero where not: ``+0.0``), three branch-free passes, where
    ``np.where`` branches per element and, on a random mask (a TIES trim, a DARE mask, a sign
    election), runs some 20 times slower (bench_merge's "NumPy where" rows). Every other
    namespace: ``xp.where``."""
    if (
        BIT_SELECT
        and type(v) is np.ndarray
        and type(m) is np.ndarray
        and v.dtype.kind == "f"
        and v.dtype.itemsize in _UINT
        and m.dtype == np.bool_
        and m.shape == v.shape
    ):
        u = _UINT[v.dtype.itemsize]
        bits = m.astype(u)
        np.negative(bits, out=bits)  # 0 - 1 wraps to all ones
        np.bitwise_and(bits, v.view(u), out=bits)
        return bits.view(v.dtype)
    zero = xp.asarray(0.0, dtype=v.dtype, device=new_array_device(adapter_of(v), v))
    return xp.where(m, v, zero)


def cast_back(xp: Any, r: Any, like: Any) -> Any:
    """`r` in `like`'s dtype (one cast at the end of a merge; none when the dtype is already right)."""
    if r.dtype == like.dtype:
        return r
    return xp.astype(r, like.dtype)


def check_real(fname: str, path: KeyPath, x: Any) -> None:
    if is_complex(x):
        msg = (
            f"at {path.display}: fk.{fname}: the parameter is a {_describe(x)}; the merge methods are "
            "defined for real floating parameters only. Fix: merge the real and imaginary parts as two "
            "real models (fk.fmap(lambda x: x.real, model), then .imag), or keep the complex array out of "
            "the merge (under trainable_only=True, the default, a buffer or a frozen parameter is not merged)."
        )
        raise TypeError(msg)


def check_whole(fname: str, path: KeyPath, x: Any) -> None:
    """A selection over the whole tensor `x` (top-k thresholds, DARE's masks) cannot be made on a
    sharded tensor's local part (torch DTensor): a `TypeError` naming the path and the fix."""
    why = whole_tensor_problem(adapter_of(x), x)
    if why is not None:
        msg = f"at {path.display}: fk.{fname} on a sharded model: {why}."
        raise TypeError(msg)


# --------------------------------------------------------------------------- schedules


def _real_number(v: Any, what: str, fname: str) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or (hasattr(v, "shape") and v.shape):
        msg = (
            f"fk.{fname}: `{what}` must be a real number or a dict from path globs to real numbers, got "
            f"{type(v).__name__} ({v!r:.80}). Fix: pass e.g. 0.5 or {{'*.mlp.*': 0.7, '*': 0.5}}."
        )
        raise TypeError(msg)
    out = float(v)
    if math.isnan(out):
        msg = f"fk.{fname}: `{what}` must not be NaN."
        raise ValueError(msg)
    return out


class Schedule:
    """A scalar, or a dict from path globs to scalars: ``get(path)`` gives the first matching value.

    A glob matches ``str(path)`` (``model.layers[0].mlp.weight``) or the path's dotted
    state-dict form (``model.layers.0.mlp.weight``), with `fnmatch.fnmatchcase`.
    """

    __slots__ = ("fname", "items", "value", "what")

    def __init__(self, spec: Any, what: str, fname: str, check: Any = None) -> None:
        self.what, self.fname = what, fname
        self.value: float | None = None
        self.items: list[tuple[str, float]] = []
        if isinstance(spec, Mapping):
            if not spec:
                msg = f"fk.{fname}: `{what}` is an empty dict; expected path globs to numbers, e.g. {{'*': 0.5}}."
                raise ValueError(msg)
            for k, v in spec.items():
                if not isinstance(k, str):
                    msg = f"fk.{fname}: the keys of `{what}` must be path globs (str), got {k!r}."
                    raise TypeError(msg)
                self.items.append((k, _real_number(v, f"{what}[{k!r}]", fname)))
        else:
            self.value = _real_number(spec, what, fname)
        if check is not None:
            for name, v in (
                [(what, self.value)] if self.value is not None else [(f"{what}[{k!r}]", v) for k, v in self.items]
            ):
                check(fname, name, v)

    def get(self, path: KeyPath) -> float:
        if self.value is not None:
            return self.value
        kp = path if isinstance(path, KeyPath) else path.path  # the walk's lazy path (_walk._PathAt)
        s, d = str(kp), kp.dotted
        for pat, v in self.items:
            if fnmatch.fnmatchcase(s, pat) or fnmatch.fnmatchcase(d, pat):
                return v
        globs = ", ".join(repr(k) for k, _ in self.items)
        msg = (
            f"at {path.display}: fk.{self.fname}: no glob of `{self.what}` ({globs}) matches "
            f"{s!r} (dotted: {d!r}). Expected every parameter's path to match one glob (first match "
            f"wins); fix: add a catch-all entry last, e.g. {{..., '*': value}}."
        )
        raise StructureError(msg)


def per_model(spec: Any, n: int, what: str, fname: str, check: Any = None) -> list[Schedule]:
    """One `Schedule` per model: `spec` is one scalar/dict for every model, or a list of them."""
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        specs = list(spec)
        if len(specs) != n:
            msg = (
                f"fk.{fname}: `{what}` has {len(specs)} entries but there are {n} models. Expected one "
                f"entry per model, or one number (or dict of globs) for all; fix: pass {n} entries."
            )
            raise ValueError(msg)
        return [Schedule(s, f"{what}[{i}]", fname, check) for i, s in enumerate(specs)]
    one = Schedule(spec, what, fname, check)
    return [one] * n


def check_density(fname: str, name: str, v: float) -> None:
    if not 0.0 < v <= 1.0:
        msg = f"fk.{fname}: `{name}` must be a fraction in (0, 1] (the share of each delta kept), got {v}."
        raise ValueError(msg)


# --------------------------------------------------------------------------- reductions


def total(xp: Any, x: Any) -> Any:
    """The sum of every element of `x`: a 0-d array (lazy on Dask)."""
    return xp.sum(x)


def sq_norm(xp: Any, x: Any) -> Any:
    return xp.sum(x * x)


def vdot(xp: Any, x: Any, y: Any) -> Any:
    return xp.sum(x * y)


def norm(xp: Any, x: Any) -> Any:
    return xp.sqrt(xp.sum(x * x))


def count_kept(n: int, density: float) -> int:
    """TIES's rule: the ``max(1, floor(density * n))`` largest magnitudes of a tensor are kept."""
    return max(1, math.floor(density * n))


def kth_largest(xp: Any, a: Any, k: int) -> Any:
    """The `k`-th largest value of `a` (any shape; ``1 <= k <= a.size``), a 0-d array.

    A selection, not a sort, where the namespace has one: ``partition`` (NumPy, JAX),
    ``kthvalue`` (torch), the adapter's ``kth_largest`` (Dask: a radix selection on the float
    bits, one histogram per block and 16 bits, no candidates held). Other namespaces
    (array-api-strict) sort.
    """
    fast = adapter_of(a).kth_largest(a, k)  # Dask: one chunked selection (no sort)
    if fast is not None:
        return fast
    topk = getattr(xp, "topk", None)
    if topk is not None and getattr(xp, "kthvalue", None) is None and a.ndim > 1:
        a = a.rechunk({i: -1 for i in range(1, a.ndim)})  # Dask: rows whole, so the reshape is free
    flat = xp.reshape(a, (-1,))
    n = int(flat.shape[0])
    j = n - k  # 0-based position in ascending order
    part = getattr(xp, "partition", None)
    if part is not None:
        return part(flat, j)[j]
    kth = getattr(xp, "kthvalue", None)
    if kth is not None:
        return kth(flat, j + 1).values
    if topk is not None:
        if k <= n - k + 1:
            return xp.min(topk(flat, k))
        return xp.max(topk(flat, -(n - k + 1)))
    return xp.sort(flat)[j]


#: `kth_largests` on Dask: one radix selection for every output, `fn` computed in pieces inside the
#: histogram tasks (False: each output an `elementwise` array and its own `kth_largest`; the comparison)
FUSED_SELECT = True


def kth_largests(xp: Any, fn: Any, arrays: Sequence[Any], ks: Sequence[int], dtype: Any) -> list[Any]:
    """``[kth_largest(xp, v, k) for v, k in zip(fn(range(len(ks)), *arrays), ks)]``: the ``ks[j]``-th
    largest of output ``j`` of the element-wise `fn` (``fn(outputs, *arrays)``: one array of
    `dtype` and ``arrays[0]``'s shape per index in `outputs`; TIES: each model's ``|m_i - base|``).

    On Dask (`FUSED_SELECT`) one radix selection for every output (the adapter's
    ``kth_largests``): its block tasks compute `fn` in pieces, so no block of the outputs is made
    and each input block is read once per level for all of them. Elsewhere each output is made and
    selected in turn (one at a time in memory). The same values either way."""
    fast = adapter_of(arrays[0]).kth_largests(fn, arrays, ks, dtype) if FUSED_SELECT else None
    if fast is not None:
        return list(fast)
    import functools

    out = []
    for j, k in enumerate(ks):
        if _chunked(arrays[0]) and arrays[0].shape:
            v = elementwise(xp, functools.partial(_output, fn, j), arrays, dtype=dtype)
        else:
            v = fn((j,), *arrays)[0]
        out.append(kth_largest(xp, v, k))
    return out


def _output(fn: Any, j: int, xp: Any, *arrays: Any) -> Any:
    """Output `j` of the multi-output `fn` as an `elementwise` body."""
    return fn((j,), *arrays)[0]


# --------------------------------------------------------------------------- DARE's random masks

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1
_C1, _C2 = 0x85EBCA6B, 0xC2B2AE35
#: the masks compare 24 uniform bits with round(density * 2**24)
MASK_BITS = 24
#: a Dask block is computed in row pieces of about this many elements (`_piecewise`, the int32 mask hash):
#: cache-sized temporaries. Measured in session 13: 32 Ki pieces make a TIES body 20% faster (2% of a
#: merge) but cost about 2 MB of peak RSS on bfloat16 DARE (over the 25% target there), so 16 Ki stays
_PIECE = 1 << 14


def _i32(v: int) -> int:
    """The signed 32-bit integer with the bits of `v` (so that it fits an int32 array's weak scalar)."""
    v &= _M32
    return v - (1 << 32) if v >= 1 << 31 else v


def _lsr(xp: Any, h: Any, s: int) -> Any:
    """Logical right shift of int32 `h` (arithmetic shift, then the sign bits masked off)."""
    return xp.bitwise_and(xp.bitwise_right_shift(h, s), (1 << (32 - s)) - 1)


def _fmix(xp: Any, h: Any) -> Any:
    """MurmurHash3's 32-bit finaliser on int32 words (multiplication wraps modulo 2**32)."""
    h = xp.bitwise_xor(h, _lsr(xp, h, 16))
    h = h * _i32(_C1)
    h = xp.bitwise_xor(h, _lsr(xp, h, 13))
    h = h * _i32(_C2)
    return xp.bitwise_xor(h, _lsr(xp, h, 16))


def mask_keys(seed: int, position: int, path: KeyPath) -> tuple[int, int]:
    """Two 32-bit keys from (seed, model position, path): BLAKE2b of their text, so the same on
    every machine, process and Python version (no ``hash()`` randomisation). The path enters as
    its state-dict key (``path.dotted``: ``model.layers.0.mlp.weight``), so a module in memory,
    its state dict and its checkpoint opened with ``fk.open`` draw the same masks."""
    kp = path if isinstance(path, KeyPath) else path.path  # the walk's lazy path (_walk._PathAt)
    text = f"functorkit.dare\0{seed}\0{position}\0{kp.dotted}".encode()
    d = hashlib.blake2b(text, digest_size=8).digest()
    return _i32(int.from_bytes(d[:4], "little")), _i32(int.from_bytes(d[4:], "little"))


def flat_index(xp: Any, shape: tuple[int, ...], block: tuple[int, ...], starts: tuple[int, ...], device: Any) -> Any:
    """The row-major flat indices (in an array of `shape`) of the block of shape `block` that starts
    at `starts`: an int32 array of shape `block`, one ``arange`` per axis, broadcast and summed."""
    idx = None
    stride = 1
    for ax in range(len(shape) - 1, -1, -1):
        r = xp.arange(starts[ax], starts[ax] + block[ax], dtype=xp.int32, device=device)
        if stride != 1:
            r = r * stride
        bshape = [1] * len(shape)
        bshape[ax] = block[ax]
        r = xp.reshape(r, tuple(bshape))
        idx = r if idx is None else idx + r
        stride *= shape[ax]
    assert idx is not None
    return idx


def _bits(xp: Any, idx: Any, keys: tuple[int, int], thr: int) -> Any:
    k0, k1 = keys
    h = idx * _i32(_GOLDEN) + k0
    h = _fmix(xp, h)
    h = _fmix(xp, xp.bitwise_xor(h, k1))
    return _lsr(xp, h, 32 - MASK_BITS) < thr


#: `_keep_block` hashes NumPy blocks in place on uint32 words (False: the namespace's int32 code; bench_merge's rows)
UINT32_HASH = True
#: elements per piece of `_keep_block_u32` (two uint32 buffers of 256 KiB: in a core's L2)
_HASH_PIECE = 1 << 16
_G32 = np.uint32(_GOLDEN)
_STEPS: dict[int, Any] = {}  # piece size -> arange(piece) * golden (uint32, read-only)


def _fmix_u32(h: Any, t: Any) -> None:
    """`_fmix` in place on NumPy uint32 `h` (`t`: a scratch array of its shape): a logical shift is
    one pass on unsigned words, the products wrap modulo 2**32 as on int32: the same bits."""
    for s, c in ((16, _C1), (13, _C2), (16, None)):
        np.right_shift(h, s, out=t)
        np.bitwise_xor(h, t, out=h)
        if c is not None:
            np.multiply(h, np.uint32(c), out=h)


def _keep_block_u32(keys: tuple[int, int], thr: int, first: int, out: Any) -> Any:
    """`_bits` into the NumPy bool block `out`, whose elements have the flat indices ``first ..
    first + out.size`` (a block of whole rows): per piece of `_HASH_PIECE` elements,
    ``i * golden + k0`` as a precomputed ``arange * golden`` plus one constant, both finalisers in
    place on two uint32 buffers, and ``(h >> 8) < thr`` as ``h < thr << 8``: 19 passes on
    cache-sized words instead of about 30 temporaries (the same bits; tests/test_merge_fast_paths.py)."""
    flat = out.reshape(-1)
    n = int(flat.shape[0])
    if not n:
        return out
    p = min(_HASH_PIECE, n)
    steps = _STEPS.get(p)
    if steps is None:
        steps = np.arange(p, dtype=np.uint32) * _G32
        steps.flags.writeable = False
        _STEPS[p] = steps
    h = np.empty(p, dtype=np.uint32)
    t = np.empty(p, dtype=np.uint32)
    k1 = np.uint32(keys[1] & _M32)
    lim = thr << (32 - MASK_BITS)
    for i in range(0, n, p):
        m = min(p, n - i)
        hh, tt = h[:m], t[:m]
        np.add(steps[:m], np.uint32(((first + i) * _GOLDEN + keys[0]) & _M32), out=hh)
        _fmix_u32(hh, tt)
        np.bitwise_xor(hh, k1, out=hh)
        _fmix_u32(hh, tt)
        if lim > _M32:  # density rounds to 2**24: every element kept
            flat[i : i + m] = True
        else:
            np.less(hh, np.uint32(lim), out=flat[i : i + m])
    return out


def _keep_block(shape: tuple[int, ...], keys: tuple[int, int], thr: int, block: Any, block_info: Any = None) -> Any:
    """One Dask block of the mask (``map_blocks``; a module-level function, so it pickles to
    worker processes): the block's flat indices from its location in the whole array."""
    from ._xp import namespace

    loc = block_info[0]["array-location"]
    xp = namespace(block)
    starts = tuple(int(a) for a, _ in loc)
    bshape = tuple(int(b - a) for a, b in loc)
    if UINT32_HASH and type(block) is np.ndarray and bshape[1:] == shape[1:]:
        # a NumPy block of whole rows (fk.open's chunks): flat indices first .. first + size
        return _keep_block_u32(keys, thr, starts[0] * math.prod(shape[1:]), np.empty(bshape, dtype=np.bool_))
    row = math.prod(bshape[1:])
    step = max(1, _PIECE // max(row, 1))
    if bshape[0] <= step:
        return _bits(xp, flat_index(xp, shape, bshape, starts, None), keys, thr)
    # a block's chunk (NumPy, CuPy: mutable) filled in pieces of about `_PIECE` elements, so that the
    # hash's ~16 integer passes run on cache-sized temporaries (the same bits: element-wise)
    out = xp.empty(bshape, dtype=xp.bool)
    for r in range(0, bshape[0], step):
        n = min(step, bshape[0] - r)
        piece = flat_index(xp, shape, (n, *bshape[1:]), (starts[0] + r, *starts[1:]), None)
        out[r : r + n] = _bits(xp, piece, keys, thr)
    return out


def keep_mask(xp: Any, x: Any, density: float, keys: tuple[int, int], path: KeyPath) -> Any:
    """DARE's Bernoulli(`density`) mask for `x`: a boolean array of `x`'s shape (``(1,)`` for a
    0-d `x`). Element ``i`` is kept when 24 bits of ``fmix(fmix(i * golden + k0) ^ k1)`` are below
    ``round(density * 2**24)``: a counter-based generator, so each element's draw depends only on
    the keys and its flat index (not on the order, the chunking, the processes or the backend).
    On Dask each block computes its own part (``map_blocks`` with the block's offsets)."""
    import functools

    n = math.prod(int(d) for d in x.shape)
    if n >= 2**31:
        msg = (
            f"at {path.display}: fk.dare: the tensor has {n} elements; DARE's counter is a 31-bit "
            "element index. Fix: split the tensor (e.g. reshape to rows and merge per row)."
        )
        raise ValueError(msg)
    thr = round(density * 2**MASK_BITS)
    shape = tuple(int(d) for d in x.shape) or (1,)
    if not x.shape:
        x = xp.reshape(x, (1,))
    if _chunked(x):
        fn = functools.partial(_keep_block, shape, keys, thr)
        return x.map_blocks(fn, dtype=bool, meta=np.empty((0,) * len(shape), dtype=bool))
    dev = new_array_device(adapter_of(x), x)
    return _bits(xp, flat_index(xp, shape, shape, (0,) * len(shape), dev), keys, thr)


# --------------------------------------------------------------------------- element-wise bodies


def _chunked(x: Any) -> bool:
    """A chunked lazy array (Dask): immutable, with ``map_blocks`` and ``chunks``."""
    return not adapter_of(x).mutable and hasattr(x, "map_blocks") and hasattr(x, "chunks")


def _piecewise(fn: Any, n: int, *blocks: Any) -> Any:
    """One Dask block of `elementwise`: `fn` on row pieces of about `_PIECE` elements of the `n`
    array blocks (the rest, 0-d constants, whole), written into one output block (NumPy, CuPy:
    mutable), so that the body's passes run on cache-sized temporaries instead of allocating and
    faulting in a fresh block-sized array per operation. Element-wise, so the same bits."""
    arrays, consts = blocks[:n], blocks[n:]
    x = arrays[0]
    xp = namespace(x)
    rows = int(x.shape[0])
    step = max(1, _PIECE // max(1, math.prod(int(d) for d in x.shape[1:])))
    if rows <= step:
        return fn(xp, *arrays, *consts)
    out = None
    for r in range(0, rows, step):
        part = fn(xp, *(a[r : r + step] for a in arrays), *consts)
        if out is None:
            out = xp.empty(tuple(int(d) for d in x.shape), dtype=part.dtype)
        out[r : r + step] = part
    return out


def elementwise(xp: Any, fn: Any, arrays: Sequence[Any], consts: Sequence[Any] = (), dtype: Any = None) -> Any:
    """``fn(xp, *arrays, *consts)`` for an element-wise `fn` whose result has ``arrays[0]``'s shape
    and `dtype` (default ``arrays[0]``'s): called directly on eager arrays; on Dask (``arrays``
    of one shape, ``consts`` 0-d, lazy reductions included) one ``map_blocks`` task per block
    that runs `fn` in row pieces (`_piecewise`). The values are those of ``fn`` on the whole arrays, bit for bit."""
    import functools

    x = arrays[0]
    if not x.shape or not _chunked(x):
        return fn(xp, *arrays, *consts)
    body = functools.partial(_piecewise, fn, len(arrays))
    dt = x.dtype if dtype is None else dtype
    meta = np.empty((0,) * len(x.shape), dtype=dt)
    return x.map_blocks(body, *_same_grid(x, arrays[1:]), *consts, dtype=dt, meta=meta)


def _same_grid(x: Any, arrays: Sequence[Any]) -> list[Any]:
    """`arrays` (Dask, of `x`'s shape) in `x`'s chunks: a block task takes one block of each, and
    ``map_blocks`` with 0-d inputs beside them does not line differently chunked ones up."""
    return [a if a.chunks == x.chunks else a.rechunk(x.chunks) for a in arrays]


def _block_sums(fns: tuple[Any, ...], *blocks: Any) -> Any:
    """One Dask block of `sums`: ``sum(fn(xp, *blocks))`` of the block for every `fn` (each computed
    in row pieces by `_piecewise`, then summed whole: the same sum whatever the piece size), as an
    array of shape ``(len(fns), 1, ..., 1)``."""
    xp = namespace(blocks[0])
    out = [xp.sum(_piecewise(fn, len(blocks), *blocks)) for fn in fns]
    return xp.reshape(xp.stack(out), (len(fns),) + (1,) * blocks[0].ndim)


def sums(xp: Any, fns: Sequence[Any], arrays: Sequence[Any], dtype: Any) -> list[Any]:
    """``[xp.sum(fn(xp, *arrays)) for fn in fns]`` for element-wise `fns` of `dtype` over arrays of
    one shape: several reductions of the same tensors (slerp's norms and dot, DARE's L1 norms,
    model stock's dots). Eager arrays: each sum of `elementwise`, directly. On Dask one task per
    block computes every sum's part of the block (in row pieces) and one reduction adds the parts:
    each block is read once for all the sums, where separate reductions sharing the input blocks
    would keep them in memory until the last has run (bench_merge's peak RSS)."""
    import functools

    x = arrays[0]
    if not x.shape or not _chunked(x):
        return [xp.sum(elementwise(xp, fn, arrays, dtype=dtype)) for fn in fns]
    arrays = [x, *_same_grid(x, arrays[1:])]
    nd = len(x.shape)
    chunks = ((len(fns),), *(tuple(1 for _ in c) for c in x.chunks))
    meta = np.empty((0,) * (nd + 1), dtype=dtype)
    parts = x.map_blocks(
        functools.partial(_block_sums, tuple(fns)), *arrays[1:], new_axis=0, chunks=chunks, dtype=dtype, meta=meta
    )
    total = xp.sum(parts, axis=tuple(range(1, nd + 1)))
    return [total[i] for i in range(len(fns))]


# --------------------------------------------------------------------------- public per-tensor reductions


def tensor_norms(model: Any, /, *, trainable_only: bool = True) -> Any:
    """Each parameter's Euclidean norm, as a tree of 0-d arrays of `model`'s structure.

    The per-tensor counterpart of `fk.norm` (which reduces over the whole model): at every
    parameter, ``sqrt(sum(x * x))``, a 0-d array of the parameter's namespace and device
    (lazy on Dask: no value is computed or moved to the host). Floats narrower than 32 bits
    are reduced in float32 and the 0-d result stays float32 (a bfloat16 norm would keep 8
    bits). Every other leaf comes from `model`, as in the arithmetic (arrays copied).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.tensor_norms({"w": np.array([3.0, 4.0]), "b": np.array([1.0])})
    {'w': array(5.), 'b': array(1.)}
    """
    from ._lockstep import _map_params

    def fn(path: Any, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real("tensor_norms", path, x)
        xp = namespace(x)
        w = work(xp, x)
        # a DTensor's sum of squares is made whole with one all-reduce before the root (docs/sharded.md)
        return xp.sqrt(settle(adapter_of(x), xp.sum(w * w)))

    return _map_params("tensor_norms", ("model",), (model,), fn, trainable_only)


def tensor_dots(a: Any, b: Any, /, *, trainable_only: bool = True) -> Any:
    """Each parameter pair's inner product ``sum(x * y)``, as a tree of 0-d arrays of `a`'s structure.

    The per-tensor counterpart of `fk.dot`, with `fk.add`'s structure, shape, dtype and
    device checks; the dtypes of `tensor_norms`.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.tensor_dots({"w": np.array([1.0, 2.0])}, {"w": np.array([3.0, 4.0])})
    {'w': array(11.)}
    """
    from ._lockstep import _map_params

    def fn(path: Any, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real("tensor_dots", path, x)
        xp = namespace(x)
        # a DTensor's sum is a pending (Partial) one: made whole here (docs/sharded.md)
        return settle(adapter_of(x), vdot(xp, work(xp, x), work(xp, others[0])))

    return _map_params("tensor_dots", ("a", "b"), (a, b), fn, trainable_only)


def tensor_thresholds(model: Any, density: Any, /, *, trainable_only: bool = True) -> Any:
    """Each parameter's top-k magnitude threshold, as a tree of 0-d arrays: TIES's trim point.

    At every parameter ``x`` of ``n`` elements, the ``k``-th largest of ``abs(x)`` with
    ``k = max(1, floor(density * n))``: ``abs(x) >= threshold`` selects the elements
    `fk.ties` keeps. Found by a selection (``partition``/``kthvalue``/on Dask a radix
    selection over the blocks), not a sort, where the namespace has one. `density` is a number in ``(0, 1]`` or
    a dict from path globs to numbers (as in `fk.ties`). Dtypes as in `tensor_norms`. An empty
    parameter's threshold is ``+inf`` (it has no element to keep; `fk.ties` leaves it empty).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.tensor_thresholds({"w": np.array([0.5, -3.0, 2.0, 1.0])}, 0.5)
    {'w': array(2.)}
    """
    from ._lockstep import _map_params

    dens = Schedule(density, "density", "tensor_thresholds", check_density)

    def fn(path: Any, x: Any, others: list[Any], _out: Any = None) -> Any:
        check_real("tensor_thresholds", path, x)
        check_whole("tensor_thresholds", path, x)
        xp = namespace(x)
        a = xp.abs(work(xp, x))
        n = math.prod(int(d) for d in x.shape)
        if n == 0:  # no k-th largest of nothing: +inf, which no element reaches (0-d, x's namespace and device)
            return xp.sum(a) + math.inf
        return kth_largest(xp, a, count_kept(n, dens.get(path)))

    return _map_params("tensor_thresholds", ("model",), (model,), fn, trainable_only)
