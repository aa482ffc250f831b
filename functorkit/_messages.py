"""The messages of the one engine: cycles, notes naming a path, two trees that differ."""

from __future__ import annotations

from typing import Any

from ._errors import StructureError
from ._keypath import KeyPath, safe_repr
from ._registry import NodeDef, dispatch

__all__ = ["add_note", "describe_found", "mismatch"]

# node entry fields (the layout of a TreeDef program entry, see _treedef.py)
_ND, _KEYS, _N, _LEAFY, _AUX, _NAMED = range(6)


def add_note(e: BaseException, note: str) -> None:
    """Attach `note` to `e` (shown under its traceback), once."""
    notes = getattr(e, "__notes__", None)
    if notes is None or note not in notes:
        e.add_note(note)


def _visiting(path: KeyPath) -> str:
    return f"(functorkit: raised while visiting {path.display})"


def _cycle(path: KeyPath, obj: Any) -> StructureError:
    msg = (
        f"at {path.display}: found a cycle: this {type(obj).__name__} is one of its own "
        "ancestors. Expected a tree (or a DAG with shared sub-trees); break the cycle, "
        "or stop the walk at the back-reference with `is_leaf`."
    )
    return StructureError(msg)


def describe_found(x: Any) -> str:
    """A short description of an object met in a tree (for structure mismatch messages)."""
    nd = dispatch(x)
    if isinstance(nd, NodeDef):
        keys, vals, _aux, named = nd.flatten(x)
        if named:
            return f"{type(x).__name__} keys {{{', '.join(safe_repr(k) for k in keys)}}}"
        return f"{type(x).__name__} of length {len(vals)}"
    return f"leaf ({type(x).__name__})"


def _describe_entry(e: tuple[Any, ...]) -> str:
    nd = e[_ND]
    name = nd.cls.__name__
    if e[_NAMED]:
        return f"{name} keys {{{', '.join(safe_repr(k) for k in e[_KEYS])}}}"
    return f"{name} of length {e[_N]}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _type_named(desc: str) -> str | None:
    """The type named by a `describe_found` text (``Linear keys {...}``, ``list of length 2``), or None."""
    for sep in (" keys {", " of length "):
        head, found, _ = desc.partition(sep)
        if found:
            return head
    return None


def mismatch(
    path: KeyPath, left: str, right: str, which: int = 1, names: tuple[str, ...] | None = None
) -> StructureError:
    """The error for tree number `which` (0-based) differing from the first one at `path`."""
    lhead, sep, _ = left.partition(" keys ")
    if sep and right.startswith(lhead + sep):
        right = right[len(lhead + sep) :]  # "dict keys {...} vs {...}"
    if names is not None and which < len(names):
        differs = f"`{names[which]}` differs from `{names[0]}` here"
    else:
        differs = f"the {_ordinal(which + 1)} tree differs from the first here"
    ltype, rtype = _type_named(left), _type_named(right)
    types = ""
    if ltype is not None and rtype is not None and ltype != rtype:
        types = (
            f"The node types differ ({ltype} vs {rtype}): a node matches only a node of its own type, "
            "whatever its keys."
        )
        if "dict" in (ltype, rtype) or "OrderedDict" in (ltype, rtype):
            types += (
                " To load a flat mapping of dotted keys (a state dict) into a model, use "
                "fk.load_state_dict(model, mapping)."
            )
        types += "\n"
    msg = (
        f"at {path.display}: {left} vs {right}\n{types}"
        "Every tree must have the structure of the first one (node types, keys, "
        f"lengths); {differs}. Fix that tree, or pass `is_leaf` to stop the walk "
        "above this point."
    )
    return StructureError(msg)
