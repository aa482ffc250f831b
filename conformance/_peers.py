"""The same cases against the peers: optree, JAX and torch's own flatten/unflatten.

Each peer runs on its own backend, on the very model and p that functorkit's case builds, and
the result is recorded as found (never compared to an expectation): the dtype, device role,
namespace role and view/copy of every array leaf it returns, whether it mutated its inputs,
or the class of the exception it raised.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from _backends import Backend, dtype_name, host
from _table import build_model, build_p, describe_leaves, facts, not_applicable


@dataclass(frozen=True)
class Peer:
    name: str
    label: str
    backend: str
    module: str
    ravel: Callable[[Any], tuple[Any, Callable[[Any], Any]]]  # model -> (flat, unravel)
    leaves: Callable[[Any], list[tuple[str, Any]]]  # result -> [(path, array)]


def _optree_leaves(tree: Any) -> list[tuple[str, Any]]:
    import optree

    paths, leaves, _ = optree.tree_flatten_with_path(tree)
    return [(".".join(str(k) for k in path), leaf) for path, leaf in zip(paths, leaves)]


def _jax_leaves(tree: Any) -> list[tuple[str, Any]]:
    import jax

    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        out.append((".".join(keys), leaf))
    return out


def _optree_numpy(model: Any) -> tuple[Any, Callable[[Any], Any]]:
    from optree.integrations.numpy import tree_ravel

    return tree_ravel(model)  # type: ignore[no-any-return]


def _optree_torch(model: Any) -> tuple[Any, Callable[[Any], Any]]:
    from optree.integrations.torch import tree_ravel

    return tree_ravel(model)  # type: ignore[no-any-return]


def _jax_ravel(model: Any) -> tuple[Any, Callable[[Any], Any]]:
    from jax.flatten_util import ravel_pytree

    return ravel_pytree(model)  # type: ignore[no-any-return]


def _torch_params(model: Any) -> list[Any]:
    """What a torch user hands to parameters_to_vector: module.parameters(), or the float tensors."""
    import torch

    import functorkit as fk

    if isinstance(model, torch.nn.Module):
        return list(model.parameters())
    return [x for x in fk.leaves(model) if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex())]


def _torch_v2p(model: Any) -> tuple[Any, Callable[[Any], Any]]:
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    params = _torch_params(model)
    flat = parameters_to_vector(params)

    def unravel(p: Any) -> Any:
        vector_to_parameters(p, params)  # writes into the model's own tensors
        return params

    return flat, unravel


def _torch_leaves(out: Any) -> list[tuple[str, Any]]:
    return [(f"[{i}]", x) for i, x in enumerate(out)]


PEERS: dict[str, Peer] = {
    "optree_numpy": Peer(
        "optree_numpy", "optree `tree_ravel` (NumPy)", "numpy", "optree", _optree_numpy, _optree_leaves
    ),
    "optree_torch": Peer(
        "optree_torch", "optree `tree_ravel` (torch)", "torch", "optree", _optree_torch, _optree_leaves
    ),
    "jax": Peer("jax", "JAX `ravel_pytree`", "jax", "jax", _jax_ravel, _jax_leaves),
    "torch_v2p": Peer(
        "torch_v2p",
        "torch `parameters_to_vector` / `vector_to_parameters`",
        "torch",
        "torch",
        _torch_v2p,
        _torch_leaves,
    ),
}


def _arrays(tree: Any) -> list[np.ndarray | None]:
    import functorkit as fk

    try:
        leaves = fk.leaves(tree)
    except Exception:  # noqa: BLE001 - a tree functorkit cannot walk: JAX's registry
        import jax

        leaves = jax.tree_util.tree_leaves(tree)
    return [None if host(x) is None else np.array(host(x), copy=True) for x in leaves if hasattr(x, "dtype")]


def _dtypes(tree: Any) -> list[str]:
    import functorkit as fk

    try:
        leaves = fk.leaves(tree)
    except Exception:  # noqa: BLE001
        import jax

        leaves = jax.tree_util.tree_leaves(tree)
    return [dtype_name(x) for x in leaves if hasattr(x, "dtype")]


def _same(a: list[np.ndarray | None], b: list[np.ndarray | None]) -> bool:
    return len(a) == len(b) and all(
        x is None or y is None or (x.shape == y.shape and np.array_equal(x, y)) for x, y in zip(a, b)
    )


def run_peer(peer: Peer, data: dict[str, Any], be: Backend, case: dict[str, Any]) -> str:
    """One peer on one case: a description of what it returned, or the exception class."""
    why = not_applicable(data, peer.backend, case, None)
    if why is not None:
        return why
    if "copy" in case["p"]:
        return "n/a: no `copy=` argument"
    model = build_model(be, data["structure"][case["structure"]])
    values, dtypes = _arrays(model), _dtypes(model)
    try:
        flat, unravel = peer.ravel(model)
    except Exception as e:  # noqa: BLE001 - the comparison records the class of any error
        return f"{type(e).__name__} (ravel)"
    p = build_p(be, case["p"], dtype_name(flat), int(flat.shape[0]))
    p_before = host(p)
    p_before = None if p_before is None else np.array(p_before, copy=True)
    try:
        out = unravel(p)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__} (unravel)"
    rows = {}
    for path, x in peer.leaves(out):
        if not hasattr(x, "dtype"):
            continue
        rows[path] = facts(be, x, p)
    text = describe_leaves(rows)
    mutated = not _same(values, _arrays(model)) or dtypes != _dtypes(model)
    p_after = host(p)
    if p_before is not None and p_after is not None and not np.array_equal(p_before, p_after):
        mutated = True
    return text + ("; **mutates the model**" if mutated else "")


def missing(peer: Peer) -> str | None:
    try:
        importlib.import_module(peer.module)
    except ImportError:
        return f"not run: {peer.module} not installed"
    return None
