"""A tour of what functorkit sees in a real (small) model.

The model is a ``dict`` holding a ``torch.nn.Sequential`` (Linear, BatchNorm1d,
ReLU, Linear, ReLU, Linear, with the last layer's weight tied to the fourth
one's and one frozen bias), a dataclass config (one field marked static) and a
few extras. The tour prints, through functorkit's public API only:

* ``fk.summary``: every leaf once, in walk order: path, shape, dtype, device,
  trainable, ties, counts and totals;
* the same leaves through the walking API: path, type, shape, dtype, device, and
  why each is or is not a parameter (a floating array reached through trainable children);
* the ties: a shared array listed once, with every path it sits at;
* ``fmapstructure`` of the shapes (the plain-dict view of the model);
* ``fmap`` cloning the model: a new ``Sequential`` of the same class, the tie
  kept, the same outputs, nothing shared with the original.

Run it with ``python examples/tour.py`` (needs torch), or ``python3 -m nox -s demo``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import array_api_compat
import numpy as np
import torch
from torch import nn

import functorkit as fk

# leaves functorkit never identity-caches (their ids say nothing about ties)
PLAIN = (bool, int, float, complex, str, bytes, type(None))


@dataclasses.dataclass
class TrainConfig:
    """A dataclass is a node: its fields are children, except the static ones."""

    lr: float = 1e-3
    label_smoothing: Any = None  # a NumPy scalar below: a constant leaf, never a parameter
    name: str = dataclasses.field(default="mlp", metadata={"static": True})


def build_model() -> dict[str, Any]:
    """The model of the tour: a tied, partly frozen MLP plus a config and extras."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Linear(4, 8),
        nn.BatchNorm1d(8),
        nn.ReLU(),
        nn.Linear(8, 8),
        nn.ReLU(),
        nn.Linear(8, 8, bias=False),  # a None bias slot: not a child
    )
    net[5].weight = net[3].weight  # a tie: one Parameter in two layers
    net[0].bias.requires_grad_(False)  # a frozen parameter: not trainable
    return {
        "net": net,
        "config": TrainConfig(label_smoothing=np.float32(0.1)),
        "extras": {"step": 0, "class_ids": np.arange(3)},
    }


def _is_array(x: Any) -> bool:
    return bool(array_api_compat.is_array_api_obj(x)) and not isinstance(x, np.generic)


def _describe(x: Any) -> tuple[str, str, str]:
    """(shape, dtype, device) of a leaf; '-' where the leaf is not an array."""
    if _is_array(x):
        dtype = str(x.dtype).removeprefix("torch.")
        return str(tuple(x.shape)), dtype, str(array_api_compat.device(x))
    if isinstance(x, np.generic):
        return "-", f"{x.dtype} (NumPy scalar)", "-"
    return "-", type(x).__name__, "-"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join("{:<%d}" % w for w in widths)  # noqa: UP031 - building a format string
    out = [line.format(*header), line.format(*("-" * w for w in widths))]
    out += [line.format(*r) for r in rows]
    return "\n".join(o.rstrip() for o in out)


def leaf_report(model: Any) -> str:
    """Every distinct leaf once, with its paths, shape, dtype, device and role."""
    # every position of every leaf (cache=False visits a shared leaf at each of its paths)
    paths_of: dict[int, list[str]] = {}

    def record(path: fk.KeyPath, x: Any) -> Any:
        if not isinstance(x, PLAIN):
            paths_of.setdefault(id(x), []).append(str(path))
        return x

    fk.fmap_with_path(record, model, cache=False)

    # the parameters: trainable_only hands f only floating arrays reached through trainable children
    trainable: set[int] = set()

    def mark(path: fk.KeyPath, x: Any) -> Any:
        trainable.add(id(x))
        return x

    fk.fmap_with_path(mark, model, trainable_only=True)

    rows = []
    n_params = 0
    for path, x in fk.leaves_with_path(model):  # each distinct leaf once, in walk order
        shape, dtype, device = _describe(x)
        if id(x) in trainable:
            why = "parameter"
            n_params += int(np.prod(tuple(x.shape)))
        elif isinstance(x, nn.Parameter):
            why = "frozen nn.Parameter" if not x.requires_grad else "integer nn.Parameter"
        elif isinstance(x, torch.Tensor):
            why = "buffer" if x.dtype.is_floating_point else "integer buffer"
        elif _is_array(x):
            why = "integer/bool array"
        elif isinstance(x, np.generic):
            why = "NumPy scalar, not an array"
        else:
            why = "not an array"
        trains = "yes" if id(x) in trainable else "no"
        others = [p for p in paths_of.get(id(x), []) if p != str(path)]
        rows.append([path.display, type(x).__name__, shape, dtype, device, trains, why, ", ".join(others)])
    header = ["path", "type", "shape", "dtype", "device", "trainable", "why", "also at (tie)"]
    ties = {tuple(ps) for ps in paths_of.values() if len(ps) > 1}
    summary = (
        f"{len(rows)} distinct leaves, {len(trainable)} parameter arrays holding {n_params} numbers "
        f"(a tied array counts once); {len(ties)} tie(s): "
        + "; ".join(" = ".join(ps) for ps in sorted(ties))
    )
    return _table(header, rows) + "\n\n" + summary


def clone_report(model: dict[str, Any]) -> str:
    """fmap as a deep clone: same classes, ties kept, same outputs, no shared tensors."""

    def clone(x: Any) -> Any:
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    copy = fk.fmap(clone, model)
    net, net2 = model["net"], copy["net"]
    x = torch.randn(5, 4)
    net.eval()
    net2.eval()
    with torch.no_grad():
        same_output = torch.equal(net(x), net2(x))
    shared = {id(t) for t in fk.leaves(model) if isinstance(t, torch.Tensor)} & {
        id(t) for t in fk.leaves(copy) if isinstance(t, torch.Tensor)
    }
    lines = [
        f"fk.fmap(clone, model)['net'] is a new {type(net2).__name__}: {net2 is not net}",
        f"the tie survives (net[3].weight is net[5].weight): {net2[3].weight is net2[5].weight}",
        f"same outputs in eval mode: {same_output}",
        f"tensors shared with the original: {len(shared)}",
        f"the config comes back as a {type(copy['config']).__name__} with name={copy['config'].name!r}",
    ]
    return "\n".join(lines)


def main() -> None:
    model = build_model()
    print("functorkit tour: a dict of {Sequential MLP (tied, one frozen bias), dataclass config, extras}\n")
    print("== fk.summary(model): every distinct leaf once, in walk order, with its ties and the totals")
    print(fk.summary(model))
    print("\n== The same leaves through the walking API, with why each is or is not a parameter")
    print("   (fk.leaves_with_path; trainable from fk.fmap_with_path(..., trainable_only=True))")
    print(leaf_report(model))
    print("\n== fk.fmapstructure: the shapes as plain dicts (modules become dicts keyed by child name)")
    shapes = fk.fmapstructure(lambda x: tuple(x.shape) if _is_array(x) else x, model)
    print(shapes["net"])
    print(shapes["config"], shapes["extras"])
    path = fk.KeyPath(("net", 5, "weight"))
    print(f"\n== fk.KeyPath: str(path) = {str(path)!r}; path.get(model) is net[3].weight: "
          f"{path.get(model) is model['net'][3].weight}")
    print("\n== fk.fmap: rebuild the model with every tensor cloned")
    print(clone_report(model))


if __name__ == "__main__":
    main()
