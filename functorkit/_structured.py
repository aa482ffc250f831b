"""Structured matrices as nodes: ``Diagonal`` and ``Transpose``.

A structured wrapper is a *node* whose children are its storage, not an
array: ``fk.Diagonal(d)`` has one child ``diag`` (n entries, not n²) and
``fk.Transpose(a)`` one child ``parent``, so every walk (``fmap``,
``leaves``, ``destructure``, ``load_into``) sees the storage, keeps ties to it
and rebuilds the same wrapper around the new storage.

Both expose the metadata of the matrix they stand for (``shape``, ``ndim``,
``dtype``, ``device``), the two operations that keep the structure (``.T``
and ``@``, with arrays on either side and with other wrappers) and
``dense()``, the explicit way out to a plain array. They are deliberately not
arrays: no ``__array_namespace__``, no indexing, no elementwise arithmetic.
Every operation goes through the array namespace of the storage.
"""

from __future__ import annotations

from typing import Any

from ._nodedef import fields_check
from ._registry import register, set_check
from ._xp import describe_namespace, device_of, is_array, namespace

__all__ = ["Diagonal", "Transpose"]


def _lib(x: Any) -> str:
    return describe_namespace(namespace(x))


def _is_wrapper(x: Any) -> bool:
    """A structured wrapper: not an array, but has ``shape`` and a callable ``dense``."""
    return not is_array(x) and callable(getattr(x, "dense", None)) and hasattr(x, "shape")


def _array_at(x: Any, w: Any) -> Any:
    """``x @ w`` for an array `x` and a wrapper `w`, calling ``w.__rmatmul__`` directly.

    (array-api-strict arrays raise TypeError on a foreign operand instead of
    returning NotImplemented, so the operator alone never reaches `w`.)
    """
    rmatmul = getattr(w, "__rmatmul__", None)
    if rmatmul is not None:
        out = rmatmul(x)
        if out is not NotImplemented:
            return out
    return x @ w


def _common_namespace(store: Any, x: Any, what: str) -> Any:
    xp = namespace(store)
    if namespace(x) is not xp:
        msg = (
            f"{what}: the wrapper stores a {_lib(store)} array but the other operand is a "
            f"{_lib(x)} array. Expected both in one array library: functorkit never converts "
            "between libraries. Convert one operand first."
        )
        raise TypeError(msg)
    return xp


def _check_matmul(left: tuple[int, ...], right: tuple[int, ...], what: str) -> None:
    """``left @ right`` multiplies: the inner dimensions agree (a 1-D side is a vector), as
    ``matmul``'s rule; a ValueError naming both shapes otherwise (each library's own error
    differs: torch RuntimeError, JAX TypeError, NumPy's gufunc text, Dask's chunks)."""
    if not left or not right:
        return  # 0-d: `_need_matrix_operand` says so
    inner_left = left[-1]
    inner_right = right[0] if len(right) == 1 else right[-2]
    if type(inner_left) is int and type(inner_right) is int and inner_left != inner_right:  # (not unknown sizes)
        msg = (
            f"{what}: the shapes {left} and {right} do not multiply (inner dimensions {inner_left} and "
            f"{inner_right}). Expected the left operand's last dimension to equal the right one's "
            f"{'only' if len(right) == 1 else 'second-to-last'} dimension."
        )
        raise ValueError(msg)


def _need_matrix_operand(x: Any, what: str) -> None:
    if x.ndim == 0:
        msg = f"{what}: expected an operand with at least 1 dimension, got a 0-d array; use `*` to scale."
        raise ValueError(msg)


# ------------------------------------------------------------------ Diagonal


class Diagonal:
    """A square matrix stored by its diagonal: ``n`` numbers, not ``n * n``.

    A functorkit node with one child, ``diag``: walks see (and
    ``destructure`` flattens) only the diagonal, and rebuild a ``Diagonal``.
    ``D @ x`` scales the rows of ``x`` and ``x @ D`` its columns (O(n·k),
    the dense matrix is never built); ``D.T`` is ``D`` itself.

    Parameters
    ----------
    diag
        A 1-D array of any array-API library; it is stored as given (not
        copied).

    Raises
    ------
    TypeError
        If `diag` is not an array.
    ValueError
        If `diag` is not 1-D.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> D = fk.Diagonal(np.array([1.0, 2.0]))
    >>> D.shape
    (2, 2)
    >>> D @ np.array([[1.0, 1.0], [1.0, 1.0]])
    array([[1., 1.],
           [2., 2.]])
    >>> fk.leaves({"w": D})
    [array([1., 2.])]
    """

    __slots__ = ("diag",)
    # NumPy (and Dask) binary operators defer to us: `x @ D` calls D.__rmatmul__
    __array_ufunc__ = None

    diag: Any

    def __init__(self, diag: Any, /) -> None:
        if not is_array(diag):
            msg = (
                f"fk.Diagonal expects a 1-D array (the diagonal), got {type(diag).__name__}. "
                "Pass e.g. `xp.asarray([...])`."
            )
            raise TypeError(msg)
        if diag.ndim != 1:
            msg = (
                f"fk.Diagonal expects a 1-D array (the diagonal), got an array of shape "
                f"{tuple(diag.shape)}. For a dense matrix use it directly; for its diagonal "
                "use `xp.linalg.diagonal(m)`."
            )
            raise ValueError(msg)
        object.__setattr__(self, "diag", diag)

    def __setattr__(self, name: str, value: Any) -> None:
        msg = f"fk.Diagonal is immutable; build a new one with fk.Diagonal(d) instead of setting `{name}`."
        raise AttributeError(msg)

    def __delattr__(self, name: str) -> None:
        msg = f"fk.Diagonal is immutable; `{name}` cannot be deleted (build a new one with fk.Diagonal(d))."
        raise AttributeError(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_diagonal, (self.diag,))

    def __repr__(self) -> str:
        return f"Diagonal({self.diag!r})"

    @property
    def shape(self) -> tuple[Any, ...]:
        """``(n, n)``."""
        n = self.diag.shape[0]
        return (n, n)

    @property
    def ndim(self) -> int:
        """Always 2."""
        return 2

    @property
    def dtype(self) -> Any:
        """The dtype of the diagonal."""
        return self.diag.dtype

    @property
    def device(self) -> Any:
        """The device of the diagonal (None where it cannot be determined, e.g. a JAX tracer)."""
        return device_of(self.diag)

    @property
    def T(self) -> Diagonal:
        """The transpose: the same object (a diagonal matrix is symmetric)."""
        return self

    def dense(self) -> Any:
        """The ``(n, n)`` array, zeros off the diagonal, in the diagonal's namespace, dtype and device."""
        d = self.diag
        xp = namespace(d)
        n = d.shape[0]
        dev = device_of(d)
        mask = xp.eye(n, dtype=xp.bool, device=dev) if dev is not None else xp.eye(n, dtype=xp.bool)
        zero = xp.zeros((), dtype=d.dtype, device=dev) if dev is not None else xp.zeros((), dtype=d.dtype)
        return xp.where(mask, xp.expand_dims(d, axis=0), zero)

    def _check_n(self, m: Any, side: str, what: str) -> None:
        n = self.diag.shape[0]
        if m != n:
            msg = f"{what}: the Diagonal is {n}x{n} but the other operand has {m} {side}. Expected {n} {side}."
            raise ValueError(msg)

    def __matmul__(self, other: Any) -> Any:
        what = "fk.Diagonal @ x"
        if is_array(other):
            xp = _common_namespace(self.diag, other, what)
            _need_matrix_operand(other, what)
            if other.ndim == 1:
                self._check_n(other.shape[0], "entries", what)
                return self.diag * other
            self._check_n(other.shape[-2], "rows", what)
            return xp.expand_dims(self.diag, axis=-1) * other
        if type(other) is Diagonal:
            _common_namespace(self.diag, other.diag, "fk.Diagonal @ fk.Diagonal")
            self._check_n(other.diag.shape[0], "rows", "fk.Diagonal @ fk.Diagonal")
            return Diagonal(self.diag * other.diag)
        if _is_wrapper(other):
            return self @ other.dense()
        return NotImplemented

    def __rmatmul__(self, other: Any) -> Any:
        what = "x @ fk.Diagonal"
        if is_array(other):
            _common_namespace(self.diag, other, what)
            _need_matrix_operand(other, what)
            self._check_n(other.shape[-1], "entries" if other.ndim == 1 else "columns", what)
            return other * self.diag
        if _is_wrapper(other):
            return self.__rmatmul__(other.dense())
        return NotImplemented


def _make_diagonal(diag: Any) -> Diagonal:
    """Rebuild without validation (a walk may put any leaf in the slot, e.g. a shape)."""
    obj = object.__new__(Diagonal)
    object.__setattr__(obj, "diag", diag)
    return obj


# ----------------------------------------------------------------- Transpose


class Transpose:
    """A lazy transpose of an array or of another wrapper: ``Transpose(a)`` stands for ``a.T``.

    A functorkit node with one child, ``parent``: paths read
    ``dec.weight.parent``, and an array used both as ``a`` and inside
    ``Transpose(a)`` is one leaf, so the tie survives ``fmap``,
    ``destructure`` and ``load_into`` (an encoder's ``W`` used as the
    decoder's ``W.T``). For an array with more than 2 dimensions it is the
    transpose of the last two axes (``matrix_transpose``). ``Transpose(a).T``
    is ``a``. The constructor never simplifies: ``Transpose(Transpose(a))``
    and ``Transpose(fk.Diagonal(d))`` are kept as written (a walk rebuilds
    exactly the structure it was given); ``.T`` is the simplifying step.

    Parameters
    ----------
    parent
        An array with at least 2 dimensions, or a structured wrapper
        (``fk.Diagonal``, ``fk.Transpose`` or any object with ``shape``,
        ``dtype`` and ``dense()``). Stored as given (not copied).

    Raises
    ------
    TypeError
        If `parent` is neither an array nor a structured wrapper.
    ValueError
        If `parent` is an array or a wrapper with fewer than 2 dimensions.

    Examples
    --------
    >>> import numpy as np
    >>> import functorkit as fk
    >>> W = np.arange(6.0).reshape(2, 3)
    >>> model = {"enc": W, "dec": fk.Transpose(W)}
    >>> model["dec"].shape
    (3, 2)
    >>> model["dec"].T is W
    True
    >>> [str(p) for p, _ in fk.leaves_with_path(model)]  # one leaf: the tie is kept
    ['enc']
    >>> out = fk.fmap(lambda x: x * 2, model)
    >>> out["dec"].parent is out["enc"]
    True
    """

    __slots__ = ("parent",)
    __array_ufunc__ = None

    parent: Any

    def __init__(self, parent: Any, /) -> None:
        if is_array(parent):
            if parent.ndim < 2:
                msg = (
                    f"fk.Transpose expects an array with at least 2 dimensions, got shape "
                    f"{tuple(parent.shape)}. A 1-D array is its own transpose: use it directly."
                )
                raise ValueError(msg)
        elif not _is_wrapper(parent):
            msg = (
                f"fk.Transpose expects an array with at least 2 dimensions or a structured wrapper "
                f"(fk.Diagonal, fk.Transpose, or an object with `shape`, `dtype` and `dense()`), "
                f"got {type(parent).__name__}."
            )
            raise TypeError(msg)
        else:
            try:
                ndim = len(tuple(parent.shape))
            except TypeError:
                ndim = -1
            if ndim < 2:  # its `shape` and `dense()` would fail (a raw IndexError)
                msg = (
                    f"fk.Transpose expects a structured wrapper of at least 2 dimensions, got a "
                    f"{type(parent).__name__} of shape {parent.shape!r}."
                )
                raise ValueError(msg)
        object.__setattr__(self, "parent", parent)

    def __setattr__(self, name: str, value: Any) -> None:
        msg = f"fk.Transpose is immutable; build a new one with fk.Transpose(a) instead of setting `{name}`."
        raise AttributeError(msg)

    def __delattr__(self, name: str) -> None:
        msg = f"fk.Transpose is immutable; `{name}` cannot be deleted (build a new one with fk.Transpose(a))."
        raise AttributeError(msg)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_make_transpose, (self.parent,))

    def __repr__(self) -> str:
        return f"Transpose({self.parent!r})"

    @property
    def shape(self) -> tuple[Any, ...]:
        """The parent's shape with the last two axes swapped."""
        s = tuple(self.parent.shape)
        return (*s[:-2], s[-1], s[-2])

    @property
    def ndim(self) -> int:
        """The parent's number of dimensions."""
        return len(self.parent.shape)

    @property
    def dtype(self) -> Any:
        """The parent's dtype."""
        return self.parent.dtype

    @property
    def device(self) -> Any:
        """The parent's device (None where it cannot be determined: a JAX tracer, a wrapper without ``device``)."""
        p = self.parent
        return device_of(p) if is_array(p) else getattr(p, "device", None)

    @property
    def T(self) -> Any:
        """The parent itself (the same object)."""
        return self.parent

    def dense(self) -> Any:
        """The transposed array, ``matrix_transpose(parent)`` (a view of the parent where the library has views)."""
        p = self.parent
        if not is_array(p):
            p = p.dense()
        return namespace(p).matrix_transpose(p)

    def __matmul__(self, other: Any) -> Any:
        p = self.parent
        if is_array(other):
            what = "fk.Transpose @ x"
            _check_matmul(tuple(self.shape), tuple(other.shape), what)
            if is_array(p):
                xp = _common_namespace(p, other, what)
                return xp.matmul(xp.matrix_transpose(p), other)
            # p.T @ x == (x.T @ p).T; for a vector, x @ p
            _need_matrix_operand(other, what)
            if other.ndim == 1:
                return _array_at(other, p)
            xp = namespace(other)
            return xp.matrix_transpose(_array_at(xp.matrix_transpose(other), p))
        if _is_wrapper(other):
            return self @ other.dense()
        return NotImplemented

    def __rmatmul__(self, other: Any) -> Any:
        p = self.parent
        if is_array(other):
            what = "x @ fk.Transpose"
            _check_matmul(tuple(other.shape), tuple(self.shape), what)
            if is_array(p):
                xp = _common_namespace(p, other, what)
                return xp.matmul(other, xp.matrix_transpose(p))
            # x @ p.T == (p @ x.T).T; for a vector, p @ x
            _need_matrix_operand(other, what)
            if other.ndim == 1:
                return p @ other
            xp = namespace(other)
            return xp.matrix_transpose(p @ xp.matrix_transpose(other))
        if _is_wrapper(other):
            return self.__rmatmul__(other.dense())
        return NotImplemented


def _make_transpose(parent: Any) -> Transpose:
    """Rebuild without validation (a walk may put any leaf in the slot, e.g. a shape)."""
    obj = object.__new__(Transpose)
    object.__setattr__(obj, "parent", parent)
    return obj


register(Diagonal, children=lambda x: ({"diag": x.diag}, None), rebuild=lambda aux, ch: _make_diagonal(ch["diag"]))
register(
    Transpose, children=lambda x: ({"parent": x.parent}, None), rebuild=lambda aux, ch: _make_transpose(ch["parent"])
)
# a TreeDef.from_json document names exactly these keys for them (their rebuild reads them)
set_check(Diagonal, fields_check(["diag"], lambda aux: aux == (None, None)))
set_check(Transpose, fields_check(["parent"], lambda aux: aux == (None, None)))
