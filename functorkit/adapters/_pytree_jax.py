"""JAX's pytree registry, both ways (SPEC section 9).

In: `node_for` makes a functorkit node of a class JAX knows as a node
(``register_pytree_node``, ``register_pytree_node_class``,
``register_dataclass``, ``register_pytree_with_keys``): each object is taken
apart one level by ``jax.tree_util.tree_flatten_with_path`` (children as
leaves) and rebuilt by the resulting JAX tree definition's ``unflatten``; JAX's
keys become path entries (``GetAttrKey`` -> its name, ``DictKey`` -> its key,
``SequenceKey``/``FlattenedIndexKey`` -> the index).

Out: `export` registers a functorkit node class with JAX (children
through functorkit's own ``flatten``/``unflatten``), or a class as a static
pytree with no leaves whose aux data is the object itself (``Restructure``,
``TreeDef``: hashable by structure, so equal ones share one ``jax.jit`` cache
entry). A class JAX already knows is left alone.

Loaded by ``functorkit/_registry.py`` only once ``jax`` is in ``sys.modules``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax

from .._nodedef import NodeDef
from ._pytree_keys import ExportAux, Lookup, exported_flatten, exported_unflatten, named_keys

__all__ = ["export", "node_for"]

_tu = jax.tree_util
_KEY_ATTRS = ((_tu.GetAttrKey, "name"), (_tu.DictKey, "key"))
_INDEX_ATTRS = ((_tu.SequenceKey, "idx"), (_tu.FlattenedIndexKey, "key"))


def _entry(k: Any) -> tuple[bool, Any] | None:
    """``(named, key)`` for one JAX key entry, or None for a kind functorkit does not map."""
    for kt, attr in _KEY_ATTRS:
        if type(k) is kt:
            return True, getattr(k, attr)
    for kt, attr in _INDEX_ATTRS:
        if type(k) is kt:
            return False, getattr(k, attr)
    return None


def node_for(cls: type) -> NodeDef | None:
    """A NodeDef for a class JAX registered as a pytree node, or None."""
    if not _tu.default_registry.is_node(cls):
        return None

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        pairs, treedef = _tu.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
        values = [v for _, v in pairs]
        entries = [_entry(path[0]) if len(path) == 1 else None for path, _ in pairs]
        keys = named_keys(entries)
        if keys is None:
            return list(range(len(values))), values, treedef, False
        return keys, values, treedef, True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        return aux.unflatten(values)

    return NodeDef(cls, flatten, unflatten)


def _static_flatten(x: Any) -> tuple[tuple[()], Any]:
    return (), x


def _static_unflatten(aux: Any, children: Any) -> Any:
    return aux


def _key(k: Any, named: bool) -> Any:
    if not named:
        return _tu.SequenceKey(k)
    return _tu.GetAttrKey(k) if type(k) is str and k.isidentifier() else _tu.DictKey(k)


def _flatten_with_keys(lookup: Lookup, x: Any) -> tuple[list[tuple[Any, Any]], ExportAux]:
    keys, values, aux = exported_flatten(lookup, x)
    return [(_key(k, aux.named), v) for k, v in zip(keys, values, strict=True)], aux


def _flatten(lookup: Lookup, x: Any) -> tuple[list[Any], ExportAux]:
    _, values, aux = exported_flatten(lookup, x)
    return values, aux


def _unflatten(lookup: Lookup, aux: ExportAux, children: Any) -> Any:
    return exported_unflatten(lookup, aux, children)


def export(cls: type, static: bool, lookup: Lookup) -> None:
    """Register `cls` with JAX (a functorkit node, or a static object if `static`); skip it if JAX
    knows it already. `lookup`: the registry's, to take the node apart with."""
    if _tu.default_registry.is_node(cls):
        return
    if static:
        _tu.register_pytree_node(cls, _static_flatten, _static_unflatten)
    else:
        _tu.register_pytree_with_keys(
            cls, partial(_flatten_with_keys, lookup), partial(_unflatten, lookup), partial(_flatten, lookup)
        )
