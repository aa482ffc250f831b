"""`re.offsets` (SPEC section 16): where each parameter lives in the flat vector, on every backend."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import functorkit as fk

from conftest import to_numpy


def _model(xp: Any) -> dict[str, Any]:
    w = xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3))
    return {
        "enc": {"w": w, "b": xp.asarray([10.0, 11.0, 12.0], dtype=xp.float64)},
        "steps": xp.asarray([1, 2], dtype=xp.int64),  # a constant: no row
        "dec": [w, xp.asarray(7.0, dtype=xp.float64), fk.Diagonal(xp.asarray([20.0, 21.0], dtype=xp.float64))],
        "act": "tanh",
    }


def test_offsets_match_paths_shapes_and_slices_of_flat(xp: Any) -> None:
    model = _model(xp)
    flat, re = fk.destructure(model)
    rows = re.offsets
    assert [p for p, _, _, _ in rows] == list(re.paths)
    assert [s for _, _, _, s in rows] == list(re.shapes)
    # the tie (enc.w == dec[0]) once, the Diagonal by its storage, the int array not at all
    assert [str(p) for p, _, _, _ in rows] == ["enc.w", "enc.b", "dec[1]", "dec[2].diag"]
    assert [(a, b) for _, a, b, _ in rows] == [(0, 6), (6, 9), (9, 10), (10, 12)]
    assert rows[-1][2] == len(re)
    f = to_numpy(flat)
    for path, start, stop, shape in rows:
        assert type(start) is int
        assert type(stop) is int
        assert type(shape) is tuple
        assert all(type(d) is int for d in shape)
        leaf = path.get(model)
        np.testing.assert_array_equal(f[start:stop].reshape(shape), to_numpy(leaf))


def test_offsets_slice_a_new_vector_as_re_places_it(xp: Any) -> None:
    model = _model(xp)
    _, re = fk.destructure(model)
    p = xp.arange(len(re), dtype=xp.float64) * 3.0
    rebuilt = re(p)
    pn = to_numpy(p)
    for path, start, stop, shape in re.offsets:
        np.testing.assert_array_equal(to_numpy(path.get(rebuilt)), pn[start:stop].reshape(shape))


def test_offsets_of_a_model_without_parameters_and_of_frozen_ones() -> None:
    _, re = fk.destructure({"n": np.arange(3), "s": "x"})
    assert re.offsets == ()
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    net[0].weight.requires_grad_(False)
    flat, re = fk.destructure(net)
    assert [str(p) for p, *_ in re.offsets] == ["[0].bias", "[1].weight", "[1].bias", "[2].weight", "[2].bias"]
    for path, start, stop, shape in re.offsets:
        torch.testing.assert_close(flat[start:stop].reshape(shape), path.get(net).detach())
