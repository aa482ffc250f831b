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

(c) ``fk.allclose(a, b)`` and ``fk.all_finite(a)`` over one model of the 148 arrays of GPT-2
small (the stack table's width) against the hand loop over leaves flattened in advance with the
best single calls: ``all(np.allclose(x, y) ...)`` / ``all(torch.allclose(x, y) ...)``, and
``all(np.isfinite(x).all() ...)`` / ``torch.stack([torch.isfinite(x).all() ...]).all()`` (one host
synchronisation on torch). functorkit also records both trees and compares their structure.
Target: at most 1.2x.

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


def compare_table(d: int, rounds: int) -> tuple[str, dict[str, float]]:
    a, b = _models(d, 1)[0], fk.copy(_models(d, 1)[0])
    la, lb = fk.leaves(a), fk.leaves(b)
    calls: dict[str, Callable[[], Any]] = {
        "fk.allclose(a, b), NumPy": lambda: fk.allclose(a, b),
        "hand loop np.allclose, NumPy": lambda: all(np.allclose(x, y) for x, y in zip(la, lb, strict=True)),
        "fk.all_finite(a), NumPy": lambda: bool(fk.all_finite(a)),
        "hand loop np.isfinite(x).all(), NumPy": lambda: all(np.isfinite(x).all() for x in la),
    }
    if importlib.util.find_spec("torch") is not None:
        import torch

        ta, tb = fk.fmap(torch.from_numpy, a), fk.fmap(torch.from_numpy, b)
        tla, tlb = fk.leaves(ta), fk.leaves(tb)
        calls["fk.allclose(a, b), torch"] = lambda: fk.allclose(ta, tb)
        calls["hand loop torch.allclose, torch"] = lambda: all(
            torch.allclose(x, y) for x, y in zip(tla, tlb, strict=True)
        )
        calls["fk.all_finite(a), torch"] = lambda: bool(fk.all_finite(ta))
        calls["hand loop torch.isfinite(x).all(), torch"] = lambda: bool(
            torch.stack([torch.isfinite(x).all() for x in tla]).all()
        )
    res = best_of(calls, rounds, target_s=0.0, settle_s=0.05)
    rows = ["| contender | ms | vs hand loop |", "|---|---:|---:|"]
    for backend in ("NumPy", "torch"):
        for fk_name, hand in (
            ("fk.allclose(a, b)", "hand loop np.allclose" if backend == "NumPy" else "hand loop torch.allclose"),
            (
                "fk.all_finite(a)",
                "hand loop np.isfinite(x).all()" if backend == "NumPy" else "hand loop torch.isfinite(x).all()",
            ),
        ):
            if f"{hand}, {backend}" in res:
                ref = res[f"{hand}, {backend}"]
                rows.append(_row(f"`{fk_name}`, {backend}", res[f"{fk_name}, {backend}"], ref))
                rows.append(_row(f"{hand}, {backend}", ref, ref))
    n_values = sum(x.size for x in la)
    title = f"one model of 148 arrays (GPT-2 small at width {d}: {n_values / 1e6:.1f} M float32 values)"
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
    t_compare, r_compare = compare_table(d, rounds)
    cmp_ratios = [
        f"{fname} {backend} {r_compare[f'{fname}, {backend}'] / r_compare[f'{hand}, {backend}']:.2f}x"
        for fname, backend, hand in (
            ("fk.allclose(a, b)", "NumPy", "hand loop np.allclose"),
            ("fk.all_finite(a)", "NumPy", "hand loop np.isfinite(x).all()"),
            ("fk.allclose(a, b)", "torch", "hand loop torch.allclose"),
            ("fk.all_finite(a)", "torch", "hand loop torch.isfinite(x).all()"),
        )
        if f"{fname}, {backend}" in r_compare
    ]
    ratios = [f"NumPy {r_stack['fk.stack(models), NumPy'] / r_stack['hand loop np.stack, NumPy']:.2f}x"]
    if "fk.stack(models), torch" in r_stack:
        ratios.append(f"torch {r_stack['fk.stack(models), torch'] / r_stack['hand loop torch.stack, torch']:.2f}x")
    rep = r_replace["fk.replace(tree, {'k50.k50': new})"] / r_replace["fk.fmap(lambda x: x, tree)"]
    return f"""## Tree tools: stack, replace, allclose, all_finite

`fk.stack` against a hand loop of `np.stack`/`torch.stack` over leaves flattened in advance (the
hand loop checks nothing and builds no tree; target at most 1.2x): {", ".join(ratios)}. `fk.replace`
of one leaf in a 10,000-leaf tree against one `fk.fmap` over it (target at most 2x): {rep:.2f}x.
`fk.allclose`/`fk.all_finite` against hand loops of the best single calls per leaf (target at most
1.2x): {", ".join(cmp_ratios)}. Best of {rounds} rounds, all contenders interleaved in one process.

### (a) `fk.stack`: {t_stack}

### (b) `fk.replace` of one leaf, 10,000 leaves (a dict of 100 dicts of 100 arrays)

{t_replace}

### (c) `fk.allclose` and `fk.all_finite`: {t_compare}
"""


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
