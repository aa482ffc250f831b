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

from ._errors import StructureError
from ._keypath import KeyPath
from ._match import match_tree
from ._record import record
from ._treedef import _LEAFY, _N, TreeDef, add_note

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
    if not any(td._refs for _, td in recs):
        return exp0.build(out)
    return _shared_def(exp0, [td for _, td in recs], out)


def _spans(prog: list[Any]) -> list[int]:
    """For each program entry: the index of the first entry of the sub-tree it ends."""
    start = [0] * len(prog)
    open_: list[int] = []
    for idx, e in enumerate(prog):
        if type(e) is tuple and not e[_LEAFY] and e[_N]:
            n = e[_N]
            first = open_[-n]
            del open_[-n:]
            open_.append(first)
        else:
            open_.append(idx)
        start[idx] = open_[-1]
    return start


def _origins(td: TreeDef) -> list[int]:
    """For each entry of ``td.expanded()``'s program: the entry of ``td``'s program it copies."""
    prog = td._prog
    start = _spans(prog)
    out: list[int] = []

    def emit(lo: int, hi: int) -> None:
        for idx in range(lo, hi + 1):
            e = prog[idx]
            if type(e) is int:
                emit(start[e], e)
            else:
                out.append(idx)

    emit(0, len(prog) - 1)
    return out


def _shared_def(exp0: TreeDef, tds: list[TreeDef], vals: list[Any]) -> Any:
    """Rebuild `vals` (one per position of `exp0`) sharing every sub-tree that any of `tds` shares."""
    prog = exp0._prog
    parent = list(range(len(prog)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for td in tds:
        if not td._refs:
            continue
        origin = _origins(td)
        if len(origin) != len(prog):  # pragma: no cover - equal structures expand alike
            continue
        first: dict[int, int] = {}
        for i, o in enumerate(origin):
            if o in td._refs:
                f = first.setdefault(o, i)
                a, b = find(f), find(i)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    start = _spans(prog)
    copy_at: dict[int, int] = {}  # first entry of a copied sub-tree -> its (outermost) root
    for root in range(len(prog)):
        if find(root) != root:
            s = start[root]
            copy_at[s] = max(copy_at.get(s, root), root)
    new_prog: list[Any] = []
    new_idx: dict[int, int] = {}
    refs: set[int] = set()
    kept: list[Any] = []
    pos = 0
    idx = 0
    while idx < len(prog):
        r = copy_at.get(idx)
        if r is not None and find(r) in new_idx:
            for e in prog[idx : r + 1]:
                if e is None:
                    pos += 1
                elif e[_LEAFY]:
                    pos += e[_N]
            k = new_idx[find(r)]
            refs.add(k)
            new_prog.append(k)
            idx = r + 1
            continue
        e = prog[idx]
        new_idx[idx] = len(new_prog)
        new_prog.append(e)
        if e is None:
            kept.append(vals[pos])
            pos += 1
        elif e[_LEAFY]:
            kept.extend(vals[pos : pos + e[_N]])
            pos += e[_N]
        idx += 1
    td = TreeDef._make(new_prog, len(kept), len(kept), None, None, frozenset(refs), frozenset())
    return td.build(kept)
