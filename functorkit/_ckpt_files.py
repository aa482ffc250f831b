"""The files of a checkpoint on disk: what `fk.save` may replace, and replacing it atomically.

`fk.save` writes and deletes only what it owns (SPEC section 13):

- a **file** target is written under a temporary name next to it and moved
  into place with one ``os.replace``; an existing file there is replaced only
  when it is a safetensors file functorkit can read;
- a **directory** target that does not exist is written as a temporary
  directory and renamed into place; an existing one must be empty or hold a
  checkpoint functorkit can read (``model.safetensors.index.json`` and the
  shards it names): the new shards are written beside the old ones under
  names no file there has, the new index replaces the old one with one
  ``os.replace`` (the commit), and only then are the old shards removed.
  Every other file in the directory is left alone.

So at every step (an exception, a ``KeyboardInterrupt``, a killed process)
the path holds the old checkpoint or the new one, whole. Temporary names are
``.fk-tmp-<12 hex>-<name>``, cut to the file system's longest name.
"""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable

from ._errors import StructureError
from ._safetensors_io import INDEX, SafetensorsFile, read_index

__all__ = ["remove_old_shards", "replace_dir", "replace_file", "shard_names"]

_NAME_MAX = 255


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return _NAME_MAX


def temp_name(folder: str, name: str) -> str:
    """A fresh hidden name in `folder` for a file about to become `name` (fits ``NAME_MAX``)."""
    tag = f".fk-tmp-{uuid.uuid4().hex[:12]}-"
    room = _name_max(folder) - len(os.fsencode(tag))
    while len(os.fsencode(name)) > room:
        name = name[: max(0, len(name) - max(1, (len(os.fsencode(name)) - room) // 4))]
    return os.path.join(folder, tag + name)


def _discard(path: str) -> None:
    """Remove a temporary file or directory this save created (errors ignored: best effort)."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    except OSError:
        pass


def _parent(target: str) -> str:
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent):
        msg = f"fk.save: the directory {parent} does not exist; create it first (os.makedirs)."
        raise FileNotFoundError(msg)
    return parent


def _found(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "a regular file" if stat.S_ISREG(mode) else "a special file (FIFO, socket or device)"


def replace_file(target: str, write: Callable[[str], None]) -> None:
    """`write` a new file under a temporary name, then move it to `target` in one ``os.replace``."""
    parent = _parent(target)
    if os.path.lexists(target):
        mode = os.lstat(target).st_mode
        if not stat.S_ISREG(mode):
            hint = " (pass `shard_size=` to write a sharded checkpoint into a directory)" if stat.S_ISDIR(mode) else ""
            msg = (
                f"fk.save: {target} is {_found(mode)}; fk.save replaces only a safetensors file there{hint}. "
                "Fix: choose another path, or remove it first."
            )
            raise FileExistsError(msg)
        try:
            SafetensorsFile(target).close()
        except StructureError as e:  # an I/O error while reading it propagates as itself
            msg = (
                f"fk.save: {target} exists and is not a safetensors checkpoint functorkit can read "
                f"({str(e).splitlines()[0][:200]}); fk.save replaces only checkpoints. "
                "Fix: choose another path, or remove the file first."
            )
            raise FileExistsError(msg) from None
    tmp = temp_name(parent, os.path.basename(target))
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        _discard(tmp)
        raise


def shard_names(n: int, taken: set[str]) -> list[str]:
    """Hugging Face's ``model-0000i-of-0000n.safetensors``, with a ``-1``, ``-2``... suffix when one
    of them is taken (by the checkpoint being replaced, or by another file)."""
    for k in range(len(taken) + 1):
        tag = f"-{k}" if k else ""
        names = [f"model-{i + 1:05d}-of-{n:05d}{tag}.safetensors" for i in range(n)]
        if taken.isdisjoint(names):
            return names
    raise AssertionError  # unreachable: len(taken) + 1 suffixes cannot all be taken  # pragma: no cover


def _old_checkpoint(target: str) -> tuple[set[str], set[str]]:
    """``(names in the directory, names of the old checkpoint's shards)``; refuses anything else."""
    mode = os.lstat(target).st_mode
    if not stat.S_ISDIR(mode):
        msg = (
            f"fk.save: {target} is {_found(mode)}, not a checkpoint directory; a sharded checkpoint "
            "(`shard_size=`) is a directory. Fix: choose another path, or save without `shard_size`."
        )
        raise FileExistsError(msg)
    entries = set(os.listdir(target))
    if INDEX not in entries:
        if not entries:
            return entries, set()
        shown = ", ".join(sorted(entries)[:8]) + (" ..." if len(entries) > 8 else "")
        msg = (
            f"fk.save: {target} is not a checkpoint directory: it has no {INDEX} and holds other files "
            f"({shown}); fk.save replaces only a checkpoint it wrote or can read, and deletes nothing else. "
            "Fix: choose a new or empty directory."
        )
        raise FileExistsError(msg)
    try:
        old = set(read_index(os.path.join(target, INDEX)).values())
        for name in old:
            SafetensorsFile(os.path.join(target, name)).close()
    except (StructureError, FileNotFoundError) as e:  # other I/O errors propagate as themselves
        msg = (
            f"fk.save: {target} holds a checkpoint functorkit cannot read ({str(e).splitlines()[0][:200]}); "
            "fk.save replaces only a checkpoint it can read. Fix: choose another directory, or remove "
            "the broken checkpoint first."
        )
        raise FileExistsError(msg) from None
    return entries, old


def replace_dir(
    target: str, n: int, write: Callable[[str, int], None], index: Callable[[str, list[str]], None]
) -> None:
    """A sharded checkpoint of `n` shards at `target`, replacing the one there (see the module's
    docstring): ``write(path, i)`` writes shard ``i`` to ``path``; ``index(path, names)`` writes
    the index naming the shards ``names``."""
    parent = _parent(target)
    if not os.path.lexists(target):
        tmp = temp_name(parent, os.path.basename(target))
        try:
            os.mkdir(tmp)
            names = shard_names(n, set())
            for i, name in enumerate(names):
                write(os.path.join(tmp, name), i)
            index(os.path.join(tmp, INDEX), names)
            os.rename(tmp, target)
        except BaseException:
            _discard(tmp)
            raise
        return
    entries, old = _old_checkpoint(target)
    names = shard_names(n, entries)
    created: list[str] = []
    try:
        for i, name in enumerate(names):
            created.append(temp_name(target, name))
            write(created[-1], i)
            final = os.path.join(target, name)
            os.rename(created[-1], final)
            created[-1] = final
        created.append(temp_name(target, INDEX))
        index(created[-1], names)
        os.replace(created[-1], os.path.join(target, INDEX))  # the commit: the new checkpoint is whole
        created.clear()
    except BaseException:
        for path in created:
            _discard(path)
        raise
    failed = remove_old_shards(target, old)
    if failed is not None:
        name, e = failed
        msg = (
            f"fk.save: the new checkpoint is complete at {target}, but the old shard {name} could not be "
            f"removed ({e}); it is no longer part of the checkpoint: remove it by hand."
        )
        raise OSError(msg) from e


def remove_old_shards(target: str, old: Iterable[str]) -> tuple[str, OSError] | None:
    """Remove the shards of the replaced checkpoint (after the new index is committed), in name
    order; the first that cannot be removed and its error, or None (one already gone is fine)."""
    for name in sorted(old):
        try:
            os.remove(os.path.join(target, name))
        except FileNotFoundError:
            pass
        except OSError as e:
            return name, e
    return None
