"""The three policies of destructure/re(p): the table of SPEC section 4, on every backend."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import functorkit as fk

from conftest import Backend, importable, to_numpy

MUTABLE = {"numpy", "numpy_readonly", "torch", "array_api_strict", "cupy"}


def model(xp: Any, dtype: Any = None) -> dict[str, Any]:
    dt = xp.float64 if dtype is None else dtype
    return {"w": xp.asarray([[1.0, 2.0], [3.0, 4.0]], dtype=dt), "b": xp.asarray([5.0], dtype=dt), "n": 3}


def writable(p: Any, backend: Backend) -> Any:
    return np.array(p) if backend.value == "numpy_readonly" else p


def write_first(p: Any, xp: Any, backend: Backend) -> None:
    if backend.value == "torch":
        import torch

        with torch.no_grad():
            p[0] = -1.0
    elif backend.value in ("numpy", "numpy_readonly"):
        p[0] = -1.0
    else:
        p[0] = xp.asarray(-1.0, dtype=p.dtype, device=p.device)


# --------------------------------------------------------------------------- dtype


def test_strict_dtype_mismatch_raises_naming_path_and_fix(xp: Any) -> None:
    _flat, re = fk.destructure(model(xp))
    p = xp.asarray([1.0, 2.0, 3.0, 4.0, 5.0], dtype=xp.float32)
    with pytest.raises(fk.PolicyError) as info:
        re(p)
    msg = str(info.value)
    assert msg.startswith("at w: ")
    assert "float64" in msg
    assert "float32" in msg
    assert "policy='model'" in msg
    assert "policy='flat'" in msg
    assert isinstance(info.value, TypeError)


def test_model_policy_casts_back_to_each_parameter(xp: Any) -> None:
    flat, re = fk.destructure(model(xp), policy="model")
    p32 = xp.asarray([1.5, 2.5, 3.5, 4.5, 5.5], dtype=xp.float32)
    out = re(p32)
    assert out["w"].dtype == xp.float64
    assert out["b"].dtype == xp.float64
    np.testing.assert_array_equal(to_numpy(out["w"]), [[1.5, 2.5], [3.5, 4.5]])
    assert [r.how for r in re.explain(p32)] == ["copy", "copy"]
    assert re.explain(p32).rows[0].rule == "model: cast float32 -> float64"
    assert [r.how for r in re.explain(flat)] == ["view", "view"]  # no conversion: views
    with pytest.raises(ValueError, match=r"at w: re\(p, copy=False\) cannot give a view"):
        re(p32, copy=False)


def test_flat_policy_gives_p_dtype(xp: Any, backend: Backend) -> None:
    _flat, re = fk.destructure(model(xp), policy="flat")
    p32 = writable(xp.asarray([1.5, 2.5, 3.5, 4.5, 5.5], dtype=xp.float32), backend)
    out = re(p32)
    assert out["w"].dtype == xp.float32
    assert out["b"].dtype == xp.float32
    assert out["n"] == 3
    ex = re.explain(p32)
    assert [r.how for r in ex] == ["view", "view"]
    assert ex.rows[0].result_dtype == xp.float32
    if backend.value in MUTABLE:
        write_first(p32, xp, backend)
        assert float(to_numpy(out["w"])[0, 0]) == -1.0


def test_policy_given_to_re_overrides(xp: Any) -> None:
    _flat, re = fk.destructure(model(xp))
    assert re.policy == "strict"
    p32 = xp.asarray([1.0, 2.0, 3.0, 4.0, 5.0], dtype=xp.float32)
    assert re(p32, policy="model")["w"].dtype == xp.float64
    assert re(p32, policy="flat")["w"].dtype == xp.float32


# --------------------------------------------------------------------------- complex


def test_complex_p_into_real_model(xp: Any) -> None:
    _flat, re = fk.destructure(model(xp), policy="model")
    pc = xp.asarray([1 + 1j, 2, 3, 4, 5], dtype=xp.complex128)
    with pytest.raises(fk.PolicyError, match=r"at w: .*complex p .*no complex parameters"):
        re(pc)
    with pytest.raises(fk.PolicyError, match=r"at w: .*policy='strict'"):
        re(pc, policy="strict")
    out = re(pc, policy="flat")  # real leaves become complex only because p is complex
    assert out["w"].dtype == xp.complex128
    np.testing.assert_array_equal(to_numpy(out["w"])[0, 0], 1 + 1j)


def test_complex_model_takes_real_part(xp: Any) -> None:
    tree = {"r": xp.asarray([1.0, 2.0], dtype=xp.float64), "c": xp.asarray([3 + 4j], dtype=xp.complex128)}
    with pytest.raises(fk.PolicyError, match=r"at r and c: .*differ in dtype"):
        fk.destructure(tree)
    flat, re = fk.destructure(tree, policy="model")
    assert flat.dtype == xp.complex128
    assert re.dtype == xp.complex128
    np.testing.assert_array_equal(to_numpy(flat), [1, 2, 3 + 4j])
    out = re(xp.asarray([1 + 9j, 2, 3 + 4j], dtype=xp.complex128))
    assert out["r"].dtype == xp.float64
    assert out["c"].dtype == xp.complex128
    np.testing.assert_array_equal(to_numpy(out["r"]), [1.0, 2.0])  # the real part
    np.testing.assert_array_equal(to_numpy(out["c"]), [3 + 4j])
    rows = re.explain(flat).rows
    assert rows[0].how == "copy"
    assert "real part" in rows[0].rule
    assert rows[1].how == "view"
    out = re(xp.asarray([1.0, 2.0, 3.0], dtype=xp.float64))  # real p into a complex parameter: cast
    assert out["c"].dtype == xp.complex128
    assert out["r"].dtype == xp.float64


# --------------------------------------------------------------------------- mixed-dtype models


def test_mixed_dtype_model(xp: Any) -> None:
    tree = {"a": xp.asarray([1.0, 2.0], dtype=xp.float32), "b": {"c": xp.asarray([3.0], dtype=xp.float64)}}
    with pytest.raises(fk.PolicyError) as info:
        fk.destructure(tree)
    msg = str(info.value)
    assert msg.startswith("at a and b.c: ")
    assert "float32" in msg
    assert "float64" in msg
    assert "policy='model'" in msg
    flat, re = fk.destructure(tree, policy="model")
    assert flat.dtype == xp.float64
    assert re.dtype == xp.float64
    out = re(flat)
    assert out["a"].dtype == xp.float32
    assert out["b"]["c"].dtype == xp.float64
    assert [r.how for r in re.explain(flat)] == ["copy", "view"]
    with pytest.raises(fk.PolicyError, match="at a: "):
        re(flat, policy="strict")
    flat2, re2 = fk.destructure(tree, policy="flat")
    out = re2(flat2)
    assert out["a"].dtype == xp.float64
    assert out["b"]["c"].dtype == xp.float64
    np.testing.assert_array_equal(to_numpy(out["a"]), [1.0, 2.0])


# --------------------------------------------------------------------------- devices


def other_device_or_skip(xp: Any, device: Any, backend: Backend) -> Any:
    default = xp.asarray([0.0]).device if hasattr(xp.asarray([0.0]), "device") else "cpu"
    if backend.value not in ("torch", "array_api_strict", "cupy") or str(device) == str(default):
        pytest.skip("this backend has one device here")
    return default


def test_strict_device_mismatch(xp: Any, device: Any, backend: Backend) -> None:
    default = other_device_or_skip(xp, device, backend)
    tree = {"w": xp.asarray([1.0, 2.0], dtype=xp.float64, device=device)}
    flat, re = fk.destructure(tree)
    assert str(flat.device) == str(device)
    assert str(re.device) == str(device)
    p = xp.asarray([7.0, 8.0], dtype=xp.float64, device=default)
    with pytest.raises(fk.PolicyError) as info:
        re(p)
    assert info.value.args[0].startswith("at w: ")
    assert str(device) in str(info.value)
    out = re(p, policy="model")
    assert str(out["w"].device) == str(device)
    out = re(p, policy="flat")
    assert str(out["w"].device) == str(default)
    np.testing.assert_array_equal(to_numpy(out["w"]), [7.0, 8.0])
    if backend.value != "torch":  # meta tensors hold no values
        np.testing.assert_array_equal(to_numpy(re(p, policy="model")["w"]), [7.0, 8.0])


def test_mixed_device_model(xp: Any, device: Any, backend: Backend) -> None:
    default = other_device_or_skip(xp, device, backend)
    tree = {"a": xp.asarray([1.0], dtype=xp.float64, device=device), "b": xp.asarray([2.0], device=default)}
    tree["b"] = xp.asarray([2.0], dtype=xp.float64, device=default)
    with pytest.raises(fk.PolicyError, match=r"at a and b: .*differ in device"):
        fk.destructure(tree)
    if backend.value == "torch":  # `device` is meta, which holds no values: b's would be lost
        for policy in ("model", "flat"):
            with pytest.raises(fk.PolicyError, match=r"at b: the parameter holds values on cpu, but the flat vector"):
                fk.destructure(tree, policy=policy)
        return
    for policy in ("model", "flat"):
        flat, re = fk.destructure(tree, policy=policy)
        assert str(flat.device) == str(device)  # the first parameter's device
    flat, re = fk.destructure(tree, policy="model")
    out = re(flat)
    assert str(out["a"].device) == str(device)
    assert str(out["b"].device) == str(default)
    np.testing.assert_array_equal(to_numpy(out["b"]), [2.0])
    assert [r.how for r in re.explain(flat)] == ["view", "copy"]
    flat, re = fk.destructure(tree, policy="flat")
    out = re(flat)
    assert str(out["b"].device) == str(device)


# --------------------------------------------------------------------------- namespaces


def test_mixed_namespace_model_raises_under_every_policy(xp: Any, backend: Backend) -> None:
    if backend.value in ("numpy", "numpy_readonly"):
        if not importable("array_api_strict"):
            pytest.skip("needs a second namespace")
        import array_api_strict as other
    else:
        import array_api_compat.numpy as other
    tree = {"a": xp.asarray([1.0], dtype=xp.float64), "b": other.asarray([2.0], dtype=other.float64)}
    for policy in ("strict", "model", "flat"):
        with pytest.raises(fk.PolicyError, match=r"at a and b: .*two array namespaces"):
            fk.destructure(tree, policy=policy)


def test_p_of_another_namespace(xp: Any, backend: Backend) -> None:
    if backend.value in ("numpy", "numpy_readonly"):
        pytest.skip("p is NumPy here: the same namespace")
    flat, re = fk.destructure(model(xp))
    p = np.asarray([1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(fk.PolicyError, match=r"at w: .*different namespace"):
        re(p)
    out = re(p, policy="flat")
    assert isinstance(out["w"], np.ndarray)
    assert out["w"].base is not None
    out = re(p, policy="model")
    assert type(out["w"]) is type(flat)
    np.testing.assert_array_equal(to_numpy(out["w"]), [[1.0, 2.0], [3.0, 4.0]])
    assert re.explain(p, policy="model").rows[0].how == "copy"


def test_array_api_strict_two_fake_devices() -> None:
    xps = pytest.importorskip("array_api_strict")
    d1, d2 = xps.Device("device1"), xps.Device("device2")
    f64 = xps.float64
    tree = {"a": xps.asarray([1.0], dtype=f64, device=d1), "b": xps.asarray([2.0, 3.0], dtype=f64, device=d2)}
    with pytest.raises(fk.PolicyError, match=r"at a and b: .*device1.*device2"):
        fk.destructure(tree)
    flat, re = fk.destructure(tree, policy="model")
    assert flat.device == d1
    assert re.device == d1
    out = re(flat)
    assert out["a"].device == d1
    assert out["b"].device == d2
    p2 = xps.asarray([4.0, 5.0, 6.0], dtype=f64, device=d2)
    out = re(p2)
    assert out["a"].device == d1
    assert out["b"].device == d2
    np.testing.assert_array_equal(to_numpy(out["b"]), [5.0, 6.0])
    out = re(p2, policy="flat")
    assert out["a"].device == d2
    assert out["b"].device == d2
    rows = re.explain(p2).rows
    assert [r.how for r in rows] == ["copy", "view"]
    assert rows[0].rule == "model: move array_api_strict.Device('device2') -> array_api_strict.Device('device1')"
