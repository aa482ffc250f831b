"""DARE's masks are the same whatever the tensor order, the Dask chunking, the processes or the
backend; TIES's threshold is a selection (Dask: chunk-wise top-k); merges stay lazy on Dask."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, namespace_for, to_numpy

da = pytest.importorskip("dask.array")


def _models(seed: int = 0) -> tuple[dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    shapes = {"emb": (37, 11), "layers.0.w": (8, 9, 3), "bias": (13,), "s": ()}
    base = {k: np.zeros(s, dtype=np.float32) for k, s in shapes.items()}
    ms = [{k: np.asarray(rng.standard_normal(s) + 0.5, dtype=np.float32) for k, s in shapes.items()} for _ in range(2)]
    return base, ms


def _dare(base: Any, ms: Any, **kw: Any) -> Any:
    # rescale=False, base 0, weight 1: each element is exactly m_i or 0, so equality is bit for bit
    return fk.dare(base, ms, 1.0, density=kw.pop("density", 0.4), seed=kw.pop("seed", 11), rescale=False, **kw)


def _np(out: dict[str, Any]) -> dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in out.items()}


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_same_masks_whatever_the_tensor_order() -> None:
    base, ms = _models()
    ref = _np(_dare(base, ms))
    rev = lambda d: dict(reversed(list(d.items())))  # noqa: E731
    _same(ref, _np(_dare(rev(base), [rev(m) for m in ms])))
    # a model holding one tensor of the others gets that tensor's masks
    one = _np(_dare({"bias": base["bias"]}, [{"bias": m["bias"]} for m in ms]))
    np.testing.assert_array_equal(one["bias"], ref["bias"])


def test_masks_depend_on_seed_position_and_path() -> None:
    base, ms = _models()
    a = _np(_dare(base, [ms[0], ms[0]]))
    b = _np(_dare(base, [ms[0], ms[0]], seed=12))
    assert not np.array_equal(a["emb"], b["emb"])
    single = [
        _np(_dare(base, [ms[0]]))["emb"],
        _np(fk.dare(base, [ms[0], ms[0]], [0.0, 1.0], density=0.4, seed=11, rescale=False))["emb"],
    ]
    assert not np.array_equal(single[0], single[1])  # position 0 and position 1 draw differently
    kept = (a["emb"] != 0).mean()
    assert 0.2 < kept < 0.6


def test_keep_rate_is_the_density() -> None:
    base = {"w": np.zeros(200_000, dtype=np.float32)}
    out = fk.dare(base, [{"w": np.ones(200_000, dtype=np.float32)}], 1.0, density=0.3, seed=5, rescale=False)
    rate = float(np.mean(out["w"] != 0))
    assert abs(rate - 0.3) < 0.005  # 200k Bernoulli(0.3) draws: sd 0.001


@pytest.mark.parametrize("chunks", [1, 3, 7, -1])
def test_same_masks_whatever_the_chunking(chunks: int) -> None:
    base, ms = _models()
    ref = _np(_dare(base, ms))

    def lazy(d: dict[str, np.ndarray]) -> dict[str, Any]:
        return {k: da.from_array(v, chunks=chunks if v.ndim else ()) for k, v in d.items()}

    out = _dare(lazy(base), [lazy(m) for m in ms])
    assert all(isinstance(v, da.Array) for v in out.values())  # lazy until computed
    layers = {str(k[0] if isinstance(k, tuple) else k) for k in dict(out["emb"].__dask_graph__())}
    assert any("keep_block" in n for n in layers)  # each block draws its own mask (map_blocks)
    _same(ref, _np(out))


def test_same_masks_with_processes() -> None:
    import dask

    base, ms = _models()
    ref = _np(_dare(base, ms))
    lazy = lambda d: {k: da.from_array(v, chunks=5 if v.ndim else ()) for k, v in d.items()}  # noqa: E731
    out = _dare(lazy(base), [lazy(m) for m in ms])
    with dask.config.set(scheduler="processes", num_workers=2):
        got = dict(zip(out, dask.compute(*out.values()), strict=True))
    _same(ref, {k: np.asarray(v) for k, v in got.items()})


@pytest.mark.parametrize("b", [Backend.TORCH, Backend.JAX, Backend.ARRAY_API_STRICT, Backend.DASK])
def test_same_masks_on_every_backend(b: Backend) -> None:
    xp = namespace_for(b)
    base, ms = _models()
    ref = _np(_dare(base, ms))
    conv = lambda d: {k: xp.asarray(v) for k, v in d.items()}  # noqa: E731
    _same(ref, _np(_dare(conv(base), [conv(m) for m in ms])))


def test_two_tensors_of_one_dotted_key_are_refused(xp: Any) -> None:
    """The masks are keyed by the dotted path: a key "a.b" next to a nested a -> b drew one mask
    for both tensors (silently correlated). Refused, naming both paths, before anything is drawn."""
    base = {"a.b": xp.zeros(64), "a": {"b": xp.zeros(64)}}
    ms = [{"a.b": xp.ones(64), "a": {"b": xp.ones(64)}}]
    with pytest.raises(fk.StructureError, match=r"the paths \['a.b'\] and a.b both read 'a.b'"):
        fk.dare(base, ms, [1.0], density=0.5, seed=0)
    fine = {"a_b": xp.zeros(64), "a": {"b": xp.zeros(64)}}
    out = fk.dare(fine, [{"a_b": xp.ones(64), "a": {"b": xp.ones(64)}}], [1.0], density=0.5, seed=0)
    assert not np.array_equal(to_numpy(out["a_b"]), to_numpy(out["a"]["b"]))  # masks of their own


def test_ties_threshold_is_a_radix_selection_on_dask() -> None:
    base, ms = _models()
    lazy = lambda d: {k: da.from_array(v, chunks=4 if v.ndim else ()) for k, v in d.items()}  # noqa: E731
    out = fk.ties(lazy(base), [lazy(m) for m in ms], 1.0, density=0.3)
    names = {str(k[0] if isinstance(k, tuple) else k).split("-")[0] for k in dict(out["emb"].__dask_graph__())}
    assert {"_histograms", "_pick"} <= names, names  # per-block histograms of the key bits, summed
    assert not any("sort" in n or "topk" in n or "partition" in n for n in names), names
    _same(_np(fk.ties(base, ms, 1.0, density=0.3)), _np(out))
    dense = fk.ties(lazy(base), [lazy(m) for m in ms], 1.0, density=0.9)  # the smaller side: n - k + 1 smallest
    _same(_np(fk.ties(base, ms, 1.0, density=0.9)), _np(dense))


@pytest.mark.parametrize("int32_below", [2**31, 1])
def test_ties_histograms_count_in_int32_where_the_tensor_fits(
    int32_below: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The radix histograms count in int32 for tensors of fewer than 2**31 elements (half the memory the
    reduction holds) and in int64 above; the threshold, and so the merge, is the same either way."""
    from functorkit.adapters import dask as dask_adapter

    monkeypatch.setattr(dask_adapter, "INT32_COUNTS", int32_below)
    base, ms = _models()
    lazy = lambda d: {k: da.from_array(v, chunks=4 if v.ndim else ()) for k, v in d.items()}  # noqa: E731
    out = fk.ties(lazy(base), [lazy(m) for m in ms], 1.0, density=0.3)
    from dask.local import get_sync

    graph = dict(out["emb"].__dask_graph__())
    key = next(k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("_histograms"))
    block = get_sync(graph, key)  # one block's histograms (one per model), computed alone
    assert block.shape == (len(ms) << 16,)
    assert block.dtype == (np.int32 if int32_below > 1 else np.int64)
    _same(_np(fk.ties(base, ms, 1.0, density=0.3)), _np(out))


def test_merges_on_opened_checkpoints_are_lazy_and_stream(tmp_path: Any) -> None:
    base, ms = _models()
    paths = []
    for i, m in enumerate([base, *ms]):
        p = tmp_path / f"m{i}.safetensors"
        fk.save(p, m)
        paths.append(p)
    b, *rest = (fk.open(p) for p in paths)
    for name, out, eager in [
        ("ties", fk.ties(b, rest, 0.5, density=0.5), fk.ties(base, ms, 0.5, density=0.5)),
        ("dare", fk.dare(b, rest, 0.5, density=0.5, seed=3), fk.dare(base, ms, 0.5, density=0.5, seed=3)),
        ("slerp", fk.slerp(b, rest[0], 0.3), fk.slerp(base, ms[0], 0.3)),
        ("stock", fk.model_stock(b, rest), fk.model_stock(base, ms)),
    ]:
        assert all(isinstance(v, da.Array) for v in fk.leaves(out)), name
        fk.save(tmp_path / f"{name}.safetensors", out)
        back = fk.load(tmp_path / f"{name}.safetensors")
        for k in eager:
            np.testing.assert_allclose(fk.KeyPath.parse(k).get(back), eager[k], rtol=1e-6, atol=1e-6, err_msg=(name, k))


def test_save_computes_each_tensor_graph_once_per_pass(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tensor with a reduction inside (a merge's norm) is saved in two passes: the reduction (every
    input block read once), then the blocks streamed (every input block read once more); never once per
    batch, and an elementwise tensor in one pass."""
    import functorkit._ckpt_write as ck

    monkeypatch.setattr(ck, "BATCH_BYTES", 256)  # many batches per tensor before the change
    calls: list[int] = []

    def counted(b: np.ndarray) -> np.ndarray:
        calls.append(1)
        return b

    raw = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    x = da.from_array(raw, chunks=(8, 8)).map_blocks(counted, dtype=np.float32, meta=np.empty((0, 0), np.float32))
    y = x / da.sqrt(da.sum(x * x))  # every output block needs every input block
    fk.save(tmp_path / "y.safetensors", {"y": y, "z": da.from_array(raw[:2], chunks=1)})
    assert len(calls) == 2 * 8  # each input block once per pass
    calls.clear()
    fk.save(tmp_path / "x.safetensors", {"x": x * 2})
    assert len(calls) == 8  # elementwise: one pass
    np.testing.assert_allclose(fk.load(tmp_path / "y.safetensors")["y"], raw / np.linalg.norm(raw), rtol=1e-6)
