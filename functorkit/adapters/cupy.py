"""CuPy: device memory seen through ``x.data.ptr`` for the alias check, method views."""

from __future__ import annotations

from typing import Any

from ._base import Layout, MethodSlices, extent, normalise_layout

__all__ = ["Adapter"]


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


class Adapter(MethodSlices):
    family = "cupy"

    def device(self, x: Any) -> Any:
        return x.device

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """``p.device`` is always concrete on CuPy (no undeterminable device to allow for)."""
        glb.update(T=ftype, S=(n,), D=dtype, DEV=device)
        return "type(p) is not T or p.shape != S or p.dtype != D or p.device != DEV"

    def copy(self, x: Any) -> Any:
        return x.copy()

    def host_view(self, x: Any) -> Any:
        """Device memory: never a NumPy view."""
        return None

    def memory_extent(self, x: Any) -> tuple[tuple[str, int], int, int] | None:
        """Device pointers: each GPU is its own address space (shared with torch ``cuda:i``)."""
        if x.size == 0 or x.itemsize == 0:
            return None
        lo, hi = extent(int(x.data.ptr), x.shape, x.strides, x.itemsize)
        return ("cuda", int(x.device.id)), lo, hi

    def memory_layout(self, x: Any) -> Layout | None:
        if x.size == 0:
            return None
        return normalise_layout(("cuda", int(x.device.id)), int(x.data.ptr), x.shape, x.strides, x.itemsize)

    def byte_strides(self, x: Any) -> tuple[int, ...] | None:
        return tuple(x.strides)
