"""The merges' streaming paths on Dask: each method's element-wise body runs as one task per block in
row pieces (bit-identical to the eager result), DARE's mask is hashed in pieces, fk.save streams an
file in one store (every block written by the task that computes it) after one pass of the shared
reductions, or, where workers cannot write the file, batch by batch; and fk.save does not import
dask.distributed when no client can exist."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk
import functorkit._ckpt_write as ck
import functorkit._pertensor as pt

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")
Callback = pytest.importorskip("dask.callbacks").Callback

ROOT = Path(__file__).resolve().parent.parent


def _models(dtype: Any = np.float32) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(5)
    shapes = {"emb": (40, 6), "w": (9, 4, 3), "bias": (7,), "s": ()}
    mk = lambda s: np.asarray(0.5 * rng.standard_normal(s) + 0.1).astype(dtype)  # noqa: E731
    return {k: mk(s) for k, s in shapes.items()}, [{k: mk(s) for k, s in shapes.items()} for _ in range(2)]


METHODS = {
    "slerp": lambda b, ms: fk.slerp(b, ms[0], 0.3),
    "task_arithmetic": lambda b, ms: fk.task_arithmetic(b, ms, [0.7, 0.4], scale=0.9),
    "ties": lambda b, ms: fk.ties(b, ms, [0.7, 0.4], density=0.4),
    "dare": lambda b, ms: fk.dare(b, ms, [0.7, 0.4], density=0.4, seed=3),
    "dare_inverse_ties": lambda b, ms: fk.dare(b, ms, 0.5, density=0.6, seed=3, rescale="inverse", sign_consensus=True),
    "model_stock": lambda b, ms: fk.model_stock(b, ms),
}


def _lazy(d: dict[str, np.ndarray]) -> dict[str, Any]:
    return {k: da.from_array(v, chunks=7 if v.ndim else ()) for k, v in d.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(METHODS))
def test_dask_body_runs_in_pieces_and_is_bit_identical(name: str, dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    ml = pytest.importorskip("ml_dtypes") if dtype == "bfloat16" else None
    dt = ml.bfloat16 if ml is not None else np.float32
    base, ms = _models(dt)
    lb, lms = _lazy(base), [_lazy(m) for m in ms]
    whole = dask.compute(METHODS[name](lb, lms))[0]  # each block in one piece: the unpieced ops
    monkeypatch.setattr(pt, "_PIECE", 8)  # several pieces per block (rows of 6 or 12 elements)
    out = METHODS[name](lb, lms)
    for k in ("emb", "w"):
        names = {str(key[0] if isinstance(key, tuple) else key) for key in dict(out[k].__dask_graph__())}
        assert any("piecewise" in n for n in names), (k, sorted(names)[:5])
    got = dask.compute(out)[0]
    eager = METHODS[name](base, ms)
    for k in eager:
        assert got[k].dtype == whole[k].dtype == eager[k].dtype, k
        bits = lambda v: np.asarray(v).reshape(-1).view(np.uint8)  # noqa: E731
        np.testing.assert_array_equal(bits(got[k]), bits(whole[k]), err_msg=k)
        np.testing.assert_allclose(got[k].astype(np.float32), eager[k].astype(np.float32), rtol=1e-2, atol=1e-5)


def test_dare_mask_hashed_in_pieces_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    base, ms = _models()
    kw: dict[str, Any] = {"density": 0.5, "seed": 9, "rescale": False}
    ref = fk.dare(base, ms, 1.0, **kw)
    for piece in (1, 5, 1 << 16):
        monkeypatch.setattr(pt, "_PIECE", piece)
        got = dask.compute(fk.dare(_lazy(base), [_lazy(m) for m in ms], 1.0, **kw))[0]
        for k in ref:
            np.testing.assert_array_equal(np.asarray(got[k]), ref[k], err_msg=(piece, k))


class _Computes(Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def _start(self, dsk: Any) -> None:
        self.n += 1


def test_save_stores_a_file_in_one_compute_after_one_pass_of_reductions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads (the default scheduler): every lazy block of a file in one ``dask.array.store`` (the
    batch writer would make 8 computes here); a tensor with a shared reduction adds one compute
    before it (the reductions of the whole file)."""
    monkeypatch.setattr(ck, "BATCH_BYTES", 256)  # one 8 x 8 float32 block per batch
    raw = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    x = da.from_array(raw, chunks=(8, 8))
    for y, computes in [(x * 2 + 1, 1), (x / da.sqrt(da.sum(x * x)), 2)]:
        with _Computes() as c:
            fk.save(tmp_path / "y.safetensors", {"y": y, "z": y[:5] - 1, "e": raw[:3]})
        assert c.n == computes
        back = fk.load(tmp_path / "y.safetensors")
        np.testing.assert_array_equal(back["y"], y.compute())
        np.testing.assert_array_equal(back["z"], y[:5].compute() - 1)
        np.testing.assert_array_equal(back["e"], raw[:3])


@pytest.mark.parametrize("what", ["elementwise", "reduction", "ties"])
def test_save_streams_batch_by_batch_where_workers_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A scheduler whose workers are other processes (here ``processes``; a ``distributed`` client
    alike) cannot write to this process's file: the blocks come back a batch at a time, and a tensor
    with a shared reduction streams too, its reductions computed first (in rounds where one needs
    another)."""
    monkeypatch.setattr(ck, "BATCH_BYTES", 256)  # one 8 x 8 float32 block per batch
    raw = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    x = da.from_array(raw, chunks=(8, 8))
    if what == "ties":
        base, other = {"y": x}, {"y": x[::-1] * 0.5}
        y = fk.ties(base, [other], 1.0, density=0.5)["y"]
        expected = fk.ties({"y": raw}, [{"y": raw[::-1] * 0.5}], 1.0, density=0.5)["y"]
    else:
        y = x * 2 + 1 if what == "elementwise" else x / da.sqrt(da.sum(x * x))
        expected = y.compute()
    with dask.config.set(scheduler="processes", num_workers=1), _Computes() as c:
        fk.save(tmp_path / "y.safetensors", {"y": y})
    # 8 batches, after one pass of the reductions (TIES: two, one per 16 bits of its radix selection)
    assert c.n == {"elementwise": 8, "reduction": 9, "ties": 10}[what]
    np.testing.assert_array_equal(fk.load(tmp_path / "y.safetensors")["y"], expected)


def test_merges_with_reductions_share_work_and_linear_ones_stream() -> None:
    from functorkit.adapters import adapter_of

    base, ms = _models()
    lb, lms = _lazy(base), [_lazy(m) for m in ms]
    shares = lambda out: adapter_of(out["emb"]).blocks_share_work(out["emb"])  # noqa: E731
    assert not shares(fk.task_arithmetic(lb, lms, 0.5))
    assert not shares(fk.mean([lb, *lms]))
    assert not shares(fk.dare(lb, lms, 0.5, density=0.5, seed=0, rescale=False))
    for name in ("slerp", "ties", "dare", "model_stock"):
        assert shares(METHODS[name](lb, lms)), name


def test_save_does_not_import_distributed(tmp_path: Path) -> None:
    code = (
        "import sys, dask.array as da, functorkit as fk\n"
        "assert 'distributed' not in sys.modules\n"
        f"fk.save({str(tmp_path / 'a.safetensors')!r}, {{'x': da.ones((64, 8), chunks=8) * 2}})\n"
        "print('distributed' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.strip() == "False"
    np.testing.assert_array_equal(fk.load(tmp_path / "a.safetensors")["x"], np.full((64, 8), 2.0))


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_dask_threshold_radix_selection_equals_the_eager_selection(dtype: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """TIES's threshold on Dask (a radix selection over the blocks, histograms in pieces) is the value
    NumPy's ``partition`` selects, with ties, zeros and infinities, for every density."""
    import functorkit.adapters.dask as fdask

    monkeypatch.setattr(fdask, "_HIST_PIECE", 7)  # several pieces per block
    ml = pytest.importorskip("ml_dtypes") if dtype == "bfloat16" else None
    dt = ml.bfloat16 if ml is not None else np.dtype(dtype)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((37, 5)).astype(dt)
    x[0, :4] = x[1, 0]  # ties
    x[2, :3] = 0
    x[3, 0], x[3, 1] = np.inf, -np.inf
    for density in (0.01, 0.2, 0.5, 0.77, 1.0):
        eager = fk.tensor_thresholds({"w": x}, density)["w"]
        lazy = fk.tensor_thresholds({"w": da.from_array(x, chunks=(6, 5))}, density)["w"].compute()
        assert lazy.dtype == eager.dtype
        assert lazy == eager, (density, lazy, eager)


#: per input block of the tensor: the tasks that read it, by kind (`_block_sums`: every shared sum of
#: the tensor in one task; `_piecewise`: the merged values; `_keep_block`: DARE's mask of one model)
_READERS = {
    "slerp": [{"_block_sums": 1, "_piecewise": 1}] * 2,
    "dare": [{"_block_sums": 2, "_keep_block": 2, "_piecewise": 1}] + [{"_block_sums": 1, "_piecewise": 1}] * 2,
    "model_stock": [{"_block_sums": 1, "_piecewise": 1}] * 3,
}


@pytest.mark.parametrize("name", list(_READERS))
def test_shared_sums_read_each_block_once(name: str) -> None:
    """slerp's norms and dot, DARE's two L1 norms (per model) and model stock's norms and dots are
    computed in one task per block on Dask (`_pertensor.sums`), not one reduction each: separate
    reductions of the same blocks keep those blocks in memory until the last has run (the
    two-pass save's peak RSS, bench_merge). Their values are the eager ones."""
    from dask.core import get_deps

    base, ms = _models()
    lb, lms = _lazy(base), [_lazy(m) for m in ms]
    out = METHODS[name](lb, lms)
    graph = dict(out["emb"].__dask_graph__())
    _, dependents = get_deps(graph)
    inputs = [lb, *lms][: len(_READERS[name])]
    for j, (tree, want) in enumerate(zip(inputs, _READERS[name], strict=True)):
        blocks = [k for k in graph if isinstance(k, tuple) and k[0] == tree["emb"].name]
        assert len(blocks) == 6, (j, blocks)  # 40 rows in chunks of 7
        for k in blocks:
            got = Counter(str(d[0]).rsplit("-", 1)[0] for d in dependents[k])
            assert got == want, (name, j, k, got)
    eager = METHODS[name](base, ms)
    got = dask.compute(out)[0]
    for k in eager:
        np.testing.assert_allclose(got[k], eager[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", list(METHODS))
def test_models_chunked_differently(name: str) -> None:
    """The models' blocks need not line up: each method's block tasks and shared sums take the first
    model's block grid (the others are rechunked to it; before, every method but the linear ones
    raised "Shapes do not align" when computed)."""
    base, ms = _models()
    chunks = (5, 11, 40)
    lazy = [
        {k: da.from_array(v, chunks=c if v.ndim else ()) for k, v in d.items()} for d, c in zip([base, *ms], chunks)
    ]
    got = dask.compute(METHODS[name](lazy[0], lazy[1:]))[0]
    eager = METHODS[name](base, ms)
    for k in eager:
        np.testing.assert_allclose(got[k], eager[k], rtol=1e-5, atol=1e-6, err_msg=k)
