"""examples/ensemble.py trains an 8-member ensemble in one vmapped step on torch and on JAX."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ensemble.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("ensemble_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check(res: dict[str, Any], members: int) -> None:
    before, after = res["before"], res["after"]
    assert before.shape == (members,)
    assert after.shape == (members,)
    assert np.all(np.isfinite(after))
    assert np.all(after < 0.8 * before)  # every member learned
    assert len(np.unique(np.round(before, 6))) == members  # different initialisations
    assert len(res["trained"]) == members
    for path, x in fk.leaves_with_path(res["stacked"]):
        assert x.shape[0] == members, str(path)


def test_ensemble_torch() -> None:
    pytest.importorskip("torch")
    _check(_example().train_torch(8, 80), 8)


def test_ensemble_jax() -> None:
    pytest.importorskip("jax")
    _check(_example().train_jax(8, 80), 8)


def test_ensemble_main_runs_quietly() -> None:
    have = {name for name in ("torch", "jax") if importlib.util.find_spec(name) is not None}
    if not have:
        pytest.skip("needs torch or JAX")
    out = _example().main(["--members", "2", "--steps", "2", "--quiet"])
    assert set(out) == have
    for res in out.values():
        assert len(res["trained"]) == 2
