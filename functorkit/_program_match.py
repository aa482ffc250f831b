"""The matching half of the program module (``_program.py`` is the other): another tree read
at a recorded definition's positions (`match_tree`: `TreeDef.flatten_up_to` and the multi-tree
maps), and the generated code for small container trees met again and again (`matcher`,
`builder`; the plan cache ``_plans.py`` decides when they are made and keeps them).

Like ``_program.py``, this module reads program entries (their layout is declared there once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._codegen import build_source, compile_source
from ._errors import StructureError
from ._keypath import KeyPath, make_path
from ._messages import describe_found, mismatch
from ._program import KEYS, LEAFY, MISS, NAMED, ND, N, children, describe_entry, preorder
from ._registry import DICT, LIST, TABLES, TUPLE, NodeDef, resolve

if TYPE_CHECKING:
    from ._treedef import TreeDef

__all__ = ["builder", "match_tree", "matcher"]


def match_tree(
    td: TreeDef,
    tree: Any,
    which: int,
    names: tuple[str, ...] | None,
    firsts: list[Any] | None = None,
    fail: Callable[[KeyPath, Any, Any], StructureError] | None = None,
    slots: bool = False,
) -> list[Any] | int:
    """`td.flatten_up_to(tree)`, or the program index of a shared sub-tree of `td` that is not
    shared in `tree`.

    `firsts` (the first tree's value at each position) only improves the messages; `fail`
    makes the error (default: the lock-step maps' message); ``slots=True`` matches a `td`
    recorded with ``record(..., slots=True)`` (nodes' ``None`` slots are children)."""
    if not slots and not td._forced and not td._refs and RECURSIVE_MATCH:
        fast = _match_recursive(td._prog, tree)
        if fast is not None:
            return fast
    if fail is None:

        def fail(path: KeyPath, left: Any, right: Any) -> StructureError:
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
        return make_path((*cur, key) if key is not MISS else ())

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
            key = MISS
        e = prog[idx]
        if e is None:
            if len(out) not in forced:
                t = type(c)
                if t not in leaf_types:
                    nd = disp.get(t, MISS)
                    if nd is MISS:
                        nd = resolve(t, tables)
                    if isinstance(nd, NodeDef):
                        raise leaf_vs(c, here(key))
            push(c)
        elif type(e) is int:
            if nodes_at[e] is not c:
                return idx
        else:
            nd = e[ND]
            if type(c) is not nd.cls:
                other = disp.get(type(c), MISS)
                if other is MISS:
                    other = resolve(type(c), tables)
                if not isinstance(other, NodeDef) or other.kind != nd.kind:
                    raise fail(here(key), describe_entry(prog, idx), describe_found(c))
                nd = other  # another class of the same kind (a torch parametrized module)
            fast = nd.fast
            keys = e[KEYS]
            if fast in (LIST, TUPLE):
                vals = c
                if len(vals) != e[N]:
                    raise fail(here(key), describe_entry(prog, idx), describe_found(c))
            else:
                if fast == DICT:
                    okeys: Any = list(c)
                    vals = list(c.values())
                else:
                    if nd.children is not None and not slots:
                        okeys, vals = nd.children(c)
                    else:
                        okeys, vals, _aux, _named = (nd.flatten_slots if slots else nd.flatten)(c)
                    if not nd.owns:
                        keep.append(vals)
                if okeys != keys:
                    vals = _reorder(okeys, vals, keys, e[NAMED])
                    if vals is None:
                        raise fail(here(key), describe_entry(prog, idx), describe_found(c))
            if idx in refs:
                nodes_at[idx] = c
            n = e[N]
            if e[LEAFY]:
                if forced or not leaf_types.issuperset(map(type, vals)):
                    p0 = len(out)
                    for j in range(n):
                        x = vals[j]
                        if p0 + j in forced:
                            continue
                        xnd = disp.get(type(x), MISS)
                        if xnd is MISS:
                            xnd = resolve(type(x))
                        if isinstance(xnd, NodeDef):
                            k = j if keys is None else keys[j]
                            del out[p0 + j :]
                            raise leaf_vs(x, make_path((*here(key), k)))
                extend(vals)
            elif n:
                if key is not MISS:
                    cur.append(key)
                stack.append([vals, 0, keys, key is not MISS])
                continue
        while stack and stack[-1][1] == len(stack[-1][0]):
            if stack.pop()[3]:
                cur.pop()
    return out


#: tests and benchmarks switch the recursive matcher off (bench_walk's two-tree rows)
RECURSIVE_MATCH = True


class _NotSure(Exception):
    """The recursive matcher met something only the full matcher decides (or names)."""


def _match_recursive(prog: list[Any], tree: Any) -> list[Any] | None:
    """`match_tree` for the common case, by recursion (the mirror of the recursive walk in
    ``_record.py``): `tree` is walked as the walk would record it, and each entry it would record
    is compared with `prog`'s entry at that place (node class, keys in order, length, all-leaf or
    not). Returns the objects at the leaf positions, or None at the first difference, a node met
    where a leaf is, a dict with its keys in another order, a type never met, or a tree deeper
    than the recursion goes: the full matcher then decides, and names any mismatch."""
    tables = TABLES[0]
    _, disp, leaf_types, _, _ = tables
    leaves_of = leaf_types.issuperset
    disp_get = disp.get
    out: list[Any] = []
    push = out.append
    extend = out.extend
    nprog = len(prog)
    at = [0]  # the next program entry

    def visit(c: Any, nd: NodeDef, depth: int) -> None:
        fast = nd.fast
        if fast == DICT:
            okeys: Any = [*c]
            vals: Any = c.values()
        elif fast in (LIST, TUPLE):
            okeys = None
            vals = c
        else:
            if nd.children is not None:
                okeys, vals = nd.children(c)
            else:
                okeys, vals, _aux, _named = nd.flatten(c)
        if leaves_of(map(type, vals)):
            k = at[0]
            if k >= nprog:
                raise _NotSure
            e = prog[k]
            if type(e) is not tuple or not e[LEAFY] or e[ND] is not nd or e[N] != len(vals) or e[KEYS] != okeys:
                raise _NotSure
            extend(vals)
            at[0] = k + 1
            return
        if depth >= 200:
            raise _NotSure
        for v in vals:
            t = type(v)
            if t in leaf_types:
                k = at[0]
                if k >= nprog or prog[k] is not None:
                    raise _NotSure
                push(v)
                at[0] = k + 1
                continue
            vnd = disp_get(t)
            if type(vnd) is not NodeDef:
                raise _NotSure
            if vnd.fast == DICT:  # a dict of leaves, inline (most nodes of a model: one layer)
                vv = v.values()
                if leaves_of(map(type, vv)):
                    k = at[0]
                    e = prog[k] if k < nprog else None
                    if type(e) is not tuple or not e[LEAFY] or e[ND] is not vnd or e[KEYS] != [*v]:
                        raise _NotSure
                    extend(vv)
                    at[0] = k + 1
                    continue
            visit(v, vnd, depth + 1)
        k = at[0]
        if k >= nprog:
            raise _NotSure
        e = prog[k]
        if type(e) is not tuple or e[LEAFY] or e[ND] is not nd or e[N] != len(vals) or e[KEYS] != okeys:
            raise _NotSure
        at[0] = k + 1

    nd0 = disp_get(type(tree))
    if type(nd0) is not NodeDef:
        return None
    try:
        visit(tree, nd0, 0)
    except (_NotSure, RecursionError):
        return None
    finally:
        visit = None  # type: ignore[assignment]  # the closure refers to itself: break the cycle
    return out if at[0] == nprog else None


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
        v = lookup.get(k, MISS)
        if v is MISS:
            return None
        out.append(v)
    return out


# ============================================================== generated code


def builder(td: TreeDef) -> Any:
    """A generated ``build(values) -> tree`` (the compiled form of `td`'s program)."""
    glb: dict[str, Any] = {}
    entries: list[int] = []
    body = build_source(td, [f"v{p}" for p in range(td._npos)], glb, entries)
    head = ["def build(v):"]
    if td._npos:
        head.append(f"    {', '.join(f'v{p}' for p in range(td._npos))}, = v")
    code, _ = compile_source("\n".join([*head, *body]))
    exec(code, glb)
    return glb["build"]


def matcher(td: TreeDef, distinct: Callable[[list[Any]], bool], sort_from: int) -> Any:
    """A generated ``match(tree, ties=True) -> leaves or MISS`` for trees of `td`'s structure
    (``ties=False``: a tie in `tree` is no mismatch, for the other trees of a multi-tree map, whose
    value at every position is wanted)."""
    prog = td._prog
    glb: dict[str, Any] = {"MISS": MISS, "TABLES": TABLES}
    # the leaf types of the node table published when it runs (one snapshot per call)
    lines = ["def match(t, ties=True):", "    LEAVES = TABLES[0][2]", "    out = []"]
    names: dict[int, str] = {}
    mutable: list[str] = []  # the empty dicts and lists: met twice, they would be a shared sub-tree (R2)
    # the access expression of each entry, from its parent (pre-order: a parent before its children)
    kids = children(prog)
    access = {len(prog) - 1: "t"}
    for idx in preorder(prog):
        e = prog[idx]
        x = access[idx]
        if e is None:  # (its type is checked with every leaf's, at the end)
            lines.append(f"    out.append({x})")
            continue
        name = f"x{idx}"
        names[idx] = name
        nd, keys, n, leafy = e[ND], e[KEYS], e[N], e[LEAFY]
        t = {DICT: "dict", LIST: "list", TUPLE: "tuple"}[nd.fast]
        if nd.fast == DICT:  # (equal key lists have equal lengths: no len() test, 7% of a model-shaped match)
            glb[f"K{idx}"] = list(keys)
            check = f"type({name}) is not dict or list({name}) != K{idx}"
        else:
            check = f"type({name}) is not {t} or len({name}) != {int(n)}"
        lines += [f"    {name} = {x}", f"    if {check}:", "        return MISS"]
        if nd.mutable and not n:  # (one met twice with leaves repeats them: the tie test below sees it)
            mutable.append(name)
        if leafy:
            lines.append(f"    out.extend({name}.values())" if nd.fast == DICT else f"    out.extend({name})")
            continue
        for j, c in enumerate(kids.get(idx, [])):
            if nd.fast == DICT:
                glb[f"k{idx}_{j}"] = keys[j]
                access[c] = f"{name}[k{idx}_{j}]"
            else:
                access[c] = f"{name}[{j}]"
    # one set for the leaves and the mutable nodes (never the same objects): no tie, no node met twice
    nodes = "".join(f", id({m})" for m in mutable) if len(mutable) > 1 else ""
    if td._npos < sort_from:
        test = f"len({{*map(id, out){nodes}}}) != {int(td._npos) + (len(mutable) if nodes else 0)}"
    else:
        glb["DISTINCT"] = distinct
        test = "not DISTINCT(out)"
        if nodes:
            test += f" or len({{{nodes[2:]}}}) != {len(mutable)}"
    # every leaf's type in one pass: a node where a leaf was, or an unknown type, is a miss
    lines += ["    if not LEAVES.issuperset(map(type, out)):", "        return MISS"]
    lines += [f"    if ties and ({test}):", "        return MISS", "    return out"]
    code, _ = compile_source("\n".join(lines))
    exec(code, glb)
    return glb["match"]
