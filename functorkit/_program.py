"""The program: how a `TreeDef` writes a tree's structure, and every loop that reads it.

This module (with ``_program_match.py``, the matching half) is the only place that
knows the layout of a program; everything else asks it (or `TreeDef`) through the
functions below. A program is a list of entries in post-order:

* ``None``: one leaf position;
* an ``int`` ``k``: the shared sub-tree built at entry ``k``, again;
* a node: the plain tuple ``(nd, keys, n, leafy, aux, named)`` (`ND`, `KEYS`, `N`,
  `LEAFY`, `AUX`, `NAMED` name the fields): ``n`` children rebuilt with ``nd`` (a
  `NodeDef`); when ``leafy`` its children are the next ``n`` leaf positions, otherwise
  the last ``n`` values built; ``keys`` is ``None`` for the built-in list and tuple (the
  indices); ``aux`` the node's static data; ``named`` whether its keys are names (a
  mapping: matched by key, shown as ``keys {...}``).

**Why plain tuples.** The walk (``_record._Recorder.run``) builds one entry per node
positionally, ``(nd, keys, n, leafy, aux, named)``, and it cannot afford more: a
``NamedTuple`` costs 3-5x a tuple to build (0.4-1 ms more on a 9,600-leaf tree).
So the layout is declared here once, the walk is the only other code that writes
an entry, and nothing outside this module and the walk indexes or unpacks one.

Positions map to distinct leaves through ``pos_leaf`` (``None`` when every position
holds its own leaf); ``refs`` are the entries a shared sub-tree refers back to,
``forced`` the positions ``is_leaf`` made leaves.
"""

from __future__ import annotations

import operator
import pickle
import types
from collections.abc import Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from ._errors import StructureError
from ._keypath import KeyPath, make_path
from ._messages import Described, add_note
from ._nodedef import aux_equal
from ._registry import DICT, LIST, TUPLE, NodeDef, resolve

if TYPE_CHECKING:
    from ._treedef import TreeDef

__all__ = [
    "AUX",
    "KEYS",
    "LEAFY",
    "MISS",
    "N",
    "NAMED",
    "ND",
    "aux_difference",
    "key_order_difference",
    "build",
    "children",
    "describe_entry",
    "expand",
    "fold",
    "is_plain",
    "node_defs",
    "num_entries",
    "num_nodes",
    "preorder",
    "program_hash",
    "programs_equal",
    "reduce_program",
    "reshare",
    "restore_program",
    "trainable_leaves",
    "walk_paths",
]

#: the fields of a node entry (see the module docstring: declared here once)
ND, KEYS, N, LEAFY, AUX, NAMED = range(6)
MISS = object()
BUILD_SAME, BUILD_STRUCTURE = 1, 2
_tnew = tuple.__new__
_PLAIN = (DICT, LIST, TUPLE)


# ============================================================== reading the program


def num_entries(td: TreeDef) -> int:
    """The length of `td`'s program (nodes, leaves outside all-leaf nodes, shared sub-trees again)."""
    return len(td._prog)


def num_nodes(prog: list[Any]) -> int:
    """The number of node entries (each shared sub-tree counted once)."""
    return sum(1 for e in prog if type(e) is tuple)


def node_defs(td: TreeDef) -> Iterator[NodeDef]:
    """The `NodeDef` of each node entry of `td`'s program, in post-order."""
    return (e[ND] for e in td._prog if type(e) is tuple)


def is_plain(td: TreeDef) -> bool:
    """Only dicts, lists and tuples, no ties, no shared sub-trees, no ``is_leaf`` stops (what a
    generated matcher and builder cover)."""
    return (
        td._pos_leaf is None
        and not td._refs
        and not td._forced
        and all(e is None or (type(e) is tuple and e[ND].fast in _PLAIN) for e in td._prog)
    )


def describe_entry(prog: list[Any], idx: int) -> Described:
    """What the node at entry `idx` is, for messages (its type, its keys if named, its length)."""
    e = prog[idx]
    return Described(e[ND].cls.__name__, tuple(e[KEYS]) if e[NAMED] else None, e[N])


def walk_paths(td: TreeDef, want: int | None) -> tuple[list[KeyPath], KeyPath]:
    """Paths of every position (and of entry `want`), walking the program from the root."""
    prog = td._prog
    out: list[Any] = [None] * td._npos
    pos = td._npos
    cur: list[Any] = []  # keys from the root to the node of the top frame
    stack: list[list[Any]] = []  # [keys, remaining, pushed a key onto cur]
    for idx in range(len(prog) - 1, -1, -1):
        while stack and stack[-1][1] == 0:
            if stack.pop()[2]:
                cur.pop()
        if stack:
            fr = stack[-1]
            fr[1] -= 1
            keys = fr[0]
            key = fr[1] if keys is None else keys[fr[1]]
        else:
            key = MISS
        if idx == want:
            return out, make_path(() if key is MISS else (*cur, key))
        e = prog[idx]
        if e is None:
            pos -= 1
            out[pos] = make_path(() if key is MISS else (*cur, key))
        elif type(e) is tuple:
            n = e[N]
            if e[LEAFY]:
                base = () if key is MISS else (*cur, key)
                keys = e[KEYS]
                pos -= n
                if keys is None:
                    out[pos : pos + n] = [_tnew(KeyPath, (*base, j)) for j in range(n)]
                else:
                    out[pos : pos + n] = [_tnew(KeyPath, (*base, k)) for k in keys]
            elif n:
                if key is not MISS:
                    cur.append(key)
                stack.append([e[KEYS], n, key is not MISS])
        # an int (a shared sub-tree again) has no positions of its own
    return out, make_path(())


def children(prog: list[Any]) -> dict[int, list[int]]:
    """For each node entry with node children: the program indices of its children, in order."""
    out: dict[int, list[int]] = {}
    roots: list[int] = []
    for idx, e in enumerate(prog):
        if type(e) is tuple and not e[LEAFY] and e[N]:
            n = e[N]
            out[idx] = roots[-n:]
            del roots[-n:]
        roots.append(idx)
    return out


def preorder(prog: list[Any]) -> list[int]:
    """The program's entry indices in pre-order (a node before its children, left to right)."""
    ch = children(prog)
    pre: list[int] = []
    todo = [len(prog) - 1] if prog else []
    while todo:
        idx = todo.pop()
        pre.append(idx)
        c = ch.get(idx)
        if c is not None:
            todo.extend(reversed(c))
    return pre


def fold(
    td: TreeDef,
    leaf: Callable[[int, int], Any],
    node: Callable[[int, NodeDef, Any, Any, list[Any]], Any],
) -> Any:
    """Run the program with callbacks: ``leaf(position, leaf index)`` for each position,
    ``node(entry, nodedef, keys, aux, children's values)`` for each node (post-order); a shared
    sub-tree met again gives the value made at its first place. Returns the root's value.
    (The maps' rebuild is `build`, this loop specialised.)"""
    prog = td._prog
    pl = td._pos_leaf
    refs = td._refs
    memo: dict[int, Any] = {}
    stack: list[Any] = []
    pos = 0
    for idx, e in enumerate(prog):
        if e is None:
            stack.append(leaf(pos, pos if pl is None else pl[pos]))
            pos += 1
            continue
        if type(e) is int:
            stack.append(memo[e])
            continue
        nd, keys, n, leafy, aux, _named = e
        if leafy:
            ch = [leaf(q, q if pl is None else pl[q]) for q in range(pos, pos + n)]
            pos += n
        elif n:
            ch = stack[-n:]
            del stack[-n:]
        else:
            ch = []
        out = node(idx, nd, keys, aux, ch)
        if idx in refs:
            memo[idx] = out
        stack.append(out)
    return stack[0]


# ============================================================== rebuilding


def build(td: TreeDef, vals: list[Any], mode: int) -> Any:
    """Run the program over `vals` (one value per position): the tree (``BUILD_SAME``) or the
    plain structure (``BUILD_STRUCTURE``: dicts for named nodes, tuples, lists)."""
    if mode == BUILD_SAME:
        return _build_same(td, vals)
    prog = td._prog
    refs = td._refs
    memo: dict[int, Any] = {}
    stack: list[Any] = []
    push = stack.append
    pos = 0
    idx = 0
    try:
        for idx, e in enumerate(prog):
            if e is None:
                push(vals[pos])
                pos += 1
                continue
            if type(e) is int:
                push(memo[e])
                continue
            nd, keys, n, leafy, _, named = e
            if leafy:
                end = pos + n
                ch = vals[pos:end]
                pos = end
            elif n:
                ch = stack[-n:]
                del stack[-n:]
            else:
                ch = []
            out: Any
            if named:
                out = dict(zip(keys, ch))
            elif nd.fast == TUPLE:
                out = tuple(ch)
            else:
                out = ch
            if idx in refs:
                memo[idx] = out
            push(out)
    except Exception as e:
        add_note(e, f"(functorkit: raised while visiting {walk_paths(td, idx)[1].display})")
        raise
    return stack[0]


def _build_same(td: TreeDef, vals: list[Any]) -> Any:
    """`build` in its common mode (the tree's own node types): the children of a node of leaves
    are taken straight from one iterator over `vals` (``zip`` stops at the keys, so it takes
    exactly ``n``), with no slice and no position count (bench_walk's fmap rows)."""
    refs = td._refs
    memo: dict[int, Any] = {}
    stack: list[Any] = []
    push = stack.append
    it = iter(vals)
    nxt = it.__next__
    idx = 0
    try:
        for idx, e in enumerate(td._prog):
            if e is None:
                push(nxt())
                continue
            if type(e) is int:
                push(memo[e])
                continue
            nd, keys, n, leafy, aux, _ = e
            fast = nd.fast
            out: Any
            if leafy:
                if fast == DICT:
                    out = dict(zip(keys, it))
                elif fast == LIST:
                    out = list(islice(it, n))
                elif fast == TUPLE:
                    out = tuple(islice(it, n))
                else:
                    out = nd.unflatten(aux, keys if keys is not None else list(range(n)), list(islice(it, n)))
            else:
                if n:
                    ch = stack[-n:]
                    del stack[-n:]
                else:
                    ch = []
                if fast == DICT:
                    out = dict(zip(keys, ch))
                elif fast == LIST:
                    out = ch
                elif fast == TUPLE:
                    out = tuple(ch)
                else:
                    out = nd.unflatten(aux, keys if keys is not None else list(range(n)), ch)
            if refs and idx in refs:
                memo[idx] = out
            push(out)
    except Exception as e:
        add_note(e, f"(functorkit: raised while visiting {walk_paths(td, idx)[1].display})")
        raise
    return stack[0]


def _subtrees(prog: list[Any]) -> tuple[list[int], list[int]]:
    """For each entry: the first entry and the first position of the sub-tree it ends."""
    sub_start: list[int] = [0] * len(prog)
    sub_pos: list[int] = [0] * len(prog)
    starts: list[tuple[int, int]] = []
    pos = 0
    for idx, e in enumerate(prog):
        if e is None:
            starts.append((idx, pos))
            pos += 1
        elif type(e) is int:
            starts.append((idx, pos))
        elif e[LEAFY]:
            starts.append((idx, pos))
            pos += e[N]
        else:
            n = e[N]
            first = starts[-n] if n else (idx, pos)
            del starts[len(starts) - n :]
            starts.append(first)
        sub_start[idx], sub_pos[idx] = starts[-1]
    return sub_start, sub_pos


def expand(td: TreeDef) -> tuple[list[Any], int, tuple[int, ...] | None, frozenset[int], list[int]]:
    """The program with every shared sub-tree written out at each of its positions: its entries,
    its number of positions, its ``pos_leaf``, its forced positions, and for each new entry the
    entry of `td`'s program it copies."""
    prog = td._prog
    sub_start, sub_pos = _subtrees(prog)
    pl = td._pos_leaf if td._pos_leaf is not None else tuple(range(td._npos))
    forced = td._forced
    new_prog: list[Any] = []
    origin: list[int] = []
    new_pl: list[int] = []
    new_forced: set[int] = set()

    def emit(lo: int, hi: int, p: int) -> int:
        """Copy entries lo..hi (inclusive) whose first position is p; returns the next position."""
        for idx in range(lo, hi + 1):
            e = prog[idx]
            if e is None:
                if p in forced:
                    new_forced.add(len(new_pl))
                new_pl.append(pl[p])
                new_prog.append(None)
                origin.append(idx)
                p += 1
            elif type(e) is int:
                emit(sub_start[e], e, sub_pos[e])
            else:
                if e[LEAFY]:
                    for q in range(p, p + e[N]):
                        if q in forced:
                            new_forced.add(len(new_pl))
                        new_pl.append(pl[q])
                    p += e[N]
                new_prog.append(e)
                origin.append(idx)
        return p

    emit(0, len(prog) - 1, 0)
    pos_leaf = None if new_pl == list(range(len(new_pl))) else tuple(new_pl)
    return new_prog, len(new_pl), pos_leaf, frozenset(new_forced), origin


def reshare(exp: TreeDef, tds: list[TreeDef], vals: list[Any]) -> tuple[list[Any], list[Any], frozenset[int]]:
    """A program for `vals` (one per position of `exp`, the expanded form of each of `tds`) that
    shares every sub-tree that one of `tds` shares (``fk.combine``). Returns the new program, the
    values at its positions and its shared entries."""
    prog = exp._prog
    parent = list(range(len(prog)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    start = _subtrees(prog)[0]
    before = [0]  # positions before each entry (post-order: a leaf one, an all-leaf node its count)
    for e in prog:
        before.append(before[-1] + (1 if e is None else e[N] if e[LEAFY] else 0))

    def same_values(f: int, i: int) -> bool:  # the sub-trees rooted at f and i hold the same objects
        a, b = vals[before[start[f]] : before[f + 1]], vals[before[start[i]] : before[i + 1]]
        return len(a) == len(b) and all(map(operator.is_, a, b))

    for td in tds:
        refs = td._refs
        if not refs:
            continue
        origin = expand(td)[4]  # the entry of td's program each entry of exp copies
        if len(origin) != len(prog):  # pragma: no cover - equal structures expand alike
            continue
        first: dict[int, int] = {}
        for i, o in enumerate(origin):
            if o in refs:
                f = first.setdefault(o, i)
                a, b = find(f), find(i)
                # shared again only where the combined values allow it: another group may hold
                # different values at the two places (a per-position map of one group)
                if a != b and same_values(f, i):
                    parent[max(a, b)] = min(a, b)
    copy_at: dict[int, int] = {}  # first entry of a copied sub-tree -> its (outermost) root
    for root in range(len(prog)):
        if find(root) != root:
            s = start[root]
            copy_at[s] = max(copy_at.get(s, root), root)
    new_prog: list[Any] = []
    new_idx: dict[int, int] = {}
    refs_out: set[int] = set()
    kept: list[Any] = []
    pos = 0
    idx = 0
    while idx < len(prog):
        r = copy_at.get(idx)
        if r is not None and find(r) in new_idx:
            for e in prog[idx : r + 1]:
                if e is None:
                    pos += 1
                elif e[LEAFY]:
                    pos += e[N]
            k = new_idx[find(r)]
            refs_out.add(k)
            new_prog.append(k)
            idx = r + 1
            continue
        e = prog[idx]
        new_idx[idx] = len(new_prog)
        new_prog.append(e)
        if e is None:
            kept.append(vals[pos])
            pos += 1
        elif e[LEAFY]:
            kept.extend(vals[pos : pos + e[N]])
            pos += e[N]
        idx += 1
    return new_prog, kept, frozenset(refs_out)


# ============================================================== trainable leaves


def trainable_leaves(td: TreeDef, tsets: dict[int, frozenset[Any]]) -> tuple[bool, ...] | None:
    """Each distinct leaf: trainable when at least one of its positions is (every node above it
    declares that child trainable). `tsets` maps ``id(entry)`` to the trainable child keys the
    entry's node declared. Runs over the expanded program, so every position of a shared
    sub-tree counts, from the root (right to left); None when every leaf is trainable."""
    ex = td.expanded()
    prog = ex._prog
    pos_tr = [True] * ex._npos
    pos = ex._npos
    stack: list[list[Any]] = []  # [keys, remaining, trainable, trainable keys or None]
    for idx in range(len(prog) - 1, -1, -1):
        while stack and stack[-1][1] == 0:
            stack.pop()
        if stack:
            fr = stack[-1]
            fr[1] -= 1
            tset = fr[3]
            if tset is None:
                tr = fr[2]
            else:
                keys = fr[0]
                tr = fr[2] and (fr[1] if keys is None else keys[fr[1]]) in tset
        else:
            tr = True
        e = prog[idx]
        if e is None:
            pos -= 1
            pos_tr[pos] = tr
        elif type(e) is tuple:
            n = e[N]
            ctset = tsets.get(id(e)) if tr else None
            if e[LEAFY]:
                pos -= n
                if not tr:
                    pos_tr[pos : pos + n] = [False] * n
                elif ctset is not None:
                    keys = e[KEYS]
                    pos_tr[pos : pos + n] = [(j if keys is None else keys[j]) in ctset for j in range(n)]
            elif n:
                stack.append([e[KEYS], n, tr, ctset])
    if all(pos_tr):
        return None
    ltr = [False] * td._nleaves
    pl = ex._pos_leaf
    for p, ok in enumerate(pos_tr):
        if ok:
            ltr[p if pl is None else pl[p]] = True
    return tuple(ltr)


# ============================================================== equality, hashing, pickling


def _keys_hash(keys: Any) -> int:
    if keys is None:
        return 0
    try:
        return hash(tuple(keys))
    except TypeError:  # unhashable keys from a custom node: hash by count only
        return len(keys)


def program_hash(prog: list[Any]) -> tuple[Any, ...]:
    """The hashable summary of a program that `TreeDef.__hash__` hashes (node kinds, keys, counts)."""
    return tuple((e[ND].kind, _keys_hash(e[KEYS]), e[N], e[LEAFY]) if type(e) is tuple else e for e in prog)


def programs_equal(pa: list[Any], pb: list[Any]) -> bool:
    """Two programs of the same structure: node kinds, counts, keys and aux data equal entry by entry."""
    if len(pa) != len(pb):
        return False
    for a, b in zip(pa, pb):
        if type(a) is not tuple or type(b) is not tuple:
            if a != b:
                return False
            continue
        if a[ND].kind != b[ND].kind or a[N] != b[N] or a[LEAFY] != b[LEAFY]:
            return False
        if not aux_equal(a[KEYS], b[KEYS]) or not aux_equal(a[AUX], b[AUX]):
            return False
    return True


def aux_difference(ta: TreeDef, tb: TreeDef) -> tuple[int, type] | None:
    """The first entry where two definitions' programs hold the same node (keys, count) with
    unequal aux data: its index and node class; None if there is none."""
    pa, pb = ta._prog, tb._prog
    for idx, (a, b) in enumerate(zip(pa, pb, strict=False)):
        if (
            type(a) is tuple
            and type(b) is tuple
            and a[KEYS : LEAFY + 1] == b[KEYS : LEAFY + 1]
            and not aux_equal(a[AUX], b[AUX])
        ):
            return idx, a[ND].cls
    return None


def key_order_difference(ta: TreeDef, tb: TreeDef) -> tuple[int, list[Any], list[Any]] | None:
    """The first entry where two definitions' programs hold a node of one kind and count whose keys
    are the same but in another order (key order is structure): its index and both key lists."""
    for idx, (a, b) in enumerate(zip(ta._prog, tb._prog, strict=False)):
        if (
            type(a) is tuple
            and type(b) is tuple
            and a[NAMED]
            and b[NAMED]
            and a[ND].kind == b[ND].kind
            and a[N] == b[N]
            and list(a[KEYS]) != list(b[KEYS])
        ):
            ka, kb = list(a[KEYS]), list(b[KEYS])
            try:
                same = set(ka) == set(kb)
            except TypeError:  # unhashable keys: compared as lists
                same = sorted(map(repr, ka)) == sorted(map(repr, kb))
            if same:
                return idx, ka, kb
    return None


#: node classes pickle cannot name (not an attribute of their module: ``builtins.mappingproxy``),
#: written as these names and read back by them
_BY_NAME = {types.MappingProxyType: "types.MappingProxyType"}
_FROM_NAME = {name: cls for cls, name in _BY_NAME.items()}


def reduce_program(prog: list[Any]) -> list[Any]:
    """The program as picklable data: node classes in place of their `NodeDef` (by name where
    pickle cannot find the class itself, `_BY_NAME`)."""
    get = _BY_NAME.get
    return [(get(e[ND].cls, e[ND].cls), *e[KEYS:]) if type(e) is tuple else e for e in prog]


def restore_program(prog_in: Any, bad: str) -> list[Any]:
    """The program `reduce_program` wrote, every entry type-checked, node classes looked up in
    the registry (UnpicklingError with `bad` for malformed data)."""
    if type(prog_in) is not list:
        raise pickle.UnpicklingError(bad)
    prog: list[Any] = []
    for e in prog_in:
        if e is None:
            prog.append(None)
        elif type(e) is int:
            if not 0 <= e < len(prog) or type(prog[e]) is not tuple:
                raise pickle.UnpicklingError(bad)
            prog.append(e)
        elif type(e) is tuple and len(e) == 6:
            cls, keys, n, leafy, aux, named = e
            if type(cls) is str:
                cls = _FROM_NAME.get(cls)
            if not isinstance(cls, type) or type(n) is not int or type(leafy) is not bool or type(named) is not bool:
                raise pickle.UnpicklingError(bad)
            nd = resolve(cls)
            if not isinstance(nd, NodeDef):
                msg = (
                    f"unpickling a TreeDef: {cls.__qualname__} is not registered as a node in this process; "
                    "register it (fk.register) before unpickling."
                )
                raise StructureError(msg)
            if keys is not None and type(keys) is not list:
                raise pickle.UnpicklingError(bad)
            prog.append((nd, keys, n, leafy, aux, named))
        else:
            raise pickle.UnpicklingError(bad)
    return prog


def check_program(prog: list[Any], npos: int, bad: str) -> None:
    """The counts of an unpickled program agree (every index it holds is in range), so running it
    can only fail in a node's own code: the stack never runs short, one tree comes out, and the
    positions are `npos`."""
    depth = positions = 0
    for e in prog:
        if e is None or type(e) is int:
            depth += 1
            positions += e is None
            continue
        _, keys, n, leafy, _, _ = e
        if n < 0 or (keys is not None and len(keys) != n) or (not leafy and n > depth):
            raise pickle.UnpicklingError(bad)
        if leafy:
            positions += n
        else:
            depth -= n
        depth += 1
    if depth != 1 or positions != npos:
        raise pickle.UnpicklingError(bad)
