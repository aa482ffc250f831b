"""KeyPath: where a value sits inside a tree."""

from __future__ import annotations

from typing import Any

__all__ = ["KeyPath", "format_entry"]


def format_entry(key: Any, first: bool) -> str:
    """Render one path entry: ``.name``, ``[0]`` or ``['some key']``."""
    if type(key) is str and key.isidentifier():
        return key if first else "." + key
    if type(key) is int:
        return f"[{key}]"
    return f"[{key!r}]"


class KeyPath(tuple):  # type: ignore[type-arg]
    """An immutable, hashable, picklable path of keys from a tree's root.

    Entries are the keys a node gives its children: dict keys, attribute or
    field names, sequence indices. ``str()`` renders identifier strings as
    ``.name`` (no dot at the start), integers as ``[i]`` and any other key
    as ``[repr(key)]``; the root path is ``""`` and shows as ``<root>`` in
    messages.

    Examples
    --------
    >>> import functorkit as fk
    >>> tree = {"layers": [{"weight": 1.0}, {"weight": 2.0}]}
    >>> path = fk.KeyPath(("layers", 1, "weight"))
    >>> str(path)
    'layers[1].weight'
    >>> path.get(tree)
    2.0
    """

    __slots__ = ()

    def __new__(cls, entries: Any = ()) -> KeyPath:
        return super().__new__(cls, entries)

    def __str__(self) -> str:
        return "".join(format_entry(k, i == 0) for i, k in enumerate(self))

    def __repr__(self) -> str:
        return f"KeyPath({tuple(self)!r})"

    def __add__(self, other: Any) -> KeyPath:  # type: ignore[override]
        return KeyPath(tuple(self) + tuple(other))

    def __getitem__(self, index: Any) -> Any:
        out = super().__getitem__(index)
        return KeyPath(out) if isinstance(index, slice) else out

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyPath, (tuple(self),))

    @property
    def display(self) -> str:
        """``str(self)``, or ``<root>`` for the empty path (used in messages)."""
        return str(self) or "<root>"

    def get(self, tree: Any) -> Any:
        """Fetch the value at this path in `tree`.

        Raises
        ------
        StructureError
            If some entry of the path is not a child of the node reached.
        """
        from ._registry import child_items
        from ._errors import StructureError

        node = tree
        for depth, key in enumerate(self):
            items = child_items(node)
            here = KeyPath(self[:depth]).display
            if items is None:
                msg = (
                    f"at {here}: expected a node with child {key!r}, found a leaf "
                    f"of type {type(node).__name__}; check the path against "
                    "fk.leaves_with_path(tree)."
                )
                raise StructureError(msg)
            for k, v in items:
                if k == key and type(k) is type(key):
                    node = v
                    break
            else:
                keys = [k for k, _ in items]
                msg = (
                    f"at {here}: expected a child {key!r}, found children {keys!r}; "
                    "check the path against fk.leaves_with_path(tree)."
                )
                raise StructureError(msg)
        return node
