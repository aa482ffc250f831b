"""The tracing probe of the torch family, without the torch adapter (SPEC section 1: the adapter
loads only when a torch object is met). ``functorkit.adapters.tracing`` loads this module once
``torch`` is imported, so it can tell that ``torch.compile`` is tracing before any torch object
has been met (a module first met inside the compiled function)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ._base import TRACING_PROBES

__all__ = ["compiling"]


def _never() -> bool:
    return False


_found = getattr(getattr(torch, "compiler", None), "is_compiling", None)
#: True while ``torch.compile`` traces (``torch.compiler.is_compiling``; older torch: never)
compiling: Callable[[], bool] = _found if callable(_found) else _never
TRACING_PROBES.append(compiling)
