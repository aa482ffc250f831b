"""Checkpoints: ``fk.save``, ``fk.load`` and ``fk.open`` over safetensors files.

Keys are the state-dict keys: ``KeyPath.dotted`` of each array leaf's path
in walk order (``0.weight``, ``layers.1.bias``), the form
``torch.nn.Module.state_dict()`` uses. A tied array is stored once, under its
first key; its other keys are recorded in the file's metadata as
``{"functorkit.ties": json({alias: stored key})}``. ``load`` also reads the
``{alias: stored key}`` metadata entries that ``safetensors.torch.save_model``
writes for tied models.

The file format is written and read here with NumPy
(`functorkit._safetensors_io`); array families differ only in adapter
methods (``to_host``, ``host_blocks``/``compute_blocks``, ``from_stored``).
Writing goes to a temporary name next to the target, renamed into place at
the end (removed on any error), so no partial checkpoint is ever left.
"""

from __future__ import annotations

import builtins
import json
import math
import os
import shutil
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ._dense import check_dense
from ._errors import StructureError
from ._keypath import KeyPath
from ._safetensors_io import CODE_OF, INDEX, TIES, Checkpoint, header_bytes, stand_in
from ._state import state_positions
from ._treedef import TreeDef
from .adapters._base import adapter_of

__all__ = ["load", "open", "save"]

#: pieces of lazy (Dask) tensors are computed together up to about this many bytes
BATCH_BYTES = 16 * 2**20
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SHOWN = 20


# ----------------------------------------------------------------------------- keys of a model


def _dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else str(dtype).rpartition(".")[2]


def _array_keys(tree: Any, fname: str) -> tuple[list[Any], TreeDef, dict[int, list[str]]]:
    """The distinct leaves and the state-dict keys of each array leaf (walk order): the keys of
    `fk.state_dict` (torch's for modules: non-persistent buffers are not stored)."""
    leaves, td, found = state_positions(tree, f"fk.{fname}")
    keys: dict[int, list[str]] = {}
    for key, path, j in found:
        if not path:
            msg = (
                f"fk.{fname}: the model is a single array; a checkpoint stores arrays by name. "
                "Fix: wrap it, e.g. {'weight': x}."
            )
            raise TypeError(msg)
        keys.setdefault(j, []).append(key)
    return leaves, td, keys


# ----------------------------------------------------------------------------- save


def _parse_size(shard_size: Any) -> int | None:
    if shard_size is None:
        return None
    if isinstance(shard_size, int) and not isinstance(shard_size, bool) and shard_size > 0:
        return shard_size
    if isinstance(shard_size, str):
        text = shard_size.strip().upper().replace(" ", "")
        num = text.rstrip("KMGTIB")
        unit = text[len(num) :]
        try:
            value = float(num)
        except ValueError:
            value = -1.0
        if unit in _UNITS and value > 0:
            return max(1, int(value * _UNITS[unit]))
    msg = f'`shard_size` must be a positive number of bytes or a string such as "2GB" or "500MiB", got {shard_size!r}.'
    raise ValueError(msg)


class _Item:
    """One tensor to write: key, the array, its adapter, dtype name, shape, byte count."""

    __slots__ = ("ad", "itemsize", "key", "name", "nbytes", "shape", "x")

    def __init__(self, key: str, x: Any) -> None:
        self.key, self.x, self.ad = key, x, adapter_of(x)
        self.name = _dtype_name(x.dtype)
        if self.name not in CODE_OF:
            msg = (
                f"fk.save: the array at {key!r} has dtype {self.name}, which safetensors cannot store. "
                f"Expected one of {sorted(CODE_OF)}; fix: cast it first (fk.fmap)."
            )
            raise TypeError(msg)
        self.shape = tuple(int(d) for d in x.shape)
        self.itemsize = stand_in(self.name).itemsize
        self.nbytes = math.prod(self.shape) * self.itemsize


def save(
    path: str | os.PathLike[str],
    model: Any,
    /,
    *,
    metadata: Mapping[str, str] | None = None,
    shard_size: int | str | None = None,
) -> None:
    """Write every array of `model` to a safetensors checkpoint, keyed by state-dict keys.

    Keys are ``KeyPath.dotted`` of each array's path (torch's ``state_dict()``
    keys for modules: ``0.weight``). A tied array is stored once and the tie
    recorded in the metadata (``"functorkit.ties"``), so `load`
    restores it. Non-array leaves (Python numbers, strings) are not stored.
    Lazy (Dask) arrays are computed block by block and written in place,
    so memory stays near one block (`BATCH_BYTES`), on whatever Dask
    scheduler is active (``dask.distributed`` included). The file (or
    directory) appears only when complete: on any error nothing is left.

    Parameters
    ----------
    path
        A file path; with `shard_size`, a directory that receives the shards
        ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``
        (Hugging Face's layout). An existing file is replaced; an existing
        directory only if it holds nothing but a checkpoint.
    model
        Any tree functorkit walks: dict, dataclass, ``nn.Module``...
    metadata
        ``str -> str`` pairs stored in the header (``"functorkit.ties"`` is reserved).
    shard_size
        The largest shard, in bytes (``int``) or as text (``"2GB"``, ``"500MiB"``);
        a tensor larger than that gets a shard of its own.

    Raises
    ------
    TypeError
        For a dtype safetensors cannot store, or bad `metadata`.
    StructureError
        If two paths give one key (a dict key holding a dot).

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import functorkit as fk
    >>> w = np.arange(4.0).reshape(2, 2)
    >>> model = {"encoder": {"weight": w}, "decoder": {"weight": w}, "bias": np.zeros(2)}
    >>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
    >>> fk.save(path, model)
    >>> back = fk.load(path)
    >>> back["decoder"]["weight"] is back["encoder"]["weight"], back["bias"].tolist()
    (True, [0.0, 0.0])
    """
    target = os.fspath(path)
    size = _parse_size(shard_size)
    meta = _check_metadata(metadata)
    leaves, _, keys = _array_keys(model, "save")
    order = list(keys)
    # sparse, nested: a TypeError before anything is written
    check_dense([leaves[j] for j in order], lambda i: keys[order[i]][0], "fk.save")
    items: list[_Item] = []
    ties: dict[str, str] = {}
    for j, ks in keys.items():
        items.append(_Item(ks[0], leaves[j]))
        ties.update({k: ks[0] for k in ks[1:]})
    if ties:
        meta[TIES] = json.dumps(ties)
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        msg = f"fk.save: the directory {parent} does not exist; create it first (os.makedirs)."
        raise FileNotFoundError(msg)
    tmp = os.path.join(parent, f".{os.path.basename(target)}.fk-tmp-{uuid.uuid4().hex[:12]}")
    try:
        if size is None:
            _write_file(tmp, items, meta)
            os.replace(tmp, target)
        else:
            os.mkdir(tmp)
            _write_shards(tmp, items, meta, size)
            _replace_dir(tmp, target)
    except BaseException:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)
        raise


def _check_metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        msg = f"fk.save: `metadata` must be a mapping of str to str (safetensors stores text), got {metadata!r:.200}."
        raise TypeError(msg)
    if TIES in metadata:
        msg = f"fk.save: the metadata key {TIES!r} is reserved (fk.save records ties there); use another key."
        raise ValueError(msg)
    return dict(metadata)


def _write_shards(folder: str, items: list[_Item], meta: dict[str, str], size: int) -> None:
    shards: list[list[_Item]] = [[]]
    filled = 0
    for it in items:
        if shards[-1] and filled + it.nbytes > size:
            shards.append([])
            filled = 0
        shards[-1].append(it)
        filled += it.nbytes
    n = len(shards)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        _write_file(os.path.join(folder, name), shard, meta)
        weight_map.update({it.key: name for it in shard})
    index = {"metadata": {**meta, "total_size": sum(it.nbytes for it in items)}, "weight_map": weight_map}
    with builtins.open(os.path.join(folder, INDEX), "w") as f:
        json.dump(index, f, indent=2)


def _replace_dir(tmp: str, target: str) -> None:
    """Move the finished directory `tmp` to `target`, replacing an earlier checkpoint there."""
    if not os.path.lexists(target):
        os.rename(tmp, target)
        return
    if not os.path.isdir(target) or any(
        not (n.endswith(".safetensors") or n == INDEX) for n in os.listdir(target)
    ):
        msg = (
            f"fk.save: {target} exists and is not a checkpoint directory (it holds other files); "
            "choose a new path or remove it first."
        )
        raise FileExistsError(msg)
    old = tmp.replace(".fk-tmp-", ".fk-old-")
    os.rename(target, old)
    os.rename(tmp, target)
    shutil.rmtree(old, ignore_errors=True)


def _write_file(file: str, items: list[_Item], meta: dict[str, str]) -> None:
    """One safetensors file: the header (tensors in walk order), then the data, widest dtypes
    first so that every tensor is aligned in the file (safetensors allows no gaps).

    Lazy pieces are computed a batch at a time; one writer thread writes a batch while the
    next is computed (at most two batches in memory)."""
    order = sorted(items, key=lambda it: -it.itemsize)
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for it in order:
        offsets[it.key] = (pos, pos + it.nbytes)
        pos += it.nbytes
    head = header_bytes([(it.key, it.name, it.shape, *offsets[it.key]) for it in items], meta)
    with builtins.open(file, "wb") as f, ThreadPoolExecutor(1) as pool:
        f.write(head)
        writer = _Writer(f, pool)
        batch: list[tuple[_Item, Any, int]] = []
        batch_bytes = 0
        for it in order:
            blocks = it.ad.host_blocks(it.x, BATCH_BYTES)
            if blocks is None:
                writer.compute_and_write(batch)  # the file is written in order: pending pieces first
                batch, batch_bytes = [], 0
                writer.write([(it, _to_host(it), it.nbytes)])
                continue
            for b in blocks:
                nbytes = math.prod(int(d) for d in b.shape) * it.itemsize
                batch.append((it, b, nbytes))
                batch_bytes += nbytes
                if batch_bytes >= BATCH_BYTES:
                    writer.compute_and_write(batch)
                    batch, batch_bytes = [], 0
        writer.compute_and_write(batch)
        writer.wait()
        if f.tell() != len(head) + pos:
            msg = f"fk.save: wrote {f.tell()} bytes to {file}, expected {len(head) + pos}."
            raise RuntimeError(msg)


def _to_host(it: _Item) -> np.ndarray[Any, Any]:
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

    def write(self, parts: list[tuple[_Item, np.ndarray[Any, Any], int]]) -> None:
        for it, v, nbytes in parts:
            if v.nbytes != nbytes:
                msg = f"fk.save: the array at {it.key!r} gave {v.nbytes} bytes, expected {nbytes} ({it.shape})."
                raise RuntimeError(msg)
        self.wait()
        self.pending = self.pool.submit(self._write, parts)

    def _write(self, parts: list[tuple[_Item, np.ndarray[Any, Any], int]]) -> None:
        for _, v, nbytes in parts:
            if nbytes:
                self.f.write(np.ascontiguousarray(v).reshape(-1).view(np.uint8).data)

    def compute_and_write(self, batch: list[tuple[_Item, Any, int]]) -> None:
        """Compute the lazy pieces in `batch` together, then queue their write."""
        if batch:
            values = batch[0][0].ad.compute_blocks([b for _, b, _ in batch])
            for (it, _, _), v in zip(batch, values):
                if _dtype_name(v.dtype) != it.name:
                    msg = f"fk.save: the lazy array at {it.key!r} computed to dtype {v.dtype}, expected {it.name}."
                    raise TypeError(msg)
            self.write([(it, v, nbytes) for (it, _, nbytes), v in zip(batch, values)])


# ----------------------------------------------------------------------------- reading


def _nest(ck: Checkpoint, make: Any, fname: str) -> dict[Any, Any]:
    """Nested dicts by the dotted keys (digit runs become ``int`` keys), ties shared."""
    out: dict[Any, Any] = {}
    made: dict[str, Any] = {}
    for key in [*ck.tensors, *ck.aliases]:
        stored = ck.aliases.get(key, key)
        if stored not in made:
            made[stored] = make(ck.tensors[stored])
        try:
            entries = list(KeyPath.parse(key)) if key else [key]
        except ValueError:
            entries = [key]
        node = out
        for i, e in enumerate(entries[:-1]):
            nxt = node.setdefault(e, {})
            if not isinstance(nxt, dict):
                raise _prefix_error(ck, fname, ".".join(map(str, entries[: i + 1])), key)
            node = nxt
        if entries[-1] in node:
            raise _prefix_error(ck, fname, key, key)
        node[entries[-1]] = made[stored]
    return out


def _prefix_error(ck: Checkpoint, fname: str, leaf: str, key: str) -> StructureError:
    return StructureError(
        f"fk.{fname}: in {ck.where}, the key {key!r} goes through {leaf!r}, which is itself a tensor (or "
        "repeats a key); nested dicts cannot hold both. Fix: pass `like=` a model with that structure."
    )


def _into_like(ck: Checkpoint, like: Any, make: Any, fname: str) -> Any:
    """A copy of `like`'s structure with each array leaf read from `ck`; every problem in one error."""
    leaves, td, keys = _array_keys(like, fname)
    missing: list[str] = []
    bad: list[str] = []
    used: set[str] = set()
    plan: dict[int, str] = {}
    for j, ks in keys.items():
        found = {k: ck.aliases.get(k, k) for k in ks if ck.aliases.get(k, k) in ck.tensors}
        used.update(found)
        missing += [k for k in ks if k not in found]
        stored = set(found.values())
        if len(stored) > 1:
            bad.append(f"{ks}: tied in `like` but stored as the separate tensors {sorted(stored)}")
        if not found:
            continue
        s = next(iter(stored))
        x, info = leaves[j], ck.tensors[s].info
        shape, name = tuple(int(d) for d in x.shape), _dtype_name(x.dtype)
        if shape != info.shape or name != info.name:
            bad.append(f"{ks[0]!r} in {info.path}: {info.name} {info.shape} stored, {name} {shape} in `like`")
        plan[j] = s
    unexpected = [k for k in [*ck.tensors, *ck.aliases] if k not in used]
    if missing or unexpected or bad:
        raise StructureError(_report(ck, fname, missing, unexpected, bad))
    out = list(leaves)
    given: set[str] = set()
    for j, s in plan.items():
        y = make(ck.tensors[s], leaves[j])
        if s in given:  # two untied arrays of `like` read one stored tensor: they must not alias
            y = adapter_of(y).copy(y)
        given.add(s)
        out[j] = y
    return td.unflatten(out)


def _report(ck: Checkpoint, fname: str, missing: list[str], unexpected: list[str], bad: list[str]) -> str:
    def show(xs: list[str]) -> str:
        more = f" and {len(xs) - _SHOWN} more" if len(xs) > _SHOWN else ""
        return ", ".join(xs[:_SHOWN]) + more

    parts = []
    if missing:
        parts.append(f"missing from the file (in `like`, not stored): {show([repr(k) for k in missing])}")
    if unexpected:
        parts.append(
            "unexpected (stored, not in `like`): "
            + show([f"{k!r} (in {ck.file_of(k)})" for k in unexpected])
        )
    if bad:
        parts.append(f"mismatched: {show(bad)}")
    return (
        f"fk.{fname}: the checkpoint {ck.where} does not fit `like`: " + "; ".join(parts)
        + ". Expected the same keys, shapes and dtypes; fix: pass a `like` model of the stored architecture "
        "(or load without `like=` to see what is stored)."
    )


def load(path: str | os.PathLike[str], /, *, like: Any = None) -> Any:
    """Read a safetensors checkpoint (a file, or a directory of shards with an index), memory-mapped.

    Without `like`: nested dicts by the dotted keys, a run of digits becoming
    an ``int`` key (``layers.0.weight`` -> ``{"layers": {0: {"weight": ...}}}``),
    NumPy arrays over a copy-on-write map of the file (read when touched;
    writing to them never changes the file). Saving that tree again gives
    the same keys. bfloat16/float8 tensors need ``ml_dtypes`` for NumPy.

    With `like`: a copy of `like`'s structure (modules, dataclasses...) with
    each array read into `like`'s array library and device: NumPy views of
    the map, torch tensors over the map without a copy on the CPU
    (``nn.Parameter`` where `like` has one), JAX arrays, Dask arrays (as
    `open`). Non-array leaves come from `like`.

    Ties recorded in the file come back as one shared array.

    Raises
    ------
    StructureError
        If the file is not valid safetensors (truncated, bad header), or with
        `like`: every missing, unexpected, shape- or dtype-mismatched key in
        one message naming the keys and files.
    FileNotFoundError
        For a missing file or shard.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import functorkit as fk
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> fk.save(path, {"layers": [{"w": np.ones(2)}, {"w": np.zeros(2)}]})
    >>> fk.load(path)["layers"][1]["w"].tolist()
    [0.0, 0.0]
    >>> like = {"layers": [{"w": np.empty(2)}, {"w": np.empty(2)}]}
    >>> fk.load(path, like=like)["layers"][0]["w"].tolist()
    [1.0, 1.0]
    """
    ck = Checkpoint(path, "load")
    if like is None:
        return _nest(ck, lambda s: s.array(), "load")
    return _into_like(ck, like, lambda s, x: adapter_of(x).from_stored(s, x), "load")


def open(path: str | os.PathLike[str], /, *, like: Any = None) -> Any:
    """Open a checkpoint lazily: a model whose leaves are Dask arrays over the stored tensors.

    Nothing is read until computed: each chunk (rows of about 16 MiB) maps
    the file, copies its rows and unmaps it, in whichever process computes
    it (``dask.distributed`` workers included). Dtypes are as stored
    (bfloat16/float8 through ``ml_dtypes``). Arithmetic on the result stays
    lazy; `save` writes it block by block. Structure as in
    `load` (nested dicts, or `like`'s structure with every array leaf
    a Dask array; keys, shapes and dtypes must match `like`).

    Opening the same unchanged file twice gives arrays with the same Dask
    names, so a computation that uses both reads it once.

    Examples
    --------
    >>> import numpy as np, tempfile, os
    >>> import functorkit as fk
    >>> d = tempfile.mkdtemp()
    >>> fk.save(os.path.join(d, "a.safetensors"), {"w": np.ones(3, dtype=np.float32)})
    >>> fk.save(os.path.join(d, "b.safetensors"), {"w": np.full(3, 3.0, dtype=np.float32)})
    >>> a, b = fk.open(os.path.join(d, "a.safetensors")), fk.open(os.path.join(d, "b.safetensors"))
    >>> avg = fk.mean([a, b])          # a Dask graph, nothing read yet
    >>> type(avg["w"]).__module__.split(".")[0], avg["w"].compute().tolist()
    ('dask', [2.0, 2.0, 2.0])
    """
    from .adapters._base import lazy_adapter

    ad = lazy_adapter()
    ck = Checkpoint(path, "open")
    if like is None:
        return _nest(ck, lambda s: ad.from_stored(s, None), "open")
    return _into_like(ck, like, lambda s, x: ad.from_stored(s, None), "open")
