"""conformance/cases.toml: its schema, and its NumPy cases run (the whole table: `nox -s conformance`)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

CONFORMANCE = Path(__file__).resolve().parent.parent / "conformance"
sys.path.insert(0, str(CONFORMANCE))

import _pages  # noqa: E402
import _table  # noqa: E402
from _backends import BACKENDS  # noqa: E402

DATA = _table.load()


def _runner() -> Any:
    """conformance/run.py, imported under a name of its own (not as a top-level `run`)."""
    spec = importlib.util.spec_from_file_location("conformance_run", CONFORMANCE / "run.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OUTCOME_KEYS = {"dtype", "device", "namespace", "memory", "needs"}


def _features() -> set[str]:
    return set(DATA["feature"]) | set(_table.DTYPES)


def test_backends_are_declared_and_known() -> None:
    assert set(DATA["backend"]) == set(BACKENDS)
    for name, spec in DATA["backend"].items():
        assert set(spec["provides"]) <= _features(), name
        assert spec["label"]
        assert bool(spec.get("gpu", False)) == BACKENDS[name].gpu, name
        assert set(spec) <= {"label", "provides", "memory", "gpu", "reasons", "runs", "refuses"}, name
        assert set(spec.get("reasons", {})) <= _features(), name
        assert ("runs" in spec) == (BACKENDS[name].isolated is not None), name
        if "refuses" in spec:
            rule = spec["refuses"]
            assert set(rule) == {"error", "at", "sharded", "names", "decision"}, name
            assert rule["error"] in _table.ERRORS, name
            assert rule["at"] == "destructure", name
            assert rule["sharded"] == "every array" or rule["sharded"].startswith("first axis divisible by "), name
    # the sharded columns are the ones whose destructure refuses (SPEC 17), each running isolated
    assert {n for n, s in DATA["backend"].items() if "refuses" in s} == {"torch_dtensor", "jax_sharded"}


def test_structures_parse() -> None:
    for name, st in DATA["structure"].items():
        assert st["kind"] in ("dict", "torch_module", "jax_registered"), name
        assert isinstance(st["params"], list), name
        assert len(set(st["params"])) == len(st["params"]), name
        assert set(st.get("needs", [])) <= _features(), name
        for spec in [*st.get("leaves", {}).values(), *st.get("holder", {}).values()]:
            _table.parse_leaf(spec)
        if "flat_vector" in st:
            dtype, *where = st["flat_vector"].split()
            assert dtype in _table.DTYPES, name
            assert where in ([], ["second"]), name
        assert set(st.get("ties", {}).values()) <= set(st.get("leaves", {})), name
        for container, spec in st.get("containers", {}).values():
            assert container in _table.CONTAINERS, name
            _table.parse_leaf(spec)


def _check_field(value: Any, params: list[str], allowed: set[str], where: str) -> None:
    if isinstance(value, str):
        assert value in allowed, where
        return
    assert set(value) == set(params), f"{where}: a table must name every parameter {params}"
    assert set(value.values()) <= allowed, where


def test_cases_follow_the_schema() -> None:
    ids = [c["id"] for c in DATA["case"]]
    assert len(ids) == len(set(ids))
    for case in DATA["case"]:
        where = case["id"]
        assert case["structure"] in DATA["structure"], where
        assert set(case) <= {"id", "structure", "p", "needs", "deviation", "decision", *_table.POLICIES}, where
        assert set(case["p"]) <= {"dtype", "device", "namespace", "length", "rank", "copy"}, where
        assert case["p"].get("dtype", "flat") in {"flat", *_table.DTYPES}, where
        assert set(case.get("needs", [])) <= _features(), where
        params = DATA["structure"][case["structure"]]["params"]
        for policy in _table.POLICIES:
            o = case[policy]
            if "error" in o:
                assert o["error"] in _table.ERRORS, where
                assert o.get("at", "re") in ("destructure", "re"), where
                assert set(o) <= {"error", "at", "needs"}, where
                continue
            assert set(o) <= OUTCOME_KEYS, where
            _check_field(o["dtype"], params, set(_table.DTYPES), f"{where} {policy} dtype")
            _check_field(o["memory"], params, {"view", "copy"}, f"{where} {policy} memory")
            _check_field(o.get("device", "default"), params, {"default", "second"}, f"{where} {policy} device")
            _check_field(o.get("namespace", "backend"), params, {"backend", "other"}, f"{where} {policy} namespace")
            assert set(o.get("needs", [])) <= _features(), where


def test_na_comes_from_the_data() -> None:
    bf16 = next(c for c in DATA["case"] if c["id"] == "bf16/p-flat")
    assert _table.not_applicable(DATA, "numpy", bf16, "strict") == "n/a: no bfloat16 dtype"
    assert _table.not_applicable(DATA, "torch", bf16, "strict") is None
    second = next(c for c in DATA["case"] if c["id"] == "plain32/p-second-device")
    assert _table.not_applicable(DATA, "torch", second, "flat") is None
    assert _table.not_applicable(DATA, "torch", second, "model") is not None  # meta holds no values


def test_numpy_cases_pass() -> None:
    pytest.importorskip("array_api_strict")  # the other namespace of NumPy's cases
    log: list[str] = []
    cells, seen = _runner().run_backend(DATA, "numpy", log)
    assert log == []
    assert sum(c == "pass" for c in cells.values()) >= 60
    assert {c.split(":")[0] for c in cells.values()} <= {"pass", "n/a", "known deviation"}
    assert seen["plain32/p-float64|flat"] == "float64"


def test_a_wrong_expectation_fails() -> None:
    pytest.importorskip("array_api_strict")
    data = copy.deepcopy(DATA)
    case = next(c for c in data["case"] if c["id"] == "plain32/p-float64")
    case["model"]["memory"] = "view"  # a cast cannot be a view of p
    case["flat"]["dtype"] = "float32"  # "flat" gives p's dtype
    log: list[str] = []
    cells, _ = _runner().run_backend(data, "numpy", log)
    assert cells["plain32/p-float64|model"].startswith("FAIL")
    assert cells["plain32/p-float64|flat"].startswith("FAIL")
    assert len(log) == 2


def test_pages_ignore_only_volatile_lines() -> None:
    cells = {b: {f"{c['id']}|{p}": "pass" for c in DATA["case"] for p in _table.POLICIES} for b in BACKENDS}
    one = _pages.conformance_page(DATA, cells, None, "Generated today.")
    two = _pages.conformance_page(DATA, cells, None, "Generated tomorrow.")
    assert one != two
    assert _pages.strip_volatile(one) == _pages.strip_volatile(two)
    cells["numpy"]["plain32/p-flat|strict"] = "FAIL: x"
    three = _pages.conformance_page(DATA, cells, None, "Generated today.")
    assert _pages.strip_volatile(one) != _pages.strip_volatile(three)


def test_gpu_columns_are_never_passed_without_a_gpu_run() -> None:
    keys = [f"{c['id']}|{p}" for c in DATA["case"] for p in _table.POLICIES]
    cells = {b: dict.fromkeys(keys, "pass") for b in BACKENDS}
    for b in ("cupy", "torch_cuda"):
        cells[b] = dict.fromkeys(keys, "not run: no GPU on this machine")
    page = _pages.conformance_page(DATA, cells, None, "Generated today.")
    assert "| CuPy (cuda) | not run: no GPU on this machine |" in page
    assert "pass (recorded)" not in page
    recorded = {"date": "2026-01-01", "device": "NVIDIA H200", "cells": {"cupy": dict.fromkeys(keys, "pass")}}
    page = _pages.conformance_page(DATA, cells, recorded, "Generated today.")
    assert "| CuPy (cuda) | recorded on NVIDIA H200, 2026-01-01 |" in page
    assert "| torch (cuda; cpu second) | not run: no GPU on this machine |" in page


# ---- the sharded columns (torch DTensor on gloo ranks, JAX over a Mesh): conformance/_isolated.py


def _can(column: str) -> bool:
    """Whether this environment has what a sharded column needs, found without the runner's help
    (so that a runner that stops running the column, or says "not run" wrongly, fails)."""
    if column == "jax_sharded":
        return importlib.util.find_spec("jax") is not None
    if importlib.util.find_spec("torch") is None:
        return False
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def _keys(data: dict[str, Any]) -> list[str]:
    return [f"{c['id']}|{p}" for c in data["case"] for p in _table.POLICIES]


def _run_column(column: str, data: dict[str, Any], cases: Path | None = None) -> tuple[dict[str, str], list[str]]:
    import _isolated

    log: list[str] = []
    cells, _ = _isolated.collect(_isolated.start(column, cases), _keys(data), log)
    return cells, log


@pytest.mark.parametrize("column", ["torch_dtensor", "jax_sharded"])
def test_sharded_column_runs_every_case(column: str) -> None:
    why = BACKENDS[column].missing()
    if not _can(column):
        # the column degrades to a clear reason in every cell (and on the page)
        assert why is not None
        assert why.startswith("not run: ")
        log: list[str] = []
        cells, seen = _runner().run_backend(DATA, column, log)
        assert set(cells.values()) == {why}
        assert seen == {}
        return
    assert why is None
    log = []
    cells = _runner().run_backends(DATA, [column], log)[column]  # as `run.py` runs it
    assert log == []
    assert set(cells) == set(_keys(DATA))
    kinds = {c.split(":")[0] for c in cells.values()}
    assert kinds == {"pass", "n/a"}, kinds
    refused = [k for k, c in cells.items() if c == "pass: TypeError (destructure)"]
    assert len(refused) >= 90
    # no parameters: nothing to refuse, the case's own outcome; an unknown holder: its StructureError
    assert cells["empty/p-empty-float32|strict"] == "pass"
    assert cells["unknown_holder/p-flat|model"] == "pass"
    # mixed precision and two namespaces: refused before the policy's PolicyError
    assert cells["mixed/p-flat|strict"] == "pass: TypeError (destructure)"
    assert cells["two_namespaces/p-flat|flat"] == "pass: TypeError (destructure)"
    assert cells["plain32/p-second-device|flat"].startswith("n/a: one ")
    own = "module/p-flat|strict" if column == "torch_dtensor" else "jax_registered/p-flat|strict"
    assert cells[own] == "pass: TypeError (destructure)"  # an FSDP2 module; a JAX-registered class
    # odd first axes: DTensor shards them unevenly (refused); JAX replicates them (destructured, and
    # re(p) keeps every array over the mesh)
    odd = "pass: TypeError (destructure)" if column == "torch_dtensor" else "pass"
    assert {cells[f"odd_rows/p-float64|{p}"] for p in _table.POLICIES} == {odd}


def _small_table(tmp_path: Path, edit: tuple[str, str]) -> tuple[Path, dict[str, Any]]:
    """cases.toml with its first case and the unknown-holder case only, and one text edit."""
    text = _table.CASES.read_text()
    head, *cases = text.split("\n[[case]]\n")
    keep = [c for c in cases if 'id = "plain32/p-flat"' in c or 'id = "unknown_holder/p-flat"' in c]
    old, new = edit
    assert old in head
    path = tmp_path / "cases.toml"
    path.write_text(head.replace(old, new) + "".join("\n[[case]]\n" + c for c in keep))
    return path, _table.load(path)


#: one edit of each sharded column's rule that the code does not meet: a fix the message does not
#: name (torch), another error class (JAX)
WRONG = {
    "torch_dtensor": ('names = ["DTensor", "to_local"', 'names = ["DTensor", "no such fix"'),
    "jax_sharded": (
        'error = "TypeError"\nat = "destructure"\nsharded = "first axis',
        'error = "ValueError"\nat = "destructure"\nsharded = "first axis',
    ),
}


@pytest.mark.parametrize("column", sorted(WRONG))
def test_a_wrong_sharded_expectation_fails(column: str, tmp_path: Path) -> None:
    if not _can(column):
        pytest.skip(f"{column} needs what this environment lacks (its not-run reason: the test above)")
    edit = WRONG[column]
    path, data = _small_table(tmp_path, edit)
    cells, log = _run_column(column, data, path)
    assert cells["plain32/p-flat|strict"].startswith("FAIL")
    assert cells["unknown_holder/p-flat|strict"] == "pass"
    assert len(log) == 3  # the three policies of plain32/p-flat
    want = "does not name 'no such fix'" if column == "torch_dtensor" else "expected ValueError (destructure)"
    assert want in cells["plain32/p-flat|flat"]


def test_a_failing_or_disagreeing_process_fails_the_column() -> None:
    import subprocess

    import _isolated

    keys = _keys(DATA)
    crash = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log: list[str] = []
    cells, seen = _isolated.collect(_isolated.Started("torch_dtensor", [crash]), keys, log)
    assert set(cells.values()) == {"FAIL: its process exited with status 3: boom"}
    assert seen == {}
    assert len(log) == 1

    def rank(cell: str) -> subprocess.Popen[str]:
        report = {"cells": dict.fromkeys(keys, cell), "seen": dict.fromkeys(keys, cell), "log": []}
        code = f"print({_isolated.MARK + json.dumps(report)!r})"
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    log = []
    cells, _ = _isolated.collect(_isolated.Started("torch_dtensor", [rank("pass"), rank("n/a: x")]), keys, log)
    assert all(c.startswith("FAIL: ranks disagree") for c in cells.values())
    assert len(log) == len(keys)


def test_a_sharded_column_not_run_says_why(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import dataclasses

    gone = dataclasses.replace(BACKENDS["jax_sharded"], module="fk_no_such_module")
    monkeypatch.setitem(BACKENDS, "jax_sharded", gone)
    nodist = dataclasses.replace(  # numpy: importable everywhere, so that the reason below is the one given
        BACKENDS["torch_dtensor"],
        module="numpy",
        also_missing=lambda: "not run: this torch build has no torch.distributed",
    )
    monkeypatch.setitem(BACKENDS, "torch_dtensor", nodist)
    assert _runner().main(["--backends", "jax_sharded,torch_dtensor", "--no-peers", "-v"]) == 0
    out = capsys.readouterr().out
    n = len(_keys(DATA))
    assert f"jax_sharded        {n} not run" in out
    assert f"torch_dtensor      {n} not run" in out
    assert "not run: fk_no_such_module not installed" in out
    assert "not run: this torch build has no torch.distributed" in out
