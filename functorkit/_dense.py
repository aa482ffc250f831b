"""Arrays that are not dense (torch sparse and nested tensors): refused by name, before any work.

``fk.destructure``, ``re.flatten``, the arithmetic and reductions, ``fk.save`` and ``fk.load_into``
work on dense arrays: a flat vector holds a dense array's elements, a checkpoint stores them, an
in-place load writes them. A sparse (COO, CSR, CSC, BSR, BSC) or nested tensor among a model's
arrays is a ``TypeError`` naming its path, its layout and the fix (``x.to_dense()``, or pad a nested
tensor), raised before anything is computed or written, as ``np.matrix`` is refused. ``fk.fmap``,
``fk.leaves`` and ``fk.state_dict`` still hand such tensors over untouched. Which arrays are not
dense is the adapter's to say (``ArrayAdapter.first_not_dense``); a library whose arrays are all
dense (every one but torch) is not looked at.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any

from ._keypath import KeyPath
from ._xp import is_array
from .adapters import adapter_of
from .adapters._sharding import first_sharded

__all__ = ["check_dense", "check_dense_leaf", "dense_error", "may_be_sparse"]


def dense_error(where: str, why: str, what: str) -> TypeError:
    """The error for a tensor that is not dense, at `where` (a path's display, or a key)."""
    msg = f"at {where}: {what} works on dense arrays, but {why}. Expected a dense (strided) array."
    return TypeError(msg)


#: the operations that need every array whole in this process (a flat vector): a sharded array
#: (torch DTensor, a JAX array split over devices) is refused there by its path (adapters._sharding)
_WHOLE = frozenset({"fk.destructure", "re.flatten"})


def check_dense(arrays: Sequence[Any], where: Callable[[int], str], what: str) -> None:
    """Raise `dense_error` for the first of `arrays` (any libraries) that is not dense;
    ``where(i)`` says where ``arrays[i]`` is (its path). One adapter call per array type.
    For a flat vector (`_WHOLE`), a sharded array is refused too (`check_whole`)."""
    if not arrays:
        return
    firsts = dict(zip(map(type, arrays), arrays))  # one array of each type, in a C-level pass
    if what in _WHOLE:
        check_whole(arrays, firsts, where, what)
    for t, x in firsts.items():
        if not is_array(x):
            continue
        ad = adapter_of(x)
        if not ad.may_be_sparse:
            continue
        if len(firsts) == 1:
            check_dense_of(ad, arrays, where, what)
        else:
            idx = [i for i, y in enumerate(arrays) if type(y) is t]
            check_dense_of(ad, [arrays[i] for i in idx], lambda j: where(idx[j]), what)  # noqa: B023  (called at once)


def check_dense_of(ad: Any, arrays: Sequence[Any], where: Callable[[int], str], what: str) -> None:
    """`check_dense` for `arrays` all of one type, whose adapter `ad` may have arrays that are not
    dense (``ad.may_be_sparse``): one adapter call (the lock-step engine's column path)."""
    j = ad.first_not_dense(arrays)
    if j is not None:
        why = ad.dense_problem(arrays[j]) or "it is not a dense array"
        raise dense_error(where(j), why, what)


def check_whole(arrays: Sequence[Any], firsts: dict[type, Any], where: Callable[[int], str], what: str) -> None:
    """A `TypeError` naming the first of `arrays` that is sharded: asked once per array type of an
    adapter that has sharded arrays (torch, JAX: ``adapters._sharding.first_sharded``), the arrays
    of each type picked out in C-level passes (no Python step per array)."""
    types: list[type] | None = None
    for t, x in firsts.items():
        if not is_array(x):
            continue
        ad = adapter_of(x)
        if getattr(ad, "first_sharded", None) is None:
            continue
        idx: list[int] | None = None
        if len(firsts) > 1:
            if types is None:
                types = list(map(type, arrays))
            idx = list(itertools.compress(range(len(arrays)), map(operator.is_, types, itertools.repeat(t))))
        found = first_sharded(ad, arrays if idx is None else list(map(arrays.__getitem__, idx)))
        if found is not None:
            j, why = found
            at = where(j if idx is None else idx[j])
            msg = f"at {at}: {what} builds one flat vector of the whole model, but {why}."
            raise TypeError(msg)


def may_be_sparse(arrays: Sequence[Any]) -> bool:
    """Whether some of `arrays` are of a library whose arrays may not be dense (`check_dense` has
    something to look at): decided once per plan, from one array of each type."""
    return any(is_array(x) and adapter_of(x).may_be_sparse for x in dict(zip(map(type, arrays), arrays)).values())


def check_dense_leaf(path: KeyPath, x: Any, others: Sequence[Any], what: str) -> None:
    """`check_dense` for one operand `x` and the other models' arrays at its path (the per-leaf
    path of the arithmetic)."""
    ad = adapter_of(x)
    if not ad.may_be_sparse:
        return
    for y in (x, *others):
        why = adapter_of(y).dense_problem(y) if is_array(y) else None
        if why is not None:
            raise dense_error(path.display, why, what)
