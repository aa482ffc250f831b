"""The node table: which types are nodes, how to take them apart and rebuild them.

One global, thread-safe table maps an exact type to a `NodeDef` (a node)
or to the leaf marker. Types not registered are resolved once and cached:
namedtuples, dataclasses, attrs classes and a few standard containers
(``_stdnodes.py``) are nodes by default, objects of a backend with an
adapter (``torch.nn.Module``) are handed to that adapter, loaded lazily, a class
that an imported pytree library (JAX, optree, torch ``_pytree``) knows as a node
is taken apart through that library, and everything else is a leaf. Classes
registered here are exported to JAX and torch ``_pytree`` in turn (see
``docs/interop.md``).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

from ._nodedef import DICT as DICT
from ._nodedef import GENERIC as GENERIC
from ._nodedef import LIST as LIST
from ._nodedef import TUPLE as TUPLE
from ._nodedef import NodeDef as NodeDef
from ._nodedef import cached_properties, fields_check, mapping_check, sequence_check
from ._stdnodes import attrs_def, std_nodes
from .adapters import load_family, tracing
from .adapters._families import NODE_FAMILIES
from .adapters._pytrees import EXPORT_TO, PYTREES, TRACEABLE_PYTREES

__all__ = [
    "GEN",
    "GENERATION",
    "SCALAR",
    "SCALAR_TYPES",
    "TABLES",
    "NodeDef",
    "child_items",
    "dispatch",
    "export_pending",
    "export_static",
    "lookup",
    "register",
    "register_dataclass",
    "register_leaf",
    "registered_leaf",
    "node_error",
    "resolve",
    "set_check",
]

T = TypeVar("T")

#: Marker returned by `resolve` for leaves that are never identity-cached.
SCALAR = object()
#: Marker stored in the table for classes registered with `register_leaf`.
_LEAF = object()

SCALAR_TYPES = frozenset({bool, int, float, complex, str, bytes, type(None)})


def node_error(msg: str) -> TypeError:
    """A TypeError about a registered node's own functions; the walk prefixes the path where it met
    the node (``at layers[0]: ...``), since these functions do not know it."""
    e = TypeError(msg)
    e.functorkit_needs_path = True  # type: ignore[attr-defined]
    return e


# ---------------------------------------------------------------- built-ins


def _dict_flatten(x: dict[Any, Any]) -> tuple[list[Any], list[Any], Any, bool]:
    return list(x), list(x.values()), None, True


def _dict_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> dict[Any, Any]:
    return dict(zip(keys, values, strict=True))


def _odict_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> OrderedDict[Any, Any]:
    return OrderedDict(zip(keys, values, strict=True))


def _ddict_flatten(x: defaultdict[Any, Any]) -> tuple[list[Any], list[Any], Any, bool]:
    return list(x), list(x.values()), x.default_factory, True


def _ddict_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> defaultdict[Any, Any]:
    return defaultdict(aux, zip(keys, values, strict=True))


def _seq_flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
    return list(range(len(x))), list(x), None, False


def _list_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> list[Any]:
    return list(values)


def _tuple_unflatten(aux: Any, keys: list[Any], values: list[Any]) -> tuple[Any, ...]:
    return tuple(values)


def _namedtuple_def(cls: type) -> NodeDef:
    fields = list(cls._fields)  # type: ignore[attr-defined]
    if getattr(cls, "__dictoffset__", 0):  # its instances have a __dict__ (no `__slots__ = ()`)
        return _namedtuple_dict_def(cls, fields)

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        return fields, list(x), None, True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        return cls(*values)

    return NodeDef(cls, flatten, unflatten, owns=True, mutable=False, check=fields_check(fields, _is_none))


def _namedtuple_dict_def(cls: type, fields: list[Any]) -> NodeDef:
    """A subclass of a namedtuple without ``__slots__ = ()``: its instances have a ``__dict__``,
    whose attributes are carried over as a dataclass's non-field attributes are (they were dropped
    by the rebuild, silently, arrays included), except a ``functools.cached_property``'s values."""
    skip = _cached_properties(cls)

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        extra = [(k, v) for k, v in x.__dict__.items() if k not in skip]
        return fields, list(x), extra or None, True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        obj = cls(*values)
        if aux:
            setattr_ = object.__setattr__
            for k, v in aux:
                setattr_(obj, k, v)
        return obj

    def aux_ok(aux: Any) -> bool:
        return aux is None or (
            type(aux) in (list, tuple)
            and all(type(k := _pair_name(p)) is str and k not in skip and not k.startswith("__") for p in aux)
        )

    return NodeDef(cls, flatten, unflatten, owns=True, mutable=False, check=fields_check(fields, aux_ok))


def _dataclass_def(cls: type, all_fields: Any = None, frozen: bool | None = None) -> NodeDef:
    """Children: the fields not marked ``metadata={"static": True}``.

    Rebuilt without calling ``__init__``/``__post_init__`` (fields set with
    ``object.__setattr__``, so frozen dataclasses work); static fields and any
    non-field instance attributes are carried over from the input, except the
    values a ``functools.cached_property`` of the class cached in ``__dict__``:
    they were computed from the old fields, so the rebuilt object recomputes
    them from its own on first access. `all_fields`
    (objects with ``name`` and ``metadata``, in definition order) and `frozen`
    default to the dataclass's own (attrs classes pass theirs, ``_stdnodes.py``).
    """
    if all_fields is None:
        all_fields = _dataclass_fields(cls)
        frozen = bool(cls.__dataclass_params__.frozen)  # type: ignore[attr-defined]
    names = [f.name for f in all_fields if not _static(f)]
    statics = [f.name for f in all_fields if _static(f)]
    field_names = {f.name for f in all_fields}
    # a cached_property's value, stored in __dict__ under its name, was computed from the old fields:
    # carried over it would be stale (a rebuilt model's cached matrix of the old weights); left out
    not_extra = field_names | _cached_properties(cls)
    # a field read through a descriptor (a property) may hand out a fresh object
    # each time: then the walk keeps the values list alive itself
    # so may a class that overrides attribute access
    plain: bool = getattr(cls, "__getattribute__", None) is object.__getattribute__
    owns = plain and not hasattr(cls, "__getattr__")
    traced = tracing()  # (a class's __dict__ is a mapping proxy Dynamo cannot read: getattr instead)
    for n in names:
        attr = getattr(cls, n, None) if traced else cls.__dict__.get(n)
        if hasattr(type(attr), "__get__") and not isinstance(attr, types.MemberDescriptorType):
            owns = False

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        values = [getattr(x, n) for n in names]
        extra = getattr(x, "__dict__", None)
        if extra is not None:
            extra = [(k, v) for k, v in extra.items() if k not in not_extra]
        aux = ([(n, getattr(x, n)) for n in statics], extra)
        return names, values, aux, True

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        obj: Any = object.__new__(cls)
        setattr_ = object.__setattr__
        for n, v in zip(keys, values, strict=True):
            setattr_(obj, n, v)
        static, extra = aux
        for n, v in static:
            setattr_(obj, n, v)
        if extra:
            for n, v in extra:
                setattr_(obj, n, v)
        return obj

    def aux_ok(aux: Any) -> bool:
        if type(aux) is not tuple or len(aux) != 2:
            return False
        static, extra = aux
        if type(static) not in (list, tuple) or [_pair_name(p) for p in static] != statics:
            return False
        return extra is None or (
            type(extra) in (list, tuple)
            and all(type(k := _pair_name(p)) is str and k not in not_extra and not k.startswith("__") for p in extra)
        )

    return NodeDef(cls, flatten, unflatten, owns=owns, mutable=not frozen, check=fields_check(names, aux_ok))


def _cached_properties(cls: type) -> set[str]:
    """`cached_properties` of `cls` as a set; empty while a tracer runs (a class first met inside
    ``torch.compile`` carries such values over, as before)."""
    return set() if tracing() else set(cached_properties(cls))


def _static(field: Any) -> bool:
    """Whether a dataclass or attrs field is marked ``metadata={"static": True}``. (An empty
    metadata mapping is not read: Dynamo cannot read a non-empty mapping proxy, so a class with
    field metadata first met inside ``torch.compile`` still breaks the graph; one without, not.)"""
    meta = field.metadata
    return bool(len(meta)) and bool(meta.get("static", False))


def _pair_name(p: Any) -> Any:
    """The name of a ``(name, value)`` pair of a dataclass's aux data, or None for anything else."""
    return p[0] if type(p) in (tuple, list) and len(p) == 2 else None


def _is_none(aux: Any) -> bool:
    return aux is None


def _user_check(keys: Any, n: int, aux: Any, named: bool) -> str | None:
    """`NodeDef.check` of a class registered with `register`: the form its entries have (`rebuild`
    itself is the user's: what keys it accepts is not known here)."""
    if type(aux) is not tuple or len(aux) != 2 or aux[1] not in (None, True, False) or (aux[1] is None) != named:
        return (
            "expected the static data of a registered class: (aux, None) for mapping children, "
            "(aux, True/False) for a tuple or list"
        )
    return (mapping_check(lambda a: True) if named else sequence_check(lambda a, n: True))(keys, n, aux, named)


def set_check(cls: type, check: Any) -> None:
    """Give the registered node `cls` an exact `NodeDef.check` (the structured wrappers: their keys)."""
    entry = TABLES[0][_ENTRIES].get(cls)
    if isinstance(entry, NodeDef):
        entry.check = check


#: the marker of a real field in a dataclass's ``__dataclass_fields__`` (what ``dataclasses.fields`` keeps)
_DC_FIELD: Final = getattr(dataclasses, "_FIELD", None)


def _dataclass_fields(cls: type) -> Any:
    """``dataclasses.fields(cls)``; while a tracer runs, read from the class's own table instead
    (torch.compile cannot trace ``dataclasses.fields`` of a class: a dataclass model first met
    inside a compiled function broke the graph), ClassVar and InitVar pseudo-fields left out as
    ``fields`` leaves them."""
    if _DC_FIELD is not None and tracing():
        table = cls.__dataclass_fields__  # type: ignore[attr-defined]
        return [f for f in table.values() if f._field_type is _DC_FIELD]
    return dataclasses.fields(cls)


def _user_def(
    cls: type,
    children: Callable[[Any], tuple[Any, Any]],
    rebuild: Callable[[Any, Any], Any],
    trainable: Callable[[Any], Iterable[Any]] | None,
) -> NodeDef:
    qual = cls.__qualname__

    def flatten(x: Any) -> tuple[list[Any], list[Any], Any, bool]:
        out = children(x)
        if type(out) is not tuple or len(out) != 2:
            got = f"a tuple of length {len(out)}" if type(out) is tuple else f"{type(out).__name__}"
            msg = (
                f"the `children` function registered for {qual} must return a "
                f"`(children, aux)` pair, got {got}; return "
                "`(mapping_or_sequence, aux)`."
            )
            raise node_error(msg)
        ch, aux = out
        if isinstance(ch, Mapping):
            return list(ch.keys()), list(ch.values()), (aux, None), True
        if isinstance(ch, (list, tuple)):
            vals = list(ch)
            return list(range(len(vals))), vals, (aux, isinstance(ch, tuple)), False
        msg = (
            f"the `children` function registered for {qual} returned children of "
            f"type {type(ch).__name__}; expected a mapping (keys become path entries), "
            "a list or a tuple."
        )
        raise node_error(msg)

    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        user_aux, seq_kind = aux
        if seq_kind is None:
            return rebuild(user_aux, dict(zip(keys, values, strict=True)))
        return rebuild(user_aux, tuple(values) if seq_kind else list(values))

    tfn = None
    if trainable is not None:
        t = trainable

        def tfn(x: Any) -> frozenset[Any] | None:
            keys = t(x)
            if isinstance(keys, (str, bytes)):  # its characters would be read as the keys
                msg = (
                    f"the `trainable` function registered for {qual} must return an iterable of "
                    f"child keys, got the {type(keys).__name__} {keys!r}, whose characters would be "
                    f"read as keys; return a list of keys, e.g. [{keys!r}]."
                )
                raise node_error(msg)
            try:
                return frozenset(keys)
            except TypeError:
                msg = (
                    f"the `trainable` function registered for {qual} must return an "
                    f"iterable of child keys, got {type(keys).__name__}."
                )
                raise node_error(msg) from None

    return NodeDef(cls, flatten, unflatten, tfn, check=_user_check)


# ---------------------------------------------------------------- the table

_lock = threading.RLock()
_BUILTIN: dict[type, Any] = {
    dict: NodeDef(dict, _dict_flatten, _dict_unflatten, fast=DICT, owns=True, check=mapping_check()),
    list: NodeDef(list, _seq_flatten, _list_unflatten, fast=LIST, owns=True, check=sequence_check()),
    tuple: NodeDef(
        tuple, _seq_flatten, _tuple_unflatten, fast=TUPLE, owns=True, mutable=False, check=sequence_check()
    ),
    OrderedDict: NodeDef(OrderedDict, _dict_flatten, _odict_unflatten, owns=True, check=mapping_check()),
    defaultdict: NodeDef(
        defaultdict,
        _ddict_flatten,
        _ddict_unflatten,
        owns=True,
        check=mapping_check(lambda a: a is None or callable(a)),
    ),
    **std_nodes(NodeDef),  # deque, UserDict, UserList, SimpleNamespace, MappingProxyType (SPEC 12)
}
# The table is copy-on-write: one snapshot is a tuple
#     (registered entries, resolved types, leaf types, known types, generation)
# where the registered entries (type -> NodeDef or the leaf marker) never change once the snapshot
# is published, and the three caches only grow, each entry computed from that snapshot's own
# registered entries. A registration builds a new snapshot (a copy of the entries with its change,
# empty caches) under `_lock` and publishes it by swapping the one reference in `TABLES`; lookups take
# no lock (``torch.compile`` cannot trace one): a walk reads ``TABLES[0]`` once and uses that
# snapshot throughout, so it never sees a table mid-change (a cache cleared under it, a set resized
# while a subset test runs, an entry computed from the entries before a registration and kept after).
#: snapshot fields
_ENTRIES: Final = 0
_RESOLVED: Final = 1
_LEAVES: Final = 2
_KNOWN: Final = 3
#: the snapshot's generation: what the plan cache compares (an int: `torch.compile` traces ``==`` of
#: ints, not ``is`` of two snapshot tuples, which broke compiled fk.fmap/re(p) once a plan existed)
GEN: Final = 4


def _snapshot(entries: dict[type, Any], gen: int) -> tuple[dict[type, Any], dict[type, Any], set[type], set[type], int]:
    """A new snapshot of `entries` with empty caches: resolved types (type -> NodeDef (node), None
    (identity-cached leaf) or SCALAR (uncached leaf)), the resolved types that are leaves (a set, so
    a node's children can be checked in one go), every resolved type (leaves and nodes)."""
    return (entries, {}, set(), set(), gen)


#: the published snapshot (a one-element list: read ``TABLES[0]`` once per walk)
TABLES: list[tuple[dict[type, Any], dict[type, Any], set[type], set[type], int]] = [_snapshot(dict(_BUILTIN), 0)]
#: bumped by every registration: plans cached against the table are stale once it changes
#: (equal to the published snapshot's generation)
GENERATION: list[int] = [0]

# library module name -> adapter module making node definitions for classes of that library,
# imported the first time an object of that library is met (only possible once the library itself
# is imported): the family table's rows with `Family.nodes` (adapters/_families.py).
_ADAPTERS: tuple[tuple[str, str], ...] = NODE_FAMILIES

# ---------------------------------------------------------------- other libraries' pytree registries
# (SPEC section 9; docs/interop.md). In: a class that no functorkit rule claims is looked up, when
# first met, in the registries of the libraries already imported (adapters/_pytrees.py); the glue module's
# ``node_for(cls)`` gives a NodeDef or None. Out: the classes registered with functorkit (and the
# static ``Restructure``/``TreeDef``) are given to each library's ``export(cls, static)`` once it is
# imported: at a registration, when a new type is first met, or at ``fk.destructure``.
#: classes to export, in registration order: (cls, static)
_EXPORTS: list[tuple[type, bool]] = []
#: per library: how many of _EXPORTS it has been given
_EXPORTED: dict[str, int] = {name: 0 for name, _ in EXPORT_TO}


def _claimed(cls: type) -> bool:
    """True for a class a backend family adapter owns (torch: tensors and modules), asked through the
    adapter of each library already imported (loaded then: an import statement, traceable); only
    asked while a tracer runs."""
    for modname, adapter in _ADAPTERS:
        if sys.modules.get(modname) is not None and load_family(adapter).claims(cls):
            return True
    return False


def _bridged(cls: type) -> NodeDef | None:
    """The NodeDef of an imported pytree library that knows `cls` as a node, or None.

    While a tracer runs (``torch.compile`` meeting a type for the first time inside the compiled
    function), a class a backend family owns is not looked up in the registries Dynamo cannot call
    (JAX's and optree's are C++): a torch tensor or module is nobody else's node. Registries kept in
    Python dicts (`TRACEABLE_PYTREES`: torch's ``_pytree``) are still asked."""
    skip_opaque = tracing() and _claimed(cls)
    for modname, glue in PYTREES:
        if skip_opaque and modname not in TRACEABLE_PYTREES:
            continue
        if sys.modules.get(modname) is not None:
            nd: NodeDef | None = load_family(glue).node_for(cls)  # an import statement: traceable
            if nd is not None:
                return nd
    return None


def export_pending() -> None:
    """Give every pytree library imported by now the classes registered since it was last given any
    (a no-op when there are none: two comparisons per library; deferred while a tracer runs)."""
    n = len(_EXPORTS)
    for modname, glue in EXPORT_TO:
        if _EXPORTED[modname] < n and sys.modules.get(modname) is not None:
            if tracing():
                return  # a lock and another library's registration: left to the next eager call
            with _lock:
                mod = load_family(glue)
                while _EXPORTED[modname] < len(_EXPORTS):
                    cls, static = _EXPORTS[_EXPORTED[modname]]
                    _EXPORTED[modname] += 1
                    # the glue takes exported nodes apart with `lookup`, handed over here: it sits
                    # below this module (loaded by it), so it cannot import it
                    mod.export(cls, static, lookup)


def export_static(cls: type) -> None:
    """Make `cls` a pytree with no leaves, the object itself its static aux data, in JAX and torch
    (``Restructure``, ``TreeDef``: hashable by structure)."""
    with _lock:
        _EXPORTS.append((cls, True))
    export_pending()


def _check_export(export: Any, what: str) -> None:
    if type(export) is not bool:
        msg = f"`export` must be True or False, got {type(export).__name__} ({export!r}) ({what})."
        raise TypeError(msg)


def _mark_export(cls: type, export: bool) -> None:
    if export:
        with _lock:
            if all(c is not cls for c, _ in _EXPORTS):
                _EXPORTS.append((cls, False))
    export_pending()


def _is_namedtuple(cls: type) -> bool:
    return issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)


def resolve(cls: type, tables: Any = None) -> Any:
    """Return the dispatch entry for `cls` (NodeDef, None or SCALAR), caching it in the snapshot
    `tables` (default: the published one, ``TABLES[0]``; a walk passes the snapshot it read).

    Lock-free (``torch.compile`` cannot trace a lock, and a model first met inside a
    compiled function is resolved there): the entry is computed from the snapshot's own
    registered entries, which never change, and kept in that snapshot's caches, so it is
    right for every walk that reads that snapshot; a registration meanwhile publishes a new
    snapshot and leaves this one to the walks already holding it.
    """
    snap = TABLES[0] if tables is None else tables
    entry = snap[_ENTRIES].get(cls)
    if entry is not None:
        out = None if entry is _LEAF else entry
    elif cls in SCALAR_TYPES:
        out = SCALAR
    elif _is_namedtuple(cls):
        out = _namedtuple_def(cls)
    elif (bridged := _bridged(cls)) is not None:
        out = bridged
    elif dataclasses.is_dataclass(cls):
        out = _dataclass_def(cls)
    elif (attrs_nd := attrs_def(cls, _dataclass_def)) is not None:
        out = attrs_nd
    else:
        out = None
        for modname, adapter in _ADAPTERS:
            if sys.modules.get(modname) is None:
                continue  # only a library already imported can have made this class
            # a loaded adapter's node_for tests subclassing itself; before that, the adapter is loaded
            # only for a class of that library (found in its MRO) or while a tracer runs (torch.compile
            # cannot iterate an MRO, and traces the import statement and the issubclass tests)
            if (
                sys.modules.get(adapter) is not None
                or tracing()
                or modname in {c.__module__.partition(".")[0] for c in cls.__mro__}
            ):
                nd = load_family(adapter).node_for(cls)
                if nd is not None:
                    out = nd
                    break
    # the resolved entry first, then the sets: a type in the sets is always in the resolved dict
    snap[_RESOLVED][cls] = out
    export_pending()
    if not isinstance(out, NodeDef):
        snap[_LEAVES].add(cls)
    snap[_KNOWN].add(cls)
    return out


def dispatch(x: Any) -> Any:
    """The dispatch entry for ``type(x)``: a NodeDef for a node, None or SCALAR for a leaf."""
    t = type(x)
    snap = TABLES[0]
    try:
        return snap[_RESOLVED][t]
    except KeyError:
        return resolve(t, snap)


def lookup(cls: type) -> Any:
    """The dispatch entry for the class `cls` (``dispatch`` by type)."""
    snap = TABLES[0]
    try:
        return snap[_RESOLVED][cls]
    except KeyError:
        return resolve(cls, snap)


def child_items(node: Any) -> list[tuple[Any, Any]] | None:
    """``[(key, child), ...]`` of a node, or None for a leaf."""
    nd = dispatch(node)
    if nd is None or nd is SCALAR:
        return None
    keys, values, _, _ = nd.flatten(node)
    return list(zip(keys, values, strict=True))


def _check_class(cls: Any, what: str) -> None:
    if not isinstance(cls, type):
        msg = f"`cls` must be a class, got {type(cls).__name__} ({cls!r}); call {what}(SomeClass, ...)."
        raise TypeError(msg)
    if cls in SCALAR_TYPES:
        msg = (
            f"`cls` is {cls.__name__}, a built-in scalar type: bool, int, float, complex, "
            f"str, bytes and None are always leaves (never identity-cached) and cannot be "
            f"registered with {what}."
        )
        raise ValueError(msg)


def registered_leaf(cls: type) -> bool:
    """True if `cls` was registered with `register_leaf` (a leaf on purpose)."""
    return TABLES[0][_ENTRIES].get(cls) is _LEAF


def _store(cls: type, entry: Any, replace: bool, what: str) -> None:
    if type(replace) is not bool:
        msg = f"`replace` must be True or False, got {type(replace).__name__} ({replace!r}) ({what})."
        raise TypeError(msg)
    with _lock:
        table = TABLES[0][_ENTRIES]
        if cls in table and not replace:
            kind = "a built-in node" if cls in _BUILTIN and table[cls] is _BUILTIN[cls] else "already registered"
            msg = f"{cls.__module__}.{cls.__qualname__} is {kind}; pass `replace=True` to {what} to replace its entry."
            raise ValueError(msg)
        entries = dict(table)  # copy on write: walks holding the old snapshot keep it whole
        entries[cls] = entry
        gen = GENERATION[0] + 1
        TABLES[0] = _snapshot(entries, gen)  # one reference swapped: the new table is published whole
        GENERATION[0] = gen


def register(
    cls: type[T],
    /,
    *,
    children: Callable[[T], tuple[Any, Any]],
    rebuild: Callable[[Any, Any], T],
    trainable: Callable[[T], Iterable[Any]] | None = None,
    replace: bool = False,
    export: bool = True,
) -> type[T]:
    """Register `cls` (by exact type) as a node.

    Parameters
    ----------
    cls
        The class. Subclasses are not covered: register each one.
    children
        ``children(obj) -> (children, aux)``. ``children`` is a mapping (its
        keys become path entries and ``fmapstructure`` gives a dict) or a
        list/tuple (indices become path entries). ``aux`` is static data
        handed back to `rebuild` untouched.
    rebuild
        ``rebuild(aux, children) -> obj``; ``children`` has the form
        `children` gave (a dict with the same keys, or a list/tuple).
    trainable
        ``trainable(obj) -> iterable of child keys`` that are trainable
        (default: all children). A single ``str`` is a ``TypeError`` (its
        characters would be read as keys): return ``["w"]``, not ``"w"``.
    replace
        Replace an existing entry instead of raising ``ValueError``.
    export
        Also make `cls` a pytree node of JAX and of torch's ``_pytree``
        (default ``True``): at once for a library already imported, else when
        functorkit first meets it (see ``docs/interop.md``); a class that
        library already knows is left alone. ``False`` opts out.

    Returns
    -------
    type
        `cls`, so that this can be used from a decorator.

    Examples
    --------
    >>> import functorkit as fk
    >>> class Pair:
    ...     def __init__(self, a, b):
    ...         self.a, self.b = a, b
    >>> _ = fk.register(
    ...     Pair,
    ...     children=lambda p: ({"a": p.a, "b": p.b}, None),
    ...     rebuild=lambda aux, ch: Pair(ch["a"], ch["b"]),
    ... )
    >>> fk.fmap(lambda x: x + 1, Pair(1, 2)).b
    3
    """
    _check_class(cls, "fk.register")
    if not callable(children):
        msg = (
            f"`children` must be a callable `obj -> (children, aux)`, got {type(children).__name__}; "
            "see fk.register's docstring."
        )
        raise TypeError(msg)
    if not callable(rebuild):
        msg = (
            f"`rebuild` must be a callable `(aux, children) -> obj`, got {type(rebuild).__name__}; "
            "see fk.register's docstring."
        )
        raise TypeError(msg)
    if trainable is not None and not callable(trainable):
        msg = (
            f"`trainable` must be a callable `obj -> iterable of trainable child keys`, or None; "
            f"got {type(trainable).__name__}."
        )
        raise TypeError(msg)
    _check_export(export, "fk.register")
    _store(cls, _user_def(cls, children, rebuild, trainable), replace, "fk.register")
    _mark_export(cls, export)
    return cls


def register_dataclass(cls: Any = None, /, *, replace: bool = False, export: bool = True) -> Any:
    """Register a dataclass as a node (a decorator; plain dataclasses are nodes anyway).

    Fields with ``field(metadata={"static": True})`` are static data, not
    children. The rebuilt object is made without calling ``__init__`` or
    ``__post_init__``; non-field instance attributes are carried over (but not
    the values a ``functools.cached_property`` cached: they are recomputed).
    Registered classes become JAX and torch pytree nodes too, as with
    `register` (``export=False`` opts out).

    Examples
    --------
    >>> import dataclasses
    >>> import functorkit as fk
    >>> @fk.register_dataclass
    ... @dataclasses.dataclass
    ... class Layer:
    ...     w: float
    ...     name: str = dataclasses.field(default="l", metadata={"static": True})
    >>> fk.fmapstructure(lambda x: x * 2, Layer(1.5))
    {'w': 3.0}
    """
    if cls is None:
        return lambda c: register_dataclass(c, replace=replace, export=export)
    _check_export(export, "fk.register_dataclass")
    _check_class(cls, "fk.register_dataclass")
    if not dataclasses.is_dataclass(cls):
        msg = (
            f"`cls` must be a dataclass type, got {cls!r}; apply "
            "@dataclasses.dataclass first (below @fk.register_dataclass)."
        )
        raise TypeError(msg)
    dcls: type = cls  # type: ignore[assignment]
    _store(dcls, _dataclass_def(dcls), replace, "fk.register_dataclass")
    _mark_export(dcls, export)
    return cls


def register_leaf(cls: type[T], /, *, replace: bool = False) -> type[T]:
    """Force objects of exactly type `cls` to be leaves (e.g. a dataclass).

    Examples
    --------
    >>> import dataclasses
    >>> import functorkit as fk
    >>> @dataclasses.dataclass
    ... class Config:
    ...     lr: float
    >>> _ = fk.register_leaf(Config)
    >>> fk.leaves({"cfg": Config(0.1)})
    [Config(lr=0.1)]
    """
    _check_class(cls, "fk.register_leaf")
    _store(cls, _LEAF, replace, "fk.register_leaf")
    return cls
