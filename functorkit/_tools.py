"""Tree tools on the one recorded tree definition: partition and combine, stack and unstack.

Each tool records its tree(s) once (:func:`record`) and rebuilds with the
recorded definition, so ties, shared sub-trees and trainable leaves follow the
rules of docs/treedef.md (R1-R3) exactly as in ``fmap`` and ``destructure``.
Array work goes through the array API namespace of the arrays (``xp.stack``,
indexing) and the adapters' ``copy``/``to_device``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from typing import Any

from ._errors import PolicyError, StructureError
from ._keypath import KeyPath, safe_repr
from ._policy import check_policy
from ._record import record
from ._treedef import _LEAFY, _N, TreeDef, _aux_equal, add_note
from ._xp import Kind, describe_kind, device_of, is_array, namespace, same_device
from .adapters import adapter_of

__all__ = ["combine", "partition", "stack", "unstack"]


# ============================================================== partition / combine

_MODULE_NOTE = (
    "(fk.combine: the groups must have one structure. A torch nn.Module drops a parameter or buffer slot "
    "that holds None, as torch does for bias=None, so partition groups of modules differ in structure; "
    "put a group's leaves back into the model with fk.replace(model, dict(fk.leaves_with_path(group))).)"
)


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
        :class:`KeyPath`) or a glob str matched (``fnmatch``, case-sensitive)
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
    The groups keep shared sub-trees shared. :func:`combine` puts them back
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
    """Put the groups of :func:`partition` back together: the inverse of ``partition``.

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
    recs = [record(g) for g in groups]
    exp0 = recs[0][1].expanded()
    names = tuple(f"groups[{k}]" for k in range(len(groups)))
    try:
        cols = [exp0.flatten_up_to(g, which=k, names=names) for k, g in enumerate(groups)]
    except StructureError as e:
        add_note(e, _MODULE_NOTE)
        raise
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


# ============================================================== stack / unstack


def _stack_mismatch(td0: TreeDef, tdi: TreeDef, models: list[Any], i: int) -> StructureError:
    """The error for models[i] whose definition differs from models[0]'s: names the first path."""
    names = tuple(f"models[{k}]" for k in range(len(models)))
    td0.expanded().flatten_up_to(models[i], which=i, names=names)  # raises for node types, keys, lengths
    e0, ei = td0.expanded(), tdi.expanded()
    what = "differs in its static (non-child) data or in which sub-trees are shared"
    path = KeyPath(())
    if e0.num_positions == ei.num_positions:
        lp0, lpi = e0.leaf_positions(), ei.leaf_positions()
        pl0: Any = e0._pos_leaf or range(e0.num_positions)
        pli: Any = ei._pos_leaf or range(ei.num_positions)
        for p in range(e0.num_positions):
            if lp0[pl0[p]] != lpi[pli[p]]:
                path = e0.position_paths()[p]
                what = "differs in ties (which places hold one object)"
                break
        else:
            for j, (a, b) in enumerate(zip(td0.trainable, tdi.trainable)):
                if a != b:
                    path = td0.paths[j]
                    what = f"differs in trainability (trainable in {names[0 if a else i]} only)"
                    break
    msg = (
        f"fk.stack: at {path.display}: {names[i]} {what} from {names[0]}. Expected models of one "
        "structure (fk.flatten(m)[1] equal for all); fix: make the models alike (same ties, frozen "
        "parameters and static data)."
    )
    return StructureError(msg)


def _kind(x: Any) -> Kind:
    return Kind(namespace(x), x.dtype, device_of(x))


def _stack_leaf(xs: list[Any], path: KeyPath, pol: str) -> Any:
    """One stacked array from the arrays `xs` (one per model), after the checks of `pol`."""
    x0 = xs[0]
    ad = adapter_of(x0)
    t0, dt0, dev0, shape0 = type(x0), x0.dtype, ad.device(x0), x0.shape
    for x in xs:  # the common case: one type, dtype, device and shape everywhere
        if type(x) is not t0 or x.shape != shape0 or not (x.dtype is dt0 or x.dtype == dt0):
            break
        dev = ad.device(x)
        if not (dev is dev0 or dev == dev0):
            break
    else:
        return ad.xp.stack(xs, axis=0)
    k0 = _kind(x0)
    shape0 = tuple(x0.shape)
    kinds = [k0]
    for i in range(1, len(xs)):
        x = xs[i]
        if not is_array(x):
            msg = (
                f"fk.stack: at {path.display}: models[0] holds an array, models[{i}] a {type(x).__name__}. "
                "Expected an array of the same shape in every model; fix that model."
            )
            raise StructureError(msg)
        if tuple(x.shape) != shape0:
            msg = (
                f"fk.stack: at {path.display}: models[0] holds shape {shape0}, models[{i}] shape "
                f"{tuple(x.shape)}. Expected one shape per place in every model; fix that model."
            )
            raise StructureError(msg)
        k = _kind(x)
        kinds.append(k)
        if k.xp is not k0.xp or (pol == "strict" and (k.dtype != k0.dtype or not same_device(k.device, k0.device))):
            allowed = k.xp is k0.xp
            fix = (
                "convert the models, or pass policy='model' (a common dtype by result_type, on models[0]'s device)"
                if allowed
                else "convert the models to one array library (no policy mixes namespaces)"
            )
            msg = (
                f"fk.stack: at {path.display}: models[0] holds {describe_kind(k0)}, models[{i}] holds "
                f"{describe_kind(k)}; policy={pol!r} converts nothing. Expected one dtype and device per "
                f"place in every model; fix: {fix}."
            )
            raise PolicyError(msg)
    xp = k0.xp
    dtypes: list[Any] = []
    for k in kinds:
        if not any(k.dtype == d for d in dtypes):
            dtypes.append(k.dtype)
    if len(dtypes) > 1 or any(not same_device(k.device, k0.device) for k in kinds):
        dtype = dtypes[0] if len(dtypes) == 1 else xp.result_type(*dtypes)
        conv = []
        for x, k in zip(xs, kinds):
            if k.dtype != dtype:
                x = xp.astype(x, dtype)
            if not same_device(k.device, k0.device):
                x = adapter_of(x).to_device(x, k0.device)
            conv.append(x)
        xs = conv
    return xp.stack(xs, axis=0)


def stack(models: Iterable[Any], /, *, policy: str = "strict") -> Any:
    """One model whose arrays have a leading axis: ``out[i]`` holds ``models[i]``'s values.

    Parameters
    ----------
    models
        Two or more (or one) models of one structure: the same node types,
        keys, ties, shared sub-trees and trainable leaves
        (``fk.flatten(m)[1]`` equal).
    policy
        As in :func:`destructure`. ``"strict"`` (default): the arrays at one
        place must have one dtype and device in every model.
        ``"model"``/``"flat"`` (alike here): dtypes are promoted by
        ``result_type`` and arrays moved to ``models[0]``'s device. Arrays of
        two namespaces raise under every policy.

    Returns
    -------
    model
        Rebuilt on ``models[0]``'s structure (its node types and static
        data; an ``nn.Module`` is a new module of its class, as from
        ``fk.fmap``). Every array leaf (parameters, buffers, integer arrays)
        is ``xp.stack`` of the models' arrays (a new array; autograd records
        the stack as ``torch.stack`` does); a tied array is stacked once and
        the result is tied at the same places. Other leaves are ``models[0]``'s
        objects and must be equal in every model.

    Raises
    ------
    StructureError
        Naming the first path where a model differs from ``models[0]``
        (structure, ties, shapes, constants).
    PolicyError
        For dtypes or devices that `policy` does not convert.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones(2)
    >>> m1 = {"enc": w, "dec": w, "act": "relu"}
    >>> v = np.full(2, 2.0)
    >>> s = fk.stack([m1, {"enc": v, "dec": v, "act": "relu"}])
    >>> s["enc"].shape, s["enc"] is s["dec"], s["act"]
    ((2, 2), True, 'relu')
    >>> [m["enc"] for m in fk.unstack(s)]
    [array([1., 1.]), array([2., 2.])]
    """
    pol = check_policy(policy, "fk.stack")
    if isinstance(models, (str, bytes)) or not isinstance(models, Iterable):
        msg = f"fk.stack: `models` must be a list of models, got {type(models).__name__}."
        raise TypeError(msg)
    ms = list(models)
    if not ms:
        msg = "fk.stack: `models` is empty; expected at least one model."
        raise ValueError(msg)
    recs = [record(m) for m in ms]
    leaves0, td0 = recs[0]
    for i in range(1, len(ms)):
        if recs[i][1] != td0:
            raise _stack_mismatch(td0, recs[i][1], ms, i)
    paths: tuple[KeyPath, ...] | None = None
    out = []
    for j, x0 in enumerate(leaves0):
        xs = [lv[j] for lv, _ in recs]
        if is_array(x0):
            if paths is None:
                paths = td0.paths
            out.append(_stack_leaf(xs, paths[j], pol))
            continue
        for i in range(1, len(xs)):
            if not _aux_equal(x0, xs[i]):
                path = td0.paths[j]
                msg = (
                    f"fk.stack: at {path.display}: models[0] holds {safe_repr(x0)}, models[{i}] holds "
                    f"{safe_repr(xs[i])}. Expected the same constant (a leaf that is not an array) in every "
                    "model, since the stacked model keeps one; fix: make them equal, or make the leaf an array."
                )
                raise StructureError(msg)
        out.append(x0)
    return td0.unflatten(out)


def unstack(stacked: Any, /) -> list[Any]:
    """The models of a stacked model: the inverse of :func:`stack`.

    Parameters
    ----------
    stacked
        A model whose array leaves all have one leading axis of length ``n``.

    Returns
    -------
    list
        ``n`` models; model ``i`` holds a **copy** of ``x[i]`` for each array
        leaf ``x`` (no memory shared with `stacked` or between the models;
        autograd kept where the library has it), ties and shared sub-trees
        kept. Leaves that are not arrays are the same objects in every model.

    Raises
    ------
    StructureError
        If an array has no leading axis (0-d) or its length differs from the
        first array's; the message names both paths.
    ValueError
        If `stacked` holds no array.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> ms = fk.unstack({"w": np.arange(6.0).reshape(3, 2), "lr": 0.1})
    >>> len(ms), ms[2]
    (3, {'w': array([4., 5.]), 'lr': 0.1})
    """
    leaves, td = record(stacked)
    n: int | None = None
    first = -1
    for j, x in enumerate(leaves):
        if not is_array(x):
            continue
        shape = tuple(x.shape)
        if not shape or (n is not None and shape[0] != n):
            paths = td.paths
            found = "a 0-d array" if not shape else f"leading axis {shape[0]}"
            lead = f"length {n}, as at {paths[first].display}" if n is not None else "a leading axis"
            msg = (
                f"fk.unstack: at {paths[j].display}: expected an array with {lead}, found {found} "
                f"(shape {shape}). Fix: pass a model made by fk.stack, whose arrays all have one leading axis."
            )
            raise StructureError(msg)
        if n is None:
            n, first = int(shape[0]), j
    if n is None:
        msg = "fk.unstack: the model holds no array, so it has no leading axis to unstack; pass fk.stack's result."
        raise ValueError(msg)
    arrays = [j for j, x in enumerate(leaves) if is_array(x)]
    out = []
    for i in range(n):
        new = list(leaves)
        for j in arrays:
            x = leaves[j]
            new[j] = adapter_of(x).copy(x[i, ...])
        out.append(td.unflatten(new))
    return out
