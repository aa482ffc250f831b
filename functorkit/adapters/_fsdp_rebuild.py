"""Rebuilding an FSDP2 module (``fully_shard``) as a working FSDP2 module of its own; part of the torch
adapter (`functorkit.adapters._torch_module` calls `rebuild` on each clone of a class whose
``__new__`` FSDP2 redirects, and only there: other modules never come here).

A clone made by the module walk (``fk.fmap``, ``fk.copy``, the arithmetic, ``fk.load(like=)``) is a
shallow copy of the module's ``__dict__``: it would share the original's FSDP2 state (the
``FSDPState`` held under the composable API's state key) and carry copies of the hooks FSDP2
registered on the original (the forward pre/post hooks bound to that state, each ``FSDPParam``'s
load-state-dict hook, the param group's state-dict hooks), so its forward would all-gather the
*original's* parameters. `rebuild` gives the clone an FSDP2 state of its own instead:

1. the original's settings are read from its state (the mesh, ``reshard_after_forward``, the
   mixed precision and offload policies, each parameter's ``Shard`` dimension, the ignored
   parameters);
2. the original's FSDP2 hooks are taken out of the clone's (copied) hook dicts, by handle id, and
   the clone loses the state key and its ``FSDP<cls>`` class;
3. ``fully_shard`` is called on the clone (inner modules were rebuilt first: the walk builds
   bottom-up, as ``fully_shard`` must be called) with the same settings, over parameters on the
   ``meta`` device (no memory, no communication);
4. each ``FSDPParam``'s sharded parameter is then the clone's own DTensor (a fresh leaf over its
   local shard, an ``nn.Parameter`` where the value is one, so that FSDP2's padding of an uneven shard never touches
   a tensor the caller holds), installed as FSDP2 itself does after ``load_state_dict(assign=True)``
   (``reset_sharded_param``).

Nothing of the original is written, and nothing is communicated: FSDP2 all-gathers the clone's own
parameters in the clone's forward. A clone whose parameters are all plain tensors (``fk.fmap(lambda
x: x.to_local(), model)``) is a plain module of the original class (no FSDP2 state, no FSDP2 hook);
an ``fk.partition`` group (slots another group holds are None) stays a value of the original's
state without its hooks, so that ``fk.combine`` of the groups rebuilds a working module.
What cannot be rebuilt working is refused by name, with ``fk.load_into(original, rebuilt)`` as the
fix (docs/sharded.md, "Rebuilt FSDP2 modules").
"""

from __future__ import annotations

from typing import Any, cast

import torch

from .._errors import StructureError

__all__ = ["rebuild"]

_LOAD_FIX = (
    "fix: load the values into the original FSDP2 module instead, fk.load_into(model, rebuilt) (shard "
    "to shard, no communication), and run its forward"
)


def _where(st: Any, cls: type) -> str:
    groups = st._fsdp_param_groups
    fqn = groups[0]._module_fqn if groups else None
    return f"the FSDP2 module {cls.__name__}" + (f" at {fqn!r}" if fqn else "")


def _unsupported(st: Any, cls: type, orig_cls: type) -> str | None:
    """Why the FSDP2 configuration of state `st` cannot be rebuilt working (None: it can)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, TrainingState
    from torch.distributed.fsdp._fully_shard._fsdp_param import ShardedState
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.fsdp._fully_shard._fully_shard import get_cls_to_fsdp_cls

    if type(st) is not FSDPState or get_cls_to_fsdp_cls().get(orig_cls) is not cls:
        return f"its state is a {type(st).__name__} (not fully_shard's own FSDPState)"
    if len(st._modules) != 1:
        return "fully_shard was applied to a list of modules together (one group over several modules)"
    if st._training_state != TrainingState.IDLE:
        return f"it is in the middle of a forward or backward ({st._training_state})"
    groups = st._fsdp_param_groups
    if len(groups) > 1:
        return "its parameters are in several groups (per-parameter meshes from shard_placement_fn)"
    for g in groups:
        info = g.mesh_info
        if not isinstance(info, FSDPMeshInfo) or getattr(info, "is_spmd_mesh", False):
            return f"its mesh is {type(info).__name__}{' (dp_mesh_dims)' if isinstance(info, FSDPMeshInfo) else ''}"
        if g.post_forward_mesh_info is not None and g.post_forward_mesh_info is not info:
            return "reshard_after_forward is an int (a second mesh after forward)"
        for fp in g.fsdp_params:
            if fp.sharded_state != ShardedState.SHARDED:
                return (
                    "its parameters are unsharded now (after unshard(), or a forward with "
                    "reshard_after_forward=False): call module.reshard() first"
                )
            if fp.is_dtensor:
                return "its parameters were DTensors before fully_shard (tensor parallelism with FSDP2)"
            if type(getattr(fp.sharded_param, "_local_tensor", None)) is not torch.Tensor:
                return "its local shards are tensor subclasses (FSDP2's all-gather extensions)"
    return None


def _managed(root: Any, stop: type) -> list[tuple[str, Any]]:
    """``(path, module)`` of `root` and of the submodules its own FSDP2 group manages: not those
    under another FSDP2 module (instances of `stop`), each module once."""
    out, seen, todo = [], set(), [("", root)]
    while todo:
        path, m = todo.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        out.append((path, m))
        for name, sub in reversed(m.__dict__["_modules"].items()):
            if sub is not None and not isinstance(sub, stop):
                todo.append((f"{path}.{name}" if path else name, sub))
    return out


def _positions(mods: list[tuple[str, Any]]) -> dict[tuple[str, str], Any]:
    return {(path, name): v for path, m in mods for name, v in m.__dict__["_parameters"].items() if v is not None}


def _hook_ids(st: Any) -> set[int]:
    """The ids of every hook FSDP2 registered for state `st` (on its module and on the modules
    holding its parameters)."""
    ids = set()
    for h in (getattr(st, "_pre_forward_hook_handle", None), getattr(st, "_post_forward_hook_handle", None)):
        if h is not None:
            ids.add(h.id)
    for g in st._fsdp_param_groups:
        for fp in g.fsdp_params:
            h = getattr(fp, "_post_load_hook_handle", None)
            if h is not None:
                ids.add(h.id)
        for handles in (g._module_to_pre_save_state_dict_hook_handle, g._module_to_pre_load_state_dict_hook_handle):
            ids.update(h.id for h in handles.values())
    return ids


# the hook dicts torch's Module.__init__ makes (keyed by hook id; the module walk copies each into a clone)
_HOOK_DICTS = tuple(k for k, v in torch.nn.Module().__dict__.items() if "hook" in k and isinstance(v, dict))


def _drop_hooks(mods: list[tuple[str, Any]], originals: dict[str, Any], ids: set[int]) -> None:
    """Take the hooks `ids` out of the clone's modules' hook dicts (each clone holds copies of the
    original's dicts; a module that is the original's own object is left alone)."""
    for path, m in mods:
        if originals.get(path) is m:
            continue
        md = m.__dict__
        for k in _HOOK_DICTS:
            hooks = md.get(k)
            if hooks:
                for i in ids.intersection(hooks):
                    del hooks[i]


def _group_below(new: Any, stop: type) -> bool:
    """Whether an FSDP2 module under `new` was kept a partition group (no FSDP2 state of its own)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    return any(
        m is not new and isinstance(m, stop) and isinstance(m, torch.nn.Module) and _get_module_fsdp_state(m) is None
        for m in new.modules()
    )


def _mesh_below(new: Any, stop: type) -> Any:
    """The mesh of an FSDP2 module under `new` (for a module without parameters of its own, whose
    state keeps no mesh: any of the model's is right, it shards nothing)."""
    from torch.distributed.fsdp._fully_shard._fsdp_state import _get_module_fsdp_state

    for m in new.modules():
        if m is not new and isinstance(m, stop) and isinstance(m, torch.nn.Module):
            st = _get_module_fsdp_state(m)
            if st is not None and st._fsdp_param_groups:
                return st._fsdp_param_groups[0].mesh_info.mesh
    return None


def rebuild(new: Any) -> None:
    """Give the clone `new` of an FSDP2 module an FSDP2 state of its own (see the module docstring),
    or make it a plain module of the original class when none of its parameters is a DTensor;
    raise (TypeError: an FSDP2 configuration that cannot be rebuilt; StructureError: values that do
    not fit it) otherwise, before anything is returned."""
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY
    from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState
    from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard

    d = new.__dict__
    cls = type(new)
    states = [s for s in (d.get(STATE_KEY) or {}).values() if isinstance(s, FSDPState)]
    if len(states) != 1:
        msg = (
            f"rebuilding the {cls.__name__} (an FSDP2 class): its FSDP2 state is not found, so the rebuilt module "
            f"could not run its forward. Expected a module made by fully_shard; {_LOAD_FIX}."
        )
        raise TypeError(msg)
    st = states[0]
    orig_cls = cls.__mro__[getattr(cls, "_orig_cls_mro_index", 2)]
    where = _where(st, cls)
    why = _unsupported(st, cls, orig_cls)
    if why is not None:
        msg = f"rebuilding {where}: {why}, which functorkit cannot give the rebuilt module working; {_LOAD_FIX}."
        raise TypeError(msg)
    original = st._modules[0]
    orig_mods = _managed(original, FSDPModule)
    clone_mods = _managed(new, FSDPModule)
    by_path = dict(clone_mods)
    orig_vals, vals = _positions(orig_mods), _positions(clone_mods)
    group: Any = st._fsdp_param_groups[0] if st._fsdp_param_groups else None
    fsdp_pos: dict[tuple[str, str], Any] = {}
    if group is not None:
        paths: dict[int, str] = {}
        for path, m in orig_mods:
            paths.setdefault(id(m), path)
        for fp in group.fsdp_params:
            info = fp._module_info
            for m, name in zip([info.module, *info.shared_modules], [info.param_name, *info.shared_param_names]):
                fsdp_pos[(paths[id(m)], name)] = fp
    ids = _hook_ids(st)

    def plain() -> None:
        _drop_hooks(clone_mods, dict(orig_mods), ids)
        d.pop(STATE_KEY, None)
        d.pop(REGISTRY_KEY, None)
        new.__class__ = orig_cls

    holes = set(orig_vals) - set(vals)
    if (holes and all(by_path[p].__dict__["_parameters"].get(n, 0) is None for p, n in holes)) or _group_below(
        new, FSDPModule
    ):
        # an fk.partition group (slots another group holds are None): a value that cannot run, kept an
        # FSDP2 module of the original's state, so that fk.combine of the groups rebuilds a working one;
        # without the original's hooks, so that calling it never runs them on the original
        _drop_hooks(clone_mods, dict(orig_mods), ids)
        return
    if vals and not any(isinstance(v, DTensor) for v in vals.values()):
        plain()  # none of its parameters is a DTensor: a plain module of the original class
        return
    if set(vals) != set(orig_vals):
        moved = sorted(f"{p}.{n}".lstrip(".") for p, n in set(vals) - set(orig_vals))
        msg = (
            f"rebuilding {where}: it now manages the parameters {moved}, which an FSDP2 submodule held "
            "(that submodule's parameters are no longer DTensors while this module's are). Expected every "
            f"parameter of an FSDP2 model to stay a DTensor, or none; {_LOAD_FIX}."
        )
        raise StructureError(msg)
    place: dict[int, Any] = {}  # id of the clone's value -> the Shard FSDP2 gives it
    for pos, fp in fsdp_pos.items():
        v = vals[pos]
        name = f"{pos[0]}.{pos[1]}".lstrip(".")
        expected = fp._spmd_placements
        ok = (
            isinstance(v, DTensor)
            and v.device_mesh == group.mesh_info.mesh
            and len(v.placements) == len(expected)
            and all(isinstance(p, Replicate) for p in v.placements[:-1])
            and isinstance(v.placements[-1], Shard)
            and v.ndim > v.placements[-1].dim
        )
        if ok:
            dim = v.placements[-1].dim
            n = group.mesh_info.shard_mesh_size
            ok = dim == 0 or v.shape[dim] % n == 0
        if not ok:
            found = (
                f"a DTensor of shape {tuple(v.shape)} with placements {tuple(v.placements)} over {v.device_mesh}"
                if isinstance(v, DTensor)
                else f"a plain {type(v).__name__}"
            )
            msg = (
                f"rebuilding {where}: its parameter {name!r} is {found}, which FSDP2 cannot shard as it sharded "
                f"the original ({tuple(expected)} over {group.mesh_info.mesh}; a Shard(d>0) dimension must "
                f"divide evenly). Expected DTensors of the original's mesh and placements; {_LOAD_FIX}."
            )
            raise StructureError(msg)
        place[id(v)] = v.placements[-1]
    # the clone loses the original's FSDP2 hooks, state and class; fully_shard gives it its own
    plain()
    meta: dict[int, Any] = {}
    shard_of: dict[int, Any] = {}
    for path, name in fsdp_pos:
        v = vals[(path, name)]
        p = meta.get(id(v))
        if p is None:
            p = meta[id(v)] = torch.nn.Parameter(
                torch.empty(v.shape, dtype=v.dtype, device="meta"), requires_grad=v.requires_grad
            )
            shard_of[id(p)] = place[id(v)]
        by_path[path].__dict__["_parameters"][name] = p
    ignored = {v for pos, v in vals.items() if pos not in fsdp_pos}  # the original's ignored_params
    if group is not None:
        mesh = group.mesh_info.mesh
        raf: Any = None if st._auto_reshard_after_forward else group.post_forward_mesh_info is not None
        offload = group.offload_policy
    else:
        mesh, raf = _mesh_below(new, FSDPModule), None if st._auto_reshard_after_forward else False
        if mesh is None:  # no parameter here or below: FSDP2 would shard nothing (and guess a device)
            return
        from torch.distributed.fsdp import OffloadPolicy

        offload = OffloadPolicy()
    fully_shard(
        new,
        mesh=mesh,
        reshard_after_forward=raf,
        shard_placement_fn=lambda p: shard_of.get(id(p)),
        mp_policy=st._mp_policy,
        offload_policy=offload,
        ignored_params=ignored or None,
    )
    # each FSDPParam's sharded parameter: the clone's own DTensor, as after load_state_dict(assign=True)
    (new_st,) = (s for s in d[STATE_KEY].values() if isinstance(s, FSDPState))
    clone_path = {id(m): path for path, m in clone_mods}
    fresh: dict[int, Any] = {}
    for g in new_st._fsdp_param_groups:
        for fp in g.fsdp_params:
            info = fp._module_info
            v = vals[(clone_path[id(info.module)], info.param_name)]
            p = fresh.get(id(v))
            if p is None:
                p = fresh[id(v)] = _own_parameter(v, fp, where)
            for m, name in zip([info.module, *info.shared_modules], [info.param_name, *info.shared_param_names]):
                m.__dict__["_parameters"][name] = p
            cast(Any, fp).reset_sharded_param()  # (untyped in torch: Any with and without torch installed)


def _own_parameter(v: Any, fp: Any, where: str) -> Any:
    """A fresh DTensor leaf over the local shard of `v` (no copy unless it is not contiguous), an
    ``nn.Parameter`` when `v` is one, with `v`'s ``requires_grad``, for FSDP2's `fp` to hold: FSDP2
    pads an uneven shard into storage of its own and swaps the parameter's local tensor, which must
    not happen to a tensor the caller holds."""
    from torch.distributed.tensor import DTensor

    local: Any = getattr(v, "_local_tensor", None)
    if type(local) is not torch.Tensor:
        local = v.to_local()
    local = local.detach()
    if not local.is_contiguous():
        local = local.contiguous()
    if tuple(local.shape) != tuple(fp.sharded_size):
        msg = (
            f"rebuilding {where}: the local shard of {fp._module_info.param_name!r} has shape {tuple(local.shape)}, "
            f"but FSDP2 shards it to {tuple(fp.sharded_size)}. Expected the original's sharding; {_LOAD_FIX}."
        )
        raise StructureError(msg)
    with torch.no_grad():
        dt = DTensor.from_local(local, v.device_mesh, v.placements, run_check=False, shape=v.shape, stride=v.stride())
    if isinstance(v, torch.nn.Parameter):
        return torch.nn.Parameter(dt, requires_grad=v.requires_grad)
    # a plain tensor in a parameter slot stays one (trainable, as in any rebuilt module), as a leaf
    return dt.requires_grad_(v.requires_grad)
