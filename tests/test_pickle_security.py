"""Unpickling a crafted Restructure never runs code through functorkit.

`pickle.loads` of an untrusted stream is never safe (a pickle can name any
callable), so pickles must come from trusted sources; see docs/guarantees.md.
What functorkit promises on top: the state it restores is *data*. A pickle that
names only functorkit's own restore function, with a state tampered in any
field, either loads into a Restructure that works on that data, or fails with
a clear error (`pickle.UnpicklingError`, `TypeError` or `ValueError`) when it is
unpickled or first used. No field ends up as source text in generated code,
and no field names a module that functorkit then imports.

The tests do not assume the layout of the state: they take whatever
``re.__reduce_ex__`` gives, tamper with each integer and each string in it, in
turn, and pickle the result through a stand-in object whose ``__reduce__``
returns the tampered value. The payloads write a marker file into `tmp_path`
(never anything else), and every test checks the marker never appears.
"""

from __future__ import annotations

import copyreg
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import functorkit as fk

from conftest import Backend, to_numpy
from helpers import Layer

CLEAR_ERRORS = (pickle.UnpicklingError, TypeError, ValueError)
Where = tuple[Any, ...]


def model(xp: Any = np) -> dict[str, Any]:
    """Every kind of program step: dict, list, tuple and registered nodes, a tie, a shared sub-tree, a constant.

    All its leaves are arrays, so every int and str in the pickled state is structure, not a constant.
    """

    def arr(*values: float) -> Any:
        return xp.asarray(np.asarray(values, dtype=np.float64))

    w = xp.reshape(arr(0.0, 0.2, 0.4, 0.6, 0.8, 1.0), (2, 3))
    shared = {"w": arr(1.0, 2.0, 3.0), "b": arr(4.0, 5.0)}
    return {
        "enc": shared,
        "dec": shared,
        "layers": [Layer(w, arr(0.5, 0.25, 0.125), name="l0"), (w, arr(6.0, 7.0, 8.0, 9.0))],
        "steps": xp.asarray(np.asarray([3, 4], dtype=np.int64)),
    }


# ---------------------------------------------------------------- tampering


def scalars(obj: Any, where: Where = ()) -> Iterator[tuple[Where, Any]]:
    """``(where, value)`` for every int and str inside nested dict values, lists, tuples and sets."""
    if type(obj) in (int, str):
        yield where, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from scalars(v, (*where, k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from scalars(v, (*where, i))
    elif isinstance(obj, (set, frozenset)):
        for v in sorted(obj, key=repr):
            yield from scalars(v, (*where, ("member", v)))


def replaced(obj: Any, where: Where, new: Any) -> Any:
    """A copy of `obj` with the value at `where` (as `scalars` names it) replaced by `new`."""
    if not where:
        return new
    head, rest = where[0], where[1:]
    if isinstance(obj, dict):
        out = dict(obj) if type(obj) is dict else type(obj)(obj)
        out[head] = replaced(obj[head], rest, new)
        return out
    if isinstance(obj, (set, frozenset)):
        member = head[1]
        return type(obj)((replaced(v, rest, new) if v == member and type(v) is type(member) else v) for v in obj)
    items = list(obj)
    items[head] = replaced(items[head], rest, new)
    if type(obj) is list:
        return items
    if type(obj) is tuple:
        return tuple(items)
    return type(obj)(*items)  # a namedtuple


class Crafted:
    """Pickles as the reduce value it is given (what an attacker writes with pickle opcodes)."""

    def __init__(self, rv: tuple[Any, ...]) -> None:
        self.rv = rv

    def __reduce__(self) -> tuple[Any, ...]:
        return self.rv


def reduce_value(re: Any) -> tuple[Any, ...]:
    rv = re.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    assert isinstance(rv, tuple), "the tests expect a reduce tuple, not a global name"
    if getattr(rv[0], "__name__", "") == "__newobj__":
        # copyreg.__newobj__(cls) == object.__new__(cls); the latter pickles from any object
        rv = (object.__new__, rv[1], *rv[2:])
    assert rv[0] is not copyreg.__newobj__
    return rv


def tampered(rv: tuple[Any, ...], where: Where, new: Any) -> bytes:
    """The pickle of `rv` with the scalar at `where` in its arguments and state replaced by `new`."""
    parts = list(rv)
    parts[where[0]] = replaced(parts[where[0]], where[1:], new)
    return pickle.dumps(Crafted(tuple(parts)), protocol=pickle.HIGHEST_PROTOCOL)


def fields(rv: tuple[Any, ...]) -> list[tuple[Where, Any]]:
    """Every int and str in the reduce value's arguments (1) and state (2, if any)."""
    out = list(scalars(rv[1], (1,)))
    if len(rv) > 2 and rv[2] is not None:
        out += list(scalars(rv[2], (2,)))
    return out


def payloads(marker: Path) -> list[str]:
    """Code that writes `marker`, shaped to run wherever a field could be pasted into source text."""
    act = f"__import__('pathlib').Path({str(marker)!r}).write_text('ran')"
    return [
        f"0 if {act} else 0",  # pasted as a number or an index: v0 if ... else 0
        f"x' + str({act}) + '",  # pasted between quotes
        f'x" + str({act}) + "',
        f"0\n    {act}\n    0",  # pasted as a statement of a generated function
        f"0]; {act}; [0",
    ]


def use(data: bytes, flat: Any, tree: Any) -> Any:
    """Unpickle and exercise the result the way a user would; return what the first call gave."""
    re = pickle.loads(data)
    out = re(flat)
    re.flatten(tree)
    re(flat, copy=True)
    str(re)
    return out


def attack(
    rv: tuple[Any, ...], positions: list[Where], values: list[str], marker: Path, flat: Any, tree: Any
) -> tuple[list[str], list[str], list[str]]:
    """Put each of `values` at each position in turn and use the result.

    Returns three lists of descriptions: where the marker appeared (code ran
    or a module was imported), where an unclear error came out, and where the
    tampered pickle was accepted and worked.
    """
    ran: list[str] = []
    unclear: list[str] = []
    accepted: list[str] = []
    for where in positions:
        for value in values:
            try:
                use(tampered(rv, where, value), flat, tree)
            except CLEAR_ERRORS:
                pass
            except Exception as e:  # noqa: BLE001 -- collected and reported by the test
                unclear.append(f"{where} <- {value!r}: {type(e).__name__}: {e}"[:300])
            else:
                accepted.append(f"{where} <- {value!r}")
            if marker.exists():
                ran.append(f"{where} <- {value!r}")
                marker.unlink()
    return ran, unclear, accepted


def report(what: str, found: list[str]) -> str:
    return f"{len(found)} tampered fields {what}:\n" + "\n".join(found[:20])


# ---------------------------------------------------------------- the tests


@pytest.fixture
def writable(backend: Backend, xp: Any) -> Any:
    if backend not in (Backend.NUMPY, Backend.TORCH):
        pytest.skip("the round trip runs on NumPy and torch")
    return xp


def test_a_legit_restructure_round_trips(writable: Any) -> None:
    xp = writable
    tree = model(xp)
    flat, re = fk.destructure(tree)
    re2 = pickle.loads(pickle.dumps(re))
    assert len(re2) == len(re) == 3 + 2 + 6 + 3 + 4
    assert re2.paths == re.paths
    p = flat * 2.0
    out, want = re2(p), re(p)
    assert [str(q) for q, _ in fk.leaves_with_path(out)] == [str(q) for q, _ in fk.leaves_with_path(want)]
    for a, b in zip(fk.leaves(out), fk.leaves(want), strict=True):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), strict=True)
    assert out["enc"] is out["dec"]  # the shared sub-tree comes back shared
    assert out["layers"][0].weight is out["layers"][1][0]  # the tie comes back tied
    assert out["layers"][0].name == "l0"
    np.testing.assert_array_equal(to_numpy(re2.flatten(tree)), to_numpy(flat), strict=True)
    # and the restored one pickles again to the same program
    re3 = pickle.loads(pickle.dumps(re2))
    np.testing.assert_array_equal(to_numpy(re3.flatten(re3(p))), to_numpy(p), strict=True)


def test_the_untampered_crafted_pickle_works() -> None:
    # the harness itself: re-pickling the unchanged reduce value gives a working Restructure
    tree = model()
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    out = use(pickle.dumps(Crafted(rv)), flat, tree)
    np.testing.assert_array_equal(to_numpy(fk.destructure(out)[0]), flat, strict=True)
    ints = [w for w, v in fields(rv) if type(v) is int]
    strs = [w for w, v in fields(rv) if type(v) is str]
    assert ints, "the state holds no integers: the tampering tests below would test nothing"
    assert strs, "the state holds no strings: the tampering tests below would test nothing"


def test_code_in_an_integer_field_never_runs_and_is_rejected(tmp_path: Path) -> None:
    # indices, lengths, counts and shapes: a string there is not data of the right type
    marker = tmp_path / "marker"
    tree = model()
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    positions = [w for w, v in fields(rv) if type(v) is int]
    ran, unclear, accepted = attack(rv, positions, payloads(marker), marker, flat, tree)
    assert not ran, report("ran code", ran)
    assert not unclear, report("gave unclear errors", unclear)
    assert not accepted, report("were accepted", accepted)


def test_code_in_a_string_field_never_runs(tmp_path: Path) -> None:
    # dict keys, field names, static data, policy, namespace and device names: a string may be
    # legitimate data there, so loading may succeed; it must never execute
    marker = tmp_path / "marker"
    tree = model()
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    positions = [w for w, v in fields(rv) if type(v) is str]
    ran, unclear, _ = attack(rv, positions, payloads(marker), marker, flat, tree)
    assert not ran, report("ran code", ran)
    assert not unclear, report("gave unclear errors", unclear)


def test_a_tampered_dict_key_is_data(tmp_path: Path) -> None:
    # a key that looks like code comes back as that very string key
    tree = {"w": np.ones(2), "b": {"c": np.zeros(1)}}
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    marker = tmp_path / "marker"
    key = payloads(marker)[1]
    positions = [w for w, v in fields(rv) if v == "w"]
    assert positions
    for where in positions:
        try:
            out = pickle.loads(tampered(rv, where, key))(flat)
        except CLEAR_ERRORS:
            continue
        assert not marker.exists()
        if key in out:
            np.testing.assert_array_equal(out[key], np.ones(2), strict=True)
    assert not marker.exists()


def test_a_module_name_in_the_state_is_never_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an importable module whose import has a side effect (as some installed modules do)
    marker = tmp_path / "marker"
    evil = "fk_pickle_marker_module"
    (tmp_path / f"{evil}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, evil, raising=False)
    tree = model()
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    # every string in the state that names a loaded module (the namespace of the arrays)
    positions = [w for w, v in fields(rv) if type(v) is str and v in sys.modules]
    assert positions, "the state names no module; nothing to tamper with"
    ran, unclear, accepted = [], [], []
    for where in positions:
        for name in (evil, "os"):
            found = attack(rv, [where], [name], marker, flat, tree)
            sys.modules.pop(evil, None)  # so that the next try would run its import again
            for into, new in zip((ran, unclear, accepted), found, strict=True):
                into += new
    assert not ran, report("made functorkit import a module named in the pickle", ran)
    assert not unclear, report("gave unclear errors", unclear)
    assert not accepted, report("naming a module that is no array namespace were accepted", accepted)


def test_every_field_tampered_with_other_values_is_an_unpickling_error(tmp_path: Path) -> None:
    # the campaign's fuzz: each int and str of the state replaced by out-of-range ints, other types
    # and odd strings; whatever comes out is a clear error, never IndexError/OverflowError/KeyError
    marker = tmp_path / "marker"
    tree = model()
    flat, re = fk.destructure(tree)
    rv = reduce_value(re)
    ints: list[Any] = [-1, 0, 1, 2, 3, 7, 100, 2**31, 2**63, -(2**63), 10**30, None, 1.5, (), [], True]
    strs: list[Any] = ["", "x", "numpy", "0", None, 1, (), []]
    ran, unclear = [], []
    for where, v in fields(rv):
        found = attack(rv, [where], ints if type(v) is int else strs, marker, flat, tree)
        ran += found[0]
        unclear += found[1]
    assert not ran, report("ran code", ran)
    assert not unclear, report("gave unclear errors", unclear)


def test_inconsistent_treedef_counts_are_unpickling_errors() -> None:
    # the counts of a pickled TreeDef are checked against its program before it is built
    _, td = fk.flatten({"a": np.ones(1), "b": [np.zeros(1), np.ones(2)]})
    fn, (state,) = td.__reduce__()
    prog, npos, nleaves, pos_leaf, trainable, forced = state
    for bad in (
        (prog, npos + 1, nleaves, pos_leaf, trainable, forced),  # more positions than the program has
        (prog, npos, nleaves + 1, pos_leaf, trainable, forced),
        (prog, npos, nleaves, (0,) * (npos + 1), trainable, forced),
        (prog, npos, nleaves, pos_leaf, (True,) * (nleaves + 3), forced),
        (prog, npos, nleaves, pos_leaf, trainable, [npos]),
        (prog[1:], npos, nleaves, pos_leaf, trainable, forced),  # the stack runs short
        ([*prog, None], npos + 1, nleaves + 1, pos_leaf, trainable, forced),  # two trees come out
    ):
        with pytest.raises(pickle.UnpicklingError):
            fn(bad)
    assert fn(state) == td
