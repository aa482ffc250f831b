"""The bad-input catalogue: every public function, every kind of wrong argument.

Each entry of ``CASES`` (array-taking, run on every backend) and
``PLAIN_CASES`` (no arrays, run once) gives the exact error class and what the
message must say: the path where there is one, the argument's name, and an
expectation or fix (``HINT``). docs/bad_input.md lists the same catalogue;
``test_docs_table_matches_the_catalogue`` keeps the two in step.

The rule where the SPEC names no class: a wrong *type* of argument is a
``TypeError``, a right type with a wrong *value* a ``ValueError``; structure
problems are ``fk.StructureError`` (a ``ValueError``) and dtype/device/namespace
problems ``fk.PolicyError`` (a ``TypeError``).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import re
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, ReadOnlyNumpy, to_numpy

HINT = re.compile(
    r"(?i)\b(expected|expects|must|cannot|never|only|instead|fix|pass|use|call|register|cast|convert|check|wrap|make|build)\b"
)
DOC = pathlib.Path(__file__).parent.parent / "docs" / "bad_input.md"


class Ctx:
    """What a case needs: the backend's namespace and a few standard models."""

    def __init__(self, xp: Any, backend: Backend | None) -> None:
        self.xp, self.backend = xp, backend

    @property
    def immutable(self) -> bool:
        return self.backend in (Backend.JAX, Backend.DASK)

    def arr(self, *vals: Any, dtype: str = "float64") -> Any:
        return self.xp.asarray(list(vals), dtype=getattr(self.xp, dtype))

    def mutable(self, *vals: Any, dtype: str = "float64") -> Any:
        """A writeable array (the read-only NumPy backend makes read-only ones)."""
        xp = self.xp._ns if isinstance(self.xp, ReadOnlyNumpy) else self.xp
        return xp.asarray(list(vals), dtype=getattr(xp, dtype))

    def model(self) -> dict[str, Any]:
        return {"layers": [{"w": self.arr(1.0, 2.0), "b": self.arr(0.0, 0.0)}]}

    def other_library_array(self) -> Any:
        """A float64 array of another library than the backend's."""
        if self.backend in (Backend.NUMPY, Backend.NUMPY_READONLY):
            # the `lite` session has no second library: such cases skip there, run in `numpy`
            array_api_strict = pytest.importorskip("array_api_strict")
            return array_api_strict.asarray([1.0, 2.0], dtype=array_api_strict.float64)
        return np.asarray([1.0, 2.0])

    def cycle(self) -> dict[str, Any]:
        t: dict[str, Any] = {"a": [self.arr(1.0)]}
        t["a"].append(t)
        return t

    def re(self) -> Any:
        return fk.destructure(self.model())[1]


@dataclasses.dataclass(frozen=True)
class Bad:
    id: str
    function: str  # the public name (``Restructure.flatten`` for a method)
    bad: str  # the wrong argument, in words
    call: Callable[[Ctx], Any]
    error: type[BaseException]
    says: str  # what the message says, in words (for the docs)
    path: str | None = None  # the path the message must name
    names: tuple[str, ...] = ()  # regexes the message must also match (argument names, keys)
    immutable_error: type[BaseException] | None = None  # the class on JAX/Dask, where it differs


# ---------------------------------------------------------------------------
# unregistered and registered classes used by the cases


def _cyclic() -> dict[str, Any]:
    inner: list[Any] = []
    tree = {"a": [inner]}
    inner.append(tree)
    return tree


class Holder:
    """Not registered anywhere, holds an array."""

    def __init__(self, w: Any) -> None:
        self.w = w


class DictSub(dict):  # type: ignore[type-arg]
    """An unregistered dict subclass (a leaf by exact-type registration)."""


class ReturnsArray:
    def __init__(self, w: Any) -> None:
        self.w = w


class TrainableNotIterable:
    def __init__(self, w: Any) -> None:
        self.w = w


class TrainableUnknownKey:
    def __init__(self, w: Any) -> None:
        self.w = w


fk.register(ReturnsArray, children=lambda o: (o.w, None), rebuild=lambda aux, ch: ReturnsArray(ch), replace=True)
fk.register(
    TrainableNotIterable,
    children=lambda o: ({"w": o.w}, None),
    rebuild=lambda aux, ch: TrainableNotIterable(ch["w"]),
    trainable=lambda o: 5,
    replace=True,
)
fk.register(
    TrainableUnknownKey,
    children=lambda o: ({"w": o.w}, None),
    rebuild=lambda aux, ch: TrainableUnknownKey(ch["w"]),
    trainable=lambda o: ["weight"],
    replace=True,
)


class Fresh:
    """A class nobody registered (for registration cases)."""


def _registered_class() -> type:
    cls = type("AlreadyThere", (), {})
    fk.register(cls, children=lambda o: ({}, None), rebuild=lambda aux, ch: cls())
    return cls


def _ident(*args: Any) -> Any:
    return args[0]


# ---------------------------------------------------------------------------
# array-taking cases (every backend)

CASES: list[Bad] = [
    # walking
    Bad(
        "fmap-f-not-callable",
        "fmap",
        "`f` an int",
        lambda c: fk.fmap(3, c.model()),
        TypeError,
        "`f` must be callable, got int",
        names=("`f`",),
    ),
    Bad(
        "fmap-f-none",
        "fmap",
        "`f` None",
        lambda c: fk.fmap(None, c.model()),
        TypeError,
        "`f` must be callable, got NoneType",
        names=("`f`",),
    ),
    Bad(
        "fmap-is_leaf-not-callable",
        "fmap",
        "`is_leaf` an int",
        lambda c: fk.fmap(_ident, c.model(), is_leaf=3),
        TypeError,
        "`is_leaf` must be a callable or None",
        names=("`is_leaf`",),
    ),
    Bad(
        "fmap-trainable_only-not-bool",
        "fmap",
        "`trainable_only` a str",
        lambda c: fk.fmap(_ident, c.model(), trainable_only="yes"),
        TypeError,
        "`trainable_only` must be True or False",
        names=("`trainable_only`",),
    ),
    Bad(
        "fmap-cache-not-bool",
        "fmap",
        "`cache` a str",
        lambda c: fk.fmap(_ident, c.model(), cache="no"),
        TypeError,
        "`cache` must be True or False",
        names=("`cache`",),
    ),
    Bad(
        "fmap-mismatched-keys",
        "fmap",
        "second tree with other dict keys",
        lambda c: fk.fmap(_ident, c.model(), {"layers": [{"w": c.arr(1.0, 2.0)}]}),
        fk.StructureError,
        "the first differing path, both sides' keys, which tree differs",
        path="layers[0]",
        names=("'b'",),
    ),
    Bad(
        "fmap-mismatched-length",
        "fmap",
        "second tree with a shorter list",
        lambda c: fk.fmap(_ident, c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both lengths",
        path="layers",
        names=("length 1", "length 0"),
    ),
    Bad(
        "fmap-mismatched-node-type",
        "fmap",
        "second tree with a tuple where the first has a list",
        lambda c: fk.fmap(_ident, c.model(), {"layers": ({"w": 1, "b": 2},)}),
        fk.StructureError,
        "the path, both node types",
        path="layers",
        names=("list", "tuple"),
    ),
    Bad(
        "fmap-leaf-vs-node",
        "fmap",
        "second tree with a node where the first has a leaf",
        lambda c: fk.fmap(_ident, c.model(), {"layers": [{"w": {"x": 1}, "b": 2}]}),
        fk.StructureError,
        "the path, leaf vs node",
        path="layers[0].w",
    ),
    Bad(
        "fmap-cycle",
        "fmap",
        "a tree that contains itself",
        lambda c: fk.fmap(_ident, c.cycle()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    Bad(
        "fmap-cycle-no-cache",
        "fmap",
        "a cycle with `cache=False`",
        lambda c: fk.fmap(_ident, c.cycle(), cache=False),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    Bad(
        "fmapstructure-f-not-callable",
        "fmapstructure",
        "`f` an int",
        lambda c: fk.fmapstructure(3, c.model()),
        TypeError,
        "`f` must be callable",
        names=("`f`",),
    ),
    Bad(
        "fmapstructure-mismatched-keys",
        "fmapstructure",
        "second tree with other dict keys",
        lambda c: fk.fmapstructure(_ident, c.model(), {"layers": [{"w": 1}]}),
        fk.StructureError,
        "the first differing path and both sides",
        path="layers[0]",
    ),
    Bad(
        "fmap_with_path-f-not-callable",
        "fmap_with_path",
        "`f` an int",
        lambda c: fk.fmap_with_path(3, c.model()),
        TypeError,
        "`f` must be callable",
        names=("`f`",),
    ),
    Bad(
        "fmap_with_path-mismatched-length",
        "fmap_with_path",
        "second tree with a shorter list",
        lambda c: fk.fmap_with_path(_ident, c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both lengths",
        path="layers",
    ),
    Bad(
        "leaves-is_leaf-not-callable",
        "leaves",
        "`is_leaf` an int",
        lambda c: fk.leaves(c.model(), is_leaf=3),
        TypeError,
        "`is_leaf` must be a callable or None",
        names=("`is_leaf`",),
    ),
    Bad(
        "leaves-cycle",
        "leaves",
        "a tree that contains itself",
        lambda c: fk.leaves(c.cycle()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    Bad(
        "leaves_with_path-is_leaf-not-callable",
        "leaves_with_path",
        "`is_leaf` a str",
        lambda c: fk.leaves_with_path(c.model(), is_leaf="x"),
        TypeError,
        "`is_leaf` must be a callable or None",
        names=("`is_leaf`",),
    ),
    Bad(
        "leaves_with_path-cycle",
        "leaves_with_path",
        "a tree that contains itself",
        lambda c: fk.leaves_with_path(c.cycle()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    Bad(
        "register-children-returns-array",
        "register",
        "a `children` function returning an array",
        lambda c: fk.leaves({"slot": ReturnsArray(c.arr(1.0))}),
        TypeError,
        "the class, the path, and that a mapping, list or tuple is expected",
        path="slot",
        names=("ReturnsArray", "mapping"),
    ),
    Bad(
        "register-trainable-not-iterable",
        "register",
        "a `trainable` function returning an int",
        lambda c: fk.destructure({"slot": TrainableNotIterable(c.arr(1.0))}),
        TypeError,
        "the class, the path, and that an iterable of child keys is expected",
        path="slot",
        names=("TrainableNotIterable", "iterable"),
    ),
    Bad(
        "register-trainable-unknown-key",
        "register",
        "a `trainable` function naming a key that is not a child",
        lambda c: fk.destructure({"slot": TrainableUnknownKey(c.arr(1.0))}),
        fk.StructureError,
        "the class, the path, the unknown key and the real child keys",
        path="slot",
        names=("TrainableUnknownKey", "'weight'", "'w'"),
    ),
    # structured wrappers
    Bad(
        "Diagonal-not-array",
        "Diagonal",
        "a list",
        lambda c: fk.Diagonal([1.0, 2.0]),
        TypeError,
        "expects a 1-D array, got list",
        names=("1-D",),
    ),
    Bad(
        "Diagonal-2d",
        "Diagonal",
        "a 2-D array",
        lambda c: fk.Diagonal(c.xp.ones((2, 2))),
        ValueError,
        "expects a 1-D array, got shape (2, 2)",
        names=(r"\(2, 2\)",),
    ),
    Bad(
        "Diagonal-0d",
        "Diagonal",
        "a 0-d array",
        lambda c: fk.Diagonal(c.xp.asarray(1.0)),
        ValueError,
        "expects a 1-D array, got shape ()",
        names=(r"\(\)",),
    ),
    Bad(
        "Diagonal-matmul-shape",
        "Diagonal",
        "`@` with an operand of another length",
        lambda c: fk.Diagonal(c.arr(1.0, 2.0)) @ c.arr(1.0, 2.0, 3.0),
        ValueError,
        "both sizes",
        names=("2", "3"),
    ),
    Bad(
        "Diagonal-matmul-other-library",
        "Diagonal",
        "`@` with an array of another library",
        lambda c: fk.Diagonal(c.arr(1.0, 2.0)) @ c.other_library_array(),
        TypeError,
        "both libraries; functorkit never converts between libraries",
        names=("librar",),
    ),
    Bad(
        "Diagonal-setattr",
        "Diagonal",
        "setting `diag`",
        lambda c: setattr(fk.Diagonal(c.arr(1.0)), "diag", 1),
        AttributeError,
        "immutable; build a new one",
        names=("immutable",),
    ),
    Bad(
        "Transpose-1d",
        "Transpose",
        "a 1-D array",
        lambda c: fk.Transpose(c.arr(1.0, 2.0)),
        ValueError,
        "at least 2 dimensions, got shape (2,)",
        names=("2 dimensions",),
    ),
    Bad(
        "Transpose-str",
        "Transpose",
        "a str",
        lambda c: fk.Transpose("x"),
        TypeError,
        "an array or a structured wrapper, got str",
        names=("str",),
    ),
    # destructure
    Bad(
        "destructure-policy-unknown",
        "destructure",
        "`policy='bogus'`",
        lambda c: fk.destructure(c.model(), policy="bogus"),
        ValueError,
        "the three policies",
        names=("'strict'", "'model'", "'flat'"),
    ),
    Bad(
        "destructure-policy-case",
        "destructure",
        "`policy='Strict'`",
        lambda c: fk.destructure(c.model(), policy="Strict"),
        ValueError,
        "the three policies",
        names=("'strict'",),
    ),
    Bad(
        "destructure-policy-not-str",
        "destructure",
        "`policy=3`",
        lambda c: fk.destructure(c.model(), policy=3),
        TypeError,
        "`policy` must be a str, one of the three",
        names=("policy", "'strict'"),
    ),
    Bad(
        "destructure-mixed-dtype-strict",
        "destructure",
        "parameters of two dtypes under 'strict'",
        lambda c: fk.destructure({"a": c.arr(1.0), "b": c.arr(1.0, dtype="float32")}),
        fk.PolicyError,
        "both paths and dtypes, policy='model' as the fix",
        path="b",
        names=(r"\ba\b", "float32", "'model'"),
    ),
    Bad(
        "destructure-mixed-namespace",
        "destructure",
        "parameters of two array libraries",
        lambda c: fk.destructure({"a": c.arr(1.0, 2.0), "b": c.other_library_array()}, policy="model"),
        fk.PolicyError,
        "both paths; convert to one namespace",
        path="b",
        names=("namespace",),
    ),
    Bad(
        "destructure-cycle",
        "destructure",
        "a model that contains itself",
        lambda c: fk.destructure(c.cycle()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    Bad(
        "destructure-unregistered-class-with-arrays",
        "destructure",
        "an unregistered object holding an array",
        lambda c: fk.destructure({"u": Holder(c.arr(1.0, 2.0))}),
        fk.StructureError,
        "the path, the class, how to register it",
        path="u",
        names=("Holder", "register"),
    ),
    Bad(
        "destructure-dict-subclass-with-arrays",
        "destructure",
        "an unregistered dict subclass holding an array",
        lambda c: fk.destructure({"u": DictSub(w=c.arr(1.0))}),
        fk.StructureError,
        "the path, the class, how to register it",
        path="u",
        names=("DictSub", "register"),
    ),
    # Restructure
    Bad(
        "re-p-list",
        "Restructure",
        "`p` a list",
        lambda c: c.re()([1.0, 2.0, 3.0, 4.0]),
        TypeError,
        "expected a 1-D array of length 4, got list",
        names=("array", "list"),
    ),
    Bad(
        "re-p-none",
        "Restructure",
        "`p` None",
        lambda c: c.re()(None),
        TypeError,
        "expected a 1-D array, got NoneType",
        names=("NoneType",),
    ),
    Bad(
        "re-p-2d",
        "Restructure",
        "`p` of rank 2",
        lambda c: c.re()(c.xp.ones((2, 2), dtype=c.xp.float64)),
        ValueError,
        "expected length 4, got shape (2, 2)",
        names=("expected length 4",),
    ),
    Bad(
        "re-p-short",
        "Restructure",
        "`p` of the wrong length",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0)),
        ValueError,
        "expected length 4, got 3",
        names=("expected length 4, got 3",),
    ),
    Bad(
        "re-p-int",
        "Restructure",
        "`p` an integer array",
        lambda c: c.re()(c.arr(1, 2, 3, 4, dtype="int64")),
        TypeError,
        "expected a floating or complex array, got int64",
        names=("int64",),
    ),
    Bad(
        "re-p-dtype-strict",
        "Restructure",
        "`p` of another dtype under 'strict'",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0, 4.0, dtype="float32")),
        fk.PolicyError,
        "the path, both dtypes, policy='model'/'flat' as the fix",
        path="layers[0].w",
        names=("float32", "'model'", "'flat'"),
    ),
    Bad(
        "re-copy-str",
        "Restructure",
        "`copy='no'`",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0, 4.0), copy="no"),
        TypeError,
        "`copy` must be None, True or False",
        names=("copy",),
    ),
    Bad(
        "re-copy-int",
        "Restructure",
        "`copy=0`",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0, 4.0), copy=0),
        TypeError,
        "`copy` must be None, True or False",
        names=("copy",),
    ),
    Bad(
        "re-copy-false-needs-conversion",
        "Restructure",
        "`copy=False` where a cast is needed",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0, 4.0, dtype="float32"), policy="model", copy=False),
        ValueError,
        "the path; pass copy=None",
        path="layers[0].w",
        names=("copy",),
    ),
    Bad(
        "re-policy-unknown",
        "Restructure",
        "`policy='bogus'`",
        lambda c: c.re()(c.arr(1.0, 2.0, 3.0, 4.0), policy="bogus"),
        ValueError,
        "the three policies",
        names=("'strict'", "'model'", "'flat'"),
    ),
    Bad(
        "re-explain-short",
        "Restructure.explain",
        "`p` of the wrong length",
        lambda c: c.re().explain(c.arr(1.0, 2.0, 3.0)),
        ValueError,
        "expected length 4, got 3",
        names=("expected length 4, got 3",),
    ),
    Bad(
        "re-explain-policy-unknown",
        "Restructure.explain",
        "`policy='x'`",
        lambda c: c.re().explain(c.arr(1.0, 2.0, 3.0, 4.0), policy="x"),
        ValueError,
        "the three policies",
        names=("'strict'",),
    ),
    Bad(
        "re-flatten-other-structure",
        "Restructure.flatten",
        "a model missing a key",
        lambda c: c.re().flatten({"layers": [{"w": c.arr(1.0, 2.0)}]}),
        fk.StructureError,
        "the path, both key sets; pass a model of that structure",
        path="layers[0]",
        names=("'b'",),
    ),
    Bad(
        "re-flatten-other-shape",
        "Restructure.flatten",
        "a parameter of another shape",
        lambda c: c.re().flatten({"layers": [{"w": c.arr(1.0, 2.0, 3.0), "b": c.arr(0.0, 0.0)}]}),
        fk.StructureError,
        "the path, both shapes",
        path="layers[0].w",
        names=(r"\(2,\)", r"\(3,\)"),
    ),
    Bad(
        "re-flatten-out-list",
        "Restructure.flatten",
        "`out` a list",
        lambda c: c.re().flatten(c.model(), out=[0.0] * 4),
        TypeError,
        "`out` must be a 1-D array",
        names=("`out`",),
    ),
    Bad(
        "re-flatten-out-dtype",
        "Restructure.flatten",
        "`out` of another dtype",
        lambda c: c.re().flatten(c.model(), out=c.mutable(0.0, 0.0, 0.0, 0.0, dtype="float32")),
        TypeError,
        "`out` dtype vs the flat dtype (JAX/Dask: `out` needs a mutable array)",
        names=("`out`",),
    ),
    Bad(
        "re-flatten-out-short",
        "Restructure.flatten",
        "`out` of the wrong length",
        lambda c: c.re().flatten(c.model(), out=c.mutable(0.0, 0.0, 0.0)),
        ValueError,
        "`out` must be 1-D of length 4 (JAX/Dask: TypeError, immutable)",
        names=("`out`",),
        immutable_error=TypeError,
    ),
    Bad(
        "re-flatten-out-other-library",
        "Restructure.flatten",
        "`out` of another library",
        lambda c: c.re().flatten(c.model(), out=c.other_library_array()),
        TypeError,
        "`out`'s namespace vs the flat vector's",
        names=("`out`",),
    ),
    Bad(
        "re-flatten-policy-unknown",
        "Restructure.flatten",
        "`policy='x'`",
        lambda c: c.re().flatten(c.model(), policy="x"),
        ValueError,
        "the three policies",
        names=("'strict'",),
    ),
    # arithmetic
    Bad(
        "add-mismatched-structure",
        "add",
        "`b` of another structure",
        lambda c: fk.add(c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both sides, `b` differs",
        path="layers",
        names=("`b`",),
    ),
    Bad(
        "add-shape",
        "add",
        "`b` with a parameter of another shape",
        lambda c: fk.add(c.model(), {"layers": [{"w": c.arr(1.0, 2.0, 3.0), "b": c.arr(0.0, 0.0)}]}),
        fk.StructureError,
        "the path, both shapes",
        path="layers[0].w",
        names=(r"\(2,\)", r"\(3,\)"),
    ),
    Bad(
        "add-dtype",
        "add",
        "`b` with a parameter of another dtype",
        lambda c: fk.add(c.model(), {"layers": [{"w": c.arr(1.0, 2.0, dtype="float32"), "b": c.arr(0.0, 0.0)}]}),
        fk.PolicyError,
        "the path, both dtypes, cast one model",
        path="layers[0].w",
        names=("float32",),
    ),
    Bad(
        "add-not-a-model",
        "add",
        "`b` an int",
        lambda c: fk.add(c.model(), 3),
        fk.StructureError,
        "at <root>: dict vs leaf",
        names=("<root>",),
    ),
    Bad(
        "sub-mismatched-structure",
        "sub",
        "`b` of another structure",
        lambda c: fk.sub(c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both sides",
        path="layers",
    ),
    Bad(
        "scale-c-str",
        "scale",
        "`c` a str",
        lambda c: fk.scale("2", c.model()),
        TypeError,
        "`c` must be a Python number or a 0-d array",
        names=("`c`",),
    ),
    Bad(
        "scale-c-none",
        "scale",
        "`c` None",
        lambda c: fk.scale(None, c.model()),
        TypeError,
        "`c` must be a Python number or a 0-d array",
        names=("`c`",),
    ),
    Bad(
        "scale-swapped",
        "scale",
        "the model first, the number second",
        lambda c: fk.scale(c.model(), 2),
        TypeError,
        "`c` must be a Python number or a 0-d array, got dict",
        names=("`c`", "dict"),
    ),
    Bad(
        "scale-c-1d",
        "scale",
        "`c` a 1-D array",
        lambda c: fk.scale(c.arr(1.0, 2.0), c.model()),
        ValueError,
        "`c` must be 0-d; use fk.fmap per parameter",
        names=("`c`",),
    ),
    Bad(
        "scale-complex-on-real",
        "scale",
        "complex `c` on real parameters",
        lambda c: fk.scale(1j, c.model()),
        fk.PolicyError,
        "the path; a complex coefficient would make it complex",
        path="layers[0].w",
        names=("complex",),
    ),
    Bad(
        "lincomb-coefficients-float",
        "lincomb",
        "`coefficients` a float, not a sequence",
        lambda c: fk.lincomb(1.0, [c.model()]),
        TypeError,
        "`coefficients` must be a sequence of numbers",
        names=("coefficients",),
    ),
    Bad(
        "lincomb-models-dict",
        "lincomb",
        "`models` one model (a dict) instead of a sequence of models",
        lambda c: fk.lincomb([1, 1], {"w": c.arr(1.0), "b": c.arr(2.0)}),
        TypeError,
        "`models` must be a sequence of models, got a dict",
        names=("models",),
    ),
    Bad(
        "lincomb-length",
        "lincomb",
        "`coefficients` and `models` of different lengths",
        lambda c: fk.lincomb([1, 2], [c.model()]),
        ValueError,
        "both lengths",
        names=("2", "1"),
    ),
    Bad("lincomb-empty", "lincomb", "no models", lambda c: fk.lincomb([], []), ValueError, "at least one model"),
    Bad(
        "lincomb-coefficient-str",
        "lincomb",
        "a str coefficient",
        lambda c: fk.lincomb(["a"], [c.model()]),
        TypeError,
        "`coefficients[0]` must be a number or a 0-d array",
        names=(r"coefficients\[0\]",),
    ),
    Bad(
        "lincomb-mismatched-structure",
        "lincomb",
        "models of different structures",
        lambda c: fk.lincomb([1, 1], [c.model(), {"layers": []}]),
        fk.StructureError,
        "the path; `models[1]` differs",
        path="layers",
        names=(r"models\[1\]",),
    ),
    Bad(
        "mean-models-dict",
        "mean",
        "`models` one model (a dict)",
        lambda c: fk.mean({"w": c.arr(1.0, 2.0)}),
        TypeError,
        "`models` must be a sequence of models, got a dict",
        names=("models",),
    ),
    Bad("mean-empty", "mean", "no models", lambda c: fk.mean([]), ValueError, "at least one model"),
    Bad(
        "mean-mismatched-structure",
        "mean",
        "models of different structures",
        lambda c: fk.mean([c.model(), {"layers": []}]),
        fk.StructureError,
        "the path; `models[1]` differs",
        path="layers",
        names=(r"models\[1\]",),
    ),
    Bad(
        "lerp-t-str",
        "lerp",
        "`t` a str",
        lambda c: fk.lerp(c.model(), c.model(), "a"),
        TypeError,
        "`t` must be a Python number or a 0-d array",
        names=("`t`",),
    ),
    Bad(
        "lerp-t-complex",
        "lerp",
        "`t` complex",
        lambda c: fk.lerp(c.model(), c.model(), 1j),
        TypeError,
        "`t` must be real",
        names=("`t`",),
    ),
    Bad(
        "lerp-t-1d",
        "lerp",
        "`t` a 1-D array",
        lambda c: fk.lerp(c.model(), c.model(), c.arr(0.5, 0.5)),
        ValueError,
        "`t` must be 0-d",
        names=("`t`",),
    ),
    Bad(
        "lerp-mismatched-structure",
        "lerp",
        "`b` of another structure",
        lambda c: fk.lerp(c.model(), {"layers": []}, 0.5),
        fk.StructureError,
        "the path, both sides",
        path="layers",
    ),
    Bad(
        "dot-mismatched-structure",
        "dot",
        "`b` of another structure",
        lambda c: fk.dot(c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both sides",
        path="layers",
    ),
    Bad(
        "dot-dtype",
        "dot",
        "`b` of another dtype",
        lambda c: fk.dot({"w": c.arr(1.0)}, {"w": c.arr(1.0, dtype="float32")}),
        fk.PolicyError,
        "the path, both dtypes",
        path="w",
        names=("float32",),
    ),
    Bad(
        "dot-no-parameters",
        "dot",
        "models without parameters",
        lambda c: fk.dot({"a": 1}, {"a": 1}),
        ValueError,
        "`a` has no parameters; check with fk.leaves_with_path",
        names=("parameters",),
    ),
    Bad(
        "norm-no-parameters",
        "norm",
        "a model without parameters",
        lambda c: fk.norm({"n": c.arr(1, 2, dtype="int64")}),
        ValueError,
        "`a` has no parameters",
        names=("parameters",),
    ),
    Bad(
        "norm-ord-str",
        "norm",
        "`ord='x'`",
        lambda c: fk.norm(c.model(), ord="x"),
        TypeError,
        "`ord` must be a real number",
        names=("`ord`",),
    ),
    Bad(
        "normalize-ord-str",
        "normalize",
        "`ord='x'`",
        lambda c: fk.normalize(c.model(), ord="x"),
        TypeError,
        "`ord` must be a real number",
        names=("`ord`",),
    ),
    Bad(
        "normalize-no-parameters",
        "normalize",
        "a model without parameters",
        lambda c: fk.normalize({"a": 1}),
        ValueError,
        "`a` has no parameters",
        names=("parameters",),
    ),
    Bad(
        "filter_normalize-one_d",
        "filter_normalize",
        "`one_d='x'`",
        lambda c: fk.filter_normalize(c.model(), c.model(), one_d="x"),
        ValueError,
        "`one_d` must be 'zero', 'keep' or 'normalize'",
        names=("`one_d`", "'zero'"),
    ),
    Bad(
        "filter_normalize-axis-str",
        "filter_normalize",
        "`axis='a'`",
        lambda c: fk.filter_normalize(c.model(), c.model(), axis="a"),
        TypeError,
        "`axis` must be an int",
        names=("`axis`",),
    ),
    Bad(
        "filter_normalize-axis-out-of-range",
        "filter_normalize",
        "`axis=5` for 2-D parameters",
        lambda c: fk.filter_normalize(
            {"w": c.xp.ones((2, 3), dtype=c.xp.float64)}, {"w": c.xp.ones((2, 3), dtype=c.xp.float64)}, axis=5
        ),
        ValueError,
        "the path, the parameter's rank",
        path="w",
        names=("axis",),
    ),
    Bad(
        "filter_normalize-mismatched-structure",
        "filter_normalize",
        "`reference` of another structure",
        lambda c: fk.filter_normalize(c.model(), {"layers": []}),
        fk.StructureError,
        "the path; `reference` differs",
        path="layers",
        names=("`reference`",),
    ),
    Bad(
        "copy-cycle",
        "copy",
        "a tree that contains itself",
        lambda c: fk.copy(c.cycle()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[1]",
        names=("cycle",),
    ),
    # loading
    Bad(
        "load_into-mismatched-structure",
        "load_into",
        "`src` of another structure",
        lambda c: fk.load_into(fk.copy(c.model()), {"layers": []}),
        fk.StructureError,
        "the path, both sides, `src` differs",
        path="layers",
        names=("`src`",),
    ),
    Bad(
        "load_into-src-none",
        "load_into",
        "`src` None",
        lambda c: fk.load_into(fk.copy(c.model()), None),
        fk.StructureError,
        "at <root>: dict vs leaf",
        names=("<root>",),
    ),
    Bad(
        "load_into-shape",
        "load_into",
        "a `src` array of another shape",
        lambda c: fk.load_into(fk.copy(c.model()), {"layers": [{"w": c.arr(1.0, 2.0, 3.0), "b": c.arr(0.0, 0.0)}]}),
        fk.StructureError,
        "the path, both shapes (JAX/Dask: immutable `dst`)",
        path="layers[0].w",
        immutable_error=TypeError,
    ),
    Bad(
        "load_into-complex-into-real",
        "load_into",
        "a complex `src` into a real `dst`",
        lambda c: fk.load_into({"w": c.mutable(1.0, 2.0)}, {"w": c.arr(1.0, 2.0, dtype="complex128")}),
        fk.PolicyError,
        "the path; take the real part explicitly (JAX/Dask: immutable `dst`)",
        path="w",
        names=("complex",),
        immutable_error=TypeError,
    ),
    Bad(
        "load_into-tie-fed-two-values",
        "load_into",
        "a tie in `dst` fed two different `src` arrays",
        lambda c: (lambda w: fk.load_into({"a": w, "b": w}, {"a": c.arr(1.0, 2.0), "b": c.arr(3.0, 4.0)}))(
            c.mutable(0.0, 0.0)
        ),
        fk.StructureError,
        "both paths; untie `dst` or make `src` agree (JAX/Dask: immutable `dst`)",
        path="a",
        names=(r"\bb\b",),
        immutable_error=TypeError,
    ),
    Bad(
        "load_into-scalar-for-array",
        "load_into",
        "a float in `src` where `dst` has an array",
        lambda c: fk.load_into({"w": c.mutable(1.0, 2.0)}, {"w": 3.0}),
        fk.StructureError,
        "the path; an array of the same shape expected (a structure mismatch, on every backend)",
        path="w",
    ),
    Bad(
        "state_dict-colliding-keys",
        "state_dict",
        "a dict key `'a.b'` next to `{'a': {'b': ...}}`",
        lambda c: fk.state_dict({"a.b": c.arr(1.0), "a": {"b": c.arr(2.0)}}),
        fk.StructureError,
        "both paths read one dotted key; rename one",
        path="a.b",
        names=(r"\['a\.b'\] and a\.b",),
    ),
    Bad(
        "load_state_dict-not-a-mapping",
        "load_state_dict",
        "a list of pairs as `mapping`",
        lambda c: fk.load_state_dict(c.model(), [("layers.0.w", c.arr(1.0, 2.0))]),
        TypeError,
        "`mapping` must be a Mapping; pass dict(pairs)",
        names=("`mapping`",),
    ),
    Bad(
        "load_state_dict-key-not-str",
        "load_state_dict",
        "an int key in `mapping`",
        lambda c: fk.load_state_dict(c.model(), {0: c.arr(1.0, 2.0)}),
        TypeError,
        "`mapping` keys must be str",
        names=("`mapping` keys",),
    ),
    Bad(
        "load_state_dict-strict-not-bool",
        "load_state_dict",
        "`strict='yes'`",
        lambda c: fk.load_state_dict(c.model(), {}, strict="yes"),
        TypeError,
        "`strict` must be True or False",
        names=("`strict`",),
    ),
    Bad(
        "load_state_dict-keys-do-not-fit",
        "load_state_dict",
        "a wrong shape, a missing and an unexpected key",
        lambda c: fk.load_state_dict(c.model(), {"layers.0.w": c.arr(1.0, 2.0, 3.0), "extra": c.arr(1.0)}),
        fk.StructureError,
        "every missing, unexpected and mismatched key at once; or pass strict=False (on every backend)",
        path="layers.0.w",
        names=("missing.*'layers.0.b'", "unexpected.*'extra'", "mismatched", "strict=False"),
    ),
    Bad(
        "load_state_dict-tie-fed-two-values",
        "load_state_dict",
        "a tie in `dst` given two different values",
        lambda c: (lambda w: fk.load_state_dict({"a": w, "b": w}, {"a": c.arr(1.0, 2.0), "b": c.arr(3.0, 4.0)}))(
            c.mutable(0.0, 0.0)
        ),
        fk.StructureError,
        "both keys' paths; make the mapping agree (JAX/Dask: immutable `dst`)",
        path="a",
        names=(r"\bb\b",),
        immutable_error=TypeError,
    ),
]

# ---------------------------------------------------------------------------
# cases without arrays (run once)

PLAIN_CASES: list[Bad] = [
    Bad(
        "flatten-is_leaf-not-callable",
        "flatten",
        "`is_leaf` that is not callable",
        lambda c: fk.flatten({"a": 1}, is_leaf=3),
        TypeError,
        "`is_leaf` must be a callable or None",
        names=("is_leaf",),
    ),
    Bad(
        "flatten-cycle",
        "flatten",
        "a tree that contains itself",
        lambda c: fk.flatten(_cyclic()),
        fk.StructureError,
        "the path where the cycle closes; break it or stop the walk with `is_leaf`",
        path="a[0]",
        names=("cycle",),
    ),
    Bad(
        "unflatten-not-a-treedef",
        "unflatten",
        "a `treedef` that is not a TreeDef",
        lambda c: fk.unflatten({"a": 1}, [1]),
        TypeError,
        "`treedef` must be a TreeDef, the second result of fk.flatten",
        names=("treedef", "TreeDef"),
    ),
    Bad(
        "unflatten-wrong-count",
        "unflatten",
        "a list of leaves of the wrong length",
        lambda c: fk.unflatten(fk.flatten({"a": 1, "b": 2})[1], [1]),
        ValueError,
        "expected N leaves, got M",
        names=("expected 2 leaves", "got 1"),
    ),
    Bad(
        "TreeDef-constructor",
        "TreeDef",
        "calling the class directly",
        lambda c: fk.TreeDef(),
        TypeError,
        "TreeDef objects are made by fk.flatten",
        names=("fk.flatten",),
    ),
    Bad(
        "KeyPath-str",
        "KeyPath",
        "a str instead of a tuple of entries",
        lambda c: fk.KeyPath("name"),
        TypeError,
        "wrap a single key in a tuple",
        names=(r"KeyPath\(\('name',\)\)",),
    ),
    Bad(
        "KeyPath-int",
        "KeyPath",
        "an int",
        lambda c: fk.KeyPath(3),
        TypeError,
        "`entries` must be an iterable of path entries",
        names=("entries",),
    ),
    Bad(
        "KeyPath.get-missing",
        "KeyPath",
        "`get` of a path that does not exist",
        lambda c: fk.KeyPath(("layers", 5, "w")).get({"layers": [{"w": 1.0}]}),
        fk.StructureError,
        "the node where it stops, the whole path, the children there",
        path="layers",
        names=(r"layers\[5\]\.w", r"\[0\]"),
    ),
    Bad(
        "KeyPath.get-through-leaf",
        "KeyPath",
        "`get` of a path that goes through a leaf",
        lambda c: fk.KeyPath(("a", "b")).get({"a": 3}),
        fk.StructureError,
        "the path, the leaf's type",
        path="a",
        names=("int",),
    ),
    Bad(
        "register-not-a-class",
        "register",
        "`cls` an int",
        lambda c: fk.register(3, children=lambda o: ({}, None), rebuild=lambda aux, ch: None),
        TypeError,
        "`cls` must be a class",
        names=("`cls`",),
    ),
    Bad(
        "register-builtin-scalar",
        "register",
        "`cls` int",
        lambda c: fk.register(int, children=lambda o: ({}, None), rebuild=lambda aux, ch: 0),
        ValueError,
        "built-in scalar types are always leaves",
        names=("int",),
    ),
    Bad(
        "register-existing",
        "register",
        "a class already registered, without `replace=True`",
        lambda c: fk.register(_registered_class(), children=lambda o: ({}, None), rebuild=lambda aux, ch: None),
        ValueError,
        "pass `replace=True`",
        names=("replace=True",),
    ),
    Bad(
        "register-children-not-callable",
        "register",
        "`children` an int",
        lambda c: fk.register(Fresh, children=3, rebuild=lambda aux, ch: Fresh()),
        TypeError,
        "`children` must be a callable",
        names=("`children`",),
    ),
    Bad(
        "register-rebuild-not-callable",
        "register",
        "`rebuild` an int",
        lambda c: fk.register(Fresh, children=lambda o: ({}, None), rebuild=3),
        TypeError,
        "`rebuild` must be a callable",
        names=("`rebuild`",),
    ),
    Bad(
        "register-trainable-not-callable",
        "register",
        "`trainable` an int",
        lambda c: fk.register(Fresh, children=lambda o: ({}, None), rebuild=lambda aux, ch: Fresh(), trainable=3),
        TypeError,
        "`trainable` must be a callable or None",
        names=("`trainable`",),
    ),
    Bad(
        "register-replace-not-bool",
        "register",
        "`replace='y'`",
        lambda c: fk.register(
            type("R", (), {}), children=lambda o: ({}, None), rebuild=lambda aux, ch: None, replace="y"
        ),
        TypeError,
        "`replace` must be True or False",
        names=("`replace`",),
    ),
    Bad(
        "register_dataclass-not-dataclass",
        "register_dataclass",
        "a plain class",
        lambda c: fk.register_dataclass(Fresh),
        TypeError,
        "apply @dataclasses.dataclass first",
        names=("dataclass",),
    ),
    Bad(
        "register_dataclass-not-a-class",
        "register_dataclass",
        "an int",
        lambda c: fk.register_dataclass(3),
        TypeError,
        "`cls` must be a class",
        names=("`cls`",),
    ),
    Bad(
        "register_dataclass-replace-not-bool",
        "register_dataclass",
        "`replace='y'`",
        lambda c: fk.register_dataclass(dataclasses.make_dataclass("D", ["x"]), replace="y"),
        TypeError,
        "`replace` must be True or False",
        names=("`replace`",),
    ),
    Bad(
        "register_leaf-not-a-class",
        "register_leaf",
        "an int",
        lambda c: fk.register_leaf(3),
        TypeError,
        "`cls` must be a class",
        names=("`cls`",),
    ),
    Bad(
        "register_leaf-builtin-scalar",
        "register_leaf",
        "`cls` int",
        lambda c: fk.register_leaf(int),
        ValueError,
        "built-in scalar types are always leaves",
        names=("int",),
    ),
    Bad(
        "register_leaf-existing",
        "register_leaf",
        "`dict`, a built-in node, without `replace=True`",
        lambda c: fk.register_leaf(dict),
        ValueError,
        "pass `replace=True`",
        names=("replace=True",),
    ),
    Bad(
        "register_leaf-replace-not-bool",
        "register_leaf",
        "`replace='y'`",
        lambda c: fk.register_leaf(type("L", (), {}), replace="y"),
        TypeError,
        "`replace` must be True or False",
        names=("`replace`",),
    ),
    Bad(
        "Restructure-direct",
        "Restructure",
        "constructing it directly",
        lambda c: fk.Restructure(),
        TypeError,
        "made by fk.destructure(model)",
        names=("destructure",),
    ),
    Bad(
        "IncompatibleKeys-not-lists",
        "IncompatibleKeys",
        "a str instead of a list of keys",
        lambda c: fk.IncompatibleKeys("a", [], []),
        TypeError,
        "`missing` must be a list of str keys",
        names=("`missing`",),
    ),
    Bad(
        "save-shard_size",
        "save",
        '`shard_size="2XB"`',
        lambda c: fk.save(_ckpt_path("bad"), {"w": np.ones(2)}, shard_size="2XB"),
        ValueError,
        "`shard_size` must be a positive number of bytes or a string such as \"2GB\"",
        names=("shard_size",),
    ),
    Bad(
        "save-shard_size-infinite",
        "save",
        '`shard_size="inf"` (a float the size cannot be: it raised OverflowError)',
        lambda c: fk.save(_ckpt_path("bad"), {"w": np.ones(2)}, shard_size="1e400GB"),
        ValueError,
        "`shard_size` must be a positive number of bytes or a string such as \"2GB\"",
        names=("shard_size", "1e400GB"),
    ),
    Bad(
        "save-unstorable-dtype",
        "save",
        "a complex array (safetensors has no complex dtype)",
        lambda c: fk.save(_ckpt_path("bad"), {"w": np.ones(2, np.complex128)}),
        TypeError,
        "names the key and the dtype; cast it first",
        names=("'w'", "complex128"),
    ),
    Bad(
        "save-reserved-metadata",
        "save",
        '`metadata={"functorkit.pieces": "notes"}`, a key functorkit writes itself',
        lambda c: fk.save(_ckpt_path("bad"), {"w": np.ones(2)}, metadata={"functorkit.pieces": "notes"}),
        fk.StructureError,
        "names the key and every reserved key; rename it",
        names=("'functorkit.pieces'", "reserved", "'total_size'", "rename"),
    ),
    Bad(
        "load-missing-file",
        "load",
        "a path that does not exist",
        lambda c: fk.load(_ckpt_path("nope.safetensors")),
        FileNotFoundError,
        "names the path; expected a .safetensors file or a directory of shards",
        names=("nope",),
    ),
    Bad(
        "load-truncated",
        "load",
        "a file cut short",
        lambda c: fk.load(_truncated_checkpoint()),
        fk.StructureError,
        "names the file and the tensor whose bytes are missing; write the file again",
        names=("truncated", "'w'", "ckpt"),
    ),
    Bad(
        "load-like-mismatch",
        "load",
        "`like=` a model with other keys and shapes",
        lambda c: fk.load(_checkpoint({"w": np.ones(2), "x": np.ones(1)}), like={"w": np.ones(3), "y": np.ones(1)}),
        fk.StructureError,
        "every missing, unexpected and mismatched key, with the file",
        names=("missing.*'y'", "unexpected.*'x'", "'w'.*\\(2,\\).*\\(3,\\)", "ckpt"),
    ),
    Bad(
        "open-missing-shard",
        "open",
        "a sharded checkpoint with a shard removed",
        lambda c: fk.open(_checkpoint_without_a_shard()),
        FileNotFoundError,
        "names the missing shard and the index that lists it",
        names=("model-00002-of-00002", "missing shard"),
    ),
]

# the merge methods (docs/merging.md)


def _shorter(c: Ctx) -> dict[str, Any]:
    return {"layers": [{"w": c.arr(1.0), "b": c.arr(0.0, 0.0)}]}


CASES += [
    Bad(
        "slerp-unmatched-glob",
        "slerp",
        "`t` a dict of globs that no glob of matches a path",
        lambda c: fk.slerp(c.model(), c.model(), {"enc*": 0.5}),
        fk.StructureError,
        "the path, the globs, the path's two forms; add a catch-all `'*'`",
        path="layers[0].w",
        names=("`t`", "enc"),
    ),
    Bad(
        "task_arithmetic-weights-count",
        "task_arithmetic",
        "`weights` a list of the wrong length",
        lambda c: fk.task_arithmetic(c.model(), [c.model(), c.model()], [1.0]),
        ValueError,
        "one entry per model, both counts",
        names=("`weights`",),
    ),
    Bad(
        "ties-density-zero",
        "ties",
        "`density` 0",
        lambda c: fk.ties(c.model(), [c.model()], 1.0, density=0.0),
        ValueError,
        "`density` must be a fraction in (0, 1]",
        names=("`density`",),
    ),
    Bad(
        "ties-mismatched-shape",
        "ties",
        "a model with a parameter of another shape",
        lambda c: fk.ties(c.model(), [_shorter(c)], 1.0, density=0.5),
        fk.StructureError,
        "the path, both shapes, which model differs",
        path="layers[0].w",
        names=(r"models\[0\]",),
    ),
    Bad(
        "dare-seed-float",
        "dare",
        "`seed` a float",
        lambda c: fk.dare(c.model(), [c.model()], 1.0, density=0.5, seed=1.5),
        TypeError,
        "`seed` must be a Python int",
        names=("`seed`",),
    ),
    Bad(
        "dare-rescale-unknown",
        "dare",
        "`rescale` an unknown rule",
        lambda c: fk.dare(c.model(), [c.model()], 1.0, density=0.5, seed=0, rescale="l2"),
        ValueError,
        "`rescale` must be True, 'inverse' or False",
        names=("`rescale`",),
    ),
    Bad(
        "dare-rescale-array",
        "dare",
        "`rescale` an array (its == is element-wise: NumPy's raw ambiguous-truth error)",
        lambda c: fk.dare(c.model(), [c.model()], 1.0, density=0.5, seed=0, rescale=np.array([1, 2])),
        ValueError,
        "`rescale` must be True, 'inverse' or False",
        names=("`rescale`",),
    ),
    Bad(
        "model_stock-one-model",
        "model_stock",
        "one model besides the base",
        lambda c: fk.model_stock(c.model(), [c.model()]),
        ValueError,
        "at least 2 models besides the base",
    ),
    Bad(
        "tensor_norms-trainable_only-not-bool",
        "tensor_norms",
        "`trainable_only` a str",
        lambda c: fk.tensor_norms(c.model(), trainable_only="yes"),
        TypeError,
        "`trainable_only` must be True or False",
        names=("`trainable_only`",),
    ),
    Bad(
        "tensor_dots-mismatched-structure",
        "tensor_dots",
        "`b` of another structure",
        lambda c: fk.tensor_dots(c.model(), {"layers": []}),
        fk.StructureError,
        "the path, both sides",
        path="layers",
    ),
    Bad(
        "tensor_thresholds-density-above-one",
        "tensor_thresholds",
        "`density` 2",
        lambda c: fk.tensor_thresholds(c.model(), 2.0),
        ValueError,
        "`density` must be a fraction in (0, 1]",
        names=("`density`",),
    ),
]


# the tree tools (docs/tools.md)


def _tied(c: Ctx) -> dict[str, Any]:
    w = c.arr(1.0)
    return {"a": w, "b": w}


CASES += [
    Bad(
        "replace-wrong-path",
        "replace",
        "a path that does not exist",
        lambda c: fk.replace(c.model(), {"layers[0].ww": c.arr(1.0)}),
        fk.StructureError,
        "the path, the children where it stops, the nearest valid keys and paths",
        path="layers[0]",
        names=("ww", "Nearest"),
    ),
    Bad(
        "replace-tie-two-values",
        "replace",
        "two places of one tie given two different values",
        lambda c: fk.replace(_tied(c), {"a": c.arr(2.0), "b": c.arr(3.0)}),
        fk.StructureError,
        "both paths hold one tied leaf; name one of them",
        path="a",
        names=("tie",),
    ),
    Bad(
        "combine-two-values",
        "combine",
        "two groups holding a value at one place",
        lambda c: fk.combine({"k": c.arr(1.0)}, {"k": c.arr(2.0)}),
        fk.StructureError,
        "the path and the two groups; set the place to None in all groups but one",
        path="k",
        names=(r"groups\[0\]", r"groups\[1\]"),
    ),
    Bad(
        "stack-shape-mismatch",
        "stack",
        "models whose arrays differ in shape at one place",
        lambda c: fk.stack([{"w": c.arr(1.0)}, {"w": c.arr(1.0, 2.0)}]),
        fk.StructureError,
        "the path and both shapes",
        path="w",
        names=("shape",),
    ),
    Bad(
        "stack-dtype-strict",
        "stack",
        "models whose arrays differ in dtype, under policy='strict'",
        lambda c: fk.stack([{"w": c.arr(1.0)}, {"w": c.arr(1.0, dtype="float32")}]),
        fk.PolicyError,
        "the path, both dtypes; pass policy='model'",
        path="w",
        names=("policy",),
    ),
    Bad(
        "unstack-ragged",
        "unstack",
        "arrays with different leading axes",
        lambda c: fk.unstack({"a": c.arr(1.0, 2.0), "b": c.arr(1.0, 2.0, 3.0)}),
        fk.StructureError,
        "the path, the expected length and where it was seen",
        path="b",
        names=("leading axis",),
    ),
]

PLAIN_CASES += [
    Bad(
        "replace-updates-not-a-mapping",
        "replace",
        "`updates` a list of pairs",
        lambda c: fk.replace({"a": 1}, [("a", 2)]),
        TypeError,
        "`updates` must be a mapping {path: value}",
        names=("updates",),
    ),
    Bad(
        "partition-bad-predicate",
        "partition",
        "a predicate that is neither callable nor a str",
        lambda c: fk.partition({"a": 1}, 3),
        TypeError,
        "predicate 0 must be a callable or a glob str",
        names=("predicate",),
    ),
    Bad(
        "stack-empty",
        "stack",
        "an empty list of models",
        lambda c: fk.stack([]),
        ValueError,
        "`models` is empty; expected at least one model",
        names=("models",),
    ),
    Bad(
        "summary-cycle",
        "summary",
        "a tree that contains itself",
        lambda c: fk.summary(_cyclic()),
        fk.StructureError,
        "the path where the cycle closes",
        path="a[0]",
        names=("cycle",),
    ),
    Bad(
        "Summary-direct",
        "Summary",
        "constructing it from something that is not a list of rows",
        lambda c: fk.Summary(5),
        TypeError,
        "made by fk.summary(model)",
        names=("summary",),
    ),
]


def _ckpt_path(name: str) -> str:
    return str(pathlib.Path(tempfile.mkdtemp(prefix="fk-bad-")) / name)


def _checkpoint(model: Any, shard_size: int | None = None) -> str:
    path = _ckpt_path("ckpt" if shard_size else "ckpt.safetensors")
    fk.save(path, model, shard_size=shard_size)
    return path


def _truncated_checkpoint() -> str:
    path = pathlib.Path(_checkpoint({"w": np.ones(4)}))
    path.write_bytes(path.read_bytes()[:-3])
    return str(path)


def _checkpoint_without_a_shard() -> str:
    pytest.importorskip("dask.array")
    path = pathlib.Path(_checkpoint({"a": np.ones(8), "b": np.ones(8)}, shard_size=64))
    (path / "model-00002-of-00002.safetensors").unlink()
    return str(path)


def _check(case: Bad, ctx: Ctx) -> None:
    immutable = case.immutable_error is not None and ctx.immutable
    want = case.immutable_error if immutable else case.error
    with pytest.raises(BaseException) as info:  # noqa: PT011 - the exact class is asserted below
        case.call(ctx)
    err = info.value
    if isinstance(err, pytest.skip.Exception):  # the case needs a library this session lacks
        raise err
    assert type(err) is want, f"{case.id}: expected {want.__name__}, got {type(err).__name__}: {err}"
    msg = str(err)
    if case.path is not None:
        assert case.path in msg, f"{case.id}: the message does not name the path {case.path!r}: {msg}"
    for pattern in () if immutable else case.names:  # `names` describe the mutable-backend message
        assert re.search(pattern, msg), f"{case.id}: the message does not match {pattern!r}: {msg}"
    assert HINT.search(msg), f"{case.id}: the message states no expectation or fix: {msg}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case: Bad, xp: Any, backend: Backend) -> None:
    _check(case, Ctx(xp, backend))


@pytest.mark.parametrize("case", PLAIN_CASES, ids=lambda c: c.id)
def test_bad_input_without_arrays(case: Bad) -> None:
    _check(case, Ctx(np, None))


# ---------------------------------------------------------------------------
# comparing, checking and broadcasting (docs/tools.md, issue 24)

CASES += [
    Bad(
        "allclose-two-libraries",
        "allclose",
        "two models of different array libraries",
        lambda c: fk.allclose({"w": c.arr(1.0, 2.0)}, {"w": c.other_library_array()}),
        fk.PolicyError,
        "the two libraries; pass namespaces='any' to compare on the host",
        path="w",
        names=("namespaces='any'",),
    ),
    Bad(
        "all_finite-two-libraries",
        "all_finite",
        "parameters of two array libraries",
        lambda c: fk.all_finite({"a": c.arr(1.0, 2.0), "b": c.other_library_array()}),
        fk.PolicyError,
        "both paths, namespaces and devices; move the model to one device",
        path="b",
    ),
]

PLAIN_CASES += [
    Bad(
        "assert_allclose-negative-rtol",
        "assert_allclose",
        "`rtol` negative",
        lambda c: fk.assert_allclose({"a": 1.0}, {"a": 1.0}, rtol=-1.0),
        ValueError,
        "`rtol` must be a non-negative number",
        names=("`rtol`",),
    ),
    Bad(
        "broadcast_prefix-not-a-prefix",
        "broadcast_prefix",
        "a prefix without one of the tree's keys",
        lambda c: fk.broadcast_prefix({"enc": 0.1}, {"enc": [1.0], "dec": [2.0]}),
        fk.StructureError,
        "both key lists, what is missing from the prefix; give every key",
        path="<root>",
        names=("missing from the prefix",),
    ),
]


# ---------------------------------------------------------------------------
# the catalogue covers every public name, and the docs list it


def test_catalogue_covers_every_public_name() -> None:
    covered = {c.function.split(".")[0] for c in CASES + PLAIN_CASES}
    raised = {c.error.__name__ for c in CASES + PLAIN_CASES}
    covered |= raised & {"StructureError", "PolicyError"}
    covered |= {"Policy"}  # a type alias (Literal): nothing to call; bad policies are cases of their functions
    assert set(fk.__all__) - covered == set()


def test_error_classes_are_catchable_as_builtins() -> None:
    assert issubclass(fk.StructureError, ValueError)
    assert issubclass(fk.PolicyError, TypeError)


def _doc_rows() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 5 and cells[0].startswith("`") and cells[0].endswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_docs_table_matches_the_catalogue() -> None:
    rows = _doc_rows()
    cases = {c.id: c for c in CASES + PLAIN_CASES}
    assert set(rows) == set(cases)
    for cid, case in cases.items():
        assert rows[cid][1] == f"`fk.{case.function}`", cid
        name = case.error.__name__
        shown = f"`fk.{name}`" if name in ("StructureError", "PolicyError") else f"`{name}`"
        assert rows[cid][3].startswith(shown), cid


# ---------------------------------------------------------------------------
# the reproducers that need more than one call


def _writes_nothing(out_owner: Any, call: Callable[[], Any]) -> None:
    before = to_numpy(out_owner)
    with pytest.raises(ValueError, match="out") as info:
        call()
    assert type(info.value) is ValueError
    np.testing.assert_array_equal(to_numpy(out_owner), before)


def test_flatten_out_stride_zero_numpy() -> None:
    re_ = fk.destructure({"w": np.arange(1.0, 5.0)})[1]
    owner = np.zeros(1)
    out = np.lib.stride_tricks.as_strided(owner, shape=(4,), strides=(0,))
    assert out.flags.writeable
    _writes_nothing(owner, lambda: re_.flatten({"w": np.arange(1.0, 5.0)}, out=out))


def test_flatten_out_stride_zero_torch() -> None:
    torch = pytest.importorskip("torch")
    re_ = fk.destructure({"w": torch.arange(1.0, 5.0)})[1]
    owner = torch.zeros(1)
    out = owner.expand(4)
    _writes_nothing(owner, lambda: re_.flatten({"w": torch.arange(1.0, 5.0)}, out=out))


def test_flatten_out_overlapping_the_models_parameters_numpy() -> None:
    base = np.arange(9.0)
    re_ = fk.destructure({"w": np.zeros(8)})[1]
    m = re_(base[:8])
    _writes_nothing(base, lambda: re_.flatten(m, out=base[1:9]))


def test_flatten_out_overlapping_the_models_parameters_torch() -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(9.0, dtype=torch.float64)
    re_ = fk.destructure({"w": torch.zeros(8, dtype=torch.float64)})[1]
    m = re_(base[:8])
    _writes_nothing(base, lambda: re_.flatten(m, out=base[1:9]))


def test_flatten_out_read_only_numpy() -> None:
    re_ = fk.destructure({"w": np.ones(2)})[1]
    out = np.zeros(2)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        re_.flatten({"w": np.ones(2)}, out=out)


def test_load_into_immutable_dst(xp: Any, backend: Backend) -> None:
    """Immutable arrays in `dst` (JAX, Dask, read-only NumPy) raise TypeError naming the path; others load."""
    dst = {"layers": [{"w": xp.asarray([1.0, 2.0], dtype=xp.float64)}]}
    src = {"layers": [{"w": xp.asarray([3.0, 4.0], dtype=xp.float64)}]}
    if backend in (Backend.JAX, Backend.DASK, Backend.NUMPY_READONLY):
        with pytest.raises(TypeError) as info:
            fk.load_into(dst, src)
        assert type(info.value) is TypeError
        assert "layers[0].w" in str(info.value)
        assert HINT.search(str(info.value))
        np.testing.assert_array_equal(to_numpy(dst["layers"][0]["w"]), [1.0, 2.0])
    else:
        fk.load_into(dst, src)
        np.testing.assert_array_equal(to_numpy(dst["layers"][0]["w"]), [3.0, 4.0])


def test_load_into_is_all_or_nothing(xp: Any, backend: Backend) -> None:
    """An error at the last leaf leaves `dst` untouched (JAX/Dask: the immutable `dst` is refused first)."""
    ctx = Ctx(xp, backend)
    first = ctx.mutable(1.0, 2.0)
    dst = {"a": first, "z": ctx.mutable(1.0, 2.0)}
    src = {"a": xp.asarray([5.0, 6.0], dtype=xp.float64), "z": xp.asarray([1.0, 2.0, 3.0], dtype=xp.float64)}
    want = TypeError if ctx.immutable else fk.StructureError
    with pytest.raises(want) as info:
        fk.load_into(dst, src)
    assert type(info.value) is want
    assert ("z" if want is fk.StructureError else "a") in str(info.value)
    np.testing.assert_array_equal(to_numpy(first), [1.0, 2.0])


def test_load_into_aliased_dst_numpy() -> None:
    a = np.ones((2, 2))
    with pytest.raises(fk.StructureError) as info:
        fk.load_into({"a": a, "b": a.T}, {"a": np.zeros((2, 2)), "b": np.zeros((2, 2))})
    msg = str(info.value)
    assert "a" in msg
    assert " b" in msg
    assert "fk.Transpose" in msg
    np.testing.assert_array_equal(a, np.ones((2, 2)))


def test_keypath_with_a_5000_digit_int_key_is_printable(xp: Any) -> None:
    big = 10**5000
    path = fk.KeyPath(("a", big))
    text = str(path)  # must not raise (int -> str conversion limit)
    assert text.startswith("a[")
    assert repr(path)
    with pytest.raises(fk.StructureError) as info:
        path.get({"a": {}})
    assert str(info.value).startswith("at a")
    model = {big: xp.asarray([1.0], dtype=xp.float64), "b": xp.asarray([1.0], dtype=xp.float32)}
    with pytest.raises(fk.PolicyError) as info2:
        fk.destructure(model)
    assert "float32" in str(info2.value)
    with pytest.raises(fk.StructureError) as info3:
        fk.fmap(lambda x, y: x, {big: 1.0}, {1: 1.0})
    assert str(info3.value)


def test_nan_float_key_path_gets_its_value(xp: Any) -> None:
    nan = float("nan")
    model = {nan: xp.asarray([1.0, 2.0], dtype=xp.float64), "b": {nan: 3.0}}
    got = fk.leaves_with_path(model)
    assert len(got) == 2
    for path, leaf in got:
        assert path.get(model) is leaf
    assert str(got[0][0]) == "[nan]"


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_np_matrix_is_a_parameter_or_a_clear_error() -> None:
    """An np.matrix leaf is never silently a constant: a parameter everywhere, or a clear error naming it."""
    model = {"w": np.matrix([[1.0, 2.0]]), "b": np.zeros(1)}
    ops: list[tuple[str, Callable[[], Any]]] = [
        ("destructure", lambda: len(fk.destructure(model)[1])),
        ("norm", lambda: float(fk.norm(model))),
        ("scale", lambda: fk.scale(2, model)["w"]),
        ("trainable_only", lambda: fk.fmap(lambda x: x * 2, model, trainable_only=True)["w"]),
    ]
    for name, op in ops:
        error: Exception | None = None
        try:
            got = op()
        except (TypeError, ValueError) as e:
            error = e
        if error is not None:
            msg = str(error)
            assert "matrix" in msg, f"{name}: the error does not name the np.matrix: {msg}"
            assert "w" in msg, f"{name}: the error does not name the path w: {msg}"
            assert HINT.search(msg), name
            continue
        if name == "destructure":
            assert got == 3, "np.matrix counted as a constant by destructure"
        elif name == "norm":
            assert got == pytest.approx(math.sqrt(5.0)), "np.matrix left out of fk.norm"
        else:
            np.testing.assert_array_equal(np.asarray(got), [[2.0, 4.0]], err_msg=f"{name}: np.matrix not mapped")


def test_lincomb_float_coefficients_message(xp: Any) -> None:
    """`fk.lincomb(1.0, [a])`: a TypeError that names the argument, not Python's iteration error."""
    with pytest.raises(TypeError) as info:
        fk.lincomb(1.0, [{"w": xp.asarray([1.0, 2.0], dtype=xp.float64)}])
    assert "'float' object is not iterable" not in str(info.value)
    assert "coefficients" in str(info.value)
