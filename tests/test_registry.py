"""Registration (SPEC section 2): register, register_dataclass, register_leaf, one thread-safe table."""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import sys
import threading
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import functorkit as fk

from conftest import to_numpy


def _fresh_class(name: str = "Box") -> type:
    """A new class each call, so tests never collide in the global table."""

    def __init__(self: Any, a: Any, b: Any) -> None:
        self.a, self.b = a, b

    return type(name, (), {"__init__": __init__})


def _box_children(o: Any) -> tuple[Any, Any]:
    return {"a": o.a, "b": o.b}, None


def test_register_mapping_node(xp: Any) -> None:
    Box = _fresh_class()
    assert fk.register(Box, children=_box_children, rebuild=lambda aux, ch: Box(ch["a"], ch["b"])) is Box
    tree = {"box": Box(xp.asarray([1.0]), [xp.asarray([2.0])])}
    out = fk.fmap(lambda x: x * 3, tree)
    assert type(out["box"]) is Box
    np.testing.assert_array_equal(to_numpy(out["box"].a), [3.0])
    np.testing.assert_array_equal(to_numpy(out["box"].b[0]), [6.0])
    assert [str(p) for p, _ in fk.leaves_with_path(tree)] == ["box.a", "box.b[0]"]
    assert fk.fmapstructure(lambda x: 0, tree) == {"box": {"a": 0, "b": [0]}}


def test_register_sequence_node_and_aux(xp: Any) -> None:
    Row = _fresh_class("Row")
    seen_aux: list[Any] = []

    def rebuild(aux: Any, ch: Any) -> Any:
        seen_aux.append((aux, type(ch)))
        return Row(*ch)

    fk.register(Row, children=lambda r: ((r.a, r.b), ("static", 1)), rebuild=rebuild)
    tree = Row(xp.asarray([1.0]), 5)
    out = fk.fmap(lambda x: x, tree)
    assert type(out) is Row
    assert out.a is tree.a
    assert seen_aux == [(("static", 1), tuple)]
    assert [str(p) for p, _ in fk.leaves_with_path(tree)] == ["[0]", "[1]"]
    assert fk.fmapstructure(lambda x: 1, tree) == [1, 1]


def test_register_is_by_exact_type() -> None:
    Base = _fresh_class("Base")
    fk.register(Base, children=_box_children, rebuild=lambda aux, ch: Base(ch["a"], ch["b"]))
    Sub = type("Sub", (Base,), {})
    sub = Sub(1, 2)
    assert fk.leaves({"s": sub}) == [sub]


def test_registering_twice_raises_unless_replace() -> None:
    Box = _fresh_class()
    fk.register(Box, children=_box_children, rebuild=lambda aux, ch: Box(ch["a"], ch["b"]))
    with pytest.raises(ValueError, match=r"already registered.*replace=True"):
        fk.register(Box, children=_box_children, rebuild=lambda aux, ch: Box(ch["a"], ch["b"]))
    # the three registration functions share one table
    with pytest.raises(ValueError, match="already registered"):
        fk.register_leaf(Box)
    fk.register_leaf(Box, replace=True)
    box = Box(1, 2)
    assert fk.leaves([box]) == [box]
    fk.register(Box, children=lambda o: ([o.a], o.b), rebuild=lambda aux, ch: Box(ch[0], aux), replace=True)
    assert fk.leaves([box]) == [1]


def test_builtins_are_already_registered() -> None:
    for cls in (dict, list, tuple, collections.OrderedDict, collections.defaultdict):
        with pytest.raises(ValueError, match="built-in node"):
            fk.register_leaf(cls)


def test_scalar_types_cannot_be_registered() -> None:
    for cls in (int, float, bool, complex, str, bytes, type(None)):
        with pytest.raises(ValueError, match="always leaves"):
            fk.register_leaf(cls)
        with pytest.raises(ValueError, match="always leaves"):
            fk.register(cls, children=lambda o: ([], None), rebuild=lambda aux, ch: None)


def test_register_dataclass_with_static_fields(xp: Any) -> None:
    @fk.register_dataclass
    @dataclasses.dataclass(frozen=True)
    class Conv:
        weight: Any
        bias: Any
        stride: int = dataclasses.field(default=1, metadata={"static": True})

        def __post_init__(self) -> None:
            calls.append(self)

    calls: list[Any] = []
    conv = Conv(xp.asarray([1.0]), xp.asarray([2.0]), stride=2)
    out = fk.fmap(lambda x: x * 2, conv)
    assert type(out) is Conv
    assert out.stride == 2
    assert len(calls) == 1, "rebuilding must not call __init__/__post_init__"
    assert [str(p) for p, _ in fk.leaves_with_path(conv)] == ["weight", "bias"]
    assert fk.fmapstructure(lambda x: 0, conv) == {"weight": 0, "bias": 0}
    with pytest.raises(ValueError, match="already registered"):
        fk.register_dataclass(Conv)
    fk.register_dataclass(replace=True)(Conv)


def test_plain_dataclasses_are_nodes_and_carry_extra_attributes(xp: Any) -> None:
    @dataclasses.dataclass
    class Plain:
        w: Any
        name: str = dataclasses.field(default="p", metadata={"static": True})

    p = Plain(xp.asarray([1.0]), name="x")
    p.note = "extra"  # type: ignore[attr-defined]
    out = fk.fmap(lambda x: x * 2, p)
    assert type(out) is Plain
    assert out.name == "x"
    assert out.note == "extra"
    np.testing.assert_array_equal(to_numpy(out.w), [2.0])


def test_a_cached_property_value_is_not_carried_into_a_rebuilt_dataclass(xp: Any) -> None:
    """A `functools.cached_property` caches its value in ``__dict__``: carried over like the other
    non-field attributes, a rebuilt dataclass (fmap, re(p), fk.copy, arithmetic) answered with the
    value computed from the *old* fields (silently), and fk.copy aliased it."""
    import functools

    import attrs

    @dataclasses.dataclass
    class Lin:
        w: Any

        @functools.cached_property
        def total(self) -> Any:
            return xp.sum(self.w)

    @attrs.define(slots=False)
    class ALin:
        w: Any

        @functools.cached_property
        def total(self) -> Any:
            return xp.sum(self.w)

    for cls in (Lin, ALin):
        m = cls(xp.asarray([1.0, 2.0]))
        m.note = "kept"  # type: ignore[attr-defined]
        assert float(m.total) == 3.0  # cached now
        out = fk.fmap(lambda x: x * 2, m)
        assert float(out.total) == 6.0
        assert out.note == "kept"  # other non-field attributes are still carried over
        flat, re = fk.destructure(m)
        assert float(re(flat * 3).total) == 9.0
        assert float(fk.scale(4.0, m).total) == 12.0
        c = fk.copy(m)
        assert "total" not in vars(c)
        assert float(c.total) == 3.0
        assert c.total is not m.total
        fresh = cls(xp.asarray([0.0, 0.0]))
        fresh.note = "kept"  # type: ignore[attr-defined]
        assert fk.flatten(m)[1] == fk.flatten(fresh)[1]  # a cached value is no static data


def test_a_namedtuple_subclass_keeps_its_instance_attributes(xp: Any) -> None:
    """A subclass of a namedtuple without ``__slots__ = ()`` has a ``__dict__``: the rebuild
    (``cls(*values)``) dropped its attributes silently; they are carried over now, as a
    dataclass's non-field attributes are."""

    class Point(collections.namedtuple("Point", "x y")):
        def total(self) -> Any:
            return self.x + self.y

    p = Point(xp.asarray([1.0]), xp.asarray([2.0]))
    p.unit = "m"  # type: ignore[attr-defined]
    for out in (fk.fmap(lambda x: x * 2, p), fk.copy(p), fk.scale(2.0, p), fk.destructure(p)[1](fk.destructure(p)[0])):
        assert type(out) is Point
        assert out.unit == "m"  # type: ignore[attr-defined]
    np.testing.assert_array_equal(to_numpy(fk.fmap(lambda x: x * 2, p).total()), [6.0])
    assert [str(k) for k, _ in fk.leaves_with_path(p)] == ["x", "y"]
    plain = Point(1, 2)
    assert vars(fk.fmap(lambda x: x, plain)) == {}
    td = fk.flatten(p)[1]
    assert fk.TreeDef.from_json(td.to_json(), classes=[Point]).unflatten([1, 2]).unit == "m"


def test_register_leaf_forces_leaf_treatment_of_a_dataclass(xp: Any) -> None:
    @dataclasses.dataclass
    class Config:
        lr: float
        w: Any

    cfg = Config(0.1, xp.asarray([1.0]))
    assert len(fk.leaves({"cfg": cfg})) == 2
    fk.register_leaf(Config)
    assert fk.leaves({"cfg": cfg}) == [cfg]
    seen: list[Any] = []
    fk.fmap(lambda x: seen.append(x), {"cfg": cfg, "again": cfg})
    assert seen == [cfg]  # an identity-cached leaf


def test_trainable_function_and_its_errors(xp: Any) -> None:
    Box = _fresh_class()
    fk.register(Box, children=_box_children, rebuild=lambda aux, ch: Box(ch["a"], ch["b"]),
                trainable=lambda o: {"b"})
    tree = Box(xp.asarray([1.0]), xp.asarray([2.0]))
    out = fk.fmap(lambda x: x * 0, tree, trainable_only=True)
    assert out.a is tree.a
    np.testing.assert_array_equal(to_numpy(out.b), [0.0])
    Bad = _fresh_class("Bad")
    fk.register(Bad, children=_box_children, rebuild=lambda aux, ch: Bad(ch["a"], ch["b"]), trainable=lambda o: 3)
    with pytest.raises(TypeError, match="`trainable` function registered for Bad must return an iterable"):
        fk.fmap(lambda x: x, [Bad(1.0, 2.0)], trainable_only=True)


def test_a_trainable_function_returning_one_string_is_refused(xp: Any) -> None:
    """``trainable=lambda o: "ab"`` was read as the set of its characters: with children ``a``,
    ``b`` and ``ab``, the parameters were ``a`` and ``b`` (silently), not ``ab``."""

    class Three:
        def __init__(self, a: Any, b: Any, ab: Any) -> None:
            self.a, self.b, self.ab = a, b, ab

    fk.register(
        Three,
        children=lambda o: ({"a": o.a, "b": o.b, "ab": o.ab}, None),
        rebuild=lambda aux, ch: Three(ch["a"], ch["b"], ch["ab"]),
        trainable=lambda o: "ab",
    )
    tree = {"t": Three(xp.asarray([1.0]), xp.asarray([2.0]), xp.asarray([3.0]))}
    refused = r"at t: the `trainable` function registered for .*Three .*got the str 'ab'"
    for op in (
        lambda: fk.destructure(tree),
        lambda: fk.fmap(lambda x: x, tree, trainable_only=True),
        lambda: fk.scale(2.0, tree),
    ):
        with pytest.raises(TypeError, match=refused):
            op()


@pytest.mark.parametrize("recursive", [True, False], ids=["recursive walk", "explicit walk"])
def test_a_trainable_key_equal_to_a_child_key_of_another_type_is_refused(
    xp: Any, recursive: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``True == 1`` (and ``1.0 == 1``): a trainable key ``True`` was taken for the index 1 of a
    sequence of children, and ``1`` for the key ``True`` of a mapping; the second child became the
    parameter, silently. Keys are matched with their type now."""
    from functorkit import _record

    monkeypatch.setattr(_record, "RECURSIVE", recursive)

    def node(children: Any, trainable: Any) -> Any:
        class N:
            def __init__(self, a: Any, b: Any) -> None:
                self.a, self.b = a, b

        def rebuild(aux: Any, ch: Any) -> Any:
            return N(*ch) if isinstance(ch, (list, tuple)) else N(*ch.values())

        fk.register(N, children=children, rebuild=rebuild, trainable=trainable)
        return N(xp.asarray([1.0, 1.0]), xp.asarray([0.0, 0.0, 0.0]))

    by_index = node(lambda o: ([o.a, o.b], None), lambda o: [True])
    with pytest.raises(fk.StructureError, match=r"at x: .* named True, which is not among its children \[0, 1\]"):
        fk.destructure({"x": by_index})
    by_key = node(lambda o: ({True: o.a, "b": o.b}, None), lambda o: [1])
    with pytest.raises(fk.StructureError, match=r"at x: .* named 1, which is not among its children \[True, 'b'\]"):
        fk.destructure({"x": by_key})
    by_float = node(lambda o: ([o.a, o.b], None), lambda o: [1.0])
    with pytest.raises(fk.StructureError, match=r"named 1.0"):
        fk.destructure({"x": by_float})
    exact = node(lambda o: ({True: o.a, "b": o.b}, None), lambda o: [True])
    flat, _ = fk.destructure({"x": exact})
    assert flat.shape == (2,)  # the child under the key True, only


def test_bad_registration_arguments_name_the_argument() -> None:
    Box = _fresh_class()
    ok = {"children": _box_children, "rebuild": lambda aux, ch: None}
    with pytest.raises(TypeError, match="`cls` must be a class"):
        fk.register(Box(1, 2), **ok)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="`children` must be a callable"):
        fk.register(Box, children=None, rebuild=ok["rebuild"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`rebuild` must be a callable"):
        fk.register(Box, children=_box_children, rebuild="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`trainable` must be a callable"):
        fk.register(Box, **ok, trainable=["a"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`cls` must be a class"):
        fk.register_leaf("Box")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="`cls` must be a dataclass type"):
        fk.register_dataclass(Box)
    with pytest.raises(TypeError, match="`cls` must be a class"):
        fk.register_dataclass(3)
    # nothing was registered by the failed calls
    box = Box(1, 2)
    assert fk.leaves([box]) == [box]


def test_children_returning_the_wrong_shape() -> None:
    cases = {
        "a tuple of length 3": lambda o: ({}, None, None),
        "list": lambda o: [o.a, o.b],
        "children of type str": lambda o: ("ab", None),
    }
    for expected, children in cases.items():
        Box = _fresh_class()
        fk.register(Box, children=children, rebuild=lambda aux, ch: None)
        with pytest.raises(TypeError, match=expected) as info:
            fk.leaves({"x": [Box(1, 2)]})
        assert "`children`" in str(info.value)
        assert str(info.value).startswith("at x[0]: ")  # the path is part of the message itself


def test_eight_threads_racing_to_register_one_class() -> None:
    for _ in range(20):
        assert sorted(_race(_fresh_class())) == ["dup"] * 7 + ["ok"]


def _race(cls: type) -> list[str]:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            fk.register(cls, children=_box_children, rebuild=lambda aux, ch, k=i: k)
            result = "ok"
        except ValueError:
            result = "dup"
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_registering_after_use_takes_effect() -> None:
    Box = _fresh_class()
    box = Box(1, 2)
    assert fk.leaves([box]) == [box]  # unregistered: a leaf, and that answer is cached
    fk.register(Box, children=_box_children, rebuild=lambda aux, ch: Box(ch["a"], ch["b"]))
    assert fk.leaves([box]) == [1, 2]
