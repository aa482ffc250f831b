"""Checkpoints you can trust (issue 20): shard paths, what fk.save may replace, atomic replacement
under an exception or a KeyboardInterrupt at every filesystem step, long names, honest loaded and
lazy arrays. Every reproducer of the issue is a test here or in test_checkpoint_malformed.py /
test_checkpoint_roundtrip.py."""

from __future__ import annotations

import builtins
import json
import os
import re
import shutil
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, importable, to_numpy

INDEX = "model.safetensors.index.json"
#: fk.open needs Dask (absent from the lite session)
READERS: list[Any] = [fk.load] + ([fk.open] if importable("dask") else [])
needs_dask = pytest.mark.skipif(not importable("dask"), reason="fk.open needs dask")


def _files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# ----------------------------------------------------------------------------- paths


def test_an_index_may_not_point_outside_its_directory(tmp_path: Path) -> None:
    # reproducer 1: "../out.safetensors" and "/etc/passwd" were opened and parsed
    fk.save(tmp_path / "out.safetensors", {"s": np.ones(1)})
    ck = tmp_path / "ck"
    ck.mkdir()
    for name in ("../out.safetensors", str(tmp_path / "out.safetensors"), "/etc/passwd", "sub/x.safetensors", ".", ""):
        (ck / INDEX).write_text(json.dumps({"weight_map": {"s": name}}))
        for read in READERS:
            with pytest.raises(fk.StructureError, match="not a plain file name") as e:
                read(ck)
            assert INDEX in str(e.value)


def test_a_symlink_leaving_the_directory_is_refused_one_inside_is_read(tmp_path: Path) -> None:
    fk.save(tmp_path / "out.safetensors", {"s": np.ones(1)})
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "shard.safetensors").symlink_to(tmp_path / "out.safetensors")
    (ck / INDEX).write_text(json.dumps({"weight_map": {"s": "shard.safetensors"}}))
    with pytest.raises(fk.StructureError, match=r"symbolic link.*outside"):
        fk.load(ck)
    (ck / INDEX).unlink()  # a directory holding one .safetensors file: the same rule
    with pytest.raises(fk.StructureError, match="outside"):
        fk.load(ck)
    (ck / "shard.safetensors").unlink()
    shutil.copy(tmp_path / "out.safetensors", ck / "real.safetensors")
    (ck / "shard.safetensors").symlink_to("real.safetensors")  # inside: fine
    (ck / INDEX).write_text(json.dumps({"weight_map": {"s": "shard.safetensors"}}))
    assert fk.load(ck)["s"].tolist() == [1.0]


def test_a_symlink_loop_is_refused(tmp_path: Path) -> None:
    # a shard (or a checkpoint file) that is a loop of symbolic links: was a raw OSError [Errno 40]
    ck = tmp_path / "ck"
    fk.save(ck, {"a": np.ones(2), "b": np.ones(2)}, shard_size=16)
    doc = json.loads((ck / INDEX).read_text())
    doc["weight_map"]["a"] = "loop1"
    (ck / INDEX).write_text(json.dumps(doc))
    (ck / "loop1").symlink_to("loop2")
    (ck / "loop2").symlink_to("loop1")
    for read in READERS:
        with pytest.raises(fk.StructureError, match=r"ck/loop1: .*loop of symbolic links"):
            read(ck)
    with pytest.raises(FileExistsError, match="cannot read"):  # fk.save replaces only what it can read
        fk.save(ck, {"a": np.ones(2)}, shard_size=16)
    assert (ck / INDEX).read_text() == json.dumps(doc)
    single = tmp_path / "self.safetensors"
    single.symlink_to("self.safetensors")
    for read in READERS:
        with pytest.raises(fk.StructureError, match=r"self\.safetensors: .*loop of symbolic links"):
            read(single)


def test_a_shard_name_too_long_for_the_file_system_is_a_missing_shard(tmp_path: Path) -> None:
    # was a raw OSError [Errno 36] in fk.save into that directory
    ck = tmp_path / "ck"
    fk.save(ck, {"a": np.ones(2)}, shard_size=16)
    (ck / INDEX).write_text(json.dumps({"weight_map": {"a": "x" * 300}}))
    for read in READERS:
        with pytest.raises(FileNotFoundError, match="x" * 300):
            read(ck)
    with pytest.raises(FileExistsError, match="cannot read"):
        fk.save(ck, {"a": np.ones(2)}, shard_size=16)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    def hung(*_: Any) -> None:
        raise AssertionError("reading a FIFO hung")

    signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)  # a hang fails the test instead of the suite
    try:
        _fifos(tmp_path)
    finally:
        signal.alarm(0)


def _fifos(tmp_path: Path) -> None:
    fifo = tmp_path / "p.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(fk.StructureError, match="regular file, found a FIFO"):
        fk.load(fifo)
    ck = tmp_path / "ck"
    ck.mkdir()
    os.mkfifo(ck / "model-00001-of-00001.safetensors")
    (ck / INDEX).write_text(json.dumps({"weight_map": {"s": "model-00001-of-00001.safetensors"}}))
    with pytest.raises(fk.StructureError, match="FIFO"):
        READERS[-1](ck)
    (ck / INDEX).unlink()
    os.mkfifo(ck / INDEX)  # the index itself
    with pytest.raises(fk.StructureError, match="FIFO"):
        fk.load(ck)


# ----------------------------------------------------------------------------- what save owns


def test_a_sharded_save_never_deletes_files_it_did_not_write(tmp_path: Path) -> None:
    # reproducer 2: opt.safetensors and ema.safetensors were deleted
    r = tmp_path / "r"
    r.mkdir()
    fk.save(r / "opt.safetensors", {"m": np.ones(1)})
    fk.save(r / "ema.safetensors", {"e": np.ones(1)})
    before = {n: (r / n).read_bytes() for n in _files(r)}
    with pytest.raises(FileExistsError, match=r"not a checkpoint directory.*ema\.safetensors, opt\.safetensors.*Fix"):
        fk.save(r, {"w": np.ones(1)}, shard_size=100)
    assert {n: (r / n).read_bytes() for n in _files(r)} == before


def test_resaving_a_checkpoint_replaces_its_shards_and_keeps_other_files(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    fk.save(ck, {"a": np.ones(100), "b": np.ones(100)}, shard_size=800)
    (ck / "config.json").write_text("{}")
    (ck / "README.md").write_text("mine")
    old = set(json.loads((ck / INDEX).read_text())["weight_map"].values())
    for k in range(3):  # the names alternate: the new shards never overwrite the old before the commit
        fk.save(ck, {"a": np.full(100, float(k)), "c": np.zeros(3)}, shard_size=800)
        new = set(json.loads((ck / INDEX).read_text())["weight_map"].values())
        assert not new & old
        assert set(_files(ck)) == {INDEX, "config.json", "README.md", *new}
        back = fk.load(ck)
        assert sorted(back) == ["a", "c"]
        assert back["a"].tolist() == [float(k)] * 100
        old = new
    assert (ck / "README.md").read_text() == "mine"
    # an empty directory is fine too
    (tmp_path / "empty").mkdir()
    fk.save(tmp_path / "empty", {"a": np.ones(2)}, shard_size=8)
    assert fk.load(tmp_path / "empty")["a"].tolist() == [1.0, 1.0]


def test_save_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my thesis")
    with pytest.raises(FileExistsError, match=r"notes\.txt exists and is not a safetensors checkpoint.*Fix"):
        fk.save(notes, {"a": np.ones(2)})
    assert notes.read_text() == "my thesis"
    with pytest.raises(FileExistsError, match="is a regular file, not a checkpoint directory"):
        fk.save(notes, {"a": np.ones(2)}, shard_size=8)
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(FileExistsError, match=r"is a directory.*shard_size"):
        fk.save(d, {"a": np.ones(2)})
    fk.save(d, {"a": np.ones(2)}, shard_size=8)
    (d / INDEX).write_text("{broken")
    with pytest.raises(FileExistsError, match="cannot read"):
        fk.save(d, {"a": np.ones(2)}, shard_size=8)
    assert (d / INDEX).read_text() == "{broken"
    assert notes.read_text() == "my thesis"


# ----------------------------------------------------------------------------- what save writes


@pytest.mark.parametrize("shard_size", [None, 8])
@pytest.mark.parametrize("key", ["functorkit.ties", "functorkit.pieces", "total_size"])
def test_metadata_keys_functorkit_writes_are_refused_at_save(
    key: str, shard_size: int | None, tmp_path: Path, backend: Backend, xp: Any
) -> None:
    # a user "functorkit.pieces" was copied into the index, where fk.load read it as the record of
    # pieces (the checkpoint could not be read); a user "total_size" was overwritten there
    model = {"a": xp.asarray(np.ones(2, np.float32)), "b": xp.asarray(np.zeros(2, np.float32))}
    with pytest.raises(fk.StructureError, match=rf"metadata key '{re.escape(key)}' is reserved.*fix: rename"):
        fk.save(tmp_path / "ck", model, shard_size=shard_size, metadata={"step": "1", key: "my notes"})
    assert _files(tmp_path) == []


def test_user_metadata_of_a_sharded_checkpoint_is_only_metadata(tmp_path: Path, backend: Backend, xp: Any) -> None:
    model = {"a": xp.asarray(np.ones(2, np.float32)), "b": xp.asarray(np.zeros(2, np.float32))}
    meta = {"step": "1000", "functorkit.notes": "mine", "b": "a"}  # "b": "a" looks like a tie record
    fk.save(tmp_path / "ck", model, shard_size=8, metadata=meta)
    index = json.loads((tmp_path / "ck" / INDEX).read_text())["metadata"]
    assert {k: index[k] for k in meta} == meta
    assert index["total_size"] == 16
    for read in READERS:
        back = read(tmp_path / "ck")
        assert sorted(back) == ["a", "b"]
        assert to_numpy(back["b"]).tolist() == [0.0, 0.0]  # not read as a tie of "a"


@pytest.mark.parametrize("shard_size", [None, 8])
def test_text_without_a_utf8_form_is_refused_at_save(
    shard_size: int | None, tmp_path: Path, backend: Backend, xp: Any
) -> None:
    # a lone surrogate ("\ud800") is no Unicode: fk.save wrote it as a JSON escape, which the
    # safetensors package refuses (and fk.load now too)
    x = xp.asarray(np.ones(2, np.float32))
    for model, meta, what in (
        ({"\ud800": x}, None, "the model key '\\ud800'"),
        ({"a": {"b\udc80": x}}, None, "the model key 'a.b\\udc80'"),
        ({"w": x}, {"note": "\udc80"}, "the metadata value of 'note'"),
        ({"w": x}, {"\ud800": "v"}, "the metadata key ('\\ud800')"),
    ):
        with pytest.raises(fk.StructureError, match=re.escape(what) + ".*lone UTF-16 surrogate.*Fix"):
            fk.save(tmp_path / "ck", model, metadata=meta, shard_size=shard_size)
        assert _files(tmp_path) == []
    # text that is Unicode, ASCII or not, is stored as it is, and the package reads it
    path = tmp_path / "ok.safetensors"
    fk.save(path, {"\U0001f600": x, "\u00e9": xp.asarray(np.zeros(2, np.float32))}, metadata={"\u043a": "\u5024"})
    assert sorted(fk.load(path)) == sorted(["\U0001f600", "\u00e9"])
    if importable("safetensors"):
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            assert sorted(f.keys()) == sorted(["\U0001f600", "\u00e9"])
            assert f.metadata()["\u043a"] == "\u5024"


@pytest.mark.parametrize("length", [236, 250, 255])
def test_long_file_names(length: int, tmp_path: Path) -> None:
    f = tmp_path / ("f" * (length - len(".safetensors")) + ".safetensors")
    fk.save(f, {"a": np.ones(2)})
    fk.save(f, {"a": np.zeros(2)})  # replaced, through a temporary name that fits NAME_MAX
    assert fk.load(f)["a"].tolist() == [0.0, 0.0]
    d = tmp_path / ("d" * length)
    fk.save(d, {"a": np.ones(2)}, shard_size=8)
    fk.save(d, {"a": np.zeros(2)}, shard_size=8)
    assert fk.load(d)["a"].tolist() == [0.0, 0.0]
    assert sorted(os.listdir(tmp_path)) == sorted([f.name, d.name])


# ----------------------------------------------------------------------------- atomic replacement


class _Faults:
    """Counts the filesystem steps of a save and raises `exc` at step `at` (1-based)."""

    def __init__(self, at: int, exc: BaseException) -> None:
        self.at, self.exc, self.count = at, exc, 0

    def step(self) -> None:
        self.count += 1
        if self.count == self.at:
            raise self.exc

    def wrap(self, fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self.step()
            return fn(*args, **kwargs)

        return wrapped


class _File:
    def __init__(self, f: Any, faults: _Faults) -> None:
        self._f, self._faults = f, faults

    def write(self, data: Any) -> int:
        self._faults.step()
        return int(self._f.write(data))

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


_STEPS = ("replace", "rename", "remove", "unlink", "rmdir", "mkdir", "open", "listdir", "link")


def _inject(m: pytest.MonkeyPatch, faults: _Faults) -> None:
    for name in _STEPS:
        m.setattr(os, name, faults.wrap(getattr(os, name)))
    if hasattr(os, "pwrite"):  # fk.save writes a file's data at offsets (os.pwrite)
        m.setattr(os, "pwrite", faults.wrap(os.pwrite))
    m.setattr(shutil, "rmtree", faults.wrap(shutil.rmtree))
    if hasattr(os, "fsync"):
        m.setattr(os, "fsync", faults.wrap(os.fsync))
    real_open = builtins.open

    def fopen(*args: Any, **kwargs: Any) -> Any:
        faults.step()
        return _File(real_open(*args, **kwargs), faults)

    m.setattr(builtins, "open", fopen)


def _state(path: Path) -> Any:
    out = fk.load(path)
    return {k: v.tolist() for k, v in sorted(out.items())}


@pytest.mark.parametrize("exc", [OSError("injected"), KeyboardInterrupt()], ids=["OSError", "KeyboardInterrupt"])
@pytest.mark.parametrize("layout", ["file", "new file", "dir", "new dir", "dir and others"])
def test_a_fault_at_any_step_leaves_the_old_or_the_new_checkpoint(
    layout: str, exc: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_model = {"a": np.ones(40), "b": np.zeros(40)}
    new_model = {"a": np.full(40, 2.0), "c": np.full(3, 5.0)}
    shard = None if layout.endswith("file") else 200
    target = tmp_path / "work" / ("ck.safetensors" if shard is None else "ck")
    pristine = tmp_path / "pristine"
    pristine.mkdir()
    if not layout.startswith("new"):
        fk.save(pristine / target.name, old_model, shard_size=shard)
    if layout == "dir and others":
        (pristine / target.name / "config.json").write_text("{}")
    old, new = _state_of(old_model), _state_of(new_model)
    at = 1
    while True:
        shutil.rmtree(tmp_path / "work", ignore_errors=True)
        shutil.copytree(pristine, tmp_path / "work", symlinks=True)
        faults = _Faults(at, exc)
        with monkeypatch.context() as m:
            _inject(m, faults)
            try:
                fk.save(target, new_model, shard_size=shard)
            except (OSError, KeyboardInterrupt) as e:
                assert e is exc or e.__cause__ is exc, e  # noqa: PT017 -- the fault may come at any step
                failed = True
            else:
                failed = False
        if layout.startswith("new") and failed and not os.path.lexists(target):
            pass  # nothing was there, nothing is there
        else:
            found = _state(target)
            assert found in (old, new), f"step {at}: {found}"
            if not failed:
                assert found == new
        if layout == "dir and others":
            assert (target / "config.json").read_text() == "{}"
        leftovers = [n for n in os.listdir(target.parent) if n.startswith(".fk-tmp-")]
        if target.is_dir():
            leftovers += [n for n in os.listdir(target) if n.startswith(".fk-tmp-")]
        assert not leftovers, f"step {at}: {leftovers}"
        if faults.count < at:  # the save ran through without reaching the injected step
            break
        at += 1
    assert at > 5  # the save has steps: the faults were really injected


def _state_of(model: dict[str, Any]) -> Any:
    return {k: v.tolist() for k, v in sorted(model.items())}


# ----------------------------------------------------------------------------- honest arrays


def test_loaded_arrays_own_their_memory_and_ignore_later_changes(tmp_path: Path, backend: Backend, xp: Any) -> None:
    path = tmp_path / "x.safetensors"
    like = {"a": xp.asarray(np.arange(4.0)), "b": xp.asarray(np.full(4, 7.0))}
    fk.save(path, like)
    plain, shaped = fk.load(path), fk.load(path, like=like)
    with open(path, "r+b") as f:  # another program rewrites the data in place, then truncates
        f.seek(-32, os.SEEK_END)
        f.write(b"\xff" * 32)
        f.truncate(64)
    base = plain["a"].base  # the array, or a dtype view of one array that owns its memory (no map)
    assert plain["a"].flags.owndata or (base is not None and base.base is None and base.flags.owndata)
    assert plain["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert plain["b"].tolist() == [7.0] * 4
    # with like=, each library's arrays, holding what was read: Dask arrays too (chunked as like's;
    # fk.open is the lazy form, which refuses a changed file)
    np.testing.assert_array_equal(to_numpy(shaped["b"]), np.full(4, 7.0))
    np.testing.assert_array_equal(to_numpy(shaped["a"]), np.arange(4.0))
    if backend is Backend.DASK:
        assert shaped["a"].chunks == like["a"].chunks


def test_mmap_true_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    fk.save(path, {"a": np.arange(4.0)})
    mapped, owned = fk.load(path, mmap=True), fk.load(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(np.float64(9.0).tobytes())
    assert mapped["a"].tolist() == [0.0, 1.0, 2.0, 9.0]  # documented: mapped arrays follow the file
    assert owned["a"].tolist() == [0.0, 1.0, 2.0, 3.0]
    mapped["a"][0] = -1.0  # copy on write: the file is not changed
    assert fk.load(path)["a"].tolist() == [0.0, 1.0, 2.0, 9.0]
    with pytest.raises(TypeError, match="mmap"):
        fk.load(path, mmap="yes")  # type: ignore[arg-type]


@needs_dask
def test_a_lazy_model_refuses_a_file_replaced_after_open(tmp_path: Path) -> None:
    # reproducer 4: the old offsets were read from the new file: [-1, -1, -1, -1]
    path = tmp_path / "x.st"
    fk.save(path, {"a": np.arange(4.0), "b": np.full(4, 7.0)})
    lazy = fk.open(path)
    fk.save(path, {"b": -np.ones(4), "a": np.ones(4)})
    with pytest.raises(fk.StructureError, match=r"x\.st: the file changed since fk\.open.*inode.*'a'"):
        lazy["a"].compute()
    assert fk.open(path)["a"].compute().tolist() == [1.0] * 4  # opened again: fine
    # loaded into a model: the same StructureError, with the path (it was a PolicyError about
    # converting float64 into float64, whose fix was to cast `src`), and nothing written
    dst = {"a": np.zeros(4), "b": np.zeros(4)}
    with pytest.raises(fk.StructureError, match=r"at a: fk\.load_into: .*x\.st: the file changed since fk\.open"):
        fk.load_into(dst, lazy)
    assert dst["a"].tolist() == [0.0] * 4
    assert dst["b"].tolist() == [0.0] * 4


@needs_dask
def test_a_lazy_model_refuses_a_file_truncated_or_rewritten_in_place(tmp_path: Path) -> None:
    path = tmp_path / "x.st"
    fk.save(path, {"a": np.arange(4.0)})
    lazy = fk.open(path)
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(b"\0" * 8)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # in place: same inode, new time
    with pytest.raises(fk.StructureError, match="modification time"):
        lazy["a"].compute()
    lazy = fk.open(path)
    with open(path, "r+b") as f:
        f.truncate(64)
    with pytest.raises(fk.StructureError, match="size"):  # an error, never SIGBUS
        lazy["a"].compute()


# ----------------------------------------------------------------------------- unknown Dask shapes


def test_unknown_dask_shapes_are_clear_errors_naming_the_path(tmp_path: Path) -> None:
    da = pytest.importorskip("dask.array")
    x = da.arange(6.0, chunks=3)
    u = x[x > 2]  # shape (nan,)
    for call, where in (
        (lambda: fk.stack([{"w": u}, {"w": u}]), "fk.stack: at w"),
        (lambda: fk.unstack({"w": da.stack([u, u]).T}), "fk.unstack: at w"),
        (lambda: fk.summary({"w": u}), "fk.summary: at w"),
        (lambda: fk.save(tmp_path / "a.safetensors", {"w": u}), "fk.save: the array at 'w'"),
        (lambda: fk.load(tmp_path / "ok.safetensors", like={"w": u}), "fk.load: the array of `like` at 'w'"),
    ):
        fk.save(tmp_path / "ok.safetensors", {"w": np.ones(3)})
        with pytest.raises(fk.StructureError, match="unknown shape") as e:
            call()
        assert where in str(e.value)
        assert "compute_chunk_sizes" in str(e.value)
    assert not (tmp_path / "a.safetensors").exists()
