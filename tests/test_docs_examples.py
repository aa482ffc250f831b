"""Every python code block of every docs page (and the README) runs, page by page.

One test per page (`test_page_examples_run[docs/lbfgs.md]`): the page's ```python and ```pycon
blocks run in order as one script in one namespace, so a later block may use what an earlier one
defined, as a reader copying them in order would. Each page runs in a fresh interpreter (this file
run as a script, from an empty directory), so nothing leaks into it from the test process or from
another page: no module imported, no name defined, no class registered beforehand. A ```pycon block
(or a ```python block whose first line is a `>>>` prompt) runs as a doctest: its outputs are checked.
New pages are picked up automatically.

A page that needs a library beyond functorkit's own dependencies (NumPy, array-api-compat)
declares it on a line of its own, usually the first:

    <!-- requires: torch, scipy -->

The test is skipped, with the missing name in the reason, only when a declared library is not
installed; a page that imports an undeclared library fails (so no page is ever skipped
silently, and none fails only on machines without that library). The docs session of the
noxfile installs every declared library and sets FUNCTORKIT_DOCS_REQUIRE_ALL=1, under which a
missing library fails instead of skipping: there every page runs.
"""

from __future__ import annotations

import ast
import doctest
import importlib.util
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# what a page may import without declaring it: functorkit and its own dependencies
BUILTIN_OK = {"functorkit", "numpy", "array_api_compat", *sys.stdlib_module_names}
# the example scripts are files of this repository (run from the repository root)
LOCAL_OK = {"examples"}

_FENCE = re.compile(r"^```(python|pycon)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_REQUIRES = re.compile(r"^<!--\s*requires:\s*(.*?)\s*-->\s*$", re.MULTILINE)
_OPTIONFLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _blocks(text: str) -> list[tuple[int, str, bool]]:
    """(line number, source, is a doctest) of each python/pycon block, in page order."""
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(2), m.group(1) == "pycon" or _starts_with_prompt(m.group(2)))
        for m in _FENCE.finditer(text)
    ]


def _requires(text: str) -> list[str]:
    names: list[str] = []
    for m in _REQUIRES.finditer(text):
        names += [n.strip() for n in m.group(1).split(",") if n.strip()]
    return names


def _starts_with_prompt(block: str) -> bool:
    first = next((line for line in block.splitlines() if line.strip()), "")
    return first.lstrip().startswith(">>>")


def _imported(block: str, is_doctest: bool) -> set[str]:
    """Top-level module names a block imports."""
    if is_doctest:
        examples = doctest.DocTestParser().get_examples(block)
        source = "\n".join(e.source for e in examples)
    else:
        source = block
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def _rel(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


PAGES_WITH_CODE = [p for p in PAGES if _blocks(p.read_text(encoding="utf-8"))]


def test_pages_found() -> None:
    names = {_rel(p) for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/index.md", "docs/lbfgs.md", "docs/treedef.md"} <= names


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_rel)
def test_page_declares_its_imports(page: Path) -> None:
    """Every library a page imports beyond functorkit's dependencies is in its requires line."""
    text = page.read_text(encoding="utf-8")
    imported: set[str] = set()
    for _, block, is_doctest in _blocks(text):
        imported |= _imported(block, is_doctest)
    undeclared = sorted(imported - BUILTIN_OK - LOCAL_OK - set(_requires(text)))
    assert not undeclared, (
        f"{_rel(page)} imports {undeclared} without declaring them: add "
        f"'<!-- requires: {', '.join(undeclared)} -->' at the top of the page"
    )


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_rel)
def test_page_examples_run(page: Path, tmp_path: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [name for name in _requires(text) if importlib.util.find_spec(name) is None]
    if missing and os.environ.get("FUNCTORKIT_DOCS_REQUIRE_ALL") == "1":
        pytest.fail(f"{_rel(page)} requires {', '.join(missing)}, not installed (FUNCTORKIT_DOCS_REQUIRE_ALL=1)")
    if missing:
        pytest.skip(f"{_rel(page)} requires {', '.join(missing)}, not installed")
    # a fresh interpreter per page, in an empty directory (a page that writes files writes them
    # there); the repository root on the path for `import functorkit` and `from examples.x import ...`
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-X", "utf8", __file__, str(page)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{_rel(page)}'s examples failed:\n{done.stdout}\n{done.stderr}"


def run_page(page: Path) -> int:
    """Run `page`'s blocks in order in one fresh namespace (this process must be fresh: run as a
    script); warnings are errors, as in the test suite. Returns the number of failures."""
    text = page.read_text(encoding="utf-8")
    warnings.simplefilter("error")
    # torch's own forward-AD setup (torch.md's jvp) scripts decompositions with the deprecated torch.jit.script
    warnings.filterwarnings("ignore", "`torch.jit.script", DeprecationWarning)
    namespace: dict[str, object] = {"__name__": "__main__"}
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=_OPTIONFLAGS)
    for line, block, is_doctest in _blocks(text):
        where = f"{_rel(page)}, python block at line {line}"
        if is_doctest:
            test = parser.get_doctest(block, namespace, where, str(page), line - 1)
            test.globs = namespace  # DocTest copies its globs; the page shares one namespace
            result = runner.run(test, clear_globs=False)
            if result.failed:
                print(f"{result.failed} doctest example(s) failed in {where} (output above)")
                return result.failed
            continue
        try:
            exec(compile(block, where, "exec"), namespace)
        except Exception:  # noqa: BLE001 -- reported to the test in the parent process
            traceback.print_exc()
            print(f"in {where}:\n{block}")
            return 1
    return 0


@pytest.mark.parametrize("page", [ROOT / "docs" / "index.md", ROOT / "README.md"], ids=_rel)
def test_home_page_code_fits_88_columns(page: Path) -> None:
    """The code a newcomer copies first reads without horizontal scrolling."""
    text = page.read_text(encoding="utf-8")
    long = [
        f"line {text.count(chr(10), 0, m.start()) + 2 + i}: {line}"
        for m in re.finditer(r"^```[a-z]*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
        for i, line in enumerate(m.group(1).splitlines())
        if len(line) > 88
    ]
    assert not long, f"{_rel(page)} has code lines over 88 columns:\n" + "\n".join(long)


def _nav() -> list[tuple[int, str]]:
    """(indent, entry text) of each line of mkdocs.yml's nav."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    block = text.split("\nnav:\n", 1)[1]
    out = []
    for line in block.splitlines():
        if not line.startswith(" "):
            break
        if line.strip().startswith("- "):
            out.append((len(line) - len(line.lstrip()), line.strip()[2:]))
    return out


def test_docs_navigation_is_grouped_and_lists_every_page() -> None:
    """The nav is a map (a few sections, each page under one), and no page is left out of it."""
    nav = _nav()
    top = min(indent for indent, _ in nav)
    sections = [entry for indent, entry in nav if indent == top]
    assert sections == ["Getting started:", "Guides:", "Tutorials:", "Reference:", "Project:"]
    listed = [entry.rsplit(": ", 1)[1] for indent, entry in nav if indent > top]
    assert len(listed) == len(set(listed)), "a page is listed twice"
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(listed) == pages, "add each docs page to one section of mkdocs.yml's nav"


if __name__ == "__main__":
    sys.exit(1 if run_page(Path(sys.argv[1])) else 0)
