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
Writing goes to a temporary name next to the target, moved into place at
the end (removed on any error), so no partial checkpoint is ever left; what
may be replaced, and how, is `functorkit._ckpt_files`. Reading checks every
header first (`functorkit._safetensors_io`) and, unless ``mmap=True``,
copies the tensors into memory the arrays own.
"""

from __future__ import annotations

import builtins
import json
import math
import os
from collections.abc import Mapping
from typing import Any

from ._ckpt_files import replace_dir, replace_file
from ._ckpt_write import Item, dtype_name, write_file
from ._dense import check_dense
from ._errors import StructureError, known_shape
from ._pieces import PIECES
from ._safetensors_header import unicode_problem
from ._safetensors_io import TIES, TOTAL_SIZE, Checkpoint
from ._sharded_ckpt import save_sharded, sharded_pieces
from ._state import state_positions
from ._treedef import TreeDef
from ._xp import describe_array, is_array
from .adapters import adapter_of

__all__ = ["load", "open", "save"]

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
_SHOWN = 20


# ----------------------------------------------------------------------------- keys of a model


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
        if unit in _UNITS and 0 < value * _UNITS[unit] < math.inf:  # (not "inf", "nan", "1e400GB")
            return max(1, int(value * _UNITS[unit]))
    msg = f'`shard_size` must be a positive number of bytes or a string such as "2GB" or "500MiB", got {shard_size!r}.'
    raise ValueError(msg)


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
    Lazy (Dask) arrays are written block by block, in two passes where needed:
    the small reductions their blocks share (a merge's norms or thresholds)
    first, for the whole file in one compute, then every block, each written
    at its offset by the task that computes it (with a ``dask.distributed``
    client or another multi-process scheduler: a batch of blocks, about
    16 MiB, at a time), so memory stays near a few blocks, not a
    tensor. Each tensor's graph runs once per pass. Any active Dask
    scheduler is used (``dask.distributed`` included). The file (or
    directory) appears only when complete: on any error, ``KeyboardInterrupt``
    included, the path holds the old checkpoint or the new one, whole, and
    nothing else is left. Keys are stored exactly as given, so saving what
    `load` returned writes the keys it read.

    A model of torch ``DTensor``s (FSDP2) is saved by every rank calling
    ``save(directory, model)`` with the same directory: each rank writes its
    own shards, nothing is gathered, and `load`/`open` give the full tensors
    (docs/checkpoints.md, "Models sharded over ranks").

    Parameters
    ----------
    path
        A file path; with `shard_size`, a directory that receives the shards
        ``model-00001-of-0000N.safetensors`` and ``model.safetensors.index.json``
        (Hugging Face's layout). An existing file is replaced only if it is a
        safetensors file; an existing directory must be empty or hold a
        checkpoint (an index and its shards): those are replaced, every other
        file there is left alone. Anything else at the path is a
        ``FileExistsError``.
    model
        Any tree functorkit walks: dict, dataclass, ``nn.Module``...
    metadata
        ``str -> str`` pairs stored in the header, never read as anything else.
        The keys functorkit writes itself are reserved: ``"functorkit.ties"``
        (its record of ties), ``"functorkit.pieces"`` and ``"total_size"``
        (entries of a sharded checkpoint's index).
    shard_size
        The largest shard, in bytes (``int``) or as text (``"2GB"``, ``"500MiB"``);
        a tensor larger than that gets a shard of its own.

    Raises
    ------
    TypeError
        For a dtype safetensors cannot store, or `metadata` not ``str -> str``.
    StructureError
        If two paths give one key (a dict key holding a dot), a key is
        ``__metadata__`` (the header's own entry), a key or a metadata text
        is not Unicode (a lone surrogate such as ``"\\ud800"``, which has no
        UTF-8 form), a metadata key is reserved, or a lazy array's shape is
        unknown; all before anything is written.
    FileExistsError
        If the path holds something fk.save does not replace.

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
    items: list[Item] = []
    ties: dict[str, str] = {}
    for j, ks in keys.items():
        if _HEADER_KEY in ks:
            msg = (
                f"fk.save: a model key is {_HEADER_KEY!r}, the name safetensors reserves for the header's "
                "metadata, so the file could not be read back. Fix: rename that key."
            )
            raise StructureError(msg)
        for k in ks:
            if not k.isascii() and unicode_problem(k):
                msg = (
                    f"fk.save: the model key {k!r} holds a lone UTF-16 surrogate, which is not Unicode: it has "
                    "no UTF-8 form, so no safetensors file can hold it. Fix: rename that key (a name decoded "
                    "with errors='surrogateescape'?)."
                )
                raise StructureError(msg)
        items.append(Item(ks[0], leaves[j]))
        ties.update({k: ks[0] for k in ks[1:]})
    meta[TIES] = json.dumps(ties)  # always written: it marks the other metadata as the user's
    sharded = sharded_pieces(items)  # DTensors: every rank writes its own pieces (_sharded_ckpt)
    if sharded is not None:
        save_sharded(target, items, meta, *sharded, shard_size=size, item=Item, write_file=write_file)
    elif size is None:
        replace_file(target, lambda tmp: write_file(tmp, items, meta))
    else:
        shards = _plan_shards(items, size)
        replace_dir(
            target,
            len(shards),
            lambda file, i: write_file(file, shards[i], meta),
            lambda file, names: _write_index(file, shards, names, meta),
        )


_HEADER_KEY = "__metadata__"


def _check_metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        msg = f"fk.save: `metadata` must be a mapping of str to str (safetensors stores text), got {metadata!r:.200}."
        raise TypeError(msg)
    for k, v in metadata.items():
        if k in _RESERVED:
            msg = (
                f"fk.save: the metadata key {k!r} is reserved for functorkit's own record ({_RESERVED[k]}): a "
                "value given there would be overwritten or read as functorkit's. Expected a key other than "
                f"{sorted(_RESERVED)}; fix: rename it (e.g. 'user.{k}')."
            )
            raise StructureError(msg)
        for text, what in ((k, "key"), (v, f"value of {k!r}")):
            if not text.isascii() and unicode_problem(text):
                msg = (
                    f"fk.save: the metadata {what} ({text!r:.100}) holds a lone UTF-16 surrogate, which is not "
                    "Unicode: it has no UTF-8 form, so no safetensors file can hold it. Fix: pass valid text."
                )
                raise StructureError(msg)
    return dict(metadata)


#: the metadata keys fk.save writes itself (in every header, or in a sharded checkpoint's index)
_RESERVED = {
    TIES: "the ties of the model, in every file",
    PIECES: "the pieces of sharded tensors, in a sharded checkpoint's index",
    TOTAL_SIZE: "the byte count of the tensors, in a sharded checkpoint's index",
}


def _plan_shards(items: list[Item], size: int) -> list[list[Item]]:
    shards: list[list[Item]] = [[]]
    filled = 0
    for it in items:
        if shards[-1] and filled + it.nbytes > size:
            shards.append([])
            filled = 0
        shards[-1].append(it)
        filled += it.nbytes
    return shards


def _write_index(file: str, shards: list[list[Item]], names: list[str], meta: dict[str, str]) -> None:
    weight_map = {it.key: name for shard, name in zip(shards, names, strict=True) for it in shard}
    total = sum(it.nbytes for shard in shards for it in shard)
    index = {"metadata": {**meta, TOTAL_SIZE: total}, "weight_map": weight_map}
    with builtins.open(file, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=2)


# ----------------------------------------------------------------------------- reading


def _split(key: str) -> list[Any]:
    """The entries of a stored key: split at its dots, a digit run written as ``str(int)`` becoming an
    ``int`` (``01``, ``-1``, ``a[0]`` stay strings), so `KeyPath.dotted` gives `key` back exactly."""
    return [int(e) if e.isascii() and e.isdigit() and len(e) < 19 and str(int(e)) == e else e for e in key.split(".")]


def _nest(ck: Checkpoint, make: Any, fname: str) -> dict[Any, Any]:
    """Nested dicts by the dotted keys (`_split`), ties shared; one flat dict ``{stored key:
    array}`` where the keys do not nest (a key that is a prefix of another)."""
    made: dict[str, Any] = {}
    keys = [*ck.tensors, *ck.aliases]
    for key in keys:
        stored = ck.aliases.get(key, key)
        if stored not in made:
            made[stored] = make(ck.tensors[stored])
    out: dict[Any, Any] = {}
    for key in keys:
        entries = _split(key)
        node = out
        for e in entries[:-1]:
            nxt = node.setdefault(e, {})
            if type(nxt) is not dict:
                return {k: made[ck.aliases.get(k, k)] for k in keys}
            node = nxt
        if entries[-1] in node:
            return {k: made[ck.aliases.get(k, k)] for k in keys}
        node[entries[-1]] = made[ck.aliases.get(key, key)]
    return out


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
        shape, name = known_shape(x, f"fk.{fname}: the array of `like` at {ks[0]!r}"), dtype_name(x.dtype)
        if shape != info.shape or name != info.name:
            bad.append(f"{ks[0]!r} in {info.path}: {info.name} {info.shape} stored, {name} {shape} in `like`")
        plan[j] = s
    unexpected = [k for k in [*ck.tensors, *ck.aliases] if k not in used]
    if missing or unexpected or bad:
        raise StructureError(_report(ck, fname, missing, unexpected, bad))
    out = list(leaves)
    for j, x in enumerate(leaves):  # arrays no checkpoint stores (a module's non-persistent buffers)
        if j in keys or not is_array(x):
            continue
        ad = adapter_of(x)
        if not ad.readable(ad.device(x)):
            msg = (
                f"fk.{fname}: at {td.paths[j].display}: `like` holds an array that checkpoints do not store "
                f"(a module's non-persistent buffer), {describe_array(x)}, which holds no values, so the "
                "result would keep it there. Expected `like` to hold its values; fix: build `like` on the "
                "CPU, where its buffers are computed (a `meta` template saves only the parameters' memory)."
            )
            raise StructureError(msg)
        out[j] = ad.copy(x)  # `like`'s values, not `like`'s array: the result shares nothing with it
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


def load(path: str | os.PathLike[str], /, *, like: Any = None, mmap: bool = False) -> Any:
    """Read a safetensors checkpoint (a file, or a directory of shards with an index).

    Every header is checked before anything is read (rules at least as strict
    as the ``safetensors`` package's: a hostile or damaged file gives a
    `StructureError` naming the file and the key, never a crash or a huge
    allocation), and shard names must be plain files of the checkpoint
    directory. The arrays own their memory: they are read from the files
    whose headers were checked, and a later change to the file (rewritten,
    truncated, replaced) never changes or breaks them.

    Without `like`: nested dicts by the dotted keys, a run of digits becoming
    an ``int`` key (``layers.0.weight`` -> ``{"layers": {0: {"weight": ...}}}``;
    ``01`` or ``-1`` stay strings), so that saving the tree again writes the
    very keys that were read; where keys do not nest (``a`` and ``a.b`` both
    stored), one flat dict ``{stored key: array}``. NumPy arrays; bfloat16 and
    float8 need ``ml_dtypes``.

    With `like`: a copy of `like`'s structure (modules, dataclasses...) with
    each array read into `like`'s array library and device (torch tensors
    over the array read, ``nn.Parameter`` where `like` has one; JAX arrays;
    Dask arrays as `open`). Non-array leaves come from `like`.

    Ties recorded in the file come back as one shared array.

    Parameters
    ----------
    mmap
        ``True``: NumPy arrays (and CPU torch tensors) are views of one
        copy-on-write memory map of each file instead, read when touched (for
        models larger than memory). Such arrays **follow the file**: another
        program rewriting it in place changes them, and truncating it makes a
        later read crash the process (``SIGBUS``). Writing to them never
        changes the file.

    Raises
    ------
    StructureError
        If a file is not valid safetensors (truncated, bad header, a shard
        name leaving the directory, not a regular file), or with `like`: every
        missing, unexpected, shape- or dtype-mismatched key in one message
        naming the keys and files.
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
    if type(mmap) is not bool:
        msg = f"fk.load: `mmap` must be True or False, got {mmap!r}."
        raise TypeError(msg)
    with Checkpoint(path, "load", mmap=mmap) as ck:
        if like is None:
            return _nest(ck, lambda s: s.array(), "load")
        return _into_like(ck, like, lambda s, x: adapter_of(x).from_stored(s, x), "load")


def open(path: str | os.PathLike[str], /, *, like: Any = None) -> Any:
    """Open a checkpoint lazily: a model whose leaves are Dask arrays over the stored tensors.

    Nothing is read until computed: each chunk (rows of about 512 Ki elements,
    2 MiB of float32; an empty tensor is one chunk) opens the file, checks that it is still the
    file whose header was read (device, inode, size, modification time: a
    `StructureError` otherwise, never data read at old offsets from another
    file), reads its rows and closes it, in whichever process computes it
    (``dask.distributed`` workers included). Headers are checked as in `load`. Dtypes are as stored
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
    from .adapters._families import lazy_adapter

    ad = lazy_adapter()
    with Checkpoint(path, "open") as ck:
        if like is None:
            return _nest(ck, lambda s: ad.from_stored(s, None), "open")
        return _into_like(ck, like, lambda s, x: ad.from_stored(s, None), "open")
