"""Threads: functorkit's operations give exact results when run concurrently.

The registration race (8 threads registering one class, exactly one wins) is in
tests/test_registry.py. Here: `load_into` on 8 destinations from 8 threads, `re(p)`
and `re.flatten` on one shared `Restructure` from 8 threads, and walks running
while another thread registers classes. Every test starts its threads on a
`threading.Barrier` so they overlap, runs a bounded number of rounds, and lowers
the interpreter's switch interval so threads interleave often.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import functorkit as fk

from conftest import Backend, to_numpy
from helpers import Layer, Pair, zoo

THREADS = 8
ROUNDS = 25


@pytest.fixture(autouse=True)
def _switch_often() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


@pytest.fixture
def mutable(backend: Backend, xp: Any) -> Any:
    """The namespace of a backend whose arrays can be written (NumPy, torch)."""
    if backend not in (Backend.NUMPY, Backend.TORCH):
        pytest.skip("the thread tests run on the writable CPU backends, NumPy and torch")
    return xp


def run_threads(work: Callable[[int], None]) -> None:
    """Run ``work(i)`` for i in 0..7 on 8 threads started together; re-raise the first failure."""
    barrier = threading.Barrier(THREADS)
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            work(i)
        except BaseException as e:  # noqa: BLE001 -- handed to the main thread below
            with lock:
                errors.append((i, e))

    threads = [threading.Thread(target=target, args=(i,), name=f"fk-test-{i}") for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish within 300 s"
    if errors:
        i, e = errors[0]
        msg = f"thread {i} failed ({len(errors)} of {THREADS} failed)"
        raise AssertionError(msg) from e


def model(xp: Any, seed: int) -> dict[str, Any]:
    """A model with distinct values per `seed`: layers, a tie, an integer buffer, a scalar."""
    rng = np.random.default_rng(seed)

    def arr(*shape: int) -> Any:
        return xp.asarray(rng.standard_normal(shape), dtype=xp.float64)

    shared = arr(64)
    return {
        "layers": [Layer(arr(32, 32), arr(32), name=f"l{k}") for k in range(4)],
        "head": (arr(32, 8), shared),
        "tied": shared,
        "steps": xp.asarray([seed, 7], dtype=xp.int64),
        "scale": 0.5,
    }


def numpy_leaves(tree: Any) -> list[np.ndarray]:
    return [to_numpy(x) for x in fk.leaves(tree) if not isinstance(x, (int, float, str))]


def assert_exact(got: Any, want: list[np.ndarray]) -> None:
    have = numpy_leaves(got)
    assert len(have) == len(want)
    for a, b in zip(have, want, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b, strict=True)


def test_load_into_eight_destinations_from_eight_threads(mutable: Any) -> None:
    xp = mutable
    sources = [model(xp, seed) for seed in range(THREADS)]
    expected = [numpy_leaves(src) for src in sources]
    dsts = [model(xp, 100 + i) for i in range(THREADS)]
    ids_before = [[id(x) for x in fk.leaves(d)] for d in dsts]

    def work(i: int) -> None:
        dst = dsts[i]
        for r in range(ROUNDS):
            k = (i + r) % THREADS  # every source is read by several threads at once
            out = fk.load_into(dst, sources[k])
            assert out is dst
            assert_exact(dst, expected[k])
            assert dst["tied"] is dst["head"][1]
            assert [x.name for x in dst["layers"]] == [f"l{j}" for j in range(4)]

    run_threads(work)
    # in place: every destination still holds its own array objects; the sources are untouched
    assert [[id(x) for x in fk.leaves(d)] for d in dsts] == ids_before
    for src, want in zip(sources, expected, strict=True):
        assert_exact(src, want)


def test_re_on_one_restructure_from_eight_threads(mutable: Any) -> None:
    xp = mutable
    base = model(xp, 0)
    flat, re = fk.destructure(base)
    flats = [flat * float(i + 1) for i in range(THREADS)]
    # the serial answers, made before any thread starts
    expected = [numpy_leaves(re(p)) for p in flats]
    steps = to_numpy(base["steps"])

    def work(i: int) -> None:
        p = flats[i]
        for r in range(ROUNDS):
            out = re(p, copy=True) if r % 3 == 2 else re(p)
            assert_exact(out, expected[i])
            assert out["tied"] is out["head"][1]  # ties come back tied
            np.testing.assert_array_equal(to_numpy(out["steps"]), steps, strict=True)
            assert out["scale"] == 0.5
            np.testing.assert_array_equal(to_numpy(re.flatten(out)), to_numpy(p), strict=True)

    run_threads(work)
    # and the serial answers are the right ones: parameter k of re(c * flat) is c * parameter k
    for i, want in enumerate(expected):
        own = numpy_leaves(base)
        for got, orig in zip(want, own, strict=True):
            if got.dtype.kind == "f":
                np.testing.assert_array_equal(got, orig * float(i + 1), strict=True)
            else:
                np.testing.assert_array_equal(got, orig, strict=True)


def test_walks_stay_exact_while_another_thread_registers_classes(mutable: Any) -> None:
    xp = mutable
    trees = zoo(xp)
    expected = {name: [id(x) for x in fk.leaves(t)] for name, t in trees.items()}
    registering = THREADS - 1  # the last thread registers, the others walk

    def work(i: int) -> None:
        if i == registering:
            for k in range(ROUNDS * 4):  # each registration clears the dispatch caches
                cls = type(f"Fresh{k}", (), {})
                fk.register(cls, children=lambda o: ((), None), rebuild=lambda aux, ch, c=cls: c())
            return
        for _ in range(ROUNDS):
            for name, tree in trees.items():
                assert [id(x) for x in fk.leaves(tree)] == expected[name], name
                out = fk.fmap(lambda x: x, tree)
                assert [id(x) for x in fk.leaves(out)] == expected[name], name

    run_threads(work)


# ------------------------------------------------- registrations racing with every kind of walk
#: how long the walkers and registrars of the stress test run (seconds)
STRESS_SECONDS = float(os.environ.get("FK_STRESS_SECONDS", "3"))
WALKERS = 6
REGISTRARS = 2


def test_walks_never_see_the_table_mid_change(mutable: Any) -> None:
    """Six threads loop over fmap, destructure, re(p), re.flatten and leaves on one model holding
    a registered class while two threads register new dataclasses and leaf types (thousands of
    registrations, every one clearing the dispatch caches): every walk gives the exact serial
    answer and none raises (the lock-free lookups read one consistent table). The duration is
    bounded (``FK_STRESS_SECONDS``, default 3 s)."""
    import dataclasses
    import importlib.util
    import time

    if importlib.util.find_spec("optree") is not None:
        # the optree bridge reads optree's registry when a type is first met, while torch mirrors every
        # class registered with it (functorkit exports its registered dataclasses) into that registry
        import optree  # noqa: F401

        if "torch" in mutable.__name__:
            import torch.utils._cxx_pytree  # noqa: F401 -- the module that mirrors torch's registrations

    xp = mutable
    rng = np.random.default_rng(0)

    def arr(*shape: int) -> Any:
        return xp.asarray(rng.standard_normal(shape), dtype=xp.float64)

    shared = arr(3)
    tree = {
        "pair": Pair(arr(2), [arr(2, 2), 1.5]),
        "layers": [Layer(arr(2), arr(1)), Layer(shared, arr(1))],
        "t": (shared, "s", None),
    }
    want_leaves = [id(x) for x in fk.leaves(tree)]
    flat, re = fk.destructure(tree)
    want_flat = to_numpy(flat)
    want_fmap = numpy_leaves(fk.fmap(lambda x: x * 2 if hasattr(x, "shape") else x, tree))
    stop = threading.Event()
    counts = [0] * (WALKERS + REGISTRARS)

    def walk(i: int) -> None:
        while not stop.is_set():
            assert [id(x) for x in fk.leaves(tree)] == want_leaves
            out = fk.fmap(lambda x: x * 2 if hasattr(x, "shape") else x, tree)
            assert_exact(out, want_fmap)
            assert type(out["pair"]) is Pair
            assert out["t"][0] is out["layers"][1].weight
            f, r = fk.destructure(tree)
            np.testing.assert_array_equal(to_numpy(f), want_flat, strict=True)
            back = re(flat)
            np.testing.assert_array_equal(to_numpy(re.flatten(back)), want_flat, strict=True)
            np.testing.assert_array_equal(to_numpy(r.flatten(tree)), want_flat, strict=True)
            counts[i] += 1

    def register(i: int) -> None:
        k = 0
        while not stop.is_set():
            name = f"Stress{i}_{k}"
            if k % 2:
                fk.register_leaf(type(name, (), {}))
            else:
                fk.register_dataclass(dataclasses.make_dataclass(name, [("a", Any)]))
            k += 1
            counts[i] += 1

    def work(i: int) -> None:
        try:
            if i < WALKERS:
                walk(i)
            else:
                register(i)
        finally:
            stop.set()  # the first failure ends every thread

    barrier = threading.Barrier(WALKERS + REGISTRARS)
    errors: list[BaseException] = []

    def target(i: int) -> None:
        try:
            barrier.wait(timeout=60)
            work(i)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)

    def collected(phase: str, info: dict[str, int]) -> None:
        """Python code run at every garbage collection: a C-level loop that allocates (``list(d.items())``)
        can then hand the interpreter to another thread midway, as finalizers do in a large program."""

    old = sys.getswitchinterval()
    old_gc = gc.get_threshold()
    sys.setswitchinterval(1e-5)
    gc.set_threshold(100)
    gc.callbacks.append(collected)
    threads = [threading.Thread(target=target, args=(i,)) for i in range(WALKERS + REGISTRARS)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + STRESS_SECONDS
        while time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(timeout=120)
    finally:
        sys.setswitchinterval(old)
        gc.set_threshold(*old_gc)
        gc.callbacks.remove(collected)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise AssertionError(f"{len(errors)} thread(s) failed") from errors[0]
    assert min(counts[:WALKERS]) > 0, counts
    assert sum(counts[WALKERS:]) > 100, counts
