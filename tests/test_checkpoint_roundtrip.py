"""Exact keys and metadata: load -> save writes the keys it read, user metadata is only metadata,
`__metadata__` is refused as a model key, and `KeyPath.parse(str(p)) == p` for every key
functorkit produces (hypothesis)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import functorkit as fk

from conftest import importable


def stored_keys(path: Path) -> list[str]:
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    head = json.loads(path.read_bytes()[8 : 8 + n])
    head.pop("__metadata__", None)
    return sorted(head)


def write_raw(path: Path, keys: list[str]) -> None:
    """A file with these keys (written by the safetensors format rules, not by fk.save)."""
    head: dict[str, Any] = {}
    for i, k in enumerate(keys):
        head[k] = {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
    text = json.dumps(head).encode()
    data = np.arange(len(keys), dtype="<f4").tobytes()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


KEYS = [
    "h.01",  # was rewritten to h.1
    "a[0]",  # was rewritten to a.0
    "n.-1",
    "layers.0.w",
    "layers.10.w",
    "x..y",
    ".lead",
    "trail.",
    "u.é.٣",
    "b'x'",
    "sp ace.k",
]


def test_load_then_save_keeps_every_key(tmp_path: Path) -> None:
    src = tmp_path / "src.safetensors"
    write_raw(src, KEYS)
    back = fk.load(src)
    assert back["layers"][0]["w"].tolist() == [3.0]  # canonical digit runs still become int keys
    assert "01" in back["h"]
    assert "-1" in back["n"]
    fk.save(tmp_path / "again.safetensors", back)
    assert stored_keys(tmp_path / "again.safetensors") == sorted(KEYS)
    again = fk.load(tmp_path / "again.safetensors")
    assert fk.leaves(again)
    assert [x.tolist() for x in fk.leaves(again)] == [x.tolist() for x in fk.leaves(back)]


def test_keys_that_do_not_nest_load_flat_and_round_trip(tmp_path: Path) -> None:
    src = tmp_path / "src.safetensors"
    write_raw(src, ["a", "a.b", "c.d", ""])
    back = fk.load(src)
    assert sorted(back) == ["", "a", "a.b", "c.d"]  # a flat dict: "a" is a tensor and a prefix
    fk.save(tmp_path / "again.safetensors", back)
    assert stored_keys(tmp_path / "again.safetensors") == ["", "a", "a.b", "c.d"]
    if importable("dask"):
        assert sorted(fk.open(src)) == ["", "a", "a.b", "c.d"]


def test_sharded_and_lazy_round_trips_keep_keys(tmp_path: Path) -> None:
    src = tmp_path / "src.safetensors"
    write_raw(src, KEYS)
    fk.save(tmp_path / "sh", fk.load(src), shard_size=8)
    assert sorted(json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())["weight_map"]) == sorted(
        KEYS
    )
    pytest.importorskip("dask")
    fk.save(tmp_path / "lazy.safetensors", fk.open(tmp_path / "sh"))
    assert stored_keys(tmp_path / "lazy.safetensors") == sorted(KEYS)


def test_user_metadata_is_never_read_as_ties(tmp_path: Path) -> None:
    # reproducer 5: metadata={"base": "w"} made an extra key 'base'
    path = tmp_path / "m.st"
    fk.save(path, {"w": np.ones(1)}, metadata={"base": "w", "w": "w"})
    out = fk.load(path)
    assert sorted(out) == ["w"]
    if importable("dask"):
        assert sorted(fk.open(path)) == ["w"]
    assert sorted(fk.load(path, like={"w": np.zeros(1)})) == ["w"]
    fk.save(tmp_path / "s", {"w": np.ones(1)}, metadata={"base": "w"}, shard_size=8)
    assert sorted(fk.load(tmp_path / "s")) == ["w"]


def test_save_model_style_ties_are_still_read_from_foreign_files(tmp_path: Path) -> None:
    st_np = pytest.importorskip("safetensors.numpy")
    path = tmp_path / "hf.safetensors"
    st_np.save_file({"w": np.ones(2, np.float32)}, str(path), metadata={"tied": "w"})
    out = fk.load(path)
    assert out["tied"] is out["w"]


def test_a_model_key_named_metadata_is_refused(tmp_path: Path) -> None:
    with pytest.raises(fk.StructureError, match=r"__metadata__.*rename"):
        fk.save(tmp_path / "m.safetensors", {"__metadata__": np.ones(1)})
    with pytest.raises(fk.StructureError, match="__metadata__"):
        fk.save(tmp_path / "d", {"__metadata__": np.ones(1)}, shard_size=8)
    assert list(tmp_path.iterdir()) == []


def test_tie_records_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "t.safetensors"
    w = np.ones(2)
    fk.save(path, {"a": w, "b": w})
    out = fk.load(path)
    assert out["b"] is out["a"]
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8 : 8 + n])
    # the last: an alias with a lone surrogate escape, which no file could store as a key
    for bad in ('{"b": "zzz"}', '["b"]', '{"a": "a"}', "{oops", '{"\\ud800": "a"}'):
        head["__metadata__"]["functorkit.ties"] = bad
        text = json.dumps(head).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
        with pytest.raises(fk.StructureError, match=r"functorkit\.ties"):
            fk.load(path)


# ----------------------------------------------------------------------------- KeyPath round trips

_atoms = st.one_of(
    st.text(max_size=6),
    st.text(alphabet="]['\".\\ab0", max_size=6),
    st.integers(-(10**20), 10**20),
    st.binary(max_size=6),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)
_keys = st.one_of(_atoms, st.tuples(_atoms, _atoms), st.tuples(st.tuples(_atoms), _atoms))


@settings(max_examples=400, deadline=None)
@given(st.lists(_keys, max_size=5))
def test_keypath_parse_of_str_gives_the_path_back(entries: list[Any]) -> None:
    p = fk.KeyPath(entries)
    q = fk.KeyPath.parse(str(p))
    assert q == p
    assert [type(a) for a in q] == [type(a) for a in p]  # -1 stays an int, "1" a string, b"x" bytes


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet="ab_.[]0", max_size=4), st.integers(0, 10**6)), min_size=1, max_size=4))
def test_checkpoint_keys_round_trip_through_a_file(tmp_path_factory: Any, entries: list[Any]) -> None:
    # whatever dotted key a model has, loading the file and saving again writes exactly it
    path = fk.KeyPath(entries)
    folder = tmp_path_factory.mktemp("k")
    tree: Any = np.ones(1)
    for e in reversed(entries):
        tree = {e: tree}
    fk.save(folder / "a.safetensors", tree)
    fk.save(folder / "b.safetensors", fk.load(folder / "a.safetensors"))
    assert stored_keys(folder / "b.safetensors") == [path.dotted]


def test_dotted_is_lossy_where_documented() -> None:
    assert fk.KeyPath.parse(fk.KeyPath(("n", -1)).dotted) == fk.KeyPath(("n", "-1"))
    assert fk.KeyPath.parse(fk.KeyPath(("n", "1")).dotted) == fk.KeyPath(("n", 1))
    assert fk.KeyPath.parse(str(fk.KeyPath(("n", -1)))) == fk.KeyPath(("n", -1))


@pytest.mark.skipif(not importable("dask"), reason="fk.open needs Dask")
def test_zero_dimensional_tensors_read_lazily_and_eagerly(tmp_path: Path) -> None:
    # a 0-d tensor's bytes are read through a 1-element view (a 0-d array cannot be viewed as bytes)
    model = {"step": np.asarray(7, dtype=np.int64), "t": np.asarray(0.5, dtype=np.float32), "w": np.ones(3)}
    fk.save(tmp_path / "m.safetensors", model)
    for got in (fk.open(tmp_path / "m.safetensors"), fk.load(tmp_path / "m.safetensors")):
        assert np.asarray(got["step"]).shape == ()
        assert int(np.asarray(got["step"])) == 7
        assert np.asarray(got["t"]).dtype == np.float32
        assert float(np.asarray(got["t"])) == 0.5
