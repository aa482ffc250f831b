"""KeyPath (SPEC section 2): immutable, hashable, picklable; str() rules; path.get(tree)."""

from __future__ import annotations

import collections.abc
import copy
import pathlib
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
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


def test_adding_a_string_to_a_path_is_a_type_error() -> None:
    """``path + "weight"`` added one entry per character (``layers[0].w.e.i.g.h.t``), silently, as
    KeyPath("weight") is refused; a tuple of keys (or another path) is what is added."""
    p = fk.KeyPath(("layers", 0))
    with pytest.raises(TypeError, match=r"path \+ \('weight',\)"):
        p + "weight"
    with pytest.raises(TypeError, match="cannot add the str 'x' to a KeyPath"):
        "x" + p
    with pytest.raises(TypeError, match="cannot add the bytes"):
        p + b"w"
    with pytest.raises(TypeError, match=r"cannot add a int to a KeyPath; add a tuple of keys, e.g. path \+ \(5,\)"):
        p + 5
    assert p + ("weight",) == fk.KeyPath(("layers", 0, "weight"))  # noqa: RUF005 -- the operator is tested
    assert ["top"] + p == fk.KeyPath(("top", "layers", 0))  # noqa: RUF005
    assert str(p + p) == "layers[0].layers[0]"
    # the paths functorkit hands out are built the same way
    tree = {"layers": [{"weight": 1.0}]}
    (path, _), = fk.leaves_with_path(tree)
    assert p + ("weight",) == path  # noqa: RUF005


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


def test_get_works_at_depth_100_000() -> None:
    # get used to rebuild the message prefix at every level (quadratic: 34 s at 10,000)
    depth = 100_000
    leaf = object()
    tree: Any = leaf
    for i in range(depth):
        tree = {"a": tree} if i % 2 else [tree]
    path = fk.KeyPath(tuple("a" if i % 2 else 0 for i in reversed(range(depth))))
    assert path.get(tree) is leaf
    ((walked, found),) = fk.leaves_with_path(tree)
    assert walked == path
    assert found is leaf
    with pytest.raises(fk.StructureError, match=r"goes through a leaf"):
        fk.KeyPath((*path, 0)).get(tree)


def test_a_huge_int_key_never_breaks_str_repr_or_messages() -> None:
    big = 10**5000  # over CPython's default int->str digit limit
    path = fk.KeyPath(("x", big, "w"))
    assert str(path) == "x[<int with 5001 digits, ending in …000000>].w"
    assert path.display == str(path)
    assert "<int with 5001 digits" in repr(path)
    neg = fk.KeyPath((-(10**5000) - 7,))
    assert str(neg) == "[<negative int with 5001 digits, ending in …000007>]"
    nested = fk.KeyPath(((big, 1),))  # repr of the tuple raises too
    assert str(nested) == "[<tuple whose repr raised ValueError>]"
    tree = {"x": {big: {"w": 1.0}}}
    ((walked, leaf),) = fk.leaves_with_path(tree)
    assert walked == path
    assert walked.get(tree) == leaf
    with pytest.raises(fk.StructureError, match=r"^at x: the path x\[<int with 5001 .*found the children \[<int"):
        fk.KeyPath(("x", big + 1)).get(tree)
    with pytest.raises(fk.StructureError, match=r"expected a child <int with 5001 digits, ending in …000001>"):
        fk.KeyPath(("x", big + 1)).get(tree)
    with pytest.raises(fk.StructureError, match=r"x\[<int with 5001 digits"):
        fk.fmap(lambda a, b: a, tree, {"x": {big: {"v": 1.0}}})


def test_a_huge_int_key_prints_exactly_when_the_limit_allows() -> None:
    big = 10**5000 + 3
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        assert str(fk.KeyPath((big,))) == f"[{big}]"
    finally:
        sys.set_int_max_str_digits(old)


@pytest.mark.parametrize("digits", [1, 9, 10, 11, 99, 100, 101, 4301, 9999, 10000, 10001])
def test_the_short_form_counts_digits_exactly(digits: int) -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # the smallest limit CPython allows
    try:
        for n in (10 ** (digits - 1), 10**digits - 1, 10 ** (digits - 1) + 12345):
            text = str(fk.KeyPath((n,)))
            if digits <= 640:
                assert text == f"[{n}]"
            else:
                assert text.startswith(f"[<int with {digits} digits, ending in …")
    finally:
        sys.set_int_max_str_digits(old)


class _BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_a_key_whose_repr_raises_still_prints() -> None:
    key = _BadRepr()
    path = fk.KeyPath(("a", key))
    assert str(path) == "a[<_BadRepr whose repr raised RuntimeError>]"
    assert repr(path) == "KeyPath(('a', <_BadRepr whose repr raised RuntimeError>))"
    tree = {"a": {key: 1.0}}
    assert path.get(tree) == 1.0
    with pytest.raises(fk.StructureError, match=r"found the children \[<_BadRepr whose repr raised"):
        fk.KeyPath(("a", "b")).get(tree)


def test_repr_matches_the_tuple_form() -> None:
    assert repr(fk.KeyPath()) == "KeyPath(())"
    assert repr(fk.KeyPath(("a",))) == "KeyPath(('a',))"
    assert repr(fk.KeyPath(("a", 0, None))) == "KeyPath(('a', 0, None))"


def test_nan_keys_from_leaves_with_path_are_found_by_get() -> None:
    nan = float("nan")
    inner = float("nan")
    tree = {nan: [1.0, 2.0], "x": {inner: 3.0, 0.5: 4.0}}
    for path, leaf in fk.leaves_with_path(tree):
        assert path.get(tree) == leaf
    assert fk.KeyPath(("x", inner)).get(tree) == 3.0
    assert fk.KeyPath(("x", 0.5)).get(tree) == 4.0  # equal, not identical, keys still match
    with pytest.raises(fk.StructureError, match=r"does not exist: expected a child nan"):
        fk.KeyPath((float("nan"),)).get(tree)  # another NaN object is not that key


class _PairMap(collections.abc.Mapping):  # type: ignore[type-arg]
    """A Mapping node that allows unhashable keys (kept as a list of pairs)."""

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __getitem__(self, key: Any) -> Any:
        for k, v in self.pairs:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return (k for k, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)


fk.register(_PairMap, children=lambda m: (m, None), rebuild=lambda aux, ch: _PairMap(list(ch.items())), replace=True)


def test_unhashable_keys_work_in_get_and_hashing_names_the_path() -> None:
    w = np.ones(2)
    tree = {"m": _PairMap([([1, 2], w), ("b", 0.5)])}
    ((path, leaf), _) = fk.leaves_with_path(tree)
    assert leaf is w
    assert str(path) == "m[[1, 2]]"
    assert path.get(tree) is w
    assert fk.KeyPath(("m", [1, 2])).get(tree) is w  # equal, not identical
    with pytest.raises(
        TypeError, match=r"^the path m\[\[1, 2\]\] cannot be hashed: its entry 1 is the unhashable list"
    ):
        hash(path)
    with pytest.raises(TypeError, match=r"m\[\[1, 2\]\]"):
        dict(fk.leaves_with_path(tree))


def _error_text(e: BaseException) -> str:
    return " ".join([str(e), *getattr(e, "__notes__", [])])


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda t: fk.fmap(lambda x: x, t), id="fmap"),
        pytest.param(lambda t: fk.fmap_with_path(lambda p, x: x, t), id="fmap_with_path"),
        pytest.param(lambda t: fk.copy(t), id="copy"),
        pytest.param(lambda t: (lambda flat, re: re(flat))(*fk.destructure(t)), id="re"),
    ],
)
def test_rebuilding_a_node_with_unhashable_keys_names_the_path(op: Any) -> None:
    # a node's rebuild receives its children as a dict, so unhashable keys cannot be
    # rebuilt; the error must say where, never a bare "unhashable type"
    tree = {"outer": {"m": _PairMap([([1, 2], np.ones(2)), ("b", np.zeros(1))])}}
    with pytest.raises(TypeError) as info:
        op(tree)
    assert "outer.m" in _error_text(info.value), _error_text(info.value)


# ---- KeyPath.parse and the dotted form ----------------------------------------------


@pytest.mark.parametrize(
    "entries",
    [(), ("a",), ("layers", 1, "bias"), ("a b", 3), ("x'y",), ('q"',), ("a]b", 0), (1.5, None, True), (-2,), ((1, 2),)],
)
def test_parse_reads_back_str(entries):
    path = fk.KeyPath(entries)
    assert fk.KeyPath.parse(str(path)) == path
    assert type(fk.KeyPath.parse(str(path))) is fk.KeyPath


def test_parse_dotted_and_bracket_forms_agree():
    assert fk.KeyPath.parse("layers[1].bias") == fk.KeyPath.parse("layers.1.bias") == ("layers", 1, "bias")
    assert fk.KeyPath.parse("0.weight") == fk.KeyPath.parse("[0].weight") == (0, "weight")
    assert fk.KeyPath.parse("<root>") == fk.KeyPath.parse("") == ()
    assert fk.KeyPath.parse("a-b.c") == ("a-b", "c")


def test_dotted_is_the_state_dict_form():
    assert fk.KeyPath((0, "weight")).dotted == "0.weight"
    assert fk.KeyPath(("layers", 1, "bias")).dotted == "layers.1.bias"
    assert fk.KeyPath.parse(fk.KeyPath(("layers", 1, "bias")).dotted) == ("layers", 1, "bias")


@pytest.mark.parametrize("bad", ["a..b", "a[", "a]b", ".a", "a.", "[x]", "[[1]]", "a b[0]c", "['a'", "['a'x]"])
def test_parse_refuses_malformed(bad):
    with pytest.raises(ValueError, match="cannot read the path"):
        fk.KeyPath.parse(bad)


def test_parse_takes_only_str():
    with pytest.raises(TypeError, match="takes a str"):
        fk.KeyPath.parse(("a",))
