"""Imports point one way (issue #21, item 3; docs/adapters.md, "Import layering").

The graph is read from the source with `ast`, not from ``sys.modules``: every ``import`` and
``from ... import`` of a functorkit module, in every functorkit module, as one of

* module-level: run when the module is imported (also inside a top-level ``try``/``if``/class
  body);
* lazy: inside a function body, run at the first call; and every string constant that is the
  full name of a functorkit module (``"functorkit.adapters.torch"`` in the family table): a
  module named by a string is imported by that name later (`load_family`, ``importlib``).

Together they form a DAG: no circle at all, lazy imports included. Imports under
``if TYPE_CHECKING:`` never run and are not edges. Importing ``functorkit.adapters.x`` runs
``functorkit/adapters/__init__.py`` first, so a sub-package's ``__init__`` is an edge too
(except where a module inside the package imports one of its siblings: its own packages are
imported before it runs; importing a *name* of its package, ``from . import adapter_of``, is an
edge); the root ``functorkit/__init__.py`` (the public facade, above every module) is left out,
as every submodule import passes through it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "functorkit"
ROOT = "functorkit"


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
        named = name
        while name and name not in mods:  # `from .x import f`: f is a name of module .x
            name = name.rpartition(".")[0]
        if name != named and name != ROOT and name != a and name.startswith(ROOT + "."):
            # a name defined in module or package `name` is imported: an edge, even from inside
            edges.setdefault((a, name), set()).add(kind)
        while name and name != ROOT:  # importing a.b.c runs a.b's __init__ (the root left out)
            # the importer's own packages are imported before it: not edges
            if name != a and name.startswith(ROOT + ".") and not a.startswith(name + "."):
                edges.setdefault((a, name), set()).add(kind)
            name = name.rpartition(".")[0]

    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for c in ast.walk(tree):  # a module named by a string is imported by that name, later
            if isinstance(c, ast.Constant) and type(c.value) is str and c.value in mods and c.value != mod:
                add(mod, c.value, "lazy")
        for node, lazy in _imports(tree):
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
    # a module-level import, one through a sub-package, a lazy one, and a module named by a string
    assert "module" in g[("functorkit._xp", "functorkit.adapters")]
    assert "module" in g[("functorkit._alias", "functorkit.adapters._base")]
    assert g[("functorkit.adapters.torch", "functorkit._classify")] == {"lazy"}
    assert g[("functorkit.adapters._families", "functorkit.adapters.torch")] == {"lazy"}
    # a name of the own package is an edge; a sibling module alone is not one to the package
    assert "module" in g[("functorkit.adapters", "functorkit.adapters._families")]
    assert ("functorkit.adapters.torch", "functorkit.adapters") not in g
    # TYPE_CHECKING imports are not edges (_program_match names TreeDef only for the type checker)
    assert ("functorkit._program_match", "functorkit._treedef") not in g
    assert len(_nodes(g)) > 40


def test_own_package_names_and_strings_are_edges(tmp_path: Path) -> None:
    pkg = tmp_path / "functorkit"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .low import f\n")
    (pkg / "sub" / "low.py").write_text("def g():\n    from . import f\n")
    (pkg / "sub" / "table.py").write_text("ROWS = ('functorkit.sub.low',)\n")
    (pkg / "sub" / "sibling.py").write_text("from .low import f\n")
    mods = {
        "functorkit": pkg / "__init__.py",
        "functorkit.sub": pkg / "sub" / "__init__.py",
        "functorkit.sub.low": pkg / "sub" / "low.py",
        "functorkit.sub.table": pkg / "sub" / "table.py",
        "functorkit.sub.sibling": pkg / "sub" / "sibling.py",
    }
    g = import_graph(mods)
    assert g[("functorkit.sub.low", "functorkit.sub")] == {"lazy"}  # `from . import f`: the package's name
    assert g[("functorkit.sub.table", "functorkit.sub.low")] == {"lazy"}  # named by a string
    assert ("functorkit.sub.sibling", "functorkit.sub") not in g  # a sibling only
    assert strongly_connected(_nodes(g), set(g)) == [{"functorkit.sub", "functorkit.sub.low"}]


def test_cycle_finder_finds_circles() -> None:
    nodes = {"a", "b", "c", "d", "e"}
    assert strongly_connected(nodes, {("a", "b"), ("b", "c"), ("c", "d")}) == []
    got = strongly_connected(nodes, {("a", "b"), ("b", "c"), ("c", "a"), ("d", "e"), ("e", "d")})
    assert sorted(map(sorted, got)) == [["a", "b", "c"], ["d", "e"]]


def test_no_circle_at_all() -> None:
    """Module-level, lazy and string-named imports together form a DAG."""
    g = import_graph()
    circles = strongly_connected(_nodes(g), set(g))
    assert not circles, f"import circles (import downward, or hand the function down): {circles}"


def test_module_level_imports_form_a_dag() -> None:
    g = import_graph()
    module_level = {e for e, kinds in g.items() if "module" in kinds}
    assert strongly_connected(_nodes(g), module_level) == []


def _family_modules() -> list[str]:
    return sorted(f"{ROOT}.adapters.{p.stem}" for p in (PKG / "adapters").glob("*.py") if not p.stem.startswith("_"))


def test_a_family_is_one_module_and_one_row() -> None:
    """Each public module of ``adapters/`` is the adapter of one row of ``FAMILIES``, and no other
    module names it (by import or string) but the family table and the family modules: adding a
    backend is its module and its row."""
    from functorkit.adapters import FAMILIES

    rows = [f.adapter for f in FAMILIES]
    assert sorted(rows) == _family_modules()
    families = set(rows)
    g = import_graph()
    outside = sorted((a, b) for a, b in g if b in families and a not in families | {f"{ROOT}.adapters._families"})
    assert outside == [], f"only the family table names a family module: {outside}"


def test_the_adapters_do_not_reach_up() -> None:
    """The family modules and the modules below them import no module above the family table."""
    g = import_graph()
    below = set(_family_modules())
    frontier = list(below)
    while frontier:  # everything the family modules import, transitively
        m = frontier.pop()
        for a, b in g:
            if a == m and b not in below:
                below.add(b)
                frontier.append(b)
    above = {f"{ROOT}.adapters", f"{ROOT}.adapters._families", f"{ROOT}._registry", f"{ROOT}._xp"}
    assert below & above == set()


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("functorkit.adapters._base", "functorkit._xp"),  # same_device lives in adapters/_device.py
        ("functorkit._treedef_json", "functorkit._treedef"),  # from_json receives the constructor
        ("functorkit._stdnodes", "functorkit._registry"),  # std_nodes/attrs_def receive NodeDef/_dataclass_def
        ("functorkit.adapters._base", "functorkit.adapters.torch"),  # the table is in _families, above
        ("functorkit.adapters._pytree_keys", "functorkit._registry"),  # export receives lookup
        ("functorkit.adapters._pytree_keys", "functorkit._treedef"),  # aux_equal is in _nodedef
        ("functorkit.adapters.torch", "functorkit._xp"),  # the caches it warms are in _classify
        ("functorkit._holders", "functorkit._record"),  # _record hands its walk down (use_walk)
        ("functorkit._inplace", "functorkit._lockstep"),  # run_out receives check_same
        ("functorkit._persist", "functorkit._flat"),  # _flat hands Restructure._make down
    ],
)
def test_removed_back_edges_stay_removed(importer: str, imported: str) -> None:
    assert (importer, imported) not in import_graph()
