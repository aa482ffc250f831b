"""Every python code block of every docs page (and the README) runs, page by page.

One test per page (`test_page_examples_run[docs/lbfgs.md]`): the page's ```python and ```pycon
blocks run in order as one script in one namespace, so a later block may use what an earlier one
defined, as a reader copying them in order would. A ```pycon block (or a ```python block whose
first line is a `>>>` prompt) runs as a doctest: its outputs are checked. New pages are picked up
automatically.

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
import sys
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


# torch's own forward-AD setup (torch.md's jvp) scripts decompositions with the deprecated torch.jit.script
@pytest.mark.filterwarnings("ignore:`torch.jit.script:DeprecationWarning")  # script, script_method (Inductor)
@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_rel)
def test_page_examples_run(page: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    text = page.read_text(encoding="utf-8")
    missing = [name for name in _requires(text) if importlib.util.find_spec(name) is None]
    if missing and os.environ.get("FUNCTORKIT_DOCS_REQUIRE_ALL") == "1":
        pytest.fail(f"{_rel(page)} requires {', '.join(missing)}, not installed (FUNCTORKIT_DOCS_REQUIRE_ALL=1)")
    if missing:
        pytest.skip(f"{_rel(page)} requires {', '.join(missing)}, not installed")
    monkeypatch.syspath_prepend(str(ROOT))  # `from examples.x import ...`
    monkeypatch.chdir(tmp_path)  # a page that writes files writes them here
    namespace: dict[str, object] = {"__name__": "__main__"}
    parser = doctest.DocTestParser()
    runner = doctest.DocTestRunner(optionflags=_OPTIONFLAGS)
    for line, block, is_doctest in _blocks(text):
        where = f"{_rel(page)}, python block at line {line}"
        if is_doctest:
            test = parser.get_doctest(block, namespace, where, str(page), line - 1)
            test.globs = namespace  # DocTest copies its globs; the page shares one namespace
            with warnings.catch_warnings():
                # doctest's runner swaps sys.stdout; warnings still fail the test
                warnings.simplefilter("error")
                warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
                result = runner.run(test, clear_globs=False)
            assert result.failed == 0, f"{result.failed} doctest example(s) failed in {where} (output above)"
            continue
        try:
            exec(compile(block, where, "exec"), namespace)
        except Exception as e:
            e.add_note(f"in {where}:\n{block}")
            raise


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
