"""An ensemble of 8 small networks trained together, one vmapped step at a time, on torch and on JAX.

``fk.stack`` turns 8 models into one whose arrays have a leading axis of 8;
``torch.func.vmap`` (with ``torch.func.functional_call``) or ``jax.vmap``
then runs the training step of all members at once; ``fk.unstack`` gives the
8 trained models back. The members fit ``y = sin(2x)`` from different random
initialisations.

Run it with ``python examples/ensemble.py [--members 8] [--steps 300]`` (needs
torch and/or JAX; a missing library is skipped).
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

import numpy as np

import functorkit as fk

LR = 0.05


def data(n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    x = np.linspace(-2.0, 2.0, n, dtype=np.float32)[:, None]
    return x, np.sin(2.0 * x)


def train_torch(members: int, steps: int) -> dict[str, Any]:
    """Train `members` torch MLPs in one vmapped step; the per-member losses before and after."""
    import torch
    from torch import nn
    from torch.func import functional_call, grad_and_value, vmap

    def member(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))

    models = [member(k) for k in range(members)]
    with torch.no_grad():  # fresh arrays for the ensemble, no autograd history
        stacked = fk.stack(models)  # a Sequential whose tensors have a leading axis of `members`
    # the stacked arrays by state-dict name (`0.weight`, ...): what functional_call takes
    params = {path.dotted: x for path, x in fk.leaves_with_path(stacked)}
    x, y = (torch.from_numpy(a) for a in data())

    def loss(p: dict[str, Any], xb: Any, yb: Any) -> Any:
        return ((functional_call(models[0], p, (xb,)) - yb) ** 2).mean()

    step = vmap(grad_and_value(loss), in_dims=(0, None, None))  # every member at once
    _, before = step(params, x, y)
    for _ in range(steps):
        grads, _ = step(params, x, y)
        params = fk.sub(params, fk.scale(LR, grads))
    trained = fk.unstack(fk.replace(stacked, params))  # `0.weight` etc. are paths too
    with torch.no_grad():
        after = [float(((m(x) - y) ** 2).mean()) for m in trained]
    return {"before": before.numpy(), "after": np.array(after), "stacked": stacked, "trained": trained}


def train_jax(members: int, steps: int) -> dict[str, Any]:
    """Train `members` JAX MLPs (nested dicts) in one vmapped, jitted step."""
    import jax
    import jax.numpy as jnp

    def member(seed: int) -> dict[str, Any]:
        k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
        return {
            "l1": {"w": jax.random.uniform(k1, (1, 32), minval=-1.0, maxval=1.0), "b": jnp.zeros(32)},
            "l2": {"w": jax.random.normal(k2, (32, 1)) / jnp.sqrt(32.0), "b": jnp.zeros(1)},
        }

    def forward(p: dict[str, Any], xb: Any) -> Any:
        h = jnp.tanh(xb @ p["l1"]["w"] + p["l1"]["b"])
        return h @ p["l2"]["w"] + p["l2"]["b"]

    def loss(p: dict[str, Any], xb: Any, yb: Any) -> Any:
        return jnp.mean((forward(p, xb) - yb) ** 2)

    stacked = fk.stack([member(k) for k in range(members)])
    x, y = (jnp.asarray(a) for a in data())
    value_and_grad = jax.jit(jax.vmap(jax.value_and_grad(loss), in_axes=(0, None, None)))
    params = stacked
    before, _ = value_and_grad(params, x, y)
    for _ in range(steps):
        _, grads = value_and_grad(params, x, y)
        params = fk.sub(params, fk.scale(LR, grads))
    trained = fk.unstack(params)
    after = [float(loss(m, x, y)) for m in trained]
    return {"before": np.asarray(before), "after": np.array(after), "stacked": stacked, "trained": trained}


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    out = {}
    for name, fn in (("torch", train_torch), ("jax", train_jax)):
        if importlib.util.find_spec(name) is None:
            if not args.quiet:
                print(f"{name}: not installed, skipped")
            continue
        res = fn(args.members, args.steps)
        out[name] = res
        if not args.quiet:
            print(f"== {name}: {args.members} members, {args.steps} vmapped steps")
            print(fk.summary(res["stacked"]))
            for k, (b, a) in enumerate(zip(res["before"], res["after"])):
                print(f"member {k}: loss {b:.4f} -> {a:.4f}")
    return out


if __name__ == "__main__":
    main()
