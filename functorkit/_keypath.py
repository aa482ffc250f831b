"""KeyPath: where a value sits inside a tree."""

from __future__ import annotations

from typing import Any

__all__ = ["KeyPath", "format_entry", "make_path"]

_tuple_new = tuple.__new__


def format_entry(key: Any, first: bool) -> str:
    """Render one path entry: ``.name``, ``[0]`` or ``['some key']``."""
    if type(key) is str and key.isidentifier():
        return key if first else "." + key
    if type(key) is int:
        return f"[{key}]"
    return f"[{key!r}]"


class KeyPath(tuple[Any, ...]):
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

    def __new__(cls, entries: Any = (), /) -> KeyPath:
        if isinstance(entries, (str, bytes)):
            msg = (
                f"`entries` must be an iterable of path entries, got the {type(entries).__name__} "
                f"{entries!r}; wrap a single key in a tuple: KeyPath(({entries!r},))."
            )
            raise TypeError(msg)
        try:
            return _tuple_new(cls, entries)
        except TypeError:
            msg = f"`entries` must be an iterable of path entries, got {type(entries).__name__}."
            raise TypeError(msg) from None

    def __str__(self) -> str:
        return "".join([format_entry(k, i == 0) for i, k in enumerate(self)])

    def __repr__(self) -> str:
        return f"KeyPath({tuple(self)!r})"

    def __add__(self, other: Any) -> KeyPath:
        return _tuple_new(KeyPath, (*self, *other))

    def __radd__(self, other: Any) -> KeyPath:
        return _tuple_new(KeyPath, (*other, *self))

    def __getitem__(self, index: Any) -> Any:
        out = tuple.__getitem__(self, index)
        return _tuple_new(KeyPath, out) if isinstance(index, slice) else out

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyPath, (tuple(self),))

    @property
    def display(self) -> str:
        """``str(self)``, or ``<root>`` for the empty path (used in messages)."""
        return str(self) or "<root>"

    def get(self, tree: Any, /) -> Any:
        """Fetch the value at this path in `tree`.

        Raises
        ------
        StructureError
            If some entry of the path is not a child of the node reached; the
            message names the whole path and the node where it stops.

        Examples
        --------
        >>> import functorkit as fk
        >>> fk.KeyPath(("b", 0)).get({"a": 1, "b": [2, 3]})
        2
        """
        from ._errors import StructureError
        from ._registry import child_items

        node = tree
        for depth, key in enumerate(self):
            items = child_items(node)
            here = _tuple_new(KeyPath, tuple.__getitem__(self, slice(0, depth))).display
            if items is None:
                msg = (
                    f"at {here}: the path {self.display} goes through a leaf: expected a node "
                    f"with a child {key!r}, found a leaf of type {type(node).__name__}; check "
                    "the path against fk.leaves_with_path(tree)."
                )
                raise StructureError(msg)
            for k, v in items:
                if type(k) is type(key) and k == key:
                    node = v
                    break
            else:
                keys = [k for k, _ in items]
                shown = repr(keys) if len(keys) <= 20 else f"{keys[:20]!r} and {len(keys) - 20} more"
                msg = (
                    f"at {here}: the path {self.display} does not exist: expected a child "
                    f"{key!r} of this {type(node).__name__}, found the children {shown}; check "
                    "the path against fk.leaves_with_path(tree)."
                )
                raise StructureError(msg)
        return node


def make_path(entries: tuple[Any, ...]) -> KeyPath:
    """A KeyPath from a tuple of entries, without argument checks (the walk's hot path)."""
    return _tuple_new(KeyPath, entries)
