"""Run the conformance table (conformance/cases.toml) on every installed backend, and the peers.

    python conformance/run.py                 # every case, every backend here; exit 1 on a failure
    python conformance/run.py --backends numpy,torch --no-peers
    python conformance/run.py --write-docs    # ... and regenerate docs/conformance.md, docs/comparison.md
    python conformance/run.py --check         # ... and fail if the checked-in pages are stale

A case fails when its outcome differs from the data's expectation, or when two backends that ran
it disagree (dtypes, devices, namespaces, error class). A case the data marks `deviation` is
reported as a known deviation; if it starts to pass, that is a failure too (remove the mark).
The sharded columns (torch DTensor on 2 gloo ranks, JAX over a Mesh of 4 host devices) run in
processes of their own (conformance/_isolated.py), while the other backends run here.
Backends on a GPU (CuPy, torch CUDA) run only where a GPU exists; elsewhere their columns say
"not run: no GPU on this machine", or show the results recorded on a GPU in
conformance/gpu_results.json (written by `--write-docs` on a GPU machine).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
try:
    import functorkit  # noqa: F401
except ImportError:  # run from a checkout: the package is the parent directory's
    sys.path.insert(1, str(HERE.parent))

from _backends import BACKENDS  # noqa: E402
from _isolated import collect, start  # noqa: E402
from _pages import comparison_page, conformance_page, strip_volatile  # noqa: E402
from _peers import PEERS, missing, run_peer  # noqa: E402
from _table import POLICIES, compare, expected, load, normalised, not_applicable, refusal, run_fk  # noqa: E402

GPU_RESULTS = HERE / "gpu_results.json"
DOCS = HERE.parent / "docs"

Cells = dict[str, dict[str, str]]  # backend -> "case|policy" -> cell text


def run_backend(data: dict[str, Any], name: str, log: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Every case on one backend: cell per "case|policy", and the normalised outcome of each run."""
    be = BACKENDS[name]
    why = be.missing()
    cells: dict[str, str] = {}
    seen: dict[str, str] = {}
    for case in data["case"]:
        for policy in POLICIES:
            key = f"{case['id']}|{policy}"
            if why is not None:
                cells[key] = why
                continue
            na = not_applicable(data, name, case, policy)
            if na is not None:
                cells[key] = na
                continue
            try:
                be.setup()
                got = run_fk(data, be, case, policy)
            except Exception as e:  # noqa: BLE001 - a crash of the runner on a case is that case's failure
                cells[key] = f"FAIL: runner raised {type(e).__name__}: {e}"
                log.append(f"FAIL {name} {key}: runner raised {type(e).__name__}: {e}")
                continue
            paths = data["structure"][case["structure"]]["params"]
            instead = refusal(data, name, case, policy)
            want = expected(case, policy, paths, instead)
            diff = compare(want, got)
            seen[key] = normalised(got)
            if "deviation" in case and instead is None:
                if diff is None:
                    cells[key] = "FAIL: passes, but is marked as a known deviation"
                    log.append(f"FAIL {name} {key}: passes; remove its `deviation` mark")
                else:
                    cells[key] = "known deviation"
            elif diff is None:
                cells[key] = "pass" if instead is None else f"pass: {want.text()}"
            else:
                cells[key] = f"FAIL: {diff}"
                log.append(f"FAIL {name} {key}: {diff}")
    return cells, seen


def cross_check(data: dict[str, Any], seen: dict[str, dict[str, str]], cells: Cells, log: list[str]) -> None:
    """Every backend that ran a case must give the same normalised outcome (the backends whose
    `refuses` rule replaces the case's outcome: the same one among themselves)."""
    for case in data["case"]:
        for policy in POLICIES:
            key = f"{case['id']}|{policy}"
            groups: dict[str, dict[str, str]] = {}
            for b, s in seen.items():
                if key in s:
                    groups.setdefault(str(refusal(data, b, case, policy)), {})[b] = s[key]
            for outs in groups.values():
                _agree(key, outs, cells, log)


def _agree(key: str, outs: dict[str, str], cells: Cells, log: list[str]) -> None:
    """The backends in `outs` (backend -> normalised outcome of `key`) must give one outcome."""
    if len(set(outs.values())) > 1:
        detail = "; ".join(f"{b}: {o}" for b, o in outs.items())
        log.append(f"FAIL {key}: backends disagree: {detail}")
        for b in outs:
            if not cells[b][key].startswith("FAIL"):
                cells[b][key] = "FAIL: backends disagree"


def run_backends(data: dict[str, Any], chosen: list[str], log: list[str]) -> Cells:
    """Every case on the `chosen` backends, cross-checked: the cells of each. The backends that run
    isolated (the sharded columns) are started first and read last, so that they run meanwhile."""
    cells: Cells = {}
    seen: dict[str, dict[str, str]] = {}
    isolated = {n: start(n) for n in chosen if BACKENDS[n].isolated and BACKENDS[n].missing() is None}
    keys = [f"{c['id']}|{p}" for c in data["case"] for p in POLICIES]
    for name in chosen:
        if name not in isolated:
            cells[name], seen[name] = run_backend(data, name, log)
    for name, started in isolated.items():
        cells[name], seen[name] = collect(started, keys, log)
    cells = {n: cells[n] for n in chosen}
    cross_check(data, {n: seen[n] for n in chosen}, cells, log)
    return cells


def run_peers(data: dict[str, Any]) -> Cells:
    out: Cells = {}
    for name, peer in PEERS.items():
        why = missing(peer) or BACKENDS[peer.backend].missing()
        be = BACKENDS[peer.backend]
        if why is None:
            be.setup()
        out[name] = {}
        for case in data["case"]:
            if why is not None:
                out[name][case["id"]] = why
                continue
            try:
                out[name][case["id"]] = run_peer(peer, data, be, case)
            except Exception as e:  # noqa: BLE001 - recorded, never fatal: peers are not under test
                out[name][case["id"]] = f"runner error: {type(e).__name__}"
    return out


def versions() -> str:
    import importlib.metadata as md

    names = ["functorkit", "numpy", "torch", "jax", "dask", "array-api-strict", "optree", "cupy"]
    found = []
    for n in names:
        try:
            found.append(f"{n} {md.version(n)}")
        except md.PackageNotFoundError:
            continue
    return ", ".join(found)


def gpu_device() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return str(torch.cuda.get_device_name(0))
    except ImportError:
        pass
    return "a GPU"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of the backends")
    ap.add_argument("--no-peers", action="store_true", help="skip the peers (optree, JAX, torch)")
    ap.add_argument("--write-docs", action="store_true", help="regenerate docs/conformance.md and comparison.md")
    ap.add_argument("--check", action="store_true", help="fail if the checked-in pages are stale")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every cell")
    args = ap.parse_args(argv)
    chosen = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(chosen) - set(BACKENDS))
    if unknown:
        ap.error(f"unknown backends {unknown}; choose from {sorted(BACKENDS)}")
    if (args.write_docs or args.check) and (set(chosen) != set(BACKENDS) or args.no_peers):
        ap.error("--write-docs and --check need every backend and the peers")

    data = load()
    t0 = time.perf_counter()
    log: list[str] = []
    cells = run_backends(data, chosen, log)
    peers = {} if args.no_peers else run_peers(data)

    recorded = json.loads(GPU_RESULTS.read_text()) if GPU_RESULTS.exists() else None
    gpu_ran = [b for b in chosen if BACKENDS[b].gpu and BACKENDS[b].missing() is None]
    if gpu_ran and args.write_docs:
        recorded = {
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "device": gpu_device(),
            "versions": versions(),
            "cells": {b: cells[b] for b in gpu_ran},
        }
        GPU_RESULTS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")

    for name in chosen:
        counts: dict[str, int] = {}
        for cell in cells[name].values():
            k = cell.split(":")[0]
            counts[k] = counts.get(k, 0) + 1
        print(f"{name:18} " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        if args.verbose:
            for key, cell in cells[name].items():
                print(f"    {key:45} {cell}")
    for line in log:
        print(line)

    stale = []
    if args.write_docs or args.check:
        stamp = f"Generated {time.strftime('%Y-%m-%d', time.gmtime())} with {versions()}."
        pages = {
            DOCS / "conformance.md": conformance_page(data, cells, recorded, stamp),
            DOCS / "comparison.md": comparison_page(data, peers, stamp),
        }
        for path, text in pages.items():
            if args.write_docs:
                path.write_text(text)
                print(f"wrote {path.relative_to(HERE.parent)}")
            elif not path.exists() or strip_volatile(path.read_text()) != strip_volatile(text):
                stale.append(str(path.relative_to(HERE.parent)))
    for path in stale:
        print(f"STALE {path}: regenerate it with `python conformance/run.py --write-docs` and commit it")
    print(f"{len(log)} failures, {len(stale)} stale pages, {time.perf_counter() - t0:.1f} s")
    return 1 if log or stale else 0


if __name__ == "__main__":
    sys.exit(main())
