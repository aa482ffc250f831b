"""The array libraries the conformance table runs on: how to make arrays and read facts back.

Each :class:`Backend` names one library on one default device (and a second device where
the library has one). It builds the arrays a case describes and reports, for an array it
meets in a result, its dtype name, its device role (``"default"`` / ``"second"``), its
namespace role (``"backend"`` / ``"other"``) and whether it shares memory with ``p``
(``None`` where that cannot be measured: immutable libraries, ``meta`` tensors).
"""

from __future__ import annotations

import importlib
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


def dtype_name(x: Any) -> str:
    """``float32`` for every library's float32 (torch.float32, array_api_strict.float32, ...)."""
    return str(x.dtype).rsplit(".", 1)[-1]


def host(x: Any) -> np.ndarray | None:
    """A NumPy view or copy of `x`'s values, or None where it has none (meta) or is not an array."""
    mod = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        return x
    if mod == "torch":
        if x.device.type == "meta":
            return None
        y = x.detach()
        if y.dtype.is_floating_point and y.dtype.itemsize == 2 and str(y.dtype) == "torch.bfloat16":
            y = y.float()
        return y.cpu().resolve_conj().numpy()
    if mod == "array_api_strict":
        return np.asarray(x._array)
    if mod in ("jax", "jaxlib"):
        return np.asarray(x.astype("float32") if dtype_name(x) == "bfloat16" else x)
    if mod == "dask":
        return np.asarray(x.compute())
    if mod == "cupy":
        return x.get()
    return None


def _numpy_memory(x: Any) -> np.ndarray | None:
    """The NumPy array that *is* `x`'s memory (no copy), or None if there is none on the host."""
    mod = type(x).__module__.split(".")[0]
    if isinstance(x, np.ndarray):
        return x
    if mod == "array_api_strict":
        return x._array  # type: ignore[no-any-return]
    if mod == "torch" and x.device.type == "cpu" and str(x.dtype) != "torch.bfloat16":
        return x.detach().numpy()  # type: ignore[no-any-return]
    return None


def shares_memory(a: Any, p: Any) -> bool | None:
    """Whether `a` shares memory with `p`; None where it cannot be measured."""
    ma, mp = type(a).__module__.split(".")[0], type(p).__module__.split(".")[0]
    if ma in ("jax", "jaxlib", "dask") or mp in ("jax", "jaxlib", "dask"):
        return None  # immutable: "view" means "no conversion"
    if ma == "torch" and mp == "torch":
        if a.device.type == "meta" or p.device.type == "meta":
            return None
        if a.device != p.device:
            return False
        sa, sp = a.untyped_storage(), p.untyped_storage()
        lo, hi = sp.data_ptr(), sp.data_ptr() + sp.nbytes()
        return bool(lo <= sa.data_ptr() < hi)
    if ma == "cupy" and mp == "cupy":
        import cupy

        return bool(cupy.shares_memory(a, p))
    if ma == "cupy" or mp == "cupy":
        return False
    if (ma == "torch" and a.device.type == "meta") or (mp == "torch" and p.device.type == "meta"):
        return None
    na, np_ = _numpy_memory(a), _numpy_memory(p)
    if na is None or np_ is None:
        return False  # one of them lives off the host while the other is on it
    return bool(np.shares_memory(na, np_))


def _values(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    v = (np.arange(n, dtype=np.float64) + 1.0) / (n + seed + 1.0)
    if dtype.startswith("complex"):
        v = v + 0.25j
    if dtype == "int64":
        v = np.arange(n) + seed
    return v.reshape(shape)


@dataclass
class Backend:
    """One library on one default device (see conformance/cases.toml's [backend] tables)."""

    name: str
    module: str
    make: Callable[[np.ndarray, str, str], Any]  # (values, dtype, "default"|"second") -> array
    make_other: Callable[[np.ndarray, str], Any]  # an array of another namespace
    role: Callable[[Any], str]  # "default" or "second" for an array of this backend
    is_own: Callable[[Any], bool]  # whether an array is of this backend's namespace
    gpu: bool = False
    setup: Callable[[], None] = field(default=lambda: None)

    def array(self, shape: tuple[int, ...], dtype: str, where: str = "default", seed: int = 0) -> Any:
        return self.make(_values(shape, dtype, seed), dtype, where)

    def other(self, shape: tuple[int, ...], dtype: str, seed: int = 0) -> Any:
        return self.make_other(_values(shape, dtype, seed), dtype)

    def missing(self) -> str | None:
        """Why this backend cannot run here, or None."""
        if self.gpu and not _gpu_present():
            return "not run: no GPU on this machine"
        try:
            importlib.import_module(self.module)
        except ImportError:
            return f"not run: {self.module} not installed"
        if self.gpu and not _has_cuda(self.module):
            return f"not run: {self.module} sees no GPU"
        return None


def _gpu_present() -> bool:
    """Whether this machine has an NVIDIA GPU (nvidia-smi lists one)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and b"GPU" in done.stdout


def _has_cuda(module: str) -> bool:
    try:
        if module == "cupy":
            import cupy

            return bool(cupy.cuda.runtime.getDeviceCount() > 0)
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - any failure to reach a GPU means there is none
        return False


# ---- the libraries -------------------------------------------------------------------------------


def _np_make(v: np.ndarray, dtype: str, where: str) -> Any:
    return np.asarray(v, dtype=dtype)


def _xps_make(v: np.ndarray, dtype: str, where: str) -> Any:
    import array_api_strict as xps

    device = xps.Device("device1") if where == "second" else xps.Device("CPU_DEVICE")
    return xps.asarray(v.astype(dtype), device=device)


def _xps_role(x: Any) -> str:
    import array_api_strict as xps

    return "second" if x.device == xps.Device("device1") else "default"


def _torch_maker(default: str, second: str) -> Callable[[np.ndarray, str, str], Any]:
    def make(v: np.ndarray, dtype: str, where: str) -> Any:
        import torch

        device = second if where == "second" else default
        src = v.astype(np.float32) if dtype == "bfloat16" else v.astype(dtype)
        return torch.as_tensor(src).to(dtype=getattr(torch, dtype)).to(device)

    return make


def _torch_role(default: str) -> Callable[[Any], str]:
    def role(x: Any) -> str:
        return "default" if x.device.type == default else "second"

    return role


def _jax_make(v: np.ndarray, dtype: str, where: str) -> Any:
    import jax.numpy as jnp

    return jnp.asarray(v, dtype=getattr(jnp, dtype))


def _jax_setup() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)


def _dask_make(v: np.ndarray, dtype: str, where: str) -> Any:
    import dask.array as da

    return da.from_array(v.astype(dtype), chunks=2)


def _cupy_make(v: np.ndarray, dtype: str, where: str) -> Any:
    import cupy

    return cupy.asarray(v.astype(dtype))


def _mod_is(prefix: str) -> Callable[[Any], bool]:
    return lambda x: type(x).__module__.split(".")[0] in prefix.split("|")


def _numpy_other(v: np.ndarray, dtype: str) -> Any:
    return np.asarray(v, dtype=dtype)


def _xps_other(v: np.ndarray, dtype: str) -> Any:
    return _xps_make(v, dtype, "default")


def _default(x: Any) -> str:
    return "default"


BACKENDS: dict[str, Backend] = {
    "numpy": Backend("numpy", "numpy", _np_make, _xps_other, _default, lambda x: isinstance(x, np.ndarray)),
    "torch": Backend("torch", "torch", _torch_maker("cpu", "meta"), _numpy_other, _torch_role("cpu"), _mod_is("torch")),
    "torch_meta": Backend(
        "torch_meta", "torch", _torch_maker("meta", "cpu"), _numpy_other, _torch_role("meta"), _mod_is("torch")
    ),
    "array_api_strict": Backend(
        "array_api_strict", "array_api_strict", _xps_make, _numpy_other, _xps_role, _mod_is("array_api_strict")
    ),
    "jax": Backend("jax", "jax", _jax_make, _numpy_other, _default, _mod_is("jax|jaxlib"), setup=_jax_setup),
    "dask": Backend("dask", "dask", _dask_make, _numpy_other, _default, _mod_is("dask")),
    "cupy": Backend("cupy", "cupy", _cupy_make, _numpy_other, _default, _mod_is("cupy"), gpu=True),
    "torch_cuda": Backend(
        "torch_cuda",
        "torch",
        _torch_maker("cuda", "cpu"),
        _numpy_other,
        _torch_role("cuda"),
        _mod_is("torch"),
        gpu=True,
    ),
}
