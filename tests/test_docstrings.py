"""Public docstrings render on the API page (mkdocstrings, numpy style).

mkdocstrings renders Markdown: a Sphinx role (``:func:`x```) shows as raw text, and a ``Returns``
section whose first line is prose instead of a type renders that prose as the type.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

import functorkit as fk
from functorkit._explain import ExplainRow, Explanation

SPHINX_ROLE = re.compile(r":(?:py:)?[a-z]+:`")
# "type", "name : type", "tuple of int", "array or None"
TYPE_LINE = re.compile(r"[\w.\[\], ]+?( : [\w.\[\], ]+)?")


def _public() -> Iterator[tuple[str, Any]]:
    """Every documented public object: exported names, their public members, the explain types."""
    tops = [(name, getattr(fk, name)) for name in fk.__all__]
    tops += [("Explanation", Explanation), ("ExplainRow", ExplainRow)]
    for name, obj in tops:
        yield name, obj
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if member.startswith("_") and member != "__call__":
                    continue
                target = value.fget if isinstance(value, property) else value
                if inspect.getdoc(target) and (inspect.isroutine(target) or isinstance(value, property)):
                    yield f"{name}.{member}", target


PUBLIC = dict(_public())


def test_public_objects_found() -> None:
    assert {"destructure", "Restructure.__call__", "Restructure.explain", "Explanation", "KeyPath.parse"} <= set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_no_sphinx_roles(name: str) -> None:
    doc = inspect.getdoc(PUBLIC[name]) or ""
    found = SPHINX_ROLE.findall(doc)
    assert not found, f"{name}'s docstring uses Sphinx roles {found}: write `name` (Markdown) instead"


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_returns_sections_start_with_a_type(name: str) -> None:
    lines = (inspect.getdoc(PUBLIC[name]) or "").splitlines()
    for i, line in enumerate(lines[:-2]):
        if line.strip() in ("Returns", "Yields") and set(lines[i + 1].strip()) == {"-"}:
            first = lines[i + 2]
            why = f"{name}: {line.strip()} starts with {first!r}, not 'type' or 'name : type' (text indented below)"
            assert TYPE_LINE.fullmatch(first), why
            assert not first.endswith("."), why


def test_restructure_call_states_its_dtype_rule() -> None:
    doc = inspect.getdoc(fk.Restructure.__call__) or ""
    for policy in ('"strict"', '"model"', '"flat"'):
        assert policy in doc
    assert "dtype" in doc.split("Parameters")[0]
