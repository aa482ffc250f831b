"""conformance/cases.toml: its schema, and its NumPy cases run (the whole table: `nox -s conformance`)."""

from __future__ import annotations

import copy
import importlib.util
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
