"""The arithmetic kernels of the array adapters (fk.add ... fk.lerp, fk.normalize; SPEC 12 and 14).

`Kernels` is a base of `functorkit.adapters._base.ArrayAdapter`: the generic kernels, written
with the array API only; family adapters override them where their library is faster (NumPy:
ufuncs with ``out=`` in cache-sized blocks; torch: in-place methods under ``no_grad``).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["Kernels", "spans_disjoint"]

_PY_NUMBERS = (int, float, complex)
_NO = object()


def _add(a: Any, b: Any) -> Any:
    return a + b


def _sub(a: Any, b: Any) -> Any:
    return a - b


def _lerp(x: Any, y: Any, t: Any) -> Any:
    if type(t) is float or type(t) is int:
        if t < 0.5:
            return x + (y - x) * t
        return y - (y - x) * (1 - t)
    return x + (y - x) * t


def spans_disjoint(los: list[int], his: list[int]) -> bool:
    """No two of the byte ranges ``[los[i], his[i])`` (each ``lo <= hi``) overlap: with the starts
    and the ends sorted separately, each end is at most the next start (then no address lies in two
    ranges: the ranges covering it are the starts at or below it, less the ends at or below it, and
    at most one start is not matched by an end). Two sorts of ints and one C-level pass: no tuple
    per range (bench_arith small-model ``out=`` rows)."""
    if len(los) < 2:
        return True
    lo, hi = sorted(los), sorted(his)
    return all(map(operator.le, hi[:-1], lo[1:]))


def _itemsize(xp: Any, dtype: Any) -> int:
    """Bytes per element of `dtype` (``finfo(dtype).bits // 8``; NumPy dtypes know it directly)."""
    size = getattr(dtype, "itemsize", None)
    if type(size) is int:
        return size
    return int(xp.finfo(dtype).bits) // 8


class Kernels:
    """The arithmetic kernels (a base of ``ArrayAdapter``, which sets `xp`, `_acc` and `write`)."""

    xp: Any
    _acc: dict[Any, Any]
    #: dtypes whose arrays' own operators (``+``, ``-``) cannot compute them: ``fk.add``/``fk.sub``
    #: then call `op_add`/`op_sub` at those parameters instead (``functorkit._lockstep``; torch:
    #: its float8 dtypes, which these kernels compute in float32)
    operator_less: frozenset[Any] = frozenset()

    def write(self, dst: Any, src: Any) -> None:
        """Copy `src` into `dst` in place (``ArrayAdapter.write``)."""
        dst[...] = src

    # ---- arithmetic kernels (fk.add ... fk.lerp, fk.normalize; SPEC 12 and 14) ---------------
    #
    # Every kernel computes one parameter of a result from the arrays `xs` (one per model, all of
    # one type, shape, dtype and device, checked by the caller) and coefficients made by `weak`.
    # With ``out=None`` it returns a fresh array; with `out` (a writable array of the result's
    # shape, dtype and device, checked by the caller) it writes the result there and returns `out`:
    # the same values bit for bit. `out` may be the very array of an input (an in-place update);
    # the caller passes the accumulating kernels (`op_lincomb`, `op_mean`) no `out` that is a later
    # term (it computes those aside, then copies), and no other overlap at all.

    def compute_dtype(self, dtype: Any) -> Any:
        """The dtype the elementwise kernels compute parameters of `dtype` in, when not `dtype`
        itself; None: `dtype` itself (the library's own kernels, which compute half types in
        float32 internally and round each operation's result)."""
        return None

    def accumulate_dtype(self, dtype: Any) -> Any:
        """The dtype ``fk.dot``/``fk.norm`` accumulate parameters of `dtype` in: float32 for real
        floating dtypes narrower than 32 bits (float16, bfloat16, float8: a sum of a million squares
        overflows float16 and loses every digit in float8), None (`dtype` itself) otherwise."""
        known = self._acc
        hit = known.get(dtype, _NO)
        if hit is _NO:
            xp = self.xp
            narrow = bool(xp.isdtype(dtype, "real floating")) and _itemsize(xp, dtype) < 4
            hit = known[dtype] = xp.float32 if narrow else None
        return hit

    def weak(self, c: Any, dtype: Any) -> Any:
        """Coefficient `c` (a Python number, or a 0-d array of this namespace and the parameter's
        device whose kind the caller checked) as the kernels use it for parameters of `dtype`: a
        Python number as it is (weak: the array API scalar rule keeps the array's dtype); a 0-d
        array cast to the dtype the kernels compute in (`compute_dtype`, else `dtype`)."""
        if type(c) in _PY_NUMBERS:
            return c
        target = self.compute_dtype(dtype)
        if target is None:
            target = dtype
        return c if c.dtype == target else self.xp.astype(c, target)

    def _elementwise(self, f: Callable[..., Any], xs: Sequence[Any], out: Any) -> Any:
        """``f(*xs)`` in the compute dtype, rounded once to the parameters' dtype; into `out`."""
        dt = xs[0].dtype
        cd = self.compute_dtype(dt)
        if cd is None:
            r = f(*xs)
        else:
            xp = self.xp
            r = xp.astype(f(*(xp.astype(x, cd) for x in xs)), dt)
        if out is None:
            return r
        self.write(out, r)
        return out

    def op_add(self, x: Any, y: Any, out: Any = None) -> Any:
        """``x + y``."""
        return self._elementwise(_add, (x, y), out)

    def op_sub(self, x: Any, y: Any, out: Any = None) -> Any:
        """``x - y``."""
        return self._elementwise(_sub, (x, y), out)

    def op_scale(self, x: Any, c: Any, out: Any = None) -> Any:
        """``x * c``."""
        return self._elementwise(lambda a: a * c, (x,), out)

    def op_div(self, x: Any, c: Any, out: Any = None) -> Any:
        """``x / c``."""
        return self._elementwise(lambda a: a / c, (x,), out)

    def op_lincomb(self, xs: Sequence[Any], cs: Sequence[Any], out: Any = None) -> Any:
        """``xs[0] * cs[0] + xs[1] * cs[1] + ...``, accumulated left to right."""

        def f(*ys: Any) -> Any:
            acc = ys[0] * cs[0]
            for y, c in zip(ys[1:], cs[1:], strict=True):
                acc = acc + y * c
            return acc

        return self._elementwise(f, xs, out)

    def op_mean(self, xs: Sequence[Any], out: Any = None) -> Any:
        """``(xs[0] + xs[1] + ...) / len(xs)``, summed left to right."""
        n = len(xs)

        def f(*ys: Any) -> Any:
            acc = ys[0] + ys[1] if n > 1 else ys[0]
            for y in ys[2:]:
                acc = acc + y
            return acc / n

        return self._elementwise(f, xs, out)

    #: `out_fast` may be given `arrays` with repeats (one input array in two models) and answers as for
    #: the distinct arrays, so the caller does not remove them first (NumPy: arrays that own their
    #: memory are told apart by ``base`` whatever the repeats; bench_arith's small-model
    #: ``lincomb, out=`` row)
    out_fast_repeats: bool = False

    def out_fast(
        self, outs: list[Any], arrays: list[Any], eager: bool = False, local: tuple[list[Any], list[Any]] | None = None
    ) -> bool:
        """True if every array of `outs` can certainly be written in place with distinct values
        (``write_problem`` and ``overlap_problem`` would find nothing) and the distinct arrays
        `arrays` (`outs` and the inputs) certainly share no memory with each other, decided in
        C-level passes over the lists (``fk.*(out=)``'s column path); False: not known here
        (``fk.*(out=)`` then checks each array and names the one that fails). The caller has
        checked that `arrays` are dense arrays of this adapter, each row (an out array and the
        inputs it is computed from) on one device; ranges on different devices compared as numbers
        can only seem to meet, which says False. `eager`: as for ``first_not_dense`` (the caller
        knows that no tracer runs). `local`: this adapter's ``stand_ins`` of `outs` and of `arrays`
        (in their order), which the caller has (DTensors: their local shards, the arrays whose
        memory is tested and which the kernels then get), so that they are not asked for again;
        None: none were made."""
        return False

    def arith_many_(self, kind: str, outs: list[Any], cols: list[list[Any]], cs: list[Any]) -> bool:
        """Every row of ``out=``'s column path in one call where the library has one (the same
        values as the row kernels, bit for bit): ``outs[i] <- kind(cols[0][i], cols[1][i], ...)``
        for `kind` ``"add"``, ``"sub"``, ``"scale"`` (by ``cs[0]``), ``"lincomb"`` (by `cs`),
        ``"mean"`` or ``"lerp"`` (by ``t = cs[0]``, into `outs` other than ``cols[0]``); `cs`
        Python numbers. The caller's column path checked the arrays (`out_fast`
        passed); `outs` is ``cols[0]`` (in place) or shares no array with `cols`. False: nothing
        written, the caller goes row by row."""
        return False

    def lerp_many_(self, xs: list[Any], ys: list[Any], t: float, checked: bool = False) -> bool:
        """``x <- lerp(x, y, t)`` in place for every pair, in one call where the library has one
        (the same values as `op_lerp` with ``out=x``); False: not done, the caller goes row by row.
        `checked`: `out_fast` accepted these arrays (``out=``'s column path), so what it tests need
        not be tested again."""
        return False

    def op_lerp(self, x: Any, y: Any, t: Any, out: Any = None) -> Any:
        """``x + t * (y - x)``; for a Python number `t` torch's formula, exact at both ends
        (``y - (1 - t) * (y - x)`` for ``t >= 0.5``)."""
        return self._elementwise(lambda a, b: _lerp(a, b, t), (x, y), out)
