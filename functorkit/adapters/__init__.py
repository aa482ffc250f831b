"""Backend adapters: one small module per array family, loaded lazily the first time one of its
namespaces (or, for ``torch.nn.Module`` nodes, classes) is met.

``adapter_for(xp)`` / ``adapter_of(x)`` give the `ArrayAdapter` of a namespace or
array; see ``docs/adapters.md`` for the protocol, the table of families and the import layering
(``_base.py`` below the family modules, ``_families.py`` above them).
"""

from ._base import ArrayAdapter as ArrayAdapter
from ._base import Layout as Layout
from ._families import FAMILIES as FAMILIES
from ._families import KNOWN_NAMESPACES as KNOWN_NAMESPACES
from ._families import adapter_for as adapter_for
from ._families import adapter_of as adapter_of
from ._families import load_family as load_family
from ._families import tracing as tracing

__all__ = [
    "FAMILIES",
    "KNOWN_NAMESPACES",
    "ArrayAdapter",
    "Layout",
    "adapter_for",
    "adapter_of",
    "load_family",
    "tracing",
]
