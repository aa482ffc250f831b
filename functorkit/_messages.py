"""The messages of the one engine: cycles, notes naming a path, two trees that differ."""

from __future__ import annotations

from typing import Any, NamedTuple

from ._errors import StructureError
from ._keypath import KeyPath, safe_repr
from ._registry import NodeDef, dispatch

__all__ = ["Described", "add_note", "describe_found", "mismatch"]

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


class Described(NamedTuple):
    """What sits at a place of a tree, for structure mismatch messages: a node's type name, its
    keys when they are names (a mapping's), its number of children; a leaf's type name with
    ``leaf=True``. ``str()`` gives the text (``dict keys {'a', 'b'}``, ``list of length 2``,
    ``leaf (int)``)."""

    type_name: str
    keys: tuple[Any, ...] | None
    length: int
    leaf: bool = False

    def __str__(self) -> str:
        if self.leaf:
            return f"leaf ({self.type_name})"
        if self.keys is not None:
            return f"{self.type_name} {self.key_text()}"
        return f"{self.type_name} of length {self.length}"

    def key_text(self) -> str:
        return f"keys {{{', '.join(safe_repr(k) for k in self.keys or ())}}}"


def describe_found(x: Any) -> Described:
    """What object `x` met in a tree is (for structure mismatch messages)."""
    nd = dispatch(x)
    if isinstance(nd, NodeDef):
        keys, vals, _aux, named = nd.flatten(x)
        return Described(type(x).__name__, tuple(keys) if named else None, len(vals))
    return Described(type(x).__name__, None, 0, leaf=True)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def mismatch(
    path: KeyPath,
    left: Described | str,
    right: Described | str,
    which: int = 1,
    names: tuple[str, ...] | None = None,
) -> StructureError:
    """The error for tree number `which` (0-based) differing from the first one at `path`
    (`left`: what the first tree has there, `right`: what this one has)."""
    ltype = left.type_name if isinstance(left, Described) and not left.leaf else None
    rtype = right.type_name if isinstance(right, Described) and not right.leaf else None
    rtext = str(right)
    if (
        ltype is not None
        and ltype == rtype
        and isinstance(left, Described)
        and isinstance(right, Described)
        and left.keys is not None
        and right.keys is not None
    ):
        rtext = right.key_text()[len("keys ") :]  # "dict keys {...} vs {...}"
    if names is not None and which < len(names):
        differs = f"`{names[which]}` differs from `{names[0]}` here"
    else:
        differs = f"the {_ordinal(which + 1)} tree differs from the first here"
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
        f"at {path.display}: {left} vs {rtext}\n{types}"
        "Every tree must have the structure of the first one (node types, keys, "
        f"lengths); {differs}. Fix that tree, or pass `is_leaf` to stop the walk "
        "above this point."
    )
    return StructureError(msg)
