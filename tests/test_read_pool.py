"""`fk.save` recycles the memory of the blocks it reads from `fk.open`ed files
(`_safetensors_io.ReadPool`): the same files with the pool on and off, buffers really reused, an
array still referred to (or a view of it) never overwritten, nothing kept after the save."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

da = pytest.importorskip("dask.array")

import functorkit as fk  # noqa: E402
from functorkit import _safetensors_io as io  # noqa: E402
from functorkit.adapters import dask as dask_adapter  # noqa: E402


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dask_adapter, "CHUNK_ELEMENTS", 64)  # 16 blocks of 4 rows of 16
    monkeypatch.setattr(io.ReadPool, "SMALL", 1)  # pool the test's small blocks too


def _checkpoints(tmp_path: Path, dtype: Any = np.float32) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for k in range(3):
        m = {"wte": rng.standard_normal((64, 16)).astype(dtype), "h": [rng.standard_normal((16, 16)).astype(dtype)]}
        paths.append(tmp_path / f"m{k}")
        fk.save(paths[-1], m, shard_size=3000)
    return paths


def _digest(folder: Path) -> list[str]:
    return [hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())]


MERGES = {
    "mean": lambda b, ms: fk.mean([b, *ms]),
    "ties": lambda b, ms: fk.ties(b, ms, [0.5, 0.5], density=0.5),
    "dare": lambda b, ms: fk.dare(b, ms, [0.5, 0.5], density=0.5, seed=1),
    "slerp": lambda b, ms: fk.slerp(b, ms[0], 0.3),
}


@pytest.mark.parametrize("name", list(MERGES))
def test_the_same_files_with_the_pool_on_and_off(
    name: str, tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    b, *ms = [fk.open(p) for p in _checkpoints(tmp_path)]
    before = io.POOL.reused
    fk.save(tmp_path / "on", MERGES[name](b, ms), shard_size=3000)
    assert io.POOL.reused > before, "no read buffer was reused"
    assert io.POOL._free == [], "the pool kept buffers after the save"
    monkeypatch.setattr(io, "READ_POOL", False)
    before = io.POOL.reused
    fk.save(tmp_path / "off", MERGES[name](b, ms), shard_size=3000)
    assert io.POOL.reused == before
    assert _digest(tmp_path / "on") == _digest(tmp_path / "off")


def _one_block(x: Any, i: int) -> np.ndarray:
    (v,) = x.blocks[i].to_delayed().reshape(-1)  # the chunk itself, as fk.save's tasks see it
    return v.compute(scheduler="sync")


def test_an_array_or_a_view_still_referred_to_is_never_reused(tmp_path: Path, small_blocks: None) -> None:
    x = fk.open(_checkpoints(tmp_path)[0])["wte"]
    with io.POOL.active():
        a = _one_block(x, 0)
        view = a[1:]
        want = view.copy()
        del a  # the view keeps the buffer: it must not be handed out
        reused = io.POOL.reused
        others = [_one_block(x, i) for i in range(1, 6)]
        assert io.POOL.reused == reused
        assert not any(np.shares_memory(view, o) for o in others)
        np.testing.assert_array_equal(view, want)
        del view, others
        c = _one_block(x, 7)  # now the buffers are free
        assert io.POOL.reused > reused
        np.testing.assert_array_equal(c, x.blocks[7].compute())
    assert io.POOL._free == []


def test_no_pool_outside_a_save(tmp_path: Path, small_blocks: None) -> None:
    x = fk.open(_checkpoints(tmp_path)[0])["wte"]
    before = io.POOL.reused
    for i in range(4):
        _one_block(x, i)
    assert io.POOL.reused == before
    assert io.POOL._free == []


@pytest.mark.parametrize("classes", [True, False])
def test_blocks_of_several_sizes_share_buffers(
    classes: bool, tmp_path: Path, small_blocks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks of several sizes (a checkpoint's full blocks, a tensor's shorter last block, blocks of
    another row width) reuse freed buffers (`ReadPool.CLASSES`: buffers of power-of-two size
    classes, a freed buffer that does not fit a read dropped): with the sync scheduler only the
    reads at a change of size make new memory. Off (each buffer its block's size, a misfit put
    back where the next read pops it again), most reads make new memory: this test fails when the
    classes are not used."""
    import dask

    monkeypatch.setattr(io.ReadPool, "CLASSES", classes)
    rng = np.random.default_rng(1)
    paths = []
    for k in range(3):  # blocks of 4 rows (256 or 240 bytes) and a last block of one row (64 or 60)
        m = {f"t{i}": rng.standard_normal((65, 16 if i % 2 else 15)).astype(np.float32) for i in range(6)}
        paths.append(tmp_path / f"m{k}")
        fk.save(paths[-1], m, shard_size=1 << 20)
    b, *ms = [fk.open(p) for p in paths]
    reads = 0
    real = io.ReadPool.empty

    def counted(self: Any, shape: tuple[int, ...], dtype: Any) -> Any:
        nonlocal reads
        reads += 1
        return real(self, shape, dtype)

    monkeypatch.setattr(io.ReadPool, "empty", counted)
    before = io.POOL.reused
    with dask.config.set(scheduler="sync"):
        fk.save(tmp_path / f"out{classes}", fk.mean([b, *ms]), shard_size=1 << 20)
    made = reads - (io.POOL.reused - before)
    assert reads == 3 * 6 * 17  # every block of every model read once
    if classes:
        assert made <= reads // 6, (made, reads)  # about two tasks' buffers per tensor (39 here)
    else:
        assert made > reads // 2, (made, reads)  # the same sizes misfit again and again (283 here)
    got = fk.load(tmp_path / f"out{classes}")
    want = fk.mean([fk.load(p) for p in paths])
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
