"""destructure's plan for a small container tree met before (`_destructure._Plan`).

The plan reuses the analysis of an earlier call on the same definition; every
fact it was decided on, changed, must lead back to the full analysis, and the
per-call checks (aliasing, policy on a new kind) must still run.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import functorkit as fk
from functorkit import _destructure, _plans

from conftest import to_numpy


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that took the plan (a fresh plan cache for each test)."""
    _plans.clear()
    count: list[int] = []
    original = _destructure._Plan.run

    def counting(self: Any, leaves: Any, td: Any) -> Any:
        count.append(1)
        return original(self, leaves, td)

    monkeypatch.setattr(_destructure._Plan, "run", counting)
    return count


def _model(xp: Any, scale: float = 1.0) -> dict[str, Any]:
    return {
        "l1": {"w": xp.asarray([[1.0, 2.0], [3.0, 4.0]]) * scale, "b": xp.asarray([0.5, 0.25]) * scale},
        "steps": xp.asarray([3]),
        "name": "mlp",
        "l2": [xp.asarray([5.0]) * scale, None],
    }


def _warm(model: Any) -> None:
    for _ in range(3):
        fk.destructure(model)


def test_plan_is_taken_and_agrees(xp: Any, runs: list[int]) -> None:
    _warm(_model(xp))
    runs.clear()
    model = _model(xp, 2.0)
    flat, re = fk.destructure(model)
    assert runs == [1], "the plan for a definition met before was not taken"
    np.testing.assert_array_equal(to_numpy(flat), [2.0, 4.0, 6.0, 8.0, 1.0, 0.5, 10.0])
    out = re(flat * 3)
    np.testing.assert_array_equal(to_numpy(out["l1"]["w"]), to_numpy(model["l1"]["w"]) * 3)
    assert out["steps"] is model["steps"]
    assert out["name"] == "mlp"
    assert out["l2"][1] is None


def test_plan_off_when_forced_off(xp: Any, runs: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_plans, "PLAN_NODES", 0)
    _warm(_model(xp))
    runs.clear()
    fk.destructure(_model(xp))
    assert runs == []


def test_plan_switch_off_takes_the_full_analysis(xp: Any, runs: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_flat's "plan off" row: _plans.PLANS = [False] must reach destructure (the plan above
    # is then not taken) and give the same result
    _warm(_model(xp))
    runs.clear()
    on, re_on = fk.destructure(_model(xp, 2.0))
    assert runs == [1]
    monkeypatch.setattr(_plans, "PLANS", [False])
    off, re_off = fk.destructure(_model(xp, 2.0))
    assert runs == [1], "the plan was taken with _plans.PLANS off"
    np.testing.assert_array_equal(to_numpy(on), to_numpy(off))
    assert len(re_on) == len(re_off)
    assert fk.leaves_with_path(re_on(on))[0][0] == fk.leaves_with_path(re_off(off))[0][0]


def test_new_constants_are_carried(xp: Any, runs: list[int]) -> None:
    first = _model(xp)
    _warm(first)
    flat, re = fk.destructure(first)
    re(flat)  # generate its code
    second = _model(xp)
    second["name"] = "other"
    second["steps"] = xp.asarray([9])
    flat2, re2 = fk.destructure(second)
    assert runs
    out = re2(flat2)
    assert out["name"] == "other"
    assert out["steps"] is second["steps"]
    assert re(flat)["name"] == "mlp"  # the first rebuilder keeps its own constants


@pytest.mark.parametrize("change", ["dtype", "int_to_float", "constant_to_array", "shape"])
def test_changed_fact_takes_the_full_analysis(xp: Any, runs: list[int], change: str) -> None:
    _warm(_model(xp))
    runs.clear()
    model = _model(xp)
    other = xp.float32 if model["l1"]["w"].dtype == xp.float64 else xp.float64
    if change == "dtype":
        model["l1"] = {"w": xp.astype(model["l1"]["w"], other), "b": xp.astype(model["l1"]["b"], other)}
        model["l2"] = [xp.astype(model["l2"][0], other), None]
    elif change == "int_to_float":
        model["steps"] = xp.asarray([3.0])
    elif change == "constant_to_array":
        model["l2"] = [model["l2"][0], xp.asarray([7.0])]
    else:
        model["l2"] = [xp.asarray([5.0, 6.0]), None]
    flat, re = fk.destructure(model)
    assert runs == []
    expected = {"dtype": 7, "int_to_float": 8, "constant_to_array": 8, "shape": 8}[change]
    assert flat.shape == (expected,)
    if change == "dtype":
        assert flat.dtype == other
    out = re(flat)
    assert fk.leaves(out)[0].shape == (2, 2)


def test_mixed_dtypes_still_refused(xp: Any, runs: list[int]) -> None:
    _warm(_model(xp))
    model = _model(xp)
    other = xp.float32 if model["l1"]["w"].dtype == xp.float64 else xp.float64
    model["l2"] = [xp.astype(model["l2"][0], other), None]
    with pytest.raises(fk.PolicyError):
        fk.destructure(model)


def test_aliases_still_found_on_the_plan() -> None:
    base = np.arange(8.0)
    tree = {"a": np.zeros(4), "b": np.zeros(4)}
    _warm(tree)
    with pytest.raises(fk.StructureError, match="share memory"):
        fk.destructure({"a": base[:4], "b": base[2:6]})


def test_device_change_is_seen() -> None:
    torch = pytest.importorskip("torch")
    tree = {"w": torch.ones(2), "b": torch.zeros(2)}
    _warm(tree)
    flat, _ = fk.destructure({"w": torch.ones(2, device="meta"), "b": torch.zeros(2, device="meta")})
    assert flat.device.type == "meta"
    with pytest.raises(fk.PolicyError):
        fk.destructure({"w": torch.ones(2, device="meta"), "b": torch.zeros(2)})


def test_a_registration_makes_the_plan_stale(xp: Any, runs: list[int]) -> None:
    # a plan is valid only under the node-table snapshot it was made under (the plan cache's rule)
    _warm(_model(xp))
    runs.clear()
    fk.destructure(_model(xp))
    assert runs == [1]
    fk.register_leaf(type("FreshLeaf", (), {}))
    runs.clear()
    flat, _ = fk.destructure(_model(xp))
    assert runs == []
    assert flat.shape == (7,)


def test_torch_plan_takes_the_one_pass(runs: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_flat's "one pass" row: on torch the plan proves the parameters apart and makes the
    # vector in one adapter pass (no separate alias check); ONE_PASS off must show here and agree
    torch = pytest.importorskip("torch")
    from functorkit.adapters import _torch_flat

    def tree(scale: float) -> dict[str, Any]:
        return {"w": torch.ones(2, 3) * scale, "b": torch.arange(3.0) * scale, "n": torch.tensor([7])}

    _warm(tree(1.0))
    checks: list[int] = []
    passes: list[int] = []
    real_check = _destructure.check_no_aliases
    real_pass = _torch_flat.planned_flat

    def check(*a: Any) -> Any:
        checks.append(1)
        return real_check(*a)

    def one_pass(*a: Any) -> Any:
        passes.append(1)
        return real_pass(*a)

    monkeypatch.setattr(_destructure, "check_no_aliases", check)
    monkeypatch.setattr(_torch_flat, "planned_flat", one_pass)
    runs.clear()
    flat, re = fk.destructure(tree(2.0))
    assert runs == [1]
    assert passes == [1]
    assert checks == [], "the plan's one pass was not taken"
    assert torch.equal(flat, torch.tensor([2.0] * 6 + [0.0, 2.0, 4.0]))
    assert re(flat)["n"] is not None
    monkeypatch.setattr(_destructure, "ONE_PASS", [False])
    off, _ = fk.destructure(tree(2.0))
    assert checks == [1]
    assert passes == [1]
    assert torch.equal(off, flat)
    monkeypatch.setattr(_destructure, "ONE_PASS", [True])
    # what the one pass does not prove goes to the full check: a strided leaf (a result all the
    # same), two views of one storage (refused, naming both paths)
    strided = {"w": torch.ones(3, 2).t() * 2, "b": torch.arange(3.0) * 2, "n": torch.tensor([7])}
    assert torch.equal(fk.destructure(strided)[0], flat)
    assert checks == [1, 1]
    base = torch.arange(12.0)
    with pytest.raises(fk.StructureError, match="share memory") as info:
        fk.destructure({"w": base[:6].view(2, 3), "b": base[4:7], "n": torch.tensor([7])})
    assert "at w and b" in str(info.value)
    assert runs == [1, 1, 1, 1]


def test_reflatten_keeps_its_decisions(xp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_flat's "re.flatten plan" row: a second re.flatten of parameters with the same facts
    # does not decide their kinds again; FLATTEN_PLAN off must show here; a changed fact (a
    # parameter's shape, a non-array) is checked again and refused as before
    from functorkit import _reflatten

    _plans.clear()
    decided: list[int] = []
    real = _reflatten.kinds_of

    def kinds_of(*a: Any) -> Any:
        decided.append(1)
        return real(*a)

    monkeypatch.setattr(_reflatten, "kinds_of", kinds_of)
    flat, re = fk.destructure(_model(xp))  # once: a loop of re.flatten on a rebuilder made once
    decided.clear()
    got = [re.flatten(_model(xp, 2.0)) for _ in range(3)]
    assert decided == [1], "re.flatten's kept decisions were not used"
    for g in got:
        np.testing.assert_array_equal(to_numpy(g), to_numpy(flat) * 2)
    monkeypatch.setattr(_reflatten, "FLATTEN_PLAN", [False])
    np.testing.assert_array_equal(to_numpy(re.flatten(_model(xp, 2.0))), to_numpy(flat) * 2)
    assert decided == [1, 1]
    monkeypatch.setattr(_reflatten, "FLATTEN_PLAN", [True])
    wrong = _model(xp)
    wrong["l1"]["b"] = xp.asarray([0.5, 0.25, 1.0])
    with pytest.raises(fk.StructureError, match=r"l1.*b.*shape \(2,\)"):
        re.flatten(wrong)
    wrong["l1"]["b"] = "not an array"
    with pytest.raises(fk.StructureError, match="floating or complex array"):
        re.flatten(wrong)


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_reflatten_out_sharing_memory_with_the_model_is_refused(lib: str) -> None:
    # re.flatten(out=)'s C-level proof that `out` is apart from the model (torch) must not prove
    # too much: an `out` over a parameter's memory, contiguous or strided (a strided `out` spans
    # more bytes than its own), is refused on every call, the plan's included
    if lib == "torch":
        torch = pytest.importorskip("torch")
        base, other = torch.zeros(10), torch.zeros(3)
    else:
        base, other = np.zeros(10), np.zeros(3)
    model = {"w": other, "b": base[7:9]}
    _, re = fk.destructure(model)
    for out in (base[5:10], base[0:10:2]):
        for _ in range(3):
            with pytest.raises(ValueError, match="shares memory with this parameter"):
                re.flatten(model, out=out)
    apart = base[0:5]
    for _ in range(3):
        assert re.flatten(model, out=apart) is apart
    np.testing.assert_array_equal(to_numpy(apart), np.zeros(5))


def test_reflatten_by_the_generated_match_still_refuses(xp: Any) -> None:
    # re.flatten matches a definition the walk met before with its generated matcher; a tie the
    # definition does not have, or another key, misses there and is refused with its path
    _plans.clear()
    _warm(_model(xp))
    flat, re = fk.destructure(_model(xp))
    assert re._td._generated_match() is not None  # (the path under test)
    np.testing.assert_array_equal(to_numpy(re.flatten(_model(xp, 2.0))), to_numpy(flat) * 2)
    same = _model(xp)
    w = xp.asarray([1.0, 2.0])
    same["l1"] = {"w": same["l1"]["w"], "b": w}
    same["l2"] = [xp.asarray([5.0]), None]
    np.testing.assert_array_equal(to_numpy(re.flatten(same)), [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 5.0])
    dup = _model(xp)
    dup["l2"][0] = dup["l1"]["b"]
    with pytest.raises(fk.StructureError, match=r"l2"):
        re.flatten(dup)
    renamed = _model(xp)
    renamed["l3"] = renamed.pop("l2")
    with pytest.raises(fk.StructureError, match=r"re\.flatten expected"):
        re.flatten(renamed)
