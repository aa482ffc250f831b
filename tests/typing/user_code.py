"""A typed user of functorkit, checked by ``mypy --strict`` in tests/test_typing.py (never run)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, reveal_type

import functorkit as fk


@dataclass
class Model:
    w: Any  # an array of any backend
    b: Any


def step(m: Model, g: Model, lr: float, policy: fk.Policy = "strict") -> Model:
    flat, re = fk.destructure(m, policy=policy)
    rebuilt: Model = re(flat)
    moved: Model = fk.lincomb([1.0, -lr], [rebuilt, g])
    avg: Model = fk.mean([moved, m], trainable_only=False)
    doubled: Model = fk.fmap(lambda x: x * 2, avg)
    return fk.copy(fk.add(doubled, fk.scale(0.5, fk.sub(m, g))))


def checks() -> None:  # never called: pytest's --doctest-modules imports this file
    reveal_type(fk.add(Model(0.0, 0.0), Model(0.0, 0.0)))
    reveal_type(fk.destructure(Model(0.0, 0.0))[1])
    fk.destructure(Model(0.0, 0.0), policy="lenient")  # error: not a Policy
    wrong: int = fk.copy(Model(0.0, 0.0))  # noqa: F841 - error: a Model is not an int
