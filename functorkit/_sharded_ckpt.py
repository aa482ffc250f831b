"""Sharded checkpoints: `fk.save` of a model of sharded arrays (torch ``DTensor``) written rank by
rank (docs/checkpoints.md, "Models sharded over ranks"); reading them is `functorkit._pieces`.

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
fresh file names (one broadcast; a new directory is made under a temporary name and renamed
into place at the commit), every rank writes its file under a temporary name, the ranks
agree that every file is written (one exchange of small lists: names, keys and offsets, never
tensor data), then rank 0 writes the index and replaces the old one with one ``os.replace``
(the commit) and tells the others (one broadcast). On any failure every rank raises and nothing
new is left.

A problem found on one rank only (a piece key that is another model key, a failed write) is
sent to the others in that exchange, so every rank raises and none waits for the others.
"""

from __future__ import annotations

import builtins
import json
import os
from collections.abc import Callable
from typing import Any

from ._ckpt_files import _discard, _old_checkpoint, _parent, remove_old_shards, shard_names, temp_name
from ._errors import StructureError
from ._pieces import PIECES
from ._safetensors_io import INDEX

__all__ = ["save_sharded", "sharded_pieces"]


# ----------------------------------------------------------------------------- saving


def sharded_pieces(items: list[Any]) -> tuple[Any, list[Any]] | None:
    """``(comm, pieces)`` when some array of `items` (`functorkit._ckpt_write.Item`) is sharded:
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
    target: str,
    items: list[Any],
    meta: dict[str, str],
    comm: Any,
    pieces: list[Any],
    *,
    shard_size: int | None,
    item: Callable[[str, Any], Any],
    write_file: Callable[[str, list[Any], dict[str, str]], None],
) -> None:
    """Write this rank's part of `items` (`functorkit._ckpt_write.Item`, their `sharded_pieces`)
    into the sharded checkpoint at `target`, together with every other rank of `comm`; ``item(key,
    array)`` and ``write_file(path, items, meta)`` are `fk.save`'s own (``Item``, ``write_file`` of ``_ckpt_write``)."""
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
        its = [item(k, x) for k, x in parts]
        write_file(path, its, meta)
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
    stuck = remove_old_shards(target, old)
    if stuck is not None:
        return f"the new checkpoint is complete, but the old shard {stuck[0]} could not be removed ({stuck[1]})"
    return None
