"""fk.Diagonal and fk.Transpose: nodes whose children are their storage, on every backend."""

from __future__ import annotations

import copy
import pathlib
import pickle
import sys
from typing import Any

import array_api_compat
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import functorkit as fk

from conftest import Backend, namespace_for, to_numpy


def f64(xp: Any, vals: Any, device: Any = None) -> Any:
    if device is None:
        return xp.asarray(vals, dtype=xp.float64)
    return xp.asarray(vals, dtype=xp.float64, device=device)


def close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(to_numpy(a), np.asarray(b), rtol=1e-12, atol=1e-12)


def same_library(x: Any, y: Any) -> bool:
    return array_api_compat.array_namespace(x) is array_api_compat.array_namespace(y)


def rmatmul(x: Any, w: Any) -> Any:
    """``x @ w`` through the operator, except on array-api-strict, whose arrays reject foreign operands."""
    if type(x).__module__.startswith("array_api_strict"):
        return w.__rmatmul__(x)
    return x @ w


D_VALS = [1.0, -2.0, 3.0]
W_VALS = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]  # 2 x 3


# --------------------------------------------------------------- construction


def test_diagonal_metadata(xp: Any) -> None:
    d = f64(xp, D_VALS)
    D = fk.Diagonal(d)
    assert D.diag is d
    assert D.shape == (3, 3)
    assert D.ndim == 2
    assert D.dtype == d.dtype
    assert D.device == array_api_compat.device(d)
    assert D.T is D
    assert repr(D).startswith("Diagonal(")


def test_transpose_metadata(xp: Any) -> None:
    w = f64(xp, W_VALS)
    T = fk.Transpose(w)
    assert T.parent is w
    assert T.shape == (3, 2)
    assert T.ndim == 2
    assert T.dtype == w.dtype
    assert T.device == array_api_compat.device(w)
    assert T.T is w
    assert repr(T).startswith("Transpose(")


def test_transpose_of_batched_array_swaps_last_two_axes(xp: Any) -> None:
    a = xp.reshape(xp.arange(24, dtype=xp.float64), (2, 3, 4))
    T = fk.Transpose(a)
    assert T.shape == (2, 4, 3)
    assert T.ndim == 3
    close(T.dense(), np.swapaxes(np.arange(24.0).reshape(2, 3, 4), -1, -2))
    x = xp.reshape(xp.arange(6, dtype=xp.float64), (3, 2))
    close(T @ x, np.swapaxes(np.arange(24.0).reshape(2, 3, 4), -1, -2) @ np.arange(6.0).reshape(3, 2))


def test_constructors_never_simplify_but_T_does(xp: Any) -> None:
    w = f64(xp, W_VALS)
    D = fk.Diagonal(f64(xp, D_VALS))
    TT = fk.Transpose(fk.Transpose(w))
    assert type(TT) is fk.Transpose
    assert type(TT.parent) is fk.Transpose
    assert TT.shape == (2, 3)
    assert TT.T is TT.parent
    assert TT.T.T is w
    close(TT.dense(), W_VALS)
    TD = fk.Transpose(D)
    assert type(TD) is fk.Transpose
    assert TD.T is D
    assert TD.shape == (3, 3)
    assert TD.dtype == D.dtype
    assert TD.device == D.device
    close(TD.dense(), np.diag(D_VALS))


def test_diagonal_validates_input(xp: Any) -> None:
    with pytest.raises(TypeError, match="1-D array"):
        fk.Diagonal([1.0, 2.0])
    with pytest.raises(ValueError, match=r"shape \(2, 3\)"):
        fk.Diagonal(f64(xp, W_VALS))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        fk.Diagonal(f64(xp, 1.0))


def test_transpose_validates_input(xp: Any) -> None:
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        fk.Transpose(f64(xp, D_VALS))
    with pytest.raises(TypeError, match="structured wrapper"):
        fk.Transpose([[1.0, 2.0]])
    with pytest.raises(TypeError, match="structured wrapper"):
        fk.Transpose("W")


def test_wrappers_are_immutable(xp: Any) -> None:
    d = f64(xp, D_VALS)
    D, T = fk.Diagonal(d), fk.Transpose(f64(xp, W_VALS))
    with pytest.raises(AttributeError, match="immutable"):
        D.diag = d  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        T.parent = d  # type: ignore[misc]
    assert D.diag is d


def test_wrappers_cannot_lose_their_storage(xp: Any) -> None:
    """``del T.parent`` / ``del D.diag`` went through (only setting was refused): the wrapper was
    left without its storage, and every walk over it then raised a raw AttributeError."""
    d, w = f64(xp, D_VALS), f64(xp, W_VALS)
    D, T = fk.Diagonal(d), fk.Transpose(w)
    with pytest.raises(AttributeError, match="immutable"):
        del D.diag
    with pytest.raises(AttributeError, match="immutable"):
        del T.parent
    assert D.diag is d
    assert T.parent is w
    assert fk.leaves({"D": D, "T": T}) == [d, w]


def test_transpose_of_a_wrapper_below_two_dimensions(xp: Any) -> None:
    """A wrapper-like parent (shape and dense()) of 1 dimension made a Transpose whose `shape`
    raised a raw IndexError; it is refused as a 1-D array is."""

    class Vec:
        def __init__(self, v: Any) -> None:
            self.v = v

        shape = property(lambda self: tuple(self.v.shape))
        dtype = property(lambda self: self.v.dtype)

        def dense(self) -> Any:
            return self.v

    with pytest.raises(ValueError, match="at least 2 dimensions"):
        fk.Transpose(Vec(f64(xp, D_VALS)))
    assert fk.Transpose(Vec(f64(xp, W_VALS))).shape == tuple(reversed(f64(xp, W_VALS).shape))


def test_wrappers_are_not_arrays(xp: Any) -> None:
    D = fk.Diagonal(f64(xp, D_VALS))
    assert not array_api_compat.is_array_api_obj(D)
    assert not hasattr(D, "__array_namespace__")
    assert not hasattr(fk.Transpose(f64(xp, W_VALS)), "__array_namespace__")


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_pickle_and_deepcopy_roundtrip(lib: str) -> None:
    xp = namespace_for(Backend(lib))
    w = f64(xp, W_VALS)
    tree = {"D": fk.Diagonal(f64(xp, D_VALS)), "T": fk.Transpose(w), "w": w}
    for out in (pickle.loads(pickle.dumps(tree)), copy.deepcopy(tree)):
        assert type(out["D"]) is fk.Diagonal
        assert type(out["T"]) is fk.Transpose
        assert out["T"].parent is out["w"]  # the tie survives
        assert out["T"].parent is not w
        close(out["D"].diag, D_VALS)


# --------------------------------------------------------------------- dense


def test_diagonal_dense(xp: Any) -> None:
    d = f64(xp, D_VALS)
    out = fk.Diagonal(d).dense()
    assert same_library(out, d)
    assert out.dtype == d.dtype
    assert array_api_compat.device(out) == array_api_compat.device(d)
    close(out, np.diag(D_VALS))


def test_diagonal_dense_keeps_integer_and_complex_dtypes(xp: Any) -> None:
    di = xp.asarray([1, 2], dtype=xp.int32)
    out = fk.Diagonal(di).dense()
    assert out.dtype == xp.int32
    np.testing.assert_array_equal(to_numpy(out), [[1, 0], [0, 2]])
    dc = xp.asarray([1 + 2j, 3j], dtype=xp.complex128)
    outc = fk.Diagonal(dc).dense()
    assert outc.dtype == xp.complex128
    np.testing.assert_array_equal(to_numpy(outc), np.diag([1 + 2j, 3j]))


def test_transpose_dense(xp: Any) -> None:
    w = f64(xp, W_VALS)
    out = fk.Transpose(w).dense()
    assert same_library(out, w)
    assert out.dtype == w.dtype
    close(out, np.asarray(W_VALS).T)


# -------------------------------------------------------------------- matmul


def test_transpose_matmul_of_wrong_shapes_is_a_value_error(xp: Any) -> None:
    # docs/structured.md: shape mismatches raise ValueError (they were each library's raw error:
    # torch RuntimeError, JAX TypeError, NumPy's gufunc text, Dask's chunks)
    T = fk.Transpose(xp.reshape(xp.arange(6, dtype=xp.float64), (2, 3)))  # shape (3, 2)
    with pytest.raises(ValueError, match=r"fk\.Transpose @ x: the shapes \(3, 2\) and \(3,\) do not multiply"):
        T @ f64(xp, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=r"x @ fk\.Transpose: the shapes \(2,\) and \(3, 2\) do not multiply"):
        rmatmul(f64(xp, [1.0, 2.0]), T)
    with pytest.raises(ValueError, match=r"the shapes \(3, 2\) and \(3, 3\) do not multiply"):
        T @ fk.Diagonal(f64(xp, [1.0, 2.0, 3.0]))
    close(T @ f64(xp, [1.0, 1.0]), np.arange(6.0).reshape(2, 3).T @ np.ones(2))  # right shapes: as before


def test_diagonal_matmul_both_sides(xp: Any) -> None:
    dn = np.asarray(D_VALS)
    D = fk.Diagonal(f64(xp, D_VALS))
    M = np.arange(6.0).reshape(3, 2)
    x = f64(xp, M.tolist())
    v = f64(xp, [1.0, 2.0, 3.0])
    out = D @ x
    assert same_library(out, x)
    close(out, np.diag(dn) @ M)
    close(D @ v, np.diag(dn) @ np.asarray([1.0, 2.0, 3.0]))
    close(rmatmul(f64(xp, M.T.tolist()), D), M.T @ np.diag(dn))
    close(rmatmul(v, D), np.asarray([1.0, 2.0, 3.0]) @ np.diag(dn))
    batch = xp.reshape(xp.arange(12, dtype=xp.float64), (2, 3, 2))
    close(D @ batch, np.diag(dn) @ np.arange(12.0).reshape(2, 3, 2))
    close(
        rmatmul(xp.reshape(xp.arange(12, dtype=xp.float64), (2, 2, 3)), D),
        np.arange(12.0).reshape(2, 2, 3) @ np.diag(dn),
    )


def test_transpose_matmul_both_sides(xp: Any) -> None:
    Wn = np.asarray(W_VALS)
    T = fk.Transpose(f64(xp, W_VALS))
    x = f64(xp, [[1.0], [-1.0]])  # 2 x 1
    out = T @ x
    assert same_library(out, x)
    close(out, Wn.T @ np.asarray([[1.0], [-1.0]]))
    close(T @ f64(xp, [1.0, -1.0]), Wn.T @ np.asarray([1.0, -1.0]))
    y = f64(xp, [[1.0, 0.5, 2.0]])  # 1 x 3
    close(rmatmul(y, T), np.asarray([[1.0, 0.5, 2.0]]) @ Wn.T)
    close(rmatmul(f64(xp, [1.0, 0.5, 2.0]), T), np.asarray([1.0, 0.5, 2.0]) @ Wn.T)


def test_wrapper_at_wrapper(xp: Any) -> None:
    dn, Wn = np.asarray(D_VALS), np.asarray(W_VALS)
    D = fk.Diagonal(f64(xp, D_VALS))
    D2 = fk.Diagonal(f64(xp, [2.0, 0.5, -1.0]))
    T = fk.Transpose(f64(xp, W_VALS))  # 3 x 2
    DD = D @ D2
    assert type(DD) is fk.Diagonal  # diagonal @ diagonal stays O(n)
    close(DD.diag, dn * np.asarray([2.0, 0.5, -1.0]))
    close(D @ T, np.diag(dn) @ Wn.T)
    close(rmatmul(T.T, D), Wn @ np.diag(dn))
    TT = fk.Transpose(f64(xp, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))  # 2 x 3
    close(T @ TT, Wn.T @ np.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]).T)
    close(fk.Transpose(D) @ T, np.diag(dn) @ Wn.T)


def test_transpose_of_wrapper_matmul(xp: Any) -> None:
    dn = np.asarray(D_VALS)
    TD = fk.Transpose(fk.Diagonal(f64(xp, D_VALS)))
    M = np.arange(6.0).reshape(3, 2)
    close(TD @ f64(xp, M.tolist()), np.diag(dn) @ M)
    close(TD @ f64(xp, [1.0, 1.0, 1.0]), dn)
    close(rmatmul(f64(xp, M.T.tolist()), TD), M.T @ np.diag(dn))
    close(rmatmul(f64(xp, [1.0, 1.0, 1.0]), TD), dn)


def test_matmul_shape_mismatch_raises(xp: Any) -> None:
    D = fk.Diagonal(f64(xp, D_VALS))
    with pytest.raises(ValueError, match="3x3 but the other operand has 2 rows"):
        D @ f64(xp, [[1.0], [2.0]])
    with pytest.raises(ValueError, match="3x3 but the other operand has 2 columns"):
        D.__rmatmul__(f64(xp, [[1.0, 2.0]]))
    with pytest.raises(ValueError, match="at least 1 dimension"):
        D @ f64(xp, 2.0)
    with pytest.raises(ValueError, match="rows"):
        D @ fk.Diagonal(f64(xp, [1.0, 2.0]))


def test_matmul_with_non_array_is_not_implemented(xp: Any) -> None:
    D = fk.Diagonal(f64(xp, D_VALS))
    with pytest.raises(TypeError):
        D @ [[1.0], [2.0], [3.0]]
    assert D.__matmul__("x") is NotImplemented
    assert fk.Transpose(f64(xp, W_VALS)).__rmatmul__(3) is NotImplemented


def test_matmul_never_mixes_libraries() -> None:
    torch = pytest.importorskip("torch")
    D = fk.Diagonal(np.asarray(D_VALS))
    x = torch.ones(3, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match="numpy array but the other operand is a torch array"):
        D @ x
    with pytest.raises(TypeError, match="never converts"):
        fk.Transpose(np.ones((2, 3))) @ torch.ones(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="never converts"):
        fk.Diagonal(torch.ones(3, dtype=torch.float64)) @ fk.Diagonal(np.ones(3))


def test_strict_arrays_reject_wrappers_on_the_left() -> None:
    """array-api-strict raises for `x @ W` by design; `W.__rmatmul__(x)` is the portable spelling."""
    xp = pytest.importorskip("array_api_strict")
    D = fk.Diagonal(xp.asarray([1.0, 2.0]))
    x = xp.asarray([[1.0, 1.0]])
    with pytest.raises(TypeError, match="Expected Array"):
        x @ D
    close(D.__rmatmul__(x), [[1.0, 2.0]])


def test_diagonal_matmul_scales_rows_without_densifying(xp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dense(self: Any) -> Any:
        raise AssertionError("dense() called")

    monkeypatch.setattr(fk.Diagonal, "dense", no_dense)
    D = fk.Diagonal(f64(xp, D_VALS))
    close(D @ f64(xp, [[1.0], [1.0], [1.0]]), [[1.0], [-2.0], [3.0]])
    close(rmatmul(f64(xp, [[1.0, 1.0, 1.0]]), D), [[1.0, -2.0, 3.0]])
    close((D @ D).diag, [1.0, 4.0, 9.0])


def test_diagonal_matmul_is_linear_in_n() -> None:
    xp = namespace_for(Backend.NUMPY)
    n = 200_000  # the dense matrix would need 320 GB
    d = xp.linspace(1.0, 2.0, n, dtype=xp.float64)
    x = xp.ones((n, 2), dtype=xp.float64)
    out = fk.Diagonal(d) @ x
    assert out.shape == (n, 2)
    close(out[:, 1], np.linspace(1.0, 2.0, n))
    close(rmatmul(x.T, fk.Diagonal(d))[0], np.linspace(1.0, 2.0, n))


def test_wrappers_on_a_non_default_device(xp: Any, device: Any, backend: Any) -> None:
    d = f64(xp, D_VALS, device)
    w = f64(xp, W_VALS, device)
    D, T = fk.Diagonal(d), fk.Transpose(w)
    dev = array_api_compat.device(d)
    assert D.device == dev
    assert T.device == dev
    outs = [D.dense(), T.dense(), D @ f64(xp, [[1.0], [1.0], [1.0]], device), T @ f64(xp, [1.0, 1.0], device)]
    for out in outs:
        assert array_api_compat.device(out) == dev
    assert tuple(outs[2].shape) == (3, 1)
    if backend.value != "torch":  # torch's non-default device is `meta`: shapes only, no values
        close(outs[0], np.diag(D_VALS))
        close(outs[2], [[1.0], [-2.0], [3.0]])
        close(outs[3], np.asarray(W_VALS).T @ np.ones(2))


def test_gradients_flow_through_wrappers() -> None:
    torch = pytest.importorskip("torch")

    d = torch.tensor(D_VALS, dtype=torch.float64, requires_grad=True)
    w = torch.tensor(W_VALS, dtype=torch.float64, requires_grad=True)
    x = torch.ones(3, dtype=torch.float64)
    loss = (fk.Transpose(w).T @ (fk.Diagonal(d) @ x)).sum() + fk.Diagonal(d).dense().sum()
    loss.backward()
    assert d.grad is not None
    assert w.grad is not None
    # d/dd_i sum_j W_ji d_i + sum_i d_i = sum_j W_ji + 1
    close(d.grad, np.asarray(W_VALS).sum(axis=0) + 1.0)


def test_wrappers_inside_jit() -> None:
    xp = namespace_for(Backend.JAX)
    import jax

    @jax.jit
    def f(d: Any, w: Any, x: Any) -> Any:
        return fk.Transpose(w) @ (fk.Diagonal(d) @ x)[:2]

    out = f(f64(xp, D_VALS), f64(xp, W_VALS), f64(xp, [1.0, 1.0, 1.0]))
    close(out, np.asarray(W_VALS).T @ np.asarray([1.0, -2.0]))


# --------------------------------------------------------------------- walks


def test_fmap_calls_f_on_the_storage_and_rebuilds_the_wrapper(xp: Any) -> None:
    w = f64(xp, W_VALS)
    d = f64(xp, D_VALS)
    seen: list[Any] = []

    def f(x: Any) -> Any:
        seen.append(x)
        return x * 2

    out = fk.fmap(f, {"T": fk.Transpose(w), "D": fk.Diagonal(d)})
    assert seen[0] is w
    assert seen[1] is d
    assert type(out["T"]) is fk.Transpose
    assert type(out["D"]) is fk.Diagonal
    close(out["T"].parent, np.asarray(W_VALS) * 2)
    close(out["D"].diag, np.asarray(D_VALS) * 2)


def test_paths_go_through_the_storage(xp: Any) -> None:
    model = {"dec": {"weight": fk.Transpose(f64(xp, W_VALS))}, "scale": fk.Diagonal(f64(xp, D_VALS))}
    assert [str(p) for p, _ in fk.leaves_with_path(model)] == ["dec.weight.parent", "scale.diag"]
    got = fk.fmap_with_path(lambda p, x: str(p), model)
    assert got["dec"]["weight"].parent == "dec.weight.parent"
    assert fk.KeyPath(("dec", "weight", "parent")).get(model) is model["dec"]["weight"].parent


def test_a_diagonal_contributes_n_leaves_entries_not_n_squared(xp: Any) -> None:
    (leaf,) = fk.leaves(fk.Diagonal(f64(xp, D_VALS)))
    assert tuple(leaf.shape) == (3,)


def test_transpose_keeps_the_tie(xp: Any) -> None:
    W = f64(xp, W_VALS)
    model = {"enc": W, "dec": fk.Transpose(W)}
    assert len(fk.leaves(model)) == 1
    assert fk.leaves(model)[0] is W
    calls: list[Any] = []

    def f(x: Any) -> Any:
        calls.append(x)
        return x + 1

    out = fk.fmap(f, model)
    assert len(calls) == 1
    assert out["dec"].parent is out["enc"]
    close(out["enc"], np.asarray(W_VALS) + 1)
    with_path = fk.fmap_with_path(lambda p, x: x - 1, model)
    assert with_path["dec"].parent is with_path["enc"]


def test_gpt2_style_tie_survives_fmap(xp: Any) -> None:
    """An embedding matrix E (vocab x d) reused as the LM head E.T (d x vocab)."""
    E = xp.reshape(xp.arange(12, dtype=xp.float64), (4, 3))
    model = {
        "wte": E,
        "blocks": [{"w": f64(xp, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])}],
        "lm_head": fk.Transpose(E),
    }
    out = fk.fmap(lambda x: x * 0.5, model)
    assert out["lm_head"].parent is out["wte"]
    assert out["lm_head"].shape == (3, 4)
    h = f64(xp, [1.0, 0.0, 0.0])  # one hidden state -> logits over the 4 tokens
    close(rmatmul(h, out["lm_head"]), 0.5 * np.arange(12.0).reshape(4, 3) @ np.asarray([1.0, 0.0, 0.0]))
    assert sum(1 for _ in fk.leaves(model)) == 2


def test_fmapstructure_gives_plain_dicts(xp: Any) -> None:
    out = fk.fmapstructure(
        lambda x: tuple(x.shape), {"T": fk.Transpose(f64(xp, W_VALS)), "D": fk.Diagonal(f64(xp, D_VALS))}
    )
    assert out == {"T": {"parent": (2, 3)}, "D": {"diag": (3,)}}


def test_multi_tree_fmap(xp: Any) -> None:
    a = {"T": fk.Transpose(f64(xp, W_VALS)), "D": fk.Diagonal(f64(xp, D_VALS))}
    b = {"T": fk.Transpose(f64(xp, [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])), "D": fk.Diagonal(f64(xp, [1.0, 1.0, 1.0]))}
    out = fk.fmap(lambda x, y: x + y, a, b)
    assert type(out["T"]) is fk.Transpose
    close(out["T"].parent, np.asarray(W_VALS) + 1)
    close(out["D"].diag, np.asarray(D_VALS) + 1)


def test_multi_tree_fmap_rejects_different_wrappers(xp: Any) -> None:
    a = {"w": fk.Transpose(f64(xp, [[1.0, 2.0], [3.0, 4.0]]))}
    b = {"w": fk.Diagonal(f64(xp, [1.0, 2.0]))}
    with pytest.raises(fk.StructureError, match=r"at w: .*Transpose.*Diagonal"):
        fk.fmap(lambda x, y: x + y, a, b)
    with pytest.raises(fk.StructureError, match="at w"):
        fk.fmap(lambda x, y: x + y, a, {"w": f64(xp, [[1.0, 2.0], [3.0, 4.0]])})


def test_fmap_may_put_non_arrays_in_the_slot(xp: Any) -> None:
    """A walk rebuilds without validating, as JAX pytrees do: shapes, None, strings are fine."""
    tree = {"T": fk.Transpose(f64(xp, W_VALS)), "D": fk.Diagonal(f64(xp, D_VALS))}
    shapes = fk.fmap(lambda x: tuple(x.shape), tree)
    assert type(shapes["T"]) is fk.Transpose
    assert shapes["T"].parent == (2, 3)
    assert shapes["D"].diag == (3,)
    back = fk.fmap(lambda s: xp.zeros(s, dtype=xp.float64), shapes, is_leaf=lambda s: type(s) is tuple)
    assert back["T"].shape == (3, 2)
    assert back["D"].shape == (3, 3)


def test_storage_is_trainable(xp: Any) -> None:
    tree = {"T": fk.Transpose(f64(xp, W_VALS)), "D": fk.Diagonal(f64(xp, D_VALS)), "idx": xp.asarray([1, 2])}
    out = fk.fmap(lambda x: x * 0, tree, trainable_only=True)
    close(out["T"].parent, np.zeros((2, 3)))
    close(out["D"].diag, np.zeros(3))
    assert out["idx"] is tree["idx"]


def test_shared_wrapper_object_is_rebuilt_once(xp: Any) -> None:
    T = fk.Transpose(f64(xp, W_VALS))
    out = fk.fmap(lambda x: x * 3, {"a": T, "b": [T]})
    assert out["a"] is out["b"][0]
    assert out["a"] is not T


# ---------------------------------------------- a user-defined wrapper (docs/structured.md)


class LowRank:
    """The matrix ``U @ V.T`` stored as its two thin factors (m x r and n x r)."""

    __array_ufunc__ = None  # NumPy/Dask/CuPy: let `x @ lr` reach __rmatmul__

    def __init__(self, U: Any, V: Any) -> None:
        self.U, self.V = U, V

    @property
    def shape(self) -> tuple[int, int]:
        return (self.U.shape[0], self.V.shape[0])

    @property
    def dtype(self) -> Any:
        return self.U.dtype

    @property
    def T(self) -> LowRank:
        return LowRank(self.V, self.U)

    def dense(self) -> Any:
        xp = array_api_compat.array_namespace(self.U, self.V)
        return self.U @ xp.matrix_transpose(self.V)

    def __matmul__(self, x: Any) -> Any:  # (U V^T) x = U (V^T x): O((m + n) r k), never m x n
        xp = array_api_compat.array_namespace(self.U, self.V, x)
        return self.U @ (xp.matrix_transpose(self.V) @ x)

    def __rmatmul__(self, x: Any) -> Any:  # x (U V^T) = (x U) V^T
        xp = array_api_compat.array_namespace(self.U, self.V, x)
        return (x @ self.U) @ xp.matrix_transpose(self.V)


fk.register(
    LowRank,
    children=lambda lr: ({"U": lr.U, "V": lr.V}, None),
    rebuild=lambda aux, ch: LowRank(ch["U"], ch["V"]),
)


def test_user_defined_low_rank_wrapper(xp: Any) -> None:
    Un = np.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]])  # 4 x 2
    Vn = np.asarray([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # 3 x 2
    dense = Un @ Vn.T  # 4 x 3
    U, V = f64(xp, Un.tolist()), f64(xp, Vn.tolist())
    model = {"proj": LowRank(U, V), "bias": f64(xp, [0.0, 0.0, 0.0, 0.0])}
    # a node: its factors are the leaves (4*2 + 3*2 numbers, not 4*3), paths go through it
    assert [str(p) for p, _ in fk.leaves_with_path(model)] == ["proj.U", "proj.V", "bias"]
    out = fk.fmap(lambda a: a * 2, model)
    assert type(out["proj"]) is LowRank
    close(out["proj"].dense(), 4 * dense)
    # it composes with the built-in wrappers
    lr = model["proj"]
    x = f64(xp, [1.0, 1.0, 1.0])
    close(lr @ x, dense @ np.ones(3))
    close(rmatmul(f64(xp, [1.0, 1.0, 1.0, 1.0]), lr), np.ones(4) @ dense)
    T = fk.Transpose(lr)
    assert T.shape == (3, 4)
    assert T.dtype == lr.dtype
    close(T.dense(), dense.T)
    close(T @ f64(xp, [1.0, 1.0, 1.0, 1.0]), dense.T @ np.ones(4))
    close(T @ f64(xp, np.eye(4).tolist()), dense.T)
    close(rmatmul(f64(xp, np.eye(3).tolist()), T), dense.T)
    close(fk.Diagonal(f64(xp, [1.0, 2.0, 3.0, 4.0])) @ lr, np.diag([1.0, 2.0, 3.0, 4.0]) @ dense)
    # a tie through it: the encoder's factor reused by the decoder
    tied = {"enc": lr, "dec": fk.Transpose(lr)}
    out2 = fk.fmap(lambda a: a + 1, tied)
    assert out2["dec"].parent is out2["enc"]
