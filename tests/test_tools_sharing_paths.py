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
    assert tree["b"] is c  # the input unchanged
    assert c.x == 1
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


@pytest.mark.parametrize(
    "name", ["bool", "int8", "uint8", "int32", "int64", "float32", "float64", "complex64", "complex128"]
)
def test_summary_bytes_are_the_dtype_size_times_the_count(xp: Any, name: str) -> None:
    x = xp.zeros((2, 3), dtype=getattr(xp, name))
    s = fk.summary({"x": x})
    want = 6 * np.dtype(name).itemsize  # NumPy's size of the dtype, whatever the backend
    assert s.rows[0].nbytes == want
    assert s.nbytes == want
    assert s.by_dtype == {name: (6, want)}


# ------------------------------------------------------------------------------ stack


@dataclasses.dataclass
class _Layer:
    w: Any
    act: str = dataclasses.field(default="relu", metadata={"static": True})


def test_stack_names_the_path_of_static_data_deep_inside(xp: Any) -> None:
    def model(act: str) -> dict[str, Any]:
        return {
            "enc": {"layers": [_Layer(xp.ones(2)), _Layer(xp.ones(2), act)]},
            "head": xp.zeros(1),
        }

    with pytest.raises(
        fk.StructureError,
        match=r"^fk\.stack: at enc\.layers\[1\]: models\[2\] differs in the static \(non-child\) data of its _Layer",
    ):
        fk.stack([model("relu"), model("relu"), model("tanh")])
    # the assertion names the same path
    with pytest.raises(AssertionError, match=r"at enc\.layers\[1\]: the static \(aux\) data of the _Layer node"):
        fk.assert_allclose(model("relu"), model("tanh"))


def test_stack_names_the_path_of_a_module_in_eval_mode_deep_inside() -> None:
    torch = pytest.importorskip("torch")
    a = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Dropout(), torch.nn.Linear(2, 1)))
    b = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Dropout(), torch.nn.Linear(2, 1)))
    b[1][0].eval()
    with (
        torch.no_grad(),
        pytest.raises(
            fk.StructureError, match=r"^fk\.stack: at \[1\]\[0\]: models\[1\] differs in the static .* Dropout node"
        ),
    ):
        fk.stack([a, b])


def test_stack_refuses_to_move_a_meta_tensor_naming_the_path() -> None:
    torch = pytest.importorskip("torch")
    m0 = {"enc": {"w": torch.ones(2)}}
    m1 = {"enc": {"w": torch.ones(2, device="meta")}}
    for policy in ("model", "flat"):
        with pytest.raises(
            fk.PolicyError,
            match=r"^fk\.stack: at enc\.w: models\[2\] holds float32 on meta \(torch\), an array without values.*"
            r"materialise that model first",
        ):
            fk.stack([m0, m0, m1], policy=policy)
    with pytest.raises(fk.PolicyError, match=r"at enc\.w: .*policy='strict' converts nothing"):
        fk.stack([m0, m1])
    on_meta = fk.stack([m1, m0], policy="model")  # models[0] on meta: the result on meta, as policy says
    assert on_meta["enc"]["w"].device.type == "meta"
    assert on_meta["enc"]["w"].shape == (2, 2)
