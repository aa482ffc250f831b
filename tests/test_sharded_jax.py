"""JAX arrays sharded over a Mesh of eight host devices (SPEC 17; docs/sharded.md).

One process (tests/sharded_jax_worker.py, started once for the module with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``) runs every check on a mesh with Auto axes
and on ``jax.make_mesh``'s default Explicit axes, with arrays of three different ``NamedSharding``s
in one model, and compares each result with NumPy on the same values. The collectives XLA compiles
into ``jit(fk.norm)``/``jit(fk.dot)`` are counted from the compiled program: reductions, no gather.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("jax")

from sharded_harness import run_jax

MESHES = ["auto", "explicit"]


@pytest.fixture(scope="module")
def res() -> dict[str, Any]:
    return run_jax("sharded_jax_worker.py", devices=8)


def _ok(res: dict[str, Any], name: str) -> dict[str, Any]:
    r: dict[str, Any] = res[name]
    assert "error" not in r, f"{r.get('error')}\n{r.get('trace', '')}"
    return r


def test_eight_devices(res: dict[str, Any]) -> None:
    assert res["devices"] == 8
    assert _ok(res, "auto.fmap")["mesh"] == ["AxisType.Auto", "AxisType.Auto"]
    assert _ok(res, "explicit.fmap")["mesh"] == ["AxisType.Explicit", "AxisType.Explicit"]


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize(
    "name", ["fmap", "fmap2", "add", "sub", "scale", "lincomb", "mean", "lerp", "copy", "jit_lerp", "normalize"]
)
def test_elementwise_keeps_every_sharding(res: dict[str, Any], mesh: str, name: str) -> None:
    r = _ok(res, f"{mesh}.{name}")
    assert r["kept"] is True
    assert r["err"] <= 1e-6


@pytest.mark.parametrize("mesh", MESHES)
def test_stack_shards_the_new_axis_nowhere(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.stack")
    assert r["specs"]["a"] == ["None", "x", "y"]
    assert r["specs"]["b"] == ["None", "None", "y"]
    assert r["err"] <= 1e-6


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("how", ["eager", "jit"])
@pytest.mark.parametrize("o", [2, 1, math.inf, -math.inf, 0, 3])
def test_norm_of_differently_sharded_arrays_is_global(res: dict[str, Any], mesh: str, how: str, o: float) -> None:
    r = _ok(res, f"{mesh}.norm_{o}.{how}")
    assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
    assert r["ndim"] == 0
    assert r["devices"] == 8  # replicated over the mesh, not moved to one device


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("how", ["eager", "jit"])
def test_dot_of_differently_sharded_arrays_is_global(res: dict[str, Any], mesh: str, how: str) -> None:
    r = _ok(res, f"{mesh}.dot.{how}")
    assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
    assert r["devices"] == 8


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("name", ["norm", "norm_inf", "dot"])
def test_eager_reductions_run_one_compiled_program(res: dict[str, Any], mesh: str, name: str) -> None:
    """Eagerly, each JAX operation on a sharded array is a program with its own all-reduce: fk.norm and
    fk.dot run one jitted program instead (no per-array operation after the first call)."""
    r = _ok(res, f"{mesh}.eager_program")[name]
    assert r["calls"] == {"program": 1, "part": 0}
    assert r["value"] == r["first"]
    assert r["value"] == pytest.approx(r["ref"], rel=1e-5)
    assert r["devices"] == 8
    if name == "norm":
        assert r["value"] == pytest.approx(r["jit"], rel=1e-6)


@pytest.mark.parametrize("mesh", MESHES)
def test_all_finite_sees_every_shard(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.all_finite")
    assert (r["bad"], r["ok"], r["kept"]) == (False, True, True)


@pytest.mark.parametrize("mesh", MESHES)
def test_merges_on_sharded_arrays(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.merges")
    works = ["slerp", "task_arithmetic", "tensor_dots"] + (["ties", "dare"] if mesh == "auto" else [])
    for name in works:
        assert "refused" not in r[name], r[name]
        assert r[name]["err"] <= 1e-5, (name, r[name])
        assert r[name]["kept"] is True, name
    if mesh == "explicit":
        for name in ("ties", "dare"):
            assert r[name]["refused"].startswith(f"at a: fk.{name} on a sharded model:"), r[name]
            assert "Explicit axes" in r[name]["refused"]
            assert "AxisType.Auto" in r[name]["refused"]


@pytest.mark.parametrize("mesh", MESHES)
def test_jitted_reductions_compile_to_reductions_without_gathers(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.compiled")
    for name in ("norm", "dot"):
        assert r[name]["all_gather"] == 0, r
        assert r[name]["all_to_all"] == 0, r
        assert 1 <= r[name]["all_reduce"] <= 2, r  # one per mesh axis at most (a 4 x 2 mesh)


@pytest.mark.parametrize("mesh", MESHES)
@pytest.mark.parametrize("name", ["destructure", "destructure_model"])
def test_destructure_of_split_arrays_is_refused_by_path(res: dict[str, Any], mesh: str, name: str) -> None:
    err = res[f"{mesh}.{name}"].get("error")
    assert err is not None
    assert err.startswith("TypeError: at a: fk.destructure builds one flat vector"), err
    assert "split over several devices" in err
    assert "PartitionSpec()" in err  # the alternative: replicate first


@pytest.mark.parametrize("mesh", MESHES)
def test_destructure_of_replicated_arrays_works(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.destructure_replicated")
    assert r["err"] <= 1e-6
    assert r["devices"] == [8, 8, 8]


@pytest.mark.parametrize("mesh", MESHES)
def test_save_then_load_like_keeps_shardings_and_load_gives_full_arrays(res: dict[str, Any], mesh: str) -> None:
    r = _ok(res, f"{mesh}.save_load")
    assert r["kept"] is True
    assert r["err"] <= 1e-6
    assert r["whole_err"] <= 1e-6


@pytest.mark.parametrize("mesh", MESHES)
def test_open_gives_full_arrays_of_a_sharded_save(res: dict[str, Any], mesh: str) -> None:
    pytest.importorskip("dask")  # fk.open is lazy on Dask (the jax nox session has no Dask)
    r = _ok(res, f"{mesh}.save_load")
    assert r["open_err"] <= 1e-6


@pytest.mark.parametrize("mesh", MESHES)
def test_load_into_jax_is_the_immutable_refusal(res: dict[str, Any], mesh: str) -> None:
    err = res[f"{mesh}.load_into"].get("error")
    assert err is not None
    assert err.startswith("TypeError: at a: fk.load_into writes into `dst`'s arrays in place"), err


@pytest.mark.parametrize("name", ["norm", "add"])
def test_arrays_on_two_device_sets_are_refused_naming_each_ones_devices(res: dict[str, Any], name: str) -> None:
    err = _ok(res, "two_meshes")[name]
    assert "over devices {0, 1, 2, 3}" in err, err
    assert "over devices {4, 5, 6, 7}" in err, err


def test_merges_of_replicated_arrays_with_a_spec_of_their_rank(res: dict[str, Any]) -> None:
    # (a raw "with_sharding_constraint ... rank at least 1" ValueError before: 0-d constants were
    # committed to the arrays' rank-1 sharding)
    r = _ok(res, "replicated_spec_merges")
    assert r["explicit.slerp"] <= 1e-6
    assert r["auto.slerp"] <= 1e-6
    assert len(r["auto.ties"]) == 3
    assert len(r["auto.dare"]) == 3
