"""The lock-step engine of the arithmetic: the models walked together on the first one's tree
definition, each operand checked against the first model's (`_check_same`), a column path over
the leaves for the common case (`_columns`), and the helpers the arithmetic shares."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
import operator
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from typing import Any, cast

import numpy as np

from ._dense import check_dense, check_dense_leaf, check_dense_of
from ._errors import PolicyError, StructureError
from ._inplace import run_out
from ._keypath import KeyPath
from ._record import all_distinct, record_plain
from ._registry import TABLES, NodeDef, dispatch
from ._treedef import _MISS
from ._typing import Tree as T
from ._walk import BUILD_NONE, BUILD_SAME, walk
from ._xp import (
    describe_array,
    describe_device,
    describe_dtype,
    describe_namespace,
    device_of,
    inexact_flags,
    inexact_one_type,
    is_array,
    is_complex,
    is_inexact_array,
    namespace,
    same_device,
)
from .adapters import adapter_of, tracing
from .adapters._sharding import mixed_problem

_PY_SCALARS = (int, float, complex)


# --------------------------------------------------------------------------- helpers

_dtype_name = describe_dtype
_describe = describe_array
_is_complex = is_complex


def _ns_name(xp: Any) -> str:
    return describe_namespace(xp)


def _as_array(x: Any) -> Any:
    """NumPy reductions and 0-d arithmetic give NumPy scalars: make them 0-d arrays."""
    if isinstance(x, np.generic):
        return np.asarray(x)
    return x


def _real_dtype(xp: Any, dt: Any) -> Any:
    if xp.isdtype(dt, "complex floating"):
        return xp.float32 if dt == xp.complex64 else xp.float64
    return dt


def _same_device(a: Any, b: Any) -> bool:
    ad = adapter_of(a)
    return same_device(ad.device(a), adapter_of(b).device(b))


def copy_array(x: Any) -> Any:
    """An independent copy of array `x` (anything else is returned as it is).

    The adapter's ``clone_leaf``: NumPy arrays keep their subclass and memory
    order and come back writeable; torch tensors are copied detached from
    autograd history (like ``copy.deepcopy``): an ``nn.Parameter`` gives an
    ``nn.Parameter`` and a tensor that required grad gives a new leaf that
    requires grad.
    """
    if not is_array(x):
        return x
    return adapter_of(x).clone_leaf(x)


def _model_list(models: Any, fname: str, what: str = "models") -> list[Any]:
    """`models` as a list of models; a single model (dict, array, dataclass, torch module, any node
    that is not a sequence...) is a TypeError."""
    if type(models) is list or type(models) is tuple:  # the common case (a plain sequence: never one model)
        return list(models)
    single = (
        isinstance(models, (Mapping, str, bytes))
        or is_array(models)
        or (dataclasses.is_dataclass(models) and not isinstance(models, type))
        # a node that is not a sequence (a torch module, a registered class): a model, even if iterable
        or (isinstance(dispatch(models), NodeDef) and not isinstance(models, Sequence))
    )
    if not single:
        try:
            return list(models)
        except TypeError:
            single = True
    msg = (
        f"fk.{fname}: `{what}` must be a list (or tuple) of models, got a {type(models).__name__}, which "
        f"looks like a single model. Expected e.g. fk.{fname}("
        + ("[c1, c2], [m1, m2]" if fname == "lincomb" else "[m1, m2, m3]")
        + f"); fix: wrap it in a list, e.g. fk.{fname}("
        + ("[1.0], [model]" if fname == "lincomb" else "[model]")
        + ")."
    )
    raise TypeError(msg)


def _coefficient_list(coefficients: Any) -> list[Any]:
    """`coefficients` as a list; a single number or array is a TypeError that shows the fix."""
    if type(coefficients) is list or type(coefficients) is tuple:  # the common case
        return list(coefficients)
    if (
        isinstance(coefficients, (Mapping, str, bytes))
        or is_array(coefficients)
        or isinstance(coefficients, numbers.Number)
    ):
        single = True
    else:
        try:
            return list(coefficients)
        except TypeError:
            single = True
    assert single
    if is_array(coefficients) and getattr(coefficients, "ndim", 0) == 1:  # a 1-D array of weights
        fix = "pass its numbers as a list, fk.lincomb(list(c), models) (a 0-d array per model is kept as one)"
    else:
        fix = "wrap it in a list (fk.lincomb([c], [model])) or use fk.scale(c, model) for one model"
    msg = (
        f"fk.lincomb: `coefficients` must be a list of numbers, one per model, got a "
        f"{type(coefficients).__name__} ({coefficients!r}). Expected e.g. fk.lincomb([0.5, 0.5], [m1, m2]); "
        f"fix: {fix}."
    )
    raise TypeError(msg)


# --------------------------------------------------------------------------- the lock-step engine

_SHAPE_OF = operator.attrgetter("shape")
_DTYPE_OF = operator.attrgetter("dtype")
_DEVICE_OF = operator.attrgetter("device")
#: the column path of `_columns` is on (tests/test_arith_columns.py and bench_arith's "lock-step per-leaf
#: path" rows turn it off to compare both paths)
COLUMNS = [True]


def _check_same(fname: str, names: Sequence[str], path: KeyPath, x: Any, others: Sequence[Any]) -> None:
    """Each other model's array at a parameter position matches the first model's."""
    xp = namespace(x)
    for j, o in enumerate(others, start=1):
        if (
            type(o) is type(x)
            and o.shape == x.shape
            and o.dtype == x.dtype
            and (adapter_of(x).one_device or _same_device(o, x))
        ):
            continue  # the common case, in one test
        if not is_array(o):
            msg = (
                f"at {path.display}: fk.{fname}: `{names[0]}` has a parameter here ({_describe(x)}) but "
                f"`{names[j]}` has a {type(o).__name__}. Expected an array of the same shape and dtype in "
                "every model; fix: pass models of the same structure."
            )
            raise StructureError(msg)
        if namespace(o) is not xp:
            msg = (
                f"at {path.display}: fk.{fname}: `{names[0]}` has a {_ns_name(xp)} array here but "
                f"`{names[j]}` a {_ns_name(namespace(o))} array. Expected one namespace; functorkit does "
                "not convert between libraries silently; fix: convert one model first (e.g. with fk.fmap)."
            )
            raise PolicyError(msg)
        why = mixed_problem(adapter_of(x), x, o, names[0], names[j])  # a DTensor and a plain tensor
        if why is not None:
            msg = f"at {path.display}: fk.{fname}: {why}."
            raise PolicyError(msg)
        if tuple(o.shape) != tuple(x.shape):
            msg = (
                f"at {path.display}: fk.{fname}: shape {tuple(x.shape)} in `{names[0]}` vs "
                f"{tuple(o.shape)} in `{names[j]}`. Expected equal shapes (no broadcasting between "
                "models); fix: pass models of the same architecture."
            )
            raise StructureError(msg)
        if o.dtype != x.dtype:
            msg = (
                f"at {path.display}: fk.{fname}: dtype {_dtype_name(x.dtype)} in `{names[0]}` vs "
                f"{_dtype_name(o.dtype)} in `{names[j]}`. Expected equal dtypes: functorkit never promotes "
                "between models; fix: cast one model first, e.g. fk.fmap(lambda x: xp.astype(x, dtype), model)."
            )
            raise PolicyError(msg)
        if not _same_device(o, x):
            msg = (
                f"at {path.display}: fk.{fname}: device {describe_device(device_of(x))} in `{names[0]}` vs "
                f"{describe_device(device_of(o))} in `{names[j]}`. Expected one device per parameter; fix: move one "
                "model first."
            )
            raise PolicyError(msg)


def _run(fname: str, names: Sequence[str], models: Sequence[Any], visit: Callable[..., Any], build: int) -> Any:
    return walk(tuple(models), visit, build=build, with_path=True, track=True, names=tuple(names))


def _check_trainable_only(trainable_only: Any, fname: str) -> bool:
    if type(trainable_only) is not bool:
        msg = (
            f"fk.{fname}: `trainable_only` must be True or False, got {type(trainable_only).__name__} "
            f"({trainable_only!r}). True: parameters only; False: every floating array (buffers too)."
        )
        raise TypeError(msg)
    return trainable_only


class _Deferred:
    """The definition of a tree walked by a ``lockstep`` walk, recorded only when a path is asked for
    (a failure's message): what `_columns` returns with ``rebuild=False`` in its place. Nothing has
    been written when a message is made, so the tree is recorded as it was walked."""

    __slots__ = ("_td", "_tree")

    def __init__(self, tree: Any) -> None:
        self._tree = tree
        self._td: Any = None

    def _defn(self) -> Any:
        if self._td is None:
            self._td = record_plain(self._tree, track=True)[1]
        return self._td

    @property
    def paths(self) -> tuple[KeyPath, ...]:
        return cast(tuple[KeyPath, ...], self._defn().paths)

    def position_paths(self) -> list[KeyPath]:
        return cast(list[KeyPath], self._defn().position_paths())


def _walk_together(models: Sequence[Any]) -> tuple[list[list[Any]], list[bool] | None] | None:
    """The root's ``lockstep`` walk of `models` (`NodeDef.lockstep`): every model's leaves and the
    first one's trainable flags, or None where the root has none, it declines, or the first model
    has a tie or a shared sub-tree (the recording walk then records them)."""
    tables = TABLES[0]
    nd = tables[1].get(type(models[0]))
    if type(nd) is not NodeDef or nd.lockstep is None:
        return None
    got = nd.lockstep(models, True, tables)
    if got is None:
        return None
    flats, flags, nodes = got
    if not all_distinct(flats[0] + nodes):
        return None
    return flats, flags


def _columns(
    models: Sequence[Any],
    names: Sequence[str],
    every: bool,
    fname: str = "arithmetic",
    operators: bool = False,
    rebuild: bool = True,
) -> tuple[Any, list[Any], list[int], list[list[Any]], list[Any], Any, list[list[Any]] | None] | None:
    """The common case of the lock-step engine in C-level passes over the leaves: the first model's
    definition and leaves, the indices of its operands, the other models' operands, the
    operands' dtypes (of their stand-ins: a DTensor's local shard), their adapter where they
    are all of one array type (else None: found in the type pass made anyway) and the stand-ins
    (``stand_ins``) of every model's operands, the first model's first, where the adapter gave them
    (DTensors: their local shards, which ``out=``'s column path hands on to the adapter's
    ``out_fast`` and kernels instead of asking for them again; else None), when there are no ties or
    shared sub-trees and every other operand has the first one's type, shape, dtype and device.
    None otherwise: the per-leaf path then runs and names what differs (bench_scale
    ``fk.add(d, d)`` row; tests/test_arith.py turns this path off to compare).
    `operators`: the caller applies the arrays' own operators to the columns; None also when an
    operand has a dtype its adapter lists in ``operator_less`` (torch float8: the per-leaf path
    then calls the adapter's kernel there), found in the dtype pass the comparison makes anyway.
    Each fact of the first model's operands is read once (one pass), whatever the number of models,
    and the other models' density is checked in one adapter call after they are matched.
    ``rebuild=False``: the caller builds nothing from the definition (``out=``, the reductions), so
    a root node with a ``lockstep`` walk (torch modules) walks all models in one pass instead of
    being recorded and matched; the definition returned then records the first model only if a
    path is asked for (`_Deferred`)."""
    if not COLUMNS[0] or tracing():  # under torch.compile the per-leaf path traces without breaks
        return None
    walked = None if rebuild else _walk_together(models)
    if walked is not None:
        flats, mask = walked
        leaves = flats[0]
        td: Any = _Deferred(models[0])
    else:
        leaves, td = record_plain(models[0], track=True)
        if td._ties() is not None or td._shares():
            return None
        mask = td._trainable_mask()
    try:
        one = inexact_one_type(leaves)  # arrays of one type (they hold no arrays of their own)
    except TypeError:  # np.matrix: the per-leaf path raises it with its path
        return None
    if one is None:
        if walked is None:  # (a lock-step walk lists arrays of its own types only)
            td.refuse_holders(leaves)
        try:
            flags = inexact_flags(leaves)
        except TypeError:  # a leaf functorkit refuses (np.matrix): the per-leaf path raises it with its path
            return None
    else:
        flags = one[0]
    if not every and mask is not None:
        flags = list(map(operator.and_, flags, mask))
    if all(flags):  # every leaf an operand (the common case): no index lists
        idx: list[int] = list(range(len(leaves)))
        xs = leaves
    else:
        idx = list(itertools.compress(range(len(leaves)), flags))
        xs = list(map(leaves.__getitem__, idx))
    if one is not None and xs:  # one array type (they were classified in one pass)
        ads = [adapter_of(xs[0])]
        types: Any = None  # every operand has the first one's type
    else:
        ads = [adapter_of(x) for x in dict(zip(map(type, xs), xs)).values()]  # one per array type
        types = list(map(type, xs))
    dense: Callable[..., None] = check_dense
    #: one adapter's own dense test (``first_not_dense``), asked first: the error (with its path) is
    #: made only when it finds an array that is not dense
    bad: Callable[[list[Any], bool], int | None] | None = None  # (eager: `tracing()` was asked above)
    if len(ads) == 1:  # one adapter, asked directly
        ad0 = ads[0]
        one_device, sparse, less = ad0.one_device, ad0.may_be_sparse, ad0.operator_less
        dev = _DEVICE_OF if ad0.device_attr else device_of
        if sparse:
            bad = ad0.first_not_dense
            dense = functools.partial(check_dense_of, ad0)
        # arrays with the operands' dtypes, devices and layouts that are cheaper to ask (torch
        # DTensors: their local shards); shapes and types are the operands' own
        stand = ad0.stand_ins(xs)
    else:
        one_device = all(ad.one_device for ad in ads)
        sparse = any(ad.may_be_sparse for ad in ads)  # (every operand is an array: `flags`)
        less = frozenset().union(*(ad.operator_less for ad in ads))
        dev = _DEVICE_OF if all(ad.device_attr for ad in ads) else device_of  # (types are compared first)
        stand = None
    vx = xs if stand is None else stand
    if sparse and (bad is None or bad(vx, True) is not None):  # torch: a sparse or nested operand is a
        # TypeError naming its path
        dense(vx, lambda i: td.paths[idx[i]].display, f"fk.{fname}")
    # the operands' dtypes (also for an operator-less dtype), read once
    dts = list(map(_DTYPE_OF, vx)) if one is None else one[1] if xs is leaves else list(map(one[1].__getitem__, idx))
    if operators and less and not less.isdisjoint(dts):
        return None
    # generated for a small container tree met before (_plans.py)
    fm = None if walked is not None else td._generated_match()
    t0 = type(xs[0]) if xs else None
    cols: list[list[Any]] = []
    vcs: list[list[Any]] = []
    for j, m in enumerate(models[1:], start=1):
        if walked is not None:
            o: Any = walked[0][j]
        else:
            o = fm(m, False) if fm is not None else _MISS
            if o is _MISS:
                o = td._match(m, j, tuple(names))
            if type(o) is int:
                return None
        col = cast(list[Any], o) if xs is leaves else list(map(cast(list[Any], o).__getitem__, idx))
        same = all(map(operator.is_, map(type, col), repeat(t0))) if types is None else list(map(type, col)) == types
        if walked is None and (not same or xs is not leaves):  # (every position an array of the first
            # model's types: no holder)
            td.refuse_holders(cast(list[Any], o), positions=True)
        if not same:
            return None
        vc = col if stand is None else ads[0].stand_ins(col)
        if vc is None:
            return None
        cols.append(col)
        vcs.append(vc)
    one_ad = ads[0] if len(ads) == 1 else None  # (`ads`: one adapter per array type)
    stands = None if stand is None else [stand, *vcs]
    if not cols:
        return td, leaves, idx, cols, dts, one_ad, stands
    n = len(xs)
    if sparse:  # every other model's operands in one call (a path: its position in the first model)
        rest = vcs[0] if len(vcs) == 1 else [*itertools.chain(*vcs)]
        if bad is None or bad(rest, True) is not None:
            dense(rest, lambda i: td.paths[idx[i % n]].display, f"fk.{fname}")
    # streamed comparisons: no list of a million shape tuples for the garbage collector to scan (one array
    # type: the adapter's own size test)
    sizes = ads[0].same_size_test(t0) if types is None and t0 is not None else None
    shapes: Any = None
    if sizes is None:
        shapes = map(_SHAPE_OF, xs) if len(cols) == 1 else list(map(_SHAPE_OF, xs))
    devs: Any = None
    if not one_device:
        devs = map(dev, vx) if len(cols) == 1 else list(map(dev, vx))
    for col, vc in zip(cols, vcs, strict=True):
        if not (
            (all(map(sizes, xs, col)) if sizes is not None else all(map(operator.eq, shapes, map(_SHAPE_OF, col))))
            and dts == list(map(_DTYPE_OF, vc))  # (a list comparison: one C-level pass)
            and (devs is None or all(map(operator.eq, devs, map(dev, vc))))
        ):
            return None  # (a device that cannot be determined, None, is left to the per-leaf test too)
    return td, leaves, idx, cols, dts, one_ad, stands


def _map_params(
    fname: str,
    names: Sequence[str],
    models: Sequence[T],
    fn: Callable[[KeyPath, Any, list[Any], Any], Any],
    trainable_only: bool = True,
    op: Callable[..., Any] | None = None,
    *,
    check: Callable[[KeyPath, Any], None] | None = None,
    out: Any = None,
    late: int | None = None,
    batch: Callable[[list[Any], list[list[Any]], bool], bool] | None = None,
    check_devices: bool = True,
) -> T:
    """Rebuild the first model with ``fn(path, x, others, None)`` at every operand; constants copied.
    `op` (``op(x, *others)``, needing no path): the operation's one implementation when given, on
    the column path (`_columns`) and on the per-leaf pass alike; the per-leaf pass then only checks
    and names what the columns cannot take (a mismatch, ties, shared sub-trees, a dtype the arrays'
    operators cannot compute: `fn` there), and `fn` is otherwise used only to write into `out`.
    `check(path, x)`: the checks `fn` makes besides the models' (coefficients), run first;
    `check_devices`: their outcome may depend on a parameter's device (a 0-d array coefficient), not only
    on its type and dtype (then `out=`'s column path checks once per type and dtype).
    With `out`: ``fn(path, x, others, o)`` writes into `out`'s arrays, every check first (``_inplace``);
    `late`: the first model whose array an accumulating `fn` reads after writing into `o`;
    `batch(outs, cols, checked)`: writes every in-place row in one adapter call (True) or nothing."""
    every = not _check_trainable_only(trainable_only, fname)
    if out is not None:
        done = run_out(
            fname,
            names,
            models,
            fn,
            check,
            every,
            out,
            late,
            batch,
            check_same=_check_same,
            columns=_columns,
            check_devices=check_devices,
        )
        return cast(T, done)
    cols = _columns(models, names, every, fname, True) if op is not None else None
    if cols is not None and op is not None:
        td, leaves, idx, others, _, _, _ = cols
        out = list(map(op, map(leaves.__getitem__, idx), *others))
        mask = td._trainable_mask() if every else None
        if mask is not None:  # trainable_only=False: a frozen parameter's result stays frozen (SPEC 3)
            for j, i in enumerate(idx):
                if not mask[i]:
                    out[j] = adapter_of(leaves[i]).keep_kind(out[j], leaves[i])
        if len(idx) < len(leaves) or any(issubclass(t, np.generic) for t in set(map(type, out))):
            res = list(map(copy_array, leaves))  # constants: arrays copied, anything else shared
            for i, r in zip(idx, out, strict=True):
                res[i] = _as_array(r)
            out = res
        return cast(T, td.build(out))

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> Any:
        if (trainable or every) and is_inexact_array(x):
            check_dense_leaf(path, x, others, f"fk.{fname}")
            if others:
                _check_same(fname, names, path, x, others)
            if check is not None:
                check(path, x)
            if op is None or x.dtype in adapter_of(x).operator_less:  # (torch float8: the adapter's kernel)
                r = _as_array(fn(path, x, others, None))
            else:
                r = _as_array(op(x, *others))
            # trainable_only=False: a frozen parameter's result stays frozen (a plain tensor in a
            # parameter slot would be trainable, SPEC 3)
            return r if trainable else adapter_of(x).keep_kind(r, x)
        return copy_array(x)

    return cast(T, _run(fname, names, models, visit, BUILD_SAME))


def _reduce_params(
    fname: str,
    names: Sequence[str],
    models: Sequence[Any],
    fn: Callable[[Any, Any, list[Any]], Any] | None,
    trainable_only: bool = True,
    op: Callable[..., Any] | None = None,
) -> tuple[Any, list[Any]]:
    """``(xp, [fn(xp, x, others) per distinct parameter])``; all parameters in one namespace and device.
    `op` (``op(x, *others)``): the operation's one implementation when given (then `fn` is not
    needed), on the column path of `_columns` and on the per-leaf pass, which then only checks and
    names what the columns cannot take."""
    parts: list[Any] = []
    first: list[Any] = []  # [path, x, type, adapter, device, namespace] of the first parameter
    every = not _check_trainable_only(trainable_only, fname)
    cols = _columns(models, names, every, fname, rebuild=False) if op is not None else None
    if cols is not None and op is not None and cols[2]:
        _, leaves, idx, others, _, _, _ = cols
        xs = list(map(leaves.__getitem__, idx))
        if len(set(map(type, xs))) == 1:  # one namespace; then one device, or the per-leaf path names two
            devices = None if adapter_of(xs[0]).one_device else list(map(device_of, xs))
            if devices is None or devices == [devices[0]] * len(devices):
                return namespace(xs[0]), list(map(op, xs, *others))

    def compute(xp: Any, x: Any, others: list[Any]) -> Any:
        if op is not None:
            return op(x, *others)
        assert fn is not None, "either fn or op"
        return fn(xp, x, others)

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> None:
        if not ((trainable or every) and is_inexact_array(x)):
            return
        check_dense_leaf(path, x, others, f"fk.{fname}")
        if others:
            _check_same(fname, names, path, x, others)
        if first and type(x) is first[2] and first[3].device(x) == first[4]:
            # the first parameter's type, namespace and device
            parts.append(compute(first[5], x, others))
            return
        xp = namespace(x)
        if not first:
            ad = adapter_of(x)
            first.extend((path, x, type(x), ad, ad.device(x), xp))
        else:
            p0, x0 = first[0], first[1]
            if namespace(x0) is not xp or not _same_device(x0, x):
                msg = (
                    f"at {p0.display} and {path.display}: fk.{fname} reduces over every parameter, but "
                    f"these are {_ns_name(namespace(x0))} on {describe_device(device_of(x0))} and {_ns_name(xp)} "
                    f"on {describe_device(device_of(x))}. Expected one namespace and device for the 0-d result; fix: "
                    "move the model to one device first."
                )
                raise PolicyError(msg)
        parts.append(compute(xp, x, others))

    _run(fname, names, models, visit, BUILD_NONE)
    if not parts:
        msg = (
            f"fk.{fname}: `{names[0]}` has no parameters (floating or complex arrays reached through "
            "trainable children), so there is no namespace or device for the 0-d result. Expected at "
            "least one parameter; check the model with fk.leaves_with_path."
        )
        raise ValueError(msg)
    return namespace(first[1]), parts
