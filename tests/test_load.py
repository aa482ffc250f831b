"""fk.load_into: in-place, all-or-nothing loading of one model's values into another."""

from __future__ import annotations

import itertools
import math
import os
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import array_api_compat

import functorkit as fk

from conftest import to_numpy
from helpers import Layer


class Wrap:
    """A structured wrapper node whose child is its storage array."""

    def __init__(self, a: Any, factor: float = 2.0) -> None:
        self.a, self.factor = a, factor


fk.register(Wrap, children=lambda x: ({"a": x.a}, x.factor), rebuild=lambda f, ch: Wrap(ch["a"], f), replace=True)

IMMUTABLE = ("jax", "dask", "numpy_readonly")


def maker(xp: Any, backend: Any) -> Any:
    """``mk(numpy_values, dtype=None)`` making a *writable* array of the backend (read-only NumPy: plain)."""

    def mk(v: Any, dtype: Any = None) -> Any:
        if backend.value == "numpy_readonly":
            return np.array(v, dtype=dtype)
        return xp.asarray(np.asarray(v), dtype=dtype)

    return mk


def plain(xp: Any) -> Any:
    """``mk`` for arrays of the backend as the xp fixture makes them (read-only on NUMPY_READONLY)."""

    def mk(v: Any, dtype: Any = None) -> Any:
        return xp.asarray(np.asarray(v), dtype=dtype)

    return mk


def need_mutable(backend: Any) -> None:
    if backend.value in ("jax", "dask"):
        pytest.skip("immutable arrays: load_into raises (test_immutable_dst_raises)")


def model(xp: Any, mk: Any, seed: int, dtype: Any = None) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    dt = dtype if dtype is not None else xp.float64
    tied = mk(rng.standard_normal((2, 3)), dt)
    return {
        "layers": [Layer(mk(rng.standard_normal((3, 2)), dt), mk(rng.standard_normal(3), dt), name=f"l{seed}")],
        "tied": tied,
        "wrapped": Wrap(tied, factor=float(seed)),
        "steps": mk(np.array([seed, 2 * seed]), xp.int64),
        "mask": mk(np.array([seed % 2 == 0, True])),
        "name": f"model{seed}",
    }


def values(tree: Any) -> dict[str, np.ndarray]:
    return {str(p): to_numpy(x) for p, x in fk.leaves_with_path(tree) if array_api_compat.is_array_api_obj(x)}


def ids(tree: Any) -> dict[str, int]:
    return {str(p): id(x) for p, x in fk.leaves_with_path(tree)}


def shares(a: Any, b: Any) -> bool:
    mod = type(a).__module__.split(".")[0]
    if mod != type(b).__module__.split(".")[0]:
        return False
    if mod == "numpy":
        return bool(np.shares_memory(a, b))
    if mod == "array_api_strict":
        return bool(np.shares_memory(a._array, b._array))
    if mod == "torch":
        if a.device.type == "meta":
            return a is b
        return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())
    return a is b


def assert_unchanged(tree: Any, before: dict[str, np.ndarray]) -> None:
    after = values(tree)
    assert after.keys() == before.keys()
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v)


# --------------------------------------------------------------------------- the basics


def test_load_into(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    dst = model(xp, mk, 0, xp.float32)
    src = model(xp, plain(xp), 1)  # read-only on NUMPY_READONLY: src is never written
    dst_ids, want = ids(dst), values(src)
    out = fk.load_into(dst, src)
    assert out is dst
    assert ids(dst) == dst_ids  # the same arrays, written in place
    got = values(dst)
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-6)  # float64 values in float32 arrays
    assert got["tied"].dtype == np.float32  # dst keeps its dtypes
    assert got["steps"].dtype == np.int64
    assert got["mask"].dtype == np.bool_
    assert dst["name"] == "model0"  # non-array leaves of dst are left as they are
    assert dst["layers"][0].name == "l0"
    assert dst["wrapped"].factor == 0.0
    assert dst["wrapped"].a is dst["tied"]
    for d in fk.leaves(dst):
        for s in fk.leaves(src):
            if array_api_compat.is_array_api_obj(d):
                assert not shares(d, s)


def test_dst_does_not_follow_src(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    dst, src = model(xp, mk, 0), model(xp, mk, 1)
    fk.load_into(dst, src)
    loaded = values(dst)
    for _p, s in fk.leaves_with_path(src):
        if array_api_compat.is_array_api_obj(s):
            s[...] = mk(np.zeros(tuple(s.shape)), s.dtype)  # mutate src after loading
    assert_unchanged(dst, loaded)
    assert not np.all(values(src)["tied"] == loaded["tied"])


def test_root_array_and_complex(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    d = mk(np.zeros(2, dtype=np.complex128))
    assert fk.load_into(d, xp.asarray([1.0, 2.0], dtype=xp.float64)) is d  # real into complex is fine
    np.testing.assert_array_equal(to_numpy(d), [1.0, 2.0])
    real = mk(np.zeros(2))
    with pytest.raises(fk.PolicyError, match=r"at <root>: .*complex"):
        fk.load_into(real, xp.asarray([1j, 2.0], dtype=xp.complex128))
    np.testing.assert_array_equal(to_numpy(real), [0.0, 0.0])


# --------------------------------------------------------------------------- all or nothing


def _break_last(xp: Any, mk: Any, src: dict[str, Any], how: str) -> str:
    """Spoil the last array leaf of `src` (walk order: `mask`) and return the error pattern expected."""
    if how == "shape":
        src["mask"] = xp.asarray([True, False, True])
        return r"at mask: shape \(2,\) in `dst` vs \(3,\)"
    if how == "complex":
        src["mask"] = xp.asarray([1j, 0j], dtype=xp.complex128)
        return r"at mask: `src` is complex"
    if how == "missing":
        src["mask"] = None
        return r"at mask: `dst` has a bool array"
    if how == "structure":
        src["zzz"] = 1.0
        return "dict keys"
    src["name"] = xp.asarray([1.0], dtype=xp.float64)  # "extra": an array where dst has a string
    return r"at name: `src` has a float64 array"


@pytest.mark.parametrize("how", ["shape", "complex", "missing", "structure", "extra"])
def test_all_or_nothing(xp: Any, backend: Any, how: str) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    dst, src = model(xp, mk, 0), model(xp, plain(xp), 1)
    src["name"] = "renamed"
    pattern = _break_last(xp, mk, src, how)
    before = values(dst)
    err = fk.PolicyError if how == "complex" else fk.StructureError
    with pytest.raises(err, match=pattern):
        fk.load_into(dst, src)
    assert_unchanged(dst, before)


def test_ties_in_dst(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    w = mk(np.zeros(3))
    dst = {"a": w, "b": [w], "c": mk(np.zeros(1))}
    with pytest.raises(fk.StructureError, match=r"at a and b\[0\]: .*tie"):
        fk.load_into(dst, {"a": xp.asarray([1.0, 2, 3]), "b": [xp.asarray([1.0, 2, 4])], "c": xp.asarray([5.0])})
    np.testing.assert_array_equal(to_numpy(w), np.zeros(3))
    np.testing.assert_array_equal(to_numpy(dst["c"]), [0.0])
    # equal values from two arrays, or the same array twice, are fine
    fk.load_into(dst, {"a": xp.asarray([1.0, 2, 3]), "b": [xp.asarray([1.0, 2, 3])], "c": xp.asarray([5.0])})
    np.testing.assert_array_equal(to_numpy(w), [1.0, 2, 3])
    s = xp.asarray([7.0, 8, math.nan])
    fk.load_into(dst, {"a": s, "b": [s], "c": xp.asarray([6.0])})
    np.testing.assert_array_equal(to_numpy(dst["b"][0]), [7.0, 8, math.nan])
    assert dst["a"] is dst["b"][0] is w


def test_src_ties_and_overlap_with_dst(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    a, b = mk(np.array([1.0, 2.0])), mk(np.array([3.0, 4.0]))
    dst = {"a": a, "b": b}
    fk.load_into(dst, {"a": b, "b": a})  # a swap: every value is read before any write
    np.testing.assert_array_equal(to_numpy(a), [3.0, 4.0])
    np.testing.assert_array_equal(to_numpy(b), [1.0, 2.0])
    s = xp.asarray([9.0, 9.5])
    fk.load_into(dst, {"a": s, "b": s})  # one src array into two dst arrays
    np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    fk.load_into(dst, dst)  # into itself: nothing changes
    np.testing.assert_array_equal(to_numpy(a), [9.0, 9.5])
    if backend.value in ("numpy", "numpy_readonly", "torch", "array_api_strict"):
        base = mk(np.arange(6.0))
        d = {"x": base[:4]}
        fk.load_into(d, {"x": base[2:]})  # src overlaps dst's memory: read first, then write
        np.testing.assert_array_equal(to_numpy(base), [2.0, 3.0, 4.0, 5.0, 4.0, 5.0])


def test_aliases_in_dst(xp: Any, backend: Any) -> None:
    if backend.value not in ("numpy", "numpy_readonly", "torch", "array_api_strict"):
        pytest.skip("views are only detectable on NumPy, torch and array-api-strict")
    mk = maker(xp, backend)
    base = mk(np.arange(6.0).reshape(2, 3))
    dst = {"a": base, "b": xp.permute_dims(base, (1, 0))}
    with pytest.raises(fk.StructureError, match=r"at a and b: .*share memory"):
        fk.load_into(dst, {"a": xp.zeros((2, 3), dtype=xp.float64), "b": xp.zeros((3, 2), dtype=xp.float64)})
    np.testing.assert_array_equal(to_numpy(base), np.arange(6.0).reshape(2, 3))
    flat = mk(np.zeros(6))
    src = {"even": xp.asarray([1.0, 2, 3]), "odd": xp.asarray([4.0, 5, 6])}
    fk.load_into({"even": flat[::2], "odd": flat[1::2]}, src)
    np.testing.assert_array_equal(to_numpy(flat), [1.0, 4, 2, 5, 3, 6])  # interleaved views are not aliases


def test_stride_zero_dst() -> None:
    d = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(3,), strides=(0,), writeable=True)
    with pytest.raises(fk.StructureError, match=r"at w: .*share one memory location"):
        fk.load_into({"w": d}, {"w": np.array([1.0, 2.0, 3.0])})
    torch = pytest.importorskip("torch")
    with pytest.raises(fk.StructureError, match=r"at w: .*share one memory location"):
        fk.load_into({"w": torch.zeros(1).expand(3)}, {"w": torch.ones(3)})


def test_immutable_dst_raises(xp: Any, backend: Any) -> None:
    if backend.value not in IMMUTABLE:
        pytest.skip("mutable arrays")
    dst = {"a": xp.asarray([0.0, 0.0]), "b": xp.asarray([1.0])}
    before = values(dst)
    with pytest.raises(TypeError, match=r"at a: .*in place"):
        fk.load_into(dst, {"a": xp.asarray([1.0, 2.0]), "b": xp.asarray([3.0])})
    assert_unchanged(dst, before)


def test_depth_10000(xp: Any, backend: Any) -> None:
    need_mutable(backend)
    mk = maker(xp, backend)
    leaf = mk(np.zeros(2))
    dst: Any = leaf
    src: Any = xp.asarray([1.0, 2.0])
    for _ in range(10_000):
        dst, src = {"x": dst}, {"x": src}
    fk.load_into(dst, src)
    np.testing.assert_array_equal(to_numpy(leaf), [1.0, 2.0])


# --------------------------------------------------------------------------- the seed's check


def test_grid_points_are_cartesian(xp: Any, backend: Any) -> None:
    """Load origin + a*d1 + b*d2 into one model for each grid point: distances are Cartesian.

    With aliased parameters (the bug this library was asked to avoid) every
    loaded grid point would move together and the distance between (0, 0) and
    (1, 1) would come out 2.83 instead of sqrt(2) for unit directions.
    """
    rng = np.random.default_rng(7)

    def params(v: np.ndarray) -> dict[str, Any]:
        return {"w": xp.asarray(v[:6].reshape(2, 3)), "b": xp.asarray(v[6:8]), "k": [xp.asarray(v[8:])]}

    n = 10
    origin = params(rng.standard_normal(n))
    d1 = fk.normalize(params(np.r_[rng.standard_normal(5), np.zeros(5)]))  # disjoint supports: orthogonal
    d2 = fk.normalize(params(np.r_[np.zeros(5), rng.standard_normal(5)]))
    assert float(fk.dot(d1, d2)) == 0.0
    grid = list(itertools.product([-1.0, 0.0, 1.0], [0.0, 1.0]))
    mutable = backend.value not in ("jax", "dask")
    target = fk.copy(params(np.zeros(n)))  # fk.copy makes writable arrays (also from read-only NumPy)
    snapshots = []
    for a, b in grid:
        point = fk.lincomb([1.0, a, b], [origin, d1, d2])
        if mutable:
            loaded = fk.load_into(target, point)
            assert loaded is target
        else:
            with pytest.raises(TypeError, match="in place"):
                fk.load_into(point, origin)
            loaded = point
        snapshots.append(np.concatenate([to_numpy(x).ravel() for x in fk.leaves(loaded)]))
    for (p, s), (q, t) in itertools.combinations(zip(grid, snapshots, strict=True), 2):
        assert np.linalg.norm(s - t) == pytest.approx(math.dist(p, q), rel=1e-12)
    diag = snapshots[grid.index((1.0, 1.0))] - snapshots[grid.index((0.0, 0.0))]
    assert np.linalg.norm(diag) == pytest.approx(math.sqrt(2))


# --------------------------------------------------------------------------- torch and mixed namespaces


def _net(torch: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    net[2].bias.requires_grad_(False)
    with torch.no_grad():
        net[1].running_var.uniform_(0.5, 2.0)
    net[1].num_batches_tracked += seed + 1
    return net


@pytest.mark.parametrize(
    "name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"]
)
def test_torch_narrow_floats_load_into_numpy(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch bfloat16/float8 tensor (NumPy has no such dtype: ``Tensor.numpy()`` refuses it) loads
    into a NumPy model through an ml_dtypes view of its bits: bit for bit into the same dtype,
    widened exactly into float32, from a strided tensor too. Without ml_dtypes, a PolicyError
    names the path and the fix (as before)."""
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    tdt = getattr(torch, name, None)
    if tdt is None or not hasattr(ml_dtypes, name):
        pytest.skip(f"torch or ml_dtypes has no {name}")
    ndt = np.dtype(getattr(ml_dtypes, name))
    src32 = torch.linspace(-3.0, 3.0, 24).reshape(4, 6)
    src = {"w": src32.to(tdt), "t": src32.to(tdt).T}  # a strided (transposed) view too
    want = {k: v.to(torch.float32).numpy() for k, v in src.items()}
    same = {"w": np.zeros((4, 6), ndt), "t": np.zeros((6, 4), ndt)}
    fk.load_into(same, src)
    for k in src:
        assert same[k].dtype == ndt
        bits = src[k].contiguous().view(torch.int16 if ndt.itemsize == 2 else torch.uint8).numpy()
        np.testing.assert_array_equal(same[k].view(bits.dtype), bits)  # the same bits
    wide = {"w": np.zeros((4, 6), np.float32), "t": np.zeros((6, 4), np.float32)}
    fk.load_into(wide, src)
    for k in src:
        np.testing.assert_array_equal(wide[k], want[k])
    from functorkit.adapters import torch as torch_adapter

    monkeypatch.setattr(torch_adapter, "_ml_dtype", lambda dtype: None)  # as without ml_dtypes
    with pytest.raises(fk.PolicyError, match=r"at w: fk.load_into cannot convert"):
        fk.load_into({"w": np.zeros((4, 6), np.float32)}, {"w": src["w"]})


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3"])
def test_numpy_narrow_floats_load_into_every_library(name: str) -> None:
    """A NumPy model of an ml_dtypes float (bfloat16, float8_*: NumPy kind "V" or "f") is a model
    like any other for fk.load_into: into NumPy of its dtype (bit for bit) and float32, into torch
    of the same dtype (bit for bit, where torch has it) and float32. It was refused as a
    "structured dtype" (NumPy's read check), and torch could not take its arrays (DLPack, asarray)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ndt = np.dtype(getattr(ml_dtypes, name))
    src = {"w": np.linspace(-3.0, 3.0, 24, dtype=np.float32).reshape(4, 6).astype(ndt)}
    src["t"] = src["w"].T  # a strided (transposed) view too
    wide = {k: v.astype(np.float32) for k, v in src.items()}  # exact: every value of ndt is a float32
    same = {k: np.zeros(v.shape, ndt) for k, v in src.items()}
    fk.load_into(same, src)
    for k in src:
        np.testing.assert_array_equal(same[k].view(np.uint8), np.ascontiguousarray(src[k]).view(np.uint8))
    f32 = {k: np.zeros(v.shape, np.float32) for k, v in src.items()}
    fk.load_into(f32, src)
    for k in src:
        np.testing.assert_array_equal(f32[k], wide[k])
    torch = pytest.importorskip("torch")
    tdt = getattr(torch, name, None)
    if tdt is not None:
        tsame = {k: torch.zeros(v.shape, dtype=tdt) for k, v in src.items()}
        fk.load_into(tsame, src)
        for k in src:
            bits = tsame[k].view(torch.int16 if ndt.itemsize == 2 else torch.uint8).numpy()
            np.testing.assert_array_equal(bits, np.ascontiguousarray(src[k]).view(bits.dtype))
    t32 = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in src.items()}
    fk.load_into(t32, src)
    for k in src:
        np.testing.assert_array_equal(t32[k].numpy(), wide[k])


def test_torch_module() -> None:
    torch = pytest.importorskip("torch")
    dst, src = _net(torch, 0), _net(torch, 1).double()
    named = [(n, id(p)) for n, p in dst.named_parameters()]
    flags = [p.requires_grad for p in dst.parameters()]
    fk.load_into(dst, src)
    assert [(n, id(p)) for n, p in dst.named_parameters()] == named  # still registered, same objects
    assert [p.requires_grad for p in dst.parameters()] == flags
    assert all(type(p) is torch.nn.Parameter for p in dst.parameters())
    for k, v in src.state_dict().items():
        d = dst.state_dict()[k]
        assert d.dtype == (torch.float32 if v.is_floating_point() else v.dtype)
        torch.testing.assert_close(d, v.to(d.dtype))
    assert int(dst[1].num_batches_tracked) == 2
    assert dst[0].weight.grad is None
    assert dst[0].weight.grad_fn is None
    x = torch.randn(5, 4, dtype=torch.float64)
    dst.eval()
    src.eval()
    torch.testing.assert_close(dst(x.float()), src(x).float(), rtol=1e-5, atol=1e-5)


def test_torch_meta() -> None:
    torch = pytest.importorskip("torch")
    dst = _net(torch, 0).to("meta")
    # real values into meta tensors: nothing can be stored, so it is an error (issue "Reliability")
    with pytest.raises(ValueError, match=r"at \[0\]\.weight: `dst` holds an array without storage"):
        fk.load_into(dst, _net(torch, 1))
    assert fk.load_into(dst, _net(torch, 1).to("meta")) is dst  # meta into meta: nothing to store, allowed
    assert dst[0].weight.device.type == "meta"
    real = _net(torch, 2)
    before = {k: v.clone() for k, v in real.state_dict().items()}
    with pytest.raises(ValueError, match=r"at \[0\]\.weight: .*meta"):
        fk.load_into(real, _net(torch, 3).to("meta"))
    for k, v in real.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_mixed_namespaces() -> None:
    torch = pytest.importorskip("torch")
    t = {"w": torch.zeros(2), "n": torch.zeros(1, dtype=torch.int64)}
    fk.load_into(t, {"w": np.array([1.5, 2.5]), "n": np.array([3])})
    torch.testing.assert_close(t["w"], torch.tensor([1.5, 2.5]))
    assert t["w"].dtype == torch.float32
    a = {"w": np.zeros(2), "n": np.zeros(1, dtype=np.int64)}
    fk.load_into(a, {"w": torch.tensor([1.0, 2.0], requires_grad=True), "n": torch.tensor([4])})
    np.testing.assert_array_equal(a["w"], [1.0, 2.0])
    assert a["n"][0] == 4
