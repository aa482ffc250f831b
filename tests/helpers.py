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
        "nested": {"layers": [Layer(arr(1.0), arr(2.0)), Layer(arr(3.0), arr(4.0))], "head": (arr(5.0), Point(arr(6.0), 7))},
        "shared_leaf": {"a": shared, "b": [shared, arr(9.0)]},
        "shared_subtree": {"enc": sub, "dec": sub},
        "int_arrays": {"w": arr(1.0), "idx": xp.asarray([0, 1], dtype=xp.int64), "mask": xp.asarray([True, False])},
    }


ZOO_NAMES = list(zoo(__import__("array_api_compat.numpy", fromlist=["numpy"])).keys())
