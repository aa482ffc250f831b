"""The compiled form of a `TreeDef`: a generated straight-line rebuild function.

``re(p)`` runs generated code: one statement per node of the tree
definition's program, literal keys, the parameter views of ``p`` fused in
front (the adapter of the flat vector's namespace writes those lines). Only
validated values reach the source text: offsets and shapes are ``int``s,
dict keys are written as literals only when they are exactly ``str`` or
``int``; everything else (node classes, aux data, other keys, constants)
is passed in as a global. The source is registered with `linecache`,
so a traceback through it shows the generated line.
"""

from __future__ import annotations

import linecache
from types import CodeType
from typing import TYPE_CHECKING, Any

from ._program import fold
from ._registry import DICT, LIST, TUPLE, NodeDef

if TYPE_CHECKING:
    from ._treedef import TreeDef

__all__ = ["CODEGEN_MAX", "build_source", "compile_source", "entry_of_error"]

#: programs longer than this are run by the tree definition's interpreter instead
CODEGEN_MAX = 4000
_CODE_CACHE: dict[str, tuple[CodeType, str]] = {}
_CODE_CACHE_MAX = 256


def compile_source(src: str) -> tuple[CodeType, str]:
    """``compile(src)`` and its file name, cached by source text and registered with linecache."""
    hit = _CODE_CACHE.get(src)
    if hit is not None:
        return hit
    if len(_CODE_CACHE) >= _CODE_CACHE_MAX:
        _CODE_CACHE.clear()
    filename = f"<functorkit generated {len(src)}:{hash(src) & 0xFFFFFFFF:08x}>"
    code = compile(src, filename, "exec")
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    _CODE_CACHE[src] = (code, filename)
    return code, filename


def _literal_key(k: Any) -> str | None:
    """A safe source literal for a dict key (exact ``str`` or ``int`` only), else None."""
    if type(k) is str or (type(k) is int and -(10**18) < k < 10**18):
        return repr(k)
    return None


def build_source(td: TreeDef, leaf_expr: list[str], glb: dict[str, Any], entries: list[int]) -> list[str]:
    """Statements (indented 4) building the tree of `td`; ``leaf_expr[j]`` is the expression of leaf `j`.

    Ends in ``return``. Every name a statement needs that is not a literal goes into `glb`;
    ``entries[i]`` receives the program entry of line ``i`` (-1 for none), so an error raised
    by a line can name its node's path.
    """
    lines: list[str] = []

    def leaf(_p: int, j: int) -> str:
        return leaf_expr[j]

    def node(idx: int, nd: NodeDef, keys: Any, aux: Any, exprs: list[str]) -> str:
        name = f"n{idx}"
        if nd.fast == DICT:
            parts = []
            for j, (k, x) in enumerate(zip(keys, exprs, strict=True)):
                lit = _literal_key(k)
                if lit is None:
                    lit = f"k{idx}_{j}"
                    glb[lit] = k
                parts.append(f"{lit}: {x}")
            lines.append(f"    {name} = {{{', '.join(parts)}}}")
        elif nd.fast == LIST:
            lines.append(f"    {name} = [{', '.join(exprs)}]")
        elif nd.fast == TUPLE:
            lines.append(f"    {name} = ({''.join(x + ', ' for x in exprs)})")
        else:
            glb[f"U{idx}"] = nd.unflatten
            glb[f"A{idx}"] = aux
            glb[f"K{idx}"] = keys if keys is not None else list(range(len(exprs)))
            lines.append(f"    {name} = U{idx}(A{idx}, list(K{idx}), [{', '.join(exprs)}])")
        entries.append(idx)
        return name

    root = fold(td, leaf, node)  # a shared sub-tree met again is the name made at its first place
    lines.append(f"    return {root}")
    entries.append(-1)
    return lines


def entry_of_error(e: BaseException, filename: str, line_entry: dict[int, int]) -> int | None:
    """The program entry whose generated line (in `filename`) raised `e`, or None."""
    tb = e.__traceback__
    found = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            found = line_entry.get(tb.tb_lineno)
        tb = tb.tb_next
    return found
