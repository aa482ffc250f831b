"""destructure/re(p) with torch: nn.Module models, ties, autograd and torch.func through re."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import functorkit as fk  # noqa: E402

# torch's own forward-AD setup (first jvp/make_dual) scripts decompositions with the deprecated torch.jit.script
TORCH_JIT_WARNING = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(3, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)
        self.scale = 2.0

    def forward(self, x: Any) -> Any:
        return self.fc2(torch.tanh(self.bn(self.fc1(x)))) * self.scale


class TiedLM(nn.Module):
    """GPT-2 style weight tying: head.weight = emb.weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: Any) -> Any:
        return self.head(self.ln(self.emb(idx)))


def reference_grads(model: nn.Module, paths: list[str], loss_of_output: Any, *args: Any) -> Any:
    """Gradients w.r.t. the parameters at `paths`, by torch.func.functional_call."""
    named = dict(model.named_parameters())
    vals = {n: named[n].detach().clone().requires_grad_(True) for n in paths}
    out = torch.func.functional_call(model, vals, args, tie_weights=True)
    grads = torch.autograd.grad(loss_of_output(out), [vals[n] for n in paths])
    return torch.cat([g.reshape(-1) for g in grads])


def test_module_parameters_buffers_and_frozen() -> None:
    torch.manual_seed(0)
    net = Net().eval()
    net.fc2.bias.requires_grad_(False)  # a frozen parameter: a constant
    flat, re = fk.destructure(net)
    assert [str(p) for p in re.paths] == ["fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "fc2.weight"]
    assert len(re) == 24 + 8 + 8 + 8 + 16
    assert not flat.requires_grad
    assert flat.grad_fn is None
    np.testing.assert_array_equal(
        flat.numpy(),
        torch.cat([net.fc1.weight.reshape(-1), net.fc1.bias, net.bn.weight, net.bn.bias, net.fc2.weight.reshape(-1)])
        .detach()
        .numpy(),
    )
    new = re(flat * 0 + 1)
    assert type(new) is Net
    assert new is not net
    assert new.scale == 2.0
    assert type(new.fc1.weight) is torch.Tensor  # a plain view, not a new nn.Parameter
    assert new.bn.running_mean is net.bn.running_mean
    assert new.bn.num_batches_tracked is net.bn.num_batches_tracked
    assert new.fc2.bias is net.fc2.bias
    assert torch.equal(new.fc1.weight, torch.ones(8, 3))
    # the rebuilt module destructures again, with the same plan
    flat2, re2 = fk.destructure(new)
    assert re2.paths == re.paths
    assert torch.equal(flat2, torch.ones(len(re)))
    assert torch.equal(re.flatten(new), torch.ones(len(re)))


def test_views_share_p_and_gradients_match_functional_call() -> None:
    torch.manual_seed(0)
    net = Net().eval()
    flat, re = fk.destructure(net)
    x = torch.randn(5, 3)
    p = flat.clone().requires_grad_(True)
    new = re(p)
    assert new.fc1.weight.requires_grad
    assert new.fc1.weight.grad_fn is not None
    loss = new(x).pow(2).sum()
    loss.backward()
    ref = reference_grads(net, [str(q) for q in re.paths], lambda out: out.pow(2).sum(), x)
    torch.testing.assert_close(p.grad, ref)
    # no-grad p: as_strided views of p's storage
    view = re(flat)
    assert view.fc1.weight.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    with torch.no_grad():
        flat[0] = 123.0
    assert view.fc1.weight[0, 0].item() == 123.0


def test_gpt2_style_tie() -> None:
    torch.manual_seed(0)
    lm = TiedLM()
    flat, re = fk.destructure(lm)
    assert [str(p) for p in re.paths] == ["emb.weight", "ln.weight", "ln.bias"]
    assert len(re) == 40 + 4 + 4
    p = flat.clone().requires_grad_(True)
    new = re(p)
    assert new.head.weight is new.emb.weight
    idx = torch.tensor([1, 2, 3])
    new(idx).sum().backward()
    ref = reference_grads(lm, [str(q) for q in re.paths], lambda out: out.sum(), idx)
    torch.testing.assert_close(p.grad, ref)  # gradient from both uses of the tied weight


@TORCH_JIT_WARNING
def test_torch_func_grad_vmap_jvp_through_re() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    flat, re = fk.destructure(net)
    x = torch.randn(6, 3)

    def loss(p: Any) -> Any:
        return re(p)(x).pow(2).sum()

    g = torch.func.grad(loss)(flat)
    p = flat.clone().requires_grad_(True)
    loss(p).backward()
    torch.testing.assert_close(g, p.grad)
    batch = torch.stack([flat, flat * 2])
    torch.testing.assert_close(torch.func.vmap(loss)(batch), torch.stack([loss(flat), loss(flat * 2)]))
    t = torch.randn(len(re))
    value, tangent = torch.func.jvp(loss, (flat,), (t,))
    torch.testing.assert_close(value, loss(flat))
    torch.testing.assert_close(tangent, (g * t).sum())


@TORCH_JIT_WARNING
@pytest.mark.parametrize("big", [False, True])
def test_torch_func_grad_vmap_jvp_through_destructure_and_flatten(big: bool) -> None:
    # inside a transform the flat vector is made of the wrapped tensors themselves: derivatives and
    # the batch dimension go through it (detached copies gave zero gradients and tangents, silently)
    n = 300_000 if big else 3  # (1.2 MB: past the small vectors' torch.cat)
    m = {"w": torch.linspace(-1.0, 2.0, n), "b": torch.tensor([3.0]), "k": torch.ones(2, 2, dtype=torch.float64)}
    _, re = fk.destructure(m, policy="model")

    def reference(mm: Any) -> Any:
        return torch.cat([mm["w"].reshape(-1).double(), mm["b"].double(), mm["k"].reshape(-1)])

    def f(mm: Any) -> Any:
        return (fk.destructure(mm, policy="model")[0] ** 2).sum()

    want = torch.func.grad(lambda mm: (reference(mm) ** 2).sum())(m)
    for got in (torch.func.grad(f)(m), torch.func.grad(lambda mm: (re.flatten(mm) ** 2).sum())(m)):
        for k in m:
            torch.testing.assert_close(got[k], want[k])
            assert torch.count_nonzero(got[k]) > 0
    tangents = {k: torch.ones_like(v) for k, v in m.items()}
    _, t = torch.func.jvp(lambda mm: fk.destructure(mm, policy="model")[0], (m,), (tangents,))
    torch.testing.assert_close(t, torch.ones_like(t))
    batched = torch.func.vmap(lambda w: fk.destructure({"w": w, "b": m["b"]})[0])(torch.stack([m["w"], 2 * m["w"]]))
    torch.testing.assert_close(batched[1, :n], 2 * m["w"])
    torch.testing.assert_close(batched[:, n], torch.full((2,), 3.0))
    buf = torch.empty(len(re), dtype=torch.float64)
    with pytest.raises(TypeError, match=r"without out= inside a transform"):
        torch.func.grad(lambda mm: (re.flatten(mm, out=buf) ** 2).sum())(m)


@TORCH_JIT_WARNING
def test_forward_mode_dual_tensor() -> None:
    import torch.autograd.forward_ad as fwAD

    flat, re = fk.destructure({"w": torch.ones(2, 2), "b": torch.zeros(3)})
    t = torch.arange(7.0)
    with fwAD.dual_level():
        out = re(fwAD.make_dual(flat, t))
        tangent = fwAD.unpack_dual(out["w"]).tangent
        assert tangent is not None
        torch.testing.assert_close(tangent, t[:4].reshape(2, 2))
        torch.testing.assert_close(fwAD.unpack_dual(out["b"]).tangent, t[4:])


def test_tensor_subclass_p_is_not_unwrapped() -> None:
    class Tagged(torch.Tensor):
        pass

    flat, re = fk.destructure({"w": torch.ones(2, 2), "b": torch.zeros(1)})
    p = flat.as_subclass(Tagged)
    out = re(p)
    assert type(out["w"]) is Tagged
    assert type(out["b"]) is Tagged
    out = re(nn.Parameter(flat.clone()))
    assert out["w"].requires_grad
    assert out["w"].shape == (2, 2)


def test_meta_model() -> None:
    net = nn.Linear(3, 2, device="meta")
    flat, re = fk.destructure(net)
    assert flat.device.type == "meta"
    assert len(re) == 8
    assert re.device == torch.device("meta")
    new = re(torch.empty(8, device="meta"))
    assert new.weight.device.type == "meta"
    assert new.weight.shape == (2, 3)


def test_bfloat16_and_conj_leaves() -> None:
    w = torch.arange(4.0, dtype=torch.bfloat16)
    flat, re = fk.destructure({"w": w})
    assert flat.dtype == torch.bfloat16
    assert torch.equal(flat, w)
    assert re(flat)["w"].dtype == torch.bfloat16
    c = (torch.arange(3.0) * (1 + 2j)).to(torch.complex64).conj()
    flat, re = fk.destructure({"c": c})
    assert torch.equal(flat, c.resolve_conj())


def test_large_flat_is_an_ordinary_tensor() -> None:
    # 1 MiB and more: allocated by NumPy (huge pages) and wrapped; check it behaves like any tensor
    tree = {"a": torch.randn(300_000), "b": torch.randn(100, 1000, dtype=torch.float64)}
    with pytest.raises(fk.PolicyError):
        fk.destructure(tree)
    flat, re = fk.destructure(tree, policy="model")
    assert flat.dtype == torch.float64
    assert type(flat) is torch.Tensor
    assert flat.is_contiguous()
    torch.testing.assert_close(flat[:300_000], tree["a"].double())
    torch.testing.assert_close(flat[300_000:], tree["b"].reshape(-1))
    flat += 1  # writable, not aliasing the model
    assert not torch.equal(flat[300_000:], tree["b"].reshape(-1))
    out = re(flat)
    assert out["a"].dtype == torch.float32
    buf = torch.empty(len(re), dtype=torch.float64)
    assert re.flatten(tree, out=buf) is buf
    torch.testing.assert_close(buf[300_000:], tree["b"].reshape(-1))


def test_params_requiring_grad_never_leak_history() -> None:
    w = torch.randn(3, requires_grad=True)
    flat, re = fk.destructure({"w": w * 2})  # a non-leaf tensor with history
    assert flat.grad_fn is None
    assert not flat.requires_grad
    assert re.flatten({"w": w}).grad_fn is None


def test_pickle_module_plan() -> None:
    torch.manual_seed(0)
    net = Net().eval()
    flat, re = fk.destructure(net)
    re2 = pickle.loads(pickle.dumps(re))
    new = re2(flat)
    x = torch.randn(4, 3)
    torch.testing.assert_close(new(x), net(x))


def test_torch_alias_detected() -> None:
    a = torch.randn(3, 3)
    with pytest.raises(fk.StructureError, match="at w and wt: "):
        fk.destructure({"w": a, "wt": a.t()})


@pytest.mark.parametrize("policy", ["model", "flat"])
def test_meta_parameter_after_a_cpu_one_is_a_policy_error_naming_its_path(policy: str) -> None:
    model = {"a": torch.ones(2), "b": torch.ones(3, device="meta")}
    with pytest.raises(fk.PolicyError, match=r"at b: the parameter is on meta, which holds no values.*cpu"):
        fk.destructure(model, policy=policy)
    flat, re = fk.destructure({"a": torch.ones(2, device="meta"), "b": torch.ones(3, device="meta")})
    assert flat.device.type == "meta"
    assert len(re) == 5


@pytest.mark.parametrize("policy", ["model", "flat"])
def test_a_cpu_parameter_after_a_meta_one_is_a_policy_error_naming_its_path(policy: str) -> None:
    # the flat vector goes on the first parameter's device: meta, which holds no values, so the
    # cpu parameter's values were silently lost (and re(flat) raised torch's raw error)
    model = {"b": torch.ones(3, device="meta"), "a": torch.ones(2)}
    with pytest.raises(fk.PolicyError, match=r"at a: the parameter holds values on cpu, but the flat vector is on"):
        fk.destructure(model, policy=policy)
    _, re = fk.destructure({"b": torch.ones(3, device="meta"), "a": torch.ones(2, device="meta")})
    with pytest.raises(fk.PolicyError, match=r"at a: the parameter holds values on cpu, but the flat vector is on"):
        re.flatten(model, policy=policy)


@pytest.mark.parametrize("policy", ["model", "flat"])
def test_flatten_of_a_meta_parameter_into_a_cpu_flat_vector_names_its_path(policy: str) -> None:
    _, re = fk.destructure({"a": torch.ones(2), "b": torch.ones(3)})
    with pytest.raises(fk.PolicyError, match=r"at b: the parameter is on meta, which holds no values.*cpu"):
        re.flatten({"a": torch.ones(2), "b": torch.ones(3, device="meta")}, policy=policy)
