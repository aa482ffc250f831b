"""torch ``DTensor`` (``torch.distributed.tensor``: FSDP2's ``fully_shard``, ``distribute_tensor``):
part of the torch adapter, imported with it (``torch.distributed.tensor`` itself is never imported
here: a process that has not imported it holds no DTensor).

What functorkit does with DTensors (docs/sharded.md):

* elementwise work (``fk.fmap``, the arithmetic with and without ``out=``, ``fk.copy``,
  ``fk.stack``) runs through DTensor's own operators, which act on the local shards with no
  communication and keep the placements;
* `reduce` (``fk.norm``, ``fk.dot``, ``fk.all_finite``): each rank reduces its local shards to one scalar (a shard
  replicated over a mesh dimension is counted on that dimension's coordinate 0 only, so that no
  value counts twice), and the scalars are combined by ONE all-reduce whatever the mesh
  (`all_reduce`: an N-D mesh spanning the world reduces over a 1-D mesh of its ranks): the result
  is a 0-d ``Replicate`` DTensor holding the global value on every rank;
* `stage` (``fk.load_into``): a DTensor of the destination's mesh and placements is copied shard
  to shard; a plain (full) tensor is cut into this rank's shard locally
  (``distribute_tensor(..., src_data_rank=None)``: no communication), so a checkpoint loaded whole
  on every rank fills a sharded model;
* `lerp_many_` (the in-place EMA ``fk.lerp(ema, model, t, out=ema)``): one
  ``torch._foreach_lerp_`` over the local shards;
* checkpoints: ``fk.save`` writes each rank's local block (`save_piece`: its global offset from
  the placements, a replica by mesh coordinate 0 only; ``functorkit._sharded_ckpt``), and
  ``fk.load(like=)`` gives DTensors of `like`'s placements, each rank reading its own block
  (`from_stored`);
* refused by path, with the alternative: a flat vector (`sharded_problem`: ``fk.destructure``,
  ``re.flatten``) and reading a DTensor whole on the host (`host_problem`).
"""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import torch

from . import _dtensor_columns as by_spec
from . import _dtensor_reduce as at_once
from ._dtensor_reduce import local_part, uncounted
from ._sharding import ShardRefusal

__all__ = [
    "WorldComm",
    "all_reduce",
    "any_rank",
    "dtensor_type",
    "from_stored",
    "has_dtensor",
    "host_problem",
    "lerp_many_",
    "local_pair",
    "mixed_problem",
    "sharded_out_problem",
    "reduce",
    "save_piece",
    "settle",
    "sharded_problem",
    "stage",
    "whole_tensor_problem",
]


def dtensor_type() -> Any:
    """``torch.distributed.tensor.DTensor`` if that module is imported (else no DTensor exists)."""
    mod = sys.modules.get("torch.distributed.tensor")
    found = getattr(mod, "DTensor", None)
    return found if isinstance(found, type) else None


def has_dtensor(xs: Sequence[Any]) -> bool:
    """Whether any of `xs` is a DTensor (one C-level pass)."""
    dt = dtensor_type()
    return dt is not None and any(map(isinstance, xs, repeat(dt)))


def _describe(x: Any) -> str:
    return f"a DTensor of shape {tuple(x.shape)} with placements {tuple(x.placements)} over {x.device_mesh}"


def sharded_problem(x: Any) -> str | None:
    """Why the DTensor `x` cannot go into a flat vector, with the alternatives; None for others."""
    dt = dtensor_type()
    if dt is None or not isinstance(x, dt):
        return None
    return (
        f"it is {_describe(x)}: a flat vector in this process would hold this rank's shard only, and "
        "`re` could not give back the placements. Expected plain tensors; fix: work on the sharded model "
        "directly (fk.fmap, the arithmetic, fk.norm and fk.dot act on the local shards), or flatten the "
        "local shards yourself: fk.destructure(fk.fmap(lambda x: x.to_local(), model)), rebuilding each "
        "with DTensor.from_local(v, x.device_mesh, x.placements, shape=x.shape, stride=x.stride())"
    )


def mixed_problem(x: Any, y: Any, xname: str, yname: str) -> str | None:
    """Why a DTensor and a plain tensor at one position of two models (`x` in `xname`, `y` in
    `yname`) are not combined: what each is, and the fixes; None unless exactly one is a DTensor."""
    dt = dtensor_type()
    if dt is None or isinstance(x, dt) == isinstance(y, dt):
        return None
    d, dn, p, pn = (x, xname, y, yname) if isinstance(x, dt) else (y, yname, x, xname)
    return (
        f"`{dn}` holds {_describe(d)} here but `{pn}` a plain {type(p).__name__}: each rank holds only its "
        "shard of the one, and whether the other is the whole tensor or one rank's part is unknown (DTensor's "
        "operators do not mix them). Expected DTensors of one mesh and placements at this place in every model "
        "(or plain tensors in all); fix: shard the plain model first, "
        f"{pn} = fk.load_into(fk.copy({dn}), {pn}) (each rank cuts its own shard "
        "of a whole tensor, no communication), or gather the sharded one, fk.fmap(lambda t: t.full_tensor(), "
        "model) (a collective)"
    )


def host_problem(x: Any) -> str | None:
    """Why the DTensor `x` cannot be read whole on the host, with the alternatives; None for
    others (``fk.save`` does not come here: it writes the local shards, `save_piece`)."""
    dt = dtensor_type()
    if dt is None or not isinstance(x, dt):
        return None
    return (
        f"it is {_describe(x)}, and its values would be read whole on the host here. Expected plain "
        "tensors; fix: save the sharded model with fk.save(path, model) on every rank (each writes its "
        "own shards), or gather a small model first: fk.fmap(lambda x: x.full_tensor(), model)"
    )


# ---------------------------------------------------------------- checkpoints (fk.save, fk.load)


class WorldComm:
    """The default process group, for `fk.save`'s small exchanges (``torch.distributed``'s object
    collectives: file names, keys and offsets, never tensor data)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out


def _block_problem(x: Any) -> str | None:
    """Why the local shard of `x` is not one block of the tensor (a Partial sum, a strided shard)."""
    from torch.distributed.tensor import Replicate, Shard

    bad = [p for p in x.placements if type(p) not in (Shard, Replicate)]
    if not bad:
        return None
    return (
        f"it is {_describe(x)}: the placement {bad[0]!r} does not hold one block of the tensor per rank. "
        "Expected Shard(d) and Replicate placements; fix: x.redistribute(x.device_mesh, [Shard(0)]) first "
        "(a collective you ask for)"
    )


def save_piece(x: Any, key: str) -> Any:
    """``fk.save`` of the DTensor `x` on this rank: ``(global shape, offset, local tensor, comm)``, the
    offset None when the local tensor is the whole tensor, the local tensor None when this rank writes
    none of it (a replica on a mesh coordinate other than 0, an empty shard); None for other tensors."""
    dt = dtensor_type()
    if dt is None or not isinstance(x, dt):
        return None
    why = _block_problem(x)
    if why is not None:
        msg = f"fk.save: the array at {key!r}: {why}."
        raise TypeError(msg)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, comm = tuple(x.shape), WorldComm()
    if not _counted(x):  # a replica another rank writes (the reductions' rule), or not in the mesh
        return shape, None, None, comm
    coord = x.device_mesh.get_coordinate()
    local = _local(x).detach()
    if math.prod(shape) == 0:  # nothing to split: the first rank writes it whole
        return shape, None, (local.new_empty(shape) if all(c == 0 for c in coord) else None), comm
    lshape, offset = compute_local_shape_and_global_offset(shape, x.device_mesh, x.placements)
    if tuple(local.shape) != tuple(lshape):
        msg = f"fk.save: the array at {key!r}: its local shard has shape {tuple(local.shape)}, expected {lshape}."
        raise RuntimeError(msg)
    if math.prod(lshape) == 0:
        return shape, None, None, comm
    if tuple(lshape) == shape:
        return shape, None, local, comm
    return shape, tuple(int(o) for o in offset), local, comm


def from_stored(src: Any, like: Any, tensor_of: Callable[[Any, str, Any], Any]) -> Any:
    """The stored tensor `src` as a DTensor of `like`'s mesh and placements, this rank reading only
    its own block (`src.region` of a sharded checkpoint: the pieces it overlaps; a whole stored
    tensor: read, then cut); None when `like` is not a DTensor. ``tensor_of(raw, name, None)`` makes
    a plain tensor of stored bytes."""
    dt = dtensor_type()
    if dt is None or not isinstance(like, dt):
        return None
    why = _block_problem(like)
    if why is not None:
        msg = f"the array of `like` at {src.info.key!r}: {why}."
        raise TypeError(msg)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape = tuple(like.shape)
    lshape, offset = compute_local_shape_and_global_offset(shape, like.device_mesh, like.placements)
    region = getattr(src, "region", None)
    if region is not None:
        raw = region(tuple(offset), tuple(lshape))
    else:
        cut = tuple(slice(o, o + n) for o, n in zip(offset, lshape, strict=True))
        raw = src.raw()[(*cut, Ellipsis)].copy()  # (`...`: a 0-d tensor's cut is an array, not a NumPy scalar)
    t = tensor_of(raw, src.name, None)
    dev = _local(like).device
    if t.device != dev:
        t = t.to(dev)
    out = dt.from_local(t, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride())
    if isinstance(like, torch.nn.Parameter):
        out = torch.nn.Parameter(out, requires_grad=like.requires_grad)
    return out


# ---------------------------------------------------------------- reductions (fk.norm, fk.dot)


def _counted(x: Any) -> bool:
    """Whether this rank's local shard of `x` counts in a sum: on every mesh dimension where `x` is
    replicated, only coordinate 0 counts (the others hold the same values)."""
    coord = x.device_mesh.get_coordinate()
    if coord is None:  # this rank is not in the mesh: it holds nothing
        return False
    return all(c == 0 for c, p in zip(coord, x.placements, strict=True) if p.is_replicate())


def _check(k: int, x: Any, dt: Any, mesh: Any, y: Any) -> None:
    if not isinstance(x, dt):
        msg = (
            f"this is a plain {type(x).__name__} among DTensors, so whether every rank holds it whole or a "
            "part of it is unknown. Expected every array of the reduction to be a DTensor; fix: reduce the "
            "parameters only (trainable_only=True: FSDP2 shards parameters, not buffers), or make it one "
            "with distribute_tensor(x, mesh, [Replicate()])"
        )
        raise ShardRefusal(k, msg)
    if x.device_mesh != mesh:
        msg = (
            f"this is {_describe(x)}, but the first parameter is on {mesh}. Expected one device mesh for "
            "one reduction across ranks; fix: reduce each mesh's parameters separately "
            "(fk.partition) and combine the results"
        )
        raise ShardRefusal(k, msg)
    if any(p.is_partial() for p in x.placements):
        msg = (
            f"this is {_describe(x)}: a Partial placement holds an unreduced sum, not values. Expected "
            "Shard or Replicate placements; fix: x.redistribute(x.device_mesh, [Replicate()]) first"
        )
        raise ShardRefusal(k, msg)
    if y is not None and (not isinstance(y, dt) or y.device_mesh != mesh or tuple(y.placements) != tuple(x.placements)):
        found = _describe(y) if isinstance(y, dt) else f"a plain {type(y).__name__}"
        msg = (
            f"`a` holds {_describe(x)} here but `b` {found}: their local shards hold different "
            "elements. Expected the same mesh and placements in both models; fix: "
            "b.redistribute(a.device_mesh, a.placements) for this array"
        )
        raise ShardRefusal(k, msg)


def _reduced_local(x: Any) -> Any:
    """The local shard of DTensor `x` for a reduction: ``to_local()`` (differentiable) where autograd
    records `x`, else `_local` (a gradient's norm, ``no_grad``: no autograd Function call)."""
    return x.to_local() if x.requires_grad and torch.is_grad_enabled() else _local(x)


def _local_part(ad: Any, kind: str, x: Any, y: Any, o: float) -> Any:
    return local_part(ad, kind, o, _reduced_local(x), None if y is None else _reduced_local(y))


def reduce(
    ad: Any, kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, then: Callable[[Any], Any] | None = None
) -> Any:
    """The global total of a reduction over the DTensors `xs` (`ys`: ``fk.dot``'s second model;
    `kind` "dot", "norm" or "all_finite", the last a 0-d bool), `then` applied to it (a function of
    a plain 0-d tensor: the root of a norm), as a 0-d ``Replicate`` DTensor: local shards reduced on
    each rank, then one all-reduce (`all_reduce`); `then` and the all-finite test run on the plain
    replicated value (one DTensor operation each costs tens of µs: bench_sharded's norm row).
    The common case (every one a DTensor of one mesh, no ``Partial``) is judged and reduced at once,
    with no Python step per tensor (`_dtensor_reduce`: its checks in C-level passes, the local sums
    in one ``torch._foreach_norm``); anything else tensor by tensor (`_total_per_tensor`), whose
    checks and whether this rank counts (`_counted`) are made once per mesh and placements.
    None when no DTensor is among `xs`. A problem is a `ShardRefusal`."""
    dt = dtensor_type()
    if dt is None or not has_dtensor(xs):
        return None
    if kind == "all_finite":
        op = "min"
    else:
        op = "max" if o == math.inf and kind == "norm" else "min" if o == -math.inf and kind == "norm" else "sum"
    fast = at_once.uniform(dt, xs, ys)  # every one a DTensor of one mesh, no Partial: judged in C-level passes
    if fast is not None:
        mesh, counted = fast
        total = at_once.local_total(ad, kind, o, op, dt, xs, ys, counted, _locals)
    else:
        mesh, total = _total_per_tensor(ad, kind, xs, ys, o, op)
    value = _plain_all_reduce(total, mesh, op)
    if value is None:  # a mesh of part of the world: DTensor's own
        out = all_reduce(total, mesh, op)
        if kind != "all_finite" and then is None:
            return out
        value = out.to_local()  # the global value on every rank (differentiable)
    if kind == "all_finite":
        value = value == 1
    elif then is not None:  # (`then.plain`, where it has one, for a value no derivative flows through)
        value = (then if value.requires_grad else getattr(then, "plain", then))(value)
    return at_once.replicated(dt, value, mesh)


def _total_per_tensor(
    ad: Any, kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, op: str
) -> tuple[Any, Any]:
    """`reduce`'s ``(mesh, this rank's part)`` tensor by tensor: each checked (`_check`, which names
    the one it refuses) and reduced on its own; what `_dtensor_reduce.uniform` declines comes here."""
    dt = dtensor_type()
    mesh = next(x for x in xs if isinstance(x, dt)).device_mesh
    parts = []
    seen: dict[tuple[Any, ...], bool] = {}  # (types, meshes, placements) met -> whether this rank counts
    for k, x in enumerate(xs):
        y = None if ys is None else ys[k]
        key = _group_key(x, y)
        counted = seen.get(key) if key is not None else None
        if counted is None:
            _check(k, x, dt, mesh, y)
            counted = _counted(x)
            if key is not None:
                seen[key] = counted
        p = _local_part(ad, kind, x, y, o)
        parts.append(p if op != "sum" or counted else uncounted(p))
    if len(parts) == 1:
        return mesh, parts[0]
    stacked = torch.stack(parts)
    return mesh, stacked.amax() if op == "max" else stacked.amin() if op == "min" else stacked.sum()


_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


def _plain_all_reduce(total: Any, mesh: Any, op: str) -> Any:
    """`total` (this rank's part, a fresh 0-d tensor) combined over every rank of `mesh` by ONE
    eager ``dist.all_reduce``, when `mesh` is 1-D or spans the whole world (the default group):
    in place where no gradient flows through it (a gradient's norm, anything under ``no_grad``),
    through `_SumAcross` for a sum autograd records (a norm or dot of the parameters themselves),
    through `_ExtremeAcross` for a max or min it records (``ord=inf``/``-inf``: the gradient to the
    rank holding the extreme). DTensor's redistribution costs several times the collective itself
    (bench_sharded's norm rows). None otherwise (a mesh of part of the world: `all_reduce`,
    DTensor's own, is used), where a max or min that autograd records is a `ShardRefusal`
    (DTensor's ``Partial(max)`` would give every rank's local extreme the gradient)."""
    grad = total.requires_grad and torch.is_grad_enabled()
    import torch.distributed as dist

    if mesh.ndim == 1:
        group = mesh.get_group()
    elif _flat_mesh(mesh) is not None:
        group = None  # the default group: the whole world, which this mesh spans
    else:
        if grad and op != "sum":
            msg = (
                f"the parameters are on {mesh}, which does not span every rank of the world, and autograd "
                f"records this {op} across ranks: its gradient (to the rank holding the extreme only) needs "
                "one all-reduce over the mesh's own ranks, which functorkit makes only over a 1-D mesh or one "
                "spanning the world. Expected such a mesh, or no gradient; fix: compute it under "
                "torch.no_grad(), or take ord=2 (whose gradient reaches every element)"
            )
            raise ShardRefusal(0, msg)
        return None
    if grad:
        if op == "sum":
            return _SumAcross.apply(total, group)  # type: ignore[no-untyped-call,unused-ignore]
        return _ExtremeAcross.apply(total, group, op)  # type: ignore[no-untyped-call,unused-ignore]
    dist.all_reduce(total, op=getattr(dist.ReduceOp, _OPS[op]), group=group)
    return total


class _SumAcross(torch.autograd.Function):  # type: ignore[misc,unused-ignore]  # (Any without torch stubs)
    """The sum over the ranks of `group` of each rank's 0-d part (one ``dist.all_reduce``), whose
    gradient is the incoming gradient unchanged: every rank holds the same total, and each rank's
    part enters it once, so d total / d part = 1 on every rank (DTensor's own ``Partial`` ->
    ``Replicate`` redistribution has the same backward: the gradient stays ``Replicate``)."""

    @staticmethod
    def forward(ctx: Any, part: Any, group: Any) -> Any:
        import torch.distributed as dist

        out = part.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        return grad, None


class _ExtremeAcross(torch.autograd.Function):  # type: ignore[misc,unused-ignore]  # (Any without torch stubs)
    """The max (`op` "max") or min ("min") over the ranks of `group` of each rank's 0-d part (ONE
    ``dist.all_reduce`` in the forward), whose gradient goes to the rank(s) holding the global extreme
    only: ``grad * (part == total) / n``, `n` the number of ranks whose part equals it (one
    all-reduce of that count in the backward, which every rank runs). That is the gradient of the
    max of the unsharded values: torch's ``amax`` splits a tie evenly in the same way (DTensor's
    ``Partial(max)`` -> ``Replicate`` has the identity as its backward, so every rank's local
    extreme got the whole gradient)."""

    @staticmethod
    def forward(ctx: Any, part: Any, group: Any, op: str) -> Any:
        import torch.distributed as dist

        out = part.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN, group=group)
        ctx.group = group
        ctx.save_for_backward(part.detach() == out)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        import torch.distributed as dist

        (held,) = ctx.saved_tensors
        n = held.to(grad.dtype)
        count = n.detach().clone()
        dist.all_reduce(count, op=dist.ReduceOp.SUM, group=ctx.group)  # how many ranks hold the extreme
        return grad * n / count.clamp(min=1), None, None


def _group_key(x: Any, y: Any) -> tuple[Any, ...] | None:
    """What `_check` and `_counted` depend on for DTensors `x` (and `y`): their types, meshes (by
    identity: equal meshes are distinct objects under FSDP2, checked once each) and placements; None
    where `x` (or `y`) is not a DTensor with a ``_spec`` (then each is checked on its own)."""
    sx = getattr(x, "_spec", None)
    if sx is None:
        return None
    if y is None:
        return (type(x), id(sx.mesh), tuple(sx.placements))
    sy = getattr(y, "_spec", None)
    if sy is None:
        return None
    return (type(x), id(sx.mesh), tuple(sx.placements), type(y), id(sy.mesh), tuple(sy.placements))


_FLAT: dict[tuple[int, str, tuple[int, ...]], Any] = {}  # (world group, device type, ranks) -> 1-D mesh


def _flat_mesh(mesh: Any) -> Any:
    """A 1-D mesh over the ranks of the N-D `mesh` whose process group is the default one (so it is
    made without creating a group: no collective, DeviceMesh's own rule for a mesh of the whole
    world), kept per rank set; None when `mesh` does not span the whole world (its ranks' own group
    would have to be created, a collective of every rank of the world)."""
    import torch.distributed as dist

    ranks = tuple(int(r) for r in mesh.mesh.reshape(-1).tolist())
    if len(ranks) != dist.get_world_size():
        return None
    key = (id(dist.group.WORLD), str(mesh.device_type), ranks)  # a new process group: new meshes
    flat = _FLAT.get(key)
    if flat is None:
        from torch.distributed.device_mesh import DeviceMesh

        flat = DeviceMesh(mesh.device_type, torch.tensor(ranks))
        if len(_FLAT) < 64:
            _FLAT[key] = flat
    return flat


def all_reduce(local: Any, mesh: Any, op: str) -> Any:
    """This rank's 0-d `local` combined over every rank of `mesh` by `op` ("sum", "max", "min") with
    ONE all-reduce, whatever the mesh's number of dimensions: a 0-d ``Replicate`` DTensor on `mesh`
    (each rank's part must already be counted once: `_counted`). An N-D mesh that spans the whole
    world reduces over one 1-D mesh of the same ranks (the default group, `_flat_mesh`), then gives
    the value back on `mesh` (``from_local`` of a replicated value: no communication); one that does
    not span the world falls back to one all-reduce per mesh dimension (docs/sharded.md). Every step
    is DTensor's own autograd-aware redistribution, so a norm keeps its gradient."""
    dt = dtensor_type()
    from torch.distributed.tensor import Partial, Replicate

    flat = _flat_mesh(mesh) if mesh.ndim > 1 else None
    if flat is None:  # a 1-D mesh (one all-reduce), or an N-D one not spanning the world
        partial = dt.from_local(local, mesh, [Partial(op)] * mesh.ndim, run_check=False)
        return partial.redistribute(mesh, [Replicate()] * mesh.ndim)
    partial = dt.from_local(local, flat, [Partial(op)], run_check=False)
    out = partial.redistribute(flat, [Replicate()])
    return dt.from_local(out.to_local(), mesh, [Replicate()] * mesh.ndim, run_check=False)


def _spread(mesh: Any, dims: Any) -> int:
    """How many of the mesh dimensions `dims` hold more than one rank (a reduction over each is a
    collective; DTensor skips those of one rank)."""
    return sum(1 for i in dims if mesh.size(i) > 1)


# ---------------------------------------------------------------- fk.load_into


def stage(dst: Any, src: Any, plain: Callable[[Any, Any], Any]) -> Any:
    """`src` ready to be copied into the DTensor `dst` (`dst.copy_` of it makes no communication), or
    `src` staged by `plain` when neither is a DTensor. Raises TypeError (with the fix) otherwise."""
    dt = dtensor_type()
    if dt is None or not (isinstance(dst, dt) or isinstance(src, dt)):
        return plain(dst, src)
    if not isinstance(dst, dt):
        msg = (
            f"`src` is {_describe(src)} and `dst` a plain tensor: this rank holds only a shard of the "
            "values. Expected a DTensor `dst` of the same placements, or a plain `src`; fix: gather "
            "`src` first (fk.fmap(lambda x: x.full_tensor(), src), a collective)"
        )
        raise TypeError(msg)
    if isinstance(src, dt):
        if src.device_mesh != dst.device_mesh or tuple(src.placements) != tuple(dst.placements):
            msg = (
                f"`src` is {_describe(src)} and `dst` {_describe(dst)}: their local shards hold different "
                "elements. Expected the same mesh and placements; fix: "
                "src.redistribute(dst.device_mesh, dst.placements) first (a collective)"
            )
            raise TypeError(msg)
        s = src.detach()
        return s if s.dtype is dst.dtype else s.to(dst.dtype)
    from torch.distributed.tensor import distribute_tensor

    full = plain(torch.empty(tuple(dst.shape), dtype=dst.dtype, device=dst.to_local().device), src)
    # every rank holds the whole value: each cuts its own shard (src_data_rank=None: no communication)
    return distribute_tensor(full, dst.device_mesh, dst.placements, src_data_rank=None)


# ---------------------------------------------------------------- the in-place EMA


def _local(x: Any) -> Any:
    """The local shard of DTensor `x` for a write without autograd: its ``_local_tensor`` (private:
    ``to_local()`` goes through an autograd Function, ~10 µs a call: bench_sharded's EMA row),
    feature-detected per call, else ``to_local()``."""
    t = getattr(x, "_local_tensor", None)
    return t if type(t) is torch.Tensor else x.to_local()


_LOCAL_TENSOR = operator.attrgetter("_local_tensor")


def _locals(xs: list[Any]) -> list[Any]:
    """`_local` of each of the DTensors `xs`: one C-level pass over their ``_local_tensor`` when the
    first has one (each is then checked to be a plain tensor: one more pass), else `_local` each."""
    if type(getattr(xs[0], "_local_tensor", None)) is torch.Tensor:
        out = list(map(_LOCAL_TENSOR, xs))
        if all(map(operator.is_, map(type, out), repeat(torch.Tensor))):
            return out
    return list(map(_local, xs))


def clone_local(x: Any) -> Any:
    """``fk.copy`` of the DTensor `x` with a ``Partial`` placement: its local shard copied and
    rebuilt with the same mesh, placements, shape and stride (no communication; DTensor's own
    ``clone`` all-reduces it into ``Replicate``), detached; None for any other tensor (DTensor's
    ``clone`` of ``Shard``/``Replicate`` placements copies the local shard already)."""
    dt = dtensor_type()
    if dt is None or not isinstance(x, dt) or not any(p.is_partial() for p in x.placements):
        return None
    local = _local(x).detach().clone()
    return dt.from_local(local, x.device_mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def stand_ins(arrays: list[Any]) -> list[Any] | None:
    """The local shards of `arrays` when every one is a DTensor: each has its DTensor's dtype,
    device and layout (``stand_ins`` of the adapter); None otherwise."""
    dt = dtensor_type()
    if dt is None or not all(map(operator.is_, map(type, arrays), repeat(dt))):
        return None
    return _locals(arrays)


def uniform_locals(arrays: list[Any]) -> list[Any] | None:
    """The local shards of `arrays` when every one is a DTensor of one mesh (equal meshes) and one
    placements tuple, with no ``Partial`` placement, so that any two of them hold the same elements
    on this rank and an element-wise update of one from others is local (no communication); None
    otherwise (``out=``'s column path then declines, and the per-leaf path looks at each pair and
    names what it refuses). The mesh and placements are judged once per distinct ``DTensorSpec``
    (`_dtensor_columns.uniform_specs`), never per tensor. For `out_fast`: the memory tests then run
    on the local shards (bench_sharded's EMA rows)."""
    return _locals(arrays) if uniform(arrays) else None


def uniform(arrays: list[Any]) -> bool:
    """`uniform_locals`' test alone, for DTensors `arrays` whose local shards the caller has
    (``out=``'s column path: the adapter's ``stand_ins``, made while matching the models): every
    one exactly a DTensor, of one mesh and one placements tuple, with no ``Partial`` placement."""
    dt = dtensor_type()
    if not arrays or dt is None or not all(map(operator.is_, map(type, arrays), repeat(dt))):
        return False
    return bool(by_spec.uniform_specs(arrays))


_LINEAR = frozenset(("sum", "avg"))  # Partial reductions an element-wise linear map commutes with


def sharded_out_problem(fname: str, x: Any, ins: Sequence[Any], o: Any, fix: str) -> str | None:
    """Why ``fk.<fname>(..., out=)`` cannot write the result at a position where the first model
    holds `x`, the other models `ins` and `out` the array `o`, one of them a DTensor with a
    ``Partial`` placement (an unreduced sum: each rank holds a term, not a part, of the values); None
    where it can (no ``Partial`` there). It can when every one is a DTensor of one mesh and one
    placements tuple whose ``Partial`` reductions are ``sum`` or ``avg`` and the operation is linear in
    the models and keeps them ``Partial`` in its functional form (``add``, ``sub``, ``scale``,
    ``lincomb``, ``mean``): then each rank's term is computed from its terms, with no communication,
    as DTensor's functional operators do. `fix`: the functional form. (The plain/DTensor mix is
    refused before, by the operand check: `mixed_problem`.)"""
    dt = dtensor_type()
    if dt is None:
        return None
    arrays = (x, *ins, o)
    partial = next((a for a in arrays if isinstance(a, dt) and any(p.is_partial() for p in a.placements)), None)
    if partial is None:
        return None
    tail = (
        f"fix: the functional form, `{fix}` (DTensor reduces the Partial terms where the result needs it), or "
        "make the values whole first: x.redistribute(x.device_mesh, [Replicate()]) (a collective you ask for)"
    )
    for a in arrays:
        if (
            not isinstance(a, dt)
            or a.device_mesh != partial.device_mesh
            or tuple(a.placements) != tuple(partial.placements)
        ):
            found = _describe(a) if isinstance(a, dt) else f"a plain {type(a).__name__}"
            return (
                f"one array here is {_describe(partial)} and another {found}: a Partial DTensor holds on each "
                "rank a term of the values, not a part of them, so the result cannot be written term by term "
                "unless every array here is a DTensor of the same mesh and placements. Expected that; " + tail
            )
    bad = next((p for p in partial.placements if p.is_partial() and p.reduce_op not in _LINEAR), None)
    if bad is not None:
        return (
            f"the arrays here are {_describe(partial)}: each rank holds a candidate of each value (the value is "
            f"the {bad.reduce_op} over the ranks), and the result of the arithmetic is not the {bad.reduce_op} of "
            "its results on the candidates, so out= cannot compute it on the local shards. "
            "Expected Shard, Replicate or Partial(sum/avg) placements; " + tail
        )
    if fname == "lerp":
        return (
            f"the arrays here are {_describe(partial)}: DTensor's lerp reduces Partial terms first (its "
            "functional form gives Replicate values), so a result written term by term into a Partial array "
            "would differ from it (in placement and in rounding). Expected Shard or Replicate placements for "
            "the in-place lerp; " + tail
        )
    return None


def lerp_many_(fe: Callable[..., Any], xs: list[Any], ys: list[Any], t: float, checked: bool = False) -> bool:
    """``torch._foreach_lerp_`` over the local shards when every pair of `xs`/`ys` is a DTensor of one
    mesh and placements (the local shards then hold the same elements: no communication); False
    (nothing written) otherwise. `checked`: `uniform_locals` accepted them all (``out_fast``)."""
    dt = dtensor_type()
    if dt is None:
        return False
    if checked:
        with torch.no_grad():
            fe(_locals(xs), _locals(ys), t)
        return True
    lx, ly = [], []
    for x, y in zip(xs, ys, strict=True):
        if type(x) is not dt or type(y) is not dt:
            return False
        if x.device_mesh != y.device_mesh or tuple(x.placements) != tuple(y.placements):
            return False
        if any(p.is_partial() for p in x.placements):  # (refused by `sharded_out_problem` before)
            return False
        lx.append(_local(x))
        ly.append(_local(y))
    dev = lx[0].device
    if any(a.device != dev or type(a) is not torch.Tensor for a in (*lx, *ly)):
        return False
    with torch.no_grad():
        fe(lx, ly, t)
    return True


# ---------------------------------------------------------------- fk.allclose, fk.assert_allclose


def local_pair(x: Any, y: Any) -> tuple[Any, Any] | str:
    """The local shards of DTensors `x` and `y` (compared on each rank), or why they cannot be
    compared shard by shard (the same answer on every rank: placements are global)."""
    dt = dtensor_type()
    xd, yd = dt is not None and isinstance(x, dt), dt is not None and isinstance(y, dt)
    if not (xd or yd):
        return x, y
    if not (xd and yd):
        d = x if xd else y
        return (
            f"{_describe(d)} in `{'a' if xd else 'b'}` but a plain tensor in `{'b' if xd else 'a'}`: a rank "
            "holds only a shard of one of them. Compare models of the same placements, or gather "
            "(fk.fmap(lambda t: t.full_tensor(), model))"
        )
    if x.device_mesh != y.device_mesh or tuple(x.placements) != tuple(y.placements):
        return (
            f"`a` holds {_describe(x)} but `b` {_describe(y)}: their shards hold different elements. "
            "Compare after b.redistribute(a.device_mesh, a.placements)"
        )
    if any(p.is_partial() for p in x.placements):
        # a Partial local shard is one rank's term of the value, not a part of it: equal values can have
        # different terms (1 + 2 and 2 + 1), and close terms need not sum to close values. The values
        # themselves are compared: each reduced (the Partial mesh dimensions made Replicate, the Shard
        # ones kept: one all-reduce each; every rank meets the same Partial pairs in the same order)
        rx = _reduced(x)
        return rx.to_local(), (rx if y is x else _reduced(y)).to_local()
    return x.to_local(), y.to_local()


def _reduced(x: Any) -> Any:
    """The DTensor `x` with each ``Partial`` placement made ``Replicate`` (its pending reduction made:
    one all-reduce per such mesh dimension), detached."""
    from torch.distributed.tensor import Replicate

    places = [Replicate() if p.is_partial() else p for p in x.placements]
    with torch.no_grad():
        return x.detach().redistribute(x.device_mesh, places)


def any_rank(leaves: Sequence[Any]) -> Callable[[bool], bool] | None:
    """For `leaves` holding a DTensor: a function ``flag -> bool``, True when `flag` is True on any
    rank of that DTensor's mesh (one all-reduce of one integer); None otherwise."""
    dt = dtensor_type()
    if dt is None or not has_dtensor(leaves):
        return None
    first = next(x for x in leaves if isinstance(x, dt))
    mesh = first.device_mesh

    def agree(flag: bool) -> bool:
        local = torch.tensor(int(flag), device=first.to_local().device)
        return bool(all_reduce(local, mesh, "max").to_local().item())

    return agree


# ---------------------------------------------------------------- per-tensor merges (fk.ties, fk.dare...)


def whole_tensor_problem(x: Any) -> str | None:
    """Why a per-tensor selection over the whole of DTensor `x` (a top-k threshold, DARE's masks
    keyed by each element's global index) is not made on its shards; None for other tensors."""
    dt = dtensor_type()
    if dt is None or not isinstance(x, dt):
        return None
    return (
        f"this is {_describe(x)}, and this method selects over each whole tensor (a top-k threshold, or "
        "masks keyed by every element's index), which the local shards cannot do alone. Expected plain "
        "tensors; fix: merge with fk.task_arithmetic/fk.lincomb (element-wise: on the shards), or gather "
        "the models first (fk.fmap(lambda t: t.full_tensor(), model), a collective)"
    )


def settle(r: Any) -> Any:
    """A per-tensor result `r` whose DTensor placements are `Partial` (an unreduced sum: each rank
    holds its own part) reduced to `Replicate` with one all-reduce (a 0-d result pending on several
    mesh dimensions: `all_reduce` over all of them at once; otherwise DTensor's redistribution,
    one all-reduce for one pending dimension); anything else as it is."""
    dt = dtensor_type()
    if dt is None or not isinstance(r, dt) or not any(p.is_partial() for p in r.placements):
        return r
    from torch.distributed.tensor import Replicate

    mesh, places = r.device_mesh, tuple(r.placements)
    ops = {p.reduce_op for p in places if p.is_partial()}
    pending = [i for i, p in enumerate(places) if p.is_partial()]
    if r.ndim == 0 and len(ops) == 1 and _spread(mesh, pending) > 1 and not any(p.is_shard() for p in places):
        # one all-reduce for any mesh: this rank's part counted once (on the replicated dimensions,
        # coordinate 0 only; a sum's other replicas give 0), then one sum over every rank
        (op,) = ops
        part = _reduced_local(r)
        coord = mesh.get_coordinate()
        counted = coord is not None and all(c == 0 for c, p in zip(coord, places, strict=True) if p.is_replicate())
        if op == "sum" and not counted:
            part = uncounted(part)
        return all_reduce(part, mesh, op)
    return r.redistribute(mesh, [Replicate()] * mesh.ndim)
