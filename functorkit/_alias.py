"""Shared-memory detection between different arrays of one tree.

Two *different* array objects whose memory overlaps (NumPy ``a`` and ``a.T``,
torch ``t`` and ``t.t()``) would be silently untied by flattening or
loading. :func:`check_no_aliases` finds them in O(n log n): each array's
byte extent is computed from its data pointer, shape and strides, extents are
sorted and swept, and only overlapping extents get the exact test
(``numpy.shares_memory`` on stand-in arrays made from the pointers alone, so
no data is read and interleaved views like ``a[::2]``/``a[1::2]`` are not
aliases). Immutable backends (JAX, Dask) and ``meta`` tensors have no
aliasing to detect.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ._errors import StructureError
from ._keypath import KeyPath

__all__ = ["check_no_aliases", "memory_layout"]

# (group, ptr, shape, byte strides, itemsize); group separates address spaces
Layout = tuple[Any, int, tuple[int, ...], tuple[int, ...], int]


def memory_layout(x: Any) -> Layout | None:
    """Where array `x` lives in memory, or None if it cannot alias (immutable, meta, empty)."""
    mod = type(x).__module__.partition(".")[0]
    if mod == "numpy":
        if not isinstance(x, np.ndarray) or x.size == 0:
            return None
        return ("numpy", x.__array_interface__["data"][0], x.shape, x.strides, x.itemsize)
    if mod == "torch":
        dev = x.device
        if dev.type == "meta" or x.numel() == 0:
            return None
        try:
            ptr = x.data_ptr()
        except RuntimeError:  # tensor subclasses/functional wrappers without storage
            return None
        isz = x.element_size()
        return (("torch", str(dev)), ptr, tuple(x.shape), tuple(s * isz for s in x.stride()), isz)
    if mod == "cupy":
        if x.size == 0:
            return None
        return (("cupy", x.device.id), x.data.ptr, x.shape, x.strides, x.itemsize)
    if mod == "array_api_strict":
        inner = getattr(x, "_array", None)
        if not isinstance(inner, np.ndarray) or inner.size == 0:
            return None
        iface = inner.__array_interface__["data"][0]
        return ("numpy", iface, inner.shape, inner.strides, inner.itemsize)
    return None


def _extent(lay: Layout) -> tuple[int, int]:
    _, ptr, shape, strides, itemsize = lay
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


class _Standin:
    """Exposes a pointer/shape/strides as an array interface, without any data access."""

    def __init__(self, lay: Layout) -> None:
        _, ptr, shape, strides, itemsize = lay
        self.__array_interface__ = {
            "shape": (*shape, itemsize),
            "strides": (*strides, 1),
            "typestr": "|u1",
            "data": (ptr, True),
            "version": 3,
        }


def _overlap(a: Layout, b: Layout) -> bool:
    return bool(np.shares_memory(np.asarray(_Standin(a)), np.asarray(_Standin(b))))


def check_no_aliases(entries: Iterable[tuple[KeyPath, Any]], what: str) -> None:
    """Raise StructureError if two different arrays in `entries` share memory.

    `entries` are ``(path, array)`` pairs of distinct objects; `what` names
    the operation for the message (``"fk.destructure"``).
    """
    spans = []
    for path, x in entries:
        lay = memory_layout(x)
        if lay is not None:
            lo, hi = _extent(lay)
            spans.append((lay[0].__repr__(), lo, hi, path, lay, type(x).__name__))
    if len(spans) < 2:
        return
    spans.sort(key=lambda s: (s[0], s[1]))
    active: list[tuple[Any, ...]] = []
    for span in spans:
        group, lo = span[0], span[1]
        active = [s for s in active if s[0] == group and s[2] > lo]
        for other in active:
            if _overlap(other[4], span[4]):
                a, b = other[3], span[3]
                msg = (
                    f"at {a.display} and {b.display}: two different arrays share memory "
                    f"({other[5]} and {span[5]}). {what} would silently untie them. "
                    "Expected each array to own its memory, or a tie written as the same "
                    "object in both places. Fix: keep one array and express the other "
                    "through it (fk.Transpose(a) for a transpose), or pass copies."
                )
                raise StructureError(msg)
        active.append(span)
