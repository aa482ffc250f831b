"""The examples of docs/interop.md run, in order, as one script.

Each block imports what it uses; a block importing a library that is not installed here (JAX in
the torch session, torch in the JAX session) is skipped, and the blocks after it still run. Later
sections of the page (torch.compile, state dicts, safetensors) follow the same convention.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from pathlib import Path

import pytest

from conftest import importable

PAGE = Path(__file__).resolve().parent.parent / "docs" / "interop.md"
OPTIONAL = ("jax", "torch", "optree", "safetensors")


def _needs(block: str) -> set[str]:
    """The optional libraries a block imports (top-level names)."""
    out = set()
    for node in ast.walk(ast.parse(block)):
        if isinstance(node, ast.Import):
            out.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.partition(".")[0])
    return out & set(OPTIONAL)


def test_interop_page_examples_run(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 7
    module = types.ModuleType("interop_docs")  # a real module: the page's dataclasses look themselves up
    monkeypatch.setitem(sys.modules, "interop_docs", module)
    namespace = module.__dict__
    ran = 0
    for i, block in enumerate(blocks):
        if not all(importable(m) for m in _needs(block)):
            continue
        try:
            exec(compile(block, f"docs/interop.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            e.add_note(f"in docs/interop.md python block {i + 1}:\n{block}")
            raise
        ran += 1
    assert ran >= 1  # the NumPy-only block runs everywhere
