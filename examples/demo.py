"""The functorkit demo (``python3 -m nox -s demo``).

Part 1, the tour: what functorkit sees in a small torch model (leaves, paths,
shapes, dtypes, devices, trainable parameters, ties), and ``fmap`` rebuilding
it. Part 2, the main job: train a small MLP on scikit-learn's digits and draw
its loss landscape on a plane of filter-normalised random directions, writing
``loss_landscape.png`` and ``loss_landscape.md`` (into ``--out``, default the
current directory).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling example modules

import loss_landscape
import tour


def main(argv: list[str] | None = None) -> None:
    start = time.perf_counter()
    tour.main()
    print("\n== Part 2: the loss landscape of a small MLP trained on digits\n")
    loss_landscape.main(sys.argv[1:] if argv is None else argv)
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
