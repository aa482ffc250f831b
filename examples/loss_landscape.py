"""The loss landscape of a small network, drawn with functorkit's model arithmetic.

    python examples/loss_landscape.py [--out DIR] [--grid 21] [--span 1.0] [--epochs 12] [--seed 0]

1. Train a small MLP on scikit-learn's digits (bundled with scikit-learn, no
   download) for a few seconds, keeping a copy of the model after every epoch
   (``fk.copy``).
2. Draw two random directions in parameter space and filter-normalise them
   against the trained weights (``fk.filter_normalize``, Li et al. 2018,
   "Visualizing the Loss Landscape of Neural Nets").
3. For every point of a grid, build the model ``origin + a*d1 + b*d2``
   (``fk.lincomb``), load it into one live network (``fk.load_into``) and
   evaluate the training loss.
4. Project the training trajectory onto the plane (``fk.sub``, ``fk.dot``)
   and write ``loss_landscape.png`` (contour plot) and ``loss_landscape.md``
   (summary) into ``--out``.

Needs torch, scikit-learn, matplotlib and tqdm (``pip install functorkit[demo]``).
Takes a few seconds on two CPU cores.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.figure import Figure
from sklearn.datasets import load_digits
from tqdm import tqdm

import functorkit as fk


def load_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Digits (8x8 images, 10 classes): 1,500 training and 297 test examples, pixels scaled to [0, 1]."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order], dtype=torch.int64)
    return x[:1500], y[:1500], x[1500:], y[1500:]


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64),
        torch.nn.ReLU(),
        torch.nn.Linear(64, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 10),
    )


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, seed: int) -> list[Any]:
    """Minibatch SGD with momentum; returns the trajectory: a copy of the model before and after each epoch."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    trajectory = [fk.copy(model)]
    for _ in range(epochs):
        for idx in torch.randperm(len(x), generator=gen).split(50):
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
        trajectory.append(fk.copy(model))
    return trajectory


def random_direction(origin: Any, gen: torch.Generator) -> Any:
    """A Gaussian random model of `origin`'s shapes, filter-normalised against `origin`."""
    noise = fk.fmap(lambda p: torch.randn(p.shape, generator=gen, dtype=p.dtype), origin, trainable_only=True)
    return fk.filter_normalize(noise, origin)


def project(trajectory: list[Any], origin: Any, d1: Any, d2: Any) -> np.ndarray:
    """Least-squares coordinates (a, b) of each ``model - origin`` in the plane spanned by d1, d2."""
    g11, g12, g22 = float(fk.dot(d1, d1)), float(fk.dot(d1, d2)), float(fk.dot(d2, d2))
    gram = np.array([[g11, g12], [g12, g22]])
    coords = []
    for model in trajectory:
        delta = fk.sub(model, origin)
        rhs = np.array([float(fk.dot(d1, delta)), float(fk.dot(d2, delta))])
        coords.append(np.linalg.solve(gram, rhs))
    return np.array(coords)


def landscape(
    net: torch.nn.Module, origin: Any, d1: Any, d2: Any, alphas: np.ndarray, x: torch.Tensor, y: torch.Tensor,
    quiet: bool = False,
) -> np.ndarray:
    """``loss[i, j]`` at ``origin + alphas[j] * d1 + alphas[i] * d2``, evaluated in the live network `net`.

    Call under ``torch.no_grad()``.
    """
    loss_fn = torch.nn.CrossEntropyLoss()
    n = len(alphas)
    losses = np.empty((n, n))
    net.eval()
    with tqdm(total=n * n, desc="loss landscape", unit="pt", disable=quiet) as bar:
        for i, b in enumerate(alphas):
            for j, a in enumerate(alphas):
                fk.load_into(net, fk.lincomb([1.0, a, b], [origin, d1, d2]))
                losses[i, j] = float(loss_fn(net(x), y))
                bar.update()
    return losses


def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


def plot(path: Path, alphas: np.ndarray, losses: np.ndarray, traj: np.ndarray) -> None:
    fig = Figure(figsize=(6.4, 5.2), dpi=100)
    ax = fig.add_subplot()
    grid_a, grid_b = np.meshgrid(alphas, alphas)
    z = np.log10(losses)
    filled = ax.contourf(grid_a, grid_b, z, levels=24, cmap="viridis")
    ax.contour(grid_a, grid_b, z, levels=12, colors="white", linewidths=0.5, alpha=0.5)
    fig.colorbar(filled, ax=ax, label="log10 training loss")
    ax.plot(traj[:, 0], traj[:, 1], "-o", color="tab:orange", ms=3, lw=1.5, label="training trajectory (projected)")
    ax.plot(traj[0, 0], traj[0, 1], "s", color="tab:red", ms=6, label="initialisation")
    ax.plot(0, 0, "*", color="white", mec="black", ms=14, label="trained model (origin)")
    # random directions see little of the trajectory: show it once more, magnified
    inset = ax.inset_axes((0.63, 0.57, 0.33, 0.33))
    inset.plot(traj[:, 0], traj[:, 1], "-o", color="tab:orange", ms=2.5, lw=1.2)
    inset.plot(traj[0, 0], traj[0, 1], "s", color="tab:red", ms=5)
    inset.plot(0, 0, "*", color="white", mec="black", ms=11)
    inset.set_facecolor("#f4f4f4")
    inset.tick_params(labelsize=6)
    inset.set_title("trajectory, magnified", fontsize=7)
    inset.margins(0.25)
    ax.set_xlim(alphas[0], alphas[-1])
    ax.set_ylim(alphas[0], alphas[-1])
    ax.set_xlabel("a  (filter-normalised direction d1)")
    ax.set_ylabel("b  (filter-normalised direction d2)")
    ax.set_title("Loss landscape around a trained MLP (digits)")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.8)
    fig.tight_layout()
    fig.savefig(path)


def summary(info: dict[str, Any], alphas: np.ndarray, losses: np.ndarray, traj: np.ndarray) -> str:
    n = len(alphas)
    c = n // 2
    i, j = np.unravel_index(np.argmin(losses), losses.shape)
    corners = [losses[0, 0], losses[0, -1], losses[-1, 0], losses[-1, -1]]
    picks = sorted({0, n // 4, c, n - 1 - n // 4, n - 1})
    axis_rows = "\n".join(
        f"| {alphas[k]:+.2f} | {losses[c, k]:.4f} | {losses[k, c]:.4f} |" for k in picks
    ) if n % 2 else "| (even grid: the axes are not on it) | | |"
    return f"""# Loss landscape of a small MLP on digits

Made by `examples/loss_landscape.py` with functorkit's model arithmetic: the
models `origin + a*d1 + b*d2` (`fk.lincomb`) were loaded one by one into a
single live network (`fk.load_into`) and evaluated on the training set.

![loss landscape](loss_landscape.png)

| | |
|---|---|
| model | MLP 64-64-32-10, {info["n_params"]:,} parameters |
| training | {info["epochs"]} epochs of SGD (momentum 0.9, batch 50) on 1,500 digits, {info["train_s"]:.1f} s |
| accuracy | train {info["train_acc"]:.1%}, test {info["test_acc"]:.1%} |
| directions | two Gaussian random directions, filter-normalised (`fk.filter_normalize`, biases zeroed) |
| grid | {n} x {n} points, a, b in [{alphas[0]:+.2f}, {alphas[-1]:+.2f}], {info["grid_s"]:.1f} s |
| loss at the origin (trained model) | {info["origin_loss"]:.4f} |
| smallest loss on the grid | {losses[i, j]:.4f} at a = {alphas[j]:+.2f}, b = {alphas[i]:+.2f} |
| largest loss on the grid | {losses.max():.4f} |
| mean loss at the four corners | {float(np.mean(corners)):.4f} |
| trajectory start (projected) | a = {traj[0, 0]:+.3f}, b = {traj[0, 1]:+.3f} |

Loss along the two axes:

| t | loss at (a=t, b=0) | loss at (a=0, b=t) |
|---|---|---|
{axis_rows}

Random directions in a space of {info["n_params"]:,} dimensions are nearly
orthogonal to the path training took, so the projected trajectory is short:
it shows where training came from, not how far it went.
"""


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the example; returns the grid, the losses, the trajectory and the paths written."""
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("."), help="output directory (default: .)")
    parser.add_argument("--grid", type=int, default=21, help="points per axis (odd puts the origin on it)")
    parser.add_argument("--span", type=float, default=1.0, help="a and b range over [-span, span]")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if args.grid < 2:
        parser.error("--grid must be at least 2")
    args.out.mkdir(parents=True, exist_ok=True)

    x, y, x_test, y_test = load_data(args.seed)
    with torch.random.fork_rng():  # leave the caller's global RNG alone
        torch.manual_seed(args.seed)
        model = make_model()
    start = time.perf_counter()
    trajectory = train(model, x, y, args.epochs, args.seed)
    train_s = time.perf_counter() - start

    # Model arithmetic on torch is recorded by autograd like any torch expression;
    # here we want plain values, so everything from now on runs under no_grad.
    with torch.no_grad():
        origin = trajectory[-1]
        gen = torch.Generator().manual_seed(args.seed + 1)
        d1, d2 = random_direction(origin, gen), random_direction(origin, gen)
        alphas = np.linspace(-args.span, args.span, args.grid)
        net = make_model()  # one live network; every grid point is loaded into it
        start = time.perf_counter()
        losses = landscape(net, origin, d1, d2, alphas, x, y, quiet=args.quiet)
        grid_s = time.perf_counter() - start
        origin_loss = float(torch.nn.functional.cross_entropy(model(x), y))
        traj = project(trajectory, origin, d1, d2)

    info = {
        "n_params": sum(p.numel() for p in model.parameters()),
        "epochs": args.epochs,
        "train_s": train_s,
        "grid_s": grid_s,
        "train_acc": accuracy(model, x, y),
        "test_acc": accuracy(model, x_test, y_test),
        "origin_loss": origin_loss,
    }
    png, md = args.out / "loss_landscape.png", args.out / "loss_landscape.md"
    plot(png, alphas, losses, traj)
    md.write_text(summary(info, alphas, losses, traj))
    if not args.quiet:
        print(f"loss at the trained model {origin_loss:.4f}; grid min {losses.min():.4f}, max {losses.max():.4f}")
        print(f"wrote {png} and {md}")
    return {
        "alphas": alphas,
        "losses": losses,
        "origin_loss": origin_loss,
        "trajectory": traj,
        "png": png,
        "md": md,
        "seconds": {"train": train_s, "grid": grid_s},
        "is_finite": bool(np.all(np.isfinite(losses))) and not math.isnan(origin_loss),
    }


if __name__ == "__main__":
    main()
