"""optree's registry, bridged in (SPEC section 9).

`node_for` makes a functorkit node of a class optree knows as a node:
registered in optree's global namespace, else in exactly one named namespace
(``optree.register_pytree_node(..., namespace="mine")``; not ``"torch"``, which
torch fills with copies of its own registrations; optree has no public
way to list the namespaces of a class, so its registry dict is read, feature
detected). Children come from its ``flatten_func``; the entries it returns
become path entries when they are distinct and hashable, else positions; the
object is rebuilt by its ``unflatten_func``. functorkit exports nothing to
optree (SPEC section 9 names JAX and torch).

Loaded by ``functorkit/_registry.py`` only once ``optree`` is in ``sys.modules``.
"""

from __future__ import annotations

from typing import Any

import optree

from .._nodedef import NodeDef
from ._pytree_keys import named_keys

__all__ = ["node_for"]

#: optree's registry dict (private; keys: a class for the global namespace, (namespace, class) otherwise)
_REGISTRY: Any = getattr(getattr(optree, "registry", None), "_NODETYPE_REGISTRY", None)


#: namespaces other libraries fill with copies of their own registries (torch's ``_cxx_pytree`` copies
#: every ``torch.utils._pytree`` registration into "torch", without keys): read from the original
_MIRRORS = frozenset({"torch"})


def _lookup(cls: type) -> Any:
    entry = optree.register_pytree_node.get(cls)
    if entry is not None or not isinstance(_REGISTRY, dict):
        return entry
    # one C-level copy first (no Python code runs inside dict.copy, so no other thread can register
    # meanwhile; torch mirrors each of its registrations into this dict): then a private loop
    found = [
        v
        for k, v in _REGISTRY.copy().items()
        if type(k) is tuple and len(k) == 2 and k[1] is cls and k[0] not in _MIRRORS
    ]
    return found[0] if len(found) == 1 else None


def node_for(cls: type) -> NodeDef | None:
    """A NodeDef for a class optree registered as a node, or None."""
    entry = _lookup(cls)
    if entry is None:
        return None
    flatten_func = entry.flatten_func
    unflatten_func = entry.unflatten_func

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        out = flatten_func(x)
        values = list(out[0])
        keys = None
        if len(out) > 2 and out[2] is not None:
            keys = named_keys([(True, e) for e in out[2]])
            if keys is not None and keys == list(range(len(values))):
                keys = None
        if keys is None:
            return list(range(len(values))), values, out[1], False
        return keys, values, out[1], True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        return unflatten_func(aux, values)

    return NodeDef(cls, flatten, unflatten)
