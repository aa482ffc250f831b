"""Writing one safetensors file of `functorkit.save`: the header, then the data, lazy (Dask) tensors
block by block (two passes where their blocks share reductions), eager ones whole.

Split from `functorkit._checkpoint` (the public functions and the reading side); the file
format itself is `functorkit._safetensors_io`.
"""

from __future__ import annotations

import builtins
import math
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ._errors import known_shape
from ._safetensors_io import CODE_OF, POOL, header_bytes, stand_in
from .adapters import adapter_of

__all__ = ["BATCH_BYTES", "TWO_PASS", "Item", "dtype_name", "write_file"]

#: pieces of lazy (Dask) tensors are computed together up to about this many bytes
BATCH_BYTES = 16 * 2**20


def dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


class Item:
    """One tensor to write: key, the array, its adapter, dtype name, shape, byte count."""

    __slots__ = ("ad", "itemsize", "key", "name", "nbytes", "shape", "x")

    def __init__(self, key: str, x: Any) -> None:
        self.key, self.x, self.ad = key, x, adapter_of(x)
        self.name = dtype_name(x.dtype)
        if self.name not in CODE_OF:
            msg = (
                f"fk.save: the array at {key!r} has dtype {self.name}, which safetensors cannot store. "
                f"Expected one of {sorted(CODE_OF)}; fix: cast it first (fk.fmap)."
            )
            raise TypeError(msg)
        self.shape = known_shape(x, f"fk.save: the array at {key!r}")
        self.itemsize = stand_in(self.name).itemsize
        self.nbytes = math.prod(self.shape) * self.itemsize


def write_file(file: str, items: list[Item], meta: dict[str, str]) -> None:
    """One safetensors file: the header (tensors in walk order), then the data, widest dtypes
    first so that every tensor is aligned in the file (safetensors allows no gaps).

    Lazy arrays: with `TWO_PASS`, the small reductions their blocks share (a merge's norms,
    thresholds: ``reductions_first``) are computed first, for the whole file in one pass, so that
    every tensor then streams block by block. With a scheduler of this process (threads, or
    synchronous), every lazy block of the file is then computed in one ``dask.array.store`` whose
    tasks write each block at its offset as soon as it is computed (``os.pwrite``); otherwise (a
    ``dask.distributed`` client) the blocks are computed a batch (about `BATCH_BYTES`) at a time
    and written by one writer thread while the next batch is computed, a tensor whose blocks still
    share work computed in one batch, so that its graph runs once."""
    order = sorted(items, key=lambda it: -it.itemsize)
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for it in order:
        offsets[it.key] = (pos, pos + it.nbytes)
        pos += it.nbytes
    head = header_bytes([(it.key, it.name, it.shape, *offsets[it.key]) for it in items], meta)
    with POOL.active():  # the memory of the blocks read from fk.open'ed files is recycled
        if TWO_PASS:
            _reductions_first(order)
        with builtins.open(file, "wb") as f:
            f.write(head)
            f.flush()
            if not (_PWRITE and _store(f.fileno(), len(head), order, offsets)):
                _write_batches(f, order)
            size = os.fstat(f.fileno()).st_size if _PWRITE else f.tell()
            if size != len(head) + pos:
                msg = f"fk.save: wrote {size} bytes to {file}, expected {len(head) + pos}."
                raise RuntimeError(msg)


#: the two-pass save (`write_file`): a file's shared reductions are computed first (reading those
#: tensors' inputs twice), so that every tensor streams and memory stays near a few blocks
TWO_PASS = True
_PWRITE = hasattr(os, "pwrite")


def _reductions_first(order: list[Item]) -> None:
    """Replace the lazy arrays of `order` by ones whose shared reductions are computed (one pass per
    adapter, every tensor of the file together)."""
    groups: dict[int, list[Item]] = {}
    for it in order:
        groups.setdefault(id(it.ad), []).append(it)
    for group in groups.values():
        xs = group[0].ad.reductions_first([it.x for it in group])
        for it, x in zip(group, xs, strict=True):
            it.x = x


def _pwrite_all(fd: int, v: np.ndarray[Any, Any], at: int) -> None:
    view = memoryview(v.reshape(-1).view(np.uint8).data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


class _RowSink:
    """Writes the computed blocks of one lazy tensor at their offsets in the file (called in the
    task that computed each, with the rows the block holds); checks each block's dtype and size
    first, and counts the rows written."""

    __slots__ = ("at", "fd", "it", "row_bytes", "rows", "written")

    def __init__(self, fd: int, it: Item, at: int) -> None:
        self.fd, self.it, self.at = fd, it, at
        self.rows = int(it.shape[0]) if it.shape else 1
        self.row_bytes = it.nbytes // self.rows if self.rows else 0
        self.written: list[int] = []  # rows per block (list.append: one atomic step per task)

    @property
    def done(self) -> bool:
        return not self.it.nbytes or sum(self.written) == self.rows  # store hands no empty block

    def __call__(self, start: int, stop: int, v: np.ndarray[Any, Any]) -> None:
        it = self.it
        if dtype_name(v.dtype) != it.name:
            msg = f"fk.save: the lazy array at {it.key!r} computed to dtype {v.dtype}, expected {it.name}."
            raise TypeError(msg)
        n = stop - start
        if v.nbytes != n * self.row_bytes or not 0 <= start <= stop <= self.rows:
            msg = (
                f"fk.save: the lazy array at {it.key!r} gave {v.nbytes} bytes ({v.shape}) for its rows "
                f"{start}:{stop}, expected {n * self.row_bytes} (shape {it.shape}): its chunks or shape "
                "are not the ones the graph declares."
            )
            raise RuntimeError(msg)
        if v.nbytes:
            _pwrite_all(self.fd, v, self.at + start * self.row_bytes)
        self.written.append(n)


def _store(fd: int, start: int, order: list[Item], offsets: dict[str, tuple[int, int]]) -> bool:
    """Write the file's data with ``os.pwrite``: every lazy tensor in one ``store_rows`` of their
    adapter (False, nothing written, where it cannot: then `_write_batches` writes the file), then
    the eager arrays."""
    eager: list[Item] = []
    plan: dict[int, tuple[Any, list[Any], list[_RowSink]]] = {}
    for it in order:
        rows = it.ad.rows(it.x)
        if rows is None:
            eager.append(it)
            continue
        _, xs, sinks = plan.setdefault(id(it.ad), (it.ad, [], []))
        xs.append(rows)
        sinks.append(_RowSink(fd, it, start + offsets[it.key][0]))
    if len(plan) > 1:
        return False  # lazy arrays of two libraries: the batch writer keeps one order
    for ad, xs, sinks in plan.values():
        if not ad.store_rows(xs, sinks):
            return False
        missing = [s.it.key for s in sinks if not s.done]
        if missing:
            msg = f"fk.save: the lazy arrays at {sorted(missing)[:5]} were not all computed (internal error)."
            raise RuntimeError(msg)
    for it in eager:
        if it.nbytes:
            v = _to_host(it)
            if v.nbytes != it.nbytes:
                msg = f"fk.save: the array at {it.key!r} gave {v.nbytes} bytes, expected {it.nbytes} ({it.shape})."
                raise RuntimeError(msg)
            _pwrite_all(fd, np.ascontiguousarray(v), start + offsets[it.key][0])
    return True


def _write_batches(f: Any, order: list[Item]) -> None:
    """The data written in order: lazy pieces computed a batch (about `BATCH_BYTES`) at a time, an
    elementwise tensor's row blocks batch by batch, a tensor whose blocks share a reduction
    (`blocks_share_work`) whole in one batch (its graph runs once); one writer thread writes a batch
    while the next is computed (at most two batches in memory)."""
    with ThreadPoolExecutor(1) as pool:
        writer = _Writer(f, pool)
        batch: list[tuple[Item, Any, int]] = []
        batch_bytes = 0
        for it in order:
            blocks = it.ad.host_blocks(it.x, BATCH_BYTES)
            if blocks is None:
                writer.compute_and_write(batch)  # the file is written in order: pending pieces first
                batch, batch_bytes = [], 0
                writer.write([(it, _to_host(it), it.nbytes)])
                continue
            together = it.ad.blocks_share_work(it.x)  # a reduction inside: compute the graph once
            for b in blocks:
                nbytes = math.prod(int(d) for d in b.shape) * it.itemsize
                batch.append((it, b, nbytes))
                batch_bytes += nbytes
                if not together and batch_bytes >= BATCH_BYTES:
                    writer.compute_and_write(batch)
                    batch, batch_bytes = [], 0
            if batch_bytes >= BATCH_BYTES:
                writer.compute_and_write(batch)
                batch, batch_bytes = [], 0
        writer.compute_and_write(batch)
        writer.wait()
        f.flush()


def _to_host(it: Item) -> np.ndarray[Any, Any]:
    try:
        return it.ad.to_host(it.x)
    except TypeError as e:
        msg = f"fk.save: cannot read the array at {it.key!r}: {e}."
        raise TypeError(msg) from None


class _Writer:
    """Writes arrays to `f` in submission order on one thread (a write overlaps the next compute)."""

    def __init__(self, f: Any, pool: ThreadPoolExecutor) -> None:
        self.f, self.pool = f, pool
        self.pending: Future[None] | None = None

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()  # re-raises a failed write
            self.pending = None

    def write(self, parts: list[tuple[Item, np.ndarray[Any, Any], int]]) -> None:
        for it, v, nbytes in parts:
            if v.nbytes != nbytes:
                msg = f"fk.save: the array at {it.key!r} gave {v.nbytes} bytes, expected {nbytes} ({it.shape})."
                raise RuntimeError(msg)
        self.wait()
        self.pending = self.pool.submit(self._write, parts)

    def _write(self, parts: list[tuple[Item, np.ndarray[Any, Any], int]]) -> None:
        for _, v, nbytes in parts:
            if nbytes:
                self.f.write(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)

    def compute_and_write(self, batch: list[tuple[Item, Any, int]]) -> None:
        """Compute the lazy pieces in `batch` together, then queue their write."""
        if batch:
            values = batch[0][0].ad.compute_blocks([b for _, b, _ in batch])
            for (it, _, _), v in zip(batch, values):
                if dtype_name(v.dtype) != it.name:
                    msg = f"fk.save: the lazy array at {it.key!r} computed to dtype {v.dtype}, expected {it.name}."
                    raise TypeError(msg)
            self.write([(it, v, nbytes) for (it, _, nbytes), v in zip(batch, values)])
