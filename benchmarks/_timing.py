"""Timing shared by the benchmark modules: best-of-N, contenders interleaved round after round."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any


def once(fn: Callable[[], Any], number: int) -> float:
    """Mean seconds per call of `number` back-to-back calls, garbage collector off."""
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number
    finally:
        if gc_was:
            gc.enable()


def best_of(
    calls: dict[str, Callable[[], Any]],
    rounds: int,
    target_s: float = 0.004,
    settle_s: float = 0.0,
    max_number: int = 20_000,
) -> dict[str, float]:
    """Best time per call of each callable, all interleaved round after round.

    Each callable is warmed up once, then repeated enough times per round to
    take about `target_s`. `settle_s`: pause after each timing, so that the
    worker threads a torch or JAX call leaves spinning (OpenMP / Eigen pools
    busy-wait after a parallel region) do not slow down whatever is timed next
    on a machine with few cores.
    """
    numbers = {}
    for name, fn in calls.items():
        fn()  # warm up (imports, caches, generated code)
        t = once(fn, 1)
        numbers[name] = max(1, min(max_number, int(target_s / max(t, 1e-9))))
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for name, fn in calls.items():
            best[name] = min(best[name], once(fn, numbers[name]))
            if settle_s:
                time.sleep(settle_s)
    return best


def switched_off(mod: Any, attr: str, value: Any, fn: Callable[[], Any]) -> Callable[[], Any]:
    """`fn` with the fast path behind ``mod.attr`` switched off (set to `value`) for the call, then
    restored (the benchmarks' on/off rows)."""

    def g() -> Any:
        saved = getattr(mod, attr)
        setattr(mod, attr, value)
        try:
            return fn()
        finally:
            setattr(mod, attr, saved)

    return g
