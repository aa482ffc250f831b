"""Array facts through the array API: namespace, device, dtype kind (cached per type)."""

from __future__ import annotations

from typing import Any

import array_api_compat

__all__ = ["device_of", "is_array", "is_inexact_array", "namespace"]

_IS_ARRAY: dict[type, bool] = {}
_NAMESPACE: dict[type, Any] = {}
_INEXACT: dict[tuple[type, Any], bool] = {}


def is_array(x: Any) -> bool:
    """True for an array of any array-API backend (NumPy scalars are not arrays)."""
    t = type(x)
    try:
        return _IS_ARRAY[t]
    except KeyError:
        pass
    import numpy as np

    out = bool(array_api_compat.is_array_api_obj(x)) and not isinstance(x, np.generic)
    _IS_ARRAY[t] = out
    return out


def namespace(x: Any) -> Any:
    """The array API namespace of array `x` (array_api_compat), cached per type."""
    t = type(x)
    try:
        return _NAMESPACE[t]
    except KeyError:
        xp = array_api_compat.array_namespace(x)
        _NAMESPACE[t] = xp
        return xp


def is_inexact_array(x: Any) -> bool:
    """True for a real-floating or complex-floating array: a parameter candidate."""
    if not is_array(x):
        return False
    key = (type(x), x.dtype)
    try:
        return _INEXACT[key]
    except KeyError:
        xp = namespace(x)
        out = bool(xp.isdtype(x.dtype, ("real floating", "complex floating")))
        _INEXACT[key] = out
        return out


def device_of(x: Any) -> Any:
    """The device of array `x`, or None where it cannot be determined (a JAX tracer)."""
    try:
        return array_api_compat.device(x)
    except Exception:  # noqa: BLE001 - tracers under jit have no concrete device
        return None
