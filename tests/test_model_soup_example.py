"""examples/model_soup.py: fk.mean/fk.sub/fk.lincomb with trainable_only=False equal the state-dict loops."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "model_soup.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("model_soup_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_model_soup_example_matches_the_state_dict_loops(capsys: pytest.CaptureFixture[str]) -> None:
    out = _load().main()
    assert out["soup_diff"] == 0.0  # the same additions in the same order: bit for bit
    assert out["edit_diff"] < 1e-6  # torch's fused add(alpha=) may round differently in the last bit
    assert out["params_only_keeps_buffers"] is True
    printed = capsys.readouterr().out
    assert "uniform soup of 3 models" in printed
    assert "finite: True" in printed
