"""Conversions of parameters between array libraries (re(p) under policy="model", fk.load_into):
bfloat16/float8 between NumPy's ml_dtypes and torch both ways, torch tensors that require grad or
carry a conjugate bit, lazy Dask sources, and a torch `meta` p (no values: refused by path)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import functorkit as fk  # noqa: E402

NARROW = [("bfloat16", torch.bfloat16), ("float8_e4m3fn", torch.float8_e4m3fn), ("float8_e5m2", torch.float8_e5m2)]
VALUES = [0.5, -1.5, 2.0]


@pytest.mark.parametrize(("ml", "td"), NARROW)
def test_narrow_floats_rebuild_across_numpy_and_torch(ml: str, td: object) -> None:
    np_dt = np.dtype(getattr(ml_dtypes, ml))
    _, re_t = fk.destructure({"w": torch.ones(3, dtype=td)}, policy="model")
    got = re_t(np.asarray(VALUES, np_dt))["w"]
    assert got.dtype == td
    assert got.float().tolist() == VALUES
    _, re_n = fk.destructure({"w": np.ones(3, np_dt)}, policy="model")
    got_n = re_n(torch.tensor(VALUES, dtype=td))["w"]
    assert got_n.dtype == np_dt
    assert got_n.astype(np.float32).tolist() == VALUES


def test_torch_p_that_requires_grad_or_is_conjugated_rebuilds_a_numpy_model() -> None:
    _, re = fk.destructure({"w": np.ones(3), "b": np.zeros(2)})
    p = torch.arange(5.0, dtype=torch.float64, requires_grad=True)
    assert re.explain(p, policy="model").ok
    out = re(p, policy="model")
    assert out["w"].tolist() == [0.0, 1.0, 2.0]
    assert out["b"].tolist() == [3.0, 4.0]
    _, cre = fk.destructure({"c": np.ones(2, complex)})
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex128).conj()
    assert cre(c, policy="model")["c"].tolist() == [1 - 2j, 3 + 1j]


def test_a_meta_p_is_refused_by_path_and_explain_says_so() -> None:
    _, re = fk.destructure({"w": np.ones(3), "b": np.zeros(2)})
    p = torch.empty(5, dtype=torch.float64, device="meta")
    ex = re.explain(p, policy="model")
    assert not ex.ok
    assert [r.how for r in ex.rows] == ["error", "error"]
    with pytest.raises(fk.PolicyError, match=r"at w: .*holds no values"):
        re(p, policy="model")


@pytest.mark.parametrize(("ml", "td"), NARROW)
def test_lazy_narrow_float_sources_load_into_torch(ml: str, td: object, tmp_path: object) -> None:
    da = pytest.importorskip("dask.array")
    np_dt = np.dtype(getattr(ml_dtypes, ml))
    src = {"w": da.from_array(np.asarray(VALUES, np_dt), chunks=2)}
    for dst_dtype in (td, torch.float32):
        dst = {"w": torch.zeros(3, dtype=dst_dtype)}
        fk.load_into(dst, src)
        assert dst["w"].dtype == dst_dtype
        assert dst["w"].float().tolist() == VALUES
    path = f"{tmp_path}/ck.safetensors"
    fk.save(path, {"weight": np.asarray(VALUES, np_dt)})
    lin = torch.nn.Linear(3, 1, bias=False).to(td)
    with torch.no_grad():
        lin.weight.zero_()
    fk.load_state_dict(lin, {"weight": fk.state_dict(fk.open(path))["weight"].reshape(1, 3)})
    assert lin.weight.float().flatten().tolist() == VALUES


def test_a_meta_p_casts_into_a_meta_model_but_is_refused_onto_the_cpu() -> None:
    # a cast on meta reads no values (a meta model is a template); a move to the CPU would
    _, re_meta = fk.destructure({"w": torch.empty(3, device="meta", dtype=torch.float64)}, policy="model")
    got = re_meta(torch.empty(3, device="meta", dtype=torch.float32))["w"]
    assert got.device.type == "meta"
    assert got.dtype == torch.float64
    _, re_cpu = fk.destructure({"w": torch.zeros(3)}, policy="model")
    with pytest.raises(fk.PolicyError, match=r"at w: .*holds no values"):
        re_cpu(torch.empty(3, device="meta"))
