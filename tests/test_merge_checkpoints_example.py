"""The checkpoint-merging example runs end to end at its smallest size."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("dask.array")

import functorkit as fk

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "merge_checkpoints.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("merge_checkpoints_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merge_checkpoints_example(tmp_path: Path) -> None:
    out = _load_example().main(["--size", "tiny", "--shard-size", "100KB", "--out", str(tmp_path), "--quiet"])
    base, ft1, ft2 = (fk.load(p) for p in out["paths"])
    assert len(list(out["paths"][0].glob("*.safetensors"))) > 1  # sharded
    soup = fk.load(out["soup"])
    assert soup["lm_head"]["weight"] is soup["transformer"]["wte"]["weight"]  # the tie survives the merge
    expected = fk.mean([base, ft1, ft2])
    for x, y in zip(fk.leaves(soup), fk.leaves(expected), strict=True):
        np.testing.assert_array_equal(x, y)
    task = fk.load(out["task_arith"])
    np.testing.assert_array_equal(
        task["transformer"]["h"][1]["mlp"]["c_fc"]["weight"],
        fk.add(base, fk.scale(0.5, fk.add(fk.sub(ft1, base), fk.sub(ft2, base))))["transformer"]["h"][1]["mlp"][
            "c_fc"
        ]["weight"],
    )
    dist = out["distances"]
    assert dist.shape == (5, 5)
    np.testing.assert_array_equal(dist, dist.T)
    assert np.all(np.diag(dist) == 0)
    assert np.all(dist[~np.eye(5, dtype=bool)] > 0)
    np.testing.assert_allclose(dist[0, 2], float(fk.norm(fk.sub(base, ft2))), rtol=1e-5)
    assert dist[0, 2] > dist[0, 1]  # ft2 was perturbed twice as much as ft1
