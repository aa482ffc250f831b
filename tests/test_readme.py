"""The README's tour runs as written (the line documented to raise does raise)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import functorkit as fk

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_tour_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python block"
    tour = blocks[0]
    raising = [line for line in tour.splitlines() if "fk.PolicyError" in line]
    assert len(raising) == 1, "the tour documents exactly one line that raises PolicyError"
    ns: dict[str, object] = {}
    before, _, after = tour.partition(raising[0])
    exec(compile(before, "README tour", "exec"), ns)
    with pytest.raises(fk.PolicyError, match="policy='model'"):
        exec(compile(raising[0].split("#")[0], "README tour", "exec"), ns)
    exec(compile(after, "README tour", "exec"), ns)
    assert float(ns["dist"]) > 0  # type: ignore[arg-type]
