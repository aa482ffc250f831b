"""fk.summary: a table of a model's leaves (path, shape, dtype, device, trainable, ties, count) and totals.

One recording of the model (`record`) gives the distinct leaves, their
first paths and trainability (docs/treedef.md, R1-R3); its expanded definition
gives every place of each leaf (the ties). Array facts come from ``_xp``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ._errors import known_shape
from ._holders import holds_arrays, never_holds
from ._keypath import KeyPath
from ._record import record
from ._xp import describe_device, describe_dtype, device_of, is_array, is_complex, is_inexact_array, namespace

__all__ = ["Summary", "SummaryRow", "summary"]

#: the widest table ``str(summary)`` writes (a terminal of 120 columns)
WIDTH = 120


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One distinct leaf of a model (a tied leaf once, at its first path)."""

    path: KeyPath
    shape: tuple[int, ...] | None  # None for a leaf that is not an array
    dtype: str  # the array's dtype, or the type name of any other leaf
    device: str  # "" for a leaf that is not an array
    trainable: bool  # a parameter: a trainable floating or complex array
    tied_with: tuple[KeyPath, ...]  # the leaf's other places (a tie), in walk order
    count: int  # number of elements (0 for a leaf that is not an array)
    nbytes: int  # bytes of its elements (0 for a leaf that is not an array)
    holder: bool = False  # an object no registry knows that holds arrays (SPEC 12: docs/bad_input.md)


def _itemsize(x: Any) -> int:
    size = getattr(x.dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    xp = namespace(x)
    parts = 2 if is_complex(x) else 1  # finfo of a complex dtype: the bits of its real component
    for info in (xp.finfo, xp.iinfo):
        try:
            return parts * int(info(x.dtype).bits) // 8
        except (TypeError, ValueError):
            continue
    return 1  # bool


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError  # pragma: no cover


def _fit(text: str, width: int, tail: float = 0.6) -> str:
    """`text` shortened to `width` by an ellipsis in the middle (keeping more of its end)."""
    if len(text) <= width:
        return text
    if width <= 3:
        return text[:width]
    keep = width - 3
    back = max(1, round(keep * tail))
    return text[: keep - back] + "..." + text[-back:]


class Summary:
    """What `summary` returns: ``rows`` and totals; ``str()`` is a table of at most 120 columns.

    Attributes
    ----------
    rows : tuple of SummaryRow
        One per distinct leaf, in walk order: ``path, shape, dtype, device,
        trainable, tied_with, count, nbytes``.
    num_params : int
        Elements of the parameters (trainable floating/complex arrays; a tie once).
    num_elements, nbytes : int
        Elements and bytes of every array leaf (a tie once).
    by_dtype, by_device : dict
        ``{name: (elements, bytes)}`` over every array leaf.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> s = fk.summary({"w": np.ones((2, 2)), "idx": np.arange(3)})
    >>> [(str(r.path), r.shape, r.trainable, r.count) for r in s.rows]
    [('w', (2, 2), True, 4), ('idx', (3,), False, 3)]
    >>> s.num_params, s.by_dtype["int64"]
    (4, (3, 24))
    """

    __slots__ = ("by_device", "by_dtype", "nbytes", "num_elements", "num_params", "rows")

    def __init__(self, rows: list[SummaryRow]) -> None:
        if not isinstance(rows, (list, tuple)) or not all(isinstance(r, SummaryRow) for r in rows):
            msg = (
                f"fk.Summary: `rows` must be a list of SummaryRow, got {type(rows).__name__}; "
                "a Summary is made by fk.summary(model)."
            )
            raise TypeError(msg)
        self.rows = tuple(rows)
        self.num_params = sum(r.count for r in rows if r.trainable)
        self.num_elements = sum(r.count for r in rows)
        self.nbytes = sum(r.nbytes for r in rows)
        self.by_dtype: dict[str, tuple[int, int]] = {}
        self.by_device: dict[str, tuple[int, int]] = {}
        for r in rows:
            if r.shape is None:
                continue
            for table, key in ((self.by_dtype, r.dtype), (self.by_device, r.device)):
                c, b = table.get(key, (0, 0))
                table[key] = (c + r.count, b + r.nbytes)

    def __repr__(self) -> str:
        return (
            f"Summary(rows={len(self.rows)}, num_params={self.num_params}, "
            f"num_elements={self.num_elements}, nbytes={self.nbytes})"
        )

    def __str__(self) -> str:
        header = ["path", "shape", "dtype", "device", "train", "count", "tied with"]
        body = []
        for r in self.rows:
            body.append(
                [
                    r.path.display,
                    "-" if r.shape is None else str(r.shape),
                    r.dtype,
                    r.device or "-",
                    ("yes" if r.trainable else "no") if r.shape is not None else "-",
                    f"{r.count:,}" if r.shape is not None else "-",
                    ", ".join(str(p) for p in r.tied_with),
                ]
            )
        widths = [max([len(h)] + [len(row[i]) for row in body]) for i, h in enumerate(header)]
        caps = [48, 20, 12, 10, 5, 13, 40]
        widths = [min(w, c) for w, c in zip(widths, caps)]
        slack = WIDTH - (sum(widths) + 2 * (len(widths) - 1))
        if slack < 0:  # shrink the tie column first, then the paths
            cut = min(-slack, max(0, widths[6] - len(header[6])))
            widths[6] -= cut
            slack += cut
            widths[0] = max(len(header[0]), widths[0] + min(slack, 0))
        right = {5}
        lines = []
        for row in [header, ["-" * w for w in widths], *body]:
            cells = []
            for i, (cell, w) in enumerate(zip(row, widths)):
                text = _fit(cell, w, tail=0.6 if i in (0, 6) else 0.0 if i == 1 else 0.5)
                cells.append(text.rjust(w) if i in right else text.ljust(w))
            lines.append("  ".join(cells).rstrip())
        n_arrays = sum(1 for r in self.rows if r.shape is not None)
        n_params = sum(1 for r in self.rows if r.trainable)
        ties = [r for r in self.rows if r.tied_with]
        lines.append("")
        lines.append(
            _fit(
                f"{len(self.rows)} leaves, {n_arrays} arrays, {n_params} parameter arrays: "
                f"{self.num_params:,} parameters; {self.num_elements:,} elements in all "
                f"({_human(self.nbytes)}); ties: {len(ties)}",
                WIDTH,
            )
        )
        for r in self.rows:
            if r.holder:
                lines.append(
                    _fit(
                        f"unknown holder at {r.path.display}: {r.dtype} holds arrays but is not registered "
                        f"(fk.register it, or fk.register_leaf({r.dtype}))",
                        WIDTH,
                    )
                )
        for name, table in (("by dtype:  ", self.by_dtype), ("by device: ", self.by_device)):
            if table:
                parts = [f"{k} {c:,} ({_human(b)})" for k, (c, b) in table.items()]
                lines.append(_fit(name + "; ".join(parts), WIDTH))
        return "\n".join(lines)


def summary(model: Any, /) -> Summary:
    """A table of a model's leaves: path, shape, dtype, device, trainable, ties, count; and totals.

    Parameters
    ----------
    model
        Any tree functorkit walks.

    Returns
    -------
    Summary
        ``.rows`` (one `SummaryRow` per distinct leaf, in walk order:
        a tied leaf once, at its first path, with its other places in
        ``tied_with``), totals ``.num_params`` (trainable floating/complex
        arrays, as ``len(fk.destructure(model)[1])``), ``.num_elements``,
        ``.nbytes``, and ``.by_dtype``/``.by_device``. ``str()`` is a
        terminal table of at most 120 columns (long paths shortened in the
        middle).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> w = np.ones((2, 3), dtype=np.float32)
    >>> s = fk.summary({"enc": w, "dec": w, "steps": np.array([3]), "lr": 0.1})
    >>> s.num_params, s.nbytes, [str(p) for p in s.rows[0].tied_with]
    (6, 32, ['dec'])
    >>> print(s)
    path   shape   dtype    device  train  count  tied with
    -----  ------  -------  ------  -----  -----  ---------
    enc    (2, 3)  float32  cpu     yes        6  dec
    steps  (1,)    int64    cpu     no         1
    lr     -       float    -       -          -
    <BLANKLINE>
    3 leaves, 2 arrays, 1 parameter arrays: 6 parameters; 7 elements in all (32 B); ties: 1
    by dtype:  float32 6 (24 B); int64 1 (8 B)
    by device: cpu 7 (32 B)
    """
    leaves, td = record(model)
    trainable = td.trainable
    exp = td.expanded()
    places: dict[int, list[KeyPath]] = {}
    ties = exp._ties()
    if ties is not None:
        for p, j in zip(exp.position_paths(), ties):
            places.setdefault(j, []).append(p)
    paths = td.paths
    rows = []
    for j, x in enumerate(leaves):
        path = paths[j]
        tied = tuple(p for p in places.get(j, ()) if p != path)
        if is_array(x):
            shape = known_shape(x, f"fk.summary: at {path.display}, the array")
            count = math.prod(shape)
            rows.append(
                SummaryRow(
                    path,
                    shape,
                    describe_dtype(x.dtype),
                    describe_device(device_of(x)),
                    bool(trainable[j]) and is_inexact_array(x),
                    tied,
                    count,
                    count * _itemsize(x),
                )
            )
        else:
            holder = not never_holds(x) and holds_arrays(x)
            rows.append(SummaryRow(path, None, type(x).__name__, "", False, tied, 0, 0, holder))
    return Summary(rows)
