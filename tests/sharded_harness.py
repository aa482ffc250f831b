"""Run a worker script in real distributed processes and collect what each process reports.

torch: `run_torch_ranks` starts `world` processes of a script with the ``gloo`` backend's
environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``, a free ``MASTER_PORT``); JAX:
`run_jax` starts one process with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``. A worker
prints one line ``FK_RESULTS <json>`` (its checks, by name); anything else it prints is shown only
when it fails. Each test module starts its processes once (a module-scoped fixture) and asserts
on the results check by check.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = "FK_RESULTS "
TIMEOUT = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _results(out: str, err: str, rc: int, who: str) -> dict[str, Any]:
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if rc != 0 or len(lines) != 1:
        pytest.fail(f"{who} failed (exit {rc}):\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-4000:]}")
    results: dict[str, Any] = json.loads(lines[0][len(MARK) :])
    return results


def run_torch_ranks(script: str, world: int = 2, extra: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Start `world` gloo ranks of `script` (in tests/), wait for all, return each rank's results
    (`extra`: more environment variables)."""
    port = str(free_port())
    procs = []
    # each rank writes into files, not pipes: ranks finish together (a barrier), and a rank blocked on
    # a full pipe (64 KiB of results) that is read only after another rank's would never get there
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(world)]  # noqa: SIM115
    for rank in range(world):
        env = _env(
            {
                **(extra or {}),
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
                "OMP_NUM_THREADS": "1",
            }
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / script)],
                env=env,
                stdout=files[rank][0],
                stderr=files[rank][1],
                text=True,
            )
        )
    outs = []
    try:
        for p, (fo, fe) in zip(procs, files, strict=True):
            p.wait(timeout=TIMEOUT)
            fo.seek(0)
            fe.seek(0)
            outs.append((fo.read(), fe.read()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for fo, fe in files:
            fo.close()
            fe.close()
    return [_results(o, e, p.returncode, f"rank {r}") for r, (p, (o, e)) in enumerate(zip(procs, outs, strict=True))]


def run_jax(script: str, devices: int = 8) -> dict[str, Any]:
    """Run `script` (in tests/) in one process that sees `devices` JAX CPU devices."""
    env = _env({"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"})
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    return _results(done.stdout, done.stderr, done.returncode, "the JAX process")


def gloo_available() -> bool:
    """Whether torch.distributed with the gloo backend can run here."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_gloo_available())
