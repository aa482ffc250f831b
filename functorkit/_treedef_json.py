"""A data-only JSON form of a `TreeDef` (SPEC section 16): ``td.to_json()`` / ``TreeDef.from_json``.

Written from the definition's pickled state (``TreeDef.__reduce__``: the program with node
classes, position and leaf counts, ties, trainable flags), so it follows the program format of
``_treedef.py`` without reading its fields. Node classes are written as names and resolved only
from functorkit's own table (`BUILTIN_CLASSES`) and the caller's allow-list, never imported;
aux data and keys must be JSON values (None, bool, int, finite float, str, and lists, tuples
and dicts of them, tagged so that a tuple comes back a tuple). Every field of a document is
checked before a definition is made: a hostile document is a `ValueError` (or a
`StructureError` for a class that is not a node here), never a raw error, a hang or a large
allocation. See ``docs/treedef.md`` and ``docs/guarantees.md``.
"""

from __future__ import annotations

import collections
import json
import math
import pickle
import types
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import StructureError
from ._registry import NodeDef, resolve
from ._structured import Diagonal, Transpose

__all__ = ["BUILTIN_CLASSES", "from_json", "to_json"]

FORMAT = "functorkit.treedef"
VERSION = 1
#: how deeply aux data may nest in a document
MAX_DEPTH = 64
#: the largest document `from_json` reads (characters)
MAX_CHARS = 64 * 1024 * 1024

#: functorkit's own table: the node classes a document may name without an allow-list
BUILTIN_CLASSES: dict[str, type] = {
    "dict": dict,
    "list": list,
    "tuple": tuple,
    "collections.OrderedDict": collections.OrderedDict,
    "collections.defaultdict": collections.defaultdict,
    "collections.deque": collections.deque,
    "collections.UserDict": collections.UserDict,
    "collections.UserList": collections.UserList,
    "types.SimpleNamespace": types.SimpleNamespace,
    "types.MappingProxyType": types.MappingProxyType,
    "functorkit.Diagonal": Diagonal,
    "functorkit.Transpose": Transpose,
}
_BUILTIN_NAMES = {cls: name for name, cls in BUILTIN_CLASSES.items()}


def class_name(cls: type | str) -> str:
    """The name a document gives `cls`: functorkit's table's, else ``module.qualname`` (a name
    already, where the pickled program names a class pickle cannot: ``_program._BY_NAME``)."""
    if isinstance(cls, str):
        return cls
    return _BUILTIN_NAMES.get(cls) or f"{cls.__module__}.{cls.__qualname__}"


# --------------------------------------------------------------------------- values


class _Unencodable(Exception):
    def __init__(self, what: str) -> None:
        self.what = what


def _encode(v: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise _Unencodable(f"aux data nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        if not math.isfinite(v):
            raise _Unencodable(f"the float {v!r} (JSON has no NaN or infinity)")
        return v
    if t is list:
        return [_encode(x, depth + 1) for x in v]
    if t is tuple:
        return {"tuple": [_encode(x, depth + 1) for x in v]}
    if t is dict:
        return {"dict": [[_encode(k, depth + 1), _encode(x, depth + 1)] for k, x in v.items()]}
    raise _Unencodable(f"a {t.__module__}.{t.__qualname__} ({_short(v)})")


def _short(v: Any) -> str:
    try:
        r = repr(v)
    except Exception:  # noqa: BLE001 -- a repr that raises: the type is enough
        return "unprintable"
    return r if len(r) <= 60 else r[:57] + "..."


def _bad(msg: str) -> ValueError:
    return ValueError(f"fk.TreeDef.from_json: {msg}")


def _decode(v: Any, where: str, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise _bad(f"{where}: nested deeper than {MAX_DEPTH} levels.")
    t = type(v)
    if v is None or t is bool or t is int or t is str or t is float:
        return v
    if t is list:
        return [_decode(x, where, depth + 1) for x in v]
    if t is dict and len(v) == 1:
        ((tag, body),) = v.items()
        if tag == "tuple" and type(body) is list:
            return tuple(_decode(x, where, depth + 1) for x in body)
        if tag == "dict" and type(body) is list:
            out: dict[Any, Any] = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise _bad(f"{where}: a dict entry must be a [key, value] pair, got {_short(pair)}.")
                k = _decode(pair[0], where, depth + 1)
                try:
                    out[k] = _decode(pair[1], where, depth + 1)
                except TypeError:
                    raise _bad(f"{where}: an unhashable dict key {_short(k)}.") from None
            return out
    raise _bad(f"{where}: {_short(v)} is not an encoded value (a JSON scalar, a list, or a tagged tuple/dict).")


# --------------------------------------------------------------------------- to_json


def to_json(td: Any) -> str:
    """``td.to_json()``: the definition as a JSON document of data only."""
    state = td.__reduce__()[1][0]
    if type(state) is not tuple or len(state) != 6:
        msg = "TreeDef.to_json: this TreeDef's state has a layout this codec does not know (a newer functorkit?)."
        raise TypeError(msg)
    prog, npos, nleaves, pos_leaf, trainable, forced = state
    entries: list[Any] = []
    for idx, e in enumerate(prog):
        if e is None:
            entries.append(None)
        elif type(e) is int:
            entries.append({"ref": e})
        else:
            cls, keys, n, leafy, aux, named = e
            try:
                ek = None if keys is None else [_encode(k) for k in keys]
            except _Unencodable as u:
                raise _to_json_error(td, idx, cls, "a child key", u) from None
            try:
                ea = _encode(aux)
            except _Unencodable as u:
                raise _to_json_error(td, idx, cls, "its static (aux) data", u) from None
            entries.append({"node": class_name(cls), "keys": ek, "n": n, "leafy": leafy, "aux": ea, "named": named})
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "positions": npos,
        "leaves": nleaves,
        "ties": None if pos_leaf is None else list(pos_leaf),
        "trainable": None if trainable is None else list(trainable),
        "forced": list(forced),
        "program": entries,
    }
    return json.dumps(doc, allow_nan=False, separators=(",", ":"))


def _to_json_error(td: Any, idx: int, cls: type, what: str, u: _Unencodable) -> TypeError:
    return TypeError(
        f"at {td.entry_path(idx).display}: TreeDef.to_json: {what} of the {cls.__qualname__} node holds "
        f"{u.what}, which is not JSON data. Expected None, bool, int, finite float, str, or lists, tuples "
        "and dicts of them; fix: keep only such data in the node's aux (e.g. a dataclass's static fields), "
        "or pickle the TreeDef instead (pickle.dumps(td))."
    )


# --------------------------------------------------------------------------- from_json


def _allow_list(classes: Any) -> dict[str, type]:
    if classes is None:
        return {}
    if isinstance(classes, Mapping):
        items = list(classes.items())
    elif isinstance(classes, (list, tuple, set, frozenset)):
        items = [(class_name(c) if isinstance(c, type) else c, c) for c in classes]
    else:
        msg = (
            "fk.TreeDef.from_json: `classes` must be a mapping {name: class} or a sequence of classes, got "
            f"{type(classes).__name__}."
        )
        raise TypeError(msg)
    out: dict[str, type] = {}
    for name, c in items:
        if type(name) is not str or not isinstance(c, type):
            msg = f"fk.TreeDef.from_json: `classes` must map names (str) to classes, got {_short(name)}: {_short(c)}."
            raise TypeError(msg)
        out[name] = c
    return out


def _int(v: Any, what: str, lo: int = 0, hi: int | None = None) -> int:
    if type(v) is not int or v < lo or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise _bad(f"`{what}` must be an int {rng}, got {_short(v)}.")
    return v


def from_json(text: Any, restore: Callable[[Any], Any], *, classes: Any = None) -> Any:
    """``fk.TreeDef.from_json(text, classes=...)``: the definition a `to_json` document describes.

    `restore` is ``_treedef._restore_treedef`` (the checked constructor from a plain state), passed
    in by `TreeDef.from_json` so that this module does not import back up into ``_treedef``."""
    allowed = _allow_list(classes)
    if not isinstance(text, (str, bytes, bytearray)):
        msg = f"fk.TreeDef.from_json: expected a str (a document made by TreeDef.to_json), got {type(text).__name__}."
        raise TypeError(msg)
    if len(text) > MAX_CHARS:
        raise _bad(f"the document is {len(text)} characters long, more than the {MAX_CHARS} read.")
    try:
        doc = json.loads(text)
    except RecursionError:
        raise _bad("the document nests too deeply.") from None
    except ValueError as err:  # json.JSONDecodeError, an integer too long to convert, bad UTF-8
        raise _bad(f"not a JSON document ({err}).") from None
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise _bad(f'not a TreeDef document (expected a JSON object with "format": "{FORMAT}").')
    if doc.get("version") != VERSION:
        raise _bad(f"unknown version {_short(doc.get('version'))}; this functorkit reads version {VERSION}.")
    known = {"format", "version", "positions", "leaves", "ties", "trainable", "forced", "program"}
    if set(doc) != known:
        raise _bad(f"expected the fields {sorted(known)}, got {sorted(map(str, doc))}.")
    program = doc["program"]
    if type(program) is not list:
        raise _bad("`program` must be a list.")
    npos = _int(doc["positions"], "positions", 0, 2 * len(text))
    nleaves = _int(doc["leaves"], "leaves", 0, npos)
    prog: list[Any] = []
    built = 0  # values on the build stack
    positions = 0
    for idx, e in enumerate(program):
        where = f"program entry {idx}"
        if e is None:
            prog.append(None)
            positions += 1
            built += 1
            continue
        if type(e) is not dict:
            raise _bad(f'{where}: expected null, {{"ref": k}} or a node object, got {_short(e)}.')
        if set(e) == {"ref"}:
            if not idx:
                raise _bad(f"{where}: a shared sub-tree cannot come first.")
            k = _int(e["ref"], f"{where}.ref", 0, idx - 1)
            if type(prog[k]) is not tuple:
                raise _bad(f"{where}: a shared sub-tree must refer to a node entry, entry {k} is not one.")
            prog.append(k)
            built += 1
            continue
        if set(e) != {"node", "keys", "n", "leafy", "aux", "named"}:
            raise _bad(f"{where}: a node needs the fields node, keys, n, leafy, aux, named; got {sorted(map(str, e))}.")
        name = e["node"]
        if type(name) is not str:
            raise _bad(f"{where}: `node` must be a class name (str), got {_short(name)}.")
        cls = allowed.get(name) or BUILTIN_CLASSES.get(name)
        if cls is None:
            raise _bad(
                f"{where}: the class {name!r} is neither one of functorkit's own node classes nor in `classes`; "
                f"fix: pass it, e.g. fk.TreeDef.from_json(text, classes=[{name.rpartition('.')[2]}]). "
                "Classes are never imported by name."
            )
        nd = resolve(cls)
        if not isinstance(nd, NodeDef):
            msg = (
                f"fk.TreeDef.from_json: {where}: {cls.__qualname__} is not registered as a node in this process; "
                "register it (fk.register) first."
            )
            raise StructureError(msg)
        n = _int(e["n"], f"{where}.n", 0, len(text))
        leafy, named = e["leafy"], e["named"]
        if type(leafy) is not bool or type(named) is not bool:
            raise _bad(f"{where}: `leafy` and `named` must be true or false.")
        keys = e["keys"]
        if keys is not None:
            if type(keys) is not list or len(keys) != n:
                raise _bad(f"{where}: `keys` must be null or a list of {n} keys.")
            keys = [_decode(k, f"{where}.keys") for k in keys]
        aux = _decode(e["aux"], f"{where}.aux")
        # the entry must be one the class's own flatten makes: else the rebuild would raise a raw
        # error later, or silently make another object (a namedtuple's fields swapped, a deque's
        # maxlen dropping items, a dataclass given attributes that are not its fields)
        problem = None if nd.check is None else nd.check(keys, n, aux, named)
        if problem is not None:
            raise _bad(f"{where}: a {name} node that this class cannot make: {problem}.")
        if leafy:
            positions += n
        else:
            if n > built:
                raise _bad(f"{where}: a node of {n} children after only {built} built values.")
            built -= n
        built += 1
        prog.append((cls, keys, n, leafy, aux, named))
    if program and built != 1:
        raise _bad(f"the program builds {built} trees, expected 1.")
    if not program:
        raise _bad("the program is empty.")
    if positions != npos:
        raise _bad(f"`positions` is {npos} but the program has {positions} leaf positions.")
    ties = doc["ties"]
    pos_leaf: tuple[int, ...] | None = None
    if ties is None:
        if nleaves != npos:
            raise _bad(f"`leaves` is {nleaves} but, without ties, must equal `positions` ({npos}).")
    else:
        if type(ties) is not list or len(ties) != npos:
            raise _bad(f"`ties` must be null or a list of {npos} leaf indices.")
        nxt = 0
        for j in ties:
            if type(j) is not int or not 0 <= j <= nxt or j >= nleaves:
                raise _bad("`ties` must number the leaves 0, 1, ... in order of first appearance.")
            if j == nxt:
                nxt += 1
        if nxt != nleaves:
            raise _bad(f"`ties` name {nxt} leaves but `leaves` is {nleaves}.")
        pos_leaf = tuple(ties)
    trainable = doc["trainable"]
    if trainable is not None:
        if type(trainable) is not list or len(trainable) != nleaves or any(type(b) is not bool for b in trainable):
            raise _bad(f"`trainable` must be null or a list of {nleaves} booleans.")
        trainable = tuple(trainable)
    forced = doc["forced"]
    if type(forced) is not list or any(type(j) is not int or not 0 <= j < npos for j in forced):
        raise _bad("`forced` must be a list of leaf positions.")
    try:
        return restore((prog, npos, nleaves, pos_leaf, trainable, sorted(set(forced))))
    except pickle.UnpicklingError:
        raise _bad("the document is inconsistent.") from None
