"""Sharded models on 2 gloo ranks (CPU): the FSDP2 EMA step and the global norm (issue #26).

Targets: ``fk.lerp(ema, model, t, out=ema)`` on an FSDP2 module costs at most 1.1x
``torch._foreach_lerp_`` over the same local shards (no communication in the update);
``fk.norm(model)`` costs about one all-reduce of one scalar on top of the local sums.

Run alone: ``python benchmarks/bench_sharded.py [--quick]`` (it starts its two ranks itself).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "BENCH_SHARDED "
CHECKED = "hand loop with every check over list(parameters()) walked at each call"


def _worker(quick: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    sys.path.insert(0, str(HERE))
    from _timing import once

    import functorkit as fk

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # (width, layers, rounds, calls per timing): a small model, where the per-call cost of walking
    # the module tree shows, and one of GPT-2-small's size (about 100 M parameters, 192 tensors)
    # (many short timings rather than a few long ones: the best of them is the one that other
    # processes on this machine's two cores did not interrupt)
    configs = [(128, 4, 3, 20)] if quick else [(512, 12, 36, 40), (1024, 96, 24, 2)]
    results = []
    for width, blocks, rounds, number in configs:
        results.append(_time_config(fk, torch, dist, fully_shard, once, mesh, width, blocks, rounds, number))
    print(MARK + json.dumps({"rank": dist.get_rank(), "configs": results}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def _time_config(
    fk: Any,
    torch: Any,
    dist: Any,
    fully_shard: Any,
    once: Any,
    mesh: Any,
    width: int,
    blocks: int,
    rounds: int,
    number: int,
) -> dict[str, Any]:
    def make() -> Any:
        torch.manual_seed(0)
        m = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(blocks)])
        for layer in m:
            fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        return m

    model, ema = make(), make()
    with torch.no_grad():  # the local shards as plain tensors (views), written without autograd
        le = [p.to_local() for p in ema.parameters()]
        lm = [p.to_local() for p in model.parameters()]
    ones = torch.ones(())
    t = 0.001
    params = list(model.parameters())

    def norm_no_grad() -> Any:
        with torch.no_grad():
            return fk.norm(model)

    def local_sums_autograd() -> Any:  # what a differentiable norm must do on each rank
        return sum(x.to_local().reshape(-1).dot(x.to_local().reshape(-1)) for x in params)

    def local_sums() -> Any:
        return sum(x.reshape(-1).dot(x.reshape(-1)) for x in lm)

    def floor() -> Any:  # the least a global norm costs: the local sums and one all-reduce of one scalar
        total = local_sums()
        dist.all_reduce(total)
        return total.sqrt()

    def floor_autograd() -> Any:  # the same through the differentiable to_local() (the all-reduce's cost alike)
        total = local_sums_autograd()
        dist.all_reduce(total.detach().clone())
        return total.sqrt()

    def foreach() -> None:
        with torch.no_grad():
            torch._foreach_lerp_(le, lm, t)

    from bench_arith import _checked_ema

    def checked() -> None:  # the floor of a checked call: both modules walked, SPEC 14's checks by hand
        e, m = list(ema.parameters()), list(model.parameters())
        if len(e) != len(m) or not all(
            a.device_mesh == b.device_mesh and a.placements == b.placements and a.shape == b.shape
            for a, b in zip(e, m, strict=True)
        ):
            raise ValueError("the models' DTensors differ")
        with torch.no_grad():
            _checked_ema([a.to_local() for a in e], [b.to_local() for b in m], t)

    from functorkit.adapters import _dtensor_columns

    def ema_per_tensor() -> None:  # the spec path off: each DTensor's mesh, placements and shape read
        _dtensor_columns.FAST[0] = False
        try:
            fk.lerp(ema, model, t, out=ema)
        finally:
            _dtensor_columns.FAST[0] = True

    calls = {
        "fk.lerp(ema, model, t, out=ema)": lambda: fk.lerp(ema, model, t, out=ema),
        "torch._foreach_lerp_ over the local shards": foreach,
        "the same fk.lerp, each DTensor judged on its own (spec path off)": ema_per_tensor,
        CHECKED: checked,
        "fk.norm(model)": lambda: fk.norm(model),
        "local sums of squares through to_local(), differentiable, no all-reduce": local_sums_autograd,
        "fk.norm(model) under torch.no_grad()": norm_no_grad,
        "local sums of squares, no all-reduce": local_sums,
        "dist.all_reduce of one scalar": lambda: dist.all_reduce(ones),
        "floor: local sums of squares, one dist.all_reduce, sqrt": floor,
        "floor, differentiable: the same through to_local()": floor_autograd,
    }
    # the same fixed number of calls on every rank (a collective must be called as often on each).
    # The EMA step and its reference make no collective: they are timed on one rank at a time while
    # the others wait at a barrier, so that the ranks, which share this machine's cores, do not slow
    # each other down; the norm, its local sums and the all-reduce are timed on all ranks at once.
    # (the local sums stay with the collectives: they are the reference of fk.norm, timed alike)
    local = (
        "fk.lerp(ema, model, t, out=ema)",
        "torch._foreach_lerp_ over the local shards",
        "the same fk.lerp, each DTensor judged on its own (spec path off)",
        CHECKED,
    )
    times = dict.fromkeys(calls, float("inf"))
    ratios = []  # the EMA step over its reference, paired within each round
    for f in calls.values():
        f()
    rank, world = dist.get_rank(), dist.get_world_size()
    for r in range(rounds):
        for turn in range(world):
            dist.barrier()
            if turn == rank:
                # the order rotates from round to round: the first call after the other rank's turn
                # finds the caches cold, and no row is always that one
                order = local[r % len(local) :] + local[: r % len(local)]
                got = {}
                for name in order:
                    got[name] = once(calls[name], number)
                    times[name] = min(times[name], got[name])
                ratios.append(got[local[0]] / got[local[1]])
        for name, f in calls.items():
            if name not in local:
                dist.barrier()
                times[name] = min(times[name], once(f, number))
    params = sum(p.numel() for p in model.parameters())
    ratios.sort()
    return {"times": times, "params": params, "tensors": len(lm), "median_ratio": ratios[len(ratios) // 2]}


def _ranks(quick: bool, world: int = 2) -> list[dict[str, Any]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        env["OMP_NUM_THREADS"] = "1"
        args = [sys.executable, __file__, "--worker", *(["--quick"] if quick else [])]
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        so, se = p.communicate(timeout=600)
        lines = [ln for ln in so.splitlines() if ln.startswith(MARK)]
        if p.returncode != 0 or len(lines) != 1:
            msg = f"a rank failed (exit {p.returncode}):\n{so[-2000:]}\n{se[-4000:]}"
            raise RuntimeError(msg)
        out.append(json.loads(lines[0][len(MARK) :]))
    return out


def run(quick: bool) -> str:
    """The markdown section of this benchmark (timings of rank 0; both ranks' ratios)."""
    ranks = _ranks(quick)
    lines = []
    tables = []
    for i, c0 in enumerate(ranks[0]["configs"]):
        cs = [r["configs"][i] for r in ranks]
        ema = [
            c["times"]["fk.lerp(ema, model, t, out=ema)"] / c["times"]["torch._foreach_lerp_ over the local shards"]
            for c in cs
        ]
        ema_off = [
            c["times"]["the same fk.lerp, each DTensor judged on its own (spec path off)"]
            / c["times"]["torch._foreach_lerp_ over the local shards"]
            for c in cs
        ]
        hand = [c["times"][CHECKED] / c["times"]["torch._foreach_lerp_ over the local shards"] for c in cs]
        over_hand = [c["times"]["fk.lerp(ema, model, t, out=ema)"] / c["times"][CHECKED] for c in cs]
        norm_extra = [
            (c["times"]["fk.norm(model) under torch.no_grad()"] - c["times"]["local sums of squares, no all-reduce"])
            / c["times"]["dist.all_reduce of one scalar"]
            for c in cs
        ]
        grad_extra = [
            (
                c["times"]["fk.norm(model)"]
                - c["times"]["local sums of squares through to_local(), differentiable, no all-reduce"]
            )
            / c["times"]["dist.all_reduce of one scalar"]
            for c in cs
        ]
        over_floor = [
            c["times"]["fk.norm(model) under torch.no_grad()"]
            / c["times"]["floor: local sums of squares, one dist.all_reduce, sqrt"]
            for c in cs
        ]
        grad_over_floor = [
            c["times"]["fk.norm(model)"] / c["times"]["floor, differentiable: the same through to_local()"] for c in cs
        ]
        med = [c["median_ratio"] for c in cs]
        verdict = "met" if max(ema) <= 1.1 else "**not met**"
        lines.append(
            f"| {c0['params']:,} | {c0['tensors']} | {ema[0]:.2f}x / {ema[1]:.2f}x | {med[0]:.2f}x / {med[1]:.2f}x "
            f"| {verdict} | {ema_off[0]:.2f}x / {ema_off[1]:.2f}x | {hand[0]:.2f}x / {hand[1]:.2f}x "
            f"| {over_hand[0]:.2f}x / {over_hand[1]:.2f}x "
            f"| {norm_extra[0]:.2f} / {norm_extra[1]:.2f} | {grad_extra[0]:.2f} / {grad_extra[1]:.2f} "
            f"| {over_floor[0]:.2f}x / {over_floor[1]:.2f}x | {grad_over_floor[0]:.2f}x / {grad_over_floor[1]:.2f}x |"
        )
        rows = "\n".join(f"| {name} | {sec * 1e6:,.1f} µs |" for name, sec in c0["times"].items())
        tables.append(f"Rank 0, {c0['params']:,} parameters:\n\n| call | best time per call |\n|---|---|\n{rows}\n")
    body = "\n".join(lines)
    header = (
        "| parameters | tensors per rank | EMA step / `_foreach_lerp_`, best, rank 0 / rank 1 | paired median "
        "| ≤ 1.1x (best) | spec path off / `_foreach_lerp_`, best "
        "| checked hand loop / `_foreach_lerp_`, best | EMA step / checked hand loop, best "
        "| norm extra, no_grad, in all-reduces | differentiable norm extra "
        "| norm / floor, no_grad | norm / floor, differentiable |\n"
        "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"
    )
    return f"""## Sharded models: FSDP2 EMA step and global norm (2 gloo ranks, CPU)

FSDP2 `nn.Sequential`s of Linear layers, two ranks on this machine, each rank holding half of
every tensor. The EMA step `fk.lerp(ema, model, t, out=ema)` against `torch._foreach_lerp_` over
the same local shards (issue #26's target: at most 1.1x), and `fk.norm(model)` minus the local sums
of squares in units of one `dist.all_reduce` of one scalar (target: about 1): under `no_grad` (a
gradient's norm, clipping, logging: one eager all-reduce) against the sums of the plain local
shards, and with autograd recording (the parameters require grad: DTensor's autograd-aware
redistribution, so that the norm has a gradient) against the same sums through the differentiable
`to_local()`. The norm and its references run on both ranks at once. "norm / floor" divides
`fk.norm(model)` by the least a global norm costs, timed alike on both ranks at once: the same local
sums, one `dist.all_reduce` of their total and its square root (so that a rank waiting for the other,
which the two ranks sharing two cores cannot avoid, is in both). The EMA step and its
reference make no collective, so they are timed on one rank at a time while the other waits at a
barrier (the two ranks share this machine's two cores), in an order that rotates from round to
round (the first call after the other rank's turn finds the caches cold); "best" is the ratio of
the best times, "paired median" the median over rounds of the ratio within a round. "spec path
off" is the same EMA step with `functorkit.adapters._dtensor_columns.FAST` off: each DTensor's
mesh and placements read through its properties and each pair's global shape compared, instead
of once per distinct `DTensorSpec`. "checked hand loop" is the least a call that walks both
modules at each step and makes SPEC 14's checks costs, written by hand: `list(parameters())` of
both modules, each pair's mesh, placements and global shape compared, then bench_arith's
`_checked_ema` over the local shards (lengths, types, shapes, dtypes, devices, floating and dense
tensors, no inference tensor, no overlapping bytes; one `_foreach_lerp_` with autograd off).
The EMA step pays a fixed cost per call (walking both
modules' trees and checking them, a few hundred microseconds for these 13-module trees, about
twice that right after the update has streamed the model through the caches), which the small
model shows and a model of GPT-2-small's size hides.

{header}
{body}

{chr(10).join(tables)}"""


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker("--quick" in sys.argv)
    else:
        print(run("--quick" in sys.argv))
