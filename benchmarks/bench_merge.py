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
from typing import Any

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
if passes == "noclasses":
    import functorkit._safetensors_io as sio
    sio.ReadPool.CLASSES = False  # each buffer its block's size, a misfit put back: the comparison row
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
            runs += [(name, METHODS[name], "noclasses") for name in POOLED]
            for i, (name, expr, passes) in enumerate(runs):
                target = t / f"merged{i}"  # a new directory each time, as a user's merge writes
                label = {
                    "two": name,
                    "one": f"{name}, one pass",
                    "slow": f"{name}, NumPy fast paths off",
                    "nopool": f"{name}, read pool off",
                    "noclasses": f"{name}, read pool without size classes",
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
into new memory, for comparison; "read pool without size classes": each recycled buffer of its
block's exact size and a buffer that does not fit put back, for comparison). Floor: reading the three checkpoints
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


#: elements per block of the hand-written NumPy TIES (`_hand_ties`): fk's histogram piece
WORK_BLOCK = 1 << 16


def _select(m: Any, v: Any) -> Any:
    """``np.where(m, v, +0.0)`` for float32 `v`, bit for bit, in three branch-free passes (the bits
    ANDed with ``-uint32(m)``; ``np.where`` with a scalar branches per element, about 10x slower)."""
    bits = m.astype(np.uint32)
    np.negative(bits, out=bits)
    np.bitwise_and(bits, v.view(np.uint32), out=bits)
    return bits.view(np.float32)


def _magnitudes(b: Any, others: list[Any]) -> Any:
    """Per block of `WORK_BLOCK` elements: the base's block in float32 and each model's ``|m_i - base|``."""
    for s in range(0, b.shape[0], WORK_BLOCK):
        xb = b[s : s + WORK_BLOCK].astype(np.float32)
        yield xb, [np.abs(o[s : s + WORK_BLOCK].astype(np.float32) - xb) for o in others]


def _hand_ties(
    base: dict[str, Any], ms: list[dict[str, Any]], density: float, w: float, timings: dict[str, float]
) -> dict[str, Any]:
    """TIES (equal weights `w`, normalized) written by hand in NumPy over whole in-memory tensors in
    blocks of `WORK_BLOCK` elements, as fk's out-of-core merge computes it (each model's threshold
    by two 16-bit histogram levels of ``|m_i - base|``, then one merge pass; bfloat16 blocks cast to
    float32 and the result rounded once): no Dask, no files, no checks. Adds each pass's time to
    `timings`; the caller checks its bits equal ``fk.ties``'s."""
    import time

    out = {}
    for key, x in base.items():
        n, b = x.size, x.reshape(-1)
        others = [m[key].reshape(-1) for m in ms]
        k = max(1, math.floor(density * n))
        t0 = time.perf_counter()
        levels: list[list[Any]] = [[np.zeros(65536, np.int64) for _ in ms] for _ in range(2)]
        for _, mags in _magnitudes(b, others):  # level 0: the top 16 bits
            for h, a in zip(levels[0], mags, strict=True):
                got = np.bincount(a.view(np.uint16)[1::2])
                h[: got.shape[0]] += got
        t1 = time.perf_counter()
        tops, aboves = [], []
        for h in levels[0]:
            c = np.cumsum(h[::-1])
            i = int(np.searchsorted(c, k))  # the first bin from the top whose count reaches k
            tops.append(65535 - i)
            aboves.append(int(c[i - 1]) if i else 0)
        for _, mags in _magnitudes(b, others):  # level 1: the low 16 bits where the top bits are the k-th's
            for h, a, top in zip(levels[1], mags, tops, strict=True):
                u = a.view(np.uint16)
                got = np.bincount(u[0::2][u[1::2] == top])
                h[: got.shape[0]] += got
        t2 = time.perf_counter()
        thr = []
        for h, top, above in zip(levels[1], tops, aboves, strict=True):
            j = int(np.searchsorted(np.cumsum(h[::-1]), k - above))
            thr.append(np.uint32((top << 16) | (65535 - j)).view(np.float32))
        res = np.empty(n, x.dtype)
        half = np.float32(w)
        for s in range(0, n, WORK_BLOCK):
            xb = b[s : s + WORK_BLOCK].astype(np.float32)
            ds = []
            for o, t in zip(others, thr, strict=True):
                d = o[s : s + WORK_BLOCK].astype(np.float32) - xb
                ds.append(_select(np.abs(d) >= t, d) * half)
            total = ds[0]
            for d in ds[1:]:
                total = total + d
            plus = total >= 0
            minus = ~plus
            mixed = div = None
            for d in ds:
                agree = (plus & (d > 0)) | (minus & (d < 0))
                kept = _select(agree, d)
                wm = agree * half  # the weight or +0.0
                mixed = kept if mixed is None else mixed + kept
                div = wm if div is None else div + wm
            assert mixed is not None
            assert div is not None
            res[s : s + WORK_BLOCK] = xb + mixed / (div + (div == 0))  # a zero divisor made 1
        t3 = time.perf_counter()
        for name, dt in (("level 0", t1 - t0), ("level 1", t2 - t1), ("merge", t3 - t2)):
            timings[name] = timings.get(name, 0.0) + dt
        out[key] = res.reshape(x.shape)
    return out


def work_alone(mb: int, rounds: int = 3) -> str:
    """TIES's element-wise work alone, in memory, against the read+write floor and the out-of-core
    merge of the same checkpoints: what NumPy's kernels cost before any file or Dask task."""
    import time

    lines = []
    for bf16 in (False, True):
        dtype = "bfloat16" if bf16 else "float32"
        models = [_model(mb, k, bf16) for k in range(3)]
        size = sum(v.nbytes for v in models[0].values())
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            folders = []
            for k, m in enumerate(models):
                folders.append(t / f"ckpt{k}")
                fk.save(folders[-1], m, shard_size=size // 4)
            expr = METHODS["TIES (density 0.5)"]
            want = fk.ties(models[0], models[1:], [0.5, 0.5], density=0.5)
            best: dict[str, float] = {}
            for _ in range(rounds):  # interleaved
                timings: dict[str, float] = {}
                t0 = time.perf_counter()
                got = _hand_ties(models[0], models[1:], 0.5, 0.5, timings)
                timings["hand-written NumPy TIES, in memory (the three passes)"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                fk.ties(models[0], models[1:], [0.5, 0.5], density=0.5)
                timings["fk.ties on the models in memory (NumPy, eager)"] = time.perf_counter() - t0
                timings["fk.open x 3, fk.ties, fk.save (a fresh process)"] = _child(
                    *map(str, folders), str(t / "merged"), str(size // 4), expr, "two"
                )["wall"]
                shutil.rmtree(t / "merged")
                timings["floor (read 3 + write 1)"] = bench_checkpoint._floor(folders, t / "floor.bin", size)
                for name, v in timings.items():
                    best[name] = min(best.get(name, math.inf), v)
            for key in want:  # the same work: the same bits as fk's merge
                a, b = np.asarray(want[key]), np.asarray(got[key])
                assert a.dtype == b.dtype, key
                assert a.tobytes() == b.tobytes(), key
        floor = best.pop("floor (read 3 + write 1)")
        lines.append(f"| {dtype}: floor (read 3 + write 1) | {floor:.2f} s | 1.00x |")
        order = ["level 0", "level 1", "merge"]
        names = {
            "level 0": "hand-written: the first histogram pass (top 16 bits of each model's abs(m_i - base))",
            "level 1": "hand-written: the second histogram pass (the low 16 bits under the k-th's top bits)",
            "merge": "hand-written: the merge pass (trim, sign election, weighted mean, one rounding)",
        }
        for name in order:
            lines.append(f"| {dtype}: {names[name]} | {best[name]:.2f} s | {best[name] / floor:.2f}x |")
        for name, v in best.items():
            if name not in order:
                lines.append(f"| {dtype}: {name} | {v:.2f} s | {v / floor:.2f}x |")
        del models, want, got
    return f"""### TIES's element-wise work alone

What NumPy's kernels cost before any file is read or any Dask task runs: TIES written by hand over
the three models held in memory (`_hand_ties`: blocks of {WORK_BLOCK:,} elements, each model's
threshold by the same two 16-bit histogram levels of `|m_i - base|` as fk's out-of-core selection,
then one merge pass; bit-selects instead of `np.where`; bfloat16 blocks cast to float32 and the
result rounded once; one thread; no checks), whose result is checked to have the bits of
`fk.ties`, against the floor of the same checkpoints on disk, `fk.ties` on the in-memory models
and the out-of-core merge. Best of {rounds} interleaved rounds, {mb} MB float32 checkpoints and their
bfloat16 versions:

| TIES (density 0.5, two models and a base) | time | / floor |
|---|---:|---:|
{chr(10).join(lines)}
"""


def run(quick: bool) -> str:
    mb = 30 if quick else 200
    return section(measure(mb), quick) + "\n" + work_alone(mb)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=200, help="size of each float32 checkpoint in MB (default 200)")
    ap.add_argument(
        "--work-alone",
        action="store_true",
        help="TIES's element-wise work alone (hand-written NumPy, in memory) against the floor and fk's merge",
    )
    args = ap.parse_args()
    print(work_alone(args.mb) if args.work_alone else section(measure(args.mb), False))
