"""Sharded checkpoints: `fk.save` of a model of sharded arrays (torch ``DTensor``) written rank by
rank, and reading such a checkpoint back whole (docs/checkpoints.md, "Sharded checkpoints").

The layout is Hugging Face's sharded one: ``model.safetensors.index.json`` and one safetensors
file per rank that holds something (``model-0000{r+1}-of-0000{world}.safetensors``). Each rank
writes only its local pieces; a tensor no rank holds whole is stored as pieces under the keys
``<key>@<offset>`` (``fc1.weight@4,0``: the piece's global offset per dimension), and the index's
metadata says how they fit together::

    "functorkit.pieces": {"fc1.weight": {"shape": [8, 6],
                                         "pieces": {"fc1.weight@0,0": [0, 0], "fc1.weight@4,0": [4, 0]}}}

A tensor some rank holds whole (``Replicate``, a plain tensor, a shard that is all of it) is
stored once under its own key, by the first rank that holds it. Every file, and the index with
its ``weight_map``, is valid for any safetensors reader; only the meaning of the ``@`` pieces is
functorkit's.

Saving: rank 0 checks the target (what `functorkit._ckpt_files` allows to replace) and picks
fresh file names (one broadcast), every rank writes its file under a temporary name, the ranks
agree that every file is written (one exchange of small lists: names, keys and offsets, never
tensor data), then rank 0 writes the index and replaces the old one with one ``os.replace``
(the commit) and tells the others (one broadcast). On any failure every rank raises and nothing
new is left.

Reading (`assemble`): the pieces named in the index are checked (every piece stored, one
dtype, offsets inside the global shape, the pieces one grid of cells that covers the tensor once:
no overlap, no gap) and replaced by one `Assembled` tensor under the key; a problem is a
`StructureError` naming the index and the key.
"""

from __future__ import annotations

import bisect
import builtins
import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ._ckpt_files import _discard, _old_checkpoint, _parent, shard_names, temp_name
from ._errors import StructureError
from ._safetensors_header import TensorInfo, bad_file, short, stand_in
from ._safetensors_io import INDEX, LazyTensor, Stored, real_dtype

__all__ = ["PIECES", "Assembled", "assemble", "save_sharded", "sharded_pieces"]

#: the index metadata entry that says which stored tensors are pieces of which key
PIECES = "functorkit.pieces"


# ----------------------------------------------------------------------------- saving


def sharded_pieces(items: list[Any]) -> tuple[Any, list[Any]] | None:
    """``(comm, pieces)`` when some array of `items` (`functorkit._checkpoint._Item`) is sharded:
    its adapter's ``save_piece(x, key)`` gives ``(global shape, offset or None for a whole tensor,
    local array or None when this rank writes none of it, comm)``; a plain array's piece is None
    (written whole by rank 0). None when no array is sharded (an ordinary checkpoint)."""
    hooks: dict[type, Any] = {}
    pieces: list[Any] = []
    comm = None
    for it in items:
        t = type(it.x)
        if t not in hooks:
            hooks[t] = getattr(it.ad, "save_piece", None)
        hook = hooks[t]
        piece = None if hook is None else hook(it.x, it.key)
        pieces.append(piece)
        if piece is not None and comm is None:
            comm = piece[3]
    return None if comm is None else (comm, pieces)


def save_sharded(
    target: str, items: list[Any], meta: dict[str, str], comm: Any, pieces: list[Any], *, shard_size: int | None
) -> None:
    """Write this rank's part of `items` (`functorkit._checkpoint._Item`, their `sharded_pieces`)
    into the sharded checkpoint at `target`, together with every other rank of `comm`."""
    from ._checkpoint import _Item, _write_file

    if shard_size is not None:
        msg = (
            "fk.save: `shard_size` is for whole models; a sharded (DTensor) model is saved as one file "
            "per rank, each holding that rank's shards. Fix: leave `shard_size` out."
        )
        raise ValueError(msg)

    taken = {it.key for it in items}
    problem: Exception | None = None  # raised where every rank learns of it (it may be this rank's alone)
    plan: list[tuple[str, str, Any, tuple[int, ...] | None, tuple[int, ...]]] = []
    for it, piece in zip(items, pieces, strict=True):
        if piece is None:  # a plain array among sharded ones: the same on every rank, written by rank 0
            plan.append((it.key, it.key, it.x if comm.rank == 0 else None, None, it.shape))
            continue
        shape, offset, local, _ = piece
        stored = it.key if offset is None else _piece_key(it.key, offset)
        if offset is not None and stored in taken and problem is None:
            msg = (
                f"fk.save: the piece of {it.key!r} at offset {offset} would be stored as {stored!r}, which is "
                "another key of the model. Fix: rename that key."
            )
            problem = StructureError(msg)
        plan.append((it.key, stored, local, offset, shape))

    def write(path: str, parts: list[tuple[str, Any]]) -> int:
        its = [_Item(k, x) for k, x in parts]
        _write_file(path, its, meta)
        return sum(i.nbytes for i in its)

    _save(target, plan, comm, write, meta, problem)


def _piece_key(key: str, offset: tuple[int, ...]) -> str:
    return f"{key}@{','.join(map(str, offset))}"


def _plan(target: str, world: int) -> tuple[str, list[str], set[str], bool]:
    """Rank 0: ``(folder to write in, the file names, the old shards, whether the folder is new)``."""
    parent = _parent(target)
    if not os.path.lexists(target):
        tmp = temp_name(parent, os.path.basename(target))
        os.mkdir(tmp)
        return tmp, shard_names(world, set()), set(), True
    entries, old = _old_checkpoint(target)
    return target, shard_names(world, entries), old, False


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def _save(
    target: str,
    items: list[tuple[str, str, Any, tuple[int, ...] | None, tuple[int, ...]]],
    comm: Any,
    write_file: Callable[[str, list[tuple[str, Any]]], int],
    meta: dict[str, str],
    problem: Exception | None,
) -> None:
    """The protocol of the module's docstring: `items` are ``(key, stored key, local array or None,
    offset or None for a whole tensor, global shape)``; ``write_file(path, [(stored key, array)])``
    writes one safetensors file and returns its data bytes; `problem` (found on this rank only,
    perhaps) is raised on every rank."""
    rank, world = comm.rank, comm.world
    plan: Any = None
    if rank == 0:
        try:
            plan = _plan(target, world)
        except Exception as e:  # noqa: BLE001 -- sent to every rank, raised there
            plan = _error_text(e)
    plan = comm.broadcast(plan)
    if isinstance(plan, str):
        msg = f"fk.save: rank 0 could not prepare {target}: {plan}"
        raise FileExistsError(msg) if plan.startswith("FileExistsError") else OSError(msg)
    folder, names, old, fresh = plan
    mine = [(k, x) for _, k, x, _, _ in items if x is not None]
    written: str | None = None
    nbytes = 0
    report: Any
    try:
        if problem is not None:
            raise problem
        if mine:
            final = os.path.join(folder, names[rank])
            written = final if fresh else temp_name(folder, names[rank])
            nbytes = write_file(written, mine)
            if not fresh:
                os.rename(written, final)
                written = final
        pieces = [(k, sk, o, s) for k, sk, x, o, s in items if x is not None and o is not None]
        report = (names[rank] if mine else None, [k for k, _ in mine], pieces, nbytes, None)
    except Exception as e:  # noqa: BLE001 -- every rank learns of it below
        if written is not None:
            _discard(written)
        report = (None, [], [], 0, _error_text(e))
        mine_error: BaseException | None = e
    else:
        mine_error = None
    reports = comm.gather(report)
    failed = [(r, rep[4]) for r, rep in enumerate(reports) if rep[4] is not None]
    outcome: str | None = None
    if rank == 0:
        outcome = _commit(target, folder, fresh, old, reports, failed, meta)
    outcome = comm.broadcast(outcome)
    if mine_error is not None:
        raise mine_error
    if failed:
        r, why = failed[0]
        msg = f"fk.save: rank {r} could not write its shard of {target} ({why}); nothing was saved."
        raise RuntimeError(msg)
    if outcome is not None:
        msg = f"fk.save: rank 0 could not commit the checkpoint {target} ({outcome})."
        raise OSError(msg)


def _commit(
    target: str,
    folder: str,
    fresh: bool,
    old: set[str],
    reports: list[Any],
    failed: list[tuple[int, str]],
    meta: dict[str, str],
) -> str | None:
    """Rank 0: the index (or, after a failure, the cleanup); an error's text, or None."""
    new = [os.path.join(folder, rep[0]) for rep in reports if rep[0] is not None]
    if failed:
        for p in new:
            _discard(p)
        if fresh:
            _discard(folder)
        return None
    try:
        weight_map = {k: rep[0] for rep in reports if rep[0] is not None for k in rep[1]}
        pieces: dict[str, dict[str, Any]] = {}
        for rep in reports:
            for k, sk, o, s in rep[2]:
                entry = pieces.setdefault(k, {"shape": list(s), "pieces": {}})
                entry["pieces"][sk] = list(o)
        index = {
            "metadata": {**meta, "total_size": sum(rep[3] for rep in reports), PIECES: pieces},
            "weight_map": weight_map,
        }
        tmp = temp_name(folder, INDEX)
        new.append(tmp)
        with builtins.open(tmp, "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
        os.replace(tmp, os.path.join(folder, INDEX))  # the commit
        new[-1] = os.path.join(folder, INDEX)
        if fresh:
            os.rename(folder, target)
    except Exception as e:  # noqa: BLE001 -- sent to every rank, raised there
        for p in new:
            _discard(p)
        if fresh:
            _discard(folder)
        return _error_text(e)
    for name in sorted(old):
        try:
            os.remove(os.path.join(target, name))
        except FileNotFoundError:
            pass
        except OSError as e:
            return f"the new checkpoint is complete, but the old shard {name} could not be removed ({e})"
    return None


# ----------------------------------------------------------------------------- reading


class Assembled(Stored):
    """A tensor stored as pieces (`PIECES`): read whole (`raw`, `array`), a region of it
    (`region`: only the pieces it overlaps are read), or lazily (`lazy`: one chunk per piece)."""

    __slots__ = ("bounds", "cells")

    def __init__(self, info: TensorInfo, bounds: list[list[int]], cells: dict[tuple[int, ...], Stored]) -> None:
        super().__init__(next(iter(cells.values())).file, info)
        self.bounds, self.cells = bounds, cells

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
        return self.region((0,) * len(self.info.shape), self.info.shape)

    def lazy(self) -> LazyTensor:
        return _LazyPieces(self)  # type: ignore[return-value]


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
        self.dtype = real_dtype(info.name, f"the tensor {info.key!r} of {info.path}")
        self.ndim = len(self.shape)
        self.grid = tuple(tuple(b[i + 1] - b[i] for i in range(len(b) - 1)) for b in a.bounds)
        self._bounds = a.bounds
        self._pieces = {c: LazyTensor(p.info) for c, p in a.cells.items()}

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


def assemble(tensors: dict[str, Stored], index_meta: dict[str, Any], index: str) -> dict[str, Stored]:
    """`tensors` with the pieces the index's `PIECES` metadata names replaced by one `Assembled`
    tensor per key (the index's own order kept); every rule checked (module docstring)."""
    spec = index_meta.get(PIECES)
    if spec is None:
        return tensors
    if not isinstance(spec, dict):
        raise bad_file(index, f"the metadata {PIECES!r} is not an object of key -> pieces ({short(spec)})")
    out = dict(tensors)
    made: dict[str, Stored] = {}
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
    index: str, key: str, shape: tuple[int, ...], spec: dict[str, Any], tensors: dict[str, Stored]
) -> Assembled:
    if not spec:
        raise _bad(index, key, "no pieces are listed")
    names: set[str] = set()
    pieces: list[tuple[Stored, tuple[int, ...]]] = []
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
    cells: dict[tuple[int, ...], Stored] = {}
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
