"""The sharded-array protocol shared by the core and the adapters (imports no backend).

Sharded arrays (torch ``DTensor``, JAX arrays sharded over a ``Mesh``) need three things from
functorkit's core, each asked of the array's adapter through an optional method (a family
without sharded arrays simply does not define it):

* ``sharded_reduce(kind, xs, ys, ord, then)``: the global total of a reduction over the parameters
  `xs` (``kind="dot"``: ``sum(vdot(x, y))`` over `xs`/`ys`; ``kind="norm"``: the sum of
  ``|x|**ord``, or the max/min/count for ``ord`` inf/-inf/0, before the root; ``kind="all_finite"``:
  a 0-d bool, every element of `xs` finite), made with at most one reduction across ranks; None
  when none of `xs` is sharded, or the family's own operations are already global (the core's
  own path runs). `then` (or None): a function of the global total as a plain array of the
  family (the root of a norm), applied by the adapter before the result takes its sharded form
  (torch: on the replicated local value, not through DTensor's operators: bench_sharded's norm
  row); where `then` has a ``plain`` method, the adapter may call that instead for a total that
  carries no derivative (the root without its guard for the gradient at 0). `then` is a pure
  function equal (``==``, with an equal hash) across calls of one reduction, so that an adapter may
  compile it with the reduction (JAX: one jitted program, `then` a static argument).
* ``first_sharded(arrays)``: ``(index, why)`` for the first of `arrays` (all of one type) that
  cannot be put whole into one flat vector in this process (a ``DTensor``, a JAX array split over
  several devices), `why` naming the alternative; None otherwise, decided in C-level passes
  (no Python step per array). ``fk.destructure`` and ``re.flatten`` refuse such an array by its
  path (`first_sharded`, called by ``functorkit._dense.check_dense``).
* ``whole_tensor_problem(x)`` (``fk.ties``, ``fk.dare``, ``fk.tensor_thresholds``: selections over a
  whole tensor) and ``settle(r)`` (a per-tensor result with a pending reduction made whole, as
  ``fk.tensor_dots`` returns it): `whole_tensor_problem`, `settle`;
* the adapter's usual methods (``stage``, ``to_host``, ``lerp_many_``...) handle sharded arrays
  themselves where they can, and refuse them by name where they cannot.

`ShardRefusal` carries the index of the offending array out of an adapter, so that the core can
name its path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "ShardRefusal",
    "first_sharded",
    "mixed_problem",
    "new_array_device",
    "settle",
    "sharded_reduce",
    "whole_tensor_problem",
]


class ShardRefusal(Exception):
    """Raised by an adapter's ``sharded_reduce``: the `index`-th array cannot take part (`why`,
    with the fix). The core turns it into a `PolicyError` naming that array's path."""

    def __init__(self, index: int, why: str) -> None:
        super().__init__(why)
        self.index = index
        self.why = why


def sharded_reduce(
    ad: Any, kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, then: Callable[[Any], Any] | None = None
) -> Any:
    """The adapter's ``sharded_reduce`` of `xs` (and `ys`), `then` applied to the global total, or
    None (no sharded array, or a family without sharded arrays)."""
    hook = getattr(ad, "sharded_reduce", None)
    if hook is None:
        return None
    return hook(kind, xs, ys, o, then)


def first_sharded(ad: Any, arrays: Sequence[Any]) -> tuple[int, str] | None:
    """The adapter's ``first_sharded`` of `arrays` (None for a family without sharded arrays)."""
    hook = getattr(ad, "first_sharded", None)
    return None if hook is None else hook(arrays)


def whole_tensor_problem(ad: Any, x: Any) -> str | None:
    """The adapter's ``whole_tensor_problem`` of `x` (None for a family without it)."""
    hook = getattr(ad, "whole_tensor_problem", None)
    return None if hook is None else hook(x)


def settle(ad: Any, r: Any) -> Any:
    """The adapter's ``settle`` of the per-tensor result `r` (`r` itself for a family without it)."""
    hook = getattr(ad, "settle", None)
    return r if hook is None else hook(r)


def mixed_problem(ad: Any, x: Any, y: Any, xname: str, yname: str) -> str | None:
    """Why the arrays `x` (of the model `xname`) and `y` (of `yname`), of one namespace, at one
    parameter position cannot be combined: one sharded and the other not (torch: a DTensor and a plain
    tensor), with the fix; None otherwise, or for a family without sharded arrays. Asked only where
    their types differ (the element-wise functions' operand check, not the common case)."""
    hook = getattr(ad, "mixed_problem", None)
    return None if hook is None else hook(x, y, xname, yname)


def new_array_device(ad: Any, like: Any) -> Any:
    """The device to make a new array on that will be combined with `like` (a 0-d constant, an
    index array): `like`'s device, or the adapter's ``new_array_device`` where it has one (JAX: None
    for an array split over devices, whose sharding no array of another shape can take; JAX places
    an uncommitted array where it is used)."""
    hook = getattr(ad, "new_array_device", None)
    return ad.device(like) if hook is None else hook(like)
