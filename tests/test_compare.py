"""fk.allclose, fk.assert_allclose and fk.all_finite (SPEC section 16), on every backend."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _compare

from conftest import Backend


def _f(xp: Any, v: Any) -> Any:
    return xp.asarray(v, dtype=xp.float64)


def _model(xp: Any, w: Any = (1.0, 2.0, 3.0)) -> dict[str, Any]:
    return {
        "w": _f(xp, [list(w), [4.0, 5.0, 6.0]]),
        "b": _f(xp, [0.5]),
        "n": xp.asarray([3, 4], dtype=xp.int64),
        "act": "tanh",
    }


def _message(a: Any, b: Any, **kw: Any) -> str:
    with pytest.raises(AssertionError) as info:
        fk.assert_allclose(a, b, **kw)
    return str(info.value)


def test_equal_and_close_models(xp: Any) -> None:
    a = _model(xp)
    assert fk.allclose(a, _model(xp)) is True
    fk.assert_allclose(a, _model(xp))
    near = _model(xp, (1.0, 2.0 + 1e-9, 3.0))
    assert fk.allclose(a, near) is True
    assert fk.allclose(a, near, rtol=0, atol=0) is False
    fk.assert_allclose(a, near)  # rtol=1e-7, atol=0 by default
    assert "at w: 1 of 6 entries differ" in _message(a, near, rtol=1e-12)


def test_values_beyond_tolerance_name_the_first_path_and_the_count(xp: Any) -> None:
    a = _model(xp)
    b = _model(xp, (1.0, 2.5, 3.0))
    b["b"] = _f(xp, [0.75])
    assert fk.allclose(a, b) is False
    msg = _message(a, b)
    assert msg.startswith("models differ (2 leaves); the first:\nat w: 1 of 6 entries differ")
    assert "largest absolute difference 0.5, largest relative difference 0.2" in msg
    assert fk.allclose(a, b, atol=0.6) is True
    assert fk.allclose(a, b, rtol=0.34, atol=0) is True


def test_a_different_structure_is_false_and_named(xp: Any) -> None:
    a = _model(xp)
    b = dict(_model(xp))
    del b["b"]
    assert fk.allclose(a, b) is False
    assert "dict keys" in _message(a, b) or "b" in _message(a, b)
    c = _model(xp)
    c["act"] = "relu"
    assert fk.allclose(a, c) is False
    assert "at act: 'tanh' in `a` vs 'relu' in `b`" in _message(a, c)


def test_ties_must_match(xp: Any) -> None:
    w = _f(xp, [1.0, 2.0])
    tied = {"a": w, "b": w}
    untied = {"a": _f(xp, [1.0, 2.0]), "b": _f(xp, [1.0, 2.0])}
    assert fk.allclose(tied, {"a": w, "b": w}) is True
    assert fk.allclose(tied, untied) is False
    assert "ties differ" in _message(tied, untied)


def test_shapes_never_broadcast_and_dtypes_must_match(xp: Any) -> None:
    a = {"w": _f(xp, [1.0, 1.0, 1.0])}
    assert fk.allclose(a, {"w": _f(xp, [1.0])}) is False
    assert fk.allclose(a, {"w": _f(xp, 1.0)}) is False
    assert "shape (3,) in `a` vs (1,) in `b`" in _message(a, {"w": _f(xp, [1.0])})
    b = {"w": xp.asarray([1.0, 1.0, 1.0], dtype=xp.float32)}
    assert fk.allclose(a, b) is False
    assert "dtype float64 in `a` vs float32 in `b`" in _message(a, b)


def test_nan_and_inf(xp: Any) -> None:
    nan, inf = math.nan, math.inf
    assert fk.allclose({"w": _f(xp, [nan])}, {"w": _f(xp, [nan])}) is False
    assert fk.allclose({"w": _f(xp, [nan, 1.0])}, {"w": _f(xp, [nan, 1.0])}, equal_nan=True) is True
    assert fk.allclose({"w": _f(xp, [inf, -inf])}, {"w": _f(xp, [inf, -inf])}) is True
    assert fk.allclose({"w": _f(xp, [inf])}, {"w": _f(xp, [-inf])}) is False
    # |1 - inf| <= atol + rtol * inf holds, but a finite value is not close to an infinity
    assert fk.allclose({"w": _f(xp, [1.0])}, {"w": _f(xp, [inf])}) is False
    assert fk.allclose({"w": _f(xp, [inf])}, {"w": _f(xp, [1.0])}) is False
    assert fk.allclose({"s": nan}, {"s": nan}) is False
    assert fk.allclose({"s": nan}, {"s": nan}, equal_nan=True) is True


def test_integer_and_bool_arrays_are_compared(xp: Any) -> None:
    a = {"n": xp.asarray([0, 7], dtype=xp.uint8), "m": xp.asarray([True, False])}
    assert fk.allclose(a, {"n": xp.asarray([0, 7], dtype=xp.uint8), "m": xp.asarray([True, False])}) is True
    # no unsigned wrap-around: |0 - 255| is 255, not 1
    b = {"n": xp.asarray([255, 7], dtype=xp.uint8), "m": xp.asarray([True, False])}
    assert fk.allclose(a, b, atol=1) is False
    assert fk.allclose(a, b, atol=255) is True
    c = {"n": xp.asarray([0, 7], dtype=xp.uint8), "m": xp.asarray([True, True])}
    assert fk.allclose(a, c, atol=10) is False
    big = xp.asarray([2**62], dtype=xp.int64)
    small = xp.asarray([-(2**62) - 5], dtype=xp.int64)  # the difference overflows int64
    assert fk.allclose({"n": big}, {"n": small}, atol=1) is False


def test_only_differing_leaves_take_the_exact_check(xp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real = _compare._close_mask
    monkeypatch.setattr(_compare, "_close_mask", lambda *a: calls.append(a) or real(*a))
    a = _model(xp)
    assert fk.allclose(a, _model(xp)) is True
    assert calls == []  # the quick, reduced-once test decided
    assert fk.allclose(a, _model(xp, (1.0, 9.0, 3.0))) is False
    assert len(calls) == 1


def test_arguments_are_checked() -> None:
    a = {"w": np.ones(2)}
    with pytest.raises(TypeError, match="rtol"):
        fk.allclose(a, a, rtol="1")
    with pytest.raises(ValueError, match="atol"):
        fk.allclose(a, a, atol=-1.0)
    with pytest.raises(ValueError, match="namespaces"):
        fk.allclose(a, a, namespaces="all")
    with pytest.raises(TypeError, match="equal_nan"):
        fk.allclose(a, a, equal_nan=1)


def test_mixed_namespaces_only_when_asked() -> None:
    torch = pytest.importorskip("torch")
    a = {"w": np.array([1.0, 2.0]), "b": np.array([3.0])}
    b = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64), "b": torch.tensor([3.0], dtype=torch.float64)}
    with pytest.raises(fk.PolicyError, match="namespaces='any'"):
        fk.allclose(a, b)
    with pytest.raises(fk.PolicyError, match="at w"):
        fk.assert_allclose(a, b)
    assert fk.allclose(a, b, namespaces="any") is True
    b["w"] = torch.tensor([1.0, 2.5], dtype=torch.float64)
    assert fk.allclose(a, b, namespaces="any") is False
    assert "at w: 1 of 2 entries differ" in _message(a, b, namespaces="any")
    b["w"] = torch.tensor([1.0, 2.0])  # float32: the dtype names differ
    assert fk.allclose(a, b, namespaces="any") is False


def test_array_api_strict_devices() -> None:
    s = pytest.importorskip("array_api_strict")
    d1, d2 = s.Device("device1"), s.Device("device2")
    f64 = s.float64
    a = {"w": s.asarray([1.0, 2.0], device=d1, dtype=f64)}
    assert fk.allclose(a, {"w": s.asarray([1.0, 2.0], device=d1, dtype=f64)}) is True
    assert fk.allclose(a, {"w": s.asarray([1.0, 3.0], device=d1, dtype=f64)}) is False
    other = {"w": s.asarray([1.0, 2.0], device=d2, dtype=f64)}
    with pytest.raises(fk.PolicyError, match="device"):
        fk.allclose(a, other)
    assert fk.allclose(a, other, namespaces="any") is True
    assert bool(fk.all_finite(a)) is True
    assert fk.all_finite(a).device == d1


def test_dask_is_computed_once() -> None:
    dask = pytest.importorskip("dask")
    import dask.array as da
    from dask.callbacks import Callback

    starts: list[int] = []

    class Count(Callback):  # type: ignore[misc]
        def _start(self, dsk: Any) -> None:
            starts.append(1)

    a = {f"w{i}": da.ones((4, 4), chunks=2) for i in range(5)}
    b = {f"w{i}": da.ones((4, 4), chunks=2) for i in range(5)}
    with Count():
        assert fk.allclose(a, b) is True
    assert len(starts) == 1
    assert dask is not None


def test_modules_and_trainable_flags() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    other = fk.copy(net)
    assert fk.allclose(net, other) is True
    with torch.no_grad():
        other[1].running_mean += 1.0  # a buffer: compared too
    assert "at [1].running_mean: 4 of 4 entries differ" in _message(net, other)
    frozen = fk.copy(net)
    frozen[0].bias.requires_grad_(False)
    assert fk.allclose(net, frozen) is False
    assert "trainable in `a` but frozen in `b`" in _message(net, frozen)
    evaluated = fk.copy(net).eval()
    assert fk.allclose(net, evaluated) is False
    assert "static (aux) data" in _message(net, evaluated)


# --------------------------------------------------------------------------- all_finite


def test_all_finite(xp: Any, backend: Backend) -> None:
    m = _model(xp)
    out = fk.all_finite(m)
    assert out.shape == ()
    assert bool(out) is True
    assert fk.leaves({"r": out})[0] is out
    if backend is not Backend.NUMPY_READONLY:
        assert type(out) is type(m["w"])
    m["b"] = _f(xp, [math.inf])
    assert bool(fk.all_finite(m)) is False
    m["b"] = _f(xp, [math.nan])
    assert bool(fk.all_finite(m)) is False


def test_all_finite_looks_at_parameters_unless_told() -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        net[1].running_var[0] = math.inf  # a buffer
    assert bool(fk.all_finite(net)) is True
    assert bool(fk.all_finite(net, trainable_only=False)) is False
    assert fk.all_finite(net).dtype == torch.bool


def test_all_finite_without_parameters_is_a_numpy_true() -> None:
    out = fk.all_finite({"step": 3, "n": np.arange(3)})
    assert type(out) is np.ndarray
    assert out.shape == ()
    assert out.dtype == np.bool_
    assert bool(out)


def test_all_finite_refuses_mixed_namespaces() -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(fk.PolicyError):
        fk.all_finite({"a": np.ones(2), "b": torch.ones(2)})


def test_all_finite_under_jax_jit() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    m = {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}
    f = jax.jit(fk.all_finite)
    assert bool(f(m)) is True
    assert bool(f({"w": jnp.ones((2, 3)), "b": jnp.asarray([0.0, jnp.nan, 1.0])})) is False


def test_torch_parameters_and_meta_tensors() -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(3, 2)
    assert fk.allclose(net, fk.copy(net)) is True  # parameters that require grad
    assert "at weight:" in _message(net, fk.fmap(lambda t: t + 1, net))
    meta = {"w": torch.ones(2, device="meta")}
    with pytest.raises(TypeError, match="meta"):
        fk.allclose(meta, {"w": torch.ones(2, device="meta")})


def test_unknown_holders_are_refused_not_compared(xp: Any) -> None:
    # SPEC 12: the arrays inside an object no registry knows would be compared by `==` (identity)
    class Holder:
        def __init__(self, w: Any) -> None:
            self.w = w

    a = {"h": Holder(xp.ones(2)), "b": xp.zeros(1)}
    b = {"h": Holder(xp.ones(2)), "b": xp.zeros(1)}
    for fn in (fk.allclose, fk.assert_allclose):
        with pytest.raises(fk.StructureError, match=r"at h: a \S*Holder holds arrays.*fk\.register_leaf\(\S*Holder\)"):
            fn(a, b)
        with pytest.raises(fk.StructureError, match=r"at h: a \S*Holder holds arrays"):
            fn({"h": 1, "b": xp.zeros(1)}, b)  # the second model's holder too
    fk.register_leaf(Holder)  # a constant on purpose: compared with ==, as every other non-array leaf
    assert not fk.allclose(a, b)
    assert fk.allclose(a, a)
