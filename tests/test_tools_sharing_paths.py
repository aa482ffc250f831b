"""Edge cases of the tree tools found by a sweep: fk.replace on shared mutable sub-trees of scalars,
fk.stack's mismatch paths and values it cannot read, fk.summary's byte counts (SPEC section 10)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import functorkit as fk


@dataclasses.dataclass
class _Cfg:  # mutable (not frozen): one shared sub-tree wherever it is met (docs/treedef.md, R2)
    x: int = 1


# ------------------------------------------------------------------------------ replace


def test_replace_a_shared_mutable_subtree_of_scalars_at_all_its_places(xp: Any) -> None:
    c = _Cfg()
    d = {"lr": 0.1}
    empty: list[Any] = []
    w = xp.asarray([1.0, 2.0])
    tree = {"a": c, "b": c, "opt": {"p": d, "q": d}, "e": empty, "f": empty, "w": w}
    new_c = _Cfg(7)
    out = fk.replace(tree, {"a": new_c})
    assert out["a"] is new_c
    assert out["b"] is new_c  # the sharing kept: replaced at every place
    assert out["w"] is w
    assert tree["b"] is c and c.x == 1  # the input unchanged
    out = fk.replace(tree, {"opt.q": {"lr": 0.5}, "f": [3]})
    assert out["opt"]["p"] is out["opt"]["q"]
    assert out["opt"]["p"] == {"lr": 0.5}
    assert out["e"] is out["f"]
    assert out["e"] == [3]
    assert fk.replace(tree, {"a.x": 5})["b"].x == 5  # a path through the shared node agrees


def test_replace_an_immutable_node_of_scalars_only_at_the_named_place() -> None:
    k = (3, 3)
    tree = {"a": k, "b": k, "c": (), "d": ()}  # immutable, holding no identity-cached leaf: not shared
    out = fk.replace(tree, {"a": (4, 4), "c": (1,)})
    assert out == {"a": (4, 4), "b": (3, 3), "c": (1,), "d": ()}


# ------------------------------------------------------------------------------ summary


@pytest.mark.parametrize("name", ["bool", "int8", "uint8", "int32", "int64", "float32", "float64", "complex64", "complex128"])
def test_summary_bytes_are_the_dtype_size_times_the_count(xp: Any, name: str) -> None:
    x = xp.zeros((2, 3), dtype=getattr(xp, name))
    s = fk.summary({"x": x})
    want = 6 * np.dtype(name).itemsize  # NumPy's size of the dtype, whatever the backend
    assert s.rows[0].nbytes == want
    assert s.nbytes == want
    assert s.by_dtype == {name: (6, want)}
