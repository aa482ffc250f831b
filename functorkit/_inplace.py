"""``out=`` for the arithmetic (SPEC 14): the result's parameters written into `out`'s arrays.

One lock-step walk over the models and `out` collects a plan (one row per parameter position:
path, the models' arrays, the out array) and makes every check on the way: structure, shapes,
dtypes, namespaces, devices, coefficients, writability (immutable backends, read-only NumPy,
inference tensors), self-overlapping out arrays, one out array at two positions that get
different results. Then one sweep over the byte extents of every out and input array refuses any
memory overlap between `out` and an input except an out array that *is* the input array at its
own position (an in-place update). Only then is anything written, row by row, by the adapter's
kernels (with ``out=``). Constants of `out` are never read or written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._alias import _clusters, layouts_overlap, memory_layout, separate_allocations
from ._errors import StructureError
from ._keypath import KeyPath
from ._walk import BUILD_NONE, walk
from ._xp import describe_array as _describe
from ._xp import is_array, is_inexact_array
from .adapters import adapter_of

_FIX = {
    "add": "a = fk.add(a, b)",
    "sub": "a = fk.sub(a, b)",
    "scale": "a = fk.scale(c, a)",
    "lincomb": "dst = fk.lincomb(cs, models)",
    "mean": "dst = fk.mean(models)",
    "lerp": "ema = fk.lerp(ema, model, t)",
}


#: the lock-step engine's ``_check_same(fname, names, path, x, others)``: each other operand's array
#: matches the first model's. ``_lockstep`` calls `run_out` and passes it (it cannot be imported
#: here: that module is above this one, docs/adapters.md, "Import layering")
CheckSame = Callable[[str, Sequence[str], KeyPath, Any, Sequence[Any]], None]


def _check_out(fname: str, first: str, path: KeyPath, x: Any, o: Any, check_same: CheckSame) -> None:
    if not is_array(o):
        msg = (
            f"at {path.display}: fk.{fname}(out=...): `{first}` has a parameter here ({_describe(x)}) but "
            f"`out` has a {type(o).__name__}. Expected `out` of the first model's structure with a writable "
            "array of the result's shape, dtype and device at every parameter; fix: pass out=fk.copy(model)."
        )
        raise StructureError(msg)
    check_same(fname, (first, "out"), path, x, [o])
    ad = adapter_of(o)
    why = ad.write_problem(o)
    if why is not None:
        msg = (
            f"at {path.display}: fk.{fname}(out=...) writes the result into `out`'s arrays in place, but "
            f"{why}. Expected mutable arrays in `out`; fix: use the functional form, `{_FIX[fname]}`."
        )
        raise TypeError(msg)
    why = ad.overlap_problem(o)
    if why is not None:
        msg = f"at {path.display}: in this `out` array {why}. fk.{fname}(out=...) cannot write distinct values into it."
        raise StructureError(msg)


def _identical(a: Any, b: Any) -> bool:
    """`a` and `b` are views of the same elements in the same order (``p`` and ``p.data``)."""
    if a is b:
        return True
    ad = adapter_of(a)
    return (
        a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and ad.memory_extent(a) == adapter_of(b).memory_extent(b)
        and ad.byte_strides(a) == adapter_of(b).byte_strides(b)
    )


def _check_overlaps(fname: str, names: Sequence[str], plan: list[list[Any]], late: int | None) -> None:
    """Refuse any memory overlap between an out array and an input array or another out array,
    except an out array identical to the input at its own row; mark rows whose out array is an input
    the accumulating kernel reads after its first write (`late`): those are computed aside."""
    out_arrays: dict[int, Any] = {}
    ins: dict[int, Any] = {}
    for row in plan:
        o = row[2]
        out_arrays[id(o)] = o
        for k, a in enumerate(row[1]):
            if a is o:
                if late is not None and k >= late:
                    row[4] = True
            else:
                ins[id(a)] = a
    if not any(i in ins for i in out_arrays) and separate_allocations([*out_arrays.values(), *ins.values()]):
        return  # distinct NumPy arrays that own their memory cannot overlap (bench_arith small rows)
    spans: list[tuple[Any, ...]] = []
    seen: set[tuple[int, int]] = set()
    for r, row in enumerate(plan):
        path, xs, o = row[0], row[1], row[2]
        for k, a in enumerate((o, *xs)):
            if k and a is o:  # the input itself, at its own place: an in-place update
                if late is not None and k - 1 >= late:
                    row[4] = True
                continue
            key = (id(a), r if k else -1)
            if key in seen:
                continue
            seen.add(key)
            ext = adapter_of(a).memory_extent(a)
            if ext is not None:
                spans.append((*ext, r, k - 1, path, a))  # k - 1: -1 for the out array, else the model
    for cluster in _clusters(spans):
        outs = [sp for sp in cluster if sp[4] == -1]
        for so in outs:
            ro, po, o = so[3], so[5], so[6]
            lo = memory_layout(o)
            for sp in cluster:
                if sp is so or (sp[6] is o and sp[4] == -1):
                    continue
                r, k, p, a = sp[3], sp[4], sp[5], sp[6]
                if k >= 0 and r == ro and _identical(a, o):
                    if late is not None and k >= late:
                        plan[r][4] = True
                    continue
                la = memory_layout(a)
                if lo is None or la is None or not layouts_overlap(lo, la):
                    continue
                what = "`out`" if k < 0 else f"`{names[k]}`"
                msg = (
                    f"at {po.display} (`out`) and {p.display} ({what}): fk.{fname}(out=...) would write into "
                    f"memory that {what} also holds there ({_describe(o)} and {_describe(a)}), so values would "
                    "be overwritten before they are read. Expected `out` to be one of the inputs itself or to "
                    "share no memory with them; fix: pass out=fk.copy(...) of the first model, or the input itself."
                )
                raise StructureError(msg)


def run_out(
    fname: str,
    names: Sequence[str],
    models: Sequence[Any],
    fn: Callable[[KeyPath, Any, list[Any], Any], Any],
    check: Callable[[KeyPath, Any], None] | None,
    every: bool,
    out: Any,
    late: int | None,
    batch: Callable[[list[list[Any]]], list[list[Any]]] | None = None,
    *,
    check_same: CheckSame,
) -> Any:
    """Write ``fn(path, x, others, o)`` into each parameter `o` of `out`, all checks first; return `out`.
    `late`: the first model index an accumulating kernel reads after writing into `o`.
    `batch(plan)`: writes the rows it can in one adapter call, returns the others.
    `check_same`: the lock-step engine's operand check (`CheckSame`)."""
    plan: list[list[Any]] = []  # [path, models' arrays, out array, first row of this out array, aside]
    by_out: dict[int, KeyPath] = {}
    first = names[0]

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> None:
        if not ((trainable or every) and is_inexact_array(x)):
            return
        ins, o = others[:-1], others[-1]
        if ins:
            check_same(fname, names, path, x, ins)
        _check_out(fname, first, path, x, o, check_same)
        if check is not None:
            check(path, x)
        p0 = by_out.get(id(o))
        if p0 is not None:
            msg = (
                f"at {p0.display} and {path.display}: `out` has one array at both places (a tie) but "
                f"`{first}` has different arrays there, so two results would go into one array. Expected "
                f"`out` tied only where `{first}` is; fix: pass out=fk.copy({first}) (copies keep ties)."
            )
            raise StructureError(msg)
        by_out[id(o)] = path
        plan.append([path, (x, *ins), o, None, False])

    walk((*models, out), visit, build=BUILD_NONE, with_path=True, track=True, names=(*names, "out"))
    _check_overlaps(fname, names, plan, late)
    if batch is not None:
        plan = batch(plan)
    for path, xs, o, _, aside in plan:
        if aside:  # `o` is a term read after the first write: computed aside, then copied
            r = fn(path, xs[0], list(xs[1:]), None)
            adapter_of(o).write(o, r)
        else:
            fn(path, xs[0], list(xs[1:]), o)
    return out
