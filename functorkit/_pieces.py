"""Reading a checkpoint of pieces (`fk.save` of a sharded model, `functorkit._sharded_ckpt`): the
index's ``"functorkit.pieces"`` metadata checked, and each key's pieces made one tensor.

``{"functorkit.pieces": {key: {"shape": [global shape], "pieces": {stored key: [offset per
dimension]}}}}`` in the metadata of ``model.safetensors.index.json``. `assemble` checks every rule
before anything is read (SPEC section 13, as a header): every piece stored, one dtype and number
of dimensions, offsets inside the global shape, no empty piece, the pieces one grid of blocks that
covers the tensor exactly once (no overlap, no gap); a problem is a `StructureError` naming the
index, the key and the piece's file. The pieces of a key are replaced by one `Assembled` tensor
under it, which `Checkpoint` hands to the adapters like any stored tensor (`raw`, `array`,
`lazy`), and whose `region` reads only the pieces a block overlaps (``fk.load(like=)`` of a
DTensor model: each rank its own block).
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from ._errors import StructureError
from ._safetensors_header import TensorInfo, bad_file, short, stand_in

__all__ = ["PIECES", "Assembled", "assemble"]

#: the index metadata entry that says which stored tensors are pieces of which key
PIECES = "functorkit.pieces"


class Assembled:
    """A tensor stored as pieces (`PIECES`), with the interface of
    `functorkit._safetensors_io.Stored`: read whole (`raw`, `array`), a region of it (`region`:
    only the pieces it overlaps are read), or lazily (`lazy`: one chunk per piece)."""

    __slots__ = ("bounds", "cells", "file", "info")

    def __init__(self, info: TensorInfo, bounds: list[list[int]], cells: dict[tuple[int, ...], Any]) -> None:
        self.info, self.bounds, self.cells = info, bounds, cells
        self.file = next(iter(cells.values())).file

    name = property(lambda self: self.info.name)
    shape = property(lambda self: self.info.shape)

    def region(self, offset: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray[Any, Any]:
        """The bytes (stand-in dtype) of the block at `offset` of `shape`, from the pieces it overlaps."""
        out = np.empty(shape, dtype=stand_in(self.info.name))
        if out.size == 0:
            return out
        ranges = [
            range(bisect.bisect_right(bd, o) - 1, bisect.bisect_left(bd, o + n))
            for bd, o, n in zip(self.bounds, offset, shape, strict=True)
        ]
        for cell in _product(ranges):
            piece = self.cells[cell]
            lo = [self.bounds[d][c] for d, c in enumerate(cell)]
            raw = piece.raw()
            src, dst = [], []
            for d, c in enumerate(cell):
                a, b = max(lo[d], offset[d]), min(self.bounds[d][c + 1], offset[d] + shape[d])
                src.append(slice(a - lo[d], b - lo[d]))
                dst.append(slice(a - offset[d], b - offset[d]))
            out[tuple(dst)] = raw[tuple(src)]
        return out

    def raw(self) -> np.ndarray[Any, Any]:
        """The whole tensor's bytes (stand-in dtype), in memory it owns."""
        return self.region((0,) * len(self.info.shape), self.info.shape)

    def array(self) -> np.ndarray[Any, Any]:
        return self.raw().view(self.lazy().dtype)

    def lazy(self) -> _LazyPieces:
        return _LazyPieces(self)


def _product(ranges: list[range]) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for r in ranges:
        out = [(*t, i) for t in out for i in r]
    return out


class _LazyPieces:
    """`LazyTensor`'s interface over the pieces (``dask.array.from_array``): ``grid`` is the chunks,
    one per piece, each read from its own file (checked to be the file opened) when computed."""

    def __init__(self, a: Assembled) -> None:
        info = a.info
        self.path, self.key, self.begin, self.shape, self.name = info.path, info.key, 0, info.shape, info.name
        self.ident = tuple(p.info.ident for p in a.cells.values())
        self._pieces = {c: p.lazy() for c, p in a.cells.items()}  # `LazyTensor`s
        self.dtype = next(iter(self._pieces.values())).dtype
        self.ndim = len(self.shape)
        self.grid = tuple(tuple(b[i + 1] - b[i] for i in range(len(b) - 1)) for b in a.bounds)
        self._bounds = a.bounds

    def __getitem__(self, index: Any) -> np.ndarray[Any, Any]:
        asked = index if isinstance(index, tuple) else (index,)
        index = asked + (slice(None),) * (self.ndim - len(asked))
        lo, hi = [], []
        for d, s in enumerate(index):
            if d >= self.ndim or not (isinstance(s, slice) and s.step in (None, 1)):
                whole = self[(slice(None),) * self.ndim]
                picked: np.ndarray[Any, Any] = whole[asked]  # anything but a box: read all, then index
                return picked
            a, b, _ = s.indices(self.shape[d])
            lo.append(a)
            hi.append(max(a, b))
        out = np.empty([b - a for a, b in zip(lo, hi, strict=True)], dtype=self.dtype)
        if out.size == 0:
            return out
        ranges = [
            range(bisect.bisect_right(bd, a) - 1, bisect.bisect_left(bd, b)) for bd, a, b in zip(self._bounds, lo, hi)
        ]
        for cell in _product(ranges):
            start = [self._bounds[d][c] for d, c in enumerate(cell)]
            src, dst = [], []
            for d, c in enumerate(cell):
                a, b = max(start[d], lo[d]), min(self._bounds[d][c + 1], hi[d])
                src.append(slice(a - start[d], b - start[d]))
                dst.append(slice(a - lo[d], b - lo[d]))
            out[tuple(dst)] = self._pieces[cell][tuple(src)]
        return out


def _bad(index: str, key: str, what: str) -> StructureError:
    return bad_file(index, f"the pieces of {key!r} ({PIECES} in its metadata): {what}")


def assemble(tensors: dict[str, Any], index_meta: dict[str, Any], index: str) -> dict[str, Any]:
    """`tensors` with the pieces the index's `PIECES` metadata names replaced by one `Assembled`
    tensor per key (the index's own order kept); every rule checked (module docstring)."""
    spec = index_meta.get(PIECES)
    if spec is None:
        return tensors
    if not isinstance(spec, dict):
        raise bad_file(index, f"the metadata {PIECES!r} is not an object of key -> pieces ({short(spec)})")
    out = dict(tensors)
    made: dict[str, Any] = {}
    for key, e in spec.items():
        if key in tensors:
            raise _bad(index, key, "the key is also stored whole")
        if not (isinstance(e, dict) and isinstance(e.get("shape"), list) and isinstance(e.get("pieces"), dict)):
            raise _bad(index, key, f"expected an object with `shape` and `pieces`, found {short(e)}")
        shape = e["shape"]
        if not all(type(d) is int and d >= 0 for d in shape) or not shape:
            raise _bad(index, key, f"the shape {short(shape)} is not a non-empty list of non-negative ints")
        made[key] = _assemble_one(index, key, tuple(shape), e["pieces"], out)
    out.update(made)
    return out


def _assemble_one(
    index: str, key: str, shape: tuple[int, ...], spec: dict[str, Any], tensors: dict[str, Any]
) -> Assembled:
    if not spec:
        raise _bad(index, key, "no pieces are listed")
    names: set[str] = set()
    pieces: list[tuple[Any, tuple[int, ...]]] = []
    for pk, off in spec.items():
        s = tensors.pop(pk, None)
        if s is None:
            raise _bad(index, key, f"the piece {short(pk)} is not stored (a shard file missing or cut?)")
        where = f"the piece {pk!r} in {s.info.path}"
        if not (isinstance(off, list) and len(off) == len(shape) and all(type(o) is int and o >= 0 for o in off)):
            raise _bad(index, key, f"{where} has the offset {short(off)}; expected {len(shape)} non-negative ints")
        ps = s.info.shape
        if len(ps) != len(shape):
            raise _bad(index, key, f"{where} has {len(ps)} dimensions, the tensor {len(shape)}")
        if any(o + n > d for o, n, d in zip(off, ps, shape, strict=True)):
            raise _bad(index, key, f"{where} (shape {ps} at offset {tuple(off)}) reaches outside the shape {shape}")
        if 0 in ps:
            raise _bad(index, key, f"{where} is empty (fk.save writes no empty pieces)")
        names.add(s.info.name)
        if len(names) > 1:
            raise _bad(index, key, f"{where} is {s.info.name}, another piece {sorted(names - {s.info.name})[0]}")
        pieces.append((s, tuple(off)))
    bounds = [
        sorted({0, shape[d]} | {o[d] for _, o in pieces} | {o[d] + s.info.shape[d] for s, o in pieces})
        for d in range(len(shape))
    ]
    cells: dict[tuple[int, ...], Any] = {}
    for s, o in pieces:
        cell = tuple(bisect.bisect_left(bounds[d], o[d]) for d in range(len(shape)))
        where = f"the piece {s.info.key!r} in {s.info.path}"
        if cell in cells or any(bounds[d][c + 1] != o[d] + s.info.shape[d] for d, c in enumerate(cell)):
            raise _bad(index, key, f"{where} overlaps another piece")
        cells[cell] = s
    total = math.prod(len(b) - 1 for b in bounds)
    if total != len(cells):
        gap = next(c for c in _first_cells(bounds, len(cells) + 1) if c not in cells)
        at = tuple(bounds[d][c] for d, c in enumerate(gap))
        raise _bad(index, key, f"no piece covers the block at offset {at} (a gap)")
    name = names.pop()
    first = pieces[0][0].info
    nbytes = math.prod(shape) * stand_in(name).itemsize
    info = TensorInfo(index, key, name, shape, 0, nbytes, first.ident)
    return Assembled(info, bounds, cells)


def _first_cells(bounds: list[list[int]], n: int) -> list[tuple[int, ...]]:
    """The first `n` cells of the grid in C order (no more are formed)."""
    out: list[tuple[int, ...]] = []
    dims = [len(b) - 1 for b in bounds]
    cur = [0] * len(dims)
    while len(out) < n:
        out.append(tuple(cur))
        d = len(dims) - 1
        while d >= 0:
            cur[d] += 1
            if cur[d] < dims[d]:
                break
            cur[d] = 0
            d -= 1
        if d < 0:
            break
    return out
