"""The recursive walk (``functorkit/_record.py``): taken on model-shaped trees, identical to the
explicit-stack walk everywhere, and handing deep trees, cycles and shared sub-trees to it.

bench_walk's model-shaped rows show the walk on and off; these tests fail when it silently stops
being taken, or when the two walks disagree on any tree the property suite draws.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import PROPS, draw_trees

import functorkit as fk
from functorkit import _plans, _record

from conftest import Backend


def _model(n_blocks: int = 3) -> dict[str, Any]:
    def layer() -> dict[str, Any]:
        return {"weight": np.ones((2, 2), dtype=np.float32), "bias": np.zeros(2, dtype=np.float32)}

    return {
        f"h{i}": {"ln": layer(), "attn": {k: layer() for k in "qkvo"}, "fc": [layer(), (layer(), 3)]}
        for i in range(n_blocks)
    }


@pytest.fixture
def explicit_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the explicit-stack walks (the recursive one is not counted)."""
    walks: list[int] = []

    class Counting(_record._Recorder):
        def run(self, t: Any) -> list[Any]:
            walks.append(1)
            return super().run(t)

    monkeypatch.setattr(_record, "_Recorder", Counting)
    _plans.clear()  # no generated matcher: every call walks
    monkeypatch.setattr(_plans, "PLAN_NODES", 0)
    return walks


def _both(tree: Any, **kw: Any) -> tuple[tuple[list[Any], fk.TreeDef], tuple[list[Any], fk.TreeDef]]:
    on = _record.record(tree, **kw)
    was, _record.RECURSIVE = _record.RECURSIVE, False
    try:
        off = _record.record(tree, **kw)
    finally:
        _record.RECURSIVE = was
    return on, off


def _assert_same(tree: Any, **kw: Any) -> None:
    (l1, t1), (l2, t2) = _both(tree, **kw)
    assert [id(x) for x in l1] == [id(x) for x in l2]
    assert t1 == t2
    assert t1.paths == t2.paths
    assert t1.position_paths() == t2.position_paths()
    assert t1.trainable == t2.trainable
    assert t1.num_nodes == t2.num_nodes
    assert (t1.num_leaves, t1.num_positions) == (t2.num_leaves, t2.num_positions)


def test_a_model_shaped_tree_takes_the_recursive_walk(explicit_walks: list[int]) -> None:
    t = _model()
    leaves, td = fk.flatten(t)
    out = fk.fmap(lambda x: x + 1, t)
    assert fk.leaves(t)[0] is t["h0"]["ln"]["weight"]
    assert explicit_walks == []  # none of the three walked with the explicit stack
    assert td.num_leaves == len(leaves) == 3 * 15
    assert out["h2"]["fc"][1][1] == 4
    assert float(out["h1"]["attn"]["k"]["bias"][0]) == 1.0
    _assert_same(t)


def test_ties_between_distinct_nodes_stay_on_the_recursive_walk(explicit_walks: list[int]) -> None:
    w = np.ones(3)
    t = {"enc": {"emb": w, "b": np.zeros(1)}, "dec": {"out": w}, "n": [1, 1, 2.0]}
    out = fk.fmap(lambda x: x * 2, t)
    assert out["enc"]["emb"] is out["dec"]["out"]
    assert fk.flatten(t)[1].num_leaves == 5  # w once, b, and the three scalars
    assert explicit_walks == []
    _assert_same(t)


def test_a_shared_sub_tree_is_recorded_by_the_explicit_stack(explicit_walks: list[int]) -> None:
    shared = {"w": np.ones(2)}
    t = {"a": shared, "b": [shared, {"k": 1}], "c": {"k": 1}}
    out = fk.fmap(lambda x: x, t)
    assert out["a"] is out["b"][0]  # one object from every rebuild
    assert out["b"][1] is not out["c"]  # two equal dicts are two
    assert len(explicit_walks) == 1
    _assert_same(t)


def test_a_dict_of_scalars_met_twice_is_shared() -> None:
    # mutable nodes are shared even when they hold only scalars (sharing follows mutability)
    s = {"lr": 0.1}
    t = [s, s]
    (leaves, td), _ = _both(t)
    assert leaves == [0.1]
    assert td.num_positions == 1
    out = fk.fmap(lambda x: x * 2, t)
    assert out[0] is out[1]
    assert out[0] == {"lr": 0.2}
    _assert_same(t)


def test_empty_containers_met_twice() -> None:
    e: list[Any] = []
    _assert_same({"a": e, "b": e, "c": (), "d": ()})
    out = fk.fmap(lambda x: x, {"a": e, "b": e})
    assert out["a"] is out["b"]


@pytest.mark.parametrize("depth", [_record.RECURSIVE_DEPTH + 1, _record.RECURSIVE_DEPTH + 2, 3000])
def test_deep_trees(explicit_walks: list[int], depth: int) -> None:
    t: list[Any] = [np.array(0.0)]
    for i in range(1, depth):
        t = [np.array(float(i)), t]
    leaves = fk.leaves(t)
    assert len(leaves) == depth
    assert float(leaves[0]) == depth - 1
    # the recursive walk recurses into RECURSIVE_DEPTH nested nodes (the innermost, all leaves, is
    # taken whole), then hands the tree to the explicit stack
    assert len(explicit_walks) == (0 if depth <= _record.RECURSIVE_DEPTH + 1 else 1)


def test_called_near_the_recursion_limit() -> None:
    # a caller deep in its own recursion still gets its answer (the explicit stack takes over)
    t = _model(2)
    want = [id(x) for x in fk.leaves(t)]

    def deep(n: int) -> list[int]:
        if n:
            return deep(n - 1)
        return [id(x) for x in fk.leaves(t)]

    room = sys.getrecursionlimit() - len(_frames()) - 20
    assert deep(room) == want


def _frames() -> list[Any]:
    out = []
    f = sys._getframe()
    while f is not None:
        out.append(f)
        f = f.f_back  # type: ignore[assignment]
    return out


def test_a_cycle_names_its_path_as_the_explicit_walk_does() -> None:
    t: dict[str, Any] = {"a": {"b": [np.ones(1)]}}
    t["a"]["b"].append(t["a"])
    with pytest.raises(fk.StructureError, match=r"a\.b\[1\]"):
        fk.flatten(t)


class Boom:
    def __init__(self, ok: bool) -> None:
        self.ok = ok


def _boom_children(b: Boom) -> tuple[dict[str, Any], None]:
    if not b.ok:
        msg = "cannot list children"
        raise ValueError(msg)
    return {"x": np.ones(1)}, None


fk.register(Boom, children=_boom_children, rebuild=lambda aux, ch: Boom(True))


def _notes(e: BaseException) -> list[str]:
    return list(getattr(e, "__notes__", []))


@pytest.mark.parametrize("recursive", [True, False])
def test_an_error_in_a_node_function_names_its_path(monkeypatch: pytest.MonkeyPatch, recursive: bool) -> None:
    monkeypatch.setattr(_record, "RECURSIVE", recursive)
    t = {"enc": [np.ones(1), {"bad": Boom(False), "good": Boom(True)}]}
    with pytest.raises(ValueError, match="cannot list children") as info:
        fk.flatten(t)
    assert _notes(info.value) == ["(functorkit: raised while visiting enc[1].bad)"]


class Trainables:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


fk.register(
    Trainables,
    children=lambda o: ({"a": o.a, "b": o.b}, None),
    rebuild=lambda aux, ch: Trainables(ch["a"], ch["b"]),
    trainable=lambda o: {"a"} if o.a is not None else {"zz"},
)


@pytest.mark.parametrize("recursive", [True, False])
def test_trainable_keys_that_are_not_children_name_the_path(monkeypatch: pytest.MonkeyPatch, recursive: bool) -> None:
    monkeypatch.setattr(_record, "RECURSIVE", recursive)
    t = {"m": [Trainables(np.ones(1), np.ones(1)), Trainables(None, np.ones(1))]}
    with pytest.raises(
        fk.StructureError, match=r"at m\[1\]: the `trainable` function registered for Trainables named 'zz'"
    ):
        fk.destructure(t)
    ok = {"m": [Trainables(np.ones(1), np.ones(2))]}
    _assert_same(ok, track=True)
    assert fk.flatten(ok)[1].trainable == (True, False)


def test_the_node_table_grows_during_the_walk() -> None:
    # types first met in the middle of the walk are resolved there; the program is the one the
    # explicit stack records (a dict of fresh leaf types is an all-leaf node both times)
    Fresh = type("FreshLeaf", (), {})
    t = {"a": {"x": Fresh(), "y": Fresh()}, "b": [Fresh(), {"z": Fresh()}]}
    _assert_same(t)
    fk.register_leaf(type("Other", (), {}))  # a new snapshot: nothing cached carries over
    _assert_same(t)


@PROPS
@given(data=st.data())
def test_the_recursive_and_explicit_walks_record_the_same_definition(xp: Any, backend: Backend, data: Any) -> None:
    tree, _, _ = draw_trees(data, xp, backend)
    _assert_same(tree)
    _assert_same(tree, track=True)


# ---------------------------------------------------------------- the recursive matcher


def _count_fast_matches(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    from functorkit import _program_match

    taken: list[bool] = []
    real = _program_match._match_recursive

    def spy(prog: Any, tree: Any) -> Any:
        out = real(prog, tree)
        taken.append(out is not None)
        return out

    monkeypatch.setattr(_program_match, "_match_recursive", spy)
    return taken


def test_a_second_model_shaped_tree_takes_the_recursive_matcher(monkeypatch: pytest.MonkeyPatch) -> None:
    _plans.clear()
    monkeypatch.setattr(_plans, "PLAN_NODES", 0)  # no generated matcher: the definition matches
    taken = _count_fast_matches(monkeypatch)
    t, u = _model(), _model()
    out = fk.fmap(lambda a, b: b, t, u)
    assert taken == [True]
    assert out["h1"]["attn"]["v"]["weight"] is u["h1"]["attn"]["v"]["weight"]
    _, td = fk.flatten(t)
    got = td.flatten_up_to(u)
    assert [id(x) for x in got] == [id(x) for x in fk.leaves(u)]
    assert taken == [True, True]


@pytest.mark.parametrize(
    "change",
    ["keys reordered", "a leaf for a node", "a node for a leaf", "a longer list", "another node type"],
)
def test_the_full_matcher_decides_what_the_recursive_one_cannot(monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    _plans.clear()
    monkeypatch.setattr(_plans, "PLAN_NODES", 0)
    taken = _count_fast_matches(monkeypatch)
    t, u = _model(2), _model(2)
    if change == "keys reordered":  # dicts match by key: the full matcher reorders
        u["h0"]["ln"] = {"bias": u["h0"]["ln"]["bias"], "weight": u["h0"]["ln"]["weight"]}
    elif change == "a leaf for a node":
        u["h1"]["fc"][0] = np.ones(2)
    elif change == "a node for a leaf":
        u["h1"]["fc"][1] = ([u["h1"]["fc"][1][0]], 3)
    elif change == "a longer list":
        u["h0"]["fc"].append(np.ones(1))
    else:
        u["h0"]["fc"] = tuple(u["h0"]["fc"])

    def both() -> Any:
        try:
            return fk.fmap(lambda a, b: b, t, u)
        except fk.StructureError as e:
            return str(e)

    got = both()
    assert taken == [False]  # the recursive matcher handed it over
    monkeypatch.setattr("functorkit._program_match.RECURSIVE_MATCH", False)
    want = both()
    if change == "keys reordered":
        assert got["h0"]["ln"]["weight"] is u["h0"]["ln"]["weight"]
        assert list(got["h0"]["ln"]) == ["weight", "bias"]  # the first tree's structure
    else:
        assert isinstance(got, str)
        assert got == want  # the same message, naming the same path
