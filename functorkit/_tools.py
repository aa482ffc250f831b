"""fk.partition and fk.combine: groups of a tree's leaves, on the one recorded tree definition.

Each tool records its tree(s) once (`record`) and rebuilds with the
recorded definition, so ties, shared sub-trees and trainable leaves follow the
rules of docs/treedef.md (R1-R3) exactly as in ``fmap`` and ``destructure``.
``stack``/``unstack`` live in ``_stack.py``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any, cast

from . import _program as program
from ._errors import StructureError
from ._keypath import KeyPath
from ._program_match import match_tree
from ._record import record
from ._treedef import TreeDef, add_note

__all__ = ["combine", "partition"]


# ============================================================== partition / combine

def _predicate(pred: Any, k: int) -> Callable[[KeyPath, Any], Any]:
    if isinstance(pred, str):
        pattern = pred

        def glob(path: KeyPath, _leaf: Any) -> bool:
            return fnmatch.fnmatchcase(path.dotted, pattern) or fnmatch.fnmatchcase(str(path), pattern)

        return glob
    if callable(pred):
        return pred  # type: ignore[no-any-return]
    msg = (
        f"fk.partition: predicate {k} must be a callable `pred(path, leaf) -> bool` or a glob str on the "
        f"path (such as 'encoder.*.weight'), got {type(pred).__name__}."
    )
    raise TypeError(msg)


def partition(tree: Any, /, *preds: Any) -> list[Any]:
    """Split a tree into ``len(preds) + 1`` trees of the same structure, with ``None`` elsewhere.

    Parameters
    ----------
    tree
        Any tree functorkit walks.
    *preds
        Each a callable ``pred(path, leaf) -> bool`` (``path`` a
        `KeyPath`) or a glob str matched (``fnmatch``, case-sensitive)
        against the dotted path (``encoder.0.weight``) and against
        ``str(path)`` (``encoder[0].weight``). ``*`` matches any run of
        characters, dots included, so ``"encoder.*.weight"`` matches
        ``encoder.layers.0.weight``; ``[`` starts a character class, so write
        globs in the dotted form.

    Returns
    -------
    list
        ``len(preds) + 1`` trees. Each distinct leaf goes to the first group
        whose predicate holds, the last group takes the rest; every group
        holds ``None`` where the leaf went elsewhere.

    Notes
    -----
    Predicates see each distinct leaf once, at its first path (R1): a tied
    leaf goes, at all its places, to the group decided at its first place, so
    ties are never split between groups. Scalars are seen at every place.
    The groups keep shared sub-trees shared. `combine` puts them back
    together. ``None`` is a constant to ``fk.destructure`` and the
    arithmetic, so one group can be flattened or scaled on its own.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> model = {"enc": {"w": np.ones(2), "b": np.zeros(2)}, "dec": {"w": np.ones(3)}}
    >>> enc, rest = fk.partition(model, "enc.*")
    >>> enc
    {'enc': {'w': array([1., 1.]), 'b': array([0., 0.])}, 'dec': {'w': None}}
    >>> weights, other = fk.partition(model, lambda path, x: path[-1] == "w")
    >>> other
    {'enc': {'w': None, 'b': array([0., 0.])}, 'dec': {'w': None}}
    >>> fk.combine(weights, other)["enc"]["b"] is model["enc"]["b"]
    True
    """
    checked = [_predicate(p, k) for k, p in enumerate(preds)]
    leaves, td = record(tree)
    paths = td.paths
    ngroups = len(checked) + 1
    groups: list[list[Any]] = [[None] * len(leaves) for _ in range(ngroups)]
    for j, x in enumerate(leaves):
        path = paths[j]
        g = ngroups - 1
        for k, pred in enumerate(checked):
            try:
                hit = bool(pred(path, x))
            except Exception as e:
                add_note(e, f"(functorkit: raised by predicate {k} of fk.partition at {path.display})")
                raise
            if hit:
                g = k
                break
        groups[g][j] = x
    return [td.unflatten(g) for g in groups]


def combine(*groups: Any) -> Any:
    """Put the groups of `partition` back together: the inverse of ``partition``.

    Parameters
    ----------
    *groups
        Trees of one structure, each holding ``None`` where another group
        holds the value.

    Returns
    -------
    tree
        At each place, the one group's value that is not ``None`` (``None``
        where every group holds ``None``). Leaves are the groups' own objects
        (``combine(*partition(t, ...))`` holds the very leaves of ``t``), so
        ties are kept, within and across groups; a sub-tree shared in any
        group is shared in the result.

    Raises
    ------
    StructureError
        If the groups differ in structure, or two groups hold a value (not
        ``None``) at one place; the message names the path.

    Notes
    -----
    A torch ``nn.Module`` keeps its parameter and buffer slots that hold
    ``None`` (``bias=False``), and every walk skips them; `combine` alone
    matches them as places, so the groups of a module (modules with ``None``
    in the slots another group holds) combine. The result takes its
    non-parameter state (training flag, hooks, attributes) from the first
    group.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> fk.combine({"a": np.ones(1), "b": None}, {"a": None, "b": 2.0})
    {'a': array([1.]), 'b': 2.0}
    """
    if not groups:
        msg = "fk.combine: expected at least one group (the trees fk.partition returned), got none."
        raise TypeError(msg)
    recs = [record(g, track=False, slots=True) for g in groups]
    exp0 = recs[0][1].expanded()
    names = tuple(f"groups[{k}]" for k in range(len(groups)))
    # an expanded definition has no shared entries, so the match gives a list
    cols = [cast(list[Any], match_tree(exp0, g, k, names, slots=True)) for k, g in enumerate(groups)]
    out = list(cols[0])
    owner = [0] * len(out)
    for k in range(1, len(cols)):
        col = cols[k]
        for p, v in enumerate(col):
            if v is None:
                continue
            if out[p] is not None and out[p] is not v:
                path = exp0.position_paths()[p]
                msg = (
                    f"fk.combine: at {path.display}: groups[{owner[p]}] and groups[{k}] both hold a value "
                    f"({type(out[p]).__name__} and {type(v).__name__}). Expected a value in one group and "
                    "None in the others, as fk.partition makes them; fix: set this place to None in all "
                    "groups but one."
                )
                raise StructureError(msg)
            out[p] = v
            owner[p] = k
    tds = [td for _, td in recs]
    if not any(td._shares() for td in tds):
        return exp0.build(out)
    # share every sub-tree that one of the groups shares
    prog, kept, refs = program.reshare(exp0, tds, out)
    return TreeDef._make(prog, len(kept), len(kept), None, None, refs, frozenset()).build(kept)
