"""fk.replace: a functional update at key paths, on the one recorded tree definition.

The tree is recorded once (`record`). Each path is read against the
definition's *position index*: the definition built with the number of each
leaf position in place of its value, as plain dicts and lists (``td.build(...,
BUILD_STRUCTURE)``). A path that ends at a number names a leaf position; one
that ends at a plain container names a sub-tree. Leaves are replaced per
distinct leaf, so a tie is replaced at every place it occurs and stays tied,
and a shared sub-tree stays shared (docs/treedef.md, R1 and R2). A sub-tree
target is made a leaf of a second recording (``is_leaf`` stopping at that
object) and replaced there.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath, _dotted_entry, _same_key, make_path, safe_repr
from ._record import record
from ._treedef import BUILD_SAME, BUILD_STRUCTURE, TreeDef

__all__ = ["as_path", "replace"]

_MISS = object()
_SHOWN = 8


def as_path(path: Any, where: str) -> KeyPath:
    """`path` as a KeyPath: a KeyPath, a tuple of entries, or a str in either form (`KeyPath.parse`)."""
    if isinstance(path, KeyPath):
        return path
    if isinstance(path, str):
        return KeyPath.parse(path)
    if type(path) is tuple:
        return KeyPath(path)
    msg = (
        f"{where}: a path must be a fk.KeyPath, a tuple of keys or a str such as 'layers[0].w' or "
        f"'layers.0.w'; got {type(path).__name__} {safe_repr(path)}."
    )
    raise TypeError(msg)


def position_index(td: TreeDef) -> Any:
    """The definition with each leaf position's number in place of its value, as plain dicts/lists/tuples.

    A shared sub-tree is one plain object, so a path through any of its
    places reaches the positions of its first place (the ones rebuilt)."""
    return td.build(list(range(td.num_positions)), BUILD_STRUCTURE)


def _child_keys(node: Any) -> list[Any]:
    return list(node) if type(node) is dict else list(range(len(node)))


def _find_key(node: Any, entry: Any) -> Any:
    """The key of plain node `node` that path entry `entry` names, or _MISS.

    The same key (identity, or equal and of one type), else the same
    ``KeyPath.dotted`` text (so ``'0'`` finds the index 0 and ``0`` the dict
    key ``'0'``)."""
    if type(node) is dict:
        if type(entry) is str and entry in node:
            return entry
        keys: Any = node
    else:
        if type(entry) is int and 0 <= entry < len(node):
            return entry
        keys = range(len(node))
    for k in keys:
        if _same_key(k, entry):
            return k
    text = _dotted_entry(entry)
    for k in keys:
        if _dotted_entry(k) == text:
            return k
    return _MISS


def resolve(index: Any, path: KeyPath, td: TreeDef, where: str) -> tuple[KeyPath, Any]:
    """Follow `path` in the position index: the path in the tree's own keys, and what is there
    (an ``int`` leaf position, or a plain container for a sub-tree).

    An entry that matches no key is also tried joined by dots with the entries
    after it (a dict key ``'a.b'`` written ``a.b``).

    Raises
    ------
    StructureError
        For a path that does not exist, listing the nearest valid keys.
    """
    node = index
    out: list[Any] = []
    i = 0
    n = len(path)
    while i < n:
        if type(node) is int:
            msg = (
                f"{where}: the path {path.display} goes through a leaf at {make_path(tuple(out)).display}; "
                f"expected a node with a child {safe_repr(path[i])}. "
                + _nearest(path, td)
                + " Fix: check the path against fk.leaves_with_path(tree)."
            )
            raise StructureError(msg)
        k = _find_key(node, path[i])
        step = 1
        if k is _MISS and type(node) is dict:
            for m in range(n - i, 1, -1):
                joined = ".".join(_dotted_entry(e) for e in path[i : i + m])
                if joined in node:
                    k, step = joined, m
                    break
        if k is _MISS:
            keys = _child_keys(node)
            shown = ", ".join(safe_repr(c) for c in keys[:_SHOWN]) + (
                f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else ""
            )
            close = difflib.get_close_matches(_dotted_entry(path[i]), [_dotted_entry(c) for c in keys], n=3)
            near = f" Nearest keys here: {', '.join(close)}." if close else ""
            msg = (
                f"{where}: the path {path.display} does not exist: at {make_path(tuple(out)).display} "
                f"expected a child {safe_repr(path[i])}, found the children [{shown}].{near} "
                + _nearest(path, td)
                + " Fix: check the path against fk.leaves_with_path(tree)."
            )
            raise StructureError(msg)
        out.append(k)
        node = node[k]
        i += step
    return make_path(tuple(out)), node


def _nearest(path: KeyPath, td: TreeDef) -> str:
    """'Nearest valid paths: ...' among every leaf position (built only for a message)."""
    texts = {str(p): p.dotted for p in td.expanded().position_paths()}
    want = str(path)
    close = difflib.get_close_matches(want, list(texts), n=3, cutoff=0.5)
    if not close:
        by_dotted = {d: s for s, d in texts.items()}
        close = [by_dotted[d] for d in difflib.get_close_matches(path.dotted, list(by_dotted), n=3, cutoff=0.5)]
    return f"Nearest valid paths: {', '.join(close)}." if close else ""


def _shared_nodes(index: Any) -> set[int]:
    """The ids of the plain containers of the position index met at several places: the shared
    sub-trees of the definition (R2: a mutable node, or one holding an identity-cached leaf or a
    mutable node), which the index builds as one object. Every other container is built anew at
    each place, except the empty tuple (one object in CPython; immutable and empty, never shared)."""
    seen: set[int] = set()
    out: set[int] = set()
    todo = [index]
    while todo:
        x = todo.pop()
        if type(x) is int or (type(x) is tuple and not x):
            continue
        if id(x) in seen:
            out.add(id(x))
            continue
        seen.add(id(x))
        todo.extend(x.values() if type(x) is dict else x)
    return out


def _tie_error(where: str, a: KeyPath, b: KeyPath) -> StructureError:
    msg = (
        f"{where}: the paths {a.display} and {b.display} hold one tied leaf (one object at both places), "
        "and were given two different values; replacing them apart would break the tie. Expected one "
        "value for a tie (it is replaced at every place it occurs); fix: name one of the paths, or "
        "give both the same object."
    )
    return StructureError(msg)


def replace(tree: Any, updates: Mapping[Any, Any], /) -> Any:
    """A new tree with the values at some paths replaced; the input is never changed.

    Parameters
    ----------
    tree
        Any tree functorkit walks.
    updates
        ``{path: value}``. A path is a `KeyPath`, a tuple of keys, or a
        str in the ``str(path)`` form (``layers[0].w``) or the dotted
        state-dict form (``layers.0.w``); see `KeyPath.parse`. A path to
        a leaf replaces that leaf; a path to a node replaces the whole
        sub-tree.

    Returns
    -------
    tree
        The tree rebuilt (nodes are new objects, as from ``fk.fmap``); every
        leaf not replaced is the same object as in `tree`.

    Notes
    -----
    A tied leaf (one object at several places) is replaced at every place it
    occurs, and the new value is tied there; naming two places of one tie
    with two different values is a `StructureError`. A shared
    sub-tree (one node object at several places: a mutable node, even one
    of scalars only, or a node holding arrays) stays shared, so a path
    through any of its places replaces the value in all of them, and a path
    to it replaces it at all of them. An immutable sub-tree of scalars that
    is one object at several places (a tuple of ints, which CPython may
    intern) is not shared: it is replaced at the named place only. Paths may not overlap (one inside another).

    Raises
    ------
    StructureError
        For a path that does not exist (the message lists the nearest valid
        keys), overlapping paths, or a tie given two values.
    TypeError
        If `updates` is not a mapping or a path is not a path.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones(2)
    >>> model = {"layers": [{"w": w, "b": 0.0}], "head": w}
    >>> new = fk.replace(model, {"layers.0.w": np.zeros(2)})
    >>> new["layers"][0]["w"] is new["head"], new["head"]
    (True, array([0., 0.]))
    >>> model["head"]
    array([1., 1.])
    >>> fk.replace(model, {"layers[0]": None})
    {'layers': [None], 'head': array([1., 1.])}
    """
    where = "fk.replace"
    if not isinstance(updates, Mapping):
        msg = f"{where}: `updates` must be a mapping {{path: value}}, got {type(updates).__name__}."
        raise TypeError(msg)
    items = [(as_path(p, where), v) for p, v in updates.items()]
    leaves, td = record(tree)
    index = position_index(td)
    targets: list[tuple[KeyPath, Any, Any]] = []  # (path in the tree's keys, int position or plain node, value)
    for path, v in items:
        rp, at = resolve(index, path, td, where)
        targets.append((rp, at, v))
    _check_overlaps(targets, where)
    if any(len(rp) == 0 for rp, _, _ in targets):
        return targets[0][2]  # the root itself (alone: checked above)
    nodes = [(rp, at, v) for rp, at, v in targets if type(at) is not int]
    if not nodes:
        new = list(leaves)
        pl = td._ties()
        set_by: dict[int, KeyPath] = {}
        for rp, at, v in targets:
            j = at if pl is None else pl[at]
            _assign(new, set_by, j, rp, v, where)
        return td.unflatten(new)
    return _replace_nodes(tree, index, td, targets, where)


def _assign(new: list[Any], set_by: dict[int, KeyPath], j: int, rp: KeyPath, v: Any, where: str) -> None:
    prev = set_by.get(j)
    if prev is not None and new[j] is not v:
        raise _tie_error(where, prev, rp)
    new[j] = v
    set_by[j] = rp


def _check_overlaps(targets: list[tuple[KeyPath, Any, Any]], where: str) -> None:
    ordered = sorted(range(len(targets)), key=lambda k: len(targets[k][0]))
    for a_i, a in enumerate(ordered):
        pa = targets[a][0]
        for b in ordered[a_i + 1 :]:
            pb = targets[b][0]
            if pb[: len(pa)] == pa and (len(pb) > len(pa) or targets[a][2] is not targets[b][2]):
                msg = (
                    f"{where}: the paths {pa.display} and {pb.display} overlap (the second is inside the "
                    "first, or both name one place). Expected each place named once; fix: replace the "
                    "outer sub-tree with a value that already holds the inner change, or drop one path."
                )
                raise StructureError(msg)


def _replace_nodes(tree: Any, index: Any, td: TreeDef, targets: list[tuple[KeyPath, Any, Any]], where: str) -> Any:
    """Replace sub-trees: record again with each target node a leaf, then replace as leaves."""
    stop: dict[int, Any] = {}
    for rp, at, _ in targets:
        if type(at) is not int:
            obj = rp.get(tree)
            stop[id(obj)] = obj
    leaves2, td2 = record(tree, lambda x: id(x) in stop)
    index2 = position_index(td2)
    pl2 = td2._ties()
    shared = _shared_nodes(index)
    new = list(leaves2)
    set_by: dict[int, KeyPath] = {}
    alone: list[tuple[int, KeyPath, Any]] = []  # (position, path, value): a node replaced at the named place only
    for rp, at, v in targets:
        try:
            _, p2 = resolve(index2, rp, td2, where)
        except StructureError:
            msg = (
                f"{where}: the path {rp.display} lies inside a sub-tree that another path replaces (one "
                "node object at several places). Expected places that do not overlap; fix: replace the "
                "outer sub-tree with a value that already holds the inner change."
            )
            raise StructureError(msg) from None
        if type(p2) is not int:  # pragma: no cover - the second recording stops at every target
            raise AssertionError(rp)
        j2 = p2 if pl2 is None else pl2[p2]
        if type(at) is not int:
            places = 1 if pl2 is None else pl2.count(j2)
            if id(at) not in shared and places > 1:
                alone.append((p2, rp, v))
                continue
        _assign(new, set_by, j2, rp, v, where)
    if not alone:
        return td2.unflatten(new)
    if td2._shares() and not td._shares():
        # the stopped node made an enclosing scalar-only node look shared: rebuild without sharing
        exp = td2.expanded()
        vals = exp.position_values(new)
        paths = exp.position_paths()
        want = {rp: v for _, rp, v in alone}
        for q, path in enumerate(paths):
            if path in want:
                vals[q] = want[path]
        return exp.build(vals, BUILD_SAME)
    vals = list(td2.position_values(new))
    for p, _, v in alone:
        vals[p] = v
    return td2.build(vals, BUILD_SAME)
