"""The functorkit demo (``python3 -m nox -s demo``).

Part 1, the tour: what functorkit sees in a small torch model (leaves, paths,
shapes, dtypes, devices, trainable parameters, ties), and ``fmap`` rebuilding
it. Further parts plug in below ``tour.main()`` in :func:`main`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling example modules

import tour


def main() -> None:
    start = time.perf_counter()
    tour.main()
    # ---- later parts of the demo go here, each a module of examples/ with a main():
    #      e.g. the loss landscape along a line between two models (destructure / re / lerp).
    print(f"\ndemo finished in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
