"""The in-place arithmetic (``fk.lerp(ema, model, t, out=ema)``, every ``out=``) on DTensor models
at the cost of the local shards (issue #26's speed row; part of the torch adapter, used by
`_dtensor.uniform_locals` and the adapter's ``same_size_test``).

``out=``'s column path asks every array of every model for its type, shape, dtype, device,
contiguity and memory: a DTensor answers each through Python (its ``__torch_dispatch__`` wrapper:
0.15-0.2 µs a read against 0.06 for a plain tensor) and its ``placements``/``device_mesh`` through
a property each. What makes an update of one DTensor from others local (no communication) is the
same mesh and the same placements, and what makes two global shapes equal is their
``DTensorSpec``'s tensor metadata; torch shares one spec object among the DTensors of one kind
(FSDP2: one per parameter shape, across modules and models). So:

* `uniform_specs`: every array's ``_spec`` read in one C-level pass, and the mesh and placements
  judged once per distinct spec object (`spec_fits`: FSDP2's 192-tensor model has two), never per
  tensor;
* `same_global_shape`: two DTensors of one spec object have one global shape (one identity test
  per pair, no ``torch.Size`` built); others compare their ``shape``;
* every other per-tensor question (dtype, device, density, contiguity, memory ranges, inference
  mode) and the foreach kernel go to the plain local shards (`_dtensor._locals`).

The refusals are the ones made before: arrays of several meshes or placements, or ``Partial``
ones, decline the column path (None), and the per-leaf path then checks each pair and names what
it refuses (`_dtensor.sharded_out_problem`, `_dtensor.mixed_problem`). ``_spec`` is private:
feature-detected on the first array (a DTensor without one: the public ``device_mesh`` and
``placements`` of each, `_per_tensor`), and `FAST` turns the spec path off (tests compare both;
bench_sharded's "per tensor" row).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

__all__ = ["FAST", "same_global_shape", "size_test", "spec_fits", "uniform_specs"]

#: switch for tests and bench_sharded: ``FAST[0] = False`` judges each DTensor through its public
#: ``device_mesh`` and ``placements`` and compares each pair's ``shape`` (the path before session 13)
FAST = [True]

_SPEC = operator.attrgetter("_spec")


def _has_spec(x: Any) -> bool:
    spec = getattr(x, "_spec", None)
    return spec is not None and hasattr(spec, "mesh") and hasattr(spec, "placements")


def spec_fits(spec: Any, first: Any) -> bool:
    """Whether DTensors of `spec` hold on this rank the same elements as those of the spec `first`
    (whose placements hold no ``Partial``): meshes equal (FSDP2 makes one per ``fully_shard`` call),
    placements equal. Called once per distinct spec object (tests count the calls)."""
    if spec is first:
        return True
    return (spec.mesh is first.mesh or spec.mesh == first.mesh) and tuple(spec.placements) == tuple(
        first.placements
    )


def uniform_specs(arrays: Sequence[Any]) -> bool:
    """Whether the DTensors `arrays` (every one exactly a DTensor: the caller checked) are of one
    mesh (equal meshes) and one placements tuple, with no ``Partial`` placement: then any two of
    them hold the same elements on this rank, and an element-wise update of one from others is a
    local one. One C-level pass over their ``_spec``, then `spec_fits` per distinct spec object."""
    if not FAST[0] or not _has_spec(arrays[0]):
        return _per_tensor(arrays)
    specs = list(map(_SPEC, arrays))
    first = specs[0]
    if any(p.is_partial() for p in first.placements):  # out= on Partial terms: the per-leaf path
        return False
    if all(map(operator.is_, specs, repeat(first))):
        return True
    distinct = dict(zip(map(id, specs), specs))
    return all(spec_fits(s, first) for s in distinct.values())


def _per_tensor(arrays: Sequence[Any]) -> bool:
    """`uniform_specs` through each DTensor's public ``device_mesh`` and ``placements`` (no
    ``_spec``, or `FAST` off); meshes compared once per distinct mesh object."""
    placements = [tuple(a.placements) for a in arrays]
    if placements.count(placements[0]) != len(placements):
        return False
    if any(p.is_partial() for p in placements[0]):
        return False
    meshes = [a.device_mesh for a in arrays]
    mesh = meshes[0]
    return all(m is mesh or m == mesh for m in dict(zip(map(id, meshes), meshes)).values())


def same_global_shape(x: Any, y: Any) -> bool:
    """Whether the DTensors `x` and `y` have one global shape: one spec object (whose tensor
    metadata is that shape), else their ``shape``s compared."""
    s = getattr(x, "_spec", None)
    return (s is not None and s is getattr(y, "_spec", None)) or x.shape == y.shape


def size_test() -> Any:
    """The adapter's ``same_size_test`` for DTensors: `same_global_shape`, or None (compare each
    ``shape``) with `FAST` off."""
    return same_global_shape if FAST[0] else None

