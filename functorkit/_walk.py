"""The maps: fmap, fmapstructure, fmap_with_path, leaves, leaves_with_path.

Each is three steps on the one recorded tree definition (``_treedef.py``):
record the first tree (its distinct leaves and its `TreeDef`), match
the other trees against that definition (``flatten_up_to``), call ``f`` over
the lists of leaves, and rebuild with the definition's program. No second
walker: ties, shared sub-trees, trainable leaves, cycles and paths all come
from the recording.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, cast

from ._errors import PolicyError, StructureError
from ._keypath import KeyPath
from ._leaves_walk import leaves_unrecorded
from ._record import record, record_plain
from ._registry import SCALAR_TYPES
from ._treedef import _MISS as MISS
from ._treedef import BUILD_SAME, BUILD_STRUCTURE, TreeDef, add_note
from ._typing import Tree
from ._xp import is_inexact_array

__all__ = [
    "BUILD_NONE",
    "BUILD_SAME",
    "BUILD_STRUCTURE",
    "fmap",
    "fmap_with_path",
    "fmapstructure",
    "leaves",
    "leaves_with_path",
    "walk",
]

BUILD_NONE = 0
_MISS = MISS  # the sentinel of the generated matchers too
# how `f` is called
_PLAIN, _PATH, _TRACK = 0, 1, 2


def _call_all(
    f: Callable[..., Any], columns: Sequence[Sequence[Any]], paths: Callable[[], Sequence[KeyPath]]
) -> list[Any]:
    """``[f(*xs) for xs in zip(*columns)]``; an exception from `f` gets a note naming its path."""
    out: list[Any] = []
    try:
        out.extend(map(f, *columns))
    except (StructureError, PolicyError):
        raise  # functorkit's own errors name their path already
    except Exception as e:
        add_note(e, f"(functorkit: raised while visiting {paths()[len(out)].display})")
        raise
    return out


def _map(
    trees: tuple[Any, ...],
    f: Callable[..., Any],
    *,
    style: int = _PLAIN,
    build: int = BUILD_SAME,
    is_leaf: Callable[[Any], bool] | None = None,
    cache: bool = True,
    trainable_only: bool = False,
    names: tuple[str, ...] | None = None,
    arrays: bool = False,
) -> Any:
    """The one map: record `trees[0]`, match the others, call `f` per leaf, rebuild. With `arrays`
    (an operation that promises something about the arrays: the arithmetic, copy, loading) every
    tree's leaves go through the unknown-holder rule (``TreeDef.refuse_holders``) first."""
    track = trainable_only or style == _TRACK
    leaves, td = record_plain(trees[0]) if (is_leaf is None and not track) else record(trees[0], is_leaf, track=track)
    if arrays:
        td.refuse_holders(leaves)
    multi = len(trees) > 1
    if not cache:
        td = td.expanded()
    others: list[list[Any]] = []
    firsts = td.position_values(leaves) if multi else None
    fm = td._generated_match() if multi else None  # generated for a small container tree met before (_plans.py)
    for j, t in enumerate(trees[1:], start=1):
        o = fm(t, False) if fm is not None else _MISS
        if o is _MISS:
            o = td._match(t, j, names, firsts)
        if type(o) is int:  # a sub-tree shared in the first tree is not shared in this one: no sharing at all
            td = td.expanded()
            fm = None
            firsts = td.position_values(leaves)
            others = [_expect(td._match(u, k, names, firsts)) for k, u in enumerate(trees[1:j], start=1)]
            o = _expect(td._match(t, j, names, firsts))
        if arrays:
            td.refuse_holders(o, positions=True)  # type: ignore[arg-type]
        others.append(o)  # type: ignore[arg-type]
    per_leaf = not multi and cache  # f once per distinct leaf; otherwise once per position (or tuple of ids)
    first = leaves if per_leaf else td.position_values(leaves)
    paths: Callable[[], Sequence[KeyPath]] = (lambda: td.paths) if per_leaf else td.position_paths
    trainable = td._trainable_mask() if track else None  # (read only by the tracking maps below)
    if trainable is not None and not per_leaf:
        trainable = tuple(td.position_values(list(trainable)))
    if style == _TRACK:
        tr = trainable if trainable is not None else (True,) * len(first)
        lazy = list(map(_PathAt, repeat(td), range(len(first))))
        cols: list[Sequence[Any]] = [lazy, first, list(zip(*others)) if multi else [()] * len(first), tr]
        g = f
    else:
        g = f
        if trainable_only:
            inexact = is_inexact_array
            if trainable is None and style == _PATH:

                def g(path: KeyPath, x: Any, *rest: Any) -> Any:
                    return f(path, x, *rest) if inexact(x) else x

            elif trainable is None:

                def g(x: Any, *rest: Any) -> Any:
                    return f(x, *rest) if inexact(x) else x

            else:
                g = _masked(f, style == _PATH)
        cols = [first, *others]
        if style == _PATH:
            cols.insert(0, paths())
        if trainable_only and trainable is not None:
            cols.append(trainable)
    if multi and cache and td._ties() is not None:
        res = _call_memo(g, cols, first, paths, style)
    else:
        res = _call_all(g, cols, paths)
    if build == BUILD_NONE:
        return None
    if per_leaf:
        res = td.position_values(res)
    return td.build(res, build)


class _PathAt:
    """The path of a leaf position, computed only when shown (the arithmetic and loading name paths
    only in their messages; a million positions should not build a million KeyPaths)."""

    __slots__ = ("_p", "_td")

    def __init__(self, td: TreeDef, p: int) -> None:
        self._td = td
        self._p = p

    @property
    def path(self) -> KeyPath:
        return self._td.position_paths()[self._p]

    @property
    def display(self) -> str:
        return self.path.display

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return repr(self.path)


def _expect(matched: list[Any] | int) -> list[Any]:
    assert type(matched) is list  # an expanded definition has no shared sub-trees
    return matched


def _masked(f: Callable[..., Any], with_path: bool) -> Callable[..., Any]:
    """``f`` at parameters (the last argument says the leaf is trainable), identity elsewhere."""
    inexact = is_inexact_array
    if with_path:

        def g(path: KeyPath, x: Any, *rest: Any) -> Any:
            return f(path, x, *rest[:-1]) if rest[-1] and inexact(x) else x

        return g

    def h(x: Any, *rest: Any) -> Any:
        return f(x, *rest[:-1]) if rest[-1] and inexact(x) else x

    return h


def _call_memo(
    g: Callable[..., Any],
    cols: list[Sequence[Any]],
    first: Sequence[Any],
    paths: Callable[[], Sequence[KeyPath]],
    style: int,
) -> list[Any]:
    """Multi-tree with ties in the first tree: `g` once per tuple of identities at a position."""
    memo: dict[tuple[int, ...], Any] = {}
    scalars = SCALAR_TYPES
    out: list[Any] = []
    lead = 1 if style == _PATH else 0  # the leaf columns start after the paths
    try:
        for p, args in enumerate(zip(*cols)):
            if type(first[p]) in scalars:
                out.append(g(*args))
                continue
            key = (id(args[1]), *map(id, args[2])) if style == _TRACK else tuple(map(id, args[lead:]))
            r = memo.get(key, _MISS)
            if r is _MISS:
                r = memo[key] = g(*args)
            out.append(r)
    except (StructureError, PolicyError):
        raise
    except Exception as e:
        add_note(e, f"(functorkit: raised while visiting {paths()[len(out)].display})")
        raise
    return out


def walk(
    trees: tuple[Any, ...],
    visit: Callable[..., Any],
    *,
    build: int = BUILD_SAME,
    with_path: bool = False,
    track: bool = False,
    names: tuple[str, ...] | None = None,
) -> Any:
    """Lock-step map for the arithmetic and loading: ``visit(path, leaf, others, trainable)`` when
    `track`, else ``visit(path, leaf, *others)`` (`with_path`) or ``visit(leaf, *others)``."""
    style = _TRACK if track else (_PATH if with_path else _PLAIN)
    return _map(trees, visit, style=style, build=build, names=names, arrays=True)


# ---------------------------------------------------------------------------
# Public API


def _check_fn(f: Any, name: str) -> None:
    if not callable(f):
        msg = f"`f` must be callable, got {type(f).__name__}; call as fk.{name}(f, tree, ...)."
        raise TypeError(msg)


def _check_is_leaf(is_leaf: Any, name: str) -> None:
    if is_leaf is not None and not callable(is_leaf):
        msg = f"`is_leaf` must be a callable `x -> bool` or None, got {type(is_leaf).__name__} (fk.{name})."
        raise TypeError(msg)


def _check_flag(value: Any, arg: str, name: str) -> None:
    if type(value) is not bool:
        msg = f"`{arg}` must be True or False, got {type(value).__name__} ({value!r}) (fk.{name})."
        raise TypeError(msg)


def _check_options(f: Any, is_leaf: Any, trainable_only: Any, cache: Any, name: str) -> None:
    if (
        callable(f)
        and (is_leaf is None or callable(is_leaf))
        and type(trainable_only) is bool
        and type(cache) is bool
    ):
        return
    _check_fn(f, name)
    _check_is_leaf(is_leaf, name)
    _check_flag(trainable_only, "trainable_only", name)
    _check_flag(cache, "cache", name)


def fmap(
    f: Callable[..., Any],
    tree: Tree,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Tree:
    """Map `f` over the leaves of `tree` (and `trees`, in lock-step), keeping node types.

    Parameters
    ----------
    f
        Called as ``f(leaf, *other_leaves)`` at every leaf position; with
        `cache`, once per distinct leaf object (ties survive). Leaves that
        are not arrays (numbers, strings, None, other objects) are passed
        to `f` too.
    tree, *trees
        Trees of the same structure (node types, keys, lengths). Dicts are
        matched by key in `tree`'s order.
    is_leaf
        ``is_leaf(x) -> bool``, tested on `tree`: stop the walk at ``x`` and
        hand it (and the objects at the same place in `trees`) to `f` whole.
    trainable_only
        Apply `f` only to parameters (floating or complex arrays reached
        through trainable children); every other leaf is returned unchanged.
    cache
        Map an object met twice (same ``id``) once and place the result at
        both positions; shared sub-trees are rebuilt once. Python scalars,
        strings, bytes and None are never cached. With ``cache=False``
        every position is mapped and rebuilt on its own.

    Returns
    -------
    tree : Any
        A new tree of `tree`'s node types. Inputs are never mutated.

    Raises
    ------
    StructureError
        If the trees differ in structure (the message names the first path
        that differs and both sides) or a tree contains a cycle.
    TypeError
        If `f` or `is_leaf` is not callable. An exception raised by `f`
        propagates with a note naming the path of the leaf.

    Examples
    --------
    >>> import functorkit as fk
    >>> fk.fmap(lambda x: x * 10, {"a": 1, "b": (2, 3)})
    {'a': 10, 'b': (20, 30)}
    >>> fk.fmap(lambda x, y: x + y, [1, 2], [10, 20])
    [11, 22]
    """
    _check_options(f, is_leaf, trainable_only, cache, "fmap")
    if not trees and cache and not trainable_only:  # the common case, without _map's branches
        leaves, td = record(tree, is_leaf, track=False) if is_leaf is not None else record_plain(tree)
        return cast(Tree, td.build(td.position_values(_call_all(f, (leaves,), lambda: td.paths)), BUILD_SAME))
    return cast(Tree, _map((tree, *trees), f, is_leaf=is_leaf, cache=cache, trainable_only=trainable_only))


def fmapstructure(
    f: Callable[..., Any],
    tree: Any,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Any:
    """Like `fmap`, but the result is made of plain dicts, tuples and lists.

    Nodes with named children (dict, dataclass, namedtuple, ``nn.Module``,
    mapping nodes) become ``dict``; tuples stay ``tuple``; other sequences
    become ``list``; static/aux data is dropped.

    Examples
    --------
    >>> import collections
    >>> import functorkit as fk
    >>> Point = collections.namedtuple("Point", "x y")
    >>> fk.fmapstructure(lambda v: v * 2, [Point(1, 2), (3,)])
    [{'x': 2, 'y': 4}, (6,)]
    """
    _check_options(f, is_leaf, trainable_only, cache, "fmapstructure")
    return _map(
        (tree, *trees), f, build=BUILD_STRUCTURE, is_leaf=is_leaf, cache=cache, trainable_only=trainable_only
    )


def fmap_with_path(
    f: Callable[..., Any],
    tree: Any,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Any:
    """Like `fmap`, with ``f(path, leaf, *other_leaves)``; `path` is a `KeyPath`.

    With `cache`, a shared leaf is mapped once, at its first path.

    Examples
    --------
    >>> import functorkit as fk
    >>> fk.fmap_with_path(lambda p, x: f"{p}={x}", {"layers": [1, 2]})
    {'layers': ['layers[0]=1', 'layers[1]=2']}
    """
    _check_options(f, is_leaf, trainable_only, cache, "fmap_with_path")
    return _map((tree, *trees), f, style=_PATH, is_leaf=is_leaf, cache=cache, trainable_only=trainable_only)


def leaves(tree: Any, /, *, is_leaf: Callable[[Any], bool] | None = None) -> list[Any]:
    """The leaves of `tree` in walk order: each identity-cached leaf once, scalars at every position.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones(2)
    >>> [type(x).__name__ for x in fk.leaves({"a": w, "b": w, "n": 3, "m": 3})]
    ['ndarray', 'int', 'int']
    """
    _check_is_leaf(is_leaf, "leaves")
    if is_leaf is not None:
        return record(tree, is_leaf, track=False)[0]
    found = leaves_unrecorded(tree)  # a large container tree: listed without recording its structure
    return found if found is not None else record_plain(tree)[0]


def leaves_with_path(tree: Any, /, *, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[KeyPath, Any]]:
    """``[(path, leaf), ...]`` like `leaves`; a shared leaf appears once, at its first path.

    Examples
    --------
    >>> import functorkit as fk
    >>> [(str(p), x) for p, x in fk.leaves_with_path({"w": [1.0, 2.0]})]
    [('w[0]', 1.0), ('w[1]', 2.0)]
    """
    _check_is_leaf(is_leaf, "leaves_with_path")
    found, td = record(tree, is_leaf, track=False)
    return list(zip(td.paths, found))


def treedef_of(tree: Any) -> TreeDef:
    """The `TreeDef` of `tree` (its leaves dropped)."""
    return record(tree)[1]
