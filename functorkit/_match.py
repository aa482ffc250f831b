"""Matching another tree against a recorded definition (`TreeDef.flatten_up_to` and the lock-step
maps): pre-order over the definition's program, the other tree's values at every position."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import StructureError
from ._keypath import KeyPath, make_path
from ._messages import _describe_entry, describe_found, mismatch
from ._registry import DICT, LIST, TABLES, TUPLE, NodeDef, resolve

if TYPE_CHECKING:
    from ._treedef import TreeDef

__all__ = ["match_tree"]

_MISS = object()
# node entry fields (the layout of a TreeDef program entry, see _treedef.py)
_ND, _KEYS, _N, _LEAFY, _AUX, _NAMED = range(6)


def match_tree(
    td: TreeDef,
    tree: Any,
    which: int,
    names: tuple[str, ...] | None,
    firsts: list[Any] | None = None,
    fail: Callable[[KeyPath, str, str], StructureError] | None = None,
    slots: bool = False,
) -> list[Any] | int:
    """`td.flatten_up_to(tree)`, or the program index of a shared sub-tree of `td` that is not
    shared in `tree`.

    `firsts` (the first tree's value at each position) only improves the messages; `fail`
    makes the error (default: the lock-step maps' message); ``slots=True`` matches a `td`
    recorded with ``record(..., slots=True)`` (nodes' ``None`` slots are children)."""
    if fail is None:

        def fail(path: KeyPath, left: str, right: str) -> StructureError:
            return mismatch(path, left, right, which, names)

    prog = td._prog
    out: list[Any] = []
    push = out.append
    extend = out.extend
    tables = TABLES[0]  # one snapshot of the node table for the whole match
    _, disp, leaf_types, _, _ = tables
    forced = td._forced
    refs = td._refs
    nodes_at: dict[int, Any] = {}  # entry index -> the other tree's object there (shared entries)
    keep: list[Any] = []
    stack: list[list[Any]] = []  # [values of the other's node, next index, keys (ours), pushed a key]
    cur: list[Any] = []

    def here(key: Any) -> KeyPath:
        return make_path((*cur, key) if key is not _MISS else ())

    def leaf_vs(c: Any, path: KeyPath) -> StructureError:
        left = "a leaf" if firsts is None else describe_found(firsts[len(out)])
        return fail(path, left, describe_found(c))

    for idx in td._preorder():
        if stack:
            fr = stack[-1]
            i = fr[1]
            c = fr[0][i]
            key = i if fr[2] is None else fr[2][i]
            fr[1] = i + 1
        else:
            c = tree
            key = _MISS
        e = prog[idx]
        if e is None:
            if len(out) not in forced:
                t = type(c)
                if t not in leaf_types:
                    nd = disp.get(t, _MISS)
                    if nd is _MISS:
                        nd = resolve(t, tables)
                    if isinstance(nd, NodeDef):
                        raise leaf_vs(c, here(key))
            push(c)
        elif type(e) is int:
            if nodes_at[e] is not c:
                return idx
        else:
            nd = e[_ND]
            if type(c) is not nd.cls:
                other = disp.get(type(c), _MISS)
                if other is _MISS:
                    other = resolve(type(c), tables)
                if not isinstance(other, NodeDef) or other.kind != nd.kind:
                    raise fail(here(key), _describe_entry(e), describe_found(c))
                nd = other  # another class of the same kind (a torch parametrized module)
            fast = nd.fast
            keys = e[_KEYS]
            if fast in (LIST, TUPLE):
                vals = c
                if len(vals) != e[_N]:
                    raise fail(here(key), _describe_entry(e), describe_found(c))
            else:
                if fast == DICT:
                    okeys: Any = list(c)
                    vals = list(c.values())
                else:
                    okeys, vals, _aux, _named = (nd.flatten_slots if slots else nd.flatten)(c)
                    if not nd.owns:
                        keep.append(vals)
                if okeys != keys:
                    vals = _reorder(okeys, vals, keys, e[_NAMED])
                    if vals is None:
                        raise fail(here(key), _describe_entry(e), describe_found(c))
            if idx in refs:
                nodes_at[idx] = c
            n = e[_N]
            if e[_LEAFY]:
                if forced or not leaf_types.issuperset(map(type, vals)):
                    p0 = len(out)
                    for j in range(n):
                        x = vals[j]
                        if p0 + j in forced:
                            continue
                        xnd = disp.get(type(x), _MISS)
                        if xnd is _MISS:
                            xnd = resolve(type(x))
                        if isinstance(xnd, NodeDef):
                            k = j if keys is None else keys[j]
                            del out[p0 + j :]
                            raise leaf_vs(x, make_path((*here(key), k)))
                extend(vals)
            elif n:
                if key is not _MISS:
                    cur.append(key)
                stack.append([vals, 0, keys, key is not _MISS])
                continue
        while stack and stack[-1][1] == len(stack[-1][0]):
            if stack.pop()[3]:
                cur.pop()
    return out


def _reorder(okeys: Any, vals: Any, keys: Any, named: bool) -> list[Any] | None:
    """`vals` (under `okeys`) in the order of `keys`, or None if the key sets differ."""
    if not named or okeys is None or keys is None or len(okeys) != len(keys):
        return None
    try:
        lookup = dict(zip(okeys, vals))
    except TypeError:  # unhashable keys: match by equality, in order
        return None
    if len(lookup) != len(keys):
        return None
    out = []
    for k in keys:
        v = lookup.get(k, _MISS)
        if v is _MISS:
            return None
        out.append(v)
    return out
