"""The examples of docs/torch.md run, in order, as one script."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

PAGE = Path(__file__).resolve().parent.parent / "docs" / "torch.md"


# torch's own forward-AD setup (the page's jvp) scripts decompositions with the deprecated torch.jit.script
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_torch_page_examples_run() -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {"__name__": "torch_docs"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/torch.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            e.add_note(f"in docs/torch.md python block {i + 1}:\n{block}")
            raise
