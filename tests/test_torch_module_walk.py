"""The fast paths of the torch module walk (``functorkit/adapters/_torch_module.py``,
``functorkit/_leaves_walk.py``): a module of one section taken apart without `_slots`
(`INLINE_SLOTS`), ``fk.leaves`` listing a module's children without their keys (`VALUES_ONLY`) and
walking a node kind met before from its parent's loop (`CHILDREN_INLINE`).

Each is checked to give what the path it replaces gives, on modules of every layout (buffers, ``None``
slots, ties, shared and lazy modules, parametrizations, RNNs, dict and digit names), for every
operation that walks them, and to be taken: the tests count the calls of the code each fast path
skips (bench_walk's module table shows them on and off).
"""

from __future__ import annotations

import copy
import pickle
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import functorkit as fk
from functorkit import _leaves_walk

torch = pytest.importorskip("torch")
from functorkit.adapters import _torch_module  # noqa: E402  (torch is there)

nn = torch.nn

SWITCHES = (
    (_torch_module, "INLINE_SLOTS"),
    (_torch_module, "VALUES_ONLY"),
    (_leaves_walk, "CHILDREN_INLINE"),
)


def _blocks(n: int = 3) -> Any:
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.LayerNorm(4), nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 4)) for _ in range(n)]
    return nn.Sequential(*blocks)


class _Mixed(nn.Module):
    """Parameters, a buffer, submodules and ``None`` slots in one module."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(2))
        self.register_parameter("gone", None)
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("empty", None)
        self.inner = nn.Linear(2, 2, bias=False)
        self.register_module("missing", None)
        self.layers = nn.ModuleDict({"007": nn.Linear(2, 1), "x": nn.Identity()})


def _make(name: str) -> Any:
    torch.manual_seed(0)
    if name == "blocks":
        return _blocks()
    if name == "mixed":
        return _Mixed()
    if name == "no bias, buffers":
        return nn.Sequential(nn.Conv1d(2, 2, 3, bias=False), nn.BatchNorm1d(2))
    if name == "tied":
        tied = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
        tied[1].weight = tied[0].weight
        return tied
    if name == "one module twice":
        lin = nn.Linear(2, 2)
        return nn.Sequential(lin, lin, nn.Linear(2, 2))
    if name == "frozen":
        net = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
        net[0].weight.requires_grad_(False)
        return net
    if name == "lstm":
        return nn.LSTM(3, 4, num_layers=2)
    if name == "parameter list and dict":
        holder = nn.Module()
        holder.plist = nn.ParameterList([nn.Parameter(torch.ones(2)), nn.Parameter(torch.zeros(1))])
        holder.pdict = nn.ParameterDict({"a": nn.Parameter(torch.ones(1))})
        return holder
    if name == "parametrized":

        class Sym(nn.Module):
            def forward(self, x: Any) -> Any:
                return x + x.T

        lin = nn.Linear(3, 3)
        torch.nn.utils.parametrize.register_parametrization(lin, "weight", Sym())
        return nn.Sequential(lin, nn.ReLU())
    assert name == "in a dict"
    return {"enc": _blocks(1), "head": nn.Linear(4, 2), "scale": torch.ones(1)}


NAMES = (
    "blocks",
    "mixed",
    "no bias, buffers",
    "tied",
    "one module twice",
    "frozen",
    "lstm",
    "parameter list and dict",
    "parametrized",
    "in a dict",
)


def _ids(xs: list[Any]) -> list[int]:
    return [id(x) for x in xs]


def _observe(tree: Any, other: Any, pickled: bool) -> dict[str, Any]:
    """What every walk of `tree` gives (`other`: a copy, matched against it and added to it): leaves,
    definitions (and their pickles if `pickled`), matches, rebuilds, flat vectors."""
    leaves, td = fk.flatten(tree)
    with torch.no_grad():
        rebuilt = fk.fmap(lambda t: t * 2, tree)
        flat, re = fk.destructure(tree)
        summed = fk.add(tree, other)
    return {
        "leaves": _ids(fk.leaves(tree)),
        "paths": [str(p) for p, _ in fk.leaves_with_path(tree)],
        "flatten": _ids(leaves),
        "treedef": td,
        "treedef pickled": pickle.loads(pickle.dumps(td)) if pickled else None,
        "trainable": td.trainable,
        "match": _ids(td.flatten_up_to(other)),
        "combine": fk.fmapstructure(lambda t: tuple(t.shape), fk.combine(*fk.partition(tree))),
        "rebuilt": [(str(p), x.tolist()) for p, x in fk.leaves_with_path(rebuilt)],
        "rebuilt treedef": fk.flatten(rebuilt)[1],
        "flat": flat.tolist(),
        "re": [(str(p), x.tolist()) for p, x in fk.leaves_with_path(re(flat * 3))],
        "sum": [(str(p), x.tolist()) for p, x in fk.leaves_with_path(summed)],
        "other leaves": _ids(fk.leaves(other)),
    }


@pytest.mark.parametrize("switch", SWITCHES, ids=[attr for _, attr in SWITCHES])
@pytest.mark.parametrize("name", NAMES)
def test_each_fast_path_gives_what_the_path_it_replaces_gives(
    name: str, switch: tuple[Any, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _make(name)
    other = copy.deepcopy(tree)
    pickled = name != "parametrized"  # (a parametrized module's class, made per instance, is not picklable)
    on = _observe(tree, other, pickled)
    mod, attr = switch
    monkeypatch.setattr(mod, attr, False)
    off = _observe(tree, other, pickled)
    assert on.keys() == off.keys()
    for key in on:
        assert on[key] == off[key], key


@pytest.mark.parametrize("name", NAMES)
def test_the_leaves_are_torch_s_own(name: str) -> None:
    tree = _make(name)
    if isinstance(tree, dict):
        return  # (torch lists modules only; a dict of modules is checked through its modules above)
    want = {id(t) for t in tree.state_dict(keep_vars=True).values()}
    want |= {id(t) for name_, t in tree.named_buffers(remove_duplicate=False)}  # non-persistent buffers too
    assert set(_ids(fk.leaves(tree))) == want
    # torch lists each tensor once, in registration order: so does fk.leaves
    assert _ids(fk.leaves(tree)) == list(dict.fromkeys(_ids(list(tree.state_dict(keep_vars=True).values()))))


def test_a_module_with_none_slots_lists_them_nowhere() -> None:
    mixed = _Mixed()
    paths = [str(p) for p, _ in fk.leaves_with_path(mixed)]
    assert paths == ["w", "count", "inner.weight", "layers['007'].weight", "layers['007'].bias"]
    assert [str(p) for p in fk.flatten(mixed)[1].paths] == paths
    leaves, _ = fk.flatten(mixed)
    assert _ids(fk.leaves(mixed)) == _ids(leaves)


def test_a_lazy_module_is_listed_but_not_flattened() -> None:
    lazy = nn.Sequential(nn.LazyLinear(3), nn.Linear(3, 3))
    assert len(fk.leaves(lazy)) == 4  # listed without trainability (SPEC 3: the lazy rule)
    with pytest.raises(ValueError, match=r"at \[0\]: the parameter 'weight' of this LazyLinear is uninitialized"):
        fk.destructure(lazy)


# ---------------------------------------------------------------- taken, not only correct


def _calls(code_name: str, filename_end: str, fn: Callable[[], Any]) -> int:
    """How many times a Python function named `code_name` in a file ending in `filename_end` is called
    while `fn` runs (a profile hook: counts frames, changes nothing)."""
    count = [0]

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name == code_name and frame.f_code.co_filename.endswith(filename_end):
            count[0] += 1

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        fn()
    finally:
        sys.setprofile(old)
    return count[0]


def _keyed_walks(tree: Any) -> Iterator[Callable[[], Any]]:
    """The walks that make a module's child keys: recording and matching (``fk.leaves`` makes none)."""
    _, td = fk.flatten(tree)
    other = copy.deepcopy(tree)
    yield lambda: fk.flatten(tree)
    yield lambda: td.flatten_up_to(other)
    yield lambda: fk.fmap(lambda t: t, tree)


def test_one_section_modules_skip_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _blocks()  # every module holds parameters only or submodules only
    n_modules = len(list(net.modules()))
    for walk in _keyed_walks(net):
        walk()
        assert _calls("_slots", "_torch_module.py", walk) == 0
    monkeypatch.setattr(_torch_module, "INLINE_SLOTS", False)
    for walk in _keyed_walks(net):
        assert _calls("_slots", "_torch_module.py", walk) == n_modules
    monkeypatch.setattr(_leaves_walk, "LEAVES_WALK", False)  # fk.leaves by the recording walk
    assert _calls("_slots", "_torch_module.py", lambda: fk.leaves(net)) == n_modules
    # a module with a buffer, with both parameters and submodules, or with a ``None`` slot, is taken
    # by `_slots` always: here _Mixed itself and its bias-less Linear
    monkeypatch.setattr(_torch_module, "INLINE_SLOTS", True)
    assert _calls("_slots", "_torch_module.py", lambda: fk.flatten(_Mixed())) == 2


def test_leaves_makes_no_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _blocks()

    def no_keys(name: str) -> Any:
        msg = f"a key was made for {name!r}"
        raise AssertionError(msg)

    # names never met (so that keys would have to be made) and no way to make one
    monkeypatch.setattr(_torch_module, "_NAMES", set())
    monkeypatch.setattr(_torch_module, "_KNOWN", set())
    monkeypatch.setattr(_torch_module, "_key", no_keys)
    assert len(fk.leaves(net)) == 3 * 6
    assert len(fk.leaves(_Mixed())) == 5  # (`_slots`' layout, without keys too)
    monkeypatch.setattr(_torch_module, "VALUES_ONLY", False)
    with pytest.raises(AssertionError, match="a key was made"):
        fk.leaves(net)


def test_leaves_looks_up_each_module_kind_once(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _blocks()
    n_modules = len(list(net.modules()))
    kinds = len({type(m) for m in net.modules()})
    fk.leaves(net)
    # `other` meets the root and each kind of module once (and no leaf type: all are known by now)
    assert _calls("other", "_leaves_walk.py", lambda: fk.leaves(net)) == kinds
    monkeypatch.setattr(_leaves_walk, "CHILDREN_INLINE", False)
    assert _calls("other", "_leaves_walk.py", lambda: fk.leaves(net)) == n_modules


def test_a_registered_module_class_is_walked_by_its_registration_in_every_path() -> None:
    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(2, 2)
            self.b = nn.Linear(2, 2)

    fk.register(Pair, children=lambda p: ({"only": p.a}, None), rebuild=lambda aux, ch: ch["only"])
    tree = nn.Sequential(Pair(), Pair())  # (a class of this test's own: its registration is left in the table)
    assert [str(p) for p, _ in fk.leaves_with_path(tree)] == [
        "[0].only.weight",
        "[0].only.bias",
        "[1].only.weight",
        "[1].only.bias",
    ]
    assert _ids(fk.leaves(tree)) == _ids(fk.flatten(tree)[0])
