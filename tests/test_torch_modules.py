"""``torch.nn.Module`` trees as first-class models (SPEC sections 2-6 on modules)."""

from __future__ import annotations

import copy as stdcopy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import functorkit as fk  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# torch's own forward-AD setup (first jvp/make_dual) scripts decompositions with the deprecated torch.jit.script
TORCH_JIT_WARNING = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


# --------------------------------------------------------------------------- models


class Realistic(nn.Module):
    """conv + batchnorm + embedding + layernorm + Sequential of linears + ModuleDict of heads."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.emb = nn.Embedding(12, 4)
        self.ln = nn.LayerNorm(4)
        self.layers = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4))
        self.heads = nn.ModuleDict({"cls": nn.Linear(4, 3), "reg": nn.Linear(4, 1, bias=False)})

    def forward(self, img: Any, idx: Any) -> Any:
        a = torch.relu(self.bn(self.conv(img))).mean(dim=(2, 3))
        b = self.emb(idx).mean(dim=1)
        h = self.layers(self.ln(a + b))
        return torch.cat([self.heads["cls"](h), self.heads["reg"](h)], dim=1)


def realistic(seed: int = 0) -> Realistic:
    torch.manual_seed(seed)
    m = Realistic()
    with torch.no_grad():  # non-trivial running statistics
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 1.5)
    m.bn.num_batches_tracked += 3
    return m.eval()


def realistic_inputs(seed: int = 1) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 3, 6, 6, generator=g), torch.randint(0, 12, (5, 7), generator=g)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x: Any) -> Any:
        return torch.tanh(self.fc(x))


class Custom(nn.Module):
    """Own parameter and buffers, nested containers, and attributes that are not children."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([1.5]))
        self.register_buffer("shift", torch.tensor([0.25]))
        self.register_buffer("cache", torch.zeros(2), persistent=False)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.plist = nn.ParameterList([nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(2, 2))])
        self.pdict = nn.ParameterDict({"alpha": nn.Parameter(torch.randn(3)), "beta": nn.Parameter(torch.randn(1))})
        # not children: torch does not register these either
        self.extra = {"t": torch.ones(3)}
        self.plain_tensor = torch.full((2,), 7.0)
        self.name = "custom"

    def forward(self, x: Any) -> Any:
        for b in self.blocks:
            x = b(x)
        return x * self.scale + self.shift + self.plist[0] + self.pdict["beta"]


def zoo() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "sequential": nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)),
        "modulelist": nn.ModuleList([nn.Linear(2, 2), nn.LayerNorm(2)]),
        "moduledict": nn.ModuleDict({"enc": nn.Linear(2, 3), "norm": nn.BatchNorm1d(3)}),
        "parameterlist": nn.ParameterList([nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(2, 2))]),
        "parameterdict": nn.ParameterDict({"a": nn.Parameter(torch.randn(2)), "b": nn.Parameter(torch.randn(3))}),
        "custom": Custom(),
        "nested": nn.Sequential(nn.Sequential(nn.Linear(2, 2), nn.ModuleList([Block()])), nn.Embedding(5, 4)),
        "realistic": realistic(),
    }


def sd_key_to_path(key: str) -> str:
    """A ``state_dict`` key written the way KeyPath prints it: ``layers.0.weight`` -> ``layers[0].weight``."""
    parts = []
    for i, part in enumerate(key.split(".")):
        if part.isdigit():
            parts.append(f"[{part}]")
        else:
            parts.append(part if i == 0 else "." + part)
    return "".join(parts)


def state(m: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in m.state_dict(keep_vars=True).items()}


def record(m: nn.Module) -> dict[str, Any]:
    """Everything a walk must not change in a module tree."""
    out: dict[str, Any] = {"state": state(m)}
    for name, mod in m.named_modules(remove_duplicate=False):
        d = mod.__dict__
        out[f"{name}/dicts"] = {k: (id(v), list(v) if isinstance(v, (dict, set)) else v) for k, v in d.items()}
        out[f"{name}/objects"] = [(k, id(v), getattr(v, "requires_grad", None)) for k, v in d["_parameters"].items()]
        out[f"{name}/buffers"] = [(k, id(v)) for k, v in d["_buffers"].items()]
        out[f"{name}/modules"] = [(k, id(v)) for k, v in d["_modules"].items()]
        out[f"{name}/hooks"] = {
            k: list(v.items()) for k, v in d.items() if k.endswith("hooks") and isinstance(v, dict) and v
        }
        out[f"{name}/training"] = mod.training
    return out


def assert_unchanged(before: dict[str, Any], m: nn.Module) -> None:
    after = record(m)
    assert after.keys() == before.keys()
    for k, v in before.items():
        if k == "state":
            assert after[k].keys() == v.keys()
            for name, arr in v.items():
                np.testing.assert_array_equal(after[k][name], arr, err_msg=name)
        else:
            assert after[k] == v, k


def param_items(m: nn.Module) -> list[tuple[str, Any]]:
    """Trainable parameters in walk order (what destructure flattens)."""
    return [(n, p) for n, p in m.named_parameters() if p.requires_grad]


def reference_grads(model: nn.Module, names: list[str], loss: Callable[[Any], Any], *args: Any) -> Any:
    """Gradients w.r.t. the named parameters, by torch.func.functional_call (independent of functorkit)."""
    named = dict(model.named_parameters())
    vals = {n: named[n].detach().clone().requires_grad_(True) for n in names}
    out = torch.func.functional_call(model, vals, args, tie_weights=True)
    grads = torch.autograd.grad(loss(out), [vals[n] for n in names])
    return torch.cat([g.reshape(-1) for g in grads])


# --------------------------------------------------------------------------- walking


def test_paths_read_like_state_dict_keys() -> None:
    m = realistic()
    paths = [str(p) for p, _ in fk.leaves_with_path(m)]
    keys = list(m.state_dict().keys())
    assert len(paths) == len(keys) == 17
    assert paths == [sd_key_to_path(k) for k in keys]
    assert paths[10:14] == ["layers[0].weight", "layers[0].bias", "layers[2].weight", "layers[2].bias"]
    assert "bn.running_mean" in paths
    assert "bn.num_batches_tracked" in paths
    # the leaves are the state_dict's tensors themselves, in the same order
    for (_, leaf), v in zip(fk.leaves_with_path(m), m.state_dict(keep_vars=True).values(), strict=True):
        assert leaf is v
    # paths fetch their tensor back
    for p, leaf in fk.leaves_with_path(m):
        assert p.get(m) is leaf


@pytest.mark.parametrize("name", list(zoo()))
def test_paths_match_state_dict_on_every_container(name: str) -> None:
    m = zoo()[name]
    persistent = [sd_key_to_path(k) for k in m.state_dict()]
    walked = [str(p) for p, _ in fk.leaves_with_path(m)]
    # non-persistent buffers are children too (torch keeps them out of state_dict only)
    non_persistent = {
        f"{prefix}.{b}".lstrip(".") for prefix, mod in m.named_modules() for b in mod._non_persistent_buffers_set
    }
    assert [p for p in walked if p not in {sd_key_to_path(k) for k in non_persistent}] == persistent


def test_children_are_parameters_buffers_and_submodules_only() -> None:
    m = Custom()
    paths = [str(p) for p, _ in fk.leaves_with_path(m)]
    assert paths == [
        "scale",
        "shift",
        "cache",
        "blocks[0].steps",
        "blocks[0].fc.weight",
        "blocks[0].fc.bias",
        "blocks[1].steps",
        "blocks[1].fc.weight",
        "blocks[1].fc.bias",
        "plist[0]",
        "plist[1]",
        "pdict.alpha",
        "pdict.beta",
    ]
    # a plain dict of tensors, a plain tensor attribute and a string are not walked: never given to f ...
    seen: list[int] = []
    out = fk.fmap(lambda x: seen.append(id(x)) or x, m)
    assert id(m.extra["t"]) not in seen
    assert id(m.plain_tensor) not in seen
    # ... and shared, as they are, by the rebuilt module
    assert out.extra is m.extra
    assert out.plain_tensor is m.plain_tensor
    assert out.name == "custom"
    doubled = fk.fmap(lambda x: x * 2, m, trainable_only=True)
    assert torch.equal(doubled.extra["t"], torch.ones(3))
    _, re = fk.destructure(m)
    assert len(re) == 1 + 2 * (16 + 4) + 4 + 4 + 3 + 1


def test_none_slots_are_kept_and_not_children() -> None:
    lin = nn.Linear(3, 2, bias=False)
    assert [str(p) for p, _ in fk.leaves_with_path(lin)] == ["weight"]
    out = fk.fmap(lambda x: x + 1, lin)
    assert out.bias is None
    assert "bias" in out._parameters
    assert list(out._parameters) == list(lin._parameters)


class _Sections(nn.Module):
    """Parameters, buffers and submodules in one module, digit and word names mixed, a None slot
    in the middle of each section when `holes`."""

    def __init__(self, holes: bool) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(2))
        if holes:
            self.register_parameter("gap", None)
        self.register_parameter("3", nn.Parameter(torch.full((2,), 3.0)))
        self.register_buffer("running", torch.zeros(2))
        if holes:
            self.register_buffer("none_buffer", None)
        self.register_buffer("10", torch.full((1,), 10.0), persistent=False)
        self.add_module("0", nn.Linear(2, 2))
        if holes:
            self.add_module("empty", None)
        self.add_module("tail", nn.Sequential(nn.Linear(2, 1), nn.ReLU()))


@pytest.mark.parametrize("holes", [False, True])
def test_every_section_layout_is_rebuilt_in_order(holes: bool) -> None:
    # a module's children are recorded per section (parameters, buffers, submodules) and rebuilt into
    # the same sections, names and order, None slots included, by every rebuild
    m = _Sections(holes)
    flat, re = fk.destructure(m)
    rebuilt = {
        "fmap": fk.fmap(lambda x: x + 1, m, trainable_only=False),
        "copy": fk.copy(m),
        "re(p)": re(flat * 2),
        "unflatten": fk.unflatten(fk.flatten(m)[1], fk.flatten(m)[0]),
        "combine": fk.combine(*fk.partition(m, lambda p, x: "tail" in str(p))),
    }
    for how, out in rebuilt.items():
        for section in ("_parameters", "_buffers", "_modules"):
            assert list(getattr(out, section)) == list(getattr(m, section)), (how, section)
            for name, v in getattr(m, section).items():
                assert (getattr(out, section)[name] is None) == (v is None), (how, section, name)
        assert list(out.state_dict()) == list(m.state_dict()), how
        assert out._non_persistent_buffers_set == {"10"}, how
    assert torch.equal(rebuilt["fmap"]._buffers["10"], torch.full((1,), 11.0))
    assert torch.equal(rebuilt["re(p)"]._parameters["3"], torch.full((2,), 6.0))
    assert [str(p) for p, _ in fk.leaves_with_path(m)][:4] == ["a", "[3]", "running", "[10]"]


def test_odd_child_names() -> None:
    # only canonical decimal names become integer keys: every key maps back to its name
    md = nn.ModuleDict({"007": nn.Linear(1, 1), "7": nn.Linear(1, 1), "a-b": nn.Linear(1, 1), "x²": nn.Linear(1, 1)})
    paths = [str(p) for p, _ in fk.leaves_with_path(md)]
    assert paths == [
        "['007'].weight",
        "['007'].bias",
        "[7].weight",
        "[7].bias",
        "['a-b'].weight",
        "['a-b'].bias",
        "['x²'].weight",
        "['x²'].bias",
    ]
    for p, leaf in fk.leaves_with_path(md):
        assert p.get(md) is leaf


@pytest.mark.parametrize("name", list(zoo()))
def test_every_operation_on_every_container(name: str) -> None:
    m = zoo()[name]
    before = record(m)
    sd = state(m)
    trainable = {n for n, _ in param_items(m)}

    # fmap: same classes all the way down, every leaf mapped
    out = fk.fmap(lambda x: x * 2 if x.is_floating_point() else x, m)
    assert type(out) is type(m)
    assert [type(s) for s in out.modules()] == [type(s) for s in m.modules()]
    got = state(out)
    assert got.keys() == sd.keys()
    for k, v in sd.items():
        np.testing.assert_array_equal(got[k], v * 2 if v.dtype.kind == "f" else v)

    # fmapstructure: plain nested dicts keyed like the paths
    struct = fk.fmapstructure(lambda x: tuple(x.shape), m)
    assert isinstance(struct, dict)
    for p, leaf in fk.leaves_with_path(m):
        assert p.get(struct) == tuple(leaf.shape)

    # destructure / re(p): trainable parameters only, in walk order
    flat, re = fk.destructure(m)
    assert [str(p) for p in re.paths] == [sd_key_to_path(n) for n, _ in param_items(m)]
    assert len(re) == sum(p.numel() for _, p in param_items(m))
    new = re(flat + 1)
    assert type(new) is type(m)
    got = state(new)
    for k, v in sd.items():
        np.testing.assert_allclose(got[k], v + 1 if k in trainable else v, rtol=1e-6, err_msg=k)

    # arithmetic: parameters combined, constants from the first model
    twice = fk.add(m, m)
    diff = fk.sub(twice, m)
    scaled = fk.scale(3.0, m)
    comb = fk.lincomb([2.0, -1.0], [m, scaled])
    mid = fk.lerp(m, scaled, 0.5)
    avg = fk.mean([m, twice, scaled])
    for mod, factor in ((twice, 2), (diff, 1), (scaled, 3), (comb, -1), (mid, 2), (avg, 2)):
        assert type(mod) is type(m)
        got = state(mod)
        for k, v in sd.items():
            want = v * factor if k in trainable else v
            np.testing.assert_allclose(got[k], want, rtol=1e-5, atol=1e-6, err_msg=k)
    sq = sum(float(np.sum(sd[k].astype(np.float64) ** 2)) for k in trainable)
    assert float(fk.dot(m, m).detach()) == pytest.approx(sq, rel=1e-5)
    assert float(fk.norm(m).detach()) == pytest.approx(np.sqrt(sq), rel=1e-5)

    # copy: independent, same classes, nn.Parameters stay nn.Parameters
    c = fk.copy(m)
    assert type(c) is type(m)
    assert [type(p) for p in c.parameters()] == [type(p) for p in m.parameters()]
    for (k, a), b in zip(c.state_dict(keep_vars=True).items(), m.state_dict(keep_vars=True).values(), strict=True):
        assert a is not b, k
        assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()

    # load_into: the copy, perturbed, goes back into a fresh module of the same architecture
    with torch.no_grad():
        for t in c.state_dict(keep_vars=True).values():
            t.add_(1)
    dst = zoo()[name]
    params_before = [id(p) for p in dst.parameters()]
    assert fk.load_into(dst, c) is dst
    assert [id(p) for p in dst.parameters()] == params_before
    for k, v in state(dst).items():
        np.testing.assert_array_equal(v, sd[k] + 1, err_msg=k)

    assert_unchanged(before, m)


# --------------------------------------------------------------------------- rebuilt modules


def test_fmap_returns_a_new_module_and_never_mutates_the_input() -> None:
    m = realistic().train()
    m.layers.eval()  # mixed training flags
    calls: list[str] = []
    m.register_forward_hook(lambda mod, args, out: calls.append("fwd"))
    m.conv.register_forward_pre_hook(lambda mod, args: calls.append("pre"))
    m.register_full_backward_hook(lambda mod, gin, gout: calls.append("bwd"))
    before = record(m)

    out = fk.fmap(lambda x: x.clone(), m)
    assert out is not m
    assert type(out) is Realistic
    for (name, a), b in zip(out.named_modules(), m.modules(), strict=True):
        assert type(a) is type(b), name
        assert a is not b, name
        assert a.training == b.training, name
        for section in ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks"):
            assert getattr(a, section) is not getattr(b, section), (name, section)
            assert list(getattr(a, section)) == list(getattr(b, section)), (name, section)
    assert_unchanged(before, m)

    # hooks are carried over: they fire on the clone
    img, idx = realistic_inputs()
    out(img.requires_grad_(True), idx).sum().backward()
    assert calls == ["pre", "fwd", "bwd"]
    # ... and registering or removing hooks on the clone leaves the original alone
    handle = out.register_forward_hook(lambda mod, args, o: calls.append("clone only"))
    out.conv._forward_pre_hooks.clear()
    calls.clear()
    with torch.no_grad():
        m(img, idx)
    assert calls == ["pre", "fwd"]
    handle.remove()
    # flags are the clone's own
    out.eval()
    assert m.training
    assert not m.layers.training
    # identity-mapped leaves are the same tensors; mapped ones are new
    same = fk.fmap(lambda x: x, m)
    assert same.conv.weight is m.conv.weight
    assert same.bn.running_mean is m.bn.running_mean
    assert out.conv.weight is not m.conv.weight


def test_rebuilt_module_attributes_are_shared_bookkeeping_is_copied() -> None:
    m = Custom()
    out = fk.fmap(lambda x: x, m)
    assert out.extra is m.extra  # user attributes: shallow clone
    assert out._non_persistent_buffers_set is not m._non_persistent_buffers_set
    assert out._non_persistent_buffers_set == m._non_persistent_buffers_set
    # ParameterDict's key table is torch's bookkeeping: inserting into the clone leaves the original alone
    out.pdict["gamma"] = nn.Parameter(torch.zeros(1))
    assert list(m.pdict.keys()) == ["alpha", "beta"]
    assert list(out.pdict.keys()) == ["alpha", "beta", "gamma"]
    out.plist.append(nn.Parameter(torch.zeros(1)))
    assert len(m.plist) == 2
    assert len(out.plist) == 3
    out.blocks.append(Block())
    assert len(m.blocks) == 2
    out.register_buffer("new_buffer", torch.zeros(1), persistent=False)
    assert "new_buffer" not in m._non_persistent_buffers_set
    assert "new_buffer" not in m._buffers


def test_rebuilt_rnn_uses_its_own_weights() -> None:
    torch.manual_seed(0)
    for rnn in (nn.LSTM(3, 4, num_layers=2), nn.GRU(3, 4, bidirectional=True)):
        x = torch.randn(5, 2, 3)
        want = rnn(x)[0].detach()
        # a weight set on a clone does not leak into the original (RNNs cache a list of their weights)
        clone = fk.fmap(lambda t: t, rnn)
        clone.weight_ih_l0 = nn.Parameter(torch.zeros_like(rnn.weight_ih_l0))
        assert rnn._flat_weights[0] is rnn.weight_ih_l0
        torch.testing.assert_close(rnn(x)[0], want)
        assert not torch.allclose(clone(x)[0], want)
        # re(p) computes with p's values, and gradients reach p
        flat, re = fk.destructure(rnn)
        zero = re(torch.zeros_like(flat))
        assert zero._flat_weights is not rnn._flat_weights
        assert all(w is zero._parameters[n] for w, n in zip(zero._flat_weights, zero._flat_weights_names, strict=True))
        torch.testing.assert_close(zero(x)[0], torch.zeros_like(want))
        p = flat.clone().requires_grad_(True)
        re(p)(x)[0].pow(2).sum().backward()
        names = [n for n, _ in param_items(rnn)]
        torch.testing.assert_close(p.grad, reference_grads(rnn, names, lambda out: out[0].pow(2).sum(), x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_rebuilt_compiled_module_calls_its_rebuilt_inner_module() -> None:
    torch.manual_seed(0)
    compiled = torch.compile(nn.Linear(3, 2), backend="eager")
    assert [str(p) for p, _ in fk.leaves_with_path(compiled)] == ["_orig_mod.weight", "_orig_mod.bias"]
    flat, re = fk.destructure(compiled)
    x = torch.randn(4, 3)
    zero = re(torch.zeros_like(flat))
    torch.testing.assert_close(zero(x), torch.zeros(4, 2))
    p = flat.clone().requires_grad_(True)
    re(p)(x).sum().backward()
    torch.testing.assert_close(p.grad, torch.cat([x.sum(0).repeat(2), torch.full((2,), 4.0)]))
    torch.testing.assert_close(compiled(x), compiled._orig_mod(x))  # the original is untouched


def test_lazy_module_explains_itself() -> None:
    lazy = nn.Sequential(nn.LazyLinear(2))
    assert [str(p) for p, _ in fk.leaves_with_path(lazy)] == ["[0].weight", "[0].bias"]
    deep = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(2)))
    with pytest.raises(TypeError, match=r"^at \[1\]\[1\]\.weight: fk.load_into .*uninitialized parameter of a lazy"):
        fk.load_into(deep, fk.fmap(lambda x: x, deep))  # (torch's raw "Attempted to use an uninitialized parameter")
    for fn in (fk.destructure, fk.norm, fk.state_dict):  # the message itself names which lazy module
        with pytest.raises(ValueError, match=r"^at \[1\]\[1\]: the parameter 'weight' of this LazyLinear is uninit"):
            fn(deep)
    with pytest.raises(ValueError, match=r"uninitialized .* cannot be copied.*run one forward pass") as info:
        fk.copy({"enc": lazy})  # (was torch's raw "Attempted to use an uninitialized parameter")
    assert any("enc[0].weight" in note for note in getattr(info.value, "__notes__", []))
    lazy(torch.ones(1, 3))
    _, re = fk.destructure(lazy)
    assert len(re) == 8


# --------------------------------------------------------------------------- trainable vs constants


def test_frozen_parameters_and_buffers_are_constants() -> None:
    m = realistic()
    m.emb.weight.requires_grad_(False)  # frozen
    m.heads["reg"].weight.requires_grad_(False)
    flat, re = fk.destructure(m)
    want = [n for n, p in m.named_parameters() if p.requires_grad]
    assert [str(p) for p in re.paths] == [sd_key_to_path(n) for n in want]
    assert "emb.weight" not in {str(p) for p in re.paths}
    assert len(re) == sum(p.numel() for p in m.parameters() if p.requires_grad)
    new = re(torch.zeros_like(flat))
    # constants are carried, as they are
    assert new.emb.weight is m.emb.weight
    assert new.heads["reg"].weight is m.heads["reg"].weight
    assert new.bn.running_mean is m.bn.running_mean
    assert new.bn.num_batches_tracked is m.bn.num_batches_tracked
    assert torch.equal(new.conv.weight, torch.zeros_like(m.conv.weight))
    # trainable_only maps exactly the trainable parameters
    mapped = fk.fmap(lambda x: x * 0, m, trainable_only=True)
    assert mapped.emb.weight is m.emb.weight
    assert mapped.bn.running_var is m.bn.running_var
    assert not torch.any(mapped.ln.weight)
    # arithmetic: constants from the first model (copied)
    s = fk.add(m, realistic(seed=5))
    torch.testing.assert_close(s.emb.weight, m.emb.weight)
    torch.testing.assert_close(s.bn.running_mean, m.bn.running_mean)
    assert s.bn.running_mean is not m.bn.running_mean
    # load_into loads them all: frozen parameters and buffers included
    dst = realistic(seed=9)
    dst.emb.weight.requires_grad_(False)
    fk.load_into(dst, m)
    for k, v in state(m).items():
        np.testing.assert_array_equal(state(dst)[k], v, err_msg=k)
    assert not dst.emb.weight.requires_grad


def test_plain_tensors_in_parameter_slots_are_trainable() -> None:
    m = realistic()
    flat, re = fk.destructure(m)
    rebuilt = re(flat.clone())
    assert type(rebuilt.conv.weight) is torch.Tensor
    flat2, re2 = fk.destructure(rebuilt)  # a rebuilt module destructures again, same plan
    assert re2.paths == re.paths
    torch.testing.assert_close(flat2, flat)


# --------------------------------------------------------------------------- ties


class TiedLM(nn.Module):
    """GPT-2 style tie: the LM head reuses the embedding's nn.Parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 4)
        self.block = Block()
        self.ln = nn.LayerNorm(4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx: Any) -> Any:
        return self.head(self.ln(self.block(self.emb(idx))))


class SharedBlock(nn.Module):
    """One submodule under two parents."""

    def __init__(self) -> None:
        super().__init__()
        shared = Block()
        self.a = nn.Sequential(shared, nn.Linear(4, 4))
        self.b = nn.ModuleDict({"inner": shared})

    def forward(self, x: Any) -> Any:
        return self.b["inner"](self.a(x))


def test_tied_parameter_is_one_parameter_everywhere() -> None:
    torch.manual_seed(0)
    lm = TiedLM()
    assert [str(p) for p, _ in fk.leaves_with_path(lm)] == [
        "emb.weight",
        "block.steps",
        "block.fc.weight",
        "block.fc.bias",
        "ln.weight",
        "ln.bias",
    ]
    flat, re = fk.destructure(lm)
    assert len(re) == 44 + 16 + 4 + 4 + 4
    other = TiedLM()
    rebuilt = {
        "fmap": fk.fmap(lambda x: x * 1, lm),
        "re": re(flat.clone()),
        "copy": fk.copy(lm),
        "add": fk.add(lm, other),
        "sub": fk.sub(lm, other),
        "scale": fk.scale(2.0, lm),
        "lincomb": fk.lincomb([1.0, 2.0], [lm, other]),
        "lerp": fk.lerp(lm, other, 0.25),
        "mean": fk.mean([lm, other]),
    }
    for name, out in rebuilt.items():
        assert out.head.weight is out.emb.weight, name
        assert out.head.weight is not lm.emb.weight, name
    torch.testing.assert_close(rebuilt["add"].head.weight, lm.emb.weight + other.emb.weight)
    # load_into: the tie in dst is fed once (both src positions agree)
    dst = TiedLM()
    fk.load_into(dst, lm)
    assert dst.head.weight is dst.emb.weight
    torch.testing.assert_close(dst.head.weight, lm.emb.weight)
    # gradient of the tied weight: the sum of both uses, as functional_call computes it
    idx = torch.tensor([[1, 2, 3], [4, 5, 6]])
    p = flat.clone().requires_grad_(True)
    re(p)(idx).logsumexp(-1).sum().backward()
    want = reference_grads(lm, [str(q) for q in re.paths], lambda out: out.logsumexp(-1).sum(), idx)
    torch.testing.assert_close(p.grad, want)


def test_shared_submodule_is_rebuilt_once() -> None:
    torch.manual_seed(0)
    m = SharedBlock()
    assert m.a[0] is m.b["inner"]
    flat, re = fk.destructure(m)
    assert [str(p) for p in re.paths] == ["a[0].fc.weight", "a[0].fc.bias", "a[1].weight", "a[1].bias"]
    for name, out in {
        "fmap": fk.fmap(lambda x: x + 0, m),
        "re": re(flat.clone()),
        "copy": fk.copy(m),
        "scale": fk.scale(0.5, m),
        "mean": fk.mean([m, m]),
    }.items():
        assert out.a[0] is out.b["inner"], name
        assert out.a[0] is not m.a[0], name
    x = torch.randn(3, 4)
    p = flat.clone().requires_grad_(True)
    re(p)(x).sum().backward()
    names = [n for n, _ in param_items(m)]
    assert names == ["a.0.fc.weight", "a.0.fc.bias", "a.1.weight", "a.1.bias"]
    torch.testing.assert_close(p.grad, reference_grads(m, names, lambda o: o.sum(), x))


# --------------------------------------------------------------------------- autograd and torch.func


def test_gradients_match_functional_call() -> None:
    m = realistic()
    img, idx = realistic_inputs()
    flat, re = fk.destructure(m)
    p = flat.clone().requires_grad_(True)
    rebuilt = re(p)
    out = rebuilt(img, idx)
    loss = out.pow(2).mean()
    loss.backward()
    names = [n for n, _ in param_items(m)]
    want = reference_grads(m, names, lambda o: o.pow(2).mean(), img, idx)
    torch.testing.assert_close(p.grad, want)
    torch.testing.assert_close(out, m(img, idx))
    # every parameter is reached (none is left without a gradient)
    assert all(int(torch.count_nonzero(g)) > 0 for g in p.grad.split([q.numel() for _, q in param_items(m)]))


@TORCH_JIT_WARNING
def test_torch_func_grad_vmap_jvp() -> None:
    m = realistic()
    img, idx = realistic_inputs()
    flat, re = fk.destructure(m)

    def forward(p: Any) -> Any:
        return re(p)(img, idx)

    def loss(p: Any) -> Any:
        return forward(p).pow(2).mean()

    names = [n for n, _ in param_items(m)]
    g = torch.func.grad(loss)(flat)
    torch.testing.assert_close(g, reference_grads(m, names, lambda o: o.pow(2).mean(), img, idx))
    # vmap: a batch of flat vectors -> a batch of outputs
    gen = torch.Generator().manual_seed(3)
    batch = flat + 0.1 * torch.randn(4, len(re), generator=gen)
    outs = torch.func.vmap(forward)(batch)
    assert outs.shape == (4, 5, 4)
    torch.testing.assert_close(outs, torch.stack([forward(b) for b in batch]))
    # jvp: forward-mode dual tensors pass through re(p)
    t = torch.randn(len(re), generator=gen)
    value, tangent = torch.func.jvp(forward, (flat,), (t,))
    torch.testing.assert_close(value, m(img, idx))
    _, vjp = torch.func.vjp(forward, flat)
    u = torch.randn(5, 4, generator=gen)
    # <u, J t> == <J^T u, t>
    torch.testing.assert_close((u * tangent).sum(), (vjp(u)[0] * t).sum(), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- load_into


def test_load_into_keeps_parameters_dtypes_and_devices() -> None:
    dst = realistic(seed=0)
    dst.ln.weight.requires_grad_(False)
    params = {n: p for n, p in dst.named_parameters()}
    flags = {n: p.requires_grad for n, p in params.items()}
    src = realistic(seed=1).double()  # float64 source into a float32 module
    fk.load_into(dst, src)
    assert {n: p for n, p in dst.named_parameters()} == params  # the same objects, still registered
    assert all(type(p) is nn.Parameter for p in dst.parameters())
    assert {n: p.requires_grad for n, p in dst.named_parameters()} == flags
    for k, v in dst.state_dict().items():
        want = src.state_dict()[k]
        assert v.dtype == (torch.float32 if want.is_floating_point() else want.dtype), k
        np.testing.assert_allclose(v.numpy(), want.to(v.dtype).numpy(), rtol=0, atol=0, err_msg=k)
    # buffers are copied, not shared
    assert dst.bn.running_mean.untyped_storage().data_ptr() != src.bn.running_mean.untyped_storage().data_ptr()
    assert int(dst.bn.num_batches_tracked) == 3
    # the optimizer still sees the registered parameters
    opt = torch.optim.SGD(dst.parameters(), lr=0.1)
    img, idx = realistic_inputs()
    dst(img, idx).sum().backward()
    opt.step()


def test_load_into_keeps_dst_device() -> None:
    dst = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2)).to("meta")
    src = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    ids = [id(p) for p in dst.parameters()]
    # real values cannot be stored in meta tensors: a clear error (issue "Reliability"), not a silent no-op
    with pytest.raises(ValueError, match=r"at \[0\]\.weight: `dst` holds an array without storage"):
        fk.load_into(dst, src)
    fk.load_into(dst, src.to("meta"))
    assert [id(p) for p in dst.parameters()] == ids
    assert all(t.device.type == "meta" for t in dst.state_dict().values())


def test_load_into_refuses_mismatched_shapes_before_writing() -> None:
    dst = realistic(seed=0)
    before = state(dst)
    src = realistic(seed=1)
    src.heads["cls"] = nn.Linear(4, 5)  # the last-but-one layer differs
    with pytest.raises(fk.StructureError, match=r"at heads\.cls\.weight: shape \(3, 4\) in `dst` vs \(5, 4\)"):
        fk.load_into(dst, src)
    after = state(dst)
    for k, v in before.items():
        np.testing.assert_array_equal(after[k], v, err_msg=k)  # nothing written, not even the first layers
    src2 = realistic(seed=1)
    del src2.heads["reg"]
    with pytest.raises(fk.StructureError, match="at heads"):
        fk.load_into(dst, src2)


# --------------------------------------------------------------------------- devices (meta as the second device)


def test_device_policy_with_meta_as_second_device() -> None:
    # strict: a CPU model, a meta p
    m = realistic()
    _, re = fk.destructure(m)
    p_meta = torch.empty(len(re), device="meta")
    with pytest.raises(fk.PolicyError, match=r"at conv\.weight: .*cpu.*meta") as info:
        re(p_meta)
    assert "policy='model'" in str(info.value)
    assert "policy='flat'" in str(info.value)
    # flat: every parameter on p's device; constants stay where they are
    out = re(p_meta, policy="flat")
    assert all(q.device.type == "meta" for _, q in param_items(out))
    assert out.bn.running_mean.device.type == "cpu"

    # a model on two devices: strict destructure raises naming two paths and both devices
    two = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    two[0].to("meta")
    with pytest.raises(fk.PolicyError, match=r"at \[0\]\.weight and \[2\]\.weight: .*meta.*cpu"):
        fk.destructure(two)
    # model/flat: the flat vector would go on the first parameter's device, meta, which holds no
    # values: the cpu parameters' values would be lost (it was a meta vector, and re(flat) raised
    # torch's raw error); the rebuild on two devices is checked where the second one holds values
    # (array-api-strict's device1/device2 in tests/test_policy.py, conformance/gpu_check.py on a GPU)
    for policy in ("model", "flat"):
        with pytest.raises(fk.PolicyError, match=r"at \[2\]\.weight: the parameter holds values on cpu"):
            fk.destructure(two, policy=policy)


# --------------------------------------------------------------------------- lazy adapter import


def test_adapter_is_loaded_only_when_a_module_is_met() -> None:
    code = (
        "import sys, numpy as np, functorkit as fk\n"
        "fk.leaves({'a': np.ones(2)})\n"
        "assert 'torch' not in sys.modules and 'functorkit.adapters.torch' not in sys.modules\n"
        "import torch\n"
        "assert 'functorkit.adapters.torch' not in sys.modules\n"
        "print([str(p) for p, _ in fk.leaves_with_path(torch.nn.Linear(2, 2))])\n"
        "assert 'functorkit.adapters.torch' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['weight', 'bias']"


def test_deepcopy_of_a_rebuilt_module_is_an_ordinary_module() -> None:
    m = realistic()
    flat, re = fk.destructure(m)
    rebuilt = re(flat.clone())
    c = stdcopy.deepcopy(fk.copy(rebuilt))
    img, idx = realistic_inputs()
    torch.testing.assert_close(c(img, idx), m(img, idx))


# --------------------------------------------------------------------------- parametrized modules


@pytest.mark.parametrize("how", ["weight_norm", "spectral_norm", "register_parametrization"])
def test_independently_parametrized_modules_combine(how: str) -> None:
    # torch makes one class per parametrized instance (ParametrizedLinear); two models built
    # independently are still the same kind of node, as torch's load_state_dict treats them
    from torch.nn.utils import parametrizations, parametrize

    class Doubled(nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    def make(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        lin = nn.Linear(3, 2)
        if how == "weight_norm":
            lin = parametrizations.weight_norm(lin)
        elif how == "spectral_norm":
            lin = parametrizations.spectral_norm(lin)
        else:
            parametrize.register_parametrization(lin, "weight", Doubled())
        return nn.Sequential(lin, nn.Tanh())

    a, b = make(0), make(1)
    assert type(a[0]) is not type(b[0])
    flat_b, _ = fk.destructure(b)
    _, re = fk.destructure(a)
    torch.testing.assert_close(re.flatten(b), flat_b)
    s = fk.add(a, b)
    assert type(s[0]) is type(a[0])
    pa = dict(a.named_parameters())
    for name, p in b.named_parameters():
        torch.testing.assert_close(dict(s.named_parameters())[name], pa[name] + p)
    fk.load_into(a, b)
    for name, p in b.named_parameters():
        torch.testing.assert_close(dict(a.named_parameters())[name], p)
    out = fk.fmap(lambda x, y: x - y, a, b, trainable_only=True)  # a now equals b: every difference is 0
    diff, _ = fk.destructure(out)
    assert diff.numel() == flat_b.numel()
    assert float(diff.abs().max()) == 0.0


def test_expanded_definition_keeps_the_frozen_leaves_of_a_shared_module() -> None:
    # a module used twice (one shared sub-tree) with a frozen parameter: written out at each place
    # (expanded(), cache=False), its frozen bias stays frozen (it was trainable before the fix:
    # the expansion was made before the trainable pass and kept)
    lin = torch.nn.Linear(2, 2)
    lin.bias.requires_grad_(False)
    m = torch.nn.ModuleList([lin, lin])
    _, td = fk.flatten(m)
    assert td.trainable == (True, False)
    assert td.expanded().trainable == (True, False)
    out = fk.fmap(lambda x: x * 0 + 5, m, trainable_only=True, cache=False)
    assert bool((out[0].weight == 5).all())
    assert bool((out[1].bias == lin.bias).all())
    assert not bool((out[0].bias == 5).any())


def test_parameters_of_a_tensor_subclass_are_frozen_or_trainable_by_requires_grad():
    """A Parameter of a tensor subclass (FSDP2's DTensor parameters are such: ``_is_param`` on the
    instance) counts as a Parameter: frozen when it does not require grad, trainable otherwise."""

    class Sub(torch.Tensor):
        pass

    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    lin.weight = torch.nn.Parameter((torch.ones(2, 3) * 2).as_subclass(Sub), requires_grad=False)
    assert type(lin.weight) is Sub
    with torch.no_grad():
        assert float(fk.norm(lin)) == pytest.approx(float(lin.bias.norm()))  # the frozen weight left out
        lin.weight.requires_grad_(True)
        whole = float(torch.cat([lin.weight.reshape(-1), lin.bias]).norm())
        assert float(fk.norm(lin)) == pytest.approx(whole)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_modules_built_alike_are_one_structure(cls: Any) -> None:
    # an RNN caches its own parameters (_flat_weights, weak references to them) in plain attributes:
    # they are rebuilt from the parameters, not part of the structure (two RNNs were never equal)
    torch.manual_seed(0)
    a = cls(3, 4)
    b = stdcopy.deepcopy(a)
    flat, re = fk.destructure(a)
    for other in (b, fk.copy(a), re(flat)):
        assert fk.flatten(a)[1] == fk.flatten(other)[1]
        assert fk.allclose(a, other)
    assert not fk.allclose(a, fk.fmap(lambda x: x + 1, a))
    with torch.no_grad():
        st = fk.stack([a, b])
    assert st.weight_ih_l0.shape == (2, *a.weight_ih_l0.shape)
    assert [w.data_ptr() for w in st._flat_weights] == [p.data_ptr() for p in st._parameters.values()]


def test_modules_parametrized_alike_are_one_structure() -> None:
    # torch.nn.utils.parametrize makes a class per module: two modules parametrized alike are one
    # node kind (matched by fk.fmap before), and now one structure too (allclose, stack, ==)
    from torch.nn.utils import parametrize

    class Sym(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.triu() + x.triu(1).T

    def make(seed: int) -> Any:
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
        parametrize.register_parametrization(net[0], "weight", Sym())
        return net

    a, b, c = make(0), make(0), make(1)
    assert type(a[0]) is not type(b[0])
    assert fk.flatten(a)[1] == fk.flatten(b)[1]
    assert fk.allclose(a, b)
    assert not fk.allclose(a, c)
    with torch.no_grad():
        st = fk.stack([a, c])
    assert type(st[0]) is type(a[0])  # the clone is of the first module's own class
    x = torch.randn(2, 3)
    assert torch.allclose(fk.unstack(st)[1](x), c(x))
    plain = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    assert fk.flatten(a)[1] != fk.flatten(plain)[1]  # a parametrized Linear is not a plain one


def test_the_other_trees_of_a_multi_tree_operation_are_matched_without_their_aux_data() -> None:
    # a module's aux data (a copy of its attributes, a weak reference) is made for the recorded
    # tree only: the matchers take the other trees' children alone (bench_arith's module EMA rows)
    from functorkit.adapters._torch_module import node_for

    a = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.LayerNorm(3), nn.Linear(3, 1)))
    b = fk.copy(a)
    defs = {node_for(type(x)) for x in a.modules()}
    calls: list[int] = []
    saved = {nd: nd.flatten for nd in defs}
    try:
        for nd in defs:
            nd.flatten = (lambda f: lambda m, *k: calls.append(id(m)) or f(m, *k))(saved[nd])  # type: ignore[method-assign]
        fk.fmap(lambda x, y: x + y, a, b)
        fk.lerp(b, a, 0.5, out=b)
    finally:
        for nd, f in saved.items():
            nd.flatten = f  # type: ignore[method-assign]
    # fk.fmap records `a` and matches `b`; the in-place lerp flattens neither (the two modules are
    # walked in lock step: tests/test_module_lockstep.py), and without that walk it records `b`
    # (out, the first model) and matches `a`
    assert sorted(calls) == sorted(id(x) for x in a.modules())  # each module of `a` flattened once
    from functorkit.adapters import _torch_module

    calls.clear()
    _torch_module.LOCKSTEP = False
    try:
        for nd in defs:
            nd.flatten = (lambda f: lambda m, *k: calls.append(id(m)) or f(m, *k))(saved[nd])  # type: ignore[method-assign]
        fk.lerp(b, a, 0.5, out=b)
    finally:
        _torch_module.LOCKSTEP = True
        for nd, f in saved.items():
            nd.flatten = f  # type: ignore[method-assign]
    assert sorted(calls) == sorted(id(x) for x in b.modules())  # `b` flattened once, `a` only matched


@pytest.mark.parametrize("op", ["add", "sub", "scale", "lerp", "lincomb", "mean", "normalize"])
def test_trainable_only_false_keeps_frozen_parameters_frozen(op: str) -> None:
    # the arithmetic over every floating array (a soup with buffers) computes the frozen parameters
    # too; their results stay frozen nn.Parameters (a plain tensor in the slot would be trainable)
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    a[0].bias.requires_grad_(False)
    b = fk.fmap(lambda x: x + 1, a, trainable_only=False)
    b[0].bias.requires_grad_(False)
    calls = {
        "add": lambda: fk.add(a, b, trainable_only=False),
        "sub": lambda: fk.sub(a, b, trainable_only=False),
        "scale": lambda: fk.scale(2.0, a, trainable_only=False),
        "lerp": lambda: fk.lerp(a, b, 0.5, trainable_only=False),
        "lincomb": lambda: fk.lincomb([1.0, 2.0], [a, b], trainable_only=False),
        "mean": lambda: fk.mean([a, b], trainable_only=False),
        "normalize": lambda: fk.normalize(a, trainable_only=False),
    }
    out = calls[op]()
    bias = out[0].bias
    assert type(bias) is nn.Parameter
    assert not bias.requires_grad
    assert bias.grad_fn is None
    assert [str(p) for p in fk.destructure(out)[1].paths] == [str(p) for p in fk.destructure(a)[1].paths]
    assert type(out[1].running_mean) is torch.Tensor  # a buffer stays a buffer
    if op == "scale":
        assert torch.equal(bias.data, 2 * a[0].bias.data)


def test_a_constant_sharing_memory_with_a_parameter_is_refused_by_destructure() -> None:
    # re(p) gives the parameter its slice of p and keeps the constant: a buffer (or frozen parameter)
    # that is a view of a weight would be untied silently (fk.load_into refused the same model)
    lin = nn.Linear(3, 3)
    lin.register_buffer("wT", lin.weight.detach().t())
    with pytest.raises(fk.StructureError, match=r"at weight and wT: two different arrays share memory"):
        fk.destructure(lin)
    frozen = nn.Linear(3, 3)
    frozen.half_w = nn.Parameter(frozen.weight.detach()[0], requires_grad=False)
    with pytest.raises(fk.StructureError, match=r"at weight and half_w: two different arrays share memory"):
        fk.destructure(frozen)
    # two constants sharing memory stay as they are (both kept by re(p)); a tie is no alias
    both = nn.Linear(3, 3)
    both.register_buffer("a", torch.zeros(4))
    both.register_buffer("b", both.a[:2])
    flat, re = fk.destructure(both)
    out = re(flat)
    assert out.b.data_ptr() == out.a.data_ptr()
    tied = nn.Linear(3, 3)
    tied.register_buffer("w2", torch.zeros(2))
    tied.extra = nn.Linear(3, 3)
    tied.extra.weight = tied.weight  # one Parameter at two places
    assert len(fk.destructure(tied)[1]) == len(fk.destructure(nn.Linear(3, 3))[1]) + 3


def test_a_cached_property_value_is_not_carried_into_a_rebuilt_module() -> None:
    """A `functools.cached_property` of a module caches its value in the module's ``__dict__``: the
    clone (fmap, re(p), the arithmetic, fk.copy) carried it over, so the rebuilt module answered
    with the value of the *old* parameters (silently), and two modules (before and after the first
    access) were not one structure."""
    import functools

    class Gram(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(2))

        @functools.cached_property
        def total(self) -> Any:
            return self.w.detach().sum()

    net = Gram()
    fresh = Gram()
    assert float(net.total) == 2.0  # cached now
    assert float(fk.fmap(lambda t: t * 2, net).total) == 4.0
    flat, re = fk.destructure(net)
    assert float(re(flat * 3).total) == 6.0
    assert float(fk.scale(5.0, net).total) == 10.0
    c = fk.copy(net)
    assert "total" not in vars(c)
    assert float(c.total) == 2.0
    assert fk.flatten(net)[1] == fk.flatten(fresh)[1]
    assert fk.stack([net, fresh]).w.shape == (2, 2)
    assert "total" in vars(net)  # the input keeps its own cache
    assert float(net.total) == 2.0
