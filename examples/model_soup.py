"""Model soups and task arithmetic on a small torch model, checked against state-dict loops.

A base model is fine-tuned three times on different tasks (a few SGD steps each, batch-norm
statistics moving). Then:

- **uniform soup** (Wortsman et al., 2022): the average of the fine-tuned models, buffers
  (batch-norm running statistics) included: ``fk.mean(models, trainable_only=False)``;
- **task arithmetic** (Ilharco et al., 2023): task vectors ``ft_i - base`` and the edited
  model ``base + lam * sum_i (ft_i - base)``: ``fk.sub`` and ``fk.lincomb``.

Each result is compared with the loop those papers' code writes over ``state_dict()``:
floating entries combined, integer entries (``num_batches_tracked``) taken from the first
model. Run: ``python examples/model_soup.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import functorkit as fk


def make_base() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))


def fine_tune(base: nn.Module, task: int, steps: int = 20) -> nn.Module:
    """A copy of `base` trained a few steps on a random regression task of its own."""
    model = copy.deepcopy(base).train()
    gen = torch.Generator().manual_seed(100 + task)
    x = torch.randn(64, 8, generator=gen)
    y = torch.randn(64, 3, generator=gen)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model.eval()


def soup_by_hand(models: list[nn.Module]) -> dict[str, torch.Tensor]:
    """The model-soups loop: every floating state-dict entry averaged; integer entries from models[0]."""
    sds = [m.state_dict() for m in models]
    out = {}
    for key, first in sds[0].items():
        if first.is_floating_point():
            total = first.clone()
            for sd in sds[1:]:
                total = total + sd[key]
            out[key] = total / len(sds)
        else:
            out[key] = first.clone()
    return out


def task_arithmetic_by_hand(base: nn.Module, fts: list[nn.Module], lam: float) -> dict[str, torch.Tensor]:
    """The task-vectors loop: ``base + lam * (ft_1 - base) + ...`` over floating entries; others from base."""
    b = base.state_dict()
    out = {}
    for key, v in b.items():
        if v.is_floating_point():
            acc = v * 1.0
            for ft in fts:
                acc = acc + lam * (ft.state_dict()[key] - v)
            out[key] = acc
        else:
            out[key] = v.clone()
    return out


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    assert all(a[k].dtype == b[k].dtype for k in a)
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def main() -> dict[str, Any]:
    base = make_base()
    with torch.no_grad():  # move base's batch-norm statistics once, so every model has real buffers
        base.train()(torch.randn(64, 8))
    fts = [fine_tune(base, task) for task in range(3)]

    soup = fk.mean(fts, trainable_only=False)
    soup_diff = max_difference(soup.state_dict(), soup_by_hand(fts))

    lam = 0.4
    task_vectors = [fk.sub(ft, base, trainable_only=False) for ft in fts]
    edited = fk.lincomb([1.0] + [lam] * len(fts), [base, *task_vectors], trainable_only=False)
    edit_diff = max_difference(edited.state_dict(), task_arithmetic_by_hand(base, fts, lam))

    # the default (trainable_only=True) combines parameters only: buffers come from the first model
    params_only = fk.mean(fts)
    kept = torch.equal(params_only[1].running_mean, fts[0][1].running_mean)

    x = torch.randn(5, 8)
    with torch.no_grad():
        out = soup.eval()(x)
    print(f"uniform soup of {len(fts)} models: max |fk - state-dict loop| = {soup_diff:.3g}")
    print(f"task arithmetic (lam={lam}): max |fk - state-dict loop| = {edit_diff:.3g}")
    print(f"trainable_only=True keeps models[0]'s running mean: {kept}")
    print(f"soup output on a batch: shape {tuple(out.shape)}, finite: {bool(torch.isfinite(out).all())}")
    return {"soup_diff": soup_diff, "edit_diff": edit_diff, "params_only_keeps_buffers": kept}


if __name__ == "__main__":
    main()
