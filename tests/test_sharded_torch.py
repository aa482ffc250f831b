"""torch DTensor and FSDP2 models on two real gloo ranks (SPEC 17; docs/sharded.md).

The ranks start once for the module (tests/sharded_torch_worker.py, run by tests/sharded_harness.py)
and run every check there: each result is compared with the unsharded reference built from the same
seed, and the collectives made by each operation are counted (DTensor's and the functional ones
through ``CommDebugMode``, every eager ``torch.distributed`` call by patching), so that a silent
all-gather, or a per-rank partial sum, fails here.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

pytest.importorskip("torch")

from sharded_harness import gloo_available, run_torch_ranks

pytestmark = pytest.mark.skipif(not gloo_available(), reason="torch.distributed with gloo is not available")

SHARDED = ["DTensor:(Shard(dim=0),)", "DTensor:(Shard(dim=1),)", "DTensor:(Replicate(),)"]
ONE_ALL_REDUCE = {"all_reduce": 1}


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the ranks write their checkpoints (read here, in one process without a group)."""
    return tmp_path_factory.mktemp("sharded_ckpt")


@pytest.fixture(scope="module")
def ranks(ckpt_dir: Path) -> list[dict[str, Any]]:
    return run_torch_ranks("sharded_torch_worker.py", world=2, extra={"FK_CKPT_DIR": str(ckpt_dir)})


@pytest.fixture(scope="module")
def ranks4() -> list[dict[str, Any]]:
    """Four ranks, for a 2x2 mesh (HSDP's layout with both dimensions real): the 2-D checks only."""
    return run_torch_ranks("sharded_torch_worker.py", world=4, extra={"FK_ONLY": "mesh2d,fsdp_rebuilt_hsdp"})


def _ok(ranks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    out = [r[name] for r in ranks]
    for r, res in enumerate(out):
        assert "error" not in res, f"rank {r}: {res.get('error')}\n{res.get('trace', '')}"
    return out


def _refused(ranks: list[dict[str, Any]], name: str, kind: str, *words: str) -> None:
    for r in ranks:
        err = r[name].get("error")
        assert err is not None, f"{name} did not raise: {r[name]}"
        assert err.startswith(kind + ":"), err
        for w in words:
            assert w in err, (w, err)


def test_the_models_are_really_sharded(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "placements")
    assert res[0]["placements"] == SHARDED
    assert sorted(r["local_rows"] for r in res) == [2, 3]  # 5 rows over 2 ranks: uneven


@pytest.mark.parametrize("name", ["fmap", "fmap2", "add", "sub", "scale", "lincomb", "mean", "lerp", "copy"])
def test_elementwise_keeps_placements_without_communication(ranks: list[dict[str, Any]], name: str) -> None:
    for res in _ok(ranks, name):
        assert res["placements"] == SHARDED
        assert res["err"] <= 1e-6
        assert res["comms"] == {}


def test_stack_shifts_the_placements_by_one_axis(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "stack"):
        assert res["placements"] == ["DTensor:(Shard(dim=1),)", "DTensor:(Shard(dim=2),)", "DTensor:(Replicate(),)"]
        assert res["err"] == 0.0
        assert res["comms"] == {}


@pytest.mark.parametrize("name", ["add", "sub", "scale", "lincomb", "mean", "lerp"])
def test_out_writes_the_local_shards_in_place(ranks: list[dict[str, Any]], name: str) -> None:
    for res in _ok(ranks, f"{name}_out"):
        assert res["same"] is True
        assert res["placements"] == SHARDED
        assert res["err"] <= 1e-6
        assert res["comms"] == {}


def test_copy_is_independent(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "copy_independent"):
        assert res["err"] == 0.0


@pytest.mark.parametrize("name", ["load_into", "load_into_copy", "load_into_full"])
def test_load_into_copies_shard_to_shard(ranks: list[dict[str, Any]], name: str) -> None:
    for res in _ok(ranks, name):
        assert res["placements"] == SHARDED
        assert res["err"] == 0.0
        assert res["comms"] == {}
        assert res.get("same", True) is True
        assert res.get("no_alias", True) is True


def test_load_into_other_placements_is_refused_by_path(ranks: list[dict[str, Any]]) -> None:
    _refused(ranks, "load_into_mismatch", "PolicyError", "at w", "redistribute", "Replicate", "Shard(dim=0)")


@pytest.mark.parametrize("o", [2, 1, math.inf, -math.inf, 0, 3])
def test_norm_is_global_with_one_all_reduce(ranks: list[dict[str, Any]], o: float) -> None:
    res = _ok(ranks, f"norm_{o}")
    for r in res:
        assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
        assert r["comms"] == ONE_ALL_REDUCE
        assert (r["type"], r["placements"], r["ndim"]) == ("DTensor", "(Replicate(),)", 0)
    assert res[0]["value"] == res[1]["value"]  # every rank holds the same global value


def test_dot_is_global_with_one_all_reduce(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "dot")
    for r in res:
        assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
        assert r["comms"] == ONE_ALL_REDUCE
        assert r["placements"] == "(Replicate(),)"
    assert res[0]["value"] == res[1]["value"]


def test_all_finite_is_global_with_one_all_reduce(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "all_finite"):
        assert res["bad"] is False  # the NaN is on rank 1 only
        assert res["ok"] is True
        assert res["comms"] == res["comms_ok"] == ONE_ALL_REDUCE
        assert (res["dtype"], res["placements"]) == ("torch.bool", "(Replicate(),)")


def test_allclose_compares_shards_and_every_rank_gives_one_answer(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "allclose")
    for r in res:
        assert r["same"] is True
        assert r["bad"] is False  # the difference is on rank 1 only
        assert r["other_placements"] is False
        assert r["comms"] == ONE_ALL_REDUCE
    assert "at w:" in res[1]["message"]
    assert "another rank found a difference" in res[0]["message"]


def test_per_tensor_reductions_are_global(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "per_tensor")
    for r in res:
        for k in ("w", "v", "r"):
            assert r["dots"][k] == pytest.approx(r["dots_ref"][k], rel=1e-5, abs=1e-6)
            assert r["norms"][k] == pytest.approx(r["norms_ref"][k], rel=1e-5)
        # one all-reduce per sharded tensor; the replicated one needs none
        assert r["comms_dots"] == r["comms_norms"] == {"all_reduce": 2}
    assert res[0]["dots"] == res[1]["dots"]


@pytest.mark.parametrize("shape", ["1x2", "2x1", "2x2"])
def test_a_2d_mesh_still_makes_one_all_reduce_per_reduction(request: pytest.FixtureRequest, shape: str) -> None:
    """HSDP's 2-D layout (Replicate on one mesh dimension, Shard on the other): the global value,
    each replica counted once, with one all-reduce for the whole mesh (not one per dimension: on
    the 2x2 mesh of four ranks, DTensor's own Partial -> Replicate would make two)."""
    ranks = request.getfixturevalue("ranks4" if shape == "2x2" else "ranks")
    res = _ok(ranks, f"mesh2d_{shape}")
    for r in res:
        assert r["placements"] == [
            "DTensor:(Replicate(), Shard(dim=0))",
            "DTensor:(Shard(dim=1), Replicate())",
            "DTensor:(Replicate(), Replicate())",
            "DTensor:(Shard(dim=0), Shard(dim=1))",
        ]
        for name in ("norm_2", "norm_1", "norm_inf", "norm_-inf", "norm_0", "norm_3", "dot"):
            assert r[name]["value"] == pytest.approx(r[name]["ref"], rel=1e-5), name
            assert r[name]["comms"] == ONE_ALL_REDUCE, name
        for name in ("all_finite", "allclose", "normalize"):
            assert r[name]["value"] is r[name]["ref"], name
            assert r[name]["comms"] == ONE_ALL_REDUCE, name
        for name in ("tensor_dots", "tensor_norms"):
            for k, v in r[name]["ref"].items():
                assert r[name]["value"][k] == pytest.approx(v, rel=1e-5), (name, k)
            # one per tensor sharded over several ranks (`s`, sharded over both dimensions, too); the
            # replicated `r` and a shard over a mesh dimension of one rank need none
            assert r[name]["comms"] == {"all_reduce": 3 if shape == "2x2" else 2}, name
        assert r["grad_err"] <= 1e-6
    assert len({r["norm_2"]["value"] for r in res}) == 1  # the same value on every rank


def test_task_arithmetic_is_elementwise_on_the_shards(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "task_arithmetic"):
        assert r["placements"] == SHARDED
        assert r["err"] <= 1e-6
        assert r["comms"] == {}


@pytest.mark.parametrize("name", ["ties", "dare", "thresholds"])
def test_whole_tensor_selections_are_refused_by_path(ranks: list[dict[str, Any]], name: str) -> None:
    _refused(ranks, name, "TypeError", "at w:", "on a sharded model", "selects over each whole tensor", "full_tensor")


def test_normalize_makes_one_all_reduce(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "normalize"):
        assert res["placements"] == SHARDED
        assert res["err"] <= 1e-6
        assert res["comms"] == ONE_ALL_REDUCE


def test_reduction_refusals_name_the_path(ranks: list[dict[str, Any]]) -> None:
    _refused(ranks, "dot_mismatch", "PolicyError", "at v", "b.redistribute(a.device_mesh, a.placements)")
    _refused(ranks, "partial", "PolicyError", "at g", "Partial", "redistribute")
    _refused(ranks, "mixed", "PolicyError", "at plain", "plain Tensor among DTensors", "trainable_only=True")


@pytest.mark.parametrize("name", ["destructure", "reflatten", "fsdp_destructure"])
def test_flat_vectors_of_sharded_models_are_refused(ranks: list[dict[str, Any]], name: str) -> None:
    where = "at fc1.weight" if name.startswith("fsdp") else "at w"
    _refused(ranks, name, "TypeError", where, "DTensor", "to_local()", "DTensor.from_local")


def test_the_documented_checkpoint_alternative_round_trips(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "save_dcp"):
        assert res["err"] == 0.0


def test_fmap_rebuilds_fsdp2_modules_sharded(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "fsdp_fmap"):
        assert res["cls"] == ["FSDPMLP", "FSDPLinear"]
        assert res["placements"] == res["orig"] == ["DTensor:(Shard(dim=0),)"] * 4
        assert res["err"] <= 1e-6
        assert res["comms"] == {}
        assert res["fresh"] is True


@pytest.mark.parametrize("name", ["fsdp_norm", "fsdp_dot"])
def test_fsdp2_reductions_equal_the_unsharded_module(ranks: list[dict[str, Any]], name: str) -> None:
    res = _ok(ranks, name)
    for r in res:
        assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
        assert r["comms"] == ONE_ALL_REDUCE
    assert res[0]["value"] == res[1]["value"]


def test_models_of_dtensors_that_differ_are_refused_by_path(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "mismatches"):
        for how in ("add", "out"):
            assert r[f"dtype_{how}"].startswith("PolicyError: at v: fk.add: dtype float32"), r
            assert r[f"shape_{how}"].startswith("StructureError: at r: fk.add: shape (3,)"), r


def test_norm_takes_an_eager_all_reduce_for_sums(ranks: list[dict[str, Any]]) -> None:
    """The fast route (one dist.all_reduce, no DTensor redistribution) is taken for a sum, under
    no_grad and where the norm carries a gradient (the same value), and for a max that autograd
    records (ord=inf; its gradient: test_an_inf_norm_gradient_reaches_only_the_global_extreme).
    (The gradients: the fsdp_grad_norm and 2-D mesh tests.)"""
    for r in _ok(ranks, "norm_routes"):
        assert (r["plain"], r["grad"], r["inf"], r["same"], r["req"]) == (1, 1, 1, True, [True, True])


def test_fsdp2_norm_is_differentiable_and_a_gradient_norm_is_global(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "fsdp_grad_norm")
    for r in res:
        assert r["grad_err"] <= 1e-6  # d|p|/dp = p / |p|, gathered and compared with the reference
        assert r["grad_norm"] == pytest.approx(1.0, rel=1e-5)  # |p / |p|| = 1
        assert r["comms"] == ONE_ALL_REDUCE
    assert res[0]["grad_norm"] == res[1]["grad_norm"]


def test_fsdp2_state_dict_keys_equal_torchs(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "fsdp_state_dict"):
        assert res["fk"] == res["torch"] == res["ref"]


def test_fsdp2_ema_is_one_foreach_lerp_over_the_local_shards(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "fsdp_ema"):
        assert res["same"] is True
        assert res["err"] <= 1e-6
        assert res["comms"] == {}
        assert res["foreach"] == [[4, ["Tensor"] * 4]]  # the fast path: plain local shards, one call
        # out='s column path takes DTensors of one mesh and placements (their local shards): one
        # record of each module, no second walk by the per-leaf path (bench_sharded's EMA rows)
        assert res["column_path"] == [True]
        assert res["placements"] == res["orig"]


def test_fsdp2_load_into_then_forward(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "fsdp_load_forward"):
        assert res["comms"] == {}
        assert res["err_params"] == 0.0
        assert res["err_forward"] <= 1e-6


def test_fsdp2_load_state_dict_of_full_tensors_cuts_shards_locally(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "fsdp_load_full"):
        assert res["comms"] == {}
        assert res["err"] == 0.0


# ---- checkpoints written rank by rank (docs/checkpoints.md, "Sharded checkpoints")

SHARDS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json"]
#: the object collectives of fk.save (rank 0's plan and commit broadcast, one exchange of the
#: written keys), and the c10d ops they are made of (sizes, then pickled bytes): nothing else
SAVE_COMMS = {"eager.broadcast_object_list": 2, "eager.all_gather_object": 1, "broadcast": 4, "allgather": 2}


def _index(folder: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((folder / "model.safetensors.index.json").read_text())
    return doc


@pytest.mark.parametrize("name", ["ckpt_save", "ckpt_fsdp_save"])
def test_save_writes_each_ranks_shards_without_a_gather(ranks: list[dict[str, Any]], name: str) -> None:
    for res in _ok(ranks, name):
        assert res["comms"] == SAVE_COMMS
        assert res["files"] == SHARDS


def test_each_rank_wrote_only_its_pieces_in_a_hugging_face_layout(ranks: list[dict[str, Any]], ckpt_dir: Path) -> None:
    from safetensors.numpy import load_file

    _ok(ranks, "ckpt_save")
    folder = ckpt_dir / "dict"
    index = _index(folder)
    pieces = index["metadata"]["functorkit.pieces"]
    assert pieces == {
        "w": {"shape": [5, 4], "pieces": {"w@0,0": [0, 0], "w@3,0": [3, 0]}},  # uneven: 3 + 2 rows
        "v": {"shape": [3, 6], "pieces": {"v@0,0": [0, 0], "v@0,3": [0, 3]}},  # Shard(1)
        "even": {"shape": [4, 2], "pieces": {"even@0,0": [0, 0], "even@2,0": [2, 0]}},
        "i": {"shape": [7], "pieces": {"i@0": [0], "i@4": [4]}},
    }
    # every file read by the safetensors package: a valid sharded layout
    files = {n: load_file(str(folder / n)) for n in sorted({*index["weight_map"].values()})}
    assert {k: n for n, f in files.items() for k in f} == index["weight_map"]
    first, second = (files[n] for n in sorted(files))  # rank 0's, rank 1's
    assert sorted(first) == ["even@0,0", "i@0", "r", "v@0,0", "w@0,0"]  # the replicated `r`: once, by rank 0
    assert sorted(second) == ["even@2,0", "i@4", "v@0,3", "w@3,0"]
    assert (first["w@0,0"].shape, second["w@3,0"].shape, second["v@0,3"].shape) == ((3, 4), (2, 4), (3, 3))
    assert index["metadata"]["total_size"] == sum(a.nbytes for f in files.values() for a in f.values())


def _same(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert sorted(got) == sorted(ref)
    for k in ref:
        g = np.asarray(got[k])
        assert (g.dtype, g.shape) == (ref[k].dtype, ref[k].shape), k
        assert np.array_equal(g, ref[k]), k


@pytest.mark.parametrize(("name", "ref"), [("dict", "ref.safetensors"), ("fsdp", "fsdp_ref.safetensors")])
def test_load_gives_the_full_tensors_bit_for_bit(
    ranks: list[dict[str, Any]], ckpt_dir: Path, name: str, ref: str
) -> None:
    _ok(ranks, "ckpt_save")
    reference = fk.load(ckpt_dir / ref)  # the unsharded model, written by the ordinary fk.save
    flat = {k: v for k, v in fk.state_dict(reference).items()}
    got = fk.state_dict(fk.load(ckpt_dir / name))
    _same(got, flat)
    like = fk.fmap(lambda x: np.zeros_like(x), reference)
    _same(fk.state_dict(fk.load(ckpt_dir / name, like=like)), flat)


def test_load_with_mmap_assembles_the_pieces_too(ranks: list[dict[str, Any]], ckpt_dir: Path) -> None:
    _ok(ranks, "ckpt_save")
    _same(fk.load(ckpt_dir / "dict", mmap=True), fk.load(ckpt_dir / "ref.safetensors"))


def test_load_like_a_model_of_any_backend_gets_the_full_tensors(
    ranks: list[dict[str, Any]], ckpt_dir: Path, xp: Any
) -> None:
    from conftest import to_numpy

    _ok(ranks, "ckpt_save")
    reference = fk.load(ckpt_dir / "ref.safetensors")
    like = fk.fmap(lambda x: xp.asarray(np.zeros_like(x)), reference)
    back = fk.load(ckpt_dir / "dict", like=like)
    assert type(back["w"]) is type(like["w"])
    assert back["tied"] is back["w"]
    _same({k: to_numpy(v) for k, v in fk.state_dict(back).items()}, fk.state_dict(reference))


def test_open_is_a_dask_array_of_the_pieces(ranks: list[dict[str, Any]], ckpt_dir: Path) -> None:
    pytest.importorskip("dask")
    _ok(ranks, "ckpt_save")
    opened = fk.open(ckpt_dir / "dict")
    assert opened["w"].chunks == ((3, 2), (4,))  # one chunk per piece
    assert opened["v"].chunks == ((3,), (3, 3))
    _same({k: v.compute() for k, v in opened.items()}, fk.load(ckpt_dir / "ref.safetensors"))
    assert np.array_equal(opened["w"][2:4, 1:3].compute(), fk.load(ckpt_dir / "ref.safetensors")["w"][2:4, 1:3])


@pytest.mark.parametrize("name", ["ckpt_load_like", "ckpt_fsdp_load_like", "ckpt_load_like_whole"])
def test_load_like_restores_placements_reading_only_this_ranks_pieces(ranks: list[dict[str, Any]], name: str) -> None:
    res = _ok(ranks, name)
    for r in res:
        assert r["placements"] == r["orig"]
        assert r["err"] == 0.0
        assert r["comms"] == {}
        assert set(r["params"]) == {"DTensor"}
    if name == "ckpt_load_like":
        assert res[0]["reads"] == ["even@0,0", "i@0", "r", "v@0,0", "w@0,0"]
        assert res[1]["reads"] == ["even@2,0", "i@4", "r", "v@0,3", "w@3,0"]  # `r` is whole on every rank
    elif name == "ckpt_load_like_whole":  # an unsharded checkpoint: each rank reads whole, cuts its block
        assert res[0]["reads"] == res[1]["reads"] == ["even", "i", "r", "v", "w"]
    else:
        assert res[0]["cls"] == "FSDPMLP"
        assert res[0]["reads"] == ["fc1.bias@0", "fc1.weight@0,0", "fc2.bias@0", "fc2.weight@0,0"]
        assert res[1]["reads"] == ["fc1.bias@4", "fc1.weight@4,0", "fc2.bias@2", "fc2.weight@2,0"]


def test_load_like_other_placements_reshards_locally(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "ckpt_load_resharded")
    for r in res:
        assert (
            r["placements"]
            == r["orig"]
            == [
                "DTensor:(Replicate(),)",
                "DTensor:(Shard(dim=0),)",
                "DTensor:(Shard(dim=0),)",
                "DTensor:(Shard(dim=1),)",
                "DTensor:(Replicate(),)",
            ]
        )
        assert r["err"] == 0.0
        assert r["comms"] == {}
        assert {"w@0,0", "w@3,0", "v@0,0", "v@0,3", "i@0", "i@4"} <= set(r["reads"])  # whole, or split across
    assert "even@0,0" in res[0]["reads"]
    assert "even@2,0" in res[0]["reads"]  # Shard(1) of a Shard(0)-saved tensor overlaps both pieces


def test_a_piece_key_that_is_a_model_key_is_refused(ranks: list[dict[str, Any]]) -> None:
    assert ranks[1]["ckpt_collision"]["error"].startswith("StructureError:")  # found on rank 1, whose piece it is
    for r in ranks:
        assert "'a@2,0'" in r["ckpt_collision"]["error"], r["ckpt_collision"]
        assert "another key of the model" in r["ckpt_collision"]["error"]


def test_ties_are_stored_once_and_restored(ranks: list[dict[str, Any]], ckpt_dir: Path) -> None:
    for r in _ok(ranks, "ckpt_tie"):
        assert r["tied"] is True
    back = fk.load(ckpt_dir / "dict")
    assert back["tied"] is back["w"]
    assert "tied" not in _index(ckpt_dir / "dict")["weight_map"]


def test_a_rank_that_fails_makes_every_rank_raise_and_leaves_nothing(ranks: list[dict[str, Any]]) -> None:
    for name in ("ckpt_fail_existing", "ckpt_fail_new"):
        res = [r[name] for r in ranks]
        assert res[1]["raised"] == "OSError: disk full"
        assert res[0]["raised"].startswith("RuntimeError: fk.save: rank 1 could not write its shard of"), res[0]
        assert "OSError: disk full" in res[0]["raised"]
        for r in res:
            assert r["after"] == r["before"]  # the old checkpoint, whole (or still nothing)
            assert not [n for n in r["top"] if n.startswith(".fk-tmp")], (name, res)
    assert res[0]["after"] is None


def test_saving_again_replaces_the_checkpoint_whole(ranks: list[dict[str, Any]], ckpt_dir: Path) -> None:
    for r in _ok(ranks, "ckpt_resave"):
        assert r["before"] == SHARDS
        assert r["after"] == [n.replace(".safetensors", "-1.safetensors") for n in SHARDS[:2]] + SHARDS[2:]
    _same(fk.load(ckpt_dir / "dict"), fk.load(ckpt_dir / "ref.safetensors"))


def test_save_refuses_partial_placements_by_key(ranks: list[dict[str, Any]]) -> None:
    _refused(ranks, "ckpt_partial", "TypeError", "'g'", "Partial", "redistribute")


def _pieces_of(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = doc["metadata"]["functorkit.pieces"]
    return out


def _move(doc: dict[str, Any], key: str, piece: str, off: list[int]) -> None:
    _pieces_of(doc)[key]["pieces"][piece] = off


def _rename(doc: dict[str, Any]) -> None:
    entry = _pieces_of(doc)["w"]["pieces"]
    entry["w@9,9"] = entry.pop("w@3,0")


MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], None], str, str]] = {
    "overlap": (lambda d: _move(d, "w", "w@3,0", [2, 0]), "'w'", "overlaps another piece"),
    "gap": (lambda d: _pieces_of(d)["v"]["pieces"].pop("v@0,3"), "'v'", "no piece covers the block at offset (0, 3)"),
    "out_of_range": (lambda d: _move(d, "w", "w@3,0", [4, 0]), "'w'", "reaches outside the shape (5, 4)"),
    "missing": (_rename, "'w'", "the piece 'w@9,9' is not stored"),
    "bad_offset": (lambda d: _move(d, "i", "i@4", [4, 0]), "'i'", "expected 1 non-negative ints"),
    "bad_shape": (lambda d: _pieces_of(d)["w"].update(shape=[5, -4]), "'w'", "is not a non-empty list"),
    "not_an_object": (lambda d: d["metadata"].update({"functorkit.pieces": [1]}), "functorkit.pieces", "not an object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_piece_metadata_is_a_structure_error(
    ranks: list[dict[str, Any]], ckpt_dir: Path, tmp_path: Path, case: str
) -> None:
    _ok(ranks, "ckpt_save")
    folder = tmp_path / "ck"
    shutil.copytree(ckpt_dir / "dict", folder)
    doc = _index(folder)
    edit, key, words = MALFORMED[case]
    edit(doc)
    (folder / "model.safetensors.index.json").write_text(json.dumps(doc))
    for read in (fk.load, fk.open):
        with pytest.raises(fk.StructureError) as info:
            read(folder)
        text = str(info.value)
        assert "model.safetensors.index.json" in text, text
        assert key in text, text
        assert words in text, text


# ---- rebuilt FSDP2 modules (docs/sharded.md, "Rebuilt FSDP2 modules")


@pytest.mark.parametrize("name", ["fmap", "copy", "lerp", "identity"])
def test_a_rebuilt_fsdp2_module_runs_its_own_forward_and_backward(ranks: list[dict[str, Any]], name: str) -> None:
    for r in _ok(ranks, f"fsdp_rebuilt_{name}"):
        assert r["comms"] == {}  # rebuilding gathers nothing (FSDP2's all-gathers come in its forward)
        assert r["cls"] == ["FSDPMLP", "FSDPLinear", "FSDPLinear"]
        assert r["placements"] == ["DTensor:(Shard(dim=0),)"] * 4
        assert r["own_state"] is True
        assert r["copied_hooks"] == 0  # the original's hooks (bound to its state) are not in the clone
        assert r["hooks"] >= 6  # its own: a forward pre and post hook per FSDP2 module
        assert r["err_forward"] <= 1e-5  # the unsharded modules under the same operation, same input
        assert r["err_grads"] <= 1e-5  # its backward reduce-scatters into its own parameters' .grad
        assert r["differs"] is True  # so its hooks gathered its own parameters, not the original's
        assert r["err_orig"] <= 1e-6
        assert r["orig_unchanged"] is True
        assert r["orig_no_grad"] is True


@pytest.mark.parametrize("shape", ["1x2", "2x1", "2x2"])
def test_a_rebuilt_hsdp_module_runs_and_its_norm_is_one_all_reduce(request: pytest.FixtureRequest, shape: str) -> None:
    ranks = request.getfixturevalue("ranks4" if shape == "2x2" else "ranks")
    res = _ok(ranks, f"fsdp_rebuilt_hsdp_{shape}")
    for r in res:
        assert r["comms"] == {}
        assert r["placements"] == ["DTensor:(Replicate(), Shard(dim=0))"] * 4
        assert r["err_forward"] <= 1e-5
        assert r["err_orig"] <= 1e-6
        assert r["norm"] == pytest.approx(r["norm_ref"], rel=1e-5)
        assert r["comms_norm"] == ONE_ALL_REDUCE
    assert len({r["norm"] for r in res}) == 1  # the same value on every rank


def test_rebuilt_fsdp2_settings_ties_ignored_parameters_and_mixed_precision(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "fsdp_rebuilt_configs"):
        for kind, res in r.items():
            assert res["comms"] == {}, kind
            assert res["err"] == 0.0, kind  # the original FSDP2 module holding the rebuilt values
            assert res["differs"] is True, kind
        assert r["tied"]["types"] == ["DTensor"] * 3  # a.weight, a.bias, b.bias: the tie kept
        assert r["ignored"]["types"] == ["DTensor"] * 3 + ["Tensor"]  # fc2.bias: ignored, plain
        assert (r["mp"]["dtype"], r["ignored"]["dtype"]) == ("torch.bfloat16", "torch.float32")


def test_partition_groups_of_an_fsdp2_module_combine_into_a_working_one(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "fsdp_partition_combine"):
        assert r["comms"] == {}
        assert r["cls"] == ["FSDPMLP", "FSDPMLP"]
        assert r["norms"][0] == pytest.approx(r["norms"][1], rel=1e-5)
        assert r["copied_hooks"] == 0  # a group never runs the original's hooks
        assert r["err_forward"] <= 1e-6
        assert r["own_state"] is True


def test_an_fsdp2_module_of_plain_tensors_is_rebuilt_plain(ranks: list[dict[str, Any]]) -> None:
    res = _ok(ranks, "fsdp_rebuilt_plain")
    for r in res:
        assert r["cls"] == ["MLP", "Linear", "Linear"]  # no FSDP2 class, state or hook
        assert r["hooks"] == 0
    assert sorted(r["rows"] for r in res) == [4, 4]  # fc1's 8 rows: this rank's 4
    assert [r["flat"] for r in res] == [4 * 6 + 4 + 2 * 8 + 2, 4 * 6 + 4 + 1 * 8 + 1]  # fc2: 3 rows as 2 + 1


def test_what_cannot_be_rebuilt_working_is_refused(ranks: list[dict[str, Any]]) -> None:
    _refused(
        ranks, "fsdp_rebuilt_mixed", "StructureError", "FSDPLinear at 'fc1'", "'bias'", "fk.load_into(model, rebuilt)"
    )
    _refused(ranks, "fsdp_rebuilt_unsharded", "TypeError", "unsharded now", "reshard()", "fk.load_into(model, rebuilt)")


# ---- tests/sharded_torch_partial.py's checks (run in the same worker processes)


@pytest.mark.parametrize("case", ["inf", "-inf", "tie"])
def test_an_inf_norm_gradient_reaches_only_the_global_extreme(ranks: list[dict[str, Any]], case: str) -> None:
    """The gradient of the unsharded norm: rank 1's local max (min) gets none; a max held by both
    ranks is split between them (torch's own rule for a tie); one all-reduce each way."""
    for res in _ok(ranks, "inf_grad"):
        r = res[case]
        assert r["value"] == r["ref"]
        assert r["grad"] == r["grad_ref"], (r["grad"], r["grad_ref"])
        assert r["comms"] == ONE_ALL_REDUCE
        assert r["comms_backward"] == ONE_ALL_REDUCE
    if case == "tie":
        assert ranks[0]["inf_grad"]["tie"]["grad"] == {"v": [[0.5, 0.0, -0.5, 0.0]]}


def test_normalize_by_the_inf_norm_has_the_unsharded_gradient(ranks: list[dict[str, Any]]) -> None:
    for res in _ok(ranks, "inf_grad"):
        got, ref = np.array(res["normalize"]["grad"]), np.array(res["normalize"]["grad_ref"])
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)


MIXED = ["dot_ap", "dot_pa", "add", "lerp", "mean", "slerp", "task_arithmetic", "model_stock", "tensor_dots", "stack"]


@pytest.mark.parametrize("name", MIXED)
def test_a_plain_tensor_among_dtensors_is_refused_by_path(ranks: list[dict[str, Any]], name: str) -> None:
    for r in _ok(ranks, "mixed_plain"):
        err = r[name]
        start = "PolicyError: fk.stack: at enc.w:" if name == "stack" else "PolicyError: at enc.w: fk."
        assert err.startswith(start), err
        assert "holds a DTensor of shape (4, 2) with placements (Shard(dim=0),)" in err, err
    full = ranks[0]["mixed_plain"]["add"]
    for words in ("`b` a plain Tensor", "b = fk.load_into(fk.copy(a), b)", "full_tensor()"):
        assert words in full, (words, full)


@pytest.mark.parametrize("name", ["add", "sub", "lerp", "lincomb", "out_plain"])
def test_out_with_a_plain_tensor_among_dtensors_writes_nothing(ranks: list[dict[str, Any]], name: str) -> None:
    for r in _ok(ranks, "mixed_plain"):
        assert r[f"out_{name}"].startswith("PolicyError: at b: fk."), r[f"out_{name}"]
        assert r[f"out_{name}_untouched"] is True
    assert "`out` a plain" in ranks[0]["mixed_plain"]["out_out_plain"]


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("name", ["add", "sub", "scale", "lincomb", "mean"])
@pytest.mark.parametrize("where", ["a", "other"])
def test_out_on_partial_sum_and_avg_terms_is_local(ranks: list[dict[str, Any]], op: str, name: str, where: str) -> None:
    """Linear operations on Partial(sum/avg) DTensors: each rank's term from its terms, as the
    functional form computes it (DTensor's operators keep Partial there), no collective."""
    for r in _ok(ranks, "partial_out"):
        same, diff, kept, comms = r[f"{op}_{name}_{where}"]
        assert same is True
        assert kept is True
        assert comms == {}
        assert diff == 0.0, diff  # bit for bit (lincomb's functional form: add(alpha=c), as out='s add_)


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("where", ["a", "other"])
def test_lerp_out_on_partial_terms_is_refused_before_writing(ranks: list[dict[str, Any]], op: str, where: str) -> None:
    for r in _ok(ranks, "partial_out"):
        err = r[f"{op}_lerp_{where}"]
        assert err.startswith("PolicyError: at p: fk.lerp(out=...): the arrays here are a DTensor of shape (2, 3)"), err
        assert f"with placements (Partial({op}),)" in err, err
        assert r[f"{op}_lerp_{where}_untouched"] is True
    full = ranks[0]["partial_out"][f"{op}_lerp_a"]
    for words in ("`ema = fk.lerp(ema, model, t)`", "redistribute", "reduces Partial terms first"):
        assert words in full, (words, full)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("name", ["add", "scale", "lincomb", "mean", "lerp", "lerp_second"])
def test_out_on_partial_max_min_is_refused_before_writing(ranks: list[dict[str, Any]], op: str, name: str) -> None:
    """Not linear: the in-place EMA wrote the lerp of each rank's candidates (5, not 9), scale and
    lincomb raised DTensor's error after the first parameter was written."""
    for r in _ok(ranks, "partial_out"):
        err = r[f"{op}_{name}"]
        fname = name.split("_")[0]
        assert err.startswith(f"PolicyError: at p: fk.{fname}(out=...): the arrays here are a DTensor"), err
        assert f"Partial({op})" in err, err
        assert r[f"{op}_{name}_untouched"] is True
    full = ranks[0]["partial_out"][f"{op}_scale"]
    for words in ("Partial(sum/avg)", "`a = fk.scale(c, a)`", "x.redistribute(x.device_mesh, [Replicate()])"):
        assert words in full, (words, full)


def test_out_with_a_partial_term_among_other_placements_is_refused(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "partial_out"):
        err = r["mixed_placements"]
        assert err.startswith("PolicyError: at p: fk.add(out=...): one array here is a DTensor"), err
        for words in ("(Partial(sum),)", "(Replicate(),)", "same mesh and placements"):
            assert words in err, (words, err)


def test_copy_of_a_partial_dtensor_keeps_it_partial_without_a_collective(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "partial_copy"):
        assert r == {"placements": "(Partial(sum),)", "local_equal": True, "independent": True, "comms": {}}


def test_allclose_of_partial_dtensors_compares_their_values(ranks: list[dict[str, Any]]) -> None:
    """Equal values with other terms are close; other values are not; every rank agrees."""
    for r in _ok(ranks, "partial_allclose"):
        assert [r[k] for k in ("self", "copy", "swapped", "max_self")] == [True] * 4
        assert [r[k] for k in ("other", "max_other")] == [False] * 2
        assert r["comms"] == {"all_reduce": 2}  # one reduction of the Partial tensor, one agreement
    assert "at g: 1 of 2 entries differ" in ranks[0]["partial_allclose"]["message"]


def test_load_like_a_model_holding_a_0d_dtensor(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "load_0d"):
        for how in ("sharded", "whole"):
            assert r[how] == {
                "placements": ["(Shard(dim=0),)", "(Replicate(),)"],
                "s": 1.5,
                "w": [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]],
            }
