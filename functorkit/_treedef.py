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
The structure is a *program*: a post-order list of entries, written by the walk and read only
by the program module (``_program.py``, ``_program_match.py``), which declares its layout once
and provides every loop over it (paths, rebuild, matching, expansion, trainable positions,
hashing, pickling). `TreeDef` is its public face; its private fields are read only there and
here.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

from . import _program as program
from ._errors import StructureError
from ._holders import refuse_unknown_holders
from ._keypath import KeyPath
from ._messages import add_note, describe_found, mismatch
from ._plans import BUILD_BY_ID, match_of
from ._program import BUILD_SAME, BUILD_STRUCTURE, MISS
from ._program_match import match_tree
from ._registry import GEN, TABLES

__all__ = [
    "BUILD_SAME",
    "BUILD_STRUCTURE",
    "TreeDef",
    "add_note",
    "describe_found",
    "mismatch",
]

_MISS = MISS
_NO_AUX = None


# ============================================================== TreeDef


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
        "_forced",
        "_gen_build",
        "_gen_match",
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
    _gen_build: tuple[Any, Any] | None  # the plan cache's generated builder and its snapshot's generation, once found
    _gen_match: tuple[Any, Any] | None  # the same for the generated matcher

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
        self._gen_build = None
        self._gen_match = None
        return self

    @classmethod
    def _recorded(
        cls,
        prog: list[Any],
        npos: int,
        nleaves: int,
        pos_leaf: tuple[int, ...] | None,
        refs: frozenset[int],
        forced: frozenset[int],
        tsets: dict[int, frozenset[Any]],
    ) -> TreeDef:
        """The definition the walk recorded; `tsets` (``id(entry)`` -> the trainable child keys its
        node declared) are resolved into the trainable leaves over the program."""
        self = cls._make(prog, npos, nleaves, pos_leaf, None, refs, forced)
        if tsets:
            self._trainable = program.trainable_leaves(self, tsets)
            self._expanded = None if refs else self  # (expanded above without the trainable flags)
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
        return program.num_nodes(self._prog)

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
        return program.walk_paths(self, want)

    def __repr__(self) -> str:
        return (
            f"TreeDef(leaves={self._nleaves}, positions={self._npos}, nodes={self.num_nodes}, "
            f"shared={len(self._refs)})"
        )

    # ---------------------------------------------------------------- equality, hashing, pickling

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash(
                (self._npos, self._nleaves, self._pos_leaf, self._trainable, program.program_hash(self._prog))
            )
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
        return program.programs_equal(self._prog, other._prog)

    def __reduce__(self) -> tuple[Any, ...]:
        prog = program.reduce_program(self._prog)
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
            # generated code for a small container tree met before (the plan cache, ``_plans.py``)
            hit = self._gen_build
            if hit is None:
                found = BUILD_BY_ID.get(id(self))
                if found is not None:
                    hit = self._gen_build = found[:2]  # (builder, snapshot): kept here once found
            if hit is not None and hit[1] == TABLES[0][GEN]:
                return hit[0](vals)
        return program.build(self, vals, mode)

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
        prog, npos, pos_leaf, forced, _ = program.expand(self)
        out = TreeDef._make(prog, npos, self._nleaves, pos_leaf, self._trainable, frozenset(), forced)
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
        return program.children(self._prog)

    def _preorder(self) -> list[int]:
        """The program's entry indices in pre-order (a node before its children, left to right)."""
        pre = self._pre
        if pre is None:
            pre = self._pre = program.preorder(self._prog)
        return pre

    # ---------------------------------------------------------------- for the engine's operations

    def _ties(self) -> tuple[int, ...] | None:
        """The distinct leaf at each position, or None when every position holds its own leaf."""
        return self._pos_leaf

    def _shares(self) -> bool:
        """Whether some sub-tree is shared (one node object at several positions)."""
        return bool(self._refs)

    def _trainable_mask(self) -> tuple[bool, ...] | None:
        """`trainable`, or None when every leaf is trainable."""
        return self._trainable

    def _generated_match(self) -> Any:
        """The generated ``match(tree, ties=True) -> leaves or MISS`` the plan cache made for this
        definition, valid under the published node table; None if there is none."""
        hit = self._gen_match
        if hit is None:
            found = match_of(self)
            if found is None:
                return None
            hit = self._gen_match = (found, TABLES[0][GEN])
        return hit[0] if hit[1] == TABLES[0][GEN] else None

    def _num_entries(self) -> int:
        """The length of the program (what the generated code's size limits count)."""
        return len(self._prog)

    def _match(
        self,
        tree: Any,
        which: int,
        names: tuple[str, ...] | None,
        firsts: list[Any] | None = None,
        fail: Callable[[KeyPath, Any, Any], StructureError] | None = None,
    ) -> list[Any] | int:
        """`flatten_up_to`, or the program index of a shared sub-tree here that is not shared in `tree`
        (``_program_match.py``)."""
        return match_tree(self, tree, which, names, firsts, fail)


def _check_counts(npos: int, nleaves: int, pos_leaf: Any, trainable: Any, forced: list[int], bad: str) -> None:
    """The counts of an unpickled definition agree with its program's (`program.check_program`)."""
    if not 0 <= nleaves <= npos:
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
    prog = program.restore_program(prog_in, bad)
    if pos_leaf is not None and (type(pos_leaf) is not tuple or any(type(j) is not int for j in pos_leaf)):
        raise pickle.UnpicklingError(bad)
    if trainable is not None and (type(trainable) is not tuple or any(type(b) is not bool for b in trainable)):
        raise pickle.UnpicklingError(bad)
    if type(forced) is not list or any(type(j) is not int for j in forced):
        raise pickle.UnpicklingError(bad)
    program.check_program(prog, npos, bad)
    _check_counts(npos, nleaves, pos_leaf, trainable, forced, bad)
    refs = frozenset(e for e in prog if type(e) is int)
    return TreeDef._make(prog, npos, nleaves, pos_leaf, trainable, refs, frozenset(forced))
