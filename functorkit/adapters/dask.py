"""Dask: immutable, lazy arrays on the host."""

from __future__ import annotations

import functools
import importlib
import math
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._base import MethodSlices, _little_endian

__all__ = ["Adapter"]


def _is_dask(c: Any) -> bool:
    return hasattr(c, "__dask_graph__")


#: a reduction the two-pass save computes first holds at most this many elements (a 0-d norm, a
#: threshold); a larger one-block layer (a rechunk to one block) is left in the graph
_SMALL_REDUCTION = 1 << 16


def _local(blocks: list[Any]) -> dict[str, Any]:
    """``{"scheduler": the collections' own}`` where no scheduler is configured and ``distributed``
    was never imported (so no client can be active): skips ``dask.compute``'s first-call import of
    ``distributed`` (0.2-0.4 s in a fresh process); ``{}`` otherwise (the active one is used)."""
    dask: Any = importlib.import_module("dask")
    if blocks and "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
        return {"scheduler": blocks[0].__dask_scheduler__}
    return {}


def _small_cuts(x: Any) -> dict[str, tuple[tuple[int, ...], ...]]:
    """``{layer name: chunks}`` of the small reductions the blocks of `x` share: one-block layers of
    at most `_SMALL_REDUCTION` elements with a layer of several blocks below them (transitively) and
    one reading them (from the layers' shape and chunk annotations)."""
    if math.prod(x.numblocks) <= 1:
        return {}
    hlg = x.__dask_graph__()
    layers = getattr(hlg, "layers", None)
    if layers is None or x.name not in layers:
        return {}
    chunks: dict[str, Any] = {}
    for name, layer in layers.items():
        c = (getattr(layer, "collection_annotations", None) or {}).get("chunks")
        if c is not None:
            chunks[name] = c
    deps = hlg.dependencies
    many = {n for n, c in chunks.items() if math.prod(len(d) for d in c) > 1}
    below: dict[str, bool] = {}

    def multi_below(n: str) -> bool:  # iterative: graphs may be deep
        stack = [n]
        while stack:
            m = stack[-1]
            pending = [d for d in deps.get(m, ()) if d not in below]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            below[m] = any(d in many or below[d] for d in deps.get(m, ()))
        return below[n]

    out = {}
    for name, ds in deps.items():
        if name not in many:
            continue
        for d in ds:
            c = chunks.get(d)
            if (
                c is not None
                and d not in many
                and d not in out
                and math.prod(sum(a) for a in c) <= _SMALL_REDUCTION
                and multi_below(d)
            ):
                out[d] = c
    return out


#: bits of the key fixed per level of `Adapter.kth_largest`'s radix selection
_RADIX = 16
#: TIES's radix histograms count in int32 for tensors of fewer elements than this (int64 above)
INT32_COUNTS = 2**31
#: elements per piece of a block's histogram (the keys and digits of a piece stay in cache)
_HIST_PIECE = 1 << 16


def _key(x: Any) -> Any:
    """The bits of float array `x` as unsigned keys in the floats' order (negatives flipped)."""
    u = np.dtype(f"u{x.dtype.itemsize}")
    bits = np.ascontiguousarray(x).view(u)
    top = u.type(8 * x.dtype.itemsize - 1)
    flip = bits >> top  # 1 for a negative float
    np.negative(flip, out=flip)  # all ones for a negative float (unsigned wrap-around), else 0
    np.bitwise_or(flip, u.type(1) << top, out=flip)
    return np.bitwise_xor(bits, flip, out=flip)


#: the level-0 histogram from the raw top 16 bits: key digit j counts the raw digit _KEY_TO_RAW[j]
#: (a non-negative float's key sets the sign bit, a negative one's is its complement)
_DIGITS = np.arange(1 << _RADIX, dtype=np.intp)
_KEY_TO_RAW = np.where(_DIGITS >> (_RADIX - 1), _DIGITS & ((1 << (_RADIX - 1)) - 1), ~_DIGITS & ((1 << _RADIX) - 1))


def _histogram(level: int, shift: int, count: Any, x: Any, prefix: Any) -> Any:
    """A block's histogram of the key bits ``shift .. shift + 16`` among the elements whose higher
    bits are `prefix` (every element at the first level), in counts of dtype `count`.

    Counted on the float's raw bits, without making the keys (`_key`: four passes): the key is a
    bijection of the bits, so at the first level the histogram of the raw top 16 bits is permuted
    (`_KEY_TO_RAW`), and below it `prefix` fixes the sign, so the elements are those whose raw high
    bits are the prefix's preimage and their digits are the raw ones (non-negative floats) or
    their complements (negative: the histogram reversed). The same counts, bin for bin."""
    flat = np.ascontiguousarray(x).reshape(-1)
    u = np.dtype(f"u{flat.dtype.itemsize}")
    bits = flat.view(u)
    n = int(bits.shape[0])
    out = np.zeros(1 << _RADIX, dtype=count)
    if not level:
        for i in range(0, n, _HIST_PIECE):  # cache-sized temporaries (digits)
            out += np.bincount(bits[i : i + _HIST_PIECE] >> u.type(shift), minlength=1 << _RADIX)
        return out[_KEY_TO_RAW]
    width = 8 * flat.dtype.itemsize - shift - _RADIX  # bits of `prefix`
    p = int(prefix)
    positive = p >> (width - 1)  # the key's sign bit set: a non-negative float
    raw = p & ((1 << (width - 1)) - 1) if positive else ~p & ((1 << width) - 1)
    high, low, mask = u.type(shift + _RADIX), u.type(shift), u.type((1 << _RADIX) - 1)
    for i in range(0, n, _HIST_PIECE):
        piece = bits[i : i + _HIST_PIECE]
        digits = piece[(piece >> high) == u.type(raw)] >> low
        digits &= mask
        out += np.bincount(digits, minlength=1 << _RADIX)
    return out if positive else out[::-1].copy()


def _pick(k: int, which: int, hist: Any, prefix: Any, above: Any) -> Any:
    """From a level's summed histogram: the next prefix (``which`` 0) of the k-th largest key, or
    the count of the elements above it (1)."""
    from_top = np.cumsum(hist[::-1])
    i = int(np.searchsorted(from_top, k - int(above)))  # the first bin, from the top, reaching k
    if which == 0:
        return np.asarray((int(prefix) << _RADIX) | (len(hist) - 1 - i), dtype=np.uint64)
    return np.asarray(int(above) + (int(from_top[i - 1]) if i else 0), dtype=np.uint64)


def _from_key(dtype: str, key: Any) -> Any:
    """The float of dtype `dtype` whose `_key` is `key` (0-d)."""
    dt = np.dtype(dtype)
    u = np.dtype(f"u{dt.itemsize}")
    k = np.asarray(key).astype(u)
    sign = u.type(1) << u.type(8 * dt.itemsize - 1)
    bits = np.where(k & sign, k ^ sign, ~k).astype(u)
    return bits.reshape(()).view(dt).copy()


def _first(x: Any, cuts: dict[str, Any]) -> dict[str, Any]:
    """The `cuts` of `x` that need no other of them (none below them in the graph)."""
    if len(cuts) < 2:
        return cuts
    deps = x.__dask_graph__().dependencies
    out = {}
    for name, chunks in cuts.items():
        seen: set[str] = set()
        stack = list(deps.get(name, ()))
        while stack:
            m = stack.pop()
            if m in seen:
                continue
            seen.add(m)
            stack.extend(deps.get(m, ()))
        if seen.isdisjoint(cuts):
            out[name] = chunks
    return out


class _Sink:
    """A ``dask.array.store`` target that hands each block it is given, with the rows it should
    hold, to a callable (``fn(start, stop, value)``; 0 and 1 for a 0-d array).

    Its Dask token is a random one made once (`__dask_tokenize__`): ``store`` tokenizes every
    target, and Dask's default for an object pickles it, here the callable with the lazy array it
    writes and that array's whole graph (0.2 s of a 1 s linear merge of three 220 MB checkpoints,
    0.5 s of TIES). A sink is one array's writes, never another sink's, so a token of its own is
    the right one."""

    __slots__ = ("fn", "token")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.token = uuid.uuid4().hex

    def __dask_tokenize__(self) -> str:
        return self.token

    def __setitem__(self, index: Any, value: Any) -> None:
        rows = (index[0].start or 0, index[0].stop) if index else (0, 1)  # `store` passes the block's slices
        self.fn(*rows, _little_endian(np.asarray(value)))


def _block_kernel(op: str, n: int, coefs: tuple[Any, ...], *blocks: Any) -> Any:
    """One Dask block of an arithmetic kernel: the block library's own kernel (`Adapter._kernel`).

    ``blocks``: the `n` array blocks, then the computed lazy coefficients (0-d); ``coefs``: the
    coefficients, each a number or 0-d array, or ``None`` where the next lazy one goes. A
    module-level function (with `functools.partial`), so it pickles to ``distributed`` workers."""
    from ._base import adapter_of

    xs, lazy = list(blocks[:n]), iter(blocks[n:])
    cs = [next(lazy) if c is None else c for c in coefs]
    ad = adapter_of(xs[0])
    if op == "lincomb":
        return ad.op_lincomb(xs, cs)
    if op == "mean":
        return ad.op_mean(xs)
    if op in ("add", "sub"):
        return getattr(ad, "op_" + op)(*xs)
    if op == "lerp":
        return ad.op_lerp(xs[0], xs[1], cs[0])
    return getattr(ad, "op_" + op)(xs[0], cs[0])  # scale, div


class Adapter(MethodSlices):
    family = "dask"
    mutable = False

    def compute_dtype(self, dtype: Any) -> Any:
        """float32 for the floating dtypes narrower than 32 bits (float16, ml_dtypes bfloat16 and
        float8_*), as NumPy's adapter (each chunk is a NumPy array): rounded once per element."""
        from .numpy import _narrow_float

        return _narrow_float(dtype)

    def accumulate_dtype(self, dtype: Any) -> Any:
        """float32 for the narrow floating dtypes, as `compute_dtype`."""
        return self.compute_dtype(dtype)

    def device(self, x: Any) -> Any:
        """Always ``"cpu"`` (array_api_compat's answer, without the call)."""
        return "cpu"

    # ---- arithmetic kernels: one task per block running the block library's kernel ---------------
    #
    # Dask's operators would build one layer per operation (``a + b``, ``+ c``, ``/ 3``, and for
    # narrow floats an ``astype`` per input and one back), each a full-size temporary per block; one
    # ``map_blocks`` of the chunk library's own kernel (NumPy: ufuncs with ``out=`` in cache-sized
    # blocks, narrow floats staged through float32 there) gives the same values bit for bit (the same
    # operations in the same order, rounded once) with one output array per block and a smaller graph.

    def _per_block(self, op: str, xs: Sequence[Any], cs: Sequence[Any], out: Any, generic: Any) -> Any:
        x0 = xs[0]
        if out is not None or not all(_is_dask(x) for x in xs):
            return generic()
        if any(x.chunks != x0.chunks for x in xs[1:]):  # one shape (checked), other chunks: x0's
            xs = [x if x.chunks == x0.chunks else x.rechunk(x0.chunks) for x in xs]
        lazy = [c for c in cs if _is_dask(c)]
        coefs = tuple(None if _is_dask(c) else c for c in cs)
        fn = functools.partial(_block_kernel, op, len(xs), coefs)
        return x0.map_blocks(fn, *xs[1:], *lazy, dtype=x0.dtype, meta=x0._meta)

    def op_add(self, x: Any, y: Any, out: Any = None) -> Any:
        return self._per_block("add", (x, y), (), out, lambda: super(Adapter, self).op_add(x, y, out))

    def op_sub(self, x: Any, y: Any, out: Any = None) -> Any:
        return self._per_block("sub", (x, y), (), out, lambda: super(Adapter, self).op_sub(x, y, out))

    def op_scale(self, x: Any, c: Any, out: Any = None) -> Any:
        return self._per_block("scale", (x,), (c,), out, lambda: super(Adapter, self).op_scale(x, c, out))

    def op_div(self, x: Any, c: Any, out: Any = None) -> Any:
        return self._per_block("div", (x,), (c,), out, lambda: super(Adapter, self).op_div(x, c, out))

    def op_lincomb(self, xs: Sequence[Any], cs: Sequence[Any], out: Any = None) -> Any:
        return self._per_block("lincomb", xs, cs, out, lambda: super(Adapter, self).op_lincomb(xs, cs, out))

    def op_mean(self, xs: Sequence[Any], out: Any = None) -> Any:
        return self._per_block("mean", xs, (), out, lambda: super(Adapter, self).op_mean(xs, out))

    def op_lerp(self, x: Any, y: Any, t: Any, out: Any = None) -> Any:
        return self._per_block("lerp", (x, y), (t,), out, lambda: super(Adapter, self).op_lerp(x, y, t, out))

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """No device test: every Dask array is on ``"cpu"``."""
        glb.update(T=ftype, S=(n,), D=dtype)
        return "type(p) is not T or p.shape != S or p.dtype != D"

    def copy(self, x: Any) -> Any:
        """``x.copy()`` (lazy; the namespace's ``asarray(copy=True)`` computes nothing either)."""
        return x.copy()

    def host_view(self, x: Any) -> Any:
        """Lazy arrays have no memory yet: nothing to alias."""
        return None

    def rows(self, x: Any) -> Any:
        """`x` in row blocks: its own chunks along the first axis, whole along the others (each block
        is one contiguous byte range of the file)."""
        if any(math.isnan(c) for cs in x.chunks for c in cs):
            msg = "the array has chunks of unknown size; call `x.compute_chunk_sizes()` first"
            raise ValueError(msg)
        if x.ndim > 1:
            x = x.rechunk({i: -1 for i in range(1, x.ndim)})
        return x

    def host_blocks(self, x: Any, target_bytes: int) -> list[Any] | None:
        """The `rows` blocks as arrays of their own; a 0-d array is one block."""
        if x.ndim == 0:
            return [x]
        x = self.rows(x)
        return [x.blocks[i] for i in range(x.numblocks[0])]

    def blocks_share_work(self, x: Any) -> bool:
        """True when the graph of `x` (of more than one block) has a layer of one block computed from
        a layer of several (a full reduction: ``sum``, ``topk``, a rechunk to one block), read from the
        layers' shapes and chunks in the graph's annotations; False for an elementwise graph, or
        where a layer has no such annotations."""
        import math

        if math.prod(x.numblocks) <= 1:
            return False
        hlg = x.__dask_graph__()
        layers = getattr(hlg, "layers", None)
        if layers is None:
            return True  # a plain dict graph: no layer structure to read, compute it whole
        nblocks: dict[Any, int] = {}
        for name, layer in layers.items():
            chunks = (getattr(layer, "collection_annotations", None) or {}).get("chunks")
            if chunks is not None:
                nblocks[name] = math.prod(len(c) for c in chunks)
        for name, deps in hlg.dependencies.items():
            if nblocks.get(name) == 1 and any(nblocks.get(d, 1) > 1 for d in deps):
                return True
        return False

    def kth_largest(self, a: Any, k: int) -> Any:
        """A radix selection on the float's bits (float32, float64; None for other dtypes): each
        element's bits made an unsigned key in the floats' order, then per 16 bits of the key, from
        the top, one histogram of 65,536 bins per block (``np.bincount``) summed over the blocks,
        which fixes those 16 bits of the k-th largest key (2 levels for float32, 4 for float64).
        Every level is a small reduction that reads the blocks once and holds only histograms (the
        two-pass save computes the levels one after the other), no candidates or sort; the same
        value as a selection (``np.partition``) on the whole array."""
        dt = np.dtype(a.dtype)
        if dt.kind != "f" or dt.itemsize not in (4, 8):
            return None
        da: Any = importlib.import_module("dask.array")
        if a.ndim > 1:
            a = a.rechunk({i: -1 for i in range(1, a.ndim)})  # rows whole, so the reshape is free
        flat = a.reshape(-1) if a.ndim != 1 else a
        nb = flat.numblocks[0]
        nbits = 8 * dt.itemsize
        prefix: Any = 0
        above: Any = 0
        scalar = np.empty((), dtype=np.uint64)
        # counts of at most the tensor's size: int32 where that fits (the histograms the reduction
        # holds are half the size: bench_merge's TIES rows)
        count = np.dtype(np.int32 if flat.shape[0] < INT32_COUNTS else np.int64)
        for level in range(nbits // _RADIX):
            shift = nbits - _RADIX * (level + 1)
            fn = functools.partial(_histogram, level, shift, count)
            hists = flat.map_blocks(fn, prefix, chunks=((1 << _RADIX,) * nb,), dtype=count, meta=np.empty((0,), count))
            total = hists.reshape(nb, 1 << _RADIX).sum(axis=0, dtype=count)
            step = functools.partial(_pick, k)
            prefix, above = (
                da.map_blocks(
                    functools.partial(step, i), total, prefix, above, drop_axis=0, dtype=np.uint64, meta=scalar
                )
                for i in (0, 1)
            )
        return da.map_blocks(functools.partial(_from_key, dt.str), prefix, dtype=dt, meta=np.empty((), dt))

    def reductions_first(self, xs: list[Any]) -> list[Any]:
        """The two-pass save's first pass: every small reduction that the blocks of an array of `xs`
        share (a one-block layer of at most `_SMALL_REDUCTION` elements, computed from a layer of
        several blocks and read by one: a merge's norms, dots, thresholds, L1 factors), of all of
        `xs`, computed in one ``dask.compute`` and put into the arrays' graphs as values (the same
        values: the same tasks, run once), so that each array then streams block by block. A
        reduction that needs another (the levels of TIES's radix selection) waits for the next
        round: each round reads the blocks once and holds only the reductions' results."""
        while True:
            cuts = [_first(x, _small_cuts(x)) for x in xs]
            if not any(cuts):
                return xs
            xs = self._substitute(xs, cuts)

    def _substitute(self, xs: list[Any], cuts: list[dict[str, Any]]) -> list[Any]:
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

        dask: Any = importlib.import_module("dask")
        da: Any = importlib.import_module("dask.array")
        todo = {
            name: da.Array(x.__dask_graph__().cull_layers([name]), name, chunks, meta=np.empty((0,) * len(chunks)))
            for x, cs in zip(xs, cuts, strict=True)
            for name, chunks in cs.items()
        }
        values = dict(zip(todo, dask.compute(*todo.values(), **_local(list(todo.values()))), strict=True))
        out = []
        for x, cs in zip(xs, cuts, strict=True):
            if not cs:
                out.append(x)
                continue
            hlg = x.__dask_graph__()
            layers, deps = dict(hlg.layers), {k: set(v) for k, v in hlg.dependencies.items()}
            for name in cs:
                (key,) = layers[name].get_output_keys()
                layers[name] = MaterializedLayer({key: values[name]})
                deps[name] = set()
            hlg = HighLevelGraph(layers, deps).cull_layers([x.name])  # the reductions' inputs dropped
            out.append(da.Array(hlg, x.name, x.chunks, meta=x._meta))
        return out

    def store_rows(self, arrays: list[Any], sinks: list[Any]) -> bool:
        """One ``dask.array.store`` of every array (`rows` arrays) into its sink, each block handed
        to its array's sink with its rows (``sinks[i](start, stop, value)``) in the task that computes
        it (so a block is written as soon as it is computed and then freed), with the threaded or
        synchronous scheduler; False (nothing done) for any other scheduler (a ``dask.distributed``
        client, processes), whose workers cannot write to this process's file. One store target per
        array, not per block: the graph ``store`` builds and optimizes is a quarter of the size
        (0.45 -> 0.13 s for the linear merge of three 220 MB checkpoints)."""
        local: Any = importlib.import_module("dask.local")
        threaded: Any = importlib.import_module("dask.threaded")
        base: Any = importlib.import_module("dask.base")
        if not arrays:
            return True
        kw = _local(arrays)
        sched = kw.get("scheduler") or base.get_scheduler(collections=arrays)
        if sched is not threaded.get and sched is not local.get_sync:
            return False
        da: Any = importlib.import_module("dask.array")
        da.store(arrays, [_Sink(s) for s in sinks], lock=False, compute=True, scheduler=sched)
        return True

    def compute_blocks(self, blocks: list[Any]) -> list[Any]:
        """One ``dask.compute`` call (the active scheduler: threads, or a ``dask.distributed`` client).

        Where no scheduler is configured and ``distributed`` was never imported (so no client can
        be active), the collection's own scheduler is passed, the one ``dask.compute`` would pick:
        this skips its first-call import of ``distributed`` (0.2-0.4 s in a fresh process)."""
        dask: Any = importlib.import_module("dask")
        # each block is one chunk: computed as its Delayed, whose value is the chunk itself (computing
        # the array would copy a one-chunk result, ``finalize``: a second copy of every byte written)
        one = [b.to_delayed().reshape(-1)[0] for b in blocks]
        return [_little_endian(np.asarray(v)) for v in dask.compute(*one, **_local(blocks))]

    def from_stored(self, src: Any, like: Any) -> Any:
        """``fk.load(like=...)`` (`like` a Dask array): the array read, in its own memory (a later
        change to the file never changes it, SPEC 13), as a Dask array chunked as `like`.
        ``fk.open`` (`like` None): a lazy array over the file: ``dask.array.from_array`` of a `LazyTensor` (picklable:
        path and offset, no data), chunked along the first axis in blocks of about
        `CHUNK_ELEMENTS` elements (one chunk when it holds no bytes); named by file, key and the file's identity
        (device, inode, size, modification time), so opening a file twice
        gives the same graph keys (read once when computed together). A tensor of a sharded
        checkpoint (``grid``: its pieces) has one chunk per piece."""
        import importlib
        import math

        import numpy as np
        from dask.base import tokenize

        da: Any = importlib.import_module("dask.array")
        if like is not None:  # fk.load(like=a Dask model): the array read (its own memory, SPEC 13), chunked as `like`
            return da.from_array(src.array(), chunks=like.chunks, name=False, asarray=False)
        lazy = src.lazy()
        shape = lazy.shape
        chunks: Any = getattr(lazy, "grid", ())  # a sharded checkpoint's tensor: one chunk per piece
        if shape and not chunks:
            row = math.prod(shape[1:])
            # an empty tensor is one chunk, whatever its dims say (a shape [2**46, 0] holds no bytes)
            rows = max(1, CHUNK_ELEMENTS // row) if row and shape[0] else max(1, shape[0])
            chunks = (rows, *shape[1:])
        name = "fk-open-" + tokenize(lazy.path, lazy.key, lazy.begin, lazy.ident)
        meta = np.empty((0,) * len(shape), dtype=lazy.dtype)
        return da.from_array(lazy, chunks=chunks, name=name, lock=False, asarray=False, meta=meta)


#: target size of one chunk of an opened checkpoint's tensors (``fk.open``), in elements (2 MiB of
#: float32, 1 MiB of bfloat16): counted in elements because a merge works on float32 copies of
#: narrower floats, so its memory per block follows the element count (bench_merge's peak RSS)
CHUNK_ELEMENTS = 2**19
