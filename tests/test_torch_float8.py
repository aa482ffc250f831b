"""torch float8 parameters in the arithmetic (SPEC 12 and 14): computed in float32, rounded once.

torch has no arithmetic kernels for its float8 dtypes (``x + y`` raises ``NotImplementedError``),
so the torch adapter computes their parameters in float32 and rounds each result element once
into the parameter's float8 dtype, as the NumPy adapter does for ml_dtypes' float8: the same
values bit for bit (within range: overflow follows each library's own cast). ``out=`` keeps its
all-or-nothing promise: float8 never reaches ``torch._foreach_lerp_`` or an in-place kernel that
cannot take it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _inplace, _lockstep

from helpers import spy_foreach_lerp

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

F8_NAMES = [n for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)]
#: with the exponent-only scale type (powers of two, no sign: torch's cast decides every result)
F8_ALL = [*F8_NAMES, *(["float8_e8m0fnu"] if hasattr(torch, "float8_e8m0fnu") else [])]
#: the float8 dtypes ml_dtypes has too (the bit-for-bit comparison with the NumPy adapter)
ML_NAMES = ["float8_e4m3fn", "float8_e5m2"]

#: every arithmetic function, as ``f(models, **out)``; the number of models each takes
OPS: dict[str, Callable[..., Any]] = {
    "add": lambda ms, **k: fk.add(ms[0], ms[1], **k),
    "sub": lambda ms, **k: fk.sub(ms[0], ms[1], **k),
    "scale": lambda ms, **k: fk.scale(0.37, ms[0], **k),
    "scale_0d": lambda ms, **k: fk.scale(_zero_d(ms[0], -1.3), ms[0], **k),
    "lincomb": lambda ms, **k: fk.lincomb([0.5, -0.3, 0.9], ms, **k),
    "lincomb_0d": lambda ms, **k: fk.lincomb([_zero_d(ms[0], 0.25), 1.1, -0.7], ms, **k),
    "mean": lambda ms, **k: fk.mean(ms, **k),
    "mean_1": lambda ms, **k: fk.mean(ms[:1], **k),
    "lerp_low": lambda ms, **k: fk.lerp(ms[0], ms[1], 0.1, **k),
    "lerp_high": lambda ms, **k: fk.lerp(ms[0], ms[1], 0.8, **k),
    "lerp_0d": lambda ms, **k: fk.lerp(ms[0], ms[1], _zero_d(ms[0], 0.3), **k),
}
N_INPUTS = {"add": 2, "sub": 2, "lincomb": 3, "lincomb_0d": 3, "mean": 3}


def _zero_d(model: Any, v: float) -> Any:
    """A 0-d float64 coefficient of the model's namespace (cast to the kernels' compute dtype)."""
    leaf = fk.leaves(model)[0]
    if isinstance(leaf, np.ndarray):
        return np.asarray(v, np.float64)
    return torch.tensor(v, dtype=torch.float64)


def _float32_reference(op: str, ms: list[dict[str, Any]]) -> dict[str, Any]:
    """What SPEC 12 asks for, written out: every operand as float32, the formula in float32 (torch
    ``lerp``'s formula; the sum left to right, then divided), the result rounded once."""
    out = {}
    for k in ms[0]:
        xs = [m[k].float() for m in ms]
        dt = ms[0][k].dtype
        x = xs[0]
        if op == "add":
            r = x + xs[1]
        elif op == "sub":
            r = x - xs[1]
        elif op == "scale":
            r = x * 0.37
        elif op == "scale_0d":
            r = x * torch.tensor(-1.3, dtype=torch.float32)
        elif op == "lincomb":
            r = x * 0.5 + xs[1] * -0.3 + xs[2] * 0.9
        elif op == "lincomb_0d":
            r = x * torch.tensor(0.25, dtype=torch.float32) + xs[1] * 1.1 + xs[2] * -0.7
        elif op == "mean":
            r = (x + xs[1] + xs[2]) / 3
        elif op == "mean_1":
            r = x / 1
        elif op == "lerp_low":
            r = x + (xs[1] - x) * 0.1
        elif op == "lerp_high":
            r = xs[1] - (xs[1] - x) * (1 - 0.8)
        else:
            r = x + (xs[1] - x) * torch.tensor(0.3, dtype=torch.float32)
        out[k] = r.to(dt)
    return out


def _bits(t: Any) -> bytes:
    """Every byte of tensor `t` (of any dtype)."""
    return bytes(t.detach().contiguous().view(torch.uint8).reshape(-1).tolist())


def _models(name: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    """`n` models of two float8 parameters (a matrix and a vector) with values within range."""
    dt = getattr(torch, name)
    g = torch.Generator().manual_seed(seed)
    return [
        {"w": (torch.randn(5, 4, generator=g) * 3).to(dt), "b": (torch.randn(7, generator=g) * 3).to(dt)}
        for _ in range(n)
    ]


@pytest.fixture(params=["columns", "per-leaf"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both paths of the lock-step engine and of ``out=`` (the column paths, and the per-leaf paths
    they fall back to)."""
    on = request.param == "columns"
    monkeypatch.setattr(_inplace, "FAST", [on])
    monkeypatch.setattr(_lockstep, "COLUMNS", [on])
    return str(request.param)


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("name", F8_ALL)
def test_functional_is_float32_rounded_once(name: str, op: str) -> None:
    ms = _models(name, N_INPUTS.get(op, 2))
    got = OPS[op](ms)
    want = _float32_reference(op, ms)
    for k in want:
        assert got[k].dtype == getattr(torch, name)
        assert _bits(got[k]) == _bits(want[k]), (op, k)


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("where", ["copy", "first", "last"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("name", F8_ALL)
def test_out_equals_the_functional_form(name: str, op: str, where: str) -> None:
    n = N_INPUTS.get(op, 2)
    if op == "mean_1" and where == "last":
        n = 1
    ms = _models(name, n)
    want = OPS[op](ms)
    if where == "copy":
        out = fk.copy(ms[0])
    elif where == "first":
        out = ms[0]
    else:
        out = ms[-1] if op != "mean_1" else ms[0]
    held = {k: out[k] for k in out}
    got = OPS[op](ms, out=out)
    assert got is out
    for k in want:
        assert out[k] is held[k]  # written in place
        assert _bits(out[k]) == _bits(want[k]), (op, k, where)


_C3 = [0.31, -0.77, 0.123]
#: each operation as ``(fk call, its float32 formula on NumPy arrays)``: the formula rounds the
#: coefficients to float32 as the kernels do (Python numbers are weak; 0-d arrays are cast)
BITWISE: dict[str, tuple[Callable[..., Any], Callable[[list[Any]], Any]]] = {
    "add": (lambda ms, **k: fk.add(ms[0], ms[1], **k), lambda x: x[0] + x[1]),
    "sub": (lambda ms, **k: fk.sub(ms[0], ms[1], **k), lambda x: x[0] - x[1]),
    "scale": (lambda ms, **k: fk.scale(-0.61, ms[0], **k), lambda x: x[0] * np.float32(-0.61)),
    "scale_0d": (lambda ms, **k: fk.scale(_zero_d(ms[0], 0.7071), ms[0], **k), lambda x: x[0] * np.float32(0.7071)),
    "lincomb": (
        lambda ms, **k: fk.lincomb(_C3, ms, **k),
        lambda x: x[0] * np.float32(_C3[0]) + x[1] * np.float32(_C3[1]) + x[2] * np.float32(_C3[2]),
    ),
    "lincomb_0d": (
        lambda ms, **k: fk.lincomb([_zero_d(ms[0], 0.3), 0.5, -0.2], ms, **k),
        lambda x: x[0] * np.float32(0.3) + x[1] * np.float32(0.5) + x[2] * np.float32(-0.2),
    ),
    "mean": (lambda ms, **k: fk.mean(ms, **k), lambda x: (x[0] + x[1] + x[2]) / np.float32(3)),
    "lerp_low": (
        lambda ms, **k: fk.lerp(ms[0], ms[1], 0.0173, **k),
        lambda x: x[0] + (x[1] - x[0]) * np.float32(0.0173),
    ),
    "lerp_high": (
        lambda ms, **k: fk.lerp(ms[0], ms[1], 0.93, **k),
        lambda x: x[1] - (x[1] - x[0]) * np.float32(1 - 0.93),
    ),
    "lerp_0d": (
        lambda ms, **k: fk.lerp(ms[0], ms[1], _zero_d(ms[0], 0.4), **k),
        lambda x: x[0] + (x[1] - x[0]) * np.float32(0.4),
    ),
    "lerp_extrapolate": (
        lambda ms, **k: fk.lerp(ms[0], ms[1], 1.25, **k),
        lambda x: x[1] - (x[1] - x[0]) * np.float32(1 - 1.25),
    ),
}


def _pairs(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The same float8 values as NumPy (ml_dtypes) and torch models; 3000 elements (NumPy's blocked
    path too) and 9; within range for every result (|r| <= 3 * 8 < 448: no overflow, where torch's
    cast saturates float8_e4m3fn and ml_dtypes' gives NaN)."""
    npd = np.dtype(getattr(ml_dtypes, name))
    rng = np.random.default_rng(7)
    vals = [rng.uniform(-8, 8, (3, 1000)).astype(np.float32).astype(npd) for _ in range(3)]
    nms = [{"w": v, "b": v[0, :9].copy()} for v in vals]
    dt = getattr(torch, name)
    tms = [{k: torch.from_numpy(a.view(np.uint8).copy()).view(dt) for k, a in m.items()} for m in nms]
    return nms, tms


def _check_torch_bytes(name: str, f: Callable[..., Any], tms: list[dict[str, Any]], want: dict[str, Any]) -> None:
    """`f` on copies of the torch models, functional and with ``out=`` (a copy; the first model),
    gives `want`'s bytes (NumPy arrays) at every parameter."""
    for out in (None, "copy", "first"):
        tm = [fk.copy(m) for m in tms]
        if out is None:
            got = f(tm)
        else:
            o = fk.copy(tm[0]) if out == "copy" else tm[0]
            assert f(tm, out=o) is o
            got = o
        for k, w in want.items():
            assert got[k].dtype == getattr(torch, name)
            assert not np.isnan(w.astype(np.float32)).any()  # within range: no overflow
            np.testing.assert_array_equal(got[k].view(torch.uint8).numpy(), w.view(np.uint8), err_msg=f"out={out}, {k}")


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("name", ML_NAMES)
def test_bit_for_bit_equal_to_numpy_ml_dtypes(name: str, op: str) -> None:
    """The NumPy adapter (ml_dtypes float8, computed in float32 in blocks, rounded once) and the torch
    adapter give the same bytes for the same values and coefficients, functional and ``out=``."""
    nms, tms = _pairs(name)
    f = BITWISE[op][0]
    want = f(nms)
    assert all(w.dtype == nms[0][k].dtype for k, w in want.items())
    _check_torch_bytes(name, f, tms, want)


@pytest.mark.parametrize("op", list(BITWISE))
@pytest.mark.parametrize("name", ML_NAMES)
def test_bit_for_bit_equal_to_numpy_float32_then_ml_dtypes_cast(name: str, op: str) -> None:
    """The rule written out with NumPy: the float8 values as float32, the formula in float32, one
    ml_dtypes cast; torch's float8 results have the same bytes."""
    nms, tms = _pairs(name)
    f, formula = BITWISE[op]
    npd = np.dtype(getattr(ml_dtypes, name))
    want = {k: formula([m[k].astype(np.float32) for m in nms]).astype(npd) for k in nms[0]}
    _check_torch_bytes(name, f, tms, want)


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("name", F8_NAMES)
def test_scale_in_place_of_a_mixed_model(name: str) -> None:
    """The reported case: ``fk.scale(2, m, out=m)`` with a float32 and a float8 parameter raised after
    writing the float32 one; now both are scaled."""
    m = {"a": torch.ones(2), "b": torch.ones(2).to(getattr(torch, name))}
    a, b = m["a"], m["b"]
    assert fk.scale(2.0, m, out=m) is m
    assert m["a"] is a
    assert m["b"] is b
    assert m["a"].tolist() == [2.0, 2.0]
    assert m["b"].float().tolist() == [2.0, 2.0]


def _ema_pair(name: str) -> tuple[Any, Any]:
    """An EMA and a model: ``nn.Module``s holding float8 parameters (torch allows them) and float32 ones."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3), torch.nn.Linear(3, 2))
    net[0].to(getattr(torch, name))
    net[2].to(getattr(torch, name))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_((torch.randn(p.shape) * 2).to(p.dtype))
    ema = fk.copy(net)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_((p.float() * 1.7 - 0.5).to(p.dtype))
    return ema, net


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("name", F8_NAMES)
def test_module_ema_in_place_keeps_float8_out_of_foreach_lerp(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fk.lerp(ema, model, t, out=ema)`` on an ``nn.Module`` with float8 and float32 parameters: the
    functional result, bit for bit; ``torch._foreach_lerp_`` never gets a float8 tensor."""
    ema, net = _ema_pair(name)
    assert {p.dtype for p in net.parameters()} == {torch.float32, getattr(torch, name)}
    want = fk.lerp(ema, net, 0.01)
    calls = spy_foreach_lerp(monkeypatch)
    params = list(ema.parameters())
    assert fk.lerp(ema, net, 0.01, out=ema) is ema
    assert all(x.dtype != getattr(torch, name) for c in calls for x in c)
    for p, q, w in zip(params, ema.parameters(), want.parameters(), strict=True):
        assert p is q
        assert p.dtype == w.dtype
        assert _bits(p) == _bits(w)
    # the float8 parameters: float32, rounded once (torch's lerp formula below 0.5)
    pairs = [(p, q) for p, q in zip(ema.parameters(), net.parameters(), strict=True) if p.dtype != torch.float32]
    want8 = [(p.float() + (q.float() - p.float()) * 0.01).to(p.dtype) for p, q in pairs]
    fk.lerp(ema, net, 0.01, out=ema)
    assert [_bits(p) for p, _ in pairs] == [_bits(w) for w in want8]


def test_all_float32_module_ema_still_takes_foreach_lerp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The float8 test does not turn the fast path off for other dtypes (bench_arith's EMA rows)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 2)).to(torch.bfloat16)
    ema = fk.copy(net)
    calls = spy_foreach_lerp(monkeypatch)
    fk.lerp(ema, net, 0.3, out=ema)
    assert [len(c) // 2 for c in calls] == [4]


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("op", list(OPS))
def test_out_is_all_or_nothing(op: str) -> None:
    """A call that must fail at a later leaf (`out`'s last array is an inference tensor) writes
    nothing: every byte of `out` (float8 and float32 arrays before it) is as it was."""
    ms = []
    for s in range(N_INPUTS.get(op, 2)):
        m = _models("float8_e4m3fn", 1, seed=s)[0]
        m["f32"] = torch.randn(3, generator=torch.Generator().manual_seed(s))
        m["z"] = torch.randn(4, generator=torch.Generator().manual_seed(9 + s))
        ms.append(m)
    out = fk.copy(ms[0])
    with torch.inference_mode():
        out["z"] = torch.zeros(4)
    before = {k: _bits(v) for k, v in out.items()}
    with pytest.raises(TypeError, match=r"at z: .*inference tensor"):
        OPS[op](ms, out=out)
    assert {k: _bits(v) for k, v in out.items()} == before


@pytest.mark.usefixtures("path")
@pytest.mark.parametrize("name", F8_NAMES)
def test_float8_dtype_mismatch_names_the_path(name: str) -> None:
    """Dtypes still never mix: a float8 parameter against a float32 one is a PolicyError, nothing written."""
    a = {"x": torch.ones(2), "y": torch.ones(2).to(getattr(torch, name))}
    b = {"x": torch.ones(2), "y": torch.ones(2)}
    before = {k: _bits(v) for k, v in a.items()}
    with pytest.raises(fk.PolicyError, match=r"at y: .*dtype float8"):
        fk.add(a, b, out=a)
    assert {k: _bits(v) for k, v in a.items()} == before
    with pytest.raises(fk.PolicyError, match=r"at y: .*dtype float8"):
        fk.add(a, b)


@pytest.mark.parametrize("name", F8_NAMES)
def test_autograd_through_float8_arithmetic(name: str) -> None:
    """The float32 computation is recorded by autograd like any other (a float8 parameter that
    requires grad gets a gradient through ``fk.lincomb``)."""
    dt = getattr(torch, name)
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]).to(dt))
    q = torch.tensor([0.5, 0.25]).to(dt)
    r = fk.lincomb([2.0, 4.0], [{"w": p}, {"w": q}])["w"]
    assert r.dtype == dt
    r.float().sum().backward()
    assert p.grad is not None
    assert p.grad.float().tolist() == [2.0, 2.0]


@pytest.mark.parametrize("name", F8_NAMES)
def test_reductions_and_normalize(name: str) -> None:
    """``fk.norm``/``fk.dot`` accumulate float8 in float32 and round the result once;
    ``fk.normalize`` divides in float32 (the float32 norm), rounded once."""
    dt = getattr(torch, name)
    m = {"w": torch.tensor([3.0, 4.0]).to(dt), "b": torch.tensor([0.0]).to(dt)}
    n = fk.norm(m)
    assert n.dtype == dt
    assert float(n) == 5.0
    d = fk.dot(m, m)
    assert d.dtype == dt
    assert float(d) == torch.tensor(25.0).to(dt).float().item()
    u = fk.normalize(m)
    assert u["w"].dtype == dt
    assert _bits(u["w"]) == _bits((m["w"].float() / 5.0).to(dt))


@pytest.mark.parametrize("name", F8_NAMES)
def test_filter_normalize_is_the_float32_result_rounded_once(name: str) -> None:
    dt = getattr(torch, name)
    d = {"w": (torch.randn(4, 3, generator=torch.Generator().manual_seed(1)) * 2).to(dt), "b": torch.ones(4).to(dt)}
    r = {"w": (torch.randn(4, 3, generator=torch.Generator().manual_seed(2)) * 2).to(dt), "b": torch.ones(4).to(dt)}
    for one_d in ("zero", "keep", "normalize"):
        got = fk.filter_normalize(d, r, one_d=one_d)
        want = fk.filter_normalize(fk.fmap(lambda x: x.float(), d), fk.fmap(lambda x: x.float(), r), one_d=one_d)
        for k in d:
            assert got[k].dtype == dt
            assert _bits(got[k]) == _bits(want[k].to(dt)), (one_d, k)


def test_all_finite_on_torch_float8() -> None:
    m = {"w": torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)}
    assert bool(fk.all_finite(m))


def test_allclose_on_torch_float8() -> None:
    m = {"w": torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)}
    assert fk.allclose(m, m)
