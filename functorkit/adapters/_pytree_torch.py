"""torch's ``torch.utils._pytree`` registry, both ways (SPEC section 9).

In: `node_for` makes a functorkit node of a class in
``torch.utils._pytree.SUPPORTED_NODES`` (``torch.Size``, ``collections.deque``,
``torch.return_types`` and the classes users registered there): children from
its ``flatten_with_keys_fn`` when it has one (``MappingKey`` -> its key,
``GetAttrKey`` -> its name, ``SequenceKey`` -> the index), else its
``flatten_fn`` with positions; rebuilt by its ``unflatten_fn``.

Out: `export` registers a functorkit node class with torch (children
through functorkit's own ``flatten``/``unflatten``), or a class as a node
with no children whose context is the object itself (``Restructure``,
``TreeDef``: so ``torch.func.vmap`` passes them through with the default
``in_dims``). A class torch already knows is left alone.

``torch.utils._pytree`` is private to torch, but it is the registry
``torch.func``, ``torch.compile`` and ``torch.export`` read, and
``register_pytree_node``/``SUPPORTED_NODES`` have been stable since torch 2.2.
Loaded by ``functorkit/_registry.py`` only once ``torch`` is in ``sys.modules``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch.utils._pytree as pytree

from .._nodedef import NodeDef
from ._pytree_keys import ExportAux, Lookup, exported_flatten, exported_unflatten, named_keys

__all__ = ["export", "node_for"]


def _entry(k: Any) -> tuple[bool, Any] | None:
    t = type(k)
    if t is pytree.MappingKey:
        return True, k.key
    if t is pytree.GetAttrKey:
        return True, k.name
    if t is pytree.SequenceKey:
        return False, k.idx
    return None


def node_for(cls: type) -> NodeDef | None:
    """A NodeDef for a class torch's ``_pytree`` registered as a node, or None."""
    entry = pytree.SUPPORTED_NODES.get(cls)
    if entry is None:
        return None
    with_keys = entry.flatten_with_keys_fn
    flatten_fn = entry.flatten_fn
    unflatten_fn = entry.unflatten_fn

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        if with_keys is None:
            values, ctx = flatten_fn(x)
            values = list(values)
            return list(range(len(values))), values, ctx, False
        pairs, ctx = with_keys(x)
        values = [v for _, v in pairs]
        keys = named_keys([_entry(k) for k, _ in pairs])
        if keys is None:
            return list(range(len(values))), values, ctx, False
        return keys, values, ctx, True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        return unflatten_fn(values, aux)

    return NodeDef(cls, flatten, unflatten)


def _static_flatten(x: Any) -> tuple[list[Any], Any]:
    return [], x


def _static_flatten_with_keys(x: Any) -> tuple[list[tuple[Any, Any]], Any]:
    return [], x


def _static_unflatten(values: Any, ctx: Any) -> Any:
    return ctx


def _key(k: Any, named: bool) -> Any:
    if not named:
        return pytree.SequenceKey(k)
    return pytree.GetAttrKey(k) if type(k) is str and k.isidentifier() else pytree.MappingKey(k)


def _flatten(lookup: Lookup, x: Any) -> tuple[list[Any], ExportAux]:
    _, values, aux = exported_flatten(lookup, x)
    return values, aux


def _flatten_with_keys(lookup: Lookup, x: Any) -> tuple[list[tuple[Any, Any]], ExportAux]:
    keys, values, aux = exported_flatten(lookup, x)
    return [(_key(k, aux.named), v) for k, v in zip(keys, values, strict=True)], aux


def _unflatten(lookup: Lookup, values: Any, aux: ExportAux) -> Any:
    return exported_unflatten(lookup, aux, values)


def export(cls: type, static: bool, lookup: Lookup) -> None:
    """Register `cls` with torch's ``_pytree`` (a functorkit node, or a static object if `static`);
    skip it if torch knows it already. `lookup`: the registry's, to take the node apart with."""
    if cls in pytree.SUPPORTED_NODES:
        return
    if static:
        pytree.register_pytree_node(
            cls, _static_flatten, _static_unflatten, flatten_with_keys_fn=_static_flatten_with_keys
        )
    else:
        pytree.register_pytree_node(
            cls,
            partial(_flatten, lookup),
            partial(_unflatten, lookup),
            flatten_with_keys_fn=partial(_flatten_with_keys, lookup),
        )
