"""The L-BFGS-B example (examples/lbfgs_fit.py) and its tutorial (docs/lbfgs.md)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "lbfgs_fit.py"
TUTORIAL = ROOT / "docs" / "lbfgs.md"
MAXITER = 80
# measured here with MAXITER = 80: 5,700x (flat) and 4,300x (model); asserted with a wide margin
MIN_FACTOR = 100.0


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("lbfgs_fit_example", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the example's dataclass looks its module up while being defined
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    example = _load_example()
    threads = torch.get_num_threads()
    try:
        return {r.policy: r for r in example.main(["--maxiter", str(MAXITER)])}
    finally:
        torch.set_num_threads(threads)  # main() sets one thread for this tiny model


@pytest.mark.parametrize("policy", ["flat", "model"])
def test_loss_decreases(results: dict[str, Any], policy: str) -> None:
    r = results[policy]
    assert r.loss_start > 0.1  # the initial fit is poor
    assert r.loss_start / r.loss_end >= MIN_FACTOR
    assert 0 < r.iterations <= MAXITER
    # the solution written back into the live float32 module computes the same loss
    assert r.loss_live == pytest.approx(r.loss_end, rel=1e-2)
    assert all(type(w) is torch.nn.Parameter and w.dtype == torch.float32 for w in r.model.parameters())


def test_policies_decide_the_precision(results: dict[str, Any]) -> None:
    assert results["flat"].rebuilt_dtypes == [torch.float64] * 6  # flat: p's dtype, the model computes in float64
    assert results["model"].rebuilt_dtypes == [torch.float32] * 6  # model: each parameter's own dtype
    assert "flat: takes p's dtype" in results["flat"].explain
    assert "model: cast float64 -> float32" in results["model"].explain


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_tutorial_shows_the_real_explain_output(results: dict[str, Any]) -> None:
    text_blocks = _blocks(TUTORIAL.read_text(), "text")
    for policy in ("flat", "model"):
        assert results[policy].explain + "\n" in text_blocks, f"docs/lbfgs.md lacks the real explain table ({policy})"


def _normalise(code: str) -> list[str]:
    return [line.strip() for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_tutorial_code_is_the_example_code() -> None:
    """Every python block of the tutorial is an excerpt of examples/lbfgs_fit.py (line for line, comments aside)."""
    example = _normalise(EXAMPLE.read_text())
    # the first block is the tutorial's complete stand-alone script (tests/test_docs_examples.py runs it)
    blocks = _blocks(TUTORIAL.read_text(), "python")[1:]
    assert len(blocks) >= 4
    for block in blocks:
        lines = _normalise(block)
        lines = [ln for ln in lines if ln != "..."]
        assert lines, block
        start = example.index(lines[0]) if lines[0] in example else -1
        assert start >= 0, f"not in the example: {lines[0]!r}"
        window = example[start:]
        pos = 0
        for ln in lines:
            code = ln.split("  #")[0].rstrip()
            found = next((i for i in range(pos, len(window)) if window[i].split("  #")[0].rstrip() == code), None)
            assert found is not None, f"not in the example (in this order): {ln!r}"
            pos = found + 1
