"""The examples of docs/checkpoints.md run, in order, as one script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("dask.array")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "checkpoints.md"


def test_checkpoints_page_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 3
    namespace: dict[str, object] = {"__name__": "checkpoint_docs"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/checkpoints.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            e.add_note(f"in docs/checkpoints.md python block {i + 1}:\n{block}")
            raise
    out = capsys.readouterr().out
    assert "model.safetensors.index.json" in out
    assert out.count("||ckpt") == 3
