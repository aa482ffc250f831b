"""destructure/re(p) under JAX transformations (jit, grad, vmap) and Dask laziness."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

import functorkit as fk


@pytest.fixture
def jnp() -> Any:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    return jnp


def jax_model(jnp: Any) -> dict[str, Any]:
    # keys in sorted order: JAX's own pytree flattening (jit/grad arguments) sorts dict keys
    return {
        "act": "tanh",
        "layers": [{"b": jnp.asarray([0.5, -0.5]), "w": jnp.asarray([[1.0, 2.0], [3.0, 4.0]])}],
        "steps": jnp.asarray([7]),
    }


def loss(m: dict[str, Any], jnp: Any) -> Any:
    layer = m["layers"][0]
    return jnp.sum(jnp.tanh(layer["w"] @ jnp.asarray([1.0, -1.0]) + layer["b"]) ** 2)


def test_jit_and_grad_through_re(jnp: Any) -> None:
    import jax

    model = jax_model(jnp)
    flat, re = fk.destructure(model)
    eager = loss(re(flat), jnp)
    jitted = jax.jit(lambda p: loss(re(p), jnp))(flat)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager))
    g = jax.grad(lambda p: loss(re(p), jnp))(flat)
    g_ref = jax.grad(lambda layers: loss({"layers": layers}, jnp))(model["layers"])
    np.testing.assert_allclose(np.asarray(g), np.asarray(fk.destructure(g_ref)[0]))
    gj = jax.jit(jax.grad(lambda p: loss(re(p), jnp)))(flat)
    np.testing.assert_allclose(np.asarray(gj), np.asarray(g))
    batch = jnp.stack([flat, 2 * flat])
    vm = jax.vmap(lambda p: loss(re(p), jnp))(batch)
    np.testing.assert_allclose(np.asarray(vm), [float(eager), float(loss(re(2 * flat), jnp))])


def test_re_under_jit_keeps_constants_and_policy(jnp: Any) -> None:
    import jax

    model = jax_model(jnp)
    flat, re = fk.destructure(model)

    def f(p: Any) -> Any:
        m = re(p)
        assert m["act"] == "tanh"
        assert m["steps"] is model["steps"]
        return m["layers"][0]["w"]

    np.testing.assert_array_equal(np.asarray(jax.jit(f)(flat)), [[1.0, 2.0], [3.0, 4.0]])
    p32 = flat.astype(jnp.float32)
    with pytest.raises(fk.PolicyError, match=r"at layers\[0\].b: "):
        jax.jit(f)(p32)
    out = jax.jit(lambda p: re(p, policy="model")["layers"][0]["w"])(p32)
    assert out.dtype == jnp.float64
    out = jax.jit(lambda p: re(p, policy="flat")["layers"][0]["w"])(p32)
    assert out.dtype == jnp.float32


def test_destructure_under_jit_device_unknown(jnp: Any) -> None:
    import jax

    model = jax_model(jnp)
    del model["act"]  # jit arguments must be arrays
    eager, _ = fk.destructure(model)
    info: dict[str, Any] = {}

    def f(m: Any) -> Any:
        flat, re = fk.destructure(m)
        info["device"] = re.device
        return re(flat * 2)["layers"][0]["b"]

    out = jax.jit(f)(model)
    assert info["device"] is None  # a tracer's device cannot be determined: counts as equal
    np.testing.assert_array_equal(np.asarray(out), [1.0, -1.0])
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda m: fk.destructure(m)[0])(model)), np.asarray(eager))


def test_jax_restructure_pickles(jnp: Any) -> None:
    model = jax_model(jnp)
    flat, re = fk.destructure(model)
    re2 = pickle.loads(pickle.dumps(re))
    assert re2.device == re.device
    np.testing.assert_array_equal(np.asarray(re2(flat)["layers"][0]["w"]), [[1.0, 2.0], [3.0, 4.0]])


# --------------------------------------------------------------------------- dask


def test_dask_stays_lazy() -> None:
    dask = pytest.importorskip("dask")
    import array_api_compat.dask.array as da

    def no_compute(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("functorkit computed a dask array")

    model = {
        "w": da.reshape(da.arange(6, dtype=da.float64), (2, 3)),
        "b": da.ones(4, dtype=da.float64),
        "idx": da.arange(3),
        "n": 2,
    }
    p32 = da.ones(10, dtype=da.float32)
    with dask.config.set(scheduler=no_compute):
        with pytest.raises(AssertionError, match="computed"):
            model["b"].sum().compute()  # the guard works
        flat, re = fk.destructure(model)
        out = re(flat)
        cast = re(p32, policy="model")
        kept = re(p32, policy="flat")
        again = re.flatten(out)
        text = str(re.explain(p32, policy="model"))
        copied = re(flat, copy=True)
        with pytest.raises(fk.PolicyError):
            re(p32)
    assert "copy" in text
    assert cast["w"].dtype == da.float64
    assert kept["w"].dtype == da.float32
    np.testing.assert_array_equal(np.asarray(flat.compute()), [0, 1, 2, 3, 4, 5, 1, 1, 1, 1])
    np.testing.assert_array_equal(np.asarray(out["w"].compute()), [[0, 1, 2], [3, 4, 5]])
    np.testing.assert_array_equal(np.asarray(again.compute()), np.asarray(flat.compute()))
    np.testing.assert_array_equal(np.asarray(copied["b"].compute()), [1, 1, 1, 1])
    assert out["idx"] is model["idx"]
