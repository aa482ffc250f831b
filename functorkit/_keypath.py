"""KeyPath: where a value sits inside a tree."""

from __future__ import annotations

import ast
import math
from typing import Any

from ._errors import StructureError

__all__ = ["KeyPath", "format_entry", "make_path", "safe_repr"]

_tuple_new = tuple.__new__
_tuple_hash = tuple.__hash__
_TAIL_DIGITS = 6
_SHOWN_CHILDREN = 20


def _short_int(key: int) -> str:
    """A short stand-in for an integer too long for ``str()`` (CPython's digit limit).

    Linear in the size of `key`: the digit count comes from a logarithm and
    only the last few digits are converted.
    """
    n = -key if key < 0 else key
    digits = math.floor(math.log10(n)) + 1
    if n.bit_length() <= 100_000:  # exact near powers of ten where the float can round
        digits += (n >= 10**digits) - (n < 10 ** (digits - 1))
    tail = str(n % 10**_TAIL_DIGITS).zfill(_TAIL_DIGITS)
    sign = "negative " if key < 0 else ""
    return f"<{sign}int with {digits} digits, ending in …{tail}>"


def safe_repr(obj: Any) -> str:
    """``repr(obj)``, or a short stand-in where ``repr`` raises: messages never fail."""
    try:
        return repr(obj)
    except Exception as e:  # noqa: BLE001 -- any failing __repr__ must still give a message
        if isinstance(obj, int):
            return _short_int(obj)
        return f"<{type(obj).__qualname__} whose repr raised {type(e).__name__}>"


def format_entry(key: Any, first: bool) -> str:
    """Render one path entry: ``.name``, ``[0]`` or ``['some key']``; never raises."""
    if type(key) is str and key.isidentifier():
        return key if first else "." + key
    if type(key) is int:
        try:
            return f"[{key}]"
        except ValueError:  # more digits than sys.get_int_max_str_digits()
            return f"[{_short_int(key)}]"
    return f"[{safe_repr(key)}]"


def _same_key(a: Any, b: Any) -> bool:
    """Whether child key `a` is path entry `b`: the same object, or equal and of one type.

    Identity first, so a key unequal to itself (a NaN float) is still found;
    the type check keeps ``True`` apart from ``1``; a comparison that raises
    or gives no truth value (an array key) counts as a mismatch.
    """
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 -- an odd key is not this entry; `get` then says so
        return False


class KeyPath(tuple[Any, ...]):
    """An immutable, hashable, picklable path of keys from a tree's root.

    Entries are the keys a node gives its children: dict keys, attribute or
    field names, sequence indices. ``str()`` renders identifier strings as
    ``.name`` (no dot at the start), integers as ``[i]`` and any other key
    as ``[repr(key)]``; the root path is ``""`` and shows as ``<root>`` in
    messages. ``str()`` and ``repr()`` never raise: an integer longer than
    Python's digit limit, or a key whose ``repr`` fails, shows as a short
    ``<...>`` stand-in. ``path + ("w",)`` (a tuple of keys, or another path)
    is a longer path; ``path + "w"`` is a ``TypeError``, since the string's
    characters would become entries.

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
        inner = ", ".join([safe_repr(k) for k in self])
        return f"KeyPath(({inner},))" if len(self) == 1 else f"KeyPath(({inner}))"

    def __hash__(self) -> int:
        try:
            return _tuple_hash(self)
        except TypeError:
            pass
        for i, key in enumerate(self):
            try:
                hash(key)
            except TypeError:
                msg = (
                    f"the path {self.display} cannot be hashed: its entry {i} is the unhashable "
                    f"{type(key).__name__} {safe_repr(key)}; give the node hashable child keys "
                    "(its `children` function returns a mapping whose keys become path entries), "
                    "or keep such paths out of dicts and sets."
                )
                raise TypeError(msg) from None
        raise AssertionError  # unreachable: tuple.__hash__ fails only on an entry  # pragma: no cover

    def __add__(self, other: Any) -> KeyPath:
        return _tuple_new(KeyPath, (*self, *_entries_of(other, "path + other")))

    def __radd__(self, other: Any) -> KeyPath:
        return _tuple_new(KeyPath, (*_entries_of(other, "other + path"), *self))

    def __getitem__(self, index: Any) -> Any:
        out = tuple.__getitem__(self, index)
        return _tuple_new(KeyPath, out) if isinstance(index, slice) else out

    def __reduce__(self) -> tuple[Any, ...]:
        return (KeyPath, (tuple(self),))

    @classmethod
    def parse(cls, text: str, /) -> KeyPath:
        """Read a path from its ``str()`` form or from the dotted state-dict form.

        ``layers[1].bias``, ``layers.1.bias`` and ``['layers'][1]['bias']``
        give the same path. Between dots a run of digits is an integer index
        and anything else is a string key; inside brackets the entry is a
        Python literal (``[0]``, ``['a key']``, ``[1.5]``, ``[None]``), read
        with `ast.literal_eval`, never evaluated. ``""`` and
        ``"<root>"`` are the root path. ``KeyPath.parse(str(path)) == path``
        for every path whose keys are strings (any characters), integers
        (negative ones too), bytes, ``None``, booleans, finite floats, or
        tuples of these (holding ``]`` or quotes included): every key
        functorkit's own nodes produce. Keys with no literal ``repr`` (a NaN,
        an enum, an object) and integers longer than Python's digit limit
        show as text that does not read back.

        Raises
        ------
        ValueError
            If `text` is not such a path; the message shows where it stops.

        Examples
        --------
        >>> import functorkit as fk
        >>> fk.KeyPath.parse("layers[1].bias") == fk.KeyPath.parse("layers.1.bias")
        True
        >>> fk.KeyPath.parse("blocks.0['attn'].w")
        KeyPath(('blocks', 0, 'attn', 'w'))
        """
        if not isinstance(text, str):
            msg = f"KeyPath.parse takes a str, got {type(text).__name__}; pass str(path) or a KeyPath."
            raise TypeError(msg)
        if text in ("", "<root>"):
            return _tuple_new(cls, ())
        return _tuple_new(cls, _parse_entries(text))

    @property
    def dotted(self) -> str:
        """The path in the dotted form of state-dict keys: ``layers.1.bias``.

        Integer indices and string keys are joined with ``.`` as
        ``torch.nn.Module.state_dict()`` does; any other key shows as its
        ``repr``. It is lossy: `parse` reads it back only when no string
        key is empty, holds a dot or a bracket, or is a run of digits, and
        every other key is an ``int >= 0`` (``"-1"`` comes back as the
        string ``'-1'``; the key ``"1"`` as the integer ``1``; ``b"x"``
        as the string ``"b'x'"``). `str` is the exact form: use it
        (or the path itself) where keys must survive.

        Examples
        --------
        >>> import functorkit as fk
        >>> fk.KeyPath(("layers", 1, "bias")).dotted
        'layers.1.bias'
        """
        return ".".join([_dotted_entry(k) for k in self])

    @property
    def display(self) -> str:
        """``str(self)``, or ``<root>`` for the empty path (used in messages)."""
        return str(self) or "<root>"

    def get(self, tree: Any, /) -> Any:
        """Fetch the value at this path in `tree`.

        Each entry is matched against the node's child keys by identity first
        (so a NaN key from `fk.leaves_with_path` is found), then by equality
        between keys of one type (``True`` is not ``1``). Linear in the
        length of the path.

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
        from ._registry import child_items

        node = tree
        for depth, key in enumerate(self):
            items = child_items(node)
            if items is None:
                raise self._get_error(depth, node, None)
            for k, v in items:
                if k is key:
                    node = v
                    break
            else:
                for k, v in items:
                    if _same_key(k, key):
                        node = v
                        break
                else:
                    raise self._get_error(depth, node, [k for k, _ in items])
        return node

    def _get_error(self, depth: int, node: Any, keys: list[Any] | None) -> Exception:
        """The StructureError of `get` stopping at entry `depth` (built only on failure)."""
        here = self[:depth].display
        key = safe_repr(self[depth])
        if keys is None:
            msg = (
                f"at {here}: the path {self.display} goes through a leaf: expected a node "
                f"with a child {key}, found a leaf of type {type(node).__name__}; check "
                "the path against fk.leaves_with_path(tree)."
            )
        else:
            shown = "[" + ", ".join([safe_repr(k) for k in keys[:_SHOWN_CHILDREN]]) + "]"
            if len(keys) > _SHOWN_CHILDREN:
                shown += f" and {len(keys) - _SHOWN_CHILDREN} more"
            msg = (
                f"at {here}: the path {self.display} does not exist: expected a child "
                f"{key} of this {type(node).__name__}, found the children {shown}; check "
                "the path against fk.leaves_with_path(tree)."
            )
        return StructureError(msg)


def _entries_of(other: Any, what: str) -> Any:
    """The entries `other` adds to a path: an iterable of keys, not a string (whose characters
    ``(*"weight",)`` would become one entry each, silently)."""
    if isinstance(other, (str, bytes)):
        msg = (
            f"{what}: cannot add the {type(other).__name__} {safe_repr(other)} to a KeyPath (its characters "
            f"would become entries); add a tuple of keys: path + ({safe_repr(other)},), or "
            f"KeyPath.parse({safe_repr(other)}) for a path written as text."
        )
        raise TypeError(msg)
    try:
        iter(other)
    except TypeError:
        msg = (
            f"{what}: cannot add a {type(other).__name__} to a KeyPath; add a tuple of keys, "
            f"e.g. path + ({safe_repr(other)},)."
        )
        raise TypeError(msg) from None
    return other


def _dotted_entry(key: Any) -> str:
    """One entry of `KeyPath.dotted`: a string as is, an integer's digits, else its repr."""
    if type(key) is str:
        return key
    if type(key) is int:
        return format_entry(key, True)[1:-1]  # the digits, or the stand-in for a huge int
    return safe_repr(key)


def _parse_error(text: str, at: int, what: str) -> ValueError:
    return ValueError(
        f"cannot read the path {text!r}: {what} at character {at} ({text[:at]!r} was read); "
        "write entries as name, .name, [0], ['key'] or the dotted form layers.0.weight."
    )


def _bracket_end(text: str, start: int) -> int:
    """Index of the ``]`` closing the bracket opened at `start`: string literals (``'a]'``,
    ``b"]"``, escapes) are skipped and nested brackets counted, so a tuple or bytes key holding
    ``]`` is read whole."""
    i, n, depth = start + 1, len(text), 0
    while i < n:
        c = text[i]
        if c in "'\"":
            quote = c * 3 if text.startswith(c * 3, i) else c
            i += len(quote)
            while i < n and not text.startswith(quote, i):
                i += 2 if text[i] == "\\" else 1
            if i >= n:
                raise _parse_error(text, start, "an unclosed quoted key")
            i += len(quote)
            continue
        if c in "([{":
            depth += 1
        elif c in ")}":
            depth -= 1
        elif c == "]":
            if depth == 0:
                return i
            depth -= 1
        i += 1
    raise _parse_error(text, start, "an unclosed '['")


def _parse_entries(text: str) -> list[Any]:
    """The entries of a path in ``str()`` or dotted form (see `KeyPath.parse`)."""
    out: list[Any] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "[":
            end = _bracket_end(text, i)
            inner = text[i + 1 : end]
            try:
                key = ast.literal_eval(inner)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                raise _parse_error(text, i + 1, f"{inner!r} is not a literal key") from None
            try:
                hash(key)
            except TypeError:
                raise _parse_error(text, i + 1, f"the key {inner} is unhashable") from None
            out.append(key)
            i = end + 1
            continue
        if c == ".":
            if i == 0 or i + 1 >= n or text[i + 1] in ".[":
                raise _parse_error(text, i, "an empty name around '.'")
            i += 1
        elif out:
            raise _parse_error(text, i, "expected '.' or '[' between entries")
        j = i
        while j < n and text[j] not in ".[":
            j += 1
        name = text[i:j]
        if "]" in name:
            raise _parse_error(text, i + name.index("]"), "an unmatched ']'")
        # only a canonical decimal ("0", "17", not "01": the str key "01" stays one) is an index
        out.append(int(name) if name.isascii() and name.isdigit() and str(int(name)) == name else name)
        i = j
    return out


def make_path(entries: tuple[Any, ...]) -> KeyPath:
    """A KeyPath from a tuple of entries, without argument checks (the walk's hot path)."""
    return _tuple_new(KeyPath, entries)
