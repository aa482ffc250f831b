"""Array facts through the array API: classification, namespace, device, dtype, and how to show them.

The one home for describing and comparing dtypes, devices and namespaces
(every message and every policy decision uses these):

* `describe_dtype` shows byte order where it is not native
  (``float64 (big-endian)``), so two dtypes that differ never read the same;
* `same_device` has one rule: a device that cannot be determined
  (``None``, e.g. a JAX tracer under ``jit``) counts as equal to any device
  (SPEC section 4);
* `is_complex` answers for an array or a `Kind`.

Classification (`is_array`, `is_inexact_array`, `namespace`, `Kind`; cached per type, and
``np.matrix`` refused with a `TypeError` that says how to fix it) lives in ``_classify.py``,
below the adapters, which warm its caches; it is re-exported here. `device_of` and
`describe_array` ask an array's adapter, so this module sits above the family table
(docs/adapters.md, "Import layering").
"""

from __future__ import annotations

from typing import Any

from ._classify import MATRIX_MESSAGE as MATRIX_MESSAGE
from ._classify import Kind as Kind
from ._classify import _is_kind as _is_kind
from ._classify import inexact_flags as inexact_flags
from ._classify import inexact_one_type as inexact_one_type
from ._classify import is_array as is_array
from ._classify import is_complex as is_complex
from ._classify import is_inexact_array as is_inexact_array
from ._classify import namespace as namespace
from ._classify import promote_dtypes as promote_dtypes
from .adapters import adapter_of
from .adapters._device import same_device  # the rule lives below the adapters that use it

__all__ = [
    "Kind",
    "MATRIX_MESSAGE",
    "describe_array",
    "describe_device",
    "describe_dtype",
    "describe_kind",
    "describe_namespace",
    "device_of",
    "is_array",
    "is_complex",
    "is_inexact_array",
    "namespace",
    "same_device",
]


# ---------------------------------------------------------------- devices


def device_of(x: Any) -> Any:
    """The device of array `x`, or None where it cannot be determined (a JAX tracer)."""
    return adapter_of(x).device(x)


# ---------------------------------------------------------------- descriptions


def describe_namespace(xp: Any) -> str:
    """``"numpy"``, ``"torch"``, ``"jax"``...: the library of namespace `xp`."""
    name = str(getattr(xp, "__name__", xp))
    return name.removeprefix("array_api_compat.").split(".")[0]


def describe_dtype(dtype: Any) -> str:
    """The dtype's name; a non-native byte order is spelled out (``float64 (big-endian)``)."""
    name = getattr(dtype, "name", None)
    if not isinstance(name, str):
        name = str(dtype).rpartition(".")[2]
    if getattr(dtype, "isnative", True) is False:
        order = "big" if dtype.byteorder == ">" else "little"
        name = f"{name} ({order}-endian)"
    return name


def describe_device(device: Any) -> str:
    """The device as text; None reads ``unknown device``. A placement over several devices (a JAX
    sharding: its ``device_set``) names them too: two meshes of one shape over other devices print
    alike otherwise."""
    if device is None:
        return "unknown device"
    text = str(device)
    devices = getattr(device, "device_set", None)
    if isinstance(devices, (set, frozenset)) and len(devices) > 1:
        ids = sorted(str(getattr(d, "id", d)) for d in devices)
        text += f" over devices {{{', '.join(ids)}}}"
    return text


def describe_kind(kind: Kind) -> str:
    """``float32 on cpu (torch)``."""
    return f"{describe_dtype(kind.dtype)} on {describe_device(kind.device)} ({describe_namespace(kind.xp)})"


def describe_array(x: Any) -> str:
    """``float32 array of shape (2, 3) on cpu``."""
    return f"{describe_dtype(x.dtype)} array of shape {tuple(x.shape)} on {describe_device(device_of(x))}"
