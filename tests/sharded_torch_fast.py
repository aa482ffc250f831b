"""The fast path of sharded reductions on one gloo rank (tests/test_sharded_torch_fast.py), run inside
tests/sharded_torch_worker.py's process: ``fk.norm``/``fk.dot``/``fk.all_finite`` of DTensor models
judged at once (``functorkit.adapters._dtensor_reduce``), with no per-tensor check and the local sums
in a number of kernels that does not grow with the number of tensors; and its fallbacks (no
``torch._foreach_norm``, the per-tensor path, ``_foreach_norm`` for every order on CPU) giving the
same values. Nothing is imported at module level: pytest's ``--doctest-modules`` imports this file in
sessions without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


def run(check: Callable[[str, Callable[[], dict[str, Any]]], None], count: Any, mesh: Any) -> None:
    """Register this module's checks (names ``fast_...``) with the worker's `check` (`count`: its
    collective counter)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    import functorkit as fk
    from functorkit.adapters import _dtensor
    from functorkit.adapters import _dtensor_reduce as at_once

    class Ops(TorchDispatchMode):
        """The aten (and c10d) operations made inside, by name; ``dtensor``: those on a DTensor."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []
            self.dtensor = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(func.overloadpacket.__name__)
            flat = [*args, *(kwargs or {}).values()]
            self.dtensor += any(isinstance(a, DTensor) for a in flat)
            return func(*args, **(kwargs or {}))

    checked: list[int] = []

    @contextmanager
    def per_tensor_spy() -> Iterator[list[int]]:
        """Counts the per-tensor path's checks (`_dtensor._check`, one per tensor it reduces)."""
        plain = _dtensor._check

        def spy(*args: Any) -> None:
            checked.append(1)
            plain(*args)

        checked.clear()
        _dtensor._check = spy
        try:
            yield checked
        finally:
            _dtensor._check = plain

    @contextmanager
    def switched(flag: list[Any], value: Any) -> Iterator[None]:
        old = flag[0]
        flag[0] = value
        try:
            yield
        finally:
            flag[0] = old

    places = [[Shard(0)], [Shard(1)], [Replicate()]]

    def model(n: int, seed: int, grad: bool = False, rows: int = 5) -> tuple[dict[str, Any], dict[str, Any]]:
        """`n` DTensors (uneven Shard(0), Shard(1), Replicate in turn: on rank 1 the replicas do not
        count) and their unsharded reference (the same seed on every rank)."""
        g = torch.Generator().manual_seed(seed)
        ref = {f"p{i}": torch.randn(rows, 4, generator=g, dtype=torch.float64) for i in range(n)}
        sharded = {k: distribute_tensor(v.clone(), mesh, places[i % 3]) for i, (k, v) in enumerate(ref.items())}
        if grad:
            sharded = {k: torch.nn.Parameter(v) for k, v in sharded.items()}
            ref = {k: torch.nn.Parameter(v.clone()) for k, v in ref.items()}
        return sharded, ref

    orders = (2, 1, math.inf, -math.inf, 0, 3)

    def reductions(d: dict[str, Any], e: dict[str, Any]) -> dict[str, Callable[[], Any]]:
        out: dict[str, Callable[[], Any]] = {f"norm_{o}": (lambda o=o: fk.norm(d, ord=o)) for o in orders}
        out["dot"] = lambda: fk.dot(d, e)
        out["all_finite"] = lambda: fk.all_finite(d)
        return out

    def references(r: dict[str, Any], s: dict[str, Any]) -> dict[str, float]:
        flat = torch.cat([v.detach().reshape(-1) for v in r.values()])
        out = {f"norm_{o}": float(torch.linalg.vector_norm(flat, ord=o)) for o in orders}
        out["dot"] = float(flat @ torch.cat([v.detach().reshape(-1) for v in s.values()]))
        out["all_finite"] = 1.0
        return out

    def run_all(grad: bool) -> dict[str, Any]:
        """Every reduction of a model of 7 mixed-placement DTensors: its value, the all-reduces it made
        and the per-tensor checks (0 on the fast path)."""
        (d, rd), (e, re_) = model(7, 0, grad), model(7, 1, grad)
        refs = references(rd, re_)
        res: dict[str, Any] = {}
        for name, f in reductions(d, e).items():
            with per_tensor_spy() as seen, count() as c:
                r = f()
            res[name] = {
                "value": float(r),
                "ref": refs[name],
                "comms": c,
                "checked": len(seen),
                "placements": str(tuple(r.placements)),
                "requires_grad": bool(r.requires_grad),
            }
        return res

    check("fast_no_grad", lambda: _no_grad(run_all))
    check("fast_grad", lambda: run_all(True))

    def ops_of(f: Callable[[], Any]) -> Ops:
        with torch.no_grad(), Ops() as mode:
            f()
        return mode

    def kernels() -> dict[str, Any]:
        """The operations fk.norm and fk.dot make under no_grad for 6 and for 24 DTensors of one
        placements (an FSDP2 model's): the norm's do not grow with the number of tensors, none is a
        DTensor operation."""
        out: dict[str, Any] = {}
        for n in (6, 24):
            g = torch.Generator().manual_seed(n)
            d = {f"p{i}": distribute_tensor(torch.randn(6, 4, generator=g), mesh, [Shard(0)]) for i in range(n)}
            fk.norm(d)  # (the first call makes the cached spec of the result)
            norm, dot = ops_of(lambda d=d: fk.norm(d)), ops_of(lambda d=d: fk.dot(d, d))
            inf = ops_of(lambda d=d: fk.norm(d, ord=math.inf))
            out[str(n)] = {
                "norm": norm.ops,
                "inf": inf.ops,
                "norm_dtensor_ops": norm.dtensor,
                "dot": len(dot.ops),
                "dot_vdots": dot.ops.count("vdot"),
                "dot_dtensor_ops": dot.dtensor,
            }
        return out

    check("fast_kernels", kernels)

    def fallbacks() -> dict[str, Any]:
        """The same values without ``torch._foreach_norm``, through the per-tensor path, and with
        ``_foreach_norm`` for every order on CPU (a tensor whose shard on rank 1 is empty)."""
        (d, rd), (e, re_) = model(7, 2), model(7, 3)
        tiny = distribute_tensor(torch.tensor([[-8.0, 1.0, 0.0, 2.0]], dtype=torch.float64), mesh, [Shard(0)])
        d["tiny"], rd["tiny"] = tiny, tiny.full_tensor()
        e["tiny"], re_["tiny"] = tiny, tiny.full_tensor()
        refs = references(rd, re_)
        out: dict[str, Any] = {}
        for how, flag, value in (
            ("no_foreach", at_once.FOREACH_NORM, None),
            ("per_tensor", at_once.FAST, False),
            ("foreach_on_cpu", at_once.FOREACH_ORDS_ON_CPU, True),
        ):
            res: dict[str, Any] = {}
            with switched(flag, value):
                for name, f in reductions(d, e).items():
                    with torch.no_grad(), per_tensor_spy() as seen, count() as c, Ops() as mode:
                        r = f()
                    res[name] = {
                        "value": float(r),
                        "ref": refs[name],
                        "comms": c,
                        "checked": len(seen),
                        "foreach": mode.ops.count("_foreach_norm"),
                        "placements": str(tuple(r.placements)),
                    }
            out[how] = res
        out["tensors"] = len(d)
        return out

    check("fast_fallbacks", fallbacks)

    def foreach_inf_gradient() -> dict[str, Any]:
        """``ord=inf`` through ``_foreach_norm`` (forced on CPU) with autograd: the gradient of the
        unsharded norm (rank 1's local max gets none; a tie within a tensor is split)."""
        vals = torch.tensor([[9.0, 1.0, 5.0, 2.0], [0.5, -9.0, 3.0, -3.0]])
        d = {"v": torch.nn.Parameter(distribute_tensor(vals.clone(), mesh, [Shard(1)]))}
        ref = {"v": torch.nn.Parameter(vals.clone())}
        with switched(at_once.FOREACH_ORDS_ON_CPU, True), Ops() as mode:
            n = fk.norm(d, ord=math.inf)
        n.to_local().backward()
        fk.norm(ref, ord=math.inf).backward()
        return {
            "value": float(n),
            "ref": 9.0,
            "foreach": mode.ops.count("_foreach_norm"),
            "grad": d["v"].grad.full_tensor().tolist(),
            "grad_ref": ref["v"].grad.tolist(),
        }

    check("fast_inf_grad", foreach_inf_gradient)

    def gradients() -> dict[str, Any]:
        """fk.norm(ord=2) of a mixed-placement model on the fast path: every parameter's gradient is
        the unsharded norm's, p / |p| (the Replicate ones too, on the rank that does not count them)."""
        d, rd = model(7, 4, grad=True)
        with per_tensor_spy() as seen:
            n = fk.norm(d)
        n.to_local().backward()
        fk.norm(rd).backward()
        diff = max(float((d[k].grad.full_tensor() - rd[k].grad).abs().max()) for k in d)
        return {"err": diff, "checked": len(seen)}

    check("fast_gradients", gradients)

    def result() -> dict[str, Any]:
        """The 0-d result made from the cached spec equals DTensor.from_local's, and works as one."""
        d, _ = model(4, 5)
        with torch.no_grad():
            r = fk.norm(d)
        with switched(at_once.FAST, False), torch.no_grad():
            s = fk.norm(d)  # (DTensor.from_local's)
        return {
            "same": [
                type(r) is type(s),
                tuple(r.placements) == tuple(s.placements),
                r.device_mesh == s.device_mesh,
                r.shape == s.shape,
                r.stride() == s.stride(),
                r.dtype == s.dtype,
                r.requires_grad == s.requires_grad,
            ],
            "twice": float(r + r),
            "value": float(r),
            "local_is_plain": type(r.to_local()) is torch.Tensor,
        }

    check("fast_result", result)


def _no_grad(f: Callable[[bool], Any]) -> Any:
    import torch

    with torch.no_grad():
        return f(False)
