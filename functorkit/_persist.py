"""Pickling a `Restructure`: plain data out, every field checked on the way in.

A pickled ``Restructure`` is ``(restore, (state,))`` where ``state`` is a dict
of plain data: the tree definition's own state (node classes, keys, aux data,
ties), the constants, and the parameter table (indices, shapes, kinds as
``(namespace name, dtype, device)``). `restore` type-checks every field
before anything is built from it; namespaces are imported only from the fixed
table `functorkit.adapters.KNOWN_NAMESPACES`; shapes and offsets must be
non-negative ``int``s (they are the only values written into generated source
besides validated keys). Pickles can still run code by design (any pickle can):
load only pickles you trust (docs/guarantees.md).
"""

from __future__ import annotations

import importlib
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._policy import POLICIES, Kind
from ._treedef import _restore_treedef as restore_treedef
from .adapters import KNOWN_NAMESPACES, adapter_for

if TYPE_CHECKING:
    from ._flat import Restructure

__all__ = ["portable_kind", "portable_type", "restore", "use_restructure"]


#: the namespaces a pickled Restructure may name (nothing else is imported when unpickling)
_NAMESPACES = KNOWN_NAMESPACES

#: ``Restructure._make``, handed over by ``_flat`` when it is imported (`use_restructure`): ``_flat``
#: pickles through this module (`portable_kind`, `restore`), so this module sits below it and cannot
#: import it (docs/adapters.md, "Import layering"). Unpickling imports ``functorkit`` first, which
#: imports ``_flat``.
_MAKE: list[Callable[..., Restructure[Any]]] = []


def use_restructure(make: Callable[..., Restructure[Any]]) -> None:
    """Set the constructor `restore` builds a `Restructure` with (``Restructure._make``)."""
    _MAKE[:] = [make]


def portable_kind(k: Kind) -> tuple[str, Any, Any]:
    dev = k.device
    try:
        pickle.dumps(dev)
    except (TypeError, AttributeError, pickle.PicklingError):
        dev = ("__device__", getattr(dev, "platform", None), getattr(dev, "id", None))
    return (k.xp.__name__, k.dtype, dev)


def portable_type(t: type) -> type:
    try:
        pickle.dumps(t)
    except (TypeError, AttributeError, pickle.PicklingError):
        return type(None)  # never matches: re.flatten takes the general path
    return t


def _bad_pickle(what: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(
        f"unpickling a Restructure: {what}. Pickles run code when loaded: load only pickles you trust; "
        "for data-only storage keep the model's structure in code and store the flat vector."
    )


def _restore_kind(t: Any) -> Kind:
    if type(t) is not tuple or len(t) != 3 or type(t[0]) is not str:
        raise _bad_pickle("a parameter kind is malformed")
    name, dtype, dev = t
    if name not in _NAMESPACES:
        raise _bad_pickle(f"the namespace {name[:80]!r} is not one functorkit knows")
    xp = importlib.import_module(name)
    if type(dev) is tuple and len(dev) == 3 and dev[0] == "__device__":
        dev = adapter_for(xp).find_device(dev[1], dev[2])
    return Kind(xp, dtype, dev)


def _int_list(v: Any, what: str) -> list[int]:
    if type(v) is not list or any(type(i) is not int or i < 0 for i in v):
        raise _bad_pickle(f"`{what}` is not a list of non-negative ints")
    return v


def restore(state: Any) -> Restructure[Any]:
    """Unpickle a Restructure: every field is type-checked before anything is generated from it."""
    if type(state) is not dict or state.get("version") != 2:
        raise _bad_pickle("the state is not a version-2 Restructure state")
    td = restore_treedef(state.get("treedef"))
    template = state.get("template")
    if type(template) is not list or len(template) != td.num_leaves:
        raise _bad_pickle("`template` does not match the tree definition")
    param_idx = _int_list(state.get("param_idx"), "param_idx")
    param_kind = _int_list(state.get("param_kind"), "param_kind")
    shapes = state.get("shapes")
    if (
        type(shapes) is not list
        or len(shapes) != len(param_idx)
        or any(type(s) is not tuple or any(type(d) is not int or d < 0 for d in s) for s in shapes)
    ):
        raise _bad_pickle("`shapes` is not a list of tuples of non-negative ints, one per parameter")
    if any(j >= td.num_leaves for j in param_idx) or len(param_kind) != len(param_idx):
        raise _bad_pickle("`param_idx`/`param_kind` do not match the tree definition")
    kinds_in = state.get("kinds")
    if type(kinds_in) is not list:
        raise _bad_pickle("`kinds` is not a list")
    kinds = [_restore_kind(k) for k in kinds_in]
    if any(i >= len(kinds) for i in param_kind):
        raise _bad_pickle("`param_kind` points past `kinds`")
    policy = state.get("policy")
    if policy not in POLICIES:
        raise _bad_pickle("`policy` is not one of the policies")
    param_types = state.get("param_types")
    if type(param_types) is not list or any(not isinstance(t, type) for t in param_types):
        raise _bad_pickle("`param_types` is not a list of classes")
    flat_kind = _restore_kind(state.get("flat_kind"))
    try:
        ftype = type(adapter_for(flat_kind.xp).empty(flat_kind.dtype, flat_kind.device, 0))
    except (TypeError, ValueError, RuntimeError):
        ftype = type(None)
    return _MAKE[0](
        td=td,
        template=template,
        param_idx=param_idx,
        shapes=shapes,
        kinds=kinds,
        param_kind=param_kind,
        flat_kind=flat_kind,
        ftype=ftype,
        policy=policy,
        param_types=param_types,
    )
