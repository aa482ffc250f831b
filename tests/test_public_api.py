"""The public face: `__all__` is sorted and is exactly what docs/api.md documents; importing is backend-free."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import functorkit

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _documented() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    return re.findall(r"^::: functorkit\.(\w+)\s*$", text, flags=re.MULTILINE)


def test_all_is_sorted_and_unique() -> None:
    assert list(functorkit.__all__) == sorted(functorkit.__all__)
    assert len(set(functorkit.__all__)) == len(functorkit.__all__)


def test_all_is_exactly_what_the_api_page_documents() -> None:
    documented = _documented()
    assert documented, "docs/api.md documents nothing"
    assert len(set(documented)) == len(documented), "a name is documented twice"
    assert set(functorkit.__all__) == set(documented)


def test_every_exported_name_exists_and_is_public() -> None:
    for name in functorkit.__all__:
        assert not name.startswith("_")
        obj = getattr(functorkit, name)
        assert getattr(obj, "__module__", "functorkit").startswith("functorkit")
        assert obj.__doc__, f"functorkit.{name} has no docstring"


def test_import_functorkit_imports_no_backend() -> None:
    code = (
        "import sys, functorkit\n"
        "bad = sorted(m for m in ('torch', 'jax', 'jaxlib', 'cupy', 'dask') if m in sys.modules)\n"
        "print(','.join(bad))\n"
    )
    root = str(ROOT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root, env=env)
    assert res.stdout.strip() == "", f"import functorkit imported {res.stdout.strip()}"


def test_torch_adapter_loads_only_when_a_torch_object_is_met() -> None:
    code = (
        "import sys, torch, functorkit as fk\n"
        "fk.leaves({'a': [1, 2.0], 'b': object()})\n"
        "assert 'functorkit.adapters.torch' not in sys.modules\n"
        "fk.leaves(torch.nn.Linear(2, 2))\n"
        "assert 'functorkit.adapters.torch' in sys.modules\n"
    )
    pytest.importorskip("torch")
    subprocess.run([sys.executable, "-c", code], check=True)
