"""fk.save / fk.load: safetensors checkpoints with ties, on every backend; interop with the
`safetensors` package both ways; bad input gives clear errors and leaves no partial file."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, importable, to_numpy


def model_of(xp: Any) -> dict[str, Any]:
    w = xp.asarray(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    return {
        "embed": {"weight": w},
        "layers": [
            {"w": xp.asarray(np.linspace(-1, 1, 4)), "steps": xp.asarray(np.array([3, 4], dtype=np.int64))},
            {"w": xp.asarray(np.full(4, 0.5)), "mask": xp.asarray(np.array([True, False]))},
        ],
        "head": {"weight": w},  # tied to embed.weight
        "act": "tanh",
    }


KEYS = {"embed.weight", "layers.0.w", "layers.0.steps", "layers.1.w", "layers.1.mask"}


def _stored_keys(path: Path) -> set[str]:
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    head = json.loads(path.read_bytes()[8 : 8 + n])
    head.pop("__metadata__", None)
    return set(head)


def _files(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


# --------------------------------------------------------------------------- round trips


def test_round_trip_with_like_on_every_backend(xp: Any, backend: Backend, tmp_path: Path) -> None:
    model = model_of(xp)
    path = tmp_path / "m.safetensors"
    fk.save(path, model)
    assert _stored_keys(path) == KEYS  # the tied head is stored once
    out = fk.load(path, like=model)
    assert out["head"]["weight"] is out["embed"]["weight"]
    assert out["act"] == "tanh"
    for (p, a), (q, b) in zip(fk.leaves_with_path(model), fk.leaves_with_path(out), strict=True):
        assert p == q
        if isinstance(a, str):
            continue
        assert type(b) is type(a) or backend is Backend.NUMPY_READONLY
        assert b.dtype == a.dtype
        assert tuple(b.shape) == tuple(a.shape)
        np.testing.assert_array_equal(to_numpy(b), to_numpy(a))
        assert b is not a


def test_round_trip_without_like_gives_nested_dicts(xp: Any, tmp_path: Path) -> None:
    model = model_of(xp)
    fk.save(tmp_path / "m.safetensors", model)
    out = fk.load(tmp_path / "m.safetensors")
    assert set(out) == {"embed", "layers", "head"}
    assert set(out["layers"]) == {0, 1}  # digit runs become int keys
    assert out["head"]["weight"] is out["embed"]["weight"]
    assert isinstance(out["layers"][0]["w"], np.ndarray)
    np.testing.assert_array_equal(out["layers"][0]["steps"], [3, 4])
    np.testing.assert_array_equal(out["layers"][1]["mask"], [True, False])
    # saving the loaded tree again gives the same keys and ties
    fk.save(tmp_path / "again.safetensors", out)
    assert _stored_keys(tmp_path / "again.safetensors") == KEYS
    again = fk.load(tmp_path / "again.safetensors")
    assert again["head"]["weight"] is again["embed"]["weight"]


def test_loaded_numpy_arrays_are_private_and_writable(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fk.save(path, {"w": np.ones(3)})
    before = path.read_bytes()
    out = fk.load(path)
    out["w"][0] = 7.0  # writable, and the file is not changed
    assert path.read_bytes() == before
    assert fk.load(path)["w"].tolist() == [1.0, 1.0, 1.0]


def test_untied_like_gets_separate_arrays_from_a_tied_file(tmp_path: Path) -> None:
    w = np.ones(2)
    fk.save(tmp_path / "t.safetensors", {"a": w, "b": w})
    out = fk.load(tmp_path / "t.safetensors", like={"a": np.zeros(2), "b": np.zeros(2)})
    assert not np.shares_memory(out["a"], out["b"])
    out["a"][0] = 5.0
    assert out["b"][0] == 1.0


def test_metadata_is_stored(tmp_path: Path) -> None:
    safetensors = pytest.importorskip("safetensors")
    path = tmp_path / "m.safetensors"
    w = np.ones(2, dtype=np.float32)
    fk.save(path, {"a": w, "b": w}, metadata={"format": "np", "step": "10"})
    with safetensors.safe_open(str(path), framework="np") as f:
        meta = f.metadata()
        assert set(f.keys()) == {"a"}
    assert meta["format"] == "np"
    assert meta["step"] == "10"
    assert json.loads(meta["functorkit.ties"]) == {"b": "a"}


def test_numpy_interop_both_ways(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.numpy")
    model = model_of(np)
    fk.save(tmp_path / "fk.safetensors", model)
    theirs = st.load_file(str(tmp_path / "fk.safetensors"))
    assert set(theirs) == KEYS
    np.testing.assert_array_equal(theirs["layers.0.w"], model["layers"][0]["w"])
    st.save_file({"x.0.w": np.arange(3, dtype=np.int32), "y": np.ones((2, 2), np.float16)}, str(tmp_path / "st"))
    out = fk.load(tmp_path / "st")
    np.testing.assert_array_equal(out["x"][0]["w"], [0, 1, 2])
    assert out["y"].dtype == np.float16


# --------------------------------------------------------------------------- torch modules


def _torch_net() -> Any:
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def _tied_lm() -> Any:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.body = nn.Sequential(nn.Linear(3, 3), nn.LayerNorm(3))
            self.head = nn.Linear(3, 5, bias=False)
            self.head.weight = self.embed.weight

    return LM()


def test_torch_keys_are_state_dict_keys_and_safetensors_loads_them(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    torch = pytest.importorskip("torch")
    net = _torch_net()
    fk.save(tmp_path / "n.safetensors", net)
    assert _stored_keys(tmp_path / "n.safetensors") == set(net.state_dict())
    other = _torch_net()
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    missing, unexpected = st.load_model(other, str(tmp_path / "n.safetensors"))
    assert not missing
    assert not unexpected
    for k, v in net.state_dict().items():
        assert torch.equal(other.state_dict()[k], v)


def test_torch_tied_model_both_ways(tmp_path: Path) -> None:
    st = pytest.importorskip("safetensors.torch")
    torch = pytest.importorskip("torch")
    lm = _tied_lm()
    # theirs -> ours: save_model records the removed tied key in its metadata; fk.load restores the tie
    st.save_model(lm, str(tmp_path / "theirs.safetensors"))
    back = fk.load(tmp_path / "theirs.safetensors", like=_tied_lm())
    assert back.head.weight is back.embed.weight
    assert isinstance(back.embed.weight, torch.nn.Parameter)
    for k, v in lm.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    # ours -> theirs
    fk.save(tmp_path / "ours.safetensors", lm)
    fresh = _tied_lm()
    missing, unexpected = st.load_model(fresh, str(tmp_path / "ours.safetensors"))
    assert not missing
    assert not unexpected
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.embed.weight, lm.embed.weight)
    plain = fk.load(tmp_path / "ours.safetensors")
    assert plain["head"]["weight"] is plain["embed"]["weight"]


def test_torch_load_keeps_parameters_and_gives_each_load_its_own_memory(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    net = _torch_net()
    fk.save(tmp_path / "n.safetensors", net)
    a = fk.load(tmp_path / "n.safetensors", like=net)
    b = fk.load(tmp_path / "n.safetensors", like=net)
    assert isinstance(a[0].weight, torch.nn.Parameter)
    assert a[0].weight.requires_grad
    assert not isinstance(a[1].running_mean, torch.nn.Parameter)
    # two loads read into memory of their own: writing one does not change the other
    with torch.no_grad():
        a[0].weight.add_(1.0)
    assert torch.equal(b[0].weight, net[0].weight)
    assert a[0].weight is not net[0].weight


def test_bfloat16_torch_and_numpy(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    t = {"x": torch.linspace(-2, 2, 5, dtype=torch.bfloat16), "y": torch.ones(2, dtype=torch.float16)}
    fk.save(tmp_path / "b.safetensors", t)
    back = fk.load(tmp_path / "b.safetensors", like=t)
    assert back["x"].dtype == torch.bfloat16
    assert torch.equal(back["x"], t["x"])
    if importable("safetensors"):
        from safetensors.torch import load_file

        assert torch.equal(load_file(str(tmp_path / "b.safetensors"))["x"], t["x"])
    if importable("ml_dtypes"):
        as_np = fk.load(tmp_path / "b.safetensors")["x"]
        assert str(as_np.dtype) == "bfloat16"
        np.testing.assert_array_equal(as_np.astype(np.float32), t["x"].float().numpy())


def test_bfloat16_without_ml_dtypes_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "b.safetensors"
    fk.save(path, {"y": np.ones(2, np.float32)})
    # rewrite the header's dtype by hand: F32 -> BF16 with half the bytes is invalid, so write a real BF16 file
    header = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x80\x3f\x00\x40")
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)
    with pytest.raises(TypeError, match=r"'x'.*b\.safetensors.*bfloat16.*ml_dtypes"):
        fk.load(path)


def test_jax_round_trip_with_bfloat16(tmp_path: Path) -> None:
    pytest.importorskip("jax")
    import jax.numpy as jnp

    w = jnp.arange(4.0, dtype=jnp.bfloat16)
    m = {"a": w, "b": [w, jnp.ones(2, dtype=jnp.float32)]}
    fk.save(tmp_path / "j.safetensors", m)
    out = fk.load(tmp_path / "j.safetensors", like=m)
    assert out["a"] is out["b"][0]
    assert out["a"].dtype == jnp.bfloat16
    assert bool(jnp.all(out["a"] == w))


# --------------------------------------------------------------------------- sharding


def test_sharded_save_writes_an_index_and_loads_back(tmp_path: Path) -> None:
    model = {f"l{i}": {"w": np.full((10, 10), float(i), np.float32)} for i in range(5)}  # 400 bytes each
    model["tied"] = model["l0"]["w"]
    fk.save(tmp_path / "ck", model, shard_size=1000)
    names = _files(tmp_path / "ck")
    assert names == [
        "model-00001-of-00003.safetensors",
        "model-00002-of-00003.safetensors",
        "model-00003-of-00003.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads((tmp_path / "ck" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == 2000
    assert index["weight_map"] == {
        "l0.w": names[0], "l1.w": names[0], "l2.w": names[1], "l3.w": names[1], "l4.w": names[2]
    }
    out = fk.load(tmp_path / "ck")
    assert out["tied"] is out["l0"]["w"]
    for i in range(5):
        np.testing.assert_array_equal(out[f"l{i}"]["w"], model[f"l{i}"]["w"])
    # a string size, and a tensor larger than a shard gets a shard of its own
    fk.save(tmp_path / "ck", model, shard_size="0.5KB")
    assert len(_files(tmp_path / "ck")) == 6  # five shards (old ones replaced) and the index


@pytest.mark.parametrize("bad", [0, -1, "big", "2XB", 1.5, True])
def test_bad_shard_size(bad: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="shard_size"):
        fk.save(tmp_path / "ck", {"w": np.ones(2)}, shard_size=bad)
    assert _files(tmp_path) == []


# --------------------------------------------------------------------------- bad input


def test_like_mismatches_are_reported_together_with_keys_and_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fk.save(path, {"a": np.ones(2), "b": np.ones(3), "c": np.ones(4, np.float32), "extra": np.ones(1)})
    like = {"a": np.ones(2), "b": np.ones(4), "c": np.ones(4), "gone": np.ones(1)}
    with pytest.raises(fk.StructureError) as err:
        fk.load(path, like=like)
    msg = str(err.value)
    assert str(path) in msg
    assert "missing" in msg
    assert "'gone'" in msg
    assert "unexpected" in msg
    assert "'extra'" in msg
    assert "'b'" in msg
    assert "(3,)" in msg
    assert "(4,)" in msg
    assert "'c'" in msg
    assert "float32" in msg
    assert "float64" in msg
    assert "'a'" not in msg


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fk.save(path, {"a": np.ones(2), "big": np.ones(100)})
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    with pytest.raises(fk.StructureError, match=r"m\.safetensors.*truncated.*'big'"):
        fk.load(path)
    path.write_bytes(data[:5])
    with pytest.raises(fk.StructureError, match=r"m\.safetensors.*not a valid safetensors"):
        fk.load(path)
    path.write_bytes(struct.pack("<Q", 4) + b"{oops")
    with pytest.raises(fk.StructureError, match="not JSON"):
        fk.load(path)


def test_missing_file_and_missing_shard(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        fk.load(tmp_path / "nope.safetensors")
    fk.save(tmp_path / "ck", {"a": np.ones(100), "b": np.ones(100)}, shard_size=800)
    (tmp_path / "ck" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model-00002-of-00002\.safetensors.*missing shard"):
        fk.load(tmp_path / "ck")


def test_failed_save_leaves_nothing_and_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    fk.save(path, {"a": np.ones(2)})
    before = path.read_bytes()
    with pytest.raises(TypeError, match=r"'b'.*complex128"):
        fk.save(path, {"a": np.zeros(2), "b": np.ones(2, np.complex128)})
    assert path.read_bytes() == before
    assert _files(tmp_path) == ["m.safetensors"]
    with pytest.raises(TypeError, match="metadata"):
        fk.save(tmp_path / "x", {"a": np.ones(2)}, metadata={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"functorkit\.ties"):
        fk.save(tmp_path / "x", {"a": np.ones(2)}, metadata={"functorkit.ties": "{}"})
    assert _files(tmp_path) == ["m.safetensors"]


def test_existing_directory_with_other_files_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a checkpoint directory"):
        fk.save(tmp_path / "ck", {"a": np.ones(2)}, shard_size="1MB")
    assert _files(tmp_path / "ck") == ["notes.txt"]
    assert _files(tmp_path) == ["ck"]


def test_key_collisions_and_bare_arrays(tmp_path: Path) -> None:
    with pytest.raises(fk.StructureError, match=r"'a\.b'"):
        fk.save(tmp_path / "m", {"a.b": np.ones(1), "a": {"b": np.ones(1)}})
    with pytest.raises(TypeError, match="single array"):
        fk.save(tmp_path / "m", np.ones(2))
    assert _files(tmp_path) == []


def test_like_with_a_non_persistent_buffer(tmp_path: Path) -> None:
    """A module's non-persistent buffer (a RoPE ``inv_freq``) is not stored: with ``like=`` the
    result holds a copy of `like`'s values (it held `like`'s tensor itself: an in-place op on the
    loaded model changed `like`); from a ``meta`` template, which holds none, a StructureError
    naming the buffer (the result kept it on meta, half a module, failing at its first forward)."""
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("inv_freq", torch.arange(2.0), persistent=False)

    path = tmp_path / "m.safetensors"
    fk.save(path, M())
    for load in (fk.load, fk.open):
        like = M()
        out = load(path, like=like)
        assert out.inv_freq is not like.inv_freq
        out.inv_freq.mul_(10)
        assert like.inv_freq.tolist() == [0.0, 1.0]
    with torch.device("meta"):
        template = M()
    with pytest.raises(fk.StructureError, match=r"fk\.load: at inv_freq: `like` holds an array that checkpoints"):
        fk.load(path, like=template)


def test_meta_tensor_cannot_be_saved(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"'w'.*meta"):
        fk.save(tmp_path / "m", {"w": torch.ones(2, device="meta")})
    assert _files(tmp_path) == []


def test_a_directory_holding_one_file_loads_and_other_directories_are_refused(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    fk.save(tmp_path / "one" / "model.safetensors", {"w": np.arange(3.0)})
    assert fk.load(tmp_path / "one")["w"].tolist() == [0.0, 1.0, 2.0]
    fk.save(tmp_path / "one" / "other.safetensors", {"w": np.arange(3.0)})
    with pytest.raises(FileNotFoundError, match=r"exactly one \.safetensors file"):
        fk.load(tmp_path / "one")


def test_non_persistent_buffers_are_not_stored(tmp_path: Path) -> None:
    # the keys of fk.save are fk.state_dict's: torch leaves non-persistent buffers out
    st = pytest.importorskip("safetensors.torch")
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(2, 2)
    net.register_buffer("scratch", torch.ones(2), persistent=False)
    path = tmp_path / "net.safetensors"
    fk.save(path, net)
    assert sorted(st.load_file(path)) == sorted(net.state_dict()) == ["bias", "weight"]
    other = torch.nn.Linear(2, 2)
    other.register_buffer("scratch", torch.zeros(2), persistent=False)
    missing, unexpected = st.load_model(other, path)
    assert not missing
    assert not unexpected
    assert torch.equal(other.weight, net.weight)
