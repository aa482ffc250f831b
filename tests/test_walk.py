"""The walk (SPEC section 2): fmap, fmapstructure, fmap_with_path, leaves, leaves_with_path.

Every zoo test runs on every backend; the oracle is the independent model of
the SPEC's rules in helpers.py.
"""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import sys
from typing import Any, NamedTuple

import array_api_compat
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import functorkit as fk

from conftest import to_numpy
from helpers import (
    SCALAR_TYPES,
    ZOO_NAMES,
    Frozen,
    Layer,
    Pair,
    Point,
    Seq,
    is_named,
    oracle_children,
    oracle_leaves,
    oracle_positions,
    oracle_static,
    path_str,
    snapshot,
    zoo,
)


class Tag:
    """What the test functions return for leaves that are not float arrays."""

    def __init__(self, of: Any) -> None:
        self.of = of


def recording() -> tuple[list[Any], Any]:
    """``(calls, f)``: `f` records its first argument (or all, if several) and returns a Tag."""
    calls: list[Any] = []

    def f(*args: Any) -> Tag:
        calls.append(args[0] if len(args) == 1 else args)
        return Tag(args[0] if len(args) == 1 else args)

    return calls, f


def is_float_array(x: Any) -> bool:
    if not array_api_compat.is_array_api_obj(x) or isinstance(x, np.generic):
        return False
    xp = array_api_compat.array_namespace(x)
    return bool(xp.isdtype(x.dtype, "real floating"))


def double_or_tag(x: Any) -> Any:
    return x * 2 if is_float_array(x) else Tag(x)


def check_doubled(out: Any, leaf: Any) -> None:
    if is_float_array(leaf):
        assert type(out) is type(leaf)
        assert out.dtype == leaf.dtype
        np.testing.assert_array_equal(to_numpy(out), 2 * to_numpy(leaf))
    else:
        assert type(out) is Tag
        assert out.of is leaf


def assert_fmapped(out: Any, tree: Any, check_leaf: Any) -> None:
    """`out` has `tree`'s node types, keys and static data, in new node objects; leaves checked."""
    ch = oracle_children(tree)
    if ch is None:
        check_leaf(out, tree)
        return
    assert type(out) is type(tree)
    assert out is not tree or tree == (), "fmap must build new nodes (the empty tuple is a singleton)"
    assert oracle_static(out) == oracle_static(tree)
    och = oracle_children(out)
    assert och is not None
    assert [k for k, _ in och] == [k for k, _ in ch]
    for (_, o), (_, t) in zip(och, ch, strict=True):
        assert_fmapped(o, t, check_leaf)


def assert_structured(out: Any, tree: Any, check_leaf: Any) -> None:
    """fmapstructure's output rules: named nodes -> dict, tuples stay tuples, other sequences -> list."""
    ch = oracle_children(tree)
    if ch is None:
        check_leaf(out, tree)
        return
    if is_named(tree):
        assert type(out) is dict
        assert list(out) == [k for k, _ in ch]
        pairs = list(out.values())
    elif type(tree) is tuple:
        assert type(out) is tuple
        pairs = list(out)
    else:
        assert type(out) is list
        pairs = out
    assert len(pairs) == len(ch)
    for o, (_, t) in zip(pairs, ch, strict=True):
        assert_structured(o, t, check_leaf)


# --------------------------------------------------------------- the zoo, every backend


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_fmap_keeps_node_types_and_maps_every_leaf(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    out = fk.fmap(double_or_tag, tree)
    assert_fmapped(out, tree, check_doubled)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_fmap_never_mutates_its_input(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    before = snapshot(tree, to_numpy)
    fk.fmap(double_or_tag, tree)
    fk.fmapstructure(double_or_tag, tree)
    fk.fmap_with_path(lambda p, x: double_or_tag(x), tree)
    fk.fmap(lambda a, b: double_or_tag(a), tree, tree)
    fk.fmap(double_or_tag, tree, trainable_only=True)
    fk.leaves(tree)
    fk.leaves_with_path(tree)
    assert snapshot(tree, to_numpy) == before


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_fmapstructure_output_rules(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    out = fk.fmapstructure(double_or_tag, tree)
    assert_structured(out, tree, check_doubled)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_fmap_with_path_gives_each_leaf_its_path(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    calls: list[tuple[Any, Any]] = []

    def f(path: Any, x: Any) -> Any:
        calls.append((path, x))
        return Tag((str(path), double_or_tag(x)))

    out = fk.fmap_with_path(f, tree, cache=False)
    expected = oracle_positions(tree)
    assert [tuple(p) for p, _ in calls] == [p for p, _ in expected]
    assert all(type(p) is fk.KeyPath for p, _ in calls)
    assert all(x is leaf for (_, x), (_, leaf) in zip(calls, expected, strict=True))

    def check(o: Any, leaf: Any) -> None:
        check_doubled(o.of[1], leaf)

    assert_fmapped(out, tree, check)
    assert [o.of[0] for _, o in oracle_positions(out)] == [path_str(p) for p, _ in expected]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_leaves_and_leaves_with_path(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    expected = oracle_leaves(tree)
    got = fk.leaves(tree)
    assert len(got) == len(expected)
    assert all(a is b for a, b in zip(got, [x for _, x in expected], strict=True))
    got_p = fk.leaves_with_path(tree)
    assert [tuple(p) for p, _ in got_p] == [p for p, _ in expected]
    assert all(a is b for (_, a), (_, b) in zip(got_p, expected, strict=True))
    assert [str(p) for p, _ in got_p] == [path_str(p) for p, _ in expected]


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_f_is_called_in_walk_order_once_per_distinct_leaf(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    seen: list[Any] = []
    fk.fmap(lambda x: seen.append(x), tree)
    assert len(seen) == len(fk.leaves(tree))
    assert all(a is b for a, b in zip(seen, fk.leaves(tree), strict=True))


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_identity_f_rebuilds_an_equal_tree_with_ties(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    out = fk.fmap(lambda x: x, tree)
    assert_fmapped(out, tree, lambda o, leaf: o is leaf or pytest.fail("leaf changed"))
    if name == "shared_leaf":
        assert out["a"] is out["b"][0]
    if name == "shared_subtree":
        assert out["enc"] is out["dec"]


# --------------------------------------------------------------- leaves, scalars, caching


def test_non_array_leaves_are_passed_to_f(xp: Any) -> None:
    class Thing:
        pass

    thing, fn = Thing(), (lambda: 1)
    tree = {
        "s": "text",
        "n": None,
        "i": 3,
        "f": 0.5,
        "c": 2j,
        "b": b"x",
        "t": True,
        "obj": thing,
        "fn": fn,
        "w": xp.asarray([1.0]),
    }
    got: list[Any] = []
    out = fk.fmap(lambda x: got.append(x) or Tag(x), tree)
    assert [type(x) for x in got] == [type(v) for v in tree.values()]
    assert all(a is b for a, b in zip(got, tree.values(), strict=True))
    assert all(type(v) is Tag for v in out.values())
    assert fk.leaves(tree)[7] is thing


def test_scalars_are_never_identity_cached(xp: Any) -> None:
    big = 10**30
    s = "a string"
    tree = {
        "i1": big,
        "i2": big,
        "s1": s,
        "s2": s,
        "n1": None,
        "n2": None,
        "t1": True,
        "t2": True,
        "f1": 1.5,
        "f2": 1.5,
        "c1": 1j,
        "c2": 1j,
        "b1": b"x",
        "b2": b"x",
    }
    for fn in (
        lambda f, t: fk.fmap(f, t),
        lambda f, t: fk.fmap(f, t, is_leaf=lambda x: False),
        lambda f, t: fk.fmap_with_path(lambda p, x: f(x), t),
        lambda f, t: fk.fmap(f, t, t),
    ):
        calls, f = recording()
        fn(f, tree)
        assert len(calls) == len(tree)
    assert len(fk.leaves(tree)) == len(tree)
    assert len(fk.leaves_with_path(tree)) == len(tree)


def test_other_leaves_are_identity_cached() -> None:
    obj = object()
    npscalar = np.float64(2.5)
    tree = {"a": obj, "b": [obj], "c": npscalar, "d": (npscalar,)}
    calls: list[Any] = []
    out = fk.fmap(lambda x: calls.append(x) or Tag(x), tree)
    assert len(calls) == 2
    assert out["a"] is out["b"][0]
    assert out["c"] is out["d"][0]
    assert fk.leaves(tree) == [obj, npscalar]


def test_shared_leaf_f_called_once_ties_survive(xp: Any) -> None:
    w = xp.asarray([1.0, 2.0])
    tree = {"a": w, "b": [w, xp.asarray([3.0])], "c": Point(w, 1)}
    for run in (
        lambda f: fk.fmap(f, tree),
        lambda f: fk.fmap(f, tree, is_leaf=lambda x: False),
        lambda f: fk.fmap_with_path(lambda p, x: f(x), tree),
        lambda f: fk.fmapstructure(f, tree),
    ):
        calls, f = recording()
        out = run(f)
        assert sum(c is w for c in calls) == 1
        b = out["b"]
        c = out["c"]["x"] if isinstance(out["c"], dict) else out["c"].x
        assert out["a"] is b[0] is c


def test_tie_with_no_other_reference_is_detected() -> None:
    # the only references to `w` are the tree's own slots
    tree = {"a": np.ones(2)}
    tree["b"] = [tree["a"], tree["a"]]
    calls: list[Any] = []
    out = fk.fmap(lambda x: calls.append(x) or x * 2, tree)
    assert len(calls) == 1
    assert out["a"] is out["b"][0] is out["b"][1]
    assert len(fk.leaves(tree)) == 1


def test_tie_made_by_a_children_function_is_detected() -> None:
    class Twice:
        def __init__(self, seed: float) -> None:
            self.seed = seed

    def children(t: Twice) -> tuple[Any, Any]:
        fresh = np.full(2, t.seed)  # a new object on every call, held only by the children list
        return [fresh, fresh, np.full(1, t.seed)], None

    fk.register(Twice, children=children, rebuild=lambda aux, ch: tuple(ch))
    tree = [Twice(1.0), Twice(2.0), Twice(3.0)]
    calls: list[Any] = []
    out = fk.fmap(lambda x: calls.append(x) or Tag(x), tree)
    assert len(calls) == 6
    for node in out:
        assert node[0] is node[1]
        assert node[2] is not node[0]
    assert len(fk.leaves(tree)) == 6


def test_shared_subtree_rebuilt_once_and_shared(xp: Any) -> None:
    sub = {"w": xp.asarray([1.0]), "n": 5, "l": [xp.asarray([2.0])]}
    tree = {"enc": sub, "dec": sub, "other": [sub]}
    calls: list[Any] = []
    out = fk.fmap(lambda x: calls.append(x) or Tag(x), tree)
    assert out["enc"] is out["dec"] is out["other"][0]
    assert out["enc"] is not sub
    assert len(calls) == 3  # w, n, l[0] once each
    out_s = fk.fmapstructure(lambda x: Tag(x), tree)
    assert out_s["enc"] is out_s["dec"]
    # cache=False: every position mapped and rebuilt on its own
    calls.clear()
    out_nc = fk.fmap(lambda x: calls.append(x) or Tag(x), tree, cache=False)
    assert len(calls) == 9
    assert out_nc["enc"] is not out_nc["dec"]
    assert out_nc["enc"]["w"] is not out_nc["dec"]["w"]


def test_cache_false_maps_every_position(xp: Any) -> None:
    w = xp.asarray([1.0])
    tree = {"a": w, "b": (w, w)}
    for run in (
        lambda f: fk.fmap(f, tree, cache=False),
        lambda f: fk.fmap(f, tree, cache=False, is_leaf=lambda x: False),
        lambda f: fk.fmap_with_path(lambda p, x: f(x), tree, cache=False),
        lambda f: fk.fmap(lambda a, b: f(a), tree, tree, cache=False),
    ):
        calls, f = recording()
        out = run(f)
        assert len(calls) == 3
        assert out["a"] is not out["b"][0]
        assert out["b"][0] is not out["b"][1]


def test_leaves_cached_once_scalars_at_every_position(xp: Any) -> None:
    w = xp.asarray([1.0])
    sub = {"x": xp.asarray([2.0]), "k": 10**20}
    n = 10**20 + 1
    tree = {"a": w, "b": w, "n": n, "m": n, "s": sub, "t": sub}
    got = fk.leaves(tree)
    # `sub` holds an array, so it is a shared sub-tree: walked once, at its first position (its
    # scalar is listed once, as fmap calls f on it once); `n` is a scalar: listed at every position
    expected = [w, n, n, sub["x"], sub["k"]]
    assert len(got) == len(expected)
    assert all(a is b for a, b in zip(got, expected, strict=True))
    paths = [str(p) for p, _ in fk.leaves_with_path(tree)]
    assert paths == ["a", "n", "m", "s.x", "s.k"]
    calls: list[Any] = []
    fk.fmap(lambda x: calls.append(x), tree)
    assert len(calls) == len(expected)
    got2 = fk.leaves(tree, is_leaf=lambda x: False)
    assert all(a is b for a, b in zip(got2, expected, strict=True))


def test_multi_tree_ties_need_ties_in_every_tree(xp: Any) -> None:
    w = xp.asarray([1.0])
    t1 = {"a": w, "b": w}
    t2 = {"a": xp.asarray([2.0]), "b": xp.asarray([3.0])}
    calls: list[Any] = []
    out = fk.fmap(lambda x, y: calls.append((x, y)) or Tag((x, y)), t1, t2)
    assert len(calls) == 2
    assert out["a"] is not out["b"]
    calls.clear()
    out = fk.fmap(lambda x, y: calls.append((x, y)) or Tag((x, y)), t1, t1)
    assert len(calls) == 1
    assert out["a"] is out["b"]


# --------------------------------------------------------------- is_leaf


def test_is_leaf_stops_the_walk_and_is_tested_on_the_first_tree_only(xp: Any) -> None:
    l1 = Layer(xp.asarray([1.0]), xp.asarray([2.0]))
    t1 = {"layer": l1, "rest": [xp.asarray([3.0])]}
    other = {"not": "a layer"}  # a node, passed whole: is_leaf is not tested on it
    t2 = {"layer": other, "rest": [xp.asarray([4.0])]}
    tested: list[Any] = []

    def is_layer(x: Any) -> bool:
        tested.append(x)
        return isinstance(x, Layer)

    calls: list[Any] = []
    out = fk.fmap(lambda a, b: calls.append((a, b)) or Tag((a, b)), t1, t2, is_leaf=is_layer)
    ids1 = {id(t1), id(l1), id(t1["rest"]), id(t1["rest"][0])}
    assert tested
    assert {id(x) for x in tested} <= ids1
    assert calls[0][0] is l1
    assert calls[0][1] is other
    assert out["layer"].of == (l1, other)
    # every public walk honours is_leaf
    assert fk.leaves(t1, is_leaf=is_layer)[0] is l1
    assert fk.leaves_with_path(t1, is_leaf=is_layer)[0] == (fk.KeyPath(("layer",)), l1)
    assert type(fk.fmapstructure(Tag, t1, is_leaf=is_layer)["layer"]) is Tag
    assert fk.fmap_with_path(lambda p, x: str(p), t1, is_leaf=is_layer) == {"layer": "layer", "rest": ["rest[0]"]}


def test_is_leaf_on_the_root(xp: Any) -> None:
    tree = [xp.asarray([1.0])]
    assert fk.fmap(lambda x: Tag(x), tree, is_leaf=lambda x: isinstance(x, list)).of is tree
    assert fk.leaves(tree, is_leaf=lambda x: True) == [tree]


# --------------------------------------------------------------- trainable_only


def test_trainable_only_maps_float_arrays_reached_through_trainable_children(xp: Any) -> None:
    class Frozenish:
        def __init__(self, train: Any, fixed: Any) -> None:
            self.train, self.fixed = train, fixed

    fk.register(
        Frozenish,
        children=lambda o: ({"train": o.train, "fixed": o.fixed}, None),
        rebuild=lambda aux, ch: Frozenish(ch["train"], ch["fixed"]),
        trainable=lambda o: ["train"],
    )
    w = xp.asarray([1.0, 2.0])
    i = xp.asarray([1, 2], dtype=xp.int64)
    m = xp.asarray([True, False])
    fixed_w = xp.asarray([5.0])
    deep_fixed = xp.asarray([6.0])
    tree = {
        "w": w,
        "i": i,
        "m": m,
        "s": 1.5,
        "n": 3,
        "none": None,
        "node": Frozenish(xp.asarray([3.0]), fixed_w),
        "inner": Frozenish([xp.asarray([4.0])], {"deep": deep_fixed}),
    }
    calls: list[Any] = []
    out = fk.fmap(lambda x: calls.append(x) or x * 2, tree, trainable_only=True)
    assert len(calls) == 3
    np.testing.assert_array_equal(to_numpy(out["w"]), [2.0, 4.0])
    for k in ("i", "m", "s", "n", "none"):
        assert out[k] is tree[k]
    np.testing.assert_array_equal(to_numpy(out["node"].train), [6.0])
    assert out["node"].fixed is fixed_w
    np.testing.assert_array_equal(to_numpy(out["inner"].train[0]), [8.0])
    assert out["inner"].fixed["deep"] is deep_fixed
    # the same rule in the other walks
    st = fk.fmapstructure(lambda x: x * 2, tree, trainable_only=True)
    assert st["node"]["fixed"] is fixed_w
    assert st["i"] is i
    paths: list[str] = []
    fk.fmap_with_path(lambda p, x: paths.append(str(p)) or x, tree, trainable_only=True)
    assert paths == ["w", "node.train", "inner.train[0]"]


def test_trainable_only_tie_between_trainable_and_frozen_positions(xp: Any) -> None:
    class Holder:
        def __init__(self, train: Any, fixed: Any) -> None:
            self.train, self.fixed = train, fixed

    fk.register(
        Holder,
        children=lambda o: ({"fixed": o.fixed, "train": o.train}, None),
        rebuild=lambda aux, ch: Holder(ch["train"], ch["fixed"]),
        trainable=lambda o: ["train"],
    )
    w = xp.asarray([1.0])
    tree = Holder(w, w)  # one array, reached first through a frozen child, then through a trainable one
    calls, f = recording()
    out = fk.fmap(f, tree, trainable_only=True)
    # one rule everywhere: a leaf with at least one trainable position is trainable, and its tie
    # is kept (it is not mapped "once each way")
    assert len(calls) == 1
    assert calls[0] is w
    assert type(out.train) is Tag
    assert out.fixed is out.train


def test_trainable_only_two_trees(xp: Any) -> None:
    t1 = {"w": xp.asarray([1.0]), "i": xp.asarray([1])}
    t2 = {"w": xp.asarray([10.0]), "i": xp.asarray([7])}
    out = fk.fmap(lambda a, b: a + b, t1, t2, trainable_only=True)
    np.testing.assert_array_equal(to_numpy(out["w"]), [11.0])
    assert out["i"] is t1["i"]


# --------------------------------------------------------------- multi-tree


def test_multi_tree_dicts_matched_by_key_in_first_tree_order(xp: Any) -> None:
    a1, b1, a2, b2 = (xp.asarray([float(v)]) for v in range(4))
    for kind in (dict, collections.OrderedDict):
        t1 = kind([("a", a1), ("b", [b1])])
        t2 = kind([("b", [b2]), ("a", a2)])
        calls, f = recording()
        out = fk.fmap(f, t1, t2)
        assert type(out) is kind
        assert list(out) == ["a", "b"]
        assert calls[0][0] is a1
        assert calls[0][1] is a2
        assert calls[1][0] is b1
        assert calls[1][1] is b2
    p1, p2 = Pair(a1, b1), Pair(a2, b2)
    out = fk.fmap(lambda x, y: (x, y), {"p": p1, "q": 0}, {"q": 1, "p": p2})
    assert out["p"].left == (a1, a2)
    assert out["q"] == (0, 1)


def test_multi_tree_three_trees_and_paths(xp: Any) -> None:
    trees = [{"w": [xp.asarray([float(k)]), k]} for k in range(3)]
    seen: list[Any] = []
    out = fk.fmap_with_path(lambda p, a, b, c: seen.append((str(p), a, b, c)) or (a, b, c), *trees)
    assert [s[0] for s in seen] == ["w[0]", "w[1]"]
    assert out["w"][1] == (0, 1, 2)
    assert out["w"][0][2] is trees[2]["w"][0]


# --------------------------------------------------------------- structure mismatches


def _mismatch_cases(xp: Any) -> list[tuple[str, Any, Any, str]]:
    x = xp.asarray([1.0])
    leaf = type(x).__name__
    return [
        (
            "dict keys",
            {"layers": [{"bias": {"w": x, "b": x}}, {"bias": {"w": x, "b": x}}]},
            {"layers": [{"bias": {"w": x, "b": x}}, {"bias": {"w": x}}]},
            "at layers[1].bias: dict keys {'w', 'b'} vs {'w'}",
        ),
        ("leaf vs node", {"a": x}, {"a": [x]}, f"at a: leaf ({leaf}) vs list of length 1"),
        ("node vs leaf", {"a": [x]}, {"a": x}, f"at a: list of length 1 vs leaf ({leaf})"),
        ("list length", [x, x], [x], "at <root>: list of length 2 vs list of length 1"),
        ("tuple vs list", {"t": (x,)}, {"t": [x]}, "at t: tuple of length 1 vs list of length 1"),
        ("namedtuple vs tuple", [Point(x, x)], [(x, x)], "at [0]: Point keys {'x', 'y'} vs tuple of length 2"),
        (
            "dataclass types",
            {"l": Layer(x, x)},
            {"l": Frozen(x, x)},
            "at l: Layer keys {'weight', 'bias'} vs Frozen keys {'a', 'b'}",
        ),
        (
            "dict vs OrderedDict",
            {"d": {"a": x}},
            {"d": collections.OrderedDict(a=x)},
            "at d: dict keys {'a'} vs OrderedDict keys {'a'}",
        ),
        ("registered", Seq(x, x), Seq(x), "at <root>: Seq of length 2 vs Seq of length 1"),
        ("root leaf vs node", x, [x], f"at <root>: leaf ({leaf}) vs list of length 1"),
    ]


@pytest.mark.parametrize("engine", ["fmap", "fmapstructure", "fmap_with_path", "is_leaf", "trainable_only", "no_cache"])
def test_mismatch_names_path_and_both_sides(xp: Any, engine: str) -> None:
    runs = {
        "fmap": lambda a, b: fk.fmap(lambda *z: z[0], a, b),
        "fmapstructure": lambda a, b: fk.fmapstructure(lambda *z: z[0], a, b),
        "fmap_with_path": lambda a, b: fk.fmap_with_path(lambda p, *z: z[0], a, b),
        "is_leaf": lambda a, b: fk.fmap(lambda *z: z[0], a, b, is_leaf=lambda v: False),
        "trainable_only": lambda a, b: fk.fmap(lambda *z: z[0], a, b, trainable_only=True),
        "no_cache": lambda a, b: fk.fmap(lambda *z: z[0], a, b, cache=False),
    }
    for label, t1, t2, first_line in _mismatch_cases(xp):
        with pytest.raises(fk.StructureError) as info:
            runs[engine](t1, t2)
        msg = str(info.value)
        assert msg.splitlines()[0] == first_line, label
        assert "2nd tree" in msg
        assert not getattr(info.value, "__notes__", None)


def test_mismatch_reports_the_first_differing_path_and_the_tree(xp: Any) -> None:
    x = xp.asarray([1.0])
    t1 = {"a": [x, x], "b": [x], "c": [x]}
    t2 = {"a": [x, x], "b": [x, x], "c": []}
    with pytest.raises(fk.StructureError, match=r"^at b: list of length 1 vs list of length 2"):
        fk.fmap(lambda *z: z[0], t1, t2)
    with pytest.raises(fk.StructureError, match="3rd tree") as info:
        fk.fmap(lambda *z: z[0], t1, t1, t2)
    assert str(info.value).startswith("at b:")
    assert isinstance(info.value, ValueError)


def test_mismatch_calls_f_at_no_position_after_the_mismatch(xp: Any) -> None:
    x = xp.asarray([1.0])
    calls: list[Any] = []
    with pytest.raises(fk.StructureError):
        fk.fmap(lambda a, b: calls.append(a), {"a": x, "b": [x], "c": x}, {"a": x, "b": x, "c": x})
    assert len(calls) <= 1


# --------------------------------------------------------------- cycles


def _walks() -> dict[str, Any]:
    return {
        "fmap": lambda t: fk.fmap(lambda x: x, t),
        "fmap_nocache": lambda t: fk.fmap(lambda x: x, t, cache=False),
        "fmap_two_trees": lambda t: fk.fmap(lambda x, y: x, t, t),
        "fmap_is_leaf": lambda t: fk.fmap(lambda x: x, t, is_leaf=lambda x: False),
        "fmap_trainable": lambda t: fk.fmap(lambda x: x, t, trainable_only=True),
        "fmapstructure": lambda t: fk.fmapstructure(lambda x: x, t),
        "fmapstructure_nocache": lambda t: fk.fmapstructure(lambda x: x, t, cache=False),
        "fmap_with_path": lambda t: fk.fmap_with_path(lambda p, x: x, t),
        "fmap_with_path_nocache": lambda t: fk.fmap_with_path(lambda p, x: x, t, cache=False),
        "leaves": lambda t: fk.leaves(t),
        "leaves_is_leaf": lambda t: fk.leaves(t, is_leaf=lambda x: False),
        "leaves_with_path": lambda t: fk.leaves_with_path(t),
    }


@pytest.mark.parametrize("walk_name", list(_walks()))
def test_cycles_raise_naming_the_path_where_they_close(xp: Any, walk_name: str) -> None:
    run = _walks()[walk_name]
    d: dict[str, Any] = {"a": [xp.asarray([1.0]), {}]}
    d["a"][1]["back"] = d
    with pytest.raises(fk.StructureError, match=r"^at a\[1\]\.back: found a cycle"):
        run(d)
    lst: list[Any] = [xp.asarray([1.0])]
    lst.append(lst)
    with pytest.raises(fk.StructureError, match=r"^at \[1\]: found a cycle"):
        run(lst)
    node = Layer(xp.asarray([1.0]), None)
    node.bias = [node]
    with pytest.raises(fk.StructureError, match=r"^at bias\[0\]: found a cycle"):
        run(node)
    # a cycle closing 10,000 levels down
    deep: list[Any] = []
    cur = deep
    for _ in range(10_000):
        nxt: list[Any] = []
        cur.append(nxt)
        cur = nxt
    cur.append(deep)
    with pytest.raises(fk.StructureError, match="found a cycle"):
        run(deep)


# --------------------------------------------------------------- depth


def _chain(depth: int, leaf: Any, kind: str = "list") -> Any:
    t = leaf
    for k in range(depth):
        if kind == "list":
            t = [t]
        elif kind == "dict":
            t = {"next": t, "n": k}
        else:
            t = (leaf, t)
    return t


def _bottom(t: Any, depth: int) -> Any:
    for _ in range(depth):
        t = t[0]
    return t


@pytest.mark.parametrize(
    "walk_name",
    [
        "fmap",
        "fmap_two_trees",
        "fmap_is_leaf",
        "fmap_trainable",
        "fmap_nocache",
        "fmapstructure",
        "fmap_with_path",
        "leaves",
        "leaves_with_path",
    ],
)
def test_depth_10_000_in_every_walk(xp: Any, walk_name: str) -> None:
    depth = 10_000
    x = xp.asarray([1.0])
    tree = _chain(depth, x)
    if walk_name == "leaves":
        assert fk.leaves(tree) == [x]
        return
    if walk_name == "leaves_with_path":
        [(path, leaf)] = fk.leaves_with_path(tree)
        assert leaf is x
        assert tuple(path) == (0,) * depth
        return
    runs = {
        "fmap": lambda: fk.fmap(Tag, tree),
        "fmap_two_trees": lambda: fk.fmap(lambda a, b: Tag(a), tree, _chain(depth, x)),
        "fmap_is_leaf": lambda: fk.fmap(Tag, tree, is_leaf=lambda v: v is x),
        "fmap_trainable": lambda: fk.fmap(Tag, tree, trainable_only=True),
        "fmap_nocache": lambda: fk.fmap(Tag, tree, cache=False),
        "fmapstructure": lambda: fk.fmapstructure(Tag, tree),
        "fmap_with_path": lambda: fk.fmap_with_path(lambda p, v: Tag((len(p), v)), tree),
    }
    out = runs[walk_name]()
    got = _bottom(out, depth)
    assert type(got) is Tag
    assert (got.of == (depth, x)) if walk_name == "fmap_with_path" else (got.of is x)


def test_depth_10_000_of_dicts_and_mixed_nodes(xp: Any) -> None:
    x = xp.asarray([1.0])
    tree = _chain(10_000, x, "dict")
    out = fk.fmap(lambda v: Tag(v), tree)
    cur = out
    for _ in range(10_000):
        cur = cur["next"]
    assert cur.of is x
    mixed = _chain(10_000, x, "mixed")
    assert len(fk.leaves(mixed)) == 1
    assert len(fk.leaves_with_path(mixed)) == 1
    out_m = fk.fmap_with_path(lambda p, v: Tag(p), mixed)
    assert out_m[0].of == fk.KeyPath((0,))
    cur = out_m
    for _ in range(10_000):
        cur = cur[1]
    assert cur is out_m[0]  # x is tied everywhere: mapped once, at its first path


def test_depth_100_000_in_fmap(xp: Any) -> None:
    x = xp.asarray([1.0])
    tree = _chain(100_000, x)
    out = fk.fmap(Tag, tree)
    assert _bottom(out, 100_000).of is x
    out = fk.fmap(Tag, tree, is_leaf=lambda v: v is x)
    assert _bottom(out, 100_000).of is x


# --------------------------------------------------------------- errors raised by user code


@pytest.mark.parametrize(
    "run",
    [
        lambda f, t: fk.fmap(f, t),
        lambda f, t: fk.fmap(f, t, cache=False),
        lambda f, t: fk.fmap(f, t, is_leaf=lambda x: False),
        lambda f, t: fk.fmap(lambda a, b: f(a), t, t),
        lambda f, t: fk.fmapstructure(f, t),
        lambda f, t: fk.fmap_with_path(lambda p, x: f(x), t),
        lambda f, t: fk.fmap(f, {**t, "tie": t["layers"][0]["b"]}),
    ],
    ids=["fmap", "nocache", "is_leaf", "two_trees", "fmapstructure", "with_path", "with_tie"],
)
def test_exceptions_from_f_get_a_note_naming_the_path(xp: Any, run: Any) -> None:
    bad = xp.asarray([13.0])
    tree = {"layers": [{"w": xp.asarray([1.0]), "b": xp.asarray([2.0])}, {"w": bad, "b": 7}]}

    def f(x: Any) -> Any:
        if x is bad:
            raise ZeroDivisionError("boom")
        return x

    with pytest.raises(ZeroDivisionError, match="boom") as info:
        run(f, tree)
    assert info.value.__notes__ == ["(functorkit: raised while visiting layers[1].w)"]


def test_exceptions_from_rebuild_and_children_name_the_node() -> None:
    class Brittle:
        def __init__(self, x: Any) -> None:
            self.x = x

    def rebuild(aux: Any, ch: Any) -> Any:
        raise RuntimeError("cannot rebuild")

    fk.register(Brittle, children=lambda b: ([b.x], None), rebuild=rebuild)
    tree = {"a": [1, Brittle(np.ones(1))]}
    for run in (lambda: fk.fmap(lambda x: x, tree), lambda: fk.fmap(lambda x: x, tree, is_leaf=lambda x: False)):
        with pytest.raises(RuntimeError, match="cannot rebuild") as info:
            run()
        assert info.value.__notes__ == ["(functorkit: raised while visiting a[1])"]

    class Broken:
        pass

    def children(b: Any) -> Any:
        raise KeyError("no children")

    fk.register(Broken, children=children, rebuild=lambda aux, ch: Broken())
    for run in (lambda: fk.fmap(lambda x: x, {"z": (Broken(),)}), lambda: fk.leaves({"z": (Broken(),)})):
        with pytest.raises(KeyError) as kinfo:
            run()
        assert kinfo.value.__notes__ == ["(functorkit: raised while visiting z[0])"]


def test_children_returning_the_wrong_shape_is_a_type_error_with_the_path() -> None:
    class NotAPair:
        pass

    class WrongKind:
        pass

    fk.register(NotAPair, children=lambda o: [1, 2, 3], rebuild=lambda aux, ch: NotAPair())
    fk.register(WrongKind, children=lambda o: ({1, 2}, None), rebuild=lambda aux, ch: WrongKind())
    with pytest.raises(TypeError, match=r"`children`.*NotAPair.*`\(children, aux\)` pair, got list") as info:
        fk.fmap(lambda x: x, {"k": [NotAPair()]})
    assert str(info.value).startswith("at k[0]: ")  # the path is part of the message itself
    with pytest.raises(TypeError, match=r"`children`.*WrongKind.*children of type set"):
        fk.leaves([WrongKind()])


# --------------------------------------------------------------- bad arguments


@pytest.mark.parametrize("name", ["fmap", "fmapstructure", "fmap_with_path"])
def test_bad_arguments_are_type_errors_naming_the_argument(name: str) -> None:
    fn = getattr(fk, name)
    with pytest.raises(TypeError, match="`f` must be callable"):
        fn(3, [1])
    with pytest.raises(TypeError, match="`is_leaf` must be a callable"):
        fn(lambda *a: a, [1], is_leaf=True)
    with pytest.raises(TypeError, match="`cache` must be True or False"):
        fn(lambda *a: a, [1], cache="yes")
    with pytest.raises(TypeError, match="`trainable_only` must be True or False"):
        fn(lambda *a: a, [1], trainable_only=1)


@pytest.mark.parametrize("name", ["leaves", "leaves_with_path"])
def test_leaves_bad_is_leaf(name: str) -> None:
    with pytest.raises(TypeError, match="`is_leaf` must be a callable"):
        getattr(fk, name)([1], is_leaf="x")


# --------------------------------------------------------------- nn.Module trees


def _torch_model() -> Any:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
            self.layers = nn.ModuleList([nn.Linear(2, 3), nn.Linear(3, 1, bias=False)])
            self.norm = nn.BatchNorm1d(1)
            self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)

    torch.manual_seed(0)
    return Net()


def test_module_walk_order_is_state_dict_order_and_paths_read_naturally() -> None:
    net = _torch_model()
    lp = fk.leaves_with_path(net)
    sd = net.state_dict()
    assert [".".join(map(str, p)) for p, _ in lp] == list(sd)
    assert [str(p) for p, _ in lp][:5] == ["scale", "frozen", "steps", "layers[0].weight", "layers[0].bias"]
    for (_, leaf), value in zip(lp, sd.values(), strict=True):
        assert leaf.data_ptr() == value.data_ptr()
    assert fk.KeyPath(("layers", 0, "weight")).get(net) is net.layers[0].weight


def test_module_fmap_returns_a_new_module_and_leaves_the_input_alone() -> None:
    torch = pytest.importorskip("torch")
    net = _torch_model()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    out = fk.fmap(lambda t: t * 2 if t.is_floating_point() else t, net)
    assert type(out) is type(net)
    assert out is not net
    assert out.layers is not net.layers
    assert type(out.layers[0]) is torch.nn.Linear
    assert out.layers[1].bias is None
    torch.testing.assert_close(out.layers[0].weight, net.layers[0].weight * 2)
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, before[k])
    assert net.layers[0].weight is fk.leaves(net)[3]
    st = fk.fmapstructure(lambda t: tuple(t.shape), net)
    assert st["layers"][0] == {"weight": (3, 2), "bias": (3,)}
    assert type(st["layers"]) is dict


def test_module_trainable_only_skips_frozen_parameters_and_buffers() -> None:
    net = _torch_model()
    calls: list[str] = []
    out = fk.fmap_with_path(lambda p, t: calls.append(str(p)) or t * 0, net, trainable_only=True)
    assert calls == ["scale", "layers[0].weight", "layers[0].bias", "layers[1].weight", "norm.weight", "norm.bias"]
    assert out.frozen is net.frozen
    assert out.steps is net.steps
    assert out.norm.running_mean is net.norm.running_mean


# --------------------------------------------------------------- the two engines agree (property test)


class NT(NamedTuple):
    a: Any
    b: Any


@dataclasses.dataclass
class DC:
    x: Any
    y: Any
    tag: str = dataclasses.field(default="dc", metadata={"static": True})


class HalfFrozen:
    """A registered node whose `right` child is not trainable."""

    def __init__(self, left: Any, right: Any) -> None:
        self.left, self.right = left, right


fk.register(
    HalfFrozen,
    children=lambda h: ({"left": h.left, "right": h.right}, None),
    rebuild=lambda aux, ch: HalfFrozen(ch["left"], ch["right"]),
    trainable=lambda h: ["left"],
)


def _children(x: Any) -> list[tuple[Any, Any]] | None:
    if type(x) is HalfFrozen:
        return [("left", x.left), ("right", x.right)]
    return oracle_children(x)


def _trees() -> Any:
    from hypothesis import strategies as st

    @st.composite
    def trees(draw: Any) -> tuple[Any, bool, bool]:
        leaves: list[Any] = []
        nodes: list[Any] = []
        shared_node = [False]
        restricted = [False]

        def leaf() -> Any:
            kind = draw(
                st.sampled_from(["float", "int_array", "int", "str", "none", "float_scalar", "object", "reuse"])
            )
            if kind == "reuse" and leaves:
                return leaves[draw(st.integers(0, len(leaves) - 1))]
            if kind == "int_array":
                x: Any = np.arange(draw(st.integers(0, 3)))
            elif kind == "int":
                x = draw(st.integers(-3, 3))
            elif kind == "str":
                x = draw(st.sampled_from(["a", "b"]))
            elif kind == "none":
                x = None
            elif kind == "float_scalar":
                x = draw(st.floats(-2, 2))
            elif kind == "object":
                x = object()
            else:
                x = np.full(2, draw(st.floats(-2, 2)))
            leaves.append(x)
            return x

        def node(depth: int) -> Any:
            if depth == 0 or draw(st.integers(0, 3)) == 0:
                return leaf()
            kind = draw(st.sampled_from(["dict", "list", "tuple", "nt", "dc", "pair", "half_frozen", "reuse"]))
            if kind == "reuse" and nodes:
                shared_node[0] = True
                return nodes[draw(st.integers(0, len(nodes) - 1))]
            if kind == "nt":
                out: Any = NT(node(depth - 1), node(depth - 1))
            elif kind == "dc":
                out = DC(node(depth - 1), node(depth - 1), tag=draw(st.sampled_from(["p", "q"])))
            elif kind == "pair":
                out = Pair(node(depth - 1), node(depth - 1), tag=draw(st.sampled_from(["p", "q"])))
            elif kind == "half_frozen":
                restricted[0] = True
                out = HalfFrozen(node(depth - 1), node(depth - 1))
            else:
                kids = [node(depth - 1) for _ in range(draw(st.integers(0, 4)))]
                if kind == "dict":
                    out = {f"k{i}": v for i, v in enumerate(kids)}
                else:
                    out = kids if kind == "list" else tuple(kids)
            nodes.append(out)
            return out

        return node(4), shared_node[0], restricted[0]

    return trees()


def _clone(t: Any) -> Any:
    """A copy with fresh containers and fresh array leaves (no ties, no shared nodes)."""
    if type(t) is dict:
        return {k: _clone(v) for k, v in t.items()}
    if type(t) in (list, tuple):
        return type(t)(_clone(v) for v in t)
    if type(t) is NT:
        return NT(_clone(t.a), _clone(t.b))
    if type(t) is DC:
        return DC(_clone(t.x), _clone(t.y), tag=t.tag)
    if type(t) is Pair:
        return Pair(_clone(t.left), _clone(t.right), tag=t.tag)
    if type(t) is HalfFrozen:
        return HalfFrozen(_clone(t.left), _clone(t.right))
    if isinstance(t, np.ndarray):
        return t.copy()
    return t


def _same_output(a: Any, b: Any, pairs: dict[int, int], back: dict[int, int]) -> None:
    """`a` and `b` are equal trees whose objects are tied in the same pattern (a bijection of ids)."""
    if id(a) in pairs or id(b) in back:
        assert pairs.get(id(a)) == id(b)
        assert back.get(id(b)) == id(a)
        return
    assert type(a) is type(b)
    if type(a) is Tag:
        assert a.of == b.of
    else:
        ch_a, ch_b = _children(a), _children(b)
        assert (ch_a is None) == (ch_b is None)
        if ch_a is None:
            assert a is b  # leaves returned unchanged
            return
        assert ch_b is not None
        assert oracle_static(a) == oracle_static(b)
        assert [k for k, _ in ch_a] == [k for k, _ in ch_b]
        for (_, x), (_, y) in zip(ch_a, ch_b, strict=True):
            _same_output(x, y, pairs, back)
    if type(a) not in SCALAR_TYPES:
        pairs[id(a)] = id(b)
        back[id(b)] = id(a)


def _recorder() -> tuple[list[Any], Any]:
    calls: list[Any] = []

    def f(*args: Any) -> Tag:
        calls.append(tuple(id(a) for a in args))
        return Tag(len(calls))

    return calls, f


# --------------------------------------------------------------------------- small trees, planned


def _count_walks(monkeypatch: pytest.MonkeyPatch, walks: list[int]) -> None:
    """Append to `walks` at every walk of a tree (recursive or explicit-stack), not at plan matches."""
    from functorkit import _record

    real = _record._record_recursive

    def recursive(t: Any, track: bool) -> Any:
        out = real(t, track)
        if out is not None:  # None: the explicit stack walks it instead (counted there)
            walks.append(1)
        return out

    class Counting(_record._Recorder):
        def run(self, t: Any) -> list[Any]:
            walks.append(1)
            return super().run(t)

    monkeypatch.setattr(_record, "_Recorder", Counting)
    monkeypatch.setattr(_record, "_record_recursive", recursive)


def test_small_container_trees_take_the_planned_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_walk's "(b) A small model" rows: a dict/list/tuple tree met before is matched by
    # generated code, not walked; forcing that off must show here
    from functorkit import _plans

    def tree() -> dict[str, Any]:
        return {"l1": {"w": np.ones((2, 2)), "b": np.zeros(2)}, "l2": [np.ones(1), (np.ones(1), 3)]}

    walks: list[int] = []

    _count_walks(monkeypatch, walks)
    _plans.clear()
    for _ in range(3):
        fk.fmap(lambda x: x, tree())
    n = len(walks)
    t = tree()
    out = fk.fmap(lambda x: x * 2 if isinstance(x, np.ndarray) else x, t)
    assert len(walks) == n  # no walk: the plan matched
    np.testing.assert_array_equal(out["l1"]["w"], 2 * t["l1"]["w"])
    assert type(out["l2"][1]) is tuple
    assert out["l2"][1][1] == 3
    assert fk.leaves(t)[0] is t["l1"]["w"]
    assert len(walks) == n
    # same root, other content: walked (and right)
    w = np.ones(2)
    tied = {"l1": {"w": w, "b": w}, "l2": [np.ones(1), (np.ones(1), 3)]}
    out = fk.fmap(lambda x: x + 1, tied)
    assert out["l1"]["w"] is out["l1"]["b"]  # the tie, which the plan cannot express
    assert len(walks) == n + 1
    swapped = {"l1": {"b": np.zeros(2), "w": np.ones((2, 2))}, "l2": [np.ones(1), (np.ones(1), 3)]}
    assert list(fk.fmap(lambda x: x, swapped)["l1"]) == ["b", "w"]  # key order is structure
    # a registration makes every plan stale
    fk.register_leaf(type("Fresh", (), {}))
    fk.fmap(lambda x: x, tree())
    assert len(walks) == n + 3
    # forced off: every call walks
    monkeypatch.setattr(_plans, "PLAN_NODES", 0)
    _plans.clear()
    before = len(walks)
    for _ in range(4):
        fk.fmap(lambda x: x, tree())
    assert len(walks) == before + 4


@pytest.mark.parametrize("generated", [True, False])
def test_model_shaped_container_trees_are_rebuilt_by_generated_code(
    monkeypatch: pytest.MonkeyPatch, generated: bool
) -> None:
    # bench_walk's 12-block rows: a transformer of dicts (313 entries and positions, above the
    # old limit of 64) met again is rebuilt by its generated builder, not by the program
    # interpreter (`_program.build`); with PLAN_MAX below its size the interpreter rebuilds it
    from functorkit import _plans, _program, _treedef

    def block(i: int) -> dict[str, Any]:
        def layer(j: int) -> dict[str, Any]:
            return {"weight": np.full((2, 2), float(10 * i + j)), "bias": np.full(2, float(10 * i + j))}

        return {"ln1": layer(0), "attn": {k: layer(1 + n) for n, k in enumerate("qkvo")}, "ln2": layer(5)}

    def tree() -> dict[str, Any]:
        return {f"h{i}": block(i) for i in range(12)}

    interpreted: list[int] = []
    real = _program.build

    def counting(td: Any, vals: list[Any], mode: int) -> Any:
        interpreted.append(1)
        return real(td, vals, mode)

    monkeypatch.setattr(_treedef.program, "build", counting)
    if not generated:
        monkeypatch.setattr(_plans, "PLAN_MAX", 64)
    _plans.clear()
    for _ in range(3):
        fk.fmap(lambda x: x, tree())
    before = len(interpreted)
    t = tree()
    out = fk.fmap(lambda x: x + 1, t)
    assert (len(interpreted) == before) is generated
    np.testing.assert_array_equal(out["h11"]["attn"]["o"]["bias"], np.full(2, 115.0))
    assert list(out["h3"]) == ["ln1", "attn", "ln2"]
    assert list(out["h3"]["attn"]) == list("qkvo")
    assert fk.leaves(out)[5] is not fk.leaves(t)[5]


@pytest.mark.parametrize("planned", [True, False])
def test_wide_container_trees_take_the_planned_matcher(monkeypatch: pytest.MonkeyPatch, planned: bool) -> None:
    # bench_walk's "(a) A wide tree" rows: many positions, few nodes: matched by generated code;
    # forcing it off must show
    from functorkit import _plans

    def tree() -> dict[str, Any]:
        return {
            f"b{i}": [tuple(np.full(1, float(i * 100 + j * 10 + k)) for k in range(10)) for j in range(10)]
            for i in range(3)
        }

    walks: list[int] = []

    _count_walks(monkeypatch, walks)
    _plans.clear()
    if not planned:
        monkeypatch.setattr(_plans, "PLAN_NODES", 0)
    for _ in range(3):
        fk.fmap(lambda x: x, tree())
    n = len(walks)
    t, u = tree(), tree()
    out = fk.fmap(lambda x, y: x + y, t, u)
    assert (len(walks) == n) is planned
    assert out["b2"][9][9][0] == 2 * 299.0
    assert type(out["b1"][3]) is tuple
    # a tie in the other tree is no mismatch; in the first tree it is a tie
    u["b0"][0] = (u["b0"][0][0],) * 10
    assert fk.fmap(lambda x, y: y, t, u)["b0"][0][9][0] == 0.0
    t["b0"][0] = (t["b0"][0][0],) * 10
    walked = len(walks)
    tied = fk.fmap(lambda x: x + 1, t)
    assert len(walks) == walked + 1
    assert tied["b0"][0][0] is tied["b0"][0][9]


@pytest.mark.parametrize("words", [True, False])
def test_tie_test_on_many_leaves_with_and_without_object_words(monkeypatch: pytest.MonkeyPatch, words: bool) -> None:
    # the tie test of a walk of many leaves sorts the objects' words (an object array's buffer)
    # or, without that (the fallback), their ids: both find every tie, in the walk and in the
    # generated matcher of a tree met before
    from functorkit import _plans, _record

    monkeypatch.setattr(_record, "OBJECT_WORDS", words)
    monkeypatch.setattr(_record, "_DISTINCT_SORT", 128 if words else 2048)
    _plans.clear()

    def tree() -> dict[str, Any]:
        return {
            f"b{i}": [tuple(np.full(1, float(i * 1000 + k)) for k in range(100)) for j in range(10)] for i in range(3)
        }

    for _ in range(3):
        out = fk.fmap(lambda x: x + 1, tree())
        assert out["b2"][9][99][0] == 2100.0
    t = tree()
    assert all(_record.all_distinct(fk.leaves(t)) for _ in range(2))
    x = t["b1"][4][7]
    t["b2"][8] = (*t["b2"][8][:50], x, *t["b2"][8][51:])  # one tie among 3,000 positions
    calls: list[int] = []

    def f(a: Any) -> Any:
        calls.append(1)
        return a * 2

    out = fk.fmap(f, t)
    assert out["b2"][8][50] is out["b1"][4][7]
    assert len(calls) == 2999
    assert len(fk.leaves(t)) == 2999
    assert not _record.all_distinct([*fk.leaves(t), x])


def test_object_words_are_detected_and_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_walk's "(a) A wide tree" fmap rows rest on it: on CPython the fast tie test must be on,
    # and a walk of many leaves must go through it (forcing it off turns this red)
    import sys

    from functorkit import _record

    if sys.implementation.name == "cpython":
        assert _record._detect_object_words()
        assert _record.OBJECT_WORDS
    seen: list[int] = []
    real = np.frombuffer

    def frombuffer(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_record.np, "frombuffer", frombuffer)
    fk.fmap(lambda x: x, [np.zeros(()) for _ in range(500)])
    assert seen == ([1] if _record.OBJECT_WORDS else [])
