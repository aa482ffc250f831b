"""The one engine: walk a tree once, record its structure as a `TreeDef`.

`record` walks a tree with an explicit stack (depth is bounded by
memory, not by the interpreter) and returns its distinct leaves in walk order
and a `TreeDef`: the structure, written as a post-order *program*.
Every operation of functorkit runs on it: the maps rebuild from it, the flat
vector is planned from it (and ``re(p)`` is generated code compiled from it),
the arithmetic and ``load_into`` match their other trees against it.

The rules, written once here (see ``docs/concepts.md``):

* **Ties.** A leaf is identity-cached unless its type is ``bool``, ``int``,
  ``float``, ``complex``, ``str``, ``bytes`` or ``None``: an object met at
  several positions is one leaf (listed once, mapped once, rebuilt tied).
  Scalars are seen at every position.
* **Shared sub-trees.** A node object met at several positions is *shared*
  when its type is mutable (``NodeDef.mutable``: lists, dicts, modules,
  registered classes...), or when it holds at least one identity-cached leaf or
  mutable node; it is walked once (its first position) and comes back as one
  object from every rebuild. An immutable node without such a leaf (a tuple of
  ints, which CPython may intern) is walked at every position, each with its
  own path.
* **Unknown holders.** A leaf that no registry knows but that holds arrays is
  refused by every operation that promises something about arrays
  (`TreeDef.refuse_holders`, ``_holders.py``).
* **Trainable.** A position is trainable when every node above it declares
  that child trainable. A distinct leaf is trainable when at least one of
  its positions is (so a leaf tied between a frozen and a trainable slot is
  one trainable leaf, and its tie is kept everywhere). Parameters are the
  trainable floating and complex arrays.
* **Cycles** raise `StructureError` naming the path where they close.

The program
-----------
A list of entries in post-order:

* ``None``: one leaf position;
* ``(nd, keys, n, leafy, aux, named)``: a node with ``n`` children, rebuilt
  with ``nd`` (a `NodeDef`). When ``leafy`` its children are the next
  ``n`` leaf positions; otherwise they are the last ``n`` values built. For
  the built-in list and tuple ``keys`` is ``None`` (the indices);
* an ``int`` ``k``: the shared sub-tree built at entry ``k``, again.

Positions map to distinct leaves through ``pos_leaf`` (``None`` when every
position holds its own leaf).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

from ._errors import StructureError
from ._holders import refuse_unknown_holders
from ._keypath import KeyPath, make_path
from ._match import match_tree
from ._messages import add_note, describe_found, mismatch
from ._nodedef import aux_equal as _aux_equal
from ._registry import DICT, LIST, TUPLE, NodeDef, resolve

__all__ = [
    "BUILD_SAME",
    "BUILD_STRUCTURE",
    "TreeDef",
    "add_note",
    "describe_found",
    "mismatch",
]

BUILD_SAME, BUILD_STRUCTURE = 1, 2
_MISS = object()
_NO_AUX = None
_tnew = tuple.__new__

# node entry fields
_ND, _KEYS, _N, _LEAFY, _AUX, _NAMED = range(6)


# ============================================================== TreeDef


def _keys_hash(keys: Any) -> int:
    if keys is None:
        return 0
    try:
        return hash(tuple(keys))
    except TypeError:  # unhashable keys from a custom node: hash by count only
        return len(keys)


class TreeDef:
    """The recorded structure of a tree: node types, keys, aux data, ties, shared sub-trees, trainable leaves.

    Made by `flatten` (``leaves, treedef = fk.flatten(tree)``).
    Immutable, hashable, picklable; ``==`` is true for trees of the same
    structure (node types, keys, aux data, ties and trainable leaves).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones(2)
    >>> leaves, td = fk.flatten({"a": w, "b": [w, 3]})
    >>> td.num_leaves, td.num_positions, [str(p) for p in td.paths]  # a tie: listed once
    (2, 3, ['a', 'b[1]'])
    >>> out = td.unflatten([np.zeros(2), 4])
    >>> out["a"] is out["b"][0], out["b"][1]
    (True, 4)
    >>> td == fk.flatten({"a": np.ones(2), "b": [np.ones(2), 5]})[1]
    False
    """

    __slots__ = (
        "__weakref__",
        "_expanded",
        "_fast_build",
        "_fast_match",
        "_fast_plans",
        "_forced",
        "_hash",
        "_leaf_pos",
        "_nleaves",
        "_npos",
        "_pos_leaf",
        "_pos_paths",
        "_pre",
        "_prog",
        "_refs",
        "_trainable",
    )

    _prog: list[Any]
    _npos: int
    _nleaves: int
    _pos_leaf: tuple[int, ...] | None
    _trainable: tuple[bool, ...] | None
    _refs: frozenset[int]
    _forced: frozenset[int]
    _hash: int | None
    _pos_paths: list[KeyPath] | None
    _leaf_pos: list[int] | None
    _expanded: TreeDef | None
    _pre: list[int] | None
    _fast_build: Any
    _fast_match: Any
    _fast_plans: dict[Any, Any] | None

    def __init__(self) -> None:
        msg = "TreeDef objects are made by fk.flatten(tree); call that instead."
        raise TypeError(msg)

    @classmethod
    def _make(
        cls,
        prog: list[Any],
        npos: int,
        nleaves: int,
        pos_leaf: tuple[int, ...] | None,
        trainable: tuple[bool, ...] | None,
        refs: frozenset[int],
        forced: frozenset[int],
    ) -> TreeDef:
        self = object.__new__(cls)
        self._prog = prog
        self._npos = npos
        self._nleaves = nleaves
        self._pos_leaf = pos_leaf
        self._trainable = trainable
        self._refs = refs
        self._forced = forced
        self._hash = None
        self._pos_paths = None
        self._leaf_pos = None
        self._expanded = None if refs else self
        self._pre = None
        self._fast_build = None  # generated code for small container trees (see _record.record_plain)
        self._fast_match = None
        self._fast_plans = None  # per-operation plans on a reused definition (see _destructure)
        return self

    # ---------------------------------------------------------------- facts

    @property
    def num_leaves(self) -> int:
        """The number of distinct leaves (ties counted once; scalars at every position)."""
        return self._nleaves

    @property
    def num_positions(self) -> int:
        """The number of leaf positions (a tied leaf counts at each position; shared sub-trees once)."""
        return self._npos

    @property
    def num_nodes(self) -> int:
        """The number of node entries (each shared sub-tree counted once)."""
        return sum(1 for e in self._prog if type(e) is tuple)

    @property
    def paths(self) -> tuple[KeyPath, ...]:
        """The path of each distinct leaf (its first position), in walk order."""
        pp = self.position_paths()
        return tuple(pp[p] for p in self.leaf_positions())

    @property
    def trainable(self) -> tuple[bool, ...]:
        """For each distinct leaf: is at least one of its positions trainable?"""
        if self._trainable is None:
            return (True,) * self._nleaves
        return self._trainable

    def leaf_positions(self) -> list[int]:
        """The first position of each distinct leaf."""
        if self._leaf_pos is None:
            if self._pos_leaf is None:
                self._leaf_pos = list(range(self._npos))
            else:
                lp = [-1] * self._nleaves
                for p, j in enumerate(self._pos_leaf):
                    if lp[j] < 0:
                        lp[j] = p
                self._leaf_pos = lp
        return self._leaf_pos

    def position_values(self, leaves: list[Any]) -> list[Any]:
        """The value at each position, given one value per distinct leaf."""
        pl = self._pos_leaf
        if pl is None:
            return leaves
        return [leaves[j] for j in pl]

    def position_paths(self) -> list[KeyPath]:
        """The path of every leaf position, in order (one pass over the program, from the root)."""
        if self._pos_paths is None:
            self._pos_paths = self._walk_paths(None)[0]
        return self._pos_paths

    def entry_path(self, idx: int) -> KeyPath:
        """The path of the node at program entry `idx` (for error messages)."""
        return self._walk_paths(idx)[1]

    def _walk_paths(self, want: int | None) -> tuple[list[KeyPath], KeyPath]:
        """Paths of every position (and of entry `want`), walking the program from the root."""
        prog = self._prog
        out: list[Any] = [None] * self._npos
        pos = self._npos
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
                key = _MISS
            if idx == want:
                return out, make_path(() if key is _MISS else (*cur, key))
            e = prog[idx]
            if e is None:
                pos -= 1
                out[pos] = make_path(() if key is _MISS else (*cur, key))
            elif type(e) is tuple:
                n = e[_N]
                if e[_LEAFY]:
                    base = () if key is _MISS else (*cur, key)
                    keys = e[_KEYS]
                    pos -= n
                    if keys is None:
                        out[pos : pos + n] = [_tnew(KeyPath, (*base, j)) for j in range(n)]
                    else:
                        out[pos : pos + n] = [_tnew(KeyPath, (*base, k)) for k in keys]
                elif n:
                    if key is not _MISS:
                        cur.append(key)
                    stack.append([e[_KEYS], n, key is not _MISS])
            # an int (a shared sub-tree again) has no positions of its own
        return out, make_path(())

    def __repr__(self) -> str:
        return (
            f"TreeDef(leaves={self._nleaves}, positions={self._npos}, nodes={self.num_nodes}, "
            f"shared={len(self._refs)})"
        )

    # ---------------------------------------------------------------- equality, hashing, pickling

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            parts: list[Any] = [self._npos, self._nleaves, self._pos_leaf, self._trainable]
            for e in self._prog:
                if type(e) is tuple:
                    parts.append((e[_ND].kind, _keys_hash(e[_KEYS]), e[_N], e[_LEAFY]))
                else:
                    parts.append(e)
            h = self._hash = hash(tuple(parts))
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TreeDef):
            return NotImplemented
        if (
            self._npos != other._npos
            or self._nleaves != other._nleaves
            or self._pos_leaf != other._pos_leaf
            or self._trainable != other._trainable
            or len(self._prog) != len(other._prog)
            or hash(self) != hash(other)
        ):
            return False
        for a, b in zip(self._prog, other._prog):
            if type(a) is not tuple or type(b) is not tuple:
                if a != b:
                    return False
                continue
            if a[_ND].kind != b[_ND].kind or a[_N] != b[_N] or a[_LEAFY] != b[_LEAFY]:
                return False
            if not _aux_equal(a[_KEYS], b[_KEYS]) or not _aux_equal(a[_AUX], b[_AUX]):
                return False
        return True

    def __reduce__(self) -> tuple[Any, ...]:
        prog = [(e[_ND].cls, *e[1:]) if type(e) is tuple else e for e in self._prog]
        state = (prog, self._npos, self._nleaves, self._pos_leaf, self._trainable, sorted(self._forced))
        return (_restore_treedef, (state,))

    def to_json(self) -> str:
        """This structure as a JSON document of data only (no code, no pickle).

        Node classes are written by name, keys and static (aux) data as JSON
        values, with the ties, shared sub-trees and trainable flags; read it
        back with `TreeDef.from_json` (``==`` to this one). See
        ``docs/treedef.md``.

        Raises
        ------
        TypeError
            Naming the path of a node whose keys or aux data are not JSON data
            (a module's live state, a defaultdict's factory).

        Examples
        --------
        >>> import numpy as np
        >>> import functorkit as fk
        >>> _, td = fk.flatten({"w": np.ones(2), "layers": [np.zeros(1), (1, "relu")]})
        >>> text = td.to_json()
        >>> fk.TreeDef.from_json(text) == td
        True
        """
        # lazy, downward: _treedef_json imports _structured, whose registrations (exported to
        # pytree libraries, whose glue imports this module) must not run while this one loads
        from ._treedef_json import to_json

        return to_json(self)

    @classmethod
    def from_json(cls, text: str, /, *, classes: Any = None) -> TreeDef:
        """The structure a `to_json` document describes; classes come only from an allow-list.

        Parameters
        ----------
        text
            The document.
        classes
            The node classes the document may name besides functorkit's own
            (dict, list, tuple, OrderedDict, defaultdict, deque, UserDict,
            UserList, SimpleNamespace, Diagonal, Transpose): a sequence of
            classes (named ``module.qualname``) or a mapping ``{name: class}``.
            Nothing is ever imported by name.

        Raises
        ------
        ValueError
            The document is malformed, inconsistent or names a class not
            allowed, with what was expected.
        StructureError
            An allowed class is not registered as a node in this process.

        Examples
        --------
        >>> import dataclasses
        >>> import numpy as np
        >>> import functorkit as fk
        >>> @dataclasses.dataclass
        ... class Layer:
        ...     w: object
        >>> _, td = fk.flatten([Layer(np.ones(2))])
        >>> fk.TreeDef.from_json(td.to_json(), classes=[Layer]) == td
        True
        """
        from ._treedef_json import from_json  # lazy, downward (see to_json)

        out: TreeDef = from_json(text, _restore_treedef, classes=classes)
        return out

    # ---------------------------------------------------------------- rebuilding

    def unflatten(self, leaves: Iterable[Any], /) -> Any:
        """Rebuild the tree with one new value per distinct leaf (ties tied, shared sub-trees shared).

        Raises
        ------
        ValueError
            If the number of values is not ``num_leaves``.
        """
        vals = leaves if type(leaves) is list else list(leaves)
        if len(vals) != self._nleaves:
            msg = (
                f"TreeDef.unflatten: expected {self._nleaves} leaves (one per distinct leaf, in walk order), "
                f"got {len(vals)}. Fix: pass a list as long as the one fk.flatten returned."
            )
            raise ValueError(msg)
        return self.build(self.position_values(vals), BUILD_SAME)

    def build(self, vals: list[Any], mode: int = BUILD_SAME) -> Any:
        """Run the program over `vals` (one value per position): the tree (or plain structure)."""
        if mode == BUILD_SAME:
            if self._fast_build is not None:
                return self._fast_build(vals)
            return self._build_same(vals)
        prog = self._prog
        refs = self._refs
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
                nd, keys, n, leafy, aux, named = e
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
                if mode == BUILD_SAME:
                    fast = nd.fast
                    if fast == DICT:
                        out = dict(zip(keys, ch))
                    elif fast == LIST:
                        out = ch
                    elif fast == TUPLE:
                        out = tuple(ch)
                    else:
                        out = nd.unflatten(aux, keys if keys is not None else list(range(n)), ch)
                elif named:
                    out = dict(zip(keys, ch))
                elif nd.fast == TUPLE:
                    out = tuple(ch)
                else:
                    out = ch
                if idx in refs:
                    memo[idx] = out
                push(out)
        except Exception as e:
            add_note(e, f"(functorkit: raised while visiting {self.entry_path(idx).display})")
            raise
        return stack[0]

    def _build_same(self, vals: list[Any]) -> Any:
        """`build` in its common mode (the tree's own node types): the children of a node of leaves
        are taken straight from one iterator over `vals` (``zip`` stops at the keys, so it takes
        exactly ``n``), with no slice and no position count (bench_walk's fmap rows)."""
        refs = self._refs
        memo: dict[int, Any] = {}
        stack: list[Any] = []
        push = stack.append
        it = iter(vals)
        nxt = it.__next__
        idx = 0
        try:
            for idx, e in enumerate(self._prog):
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
            add_note(e, f"(functorkit: raised while visiting {self.entry_path(idx).display})")
            raise
        return stack[0]

    # ---------------------------------------------------------------- arrays
    def refuse_holders(self, values: list[Any], positions: bool = False) -> None:
        """The rule "no array is ever silently a constant" (SPEC 12, ``docs/treedef.md``): raise
        `StructureError` at the first leaf among `values` (one per distinct leaf, or one per
        position with ``positions=True``) that is an object no registry knows holding arrays.
        Every operation that promises something about a model's arrays calls this before it
        returns or writes anything (``_holders.py``)."""
        refuse_unknown_holders(values, self.position_paths if positions else (lambda: self.paths))

    # ---------------------------------------------------------------- other trees

    def expanded(self) -> TreeDef:
        """This structure with every shared sub-tree written out at each of its positions (no sharing)."""
        if self._expanded is not None:
            return self._expanded
        prog = self._prog
        # start entry and start position of the sub-tree ending at each entry
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
            elif e[_LEAFY]:
                starts.append((idx, pos))
                pos += e[_N]
            else:
                n = e[_N]
                first = starts[-n]
                del starts[-n:]
                starts.append(first)
            sub_start[idx], sub_pos[idx] = starts[-1]
        pl = self._pos_leaf if self._pos_leaf is not None else tuple(range(self._npos))
        forced = self._forced
        new_prog: list[Any] = []
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
                    p += 1
                elif type(e) is int:
                    emit(sub_start[e], e, sub_pos[e])
                else:
                    if e[_LEAFY]:
                        for q in range(p, p + e[_N]):
                            if q in forced:
                                new_forced.add(len(new_pl))
                            new_pl.append(pl[q])
                        p += e[_N]
                    new_prog.append(e)
            return p

        emit(0, len(prog) - 1, 0)
        pos_leaf = None if new_pl == list(range(len(new_pl))) else tuple(new_pl)
        out = TreeDef._make(
            new_prog, len(new_pl), self._nleaves, pos_leaf, self._trainable, frozenset(), frozenset(new_forced)
        )
        self._expanded = out
        return out

    def flatten_up_to(self, tree: Any, /, *, which: int = 1, names: tuple[str, ...] | None = None) -> list[Any]:
        """The objects of `tree` at this structure's leaf positions, one per position.

        `tree` must have this structure down to the leaf positions (node
        types, keys — dicts matched by key —, lengths); what sits at a leaf
        position is taken whole, and must not be a node unless this
        structure's leaf there was chosen by ``is_leaf``. A sub-tree shared
        here must be one object there too.

        Raises
        ------
        StructureError
            Naming the first path where `tree` differs, and both sides.
        """
        out = self._match(tree, which, names)
        if type(out) is int:
            msg = (
                f"at {self.entry_path(out).display}: a sub-tree shared here (one object at several places) is not "
                "shared in the other tree. Expected the same object at each place; fix: use "
                "`treedef.expanded()` to match without sharing."
            )
            raise StructureError(msg)
        assert type(out) is list
        return out

    def children(self) -> dict[int, list[int]]:
        """For each node entry with node children: the program indices of its children, in order."""
        children: dict[int, list[int]] = {}
        roots: list[int] = []
        for idx, e in enumerate(self._prog):
            if type(e) is tuple and not e[_LEAFY] and e[_N]:
                n = e[_N]
                children[idx] = roots[-n:]
                del roots[-n:]
            roots.append(idx)
        return children

    def _preorder(self) -> list[int]:
        """The program's entry indices in pre-order (a node before its children, left to right)."""
        pre = self._pre
        if pre is None:
            prog = self._prog
            children = self.children()
            pre = []
            todo = [len(prog) - 1] if prog else []
            while todo:
                idx = todo.pop()
                pre.append(idx)
                ch = children.get(idx)
                if ch is not None:
                    todo.extend(reversed(ch))
            self._pre = pre
        return pre

    def _match(
        self,
        tree: Any,
        which: int,
        names: tuple[str, ...] | None,
        firsts: list[Any] | None = None,
        fail: Callable[[KeyPath, str, str], StructureError] | None = None,
    ) -> list[Any] | int:
        """`flatten_up_to`, or the program index of a shared sub-tree here that is not shared in `tree`
        (``_match.py``)."""
        return match_tree(self, tree, which, names, firsts, fail)


def _check_program(
    prog: list[Any], npos: int, nleaves: int, pos_leaf: Any, trainable: Any, forced: list[int], bad: str
) -> None:
    """The counts of an unpickled program agree (every index it holds is in range), so running it
    can only fail in a node's own code: the stack never runs short, one tree comes out, positions
    and leaves are as many as the state says."""
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
    if depth != 1 or positions != npos or not 0 <= nleaves <= npos:
        raise pickle.UnpicklingError(bad)
    if pos_leaf is None:
        if nleaves != npos:
            raise pickle.UnpicklingError(bad)
    elif len(pos_leaf) != npos or any(not 0 <= j < nleaves for j in pos_leaf):
        raise pickle.UnpicklingError(bad)
    if (trainable is not None and len(trainable) != nleaves) or any(not 0 <= j < npos for j in forced):
        raise pickle.UnpicklingError(bad)


def _restore_treedef(state: Any) -> TreeDef:
    """Unpickle a TreeDef: every field is type-checked, node classes are looked up in the registry."""
    bad = "unpickling a TreeDef: the pickled state is malformed"
    if type(state) is not tuple or len(state) != 6:
        raise pickle.UnpicklingError(bad)
    prog_in, npos, nleaves, pos_leaf, trainable, forced = state
    if type(prog_in) is not list or type(npos) is not int or type(nleaves) is not int:
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
    if pos_leaf is not None and (type(pos_leaf) is not tuple or any(type(j) is not int for j in pos_leaf)):
        raise pickle.UnpicklingError(bad)
    if trainable is not None and (type(trainable) is not tuple or any(type(b) is not bool for b in trainable)):
        raise pickle.UnpicklingError(bad)
    if type(forced) is not list or any(type(j) is not int for j in forced):
        raise pickle.UnpicklingError(bad)
    _check_program(prog, npos, nleaves, pos_leaf, trainable, forced, bad)
    refs = frozenset(e for e in prog if type(e) is int)
    return TreeDef._make(prog, npos, nleaves, pos_leaf, trainable, refs, frozenset(forced))
