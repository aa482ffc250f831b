"""Shared-memory detection between different arrays of one tree.

Two *different* array objects whose memory overlaps (NumPy ``a`` and ``a.T``
or ``a[1:]``, torch ``t`` and ``t.t()``) would be silently untied by
flattening or loading. `check_no_aliases` finds them.

How, and what it costs:

1. NumPy arrays (and array-api-strict's inner NumPy arrays) whose memory is
   owned by an ndarray that no other entry views are set aside without
   reading a pointer: separate allocations cannot overlap. This shortcut is
   off when host memory also holds foreign buffers (torch CPU tensors,
   ``np.frombuffer``/``as_strided`` arrays), which could wrap any of them.
2. Every other array costs one byte *extent* ``[lo, hi)``; extents are
   sorted per address space (host memory, or one GPU) and swept with NumPy,
   and only arrays whose extents overlap form a cluster. Measured: 10,000
   distinct NumPy arrays ~4 ms, 10,000 torch tensors ~12 ms, 10,000 views
   of one flat vector (``re(p)``) ~20 ms.
3. A cluster gets the exact test on normalised layouts
   (`memory_layout`: negative strides flipped, length-1 and stride-0
   (broadcast) dimensions dropped, dimensions sorted by stride, contiguous
   ones merged, so ``a`` and ``a.T`` get the same layout). First it is split
   by the residue of each array's start modulo the gcd ``g`` of all strides
   (an array only touches bytes in ``[start, start + itemsize)`` mod ``g``,
   so ``a[0::k] ... a[k-1::k]`` or the columns of one matrix fall apart at
   once); then each group takes the cheaper of two exact sweeps: pairs of
   arrays whose extents overlap, tested with ``numpy.shares_memory`` on
   stand-ins built from the pointers (no data is read), or all contiguous
   byte runs sorted at once with NumPy (O(runs log runs)). Measured on
   pathological inputs: 10,000 columns or 10,000 blocks of one matrix
   ~60-75 ms, 64 column blocks of a 4096x4096 matrix ~1.5 ms.

Interleaved views that share no element (``a[::2]``, ``a[1::2]``) are not
aliases. Immutable backends (JAX, Dask), torch ``meta`` tensors, tensors
without storage (``torch.func`` wrappers, fake tensors), non-strided torch
layouts (sparse, nested, mkldnn) and empty arrays have nothing to detect.
Host memory is one address space for NumPy, torch CPU and array-api-strict
(whose simulated devices all live in host memory), so
``torch.from_numpy(a)`` next to ``a`` is an alias; each GPU is its own space
(torch ``cuda:i`` and CuPy device ``i`` share one), so equal addresses on
different devices never clash.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from ._errors import StructureError
from ._keypath import KeyPath
from ._record import all_distinct
from .adapters import adapter_of
from .adapters._base import _HOST, Layout, normalise_layout
from .adapters._base import extent as _extent

__all__ = [
    "Layout",
    "check_constants_apart",
    "check_no_aliases",
    "layouts_overlap",
    "may_overlap",
    "memory_layout",
    "separate_allocations",
]

#: above this many contiguous runs in one cluster, fall back to pairwise tests
_RUN_LIMIT = 1 << 21
_normalise = normalise_layout
_ND = {np.ndarray}
_base_of = operator.attrgetter("base")


# -------------------------------------------------- where an array lives


def _np_owner(x: Any) -> int | None:
    """id of the ndarray owning `x`'s memory, or None when it comes from a foreign buffer."""
    b = x.base
    if b is None:
        return id(x) if x.flags.owndata else None
    while isinstance(b, np.ndarray):
        nb = b.base
        if nb is None:
            return id(b) if b.flags.owndata else None
        b = nb
    return None


def memory_layout(x: Any) -> Layout | None:
    """Where array `x` lives in memory, or None if it cannot alias (immutable, meta, empty, no storage)."""
    return adapter_of(x).memory_layout(x)


# ----------------------------------------------------------- exact tests


class _Item(NamedTuple):
    order: int
    path: KeyPath
    array: Any
    lay: Layout
    hi: int


class _Standin:
    """A pointer/shape/strides exposed as an array interface of bytes; no data is ever read."""

    def __init__(self, lay: Layout) -> None:
        self.__array_interface__ = {
            "shape": (*(n for n, _ in lay.dims), lay.itemsize),
            "strides": (*(s for _, s in lay.dims), 1),
            "typestr": "|u1",
            "data": (lay.lo, True),
            "version": 3,
        }


def layouts_overlap(a: Layout, b: Layout) -> bool:
    """True if two memory layouts share at least one byte (exact, not a bounding-box test)."""
    if a.space != b.space or a.hi <= b.lo or b.hi <= a.lo:
        return False
    return _shares(a, b)


def _shares(a: Layout, b: Layout) -> bool:
    return bool(np.shares_memory(np.asarray(_Standin(a)), np.asarray(_Standin(b))))


def _residue_groups(members: list[_Item]) -> list[list[_Item]]:
    """Split `members` into groups that cannot share a byte with each other (residues mod the stride gcd)."""
    g = 0
    for m in members:
        for _, s in m.lay.dims:
            g = math.gcd(g, s)
    if g == 0:
        return [members]
    wins = sorted(((m.lay.lo % g, m.lay.lo % g + m.lay.itemsize, m) for m in members), key=lambda w: w[0])
    groups: list[list[_Item]] = []
    end = -1
    for start, stop, m in wins:
        if groups and start < end:
            groups[-1].append(m)
            end = max(end, stop)
        else:
            groups.append([m])
            end = stop
    wrap = max(w[1] for w in wins) - g  # windows reaching past g wrap onto the first ones
    while len(groups) > 1 and wrap > 0 and groups[0][0].lay.lo % g < wrap:
        first = groups.pop(0)
        groups[-1].extend(first)
        wrap = max(wrap, max(m.lay.lo % g + m.lay.itemsize for m in first) - g)
    return [grp for grp in groups if len(grp) > 1]


def _self_disjoint(dims: tuple[tuple[int, int], ...], itemsize: int) -> bool:
    """True if no two elements touch the same byte (not an ``as_strided`` self-overlap)."""
    reach = itemsize
    for n, s in dims:
        if s < reach:
            return False
        reach += (n - 1) * s
    return True


def _runs(dims: tuple[tuple[int, int], ...], itemsize: int) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    """(number of contiguous byte runs, bytes per run, the dims that enumerate the run starts)."""
    if dims and dims[0][1] == itemsize:
        run, outer = dims[0][0] * itemsize, dims[1:]
    else:
        run, outer = itemsize, dims
    return math.prod(n for n, _ in outer), run, outer


def _sweep_runs(members: list[_Item], base: int) -> tuple[_Item, _Item] | None:
    """Exact test by sorting every contiguous byte run of every member (vectorised per layout)."""
    by_shape: dict[tuple[Any, ...], list[int]] = {}
    for k, m in enumerate(members):
        by_shape.setdefault((m.lay.dims, m.lay.itemsize), []).append(k)
    starts, ends, owners = [], [], []
    for (dims, isz), ks in by_shape.items():
        _, run, outer = _runs(dims, isz)
        offs = np.zeros(1, dtype=np.int64)
        for n, s in outer:
            offs = np.add.outer(np.arange(n, dtype=np.int64) * s, offs).ravel()
        if _self_disjoint(dims, isz):
            lens = np.full(offs.shape, run, dtype=np.int64)
        else:
            offs, lens = _union(offs, run)
        los = np.asarray([members[k].lay.lo - base for k in ks], dtype=np.int64)
        st = (los[:, None] + offs[None, :]).ravel()
        starts.append(st)
        ends.append(st + np.tile(lens, len(ks)))
        owners.append(np.repeat(np.asarray(ks, dtype=np.int64), offs.size))
    st, en, ow = np.concatenate(starts), np.concatenate(ends), np.concatenate(owners)
    order = np.argsort(st, kind="stable")
    st, en, ow = st[order], en[order], ow[order]
    reach = np.maximum.accumulate(en)
    hit = np.flatnonzero(st[1:] < reach[:-1])
    if hit.size == 0:
        return None
    i = int(hit[0]) + 1
    j = int(np.argmax(en[:i]))  # the earlier run reaching past st[i]; another owner, since own runs are disjoint
    return members[int(ow[j])], members[int(ow[i])]


def _union(offs: Any, run: int) -> tuple[Any, Any]:
    """Merge the overlapping runs of one self-overlapping array into disjoint runs."""
    st = np.sort(offs)
    en = st + run
    reach = np.maximum.accumulate(en)
    new = np.ones(st.shape, dtype=bool)
    new[1:] = st[1:] >= reach[:-1]
    idx = np.flatnonzero(new)
    return st[idx], np.maximum.reduceat(en, idx) - st[idx]


def _sweep_pairs(members: list[_Item]) -> tuple[_Item, _Item] | None:
    """Exact pairwise test of the members whose extents overlap."""
    active: list[tuple[_Item, Any]] = []
    for m in sorted(members, key=lambda m: m.lay.lo):
        active = [a for a in active if a[0].hi > m.lay.lo]
        view = np.asarray(_Standin(m.lay))
        for a, aview in active:
            if np.shares_memory(aview, view):
                return a, m
        active.append((m, view))
    return None


def _resolve(cluster: list[_Item]) -> tuple[_Item, _Item] | None:
    """An aliasing pair among arrays whose extents overlap (transitively), or None."""
    if len(cluster) == 2:
        a, b = cluster
        return (a, b) if _shares(a.lay, b.lay) else None
    for grp in _residue_groups(cluster):
        k = len(grp)
        runs = sum(_runs(m.lay.dims, m.lay.itemsize)[0] for m in grp)
        # a pair test costs ~1 us, sorting one run ~0.05 us: take the cheaper bound
        if k * (k - 1) <= runs // 10 or runs > _RUN_LIMIT:
            found = _sweep_pairs(grp)
        else:
            found = _sweep_runs(grp, min(m.lay.lo for m in grp))
        if found is not None:
            return found
    return None


# ------------------------------------------------------------- the check


def _clusters(spans: list[Any]) -> Iterator[list[Any]]:
    """Groups of two or more spans whose byte extents overlap (transitively), per address space."""
    by_space: dict[Any, list[Any]] = {}
    for sp in spans:
        by_space.setdefault(sp[0], []).append(sp)
    for group in by_space.values():
        n = len(group)
        if n < 2:
            continue
        lo = np.array([sp[1] for sp in group], dtype=np.uint64)
        order = np.argsort(lo, kind="stable")
        lo = lo[order]
        reach = np.maximum.accumulate(np.array([sp[2] for sp in group], dtype=np.uint64)[order])
        joined = lo[1:] < reach[:-1]  # span i+1 starts before every earlier span has ended
        if not joined.any():
            continue
        bounds = np.concatenate(([0], np.flatnonzero(~joined) + 1, [n]))
        for c in np.flatnonzero(np.diff(bounds) > 1):
            yield [group[j] for j in order[bounds[c] : bounds[c + 1]]]


def _resolve_spans(cluster: list[tuple[Any, ...]]) -> tuple[_Item, _Item] | None:
    """Normalised layouts for one cluster of spans, then the exact test."""
    items = []
    seen: set[int] = set()
    for space, _, hi, k, path, x, mem, ptr in cluster:
        if id(x) in seen:  # the same object twice is a tie, not an alias
            continue
        seen.add(id(x))
        if isinstance(mem, np.ndarray):
            lay = _normalise(space, ptr, mem.shape, mem.strides, mem.itemsize)
        else:
            lay = memory_layout(x)
        if lay is not None:
            items.append(_Item(k, path, x, lay, hi))
    return _resolve(items) if len(items) > 1 else None


def separate_allocations(arrays: list[Any]) -> bool:
    """True if every array is a distinct NumPy array that owns its memory (``base is None``):
    separate allocations cannot overlap, so there is nothing to find (bench_flat ``destructure`` rows: the
    check costs a few µs per array otherwise)."""
    return (
        set(map(type, arrays)) <= _ND
        and all(map(operator.is_, map(_base_of, arrays), itertools.repeat(None)))
        and all_distinct(arrays)
    )


def _disjoint_by_adapter(arrays: list[Any]) -> bool:
    """True if the arrays, all of one library (torch: ``nn.Parameter`` and ``Tensor`` alike), are
    distinct arrays whose adapter proves in C-level passes that their memory ranges do not meet
    (``out_fast`` with nothing to write: torch's ``data_ptr``/``nbytes`` ranges of plain contiguous
    tensors, bench_walk's module ``fk.destructure(m)`` row); False: not known, every array is looked at."""
    if len(arrays) < 2 or not all_distinct(arrays):
        return False
    try:
        ads = {id(a): a for a in map(adapter_of, dict(zip(map(type, arrays), arrays)).values())}
    except TypeError:  # not arrays: nothing the adapter can tell
        return False
    return len(ads) == 1 and bool(next(iter(ads.values())).out_fast([], arrays))


def may_overlap(dsts: list[Any], srcs: list[Any]) -> list[bool]:
    """For each of `srcs`: could its memory overlap some array of `dsts`? False only where that is
    certain without reading a pointer: every `dst` is a NumPy array whose memory an ndarray owns,
    and the source is a NumPy array owned by another ndarray (bench_scale ``fk.load_into`` row)."""
    owners: set[int] = set()
    for d in dsts:
        o = _np_owner(d) if type(d) is np.ndarray else None
        if o is None:
            return [s is not None for s in srcs]  # foreign or non-NumPy memory: look at every source
        owners.add(o)
    out = []
    for s in srcs:
        o = _np_owner(s) if type(s) is np.ndarray else None
        out.append(o is None or o in owners)
    return out


def check_no_aliases(entries: Iterable[tuple[KeyPath, Any]], what: str) -> None:
    """Raise StructureError if two different arrays in `entries` share memory.

    `entries` are ``(path, array)`` pairs in walk order; the same object
    listed twice is a tie, not an alias, and is skipped. `what` names the
    operation for the message (``"fk.destructure"``). Non-arrays and arrays
    that cannot alias are ignored.

    Cost: NumPy arrays that own their memory and have no view of theirs in
    `entries` are set aside without reading a pointer (unless the host memory
    also holds foreign buffers: torch CPU tensors, ``np.frombuffer`` arrays);
    every other array costs one extent, then one sort and one sweep.
    """
    arrays = getattr(entries, "arrays", None)
    if arrays is not None:
        xs = arrays()
        if separate_allocations(xs) or _disjoint_by_adapter(xs):
            return
    spans: list[tuple[tuple[str, int], int, int, int, KeyPath, Any, Any, int]] = []
    host_np: list[tuple[int, KeyPath, Any, Any, int | None]] = []  # (order, path, array, ndarray, owner)
    foreign_host = False
    for k, (path, x) in enumerate(entries):
        if isinstance(x, np.ndarray):
            if x.size and x.itemsize:
                owner = _np_owner(x)
                foreign_host = foreign_host or owner is None
                host_np.append((k, path, x, x, owner))
            continue
        try:
            ad = adapter_of(x)
        except TypeError:  # not an array: nothing to alias
            continue
        if not ad.mutable:
            continue
        ext = ad.memory_extent(x)
        if ext is not None:
            foreign_host = foreign_host or ext[0] == _HOST
            spans.append((*ext, k, path, x, x, 0))
    if host_np:
        if not foreign_host:
            # memory owned by distinct ndarrays cannot overlap: only views of one owner need a look
            count: dict[int | None, int] = {}
            for e in host_np:
                count[e[4]] = count.get(e[4], 0) + 1
            host_np = [e for e in host_np if count[e[4]] > 1]
        for k, path, x, arr, _ in host_np:
            ptr = arr.__array_interface__["data"][0]
            if arr.flags.c_contiguous:
                spans.append((_HOST, ptr, ptr + arr.nbytes, k, path, x, arr, ptr))
            else:
                spans.append((_HOST, *_extent(ptr, arr.shape, arr.strides, arr.itemsize), k, path, x, arr, ptr))
    if len(spans) < 2:
        return
    found = None
    for cluster in _clusters(spans):
        found = _resolve_spans(cluster)
        if found is not None:
            break
    if found is None:
        return
    first, second = sorted(found, key=lambda it: it.order)
    relation = _relation(first.array, second.array, first.lay, second.lay)
    msg = (
        f"at {first.path.display} and {second.path.display}: two different arrays share memory "
        f"({type(first.array).__name__} of shape {tuple(first.array.shape)} and "
        f"{type(second.array).__name__} of shape {tuple(second.array.shape)}; {relation}). "
        f"{what} would silently untie them: writing one changes the other, but each would get its own "
        "slot. Expected every array to own its memory, or a tie written as the same object in both "
        f"places. Fix: keep one array and express the other through it (fk.Transpose({first.path.display}) "
        "for a transpose; the same object for a plain tie), or pass an explicit copy to untie them."
    )
    raise StructureError(msg)


def _strides(x: Any) -> tuple[int, ...] | None:
    if isinstance(x, np.ndarray):
        return tuple(x.strides)
    return adapter_of(x).byte_strides(x)


def _relation(x: Any, y: Any, a: Layout, b: Layout) -> str:
    if a != b:
        return "their memory overlaps: slices or views of one buffer"
    sx, sy, tx, ty = tuple(x.shape), tuple(y.shape), _strides(x), _strides(y)
    if (
        len(sx) >= 2
        and tx is not None
        and ty is not None
        and sy == (*sx[:-2], sx[-1], sx[-2])
        and ty == (*tx[:-2], tx[-1], tx[-2])
        and (sx, tx) != (sy, ty)
    ):
        return "one is a transpose view of the other"
    return "they are two views of the same elements, e.g. `a[:]`, `a.reshape(...)`, `t.detach()`"


def check_constants_apart(
    params: Sequence[Any], constants: Sequence[Any], where: Callable[[int, int], tuple[int, KeyPath]], what: str
) -> None:
    """Raise `check_no_aliases`'s StructureError if an array of `constants` shares memory with one of
    `params` (``fk.destructure``: ``re(p)`` gives the parameter its slice of ``p`` and keeps the
    constant, so a buffer that is a view of a weight would be silently untied). Two constants that
    share memory are kept as they are: not an error. ``where(side, k)`` is the walk position and path
    of the k-th parameter (side 0) or constant (side 1), asked only for a message. C-level passes prove the common case
    (separate NumPy allocations; one library whose adapter shows the ranges do not meet); otherwise
    one extent per mutable array, one sweep, and the pairs in touching extents checked exactly."""
    arrays = [*params, *constants]
    if separate_allocations(arrays) or _disjoint_by_adapter(arrays):  # (the common case: C-level passes)
        return
    spans: list[tuple[Any, ...]] = []
    for side, entries in ((0, params), (1, constants)):
        for k, x in enumerate(entries):
            if not adapter_of(x).mutable:
                continue
            ext = adapter_of(x).memory_extent(x)
            if ext is not None:
                spans.append((*ext, side, k, x))
    if not any(sp[3] for sp in spans):
        return
    for cluster in _clusters(spans):
        ps = [sp for sp in cluster if sp[3] == 0]
        for c in (sp for sp in cluster if sp[3] == 1):
            for p in ps:
                if p[5] is not c[5]:  # (the same object in both: a tie, never an alias)
                    (i, pi), (j, pj) = where(0, p[4]), where(1, c[4])
                    pair = [(pi, p[5]), (pj, c[5])] if i < j else [(pj, c[5]), (pi, p[5])]  # in walk order
                    check_no_aliases(pair, what)
