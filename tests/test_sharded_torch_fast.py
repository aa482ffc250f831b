"""The fast path of ``fk.norm``/``fk.dot``/``fk.all_finite`` on DTensor models, on two real gloo ranks
(issue #26's speed row; docs/sharded.md "Speed"): the checks run in tests/sharded_torch_fast.py inside
tests/sharded_torch_worker.py (only its ``fast_`` checks here). These tests fail when the fast path
silently stops being taken: a per-tensor check made, the norm's operations growing with the number of
tensors, a DTensor operation, a second all-reduce, or a fallback giving another value.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("torch")

from sharded_harness import gloo_available, run_torch_ranks

pytestmark = pytest.mark.skipif(not gloo_available(), reason="torch.distributed with gloo is not available")

ONE_ALL_REDUCE = {"all_reduce": 1}
REDUCTIONS = ["norm_2", "norm_1", "norm_inf", "norm_-inf", "norm_0", "norm_3", "dot", "all_finite"]


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_torch_ranks("sharded_torch_worker.py", world=2, extra={"FK_ONLY": "fast_"})


def _ok(ranks: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    out = [r[name] for r in ranks]
    for r, res in enumerate(out):
        assert "error" not in res, f"rank {r}: {res.get('error')}\n{res.get('trace', '')}"
    return out


@pytest.mark.parametrize("how", ["fast_no_grad", "fast_grad"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_every_reduction_takes_the_fast_path(ranks: list[dict[str, Any]], how: str, name: str) -> None:
    """A model of Shard(0) (uneven), Shard(1) and Replicate DTensors (rank 1 does not count the
    replicas): no per-tensor check, one all-reduce, the unsharded value, the same on every rank."""
    res = [r[name] for r in _ok(ranks, how)]
    for r in res:
        assert r["checked"] == 0
        assert r["comms"] == ONE_ALL_REDUCE
        assert r["value"] == pytest.approx(r["ref"], rel=1e-12)
        assert r["placements"] == "(Replicate(),)"
        # differentiable where the parameters require grad (a count and a flag have no gradient)
        assert r["requires_grad"] is (how == "fast_grad" and name not in ("norm_0", "all_finite"))
    assert res[0]["value"] == res[1]["value"]


def test_the_norms_operations_do_not_grow_with_the_number_of_tensors(ranks: list[dict[str, Any]]) -> None:
    """fk.norm under no_grad: one _foreach_norm over the local shards, one stack, one dot, ONE
    all-reduce and the root, for 6 tensors as for 24; fk.dot: one vdot per pair (no foreach dot
    exists) on the local shards; neither makes a DTensor operation."""
    for r in _ok(ranks, "fast_kernels"):
        few, many = r["6"], r["24"]
        assert few["norm"] == many["norm"]
        assert many["norm"].count("_foreach_norm") == 1
        assert many["norm"].count("allreduce_") == 1
        assert len(many["norm"]) <= 6  # (the root of a total no gradient flows through: one sqrt)
        assert few["norm_dtensor_ops"] == many["norm_dtensor_ops"] == 0
        # ord=inf on a CPU: one aminmax per local shard (no abs() temporary), then a constant few
        assert many["inf"].count("aminmax") == 24
        assert "abs" not in many["inf"]
        assert len(many["inf"]) - 24 == len(few["inf"]) - 6 <= 8
        assert many["dot_vdots"] == 24
        assert (many["dot"] - few["dot"]) == 3 * (24 - 6)  # per pair: two flattening views and the vdot
        assert few["dot_dtensor_ops"] == many["dot_dtensor_ops"] == 0


@pytest.mark.parametrize("how", ["no_foreach", "per_tensor", "foreach_on_cpu"])
@pytest.mark.parametrize("name", REDUCTIONS)
def test_the_fallbacks_give_the_same_values(ranks: list[dict[str, Any]], how: str, name: str) -> None:
    """Without torch._foreach_norm (per-tensor kernels on the local shards, still no per-tensor check),
    through the per-tensor path (which checks: so the spy of the test above can see it), and with
    _foreach_norm for every order on CPU (a tensor whose shard on rank 1 is empty): the same value,
    one all-reduce."""
    for r in _ok(ranks, "fast_fallbacks"):
        res = r[how][name]
        assert res["value"] == pytest.approx(res["ref"], rel=1e-12, abs=1e-300)
        assert res["comms"] == ONE_ALL_REDUCE
        assert res["placements"] == "(Replicate(),)"
        if how == "per_tensor":
            assert res["checked"] > 0
        else:
            assert res["checked"] == 0
        foreach = how == "foreach_on_cpu" and name in ("norm_2", "norm_1", "norm_inf", "norm_-inf", "norm_0")
        assert res["foreach"] == (1 if foreach else 0)


def test_a_foreach_inf_norm_has_the_unsharded_gradient(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "fast_inf_grad"):
        assert r["foreach"] == 1
        assert r["value"] == r["ref"]
        assert r["grad"] == r["grad_ref"]


def test_the_fast_path_norm_has_the_unsharded_gradient(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "fast_gradients"):
        assert r["checked"] == 0
        assert r["err"] <= 1e-12


def test_the_result_made_from_a_cached_spec_is_dtensors_own(ranks: list[dict[str, Any]]) -> None:
    for r in _ok(ranks, "fast_result"):
        assert all(r["same"])
        assert r["twice"] == 2 * r["value"]
        assert r["local_is_plain"] is True
        assert math.isfinite(r["value"])


def test_the_fsdp2_ema_is_judged_per_spec_and_runs_on_the_local_shards(ranks: list[dict[str, Any]]) -> None:
    """fk.lerp(ema, model, t, out=ema) on FSDP2 stacks of 3 and 12 Linear layers: with the spec path
    (`_dtensor_columns`) no DTensor's placements or mesh is read, the specs are judged as often for 24
    tensors as for 6, each pair's shape is one spec identity test, and one foreach runs over plain
    local shards with no collective, giving the local lerp of every shard bit for bit. With the path
    off the same values, read per tensor: so the spies see the per-tensor path when it runs."""
    for r in _ok(ranks, "fast_ema"):
        few, many = r["3"], r["12"]
        for res in (few, many):
            for how in ("on", "off"):
                got = res[how]
                assert got["same"] is True
                assert got["exact"] is True
                assert got["comms"] == {}
                assert got["foreach"] == [["Tensor"]]
                assert got["placements"] == ["(Shard(dim=0),)"]
                # each DTensor's local shard looked up once (matching the two models), then handed
                # on to `out_fast` and the foreach (not looked up again there)
                assert got["local_reads"] == 2 * got["tensors"], got
        for res in (few, many):
            on, off = res["on"], res["off"]
            assert on["placements_reads"] == on["device_mesh_reads"] == 0, on
            assert on["same_shape"] == on["tensors"]  # one spec identity test per pair
            assert off["same_shape"] == 0
            # each DTensor's placements and mesh (the ema's and the model's)
            assert off["placements_reads"] >= 2 * off["tensors"]
            assert off["device_mesh_reads"] >= 2 * off["tensors"]
        assert few["on"]["spec_fits"] == many["on"]["spec_fits"] <= 2
        assert few["off"]["spec_fits"] == many["off"]["spec_fits"] == 0


@pytest.mark.parametrize("into", ["a", "c"])
@pytest.mark.parametrize("name", ["add", "sub", "scale", "lincomb", "mean", "lerp"])
def test_out_arithmetic_on_fsdp2_models_is_one_foreach_batch_over_the_local_shards(
    ranks: list[dict[str, Any]], name: str, into: str
) -> None:
    """``fk.<name>(..., out=)`` on FSDP2 stacks, in place (`a`) and into a third model (`c`): every
    shard the plain row kernel's result bit for bit, no collective, only ``torch._foreach_*`` kernels
    over plain local shards (a handful, however many tensors), no DTensor's placements read, and each
    DTensor's local shard looked up once per call."""
    for r in _ok(ranks, "fast_arith_out"):
        got = r[f"{name}_{into}"]
        assert got["same"] is True
        assert got["exact"] is True, got
        assert got["comms"] == {}
        assert got["kernel_types"] == ["Tensor"], got
        assert 1 <= got["kernels"] <= 4, got
        assert got["placements_reads"] == 0, got
        assert got["local_reads"] == got["models"] * got["tensors"], got


@pytest.mark.parametrize("name", ["shape", "placements"])
def test_what_the_ema_column_path_declines_is_handled_as_before(ranks: list[dict[str, Any]], name: str) -> None:
    """Global shapes 5 and 6 rows (rank 0's local shards both 3 rows): refused by path before anything
    is written, the spec identity test not taken for equal shapes; a Replicate term among Shard(0) ones:
    the per-leaf path writes DTensor's lerp. The same result, message and collectives (none) with the
    spec path on and off."""
    for r in _ok(ranks, "fast_ema_refusals"):
        on, off = r[f"{name}_on"], r[f"{name}_off"]
        assert on == off
        assert on["comms"] == {}
        if name == "shape":
            assert on["msg"].startswith("StructureError: at p2: fk.lerp: shape (5, 4) in `a` vs (6, 4) in `b`"), on
            assert on["untouched"] is True
        else:
            assert on["done"] is True
            assert on["err"] == 0.0
