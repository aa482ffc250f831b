"""Imports point one way (issue #21, item 3; docs/adapters.md, "Import layering").

The graph is read from the source with `ast`, not from ``sys.modules``: every ``import`` and
``from ... import`` of a functorkit module, in every functorkit module, as one of

* module-level: run when the module is imported (also inside a top-level ``try``/``if``/class
  body). These must form a DAG: no circle at all.
* lazy: inside a function body, run at the first call. A lazy import that closes a circle is a
  back-edge; each one is listed in `LAZY_BACK_EDGES` below, and that list may only shrink: the
  graph without the listed edges has no circle (a new back-edge fails), and each listed edge,
  put back alone, closes one (a listed edge that no longer does fails: take it off).

Imports under ``if TYPE_CHECKING:`` never run and are not edges. Importing
``functorkit.adapters.x`` runs ``functorkit/adapters/__init__.py`` first, so a sub-package's
``__init__`` is an edge too (except from a module inside it: its own packages are imported
before it runs); the root ``functorkit/__init__.py`` (the public facade, above every
module) is left out, as every submodule import passes through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "functorkit"
ROOT = "functorkit"

# Lazy imports that still close a circle, as (importer, imported). Shrink only.
LAZY_BACK_EDGES = {
    # the family table in adapters/_base loads a backend's adapter at the first array of that
    # backend (``import functorkit`` stays backend-free); each adapter builds on ArrayAdapter there.
    # (An adapter's own lazy imports, e.g. adapters.torch -> _xp to warm the core's caches, close
    # a circle only through these, so they are not listed; they will be once these go.)
    ("functorkit.adapters._base", "functorkit.adapters.numpy"),
    ("functorkit.adapters._base", "functorkit.adapters.torch"),
    ("functorkit.adapters._base", "functorkit.adapters._torch_probe"),
    ("functorkit.adapters._base", "functorkit.adapters.jax"),
    ("functorkit.adapters._base", "functorkit.adapters.cupy"),
    ("functorkit.adapters._base", "functorkit.adapters.dask"),
    ("functorkit.adapters._base", "functorkit.adapters._pytree_jax"),
    ("functorkit.adapters._base", "functorkit.adapters._pytree_optree"),
    ("functorkit.adapters._base", "functorkit.adapters._pytree_torch"),
    # the holder check looks inside a registered container with the walk that calls it
    ("functorkit._holders", "functorkit._record"),
    # ops that reach a heavier module on a rare path (out=, pickling a Restructure)
    ("functorkit._lockstep", "functorkit._inplace"),
    ("functorkit._flat", "functorkit._persist"),
}


def _modules() -> dict[str, Path]:
    mods = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = p
    return mods


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it is lazy (inside a function); TYPE_CHECKING left out."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit_one(sub, lazy)
                continue
            visit_one(child, lazy)

    def visit_one(child: ast.AST, lazy: bool) -> None:
        if isinstance(child, ast.Import | ast.ImportFrom):
            found.append((child, lazy))
        visit(child, lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    visit(tree, False)
    return found


def import_graph(mods: dict[str, Path] | None = None) -> dict[tuple[str, str], set[str]]:
    """(importer, imported) -> {"module", "lazy"}: how the importer imports it."""
    mods = _modules() if mods is None else mods
    edges: dict[tuple[str, str], set[str]] = {}

    def add(a: str, name: str, kind: str) -> None:
        while name and name not in mods:  # `from .x import f`: f is a name of module .x
            name = name.rpartition(".")[0]
        while name and name != ROOT:  # importing a.b.c runs a.b's __init__ (the root left out)
            # the importer's own packages are imported before it: not edges
            if name != a and name.startswith(ROOT + ".") and not a.startswith(name + "."):
                edges.setdefault((a, name), set()).add(kind)
            name = name.rpartition(".")[0]

    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node, lazy in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            kind = "lazy" if lazy else "module"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(mod, alias.name, kind)
                continue
            base = node.module or ""
            if node.level:
                pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            for alias in node.names:
                add(mod, f"{base}.{alias.name}", kind)
    return edges


def strongly_connected(nodes: set[str], edges: set[tuple[str, str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (the circles), iteratively."""
    adj: dict[str, list[str]] = {n: [] for n in nodes}
    for a, b in edges:
        adj[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on.add(v)
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def _nodes(edges: dict[tuple[str, str], set[str]]) -> set[str]:
    return {m for e in edges for m in e}


def test_the_graph_is_read() -> None:
    g = import_graph()
    # a module-level import, one through a sub-package, and a lazy one, all seen
    assert "module" in g[("functorkit._xp", "functorkit.adapters._base")]
    assert "module" in g[("functorkit._xp", "functorkit.adapters")]
    assert g[("functorkit.adapters.torch", "functorkit._xp")] == {"lazy"}
    # TYPE_CHECKING imports are not edges (_program_match names TreeDef only for the type checker)
    assert ("functorkit._program_match", "functorkit._treedef") not in g
    assert len(_nodes(g)) > 40


def test_cycle_finder_finds_circles() -> None:
    nodes = {"a", "b", "c", "d", "e"}
    assert strongly_connected(nodes, {("a", "b"), ("b", "c"), ("c", "d")}) == []
    got = strongly_connected(nodes, {("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"), ("e", "d")})
    assert sorted(map(sorted, got)) == [["a", "b", "c"], ["d", "e"]]


def test_module_level_imports_form_a_dag() -> None:
    g = import_graph()
    module_level = {e for e, kinds in g.items() if "module" in kinds}
    assert strongly_connected(_nodes(g), module_level) == []


def test_lazy_back_edges_only_shrink() -> None:
    g = import_graph()
    nodes = _nodes(g)
    gone = sorted(e for e in LAZY_BACK_EDGES if g.get(e) != {"lazy"})
    assert not gone, f"no longer lazy-only imports: take them off LAZY_BACK_EDGES: {gone}"
    rest = set(g) - LAZY_BACK_EDGES
    circles = strongly_connected(nodes, rest)
    assert not circles, f"import circles (a new lazy back-edge? import downward instead): {circles}"
    idle = sorted(e for e in LAZY_BACK_EDGES if not strongly_connected(nodes, rest | {e}))
    assert not idle, f"these lazy imports no longer close a circle: take them off LAZY_BACK_EDGES: {idle}"


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("functorkit.adapters._base", "functorkit._xp"),  # same_device lives in adapters/_device.py
        ("functorkit._treedef_json", "functorkit._treedef"),  # from_json receives the constructor
        ("functorkit._stdnodes", "functorkit._registry"),  # std_nodes/attrs_def receive NodeDef/_dataclass_def
    ],
)
def test_removed_back_edges_stay_removed(importer: str, imported: str) -> None:
    assert (importer, imported) not in import_graph()
