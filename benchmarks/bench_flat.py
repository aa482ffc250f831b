"""Flatten and rebuild: fk.destructure, re(p) and re.flatten against the peers and the physical limits.

Workloads (float32, as plain dict/list pytrees so that every library sees the same tree):

- ``mlp``: a 2->16->16->1 MLP, 6 arrays (337 floats);
- ``resnet50``: the 161 parameter arrays of torchvision's ResNet-50 (25.6M floats), shapes generated here;
- ``gpt2``: the 148 parameter arrays of GPT-2 small (124M floats, 498 MB).

Contenders (each skipped if its library is missing): ``optree.integrations.{numpy,torch}.tree_ravel``,
``jax.flatten_util.ravel_pytree``, ``torch.nn.utils.parameters_to_vector`` / ``vector_to_parameters``,
``np.concatenate`` / ``torch.cat`` of the leaves, and the physical limits: one ``memcpy`` of the same
number of bytes into a preallocated buffer (for flattening) and plain views built from a precomputed
offset table (for rebuilding). Peak memory is measured in a subprocess (RSS high-water mark, and
tracemalloc for NumPy).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _timing import best_of, switched_off

import functorkit as fk
from functorkit import _flat, _plans

ROOT = Path(__file__).resolve().parent.parent

# --------------------------------------------------------------------------- workloads


def mlp_shapes() -> dict[str, Any]:
    return {f"l{i}": {"w": (n, m), "b": (m,)} for i, (n, m) in enumerate([(2, 16), (16, 16), (16, 1)], 1)}


def resnet50_shapes() -> dict[str, Any]:
    tree: dict[str, Any] = {"conv1": {"weight": (64, 3, 7, 7)}, "bn1": {"weight": (64,), "bias": (64,)}}
    inp = 64
    for li, (width, blocks) in enumerate([(64, 3), (128, 4), (256, 6), (512, 3)], 1):
        layer = []
        for b in range(blocks):
            out = 4 * width
            block: dict[str, Any] = {
                "conv1": {"weight": (width, inp, 1, 1)},
                "bn1": {"weight": (width,), "bias": (width,)},
                "conv2": {"weight": (width, width, 3, 3)},
                "bn2": {"weight": (width,), "bias": (width,)},
                "conv3": {"weight": (out, width, 1, 1)},
                "bn3": {"weight": (out,), "bias": (out,)},
            }
            if b == 0:
                block["downsample"] = [{"weight": (out, inp, 1, 1)}, {"weight": (out,), "bias": (out,)}]
            layer.append(block)
            inp = out
        tree[f"layer{li}"] = layer
    tree["fc"] = {"weight": (1000, 2048), "bias": (1000,)}
    return tree


def gpt2_shapes() -> dict[str, Any]:
    v, p, d = 50257, 1024, 768

    def ln() -> dict[str, Any]:
        return {"weight": (d,), "bias": (d,)}

    def lin(n: int, m: int) -> dict[str, Any]:
        return {"weight": (n, m), "bias": (m,)}

    blocks = [
        {
            "ln_1": ln(),
            "attn": {"c_attn": lin(d, 3 * d), "c_proj": lin(d, d)},
            "ln_2": ln(),
            "mlp": {"c_fc": lin(d, 4 * d), "c_proj": lin(4 * d, d)},
        }
        for _ in range(12)
    ]
    return {"wte": (v, d), "wpe": (p, d), "h": blocks, "ln_f": ln()}


WORKLOADS: dict[str, Callable[[], dict[str, Any]]] = {
    "mlp": mlp_shapes,
    "resnet50": resnet50_shapes,
    "gpt2": gpt2_shapes,
}


def _is_shape(x: Any) -> bool:
    return type(x) is tuple


def build(shapes: dict[str, Any], backend: str) -> Any:
    """The model: every shape replaced by a float32 array of `backend` (filled in place, no temporaries)."""
    rng = np.random.default_rng(0)

    def make(s: tuple[int, ...]) -> Any:
        value = float(rng.random())
        if backend == "torch":
            import torch

            return torch.full(s, value)
        x = np.full(s, value, dtype=np.float32)
        if backend == "jax":
            import jax.numpy as jnp

            return jnp.asarray(x)
        return x

    return fk.fmap(make, shapes, is_leaf=_is_shape)


# --------------------------------------------------------------------------- timing


def _fmt(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:,.2f} ms"
    return f"{s * 1e6:,.2f} µs"


# --------------------------------------------------------------------------- contenders


def _leaves(model: Any) -> list[Any]:
    return fk.leaves(model)


def restructure_calls(model: Any, backend: str) -> dict[str, Callable[[], Any]]:
    leaves = _leaves(model)
    flat, re = fk.destructure(model)
    shapes = [tuple(x.shape) for x in leaves]
    sizes = [int(np.prod(s)) for s in shapes]
    offs = np.cumsum([0, *sizes]).tolist()
    table = [(offs[i], offs[i + 1], s) for i, s in enumerate(shapes)]
    calls: dict[str, Callable[[], Any]] = {"fk: re(p)": functools.partial(re, flat)}
    # the generated code's on/off rows (functorkit._flat.GENERATED): the same rebuild with the
    # adapter's views() in place of the fused view lines, and with the interpreter in place of both
    switches = (
        ("fk: re(p), generated view lines off", [True, False]),
        ("fk: re(p), generated code off", [False, True]),
    )
    for name, switch in switches:
        saved = list(_flat.GENERATED)
        _flat.GENERATED[:] = switch
        try:
            saved_plans = list(_plans.PLANS)
            _plans.PLANS[:] = [False]  # a new rebuilder (a kept plan may hand back one with its code made)
            try:
                _, re_off = fk.destructure(model)
            finally:
                _plans.PLANS[:] = saved_plans
            re_off(flat)  # the code is made at the first call, under the switch
        finally:
            _flat.GENERATED[:] = saved
        calls[name] = functools.partial(re_off, flat)
    calls["limit: [p[o:e].reshape(s) for o, e, s in table]"] = lambda: [flat[o:e].reshape(s) for o, e, s in table]
    if backend == "torch":
        strided = [(s, _contiguous(s), o) for o, _, s in table]
        calls["limit: [p.as_strided(s, st, o) for ... in table]"] = lambda: [
            flat.as_strided(s, st, o) for s, st, o in strided
        ]
        import torch

        targets = [x.clone() for x in leaves]
        calls["torch.nn.utils.vector_to_parameters (in place)"] = functools.partial(
            torch.nn.utils.vector_to_parameters, flat, targets
        )
    try:
        if backend == "numpy":
            from optree.integrations.numpy import tree_ravel
        elif backend == "torch":
            from optree.integrations.torch import tree_ravel
        else:
            raise ImportError
        oflat, unravel = tree_ravel(model)
        calls["optree tree_ravel: unravel(p)"] = functools.partial(unravel, oflat)
    except ImportError:
        pass
    if backend == "jax":
        import jax
        from jax.flatten_util import ravel_pytree

        jflat, junravel = ravel_pytree(model)
        for k in list(calls):
            calls[k] = _blocking(calls[k], jax)
        calls["jax ravel_pytree: unravel(p)"] = _blocking(functools.partial(junravel, jflat), jax)
    return calls


def _blocking(fn: Callable[[], Any], jax: Any) -> Callable[[], Any]:
    return lambda: jax.block_until_ready(fn())


def _contiguous(s: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(s):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def switch_calls(model: Any, backend: str) -> dict[str, Callable[[], Any]]:
    """The on/off rows of `destructure`'s fast paths on the MLP, each on and off in the same rounds:
    the plan (``functorkit._plans.PLANS``), and on torch: the plan's one pass
    (``functorkit._destructure.ONE_PASS``), the one concatenation for small vectors
    (``functorkit.adapters._torch_flat.CAT_MAX_BYTES``) and ``re.flatten(out=)``'s one
    ``torch.cat(..., out=)`` (``CAT_OUT_MAX_BYTES``)."""
    from functorkit import _destructure

    calls: dict[str, Callable[[], Any]] = {
        "fk: destructure(model)": functools.partial(fk.destructure, model),
        "fk: destructure(model), plan off": switched_off(
            _plans, "PLANS", [False], functools.partial(fk.destructure, model)
        ),
    }
    if backend == "torch":
        from functorkit.adapters import _torch_flat as tf

        calls["fk: destructure(model), one pass off"] = switched_off(
            _destructure, "ONE_PASS", [False], functools.partial(fk.destructure, model)
        )
        calls["fk: destructure(model), torch.cat off"] = switched_off(
            tf, "CAT_MAX_BYTES", 0, functools.partial(fk.destructure, model)
        )
        flat, re = fk.destructure(model)
        buf = flat.clone()
        flatten = functools.partial(re.flatten, model, out=buf)
        calls["fk: re.flatten(model, out=buf)"] = flatten
        calls["fk: re.flatten(model, out=buf), torch.cat off"] = switched_off(tf, "CAT_OUT_MAX_BYTES", 0, flatten)
    return calls


def destructure_calls(model: Any, backend: str) -> dict[str, Callable[[], Any]]:
    leaves = _leaves(model)
    n = sum(int(np.prod(x.shape)) for x in leaves)
    _, re = fk.destructure(model)
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros(n, dtype=np.float32)
    calls: dict[str, Callable[[], Any]] = {
        "limit: memcpy of the bytes into a preallocated buffer": functools.partial(np.copyto, dst, src),
        "fk: destructure(model)": functools.partial(fk.destructure, model),
    }
    offs = np.cumsum([0] + [int(np.prod(x.shape)) for x in leaves]).tolist()
    if backend in ("numpy", "torch"):
        sources = [x.numpy() if backend == "torch" else x for x in leaves]
        calls["leaf-wise copy of the same leaves into a preallocated buffer"] = functools.partial(
            _leafwise, np.zeros(n, dtype=np.float32), sources, offs
        )
    if backend == "numpy":
        calls["np.concatenate of the leaves"] = lambda: np.concatenate([x.reshape(-1) for x in leaves])
        buf = np.zeros(n, dtype=np.float32)
        calls["fk: re.flatten(model, out=buf)"] = functools.partial(re.flatten, model, out=buf)
        try:
            from optree.integrations.numpy import tree_ravel

            calls["optree tree_ravel(model)"] = functools.partial(tree_ravel, model)
        except ImportError:
            pass
    elif backend == "torch":
        import torch

        calls["np.concatenate of the same number of NumPy leaves"] = functools.partial(
            np.concatenate, [np.ones(x.shape, dtype=np.float32).reshape(-1) for x in leaves]
        )
        views = [x.numpy() for x in leaves]
        calls["np.concatenate of the same leaves (NumPy views of the tensors)"] = lambda: np.concatenate(
            [x.reshape(-1) for x in views]
        )
        calls["torch.cat of the leaves"] = lambda: torch.cat([x.reshape(-1) for x in leaves])
        calls["torch.nn.utils.parameters_to_vector"] = functools.partial(torch.nn.utils.parameters_to_vector, leaves)
        buf = fk.destructure(model)[0]  # the usual loop: flatten into the vector destructure made
        calls["fk: re.flatten(model, out=buf)"] = functools.partial(re.flatten, model, out=buf)
        try:
            from optree.integrations.torch import tree_ravel

            calls["optree tree_ravel(model)"] = functools.partial(tree_ravel, model)
        except ImportError:
            pass
    elif backend == "jax":
        import jax
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        calls["fk: destructure(model)"] = _blocking(functools.partial(fk.destructure, model), jax)
        calls["jnp.concatenate of the leaves"] = _blocking(
            lambda: jnp.concatenate([jnp.reshape(x, (-1,)) for x in leaves]), jax
        )
        calls["jax ravel_pytree(model)"] = _blocking(functools.partial(ravel_pytree, model), jax)
    return calls


def _leafwise(dst: np.ndarray, sources: list[np.ndarray], offs: list[int]) -> None:
    for x, o in zip(sources, offs[:-1], strict=True):
        np.copyto(dst[o : o + x.size].reshape(x.shape), x)


# --------------------------------------------------------------------------- peak memory (subprocess)

_MEMORY_PROBE = r"""
import json, resource, sys, tracemalloc
import numpy as np
sys.path.insert(0, sys.argv[3])
import bench_flat as B
import functorkit as fk
backend, workload = sys.argv[1], sys.argv[2]
if backend == "torch":
    import torch
fk.destructure({"warm": B.build({"a": (3,)}, backend)})  # imports and caches

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)

base = status("VmRSS")
model = B.build(B.WORKLOADS[workload](), backend)
leaves = fk.leaves(model)
model_bytes = sum(int(np.prod(x.shape)) * 4 for x in leaves)
with open("/proc/self/clear_refs", "w") as f:  # reset VmHWM (the RSS high-water mark) to the RSS now
    f.write("5")
before = status("VmRSS")
tracemalloc.start()
flat, re = fk.destructure(model)
traced_peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
peak_after = status("VmHWM")
flat_bytes = int(flat.shape[0]) * 4
print(json.dumps(dict(base=base, before=before, peak_after=peak_after,
                      model_bytes=model_bytes, flat_bytes=flat_bytes, traced_peak=traced_peak)))
"""


def peak_memory(backend: str, workload: str) -> dict[str, int] | None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-c", _MEMORY_PROBE, backend, workload, str(Path(__file__).resolve().parent)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False, timeout=600)
    if done.returncode != 0:
        return None
    out: dict[str, int] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


# --------------------------------------------------------------------------- report


def _table(title: str, times: dict[str, float], limit: str, refs: list[str]) -> list[str]:
    refs = [r for r in refs if r in times]
    head = f"| {title} | time | vs limit |" + "".join(f" vs {r} |" for r in refs)
    rows = [head, "|---|---:|---:|" + "---:|" * len(refs)]
    for call, t in sorted(times.items(), key=lambda kv: kv[1]):
        name = f"**{call}**" if call.startswith("fk:") else call
        cells = [f"{t / times[limit]:.2f}x"] + [f"{t / times[r]:.2f}x" for r in refs]
        rows.append(f"| {name} | {_fmt(t)} | " + " | ".join(cells) + " |")
    return rows


def run(quick: bool) -> str:
    backends = ["numpy"]
    for mod in ("torch", "jax"):
        try:
            __import__(mod)
            backends.append(mod)
        except ImportError:
            pass
    if "jax" in backends:
        import jax

        jax.config.update("jax_enable_x64", True)
    workloads = ["mlp", "resnet50"] if quick else ["mlp", "resnet50", "gpt2"]
    rounds_small, rounds_big = (5, 2) if quick else (30, 7)
    lines = [
        "## Flatten and rebuild: `fk.destructure`, `re(p)`, `re.flatten`",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
    ]
    summary: list[tuple[str, str, str]] = []  # (target, measured, ok)
    re_times: dict[tuple[str, str], dict[str, float]] = {}
    de_times: dict[tuple[str, str], dict[str, float]] = {}
    sw_times: dict[str, dict[str, float]] = {}
    for workload in workloads:
        shapes = WORKLOADS[workload]()
        for backend in backends:
            model = build(shapes, backend)
            rounds = rounds_small if workload == "mlp" else rounds_big
            settle = 0.3 if (workload != "mlp" and backend != "numpy") else 0.0
            re_times[workload, backend] = best_of(restructure_calls(model, backend), rounds, settle_s=settle)
            if workload != "mlp" or backend != "jax":
                de_times[workload, backend] = best_of(destructure_calls(model, backend), rounds, settle_s=settle)
            if workload == "mlp" and backend in ("numpy", "torch"):
                sw_times[backend] = best_of(switch_calls(model, backend), 3 * rounds, target_s=0.002)
            del model
            gc.collect()
    lines += ["### Rebuild: `re(p)` (views of `p`)", ""]
    for (workload, backend), times in re_times.items():
        limit = "limit: [p[o:e].reshape(s) for o, e, s in table]"
        refs = [k for k in times if not k.startswith(("fk:", "limit"))]
        lines += [f"**{workload}, {backend}**", ""]
        lines += _table("call", times, limit, refs)
        lines.append("")
    lines += ["### Flatten: `fk.destructure(model)` (new vector) and `re.flatten(model, out=buf)`", ""]
    for (workload, backend), times in de_times.items():
        limit = "limit: memcpy of the bytes into a preallocated buffer"
        refs = [k for k in times if k.startswith(("np.concatenate", "optree", "torch.cat", "jax rav"))]
        lines += [f"**{workload}, {backend}**", ""]
        lines += _table("call", times, limit, refs[:2])
        lines.append("")
    lines += [
        "### Fast paths of `destructure` and `re.flatten`, on and off (mlp)",
        "",
        "Each row pair in the same interleaved rounds (best of many short timings): "
        "**the plan** (`functorkit._plans.PLANS = [False]` turns it off: every call then makes the full "
        "analysis of the leaves; tests/test_destructure_plan.py fails when it is not taken); "
        "**one pass** on torch (`functorkit._destructure.ONE_PASS = [False]`: the alias check and the new "
        "vector apart; the one pass proves the parameters apart from their `data_ptr` ranges and makes the "
        "vector at once; tests/test_destructure_plan.py counts the alias checks); "
        "**one concatenation** for a torch vector under 16 MiB (`functorkit.adapters._torch_flat.CAT_MAX_BYTES "
        "= 0` turns it off: `empty` and a copy per leaf; tests/test_adapters.py counts the "
        "`flatten_dense_tensors` calls); **`re.flatten(out=)`'s one `torch.cat(..., out=buf)`** "
        "(`CAT_OUT_MAX_BYTES = 0`: a NumPy copy per leaf; tests/test_adapters.py counts the `torch.cat(out=)` "
        "calls). `re.flatten` also keeps what it decided on the parameters' facts in the plan cache "
        "(`functorkit._reflatten.FLATTEN_PLAN`, tests/test_destructure_plan.py). "
        "Removed by issue #21's rule (under 20% gain on their own workload, measured on and off in one run "
        "before removal): one `torch.cat(..., out=)` into every vector, NumPy memory from 1 MiB (the 12-block "
        "`nn.Module`'s `destructure` 1.12x, resnet50 and gpt2 equal), and the alias check's Python "
        "sweep of clusters of up to 16 spans in place of NumPy's "
        "sort (1.16x on `destructure` of a fused attention block whose q, k, v are column slices of one "
        "(16, 48) array, the only workload here that reaches it since torch tensors and contiguous views "
        "are proven disjoint by their adapter). `torch.cat(..., out=buf)` in `re.flatten(out=)`, removed "
        "twice before at 1.03-1.06x against the NumPy copies, came back with `torch.ravel` views "
        "(cheaper than `reshape`) and the plan's decisions (its row below).",
        "",
        "| backend | fast path | on | off | off / on |",
        "|---|---|---:|---:|---:|",
    ]
    for backend, times in sw_times.items():
        for on in [k for k in times if " off" not in k]:
            for off in [k for k in times if k.startswith(on + ", ")]:
                what = off[len(on) + 2 :].removesuffix(" off")
                lines.append(
                    f"| {backend} | `{on[4:]}`: {what} | {_fmt(times[on])} | {_fmt(times[off])} | "
                    f"{times[off] / times[on]:.2f}x |"
                )
    lines.append("")
    # ---- targets
    big = [w for w in workloads if w != "mlp"]
    for w in big:
        for b in ("numpy", "torch"):
            if (w, b) not in de_times:
                continue
            t = de_times[w, b]
            limit = t["limit: memcpy of the bytes into a preallocated buffer"]
            r = t["fk: re.flatten(model, out=buf)"] / limit
            summary.append((f"{w} {b}: re.flatten(out=buf) <= 1.15x memcpy", f"{r:.2f}x", _ok(r <= 1.15)))
        if (w, "numpy") in de_times:
            tn = de_times[w, "numpy"]
            ref = tn["np.concatenate of the leaves"]
            r = tn["fk: destructure(model)"] / ref
            summary.append((f"{w} numpy: destructure <= 1.1x np.concatenate", f"{r:.2f}x", _ok(r <= 1.1)))
            if (w, "torch") in de_times:
                tt = de_times[w, "torch"]
                # the NumPy figure measured interleaved with the torch contenders (same phase of the run)
                ref_np = tt["np.concatenate of the same number of NumPy leaves"]
                r = tt["fk: destructure(model)"] / ref_np
                target = f"{w} torch: destructure <= 1.2x np.concatenate of NumPy leaves"
                summary.append((target, f"{r:.2f}x", _ok(r <= 1.2)))
                same = tt["np.concatenate of the same leaves (NumPy views of the tensors)"]
                r = tt["fk: destructure(model)"] / same
                summary.append((f"{w} torch: destructure vs np.concatenate of the same torch leaves", f"{r:.2f}x", "-"))
                rc = tt["torch.cat of the leaves"] / ref_np
                summary.append((f"{w} torch: (torch.cat for comparison)", f"{rc:.2f}x", "-"))
        for b in ("numpy", "torch"):
            if (w, b) in re_times:
                t = re_times[w, b]
                lim = min(v for k, v in t.items() if k.startswith("limit"))
                r = t["fk: re(p)"] / lim
                summary.append((f"{w} {b}: re(p) <= 1.5x the views limit", f"{r:.2f}x", _ok(r <= 1.5)))
    for b in ("numpy", "torch"):
        if ("mlp", b) in re_times:
            t = re_times["mlp", b]
            lim = min(v for k, v in t.items() if k.startswith("limit"))
            r = t["fk: re(p)"] / lim
            if b == "numpy":
                summary.append(("mlp numpy: re(p) <= 1.5x the views limit", f"{r:.2f}x", _ok(r <= 1.5)))
            else:
                summary.append(("mlp torch: re(p) vs the fastest views (as_strided)", f"{r:.2f}x", "-"))
            peers = {k: v for k, v in t.items() if not k.startswith(("fk:", "limit"))}
            if peers:
                name, fastest = min(peers.items(), key=lambda kv: kv[1])
                r = t["fk: re(p)"] / fastest
                summary.append((f"mlp {b}: re(p) faster than every peer (best: {name})", f"{r:.2f}x", _ok(r < 1)))
    # ---- memory
    mem_rows = []
    for b in ("numpy", "torch"):
        if b not in backends:
            continue
        w = big[-1]
        m = peak_memory(b, w)
        if m is None:
            mem_rows.append(f"| {w} | {b} | probe failed | | | |")
            continue
        extra = max(m["peak_after"], m["before"]) - m["before"]
        peak = m["before"] - m["base"] + extra
        bound = m["model_bytes"] + m["flat_bytes"]
        r = peak / bound
        traced = f"{m['traced_peak'] / m['flat_bytes']:.3f}x flat" if b == "numpy" else "-"
        mem_rows.append(
            f"| {w} | {b} | {m['model_bytes'] / 2**20:,.0f} MiB | {m['flat_bytes'] / 2**20:,.0f} MiB | "
            f"{extra / 2**20:,.0f} MiB | {r:.3f}x | {traced} |"
        )
        summary.append((f"{w} {b}: peak memory <= (model + flat) x 1.05", f"{r:.3f}x", _ok(r <= 1.05)))
    lines += [
        "### Peak memory of `fk.destructure` (subprocess)",
        "",
        "RSS high-water mark (`VmHWM`, reset just before the call) while `destructure` runs, above the "
        "RSS with the model built, and the peak "
        "of the whole process over (model + flat vector); tracemalloc's peak (NumPy allocations) during "
        "the call over the flat vector's size.",
        "",
        "| workload | backend | model | flat | RSS peak above model | peak / (model + flat) | tracemalloc peak |",
        "|---|---|---:|---:|---:|---:|---:|",
        *mem_rows,
        "",
        "### Targets",
        "",
        "| target | measured | met |",
        "|---|---:|:---:|",
        *[f"| {a} | {b} | {c} |" for a, b, c in summary],
        "",
        "The torch models here are built with `torch.full` (torch's allocator, 4 KiB pages), the NumPy "
        "models with NumPy (transparent huge pages for arrays of 4 MiB and more): reading the torch leaves "
        "costs more (compare the leaf-wise copy rows), which no flattener can avoid; the like-for-like "
        "reference for torch is `np.concatenate` of the same tensors' memory.",
        "",
        "Why torch's own flatteners are slower here: `torch.empty` memory comes from torch's CPU allocator, "
        "which (unlike NumPy's) does not `madvise` transparent huge pages, so the first write into a "
        "fresh vector takes a page fault every 4 KiB; `torch.cat`, `parameters_to_vector` and optree "
        "pay that for vectors above glibc's largest `mmap` threshold (32 MiB; below it a freed vector's "
        "memory is reused from the heap, as in a loop). `fk.destructure` allocates CPU vectors of 16 MiB or "
        "more with NumPy, wraps them with `torch.from_numpy`, and copies each leaf into its slice through "
        "NumPy views of the tensors (single-threaded memcpy; torch's multi-threaded copy was slower on this "
        "shared 2-core machine); smaller ones are one `flatten_dense_tensors` (one C++ concatenation, "
        "`functorkit/adapters/_torch_flat.py`).",
        "",
    ]
    return "\n".join(lines)


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"


if __name__ == "__main__":
    print(run("--quick" in sys.argv))
