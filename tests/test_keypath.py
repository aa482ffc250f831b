"""KeyPath (SPEC section 2): immutable, hashable, picklable; str() rules; path.get(tree)."""

from __future__ import annotations

import copy
import pathlib
import pickle
import sys
from typing import Any

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import functorkit as fk

from helpers import ZOO_NAMES, Layer, Pair, Point, Seq, zoo


@pytest.mark.parametrize(
    ("entries", "text"),
    [
        ((), ""),
        (("layers", 0, "weight"), "layers[0].weight"),
        ((0, "weight"), "[0].weight"),
        (("w",), "w"),
        ((3,), "[3]"),
        (("a b", "c"), "['a b'].c"),
        (("c", "a b"), "c['a b']"),
        (("x", "1st"), "x['1st']"),
        (("x", -1), "x[-1]"),
        (("x", (1, 2)), "x[(1, 2)]"),
        (("x", 1.5), "x[1.5]"),
        (("x", True), "x[True]"),
        (("x", None), "x[None]"),
        (("x", b"k"), "x[b'k']"),
        (("_private", "__dunder__"), "_private.__dunder__"),
    ],
)
def test_str_formatting_rules(entries: tuple[Any, ...], text: str) -> None:
    assert str(fk.KeyPath(entries)) == text


def test_root_displays_as_root_in_messages() -> None:
    root = fk.KeyPath()
    assert str(root) == ""
    assert root.display == "<root>"
    assert fk.KeyPath(("a",)).display == "a"


def test_immutable_hashable_picklable() -> None:
    p = fk.KeyPath(("layers", 0, "weight"))
    with pytest.raises((AttributeError, TypeError)):
        p.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        p[0] = "x"  # type: ignore[index]
    same = fk.KeyPath(["layers", 0, "weight"])
    assert p == same
    assert hash(p) == hash(same)
    assert {p: 1}[same] == 1
    assert len({p, same, fk.KeyPath(("layers", 1, "weight"))}) == 2
    for clone in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)):
        assert type(clone) is fk.KeyPath
        assert clone == p
        assert str(clone) == "layers[0].weight"


def test_tuple_behaviour_keeps_the_type() -> None:
    p = fk.KeyPath(("a", 0, "b"))
    assert type(p[:2]) is fk.KeyPath
    assert str(p[:2]) == "a[0]"
    assert p[1] == 0
    tail, head = ("c",), ("z",)
    assert type(p + tail) is fk.KeyPath
    assert str(p + tail) == "a[0].b.c"
    assert type(head + p) is fk.KeyPath
    assert str(head + p) == "z.a[0].b"
    assert repr(p) == "KeyPath(('a', 0, 'b'))"
    assert len(p) == 3
    assert list(p) == ["a", 0, "b"]


def test_bad_entries_are_type_errors() -> None:
    with pytest.raises(TypeError, match=r"wrap a single key in a tuple: KeyPath\(\('weight',\)\)"):
        fk.KeyPath("weight")
    with pytest.raises(TypeError, match="`entries` must be an iterable"):
        fk.KeyPath(3)


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_get_fetches_every_leaf_of_the_zoo(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    for path, leaf in fk.leaves_with_path(tree):
        assert path.get(tree) is leaf
    # and a node
    if isinstance(tree, dict) and tree:
        key = next(iter(tree))
        assert fk.KeyPath((key,)).get(tree) is tree[key]
    assert fk.KeyPath().get(tree) is tree


def test_get_through_every_node_kind(xp: Any) -> None:
    w = xp.asarray([1.0])
    tree = {"l": [Layer(w, 0)], "p": Pair(Point(1, w), 2), "s": Seq(3, (4, w)), 7: "int key", "a b": {"x": w}}
    assert fk.KeyPath(("l", 0, "weight")).get(tree) is w
    assert fk.KeyPath(("p", "left", "y")).get(tree) is w
    assert fk.KeyPath(("s", 1, 1)).get(tree) is w
    assert fk.KeyPath((7,)).get(tree) == "int key"
    assert fk.KeyPath(("a b", "x")).get(tree) is w


def test_get_errors_name_the_path() -> None:
    tree = {"layers": [{"w": 1.0}, {"w": 2.0}]}
    with pytest.raises(fk.StructureError, match=r"^at layers: the path layers\[5\]\.w does not exist: expected"):
        fk.KeyPath(("layers", 5, "w")).get(tree)
    with pytest.raises(fk.StructureError, match=r"found the children \[0, 1\]"):
        fk.KeyPath(("layers", 5, "w")).get(tree)
    with pytest.raises(fk.StructureError, match=r"^at layers\[0\]\.w: the path layers\[0\]\.w\.x goes through a leaf"):
        fk.KeyPath(("layers", 0, "w", "x")).get(tree)
    with pytest.raises(fk.StructureError, match=r"^at <root>: .*expected a child 'nope'"):
        fk.KeyPath(("nope",)).get(tree)
    # keys match by type as well as value: True is not 1
    with pytest.raises(fk.StructureError):
        fk.KeyPath(("layers", True)).get(tree)
