"""``torch.nn.Module`` as a functorkit node (imported only once torch is).

Children of a module are its parameters, then its buffers, then its
submodules, each in registration order (the order of ``state_dict()``), keyed
by name; names made of digits (``Sequential``/``ModuleList`` entries) become
integer keys, so paths read ``layers[0].weight``. Slots holding ``None`` (a
``bias=False`` layer) are not children: they are kept as they are.

Trainable children: every tensor in a parameter slot unless it is an
``nn.Parameter`` with ``requires_grad=False``, and every submodule; buffers
are not trainable.

A rebuilt module is a shallow clone made without calling ``__init__``: user
attributes are shared, torch's own bookkeeping containers (hook dicts, the
non-persistent buffer set) are copied, and the parameter, buffer and
submodule dicts are fresh.
"""

from __future__ import annotations

from typing import Any

import torch

from .._registry import NodeDef

__all__ = ["node_for"]

_SECTIONS = ("_parameters", "_buffers", "_modules")
# containers torch's Module.__init__ creates: copied (not shared) in a clone
_OWN_CONTAINERS = frozenset(
    k for k, v in torch.nn.Module().__dict__.items() if isinstance(v, (dict, set, list)) and k not in _SECTIONS
)
_DEFS: dict[type, NodeDef] = {}


def _key(name: str) -> Any:
    return int(name) if name.isdigit() else name


def _flatten(m: Any) -> tuple[list[Any], list[Any], Any, bool]:
    d = m.__dict__
    keys: list[Any] = []
    vals: list[Any] = []
    layout: list[tuple[int, str, int]] = []  # (section, name, child index or -1 for None)
    for s, section in enumerate(_SECTIONS):
        for name, v in d[section].items():
            if v is None:
                layout.append((s, name, -1))
            else:
                layout.append((s, name, len(vals)))
                keys.append(_key(name))
                vals.append(v)
    rest = {k: v for k, v in d.items() if k not in _SECTIONS}
    return keys, vals, (type(m), rest, layout), True


def _unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
    cls, rest, layout = aux
    new = cls.__new__(cls)
    nd = dict(rest)
    for k in _OWN_CONTAINERS:
        if k in nd:
            nd[k] = type(nd[k])(nd[k])
    sections: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
    for s, name, j in layout:
        sections[s][name] = None if j < 0 else values[j]
    for s, section in enumerate(_SECTIONS):
        nd[section] = sections[s]
    object.__setattr__(new, "__dict__", nd)
    return new


def _trainable(m: Any) -> frozenset[Any]:
    d = m.__dict__
    out = [
        _key(name)
        for name, v in d["_parameters"].items()
        if v is not None and not (isinstance(v, torch.nn.Parameter) and not v.requires_grad)
    ]
    out.extend(_key(name) for name, v in d["_modules"].items() if v is not None)
    return frozenset(out)


def node_for(cls: type) -> NodeDef | None:
    """The NodeDef for an ``nn.Module`` subclass, or None for any other type."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return None
    nd = _DEFS.get(cls)
    if nd is None:
        nd = _DEFS[cls] = NodeDef(cls, _flatten, _unflatten, _trainable, owns=True)
    return nd
