"""What the pytree bridges (``_pytree_jax.py``, ``_pytree_optree.py``, ``_pytree_torch.py``) share:
key entries mapped to path entries, and the aux data of a functorkit node exported to another
library. Imports no backend, and no functorkit module above the adapters: the registry, which loads
these modules, hands its ``lookup`` to each ``export`` (docs/adapters.md, "Import layering")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._nodedef import NodeDef, aux_equal

__all__ = ["ExportAux", "Lookup", "exported_flatten", "exported_unflatten", "named_keys"]


def named_keys(entries: list[tuple[bool, Any] | None]) -> list[Any] | None:
    """The keys of a node whose children all carry a name (attribute or mapping key), distinct;
    None otherwise (the children are then indexed by position)."""
    if not entries or not all(e is not None and e[0] for e in entries):
        return None
    keys = [e[1] for e in entries]  # type: ignore[index]
    try:
        if len(set(keys)) != len(keys):
            return None
    except TypeError:  # an unhashable key: positions instead
        return None
    return keys


class ExportAux:
    """Aux data of a functorkit node inside another library's tree definition: hashable by the
    class and the child keys, equal when functorkit's own aux data is equal (never raising), so
    that ``jax.jit`` caches on it."""

    __slots__ = ("aux", "cls", "keys", "named")

    def __init__(self, cls: type, keys: tuple[Any, ...], aux: Any, named: bool) -> None:
        self.cls = cls
        self.keys = keys
        self.aux = aux
        self.named = named

    def __hash__(self) -> int:
        return hash((self.cls, self.keys))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExportAux):
            return NotImplemented
        return (
            self.cls is other.cls
            and self.named == other.named
            and self.keys == other.keys
            and aux_equal(self.aux, other.aux)
        )

    def __repr__(self) -> str:
        return f"ExportAux({self.cls.__qualname__}, keys={self.keys!r})"


#: the registry's ``lookup(cls)``: the dispatch entry of a class (a NodeDef for a node)
Lookup = Callable[[type], Any]


def _node(lookup: Lookup, cls: type) -> NodeDef:
    nd = lookup(cls)
    if not isinstance(nd, NodeDef):
        msg = (
            f"{cls.__module__}.{cls.__qualname__} was exported to another library's pytree registry as a "
            "functorkit node, but functorkit now treats it as a leaf (fk.register_leaf(..., replace=True)); "
            "register it as a node again."
        )
        raise TypeError(msg)
    return nd


def exported_flatten(lookup: Lookup, x: Any) -> tuple[list[Any], list[Any], ExportAux]:
    """Take a functorkit node apart for another library: keys, children, aux."""
    keys, values, aux, named = _node(lookup, type(x)).flatten(x)
    return list(keys), list(values), ExportAux(type(x), tuple(keys), aux, named)


def exported_unflatten(lookup: Lookup, aux: ExportAux, children: Any) -> Any:
    """Rebuild a functorkit node from another library's children."""
    return _node(lookup, aux.cls).unflatten(aux.aux, list(aux.keys), list(children))
