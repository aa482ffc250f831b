"""One training step on a flat parameter vector: torch.compile'd vs eager vs torch.func.functional_call.

Workload: an MLP (64 -> 256 -> 256 -> 10, tanh; 85 k float32 parameters; quick: 32 -> 64 -> 64 -> 10),
a batch of 128 (quick: 32), mean squared error. One step is: loss, its gradient, ``p - lr * g``.

Contenders, all interleaved in one process (best of N rounds, garbage collector off):

- ``fk eager``: ``loss(p) = mse(re(p)(x), y)``, ``torch.autograd.grad`` with respect to the flat
  vector ``p``;
- ``fk + torch.compile``: the same function through ``torch.compile(fullgraph=True)`` (Inductor);
  the one-time compile is reported separately;
- ``functional_call``: ``torch.func.functional_call(net, params, (x,))`` on the dict of
  parameters, gradients with respect to each, each updated (the reference, ratio 1.00);
- ``functional_call + torch.compile``: the same, compiled.

Run: ``python benchmarks/run.py --only compile [--quick]``.
"""

from __future__ import annotations

import time
from typing import Any

from _timing import best_of

import functorkit as fk


def _setup(quick: bool) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    width, inp, batch = (64, 32, 32) if quick else (256, 64, 128)
    net = torch.nn.Sequential(
        torch.nn.Linear(inp, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, width),
        torch.nn.Tanh(),
        torch.nn.Linear(width, 10),
    )
    return {"torch": torch, "net": net, "x": torch.randn(batch, inp), "y": torch.randn(batch, 10)}


def contenders(quick: bool) -> tuple[dict[str, Any], dict[str, float], int]:
    s = _setup(quick)
    torch, net, x, y = s["torch"], s["net"], s["x"], s["y"]
    mse = torch.nn.functional.mse_loss
    lr = 1e-3
    flat, re = fk.destructure(net)

    def loss_flat(p: Any) -> Any:
        return mse(re(p)(x), y)

    names = [k for k, _ in net.named_parameters()]

    def loss_dict(params: dict[str, Any]) -> Any:
        return mse(torch.func.functional_call(net, params, (x,)), y)

    compiled_flat = torch.compile(loss_flat, fullgraph=True)
    compiled_dict = torch.compile(loss_dict, fullgraph=True)
    state = {"p": flat.detach().clone().requires_grad_(True)}
    pstate = {"params": {k: v.detach().clone().requires_grad_(True) for k, v in net.named_parameters()}}

    def step_flat(loss: Any) -> Any:
        def step() -> None:
            p = state["p"]
            (g,) = torch.autograd.grad(loss(p), p)
            with torch.no_grad():
                p -= lr * g

        return step

    def step_dict(loss: Any) -> Any:
        def step() -> None:
            params = pstate["params"]
            gs = torch.autograd.grad(loss(params), [params[k] for k in names])
            with torch.no_grad():
                for k, g in zip(names, gs, strict=True):
                    params[k] -= lr * g

        return step

    compile_s = {}
    for name, fn, arg in (
        ("fk + torch.compile", compiled_flat, state["p"]),
        ("functional_call + torch.compile", compiled_dict, pstate["params"]),
    ):
        t0 = time.perf_counter()
        fn(arg)  # the first call compiles (forward and backward graphs)
        torch.autograd.grad(fn(arg), [arg] if name.startswith("fk") else list(arg.values()))
        compile_s[name] = time.perf_counter() - t0
    calls = {
        "functional_call": step_dict(loss_dict),
        "functional_call + torch.compile": step_dict(compiled_dict),
        "fk eager": step_flat(loss_flat),
        "fk + torch.compile": step_flat(compiled_flat),
    }
    return calls, compile_s, len(re)


def run(quick: bool) -> str:
    try:
        import torch
    except ImportError:
        return "## Compiled training step\n\ntorch is not installed: skipped.\n"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        calls, compile_s, n = contenders(quick)
        best = best_of(calls, rounds=3 if quick else 7, target_s=0.02)
    finally:
        torch.set_num_threads(threads)
    ref = best["functional_call"]
    rows = "\n".join(
        f"| {'**' + k + '**' if k.startswith('fk') else k} | {t * 1e6:.0f} | {t / ref:.2f} | {compile_s[k]:.1f} s |"
        if k in compile_s
        else f"| {'**' + k + '**' if k.startswith('fk') else k} | {t * 1e6:.0f} | {t / ref:.2f} | - |"
        for k, t in best.items()
    )
    size = f"{n} float32 parameters" + (" (**quick**: a smaller MLP)" if quick else "")
    return f"""## Compiled training step on a flat vector

One SGD step (loss, gradient, update) of an MLP with {size}
on CPU, single-threaded: `re(p)` + forward under `torch.compile(fullgraph=True)` (Inductor) against the same
eager, and against `torch.func.functional_call` on the dict of parameters (ratio 1.00), eager and compiled.
Best of interleaved rounds; the compile column is the one-time cost of the first forward and backward.

| step | µs | vs functional_call | first call (compile) |
|---|---:|---:|---:|
{rows}
"""
