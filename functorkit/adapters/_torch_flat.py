"""torch flat vectors in one C++ call: ``destructure``'s new vector and ``re.flatten(out=)``'s copy.

Used by `functorkit.adapters.torch.Adapter` (``new_flat``, ``fill``, ``plans_flat``, ``planned_flat``,
``planned_fill``, ``proves_apart``). Each path
is taken only for plain tensors (``torch.Tensor``, ``nn.Parameter``; no ``torch.func`` wrapper) of
the vector's dtype and device, never while ``torch.compile`` traces (the per-leaf paths trace),
and each has a switch (a module global; tests and bench_flat's on/off rows set it):

* `CAT_MAX_BYTES`: a new vector under this size is one ``flatten_dense_tensors``
  (``torch._C._nn.flatten_dense_tensors``, private, detected once; fallback: ``torch.cat`` of the
  leaves raveled): the ``cat`` of the leaves' flat views in C++, with no Python view per leaf
  (3.1 µs for the 6-array MLP against 7.4 µs for ``torch.cat`` of ``reshape(-1)`` views). Up to
  16 MiB on the CPU: torch's allocator then gets its memory from the heap glibc keeps after a
  free (a fresh vector of a loop reuses it), where NumPy's ``madvise``-d memory
  (``Adapter.empty``, 1 MiB and more) is page-faulted anew each call; above glibc's largest
  ``mmap`` threshold (32 MiB) every torch vector is new memory and NumPy's is 4x faster
  (measured in one run, 12 and 192 leaves: 0.5-31 MiB 1.0-4.6x faster by the cat, 48-100 MiB
  0.2-0.35x). bench_flat's "torch.cat" on/off row, bench_walk's module ``fk.destructure`` row.
* `CAT_OUT_MAX_BYTES`: ``re.flatten(model, out=buf)`` into a `buf` under this size is one
  ``torch.cat(..., out=buf)`` of the leaves raveled (``torch.ravel``, cheaper than ``reshape``)
  instead of a NumPy copy per leaf. bench_flat's "re.flatten cat" on/off row.

Neither carries autograd history: ``no_grad`` is entered only when autograd is on and some
tensor requires grad (entering it costs more than the 6-leaf concatenation itself).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import repeat
from typing import Any

import torch

from ._kernels import spans_disjoint
from ._torch_probe import compiling

__all__ = [
    "CAT_MAX_BYTES",
    "CAT_OUT_MAX_BYTES",
    "cat_into",
    "concat",
    "flatten_dense",
    "plain_of",
    "planned_fill",
    "planned_flat",
    "plans_flat",
    "proves_apart",
]

#: `new_flat` vectors under this many bytes are one `flatten_dense` (0: off)
CAT_MAX_BYTES = 16 << 20
#: ``re.flatten(out=)`` vectors under this many bytes are one ``torch.cat(..., out=)`` (0: off)
CAT_OUT_MAX_BYTES = 16 << 20

_PLAIN_SET = frozenset((torch.Tensor, torch.nn.Parameter))
_DTYPE = operator.attrgetter("dtype")
_DEVICE = operator.attrgetter("device")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")
_NBYTES = operator.attrgetter("nbytes")
_CPU = torch.device("cpu")


def _cat_raveled(leaves: list[Any]) -> Any:
    return torch.cat(list(map(torch.ravel, leaves)))


def _detect_flatten_dense() -> Callable[[list[Any]], Any]:
    nn = getattr(torch._C, "_nn", None)
    found = getattr(nn, "flatten_dense_tensors", None)
    return found if callable(found) else _cat_raveled


#: the leaves' values concatenated into one new 1-D tensor (private API, detected once; fallback:
#: ``torch.cat`` of the leaves raveled, the same values)
flatten_dense: Callable[[list[Any]], Any] = _detect_flatten_dense()


def plain_of(leaves: list[Any], dtype: Any, device: Any) -> bool:
    """Every leaf a plain tensor (``torch.Tensor`` or ``nn.Parameter``) of `dtype` on `device`: the
    facts a plan keeps (types, dtypes, devices), so a plan decides this once. C-level passes."""
    dev = _CPU if device is None else device
    return (
        set(map(type, leaves)) <= _PLAIN_SET
        and all(map(operator.is_, map(_DTYPE, leaves), repeat(dtype)))
        and all(map(operator.eq, map(_DEVICE, leaves), repeat(dev)))
    )


def _needs_no_grad(tensors: list[Any]) -> bool:
    return torch.is_grad_enabled() and any(map(_REQUIRES_GRAD, tensors))  # (one C call first)


def _new_vector(leaves: list[Any]) -> Any:
    if len(leaves) == 1:  # (flatten_dense_tensors returns a view of a lone contiguous tensor)
        return torch.cat((leaves[0].reshape(-1),))
    return flatten_dense(leaves)


def concat(leaves: list[Any]) -> Any:
    """`flatten_dense` of plain tensors: a new vector (never a view of a leaf), with no autograd
    history."""
    if _needs_no_grad(leaves):
        with torch.no_grad():
            return _new_vector(leaves)
    return _new_vector(leaves)


def plans_flat(leaves: list[Any], dtype: Any, device: Any, uniform: bool) -> Any:
    """`destructure`'s plan (``ArrayAdapter.plans_flat``): for plain tensors of `dtype` on `device`
    (`plain_of`; `uniform`: the caller knows the leaves are of one type, dtype and device, so only
    the type is looked at), their byte counts and total; None otherwise."""
    if not leaves:
        return None
    if not (type(leaves[0]) in _PLAIN_SET if uniform else plain_of(leaves, dtype, device)):
        return None
    nbytes = list(map(_NBYTES, leaves))
    return nbytes, sum(nbytes)


def planned_flat(leaves: list[Any], token: Any, wrappers_have_no_storage: bool) -> Any:
    """`destructure`'s plan on torch (`plans_flat` gave `token` when it was made, and the plan's
    facts hold now): the new vector, or None where the per-call facts are not proven here: a
    ``torch.func`` wrapper among `leaves`, a non-contiguous leaf, two leaves whose byte ranges
    (``data_ptr``, and the plan's byte counts) meet, a vector of `CAT_MAX_BYTES` or more. None
    sends the caller to the full alias check and ``new_flat``. Distinct leaves whose ranges do
    not meet share no memory, which is the alias check's whole question here. A ``torch.func``
    wrapper (``grad``, ``vmap``, ``jvp``) has no storage: its ``data_ptr`` raises, which is the
    test for one here (no probe per tensor) when `wrappers_have_no_storage` (the private probe
    was detected: this torch has such wrappers; else None, always). Not while ``torch.compile``
    traces."""
    nbytes, total = token
    if total >= CAT_MAX_BYTES or compiling() or not wrappers_have_no_storage:
        return None
    if not all(map(torch.Tensor.is_contiguous, leaves)):
        return None
    try:
        los = list(map(torch.Tensor.data_ptr, leaves))
    except RuntimeError:  # no storage: a torch.func wrapper (new_flat concatenates those themselves)
        return None
    if not spans_disjoint(los, list(map(operator.add, los, nbytes))):
        return None
    return concat(leaves)


def planned_fill(out: Any, leaves: list[Any], token: Any, wrapped: Callable[[Any], bool]) -> bool:
    """``re.flatten(out=)``'s kept decision (`token` from `plans_flat` for the flat vector's dtype
    and device, which `out` has): one `cat_into` under `CAT_OUT_MAX_BYTES` for a plain `out`, and
    True; False while ``torch.compile`` traces or for ``torch.func`` wrappers (``fill`` refuses
    those)."""
    if token[1] >= CAT_OUT_MAX_BYTES or type(out) is not torch.Tensor or compiling() or any(map(wrapped, leaves)):
        return False
    cat_into(out, leaves)
    return True


def proves_apart(out: Any, arrays: list[Any]) -> bool:
    """Plain contiguous tensors whose ranges (``data_ptr``, ``nbytes``) all end at or below the
    start of the contiguous `out`'s or start at or above its end, in C-level passes
    (``re.flatten(out=)``'s check of `out` against the model: bench_flat "mlp, torch" row).
    Tensors of another device than `out` are apart whatever their pointers say (the exact check
    compares memory spaces too). False: not proven (a strided `out` spans more bytes than its own)."""
    if (
        compiling()
        or not out.is_contiguous()
        or not set(map(type, arrays)) <= _PLAIN_SET
        or not all(map(torch.Tensor.is_contiguous, arrays))
    ):
        return False
    try:
        lo = out.data_ptr()
        los = list(map(torch.Tensor.data_ptr, arrays))
    except RuntimeError:  # no storage: a torch.func wrapper (the exact check looks at each)
        return False
    hi = lo + out.nbytes
    below = map(operator.le, map(operator.add, los, map(_NBYTES, arrays)), repeat(lo))
    return all(map(operator.or_, below, map(operator.ge, los, repeat(hi))))


def cat_into(out: Any, leaves: list[Any]) -> None:
    """``torch.cat`` of the plain tensors `leaves` raveled into `out` (1-D, contiguous, of their
    dtype and device, apart from them: the caller checked), outside autograd."""
    if _needs_no_grad([out, *leaves]):
        with torch.no_grad():
            torch.cat(list(map(torch.ravel, leaves)), out=out)
        return
    torch.cat(list(map(torch.ravel, leaves)), out=out)
