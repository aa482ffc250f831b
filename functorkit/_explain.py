"""``re.explain``: what ``re(p)`` would do with each parameter, as rows and as a text table."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from ._keypath import KeyPath
from ._policy import Decision, Kind, describe_device, describe_dtype, rebuild_error

__all__ = ["ExplainRow", "Explanation", "explain_rows"]


class ExplainRow(NamedTuple):
    """One parameter's line of `Restructure.explain` (a named tuple).

    Attributes
    ----------
    path : KeyPath
        The parameter's path (its first, for a tied parameter).
    shape : tuple of int
        The parameter's shape.
    model_dtype, model_device
        The parameter's dtype and device in the model `destructure` saw.
    result_dtype, result_device
        What ``re(p)`` would give it (``None`` when ``how`` is ``"error"``).
    how : str
        ``"view"`` (a view of `p`), ``"copy"`` (a converted copy) or ``"error"``.
    rule : str
        The policy rule that decided it, in words.
    error : Exception or None
        The exception ``re(p)`` would raise for this parameter, else ``None``.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> flat, re = fk.destructure({"w": np.ones(2, np.float32)})
    >>> row = re.explain(np.zeros(2), policy="model").rows[0]
    >>> str(row.path), row.shape, row.result_dtype, row.how
    ('w', (2,), dtype('float32'), 'copy')
    """

    path: KeyPath
    shape: tuple[int, ...]
    model_dtype: Any
    model_device: Any
    result_dtype: Any
    result_device: Any
    how: str  # "view", "copy" or "error"
    rule: str
    error: Exception | None


class Explanation:
    """What ``re(p)`` would do with each parameter: a table to print, rows to inspect.

    Returned by `Restructure.explain`. ``str(explanation)`` is a text table
    (errors as numbered notes below it); ``explanation.rows`` is a list of
    `ExplainRow`, one per parameter in walk order; iterating, ``len`` and
    indexing go over the rows; ``explanation.ok`` is true when ``re(p)`` would
    succeed. ``explanation.holders`` lists ``(path, class name)`` of the
    constants that no registry knows but that hold arrays; since SPEC 12
    ``destructure`` refuses those under every policy, so it is empty for a
    rebuilder ``destructure`` made (see ``docs/treedef.md``, R5).

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> flat, re = fk.destructure({"w": np.ones(2, np.float32)})
    >>> ex = re.explain(np.zeros(2))          # float64 p, strict policy
    >>> ex.ok, len(ex), ex[0].how
    (False, 1, 'error')
    >>> print(ex)                             # doctest: +ELLIPSIS
    p: float64 on cpu (numpy), length 2; policy 'strict', copy=None
    path  shape  model        result  how    rule
    ...
    """

    def __init__(self, header: str, rows: list[ExplainRow], holders: list[tuple[KeyPath, str]] | None = None) -> None:
        self.header = header
        self.rows = rows
        #: ``(path, class name)`` of constants no registry knows that hold arrays (carried unchanged)
        self.holders = [] if holders is None else holders

    def __iter__(self) -> Iterator[ExplainRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> ExplainRow:
        return self.rows[i]

    @property
    def ok(self) -> bool:
        """True if ``re(p)`` would succeed (no row is an error)."""
        return all(r.error is None for r in self.rows)

    def __repr__(self) -> str:
        return f"<Explanation of {len(self.rows)} parameters: {self.header}>"

    def __str__(self) -> str:
        head = ("path", "shape", "model", "result", "how", "rule")
        shown: dict[str, str] = {}
        table = [head]
        notes: dict[str, int] = {}  # error text (less its "at <path>:" prefix) -> note number
        for r in self.rows:
            model = f"{describe_dtype(r.model_dtype)} {describe_device(r.model_device)}"
            if r.error is None:
                result = f"{describe_dtype(r.result_dtype)} {describe_device(r.result_device)}"
                rule = r.rule
            else:
                text = f"{type(r.error).__name__}: {r.error}"
                key = text.partition(": ")[2].partition(": ")[2] or text
                number = notes.setdefault(key, len(notes) + 1)
                shown.setdefault(key, text)
                result = "-"
                rule = f"{r.rule} [{number}]"
            table.append((r.path.display, str(r.shape), model, result, r.how, rule))
        widths = [max(len(row[j]) for row in table) for j in range(len(head))]
        lines = [self.header]
        for n, row in enumerate(table):
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
            if n == 0:
                lines.append("  ".join("-" * w for w in widths))
        if not self.rows:
            lines.append("(no parameters)")
        for key, number in notes.items():
            lines.append(f"[{number}] {shown[key]}")
        for path, name in self.holders:
            lines.append(
                f"constant at {path.display}: a {name} that holds arrays, but no registry knows {name}: carried "
                f"unchanged, its arrays are not parameters (fk.register / @fk.register_dataclass to make them so)"
            )
        return "\n".join(lines)


def explain_rows(
    pol: str,
    pk: Kind,
    copy: bool | None,
    decisions: list[Decision],
    param_kind: list[int],
    kinds: list[Kind],
    paths: tuple[KeyPath, ...],
    shapes: list[tuple[int, ...]],
) -> list[ExplainRow]:
    """One row per parameter: what ``re(p)`` does with it under `pol`, or the error it would raise."""
    rows = []
    for j, ki in enumerate(param_kind):
        d = decisions[ki]
        leaf = kinds[ki]
        path = paths[j]
        shape = shapes[j]
        err: Exception | None = None
        if d.error is not None:
            err = rebuild_error(pol, path, leaf, pk, d.error)
            how = "error"
        elif copy is False and d.convert:
            err = ValueError(
                f"at {path.display}: re(p, copy=False) cannot give a view of p here ({d.rule}); pass copy=None."
            )
            how = "error"
        else:
            how = "copy" if (d.convert or copy is True) else "view"
        res = d.result
        rows.append(
            ExplainRow(
                path,
                shape,
                leaf.dtype,
                leaf.device,
                None if res is None or err is not None else res.dtype,
                None if res is None or err is not None else res.device,
                how,
                d.rule + (" (copy=True)" if copy is True and not d.convert and err is None else ""),
                err,
            )
        )
    return rows
