"""SPEC 12, "Arithmetic keeps dtypes": every arithmetic result's parameters have the first model's
dtypes, for every function, backend and dtype (ml_dtypes bfloat16/float8 on NumPy and Dask too);
coefficients are weak; complex into real and integer 0-d coefficients are refused."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import functorkit as fk

ml_dtypes = pytest.importorskip("ml_dtypes")


def _np(dt: Any) -> Callable[[np.ndarray], Any]:
    return lambda v: v.astype(dt)


def _dask(dt: Any) -> Callable[[np.ndarray], Any]:
    da = pytest.importorskip("dask.array")
    return lambda v: da.from_array(v.astype(dt), chunks=3)


def _torch(name: str) -> Callable[[np.ndarray], Any]:
    torch = pytest.importorskip("torch")
    return lambda v: torch.from_numpy(v).to(getattr(torch, name))


def _jax(name: str) -> Callable[[np.ndarray], Any]:
    jnp = pytest.importorskip("jax.numpy")
    return lambda v: jnp.asarray(v, dtype=getattr(jnp, name))


def _strict(name: str) -> Callable[[np.ndarray], Any]:
    xp = pytest.importorskip("array_api_strict")
    return lambda v: xp.asarray(v, dtype=getattr(xp, name))


_NP_DTYPES = ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "float32", "float64", "complex64"]


def _np_dtype(name: str) -> Any:
    return np.dtype(getattr(ml_dtypes, name, None) or getattr(np, name))


CASES = (
    [(f"numpy-{d}", "numpy", d) for d in _NP_DTYPES]
    + [(f"dask-{d}", "dask", d) for d in _NP_DTYPES]
    + [(f"torch-{d}", "torch", d) for d in ("float16", "bfloat16", "float32", "float64")]
    + [(f"jax-{d}", "jax", d) for d in ("float16", "bfloat16", "float32")]
    + [(f"strict-{d}", "strict", d) for d in ("float32", "float64")]
)


def _maker(backend: str, name: str) -> Callable[[np.ndarray], Any]:
    if backend == "numpy":
        return _np(_np_dtype(name))
    if backend == "dask":
        return _dask(_np_dtype(name))
    if backend == "torch":
        return _torch(name)
    if backend == "jax":
        return _jax(name)
    return _strict(name)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).rpartition(".")[2]


def _host(x: Any) -> np.ndarray:
    if hasattr(x, "compute"):
        x = x.compute()
    if type(x).__module__.startswith("torch"):
        return x.detach().float().numpy().astype(np.float64) if not x.is_complex() else x.numpy()
    if type(x).__module__.startswith("array_api_strict"):
        x = np.asarray(x._array)
    a = np.asarray(x)
    return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)


def _values(seed: int, complex_: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2.0, (4, 3))
    b = rng.uniform(0.5, 2.0, (3,))
    if complex_:
        w = w + 1j * rng.uniform(0.5, 2.0, (4, 3))
    return {"w": w, "b": b}


FUNCS: dict[str, Callable[[list[Any]], Any]] = {
    "add": lambda m: fk.add(m[0], m[1]),
    "sub": lambda m: fk.sub(m[0], m[1]),
    "scale": lambda m: fk.scale(0.3, m[0]),
    "scale_np_scalar": lambda m: fk.scale(np.float64(0.3), m[0]),
    "lincomb": lambda m: fk.lincomb([0.5, 0.3, 0.2], m),
    "mean": lambda m: fk.mean(m),
    "lerp_low": lambda m: fk.lerp(m[0], m[1], 0.25),
    "lerp_high": lambda m: fk.lerp(m[0], m[1], 0.75),
    "normalize": lambda m: fk.normalize(m[0]),
    "filter_normalize": lambda m: fk.filter_normalize(m[0], m[1]),
}


def _reference(fname: str, v: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The float64 (complex128) value of each function, computed by hand."""
    a, b, c = v
    if fname == "add":
        return {k: a[k] + b[k] for k in a}
    if fname == "sub":
        return {k: a[k] - b[k] for k in a}
    if fname.startswith("scale"):
        return {k: 0.3 * a[k] for k in a}
    if fname == "lincomb":
        return {k: 0.5 * a[k] + 0.3 * b[k] + 0.2 * c[k] for k in a}
    if fname == "mean":
        return {k: (a[k] + b[k] + c[k]) / 3 for k in a}
    if fname.startswith("lerp"):
        t = 0.25 if fname == "lerp_low" else 0.75
        return {k: a[k] + t * (b[k] - a[k]) for k in a}
    if fname == "normalize":
        n = math.sqrt(sum(float(np.sum(np.abs(x) ** 2)) for x in a.values()))
        return {k: a[k] / n for k in a}
    rn = np.linalg.norm(b["w"], axis=1, keepdims=True)
    dn = np.linalg.norm(a["w"], axis=1, keepdims=True)
    return {"w": a["w"] * rn / dn, "b": np.zeros_like(a["b"])}


def _tolerance(name: str) -> float:
    return {"float8_e4m3fn": 0.13, "float8_e5m2": 0.26, "bfloat16": 0.02, "float16": 2e-3, "float32": 1e-5}.get(
        name, 1e-6
    )


@pytest.mark.parametrize("fname", list(FUNCS))
@pytest.mark.parametrize(("backend", "name"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_every_function_keeps_the_dtype(fname: str, backend: str, name: str) -> None:
    make = _maker(backend, name)
    complex_ = name.startswith("complex")
    vals = [_values(s, complex_) for s in range(3)]
    # the values the dtype holds: the reference starts from them, so only the rounding is measured
    models = [{k: make(x) for k, x in v.items()} for v in vals]
    held = [{k: _host(x) for k, x in m.items()} for m in models]
    out = FUNCS[fname](models)
    ref = _reference(fname, held)
    for k in ("w", "b"):
        assert _dtype_name(out[k]) == _dtype_name(models[0][k]), (fname, k)
        assert type(out[k]) is type(models[0][k])
        got = _host(out[k])
        np.testing.assert_allclose(got, ref[k], rtol=_tolerance(name), atol=_tolerance(name))


@pytest.mark.parametrize(("backend", "name"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_dot_and_norm_keep_the_dtype_and_accumulate_in_float32(backend: str, name: str) -> None:
    """Decision (docs/arithmetic.md): a 0-d array of the parameters' (real) dtype, accumulated in
    float32 for float16/bfloat16/float8 and rounded once (a float8 running sum of 4096 squares of
    0.25 would stall far below 256)."""
    make = _maker(backend, name)
    v = np.full((64, 64), 0.25)
    m = {"w": make(v)}
    n = fk.norm(m)
    d = fk.dot(m, m)
    real = {"complex64": "float32"}.get(name, name)
    assert _dtype_name(n) == real
    assert _dtype_name(d) == _dtype_name(m["w"])
    assert float(_host(n)) == pytest.approx(16.0, rel=_tolerance(name))
    assert complex(_host(d)).real == pytest.approx(256.0, rel=_tolerance(name))


_ML_FLOATS = sorted(
    n
    for n in dir(ml_dtypes)
    if n.startswith(("float", "bfloat"))
    and isinstance(getattr(ml_dtypes, n), type)
    and np.dtype(getattr(ml_dtypes, n)).type.__module__.startswith("ml_dtypes")
)


@pytest.mark.parametrize("name", _ML_FLOATS)
def test_every_ml_dtypes_float_is_a_parameter(name: str) -> None:
    """Every floating dtype of ml_dtypes is a parameter, whatever NumPy kind it reports (bfloat16
    and most float8s say "V", float8_e5m2 says "f"): never a silent constant (SPEC 12)."""
    dt = np.dtype(getattr(ml_dtypes, name))
    m = {"w": np.array([1.0, 0.5], dt), "n": np.array([3], np.int64)}
    flat, re = fk.destructure(m)
    assert flat.shape == (2,)
    assert flat.dtype == dt
    assert re(flat)["n"] is m["n"]


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_reductions_over_mixed_dtypes_take_the_promoted_dtype_whatever_the_order(backend: str) -> None:
    """fk.dot/fk.norm of parameters of several dtypes: the dtype their values promote to, not the
    first parameter's (a float16 parameter before a complex one made the dot float16, dropping
    its imaginary part; a bfloat16 one before float32 rounded the total to bfloat16); bfloat16
    with float16 (no NumPy promotion) is float32, as torch promotes them, not a raw error."""
    makers = {name: _maker(backend, name) for name in ("float16", "bfloat16", "float32")}
    if backend == "numpy":
        makers["complex64"] = _np(np.dtype(np.complex64))
    else:
        torch = pytest.importorskip("torch")
        makers["complex64"] = torch.from_numpy

    def arr(name: str, v: list[Any]) -> Any:
        return makers[name](np.asarray(v, np.complex64 if name == "complex64" else np.float64))

    a = {"w": arr("float16", [1.0, 1.0]), "z": arr("complex64", [1j, 2j])}
    b = {"w": arr("float16", [1.0, 1.0]), "z": arr("complex64", [1.0, 1.0])}
    for order in (["w", "z"], ["z", "w"]):
        got = fk.dot({k: a[k] for k in order}, {k: b[k] for k in order})
        assert _dtype_name(got) == "complex64"
        assert complex(np.asarray(got).item() if backend == "numpy" else got.item()) == 2 - 3j
    w = [1000.123, 3.0001]
    w32 = np.float32(w).astype(np.float64)
    ref = 1 + float(np.dot(w32, w32))
    for m in (
        {"a": arr("bfloat16", [1.0]), "w": arr("float32", w)},
        {"w": arr("float32", w), "z": arr("bfloat16", [1.0])},
    ):
        d, n = fk.dot(m, m), fk.norm(m)
        assert _dtype_name(d) == "float32"
        assert _dtype_name(n) == "float32"
        np.testing.assert_allclose(float(_host(d)), ref, rtol=1e-6)
        np.testing.assert_allclose(float(_host(n)), math.sqrt(ref), rtol=1e-6)
    mixed = {"emb": arr("bfloat16", [1.0, 1.0, 1.0]), "head": arr("float16", [1.0, 1.0, 1.0])}
    n = fk.norm(mixed)
    assert _dtype_name(n) == "float32"
    np.testing.assert_allclose(float(_host(n)), math.sqrt(6.0), rtol=1e-6)
    out = fk.normalize(mixed)
    assert _dtype_name(out["emb"]) == "bfloat16"
    assert _dtype_name(out["head"]) == "float16"


def test_bf16_lincomb_then_add_no_longer_raises() -> None:
    bf = [{"w": np.ones(3, ml_dtypes.bfloat16)} for _ in range(3)]
    merged = fk.lincomb([0.5, 0.3, 0.2], bf)
    assert merged["w"].dtype == ml_dtypes.bfloat16
    out = fk.add(merged, bf[0])
    assert out["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(out["w"].astype(np.float32), np.full(3, 2.0, np.float32))


def test_narrow_numpy_dtypes_are_rounded_once_from_float32() -> None:
    """The rounding rule of docs/arithmetic.md: float32 compute, one rounding per element."""
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(1000).astype(ml_dtypes.bfloat16) for _ in range(3)]
    cs = [0.1, 0.7, -0.3]
    got = fk.lincomb(cs, [{"w": x} for x in xs])["w"]
    f = [x.astype(np.float32) for x in xs]
    want = (f[0] * np.float32(cs[0]) + f[1] * np.float32(cs[1]) + f[2] * np.float32(cs[2])).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_coefficient_rules() -> None:
    torch = pytest.importorskip("torch")
    m = {"w": np.ones(2, ml_dtypes.bfloat16)}
    # a float 0-d array of another width is weak: cast to the parameter's dtype
    assert fk.scale(np.asarray(0.5, np.float64), m)["w"].dtype == ml_dtypes.bfloat16
    assert fk.lerp(m, m, np.asarray(0.5, np.float32))["w"].dtype == ml_dtypes.bfloat16
    t = {"w": torch.ones(2, dtype=torch.bfloat16)}
    assert fk.scale(torch.tensor(0.5, dtype=torch.float64), t)["w"].dtype == torch.bfloat16
    with pytest.raises(fk.PolicyError, match=r"at w: .*int64.*not a floating"):
        fk.scale(np.asarray(2), m)
    with pytest.raises(fk.PolicyError, match=r"at w: .*complex"):
        fk.scale(np.asarray(1j, np.complex64), m)
    with pytest.raises(fk.PolicyError, match=r"at w: .*complex"):
        fk.lincomb([1.0, 2j], [t, t])
    # a real coefficient into a complex parameter is fine
    c = {"w": np.ones(2, np.complex64)}
    assert fk.scale(np.asarray(0.5, np.float64), c)["w"].dtype == np.complex64


def test_scalar_coefficients_of_every_kind_are_weak_numbers() -> None:
    """An ml_dtypes scalar (an element of a bfloat16 array, NumPy kind "V") is the number it holds,
    as a NumPy float scalar is (it was refused); a Python int beyond int64 is the float it stands
    for on every backend (torch raised a raw OverflowError, with out= after the first write); one
    beyond every float is a ValueError before anything is written."""
    torch = pytest.importorskip("torch")
    m = {"w": np.ones(2, ml_dtypes.bfloat16)}
    half = next(iter(np.array([0.5], ml_dtypes.bfloat16)))
    assert isinstance(half, np.generic)
    got = fk.scale(half, m)["w"]
    assert got.dtype == ml_dtypes.bfloat16
    assert got.astype(np.float32).tolist() == [0.5, 0.5]
    big = 2**70
    t0, t1 = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([1.0, 1.0])}
    torch.testing.assert_close(fk.scale(big, t0)["w"], torch.tensor([1.0, 2.0]) * float(big))
    dst = {"w": torch.tensor([7.0, 7.0])}
    fk.lincomb([3.0, big], [t0, t1], out=dst)
    torch.testing.assert_close(dst["w"], 3.0 * t0["w"] + float(big) * t1["w"])
    np.testing.assert_allclose(fk.scale(big, {"w": np.ones(2, np.float32)})["w"], [float(big)] * 2)
    dst = {"w": torch.tensor([7.0, 7.0])}
    with pytest.raises(ValueError, match=r"`coefficients\[1\]` is an int of 1101 bits, larger than any float"):
        fk.lincomb([3.0, 2**1100], [t0, t1], out=dst)
    assert dst["w"].tolist() == [7.0, 7.0]


def test_a_1d_array_of_coefficients_is_refused_with_a_fix_that_works() -> None:
    ms = [{"w": np.array([1.0])}, {"w": np.array([3.0])}]
    w = np.array([0.25, 0.75])
    with pytest.raises(TypeError, match=r"fix: pass its numbers as a list, fk\.lincomb\(list\(c\), models\)"):
        fk.lincomb(w, ms)
    assert fk.lincomb(list(w), ms)["w"].tolist() == [2.5]


@pytest.mark.parametrize("backend", ["numpy", "dask", "torch"])
@pytest.mark.parametrize(
    ("names", "want"),
    [
        (("float8_e4m3fn", "float32"), "float32"),
        (("bfloat16", "float8_e5m2"), "float32"),
        (("bfloat16", "float16"), "float32"),
        (("float8_e4m3fn", "float64"), "float64"),
    ],
)
def test_dtypes_without_a_promotion_flatten_and_reduce_in_the_narrow_ones_as_float32(
    backend: str, names: tuple[str, str], want: str
) -> None:
    """Dtypes the library cannot promote together (torch's float8 with anything, NumPy's ml_dtypes
    bfloat16 with float16 or float8): one rule for destructure and the reductions, the narrow
    dtypes taken as float32 (float8 with float64 is float64), never a raw promotion error."""
    if backend == "dask":
        pytest.importorskip("dask.array")
    # where the library has a promotion (ml_dtypes >= 0.7: bfloat16 with float8), it is the rule; the
    # narrow-as-float32 one only stands in where there is none
    with contextlib.suppress(TypeError):
        if backend != "torch":
            want = str(np.result_type(*(_np_dtype(n) for n in names)))
    vals = {"a": [0.5, -1.5, 2.0], "b": [0.25, 4.0]}
    m = {k: _maker(backend, n)(np.asarray(vals[k])) for k, n in zip(("a", "b"), names)}
    ref = float(np.sqrt(sum(float(np.dot(v, v)) for v in vals.values())))  # (exact in every dtype here)
    for policy in ("model", "flat"):
        flat, re = fk.destructure(m, policy=policy)
        assert _dtype_name(flat) == want
        np.testing.assert_array_equal(_host(flat), np.concatenate([vals["a"], vals["b"]]))
        back = re(flat)
        for k, n in zip(("a", "b"), names):
            assert _dtype_name(back[k]) == (n if policy == "model" else want)
            np.testing.assert_array_equal(_host(back[k]), vals[k])
    n = fk.norm(m)
    assert _dtype_name(n) == want
    np.testing.assert_allclose(float(_host(n)), ref, rtol=1e-6)
    assert _dtype_name(fk.dot(m, m)) == want


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_stack_of_dtypes_without_a_promotion_takes_the_same_rule(backend: str) -> None:
    pairs = [("bfloat16", "float16", "float32"), ("float8_e4m3fn", "float64", "float64")]
    for a, b, want in pairs:
        ms = [{"w": _maker(backend, n)(np.asarray([0.5, 2.0]))} for n in (a, b)]
        st = fk.stack(ms, policy="model")
        assert _dtype_name(st["w"]) == want
        np.testing.assert_array_equal(_host(st["w"]), [[0.5, 2.0], [0.5, 2.0]])
