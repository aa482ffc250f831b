"""Dask: immutable, lazy arrays on the host."""

from __future__ import annotations

from typing import Any

from ._base import MethodSlices

__all__ = ["Adapter"]


class Adapter(MethodSlices):
    family = "dask"
    mutable = False

    def device(self, x: Any) -> Any:
        """Always ``"cpu"`` (array_api_compat's answer, without the call)."""
        return "cpu"

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """No device test: every Dask array is on ``"cpu"``."""
        glb.update(T=ftype, S=(n,), D=dtype)
        return "type(p) is not T or p.shape != S or p.dtype != D"

    def copy(self, x: Any) -> Any:
        """``x.copy()`` (lazy; the namespace's ``asarray(copy=True)`` computes nothing either)."""
        return x.copy()

    def host_view(self, x: Any) -> Any:
        """Lazy arrays have no memory yet: nothing to alias."""
        return None
