"""NumPy arrays: method calls and ``np.copyto`` instead of namespace functions (faster per call)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._base import _HOST, Layout, MethodSlices, _little_endian, _size, extent, normalise_layout

__all__ = ["Adapter"]


#: above this many leaves, ``fill`` concatenates in one call
_SMALL = 1 << 16  # elements: below this, fill concatenates
_MANY = 256


class Adapter(MethodSlices):
    family = "numpy"
    autodiff = False
    one_device = True  # host memory only

    def device(self, x: Any) -> Any:
        """Always ``"cpu"``, without asking array_api_compat (bench_flat ``re(p)`` rows: per-call cost)."""
        return "cpu"

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """No device test (NumPy has one device) and an identity test of the dtype first
        (bench_flat ``re(p)`` rows)."""
        glb.update(T=ftype, S=(n,), D=dtype)
        return "type(p) is not T or p.shape != S or (p.dtype is not D and p.dtype != D)"

    def empty(self, dtype: Any, device: Any, n: int) -> Any:
        return np.empty(n, dtype=dtype)

    def new_flat(
        self, dtype: Any, device: Any, n: int, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]
    ) -> Any:
        """``empty`` + ``np.copyto`` per leaf (bench_flat ``destructure`` rows: no temporaries)."""
        out = np.empty(n, dtype=dtype)
        self.fill(out, leaves, offsets, shapes)
        return out

    def fill(self, out: Any, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]) -> None:
        """``np.copyto`` into reshaped slices (bench_flat ``re.flatten(out=)`` rows: no temporaries);
        many leaves, or a small vector: one ``np.concatenate(..., out=out)`` (the per-leaf Python
        cost dominates there: bench_flat's 1,000,000-leaf rows and its MLP ``destructure(model)``
        row; a non-contiguous leaf then costs a temporary copy, which a small vector can afford)."""
        if not leaves:
            return
        if len(leaves) > _MANY or out.shape[0] <= _SMALL:
            np.concatenate(leaves, axis=None, out=out, casting="unsafe")
            return
        for x, o, s in zip(leaves, offsets, shapes, strict=True):
            np.copyto(out[o : o + _size(s)].reshape(s), x, casting="unsafe")

    def copy(self, x: Any) -> Any:
        return x.copy()

    def clone_leaf(self, x: Any) -> Any:
        """Keeps the ndarray subclass and memory order, and comes back writeable."""
        return np.array(x, copy=True, order="K", subok=True)

    def write_problem(self, x: Any) -> str | None:
        """Read-only arrays (``flags.writeable`` False) cannot be written."""
        if not x.flags.writeable:
            return "the array is read-only"
        return None

    def read_problem(self, x: Any) -> str | None:
        """Structured (record) dtypes hold no single number per element."""
        if x.dtype.kind == "V":
            return f"it has the structured dtype {x.dtype}, not a numeric one"
        return None

    def stage(self, dst: Any, src: Any) -> Any:
        """One ``np.array(src, dtype=dst.dtype)`` over the source's host memory (the generic path
        goes through DLPack, which NumPy object and string arrays lack)."""
        if type(src) is np.ndarray and src.dtype == dst.dtype:
            return src
        if not isinstance(src, np.ndarray):
            from ._base import adapter_of

            sa = adapter_of(src)
            host = sa.host_view(sa.detach(src))
            if host is None:
                return super().stage(dst, src)
            src = host
        return np.array(src, dtype=dst.dtype, copy=True)

    def write(self, dst: Any, src: Any) -> None:
        np.copyto(dst, src)

    def backup(self, x: Any) -> Any:
        return np.array(x, copy=True)

    def backups(self, xs: list[Any]) -> list[Any]:
        """Views of one allocation (one large ``np.empty`` gets huge pages: many separate copies
        paid a first-touch page fault per 4 KiB page, ~5x the copy itself in load_into timings)."""
        total = sum(x.nbytes for x in xs)
        if total < 1 << 20:
            return [self.backup(x) for x in xs]
        arena = np.empty(total, dtype=np.uint8)
        out = []
        o = 0
        for x in xs:
            b = arena[o : o + x.nbytes].view(x.dtype).reshape(x.shape)
            np.copyto(b, x)
            out.append(b)
            o += x.nbytes
        return out

    def host_view(self, x: Any) -> Any:
        return x

    def memory_extent(self, x: Any) -> tuple[tuple[str, int], int, int] | None:
        if x.size == 0 or x.itemsize == 0:
            return None
        lo, hi = extent(x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
        return _HOST, lo, hi

    def overlap_problem(self, x: Any) -> str | None:
        """A C- or Fortran-contiguous array has no two elements in one place: no layout to compute
        (bench_scale ``fk.load_into`` row)."""
        if x.flags.forc:
            return None
        return super().overlap_problem(x)

    def memory_layout(self, x: Any) -> Layout | None:
        if x.size == 0:
            return None
        return normalise_layout(_HOST, x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)

    def byte_strides(self, x: Any) -> tuple[int, ...] | None:
        return tuple(x.strides)

    def inplace_ok(self, arrays: Sequence[Any]) -> bool:
        """Fresh NumPy results are always writeable (bench_arith ``lincomb``/``mean`` rows)."""
        return True

    def axpy(self, acc: Any, x: Any, c: Any, inplace: bool) -> Any:
        if inplace and isinstance(acc, np.ndarray):
            acc += x * c
            return acc
        return acc + x * c

    def add(self, acc: Any, x: Any, inplace: bool) -> Any:
        if inplace and isinstance(acc, np.ndarray):
            acc += x
            return acc
        return acc + x

    def to_host(self, x: Any) -> np.ndarray[Any, Any]:
        """The array itself where it is contiguous and little-endian (no copy)."""
        return _little_endian(np.asarray(x))

    def from_stored(self, src: Any, like: Any) -> Any:
        """The stored array as read (its own memory; with ``fk.load(mmap=True)`` a view of the file's
        copy-on-write map, read when touched, writes private)."""
        return src.array()
