"""JAX arrays sharded over a ``Mesh``: part of the JAX adapter (``functorkit.adapters.jax``).

What functorkit does with them (docs/sharded.md):

* elementwise work (``fk.fmap``, the arithmetic, ``fk.copy``, ``fk.stack``) is JAX's own: each
  result keeps its input's sharding (XLA computes on the shards where they are, no transfer);
* shardings over the same devices are one placement (``adapters._device.same_device`` compares
  their device sets), so ``fk.norm``/``fk.dot`` of a model whose arrays are sharded differently
  reduce them together;
* `reduce`: where an array is split over several devices (a concrete array that is not fully
  replicated), and always under ``jit`` (a tracer on an Auto-axes mesh does not say how it is
  split), each array is reduced by JAX's ``sum``/``max``/``min`` without a reshape (a reshape of
  an array sharded along a non-leading axis is a ``ShardingTypeError`` on an Explicit mesh) and
  the scalars are combined: the result is a replicated 0-d array;
* `first_sharded` (``fk.destructure``, ``re.flatten``): an array split over several devices is
  refused by path, with the alternative (a flat vector would need one sharding for all of them).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["first_sharded", "is_split", "reduce", "whole_tensor_problem"]

_SHARDING = operator.attrgetter("sharding")


def _tracer_split(x: Any) -> bool:
    """A tracer whose type carries a sharded spec (an Explicit-axes mesh); Auto meshes: no spec."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    return spec is not None and any(e is not None for e in spec)


def is_split(x: Any) -> bool:
    """Whether `x` is split over several devices (not whole on each of them)."""
    if isinstance(x, jax.core.Tracer):
        return _tracer_split(x)
    s = getattr(x, "sharding", None)
    return s is not None and len(s.device_set) > 1 and not s.is_fully_replicated


def first_sharded(arrays: Sequence[Any]) -> tuple[int, str] | None:
    """The first of `arrays` split over several devices, and why it cannot go into a flat vector;
    one look per distinct sharding (concrete arrays) or per array (tracers)."""
    if not arrays:
        return None
    if isinstance(arrays[0], jax.core.Tracer):
        split = [j for j, x in enumerate(arrays) if _tracer_split(x)]
        return None if not split else (split[0], _why(arrays[split[0]], jax.typeof(arrays[split[0]]).sharding))
    shardings = list(map(_SHARDING, arrays))
    bad = {s for s in set(shardings) if len(s.device_set) > 1 and not s.is_fully_replicated}
    if not bad:
        return None
    j = next(j for j, s in enumerate(shardings) if s in bad)
    return j, _why(arrays[j], shardings[j])


def _any_split(xs: Sequence[Any]) -> bool:
    """Whether one of `xs` may be split over several devices: one look per distinct sharding (the
    ``sharding`` attribute of every array is read in a C-level pass). Under ``jit`` always (a
    tracer on an Auto-axes mesh does not say how it is split, and XLA would all-gather the
    arrays to concatenate them; reduced one by one, XLA fuses the reductions into one program)."""
    if isinstance(xs[0], jax.core.Tracer):
        return True
    if len(set(map(type, xs))) > 1:
        return any(map(is_split, xs))
    return any(len(s.device_set) > 1 and not s.is_fully_replicated for s in set(map(_SHARDING, xs)))


def _why(x: Any, sharding: Any) -> str:
    return (
        f"it is a JAX array of shape {tuple(x.shape)} split over several devices ({sharding}): one flat "
        "vector would need one sharding for every parameter, and `re` could not give back each array's "
        "own. Expected arrays whole on their devices; fix: work on the sharded model directly (fk.fmap, "
        "the arithmetic, fk.norm and fk.dot keep every sharding), or replicate it first, e.g. "
        "fk.destructure(jax.device_put(model, NamedSharding(mesh, PartitionSpec())))"
    )


def _acc(x: Any) -> Any:
    """`x` in float32 when its dtype is a real floating type narrower than 32 bits."""
    dt = x.dtype
    if jnp.issubdtype(dt, jnp.floating) and jnp.dtype(dt).itemsize < 4:
        return x.astype(jnp.float32)
    return x


def _part(kind: str, x: Any, y: Any, o: float) -> Any:
    x = _acc(x)
    if kind == "dot":
        return jnp.sum(jnp.conj(x) * _acc(y))
    # |x| with gradient 0 at 0 (JAX's abs has 1 there; torch's vector_norm, whose subgradients
    # functorkit follows, has 0: a zero bias gets gradient 0 for every ord, an all-zero model too)
    a = jnp.where(x == 0, 0, jnp.abs(x))
    if o == 2:
        return jnp.sum(a * a)
    if o == math.inf:
        return jnp.max(a, initial=0)
    if o == -math.inf:
        return jnp.min(a, initial=math.inf)
    if o == 0:
        return jnp.sum((a != 0).astype(a.dtype))
    if o == 1:
        return jnp.sum(a)
    if o > 1:
        return jnp.sum(a**o)
    # below 1 the derivative of |x|**o is infinite at 0: zero entries taken apart (0 for 0 < o < 1; for
    # o < 0 a zero makes the norm 0), ``where`` on a safe input so that no inf * 0 reaches the gradient
    zero = a == 0
    part = jnp.where(zero, 1, a) ** o
    return jnp.sum(jnp.where(zero, 0.0 if o > 0 else math.inf, part))


def reduce(
    kind: str, xs: Sequence[Any], ys: Sequence[Any] | None, o: float, then: Callable[[Any], Any] | None = None
) -> Any:
    """The total of a reduction over `xs` (and `ys`) when one of them is split over several devices
    (JAX reductions without a reshape, combined into one replicated scalar), `then` applied to it;
    None otherwise. Concrete arrays go through one jitted program (`_program`, `then` inside it, a
    static argument: the core's is equal across calls of one reduction): eagerly, every JAX operation
    on a sharded array is a program of its own with its own all-reduce (about 1 ms per array on 8
    host devices); compiled together, XLA makes the local sums and one all-reduce per mesh axis.
    Tracers (under an outer ``jit``) are reduced in line."""
    if kind not in ("dot", "norm") or not _any_split(xs):  # all_finite: JAX's own all() is global
        return None
    lx, ly = list(xs), None if ys is None else list(ys)
    if isinstance(xs[0], jax.core.Tracer):
        return _total(kind, o, lx, ly, then)
    return _program(kind, o)(lx, ly, then)


#: (kind, ord) -> the jitted `_total` (JAX's own cache then holds one compilation per model layout)
_PROGRAMS: dict[tuple[str, float], Any] = {}


def _program(kind: str, o: float) -> Any:
    f = _PROGRAMS.get((kind, o))
    if f is None:

        def total(xs: list[Any], ys: list[Any] | None, then: Callable[[Any], Any] | None) -> Any:
            return _total(kind, o, xs, ys, then)

        f = jax.jit(total, static_argnums=2)
        if len(_PROGRAMS) < 64:  # (any real ord may come: the cache stays small)
            _PROGRAMS[kind, o] = f
    return f


def _total(kind: str, o: float, xs: list[Any], ys: list[Any] | None, then: Callable[[Any], Any] | None) -> Any:
    r = _combined(kind, o, xs, ys)
    return r if then is None else then(r)


def _combined(kind: str, o: float, xs: list[Any], ys: list[Any] | None) -> Any:
    parts = [_part(kind, x, None if ys is None else ys[k], o) for k, x in enumerate(xs)]
    if len(parts) == 1:
        return parts[0]
    stacked = jnp.stack(parts)
    if kind == "norm" and o == math.inf:
        return jnp.max(stacked)
    if kind == "norm" and o == -math.inf:
        return jnp.min(stacked)
    return jnp.sum(stacked)


def whole_tensor_problem(x: Any) -> str | None:
    """Why ``fk.ties``/``fk.dare`` (a top-k selection, masks built from index arrays) cannot run on
    `x`: an array on a mesh with Explicit axes, where JAX refuses a top-k over a sharded axis and
    constants of other shapes; None otherwise (Auto axes: XLA places the work)."""
    if isinstance(x, jax.core.Tracer):
        sharding = getattr(jax.typeof(x), "sharding", None)
    else:
        sharding = getattr(x, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    types = getattr(mesh, "axis_types", ())
    if not any("Explicit" in str(t) for t in types) or getattr(mesh, "size", 1) <= 1:
        return None
    return (
        f"this is a JAX array of shape {tuple(x.shape)} on a mesh with Explicit axes ({sharding}), where "
        "this method's whole-tensor selections (a top-k threshold, masks from index arrays) are refused by "
        "JAX's sharding rules. Expected a mesh with Auto axes; fix: make the mesh with "
        "axis_types=(AxisType.Auto, ...), or replicate the arrays first "
        "(jax.device_put(model, NamedSharding(mesh, PartitionSpec())))"
    )
