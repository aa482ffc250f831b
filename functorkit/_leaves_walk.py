"""`fk.leaves` of a large container tree or a torch module: the leaves listed, no structure recorded.

``fk.leaves`` needs no `TreeDef`, but the walk that records one (``_record.py``) builds a program
entry per node (a keys list and a tuple) that the leaves never read: on a model-shaped tree of
thousands of small dicts that is half of the walk (bench_walk's "(c)" rows, ``fk.leaves(t)`` with
`LEAVES_WALK` on and off), and on a torch module the aux data (a copy of each module's
``__dict__``, a weak reference) is most of its cost. This walk lists the same leaves in the same
order under the same rules, for trees made of the node table's dicts, lists and tuples (a model
held as nested dicts) and of nodes that list their children without aux data (``NodeDef.children``:
torch modules, whose children are their parameters, buffers and submodules):

* one recursive call per node and one type test per child;
* ties: each identity-cached leaf once, at its first position, scalars at every position (the
  recording walk's rule, the same code: ``_record.distinct_leaves``);
* no node may be met twice (a shared sub-tree lists its scalars once: the recording walk knows
  how) and no deeper than ``_record.RECURSIVE_DEPTH`` (deep trees and cycles): the walk hands
  such a tree to the recording walk, as it does any tree holding another kind of node.

Small container trees are not taken here: from their second walk the plan cache's generated matcher lists
their leaves faster (``_record.record_plain``), and it is made from a recording. A tree takes this
walk while no plan is kept for its root's type and length and once it has more nodes than the
plan cache plans for (more nodes and leaves than ``_plans.PLAN_NODES`` program entries); a smaller
one is recorded after it (its first walks only: the matcher is made at the second recording).
"""

from __future__ import annotations

from typing import Any

from . import _plans
from ._record import RECURSIVE_DEPTH, all_distinct, distinct_leaves
from ._registry import DICT, LIST, TABLES, TUPLE, NodeDef, resolve

__all__ = ["LEAVES_WALK", "leaves_unrecorded"]

#: tests and benchmarks switch this walk off to compare it with the recording walk
LEAVES_WALK = True
#: a node walked by its ``children`` (a torch module) of a type met before in the walk is walked
#: from its parent's loop (no `other` frame, no table lookup; tests and bench_walk's module
#: ``fk.leaves(m)`` rows switch it off)
CHILDREN_INLINE = True


class _Elsewhere(Exception):
    """The tree holds something this walk leaves to the recording walk (another node kind, a
    depth beyond ``RECURSIVE_DEPTH``: a deep tree or a cycle)."""


def leaves_unrecorded(tree: Any) -> list[Any] | None:
    """The leaves of `tree` as ``fk.leaves`` lists them, or None when the recording walk must
    list them (see the module docstring: a small tree, a shared node, another node kind)."""
    if not LEAVES_WALK:
        return None
    t = type(tree)
    tables = TABLES[0]  # one snapshot of the node table for the whole walk
    _, disp, leaf_types, _, _ = tables
    if t is dict or t is list or t is tuple:
        if (t, len(tree)) in _plans.ROOTS:
            return None  # a small container tree: its generated matcher lists it
    else:
        nd = disp.get(t) or resolve(t, tables)
        if not isinstance(nd, NodeDef) or nd.children is None:
            return None
    # the built-in containers under the node table's own entries (a registration may replace them)
    dnd = disp.get(dict) or resolve(dict, tables)
    lnd = disp.get(list) or resolve(list, tables)
    tnd = disp.get(tuple) or resolve(tuple, tables)
    if not (
        isinstance(dnd, NodeDef)
        and isinstance(lnd, NodeDef)
        and isinstance(tnd, NodeDef)
        and (dnd.fast, lnd.fast, tnd.fast) == (DICT, LIST, TUPLE)
    ):
        return None
    flat: list[Any] = []
    nodes: list[Any] = []
    others: list[Any] = []  # the nodes walked by their `children` (not plannable)
    flat_append = flat.append
    nodes_append = nodes.append

    kids: dict[type, Any] = {}  # node type -> its ``children``, once `other` met it (this walk's snapshot)
    kids_get = kids.get

    def other(v: Any, depth: int) -> None:
        """A child of a type other than the three containers and the known leaf types: a leaf type
        met for the first time (resolved into the snapshot), or a node walked by its ``children``
        (a torch module: its parameters, buffers and submodules, no aux data made), met for the
        first time in this walk (`visit` calls its ``children`` itself from then on)."""
        nd = disp.get(type(v)) or resolve(type(v), tables)
        if not isinstance(nd, NodeDef):
            flat_append(v)
        elif nd.children is None:
            raise _Elsewhere  # a node kind whose children only its `flatten` lists
        else:
            others.append(v)
            if CHILDREN_INLINE:
                kids[type(v)] = nd.children
            visit(v, nd.children(v, False)[1], depth)

    # one membership test per leaf beats one C-level type pass per node on model-shaped trees
    # (two leaves a node): 0.75x the time, measured on bench_walk's 600-block tree
    def visit(c: Any, vals: Any, depth: int) -> None:
        nodes_append(c)
        if depth >= RECURSIVE_DEPTH:
            raise _Elsewhere
        depth += 1
        for v in vals:
            tv = type(v)
            if tv in leaf_types:
                flat_append(v)
            elif tv is dict:
                visit(v, v.values(), depth)
            elif tv is list or tv is tuple:
                visit(v, v, depth)
            else:
                ch = kids_get(tv)
                if ch is not None:  # a node of a kind met before (a torch module): its children only
                    visit(v, ch(v, False)[1], depth)
                else:
                    other(v, depth)

    try:
        try:
            if t is dict:
                visit(tree, tree.values(), 0)
            elif t is list or t is tuple:
                visit(tree, tree, 0)
            else:
                other(tree, 0)
        finally:
            visit = other = kids_get = None  # type: ignore[assignment]  # the closures refer to each other: break the cycle now
    except (_Elsewhere, RecursionError):
        return None
    except Exception:  # noqa: BLE001  # a node's `children` failed: the recording walk meets it again and names its path
        return None
    if all_distinct(flat + nodes):
        if not others and len(nodes) <= _plans.PLAN_NODES and _plannable(nodes, len(flat), leaf_types.issuperset):
            return None  # the plan cache plans for it: recorded, its matcher lists it from the next walk on
        return flat
    if not all_distinct(nodes):
        return None  # a node met twice: a shared sub-tree, which the recording walk records
    return distinct_leaves(flat)[0]


def _plannable(nodes: list[Any], npos: int, leaves_of: Any) -> bool:
    """Whether the recording of a tree of these `nodes` and `npos` leaves (no ties) would be
    planned: no more program entries (nodes, and leaves outside all-leaf nodes) than
    ``_plans.PLAN_NODES``."""
    inside = 0
    for c in nodes:
        vals = c.values() if type(c) is dict else c
        if leaves_of(map(type, vals)):
            inside += len(vals)
    return len(nodes) + npos - inside <= _plans.PLAN_NODES
