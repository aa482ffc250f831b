"""NumPy arrays: method calls and ``np.copyto`` instead of namespace functions (faster per call)."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, cast

import numpy as np

from ._base import _HOST, Layout, MethodSlices, _little_endian, _size, extent, normalise_layout
from ._kernels import spans_disjoint

__all__ = ["Adapter"]


#: above this many leaves, ``fill`` concatenates in one call
_SMALL = 1 << 16  # elements: below this, fill concatenates
_MANY = 256


#: elements per block of the arithmetic kernels: 128 Ki elements (512 KiB of float32), so a block
#: of the result and the scratch buffer stay in a core's L2 cache while each input's block streams
#: through it once (measured on GPT-2-small shapes, ``fk.lincomb`` of three models with ``out=``:
#: 1.48-1.72x the traffic floor, against 1.67-2.02x with 32 Ki blocks and 1.54x with 256 Ki, in
#: interleaved rounds: fewer ufunc calls per byte; bench_arith's lincomb rows)
BLOCK = 1 << 17
_NO = object()


def _narrow_float(dtype: Any) -> Any:
    """float32 for a real floating NumPy or ml_dtypes dtype narrower than 32 bits, else None."""
    dtype = np.dtype(dtype)
    kind = dtype.kind
    if dtype.itemsize >= 4 or kind in "iubcSUMmO":
        return None
    if kind == "f":
        return np.dtype(np.float32)
    try:  # ml_dtypes types (kind "V"): floating when finfo knows them
        import ml_dtypes

        cast(Any, ml_dtypes).finfo(dtype)
    except (ImportError, ValueError, TypeError):
        return None
    return np.dtype(np.float32)


_WRITEABLE = operator.attrgetter("flags.writeable")
_FORC = operator.attrgetter("flags.forc")
_BASE = operator.attrgetter("base")
_NBYTES = operator.attrgetter("nbytes")
_ND = frozenset({np.ndarray})


def _address(x: Any) -> int:
    return int(x.__array_interface__["data"][0])


# (the ufuncs take `out` positionally: 0.14 µs less per call than the keyword, on small arrays)


def _k_add(ins: list[Any], o: Any, tmp: Any) -> None:
    np.add(ins[0], ins[1], o)


def _k_sub(ins: list[Any], o: Any, tmp: Any) -> None:
    np.subtract(ins[0], ins[1], o)


def _k_scale(c: Any) -> Callable[[list[Any], Any, Any], None]:
    def kern(ins: list[Any], o: Any, tmp: Any) -> None:
        np.multiply(ins[0], c, o)

    return kern


def _k_lincomb(cs: Sequence[Any]) -> Callable[[list[Any], Any, Any], None]:
    def kern(ins: list[Any], o: Any, tmp: Any) -> None:
        np.multiply(ins[0], cs[0], o)
        for y, c in zip(ins[1:], cs[1:], strict=True):
            np.multiply(y, c, tmp)
            np.add(o, tmp, o)

    return kern


def _k_mean(n: int) -> Callable[[list[Any], Any, Any], None]:
    def kern(ins: list[Any], o: Any, tmp: Any) -> None:
        if n > 1:
            np.add(ins[0], ins[1], o)
            for y in ins[2:]:
                np.add(o, y, o)
            np.divide(o, n, o)
        else:
            np.divide(ins[0], 1, o)

    return kern


def _k_lerp(t: Any) -> Callable[[list[Any], Any, Any], None]:
    """``a + t * (b - a)``, or ``b - (1 - t) * (b - a)`` for a Python number ``t >= 0.5`` (torch's
    formula: exact at both ends)."""
    high = (type(t) is float or type(t) is int) and t >= 0.5

    def kern(ins: list[Any], o: Any, tmp: Any) -> None:
        a, b = ins
        np.subtract(b, a, tmp)
        if high:
            np.multiply(tmp, 1 - t, tmp)
            np.subtract(b, tmp, o)
        else:
            np.multiply(tmp, t, tmp)
            np.add(a, tmp, o)

    return kern


class Adapter(MethodSlices):
    family = "numpy"
    autodiff = False
    one_device = True  # host memory only
    out_fast_repeats = True

    def __init__(self, xp: Any) -> None:
        super().__init__(xp)
        self._cd: dict[Any, Any] = {}

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
        """Structured (record) and raw void dtypes hold no single number per element; ml_dtypes'
        numbers (bfloat16, float8_*, int4...) are NumPy kind "V" too, and are numbers."""
        dt = x.dtype
        if dt.kind == "V" and not dt.type.__module__.startswith("ml_dtypes"):
            return f"it has the structured dtype {dt}, not a numeric one"
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
        """Fresh NumPy results are always writeable."""
        return True

    # ---- arithmetic kernels: ufuncs with ``out=``, in cache-sized blocks -------------------------

    def out_fast(
        self, outs: list[Any], arrays: list[Any], eager: bool = False, local: tuple[list[Any], list[Any]] | None = None
    ) -> bool:
        """Plain ndarrays; `outs` writeable and C- or Fortran-contiguous (no element twice in
        memory); `arrays` separate allocations (each owns its memory: ``base is None``; an array
        listed twice is one allocation: `out_fast_repeats`), or contiguous with byte ranges that do
        not meet (an array listed twice counted once)."""
        if not set(map(type, arrays)) <= _ND or not all(map(_WRITEABLE, outs)) or not all(map(_FORC, outs)):
            return False
        if all(map(operator.is_, map(_BASE, arrays), repeat(None))):
            return True
        if not all(map(_FORC, arrays)):
            return False
        arrays = list(dict(zip(map(id, arrays), arrays)).values())  # (an array listed twice: one range)
        los = list(map(_address, arrays))
        return spans_disjoint(los, list(map(operator.add, los, map(_NBYTES, arrays))))

    def compute_dtype(self, dtype: Any) -> Any:
        """float32 for the floating dtypes narrower than 32 bits (float16, ml_dtypes bfloat16 and
        float8_*): NumPy gives Python floats and ml_dtypes scalars no weak type for ml_dtypes arrays
        (``bfloat16 * 0.5`` is float32), and ml_dtypes' own loops convert each element per operation
        (3x slower than one float32 pass, measured); each result element is rounded once."""
        hit = self._cd.get(dtype, _NO)
        if hit is _NO:
            hit = self._cd[dtype] = _narrow_float(dtype)
        return hit

    def accumulate_dtype(self, dtype: Any) -> Any:
        """float32 for the narrow floating dtypes, as `compute_dtype`."""
        return self.compute_dtype(dtype)

    def _blocked(self, kern: Callable[..., None], xs: Sequence[Any], out: Any) -> Any:
        """Run ``kern(ins, o, tmp)`` (ufuncs writing the result into `o`, `tmp` a scratch buffer)
        over blocks of `BLOCK` elements: each block of the inputs is read once from memory and the
        result written once, with no full-size temporary (bench_arith ``lincomb`` NumPy rows).
        Narrow dtypes: each block cast to float32 first, the result rounded once into `out`."""
        x0 = xs[0]
        dt = x0.dtype
        cd = self.compute_dtype(dt)
        if out is None:
            if type(x0) is not np.ndarray:
                return None
            out = np.empty_like(x0)
        n = x0.size
        flat = n > BLOCK and out.flags.c_contiguous and all(x.flags.c_contiguous for x in xs)
        if not flat:  # one block: the whole arrays (any layout)
            if cd is None:
                kern(xs, out, np.empty(x0.shape, dt))
            else:
                ins = [x.astype(cd) for x in xs]
                o = np.empty(x0.shape, cd)
                kern(ins, o, np.empty(x0.shape, cd))
                np.copyto(out, o, casting="unsafe")
            return out
        fx = [x.reshape(-1) for x in xs]
        fo = out.reshape(-1)
        work = dt if cd is None else cd
        tmp = np.empty(BLOCK, work)
        if cd is None:
            for s in range(0, n, BLOCK):
                e = min(s + BLOCK, n)
                kern([f[s:e] for f in fx], fo[s:e], tmp[: e - s])
            return out
        bufs = [np.empty(BLOCK, cd) for _ in fx]
        acc = np.empty(BLOCK, cd)
        for s in range(0, n, BLOCK):
            e = min(s + BLOCK, n)
            m = e - s
            ins = [b[:m] for b in bufs]
            for b, f in zip(ins, fx, strict=True):
                np.copyto(b, f[s:e], casting="unsafe")
            kern(ins, acc[:m], tmp[:m])
            np.copyto(fo[s:e], acc[:m], casting="unsafe")
        return out

    def _kernel(self, kern: Callable[..., None], xs: Sequence[Any], out: Any, generic: Callable[[], Any]) -> Any:
        if type(xs[0]) is np.ndarray and (out is None or type(out) is np.ndarray):
            r = self._blocked(kern, xs, out)
            if r is not None:
                return r
        return generic()  # ndarray subclasses: the operators (which keep the subclass)

    def op_add(self, x: Any, y: Any, out: Any = None) -> Any:
        return self._kernel(_k_add, (x, y), out, lambda: super(Adapter, self).op_add(x, y, out))

    def op_sub(self, x: Any, y: Any, out: Any = None) -> Any:
        return self._kernel(_k_sub, (x, y), out, lambda: super(Adapter, self).op_sub(x, y, out))

    def op_scale(self, x: Any, c: Any, out: Any = None) -> Any:
        return self._kernel(_k_scale(c), (x,), out, lambda: super(Adapter, self).op_scale(x, c, out))

    def op_div(self, x: Any, c: Any, out: Any = None) -> Any:
        def kern(ins: list[Any], o: Any, tmp: Any) -> None:
            np.divide(ins[0], c, out=o)

        return self._kernel(kern, (x,), out, lambda: super(Adapter, self).op_div(x, c, out))

    def op_lincomb(self, xs: Sequence[Any], cs: Sequence[Any], out: Any = None) -> Any:
        return self._kernel(_k_lincomb(cs), xs, out, lambda: super(Adapter, self).op_lincomb(xs, cs, out))

    def op_mean(self, xs: Sequence[Any], out: Any = None) -> Any:
        return self._kernel(_k_mean(len(xs)), xs, out, lambda: super(Adapter, self).op_mean(xs, out))

    def op_lerp(self, x: Any, y: Any, t: Any, out: Any = None) -> Any:
        return self._kernel(_k_lerp(t), (x, y), out, lambda: super(Adapter, self).op_lerp(x, y, t, out))

    def _rows(self, kern: Callable[..., None], outs: list[Any], cols: list[list[Any]]) -> bool:
        """`kern` over every row (``outs[i] <- kern(cols[0][i], cols[1][i], ...)``), each row by
        `_blocked` as the row kernels run it (the same ufuncs: the same bits), without the rows'
        per-parameter calls; plain ndarrays only (``out=``'s column path checked them)."""
        if type(outs[0]) is not np.ndarray:
            return False
        blocked = self._blocked
        for o, *ins in zip(outs, *cols, strict=True):
            blocked(kern, ins, o)
        return True

    def arith_many_(self, kind: str, outs: list[Any], cols: list[list[Any]], cs: list[Any]) -> bool:
        """Every row of ``out=``'s column path by `_rows` (bench_arith's small-model NumPy ``out=``
        rows): the row kernels' ufuncs, one parameter after another, without a call per parameter."""
        if not outs:
            return False
        if kind == "add":
            kern: Callable[..., None] = _k_add
        elif kind == "sub":
            kern = _k_sub
        elif kind == "scale":
            kern = _k_scale(cs[0])
        elif kind == "lincomb":
            kern = _k_lincomb(cs)
        elif kind == "lerp":
            kern = _k_lerp(cs[0])
        else:
            kern = _k_mean(len(cols))
        return self._rows(kern, outs, cols)

    def lerp_many_(self, xs: list[Any], ys: list[Any], t: float, checked: bool = False) -> bool:
        """Every in-place row of ``out=``'s column path (`checked`) by `_rows`; False otherwise."""
        return checked and bool(xs) and self._rows(_k_lerp(t), xs, [xs, ys])

    def sum_squares(self, x: Any) -> Any:
        """``vecdot`` in float32 for narrow dtypes (ml_dtypes arrays have no ``vecdot`` loop)."""
        acc = self.accumulate_dtype(x.dtype)
        if acc is None:
            return super().sum_squares(x)
        xf = x.reshape(-1).astype(acc)
        return np.dot(xf, xf)

    def vdot(self, x: Any, y: Any) -> Any:
        """``np.dot`` in float32 for narrow dtypes (see `sum_squares`)."""
        acc = self.accumulate_dtype(x.dtype)
        if acc is None:
            return super().vdot(x, y)
        return np.dot(x.reshape(-1).astype(acc), y.reshape(-1).astype(acc))

    def to_host(self, x: Any) -> np.ndarray[Any, Any]:
        """The array itself where it is contiguous and little-endian (no copy)."""
        return _little_endian(np.asarray(x))

    def from_stored(self, src: Any, like: Any) -> Any:
        """The stored array as read (its own memory; with ``fk.load(mmap=True)`` a view of the file's
        copy-on-write map, read when touched, writes private)."""
        return src.array()
