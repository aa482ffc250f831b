"""The merge-methods example runs end to end at its smallest size; eager torch/JAX merges agree
with the lazy ones written by fk.save."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("torch")

import functorkit as fk

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "merge_methods.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("merge_methods_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_merge_methods_example(tmp_path: Path) -> None:
    ex = _load_example()
    out = ex.main(["--size", "tiny", "--out", str(tmp_path), "--quiet"])
    base_dir = out["paths"][0]
    index = json.loads((base_dir / "model.safetensors.index.json").read_text())
    assert "model.layers.1.mlp.down_proj.weight" in index["weight_map"]
    assert len(set(index["weight_map"].values())) > 1  # sharded
    for name in ex.MERGES:
        assert out["max_diff_torch"][name] < 1e-6, name
        if out["max_diff_jax"]:
            assert out["max_diff_jax"][name] < 1e-6, name
    base, ft1, ft2 = (fk.state_dict(fk.load(p)) for p in out["paths"])
    ties = fk.state_dict(fk.load(out["ties"]))
    k = "model.layers.0.mlp.up_proj.weight"  # density 0.3 by the "*mlp*" glob: at most 30% of each delta kept
    changed = ties[k] != base[k]
    assert 0.3 < changed.mean() <= 0.6  # the union of two 30% supports
    ta = fk.state_dict(fk.load(out["task_arithmetic"]))
    np.testing.assert_allclose(ta[k], base[k] + 0.5 * ((ft1[k] - base[k]) + (ft2[k] - base[k])), rtol=1e-6, atol=1e-7)
