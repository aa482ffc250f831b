"""PyTorch: tensors as arrays (the `Adapter`) and ``torch.nn.Module`` as a node
(`node_for`); imported only once torch is.

Array operations
----------------
Tensors get method calls instead of namespace functions, ``copy_`` under
``no_grad`` for writes, views built with one ``split_with_sizes`` (one
concatenation in backward) or ``as_strided``, and NumPy views of CPU tensors
where NumPy is faster. Two private torch APIs are feature-detected once, at
import, each with a fallback (tests monkeypatch these module globals):

* `is_functorch_wrapped` (``torch._C._functorch.is_functorch_wrapped_tensor``):
  tensors inside ``torch.func`` transforms must not be written in place or
  viewed with ``as_strided``. Fallback: every tensor counts as wrapped (always
  the out-of-place / ``split_with_sizes`` path: correct, a little slower).
* `has_python_dispatch` (``torch._C._dispatch_keys`` and
  ``DispatchKey.Python``): wrapper subclasses such as ``FakeTensor`` have no
  real memory. Fallback: every tensor subclass counts as such (no alias check
  for subclasses; plain tensors are unaffected).

``torch.compile``
-----------------
Neither probe can be traced by Dynamo, nor can NumPy views of tensors,
``data_ptr`` or ``is_inference``. Every method that uses one first asks
`compiling` (``torch.compiler.is_compiling()``, a constant while Dynamo
traces): under it, tensors count as wrapped (no in-place accumulation, no
``as_strided``: the out-of-place paths, which Inductor fuses anyway), copies
are ``copy_`` and memory checks are skipped (fake tensors have no memory).
The family's probe module (``_torch_probe``, loaded by `functorkit.adapters.tracing` as soon as
torch is imported) adds the same test to the core's tracing probes, so generated code is not
made while tracing either; the adapter does not add it a second time (the column path of the
arithmetic asks ``tracing()`` on every call).

Modules
-------
``torch.nn.Module`` nodes live in `functorkit.adapters._torch_module` (`node_for`,
re-exported here).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch

from . import _dtensor, _dtensor_columns, _torch_flat
from ._base import _HOST, ArrayAdapter, Layout, _size, adapter_of, extent, normalise_layout
from ._kernels import spans_disjoint
from ._torch_module import _Uninitialized, claims, node_for

__all__ = ["Adapter", "claims", "compiling", "foreach_lerp_", "has_python_dispatch", "is_functorch_wrapped", "node_for"]


# ---------------------------------------------------------------- private APIs, detected once


_LAYOUT = operator.attrgetter("layout")
_IS_NESTED = operator.attrgetter("is_nested")


def _all_wrapped(t: Any) -> bool:
    return True


def _detect_functorch() -> Callable[[Any], bool]:
    functorch = getattr(torch._C, "_functorch", None)
    found = getattr(functorch, "is_functorch_wrapped_tensor", None)
    return found if callable(found) else _all_wrapped


def _subclass_has_no_memory(t: Any) -> bool:
    return type(t) not in _PLAIN


def _detect_python_dispatch() -> Callable[[Any], bool]:
    keys = getattr(torch._C, "_dispatch_keys", None)
    python_key = getattr(getattr(torch._C, "DispatchKey", None), "Python", None)
    if keys is None or python_key is None:
        return _subclass_has_no_memory

    def python_dispatch(t: Any) -> bool:
        return bool(keys(t).has(python_key))

    return python_dispatch


_PLAIN: tuple[type, ...] = (torch.Tensor, torch.nn.Parameter)
_PLAIN_SET = frozenset(_PLAIN)
_NBYTES = operator.attrgetter("nbytes")
_IS_SAME_SIZE: Callable[[Any, Any], bool] = torch.Tensor.is_same_size
_DTYPE = operator.attrgetter("dtype")
_DEVICE = operator.attrgetter("device")
#: ``torch.func`` wrapper test (private API; fallback: every tensor counts as wrapped)
is_functorch_wrapped: Callable[[Any], bool] = _detect_functorch()
#: Python-dispatch (wrapper subclass) test (private API; fallback: every subclass counts)
has_python_dispatch: Callable[[Any], bool] = _detect_python_dispatch()


def _detect_foreach_lerp() -> Callable[..., Any] | None:
    found = getattr(torch, "_foreach_lerp_", None)
    return found if callable(found) else None


#: torch's float8 dtypes (those this torch has): torch has no arithmetic kernels for them (``x + y``
#: raises ``NotImplementedError``), so the arithmetic computes them in float32 and rounds each result
#: element once (`Adapter.compute_dtype`; SPEC 12). float4_e2m1fn_x2 packs two values per byte and
#: has no cast to float32: not among them.
_F8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
_F8: frozenset[Any] = frozenset(d for d in (getattr(torch, n, None) for n in _F8_NAMES) if d is not None)
_F32 = torch.float32


#: ``torch._foreach_lerp_`` (private API; fallback None: one ``lerp_`` per tensor)
foreach_lerp_: Callable[..., Any] | None = _detect_foreach_lerp()


def _detect_foreach() -> dict[str, Callable[..., Any]] | None:
    found = {n: getattr(torch, f"_foreach_{n}_", None) for n in ("copy", "mul", "add", "sub", "div")}
    return None if not all(map(callable, found.values())) else cast(dict[str, Callable[..., Any]], found)


#: `Adapter.arith_many_` into another model's tensors starts with a ``_foreach_copy_`` (one more
#: pass over `out` than the rows' ``torch.mul(x, c, out=o)``): taken while the tensors average at most
#: this many bytes (cache-sized, where a Python call per tensor costs more than the copy)
FOREACH_COPY_BYTES = 32 << 10

#: ``torch._foreach_copy_/mul_/add_/sub_/div_`` (private API; fallback None: one kernel per tensor):
#: ``out=``'s column path writes every row of add, sub, scale, lincomb and mean with a few of these
#: (`Adapter.arith_many_`; bench_arith's small-model ``lincomb, out=`` rows)
foreach_arith_: dict[str, Callable[..., Any]] | None = _detect_foreach()


def _detect_set_grad() -> Callable[[bool], None] | None:
    found = getattr(torch._C, "_set_grad_enabled", None)
    return found if callable(found) else None


#: ``torch._C._set_grad_enabled``, what ``torch.no_grad`` calls on entry and exit (private API;
#: fallback None: ``torch.no_grad()``): 0.2 µs against the context manager's 1.3 per small in-place
#: call (bench_arith's small-model ``out=`` rows)
set_grad_enabled_: Callable[[bool], None] | None = _detect_set_grad()


def without_grad(f: Callable[..., Any], *args: Any) -> Any:
    """``f(*args)`` with autograd off, as under ``torch.no_grad()``: nothing switched when it is off
    already, and the mode restored on the way out, an exception included. Not under torch.compile
    (its callers are eager-only paths)."""
    if not torch.is_grad_enabled():
        return f(*args)
    switch = set_grad_enabled_
    if switch is None:
        with torch.no_grad():
            return f(*args)
    switch(False)
    try:
        return f(*args)
    finally:
        switch(True)


def _detect_compiling() -> Callable[[], bool]:
    compiler = getattr(torch, "compiler", None)
    found = getattr(compiler, "is_compiling", None)
    return found if callable(found) else _never


def _never() -> bool:
    return False


#: True while ``torch.compile`` traces (``torch.compiler.is_compiling``; older torch: never)
compiling: Callable[[], bool] = _detect_compiling()


def _wrapped_or_compiling(t: Any) -> bool:
    """The generated ``re(p)`` code's test: the ``split_with_sizes`` path inside ``torch.func``
    transforms and while ``torch.compile`` traces (Dynamo cannot trace the private probe)."""
    return compiling() or is_functorch_wrapped(t)


#: CPU flat vectors of at least this many bytes are allocated by NumPy (see Adapter.empty)
_NUMPY_ALLOC_MIN = 1 << 20


def _cat_ok(leaves: list[Any], dtype: Any, device: Any) -> bool:
    """Every leaf a plain tensor (no subclass, no functorch wrapper) of `dtype` on `device`, and no
    ``torch.compile`` tracing: one concatenation then makes exactly the vector `fill` would. In
    C-level passes over the leaves (no Python step per leaf)."""
    if compiling() or not _torch_flat.plain_of(leaves, dtype, device):
        return False
    return not any(map(is_functorch_wrapped, leaves))


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    acc = 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _numpy_view(t: Any) -> Any:
    """A NumPy view (no copy) of a plain CPU tensor, or None (other devices and dtypes,
    conjugate/negative bits, subclasses, functorch wrappers)."""
    if type(t) is not torch.Tensor:
        return None
    try:
        return t.numpy()
    except (RuntimeError, TypeError):
        return None


class Adapter(ArrayAdapter):
    family = "torch"
    device_attr = True

    def device(self, x: Any) -> Any:
        """``x.device`` (array_api_compat's lookup costs a call per tensor)."""
        return x.device

    def readable(self, device: Any) -> bool:
        """A ``meta`` tensor has no values."""
        return getattr(device, "type", None) != "meta"

    def array_types(self, t: type) -> frozenset[type]:
        """A plain Tensor and an ``nn.Parameter`` stand for each other (``re(p)`` gives plain tensors
        where a module had parameters; flattening the rebuilt module must take the fast path)."""
        if t in _PLAIN:
            return frozenset(_PLAIN)
        return frozenset({t})

    def detach(self, x: Any) -> Any:
        return x.detach()

    def views(self, p: Any, offsets: list[int], shapes: list[tuple[int, ...]]) -> list[Any]:
        """One ``split_with_sizes``: its backward is one concatenation, where a slice per parameter
        would allocate a full-size gradient each (bench_flat ``re(p)`` backward rows)."""
        chunks = p.split_with_sizes([_size(s) for s in shapes])
        return [c if len(s) == 1 else c.view(s) for c, s in zip(chunks, shapes, strict=True)]

    def view_source(self, offsets: list[int], shapes: list[tuple[int, ...]], glb: dict[str, Any]) -> list[str]:
        """``as_strided`` (cheapest: bench_flat torch ``re(p)`` rows) unless autograd, a functorch
        wrapper or a strided ``p`` is involved; then one ``split_with_sizes`` (see `views`)."""
        glb["WRAPPED"] = _wrapped_or_compiling
        glb["SIZES"] = [_size(s) for s in shapes]
        lines = [
            "    if p.requires_grad or WRAPPED(p) or p.stride(0) != 1:",
            "        s = p.split_with_sizes(SIZES)",
        ]
        for k, s in enumerate(shapes):
            lines.append(f"        v{k} = s[{k}]" + ("" if len(s) == 1 else f".view({s!r})"))
        lines += ["    else:", "        b = p.storage_offset()"]
        for k, (o, s) in enumerate(zip(offsets, shapes, strict=True)):
            lines.append(f"        v{k} = p.as_strided({s!r}, {_contiguous_strides(s)!r}, b + {o})")
        return lines

    def check_source(self, ftype: type, n: int, dtype: Any, device: Any, glb: dict[str, Any]) -> str:
        """Identity test of the dtype and ``p.device`` (bench_flat torch ``re(p)`` rows)."""
        glb.update(T=ftype, S=(n,), D=dtype, DEV=device)
        return "type(p) is not T or p.shape != S or p.dtype is not D or p.device != DEV"

    def empty(self, dtype: Any, device: Any, n: int) -> Any:
        """CPU vectors of 1 MiB or more are allocated by NumPy and wrapped (``torch.from_numpy``).

        NumPy asks the kernel for transparent huge pages (``madvise``), torch's
        CPU allocator does not, and first-touch page faults made
        ``torch.empty`` + copy ~4x slower than the copy itself (bench_flat
        ``destructure`` torch rows).
        """
        dev = torch.device("cpu") if device is None else device
        if dev.type == "cpu" and n * dtype.itemsize >= _NUMPY_ALLOC_MIN and not compiling():
            probe = _numpy_view(torch.empty(0, dtype=dtype))
            if probe is not None:
                return torch.from_numpy(np.empty(n, dtype=probe.dtype))
        return torch.empty(n, dtype=dtype, device=dev)

    def new_flat(
        self, dtype: Any, device: Any, n: int, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]
    ) -> Any:
        """`empty` + `fill` (no autograd history: filled under ``no_grad``).

        A vector under ``_torch_flat.CAT_MAX_BYTES`` (16 MiB) whose leaves are plain tensors of its
        dtype and device is one ``flatten_dense_tensors`` instead (one allocation and one C++
        concatenation, where `fill` makes two NumPy views per leaf: bench_flat "mlp, torch"
        ``destructure(model)`` row, bench_walk's module ``fk.destructure`` row; `_torch_flat`)."""
        if leaves and n * dtype.itemsize < _torch_flat.CAT_MAX_BYTES and _cat_ok(leaves, dtype, device):
            return _torch_flat.concat(leaves)
        if leaves and not compiling() and any(map(is_functorch_wrapped, leaves)):
            # inside a torch.func transform (grad, jvp, vmap): the wrapped tensors themselves,
            # concatenated, so the transform differentiates and batches through the vector (as JAX
            # tracers pass through); detached copies would give zero derivatives, silently
            return torch.cat([x.reshape(-1).to(dtype=dtype, device=device) for x in leaves])
        out = self.empty(dtype, device, n)
        self.fill(out, leaves, offsets, shapes)
        return out

    def proves_apart(self, out: Any, arrays: list[Any]) -> bool:
        """`_torch_flat.proves_apart` (``data_ptr`` ranges, C-level passes)."""
        return _torch_flat.proves_apart(out, arrays)

    def plans_flat(self, leaves: list[Any], dtype: Any, device: Any, uniform: bool = False) -> Any:
        """`_torch_flat.plans_flat`: plain tensors of `dtype` on `device`, their byte counts."""
        return _torch_flat.plans_flat(leaves, dtype, device, uniform)

    def planned_flat(self, leaves: list[Any], token: Any) -> Any:
        """`_torch_flat.planned_flat` (one pass: alias proof and ``flatten_dense_tensors``)."""
        return _torch_flat.planned_flat(leaves, token, is_functorch_wrapped is not _all_wrapped)

    def planned_fill(self, out: Any, leaves: list[Any], token: Any) -> bool:
        """`_torch_flat.planned_fill` (one ``torch.cat(..., out=out)``)."""
        return _torch_flat.planned_fill(out, leaves, token, is_functorch_wrapped)

    def fill(self, out: Any, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]) -> None:
        """One ``torch.cat(..., out=out)`` of plain tensors of `out`'s dtype and device into an `out`
        under ``_torch_flat.CAT_OUT_MAX_BYTES`` (16 MiB; bench_flat's "re.flatten cat" on/off row);
        else ``np.copyto`` between NumPy views of plain CPU tensors (faster than ``copy_`` for
        small tensors: bench_flat torch ``re.flatten`` rows), else ``copy_`` under ``no_grad``."""
        if not compiling() and any(map(is_functorch_wrapped, leaves)):
            msg = (
                "re.flatten(out=...) writes the parameters into `out` outside autograd, but the model's "
                "tensors are torch.func wrappers (this runs inside torch.func.grad, jvp or vmap), whose "
                "derivatives or batch dimension a plain `out` cannot hold. Expected plain tensors; fix: "
                "call re.flatten(model) without out= inside a transform (a new vector the transform sees)."
            )
            raise TypeError(msg)
        if (
            leaves
            and out.numel() * out.dtype.itemsize < _torch_flat.CAT_OUT_MAX_BYTES
            and type(out) is torch.Tensor
            and not compiling()
            and _torch_flat.plain_of(leaves, out.dtype, out.device)
        ):
            _torch_flat.cat_into(out, leaves)  # one torch.cat(..., out=out) (bench_flat re.flatten rows)
            return
        out_np = None if compiling() else _numpy_view(out.detach())
        with torch.no_grad():
            for x, o, s in zip(leaves, offsets, shapes, strict=True):
                src = x.detach()
                if out_np is not None:
                    src_np = _numpy_view(src)
                    if src_np is not None:
                        np.copyto(out_np[o : o + _size(s)].reshape(s), src_np)
                        continue
                out[o : o + _size(s)].view(s).copy_(src)

    def copy(self, x: Any) -> Any:
        """``clone`` (keeps autograd; the namespace's ``asarray(copy=True)`` does not)."""
        return x.clone()

    def keep_kind(self, new: Any, old: Any) -> Any:
        """A frozen ``nn.Parameter`` `old` gives a frozen Parameter (a plain tensor in a parameter slot
        is trainable, SPEC 3: stacking a frozen bias made it trainable); anything else `new`."""
        if type(old) is torch.nn.Parameter and not old.requires_grad and type(new) is torch.Tensor:
            return torch.nn.Parameter(new, requires_grad=False)
        return new

    def clone_leaf(self, x: Any) -> Any:
        """Detached like ``copy.deepcopy``: an ``nn.Parameter`` stays one, ``requires_grad`` is kept.
        A DTensor keeps its placements with no communication (`_dtensor.clone_local`: DTensor's own
        ``clone`` all-reduces a ``Partial`` one into ``Replicate``)."""
        if type(x) not in _PLAIN:
            if isinstance(x, _Uninitialized):
                msg = (
                    "this parameter is uninitialized (a lazy module's): it has no shape and no values yet, so "
                    "it cannot be copied. Expected initialized parameters; fix: run one forward pass through "
                    "the model first, which initializes them."
                )
                raise ValueError(msg)
            y = _dtensor.clone_local(x)
            if y is None:
                y = x.detach().clone()
        else:
            y = x.detach().clone()
        if isinstance(x, torch.nn.Parameter):
            return torch.nn.Parameter(y, requires_grad=x.requires_grad)
        if x.requires_grad:
            y.requires_grad_(True)
        return y

    def to_device(self, x: Any, device: Any) -> Any:
        return x.to(device)

    def write_problem(self, x: Any) -> str | None:
        """Inference tensors cannot be written outside ``inference_mode``; sparse and nested
        tensors cannot be written in place with dense values; a lazy module's uninitialized
        parameter has no shape yet (asking it anything else raises torch's own error)."""
        if isinstance(x, _Uninitialized):
            return (
                "it is an uninitialized parameter of a lazy module (no shape and no values yet); fix: run one "
                "forward pass through the model first, which initializes it"
            )
        if not compiling() and x.is_inference() and not torch.is_inference_mode_enabled():
            return "it is an inference tensor (made under torch.inference_mode)"
        return self.dense_problem(x)

    may_be_sparse = True

    def first_not_dense(self, arrays: Sequence[Any], eager: bool = False) -> int | None:
        """Sparse (COO, CSR, CSC, BSR, BSC) and nested tensors: two C-level passes over the
        tensors' ``layout`` and ``is_nested`` (no Python step per tensor when all are dense).
        Not looked at under torch.compile (a sparse or nested tensor does not trace there);
        `eager`: the caller has asked (the arithmetic's column path, twice per call)."""
        if not eager and compiling():
            return None
        layouts = list(map(_LAYOUT, arrays))
        if layouts.count(torch.strided) == len(layouts) and not any(map(_IS_NESTED, arrays)):
            return None
        nested = list(map(_IS_NESTED, arrays))
        for j, (lay, nst) in enumerate(zip(layouts, nested, strict=True)):
            if lay is not torch.strided or nst:
                return j
        return None

    def dense_problem(self, x: Any) -> str | None:
        """A sparse or nested tensor: which, and how to make it dense (not looked at under
        torch.compile)."""
        if compiling():
            return None
        if x.is_nested:
            return (
                "it is a nested tensor (torch.nested), not a dense one; fix: pad it "
                "(torch.nested.to_padded_tensor(x, 0.0)) or keep its components as a list (x.unbind())"
            )
        if x.layout is not torch.strided:
            return (
                f"it is a {str(x.layout).rpartition('.')[2]} tensor, not a dense (strided) one; "
                "fix: convert it with x.to_dense()"
            )
        return None

    def overlap_problem(self, x: Any) -> str | None:
        """A contiguous tensor has no two elements in one place: no layout to compute (bench_arith
        small-model ``out=`` rows)."""
        if x.layout is torch.strided and not x.is_nested and x.is_contiguous():
            return None
        return super().overlap_problem(x)

    def read_problem(self, x: Any) -> str | None:
        """Sparse, nested, mkldnn and quantized tensors are not dense arrays of a numeric dtype."""
        if x.layout is not torch.strided:
            return f"it is a {str(x.layout).rpartition('.')[2]} tensor, not a dense (strided) one"
        if x.is_nested:
            return "it is a nested tensor, not a dense one"
        if x.is_quantized:
            return f"it is a quantized tensor ({str(x.dtype).rpartition('.')[2]})"
        return None

    def stage(self, dst: Any, src: Any) -> Any:
        """A plain tensor of `dst`'s dtype and device, made with ``copy_`` under ``no_grad`` (so a
        subclass's own ``copy_`` runs here, before anything is written). A DTensor `dst` or `src`:
        `functorkit.adapters._dtensor.stage` (shard to shard, or this rank's shard cut locally)."""
        if type(src) in _PLAIN and src.dtype is dst.dtype and src.device == dst.device and type(dst) in _PLAIN:
            return src.detach()
        if type(dst) not in _PLAIN or type(src) not in _PLAIN:
            return _dtensor.stage(dst, src, self._stage_plain)
        return self._stage_plain(dst, src)

    def _stage_plain(self, dst: Any, src: Any) -> Any:
        if type(src) in _PLAIN and src.dtype is dst.dtype and src.device == dst.device:
            return src.detach()
        sa = adapter_of(src)
        if sa is not self:
            ml = _from_ml_dtypes(src)  # NumPy/Dask bfloat16/float8 (ml_dtypes): neither DLPack nor asarray take them
            src = self.to_namespace(sa.detach(src), dst.device) if ml is None else ml
        buf = torch.empty(tuple(dst.shape), dtype=dst.dtype, device=dst.device)
        with torch.no_grad():
            buf.copy_(src.detach())
        return buf

    def write(self, dst: Any, src: Any) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def to_namespace(self, x: Any, device: Any) -> Any:
        """`ArrayAdapter.to_namespace`; NumPy and Dask arrays of ``ml_dtypes`` floats (bfloat16,
        float8: neither DLPack nor ``asarray`` take them) by `_from_ml_dtypes` (the same bits)."""
        ml = _from_ml_dtypes(x)
        if ml is None:
            return super().to_namespace(x, device)
        if device is not None and ml.device != device:
            ml = ml.to(device)
        return ml.clone()

    def export(self, x: Any) -> Any:
        """Detached, with its conjugate and negative bits resolved (``numpy()`` and DLPack refuse
        them); a CPU bfloat16/float8 tensor as the ``ml_dtypes`` NumPy array of its bits (`host_view`:
        NumPy has no such dtypes); a `TypeError` for a ``meta`` tensor (no values to convert)."""
        if x.device.type == "meta":
            msg = (
                "it is a `meta` tensor, which holds no values to convert into another library; "
                "materialise it first (or pass an array of the target library)"
            )
            raise TypeError(msg)
        t = x.detach()
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():
            t = t.resolve_neg()
        if t.dtype in _STAND_IN and t.is_cpu:
            v = self.host_view(t)
            if v is not None:
                return v
        return t

    def backup(self, x: Any) -> Any:
        return x.detach().clone()

    def host_view(self, x: Any) -> Any:
        """A NumPy view of a plain CPU tensor (no copy); bfloat16 and float8 as the ``ml_dtypes``
        type of the same bits, where ml_dtypes is installed (NumPy has none of its own: a torch
        bfloat16 tensor then loads into a NumPy model, ``fk.load_into``); None otherwise."""
        if not x.is_cpu or compiling():
            return None
        t = x.detach()
        v = _numpy_view(t)
        if v is None and type(t) is torch.Tensor and t.dtype in _STAND_IN:
            ml = _ml_dtype(t.dtype)
            if ml is not None:
                v = t.view(_STAND_IN[t.dtype]).numpy().view(ml)
        return v

    def memory_extent(self, x: Any) -> tuple[tuple[str, int], int, int] | None:
        """From ``data_ptr``/``stride`` (no NumPy view: cheaper, and works on GPUs)."""
        if x.layout is not torch.strided or x.is_nested or compiling():  # no plain strided memory
            return None
        if type(x) not in _PLAIN and has_python_dispatch(x):  # FakeTensor and other wrappers: no memory
            return None
        if x.is_cpu:
            space = _HOST
        else:
            dev = x.device
            if dev.type == "meta":
                return None
            space = (dev.type, dev.index or 0)
        if x.numel() == 0:
            return None
        try:
            ptr = x.data_ptr()
        except (RuntimeError, NotImplementedError, TypeError):  # no storage: torch.func wrappers, fake tensors
            return None
        if ptr == 0:
            return None
        if x.is_contiguous():
            return space, ptr, ptr + x.nbytes
        isz = x.element_size()
        lo, hi = extent(ptr, x.shape, [st * isz for st in x.stride()], isz)
        return space, lo, hi

    def memory_layout(self, x: Any) -> Layout | None:
        ext = self.memory_extent(x)
        if ext is None:
            return None
        isz = x.element_size()
        return normalise_layout(ext[0], x.data_ptr(), tuple(x.shape), tuple(s * isz for s in x.stride()), isz)

    def byte_strides(self, x: Any) -> tuple[int, ...] | None:
        isz = x.element_size()
        return tuple(s * isz for s in x.stride())

    def inplace_ok(self, arrays: Sequence[Any]) -> bool:
        """Plain tensors outside ``torch.func`` transforms: one allocation per leaf instead of one
        per term (bench_arith ``lincomb``/``mean`` torch rows)."""
        if compiling():
            return False
        wrapped = is_functorch_wrapped
        return all(type(t) in _PLAIN and not wrapped(t) for t in arrays)

    def axpy(self, acc: Any, x: Any, c: Any, inplace: bool) -> Any:
        if not inplace:
            # out of place, the same kernel as in place (``add(alpha=)``): the values of the
            # functional form and of ``out=`` agree bit for bit (SPEC 14) on DTensors and under
            # transforms too (``acc + x * c`` rounds twice)
            return acc + x * c if isinstance(c, torch.Tensor) else torch.add(acc, x, alpha=c)
        if isinstance(c, torch.Tensor):
            return acc.addcmul_(x, c)
        return acc.add_(x, alpha=c)

    def add(self, acc: Any, x: Any, inplace: bool) -> Any:
        return acc.add_(x) if inplace else acc + x

    def div(self, acc: Any, n: int, inplace: bool) -> Any:
        return acc.div_(n) if inplace else acc / n

    def lerp(self, x: Any, y: Any, t: float) -> Any:
        """``torch.lerp`` (one kernel; the generic formula is the same but three operations)."""
        return x.lerp(y, t)

    # ---- arithmetic kernels (SPEC 14: with `out`, written under no_grad, as optimizers do) ------
    #
    # float8 parameters (`_F8`: torch has no kernels for them) take the generic kernels
    # (``Kernels``): the inputs cast to float32 (`compute_dtype`), the NumPy adapter's formulas
    # operation by operation in float32, the result rounded once into the float8 dtype, then copied
    # into `out` (every input read before the write); the same bytes as NumPy's ml_dtypes float8
    # for the same values. The test is one dtype lookup in a set per parameter; float32, float16
    # and bfloat16 take torch's own kernels as before.

    #: the dtypes whose tensors' own ``+`` and ``-`` cannot compute (``fk.add``/``fk.sub`` then
    #: call these kernels instead: ``functorkit._lockstep``)
    operator_less = _F8

    def compute_dtype(self, dtype: Any) -> Any:
        """float32 for torch's float8 dtypes (no torch kernels: computed in float32, each result
        element rounded once); None otherwise: float16 and bfloat16 are computed by torch's own
        kernels (in float32 internally, each operation's result rounded)."""
        return _F32 if dtype in _F8 else None

    def _float8(self, kernel: Callable[..., Any], args: tuple[Any, ...], out: Any) -> Any:
        """`kernel` (a generic ``Kernels.op_*``, bound) for float8 parameters; with `out` under ``no_grad``."""
        if out is None:
            return kernel(*args)
        with torch.no_grad():
            return kernel(*args, out)

    def op_add(self, x: Any, y: Any, out: Any = None) -> Any:
        if x.dtype in _F8:
            return self._float8(super().op_add, (x, y), out)
        if out is None:
            return x + y
        with torch.no_grad():
            if out is x:
                out.add_(y)
            else:
                torch.add(x, y, out=out)
        return out

    def op_sub(self, x: Any, y: Any, out: Any = None) -> Any:
        if x.dtype in _F8:
            return self._float8(super().op_sub, (x, y), out)
        if out is None:
            return x - y
        with torch.no_grad():
            if out is x:
                out.sub_(y)
            else:
                torch.sub(x, y, out=out)
        return out

    def op_scale(self, x: Any, c: Any, out: Any = None) -> Any:
        if x.dtype in _F8:
            return self._float8(super().op_scale, (x, c), out)
        if out is None:
            return x * c
        with torch.no_grad():
            if out is x:
                out.mul_(c)
            else:
                torch.mul(x, c, out=out)
        return out

    def op_div(self, x: Any, c: Any, out: Any = None) -> Any:
        if x.dtype in _F8:
            return self._float8(super().op_div, (x, c), out)
        if out is None:
            return x / c
        with torch.no_grad():
            if out is x:
                out.div_(c)
            else:
                torch.div(x, c, out=out)
        return out

    def op_lincomb(self, xs: Sequence[Any], cs: Sequence[Any], out: Any = None) -> Any:
        """``mul`` then ``add_(x, alpha=c)`` per term (``addcmul_`` for a 0-d tensor `c`): one
        allocation per result, not one per term (bench_arith ``lincomb`` torch rows); out of place
        where autograd or a tracer forbids writing (``inplace_ok``)."""
        if xs[0].dtype in _F8:
            return self._float8(super().op_lincomb, (xs, cs), out)
        if out is None:
            acc = xs[0] * cs[0]
            inplace = self.inplace_ok((*xs, *(c for c in cs if isinstance(c, torch.Tensor))))
            for xk, ck in zip(xs[1:], cs[1:], strict=True):
                acc = self.axpy(acc, xk, ck, inplace)
            return acc
        with torch.no_grad():
            if out is xs[0]:
                out.mul_(cs[0])
            else:
                torch.mul(xs[0], cs[0], out=out)
            for xk, ck in zip(xs[1:], cs[1:], strict=True):
                self.axpy(out, xk, ck, True)
        return out

    def op_mean(self, xs: Sequence[Any], out: Any = None) -> Any:
        if xs[0].dtype in _F8:
            return self._float8(super().op_mean, (xs,), out)
        n = len(xs)
        if out is None:
            if n == 1:
                return xs[0] / 1
            inplace = self.inplace_ok(xs)
            acc = xs[0] + xs[1]
            for o in xs[2:]:
                acc = self.add(acc, o, inplace)
            return self.div(acc, n, inplace)
        with torch.no_grad():
            if n == 1:
                torch.div(xs[0], 1, out=out)
                return out
            if out is xs[0]:
                out.add_(xs[1])
            else:
                torch.add(xs[0], xs[1], out=out)
            for o in xs[2:]:
                out.add_(o)
            out.div_(n)
        return out

    def out_fast(
        self, outs: list[Any], arrays: list[Any], eager: bool = False, local: tuple[list[Any], list[Any]] | None = None
    ) -> bool:
        """Plain contiguous tensors of a device that has memory (not ``meta``), with storage
        (``data_ptr`` raises for ``torch.func`` wrappers); no inference tensor in `outs`; the byte
        ranges (``data_ptr``, ``nbytes``) of `arrays` do not meet. DTensors of one mesh and one
        placements tuple are judged by their local shards (`_dtensor.uniform_locals`: the mesh and
        placements once per distinct ``DTensorSpec``; `outs`, among `arrays`, are not judged again;
        `local`: the shards the caller has, from ``stand_ins``, not asked for again).
        Not while ``torch.compile`` traces (the per-leaf path traces; `eager`: the caller has asked
        ``tracing()``, out='s column path)."""
        if not eager and compiling():
            return False
        if type(arrays[0]) not in _PLAIN:  # DTensors of one mesh and placements: their shards (the
            # caller checked that the arrays are of one type)
            if local is not None:  # (`stand_ins` gave them: every array a DTensor)
                if not _dtensor.uniform(arrays):
                    return False
                local_outs, shards = local
            else:
                got = _dtensor.uniform_locals(arrays)
                if got is None:
                    return False
                shards = got
                n = len(outs)
                if all(map(operator.is_, outs, arrays[:n])):  # `outs` first (fk.lerp(ema, m, t, out=ema))
                    local_outs = shards[:n]
                else:
                    found = _dtensor.stand_ins(outs)
                    if found is None:
                        return False
                    local_outs = found
            arrays, outs = shards, local_outs
            if not set(map(type, arrays)) <= _PLAIN_SET:
                return False
        if arrays[0].is_meta:  # (a bool attribute: no ``torch.device`` made)
            return False
        if not all(map(torch.Tensor.is_contiguous, arrays)) or any(map(torch.Tensor.is_inference, outs)):
            return False
        try:
            los = list(map(torch.Tensor.data_ptr, arrays))
        except RuntimeError:  # no storage: a torch.func wrapper (the per-leaf path looks at each)
            return False
        return spans_disjoint(los, list(map(operator.add, los, map(_NBYTES, arrays))))

    def arith_many_(self, kind: str, outs: list[Any], cols: list[list[Any]], cs: list[Any]) -> bool:
        """Plain tensors: the rows' kernels as ``torch._foreach_*`` calls (lerp: ``_foreach_copy_``
        then `foreach_lerp_`; one C++ loop each, or
        one fused kernel on GPUs), with autograd off (`without_grad`): `outs` filled from
        ``cols[0]`` first (``_foreach_copy_``) unless it is ``cols[0]``, then ``mul_``/``add_``
        (``alpha=``)/``sub_``/``div_`` over the lists, the same elementwise kernels as the rows'
        ``torch.mul(out=)``, ``add_(alpha=)``, ``div_`` (bits equal: tests/test_inplace.py). DTensors,
        a missing API (`foreach_arith_` None) and, into another model's tensors, tensors averaging
        more than `FOREACH_COPY_BYTES` (the copy is then a pass over memory the rows do not make):
        False."""
        fe = foreach_arith_
        lerp_ = foreach_lerp_
        if fe is None or not outs or type(outs[0]) not in _PLAIN or (kind == "lerp" and lerp_ is None):
            return False
        xs, rest = cols[0], cols[1:]
        if outs is not xs and sum(map(_NBYTES, outs)) > FOREACH_COPY_BYTES * len(outs):
            return False  # large tensors: the copy would be one more pass over memory than the rows' kernels

        def run() -> None:
            assert fe is not None
            if outs is not xs and kind != "scale" and kind != "lincomb":
                fe["copy"](outs, xs)
            if kind == "lerp":  # `a` copied into `outs`, then ``lerp_`` there: torch.lerp(a, b, t)'s bits
                assert lerp_ is not None
                lerp_(outs, rest[0], cs[0])
            elif kind == "add":
                fe["add"](outs, rest[0])
            elif kind == "sub":
                fe["sub"](outs, rest[0])
            elif kind == "mean":
                for col in rest:
                    fe["add"](outs, col)
                fe["div"](outs, len(cols))
            else:  # scale, lincomb: x * c first (into `outs`), then each term
                if outs is not xs:
                    fe["copy"](outs, xs)
                fe["mul"](outs, cs[0])
                for col, c in zip(rest, cs[1:], strict=True):
                    fe["add"](outs, col, alpha=c)

        if kind == "mean" and len(cols) == 1:
            return False  # (``x / 1``: the row kernel)
        without_grad(run)
        return True

    def lerp_many_(self, xs: list[Any], ys: list[Any], t: float, checked: bool = False) -> bool:
        """One ``torch._foreach_lerp_`` under ``no_grad`` for plain tensors (one C++ loop, or one
        fused kernel on GPUs, instead of one Python call per tensor: bench_arith's 12-block
        ``nn.Module`` EMA row, 2.3x faster than the hand loop of ``lerp_``); not while
        ``torch.compile`` traces (one ``lerp_`` per tensor traces as well) or in ``torch.func``.
        The tests over the tensors are C-level passes (no Python step per tensor). Each pair is
        on one device (the caller checked); pairs on several devices are no reason to refuse:
        ``_foreach_lerp_`` then runs its per-tensor loop, the same ``lerp_`` as the fallback.
        `checked` (`out_fast` passed: plain tensors with storage, so no ``torch.func`` wrapper, or
        DTensors of one mesh and placements; not tracing; and no float8 dtype, which the column
        path sends down the per-leaf path): those tests are not made again. Otherwise a float8
        tensor (which ``lerp_`` cannot take) is refused before anything is written: the caller then
        goes row by row (`op_lerp`); one C-level pass over the dtypes. Autograd is off for the
        call (`without_grad`)."""
        fe = foreach_lerp_
        if fe is None or not xs:
            return False
        if not checked and (compiling() or not _F8.isdisjoint(map(_DTYPE, xs))):
            return False
        if type(xs[0]) not in _PLAIN:  # DTensors: one _foreach_lerp_ over the local shards
            return _dtensor.lerp_many_(fe, xs, ys, t, checked)
        if not checked:
            arrays = [*xs, *ys]
            if not set(map(type, arrays)) <= _PLAIN_SET or any(map(is_functorch_wrapped, arrays)):
                return False
        without_grad(fe, xs, ys, t)
        return True

    def op_lerp(self, x: Any, y: Any, t: Any, out: Any = None) -> Any:
        """``torch.lerp`` (one kernel; `t` a Python number or a 0-d tensor of `x`'s dtype)."""
        if x.dtype in _F8:
            return self._float8(super().op_lerp, (x, y, t), out)
        if out is None:
            return x.lerp(y, t)
        with torch.no_grad():
            if out is x:
                out.lerp_(y, t)
            else:
                torch.lerp(x, y, t, out=out)
        return out

    # ---- sharded arrays (DTensor: functorkit.adapters._dtensor; protocol: ._sharding) --------

    def sharded_reduce(
        self, kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, then: Callable[[Any], Any] | None
    ) -> Any:
        """`functorkit.adapters._dtensor.reduce`: None unless a DTensor is among `xs`."""
        return _dtensor.reduce(self, kind, xs, ys, o, then)

    def same_size_test(self, t: type) -> Callable[[Any, Any], bool] | None:
        """``Tensor.is_same_size`` for plain tensors (one C call per pair, no ``torch.Size`` built:
        bench_arith's small-model rows); DTensors: one identity test of their ``DTensorSpec``
        per pair, else their global ``shape`` (`_dtensor_columns.same_global_shape`)."""
        if t in _PLAIN:
            return _IS_SAME_SIZE
        return _dtensor_columns.size_test() if t is _dtensor.dtensor_type() else None

    def stand_ins(self, arrays: list[Any]) -> list[Any] | None:
        """DTensors: their local shards (`functorkit.adapters._dtensor.stand_ins`); None otherwise."""
        return None if not arrays or type(arrays[0]) in _PLAIN else _dtensor.stand_ins(arrays)

    def first_sharded(self, arrays: Sequence[Any]) -> tuple[int, str] | None:
        """The first DTensor of `arrays` (all of one type) and why it cannot go into a flat vector
        (`functorkit.adapters._dtensor.sharded_problem`); plain tensors: one type test."""
        if not arrays or type(arrays[0]) in _PLAIN:
            return None
        why = _dtensor.sharded_problem(arrays[0])
        return None if why is None else (0, why)

    def local_pair(self, x: Any, y: Any) -> tuple[Any, Any] | str:
        """``fk.allclose``: DTensors `x`, `y` as their local shards (same mesh and placements, else
        why not); plain tensors as they are (`functorkit.adapters._dtensor.local_pair`)."""
        if type(x) in _PLAIN and type(y) in _PLAIN:
            return x, y
        return _dtensor.local_pair(x, y)

    def any_rank(self, leaves: Sequence[Any]) -> Callable[[bool], bool] | None:
        """``fk.allclose``: for leaves holding a DTensor, ``flag -> flag on any rank`` (one
        all-reduce over its mesh); None otherwise."""
        return _dtensor.any_rank(leaves)

    def mixed_problem(self, x: Any, y: Any, xname: str, yname: str) -> str | None:
        """A DTensor and a plain tensor at one position (`functorkit.adapters._dtensor.mixed_problem`)."""
        if type(x) in _PLAIN and type(y) in _PLAIN:
            return None
        return _dtensor.mixed_problem(x, y, xname, yname)

    def sharded_out_problem(self, fname: str, x: Any, ins: Sequence[Any], o: Any, fix: str) -> str | None:
        """Why ``out=`` cannot write this position (`functorkit.adapters._dtensor.sharded_out_problem`: a
        ``Partial`` DTensor there); None for plain tensors."""
        if type(x) in _PLAIN and type(o) in _PLAIN and all(type(a) in _PLAIN for a in ins):
            return None
        return _dtensor.sharded_out_problem(fname, x, ins, o, fix)

    def whole_tensor_problem(self, x: Any) -> str | None:
        """Why a selection over the whole of `x` (``fk.ties``, ``fk.dare``) cannot be made here: a
        DTensor (`functorkit.adapters._dtensor.whole_tensor_problem`); None for plain tensors."""
        return None if type(x) in _PLAIN else _dtensor.whole_tensor_problem(x)

    def settle(self, r: Any) -> Any:
        """A per-tensor 0-d result with pending (`Partial`) reductions made whole (``fk.tensor_dots``)."""
        return r if type(r) in _PLAIN else _dtensor.settle(r)

    def vdot(self, x: Any, y: Any) -> Any:
        """BLAS ``vdot`` for the dtypes it supports (bench_arith ``dot`` torch rows; ``vecdot``
        multiplies, then sums)."""
        if x.dtype in _VDOT_DTYPES:
            return x.reshape(-1).vdot(y.reshape(-1))
        return super().vdot(x, y)

    # ---- checkpoints -------------------------------------------------------------------

    def sum_squares(self, x: Any) -> Any:
        """BLAS ``dot`` of the flattened tensor with itself (bench_arith ``norm`` torch rows: the
        generic ``vecdot`` multiplies into a temporary first); differentiable, traceable."""
        xf = x.reshape(-1)
        if x.dtype in _DOT_DTYPES:
            return xf.dot(xf)
        if x.dtype in _VDOT_DTYPES:
            return xf.vdot(xf).real
        return super().sum_squares(x)

    def to_host(self, x: Any) -> Any:
        """Detached, on the CPU, contiguous, as NumPy (no copy for a contiguous CPU tensor); dtypes
        NumPy lacks (bfloat16, float8) as same-width integers holding the bytes."""
        if type(x) not in _PLAIN:
            why = _dtensor.host_problem(x)
            if why is not None:
                raise TypeError(why)
        t = x.detach()
        if t.device.type == "meta":
            msg = "it is a `meta` tensor, which holds no values; materialise the model first"
            raise TypeError(msg)
        t = t.resolve_conj().resolve_neg().cpu().contiguous()
        stand = _STAND_IN.get(t.dtype)
        if stand is not None:
            return t.view(stand).numpy()
        return t.numpy()

    def save_piece(self, x: Any, key: str) -> Any:
        """``fk.save`` of a DTensor: this rank's piece (`functorkit.adapters._dtensor.save_piece`);
        None for plain tensors."""
        return None if type(x) in _PLAIN else _dtensor.save_piece(x, key)

    def from_stored(self, src: Any, like: Any) -> Any:
        """``torch.from_numpy`` over the array read (no second copy on the CPU; with ``mmap=True`` over
        the copy-on-write map of the file; bfloat16 and
        float8 reinterpreted in place with ``Tensor.view(dtype)``), moved to `like`'s device unless
        that is ``cpu`` or ``meta`` (a meta model is a template: the result is on the CPU); an
        ``nn.Parameter`` in `like` gives an ``nn.Parameter`` with its ``requires_grad``. A DTensor
        `like` gives a DTensor of its placements, this rank reading its own block
        (`functorkit.adapters._dtensor.from_stored`)."""
        if type(like) not in _PLAIN and like is not None:
            got = _dtensor.from_stored(src, like, self._tensor_of)
            if got is not None:
                return got
        return self._tensor_of(src.raw(), src.name, like)

    def _tensor_of(self, raw: Any, name: str, like: Any) -> Any:
        """A tensor over the stored bytes `raw` of dtype `name`, on `like`'s device (see `from_stored`)."""
        if raw.dtype.kind == "u" and raw.dtype.itemsize > 1:
            raw = raw.view(raw.dtype.str.replace("u", "i"))  # torch reads uint16+ only recently
        t = torch.from_numpy(raw)
        want = getattr(torch, name)
        if t.dtype != want:
            t = t.view(want)
        dev = getattr(like, "device", None)
        if dev is not None and dev.type not in ("cpu", "meta"):
            t = t.to(dev)
        if isinstance(like, torch.nn.Parameter):
            t = torch.nn.Parameter(t, requires_grad=like.requires_grad)
        return t


_STAND_IN = {
    d: torch.int16 if d == torch.bfloat16 else torch.uint8
    for d in (torch.bfloat16, *(getattr(torch, n, None) for n in _F8_NAMES))  # (the fnuz and e8m0 kinds too)
    if d is not None
}


def _from_ml_dtypes(x: Any) -> Any:
    """A CPU tensor of the values of NumPy (or Dask) array `x` of an ``ml_dtypes`` float dtype: the same bits
    for the dtypes torch has (bfloat16, float8_e4m3fn, float8_e5m2: no rounding), float32 for the
    others (exact: each is narrower); None for any other `x`."""
    dt = getattr(x, "dtype", None)
    if not isinstance(dt, np.dtype) or not dt.type.__module__.startswith("ml_dtypes"):
        return None
    if not isinstance(x, np.ndarray):
        if not type(x).__module__.startswith("dask"):
            return None
        x = np.asarray(x)  # a Dask array (fk.open of a bfloat16 checkpoint): computed
    td = next((d for d in _STAND_IN if _ml_dtype(d) == x.dtype), None)
    if td is not None:
        bits = np.ascontiguousarray(x).view(np.int16 if _STAND_IN[td] == torch.int16 else np.uint8)
        return torch.from_numpy(bits).view(td)
    if x.dtype.name.startswith(("float", "bfloat")):
        return torch.from_numpy(x.astype(np.float32))
    return None


def _ml_dtype(dtype: Any) -> Any:
    """The ``ml_dtypes`` NumPy dtype with torch `dtype`'s bits (bfloat16, float8_e4m3fn, float8_e5m2),
    or None without ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        return None
    name = str(dtype).rpartition(".")[2]
    t = getattr(ml_dtypes, name, None)
    return None if t is None else np.dtype(t)


_VDOT_DTYPES = frozenset({torch.float32, torch.float64, torch.complex64, torch.complex128})
_DOT_DTYPES = frozenset({torch.float32, torch.float64})


def _warm_caches() -> None:
    """Fill the core's per-type caches for plain tensors and parameters now, at import (which
    runs eagerly even when a compiled function's first call imports this module): the cold path
    calls ``array_api_compat.array_namespace``, whose ``lru_cache`` Dynamo warns about."""
    from .._classify import is_inexact_array

    for dt in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
        torch.int64,
        torch.int32,
        torch.bool,
    ):
        for t in (torch.empty(0, dtype=dt), torch.nn.Parameter(torch.empty(0, dtype=dt), requires_grad=False)):
            is_inexact_array(t)
            adapter_of(t)


_warm_caches()
