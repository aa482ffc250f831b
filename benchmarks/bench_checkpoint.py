"""Lazy checkpoints: merging three safetensors checkpoints with fk.open + fk.mean + fk.save.

Workload: checkpoints of ``--mb`` megabytes each (the full run: 1000, the issue's size;
``--quick`` 24; run directly, default 150), written by the benchmark: float32 matrices of
4096 x 1024 (16 MiB) plus one bias per matrix, saved sharded (``shard_size``
a quarter of a checkpoint).

Rows:

- ``merge``: in a fresh process, ``fk.save(out, fk.mean([fk.open(a),
  fk.open(b), fk.open(c)]), shard_size=...)``: wall time, and peak RSS
  (``VmHWM``) against one checkpoint's size; the RSS of a process that
  only imports functorkit and Dask is shown as the baseline.
- ``floor``: in the same run, reading the three checkpoints' files once
  (``readinto`` a reused 64 MiB buffer) plus writing one checkpoint's bytes:
  the I/O any merge must do. (Files are in the page cache after writing, so
  both rows measure memory-speed I/O, not the disk.)
- ``distance matrix``: four lazy checkpoints, the six ``fk.norm(fk.sub(a,
  b))`` in one ``dask.compute``: wall time and the bytes read from each file
  during the pass divided by its tensor bytes (1.0 = each checkpoint read
  once per pass).

- ``load``: ``fk.load`` of one checkpoint (arrays that own their memory, the
  default) against ``safetensors.numpy.load_file`` (the package's Rust
  parser, which also copies) and ``fk.load(..., mmap=True)`` with every page
  touched; best of three, page cache warm. ``open``: ``fk.open`` (every header
  checked, the Dask graph built, nothing read) against the package's
  ``safe_open`` + ``keys()`` of every shard.

``mergekit`` is not installed here, so its linear merge is not timed.

    python benchmarks/bench_checkpoint.py --mb 1000     # one run at the issue's size, printed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import functorkit as fk

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20

_CHILD_MERGE = """
import json, resource, sys, time
import dask.array, functorkit as fk

def peak_kb():  # VmHWM: this program's own peak (ru_maxrss on Linux also counts the parent before exec)
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base = peak_kb()
paths, out, shard = sys.argv[1:4], sys.argv[4], int(sys.argv[5])
t0 = time.perf_counter()
lazy = [fk.open(p) for p in paths]
fk.save(out, fk.mean(lazy), shard_size=shard)
wall = time.perf_counter() - t0
print(json.dumps({"wall": wall, "base_kb": base, "peak_kb": peak_kb()}))
"""

_CHILD_DIST = """
import json, sys, time
import dask, functorkit as fk
from functorkit._safetensors_io import LazyTensor
paths = sys.argv[1:]
t0 = time.perf_counter()
ms = [fk.open(p) for p in paths]
pairs = [(i, j) for i in range(len(ms)) for j in range(i + 1, len(ms))]
dask.compute(*[fk.norm(fk.sub(ms[i], ms[j])) for i, j in pairs])
wall = time.perf_counter() - t0
per_dir = {}
for f, n in LazyTensor.reads.items():
    d = str(__import__("pathlib").Path(f).parent)
    per_dir[d] = per_dir.get(d, 0) + n
print(json.dumps({"wall": wall, "reads": per_dir}))
"""


def _model(mb: int, seed: int) -> dict[str, object]:
    rng = np.random.default_rng(seed)
    n = max(1, mb * MIB // (16 * MIB))
    return {
        "layers": [
            {"w": rng.standard_normal((4096, 1024), dtype=np.float32), "b": np.zeros(4096, np.float32)}
            for _ in range(n)
        ]
    }


def _tensor_bytes(folder: Path) -> int:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return int(index["metadata"]["total_size"])


def _child(code: str, *args: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _floor(folders: list[Path], out: Path, nbytes: int) -> float:
    buf = bytearray(64 * MIB)
    view = memoryview(buf)
    t0 = time.perf_counter()
    for folder in folders:
        for f in sorted(folder.iterdir()):
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(buf):
                    pass
    with open(out, "wb", buffering=0) as fh:
        left = nbytes
        while left > 0:
            left -= fh.write(view[: min(left, len(buf))])
    return time.perf_counter() - t0


def _best(f: object, rounds: int = 3) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = f()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
        del out
    return best


def _loads(folder: Path) -> dict[str, float]:
    """fk.load / fk.open against the safetensors package on one sharded checkpoint."""
    shards = sorted(str(f) for f in folder.iterdir() if f.suffix == ".safetensors")

    def touch_mapped() -> object:
        m = fk.load(folder, mmap=True)
        for x in fk.leaves(m):
            np.add.reduce(x.reshape(-1)[::1024])  # one element per 4 KiB page: every page read
        return m

    out = {
        "load_s": _best(lambda: fk.load(folder)),
        "mmap_s": _best(touch_mapped),
        "open_s": _best(lambda: fk.open(folder)),
    }
    try:
        from safetensors import safe_open
        from safetensors.numpy import load_file
    except ImportError:
        return out

    def st_open() -> object:
        keys = []
        for s in shards:
            with safe_open(s, framework="np") as f:
                keys += list(f.keys())
        return keys

    out["st_load_s"] = _best(lambda: [load_file(s) for s in shards])
    out["st_open_s"] = _best(st_open)
    return out


def measure(mb: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        folders = []
        for k in range(4):
            model = _model(mb, k)
            folders.append(t / f"ckpt{k}")
            fk.save(folders[-1], model, shard_size=mb * MIB // 4)
            del model
        size = _tensor_bytes(folders[0])
        merge = _child(_CHILD_MERGE, *map(str, folders[:3]), str(t / "merged"), str(mb * MIB // 4))
        floor = min(_floor(folders[:3], t / "floor.bin", size) for _ in range(2))
        merge2 = _child(_CHILD_MERGE, *map(str, folders[:3]), str(t / "merged"), str(mb * MIB // 4))
        dist = _child(_CHILD_DIST, *map(str, folders))
        loads = _loads(folders[0])
        reads = [dist["reads"].get(str(f), 0) / size for f in folders]  # type: ignore[union-attr]
    best = min(merge, merge2, key=lambda r: r["wall"])
    return {
        "size_mb": size / 1e6,
        "merge_s": best["wall"],
        "peak_mb": max(merge["peak_kb"], merge2["peak_kb"]) * 1024 / 1e6,
        "base_mb": best["base_kb"] * 1024 / 1e6,
        "floor_s": floor,
        "dist_s": dist["wall"],
        "reads_min": min(reads),
        "reads_max": max(reads),
        **loads,
    }


def section(r: dict[str, float], quick: bool) -> str:
    size, peak, base = r["size_mb"], r["peak_mb"], r["base_mb"]
    merge = (
        f"| merge: `fk.save(out, fk.mean([fk.open(a), fk.open(b), fk.open(c)]))` | {r['merge_s']:.2f} s "
        f"| {peak:.0f} MB | peak RSS {peak / size:.0%} of one checkpoint ({(peak - base) / size:.0%} above the "
        "baseline) |"
    )
    floor = (
        f"| floor: read the 3 checkpoints once + write 1 | {r['floor_s']:.2f} s | "
        f"| merge = {r['merge_s'] / r['floor_s']:.1f}x floor |"
    )
    dist = (
        f"| distance matrix, 4 lazy checkpoints (6 norms, one `dask.compute`) | {r['dist_s']:.2f} s | "
        f"| each file read {r['reads_min']:.2f}-{r['reads_max']:.2f}x per pass |"
    )
    st_load, st_open = r.get("st_load_s"), r.get("st_open_s")
    load_rows = [
        f"| load: `fk.load(ckpt)` (arrays own their memory) | {r['load_s']:.3f} s | | "
        + (f"{r['load_s'] / st_load:.2f}x `safetensors.numpy.load_file` |" if st_load else "|"),
        f"| load: `safetensors.numpy.load_file` of every shard | {st_load:.3f} s | | |" if st_load else "",
        f"| load: `fk.load(ckpt, mmap=True)`, every page touched | {r['mmap_s']:.3f} s | | |",
        f"| open: `fk.open(ckpt)` (headers checked, graph built, no data) | {r['open_s'] * 1e3:.1f} ms | | "
        + (f"{r['open_s'] / st_open:.1f}x `safe_open` + `keys()` |" if st_open else "|"),
        f"| open: `safe_open(shard).keys()` of every shard | {st_open * 1e3:.1f} ms | | |" if st_open else "",
    ]
    loads = "\n".join(row for row in load_rows if row)
    return f"""## Lazy checkpoints (fk.open, fk.mean, fk.save)

Three checkpoints of {size:.0f} MB each (float32, sharded safetensors, written by the
benchmark{"; quick run" if quick else ""}); the merge runs in a fresh process.

| row | wall time | peak RSS | vs one checkpoint |
|---|---|---|---|
{merge}
| baseline process (imports only) | | {base:.0f} MB | |
{floor}
{dist}
{loads}
"""


def run(quick: bool) -> str:
    return section(measure(24 if quick else 1000), quick)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=150, help="size of each checkpoint in MB (default 150)")
    print(section(measure(ap.parse_args().mb), False))
