"""Dask: immutable, lazy arrays on the host."""

from __future__ import annotations

from typing import Any

from ._base import ArrayAdapter

__all__ = ["Adapter"]


class Adapter(ArrayAdapter):
    family = "dask"
    mutable = False

    def device(self, x: Any) -> Any:
        """Always ``"cpu"`` (array_api_compat's answer, without the call)."""
        return "cpu"

    def views(self, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
        """Method slices (bench_flat dask ``re(p)`` rows: no namespace wrapper call per view)."""
        out = []
        for o, s in zip(offsets, shapes, strict=True):
            n = 1
            for d in s:
                n *= d
            out.append(p[o : o + n] if len(s) == 1 else p[o : o + n].reshape(s))
        return out

    def view_source(self, offsets: list[int], shapes: list[tuple[int, ...]], glb: dict[str, Any]) -> list[str]:
        out = []
        for k, (o, s) in enumerate(zip(offsets, shapes, strict=True)):
            n = 1
            for d in s:
                n *= d
            sl = f"p[{o}:{o + n}]"
            out.append(f"    v{k} = {sl if len(s) == 1 else f'{sl}.reshape({s!r})'}")
        return out

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
