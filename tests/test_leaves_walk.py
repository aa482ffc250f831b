"""The walk of ``fk.leaves`` that records no structure (``functorkit/_leaves_walk.py``): taken on
large container trees, the same leaves as the recording walk on every tree, and handing everything
else (small trees the plan cache plans for, shared sub-trees, deep trees, cycles, other node kinds)
to the recording walk.

bench_walk's model-shaped rows show it on and off (``fk.leaves(t)``, "leaves walk"); these tests
fail when it silently stops being taken, or when it lists anything but what the recording walk lists.
"""

from __future__ import annotations

import collections
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import PROPS, draw_trees

import functorkit as fk
from functorkit import _leaves_walk, _plans, _walk

from conftest import Backend


def _model(n_blocks: int, xp: Any = np) -> dict[str, Any]:
    """A transformer as nested dicts (16 leaves and 9 dicts a block)."""

    def layer() -> dict[str, Any]:
        return {"weight": xp.ones((2, 2)), "bias": xp.zeros(2)}

    return {
        f"h{i}": {"ln1": layer(), "attn": {k: layer() for k in "qkvo"}, "ln2": layer(), "fc1": layer(), "fc2": layer()}
        for i in range(n_blocks)
    }


@pytest.fixture
def recordings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls of ``fk.leaves`` that fell back to the recording walk."""
    calls: list[int] = []
    real = _walk.record_plain

    def spy(tree: Any, track: bool = False) -> Any:
        calls.append(1)
        return real(tree, track)

    monkeypatch.setattr(_walk, "record_plain", spy)
    _plans.clear()
    return calls


def _recorded(tree: Any) -> list[Any]:
    """``fk.leaves(tree)`` by the recording walk."""
    was, _leaves_walk.LEAVES_WALK = _leaves_walk.LEAVES_WALK, False
    try:
        return fk.leaves(tree)
    finally:
        _leaves_walk.LEAVES_WALK = was


def _assert_same(tree: Any) -> None:
    on = fk.leaves(tree)
    off = _recorded(tree)
    assert [id(x) for x in on] == [id(x) for x in off]


def test_a_large_model_shaped_tree_takes_the_leaves_walk(xp: Any, recordings: list[int]) -> None:
    t = _model(60, xp)  # 960 leaves, 541 dicts: more than the plan cache plans for
    for _ in range(3):
        got = fk.leaves(t)
    assert recordings == []  # listed without recording, every time
    assert len(got) == 960
    assert got[0] is t["h0"]["ln1"]["weight"]
    assert got[-1] is t["h59"]["fc2"]["bias"]
    _assert_same(t)
    assert len(recordings) == 1  # the comparison's own recording, and only it


def test_switched_off_it_is_not_taken(recordings: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_leaves_walk, "LEAVES_WALK", False)
    fk.leaves(_model(60))
    assert recordings == [1]


def test_a_small_tree_is_recorded_and_then_matched(recordings: list[int]) -> None:
    t = _model(2)  # 32 leaves, 19 dicts: planned
    for _ in range(4):
        assert [id(x) for x in fk.leaves(t)] == [id(x) for x in _recorded(t)]
    assert (dict, 2) in _plans.MATCH_BY_ROOT  # the generated matcher is made, as before
    assert len(recordings) == 8  # each call recorded (record_plain: its matcher), none walked twice


def test_few_nodes_with_many_loose_leaves_are_not_planned_and_take_the_walk(recordings: list[int]) -> None:
    # 2 nodes but 1,001 program entries (leaves beside a node are entries): never planned
    t = [{"w": np.ones(1)}, *(np.full(1, float(i)) for i in range(1000))]
    for _ in range(3):
        got = fk.leaves(t)
    assert recordings == []
    assert len(got) == 1001
    assert got[1] is t[1]
    _assert_same(t)


def test_ties_and_scalars_follow_the_recording_walk(recordings: list[int]) -> None:
    t = _model(60)
    w = t["h0"]["ln1"]["weight"]
    t["h59"]["fc2"]["weight"] = w  # a tie: listed once, at its first position
    t["h3"]["attn"]["q"]["scale"] = 1  # scalars at every position
    t["h4"]["attn"]["q"]["scale"] = 1
    t["h5"]["extra"] = [None, 1, None]
    got = fk.leaves(t)
    assert recordings == []
    assert sum(x is w for x in got) == 1
    assert sum(x is None for x in got) == 2
    assert sum(type(x) is int for x in got) == 3
    _assert_same(t)


def test_a_shared_sub_tree_goes_to_the_recording_walk(recordings: list[int]) -> None:
    t = _model(60)
    shared = {"lr": 0.1, "eps": 1e-8}  # a mutable node met twice: its scalars listed once
    t["h1"]["opt"] = shared
    t["h2"]["opt"] = shared
    got = fk.leaves(t)
    assert recordings == [1]
    assert sum(x == 0.1 for x in got if type(x) is float) == 1
    _assert_same(t)


@pytest.mark.parametrize(
    "other",
    [
        collections.OrderedDict(a=np.ones(1)),
        collections.deque([np.ones(1)]),
        type("Opaque", (), {})(),
    ],
    ids=["OrderedDict", "deque", "opaque"],
)
def test_another_node_kind_or_an_opaque_leaf(recordings: list[int], other: Any) -> None:
    t = _model(60)
    t["h7"]["x"] = other
    got = fk.leaves(t)
    opaque = type(other).__name__ == "Opaque"
    assert recordings == ([] if opaque else [1])  # a node kind of its own: recorded
    assert len(got) == 960 + 1
    _assert_same(t)


def test_a_deep_tree_and_a_cycle_go_to_the_recording_walk(recordings: list[int]) -> None:
    deep: Any = np.ones(1)
    for _ in range(10_000):
        deep = [deep]
    t = _model(60)
    t["h0"]["deep"] = deep
    assert len(fk.leaves(t)) == 961
    assert recordings == [1]
    assert sys.getrecursionlimit() < 10_000  # the depth the walk cannot recurse through
    cyc = _model(60)
    loop: list[Any] = [np.ones(1)]
    loop.append(loop)
    cyc["h0"]["loop"] = loop
    with pytest.raises(fk.StructureError, match="cycle"):
        fk.leaves(cyc)


def test_types_met_for_the_first_time_are_resolved(recordings: list[int]) -> None:
    class Mine:
        pass

    fk.register_leaf(Mine)
    t = _model(60)
    t["h0"]["m"] = {"a": Mine(), "b": Mine()}
    got = fk.leaves(t)
    assert recordings == []
    assert sum(type(x) is Mine for x in got) == 2
    _assert_same(t)


@PROPS
@given(data=st.data())
def test_every_tree_lists_what_the_recording_walk_lists(
    xp: Any, backend: Backend, data: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree, _, _ = draw_trees(data, xp, backend)
    _plans.clear()
    with monkeypatch.context() as m:
        m.setattr(_plans, "PLAN_NODES", 0)  # every tree too large to plan for: the walk takes it where it can
        _assert_same(tree)
        _assert_same([tree, tree])  # every leaf tied, every node shared


# ---------------------------------------------------------------- torch modules


def _torch() -> Any:
    return pytest.importorskip("torch")


_MODULES = (
    "blocks",
    "lstm",
    "tied",
    "no bias, buffers",
    "lazy",
    "frozen",
    "parametrized",
    "in a dict",
    "one module twice",
    "a compiled module",
)


def _module(name: str) -> Any:
    torch = _torch()
    nn = torch.nn
    torch.manual_seed(0)
    if name == "blocks":
        blocks = [nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4)) for _ in range(3)]
        return nn.Sequential(*blocks)
    if name == "lstm":
        return nn.LSTM(3, 4, num_layers=2)
    if name == "tied":
        tied = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
        tied[1].weight = tied[0].weight  # weight tying: one Parameter in two modules
        return tied
    if name == "no bias, buffers":
        return nn.Sequential(nn.Conv1d(2, 2, 3, bias=False), nn.BatchNorm1d(2))
    if name == "lazy":
        return nn.Sequential(nn.LazyLinear(3), nn.Linear(3, 3))
    if name == "frozen":
        frozen = nn.Linear(3, 3)
        frozen.bias.requires_grad_(False)
        return frozen
    if name == "parametrized":

        class Sym(nn.Module):
            def forward(self, x: Any) -> Any:
                return x + x.T

        param = nn.Linear(4, 4)
        torch.nn.utils.parametrize.register_parametrization(param, "weight", Sym())
        return param
    if name == "in a dict":
        return {"enc": nn.Linear(2, 2), "scale": torch.ones(1), "cfg": [1, 2.0, "x"]}
    if name == "one module twice":
        lin = nn.Linear(2, 2)
        return nn.Sequential(lin, lin)
    assert name == "a compiled module"
    return torch.compile(nn.Linear(2, 2), backend="eager")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (torch.compile imports torch.jit)
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", _MODULES)
def test_a_torch_module_lists_what_the_recording_walk_lists(name: str, recordings: list[int]) -> None:
    tree = _module(name)
    got = fk.leaves(tree)
    # a module met twice is a shared sub-tree: recorded
    assert recordings == ([1] if name == "one module twice" else [])
    _assert_same(tree)
    if name == "tied":
        assert len(got) == 1  # the tied weight once
    if name == "no bias, buffers":
        assert len(got) == 1 + 2 + 3  # conv weight; norm weight and bias; three buffers


def test_a_torch_module_tree_takes_the_walk_every_time(recordings: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    tree = _module("blocks")
    for _ in range(3):
        assert len(fk.leaves(tree)) == 3 * 6
    assert recordings == []
    monkeypatch.setattr(_leaves_walk, "LEAVES_WALK", False)
    fk.leaves(tree)
    assert recordings == [1]


def test_a_broken_module_fails_as_in_the_recording_walk(recordings: list[int]) -> None:
    torch = _torch()

    class Broken(torch.nn.Module):
        def __init__(self) -> None:  # never calls nn.Module.__init__: no parameter dicts
            pass

    outer = torch.nn.Sequential(torch.nn.Linear(2, 2))
    outer._modules["bad"] = Broken()
    tree = {"m": outer}
    with pytest.raises(KeyError) as on:
        fk.leaves(tree)
    with pytest.raises(KeyError) as off:
        _recorded(tree)
    assert str(on.value) == str(off.value)
    assert getattr(on.value, "__notes__", None) == getattr(off.value, "__notes__", None)
    assert "m.bad" in " ".join(on.value.__notes__)  # the recording walk named the path
