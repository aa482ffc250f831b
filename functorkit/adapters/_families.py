"""The family table and the lookup: which adapter module handles an array namespace, loaded the
first time such a namespace is met.

This module sits *above* the family modules (``adapters/numpy.py``, ``torch.py``, ...), which
build on ``adapters/_base.py`` below them, and below the core, which asks it for adapters
(docs/adapters.md, "Import layering"). `FAMILIES` has one row per array family; everything
else here is derived from it, so adding a backend is its adapter module and its row.

Lookup: `adapter_for` maps an array namespace to its adapter through the namespace's module
name, importing the adapter module the first time; so ``import functorkit`` imports no
backend. Modules are loaded by ``import`` statements (`load_family`), not
`importlib.import_module`, because ``torch.compile`` runs an ``import`` statement it meets while
tracing but cannot trace ``importlib``: a model first met inside a compiled function loads its
adapter there. The ``import`` statements are made from the tables, once, when this module is
imported (`_import_functions`), so that a new row needs no new statement. Results are kept in
plain dicts without a lock: two threads racing on a first lookup may each build an adapter, one
of which is kept; adapters hold no state but their namespace, so either is right.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import array_api_compat

from . import _base
from ._base import TRACING_PROBES, ArrayAdapter
from ._pytrees import PYTREES

__all__ = [
    "FAMILIES",
    "KNOWN_NAMESPACES",
    "NODE_FAMILIES",
    "Family",
    "adapter_for",
    "adapter_of",
    "lazy_adapter",
    "load_family",
    "tracing",
]


class Family(NamedTuple):
    """One array family: a row of `FAMILIES`."""

    #: the library's top-level module (a family's extras wait until it is in ``sys.modules``)
    library: str
    #: the adapter module, with ``class Adapter(ArrayAdapter)``
    adapter: str
    #: the names of the array namespaces (``array_namespace(x).__name__``) it handles
    namespaces: tuple[str, ...]
    #: the adapter module also makes node definitions for classes of the library (its
    #: ``node_for(cls)`` and ``claims(cls)``: torch's ``nn.Module``), asked by the registry
    nodes: bool = False
    #: a small module that adds a `TRACING_PROBES` test when imported, loaded once the library is
    #: (without the adapter: `tracing` must be right before any of its arrays is met); or ""
    probe: str = ""


#: the array families, one row each (any other namespace: the generic `ArrayAdapter`)
FAMILIES: tuple[Family, ...] = (
    Family("numpy", "functorkit.adapters.numpy", ("numpy", "array_api_compat.numpy")),
    Family(
        "torch",
        "functorkit.adapters.torch",
        ("torch", "array_api_compat.torch"),
        nodes=True,
        probe="functorkit.adapters._torch_probe",
    ),
    Family("jax", "functorkit.adapters.jax", ("jax.numpy", "jax.experimental.array_api")),
    Family("cupy", "functorkit.adapters.cupy", ("cupy", "array_api_compat.cupy")),
    Family("dask", "functorkit.adapters.dask", ("array_api_compat.dask.array",)),
)

#: namespace module name -> adapter module
_ADAPTER_MODULES: dict[str, str] = {ns: f.adapter for f in FAMILIES for ns in f.namespaces}

#: every namespace module name functorkit knows (a pickled Restructure may name only these)
KNOWN_NAMESPACES: frozenset[str] = frozenset(_ADAPTER_MODULES) | {"array_api_strict"}

#: (library, adapter module) of the families whose adapter makes node definitions (`Family.nodes`)
NODE_FAMILIES: tuple[tuple[str, str], ...] = tuple((f.library, f.adapter) for f in FAMILIES if f.nodes)

#: (library, probe module) of the families with a tracing probe (`Family.probe`)
_PROBED_FAMILIES: tuple[tuple[str, str], ...] = tuple((f.library, f.probe) for f in FAMILIES if f.probe)

_BY_NAMESPACE: dict[str, ArrayAdapter] = {}
_BY_TYPE: dict[type, ArrayAdapter] = {}


def _import_functions(modnames: Iterable[str]) -> dict[str, Callable[[], Any]]:
    """For each module name, a function whose body is that module's ``from package import name``
    statement: what ``torch.compile`` can trace (it cannot trace ``importlib``, nor ``exec``, so
    these are made now, at import, not at the first lookup). ``from ... import`` also returns a
    module whose own import is still running (an adapter module that looks an array up while it
    is imported), as the interpreter's ``import`` does."""
    names = sorted(set(modnames))
    src = []
    for i, modname in enumerate(names):
        package, _, name = modname.rpartition(".")
        src.append(f"def load_{i}():\n    from {package} import {name} as mod\n    return mod\n")
    glb: dict[str, Any] = {}
    exec(compile("".join(src), f"<{__name__} import statements>", "exec"), glb)
    return {modname: glb[f"load_{i}"] for i, modname in enumerate(names)}


#: module name -> its import statement: every adapter module, probe and pytree glue module named
#: in `FAMILIES` and ``_pytrees.PYTREES``
_IMPORTS: dict[str, Callable[[], Any]] = _import_functions(
    [m for f in FAMILIES for m in (f.adapter, f.probe) if m] + [glue for _, glue in PYTREES]
)


def load_family(modname: str) -> Any:
    """The module `modname` (an adapter or probe module of `FAMILIES`, or a pytree glue module of
    ``_pytrees.PYTREES``), imported if needed (an ``import`` statement waits for another thread's
    import of the module to finish)."""
    load = _IMPORTS.get(modname)
    if load is None:
        msg = f"unknown adapter module {modname!r}"
        raise ValueError(msg)
    return load()


def tracing() -> bool:
    """True while a tracer that cannot run functorkit's code generation is tracing the caller.

    ``torch.compile`` (Dynamo) traces Python bytecode but not ``compile``/``exec`` or locks:
    one-time work (generating ``re(p)``'s code, a matcher for a container tree) is skipped
    under it and done by the first eager call instead. Checked only on those cold paths.

    A family's small probe module (not its adapter) is loaded here once its library is imported,
    so the answer does not depend on whether functorkit has met one of its objects yet (a module
    first met inside ``torch.compile``).
    """
    for library, probe in _PROBED_FAMILIES:
        if probe not in sys.modules and sys.modules.get(library) is not None:
            load_family(probe)  # an import statement: traced
    return any(probe() for probe in TRACING_PROBES)


def adapter_for(xp: Any) -> ArrayAdapter:
    """The adapter of array namespace `xp` (made once per namespace, family module imported lazily).

    Cached by the namespace's name, checked by identity (``torch.compile`` cannot hash a
    module object as a dict key while tracing)."""
    name = str(getattr(xp, "__name__", ""))
    hit = _BY_NAMESPACE.get(name)
    if hit is not None and hit.xp is xp:
        return hit
    modname = _ADAPTER_MODULES.get(name)
    adapter = ArrayAdapter(xp) if modname is None else load_family(modname).Adapter(xp)
    _BY_NAMESPACE[name] = adapter
    return adapter


def lazy_adapter() -> ArrayAdapter:
    """The adapter of the lazy family (Dask) that ``fk.open`` builds arrays with (imports Dask)."""
    return adapter_for(importlib.import_module("array_api_compat.dask.array"))


def adapter_of(x: Any) -> ArrayAdapter:
    """The adapter of array `x` (``adapter_for(namespace(x))``, cached per type)."""
    try:
        return _BY_TYPE[type(x)]
    except KeyError:
        pass
    adapter = adapter_for(array_api_compat.array_namespace(x))
    _BY_TYPE[type(x)] = adapter
    return adapter


# the adapters below this module reach the lookup through `_base.adapter_of` (they cannot import it)
_base._LOOKUP[:] = [adapter_of]
