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
nox.options.sessions = ["tests", "lint", "types", "docs", "demo", "conformance", "package"]

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
    # namespace for the mixed-namespace tests; dask: fk.open's doctest; ml_dtypes: bfloat16/float8
    "numpy": ["array-api-strict>=2.2", "safetensors>=0.4", "dask[array]>=2024.1", "ml_dtypes>=0.3"],
    # dask: the LocalCluster checkpoint test checks its result against torch tensors too
    "torch": [TORCH, "scipy>=1.10", "safetensors>=0.4", "dask[array,distributed]>=2024.1", "ml_dtypes>=0.3"],
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
# run in the fresh venv holding only the wheel: it imports, reports the wheel's version, ships
# its type marker, and a dependent package (tests/downstream/sgdm_opt) runs on it
PACKAGE_CHECK = (
    "import importlib.metadata as md, pathlib, functorkit as fk, numpy as np, sgdm_opt;"
    " assert fk.__version__ == md.version('functorkit'), (fk.__version__, md.version('functorkit'));"
    " assert 'site-packages' in fk.__file__, fk.__file__;"
    " assert (pathlib.Path(fk.__file__).parent / 'py.typed').exists(), 'py.typed missing from the wheel';"
    " opt = sgdm_opt.SGDM(lr=0.5, momentum=0.0); st = opt.init({'w': np.ones(2)});"
    " m, st = opt.step(st, {'w': np.ones(2)}); assert (m['w'] == 0.5).all();"
    " print('wheel OK: functorkit', fk.__version__, fk.__file__)"
)


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
    """mypy --strict on functorkit/ (configured in pyproject.toml), and on a typed user's code
    (tests/test_typing.py: what `mypy --strict` users of functorkit see)."""
    _install(session, "mypy>=1.10", "pytest>=8", "-e", ".")
    session.run("mypy", "functorkit")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "tests/test_typing.py")


# a page's `<!-- requires: torch, scipy -->` names modules; the package to install where it differs
DOCS_PACKAGE = {"sklearn": "scikit-learn", "yaml": "pyyaml", "PIL": "pillow"}


def _docs_requirements() -> list[str]:
    """What the docs pages declare they import (README.md and docs/*.md), as packages to install."""
    import pathlib
    import re

    names: set[str] = set()
    for page in [pathlib.Path("README.md"), *sorted(pathlib.Path("docs").glob("*.md"))]:
        for m in re.finditer(r"^<!--\s*requires:\s*(.*?)\s*-->\s*$", page.read_text(encoding="utf-8"), re.M):
            names |= {n.strip() for n in m.group(1).split(",") if n.strip()}
    return sorted(DOCS_PACKAGE.get(n, n) for n in names)


@nox.session
def docs(session: nox.Session) -> None:
    """Run every code block of every page (all their libraries installed), then mkdocs build --strict."""
    _install(session, "-e", ".[docs,test]", *_docs_requirements())
    # a page whose declared library is missing fails here instead of skipping
    session.run(*PYTEST, "tests/test_docs_examples.py", env={"FUNCTORKIT_DOCS_REQUIRE_ALL": "1"})
    session.run("mkdocs", "build", "--strict", "--site-dir", session.create_tmp() + "/site")


@nox.session
def package(session: nox.Session) -> None:
    """Build sdist and wheel, twine check them, install the wheel in a fresh venv, import it, run a dependent."""
    import glob
    import os

    _install(session, "build>=1.2", "twine>=5")
    tmp = session.create_tmp()
    dist = os.path.join(tmp, "dist")
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--outdir", dist)
    built = sorted(glob.glob(os.path.join(dist, "*")))
    session.run("twine", "check", "--strict", *built)
    wheel = next(f for f in built if f.endswith(".whl"))
    venv = os.path.join(tmp, "wheel-venv")
    session.run("python", "-m", "venv", "--clear", venv)
    py = os.path.join(venv, "bin", "python")
    # the built wheel, then the downstream package (tests/downstream) resolving functorkit to it
    session.run(py, "-m", "pip", "install", "-q", "-c", CONSTRAINTS, wheel, external=True)
    session.run(py, "-m", "pip", "install", "-q", "--no-deps", "./tests/downstream", external=True)
    session.run(py, "-I", "-c", PACKAGE_CHECK, external=True)


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


@nox.session
def conformance(session: nox.Session) -> None:
    """conformance/cases.toml on every backend and the peers; fails on a difference or a stale docs page."""
    peers = ["jax>=0.4.30", "dask[array]>=2024.1", "array-api-strict>=2.2", "optree>=0.12", "attrs>=22.2"]
    _install(session, "-e", ".", TORCH, *peers)
    if _has_gpu():
        _install(session, BACKENDS["cupy"][0])
    session.run("python", "conformance/run.py", "--check", *session.posargs)
