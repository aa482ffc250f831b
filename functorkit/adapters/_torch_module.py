"""PyTorch ``nn.Module`` as a functorkit node (`node_for`); part of the torch adapter
(`functorkit.adapters.torch`), imported only once torch is.

Children of a module are its parameters, then its buffers, then its
submodules, each in registration order (the order of ``state_dict()``), keyed
by name; names made of ASCII digits (``Sequential``/``ModuleList`` entries)
become integer keys, so paths read ``layers[0].weight``. Slots holding
``None`` (a ``bias=False`` layer) are not children: they are kept as they are
(``fk.combine`` alone sees them, as ``None`` leaves, through the node's
``flatten_slots``: a partition group is the module with ``None`` in the slots
another group holds).
Nothing else is a child: a plain attribute holding a tensor, a dict of
tensors or a list of modules is not walked (torch does not see it either:
it is not in ``state_dict()``, ``parameters()`` or ``.to()``).

Trainable children: every tensor in a parameter slot unless it is an
``nn.Parameter`` with ``requires_grad=False``, and every submodule; buffers
are not trainable.

A rebuilt module is a shallow clone made without calling ``__init__`` of the
module it was recorded from as that module is *now* (held weakly; the state
recorded at flatten time once it is gone or after unpickling), so ``re(p)``
sees ``net.eval()``, new hooks and changed attributes as
``torch.func.functional_call`` does: user attributes are shared, torch's own bookkeeping containers (hook dicts, the
non-persistent buffer set, ``ParameterDict``'s key table) are copied, and the
parameter, buffer and submodule dicts are fresh. Torch modules that cache
references to their own children are refreshed: an RNN's flat weight list
points at the rebuilt weights, and a ``torch.compile``d module
(``OptimizedModule``) calls its rebuilt inner module. An FSDP2 module (``fully_shard``, whose class
redirects ``__new__`` to the original class's constructor) is cloned with ``object.__new__``, then
given an FSDP2 state of its own (`functorkit.adapters._fsdp_rebuild`): the clone keeps its
``FSDP<cls>`` class, its DTensor parameters and their placements, and its forward all-gathers its
own parameters.
"""

from __future__ import annotations

import operator
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from itertools import chain, compress, repeat
from typing import Any, cast

import torch

from .._nodedef import NodeDef, cached_properties

__all__ = ["claims", "node_for"]

_SECTIONS = ("_parameters", "_buffers", "_modules")
# containers torch's Module.__init__ creates: copied (not shared) in a clone
_OWN_CONTAINERS = frozenset(
    k for k, v in torch.nn.Module().__dict__.items() if isinstance(v, (dict, set, list)) and k not in _SECTIONS
)
_DEFS: dict[type, NodeDef] = {}
_KEYS: dict[str, Any] = {}  # child name -> path key (int for canonical ASCII digit strings)
#: an RNN's caches of its own parameters (left out of its aux data, rebuilt by `_refresh_rnn`)
_RNN_CACHES = ("_flat_weights", "_flat_weight_refs")
#: the container types whose ``copy()`` returns their own type
_COPY = frozenset({dict, OrderedDict, list, set})
_Uninitialized = getattr(torch.nn.parameter, "UninitializedTensorMixin", ())


def _key(name: str) -> Any:
    k = _KEYS.get(name)
    if k is None:
        # only canonical decimal strings ("0", "17", not "007" or "²") become ints: the key maps back to the name
        k = int(name) if name.isascii() and name.isdigit() and str(int(name)) == name else name
        if len(_KEYS) < 100_000:
            _KEYS[name] = k
            _KNOWN.add(name)
            if type(k) is str:
                _NAMES.add(name)
    return k


#: child names known to be their own path key (not canonical decimals): a module whose names are
#: all here keeps its name list as its key list (bounded with `_KEYS`)
_NAMES: set[str] = set()
#: every name in `_KEYS`: a module whose names are all here maps them to keys in C (`_KEYS` lookups)
_KNOWN: set[str] = set()
_key_of = _KEYS.__getitem__
#: a ``None`` slot is found by its type (one C-level pass; `is not` per child took 1.6x as long)
_NONE = type(None)


def _flatten(m: Any, keep_none: bool = False) -> tuple[list[Any], list[Any], Any, bool]:
    """``(keys, children, aux, True)``; aux ``(class, the rest of __dict__, layout, _Live)``.

    The layout is ``(parameters, buffers)``, the number of entries of the first two sections,
    when every slot is a child (no ``None`` left out); the names are the keys then (``str(k)``
    of an int key). Otherwise (`_layout`) one ``(section, name, child index or -1)`` per slot.

    A module of one section (a layer's parameters, a container's submodules: most modules) is
    taken here, without `_slots`' frame (`INLINE_SLOTS`; bench_walk's module rows)."""
    d = m.__dict__
    p = d["_parameters"]
    s = d["_modules"]
    if INLINE_SLOTS and not d["_buffers"] and not (p and s):
        vals = list(s.values()) if s else list(p.values())
        if keep_none or _NONE not in map(type, vals):
            names = list(s) if s else list(p)
            if not _NAMES.issuperset(names):
                names = list(map(_key_of if _KNOWN.issuperset(names) else _key, names))
            rest = d.copy()  # one C-level copy, then the three sections out (a comprehension costs 4x more)
            del rest["_parameters"], rest["_buffers"], rest["_modules"]
            return names, vals, (type(m), rest, (len(p), 0), _Live(m)), True
    keys, vals, layout = _slots(d, keep_none)
    rest = d.copy()
    del rest["_parameters"], rest["_buffers"], rest["_modules"]
    return keys, vals, (type(m), rest, layout, _Live(m)), True


def _children(m: Any, keys: bool = True) -> tuple[list[Any] | None, list[Any]]:
    """`_flatten`'s keys and children without its aux data (the matchers read only those); a module
    of one section without `_slots`' frame, as `_flatten`. ``keys=False``: ``(None, children)``,
    no keys made (``fk.leaves``, which lists the children only: `VALUES_ONLY`)."""
    d = m.__dict__
    p = d["_parameters"]
    b = d["_buffers"]
    s = d["_modules"]
    if not keys and VALUES_ONLY:
        if b:
            vals = [*p.values(), *b.values(), *s.values()]
        elif s:
            vals = [*p.values(), *s.values()] if p else list(s.values())
        else:
            vals = list(p.values())
        if _NONE not in map(type, vals):
            return None, vals
        return None, [v for v in vals if v is not None]  # (the order `_layout` lists them in)
    if INLINE_SLOTS and not b and not (p and s):
        vals = list(s.values()) if s else list(p.values())
        if _NONE not in map(type, vals):
            names = list(s) if s else list(p)
            if _NAMES.issuperset(names):
                return names, vals
            return list(map(_key_of if _KNOWN.issuperset(names) else _key, names)), vals
    ks, vals, _ = _slots(d, False)
    return ks, vals


#: `_flatten` and `_children` take a module of one section themselves (tests and bench_walk's module
#: rows switch it off: `_slots` then takes every module)
INLINE_SLOTS = True
#: ``_children(m, keys=False)`` lists the children without making their keys (tests and bench_walk's
#: module ``fk.leaves(m)`` row switch it off: the keys are made and dropped then)
VALUES_ONLY = True


#: `_lockstep` walks modules for ``out=`` (tests and bench_arith's module EMA rows switch it off: the
#: first module is then recorded and the others matched against its definition)
LOCKSTEP = True
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _slot_trainable(v: Any) -> bool | None:
    """`_trainable`'s rule for the tensor in one parameter slot: a plain tensor is trainable, a
    Parameter while it requires grad; None for an uninitialized one (a lazy module's)."""
    if type(v) is torch.nn.Parameter:  # (a plain Parameter is never an uninitialized one)
        return bool(v.requires_grad)
    if isinstance(v, _Uninitialized):
        return None
    # a Parameter of a tensor subclass (FSDP2's DTensors) carries ``_is_param``, which is what
    # Parameter's Python ``__instancecheck__`` reads first: tested without that call
    # (bench_sharded's EMA rows)
    param = getattr(v, "_is_param", False) is True or isinstance(v, torch.nn.Parameter)
    return bool(v.requires_grad) if param else True


def _param_flags(vals: list[Any]) -> list[bool] | None:
    """`_slot_trainable` of each tensor in a parameter slot, or None for an uninitialized one
    (a lazy module: the recording walk refuses it, naming its path). Plain Parameters, and
    Parameters of a tensor subclass (FSDP2's DTensors: ``_is_param`` set on each, which an
    uninitialized parameter never has), are read in C-level passes (`PARAM_FLAGS`; bench_sharded's
    EMA rows)."""
    if _PARAMETER.issuperset(map(type, vals)):
        return list(map(_REQUIRES_GRAD, vals))
    if PARAM_FLAGS[0] and _subclass_params(vals):
        return list(map(_REQUIRES_GRAD, vals))
    out = list(map(_slot_trainable, vals))
    return None if None in out else cast(list[bool], out)


def _subclass_params(vals: Any) -> bool:
    """Whether every one of `vals` carries ``_is_param`` (a Parameter of a tensor subclass: FSDP2's
    DTensors), in C-level passes."""
    return all(map(operator.is_, map(getattr, vals, repeat("_is_param"), repeat(False)), repeat(True)))


#: `_param_flags` and `_trainable` read the flags of Parameters of a tensor subclass (FSDP2's DTensors) in C-level
#: passes (tests switch it off: each is then judged by `_slot_trainable`)
PARAM_FLAGS = [True]
_VALUES = operator.methodcaller("values")


def _lockstep(
    trees: Sequence[Any], track: bool, tables: Any
) -> tuple[list[list[Any]], list[bool] | None, list[Any]] | None:
    """`NodeDef.lockstep` for two modules (``out=``'s common case: an EMA, ``fk.add(a, b, out=a)``):
    both modules' leaves (parameters, then buffers, then the submodules' leaves, each in
    registration order: the recording walk's order) and the first module's trainable flags
    (`_trainable`, per leaf), and the first module's modules. One pass over the modules' trees
    lists their sections of leaves (no keys made, no aux data copied, no definition built); the
    leaves, their names, slots and types are then compared for all sections at once, in C-level
    passes (bench_arith's 12-block ``nn.Module`` and bench_sharded's FSDP2 EMA rows). None, and
    the recording walk then runs, for any other number of trees, and unless every node is a module
    of the adapter's own node types (no node registered over one), the modules match node for node
    (classes, slot names in order, ``None`` slots alike), every child that is not a module is a
    tensor (the engine tests the first module for ties and shared submodules)."""
    if not LOCKSTEP or len(trees) != 2:
        return None
    disp_get = tables[1].get
    defs_get = _DEFS.get
    secs0: list[Any] = []  # the sections of leaves (parameters, buffers), in the recording walk's order
    secs1: list[Any] = []
    kinds: list[bool] = []  # per section: True for parameters
    add0, add1, add_kind = secs0.append, secs1.append, kinds.append
    nodes: list[Any] = []
    add_node = nodes.append

    def visit(m0: Any, m1: Any, depth: int) -> bool:
        cls = type(m0)
        nd = defs_get(cls)
        if nd is None or type(m1) is not cls or disp_get(cls) is not nd or depth > 200:
            return False
        add_node(m0)
        d0 = m0.__dict__
        d1 = m1.__dict__
        p0, p1 = d0.get("_parameters"), d1.get("_parameters")
        b0, b1 = d0.get("_buffers"), d1.get("_buffers")
        s0, s1 = d0.get("_modules"), d1.get("_modules")
        if None in (p0, p1, b0, b1, s0, s1):  # a module whose ``Module.__init__`` never ran: the
            return False  # recording walk decides (and raises, naming the path)
        if p0 or p1:
            add0(p0)
            add1(p1)
            add_kind(True)
        if b0 or b1:
            add0(b0)
            add1(b1)
            add_kind(False)
        if not s0:
            return not s1
        if list(s0) != list(s1):
            return False
        depth += 1
        for c0, c1 in zip(s0.values(), s1.values()):
            if c0 is None:  # a ``None`` slot: in both modules, or they differ
                if c1 is not None:
                    return False
            elif not visit(c0, c1, depth):
                return False
        return True

    try:
        ok = visit(trees[0], trees[1], 0)
    finally:
        visit = None  # type: ignore[assignment]  # the closure refers to itself: break the cycle
    if not ok:
        return None
    sizes = list(map(len, secs0))
    if sizes != list(map(len, secs1)) or [*chain.from_iterable(secs0)] != [*chain.from_iterable(secs1)]:
        return None  # (equal sizes and equal names in order: every section has the same names)
    flat0 = [*chain.from_iterable(map(_VALUES, secs0))]
    flat1 = [*chain.from_iterable(map(_VALUES, secs1))]
    types0, types1 = set(map(type, flat0)), set(map(type, flat1))
    per_leaf: list[bool] | None = None  # each leaf's section kind, where not every section is parameters
    if not all(kinds):
        per_leaf = [*chain.from_iterable(map(repeat, kinds, sizes))]
    if _NONE in types0 or _NONE in types1:  # ``None`` slots (Linear(bias=False)): at the same places
        keep = list(map(operator.is_not, flat0, repeat(None)))
        if keep != list(map(operator.is_not, flat1, repeat(None))):
            return None
        flat0 = list(compress(flat0, keep))
        flat1 = list(compress(flat1, keep))
        if per_leaf is not None:
            per_leaf = list(compress(per_leaf, keep))
        types0.discard(_NONE)
        types1.discard(_NONE)
    is_leaf = tables[2].issuperset
    if not is_leaf(types0) or not is_leaf(types1):
        return None
    for t in types0 | types1:  # tensors only (a slot holding anything else: the recording walk decides)
        if not issubclass(t, torch.Tensor):
            return None
    flags: list[bool] | None = None
    if track:
        if per_leaf is None:
            flags = _param_flags(flat0)
        else:
            got = _param_flags(list(compress(flat0, per_leaf)))
            if got is not None:
                it = iter(got)
                flags = [next(it) if k else False for k in per_leaf]  # (buffers are not trainable)
        if flags is None:
            return None  # an uninitialized parameter: the recording walk names its path
        if all(flags):
            flags = None
    return [flat0, flat1], flags, nodes


def _slots(d: dict[str, Any], keep_none: bool) -> tuple[list[Any], list[Any], Any]:
    """A module's child keys, children and layout (see `_flatten`) from its ``__dict__``: sections
    taken whole (list unpacking; the per-slot loop, `_layout`, only for modules with ``None``
    slots): most of the cost of walking a module (bench_walk's module rows)."""
    p = d["_parameters"]
    b = d["_buffers"]
    s = d["_modules"]
    if b:
        vals = [*p.values(), *b.values(), *s.values()]
        names = [*p, *b, *s]
    elif s:
        vals = [*p.values(), *s.values()] if p else list(s.values())
        names = [*p, *s] if p else list(s)
    else:
        vals = list(p.values())
        names = list(p)
    if not keep_none and _NONE in map(type, vals):
        return _layout(d)
    if _NAMES.issuperset(names):
        return names, vals, (len(p), len(b))
    return list(map(_key_of if _KNOWN.issuperset(names) else _key, names)), vals, (len(p), len(b))


def _layout(d: dict[str, Any]) -> tuple[list[Any], list[Any], list[tuple[int, str, int]]]:
    """The keys, children and per-slot layout of a module with ``None`` slots (left out)."""
    keys: list[Any] = []
    vals: list[Any] = []
    layout: list[tuple[int, str, int]] = []
    for s, section in enumerate(_SECTIONS):
        for name, v in d[section].items():
            if v is None:
                layout.append((s, name, -1))
            else:
                layout.append((s, name, len(vals)))
                keys.append(_key(name))
                vals.append(v)
    return keys, vals, layout


class _Parametrized:
    """A parametrized module's class in its aux data: ``torch.nn.utils.parametrize`` makes one class
    per instance (``ParametrizedLinear``), so two modules parametrized alike would never have equal
    tree definitions (``fk.allclose`` False, ``fk.stack`` refused). Equal to another of the same
    node kind (the original class, `_kind_of`); the clone is made of `cls` itself."""

    __slots__ = ("cls", "kind")

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.kind = _kind_of(cls)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Parametrized and other.kind == self.kind

    def __hash__(self) -> int:
        return hash(self.kind)

    def __repr__(self) -> str:
        return f"<parametrized {self.kind[1].__qualname__}>"


def _flatten_as(token: Any, drop: tuple[str, ...]) -> Callable[..., tuple[list[Any], list[Any], Any, bool]]:
    """`_flatten` for a class whose aux data names it by `token` (`_Parametrized`) and leaves out the
    attributes `drop` (an RNN's ``_flat_weights``/``_flat_weight_refs``: its own parameters again,
    rebuilt by `_refresh_rnn`, and never equal by ``==``, so two RNNs would never be one structure)."""

    def flatten(m: Any, keep_none: bool = False) -> tuple[list[Any], list[Any], Any, bool]:
        keys, vals, aux, named = _flatten(m, keep_none)
        cls, rest, layout, live = aux
        for k in drop:
            rest.pop(k, None)
        return keys, vals, (cls if token is None else token, rest, layout, live), named

    return flatten


def _flatten_slots(m: Any) -> tuple[list[Any], list[Any], Any, bool]:
    """`_flatten` with the slots holding ``None`` as children too (for ``fk.combine``: every
    partition group of a module then has the module's structure)."""
    return _flatten(m, keep_none=True)


class _Live:
    """The module a node was recorded from, held weakly: a rebuilt module takes its non-parameter
    state (training flag, hooks, plain attributes) from it at rebuild time, as
    ``torch.func.functional_call`` uses the live module, so ``re(p)`` made before ``net.eval()``
    sees it. Not part of the structure: every ``_Live`` equals every other, and pickles as a dead
    reference (the recorded snapshot is used then)."""

    __slots__ = ("ref",)

    def __init__(self, m: Any) -> None:
        self.ref = None if m is None else weakref.ref(m)

    def __call__(self) -> Any:
        ref = self.ref
        return None if ref is None else ref()

    def __eq__(self, other: object) -> bool:
        return type(other) is _Live

    def __hash__(self) -> int:
        return 0

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Live, (None,))

    def __repr__(self) -> str:
        return "<live module>"


def _redirects_new(cls: type) -> bool:
    """Whether `cls.__new__` builds something else than a bare `cls`: FSDP2's ``fully_shard`` makes
    the class ``FSDP<cls>`` whose ``__new__`` constructs (and ``__init__``s) the original class, so a
    clone made through it would lose its FSDP2 class and need constructor arguments. Such a class is
    cloned with ``object.__new__`` (what ``nn.Module`` itself uses: it defines no ``__new__``)."""
    new = getattr(cls, "__new__", None)
    return new is not object.__new__ and str(getattr(new, "__module__", "")).startswith("torch.distributed.fsdp")


def _fsdp_fixup(first: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """The fixup of an FSDP2 class's clone: `first` (the class's own, if any), then
    `functorkit.adapters._fsdp_rebuild.rebuild` (its own FSDP2 state, hooks and sharded parameters)."""
    from ._fsdp_rebuild import rebuild

    if first is None:
        return rebuild

    def both(m: Any) -> None:
        first(m)
        rebuild(m)

    return both


def _make_unflatten(
    copied: frozenset[str], fixup: Callable[[Any], None] | None, bare_new: bool = False
) -> Callable[[Any, list[Any], list[Any]], Any]:
    def unflatten(aux: Any, keys: list[Any], values: list[Any]) -> Any:
        cls, rest, layout, live = aux
        if type(cls) is _Parametrized:
            cls = cls.cls
        new = object.__new__(cls) if bare_new else cls.__new__(cls)
        m = live()
        # the live module's current state; its parameter, buffer and submodule dicts are replaced below
        # (a dict's own copy: dict(d) of an instance dict took 3x as long)
        nd = (rest if m is None or type(m) is not cls else m.__dict__).copy()
        for k in copied:
            v = nd.get(k)
            if v is not None:
                # the C-level copy of torch's own containers (3x faster than OrderedDict(v): most of a
                # module's rebuild, bench_walk's module fmap row); a subclass through its constructor
                nd[k] = v.copy() if type(v) in _COPY else type(v)(v)
        if type(layout) is tuple:  # every slot a child, in order: (parameters, buffers)
            np_, nb = layout
            names = keys if _NAMES.issuperset(keys) else [k if type(k) is str else str(k) for k in keys]
            if np_ == len(values):  # parameters only (a layer)
                nd["_parameters"], nd["_buffers"], nd["_modules"] = dict(zip(names, values)), {}, {}
            elif not np_ and not nb:  # submodules only (a container)
                nd["_parameters"], nd["_buffers"], nd["_modules"] = {}, {}, dict(zip(names, values))
            else:
                e = np_ + nb
                nd["_parameters"] = dict(zip(names[:np_], values[:np_]))
                nd["_buffers"] = dict(zip(names[np_:e], values[np_:e]))
                nd["_modules"] = dict(zip(names[e:], values[e:]))
        else:
            sections: tuple[dict[str, Any], dict[str, Any], dict[str, Any]] = ({}, {}, {})
            for s, name, j in layout:
                sections[s][name] = None if j < 0 else values[j]
            for s, section in enumerate(_SECTIONS):
                nd[section] = sections[s]
        object.__setattr__(new, "__dict__", nd)
        if fixup is not None:
            fixup(new)
        return new

    return unflatten


def _drop_cached(names: tuple[str, ...], first: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """The fixup of a clone of a class with cached properties: `first` (the class's own, if any),
    then the cached values taken from the live module are removed (recomputed on first access from
    the clone's own parameters, not the old ones)."""

    def fixup(m: Any) -> None:
        if first is not None:
            first(m)
        d = m.__dict__
        for name in names:
            d.pop(name, None)

    return fixup


def _refresh_rnn(m: Any) -> None:
    """Point an RNN's cached flat weight list at the rebuilt module's own weights.

    ``RNNBase.forward`` reads ``_flat_weights``; the clone would otherwise share
    the original's list (and a later ``setattr`` on the clone would write into
    it). This mirrors ``RNNBase._init_flat_weights`` without its
    ``flatten_parameters()``, which on CUDA rewrites the weights in place.
    """
    d = m.__dict__
    names = d.get("_flat_weights_names")
    if names is None:
        return
    params = d["_parameters"]
    flat = [params.get(n, d.get(n)) for n in names]
    d["_flat_weights"] = flat
    d["_flat_weight_refs"] = [None if w is None else weakref.ref(w) for w in flat]


def _refresh_compiled(m: Any) -> None:
    """``torch.compile``'s ``OptimizedModule``: bind its forward to the rebuilt inner module.

    Its ``forward`` attribute is a wrapper around ``self._orig_mod.__call__``
    of the module it was made from; torch rebuilds it the same way when
    unpickling (``__setstate__`` calls ``_initialize``).
    """
    m.__dict__.pop("forward", None)
    m.__dict__.pop("_forward", None)
    m._initialize()


def _is_compiled_module(cls: type) -> bool:
    """A subclass of ``torch.compile``'s ``OptimizedModule`` (an issubclass test, which Dynamo traces
    where it cannot iterate an MRO; the class exists only once ``torch._dynamo`` is imported)."""
    frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(frame, "OptimizedModule", None)
    return isinstance(optimized, type) and issubclass(cls, optimized) and hasattr(cls, "_initialize")


def claims(cls: type) -> bool:
    """True for the classes this adapter owns: tensors (leaves) and ``nn.Module`` subclasses (nodes)."""
    return isinstance(cls, type) and issubclass(cls, (torch.Tensor, torch.nn.Module))


_PARAMETER = frozenset({torch.nn.Parameter})


def _trainable(m: Any) -> frozenset[Any] | None:
    """The trainable child keys, or None when every child is (no buffer, no frozen parameter: most
    layers; the walk then keeps no key set for the module, and a model of such modules skips the
    trainable pass altogether: bench_walk's module ``fk.destructure(m)`` row)."""
    d = m.__dict__
    if not d["_buffers"]:  # the common layer: plain trainable Parameters only (torch.compile traces this)
        params = d["_parameters"]
        if not params:  # a container or an activation: submodules only, every one trainable
            return None
        ps = params.values()
        if _PARAMETER.issuperset(map(type, ps)) or (PARAM_FLAGS[0] and _subclass_params(ps)):
            for p in ps:  # (a loop: half the time of all() over a generator, for a layer's few)
                if not p.requires_grad:
                    break
            else:
                return None
    out = []
    every = True
    for name, v in d["_parameters"].items():
        if v is None:
            continue
        trainable = _slot_trainable(v)
        if trainable is None:
            msg = (
                f"the parameter {name!r} of this {type(m).__name__} is uninitialized (a lazy module): it has "
                "no shape and no values yet, so it cannot be flattened or combined. Expected initialized "
                "parameters; fix: run one forward pass through the model first, which initializes them."
            )
            err = ValueError(msg)
            err.functorkit_needs_path = True  # type: ignore[attr-defined]  # the walk puts the module's path first
            raise err
        if not trainable:
            every = False
            continue
        out.append(_key(name))
    if every:
        buffers = d["_buffers"]
        if not buffers or all(v is None for v in buffers.values()):
            return None
    out.extend(_key(name) for name, v in d["_modules"].items() if v is not None)
    return frozenset(out)


def _state_skip(aux: Any) -> frozenset[Any] | None:
    """The child keys ``state_dict()`` leaves out: the module's non-persistent buffers."""
    names = aux[1].get("_non_persistent_buffers_set")
    return frozenset(map(_key, names)) if names else None


def _kind_of(cls: type) -> Any:
    """The node kind two trees are matched by. ``torch.nn.utils.parametrize`` gives every
    parametrized module a class of its own (``ParametrizedLinear``, made per instance, subclassing
    the original); two such modules of one original class are the same kind of node, as torch's
    ``load_state_dict`` treats them."""
    bases = cls.__bases__
    if (
        cls.__module__ == "torch.nn.utils.parametrize"
        and len(bases) == 1
        and cls.__name__ == f"Parametrized{bases[0].__name__}"
    ):
        return ("parametrized", bases[0])
    return cls


def node_for(cls: type) -> NodeDef | None:
    """The NodeDef for an ``nn.Module`` subclass, or None for any other type."""
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        return None
    nd = _DEFS.get(cls)
    if nd is None:
        copied = _OWN_CONTAINERS
        fixup: Callable[[Any], None] | None = None
        if issubclass(cls, torch.nn.ParameterDict):
            copied = copied | {"_keys"}
        if issubclass(cls, torch.nn.RNNBase):
            copied = copied | {"_flat_weights_names", "_all_weights"}
            fixup = _refresh_rnn
        elif _is_compiled_module(cls):
            fixup = _refresh_compiled
        bare_new = _redirects_new(cls)
        if bare_new:  # an FSDP2 class: the clone gets an FSDP2 state of its own (`_fsdp_rebuild`)
            fixup = _fsdp_fixup(fixup)
        kind = _kind_of(cls)
        token = None if kind is cls else _Parametrized(cls)
        drop = _RNN_CACHES if issubclass(cls, torch.nn.RNNBase) else ()
        # (Dynamo cannot iterate a class's MRO: a class first met inside torch.compile is taken as
        # it was before, its cached values carried over; met eagerly first, it is handled)
        cached = () if torch.compiler.is_compiling() else cached_properties(cls)
        if cached:  # values computed from the old parameters: left out of the aux data and the clone
            drop = (*drop, *cached)
            fixup = _drop_cached(cached, fixup)
        flatten = _flatten if token is None and not drop else _flatten_as(token, drop)
        nd = _DEFS[cls] = NodeDef(
            cls,
            flatten,
            _make_unflatten(copied, fixup, bare_new),
            _trainable,
            owns=True,
            kind=kind,
            state_skip=_state_skip,
            flatten_slots=_flatten_slots if flatten is _flatten else lambda m: flatten(m, True),
            children=_children,
            lockstep=_lockstep,
        )
    return nd
