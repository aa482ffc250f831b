"""Packaging for dependents: one version source, ranges (never exact pins) in the metadata.

`nox -s package` builds the sdist and the wheel, runs `twine check` and installs the wheel in a
fresh virtualenv; these tests check the source of that metadata.
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import functorkit as fk

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_version_has_one_source() -> None:
    """The version is written once, in functorkit/__init__.py; the build backend reads it there."""
    project = PYPROJECT["project"]
    assert "version" not in project
    assert "version" in project["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "functorkit/__init__.py"
    source = (ROOT / "functorkit" / "__init__.py").read_text(encoding="utf-8")
    assert re.findall(r"^__version__ = \"([^\"]+)\"$", source, flags=re.M) == [fk.__version__]


def test_installed_metadata_agrees_with_the_package() -> None:
    """What pip installed (the wheel, or an editable install) reports fk.__version__."""
    try:
        installed = importlib.metadata.version("functorkit")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("functorkit is not installed (run from a bare source tree)")
    assert installed == fk.__version__


def test_changelog_has_the_current_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog
    assert f"## [{fk.__version__}]" in changelog


def _requirements() -> list[tuple[str, Requirement]]:
    project = PYPROJECT["project"]
    reqs = [("dependencies", Requirement(r)) for r in project["dependencies"]]
    for extra, entries in project["optional-dependencies"].items():
        reqs += [(f"[{extra}]", Requirement(r)) for r in entries]
    return reqs


def test_dependencies_take_ranges_not_pins() -> None:
    """A library must not pin its users: exact versions live in constraints.txt (nox passes -c)."""
    pinned = [f"{where}: {req}" for where, req in _requirements() for s in req.specifier if s.operator in ("==", "===")]
    assert not pinned, f"exact pins in pyproject.toml (move them to constraints.txt): {pinned}"
    assert all(req.specifier for _, req in _requirements()), "every dependency states a lower bound"


def test_constraints_pin_exactly() -> None:
    """constraints.txt holds exact versions only, and the torch CI build among them."""
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()]
    reqs = [Requirement(ln) for ln in lines if ln]
    assert reqs
    assert all([s.operator for s in r.specifier] == ["=="] for r in reqs), reqs
    assert "torch" in {r.name for r in reqs}
