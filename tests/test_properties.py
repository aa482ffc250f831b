"""Property tests: every operation obeys one rule set (SPEC sections 2, 3, 4, 6 and 8).

Random trees of every node kind (dict, list, tuple, namedtuple, dataclass,
registered classes with and without a ``trainable`` function, ``fk.Diagonal``,
``fk.Transpose`` and, on torch, ``nn.Module`` trees) are generated with ties
(one array object at several positions), shared sub-trees (one node object at
several positions), scalar-only nodes met at several positions (as CPython's
interned tuples are) and leaves at both a frozen and a trainable position.
A plain recursive oracle written in this file (it shares no code with
functorkit) says what every operation must give. The rules:

R1  A leaf is identity-cached (a tie when met twice) unless its type is
    bool, int, float, complex, str, bytes or None.
R2  A node object met at several positions is a *shared sub-tree* only if it
    holds at least one identity-cached leaf (at any depth). A shared sub-tree
    is walked once (f called for its leaves once, at its first occurrence's
    paths; leaves/leaves_with_path list its leaves once) and comes back as ONE
    object from every operation that rebuilds (fmap, fmapstructure, re(p),
    fk.copy, fk.scale/fk.add/fk.lerp). A node without such leaves is walked at
    every position: f sees each position with its own path, and leaves() lists
    its scalars at every position.
R3  A distinct leaf is a *parameter* iff it is a floating or complex array and
    at least one of its positions is trainable (every node on the way declares
    that child trainable). A tie is never broken: every position of a tied
    leaf gets the same result, so a leaf at a frozen and at a trainable
    position is one parameter, updated at both.
R4  Walk order = leaves order = destructure's flat order; ties counted once;
    a parameter's path is its first path in walk order.

The number of examples per property is ``FUNCTORKIT_PROP_EXAMPLES`` (default
25); examples are derandomized so that every run checks the same trees. A
failure is reported unshrunk (the tree is printed) unless
``FUNCTORKIT_PROP_SHRINK=1``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import array_api_compat
import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

import functorkit as fk

from conftest import Backend, to_numpy
from helpers import path_str

EXAMPLES = int(os.environ.get("FUNCTORKIT_PROP_EXAMPLES", "25"))
# shrinking a failure re-runs every operation hundreds of times (minutes on JAX): off unless asked for
SHRINK = os.environ.get("FUNCTORKIT_PROP_SHRINK", "") not in ("", "0")
PROPS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, *([Phase.shrink] if SHRINK else [])],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)

SCALAR_TYPES = (bool, int, float, complex, str, bytes, type(None))
INTERNED = (3, 3)  # one tuple object of scalars, as CPython's constant folding/interning makes it


# ---------------------------------------------------------------------------
# node classes of the generated trees


class NT(NamedTuple):
    a: Any
    b: Any


@dataclasses.dataclass
class DC:
    x: Any
    y: Any
    tag: str = dataclasses.field(default="t", metadata={"static": True})


@attrs.define
class AT:
    """An attrs class (a node by default, mutable)."""

    x: Any
    y: Any
    tag: str = attrs.field(default="t", metadata={"static": True})


@attrs.frozen
class FAT:
    """A frozen attrs class (a node by default, immutable)."""

    x: Any
    y: Any


#: node types of the generated trees that are immutable (R2: shared only when holding a cached leaf)
IMMUTABLE = (tuple, NT, FAT, types.MappingProxyType)


class Box:
    """Registered node, mapping children, all trainable (no ``trainable=``)."""

    def __init__(self, u: Any, v: Any, tag: str = "box") -> None:
        self.u, self.v, self.tag = u, v, tag

    def __repr__(self) -> str:
        return f"Box({self.u!r}, {self.v!r}, tag={self.tag!r})"


class Row:
    """Registered node with sequence children, all trainable."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)

    def __repr__(self) -> str:
        return f"Row(*{self.items!r})"


class Net:
    """Registered node whose ``frozen`` child is declared not trainable."""

    def __init__(self, frozen: Any, live: Any) -> None:
        self.frozen, self.live = frozen, live

    def __repr__(self) -> str:
        return f"Net(frozen={self.frozen!r}, live={self.live!r})"


fk.register(
    Box,
    children=lambda b: ({"u": b.u, "v": b.v}, b.tag),
    rebuild=lambda tag, ch: Box(ch["u"], ch["v"], tag),
    replace=True,
)
fk.register(Row, children=lambda r: (list(r.items), None), rebuild=lambda aux, ch: Row(*ch), replace=True)
fk.register(
    Net,
    children=lambda n: ({"frozen": n.frozen, "live": n.live}, None),
    rebuild=lambda aux, ch: Net(ch["frozen"], ch["live"]),
    trainable=lambda n: ["live"],
    replace=True,
)


# ---------------------------------------------------------------------------
# the oracle: a plain recursive reference walk over the node kinds above


def _torch_module_type() -> Any:
    import sys

    torch = sys.modules.get("torch")
    return None if torch is None else torch.nn.Module


def _module_key(name: str) -> Any:
    return int(name) if name.isascii() and name.isdigit() and str(int(name)) == name else name


def children(x: Any) -> list[tuple[Any, Any, bool]] | None:
    """``[(key, child, trainable), ...]`` in walk order, or None for a leaf."""
    t = type(x)
    if t is dict:
        return [(k, v, True) for k, v in x.items()]
    if t in (list, tuple):
        return [(i, v, True) for i, v in enumerate(x)]
    if t is NT:
        return [("a", x.a, True), ("b", x.b, True)]
    if t is DC:
        return [("x", x.x, True), ("y", x.y, True)]
    if t is Box:
        return [("u", x.u, True), ("v", x.v, True)]
    if t is Row:
        return [(i, v, True) for i, v in enumerate(x.items)]
    if t in (AT, FAT):
        return [("x", x.x, True), ("y", x.y, True)]
    if t in (collections.deque, collections.UserList):
        return [(i, v, True) for i, v in enumerate(x)]
    if t in (collections.UserDict, types.MappingProxyType):
        return [(k, v, True) for k, v in x.items()]
    if t is types.SimpleNamespace:
        return [(k, v, True) for k, v in vars(x).items()]
    if t is Net:
        return [("frozen", x.frozen, False), ("live", x.live, True)]
    if t is fk.Diagonal:
        return [("diag", x.diag, True)]
    if t is fk.Transpose:
        return [("parent", x.parent, True)]
    module = _torch_module_type()
    if module is not None and isinstance(x, module):
        import torch

        out = []
        for name, v in x._parameters.items():
            if v is not None:
                frozen = isinstance(v, torch.nn.Parameter) and not v.requires_grad
                out.append((_module_key(name), v, not frozen))
        out += [(_module_key(n), v, False) for n, v in x._buffers.items() if v is not None]
        out += [(_module_key(n), v, True) for n, v in x._modules.items() if v is not None]
        return out
    return None


def structure_type(x: Any) -> type:
    """What fmapstructure turns node `x` into."""
    t = type(x)
    if t is tuple:
        return tuple
    if t in (list, Row, collections.deque, collections.UserList):
        return list
    return dict


def static(x: Any) -> Any:
    if type(x) is collections.deque:
        return x.maxlen
    if type(x) is AT:
        return x.tag
    if type(x) is DC:
        return x.tag
    if type(x) is Box:
        return x.tag
    return None


def is_cached(x: Any) -> bool:
    return type(x) not in SCALAR_TYPES


def is_array(x: Any) -> bool:
    return array_api_compat.is_array_api_obj(x) and not isinstance(x, np.generic)


def is_inexact(x: Any) -> bool:
    if not is_array(x):
        return False
    xp = array_api_compat.array_namespace(x)
    return bool(xp.isdtype(x.dtype, ("real floating", "complex floating")))


class Oracle:
    """Positions, walk, distinct leaves and parameters of one tree, by R1-R4."""

    def __init__(self, tree: Any) -> None:
        self.tree = tree
        self._holds: dict[int, bool] = {}
        # every position, shared sub-trees expanded at each occurrence: (path, leaf, trainable)
        self.positions: list[tuple[tuple[Any, ...], Any, bool]] = []
        self._expand(tree, (), True)
        # the walk: shared sub-trees (R2) visited once
        self.walk: list[tuple[tuple[Any, ...], Any]] = []
        self.shared_nodes: set[int] = set()
        self._seen_nodes: dict[int, int] = {}
        self._walk(tree, ())
        seen: set[int] = set()
        self.leaves: list[tuple[tuple[Any, ...], Any]] = []
        for path, leaf in self.walk:
            if not is_cached(leaf):
                self.leaves.append((path, leaf))
            elif id(leaf) not in seen:
                seen.add(id(leaf))
                self.leaves.append((path, leaf))
        trainable_ids = {id(leaf) for _, leaf, tr in self.positions if tr}
        self.params = [(p, x) for p, x in self.leaves if is_cached(x) and is_inexact(x) and id(x) in trainable_ids]
        self.param_ids = {id(x) for _, x in self.params}

    def holds_cached(self, x: Any) -> bool:
        if id(x) in self._holds:
            return self._holds[id(x)]
        ch = children(x)
        # R2: a mutable node counts like an identity-cached leaf (it is shared wherever it is met)
        res = is_cached(x) if ch is None else type(x) not in IMMUTABLE or any(self.holds_cached(v) for _, v, _ in ch)
        self._holds[id(x)] = res
        return res

    def _expand(self, x: Any, path: tuple[Any, ...], trainable: bool) -> None:
        ch = children(x)
        if ch is None:
            self.positions.append((path, x, trainable))
            return
        for k, v, tr in ch:
            self._expand(v, (*path, k), trainable and tr)

    def _walk(self, x: Any, path: tuple[Any, ...]) -> None:
        ch = children(x)
        if ch is None:
            self.walk.append((path, x))
            return
        if self.holds_cached(x):
            self._seen_nodes[id(x)] = self._seen_nodes.get(id(x), 0) + 1
            if self._seen_nodes[id(x)] > 1:
                self.shared_nodes.add(id(x))
                return
        for k, v, _ in ch:
            self._walk(v, (*path, k))


# ---------------------------------------------------------------------------
# tree specifications (pure data) and the builder that instantiates them


class ArrSpec:
    """One array object; ``param`` is None, or requires_grad of an nn.Parameter (torch)."""

    def __init__(self, dtype: str, shape: tuple[int, ...], vals: list[int], param: bool | None = None) -> None:
        self.dtype, self.shape, self.vals, self.param = dtype, shape, vals, param


class ObjSpec:
    """An opaque identity-cached non-array leaf."""


class ScalarSpec:
    def __init__(self, value: Any) -> None:
        self.value = value


class NodeSpec:
    def __init__(self, kind: str, kids: list[Any], extra: Any = None) -> None:
        self.kind, self.kids, self.extra = kind, kids, extra


FLOATS = ("float32", "float64")
COMPLEX = ("complex64", "complex128")
INTS = ("int32", "int64")
SHAPES: tuple[tuple[int, ...], ...] = ((), (1,), (3,), (2, 3))


@st.composite
def tree_specs(draw: Any, *, modules: bool) -> Any:
    """A random tree specification; sharing in the spec is sharing in the built tree."""
    arrays: list[ArrSpec] = []
    params: list[ArrSpec] = []
    objs: list[ObjSpec] = []
    nodes: list[NodeSpec] = []
    mods: list[NodeSpec] = []

    def vals(shape: tuple[int, ...]) -> list[int]:
        return draw(st.lists(st.integers(-3, 3), min_size=math.prod(shape), max_size=math.prod(shape)))

    def new_array(dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...] = SHAPES) -> ArrSpec:
        shape = draw(st.sampled_from(shapes))
        a = ArrSpec(draw(st.sampled_from(dtypes)), shape, vals(shape))
        arrays.append(a)
        return a

    def new_param() -> ArrSpec:
        shape = draw(st.sampled_from(SHAPES))
        a = ArrSpec(draw(st.sampled_from(FLOATS)), shape, vals(shape), param=draw(st.booleans()))
        params.append(a)
        return a

    def leaf() -> Any:
        kinds = ["float", "float", "complex", "int_array", "scalar", "object", "tie", "tie", "interned"]
        if modules:
            kinds += ["param_tie"]
        kind = draw(st.sampled_from(kinds))
        if kind == "tie" and arrays:
            return draw(st.sampled_from(arrays))
        if kind == "param_tie" and params:
            return draw(st.sampled_from(params))
        if kind == "object":
            if objs and draw(st.booleans()):
                return draw(st.sampled_from(objs))
            o = ObjSpec()
            objs.append(o)
            return o
        if kind == "interned":
            return ScalarSpec(INTERNED)
        if kind == "complex":
            return new_array(COMPLEX)
        if kind == "int_array":
            return new_array(INTS)
        if kind == "scalar":
            return ScalarSpec(draw(st.sampled_from([0, 1, 7, 2.5, -0.0, True, False, 1j, "s", "relu", b"b", None])))
        return new_array(FLOATS)

    def matrix() -> ArrSpec:
        two_d = [a for a in arrays if len(a.shape) == 2 and a.dtype in FLOATS]
        if two_d and draw(st.booleans()):
            return draw(st.sampled_from(two_d))
        return new_array(FLOATS, ((2, 3),))

    def vector() -> ArrSpec:
        one_d = [a for a in arrays if len(a.shape) == 1 and a.dtype in FLOATS]
        if one_d and draw(st.booleans()):
            return draw(st.sampled_from(one_d))
        return new_array(FLOATS, ((1,), (3,)))

    def module(depth: int) -> NodeSpec:
        if mods and draw(st.integers(0, 2)) == 0:
            return draw(st.sampled_from(mods))
        kind = draw(st.sampled_from(["linear", "block", "sequential"] if depth > 0 else ["linear", "block"]))
        if kind == "linear":
            weight = draw(st.sampled_from(params)) if params and draw(st.booleans()) else new_param()
            bias = new_param() if draw(st.booleans()) else None
            out = NodeSpec("linear", [("weight", weight), ("bias", bias)])
        elif kind == "sequential":
            out = NodeSpec("sequential", [module(depth - 1) for _ in range(draw(st.integers(1, 3)))])
        else:
            kids: list[tuple[str, str, Any]] = []
            for i in range(draw(st.integers(0, 2))):
                p = draw(st.sampled_from(params)) if params and draw(st.booleans()) else new_param()
                kids.append(("param", f"w{i}", p))
            for i in range(draw(st.integers(0, 2))):
                plain = [a for a in arrays if a.param is None]
                b = draw(st.sampled_from(plain)) if plain and draw(st.booleans()) else new_array(FLOATS + INTS)
                kids.append(("buffer", f"buf{i}", b))
            if depth > 0 and draw(st.booleans()):
                kids.append(("module", draw(st.sampled_from(["sub", "0"])), module(depth - 1)))
            out = NodeSpec("block", kids)
        mods.append(out)
        return out

    def node(depth: int) -> Any:
        if depth == 0 or draw(st.integers(0, 3)) == 0:
            return leaf()
        kinds = [
            "dict",
            "list",
            "tuple",
            "nt",
            "dc",
            "box",
            "row",
            "net",
            "net",
            "diag",
            "transpose",
            "share",
            "share",
            "scalar_node",
            "scalar_dict",
            "deque",
            "userdict",
            "userlist",
            "namespace",
            "proxy",
            "at",
            "fat",
        ]
        if modules:
            kinds += ["module", "module"]
        kind = draw(st.sampled_from(kinds))
        if kind == "share":
            if nodes:
                return draw(st.sampled_from(nodes))
            kind = "list"
        if kind == "module":
            return module(min(depth, 2))
        if kind == "scalar_node":
            out = NodeSpec("tuple", [ScalarSpec(draw(st.sampled_from([1, "a", None]))), ScalarSpec(2.0)])
        elif kind == "scalar_dict":  # mutable and holding only scalars: still shared when met twice (R2)
            out = NodeSpec("dict", [("lr", ScalarSpec(0.1)), ("n", ScalarSpec(3))])
        elif kind == "diag":
            out = NodeSpec("diag", [vector()])
        elif kind == "transpose":
            inner = NodeSpec("diag", [vector()]) if draw(st.integers(0, 3)) == 0 else matrix()
            out = NodeSpec("transpose", [inner])
        elif kind in ("nt", "dc", "box", "net", "at", "fat"):
            out = NodeSpec(kind, [node(depth - 1), node(depth - 1)], draw(st.sampled_from(["p", "q"])))
        else:
            kids = [node(depth - 1) for _ in range(draw(st.integers(0, 3)))]
            if kind in ("dict", "userdict", "namespace", "proxy"):
                keys = draw(
                    st.lists(
                        st.sampled_from(["k0", "k1", "k2", "x y", 7]),
                        min_size=len(kids),
                        max_size=len(kids),
                        unique=True,
                    )
                )
                if kind == "namespace":
                    keys = [f"a{k}" for k in keys]
                out = NodeSpec(kind, list(zip(keys, kids, strict=True)))
            else:
                out = NodeSpec(kind, kids)
        nodes.append(out)
        return out

    top = NodeSpec("dict", [("root", node(3)), ("extra", node(2))])
    if draw(st.booleans()):
        # a leaf at both a frozen and a trainable position, and a shared sub-tree across them
        a = new_array(FLOATS)
        sub = NodeSpec("dict", [("w", new_array(FLOATS))])
        top.kids.append(("mixed", NodeSpec("net", [a, a])))
        top.kids.append(("mixed_sub", NodeSpec("net", [sub, sub])))
    return top


class Builder:
    """Instantiates a spec with arrays of namespace `xp`; `offset` is added to every array value."""

    def __init__(self, xp: Any, offset: int = 0) -> None:
        self.xp, self.offset = xp, offset
        self.memo: dict[int, Any] = {}

    def array(self, s: ArrSpec) -> Any:
        xp = self.xp
        v = np.asarray(s.vals, dtype=np.float64).reshape(s.shape) + self.offset
        if s.dtype in COMPLEX:
            data: Any = (v + 1j * (v - 1)).tolist()
        elif s.dtype in INTS:
            data = v.astype(np.int64).tolist()
        else:
            data = v.tolist()
        x = xp.asarray(data, dtype=getattr(xp, s.dtype))
        if s.param is not None:
            import torch

            x = torch.nn.Parameter(x, requires_grad=s.param)
        return x

    def __call__(self, s: Any) -> Any:
        if type(s) is ScalarSpec:
            return s.value
        if id(s) in self.memo:
            return self.memo[id(s)]
        out = self._make(s)
        self.memo[id(s)] = out
        return out

    def _make(self, s: Any) -> Any:
        if type(s) is ArrSpec:
            return self.array(s)
        if type(s) is ObjSpec:
            return object()
        k = s.kind
        if k == "dict":
            return {key: self(v) for key, v in s.kids}
        if k in ("list", "tuple"):
            return (list if k == "list" else tuple)(self(v) for v in s.kids)
        if k == "row":
            return Row(*(self(v) for v in s.kids))
        if k == "deque":
            return collections.deque((self(v) for v in s.kids), maxlen=5)
        if k == "userlist":
            return collections.UserList(self(v) for v in s.kids)
        if k == "userdict":
            return collections.UserDict({key: self(v) for key, v in s.kids})
        if k == "namespace":
            return types.SimpleNamespace(**{key: self(v) for key, v in s.kids})
        if k == "proxy":
            return types.MappingProxyType({key: self(v) for key, v in s.kids})
        a, b = (self(v) for v in s.kids[:2]) if k in ("nt", "dc", "box", "net", "at", "fat") else (None, None)
        if k == "at":
            return AT(a, b, tag=s.extra)
        if k == "fat":
            return FAT(a, b)
        if k == "nt":
            return NT(a, b)
        if k == "dc":
            return DC(a, b, tag=s.extra)
        if k == "box":
            return Box(a, b, tag=s.extra)
        if k == "net":
            return Net(a, b)
        if k == "diag":
            return fk.Diagonal(self(s.kids[0]))
        if k == "transpose":
            return fk.Transpose(self(s.kids[0]))
        import torch

        if k == "linear":
            lin = torch.nn.Linear(1, 1, bias=s.kids[1][1] is not None)
            lin.weight = self(s.kids[0][1])
            if s.kids[1][1] is not None:
                lin.bias = self(s.kids[1][1])
            return lin
        if k == "sequential":
            return torch.nn.Sequential(*(self(v) for v in s.kids))
        m = torch.nn.Module()
        for slot, name, v in s.kids:
            if slot == "param":
                m.register_parameter(name, self(v))
            elif slot == "buffer":
                m.register_buffer(name, self(v))
            else:
                m.add_module(name, self(v))
        return m


def draw_trees(data: Any, xp: Any, backend: Backend) -> tuple[Any, Any, Oracle]:
    """``(tree, tree2, oracle)``: tree2 has tree's structure and tie pattern, every array value + 5."""
    spec = data.draw(tree_specs(modules=backend is Backend.TORCH), label="spec")
    tree = Builder(xp)(spec)
    tree2 = Builder(xp, offset=5)(spec)
    oracle = Oracle(tree)
    note(f"tree: {tree!r}")
    note(f"oracle leaves: {[(path_str(p), type(x).__name__) for p, x in oracle.leaves]}")
    note(f"oracle parameters: {[path_str(p) for p, _ in oracle.params]}")
    return tree, tree2, oracle


def to_float(x: Any) -> float:
    """A 0-d array as a Python float (torch: detached first, no autograd warning)."""
    return float(np_value(x))


def times(x: Any, c: float) -> Any:
    """``x * c`` as an array (NumPy turns 0-d arithmetic into a scalar)."""
    y = x * c
    return np.asarray(y) if isinstance(y, np.generic) else y


# ---------------------------------------------------------------------------
# checking helpers


def np_value(x: Any) -> np.ndarray:
    return to_numpy(x)


def snapshot(tree: Any) -> list[Any]:
    """Every position's node identities, leaf identity, and array dtype/flags/bytes."""
    out: list[Any] = []

    def rec(x: Any, path: tuple[Any, ...]) -> None:
        ch = children(x)
        if ch is None:
            if is_array(x):
                v = np_value(x)
                extra: Any = (
                    str(v.dtype),
                    v.shape,
                    v.tobytes(),
                    getattr(getattr(x, "flags", None), "writeable", None),
                    getattr(x, "requires_grad", None),
                )
            else:
                extra = (type(x), x if type(x) in SCALAR_TYPES else None)
            out.append((path, "leaf", id(x), extra))
            return
        out.append((path, type(x), id(x), static(x), [k for k, _, _ in ch]))
        for k, v, _ in ch:
            rec(v, (*path, k))

    rec(tree, ())
    return out


def shares_memory(a: Any, b: Any) -> bool:
    mod = type(a).__module__.split(".")[0]
    if mod == "numpy" and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    if mod == "torch" and type(b).__module__.split(".")[0] == "torch":
        if a.numel() == 0 or b.numel() == 0 or a.device.type == "meta":
            return False
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    if mod == "array_api_strict" and type(b).__module__.split(".")[0] == "array_api_strict":
        return bool(np.shares_memory(a._array, b._array))
    return False  # JAX, Dask: immutable, nothing can be written through an alias


def assert_same_value(got: Any, want: np.ndarray, dtype: Any, where: str) -> None:
    assert is_array(got), f"{where}: expected an array, got {type(got).__name__}"
    g = np_value(got)
    assert g.dtype == np.dtype(dtype), f"{where}: dtype {g.dtype} vs {np.dtype(dtype)}"
    assert g.shape == want.shape, f"{where}: shape {g.shape} vs {want.shape}"
    np.testing.assert_array_equal(g, want.astype(dtype), err_msg=where)


def rebuilt_positions(
    inp: Any, out: Any, oracle: Oracle, structure: bool = False
) -> Iterator[tuple[tuple[Any, ...], Any, Any, bool]]:
    """Zip input and output at every position (shared sub-trees at each occurrence).

    Checks node types, keys and static data on the way, and that every shared
    sub-tree (R2) comes back as one object; yields ``(path, in_leaf, out_leaf, trainable)``.
    """
    node_out: dict[int, int] = {}

    def rec(x: Any, y: Any, path: tuple[Any, ...], trainable: bool) -> Iterator[Any]:
        ch = children(x)
        where = path_str(path) or "<root>"
        if ch is None:
            yield path, x, y, trainable
            return
        if id(x) in oracle.shared_nodes:
            assert node_out.setdefault(id(x), id(y)) == id(y), f"shared sub-tree at {where} came back unshared"
        if structure:
            assert type(y) is structure_type(x), f"{where}: {type(y).__name__} for {type(x).__name__}"
            out_kids = list(y.items()) if type(y) is dict else list(enumerate(y))
        else:
            assert type(y) is type(x), f"{where}: {type(y).__name__} for {type(x).__name__}"
            assert static(y) == static(x), f"{where}: static data changed"
            out_ch = children(y)
            assert out_ch is not None
            out_kids = [(k, v) for k, v, _ in out_ch]
        if structure:  # fmapstructure's dict keys: compared as text (a module's "0" may stay a string)
            assert [str(k) for k, _ in out_kids] == [str(k) for k, _, _ in ch], f"{where}: keys differ"
        else:
            assert [k for k, _ in out_kids] == [k for k, _, _ in ch], f"{where}: keys differ"
        for (k, v, tr), (_, w) in zip(ch, out_kids, strict=True):
            yield from rec(v, w, (*path, k), trainable and tr)

    yield from rec(inp, out, (), True)


def check_ties(pairs: list[tuple[Any, Any]], where: str) -> None:
    """Identity-cached inputs map to outputs in one-to-one fashion: ties kept, nothing merged."""
    fwd: dict[int, int] = {}
    back: dict[int, int] = {}
    for x, y in pairs:
        if not is_cached(x):
            continue
        assert fwd.setdefault(id(x), id(y)) == id(y), f"{where}: a tie was broken"
        if is_array(y):
            assert back.setdefault(id(y), id(x)) == id(x), f"{where}: two distinct leaves became one object"


def expected_params(oracle: Oracle) -> tuple[np.ndarray, list[str]]:
    vals = [np_value(x) for _, x in oracle.params]
    dtype = np.result_type(*[v.dtype for v in vals]) if vals else np.dtype(np.float64)
    flat = np.concatenate([v.reshape(-1).astype(dtype) for v in vals]) if vals else np.zeros(0)
    return flat, [path_str(p) for p, _ in oracle.params]


def policy_for(oracle: Oracle) -> str:
    dtypes = {np_value(x).dtype for _, x in oracle.params}
    return "strict" if len(dtypes) <= 1 else "model"


# ---------------------------------------------------------------------------
# the properties


@PROPS
@given(data=st.data())
def test_leaves_and_paths_follow_the_oracle(xp: Any, backend: Backend, data: Any) -> None:
    """R1, R2, R4: leaves / leaves_with_path / fmap_with_path / fmap calls follow the walk."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    got = fk.leaves(tree)
    assert [id(x) for x in got] == [id(x) for _, x in oracle.leaves]
    got_wp = fk.leaves_with_path(tree)
    assert [str(p) for p, _ in got_wp] == [path_str(p) for p, _ in oracle.leaves]
    assert [tuple(p) for p, _ in got_wp] == [p for p, _ in oracle.leaves]
    assert [id(x) for _, x in got_wp] == [id(x) for _, x in oracle.leaves]
    calls: list[tuple[str, int]] = []
    fk.fmap_with_path(lambda p, x: calls.append((str(p), id(x))) or x, tree)
    assert calls == [(path_str(p), id(x)) for p, x in oracle.leaves]
    plain: list[int] = []
    fk.fmap(lambda x: plain.append(id(x)) or x, tree)
    assert plain == [id(x) for _, x in oracle.leaves]
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_fmap_and_fmapstructure_rebuild_types_ties_and_sharing(xp: Any, backend: Backend, data: Any) -> None:
    """R1, R2: fmap returns the input's node types, ties and shared sub-trees; fmapstructure plain data."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)

    def f(x: Any) -> Any:
        return times(x, 1) if is_inexact(x) else x

    for structure, op in ((False, fk.fmap), (True, fk.fmapstructure)):
        out = op(f, tree)
        pairs = []
        for path, x, y, _ in rebuilt_positions(tree, out, oracle, structure=structure):
            where = f"{op.__name__} at {path_str(path) or '<root>'}"
            if is_inexact(x):
                assert y is not x, where
                assert_same_value(y, np_value(x), np_value(x).dtype, where)
            else:
                assert y is x, where
            pairs.append((x, y))
        check_ties(pairs, op.__name__)
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_destructure_follows_the_oracle(xp: Any, backend: Backend, data: Any) -> None:
    """R3, R4: len(re), re.paths and the flat values are the oracle's parameters in walk order."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    want, paths = expected_params(oracle)
    flat, re = fk.destructure(tree, policy=policy_for(oracle))
    assert len(re) == want.size
    assert [str(p) for p in re.paths] == paths
    got = np_value(flat)
    assert got.ndim == 1
    if oracle.params:
        assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_norm_is_the_norm_of_the_parameters(xp: Any, backend: Backend, data: Any) -> None:
    """R3: fk.norm sums over exactly the oracle's parameters, each tie once, = norm of the flat vector."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    if not oracle.params:
        with pytest.raises(ValueError, match="no parameters"):
            fk.norm(tree)
        return
    want = math.sqrt(sum(float(np.sum(np.abs(np_value(x).astype(np.complex128)) ** 2)) for _, x in oracle.params))
    got = to_float(fk.norm(tree))
    assert got == pytest.approx(want, rel=1e-6)
    flat, _ = fk.destructure(tree, policy=policy_for(oracle))
    assert got == pytest.approx(float(np.linalg.norm(np_value(flat).astype(np.complex128))), rel=1e-6)
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_re_rebuilds_values_ties_and_sharing(xp: Any, backend: Backend, data: Any) -> None:
    """R2, R3: re(flat) gives the model back: parameters from flat, constants as they were, ties, sharing."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    flat, re = fk.destructure(tree, policy=policy_for(oracle))
    flat_before = np_value(flat)
    out = re(flat)
    pairs = []
    for path, x, y, _ in rebuilt_positions(tree, out, oracle):
        where = f"re(flat) at {path_str(path) or '<root>'}"
        if id(x) in oracle.param_ids:
            assert_same_value(y, np_value(x), np_value(x).dtype, where)
        else:
            assert y is x, f"{where}: a constant must come back as the very same object"
        pairs.append((x, y))
    check_ties(pairs, "re(flat)")
    # a second vector: every position of a parameter (frozen ones included) takes its new values
    out2 = re(flat * 2)
    for path, x, y, _ in rebuilt_positions(tree, out2, oracle):
        if id(x) in oracle.param_ids:
            assert_same_value(y, 2 * np_value(x), np_value(x).dtype, f"re(2 flat) at {path_str(path)}")
    np.testing.assert_array_equal(np_value(flat), flat_before)
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_copy_keeps_ties_and_sharing_and_aliases_nothing(xp: Any, backend: Backend, data: Any) -> None:
    """fk.copy: every array a new, unaliased array of equal value; ties and shared sub-trees kept."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    out = fk.copy(tree)
    pairs = []
    inputs = [x for _, x, _ in oracle.positions if is_array(x)]
    for path, x, y, _ in rebuilt_positions(tree, out, oracle):
        where = f"fk.copy at {path_str(path) or '<root>'}"
        if is_array(x):
            assert y is not x, where
            assert_same_value(y, np_value(x), np_value(x).dtype, where)
            assert not any(shares_memory(y, z) for z in inputs), f"{where}: the copy aliases an input"
        else:
            assert y is x, where
        pairs.append((x, y))
    check_ties(pairs, "fk.copy")
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_trainable_only_maps_exactly_the_parameters(xp: Any, backend: Backend, data: Any) -> None:
    """R3: fmap(trainable_only=True) calls f once per parameter, in walk order, and puts it at every position."""
    tree, _, oracle = draw_trees(data, xp, backend)
    before = snapshot(tree)
    calls: list[int] = []

    def f(x: Any) -> Any:
        calls.append(id(x))
        return times(x, 2)

    out = fk.fmap(f, tree, trainable_only=True)
    assert calls == [id(x) for _, x in oracle.params]
    pairs = []
    for path, x, y, _ in rebuilt_positions(tree, out, oracle):
        where = f"fmap(trainable_only=True) at {path_str(path) or '<root>'}"
        if id(x) in oracle.param_ids:
            assert_same_value(y, 2 * np_value(x), np_value(x).dtype, where)
        else:
            assert y is x, where
        pairs.append((x, y))
    check_ties(pairs, "fmap(trainable_only=True)")
    assert snapshot(tree) == before


@PROPS
@given(data=st.data())
def test_arithmetic_acts_on_exactly_the_parameters(xp: Any, backend: Backend, data: Any) -> None:
    """R2, R3: fk.scale / fk.add / fk.lerp change exactly the parameters, at every position; sharing kept."""
    tree, tree2, oracle = draw_trees(data, xp, backend)
    before, before2 = snapshot(tree), snapshot(tree2)
    inputs = [x for _, x, _ in oracle.positions if is_array(x)] + [x for x in fk.leaves(tree2) if is_array(x)]
    second = dict(zip([id(x) for _, x, _ in oracle.positions], [x for _, x, _ in Oracle(tree2).positions], strict=True))
    cases: list[tuple[str, Any, Callable[[Any], np.ndarray]]] = [
        ("scale", fk.scale(2, tree), lambda x: 2 * np_value(x)),
        ("add", fk.add(tree, tree2), lambda x: np_value(x) + np_value(second[id(x)])),
        ("lerp", fk.lerp(tree, tree2, 0.25), lambda x: np_value(x) + 0.25 * (np_value(second[id(x)]) - np_value(x))),
    ]
    for name, out, want in cases:
        pairs = []
        for path, x, y, _ in rebuilt_positions(tree, out, oracle):
            where = f"fk.{name} at {path_str(path) or '<root>'}"
            if id(x) in oracle.param_ids:
                assert_same_value(y, want(x), np_value(x).dtype, where)
            elif is_array(x):
                assert y is not x, f"{where}: a constant array must be copied"
                assert_same_value(y, np_value(x), np_value(x).dtype, where)
            else:
                assert y is x, where
            if is_array(y):
                assert not any(shares_memory(y, z) for z in inputs), f"{where}: the result aliases an input"
            pairs.append((x, y))
        check_ties(pairs, f"fk.{name}")
    assert snapshot(tree) == before
    assert snapshot(tree2) == before2


@PROPS
@given(data=st.data())
def test_load_into_a_copy_round_trips(xp: Any, backend: Backend, data: Any) -> None:
    """load_into(fk.copy(m), m2) writes m2's values at every array position, keeps ties, aliases nothing."""
    tree, tree2, oracle = draw_trees(data, xp, backend)
    before2 = snapshot(tree2)
    dst = fk.copy(tree)
    if backend in (Backend.JAX, Backend.DASK) and any(is_array(x) for _, x in oracle.leaves):
        with pytest.raises(TypeError):
            fk.load_into(dst, tree2)
        return
    dst_before = snapshot(dst)
    ids_before = [(p, kind, i) for p, kind, i, *_ in dst_before]
    assert fk.load_into(dst, tree2) is dst
    after = snapshot(dst)
    assert [(p, kind, i) for p, kind, i, *_ in after] == ids_before, "load_into replaced objects instead of writing"
    src_arrays = [x for x in fk.leaves(tree2) if is_array(x)]
    for (path, x, _), (_, y, _) in zip(Oracle(dst).positions, Oracle(tree2).positions, strict=True):
        if is_array(x):
            where = f"load_into at {path_str(path)}"
            assert_same_value(x, np_value(y), np_value(x).dtype, where)
            assert not any(shares_memory(x, z) for z in src_arrays), f"{where}: dst aliases src"
    assert snapshot(tree2) == before2


# ---------------------------------------------------------------------------
# the reproducers, on every backend


def _arr(xp: Any, *vals: float) -> Any:
    return xp.asarray(list(vals), dtype=xp.float64)


def test_leaf_at_frozen_and_trainable_position_is_one_parameter(xp: Any) -> None:
    """Reproducer (a): Net(w, w) has one parameter; destructure and norm agree."""
    w = _arr(xp, 1.0, 2.0)
    m = Net(w, w)
    flat, re = fk.destructure(m)
    assert len(re) == 2
    assert [str(p) for p in re.paths] == ["frozen"]
    np.testing.assert_array_equal(np_value(flat), [1.0, 2.0])
    assert to_float(fk.norm(m)) == pytest.approx(math.sqrt(5.0))
    out = re(flat * 3)
    assert out.frozen is out.live
    np.testing.assert_array_equal(np_value(out.live), [3.0, 6.0])
    s = fk.scale(2, m)
    assert s.frozen is s.live
    np.testing.assert_array_equal(np_value(s.live), [2.0, 4.0])
    mapped = fk.fmap(lambda x: x * 10, m, trainable_only=True)
    assert mapped.frozen is mapped.live
    np.testing.assert_array_equal(np_value(mapped.frozen), [10.0, 20.0])


def test_sub_tree_shared_by_frozen_and_trainable_positions(xp: Any) -> None:
    """Reproducer (b): the shared dict comes back shared from re(p) and fk.scale, and is a parameter."""
    sub = {"x": _arr(xp, 1.0, 2.0)}
    m = Net(sub, sub)
    flat, re = fk.destructure(m)
    assert len(re) == 2
    assert [str(p) for p in re.paths] == ["frozen.x"]
    out = re(flat * 3)
    assert out.frozen is out.live
    np.testing.assert_array_equal(np_value(out.live["x"]), [3.0, 6.0])
    s = fk.scale(2, m)
    assert s.frozen is s.live
    np.testing.assert_array_equal(np_value(s.frozen["x"]), [2.0, 4.0])
    c = fk.copy(m)
    assert c.frozen is c.live
    st_out = fk.fmapstructure(lambda x: x, m)
    assert st_out["frozen"] is st_out["live"]
    assert len(fk.leaves(m)) == 1


def test_interned_scalar_tuples_are_not_shared(xp: Any) -> None:
    """Reproducer (c): an equal scalar tuple at two places is visited at both, with its own paths."""
    tree = {"c1": {"k": (3, 3)}, "c2": {"k": (3, 3)}}
    k = (3, 3)
    forced = {"c1": {"k": k, "w": _arr(xp, 1.0)}, "c2": {"k": k}}
    for t, extra in ((tree, []), (forced, ["c1.w"])):
        seen: list[str] = []
        out = fk.fmap_with_path(lambda p, x, seen=seen: seen.append(str(p)) or x, t)
        assert seen == ["c1.k[0]", "c1.k[1]", *extra, "c2.k[0]", "c2.k[1]"]
        assert out["c2"]["k"] == (3, 3)
        assert len(fk.leaves(t)) == 4 + len(extra)
        assert [str(p) for p, _ in fk.leaves_with_path(t)] == seen
