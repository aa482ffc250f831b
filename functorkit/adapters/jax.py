"""JAX: immutable arrays, one ``split`` for the views, tracers without a concrete device."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import array_api_compat

from . import _jax_sharding
from ._base import ArrayAdapter, method_view_source, method_views

__all__ = ["Adapter"]

#: eager JAX: one ``split`` for up to this many parameters (its first call compiles, ~5 ms per
#: piece; later calls are one dispatch instead of one per slice); more parameters: plain slices
SPLIT_MAX = 32


class Adapter(ArrayAdapter):
    family = "jax"
    mutable = False

    def find_device(self, platform: Any, ident: Any) -> Any:
        """JAX devices do not pickle: a Restructure stores ``(platform, id)`` and finds it again here."""
        import jax

        if type(platform) is not str:
            return None
        for d in jax.devices(platform):
            if d.id == ident:
                return d
        return None

    def device(self, x: Any) -> Any:
        """None for a tracer under ``jit`` (no concrete device); the only exceptions JAX raises
        there are TypeError subclasses (ConcretizationTypeError)."""
        try:
            return array_api_compat.device(x)
        except (TypeError, ValueError, AttributeError):
            return None

    def views(self, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
        """One ``split`` for up to `SPLIT_MAX` parameters (bench_flat jax ``re(p)`` rows:
        eager JAX pays a dispatch per slice); method slices beyond. No parameters: no views (``split``
        of an empty vector gives one chunk)."""
        if not shapes:
            return []
        if len(shapes) <= SPLIT_MAX:
            chunks = self.xp.split(p, offsets[1:])
            return [c if len(s) == 1 else c.reshape(s) for c, s in zip(chunks, shapes, strict=True)]
        return method_views(p, offsets, shapes)

    def view_source(self, offsets: list[int], shapes: list[tuple[int, ...]], glb: dict[str, Any]) -> list[str]:
        """The generated form of `views`."""
        if len(shapes) <= SPLIT_MAX:
            glb.update(SPLIT=self.xp.split, IDX=list(offsets[1:]))
            lines = ["    s = SPLIT(p, IDX)"]
            for k, sh in enumerate(shapes):
                lines.append(f"    v{k} = s[{k}]" + ("" if len(sh) == 1 else f".reshape({sh!r})"))
            return lines
        return method_view_source(offsets, shapes)

    # ---- sharded arrays (functorkit.adapters._jax_sharding; protocol: ._sharding) ----------

    def sharded_reduce(
        self, kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, then: Callable[[Any], Any] | None
    ) -> Any:
        """`functorkit.adapters._jax_sharding.reduce`: None unless an array is split over devices;
        `then` applied to the total (a JAX array whose operations are global already) in the same
        compiled program."""
        return _jax_sharding.reduce(kind, xs, ys, o, then)

    def first_sharded(self, arrays: Sequence[Any]) -> tuple[int, str] | None:
        """`functorkit.adapters._jax_sharding.first_sharded` (a flat vector is refused for them)."""
        return _jax_sharding.first_sharded(arrays)

    def whole_tensor_problem(self, x: Any) -> str | None:
        """`functorkit.adapters._jax_sharding.whole_tensor_problem` (Explicit-axes meshes)."""
        return _jax_sharding.whole_tensor_problem(x)

    def new_array_device(self, like: Any) -> Any:
        """None (an uncommitted array, placed where it is used) for `like` on several devices (split,
        or replicated with a spec of its own rank, ``P(None,)``: either sharding fits only arrays of
        its rank, not a 0-d constant); else `like`'s device."""
        if _jax_sharding.is_split(like):
            return None
        dev = self.device(like)
        devices = getattr(dev, "device_set", None)
        return None if devices is not None and len(devices) > 1 else dev

    def copy(self, x: Any) -> Any:
        """Immutable: ``x.copy()`` gives a new buffer (same values)."""
        return x.copy()

    def to_host(self, x: Any) -> Any:
        """``np.asarray`` (bfloat16 comes back as ``ml_dtypes.bfloat16``, which JAX depends on)."""
        import numpy as np

        from ._base import _little_endian

        return _little_endian(np.asarray(x))

    def from_stored(self, src: Any, like: Any) -> Any:
        """Copied to `like`'s sharding (devices), or the default device."""
        import jax

        sharding = getattr(like, "sharding", None)
        return jax.device_put(src.array(), sharding)
