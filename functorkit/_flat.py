"""destructure and Restructure: flatten a model's parameters to one vector, rebuild it fast.

The plan is made once, in `destructure`, on the model's recorded tree
definition (`functorkit._record.record`): its distinct leaves in
walk order, of which the trainable floating and complex arrays are the
parameters (the rules of ties, shared sub-trees and trainable positions are
the tree definition's), and a table of the parameters' offsets, shapes and
kinds (namespace, dtype, device).

``re(p)`` is the tree definition compiled (``_codegen.py``): generated
straight-line code with the views of ``p`` fused in front, so that ``re(p)``
is one check of ``p``'s type, length, dtype and device followed by views and
the containers. Very large programs run on the tree definition's own
interpreter instead. ``re.flatten(model)`` matches `model` against the tree
definition (``flatten_up_to``). Pickling stores the tree definition and the
table, validated field by field when loaded; the code is generated again.

Every decision about dtypes, devices and namespaces comes from the one table
in ``_policy.py``.
"""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, Generic, cast

from ._codegen import CODEGEN_MAX, build_source, compile_source, entry_of_error
from ._explain import ExplainRow, Explanation, explain_rows
from ._holders import unknown_holders
from ._keypath import KeyPath
from ._persist import use_restructure
from ._policy import (
    POLICIES,
    Decision,
    Kind,
    check_policy,
    decide_rebuild,
    describe_device,
    describe_dtype,
    describe_namespace,
    is_complex,
    rebuild_error,
    same_device,
)
from ._reflatten import Reflatten
from ._registry import SCALAR_TYPES
from ._treedef import BUILD_SAME, TreeDef, add_note
from ._typing import Policy, Tree
from ._xp import is_array, is_inexact_array
from .adapters import adapter_for, adapter_of, tracing

__all__ = ["ExplainRow", "Explanation", "Restructure"]

_MISS = object()
#: the generated code of ``re(p)`` is on: [straight-line rebuild, the adapters' view lines fused in
#: front]. bench_flat's "generated ... off" rows switch each off (same run) and
#: tests/test_flat_codegen.py checks each is taken: the rebuild is 1.3-1.7x faster than the
#: definition's interpreter on the 6-array MLP, the fused views 1.3x (torch) to 2.1x (NumPy)
#: faster than the adapter's ``views``; both are below 20% on a 12-block module (docs/benchmarks.md).
GENERATED = [True, True]


def _kind(x: Any) -> Kind:
    """Namespace, dtype and device of array `x`."""
    ad = adapter_of(x)
    return Kind(ad.xp, x.dtype, ad.device(x))


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _convert(v: Any, d: Decision, pk: Kind) -> Any:
    """Convert a view `v` of p (kind `pk`) as decision `d` says (model policy)."""
    target = d.result
    assert target is not None
    if d.real_part:
        v = pk.xp.real(v)
    ad = adapter_for(target.xp)
    if d.to_namespace:
        v = ad.to_namespace(v, target.device)
    if d.to_dtype or (d.to_namespace and v.dtype != target.dtype):
        v = target.xp.astype(v, target.dtype)
    if d.to_device and not same_device(ad.device(v), target.device):
        v = ad.to_device(v, target.device)
    return v


def _default_float(xp: Any, device: Any) -> Any:
    """The namespace's default real floating dtype (array API inspection, else a float literal's)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:
        return xp.asarray(0.0).dtype
    return info().default_dtypes(device=device)["real floating"]


# ============================================================== Restructure


class Restructure(Reflatten, Generic[Tree]):
    """Rebuilds a model from a flat vector: the second result of `destructure`.

    ``re(p, policy=None, copy=None)`` returns the model with its parameters
    taken from the 1-D array ``p`` (constants carried unchanged, ties
    tied, shared sub-trees shared, node types kept). ``len(re)`` is the
    length of the flat vector; ``re.dtype``, ``re.device`` describe it;
    ``re.paths`` and ``re.shapes`` list the parameters in walk order.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> model = {"w": np.ones((2, 2)), "b": np.zeros(2), "act": "relu"}
    >>> flat, re = fk.destructure(model)
    >>> len(re), [str(p) for p in re.paths]
    (6, ['w', 'b'])
    >>> new = re(np.arange(6.0))
    >>> new["w"], new["b"], new["act"]
    (array([[0., 1.],
           [2., 3.]]), array([4., 5.]), 'relu')
    """

    __slots__ = (
        "__weakref__",
        "_adapter",
        "_build",
        "_fast",
        "_flat_kind",
        "_ftype",
        "_gen",
        "_has_complex",
        "_kinds",
        "_n",
        "_offsets",
        "_param_idx",
        "_param_kind",
        "_param_types",
        "_policy",
        "_shapes",
        "_sizes",
        "_td",
        "_template",
        "_uniform",
    )

    # (the rest of the state is declared by the Reflatten mixin)
    _build: Any
    _gen: tuple[str, dict[int, int]] | None

    def __init__(self) -> None:
        msg = "Restructure objects are made by fk.destructure(model); call that instead."
        raise TypeError(msg)

    # ---------------------------------------------------------------- setup

    @classmethod
    def _make(
        cls,
        *,
        td: TreeDef,
        template: list[Any],
        param_idx: list[int],
        shapes: list[tuple[int, ...]],
        kinds: list[Kind],
        param_kind: list[int],
        flat_kind: Kind,
        ftype: type,
        policy: str,
        param_types: list[type],
        sizes: list[int] | None = None,
        offsets: list[int] | None = None,
    ) -> Restructure[Any]:
        self = object.__new__(cls)
        self._td = td
        self._template = template
        self._param_idx = param_idx
        self._shapes = shapes
        # (`destructure` hands over the sizes and offsets of `shapes` it computed)
        self._sizes = [_size(s) for s in shapes] if sizes is None else sizes
        self._offsets = list(itertools.accumulate(self._sizes, initial=0))[:-1] if offsets is None else offsets
        self._n = sum(self._sizes)
        self._kinds = kinds
        self._param_kind = param_kind
        self._flat_kind = flat_kind
        self._ftype = ftype
        self._policy = policy
        self._paths = None
        self._has_complex = any(is_complex(k) for k in kinds)
        self._uniform = len(kinds) == 1
        self._adapter = adapter_for(flat_kind.xp)
        self._param_types = param_types
        # the code is generated on first use: destructure itself stays cheap
        self._build = self._build_first
        self._fast = self._fast_first
        self._gen = None
        return self

    def _again(self, template: list[Any]) -> Restructure[Any]:
        """This rebuilder over another model's constants (`destructure`'s plan for a definition
        met before): every fact is shared; so is the generated code when every constant is the
        same object (it holds the constants)."""
        new = object.__new__(Restructure)
        for name in _SHARED_STATE:
            setattr(new, name, getattr(self, name))
        new._template = template
        if self._gen is not None and all(map(operator.is_, template, self._template)):  # (same lengths)
            new._build, new._fast, new._gen = self._build, self._fast, self._gen
        else:
            new._build, new._fast, new._gen = new._build_first, new._fast_first, None
        return new

    def _build_first(self, views: Any) -> Any:
        if tracing():  # torch.compile: no compile()/exec while tracing; the interpreter is traceable
            return self._interpret(views)
        self._generate()
        return self._build(views)

    def _fast_first(self, p: Any) -> Any:
        if tracing():
            return self._fast_generic(p, self._interpret)
        self._generate()
        return self._fast(p)

    def _interpret(self, views: Any) -> Any:
        """``_build`` by the tree definition's interpreter (programs too large to generate)."""
        vals = list(self._template)
        for j, v in zip(self._param_idx, views, strict=True):
            vals[j] = v
        return self._td.build(self._td.position_values(vals), BUILD_SAME)

    def _generate(self) -> None:
        """Make ``_build(views)`` and ``_fast(p)`` (generated code, or the interpreter for huge programs)."""
        td = self._td
        nparams = len(self._shapes)
        if td._num_entries() + len(self._shapes) > CODEGEN_MAX or not self._shapes or not GENERATED[0]:
            self._build = self._interpret
            self._fast = self._fast_generic
            return
        glb: dict[str, Any] = {"__builtins__": __builtins__}
        exprs: list[str] = []
        k = 0
        params = set(self._param_idx)
        for j, c in enumerate(self._template):
            if j in params:
                exprs.append(f"v{k}")
                k += 1
            else:
                exprs.append(f"c{j}")
                glb[f"c{j}"] = c
        body_entries: list[int] = []
        body = build_source(td, exprs, glb, body_entries)
        unpack = f"    {', '.join(f'v{k}' for k in range(nparams))}, = v"
        head = ["def build(v):", unpack]
        fast_head = self._fast_head(glb)
        src = "\n".join([*head, *body, *fast_head, *body])
        line_entry: dict[int, int] = {}
        for start in (len(head), len(head) + len(body) + len(fast_head)):
            for i, idx in enumerate(body_entries):
                if idx >= 0:
                    line_entry[start + i + 1] = idx  # line numbers count from 1
        code, filename = compile_source(src)
        exec(code, glb)
        self._gen = (filename, line_entry)
        self._build = glb["build"]
        self._fast = glb["fast"] if GENERATED[1] else self._fast_generic

    def _note_generated(self, e: BaseException) -> None:
        """An error raised inside the generated code: a note naming the node whose line raised it."""
        if self._gen is None:
            return
        idx = entry_of_error(e, *self._gen)
        if idx is not None:
            add_note(e, f"(functorkit: raised while visiting {self._td.entry_path(idx).display})")

    def _fast_head(self, glb: dict[str, Any]) -> list[str]:
        """The start of ``fast(p)``: the adapter's exact-match check of ``p`` and its view lines."""
        ad = self._adapter
        kind = self._flat_kind
        glb["MISS"] = _MISS
        check = ad.check_source(self._ftype, self._n, kind.dtype, kind.device, glb)
        views = ad.view_source(self._offsets, self._shapes, glb)
        return ["def fast(p):", f"    if {check}:", "        return MISS", *views]

    def _fast_generic(self, p: Any, build: Any = None) -> Any:
        kind = self._flat_kind
        ad = self._adapter
        if (
            type(p) is not self._ftype
            or p.shape != (self._n,)
            or p.dtype != kind.dtype
            or not same_device(ad.device(p), kind.device)
        ):
            return _MISS
        return (build or self._build)(ad.views(p, self._offsets, self._shapes))

    # ---------------------------------------------------------------- facts

    def __len__(self) -> int:
        return self._n

    @property
    def dtype(self) -> Any:
        """The dtype of the flat vector (``result_type`` of the parameters)."""
        return self._flat_kind.dtype

    @property
    def device(self) -> Any:
        """The device of the flat vector (None if it could not be determined, e.g. under ``jax.jit``)."""
        return self._flat_kind.device

    @property
    def policy(self) -> str:
        """The policy ``re(p)`` uses when none is given (the one given to `destructure`)."""
        return self._policy

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of each parameter, in walk order."""
        return tuple(self._shapes)

    @property
    def offsets(self) -> tuple[tuple[KeyPath, int, int, tuple[int, ...]], ...]:
        """Where each parameter lives in the flat vector: ``(path, start, stop, shape)``, in walk order.

        One row per distinct parameter (a tie once, at its first path), in the
        order of `paths` and `shapes`: ``flat[start:stop]`` reshaped to
        ``shape`` is that parameter, ``stop - start`` its number of entries
        (a ``Diagonal`` contributes its diagonal). Read from the plan
        `destructure` made (no walk); the rows are built at each access.

        Examples
        --------
        >>> import numpy as np
        >>> import functorkit as fk
        >>> flat, re = fk.destructure({"w": np.ones((2, 3)), "b": np.zeros(3)})
        >>> [(str(p), start, stop, shape) for p, start, stop, shape in re.offsets]
        [('w', 0, 6, (2, 3)), ('b', 6, 9, (3,))]
        >>> path, start, stop, shape = re.offsets[1]
        >>> flat[start:stop].reshape(shape)
        array([0., 0., 0.])
        """
        starts = self._offsets
        return tuple(
            (path, start, start + size, tuple(shape))
            for path, start, size, shape in zip(self.paths, starts, self._sizes, self._shapes, strict=True)
        )

    def __eq__(self, other: object) -> bool:
        """Equal when both rebuild alike: equal tree definitions, parameter table and policy, and the
        same constants (identical objects, or equal built-in scalars). Hashable by structure, so two
        equal ones hit one ``jax.jit`` cache entry (docs/interop.md)."""
        if not isinstance(other, Restructure):
            return NotImplemented
        return self is other or (
            self._td == other._td
            and (self._shapes, self._param_kind, self._policy) == (other._shapes, other._param_kind, other._policy)
            and (self._kinds, self._flat_kind) == (other._kinds, other._flat_kind)
            and all(_same_constant(a, b) for a, b in zip(self._template, other._template, strict=True))
        )

    def __hash__(self) -> int:
        return hash((self._td, self._n, self._policy))

    def __repr__(self) -> str:
        k = self._flat_kind
        return (
            f"Restructure(len={self._n}, parameters={len(self._shapes)}, dtype={describe_dtype(k.dtype)}, "
            f"device={describe_device(k.device)}, namespace={describe_namespace(k.xp)}, policy={self._policy!r})"
        )

    # ---------------------------------------------------------------- re(p)

    def __call__(self, p: Any, /, *, policy: Policy | None = None, copy: bool | None = None) -> Tree:
        """Rebuild the model with its parameters taken from the 1-D array `p`.

        The dtype (and device and namespace) of each rebuilt parameter follows
        one rule per policy, and is never converted silently: under
        ``"strict"`` it is the parameter's own, which `p` must already have
        (anything else raises `PolicyError`); under ``"model"`` it is the
        parameter's own (its slice of `p` is cast and moved; a complex `p`
        into a real parameter takes the real part only when the model itself
        has complex parameters, and raises otherwise); under ``"flat"`` it is
        `p`'s (real parameters become complex only when `p` is complex).
        Constants come back as they were. `Restructure.explain` shows the
        outcome per parameter.

        Parameters
        ----------
        p
            A 1-D array of length ``len(re)``.
        policy
            ``"strict"``, ``"model"`` or ``"flat"`` (see `destructure`);
            default: the policy given to `destructure`.
        copy
            ``None``: views of `p` wherever no conversion is needed; ``True``:
            always copies; ``False``: raise ``ValueError`` where a view is
            impossible.

        Returns
        -------
        model : Any
            The model, of the original node types, with parameters from `p`.

        Raises
        ------
        TypeError
            If `p` is not an array, or not a floating/complex one.
        ValueError
            If `p` has the wrong rank or length, or `copy` is False where a
            conversion is needed.
        PolicyError
            If the policy forbids a conversion that `p` needs.
        """
        try:
            if (
                copy is None
                and (policy is None or policy in POLICIES)
                and (self._uniform or (policy or self._policy) == "flat")
            ):
                out = self._fast(p)
                if out is not _MISS:
                    return cast(Tree, out)
            return cast(Tree, self._rebuild(p, policy, copy))
        except Exception as e:
            self._note_generated(e)  # a rebuild function that raised: name its node's path
            raise

    def _check_p(self, p: Any, where: str) -> Kind:
        n = self._n
        if not is_array(p):
            msg = (
                f"{where}: expected a 1-D array of length {n}, got {type(p).__name__}. "
                "Fix: pass an array of the flat vector's namespace (the first result of fk.destructure)."
            )
            raise TypeError(msg)
        shape = tuple(p.shape)
        if len(shape) != 1 or shape[0] != n:
            got = shape[0] if len(shape) == 1 else f"an array of shape {shape}"
            msg = (
                f"{where}: expected length {n}, got {got}. `p` must be a 1-D array with one entry per "
                "parameter element (len(re)); flatten a model of this structure with re.flatten(model)."
            )
            raise ValueError(msg)
        pk = _kind(p)
        if self._shapes and not is_inexact_array(p):
            msg = (
                f"{where}: expected a floating or complex array, got dtype {describe_dtype(p.dtype)}. "
                f"Fix: cast p, e.g. to {describe_dtype(self._flat_kind.dtype)}."
            )
            raise TypeError(msg)
        return pk

    def _decide(self, policy: str, pk: Kind) -> list[Decision]:
        return [decide_rebuild(policy, k, pk, self._has_complex) for k in self._kinds]

    def _first_param_of(self, kind_indices: set[int]) -> int:
        return next(j for j, ki in enumerate(self._param_kind) if ki in kind_indices)

    def _rebuild(self, p: Any, policy: str | None, copy: bool | None) -> Any:
        pol = self._policy if policy is None else check_policy(policy, "re(p)")
        if copy is not None and copy is not True and copy is not False:
            msg = f"re(p): `copy` must be None, True or False, got {type(copy).__name__} ({copy!r})."
            raise TypeError(msg)
        pk = self._check_p(p, "re(p)")
        if not self._shapes:
            return self._build(())
        decisions = self._decide(pol, pk)
        bad = {i for i, d in enumerate(decisions) if d.error is not None}
        if bad:
            j = self._first_param_of(bad)
            d = decisions[self._param_kind[j]]
            assert d.error is not None
            raise rebuild_error(pol, self.paths[j], self._kinds[self._param_kind[j]], pk, d.error)
        conv = {i for i, d in enumerate(decisions) if d.convert}
        if copy is False and conv:
            j = self._first_param_of(conv)
            d = decisions[self._param_kind[j]]
            msg = (
                f"at {self.paths[j].display}: re(p, copy=False) cannot give a view of p here: policy={pol!r} "
                f"needs a conversion ({d.rule}). Fix: pass copy=None to allow copies where needed, or pass a "
                "p that needs no conversion."
            )
            raise ValueError(msg)
        if copy is True:
            p = adapter_for(pk.xp).copy(p)
        views = adapter_for(pk.xp).views(p, self._offsets, self._shapes)
        if conv:
            for j, ki in enumerate(self._param_kind):
                if ki in conv:
                    try:
                        views[j] = _convert(views[j], decisions[ki], pk)
                    except Exception as e:
                        e.add_note(f"(functorkit: raised while converting {self.paths[j].display})")
                        raise
        return self._build(views)

    # ---------------------------------------------------------------- explain

    def explain(self, p: Any, /, *, policy: Policy | None = None, copy: bool | None = None) -> Explanation:
        """A per-parameter table of what ``re(p, policy=policy, copy=copy)`` would do.

        Never raises for a policy problem: the row of a parameter that cannot
        be rebuilt shows the error ``re(p)`` would raise. (A `p` that is not a
        1-D array of length ``len(re)`` still raises, as ``re(p)`` does.)

        Returns
        -------
        Explanation
            ``print()`` it for a text table; ``.rows`` holds `ExplainRow`
            tuples ``(path, shape, model_dtype, model_device, result_dtype,
            result_device, how, rule, error)``.

        Examples
        --------
        >>> import numpy as np
        >>> import functorkit as fk
        >>> flat, re = fk.destructure({"w": np.ones(2, dtype=np.float32)})
        >>> print(re.explain(np.zeros(2), policy="model"))
        p: float64 on cpu (numpy), length 2; policy 'model', copy=None
        path  shape  model        result       how   rule
        ----  -----  -----------  -----------  ----  ------------------------------
        w     (2,)   float32 cpu  float32 cpu  copy  model: cast float64 -> float32
        """
        pol = self._policy if policy is None else check_policy(policy, "re.explain(p)")
        pk = self._check_p(p, "re.explain(p)")
        header = (
            f"p: {describe_dtype(pk.dtype)} on {describe_device(pk.device)} ({describe_namespace(pk.xp)}), "
            f"length {self._n}; policy {pol!r}, copy={copy!r}"
        )
        rows = explain_rows(
            pol, pk, copy, self._decide(pol, pk), self._param_kind, self._kinds, self.paths, self._shapes
        )
        return Explanation(header, rows, unknown_holders(self._template, self._td.paths, set()))

    # ---------------------------------------------------------------- flatten

    # ---------------------------------------------------------------- pickling

    def __reduce__(self) -> tuple[Any, ...]:
        from ._persist import portable_kind, portable_type, restore

        state = {
            "version": 2,
            "treedef": self._td.__reduce__()[1][0],  # its plain, validated state (not an object)
            "template": self._template,
            "param_idx": self._param_idx,
            "shapes": self._shapes,
            "kinds": [portable_kind(k) for k in self._kinds],
            "param_kind": self._param_kind,
            "flat_kind": portable_kind(self._flat_kind),
            "policy": self._policy,
            "param_types": [portable_type(t) for t in self._param_types],
        }
        return (restore, (state,))


def _same_constant(a: Any, b: Any) -> bool:
    """The same built-in scalar: of one type and equal, and floats (complex parts) of one sign too
    (``0.0 == -0.0``, but ``1 / re(p)["c"]`` tells them apart: two rebuilders equal by ``==`` share
    one ``jax.jit`` cache entry)."""
    if a is b:
        return True
    if type(a) is not type(b) or type(a) not in SCALAR_TYPES or a != b:
        return False
    if type(a) is float:
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    if type(a) is complex:
        return math.copysign(1.0, a.real) == math.copysign(1.0, b.real) and math.copysign(
            1.0, a.imag
        ) == math.copysign(1.0, b.imag)
    return True


#: what `Restructure._again` shares between two rebuilders of one plan (all but the constants and
#: the code generated around them)
_SHARED_STATE = tuple(
    n
    for n in (*Reflatten.__slots__, *Restructure.__slots__)
    if n not in ("__weakref__", "_build", "_fast", "_gen", "_template")
)

# unpickling (``_persist.restore``, below this module: ``__reduce__`` uses it) builds with this
# constructor; handed over here, not imported there (no import circle)
use_restructure(Restructure._make)
