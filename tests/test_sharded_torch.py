"""torch DTensor and FSDP2 models on two real gloo ranks (SPEC 17; docs/sharded.md).

The ranks start once for the module (tests/sharded_torch_worker.py, run by tests/sharded_harness.py)
and run every check there: each result is compared with the unsharded reference built from the same
seed, and the collectives made by each operation are counted (DTensor's and the functional ones
through ``CommDebugMode``, every eager ``torch.distributed`` call by patching), so that a silent
all-gather, or a per-rank partial sum, fails here.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("torch")

from sharded_harness import gloo_available, run_torch_ranks

pytestmark = pytest.mark.skipif(not gloo_available(), reason="torch.distributed with gloo is not available")

SHARDED = ["DTensor:(Shard(dim=0),)", "DTensor:(Shard(dim=1),)", "DTensor:(Replicate(),)"]
ONE_ALL_REDUCE = {"all_reduce": 1}


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_torch_ranks("sharded_torch_worker.py", world=2)


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


def test_save_refuses_dtensors_and_names_the_alternative(ranks: list[dict[str, Any]]) -> None:
    _refused(ranks, "save", "TypeError", "'w'", "torch.distributed.checkpoint.save(fk.state_dict(model)", "full_tensor")


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
