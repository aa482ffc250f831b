"""The one walk: fmap, fmapstructure, fmap_with_path, leaves.

Everything that visits a tree goes through :func:`walk`, an explicit-stack
loop (so depth is bounded by memory, not by the interpreter's recursion
limit). Leaves are handled inline in the loop over a node's children; only
nodes push a frame. Paths are built only when asked for (``with_path``) or
when an error needs one (then they are read back off the stack).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath
from ._registry import _DISPATCH, DICT, GENERIC, LIST, SCALAR, SCALAR_TYPES, TUPLE, NodeDef, resolve
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

BUILD_NONE, BUILD_SAME, BUILD_STRUCTURE = 0, 1, 2
_MISS = object()

# frame slots (a frame is a list: cheaper than an object in the hot loop)
_NODES, _ND, _KEYS, _VALS, _AUX, _RES, _I, _PATH, _TRAIN, _TSET, _CKEY, _NAMED, _KEY = range(13)


def _describe(x: Any, nd: Any) -> str:
    if nd is None or nd is SCALAR:
        return f"leaf ({type(x).__name__})"
    keys, values, _, named = nd.flatten(x)
    name = type(x).__name__
    if named:
        return f"{name} keys {{{', '.join(repr(k) for k in keys)}}}"
    return f"{name} of length {len(values)}"


def _path_from_stack(stack: list[list[Any]], fr: list[Any] | None, i: int | None) -> KeyPath:
    keys = [f[_KEY] for f in stack[2:]]
    if fr is not None and i is not None and stack and fr is not stack[0]:
        keys.append(fr[_KEYS][i])
    return KeyPath(keys)


def _mismatch(path: KeyPath, left: str, right: str, which: int) -> StructureError:
    lhead, sep, _ = left.partition(" keys ")
    if sep and right.startswith(lhead + sep):
        right = right[len(lhead + sep) :]  # "dict keys {...} vs {...}"
    msg = (
        f"at {path.display}: {left} vs {right}\n"
        "Every tree must have the structure of the first one (node types, keys, "
        f"lengths); `trees[{which - 1}]` differs here. Fix that tree, or pass "
        "`is_leaf` to stop the walk above this point."
    )
    return StructureError(msg)


def _cycle(path: KeyPath, obj: Any) -> StructureError:
    msg = (
        f"at {path.display}: found a cycle: this {type(obj).__name__} contains "
        "itself. Expected a tree (or a DAG with shared sub-trees); break the "
        "cycle, or mark the back-reference with `is_leaf`."
    )
    return StructureError(msg)


def walk(
    trees: tuple[Any, ...],
    visit: Callable[..., Any],
    *,
    build: int = BUILD_SAME,
    is_leaf: Callable[[Any], bool] | None = None,
    cache: bool = True,
    share_nodes: bool = True,
    with_path: bool = False,
    track: bool = False,
) -> Any:
    """Walk `trees` in lock-step and rebuild the first one's structure.

    `visit` is called once per leaf position (once per distinct leaf object
    when `cache`): ``visit(path, leaf, others, trainable)`` when `track`,
    else ``visit(path, leaf, *others)`` when `with_path`, else
    ``visit(leaf, *others)``. With `share_nodes` (and `cache`), a node object
    met twice is rebuilt once.
    """
    ntrees = len(trees)
    multi = ntrees > 1
    leaf_cache: dict[Any, Any] | None = {} if cache else None
    node_cache: dict[Any, Any] | None = {} if (cache and share_nodes) else None
    keep: list[Any] = []  # keeps temporaries from custom `children` alive (ids stay unique)
    active: set[int] = set()  # ids of the first tree's nodes on the stack (cycle check)
    disp = _DISPATCH
    root_path = KeyPath(()) if with_path else None
    stack: list[list[Any]] = [
        [trees, None, [None], [[t] for t in trees], None, [], 0, None, True, None, None, False, None]
    ]
    fr = stack[0]
    i = 0
    try:
        while True:
            fr = stack[-1]
            vals = fr[_VALS]
            v0 = vals[0]
            res = fr[_RES]
            i = fr[_I]
            n = len(v0)
            pushed = False
            while i < n:
                c = v0[i]
                forced = is_leaf is not None and is_leaf(c)
                if forced:
                    nd = SCALAR if type(c) in SCALAR_TYPES else None
                else:
                    nd = disp.get(type(c), _MISS)
                    if nd is _MISS:
                        nd = resolve(type(c))
                if nd is None or nd is SCALAR:
                    # ---- a leaf
                    if multi:
                        others = [v[i] for v in vals[1:]]
                        if not forced:
                            for j, o in enumerate(others):
                                ond = disp.get(type(o), _MISS)
                                if ond is _MISS:
                                    ond = resolve(type(o))
                                if isinstance(ond, NodeDef):
                                    raise _mismatch(
                                        _path_from_stack(stack, fr, i),
                                        _describe(c, nd),
                                        _describe(o, ond),
                                        j + 1,
                                    )
                    else:
                        others = ()
                    if with_path:
                        path = root_path if fr is stack[0] else KeyPath((*fr[_PATH], fr[_KEYS][i]))
                    else:
                        path = None
                    if nd is None and leaf_cache is not None:
                        ck = id(c) if not multi else (id(c), *map(id, others))
                        r = leaf_cache.get(ck, _MISS)
                        if r is _MISS:
                            if track:
                                tset = fr[_TSET]
                                r = visit(path, c, others, fr[_TRAIN] and (tset is None or fr[_KEYS][i] in tset))
                            elif with_path:
                                r = visit(path, c, *others)
                            elif multi:
                                r = visit(c, *others)
                            else:
                                r = visit(c)
                            leaf_cache[ck] = r
                    elif track:
                        tset = fr[_TSET]
                        r = visit(path, c, others, fr[_TRAIN] and (tset is None or fr[_KEYS][i] in tset))
                    elif with_path:
                        r = visit(path, c, *others)
                    elif multi:
                        r = visit(c, *others)
                    else:
                        r = visit(c)
                    res.append(r)
                    i += 1
                    continue
                # ---- a node
                if multi:
                    others = [v[i] for v in vals[1:]]
                    ck = (id(c), *map(id, others))
                else:
                    ck = id(c)
                if node_cache is not None:
                    r = node_cache.get(ck, _MISS)
                    if r is not _MISS:
                        res.append(r)
                        i += 1
                        continue
                if id(c) in active:
                    raise _cycle(_path_from_stack(stack, fr, i), c)
                keys, cvals, aux, named = nd.flatten(c)
                allvals = [cvals]
                if multi:
                    for j, o in enumerate(others):
                        if type(o) is not type(c):
                            ond = disp.get(type(o), _MISS)
                            if ond is _MISS:
                                ond = resolve(type(o))
                            raise _mismatch(
                                _path_from_stack(stack, fr, i), _describe(c, nd), _describe(o, ond), j + 1
                            )
                        okeys, ovals, _, _ = nd.flatten(o)
                        if okeys != keys:
                            if named and len(okeys) == len(keys) and set(okeys) == set(keys):
                                lookup = dict(zip(okeys, ovals))
                                ovals = [lookup[k] for k in keys]
                            else:
                                raise _mismatch(
                                    _path_from_stack(stack, fr, i), _describe(c, nd), _describe(o, nd), j + 1
                                )
                        allvals.append(ovals)
                if nd.fast == GENERIC:
                    keep.append(allvals)
                key = fr[_KEYS][i]
                if with_path:
                    cpath = root_path if fr is stack[0] else KeyPath((*fr[_PATH], key))
                else:
                    cpath = None
                if track:
                    tset = fr[_TSET]
                    ctrain = fr[_TRAIN] and (tset is None or key in tset)
                    ctset = nd.trainable(c) if (ctrain and nd.trainable is not None) else None
                else:
                    ctrain, ctset = True, None
                fr[_I] = i + 1
                active.add(id(c))
                stack.append(
                    [(c, *others) if multi else (c,), nd, keys, allvals, aux, [], 0, cpath, ctrain, ctset, ck, named, key]
                )
                pushed = True
                break
            if pushed:
                continue
            # ---- all children done: rebuild this node
            stack.pop()
            if not stack:
                return res[0]
            nd = fr[_ND]
            if build == BUILD_SAME:
                out = nd.unflatten(fr[_AUX], fr[_KEYS], res)
            elif build == BUILD_STRUCTURE:
                if fr[_NAMED]:
                    out = dict(zip(fr[_KEYS], res))
                elif nd.fast == TUPLE:
                    out = tuple(res)
                else:
                    out = res
            else:
                out = None
            active.discard(id(fr[_NODES][0]))
            if node_cache is not None:
                node_cache[fr[_CKEY]] = out
            stack[-1][_RES].append(out)
    except Exception as e:
        if not isinstance(e, StructureError) and stack:
            where = _path_from_stack(stack, fr, i if fr is stack[-1] else None)
            e.add_note(f"(functorkit: raised while visiting {where.display})")
        raise


# ---------------------------------------------------------------------------
# Fast path: flatten -> map -> rebuild, for the plain cases (no is_leaf, no
# paths, no trainable tracking, no shared or cyclic nodes). Leaf runs are
# moved with C-level list operations; anything unusual returns _ABORT and the
# caller falls back to `walk`, which also produces the error messages.

_ABORT = object()
_LEAF1, _NODE_LEAVES, _NODE = 0, 1, 2


def _flatten_fast(root: Any) -> Any:
    """``(flat_leaves, prog)`` in walk order, or _ABORT if a node repeats."""
    disp = _DISPATCH
    nd = disp.get(type(root), _MISS)
    if nd is _MISS:
        nd = resolve(type(root))
    if not isinstance(nd, NodeDef):
        return [root], [(_LEAF1, None, None, None, 1, False)]
    flat: list[Any] = []
    prog: list[tuple[Any, ...]] = []
    seen: set[int] = {id(root)}
    keys, vals, aux, named = nd.flatten(root)
    stack: list[list[Any]] = [[nd, aux, keys, vals, -1, named]]
    while stack:
        fr = stack[-1]
        nd, aux, keys, vals, i, named = fr
        if i < 0:
            # first visit: a node whose children are all leaves moves in one go
            for t in set(map(type, vals)):
                e = disp.get(t, _MISS)
                if e is _MISS:
                    e = resolve(t)
                if isinstance(e, NodeDef):
                    break
            else:
                flat.extend(vals)
                prog.append((_NODE_LEAVES, nd, aux, keys, len(vals), named))
                stack.pop()
                continue
            i = 0
        n = len(vals)
        while i < n:
            c = vals[i]
            i += 1
            cnd = disp.get(type(c), _MISS)
            if cnd is _MISS:
                cnd = resolve(type(c))
            if isinstance(cnd, NodeDef):
                if id(c) in seen:
                    return _ABORT
                seen.add(id(c))
                fr[4] = i
                ckeys, cvals, caux, cnamed = cnd.flatten(c)
                stack.append([cnd, caux, ckeys, cvals, -1, cnamed])
                break
            flat.append(c)
            prog.append((_LEAF1, None, None, None, 1, False))
        else:
            prog.append((_NODE, nd, aux, keys, n, named))
            stack.pop()
    return flat, prog


def _rebuild_fast(prog: list[tuple[Any, ...]], res: list[Any], build: int) -> Any:
    vs: list[Any] = []
    pos = 0
    for code, nd, aux, keys, n, named in prog:
        if code == _LEAF1:
            vs.append(res[pos])
            pos += 1
            continue
        if code == _NODE_LEAVES:
            vals = res[pos : pos + n]
            pos += n
        elif n:
            vals = vs[-n:]
            del vs[-n:]
        else:
            vals = []
        if build == BUILD_SAME:
            fast = nd.fast
            if fast == DICT:
                vs.append(dict(zip(keys, vals)))
            elif fast == LIST:
                vs.append(vals)
            elif fast == TUPLE:
                vs.append(tuple(vals))
            else:
                vs.append(nd.unflatten(aux, keys, vals))
        elif named:
            vs.append(dict(zip(keys, vals)))
        elif nd.fast == TUPLE:
            vs.append(tuple(vals))
        else:
            vs.append(vals)
    return vs[0]


def _nth_leaf_path(trees: tuple[Any, ...], k: int) -> KeyPath:
    paths: list[KeyPath] = []
    walk(trees[:1], lambda p, x: paths.append(p), build=BUILD_NONE, cache=False, share_nodes=False, with_path=True)
    return paths[k]


def _note_failure(e: BaseException, trees: tuple[Any, ...], k: int) -> None:
    e.add_note(f"(functorkit: raised while visiting {_nth_leaf_path(trees, k).display})")


def _map_leaves(f: Callable[..., Any], flats: list[list[Any]], cache: bool, trees: tuple[Any, ...]) -> list[Any]:
    """Apply `f` over the flat leaves (once per distinct object when `cache`)."""
    res: list[Any] = []
    first = flats[0]
    # distinct objects in the first tree make every position's identity tuple distinct
    if cache and len(set(map(id, first))) != len(first):
        ids = list(map(id, first)) if len(flats) == 1 else list(zip(*(map(id, fl) for fl in flats)))
        if len(set(ids)) != len(ids):
            memo: dict[Any, Any] = {}
            scalars = SCALAR_TYPES
            others = flats[1:]
            k = 0
            try:
                for k, x in enumerate(first):  # noqa: B007 - k is read by the handler
                    if type(x) in scalars:
                        r = f(x, *(fl[k] for fl in others))
                    else:
                        r = memo.get(ids[k], _MISS)
                        if r is _MISS:
                            r = memo[ids[k]] = f(x, *(fl[k] for fl in others))
                    res.append(r)
            except Exception as e:
                _note_failure(e, trees, k)
                raise
            return res
    try:
        res.extend(map(f, *flats))
    except Exception as e:
        _note_failure(e, trees, len(res))
        raise
    return res


def _fast_walk(f: Callable[..., Any], trees: tuple[Any, ...], build: int, cache: bool) -> Any:
    flat_prog = _flatten_fast(trees[0])
    if flat_prog is _ABORT:
        return _ABORT
    flat, prog = flat_prog
    flats = [flat]
    if len(trees) > 1:
        sig = [(c, nd, k, n) for c, nd, _, k, n, _ in prog]
        for t in trees[1:]:
            other = _flatten_fast(t)
            if other is _ABORT or [(c, nd, k, n) for c, nd, _, k, n, _ in other[1]] != sig:
                return _ABORT
            flats.append(other[0])
    res = _map_leaves(f, flats, cache, trees)
    if build == BUILD_NONE:
        return res
    return _rebuild_fast(prog, res, build)


def _check_fn(f: Any, name: str) -> None:
    if not callable(f):
        msg = f"`f` must be callable, got {type(f).__name__}; call as fk.{name}(f, tree, ...)."
        raise TypeError(msg)


def _check_is_leaf(is_leaf: Any, name: str) -> None:
    if is_leaf is not None and not callable(is_leaf):
        msg = f"`is_leaf` must be a callable `x -> bool` or None, got {type(is_leaf).__name__} (fk.{name})."
        raise TypeError(msg)


def _trainable_visit(f: Callable[..., Any], with_path: bool) -> Callable[..., Any]:
    def visit(path: Any, leaf: Any, others: Any, trainable: bool) -> Any:
        if trainable and is_inexact_array(leaf):
            return f(path, leaf, *others) if with_path else f(leaf, *others)
        return leaf

    return visit


def fmap(
    f: Callable[..., Any],
    tree: Any,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Any:
    """Map `f` over the leaves of `tree` (and `trees`, in lock-step), keeping node types.

    Parameters
    ----------
    f
        Called as ``f(leaf, *other_leaves)`` at every leaf position; with
        `cache`, once per distinct leaf object (ties survive).
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
        strings, bytes and None are never cached.

    Returns
    -------
    A new tree of `tree`'s node types. Inputs are never mutated.

    Raises
    ------
    StructureError
        If the trees differ in structure (the message names the first path
        that differs and both sides) or a tree contains a cycle.

    Examples
    --------
    >>> import functorkit as fk
    >>> fk.fmap(lambda x: x * 10, {"a": 1, "b": (2, 3)})
    {'a': 10, 'b': (20, 30)}
    >>> fk.fmap(lambda x, y: x + y, [1, 2], [10, 20])
    [11, 22]
    """
    _check_fn(f, "fmap")
    _check_is_leaf(is_leaf, "fmap")
    trees = (tree, *trees)
    if trainable_only:
        return walk(trees, _trainable_visit(f, False), is_leaf=is_leaf, cache=cache, track=True)
    if is_leaf is None:
        out = _fast_walk(f, trees, BUILD_SAME, cache)
        if out is not _ABORT:
            return out
    return walk(trees, f, is_leaf=is_leaf, cache=cache)


def fmapstructure(
    f: Callable[..., Any],
    tree: Any,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Any:
    """Like :func:`fmap`, but the result is made of plain dicts, tuples and lists.

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
    _check_fn(f, "fmapstructure")
    _check_is_leaf(is_leaf, "fmapstructure")
    trees = (tree, *trees)
    if trainable_only:
        return walk(
            trees, _trainable_visit(f, False), build=BUILD_STRUCTURE, is_leaf=is_leaf, cache=cache, track=True
        )
    if is_leaf is None:
        out = _fast_walk(f, trees, BUILD_STRUCTURE, cache)
        if out is not _ABORT:
            return out
    return walk(trees, f, build=BUILD_STRUCTURE, is_leaf=is_leaf, cache=cache)


def fmap_with_path(
    f: Callable[..., Any],
    tree: Any,
    /,
    *trees: Any,
    is_leaf: Callable[[Any], bool] | None = None,
    trainable_only: bool = False,
    cache: bool = True,
) -> Any:
    """Like :func:`fmap`, with ``f(path, leaf, *other_leaves)``; `path` is a :class:`KeyPath`.

    With `cache`, a shared leaf is mapped once, at its first path.

    Examples
    --------
    >>> import functorkit as fk
    >>> fk.fmap_with_path(lambda p, x: f"{p}={x}", {"layers": [1, 2]})
    {'layers': ['layers[0]=1', 'layers[1]=2']}
    """
    _check_fn(f, "fmap_with_path")
    _check_is_leaf(is_leaf, "fmap_with_path")
    trees = (tree, *trees)
    if trainable_only:
        return walk(trees, _trainable_visit(f, True), is_leaf=is_leaf, cache=cache, with_path=True, track=True)
    return walk(trees, f, is_leaf=is_leaf, cache=cache, with_path=True)


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
    if is_leaf is None:
        flat_prog = _flatten_fast(tree)
        if flat_prog is not _ABORT:
            flat = flat_prog[0]
            if len(set(map(id, flat))) == len(flat):
                return flat
            seen: set[int] = set()
            distinct = []
            for x in flat:
                if type(x) in SCALAR_TYPES:
                    distinct.append(x)
                elif id(x) not in seen:
                    seen.add(id(x))
                    distinct.append(x)
            return distinct
    out: list[Any] = []
    walk((tree,), out.append, build=BUILD_NONE, is_leaf=is_leaf, share_nodes=False)
    return out


def leaves_with_path(tree: Any, /, *, is_leaf: Callable[[Any], bool] | None = None) -> list[tuple[KeyPath, Any]]:
    """``[(path, leaf), ...]`` like :func:`leaves`; a shared leaf appears once, at its first path.

    Examples
    --------
    >>> import functorkit as fk
    >>> [(str(p), x) for p, x in fk.leaves_with_path({"w": [1.0, 2.0]})]
    [('w[0]', 1.0), ('w[1]', 2.0)]
    """
    _check_is_leaf(is_leaf, "leaves_with_path")
    out: list[tuple[KeyPath, Any]] = []

    def visit(path: KeyPath, leaf: Any) -> None:
        out.append((path, leaf))

    walk((tree,), visit, build=BUILD_NONE, is_leaf=is_leaf, share_nodes=False, with_path=True)
    return out
