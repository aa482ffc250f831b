"""Pytree registries bridged both ways (SPEC section 9): JAX, optree and torch ``_pytree`` nodes are
functorkit nodes; functorkit's nodes are JAX and torch nodes; ``Restructure``/``TreeDef`` are static
``jax.jit`` arguments; an object no registry knows that holds arrays is never silently a constant."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

ROOT = Path(__file__).resolve().parents[1]


def run_fresh(code: str) -> str:
    """Run `code` in a fresh interpreter (this checkout on the path); return its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


# ---------------------------------------------------------------- bridged in: JAX


@pytest.fixture
def jax() -> Any:
    return pytest.importorskip("jax")


def test_jax_registered_class_is_a_node(jax: Any) -> None:
    jnp = jax.numpy

    @jax.tree_util.register_pytree_node_class
    class Lin:
        def __init__(self, w: Any, b: Any) -> None:
            self.w, self.b = w, b

        def tree_flatten(self) -> Any:
            return (self.w, self.b), "lin"

        @classmethod
        def tree_unflatten(cls, aux: Any, ch: Any) -> Any:
            assert aux == "lin"
            return cls(*ch)

    model = {"l": Lin(jnp.ones(2), jnp.zeros(3))}
    flat, re = fk.destructure(model)
    assert flat.shape == (5,)  # not a silent length-0 vector
    assert [str(p) for p in re.paths] == ["l[0]", "l[1]"]  # no keys from JAX: positions
    out = re(jnp.arange(5.0))
    assert type(out["l"]) is Lin
    np.testing.assert_array_equal(np.asarray(out["l"].b), [2.0, 3.0, 4.0])
    doubled = fk.fmap(lambda x: x * 2, model)
    assert type(doubled["l"]) is Lin
    np.testing.assert_array_equal(np.asarray(doubled["l"].w), [2.0, 2.0])


def test_jax_dataclass_keys_and_meta_fields(jax: Any) -> None:
    jnp = jax.numpy

    @dataclasses.dataclass
    class Dense:
        w: Any
        b: Any
        act: str

    jax.tree_util.register_dataclass(Dense, data_fields=["w", "b"], meta_fields=["act"])
    model = [Dense(jnp.ones(2), jnp.zeros(1), "relu")]
    paths = [str(p) for p, _ in fk.leaves_with_path(model)]
    assert paths == ["[0].w", "[0].b"]  # JAX's GetAttrKey names; the meta field is aux, not a leaf
    assert fk.fmapstructure(lambda x: x.shape, model) == [{"w": (2,), "b": (1,)}]
    flat, re = fk.destructure(model)
    out = re(flat + 1)
    assert type(out[0]) is Dense
    assert out[0].act == "relu"
    np.testing.assert_array_equal(np.asarray(out[0].b), [1.0])


def test_jax_with_keys_registration(jax: Any) -> None:
    jnp = jax.numpy
    tu = jax.tree_util

    class Pair:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    tu.register_pytree_with_keys(
        Pair,
        lambda p: (((tu.DictKey("first"), p.a), (tu.DictKey("second"), p.b)), None),
        lambda aux, ch: Pair(*ch),
    )
    pairs = fk.leaves_with_path({"p": Pair(jnp.ones(1), jnp.ones(2))})
    assert [tuple(p) for p, _ in pairs] == [("p", "first"), ("p", "second")]


def test_functorkit_registration_wins_over_jax(jax: Any) -> None:
    jnp = jax.numpy

    class Both:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    jax.tree_util.register_pytree_node(Both, lambda x: ((x.a, x.b), None), lambda aux, ch: Both(*ch))
    fk.register(Both, children=lambda x: ({"a": x.a}, x.b), rebuild=lambda aux, ch: Both(ch["a"], aux))
    leaves = fk.leaves_with_path(Both(jnp.ones(1), jnp.ones(2)))
    assert [str(p) for p, _ in leaves] == ["a"]  # functorkit's own children, not JAX's two
    # and JAX keeps its own registration (the class was already registered there: left alone)
    assert len(jax.tree_util.tree_leaves(Both(jnp.ones(1), jnp.ones(2)))) == 2


# ---------------------------------------------------------------- bridged in: optree, torch


def test_optree_registered_class_is_a_node() -> None:
    optree = pytest.importorskip("optree")

    class Box:
        def __init__(self, x: Any, y: Any) -> None:
            self.x, self.y = x, y

    optree.register_pytree_node(
        Box, lambda b: ((b.x, b.y), "meta", ("x", "y")), lambda meta, ch: Box(*ch), namespace="functorkit-test"
    )

    model = {"box": Box(np.ones(2), np.zeros(1))}
    assert [str(p) for p, _ in fk.leaves_with_path(model)] == ["box.x", "box.y"]
    _flat, re = fk.destructure(model)
    out = re(np.arange(3.0))
    assert type(out["box"]) is Box
    np.testing.assert_array_equal(out["box"].y, [2.0])


def test_torch_pytree_class_is_a_node() -> None:
    torch = pytest.importorskip("torch")
    pytree = torch.utils._pytree

    class TP:
        def __init__(self, w: Any, b: Any) -> None:
            self.w, self.b = w, b

    pytree.register_pytree_node(
        TP,
        lambda t: ([t.w, t.b], "ctx"),
        lambda vals, ctx: TP(*vals),
        flatten_with_keys_fn=lambda t: ([(pytree.GetAttrKey("w"), t.w), (pytree.GetAttrKey("b"), t.b)], "ctx"),
    )
    model = {"t": TP(torch.ones(2), torch.zeros(3))}
    _flat, re = fk.destructure(model)
    assert [str(p) for p in re.paths] == ["t.w", "t.b"]
    out = re(torch.arange(5.0))
    assert type(out["t"]) is TP
    assert out["t"].b.tolist() == [2.0, 3.0, 4.0]
    # torch's own registrations too: a deque holding tensors is a node once torch is imported
    from collections import deque

    assert len(fk.leaves({"q": deque([torch.ones(1), torch.ones(2)])})) == 2


# ---------------------------------------------------------------- bridged out


def test_registered_class_is_a_jax_pytree(jax: Any) -> None:
    jnp = jax.numpy

    @fk.register_dataclass
    @dataclasses.dataclass
    class Layer:
        w: Any
        b: Any
        name: str = dataclasses.field(default="l", metadata={"static": True})

    layer = Layer(jnp.ones(3), jnp.zeros(1))
    mapped = jax.tree_util.tree_map(lambda x: x + 1, layer)
    assert type(mapped) is Layer
    assert mapped.name == "l"
    np.testing.assert_array_equal(np.asarray(mapped.b), [1.0])
    keys = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(layer)]
    assert keys == [".w", ".b"]
    g = jax.grad(lambda m: jnp.sum(m.w**2) + jnp.sum(m.b))(layer)  # grad through a registered class
    assert type(g) is Layer
    np.testing.assert_array_equal(np.asarray(g.w), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(np.asarray(g.b), [1.0])
    out = jax.jit(lambda m: m.w * 2)(layer)
    np.testing.assert_array_equal(np.asarray(out), [2.0, 2.0, 2.0])


def test_structured_wrappers_are_jax_pytrees(jax: Any) -> None:
    jnp = jax.numpy
    d = fk.Diagonal(jnp.asarray([1.0, 2.0]))
    t = fk.Transpose(jnp.ones((3, 2)))
    assert len(jax.tree_util.tree_leaves(d)) == 1
    out = jax.jit(lambda d, t: (d @ t).sum())(d, t)
    assert float(out) == 9.0
    g = jax.grad(lambda d: (d @ jnp.ones((2, 1))).sum())(d)
    assert type(g) is fk.Diagonal
    np.testing.assert_array_equal(np.asarray(g.diag), [1.0, 1.0])


def test_registered_class_is_a_torch_pytree() -> None:
    torch = pytest.importorskip("torch")
    pytree = torch.utils._pytree

    class Pair:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    fk.register(Pair, children=lambda p: ({"a": p.a, "b": p.b}, None), rebuild=lambda aux, ch: Pair(ch["a"], ch["b"]))
    mapped = pytree.tree_map(lambda x: x * 3, Pair(torch.ones(1), torch.ones(2)))
    assert type(mapped) is Pair
    assert mapped.b.tolist() == [3.0, 3.0]
    paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(Pair(torch.ones(1), torch.ones(2)))[0]]
    assert paths == [".a", ".b"]
    assert len(pytree.tree_leaves(fk.Transpose(torch.ones(2, 2)))) == 1


def test_export_false_opts_out(jax: Any) -> None:
    class Private:
        def __init__(self, a: Any) -> None:
            self.a = a

    fk.register(Private, children=lambda p: ([p.a], None), rebuild=lambda aux, ch: Private(ch[0]), export=False)
    obj = Private(jax.numpy.ones(2))
    assert fk.leaves(obj)[0] is obj.a  # a functorkit node
    assert jax.tree_util.tree_leaves(obj) == [obj]  # but a leaf to JAX
    with pytest.raises(TypeError, match="export"):
        fk.register(Private, children=lambda p: ([p.a], None), rebuild=lambda aux, ch: ch, replace=True, export=1)  # type: ignore[arg-type]


def test_export_false_opts_out_of_torch() -> None:
    torch = pytest.importorskip("torch")

    @fk.register_dataclass(export=False)
    @dataclasses.dataclass
    class Quiet:
        a: Any

    obj = Quiet(torch.ones(1))
    assert torch.utils._pytree.tree_leaves(obj) == [obj]
    assert fk.leaves(obj) == [obj.a]


def test_already_registered_in_torch_is_left_alone() -> None:
    torch = pytest.importorskip("torch")
    pytree = torch.utils._pytree

    class Own:
        def __init__(self, a: Any, b: Any) -> None:
            self.a, self.b = a, b

    pytree.register_pytree_node(Own, lambda o: ([o.a], o.b), lambda vals, ctx: Own(vals[0], ctx))
    fk.register(Own, children=lambda o: ([o.a, o.b], None), rebuild=lambda aux, ch: Own(*ch))
    assert len(pytree.tree_leaves(Own(torch.ones(1), torch.ones(2)))) == 1  # torch's own flatten kept
    assert len(fk.leaves(Own(torch.ones(1), torch.ones(2)))) == 2  # functorkit's own


@pytest.mark.parametrize("jax_first", [True, False])
def test_export_whichever_import_order(jax_first: bool) -> None:
    pytest.importorskip("jax")
    first, second = ("import jax", "") if jax_first else ("", "import jax")
    out = run_fresh(
        f"""
        {first}
        import functorkit as fk
        import numpy as np
        class Early:
            def __init__(self, a):
                self.a = a
        fk.register(Early, children=lambda e: ([e.a], None), rebuild=lambda aux, ch: Early(ch[0]))
        {second}
        fk.destructure({{"w": np.ones(1)}})  # functorkit meets JAX's import here at the latest
        print(len(jax.tree_util.tree_leaves([Early(jax.numpy.ones(2)), fk.Diagonal(jax.numpy.ones(3))])))
        """
    )
    assert out == "2"


def test_import_functorkit_imports_no_backend() -> None:
    out = run_fresh(
        """
        import sys
        import functorkit as fk
        import numpy as np
        class C:
            def __init__(self, a):
                self.a = a
        fk.register(C, children=lambda c: ([c.a], None), rebuild=lambda aux, ch: C(ch[0]))
        fk.destructure({"c": C(np.ones(2)), "h": np.zeros(1)})
        print(sorted(m for m in ("jax", "torch", "optree", "dask", "cupy") if m in sys.modules))
        """
    )
    assert out == "[]"


# ---------------------------------------------------------------- Restructure / TreeDef under jax.jit


def test_restructure_and_treedef_are_static_jit_arguments(jax: Any) -> None:
    jnp = jax.numpy
    traces = []

    def model() -> dict[str, Any]:
        return {"w": jnp.ones((2, 2)), "b": jnp.zeros(2), "act": "tanh"}

    @jax.jit
    def loss(p: Any, re: Any) -> Any:
        traces.append(1)
        m = re(p)
        return jnp.sum(jnp.tanh(m["w"] @ m["b"] + 1.0))

    flat, re = fk.destructure(model())
    flat2, re2 = fk.destructure(model())
    assert re == re2
    assert hash(re) == hash(re2)
    assert re is not re2
    first = loss(flat, re)
    second = loss(flat2, re2)
    assert len(traces) == 1  # two equal Restructures: one cache entry
    np.testing.assert_allclose(np.asarray(first), np.asarray(second))
    g = jax.grad(lambda p, re: jnp.sum(re(p)["w"] ** 2))(flat, re)
    np.testing.assert_array_equal(np.asarray(g), [2.0, 2.0, 2.0, 2.0, 0.0, 0.0])

    other_flat, other = fk.destructure({"w": jnp.ones((2, 2)), "b": jnp.zeros(2), "act": "relu"})
    assert other != re  # a different constant: a different program
    loss(other_flat, other)
    assert len(traces) == 2

    td_traces = []

    @jax.jit
    def rebuild(leaves: Any, td: Any) -> Any:
        td_traces.append(1)
        return fk.unflatten(td, leaves)["w"].sum()

    leaves, td = fk.flatten({"w": jnp.ones((2, 2)), "b": [jnp.zeros(2)]})
    leaves2, td2 = fk.flatten({"w": jnp.ones((2, 2)), "b": [jnp.zeros(2)]})
    assert td == td2
    assert td is not td2
    rebuild(leaves, td)
    rebuild(leaves2, td2)
    assert len(td_traces) == 1


def test_restructure_as_torch_func_argument() -> None:
    torch = pytest.importorskip("torch")
    flat, re = fk.destructure({"w": torch.ones(3), "scale": 2.0})
    batch = torch.arange(12.0).reshape(4, 3)
    out = torch.func.vmap(lambda p, re: re(p)["w"].sum() * re(p)["scale"])(batch, re)  # default in_dims
    assert out.tolist() == [6.0, 24.0, 42.0, 60.0]
    g = torch.func.grad(lambda p, re: (re(p)["w"] ** 2).sum())(flat, re)
    assert g.tolist() == [2.0, 2.0, 2.0]


# ---------------------------------------------------------------- no silent constant


class Holder:
    def __init__(self, w: Any) -> None:
        self.w = w


class Slotted:
    __slots__ = ("w",)

    def __init__(self, w: Any) -> None:
        self.w = w


class Bag(Mapping[str, Any]):
    def __init__(self, **kw: Any) -> None:
        self._d = kw

    def __getitem__(self, k: str) -> Any:
        return self._d[k]

    def __iter__(self) -> Any:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)


class Row(Sequence[Any]):
    def __init__(self, *items: Any) -> None:
        self._items = list(items)

    def __getitem__(self, i: Any) -> Any:
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)


class DictSub(dict):  # type: ignore[type-arg]
    pass


class Fn:
    """A callable object holding a parameter (a hand-made layer)."""

    def __init__(self, w: Any) -> None:
        self.w = w

    def __call__(self, x: Any) -> Any:
        return x * self.w


HOLDERS = {
    "attributes": lambda a: Holder(a),
    "slots": lambda a: Slotted(a),
    "mapping": lambda a: Bag(w=a),
    "sequence": lambda a: Row(1, a),
    "dict_subclass": lambda a: DictSub(w=a),
    "callable": lambda a: Fn(a),
    "nested": lambda a: Holder({"inner": [a]}),
    "two_levels": lambda a: Holder(Holder(a)),
}


@pytest.mark.parametrize("kind", sorted(HOLDERS))
def test_unknown_holder_is_reported(xp: Any, kind: str) -> None:
    a = xp.ones(2)
    obj = HOLDERS[kind](a)
    name = type(obj).__qualname__
    model = {"layers": [{"h": obj}], "b": xp.zeros(1)}
    with pytest.raises(fk.StructureError, match=rf"at layers\[0\]\.h: .*{name}.*fk\.register\({name}") as e:
        fk.destructure(model)
    assert "fk.register_dataclass" in str(e.value)
    # SPEC 12 (third round): refused under every policy, not carried as a constant under "model"/"flat"
    for pol in ("model", "flat"):
        with pytest.raises(fk.StructureError, match=rf"at layers\[0\]\.h: .*{name}.*fk\.register_leaf\({name}\)"):
            fk.destructure(model, policy=pol)


def test_unknown_holder_of_no_arrays_or_a_leaf_on_purpose(xp: Any) -> None:
    class Config:
        def __init__(self) -> None:
            self.lr = 0.1
            self.name = "adam"

    flat, re = fk.destructure({"cfg": Config(), "w": xp.ones(2), "f": np.sin, "cls": Holder})
    assert len(re) == 2
    assert re.explain(flat).holders == []

    class Frozen:
        def __init__(self, w: Any) -> None:
            self.w = w

    fk.register_leaf(Frozen)
    flat, re = fk.destructure({"frozen": Frozen(xp.ones(3)), "w": xp.ones(2)})
    assert len(re) == 2


def test_jax_class_met_before_its_jax_registration_is_not_silent(jax: Any) -> None:
    class Late:
        def __init__(self, w: Any) -> None:
            self.w = w

    obj = Late(jax.numpy.ones(2))
    assert fk.leaves(obj) == [obj]  # met first as a leaf (no registry knew it yet) and cached so
    jax.tree_util.register_pytree_node(Late, lambda x: ((x.w,), None), lambda aux, ch: Late(*ch))
    with pytest.raises(fk.StructureError, match=r"at h: .*Late"):
        fk.destructure({"h": obj})


def test_torch_registration_mirrored_into_optree_keeps_torch_keys() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("optree")
    importlib.import_module("torch.utils._cxx_pytree")  # copies torch registrations into optree's "torch"
    pytree = torch.utils._pytree

    class Mirrored:
        def __init__(self, w: Any) -> None:
            self.w = w

    pytree.register_pytree_node(
        Mirrored,
        lambda m: ([m.w], None),
        lambda vals, ctx: Mirrored(vals[0]),
        flatten_with_keys_fn=lambda m: ([(pytree.GetAttrKey("w"), m.w)], None),
    )
    assert [str(p) for p, _ in fk.leaves_with_path({"m": Mirrored(torch.ones(1))})] == ["m.w"]
