"""`fk.allclose` / `fk.assert_allclose` by value for every dtype (docs/tools.md, SPEC 16).

Narrow floats (float16, bfloat16, float8_e4m3fn, float8_e5m2) are compared in float32, which holds
each of their values exactly; integers in float64, as NumPy's ``isclose`` (no wrap-around, no
overflow). On every backend that has the dtype, and across libraries with ``namespaces="any"``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _compare

from conftest import Backend, namespace_for

NARROW = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def _host_dtype(name: str) -> Any:
    if name == "float16":
        return np.dtype(np.float16)
    ml = pytest.importorskip("ml_dtypes")
    return np.dtype(getattr(ml, name))


def _narrow(backend: Backend, name: str, values: Any) -> Any:
    """An array of dtype `name` (with `values`, exact in it) of `backend`'s library."""
    host = np.asarray(values, dtype=np.float32)
    if backend is Backend.TORCH:
        import torch

        return torch.from_numpy(host.copy()).to(getattr(torch, name))
    if backend is Backend.JAX:
        import jax.numpy as jnp

        return jnp.asarray(host).astype(getattr(jnp, name))
    if backend in (Backend.NUMPY, Backend.NUMPY_READONLY, Backend.DASK):
        h = host.astype(_host_dtype(name))
        if backend is Backend.DASK:
            import dask.array as da

            return da.from_array(h, chunks=1)
        if backend is Backend.NUMPY_READONLY:
            h.flags.writeable = False
        return h
    if backend is Backend.CUPY and name == "float16":
        return namespace_for(backend).asarray(host.astype(np.float16))
    pytest.skip(f"{backend.value} has no {name} arrays")


def _message(a: Any, b: Any, **kw: Any) -> str:
    with pytest.raises(AssertionError) as info:
        fk.assert_allclose(a, b, **kw)
    return str(info.value)


# --------------------------------------------------------------------------- narrow floats


@pytest.mark.parametrize("name", NARROW)
def test_narrow_floats_are_compared_by_value(backend: Backend, name: str) -> None:
    a = {"w": _narrow(backend, name, [1.0, 1.0])}
    b = {"w": _narrow(backend, name, [1.0, 2.0])}
    assert fk.allclose(a, {"w": _narrow(backend, name, [1.0, 1.0])}) is True
    fk.assert_allclose(a, {"w": _narrow(backend, name, [1.0, 1.0])})
    assert fk.allclose(a, b) is False
    # |1 - 2| is 1 (the bit patterns of 1.0 and 2.0 differ by 128 in bfloat16, 1024 in float16)
    assert fk.allclose(a, b, atol=1.0, rtol=0) is True
    assert fk.allclose(a, b, atol=0.99, rtol=0) is False
    assert fk.allclose(a, b, rtol=0.5, atol=0) is True
    assert fk.allclose(a, b, rtol=0.49, atol=0) is False
    msg = _message(a, b)
    assert msg.startswith(
        f"models differ (1 leaf); the first:\nat w: 1 of 2 entries differ ({name} array of shape (2,)"
    )
    assert msg.endswith("largest absolute difference 1, largest relative difference 0.5 (rtol=1e-07, atol=0).")
    big = {"w": _narrow(backend, name, [0.25, 16.0])}
    assert "largest absolute difference 15, largest relative difference 3" in _message(a, big)


@pytest.mark.parametrize("name", NARROW)
def test_narrow_float_nan_and_inf(backend: Backend, name: str) -> None:
    nan = {"w": _narrow(backend, name, [math.nan, 1.0])}
    assert fk.allclose(nan, {"w": _narrow(backend, name, [math.nan, 1.0])}) is False
    assert fk.allclose(nan, {"w": _narrow(backend, name, [math.nan, 1.0])}, equal_nan=True) is True
    assert fk.allclose(nan, {"w": _narrow(backend, name, [1.0, 1.0])}, equal_nan=True) is False
    top = 448.0 if name == "float8_e4m3fn" else math.inf  # e4m3fn has no infinity
    hi = {"w": _narrow(backend, name, [top, -top])}
    assert fk.allclose(hi, {"w": _narrow(backend, name, [top, -top])}, rtol=0, atol=0) is True
    assert fk.allclose(hi, {"w": _narrow(backend, name, [-top, top])}) is False
    assert fk.allclose({"w": _narrow(backend, name, [1.0])}, {"w": _narrow(backend, name, [top])}) is False


@pytest.mark.parametrize("name", NARROW)
def test_narrow_floats_take_the_quick_path(backend: Backend, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = _compare._close_mask
    monkeypatch.setattr(_compare, "_close_mask", lambda *a: calls.append(a) or real(*a))
    a = {"w": _narrow(backend, name, [1.0, 2.0]), "b": _narrow(backend, name, [0.5])}
    assert fk.allclose(a, {"w": _narrow(backend, name, [1.0, 2.0]), "b": _narrow(backend, name, [0.5])}) is True
    assert calls == []  # decided by the quick test, reduced once
    assert fk.allclose(a, {"w": _narrow(backend, name, [1.0, 4.0]), "b": _narrow(backend, name, [0.5])}) is False
    assert len(calls) == 1


def _cross(lib: str, name: str, values: Any) -> Any:
    backend = {"numpy": Backend.NUMPY, "torch": Backend.TORCH, "jax": Backend.JAX}[lib]
    namespace_for(backend)  # skips when the library is not installed
    return _narrow(backend, name, values)


@pytest.mark.parametrize("name", NARROW)
@pytest.mark.parametrize(("la", "lb"), [("numpy", "torch"), ("torch", "numpy"), ("jax", "torch"), ("numpy", "jax")])
def test_narrow_floats_across_libraries(la: str, lb: str, name: str) -> None:
    a = {"w": _cross(la, name, [1.0, 1.0])}
    assert fk.allclose(a, {"w": _cross(lb, name, [1.0, 1.0])}, namespaces="any") is True
    fk.assert_allclose(a, {"w": _cross(lb, name, [1.0, 1.0])}, namespaces="any")
    b = {"w": _cross(lb, name, [1.0, 2.0])}
    assert fk.allclose(a, b, namespaces="any") is False
    assert fk.allclose(a, b, namespaces="any", atol=1.0, rtol=0) is True
    msg = _message(a, b, namespaces="any")
    assert f"at w: 1 of 2 entries differ ({name} array of shape (2,)" in msg
    assert "largest absolute difference 1, largest relative difference 0.5" in msg
    with pytest.raises(fk.PolicyError, match="namespaces='any'"):
        fk.allclose(a, b)


def test_narrow_dtypes_must_still_match_by_name() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("ml_dtypes")
    a = {"w": _narrow(Backend.NUMPY, "bfloat16", [1.0])}
    assert fk.allclose(a, {"w": torch.ones(1, dtype=torch.float16)}, namespaces="any") is False
    assert "dtype bfloat16 in `a` vs float16 in `b`" in _message(
        a, {"w": torch.ones(1, dtype=torch.float16)}, namespaces="any"
    )
    assert fk.allclose(a, {"w": torch.ones(1, dtype=torch.float32)}, namespaces="any") is False


# --------------------------------------------------------------------------- integers

_INT_CASES = [  # (dtype, a, b, |a - b|) with a difference that overflows the dtype
    ("int8", 100, -100, 200),
    ("int16", 30000, -30000, 60000),
    ("int32", 2**30, -(2**30), 2**31),
    ("int64", 2**62, -(2**62), 2**63),
]


@pytest.mark.parametrize(("dt", "x", "y", "d"), _INT_CASES)
def test_integer_differences_that_overflow_their_dtype(xp: Any, dt: str, x: int, y: int, d: int) -> None:
    dtype = getattr(xp, dt)
    a = {"n": xp.asarray([x, 1], dtype=dtype)}
    b = {"n": xp.asarray([y, 1], dtype=dtype)}
    assert fk.allclose(a, b, atol=float(d), rtol=0) is True  # as np.isclose on float64 values
    assert fk.allclose(a, b, atol=float(d) * 0.99, rtol=0) is False
    assert fk.allclose(a, b, atol=0, rtol=2.0) is True  # |a - b| = 2 |b|
    assert fk.allclose(a, b, atol=0, rtol=1.99) is False
    assert fk.allclose(b, a, atol=float(d), rtol=0) is True
    msg = _message(a, b)
    assert f"at n: 1 of 2 entries differ ({dt} array of shape (2,)" in msg
    assert f"largest absolute difference {float(d):.6g}, largest relative difference 2 " in msg


@pytest.mark.parametrize("dt", ["int8", "uint8", "int16", "int32", "int64"])
def test_integers_follow_numpy_isclose_with_exact_differences(xp: Any, dt: str) -> None:
    """NumPy's isclose rule, |a - b| <= atol + rtol * |b|, with the difference exact: float64 holds
    integers exactly only below 2**53 (np.isclose calls 2**63 - 2 and 2**63 - 1 equal at zero
    tolerance; torch.allclose and functorkit do not)."""
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    vals = sorted(v for v in {lo, lo + 1, -7, 0, 3, hi - 1, hi} if lo <= v <= hi)
    xs = [v for v in vals for _ in vals]
    ys = [w for _ in vals for w in vals]
    hx, hy = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    a = {"n": xp.asarray(np.asarray(xs, dtype=dt), dtype=getattr(xp, dt))}
    b = {"n": xp.asarray(np.asarray(ys, dtype=dt), dtype=getattr(xp, dt))}
    for rtol, atol in [(0.0, 0.0), (0.0, 1.0), (0.0, 10.0), (0.5, 0.0), (1e-5, 1e-8), (0.0, 2.0**40)]:
        exact = np.asarray([abs(x - y) <= atol + rtol * abs(float(y)) for x, y in zip(xs, ys)])  # Python ints
        expect = np.isclose(hx, hy, rtol=rtol, atol=atol) & exact
        if dt != "int64":
            assert (expect == np.isclose(hx, hy, rtol=rtol, atol=atol)).all()  # (below 2**53: NumPy's own answer)
        n_bad = int(np.count_nonzero(~expect))
        assert fk.allclose(a, b, rtol=rtol, atol=atol) is (n_bad == 0)
        if n_bad:
            assert f"at n: {n_bad} of {len(xs)} entries differ" in _message(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("x", [2**62, -(2**62), 2**63 - 2, -(2**63)])
def test_signed_64_bit_integers_beyond_float64_precision_are_told_apart(xp: Any, x: int) -> None:
    dtype = xp.int64
    a, b = {"n": xp.asarray([x], dtype=dtype)}, {"n": xp.asarray([x + 1], dtype=dtype)}
    assert fk.allclose(a, b, rtol=0, atol=0) is False  # float64 rounds both to one value
    assert fk.allclose(a, b, rtol=0, atol=1) is True
    assert fk.allclose(a, a, rtol=0, atol=0) is True
    assert "largest absolute difference 1," in _message(a, b, rtol=0, atol=0)


def test_integers_across_libraries() -> None:
    torch = pytest.importorskip("torch")
    a = {"n": np.asarray([100, 0], dtype=np.int8), "m": np.asarray([2**62], dtype=np.int64)}
    b = {"n": torch.tensor([-100, 0], dtype=torch.int8), "m": torch.tensor([-(2**62)])}
    assert fk.allclose(a, b, namespaces="any", atol=1e19) is True
    assert fk.allclose(a, b, namespaces="any", atol=1000) is False
    assert "at m: 1 of 1 entries differ" in _message(a, b, namespaces="any", atol=1000)
    assert fk.allclose({"n": b["n"]}, {"n": a["n"]}, namespaces="any", atol=200) is True


def test_jax_integers_without_x64_are_compared_in_float32() -> None:
    jax = pytest.importorskip("jax")
    namespace_for(Backend.JAX)
    jnp = jax.numpy
    if not hasattr(jax, "enable_x64"):
        pytest.skip("this JAX has no enable_x64 context")
    with jax.enable_x64(False):  # no float64: no "float64 is not available" warning (an error here)
        a = {"n": jnp.asarray([100, 2**30], dtype=jnp.int32)}
        b = {"n": jnp.asarray([-100, -(2**30)], dtype=jnp.int32)}
        assert fk.allclose(a, b, atol=2.0**31, rtol=0) is True
        assert fk.allclose(a, b, atol=2.0**30, rtol=0) is False
        assert "largest absolute difference 2.14748e+09, largest relative difference 2 " in _message(a, b)
        c = {"w": jnp.asarray([1.0, 2.0], dtype=jnp.bfloat16)}
        assert fk.allclose(c, {"w": jnp.asarray([1.0, 1.0], dtype=jnp.bfloat16)}, atol=1.0, rtol=0) is True


# ------------------------------------------------------------------ non-numeric dtypes: exactly

# (NumPy's own dtypes: the libraries that hold them are NumPy and Dask)
_NON_NUMERIC = (Backend.NUMPY, Backend.NUMPY_READONLY, Backend.DASK)


class _Raises:
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison")

    __hash__ = object.__hash__


def _lib(backend: Backend, x: np.ndarray) -> Any:
    if backend is Backend.DASK:
        da = pytest.importorskip("dask.array")
        return da.from_array(x, chunks=2)
    out = x.copy()
    out.flags.writeable = backend is not Backend.NUMPY_READONLY
    return out


def _non_numeric(backend: Backend, **changes: Any) -> dict[str, Any]:
    host = {
        "vocab": np.array(["<pad>", "a", "b"]),
        "raw": np.array([b"x", b"yz"]),
        "when": np.array(["2020-01-01", "NaT", "2020-01-03"], dtype="datetime64[D]"),
        "span": np.array([1, 2], dtype="timedelta64[s]"),
        "obj": np.array([1, "x", None], dtype=object),
        "rec": np.array([(1, 2.0), (3, 4.0)], dtype=[("i", "<i4"), ("f", "<f8")]),
        "emb": np.ones((3, 2)),
    }
    host.update(changes)
    return {k: _lib(backend, v) for k, v in host.items()}


@pytest.mark.parametrize("backend", _NON_NUMERIC, ids=lambda b: b.value)
def test_non_numeric_arrays_are_compared_exactly(backend: Backend) -> None:
    a, b = _non_numeric(backend), _non_numeric(backend)
    assert not fk.allclose(a, b)  # NaT is unequal to NaT, as NaN to NaN
    with pytest.raises(AssertionError, match=r"models differ \(1 leaf\); the first:\nat when: 1 of 3 entries differ"):
        fk.assert_allclose(a, b)
    assert fk.allclose(a, b, equal_nan=True)
    assert fk.allclose(a, a, equal_nan=True)
    fk.assert_allclose(a, b, equal_nan=True)


@pytest.mark.parametrize("backend", _NON_NUMERIC, ids=lambda b: b.value)
@pytest.mark.parametrize(
    ("key", "value", "found"),
    [
        (
            "vocab",
            np.array(["<pad>", "a", "c"]),
            r"at vocab: 1 of 3 entries differ \(<U5 array of shape \(3,\), compared exactly",
        ),
        ("raw", np.array([b"x", b"yy"]), r"at raw: 1 of 2 entries differ \(\|S2 array"),
        ("when", np.array(["2020-01-01", "2020-01-02", "2020-01-03"], dtype="datetime64[D]"), r"at when: 1 of 3"),
        ("span", np.array([1, 3], dtype="timedelta64[s]"), r"at span: 1 of 2 entries differ"),
        ("obj", np.array([1, "y", None], dtype=object), r"at obj: 1 of 3 entries differ \(object array"),
        ("obj", np.array([1, "x", _Raises()], dtype=object), r"at obj: 1 of 3 entries differ"),  # its == raises
        ("rec", np.array([(1, 2.0), (3, 5.0)], dtype=[("i", "<i4"), ("f", "<f8")]), r"at rec: 1 of 2 entries"),
        ("vocab", np.array(["<pad>", "a", "bb"], dtype="<U6"), r"at vocab: dtype <U5 in `a` vs <U6 in `b`\."),
        (
            "rec",
            np.zeros(2, dtype=[("j", "<i4"), ("f", "<f8")]),
            r"at rec: dtype \[\('i', '<i4'\), \('f', '<f8'\)\] in",
        ),
        (
            "when",
            np.array([1, 2, 3], dtype="datetime64[s]"),
            r"at when: dtype datetime64\[D\] in `a` vs datetime64\[s\]",
        ),
        ("vocab", np.array([1.0, 2.0, 3.0]), r"at vocab: dtype <U5 in `a` vs float64 in `b`\."),
    ],
)
def test_a_non_numeric_difference_is_false_and_named(backend: Backend, key: str, value: Any, found: str) -> None:
    a, b = _non_numeric(backend), _non_numeric(backend, **{key: value})
    assert fk.allclose(a, b, equal_nan=True) is False  # never an exception
    with pytest.raises(AssertionError, match=r"models differ \(1 leaf\); the first:\n" + found):
        fk.assert_allclose(a, b, equal_nan=True, rtol=1.0, atol=1e9)  # no tolerance applies


def test_non_numeric_arrays_across_libraries_on_the_host() -> None:
    a, b = _non_numeric(Backend.NUMPY), _non_numeric(Backend.DASK)
    with pytest.raises(fk.PolicyError, match=r"at \w+: fk.allclose: a numpy array in `a` and a dask array"):
        fk.allclose(a, b, equal_nan=True)
    assert fk.allclose(a, b, equal_nan=True, namespaces="any")
    c = _non_numeric(Backend.DASK, vocab=np.array(["<pad>", "b", "b"]))
    with pytest.raises(AssertionError, match=r"at vocab: 1 of 3 entries differ"):
        fk.assert_allclose(a, c, equal_nan=True, namespaces="any")


def test_dask_arrays_of_unknown_shape_are_refused_naming_the_path() -> None:
    da = pytest.importorskip("dask.array")
    x = da.from_array(np.arange(6.0), chunks=2)
    a = {"enc": {"u": x[x > 2]}, "w": x}
    a2 = {"enc": {"u": x[x > 2]}, "w": x}  # the same values
    fix = r"fk\.{}: at enc\.u, the array of `a` has the unknown shape \(nan,\).*x\.compute_chunk_sizes\(\)"
    for other in (a, a2):  # was True for `a` itself, False ("(nan,) vs (nan,)") for `a2`
        with pytest.raises(fk.StructureError, match=fix.format("allclose")):
            fk.allclose(a, other)
        with pytest.raises(fk.StructureError, match=fix.format("assert_allclose")):
            fk.assert_allclose(a, other)
    known = {"enc": {"u": x[x > 2].compute_chunk_sizes()}, "w": x}
    with pytest.raises(fk.StructureError, match=r"at enc\.u, the array of `b` has the unknown shape"):
        fk.allclose(known, a)
    assert fk.allclose(known, {"enc": {"u": x[x > 2].compute_chunk_sizes()}, "w": x})


def test_key_order_is_named_with_both_orders(xp: Any) -> None:
    a = {"enc": {"layers": [{"w": xp.ones(2), "b": xp.zeros(2)}]}, "head": xp.ones(1)}
    b = {"enc": {"layers": [{"b": xp.zeros(2), "w": xp.ones(2)}]}, "head": xp.ones(1)}
    assert not fk.allclose(a, b)
    with pytest.raises(
        AssertionError,
        match=r"at enc\.layers\[0\]: the keys are in another order: \['w', 'b'\] in `a` vs \['b', 'w'\] in `b`",
    ):
        fk.assert_allclose(a, b)
