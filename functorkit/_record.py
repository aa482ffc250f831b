"""The one walk: `record` a tree into its distinct leaves and a `TreeDef`.

The rules it applies (ties, shared sub-trees, trainable leaves, cycles) are
stated in ``_treedef.py``'s module docstring and in ``docs/treedef.md``.
``fk.flatten``/``fk.unflatten`` are the public face of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import length_hint
from typing import Any, cast

import numpy as np

from . import _plans
from ._errors import StructureError
from ._holders import use_walk
from ._keypath import KeyPath, make_path, safe_repr
from ._messages import _cycle, _visiting
from ._plans import MATCH_BY_ROOT
from ._program import KEYS
from ._registry import (
    DICT,
    GEN,
    LIST,
    SCALAR,
    SCALAR_TYPES,
    TABLES,
    TUPLE,
    NodeDef,
    resolve,
)
from ._treedef import _MISS, _NO_AUX, TreeDef, add_note
from .adapters import tracing

__all__ = ["all_distinct", "distinct_leaves", "flatten", "record", "record_plain", "unflatten"]


# ============================================================== record


def record(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None, *, track: bool = True, slots: bool = False
) -> tuple[list[Any], TreeDef]:
    """Walk `tree` once: its distinct leaves in walk order and its `TreeDef`.

    With ``track=False`` no node's ``trainable`` function is called (maps that do not
    need trainability skip that work, and a lazy torch module can still be listed);
    the definition then counts every leaf as trainable. With ``slots=True`` nodes that have
    a ``flatten_slots`` (torch modules) list their ``None`` slots as ``None`` leaves
    (``fk.combine``)."""
    if is_leaf is None and not slots:
        fast = _record_recursive(tree, track)
        if fast is not None:
            return fast
    rec = _Recorder(is_leaf, track, slots)
    return rec.finish(rec.run(tree))


# ============================================================== the recursive walk
#
# The common case, walked at Python's floor: one recursive call per node, the children of a node
# whose children are all leaves taken in one C-level ``extend``, no per-node bookkeeping beyond its
# program entry. It records exactly the program `_Recorder` records, under one assumption it checks
# at the end instead of at every node: no node object is met twice (then no node is shared and no
# cycle closes). Every node met is kept in one list, and one `all_distinct` over it (together with the
# leaves, whose ties `finish` resolves) confirms it; if a node was met twice, or the tree is deeper
# than `RECURSIVE_DEPTH`, the explicit-stack `_Recorder` walks the tree instead (it records sharing,
# names cycles and has no depth limit). bench_walk's model-shaped rows measure the two
# (``fk.flatten(t)`` with `RECURSIVE` on and off); tests/test_walk.py checks that the recursive walk
# is taken on such a tree and gives the same definition as the explicit one on every tree.

#: tests and benchmarks switch the recursive walk off to compare it with the explicit stack
RECURSIVE = True
#: deeper trees (and cycles, which recurse until here) are walked by the explicit stack
RECURSIVE_DEPTH = 200


class _Deep(Exception):
    """The recursive walk went deeper than `RECURSIVE_DEPTH` (a deep tree, or a cycle)."""


class _KeyTrail(Exception):
    """Carries the path of a failure out of the recursive walk (keys innermost first)."""


def _record_recursive(tree: Any, track: bool) -> tuple[list[Any], TreeDef] | None:
    """`record` by recursion (see above), or None when the explicit stack must walk `tree`."""
    if not RECURSIVE:
        return None
    tables = TABLES[0]  # one snapshot of the node table for the whole walk
    _, disp, leaf_types, known_types, _ = tables
    nd0 = disp.get(type(tree)) or resolve(type(tree), tables)
    if not isinstance(nd0, NodeDef):
        return None  # a leaf at the root: nothing to gain
    flat: list[Any] = []
    prog: list[Any] = []
    nodes: list[Any] = []
    tsets: dict[int, frozenset[Any]] = {}
    flat_append = flat.append
    flat_extend = flat.extend
    prog_append = prog.append
    nodes_append = nodes.append
    trail: list[tuple[Any, Any, Any]] = []  # (keys, children, child) of each frame a failure left
    disp_get = disp.get
    leaves_of = leaf_types.issuperset
    known = known_types.issuperset
    # a plain ``dict`` child (most nodes of a model) is taken before any other test, under the
    # snapshot's own NodeDef for dict (a built-in dict node declares no trainability)
    dnd = cast(NodeDef, disp_get(dict))  # (tested here: a NodeDef whenever `plain_dict` holds)
    plain_dict = isinstance(dnd, NodeDef) and dnd.fast == DICT and dnd.trainable is None

    def visit(c: Any, nd: NodeDef, depth: int) -> None:
        nodes_append(c)
        fast = nd.fast
        if fast == DICT:
            ckeys: Any = [*c]
            cvals: Any = c.values()
            aux = _NO_AUX
            named = True
        elif fast in (LIST, TUPLE):
            ckeys = None
            cvals = c
            aux = _NO_AUX
            named = False
        else:
            ckeys, cvals, aux, named = nd.flatten(c)
        n = len(cvals)
        tset = None
        if track and nd.trainable is not None:
            tset = nd.trainable(c)
            if tset is not None and not names_children(tset, ckeys, n):
                raise _KeyTrail(c, tset, ckeys, n)
        if leaves_of(map(type, cvals)) or (
            not known(map(type, cvals)) and _resolve_all(cvals, disp, tables) and leaves_of(map(type, cvals))
        ):
            flat_extend(cvals)
            entry = (nd, ckeys, n, True, aux, named)
            if tset is not None:
                tsets[id(entry)] = tset
            prog_append(entry)
            return
        if depth >= RECURSIVE_DEPTH:
            raise _Deep
        depth += 1
        v = None
        try:
            for v in cvals:
                t = type(v)
                if t is dict and plain_dict:
                    vv = v.values()
                    if leaves_of(map(type, vv)):  # a dict of leaves, inline (one layer of a model)
                        nodes_append(v)
                        flat_extend(vv)
                        prog_append((dnd, [*v], len(vv), True, _NO_AUX, True))
                    else:
                        visit(v, dnd, depth)
                    continue
                if t in leaf_types:
                    flat_append(v)
                    prog_append(None)
                    continue
                vnd = disp_get(t)  # not a leaf type: a NodeDef once resolved
                if vnd is None or vnd is SCALAR:  # (or not resolved yet, or resolved meanwhile)
                    vnd = resolve(t, tables)
                    if not isinstance(vnd, NodeDef):
                        flat_append(v)
                        prog_append(None)
                        continue
                if vnd.fast == DICT and not (track and vnd.trainable is not None):
                    vv = v.values()  # a dict of leaves, inline (most nodes of a model: one layer)
                    if leaves_of(map(type, vv)):
                        nodes_append(v)
                        flat_extend(vv)
                        prog_append((vnd, [*v], len(vv), True, _NO_AUX, True))
                        continue
                visit(v, vnd, depth)
        except _Deep:
            raise
        except BaseException:
            trail.append((ckeys, cvals, v))
            raise
        entry = (nd, ckeys, n, False, aux, named)
        if tset is not None:
            tsets[id(entry)] = tset
        prog_append(entry)

    try:
        try:
            visit(tree, nd0, 0)
        finally:
            visit = None  # type: ignore[assignment]  # the closure refers to itself (a cycle): break it so the nodes it holds go now
    except (_Deep, RecursionError):  # deeper than the recursion allows (or a cycle)
        return None
    except _KeyTrail as e:  # a `trainable` function named keys that are not children
        raise _unknown_trainable(_trail_path(trail), *e.args) from None
    except StructureError:
        raise
    except (TypeError, ValueError) as e:
        path = _trail_path(trail)
        if getattr(e, "functorkit_needs_path", False):  # a node's function broke its contract, or refused a value
            raise type(e)(f"at {path.display}: {e}") from None
        add_note(e, _visiting(path))
        raise
    except Exception as e:
        add_note(e, _visiting(_trail_path(trail)))
        raise
    if all_distinct(flat + nodes):
        return _finish(flat, prog, None, None, tsets, True)
    if not all_distinct(nodes):
        return None  # a node met twice: a shared sub-tree; the explicit stack records it
    return _finish(flat, prog, None, None, tsets, False)


def _resolve_all(children: Iterable[Any], disp: dict[type, Any], tables: Any) -> bool:
    """Resolve the types among `children` never met before (into the snapshot); True."""
    for ct in set(map(type, children)):
        if ct not in disp:
            resolve(ct, tables)
    return True


def _trail_path(trail: list[tuple[Any, Any, Any]]) -> KeyPath:
    """The path a failure in the recursive walk left, from its frames (innermost first)."""
    keys = []
    for ckeys, cvals, v in reversed(trail):
        i = next(j for j, x in enumerate(cvals) if x is v)
        keys.append(i if ckeys is None else ckeys[i])
    return make_path(tuple(keys))


def names_children(tset: frozenset[Any], keys: Any, n: int) -> bool:
    """Whether the trainable keys `tset` a node declared are among its children: its `keys` (None:
    the indices ``range(n)``), each of the key's own type. Equality alone would take ``True`` for
    the key or index ``1`` (and ``1.0`` for ``1``): such a key is no child (a child of the key ``1``
    would be trainable, silently). String keys (module and most node names) are exact by equality."""
    if not tset.issubset(range(n) if keys is None else keys):
        return False
    if all(type(k) is str for k in tset):
        return True
    if keys is None:
        return all(type(k) is int for k in tset)
    typed = {(type(k), k) for k in keys if type(k) is not str}
    return all(type(k) is str or (type(k), k) in typed for k in tset)


def _unknown_trainable(path: KeyPath, c: Any, tset: frozenset[Any], keys: Any, n: int) -> StructureError:
    children = list(range(n)) if keys is None else list(keys)
    typed = {(type(k), k) for k in children}
    unknown = sorted((k for k in tset if (type(k), k) not in typed), key=repr)
    msg = (
        f"at {path.display}: the `trainable` function registered for {type(c).__qualname__} named "
        f"{', '.join(safe_repr(k) for k in unknown)}, which {'is' if len(unknown) == 1 else 'are'} not among "
        f"its children [{', '.join(safe_repr(k) for k in children)}]. Expected child keys; "
        "fix the `trainable` function (fk.register) to return keys of the mapping or indices of the "
        "sequence `children` returns."
    )
    return StructureError(msg)


def _finish(
    flat: list[Any],
    prog: list[Any],
    refs: list[int] | None,
    forced: set[int] | None,
    tsets: dict[int, frozenset[Any]],
    distinct: bool | None,
) -> tuple[list[Any], TreeDef]:
    """The distinct leaves and the `TreeDef` of a walk's program and positions (`distinct`: whether
    the objects at the positions are known to be distinct; None: not known)."""
    npos = len(flat)
    pos_leaf: tuple[int, ...] | None = None
    if distinct or (distinct is None and all_distinct(flat)):
        leaves = flat
    else:
        leaves, pos_leaf = distinct_leaves(flat)
    refs_ = frozenset(refs) if refs else _NO_REFS
    forced_ = frozenset(forced) if forced else _NO_REFS
    return leaves, TreeDef._recorded(prog, npos, len(leaves), pos_leaf, refs_, forced_, tsets)


def distinct_leaves(flat: list[Any]) -> tuple[list[Any], tuple[int, ...] | None]:
    """The distinct leaves of the objects at a walk's positions (each identity-cached object once,
    at its first position; scalars at every position) and, if some position repeats an earlier
    one, the leaf index of every position (else None)."""
    leaves: list[Any] = []
    first: dict[int, int] = {}
    pl: list[int] = []
    scalars = SCALAR_TYPES
    for x in flat:
        if type(x) in scalars:
            pl.append(len(leaves))
            leaves.append(x)
            continue
        j = first.get(id(x))
        if j is None:
            j = first[id(x)] = len(leaves)
            leaves.append(x)
        pl.append(j)
    return leaves, (tuple(pl) if len(leaves) != len(flat) else None)


class _Recorder:
    """The single walk: an explicit stack of iterators over children (C-level iteration per node;
    depth bounded by memory). Trainability is not computed during the walk: the nodes' trainable
    key sets are kept by program entry and resolved afterwards, over the program (``_program.trainable_leaves``),
    only when some node declared one."""

    __slots__ = ("forced", "is_leaf", "its", "keep", "opens", "prog", "refs", "slots", "track", "tsets")

    def __init__(self, is_leaf: Callable[[Any], bool] | None, track: bool, slots: bool = False) -> None:
        self.is_leaf = is_leaf
        self.track = track
        self.slots = slots
        self.prog: list[Any] = []
        self.forced: set[int] = set()  # positions made leaves by is_leaf
        self.keep: list[Any] = []  # children lists of nodes that do not own them (ids stay unique)
        self.refs: list[int] = []  # program indices of the entries a shared sub-tree refers back to
        self.tsets: dict[int, frozenset[Any]] = {}  # id(node entry) -> its trainable child keys
        self.its: list[Any] = []  # one iterator over children per open node (the first: the root)
        self.opens: list[list[Any]] = []  # per open node: [id, cached count at entry, entry, children]

    def path(self) -> KeyPath:
        """The path of the child the walk is at (read off the iterators' remaining lengths)."""
        keys = []
        for fr, it in zip(self.opens, self.its[1:]):
            vals, ckeys = fr[3], fr[2][KEYS]
            i = len(vals) - length_hint(it) - 1
            keys.append(i if ckeys is None else ckeys[i])
        return make_path(tuple(keys))

    def run(self, tree: Any) -> list[Any]:
        """Walk `tree`; returns the object at every leaf position, in order."""
        is_leaf = self.is_leaf
        track = self.track
        slots = self.slots
        flat: list[Any] = []
        prog = self.prog
        keep = self.keep
        tsets = self.tsets
        shared: dict[int, int] = {}  # id(node) -> program index (completed mutable nodes, or holding a cached leaf)
        active: set[int] = set()  # ids of the open nodes (cycle check)
        tables = TABLES[0]  # one snapshot of the node table for the whole walk (never changed under it)
        _, disp, leaf_types, known_types, _ = tables
        scalar_types = SCALAR_TYPES
        flat_append = flat.append
        flat_extend = flat.extend
        prog_append = prog.append
        its = self.its
        opens = self.opens
        its.append(iter((tree,)))
        ncached = 0  # grows whenever an identity-cached leaf, a mutable node or a shared sub-tree is met
        try:
            while its:
                for c in its[-1]:
                    t = type(c)
                    if is_leaf is not None and is_leaf(c):
                        if t not in scalar_types:
                            ncached += 1
                        self.forced.add(len(flat))
                        flat_append(c)
                        prog_append(None)
                        continue
                    if t in leaf_types:
                        nd = None
                    else:
                        nd = disp.get(t, _MISS)
                        if nd is _MISS:
                            nd = resolve(t, tables)
                    if not isinstance(nd, NodeDef):
                        if t not in scalar_types:
                            ncached += 1
                        flat_append(c)
                        prog_append(None)
                        continue
                    # ---- a node
                    cid = id(c)
                    k = shared.get(cid)
                    if k is not None:
                        ncached += 1
                        self.refs.append(k)
                        prog_append(k)
                        continue
                    if cid in active:
                        raise _cycle(self.path(), c)
                    fast = nd.fast
                    if fast in (LIST, TUPLE):
                        ckeys = None
                        cvals = c
                        aux = _NO_AUX
                        named = False
                    elif fast == DICT:
                        ckeys = list(c)
                        cvals = list(c.values())
                        aux = _NO_AUX
                        named = True
                    else:
                        ckeys, cvals, aux, named = (nd.flatten_slots if slots else nd.flatten)(c)
                        if not nd.owns:
                            keep.append(cvals)
                    n = len(cvals)
                    tset = None
                    if track and nd.trainable is not None:
                        tset = nd.trainable(c)
                        if tset is not None and not names_children(tset, ckeys, n):
                            raise _unknown_trainable(self.path(), c, tset, ckeys, n)
                    if is_leaf is None:
                        ts = set(map(type, cvals))  # one pass over the children; the tests below are on types
                        if ts <= leaf_types:
                            leafy = True
                        elif ts <= known_types:
                            leafy = False
                        else:  # types never met: resolve them first
                            for ct in ts:
                                if ct not in disp:
                                    resolve(ct, tables)
                            leafy = ts <= leaf_types
                    else:
                        leafy = False
                    if leafy:
                        entry = (nd, ckeys, n, True, aux, named)
                        if tset is not None:
                            tsets[id(entry)] = tset
                        if nd.mutable or not ts <= scalar_types:  # R2: sharing follows mutability
                            ncached += 1
                            shared[cid] = len(prog)
                        flat_extend(cvals)
                        prog_append(entry)
                        continue
                    entry = (nd, ckeys, n, False, aux, named)
                    if tset is not None:
                        tsets[id(entry)] = tset
                    active.add(cid)
                    opens.append([cid, ncached, entry, cvals])
                    its.append(iter(cvals))
                    break
                else:
                    its.pop()
                    if opens:
                        fr = opens.pop()
                        active.discard(fr[0])
                        if fr[2][0].mutable:  # R2: a mutable node is one object wherever it is met
                            ncached += 1
                            shared[fr[0]] = len(prog)
                        elif ncached > fr[1]:
                            shared[fr[0]] = len(prog)
                        prog_append(fr[2])
        except StructureError:
            raise
        except (TypeError, ValueError) as e:
            if getattr(e, "functorkit_needs_path", False):  # a node's function broke its contract, or refused a value
                raise type(e)(f"at {self.path().display}: {e}") from None
            add_note(e, _visiting(self.path()))
            raise
        except Exception as e:
            add_note(e, _visiting(self.path()))
            raise
        return flat

    def finish(self, flat: list[Any]) -> tuple[list[Any], TreeDef]:
        return _finish(flat, self.prog, self.refs, self.forced, self.tsets, None)


_NO_REFS: frozenset[int] = frozenset()


def _detect_object_words() -> bool:
    """Whether NumPy exports an object array's buffer as one machine word per element, equal for
    one object and different for two (it does on CPython: the words are the ``PyObject*``, i.e.
    ``id``). Detected once, at import; without it `all_distinct` falls back to ``map(id, ...)``."""
    a, b = object(), object()
    try:
        words = np.frombuffer(np.fromiter((a, b, a), dtype=object, count=3), dtype=np.uintp)
    except (TypeError, ValueError, BufferError):
        return False
    return words.shape == (3,) and bool(words[0] == words[2]) and bool(words[0] != words[1])


#: tests monkeypatch this to take the fallback
OBJECT_WORDS = _detect_object_words()
#: from this many objects on, `all_distinct` sorts their ids in NumPy instead of hashing them
#: (with `OBJECT_WORDS`: 128; without: 2048, where sorting ``map(id, ...)`` starts to pay)
_DISTINCT_SORT = 128 if OBJECT_WORDS else 2048


def all_distinct(objs: list[Any]) -> bool:
    """No object listed twice (by identity): the walk's tie test.

    Many objects: an object array holds them (so their words stay unique while it lives), NumPy
    sorts its buffer's words (one ``PyObject*`` per element on CPython) and compares neighbours.
    That avoids making a Python int per object: bench_walk's 10,000-leaf rows (``fk.fmap(f, t)``
    vs ``jax.tree_util.tree_map``); the test costs 3.4x less than sorting ``map(id, objs)`` and
    4.8x less than a set of ids there. Without `OBJECT_WORDS` the ids themselves are sorted.
    Under ``torch.compile`` (`tracing`: Dynamo cannot trace NumPy object arrays) a set of ids,
    whatever the number (a 12-block ``nn.Module``: tests/test_compile.py's large-tree test)."""
    n = len(objs)
    if n < _DISTINCT_SORT or tracing():
        return len(set(map(id, objs))) == n
    if OBJECT_WORDS:
        held = np.fromiter(objs, dtype=object, count=n)
        ids = np.sort(np.frombuffer(held, dtype=np.uintp), kind="stable")
    else:
        ids = np.fromiter(map(id, objs), dtype=np.uintp, count=n)
        ids.sort(kind="stable")  # ids of objects made one after another are mostly increasing
    return not bool((ids[1:] == ids[:-1]).any())


def flatten(tree: Any, /, *, is_leaf: Callable[[Any], bool] | None = None) -> tuple[list[Any], TreeDef]:
    """The distinct leaves of `tree` in walk order, and its `TreeDef`.

    Each identity-cached leaf (anything but a Python scalar, string, bytes
    or None) is listed once, at its first position; scalars at every
    position. ``fk.unflatten(treedef, leaves)`` rebuilds the tree.

    Parameters
    ----------
    tree
        Any tree functorkit walks.
    is_leaf
        ``is_leaf(x) -> bool``: stop the walk at ``x`` and take it whole.

    Returns
    -------
    leaves : list
        The distinct leaves, in walk order.
    treedef : TreeDef
        The structure: node types, keys, aux data, ties, shared sub-trees,
        trainable leaves.

    Raises
    ------
    StructureError
        If `tree` contains a cycle.

    Examples
    --------
    >>> import functorkit as fk
    >>> leaves, td = fk.flatten({"a": 1, "b": (2, 3)})
    >>> leaves
    [1, 2, 3]
    >>> fk.unflatten(td, [10, 20, 30])
    {'a': 10, 'b': (20, 30)}
    """
    if is_leaf is not None and not callable(is_leaf):
        msg = f"`is_leaf` must be a callable `x -> bool` or None, got {type(is_leaf).__name__} (fk.flatten)."
        raise TypeError(msg)
    if is_leaf is None:  # a small container tree met before: matched by its generated matcher
        return record_plain(tree, track=True)
    return record(tree, is_leaf)


def unflatten(treedef: TreeDef, leaves: Iterable[Any], /) -> Any:
    """Rebuild a tree from its `TreeDef` and one value per distinct leaf (``treedef.unflatten``).

    Examples
    --------
    >>> import functorkit as fk
    >>> _, td = fk.flatten([1, {"x": 2}])
    >>> fk.unflatten(td, ["a", "b"])
    ['a', {'x': 'b'}]
    """
    if not isinstance(treedef, TreeDef):
        msg = (
            f"`treedef` must be a TreeDef (the second result of fk.flatten), got {type(treedef).__name__}; "
            "call as fk.unflatten(treedef, leaves)."
        )
        raise TypeError(msg)
    return treedef.unflatten(leaves)


# ============================================================== small trees, again and again
#
# A model called in a loop (a small MLP mapped every step) pays the walk's fixed cost each time.
# For small trees made only of dicts, lists and tuples (no aux data, so a recorded definition
# rebuilds any tree of that shape exactly), the second recording of one structure generates a
# straight-line matcher, kept by the plan cache (``_plans.py``), which says what it checks.


def record_plain(tree: Any, track: bool = False) -> tuple[list[Any], TreeDef]:
    """``record(tree, track=track)``, through a generated matcher for small container trees
    met before (plain containers declare no trainability: `track` changes nothing for them)."""
    t = type(tree)
    if t is dict or t is list or t is tuple:
        tables = TABLES[0]  # a plan holds the snapshot it was made under: valid while it is published
        hit = MATCH_BY_ROOT.get((t, len(tree)))  # the plan cache (``_plans.py``): a matcher for this root
        if hit is not None and hit[1] == tables[GEN]:
            leaves = hit[0](tree)
            if leaves is not _MISS:
                return leaves, hit[2]
        leaves, td = record(tree, None, track=track)
        _plans.remember(tree, td, tables, all_distinct, _DISTINCT_SORT)
        return leaves, td
    return record(tree, None, track=track)


# the holder check (``_holders``, below this module: the tree definition calls it) looks inside
# registered containers with this walk; handed over here, not imported there (no import circle)
use_walk(record)
