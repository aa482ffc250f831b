"""The two error types functorkit raises for bad structure and bad policy."""

from __future__ import annotations

__all__ = ["PolicyError", "StructureError"]


class StructureError(ValueError):
    """Two trees differ in structure, a tree has a cycle, or arrays alias.

    The message names the key path where the problem is, what was expected,
    what was found, and how to fix it.

    Examples
    --------
    >>> import functorkit as fk
    >>> try:
    ...     fk.fmap(lambda a, b: a + b, {"w": 1, "b": 2}, {"w": 1})
    ... except fk.StructureError as e:
    ...     print(str(e).splitlines()[0])
    at <root>: dict keys {'w', 'b'} vs {'w'}
    """


class PolicyError(TypeError):
    """A dtype, device or namespace conversion the chosen policy forbids.

    The message names the key path, the model's and the other side's
    dtype/device, and the policies that would allow the conversion.
    """


def known_shape(x: object, where: str) -> tuple[int, ...]:
    """`x`'s shape as ints; a Dask array of unknown sizes (``nan`` dims) is a `StructureError`
    naming `where` (a path or a key) instead of ``int(nan)``'s bare ``ValueError``."""
    dims = tuple(x.shape)  # type: ignore[attr-defined]
    for d in dims:
        if type(d) is not int and (d is None or d != d):
            msg = (
                f"{where} has the unknown shape {dims} (a Dask array after boolean indexing or a filter?); "
                "expected known sizes. Fix: call `x.compute_chunk_sizes()` on it first."
            )
            raise StructureError(msg)
    return tuple(int(d) for d in dims)
