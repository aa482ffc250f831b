"""SPEC 12: no array is ever silently a constant; standard containers are nodes; sharing follows mutability.

The holders x operations matrix: every holder below, holding an array, in a model next to a plain
array, through every operation that promises something about arrays. A holder that is a node by
default gives the correct result as a node; one that no registry knows gives the one
StructureError (path, class, fix) and nothing is returned or written.
"""

from __future__ import annotations

import collections
import functools
import types
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, to_numpy


@attrs.define
class AttrsBox:
    w: Any
    tag: str = attrs.field(default="t", metadata={"static": True})


@attrs.frozen
class FrozenBox:
    w: Any


class DictSub(dict):  # type: ignore[type-arg]
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class Plain:
    def __init__(self, w: Any) -> None:
        self.w = w


class Slotted:
    __slots__ = ("w",)

    def __init__(self, w: Any) -> None:
        self.w = w


#: name -> (make(array), the array back out of it, or None for an unknown holder)
NODES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "SimpleNamespace": (lambda a: types.SimpleNamespace(w=a), lambda h: h.w),
    "UserDict": (lambda a: collections.UserDict(w=a), lambda h: h["w"]),
    "UserList": (lambda a: collections.UserList([a]), lambda h: h[0]),
    "deque": (lambda a: collections.deque([a], maxlen=5), lambda h: h[0]),
    "MappingProxyType": (lambda a: types.MappingProxyType({"w": a}), lambda h: h["w"]),
    "attrs": (lambda a: AttrsBox(a), lambda h: h.w),
    "attrs_frozen": (lambda a: FrozenBox(a), lambda h: h.w),
}
UNKNOWN: dict[str, Callable[[Any], Any]] = {
    "dict_subclass": lambda a: DictSub(w=a),
    "list_subclass": lambda a: ListSub([a]),
    "plain_class": lambda a: Plain(a),
    "slots_class": lambda a: Slotted(a),
    "values_view": lambda a: {"w": a}.values(),  # (a dict's keys() and items() are sets: found before)
}
#: the path of the array inside each node holder
INNER = {
    "SimpleNamespace": "p.w",
    "UserDict": "p.w",
    "UserList": "p[0]",
    "deque": "p[0]",
    "MappingProxyType": "p.w",
    "attrs": "p.w",
    "attrs_frozen": "p.w",
}


def _model(xp: Any, make: Callable[[Any], Any]) -> dict[str, Any]:
    return {"p": make(xp.asarray([1.0, 2.0])), "q": xp.asarray([3.0])}


def _writable(backend: Backend) -> bool:
    return backend in (Backend.NUMPY, Backend.TORCH, Backend.ARRAY_API_STRICT)


def _ops(xp: Any, tmp: Any) -> dict[str, Callable[[Any], Any]]:
    """Every operation that promises something about arrays, as ``op(model) -> result``."""
    _, re_plain = fk.destructure({"p": None, "q": xp.asarray([0.0])})
    return {
        "destructure_strict": lambda m: fk.destructure(m),
        "destructure_model": lambda m: fk.destructure(m, policy="model"),
        "destructure_flat": lambda m: fk.destructure(m, policy="flat"),
        "re.flatten": lambda m: re_plain.flatten(m),
        "add": lambda m: fk.add(m, m),
        "sub": lambda m: fk.sub(m, m),
        "scale": lambda m: fk.scale(2.0, m),
        "lincomb": lambda m: fk.lincomb([0.5, 0.5], [m, m]),
        "mean": lambda m: fk.mean([m, m]),
        "lerp": lambda m: fk.lerp(m, m, 0.5),
        "dot": lambda m: fk.dot(m, m),
        "norm": lambda m: fk.norm(m),
        "normalize": lambda m: fk.normalize(m),
        "filter_normalize": lambda m: fk.filter_normalize(m, m),
        "copy": lambda m: fk.copy(m),
        "state_dict": lambda m: fk.state_dict(m),
        "save": lambda m: fk.save(str(tmp / "m.safetensors"), m),
        "stack": lambda m: fk.stack([m, m]),
    }


OPS = [
    "destructure_strict",
    "destructure_model",
    "destructure_flat",
    "re.flatten",
    "add",
    "sub",
    "scale",
    "lincomb",
    "mean",
    "lerp",
    "dot",
    "norm",
    "normalize",
    "filter_normalize",
    "copy",
    "state_dict",
    "save",
    "stack",
]


def _refused(e: pytest.ExceptionInfo[fk.StructureError], name: str, path: str = "p") -> None:
    msg = str(e.value)
    assert msg.startswith(f"at {path}: a {name} holds arrays, but no registry knows {name}"), msg
    assert f"fk.register({name}" in msg
    assert "fk.register_dataclass" in msg
    assert f"fk.register_leaf({name})" in msg


# ---------------------------------------------------------------- the issue's reproducers


def test_issue_reproducers(xp: Any, backend: Backend, tmp_path: Any) -> None:
    m = {"p": types.SimpleNamespace(w=xp.ones(2)), "q": xp.ones(1)}
    assert to_numpy(fk.add(m, m)["p"].w).tolist() == [2.0, 2.0]
    c = fk.copy(m)
    assert type(c["p"]) is types.SimpleNamespace
    assert c["p"] is not m["p"]
    assert c["p"].w is not m["p"].w
    if _writable(backend):
        fk.load_into(c, fk.scale(7.0, m))
        assert to_numpy(m["p"].w).tolist() == [1.0, 1.0]  # the copy does not alias the original
        assert to_numpy(c["p"].w).tolist() == [7.0, 7.0]
    fk.save(str(tmp_path / "m.safetensors"), m)
    back = fk.load(str(tmp_path / "m.safetensors"))
    assert sorted(fk.state_dict(back)) == ["p.w", "q"]
    assert sorted(fk.state_dict(m)) == ["p.w", "q"]
    s = fk.stack([m, m])
    assert tuple(s["p"].w.shape) == (2, 2)
    assert len(fk.unstack(s)) == 2


def test_dict_holder_of_scalars_is_shared(xp: Any) -> None:
    cfg = {"lr": 0.1}
    m = {"a": cfg, "b": cfg, "w": xp.ones(1)}
    out = fk.fmap(lambda x: x, m)
    assert out["a"] is out["b"]
    assert out["a"] is not cfg


# ---------------------------------------------------------------- the matrix: nodes


@pytest.mark.parametrize("holder", sorted(NODES))
@pytest.mark.parametrize("op", OPS)
def test_node_holder_cell(xp: Any, tmp_path: Any, holder: str, op: str) -> None:
    make, inner = NODES[holder]
    m = _model(xp, make)
    if op == "re.flatten":  # a definition of the holder's own structure
        _, re = fk.destructure(m)
        out: Any = re.flatten(fk.scale(2.0, m))
        assert to_numpy(out).tolist() == [2.0, 4.0, 6.0]
        return
    out = _ops(xp, tmp_path)[op](m)
    if op.startswith("destructure"):
        flat, re = out
        assert to_numpy(flat).tolist() == [1.0, 2.0, 3.0]
        assert [str(p) for p in re.paths] == [INNER[holder], "q"]
        new = re(flat * 2)
        assert type(new["p"]) is type(m["p"])
        assert to_numpy(inner(new["p"])).tolist() == [2.0, 4.0]
    elif op in ("add", "scale", "lincomb", "mean", "lerp", "sub", "copy", "normalize", "filter_normalize"):
        assert type(out["p"]) is type(m["p"])
        if holder == "deque":
            assert out["p"].maxlen == 5
        got = to_numpy(inner(out["p"]))
        want = {"add": [2.0, 4.0], "scale": [2.0, 4.0], "sub": [0.0, 0.0]}.get(op, [1.0, 2.0])
        if op in ("normalize", "filter_normalize"):
            assert got.shape == (2,)
        else:
            assert got.tolist() == want
        if op == "copy":
            assert out["p"] is not m["p"]
            assert inner(out["p"]) is not inner(m["p"])
    elif op == "dot":
        assert float(to_numpy(out)) == 14.0
    elif op == "norm":
        assert float(to_numpy(out)) == pytest.approx(14.0**0.5)
    elif op == "state_dict":
        assert sorted(out) == sorted([INNER[holder].replace("[0]", ".0"), "q"])  # dotted keys
    elif op == "save":
        back = fk.load(str(tmp_path / "m.safetensors"), like=m)
        assert type(back["p"]) is type(m["p"])
        assert to_numpy(inner(back["p"])).tolist() == [1.0, 2.0]
    elif op == "stack":
        assert type(out["p"]) is type(m["p"])
        assert tuple(inner(out["p"]).shape) == (2, 2)
        ms = fk.unstack(out)
        assert type(ms[1]["p"]) is type(m["p"])
        assert to_numpy(inner(ms[1]["p"])).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("holder", sorted(NODES))
def test_node_holder_walks(xp: Any, holder: str, backend: Backend) -> None:
    make, inner = NODES[holder]
    m = _model(xp, make)
    assert [str(p) for p, _ in fk.leaves_with_path(m)] == [INNER[holder], "q"]
    assert fk.KeyPath.get(fk.leaves_with_path(m)[0][0], m) is inner(m["p"])
    leaves, _td = fk.flatten(m)
    assert leaves[0] is inner(m["p"])
    structure = fk.fmapstructure(lambda x: 0, m)
    assert structure["p"] == ({"w": 0} if INNER[holder] == "p.w" else [0])
    s = fk.summary(m)
    assert not any(r.holder for r in s.rows)
    assert s.num_params == 3
    if _writable(backend):
        dst = fk.copy(m)
        fk.load_into(dst, fk.scale(3.0, m))
        assert to_numpy(inner(dst["p"])).tolist() == [3.0, 6.0]
        fk.load_state_dict(dst, fk.state_dict(m))
        assert to_numpy(inner(dst["p"])).tolist() == [1.0, 2.0]


def test_mappingproxy_is_rebuilt_read_only(xp: Any) -> None:
    m = {"p": types.MappingProxyType({"w": xp.ones(1)})}
    out = fk.fmap(lambda x: x, m)
    assert type(out["p"]) is types.MappingProxyType
    with pytest.raises(TypeError):
        out["p"]["w"] = 1  # type: ignore[index]


def test_attrs_static_field_and_frozen(xp: Any) -> None:
    a = AttrsBox(xp.ones(1), tag="keep")
    out = fk.scale(2.0, {"a": a, "f": FrozenBox(xp.ones(1))})
    assert out["a"].tag == "keep"
    assert [str(p) for p, _ in fk.leaves_with_path(a)] == ["w"]
    assert type(out["f"]) is FrozenBox
    assert to_numpy(out["f"].w).tolist() == [2.0]


# ---------------------------------------------------------------- the matrix: unknown holders


@pytest.mark.parametrize("holder", sorted(UNKNOWN))
@pytest.mark.parametrize("op", OPS)
def test_unknown_holder_cell(xp: Any, tmp_path: Any, holder: str, op: str) -> None:
    m = _model(xp, UNKNOWN[holder])
    before = to_numpy(m["q"]).tolist()
    with pytest.raises(fk.StructureError) as e:
        _ops(xp, tmp_path)[op](m)
    _refused(e, type(m["p"]).__qualname__)
    assert not (tmp_path / "m.safetensors").exists()  # nothing written
    assert to_numpy(m["q"]).tolist() == before


@pytest.mark.parametrize("holder", sorted(UNKNOWN))
def test_unknown_holder_loads_write_nothing(xp: Any, backend: Backend, holder: str) -> None:
    if not _writable(backend):
        pytest.skip("loads write into mutable arrays only")
    m = _model(xp, UNKNOWN[holder])
    src = {"p": UNKNOWN[holder](xp.asarray([5.0, 5.0])), "q": xp.asarray([9.0])}
    for op in (lambda: fk.load_into(m, src), lambda: fk.load_state_dict(m, {"q": xp.asarray([9.0])})):
        with pytest.raises(fk.StructureError) as e:
            op()
        _refused(e, type(m["p"]).__qualname__)
        assert to_numpy(m["q"]).tolist() == [3.0]  # all or nothing: dst unchanged
    plain = {"p": None, "q": xp.asarray([3.0])}
    with pytest.raises(fk.StructureError) as e:  # in the source tree too
        fk.load_into(plain, src)
    _refused(e, type(src["p"]).__qualname__)
    assert to_numpy(plain["q"]).tolist() == [3.0]


@pytest.mark.parametrize("holder", sorted(UNKNOWN))
def test_unknown_holder_is_a_leaf_to_the_maps(xp: Any, holder: str) -> None:
    m = _model(xp, UNKNOWN[holder])
    assert fk.leaves(m)[0] is m["p"]
    assert fk.flatten(m)[0][0] is m["p"]
    seen: list[Any] = []
    out = fk.fmap(lambda x: seen.append(x) or x, m)
    assert seen[0] is m["p"]
    assert out["p"] is m["p"]
    assert fk.fmapstructure(lambda x: x, m)["p"] is m["p"]
    s = fk.summary(m)
    assert [r.holder for r in s.rows] == [True, False]
    assert f"unknown holder at p: {type(m['p']).__name__}" in str(s)


def test_unstack_refuses_a_holder(xp: Any) -> None:
    with pytest.raises(fk.StructureError) as e:
        fk.unstack({"p": Plain(xp.ones((2, 2))), "q": xp.ones((2, 1))})
    _refused(e, "Plain")


def test_holder_deep_path_and_other_tree(xp: Any) -> None:
    m = {"layers": [{"h": Plain(xp.ones(1))}], "b": xp.zeros(1)}
    with pytest.raises(fk.StructureError) as e:
        fk.add(m, m)
    _refused(e, "Plain", "layers[0].h")
    a = {"h": None, "b": xp.zeros(1)}
    with pytest.raises(fk.StructureError) as e:  # the second model's holder is refused too
        fk.add(a, {"h": Plain(xp.ones(1)), "b": xp.zeros(1)})
    _refused(e, "Plain", "h")


def test_register_leaf_silences_it(xp: Any) -> None:
    class Const:
        def __init__(self, w: Any) -> None:
            self.w = w

    m = {"c": Const(xp.ones(2)), "q": xp.ones(1)}
    with pytest.raises(fk.StructureError):
        fk.copy(m)
    fk.register_leaf(Const)
    c = fk.copy(m)
    assert c["c"] is m["c"]  # a constant on purpose: carried, not copied
    _flat, re = fk.destructure(m)
    assert len(re) == 1
    assert not fk.summary(m).rows[0].holder


class _Node:
    def __init__(self, child: Any) -> None:
        self.child = child


class _Params(dict):  # type: ignore[type-arg]
    pass


def test_holders_found_deep_and_in_every_kind_of_container(xp: Any) -> None:
    """Arrays five or more objects below a leaf (a plain-Python model ``Model.encoder.blocks[i].attn.w``;
    the search stopped at three levels), in an attribute of a dict subclass, in a set, in what a
    functools.partial holds: unknown holders, refused, never silent constants."""
    deep = _Node(_Node([_Node(_Node({"w": xp.ones(2)}))]))
    holders = {
        "deep": deep,
        "dict_attr": _Params(lr=0.1),
        "set": {xp.ones(1)} if backend_hashable(xp) else None,
        "partial": functools.partial(max, xp.ones(1)),
    }
    holders["dict_attr"].weight = xp.ones(2)
    for h in holders.values():
        if h is None:
            continue
        m = {"h": h, "b": xp.zeros(1)}
        with pytest.raises(fk.StructureError, match=r"at h: a \w+ holds arrays"):
            fk.destructure(m)
        with pytest.raises(fk.StructureError, match=r"at h: a \w+ holds arrays"):
            fk.copy(m)
    cycle = _Node(None)
    cycle.child = _Node(cycle)  # a cycle of plain objects without arrays: searched once, fine
    far = _Node(None)
    node = far
    for _ in range(50):  # a long chain without arrays: searched to DEPTH, no hang, no refusal
        node.child = _Node(None)
        node = node.child
    fk.destructure({"c": cycle, "f": far, "b": xp.zeros(1)})


def backend_hashable(xp: Any) -> bool:
    try:
        hash(xp.ones(1))
    except TypeError:
        return False
    return True


def test_holder_of_no_arrays_is_fine(xp: Any) -> None:
    m = {"cfg": Plain(0.1), "d": DictSub(a=1), "q": xp.ones(1), "f": np.sin, "cls": Plain}
    assert to_numpy(fk.add(m, m)["q"]).tolist() == [2.0]
    fk.destructure(m)


# ---------------------------------------------------------------- sharing follows mutability


MUTABLE = {
    "dict": lambda: {"lr": 0.1},
    "list": lambda: [0.1, 2],
    "deque": lambda: collections.deque([0.1]),
    "UserDict": lambda: collections.UserDict(lr=0.1),
    "UserList": lambda: collections.UserList([0.1]),
    "SimpleNamespace": lambda: types.SimpleNamespace(lr=0.1),
    "attrs": lambda: AttrsBox(0.1),
    "empty_dict": lambda: {},
}


def _rebuilds(xp: Any) -> dict[str, Callable[[Any], Any]]:
    return {
        "fmap": lambda m: fk.fmap(lambda x: x, m),
        "fmap2": lambda m: fk.fmap(lambda x, y: x, m, m),
        "unflatten": lambda m: fk.unflatten(*reversed(fk.flatten(m))),
        "re": lambda m: (lambda fr: fr[1](fr[0]))(fk.destructure(m)),
        "add": lambda m: fk.add(m, m),
        "scale": lambda m: fk.scale(2.0, m),
        "copy": lambda m: fk.copy(m),
        "stack": lambda m: fk.stack([m, m]),
        "unstack": lambda m: fk.unstack(fk.stack([m, m]))[0],
        "partition_combine": lambda m: fk.combine(*fk.partition(m, lambda p, x: hasattr(x, "shape"))),
        "replace": lambda m: fk.replace(m, {fk.KeyPath(("w",)): xp.zeros(2)}),
    }


REBUILDS = ["fmap", "fmap2", "unflatten", "re", "add", "scale", "copy", "stack", "unstack"]
REBUILDS += ["partition_combine", "replace"]


@pytest.mark.parametrize("kind", sorted(MUTABLE))
@pytest.mark.parametrize("op", REBUILDS)
def test_mutable_node_of_scalars_is_shared(xp: Any, kind: str, op: str) -> None:
    sub = MUTABLE[kind]()
    m = {"a": sub, "b": sub, "w": xp.ones(2)}
    out = _rebuilds(xp)[op](m)
    assert out["a"] is out["b"], (kind, op)
    assert out["a"] is not sub


@pytest.mark.parametrize("op", ["fmap", "fmap2", "unflatten", "re", "add", "copy", "stack"])
def test_immutable_node_shared_only_with_a_cached_leaf(xp: Any, op: str) -> None:
    t = (1, 2)  # what CPython may intern: not shared, walked at each place
    m = {"a": t, "b": t, "w": xp.ones(2)}
    assert [str(p) for p, _ in fk.leaves_with_path(m)] == ["a[0]", "a[1]", "b[0]", "b[1]", "w"]
    out = _rebuilds(xp)[op](m)
    assert out["a"] == (1, 2)
    assert out["b"] == (1, 2)
    w = xp.ones(1)
    held = (w, 3)  # holds an identity-cached leaf: shared
    m2 = {"a": held, "b": held, "c": FrozenBox(3)}
    out2 = _rebuilds(xp)[op](m2) if op != "re" else fk.destructure(m2)[1](fk.destructure(m2)[0])
    assert out2["a"] is out2["b"]


def test_matcher_keeps_sharing_after_planning(xp: Any) -> None:
    for _ in range(4):  # a plain tree of one shape, met often: planned
        fk.fmap(lambda x: x, {"a": {"lr": 0.1}, "b": {"lr": 0.1}})
    cfg = {"lr": 0.1}
    out = fk.fmap(lambda x: x, {"a": cfg, "b": cfg})
    assert out["a"] is out["b"]
    lst = [1, 2]
    for _ in range(4):
        fk.leaves([[1, 2], [1, 2]])
    assert fk.leaves([lst, lst]) == [1, 2]
    for _ in range(4):  # empty containers: no leaf repeats, so the matcher compares the nodes themselves
        fk.fmap(lambda x: x, {"a": [], "b": {}, "c": [], "w": 1})
    e: list[Any] = []
    out = fk.fmap(lambda x: x, {"a": e, "b": {}, "c": e, "w": 1})
    assert out["a"] is out["c"]
    assert out["a"] is not e


def test_other_tree_not_sharing_drops_sharing(xp: Any) -> None:
    cfg = {"lr": 0.1}
    out = fk.fmap(lambda x, y: y, {"a": cfg, "b": cfg}, {"a": {"lr": 1.0}, "b": {"lr": 2.0}})
    assert out == {"a": {"lr": 1.0}, "b": {"lr": 2.0}}
    assert out["a"] is not out["b"]


def test_functorkit_never_imports_attrs() -> None:
    import subprocess
    import sys

    code = (
        "import sys, types, collections, functorkit as fk\n"
        "fk.fmap(lambda x: x, {'a': types.SimpleNamespace(w=1), 'b': collections.deque([1]), 'c': object()})\n"
        "assert 'attrs' not in sys.modules and 'attr' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_load_like_keeps_mutable_sharing(xp: Any, tmp_path: Any) -> None:
    cfg = types.SimpleNamespace(lr=0.1)
    m = {"a": cfg, "b": cfg, "w": xp.ones(2)}
    fk.save(str(tmp_path / "m.safetensors"), m)
    back = fk.load(str(tmp_path / "m.safetensors"), like=m)
    assert back["a"] is back["b"]
    assert back["a"] is not cfg
    assert to_numpy(back["w"]).tolist() == [1.0, 1.0]
