"""SGD with momentum over any model functorkit can flatten.

The optimizer sees one flat vector (``fk.destructure``); the gradient arrives as a tree of the
model's structure and is flattened with the same plan (``re.flatten``). Nothing here knows which
array library the model uses: the update is plain array arithmetic with Python scalars, so it
runs unchanged on NumPy, torch, JAX, ... and keeps the model's dtype and device.

Examples
--------
>>> import numpy as np
>>> import functorkit as fk
>>> from sgdm_opt import SGDM
>>> model = {"w": np.ones(2, np.float32), "steps": np.array([0])}
>>> opt = SGDM(lr=0.5, momentum=0.0)
>>> state = opt.init(model)
>>> model, state = opt.step(state, {"w": np.ones(2, np.float32), "steps": np.array([0])})
>>> model["w"], model["w"].dtype
(array([0.5, 0.5], dtype=float32), dtype('float32'))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import functorkit as fk

__all__ = ["SGDM", "SGDMState"]


@dataclass(frozen=True)
class SGDMState:
    """The flat parameters, their velocity and the plan that rebuilds the model."""

    params: Any  # 1-D array: the model's parameters, in walk order
    velocity: Any  # 1-D array of the same length, namespace, dtype and device
    re: fk.Restructure


@dataclass(frozen=True)
class SGDM:
    """``v <- momentum * v + g``; ``p <- p - lr * v`` on the model's flat vector."""

    lr: float = 0.01
    momentum: float = 0.9

    def init(self, model: Any) -> SGDMState:
        """Flatten `model` (strict policy: no conversion anywhere) and start with zero velocity."""
        params, re = fk.destructure(model)
        return SGDMState(params=params, velocity=params * 0, re=re)

    def step(self, state: SGDMState, grads: Any) -> tuple[Any, SGDMState]:
        """One update from `grads`, a tree of the model's structure; returns (new model, new state).

        Inputs are not modified: the new vectors are new arrays, and the new model holds views of
        the new parameter vector.
        """
        g = state.re.flatten(grads)
        velocity = self.momentum * state.velocity + g
        params = state.params - self.lr * velocity
        return state.re(params), SGDMState(params=params, velocity=velocity, re=state.re)
