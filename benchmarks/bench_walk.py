"""The walk: fk.fmap / fmapstructure / leaves against the other pytree libraries.

Contenders (each skipped if its library is not installed): functorkit, optree,
``jax.tree_util``, ``torch.utils._pytree`` (the pure-Python one), dm-tree, a
bare recursive Python function, and the floor: ``list(map(f, leaves))`` over
leaves flattened beforehand, the cost of calling ``f`` once per leaf with no
structure at all.

Timing: all contenders run interleaved in one process, round after round;
each keeps its best round (``time.perf_counter``, garbage collector off while
timing, like ``timeit``). Fast calls are repeated inside a round so a round
lasts a few milliseconds.

Depth: each library walks nested lists of growing depth in a subprocess (a
crash of a C++ walker kills only the probe), then the first failing depth is
bisected exactly. Then ``fk.fmap`` is timed on deep chains against a shallow
tree with the same number of leaves.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _timing import best_of

import functorkit as fk

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------- trees


def wide_tree(n_outer: int = 10, n_mid: int = 10, n_inner: int = 100) -> dict[str, Any]:
    """A 3-level tree: dict of lists of tuples of 0-d float64 arrays (10,000 leaves by default)."""
    return {
        f"block{i}": [tuple(np.array(float(i * j * k)) for k in range(n_inner)) for j in range(n_mid)]
        for i in range(n_outer)
    }


def mlp_tree() -> dict[str, Any]:
    """A 3-layer MLP as a dict: 6 float32 arrays."""
    rng = np.random.default_rng(0)
    sizes = [(64, 32), (64, 64), (10, 64)]
    return {
        f"layer{i}": {
            "weight": rng.standard_normal(s).astype(np.float32),
            "bias": np.zeros(s[0], dtype=np.float32),
        }
        for i, s in enumerate(sizes, 1)
    }


_LAYERS = ("ln1", "q", "k", "v", "o", "ln2", "fc1", "fc2")  # 8 layers of 2 arrays per block


def transformer_tree(n_blocks: int, d: int = 4) -> dict[str, Any]:
    """A transformer as nested dicts: `n_blocks` blocks of 8 layers of 2 arrays (weight, bias).

    Each block is ``{"ln1", "attn": {"q", "k", "v", "o"}, "ln2", "fc1", "fc2"}``, every
    innermost layer a ``{"weight", "bias"}`` dict: 16 leaves and 8 innermost layers per block
    (600 blocks: 9,600 leaves, 4,800 layers). The arrays are small: the walk is what is timed.
    """

    def layer() -> dict[str, Any]:
        return {"weight": np.zeros((d, d), dtype=np.float32), "bias": np.zeros(d, dtype=np.float32)}

    def block() -> dict[str, Any]:
        return {
            "ln1": layer(),
            "attn": {k: layer() for k in ("q", "k", "v", "o")},
            "ln2": layer(),
            "fc1": layer(),
            "fc2": layer(),
        }

    return {f"h{i}": block() for i in range(n_blocks)}


def count_nodes(t: Any) -> int:
    """The dicts, lists and tuples in `t` (the root included)."""
    if type(t) is dict:
        return 1 + sum(count_nodes(v) for v in t.values())
    if type(t) in (list, tuple):
        return 1 + sum(count_nodes(v) for v in t)
    return 0


def transformer_module(n_blocks: int = 12, d: int = 64) -> Any:
    """The shape of `transformer_tree` as an ``nn.Module``: an ``nn.Sequential`` of blocks.

    A block holds ``ln1``, ``attn`` (``q``, ``k``, ``v``, ``o``: ``nn.Linear``), ``ln2``, ``fc1``,
    ``fc2``: 10 modules and 16 parameters per block; 12 blocks give 192 parameters and 121
    modules (the root included).
    """
    import torch
    from torch import nn

    class Attn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attn(), nn.LayerNorm(d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(n_blocks)))


def chain(depth: int) -> list[Any]:
    """``[leaf, [leaf, [leaf, ...]]]``: `depth` nested lists, one leaf per level."""
    t: list[Any] = [np.array(0.0)]
    for i in range(1, depth):
        t = [np.array(float(i)), t]
    return t


def flat_like(n: int) -> list[Any]:
    """A shallow tree with the leaves and nodes of ``chain(n)``: a list of n one-leaf lists."""
    return [[np.array(float(i))] for i in range(n)]


# --------------------------------------------------------------- plain Python


def _rec_map(f: Callable[[Any], Any], t: Any) -> Any:
    tt = type(t)
    if tt is dict:
        return {k: _rec_map(f, v) for k, v in t.items()}
    if tt is list:
        return [_rec_map(f, v) for v in t]
    if tt is tuple:
        return tuple(_rec_map(f, v) for v in t)
    return f(t)


def _rec_map2(f: Callable[[Any, Any], Any], t: Any, u: Any) -> Any:
    tt = type(t)
    if tt is dict:
        return {k: _rec_map2(f, v, u[k]) for k, v in t.items()}
    if tt is list:
        return [_rec_map2(f, v, w) for v, w in zip(t, u)]
    if tt is tuple:
        return tuple(_rec_map2(f, v, w) for v, w in zip(t, u))
    return f(t, u)


def _rec_leaves(t: Any, out: list[Any] | None = None) -> list[Any]:
    if out is None:
        out = []
    tt = type(t)
    if tt is dict:
        for v in t.values():
            _rec_leaves(v, out)
    elif tt is list or tt is tuple:
        for v in t:
            _rec_leaves(v, out)
    else:
        out.append(t)
    return out


def _rec_flatten(t: Any) -> tuple[list[Any], list[Any]]:
    """The leaves and a structure: per node its type, its keys (dicts) and its length, post-order. The
    least a walk that records what it met can do in Python (no ties, sharing or leaf types checked):
    the floor of `fk.flatten` on these trees, next to the C++ walks that record a structure."""
    flat: list[Any] = []
    nodes: list[Any] = []

    def visit(c: Any) -> None:
        tt = type(c)
        if tt is dict:
            for v in c.values():
                visit(v)
            nodes.append((tt, [*c], len(c)))
        elif tt is list or tt is tuple:
            for v in c:
                visit(v)
            nodes.append((tt, None, len(c)))
        else:
            flat.append(c)
            nodes.append(None)

    visit(t)
    return flat, nodes


# --------------------------------------------------------------- contenders


def _ident(x: Any) -> Any:
    return x


def _first(x: Any, y: Any) -> Any:
    return x


def _structure(cache: dict[int, Any], t: Any, make: Callable[[Any], Any]) -> Any:
    """`t`'s recorded structure, made once (the match rows time the match alone)."""
    out = cache.get(id(t))
    if out is None:
        out = cache[id(t)] = make(t)
    return out


Op = tuple[str, str, Callable[[Any], Any]]  # (library, call as shown, fn(tree) -> result)


def contenders() -> dict[str, list[Op]]:
    """Operation group -> [(library, call, fn)], for every library installed here."""
    f, f2 = _ident, _first
    groups: dict[str, list[Op]] = {
        "map (1 tree)": [
            ("functorkit", "fk.fmap(f, t)", lambda t: fk.fmap(f, t)),
            ("functorkit", "fk.fmapstructure(f, t)", lambda t: fk.fmapstructure(f, t)),
        ],
        "map (2 trees)": [("functorkit", "fk.fmap(f, t, u)", lambda t, u: fk.fmap(f2, t, u))],
        "leaves": [
            ("functorkit", "fk.leaves(t)", fk.leaves),
            ("functorkit", "fk.flatten(t)", fk.flatten),
        ],
    }
    # matching a second tree against the first one's recorded structure (what every multi-tree map,
    # the arithmetic and load_into do), the structure recorded once outside the timing
    fk_defs: dict[int, Any] = {}
    groups["match"] = [
        (
            "functorkit",
            "td.flatten_up_to(u)",
            lambda t, u: _structure(fk_defs, t, lambda t: fk.flatten(t)[1]).flatten_up_to(u),
        )
    ]
    try:
        import optree

        opt_defs: dict[int, Any] = {}
        groups["match"].append(
            (
                "optree",
                "optree: treespec.flatten_up_to(u)",
                lambda t, u: _structure(opt_defs, t, optree.tree_structure).flatten_up_to(u),
            )
        )
        groups["map (1 tree)"].append(("optree", "optree.tree_map(f, t)", lambda t: optree.tree_map(f, t)))
        groups["map (2 trees)"].append(("optree", "optree.tree_map(f, t, u)", lambda t, u: optree.tree_map(f2, t, u)))
        groups["leaves"] += [
            ("optree", "optree.tree_leaves(t)", optree.tree_leaves),
            ("optree", "optree.tree_flatten(t)", optree.tree_flatten),
        ]
    except ImportError:
        pass
    try:
        import jax

        jtu = jax.tree_util
        jax_defs: dict[int, Any] = {}
        groups["match"].append(
            (
                "jax",
                "jax: treedef.flatten_up_to(u)",
                lambda t, u: _structure(jax_defs, t, jtu.tree_structure).flatten_up_to(u),
            )
        )
        groups["map (1 tree)"].append(("jax", "jax.tree_util.tree_map(f, t)", lambda t: jtu.tree_map(f, t)))
        groups["map (2 trees)"].append(("jax", "jax.tree_util.tree_map(f, t, u)", lambda t, u: jtu.tree_map(f2, t, u)))
        groups["leaves"] += [
            ("jax", "jax.tree_util.tree_leaves(t)", jtu.tree_leaves),
            ("jax", "jax.tree_util.tree_flatten(t)", jtu.tree_flatten),
        ]
    except ImportError:
        pass
    try:
        import torch.utils._pytree as pt

        groups["map (1 tree)"].append(("torch", "torch _pytree.tree_map(f, t)", lambda t: pt.tree_map(f, t)))
        groups["map (2 trees)"].append(("torch", "torch _pytree.tree_map(f, t, u)", lambda t, u: pt.tree_map(f2, t, u)))
        groups["leaves"] += [
            ("torch", "torch _pytree.tree_leaves(t)", pt.tree_leaves),
            ("torch", "torch _pytree.tree_flatten(t)", pt.tree_flatten),
        ]
    except ImportError:
        pass
    try:
        import tree as dm_tree

        groups["map (1 tree)"].append(("dm-tree", "tree.map_structure(f, t)", lambda t: dm_tree.map_structure(f, t)))
        groups["map (2 trees)"].append(
            ("dm-tree", "tree.map_structure(f, t, u)", lambda t, u: dm_tree.map_structure(f2, t, u))
        )
        groups["leaves"].append(("dm-tree", "tree.flatten(t)", dm_tree.flatten))
    except ImportError:
        pass
    groups["map (1 tree)"].append(("python", "recursive Python map", lambda t: _rec_map(f, t)))
    groups["map (2 trees)"].append(("python", "recursive Python map, 2 trees", lambda t, u: _rec_map2(f2, t, u)))
    groups["leaves"].append(("python", "recursive Python leaves", _rec_leaves))
    groups["leaves"].append(("python", "recursive Python flatten, records each node's keys", _rec_flatten))
    return groups


# --------------------------------------------------------------- timing


# --------------------------------------------------------------- reporting


def _us(s: float) -> str:
    us = s * 1e6
    return f"{us:,.0f}" if us >= 100 else f"{us:.3g}"


def _per_leaf(s: float, n: int) -> str:
    return f"{s * 1e6 / n:.4f}"


def _ratio(a: float, b: float | None) -> str:
    return "-" if b is None else f"{a / b:.2f}x"


REFERENCE = {  # the call each ratio column divides by, per group
    "map (1 tree)": ("jax.tree_util.tree_map(f, t)", "optree.tree_map(f, t)", "torch _pytree.tree_map(f, t)"),
    "map (2 trees)": (
        "jax.tree_util.tree_map(f, t, u)",
        "optree.tree_map(f, t, u)",
        "torch _pytree.tree_map(f, t, u)",
    ),
    "leaves": ("jax.tree_util.tree_leaves(t)", "optree.tree_leaves(t)", "torch _pytree.tree_leaves(t)"),
    "match": ("jax: treedef.flatten_up_to(u)", "optree: treespec.flatten_up_to(u)", "-"),
}
FLOOR = {
    "map (1 tree)": "floor: list(map(f, leaves))",
    "map (2 trees)": "floor: list(map(f, leaves, leaves_u))",
}


HELD = "fk.fmap(f, h) (h: a copy of t whose leaves are also held in a list)"


#: the walk's fast paths, each with the settings that switch it off (module, attribute, value)
SWITCHES: dict[str, tuple[tuple[str, str, Any], ...]] = {
    "recursive walk": (("functorkit._record", "RECURSIVE", False),),
    # off: no plan is looked up or made (the walk records, the definition's program rebuilds)
    "generated matcher and builder": (
        ("functorkit._record", "MATCH_BY_ROOT", {}),
        ("functorkit._treedef", "BUILD_BY_ID", {}),
        ("functorkit._plans", "remember", lambda *args: None),
    ),
    # off: the plain tie test, a set of ids (the fast path sorts the objects' words in NumPy)
    "recursive matcher": (("functorkit._program_match", "RECURSIVE_MATCH", False),),
    "object-word tie sort": (
        ("functorkit._record", "OBJECT_WORDS", False),
        ("functorkit._record", "_DISTINCT_SORT", 1 << 62),
    ),
    # off: fk.leaves of a large container tree records its structure as fk.flatten does
    "leaves walk": (("functorkit._leaves_walk", "LEAVES_WALK", False),),
    # off: every torch module is taken apart by `_slots` (a frame more per module)
    "module one-section inline": (("functorkit.adapters._torch_module", "INLINE_SLOTS", False),),
    # off: fk.leaves makes each torch module's child keys, and drops them
    "module values only": (("functorkit.adapters._torch_module", "VALUES_ONLY", False),),
    # off: fk.leaves looks each torch module up in the node table (`other`'s frame)
    "children-node inline": (("functorkit._leaves_walk", "CHILDREN_INLINE", False),),
}


def switched_off(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` with the fast path `name` switched off for the call (`SWITCHES`)."""
    import importlib

    settings = [(importlib.import_module(mod), attr, value) for mod, attr, value in SWITCHES[name]]

    def run(*args: Any) -> Any:
        old = [getattr(mod, attr) for mod, attr, _ in settings]
        for mod, attr, value in settings:
            setattr(mod, attr, value)
        try:
            return fn(*args)
        finally:
            for (mod, attr, _), v in zip(settings, old, strict=True):
                setattr(mod, attr, v)

    return run


#: on/off rows: (group, the call as timed with every fast path on, the fast path switched off)
ONOFF = (
    ("leaves", "fk.flatten(t)", "recursive walk"),
    ("leaves", "fk.leaves(t)", "recursive walk"),
    ("map (1 tree)", "fk.fmap(f, t)", "recursive walk"),
    ("match", "td.flatten_up_to(u)", "recursive matcher"),
    ("map (2 trees)", "fk.fmap(f, t, u)", "recursive matcher"),
    ("leaves", "fk.flatten(t)", "object-word tie sort"),
    ("leaves", "fk.leaves(t)", "generated matcher and builder"),
    ("leaves", "fk.leaves(t)", "leaves walk"),
    ("map (1 tree)", "fk.fmap(f, t)", "generated matcher and builder"),
)


def _off_call(on: str, switch: str) -> str:
    return f"{on}, {switch} off"


def time_tree(tree: Any, rounds: int) -> tuple[int, dict[str, dict[str, float]]]:
    """Time every contender on `tree`; returns (number of leaves, group -> call -> seconds).

    Two-tree maps zip `tree` with `u`, an equal but distinct copy (as when zipping two
    models). The floor maps over the leaves of other copies, so that no leaf of `tree`
    is referenced from outside it (as in a model held only by its containers); the row
    `HELD` shows fk.fmap on a tree whose every leaf is also referenced from a list.
    """
    u, floor_tree, held = copy.deepcopy(tree), copy.deepcopy(tree), copy.deepcopy(tree)
    flat, flat_u, held_leaves = _rec_leaves(floor_tree), _rec_leaves(u), _rec_leaves(held)
    groups = contenders()
    calls: dict[str, Callable[[], Any]] = {}
    where: dict[str, str] = {}
    for group, ops in groups.items():
        for _, call, fn in ops:
            two = group in ("map (2 trees)", "match")
            calls[call] = functools.partial(fn, tree, u) if two else functools.partial(fn, tree)
            where[call] = group
    calls[FLOOR["map (1 tree)"]] = lambda: list(map(_ident, flat))
    calls[FLOOR["map (2 trees)"]] = lambda: list(map(_first, flat, flat_u))
    calls[HELD] = lambda: fk.fmap(_ident, held)
    off_fns = {
        "fk.flatten(t)": fk.flatten,
        "fk.leaves(t)": fk.leaves,
        "fk.fmap(f, t)": lambda t: fk.fmap(_ident, t),
        "fk.fmap(f, t, u)": lambda t, u: fk.fmap(_first, t, u),
        "td.flatten_up_to(u)": next(fn for _, call, fn in groups["match"] if call == "td.flatten_up_to(u)"),
    }
    for group, on, switch in ONOFF:
        off = _off_call(on, switch)
        args = (tree, u) if group in ("map (2 trees)", "match") else (tree,)
        calls[off] = functools.partial(switched_off(switch, off_fns[on]), *args)
        where[off] = group
    where[FLOOR["map (1 tree)"]] = "map (1 tree)"
    where[FLOOR["map (2 trees)"]] = "map (2 trees)"
    where[HELD] = "map (1 tree)"
    assert len(held_leaves) == len(flat)
    # sanity: every call sees every leaf (a map's output has as many leaves as the input)
    for call, run_once in calls.items():
        out = run_once()
        got = (out[0] if isinstance(out, tuple) else out) if where[call] in ("leaves", "match") else _rec_leaves(out)
        if len(got) != len(flat):
            msg = f"{call} gave {len(got)} leaves, expected {len(flat)}"
            raise AssertionError(msg)
    best = best_of(calls, rounds, max_number=10_000)
    res: dict[str, dict[str, float]] = {g: {} for g in groups}
    for call, t in best.items():
        res[where[call]][call] = t
    return len(flat), res


def onoff_table(res: dict[str, dict[str, float]]) -> str:
    """Each fast path of the walk on and off, same run: the gain that keeps it (issue #21, item 5)."""
    rows = ["| fast path | call | on µs | off µs | gain |", "|---|---|---:|---:|---:|"]
    for group, on, switch in ONOFF:
        t_on, t_off = res[group][on], res[group][_off_call(on, switch)]
        rows.append(f"| {switch} | {on} | {_us(t_on)} | {_us(t_off)} | {(t_off / t_on - 1) * 100:+.0f}% |")
    return "\n".join(rows)


def tree_table(n: int, res: dict[str, dict[str, float]]) -> str:
    rows = [
        "| operation | call | µs per call | µs per leaf | vs jax.tree_util | vs optree | vs torch _pytree |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for group, times in res.items():
        refs = [times.get(r) for r in REFERENCE[group]]
        for call, t in sorted(times.items(), key=lambda kv: kv[1]):
            bold = f"**{call}**" if call.startswith("fk.") else call
            cols = [_ratio(t, r) for r in refs]
            rows.append(f"| {group} | {bold} | {_us(t)} | {_per_leaf(t, n)} | {' | '.join(cols)} |")
    return "\n".join(rows)


# --------------------------------------------------------------- targets (issue #21)

# (what, functorkit call, group, jax call, optree call, python call, target fk/jax)
_TARGETS = (
    ("leaves", "fk.leaves(t)", "leaves", "jax.tree_util.tree_leaves(t)", "optree.tree_leaves(t)",
     "recursive Python leaves", 1.0),
    ("flatten", "fk.flatten(t)", "leaves", "jax.tree_util.tree_flatten(t)", "optree.tree_flatten(t)",
     "recursive Python flatten, records each node's keys", 1.0),
    ("fmap", "fk.fmap(f, t)", "map (1 tree)", "jax.tree_util.tree_map(f, t)", "optree.tree_map(f, t)",
     "recursive Python map", 1.25),
    ("two-tree fmap", "fk.fmap(f, t, u)", "map (2 trees)", "jax.tree_util.tree_map(f, t, u)",
     "optree.tree_map(f, t, u)", "recursive Python map, 2 trees", 1.2),
)  # fmt: skip


def _verdict(ratio: float | None, target: float) -> str:
    if ratio is None:
        return "-"
    return "met" if ratio <= target else f"**not met** ({ratio / target:.1f}x over)"


def target_table(res: dict[str, dict[str, float]], fmap_target: float = 1.25) -> str:
    """functorkit against jax.tree_util (and optree, and a recursive Python walk) with the issue's targets."""
    rows = [
        "| operation | functorkit µs | jax.tree_util µs | fk / jax | target | | fk / optree | recursive Python / jax |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for what, fk_call, group, jax_call, optree_call, py_call, target in _TARGETS:
        times = res[group]
        t_fk, t_jax, t_opt = times[fk_call], times.get(jax_call), times.get(optree_call)
        target = fmap_target if what == "fmap" else target
        ratio = None if t_jax is None else t_fk / t_jax
        py = "-" if py_call is None or t_jax is None else f"{times[py_call] / t_jax:.2f}x"
        rows.append(
            f"| {what} | {_us(t_fk)} | {_us(t_jax) if t_jax else '-'} | {_ratio(t_fk, t_jax)} | ≤ {target:.2f}x"
            f" | {_verdict(ratio, target)} | {_ratio(t_fk, t_opt)} | {py} |"
        )
    return "\n".join(rows)


def _mod_leaves(m: Any, out: list[Any]) -> list[Any]:
    """A recursive Python walk of a module's parameters that records nothing (no ties, no paths)."""
    out.extend(m._parameters.values())
    for c in m._modules.values():
        _mod_leaves(c, out)
    return out


def time_module(rounds: int) -> tuple[int, int, dict[str, float]]:
    """Time the 12-block ``nn.Module`` against torch's own utilities; (parameters, modules, call -> s)."""
    import torch
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    m = transformer_module()
    m_v2p = copy.deepcopy(m)  # vector_to_parameters rebinds .data: keep it off the shared module
    m_u = copy.deepcopy(m)  # matched against m's definition (an EMA's second model)
    _, td = fk.flatten(m)
    flat, re = fk.destructure(m)
    vec = parameters_to_vector(m.parameters())
    assert torch.equal(flat, vec)
    calls: dict[str, Callable[[], Any]] = {
        "fk.leaves(m)": lambda: fk.leaves(m),
        "fk.leaves(m), leaves walk off": lambda: switched_off("leaves walk", fk.leaves)(m),
        "fk.flatten(m)": lambda: fk.flatten(m),
        "fk.flatten(m), recursive walk off": lambda: switched_off("recursive walk", fk.flatten)(m),
        "fk.leaves(m), module values only off": lambda: switched_off("module values only", fk.leaves)(m),
        "fk.leaves(m), children-node inline off": lambda: switched_off("children-node inline", fk.leaves)(m),
        "fk.flatten(m), module one-section inline off": lambda: switched_off("module one-section inline", fk.flatten)(
            m
        ),
        "td.flatten_up_to(u)": lambda: td.flatten_up_to(m_u),
        "td.flatten_up_to(u), module one-section inline off": lambda: switched_off(
            "module one-section inline", td.flatten_up_to
        )(m_u),
        "list(u.parameters())": lambda: list(m_u.parameters()),
        "m.state_dict()": m.state_dict,
        "list(m.named_parameters())": lambda: list(m.named_parameters()),
        "recursive Python leaves (m._parameters, m._modules)": lambda: _mod_leaves(m, []),
        "fk.fmap(f, m)": lambda: fk.fmap(_ident, m),
        "re(flat)": lambda: re(flat),
        "vector_to_parameters(flat, m.parameters())": lambda: vector_to_parameters(vec, m_v2p.parameters()),
        "fk.destructure(m)": lambda: fk.destructure(m),
        "parameters_to_vector(m.parameters())": lambda: parameters_to_vector(m.parameters()),
    }
    n = len(fk.leaves(m))
    for call in ("m.state_dict()", "list(m.named_parameters())", "recursive Python leaves (m._parameters, m._modules)"):
        if len(calls[call]()) != n:
            msg = f"{call} gave {len(calls[call]())} arrays, fk.leaves {n}"
            raise AssertionError(msg)
    with torch.no_grad():
        best = best_of(calls, rounds, max_number=10_000)
    return n, len(list(m.modules())), best


_MODULE_TARGETS = (  # (what, functorkit call, torch call, target fk/torch or None)
    ("leaves", "fk.leaves(m)", "m.state_dict()", 1.0),
    ("leaves", "fk.leaves(m)", "list(m.named_parameters())", None),
    ("leaves", "fk.leaves(m)", "recursive Python leaves (m._parameters, m._modules)", None),
    ("leaves: leaves walk on / off", "fk.leaves(m)", "fk.leaves(m), leaves walk off", None),
    ("flatten: recursive walk on / off", "fk.flatten(m)", "fk.flatten(m), recursive walk off", None),
    ("leaves: module values only on / off", "fk.leaves(m)", "fk.leaves(m), module values only off", None),
    ("leaves: children-node inline on / off", "fk.leaves(m)", "fk.leaves(m), children-node inline off", None),
    (
        "flatten: module one-section inline on / off",
        "fk.flatten(m)",
        "fk.flatten(m), module one-section inline off",
        None,
    ),
    ("match another module (u: a copy of m)", "td.flatten_up_to(u)", "list(u.parameters())", None),
    (
        "match: module one-section inline on / off",
        "td.flatten_up_to(u)",
        "td.flatten_up_to(u), module one-section inline off",
        None,
    ),
    ("fmap(identity)", "fk.fmap(f, m)", "m.state_dict()", None),
    ("rebuild from a vector", "re(flat)", "vector_to_parameters(flat, m.parameters())", 1.5),
    ("flatten to a vector", "fk.destructure(m)", "parameters_to_vector(m.parameters())", 1.5),
)


def module_table(best: dict[str, float]) -> str:
    rows = [
        "| operation | functorkit | µs | torch / plain Python | µs | ratio | target | |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for what, fk_call, peer, target in _MODULE_TARGETS:
        t_fk, t_peer = best[fk_call], best[peer]
        r = t_fk / t_peer
        tgt = "-" if target is None else f"≤ {target:.2f}x"
        verdict = "-" if target is None else _verdict(r, target)
        rows.append(f"| {what} | **{fk_call}** | {_us(t_fk)} | {peer} | {_us(t_peer)} | {r:.2f}x | {tgt} | {verdict} |")
    return "\n".join(rows)


# --------------------------------------------------------------- depth probes

_PROBE = r"""
import sys, json, re
import numpy as np
lib, op, lo, hi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ladder = json.loads(sys.argv[5])
ident = lambda x: x
if lib == "functorkit":
    import functorkit as fk
    run = {"map": lambda t: fk.fmap(ident, t), "leaves": fk.leaves}[op]
elif lib == "optree":
    import optree
    run = {"map": lambda t: optree.tree_map(ident, t), "leaves": optree.tree_leaves}[op]
elif lib == "jax":
    import jax
    run = {"map": lambda t: jax.tree_util.tree_map(ident, t), "leaves": jax.tree_util.tree_leaves}[op]
elif lib == "torch":
    import torch.utils._pytree as pt
    run = {"map": lambda t: pt.tree_map(ident, t), "leaves": pt.tree_leaves}[op]
elif lib == "dm-tree":
    import tree
    run = {"map": lambda t: tree.map_structure(ident, t), "leaves": tree.flatten}[op]
else:
    def rec_map(t):
        return [rec_map(v) for v in t] if type(t) is list else ident(t)
    def rec_leaves(t, out):
        if type(t) is list:
            for v in t:
                rec_leaves(v, out)
        else:
            out.append(t)
        return out
    run = {"map": rec_map, "leaves": lambda t: rec_leaves(t, [])}[op]

def nest(d):
    t = np.ones(1)
    for _ in range(d):
        t = [t]
    return t

def attempt(d):
    print("try", d, flush=True)
    try:
        run(nest(d))
    except BaseException as e:
        msg = re.sub(r" at 0x[0-9a-f]+", "", " ".join(str(e).split()))
        msg = msg if len(msg) <= 90 else msg[:87] + "..."
        print("fail", d, json.dumps(type(e).__name__ + ": " + msg), flush=True)
        return False
    print("ok", d, flush=True)
    return True

for d in ladder:
    if d <= lo or (hi and d >= hi):
        continue
    if attempt(d):
        lo = d
    else:
        hi = d
        break
while hi and hi - lo > 1:
    mid = (lo + hi) // 2
    if attempt(mid):
        lo = mid
    else:
        hi = mid
print("done", lo, hi, flush=True)
"""


def probe_depth(lib: str, op: str, ladder: list[int]) -> tuple[int, int | None, str]:
    """(deepest depth that works, first depth that fails or None, how it failed)."""
    lo, hi, how = 0, 0, ""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    for _ in range(30):  # restarts after crashes
        cmd = [sys.executable, "-c", _PROBE, lib, op, str(lo), str(hi), json.dumps(ladder)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, check=False)
            out, err, rc = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            raw = e.stdout or ""
            out, err, rc = (raw.decode() if isinstance(raw, bytes) else raw), "timeout", -9
        trying = None
        for line in out.splitlines():
            kind, _, rest = line.partition(" ")
            if kind == "try":
                trying = int(rest)
            elif kind == "ok":
                lo, trying = max(lo, int(rest)), None
            elif kind == "fail":
                d, _, msg = rest.partition(" ")
                if not hi or int(d) <= hi:
                    hi, how = int(d), json.loads(msg)
                trying = None
            elif kind == "done":
                return lo, (hi or None), how
        if trying is None:  # died before trying anything: report and stop
            return lo, None, f"probe failed to start (exit {rc}): {err[-200:]}"
        hi = trying
        how = "timeout" if rc == -9 else f"crash (exit code {rc})"
    return lo, (hi or None), how


def depth_table(ladder: list[int]) -> str:
    libs = ["functorkit", "optree", "jax", "torch", "dm-tree", "python"]
    mods = {"optree": "optree", "jax": "jax", "torch": "torch", "dm-tree": "tree"}
    rows = [
        "| library | map: deepest that works | map: fails at | leaves: deepest that works | leaves: fails at | how |",
        "|---|---:|---:|---:|---:|---|",
    ]
    import importlib.util

    for lib in libs:
        if lib in mods and importlib.util.find_spec(mods[lib]) is None:
            continue
        cells, hows = [], []
        for op in ("map", "leaves"):
            lo, hi, how = probe_depth(lib, op, ladder)
            cells += [f"{lo:,}", f"{hi:,}" if hi else f"none up to {ladder[-1]:,}"]
            if how and how not in hows:
                hows.append(how)
        name = {"python": "recursive Python", "jax": "jax.tree_util", "torch": "torch _pytree"}.get(lib, lib)
        how_cell = "; ".join(h.replace("|", "\\|") for h in hows) or "-"
        rows.append(f"| {name} | {' | '.join(cells)} | {how_cell} |")
    return "\n".join(rows)


def deep_timing(depths: list[int], rounds: int) -> str:
    rows = [
        "| depth (= leaves) | fk.fmap on the chain, µs per leaf | fk.fmap on a flat tree of as many leaves, µs per leaf"
        " | deep / flat |",
        "|---:|---:|---:|---:|",
    ]
    for d in depths:
        deep, flat = chain(d), flat_like(d)
        best = best_of(
            {"deep": functools.partial(fk.fmap, _ident, deep), "flat": functools.partial(fk.fmap, _ident, flat)},
            rounds,
            target_s=0.02,
            max_number=10_000,
        )
        ratio = best["deep"] / best["flat"]
        rows.append(f"| {d:,} | {_per_leaf(best['deep'], d)} | {_per_leaf(best['flat'], d)} | {ratio:.2f}x |")
        del deep, flat
    return "\n".join(rows)


# --------------------------------------------------------------- entry point


def run(quick: bool) -> str:
    """The markdown section of this benchmark."""
    rounds = 3 if quick else 15
    wide = wide_tree() if not quick else wide_tree(10, 10, 20)
    n_wide, res_wide = time_tree(wide, rounds)
    n_mlp, res_mlp = time_tree(mlp_tree(), rounds)
    big = transformer_tree(600 if not quick else 60)
    n_big_nodes = count_nodes(big)
    n_big, res_big = time_tree(big, rounds)
    del big
    small = transformer_tree(12)
    n_small_nodes = count_nodes(small)
    n_small, res_small = time_tree(small, rounds)
    try:
        import torch  # noqa: F401

        n_mod, n_modules, res_mod = time_module(rounds)
        mod_section = f"""### (e) The 12-block transformer as an `nn.Module`: {n_mod} parameters, {n_modules} modules

An `nn.Sequential` of 12 blocks of the shape of (c) (`nn.Linear` and `nn.LayerNorm` layers,
width 64), against torch's own utilities on the same module, interleaved in one run, best of
{rounds} rounds, under `torch.no_grad()`. `vector_to_parameters` writes into a copy of the module
(it rebinds each parameter's `.data`); `re(flat)` builds a new module. The plain-Python row walks
`_parameters` and `_modules` recursively and records nothing. `td.flatten_up_to(u)` matches a copy
of the module against `m`'s definition (what every arithmetic call does with its second model).
The on / off rows switch one of the module walk's fast paths off for the call: `_flatten` and
`_children` taking a module of one section without `_slots` (`_torch_module.INLINE_SLOTS`), `fk.leaves`
listing a module's children without their keys (`VALUES_ONLY`) and walking a node kind met before
from its parent's loop (`_leaves_walk.CHILDREN_INLINE`). Targets from issue #21.

{module_table(res_mod)}
"""
    except ImportError:
        mod_section = ""

    ladder = [500, 1000, 2000, 5000, 10_000, 20_000, 50_000, 100_000]
    depths = [1000, 10_000, 100_000]
    if quick:
        ladder, depths = [500, 1000, 2000, 10_000], [1000, 10_000]
    t_depth = depth_table(ladder)
    t_deep = deep_timing(depths, 3 if quick else 7)

    def headline(res: dict[str, dict[str, float]]) -> str:
        m1, m2, lv = res["map (1 tree)"], res["map (2 trees)"], res["leaves"]
        parts = []
        for peer, k in (("jax.tree_util", 0), ("optree", 1), ("torch _pytree", 2)):
            r1, r2, r3 = (REFERENCE[g][k] for g in ("map (1 tree)", "map (2 trees)", "leaves"))
            if r1 in m1:
                parts.append(
                    f"vs {peer}: fmap {m1['fk.fmap(f, t)'] / m1[r1]:.2f}x, two-tree fmap "
                    f"{m2['fk.fmap(f, t, u)'] / m2[r2]:.2f}x, leaves {lv['fk.leaves(t)'] / lv[r3]:.2f}x"
                )
        return "; ".join(parts)

    return f"""## Walking: fmap, fmapstructure, leaves

Every contender maps the identity function (`f = lambda x: x`, or its two-argument form) over the
same tree, so the times are pure walking overhead: taking the tree apart, calling `f` once per
leaf, building the result. The floor row is `list(map(f, leaves))` over leaves flattened in
advance: the cost of the calls to `f` alone, with no structure. Ratios divide a row's time by the
peer's time for the same operation (below 1x is faster than the peer). Leaves are 0-d NumPy
arrays, distinct objects, so functorkit's identity cache (which keeps ties tied, and which the
peers do not have) is paid in full. Two-tree maps zip `t` with `u`, an equal but distinct copy
(as when zipping two models). The row marked `h` maps a copy whose every leaf is also held
elsewhere (e.g. by an optimiser): functorkit's tie check (one set of identities per walk) costs
the same either way, and the row shows it. In (b), a small model mapped again and again, the
second call on one structure generates a matcher and a builder for it (see docs/treedef.md),
so the rows measure the steady state of a training loop. All contenders interleaved in one
process, best of
{rounds} rounds each.

Each section ends its functorkit rows with the walk's fast paths switched off one at a time, in
the same run (issue #21, item 5: a fast path stays only if its own workload shows it):
the **recursive walk** (one Python call per node, a layer's leaves taken in one C-level
`extend`; the explicit-stack walk takes deep trees, cycles and shared sub-trees), the
**generated matcher and builder** (a small container tree met before is matched and rebuilt by
straight-line code instead of being walked), the **recursive matcher** (a second tree matched
against the first one's structure by the same kind of recursion, the full matcher deciding and
naming anything else), the **object-word tie sort** (the ties of many
leaves found by sorting their object words in NumPy instead of a set of ids), and the **leaves
walk** (`fk.leaves` of a container tree too large for the plan cache lists the leaves without
recording a structure; with it off they are recorded, as `fk.flatten` records them). A switch that shows
little gain in one section is kept for the section whose shape it serves.

### (a) A wide tree: {n_wide:,} leaves, dicts of lists of tuples, 3 levels

{headline(res_wide)}.

{onoff_table(res_wide)}

{tree_table(n_wide, res_wide)}

### (b) A small model: an MLP as a dict of {n_mlp} arrays

Here the fixed cost per call dominates.

{headline(res_mlp)}.

{onoff_table(res_mlp)}

{tree_table(n_mlp, res_mlp)}

### (c) A model-shaped tree: a {n_big // 16:,}-block transformer as nested dicts, {n_big:,} leaves

Each block is `{{"ln1", "attn": {{"q", "k", "v", "o"}}, "ln2", "fc1", "fc2"}}`, each innermost
layer a `{{"weight", "bias"}}` dict of small float32 arrays: {n_big:,} leaves, {n_big // 2:,}
innermost layers, {n_big_nodes:,} dicts in all (the root included). Few leaves per node: this is
the per-node cost a real model pays. The first table sets functorkit against `jax.tree_util` with
the targets of issue #21 (the recursive-Python column: for leaves and the maps a walk that
records nothing, for flatten one that records each node's type, keys and length: the floor of a
Python walk that records a structure); the second lists every contender.

{target_table(res_big)}

{onoff_table(res_big)}

{tree_table(n_big, res_big)}

### (d) The same transformer with 12 blocks: {n_small} leaves, {n_small_nodes} dicts

The per-step case: a small model mapped again and again (the steady state, as in (b)).

{target_table(res_small, fmap_target=1.2)}

{onoff_table(res_small)}

{tree_table(n_small, res_small)}

{mod_section}
### Depth: where each library fails

Nested lists `[[[...[leaf]...]]]` of growing depth ({", ".join(f"{d:,}" for d in ladder)}), each
library in its own subprocess (so a crash of a C++ walker does not end the run), then the first
failing depth bisected exactly. Python's recursion limit is left at its default.

{t_depth}

### Depth: the cost of a deep tree

`fk.fmap` over a chain `[leaf, [leaf, [leaf, ...]]]` (one leaf per level) against a shallow list
of as many one-leaf lists (the same number of leaves and nodes), best of {3 if quick else 7} rounds.

{t_deep}
"""
