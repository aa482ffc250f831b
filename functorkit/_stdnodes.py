"""Standard-library containers and attrs classes as nodes by default (SPEC 12, ``docs/walking.md``).

``collections.deque`` (its ``maxlen`` kept as aux data), ``collections.UserDict``,
``collections.UserList``, ``types.SimpleNamespace`` and ``types.MappingProxyType``
(rebuilt read-only: a mapping proxy over a new dict) are nodes, by exact type;
their subclasses are not. attrs classes (``attrs.has(cls)``) are nodes like
dataclasses: fields in definition order, ``metadata={"static": True}`` opts a field
out, rebuilt without ``__init__``. attrs is looked up only when the program has
imported it (``sys.modules``), never imported here.
"""

from __future__ import annotations

import sys
import types
from collections import UserDict, UserList, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._nodedef import mapping_check, sequence_check

if TYPE_CHECKING:
    from ._registry import NodeDef

__all__ = ["attrs_def", "std_nodes"]


def _deque_flatten(x: deque[Any]) -> tuple[list[Any], list[Any], Any, bool]:
    return list(range(len(x))), list(x), x.maxlen, False


def _deque_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> deque[Any]:
    return deque(values, maxlen=aux)


def _userlist_flatten(x: UserList[Any]) -> tuple[list[Any], list[Any], Any, bool]:
    return list(range(len(x.data))), list(x.data), None, False


def _userlist_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> UserList[Any]:
    return UserList(values)


def _mapping_flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
    return list(x), list(x.values()), None, True


def _userdict_flatten(x: UserDict[Any, Any]) -> tuple[list[Any], list[Any], Any, bool]:
    d = x.data
    return list(d), list(d.values()), None, True


def _userdict_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> UserDict[Any, Any]:
    out: UserDict[Any, Any] = UserDict()
    out.data = dict(zip(keys, values, strict=True))
    return out


def _proxy_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(dict(zip(keys, values, strict=True)))


def _ns_flatten(x: types.SimpleNamespace) -> tuple[list[Any], list[Any], Any, bool]:
    d = x.__dict__
    return list(d), list(d.values()), None, True


def _ns_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> types.SimpleNamespace:
    out = types.SimpleNamespace()
    out.__dict__.update(zip(keys, values, strict=True))
    return out


def std_nodes(node_def: type[NodeDef]) -> dict[type, NodeDef]:
    """The table entries of the standard containers (merged into the registry's built-ins).

    The registry passes its `NodeDef` class in as `node_def`: this module sits below ``_registry`` and imports
    only the entry checks of ``_nodedef``, at the bottom (docs/adapters.md, "Import layering")."""
    return {
        # a maxlen below the number of items would drop some of them on rebuild
        deque: node_def(deque, _deque_flatten, _deque_unflatten, owns=True, check=sequence_check(_maxlen_ok)),
        UserList: node_def(UserList, _userlist_flatten, _userlist_unflatten, owns=True, check=sequence_check()),
        UserDict: node_def(UserDict, _userdict_flatten, _userdict_unflatten, owns=True, check=mapping_check()),
        types.SimpleNamespace: node_def(
            types.SimpleNamespace, _ns_flatten, _ns_unflatten, owns=True, check=mapping_check(str_keys=True)
        ),
        # a proxy may front a mapping that makes its values on access: the walk keeps them alive
        types.MappingProxyType: node_def(
            types.MappingProxyType, _mapping_flatten, _proxy_unflatten, mutable=False, check=mapping_check()
        ),
    }


def _maxlen_ok(aux: Any, n: int) -> bool:
    return aux is None or (type(aux) is int and aux >= n)


def attrs_def(cls: type, dataclass_def: Callable[[type, list[Any], bool], NodeDef]) -> NodeDef | None:
    """The NodeDef of an attrs class (like a dataclass's: `dataclass_def`, which the registry passes
    in as ``_registry._dataclass_def``), or None when `cls` is not one or attrs was never imported."""
    for modname in ("attrs", "attr"):
        mod = sys.modules.get(modname)
        if mod is not None:
            has = getattr(mod, "has", None)
            if has is None or not has(cls):
                return None
            fields = list(getattr(mod, "fields")(cls))  # noqa: B009 -- attrs' public API, found at run time
            frozen = getattr(cls.__setattr__, "__name__", "") == "_frozen_setattrs"
            return dataclass_def(cls, fields, frozen)
    return None
