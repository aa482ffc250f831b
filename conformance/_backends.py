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
        x = _local(x)
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
        return _local(x).detach().numpy()  # type: ignore[no-any-return]
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
        a, p = _local(a), _local(p)
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


def _local(x: Any) -> Any:
    """A torch DTensor's local shard (the memory this process holds); any other tensor as it is."""
    to_local = getattr(x, "to_local", None)
    return x if to_local is None else to_local()


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
    #: runs in processes of its own (conformance/_isolated.py): "ranks" (torch.distributed ranks),
    #: "devices" (JAX with several host devices); None: in run.py's process
    isolated: str | None = None
    #: why it cannot run here beyond its module being absent (torch without torch.distributed)
    also_missing: Callable[[], str | None] = field(default=lambda: None)
    #: what becomes of the ``module`` structure's nn.Module on this backend (FSDP2: `fully_shard`)
    wrap_module: Callable[[Any], Any] = field(default=lambda net: net)

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
        return self.also_missing()


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


# ---- sharded: torch DTensor over gloo ranks, JAX arrays over a Mesh of host devices --------------

#: the ranks of the DTensor column, and the host devices (a 2 x 2 mesh) of the JAX sharded column
DTENSOR_RANKS = 2
JAX_MESH = (2, 2)
_MESH: list[Any] = []  # the column's one mesh, made by its setup in its own process


def _dtensor_missing() -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "not run: this torch build has no torch.distributed"
    if not dist.is_gloo_available():
        return "not run: this torch build has no gloo backend"
    try:
        importlib.import_module("torch.distributed.tensor")
    except ImportError:
        return "not run: this torch has no torch.distributed.tensor (DTensor)"
    return None


def _dtensor_setup() -> None:
    """The default process group of this rank (the environment of conformance/_isolated.py) and a
    1-D CPU mesh over every rank; once per process."""
    if _MESH:
        return
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    _MESH.append(init_device_mesh("cpu", (dist.get_world_size(),)))


def _dtensor_make(v: np.ndarray, dtype: str, where: str) -> Any:
    """A DTensor sharded on its first axis over the ranks (unevenly where it does not divide,
    as FSDP2 does); 0-d: replicated. Every rank builds the same values: no communication."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    x = _torch_maker("cpu", "cpu")(v, dtype, where)
    placement = Shard(0) if x.ndim else Replicate()
    return distribute_tensor(x, _MESH[0], [placement], src_data_rank=None)


def _fully_shard(net: Any) -> Any:
    """FSDP2: every parameter of `net` a DTensor sharded over the ranks (`fully_shard` in place)."""
    from torch.distributed.fsdp import fully_shard

    return fully_shard(net, mesh=_MESH[0])


def _jax_sharded_setup() -> None:
    if _MESH:
        return
    import jax

    jax.config.update("jax_enable_x64", True)
    n = JAX_MESH[0] * JAX_MESH[1]
    if len(jax.devices()) < n:
        msg = f"the JAX sharded column needs {n} devices, found {len(jax.devices())} (XLA_FLAGS not set?)"
        raise RuntimeError(msg)
    _MESH.append(jax.make_mesh(JAX_MESH, ("x", "y"), devices=jax.devices()[:n]))


def _jax_sharded_role(x: Any) -> str:
    """The role "default" for an array placed over the column's whole mesh (split or replicated), "one
    device" for one that lost its sharding (the check that `re(p)` keeps it)."""
    devices = set(_MESH[0].devices.flat)
    return "default" if set(x.sharding.device_set) == devices else "one device"


def _dtensor_role(x: Any) -> str:
    """The role "default" for a DTensor on the column's mesh, "plain tensor" for anything else."""
    mesh = getattr(x, "device_mesh", None)
    return "default" if mesh is not None and mesh == _MESH[0] else "plain tensor"


def _jax_sharded_make(v: np.ndarray, dtype: str, where: str) -> Any:
    """A JAX array over the 2 x 2 mesh: its first axis split over "x" where that axis divides,
    else replicated (replicated over "y" either way)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    x = _jax_make(v, dtype, where)
    split = x.ndim > 0 and x.shape[0] % JAX_MESH[0] == 0
    spec = PartitionSpec("x") if split else PartitionSpec()
    return jax.device_put(x, NamedSharding(_MESH[0], spec))


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
    "torch_dtensor": Backend(
        "torch_dtensor",
        "torch",
        _dtensor_make,
        _numpy_other,
        _dtensor_role,
        _mod_is("torch"),
        setup=_dtensor_setup,
        isolated="ranks",
        also_missing=_dtensor_missing,
        wrap_module=_fully_shard,
    ),
    "jax_sharded": Backend(
        "jax_sharded",
        "jax",
        _jax_sharded_make,
        _numpy_other,
        _jax_sharded_role,
        _mod_is("jax|jaxlib"),
        setup=_jax_sharded_setup,
        isolated="devices",
    ),
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
