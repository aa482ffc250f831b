"""Functions taking a sequence of models refuse a single model with a TypeError (issue 19 item 5).

``fk.stack({"m": model})`` used to return ``'m'`` (the dict's keys taken as the models). Now
`stack`, `mean` and `lincomb` share one check: a mapping, an array, a string, a dataclass, a
torch module or any other node that is not a sequence is one model, and the error names what
was passed, what was expected and the fix (wrap it in a list). Lists, tuples, deques and other
iterables of models still work.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import functorkit as fk

from conftest import to_numpy
from helpers import Layer

CALLS: dict[str, Callable[[Any], Any]] = {
    "stack": lambda ms: fk.stack(ms),
    "mean": lambda ms: fk.mean(ms),
    "lincomb": lambda ms: fk.lincomb([0.5, 0.5], ms),
}


@dataclasses.dataclass
class Pair:
    a: Any
    b: Any


def _singles(xp: Any) -> dict[str, Any]:
    w = xp.asarray([1.0, 2.0], dtype=xp.float64)
    return {
        "dict": {"m": {"w": w}, "n": {"w": w}},
        "array": xp.stack([w, w]),
        "str": "ab",
        "int": 3,
        "dataclass": Pair({"w": w}, {"w": w}),
        "registered dataclass": Layer(w, w),
    }


@pytest.mark.parametrize("fname", sorted(CALLS))
def test_a_single_model_is_a_type_error_naming_the_fix(xp: Any, fname: str) -> None:
    for what, single in _singles(xp).items():
        with pytest.raises(TypeError, match=rf"fk\.{fname}: `models` must be a list \(or tuple\) of models") as info:
            CALLS[fname](single)
        msg = str(info.value)
        assert f"got a {type(single).__name__}" in msg, what
        assert "fix: wrap it in a list" in msg, what


@pytest.mark.parametrize("fname", sorted(CALLS))
def test_a_torch_module_is_one_model_even_though_it_iterates(fname: str) -> None:
    torch = pytest.importorskip("torch")
    seq = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="got a Sequential, which looks like a single model"):
        CALLS[fname](seq)


@pytest.mark.parametrize("fname", sorted(CALLS))
@pytest.mark.parametrize("container", ["list", "tuple", "deque", "iterator"])
def test_sequences_and_iterables_of_models_still_work(xp: Any, fname: str, container: str) -> None:
    m1 = {"w": xp.asarray([1.0, 2.0], dtype=xp.float64)}
    m2 = {"w": xp.asarray([3.0, 6.0], dtype=xp.float64)}
    make = {"list": list, "tuple": tuple, "deque": collections.deque, "iterator": iter}[container]
    out = CALLS[fname](make([m1, m2]))
    want = np.array([[1.0, 2.0], [3.0, 6.0]]) if fname == "stack" else np.array([2.0, 4.0])
    np.testing.assert_array_equal(to_numpy(out["w"]), want, strict=True)


def test_stack_of_a_mapping_no_longer_returns_its_keys(xp: Any) -> None:
    m = {"w": xp.asarray([1.0], dtype=xp.float64)}
    with pytest.raises(TypeError, match=r"got a dict, which looks like a single model.*fk\.stack\(\[model\]\)"):
        fk.stack({"m": m})
    with pytest.raises(ValueError, match="`models` is empty"):
        fk.stack([])
