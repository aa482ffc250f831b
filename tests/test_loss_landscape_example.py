"""The loss-landscape example runs end to end on a tiny grid."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "loss_landscape.py"


def _load_example() -> object:
    spec = importlib.util.spec_from_file_location("loss_landscape_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loss_landscape_example(tmp_path: Path) -> None:
    example = _load_example()
    out = example.main(["--out", str(tmp_path), "--grid", "5", "--epochs", "3", "--quiet"])  # type: ignore[attr-defined]
    png, md = tmp_path / "loss_landscape.png", tmp_path / "loss_landscape.md"
    assert out["png"] == png
    assert out["md"] == md
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "![loss landscape](loss_landscape.png)" in text
    assert "5 x 5 points" in text
    losses = out["losses"]
    assert losses.shape == (5, 5)
    assert np.all(np.isfinite(losses))
    # the grid's centre is the trained model itself, loaded back through lincomb + load_into
    assert losses[2, 2] == pytest.approx(out["origin_loss"], rel=1e-5)
    corners = [losses[0, 0], losses[0, -1], losses[-1, 0], losses[-1, -1]]
    assert losses[2, 2] < min(corners)
    assert out["trajectory"].shape == (4, 2)  # initialisation + 3 epochs
    np.testing.assert_allclose(out["trajectory"][-1], [0.0, 0.0], atol=1e-6)  # training ends at the origin
