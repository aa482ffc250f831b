"""Dask: immutable, lazy arrays on the host."""

from __future__ import annotations

from typing import Any

from ._base import MethodSlices

__all__ = ["Adapter"]


class Adapter(MethodSlices):
    family = "dask"
    mutable = False

    def compute_dtype(self, dtype: Any) -> Any:
        """float32 for the floating dtypes narrower than 32 bits (float16, ml_dtypes bfloat16 and
        float8_*), as NumPy's adapter (each chunk is a NumPy array): rounded once per element."""
        from .numpy import _narrow_float

        return _narrow_float(dtype)

    def accumulate_dtype(self, dtype: Any) -> Any:
        """float32 for the narrow floating dtypes, as `compute_dtype`."""
        return self.compute_dtype(dtype)

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

    def host_blocks(self, x: Any, target_bytes: int) -> list[Any] | None:
        """Row blocks: the array's own chunks along the first axis, whole along the others (each is one
        contiguous byte range of the file); a 0-d array is one block."""
        import math

        if x.ndim == 0:
            return [x]
        if any(math.isnan(c) for cs in x.chunks for c in cs):
            msg = "the array has chunks of unknown size; call `x.compute_chunk_sizes()` first"
            raise ValueError(msg)
        if x.ndim > 1:
            x = x.rechunk({i: -1 for i in range(1, x.ndim)})
        return [x.blocks[i] for i in range(x.numblocks[0])]

    def blocks_share_work(self, x: Any) -> bool:
        """True when the graph of `x` (of more than one block) has a layer of one block computed from
        a layer of several (a full reduction: ``sum``, ``topk``, a rechunk to one block), read from the
        layers' shapes and chunks in the graph's annotations; False for an elementwise graph, or
        where a layer has no such annotations."""
        import math

        if math.prod(x.numblocks) <= 1:
            return False
        hlg = x.__dask_graph__()
        layers = getattr(hlg, "layers", None)
        if layers is None:
            return True  # a plain dict graph: no layer structure to read, compute it whole
        nblocks: dict[Any, int] = {}
        for name, layer in layers.items():
            chunks = (getattr(layer, "collection_annotations", None) or {}).get("chunks")
            if chunks is not None:
                nblocks[name] = math.prod(len(c) for c in chunks)
        for name, deps in hlg.dependencies.items():
            if nblocks.get(name) == 1 and any(nblocks.get(d, 1) > 1 for d in deps):
                return True
        return False

    def compute_blocks(self, blocks: list[Any]) -> list[Any]:
        """One ``dask.compute`` call (the active scheduler: threads, or a ``dask.distributed`` client).

        Where no scheduler is configured and ``distributed`` was never imported (so no client can
        be active), the collection's own scheduler is passed, the one ``dask.compute`` would pick:
        this skips its first-call import of ``distributed`` (0.2-0.4 s in a fresh process)."""
        import importlib
        import sys

        import numpy as np

        from ._base import _little_endian

        dask: Any = importlib.import_module("dask")
        kw: dict[str, Any] = {}
        if blocks and "distributed" not in sys.modules and dask.config.get("scheduler", None) is None:
            kw["scheduler"] = blocks[0].__dask_scheduler__
        return [_little_endian(np.asarray(b)) for b in dask.compute(*blocks, **kw)]

    def from_stored(self, src: Any, like: Any) -> Any:
        """A lazy array over the file: ``dask.array.from_array`` of a `LazyTensor` (picklable:
        path and offset, no data), chunked along the first axis in blocks of about
        `CHUNK_BYTES` (one chunk when it holds no bytes); named by file, key and the file's identity
        (device, inode, size, modification time), so opening a file twice
        gives the same graph keys (read once when computed together). A tensor of a sharded
        checkpoint (``grid``: its pieces) has one chunk per piece."""
        import importlib
        import math

        import numpy as np
        from dask.base import tokenize

        lazy = src.lazy()
        shape = lazy.shape
        chunks: Any = getattr(lazy, "grid", ())  # a sharded checkpoint's tensor: one chunk per piece
        if shape and not chunks:
            row = math.prod(shape[1:]) * lazy.dtype.itemsize
            # an empty tensor is one chunk, whatever its dims say (a shape [2**46, 0] holds no bytes)
            rows = max(1, CHUNK_BYTES // row) if row and shape[0] else max(1, shape[0])
            chunks = (rows, *shape[1:])
        name = "fk-open-" + tokenize(lazy.path, lazy.key, lazy.begin, lazy.ident)
        meta = np.empty((0,) * len(shape), dtype=lazy.dtype)
        da: Any = importlib.import_module("dask.array")
        return da.from_array(lazy, chunks=chunks, name=name, lock=False, asarray=False, meta=meta)


#: target size of one chunk of an opened checkpoint's tensors (``fk.open``), in bytes
CHUNK_BYTES = 16 * 2**20
