"""fk.slerp, task_arithmetic, ties, dare, model_stock against references written from mergekit's
formulas (plain NumPy float64 loops here), on every backend, bfloat16 included."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, to_numpy

SHAPES = {"a": (4, 5), "b": (7,), "c": ()}


def _np_models(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{k: np.asarray(rng.standard_normal(s), dtype=np.float32) for k, s in SHAPES.items()} for _ in range(n)]


def _on(xp: Any, ms: list[dict[str, np.ndarray]]) -> list[dict[str, Any]]:
    return [{k: xp.asarray(v) for k, v in m.items()} for m in ms]


def _f64(ms: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [{k: np.asarray(v, dtype=np.float64) for k, v in m.items()} for m in ms]


# --------------------------------------------------------------------------- references (from the formulas)


def ref_slerp(v0: np.ndarray, v1: np.ndarray, t: float) -> np.ndarray:
    n0, n1 = np.linalg.norm(v0), np.linalg.norm(v1)
    u0 = v0 / n0 if n0 > 1e-8 else v0
    u1 = v1 / n1 if n1 > 1e-8 else v1
    dot = float(np.sum(u0 * u1))
    if abs(dot) > 0.9995:
        return (1 - t) * v0 + t * v1
    th = math.acos(dot)
    return math.sin(th - th * t) / math.sin(th) * v0 + math.sin(th * t) / math.sin(th) * v1


def ref_magnitude(d: np.ndarray, density: float) -> np.ndarray:
    if density >= 1:
        return d
    k = max(1, math.floor(density * d.size))
    flat = d.reshape(-1)
    keep = np.argsort(-np.abs(flat), kind="stable")[:k]
    out = np.zeros_like(flat)
    out[keep] = flat[keep]
    return out.reshape(d.shape)


def ref_consensus(wd: list[np.ndarray], ws: list[float], normalize: bool) -> np.ndarray:
    total = sum(wd)
    sign = np.where(total >= 0, 1.0, -1.0)
    masks = [np.sign(d) == sign for d in wd]
    mixed = sum(d * m for d, m in zip(wd, masks, strict=True))
    if normalize:
        div = sum(w * m for w, m in zip(ws, masks, strict=True))
        div = np.where(div == 0, 1.0, div)
        mixed = mixed / div
    return mixed


def ref_ties(b: np.ndarray, ms: list[np.ndarray], ws: list[float], density: float, normalize: bool) -> np.ndarray:
    wd = [w * ref_magnitude(m - b, density) for m, w in zip(ms, ws, strict=True)]
    return b + ref_consensus(wd, ws, normalize)


def _fmix(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def ref_mask(seed: int, i: int, path: str, n: int, density: float) -> np.ndarray:
    """The documented generator, element by element on Python ints."""
    import hashlib

    d = hashlib.blake2b(
        f"functorkit.dare\0{seed}\0{i}\0{path}".encode(), digest_size=8
    ).digest()  # path: the dotted key
    k0, k1 = int.from_bytes(d[:4], "little"), int.from_bytes(d[4:], "little")
    thr = round(density * 2**24)
    out = np.zeros(n, dtype=bool)
    for j in range(n):
        h = _fmix((j * 0x9E3779B1 + k0) & 0xFFFFFFFF)
        h = _fmix(h ^ k1)
        out[j] = (h >> 8) < thr
    return out


def ref_dare(
    b: np.ndarray,
    ms: list[np.ndarray],
    ws: list[float],
    density: float,
    seed: int,
    path: str,
    rescale: Any,
    consensus: bool,
) -> np.ndarray:
    wd = []
    for i, (m, w) in enumerate(zip(ms, ws, strict=True)):
        d = m - b
        mask = ref_mask(seed, i, path, max(d.size, 1), density).reshape(d.shape)
        kept = d * mask
        if rescale is True:
            before, after = np.abs(d).sum(), np.abs(kept).sum()
            if before >= 1e-7 and after >= 1e-7:
                kept = kept * (before / after)
        elif rescale == "inverse":
            kept = kept / density
        wd.append(w * kept)
    if consensus:
        return b + ref_consensus(wd, ws, False)
    return b + sum(wd)


def ref_stock(b: np.ndarray, ms: list[np.ndarray]) -> np.ndarray:
    offs = [(m - b).reshape(-1) for m in ms]
    cs = []
    for i in range(len(offs)):
        for j in range(i + 1, len(offs)):
            den = max(np.linalg.norm(offs[i]) * np.linalg.norm(offs[j]), 1e-6)
            cs.append(min(max(float(offs[i] @ offs[j]) / den, -1.0), 1.0))
    c = sum(cs) / len(cs)
    n = len(ms)
    t = n * c / (1 + (n - 1) * c) if 1 + (n - 1) * c != 0 else 0.0
    return t * (sum(ms) / n) + (1 - t) * b


def _check(out: dict[str, Any], ref: dict[str, np.ndarray], dtype: Any, rtol: float = 1e-5) -> None:
    for k, r in ref.items():
        got = to_numpy(out[k])
        assert got.shape == r.shape, k
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), r, rtol=rtol, atol=rtol, err_msg=k)


def _dtype_name(x: Any) -> str:
    return str(x.dtype).rpartition(".")[2]


# --------------------------------------------------------------------------- each method, every backend


def test_slerp_matches_reference(xp: Any) -> None:
    a, b = _np_models(2)
    t = 0.3
    out = fk.slerp(*_on(xp, [a, b]), t)
    A, B = _f64([a, b])
    _check(out, {k: ref_slerp(A[k], B[k], t) for k in SHAPES}, np.float32)
    assert all(_dtype_name(out[k]) == "float32" for k in SHAPES)


def test_slerp_parallel_uses_lerp(xp: Any) -> None:
    a = np.arange(1.0, 7.0, dtype=np.float32)
    b = 2 * a  # parallel: cos = 1 > 0.9995
    out = fk.slerp({"w": xp.asarray(a)}, {"w": xp.asarray(b)}, 0.25)
    np.testing.assert_allclose(to_numpy(out["w"]), 0.75 * a + 0.25 * b, rtol=1e-6)


def test_task_arithmetic_matches_reference(xp: Any) -> None:
    base, m1, m2 = _np_models(3)
    out = fk.task_arithmetic(*_on(xp, [base]), _on(xp, [m1, m2]), [0.7, -0.3], scale=0.5)
    B, M1, M2 = _f64([base, m1, m2])
    _check(out, {k: B[k] + 0.5 * (0.7 * (M1[k] - B[k]) - 0.3 * (M2[k] - B[k])) for k in SHAPES}, np.float32)


@pytest.mark.parametrize("normalize", [True, False])
def test_ties_matches_reference(xp: Any, normalize: bool) -> None:
    base, m1, m2, m3 = _np_models(4, seed=1)
    ws = [1.0, 0.5, 0.8]
    out = fk.ties(_on(xp, [base])[0], _on(xp, [m1, m2, m3]), ws, density=0.4, normalize=normalize)
    B, *M = _f64([base, m1, m2, m3])
    _check(out, {k: ref_ties(B[k], [m[k] for m in M], ws, 0.4, normalize) for k in SHAPES}, np.float32)


@pytest.mark.parametrize(("rescale", "consensus"), [(True, False), ("inverse", False), (False, True), (True, True)])
def test_dare_matches_reference(xp: Any, rescale: Any, consensus: bool) -> None:
    base, m1, m2 = _np_models(3, seed=2)
    ws = [0.6, 0.4]
    out = fk.dare(
        _on(xp, [base])[0], _on(xp, [m1, m2]), ws, density=0.3, seed=7, rescale=rescale, sign_consensus=consensus
    )
    B, *M = _f64([base, m1, m2])
    ref = {k: ref_dare(B[k], [m[k] for m in M], ws, 0.3, 7, k, rescale, consensus) for k in SHAPES}
    _check(out, ref, np.float32)


def test_model_stock_matches_reference(xp: Any) -> None:
    base, m1, m2, m3 = _np_models(4, seed=3)
    out = fk.model_stock(_on(xp, [base])[0], _on(xp, [m1, m2, m3]))
    B, *M = _f64([base, m1, m2, m3])
    _check(out, {k: ref_stock(B[k], [m[k] for m in M]) for k in SHAPES}, np.float32)


def test_model_stock_opposite_scalars_give_the_base() -> None:
    base = {"s": np.asarray(1.0, dtype=np.float32)}
    out = fk.model_stock(base, [{"s": np.asarray(2.0, dtype=np.float32)}, {"s": np.asarray(0.0, dtype=np.float32)}])
    assert float(out["s"]) == 1.0


# --------------------------------------------------------------------------- bfloat16


def _bf16_backends() -> list[tuple[str, Any, Any]]:
    ml_dtypes = pytest.importorskip("ml_dtypes")

    out: list[tuple[str, Any, Any]] = [
        ("numpy", lambda a: a.astype(ml_dtypes.bfloat16), lambda x: np.asarray(x, dtype=np.float64))
    ]
    torch = pytest.importorskip("torch")
    out.append(("torch", lambda a: torch.from_numpy(a).bfloat16(), lambda x: x.double().numpy()))
    da = pytest.importorskip("dask.array")
    out.append(
        (
            "dask",
            lambda a: da.from_array(a.astype(ml_dtypes.bfloat16), chunks=2 if a.ndim else ()),
            lambda x: np.asarray(x.compute(), dtype=np.float64),
        )
    )
    return out


@pytest.mark.parametrize("which", ["numpy", "torch", "dask"])
@pytest.mark.parametrize("method", ["slerp", "task_arithmetic", "ties", "dare", "model_stock"])
def test_bfloat16_in_bfloat16_out(which: str, method: str) -> None:
    make, back = {n: (m, b) for n, m, b in _bf16_backends()}[which]
    raw = _np_models(4, seed=4)
    # the reference computes in float64 from the bfloat16 values, rounded once to bfloat16
    ml_dtypes = pytest.importorskip("ml_dtypes")

    vals = [{k: np.asarray(v.astype(ml_dtypes.bfloat16), dtype=np.float64) for k, v in m.items()} for m in raw]
    ms = [{k: make(v) for k, v in m.items()} for m in raw]
    b, *rest = ms
    B, *R = vals
    if method == "slerp":
        out, ref = fk.slerp(b, rest[0], 0.4), {k: ref_slerp(B[k], R[0][k], 0.4) for k in SHAPES}
    elif method == "task_arithmetic":
        out = fk.task_arithmetic(b, rest, [0.5, 0.3, 0.2])
        ref = {k: B[k] + sum(w * (r[k] - B[k]) for w, r in zip([0.5, 0.3, 0.2], R, strict=True)) for k in SHAPES}
    elif method == "ties":
        out = fk.ties(b, rest, [1.0, 1.0, 1.0], density=0.5)
        ref = {k: ref_ties(B[k], [r[k] for r in R], [1.0] * 3, 0.5, True) for k in SHAPES}
    elif method == "dare":
        out = fk.dare(b, rest, [0.3, 0.3, 0.3], density=0.5, seed=3)
        ref = {k: ref_dare(B[k], [r[k] for r in R], [0.3] * 3, 0.5, 3, k, True, False) for k in SHAPES}
    else:
        out, ref = fk.model_stock(b, rest), {k: ref_stock(B[k], [r[k] for r in R]) for k in SHAPES}
    for k in SHAPES:
        assert "bfloat16" in str(out[k].dtype), (k, out[k].dtype)
        got = back(out[k])
        # one bfloat16 rounding of the float32 result (8 bits of mantissa), plus float32 error
        np.testing.assert_allclose(got, ref[k], rtol=2**-7, atol=2**-7, err_msg=k)


# --------------------------------------------------------------------------- schedules, structure, errors


def test_glob_schedules_per_layer() -> None:
    base = {"model": {"layers": [{"w": np.zeros(3)}, {"w": np.zeros(3)}], "head": np.zeros(2)}}
    m = fk.fmap(lambda x: x + 1.0, base)
    w = {"model.layers.0.*": 0.25, "*layers[[]1[]]*": 0.5, "*": 2.0}  # dotted or str(path) forms
    out = fk.task_arithmetic(base, [m], w)
    assert out["model"]["layers"][0]["w"].tolist() == [0.25] * 3
    assert out["model"]["layers"][1]["w"].tolist() == [0.5] * 3
    assert out["model"]["head"].tolist() == [2.0, 2.0]
    s = fk.slerp(base, m, {"*head": 1.0, "*": 0.0})
    assert s["model"]["head"].tolist() == [1.0, 1.0]
    assert s["model"]["layers"][0]["w"].tolist() == [0.0] * 3


def test_unmatched_glob_names_the_path() -> None:
    base = {"enc": np.zeros(2), "dec": np.zeros(2)}
    with pytest.raises(fk.StructureError, match=r"at dec: fk.ties: no glob of `density`.*'enc\*'.*fix"):
        fk.ties(base, [base], [1.0], density={"enc*": 0.5})


def test_per_model_lists_and_errors() -> None:
    base = {"w": np.zeros(4)}
    ms = [{"w": np.arange(4.0)}, {"w": -np.arange(4.0)}]
    out = fk.ties(base, ms, [1.0, 1.0], density=[1.0, 0.25])  # model 1 keeps only its -3
    # e_0 = [0, 1, 2, 3], e_1 = [0, 0, 0, -3]: sums [0, 1, 2, 0] elect + everywhere; e_1 never agrees
    assert out["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="has 1 entries but there are 2 models"):
        fk.task_arithmetic(base, ms, [1.0])
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        fk.ties(base, ms, 1.0, density=0.0)
    with pytest.raises(ValueError, match="'inverse'"):
        fk.dare(base, ms, 1.0, density=0.5, seed=0, rescale="l2")
    with pytest.raises(TypeError, match="seed"):
        fk.dare(base, ms, 1.0, density=0.5, seed=1.5)
    with pytest.raises(TypeError, match="real number"):
        fk.task_arithmetic(base, ms, [True, 1.0])
    with pytest.raises(ValueError, match="at least 2 models"):
        fk.model_stock(base, ms[:1])
    with pytest.raises(TypeError, match="single model"):
        fk.task_arithmetic(base, ms[0], 1.0)
    with pytest.raises(fk.StructureError, match=r"at w: fk.ties: shape \(4,\) in `base` vs \(3,\) in `models\[1\]`"):
        fk.ties(base, [ms[0], {"w": np.zeros(3)}], 1.0, density=0.5)
    with pytest.raises(fk.PolicyError, match="dtype float64 in `a` vs float32 in `b`"):
        fk.slerp(base, {"w": np.zeros(4, dtype=np.float32)}, 0.5)
    with pytest.raises(TypeError, match="real floating"):
        fk.slerp({"z": np.ones(2, dtype=complex)}, {"z": np.ones(2, dtype=complex)}, 0.5)


def test_ties_tie_rule_keeps_every_magnitude_at_the_threshold() -> None:
    base = {"w": np.zeros(6)}
    m = {"w": np.array([3.0, -2.0, 2.0, 2.0, 1.0, 0.5])}
    out = fk.ties(base, [m], [1.0], density=0.34)  # k = 2: threshold 2, all three 2s kept
    assert out["w"].tolist() == [3.0, -2.0, 2.0, 2.0, 0.0, 0.0]
    one = fk.ties(base, [m], [1.0], density=0.01)  # max(1, floor(0.06)) = 1
    assert one["w"].tolist() == [3.0, 0, 0, 0, 0, 0]


def test_constants_ties_and_trainable_only() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3)) for _ in range(3)]
    for k, n in enumerate(nets):
        n[1].running_mean.fill_(float(k))
    out = fk.task_arithmetic(nets[0], nets[1:], 0.5)
    assert isinstance(out, torch.nn.Sequential)
    assert out is not nets[0]
    expect = nets[0][0].weight + 0.5 * (nets[1][0].weight - nets[0][0].weight + nets[2][0].weight - nets[0][0].weight)
    torch.testing.assert_close(out[0].weight, expect)
    assert out[1].running_mean.tolist() == [0.0] * 3  # a buffer: from the base, copied
    assert out[1].running_mean.data_ptr() != nets[0][1].running_mean.data_ptr()
    every = fk.task_arithmetic(nets[0], nets[1:], 0.5, trainable_only=False)
    assert every[1].running_mean.tolist() == [1.5] * 3  # 0 + 0.5 * (1 + 2)
    assert int(every[1].num_batches_tracked) == 0
    w = np.ones(2)
    tied = {"emb": w, "head": w}
    v = 2 * w
    for r in (
        fk.dare(tied, [{"emb": v, "head": v}], 1.0, density=0.5, seed=0),
        fk.ties(tied, [{"emb": v, "head": v}], 1.0, density=0.5),
        fk.slerp(tied, {"emb": v, "head": v}, 0.5),
    ):
        assert r["emb"] is r["head"]  # merged once, still tied


def test_unknown_holders_follow_the_arithmetic() -> None:
    """The merges run on the arithmetic's lock-step engine: an opaque object holding arrays is
    treated exactly as fk.add treats it (SPEC 12: refused at its path by the engine)."""

    class Box:
        def __init__(self) -> None:
            self.w = np.zeros(2)

    base = {"box": Box(), "w": np.zeros(2)}
    try:
        fk.add(base, base)
    except fk.StructureError:
        with pytest.raises(fk.StructureError, match="box"):
            fk.ties(base, [base], 1.0, density=0.5)
        with pytest.raises(fk.StructureError, match="box"):
            fk.slerp(base, base, 0.5)
    else:
        out = fk.ties(base, [base], 1.0, density=0.5)
        assert out["box"] is base["box"]  # a constant, from the base, as fk.add gives it


def test_inputs_not_mutated(backend: Backend, xp: Any) -> None:
    base, m1, m2 = _on(xp, _np_models(3, seed=5))
    before = [{k: to_numpy(v) for k, v in m.items()} for m in (base, m1, m2)]
    fk.ties(base, [m1, m2], 1.0, density=0.5)
    fk.dare(base, [m1, m2], 1.0, density=0.5, seed=1)
    fk.model_stock(base, [m1, m2])
    for m, b in zip((base, m1, m2), before, strict=True):
        for k in SHAPES:
            np.testing.assert_array_equal(to_numpy(m[k]), b[k])


# --------------------------------------------------------------------------- per-tensor reductions


def test_per_tensor_reductions(xp: Any) -> None:
    a, b = _np_models(2, seed=6)
    A, B = _f64([a, b])
    xa, xb = _on(xp, [a, b])
    norms, dots, thr = fk.tensor_norms(xa), fk.tensor_dots(xa, xb), fk.tensor_thresholds(xa, {"a": 0.3, "*": 0.5})
    for k in SHAPES:
        assert tuple(norms[k].shape) == ()
        np.testing.assert_allclose(float(to_numpy(norms[k])), np.linalg.norm(A[k]), rtol=1e-5)
        np.testing.assert_allclose(float(to_numpy(dots[k])), float(np.sum(A[k] * B[k])), rtol=1e-5, atol=1e-6)
        n = max(A[k].size, 1)
        kk = max(1, math.floor((0.3 if k == "a" else 0.5) * n))
        assert float(to_numpy(thr[k])) == float(np.sort(np.abs(a[k]).reshape(-1))[::-1][kk - 1])


def test_empty_tensors_merge_to_empty_and_their_threshold_is_inf(xp: Any) -> None:
    """An empty parameter (a zero-size layer) has nothing to trim: every method merges it to an empty
    tensor of its dtype, and `fk.tensor_thresholds` gives +inf for it (no element reaches it; a
    k-th largest of nothing does not exist). Before, TIES raised the namespace's raw IndexError."""
    ms = [{"e": np.zeros((0, 3), np.float32), "w": np.asarray([1.0, -2.0, 3.0], np.float32) + k} for k in range(3)]
    b, m1, m2 = _on(xp, ms)
    outs = {
        "ties": fk.ties(b, [m1, m2], [0.5, 0.5], density=0.5),
        "dare": fk.dare(b, [m1, m2], [0.5, 0.5], density=0.5, seed=1),
        "slerp": fk.slerp(b, m1, 0.5),
        "task_arithmetic": fk.task_arithmetic(b, [m1, m2], [0.5, 0.5]),
        "model_stock": fk.model_stock(b, [m1, m2]),
    }
    for name, out in outs.items():
        e = to_numpy(out["e"])
        assert e.shape == (0, 3), name
        assert e.dtype == np.float32, name
        assert to_numpy(out["w"]).shape == (3,), name
    thr = fk.tensor_thresholds(b, 0.5)
    assert tuple(thr["e"].shape) == ()
    assert float(to_numpy(thr["e"])) == math.inf
    assert float(to_numpy(thr["w"])) == 3.0  # k = max(1, floor(0.5 * 3)) = 1: the largest magnitude


def test_per_tensor_reductions_bfloat16_reduce_in_float32() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")

    x = {"w": (np.arange(1, 301, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16)}
    n = fk.tensor_norms(x)["w"]
    assert n.dtype == np.float32
    np.testing.assert_allclose(float(n), np.linalg.norm(x["w"].astype(np.float64)), rtol=1e-6)
