"""The safetensors file format, read and written with NumPy alone (no ``safetensors`` package).

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
..., "__metadata__": {str: str}}``, padded with spaces), then the tensors'
bytes, little-endian, C order, offsets counted from the end of the header,
covering the data section without holes
(https://github.com/huggingface/safetensors, "Format"). Writing it here lets
`functorkit.save` stream tensors block by block into the file and keeps
torch out of the core; the tests check files both ways against the
``safetensors`` package.

Reading trusts nothing in the file (SPEC section 13): the header passes the
rules of the ``safetensors`` package (`functorkit._safetensors_header`) before any tensor
is touched, every refusal is a `StructureError` naming the file and the key,
shard names of an index are plain names inside its directory, and only
regular files are opened (with ``O_NONBLOCK``, so a FIFO never blocks).

Tensors are handed around as NumPy arrays. Dtypes NumPy lacks (bfloat16,
float8) travel as a same-width unsigned integer stand-in together with their
name; `real_dtype` gives the true NumPy dtype through ``ml_dtypes``
where it is installed. `Checkpoint` gathers the tensors of a file or of a
sharded directory (Hugging Face's ``model.safetensors.index.json``) and the ties
recorded in their metadata.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import mmap as _mmap
import os
import stat
import struct
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ._errors import StructureError
from ._pieces import assemble
from ._safetensors_header import (
    _MAX_HEADER,
    _ML_DTYPES,
    CODE_OF,
    NAME_OF,
    TensorInfo,
    bad_file,
    loads_json,
    parse_header,
    short,
    stand_in,
    unicode_problem,
)

__all__ = [
    "CODE_OF",
    "INDEX",
    "NAME_OF",
    "TIES",
    "TOTAL_SIZE",
    "Checkpoint",
    "LazyTensor",
    "SafetensorsFile",
    "Stored",
    "TensorInfo",
    "header_bytes",
    "open_regular",
    "read_index",
    "real_dtype",
    "stand_in",
]

INDEX = "model.safetensors.index.json"
#: the metadata key of the ties fk.save records (``{alias: stored key}`` as JSON); always written
TIES = "functorkit.ties"
#: the index metadata entry of a sharded checkpoint's byte count (Hugging Face's layout)
TOTAL_SIZE = "total_size"


def real_dtype(name: str, where: str) -> np.dtype[Any]:
    """The NumPy dtype of `name`; bfloat16/float8 need ``ml_dtypes`` (a clear error without it)."""
    if name not in _ML_DTYPES:
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        msg = (
            f"{where} is {name}, which NumPy has no dtype for; expected the `ml_dtypes` package, found it "
            "missing. Fix: `pip install ml_dtypes`, or load into a torch or JAX model (`like=`), "
            "which have their own bfloat16."
        )
        raise TypeError(msg) from None
    out: np.dtype[Any] = np.dtype(getattr(ml_dtypes, name))
    return out


def header_bytes(tensors: list[tuple[str, str, tuple[int, ...], int, int]], metadata: Mapping[str, str]) -> bytes:
    """The length prefix and space-padded JSON header (8-byte aligned data) for `tensors`:
    ``(key, dtype name, shape, begin, end)``, listed in this order."""
    head: dict[str, Any] = {}
    if metadata:
        head["__metadata__"] = dict(metadata)
    for key, name, shape, begin, end in tensors:
        head[key] = {"dtype": CODE_OF[name], "shape": list(shape), "data_offsets": [begin, end]}
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


# ----------------------------------------------------------------------------- opening files


def _kind(mode: int) -> str:
    for test, what in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return what
    return "special file"


def open_regular(path: str, what: str) -> Any:
    """`path` opened for reading as an unbuffered binary file, if it is a regular file.

    A FIFO, device or socket is refused before it is opened (``os.stat``) and
    again after (``fstat`` of a descriptor opened with ``O_NONBLOCK``, so a
    FIFO swapped in between cannot block the open)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        msg = f"{path}: no such {what}; check the path (a missing shard of a sharded checkpoint?)."
        raise FileNotFoundError(msg) from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # no file has that name (a hostile index's shard name?)
            msg = f"{path}: no such {what}: the name is longer than the file system allows; check the path."
            raise FileNotFoundError(msg) from None
        if e.errno != errno.ELOOP:  # a permission or I/O error is itself, with the path
            raise
        msg = (
            f"{path}: expected the {what} to be a regular file, found a loop of symbolic links (a link "
            "that leads back to itself). Fix: point to the checkpoint file itself."
        )
        raise StructureError(msg) from None
    if not stat.S_ISREG(st.st_mode):
        raise _not_regular(path, what, st.st_mode)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, what, mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _not_regular(path: str, what: str, mode: int) -> StructureError:
    return StructureError(
        f"{path}: expected the {what} to be a regular file, found a {_kind(mode)}; functorkit opens only "
        "regular files. Fix: point to the checkpoint file itself."
    )


def _identity(f: Any) -> tuple[int, int, int, int]:
    st = os.fstat(f.fileno())
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_into(f: Any, buf: Any, offset: int, path: str, key: str) -> None:
    """Fill the writable buffer `buf` with the file's bytes from `offset` (short reads retried)."""
    view = memoryview(buf).cast("B")
    f.seek(offset)
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            msg = (
                f"{path}: the file is shorter than its header says: the tensor {key!r} ends at byte "
                f"{offset + len(view)}, the file at {offset + done}; was it cut short by another program?"
            )
            raise StructureError(msg)
        done += n


# ----------------------------------------------------------------------------- files


class SafetensorsFile:
    """A parsed header, and the open file it was read from (closed by `close`).

    Tensors are read from that same open file, so they come from the very
    file whose header was checked: copied into arrays that own their memory
    (`read`), or, with ``mmap=True``, views of one copy-on-write memory map of it.
    """

    def __init__(self, path: str | os.PathLike[str], *, mmap: bool = False, what: str = "checkpoint file") -> None:
        self.path = p = os.fspath(path)
        self.mmap = mmap
        self._map: Any = None
        self._f: Any = open_regular(p, what)
        try:
            self.ident = ident = _identity(self._f)
            size = ident[2]
            raw = self._f.read(8)
            if len(raw) < 8:
                raise bad_file(p, f"it has {len(raw)} bytes, fewer than the 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise bad_file(p, f"the header length {n} exceeds the limit of {_MAX_HEADER} bytes")
            if n > size - 8:
                raise bad_file(p, f"the header length {n} exceeds the file ({size} bytes)")
            text = self._f.read(n)  # n <= the file's size: no allocation beyond what is there
            if len(text) != n:
                raise bad_file(p, "the file was cut short while its header was read")
            self.data_start = 8 + n
            self.metadata, self.tensors = parse_header(p, text, size - self.data_start, self.data_start, ident)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def raw(self, key: str) -> np.ndarray[Any, Any]:
        """The tensor's bytes as a stand-in-dtype array: read into memory it owns, or (``mmap``) a view
        of the file's copy-on-write map."""
        t = self.tensors[key]
        dt = stand_in(t.name)
        if not self.mmap:
            out = np.empty(t.shape, dtype=dt)
            if t.nbytes:
                if self._f is None:
                    msg = f"{self.path}: the checkpoint was closed before {key!r} was read (internal error)."
                    raise RuntimeError(msg)
                _read_into(self._f, out, t.begin, self.path, key)
            return out
        if self._map is None:
            if self._f is None or _identity(self._f) != self.ident:
                msg = f"{self.path}: the file changed while it was being opened; open it again."
                raise StructureError(msg)
            size = self.ident[2]
            self._map = _mmap.mmap(self._f.fileno(), size, access=_mmap.ACCESS_COPY) if size else b""
        count = math.prod(t.shape)
        return np.frombuffer(self._map, dtype=dt, count=count, offset=t.begin).reshape(t.shape)


# ----------------------------------------------------------------------------- read buffers


#: `fk.save` recycles the memory of the blocks it reads from `fk.open`ed files (`ReadPool`):
#: False, every read into new memory (the page faults of fresh pages, for comparison: bench_merge)
READ_POOL = True


class _Owner:
    """The memory of one recycled read buffer, exposed to NumPy (``__array_interface__``) as the
    base of the array handed out. NumPy keeps such an object as the ``base`` of that array and of
    every view made from it (it collapses base chains only through ndarrays), so the owner dies
    when the last of them does, and only then is its buffer recycled (``weakref.finalize``)."""

    __slots__ = ("__weakref__", "raw")

    def __init__(self, raw: np.ndarray[Any, Any]) -> None:
        self.raw = raw

    @property
    def __array_interface__(self) -> dict[str, Any]:
        return self.raw.__array_interface__


class ReadPool:
    """A free list of the buffers `LazyTensor` reads blocks into while a `fk.save` runs.

    Why: a block read into new memory page-faults every 4 KiB of it (glibc hands freed blocks of
    megabytes back to the kernel, so the next block's pages are new again): 160,000-215,000 faults
    and 0.3-0.6 s of a 1-1.6 s linear merge of three 220 MB float32 checkpoints, about 490,000 for
    TIES, which reads its inputs three times (bench_merge's "read pool off" rows). A buffer is
    reused only once nothing refers to the array read into it (`_Owner`), so an array kept by
    anyone is never overwritten. A read takes the buffer freed last where it fits (at least the
    block's size, at most twice it) and new memory otherwise, of the block's size class (`CLASSES`:
    the next power of two, so that the blocks of one checkpoint -- 2 MiB, and 2,095,104 bytes for a
    row of 2,816 float32 -- share buffers); a freed buffer that does not fit is dropped rather than
    put back, where it would be the next read's misfit again (before `CLASSES`, 147 of the linear
    merge's 342 reads made new memory that way: 56,000-123,000 page faults against 16,000-28,000;
    bench_merge's "read pool without size classes" rows); at most `KEEP` buffers wait (a task's
    three inputs and one more: each kept buffer is resident memory, 6-9 MB more peak RSS in that
    merge), and the list is emptied when the last save ends (`active`, counted, for saves in several
    threads), so nothing is kept afterwards. Blocks below `SMALL` bytes are not pooled (malloc
    serves those from memory it keeps). Workers in other processes (``dask.distributed``) read
    into new memory."""

    KEEP = 4
    SMALL = 2**18
    #: buffers in power-of-two size classes, a misfit dropped (False: each buffer of its block's size,
    #: a misfit put back; the comparison)
    CLASSES = True

    def __init__(self) -> None:
        self._free: list[np.ndarray[Any, Any]] = []
        self._saves = 0
        self._lock = threading.Lock()  # taken to start and end a save, never on a read
        self.reused = 0  # buffers handed out again (tests and benchmarks read it)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self._lock:
            self._saves += 1
        try:
            yield
        finally:
            with self._lock:
                self._saves -= 1
                if not self._saves:
                    self._free = []

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        """A new array of `shape` and `dtype` (its contents undefined, as ``np.empty``'s)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if not (READ_POOL and self._saves and nbytes >= self.SMALL):
            return np.empty(shape, dtype)
        free = self._free
        try:
            raw: np.ndarray[Any, Any] | None = free.pop()  # one atomic step: no two reads get one buffer
        except IndexError:
            raw = None
        if raw is not None and not nbytes <= raw.nbytes <= 2 * nbytes:  # the last one freed is another size
            if not self.CLASSES:
                self._give_back(free, raw)
            raw = None  # (CLASSES: dropped, its memory freed)
        if raw is None:
            raw = np.empty(1 << (nbytes - 1).bit_length() if self.CLASSES else nbytes, np.uint8)
        else:
            self.reused += 1
        owner = _Owner(raw[:nbytes])
        weakref.finalize(owner, self._give_back, free, raw).atexit = False
        return np.asarray(owner).view(dtype).reshape(shape)

    def _give_back(self, free: list[np.ndarray[Any, Any]], raw: np.ndarray[Any, Any]) -> None:
        if self._saves and len(free) < self.KEEP:
            free.append(raw)


POOL = ReadPool()


class LazyTensor:
    """A picklable, array-like view of one stored tensor for ``dask.array.from_array``.

    Holds only the path, the file's identity (device, inode, size,
    modification time), place, shape and dtype; each ``[...]`` opens the
    file, checks it is still the one opened (a `StructureError` otherwise:
    the offsets would point into another file), reads the requested rows into
    a new array and closes it, so a Dask worker in another process reads the
    file itself and a truncated file gives an error, never a crash.
    ``reads`` counts the bytes read per path in this process (benchmarks use it).
    """

    reads: dict[str, int] = {}  # noqa: RUF012 -- a process-wide counter, by design

    def __init__(self, info: TensorInfo) -> None:
        self.path, self.key, self.begin, self.ident = info.path, info.key, info.begin, info.ident
        self.shape = info.shape
        self.name = info.name
        self.dtype = real_dtype(info.name, f"the tensor {info.key!r} of {info.path}")
        self.ndim = len(self.shape)

    def __getitem__(self, index: Any) -> np.ndarray[Any, Any]:
        index = index if isinstance(index, tuple) else (index,)
        shape = self.shape
        out: np.ndarray[Any, Any]
        if not shape:
            out = self._read(0, 1).reshape(())[index]
            return out
        first = index[0] if index else slice(None)
        if isinstance(first, slice) and first.step in (None, 1):
            lo, hi, _ = first.indices(shape[0])
            hi = max(hi, lo)
            rest: tuple[Any, ...] = (slice(None), *index[1:])
        else:
            lo, hi, rest = 0, shape[0], index
        out = self._read(lo, hi)[rest]
        return out

    def _read(self, lo: int, hi: int) -> np.ndarray[Any, Any]:
        """Rows ``lo:hi`` (along the first axis) read from the file, after checking it is the same file."""
        rows = (hi - lo, *self.shape[1:]) if self.shape else ()
        row = math.prod(self.shape[1:])
        nbytes = (hi - lo) * row * self.dtype.itemsize if self.shape else self.dtype.itemsize
        out = POOL.empty(rows, self.dtype)
        try:
            f = open_regular(self.path, "checkpoint file")
        except (OSError, StructureError) as e:
            msg = f"reading the tensor {self.key!r} of {self.path} failed ({e}); was the file moved or removed?"
            raise OSError(msg) from None
        with f:
            now = _identity(f)
            if now != self.ident:
                raise self._changed(now)
            if nbytes:
                start = self.begin + lo * row * self.dtype.itemsize
                _read_into(f, out.reshape(-1).view(np.uint8), start, self.path, self.key)
        LazyTensor.reads[self.path] = LazyTensor.reads.get(self.path, 0) + nbytes
        return out

    def _changed(self, now: tuple[int, ...]) -> StructureError:
        names = ("device", "inode", "size", "modification time (ns)")
        diff = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(names, self.ident, now) if a != b)
        return StructureError(
            f"{self.path}: the file changed since fk.open read its header ({diff}), so the tensor "
            f"{self.key!r} would be read at the old offsets from another file. Fix: call fk.open again "
            "(or fk.load the checkpoint before it is rewritten)."
        )


# ----------------------------------------------------------------------------- checkpoints


def _plain_name(folder: str, name: Any, index: str) -> str:
    """`name` joined to `folder`, if it is a plain file name there (no separator, no ``..``, no
    absolute path, no symlink leading out of `folder`); a `StructureError` otherwise."""
    ok = (
        type(name) is str
        and name not in ("", ".", "..")
        and "/" not in name
        and os.sep not in name
        and (os.altsep is None or os.altsep not in name)
        and "\x00" not in name
    )
    if not ok:
        msg = (
            f"{index}: the shard name {short(name)} is not a plain file name; a shard index names files "
            "inside its own directory (no '/', '..' or absolute paths). Fix: write the checkpoint again "
            "(a hostile or hand-edited index?)."
        )
        raise StructureError(msg)
    full = os.path.join(folder, name)
    if os.path.dirname(os.path.realpath(full)) != os.path.realpath(folder):
        msg = (
            f"{index}: the shard {name!r} is a symbolic link to {os.path.realpath(full)}, outside the "
            f"checkpoint directory {folder}; functorkit reads shards only inside it. Fix: copy the shard "
            "into the directory."
        )
        raise StructureError(msg)
    return full


def read_index(path: str, metadata: dict[str, Any] | None = None) -> dict[str, str]:
    """``{key: shard file name}`` of a Hugging Face style ``model.safetensors.index.json``, each name
    checked to be a plain file of the index's directory; its ``metadata`` object copied into
    `metadata` when given."""
    with open_regular(path, "shard index") as f:
        if os.fstat(f.fileno()).st_size > _MAX_HEADER:
            raise bad_file(path, f"the index is larger than {_MAX_HEADER} bytes")
        raw = f.read(_MAX_HEADER + 1)
    doc = loads_json(raw, path, "index")
    wm = doc.get("weight_map")
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise bad_file(path, "the index has no `weight_map` object of key -> shard file name")
    folder = os.path.dirname(path)
    for name in set(wm.values()):
        _plain_name(folder, name, path)
    if metadata is not None and isinstance(doc.get("metadata"), dict):
        metadata.update(doc["metadata"])
    return wm


class Stored:
    """A stored tensor, handed to the adapters' ``from_stored``."""

    __slots__ = ("file", "info")

    def __init__(self, file: SafetensorsFile, info: TensorInfo) -> None:
        self.file, self.info = file, info

    name = property(lambda self: self.info.name)
    shape = property(lambda self: self.info.shape)

    def raw(self) -> np.ndarray[Any, Any]:
        """The bytes as the stand-in dtype: a new array owning its memory (a view of the copy-on-write
        map with ``mmap=True``)."""
        return self.file.raw(self.info.key)

    def array(self) -> np.ndarray[Any, Any]:
        dt = real_dtype(self.info.name, f"the tensor {self.info.key!r} of {self.info.path}")
        return self.raw().view(dt)

    def lazy(self) -> LazyTensor:
        return LazyTensor(self.info)


class Checkpoint:
    """Every stored tensor of a file or sharded directory, and the ties recorded there.

    The files stay open until `close` (tensors are read from the files whose
    headers were checked); use it as a context manager."""

    def __init__(self, path: str | os.PathLike[str], fname: str, *, mmap: bool = False) -> None:
        self.where = p = os.fspath(path)
        self.index: dict[str, str] = {}
        self.index_meta: dict[str, Any] = {}
        self.files: list[SafetensorsFile] = []
        if os.path.isdir(p):
            paths = self._shards(p)
        elif os.path.lexists(p):
            paths = [p]
        else:
            msg = f"fk.{fname}: {p} does not exist; expected a .safetensors file or a directory of shards."
            raise FileNotFoundError(msg)
        try:
            self._read(paths, fname, mmap)
        except BaseException:
            self.close()
            raise

    def _read(self, paths: list[str], fname: str, mmap: bool) -> None:
        self.tensors: dict[str, Stored] = {}
        meta: dict[str, str] | None = None
        for fp in paths:
            sf = SafetensorsFile(fp, mmap=mmap)
            self.files.append(sf)
            meta = sf.metadata if meta is None else meta
            for key, info in sf.tensors.items():
                if key in self.tensors:
                    msg = f"fk.{fname}: the key {key!r} is stored twice, in {self.tensors[key].info.path} and {fp}."
                    raise StructureError(msg)
                if self.index and self.index.get(key) != os.path.basename(fp):
                    msg = (
                        f"fk.{fname}: the shard {fp} holds {key!r}, which the index {INDEX} places in "
                        f"{self.index.get(key)!r}; fix: write the checkpoint again."
                    )
                    raise StructureError(msg)
                self.tensors[key] = Stored(sf, info)
        for key, shard in self.index.items():
            if key not in self.tensors:
                msg = (
                    f"fk.{fname}: the index {os.path.join(self.where, INDEX)} places {key!r} in {shard}, which "
                    "has no such tensor; fix: write the checkpoint again."
                )
                raise StructureError(msg)
        if self.index_meta:  # pieces of sharded tensors (fk.save of DTensors) made whole
            self.tensors = assemble(self.tensors, self.index_meta, os.path.join(self.where, INDEX))
        self.metadata = meta or {}
        self.aliases = self._ties(self.metadata)

    def close(self) -> None:
        for sf in self.files:
            sf.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _shards(self, p: str) -> list[str]:
        ip = os.path.join(p, INDEX)
        if os.path.lexists(ip):
            self.index = read_index(ip, self.index_meta)
            names = list(dict.fromkeys(self.index.values()))
            for n in names:
                if not os.path.lexists(os.path.join(p, n)):
                    msg = (
                        f"{os.path.join(p, n)}: missing shard of the checkpoint {p} (the index {INDEX} "
                        f"lists it for {sum(v == n for v in self.index.values())} tensors); expected it there: "
                        "copy it back or write the checkpoint again."
                    )
                    raise FileNotFoundError(msg)
            return [os.path.join(p, n) for n in names]
        names = sorted(n for n in os.listdir(p) if n.endswith(".safetensors") and not n.startswith("."))
        if len(names) != 1:
            msg = f"{p}: a checkpoint directory holds {INDEX} or exactly one .safetensors file; found {names}."
            raise FileNotFoundError(msg)
        return [_plain_name(p, names[0], p)]

    def _ties(self, meta: dict[str, str]) -> dict[str, str]:
        """``{alias: stored key}``: functorkit's record (the other metadata is the user's, never read);
        in a file without it, the ``{removed: kept}`` entries of ``safetensors.torch.save_model``."""
        if TIES in meta:
            try:
                ties = json.loads(meta[TIES])
            except (ValueError, RecursionError):
                ties = None
            if (
                not isinstance(ties, dict)
                or not all(type(v) is str and v in self.tensors for v in ties.values())
                or any(k in self.tensors or unicode_problem(k) for k in ties)
            ):
                msg = (
                    f"{self.where}: the metadata {TIES!r} is not a JSON mapping of alias to stored key "
                    f"({short(meta[TIES])}); fix: write the checkpoint again."
                )
                raise StructureError(msg)
            return {str(k): v for k, v in ties.items()}
        return {k: v for k, v in meta.items() if v in self.tensors and k not in self.tensors}

    def file_of(self, key: str) -> str:
        return self.tensors[self.aliases.get(key, key)].info.path
