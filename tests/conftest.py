"""Backend fixtures shared by every test.

`backend` / `xp` run a test once per array library installed here (NumPy,
read-only NumPy, torch CPU, array-api-strict, JAX, Dask, CuPy); a library that
is not installed is skipped, so each nox session tests the backends it has.
`device` deliberately returns a *non-default* device (array-api-strict's
``device1``, torch ``meta``) so that device bugs show.
"""

from __future__ import annotations

import enum
import importlib
import os
from typing import Any

import numpy as np
import pytest


class Backend(enum.Enum):
    NUMPY = "numpy"
    NUMPY_READONLY = "numpy_readonly"
    TORCH = "torch"
    ARRAY_API_STRICT = "array_api_strict"
    JAX = "jax"
    DASK = "dask"
    CUPY = "cupy"

    @property
    def modname(self) -> str:
        return {
            Backend.NUMPY: "numpy",
            Backend.NUMPY_READONLY: "numpy",
            Backend.TORCH: "torch",
            Backend.ARRAY_API_STRICT: "array_api_strict",
            Backend.JAX: "jax",
            Backend.DASK: "dask",
            Backend.CUPY: "cupy",
        }[self]


def _selected() -> list[Backend]:
    only = os.environ.get("FUNCTORKIT_BACKENDS")
    if only:
        names = {n.strip() for n in only.split(",")}
        return [b for b in Backend if b.value in names or b.modname in names]
    return list(Backend)


def _skip_unless_available(b: Backend) -> None:
    pytest.importorskip(b.modname)
    if b is Backend.CUPY:
        import cupy

        try:
            if cupy.cuda.runtime.getDeviceCount() < 1:
                pytest.skip("CuPy needs a GPU")
        except Exception:  # noqa: BLE001
            pytest.skip("CuPy needs a GPU")


def namespace_for(b: Backend) -> Any:
    """The array namespace tests build arrays with for backend `b`."""
    _skip_unless_available(b)
    if b in (Backend.NUMPY, Backend.NUMPY_READONLY):
        import array_api_compat.numpy as xp
    elif b is Backend.TORCH:
        import array_api_compat.torch as xp
    elif b is Backend.ARRAY_API_STRICT:
        import array_api_strict as xp
    elif b is Backend.JAX:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as xp
    elif b is Backend.DASK:
        import array_api_compat.dask.array as xp
    else:
        import array_api_compat.cupy as xp
    return xp


@pytest.fixture(params=_selected(), ids=lambda b: b.value)
def backend(request: pytest.FixtureRequest) -> Backend:
    b: Backend = request.param
    _skip_unless_available(b)
    return b


@pytest.fixture
def xp(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The array namespace of the backend under test.

    For NUMPY_READONLY, ``xp.asarray`` returns read-only arrays, so any write
    into an input array raises.
    """
    ns = namespace_for(backend)
    if backend is Backend.NUMPY_READONLY:
        return ReadOnlyNumpy(ns)
    return ns


class ReadOnlyNumpy:
    """array_api_compat.numpy whose array constructors return read-only arrays."""

    def __init__(self, ns: Any) -> None:
        self._ns = ns

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ns, name)
        if name in {"asarray", "zeros", "ones", "arange", "full", "empty", "linspace", "eye"}:

            def readonly(*args: Any, **kwargs: Any) -> Any:
                out = attr(*args, **kwargs)
                if isinstance(out, np.ndarray):
                    out = out.copy()
                    out.flags.writeable = False
                return out

            return readonly
        return attr


@pytest.fixture
def device(backend: Backend) -> Any:
    """A non-default device of the backend (array-api-strict device1, torch meta)."""
    if backend is Backend.ARRAY_API_STRICT:
        import array_api_strict

        return array_api_strict.Device("device1")
    if backend is Backend.TORCH:
        import torch

        return torch.device("meta")
    if backend is Backend.JAX:
        import jax

        return jax.devices()[0]
    if backend is Backend.CUPY:
        import cupy

        return cupy.cuda.Device(0)
    return "cpu"


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of array `x` of any backend (test-only helper)."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return x.detach().cpu().numpy().copy()
    if mod == "array_api_strict":
        return np.array(x._array, copy=True)
    if mod == "cupy":
        return x.get()
    if mod == "dask":
        return np.asarray(x.compute())
    return np.array(x, copy=True)


def importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True
