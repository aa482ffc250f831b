"""Ties end to end: tied models destructured, rebuilt, trained one step; aliases refused.

A tie is one array used at two places (the same object, or the same object
behind ``fk.Transpose``): it is one parameter, rebuilt as one array, and its
gradient is the sum of both uses. Two *different* arrays sharing memory (``a``
and ``a.T``) are not a tie but an alias, and ``destructure``/``load_into``
refuse them rather than silently untying them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, to_numpy

N, D, K = 6, 5, 3  # samples, input width, code width
LR = 0.1


def _data(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "W": rng.normal(size=(D, K)) * 0.5,
        "b1": rng.normal(size=K) * 0.1,
        "b2": rng.normal(size=D) * 0.1,
        "x": rng.normal(size=(N, D)),
    }


def autoencoder(xp: Any, data: dict[str, np.ndarray]) -> dict[str, Any]:
    """Encoder ``W``; decoder ``fk.Transpose(W)``: one weight, used twice."""
    W = xp.asarray(data["W"])
    return {
        "enc": {"W": W, "b": xp.asarray(data["b1"])},
        "dec": {"W": fk.Transpose(W), "b": xp.asarray(data["b2"])},
        "act": "tanh",
    }


def ae_loss(xp: Any, model: dict[str, Any], x: Any) -> Any:
    h = xp.tanh(x @ model["enc"]["W"] + model["enc"]["b"])
    # dense() of fk.Transpose(W) is a transposed view of W (array-api-strict arrays refuse `h @ wrapper`)
    y = h @ model["dec"]["W"].dense() + model["dec"]["b"]
    return xp.mean((y - x) ** 2)


def ae_grads_by_hand(data: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The autoencoder's gradients, written out in NumPy: the tied W gets encoder + decoder terms."""
    W, b1, b2, x = data["W"], data["b1"], data["b2"], data["x"]
    h = np.tanh(x @ W + b1)
    y = h @ W.T + b2
    dy = 2.0 * (y - x) / y.size
    dW_dec = dy.T @ h  # y = h W^T
    da = (dy @ W) * (1.0 - h**2)
    dW_enc = x.T @ da  # a = x W
    return {"W": dW_enc + dW_dec, "W_enc": dW_enc, "W_dec": dW_dec, "b1": da.sum(0), "b2": dy.sum(0)}


def as_flat(g: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([g["W"].reshape(-1), g["b1"], g["b2"]])


# --------------------------------------------------------------------------- the tied autoencoder, every backend


def test_tied_autoencoder_destructures_once_and_rebuilds_tied(xp: Any) -> None:
    data = _data()
    model = autoencoder(xp, data)
    flat, re = fk.destructure(model)
    assert len(re) == D * K + K + D  # the tie counted once
    assert [str(p) for p in re.paths] == ["enc.W", "enc.b", "dec.b"]
    np.testing.assert_array_equal(to_numpy(flat), np.concatenate([data["W"].reshape(-1), data["b1"], data["b2"]]))
    out = re(flat * 2)
    assert isinstance(out["dec"]["W"], fk.Transpose)
    assert out["dec"]["W"].parent is out["enc"]["W"]  # rebuilt tied: one array, two places
    assert out["act"] == "tanh"
    np.testing.assert_array_equal(to_numpy(out["dec"]["W"].dense()), 2 * data["W"].T)
    # every other walk keeps the tie too
    for rebuilt in (fk.fmap(lambda a: a * 1, model), fk.copy(model), fk.scale(2.0, model), fk.add(model, model)):
        assert rebuilt["dec"]["W"].parent is rebuilt["enc"]["W"]
    assert [str(p) for p, _ in fk.leaves_with_path(model)] == ["enc.W", "enc.b", "dec.b", "act"]


def test_tied_autoencoder_loss_matches_numpy(xp: Any) -> None:
    data = _data()
    flat, re = fk.destructure(autoencoder(xp, data))
    x = xp.asarray(data["x"])
    W, b1, b2 = data["W"], data["b1"], data["b2"]
    want = np.mean((np.tanh(data["x"] @ W + b1) @ W.T + b2 - data["x"]) ** 2)
    assert float(to_numpy(ae_loss(xp, re(flat), x))) == pytest.approx(want, rel=1e-12)


def test_tied_autoencoder_load_into_keeps_the_tie(xp: Any, backend: Backend) -> None:
    if backend in (Backend.JAX, Backend.DASK, Backend.NUMPY_READONLY):
        pytest.skip("load_into writes in place: needs mutable arrays")
    dst = autoencoder(xp, _data(0))
    src = autoencoder(xp, _data(1))
    fk.load_into(dst, src)
    assert dst["dec"]["W"].parent is dst["enc"]["W"]
    np.testing.assert_array_equal(to_numpy(dst["enc"]["W"]), _data(1)["W"])
    # a tie in dst fed two different values is refused, before anything is written
    src2 = autoencoder(xp, _data(2))
    src2["dec"]["W"] = fk.Transpose(xp.asarray(_data(3)["W"]))
    with pytest.raises(fk.StructureError, match=r"at enc\.W and dec\.W\.parent: "):
        fk.load_into(dst, src2)
    np.testing.assert_array_equal(to_numpy(dst["enc"]["W"]), _data(1)["W"])


# --------------------------------------------------------------------------- one training step, autograd


def test_tied_autoencoder_one_step_torch_autograd() -> None:
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xp

    data = _data()
    flat, re = fk.destructure(autoencoder(xp, data))
    x = torch.from_numpy(data["x"])
    p = flat.clone().requires_grad_(True)
    ae_loss(xp, re(p), x).backward()
    assert p.grad is not None
    hand = ae_grads_by_hand(data)
    np.testing.assert_allclose(p.grad.numpy(), as_flat(hand), rtol=1e-10, atol=1e-12)
    # the one shared gradient is the sum of both uses: neither use alone
    gW = p.grad[: D * K].reshape(D, K).numpy()
    assert not np.allclose(gW, hand["W_enc"])
    assert not np.allclose(gW, hand["W_dec"])
    # one step of gradient descent, rebuilt: still tied, W moved by the summed gradient
    with torch.no_grad():
        stepped = re(p - LR * p.grad)
    assert stepped["dec"]["W"].parent is stepped["enc"]["W"]
    np.testing.assert_allclose(stepped["enc"]["W"].numpy(), data["W"] - LR * hand["W"], rtol=1e-12)
    after = float(ae_loss(xp, stepped, x))
    before = float(ae_loss(xp, re(flat), x))
    assert after < before


def test_tied_autoencoder_one_step_jax_grad() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    data = _data()
    flat, re = fk.destructure(autoencoder(jnp, data))
    x = jnp.asarray(data["x"])

    def loss(p: Any) -> Any:
        return ae_loss(jnp, re(p), x)

    g = jax.grad(loss)(flat)
    hand = ae_grads_by_hand(data)
    np.testing.assert_allclose(np.asarray(g), as_flat(hand), rtol=1e-10, atol=1e-12)
    g_jit = jax.jit(jax.grad(loss))(flat)
    np.testing.assert_allclose(np.asarray(g_jit), as_flat(hand), rtol=1e-10, atol=1e-12)
    stepped = re(flat - LR * g)
    assert stepped["dec"]["W"].parent is stepped["enc"]["W"]
    np.testing.assert_allclose(np.asarray(stepped["enc"]["W"]), data["W"] - LR * hand["W"], rtol=1e-12)
    assert float(loss(flat - LR * g)) < float(loss(flat))


# --------------------------------------------------------------------------- GPT-2 style ties

V, E = 11, 4  # vocabulary, embedding width


def gpt2_dict(xp: Any, seed: int = 0) -> dict[str, Any]:
    """Token embedding reused as the LM head through fk.Transpose."""
    rng = np.random.default_rng(seed)
    wte = xp.asarray(rng.normal(size=(V, E)))
    return {
        "wte": wte,
        "ln": {"g": xp.asarray(1.0 + 0.1 * rng.normal(size=E)), "b": xp.asarray(0.1 * rng.normal(size=E))},
        "lm_head": fk.Transpose(wte),
    }


def gpt2_logits(xp: Any, model: dict[str, Any], idx: Any) -> Any:
    h = xp.reshape(xp.take(model["wte"], xp.reshape(idx, (-1,)), axis=0), (*idx.shape, E))
    mu = xp.mean(h, axis=-1, keepdims=True)
    var = xp.mean((h - mu) ** 2, axis=-1, keepdims=True)
    h = (h - mu) / xp.sqrt(var + 1e-5) * model["ln"]["g"] + model["ln"]["b"]
    return h @ model["lm_head"].dense()


def test_gpt2_transpose_tie_every_backend(xp: Any) -> None:
    model = gpt2_dict(xp)
    flat, re = fk.destructure(model)
    assert len(re) == V * E + 2 * E
    assert [str(p) for p in re.paths] == ["wte", "ln.g", "ln.b"]
    out = re(flat)
    assert out["lm_head"].parent is out["wte"]
    idx = xp.asarray([1, 4, 7])
    logits = gpt2_logits(xp, out, idx)
    assert tuple(logits.shape) == (3, V)
    np.testing.assert_allclose(to_numpy(logits), to_numpy(gpt2_logits(xp, model, idx)), rtol=1e-12)


def untied_grads_summed(torch: Any, model: dict[str, Any], idx: Any) -> np.ndarray:
    """The reference: an untied copy (separate embedding and head arrays); the tied gradient is their sum."""
    wte = model["wte"].detach().clone().requires_grad_(True)
    head = model["wte"].detach().clone().requires_grad_(True)  # same values, a different array
    g = model["ln"]["g"].detach().clone().requires_grad_(True)
    b = model["ln"]["b"].detach().clone().requires_grad_(True)
    h = wte[idx]
    h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + 1e-5) * g + b
    (h @ head.T).logsumexp(-1).sum().backward()
    return torch.cat([(wte.grad + head.grad).reshape(-1), g.grad, b.grad]).numpy()


def test_gpt2_transpose_tie_gradient_is_the_sum_of_both_uses() -> None:
    torch = pytest.importorskip("torch")
    import array_api_compat.torch as xp

    model = gpt2_dict(xp)
    flat, re = fk.destructure(model)
    idx = torch.tensor([[1, 2, 2], [10, 0, 5]])
    p = flat.clone().requires_grad_(True)
    gpt2_logits(xp, re(p), idx).logsumexp(-1).sum().backward()
    np.testing.assert_allclose(p.grad.numpy(), untied_grads_summed(torch, model, idx), rtol=1e-10, atol=1e-12)


def test_gpt2_shared_parameter_module_gradient_is_the_sum_of_both_uses() -> None:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class LM(nn.Module):
        def __init__(self, tied: bool) -> None:
            super().__init__()
            self.wte = nn.Embedding(V, E)
            self.ln = nn.LayerNorm(E)
            self.lm_head = nn.Linear(E, V, bias=False)
            if tied:
                self.lm_head.weight = self.wte.weight  # GPT-2: the same nn.Parameter

        def forward(self, idx: Any) -> Any:
            return self.lm_head(self.ln(self.wte(idx)))

    torch.manual_seed(0)
    lm = LM(tied=True).double()
    with torch.no_grad():
        lm.ln.weight.uniform_(0.5, 1.5)
    flat, re = fk.destructure(lm)
    assert len(re) == V * E + 2 * E
    assert [str(p) for p in re.paths] == ["wte.weight", "ln.weight", "ln.bias"]
    idx = torch.tensor([[1, 2, 2], [10, 0, 5]])
    p = flat.clone().requires_grad_(True)
    rebuilt = re(p)
    assert rebuilt.lm_head.weight is rebuilt.wte.weight
    rebuilt(idx).logsumexp(-1).sum().backward()
    # reference: the untied model with equal values; the tied gradient is the sum of both weights' gradients
    untied = LM(tied=False).double()
    fk.load_into(untied.wte, lm.wte)
    fk.load_into(untied.ln, lm.ln)
    with torch.no_grad():
        untied.lm_head.weight.copy_(lm.wte.weight)
    untied(idx).logsumexp(-1).sum().backward()
    assert untied.wte.weight.grad is not None
    assert untied.lm_head.weight.grad is not None
    want = torch.cat(
        [(untied.wte.weight.grad + untied.lm_head.weight.grad).reshape(-1), untied.ln.weight.grad, untied.ln.bias.grad]
    )
    torch.testing.assert_close(p.grad, want, rtol=1e-10, atol=1e-12)
    # one step on the live model through load_into: the tie in the module stays one parameter
    fk.load_into(lm, re(flat - LR * p.grad))
    assert lm.lm_head.weight is lm.wte.weight
    assert isinstance(lm.wte.weight, nn.Parameter)


def test_gpt2_transpose_tie_jax_grad() -> None:
    jax = pytest.importorskip("jax")
    torch = pytest.importorskip("torch")
    jax.config.update("jax_enable_x64", True)
    import array_api_compat.torch as txp
    import jax.numpy as jnp

    flat, re = fk.destructure(gpt2_dict(jnp))
    idx = jnp.asarray([[1, 2, 2], [10, 0, 5]])
    g = jax.grad(lambda p: jax.nn.logsumexp(gpt2_logits(jnp, re(p), idx), axis=-1).sum())(flat)
    want = untied_grads_summed(torch, gpt2_dict(txp), torch.tensor(np.asarray(idx)))
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------- aliases are refused


def _alias_models(lib: str) -> tuple[Any, Any, Any]:
    """(a 3x2 array, its transposed view, a model of the same structure with separate arrays)."""
    if lib == "numpy":
        a = np.arange(6.0).reshape(3, 2)
        return a, a.T, {"enc": np.zeros((3, 2)), "dec": np.zeros((2, 3))}
    torch = pytest.importorskip("torch")
    t = torch.arange(6.0).reshape(3, 2)
    return t, t.t(), {"enc": torch.zeros(3, 2), "dec": torch.zeros(2, 3)}


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_transposed_view_is_refused_by_destructure_and_load_into(lib: str) -> None:
    a, at, separate = _alias_models(lib)
    model = {"enc": a, "dec": at, "name": "ae"}
    with pytest.raises(fk.StructureError, match=r"at enc and dec: .*fk\.Transpose"):
        fk.destructure(model)
    before = to_numpy(a)
    with pytest.raises(fk.StructureError, match=r"at enc and dec: .*fk\.Transpose"):
        fk.load_into(model, {"enc": separate["enc"] + 1, "dec": separate["dec"] + 1, "name": "ae"})
    np.testing.assert_array_equal(to_numpy(a), before)  # nothing written
    # written with fk.Transpose, the same model is one tied parameter
    flat, re = fk.destructure({"enc": a, "dec": fk.Transpose(a), "name": "ae"})
    assert len(re) == 6
    out = re(flat)
    assert out["dec"].parent is out["enc"]


def test_transposed_view_in_a_module_is_refused() -> None:
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2, bias=False)
    holder = torch.nn.Module()
    holder.enc = lin
    holder.register_buffer("dec_weight", lin.weight.detach().t())  # a view of the parameter's memory
    # a buffer is a constant, but re(p) would give enc.weight its slice of p and keep the buffer:
    # untied silently, so destructure refuses it as load_into does (it passed before, session 10)
    with pytest.raises(fk.StructureError, match=r"at dec_weight and enc\.weight: .*fk\.Transpose"):
        fk.destructure(holder)
    with pytest.raises(fk.StructureError, match=r"at dec_weight and enc\.weight: .*fk\.Transpose"):
        fk.load_into(holder, fk.copy(holder))


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_interleaved_views_are_not_aliases(lib: str) -> None:
    if lib == "numpy":
        base = np.arange(8.0)
    else:
        torch = pytest.importorskip("torch")
        base = torch.arange(8.0)
    model = {"even": base[::2], "odd": base[1::2]}
    flat, _ = fk.destructure(model)
    np.testing.assert_array_equal(to_numpy(flat), [0, 2, 4, 6, 1, 3, 5, 7])
    src = {"even": base[::2] * 0 - 1, "odd": base[1::2] * 0 + 1}
    fk.load_into(model, src)
    np.testing.assert_array_equal(to_numpy(base), [-1, 1, -1, 1, -1, 1, -1, 1])
