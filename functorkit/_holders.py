"""Objects that no registry knows but that hold arrays: never silently a constant (SPEC sections 9, 12).

A leaf of a model that is not an array, a built-in scalar, a function or a
class, and that no registry knows, is an *unknown holder* when arrays sit in
it: in its attributes (``__dict__`` or ``__slots__``), among the items of a
``Mapping``/``Sequence`` subclass (and its own attributes), of a set or a mapping's values view, or in what
a ``functools.partial`` holds, directly or inside containers and other such
objects up to `DEPTH` levels down (at most `BUDGET` objects per leaf).

The classification is made once per leaf *type* where the type decides it
(`never_holds`: scalars, arrays, functions, classes, registered leaves, and
objects with neither attributes nor items can never be holders), and per object
only for the others. `refuse_unknown_holders` is the one check every operation
that promises something about a model's arrays calls on the values its tree
definition gave it (``TreeDef.refuse_holders``): a C-level subset test of the
leaf types when no leaf can be a holder (the common case), a look at the
remaining objects otherwise.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Mapping, Sequence, ValuesView
from collections.abc import Set as AbstractSet
from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath
from ._registry import GENERATION, SCALAR_TYPES, NodeDef, dispatch, registered_leaf
from ._xp import is_array

__all__ = [
    "BUDGET",
    "DEPTH",
    "holds_arrays",
    "never_holds",
    "refuse_unknown_holders",
    "unknown_holder_error",
    "unknown_holders",
    "use_walk",
]

#: how many levels of attributes/items below a leaf are searched for arrays (a plain-Python model
#: ``Model.encoder.blocks[i].attn.w`` is 5 levels below its root: it was missed at 3)
DEPTH = 12
#: at most this many objects below one leaf are looked at (an object graph of plain data, a
#: tokenizer's vocabulary, costs no more than this per call)
BUDGET = 10_000

_NOT_HOLDERS = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    type,
    str,
    bytes,
    bytearray,
    memoryview,
    range,
)


def _contents(x: Any) -> list[Any]:
    """What `x` holds one level down: a Mapping's values or a Sequence's or set's items (and, for
    subclasses, their own attributes), what a ``functools.partial`` holds, else its attributes."""
    out: list[Any] = []
    t = type(x)
    if isinstance(x, Mapping):
        out.extend(x.values())
        if t is dict:
            return out
    elif isinstance(x, (Sequence, AbstractSet, ValuesView)):  # (a dict's values(): keys/items are sets)
        out.extend(x)
        if t in (list, tuple, set, frozenset):
            return out
    elif isinstance(x, functools.partial):
        out.append(x.func)
        out.extend(x.args)
        out.extend(x.keywords.values())
    d = getattr(x, "__dict__", None)
    if type(d) is dict:
        out.extend(d.values())
    for c in t.__mro__:
        slots = c.__dict__.get("__slots__", ())
        for name in (slots,) if type(slots) is str else slots:
            if name not in ("__dict__", "__weakref__"):
                v = getattr(x, name, None)
                if v is not None:
                    out.append(v)
    return out


#: the walk (`functorkit._record.record`), handed over by `_record` when it is imported (`use_walk`):
#: the walk builds on the tree definition, which calls this check, so this module sits below it and
#: cannot import it (docs/adapters.md, "Import layering")
_WALK: list[Callable[..., tuple[list[Any], Any]]] = []


def use_walk(record: Callable[..., tuple[list[Any], Any]]) -> None:
    """Set the walk `holds_arrays` looks inside registered containers with (``_record.record``)."""
    _WALK[:] = [record]


def _opaque(v: Any) -> bool:
    """`v` may hold arrays in a way this check looks at (not a scalar, array, function, class,
    registered leaf)."""
    t = type(v)
    return not (t in SCALAR_TYPES or isinstance(v, _NOT_HOLDERS) or registered_leaf(t) or is_array(v))


def holds_arrays(x: Any, depth: int = DEPTH, seen: set[int] | None = None) -> bool:
    """True if `x`, a leaf to functorkit, is an object no registry knows that holds arrays: a search
    through its contents (`_contents`; registered containers by the walk) up to `depth` levels and
    `BUDGET` objects, each object once (cycles end), without recursion."""
    if not _opaque(x):
        return False
    if seen is None:
        seen = set()
    todo = [(x, depth)]
    looked = 0
    while todo:
        v, d = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        looked += 1
        if looked > BUDGET:
            return False
        vals = _contents(v)
        if any(is_array(y) for y in vals):
            return True
        if d <= 1:
            continue
        for y in vals:
            if type(y) in SCALAR_TYPES:
                continue
            if isinstance(dispatch(y), NodeDef):  # a container functorkit walks: look at its leaves
                try:
                    inner, _ = _WALK[0](y, track=False)
                except StructureError:  # a cycle inside: nothing this check can add
                    continue
                if any(is_array(z) for z in inner):
                    return True
                todo.extend((z, d - 1) for z in inner if _opaque(z))
            elif _opaque(y):
                todo.append((y, d - 1))
    return False


def unknown_holders(leaves: list[Any], paths: tuple[KeyPath, ...], skip: set[int]) -> list[tuple[KeyPath, str]]:
    """``(path, class name)`` of each unknown holder among `leaves` (indices in `skip` excluded)."""
    return [
        (paths[j], type(x).__qualname__)
        for j, x in enumerate(leaves)
        if j not in skip and x is not None and holds_arrays(x)
    ]


def unknown_holder_error(path: KeyPath, name: str) -> StructureError:
    """The one error for an unknown holder, whichever operation met it."""
    msg = (
        f"at {path.display}: a {name} holds arrays, but no registry knows {name}, so its arrays would "
        f"silently be constants (not parameters, not copied, not saved, not loaded). Expected a registered "
        f"node; fix: register it (fk.register({name}, children=..., rebuild=...), or @fk.register_dataclass), "
        f"or fk.register_leaf({name}) to keep it a constant on purpose."
    )
    return StructureError(msg)


# ---------------------------------------------------------------- the engine's check

#: leaf types that can never be unknown holders, valid for the registry generation in `_NEVER_GEN`
_NEVER: set[Any] = set(SCALAR_TYPES)
_NEVER_GEN: list[int] = [GENERATION[0]]
#: leaf types whose objects are looked at one by one (they may or may not hold arrays)
_MAYBE: set[Any] = set()


def never_holds(x: Any) -> bool:
    """Whether no object of ``type(x)`` can be an unknown holder (decided once per type)."""
    t = type(x)
    if t in _NEVER:
        return True
    if t in _MAYBE:
        return False
    try:
        array = is_array(x)
    except TypeError:  # np.matrix: the operation itself refuses it, with its path
        array = True
    if (
        array
        or issubclass(t, _NOT_HOLDERS)
        or registered_leaf(t)
        or not (
            issubclass(t, (Mapping, Sequence, AbstractSet, ValuesView, functools.partial))
            or hasattr(x, "__dict__")
            or any(_slot_names(c) for c in t.__mro__)
        )
    ):
        _NEVER.add(t)
        return True
    _MAYBE.add(t)
    return False


def _slot_names(c: type) -> list[str]:
    slots = c.__dict__.get("__slots__", ())
    return [n for n in ((slots,) if type(slots) is str else slots) if n not in ("__dict__", "__weakref__")]


def refuse_unknown_holders(values: list[Any], paths: Any) -> None:
    """Raise `unknown_holder_error` for the first unknown holder among `values` (a tree's leaves or
    position values); `paths()` gives their paths (only called to name one). One C-level pass over
    the types when every type is known never to hold arrays."""
    gen = GENERATION[0]
    if _NEVER_GEN[0] != gen:  # a registration (register_leaf) changed what counts
        _NEVER.clear()
        _NEVER.update(SCALAR_TYPES)
        _MAYBE.clear()
        _NEVER_GEN[0] = gen
    if _NEVER.issuperset(map(type, values)):
        return
    for j, x in enumerate(values):
        if not never_holds(x) and holds_arrays(x):
            raise unknown_holder_error(paths()[j], type(x).__qualname__)
