"""Type names of the public API: `Policy` and the `Tree` type variable.

``fk.Policy`` is the type of every ``policy=`` argument, for users who pass a policy
through their own typed code (``def train(..., policy: fk.Policy = "strict")``).
Functions that return a model of the input's structure are typed ``(Tree) -> Tree``
(``fk.fmap``, ``fk.copy``, ``fk.add``, ...), and ``fk.destructure`` returns a
``Restructure[Tree]`` whose ``re(p)`` gives that type back, so ``mypy --strict``
sees the user's own model type, not ``Any``.
"""

from __future__ import annotations

from typing import Literal, TypeAlias, TypeVar

__all__ = ["Policy", "Tree"]

#: the conversion policy of ``fk.destructure``, ``re(p)`` and ``re.flatten`` (see docs/destructure.md)
Policy: TypeAlias = Literal["strict", "model", "flat"]

#: a model: any tree functorkit walks; a function typed ``(Tree) -> Tree`` keeps the caller's type
Tree = TypeVar("Tree")

# a documented public name of this module (``help(fk.Policy)``, the API page), not typing's
setattr(Policy, "__module__", __name__)  # noqa: B010 - an attribute of the alias object, not a type
setattr(  # noqa: B010
    Policy,
    "__doc__",
    """The type of every ``policy=`` argument: ``Literal["strict", "model", "flat"]``.

    ``"strict"``: no conversion; ``"model"``: ``re(p)`` casts each parameter to its
    own dtype and device; ``"flat"``: every parameter takes ``p``'s (see
    `functorkit.destructure`).

    Examples
    --------
    >>> import typing
    >>> import functorkit as fk
    >>> typing.get_args(fk.Policy)
    ('strict', 'model', 'flat')
    """,
)
