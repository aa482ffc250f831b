"""Tree tools: fk.stack of an ensemble, fk.replace of one leaf.

(a) ``fk.stack`` of 8 models with the 148 arrays of GPT-2 small (nested
dicts), at a reduced width so that 8 models and their stack fit a shared
machine's memory (full run: width 192 instead of 768, the vocabulary and depth
of GPT-2 small: 15.0 M float32 values, 60 MB per model; quick run: width 64).
Contenders, per backend (NumPy; torch CPU tensors sharing the NumPy memory):
``fk.stack(models)`` (record the 8 models, check structure, dtypes and
devices, stack every leaf, rebuild), and the hand loop over leaves flattened
in advance: ``[np.stack([m[j] for m in leaves]) for j in ...]`` (or
``torch.stack``), which checks nothing and builds no tree: the reference of
the ratio. Target: at most 1.2x.

(b) ``fk.replace`` of one leaf in a tree of 10,000 leaves (a dict of 100
dicts of 100 small NumPy arrays) against one ``fk.fmap`` of the identity over
the same tree. Target: at most 2x.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import best_of
from bench_arith import gpt2_shapes

import functorkit as fk


def _models(d: int, n: int) -> list[Any]:
    rng = np.random.default_rng(0)
    shapes = gpt2_shapes(d)
    return [fk.fmap(lambda s: rng.standard_normal(s, dtype=np.float32), shapes, is_leaf=_is_shape) for _ in range(n)]


def _is_shape(x: Any) -> bool:
    return type(x) is tuple and all(type(i) is int for i in x)


def _row(name: str, t: float, ref: float) -> str:
    return f"| {name} | {t * 1e3:.2f} | {t / ref:.2f}x |"


def stack_table(d: int, rounds: int) -> tuple[str, dict[str, float]]:
    models = _models(d, 8)
    leaves = [fk.leaves(m) for m in models]
    n_values = sum(x.size for x in leaves[0])
    calls: dict[str, Callable[[], Any]] = {
        "fk.stack(models), NumPy": lambda: fk.stack(models),
        "hand loop np.stack, NumPy": lambda: [np.stack([lv[j] for lv in leaves]) for j in range(len(leaves[0]))],
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        tmodels = [fk.fmap(torch.from_numpy, m) for m in models]
        tleaves = [fk.leaves(m) for m in tmodels]
        calls["fk.stack(models), torch"] = lambda: fk.stack(tmodels)
        calls["hand loop torch.stack, torch"] = lambda: [
            torch.stack([lv[j] for lv in tleaves]) for j in range(len(tleaves[0]))
        ]
    res = best_of(calls, rounds, target_s=0.0, settle_s=0.05)
    rows = ["| contender | ms | vs hand loop |", "|---|---:|---:|"]
    for backend, hand in (("NumPy", "hand loop np.stack, NumPy"), ("torch", "hand loop torch.stack, torch")):
        if hand in res:
            ref = res[hand]
            rows.append(_row(f"`fk.stack(models)`, {backend}", res[f"fk.stack(models), {backend}"], ref))
            rows.append(_row(hand.replace(", NumPy", "").replace(", torch", "") + f", {backend}", ref, ref))
    title = (
        f"8 models of 148 arrays (GPT-2 small at width {d}: {n_values / 1e6:.1f} M float32 values, "
        f"{4 * n_values / 1e6:.0f} MB each)"
    )
    return title + "\n\n" + "\n".join(rows), res


def replace_table(rounds: int) -> tuple[str, dict[str, float]]:
    tree = {f"k{i}": {f"k{j}": np.zeros(2) for j in range(100)} for i in range(100)}
    new = np.ones(2)
    calls: dict[str, Callable[[], Any]] = {
        "fk.replace(tree, {'k50.k50': new})": lambda: fk.replace(tree, {"k50.k50": new}),
        "fk.fmap(lambda x: x, tree)": lambda: fk.fmap(lambda x: x, tree),
    }
    res = best_of(calls, rounds, target_s=0.05)
    ref = res["fk.fmap(lambda x: x, tree)"]
    rows = ["| contender | ms | vs fmap |", "|---|---:|---:|"]
    rows += [_row(f"`{k}`", v, ref) for k, v in res.items()]
    return "\n".join(rows), res


def run(quick: bool) -> str:
    """The markdown section of this benchmark."""
    rounds = 2 if quick else 7
    d = 64 if quick else 192
    t_stack, r_stack = stack_table(d, rounds)
    t_replace, r_replace = replace_table(3 if quick else 15)
    ratios = [f"NumPy {r_stack['fk.stack(models), NumPy'] / r_stack['hand loop np.stack, NumPy']:.2f}x"]
    if "fk.stack(models), torch" in r_stack:
        ratios.append(f"torch {r_stack['fk.stack(models), torch'] / r_stack['hand loop torch.stack, torch']:.2f}x")
    rep = r_replace["fk.replace(tree, {'k50.k50': new})"] / r_replace["fk.fmap(lambda x: x, tree)"]
    return f"""## Tree tools: stack, replace

`fk.stack` against a hand loop of `np.stack`/`torch.stack` over leaves flattened in advance (the
hand loop checks nothing and builds no tree; target at most 1.2x): {", ".join(ratios)}. `fk.replace`
of one leaf in a 10,000-leaf tree against one `fk.fmap` over it (target at most 2x): {rep:.2f}x.
Best of {rounds} rounds, all contenders interleaved in one process.

### (a) `fk.stack`: {t_stack}

### (b) `fk.replace` of one leaf, 10,000 leaves (a dict of 100 dicts of 100 arrays)

{t_replace}
"""


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
