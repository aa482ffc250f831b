"""``out=`` for the arithmetic (SPEC 14): the result's parameters written into `out`'s arrays.

One lock-step walk over the models and `out` collects a plan (one row per parameter position:
path, the models' arrays, the out array) and makes every check on the way: structure, shapes,
dtypes, namespaces, devices, coefficients, writability (immutable backends, read-only NumPy,
inference tensors), self-overlapping out arrays, one out array at two positions that get
different results. Then one sweep over the byte extents of every out and input array refuses any
memory overlap between `out` and an input except an out array that *is* the input array at its
own position (an in-place update). Only then is anything written, row by row, by the adapter's
kernels (with ``out=``). Constants of `out` are never read or written.

The common case takes a column path first (`_fast_plan`): the models (and `out`, unless it is one
of them, which is not walked twice) are recorded and matched by the engine's `_columns`, which
makes the structure, shape, dtype, namespace, device, unknown-holder and dense checks in C-level
passes; the adapter's ``out_fast`` makes the writability, self-overlap and overlap
checks over whole lists; identity tests over the columns find ties and in-place rows; a
coefficient that needs checking (a 0-d array, a complex number) is checked once per (type, dtype,
device), a real Python number (weak for every parameter) not at all. Every row is then written by
one adapter call where the operation has one (`batch`: torch ``_foreach_*``, NumPy's ``_rows``).
Anything it cannot decide in those passes (a tie, a view, a non-contiguous or read-only array, a
term `out` that is read after the first write) sends
the call down the per-leaf path above, which makes every check again and names what fails: the
column path raises nothing of its own but the coefficient checks (the same ones, at the first
parameter of each kind). Paths are built only for a message.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import chain, compress
from typing import Any, cast

from ._alias import _clusters, layouts_overlap, memory_layout, separate_allocations
from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._record import all_distinct
from ._walk import BUILD_NONE, _PathAt, walk
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


#: the column path of `run_out` is on (tests turn it off to compare both paths)
FAST = [True]
_DTYPE = operator.attrgetter("dtype")
#: a row's path, built only when a message shows it (``_PathAt`` stands in for a KeyPath)
_path_at: Callable[[Any, int], KeyPath] = cast(Any, _PathAt)
_DEVICE = operator.attrgetter("device")


def _fast_plan(
    fname: str,
    names: Sequence[str],
    models: Sequence[Any],
    out: Any,
    every: bool,
    check: Callable[[KeyPath, Any], None] | None,
    late: int | None,
    columns: Callable[..., Any],
    check_devices: bool = True,
) -> tuple[list[list[Any]], list[Any], Any, list[int], list[list[Any]], list[Any]] | None:
    """``(columns, outs, treedef, indices, kernel columns, kernel outs)``: the models' arrays at
    each parameter (one list per model), `out`'s arrays there, the first model's definition and the
    leaf index of each row, and the arrays an adapter kernel writes and reads for them (the same
    lists, or their stand-ins from `columns`: DTensors' local shards, with the same identities
    between the lists), with every check of the per-leaf path made (see the module's docstring); None where the per-leaf
    path must run (it makes every check again and names the one that fails). Operands of a dtype
    their adapter's operators cannot take (``operator_less``: torch float8) go the per-leaf path."""
    if not FAST[0]:
        return None
    # `out` among the models: the first one (an in-place update, the common case) asked directly
    k = 0 if models[0] is out else next((i for i, m in enumerate(models) if m is out), None)
    trees = tuple(models) if k is not None else (*models, out)
    cols_ = columns(trees, names if k is not None else (*names, "out"), every, fname, True, rebuild=False)
    if cols_ is None:
        return None
    td, leaves, idx, others, dts, ad, stands = cols_
    xs = leaves if len(idx) == len(leaves) else list(map(leaves.__getitem__, idx))
    cols = [xs, *others[: len(models) - 1]]
    lcols = cols if stands is None else stands[: len(models)]  # (the kernels' arrays)
    apart = False
    if k is None:
        outs = others[-1]
        louts = outs if stands is None else stands[-1]
        oids = set(map(id, outs))
        if len(oids) != len(outs):  # `out` tied where the first model is not
            return None
        if not oids.isdisjoint(map(id, chain(*cols))):  # `out` holds an input array (one pass over them all)
            return None
    else:
        apart = True  # no out array among the other models' arrays
        outs, louts = cols[k], lcols[k]
        if (late is not None and k >= late) or (k and not all_distinct(outs)):
            return None  # a term read after the first write (computed aside), or a tie: per leaf
        oids = set(map(id, outs))
        for j, c in enumerate(cols):
            if j == k or oids.isdisjoint(map(id, c)):  # (the common case: no out array among these)
                continue
            apart = False
            same = sum(map(operator.is_, c, outs))  # the out array at its own row: in place
            if same and late is not None and j >= late:
                return None
            if sum(map(oids.__contains__, map(id, c))) != same:  # an out array at another row
                return None
    if not xs:
        return cols, outs, td, idx, lcols, louts
    if ad is None:  # operands of several array types (`columns` found them in its type pass)
        return None
    arrays = list(chain(*cols)) if k is not None else list(chain(outs, *cols))
    local = None
    if stands is not None:
        local = (louts, list(chain(*lcols)) if k is not None else list(chain(louts, *lcols)))
    if not (apart and len(cols) == 2) and not ad.out_fast_repeats:  # an array met twice (in two
        # models, or `out`) is one range (two models apart: only the other model's own ties repeat
        # an array, and `out_fast` then sees two equal ranges and declines: the per-leaf path)
        if local is None:
            arrays = list(dict(zip(map(id, arrays), arrays)).values())
        else:  # the stand-ins go with their arrays (told apart by the arrays': two arrays over one
            # stand-in stay two, whose equal ranges `out_fast` declines)
            pairs = list(dict(zip(map(id, arrays), zip(arrays, local[1]))).values())
            arrays, local = [a for a, _ in pairs], (louts, [v for _, v in pairs])
    if not ad.out_fast(outs, arrays, True, local):  # (eager: `columns` asked ``tracing()``, else it gave None)
        return None
    if check is not None:  # once per kind of parameter, at its first row (where the per-leaf path raises;
        # arrays that passed ``out_fast`` have a ``device``)
        kinds: Any = dts if ad.one_device or not check_devices else zip(dts, map(_DEVICE, xs))
        first = dict(zip(reversed(list(kinds)), range(len(xs) - 1, -1, -1)))
        for i in sorted(first.values()):
            check(_path_at(td, idx[i]), xs[i])
    return cols, outs, td, idx, lcols, louts


def run_out(
    fname: str,
    names: Sequence[str],
    models: Sequence[Any],
    fn: Callable[[KeyPath, Any, list[Any], Any], Any],
    check: Callable[[KeyPath, Any], None] | None,
    every: bool,
    out: Any,
    late: int | None,
    batch: Callable[[list[Any], list[list[Any]], bool], bool] | None = None,
    *,
    check_same: CheckSame,
    columns: Callable[..., Any],
    check_devices: bool = True,
) -> Any:
    """Write ``fn(path, x, others, o)`` into each parameter `o` of `out`, all checks first; return `out`.
    `late`: the first model index an accumulating kernel reads after writing into `o`.
    `batch(outs, cols, checked)`: writes every row in one adapter call and returns True, or writes
    nothing and returns False; `checked`: the column path made every check (the adapter's
    `out_fast` accepted the arrays; `outs` may then be any model's arrays or separate ones, and
    both are the arrays `out_fast` judged: the adapter's stand-ins where it has them, DTensors'
    local shards), else the per-leaf path hands in its in-place rows (``outs[i] is cols[0][i]``) only.
    `check_same`, `columns`: the lock-step engine's operand check (`CheckSame`) and its
    `_columns` (handed down: the lock-step engine imports this module). `check_devices`: `check`
    may depend on a parameter's device, not only on its type and dtype."""
    fast = _fast_plan(fname, names, models, out, every, check, late, columns, check_devices)
    if fast is not None:
        cols, outs, td, idx, lcols, louts = fast
        if batch is not None and outs and batch(louts, lcols, True):  # (on the stand-ins `out_fast` judged)
            return out  # every row written in one adapter call (bench_arith's EMA and small-model rows)
        for i, o, *xs in zip(idx, outs, *cols):
            fn(_path_at(td, i), xs[0], xs[1:], o)
        return out
    plan = []  # [path, models' arrays, out array, first row of this out array, aside]
    by_out: dict[int, tuple[KeyPath, tuple[Any, ...]]] = {}  # out array -> its first row's path and inputs
    first = names[0]

    def visit(path: KeyPath, x: Any, others: list[Any], trainable: bool) -> None:
        if not ((trainable or every) and is_inexact_array(x)):
            return
        ins, o = others[:-1], others[-1]
        if ins:
            check_same(fname, names, path, x, ins)
        _check_out(fname, first, path, x, o, check_same)
        hook = getattr(adapter_of(x), "sharded_out_problem", None)  # sharded arrays (a Partial DTensor)
        why = None if hook is None else hook(fname, x, ins, o, _FIX[fname])
        if why is not None:
            msg = f"at {path.display}: fk.{fname}(out=...): {why}."
            raise PolicyError(msg)
        if check is not None:
            check(path, x)
        seen = by_out.get(id(o))
        if seen is not None:
            p0, xs0 = seen
            k = 0 if xs0[0] is not x else next(j for j, y in enumerate(ins, 1) if xs0[j] is not y)
            if k == 0:
                msg = (
                    f"at {p0.display} and {path.display}: `out` has one array at both places (a tie) but "
                    f"`{first}` has different arrays there, so two results would go into one array. Expected "
                    f"`out` tied only where `{first}` is; fix: pass out=fk.copy({first}) (copies keep ties)."
                )
            else:  # `first` is tied there too: another model is not
                msg = (
                    f"at {p0.display} and {path.display}: `out` and `{first}` have one array at both places "
                    f"(a tie) but `{names[k]}` has different arrays there, so the tied array would get two "
                    f"results. Expected every model tied where `out` is; fix: the functional form, "
                    f"`{_FIX[fname]}` (each place gets its own array), or tie `{names[k]}` there too."
                )
            raise StructureError(msg)
        by_out[id(o)] = (path, (x, *ins))
        plan.append([path, (x, *ins), o, None, False])

    walk((*models, out), visit, build=BUILD_NONE, with_path=True, track=True, names=(*names, "out"))
    _check_overlaps(fname, names, plan, late)
    if batch is not None:
        inplace = [r[2] is r[1][0] and not r[4] for r in plan]  # (an in-place row is never aside)
        rows = list(compress(plan, inplace))
        if len(rows) > 1 and batch([r[2] for r in rows], [list(c) for c in zip(*(r[1] for r in rows))], False):
            plan = [r for r, done in zip(plan, inplace) if not done]
    for path, xs, o, _, aside in plan:
        if aside:  # `o` is a term read after the first write: computed aside, then copied
            r = fn(path, xs[0], list(xs[1:]), None)
            adapter_of(o).write(o, r)
        else:
            fn(path, xs[0], list(xs[1:]), o)
    return out
