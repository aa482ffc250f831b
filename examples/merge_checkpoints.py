"""Merge checkpoints that need not fit in memory: model soup, task arithmetic, distance matrix.

The example writes three GPT-2-shaped checkpoints as sharded safetensors (a
random "base" model and two "fine-tuned" perturbations of it, with the
language-model head tied to the token embedding), opens them lazily with
``fk.open`` (Dask arrays over the files: nothing is read yet), builds two
merges with functorkit's arithmetic and writes them with ``fk.save``, which
computes and writes block by block. Finally it prints the distance between
every pair of checkpoints, all computed in one pass over the files.

    python examples/merge_checkpoints.py                 # small (a few MB per checkpoint)
    python examples/merge_checkpoints.py --size gpt2     # GPT-2 small: 124M parameters, ~500 MB each
    python examples/merge_checkpoints.py --out ./merges  # keep the files

The same program runs on a ``dask.distributed`` cluster: create a
``distributed.Client`` before calling ``main``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import dask
import numpy as np

import functorkit as fk

#: (layers, width, vocabulary, positions) of each size
SIZES = {"tiny": (2, 32, 500, 64), "small": (4, 128, 4000, 256), "gpt2": (12, 768, 50257, 1024)}


def gpt2_like(n_layer: int, n_embd: int, vocab: int, n_pos: int, seed: int) -> dict[str, Any]:
    """A random model with GPT-2's state-dict keys and shapes (``lm_head`` tied to ``wte``)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    def block() -> dict[str, Any]:
        return {
            "ln_1": {"weight": np.ones(n_embd, np.float32), "bias": np.zeros(n_embd, np.float32)},
            "attn": {
                "c_attn": {"weight": normal(n_embd, 3 * n_embd), "bias": np.zeros(3 * n_embd, np.float32)},
                "c_proj": {"weight": normal(n_embd, n_embd), "bias": np.zeros(n_embd, np.float32)},
            },
            "ln_2": {"weight": np.ones(n_embd, np.float32), "bias": np.zeros(n_embd, np.float32)},
            "mlp": {
                "c_fc": {"weight": normal(n_embd, 4 * n_embd), "bias": np.zeros(4 * n_embd, np.float32)},
                "c_proj": {"weight": normal(4 * n_embd, n_embd), "bias": np.zeros(n_embd, np.float32)},
            },
        }

    wte = normal(vocab, n_embd)
    transformer = {
        "wte": {"weight": wte},
        "wpe": {"weight": normal(n_pos, n_embd)},
        "h": [block() for _ in range(n_layer)],
        "ln_f": {"weight": np.ones(n_embd, np.float32), "bias": np.zeros(n_embd, np.float32)},
    }
    return {"transformer": transformer, "lm_head": {"weight": wte}}


def perturbed(model: dict[str, Any], scale: float, seed: int) -> dict[str, Any]:
    """`model` plus Gaussian noise of standard deviation `scale` on every parameter (ties kept)."""
    rng = np.random.default_rng(seed)
    return fk.fmap(lambda x: x + np.float32(scale) * rng.standard_normal(x.shape, dtype=np.float32), model)


def write_checkpoints(folder: Path, size: str, shard_size: str) -> list[Path]:
    """base, ft1, ft2 as sharded safetensors directories under `folder`."""
    base = gpt2_like(*SIZES[size], seed=0)
    paths = []
    for name, model in [("base", base), ("ft1", perturbed(base, 1e-3, 1)), ("ft2", perturbed(base, 2e-3, 2))]:
        paths.append(folder / name)
        fk.save(paths[-1], model, shard_size=shard_size, metadata={"name": name})
        del model
    return paths


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--shard-size", default="20MB", help='largest shard, e.g. "2GB" (default 20MB)')
    ap.add_argument("--out", type=Path, default=None, help="keep the files here (default: a temporary directory)")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    say = (lambda *a: None) if args.quiet else print

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        paths = write_checkpoints(folder, args.size, args.shard_size)
        say(f"wrote 3 {args.size} checkpoints in {time.perf_counter() - t0:.1f} s: {[p.name for p in paths]}")

        # open lazily: the first checkpoint gives the structure, the others must match it
        base = fk.open(paths[0])
        ft1, ft2 = (fk.open(p, like=base) for p in paths[1:])

        # model soup: the uniform average of the three
        t0 = time.perf_counter()
        fk.save(folder / "soup", fk.mean([base, ft1, ft2]), shard_size=args.shard_size)
        # task arithmetic: base + lambda * sum of task vectors (ft - base)
        tasks = fk.add(fk.sub(ft1, base), fk.sub(ft2, base))
        fk.save(folder / "task_arith", fk.add(base, fk.scale(0.5, tasks)), shard_size=args.shard_size)
        say(f"soup and task arithmetic written in {time.perf_counter() - t0:.1f} s")

        # the distance matrix: every pair in one dask.compute (each file read once in the pass)
        names = ["base", "ft1", "ft2", "soup", "task_arith"]
        models = [base, ft1, ft2, fk.open(folder / "soup", like=base), fk.open(folder / "task_arith", like=base)]
        pairs = [(i, j) for i in range(len(models)) for j in range(i + 1, len(models))]
        norms = dask.compute(*[fk.norm(fk.sub(models[i], models[j])) for i, j in pairs])
        dist = np.zeros((len(models), len(models)))
        for (i, j), d in zip(pairs, norms):
            dist[i, j] = dist[j, i] = float(d)
        say("\n||a - b||".ljust(12) + "".join(n.rjust(12) for n in names))
        for n, row in zip(names, dist):
            say(n.ljust(11) + "".join(f"{d:12.4f}" for d in row))
        return {"paths": paths, "soup": folder / "soup", "task_arith": folder / "task_arith", "names": names,
                "distances": dist}


if __name__ == "__main__":
    main()
