"""Merge methods out of core: fk.open x 3 -> linear / task arithmetic / slerp / TIES / DARE /
model stock -> fk.save, against the read+write floor, float32 and bfloat16.

Workload: three Llama-shaped checkpoints (hidden 1024, intermediate 2816, vocabulary 8000, ``n``
layers: about ``--mb`` megabytes of float32 each; the full run: 200 MB, quick: 30 MB), written
by the benchmark as sharded safetensors (a quarter of a checkpoint per shard), and their bfloat16
versions. Each merge runs in a fresh process (``fk.save(out, merge(fk.open(a), [fk.open(b),
fk.open(c)]))``, sharded like the inputs): wall time, and peak RSS (``VmHWM``) against one
checkpoint's size. The floor is reading the three checkpoints' files once plus writing one
checkpoint's bytes, in the same run (files in the page cache: memory-speed I/O).

    python benchmarks/bench_merge.py --mb 200
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

import functorkit as fk

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_checkpoint

MIB = 2**20
HIDDEN, INTER, VOCAB = 1024, 2816, 8000
HEADER = (
    "| merge | wall time | vs floor | peak RSS | vs one checkpoint | above the imports | vs one checkpoint "
    "| above a tiny merge's | vs one checkpoint |\n|---|---|---|---|---|---|---|---|---|"
)
#: the tiny checkpoints whose merges measure each method's fixed memory (one layer, about 0.4 MB
#: of float32 each): what a merge costs whatever the size of its checkpoints
TINY = (64, 176, 500)

#: the methods whose tensors share reductions: also measured with the one-pass save (`TWO_PASS` off)
REDUCING = ("slerp", "TIES (density 0.5)", "DARE (density 0.5, L1 rescale)", "model stock")
#: the methods whose NumPy fast paths (`_pertensor.BIT_SELECT`, `UINT32_HASH`) are also measured off
SELECTING = ("TIES (density 0.5)", "DARE (density 0.5, L1 rescale)", "DARE-TIES")
#: the methods also measured with fk.save's read pool off (`_safetensors_io.READ_POOL`)
POOLED = ("linear (`fk.mean`)", "TIES (density 0.5)")

METHODS = {
    "linear (`fk.mean`)": "fk.mean([b, *ms])",
    "task arithmetic": "fk.task_arithmetic(b, ms, [0.5, 0.5])",
    "slerp": "fk.slerp(b, ms[0], 0.5)",
    "TIES (density 0.5)": "fk.ties(b, ms, [0.5, 0.5], density=0.5)",
    "DARE (density 0.5, L1 rescale)": "fk.dare(b, ms, [0.5, 0.5], density=0.5, seed=0)",
    "DARE-TIES": "fk.dare(b, ms, [0.5, 0.5], density=0.5, seed=0, sign_consensus=True)",
    "model stock": "fk.model_stock(b, ms)",
}

_CHILD = """
import json, resource, sys, time
import dask.array, functorkit as fk
t_imp = time.perf_counter()
import ml_dtypes  # bfloat16 in NumPy: imported before the timed merge (0.7.0 takes over 1 s here)
ml_s = time.perf_counter() - t_imp

def peak_kb():
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

base_kb = peak_kb()
paths, out, shard, expr, passes = sys.argv[1:4], sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
if passes == "one":
    import functorkit._ckpt_write as ck
    ck.TWO_PASS = False  # the one-pass save, for the comparison row
if passes == "nopool":
    import functorkit._safetensors_io as sio
    sio.READ_POOL = False  # every block read into new memory: the comparison row
if passes == "slow":
    import functorkit._pertensor as pt
    pt.BIT_SELECT = pt.UINT32_HASH = False  # np.where selects, int32 hashing: the comparison row
t0 = time.perf_counter()
b, *ms = [fk.open(p) for p in paths]
fk.save(out, eval(expr), shard_size=shard)
print(json.dumps({"wall": time.perf_counter() - t0, "base_kb": base_kb, "peak_kb": peak_kb(), "ml_dtypes_s": ml_s,
                  "ml_dtypes": ml_dtypes.__version__}))
"""


def _model(
    mb: int, seed: int, bf16: bool, dims: tuple[int, int, int] = (HIDDEN, INTER, VOCAB)
) -> dict[str, np.ndarray]:
    """A Llama-shaped state dict of about `mb` megabytes of float32 (at least one layer)."""
    import ml_dtypes

    hidden, inter, vocab = dims
    rng = np.random.default_rng(seed)
    layer_mb = (4 * hidden * hidden + 3 * hidden * inter) * 4 / 1e6
    n = max(1, round((mb - 2 * vocab * hidden * 4 / 1e6) / layer_mb))
    dt = ml_dtypes.bfloat16 if bf16 else np.float32

    def normal(*shape: int) -> np.ndarray:
        return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(dt)

    sd = {"model.embed_tokens.weight": normal(vocab, hidden)}
    for i in range(n):
        p = f"model.layers.{i}."
        for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
            sd[p + f"self_attn.{k}.weight"] = normal(hidden, hidden)
        sd[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        sd[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        sd[p + "input_layernorm.weight"] = np.ones(hidden, dt)
    sd["model.norm.weight"] = np.ones(hidden, dt)
    sd["lm_head.weight"] = normal(vocab, hidden)
    return sd


def _tiny_shapes() -> list[tuple[int, ...]]:
    return [v.shape for v in _model(0, 0, False, TINY).values()]


def _child(*args: str) -> dict[str, float]:
    return bench_checkpoint._child(_CHILD, *args)


def measure(mb: int) -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for bf16 in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            folders = []
            tiny = []
            for k in range(3):
                m = _model(mb, k, bf16)
                size = sum(v.nbytes for v in m.values())
                folders.append(t / f"ckpt{k}")
                fk.save(folders[-1], m, shard_size=size // 4)
                del m
                small = _model(0, k, bf16, TINY)
                tiny_size = sum(v.nbytes for v in small.values())
                tiny.append(t / f"tiny{k}")
                fk.save(tiny[-1], small, shard_size=tiny_size // 4)
            floors = [bench_checkpoint._floor(folders, t / "floor.bin", size)]
            rows: dict[str, dict[str, float]] = {}
            runs = [(name, expr, "two") for name, expr in METHODS.items()]
            runs += [(name, METHODS[name], "one") for name in REDUCING]
            runs += [(name, METHODS[name], "slow") for name in SELECTING]
            runs += [(name, METHODS[name], "nopool") for name in POOLED]
            for i, (name, expr, passes) in enumerate(runs):
                target = t / f"merged{i}"  # a new directory each time, as a user's merge writes
                label = {
                    "two": name,
                    "one": f"{name}, one pass",
                    "slow": f"{name}, NumPy fast paths off",
                    "nopool": f"{name}, read pool off",
                }[passes]
                rows[label] = _child(*map(str, folders), str(target), str(size // 4), expr, passes)
                shutil.rmtree(target)
                floors.append(bench_checkpoint._floor(folders, t / "floor.bin", size))  # between the merges
            fixed: dict[str, float] = {}  # each method's peak above the imports on the tiny checkpoints
            for name, expr in METHODS.items():
                got = _child(*map(str, tiny), str(t / "tiny_merged"), str(tiny_size // 4), expr, "two")
                shutil.rmtree(t / "tiny_merged")
                fixed[name] = (got["peak_kb"] - got["base_kb"]) * 1024
            floor = statistics.median(floors)
            out["bfloat16" if bf16 else "float32"] = {"size": size, "floor": floor, "rows": rows, "fixed": fixed}
    return out


def section(r: dict[str, dict[str, object]], quick: bool) -> str:
    lines = []
    sizes = []
    for dtype, res in r.items():
        size, floor, rows = res["size"], res["floor"], res["rows"]
        assert isinstance(size, int)
        assert isinstance(floor, float)
        assert isinstance(rows, dict)
        sizes.append(f"{size / 1e6:.0f} MB in {dtype}")
        base = min(row["base_kb"] for row in rows.values()) * 1024
        lines.append(f"| {dtype}: floor (read 3 + write 1) | {floor:.2f} s | 1.0x | | | | | | |")
        lines.append(
            f"| {dtype}: the process after its imports (numpy, dask, functorkit, ml_dtypes) | | | {base / 1e6:.0f} MB "
            f"| {base / size:.0%} | | | | |"
        )
        imp = statistics.median(float(row["ml_dtypes_s"]) for row in rows.values())
        version = next(iter(rows.values()))["ml_dtypes"]
        lines.append(
            f"| {dtype}: `import ml_dtypes` ({version}), once per process, in no row's wall time (median) "
            f"| {imp:.2f} s | {imp / floor:.1f}x | | | | | | |"
        )
        fixed = res["fixed"]
        assert isinstance(fixed, dict)
        for name, row in rows.items():
            peak = row["peak_kb"] * 1024
            above = peak - row["base_kb"] * 1024
            method = next(m for m in METHODS if name == m or name.startswith(m + ","))
            grown = above - fixed[method]
            lines.append(
                f"| {dtype}: {name} | {row['wall']:.2f} s | {row['wall'] / floor:.1f}x | {peak / 1e6:.0f} MB "
                f"| {peak / size:.0%} | {above / 1e6:.0f} MB | {above / size:.0%} "
                f"| {grown / 1e6:.0f} MB | {grown / size:.0%} |"
            )
    body = "\n".join(lines)
    fixed_list = "; ".join(
        f"{dtype}: " + ", ".join(f"{name.split(' (')[0]} {v / 1e6:.1f} MB" for name, v in res["fixed"].items())  # type: ignore[union-attr]
        for dtype, res in r.items()
    )
    tiny_kb = round(sum(math.prod(s) for s in _tiny_shapes()) * 4 / 1e3)
    return f"""## Merge methods out of core (fk.open, fk.ties/dare/slerp/..., fk.save)

Three Llama-shaped checkpoints of {", ".join(sizes)} (sharded safetensors, written by the
benchmark{"; quick run" if quick else ""}); each merge in a fresh process, `fk.save` of the lazy
merge of `fk.open`ed models into a new directory (the default two-pass save; "one pass": the
reductions computed inside the single pass, for comparison; "NumPy fast paths off": `np.where` for
the selections and the int32 hash for DARE's masks, for comparison; "read pool off": every block read
into new memory, for comparison). Floor: reading the three checkpoints
once plus writing one (page cache), measured before and after every merge of the run (the
median). Each process imports numpy, Dask, functorkit and ml_dtypes (NumPy's bfloat16) before the
timed merge; the import of ml_dtypes is shown on its own row. RSS: peak (`VmHWM`), in total and
above the process's peak after its imports (what the merge itself costs a user who has imported
them), each against one checkpoint; and above the same method's peak (above the imports) in a
merge of three tiny checkpoints of the same layout (hidden {TINY[0]}, one layer, {tiny_kb} KB
each, in a fresh process: {fixed_list}): what grows with the checkpoints. That fixed part is
code and threads, not data: functorkit's Dask adapter and array-api-compat's Dask namespace are
imported at the first `fk.open`, Dask starts its thread pool, `fk.save` its read threads.

{HEADER}
{body}
"""


def run(quick: bool) -> str:
    return section(measure(30 if quick else 200), quick)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="size of each float32 checkpoint in MB (default 200)")
    print(section(measure(ap.parse_args().mb), False))
