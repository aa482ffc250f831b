"""What a node is: `NodeDef` (how one node type is taken apart and rebuilt) and the equality of
its aux data (`aux_equal`).

At the bottom of the import graph (it imports no functorkit module): the registry (``_registry.py``,
the table of NodeDefs), the tree definition and the pytree and ``nn.Module`` glue modules of the
adapters (which the registry loads) all build on it; ``_registry`` re-exports `NodeDef` and the
fast-path codes (docs/adapters.md, "Import layering").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = [
    "DICT",
    "GENERIC",
    "LIST",
    "TUPLE",
    "NodeDef",
    "aux_equal",
    "cached_properties",
    "fields_check",
    "mapping_check",
    "sequence_check",
]

# fast-path codes used by the walk for the built-in containers
GENERIC, DICT, LIST, TUPLE = 0, 1, 2, 3


class NodeDef:
    """How one node type is taken apart and put back together.

    ``flatten(obj) -> (keys, values, aux, named)`` lists the children in walk
    order (``named`` is true when the children form a mapping);
    ``unflatten(aux, keys, values) -> obj`` rebuilds; ``trainable(obj)``
    returns the set of trainable child keys, or ``None`` for all.

    ``kind`` says which classes count as the same node type when two trees
    are matched (default: the class itself); torch's parametrized modules
    (one class made per instance) share the kind of their original class.

    ``owns`` is true when the node object itself holds a strong reference to
    every child ``flatten`` returns (a container, a namedtuple, a plain
    dataclass), so the walk need not keep the ``values`` list alive to keep
    the children's identities unique; ``fast`` marks the built-in
    containers the walk handles inline.

    ``state_skip(aux)`` (optional) returns the child keys that are not part
    of the node's state dict (torch: non-persistent buffers), or None.

    ``flatten_slots(obj)`` (default: ``flatten``) is ``flatten`` for a node
    that leaves out slots holding ``None`` (torch modules: ``bias=None``): it
    lists them too, as ``None`` children, so that trees differing only in
    which slots hold ``None`` have one structure. Only ``fk.combine`` uses it.

    ``children(obj) -> (keys, values)`` (optional) is ``flatten`` without the aux data, for the
    matchers, which compare a tree's keys and children with a recorded definition only (torch
    modules: no copy of the module's attributes per match); ``children(obj, False)`` may leave
    the keys out, ``(None, values)``, for ``fk.leaves``, which lists the children only.

    ``mutable`` (default true) says whether one object of this type met at
    several positions is one shared sub-tree even when it holds only scalars
    (SPEC 12, ``docs/treedef.md`` R2): false for tuples, namedtuples, frozen
    dataclasses and attrs classes, and mapping proxies.

    ``lockstep(trees, track, tables) -> (leaves, flags, nodes) | None`` (optional) walks trees
    rooted at this node type in lock step, for the in-place arithmetic (``out=``) and the
    reductions, which need no definition to rebuild: ``leaves`` the leaves of each tree in the
    walk's order, ``flags`` the first tree's trainable leaves (None: every leaf, or `track` false),
    ``nodes`` the first tree's nodes. It answers only where recording the first tree and matching
    the others against it would give the same lists without failing (torch modules of the
    adapter's own node types), provided the first tree's leaves and nodes are all distinct, which
    the engine then tests (no tie, no shared sub-tree); None otherwise, and the recording walk
    then runs (and names any difference).

    ``check(keys, n, aux, named)`` (optional) says whether a recorded entry read from outside (a
    ``TreeDef.from_json`` document) is one this node's ``flatten`` could have made: ``None`` if so,
    else what is wrong (the built-in containers, namedtuples, dataclasses and attrs classes, the
    structured wrappers, and the form of a registered class's entry). Never on a hot path.
    """

    __slots__ = (
        "check",
        "children",
        "cls",
        "fast",
        "flatten",
        "flatten_slots",
        "kind",
        "lockstep",
        "mutable",
        "owns",
        "state_skip",
        "trainable",
        "unflatten",
    )

    def __init__(
        self,
        cls: type,
        flatten: Callable[[Any], tuple[list[Any], list[Any], Any, bool]],
        unflatten: Callable[[Any, list[Any], list[Any]], Any],
        trainable: Callable[[Any], frozenset[Any] | None] | None = None,
        fast: int = GENERIC,
        *,
        owns: bool = False,
        kind: Any = None,
        state_skip: Callable[[Any], Any] | None = None,
        flatten_slots: Callable[[Any], tuple[list[Any], list[Any], Any, bool]] | None = None,
        mutable: bool = True,
        children: Callable[..., tuple[list[Any] | None, list[Any]]] | None = None,
        check: Callable[[Any, int, Any, bool], str | None] | None = None,
        lockstep: Callable[..., tuple[list[list[Any]], list[bool] | None, list[Any]] | None] | None = None,
    ) -> None:
        self.check = check
        self.lockstep = lockstep
        self.cls = cls
        self.mutable = mutable
        self.kind = cls if kind is None else kind
        self.flatten = flatten
        self.unflatten = unflatten
        self.trainable = trainable
        self.fast = fast
        self.owns = owns
        self.state_skip = state_skip
        self.flatten_slots = flatten if flatten_slots is None else flatten_slots
        self.children = children

    def __repr__(self) -> str:
        return f"NodeDef({self.cls.__qualname__})"


def aux_equal(a: Any, b: Any) -> bool:
    """Aux data equality that never raises: identical, or ``==`` answering a plain ``True``."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is tuple or type(a) is list:
        return len(a) == len(b) and all(aux_equal(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(aux_equal(a[k], b[k]) for k in a)
    try:
        same = a == b
    except (TypeError, ValueError):
        return False
    return same is True


# ---------------------------------------------------------------- entry checks (NodeDef.check)


def _distinct(keys: Any) -> bool:
    try:
        return len(set(keys)) == len(keys)
    except TypeError:  # an unhashable key
        return False


def mapping_check(aux_ok: Callable[[Any], bool] | None = None, str_keys: bool = False) -> Callable[..., str | None]:
    """The `NodeDef.check` of a mapping node: named, `n` distinct keys (str ones if `str_keys`),
    aux None (or accepted by `aux_ok`)."""

    def check(keys: Any, n: int, aux: Any, named: bool) -> str | None:
        if not named or type(keys) is not list or len(keys) != n or not _distinct(keys):
            return f"a mapping node needs `named` true and {n} distinct keys"
        if str_keys and not all(type(k) is str for k in keys):
            return "its keys must be strings (attribute names)"
        if not (aux is None if aux_ok is None else aux_ok(aux)):
            return f"unexpected static (aux) data {aux!r:.60}"
        return None

    return check


def sequence_check(aux_ok: Callable[[Any, int], bool] | None = None) -> Callable[..., str | None]:
    """The `NodeDef.check` of a sequence node: not named, keys absent or the indices ``0..n-1``,
    aux None (or accepted by ``aux_ok(aux, n)``)."""

    def check(keys: Any, n: int, aux: Any, named: bool) -> str | None:
        if named or not (keys is None or keys == list(range(n))):
            return "a sequence node needs `named` false and no keys (or the indices 0, 1, ...)"
        if not (aux is None if aux_ok is None else aux_ok(aux, n)):
            return f"unexpected static (aux) data {aux!r:.60} for {n} children"
        return None

    return check


def fields_check(names: list[Any], aux_ok: Callable[[Any], bool]) -> Callable[..., str | None]:
    """The `NodeDef.check` of a node whose children are fixed fields `names` (a namedtuple, a
    dataclass, a structured wrapper): exactly those keys, in that order; aux accepted by `aux_ok`."""

    def check(keys: Any, n: int, aux: Any, named: bool) -> str | None:
        if not named or keys != names:
            return f"expected the keys {names!r} (the class's fields), got {keys!r:.80}"
        if not aux_ok(aux):
            return f"unexpected static (aux) data {aux!r:.60}"
        return None

    return check


def cached_properties(cls: type) -> tuple[str, ...]:
    """The names of the ``functools.cached_property`` attributes of `cls` (its MRO, each once): the
    values they cache in an instance's ``__dict__`` were computed from that instance's children, so
    a rebuilt node must not carry them over (dataclasses, attrs classes, namedtuple subclasses,
    torch modules). Not callable while Dynamo traces (it cannot iterate an MRO): callers skip it then."""
    cached = functools.cached_property
    return tuple(dict.fromkeys(name for c in cls.__mro__ for name, v in vars(c).items() if isinstance(v, cached)))
