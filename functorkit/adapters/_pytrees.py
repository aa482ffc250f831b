"""The libraries whose pytree registries functorkit bridges (SPEC section 9; docs/interop.md).

``_registry.py`` reads these tables; a glue module is imported only once its library is in
``sys.modules``. In: each glue module's ``node_for(cls)`` (a NodeDef or None), asked in this order.
Out: the glue modules of `EXPORT_TO` also have ``export(cls, static)``.
"""

#: library module name -> glue module, in lookup order
PYTREES: tuple[tuple[str, str], ...] = (
    ("jax", "functorkit.adapters._pytree_jax"),
    ("optree", "functorkit.adapters._pytree_optree"),
    ("torch", "functorkit.adapters._pytree_torch"),
)
#: the libraries whose ``node_for`` is a Python dict lookup that ``torch.compile`` traces (the
#: others' registries are C++: skipped while tracing for the classes a backend adapter owns)
TRACEABLE_PYTREES: frozenset[str] = frozenset({"torch"})
#: the libraries functorkit's registered classes (and Restructure, TreeDef) are exported to
EXPORT_TO: tuple[tuple[str, str], ...] = (PYTREES[0], PYTREES[2])
