"""re(p) on an nn.Module follows the live module's non-parameter state (SPEC section 9)."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
from torch.func import functional_call  # noqa: E402

import functorkit as fk  # noqa: E402


def _net() -> Any:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5), nn.ReLU(), nn.Linear(6, 2))


def _run(fn: Any, seed: int = 7) -> Any:
    torch.manual_seed(seed)
    return fn()


@pytest.mark.parametrize("first", ["train", "eval"])
def test_training_flag_follows_the_live_module_like_functional_call(first: str) -> None:
    net = getattr(_net(), first)()
    flat, re = fk.destructure(net)
    twin = _net()  # the same weights and buffers, for functional_call
    params = {k: v.detach() for k, v in net.named_parameters()}
    x = torch.randn(8, 4)
    for mode in ("eval", "train", "eval"):
        getattr(net, mode)()
        getattr(twin, mode)()
        rebuilt = re(flat)
        assert rebuilt.training == (mode == "train")
        assert all(m.training == (mode == "train") for m in rebuilt.modules())
        got = _run(lambda m=rebuilt: m(x))
        want = _run(lambda: functional_call(twin, params, (x,)))
        torch.testing.assert_close(got, want)
        # batch norm: the running statistics move (train) or are used (eval) alike
        torch.testing.assert_close(net[1].running_mean, twin[1].running_mean)
        torch.testing.assert_close(net[1].running_var, twin[1].running_var)
        assert int(net[1].num_batches_tracked) == int(twin[1].num_batches_tracked)
    assert net[1].num_batches_tracked > 0


def test_plain_attributes_and_hooks_follow_the_live_module() -> None:
    net = _net().train()
    flat, re = fk.destructure(net)
    x = torch.randn(8, 4)
    net[2].p = 0.0  # a plain attribute changed after destructure
    params = {k: v.detach() for k, v in net.named_parameters()}
    torch.testing.assert_close(_run(lambda: re(flat)(x)), _run(lambda: functional_call(net, params, (x,))))
    calls: list[str] = []
    handle = net[4].register_forward_hook(lambda mod, args, out: calls.append("hook"))
    re(flat)(x)
    assert calls == ["hook"]
    handle.remove()
    re(flat)(x)
    assert calls == ["hook"]  # removed on the live module: gone from the rebuilt one too
    # the rebuilt module's own changes stay its own
    rebuilt = re(flat)
    rebuilt.eval()
    rebuilt[2].p = 0.9
    assert net.training
    assert net[2].p == 0.0


def test_a_pickled_restructure_uses_the_recorded_state() -> None:
    net = _net().eval()
    flat, re = fk.destructure(net)
    re2 = pickle.loads(pickle.dumps(re))
    net.train()
    assert re(flat).training
    assert not re2(flat).training  # no live module behind a pickle: the state at destructure time
    del net
    assert not re(flat).training  # the live module is gone (held weakly): the recorded state
