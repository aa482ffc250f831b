"""TreeDef.to_json / fk.TreeDef.from_json (SPEC section 16): data only, allow-listed classes,
round trips equal, hostile documents refused clearly."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pytest

import functorkit as fk

from helpers import ZOO_NAMES, Frozen, Layer, Pair, Point, Seq, zoo

_ALLOWED = [Point, Layer, Frozen, Pair, Seq]


@pytest.mark.parametrize("name", [n for n in ZOO_NAMES if n != "defaultdict"])
def test_round_trip_of_the_zoo(xp: Any, name: str) -> None:
    _, td = fk.flatten(zoo(xp)[name])
    text = td.to_json()
    json.loads(text)  # plain JSON
    back = fk.TreeDef.from_json(text, classes=_ALLOWED)
    assert back == td
    assert hash(back) == hash(td)
    assert [str(p) for p in back.paths] == [str(p) for p in td.paths]
    assert back.trainable == td.trainable


def test_ties_shared_sub_trees_and_rebuilding() -> None:
    w = np.ones(2)
    sub = {"w": w, "b": np.zeros(1)}
    tree = {"enc": sub, "dec": sub, "tied": w, "t": (1, "relu", None, 2.5, True)}
    leaves, td = fk.flatten(tree)
    back = fk.TreeDef.from_json(td.to_json())
    assert back == td
    out = back.unflatten([x * 2 if isinstance(x, np.ndarray) else x for x in leaves])
    assert out["enc"] is out["dec"]
    assert out["tied"] is out["enc"]["w"]
    assert out["t"] == (1, "relu", None, 2.5, True)
    _, other = fk.flatten({"enc": dict(sub), "dec": dict(sub), "tied": w, "t": (1, "relu", None, 2.5, True)})
    assert fk.TreeDef.from_json(other.to_json()) != td


def test_a_restructure_structure_persisted_beside_its_flat_vector(tmp_path: Any) -> None:
    model = [Layer(np.ones((2, 2)), np.zeros(2)), Point(np.ones(1), 3)]
    flat, _re = fk.destructure(model)
    _, td = fk.flatten(model)
    (tmp_path / "structure.json").write_text(td.to_json())
    np.save(tmp_path / "flat.npy", flat)
    td2 = fk.TreeDef.from_json(
        (tmp_path / "structure.json").read_text(),
        classes={f"{Layer.__module__}.Layer": Layer, f"{Point.__module__}.Point": Point},
    )
    assert td2 == td
    assert [str(p) for p in td2.paths] == [str(p) for p in td.paths]


def test_classes_only_from_the_allow_list() -> None:
    _, td = fk.flatten([Layer(np.ones(1), np.ones(1))])
    text = td.to_json()
    own = rf"{re.escape(Layer.__module__)}\.Layer.*neither one of functorkit's own.*never imported"
    with pytest.raises(ValueError, match=own):
        fk.TreeDef.from_json(text)
    assert fk.TreeDef.from_json(text, classes={f"{Layer.__module__}.Layer": Layer}) == td
    # a name mapped to another class is that class: the document cannot choose what is loaded
    with pytest.raises(ValueError, match=r"'os\.system' is neither"):
        fk.TreeDef.from_json(text.replace(f"{Layer.__module__}.Layer", "os.system"), classes=[Layer])
    with pytest.raises(TypeError, match="classes"):
        fk.TreeDef.from_json(text, classes=Layer)


def test_aux_data_that_is_not_json_names_the_path() -> None:
    torch = pytest.importorskip("torch")
    _, td = fk.flatten({"net": torch.nn.Linear(2, 2)})
    with pytest.raises(TypeError, match=r"at net: TreeDef.to_json: .*Linear node holds"):
        td.to_json()
    _, td2 = fk.flatten({"p": Pair(np.ones(1), np.ones(1), tag=float("nan"))})
    with pytest.raises(TypeError, match=r"at p: .*NaN or infinity"):
        td2.to_json()


def _doc() -> dict[str, Any]:
    _, td = fk.flatten({"a": np.ones(1), "b": [np.ones(1), (1, 2)]})
    doc: dict[str, Any] = json.loads(td.to_json())
    return doc


def _nested(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _hostile() -> list[Any]:
    out: list[Any] = ["", "nul", "[]", "1" * 5000, "[" * 100_000, json.dumps({"format": "x"})]
    for field, value in [
        ("version", 99),
        ("positions", 10**30),
        ("positions", -1),
        ("positions", "3"),
        ("leaves", 7),
        ("ties", [0, 0, 5, 1]),
        ("ties", [1, 0, 2, 3]),
        ("trainable", [True]),
        ("forced", [100]),
        ("program", {}),
        ("program", []),
        ("program", [{"ref": 0}]),
        ("program", [None, None, {"ref": 1}]),
        ("program", [{"node": "dict", "keys": ["a"], "n": 10**9, "leafy": True, "aux": None, "named": True}]),
        ("program", [{"node": "builtins.eval", "keys": None, "n": 0, "leafy": True, "aux": None, "named": False}]),
        ("program", [{"node": "list", "keys": None, "n": 3, "leafy": False, "aux": None, "named": False}]),
        ("program", [{"node": "list", "keys": None, "n": 0, "leafy": "yes", "aux": None, "named": False}]),
        ("program", [{"node": "list", "keys": None, "n": 0, "leafy": True, "aux": {"set": [1]}, "named": False}]),
        (
            "program",
            [
                {
                    "node": "list",
                    "keys": None,
                    "n": 0,
                    "leafy": True,
                    "aux": [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                                                1
                                                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ],
                    "named": False,
                }
            ],
        ),
        ("extra", 1),
    ]:
        d = _doc()
        d[field] = value
        out.append(json.dumps(d))
    d = _doc()
    del d["ties"]
    out.append(json.dumps(d))
    return out


@pytest.mark.parametrize("text", _hostile(), ids=lambda t: t[:40])
def test_hostile_documents_are_clear_value_errors(text: str) -> None:
    with pytest.raises(ValueError, match=r"fk\.TreeDef\.from_json"):
        fk.TreeDef.from_json(text)


def test_wrong_argument_type() -> None:
    with pytest.raises(TypeError, match="expected a str"):
        fk.TreeDef.from_json({"format": "functorkit.treedef"})


def test_a_defaultdict_factory_is_not_data() -> None:
    _, td = fk.flatten(zoo(np)["defaultdict"])
    with pytest.raises(TypeError, match=r"at <root>: .*defaultdict node holds a builtins.type"):
        td.to_json()


def test_a_mapping_proxy_node_pickles_and_round_trips_through_json(xp: Any) -> None:
    # mappingproxy is one of functorkit's own nodes, but pickle cannot name its class
    # (builtins.mappingproxy): a definition and a rebuilder holding one pickled only by name
    import pickle
    import types

    model = {"cfg": types.MappingProxyType({"w": xp.asarray(np.ones(2)), "n": 3})}
    td = fk.flatten(model)[1]
    assert pickle.loads(pickle.dumps(td)) == td
    assert fk.TreeDef.from_json(td.to_json()) == td  # (from functorkit's own table, no classes=)
    flat, re = fk.destructure(model)
    back = pickle.loads(pickle.dumps(re))(flat)
    assert type(back["cfg"]) is types.MappingProxyType
    assert back["cfg"]["n"] == 3


def _edited(tree: Any, edit: Any, **counts: int) -> str:
    """`tree`'s document with its first program entry changed by `edit` (and the counts given)."""
    d = json.loads(fk.flatten(tree)[1].to_json())
    edit(d["program"][0])
    d.update(counts)
    return json.dumps(d)


def _entry_cases(xp: Any) -> list[tuple[str, Any, Any, dict[str, int]]]:
    import collections
    import types

    import attrs

    @attrs.frozen
    class A:
        w: Any
        tag: str = attrs.field(default="t", metadata={"static": True})

    one = xp.asarray([1.0])
    return [
        # a namedtuple's fields swapped (its paths were swapped, its values not)
        ("namedtuple", Point(one, one), lambda e: e.update(keys=["y", "x"]), {}),
        ("namedtuple", Point(one, one), lambda e: e.update(keys=["a", "b"]), {}),
        # a dataclass given an attribute that is not its field (the rebuilt object lacked the field)
        ("dataclass", Layer(one, one), lambda e: e.update(keys=["w", "bias"]), {}),
        ("dataclass", Layer(one, one), lambda e: e.update(keys=["__class__", "b"]), {}),
        ("dataclass aux", Layer(one, one), lambda e: e.update(aux=5), {}),
        (
            "dataclass extra",
            Layer(one, one),
            lambda e: e.update(aux={"tuple": [[{"tuple": ["name", "d"]}], [{"tuple": ["__class__", 1]}]]}),
            {},
        ),
        ("attrs", A(one), lambda e: e.update(keys=["v"]), {}),
        # a deque whose maxlen drops items on rebuild (silently), or is no maxlen at all (raw error)
        ("deque", collections.deque([one, one], maxlen=4), lambda e: e.update(aux=1), {}),
        ("deque", collections.deque([one], maxlen=4), lambda e: e.update(aux="x"), {}),
        ("deque", collections.deque([one], maxlen=4), lambda e: e.update(aux=-1), {}),
        # a mapping without keys, a sequence with names (paths the rebuild does not have)
        ("dict", {"a": one}, lambda e: e.update(keys=None, named=False), {}),
        ("dict", {"a": one, "b": one}, lambda e: e.update(keys=["a", "a"]), {}),
        ("list", [one, one], lambda e: e.update(keys=["x", "y"], named=True), {}),
        ("tuple", (one, one), lambda e: e.update(aux=3), {}),
        ("namespace", types.SimpleNamespace(a=one), lambda e: e.update(keys=[1]), {}),
        ("mappingproxy", types.MappingProxyType({"a": one}), lambda e: e.update(named=False), {}),
        ("userdict", collections.UserDict(a=one), lambda e: e.update(aux=[1]), {}),
        ("userlist", collections.UserList([one]), lambda e: e.update(keys=["k"]), {}),
        # the wrappers' rebuild reads their one key (a raw KeyError before)
        ("transpose", fk.Transpose(xp.ones((2, 2))), lambda e: e.update(keys=["evil"]), {}),
        ("diagonal", fk.Diagonal(xp.ones(2)), lambda e: e.update(keys=[], n=0), {"positions": 0, "leaves": 0}),
        # a registered class's entry of the wrong form (mapping children recorded as a sequence)
        ("registered", Pair(one, one, tag="t"), lambda e: e.update(named=False, keys=None), {}),
        ("registered", Seq(one, one), lambda e: e.update(aux=None), {}),
    ]


def test_an_entry_its_class_cannot_make_is_refused(xp: Any) -> None:
    """from_json checked a document's form but not each node entry against its class: a document
    naming a namedtuple's fields in another order, a dataclass with a key that is not its field, a
    deque whose maxlen is below its length, a list with names... was accepted, and the rebuild then
    raised a raw error (KeyError, AttributeError, TypeError) or silently made another object."""
    for what, tree, edit, counts in _entry_cases(xp):
        allowed = [*_ALLOWED, type(tree)]
        text = _edited(tree, edit, **counts)
        refused = r"fk\.TreeDef\.from_json: program entry 0: .* node that this class cannot make"
        with pytest.raises(ValueError, match=refused):
            fk.TreeDef.from_json(text, classes=allowed)
        # the unedited document still reads back, and rebuilds
        td = fk.flatten(tree)[1]
        back = fk.TreeDef.from_json(td.to_json(), classes=allowed)
        assert back == td, what
        leaves = fk.leaves(tree)
        assert fk.flatten(back.unflatten(leaves))[1] == td, what
