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
#: block histograms summed two at a time (Dask's default, 4, held more of them at once: bfloat16
#: TIES peaked about 4 MiB higher, session 18)
HIST_SPLIT = 2
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


def _digits_of(level: int, shift: int, itemsize: int, prefix: Any) -> tuple[int, int, bool]:
    """For a level below the first: the raw bits above the level's digit that its elements have
    (`prefix`'s preimage: the key is a bijection of the bits), their width, and whether the prefix
    is of non-negative floats (the key's sign bit set: raw digits; else their complements)."""
    width = 8 * itemsize - shift - _RADIX  # bits of `prefix`
    p = int(prefix)
    positive = bool(p >> (width - 1))
    raw = p & ((1 << (width - 1)) - 1) if positive else ~p & ((1 << width) - 1)
    return raw, width, positive


#: the first level's digits (the top 16 bits) read through a strided ``uint16`` view of the floats
#: (little-endian hosts) instead of shifted into a new array (False: the shift; the comparison)
TOP_BITS_VIEW = True


def _top_digits(flat: Any, shift: int) -> Any:
    """The first level's digits of the 1-D float array `flat`: its top 16 bits (``shift`` is the
    bit width less 16), a strided ``uint16`` view of it (`TOP_BITS_VIEW`, little-endian) or shifted."""
    size = flat.dtype.itemsize
    if TOP_BITS_VIEW and sys.byteorder == "little":
        return flat.view(np.uint16)[size // 2 - 1 :: size // 2]  # a view: no shift, no new array
    u = np.dtype(f"u{size}")
    return flat.view(u) >> u.type(shift)


def _count_piece(out: Any, level: int, shift: int, v: Any, raw: int) -> None:
    """Add to `out` (raw digit order) the histogram of the raw bits ``shift .. shift + 16`` of the
    float piece `v` (at a level below the first: of its elements whose higher raw bits are `raw`).
    ``np.bincount`` without ``minlength``: its counts reach only the largest digit present (a
    tensor's magnitudes span a few exponents), so a piece adds and zeroes fewer bins."""
    flat = np.ascontiguousarray(v).reshape(-1)
    size = flat.dtype.itemsize
    u = np.dtype(f"u{size}")
    bits = flat.view(u)
    if not level:
        h = np.bincount(_top_digits(flat, shift))
    else:
        high, low, mask = u.type(shift + _RADIX), u.type(shift), u.type((1 << _RADIX) - 1)
        digits = bits[(bits >> high) == u.type(raw)] >> low
        digits &= mask
        h = np.bincount(digits)
    out[: h.shape[0]] += h


def _histograms(level: int, shift: int, count: Any, fn: Any, n: int, *blocks: Any) -> Any:
    """One Dask block of `Adapter.kth_largests`: for each output ``j`` of the element-wise `fn`
    (``fn(outputs, *pieces)``: a list of float arrays, one per output index) on the `n` array
    blocks (1-D, one grid; the rest: one 0-d prefix per output), the histogram of the key bits
    ``shift .. shift + 16`` of its values among those whose higher key bits are the output's
    prefix (every value at the first level), in counts of dtype `count`: shape
    ``(outputs * 65536,)``, output by output.

    `fn` runs on pieces of `_HIST_PIECE` elements (so no block of its values is ever made, and an
    input block is read once for every output), and the counts are of the float's raw bits,
    without making the keys (`_key`: four passes): at the first level the histogram of the raw
    top 16 bits is permuted (`_KEY_TO_RAW`); below it the prefix fixes the sign, so the elements
    are those whose raw high bits are the prefix's preimage and their digits are the raw ones
    (non-negative floats) or their complements (negative: the histogram reversed). The same
    counts, bin for bin, as a histogram of the keys of `fn`'s whole values."""
    arrays, prefixes = blocks[:n], blocks[n:]
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    size = int(flat[0].shape[0])
    out = np.zeros((len(prefixes), 1 << _RADIX), dtype=count)
    sel = tuple(range(len(prefixes)))
    digits: list[tuple[int, int, bool]] = []
    for i in range(0, size, _HIST_PIECE):  # cache-sized pieces of fn's values and their digits
        vals = fn(sel, *(a[i : i + _HIST_PIECE] for a in flat))
        if not digits:
            digits = [
                _digits_of(level, shift, v.dtype.itemsize, p) if level else (0, 0, True)
                for v, p in zip(vals, prefixes, strict=True)
            ]
        for j, v in enumerate(vals):
            _count_piece(out[j], level, shift, v, digits[j][0])
    if not level:
        out = out[:, _KEY_TO_RAW]
    else:
        for j, (_, _, positive) in enumerate(digits):
            if not positive:
                out[j] = out[j, ::-1].copy()
    return out.reshape(-1)


def _one(sel: Any, a: Any) -> Any:
    """The element-wise function whose one output is its input (`Adapter.kth_largest`)."""
    return [a]


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
        """The `k`-th largest of `a`: `kth_largests` of the one output ``a`` itself."""
        got = self.kth_largests(_one, (a,), (k,), a.dtype)
        return None if got is None else got[0]

    def kth_largests(self, fn: Any, arrays: Sequence[Any], ks: Sequence[int], dtype: Any) -> Any:
        """For each ``j``, the ``ks[j]``-th largest of ``fn(outputs, *arrays)[j]`` (`fn` element-wise,
        its outputs floats of `dtype` of ``arrays[0]``'s shape): a radix selection on the float's
        bits (float32, float64; None for other dtypes). Per 16 bits of the key, from the top, one
        task per block computes `fn` on pieces of the blocks and counts one histogram of 65,536
        bins per output (`_histograms`: no block of `fn`'s values is made, each input block is read
        once for every output), summed over the blocks, which fixes those 16 bits of each output's
        k-th largest key (2 levels for float32, 4 for float64). Every level is a small reduction
        that reads the blocks once and holds only histograms (the two-pass save computes the levels
        one after the other), no candidates or sort; the same values as a selection
        (``np.partition``) on each whole output."""
        dt = np.dtype(dtype)
        if dt.kind != "f" or dt.itemsize not in (4, 8) or not all(_is_dask(x) for x in arrays):
            return None
        da: Any = importlib.import_module("dask.array")
        x0 = arrays[0]
        xs = [x0, *(x if x.chunks == x0.chunks else x.rechunk(x0.chunks) for x in arrays[1:])]
        if x0.ndim > 1:  # rows whole, so the reshape is free
            xs = [x.rechunk({i: -1 for i in range(1, x.ndim)}) for x in xs]
        flat = [x.reshape(-1) if x.ndim != 1 else x for x in xs]
        nb = flat[0].numblocks[0]
        nbits = 8 * dt.itemsize
        m = len(ks)
        prefixes: list[Any] = [0] * m
        aboves: list[Any] = [0] * m
        # 0-d metas of zeros: Dask tokenizes `meta`, a 0-d one by its value (np.empty's garbage
        # gave the same selection a different name in every call)
        scalar = np.zeros((), dtype=np.uint64)
        # counts of at most the tensor's size: int32 where that fits (the histograms the reduction
        # holds are half the size: bench_merge's TIES rows)
        count = np.dtype(np.int32 if flat[0].shape[0] < INT32_COUNTS else np.int64)
        bins = 1 << _RADIX
        for level in range(nbits // _RADIX):
            shift = nbits - _RADIX * (level + 1)
            body = functools.partial(_histograms, level, shift, count, fn, len(flat))
            hists = flat[0].map_blocks(
                body, *flat[1:], *prefixes, chunks=((m * bins,) * nb,), dtype=count, meta=np.empty((0,), count)
            )
            total = hists.reshape(nb, m, bins).sum(axis=0, dtype=count, split_every=HIST_SPLIT)
            steps = []
            for j, k in enumerate(ks):
                step = functools.partial(_pick, k)
                steps.append(
                    tuple(
                        da.map_blocks(
                            functools.partial(step, i),
                            total[j],
                            prefixes[j],
                            aboves[j],
                            drop_axis=0,
                            dtype=np.uint64,
                            meta=scalar,
                        )
                        for i in (0, 1)
                    )
                )
            prefixes = [p for p, _ in steps]
            aboves = [a for _, a in steps]
        return [
            da.map_blocks(functools.partial(_from_key, dt.str), p, dtype=dt, meta=np.zeros((), dt)) for p in prefixes
        ]

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
