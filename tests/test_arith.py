"""Model arithmetic: add, sub, scale, lincomb, lerp, mean, dot, norm, normalize, filter_normalize, copy."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import array_api_compat

import functorkit as fk

from conftest import Backend, to_numpy
from helpers import Layer, zoo

# --------------------------------------------------------------------------- registered nodes of our own


class Wrap:
    """A structured wrapper (like fk.Transpose): its child is its storage array; `factor` is static."""

    def __init__(self, a: Any, factor: float = 2.0) -> None:
        self.a, self.factor = a, factor


class Partial:
    """A node with a trainable child `w` and a non-trainable float child `stats`."""

    def __init__(self, w: Any, stats: Any) -> None:
        self.w, self.stats = w, stats


fk.register(Wrap, children=lambda x: ({"a": x.a}, x.factor), rebuild=lambda f, ch: Wrap(ch["a"], f), replace=True)
fk.register(
    Partial,
    children=lambda x: ({"w": x.w, "stats": x.stats}, None),
    rebuild=lambda aux, ch: Partial(ch["w"], ch["stats"]),
    trainable=lambda x: ["w"],
    replace=True,
)

# --------------------------------------------------------------------------- helpers


def model(xp: Any, seed: int, dtype: str = "float64") -> dict[str, Any]:
    """A model: dataclass layers, a registered wrapper tied to a top-level array, a partly trainable
    node, an integer array and non-array constants."""
    rng = np.random.default_rng(seed)
    dt = getattr(xp, dtype)

    def arr(*shape: int) -> Any:
        return xp.asarray(rng.standard_normal(shape), dtype=dt)

    tied = arr(2, 3)
    return {
        "layers": [Layer(arr(3, 2), arr(3), name="l0"), Layer(arr(2, 2, 2), arr(2), name="l1")],
        "tie_a": tied,
        "wrapped": Wrap(tied, factor=3.0),
        "part": Partial(arr(2), arr(2)),
        "steps": xp.asarray([seed, 7], dtype=xp.int64),
        "name": "mlp",
        "lr": 0.1,
    }


PARAM_PATHS = ["layers[0].weight", "layers[0].bias", "layers[1].weight", "layers[1].bias", "tie_a", "part.w"]


def values(tree: Any) -> dict[str, np.ndarray]:
    """{path: NumPy copy} of every distinct array leaf."""
    return {str(p): to_numpy(x) for p, x in fk.leaves_with_path(tree) if array_api_compat.is_array_api_obj(x)}


def flat_params(tree: Any) -> np.ndarray:
    v = values(tree)
    return np.concatenate([v[p].ravel() for p in PARAM_PATHS])


def arrays(tree: Any) -> list[Any]:
    return [x for x in fk.leaves(tree) if array_api_compat.is_array_api_obj(x)]


def shares(a: Any, b: Any) -> bool:
    mod = type(a).__module__.split(".")[0]
    if mod != type(b).__module__.split(".")[0]:
        return False
    if mod == "numpy":
        return bool(np.shares_memory(a, b))
    if mod == "array_api_strict":
        return bool(np.shares_memory(a._array, b._array))
    if mod == "torch":
        if a.device.type == "meta" or a.numel() == 0 or b.numel() == 0:
            return a is b
        sa, sb = a.untyped_storage(), b.untyped_storage()
        return bool(sa.data_ptr() == sb.data_ptr())
    return a is b  # immutable backends: only identity can alias


def assert_fresh(out: Any, *inputs: Any) -> None:
    """No array of `out` shares memory with (or is) an array of any input."""
    for y in arrays(out):
        for t in inputs:
            for x in arrays(t):
                assert y is not x
                assert not shares(y, x)


def check_structure(out: Any, m0: dict[str, Any]) -> None:
    assert isinstance(out["layers"][0], Layer)
    assert out["layers"][1].name == "l1"
    assert type(out["wrapped"]) is Wrap
    assert out["wrapped"].factor == 3.0
    assert out["wrapped"].a is out["tie_a"]  # the tie through a registered node survives
    assert type(out["part"]) is Partial
    assert out["name"] is m0["name"]
    assert out["lr"] == 0.1


def check_constants(out: Any, m0: dict[str, Any]) -> None:
    """Constants come from the first model: arrays copied (equal, not shared), others shared."""
    np.testing.assert_array_equal(to_numpy(out["part"].stats), to_numpy(m0["part"].stats))
    np.testing.assert_array_equal(to_numpy(out["steps"]), to_numpy(m0["steps"]))
    assert out["steps"].dtype == m0["steps"].dtype
    assert out["part"].stats is not m0["part"].stats
    assert not shares(out["part"].stats, m0["part"].stats)


# --------------------------------------------------------------------------- the elementwise operations

TOL = {"rtol": 1e-12, "atol": 1e-12}

# name -> (number of models, call, NumPy reference on one parameter)
OPS: dict[str, tuple[int, Any, Any]] = {
    "add": (2, lambda m: fk.add(m[0], m[1]), lambda a, b: a + b),
    "sub": (2, lambda m: fk.sub(m[0], m[1]), lambda a, b: a - b),
    "scale": (1, lambda m: fk.scale(-1.5, m[0]), lambda a: -1.5 * a),
    "lincomb": (3, lambda m: fk.lincomb([0.5, -2, 3.0], m), lambda a, b, c: 0.5 * a - 2 * b + 3.0 * c),
    "lincomb_one": (1, lambda m: fk.lincomb([1], m), lambda a: a),
    "lerp_low": (2, lambda m: fk.lerp(m[0], m[1], 0.3), lambda a, b: a + 0.3 * (b - a)),
    "lerp_high": (2, lambda m: fk.lerp(m[0], m[1], 0.8), lambda a, b: a + 0.8 * (b - a)),
    "lerp_extrapolate": (2, lambda m: fk.lerp(m[0], m[1], -1.5), lambda a, b: a - 1.5 * (b - a)),
    "mean": (3, lambda m: fk.mean(m), lambda a, b, c: (a + b + c) / 3),
    "mean_one": (1, lambda m: fk.mean(m), lambda a: a),
}


@pytest.mark.parametrize("op", list(OPS))
def test_elementwise(xp: Any, op: str) -> None:
    n, call, ref = OPS[op]
    ms = [model(xp, seed) for seed in range(n)]
    before = [values(m) for m in ms]
    out = call(ms)
    check_structure(out, ms[0])
    check_constants(out, ms[0])
    got = values(out)
    for p in PARAM_PATHS:
        np.testing.assert_allclose(got[p], ref(*(b[p] for b in before)), **TOL)
    assert_fresh(out, *ms)
    for m, b in zip(ms, before, strict=True):  # inputs untouched
        after = values(m)
        for p in b:
            np.testing.assert_array_equal(after[p], b[p])


@pytest.mark.parametrize("op", list(OPS))
def test_float32_stays_float32(xp: Any, op: str) -> None:
    n, call, ref = OPS[op]
    ms = [model(xp, seed, "float32") for seed in range(n)]
    out = call(ms)
    got = values(out)
    for p in PARAM_PATHS:
        assert got[p].dtype == np.float32, p
        np.testing.assert_allclose(got[p], ref(*(values(m)[p] for m in ms)), rtol=1e-5, atol=1e-5)


def test_exact_endpoints_never_alias(xp: Any) -> None:
    a, b = model(xp, 0), model(xp, 1)
    va, vb = values(a), values(b)
    for out, want in [
        (fk.lerp(a, b, 0), va),
        (fk.lerp(a, b, 0.0), va),
        (fk.lerp(a, b, 1), vb),
        (fk.scale(1, a), va),
        (fk.lincomb([1.0, 0.0], [a, b]), va),
        (fk.mean([a]), va),
    ]:
        got = values(out)
        for p in PARAM_PATHS:
            np.testing.assert_array_equal(got[p], want[p])
        assert_fresh(out, a, b)


def test_numpy_scalars_are_weak(xp: Any) -> None:
    m = model(xp, 0, "float32")
    out = fk.lincomb([np.float64(0.5), np.float32(2.0)], [m, m])
    assert values(out)["tie_a"].dtype == np.float32
    assert values(fk.scale(np.longdouble(0.5), m))["tie_a"].dtype == np.float32
    assert values(fk.scale(np.int64(3), m))["tie_a"].dtype == np.float32
    out = fk.lerp(m, m, np.float64(0.25))
    assert values(out)["part.w"].dtype == np.float32
    np.testing.assert_allclose(values(out)["part.w"], values(m)["part.w"], rtol=1e-6)


def test_zero_d_array_coefficients(xp: Any) -> None:
    m32 = model(xp, 0, "float32")
    c = xp.asarray(0.5, dtype=xp.float32)
    out = fk.scale(c, m32)
    np.testing.assert_allclose(values(out)["tie_a"], 0.5 * values(m32)["tie_a"], rtol=1e-6)
    assert values(out)["tie_a"].dtype == np.float32
    out = fk.lincomb([xp.asarray(1.0, dtype=xp.float32), c], [m32, m32])
    np.testing.assert_allclose(values(out)["part.w"], 1.5 * values(m32)["part.w"], rtol=1e-6)
    # SPEC 12: a 0-d array of the parameter's kind is weak too: cast to the parameter's dtype
    out = fk.scale(xp.asarray(0.5, dtype=xp.float64), m32)
    assert values(out)["tie_a"].dtype == np.float32
    np.testing.assert_allclose(values(out)["tie_a"], 0.5 * values(m32)["tie_a"], rtol=1e-6)
    with pytest.raises(fk.PolicyError, match=r"layers\[0\]\.weight.*int64.*not a floating"):
        fk.scale(xp.asarray(2, dtype=xp.int64), m32)
    with pytest.raises(ValueError, match="0-d"):
        fk.scale(xp.asarray([0.5, 1.0], dtype=xp.float32), m32)


def test_bad_coefficients(xp: Any) -> None:
    m = model(xp, 0)
    with pytest.raises(fk.PolicyError, match=r"at layers\[0\]\.weight.*complex"):
        fk.scale(1j, m)
    with pytest.raises(TypeError, match="bool"):
        fk.scale(True, m)
    with pytest.raises(TypeError, match="Python number"):
        fk.scale("2", m)
    with pytest.raises(TypeError, match="real"):
        fk.lerp(m, m, 0.5j)
    with pytest.raises(ValueError, match="one coefficient per model"):
        fk.lincomb([1.0], [m, m])
    with pytest.raises(ValueError, match="at least one"):
        fk.lincomb([], [])
    with pytest.raises(ValueError, match="at least one"):
        fk.mean([])


def test_complex_parameters(xp: Any) -> None:
    a = {"w": xp.asarray([1 + 2j, 3 - 1j], dtype=xp.complex128), "r": xp.asarray([1.0], dtype=xp.float64)}
    b = {"w": xp.asarray([2 - 1j, 1j], dtype=xp.complex128), "r": xp.asarray([2.0], dtype=xp.float64)}
    out = fk.scale(2j, {"w": a["w"]})
    np.testing.assert_allclose(to_numpy(out["w"]), 2j * to_numpy(a["w"]))
    out = fk.lincomb([1j, 2.0], [{"w": a["w"]}, {"w": b["w"]}])
    np.testing.assert_allclose(to_numpy(out["w"]), 1j * to_numpy(a["w"]) + 2 * to_numpy(b["w"]))
    d = fk.dot(a, b)  # conjugates the first argument, like numpy.vdot
    want = np.vdot(to_numpy(a["w"]), to_numpy(b["w"])) + 2.0
    assert complex(d) == pytest.approx(want)
    assert float(fk.norm(a)) == pytest.approx(math.sqrt(1 + 4 + 9 + 1 + 1))
    n = fk.normalize(a)
    assert to_numpy(n["w"]).dtype == np.complex128
    assert to_numpy(n["r"]).dtype == np.float64
    assert float(fk.norm(n)) == pytest.approx(1.0)
    with pytest.raises(fk.PolicyError, match=r"at r: .*complex"):
        fk.scale(1j, a)


# --------------------------------------------------------------------------- checks between models


def test_structure_mismatch(xp: Any) -> None:
    a = model(xp, 0)
    b = model(xp, 1)
    del b["lr"]
    with pytest.raises(fk.StructureError, match="dict keys") as e:
        fk.add(a, b)
    assert "`b` differs from `a` here" in str(e.value)
    b = model(xp, 1)
    b["layers"][1] = (b["layers"][1].weight, b["layers"][1].bias)
    with pytest.raises(fk.StructureError, match=r"layers\[1\]"):
        fk.lincomb([1, 2], [a, b])


def test_shape_dtype_leaf_mismatch(xp: Any) -> None:
    a = model(xp, 0)
    b = model(xp, 1)
    b["layers"][1].bias = xp.asarray([1.0, 2.0, 3.0], dtype=xp.float64)
    with pytest.raises(fk.StructureError, match=r"at layers\[1\]\.bias: .*shape \(2,\) .* \(3,\)"):
        fk.sub(a, b)
    b = model(xp, 1)
    b["part"].w = xp.asarray([1.0, 2.0], dtype=xp.float32)
    with pytest.raises(fk.PolicyError, match=r"at part\.w: .*float64.*float32"):
        fk.mean([a, a, b])
    with pytest.raises(fk.PolicyError, match=r"at part\.w: "):
        fk.dot(a, b)
    b = model(xp, 1)
    b["tie_a"] = 3.0  # a Python float where `a` has a parameter
    b["wrapped"] = Wrap(xp.asarray(np.zeros((2, 3))), factor=3.0)
    with pytest.raises(fk.StructureError, match=r"at tie_a: .*float"):
        fk.lerp(a, b, 0.5)


def test_namespace_mismatch() -> None:
    torch = pytest.importorskip("torch")
    a = {"w": np.ones(2)}
    b = {"w": torch.ones(2, dtype=torch.float64)}
    with pytest.raises(fk.PolicyError, match=r"at w: .*namespace"):
        fk.add(a, b)
    with pytest.raises(fk.PolicyError, match=r"at w: .*namespace"):
        fk.scale(torch.tensor(2.0, dtype=torch.float64), a)
    mixed = {"a": np.ones(2), "b": torch.ones(2)}
    with pytest.raises(fk.PolicyError, match="at a and b: "):
        fk.norm(mixed)
    out = fk.add(mixed, mixed)  # elementwise work is per leaf: mixed namespaces are fine
    assert isinstance(out["a"], np.ndarray)
    assert isinstance(out["b"], torch.Tensor)


# --------------------------------------------------------------------------- reductions


ORDS = [2, 1, 3, math.inf, -math.inf, 0, 0.5, -1]


@pytest.mark.parametrize("ord", ORDS, ids=str)
def test_norm_matches_numpy(xp: Any, ord: float) -> None:
    m = model(xp, 3)
    r = fk.norm(m, ord=ord)
    assert array_api_compat.array_namespace(r) is array_api_compat.array_namespace(m["tie_a"])
    assert r.ndim == 0
    v = flat_params(m)  # the tie counts once; `part.stats` is not trainable; `steps` is an int constant
    assert float(r) == pytest.approx(float(np.linalg.norm(v, ord=ord)), rel=1e-12)


def test_norm_counts_ties_once_and_uses_abs(xp: Any) -> None:
    w = xp.asarray([-3.0, 0.0], dtype=xp.float64)
    v = xp.asarray([-4.0], dtype=xp.float64)
    m = {"a": w, "b": w, "c": [v, Wrap(w)]}
    assert float(fk.norm(m)) == pytest.approx(5.0)
    assert float(fk.norm(m, ord=1)) == pytest.approx(7.0)
    assert float(fk.norm(m, ord=3)) == pytest.approx((27 + 64) ** (1 / 3))
    assert float(fk.norm(m, ord=0)) == pytest.approx(2.0)
    assert float(fk.norm(m, ord=-math.inf)) == pytest.approx(0.0)
    assert float(fk.dot(m, m)) == pytest.approx(25.0)


def test_dot_matches_numpy(xp: Any) -> None:
    a, b = model(xp, 1), model(xp, 2)
    r = fk.dot(a, b)
    assert r.ndim == 0
    assert array_api_compat.array_namespace(r) is array_api_compat.array_namespace(a["tie_a"])
    assert float(r) == pytest.approx(float(np.dot(flat_params(a), flat_params(b))), rel=1e-12)


def test_reductions_need_parameters(xp: Any) -> None:
    with pytest.raises(ValueError, match="no parameters"):
        fk.norm({"steps": xp.asarray([1, 2]), "name": "x"})
    only_constants = Partial(xp.asarray([1, 2]), xp.asarray([1.0]))  # int `w`, non-trainable float `stats`
    with pytest.raises(ValueError, match="no parameters"):
        fk.dot(only_constants, only_constants)
    with pytest.raises(TypeError, match="ord"):
        fk.norm(model(xp, 0), ord="fro")
    with pytest.raises(ValueError, match="NaN"):
        fk.norm(model(xp, 0), ord=math.nan)


def test_normalize(xp: Any) -> None:
    m = model(xp, 4, "float32")
    out = fk.normalize(m)
    check_structure(out, m)
    check_constants(out, m)
    assert float(fk.norm(out)) == pytest.approx(1.0, rel=1e-5)
    got = values(out)
    for p in PARAM_PATHS:
        assert got[p].dtype == np.float32
    out1 = fk.normalize(m, ord=1)
    assert float(fk.norm(out1, ord=1)) == pytest.approx(1.0, rel=1e-5)
    assert_fresh(out, m)


def test_device_is_kept(xp: Any, device: Any, backend: Backend) -> None:
    if backend.value in ("numpy", "numpy_readonly", "dask"):
        pytest.skip("a single device")
    rng = np.random.default_rng(0)
    a = {"w": xp.asarray(rng.standard_normal((3, 2)), device=device), "b": xp.asarray([1.0, 2.0], device=device)}
    b = fk.fmap(lambda x: x * 2, a)
    dev = array_api_compat.device(a["w"])
    for out in [fk.add(a, b), fk.lincomb([1.0, 0.5], [a, b]), fk.lerp(a, b, 0.7), fk.mean([a, b]),
                fk.normalize(a), fk.filter_normalize(a, b), fk.copy(a)]:
        assert array_api_compat.device(out["w"]) == dev
        assert array_api_compat.device(out["b"]) == dev
    assert array_api_compat.device(fk.dot(a, b)) == dev
    assert array_api_compat.device(fk.norm(a, ord=1)) == dev
    if backend.value != "torch":  # meta tensors hold no values
        assert float(fk.dot(a, b)) == pytest.approx(2 * float(np.sum(to_numpy(a["w"]) ** 2)) + 10.0)


# --------------------------------------------------------------------------- filter normalisation


def test_filter_normalize(xp: Any) -> None:
    rng = np.random.default_rng(5)
    d_np = {"conv": rng.standard_normal((4, 3, 2)), "lin": rng.standard_normal((3, 5)), "bias": rng.standard_normal(3)}
    r_np = {k: rng.standard_normal(v.shape) * 10 for k, v in d_np.items()}
    d_np["lin"][1] = 0.0  # a zero filter stays zero (no NaN, no warning)
    d = {k: xp.asarray(v) for k, v in d_np.items()} | {"steps": xp.asarray([1, 2]), "tag": "dir"}
    r = {k: xp.asarray(v) for k, v in r_np.items()} | {"steps": xp.asarray([3, 4]), "tag": "ref"}
    out = fk.filter_normalize(d, r)
    got = values(out)
    for k in ("conv", "lin"):
        axes = tuple(range(1, d_np[k].ndim))
        want_norms = np.linalg.norm(r_np[k].reshape(r_np[k].shape[0], -1), axis=1)
        got_norms = np.linalg.norm(got[k].reshape(got[k].shape[0], -1), axis=1)
        zero = np.linalg.norm(d_np[k].reshape(d_np[k].shape[0], -1), axis=1) == 0
        np.testing.assert_allclose(got_norms[~zero], want_norms[~zero], rtol=1e-12)
        np.testing.assert_array_equal(got[k][zero], 0.0)
        # each filter is the direction's filter times a positive number
        k_i = got_norms / np.where(zero, 1, np.linalg.norm(d_np[k], axis=axes).reshape(-1))
        np.testing.assert_allclose(got[k], d_np[k] * k_i.reshape((-1,) + (1,) * len(axes)), rtol=1e-12)
    np.testing.assert_array_equal(got["bias"], np.zeros(3))
    assert out["tag"] == "dir"
    np.testing.assert_array_equal(got["steps"], [1, 2])  # constants from the direction
    assert_fresh(out, d, r)
    for k, v in values(d).items():  # the direction is untouched
        if k in d_np:
            np.testing.assert_array_equal(v, d_np[k])
    keep = values(fk.filter_normalize(d, r, one_d="keep"))
    np.testing.assert_array_equal(keep["bias"], d_np["bias"])
    norm1d = values(fk.filter_normalize(d, r, one_d="normalize"))
    assert np.linalg.norm(norm1d["bias"]) == pytest.approx(np.linalg.norm(r_np["bias"]))
    unit = norm1d["bias"] / np.linalg.norm(norm1d["bias"])
    np.testing.assert_allclose(unit, d_np["bias"] / np.linalg.norm(d_np["bias"]))


@pytest.mark.parametrize("ord", [1, 3, math.inf])
def test_filter_normalize_odd_orders_use_abs(xp: Any, ord: float) -> None:
    d_np = np.array([[-1.0, -2.0, 2.0], [-3.0, 1.0, -1.0]])
    r_np = np.array([[2.0, -2.0, 1.0], [0.5, -4.0, 1.0]])
    out = to_numpy(fk.filter_normalize({"w": xp.asarray(d_np)}, {"w": xp.asarray(r_np)}, ord=ord)["w"])
    dn = np.linalg.norm(d_np, ord=ord, axis=1, keepdims=True)
    rn = np.linalg.norm(r_np, ord=ord, axis=1, keepdims=True)
    np.testing.assert_allclose(out, d_np * rn / dn, rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(out, ord=ord, axis=1), rn.ravel(), rtol=1e-12)


def test_filter_normalize_axis_and_errors(xp: Any) -> None:
    rng = np.random.default_rng(6)
    d_np, r_np = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    out = to_numpy(fk.filter_normalize({"k": xp.asarray(d_np)}, {"k": xp.asarray(r_np)}, axis=-1)["k"])
    np.testing.assert_allclose(np.linalg.norm(out, axis=0), np.linalg.norm(r_np, axis=0), rtol=1e-12)
    with pytest.raises(ValueError, match="one_d"):
        fk.filter_normalize({"k": xp.asarray(d_np)}, {"k": xp.asarray(r_np)}, one_d="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"at k: .*axis=2"):
        fk.filter_normalize({"k": xp.asarray(d_np)}, {"k": xp.asarray(r_np)}, axis=2)
    with pytest.raises(fk.StructureError, match=r"at k: .*shape"):
        fk.filter_normalize({"k": xp.asarray(d_np)}, {"k": xp.asarray(r_np[:2])})


# --------------------------------------------------------------------------- copy


@pytest.mark.parametrize("name", list(zoo(np)))
def test_copy_zoo(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    out = fk.copy(tree)
    assert type(out) is type(tree)
    assert fk.fmapstructure(lambda x: to_numpy(x).tolist() if array_api_compat.is_array_api_obj(x) else x, out) == (
        fk.fmapstructure(lambda x: to_numpy(x).tolist() if array_api_compat.is_array_api_obj(x) else x, tree)
    )
    assert_fresh(out, tree)
    if name == "shared_leaf":
        assert out["a"] is out["b"][0]
    if name == "shared_subtree":
        assert out["enc"] is out["dec"]
    if name == "scalars":
        assert all(out[k] is tree[k] for k in tree)


def test_copy_model(xp: Any, backend: Backend) -> None:
    m = model(xp, 0)
    out = fk.copy(m)
    check_structure(out, m)
    assert out["tie_a"] is out["wrapped"].a
    assert_fresh(out, m)
    for p, v in values(m).items():
        np.testing.assert_array_equal(values(out)[p], v)
    if backend.value == "numpy_readonly":
        assert out["tie_a"].flags.writeable  # an independent copy is writeable


def test_depth_10000(xp: Any) -> None:
    def deep(v: float) -> Any:
        t: Any = xp.asarray([v, 2 * v], dtype=xp.float64)
        for _ in range(10_000):
            t = {"x": t}
        return t

    a, b = deep(1.0), deep(3.0)
    out = fk.lincomb([1.0, 2.0], [a, b])
    np.testing.assert_allclose(to_numpy(fk.leaves(out)[0]), [7.0, 14.0])
    assert float(fk.norm(fk.sub(b, a))) == pytest.approx(math.sqrt(4 + 16))
    assert float(fk.dot(a, b)) == pytest.approx(15.0)
    np.testing.assert_array_equal(to_numpy(fk.leaves(fk.copy(a))[0]), [1.0, 2.0])


# --------------------------------------------------------------------------- torch specifics


def _net(torch: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    net[2].bias.requires_grad_(False)  # a frozen parameter: a constant
    with torch.no_grad():
        net[1].running_mean.uniform_()
    net[1].num_batches_tracked += seed + 1
    return net


def test_torch_modules() -> None:
    torch = pytest.importorskip("torch")
    m1, m2 = _net(torch, 1), _net(torch, 2)
    sd1 = {k: v.clone() for k, v in m1.state_dict().items()}
    out = fk.lincomb([0.5, 0.5], [m1, m2])
    assert type(out) is torch.nn.Sequential
    assert type(out[1]) is torch.nn.BatchNorm1d
    torch.testing.assert_close(out[0].weight, 0.5 * (m1[0].weight + m2[0].weight))
    torch.testing.assert_close(out[1].running_mean, m1[1].running_mean)
    assert not shares(out[1].running_mean, m1[1].running_mean)
    assert int(out[1].num_batches_tracked) == 2
    assert isinstance(out[2].bias, torch.nn.Parameter)
    assert not out[2].bias.requires_grad
    torch.testing.assert_close(out[2].bias, m1[2].bias)
    for k, v in m1.state_dict().items():
        torch.testing.assert_close(v, sd1[k])
    params = [m1[0].weight, m1[0].bias, m1[1].weight, m1[1].bias, m1[2].weight]  # trainable only
    want = torch.cat([p.detach().reshape(-1) for p in params])
    torch.testing.assert_close(fk.norm(m1), want.norm())
    torch.testing.assert_close(fk.norm(m1, ord=1), want.norm(p=1))
    x = torch.randn(5, 4)
    m1.eval()
    c = fk.copy(m1)
    assert type(c) is torch.nn.Sequential
    assert all(type(p) is torch.nn.Parameter for p in c.parameters())
    assert [p.requires_grad for p in c.parameters()] == [p.requires_grad for p in m1.parameters()]
    torch.testing.assert_close(c(x), m1(x))
    with torch.no_grad():
        c[0].weight.add_(1.0)
    torch.testing.assert_close(m1[0].weight, sd1["0.weight"])


@pytest.mark.parametrize("op", [*OPS, "normalize", "filter_normalize"])
def test_torch_module_every_operation(op: str) -> None:
    torch = pytest.importorskip("torch")
    trainable = ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"]
    if op == "normalize":
        n, call = 1, lambda m: fk.normalize(m[0])
        ref = None
    elif op == "filter_normalize":
        n, call = 2, lambda m: fk.filter_normalize(m[0], m[1])
        ref = None
    else:
        n, call, ref = OPS[op]
    ms = [_net(torch, s) for s in range(n)]
    sds = [{k: v.detach().numpy().copy() for k, v in m.state_dict().items()} for m in ms]
    out = call(ms)
    assert type(out) is torch.nn.Sequential
    assert [type(c) for c in out] == [type(c) for c in ms[0]]
    got = {k: v.detach().numpy() for k, v in out.state_dict().items()}
    assert got.keys() == sds[0].keys()
    if op == "normalize":
        total = math.sqrt(sum(float(np.sum(sds[0][k].astype(np.float64) ** 2)) for k in trainable))
        want = {k: sds[0][k] / total for k in trainable}
    elif op == "filter_normalize":
        want = {k: np.zeros_like(sds[0][k]) for k in trainable if sds[0][k].ndim == 1}
        for k in ("0.weight", "2.weight"):
            d, r = sds[0][k], sds[1][k]
            want[k] = d * (np.linalg.norm(r, axis=1, keepdims=True) / np.linalg.norm(d, axis=1, keepdims=True))
    else:
        want = {k: ref(*(sd[k] for sd in sds)) for k in trainable}
    for k in trainable:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert got[k].dtype == np.float32
    for k in ("1.running_mean", "1.running_var", "1.num_batches_tracked", "2.bias"):  # constants: models[0]
        np.testing.assert_array_equal(got[k], sds[0][k])
    for m, sd in zip(ms, sds, strict=True):
        for k, v in m.state_dict().items():
            np.testing.assert_array_equal(v.detach().numpy(), sd[k])


def test_torch_autograd_and_transforms() -> None:
    torch = pytest.importorskip("torch")
    w = torch.tensor([3.0, -4.0], requires_grad=True)
    fk.norm({"w": w}).backward()
    torch.testing.assert_close(w.grad, torch.tensor([0.6, -0.8]))
    a = {"w": torch.tensor([1.0, 2.0])}
    b = {"w": torch.tensor([10.0, 20.0])}
    c = torch.tensor(0.5, requires_grad=True)
    fk.lincomb([1.0, c], [a, b])["w"].sum().backward()  # differentiable in a 0-d coefficient
    torch.testing.assert_close(c.grad, torch.tensor(30.0))
    batched = torch.arange(6.0).reshape(3, 2)  # vmap over `b` only: the in-place path must not be taken
    got = torch.func.vmap(lambda bw: fk.lincomb([1.0, 2.0, 1.0], [a, {"w": bw}, a])["w"])(batched)
    torch.testing.assert_close(got, 2 * a["w"] + 2 * batched)
    got = torch.func.vmap(lambda bw: fk.mean([a, {"w": bw}, a])["w"])(batched)
    torch.testing.assert_close(got, (2 * a["w"] + batched) / 3)
    g = torch.func.grad(lambda bw: fk.dot(a, {"w": bw}))(b["w"])
    torch.testing.assert_close(g, a["w"])
