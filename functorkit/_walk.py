"""The walk: fmap, fmapstructure, fmap_with_path, leaves, leaves_with_path.

Two engines, one semantics:

- :func:`walk`, the general engine: an explicit-stack loop (depth is bounded
  by memory, not by the interpreter's recursion limit) that handles every
  option: several trees in lock-step, ``is_leaf``, paths, trainable
  tracking, identity caching of leaves and of shared sub-trees, cycle
  detection, and every error message.
- The fast engine (:func:`_flatten`, :func:`_map_leaves`, :func:`_rebuild`):
  flatten each tree into a flat list of leaves plus a post-order rebuild
  program, map ``f`` over the flat lists with C-level loops, and rebuild.
  ``fmap``, ``fmapstructure`` and ``leaves`` use it when there is no
  ``is_leaf``, no paths and no trainable tracking. It gives up (returns
  ``_ABORT``, before ``f`` is called) on anything unusual: a node object met
  twice (a shared sub-tree or a cycle), a structure mismatch between trees,
  or an exception while flattening; :func:`walk` then does the whole job and
  produces the error message. Both engines call ``f`` at the same leaves, in
  the same order, the same number of times, and build the same output.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath, make_path
from ._registry import _DISPATCH, DICT, KNOWN_TYPES, LEAF_TYPES, LIST, SCALAR, SCALAR_TYPES, TUPLE, NodeDef, resolve
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
_ROOT = make_path(())
_REBUILDING = object()
_NO_OTHERS: Any = ()

# frame slots (a frame is a list: cheaper than an object in the hot loop)
_NODES, _ND, _KEYS, _VALS, _AUX, _RES, _I, _PATH, _TRAIN, _TSET, _CKEY, _NAMED, _KEY = range(13)


def add_note(e: BaseException, note: str) -> None:
    """``e.add_note(note)``, also on Python 3.10 (where notes are stored but not printed)."""
    adder = getattr(e, "add_note", None)
    if adder is not None:
        adder(note)
    else:  # pragma: no cover - Python 3.10
        notes = getattr(e, "__notes__", None)
        if notes is None:
            notes = []
            try:
                e.__notes__ = notes
            except AttributeError:
                return
        notes.append(note)


def _visiting_note(path: KeyPath) -> str:
    return f"(functorkit: raised while visiting {path.display})"


def _describe(x: Any, nd: Any) -> str:
    if not isinstance(nd, NodeDef):
        return f"leaf ({type(x).__name__})"
    keys, values, _, named = nd.flatten(x)
    name = type(x).__name__
    if named:
        return f"{name} keys {{{', '.join(repr(k) for k in keys)}}}"
    return f"{name} of length {len(values)}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _mismatch(
    path: KeyPath, left: str, right: str, which: int, names: tuple[str, ...] | None = None
) -> StructureError:
    lhead, sep, _ = left.partition(" keys ")
    if sep and right.startswith(lhead + sep):
        right = right[len(lhead + sep) :]  # "dict keys {...} vs {...}"
    if names is not None:
        differs = f"`{names[which]}` differs from `{names[0]}` here"
    else:
        differs = f"the {_ordinal(which + 1)} tree differs from the first here"
    msg = (
        f"at {path.display}: {left} vs {right}\n"
        "Every tree must have the structure of the first one (node types, keys, "
        f"lengths); {differs}. Fix that tree, or pass `is_leaf` to stop the walk "
        "above this point."
    )
    return StructureError(msg)


def _cycle(path: KeyPath, obj: Any) -> StructureError:
    msg = (
        f"at {path.display}: found a cycle: this {type(obj).__name__} is one of its own "
        "ancestors. Expected a tree (or a DAG with shared sub-trees); break the cycle, "
        "or stop the walk at the back-reference with `is_leaf`."
    )
    return StructureError(msg)


def _node_path(stack: list[list[Any]]) -> tuple[Any, ...]:
    """The path of the node of the top frame (frames 0 and 1 are the roots)."""
    return tuple([f[_KEY] for f in stack[2:]])


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
    names: tuple[str, ...] | None = None,
) -> Any:
    """Walk `trees` in lock-step and rebuild the first one's structure.

    `names` (one per tree) lets structure-mismatch messages name the caller's
    arguments (``dst``/``src``) instead of "the 2nd tree".

    `visit` is called once per leaf position (once per distinct leaf object
    when `cache`): ``visit(path, leaf, others, trainable)`` when `track`,
    else ``visit(path, leaf, *others)`` when `with_path`, else
    ``visit(leaf, *others)``. With `share_nodes` (and `cache`), a node object
    met twice is rebuilt once. `build` is BUILD_SAME (the first tree's node
    types), BUILD_STRUCTURE (plain dict/tuple/list) or BUILD_NONE (returns
    None). With `track`, the cache key also holds the trainable flag: an
    object reached once through trainable children and once through
    non-trainable ones is visited once each way.
    """
    multi = len(trees) > 1
    leaf_cache: dict[Any, Any] | None = {} if cache else None
    node_cache: dict[Any, Any] | None = {} if (cache and share_nodes) else None
    keep: list[Any] = []  # keeps temporaries from custom `children` alive (ids stay unique)
    active: set[int] = set()  # ids of the first tree's nodes on the stack (cycle check)
    disp = _DISPATCH
    root: list[Any] = [trees, None, [None], [[t] for t in trees], None, [], 0, (), True, None, None, False, None]
    stack: list[list[Any]] = [root]
    fr = root
    i = 0
    rebuilding = False
    # a node whose children are all leaves is handled without a frame; while its
    # leaves are visited `inline` is the list of their results, while it is rebuilt
    # `inline` is _REBUILDING
    inline: Any = None
    tnew = tuple.__new__
    leaf_types = LEAF_TYPES
    scalar_types = SCALAR_TYPES
    own: BaseException | None = None  # an error this walk raised itself (no note)
    try:
        while True:
            fr = stack[-1]
            vals = fr[_VALS]
            v0 = vals[0]
            keys = fr[_KEYS]
            res = fr[_RES]
            i = fr[_I]
            n = len(v0)
            pushed = False
            while i < n:
                c = v0[i]
                nd: Any
                if is_leaf is not None and is_leaf(c):
                    forced = True
                    nd = SCALAR if type(c) in SCALAR_TYPES else None
                else:
                    forced = False
                    nd = disp.get(type(c), _MISS)
                    if nd is _MISS:
                        nd = resolve(type(c))
                if track:
                    tset = fr[_TSET]
                    tr = fr[_TRAIN] and (tset is None or keys[i] in tset)
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
                                    p = () if fr is root else (*_node_path(stack), keys[i])
                                    own = _mismatch(make_path(p), _describe(c, nd), _describe(o, ond), j + 1, names)
                                    raise own
                    else:
                        others = _NO_OTHERS
                    if nd is None and leaf_cache is not None:
                        ck: Any = (id(c), *map(id, others)) if multi else id(c)
                        if track:
                            ck = (ck, tr)
                        r = leaf_cache.get(ck, _MISS)
                        if r is not _MISS:
                            res.append(r)
                            i += 1
                            continue
                    if with_path:  # built only when `visit` needs it
                        if fr is root:
                            path = _ROOT
                        else:
                            pp = fr[_PATH]
                            if pp is None:
                                pp = fr[_PATH] = _node_path(stack)
                            path = tnew(KeyPath, (*pp, keys[i]))
                    else:
                        path = None
                    if track:
                        r = visit(path, c, others, tr)
                    elif with_path:
                        r = visit(path, c, *others)
                    elif multi:
                        r = visit(c, *others)
                    else:
                        r = visit(c)
                    if nd is None and leaf_cache is not None:
                        leaf_cache[ck] = r
                    res.append(r)
                    i += 1
                    continue
                # ---- a node
                if multi:
                    others = [v[i] for v in vals[1:]]
                    ck = (id(c), *map(id, others))
                else:
                    ck = id(c)
                if track:
                    ck = (ck, tr)
                if node_cache is not None:
                    r = node_cache.get(ck, _MISS)
                    if r is not _MISS:
                        res.append(r)
                        i += 1
                        continue
                if id(c) in active:
                    own = _cycle(make_path(() if fr is root else (*_node_path(stack), keys[i])), c)
                    raise own
                ckeys, cvals, aux, named = nd.flatten(c)
                allvals = [cvals]
                if multi:
                    for j, o in enumerate(others):
                        if type(o) is not type(c):
                            ond = disp.get(type(o), _MISS)
                            if ond is _MISS:
                                ond = resolve(type(o))
                            p = () if fr is root else (*_node_path(stack), keys[i])
                            own = _mismatch(make_path(p), _describe(c, nd), _describe(o, ond), j + 1, names)
                            raise own
                        okeys, ovals, _, onamed = nd.flatten(o)
                        if okeys != ckeys or onamed != named:
                            if named and onamed and len(okeys) == len(ckeys) and set(okeys) == set(ckeys):
                                lookup = dict(zip(okeys, ovals, strict=True))
                                ovals = [lookup[k] for k in ckeys]
                            else:
                                p = () if fr is root else (*_node_path(stack), keys[i])
                                own = _mismatch(make_path(p), _describe(c, nd), _describe(o, nd), j + 1, names)
                                raise own
                        allvals.append(ovals)
                if not nd.owns:
                    keep.append(allvals)
                if track:
                    ctrain = tr
                    ctset = nd.trainable(c) if (tr and nd.trainable is not None) else None
                else:
                    ctrain, ctset = True, None
                if is_leaf is None and all(leaf_types.issuperset(map(type, v)) for v in allvals):
                    # ---- a node whose children are all leaves (in every tree): no frame
                    cres: list[Any] = []
                    inline = cres
                    if with_path:
                        cpp = () if fr is root else (*_node_path(stack), keys[i])
                        paths = [tnew(KeyPath, (*cpp, k)) for k in ckeys]
                    if not multi and not track:
                        if leaf_cache is None:
                            cres.extend(map(visit, paths, cvals) if with_path else map(visit, cvals))
                        else:
                            for x in cvals:
                                if type(x) in scalar_types:
                                    r = visit(paths[len(cres)], x) if with_path else visit(x)
                                else:
                                    r = leaf_cache.get(id(x), _MISS)
                                    if r is _MISS:
                                        r = leaf_cache[id(x)] = visit(paths[len(cres)], x) if with_path else visit(x)
                                cres.append(r)
                    else:
                        xo: Any = ()
                        path = None
                        for j, x in enumerate(cvals):
                            if multi:
                                xo = [v[j] for v in allvals[1:]]
                            if track:
                                xtr = ctrain and (ctset is None or ckeys[j] in ctset)
                            if with_path:
                                path = paths[j]
                            if leaf_cache is not None and type(x) not in scalar_types:
                                lk: Any = (id(x), *map(id, xo)) if multi else id(x)
                                if track:
                                    lk = (lk, xtr)
                                r = leaf_cache.get(lk, _MISS)
                                if r is not _MISS:
                                    cres.append(r)
                                    continue
                            if track:
                                r = visit(path, x, xo, xtr)
                            elif with_path:
                                r = visit(path, x, *xo)
                            else:
                                r = visit(x, *xo)
                            if leaf_cache is not None and type(x) not in scalar_types:
                                leaf_cache[lk] = r
                            cres.append(r)
                    inline = _REBUILDING
                    if build == BUILD_SAME:
                        out = nd.unflatten(aux, ckeys, cres)
                    elif build == BUILD_STRUCTURE:
                        if named:
                            out = dict(zip(ckeys, cres, strict=True))
                        elif nd.fast == TUPLE:
                            out = tuple(cres)
                        else:
                            out = cres
                    else:
                        out = None
                    inline = None
                    if node_cache is not None:
                        node_cache[ck] = out
                    res.append(out)
                    i += 1
                    continue
                fr[_I] = i + 1
                active.add(id(c))
                stack.append(
                    [
                        (c, *others) if multi else (c,),
                        nd,
                        ckeys,
                        allvals,
                        aux,
                        [],
                        0,
                        None,
                        ctrain,
                        ctset,
                        ck,
                        named,
                        None if fr is root else keys[i],
                    ]
                )
                pushed = True
                break
            if pushed:
                continue
            # ---- all children done: rebuild this node
            if fr is root:
                return res[0]
            rebuilding = True
            nd = fr[_ND]
            if build == BUILD_SAME:
                out = nd.unflatten(fr[_AUX], fr[_KEYS], res)
            elif build == BUILD_STRUCTURE:
                if fr[_NAMED]:
                    out = dict(zip(fr[_KEYS], res, strict=True))
                elif nd.fast == TUPLE:
                    out = tuple(res)
                else:
                    out = res
            else:
                out = None
            rebuilding = False
            stack.pop()
            active.discard(id(fr[_NODES][0]))
            if node_cache is not None:
                node_cache[fr[_CKEY]] = out
            stack[-1][_RES].append(out)
    except Exception as e:
        if e is not own:
            where = _node_path(stack) if rebuilding or fr is root else (*_node_path(stack), fr[_KEYS][i])
            if inline is _REBUILDING:  # rebuilding a node handled without a frame
                where = () if fr is root else where
            elif inline is not None:  # visiting a leaf of such a node: `inline` holds the results so far
                where = (*(() if fr is root else where), ckeys[len(inline)])
            add_note(e, _visiting_note(make_path(where)))
        raise


# ---------------------------------------------------------------------------
# The fast engine: flatten -> map -> rebuild.
#
# A flattened tree is ``flat`` (its leaves in walk order, one entry per
# position) and ``prog``, its nodes in post-order: ``None`` for a leaf met in
# a node that also has node children, and ``(nodedef, keys, n, leafy,
# named)`` for a node of ``n`` children (``leafy``: all of them are leaves,
# taken from ``flat`` in one slice). ``prog`` holds no aux data, so two
# trees have the same structure exactly when their ``prog`` lists are equal
# (one C-level comparison); the aux data of the custom nodes is kept apart,
# in post-order, in ``auxs``.

_ABORT = object()
_NOAUX = object()  # the aux slot of a built-in container (which has none)
_getrefcount = getattr(sys, "getrefcount", None)


def _calibrate() -> int | None:
    """The reference count of an object held by one container slot and one flat-list entry.

    Seen through ``map(sys.getrefcount, flat)``, exactly as :func:`_has_repeats`
    counts. While a tree is flattened every leaf position is one slot of a
    live container (the tree's own nodes, or a values list the flattener
    keeps), so each entry of ``flat`` counts at least this much, and an
    object at two positions (two slots, two entries) at least this plus 2.
    Only CPython's reference counts are exact enough for this argument.
    """
    if _getrefcount is None or sys.implementation.name != "cpython":
        return None
    flat = [object()]
    holder = tuple(flat)
    base = sum(map(_getrefcount, flat))
    del holder
    return int(base)


_RC_BASE = _calibrate()


def _has_repeats(flat: list[Any]) -> bool:
    """Whether some identity-cached leaf occurs twice in `flat` (with all its containers alive).

    The common answer, "no", comes from one C-level pass: every entry counts
    at least ``_RC_BASE`` references, so a sum of exactly ``n * _RC_BASE``
    means no object is held by more than one position. Otherwise (ties,
    objects also referenced elsewhere, interned scalars) the ids decide.
    """
    n = len(flat)
    if n < 2:
        return False
    if _RC_BASE is not None and sum(map(_getrefcount, flat)) <= n * _RC_BASE:  # type: ignore[arg-type]
        return False
    if len(set(map(id, flat))) == n:  # C-level: leaves referenced from elsewhere too, none repeated
        return False
    scalars = SCALAR_TYPES
    ids = [id(x) for x in flat if type(x) not in scalars]
    return len(ids) != len(set(ids))


def _flatten(root: Any) -> Any:
    """``(flat, prog, auxs, keep)`` for `root`, or _ABORT (a node met twice, or flattening raised).

    ``keep`` holds the values lists of nodes that do not own their children,
    so every leaf stays alive (and its ``id`` unique) while it is used.
    """
    leaf_types = LEAF_TYPES
    known_types = KNOWN_TYPES
    disp = _DISPATCH
    flat: list[Any] = []
    prog: list[Any] = []
    auxs: list[Any] = []
    keep: list[Any] = []
    seen: set[int] = set()
    flat_append = flat.append
    flat_extend = flat.extend
    prog_append = prog.append
    seen_add = seen.add
    # one entry per open node with node children: its children iterator,
    # its prog entry (emitted when the iterator is exhausted) and its aux
    its: list[Any] = [iter((root,))]
    ents: list[Any] = [None]
    astk: list[Any] = [_NOAUX]
    its_append = its.append
    ents_append = ents.append
    astk_append = astk.append
    try:
        while its:
            for c in its[-1]:
                t = type(c)
                if t in leaf_types:
                    flat_append(c)
                    prog_append(None)
                    continue
                nd = disp.get(t, _MISS)
                if nd is _MISS:
                    nd = resolve(t)
                if nd is None or nd is SCALAR:
                    flat_append(c)
                    prog_append(None)
                    continue
                k = id(c)
                # a node met twice is a shared sub-tree or a cycle: the general walk
                # handles it; but the empty tuple is a singleton, met twice in many
                # trees, and both engines rebuild it as the same `()`
                if k in seen and (type(c) is not tuple or c):
                    return _ABORT
                seen_add(k)
                fast = nd.fast
                if fast >= LIST:  # LIST or TUPLE, the highest codes
                    vals = c
                    keys = None
                    named = False
                    aux = _NOAUX
                elif fast == DICT:
                    vals = c.values()
                    keys = list(c)
                    named = True
                    aux = _NOAUX
                else:
                    keys, vals, aux, named = nd.flatten(c)
                    if not nd.owns:
                        keep.append(vals)
                if leaf_types.issuperset(map(type, vals)):
                    leafy = True
                elif known_types.issuperset(map(type, vals)):
                    leafy = False
                else:  # types never met: resolve them first (so every tree gets the same answer)
                    ts = set(map(type, vals))
                    for t in ts:
                        if t not in disp:
                            resolve(t)
                    leafy = ts <= leaf_types
                if leafy:
                    flat_extend(vals)
                    prog_append((nd, keys, len(vals), True, named))
                    if aux is not _NOAUX:
                        auxs.append(aux)
                    continue
                its_append(iter(vals))
                ents_append((nd, keys, len(vals), False, named))
                astk_append(aux)
                break
            else:
                its.pop()
                prog_append(ents.pop())
                aux = astk.pop()
                if aux is not _NOAUX:
                    auxs.append(aux)
    except Exception:  # noqa: BLE001 - `walk` redoes the work and reports the error with its path
        return _ABORT
    prog.pop()  # the root's pseudo-parent
    return flat, prog, auxs, keep


def _rebuild(prog: list[Any], auxs: list[Any], res: list[Any], build: int) -> Any:
    """Rebuild a flattened tree around `res` (one result per leaf position)."""
    vs: list[Any] = []
    push = vs.append
    pos = 0
    ai = 0
    if build == BUILD_SAME:
        for e in prog:
            if e is None:
                push(res[pos])
                pos += 1
                continue
            nd, keys, n, leafy, _ = e
            if leafy:
                end = pos + n
                vals = res[pos:end]
                pos = end
            else:
                vals = vs[-n:]
                del vs[-n:]
            fast = nd.fast
            if fast == TUPLE:
                push(tuple(vals))
            elif fast == DICT:
                push(dict(zip(keys, vals, strict=True)))
            elif fast == LIST:
                push(vals)
            else:
                push(nd.unflatten(auxs[ai], keys, vals))
                ai += 1
    else:
        for e in prog:
            if e is None:
                push(res[pos])
                pos += 1
                continue
            nd, keys, n, leafy, named = e
            if leafy:
                end = pos + n
                vals = res[pos:end]
                pos = end
            else:
                vals = vs[-n:]
                del vs[-n:]
            if named:
                push(dict(zip(keys, vals, strict=True)))
            elif nd.fast == TUPLE:
                push(tuple(vals))
            else:
                push(vals)
    return vs[0]


def _leaf_path(trees: tuple[Any, ...], k: int) -> KeyPath:
    """The path of leaf position `k` of the first tree (positions as the fast engine counts them)."""
    paths: list[KeyPath] = []
    walk(trees[:1], lambda p, x: paths.append(p), build=BUILD_NONE, cache=False, share_nodes=False, with_path=True)
    return paths[k]


def _map_leaves(f: Callable[..., Any], flats: list[list[Any]], cache: bool, trees: tuple[Any, ...]) -> list[Any]:
    """``f`` over the flat leaves, in order; once per distinct (tuple of) objects when `cache`."""
    res: list[Any] = []
    try:
        if not (cache and _has_repeats(flats[0])):
            res.extend(map(f, *flats))
            return res
        memo: dict[Any, Any] = {}
        scalars = SCALAR_TYPES
        append = res.append
        if len(flats) == 1:
            for x in flats[0]:
                if type(x) in scalars:
                    append(f(x))
                else:
                    r = memo.get(id(x), _MISS)
                    if r is _MISS:
                        r = memo[id(x)] = f(x)
                    append(r)
        else:
            for xs in zip(*flats, strict=True):
                if type(xs[0]) in scalars:
                    append(f(*xs))
                else:
                    ck = tuple(map(id, xs))
                    r = memo.get(ck, _MISS)
                    if r is _MISS:
                        r = memo[ck] = f(*xs)
                    append(r)
    except Exception as e:
        add_note(e, _visiting_note(_leaf_path(trees, len(res))))
        raise
    return res


def _fast_walk(
    f: Callable[..., Any], trees: tuple[Any, ...], build: int, cache: bool, trainable_only: bool = False
) -> Any:
    """fmap/fmapstructure through the fast engine, or _ABORT before `f` is ever called.

    With `trainable_only` it runs only on trees whose every child is
    trainable (no node declares a `trainable` function): there the rule is
    just "map the floating and complex arrays".
    """
    first = _flatten(trees[0])
    if first is _ABORT:
        return _ABORT
    flat, prog, auxs, keep = first
    if trainable_only:
        if any(e is not None and e[0].trainable is not None for e in prog):
            return _ABORT
        f = _inexact_only(f)
    flats = [flat]
    keeps = [keep]
    for t in trees[1:]:
        other = _flatten(t)
        if other is _ABORT or other[1] != prog:
            return _ABORT
        flats.append(other[0])
        keeps.append(other[3])
    res = _map_leaves(f, flats, cache, trees)
    try:
        return _rebuild(prog, auxs, res, build)
    except Exception:
        # replay through `walk` (same results, same rebuild calls) for an error with its path
        it = iter(res)
        walk(trees, lambda *_: next(it), build=build, cache=False, share_nodes=False)
        raise


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
    _check_fn(f, name)
    _check_is_leaf(is_leaf, name)
    _check_flag(trainable_only, "trainable_only", name)
    _check_flag(cache, "cache", name)


def _inexact_only(f: Callable[..., Any]) -> Callable[..., Any]:
    inexact = is_inexact_array

    def g(leaf: Any, *others: Any) -> Any:
        return f(leaf, *others) if inexact(leaf) else leaf

    return g


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
    trees = (tree, *trees)
    if is_leaf is None:
        out = _fast_walk(f, trees, BUILD_SAME, cache, trainable_only)
        if out is not _ABORT:
            return out
    if trainable_only:
        return walk(trees, _trainable_visit(f, False), is_leaf=is_leaf, cache=cache, track=True)
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
    _check_options(f, is_leaf, trainable_only, cache, "fmapstructure")
    trees = (tree, *trees)
    if is_leaf is None:
        out = _fast_walk(f, trees, BUILD_STRUCTURE, cache, trainable_only)
        if out is not _ABORT:
            return out
    if trainable_only:
        return walk(
            trees, _trainable_visit(f, False), build=BUILD_STRUCTURE, is_leaf=is_leaf, cache=cache, track=True
        )
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
    _check_options(f, is_leaf, trainable_only, cache, "fmap_with_path")
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
        flattened = _flatten(tree)
        if flattened is not _ABORT:
            flat = flattened[0]
            if not _has_repeats(flat):
                return flat  # type: ignore[no-any-return]
            scalars = SCALAR_TYPES
            seen: set[int] = set()
            out = []
            for x in flat:
                if type(x) in scalars:
                    out.append(x)
                elif id(x) not in seen:
                    seen.add(id(x))
                    out.append(x)
            return out
    found: list[Any] = []
    walk((tree,), found.append, build=BUILD_NONE, is_leaf=is_leaf, share_nodes=False)
    return found


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
    append = out.append

    def visit(path: KeyPath, leaf: Any) -> None:
        append((path, leaf))

    walk((tree,), visit, build=BUILD_NONE, is_leaf=is_leaf, share_nodes=False, with_path=True)
    return out
