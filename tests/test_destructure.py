"""fk.destructure and Restructure on every backend: SPEC sections 3 and 4 (policies in test_policy.py)."""

from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import functorkit as fk

from conftest import Backend, to_numpy
from helpers import ZOO_NAMES, Layer, Pair, Point, zoo

# compared by value: pytest's conftest module and the imported one are two modules (two Enum classes)
MUTABLE = {"numpy", "numpy_readonly", "torch", "array_api_strict", "cupy"}
IMMUTABLE = {"jax", "dask"}


def params_with_path(tree: Any) -> list[tuple[fk.KeyPath, Any]]:
    """The walk's own view of the parameters (fmap_with_path with trainable_only), in walk order."""
    out: list[tuple[fk.KeyPath, Any]] = []

    def f(path: fk.KeyPath, x: Any) -> Any:
        out.append((path, x))
        return x

    fk.fmap_with_path(f, tree, trainable_only=True)
    return out


def concat_np(arrays: list[Any]) -> np.ndarray:
    if not arrays:
        return np.zeros(0)
    return np.concatenate([to_numpy(a).reshape(-1) for a in arrays])


def assert_same_tree(a: Any, b: Any) -> None:
    """Same structure and node types (fmap raises on a mismatch) and equal leaf values."""

    def check(x: Any, y: Any) -> None:
        assert type(x) is type(y) or (hasattr(x, "shape") and hasattr(y, "shape"))
        if hasattr(x, "shape") and not isinstance(x, (int, float)):
            np.testing.assert_array_equal(to_numpy(x), to_numpy(y))
        else:
            assert x == y or (x is None and y is None)

    fk.fmap(check, a, b, cache=False)
    assert leaf_paths(a) == leaf_paths(b)


def leaf_paths(tree: Any) -> list[str]:
    return [str(p) for p, _ in fk.leaves_with_path(tree)]


def mutate(p: Any, backend: Backend, xp: Any) -> Any:
    """Write 100.0 into p[0] in place (mutable backends); returns p."""
    if backend.value in ("numpy", "numpy_readonly"):
        p[0] = 100.0
    elif backend.value == "torch":
        import torch

        with torch.no_grad():
            p[0] = 100.0
    else:
        p[0] = xp.asarray(100.0, dtype=p.dtype, device=p.device)
    return p


# --------------------------------------------------------------------------- round trip over the zoo


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_round_trip_zoo(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    expected = params_with_path(tree)
    flat, re = fk.destructure(tree)
    assert [str(p) for p in re.paths] == [str(p) for p, _ in expected]
    assert flat.ndim == 1
    assert len(re) == flat.shape[0] == sum(int(np.prod(x.shape)) for _, x in expected)
    np.testing.assert_array_equal(to_numpy(flat), concat_np([x for _, x in expected]))
    out = re(flat)
    assert type(out) is type(tree)
    assert_same_tree(tree, out)


def test_walk_order_and_types_kept(xp: Any) -> None:
    tree = zoo(xp)["nested"]
    flat, re = fk.destructure(tree)
    assert [str(p) for p in re.paths] == [
        "layers[0].weight",
        "layers[0].bias",
        "layers[1].weight",
        "layers[1].bias",
        "head[0]",
        "head[1].x",
    ]
    out = re(flat * 2)
    assert isinstance(out["layers"][0], Layer)
    assert out["layers"][0].name == "layer"
    assert isinstance(out["head"], tuple)
    assert isinstance(out["head"][1], Point)
    assert out["head"][1].y == 7  # a Python scalar: a constant
    np.testing.assert_array_equal(to_numpy(out["layers"][1].bias), [8.0])


def test_ties_counted_once_and_rebuilt_tied(xp: Any) -> None:
    tree = zoo(xp)["shared_leaf"]
    flat, re = fk.destructure(tree)
    assert len(re) == 3
    assert [str(p) for p in re.paths] == ["a", "b[1]"]
    out = re(flat)
    assert out["a"] is out["b"][0]
    np.testing.assert_array_equal(to_numpy(out["b"][1]), [9.0])


def test_shared_subtree_rebuilt_shared(xp: Any) -> None:
    tree = zoo(xp)["shared_subtree"]
    flat, re = fk.destructure(tree)
    assert len(re) == 2
    out = re(flat)
    assert out["enc"] is out["dec"]
    np.testing.assert_array_equal(to_numpy(out["dec"]["b"]), [4.0])


def test_constants_carried_unchanged(xp: Any) -> None:
    tree = zoo(xp)["int_arrays"]
    tree["cfg"] = {"lr": 0.1, "act": "relu", "fn": len}
    flat, re = fk.destructure(tree)
    assert [str(p) for p in re.paths] == ["w"]
    out = re(flat)
    assert out["idx"] is tree["idx"]
    assert out["mask"] is tree["mask"]
    assert out["cfg"]["fn"] is len
    assert out["cfg"]["act"] == "relu"
    assert out["cfg"]["lr"] == 0.1


def test_trainable_declared_by_node(xp: Any) -> None:
    class Partial:
        def __init__(self, w: Any, stats: Any) -> None:
            self.w, self.stats = w, stats

    fk.register(
        Partial,
        children=lambda x: ({"w": x.w, "stats": x.stats}, None),
        rebuild=lambda aux, ch: Partial(ch["w"], ch["stats"]),
        trainable=lambda x: ["w"],
    )
    stats = xp.asarray([5.0, 6.0])
    tree = [Partial(xp.asarray([1.0]), stats)]
    flat, re = fk.destructure(tree)
    assert [str(p) for p in re.paths] == ["[0].w"]
    out = re(flat)
    assert isinstance(out[0], Partial)
    assert out[0].stats is stats


def test_root_leaf_and_scalar_shapes(xp: Any) -> None:
    x = xp.asarray([[1.0, 2.0], [3.0, 4.0]])
    flat, re = fk.destructure(x)
    assert [str(p) for p in re.paths] == [""]
    assert re.shapes == ((2, 2),)
    np.testing.assert_array_equal(to_numpy(re(flat)), to_numpy(x))
    tree = {"s": xp.asarray(3.0), "z": xp.zeros((0, 4)), "v": xp.asarray([1.0, 2.0])}
    flat, re = fk.destructure(tree)
    assert re.shapes == ((), (0, 4), (2,))
    assert len(re) == 3
    out = re(flat)
    assert tuple(out["s"].shape) == ()
    assert tuple(out["z"].shape) == (0, 4)
    assert float(to_numpy(out["s"])) == 3.0


def test_non_string_keys(xp: Any) -> None:
    tree = {("a", 1): xp.asarray([1.0]), 2.5: xp.asarray([2.0]), None: xp.asarray([3.0]), "x y": xp.asarray([4.0])}
    flat, re = fk.destructure(tree)
    out = re(flat)
    assert list(out) == list(tree)
    np.testing.assert_array_equal(concat_np(list(out.values())), [1.0, 2.0, 3.0, 4.0])


def test_containers_other_than_dict(xp: Any) -> None:
    dd: collections.defaultdict[str, Any] = collections.defaultdict(int, a=xp.asarray([1.0]))
    tree = (collections.OrderedDict(b=xp.asarray([2.0])), dd, Pair(xp.asarray([3.0]), [xp.asarray([4.0])], "t"))
    flat, re = fk.destructure(tree)
    out = re(flat)
    assert type(out[0]) is collections.OrderedDict
    assert type(out[1]) is collections.defaultdict
    assert out[1].default_factory is int
    assert out[2].tag == "t"
    np.testing.assert_array_equal(to_numpy(out[2].right[0]), [4.0])


# --------------------------------------------------------------------------- flat is new; views of p


def test_flat_is_new_array(xp: Any, backend: Backend) -> None:
    tree = {"a": xp.asarray([1.0, 2.0]), "b": xp.asarray([3.0])}
    flat, _ = fk.destructure(tree)
    single, _ = fk.destructure({"only": tree["a"]})
    if backend.value in MUTABLE:
        mutate(flat, backend, xp)
        mutate(single, backend, xp)
    np.testing.assert_array_equal(to_numpy(tree["a"]), [1.0, 2.0])


def test_readonly_model_is_never_written(xp: Any, backend: Backend) -> None:
    if backend.value != "numpy_readonly":
        pytest.skip("the read-only backend proves no writes")
    tree = {"a": xp.asarray([1.0, 2.0]), "b": [xp.asarray([[3.0]])]}
    assert not tree["a"].flags.writeable
    flat, re = fk.destructure(tree)
    np.testing.assert_array_equal(re.flatten(tree), flat)
    out = re(xp.asarray([5.0, 6.0, 7.0]))
    assert not out["a"].flags.writeable  # views of the read-only p


def test_re_gives_views_of_p(xp: Any, backend: Backend) -> None:
    tree = {"w": xp.asarray([[1.0, 2.0], [3.0, 4.0]]), "b": xp.asarray([5.0])}
    flat, re = fk.destructure(tree)
    if backend.value == "numpy_readonly":
        flat = np.array(flat)  # a writable p
    out = re(flat)
    if backend.value not in MUTABLE:
        pytest.skip("immutable backend: 'view' means 'no conversion' (checked by test_policy)")
    mutate(flat, backend, xp)
    assert float(to_numpy(out["w"])[0, 0]) == 100.0


def test_copy_true_always_copies(xp: Any, backend: Backend) -> None:
    tree = {"w": xp.asarray([[1.0, 2.0], [3.0, 4.0]]), "b": xp.asarray([5.0])}
    flat, re = fk.destructure(tree)
    out = re(flat, copy=True)
    np.testing.assert_array_equal(to_numpy(out["w"]), [[1.0, 2.0], [3.0, 4.0]])
    assert all(r.how == "copy" for r in re.explain(flat, copy=True))
    if backend.value in MUTABLE:
        mutate(flat, backend, xp)
        assert float(to_numpy(out["w"])[0, 0]) == 1.0


def test_copy_false_without_conversion_is_fine(xp: Any) -> None:
    tree = {"w": xp.asarray([1.0, 2.0])}
    flat, re = fk.destructure(tree)
    np.testing.assert_array_equal(to_numpy(re(flat, copy=False)["w"]), [1.0, 2.0])


def test_copy_must_be_none_true_false(xp: Any) -> None:
    flat, re = fk.destructure({"w": xp.asarray([1.0])})
    with pytest.raises(TypeError, match="copy"):  # a wrong type: TypeError (the catalogue's rule)
        re(flat, copy="yes")  # type: ignore[arg-type]


def test_non_contiguous_p(xp: Any, backend: Backend) -> None:
    big = xp.asarray([float(i) for i in range(10)])
    p = big[::2]  # stride 2
    _flat, re = fk.destructure({"w": xp.zeros((2, 2)), "b": xp.zeros(1)})
    out = re(p)
    np.testing.assert_array_equal(to_numpy(out["w"]), [[0.0, 2.0], [4.0, 6.0]])
    np.testing.assert_array_equal(to_numpy(out["b"]), [8.0])


# --------------------------------------------------------------------------- bad input


def test_wrong_length_rank_type(xp: Any) -> None:
    flat, re = fk.destructure({"w": xp.asarray([1.0, 2.0]), "b": xp.asarray([3.0])})
    with pytest.raises(ValueError, match="expected length 3, got 4"):
        re(xp.asarray([1.0, 2.0, 3.0, 4.0]))
    with pytest.raises(ValueError, match=r"expected length 3, got an array of shape \(1, 3\)"):
        re(xp.reshape(flat, (1, 3)))
    with pytest.raises(TypeError, match="expected a 1-D array of length 3, got list"):
        re([1.0, 2.0, 3.0])
    with pytest.raises(TypeError, match="floating or complex"):
        re(xp.asarray([1, 2, 3]))


def test_unknown_policy(xp: Any) -> None:
    tree = {"w": xp.asarray([1.0])}
    with pytest.raises(ValueError, match="'strict', 'model' or 'flat'"):
        fk.destructure(tree, policy="loose")
    flat, re = fk.destructure(tree)
    with pytest.raises(ValueError, match="'strict', 'model' or 'flat'"):
        re(flat, policy="loose")
    with pytest.raises(ValueError, match="'strict', 'model' or 'flat'"):
        re.explain(flat, policy="STRICT")


def test_cycle_raises(xp: Any) -> None:
    tree: dict[str, Any] = {"w": xp.asarray([1.0]), "sub": []}
    tree["sub"].append(tree)
    with pytest.raises(fk.StructureError, match=r"at sub\[0\]: found a cycle"):
        fk.destructure(tree)


def test_restructure_not_constructible() -> None:
    with pytest.raises(TypeError, match=r"fk.destructure"):
        fk.Restructure()


# --------------------------------------------------------------------------- empty models


def test_empty_model_numpy_float64_and_any_empty_p(xp: Any) -> None:
    tree = {"a": [], "b": {"lr": 0.1}}
    flat, re = fk.destructure(tree)
    assert isinstance(flat, np.ndarray)
    assert flat.dtype == np.float64
    assert flat.shape == (0,)
    assert len(re) == 0
    assert re.paths == ()
    assert re.dtype == np.float64
    out = re(flat)
    assert out == tree
    assert out is not tree
    assert re(xp.asarray([], dtype=xp.int64)) == tree  # any empty 1-D array
    assert re(xp.asarray([], dtype=xp.float32), policy="strict") == tree
    with pytest.raises(ValueError, match="expected length 0, got 1"):
        re(xp.asarray([1.0]))
    assert str(re.explain(flat)).endswith("(no parameters)")


def test_model_with_only_constant_arrays(xp: Any, backend: Backend) -> None:
    idx = xp.asarray([1, 2])
    tree = {"idx": idx}
    flat, re = fk.destructure(tree)
    assert flat.shape == (0,)
    assert type(flat) is type(idx)
    assert re(flat)["idx"] is idx
    for policy in ("strict", "model", "flat"):  # any empty 1-D array, under every policy
        _, re_p = fk.destructure(tree, policy=policy)
        assert re_p(flat)["idx"] is idx
        assert re_p(xp.asarray([], dtype=xp.float32))["idx"] is idx


# --------------------------------------------------------------------------- memory sharing


def test_two_params_sharing_memory_raise(xp: Any, backend: Backend) -> None:
    if backend.value in IMMUTABLE:
        pytest.skip("immutable arrays cannot alias")
    a = xp.reshape(xp.asarray([1.0, 2.0, 3.0, 4.0]), (2, 2))
    t = a.T if hasattr(a, "T") else xp.permute_dims(a, (1, 0))
    with pytest.raises(fk.StructureError, match=r"at a and t: two different arrays share memory"):
        fk.destructure({"a": a, "t": t})


def test_interleaved_views_are_not_aliases(xp: Any, backend: Backend) -> None:
    base = xp.asarray([1.0, 2.0, 3.0, 4.0])
    flat, _re = fk.destructure({"even": base[::2], "odd": base[1::2]})
    np.testing.assert_array_equal(to_numpy(flat), [1.0, 3.0, 2.0, 4.0])


# --------------------------------------------------------------------------- explain


def test_explain_rows_and_text(xp: Any) -> None:
    tree = {"w": xp.asarray([[1.0, 2.0]]), "b": xp.asarray([3.0])}
    flat, re = fk.destructure(tree)
    ex = re.explain(flat)
    assert [str(r.path) for r in ex.rows] == ["w", "b"]
    assert len(ex) == 2
    assert ex.ok
    r = ex.rows[0]
    assert r.shape == (1, 2)
    assert r.how == "view"
    assert r.error is None
    assert r.model_dtype == flat.dtype
    assert r.result_dtype == flat.dtype
    text = str(ex)
    assert text.splitlines()[1].split() == ["path", "shape", "model", "result", "how", "rule"]
    assert "w" in text
    assert "view" in text
    assert "strict" in text


def test_explain_never_raises_for_policy_problems(xp: Any) -> None:
    tree = {"w": xp.asarray([1.0, 2.0], dtype=xp.float32)}
    _flat, re = fk.destructure(tree)
    p = xp.asarray([1.0, 2.0], dtype=xp.float64)
    ex = re.explain(p)
    assert not ex.ok
    assert ex.rows[0].how == "error"
    assert isinstance(ex.rows[0].error, fk.PolicyError)
    with pytest.raises(fk.PolicyError) as info:
        re(p)
    assert str(info.value) == str(ex.rows[0].error)
    assert "PolicyError: at w:" in str(ex)
    ex = re.explain(p, policy="model", copy=False)
    assert ex.rows[0].how == "error"
    assert isinstance(ex.rows[0].error, ValueError)
    with pytest.raises(ValueError, match="length"):
        re.explain(xp.asarray([1.0]))


# --------------------------------------------------------------------------- re.flatten


def test_flatten_same_structure(xp: Any) -> None:
    tree = zoo(xp)["nested"]
    flat, re = fk.destructure(tree)
    np.testing.assert_array_equal(to_numpy(re.flatten(tree)), to_numpy(flat))
    other = re(flat * 3)
    np.testing.assert_array_equal(to_numpy(re.flatten(other)), to_numpy(flat) * 3)


def test_flatten_reordered_dict_keys(xp: Any) -> None:
    _flat, re = fk.destructure({"a": xp.asarray([1.0]), "b": xp.asarray([2.0])})
    np.testing.assert_array_equal(to_numpy(re.flatten({"b": xp.asarray([5.0]), "a": xp.asarray([4.0])})), [4.0, 5.0])


def test_flatten_out(xp: Any, backend: Backend) -> None:
    tree = {"w": xp.asarray([[1.0, 2.0]], dtype=xp.float64), "b": xp.asarray([3.0], dtype=xp.float64)}
    flat, re = fk.destructure(tree)
    if backend.value in IMMUTABLE:
        with pytest.raises(TypeError, match="immutable"):
            re.flatten(tree, out=flat)
        return
    out = xp.zeros(3, dtype=xp.float64) if backend.value != "numpy_readonly" else np.zeros(3)
    assert re.flatten(tree, out=out) is out
    np.testing.assert_array_equal(to_numpy(out), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="length 3"):
        re.flatten(tree, out=xp.zeros(4, dtype=xp.float64))
    with pytest.raises(TypeError, match="dtype"):
        re.flatten(tree, out=xp.zeros(3, dtype=xp.float32))
    with pytest.raises(TypeError, match="must be a 1-D array"):
        re.flatten(tree, out=[0.0, 0.0, 0.0])
    if backend.value == "numpy_readonly":
        with pytest.raises(ValueError, match="read-only"):
            re.flatten(tree, out=xp.zeros(3))


def test_flatten_structure_errors(xp: Any) -> None:
    w = xp.asarray([1.0, 2.0])
    tree = {"layers": [{"w": w, "b": xp.asarray([0.0])}], "tied": w}
    _flat, re = fk.destructure(tree)
    with pytest.raises(fk.StructureError, match=r"at layers\[0\]: re.flatten expected dict keys \{'w', 'b'\}"):
        re.flatten({"layers": [{"w": w}], "tied": w})
    with pytest.raises(fk.StructureError, match=r"at layers: re.flatten expected list of length 1"):
        re.flatten({"layers": [], "tied": w})
    with pytest.raises(fk.StructureError, match=r"at layers\[0\].w: .*shape \(2,\)"):
        re.flatten({"layers": [{"w": xp.asarray([1.0]), "b": xp.asarray([0.0])}], "tied": w})
    with pytest.raises(fk.StructureError, match=r"at tied: .*tied"):
        re.flatten({"layers": [{"w": w, "b": xp.asarray([0.0])}], "tied": xp.asarray([1.0, 2.0])})
    with pytest.raises(fk.StructureError, match=r"at layers\[0\].b: .*leaf"):
        re.flatten({"layers": [{"w": w, "b": [xp.asarray([0.0])]}], "tied": w})


# --------------------------------------------------------------------------- pickling


def test_pickle_round_trip(xp: Any) -> None:
    tree = zoo(xp)
    flat, re = fk.destructure(tree)
    re2 = pickle.loads(pickle.dumps(re))
    assert len(re2) == len(re)
    assert re2.paths == re.paths
    assert re2.policy == re.policy
    assert repr(re2) == repr(re)
    out = re2(flat)
    assert_same_tree(tree, out)
    assert out["shared_leaf"]["a"] is out["shared_leaf"]["b"][0]
    assert out["shared_subtree"]["enc"] is out["shared_subtree"]["dec"]


# --------------------------------------------------------------------------- depth and size


def test_depth_10000(xp: Any) -> None:
    depth = 10_000
    tree: Any = {"w": xp.asarray([1.0, 2.0])}
    for i in range(depth):
        tree = {"n": tree, "b": xp.asarray([float(i)])} if i % 1000 == 0 else [tree]
    flat, re = fk.destructure(tree)
    assert len(re) == 2 + depth // 1000
    out = re(flat)
    np.testing.assert_array_equal(to_numpy(re.flatten(out)), to_numpy(flat))
    assert len(re.paths[0]) == depth + 1
    assert re.paths[0][-1] == "w"
    out2 = pickle.loads(pickle.dumps(re))(flat)
    np.testing.assert_array_equal(to_numpy(re.flatten(out2)), to_numpy(flat))


def test_wide_model_uses_the_generic_program(xp: Any, backend: Backend) -> None:
    if backend.value == "dask":
        pytest.skip("5000 lazy arrays: slow to build, nothing new")
    n = 5000
    shared = {"s": xp.asarray([7.0])}
    tree = {"xs": [xp.asarray([float(i)]) for i in range(n)], "a": shared, "b": shared}
    flat, re = fk.destructure(tree)
    out = re(flat)
    assert out["a"] is out["b"]
    assert len(out["xs"]) == n
    np.testing.assert_array_equal(to_numpy(out["xs"][4321]), [4321.0])


def test_dataclass_rebuilt_without_init(xp: Any) -> None:
    @dataclasses.dataclass
    class Checked:
        w: Any

        def __post_init__(self) -> None:
            raise AssertionError("rebuild must not call __init__")

    obj = object.__new__(Checked)
    obj.w = xp.asarray([1.0, 2.0])
    flat, re = fk.destructure({"m": obj})
    out = re(flat)
    assert type(out["m"]) is Checked


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_flatten_zoo_equals_destructure(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    flat, re = fk.destructure(tree)
    np.testing.assert_array_equal(to_numpy(re.flatten(tree)), to_numpy(flat))
    np.testing.assert_array_equal(to_numpy(re.flatten(re(flat))), to_numpy(flat))  # the rebuilt model too


def test_flatten_rejects_changed_ties_and_nodes(xp: Any) -> None:
    a, b = xp.asarray([1.0]), xp.asarray([2.0])
    sub = {"s": xp.asarray([3.0])}
    tree = {"a": a, "b": b, "c": 5, "enc": sub, "dec": sub}
    _, re = fk.destructure(tree)
    np.testing.assert_array_equal(to_numpy(re.flatten(dict(tree, a=xp.asarray([7.0])))), [7.0, 2.0, 3.0])
    with pytest.raises(fk.StructureError, match=r"at b: .*distinct"):
        re.flatten(dict(tree, b=a))
    with pytest.raises(fk.StructureError, match=r"at c: re.flatten expected a leaf, found dict"):
        re.flatten(dict(tree, c={"x": 1}))
    with pytest.raises(fk.StructureError, match=r"at dec: .*shared"):
        re.flatten(dict(tree, dec={"s": xp.asarray([3.0])}))
    with pytest.raises(fk.StructureError, match=r"at a: .*floating or complex array"):
        re.flatten(dict(tree, a=xp.asarray([1])))


def test_flatten_converts_under_model_policy(xp: Any) -> None:
    tree = {"w": xp.asarray([1.0, 2.0], dtype=xp.float64)}
    _, re = fk.destructure(tree)
    other = {"w": xp.asarray([3.0, 4.0], dtype=xp.float32)}
    with pytest.raises(fk.PolicyError, match=r"at w: re.flatten under policy='strict'"):
        re.flatten(other)
    out = re.flatten(other, policy="model")
    assert out.dtype == xp.float64
    np.testing.assert_array_equal(to_numpy(out), [3.0, 4.0])
    with pytest.raises(fk.PolicyError, match=r"at w: .*complex"):
        re.flatten({"w": xp.asarray([1j, 2.0], dtype=xp.complex128)}, policy="model")


def test_alias_of_view_and_owner_detected(xp: Any, backend: Backend) -> None:
    if backend.value in IMMUTABLE:
        pytest.skip("immutable arrays cannot alias")
    base = xp.asarray([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(fk.StructureError, match=r"at owner and view: "):
        fk.destructure({"owner": base, "view": base[1:3]})


def test_rebuilders_whose_constants_differ_in_sign_only_are_not_equal(xp: Any) -> None:
    # 0.0 == -0.0, but a model built with one is not the other (1 / c differs): equal rebuilders share
    # one jax.jit cache entry, so they must rebuild alike
    w = xp.asarray(np.ones(2))
    for pos, neg in ((0.0, -0.0), (complex(0.0, 1.0), complex(-0.0, 1.0)), (complex(1.0, 0.0), complex(1.0, -0.0))):
        _, re_pos = fk.destructure({"w": w, "c": pos})
        _, re_neg = fk.destructure({"w": w, "c": neg})
        assert re_pos != re_neg
        assert re_pos == fk.destructure({"w": w, "c": pos})[1]
    _, a = fk.destructure({"w": w, "c": 1})
    _, b = fk.destructure({"w": w, "c": 1.0})
    assert a != b  # (types apart, as before)
