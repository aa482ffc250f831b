"""``fk.norm``, ``fk.dot`` and ``fk.all_finite`` of DTensor models at the cost of the local sums and
one all-reduce (issue #26's speed row; part of the torch adapter, used by `_dtensor.reduce`).

The common case -- every parameter a ``DTensor`` of one mesh with ``Shard``/``Replicate``
placements (an FSDP2 model, a tensor-parallel one) -- is judged in C-level passes over the lists
(`uniform`: types, then meshes and placements once per distinct ``DTensorSpec``; no Python step per
tensor), and this rank's part of the reduction is computed on the plain local shards in a few
kernels (`local_total`: one ``torch._foreach_norm`` over them, stacked and reduced, for ``ord=2``,
and off the CPU for 1, inf, -inf and 0 too; on a CPU those orders get ``abs()`` with ``sum()`` or
``amax()`` per shard, faster there, and ``ord=inf`` without a gradient one ``aminmax`` per shard;
one ``vdot`` per pair for ``fk.dot``, which has no foreach
kernel), never through
DTensor's operators (tens of µs each: bench_sharded's norm rows). The result is made a 0-d
``Replicate`` DTensor directly from a spec made once per mesh and dtype (`replicated`;
``DTensor.from_local`` costs ~15 µs). Anything else (another DTensor subclass, two meshes, a
``Partial`` placement, a plain tensor among DTensors) returns None from `uniform`, and
`_dtensor.reduce` takes its per-tensor path, which checks each tensor and names the one it
refuses. The private torch names used here (``_foreach_norm``, ``DTensorSpec``, DTensor's
constructor) are looked up once, and each has a fallback (`FOREACH_NORM`, `SPECS`; the tests
run the fallbacks).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat
from typing import Any, cast

import torch

__all__ = [
    "FAST",
    "FOREACH_NORM",
    "FOREACH_ORDS_ON_CPU",
    "local_part",
    "local_total",
    "replicated",
    "uncounted",
    "uniform",
]

#: switches for tests: ``FAST[0] = False`` sends every reduction through the per-tensor path
FAST = [True]
#: ``torch._foreach_norm`` (private: feature-detected); None: one reduction per local shard instead
FOREACH_NORM: list[Any] = [getattr(torch, "_foreach_norm", None)]
#: ``_foreach_norm`` for the orders 1, inf, -inf and 0 on CPU tensors too (for tests: on a CPU its
#: loop over ``linalg.vector_norm`` is slower there than the per-tensor kernels, so it is off)
FOREACH_ORDS_ON_CPU = [False]

_DTYPE = operator.attrgetter("dtype")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
#: dtypes ``_foreach_norm`` reduces on every device (float8 has no promotion to its accumulator)
_NORM_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)
_FOREACH_ORDS = frozenset({2.0, 1.0, 0.0, math.inf, -math.inf})
_VDOT_DTYPES = frozenset({torch.float32, torch.float64, torch.complex64, torch.complex128})
_REAL_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


def uncounted(p: Any) -> Any:
    """A replica's part of a sum that another rank counts: 0, but with `p`'s gradient where autograd
    records `p` (``p - p.detach()``). So every rank's result has a gradient (no rank leaves the
    backward's collectives) and every replica of a replicated parameter gets the whole gradient, as
    its ``Replicate`` placement says (a plain 0 would give the replicas none)."""
    return p - p.detach() if p.requires_grad else torch.zeros_like(p)


def local_part(ad: Any, kind: str, o: float, lx: Any, ly: Any) -> Any:
    """This rank's part of a reduction over one tensor, from its local shard `lx` (and `ly`)."""
    if kind == "all_finite":
        return torch.isfinite(lx).all().to(torch.int32)  # combined by min (an all-reduce of ints)
    if kind == "dot":
        return ad.vdot(lx, ly)
    if o == 2:
        return ad.sum_squares(lx)
    acc = ad.accumulate_dtype(lx.dtype)
    a = lx.abs() if acc is None else lx.abs().to(acc)
    if o == math.inf:
        return a.amax() if a.numel() else a.new_zeros(())  # |x| >= 0: 0 is the identity of max
    if o == -math.inf:
        return a.amin() if a.numel() else a.new_full((), math.inf)
    if o == 0:
        return (a != 0).sum().to(a.dtype)
    if o == 1:
        return a.sum()
    return (a**o).sum()


def uniform(dt: Any, xs: Sequence[Any], ys: Sequence[Any] | None) -> tuple[Any, Any] | None:
    """``(mesh, counted)`` when every one of `xs` (and `ys`, ``fk.dot``'s second model) is exactly a
    ``DTensor`` on meshes equal to the first's with ``Shard``/``Replicate`` placements (`ys`: the same
    placements as `xs`, pair by pair); `counted`: whether this rank's local shards count in a sum
    (``_dtensor._counted``: a replica off coordinate 0 does not), True or False for all, or a list
    of flags. None otherwise (the per-tensor path then checks each and names what it refuses).
    C-level passes over the lists, and Python steps per distinct ``DTensorSpec`` object only (its
    ``_spec``, private: FSDP2 shares one per kind of parameter; without it, None)."""
    if not FAST[0] or not xs or not all(map(operator.is_, map(type, xs), repeat(dt))):
        return None
    specs = _distinct_specs(xs)
    if specs is None:
        return None
    sx, dx = specs
    mesh = sx[0].mesh
    if not all(_fits(s, mesh) for s in dx.values()):
        return None
    if ys is not None:
        if len(ys) != len(xs) or not all(map(operator.is_, map(type, ys), repeat(dt))):
            return None
        specs = _distinct_specs(ys)
        if specs is None:
            return None
        sy, dy = specs
        if not all(_fits(s, mesh) for s in dy.values()):
            return None
        for i, j in dict.fromkeys(zip(map(id, sx), map(id, sy))):  # the distinct pairs of specs
            if i != j and tuple(dx[i].placements) != tuple(dy[j].placements):
                return None
    coord = mesh.get_coordinate()
    if coord is None:  # this rank is not in the mesh: it holds nothing (its shards are empty)
        return mesh, False
    flags = {i: _counts(coord, s.placements) for i, s in dx.items()}
    if len(set(flags.values())) == 1:
        return mesh, next(iter(flags.values()))
    return mesh, list(map(flags.__getitem__, map(id, sx)))


_SPEC = operator.attrgetter("_spec")


def _counts(coord: Any, placements: Any) -> bool:
    """``_dtensor._counted`` of a DTensor of `placements` on the rank at mesh coordinate `coord`."""
    return all(c == 0 for c, p in zip(coord, placements, strict=True) if p.is_replicate())


def _distinct_specs(xs: Sequence[Any]) -> tuple[list[Any], dict[int, Any]] | None:
    """The ``_spec`` of each DTensor of `xs` (one C-level pass) and the distinct ones by identity;
    None where the first has no ``_spec`` with a mesh and placements (a torch that renamed them)."""
    first = getattr(xs[0], "_spec", None)
    if first is None or not (hasattr(first, "mesh") and hasattr(first, "placements")):
        return None
    specs = list(map(_SPEC, xs))
    return specs, dict(zip(map(id, specs), specs))


def _fits(spec: Any, mesh: Any) -> bool:
    """Whether a DTensor of `spec` takes part in a reduction on `mesh` at once: that mesh (an equal
    one), no ``Partial`` placement."""
    return (spec.mesh is mesh or spec.mesh == mesh) and not any(p.is_partial() for p in spec.placements)


def local_total(
    ad: Any,
    kind: str,
    o: float,
    op: str,
    dt: Any,
    xs: Sequence[Any],
    ys: Sequence[Any] | None,
    counted: Any,
    locals_of: Callable[[list[Any]], list[Any]],
) -> Any:
    """This rank's 0-d part of the reduction `kind` ("norm" of order `o`, "dot", "all_finite") over the
    DTensors `xs` (`ys`) that `uniform` accepted, combined over the tensors by `op` ("sum", "max",
    "min"), each tensor counted as `counted` says: computed on the plain local shards (``to_local()``,
    differentiable, where autograd records them; `locals_of`: ``_dtensor._locals``, else their
    ``_local_tensor``), in a few kernels."""
    grad = torch.is_grad_enabled()
    lx = _shards(dt, xs, grad, locals_of)
    ly = None if ys is None else _shards(dt, ys, grad, locals_of)
    if kind == "all_finite":
        return torch.stack(list(map(torch.Tensor.all, map(torch.isfinite, lx)))).all().to(torch.int32)
    if kind == "dot":
        if ly is not None and set(map(_DTYPE, lx)) <= _VDOT_DTYPES:
            dots = list(map(torch.vdot, map(torch.flatten, lx), map(torch.flatten, ly)))
            return _combine(torch.stack(dots), op, counted)
        return _per_tensor(ad, kind, o, op, lx, ly, counted)
    cpu = lx[0].device.type == "cpu" and not FOREACH_ORDS_ON_CPU[0]
    if o == math.inf and cpu and not (grad and any(map(_REQUIRES_GRAD, lx))):
        top = _largest_magnitude(ad, lx)
        if top is not None:
            return top
    if o != 2.0 and (o not in _FOREACH_ORDS or cpu):
        # (on a CPU, _foreach_norm loops over linalg.vector_norm, whose orders 1, inf and 0 are several
        # times slower than abs() with sum() or amax(): the per-tensor kernels; other p: always)
        return _per_tensor(ad, kind, o, op, lx, None, counted)
    if o in (math.inf, -math.inf):
        full = list(filter(torch.Tensor.numel, lx))  # an empty shard (uneven sharding) holds no extreme
        norms = _norms(ad, full, o) if full else None
        return _per_tensor(ad, kind, o, op, lx, None, counted) if norms is None else _combine(norms, op, True)
    if o == 0.0:  # a count: no gradient (as ``(x != 0).sum()``)
        with torch.no_grad():
            norms = _norms(ad, lx, o)
    else:
        norms = _norms(ad, lx, o)
    if norms is None:
        return _per_tensor(ad, kind, o, op, lx, None, counted)
    if o != 2.0:
        return _combine(norms, op, counted)
    if counted is True:
        return norms.dot(norms)  # the sum of squares: one kernel
    return _combine(norms * norms, op, counted)


def _largest_magnitude(ad: Any, lx: list[Any]) -> Any:
    """``max |x|`` over the real local shards `lx` (on a CPU, no gradient) from one ``aminmax`` pass over
    each, with no ``abs()`` temporary (allocating one per shard costs more than the reduction there):
    ``max(max x, -min x)``; None for other dtypes or when every shard is empty."""
    full = list(filter(torch.Tensor.numel, lx))  # an empty shard holds no extreme
    if not full or not set(map(_DTYPE, full)) <= _REAL_DTYPES:
        return None
    lows, highs = zip(*map(torch.aminmax, full), strict=True)
    top = torch.maximum(torch.stack(highs).amax(), torch.stack(lows).amin().neg())
    acc = ad.accumulate_dtype(top.dtype)
    return top if acc is None else top.to(acc)


def _shards(dt: Any, xs: Sequence[Any], grad: bool, locals_of: Callable[[list[Any]], list[Any]]) -> list[Any]:
    """The local shards of the DTensors `xs`: ``to_local()`` (differentiable) where autograd records
    one of them, else their ``_local_tensor`` in one C-level pass (`_dtensor._locals`)."""
    if grad and any(map(_REQUIRES_GRAD, xs)):
        return list(map(dt.to_local, xs))
    return locals_of(cast(list[Any], xs))


def _norms(ad: Any, lx: list[Any], o: float) -> Any:
    """The 1-D tensor of the vector norms of order `o` of the local shards `lx` (of one dtype), from ONE
    ``torch._foreach_norm`` (narrow dtypes accumulated in float32) and one stack; None without it, or
    for several dtypes or a dtype it does not reduce (the per-tensor path then runs)."""
    fe = FOREACH_NORM[0]
    if fe is None:
        return None
    dtypes = set(map(_DTYPE, lx))
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    if dtype not in _NORM_DTYPES:
        return None
    acc = ad.accumulate_dtype(dtype)
    return torch.stack(fe(lx, o) if acc is None else fe(lx, o, dtype=acc))


def _per_tensor(ad: Any, kind: str, o: float, op: str, lx: list[Any], ly: list[Any] | None, counted: Any) -> Any:
    """`local_total` without a foreach kernel: `local_part` of each local shard."""
    parts = list(map(partial(local_part, ad, kind, o), lx, repeat(None) if ly is None else ly))
    return _combine(torch.stack(parts), op, counted)


def _combine(parts: Any, op: str, counted: Any) -> Any:
    """The 1-D `parts` (one per tensor) reduced by `op`; for a sum, the parts that this rank does not
    count (`counted` False, or False in its list) enter as `uncounted` (0, with the gradient)."""
    if op == "max":
        return parts.amax()
    if op == "min":
        return parts.amin()
    if counted is True:
        return parts.sum()
    if counted is False:
        return uncounted(parts.sum())
    mask = torch.tensor(counted, device=parts.device)
    return parts[mask].sum() + uncounted(parts[~mask].sum())


#: (id(mesh), dtype) -> (mesh, spec of a 0-d Replicate DTensor of that dtype: the entry keeps the mesh
#: alive, so its id stays its own), or None where
#: DTensor's private spec and constructor are not as expected (then ``DTensor.from_local``)
SPECS: dict[tuple[int, Any], tuple[Any, Any] | None] = {}
_UNSEEN: Any = object()


def replicated(dt: Any, value: Any, mesh: Any) -> Any:
    """The plain 0-d `value` (the same on every rank) as a 0-d ``Replicate`` DTensor on `mesh`, no
    communication: ``DTensor.from_local`` where autograd records `value` (its backward), else DTensor's
    constructor with a spec made once per mesh and dtype (the same spec ``from_local`` makes)."""
    if not value.requires_grad and type(value) is torch.Tensor and FAST[0]:
        key = (id(mesh), value.dtype)
        hit = SPECS.get(key, _UNSEEN)
        if hit is _UNSEEN:  # (an entry holds its mesh: no other mesh can have that id meanwhile)
            hit = _spec(dt, value, mesh)
            if len(SPECS) < 64:
                SPECS[key] = hit
        if hit is not None:
            return dt(value, hit[1], requires_grad=False)
    from torch.distributed.tensor import Replicate

    return dt.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)


def _spec(dt: Any, value: Any, mesh: Any) -> tuple[Any, Any] | None:
    """``(mesh, spec)`` for `replicated`, checked once against ``from_local``'s own result; None where
    that cannot be done (this rank outside the mesh: ``from_local`` gives it an empty local tensor; a
    torch whose private names differ)."""
    if mesh.get_coordinate() is None:
        return None
    try:
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    except ImportError:
        return None
    ref = dt.from_local(value, mesh, [Replicate()] * mesh.ndim, run_check=False)
    spec = DTensorSpec(mesh, tuple(ref.placements), tensor_meta=TensorMeta(torch.Size(()), (), value.dtype))
    if getattr(ref, "_spec", None) != spec:
        return None
    try:
        made = dt(value, spec, requires_grad=False)
    except TypeError:  # (a torch whose DTensor constructor takes other arguments)
        return None
    if type(made) is not dt or getattr(made, "_spec", None) is not spec:
        return None
    return mesh, spec
