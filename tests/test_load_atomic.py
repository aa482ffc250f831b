"""load_into is all or nothing: whatever fails, `dst` is left bit-for-bit as it was."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk
from functorkit.adapters import adapter_of

from conftest import Backend, namespace_for, to_numpy

MUTABLE = [Backend.NUMPY, Backend.TORCH, Backend.ARRAY_API_STRICT]


def _models(xp: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    dst = {
        "a": xp.asarray([1.0, 2.0], dtype=xp.float64),
        "b": [xp.asarray([[3.0, 4.0]], dtype=xp.float32), xp.asarray([5], dtype=xp.int64)],
        "c": xp.asarray([6.0, 7.0, 8.0], dtype=xp.float64),
    }
    src = {
        "a": xp.asarray([10.0, 20.0], dtype=xp.float64),
        "b": [xp.asarray([[30.0, 40.0]], dtype=xp.float64), xp.asarray([50], dtype=xp.int64)],
        "c": xp.asarray([60.0, 70.0, 80.0], dtype=xp.float64),
    }
    return dst, src


def _snapshot(tree: Any) -> list[bytes]:
    return [to_numpy(x).tobytes() for x in fk.leaves(tree)]


class Boom(Exception):
    pass


@pytest.mark.parametrize("backend_", MUTABLE, ids=lambda b: b.value)
@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_failure_at_every_write_leaves_dst_unchanged(
    backend_: Backend, exc: type[BaseException], monkeypatch: pytest.MonkeyPatch
) -> None:
    xp = namespace_for(backend_)
    dst, src = _models(xp)
    before = _snapshot(dst)
    cls = type(adapter_of(dst["a"]))
    real_write = cls.write
    n_writes = 4
    for k in range(1, n_writes + 1):
        calls = [0]

        def write(self: Any, d: Any, s: Any, k: int = k, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] == k:
                if k > 1:  # a partial write first: the failing array is half-written too
                    real_write(self, d, s)
                raise exc("injected")
            real_write(self, d, s)

        monkeypatch.setattr(cls, "write", write)
        with pytest.raises(exc, match="injected"):
            fk.load_into(dst, src)
        assert _snapshot(dst) == before, f"dst changed after a failure at write {k}"
    monkeypatch.setattr(cls, "write", real_write)
    assert fk.load_into(dst, src) is dst  # and without failures every value arrives
    np.testing.assert_array_equal(to_numpy(dst["c"]), [60.0, 70.0, 80.0])


@pytest.mark.parametrize(
    "bad",
    [
        np.array([1.0, "x"], dtype=object),
        np.array(["1.5", "oops"]),
        np.zeros(2, dtype=[("f", "f8")]),
    ],
    ids=["object-x", "unparsable-strings", "structured"],
)
def test_unconvertible_numpy_sources(bad: Any) -> None:
    dst = {"a": np.ones(2), "z": np.zeros(2)}
    before = _snapshot(dst)
    with pytest.raises((fk.PolicyError, TypeError, ValueError), match=r"at z"):
        fk.load_into(dst, {"a": np.full(2, 9.0), "z": bad})
    assert _snapshot(dst) == before


def test_torch_sources_that_are_not_dense() -> None:
    torch = pytest.importorskip("torch")
    dst = {"a": torch.ones(2, 2), "w": torch.zeros(2, 2)}
    before = _snapshot(dst)
    sparse = torch.eye(2).to_sparse()
    with pytest.raises(fk.PolicyError, match=r"at w: .*sparse"):
        fk.load_into(dst, {"a": torch.full((2, 2), 9.0), "w": sparse})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation is deprecated; such tensors still exist
        q = torch.quantize_per_tensor(torch.ones(2, 2), 0.1, 0, torch.qint8)
    with pytest.raises(fk.PolicyError, match=r"at w: .*quantized"):
        fk.load_into(dst, {"a": torch.full((2, 2), 9.0), "w": q})
    assert _snapshot(dst) == before


def test_torch_nested_source() -> None:
    torch = pytest.importorskip("torch")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(2)])
    dst = {"a": torch.ones(2), "w": torch.zeros(2, 2)}
    before = _snapshot(dst)
    with pytest.raises((fk.PolicyError, fk.StructureError), match=r"at w"):
        fk.load_into(dst, {"a": torch.full((2,), 9.0), "w": nested})
    assert _snapshot(dst) == before


def test_torch_subclass_whose_copy_raises() -> None:
    torch = pytest.importorskip("torch")

    class NoCopy(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.Tensor.copy_:
                msg = "NoCopy refuses copy_"
                raise RuntimeError(msg)
            return super().__torch_function__(func, types, args, kwargs or {})

    dst = {"a": torch.ones(2), "w": torch.zeros(2)}
    before = _snapshot(dst)
    with pytest.raises(fk.PolicyError, match=r"at w: .*NoCopy refuses"):
        fk.load_into(dst, {"a": torch.full((2,), 9.0), "w": torch.ones(2).as_subclass(NoCopy)})
    assert _snapshot(dst) == before


def test_torch_meta_destination_refuses_real_values() -> None:
    torch = pytest.importorskip("torch")
    dst = {"w": torch.zeros(2, device="meta")}
    with pytest.raises(ValueError, match=r"at w: `dst` holds an array without storage"):
        fk.load_into(dst, {"w": torch.ones(2)})


def test_large_numpy_backups_restore(monkeypatch: pytest.MonkeyPatch) -> None:
    """Backups of 1 MiB or more share one allocation (the NumPy adapter's ``backups``)."""
    dst = {"a": np.arange(100_000.0), "b": np.arange(100_000, dtype=np.float32)[::-1].copy()}
    before = _snapshot(dst)
    cls = type(adapter_of(dst["a"]))
    real_write = cls.write
    calls = [0]

    def write(self: Any, d: Any, s: Any) -> None:
        calls[0] += 1
        real_write(self, d, s)
        if calls[0] == 2:
            raise Boom("injected")

    monkeypatch.setattr(cls, "write", write)
    with pytest.raises(Boom):
        fk.load_into(dst, {"a": np.zeros(100_000), "b": np.ones(100_000)})
    assert _snapshot(dst) == before
