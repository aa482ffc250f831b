"""TIES out of core (issue #23): every model's threshold in one radix selection whose block tasks
compute the magnitudes in pieces (`_pertensor.FUSED_SELECT`), the same thresholds and merges bit
for bit as one selection per model of a materialized ``|m_i - base|``; and the merges' block tasks
tokenized by value (no closure pickled), with names that two different merges never share."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

import functorkit as fk
import functorkit._pertensor as pt

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")


def _models(dt: Any) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(3)
    shapes = {"emb": (40, 6), "w": (9, 4, 3), "b": (7,), "s": ()}
    # np.asarray: a 0-d array, not a NumPy scalar (a scalar is a static leaf, taken from the base)
    base = {k: np.asarray((0.02 * rng.standard_normal(s)).astype(dt)) for k, s in shapes.items()}
    ms = [
        {k: np.asarray((v + 0.01 * rng.standard_normal(v.shape)).astype(dt)) for k, v in base.items()} for _ in range(3)
    ]
    ms[0]["emb"][:3] = base["emb"][:3]  # zero deltas
    ms[1]["emb"][5, :4] = ms[1]["emb"][6, 0]  # ties
    return base, ms


def _lazy(d: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: da.from_array(v, chunks=7 if v.ndim else ()) for k, v in d.items()}


def _bits(v: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(v)).reshape(-1).view(np.uint8)


def _readers(out: Any, x: Any) -> Counter[str]:
    """The layers of `out`'s graph whose tasks read the blocks of input `x`, counted by kind (the
    name before the token): how many times a computation of `out` reads each block of `x`."""
    from dask.core import get_deps

    graph = dict(out.__dask_graph__())
    _, dependents = get_deps(graph)
    layers = {str(d[0]) for k in graph if isinstance(k, tuple) and k[0] == x.name for d in dependents[k]}
    return Counter(name.rsplit("-", 1)[0] for name in layers)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_fused_selection_is_taken_and_matches_one_selection_per_model(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functorkit.adapters.dask as fdask

    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    base, ms = _models(dt)
    lb, lms = _lazy(base), [_lazy(m) for m in ms]
    dens = [0.3, 1.0, 0.6]  # the second model is not trimmed: no threshold, its blocks not read for one
    merge = lambda b, m: fk.ties(b, m, [0.5, 0.3, 0.2], density=dens)  # noqa: E731
    monkeypatch.setattr(fdask, "_HIST_PIECE", 5)  # several pieces per block
    on = merge(lb, lms)
    # the base's blocks: one reader for both thresholds (a reshape feeding `_histograms`), one for the body
    assert _readers(on["emb"], lb["emb"])["_piecewise"] == 1
    graph = dict(on["emb"].__dask_graph__())
    hist = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("_histograms")]
    assert hist, sorted({str(k[0]) for k in graph if isinstance(k, tuple)})[:8]
    from dask.local import get_sync

    assert get_sync(graph, hist[0]).shape == (2 << 16,)  # two models trimmed: two histograms per block
    assert _readers(on["emb"], lms[1]["emb"])["_piecewise"] == 1  # the untrimmed model: the body only
    got_on = dask.compute(on)[0]
    monkeypatch.setattr(pt, "FUSED_SELECT", False)
    off = merge(lb, lms)
    assert _readers(off["emb"], lb["emb"])["_piecewise"] == 3  # each magnitude made, then the body
    got_off = dask.compute(off)[0]
    eager = merge(base, ms)
    for k in base:
        assert got_on[k].dtype == got_off[k].dtype == eager[k].dtype == base[k].dtype, k
        np.testing.assert_array_equal(_bits(got_on[k]), _bits(got_off[k]), err_msg=k)
        np.testing.assert_array_equal(_bits(got_on[k]), _bits(eager[k]), err_msg=k)


def test_fused_thresholds_are_the_partition_values_with_special_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The thresholds themselves (each model's k-th largest |m_i - base|), with ties, zeros, infinities
    and NaN deltas, for several densities: NumPy's ``partition`` of each whole magnitude array."""
    import functorkit._merge as mg
    import functorkit.adapters.dask as fdask

    monkeypatch.setattr(fdask, "_HIST_PIECE", 7)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((37, 5)).astype(np.float32)
    os_ = [x + rng.standard_normal(x.shape).astype(np.float32) for _ in range(3)]
    os_[0][0, :4] = x[0, :4] + 1.0  # ties
    os_[1][2, :3] = x[2, :3]  # zeros
    os_[2][3, 0], os_[2][3, 1] = np.inf, np.nan
    lx, los = da.from_array(x, chunks=(6, 5)), [da.from_array(o, chunks=(6, 5)) for o in os_]
    n = x.size
    for density in (0.01, 0.2, 0.5, 0.77):
        k = pt.count_kept(n, density)
        got = dask.compute(*pt.kth_largests(np, mg._abs_deltas, (lx, *los), [k] * 3, np.float32))
        for j, o in enumerate(os_):
            with np.errstate(invalid="ignore"):
                a = np.abs(o - x).reshape(-1)
            want = np.partition(a, n - k)[n - k]
            assert _bits(got[j]).tobytes() == _bits(np.float32(want)).tobytes(), (density, j, got[j], want)


MERGES = {
    "ties": lambda b, ms: fk.ties(b, ms, [0.6, 0.4, 0.2], density=0.5),
    "ties_weights": lambda b, ms: fk.ties(b, ms, [0.6, 0.4, 0.3], density=0.5),
    "ties_density": lambda b, ms: fk.ties(b, ms, [0.6, 0.4, 0.2], density=0.4),
    "ties_raw": lambda b, ms: fk.ties(b, ms, [0.6, 0.4, 0.2], density=0.5, normalize=False),
    "ties_order": lambda b, ms: fk.ties(b, ms[::-1], [0.6, 0.4, 0.2], density=0.5),
    "dare": lambda b, ms: fk.dare(b, ms, [0.6, 0.4, 0.2], density=0.5, seed=1),
    "dare_seed": lambda b, ms: fk.dare(b, ms, [0.6, 0.4, 0.2], density=0.5, seed=2),
    "dare_inverse": lambda b, ms: fk.dare(b, ms, [0.6, 0.4, 0.2], density=0.5, seed=1, rescale="inverse"),
    "dare_plain": lambda b, ms: fk.dare(b, ms, [0.6, 0.4, 0.2], density=0.5, seed=1, rescale=False),
    "dare_ties": lambda b, ms: fk.dare(b, ms, [0.6, 0.4, 0.2], density=0.5, seed=1, sign_consensus=True),
    "task_arithmetic": lambda b, ms: fk.task_arithmetic(b, ms, [0.6, 0.4, 0.2]),
    "task_arithmetic_scale": lambda b, ms: fk.task_arithmetic(b, ms, [0.6, 0.4, 0.2], scale=0.5),
    "task_arithmetic_layer": lambda b, ms: fk.task_arithmetic(b, ms, {"emb": 0.1, "*": 0.6}),
}


def test_merge_tasks_are_tokenized_by_value_and_never_share_a_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dask names a block task by a token of its function and inputs; the merges' bodies are
    ``functools.partial`` of module-level functions over numbers and names, so nothing is pickled
    by cloudpickle (a closure was pickled, with the masks' graphs it held, for every tensor), the
    same merge gets the same names, and any two different merges (weights, density, normalize,
    the models' order, seed, rescale, consensus, scale, per-layer weights) get different ones."""
    import dask.tokenize as dtok

    base, ms = _models(np.float32)
    lb, lms = _lazy(base), [_lazy(m) for m in ms]

    def refuse(*a: Any, **kw: Any) -> Any:
        raise AssertionError("cloudpickle used to tokenize a merge")

    monkeypatch.setattr(dtok.cloudpickle, "dumps", refuse)
    names = {}
    with dask.config.set({"tokenize.ensure-deterministic": True}):  # no random token as a fallback
        for label, merge in MERGES.items():
            out = merge(lb, lms)
            names[label] = tuple(out[k].name for k in ("emb", "w", "b"))
            assert names[label] == tuple(merge(lb, lms)[k].name for k in ("emb", "w", "b")), label  # deterministic
    every = [n for ns in names.values() for n in ns]
    assert len(set(every)) == len(every), Counter(every).most_common(3)
    monkeypatch.undo()
    for label in ("ties", "dare_plain", "task_arithmetic_layer"):  # element-wise and exact: bit for bit
        got = dask.compute(MERGES[label](lb, lms))[0]
        eager = MERGES[label](base, ms)
        for k in base:
            np.testing.assert_array_equal(_bits(got[k]), _bits(eager[k]), err_msg=(label, k))


def _backend(d: dict[str, np.ndarray], backend: str) -> dict[str, Any]:
    if backend == "dask":
        return _lazy(d)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        bf16 = d["emb"].dtype.itemsize == 2
        return {
            k: torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16) if bf16 else torch.from_numpy(v.copy())
            for k, v in d.items()
        }
    return d


def _host_bits(v: Any) -> np.ndarray:
    if hasattr(v, "compute"):
        v = v.compute()
    if type(v).__module__.startswith("torch"):
        import torch

        ints = v.contiguous().view(torch.int16 if v.element_size() == 2 else torch.int32)
        return ints.numpy().reshape(-1).view(np.uint8)
    return _bits(v)


def _weights_models(dt: Any) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """`_models`, and elements where every delta is zero (no model agrees: the divisor 0 made 1)."""
    base, ms = _models(dt)
    for m in ms:
        m["emb"][10:12] = base["emb"][10:12]
    return base, ms


@pytest.mark.parametrize("backend", ["numpy", "torch", "dask"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_table_divisor_is_taken_on_numpy_blocks_and_matches_the_formula(
    backend: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIES's normalised divisor from `_merge._divisors` (one gather of a table of every agreement
    pattern) on NumPy arrays and Dask's NumPy blocks, never on torch; the same bits as the formula
    (`WEIGHT_TABLE` off), with weights of both signs, a zero weight, zero deltas and ties."""
    import functorkit._merge as mg

    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    base, ms = _weights_models(dt)
    calls: list[int] = []
    real = mg._divisors

    def spy(wv: Any, dtype: Any) -> Any:
        calls.append(len(wv))
        return real(wv, dtype)

    monkeypatch.setattr(mg, "_divisors", spy)
    table = mg.WEIGHT_TABLE
    results = {}
    for weights in ([0.5, 0.3, 0.2], [0.7, -0.4, 0.0]):
        for on in (True, False):
            monkeypatch.setattr(mg, "WEIGHT_TABLE", table if on else False)  # on: the module's default
            del calls[:]
            out = fk.ties(_backend(base, backend), [_backend(m, backend) for m in ms], weights, density=0.4)
            got = {k: _host_bits(v) for k, v in (dask.compute(out)[0] if backend == "dask" else out).items()}
            assert bool(calls) == (on and backend != "torch"), (on, backend, calls)
            results[tuple(weights), on] = got
        for k in base:
            np.testing.assert_array_equal(
                results[tuple(weights), True][k], results[tuple(weights), False][k], err_msg=k
            )


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_top_bits_view_is_taken_and_counts_the_same(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first radix level's digits are a strided ``uint16`` view of the magnitudes (no shifted
    copy: `TOP_BITS_VIEW`), and the thresholds and merges are the same bits as with the shift."""
    import sys

    import functorkit.adapters.dask as fdask

    if sys.byteorder != "little":
        pytest.skip("the view is of the little-endian layout")
    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    base, ms = _models(dt)
    views: list[bool] = []
    real = fdask._top_digits

    def spy(flat: Any, shift: int) -> Any:
        got = real(flat, shift)
        views.append(bool(np.shares_memory(got, flat)))
        return got

    monkeypatch.setattr(fdask, "_top_digits", spy)
    outs = {}
    for on in (True, False):
        if not on:  # on: the default
            monkeypatch.setattr(fdask, "TOP_BITS_VIEW", False)
        del views[:]
        outs[on] = dask.compute(fk.ties(_lazy(base), [_lazy(m) for m in ms], [0.5, 0.3, 0.2], density=0.3))[0]
        assert views, on
        assert set(views) == {on}, (on, views[:4])
    eager = fk.ties(base, ms, [0.5, 0.3, 0.2], density=0.3)
    for k in base:
        np.testing.assert_array_equal(_bits(outs[True][k]), _bits(outs[False][k]), err_msg=k)
        np.testing.assert_array_equal(_bits(outs[True][k]), _bits(eager[k]), err_msg=k)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_selection_flag_leaves_eager_merges_alone(
    backend: str, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eager arrays have no fused selection (each model's magnitudes made and selected in turn):
    `FUSED_SELECT` on or off, the same bits, and those of the fused selection on Dask (zero deltas
    and ties included; torch's ``kthvalue`` and NumPy's ``partition`` select the same threshold)."""
    dt = pytest.importorskip("ml_dtypes").bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
    base, ms = _weights_models(dt)
    got = {}
    for on in (True, False):
        monkeypatch.setattr(pt, "FUSED_SELECT", on)
        out = fk.ties(_backend(base, backend), [_backend(m, backend) for m in ms], [0.5, 0.3, 0.2], density=0.3)
        got[on] = {k: _host_bits(v) for k, v in out.items()}
    fused = dask.compute(fk.ties(_lazy(base), [_lazy(m) for m in ms], [0.5, 0.3, 0.2], density=0.3))[0]
    for k in base:
        np.testing.assert_array_equal(got[True][k], got[False][k], err_msg=k)
        np.testing.assert_array_equal(got[True][k], _bits(fused[k]), err_msg=k)


def test_weight_table_is_made_once_per_weights_and_dtype() -> None:
    """A Dask body runs on many row pieces; the divisor table is computed once for them all."""
    import functorkit._merge as mg

    base, ms = _models(np.float32)
    mg._divisor_table.cache_clear()
    weights = [0.25, 0.5, 0.125]  # weights no other test uses: a fresh table
    out = dask.compute(fk.ties(_lazy(base), [_lazy(m) for m in ms], weights, density=0.5))[0]
    info = mg._divisor_table.cache_info()
    assert info.misses == 1, info
    assert info.hits >= 2, info  # several blocks and tensors took it from the cache
    eager = fk.ties(base, ms, weights, density=0.5)
    for k in base:
        np.testing.assert_array_equal(_bits(out[k]), _bits(eager[k]), err_msg=k)
