"""Public classes, errors and type aliases live at ``functorkit`` (issue 24 item 6).

Tracebacks and reprs show ``functorkit.PolicyError``, not the private module that defines it;
``pickle`` stores a class as ``functorkit.X`` and finds it there; pickles that name the defining
module (written before) still load. Functions keep their defining module (neither a function's
repr nor a traceback shows it).
"""

from __future__ import annotations

import inspect
import pickle
import traceback
import typing
from typing import Any

import numpy as np
import pytest

import functorkit as fk

PUBLIC_TYPES = [n for n in fk.__all__ if isinstance(getattr(fk, n), type)]


def test_the_public_types_are_the_classes_errors_and_the_policy_alias() -> None:
    assert {"PolicyError", "StructureError", "Restructure", "TreeDef", "KeyPath"} <= set(PUBLIC_TYPES)
    others = set(fk.__all__) - set(PUBLIC_TYPES) - {"Policy"}
    assert all(inspect.isfunction(getattr(fk, n)) for n in others), others


@pytest.mark.parametrize("name", [*PUBLIC_TYPES, "Policy"])
def test_public_name_lives_at_functorkit(name: str) -> None:
    obj = getattr(fk, name)
    assert obj.__module__ == "functorkit"
    if isinstance(obj, type):
        assert obj.__qualname__ == name
        assert repr(obj) == f"<class 'functorkit.{name}'>"


@pytest.mark.parametrize("name", PUBLIC_TYPES)
def test_type_hints_of_public_classes_resolve(name: str) -> None:
    """typing.get_type_hints (dataclass tools, pydantic, sphinx) looks a class's postponed
    annotations up in the module ``__module__`` names, ``functorkit``, which does not hold ``Any``
    or the private types: they are resolved where the class is defined, before it moves."""
    cls = getattr(fk, name)
    hints = typing.get_type_hints(cls)
    assert all(not isinstance(v, str) for v in hints.values())
    if name == "Restructure":
        assert hints["_td"] is fk.TreeDef


@pytest.mark.parametrize("name", PUBLIC_TYPES)
def test_public_class_pickles_by_its_public_name(name: str) -> None:
    cls = getattr(fk, name)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        data = pickle.dumps(cls, protocol=protocol)
        assert b"functorkit._" not in data
        assert pickle.loads(data) is cls


def test_a_traceback_names_the_public_error() -> None:
    flat, re = fk.destructure({"w": np.ones(2)})
    with pytest.raises(fk.PolicyError) as info:
        re(flat.astype(np.float32))
    text = "".join(traceback.format_exception(info.value))
    assert "functorkit.PolicyError: at w:" in text
    assert "functorkit._errors" not in text
    with pytest.raises(fk.StructureError) as sinfo:
        fk.fmap(lambda a, b: a, {"a": 1}, {"b": 1})
    assert "".join(traceback.format_exception_only(sinfo.value)).startswith("functorkit.StructureError: at <root>")


@pytest.mark.parametrize(
    "err", [fk.StructureError("at a: bad"), fk.PolicyError("at b: bad")], ids=["StructureError", "PolicyError"]
)
def test_errors_round_trip_through_pickle(err: Exception) -> None:
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert back.args == err.args


def _instances() -> dict[str, Any]:
    tree = {"a": [np.arange(3.0), 2.0], "b": (np.ones((2, 2)),)}
    flat, re = fk.destructure(tree)
    _, td = fk.flatten(tree)
    return {"Restructure": (re, flat), "TreeDef": (td, None), "KeyPath": (fk.KeyPath.parse("a[0].w"), None)}


@pytest.mark.parametrize("name", ["Restructure", "TreeDef", "KeyPath"])
def test_instances_round_trip_and_old_pickles_naming_the_private_module_still_load(name: str) -> None:
    obj, flat = _instances()[name]
    back = pickle.loads(pickle.dumps(obj))
    assert back == obj
    if flat is not None:
        np.testing.assert_array_equal(fk.destructure(back(flat))[0], flat)
    # a class pickled (protocol 2: a GLOBAL opcode naming module and class) before the move
    home = {"Restructure": "_flat", "TreeDef": "_treedef", "KeyPath": "_keypath"}[name]
    new = pickle.dumps(type(obj), protocol=2)
    old = new.replace(b"cfunctorkit\n", f"cfunctorkit.{home}\n".encode())
    assert old != new
    assert pickle.loads(old) is type(obj)
