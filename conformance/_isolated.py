"""The columns that run in processes of their own: torch DTensor (ranks) and JAX sharded (devices).

``run.py`` starts them with `start` before it runs the other backends and reads them with
`collect` afterwards, so they run while it works:

* **torch DTensor**: `DTENSOR_RANKS` processes, the ranks of one ``gloo`` process group on
  127.0.0.1 (a free port), each running every case on DTensors sharded over all ranks (so a
  2 x 3 parameter really is split, one row per rank, and a length-3 one unevenly). Every rank
  must report the same cells: a rank that disagrees, crashes or hangs fails the column.
* **JAX sharded**: one process with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` (which
  must be set before JAX is imported, hence the process) and ``JAX_PLATFORMS=cpu``, running every
  case on arrays placed over a 2 x 2 ``Mesh`` of those host devices.

A process runs ``python conformance/_isolated.py BACKEND`` and prints one line
``FK_CONFORMANCE <json>`` with its cells, its normalised outcomes and its failures.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _backends import BACKENDS, DTENSOR_RANKS, JAX_MESH

HERE = Path(__file__).resolve().parent
MARK = "FK_CONFORMANCE "
TIMEOUT = 300  # seconds for one column; the whole table takes a few


@dataclass
class Started:
    """The processes of one column, started."""

    name: str
    procs: list[subprocess.Popen[str]]
    t0: float = field(default_factory=time.perf_counter)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str]) -> dict[str, str]:
    """This environment and `extra` (functorkit is found as run.py finds it: installed, else the
    checkout's)."""
    return {**os.environ, **extra}


def _spawn(name: str, env: dict[str, str], cases: Path | None) -> subprocess.Popen[str]:
    cmd = [sys.executable, str(HERE / "_isolated.py"), name, *([] if cases is None else [str(cases)])]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def start(name: str, cases: Path | None = None) -> Started:
    """Start the processes of column `name` (its backend's ``isolated`` kind) on the table in
    `cases` (default: conformance/cases.toml)."""
    kind = BACKENDS[name].isolated
    if kind == "ranks":
        port = str(_free_port())
        procs = [
            _spawn(
                name,
                _env(
                    {
                        "RANK": str(rank),
                        "WORLD_SIZE": str(DTENSOR_RANKS),
                        "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": port,
                        "OMP_NUM_THREADS": "1",
                    }
                ),
                cases,
            )
            for rank in range(DTENSOR_RANKS)
        ]
        return Started(name, procs)
    if kind == "devices":
        n = JAX_MESH[0] * JAX_MESH[1]
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={n}".strip()
        return Started(name, [_spawn(name, _env({"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}), cases)])
    msg = f"backend {name!r} does not run isolated"
    raise ValueError(msg)


def _read(proc: subprocess.Popen[str]) -> tuple[dict[str, Any] | None, str]:
    """One process's report, or None and why not."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, f"timed out after {TIMEOUT} s"
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or len(lines) != 1:
        tail = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        return None, f"exited with status {proc.returncode}: {tail[:200]}"
    report: dict[str, Any] = json.loads(lines[0][len(MARK) :])
    return report, ""


def collect(started: Started, keys: list[str], log: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The cells and normalised outcomes of a started column (rank 0's, once every rank agrees);
    every failure of a process or a disagreement between ranks is a failure of the column."""
    name = started.name
    reports = []
    for i, proc in enumerate(started.procs):
        report, why = _read(proc)
        who = f"rank {i}" if len(started.procs) > 1 else "its process"
        if report is None:
            log.append(f"FAIL {name}: {who} {why}")
            return dict.fromkeys(keys, f"FAIL: {who} {why}"), {}
        reports.append(report)
    first = reports[0]
    cells: dict[str, str] = first["cells"]
    log.extend(first["log"])
    for i, other in enumerate(reports[1:], start=1):
        for key in keys:
            mine, theirs = cells.get(key), other["cells"].get(key)
            same_seen = first["seen"].get(key) == other["seen"].get(key)
            if (mine != theirs or not same_seen) and not str(mine).startswith("FAIL"):
                cells[key] = f"FAIL: ranks disagree (rank 0: {mine}; rank {i}: {theirs})"
                got = (first["seen"].get(key), other["seen"].get(key))
                log.append(f"FAIL {name} {key}: rank 0 gave {got[0]}, rank {i} {got[1]}")
    print(f"{name}: {time.perf_counter() - started.t0:.1f} s in {len(started.procs)} process(es) of its own")
    missing_keys = [k for k in keys if k not in cells]
    for key in missing_keys:
        cells[key] = "FAIL: not reported"
        log.append(f"FAIL {name} {key}: not reported by the column's process")
    return cells, dict(first["seen"])


def main(argv: list[str]) -> int:
    """In a column's process: every case on that backend (argv: the backend, and optionally
    another cases file), reported on one line."""
    import run  # conformance/run.py, next to this file (sys.path[0] here)
    from _table import load

    name = argv[0]
    data = load() if len(argv) < 2 else load(Path(argv[1]))
    log: list[str] = []
    cells, seen = run.run_backend(data, name, log)
    print(MARK + json.dumps({"cells": cells, "seen": seen, "log": log}), flush=True)
    if BACKENDS[name].isolated == "ranks":
        import torch.distributed as dist

        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
