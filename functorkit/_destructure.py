"""destructure: plan a model's flat vector on its tree definition, fill it, return the rebuilder.

The parameters are the trainable floating and complex arrays among the
model's distinct leaves (the tree definition's rules: ties once, shared
sub-trees once, a leaf trainable when one of its positions is). Their kinds
(namespace, dtype, device) are checked against the policy table, their memory
against aliasing, and the flat vector is filled by the adapter of its
namespace. `Restructure` (``_flat.py``) is the rebuilding half.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

from ._alias import check_constants_apart, check_no_aliases
from ._dense import check_dense
from ._flat import Restructure, _default_float
from ._keypath import KeyPath
from ._plans import keep_plan, plan_for
from ._policy import (
    Kind,
    check_policy,
    decide_mixed,
    mixed_model_error,
    same_device,
)
from ._record import record_plain
from ._reflatten import _check_readable, _new_flat, kinds_of
from ._registry import export_pending, export_static
from ._treedef import TreeDef, add_note
from ._typing import Policy, Tree
from ._xp import device_of, inexact_flags, is_array, is_inexact_array, namespace, promote_dtypes
from .adapters import adapter_for, adapter_of

__all__ = ["destructure"]


def destructure(model: Tree, /, *, policy: Policy = "strict") -> tuple[Any, Restructure[Tree]]:
    """Flatten a model's parameters into one new 1-D array; return it and a rebuilder.

    Parameters are the floating and complex arrays reached through trainable
    children (``nn.Module`` buffers and frozen parameters are not); each
    distinct array counts once (ties), in walk order. Everything else is a
    constant that ``re(p)`` carries unchanged.

    Parameters
    ----------
    model
        Any tree functorkit walks (dicts, lists, dataclasses, registered
        nodes, ``nn.Module``...), up to any depth.
    policy
        ``"strict"`` (default): no conversion anywhere; parameters that differ
        in dtype or device raise `PolicyError` here, and ``re(p)``
        requires `p` to match. ``"model"``: ``re(p)`` casts/moves each slice
        to its parameter's own dtype/device. ``"flat"``: every rebuilt
        parameter takes `p`'s dtype/device. Parameters of two namespaces
        raise under every policy.

    Returns
    -------
    flat : array
        A new 1-D array (never aliasing the model, never carrying autograd
        history) of dtype ``result_type`` of the parameters, on the first
        parameter's device. A model without parameters gives an empty array
        of the namespace and device of its first array leaf and that
        namespace's default floating dtype (NumPy float64 if it has no arrays).
    re : Restructure
        ``re(p)`` rebuilds the model from a flat vector ``p``.

    Raises
    ------
    PolicyError
        Under ``"strict"``, for parameters of different dtypes or devices;
        under every policy, for parameters of different namespaces.
    StructureError
        For a cycle, or two different parameters that share memory.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones((2, 3))
    >>> model = {"enc": w, "dec": w, "b": np.zeros(2), "steps": np.array([3])}
    >>> flat, re = fk.destructure(model)
    >>> flat.shape, len(re)
    ((8,), 8)
    >>> new = re(flat * 2)
    >>> new["enc"] is new["dec"], new["steps"] is model["steps"]
    (True, True)
    """
    pol = check_policy(policy, "fk.destructure")
    leaves, td = record_plain(model, track=True)
    td.refuse_holders(leaves)  # under every policy (SPEC 12: no array is ever silently a constant)
    export_pending()
    op = ("destructure", pol)
    plan: _Plan | None = plan_for(td, op, leaves)  # what an earlier call decided on leaves of these facts
    if plan is not None:
        return plan.run(leaves, td)
    param_idx = _parameters(leaves, td)
    params = list(map(leaves.__getitem__, param_idx))
    check_dense(params, lambda k: td.paths[param_idx[k]].display, "fk.destructure")  # sparse, nested: TypeError
    leaf_paths: tuple[KeyPath, ...] | None = None

    def path_of(k: int) -> KeyPath:
        nonlocal leaf_paths
        if leaf_paths is None:
            leaf_paths = td.paths
        return leaf_paths[param_idx[k]]

    shapes = _shapes(params)
    flat = None
    token = None
    one = _one_kind(params)
    if one is not None:
        kinds, param_kind, param_types = one
    else:
        kinds, param_kind, param_types = _kinds(params, pol, path_of)
    if kinds:
        xp = kinds[0].xp
        dtypes: list[Any] = []
        for k in kinds:
            if not any(k.dtype == d for d in dtypes):
                dtypes.append(k.dtype)
        dtype = promote_dtypes(xp, dtypes)  # (no promotion between two of them: narrow ones as float32)
        flat_kind = Kind(xp, dtype, kinds[0].device)
        if len(kinds) > 1 and decide_mixed(pol, "dtype"):
            # (only devices that cannot be determined differ here, and those count as equal: one kind)
            kinds = [kinds[0]]
            param_kind = [0] * len(params)
            param_types = param_types[:1]
        ad = adapter_for(xp)
        token = ad.plans_flat(params, dtype, flat_kind.device, one is not None and kinds[0].dtype == dtype)
        if token is not None and ONE_PASS[0]:  # the alias proof and the new vector in one pass
            flat = ad.planned_flat(params, token)
        if flat is None:
            check_no_aliases(_LazyPaths(path_of, params), "fk.destructure")
        _check_apart(leaves, param_idx, td)
        _check_readable(kinds, param_kind, flat_kind, path_of)
    elif any(is_array(x) for x in leaves):
        first = next(x for x in leaves if is_array(x))
        xp = namespace(first)
        dev = device_of(first)
        flat_kind = Kind(xp, _default_float(xp, dev), dev)
    else:
        import array_api_compat.numpy as npx

        flat_kind = Kind(npx, npx.float64, "cpu")  # type: ignore[attr-defined]
    sizes = list(map(math.prod, shapes))
    offsets = list(itertools.accumulate(sizes, initial=0))[:-1]
    if flat is None:
        flat = _new_flat(flat_kind, sum(sizes), params, offsets, shapes)
    template = _template(leaves, param_idx)  # the parameters come from p; the template keeps only the constants
    re = Restructure._make(
        td=td,
        template=template,
        param_idx=param_idx,
        shapes=shapes,
        kinds=kinds,
        param_kind=param_kind,
        flat_kind=flat_kind,
        ftype=type(flat),
        policy=pol,
        param_types=param_types,
        sizes=sizes,
        offsets=offsets,
    )
    keep_plan(td, op, leaves, _Plan(re, offsets, sizes, token))  # kept for a definition the walk reuses
    return flat, re


#: `_Plan.run` asks the flat vector's adapter for its one pass (the alias proof and the new vector
#: together, ``ArrayAdapter.planned_flat``; torch: bench_flat's "one pass" on/off row,
#: tests/test_destructure_plan.py); off: the alias check and ``new_flat`` apart
ONE_PASS = [True]


class _Plan:
    """What `destructure` decided for one reused tree definition and policy: the rebuilder
    (parameter indices, shapes, kinds) and the flat layout. The plan cache (``_plans.py``) keeps
    it with the facts of the leaves it was decided on (`_plans.LeafFacts`: every leaf's type,
    every array's dtype, shape, device and density) and hands it back only for leaves with
    the same facts, which the full analysis would decide the same for; so only the per-call
    work is left: the alias check, the new flat vector and a new `Restructure` around the new
    constants (bench_flat ``destructure(model)`` rows; tests/test_destructure_plan.py checks that
    this path is taken and that each fact, changed, leads back to the full analysis). Where the
    flat vector's adapter has one pass for the first two (`ONE_PASS`), it is tried first."""

    __slots__ = ("ad", "n", "offsets", "re", "token")

    def __init__(self, re: Restructure[Any], offsets: list[int], sizes: list[int], token: Any) -> None:
        self.re = re
        self.offsets = offsets
        self.n = sum(sizes)
        self.ad = adapter_for(re._flat_kind.xp)
        self.token = token  # (`ArrayAdapter.plans_flat` of the parameters: from facts the plan keys on)

    def run(self, leaves: list[Any], td: TreeDef) -> tuple[Any, Restructure[Any]]:
        old = self.re
        idx = old._param_idx
        params = list(map(leaves.__getitem__, idx))
        flat = None
        if self.token is not None and ONE_PASS[0]:
            flat = self.ad.planned_flat(params, self.token)
        if flat is None:

            def path_of(k: int) -> KeyPath:
                return td.paths[idx[k]]

            check_no_aliases(_LazyPaths(path_of, params), "fk.destructure")
        _check_apart(leaves, idx, td)
        if flat is None:
            flat = _new_flat(old._flat_kind, self.n, params, self.offsets, old._shapes)
        if len(idx) == len(leaves):
            # every leaf a parameter: no constant, so nothing in a new rebuilder would differ from the
            # kept one (its generated code included, made at its first use: a rebuilder made under
            # other `_flat.GENERATED` switches comes from the full analysis, bench_flat's re(p) rows)
            return flat, old
        return flat, old._again(_template(leaves, idx))


def _template(leaves: list[Any], param_idx: list[int]) -> list[Any]:
    """The leaves with None at the parameters' places (`Restructure`'s constants)."""
    if len(param_idx) == len(leaves):
        return [None] * len(leaves)  # (every leaf a parameter: no constant)
    template = list(leaves)
    for j in param_idx:
        template[j] = None
    return template


_dtype_of = operator.attrgetter("dtype")
_device_attr = operator.attrgetter("device")
_shape_of = operator.attrgetter("shape")
_TUPLE = {tuple}
_INT = {int}


def _shapes(params: list[Any]) -> list[tuple[int, ...]]:
    shapes = list(map(_shape_of, params))
    types = set(map(type, shapes))
    if types <= _TUPLE:
        return shapes
    if all(issubclass(t, tuple) for t in types):  # torch.Size: plain tuples in C-level passes
        plain = list(map(tuple, shapes))
        if set(map(type, itertools.chain.from_iterable(plain))) <= _INT:
            return plain
    return [tuple(map(int, s)) for s in shapes]  # a library's own shape type, symbolic sizes


def _check_apart(leaves: list[Any], param_idx: list[int], td: TreeDef) -> None:
    """No constant array (a buffer, a frozen parameter) shares memory with a parameter: ``re(p)``
    would give the parameter its slice of ``p`` and keep the constant, untying them silently
    (``fk.load_into`` refuses the same model). Paths are built only for a message."""
    if len(param_idx) == len(leaves):
        return  # (every leaf a parameter: no constant)
    is_param = set(param_idx)
    # floating constants only (buffers, frozen parameters): an integer or bool array is no view of a
    # parameter's elements short of a dtype reinterpretation
    consts = [j for j, x in enumerate(leaves) if j not in is_param and is_inexact_array(x)]
    if not consts:
        return

    def where(side: int, k: int) -> tuple[int, KeyPath]:
        j = (param_idx, consts)[side][k]
        return j, td.paths[j]

    check_constants_apart(
        list(map(leaves.__getitem__, param_idx)), list(map(leaves.__getitem__, consts)), where, "fk.destructure"
    )


def _parameters(leaves: list[Any], td: TreeDef) -> list[int]:
    """Indices of the parameters among the distinct leaves: trainable floating or complex arrays."""
    try:
        flags = inexact_flags(leaves)
    except TypeError as e:  # a leaf functorkit refuses to classify (np.matrix): say where it is
        j = 0
        for j, x in enumerate(leaves):  # noqa: B007 -- j names the leaf that raised
            try:
                is_inexact_array(x)
            except TypeError:
                break
        add_note(e, f"(functorkit: raised while visiting {td.paths[j].display})")
        raise
    trainable = td._trainable_mask()
    if trainable is not None:
        flags = list(map(operator.and_, flags, trainable))
    return list(itertools.compress(range(len(leaves)), flags))


def _one_kind(params: list[Any]) -> tuple[list[Kind], list[int], list[type]] | None:
    """The common case in C-level passes: every parameter of one type and dtype, on one device
    (a library with one device, or one whose arrays carry their device as an attribute: torch;
    bench_scale ``fk.destructure(d)`` and bench_walk's module rows); None for anything else."""
    if not params:
        return [], [], []
    types = set(map(type, params))
    if len(types) != 1:
        return None
    x = params[0]
    ad = adapter_of(x)
    if not ad.one_device:
        if not ad.device_attr:
            return None
        dev = x.device
        if not all(map(operator.eq, map(_device_attr, params), itertools.repeat(dev))):
            return None
    dt = x.dtype
    if not all(map(operator.is_, map(_dtype_of, params), itertools.repeat(dt))):  # (one C-level pass first)
        for other in map(_dtype_of, params):
            if other is not dt and other != dt:
                return None
    return [Kind(ad.xp, dt, ad.device(x))], [0] * len(params), [type(x)]


def _kinds(params: list[Any], pol: str, path_of: Any) -> tuple[list[Kind], list[int], list[type]]:
    """Each parameter's kind (namespace, dtype, device), refusing what the policy refuses."""

    def refuse(j: int, k: Kind, met: list[Kind]) -> None:
        if not met:
            return
        first = met[0]
        if first.xp is not k.xp and decide_mixed(pol, "namespace"):
            raise mixed_model_error(pol, "namespace", path_of(0), first, path_of(j), k)
        what = "dtype" if first.dtype != k.dtype else "device"
        if decide_mixed(pol, what) and (what == "dtype" or not same_device(first.device, k.device)):
            raise mixed_model_error(pol, what, path_of(0), first, path_of(j), k)

    return kinds_of(params, refuse)


class _LazyPaths:
    """``(path, parameter)`` pairs whose paths are computed only when a message shows one."""

    __slots__ = ("_f", "_params")

    def __init__(self, f: Any, params: list[Any]) -> None:
        self._f = f
        self._params = params

    def __iter__(self) -> Any:
        return zip(map(_Deferred, itertools.repeat(self._f), range(len(self._params))), self._params)

    def arrays(self) -> list[Any]:
        return self._params


class _Deferred:
    """A path computed only when displayed (for the alias check's message)."""

    __slots__ = ("_f", "_j")

    def __init__(self, f: Any, j: int) -> None:
        self._f = f
        self._j = j

    @property
    def display(self) -> str:
        return str(self._f(self._j).display)


# Restructure and TreeDef are pytrees with no leaves (themselves their static aux data) in JAX and
# torch, so they can be passed to jax.jit-ed functions and torch.func.vmap (docs/interop.md)
export_static(TreeDef)
export_static(Restructure)
