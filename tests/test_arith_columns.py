"""The arithmetic's column path (`_lockstep._columns`): taken for plain trees without ties, equal to the
per-leaf path, and left for the per-leaf path wherever something differs (which then names it)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import functorkit as fk
from functorkit import _lockstep

from conftest import to_numpy


def _model(xp: Any, k: float) -> dict[str, Any]:
    return {
        "w": [xp.asarray([1.0, 2.0]) * k, xp.asarray([[3.0], [4.0]]) * k],
        "b": xp.asarray(0.5) * k,
        "steps": xp.asarray([3]),
        "name": "net",
        "none": None,
    }


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    calls: list[bool] = []
    real = _lockstep._columns

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(_lockstep, "_columns", spy)
    return calls


@pytest.mark.parametrize("op", ["add", "sub", "norm", "lincomb", "lerp", "scale", "mean"])
def test_columns_equal_the_per_leaf_path(xp: Any, op: str, taken: list[bool], monkeypatch: pytest.MonkeyPatch) -> None:
    """Every elementwise function with Python-number coefficients (weak: nothing to check per
    parameter) takes the column path, and gives the per-leaf path's values."""
    a, b = _model(xp, 1.0), _model(xp, 3.0)
    run = {
        "add": lambda: fk.add(a, b),
        "sub": lambda: fk.sub(a, b),
        "norm": lambda: fk.norm(a),
        "lincomb": lambda: fk.lincomb([0.5, -2], [a, b]),
        "lerp": lambda: fk.lerp(a, b, 0.7),
        "scale": lambda: fk.scale(-1.5, a),
        "mean": lambda: fk.mean([a, b, a]),
    }[op]
    fast = run()
    assert taken == [True], "the column path was not taken"
    monkeypatch.setattr(_lockstep, "COLUMNS", [False])
    slow = run()
    if op == "norm":
        np.testing.assert_allclose(to_numpy(fast), to_numpy(slow), rtol=1e-6)
        return
    for (p, x), (q, y) in zip(fk.leaves_with_path(fast), fk.leaves_with_path(slow), strict=True):
        assert p == q
        assert type(x) is type(y)
        if hasattr(x, "dtype"):
            assert x.dtype == y.dtype
            np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
        else:
            assert x == y
    assert fast["steps"] is not a["steps"]  # constants: arrays copied
    assert fast["name"] is a["name"]


def test_columns_leave_differences_to_the_per_leaf_path(xp: Any, taken: list[bool]) -> None:
    a, b = _model(xp, 1.0), _model(xp, 2.0)
    b["w"][1] = xp.asarray([[3.0, 4.0]])
    with pytest.raises(fk.StructureError, match=r"w\[1\]"):
        fk.add(a, b)
    assert taken == [False]
    w = xp.asarray([1.0])
    tied = {"x": w, "y": w}
    out = fk.add(tied, {"x": xp.asarray([2.0]), "y": xp.asarray([2.0])})  # a tie: the per-leaf path
    np.testing.assert_array_equal(to_numpy(out["y"]), [3.0])
    assert taken == [False, False]


def test_column_results_never_alias_inputs() -> None:
    a = {f"k{i}": np.full(2, float(i)) for i in range(300)}
    out = fk.sub(a, {k: np.zeros(2) for k in a})
    assert all(not np.shares_memory(out[k], a[k]) for k in a)
    np.testing.assert_array_equal(out["k7"], [7.0, 7.0])


def test_reductions_refuse_two_devices_on_the_column_path() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(fk.PolicyError, match="at a and b"):
        fk.norm({"a": torch.ones(2), "b": torch.ones(2, device="meta")})


def test_a_coefficient_to_check_per_parameter_goes_the_per_leaf_path(xp: Any, taken: list[bool]) -> None:
    """A complex Python coefficient is checked against each parameter (refused for real ones, by
    path) on the per-leaf path; the column path is not asked."""
    a, b = _model(xp, 1.0), _model(xp, 2.0)
    with pytest.raises(fk.PolicyError, match=r"at w\[0\]: fk.lincomb: `coefficients\[1\]` is complex"):
        fk.lincomb([1.0, 1j], [a, b])
    with pytest.raises(fk.PolicyError, match=r"at w\[0\]: fk.scale: `c` is complex"):
        fk.scale(0.5j, a)
    assert taken == []
