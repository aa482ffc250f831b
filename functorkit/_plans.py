"""The one plan cache: what an operation worked out once for a tree definition, reused.

A model called in a loop (a small MLP mapped or flattened every step) pays each call's fixed
costs again: the walk, the analysis of `destructure`. For small trees made only of dicts,
lists and tuples this cache keeps, per recorded definition:

* a generated **matcher** (``_program_match.matcher``): from the second recording of one
  structure on, ``record_plain`` checks a tree against it (types, lengths, keys in order,
  leaves where leaves were, no two positions holding one object) instead of walking it
  (bench_walk's "(b) A small model" rows; tests/test_walk.py turns it off to see the
  difference);
* a generated **builder** (``_program_match.builder``) for the definition's rebuild, when it is
  small (`PLAN_MAX`);
* the **plans of operations** (`plan_for` / `keep_plan`), keyed by the definition, the
  operation (with its options: ``("destructure", policy)``) and the *facts* the plan was made
  from (`LeafFacts`: the type of every leaf; the dtype, shape, device and density of every
  array). The cache stores the facts with the plan and compares them at each lookup, so a plan
  is only reused for leaves it would decide the same for. An operation's plan must depend on
  nothing else: a new decision that reads another property of the leaves adds it to
  `LeafFacts` (one place), and every plan then keys on it.

Every entry holds the node-table snapshot (``TABLES[0]``) it was made under and is valid only
while that snapshot is published: a registration makes every plan stale. Nothing here is made
under ``torch.compile`` tracing (no ``compile()``/``exec`` then, ``adapters.tracing()``). The
cache is bounded (`_MAX` structures, then cleared) and holds each definition it plans for, so
the ``id`` it is indexed by stays that definition's. No module writes onto a `TreeDef`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._dense import may_be_sparse
from ._program import is_plain, num_entries
from ._program_match import builder, matcher
from ._registry import GEN, TABLES
from ._xp import is_array
from .adapters import adapter_of, tracing

if TYPE_CHECKING:
    from ._treedef import TreeDef

__all__ = [
    "PLAN_MAX",
    "PLANS",
    "PLAN_NODES",
    "ROOTS",
    "LeafFacts",
    "clear",
    "keep_plan",
    "match_of",
    "plan_for",
    "remember",
]

#: trees with more program entries than this (nodes, and leaves outside all-leaf nodes) are not
#: planned; a planned tree with more than PLAN_MAX positions and entries gets a matcher but no
#: generated builder (the definition's own build slices the leaves of an all-leaf node at once)
PLAN_NODES = 512
#: `plan_for` hands back kept plans (off: every call makes its full analysis; bench_flat's
#: ``destructure(model)`` on/off rows, tests/test_destructure_plan.py)
PLANS = [True]
#: the largest planned definition (program entries + positions) that also gets a generated builder:
#: model-shaped container trees (a few leaves per node) rebuild 1.3-1.6x faster by it (bench_walk's
#: 12-block rows; 5x for the rebuild alone), and wide ones no slower up to here, measured (fk.fmap
#: of dicts of lists of tuples of up to 3,111 entries and positions: 0.66-1.02x the definition's
#: rebuild); above, a generated function of 10,000 positions was 1.18x slower (the definition's
#: build slices an all-leaf node's leaves at once). Compiled once per structure, at its second
#: recording (1-5 ms at these sizes, less than its matcher)
PLAN_MAX = 2048
#: at most this many structures are kept (then the cache starts again)
_MAX = 256


class _Entry:
    """One planned definition: the snapshot it was made under, how often it was recorded, its
    generated matcher and builder (None until made), and the operations' ``(facts, plan)``."""

    __slots__ = ("build", "gen", "match", "ops", "seen", "tables", "td")

    def __init__(self, td: TreeDef, tables: Any) -> None:
        self.td = td
        self.tables = tables
        self.gen = tables[GEN]  # compared, not the snapshot itself (see ``_registry.GEN``)
        self.seen = 1
        self.match: Callable[..., Any] | None = None
        self.build: Callable[[list[Any]], Any] | None = None
        self.ops: dict[Any, tuple[LeafFacts, Any]] = {}


#: (root type, root length) -> the entry of the last definition recorded for such a root (read by
#: ``_record.record_plain``: its matcher, made under the published snapshot, tried before a walk)
_BY_ROOT: dict[tuple[type, int], _Entry] = {}
#: the root keys of `_BY_ROOT`, read by ``_leaves_walk`` (a tree whose root is planned for is matched)
ROOTS = _BY_ROOT.keys()
#: id(definition) -> its entry (the entry holds the definition, so the id stays its; read by
#: `match_of` and `plan_for`)
_BY_TD: dict[int, _Entry] = {}
#: the two lookups every small map makes, as flat tuples (a slot read costs more than an index):
#: (root type, root length) -> (matcher, snapshot, definition), read by ``_record.record_plain``;
#: id(definition) -> (builder, snapshot, definition), read by ``TreeDef.build``. Each holds its
#: definition (so the id stays its) and is set and dropped with its entry. A definition keeps the
#: builder and matcher it was handed (``TreeDef._gen_build``/``_gen_match``, its own slots) with
#: their snapshot, and uses them only while that snapshot is published.
MATCH_BY_ROOT: dict[tuple[type, int], tuple[Callable[..., Any], Any, TreeDef]] = {}
BUILD_BY_ID: dict[int, tuple[Callable[[list[Any]], Any], Any, TreeDef]] = {}


def clear() -> None:
    """Forget every plan (tests start from an empty cache)."""
    _BY_ROOT.clear()
    _BY_TD.clear()
    MATCH_BY_ROOT.clear()
    BUILD_BY_ID.clear()


def _entry(td: TreeDef) -> _Entry | None:
    """The entry of `td` if it is planned under the published node table."""
    e = _BY_TD.get(id(td))  # (an entry holds its definition: while it is here, no other object has that id)
    if e is None or e.gen != TABLES[0][GEN]:
        return None
    return e


# ---------------------------------------------------------------- the walk's matcher and builder


def remember(tree: Any, td: TreeDef, tables: Any, distinct: Callable[[list[Any]], bool], sort_from: int) -> None:
    """Note that `tree` (a dict, list or tuple root) was recorded as `td` under `tables` (the
    snapshot read before the walk); the second time one structure is met, make its matcher
    (and, small, its builder). `distinct` and `sort_from` are the walk's tie test and the size
    from which the matcher uses it."""
    if num_entries(td) > PLAN_NODES or not is_plain(td):
        return
    key = (type(tree), len(tree))
    e = _BY_ROOT.get(key)
    if e is None or e.gen != tables[GEN] or e.td != td:
        if tracing():  # under torch.compile an id() is a compile-time value that cannot be kept
            return
        if len(_BY_ROOT) >= _MAX:
            clear()
        if e is not None:
            _BY_TD.pop(id(e.td), None)
            BUILD_BY_ID.pop(id(e.td), None)
            MATCH_BY_ROOT.pop(key, None)
        e = _BY_ROOT[key] = _BY_TD[id(td)] = _Entry(td, tables)
        return
    e.seen += 1
    if e.match is None and e.seen >= 2 and not tracing():  # no compile()/exec under torch.compile
        known = e.td
        e.match = matcher(known, distinct, sort_from)
        MATCH_BY_ROOT[key] = (e.match, e.gen, known)
        if num_entries(known) + known.num_positions <= PLAN_MAX:
            e.build = builder(known)
            BUILD_BY_ID[id(known)] = (e.build, e.gen, known)


def match_of(td: TreeDef) -> Callable[..., Any] | None:
    """`td`'s generated ``match(tree, ties=True) -> leaves or MISS``, if it has one."""
    e = _entry(td)
    return None if e is None else e.match


# ---------------------------------------------------------------- operations' plans

_dtype_of = operator.attrgetter("dtype")
_shape_of = operator.attrgetter("shape")
_device_attr = operator.attrgetter("device")


class LeafFacts:
    """The facts about a definition's leaves that a plan may depend on: the type of every leaf;
    for the array leaves, whether all are dense (for libraries whose arrays may not be), their
    dtypes and shapes, and their devices (for libraries with several). Leaves with equal facts are
    decided alike by every planned operation."""

    __slots__ = ("arrays", "device_attr", "devices", "dtypes", "multi_device", "shapes", "sparse", "types")

    def __init__(self, leaves: list[Any]) -> None:
        self.types: tuple[type, ...] | None = tuple(map(type, leaves))
        # which leaves are arrays, and what their libraries can vary, follow from the types
        self.arrays = [j for j, x in enumerate(leaves) if is_array(x)]
        xs = list(map(leaves.__getitem__, self.arrays))
        ads = [adapter_of(x) for x in dict(zip(map(type, xs), xs)).values()]
        self.multi_device = not all(ad.one_device for ad in ads)
        # (libraries whose `device` is the ``device`` attribute: read in one C-level pass)
        self.device_attr = all(ad.device_attr for ad in ads)
        self.sparse = may_be_sparse(xs)  # torch: a sparse or nested tensor may come in at a later call
        if self.sparse and adapter_of(xs[0]).first_not_dense(xs) is not None:
            self.types = None  # (a constant that is not dense: such leaves are never planned for)
            return
        self.dtypes = list(map(_dtype_of, xs))
        self.shapes = list(map(_shape_of, xs))
        self.devices = self._devices(xs) if self.multi_device else None

    def hold(self, leaves: list[Any]) -> bool:
        """Whether `leaves` have these facts (compared in that order, density before shapes: a
        nested tensor has no shape to read)."""
        if self.types is None or tuple(map(type, leaves)) != self.types:
            return False
        # (every leaf an array, as a model's parameters: the leaves themselves)
        xs = leaves if len(self.arrays) == len(leaves) else list(map(leaves.__getitem__, self.arrays))
        if not xs:
            return True
        if self.sparse and adapter_of(xs[0]).first_not_dense(xs) is not None:
            return False
        return (
            list(map(_dtype_of, xs)) == self.dtypes
            and list(map(_shape_of, xs)) == self.shapes
            and (self.devices is None or self._devices(xs) == self.devices)
        )

    def _devices(self, xs: list[Any]) -> list[Any]:
        if self.device_attr:
            return list(map(_device_attr, xs))
        return [adapter_of(x).device(x) for x in xs]


def plan_for(td: TreeDef, op: Any, leaves: list[Any]) -> Any:
    """The plan kept for operation `op` on `td`, if `leaves` have the facts it was made from; else None."""
    e = _entry(td)
    if e is None or not PLANS[0]:
        return None
    hit = e.ops.get(op)
    if hit is None or not hit[0].hold(leaves):
        return None
    return hit[1]


def keep_plan(td: TreeDef, op: Any, leaves: list[Any], plan: Any, *, own: bool = False) -> None:
    """Keep `plan` for operation `op` on `td`, made from `leaves`, when `td` is a definition the
    walk reuses (a small container tree met before); otherwise nothing. `own`: also for any
    definition of at most `PLAN_NODES` entries that an operation holds and matches trees against
    itself, without a walk (``re.flatten``: its rebuilder's definition, met again at every call)."""
    e = _entry(td)
    if e is None and own and num_entries(td) <= PLAN_NODES and not tracing():
        if len(_BY_TD) >= _MAX:
            clear()
        e = _BY_TD[id(td)] = _Entry(td, TABLES[0])
    if e is not None and (own or e.match is not None):
        e.ops[op] = (LeafFacts(leaves), plan)
