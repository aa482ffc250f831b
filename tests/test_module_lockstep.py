"""Two torch modules walked in lock step (``functorkit/adapters/_torch_module._lockstep``, the
``NodeDef.lockstep`` of modules): ``out=`` and the two-model reductions on modules list both
modules' leaves in one pass over their ``__dict__`` sections instead of recording the first module
and matching the second against its definition (bench_arith's 12-block ``nn.Module`` EMA rows).

Checked here, through the public functions: the same results, bit for bit, and the same refusals
(type and message, nothing written) with the walk on and off, on modules of every layout; the walk
taken where it applies (no module recorded) and declined where it must be (ties, shared
submodules, a node registered over a module class, a lazy module, three models).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

import functorkit as fk
from functorkit import _lockstep

torch = pytest.importorskip("torch")
from test_torch_module_walk import NAMES, _make  # noqa: E402  (the module layouts of the walk tests)

from functorkit.adapters import _torch_module  # noqa: E402  (torch is there)

nn = torch.nn

#: the public calls that walk two modules together (each returns what is compared)
CALLS: dict[str, Callable[[Any, Any], Any]] = {
    "lerp out=": lambda a, b: fk.lerp(a, b, 0.25, out=a),
    "lerp out=, every array": lambda a, b: fk.lerp(a, b, 0.25, out=a, trainable_only=False),
    "add out=": lambda a, b: fk.add(a, b, out=a),
    "lincomb out=": lambda a, b: fk.lincomb([0.5, 2.0], [a, b], out=a),
    "scale out= into b": lambda a, b: fk.scale(3.0, a, out=b),
    "dot": lambda a, b: fk.dot(a, b),
    "dot, every array": lambda a, b: fk.dot(a, b, trainable_only=False),
}


def _pair(name: str) -> tuple[Any, Any]:
    a = _make(name)
    b = copy.deepcopy(a)
    with torch.no_grad():
        for i, x in enumerate(fk.leaves(b)):
            if x.is_floating_point():
                x.add_(0.5 + i)
    return a, b


def _state(tree: Any) -> list[tuple[str, list[Any], bool]]:
    return [(str(p), x.tolist(), x.requires_grad) for p, x in fk.leaves_with_path(tree)]


def _outcome(call: Callable[[Any, Any], Any], name: str) -> Any:
    a, b = _pair(name)
    r = call(a, b)
    res = float(r.detach()) if isinstance(r, torch.Tensor) else None
    return res, _state(a), _state(b)


@pytest.fixture
def records(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The trees `_columns` records (the lock-step walk records none)."""
    seen: list[Any] = []
    real = _lockstep.record_plain

    def spy(tree: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(tree)
        return real(tree, *args, **kwargs)

    monkeypatch.setattr(_lockstep, "record_plain", spy)
    return seen


@pytest.mark.parametrize("call", CALLS, ids=list(CALLS))
@pytest.mark.parametrize("name", NAMES)
def test_the_lockstep_walk_gives_what_recording_gives(name: str, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    on = _outcome(CALLS[call], name)
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    off = _outcome(CALLS[call], name)
    assert on == off


@pytest.mark.parametrize("name", ["blocks", "mixed", "no bias, buffers", "frozen", "parameter list and dict", "lstm"])
def test_the_lockstep_walk_is_taken(name: str, records: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(name)
    fk.lerp(a, b, 0.25, out=a)
    fk.dot(a, b)
    assert records == []  # neither module recorded: both walked together
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    fk.lerp(a, b, 0.25, out=a)
    assert records == [a]  # the switch is what made the difference


class _Sym(nn.Module):
    def forward(self, x: Any) -> Any:
        return x + x.T


def _parametrized() -> Any:
    lin = nn.Linear(3, 3)
    torch.nn.utils.parametrize.register_parametrization(lin, "weight", _Sym())
    return nn.Sequential(lin, nn.ReLU())


@pytest.mark.parametrize("name", ["tied", "one module twice", "parametrized one by one"])
def test_ties_shared_submodules_and_parametrizations_are_recorded(name: str, records: list[Any]) -> None:
    if name == "parametrized one by one":  # two classes of one kind (one per instance): matched by kind
        torch.manual_seed(0)
        a, b = _parametrized(), _parametrized()
        assert type(a[0]) is not type(b[0])
    else:
        a, b = _pair(name)
    want = [(p, (torch.lerp(x, y, 0.25) if t else x).tolist()) for (p, x, t), y in zip(_with_flags(a), fk.leaves(b))]
    fk.lerp(a, b, 0.25, out=a)
    assert records  # the lock-step walk declined: the first module was recorded
    assert [(p, x.tolist()) for p, x, _ in _with_flags(a)] == want


def _with_flags(tree: Any) -> list[tuple[str, Any, bool]]:
    _, td = fk.flatten(tree)
    return [(str(p), x, t) for (p, x), t in zip(fk.leaves_with_path(tree), td.trainable)]


def test_three_models_and_a_registered_module_class_are_recorded(records: list[Any]) -> None:
    a, b = _pair("blocks")
    fk.lincomb([0.5, 0.25, 0.25], [a, b, b], out=a)
    assert records == [a]

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(2, 2)

    fk.register(Wrapped, children=lambda w: ({"lin": w.lin}, None), rebuild=lambda aux, ch: ch["lin"])
    x, y = nn.Sequential(Wrapped()), nn.Sequential(Wrapped())
    records.clear()
    fk.add(x, y, out=x)
    assert records == [x]  # a registration over a module class is its own node: recorded


def _mismatch(kind: str) -> tuple[Any, Any]:
    a, b = _pair("blocks")
    if kind == "dtype":
        b[1][3].weight = nn.Parameter(b[1][3].weight.double())
    elif kind == "shape":
        b[2][1] = nn.Linear(4, 9)
    elif kind == "extra module":
        b.add_module("3", nn.Linear(4, 4))
    elif kind == "other class":
        b[0][2] = nn.ReLU()
    elif kind == "a bias missing":
        b[0][1].bias = None
    elif kind == "parameter order":
        lin = b[1][1]
        w, bias = lin.weight, lin.bias
        del lin.weight, lin.bias
        lin.bias, lin.weight = bias, w
    elif kind == "sparse":
        b[1][1].weight = nn.Parameter(b[1][1].weight.detach().to_sparse())
    elif kind == "a tensor where a module is":
        b[0]._modules["2"] = torch.ones(1)
    else:
        assert kind == "device"
        b[2][3].bias = nn.Parameter(torch.empty(4, device="meta"))
    return a, b


MISMATCHES = (
    "dtype",
    "shape",
    "extra module",
    "other class",
    "a bias missing",
    "parameter order",
    "a tensor where a module is",
    "device",
    "sparse",
)


def _refusal(kind: str, call: str) -> tuple[Any, ...]:
    a, b = _mismatch(kind)
    before = _state(a)
    try:
        r = CALLS[call](a, b)
    except Exception as e:  # noqa: BLE001  (the refusal itself is compared)
        assert _state(a) == before  # all or nothing
        return type(e), str(e)
    return "no error", float(r.detach()) if isinstance(r, torch.Tensor) else None, _state(a)


@pytest.mark.parametrize("call", ["lerp out=", "add out=", "dot"])
@pytest.mark.parametrize("kind", MISMATCHES)
def test_a_mismatch_is_refused_as_recording_refuses_it(kind: str, call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    on = _refusal(kind, call)
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    off = _refusal(kind, call)
    assert on == off
    if kind in ("dtype", "shape", "device", "sparse"):  # refused on the lock-step walk's own lists, naming the path
        assert isinstance(on[0], type), on
        assert on[1].startswith("at ["), on


def test_a_module_without_its_sections_fails_as_recording_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def attempt() -> tuple[type, str]:
        a, b = _pair("blocks")
        del b[1][1].__dict__["_buffers"]  # (as a module whose Module.__init__ never ran)
        with pytest.raises(Exception) as info:  # noqa: PT011  (the failure itself is compared)
            fk.lerp(a, b, 0.5, out=a)
        return type(info.value), str(info.value)

    on = attempt()
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    assert attempt() == on


def test_a_lazy_module_is_refused_by_path_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    def attempt() -> str:
        a = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(3))
        b = nn.Sequential(nn.Linear(2, 2), nn.LazyLinear(3))
        with pytest.raises(ValueError, match="uninitialized") as info:
            fk.lerp(a, b, 0.5, out=a)
        return str(info.value)

    on = attempt()
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    assert attempt() == on
    assert "[1]" in on


class _Sub(torch.Tensor):
    """A tensor subclass: ``nn.Parameter`` of one sets ``_is_param`` on the instance, as FSDP2's DTensor
    parameters have."""


def _subclass_params(seed: int) -> Any:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    for lin in (m[0], m[2]):
        for name in ("weight", "bias"):
            p = getattr(lin, name)
            setattr(lin, name, nn.Parameter(p.detach().clone().as_subclass(_Sub), requires_grad=name == "weight"))
    return m


def test_parameters_of_a_tensor_subclass_are_flagged_in_one_pass(
    records: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    judged: list[Any] = []
    real = _torch_module._slot_trainable
    monkeypatch.setattr(_torch_module, "_slot_trainable", lambda v: judged.append(v) or real(v))
    fk.leaves(_subclass_params(0))  # (the first walk of a tensor type registers it as a leaf type)

    def dot() -> Any:  # the lock-step walk's flags (the frozen biases left out)
        a, b = _subclass_params(0), _subclass_params(1)
        assert type(a[0].weight) is _Sub
        assert a[0].weight._is_param is True
        return float(fk.dot(a, b).detach())

    on = dot()
    assert records == []  # walked together, and no parameter judged one by one
    assert judged == []
    a, b = _subclass_params(0), _subclass_params(1)
    assert on == pytest.approx(sum(float((a[i].weight * b[i].weight).sum().detach()) for i in (0, 2)))
    monkeypatch.setattr(_torch_module, "PARAM_FLAGS", [False])
    assert dot() == on
    assert len(judged) == 4  # the switch is what made the difference
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    assert dot() == on  # the recording walk agrees


def test_a_layer_of_trainable_subclass_parameters_is_recorded_without_judging_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    judged: list[Any] = []
    real = _torch_module._slot_trainable
    monkeypatch.setattr(_torch_module, "_slot_trainable", lambda v: judged.append(v) or real(v))

    def flags() -> Any:
        m = _subclass_params(0)
        m[0].bias.requires_grad_(True)  # the first layer's parameters all trainable, the last one's bias frozen
        return fk.flatten(m)[1].trainable

    on = flags()
    assert on == (True, True, True, False)
    assert len(judged) == 2  # the last layer only (a frozen parameter: each judged)
    judged.clear()
    monkeypatch.setattr(_torch_module, "PARAM_FLAGS", [False])
    assert flags() == on
    assert len(judged) == 4


def _none_slot(where: str) -> tuple[Any, Any]:
    a, b = _pair("blocks")
    for m in {"both": (a, b), "first": (a,), "second": (b,)}[where]:
        m[1].register_module("gap", None)  # a ``None`` submodule slot
    return a, b


@pytest.mark.parametrize("where", ["both", "first", "second"])
def test_a_none_submodule_slot_is_walked_as_recording_walks_it(
    where: str, records: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def attempt() -> Any:
        a, b = _none_slot(where)
        before = _state(a)
        try:
            fk.lerp(a, b, 0.25, out=a)
        except Exception as e:  # noqa: BLE001  (the refusal itself is compared)
            assert _state(a) == before  # all or nothing
            return type(e), str(e)
        return _state(a)

    on = attempt()
    assert (records == []) == (where == "both")  # walked together where the slots agree
    monkeypatch.setattr(_torch_module, "LOCKSTEP", False)
    assert attempt() == on  # (the recording walk's rule where the slots differ: they are not children)
