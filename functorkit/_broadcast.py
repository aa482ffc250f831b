"""`broadcast_prefix`: a prefix tree's leaves repeated over the sub-trees of a full tree (SPEC 16).

The prefix is walked against the tree with an explicit stack (node types and keys checked, a
mismatch named by its path); each prefix leaf claims the sub-tree of `tree` at its path. The
result is built on the tree's definition with every shared sub-tree written out
(`TreeDef.expanded`), so that each leaf position gets its own value (docs/tools.md).
"""

from __future__ import annotations

from typing import Any

from ._errors import StructureError
from ._keypath import make_path
from ._record import record_plain
from ._registry import SCALAR, dispatch
from ._treedef import BUILD_SAME

__all__ = ["broadcast_prefix"]


def _node(x: Any) -> Any:
    nd = dispatch(x)
    return None if nd is None or nd is SCALAR else nd


def broadcast_prefix(prefix: Any, tree: Any, /) -> Any:
    """`tree`'s structure with each leaf replaced by the leaf of `prefix` above it.

    `prefix` is a prefix of `tree`: the same node types and keys (dicts
    matched by key; a plain ``dict`` in `prefix` also stands for any node of
    `tree` with named children, a dataclass or an ``nn.Module``, its keys the
    children's names, ``"0"`` or ``0`` for a ``Sequential``'s first child)
    down to its own leaves, where `tree` may continue with
    any sub-tree; every leaf position of that sub-tree gets the prefix leaf
    (JAX's ``jax.tree.broadcast``, optree's ``tree_broadcast_prefix``).
    Every leaf position of `tree` gets its own value: positions of a tied
    leaf or of a shared sub-tree of `tree` are filled one by one, so the
    result has `tree`'s node types and keys but no ties or shared sub-trees
    of its own (only the prefix's leaves, repeated). ``None`` is a leaf to
    functorkit, in `prefix` (repeated like any value) and in `tree` (a
    position that gets a value), where JAX and optree treat it as an empty
    node.

    Parameters
    ----------
    prefix
        The prefix tree, e.g. ``{"enc": 0.1, "dec": 0.01}``.
    tree
        The full tree, e.g. a model whose top-level keys are ``enc`` and
        ``dec``.

    Returns
    -------
    tree : Any
        Of `tree`'s structure; typically the third tree of a multi-tree
        `fmap` (per-sub-model learning rates, masks).

    Raises
    ------
    StructureError
        `prefix` is not a prefix of `tree`: naming the first path where they
        differ (node types, keys or lengths, or a node of `prefix` where
        `tree` has a leaf).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> model = {"enc": {"w": np.ones(2), "b": np.zeros(2)}, "dec": [np.ones(3)]}
    >>> fk.broadcast_prefix({"enc": 0.1, "dec": 0.01}, model)
    {'enc': {'w': 0.1, 'b': 0.1}, 'dec': [0.01]}
    >>> grads = fk.fmap(np.ones_like, model)
    >>> lrs = fk.broadcast_prefix({"enc": 0.1, "dec": 0.01}, model)
    >>> fk.fmap(lambda p, g, lr: p - lr * g, model, grads, lrs)["dec"]
    [array([0.99, 0.99, 0.99])]
    """
    record_plain(prefix)  # a cycle in the prefix is a StructureError naming the path, not a hang
    _, td = record_plain(tree)
    claims: dict[tuple[Any, ...], Any] = {}
    stack: list[tuple[Any, Any, tuple[Any, ...]]] = [(prefix, tree, ())]
    while stack:
        p, t, path = stack.pop()
        pnd = _node(p)
        if pnd is None:
            claims[path] = p
            continue
        tnd = _node(t)
        where = make_path(path).display
        if tnd is None:
            msg = (
                f"at {where}: fk.broadcast_prefix: `prefix` has a {type(p).__name__} node here but `tree` has a "
                f"leaf ({type(t).__name__}). Expected `prefix` to be a prefix of `tree` (its nodes are nodes of "
                "`tree`, its leaves stand for whole sub-trees); fix: put a single value here in `prefix`."
            )
            raise StructureError(msg)
        pkeys, pvals, _, pnamed = pnd.flatten(p)
        tkeys, tvals, _, tnamed = tnd.flatten(t)
        as_mapping = type(p) is dict and tnamed  # a plain dict stands for any node with named children
        if pnd.kind is not tnd.kind and not as_mapping:
            msg = (
                f"at {where}: fk.broadcast_prefix: a {type(p).__name__} in `prefix` vs a {type(t).__name__} in "
                "`tree`. Expected the same node types down to the prefix's leaves; fix: build the prefix with "
                "the tree's node types."
            )
            raise StructureError(msg)
        if pnamed:
            # a key of the prefix names a child of the tree as it is, or as its str(): {"0": ...} for a
            # torch.nn.Sequential's child 0
            tmap = {k: (k, v) for k, v in zip(tkeys, tvals, strict=True)}
            if as_mapping:
                tmap.update({str(k): (k, v) for k, v in zip(tkeys, tvals, strict=True) if str(k) not in tmap})
            found = [tmap.get(k) for k in pkeys]
            if None in found or len({id(f) for f in found}) != len(tkeys) or len(pkeys) != len(tkeys):
                named = {f[0] for f in found if f is not None}
                missing = [k for k in tkeys if k not in named]
                extra = [k for k, f in zip(pkeys, found, strict=True) if f is None]
                msg = (
                    f"at {where}: fk.broadcast_prefix: keys {list(pkeys)!r} in `prefix` vs {list(tkeys)!r} in "
                    f"`tree` (missing from the prefix: {missing!r}; not in the tree: {extra!r}). Expected the "
                    "same keys; fix: give the prefix every key of the tree at this level."
                )
                raise StructureError(msg)
            stack.extend((pv, f[1], (*path, f[0])) for f, pv in zip(found, pvals, strict=True) if f is not None)
        else:
            if len(pvals) != len(tvals):
                msg = (
                    f"at {where}: fk.broadcast_prefix: {len(pvals)} children in `prefix` vs {len(tvals)} in "
                    f"`tree` ({type(t).__name__}). Expected equal lengths; fix: give the prefix one entry per "
                    "child of the tree here."
                )
                raise StructureError(msg)
            stack.extend((pv, tv, (*path, k)) for k, pv, tv in zip(tkeys, pvals, tvals, strict=True))
    full = td.expanded()
    values: list[Any] = []
    for pos in full.position_paths():
        for k in range(len(pos) + 1):
            key = tuple(pos[:k])
            if key in claims:
                values.append(claims[key])
                break
        else:  # unreachable: every position of `tree` lies under one leaf of a matching prefix
            msg = f"at {pos.display}: fk.broadcast_prefix: no leaf of `prefix` covers this position of `tree`."
            raise StructureError(msg)
    return full.build(values, BUILD_SAME)
