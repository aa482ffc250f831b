"""The arithmetic on Dask models (fk.mean, fk.lincomb, fk.lerp, fk.scale, ...: a linear merge of
fk.open'ed checkpoints) is one task per block running the chunk library's own kernel, bit-identical
to the same arithmetic on the NumPy models, for float32, float64 and bfloat16 (computed in float32
and rounded once, as on NumPy), with chunks that differ between the inputs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import functorkit as fk

da = pytest.importorskip("dask.array")

OPS: dict[str, Callable[[list[Any]], Any]] = {
    "mean": lambda ms: fk.mean(ms),
    "lincomb": lambda ms: fk.lincomb([0.3, 0.5, -0.2], ms),
    "lincomb_0d": lambda ms: fk.lincomb([np.float32(0.3), 0.5, -0.2], ms),
    "lerp_low": lambda ms: fk.lerp(ms[0], ms[1], 0.3),
    "lerp_high": lambda ms: fk.lerp(ms[0], ms[1], 0.7),
    "scale": lambda ms: fk.scale(0.3, ms[0]),
}


def _dtype(name: str) -> Any:
    if name == "bfloat16":
        return pytest.importorskip("ml_dtypes").bfloat16
    return np.dtype(name)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("op", list(OPS))
def test_dask_arithmetic_is_one_kernel_task_per_block_and_bit_identical(op: str, dtype: str) -> None:
    dt = _dtype(dtype)
    rng = np.random.default_rng(3)
    eager = [
        {"w": rng.standard_normal((50, 7)).astype(dt), "s": np.asarray(rng.standard_normal()).astype(dt)}
        for _ in range(3)
    ]
    lazy = [
        {"w": da.from_array(m["w"], chunks=(c, 7)), "s": da.from_array(m["s"])}
        for m, c in zip(eager, (9, 13, 50), strict=True)
    ]
    out = OPS[op](lazy)
    layers = {str(k[0] if isinstance(k, tuple) else k).rsplit("-", 1)[0] for k in dict(out["w"].__dask_graph__())}
    assert "_block_kernel" in layers, layers  # the fast path: one map_blocks of the kernel
    assert not layers & {"add", "mul", "truediv", "sub", "astype"}, layers  # no per-operation layers
    ref = OPS[op](eager)
    for k in ("w", "s"):
        got = out[k].compute()
        assert got.dtype == ref[k].dtype == dt, k
        np.testing.assert_array_equal(
            got.reshape(-1).view(np.uint8), np.asarray(ref[k]).reshape(-1).view(np.uint8), err_msg=k
        )


def test_lazy_coefficient_is_an_input_of_the_kernel() -> None:
    """A 0-d Dask coefficient (a lazy reduction) enters the per-block kernel as a computed 0-d input."""
    x = np.arange(12.0, dtype=np.float32).reshape(6, 2)
    lazy = {"w": da.from_array(x, chunks=(2, 2))}
    c = da.sum(lazy["w"]) / 66  # 1.0, lazy
    out = fk.scale(c, lazy)
    np.testing.assert_array_equal(out["w"].compute(), x * np.float32(1.0))
