"""The generated code of ``re(p)`` (``_flat.GENERATED``): the straight-line rebuild and the
adapters' view lines fused in front of it are taken after the first call, on every backend, and
give what the interpreter and the adapter's ``views`` give (bench_flat's "generated ... off" rows
measure each; switching one off must turn these tests red)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _flat
from functorkit.adapters import adapter_of

from conftest import to_numpy


def _model(xp: Any) -> dict[str, Any]:
    return {
        "l1": {"w": xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3)), "b": xp.asarray([1.0, 2.0], dtype=xp.float64)},
        "l2": [xp.asarray([[3.0]], dtype=xp.float64), (xp.asarray([4.0, 5.0], dtype=xp.float64), "relu")],
        "steps": xp.asarray([7], dtype=xp.int64),
    }


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the calls of the interpreter (``Restructure._interpret``) and of the adapters' ``views``."""
    calls = {"interpreter": 0, "views": 0}
    real = _flat.Restructure._interpret

    def interpret(self: Any, views: Any) -> Any:
        calls["interpreter"] += 1
        return real(self, views)

    monkeypatch.setattr(_flat.Restructure, "_interpret", interpret)
    return calls


def _spy_views(monkeypatch: pytest.MonkeyPatch, flat: Any, calls: dict[str, int]) -> None:
    cls = type(adapter_of(flat))
    real = cls.views

    def views(self: Any, *args: Any) -> Any:
        calls["views"] += 1
        return real(self, *args)

    monkeypatch.setattr(cls, "views", views)


def _same(a: Any, b: Any) -> None:
    la, lb = fk.leaves_with_path(a), fk.leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (_, x), (_, y) in zip(la, lb, strict=True):
        assert type(x) is type(y)
        if hasattr(x, "dtype"):
            np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
        else:
            assert x == y


@pytest.mark.parametrize("switch", ["on", "build off", "views off"])
def test_generated_code_is_taken_and_agrees(
    xp: Any, counted: dict[str, int], monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    if switch == "build off":
        monkeypatch.setattr(_flat, "GENERATED", [False, True])
    elif switch == "views off":
        monkeypatch.setattr(_flat, "GENERATED", [True, False])
    model = _model(xp)
    flat, re = fk.destructure(model)
    first = re(flat)  # generates the code
    _spy_views(monkeypatch, flat, counted)
    counted["interpreter"] = counted["views"] = 0
    again = re(flat * 2)
    _same(fk.fmap(lambda x: x * 2 if hasattr(x, "dtype") and x.dtype == flat.dtype else x, first), again)
    assert again["l2"][1][1] == "relu"
    assert again["steps"] is model["steps"]
    generated_build = counted["interpreter"] == 0
    generated_views = counted["views"] == 0
    if switch == "on":
        assert generated_build, "re(p) ran the interpreter, not its generated rebuild"
        assert generated_views, "re(p) called the adapter's views, not its generated view lines"
    elif switch == "build off":
        assert not generated_build
    else:
        assert generated_build
        assert not generated_views
