"""check_no_aliases: two different arrays sharing memory are found, never silently untied."""

from __future__ import annotations

import itertools
import pathlib
import random
import sys
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import functorkit as fk
from functorkit._alias import check_no_aliases, memory_layout

from conftest import Backend, namespace_for

K = fk.KeyPath
VIEW_LIBS = ["numpy", "numpy_readonly", "torch", "array_api_strict"]  # libraries whose arrays can be views


def entries(**arrays: Any) -> list[tuple[fk.KeyPath, Any]]:
    return [(K(tuple(name.split("__"))), a) for name, a in arrays.items()]


def raises(**arrays: Any) -> str:
    with pytest.raises(fk.StructureError) as info:
        check_no_aliases(entries(**arrays), "fk.destructure")
    return str(info.value)


def passes(**arrays: Any) -> None:
    check_no_aliases(entries(**arrays), "fk.destructure")


def xp_of(lib: str) -> Any:
    xp = namespace_for(Backend(lib))
    if lib == "numpy_readonly":
        from conftest import ReadOnlyNumpy

        return ReadOnlyNumpy(xp)
    return xp


def matrix(xp: Any, n: int = 3, m: int = 4) -> Any:
    return xp.reshape(xp.arange(n * m, dtype=xp.float64), (n, m))


# ------------------------------------------------------- views that alias


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_transpose_view_raises_naming_both_paths_and_fk_transpose(lib: str) -> None:
    xp = xp_of(lib)
    W = matrix(xp)
    msg = raises(enc__weight=W, dec__weight=xp.matrix_transpose(W))
    assert msg.startswith("at enc.weight and dec.weight: two different arrays share memory")
    assert "one is a transpose view of the other" in msg
    assert "fk.Transpose(enc.weight)" in msg
    assert "fk.destructure would silently untie them" in msg


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_square_transpose_is_recognised(lib: str) -> None:
    xp = xp_of(lib)
    W = matrix(xp, 3, 3)
    assert "transpose view" in raises(a=W, b=xp.matrix_transpose(W))


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_paths_come_in_walk_order_whatever_the_memory_order(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(10, dtype=xp.float64)
    msg = raises(late=a[5:], early=a[:6])
    assert msg.startswith("at late and early:")


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_overlapping_slices_raise(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(10, dtype=xp.float64)
    assert "overlaps" in raises(a=a, b=a[1:])
    assert "overlaps" in raises(a=a[:6], b=a[5:])
    m = matrix(xp, 4, 4)
    raises(a=m[1:3, 1:3], b=m[2, :])
    raises(a=m[:, 1], b=m[3, :])  # non-contiguous column vs a row: meet at one element


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_same_elements_viewed_twice_raise(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(6, dtype=xp.float64)
    msg = raises(a=a, b=xp.reshape(a, (2, 3)))
    assert "two views of the same elements" in msg
    raises(a=a, b=a[:])
    raises(a=a[2:3], b=xp.reshape(a, (2, 3))[0, 2:])


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_broadcast_view_raises(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(4, dtype=xp.float64)
    raises(a=a, b=xp.broadcast_to(a, (3, 4)))
    raises(a=a[1:2], b=xp.broadcast_to(a[1:2], (5,)))


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_zero_d_view_raises(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(4, dtype=xp.float64)
    raises(a=a, b=a[2, ...])


# -------------------------------------------------------- not aliases


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_interleaved_views_sharing_no_element_pass(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(12, dtype=xp.float64)
    passes(even=a[::2], odd=a[1::2])
    passes(**{f"v{i}": a[i::3] for i in range(3)})
    m = matrix(xp, 4, 6)
    passes(**{f"c{j}": m[:, j] for j in range(6)})  # columns: every extent overlaps every other
    passes(left=m[:, :3], right=m[:, 3:])
    passes(**{f"b{i}{j}": m[2 * i : 2 * i + 2, 3 * j : 3 * j + 3] for i in range(2) for j in range(2)})


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_adjacent_slices_pass(lib: str) -> None:
    xp = xp_of(lib)
    p = xp.arange(10, dtype=xp.float64)  # like the views `re(p)` hands out
    passes(w=xp.reshape(p[:6], (2, 3)), b=p[6:9], c=p[9:])


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_separate_arrays_pass(lib: str) -> None:
    xp = xp_of(lib)
    a = matrix(xp)
    passes(a=a, b=xp.asarray(a, copy=True), c=matrix(xp), d=xp.zeros(3))


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_the_same_object_twice_is_a_tie_not_an_alias(lib: str) -> None:
    xp = xp_of(lib)
    a = matrix(xp)
    check_no_aliases([(K(("enc",)), a), (K(("dec",)), a)], "fk.load_into")
    with pytest.raises(fk.StructureError, match="at enc and dec2"):
        check_no_aliases([(K(("enc",)), a), (K(("dec",)), a), (K(("dec2",)), a[1:, :])], "fk.load_into")


@pytest.mark.parametrize("lib", VIEW_LIBS)
def test_zero_size_views_pass(lib: str) -> None:
    xp = xp_of(lib)
    a = xp.arange(6, dtype=xp.float64)
    passes(a=a, empty=a[2:2], empty2=a[3:3])


def test_non_arrays_are_ignored() -> None:
    a = np.arange(3.0)
    check_no_aliases([(K(("a",)), a), (K(("n",)), 3), (K(("s",)), "x"), (K(("none",)), None), (K(("l",)), [a])], "t")


@pytest.mark.parametrize("lib", ["jax", "dask"])
def test_immutable_backends_never_raise(lib: str) -> None:
    xp = namespace_for(Backend(lib))
    a = matrix(xp)
    passes(a=a, t=xp.matrix_transpose(a), s=a[1:], b=xp.broadcast_to(a[0], (2, 4)), same=a[:])
    assert memory_layout(a) is None


# ----------------------------------------------------------- NumPy only


def test_negative_strides() -> None:
    a = np.arange(6.0)
    raises(a=a, r=a[::-1])
    raises(a=a[:4], r=a[::-1][:3])  # r holds a[5], a[4], a[3]
    passes(a=a[:3], r=a[::-1][:3])
    passes(even=a[::-2], odd=a[-2::-2])  # a[5], a[3], a[1] vs a[4], a[2], a[0]
    m = np.arange(12.0).reshape(3, 4)
    raises(m=m, f=m[::-1, ::-1])


def test_dtype_views_and_unaligned_memory() -> None:
    buf = np.zeros(64, dtype=np.uint8)
    f = np.ndarray((4,), dtype=np.float64, buffer=buf, offset=1)  # bytes 1..32
    raises(f=f, byte=buf[32:33])
    passes(f=f, byte=buf[33:34], first=buf[0:1])
    raises(i=buf[:16].view(np.int32), h=buf[14:20].view(np.int16))
    passes(i=buf[:16].view(np.int32)[::2], h=buf[4:8].view(np.int16))  # bytes 0-3, 8-11 vs 4-7


def test_self_overlapping_array_is_not_an_alias_of_itself() -> None:
    a = np.arange(10.0)
    win = np.lib.stride_tricks.sliding_window_view(a, 4)  # overlaps itself, 7 x 4
    passes(win=win)
    raises(win=win, last=a[9:])
    other = np.arange(10.0)
    passes(win=win, other=other[::2], more=other[1::2])


def test_foreign_buffers_are_checked_against_owned_arrays() -> None:
    a = np.arange(8.0)
    alias = np.frombuffer(a, dtype=np.float64)  # base is not an ndarray
    raises(a=a, alias=alias)
    raises(a=a, strided=np.lib.stride_tricks.as_strided(a, shape=(2,), strides=(32,)))


def test_many_views_of_one_buffer() -> None:
    """Pathological layouts stay exact: thousands of views whose extents all overlap."""
    w = np.zeros((50, 2000))
    cols = {f"c{i}": w[:, i] for i in range(2000)}
    passes(**cols)
    raises(**cols, row=w[49, 1999:])
    b = np.zeros((200, 200))
    blocks = {f"b{i}_{j}": b[5 * i : 5 * i + 5, 5 * j : 5 * j + 5] for i in range(40) for j in range(40)}
    passes(**blocks)
    raises(**blocks, spill=b[4:6, 199])
    a = np.zeros(100_000)
    inter = {f"i{i}": a[i::1000] for i in range(1000)}
    passes(**inter)
    raises(**inter, odd=a[1001:1002])
    grid = np.zeros((300, 300))
    lattice = {f"g{i}{j}": grid[i::10, j::10] for i in range(10) for j in range(10)}
    passes(**lattice)
    raises(**lattice, diag=np.diagonal(grid)[3:4])


def _bytes(a: np.ndarray) -> set[int]:
    if a.size == 0:
        return set()
    base = a.__array_interface__["data"][0]
    idx = np.indices(a.shape).reshape(a.ndim, -1)
    offsets = base + (np.asarray(a.strides)[:, None] * idx).sum(axis=0)
    return {int(o) + k for o in offsets for k in range(a.itemsize)}


def test_agrees_with_brute_force_on_random_views() -> None:
    rng = random.Random(1234)
    buf = np.zeros(600, dtype=np.uint8)
    for _ in range(400):
        arrays = []
        for _ in range(rng.choice([2, 3, 4, 6])):
            isz = rng.choice([1, 2, 4, 8])
            shape = tuple(rng.randrange(1, 5) for _ in range(rng.randrange(1, 4)))
            strides = tuple(rng.choice([0, 1, 2, 4, 8, 12, 16, 24]) * rng.choice([1, -1]) for _ in shape)
            arrays.append(
                np.ndarray(
                    shape, dtype=np.dtype(f"u{isz}"), buffer=buf, offset=250 + rng.randrange(40), strides=strides
                )
            )
        expected = any(_bytes(x) & _bytes(y) for x, y in itertools.combinations(arrays, 2))
        try:
            check_no_aliases([(K((i,)), x) for i, x in enumerate(arrays)], "t")
            got = False
        except fk.StructureError:
            got = True
        assert got == expected, [(x.shape, x.strides, x.itemsize) for x in arrays]


# ----------------------------------------------------------- torch only


def test_torch_views() -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 4, dtype=torch.float64)
    assert "transpose view" in raises(t=t, tt=t.t())
    raises(t=t, d=t.detach())
    raises(t=t, row=t[1])
    raises(t=t, e=t[0].expand(5, 4))
    passes(even=t[:, ::2], odd=t[:, 1::2])
    p = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    raises(p=p, data=p.data)


def test_torch_conj_and_neg_views_alias() -> None:
    torch = pytest.importorskip("torch")
    c = torch.randn(3, dtype=torch.complex128)
    assert c.conj().is_conj()
    raises(c=c, conj=c.conj())
    raises(c=c, imag=c.conj().imag)  # a neg view of c's memory
    passes(c=c, resolved=c.conj().resolve_conj())


def test_torch_without_plain_memory_is_skipped() -> None:
    torch = pytest.importorskip("torch")
    t = torch.randn(3, 4, dtype=torch.float64)
    passes(t=t, sparse=t.to_sparse())
    m = torch.empty(3, 4, device="meta")
    passes(m=m, mt=m.t(), m1=m[1:])

    seen: list[int] = []

    def f(x: Any) -> Any:  # inside vmap the tensors are functorch wrappers without storage
        check_no_aliases([(K(("x",)), x), (K(("y",)), x[1:])], "t")
        seen.append(1)
        return x

    torch.func.vmap(f)(torch.randn(2, 3))
    assert seen == [1]


def test_torch_fake_tensors_are_skipped_without_warnings() -> None:
    pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        import torch

        ft = torch.empty(3, 4)
        passes(ft=ft, t=ft.t())


def test_numpy_and_torch_share_host_memory() -> None:
    torch = pytest.importorskip("torch")
    a = np.arange(6.0)
    raises(a=a, t=torch.from_numpy(a))
    raises(t=torch.from_numpy(a)[2:], v=a[:3])
    passes(a=a[:3], t=torch.from_numpy(a)[3:], other=np.zeros(3))


# ------------------------------------------------------- array-api-strict


def test_strict_devices_share_host_memory() -> None:
    """array-api-strict's devices are simulated in host memory: a shared buffer is an alias."""
    xp = pytest.importorskip("array_api_strict")
    a = xp.asarray([1.0, 2.0, 3.0])
    b = xp.asarray(a, device=xp.Device("device1"))
    assert b.device != a.device
    assert np.shares_memory(a._array, b._array)  # asarray re-labels the device without copying
    raises(a=a, b=b)
    passes(a=a, moved=a.to_device(xp.Device("device1")))  # to_device copies


# ------------------------------------------------- devices (CuPy path, no GPU needed)


class _Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _Dev:
    def __init__(self, i: int) -> None:
        self.id = i


class FakeCupy:
    """Just the attributes the check reads from a cupy.ndarray; its memory is never touched."""

    def __init__(self, ptr: int, device: int, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        self.data, self.device, self.shape, self.strides = _Ptr(ptr), _Dev(device), shape, strides
        self.itemsize = 8
        self.size = int(np.prod(shape))


FakeCupy.__module__ = "cupy._core.fake"


@pytest.fixture
def fake_cupy_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """FakeCupy arrays get the CuPy adapter (which imports no cupy), as real ones would."""
    from functorkit.adapters import _families
    from functorkit.adapters.cupy import Adapter

    monkeypatch.setitem(_families._BY_TYPE, FakeCupy, Adapter(None))


@pytest.mark.usefixtures("fake_cupy_adapter")
def test_equal_addresses_on_different_devices_are_not_aliases() -> None:
    base = 1 << 40
    passes(a=FakeCupy(base, 0, (4,), (8,)), b=FakeCupy(base, 1, (4,), (8,)))
    raises(a=FakeCupy(base, 0, (4,), (8,)), b=FakeCupy(base + 8, 0, (4,), (8,)))
    passes(a=FakeCupy(base, 0, (4,), (16,)), b=FakeCupy(base + 8, 0, (4,), (16,)))
    assert "transpose view" in raises(a=FakeCupy(base, 0, (2, 3), (24, 8)), b=FakeCupy(base, 0, (3, 2), (8, 24)))


def test_torch_parameters_are_proved_disjoint_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # bench_walk's module fk.destructure(m) row: a module's separate parameters are proved disjoint
    # by the adapter's C-level passes over data_ptr/nbytes, with no per-tensor extent; views still
    # get the full check and its message
    torch = pytest.importorskip("torch")
    from functorkit.adapters import torch as ta

    calls: list[int] = []
    real = ta.Adapter.memory_extent

    def counting(self: Any, x: Any) -> Any:
        calls.append(1)
        return real(self, x)

    monkeypatch.setattr(ta.Adapter, "memory_extent", counting)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    flat, _ = fk.destructure(net)
    assert flat.shape == (26,)
    assert calls == []  # the one-pass proof was taken
    w = torch.zeros(4, 4)
    with pytest.raises(fk.StructureError, match=r"at a and b: two different arrays share memory"):
        fk.destructure({"a": w[:2], "b": w[1:3]})
    assert calls  # overlapping ranges: every tensor looked at
