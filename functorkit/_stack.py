"""fk.stack and fk.unstack: models with a leading axis, for ensembles, on the one recorded tree definition.

``stack`` records every model (`record`), checks that their definitions
are equal (``TreeDef ==``; the first differing path is named through
``flatten_up_to`` and the ties and trainability of the expanded definitions),
stacks each distinct array leaf once with its namespace's ``xp.stack`` and
rebuilds on the first model's definition, so ties stay tied. ``unstack``
records the stacked model and rebuilds it once per index with copies of
``x[i, ...]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import _program as program
from ._errors import PolicyError, StructureError, known_shape
from ._keypath import KeyPath, safe_repr
from ._lockstep import _model_list
from ._nodedef import aux_equal as _aux_equal
from ._policy import check_policy
from ._record import record
from ._structured import Diagonal
from ._treedef import TreeDef
from ._xp import Kind, describe_kind, device_of, is_array, namespace, promote_dtypes, same_device
from .adapters import adapter_of
from .adapters._sharding import mixed_problem

__all__ = ["stack", "unstack"]


def _stack_mismatch(td0: TreeDef, tdi: TreeDef, models: list[Any], i: int) -> StructureError:
    """The error for models[i] whose definition differs from models[0]'s: names the first path."""
    names = tuple(f"models[{k}]" for k in range(len(models)))
    td0.expanded().flatten_up_to(models[i], which=i, names=names)  # raises for node types, keys, lengths
    e0, ei = td0.expanded(), tdi.expanded()
    what = "differs in its static (non-child) data or in which sub-trees are shared"
    path = KeyPath(())
    order = program.key_order_difference(td0, tdi)
    if order is not None:
        idx, _, ki = order
        path = td0.entry_path(idx)
        what = f"has its keys in another order ({ki}; key order is structure), differing"
    elif e0.num_positions == ei.num_positions:
        lp0, lpi = e0.leaf_positions(), ei.leaf_positions()
        pl0: Any = e0._ties() or range(e0.num_positions)
        pli: Any = ei._ties() or range(ei.num_positions)
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
            else:
                aux = program.aux_difference(td0, tdi)
                if aux is not None:
                    path = td0.entry_path(aux[0])
                    what = (
                        f"differs in the static (non-child) data of its {aux[1].__qualname__} node (e.g. a "
                        "module's training flag or plain attributes, a dataclass's static fields)"
                    )
    msg = (
        f"fk.stack: at {path.display}: {names[i]} {what} from {names[0]}. Expected models of one "
        "structure (fk.flatten(m)[1] equal for all); fix: make the models alike (same key order, ties, "
        "frozen parameters and static data)."
    )
    return StructureError(msg)


def _kind(x: Any) -> Kind:
    return Kind(namespace(x), x.dtype, device_of(x))


def _stack_leaf(xs: list[Any], path: KeyPath, pol: str) -> Any:
    """One stacked array from the arrays `xs` (one per model), after the checks of `pol`."""
    x0 = xs[0]
    ad = adapter_of(x0)
    t0, dt0, dev0, shape0 = type(x0), x0.dtype, ad.device(x0), x0.shape
    known_shape(x0, f"fk.stack: at {path.display}, models[0]'s array")
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
        why = mixed_problem(ad, x0, x, "models[0]", f"models[{i}]") if type(x) is not t0 else None
        if why is not None:  # (torch: a DTensor and a plain tensor)
            msg = f"fk.stack: at {path.display}: {why}."
            raise PolicyError(msg)
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
        dtype = promote_dtypes(xp, dtypes)  # (no promotion between two of them: narrow ones as float32)
        conv = []
        for i, (x, k) in enumerate(zip(xs, kinds)):
            if k.dtype != dtype:
                x = xp.astype(x, dtype)
            if not same_device(k.device, k0.device):
                ad = adapter_of(x)
                if not ad.readable(k.device):  # as fk.allclose and fk.load_into check it
                    msg = (
                        f"fk.stack: at {path.display}: models[{i}] holds {describe_kind(k)}, an "
                        f"array without values (a torch 'meta' tensor), which policy={pol!r} cannot move to "
                        f"models[0]'s device {k0.device}. Expected arrays with values; fix: materialise that "
                        "model first (e.g. `module.to_empty(device=...)`, then load its values)."
                    )
                    raise PolicyError(msg)
                x = ad.to_device(x, k0.device)
            conv.append(x)
        xs = conv
    return xp.stack(xs, axis=0)


def _refuse_diagonals(model: Any, fname: str = "stack") -> None:
    """A `fk.Diagonal` holds a 1-D diagonal; stacked it would hold a 2-D one (unstacked a 0-d one),
    which no Diagonal can (its shape, ``dense()`` and ``@`` would be wrong): a StructureError at its path."""
    leaves, td = record(model, is_leaf=lambda x: isinstance(x, Diagonal))
    for path, x in zip(td.paths, leaves, strict=True):
        if isinstance(x, Diagonal):
            msg = (
                f"at {path.display}: fk.{fname}: a Diagonal holds a 1-D diagonal; {fname}ed, it would hold a "
                f"{'2' if fname == 'stack' else '0'}-D array, which a Diagonal cannot be (its shape, dense() "
                "and @ would be wrong). Expected "
                "models without fk.Diagonal; fix: stack the diagonals themselves "
                "(fk.stack([d.diag for d in diagonals])), or their dense() matrices."
            )
            raise StructureError(msg)


def stack(models: Iterable[Any], /, *, policy: str = "strict") -> Any:
    """One model whose arrays have a leading axis: ``out[i]`` holds ``models[i]``'s values.

    Parameters
    ----------
    models
        Two or more (or one) models of one structure: the same node types,
        keys, ties, shared sub-trees and trainable leaves
        (``fk.flatten(m)[1]`` equal).
    policy
        As in `destructure`. ``"strict"`` (default): the arrays at one
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
        For dtypes or devices that `policy` does not convert, or a torch
        ``meta`` tensor (no values) that it would move.

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
    ms = _model_list(models, "stack")  # a single model (a dict, an array, a module...) is a TypeError
    if not ms:
        msg = "fk.stack: `models` is empty; expected at least one model."
        raise ValueError(msg)
    recs = [record(m) for m in ms]
    for lv, td in recs:
        td.refuse_holders(lv)
    leaves0, td0 = recs[0]
    if any(issubclass(nd.cls, Diagonal) for nd in program.node_defs(td0)):  # (no second walk otherwise)
        _refuse_diagonals(ms[0], "stack")
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
            out.append(adapter_of(x0).keep_kind(_stack_leaf(xs, paths[j], pol), x0))
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
    """The models of a stacked model: the inverse of `stack`.

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
    td.refuse_holders(leaves)
    if any(issubclass(nd.cls, Diagonal) for nd in program.node_defs(td)):  # (each member's would be 0-d)
        _refuse_diagonals(stacked, "unstack")
    n: int | None = None
    first = -1
    for j, x in enumerate(leaves):
        if not is_array(x):
            continue
        shape = known_shape(x, f"fk.unstack: at {td.paths[j].display}, the array")
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
            ad = adapter_of(x)
            new[j] = ad.keep_kind(ad.copy(x[i, ...]), x)
        out.append(td.unflatten(new))
    return out
