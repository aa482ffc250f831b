"""fk.open: lazy checkpoints (Dask arrays over the files); arithmetic stays lazy; fk.save streams
block by block; the same program on a dask.distributed LocalCluster gives bit-identical files."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
import dask  # noqa: E402
from dask.callbacks import Callback  # noqa: E402

import functorkit as fk  # noqa: E402
from functorkit.adapters import dask as dask_adapter  # noqa: E402


class Computes(Callback):
    """Counts Dask computations started while active."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def _start(self, dsk: Any) -> None:
        self.n += 1


def checkpoints(tmp_path: Path, n: int = 3, dtype: Any = np.float32) -> tuple[list[dict[str, Any]], list[Path]]:
    rng = np.random.default_rng(0)
    base = {
        "wte": {"weight": rng.standard_normal((64, 16)).astype(dtype)},
        "h": [{"w": rng.standard_normal((16, 16)).astype(dtype), "b": np.zeros(16, dtype)} for _ in range(2)],
        "ln": {"scale": np.ones(16, dtype)},
    }
    models = [fk.fmap(lambda x, k=k: x + np.asarray(0.01 * k, dtype) * (x + 1), base) for k in range(n)]
    tmp_path.mkdir(exist_ok=True)
    paths = []
    for k, m in enumerate(models):
        paths.append(tmp_path / f"m{k}")
        fk.save(paths[-1], m, shard_size=2000)
    return models, paths


def _equal_trees(a: Any, b: Any) -> None:
    la, lb = fk.leaves_with_path(a), fk.leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (p, x), (_, y) in zip(la, lb):
        x = x.compute() if isinstance(x, da.Array) else x
        y = y.compute() if isinstance(y, da.Array) else y
        assert x.dtype == y.dtype, p
        np.testing.assert_array_equal(x, y, err_msg=str(p))


def test_open_is_lazy_for_a_file_and_a_sharded_directory(tmp_path: Path) -> None:
    models, paths = checkpoints(tmp_path, n=1)
    fk.save(tmp_path / "one.safetensors", models[0])
    with Computes() as c:
        for p in (paths[0], tmp_path / "one.safetensors"):
            lazy = fk.open(p)
            assert all(isinstance(x, da.Array) for x in fk.leaves(lazy))
            assert set(lazy["h"]) == {0, 1}
    assert c.n == 0
    _equal_trees(lazy, fk.load(tmp_path / "one.safetensors"))
    # with like=: the structure of `like` (a list here), Dask leaves
    shaped = fk.open(paths[0], like=models[0])
    assert isinstance(shaped["h"], list)
    assert isinstance(shaped["h"][0]["w"], da.Array)
    _equal_trees(shaped, models[0])


def test_arithmetic_on_opened_checkpoints_stays_lazy_and_is_right(tmp_path: Path) -> None:
    _models, paths = checkpoints(tmp_path)
    a, b, c = (fk.open(p) for p in paths)
    na, nb, nc = (fk.load(p) for p in paths)
    with Computes() as counter:
        lazy = {
            "add": fk.add(a, b),
            "sub": fk.sub(a, b),
            "scale": fk.scale(0.5, a),
            "lerp": fk.lerp(a, b, 0.25),
            "lincomb": fk.lincomb([0.2, 0.3, 0.5], [a, b, c]),
            "mean": fk.mean([a, b, c]),
        }
        dot, norm = fk.dot(a, b), fk.norm(fk.sub(a, c))
    assert counter.n == 0
    for tree in lazy.values():
        assert all(isinstance(x, da.Array) for x in fk.leaves(tree))
    assert isinstance(dot, da.Array)
    assert dot.shape == ()
    assert isinstance(norm, da.Array)
    assert norm.shape == ()
    eager = {
        "add": fk.add(na, nb),
        "sub": fk.sub(na, nb),
        "scale": fk.scale(0.5, na),
        "lerp": fk.lerp(na, nb, 0.25),
        "lincomb": fk.lincomb([0.2, 0.3, 0.5], [na, nb, nc]),
        "mean": fk.mean([na, nb, nc]),
    }
    for name in lazy:
        _equal_trees(lazy[name], eager[name])
    np.testing.assert_allclose(float(dot), float(fk.dot(na, nb)), rtol=1e-5)
    np.testing.assert_allclose(float(norm), float(fk.norm(fk.sub(na, nc))), rtol=1e-5)


def test_strict_policy_refuses_a_bfloat16_float32_mix(tmp_path: Path) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    _, p16 = checkpoints(tmp_path / "bf", n=1, dtype=ml_dtypes.bfloat16)
    _, p32 = checkpoints(tmp_path / "f32", n=1)
    a, b = fk.open(p16[0]), fk.open(p32[0])
    assert str(a["wte"]["weight"].dtype) == "bfloat16"
    with pytest.raises(fk.PolicyError, match=r"bfloat16.*float32"):
        fk.mean([a, b])
    # bfloat16 arrays are parameters (not constants): arithmetic reaches them
    doubled = fk.scale(2.0, a)["wte"]["weight"].compute()
    np.testing.assert_array_equal(doubled, a["wte"]["weight"].compute() * 2)


def test_chunks_hold_one_element_count_whatever_the_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fk.open` chunks hold about CHUNK_ELEMENTS elements in every dtype (not one byte size): a merge
    computes narrower floats in float32, so its memory per chunk follows the element count, and a
    bfloat16 merge then takes the same share of its (half-size) checkpoint as a float32 one."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    monkeypatch.setattr(dask_adapter, "CHUNK_ELEMENTS", 256)  # 16 rows of 16
    for name, dt in (("f32", np.float32), ("f64", np.float64), ("bf16", ml_dtypes.bfloat16)):
        _, p = checkpoints(tmp_path / name, n=1, dtype=dt)
        x = fk.open(p[0])["wte"]["weight"]
        assert x.chunks[0] == (16,) * 4, (name, x.chunks)
        np.testing.assert_array_equal(x.compute(), fk.load(p[0])["wte"]["weight"])


def test_save_streams_block_by_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _models, paths = checkpoints(tmp_path)
    monkeypatch.setattr(dask_adapter, "CHUNK_ELEMENTS", 64)  # tensors of 64 rows of 16 -> 16 blocks of 4 rows
    lazy = [fk.open(p) for p in paths]
    assert lazy[0]["wte"]["weight"].numblocks == (16, 1)
    merged = fk.mean(lazy)
    with Computes() as c:
        fk.save(tmp_path / "merged", merged, shard_size=3000)
    assert c.n >= 2  # computed in several passes, not one
    _equal_trees(fk.load(tmp_path / "merged"), fk.mean([fk.load(p) for p in paths]))


def test_save_never_pickles_what_a_block_is_written_by(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``dask.array.store`` tokenizes every target; a sink's own token (``__dask_tokenize__``) keeps
    Dask from pickling the writer with the lazy array and its graph for that (0.2 s of a 1 s merge
    of three 220 MB checkpoints). Fails if the token is gone: Dask's default pickles the object."""
    from functorkit import _ckpt_write

    _models, paths = checkpoints(tmp_path)
    monkeypatch.setattr(dask_adapter, "CHUNK_ELEMENTS", 64)
    merged = fk.mean([fk.open(p) for p in paths])
    pickled: list[object] = []

    def spy(self: object, protocol: int) -> object:
        pickled.append(self)
        return object.__reduce_ex__(self, protocol)

    monkeypatch.setattr(_ckpt_write._RowSink, "__reduce_ex__", spy, raising=False)
    fk.save(tmp_path / "merged", merged, shard_size=3000)
    assert pickled == []
    _equal_trees(fk.load(tmp_path / "merged"), fk.mean([fk.load(p) for p in paths]))
    sinks = [dask_adapter._Sink(print), dask_adapter._Sink(print)]
    assert dask.base.tokenize(sinks[0]) == dask.base.tokenize(sinks[0]) != dask.base.tokenize(sinks[1])


@pytest.mark.parametrize("scheduler", ["threads", "sync"])
def test_a_lazy_array_that_computes_another_dtype_or_size_is_refused(tmp_path: Path, scheduler: str) -> None:
    """Each written block is checked against the header already written: a graph whose declared
    dtype or chunks lie gives an error naming the key, and nothing is left at the path."""
    x = da.ones((8, 4), chunks=(2, 4), dtype=np.float32)
    wrong_dtype = x.map_blocks(lambda b: b.astype(np.float64), dtype=np.float32)
    wrong_rows = x.map_blocks(lambda b: np.ones((1, 4), np.float32), dtype=np.float32)
    with dask.config.set(scheduler=scheduler):
        with pytest.raises(TypeError, match=r"'w' computed to dtype float64, expected float32"):
            fk.save(tmp_path / "a.safetensors", {"w": wrong_dtype, "ok": x})
        with pytest.raises(RuntimeError, match=r"'w' gave 16 bytes \(\(1, 4\)\) for its rows \d:\d, expected 32"):
            fk.save(tmp_path / "b.safetensors", {"w": wrong_rows})
    assert sorted(os.listdir(tmp_path)) == []


def test_a_key_missing_from_one_checkpoint_names_key_and_file(tmp_path: Path) -> None:
    models, paths = checkpoints(tmp_path, n=2)
    short = dict(models[1])
    del short["ln"]
    fk.save(tmp_path / "short.safetensors", short)
    first = fk.open(paths[0])
    with pytest.raises(fk.StructureError, match=r"short\.safetensors.*missing.*'ln\.scale'"):
        fk.open(tmp_path / "short.safetensors", like=first)
    wrong = fk.fmap(lambda x: x[:1], models[1])
    fk.save(tmp_path / "wrong.safetensors", wrong)
    with pytest.raises(fk.StructureError, match=r"wrong\.safetensors.*'wte\.weight'.*\(1, 16\)"):
        fk.open(tmp_path / "wrong.safetensors", like=first)
    # without like=, the arithmetic names the path where the keys differ
    with pytest.raises(fk.StructureError, match="ln"):
        fk.mean([first, fk.open(tmp_path / "short.safetensors")])


def test_failure_while_streaming_leaves_no_output(tmp_path: Path) -> None:
    _models, paths = checkpoints(tmp_path, n=2)
    lazy = fk.mean([fk.open(p) for p in paths])
    shard = sorted(os.listdir(paths[1]))[-2]
    os.remove(paths[1] / shard)  # a shard disappears after opening
    with pytest.raises(OSError, match=shard):
        fk.save(tmp_path / "out", lazy, shard_size=2000)
    with pytest.raises(OSError, match=shard):
        fk.save(tmp_path / "out.safetensors", lazy)
    assert sorted(os.listdir(tmp_path)) == ["m0", "m1"]


# forkserver (Linux): one fresh server process (no torch/JAX threads in it: JAX refuses plain fork)
# forks the workers, which start in seconds instead of ~15 s of fresh imports each (spawn).
_START = "forkserver" if sys.platform.startswith("linux") else "spawn"


def test_distributed_local_cluster_is_bit_identical(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    models, paths = checkpoints(tmp_path)
    expected = fk.mean([fk.load(p) for p in paths])
    task = fk.add(fk.load(paths[0]), fk.scale(0.5, fk.sub(fk.load(paths[1]), fk.load(paths[2]))))
    with (
        dask.config.set({"distributed.worker.multiprocessing-method": _START}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        distributed.Client(cluster),
    ):
        lazy = [fk.open(p) for p in paths]
        fk.save(tmp_path / "soup", fk.mean(lazy), shard_size=2000)
        fk.save(tmp_path / "task.safetensors", fk.add(lazy[0], fk.scale(0.5, fk.sub(lazy[1], lazy[2]))))
        dist = float(fk.norm(fk.sub(lazy[0], lazy[1])))
    _equal_trees(fk.load(tmp_path / "soup"), expected)
    _equal_trees(fk.load(tmp_path / "task.safetensors"), task)
    assert dist == float(dask.compute(fk.norm(fk.sub(fk.open(paths[0]), fk.open(paths[1]))))[0])
    torch = pytest.importorskip("torch")
    like = fk.fmap(torch.from_numpy, models[0])
    tmean = fk.mean([fk.load(p, like=like) for p in paths])
    got = fk.load(tmp_path / "soup", like=like)
    for x, y in zip(fk.leaves(got), fk.leaves(tmean), strict=True):
        assert torch.equal(x, y)
