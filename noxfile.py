"""Sessions: tests (one per backend), lint, types, docs, demo, bench.

    python3 -m nox                              # the full matrix: what CI (.ci/run) runs
    python3 -m nox -s demo                      # the tour of a small torch model
    python3 -m nox -s "tests(backend='torch')"  # one backend
    python3 -m nox -s bench                     # benchmarks -> docs/benchmarks.md (not in the default list)
    python3 -m nox -s bench -- --quick          # a fast smoke run of the benchmarks

Every session makes its own virtualenv under .nox/ and installs what it needs
from the package index, so a machine with only Python and pip runs all of it.
"""

from __future__ import annotations

import shutil
import subprocess

import nox

nox.needs_version = ">=2024.3.2"
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False
# the default list is the full CI matrix; `bench` is deliberately not in it
nox.options.sessions = ["tests", "lint", "types", "docs", "demo"]

# Exact versions live in constraints.txt (torch: the CPU build this project's machines carry on
# disk; any other version pulls a multi-GB CUDA build there); every install passes it with -c,
# so pyproject.toml's extras keep ranges.
CONSTRAINTS = "constraints.txt"
TORCH = "torch"

# backend -> packages installed besides functorkit[test]
BACKENDS: dict[str, list[str]] = {
    # only the core dependencies (numpy, array-api-compat): the wheel, installed
    # non-editable, must work and the suite must pass with no optional library
    "lite": [],
    # NumPy tests plus the doctests; array-api-strict is there as a second
    # namespace for the mixed-namespace tests
    "numpy": ["array-api-strict>=2.2", "safetensors>=0.4", "dask[array]>=2024.1"],  # dask: fk.open's doctest
    "torch": [TORCH, "scipy>=1.10", "safetensors>=0.4"],
    "array_api_strict": ["array-api-strict>=2.2"],
    "jax": ["jax>=0.4.30"],
    "dask": ["dask[array,distributed]>=2024.1", "ml_dtypes>=0.3"],
    # [ctk] brings the CUDA 12 libraries as wheels, so a GPU machine needs only the driver
    "cupy": ["cupy-cuda12x[ctk]>=13"],
}
# which test backends (tests/conftest.py Backend values) each session exercises
SELECT = {
    "lite": "numpy,numpy_readonly",
    "numpy": "numpy,numpy_readonly",
    "torch": "torch",
    "array_api_strict": "array_api_strict",
    "jax": "jax",
    "dask": "dask",
    "cupy": "cupy",
}
# `python -I` (isolated: the installed package, not the source tree on the cwd)
# proves that importing functorkit loads none of the optional backends, even
# in the sessions where they are installed.
BACKEND_FREE = (
    "import sys, functorkit;"
    " bad = [m for m in ('torch', 'jax', 'cupy', 'dask') if m in sys.modules];"
    " assert not bad, f'import functorkit imported {bad}';"
    " print('import functorkit is backend-free:', functorkit.__file__)"
)
PYTEST = ["pytest", "-p", "no:cacheprovider"]


def _install(session: nox.Session, *args: str) -> None:
    session.install("-c", CONSTRAINTS, *args)


def _has_gpu() -> bool:
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return False
    try:
        done = subprocess.run([nvidia_smi, "-L"], capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and b"GPU" in done.stdout


@nox.session
@nox.parametrize("backend", list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """Run the test suite on one backend (cupy skips without an NVIDIA GPU)."""
    if backend == "cupy" and not _has_gpu():
        session.skip("CuPy needs an NVIDIA GPU and there is none on this machine")
    env = {"FUNCTORKIT_BACKENDS": SELECT[backend], "FUNCTORKIT_TEST_SESSION": backend}
    if backend == "lite":
        # what `pip install .` gives a user: a real wheel, not the source tree
        _install(session, ".[test]")
        _install(session, "--no-deps", "--force-reinstall", ".")
        session.run("python", "-I", "-c", BACKEND_FREE)
        session.run(*PYTEST, *session.posargs, env=env)
        return
    _install(session, "-e", ".[test]", *BACKENDS[backend])
    session.run("python", "-I", "-c", BACKEND_FREE)
    targets = ["tests"]
    if backend == "numpy" and not session.posargs:
        # the docstring examples run with NumPy only
        targets += ["functorkit", "--ignore=functorkit/adapters"]
    session.run(*PYTEST, *(session.posargs or targets), env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check over the package, tests, examples, benchmarks and this file."""
    _install(session, "ruff>=0.6")
    session.run("ruff", "check", "functorkit", "tests", "benchmarks", "examples", "conformance", "noxfile.py")


@nox.session
def types(session: nox.Session) -> None:
    """mypy --strict on functorkit/ (configured in pyproject.toml)."""
    _install(session, "mypy>=1.10", "-e", ".")
    session.run("mypy", "functorkit")


@nox.session
def docs(session: nox.Session) -> None:
    """Build the mkdocs site with --strict (broken links and bad references fail)."""
    _install(session, "-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site")


@nox.session
def demo(session: nox.Session) -> None:
    """The demo: a tour of what functorkit sees in a small torch model."""
    _install(session, "-e", ".[demo]")
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the peers and the physical limits -> docs/benchmarks.md (`-- --quick` for a smoke run)."""
    _install(session, "-e", ".", TORCH, "jax>=0.4.30", "optree>=0.12", "dm-tree>=0.1.8", "array-api-strict>=2.2")
    session.run("python", "benchmarks/run.py", *session.posargs)
