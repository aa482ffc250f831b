"""The device rule, below both the core and the adapters (both import it; it imports nothing).

`functorkit._xp` re-exports `same_device`; the adapters import it from here, so that no adapter
reaches back up into the core for it (docs/adapters.md, "Import layering").
"""

from __future__ import annotations

from typing import Any

__all__ = ["same_device"]


def same_device(a: Any, b: Any) -> bool:
    """Devices equal. THE rule: a device that cannot be determined (None) counts as equal to any.

    A placement over several devices (a JAX ``Sharding``, which is what the array API's ``device``
    gives for a sharded JAX array) is one device set: two shardings over the same devices are one
    placement, however each array is split (docs/sharded.md).

    Examples
    --------
    >>> from functorkit.adapters._device import same_device
    >>> same_device("cpu", None), same_device("cpu", "cuda:0")
    (True, False)
    """
    if a is None or b is None or a is b:
        return True
    try:
        if a == b:
            return True
    except (TypeError, ValueError):  # devices of two libraries that refuse to compare
        return str(a) == str(b)
    sa = getattr(a, "device_set", None)
    return sa is not None and sa == getattr(b, "device_set", None)
