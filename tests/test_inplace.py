"""SPEC 14: ``out=`` on add, sub, scale, lincomb, lerp and mean.

Bit-for-bit equality with the functional form, `out` one of the inputs, overlap refusals naming
both paths, all or nothing (a failure injected at each check, at the last parameter, leaves `out`
untouched), constants and buffers untouched, ties written once, torch parameters updated without
autograd history and still registered, JAX and Dask refused, NumPy's blocked kernel taken."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from helpers import spy_foreach_lerp

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["numpy", "torch"]


def _arr(backend: str, v: np.ndarray) -> Any:
    if backend == "torch":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(v.copy())
    return v.copy()


def _model(backend: str, seed: int, n: int = 5) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "a": _arr(backend, rng.standard_normal((n, 3)).astype(np.float32)),
        "b": [_arr(backend, rng.standard_normal(n)), _arr(backend, rng.standard_normal(2).astype(np.float32))],
        "steps": _arr(backend, np.array([seed, 1])),  # integer: a constant
        "name": f"m{seed}",
    }


def _host(x: Any) -> np.ndarray:
    return x.detach().numpy() if hasattr(x, "detach") else np.asarray(x)


def _bits_equal(x: Any, y: Any) -> bool:
    hx, hy = _host(x), _host(y)
    return hx.dtype == hy.dtype and hx.shape == hy.shape and hx.tobytes() == hy.tobytes()


def _snapshot(m: Any) -> list[bytes]:
    return [_host(x).tobytes() for x in fk.leaves(m) if hasattr(x, "shape")]


OPS: dict[str, Callable[..., Any]] = {
    "add": lambda ms, **k: fk.add(ms[0], ms[1], **k),
    "sub": lambda ms, **k: fk.sub(ms[0], ms[1], **k),
    "scale": lambda ms, **k: fk.scale(0.37, ms[0], **k),
    "lincomb": lambda ms, **k: fk.lincomb([0.5, -0.3, 0.9], ms, **k),
    "mean": lambda ms, **k: fk.mean(ms, **k),
    "lerp_low": lambda ms, **k: fk.lerp(ms[0], ms[1], 0.1, **k),
    "lerp_high": lambda ms, **k: fk.lerp(ms[0], ms[1], 0.8, **k),
}
N_INPUTS = {"add": 2, "sub": 2, "scale": 1, "lincomb": 3, "mean": 3, "lerp_low": 2, "lerp_high": 2}


@pytest.fixture(params=["columns", "per-leaf"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths of ``out=``: the column path (on by default) and the per-leaf one it falls back to."""
    from functorkit import _inplace

    monkeypatch.setattr(_inplace, "FAST", [request.param == "columns"])
    return str(request.param)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["copy", "first", "last"])
@pytest.mark.usefixtures("path")
def test_out_equals_the_functional_form_bit_for_bit(backend: str, op: str, where: str) -> None:
    ms = [_model(backend, s) for s in range(N_INPUTS[op])]
    want = OPS[op](ms)
    out = fk.copy(ms[0]) if where == "copy" else ms[0] if where == "first" else ms[-1]
    out_steps, out_name = out["steps"], out["name"]
    keep = _host(out_steps).copy()
    arrays = [out["a"], *out["b"]]
    got = OPS[op](ms, out=out)
    assert got is out
    assert [out["a"], *out["b"]] == arrays or all(x is y for x, y in zip([out["a"], *out["b"]], arrays, strict=True))
    for x, y in zip(fk.leaves(got), fk.leaves(want), strict=True):
        if hasattr(y, "shape") and _host(y).dtype.kind == "f":
            assert _bits_equal(x, y)
    assert out["steps"] is out_steps
    assert out["name"] == out_name
    np.testing.assert_array_equal(_host(out["steps"]), keep)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("path")
def test_out_overlapping_an_input_elsewhere_is_refused_naming_both_paths(backend: str) -> None:
    a, b = _model(backend, 0), _model(backend, 1)
    out = fk.copy(a)
    out["b"][1] = b["a"][0, :2]  # a view into `b`'s a
    with pytest.raises(fk.StructureError, match=r"at b\[1\] \(`out`\) and a \(`b`\)"):
        fk.add(a, b, out=out)
    out = fk.copy(a)
    # a's elements, in another order (torch has no negative strides: a strided view)
    out["a"] = a["a"].as_strided((5, 3), (1, 5)) if backend == "torch" else a["a"][::-1]
    with pytest.raises(fk.StructureError, match=r"at a \(`out`\) and a \(`a`\)"):
        fk.lerp(a, b, 0.5, out=out)
    assert _bits_equal(out["b"][0], a["b"][0])  # nothing written


def _inject(backend: str, kind: str, ms: list[Any], out: Any) -> tuple[type[Exception], str]:
    """Make the check `kind` fail at the last parameter of `out` (or of an input)."""
    torch = pytest.importorskip("torch") if backend == "torch" else None
    if kind == "structure":
        out["b"].append(_arr(backend, np.zeros(1)))
        return fk.StructureError, "b"
    if kind == "shape":
        out["b"][1] = _arr(backend, np.zeros(3, np.float32))
        return fk.StructureError, r"b\[1\].*shape"
    if kind == "dtype":
        out["b"][1] = _arr(backend, np.zeros(2, np.float64))
        return fk.PolicyError, r"b\[1\].*dtype"
    if kind == "not an array":
        out["b"][1] = 0.0
        return fk.StructureError, r"b\[1\].*`out` has a float"
    if kind == "writable":
        if backend == "numpy":
            ro = np.zeros(2, np.float32)
            ro.flags.writeable = False
            out["b"][1] = ro
            return TypeError, r"b\[1\].*read-only.*functional form"
        assert torch is not None
        with torch.inference_mode():
            out["b"][1] = torch.zeros(2)
        return TypeError, r"b\[1\].*inference.*functional form"
    if kind == "self-overlap":
        x = _arr(backend, np.zeros(1, np.float32))
        out["b"][1] = np.lib.stride_tricks.as_strided(x, (2,), (0,)) if backend == "numpy" else x.expand(2)
        return fk.StructureError, r"b\[1\].*share one memory location"
    if kind == "overlap":
        out["b"][1] = ms[1]["a"][0, :2]  # a view into another input's array at another place
        return fk.StructureError, r"b\[1\] \(`out`\) and a \(`models\[1\]`\)"
    if kind == "tie":
        out["b"][1] = out["b"][0] = _arr(backend, np.zeros(2, np.float32))
        ms[0]["b"][0] = _arr(backend, np.zeros(2, np.float32))
        for m in ms[1:]:
            m["b"][0] = _arr(backend, np.zeros(2, np.float32))
        return fk.StructureError, r"b\[0\] and b\[1\].*tie"
    assert kind == "coefficient"
    return fk.PolicyError, "complex"


KINDS = ["structure", "shape", "dtype", "not an array", "writable", "self-overlap", "overlap", "tie", "coefficient"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("path")
def test_all_or_nothing_a_failure_at_each_check_writes_nothing(backend: str, kind: str) -> None:
    ms = [_model(backend, s) for s in range(3)]
    out = fk.copy(ms[0])
    err, match = _inject(backend, kind, ms, out)
    before = _snapshot(out)
    before_inputs = [_snapshot(m) for m in ms]
    cs: list[Any] = [0.5, 0.25, 1j if kind == "coefficient" else 2.0]
    if kind == "coefficient":  # complex into real: only the real parameters refuse; b[1] is real
        ms = [{"b": m["b"]} for m in ms]
        out = {"b": out["b"]}
        before = _snapshot(out)
    with pytest.raises(err, match=match):
        fk.lincomb(cs, ms, out=out)
    assert _snapshot(out) == before
    if kind != "coefficient":
        assert [_snapshot(m) for m in ms] == before_inputs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.usefixtures("path")
def test_ties_are_written_once_and_stay_tied(backend: str) -> None:
    def tied(seed: int) -> dict[str, Any]:
        w = _arr(backend, np.random.default_rng(seed).standard_normal(4))
        return {"enc": w, "dec": w}

    a, b = tied(0), tied(1)
    want = fk.lerp(a, b, 0.3)
    out = fk.copy(a)
    assert out["enc"] is out["dec"]
    fk.lerp(a, b, 0.3, out=out)
    assert out["enc"] is out["dec"]
    assert _bits_equal(out["enc"], want["enc"])
    fk.lerp(a, b, 0.3, out=a)  # in place on a tied input: written once (not lerped twice)
    assert _bits_equal(a["enc"], want["enc"])


@pytest.mark.usefixtures("path")
def test_untied_out_where_the_first_model_is_tied_gets_both_places() -> None:
    w = np.arange(3.0)
    a = {"enc": w, "dec": w}
    b = {"enc": np.ones(3), "dec": np.ones(3)}
    out = {"enc": np.zeros(3), "dec": np.zeros(3)}
    fk.add(a, b, out=out)
    np.testing.assert_array_equal(out["enc"], w + 1)
    np.testing.assert_array_equal(out["dec"], w + 1)
    with pytest.raises(fk.StructureError, match=r"at dec \(`out`\) and dec \(`a`\)|at enc"):
        fk.add(a, b, out={"enc": w, "dec": np.zeros(3)})  # enc's result would overwrite `a`'s dec before it is read


@pytest.mark.usefixtures("path")
def test_a_tie_in_out_and_the_first_model_that_another_model_splits_names_that_model() -> None:
    # an EMA tied (embedding and head: one array), the model it follows untied there (a checkpoint
    # that split the tie): the message named `a`, whose arrays are one, and its fix, out=fk.copy(a),
    # met the same error; it names `b` and a fix that works, and nothing is written
    w = np.zeros(3)
    ema = {"emb": w, "head": w}
    model = {"emb": np.ones(3), "head": np.full(3, 2.0)}
    for out in (ema, fk.copy(ema)):
        with pytest.raises(
            fk.StructureError, match=r"`out` and `a` have one array at both places.*but `b` has different arrays there"
        ):
            fk.lerp(ema, model, 0.1, out=out)
        assert out["emb"].tolist() == [0.0] * 3
    fixed = fk.lerp(ema, model, 0.1)  # the fix it names
    assert fixed["emb"].tolist() == [0.1] * 3
    assert fixed["head"].tolist() == [0.2] * 3


@pytest.mark.usefixtures("path")
def test_torch_parameters_without_autograd_history_stay_registered() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    net(torch.randn(8, 3)).sum().backward()  # running statistics move; grads exist
    ema = fk.copy(net)
    net(torch.randn(8, 3) + 3)  # the model's running statistics move on
    for p in ema.parameters():
        assert p.requires_grad
    params = list(ema.parameters())
    running = ema[1].running_mean.clone()
    want = fk.lerp(ema, net, 0.01)
    assert fk.lerp(ema, net, 0.01, out=ema) is ema
    assert list(ema.parameters()) == params
    assert all(p is q for p, q in zip(ema.parameters(), params, strict=True))
    for p in ema.parameters():
        assert isinstance(p, torch.nn.Parameter)
        assert p.is_leaf
        assert p.grad_fn is None
        assert p.requires_grad
    assert _bits_equal(ema[0].weight, want[0].weight)
    torch.testing.assert_close(ema[1].running_mean, running, rtol=0, atol=0)  # buffers untouched
    fk.lerp(ema, net, 0.5, trainable_only=False, out=ema)  # buffers too
    assert not torch.equal(ema[1].running_mean, running)
    assert ema[1].num_batches_tracked.dtype == torch.int64  # integer buffer: a constant, untouched


@pytest.mark.parametrize("lib", ["jax", "dask"])
def test_immutable_backends_are_refused_with_the_functional_form(lib: str) -> None:
    if lib == "jax":
        jnp = pytest.importorskip("jax.numpy")
        a = {"w": jnp.ones(2), "v": [jnp.zeros(3)]}
    else:
        da = pytest.importorskip("dask.array")
        a = {"w": da.ones(2), "v": [da.zeros(3)]}
    with pytest.raises(TypeError, match=r"at w: .*immutable.*ema = fk.lerp\(ema, model, t\)"):
        fk.lerp(a, a, 0.1, out=a)
    with pytest.raises(TypeError, match=r"at w: .*immutable.*fk.add\(a, b\)"):
        fk.add(a, a, out=a)


@pytest.mark.usefixtures("path")
def test_numpy_blocked_kernel_is_taken_and_blocks_do_not_change_the_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    from functorkit.adapters import numpy as npad

    rng = np.random.default_rng(0)
    ms = [{"w": rng.standard_normal((300, 7)).astype(np.float32)} for _ in range(4)]
    whole = fk.lincomb([0.1, 0.2, -0.7, 1.3], ms)
    monkeypatch.setattr(npad, "BLOCK", 64)
    blocks: list[int] = []
    real = npad.Adapter._blocked

    def spy(self: Any, kern: Any, xs: Any, out: Any) -> Any:
        blocks.append(xs[0].size)
        return real(self, kern, xs, out)

    monkeypatch.setattr(npad.Adapter, "_blocked", spy)
    out = fk.copy(ms[0])
    fk.lincomb([0.1, 0.2, -0.7, 1.3], ms, out=out)
    blocked = fk.lincomb([0.1, 0.2, -0.7, 1.3], ms)
    assert blocks == [2100, 2100]
    assert _bits_equal(out["w"], whole["w"])
    assert _bits_equal(blocked["w"], whole["w"])
    # the last term as `out`: computed aside (it is read after the first write), same bits
    fk.lincomb([0.1, 0.2, -0.7, 1.3], ms, out=ms[3])
    assert _bits_equal(ms[3]["w"], whole["w"])


@pytest.mark.usefixtures("path")
def test_narrow_dtypes_in_place_match_the_functional_form() -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(1)
    ms = [{"w": rng.standard_normal(100_000).astype(ml_dtypes.bfloat16)} for _ in range(3)]
    want = fk.lincomb([0.5, 0.3, 0.2], ms)
    fk.lincomb([0.5, 0.3, 0.2], ms, out=ms[0])
    assert ms[0]["w"].dtype == ml_dtypes.bfloat16
    assert _bits_equal(ms[0]["w"].view(np.uint16), want["w"].view(np.uint16))


_COMPILE = """
import torch
import functorkit as fk

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
ema = fk.copy(net)
want = fk.lerp(ema, net, 0.1)

def step(e, m):
    return fk.lerp(e, m, 0.1, out=e)

# the first functorkit call of the process, traced: fullgraph=True raises at any graph break
torch.compile(step, fullgraph=True, backend="eager")(ema, net)
for p, q in zip(ema.parameters(), want.parameters()):
    torch.testing.assert_close(p, q)
    assert p.grad_fn is None
torch._dynamo.reset()
explanation = torch._dynamo.explain(step)(ema, net)
assert explanation.graph_break_count == 0, explanation.break_reasons
print("ok")
"""


def test_compiled_ema_step_has_no_graph_breaks_from_the_first_call() -> None:
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(_COMPILE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().endswith("ok"), r.stdout[-3000:]


@pytest.mark.usefixtures("path")
def test_torch_foreach_lerp_is_taken_and_its_fallback_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    ema_a, ema_b = fk.copy(net), fk.copy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.7)
    want = fk.lerp(ema_a, net, 0.3)
    calls = spy_foreach_lerp(monkeypatch)
    fk.lerp(ema_a, net, 0.3, out=ema_a)
    assert [len(c) // 2 for c in calls] == [4]  # one call for the four parameters
    monkeypatch.setattr(tad, "foreach_lerp_", None)  # the fallback: one lerp_ per tensor
    fk.lerp(ema_b, net, 0.3, out=ema_b)
    assert len(calls) == 1  # (not called again)
    for p, q, w in zip(ema_a.parameters(), ema_b.parameters(), want.parameters(), strict=True):
        assert _bits_equal(p, w)
        assert _bits_equal(q, w)


@pytest.mark.parametrize("op", list(OPS))
def test_generic_adapter_out_equals_the_functional_form(op: str) -> None:
    """array-api-strict goes through the generic kernels (compute, then ``out[...] = r``)."""
    xp = pytest.importorskip("array_api_strict")
    rng = np.random.default_rng(3)
    ms = [{"w": xp.asarray(rng.standard_normal((3, 2))), "k": 1} for _ in range(N_INPUTS[op])]
    want = OPS[op](ms)
    out = ms[-1]
    w = out["w"]
    assert OPS[op](ms, out=out) is out
    assert out["w"] is w
    np.testing.assert_array_equal(np.asarray(out["w"]._array), np.asarray(want["w"]._array))


def _no_per_leaf_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    from functorkit import _inplace

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the per-leaf path of out= ran")

    monkeypatch.setattr(_inplace, "walk", refuse)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_column_path_is_taken_for_plain_models(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The column path (bench_arith small-model ``out=`` rows): every op, `out` a copy and an input,
    with no per-leaf walk at all (this fails when the column path stops being taken)."""
    ms = [_model(backend, s) for s in range(3)]
    wants = {op: OPS[op](ms[: N_INPUTS[op]]) for op in OPS}
    _no_per_leaf_walk(monkeypatch)
    for op, f in OPS.items():
        ins = [fk.copy(m) for m in ms[: N_INPUTS[op]]]
        for out in (fk.copy(ms[0]), ins[0]):  # a separate model, then the first input (in place)
            assert f(ins, out=out) is out
            for x, y in zip(fk.leaves(out), fk.leaves(wants[op]), strict=True):
                if hasattr(y, "shape") and _host(y).dtype.kind == "f":
                    assert _bits_equal(x, y), op


def test_out_column_path_for_an_nn_module_ema_step(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 2))
    ema = fk.copy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    want = fk.lerp(ema, net, 0.01)
    _no_per_leaf_walk(monkeypatch)
    assert fk.lerp(ema, net, 0.01, out=ema) is ema
    for p, q in zip(ema.parameters(), want.parameters(), strict=True):
        assert _bits_equal(p, q)
        assert p.grad_fn is None
        assert p.requires_grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_column_path_hands_what_it_cannot_decide_to_the_per_leaf_path(backend: str) -> None:
    """Views into one buffer (NumPy: not separate allocations; torch: ranges compared), `out` an
    input that a later term reads, and an input array at another place of `out`: the same results
    or refusals as the per-leaf path (the column path only says yes when it is sure)."""
    ms = [_model(backend, s) for s in range(3)]
    flat = _arr(backend, np.zeros(15 + 5 + 2, np.float32))
    views = fk.copy(ms[0])
    views["a"], views["b"][1] = flat[:15].reshape(5, 3), flat[20:22]
    want = fk.lincomb([0.5, -0.3, 0.9], ms)
    fk.lincomb([0.5, -0.3, 0.9], ms, out=views)
    assert _bits_equal(views["a"], want["a"])
    assert _bits_equal(views["b"][1], want["b"][1])
    last = fk.copy(ms[2])
    fk.lincomb([0.5, -0.3, 0.9], [ms[0], ms[1], last], out=last)  # read after the first write: aside
    assert _bits_equal(last["a"], want["a"])
    a = {"x": _arr(backend, np.ones(3)), "y": _arr(backend, np.zeros(3))}
    b = {"x": a["y"], "y": _arr(backend, np.ones(3))}  # `b` reads at x what `out=a` writes at y
    with pytest.raises(fk.StructureError, match=r"at y \(`out`\) and x \(`b`\)"):
        fk.add(a, b, out=a)
    np.testing.assert_array_equal(_host(a["x"]), np.ones(3))  # nothing written


def test_torch_autograd_switch_is_taken_restored_and_its_fallback_gives_the_same_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The in-place EMA step turns autograd off with ``torch._C._set_grad_enabled`` (the torch
    adapter's ``set_grad_enabled_``, what ``torch.no_grad`` calls): taken while autograd is on,
    not touched when it is off already, the mode restored after the call and after a failure
    inside it; without it (``None``) ``torch.no_grad()`` gives the same bits."""
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    ema_a, ema_b, ema_c = fk.copy(net), fk.copy(net), fk.copy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(1.7)
    want = fk.lerp(ema_a, net, 0.3)
    real = tad.set_grad_enabled_
    assert real is not None  # detected on this torch
    modes: list[bool] = []

    def spy(mode: bool) -> None:
        modes.append(mode)
        assert real is not None
        real(mode)

    monkeypatch.setattr(tad, "set_grad_enabled_", spy)
    fk.lerp(ema_a, net, 0.3, out=ema_a)
    assert modes == [False, True]
    assert torch.is_grad_enabled()
    with torch.no_grad():
        fk.lerp(ema_c, net, 0.3, out=ema_c)
    assert modes == [False, True]  # off already: not switched
    monkeypatch.setattr(tad, "set_grad_enabled_", None)  # the fallback: torch.no_grad()
    fk.lerp(ema_b, net, 0.3, out=ema_b)
    for p, q, r, w in zip(ema_a.parameters(), ema_b.parameters(), ema_c.parameters(), want.parameters(), strict=True):
        assert _bits_equal(p, w)
        assert _bits_equal(q, w)
        assert _bits_equal(r, w)
        assert p.grad_fn is None
        assert p.requires_grad
    monkeypatch.setattr(tad, "set_grad_enabled_", spy)

    def broken(xs: Any, ys: Any, t: float) -> None:
        raise RuntimeError("injected")

    monkeypatch.setattr(tad, "foreach_lerp_", broken)
    with pytest.raises(RuntimeError, match="injected"):
        fk.lerp(ema_a, net, 0.3, out=ema_a)
    assert modes[-2:] == [False, True]
    assert torch.is_grad_enabled()


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_tied_where_out_is_not_is_read_at_both_places(backend: str) -> None:
    """`b` holds one array at two places where `out` (= `a`) holds two: each place of `a` gets its
    own result, `b`'s array is read twice and left as it was."""
    w = _arr(backend, np.array([1.0, 2.0, 3.0], np.float32))
    a = {"x": _arr(backend, np.zeros(3, np.float32)), "y": _arr(backend, np.full(3, 4.0, np.float32))}
    b = {"x": w, "y": w}
    want = fk.lerp(a, b, 0.25)
    assert fk.lerp(a, b, 0.25, out=a) is a
    assert _bits_equal(a["x"], want["x"])
    assert _bits_equal(a["y"], want["y"])
    assert a["x"] is not a["y"]
    np.testing.assert_array_equal(_host(w), np.array([1.0, 2.0, 3.0], np.float32))


@pytest.mark.parametrize(
    ("op", "where"),
    [(op, where) for op in ("add", "sub", "scale", "lincomb", "mean") for where in ("copy", "first")]
    + [("lerp_low", "copy"), ("lerp_high", "copy")],
)
def test_torch_foreach_rows_are_taken_and_their_fallback_gives_the_same_bits(
    op: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``out=``'s column path writes every row of add, sub, scale, lincomb, mean and lerp into
    another model on plain tensors with ``torch._foreach_*`` calls (the torch adapter's
    ``foreach_arith_``; an in-place lerp is one ``_foreach_lerp_``, tested above): taken (a spy
    counts one call per kernel over all the parameters at once), with `out` a separate model and
    the first input; without them (None) the row kernels give the same bits, and so does the
    functional form."""
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    ms = [_model("torch", s) for s in range(N_INPUTS[op])]
    want = OPS[op](ms)
    real = tad.foreach_arith_
    assert real is not None  # detected on this torch
    calls: list[tuple[str, int]] = []

    def spying(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def spy(xs: Any, *args: Any, **kwargs: Any) -> Any:
            calls.append((name, len(xs)))
            return f(xs, *args, **kwargs)

        return spy

    outs = []
    for table in ({n: spying(n, f) for n, f in real.items()}, None):
        monkeypatch.setattr(tad, "foreach_arith_", table)
        ins = [fk.copy(m) for m in ms]
        out = fk.copy(ms[0]) if where == "copy" else ins[0]
        assert OPS[op](ins, out=out) is out
        outs.append(out)
    n_params = 3  # a, b[0], b[1]; "steps" is an integer constant
    assert calls, "the foreach path was not taken"
    assert {n for _, n in calls} == {n_params}  # every call over all the parameters at once
    assert (("copy", n_params) in calls) == (where == "copy")
    for got in outs:
        for x, y in zip(fk.leaves(got), fk.leaves(want), strict=True):
            if isinstance(y, torch.Tensor) and y.is_floating_point():
                assert _bits_equal(x, y), op
        np.testing.assert_array_equal(_host(got["steps"]), _host(ms[0]["steps"]))  # a constant: not written
    assert torch.is_grad_enabled()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("where", ["copy", "first"])
def test_numpy_rows_in_one_adapter_call_are_taken_and_give_the_row_kernels_bits(
    op: str, where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``out=``'s column path on NumPy hands every row to the adapter at once (``_rows``: the row
    kernels' ufuncs, one parameter after another); turned off, the row-by-row
    path gives the same bits, and both equal the functional form."""
    from functorkit.adapters import numpy as nad

    ms = [_model("numpy", s) for s in range(N_INPUTS[op])]
    want = OPS[op](ms)
    real = nad.Adapter._rows
    calls: list[int] = []

    def spy(self: Any, kern: Any, outs: list[Any], cols: list[list[Any]]) -> bool:
        calls.append(len(outs))
        return bool(real(self, kern, outs, cols))

    outs = []
    for f in (spy, lambda self, kern, outs, cols: False):
        monkeypatch.setattr(nad.Adapter, "_rows", f)
        ins = [fk.copy(m) for m in ms]
        out = fk.copy(ms[0]) if where == "copy" else ins[0]
        assert OPS[op](ins, out=out) is out
        outs.append(out)
    assert calls == [3]  # one call for the three parameters
    for got in outs:
        for x, y in zip(fk.leaves(got), fk.leaves(want), strict=True):
            if isinstance(y, np.ndarray) and y.dtype.kind == "f":
                assert _bits_equal(x, y), op
        np.testing.assert_array_equal(got["steps"], ms[0]["steps"])  # a constant: not written


def test_torch_foreach_rows_into_large_tensors_leave_them_to_the_row_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Into another model's tensors the ``_foreach`` rows start with a copy, one more pass over memory
    than the row kernels: tensors averaging more than ``FOREACH_COPY_BYTES`` go row by row (the
    same bits), in place they stay one call."""
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    ms = [_model("torch", s, n=64) for s in range(3)]  # "a": 64x3 float32, 768 bytes
    want = fk.lincomb([0.5, -0.3, 0.9], ms)
    real = tad.foreach_arith_
    assert real is not None
    calls: list[str] = []

    def spying(name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        def spy(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return f(*args, **kwargs)

        return spy

    monkeypatch.setattr(tad, "foreach_arith_", {n: spying(n, f) for n, f in real.items()})
    monkeypatch.setattr(tad, "FOREACH_COPY_BYTES", 64)
    out = fk.copy(ms[0])
    fk.lincomb([0.5, -0.3, 0.9], ms, out=out)
    assert calls == []  # row by row
    for x, y in zip(fk.leaves(out), fk.leaves(want), strict=True):
        if isinstance(y, torch.Tensor) and y.is_floating_point():
            assert _bits_equal(x, y)
    ins = [fk.copy(m) for m in ms]
    fk.lincomb([0.5, -0.3, 0.9], ins, out=ins[0])  # in place: no copy, one call per kernel
    assert calls == ["mul", "add", "add"]
