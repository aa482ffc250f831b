"""Fit a small torch model with SciPy's L-BFGS-B over functorkit's flat vector.

SciPy's optimisers work on one float64 NumPy vector; the model is a float32
``torch.nn.Module``. ``fk.destructure`` gives the flat vector and ``re``, and
the policy says, explicitly, what precision the model computes in:

* ``policy="flat"``: the rebuilt parameters take ``p``'s dtype: the whole
  forward and backward pass runs in float64 (inputs are cast to float64 too);
* ``policy="model"``: every parameter is cast back to the model's own
  float32, so the model computes in float32 while SciPy keeps float64.

Gradients come from torch autograd through ``re(p)``; the solution is written
back into the live float32 module with ``fk.load_into``. Run::

    python examples/lbfgs_fit.py                 # both policies, with re.explain
    python examples/lbfgs_fit.py --policy model --maxiter 500

The tutorial ``docs/lbfgs.md`` walks through this file.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.optimize
import torch

import functorkit as fk


@dataclass
class FitResult:
    policy: str
    loss_start: float  # at the initial parameters, in the precision the policy computes in
    loss_end: float  # SciPy's final loss, same precision
    loss_live: float  # the live float32 module after fk.load_into, evaluated in float32
    iterations: int
    evaluations: int
    message: str
    explain: str  # re.explain(p) for SciPy's float64 p under this policy
    rebuilt_dtypes: list[torch.dtype]  # the dtypes of re(p)'s parameters
    model: torch.nn.Module  # the live module, holding the fitted values


def make_problem(seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A 1 -> 16 -> 16 -> 1 tanh MLP (float32) and a smooth 1-D regression target."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(1, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 1),
    )
    x = torch.linspace(-2.0, 2.0, 128).unsqueeze(1)
    y = torch.sin(2.0 * x) + 0.1 * x**2
    return model, x, y


def mse(model: Any, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.mean((model(x) - y) ** 2)


def fit(policy: str, *, maxiter: int = 200, seed: int = 0) -> FitResult:
    """Minimise the mean squared error of the MLP with L-BFGS-B under `policy` ("flat" or "model")."""
    model, x, y = make_problem(seed)
    flat, re = fk.destructure(model)  # strict: flat is float32, like the model
    x0 = flat.to(torch.float64).numpy()  # SciPy works in float64: an explicit conversion
    if policy == "flat":  # the model will compute in float64: so must its inputs
        x, y = x.to(torch.float64), y.to(torch.float64)

    def loss_and_grad(p_np: np.ndarray) -> tuple[float, np.ndarray]:
        p = torch.from_numpy(p_np).requires_grad_(True)  # float64, shares p_np's memory
        loss = mse(re(p, policy=policy), x, y)
        loss.backward()  # gradients w.r.t. p, through the rebuilt module
        assert p.grad is not None
        return loss.item(), p.grad.numpy()  # float64 in both policies

    p0 = torch.from_numpy(x0)
    explain = str(re.explain(p0, policy=policy))
    rebuilt_dtypes = [w.dtype for w in re(p0, policy=policy).parameters()]
    loss_start = loss_and_grad(x0)[0]
    res = scipy.optimize.minimize(loss_and_grad, x0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})

    # write the solution back into the live module: its float32 nn.Parameters stay registered
    fk.load_into(model, re(torch.from_numpy(res.x), policy=policy))
    with torch.no_grad():
        loss_live = mse(model, x.float(), y.float()).item()
    return FitResult(
        policy=policy,
        loss_start=loss_start,
        loss_end=float(res.fun),
        loss_live=loss_live,
        iterations=int(res.nit),
        evaluations=int(res.nfev),
        message=str(res.message),
        explain=explain,
        rebuilt_dtypes=rebuilt_dtypes,
        model=model,
    )


def main(argv: list[str] | None = None) -> list[FitResult]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--maxiter", type=int, default=200, help="L-BFGS-B iterations at most (default 200)")
    parser.add_argument("--policy", choices=["flat", "model", "both"], default="both")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch intra-op threads (default 1: a model this small gains nothing)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    policies = ["flat", "model"] if args.policy == "both" else [args.policy]
    results = []
    for policy in policies:
        r = fit(policy, maxiter=args.maxiter, seed=args.seed)
        print(f"policy={policy!r}: re.explain(p) for SciPy's float64 p")
        print(r.explain)
        print(
            f"  loss {r.loss_start:.4g} -> {r.loss_end:.4g} ({r.loss_start / r.loss_end:.0f}x) in "
            f"{r.iterations} iterations, {r.evaluations} evaluations ({r.message})"
        )
        print(f"  live float32 module after fk.load_into: loss {r.loss_live:.4g}\n")
        results.append(r)
    return results


if __name__ == "__main__":
    main()
