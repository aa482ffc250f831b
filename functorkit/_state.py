"""State dicts: a model as a flat ``{dotted key: array}`` mapping, and back.

`state_dict` lists every array position of a tree under the dotted form
of its path (`KeyPath.dotted`): ``torch.nn.Module.state_dict()``'s keys
for modules, the same form for every other tree. `load_state_dict`
looks each of the model's keys up in a flat mapping (from ``torch.load``,
``safetensors``, ``np.load``, a plain dict), reports every key that does not
fit at once, and writes with the one writer of ``_load.py`` (all or nothing,
no aliasing, ties checked).

Both run on the one recorded tree definition (`flatten`), with shared
sub-trees written out at each of their positions (as torch lists a module
used twice under both prefixes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, overload

from . import _program as program
from ._errors import StructureError
from ._keypath import KeyPath, safe_repr
from ._load import Loader
from ._record import flatten
from ._registry import NodeDef
from ._treedef import TreeDef, add_note
from ._xp import MATRIX_MESSAGE, _is_kind, describe_dtype, is_array, namespace
from .adapters import adapter_of

__all__ = ["IncompatibleKeys", "load_state_dict", "state_dict"]

_KINDS = (
    ("bool", "bool"),
    ("integral", "integer"),
    ("real floating", "real floating"),
    ("complex floating", "complex floating"),
)


class _Keys(NamedTuple):
    missing: list[str]
    unexpected: list[str]
    mismatched: list[str]


class IncompatibleKeys(_Keys):
    """What ``fk.load_state_dict(..., strict=False)`` did not load (each a list of keys, in order).

    Attributes
    ----------
    missing
        Keys of the model (``fk.state_dict(dst)``) that the mapping lacks, and whose
        array gets no value through another key (a tie): those arrays keep their values.
    unexpected
        Keys of the mapping that the model does not have (mapping order).
    mismatched
        Keys present in both whose value has another shape or dtype kind than the
        model's array, or is not an array; not loaded. ``strict=True`` says why.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> dst = {"w": np.zeros(2), "b": np.zeros(1)}
    >>> missing, unexpected, mismatched = fk.load_state_dict(dst, {"w": np.ones(2), "v": np.ones(2)}, strict=False)
    >>> missing, unexpected, mismatched, dst["w"]
    (['b'], ['v'], [], array([1., 1.]))
    """

    __slots__ = ()

    def __new__(cls, missing: list[str], unexpected: list[str], mismatched: list[str]) -> IncompatibleKeys:
        for name, keys in (("missing", missing), ("unexpected", unexpected), ("mismatched", mismatched)):
            if type(keys) is not list or not all(type(k) is str for k in keys):
                msg = f"`{name}` must be a list of str keys, got {safe_repr(keys)}."
                raise TypeError(msg)
        return super().__new__(cls, missing, unexpected, mismatched)


def _skipped_positions(td: TreeDef) -> set[int]:
    """Positions of an expanded TreeDef that its nodes leave out of the state dict (torch:
    non-persistent buffers), from one pass over the program."""
    if not any(nd.state_skip is not None for nd in program.node_defs(td)):
        return set()
    skipped: set[int] = set()

    def leaf(p: int, _j: int) -> tuple[int, int]:
        return (p, p + 1)  # the position range of each value built (None: an empty node)

    def node(_idx: int, nd: NodeDef, keys: Any, aux: Any, ch: list[Any]) -> tuple[int, int] | None:
        drop = nd.state_skip(aux) if nd.state_skip is not None and ch else None
        if drop:
            for k, span in zip(keys if keys is not None else range(len(ch)), ch):
                if k in drop and span is not None:
                    skipped.update(range(*span))
        spans = [c for c in ch if c is not None]
        return (spans[0][0], spans[-1][1]) if spans else None

    program.fold(td, leaf, node)
    return skipped


def state_positions(model: Any, who: str) -> tuple[list[Any], TreeDef, list[tuple[str, KeyPath, int]]]:
    """The distinct leaves of `model`, its tree definition, and ``(dotted key, path, leaf index)`` for
    every array position in the state dict, in walk order (the key selection `fk.save` shares)."""
    leaves, recorded = flatten(model)
    recorded.refuse_holders(leaves)
    td = recorded.expanded()
    skipped = _skipped_positions(td)
    owner = td.position_values(list(range(td.num_leaves)))
    out: list[tuple[str, KeyPath, int]] = []
    seen: dict[str, KeyPath] = {}
    for i, (path, j) in enumerate(zip(td.position_paths(), owner, strict=True)):
        try:
            if not is_array(leaves[j]) or i in skipped:
                continue
        except TypeError as e:
            msg = f"at {path.display}: {MATRIX_MESSAGE}"
            raise TypeError(msg) from e
        key = path.dotted
        prev = seen.get(key)
        if prev is not None:
            msg = (
                f"{who}: the paths {prev.display} and {path.display} both read {key!r} in dotted form, so "
                "they cannot both be state-dict keys. Expected each array position to have its own dotted "
                "key; fix: rename one of the keys (e.g. a dict key holding a '.' or a run of digits)."
            )
            raise StructureError(msg)
        seen[key] = path
        out.append((key, path, j))
    return leaves, recorded, out


def _entries(model: Any, who: str) -> list[tuple[str, KeyPath, Any]]:
    """``(dotted key, path, array)`` for every array position of `model` in the state dict, in walk order."""
    leaves, _, found = state_positions(model, who)
    return [(key, path, leaves[j]) for key, path, j in found]


def state_dict(model: Any, /) -> dict[str, Any]:
    """A flat ``{dotted key: array}`` dict of every array in `model`, in walk order.

    Keys are the dotted form of each array's path (`KeyPath.dotted`,
    read back by `KeyPath.parse`): for a ``torch.nn.Module`` they equal
    ``module.state_dict()``'s keys (a ``Sequential`` root reads ``0.weight``;
    parameters, then persistent buffers, then submodules; non-persistent
    buffers are left out, as torch does); every other tree (dicts, lists,
    tuples, dataclasses, registered classes) gets the same form
    (``{"layers": [{"w": a}]}`` gives ``layers.0.w``).

    Every array position is listed: parameters, buffers, frozen parameters,
    integer and boolean arrays. Non-array leaves (Python scalars, strings,
    ``None``) are not. A tied array (one array at several places) is listed
    under every key, as torch does, and each of those keys holds the *same*
    object; a sub-tree used twice is listed under both prefixes.

    Aliasing: the values are the model's own arrays, not copies. NumPy,
    JAX, Dask and array-api-strict arrays are the leaf objects themselves;
    torch tensors are detached aliases (``t.detach()``: the same memory, no
    autograd history), as ``module.state_dict()`` gives. Writing into a value
    writes into the model; ``fk.copy(fk.state_dict(model))`` gives an
    independent copy with the ties kept.

    Raises
    ------
    StructureError
        If two array positions have the same dotted key (e.g. a dict key
        ``"a.b"`` next to ``{"a": {"b": ...}}``); the message names both paths.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones((2, 2))
    >>> model = {"layers": [{"w": w, "b": np.zeros(2)}, {"w": w}], "name": "mlp"}
    >>> sd = fk.state_dict(model)
    >>> list(sd)
    ['layers.0.w', 'layers.0.b', 'layers.1.w']
    >>> sd["layers.1.w"] is sd["layers.0.w"] is w
    True
    >>> fk.KeyPath.parse("layers.0.w").get(model) is w
    True
    """
    out: dict[str, Any] = {}
    detached: dict[int, Any] = {}
    for key, _path, x in _entries(model, "fk.state_dict"):
        v = detached.get(id(x))
        if v is None:
            v = detached[id(x)] = adapter_of(x).detach(x)
        out[key] = v
    return out


def _kind(x: Any) -> str | None:
    xp = namespace(x)
    for kind, name in _KINDS:
        if _is_kind(xp, x.dtype, kind):
            return name
    return None


def _why_not(d: Any, s: Any) -> str | None:
    """Why the mapping's value `s` does not fit the model's array `d` (shape, dtype kind), or None."""
    try:
        s_arr = is_array(s)
    except TypeError:
        return "the mapping holds an np.matrix (convert it with np.asarray)"
    if not s_arr:
        return f"the model has an array of shape {tuple(d.shape)}, the mapping a {type(s).__name__}"
    for side, x in (("model", d), ("mapping", s)):
        why = adapter_of(x).dense_problem(x)  # sparse, nested (torch): no shape to compare
        if why is not None:
            return f"the {side}'s array is not dense: {why}"
    if tuple(d.shape) != tuple(s.shape):
        return f"shape {tuple(d.shape)} in the model vs {tuple(s.shape)} in the mapping"
    dk, sk = _kind(d), _kind(s)
    if dk is None:  # str, object, datetime, structured: no cast within a kind, one dtype only
        if sk is None and type(d.dtype) is type(s.dtype) and d.dtype == s.dtype:
            return None
        return (
            f"dtype {d.dtype} (not a numeric dtype: it takes only a value of that same dtype) in the model "
            f"vs {s.dtype if sk is None else describe_dtype(s.dtype)} ({sk or 'not a numeric dtype'}) in the mapping"
        )
    if dk != sk:
        return (
            f"dtype {describe_dtype(d.dtype)} ({dk}) in the model vs {describe_dtype(s.dtype)} "
            f"({sk or 'not a numeric dtype'}) in the mapping"
        )
    return None


def _listing(keys: list[str]) -> str:
    return ", ".join(map(safe_repr, keys))


@overload
def load_state_dict(dst: Any, mapping: Mapping[str, Any], /, *, strict: Literal[True] = True) -> Any: ...
@overload
def load_state_dict(dst: Any, mapping: Mapping[str, Any], /, *, strict: Literal[False]) -> IncompatibleKeys: ...
@overload
def load_state_dict(dst: Any, mapping: Mapping[str, Any], /, *, strict: bool) -> Any: ...
def load_state_dict(dst: Any, mapping: Mapping[str, Any], /, *, strict: bool = True) -> Any:
    """Copy the arrays of a flat ``{dotted key: array}`` mapping into `dst`'s arrays, in place.

    Each array of `dst` is looked up under its key in `state_dict`
    (``layers.0.weight``; torch's ``state_dict()`` keys for modules) and
    written with the rules of `load_into`: `dst` keeps its arrays
    (an ``nn.Parameter`` stays the registered parameter), dtypes and devices;
    values are cast within a dtype kind and moved (NumPy arrays into a torch
    model work); afterwards `dst` shares no memory with the mapping. The
    mapping is never modified: any ``Mapping`` of ``str`` keys works
    (``torch.load``, ``safetensors.torch.load_file``, ``np.load``'s
    ``NpzFile``, a dict).

    All or nothing: every key is checked, and every value staged, before
    anything is written; if a write fails, `dst` is restored.

    Ties: a tied array of `dst` has several keys; the mapping may hold it
    under each (as torch's state dicts do) or under only one of them (as
    ``safetensors.torch.save_model`` writes it): the array is loaded, and its
    other keys are not missing. Equal values under several keys are fine;
    different values raise a `StructureError` naming both keys' paths.

    Parameters
    ----------
    dst
        The model written into (mutable arrays: not JAX or Dask, not
        read-only NumPy).
    mapping
        Flat mapping from dotted key to array.
    strict
        ``True`` (default): the keys must match exactly, and each value must
        be an array of the model array's shape and dtype kind (bool,
        integer, real floating, complex floating); otherwise one error lists
        every missing, unexpected and mismatched key and nothing is written.
        ``False``: load the keys that fit and return the rest.

    Returns
    -------
    Any or IncompatibleKeys
        `dst` itself when ``strict=True``; an `IncompatibleKeys` named
        tuple ``(missing, unexpected, mismatched)`` of lists of keys when
        ``strict=False``.

    Raises
    ------
    StructureError
        ``strict=True`` and some key is missing, unexpected or mismatched (all
        listed in one message); a tie fed two different values; two array
        positions of `dst` with one dotted key.
    TypeError
        `mapping` is not a mapping with ``str`` keys, or a `dst` array is
        immutable (JAX, Dask, read-only NumPy).
    PolicyError
        A mapping value cannot be read by `dst`'s library.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> dst = {"layers": [{"w": np.zeros(2)}], "steps": np.array(0)}
    >>> out = fk.load_state_dict(dst, {"layers.0.w": np.array([1.0, 2.0]), "steps": np.array(3)})
    >>> out is dst, dst["layers"][0]["w"], dst["steps"]
    (True, array([1., 2.]), array(3))
    >>> fk.load_state_dict(dst, {"layers.0.w": np.ones(3), "extra": np.ones(1)}, strict=False)
    IncompatibleKeys(missing=['steps'], unexpected=['extra'], mismatched=['layers.0.w'])
    """
    if not isinstance(mapping, Mapping):
        msg = (
            f"`mapping` must be a Mapping of dotted keys to arrays (a dict, torch.load's or safetensors' "
            f"output, np.load's NpzFile), got {type(mapping).__name__}; pass dict(pairs) for key/array pairs."
        )
        raise TypeError(msg)
    if type(strict) is not bool:
        msg = f"`strict` must be True or False, got {safe_repr(strict)}."
        raise TypeError(msg)
    names = list(mapping.keys())
    for k in names:
        if type(k) is not str:
            msg = (
                f"`mapping` keys must be str (dotted paths like 'layers.0.weight'), found the "
                f"{type(k).__name__} key {safe_repr(k)}; fix: use dotted string keys, e.g. fk.KeyPath(entries).dotted."
            )
            raise TypeError(msg)
    entries = _entries(dst, "fk.load_state_dict")
    present = set(names)
    known = {key for key, _, _ in entries}
    unexpected = [k for k in names if k not in known]
    mismatched: list[tuple[str, str]] = []
    pairs: list[tuple[KeyPath, Any, Any]] = []
    for key, path, d in entries:
        if key not in present:
            continue
        s = mapping[key]
        why = _why_not(d, s)
        if why is not None:
            mismatched.append((key, why))
        else:
            pairs.append((path, d, s))
    fed = {id(d) for _, d, _ in pairs}  # a tied array is loaded through any one of its keys
    missing = [key for key, _, d in entries if key not in present and id(d) not in fed]
    if strict and (missing or unexpected or mismatched):
        raise _strict_error(missing, unexpected, mismatched)
    loader = Loader("load_state_dict")
    try:
        for path, d, s in pairs:
            loader.visit(path, d, s)
    except (StructureError, TypeError, ValueError) as e:
        add_note(
            e,
            "(functorkit: in fk.load_state_dict, `dst` is the model and `src` at a path is the mapping's "
            "value under that path's dotted key; nothing was written)",
        )
        raise
    loader.commit()
    if strict:
        return dst
    return IncompatibleKeys(missing, unexpected, [k for k, _ in mismatched])


def _strict_error(missing: list[str], unexpected: list[str], mismatched: list[tuple[str, str]]) -> StructureError:
    lines = [
        "fk.load_state_dict: the mapping does not fit the model (strict=True), so nothing was written. "
        "Expected exactly the keys of fk.state_dict(dst), each an array of the model array's shape and "
        "dtype kind; found:"
    ]
    if missing:
        lines.append(f"  {len(missing)} missing (in the model, not in the mapping): {_listing(missing)}")
    if unexpected:
        lines.append(f"  {len(unexpected)} unexpected (in the mapping, not in the model): {_listing(unexpected)}")
    if mismatched:
        lines.append(f"  {len(mismatched)} mismatched:")
        lines.extend(f"    {safe_repr(k)}: {why}" for k, why in mismatched)
    hint = _prefix_hint(missing, unexpected)
    lines.append(
        "Fix: rename or convert the mapping's entries to match"
        + (f" ({hint})" if hint else "")
        + ", or pass strict=False to load the keys that fit and get these lists back."
    )
    return StructureError("\n".join(lines))


def _prefix_hint(missing: list[str], unexpected: list[str]) -> str:
    """A hint when every unexpected key is a missing key under one extra prefix (``module.``)."""
    if not missing or len(missing) != len(unexpected):
        return ""
    want = set(missing)
    first = unexpected[0]
    for m in missing:
        if first.endswith("." + m):
            prefix = first[: len(first) - len(m)]
            if all(u.startswith(prefix) and u[len(prefix) :] in want for u in unexpected):
                return f"every mapping key has the extra prefix {prefix!r}: strip it"
            break
    return ""
