"""load_into: copy one model's values into another model's arrays, in place, all or nothing.

Three phases, and nothing is written before the third:

1. one walk over ``(dst, src)`` checks structure, shapes, complex into real,
   writability (through each array's adapter: immutable, read-only,
   inference, self-overlapping, ``meta``), readability of each source (sparse,
   nested, quantized, structured dtypes), ties and aliases in `dst`;
2. every source value is *staged* by `dst`'s adapter: brought into `dst`'s
   namespace, dtype, device and shape (a copy where a conversion is needed,
   or where the source's memory lies inside `dst`'s). Every conversion error
   (an unparsable string, an object array holding ``"x"``, a subclass whose
   ``copy_`` raises) happens here, with the path;
3. the writes: plain same-kind copies. Before each write the old values of
   its `dst` array are copied aside; if anything interrupts the writes (an
   exception, ``KeyboardInterrupt``), the arrays written so far are restored
   and the exception propagates, so `dst` is left bit-for-bit as it was.

Cost: besides the writes, one copy of each `dst` array (the backups, freed
on return) and one copy of each source that needs a conversion.
"""

from __future__ import annotations

import bisect
from typing import Any

from ._alias import check_no_aliases, may_overlap, memory_layout
from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._walk import BUILD_NONE, walk
from ._xp import MATRIX_MESSAGE, describe_array, describe_dtype, is_array, is_complex, is_inexact_array, namespace
from .adapters import ArrayAdapter, adapter_of

__all__ = ["Loader", "load_into"]


def _describe(x: Any) -> str:
    return f"{describe_dtype(x.dtype)} array of shape {tuple(x.shape)}"


def _is_array(path: KeyPath, x: Any, side: str) -> bool:
    try:
        return is_array(x)
    except TypeError as e:
        msg = f"at {path.display}: `{side}` {MATRIX_MESSAGE}"
        raise TypeError(msg) from e


def _check_writable(path: KeyPath, ad: ArrayAdapter, d: Any, fname: str = "load_into") -> None:
    """Raise before anything is written if `d` cannot be written in place."""
    why = ad.write_problem(d)
    if why is not None:
        new = (
            "fk.fmap_with_path(lambda path, x: mapping[path.dotted], dst) (arrays of dst's library: convert "
            "each value, see docs/state_dict.md)"
            if fname == "load_state_dict"
            else "fk.fmap(lambda d, s: s, dst, src), or fk.copy(src)"
        )
        msg = (
            f"at {path.display}: fk.{fname} writes into `dst`'s arrays in place, but {why}. Expected "
            f"mutable arrays in `dst`; fix: build a new model instead, e.g. {new}."
        )
        raise TypeError(msg)
    why = ad.overlap_problem(d)
    if why is not None:
        msg = (
            f"at {path.display}: in this `dst` array {why}. fk.{fname} cannot write distinct values "
            "into it. Expected an array that owns each element."
        )
        raise StructureError(msg)


def _check_readable(path: KeyPath, ad: ArrayAdapter, d: Any, s: Any, fname: str = "load_into") -> None:
    """Raise if the values of `s` cannot be read into `d` (sparse/nested/quantized, meta)."""
    sa = adapter_of(s)
    why = sa.read_problem(s)
    if why is not None:
        msg = (
            f"at {path.display}: fk.{fname} cannot read the `src` array here: {why}. Expected a dense "
            f"array of a numeric dtype for `dst`'s {_describe(d)}; fix: convert it first (e.g. "
            "`.to_dense()`, `.dequantize()`, or a plain numeric array)."
        )
        raise PolicyError(msg)
    s_values = sa.readable(sa.device(s))
    d_storage = ad.readable(ad.device(d))
    if not s_values and d_storage:
        msg = (
            f"at {path.display}: `src` holds an array without values here (a `meta` tensor) but `dst` a "
            f"{describe_array(d)}. Expected values to copy; fix: materialise `src` first."
        )
        raise ValueError(msg)
    if s_values and not d_storage:
        msg = (
            f"at {path.display}: `dst` holds an array without storage here (a `meta` tensor), so the values "
            f"of `src` ({describe_array(s)}) cannot be stored in it. Expected a `dst` with storage; fix: "
            "materialise `dst` first (e.g. `module.to_empty(device='cpu')`), or load a `src` on `meta`."
        )
        raise ValueError(msg)


def _stage(path: KeyPath, ad: ArrayAdapter, d: Any, s: Any, fname: str = "load_into") -> Any:
    """`s` as `dst`'s adapter stages it (namespace, dtype, device); errors name the path."""
    if not (ad.readable(ad.device(d))):
        return None  # meta into meta: nothing to write
    try:
        return ad.stage(d, s)
    except (StructureError, PolicyError) as e:  # functorkit's own (a checkpoint changed after fk.open): as it is
        raise type(e)(f"at {path.display}: fk.{fname}: {e}") from e
    except (TypeError, ValueError, RuntimeError, OverflowError, NotImplementedError, BufferError) as e:
        msg = (
            f"at {path.display}: fk.{fname} cannot convert the `src` {describe_array(s)} into `dst`'s "
            f"{describe_array(d)} ({type(e).__name__}: {e}). Expected values `dst`'s library can read as "
            f"{describe_dtype(d.dtype)}; fix: convert `src` first (e.g. cast it, or move it to the CPU)."
        )
        raise PolicyError(msg) from e


def _same_values(d: Any, a: Any, b: Any) -> bool:
    """Would the staged `a` and `b` write the same values into `d`? (Host synchronisation: ties only.)"""
    if a is None or b is None:
        return True
    xp = namespace(d)
    eq = a == b
    if is_inexact_array(d):
        eq = eq | (xp.isnan(a) & xp.isnan(b))
    return bool(xp.all(eq))


def _span(x: Any) -> tuple[tuple[str, int], int, int] | None:
    """``(address space, lowest byte, one past the highest byte)`` touched by `x`, or None."""
    lay = memory_layout(x)
    return None if lay is None else (lay.space, lay.lo, lay.hi)


def _dst_memory(dsts: list[Any]) -> dict[tuple[str, int], tuple[list[int], list[int]]]:
    """Per address space, the union of the `dst` arrays' byte extents as sorted disjoint intervals."""
    spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for d in dsts:
        sp = _span(d)
        if sp is not None:
            spans.setdefault(sp[0], []).append((sp[1], sp[2]))
    out: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for space, iv in spans.items():
        iv.sort()
        starts: list[int] = []
        ends: list[int] = []
        for lo, hi in iv:
            if starts and lo < ends[-1]:
                ends[-1] = max(ends[-1], hi)
            else:
                starts.append(lo)
                ends.append(hi)
        out[space] = (starts, ends)
    return out


def _inside_dst(s: Any, mem: dict[tuple[str, int], tuple[list[int], list[int]]]) -> bool:
    sp = _span(s)
    if sp is None:
        return False
    iv = mem.get(sp[0])
    if iv is None:
        return False
    starts, ends = iv
    _, lo, hi = sp
    j = bisect.bisect_right(starts, lo) - 1
    if j >= 0 and ends[j] > lo:
        return True
    return j + 1 < len(starts) and starts[j + 1] < hi


def load_into(dst: Any, src: Any, /) -> Any:
    """Copy every array of `src` into the matching array of `dst`, in place; return `dst`.

    Every array leaf counts: parameters, buffers, frozen parameters, integer
    and boolean arrays. `dst` keeps its own arrays (the same objects: an
    ``nn.Parameter`` stays the registered parameter of its module, with its
    ``requires_grad``), dtypes and devices: values are cast and moved into
    them (torch: ``copy_`` under ``torch.no_grad()``; NumPy and others:
    ``d[...] = s``). `src` may be of another library if `dst`'s can read it
    (e.g. NumPy arrays into a torch model). Non-array leaves of `dst` are left
    as they are. Afterwards `dst` shares no memory with `src`.

    All or nothing: the whole tree is checked before anything is written.

    Parameters
    ----------
    dst
        The model written into. Its arrays must be mutable (not JAX or Dask,
        not read-only NumPy).
    src
        A model of the same structure and shapes.

    Returns
    -------
    dst : Any
        `dst` itself.

    Raises
    ------
    StructureError
        The structures or an array's shape differ; `src` has an array where
        `dst` has none (or the reverse); a tie in `dst` (one array at two
        places) is fed two different values (the message names both paths);
        two different `dst` arrays share memory, or one has elements sharing
        memory.
    PolicyError
        A complex `src` array would go into a real `dst` array, or a `src`
        array cannot be read by `dst`'s library.
    TypeError
        A `dst` array is immutable (JAX, Dask, read-only NumPy).

    Notes
    -----
    Nothing is moved to the host, except in one case: a tie in `dst` fed by
    two different `src` arrays, whose values are compared.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> dst = {"w": np.zeros(2, dtype=np.float32), "steps": np.array(0), "name": "a"}
    >>> src = {"w": np.array([1.5, 2.5]), "steps": np.array(7), "name": "b"}
    >>> out = fk.load_into(dst, src)
    >>> out is dst, dst["w"], dst["steps"], dst["name"]
    (True, array([1.5, 2.5], dtype=float32), array(7), 'a')
    """
    loader = Loader()
    walk((dst, src), loader.visit, build=BUILD_NONE, with_path=True, names=("dst", "src"))
    loader.commit()
    return dst


class Loader:
    """One load, all or nothing: `visit` checks and stages each ``(path, dst value, src value)``
    pair (nothing written), `commit` then writes every staged value (restoring on failure).

    `load_into` feeds it the pairs of its lock-step walk; ``fk.load_state_dict`` the pairs it
    looked up by key. The one writer of functorkit.
    """

    __slots__ = ("fed", "fname", "plan")

    def __init__(self, fname: str = "load_into") -> None:
        self.fname = fname  # the public function, for messages
        self.plan: list[tuple[KeyPath, ArrayAdapter, Any, Any]] = []  # (path, dst adapter, dst array, staged src)
        self.fed: dict[int, tuple[KeyPath, Any]] = {}  # id(dst array) -> (path, staged src) of its first feed

    def visit(self, path: KeyPath, d: Any, s: Any) -> None:
        """Check the pair at `path` and stage `s` for `d` (raises before anything is written)."""
        plan, fed = self.plan, self.fed
        d_arr, s_arr = _is_array(path, d, "dst"), _is_array(path, s, "src")
        if not d_arr:
            if s_arr:
                msg = (
                    f"at {path.display}: `src` has a {_describe(s)} but `dst` a {type(d).__name__}; "
                    f"fk.{self.fname} only writes into existing arrays. Expected an array in `dst` here; fix: "
                    "give `dst` an array of that shape, or build a new model with fk.fmap."
                )
                raise StructureError(msg)
            return
        if not s_arr:
            msg = (
                f"at {path.display}: `dst` has a {_describe(d)} but `src` a {type(s).__name__}. Expected an "
                "array of the same shape in `src`; fix: pass a `src` of `dst`'s structure."
            )
            raise StructureError(msg)
        ad = adapter_of(d)
        _check_writable(path, ad, d, self.fname)
        _check_readable(path, ad, d, s, self.fname)
        if tuple(d.shape) != tuple(s.shape):
            msg = (
                f"at {path.display}: shape {tuple(d.shape)} in `dst` vs {tuple(s.shape)} in `src`. Expected "
                "equal shapes (no broadcasting); fix: pass models of the same architecture."
            )
            raise StructureError(msg)
        if is_complex(s) and not is_complex(d):
            msg = (
                f"at {path.display}: `src` is complex ({_describe(s)}) but `dst` is real ({_describe(d)}); "
                "copying would drop the imaginary part. Expected a real `src` for a real `dst`; fix: take "
                "the real part explicitly, e.g. fk.fmap(xp.real, src), or make `dst` complex."
            )
            raise PolicyError(msg)
        first = fed.get(id(d))
        if first is not None and first[1] is s:
            return
        staged = _stage(path, ad, d, s, self.fname)
        if first is not None:
            p0, s0 = first
            if staged is not s0 and not _same_values(d, s0, staged):
                msg = (
                    f"at {p0.display} and {path.display}: `dst` has one array at both places (a tie) but "
                    "`src` has different values there. Expected equal values for a tie; fix: untie `dst` "
                    "(give each place its own array), or make `src` agree."
                )
                raise StructureError(msg)
            return
        fed[id(d)] = (path, staged)
        plan.append((path, ad, d, staged))

    def commit(self) -> None:
        """Write every staged value (after the alias checks); on any failure restore `dst`, re-raise."""
        plan = self.plan
        check_no_aliases([(p, d) for p, _, d, _ in plan], f"fk.{self.fname}")
        dsts = [d for _, _, d, _ in plan]
        maybe = may_overlap(dsts, [s for _, _, _, s in plan])
        mem = _dst_memory(dsts) if any(maybe) else {}
        writes: list[tuple[KeyPath, ArrayAdapter, Any, Any]] = []
        for (path, ad, d, s), m in zip(plan, maybe, strict=True):
            if s is None or s is d:
                continue  # meta into meta, or an array loaded into itself
            if m and mem and _inside_dst(s, mem):
                s = ad.copy(s)  # read every value before any write
            writes.append((path, ad, d, s))
        _write_all(writes)


def _write_all(writes: list[tuple[KeyPath, ArrayAdapter, Any, Any]]) -> None:
    """Do the writes; on any exception (KeyboardInterrupt too) restore what was written, re-raise.

    Every `dst` array's old values are copied aside first (adapter ``backups``:
    one allocation on NumPy); on failure the arrays written so far and the one
    being written are restored.
    """
    groups: dict[int, tuple[ArrayAdapter, list[Any]]] = {}
    for _, ad, d, _ in writes:
        groups.setdefault(id(ad), (ad, []))[1].append(d)
    olds: dict[int, Any] = {}
    for ad, ds in groups.values():
        olds.update(zip(map(id, ds), ad.backups(ds)))
    done: list[tuple[KeyPath, ArrayAdapter, Any, Any]] = []
    try:
        for path, ad, d, s in writes:
            done.append((path, ad, d, olds[id(d)]))
            ad.write(d, s)
    except BaseException as e:
        failed = []
        for path, ad, d, old in reversed(done):
            try:
                ad.write(d, old)
            except Exception as again:  # noqa: BLE001 - not a fallback: every failure is reported below
                failed.append(f"{path.display} ({type(again).__name__}: {again})")
        if failed:
            e.add_note(
                "(functorkit: could not restore these `dst` arrays after the error above, so "
                f"they may hold new values: {'; '.join(failed)})"
            )
        raise
