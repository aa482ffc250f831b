"""load_into: copy one model's values into another model's arrays, in place, all or nothing.

One walk over ``(dst, src)`` checks everything and makes a plan (structure,
shapes, complex into real, writability, ties and aliases in `dst`, values
brought into `dst`'s namespace); only then is anything written. A `src`
array whose memory lies inside `dst`'s memory is copied first, so every
value written is the value `src` had when the call began.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import array_api_compat
import numpy as np

from ._alias import check_no_aliases, memory_layout
from ._arith import copy_array
from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._walk import BUILD_NONE, walk
from ._xp import device_of, is_array, namespace

__all__ = ["load_into"]


def _dtype_name(dt: Any) -> str:
    return str(dt).rpartition(".")[2]


def _describe(x: Any) -> str:
    return f"{_dtype_name(x.dtype)} array of shape {tuple(x.shape)}"


def _module(x: Any) -> str:
    return type(x).__module__.partition(".")[0]


def _is_complex(x: Any) -> bool:
    return bool(namespace(x).isdtype(x.dtype, "complex floating"))


def _is_meta(x: Any) -> bool:
    return _module(x) == "torch" and x.device.type == "meta"


def _check_writable(path: KeyPath, d: Any) -> None:
    """Raise before anything is written if `d` cannot be written in place."""
    why = None
    if array_api_compat.is_jax_array(d) or array_api_compat.is_dask_array(d):
        why = f"{type(d).__module__.partition('.')[0]} arrays are immutable"
    else:
        mod = _module(d)
        inner = d if mod == "numpy" else getattr(d, "_array", None) if mod == "array_api_strict" else None
        if isinstance(inner, np.ndarray) and not inner.flags.writeable:
            why = "the array is read-only"
        elif mod == "torch" and d.is_inference():
            import torch

            if not torch.is_inference_mode_enabled():
                why = "it is an inference tensor (made under torch.inference_mode)"
    if why is not None:
        msg = (
            f"at {path.display}: fk.load_into writes into `dst`'s arrays in place, but {why}. Expected "
            "mutable arrays in `dst`; fix: build a new model instead, e.g. "
            "fk.fmap(lambda d, s: s, dst, src), or fk.copy(src)."
        )
        raise TypeError(msg)
    lay = memory_layout(d)
    if lay is not None and math.prod(n for n, _ in lay.dims) < math.prod(d.shape):  # a stride-0 axis
        msg = (
            f"at {path.display}: several elements of this `dst` array share one memory location (stride 0, "
            "as made by expand/broadcast_to), so fk.load_into cannot write distinct values into it. "
            "Expected an array that owns each element; fix: materialise it first (e.g. .contiguous())."
        )
        raise StructureError(msg)


def _into_namespace(path: KeyPath, d: Any, s: Any) -> Any:
    """`s` as an array of `d`'s namespace, ready for ``d[...] = s`` / ``d.copy_(s)``."""
    dxp = namespace(d)
    if namespace(s) is not dxp:
        src = s.detach() if _module(s) == "torch" else s
        try:
            s = dxp.asarray(src)
        except Exception:  # noqa: BLE001 - try the other interchange path, then explain
            try:
                s = dxp.from_dlpack(src)
            except Exception as e:
                msg = (
                    f"at {path.display}: fk.load_into cannot bring `src`'s {type(src).__name__} "
                    f"(on {device_of(src)}) into `dst`'s {type(d).__name__} namespace ({e}). Expected arrays "
                    "the destination library can read; fix: convert `src` first (e.g. move it to the CPU)."
                )
                raise PolicyError(msg) from e
    if _is_meta(s) and not _is_meta(d):
        msg = (
            f"at {path.display}: `src` holds a meta tensor here (no data) but `dst` a {_describe(d)} on "
            f"{device_of(d)}. Expected values to copy; fix: materialise `src` first."
        )
        raise ValueError(msg)
    mod = _module(d)
    if mod not in ("torch", "numpy"):
        # torch's copy_ and NumPy's setitem convert dtype and device; others get ready-made values
        if s.dtype != d.dtype:
            s = dxp.astype(s, d.dtype)
        dev = device_of(d)
        if dev is not None and device_of(s) != dev:
            s = array_api_compat.to_device(s, dev)
    return s


def _same_values(d: Any, a: Any, b: Any) -> bool:
    """Would `a` and `b` write the same values into `d`? (Host synchronisation: ties only.)"""
    if _is_meta(d):
        return True
    xp = namespace(d)
    dev = device_of(d)

    def ready(x: Any) -> Any:
        if x.dtype != d.dtype:
            x = xp.astype(x, d.dtype)
        if dev is not None and device_of(x) != dev:
            x = array_api_compat.to_device(x, dev)
        return x

    a, b = ready(a), ready(b)
    eq = a == b
    if xp.isdtype(d.dtype, ("real floating", "complex floating")):
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
    plan: list[tuple[KeyPath, Any, Any]] = []
    fed: dict[int, tuple[KeyPath, Any]] = {}  # id(dst array) -> (path, prepared src) of its first feed

    def visit(path: KeyPath, d: Any, s: Any) -> None:
        d_arr, s_arr = is_array(d), is_array(s)
        if not d_arr:
            if s_arr:
                msg = (
                    f"at {path.display}: `src` has a {_describe(s)} but `dst` a {type(d).__name__}; "
                    "fk.load_into only writes into existing arrays. Expected an array in `dst` here; fix: "
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
        _check_writable(path, d)
        if tuple(d.shape) != tuple(s.shape):
            msg = (
                f"at {path.display}: shape {tuple(d.shape)} in `dst` vs {tuple(s.shape)} in `src`. Expected "
                "equal shapes (no broadcasting); fix: pass models of the same architecture."
            )
            raise StructureError(msg)
        if _is_complex(s) and not _is_complex(d):
            msg = (
                f"at {path.display}: `src` is complex ({_describe(s)}) but `dst` is real ({_describe(d)}); "
                "copying would drop the imaginary part. Expected a real `src` for a real `dst`; fix: take "
                "the real part explicitly, e.g. fk.fmap(xp.real, src), or make `dst` complex."
            )
            raise PolicyError(msg)
        prepared = _into_namespace(path, d, s)
        first = fed.get(id(d))
        if first is not None:
            p0, s0 = first
            if prepared is not s0 and not _same_values(d, s0, prepared):
                msg = (
                    f"at {p0.display} and {path.display}: `dst` has one array at both places (a tie) but "
                    "`src` has different values there. Expected equal values for a tie; fix: untie `dst` "
                    "(give each place its own array), or make `src` agree."
                )
                raise StructureError(msg)
            return
        fed[id(d)] = (path, prepared)
        plan.append((path, d, prepared))

    walk((dst, src), visit, build=BUILD_NONE, with_path=True, names=("dst", "src"))
    check_no_aliases([(p, d) for p, d, _ in plan], "fk.load_into")
    mem = _dst_memory([d for _, d, _ in plan])
    writes: list[tuple[Any, Any]] = []
    for _, d, s in plan:
        if s is d:
            continue  # loading an array into itself
        if mem and _inside_dst(s, mem):
            s = copy_array(s)  # read every value before any write
        writes.append((d, s))
    torch_writes = [(d, s) for d, s in writes if _module(d) == "torch"]
    if torch_writes:
        import torch

        with torch.no_grad():
            for d, s in torch_writes:
                d.copy_(s)
    for d, s in writes:
        if _module(d) != "torch":
            d[...] = s
    return dst
