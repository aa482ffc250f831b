"""Merge methods on Hugging Face-layout checkpoints, on torch modules in memory, and on a JAX model.

The example writes three Llama-shaped checkpoints (``model.layers.0.self_attn.q_proj.weight``
...) as sharded safetensors with a ``model.safetensors.index.json``, the layout
``save_pretrained`` writes: a random base and two "fine-tuned" perturbations of it. Then:

1. out of core: opens them lazily with ``fk.open`` and writes TIES, DARE, slerp, model stock
   and task arithmetic merges with ``fk.save`` (per-layer schedules as path globs);
2. in memory on torch: the same checkpoints loaded into ``torch.nn.Module`` objects, merged
   with the same calls, and compared with the files of step 1;
3. on JAX: the same merge of a JAX model (a dict of ``jax.Array``; equinox modules work the same
   way once registered, but equinox is not a dependency of this example).

    python examples/merge_methods.py                 # small (a few MB per checkpoint)
    python examples/merge_methods.py --out ./merges  # keep the files
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import functorkit as fk

#: (layers, hidden, intermediate, vocabulary)
SIZES = {"tiny": (2, 16, 40, 64), "small": (4, 128, 344, 2000)}


def llama_like(n_layer: int, hidden: int, inter: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """A random state dict with Llama's keys and shapes."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return np.asarray(0.02 * rng.standard_normal(shape), dtype=np.float32)

    sd: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(n_layer):
        p = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{name}.weight"] = normal(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        sd[p + "input_layernorm.weight"] = np.ones(hidden, np.float32)
        sd[p + "post_attention_layernorm.weight"] = np.ones(hidden, np.float32)
    sd["model.norm.weight"] = np.ones(hidden, np.float32)
    sd["lm_head.weight"] = normal(vocab, hidden)
    return sd


def write_checkpoints(folder: Path, size: str) -> list[Path]:
    base = llama_like(*SIZES[size], seed=0)
    rng = np.random.default_rng(1)
    paths = []
    for i, name in enumerate(["base", "ft1", "ft2"]):
        model = (
            base
            if i == 0
            else {k: v + np.float32(1e-3 * i) * rng.standard_normal(v.shape, dtype=np.float32) for k, v in base.items()}
        )
        paths.append(folder / name)
        fk.save(paths[-1], model, shard_size="10KB" if size == "tiny" else "5MB")  # sharded + index
    return paths


#: the merges, each a function of (base, [ft1, ft2]); the same calls on every backend
MERGES: dict[str, Any] = {
    "ties": lambda b, ms: fk.ties(b, ms, [0.6, 0.4], density={"*mlp*": 0.3, "*": 0.6}),
    "dare": lambda b, ms: fk.dare(b, ms, [0.5, 0.5], density=0.5, seed=42),
    "dare_ties": lambda b, ms: fk.dare(b, ms, [0.5, 0.5], density=0.5, seed=42, sign_consensus=True),
    "slerp": lambda b, ms: fk.slerp(b, ms[0], {"model.layers.0.*": 0.2, "*": 0.5}),
    "model_stock": lambda b, ms: fk.model_stock(b, ms),
    "task_arithmetic": lambda b, ms: fk.task_arithmetic(b, ms, [1.0, 1.0], scale=0.5),
}


@functools.cache
def _llama_class() -> Any:
    """A torch module class whose state-dict keys are Llama's (no forward pass needed here);
    defined once, so that every instance has the same node types."""
    import torch

    nn = torch.nn

    class Attn(nn.Module):
        def __init__(self, hidden: int) -> None:
            super().__init__()
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(self, name, nn.Linear(hidden, hidden, bias=False))

    class Mlp(nn.Module):
        def __init__(self, hidden: int, inter: int) -> None:
            super().__init__()
            self.gate_proj = nn.Linear(hidden, inter, bias=False)
            self.up_proj = nn.Linear(hidden, inter, bias=False)
            self.down_proj = nn.Linear(inter, hidden, bias=False)

    class Layer(nn.Module):
        def __init__(self, hidden: int, inter: int) -> None:
            super().__init__()
            self.self_attn, self.mlp = Attn(hidden), Mlp(hidden, inter)
            self.input_layernorm = nn.RMSNorm(hidden)
            self.post_attention_layernorm = nn.RMSNorm(hidden)

    class Body(nn.Module):
        def __init__(self, n_layer: int, hidden: int, inter: int, vocab: int) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList([Layer(hidden, inter) for _ in range(n_layer)])
            self.norm = nn.RMSNorm(hidden)

    class Llama(nn.Module):
        def __init__(self, n_layer: int, hidden: int, inter: int, vocab: int) -> None:
            super().__init__()
            self.model = Body(n_layer, hidden, inter, vocab)
            self.lm_head = nn.Linear(hidden, vocab, bias=False)

    return Llama


def llama_module(n_layer: int, hidden: int, inter: int, vocab: int) -> Any:
    return _llama_class()(n_layer, hidden, inter, vocab)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    say = (lambda *a: None) if args.quiet else print
    result: dict[str, Any] = {"max_diff_torch": {}, "max_diff_jax": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.out or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        paths = write_checkpoints(folder, args.size)
        result["paths"] = paths

        # 1. out of core: lazy Dask arrays over the files, computed and written by fk.save
        base = fk.open(paths[0])
        fts = [fk.open(p, like=base) for p in paths[1:]]
        for name, merge in MERGES.items():
            fk.save(folder / name, merge(base, fts), shard_size="5MB")
            result[name] = folder / name
        say(f"wrote {', '.join(MERGES)} under {folder}")

        # 2. the same merges on torch modules in memory
        try:
            import torch
        except ImportError:
            return result
        mods = []
        for p in paths:
            m = llama_module(*SIZES[args.size])
            m.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in fk.state_dict(fk.load(p)).items()})
            mods.append(m)
        for name, merge in MERGES.items():
            merged = merge(mods[0], mods[1:])  # a new Llama module
            on_disk = fk.state_dict(fk.load(folder / name))
            diff = max(
                float((v.detach() - torch.from_numpy(np.asarray(on_disk[k]))).abs().max())
                for k, v in merged.state_dict().items()
            )
            result["max_diff_torch"][name] = diff
        say("torch modules vs the files, largest difference:", result["max_diff_torch"])

        # 3. a JAX model (a dict of jax.Array)
        try:
            import jax.numpy as jnp
        except ImportError:
            return result
        jms = [fk.fmap(jnp.asarray, fk.load(p)) for p in paths]
        for name, merge in MERGES.items():
            merged = merge(jms[0], jms[1:])
            on_disk = fk.load(folder / name)
            diff = max(
                float(np.abs(np.asarray(a) - b).max())
                for a, b in zip(fk.leaves(merged), fk.leaves(on_disk), strict=True)
            )
            result["max_diff_jax"][name] = diff
        say("JAX model vs the files, largest difference:", result["max_diff_jax"])
    return result


if __name__ == "__main__":
    main()
