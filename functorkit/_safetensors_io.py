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

Tensors are handed around as NumPy arrays. Dtypes NumPy lacks (bfloat16,
float8) travel as a same-width unsigned integer stand-in together with their
name; `real_dtype` gives the true NumPy dtype through ``ml_dtypes``
where it is installed. `Checkpoint` gathers the tensors of a file or of a
sharded directory (Hugging Face's ``model.safetensors.index.json``) and the ties
recorded in their metadata.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ._errors import StructureError

__all__ = [
    "CODE_OF",
    "INDEX",
    "NAME_OF",
    "TIES",
    "Checkpoint",
    "Stored",
    "LazyTensor",
    "SafetensorsFile",
    "TensorInfo",
    "header_bytes",
    "real_dtype",
    "stand_in",
]

#: dtype name (``describe_dtype`` of a NumPy, torch or JAX dtype) -> safetensors code
CODE_OF: dict[str, str] = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
NAME_OF: dict[str, str] = {v: k for k, v in CODE_OF.items()}
_ML_DTYPES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e5m2"})
#: refuse headers larger than this (the reference implementation's limit)
_MAX_HEADER = 100_000_000


def stand_in(name: str) -> np.dtype[Any]:
    """The little-endian NumPy dtype holding dtype `name`'s bytes (an unsigned int for bf16/float8)."""
    if name in _ML_DTYPES:
        return np.dtype("<u2" if name == "bfloat16" else "u1")
    return np.dtype(name).newbyteorder("<") if name != "bool" else np.dtype(bool)


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


class TensorInfo:
    """One tensor of a file: key, dtype name, shape, and where its bytes lie."""

    __slots__ = ("begin", "end", "key", "name", "path", "shape")

    def __init__(self, path: str, key: str, name: str, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.path, self.key, self.name, self.shape, self.begin, self.end = path, key, name, shape, begin, end

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


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


def _bad(path: str, what: str) -> StructureError:
    return StructureError(
        f"{path}: not a valid safetensors file: {what}. Expected a file written by fk.save or "
        "safetensors; fix: write it again (a copy may have been cut short)."
    )


class SafetensorsFile:
    """A parsed header; tensors are read through one copy-on-write memory map of the whole file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = p = os.fspath(path)
        try:
            size = os.path.getsize(p)
            with open(p, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise _bad(p, f"it has {len(raw)} bytes, fewer than the 8-byte header length")
                (n,) = struct.unpack("<Q", raw)
                if n > min(_MAX_HEADER, size - 8):
                    raise _bad(p, f"the header length {n} exceeds the file ({size} bytes)")
                text = f.read(n)
        except FileNotFoundError:
            msg = f"{p}: no such checkpoint file; check the path (a missing shard of a sharded checkpoint?)."
            raise FileNotFoundError(msg) from None
        try:
            head = json.loads(text)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _bad(p, f"its header is not JSON ({e})") from None
        if not isinstance(head, dict):
            raise _bad(p, "its header is not a JSON object")
        meta = head.pop("__metadata__", None) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise _bad(p, "`__metadata__` is not a mapping of strings")
        self.metadata: dict[str, str] = meta
        self.data_start = 8 + n
        data_size = size - self.data_start
        self.tensors: dict[str, TensorInfo] = {}
        for key, entry in head.items():
            self.tensors[key] = self._entry(key, entry, data_size)
        self._map: np.memmap[Any, Any] | None = None

    def _entry(self, key: str, e: Any, data_size: int) -> TensorInfo:
        p = self.path
        if not isinstance(e, dict) or e.get("dtype") not in NAME_OF:
            raise _bad(p, f"the entry of {key!r} has no known dtype ({e!r:.200})")
        shape, offs = e.get("shape"), e.get("data_offsets")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise _bad(p, f"the shape of {key!r} is not a list of non-negative ints")
        if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
            raise _bad(p, f"the data offsets of {key!r} are not two non-negative ints")
        name = NAME_OF[e["dtype"]]
        begin, end = offs
        if end - begin != math.prod(shape) * stand_in(name).itemsize:
            raise _bad(p, f"{key!r} has {end - begin} bytes for shape {tuple(shape)} of {name}")
        if end > data_size:
            msg = (
                f"{p}: the file is truncated: the tensor {key!r} needs bytes up to {end} of the data "
                f"section, which has only {data_size}. Fix: write or download the file again."
            )
            raise StructureError(msg)
        return TensorInfo(p, key, name, tuple(shape), self.data_start + begin, self.data_start + end)

    def raw(self, key: str) -> np.ndarray[Any, Any]:
        """The tensor's bytes as a stand-in-dtype array over the file's copy-on-write map (no read yet)."""
        t = self.tensors[key]
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="c")
        count = math.prod(t.shape)
        return np.frombuffer(self._map, dtype=stand_in(t.name), count=count, offset=t.begin).reshape(t.shape)


class LazyTensor:
    """A picklable, array-like view of one stored tensor for ``dask.array.from_array``.

    Holds only the path, place, shape and dtype; each ``[...]`` maps the
    file, copies the requested rows out and unmaps it again, so a Dask
    worker in another process reads the file itself, and pages read are not
    kept mapped (peak memory stays near one block). ``reads`` counts the
    bytes read per path in this process (benchmarks use it).
    """

    reads: dict[str, int] = {}  # noqa: RUF012 -- a process-wide counter, by design

    def __init__(self, info: TensorInfo) -> None:
        self.path, self.key, self.begin = info.path, info.key, info.begin
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
        """Rows ``lo:hi`` (along the first axis) copied out of a short-lived map of the file."""
        rows = (hi - lo, *self.shape[1:]) if self.shape else ()
        row = math.prod(self.shape[1:])
        nbytes = (hi - lo) * row * self.dtype.itemsize if self.shape else self.dtype.itemsize
        if nbytes == 0:
            return np.empty(rows, dtype=self.dtype)
        try:
            mm = np.memmap(
                self.path, dtype=np.uint8, mode="r", offset=self.begin + lo * row * self.dtype.itemsize, shape=(nbytes,)
            )
        except (OSError, ValueError) as e:
            msg = f"reading the tensor {self.key!r} of {self.path} failed ({e}); was the file moved or cut short?"
            raise OSError(msg) from None
        out = np.array(mm.view(self.dtype).reshape(rows))
        del mm
        LazyTensor.reads[self.path] = LazyTensor.reads.get(self.path, 0) + nbytes
        return out


def iter_index(path: str) -> Iterator[tuple[str, str]]:
    """``(key, shard file name)`` pairs of a Hugging Face style ``model.safetensors.index.json``."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except json.JSONDecodeError as e:
        raise _bad(path, f"the index is not JSON ({e})") from None
    wm = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise _bad(path, "the index has no `weight_map` of key -> shard file name")
    yield from wm.items()


INDEX = "model.safetensors.index.json"
#: the metadata key of the ties fk.save records (``{alias: stored key}`` as JSON)
TIES = "functorkit.ties"


class Stored:
    """A stored tensor, handed to the adapters' ``from_stored``."""

    __slots__ = ("file", "info")

    def __init__(self, file: SafetensorsFile, info: TensorInfo) -> None:
        self.file, self.info = file, info

    name = property(lambda self: self.info.name)
    shape = property(lambda self: self.info.shape)

    def raw(self) -> np.ndarray[Any, Any]:
        return self.file.raw(self.info.key)

    def array(self) -> np.ndarray[Any, Any]:
        dt = real_dtype(self.info.name, f"the tensor {self.info.key!r} of {self.info.path}")
        return self.raw().view(dt)

    def lazy(self) -> LazyTensor:
        return LazyTensor(self.info)


class Checkpoint:
    """Every stored tensor of a file or sharded directory, and the ties recorded there."""

    def __init__(self, path: str | os.PathLike[str], fname: str) -> None:
        self.where = p = os.fspath(path)
        self.index: dict[str, str] = {}
        if os.path.isdir(p):
            files = self._shards(p)
        elif os.path.exists(p):
            files = [p]
        else:
            msg = f"fk.{fname}: {p} does not exist; expected a .safetensors file or a directory of shards."
            raise FileNotFoundError(msg)
        self.tensors: dict[str, Stored] = {}
        meta: dict[str, str] = {}
        for fp in files:
            sf = SafetensorsFile(fp)
            meta = meta or sf.metadata
            for key, info in sf.tensors.items():
                if key in self.tensors:
                    msg = f"fk.{fname}: the key {key!r} is stored twice, in {self.tensors[key].info.path} and {fp}."
                    raise StructureError(msg)
                self.tensors[key] = Stored(sf, info)
        for key, shard in self.index.items():
            if key not in self.tensors:
                msg = (
                    f"fk.{fname}: the index {os.path.join(p, INDEX)} places {key!r} in {shard}, which has no "
                    "such tensor; fix: write the checkpoint again."
                )
                raise StructureError(msg)
        self.aliases = self._ties(meta)

    def _shards(self, p: str) -> list[str]:
        ip = os.path.join(p, INDEX)
        if os.path.exists(ip):
            self.index = dict(iter_index(ip))
            names = list(dict.fromkeys(self.index.values()))
            for n in names:
                if not os.path.exists(os.path.join(p, n)):
                    msg = (
                        f"{os.path.join(p, n)}: missing shard of the checkpoint {p} (the index {INDEX} "
                        f"lists it for {sum(v == n for v in self.index.values())} tensors); expected it there: "
                        "copy it back or write the checkpoint again."
                    )
                    raise FileNotFoundError(msg)
            return [os.path.join(p, n) for n in names]
        names = sorted(n for n in os.listdir(p) if n.endswith(".safetensors"))
        if len(names) != 1:
            msg = f"{p}: a checkpoint directory holds {INDEX} or exactly one .safetensors file; found {names}."
            raise FileNotFoundError(msg)
        return [os.path.join(p, names[0])]

    def _ties(self, meta: dict[str, str]) -> dict[str, str]:
        """``{alias: stored key}``: functorkit's record, else save_model's ``{removed: kept}`` entries."""
        if TIES in meta:
            try:
                ties = json.loads(meta[TIES])
            except json.JSONDecodeError:
                ties = None
            if not isinstance(ties, dict) or not all(v in self.tensors for v in ties.values()):
                msg = f"{self.where}: the metadata {TIES!r} is not a JSON mapping of alias to stored key."
                raise StructureError(msg)
            return {str(k): v for k, v in ties.items() if k not in self.tensors}
        return {k: v for k, v in meta.items() if v in self.tensors and k not in self.tensors}

    def file_of(self, key: str) -> str:
        return self.tensors[self.aliases.get(key, key)].info.path
