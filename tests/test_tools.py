"""The tree tools (SPEC section 10): replace, partition/combine, stack/unstack, summary, on every backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import Backend, to_numpy


def _arr(xp: Any, *vals: float, device: Any = None) -> Any:
    if device is None:
        return xp.asarray(list(vals), dtype=xp.float64)
    return xp.asarray(list(vals), dtype=xp.float64, device=device)


def _model(xp: Any) -> dict[str, Any]:
    """Two tied arrays, a shared sub-tree, a scalar config, an integer array."""
    w = _arr(xp, 1.0, 2.0)
    sub = {"w": _arr(xp, 3.0), "scale": 2.0}
    return {
        "enc": {"layers": [{"w": w, "b": _arr(xp, 0.5)}], "block": sub},
        "dec": {"block": sub, "head": w},
        "steps": xp.asarray([3]),
        "lr": 0.1,
    }


def _same(a: Any, b: Any) -> bool:
    return bool(np.array_equal(to_numpy(a), to_numpy(b)))


# ------------------------------------------------------------------------------ replace


def test_replace_leaf_all_path_forms(xp: Any) -> None:
    m = _model(xp)
    new_b = _arr(xp, 9.0)
    for path in ("enc.layers[0].b", "enc.layers.0.b", fk.KeyPath(("enc", "layers", 0, "b")), ("enc", "layers", 0, "b")):
        out = fk.replace(m, {path: new_b})
        assert out["enc"]["layers"][0]["b"] is new_b
        assert out["enc"]["layers"][0]["w"] is m["enc"]["layers"][0]["w"]  # unchanged leaves: same objects
        assert out["steps"] is m["steps"]
        assert out["enc"]["layers"][0] is not m["enc"]["layers"][0]  # nodes are new
        assert m["enc"]["layers"][0]["b"] is not new_b  # input unchanged


def test_replace_tied_leaf_everywhere(xp: Any) -> None:
    m = _model(xp)
    old = m["dec"]["head"]
    new = _arr(xp, 7.0, 8.0)
    out = fk.replace(m, {"dec.head": new})  # the second place of the tie
    assert out["enc"]["layers"][0]["w"] is new
    assert out["dec"]["head"] is new
    assert m["enc"]["layers"][0]["w"] is old
    assert m["dec"]["head"] is old
    assert _same(old, _arr(xp, 1.0, 2.0))
    # naming both places with one object is fine; with two objects it is an error
    assert fk.replace(m, {"dec.head": new, "enc.layers.0.w": new})["dec"]["head"] is new
    with pytest.raises(fk.StructureError, match=r"dec\.head.*tied|tied.*dec\.head"):
        fk.replace(m, {"dec.head": new, "enc.layers.0.w": _arr(xp, 0.0, 0.0)})


def test_replace_in_a_shared_subtree_keeps_it_shared(xp: Any) -> None:
    m = _model(xp)
    new = _arr(xp, 5.0)
    out = fk.replace(m, {"dec.block.w": new})  # a path through the second place of the shared sub-tree
    assert out["enc"]["block"] is out["dec"]["block"]
    assert out["enc"]["block"]["w"] is new
    assert out["enc"]["block"] is not m["enc"]["block"]
    assert m["enc"]["block"]["w"] is not new


def test_replace_a_subtree(xp: Any) -> None:
    m = _model(xp)
    out = fk.replace(m, {"enc.layers[0]": {"w": None}})
    assert out["enc"]["layers"] == [{"w": None}]
    assert out["dec"]["head"] is m["dec"]["head"]  # the tie's other place keeps the old array
    shared = fk.replace(m, {"dec.block": "gone"})  # a shared sub-tree: replaced at every place
    assert shared["enc"]["block"] == "gone"
    assert shared["dec"]["block"] == "gone"
    assert fk.replace(m, {"": 5}) == 5


def test_replace_scalar_only_subtree_only_at_the_named_place() -> None:
    k = (3, 3)
    tree = {"c1": {"k": k}, "c2": {"k": k}, "w": np.ones(1)}
    assert tree["c1"]["k"] is tree["c2"]["k"]
    out = fk.replace(tree, {"c1.k": (4, 4)})
    assert out["c1"]["k"] == (4, 4)
    assert out["c2"]["k"] == (3, 3)


def test_replace_string_keys_that_look_like_ints(xp: Any) -> None:
    tree = {"blocks": {"0": {"w": _arr(xp, 1.0)}, "1": {"w": _arr(xp, 2.0)}}}
    new = _arr(xp, 5.0)
    out = fk.replace(tree, {"blocks.1.w": new})  # parse reads 1 as an int; the dict key is '1'
    assert out["blocks"]["1"]["w"] is new
    assert out["blocks"]["0"]["w"] is tree["blocks"]["0"]["w"]
    dotted = {"a.b": _arr(xp, 1.0)}  # a key holding a dot
    assert fk.replace(dotted, {"a.b": new})["a.b"] is new


def test_replace_wrong_paths() -> None:
    m = _model(np)
    with pytest.raises(fk.StructureError, match=r"enc\.layers\[0\]\.ww.*Nearest keys here: w"):
        fk.replace(m, {"enc.layers[0].ww": 1})
    with pytest.raises(fk.StructureError, match=r"Nearest valid paths: .*enc\.block\.w"):
        fk.replace(m, {"enc.blok.w": 1})
    with pytest.raises(fk.StructureError, match="goes through a leaf"):
        fk.replace(m, {"lr.x": 1})
    with pytest.raises(fk.StructureError, match="overlap"):
        fk.replace(m, {"enc.layers": [], "enc.layers.0.b": 1})
    with pytest.raises(TypeError, match="mapping"):
        fk.replace(m, [("lr", 1)])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path"):
        fk.replace(m, {3.5: 1})
    with pytest.raises(ValueError, match="cannot read the path"):
        fk.replace(m, {"enc..w": 1})


# ------------------------------------------------------------------------------ partition / combine


def test_partition_and_combine_round_trip(xp: Any) -> None:
    m = _model(xp)
    before = fk.leaves(m)
    weights, biases, rest = fk.partition(m, lambda p, x: p[-1] == "w", "*.b")
    assert weights["enc"]["layers"][0]["w"] is m["enc"]["layers"][0]["w"]
    assert weights["dec"]["head"] is m["dec"]["head"]  # the tie, in one group at both places
    assert weights["enc"]["layers"][0]["b"] is None
    assert biases["enc"]["layers"][0]["b"] is m["enc"]["layers"][0]["b"]
    assert biases["dec"]["head"] is None
    assert rest["dec"]["head"] is None
    assert rest["steps"] is m["steps"]
    assert rest["lr"] == 0.1
    assert weights["lr"] is None
    assert weights["enc"]["block"] is weights["dec"]["block"]  # shared sub-tree stays shared
    back = fk.combine(weights, biases, rest)
    after = fk.leaves(back)
    assert len(after) == len(before)
    assert all(a is b for a, b in zip(after, before))
    assert back["enc"]["layers"][0]["w"] is back["dec"]["head"]
    assert back["enc"]["block"] is back["dec"]["block"]
    assert back is not m
    assert all(a is b for a, b in zip(fk.leaves(m), before))  # the input is unchanged


def test_tie_goes_to_the_group_of_its_first_place() -> None:
    w = np.ones(2)
    tree = {"a": w, "b": w}
    first, rest = fk.partition(tree, lambda p, x: str(p) == "b")  # the predicate never sees "b" for w
    assert first == {"a": None, "b": None}
    assert rest["a"] is w
    assert rest["b"] is w


def test_combine_keeps_sub_trees_shared_when_split_across_groups() -> None:
    s1, s2 = {"x": np.ones(1)}, {"y": np.zeros(1)}
    tree = {"p": s1, "q": s1, "r": s2, "s": s2}
    g1, g2 = fk.partition(tree, "p.*")
    back = fk.combine(g1, g2)
    assert back["p"] is back["q"]
    assert back["r"] is back["s"]
    assert back["p"]["x"] is s1["x"]
    assert back["s"]["y"] is s2["y"]


def test_combine_errors(xp: Any) -> None:
    a, b = _arr(xp, 1.0), _arr(xp, 2.0)
    with pytest.raises(fk.StructureError, match=r"at k: groups\[0\] and groups\[1\] both hold"):
        fk.combine({"k": a, "j": None}, {"k": b, "j": None})
    with pytest.raises(fk.StructureError, match="groups"):
        fk.combine({"k": a}, {"k": None, "extra": None})
    with pytest.raises(TypeError):
        fk.combine()


def test_groups_work_with_destructure_and_arithmetic(xp: Any) -> None:
    m = _model(xp)
    weights = fk.partition(m, "*.w", "*.head")[0]
    flat, re = fk.destructure(weights)
    assert len(re) == 3  # the tied pair once (2) and the shared sub-tree's array once (1)
    doubled = fk.scale(2.0, weights)
    assert _same(doubled["dec"]["head"], _arr(xp, 2.0, 4.0))
    assert doubled["enc"]["layers"][0]["b"] is None
    new = re(flat * 0)
    back = fk.combine(new, *fk.partition(m, "*.w", "*.head")[1:])
    assert _same(back["dec"]["head"], _arr(xp, 0.0, 0.0))
    assert back["dec"]["head"] is back["enc"]["layers"][0]["w"]
    assert _same(back["enc"]["layers"][0]["b"], _arr(xp, 0.5))


def test_partition_bad_predicate() -> None:
    with pytest.raises(TypeError, match="predicate 0"):
        fk.partition({"a": 1}, 3)

    def boom(p: Any, x: Any) -> bool:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError) as ei:
        fk.partition({"a": 1}, boom)
    assert "at a" in "".join(getattr(ei.value, "__notes__", []))


# ------------------------------------------------------------------------------ stack / unstack


def test_stack_and_unstack(xp: Any, backend: Backend) -> None:
    models = []
    for k in range(3):
        w = _arr(xp, 1.0 + k, 2.0 + k)
        models.append({"enc": w, "dec": w, "b": _arr(xp, float(k)), "steps": xp.asarray([k]), "act": "relu"})
    snap = [to_numpy(m["enc"]) for m in models]
    s = fk.stack(models)
    assert tuple(s["enc"].shape) == (3, 2)
    assert tuple(s["steps"].shape) == (3, 1)
    assert s["enc"] is s["dec"]
    assert s["act"] == "relu"
    assert _same(s["b"], xp.reshape(_arr(xp, 0.0, 1.0, 2.0), (3, 1)))
    ms = fk.unstack(s)
    assert len(ms) == 3
    for k, m in enumerate(ms):
        assert m["enc"] is m["dec"]
        assert _same(m["enc"], models[k]["enc"])
        assert _same(m["steps"], models[k]["steps"])
        assert m["act"] == "relu"
    assert all(np.array_equal(a, to_numpy(m["enc"])) for a, m in zip(snap, models))  # inputs unchanged
    if backend.value in ("numpy", "numpy_readonly"):
        assert not np.shares_memory(ms[0]["enc"], s["enc"])  # unstack copies
        assert not any(np.shares_memory(s["enc"], m["enc"]) for m in models)


def test_stack_keeps_the_device(xp: Any, device: Any) -> None:
    ms = [{"w": _arr(xp, 1.0, float(k), device=device)} for k in range(2)]
    s = fk.stack(ms)
    from functorkit._xp import device_of, same_device

    assert same_device(device_of(s["w"]), device_of(ms[0]["w"]))
    assert same_device(device_of(fk.unstack(s)[1]["w"]), device_of(ms[0]["w"]))


def test_stack_mismatches(xp: Any) -> None:
    a = {"w": _arr(xp, 1.0), "b": _arr(xp, 2.0), "act": "relu"}
    with pytest.raises(fk.StructureError, match=r"models\[1\]"):
        fk.stack([a, {"w": _arr(xp, 1.0), "act": "relu"}])
    with pytest.raises(fk.StructureError, match=r"at b: .*shape \(1,\), models\[1\] shape \(2,\)"):
        fk.stack([a, {"w": _arr(xp, 1.0), "b": _arr(xp, 2.0, 3.0), "act": "relu"}])
    with pytest.raises(fk.StructureError, match=r"at act: .*'relu'.*'tanh'"):
        fk.stack([a, {"w": _arr(xp, 1.0), "b": _arr(xp, 2.0), "act": "tanh"}])
    w = _arr(xp, 1.0)
    with pytest.raises(fk.StructureError, match=r"at b: .*ties"):
        fk.stack([a, {"w": w, "b": w, "act": "relu"}])
    # keys in another order (was blamed on "static data or shared sub-trees")
    with pytest.raises(fk.StructureError, match=r"at x: models\[1\] has its keys in another order \(\['b', 'w'\]"):
        fk.stack([{"x": {"w": w, "b": _arr(xp, 2.0)}}, {"x": {"b": _arr(xp, 2.0), "w": w}}])
    with pytest.raises(ValueError, match="empty"):
        fk.stack([])


def test_replace_by_a_state_dict_key_with_a_leading_zero() -> None:
    # "a.01" (the key fk.state_dict gives for a["01"]) was read as index 1 and replaced a["1"]
    tree = {"a": {"01": np.zeros(1), "1": np.ones(1)}}
    assert list(fk.state_dict(tree)) == ["a.01", "a.1"]
    out = fk.replace(tree, {"a.01": np.full(1, 7.0)})
    assert out["a"]["01"].tolist() == [7.0]
    assert out["a"]["1"].tolist() == [1.0]
    assert fk.replace(tree, {"a.1": np.full(1, 5.0)})["a"]["1"].tolist() == [5.0]
    assert fk.KeyPath.parse("a.01") == fk.KeyPath(("a", "01"))
    assert fk.KeyPath.parse("a.10") == fk.KeyPath(("a", 10))


def test_combine_shares_a_sub_tree_again_only_where_the_values_allow() -> None:
    # partition a shared sub-tree, map one group per position (cache=False): the copies of the
    # shared sub-tree hold different values in that group; combine shared it again and kept the
    # first copy's values at both places (the second value was silently dropped)
    sub = {"w": np.zeros(2), "b": np.zeros(2)}
    tree = {"x": sub, "y": sub}
    ws, rest = fk.partition(tree, lambda p, x: p[-1] == "w")
    count = iter(range(1, 100))
    ws2 = fk.fmap(lambda a: None if a is None else a + next(count), ws, cache=False)
    out = fk.combine(ws2, rest)
    assert out["x"]["w"].tolist() == [1.0, 1.0]
    assert out["y"]["w"].tolist() == [2.0, 2.0]
    assert out["x"]["b"] is out["y"]["b"]  # what both places still hold alike stays one object
    again = fk.combine(ws, rest)  # unchanged groups: the sharing comes back
    assert again["x"] is again["y"]


def test_stack_and_unstack_keep_frozen_torch_parameters_frozen() -> None:
    # a frozen bias came back as a plain tensor, which a parameter slot counts as trainable (SPEC 3):
    # the stacked model had 16 parameters where 12 are, each unstacked member 8 where 6 are
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(3, 2)
    lin.bias.requires_grad_(False)
    with torch.no_grad():
        st = fk.stack([lin, lin])
    assert type(st.bias) is torch.nn.Parameter
    assert not st.bias.requires_grad
    assert len(fk.destructure(st)[1]) == 12
    back = fk.unstack(st)[0]
    assert len(fk.destructure(back)[1]) == 6
    assert not back.bias.requires_grad
    assert fk.allclose(back, lin)


def test_stack_refuses_a_diagonal_and_keeps_transposes(xp: Any) -> None:
    # stacked, a Diagonal held a 2-D "diagonal" that its constructor refuses: shape (2, 2), dense()
    # and @ wrong; a Transpose of a batch of matrices stays right (matrix_transpose is batched)
    ds = [{"d": fk.Diagonal(xp.ones(3)), "b": xp.ones(1)}, {"d": fk.Diagonal(xp.zeros(3)), "b": xp.ones(1)}]
    with pytest.raises(fk.StructureError, match=r"at d: fk\.stack: a Diagonal holds a 1-D diagonal"):
        fk.stack(ds)
    got = fk.stack([d["d"].diag for d in ds])
    assert tuple(got.shape) == (2, 3)
    with pytest.raises(fk.StructureError, match=r"at d: fk\.unstack: a Diagonal holds a 1-D diagonal"):
        fk.unstack({"d": fk.Diagonal(xp.ones(3)), "b": xp.ones(3)})  # members of 0-d "diagonals"
    m = xp.reshape(xp.arange(6.0), (2, 3))
    ts = fk.stack([{"t": fk.Transpose(m)}, {"t": fk.Transpose(m + 1)}])
    assert tuple(ts["t"].parent.shape) == (2, 2, 3)


def test_stack_policies(xp: Any) -> None:
    a = {"w": xp.asarray([1.0, 2.0], dtype=xp.float32)}
    b = {"w": xp.asarray([3.0, 4.0], dtype=xp.float64)}
    with pytest.raises(fk.PolicyError, match=r"at w: models\[0\] holds float32.*models\[1\] holds float64"):
        fk.stack([a, b])
    s = fk.stack([a, b], policy="model")
    assert s["w"].dtype == xp.float64
    assert _same(s["w"], xp.asarray([[1.0, 2.0], [3.0, 4.0]], dtype=xp.float64))
    with pytest.raises(ValueError, match="policy"):
        fk.stack([a, b], policy="loose")


def test_stack_mixed_namespaces_raise_under_every_policy(xp: Any, backend: Backend) -> None:
    if backend.value in ("numpy", "numpy_readonly"):
        pytest.skip("needs a second namespace")
    a, b = {"w": _arr(xp, 1.0)}, {"w": np.ones(1)}
    for pol in ("strict", "model", "flat"):
        with pytest.raises(fk.PolicyError, match="one array library"):
            fk.stack([a, b], policy=pol)


def test_unstack_errors(xp: Any) -> None:
    with pytest.raises(fk.StructureError, match=r"at b: expected an array with length 2, as at a"):
        fk.unstack({"a": xp.zeros((2, 3)), "b": xp.zeros((3,))})
    with pytest.raises(fk.StructureError, match="0-d"):
        fk.unstack({"a": xp.asarray(1.0)})
    with pytest.raises(ValueError, match="no array"):
        fk.unstack({"a": 1})


# ------------------------------------------------------------------------------ summary


def test_summary_rows_and_totals(xp: Any) -> None:
    m = _model(xp)
    s = fk.summary(m)
    paths = [str(r.path) for r in s.rows]
    assert paths == ["enc.layers[0].w", "enc.layers[0].b", "enc.block.w", "enc.block.scale", "steps", "lr"]
    first = s.rows[0]
    assert first.shape == (2,)
    assert first.dtype == "float64"
    assert first.trainable
    assert first.count == 2
    assert [str(p) for p in first.tied_with] == ["dec.head"]
    assert [str(p) for p in s.rows[2].tied_with] == ["dec.block.w"]
    assert not s.rows[4].trainable
    assert s.rows[5].shape is None
    assert s.num_params == 4 == len(fk.destructure(m)[1])
    assert s.num_elements == 5
    assert s.nbytes == 4 * 8 + s.rows[4].nbytes
    assert s.by_dtype["float64"] == (4, 32)
    text = str(s)
    assert "dec.head" in text
    assert "enc.layers[0].w" in text


def _resnet50_shapes() -> dict[str, Any]:
    """A dict with the 161 arrays of ResNet-50 (conv weights, batch-norm weights/biases), torchvision names."""
    out: dict[str, Any] = {"conv1.weight": (64, 3, 7, 7), "bn1.weight": (64,), "bn1.bias": (64,)}
    inplanes = 64
    for li, (planes, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], start=1):
        for bi in range(blocks):
            pre = f"layer{li}.{bi}"
            out[f"{pre}.conv1.weight"] = (planes, inplanes, 1, 1)
            out[f"{pre}.conv2.weight"] = (planes, planes, 3, 3)
            out[f"{pre}.conv3.weight"] = (planes * 4, planes, 1, 1)
            for k in (1, 2, 3):
                c = planes * 4 if k == 3 else planes
                out[f"{pre}.bn{k}.weight"] = (c,)
                out[f"{pre}.bn{k}.bias"] = (c,)
            if bi == 0:
                out[f"{pre}.downsample.0.weight"] = (planes * 4, inplanes, 1, 1)
                out[f"{pre}.downsample.1.weight"] = (planes * 4,)
                out[f"{pre}.downsample.1.bias"] = (planes * 4,)
            inplanes = planes * 4
    out["fc.weight"] = (1000, 2048)
    out["fc.bias"] = (1000,)
    return out


def test_summary_of_a_resnet50_fits_a_terminal() -> None:
    shapes = _resnet50_shapes()
    model: dict[str, Any] = {}
    for name, shape in shapes.items():  # nested as the module tree is: layer1 -> 0 -> conv1 -> weight
        node = model
        *parents, leaf = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = np.zeros(shape, dtype=np.float32)
    s = fk.summary(model)
    assert len(s.rows) == len(shapes) >= 160
    assert s.num_params == sum(int(np.prod(v)) for v in shapes.values())
    text = str(s)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    assert len(lines) == len(shapes) + 2 + 4
    assert "layer4['2'].conv3.weight" in text
    long = {"a" * 30: {"b" * 30: {"c" * 30: np.zeros((2, 2))}}}
    assert max(len(line) for line in str(fk.summary(long)).splitlines()) <= 120
    assert "..." in str(fk.summary(long))


# ------------------------------------------------------------------------------ torch modules


def _tied_lm() -> Any:
    torch = pytest.importorskip("torch")
    nn = torch.nn
    torch.manual_seed(0)
    lm = nn.ModuleDict(
        {
            "wte": nn.Embedding(5, 4),
            "norm": nn.BatchNorm1d(4),
            "proj": nn.Linear(4, 4),
            "lm_head": nn.Linear(4, 5, bias=False),
        }
    )
    lm["lm_head"].weight = lm["wte"].weight  # the tie of a language model
    lm["proj"].bias.requires_grad_(False)  # a frozen parameter
    return lm


def test_replace_on_a_tied_module_replaces_lm_head_too() -> None:
    torch = pytest.importorskip("torch")
    lm = _tied_lm()
    old = lm["wte"].weight
    new = torch.zeros(5, 4)
    out = fk.replace(lm, {"wte.weight": new})
    assert out["lm_head"].weight is new
    assert out["wte"].weight is new
    assert lm["wte"].weight is old
    assert lm["lm_head"].weight is old
    assert not torch.equal(old, new)
    assert out["norm"].running_mean is lm["norm"].running_mean
    assert type(out["proj"]) is torch.nn.Linear
    assert out["proj"] is not lm["proj"]
    with pytest.raises(fk.StructureError, match="Nearest keys here: weight"):
        fk.replace(lm, {"proj.weigth": new})


def test_partition_a_module_into_trainable_frozen_and_buffers() -> None:
    torch = pytest.importorskip("torch")
    lm = _tied_lm()
    trainable = [p for p in fk.flatten(lm)[1].trainable]
    assert not all(trainable)

    def is_trainable(path: Any, x: Any) -> bool:
        return isinstance(x, torch.nn.Parameter) and x.requires_grad

    def is_frozen(path: Any, x: Any) -> bool:
        return isinstance(x, torch.nn.Parameter)

    tr, frozen, buffers = fk.partition(lm, is_trainable, is_frozen)
    assert tr["wte"].weight is lm["wte"].weight
    assert tr["lm_head"].weight is lm["wte"].weight
    assert tr["proj"].bias is None
    assert frozen["proj"].bias is lm["proj"].bias
    assert buffers["norm"].running_var is lm["norm"].running_var
    assert buffers["norm"].weight is None
    flat, re = fk.destructure(tr)
    assert len(re) == 5 * 4 + 4 + 4 + 4 * 4  # wte (tied with lm_head, once), norm weight/bias, proj weight
    # combine: the groups (modules with None in the slots another group holds) go back together
    back = fk.combine(tr, frozen, buffers)
    assert type(back["proj"]) is torch.nn.Linear
    assert back["proj"] is not lm["proj"]
    for (p1, x), (p2, y) in zip(fk.leaves_with_path(back), fk.leaves_with_path(lm), strict=True):
        assert p1 == p2
        assert x is y
    assert back["lm_head"].weight is back["wte"].weight
    assert list(back.state_dict()) == list(lm.state_dict())
    # one group trained (rebuilt by re), the others as they were
    new = re(flat * 0)
    back = fk.combine(new, frozen, buffers)
    assert back["lm_head"].weight is back["wte"].weight
    assert float(back["wte"].weight.abs().sum()) == 0.0
    assert back["proj"].bias is lm["proj"].bias
    assert back["norm"].running_mean is lm["norm"].running_mean
    assert float(lm["wte"].weight.detach().abs().sum()) > 0  # the input is unchanged
    # fk.replace is the other way back into the model
    back = fk.replace(lm, dict(fk.leaves_with_path(new)))
    assert back["lm_head"].weight is back["wte"].weight
    assert back["proj"].bias is lm["proj"].bias


def test_combine_modules_keeps_none_slots_and_names_mismatches() -> None:
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(2, 3, bias=False), torch.nn.Linear(3, 1))
    w, rest = fk.partition(net, "*.weight")
    assert w[0].bias is None
    assert w[1].bias is None
    assert rest[0].weight is None
    back = fk.combine(w, rest)
    assert back[0].bias is None  # bias=False stays a None slot, not a parameter
    assert "bias" in back[0]._parameters
    assert back[1].bias is net[1].bias
    assert [n for n, _ in back.named_parameters()] == [n for n, _ in net.named_parameters()]
    assert torch.equal(back(torch.ones(4, 2)), net(torch.ones(4, 2)))
    # two groups holding a value at one slot
    with pytest.raises(fk.StructureError, match=r"at \[1\]\.bias: groups\[0\] and groups\[1\] both hold"):
        fk.combine(net, fk.partition(fk.copy(net), "*.weight")[1])
    # a submodule shared by two places (and holding a None slot) stays one module
    lin = torch.nn.Linear(2, 2, bias=False)
    shared = torch.nn.Sequential(lin, torch.nn.ReLU(), lin, torch.nn.Linear(2, 1))
    back = fk.combine(*fk.partition(shared, "*.bias"))
    assert back[0] is back[2]
    assert back[0] is not lin
    assert back[0].weight is lin.weight
    assert back[0].bias is None
    # a group of another model: the path and both sides are named
    other = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    with pytest.raises(fk.StructureError, match=r"at \[1\]"):
        fk.combine(w, fk.partition(other, "*.weight")[1])


def test_stack_modules_for_vmap() -> None:
    torch = pytest.importorskip("torch")
    from torch.func import functional_call, vmap

    models = [_tied_lm() for _ in range(3)]
    with torch.no_grad():
        s = fk.stack(models)
    assert s["wte"].weight.shape == (3, 5, 4)
    assert s["lm_head"].weight is s["wte"].weight
    assert s["norm"].num_batches_tracked.shape == (3,)
    state = {p.dotted: x for p, x in fk.leaves_with_path(s)}
    x = torch.randn(3, 2, 4)

    def run(st: Any, xb: Any) -> Any:
        return functional_call(models[0]["proj"], {"weight": st["proj.weight"], "bias": st["proj.bias"]}, (xb,))

    out = vmap(run)(state, x)
    for k in range(3):
        assert torch.allclose(out[k], models[k]["proj"](x[k]))
    back = fk.unstack(s)
    assert back[1]["lm_head"].weight is back[1]["wte"].weight
    assert torch.equal(back[1]["wte"].weight, models[1]["wte"].weight)
    assert back[1]["wte"].weight.data_ptr() != s["wte"].weight.data_ptr()
    frozen_differs = _tied_lm()
    frozen_differs["proj"].bias.requires_grad_(True)
    with pytest.raises(fk.StructureError, match="trainab"):
        fk.stack([models[0], frozen_differs])


def test_tools_page_examples_run() -> None:
    """The python blocks of docs/tools.md run, in order, as one script."""
    pytest.importorskip("torch")
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parent.parent / "docs" / "tools.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "tools_docs"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/tools.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            e.add_note(f"in docs/tools.md python block {i + 1}:\n{block}")
            raise


@pytest.mark.parametrize("pattern", ["p.a", "p.T.*", "r.*", "z.*", "*", "nothing"])
def test_combine_restores_nested_sharing(pattern: str) -> None:
    t = {"t": np.ones(1), "n": 3}
    s = {"a": np.zeros(1), "T": t}
    tree = {"p": s, "q": s, "r": t, "z": [t, np.ones(2)], "k": (1, 2)}
    back = fk.combine(*fk.partition(tree, pattern))
    assert back["p"] is back["q"]
    assert back["r"] is back["p"]["T"]
    assert back["z"][0] is back["r"]
    assert all(a is b for a, b in zip(fk.leaves(back), fk.leaves(tree)))
    assert fk.flatten(back)[1] == fk.flatten(tree)[1]
