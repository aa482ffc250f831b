"""The per-call shortcuts of the arithmetic's column path (issue #22, small models in a loop): each
is taken where it applies (a spy counts it) and gives the results and errors of the path without it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _arith

torch = pytest.importorskip("torch")
from functorkit.adapters import torch as tad  # noqa: E402  (after the importorskip)


def _mlp(seed: int) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in ((8, 4), (8,), (3, 8), (3,))]


def test_real_python_coefficients_are_returned_at_once() -> None:
    """`_coefficient`'s shortcut (a float, or an int within int64) leaves every other case to the
    full classification: bools refused, huge ints as floats, NumPy scalars as Python numbers."""
    assert _arith._coefficient(0.5, "c", "scale") == 0.5
    assert type(_arith._coefficient(3, "c", "scale")) is int
    assert type(_arith._coefficient(2**63, "c", "scale")) is float
    assert type(_arith._coefficient(-(2**63), "c", "scale")) is int
    assert type(_arith._coefficient(np.float32(0.5), "c", "scale")) is float
    with pytest.raises(TypeError, match="got the bool True"):
        _arith._coefficient(True, "c", "scale")
    with pytest.raises(TypeError, match="must be real"):
        _arith._coefficient(1j, "t", "lerp", real=True)
    w = _arith._Weak(0.5, "c", "scale")
    assert w.real
    assert not w.array
    w = _arith._Weak(torch.tensor(0.5), "c", "scale")
    assert w.array
    assert not w.real


def test_operand_names_are_made_once() -> None:
    """``models[i]`` and ``coefficients[i]`` (the names in messages) are the same tuple call after
    call for a usual number of models, and right for any number."""
    assert _arith._indexed("models", 3) is _arith._indexed("models", 3)
    assert _arith._indexed("models", 3) == ("models[0]", "models[1]", "models[2]")
    many = _arith._indexed("models", _arith._NAMED + 1)
    assert many[-1] == f"models[{_arith._NAMED}]"
    assert len(many) == _arith._NAMED + 1
    a = {"w": np.ones(2)}
    with pytest.raises(fk.StructureError, match=r"`models\[2\]`"):
        fk.lincomb([1.0, 1.0, 1.0], [a, a, {"w": np.ones(3)}])


@pytest.mark.parametrize("views", [False, True])
def test_numpy_out_fast_takes_an_array_listed_twice(monkeypatch: pytest.MonkeyPatch, views: bool) -> None:
    """``lincomb(out=)`` of two models holding the same arrays: NumPy's ``out_fast`` is handed the
    repeats (`out_fast_repeats`: the caller removes none) and still takes the column path, for
    arrays that own their memory and for views of one buffer (it removes them there itself); the
    bits equal those with the caller removing them, and the functional form's."""
    from functorkit.adapters import numpy as nad

    base = np.arange(12.0)
    a = {"w": base[:6], "b": base[6:]} if views else {"w": np.arange(6.0), "b": np.arange(6.0) + 6}
    twin = {"w": a["w"], "b": a["b"]}
    want = fk.lincomb([0.5, 2.0], [a, twin])
    real = nad.Adapter._rows
    calls: list[int] = []

    def spy(self: Any, kern: Any, outs: list[Any], cols: list[list[Any]]) -> bool:
        calls.append(len(outs))
        return bool(real(self, kern, outs, cols))

    monkeypatch.setattr(nad.Adapter, "_rows", spy)
    for repeats in (True, False):
        monkeypatch.setattr(nad.Adapter, "out_fast_repeats", repeats)
        dst = {"w": np.empty(6), "b": np.empty(6)}
        assert fk.lincomb([0.5, 2.0], [a, twin], out=dst) is dst
        for k in dst:
            assert dst[k].tobytes() == want[k].tobytes()
    assert calls == [2, 2], "the column path was not taken"


def test_the_column_path_asks_the_tracer_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``out=``'s column path asks ``tracing()`` once (in `_columns`) and tells the adapter so
    (`eager`): torch's ``first_not_dense`` and ``out_fast`` do not ask ``compiling()`` again; asked
    without `eager` they do (the per-leaf path, ``torch.compile``)."""
    calls: list[int] = []
    real = tad.compiling

    def spy() -> bool:
        calls.append(1)
        return bool(real())

    monkeypatch.setattr(tad, "compiling", spy)
    ema, model = _mlp(0), _mlp(1)
    fk.lerp(ema, model, 0.25, out=ema)
    assert calls == [], "the adapter asked compiling() on the column path"
    ad = tad.Adapter(torch)
    assert ad.first_not_dense(ema) is None
    assert ad.out_fast(ema, [*ema, *model])
    assert len(calls) == 2
