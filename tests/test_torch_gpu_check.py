"""conformance/gpu_check.py: its torch cases pass with the CPU stand-in, and failures are reported."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parent.parent / "conformance" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being defined
    spec.loader.exec_module(module)
    return module


def test_cpu_standin_runs_every_torch_case(gpu_check: Any) -> None:
    rows = gpu_check.run(cpu_standin=True)
    torch_rows = [r for r in rows if r.group.startswith("torch")]
    assert [r.case for r in torch_rows] == [name for name, _ in gpu_check.TORCH_CASES]
    failed = [(r.case, r.detail) for r in rows if r.status == "FAIL"]
    assert not failed
    skipped = {r.case for r in torch_rows if r.status == "SKIP"}
    assert skipped == {"no host synchronisation"}  # the one case that needs CUDA itself
    assert all(r.status == "SKIP" for r in rows if r.group == "cupy")


def test_exit_status(gpu_check: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main(["--cpu-standin"]) == 0
    out = capsys.readouterr().out
    assert "0 failed" in out
    assert "PASS" in out
    # without CUDA every torch row is a SKIP, and that is not a failure
    rc = gpu_check.main([])
    out = capsys.readouterr().out
    if not torch.cuda.is_available():
        assert rc == 0
        assert " passed, 0 failed, 15 skipped" in out

    def broken(d: Any) -> str:
        raise AssertionError("device moved")

    cases = list(gpu_check.TORCH_CASES)
    cases[0] = (cases[0][0], broken)
    monkeypatch.setattr(gpu_check, "TORCH_CASES", cases)
    assert gpu_check.main(["--cpu-standin"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out
    assert "AssertionError: device moved" in out
    assert "1 failed" in out
