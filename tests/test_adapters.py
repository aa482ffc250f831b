"""The array adapters: lookup, every method on every backend, the fast paths, the fallbacks,
and that the core stays free of backend-specific code."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit import _policy
from functorkit._xp import (
    Kind,
    describe_dtype,
    is_complex,
    same_device,
)
from functorkit.adapters import ArrayAdapter, adapter_for, adapter_of

from conftest import Backend, importable, to_numpy

FAMILY = {
    Backend.NUMPY: "numpy",
    Backend.NUMPY_READONLY: "numpy",
    Backend.TORCH: "torch",
    Backend.ARRAY_API_STRICT: "generic",
    Backend.JAX: "jax",
    Backend.DASK: "dask",
    Backend.CUPY: "cupy",
}
ROOT = pathlib.Path(fk.__file__).parent


# ------------------------------------------------------------------ lookup


def test_lookup(xp: Any, backend: Backend) -> None:
    x = xp.asarray([1.0, 2.0])
    ad = adapter_of(x)
    assert ad.family == FAMILY[backend]
    assert adapter_for(ad.xp) is ad
    assert adapter_of(x) is ad
    if backend is Backend.ARRAY_API_STRICT:
        assert type(ad) is ArrayAdapter  # unknown namespaces get the generic adapter itself
    else:
        assert type(ad) is not ArrayAdapter
    assert ad.mutable == (backend not in (Backend.JAX, Backend.DASK))
    assert FAMILY[backend] in repr(ad)


def test_import_functorkit_is_backend_free() -> None:
    code = (
        "import sys, numpy as np, functorkit as fk\n"
        "flat, re = fk.destructure({'w': np.ones(3)}); fk.load_into({'w': np.ones(3)}, {'w': np.zeros(3)})\n"
        "fk.mean([{'w': np.ones(2)}] * 2)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'jax', 'cupy', 'dask'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT.parent)


# ------------------------------------------------------------------ every method, every backend


def _exec_views(ad: ArrayAdapter, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> Any:
    glb: dict[str, Any] = {}
    check = ad.check_source(type(p), int(p.shape[0]), p.dtype, ad.device(p), glb)
    lines = ad.view_source(offsets, shapes, glb)
    names = ", ".join(f"v{k}" for k in range(len(shapes)))
    src = "\n".join(["def f(p):", f"    if {check}:", "        return None", *lines, f"    return [{names}]"])
    exec(compile(src, "<test>", "exec"), glb)
    return glb["f"]


def test_views_and_generated_views(xp: Any) -> None:
    p = xp.asarray([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    ad = adapter_of(p)
    offsets, shapes = [0, 1, 3], [(1,), (2,), (2, 2)]
    expect = [[0.0], [1.0, 2.0], [[3.0, 4.0], [5.0, 6.0]]]
    for got in (ad.views(p, offsets, shapes), _exec_views(ad, p, offsets, shapes)(p)):
        assert [tuple(v.shape) for v in got] == shapes
        for v, e in zip(got, expect, strict=True):
            np.testing.assert_array_equal(to_numpy(v), e)
    f = _exec_views(ad, p, offsets, shapes)
    assert f(xp.asarray([0.0, 1.0])) is None  # wrong length: the check rejects it
    assert f(xp.asarray([0, 1, 2, 3, 4, 5, 6])) is None  # wrong dtype


def test_allocation_copies_and_fill(xp: Any, backend: Backend) -> None:
    a, b = xp.asarray([1.0, 2.0]), xp.asarray([[3.0], [4.0]], dtype=xp.float32)
    ad = adapter_of(a)
    dev = ad.device(a)
    assert same_device(dev, ad.device(b))
    assert ad.readable(dev)
    assert tuple(ad.empty(xp.float64, dev, 3).shape) == (3,)
    flat = ad.new_flat(xp.float64, dev, 4, [a, b], [0, 2], [(2,), (2, 1)])
    np.testing.assert_array_equal(to_numpy(flat), [1.0, 2.0, 3.0, 4.0])
    assert flat.dtype == xp.float64
    if ad.mutable:
        out = ad.empty(xp.float64, dev, 4)
        ad.fill(out, [b, a], [0, 2], [(2, 1), (2,)])
        np.testing.assert_array_equal(to_numpy(out), [3.0, 4.0, 1.0, 2.0])
        assert ad.out_problem(out) is None if backend is not Backend.NUMPY_READONLY else True
    else:
        assert "immutable" in (ad.out_problem(flat) or "")
    c = ad.copy(a)
    np.testing.assert_array_equal(to_numpy(c), [1.0, 2.0])
    assert ad.to_device(a, dev).shape == a.shape
    moved = ad.to_namespace(np.asarray([5.0, 6.0]), dev)
    assert adapter_of(moved) is ad
    np.testing.assert_array_equal(to_numpy(moved), [5.0, 6.0])
    assert type(a) in ad.array_types(type(a))
    assert ad.read_problem(a) is None


def test_arithmetic_methods(xp: Any) -> None:
    a, b = xp.asarray([1.0, 2.0]), xp.asarray([3.0, 5.0])
    ad = adapter_of(a)
    inplace = ad.inplace_ok([a, b])
    acc = a * 1
    acc = ad.axpy(acc, b, 2, inplace)
    acc = ad.add(acc, a, inplace)
    acc = ad.div(acc, 2, inplace)
    np.testing.assert_array_equal(to_numpy(acc), [4.0, 7.0])
    np.testing.assert_array_equal(to_numpy(a), [1.0, 2.0])  # inputs untouched
    np.testing.assert_allclose(to_numpy(ad.lerp(a, b, 0.25)), [1.5, 2.75])
    assert float(ad.vdot(a, b)) == 13.0
    assert float(ad.sum_squares(b)) == 34.0


def test_write_stage_backup(xp: Any, backend: Backend) -> None:
    d = xp.asarray([1.0, 2.0], dtype=xp.float32)
    ad = adapter_of(d)
    if not ad.mutable or backend is Backend.NUMPY_READONLY:
        assert ad.write_problem(d) is not None
        return
    assert ad.write_problem(d) is None
    old = ad.backup(d)
    staged = ad.stage(d, np.asarray([7.0, 8.0]))
    assert staged.dtype == d.dtype
    ad.write(d, staged)
    np.testing.assert_array_equal(to_numpy(d), [7.0, 8.0])
    ad.write(d, old)
    np.testing.assert_array_equal(to_numpy(d), [1.0, 2.0])


def test_memory(xp: Any, backend: Backend) -> None:
    a = xp.reshape(xp.arange(6.0, dtype=xp.float64), (2, 3))
    ad = adapter_of(a)
    lay = ad.memory_layout(a)
    if not ad.mutable:
        assert lay is None
        assert ad.memory_extent(a) is None
        return
    assert lay is not None
    assert lay.hi - lay.lo == 48
    assert ad.byte_strides(a) == (24, 8)
    ext = ad.memory_extent(a)
    assert ext is not None
    assert ext[2] - ext[1] == 48


# ------------------------------------------------------------------ the fast paths are taken


def test_numpy_overrides_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    from functorkit.adapters import numpy as npad

    ad = adapter_of(np.ones(2))
    assert type(ad) is npad.Adapter
    glb: dict[str, Any] = {}
    lines = ad.view_source([0, 2], [(2,), (2, 2)], glb)
    assert ".reshape((2, 2))" in lines[1]
    assert "RESHAPE" not in glb  # the method form, not the generic namespace function
    assert "DEV" not in ad.check_source(np.ndarray, 6, np.float64, "cpu", glb)
    calls: list[int] = []
    real = npad.Adapter._blocked

    def spy(self: Any, kern: Any, xs: Any, out: Any) -> Any:
        calls.append(len(xs))
        return real(self, kern, xs, out)

    monkeypatch.setattr(npad.Adapter, "_blocked", spy)
    fk.lincomb([1.0, 2.0], [{"w": np.ones(2)}, {"w": np.ones(2)}])
    assert calls == [2]  # lincomb runs the ufunc kernel (with out=) on NumPy


def test_numpy_load_skips_layouts_of_contiguous_and_separate_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_scale's fk.load_into row: contiguous destinations have no self-overlap, and sources
    # owned by other ndarrays cannot overlap them, so no memory layout is computed at all
    from functorkit.adapters import numpy as npad

    def no_layout(x: Any) -> Any:
        raise AssertionError("a memory layout was computed")

    monkeypatch.setattr(npad.Adapter, "memory_layout", lambda self, x: no_layout(x))
    monkeypatch.setattr("functorkit._alias.memory_layout", no_layout)
    monkeypatch.setattr("functorkit._load.memory_layout", no_layout)
    base = np.zeros(6)
    dst = {"a": base[:3], "b": base[3:]}  # views of one buffer, as re(p) makes them
    fk.load_into(dst, {"a": np.ones(3), "b": np.full(3, 2.0)})
    np.testing.assert_array_equal(base, [1.0, 1.0, 1.0, 2.0, 2.0, 2.0])
    # the controls: a source inside `dst`'s memory, and a strided destination, are looked at
    with pytest.raises(AssertionError, match="a memory layout was computed"):
        fk.load_into(dst, {"a": base[3:], "b": np.zeros(3)})
    with pytest.raises(AssertionError, match="a memory layout was computed"):
        fk.load_into({"a": base[::2]}, {"a": np.zeros(3)})


def test_torch_overrides_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    p = torch.arange(6.0)
    ad = adapter_of(p)
    assert type(ad) is tad.Adapter
    assert ad.array_types(torch.Tensor) == frozenset({torch.Tensor, torch.nn.Parameter})
    assert not ad.readable(torch.device("meta"))
    seen: list[str] = []
    real_strided, real_split = torch.Tensor.as_strided, torch.Tensor.split_with_sizes

    def as_strided(self: Any, *a: Any) -> Any:
        seen.append("as_strided")
        return real_strided(self, *a)

    def split(self: Any, *a: Any) -> Any:
        seen.append("split")
        return real_split(self, *a)

    monkeypatch.setattr(torch.Tensor, "as_strided", as_strided)
    monkeypatch.setattr(torch.Tensor, "split_with_sizes", split)
    f = _exec_views(ad, p, [0, 2], [(2,), (2, 2)])
    f(p)
    assert seen == ["as_strided", "as_strided"]  # plain tensor: the cheapest views
    seen.clear()
    f(p.clone().requires_grad_(True))
    assert seen == ["split"]  # autograd: one split (one concatenation in backward)
    seen.clear()
    calls: list[bool] = []
    real_add = tad.Adapter.add

    def spy(self: Any, acc: Any, x: Any, inplace: bool) -> Any:
        calls.append(inplace)
        return real_add(self, acc, x, inplace)

    monkeypatch.setattr(tad.Adapter, "add", spy)
    fk.mean([{"w": torch.ones(2)}] * 3)
    assert calls == [True]  # mean accumulates in place on plain tensors


# ------------------------------------------------------------------ feature detection fallbacks


def test_functorch_detection_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    assert tad.is_functorch_wrapped is not tad._all_wrapped  # detected on this torch
    monkeypatch.setattr(torch._C, "_functorch", None)
    assert tad._detect_functorch() is tad._all_wrapped
    monkeypatch.setattr(tad, "is_functorch_wrapped", tad._all_wrapped)
    ad = adapter_of(torch.ones(2))
    assert not ad.inplace_ok([torch.ones(2)])  # fallback: always the out-of-place path
    out = fk.mean([{"w": torch.ones(2)}, {"w": torch.full((2,), 3.0)}])
    torch.testing.assert_close(out["w"], torch.full((2,), 2.0))
    p = torch.arange(4.0)
    views = _exec_views(ad, p, [0, 2], [(2,), (2,)])(p)  # fallback: split_with_sizes, still views
    assert views[1].untyped_storage().data_ptr() == p.untyped_storage().data_ptr()


def test_python_dispatch_detection_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as tad

    assert tad.has_python_dispatch is not tad._subclass_has_no_memory  # detected on this torch
    monkeypatch.delattr(torch._C, "_dispatch_keys")
    fallback = tad._detect_python_dispatch()
    assert fallback is tad._subclass_has_no_memory
    monkeypatch.setattr(tad, "has_python_dispatch", fallback)

    class Sub(torch.Tensor):
        pass

    ad = adapter_of(torch.ones(2))
    assert ad.memory_extent(torch.ones(2)) is not None  # plain tensors are unaffected
    assert ad.memory_extent(torch.ones(2).as_subclass(Sub)) is None
    a = torch.ones(2, 3)
    with pytest.raises(fk.StructureError, match="share memory"):
        fk.destructure({"a": a, "t": a.t()})


# ------------------------------------------------------------------ the core holds no backend code

_FAMILY_NAMES = {"torch", "jax", "cupy", "dask", "numpy", "array_api_strict"}
_CORE = sorted(p.name for p in ROOT.glob("_*.py") if p.name != "__init__.py")


def _violations(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text())
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    table: set[int] = set()  # the node-adapter table of _registry (module name -> adapter module)
    for n in ast.walk(tree):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id in ("_ADAPTERS", "FAMILIES") for t in targets):
                table.update(id(c) for c in ast.walk(n))
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out += [
                f"line {n.lineno}: import {a.name}"
                for a in n.names
                if a.name.split(".")[0] in _FAMILY_NAMES - {"numpy"}
            ]
        elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] in _FAMILY_NAMES - {"numpy"}:
            out.append(f"line {n.lineno}: from {n.module} import")
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings | table:
            v = n.value
            if (
                v in _FAMILY_NAMES
                or (v.startswith("array_api_compat.") and v != "array_api_compat.")
                or v.startswith("torch.")
            ):
                out.append(f"line {n.lineno}: family name {v!r}")
    return out


@pytest.mark.parametrize("name", _CORE)
def test_core_has_no_backend_code(name: str) -> None:
    assert _violations(ROOT / name) == []


def test_scan_catches_backend_code(tmp_path: pathlib.Path) -> None:
    bad = tmp_path / "_bad.py"
    bad.write_text('"""torch is fine in a docstring."""\nimport torch\n\ndef f(fam):\n    return fam == "cupy"\n')
    assert len(_violations(bad)) == 2


# ------------------------------------------------------------------ the helpers home (_xp)


def test_one_device_rule() -> None:
    assert same_device(None, "cpu")
    assert same_device("cpu", None)
    assert same_device(None, None)
    assert same_device("cpu", "cpu")
    assert not same_device("cpu", "cuda:0")
    assert _policy.same_device is same_device  # one function, re-exported


def test_is_complex_array_and_kind() -> None:
    import array_api_compat.numpy as npx

    assert is_complex(np.ones(2, dtype=np.complex64))
    assert not is_complex(np.ones(2))
    assert is_complex(Kind(npx, npx.complex128, "cpu"))
    assert _policy.is_complex is is_complex


def test_big_endian_is_described() -> None:
    be = np.dtype(">f8") if np.little_endian else np.dtype("<f8")
    assert describe_dtype(be) != describe_dtype(np.dtype("f8"))
    assert "endian" in describe_dtype(be)
    _flat, re = fk.destructure({"w": np.ones(3)})
    with pytest.raises(fk.PolicyError, match="endian"):
        re(np.arange(3.0).astype(be))


def test_every_policy_rule_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import array_api_compat.numpy as npx

    read: set[tuple[str, str]] = set()

    class Row(dict):  # type: ignore[type-arg]
        def __init__(self, situation: str, row: dict[str, str]) -> None:
            super().__init__(row)
            self.situation = situation

        def __getitem__(self, policy: str) -> str:
            read.add((self.situation, policy))
            return str(super().__getitem__(policy))

    rules = {s: Row(s, r) for s, r in _policy.RULES.items()}
    monkeypatch.setattr(_policy, "RULES", rules)
    f64 = Kind(npx, npx.float64, "cpu")
    kinds = [
        f64,
        Kind(npx, npx.float32, "cpu"),
        Kind(npx, npx.complex128, "cpu"),
        Kind(npx, npx.float64, "other"),
        Kind(np, np.float64, "cpu"),  # another namespace
    ]
    for pol in _policy.POLICIES:
        for what in ("dtype", "device", "namespace"):
            _policy.decide_mixed(pol, what)
        _policy.decide_unknown_holder(pol)
        for k in kinds:
            _policy.decide_rebuild(pol, f64, k, False)
            _policy.decide_flatten(pol, k, f64)
    assert read == {(s, p) for s in _policy.RULES for p in _policy.POLICIES}


# ------------------------------------------------------------------ reliability: clear errors


def test_mean_and_lincomb_of_a_single_model() -> None:
    m = {"w": np.ones(2)}
    with pytest.raises(TypeError, match=r"fk.mean: `models` must be a list .* got a dict, .*fk.mean\(\[model\]\)"):
        fk.mean(m)
    with pytest.raises(TypeError, match=r"fk.lincomb: `models` must be a list .* got a dict"):
        fk.lincomb([1, 1], m)
    with pytest.raises(TypeError, match=r"fk.lincomb: `coefficients` must be a list of numbers.* got a float"):
        fk.lincomb(1.0, [m])
    with pytest.raises(TypeError, match=r"`models` must be a list .* got a ndarray"):
        fk.mean(np.ones((2, 2)))
    np.testing.assert_array_equal(fk.mean([np.ones(2), np.zeros(2)]), [0.5, 0.5])  # bare arrays are models


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_np_matrix_is_refused_with_the_path() -> None:
    m = {"layer": {"w": np.matrix([[1.0, 2.0]])}}
    for call in (
        lambda: fk.destructure(m),
        lambda: fk.add(m, m),
        lambda: fk.copy(m),
        lambda: fk.load_into(m, m),
    ):
        with pytest.raises(TypeError, match=r"np\.matrix") as info:
            call()
        text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
        assert "layer.w" in text
        assert "np.asarray" in text


@pytest.mark.skipif(not importable("torch"), reason="needs torch")
def test_out_problem_names_overlap() -> None:
    import torch

    ad = adapter_of(torch.zeros(1))
    assert "share one memory location" in (ad.out_problem(torch.zeros(1).expand(4)) or "")
    assert "share one memory location" in (ad.out_problem(torch.zeros(4).as_strided((3,), (0,))) or "")
    assert ad.out_problem(torch.zeros(4)[::2]) is None
    ro = np.zeros(3)
    ro.flags.writeable = False
    assert "read-only" in (adapter_of(ro).out_problem(ro) or "")


def test_torch_small_flat_vectors_are_one_concatenation(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_flat "mlp, torch" destructure(model) and re.flatten(model, out=buf) rows: a small vector
    # of plain tensors of its dtype is one flatten_dense_tensors (destructure) or one
    # torch.cat(..., out=) (re.flatten); each switched off (CAT_MAX_BYTES, CAT_OUT_MAX_BYTES = 0)
    # must show here and give the same values
    torch = pytest.importorskip("torch")
    from functorkit.adapters import _torch_flat as tf

    assert tf.flatten_dense is not tf._cat_raveled  # detected on this torch
    model = {
        "w": torch.randn(3, 4, requires_grad=True),
        "b": torch.nn.Parameter(torch.randn(4)),
        "t": torch.randn(2, 3).t(),
    }
    cats: list[int] = []
    real_flatten = tf.flatten_dense

    def flatten(xs: Any) -> Any:
        cats.append(len(xs))
        return real_flatten(xs)

    outs: list[bool] = []  # one entry per torch.cat(..., out=)
    real_cat = torch.cat

    def cat(*a: Any, **k: Any) -> Any:
        if k.get("out") is not None:
            outs.append(True)
        return real_cat(*a, **k)

    monkeypatch.setattr(tf, "flatten_dense", flatten)
    monkeypatch.setattr(torch, "cat", cat)
    got = [fk.destructure(model)[0] for _ in range(3)]  # the first call and two through the plan
    assert cats == [3, 3, 3]
    assert outs == []
    for flat in got:
        assert not flat.requires_grad
        assert flat.grad_fn is None
        assert flat.is_contiguous()
        assert flat.data_ptr() not in {x.data_ptr() for x in model.values()}
    re = fk.destructure(model)[1]
    buf = torch.full((len(re),), -1.0)
    assert re.flatten(model, out=buf) is buf
    assert re.flatten(model, out=buf) is buf  # (and through re.flatten's kept decisions)
    assert outs == [True, True]
    assert not buf.requires_grad
    monkeypatch.setattr(tf, "CAT_MAX_BYTES", 0)
    monkeypatch.setattr(tf, "CAT_OUT_MAX_BYTES", 0)
    ref, _ = fk.destructure(model)
    buf2 = torch.full((len(re),), -1.0)
    re.flatten(model, out=buf2)
    assert cats == [3, 3, 3, 3]  # (the first call's count: the plan's destructure of `re`)
    assert outs == [True, True]
    for flat in [*got, buf]:
        assert torch.equal(flat, ref)
    assert torch.equal(buf2, ref)
    assert torch.equal(tf._cat_raveled(list(model.values())), ref)  # the fallback: the same values
    monkeypatch.setattr(tf, "CAT_MAX_BYTES", 16 << 20)
    monkeypatch.setattr(tf, "CAT_OUT_MAX_BYTES", 16 << 20)
    lone = torch.arange(4.0)
    for _ in range(3):  # a lone tensor: still a new vector (flatten_dense_tensors would view it)
        single, _ = fk.destructure({"x": lone})
        assert single.data_ptr() != lone.data_ptr()
        assert torch.equal(single, lone)
    # not taken: a dtype conversion (policy "model"), a subclass
    mixed = {"a": torch.ones(2), "b": torch.ones(2, dtype=torch.float64)}
    _, re_mixed = fk.destructure(mixed, policy="model")
    re_mixed.flatten(mixed, out=torch.empty(4, dtype=torch.float64))

    class Sub(torch.Tensor):
        pass

    fk.destructure({"a": torch.ones(2).as_subclass(Sub)})
    assert cats == [3, 3, 3, 3]
    assert outs == [True, True]
