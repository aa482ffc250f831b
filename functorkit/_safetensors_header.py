"""The safetensors header: dtypes, and the rules a header must pass before anything is read.

The rules are at least as strict as the ``safetensors`` package's (SPEC
section 13): an 8-byte length no larger than the file and than 100 MB (checked
by the reader, `functorkit._safetensors_io`), UTF-8 JSON without BOM whose top
level is an object, no key twice, no NaN/Infinity, integers of at most 20 digits,
``__metadata__`` an object of strings, known dtypes, shapes of non-negative ints
whose byte size equals the entry's range, ranges contiguous and non-overlapping
from 0 to the end of the file. Every refusal is a `StructureError` naming the
file and the key; nothing is allocated for sizes a header only claims.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ._errors import StructureError

__all__ = [
    "CODE_OF",
    "NAME_OF",
    "TensorInfo",
    "bad_file",
    "loads_json",
    "parse_header",
    "short",
    "stand_in",
    "unicode_problem",
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
#: refuse headers (and shard indexes) larger than this (the reference implementation's limit)
_MAX_HEADER = 100_000_000
#: the longest integer a header may hold (offsets and dims fit in 64 bits: 20 digits)
_MAX_DIGITS = 20
#: the most dimensions a tensor may have (NumPy's ``NPY_MAXDIMS``)
_MAX_NDIM = 64
#: a tensor's non-zero dimensions times its item size stay below this (NumPy's ``npy_intp``)
_MAX_EXTENT = 2**63
#: a ``\\u`` escape of a UTF-16 surrogate; only a text holding one is searched for lone ones
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def stand_in(name: str) -> np.dtype[Any]:
    """The little-endian NumPy dtype holding dtype `name`'s bytes (an unsigned int for bf16/float8)."""
    if name in _ML_DTYPES:
        return np.dtype("<u2" if name == "bfloat16" else "u1")
    return np.dtype(name).newbyteorder("<") if name != "bool" else np.dtype(bool)


class TensorInfo:
    """One tensor of a file: key, dtype name, shape, where its bytes lie, and the file's identity."""

    __slots__ = ("begin", "end", "ident", "key", "name", "path", "shape")

    def __init__(
        self, path: str, key: str, name: str, shape: tuple[int, ...], begin: int, end: int, ident: tuple[int, ...]
    ) -> None:
        self.path, self.key, self.name, self.shape, self.begin, self.end = path, key, name, shape, begin, end
        self.ident = ident

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


def bad_file(path: str, what: str) -> StructureError:
    return StructureError(
        f"{path}: not a valid safetensors file: {what}. Expected a file written by fk.save or "
        "safetensors; fix: write it again (a copy may have been cut short)."
    )


def short(obj: Any) -> str:
    """A repr cut to 80 characters (a hostile header may hold anything)."""
    text = repr(obj) if not isinstance(obj, int) or abs(obj) < 10**_MAX_DIGITS else "<a huge int>"
    return text if len(text) <= 80 else text[:77] + "..."




class _Refused(Exception):
    """A header value refused while the JSON is read (before Python builds it)."""


class _NegativeZero(int):
    """The JSON integer ``-0``: not a plain `int` (``type(x) is int`` fails), so the rule that reads
    it (a shape, an offset) refuses it and names its key, as the ``safetensors`` package does."""

    def __repr__(self) -> str:
        return "-0"


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS:
        msg = f"an integer of {len(text)} digits"
        raise _Refused(msg)
    return _NegativeZero(0) if text == "-0" else int(text)


def _json_constant(text: str) -> Any:
    msg = f"the non-JSON constant {text}"
    raise _Refused(msg)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        msg = f"the key {short(dup)} twice in one object"
        raise _Refused(msg)
    return out


def loads_json(raw: bytes, path: str, what: str) -> Any:
    """Strict JSON: UTF-8 without BOM, no duplicate keys, no NaN/Infinity, integers of at most 20
    digits, bounded nesting; every refusal a `StructureError` naming `path`."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raise bad_file(path, f"its {what} starts with a byte order mark (UTF-8 JSON has none)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_file(path, f"its {what} is not UTF-8 (byte {e.start}: {e.reason}; UTF-16?)") from None
    if not text.startswith("{"):
        raise bad_file(path, f"its {what} does not start with '{{' (found {short(text[:16])})")
    try:
        doc = json.loads(text, object_pairs_hook=_json_object, parse_int=_json_int, parse_constant=_json_constant)
    except _Refused as e:
        raise bad_file(path, f"its {what} holds {e}") from None
    except RecursionError:
        raise bad_file(path, f"its {what} is nested too deeply") from None
    except ValueError as e:  # json.JSONDecodeError, and whatever else json refuses
        raise bad_file(path, f"its {what} is not JSON ({short(str(e))})") from None
    if _SURROGATE_ESCAPE.search(text):  # rare: only then is every string looked at
        where = _lone_surrogate(doc)
        if where is not None:
            shown = " -> ".join([short(k) for k in where[:3]] + ["..."] * (len(where) > 3)) or "the top level"
            raise bad_file(
                path,
                f"its {what} holds a string with a lone UTF-16 surrogate escape (at {shown}), which is not "
                "Unicode (it has no UTF-8 form; the safetensors package refuses it)",
            )
    return doc


def unicode_problem(text: str) -> bool:
    """Whether `text` holds a lone surrogate (no UTF-8 form: no safetensors file can hold it)."""
    return _LONE_SURROGATE.search(text) is not None


def _lone_surrogate(doc: Any) -> tuple[Any, ...] | None:
    """Where in `doc` a string (a key or a value) holds a lone surrogate; ``None`` if nowhere.
    Iterative: a document nested as deeply as the JSON parser allows is no `RecursionError`."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        where, obj = stack.pop()
        if isinstance(obj, str):
            if _LONE_SURROGATE.search(obj):
                return where
            continue
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in items:
            if isinstance(k, str) and _LONE_SURROGATE.search(k):
                return (*where, k)
            stack.append(((*where, k), v))
    return None


def parse_header(
    path: str, raw: bytes, data_size: int, data_start: int, ident: tuple[int, ...]
) -> tuple[dict[str, str], dict[str, TensorInfo]]:
    """The metadata and the tensors of a header, after every rule of the ``safetensors`` package:
    known dtypes, shapes of non-negative ints whose byte size is the range, ranges contiguous and
    non-overlapping from 0 to the end of the file exactly."""
    head = loads_json(raw, path, "header")
    meta = head.pop("__metadata__", None)
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad_file(path, f"the entry '__metadata__' is not an object of strings ({short(meta)})")
    tensors: dict[str, TensorInfo] = {}
    for key, e in head.items():
        tensors[key] = _entry(path, key, e, data_size, data_start, ident)
    pos = 0
    for t in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if t.begin != data_start + pos:
            where = "overlaps the tensor before it" if t.begin < data_start + pos else "leaves a hole before it"
            raise bad_file(
                path,
                f"the tensor {t.key!r} starts at byte {t.begin - data_start} of the data section, which "
                f"{where} (the ranges must follow each other without gaps or overlaps, from 0)",
            )
        pos = t.end - data_start
    if pos != data_size:
        raise bad_file(path, f"the data section has {data_size - pos} bytes after the last tensor (trailing bytes)")
    return meta, tensors


def _entry(path: str, key: str, e: Any, data_size: int, data_start: int, ident: tuple[int, ...]) -> TensorInfo:
    if not isinstance(e, dict):
        raise bad_file(path, f"the entry of {key!r} is not an object ({short(e)})")
    code = e.get("dtype")
    if type(code) is not str or code not in NAME_OF:
        raise bad_file(path, f"the tensor {key!r} has the dtype {short(code)}; expected one of {sorted(NAME_OF)}")
    shape, offs = e.get("shape"), e.get("data_offsets")
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise bad_file(path, f"the shape of {key!r} is not a list of non-negative ints ({short(shape)})")
    if len(shape) > _MAX_NDIM:
        raise bad_file(path, f"the shape of {key!r} has {len(shape)} dimensions; at most {_MAX_NDIM} are allowed")
    if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
        raise bad_file(path, f"the data offsets of {key!r} are not two non-negative ints ({short(offs)})")
    name = NAME_OF[code]
    extent = stand_in(name).itemsize
    for d in shape:  # the non-zero dimensions: an empty tensor's other dimensions must be shapeable too
        extent *= d or 1
        if extent >= _MAX_EXTENT:
            shown = short(tuple(shape))
            raise bad_file(
                path,
                f"the shape {shown} of {key!r} ({name}) is too large for any array library (its non-zero "
                f"dimensions times the item size must stay below 2**63)",
            )
    begin, end = offs
    if end < begin:
        raise bad_file(path, f"the data offsets of {key!r} end before they begin ({begin}, {end})")
    if end > data_size:
        msg = (
            f"{path}: the file is truncated: the tensor {key!r} needs bytes up to {end} of the data "
            f"section, which has only {data_size}. Fix: write or download the file again."
        )
        raise StructureError(msg)
    count, exact = (0 if 0 in shape else 1), True
    for d in shape:  # stops as soon as the size passes the range: no huge product is formed
        count *= d
        if count > end - begin:
            exact = False
            break
    need = count * stand_in(name).itemsize
    if need != end - begin:
        needs = f"{need} bytes" if exact else "more bytes than that"
        shown = short(tuple(shape))
        raise bad_file(path, f"{key!r} has {end - begin} bytes, but its shape {shown} of {name} needs {needs}")
    return TensorInfo(path, key, name, tuple(shape), data_start + begin, data_start + end, ident)
