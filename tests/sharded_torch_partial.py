"""More checks of one gloo rank of tests/test_sharded_torch.py, run inside tests/sharded_torch_worker.py's
process (no process of their own): gradients of ``ord=inf`` norms, a plain tensor among DTensors,
``out=`` with ``Partial`` DTensors, ``fk.copy``/``fk.allclose`` of ``Partial`` DTensors and
``fk.load(like=)`` of a 0-d DTensor (docs/sharded.md). Nothing is imported at module level:
pytest's ``--doctest-modules`` imports this file in sessions without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def run(check: Callable[[str, Callable[[], dict[str, Any]]], None], count: Any, mesh: Any, folder: str) -> None:
    """Register this module's checks with the worker's `check` (`count`: its collective counter)."""
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    import functorkit as fk

    rank = dist.get_rank()

    def error(f: Callable[[], Any], whole: bool = False) -> str:
        """The error `f` raises as ``Class: message`` (its first 220 characters unless `whole`: the
        worker's results travel through a pipe, which they must not fill), or "no error"."""
        try:
            f()
        except Exception as e:  # noqa: BLE001 -- reported to the test, which asserts on it
            text = f"{type(e).__name__}: {e}"
            return text if whole else text[:220]
        return "no error"

    def terms(vals: list[Any], op: str) -> Any:
        """A Partial(`op`) DTensor whose term on rank r is ``vals[r]``."""
        return DTensor.from_local(torch.tensor(vals[rank]), mesh, [Partial(op)], run_check=False)

    # ---- fk.norm(ord=inf/-inf) with autograd: the gradient of the unsharded norm
    def norm_inf_grad() -> dict[str, Any]:
        # |9| (the max) is in rank 0's columns of v, 0.5 (the min) in rank 0's too; rank 1's local
        # extremes (5, 1) are not global: they must get no gradient
        v = torch.tensor([[9.0, 1.0, 5.0, 2.0], [0.5, 1.0, 3.0, -3.0]])
        w = torch.tensor([[1.0, -2.0], [3.0, 4.0]])
        tie = torch.tensor([[7.0, 1.0, -7.0, 2.0]])  # the max |x| on both ranks: half the gradient each
        out: dict[str, Any] = {}
        for name, vals, o in (("inf", v, math.inf), ("-inf", v, -math.inf), ("tie", tie, math.inf)):
            d = {"v": torch.nn.Parameter(distribute_tensor(vals.clone(), mesh, [Shard(1)]))}
            ref = {"v": torch.nn.Parameter(vals.clone())}
            if name != "tie":
                d["w"] = torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)]))
                ref["w"] = torch.nn.Parameter(w.clone())
            with count() as c:
                n = fk.norm(d, ord=o)
            with count() as cb:
                n.to_local().backward()
            nr = fk.norm(ref, ord=o)
            nr.backward()
            out[name] = {
                "value": float(n.to_local()),
                "ref": float(nr),
                "grad": {k: d[k].grad.full_tensor().tolist() for k in d},
                "grad_ref": {k: ref[k].grad.tolist() for k in ref},
                "comms": c,
                "comms_backward": cb,
            }
        # fk.normalize(ord=inf): its gradient through the norm too
        d = {"v": torch.nn.Parameter(distribute_tensor(v.clone(), mesh, [Shard(1)]))}
        ref = {"v": torch.nn.Parameter(v.clone())}
        cw = torch.arange(8.0).reshape(2, 4)
        fk.dot(fk.normalize(d, ord=math.inf), {"v": distribute_tensor(cw, mesh, [Shard(1)])}).to_local().backward()
        fk.dot(fk.normalize(ref, ord=math.inf), {"v": cw}).backward()
        out["normalize"] = {"grad": d["v"].grad.full_tensor().tolist(), "grad_ref": ref["v"].grad.tolist()}
        return out

    check("inf_grad", norm_inf_grad)

    # ---- a plain tensor among DTensors: a PolicyError by path, before anything is written
    def mixed_plain() -> dict[str, Any]:
        full = torch.arange(8.0).reshape(4, 2)
        a = {"enc": {"w": distribute_tensor(full.clone(), mesh, [Shard(0)])}}
        p = {"enc": {"w": full.clone()}}
        calls: dict[str, Callable[[], Any]] = {
            "dot_ap": lambda: fk.dot(a, p),
            "dot_pa": lambda: fk.dot(p, a),
            "lerp": lambda: fk.lerp(a, p, 0.5),
            "mean": lambda: fk.mean([p, a]),
            "slerp": lambda: fk.slerp(a, p, 0.5),
            "task_arithmetic": lambda: fk.task_arithmetic(a, [p], [1.0]),
            "model_stock": lambda: fk.model_stock(a, [p, a]),
            "tensor_dots": lambda: fk.tensor_dots(p, a),
            "stack": lambda: fk.stack([a, p]),
        }
        out: dict[str, Any] = {name: error(f) for name, f in calls.items()}
        out["add"] = error(lambda: fk.add(a, p), whole=True)
        # out=: the plain leaf sorts after a DTensor leaf that would be written first
        for name in ("add", "sub", "lerp", "lincomb", "out_plain"):
            m = {
                "a": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]),
                "b": distribute_tensor(full, mesh, [Shard(0)]),
            }
            q = {"a": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]), "b": full.clone()}
            o = {
                "a": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]),
                "b": distribute_tensor(torch.zeros(4, 2), mesh, [Shard(0)]),
            }
            ops: dict[str, Callable[[], Any]] = {
                "add": lambda m=m, q=q, o=o: fk.add(m, q, out=o),
                "sub": lambda m=m, q=q, o=o: fk.sub(m, q, out=o),
                "lerp": lambda m=m, q=q, o=o: fk.lerp(m, q, 0.5, out=o),
                "lincomb": lambda m=m, q=q, o=o: fk.lincomb([1.0, 2.0], [m, q], out=o),
                "out_plain": lambda m=m, o=o: fk.add(m, m, out=dict(o, b=torch.zeros(4, 2))),
            }
            out[f"out_{name}"] = error(ops[name])
            out[f"out_{name}_untouched"] = float(o["a"].to_local().abs().sum()) == 0.0
        return out

    check("mixed_plain", mixed_plain)

    # ---- out= with Partial DTensors
    def partial_out() -> dict[str, Any]:
        out: dict[str, Any] = {}
        gen = torch.Generator().manual_seed(5 + rank)  # different terms on each rank
        for op in ("sum", "avg"):
            av, bv = torch.randn(2, 3, generator=gen), torch.randn(2, 3, generator=gen)

            def models(av: Any = av, bv: Any = bv, op: str = op) -> tuple[Any, Any]:
                a = {"s": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)])}
                b = {"s": distribute_tensor(torch.full((4, 2), 2.0), mesh, [Shard(0)])}
                a["p"] = DTensor.from_local(av.clone(), mesh, [Partial(op)], run_check=False)
                b["p"] = DTensor.from_local(bv.clone(), mesh, [Partial(op)], run_check=False)
                return a, b

            pairs: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
                "add": (lambda a, b, o: fk.add(a, b, out=o), lambda a, b: fk.add(a, b)),
                "sub": (lambda a, b, o: fk.sub(a, b, out=o), lambda a, b: fk.sub(a, b)),
                "scale": (lambda a, b, o: fk.scale(-1.5, a, out=o), lambda a, b: fk.scale(-1.5, a)),
                "lincomb": (
                    lambda a, b, o: fk.lincomb([0.3, 0.6], [a, b], out=o),
                    lambda a, b: fk.lincomb([0.3, 0.6], [a, b]),
                ),
                "mean": (lambda a, b, o: fk.mean([a, b], out=o), lambda a, b: fk.mean([a, b])),
            }
            for name, (with_out, functional) in pairs.items():
                for where in ("a", "other"):
                    a, b = models()
                    want = functional(a, b)
                    o = a if where == "a" else models()[1]
                    with count() as c:
                        got = with_out(a, b, o)
                    out[f"{op}_{name}_{where}"] = [
                        got is o,
                        max(float((got[k].to_local() - want[k].to_local()).abs().max()) for k in want),
                        all(got[k].placements == a[k].placements == want[k].placements for k in want),
                        c,
                    ]  # out returned, largest difference to the functional terms, placements kept, collectives
            # lerp: DTensor's functional lerp reduces Partial terms first: refused, nothing written
            for where in ("a", "other"):
                a, b = models()
                o = a if where == "a" else models()[1]
                before = o["s"].to_local().clone()
                out[f"{op}_lerp_{where}"] = error(lambda a=a, b=b, o=o: fk.lerp(a, b, 0.5, out=o), whole=where == "a")
                out[f"{op}_lerp_{where}_untouched"] = torch.equal(o["s"].to_local(), before)
        for op in ("max", "min"):
            for name in ("add", "scale", "lincomb", "mean", "lerp", "lerp_second"):
                a = {
                    "s": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]),
                    "p": terms([[10.0, 0.0], [0.0, 10.0]], op),
                }
                b = {
                    "s": distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]),
                    "p": terms([[0.0, 8.0], [8.0, 0.0]], op),
                }
                if name == "lerp_second":  # every parameter Partial: the column path (bug: _foreach_lerp_ on terms)
                    a = {"p": a["p"], "q": terms([[1.0, 1.0], [1.0, 1.0]], op)}
                    b = {"p": b["p"], "q": terms([[3.0, 3.0], [3.0, 3.0]], op)}
                o = fk.copy(a) if name in ("scale", "lincomb") else a
                first = next(iter(o))
                before = o[first].to_local().clone()
                calls = {
                    "add": lambda a=a, b=b, o=o: fk.add(a, b, out=o),
                    "scale": lambda a=a, o=o: fk.scale(-1.0, a, out=o),
                    "lincomb": lambda a=a, o=o: fk.lincomb([1.0, 2.0], [a, a], out=o),
                    "mean": lambda a=a, b=b, o=o: fk.mean([a, b], out=o),
                    "lerp": lambda a=a, b=b: fk.lerp(a, b, 0.5, out=a),
                    "lerp_second": lambda a=a, b=b: fk.lerp(a, b, 0.5, out=a),
                }
                out[f"{op}_{name}"] = error(calls[name], whole=name == "scale")
                out[f"{op}_{name}_untouched"] = torch.equal(o[first].to_local(), before)
        # a Partial term among other placements: refused (the terms and the parts hold different things)
        a = {"p": terms([[1.0, 2.0], [3.0, 4.0]], "sum")}
        b = {"p": distribute_tensor(torch.ones(2), mesh, [Replicate()])}
        out["mixed_placements"] = error(lambda: fk.add(a, b, out=a), whole=True)
        return out

    check("partial_out", partial_out)

    # ---- fk.copy and fk.allclose of Partial DTensors
    def partial_copy() -> dict[str, Any]:
        g = {"g": terms([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]], "sum")}
        with count() as c:
            cp = fk.copy(g)
        return {
            "placements": str(tuple(cp["g"].placements)),
            "local_equal": torch.equal(cp["g"].to_local(), g["g"].to_local()),
            "independent": cp["g"].to_local().data_ptr() != g["g"].to_local().data_ptr(),
            "comms": c,
        }

    check("partial_copy", partial_copy)

    def partial_allclose() -> dict[str, Any]:
        x = {"g": terms([[1.0, 2.0], [2.0, 1.0]], "sum"), "s": distribute_tensor(torch.ones(4), mesh, [Shard(0)])}
        swapped = dict(x, g=terms([[2.0, 1.0], [1.0, 2.0]], "sum"))  # other terms, the same values (3, 3)
        other = dict(x, g=terms([[1.0, 2.0], [2.0, 2.0]], "sum"))  # values (3, 4)
        top = {"g": terms([[5.0, 1.0], [1.0, 7.0]], "max")}  # values (5, 7)
        try:
            fk.assert_allclose(x, other)
            message = "no error"
        except AssertionError as e:
            message = str(e)
        with count() as c:
            same = fk.allclose(x, x)
        return {
            "self": same,
            "copy": fk.allclose(x, fk.copy(x)),
            "swapped": fk.allclose(x, swapped),
            "other": fk.allclose(x, other),
            "max_self": fk.allclose(top, fk.copy(top)),
            "max_other": fk.allclose(top, {"g": terms([[5.0, 1.0], [1.0, 6.0]], "max")}),
            "message": message,
            "comms": c,
        }

    check("partial_allclose", partial_allclose)

    # ---- fk.load(like=) of a model holding a 0-d DTensor
    if folder:

        def load_0d() -> dict[str, Any]:
            d = {
                "w": distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]),
                "s": distribute_tensor(torch.tensor(1.5), mesh, [Replicate()]),
            }
            path = os.path.join(folder, "zero_d")
            whole = os.path.join(folder, "zero_d_whole.safetensors")
            dist.barrier()
            fk.save(path, d)
            if rank == 0:
                fk.save(whole, {"w": torch.arange(8.0).reshape(4, 2), "s": torch.tensor(1.5)})
            dist.barrier()
            out: dict[str, Any] = {}
            for name, p in (("sharded", path), ("whole", whole)):
                like = fk.scale(0.0, d)
                back = fk.load(p, like=like)
                out[name] = {
                    "placements": [str(tuple(back[k].placements)) for k in ("w", "s")],
                    "s": float(back["s"].to_local()),
                    "w": back["w"].full_tensor().tolist(),
                }
            return out

        check("load_0d", load_0d)
