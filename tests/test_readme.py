"""The README's tour runs as written, and the line documented to raise does raise.

(tests/test_docs_examples.py runs every python block of the README as well; this test checks
what the tour promises.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_tour_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = README.read_text(encoding="utf-8")
    tour = re.findall(r"```python\n(.*?)```", text[text.index("## A tour") :], flags=re.S)[0]
    assert "except fk.PolicyError as e:" in tour, "the tour shows the PolicyError of a float32 p"
    ns: dict[str, object] = {}
    exec(compile(tour, "README tour", "exec"), ns)
    # the except branch ran: the message (path, both dtypes, the fix) was printed
    assert "re(p) under policy='strict' would need a conversion" in capsys.readouterr().out
    assert float(ns["dist"]) > 0  # type: ignore[arg-type]
