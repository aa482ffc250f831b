"""fk.broadcast_prefix (SPEC section 16): prefix leaves over sub-trees, every position its own."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import to_numpy


def _model(xp: Any) -> dict[str, Any]:
    return {
        "enc": {"w": xp.ones((2, 2), dtype=xp.float64), "b": xp.zeros(2, dtype=xp.float64)},
        "dec": [xp.ones(3, dtype=xp.float64), (xp.zeros(1, dtype=xp.float64), "tanh")],
    }


def test_prefix_leaves_fill_each_sub_tree(xp: Any) -> None:
    model = _model(xp)
    out = fk.broadcast_prefix({"enc": 0.1, "dec": 0.01}, model)
    assert out == {"enc": {"w": 0.1, "b": 0.1}, "dec": [0.01, (0.01, 0.01)]}
    assert fk.broadcast_prefix(7, model) == {"enc": {"w": 7, "b": 7}, "dec": [7, (7, 7)]}
    deeper = fk.broadcast_prefix({"enc": {"w": 1, "b": 2}, "dec": [3, 4]}, model)
    assert deeper == {"enc": {"w": 1, "b": 2}, "dec": [3, (4, 4)]}
    assert fk.broadcast_prefix(model, model)["enc"]["w"] is model["enc"]["w"]  # a full tree is its own prefix


def test_multi_tree_fmap_with_per_sub_model_learning_rates(xp: Any) -> None:
    model = _model(xp)
    grads = fk.fmap(lambda x: x * 0 + 1, model, trainable_only=True)
    lrs = fk.broadcast_prefix({"enc": 0.5, "dec": 0.25}, model)

    def step(p: Any, g: Any, lr: float) -> Any:
        return p - lr * g if not isinstance(p, str) else p

    new = fk.fmap(step, model, grads, lrs)
    np.testing.assert_allclose(to_numpy(new["enc"]["w"]), np.full((2, 2), 0.5))
    np.testing.assert_allclose(to_numpy(new["dec"][0]), np.full(3, 0.75))
    assert new["dec"][1][1] == "tanh"


def test_ties_and_shared_sub_trees_get_each_position_its_own_value(xp: Any) -> None:
    w = xp.ones(2, dtype=xp.float64)
    shared = [w]
    tree = {"a": shared, "b": shared, "c": w}
    out = fk.broadcast_prefix({"a": 1, "b": 2, "c": 3}, tree)
    assert out == {"a": [1], "b": [2], "c": 3}
    assert out["a"] is not out["b"]


def test_mismatches_name_the_path() -> None:
    tree = {"enc": {"w": np.ones(2)}, "dec": [np.ones(1), np.ones(1)]}
    with pytest.raises(fk.StructureError, match=r"at <root>: .*missing from the prefix: \['dec'\]"):
        fk.broadcast_prefix({"enc": 1}, tree)
    with pytest.raises(fk.StructureError, match=r"at dec: .*1 children in `prefix` vs 2 in `tree`"):
        fk.broadcast_prefix({"enc": 1, "dec": [1]}, tree)
    with pytest.raises(fk.StructureError, match=r"at enc\.w: .*`prefix` has a dict node here but `tree` has a leaf"):
        fk.broadcast_prefix({"enc": {"w": {"x": 1}}, "dec": 1}, tree)
    with pytest.raises(fk.StructureError, match=r"at dec: .*a tuple in `prefix` vs a list in `tree`"):
        fk.broadcast_prefix({"enc": 1, "dec": (1, 2)}, tree)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(fk.StructureError):
        fk.broadcast_prefix(cyclic, [[1]])


@dataclasses.dataclass
class Block:
    attn: Any
    mlp: Any


def test_a_dict_prefix_stands_for_named_nodes() -> None:
    tree = {"blocks": [Block(np.ones(2), np.ones(3)), Block(np.ones(2), np.ones(3))]}
    out = fk.broadcast_prefix({"blocks": [{"attn": 1, "mlp": 2}, 3]}, tree)
    assert type(out["blocks"][0]) is Block
    assert (out["blocks"][0].attn, out["blocks"][0].mlp, out["blocks"][1].attn) == (1, 2, 3)
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    lrs = fk.broadcast_prefix({"0": 0.1, "1": 0.01}, net)
    assert [(str(p), v) for p, v in fk.leaves_with_path(lrs)] == [
        ("[0].weight", 0.1),
        ("[0].bias", 0.1),
        ("[1].weight", 0.01),
        ("[1].bias", 0.01),
    ]
    with torch.no_grad():
        stepped = fk.fmap(lambda p, lr: p - lr, net, lrs)
    torch.testing.assert_close(stepped[1].bias, net[1].bias - 0.01)


def test_none_is_a_leaf_on_both_sides() -> None:
    assert fk.broadcast_prefix({"a": None, "b": 2}, {"a": [1, 2], "b": [3]}) == {"a": [None, None], "b": [2]}
    assert fk.broadcast_prefix(1, {"x": None, "y": 2}) == {"x": 1, "y": 1}
