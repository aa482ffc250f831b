"""The merge methods' NumPy fast paths (session 13): `_pertensor.select` (``where(m, v, +0.0)`` by
masking the float's bits) and `_pertensor.UINT32_HASH` (DARE's mask hashed in place on uint32
words) give the same bits as the namespace code they replace, special values included (signed
zeros, infinities, NaN, negative weights), and a merge of fk.open-style Dask models takes them:
each test below fails when a fast path silently stops being taken or changes a bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _merge, _pertensor
from functorkit._keypath import KeyPath

da = pytest.importorskip("dask.array")


def _bits(a: Any) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(-1).view(np.dtype(f"u{a.dtype.itemsize}"))


def _special(dt: Any, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.standard_normal(n).astype(dt)
    v[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan]
    v[6:12] = v[12:18]  # equal magnitudes (ties at a threshold)
    return v


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_select_is_where_bit_for_bit_and_masks_the_bits(dt: Any) -> None:
    v = _special(dt, 4000, 0).reshape(40, 100)
    m = np.random.default_rng(1).random(v.shape) < 0.5
    ref = np.where(m, v, dt(0.0))
    got = _pertensor.select(np, m, v)
    assert got.dtype == v.dtype
    assert got.shape == v.shape
    np.testing.assert_array_equal(_bits(got), _bits(ref))
    assert got.base is not None
    assert got.base.dtype.kind == "u"
    strided = v[:, ::3]  # not contiguous: the same bits
    np.testing.assert_array_equal(
        _bits(_pertensor.select(np, m[:, ::3], strided)), _bits(np.where(m[:, ::3], strided, dt(0.0)))
    )
    v0 = v.copy()
    _pertensor.select(np, m, v)
    np.testing.assert_array_equal(_bits(v), _bits(v0))  # the input is not written


def test_select_falls_back_to_where_when_off_and_for_other_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    v = _special(np.float32, 64, 2)
    m = np.arange(64) % 3 == 0
    ref = np.where(m, v, np.float32(0.0))
    monkeypatch.setattr(_pertensor, "BIT_SELECT", False)
    off = _pertensor.select(np, m, v)
    assert off.base is None or off.base.dtype.kind != "u"  # where's own result
    np.testing.assert_array_equal(_bits(off), _bits(ref))
    monkeypatch.setattr(_pertensor, "BIT_SELECT", True)
    torch = pytest.importorskip("torch")
    from functorkit._xp import namespace

    tv, tm = torch.from_numpy(v.copy()), torch.from_numpy(m.copy())
    got = _pertensor.select(namespace(tv), tm, tv)
    assert isinstance(got, torch.Tensor)
    np.testing.assert_array_equal(_bits(got.numpy()), _bits(ref))


def _where_mix(base: np.ndarray, ms: list[np.ndarray], ws: list[float], keeps: list[np.ndarray]) -> np.ndarray:
    """TIES's consensus mean written with np.where, as the code before session 13 computed it."""
    wd = [np.where(k, m - base, np.float32(0)) * w for m, w, k in zip(ms, ws, keeps, strict=True)]
    total = wd[0]
    for d in wd[1:]:
        total = total + d
    plus = total >= 0
    mixed = div = None
    for d, w in zip(wd, ws, strict=True):
        agree = np.where(plus, d > 0, d < 0)
        kept = np.where(agree, d, np.float32(0))
        wm = np.where(agree, np.float32(w), np.float32(0))
        mixed = kept if mixed is None else mixed + kept
        div = wm if div is None else div + wm
    assert mixed is not None
    assert div is not None
    return base + mixed / np.where(div == 0, np.float32(1), div)


@pytest.mark.parametrize("fast", [True, False])
def test_ties_on_special_values_is_the_where_formula_bit_for_bit(monkeypatch: pytest.MonkeyPatch, fast: bool) -> None:
    monkeypatch.setattr(_pertensor, "BIT_SELECT", fast)
    base = _special(np.float32, 3000, 3)
    base[20:30] = 0.0
    ms = [base.copy(), base.copy(), base.copy()]
    for i, m in enumerate(ms):
        m[30:] = _special(np.float32, 2970, 10 + i)[:2970]
        m[:6] = [-0.0, 0.0, 1.0, -np.inf, 2.0, np.nan][i:] + [0.0, -0.0, 3.0][:i]
    ws = [0.7, -0.3, 1.0]
    with np.errstate(all="ignore"):
        got = fk.ties({"w": base}, [{"w": m} for m in ms], ws, density=1.0)["w"]
        ref = _where_mix(base, ms, ws, [np.ones(base.shape, bool)] * 3)
    np.testing.assert_array_equal(_bits(got), _bits(ref))


def _models(dt: Any) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(5)
    shapes = {"emb": (300, 64), "w": (257, 33), "b": (13,), "s": ()}
    base = {k: (0.02 * rng.standard_normal(s)).astype(dt) for k, s in shapes.items()}
    ms = [{k: (v + 0.01 * rng.standard_normal(v.shape)).astype(dt) for k, v in base.items()} for _ in range(2)]
    ms[0]["w"][:2, :3] = base["w"][:2, :3]  # zero deltas
    return base, ms


MERGES = {
    "ties": lambda b, ms: fk.ties(b, ms, [0.6, 0.4], density=0.3),
    "dare": lambda b, ms: fk.dare(b, ms, [0.5, 0.5], density=0.4, seed=3),
    "dare_ties": lambda b, ms: fk.dare(b, ms, [0.5, 0.5], density=0.4, seed=3, sign_consensus=True),
    "dare_inverse": lambda b, ms: fk.dare(b, ms, [0.5, -0.5], density=0.7, seed=9, rescale="inverse"),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("merge", list(MERGES))
def test_dask_merges_take_the_fast_paths_and_match_them_off(
    monkeypatch: pytest.MonkeyPatch, merge: str, dtype: str
) -> None:
    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.float32
    base, ms = _models(dt)

    def lazy(m: dict[str, np.ndarray]) -> dict[str, Any]:
        chunks = {k: (max(1, v.shape[0] // 4), *v.shape[1:]) if v.shape else () for k, v in m.items()}
        return {k: da.from_array(v, chunks=chunks[k]) for k, v in m.items()}

    taken = {"select": 0, "hash": 0}
    select, u32 = _pertensor.select, _pertensor._keep_block_u32

    def spy_select(xp: Any, m: Any, v: Any) -> Any:
        out = select(xp, m, v)
        taken["select"] += isinstance(out, np.ndarray) and out.base is not None and out.base.dtype.kind == "u"
        return out

    def spy_hash(*a: Any) -> Any:
        taken["hash"] += 1
        return u32(*a)

    monkeypatch.setattr(_merge, "select", spy_select)
    monkeypatch.setattr(_pertensor, "_keep_block_u32", spy_hash)
    on = {k: np.asarray(v) for k, v in MERGES[merge](lazy(base), [lazy(m) for m in ms]).items()}
    assert taken["select"] > 0, taken  # the bit select ran on the Dask blocks
    assert (taken["hash"] > 0) == merge.startswith("dare"), taken  # DARE's masks hashed on uint32 words
    monkeypatch.setattr(_pertensor, "BIT_SELECT", False)
    monkeypatch.setattr(_pertensor, "UINT32_HASH", False)
    taken.update(select=0, hash=0)
    off = {k: np.asarray(v) for k, v in MERGES[merge](lazy(base), [lazy(m) for m in ms]).items()}
    eager_off = MERGES[merge](base, ms)
    assert taken == {"select": 0, "hash": 0}, taken
    monkeypatch.setattr(_pertensor, "BIT_SELECT", True)
    eager_on = MERGES[merge](base, ms)  # eager NumPy models select by the bits too
    assert taken["select"] > 0, taken
    for k in base:
        assert on[k].dtype == off[k].dtype == eager_on[k].dtype == base[k].dtype, k
        np.testing.assert_array_equal(_bits(on[k]), _bits(off[k]), err_msg=k)
        np.testing.assert_array_equal(_bits(eager_on[k]), _bits(eager_off[k]), err_msg=k)


@pytest.mark.parametrize("thr", [0, 1, 12345, 1 << 23, (1 << 24) - 1, 1 << 24])
def test_uint32_hash_is_the_int32_hash_bit_for_bit(thr: int) -> None:
    shape = (70000, 3)  # more than one hash piece per block
    keys = _pertensor.mask_keys(7, 1, KeyPath.parse("model.layers[0].w"))
    x = np.zeros(shape, np.float32)
    for lo, hi in ((0, 70000), (33333, 69999), (5, 6), (7, 7)):  # an empty block too
        info = [{"array-location": [(lo, hi), (0, 3)]}]
        block = x[lo:hi]
        fast = _pertensor._keep_block(shape, keys, thr, block, block_info=info)
        idx = _pertensor.flat_index(np, shape, (hi - lo, 3), (lo, 0), None)
        ref = _pertensor._bits(np, idx, keys, thr)
        assert fast.dtype == np.bool_
        assert fast.shape == ref.shape
        np.testing.assert_array_equal(fast, ref)
