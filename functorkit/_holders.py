"""Objects that no registry knows but that hold arrays: never silently a constant (SPEC section 9).

A leaf of a model that is not an array, a built-in scalar, a function or a
class, and that no registry knows, is an *unknown holder* when arrays sit in
it: in its attributes (``__dict__`` or ``__slots__``), or among the items of a
``Mapping``/``Sequence`` subclass, directly or inside containers and other
such objects up to `DEPTH` levels down. ``fk.destructure`` refuses one
under ``policy="strict"`` (the ``UNKNOWN_HOLDER`` row of ``_policy.py``);
``re.explain`` lists those it carries as constants under the other policies.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath
from ._record import record
from ._registry import SCALAR_TYPES, NodeDef, dispatch, registered_leaf
from ._xp import is_array

__all__ = ["DEPTH", "holds_arrays", "unknown_holder_error", "unknown_holders"]

#: how many levels of attributes/items below a leaf are searched for arrays
DEPTH = 3

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
    """What `x` holds one level down: a Mapping's values, a Sequence's items, else its attributes."""
    if isinstance(x, Mapping):
        return list(x.values())
    if isinstance(x, Sequence):
        return list(x)
    out: list[Any] = []
    d = getattr(x, "__dict__", None)
    if type(d) is dict:
        out.extend(d.values())
    for c in type(x).__mro__:
        slots = c.__dict__.get("__slots__", ())
        for name in (slots,) if type(slots) is str else slots:
            if name not in ("__dict__", "__weakref__"):
                v = getattr(x, name, None)
                if v is not None:
                    out.append(v)
    return out


def holds_arrays(x: Any, depth: int = DEPTH, seen: set[int] | None = None) -> bool:
    """True if `x`, a leaf to functorkit, is an object no registry knows that holds arrays."""
    t = type(x)
    if t in SCALAR_TYPES or isinstance(x, _NOT_HOLDERS) or registered_leaf(t) or is_array(x):
        return False
    if seen is None:
        seen = set()
    if id(x) in seen:
        return False
    seen.add(id(x))
    vals = _contents(x)
    if any(is_array(v) for v in vals):
        return True
    if depth <= 1:
        return False
    for v in vals:
        if type(v) in SCALAR_TYPES:
            continue
        if isinstance(dispatch(v), NodeDef):  # a container functorkit walks: look at its leaves
            try:
                inner, _ = record(v, track=False)
            except StructureError:  # a cycle inside: nothing this check can add
                continue
            if any(is_array(y) or holds_arrays(y, depth - 1, seen) for y in inner):
                return True
        elif holds_arrays(v, depth - 1, seen):
            return True
    return False


def unknown_holders(leaves: list[Any], paths: tuple[KeyPath, ...], skip: set[int]) -> list[tuple[KeyPath, str]]:
    """``(path, class name)`` of each unknown holder among `leaves` (indices in `skip` excluded)."""
    return [
        (paths[j], type(x).__qualname__)
        for j, x in enumerate(leaves)
        if j not in skip and x is not None and holds_arrays(x)
    ]


def unknown_holder_error(path: KeyPath, name: str) -> StructureError:
    msg = (
        f"at {path.display}: fk.destructure found a {name} that holds arrays, but no registry "
        f"knows {name}, so it would silently be a constant (its arrays not parameters). Expected registered "
        f"nodes; fix: register it (fk.register({name}, children=..., rebuild=...), or "
        f"@fk.register_dataclass), or fk.register_leaf({name}) to keep it a constant on purpose, or pass "
        "policy='model'/'flat' to carry it unchanged."
    )
    return StructureError(msg)
