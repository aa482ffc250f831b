"""torch sparse (COO, CSR, CSC, BSR) and nested tensors: refused by name, before anything is written.

Each layout x each operation that needs dense arrays (destructure, re.flatten, the arithmetic and
reductions, load_into, save, state_dict -> load_state_dict) raises a TypeError naming the path, the
layout and the fix (``.to_dense()``; pad or unbind a nested tensor) -- a PolicyError for a `src`
array load_into cannot read, as before -- instead of a raw torch RuntimeError, and nothing is
written. fmap, leaves and state_dict still hand such tensors over untouched.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import functorkit as fk

torch = pytest.importorskip("torch")

LAYOUTS: dict[str, Callable[[], Any]] = {
    "sparse_coo": lambda: torch.ones(2, 2).to_sparse(),
    "sparse_csr": lambda: torch.ones(2, 2).to_sparse_csr(),
    "sparse_csc": lambda: torch.ones(2, 2).to_sparse_csc(),
    "sparse_bsr": lambda: torch.ones(2, 2).to_sparse_bsr((1, 1)),
    "nested": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    "nested_jagged": lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)], layout=torch.jagged),
}
# torch's own notices on building a nested tensor of the default (strided) layout and a BSR tensor
pytestmark = [
    pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning"),
    pytest.mark.filterwarnings("ignore:Sparse BSR tensor support is in beta state:UserWarning"),
]


def _fix(layout: str) -> str:
    return "to_padded_tensor" if layout.startswith("nested") else r"\.to_dense\(\)"


def _what(layout: str) -> str:
    return "a nested tensor" if layout.startswith("nested") else f"a {layout} tensor"


def dense() -> dict[str, Any]:
    return {"a": torch.ones(2), "layers": [{"s": torch.ones(2, 2)}]}


def odd(layout: str) -> dict[str, Any]:
    return {"a": torch.ones(2), "layers": [{"s": LAYOUTS[layout]()}]}


OPS: dict[str, Callable[[Any], Any]] = {
    "destructure": lambda m: fk.destructure(m),
    "re.flatten": lambda m: fk.destructure(dense())[1].flatten(m),
    "add": lambda m: fk.add(m, m),
    "sub": lambda m: fk.sub(m, m),
    "scale": lambda m: fk.scale(2.0, m),
    "lincomb": lambda m: fk.lincomb([0.5, 0.5], [m, m]),
    "mean": lambda m: fk.mean([m, m]),
    "lerp": lambda m: fk.lerp(m, m, 0.5),
    "norm": lambda m: fk.norm(m),
    "dot": lambda m: fk.dot(m, m),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_operation_names_the_path_layout_and_fix(layout: str, op: str) -> None:
    want = rf"^at layers\[0\]\.s: .*works on dense arrays, but it is {_what(layout)}"
    with pytest.raises(TypeError, match=want) as e:
        OPS[op](odd(layout))
    assert _fix(layout).replace("\\", "") in str(e.value)


@pytest.mark.parametrize("op", ["add", "mean", "dot"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_sparse_tensor_in_the_second_model_is_refused_too(layout: str, op: str) -> None:
    a, b = dense(), odd(layout)
    call = {"add": lambda: fk.add(a, b), "mean": lambda: fk.mean([a, b]), "dot": lambda: fk.dot(a, b)}[op]
    with pytest.raises(TypeError, match=rf"^at layers\[0\]\.s: fk\.{op} works on dense arrays"):
        call()


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_destructure_refuses_after_a_cached_plan(layout: str) -> None:
    for _ in range(3):  # the same structure again and again: the cached plan is taken
        fk.destructure(dense())
    with pytest.raises(TypeError, match=r"^at layers\[0\]\.s: fk\.destructure works on dense arrays"):
        fk.destructure(odd(layout))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_tie_and_shared_paths_of_the_arithmetic_refuse_too(layout: str) -> None:
    s = LAYOUTS[layout]()
    m = {"a": torch.ones(2), "x": s, "y": s}  # a tie: the per-leaf path
    with pytest.raises(TypeError, match=r"^at x: fk\.add works on dense arrays"):
        fk.add(m, m)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_load_into_a_sparse_dst_writes_nothing(layout: str) -> None:
    dst = odd(layout)
    before = dst["a"].clone()
    want = rf"^at layers\[0\]\.s: fk\.load_into writes into `dst`'s arrays in place, but it is {_what(layout)}"
    with pytest.raises(TypeError, match=want):
        fk.load_into(dst, {"a": torch.full((2,), 7.0), "layers": [{"s": torch.zeros(2, 2)}]})
    assert torch.equal(dst["a"], before)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_load_into_from_a_sparse_src_writes_nothing(layout: str) -> None:
    dst = dense()
    with pytest.raises(fk.PolicyError, match=r"^at layers\[0\]\.s: fk\.load_into cannot read the `src` array"):
        fk.load_into(dst, {"a": torch.full((2,), 7.0), "layers": [{"s": LAYOUTS[layout]()}]})
    assert torch.equal(dst["a"], torch.ones(2))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_state_dict_then_load_state_dict(layout: str) -> None:
    sd = fk.state_dict(odd(layout))  # handed over untouched
    assert sd["layers.0.s"].layout is LAYOUTS[layout]().layout
    dst = dense()
    with pytest.raises(fk.StructureError, match=rf"layers\.0\.s.*not dense: it is {_what(layout)}"):
        fk.load_state_dict(dst, sd)
    assert torch.equal(dst["a"], torch.ones(2))
    assert torch.equal(dst["layers"][0]["s"], torch.ones(2, 2))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_save_writes_no_file(layout: str, tmp_path: Path) -> None:
    want = rf"^at layers\.0\.s: fk\.save works on dense arrays, but it is {_what(layout)}"
    with pytest.raises(TypeError, match=want):
        fk.save(tmp_path / "m.safetensors", odd(layout))
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_fmap_and_leaves_still_hand_them_over(layout: str) -> None:
    m = odd(layout)
    seen = []
    out = fk.fmap(lambda x: seen.append(x) or x, m)
    assert out["layers"][0]["s"] is m["layers"][0]["s"]
    assert any(x is m["layers"][0]["s"] for x in seen)
    assert fk.leaves(m)[1] is m["layers"][0]["s"]
    if not layout.startswith("nested"):  # the fix the message names works
        flat, _ = fk.destructure(fk.fmap(lambda x: x.to_dense() if x.layout is not torch.strided else x, m))
        assert flat.shape == (6,)


def test_a_nested_integer_constant_repeats_through_the_plan_cache() -> None:
    # an integer nested tensor is a constant (not a parameter): destructure carries it, call after
    # call; the plan cache's facts must not read its shape (it has none)
    n = torch.nested.nested_tensor([torch.tensor([1, 2]), torch.tensor([3])])
    for _ in range(4):
        flat, re = fk.destructure({"w": torch.ones(2), "n": n})
        assert flat.shape == (2,)
        assert re(flat)["n"] is n
