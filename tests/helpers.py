"""A shared zoo of trees: every walk test runs on the same structures."""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple

import functorkit as fk


class Point(NamedTuple):
    x: Any
    y: Any


@dataclasses.dataclass
class Layer:
    weight: Any
    bias: Any
    name: str = dataclasses.field(default="layer", metadata={"static": True})


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: Any
    b: Any


class Pair:
    """A registered (non-dataclass) node with mapping children."""

    def __init__(self, left: Any, right: Any, tag: str = "pair") -> None:
        self.left, self.right, self.tag = left, right, tag

    def __eq__(self, other: object) -> bool:
        return type(other) is Pair and (self.left, self.right, self.tag) == (other.left, other.right, other.tag)

    __hash__ = None  # type: ignore[assignment]


class Seq:
    """A registered node with sequence children."""

    def __init__(self, *items: Any) -> None:
        self.items = list(items)


fk.register(
    Pair,
    children=lambda p: ({"left": p.left, "right": p.right}, p.tag),
    rebuild=lambda tag, ch: Pair(ch["left"], ch["right"], tag),
    replace=True,
)
fk.register(Seq, children=lambda s: (s.items, None), rebuild=lambda aux, ch: Seq(*ch), replace=True)


def zoo(xp: Any) -> dict[str, Any]:
    """Named trees built from arrays of namespace `xp` (float64 unless said)."""

    def arr(*vals: float) -> Any:
        return xp.asarray(list(vals), dtype=xp.float64)

    shared = arr(1.0, 2.0)
    sub = {"w": arr(3.0), "b": arr(4.0)}
    dd: collections.defaultdict[str, Any] = collections.defaultdict(list)
    dd["a"] = arr(5.0)
    dd["b"] = arr(6.0)
    return {
        "leaf": arr(1.0, 2.0, 3.0),
        "dict": {"a": arr(1.0), "b": arr(2.0, 3.0)},
        "list": [arr(1.0), arr(2.0)],
        "tuple": (arr(1.0), (arr(2.0), arr(3.0))),
        "ordereddict": collections.OrderedDict([("z", arr(1.0)), ("a", arr(2.0))]),
        "defaultdict": dd,
        "namedtuple": Point(arr(1.0), arr(2.0)),
        "dataclass": Layer(arr(1.0, 2.0), arr(0.5), name="dense"),
        "frozen_dataclass": Frozen(arr(1.0), [arr(2.0)]),
        "registered_mapping": Pair(arr(1.0), arr(2.0), tag="t"),
        "registered_sequence": Seq(arr(1.0), arr(2.0)),
        "scalars": {"lr": 0.1, "n": 3, "flag": True, "name": "mlp", "none": None, "c": 1j, "b": b"x"},
        "empty": {"a": [], "b": (), "c": {}},
        "nested": {
            "layers": [Layer(arr(1.0), arr(2.0)), Layer(arr(3.0), arr(4.0))],
            "head": (arr(5.0), Point(arr(6.0), 7)),
        },
        "shared_leaf": {"a": shared, "b": [shared, arr(9.0)]},
        "shared_subtree": {"enc": sub, "dec": sub},
        "int_arrays": {"w": arr(1.0), "idx": xp.asarray([0, 1], dtype=xp.int64), "mask": xp.asarray([True, False])},
    }


ZOO_NAMES = list(zoo(__import__("array_api_compat.numpy", fromlist=["numpy"])).keys())


# ---------------------------------------------------------------------------
# An independent model of the walk over the zoo's node types (the SPEC's rules
# written out directly), used as the oracle by the walk tests.

SCALAR_TYPES = (bool, int, float, complex, str, bytes, type(None))


def oracle_children(x: Any) -> list[tuple[Any, Any]] | None:
    """``[(key, child), ...]`` in walk order for the zoo's node types, or None for a leaf."""
    t = type(x)
    if t in (dict, collections.OrderedDict, collections.defaultdict):
        return list(x.items())
    if t in (list, tuple):
        return list(enumerate(x))
    if isinstance(x, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        return [(f, getattr(x, f)) for f in t._fields]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x) if not f.metadata.get("static", False)]
    if t is Pair:
        return [("left", x.left), ("right", x.right)]
    if t is Seq:
        return list(enumerate(x.items))
    return None


def oracle_static(x: Any) -> Any:
    """The static (non-child) data of a zoo node, compared between input and output."""
    t = type(x)
    if t is collections.defaultdict:
        return x.default_factory
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x) if f.metadata.get("static", False)]
    if t is Pair:
        return x.tag
    return None


def is_named(x: Any) -> bool:
    """Nodes whose children are named (fmapstructure turns them into dicts)."""
    t = type(x)
    return t not in (list, tuple, Seq) and oracle_children(x) is not None


def oracle_positions(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf position ``(path, leaf)`` in walk order (shared sub-trees walked at each position)."""
    ch = oracle_children(tree)
    if ch is None:
        return [(path, tree)]
    out: list[tuple[tuple[Any, ...], Any]] = []
    for k, v in ch:
        out.extend(oracle_positions(v, (*path, k)))
    return out


def oracle_leaves(tree: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """``leaves_with_path`` by the SPEC: identity-cached leaves once (first path), scalars at every position."""
    seen: set[int] = set()
    out = []
    for path, leaf in oracle_positions(tree):
        if type(leaf) in SCALAR_TYPES:
            out.append((path, leaf))
        elif id(leaf) not in seen:
            seen.add(id(leaf))
            out.append((path, leaf))
    return out


def path_str(path: tuple[Any, ...]) -> str:
    """The SPEC's KeyPath formatting, written out independently."""
    parts = []
    for i, k in enumerate(path):
        if type(k) is str and k.isidentifier():
            parts.append(k if i == 0 else "." + k)
        elif type(k) is int:
            parts.append(f"[{k}]")
        else:
            parts.append(f"[{k!r}]")
    return "".join(parts)


def snapshot(tree: Any, to_numpy: Any) -> Any:
    """A deep record of a tree (node identities, keys, static data, leaf identities and array values)."""
    ch = oracle_children(tree)
    if ch is None:
        if hasattr(tree, "shape") and hasattr(tree, "dtype"):
            return ("array", id(tree), str(tree.dtype), to_numpy(tree).tolist())
        return ("leaf", id(tree), type(tree))
    return (type(tree), id(tree), repr(oracle_static(tree)), [(k, snapshot(v, to_numpy)) for k, v in ch])


def spy_foreach_lerp(monkeypatch: Any) -> list[list[Any]]:
    """Replace the torch adapter's detected ``torch._foreach_lerp_`` by a spy that records the
    tensors of each call, then calls it; returns the record (one list of tensors per call)."""
    from functorkit.adapters import torch as tad

    real = tad.foreach_lerp_
    assert real is not None  # detected on this torch
    calls: list[list[Any]] = []

    def spy(xs: Any, ys: Any, t: float) -> None:
        calls.append([*xs, *ys])
        assert real is not None
        real(xs, ys, t)

    monkeypatch.setattr(tad, "foreach_lerp_", spy)
    return calls
