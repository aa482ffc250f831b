"""Sessions: tests (one per backend), lint, types, docs, demo, bench.

    python3 -m nox                      # the full matrix (what CI runs)
    python3 -m nox -s "tests(backend='torch')"
    python3 -m nox -s bench             # benchmarks -> docs/benchmarks.md
"""

from __future__ import annotations

import shutil
import subprocess

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["tests", "lint", "types", "docs", "demo"]

TORCH = "torch==2.13.0"  # the CPU build on this project's machines; others pull CUDA
# backend -> extra packages; "lite" has only the core dependencies
BACKENDS: dict[str, list[str]] = {
    "lite": [],
    "numpy": ["array-api-strict>=2.2"],
    "torch": [TORCH, "scipy>=1.10"],
    "array_api_strict": ["array-api-strict>=2.2"],
    "jax": ["jax>=0.4.30"],
    "dask": ["dask[array]>=2024.1"],
    "cupy": ["cupy-cuda12x>=13"],
}
# which test backends (conftest.Backend values) each session exercises
SELECT = {
    "lite": "numpy,numpy_readonly",
    "numpy": "numpy,numpy_readonly",
    "torch": "torch",
    "array_api_strict": "array_api_strict",
    "jax": "jax",
    "dask": "dask",
    "cupy": "cupy",
}


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    return subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """Run the test suite on one backend (cupy skips without an NVIDIA GPU)."""
    if backend == "cupy" and not _has_gpu():
        session.skip("CuPy needs an NVIDIA GPU; none here")
    session.install("-e", ".[test]", *BACKENDS[backend])
    env = {"FUNCTORKIT_BACKENDS": SELECT[backend], "FUNCTORKIT_TEST_SESSION": backend}
    session.run("pytest", "-q", "-p", "no:cacheprovider", *session.posargs, env=env)
    if backend == "lite":
        session.run(
            "python",
            "-c",
            "import sys, functorkit; bad = [m for m in ('torch','jax','cupy','dask') if m in sys.modules];"
            " assert not bad, f'import functorkit imported {bad}'; print('import functorkit is backend-free')",
        )
    if backend == "numpy":
        session.run("pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules", "functorkit",
                    "--ignore=functorkit/adapters", env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "functorkit", "tests", "benchmarks", "examples", "noxfile.py", "conformance")


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict on functorkit/."""
    session.install("mypy>=1.10", "-e", ".")
    session.run("mypy", "functorkit")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the mkdocs site with --strict."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site")


@nox.session
def demo(session: nox.Session) -> None:
    """The tour: what functorkit sees in a real small model."""
    session.install("-e", ".[demo]")
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers and the physical limits -> docs/benchmarks.md."""
    session.install("-e", ".", TORCH, "jax>=0.4.30", "optree>=0.12", "dm-tree>=0.1.8", "array-api-strict>=2.2")
    session.run("python", "benchmarks/run.py", *session.posargs)
