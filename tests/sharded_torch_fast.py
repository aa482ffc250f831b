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

    # ---- the in-place EMA (fk.lerp(ema, model, t, out=ema)) on FSDP2 modules: judged per spec
    from torch.distributed.fsdp import fully_shard

    from functorkit.adapters import _dtensor_columns as by_spec
    from functorkit.adapters import torch as torch_adapter

    def fsdp_stack(layers: int, seed: int) -> Any:
        torch.manual_seed(seed)
        m = torch.nn.Sequential(*[torch.nn.Linear(5, 5) for _ in range(layers)])  # 5 rows: uneven shards
        for layer in m:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m

    @contextmanager
    def reads() -> Iterator[dict[str, int]]:
        """Counts the reads of DTensor's ``placements`` and ``device_mesh`` properties (the per-tensor
        judgement), the spec judgements (`_dtensor_columns.spec_fits`), the shape tests
        (`same_global_shape`) and the foreach calls with the types of their tensors."""
        seen: dict[str, Any] = {"placements_reads": 0, "device_mesh_reads": 0, "spec_fits": 0, "same_shape": 0}
        seen["foreach"] = []
        seen["local_reads"] = 0  # DTensors whose local shard was looked up (`_dtensor._locals`)
        seen["arith"] = []  # the torch._foreach_* arithmetic calls: name and the types of their tensors
        props = {n: getattr(DTensor, n) for n in ("placements", "device_mesh")}
        fits, same, fe = by_spec.spec_fits, by_spec.same_global_shape, torch_adapter.foreach_lerp_
        locals_, arith = _dtensor._locals, torch_adapter.foreach_arith_
        assert fe is not None
        assert arith is not None

        def locals_spy(xs: list[Any]) -> list[Any]:
            seen["local_reads"] += len(xs)
            return locals_(xs)

        def arith_spy(name: str, f: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                tensors = [v for a in args if isinstance(a, list) for v in a]
                seen["arith"].append((name, sorted({type(v).__name__ for v in tensors})))
                return f(*args, **kwargs)

            return call

        def counted(name: str, prop: Any) -> Any:
            def get(x: Any) -> Any:
                seen[f"{name}_reads"] += 1
                return prop.fget(x)

            return property(get)

        def fits_spy(*args: Any) -> bool:
            seen["spec_fits"] += 1
            return fits(*args)

        def same_spy(x: Any, y: Any) -> bool:
            seen["same_shape"] += 1
            return same(x, y)

        def fe_spy(xs: Any, ys: Any, t: Any) -> None:
            seen["foreach"].append(sorted({type(v).__name__ for v in (*xs, *ys)}))
            fe(xs, ys, t)

        for n, prop in props.items():
            setattr(DTensor, n, counted(n, prop))
        by_spec.spec_fits, by_spec.same_global_shape, torch_adapter.foreach_lerp_ = fits_spy, same_spy, fe_spy
        _dtensor._locals = locals_spy
        torch_adapter.foreach_arith_ = {n: arith_spy(n, f) for n, f in arith.items()}
        try:
            yield seen
        finally:
            for n, prop in props.items():
                setattr(DTensor, n, prop)
            by_spec.spec_fits, by_spec.same_global_shape, torch_adapter.foreach_lerp_ = fits, same, fe
            _dtensor._locals, torch_adapter.foreach_arith_ = locals_, arith

    def ema_step() -> dict[str, Any]:
        """fk.lerp(ema, model, t, out=ema) on FSDP2 stacks of 3 and of 12 Linear layers, with the spec
        path on and off: the values (the local lerp of every shard, bit for bit the same either way),
        no collective, one foreach over plain local shards; with the path on, the placements and
        meshes are never read per tensor and the specs are judged a number of times that does not
        grow with the model (FSDP2 shares a spec per parameter shape); off, they are read per tensor
        (so that the spies are seen to work)."""
        out: dict[str, Any] = {}
        for layers in (3, 12):
            model = fsdp_stack(layers, 1)
            res: dict[str, Any] = {}
            for how, flag in (("on", True), ("off", False)):
                ema = fsdp_stack(layers, 0)
                before = [p.to_local().detach().clone() for p in ema.parameters()]
                want = [torch.lerp(b, p.to_local().detach(), 0.25) for b, p in zip(before, model.parameters())]
                with switched(by_spec.FAST, flag), reads() as seen, count() as c:
                    got = fk.lerp(ema, model, 0.25, out=ema)
                res[how] = {
                    **seen,
                    "comms": c,
                    "same": got is ema,
                    "exact": all(torch.equal(p.to_local(), w) for p, w in zip(ema.parameters(), want)),
                    "tensors": len(want),
                    "placements": sorted({str(tuple(p.placements)) for p in ema.parameters()}),
                }
            out[str(layers)] = res
        return out

    check("fast_ema", ema_step)

    rows: dict[str, Callable[[Any, Any], Any]] = {  # the plain row kernel of each call, on one shard pair
        "add": lambda x, y: torch.add(x, y),
        "sub": lambda x, y: torch.sub(x, y),
        "scale": lambda x, y: torch.mul(x, 3.0),
        "lincomb": lambda x, y: torch.mul(x, 0.5).add_(y, alpha=2.0),
        "mean": lambda x, y: torch.add(x, y).div_(2),
        "lerp": lambda x, y: torch.lerp(x, y, 0.25),
    }
    calls: dict[str, Callable[[Any, Any, Any], Any]] = {
        "add": lambda a, b, dst: fk.add(a, b, out=dst),
        "sub": lambda a, b, dst: fk.sub(a, b, out=dst),
        "scale": lambda a, b, dst: fk.scale(3.0, a, out=dst),
        "lincomb": lambda a, b, dst: fk.lincomb([0.5, 2.0], [a, b], out=dst),
        "mean": lambda a, b, dst: fk.mean([a, b], out=dst),
        "lerp": lambda a, b, dst: fk.lerp(a, b, 0.25, out=dst),
    }

    def arith_out() -> dict[str, Any]:
        """``out=`` arithmetic on two FSDP2 stacks of 4 Linear layers (8 DTensors each), in place
        and into a third stack: the local result of every shard, bit for bit the row kernels' on
        plain tensors, no collective, one batch of ``torch._foreach_*`` calls over the plain local
        shards, and each DTensor's local shard looked up once per call (where the models are
        matched; ``out_fast`` and the kernels are handed those)."""
        out: dict[str, Any] = {}
        for into in ("a", "c"):
            for name in ("add", "sub", "scale", "lincomb", "mean", "lerp"):
                a, b, c = fsdp_stack(4, 0), fsdp_stack(4, 1), fsdp_stack(4, 3)
                la = [p.to_local().detach().clone() for p in a.parameters()]
                lb = [p.to_local().detach() for p in b.parameters()]
                want = [rows[name](x, y) for x, y in zip(la, lb)]
                dst = a if into == "a" else c
                with reads() as seen, count() as comms, torch.no_grad():
                    got = calls[name](a, b, dst)
                types = {t for _, ts in seen["arith"] for t in ts} | {t for ts in seen["foreach"] for t in ts}
                out[f"{name}_{into}"] = {
                    "same": got is dst,
                    "exact": all(torch.equal(p.to_local(), w) for p, w in zip(dst.parameters(), want)),
                    "comms": comms,
                    "tensors": len(want),
                    "models": (2 if name != "scale" else 1) + (into == "c"),
                    "local_reads": seen["local_reads"],
                    "kernel_types": sorted(types),
                    "kernels": len(seen["arith"]) + len(seen["foreach"]),
                    "placements_reads": seen["placements_reads"],
                }
        return out

    check("fast_arith_out", arith_out)

    def ema_refusals() -> dict[str, Any]:
        """What the column path declines is refused as before, with the same message on and off:
        global shapes that differ while the local shards agree (5 and 6 rows over 2 ranks: 3 local
        rows on rank 0 for both), and placements that differ; nothing is written."""
        g = torch.Generator().manual_seed(3)
        five, six = torch.randn(5, 4, generator=g), torch.randn(6, 4, generator=g)
        out: dict[str, Any] = {}
        for how, flag in (("on", True), ("off", False)):
            for name, other, where in (
                ("shape", six, [Shard(0)]),
                ("placements", torch.randn(5, 4, generator=g), [Replicate()]),
            ):
                a = {f"p{i}": distribute_tensor(five.clone(), mesh, [Shard(0)]) for i in range(4)}
                b = {f"p{i}": distribute_tensor(five.clone(), mesh, [Shard(0)]) for i in range(4)}
                b["p2"] = distribute_tensor(other.clone(), mesh, where)
                keep = {k: v.to_local().clone() for k, v in a.items()}
                with switched(by_spec.FAST, flag), count() as c:
                    try:
                        fk.lerp(a, b, 0.5, out=a)
                        msg = "no error"
                    except Exception as e:  # noqa: BLE001 -- compared by the test
                        msg = f"{type(e).__name__}: {e}"
                ok = name == "placements" and msg == "no error"
                untouched = all(torch.equal(a[k].to_local(), keep[k]) for k in a)
                out[f"{name}_{how}"] = {"msg": msg, "untouched": untouched, "comms": c, "done": ok}
                if ok:  # a Replicate term among Shard(0) ones: the per-leaf path, DTensor's own lerp
                    want = torch.lerp(five, other, 0.5)
                    out[f"{name}_{how}"]["err"] = float((a["p2"].full_tensor() - want).abs().max())
        return out

    check("fast_ema_refusals", ema_refusals)


def _no_grad(f: Callable[[bool], Any]) -> Any:
    import torch

    with torch.no_grad():
        return f(False)
