"""The array-ops protocol every backend adapter implements, and the helpers adapters share.

`ArrayAdapter` is both the protocol and the generic implementation:
its methods use only the array API standard (plus DLPack to see host
memory), so an array library functorkit has never heard of (array-api-strict,
say) works through the base class itself. A family module
(``adapters/numpy.py``, ``torch.py``, ``jax.py``, ``cupy.py``, ``dask.py``)
subclasses it and overrides a method only where the generic code is slower
(each override names the benchmark row) or wrong for that library (each
names the reason).

This module sits *below* the family modules: it imports none of them, and no functorkit
module above the adapters. The lookup (`FAMILIES`, `adapter_for`, `adapter_of`, `tracing`)
lives above them, in ``adapters/_families.py`` (docs/adapters.md, "Import layering"); an
adapter that meets another library's array reaches it through `adapter_of` here, which the
lookup installs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import array_api_compat
import numpy as np

from ._device import same_device
from ._kernels import Kernels

__all__ = [
    "TRACING_PROBES",
    "ArrayAdapter",
    "Layout",
    "MethodSlices",
    "adapter_of",
    "extent",
    "method_view_source",
    "method_views",
    "normalise_layout",
    "self_overlap",
]

#: what a backend raises for an operation it does not support on this array (narrow on purpose)
_UNSUPPORTED = (TypeError, ValueError, RuntimeError, AttributeError, NotImplementedError, BufferError)


#: ``() -> bool`` tests added by family modules when imported (torch: ``torch.compiler.is_compiling``)
TRACING_PROBES: list[Callable[[], bool]] = []

#: the family table's lookup (`functorkit.adapters.adapter_of`), installed by `functorkit.adapters._families`
#: when it is imported (the package's ``__init__`` imports it, so before any adapter module runs)
_LOOKUP: list[Callable[[Any], ArrayAdapter]] = []


def adapter_of(x: Any) -> ArrayAdapter:
    """The adapter of array `x` of any family, for an adapter method that meets another library's
    array (`ArrayAdapter.stage`). The lookup sits above the family modules, since it loads them,
    so it is handed down to them here instead of imported (docs/adapters.md, "Import layering")."""
    return _LOOKUP[0](x)


# ------------------------------------------------------------------ memory layouts

_HOST = ("cpu", 0)


class Layout(NamedTuple):
    """Normalised memory footprint of one array (negative strides flipped, length-1 and stride-0
    dimensions dropped, dimensions sorted by stride, contiguous ones merged)."""

    space: tuple[str, int]  # address space: ("cpu", 0) for host memory, (device type, index) otherwise
    lo: int  # lowest byte address touched
    dims: tuple[tuple[int, int], ...]  # (length, positive byte stride), ascending stride, merged
    itemsize: int

    @property
    def hi(self) -> int:
        """One past the highest byte address touched."""
        return self.lo + sum((n - 1) * s for n, s in self.dims) + self.itemsize


def normalise_layout(
    space: tuple[str, int], ptr: int, shape: Sequence[int], strides: Sequence[int], itemsize: int
) -> Layout | None:
    """The `Layout` of `shape`/byte `strides` at `ptr`, or None for an empty array."""
    if itemsize <= 0:
        return None
    dims = []
    for n, s in zip(shape, strides, strict=True):
        if n == 0:
            return None
        if n == 1 or s == 0:
            continue
        if s < 0:
            ptr += (n - 1) * s
            s = -s
        dims.append((n, s))
    dims.sort(key=lambda d: d[1])
    merged: list[tuple[int, int]] = []
    for n, s in dims:
        if merged and s == merged[-1][0] * merged[-1][1]:
            merged[-1] = (merged[-1][0] * n, merged[-1][1])
        else:
            merged.append((n, s))
    return Layout(space, ptr, tuple(merged), itemsize)


def extent(ptr: int, shape: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """``[lo, hi)``: the bytes an array of `shape` and byte `strides` at `ptr` may touch."""
    lo = hi = ptr
    for n, s in zip(shape, strides, strict=True):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + itemsize


def self_overlap(lay: Layout, size: int) -> bool:
    """True if two elements of an array of `size` elements with layout `lay` share a byte."""
    if math.prod(n for n, _ in lay.dims) < size:  # a stride-0 axis (expand, broadcast_to)
        return True
    reach = lay.itemsize
    for n, s in lay.dims:
        if s < reach:
            break
        reach += (n - 1) * s
    else:
        return False
    # an interleaved layout the quick test cannot clear: enumerate the element offsets (exact)
    if size > 1 << 24:
        return True
    offs = np.zeros(1, dtype=np.int64)
    for n, s in lay.dims:
        offs = np.add.outer(np.arange(n, dtype=np.int64) * s, offs).ravel()
    offs.sort()
    return bool(np.any(np.diff(offs) < lay.itemsize))


def _size(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


# ------------------------------------------------------------------ the protocol


class ArrayAdapter(Kernels):
    """Array operations functorkit needs, written with the array API only (the generic adapter).

    A family adapter subclasses this and overrides what is faster or
    different for its library. Every method takes and returns arrays of this
    adapter's namespace `xp` unless it says otherwise.
    """

    #: the family name, for messages and ``repr`` only (never compared by the core)
    family: str = "generic"
    #: whether arrays can be written in place (False: JAX, Dask)
    mutable: bool = True
    #: whether arrays of this library can carry gradients (autodiff): ``fk.norm`` then guards its
    #: square root so that the gradient at an all-zero model is 0, not NaN (NumPy: no guard)
    autodiff: bool = True
    #: every array of this library lives on one device (then device checks between two of its
    #: arrays can be skipped: bench_scale's ``fk.add`` row)
    one_device: bool = False
    #: every array of this library has a ``device`` attribute that is what `device` returns (then the
    #: column checks read it in one C-level pass instead of one `device` call per array:
    #: bench_arith's GPT-2 EMA row)
    device_attr: bool = False

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self._complex: dict[Any, bool] = {}
        self._acc: dict[Any, Any] = {}

    def __repr__(self) -> str:
        return f"<functorkit {self.family} adapter for {getattr(self.xp, '__name__', self.xp)}>"

    # ---- facts -----------------------------------------------------------------

    def device(self, x: Any) -> Any:
        """The device of `x`, or None where it cannot be determined."""
        try:
            return array_api_compat.device(x)
        except _UNSUPPORTED:
            return None

    def find_device(self, platform: Any, ident: Any) -> Any:
        """The device of this library named by a pickled ``(platform, id)`` pair, or None."""
        return None

    def readable(self, device: Any) -> bool:
        """Whether the values of arrays on `device` can be read (False: torch ``meta``)."""
        return True

    def array_types(self, t: type) -> frozenset[type]:
        """The array types accepted where a plan saw an array of type `t`."""
        return frozenset({t})

    def detach(self, x: Any) -> Any:
        """`x` without autograd history (the same values; no copy where possible)."""
        return x

    def export(self, x: Any) -> Any:
        """`x` (of this library) in a form another library's ``from_dlpack``/``asarray`` reads with its
        values and dtype (`to_namespace`); a `TypeError` if it holds no values."""
        return x

    # ---- views of a flat vector --------------------------------------------------

    def views(self, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
        """Views of the 1-D array `p` in `shapes`, the k-th starting at ``offsets[k]``."""
        reshape = self.xp.reshape
        return [
            p[o : o + _size(s)] if len(s) == 1 else reshape(p[o : o + _size(s)], s)
            for o, s in zip(offsets, shapes, strict=True)
        ]

    def view_source(self, offsets: list[int], shapes: list[tuple[int, ...]], glb: dict[str, Any]) -> list[str]:
        """Source lines (4-space indent) binding ``v0..v{k-1}`` to the views of a local ``p``.

        ``p`` has already been checked (`check_source`) to be exactly
        the flat vector's type, shape, dtype and device. Globals go into `glb`.
        """
        glb["RESHAPE"] = self.xp.reshape
        out = []
        for k, (o, s) in enumerate(zip(offsets, shapes, strict=True)):
            sl = f"p[{o}:{o + _size(s)}]"
            out.append(f"    v{k} = {sl if len(s) == 1 else f'RESHAPE({sl}, {s!r})'}")
        return out

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """A Python expression over a local ``p``, True when ``p`` is NOT exactly of type `ftype`,
        shape ``(n,)``, `dtype` and `device`; its globals go into `glb`."""
        glb.update(T=ftype, S=(n,), D=dtype, DEV=device, SAME=same_device, DEVICE_OF=self.device)
        return "type(p) is not T or p.shape != S or p.dtype != D or not SAME(DEVICE_OF(p), DEV)"

    # ---- new arrays and copies ---------------------------------------------------

    def empty(self, dtype: Any, device: Any, n: int) -> Any:
        """A new, uninitialised 1-D array of `n` elements."""
        if device is None:
            return self.xp.empty((n,), dtype=dtype)
        return self.xp.empty((n,), dtype=dtype, device=device)

    def flat_piece(self, x: Any, dtype: Any, device: Any) -> Any:
        """`x` raveled, of `dtype`, on `device` (no autograd history)."""
        xp = self.xp
        y = xp.reshape(self.detach(x), (-1,))
        if y.dtype != dtype:
            y = xp.astype(y, dtype)
        if device is not None and not same_device(self.device(y), device):
            y = self.to_device(y, device)
        return y

    def new_flat(
        self, dtype: Any, device: Any, n: int, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]
    ) -> Any:
        """A new 1-D array holding `leaves` in order (never aliasing them, no autograd history).

        Generic: one ``concat`` (immutable backends cannot be filled; for the
        others one operation beats one ``__setitem__`` per leaf).
        """
        if not leaves:
            return self.empty(dtype, device, n)
        return self.xp.concat([self.flat_piece(x, dtype, device) for x in leaves])

    def proves_apart(self, out: Any, arrays: list[Any]) -> bool:
        """True if it is certain, without a look at each array, that no byte of `arrays` lies in
        the memory of `out` (a contiguous 1-D array of this library, ``re.flatten``'s checked
        `out`); False: not known (here: always), every array is looked at."""
        return False

    def plans_flat(self, leaves: list[Any], dtype: Any, device: Any, uniform: bool = False) -> Any:
        """What `planned_flat` needs for arrays with the facts of `leaves` (``_plans.LeafFacts``)
        and a flat vector of `dtype` on `device`, decided once when ``destructure``'s plan is made
        (`uniform`: the caller knows that every leaf is of one type, of `dtype`, on `device`);
        None (here: always): no such path, the plan runs the alias check and `new_flat`."""
        return None

    def planned_fill(self, out: Any, leaves: list[Any], token: Any) -> bool:
        """``re.flatten(out=)``'s kept decision (`token` from `plans_flat` for the flat vector's
        dtype and device, which `out` has): write `leaves` into `out` in one pass and return True,
        or False (here: always) where that is not proven here (the caller then calls `fill`)."""
        return False

    def planned_flat(self, leaves: list[Any], token: Any) -> Any:
        """``destructure``'s plan in one pass (`token` from `plans_flat`): prove that `leaves`
        (distinct, with the plan's facts) share no memory and return their new flat vector, or
        None where that is not proven here (the caller then runs the alias check and `new_flat`)."""
        return None

    def fill(self, out: Any, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]) -> None:
        """Copy each leaf into its slice of the mutable 1-D `out`, cast to ``out.dtype``."""
        dtype, device = out.dtype, self.device(out)
        for x, o, s in zip(leaves, offsets, shapes, strict=True):
            out[o : o + _size(s)] = self.flat_piece(x, dtype, device)

    def copy(self, x: Any) -> Any:
        """An independent copy of `x` (keeping autograd where the library has it)."""
        return self.xp.asarray(x, copy=True)

    def clone_leaf(self, x: Any) -> Any:
        """The copy ``fk.copy`` makes of an array leaf: independent, detached like ``copy.deepcopy``."""
        return self.copy(self.detach(x))

    def to_device(self, x: Any, device: Any) -> Any:
        """`x` on `device`."""
        return array_api_compat.to_device(x, device)

    def to_namespace(self, x: Any, device: Any) -> Any:
        """A copy of the foreign array `x` in this namespace, on `device` (DLPack, else ``asarray``),
        read through its own adapter's `export` (torch: detached, conjugate bit resolved, bfloat16
        and float8 as ``ml_dtypes``)."""
        xp = self.xp
        x = adapter_of(x).export(x)
        try:
            y = xp.from_dlpack(x)
        except _UNSUPPORTED:
            try:
                y = xp.asarray(x)
            except _UNSUPPORTED:
                y = xp.asarray(np.asarray(x))
        if device is not None and not same_device(self.device(y), device):
            y = self.to_device(y, device)
        return self.copy(y)

    # ---- writing in place ----------------------------------------------------------

    def write_problem(self, x: Any) -> str | None:
        """Why `x` cannot be written in place (immutable, read-only...), or None."""
        if not self.mutable:
            return f"{self.family} arrays are immutable"
        return None

    def overlap_problem(self, x: Any) -> str | None:
        """Why distinct values cannot be written into `x` (elements share memory), or None."""
        lay = self.memory_layout(x)
        if lay is not None and self_overlap(lay, _size(tuple(x.shape))):
            return (
                "several of its elements share one memory location (a stride-0 or self-overlapping view, as "
                "made by expand/broadcast_to/as_strided), so distinct values cannot be written into it; "
                "materialise it first (a contiguous copy)"
            )
        return None

    def out_problem(self, out: Any) -> str | None:
        """Why `out` cannot be written by ``re.flatten(out=)``, or None."""
        return self.write_problem(out) or self.overlap_problem(out)

    def read_problem(self, x: Any) -> str | None:
        """Why the values of `x` cannot be read as a dense array of its dtype, or None."""
        return None

    #: whether some arrays of this library are not dense (torch: sparse and nested tensors), so that
    #: `first_not_dense` must look at them; False: every array is dense, nothing is looked at
    may_be_sparse: bool = False

    def first_not_dense(self, arrays: Sequence[Any], eager: bool = False) -> int | None:
        """The index of the first of `arrays` (all of this library) that is not a dense array:
        one that cannot be flattened, computed on leaf by leaf, written in place or saved
        (`dense_problem` says why); None when all are dense. `eager`: the caller has asked
        `functorkit.adapters.tracing` (False), so an adapter need not ask its own tracer again."""
        return None

    def dense_problem(self, x: Any) -> str | None:
        """Why `x` is not a dense array (its layout, and the fix), or None."""
        return None

    def same_size_test(self, t: type) -> Callable[[Any, Any], bool] | None:
        """A test ``f(x, y)`` that two dense arrays of type `t` have the same shape, cheaper than
        comparing their ``shape`` tuples (torch: ``Tensor.is_same_size``, which builds no
        ``torch.Size``), for the column checks of the arithmetic; None: compare ``shape``."""
        return None

    def stand_ins(self, arrays: list[Any]) -> list[Any] | None:
        """Arrays of the same dtype, device, layout and density as each of `arrays` (all of one type
        of this library) that are cheaper to ask, for the column checks of the arithmetic; None:
        ask `arrays` themselves (torch: a DTensor's local shard, whose attributes are read at a
        plain tensor's speed: bench_sharded's EMA rows)."""
        return None

    def stage(self, dst: Any, src: Any) -> Any:
        """`src` (any namespace) as an array that `write` can copy into `dst` without failing:
        this namespace, ``dst``'s dtype, device and shape. Every conversion happens here."""
        xp = self.xp
        sa = adapter_of(src)
        if sa is not self:
            src = self.to_namespace(sa.detach(src), self.device(dst))
        src = self.detach(src)
        if src.dtype != dst.dtype:
            src = xp.astype(src, dst.dtype)
        dev = self.device(dst)
        if dev is not None and not same_device(self.device(src), dev):
            src = self.to_device(src, dev)
        return src

    def write(self, dst: Any, src: Any) -> None:
        """Copy the staged `src` into `dst` in place."""
        dst[...] = src

    def backup(self, x: Any) -> Any:
        """A plain copy of `x`'s current values, to restore them with `write`."""
        return self.copy(self.detach(x))

    def backups(self, xs: list[Any]) -> list[Any]:
        """`backup` of each array in `xs`."""
        return [self.backup(x) for x in xs]

    # ---- memory ------------------------------------------------------------------

    def host_view(self, x: Any) -> np.ndarray | None:
        """A NumPy array over `x`'s own host memory (no copy), or None (device memory, no DLPack,
        or an immutable backend: its buffers are never written, so they cannot alias)."""
        if not self.mutable:
            return None
        try:
            if x.__dlpack_device__()[0] != 1:  # kDLCPU
                return None
            v = np.from_dlpack(x)
        except _UNSUPPORTED:
            return None
        return v if isinstance(v, np.ndarray) else None

    def memory_extent(self, x: Any) -> tuple[tuple[str, int], int, int] | None:
        """``(address space, lo, hi)``: the bytes `x` may touch, or None if it cannot alias."""
        v = self.host_view(x)
        if v is None or v.size == 0 or v.itemsize == 0:
            return None
        lo, hi = extent(v.__array_interface__["data"][0], v.shape, v.strides, v.itemsize)
        return _HOST, lo, hi

    def memory_layout(self, x: Any) -> Layout | None:
        """Where `x` lives in memory, or None if it cannot alias (immutable, meta, empty, no storage)."""
        v = self.host_view(x)
        if v is None or v.size == 0:
            return None
        return normalise_layout(_HOST, v.__array_interface__["data"][0], v.shape, v.strides, v.itemsize)

    def byte_strides(self, x: Any) -> tuple[int, ...] | None:
        """`x`'s strides in bytes, or None if unknown."""
        v = self.host_view(x)
        return None if v is None else tuple(v.strides)

    # ---- arithmetic (the accumulation helpers of earlier rounds) ------------------

    def inplace_ok(self, arrays: Sequence[Any]) -> bool:
        """Whether a fresh result may be accumulated into in place (`axpy` with ``inplace``)."""
        return False

    def axpy(self, acc: Any, x: Any, c: Any, inplace: bool) -> Any:
        """``acc + x * c`` (written into `acc` when `inplace`; `c` a Python number or 0-d array)."""
        return acc + x * c

    def add(self, acc: Any, x: Any, inplace: bool) -> Any:
        """``acc + x`` (written into `acc` when `inplace`)."""
        return acc + x

    def div(self, acc: Any, n: int, inplace: bool) -> Any:
        """``acc / n`` (written into `acc` when `inplace`)."""
        return acc / n

    def lerp(self, x: Any, y: Any, t: float) -> Any:
        """``x + t * (y - x)``, exact at both ends (torch's formula) for a Python number `t`."""
        if t < 0.5:
            return x + (y - x) * t
        return y - (y - x) * (1 - t)

    def vdot(self, x: Any, y: Any) -> Any:
        """``sum(conj(x) * y)`` over all elements, a 0-d array."""
        xp = self.xp
        xf, yf = xp.reshape(x, (-1,)), xp.reshape(y, (-1,))
        acc = self.accumulate_dtype(x.dtype)
        if acc is not None:  # float16/bfloat16/float8: accumulated in float32
            xf, yf = xp.astype(xf, acc), xp.astype(yf, acc)
        return xp.vecdot(xf, yf)

    def sum_squares(self, x: Any) -> Any:
        """``sum(|x|**2)``, a real 0-d array (``fk.norm``: squares summed first, one square root)."""
        xp = self.xp
        xf = xp.reshape(x, (-1,))
        acc = self.accumulate_dtype(x.dtype)
        if acc is not None:  # float16/bfloat16/float8: accumulated in float32
            xf = xp.astype(xf, acc)
        s = xp.vecdot(xf, xf)
        return xp.real(s) if self._is_complex(x.dtype) else s

    # ---- checkpoints (fk.save, fk.load, fk.open) ------------------------------------

    def to_host(self, x: Any) -> np.ndarray[Any, Any]:
        """`x`'s values as a C-contiguous, little-endian NumPy array (for dtypes NumPy lacks, such
        as torch's bfloat16, an unsigned integer of the same width holding the bytes). Generic:
        DLPack, else ``np.asarray``."""
        x = self.detach(x)
        try:
            v = np.from_dlpack(x)
        except _UNSUPPORTED:
            v = np.asarray(x)
        return _little_endian(v)

    def rows(self, x: Any) -> Any:
        """For a lazy array: the array in blocks of consecutive rows (first axis), whole along the
        others, for `store_rows`; None for eager arrays."""
        return None

    def host_blocks(self, x: Any, target_bytes: int) -> list[Any] | None:
        """For a lazy array: pieces of consecutive rows (first axis) of about `target_bytes`, to be
        computed by `compute_blocks` and written one after the other; None for eager arrays."""
        return None

    def compute_blocks(self, blocks: list[Any]) -> list[np.ndarray[Any, Any]]:
        """The values of `host_blocks` pieces, as `to_host` arrays, computed together."""
        raise NotImplementedError

    def blocks_share_work(self, x: Any) -> bool:
        """Whether the `host_blocks` pieces of lazy `x` share a computation (a reduction over
        several of its input blocks, as a merge's norm or threshold): then they are computed together,
        else one batch at a time. False for eager arrays."""
        return False

    def keep_kind(self, new: Any, old: Any) -> Any:
        """`new`, an array made from `old` by a tree tool (``fk.stack``, ``fk.unstack``), as the same
        kind of leaf where the kind decides trainability (torch: a frozen ``nn.Parameter`` stays one,
        so that its module's parameter stays frozen, SPEC 3); `new` itself otherwise."""
        return new

    def kth_largest(self, a: Any, k: int) -> Any:
        """The `k`-th largest element of `a` as a 0-d array, where this library has a faster way
        than the namespace's functions (Dask: one chunked selection); None: use those."""
        return None

    def kth_largests(self, fn: Any, arrays: Sequence[Any], ks: Sequence[int], dtype: Any) -> Any:
        """For each ``j``, the ``ks[j]``-th largest element of ``fn(outputs, *arrays)[j]`` (`fn`
        element-wise, its outputs of `dtype`) as 0-d arrays, where this library has a faster way
        than computing each output and selecting (Dask: one radix selection whose block tasks
        compute `fn` in pieces); None: compute and select."""
        return None

    def reductions_first(self, xs: list[Any]) -> list[Any]:
        """Lazy arrays `xs` with the small reductions their blocks share (a merge's norms,
        thresholds) computed now, in one pass, and held as values, so that each array then streams
        block by block; `xs` as they are for eager arrays."""
        return xs

    def store_rows(self, arrays: list[Any], sinks: list[Any]) -> bool:
        """Compute the lazy `arrays` (`rows` arrays) together and hand each block of consecutive rows (first axis;
        a `to_host` array) to its array's sink with the rows it holds (``sinks[i](start, stop, value)``) where it
        is computed, if this can be done in this process; False (nothing computed) where it cannot."""
        return False

    def from_stored(self, src: Any, like: Any) -> Any:
        """A new array of this namespace holding the stored tensor `src` (``src.array()``: a NumPy array
        read from the file, or a view of its copy-on-write map with ``mmap=True``), on `like`'s
        device. Generic: ``asarray`` + ``to_device``."""
        y = self.xp.asarray(src.array())
        dev = self.device(like)
        if dev is not None:
            y = self.to_device(y, dev)
        return y

    def _is_complex(self, dtype: Any) -> bool:
        """``isdtype(dtype, "complex floating")``, remembered per dtype (it costs µs per call)."""
        known = self._complex
        hit = known.get(dtype)
        if hit is None:
            hit = known[dtype] = bool(self.xp.isdtype(dtype, "complex floating"))
        return hit


def _little_endian(v: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`v` C-contiguous and little-endian (a copy only where needed)."""
    if v.dtype.byteorder == ">":
        v = v.astype(v.dtype.newbyteorder("<"))
    return np.ascontiguousarray(v)


# ------------------------------------------------------------------ views by method calls


def method_views(p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
    """``p[a:b]`` and ``.reshape(s)`` as methods: no namespace wrapper call per view (bench_flat
    ``re(p)`` rows on NumPy, CuPy, Dask and large eager JAX models)."""
    return [
        p[o : o + _size(s)] if len(s) == 1 else p[o : o + _size(s)].reshape(s)
        for o, s in zip(offsets, shapes, strict=True)
    ]


def method_view_source(offsets: list[int], shapes: list[tuple[int, ...]]) -> list[str]:
    """The generated form of `method_views`: ``v{k} = p[a:b].reshape(s)`` lines."""
    out = []
    for k, (o, s) in enumerate(zip(offsets, shapes, strict=True)):
        sl = f"p[{o}:{o + _size(s)}]"
        out.append(f"    v{k} = {sl if len(s) == 1 else f'{sl}.reshape({s!r})'}")
    return out


class MethodSlices(ArrayAdapter):
    """An adapter whose arrays slice and reshape by methods (NumPy, CuPy, Dask)."""

    def views(self, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
        return method_views(p, offsets, shapes)

    def view_source(self, offsets: list[int], shapes: list[tuple[int, ...]], glb: dict[str, Any]) -> list[str]:
        return method_view_source(offsets, shapes)
