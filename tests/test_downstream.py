"""A downstream library (tests/downstream/sgdm_opt) runs unchanged on every backend.

sgdm_opt is a minimal SGD-with-momentum optimizer that uses functorkit only through its public
API (`fk.destructure`, `re`, `re.flatten`). Here it minimises the quadratic
`0.5 * ||model - target||^2`, whose gradient tree is `fk.sub(model, target)`, so the test needs no
autograd and runs the same code on NumPy, torch, JAX, Dask and array-api-strict.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

import functorkit as fk

from conftest import to_numpy

sys.path.insert(0, str(Path(__file__).resolve().parent / "downstream"))
from sgdm_opt import SGDM


def _model(xp: Any, scale: float) -> dict[str, Any]:
    return {
        "layers": [
            {"w": xp.asarray(np.full((3, 2), scale), dtype=xp.float32), "b": xp.asarray(np.ones(3), dtype=xp.float32)},
            {"w": xp.asarray(np.full((1, 3), -scale), dtype=xp.float32)},
        ],
        "steps": xp.asarray(np.array([7])),  # an integer constant: carried, never updated
        "act": "relu",
    }


def test_sgdm_converges_on_every_backend(xp: Any) -> None:
    model, target = _model(xp, 1.0), _model(xp, 3.0)
    before = [to_numpy(x) for x in fk.leaves(model) if not isinstance(x, str)]
    opt = SGDM(lr=0.5, momentum=0.25)  # the error shrinks by 0.5 per step on this quadratic
    state = opt.init(model)
    current = model
    for _ in range(30):
        current, state = opt.step(state, fk.sub(current, target))
    # the inputs were not modified
    after = [to_numpy(x) for x in fk.leaves(model) if not isinstance(x, str)]
    assert all(np.array_equal(b, a) for b, a in zip(before, after, strict=True))
    # converged to the target, in the model's namespace and dtype, constants carried
    assert type(current["layers"][0]["w"]) is type(model["layers"][0]["w"])
    assert current["layers"][0]["w"].dtype == xp.float32
    assert current["act"] == "relu"
    np.testing.assert_array_equal(to_numpy(current["steps"]), [7])
    for got, want in zip(fk.leaves(current["layers"]), fk.leaves(target["layers"])):
        np.testing.assert_allclose(to_numpy(got), to_numpy(want), atol=1e-3)


def test_sgdm_momentum_accumulates(xp: Any) -> None:
    model = {"w": xp.asarray(np.zeros(2), dtype=xp.float32)}
    grads = {"w": xp.asarray(np.ones(2), dtype=xp.float32)}
    opt = SGDM(lr=1.0, momentum=0.5)
    state = opt.init(model)
    model, state = opt.step(state, grads)  # v = 1, w = -1
    model, state = opt.step(state, grads)  # v = 1.5, w = -2.5
    np.testing.assert_array_equal(to_numpy(model["w"]), [-2.5, -2.5])
    np.testing.assert_array_equal(to_numpy(state.velocity), [1.5, 1.5])
