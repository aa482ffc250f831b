"""`re.flatten(model, out=...)`: another model of a `Restructure`'s structure flattened with its plan
(the inverse of ``re(p)``), with the checks on `out`. A mixin of `Restructure` (``_flat.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._alias import layouts_overlap, memory_layout, separate_allocations
from ._dense import check_dense
from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._plans import keep_plan, plan_for
from ._policy import (
    Kind,
    check_policy,
    decide_flatten,
    describe_device,
    describe_dtype,
    describe_namespace,
    flatten_error,
    same_device,
)
from ._program import MISS
from ._record import all_distinct
from ._treedef import TreeDef
from ._typing import Policy, Tree
from ._xp import is_array, is_inexact_array, namespace
from .adapters import ArrayAdapter, adapter_for, adapter_of, tracing

#: ``re.flatten`` keeps what it decided on a model's parameters in the plan cache, keyed by their
#: facts (off: every call makes every check; bench_flat's torch "re.flatten plan" on/off row,
#: tests/test_destructure_plan.py)
FLATTEN_PLAN = [True]


class Reflatten:
    """The flattening half of `Restructure` (its state is declared and set there)."""

    __slots__ = ("_paths",)
    _adapter: ArrayAdapter
    _fast: Any
    _flat_kind: Kind
    _ftype: Any
    _has_complex: bool
    _kinds: list[Kind]
    _n: int
    _offsets: list[int]
    _param_idx: list[int]
    _param_kind: list[int]
    _param_types: list[type]
    _policy: str
    _shapes: list[tuple[int, ...]]
    _sizes: list[int]
    _td: TreeDef
    _template: list[Any]
    _uniform: bool
    _paths: tuple[KeyPath, ...] | None

    @property
    def paths(self) -> tuple[KeyPath, ...]:
        """The key path of each parameter (its first position, for ties), in walk order."""
        if self._paths is None:
            leaf_paths = self._td.paths
            self._paths = tuple(leaf_paths[j] for j in self._param_idx)
        return self._paths

    def flatten(self, model: Tree, /, *, out: Any = None, policy: Policy | None = None) -> Any:
        """Flatten another model of the same structure with this plan (the inverse of ``re(p)``).

        Parameters
        ----------
        model
            A model of the structure given to `destructure` (node types,
            keys, lengths, ties; parameters of the same shapes). Constants are
            not compared.
        out
            Optional 1-D array of length ``len(re)`` and of the flat vector's
            dtype, device and namespace: written in place and returned,
            nothing allocated. Immutable backends (JAX, Dask) raise TypeError.
        policy
            How a parameter of another dtype/device than the flat vector is
            treated: ``"strict"`` raises PolicyError, ``"model"``/``"flat"``
            convert it (complex into a real flat vector always raises).
            Default: the policy given to `destructure`.

        Returns
        -------
        flat : array
            The flat vector (`out` if given). It never carries autograd history (inside a
            ``torch.func`` transform it is the transform's own tensors, concatenated; `out`
            is then refused).

        Raises
        ------
        StructureError
            If `model`'s structure differs (the message names the path).

        Examples
        --------
        >>> import numpy as np
        >>> import functorkit as fk
        >>> flat, re = fk.destructure({"w": np.ones(2), "b": np.zeros(1)})
        >>> buf = np.empty(len(re))
        >>> re.flatten({"w": np.full(2, 7.0), "b": np.ones(1)}, out=buf) is buf
        True
        >>> buf
        array([7., 7., 1.])
        """
        pol = self._policy if policy is None else check_policy(policy, "re.flatten")
        kind = self._flat_kind
        if out is not None:
            self._check_out(out)
        leaves, known = self._match(model, pol)
        if out is not None:
            self._check_out_apart(out, leaves)
        if known is None:
            # policy: each parameter's kind against the flat vector, decided once per kind

            def refuse(j: int, lk: Kind, _met: list[Kind]) -> None:
                d = decide_flatten(pol, lk, kind)
                if d.error is not None:
                    raise flatten_error(pol, self.paths[j], lk, kind, d.error)

            kinds, which, _ = kinds_of(leaves, refuse)
            _check_readable(kinds, which, kind, lambda j: self.paths[j])
            # what was decided on the parameters' facts (density, kinds, shapes) is kept with them
            if not tracing():
                token = self._adapter.plans_flat(leaves, kind.dtype, kind.device)
                keep_plan(self._td, ("re.flatten", pol), leaves, (self._param_idx, self._shapes, kind, token), own=True)
        elif out is not None and known[3] is not None and self._adapter.planned_fill(out, leaves, known[3]):
            return out
        if out is None:
            return _new_flat(kind, self._n, leaves, self._offsets, self._shapes)
        self._adapter.fill(out, leaves, self._offsets, self._shapes)
        return out

    def _check_out(self, out: Any) -> None:
        kind = self._flat_kind
        n = self._n
        if not is_array(out):
            msg = f"re.flatten: `out` must be a 1-D array of length {n}, got {type(out).__name__}."
            raise TypeError(msg)
        ok = namespace(out)
        if ok is not kind.xp:
            msg = (
                f"re.flatten: `out` is a {describe_namespace(ok)} array but the flat vector is "
                f"{describe_namespace(kind.xp)}; pass an `out` of the flat vector's namespace."
            )
            raise TypeError(msg)
        ad = self._adapter
        if not ad.mutable:
            msg = (
                f"re.flatten: `out=` needs a mutable array, but {describe_namespace(ok)} arrays are immutable; "
                "call re.flatten(model) without `out` (it returns a new array)."
            )
            raise TypeError(msg)
        if tuple(out.shape) != (n,):
            msg = f"re.flatten: `out` must be 1-D of length {n}, got shape {tuple(out.shape)}."
            raise ValueError(msg)
        if out.dtype != kind.dtype:
            msg = (
                f"re.flatten: `out` has dtype {describe_dtype(out.dtype)} but the flat vector is "
                f"{describe_dtype(kind.dtype)}; pass an `out` of dtype re.dtype."
            )
            raise TypeError(msg)
        if not same_device(ad.device(out), kind.device):
            msg = (
                f"re.flatten: `out` is on {describe_device(ad.device(out))} but the flat vector is on "
                f"{describe_device(kind.device)}; pass an `out` on re.device."
            )
            raise ValueError(msg)
        problem = ad.out_problem(out)
        if problem is not None:
            msg = f"re.flatten: `out` cannot be written: {problem}; pass a writeable, contiguous 1-D array."
            raise ValueError(msg)

    def _check_out_apart(self, out: Any, leaves: list[Any]) -> None:
        """`out` must not share memory with a parameter it is filled from (it would be read after
        being overwritten)."""
        if self._adapter.proves_apart(out, leaves):  # (C-level passes: no loop)
            return
        ext = self._adapter.memory_extent(out)
        if ext is None or separate_allocations([out, *leaves]):
            return
        space, lo, hi = ext
        lay = None
        for k, x in enumerate(leaves):
            # the byte range first (cheap); the exact layouts only where the ranges meet
            # (bench_flat "mlp, torch" re.flatten(model, out=buf) row)
            ex = adapter_of(x).memory_extent(x)
            if ex is None or ex[0] != space or ex[2] <= lo or hi <= ex[1]:
                continue
            if lay is None:
                lay = memory_layout(out)
            lx = memory_layout(x)
            if lay is not None and lx is not None and layouts_overlap(lay, lx):
                msg = (
                    f"at {self.paths[k].display}: re.flatten: `out` shares memory with this parameter of the "
                    "model, so writing `out` would overwrite values not yet read. Expected an `out` apart from "
                    "the model; fix: pass a fresh array (or call re.flatten(model) without `out`)."
                )
                raise ValueError(msg)

    def _match(self, model: Any, pol: str) -> tuple[list[Any], Any]:
        """The parameters of `model` at the plan's positions (StructureError where it differs), and
        the plan cache's (``_plans``) record of this rebuilder's decisions for parameters of
        their facts under policy `pol`, or None: made by an earlier call that passed every check
        here and in `flatten`, so the checks that follow from the facts are not made again
        (FLATTEN_PLAN, bench_flat's torch "re.flatten plan" on/off row). A definition the walk
        has met before (a small container tree without ties) is matched by its generated
        matcher, which also finds every position a distinct object; on a miss, the definition's
        own match says where the model differs."""
        td = self._td
        fm = td._generated_match()
        got: Any = fm(model, True) if fm is not None else MISS
        distinct = got is not MISS  # (the generated match found no two positions holding one object)
        if not distinct:
            got = td._match(model, 1, None, None, lambda path, left, right: _flatten_mismatch(path, left, right))
        if type(got) is int:
            raise _flatten_mismatch(
                td.entry_path(got), "the sub-tree shared with an earlier position (the same object)", "another object"
            )
        assert type(got) is list
        td.refuse_holders(got, positions=True)
        pos_leaf = td._ties()
        first = td.leaf_positions()
        leaves = [got[first[j]] for j in self._param_idx]
        # (not while torch.compile traces: the facts' C-level passes do not trace, the checks do)
        plan = plan_for(td, ("re.flatten", pol), leaves) if FLATTEN_PLAN[0] and not tracing() else None
        known = plan
        if plan is not None and (plan[0], plan[1], plan[2]) != (self._param_idx, self._shapes, self._flat_kind):
            known = None  # (another rebuilder's, of the same definition)
        if known is None:
            check_dense(leaves, lambda k: self.paths[k].display, "re.flatten")  # sparse, nested: TypeError
            for k, (x, shape) in enumerate(zip(leaves, self._shapes, strict=True)):
                if not is_inexact_array(x) or tuple(x.shape) != shape:
                    raise _flatten_mismatch(
                        self.paths[k], f"a floating or complex array of shape {shape}", _describe_obj(x)
                    )
        if pos_leaf is not None:  # ties: every position of a tied parameter holds the same array
            params = set(self._param_idx)
            for p, j in enumerate(pos_leaf):
                if j in params and got[p] is not got[first[j]]:
                    raise _flatten_mismatch(
                        td.position_paths()[p], "the parameter tied to an earlier position (the same array)",
                        "another array",
                    )
        if not distinct and not all_distinct(leaves):
            owner: dict[int, int] = {}
            for k, x in enumerate(leaves):
                if owner.setdefault(id(x), k) != k:
                    raise _flatten_mismatch(
                        self.paths[k], "a parameter distinct from the one at an earlier position", "the same array"
                    )
        return leaves, known


def _flatten_mismatch(path: KeyPath, expected: object, found: object) -> StructureError:
    msg = (
        f"at {path.display}: re.flatten expected {expected}, found {found}. The model must have the "
        "structure of the one given to fk.destructure (node types, keys, lengths, ties, parameter "
        "shapes). Fix: pass a model of that structure, or destructure this one itself."
    )
    return StructureError(msg)


def _describe_obj(c: Any) -> str:
    if is_array(c):
        return f"{type(c).__name__} of dtype {describe_dtype(c.dtype)} and shape {tuple(c.shape)}"
    return f"leaf ({type(c).__name__})"


def _new_flat(kind: Kind, n: int, leaves: list[Any], offsets: list[int], shapes: list[tuple[int, ...]]) -> Any:
    """A new flat vector holding `leaves` (never aliasing them, never carrying autograd history)."""
    return adapter_for(kind.xp).new_flat(kind.dtype, kind.device, n, leaves, offsets, shapes)


def kinds_of(
    arrays: list[Any], new_kind: Callable[[int, Kind, list[Kind]], None]
) -> tuple[list[Kind], list[int], list[type]]:
    """Each array's kind (namespace, dtype, device), grouped: the distinct kinds in order of first
    appearance, each array's index into them, and the array type of each kind. ``new_kind(j,
    kind, met)`` is called at array `j` of a kind not met before (`met`: the kinds before it), to
    refuse what a policy refuses; so every decision on kinds is made once per kind, here for
    `destructure` and ``re.flatten`` alike. The common case (each array of the previous one's
    kind) costs one comparison."""
    kinds: list[Kind] = []
    which: list[int] = []
    types: list[type] = []
    last: tuple[Any, Any, Any, int] | None = None  # (type, dtype, device, kind index) of the previous array
    for j, x in enumerate(arrays):
        t = type(x)
        ad = adapter_of(x)
        dt = x.dtype
        dev = ad.device(x)
        if last is not None and t is last[0] and (dt is last[1] or dt == last[1]) and dev == last[2]:
            which.append(last[3])
            continue
        k = Kind(ad.xp, dt, dev)
        for i, other in enumerate(kinds):
            if other.xp is k.xp and other.dtype == k.dtype and same_device(other.device, k.device):
                which.append(i)
                break
        else:
            new_kind(j, k, kinds)
            which.append(len(kinds))
            kinds.append(k)
            types.append(t)
        last = (t, dt, dev, which[-1])
    return kinds, which, types


def _check_readable(kinds: list[Kind], param_kind: list[int], flat_kind: Kind, path_of: Any) -> None:
    """A parameter whose values cannot be read (a torch ``meta`` tensor) can only fill a flat vector
    on such a device itself."""
    ad = adapter_for(flat_kind.xp)
    if not ad.readable(flat_kind.device):  # a flat vector without values: only parameters without values
        for j, i in enumerate(param_kind):
            if adapter_for(kinds[i].xp).readable(kinds[i].device):
                msg = (
                    f"at {path_of(j).display}: the parameter holds values on {describe_device(kinds[i].device)}, "
                    f"but the flat vector is on {describe_device(flat_kind.device)} (the first parameter's "
                    "device), which holds none: its values would be lost. Expected parameters on one device; "
                    "fix: move the model to one device first (or materialise the meta parameters: "
                    "`module.to_empty(device=...)` and load weights)."
                )
                raise PolicyError(msg)
        return
    if all(adapter_for(k.xp).readable(k.device) for k in kinds):
        return
    for j, i in enumerate(param_kind):
        if not adapter_for(kinds[i].xp).readable(kinds[i].device):
            msg = (
                f"at {path_of(j).display}: the parameter is on {describe_device(kinds[i].device)}, which holds "
                f"no values, but the flat vector is on {describe_device(flat_kind.device)}. "
                "Expected parameters whose values can be read; fix: materialise the model first "
                "(e.g. `module.to_empty(device=...)` and load weights), or destructure a model whose "
                "parameters are all on that device."
            )
            raise PolicyError(msg)
