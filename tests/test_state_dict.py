"""fk.state_dict / fk.load_state_dict: torch's keys, every tree, all or nothing, no aliasing, ties."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit.adapters import adapter_of

from conftest import Backend, namespace_for, to_numpy
from helpers import Frozen, Layer, oracle_positions, zoo

MUTABLE = (Backend.NUMPY, Backend.TORCH, Backend.ARRAY_API_STRICT)


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.generic)


def _dotted(path: tuple[Any, ...]) -> str:
    """The state-dict key of a path, written out independently (the zoo's keys are str and int)."""
    return ".".join(str(k) for k in path)


def _same_memory(a: Any, b: Any) -> bool:
    if type(a).__module__.startswith("torch"):
        return bool(a.data_ptr() == b.data_ptr() and a.shape == b.shape)
    return a is b


def _values(tree: Any) -> list[Any]:
    return [(k, str(v.dtype), to_numpy(v).tolist()) for k, v in fk.state_dict(tree).items()]


def _zeros_like(xp: Any, tree: Any) -> Any:
    """An independent model of `tree`'s structure (ties and shared sub-trees kept), all zeros."""
    return fk.fmap(lambda x: xp.zeros_like(x) if _is_array(x) else x, tree)


# ------------------------------------------------------------------ every backend


@pytest.mark.parametrize("name", list(zoo(np).keys()))
def test_keys_are_the_dotted_array_positions(xp: Any, name: str) -> None:
    tree = zoo(xp)[name]
    want = [(_dotted(p), x) for p, x in oracle_positions(tree) if _is_array(x)]
    sd = fk.state_dict(tree)
    assert list(sd) == [k for k, _ in want]
    for (k, x), v in zip(want, sd.values()):
        assert _same_memory(v, x), k  # the model's own arrays (torch: detached aliases)
        assert fk.KeyPath.parse(k).get(tree) is x
        assert fk.KeyPath.parse(k).dotted == k


def test_ties_are_listed_under_every_key_as_one_object(xp: Any) -> None:
    w = xp.asarray([1.0, 2.0])
    sub = {"w": w, "b": xp.asarray([0.0])}
    sd = fk.state_dict({"enc": sub, "dec": sub, "head": [w, 3, "name", None]})
    assert list(sd) == ["enc.w", "enc.b", "dec.w", "dec.b", "head.0"]  # scalars, str, None left out
    assert sd["enc.w"] is sd["dec.w"] is sd["head.0"]
    assert sd["enc.b"] is sd["dec.b"]


def test_colliding_dotted_keys_are_an_error_naming_both_paths(xp: Any) -> None:
    tree = {"a.b": xp.asarray([1.0]), "a": {"b": xp.asarray([2.0])}}
    with pytest.raises(fk.StructureError, match=r"\['a\.b'\] and a\.b both read 'a\.b'"):
        fk.state_dict(tree)
    with pytest.raises(fk.StructureError, match=r"both read 'a\.b'"):
        fk.load_state_dict(tree, {"a.b": xp.asarray([3.0])})


@pytest.mark.parametrize("name", ["dict", "nested", "dataclass", "shared_leaf", "shared_subtree", "int_arrays"])
def test_round_trip_into_an_independent_model(backend: Backend, xp: Any, name: str) -> None:
    src = zoo(xp)[name]
    src_before = _values(src)
    dst = _zeros_like(xp, src)  # read-only NumPy: zeros_like is writable, `src` read-only (never written)
    dst_before = _values(dst)
    if backend not in (*MUTABLE, Backend.NUMPY_READONLY):  # JAX, Dask: in place is impossible, nothing changes
        with pytest.raises(TypeError, match="in place") as info:
            fk.load_state_dict(dst, fk.state_dict(src))
        assert "fk.load_state_dict" in "".join(getattr(info.value, "__notes__", []))
        assert _values(dst) == dst_before
        return
    ids = [id(x) for x in fk.leaves(dst)]
    assert fk.load_state_dict(dst, fk.state_dict(src)) is dst
    assert _values(dst) == src_before
    assert _values(src) == src_before  # the source is never written
    assert [id(x) for x in fk.leaves(dst)] == ids  # the same arrays, written in place
    if backend is not Backend.NUMPY_READONLY:  # no aliasing afterwards: writing into `src` leaves `dst` alone
        for s in fk.leaves(src):
            if _is_array(s):
                s[...] = xp.zeros_like(s)
        assert _values(src) != src_before
        assert _values(dst) == src_before


def test_strict_reports_every_problem_at_once_and_writes_nothing(xp: Any) -> None:
    dst = {
        "a": xp.asarray([1.0, 2.0]),
        "b": [xp.asarray([3.0]), xp.asarray([4], dtype=xp.int64)],
        "c": xp.asarray([5.0]),
        "d": xp.asarray([6.0]),
        "e": xp.asarray([7.0]),
    }
    before = _values(dst)
    mapping = {
        "a": xp.asarray([10.0, 20.0]),  # fits
        "b.0": xp.asarray([1.0, 2.0, 3.0]),  # shape
        "b.1": xp.asarray([1.5], dtype=xp.float64),  # dtype kind: real floating into integer
        "d": 2.5,  # not an array
        "extra": xp.asarray([0.0]),
        "more.x": xp.asarray([0.0]),
    }  # "c" and "e" missing
    with pytest.raises(fk.StructureError) as info:
        fk.load_state_dict(dst, mapping)
    msg = str(info.value)
    assert "2 missing (in the model, not in the mapping): 'c', 'e'" in msg
    assert "2 unexpected (in the mapping, not in the model): 'extra', 'more.x'" in msg
    assert "3 mismatched" in msg
    assert "'b.0': shape (1,) in the model vs (3,) in the mapping" in msg
    assert "'b.1': dtype int64 (integer) in the model vs float64 (real floating) in the mapping" in msg
    assert "'d': the model has an array of shape (1,), the mapping a float" in msg
    assert "strict=False" in msg
    assert _values(dst) == before


def _refuses_in_place(dst: Any, mapping: Any, **kw: Any) -> None:
    """JAX, Dask, read-only NumPy: a TypeError naming the path, and `dst` unchanged."""
    before = _values(dst)
    with pytest.raises(TypeError, match=r"^at \w+: fk.load_state_dict writes into `dst`'s arrays in place"):
        fk.load_state_dict(dst, mapping, **kw)  # (named fk.load_into, which the user never called)
    with pytest.raises(TypeError, match=r"fix: build a new model instead, e\.g\. fk\.fmap_with_path\(lambda path"):
        fk.load_state_dict(dst, mapping, **kw)  # (its fix was fk.fmap of dst and the flat mapping, which raised)
    assert _values(dst) == before


def test_not_strict_loads_what_fits_and_returns_the_rest(backend: Backend, xp: Any) -> None:
    dst = {"a": xp.asarray([1.0, 2.0]), "b": xp.asarray([3.0]), "c": xp.asarray([4.0])}
    if backend not in MUTABLE:
        _refuses_in_place(dst, {"a": xp.asarray([10.0, 20.0])}, strict=False)
        return
    res = fk.load_state_dict(dst, {"a": xp.asarray([10.0, 20.0]), "b": xp.asarray([1.0, 2.0]), "z": 1}, strict=False)
    assert isinstance(res, fk.IncompatibleKeys)
    assert res == fk.IncompatibleKeys(missing=["c"], unexpected=["z"], mismatched=["b"])
    assert (res.missing, res.unexpected, res.mismatched) == (["c"], ["z"], ["b"])
    assert to_numpy(dst["a"]).tolist() == [10.0, 20.0]
    assert to_numpy(dst["b"]).tolist() == [3.0]
    assert to_numpy(dst["c"]).tolist() == [4.0]


def test_ties_in_the_mapping(backend: Backend, xp: Any) -> None:
    w = xp.asarray([1.0, 2.0])
    dst = {"enc": w, "dec": w, "b": xp.asarray([0.0])}
    if backend not in MUTABLE:
        _refuses_in_place(dst, {"dec": xp.asarray([7.0, 8.0]), "b": xp.asarray([1.0])})
        return
    # equal values under both keys (two objects): fine; the tie is kept
    fk.load_state_dict(dst, {"enc": xp.asarray([5.0, 6.0]), "dec": xp.asarray([5.0, 6.0]), "b": xp.asarray([1.0])})
    assert dst["enc"] is dst["dec"] is w
    assert to_numpy(w).tolist() == [5.0, 6.0]
    # one key only (as safetensors' save_model writes a tie): loaded, the other key is not missing
    assert fk.load_state_dict(dst, {"dec": xp.asarray([7.0, 8.0]), "b": xp.asarray([1.0])}) is dst
    assert to_numpy(w).tolist() == [7.0, 8.0]
    # different values: an error naming both keys, nothing written
    with pytest.raises(fk.StructureError, match=r"at enc and dec: .* a tie"):
        fk.load_state_dict(dst, {"enc": xp.asarray([1.0, 1.0]), "dec": xp.asarray([2.0, 2.0]), "b": xp.asarray([9.0])})
    assert to_numpy(w).tolist() == [7.0, 8.0]
    assert to_numpy(dst["b"]).tolist() == [1.0]


@pytest.mark.parametrize("backend_", MUTABLE, ids=lambda b: b.value)
def test_a_failing_write_leaves_dst_bit_for_bit_unchanged(backend_: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    xp = namespace_for(backend_)
    dst = {"a": xp.asarray([1.0, 2.0]), "b": [xp.asarray([3.0], dtype=xp.float32), xp.asarray([4.0])]}
    mapping = {"a": xp.asarray([10.0, 20.0]), "b.0": xp.asarray([30.0]), "b.1": xp.asarray([40.0])}
    before = [to_numpy(x).tobytes() for x in fk.leaves(dst)]
    cls = type(adapter_of(dst["a"]))
    real_write = cls.write
    for k in (1, 2, 3):
        calls = [0]

        def write(self: Any, d: Any, s: Any, k: int = k, calls: list[int] = calls) -> None:
            calls[0] += 1
            real_write(self, d, s)  # the failing array is written too before the failure
            if calls[0] == k:
                raise RuntimeError("injected")

        monkeypatch.setattr(cls, "write", write)
        with pytest.raises(RuntimeError, match="injected"):
            fk.load_state_dict(dst, mapping)
        assert [to_numpy(x).tobytes() for x in fk.leaves(dst)] == before, k
    monkeypatch.setattr(cls, "write", real_write)
    fk.load_state_dict(dst, mapping)
    assert to_numpy(dst["b"][1]).tolist() == [40.0]


def test_bad_arguments(xp: Any) -> None:
    dst = {"a": xp.asarray([1.0])}
    with pytest.raises(TypeError, match="`mapping` must be a Mapping"):
        fk.load_state_dict(dst, [("a", xp.asarray([1.0]))])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys must be str.*the int key 0"):
        fk.load_state_dict(dst, {0: xp.asarray([1.0])})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="`strict` must be True or False"):
        fk.load_state_dict(dst, {"a": xp.asarray([1.0])}, strict=1)  # type: ignore[call-overload]


def test_mismatch_of_two_node_types_names_both(xp: Any) -> None:
    x = xp.asarray([1.0])
    with pytest.raises(fk.StructureError) as info:
        fk.fmap(lambda a, b: a, Layer(x, x), Frozen(x, x))
    assert "The node types differ (Layer vs Frozen)" in str(info.value)
    with pytest.raises(fk.StructureError) as info:
        fk.load_into({"weight": x}, Layer(x, x))
    assert "The node types differ (dict vs Layer)" in str(info.value)
    assert "fk.load_state_dict" in str(info.value)


# ------------------------------------------------------------------ NumPy files


def test_np_load_npz_into_a_model(tmp_path: Any) -> None:
    src = {"layers": [{"w": np.arange(4.0).reshape(2, 2), "b": np.ones(2)}], "steps": np.array(3)}
    np.savez(tmp_path / "ck.npz", **fk.state_dict(src))
    dst = _zeros_like(np, src)
    with np.load(tmp_path / "ck.npz") as f:
        assert fk.load_state_dict(dst, f) is dst
    assert _values(dst) == _values(src)


def test_read_only_mapping_values_are_read_not_written() -> None:
    mapping = {"a": np.arange(3.0), "b": np.ones((2, 2), dtype=np.float32)}
    for v in mapping.values():
        v.flags.writeable = False
    dst = {"a": np.zeros(3), "b": np.zeros((2, 2))}  # float32 into float64: cast, same kind
    fk.load_state_dict(dst, mapping)
    assert dst["b"].dtype == np.float64
    np.testing.assert_array_equal(dst["a"], mapping["a"])
    assert not np.shares_memory(dst["a"], mapping["a"])


# ------------------------------------------------------------------ torch modules


def _torch_zoo() -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(5, 3)
            self.blocks = nn.ModuleList([nn.Linear(3, 3), nn.Linear(3, 3, bias=False)])
            self.lm_head = nn.Linear(3, 5, bias=False)
            self.lm_head.weight = self.embed.weight
            self.register_buffer("inv_freq", torch.arange(3.0), persistent=False)  # not in torch's state_dict
            self.register_buffer("scale", torch.ones(1))

    class Sym(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.triu() + x.triu(1).T

    sym = nn.Linear(3, 3)
    torch.nn.utils.parametrize.register_parametrization(sym, "weight", Sym())
    shared = nn.Linear(2, 2)
    return {
        "sequential": nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)),
        "nested": nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.ModuleDict({"head": nn.Linear(2, 1)})),
        "batchnorm": nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)),
        "tied": Tied(),
        "weight_norm": nn.utils.parametrizations.weight_norm(nn.Linear(2, 3)),
        "parametrize": sym,
        "shared_submodule": nn.Sequential(shared, nn.Tanh(), shared),
        "lstm": nn.LSTM(2, 3, num_layers=2),
        "attention": nn.MultiheadAttention(4, 2),
        "frozen": nn.Sequential(nn.Linear(2, 2).requires_grad_(False), nn.Linear(2, 2)),
    }


TORCH_MODELS = [
    "sequential",
    "nested",
    "batchnorm",
    "tied",
    "weight_norm",
    "parametrize",
    "shared_submodule",
    "lstm",
    "attention",
    "frozen",
]


@pytest.mark.parametrize("name", TORCH_MODELS)
def test_torch_keys_and_values_are_module_state_dict(name: str) -> None:
    torch = pytest.importorskip("torch")
    m = _torch_zoo()[name]
    want = m.state_dict()
    sd = fk.state_dict(m)
    assert list(sd) == list(want)
    for k, v in sd.items():
        assert type(v) is torch.Tensor, k  # detached, as torch's
        assert not v.requires_grad, k
        assert v.data_ptr() == want[k].data_ptr(), k  # an alias of the model's array
        assert (v.dtype, v.shape) == (want[k].dtype, want[k].shape), k
    if name == "weight_norm":
        assert list(sd) == ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    if name == "tied":
        assert m.lm_head.weight is m.embed.weight
        assert sd["lm_head.weight"] is sd["embed.weight"]
        assert "inv_freq" not in sd
    if name == "batchnorm":
        assert {"1.running_mean", "1.running_var", "1.num_batches_tracked"} <= set(sd)


@pytest.mark.parametrize("name", TORCH_MODELS)
@pytest.mark.parametrize("source", ["fk", "torch", "safetensors"])
def test_torch_load_into_an_independently_built_model(name: str, source: str, tmp_path: Any) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    src = _torch_zoo()[name]
    with torch.no_grad():
        for b in src.buffers():
            b.add_(3)  # buffers too (running stats, num_batches_tracked)
    torch.manual_seed(1)
    dst = _torch_zoo()[name]
    if source == "fk":
        mapping = fk.state_dict(src)
    elif source == "torch":
        mapping = src.state_dict()
    else:
        st = pytest.importorskip("safetensors.torch")
        st.save_model(src, str(tmp_path / "m.safetensors"))  # a tie is stored once, under one key
        mapping = st.load_file(str(tmp_path / "m.safetensors"))
    params = {k: id(v) for k, v in dst.named_parameters(remove_duplicate=False)}
    snap = {k: v.clone() for k, v in mapping.items()}
    assert fk.load_state_dict(dst, mapping) is dst
    want = src.state_dict()
    got = dst.state_dict()
    assert list(got) == list(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
        assert got[k].data_ptr() != want[k].data_ptr(), k  # no aliasing with the source
    for k in mapping:
        assert torch.equal(mapping[k], snap[k])
        assert mapping[k].data_ptr() != got.get(k, snap[k]).data_ptr()
    assert {k: id(v) for k, v in dst.named_parameters(remove_duplicate=False)} == params  # same Parameters
    if name == "tied":
        assert dst.lm_head.weight is dst.embed.weight
        torch.testing.assert_close(dst.inv_freq, torch.arange(3.0))  # non-persistent: not loaded
    if name == "batchnorm":
        x = torch.randn(2, 1, 5, 5)
        torch.testing.assert_close(dst.eval()(x), src.eval()(x))


def test_torch_strict_error_lists_all_and_hints_at_a_prefix() -> None:
    torch = pytest.importorskip("torch")
    src = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    dst = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    wrapped = {"module." + k: v for k, v in src.state_dict().items()}  # as DataParallel saves
    with pytest.raises(fk.StructureError) as info:
        fk.load_state_dict(dst, wrapped)
    msg = str(info.value)
    assert "7 missing" in msg
    assert "7 unexpected" in msg
    assert "every mapping key has the extra prefix 'module.'" in msg
    assert all(torch.equal(v, before[k]) for k, v in dst.state_dict().items())
    res = fk.load_state_dict(dst, {"0.weight": torch.ones(3, 2), "1.bias": torch.ones(4)}, strict=False)
    assert res.mismatched == ["1.bias"]
    assert "0.weight" not in res.missing
    assert "1.running_mean" in res.missing
    assert torch.equal(dst[0].weight, torch.ones(3, 2))
    assert isinstance(dst[0].weight, torch.nn.Parameter)


def test_torch_module_vs_dict_message_names_both_types() -> None:
    torch = pytest.importorskip("torch")
    m = torch.nn.Linear(2, 3)
    runs = [
        ("dict", lambda: fk.load_into(m, dict(m.state_dict()))),
        ("OrderedDict", lambda: fk.fmap(lambda a, b: a, m, m.state_dict())),
    ]
    for other, run in runs:
        with pytest.raises(fk.StructureError) as info:
            run()
        lines = str(info.value).splitlines()
        assert lines[0] == f"at <root>: Linear keys {{'weight', 'bias'}} vs {other} keys {{'weight', 'bias'}}"
        assert lines[1].startswith(f"The node types differ (Linear vs {other}): ")
        assert "fk.load_state_dict(model, mapping)" in lines[1]


def test_state_dict_page_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The python blocks of docs/state_dict.md run, in order, as one script; the shown output is printed."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    page = Path(__file__).resolve().parent.parent / "docs" / "state_dict.md"
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) >= 8
    namespace: dict[str, object] = {"__name__": "state_dict_docs"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/state_dict.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            e.add_note(f"in docs/state_dict.md python block {i + 1}:\n{block}")
            raise
    out = capsys.readouterr().out.splitlines()
    shown = [  # the output the page shows in its comments
        "['0.weight', '0.bias', '1.weight', '1.bias', '1.running_mean', '1.running_var', '1.num_batches_tracked', "
        "'2.weight', '2.bias']",
        "['layers.0.w', 'layers.0.b', 'steps']",
        "  1 missing (in the model, not in the mapping): '1.running_mean'",
        "  1 unexpected (in the mapping, not in the model): 'head.weight'",
        "    '1.num_batches_tracked': dtype int64 (integer) in the model vs float32 (real floating) in the mapping",
        "    '2.weight': shape (1, 3) in the model vs (2, 3) in the mapping",
        "IncompatibleKeys(missing=['1.running_mean'], unexpected=['head.weight'], "
        "mismatched=['1.num_batches_tracked', '2.weight'])",
        "at <root>: Linear keys {'weight', 'bias'} vs dict keys {'weight', 'bias'}",
    ]
    for line in shown:
        assert line in out
    starts = [
        "fk.state_dict: the paths ['a.b'] and a.b both read 'a.b' in dotted form",
        "at embed.weight and lm_head.weight: `dst` has one array at both places (a tie)",
        "The node types differ (Linear vs dict)",
    ]
    for start in starts:
        assert any(o.startswith(start) for o in out), start


def test_deep_nesting_and_a_bare_array() -> None:
    tree: Any = np.ones(2)
    for _ in range(10_000):
        tree = [tree]
    (key,) = fk.state_dict(tree)
    assert key == ".".join(["0"] * 10_000)
    fk.load_state_dict(tree, {key: np.zeros(2)})
    assert fk.KeyPath.parse(key).get(tree).tolist() == [0.0, 0.0]
    bare = np.ones(2)
    assert list(fk.state_dict(bare)) == [""]  # the root path
    fk.load_state_dict(bare, {"": np.arange(2.0)})
    assert bare.tolist() == [0.0, 1.0]


def test_a_non_numeric_model_array_takes_only_its_own_dtype(xp: Any) -> None:
    """str, datetime64 and object arrays (NumPy's own) have no kind to cast within: a numeric value
    (from any backend) or another str length or datetime unit is a mismatch, nothing written."""
    dst = {
        "labels": np.array(["cat", "dog"]),
        "when": np.array(["2020-01-01", "2020-01-02"], dtype="datetime64[D]"),
        "obj": np.array([None, 1], dtype=object),
        "w": np.zeros(2),
    }
    before = {k: v.copy() for k, v in dst.items()}
    mapping = {
        "labels": xp.asarray([0.5, 1.5]),  # was written as '0.5', '1.5'
        "when": xp.asarray([1, 2]),  # was written as 1970-01-02, 1970-01-03
        "obj": xp.asarray([1.0, 2.0]),
        "w": xp.asarray([1.0, 2.0]),
    }
    with pytest.raises(fk.StructureError) as info:
        fk.load_state_dict(dst, mapping)
    msg = str(info.value)
    assert "3 mismatched" in msg
    assert (
        "'labels': dtype <U3 (not a numeric dtype: it takes only a value of that same dtype) in the model vs float"
        in msg
    )
    assert "'when': dtype datetime64[D] (not a numeric dtype" in msg
    assert "'obj': dtype object (not a numeric dtype" in msg
    assert all(np.array_equal(dst[k], before[k]) and dst[k].dtype == before[k].dtype for k in dst)
    cut = {"labels": np.array(["horse", "mouse"]), "when": dst["when"].astype("datetime64[h]") + 5}
    with pytest.raises(fk.StructureError, match=r"(?s)'labels': dtype <U3 .* vs <U5 \(not a numeric dtype\).*'when'"):
        fk.load_state_dict(dst, {**mapping, **cut, "obj": dst["obj"]})  # would be cut to 'hor', rounded
    same = {"labels": np.array(["ant", "bee"]), "when": dst["when"] + 1, "obj": np.array(["x", 2], dtype=object)}
    fk.load_state_dict(dst, {**same, "w": mapping["w"]})
    assert dst["labels"].tolist() == ["ant", "bee"]
    assert dst["when"].tolist() == (before["when"] + 1).tolist()
    assert dst["obj"].tolist() == ["x", 2]
