"""fk.norm/fk.normalize gradients at zero arrays, and trainable_only= on the arithmetic (SPEC 9)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import to_numpy


class BN:
    """A registered node with a trainable weight, a floating buffer and an integer counter."""

    def __init__(self, w: Any, running: Any, count: Any) -> None:
        self.w, self.running, self.count = w, running, count


fk.register(
    BN,
    children=lambda o: ({"w": o.w, "running": o.running, "count": o.count}, None),
    rebuild=lambda aux, ch: BN(ch["w"], ch["running"], ch["count"]),
    trainable=lambda o: ["w"],
)


def _model(xp: Any, k: float) -> dict[str, Any]:
    return {
        "lin": {"w": xp.asarray([[1.0 * k, -2.0], [0.5, k]]), "b": xp.zeros(2)},
        "bn": BN(xp.asarray([k, 2.0]), xp.asarray([0.1 * k, 3.0 - k]), xp.asarray([7], dtype=xp.int64)),
    }


def _np(tree: Any) -> dict[str, np.ndarray]:
    return {str(p): to_numpy(x) for p, x in fk.leaves_with_path(tree)}


# --------------------------------------------------------------------------- norm / normalize values


@pytest.mark.parametrize("ord", [2, 1, 3, math.inf])
def test_norm_with_zero_arrays_equals_numpy_on_every_backend(xp: Any, ord: float) -> None:
    m = _model(xp, 2.0)
    got = float(fk.norm(m, ord=ord))
    params = np.concatenate([to_numpy(m["lin"]["w"]).ravel(), np.zeros(2), to_numpy(m["bn"].w)])
    rel = 1e-6 if to_numpy(m["lin"]["w"]).dtype == np.float32 else 1e-12  # torch builds float32
    assert got == pytest.approx(np.linalg.norm(params, ord=ord), rel=rel)
    everything = np.concatenate([params, to_numpy(m["bn"].running)])
    got_all = float(fk.norm(m, ord=ord, trainable_only=False))
    assert got_all == pytest.approx(np.linalg.norm(everything, ord=ord), rel=rel)


def test_norm_and_normalize_of_an_all_zero_model(xp: Any) -> None:
    m = {"w": xp.zeros((2, 2)), "b": xp.zeros(3)}
    assert float(fk.norm(m)) == 0.0
    assert float(fk.norm(m, ord=3)) == 0.0
    out = fk.normalize(m)  # zeros, not NaN (documented)
    for x in fk.leaves(out):
        np.testing.assert_array_equal(to_numpy(x), np.zeros(tuple(x.shape)))
    unit = fk.normalize({"w": xp.asarray([3.0, 4.0]), "b": xp.zeros(1)})
    np.testing.assert_allclose(to_numpy(unit["w"]), [0.6, 0.8])
    np.testing.assert_array_equal(to_numpy(unit["b"]), [0.0])


# --------------------------------------------------------------------------- gradients


def _expected_grad(m: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = math.sqrt(sum(float((v**2).sum()) for v in m.values()))
    return {k: (v / n if n else np.zeros_like(v)) for k, v in m.items()}


CASES = {
    "zero bias": {"w": [[3.0, 0.0], [0.0, 4.0]], "b": [0.0, 0.0]},
    "all zero": {"w": [[0.0, 0.0], [0.0, 0.0]], "b": [0.0, 0.0]},
}


@pytest.mark.parametrize("case", list(CASES))
def test_norm_gradient_under_jax_grad(case: str) -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    m = {k: jnp.asarray(v) for k, v in CASES[case].items()}
    g = jax.grad(lambda t: fk.norm(t))(m)
    want = _expected_grad({k: np.asarray(v) for k, v in CASES[case].items()})
    for k in want:
        assert np.all(np.isfinite(np.asarray(g[k]))), k
        np.testing.assert_allclose(np.asarray(g[k]), want[k], atol=1e-12)
    g2 = jax.grad(lambda t: fk.norm(t) ** 2)(m)  # the case: 2 * m
    for k in want:
        np.testing.assert_allclose(np.asarray(g2[k]), 2 * np.asarray(m[k]), atol=1e-12)
    gn = jax.grad(lambda t: jnp.sum(fk.normalize(t)["w"]))(m)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in gn.values())


@pytest.mark.parametrize("case", list(CASES))
def test_norm_gradient_under_torch_func_grad_and_autograd(case: str) -> None:
    torch = pytest.importorskip("torch")
    m = {k: torch.tensor(v, dtype=torch.float64) for k, v in CASES[case].items()}
    want = _expected_grad({k: np.asarray(v) for k, v in CASES[case].items()})
    g = torch.func.grad(lambda t: fk.norm(t))(m)
    leaves = {k: v.clone().requires_grad_(True) for k, v in m.items()}
    fk.norm(leaves).backward()
    g3 = torch.func.grad(lambda t: fk.norm(t, ord=3))(m)
    for k in want:
        np.testing.assert_allclose(g[k].numpy(), want[k], atol=1e-12)
        np.testing.assert_allclose(leaves[k].grad.numpy(), want[k], atol=1e-12)
        assert torch.isfinite(g3[k]).all(), k
    gn = torch.func.grad(lambda t: fk.normalize(t)["w"].sum())(m)
    assert all(torch.isfinite(v).all() for v in gn.values())


def test_norm_gradient_of_a_module_with_a_zero_bias() -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Linear(3, 2)
    with torch.no_grad():
        net.bias.zero_()
    fk.norm(net).backward()
    n = torch.cat([net.weight.detach().ravel(), net.bias.detach()]).norm()
    torch.testing.assert_close(net.weight.grad, net.weight.detach() / n)
    torch.testing.assert_close(net.bias.grad, torch.zeros(2))


ORDS = [0.5, -1.0, -2.0, 1.0, math.inf, -math.inf, 2.0, 3.0]


@pytest.mark.parametrize("o", ORDS)
@pytest.mark.parametrize("lib", ["torch", "jax"])
def test_norm_gradients_at_zero_entries_are_torch_vector_norms_for_every_ord(lib: str, o: float) -> None:
    """A zero bias and an all-zero model: the gradient of fk.norm(ord=o) is torch.linalg.vector_norm's
    of the concatenated values, on torch and JAX (ord < 1 gave NaN or inf at zero entries; JAX's
    abs and max gave ord=1 and inf non-zero gradients at 0)."""
    torch = pytest.importorskip("torch")
    for vals in ({"w": [1.0, -2.0], "b": [0.0, 0.0]}, {"w": [0.0, 0.0], "b": [0.0, 0.0]}):
        ref = torch.tensor([*vals["w"], *vals["b"]], dtype=torch.float64, requires_grad=True)
        torch.linalg.vector_norm(ref, ord=o).backward()
        assert ref.grad is not None
        want = ref.grad.numpy()
        if lib == "torch":
            m = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in vals.items()}
            fk.norm(m, ord=o).backward()
            got = np.concatenate([m["w"].grad.numpy(), m["b"].grad.numpy()])
        else:
            jax = pytest.importorskip("jax")
            jnp = jax.numpy
            g = jax.grad(lambda t: fk.norm(t, ord=o))({k: jnp.asarray(v, dtype=jnp.float32) for k, v in vals.items()})
            got = np.concatenate([np.asarray(g["w"]), np.asarray(g["b"])]).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- trainable_only


def test_trainable_only_false_averages_buffers_and_keeps_integers(xp: Any) -> None:
    ms = [_model(xp, k) for k in (1.0, 2.0, 4.0)]
    raw = [_np(m) for m in ms]
    soup = _np(fk.mean(ms, trainable_only=False))
    params_only = _np(fk.mean(ms))
    for key, first in raw[0].items():
        # the hand-written state-dict loop: floating entries averaged, integer ones from the first model
        want = (raw[0][key] + raw[1][key] + raw[2][key]) / 3 if first.dtype.kind == "f" else first
        np.testing.assert_allclose(soup[key], want, rtol=1e-15, err_msg=key)  # XLA may use 1/3
        assert soup[key].dtype == first.dtype
    np.testing.assert_array_equal(params_only["bn.running"], raw[0]["bn.running"])  # a buffer: default skips it
    assert not np.array_equal(soup["bn.running"], raw[0]["bn.running"])


def test_trainable_only_false_task_arithmetic_matches_the_loop(xp: Any) -> None:
    base, ft1, ft2 = (_model(xp, k) for k in (1.0, 2.0, 4.0))
    lam = 0.5
    tvs = [fk.sub(ft, base, trainable_only=False) for ft in (ft1, ft2)]
    out = _np(fk.lincomb([1.0, lam, lam], [base, *tvs], trainable_only=False))
    b, f1, f2 = _np(base), _np(ft1), _np(ft2)
    for key in b:
        if b[key].dtype.kind == "f":
            want = b[key] * 1.0 + lam * (f1[key] - b[key]) + lam * (f2[key] - b[key])
        else:
            want = b[key]
        np.testing.assert_allclose(out[key], want, rtol=1e-15, err_msg=key)
    # every other operation takes the flag
    two = _np(fk.add(base, ft1, trainable_only=False))
    np.testing.assert_array_equal(two["bn.running"], b["bn.running"] + f1["bn.running"])
    np.testing.assert_array_equal(two["bn.count"], b["bn.count"])
    half = _np(fk.scale(0.5, ft1, trainable_only=False))
    np.testing.assert_array_equal(half["bn.running"], f1["bn.running"] * 0.5)
    mid = _np(fk.lerp(base, ft2, 0.25, trainable_only=False))
    np.testing.assert_allclose(mid["bn.running"], b["bn.running"] + 0.25 * (f2["bn.running"] - b["bn.running"]))
    d = float(fk.dot(base, ft1, trainable_only=False))
    assert d == pytest.approx(sum(float((b[k] * f1[k]).sum()) for k in b if b[k].dtype.kind == "f"))


def test_trainable_only_must_be_a_bool(xp: Any) -> None:
    m = _model(xp, 1.0)
    with pytest.raises(TypeError, match="trainable_only"):
        fk.add(m, m, trainable_only=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="trainable_only"):
        fk.norm(m, trainable_only="no")  # type: ignore[arg-type]


def test_model_soup_of_torch_modules_matches_state_dict_loops() -> None:
    torch = pytest.importorskip("torch")

    def make(seed: int) -> Any:
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
        net[2].weight.requires_grad_(False)  # a frozen parameter
        net.train()
        net(torch.randn(8, 3))  # running statistics and num_batches_tracked move
        return net

    nets = [make(s) for s in range(3)]
    sds = [n.state_dict() for n in nets]
    soup = fk.mean(nets, trainable_only=False).state_dict()
    for key, v in sds[0].items():
        want = (sds[0][key] + sds[1][key] + sds[2][key]) / 3 if v.is_floating_point() else v
        torch.testing.assert_close(soup[key], want, rtol=0, atol=0, msg=key)
    default = fk.mean(nets).state_dict()
    torch.testing.assert_close(default["1.running_mean"], sds[0]["1.running_mean"], rtol=0, atol=0)
    torch.testing.assert_close(default["2.weight"], sds[0]["2.weight"], rtol=0, atol=0)  # frozen: first model's
