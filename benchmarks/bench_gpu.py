"""GPU: `fk.destructure` and `re.flatten(model, out=buf)` throughput against a device-to-device copy.

The issue's goal: on an NVIDIA GPU, flattening a model reaches at least 80% of
the throughput of one device-to-device copy of the same bytes (the physical
limit: every parameter byte is read once and written once). Measured for torch
CUDA and for CuPy, each where it is installed and a GPU is present; on a
machine without one, the section says so and no number is shown (a GPU row is
never reported without a GPU run).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import functorkit as fk

GOAL = 0.80


def _shapes(quick: bool) -> list[tuple[int, ...]]:
    """GPT-2-small-like parameter shapes (~124M floats in the full run, ~3M in the quick one)."""
    width = 256 if quick else 768
    vocab = 4096 if quick else 50257
    shapes: list[tuple[int, ...]] = [(vocab, width)]
    for _ in range(2 if quick else 12):
        shapes += [(width, 3 * width), (3 * width,), (width, width), (width,), (width, 4 * width), (4 * width,)]
        shapes += [(4 * width, width), (width,), (width,), (width,)]
    return shapes


def _best(fn: Callable[[], Any], sync: Callable[[], None], rounds: int) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def _rows(model: Any, device_copy: Callable[[], Any], sync: Callable[[], None], rounds: int) -> list[str]:
    flat, re = fk.destructure(model)
    buf = flat * 0
    floor = _best(device_copy, sync, rounds)
    nbytes = int(flat.shape[0]) * flat.dtype.itemsize
    out = []
    for name, fn in [
        ("fk.destructure(model)", lambda: fk.destructure(model)),
        ("re.flatten(model, out=buf)", lambda: re.flatten(model, out=buf)),
    ]:
        t = _best(fn, sync, rounds)
        share = floor / t
        out.append(
            f"| {name} | {nbytes / 2**20:,.0f} MiB | {t * 1e3:.2f} ms | {floor * 1e3:.2f} ms | {share:.0%} | "
            f"{'yes' if share >= GOAL else '**no**'} |"
        )
    return out


def _torch(quick: bool) -> tuple[str, list[str]] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    model = {f"p{i}": torch.randn(*s, device=dev) for i, s in enumerate(_shapes(quick))}
    n = sum(int(x.numel()) for x in model.values())
    src, dst = torch.randn(n, device=dev), torch.empty(n, device=dev)
    rows = _rows(model, lambda: dst.copy_(src), torch.cuda.synchronize, 3 if quick else 10)
    return torch.cuda.get_device_name(0), rows


def _cupy(quick: bool) -> tuple[str, list[str]] | None:
    try:
        import cupy
    except ImportError:
        return None
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
    except cupy.cuda.runtime.CUDARuntimeError:
        return None
    rng = cupy.random.default_rng(0)
    model = {f"p{i}": rng.standard_normal(s, dtype=cupy.float32) for i, s in enumerate(_shapes(quick))}
    n = sum(int(x.size) for x in model.values())
    src, dst = rng.standard_normal(n, dtype=cupy.float32), cupy.empty(n, dtype=cupy.float32)
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    return name, _rows(model, lambda: cupy.copyto(dst, src), cupy.cuda.Device().synchronize, 3 if quick else 10)


def run(quick: bool) -> str:
    lines = ["## GPU: flatten throughput against a device-to-device copy", "", __doc__.split("\n\n", 1)[1].strip(), ""]
    ran = False
    for lib, probe in [("torch CUDA", _torch), ("CuPy", _cupy)]:
        got = probe(quick)
        if got is None:
            when = f"{dt.datetime.now(dt.UTC):%Y-%m-%d}"
            lines.append(f"- {lib}: **not run**: no NVIDIA GPU (or no {lib}) on this machine ({when}).")
            continue
        ran = True
        device, rows = got
        lines += [
            "",
            f"### {lib} on {device}",
            "",
            "| operation | parameters | time | device copy | share of the copy's throughput | >= 80% |",
            "|---|---:|---:|---:|---:|:---:|",
            *rows,
        ]
    if not ran:
        lines += ["", "Run `python3 -m nox -s bench -- --only gpu` on a machine with an NVIDIA GPU to fill this in."]
    return "\n".join(lines) + "\n"
