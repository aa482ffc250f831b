"""Fit a small torch model with SciPy's L-BFGS-B over functorkit's flat vector.

SciPy's optimisers work on one float64 NumPy vector; the model is a float32
``torch.nn.Module``. ``fk.destructure`` gives the flat vector and ``re``, and
the policy says, explicitly, what precision the model computes in:

* ``policy="flat"``: the rebuilt parameters take ``p``'s dtype: the whole
  forward and backward pass runs in float64 (inputs are cast to float64 too);
* ``policy="model"``: every parameter is cast back to the model's own
  float32, so the model computes in float32 while SciPy keeps float64.

Gradients come from torch autograd through ``re(p)``. Run::

    python examples/lbfgs_fit.py            # both policies, with re.explain
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import scipy.optimize
import torch

import functorkit as fk


@dataclass
class FitResult:
    policy: str
    loss_start: float
    loss_end: float
    iterations: int
    explain: str


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


def fit(policy: str, *, maxiter: int = 200, seed: int = 0) -> FitResult:
    """Minimise the mean squared error of the MLP with L-BFGS-B under `policy`."""
    model, x, y = make_problem(seed)
    flat, re = fk.destructure(model)  # strict: flat is float32, like the model
    x0 = flat.to(torch.float64).numpy()  # SciPy works in float64: an explicit conversion
    if policy == "flat":  # the model will compute in float64: so must its inputs
        x, y = x.to(torch.float64), y.to(torch.float64)

    def loss_and_grad(p_np: np.ndarray) -> tuple[float, np.ndarray]:
        p = torch.from_numpy(p_np).requires_grad_(True)  # float64, no copy
        m = re(p, policy=policy)
        loss = torch.mean((m(x) - y) ** 2)
        loss.backward()
        assert p.grad is not None
        return loss.item(), p.grad.numpy().copy()

    explain = str(re.explain(torch.from_numpy(x0), policy=policy))
    loss_start = loss_and_grad(x0)[0]
    res = scipy.optimize.minimize(loss_and_grad, x0, jac=True, method="L-BFGS-B", options={"maxiter": maxiter})
    return FitResult(policy, loss_start, float(res.fun), int(res.nit), explain)


def main(argv: list[str] | None = None) -> list[FitResult]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maxiter", type=int, default=200)
    args = parser.parse_args(argv)
    results = []
    for policy in ("flat", "model"):
        r = fit(policy, maxiter=args.maxiter)
        print(f"policy={policy!r}: what re(p) computes in\n{r.explain}")
        print(f"  loss {r.loss_start:.4g} -> {r.loss_end:.4g} in {r.iterations} L-BFGS-B iterations\n")
        results.append(r)
    return results


if __name__ == "__main__":
    main()
