"""The reductions on modules under torch.compile(fullgraph=True) from the first call (issue 24):
``fk.norm``, ``fk.dot``, ``fk.normalize`` and ``fk.all_finite`` of an ``nn.Module`` met for the
first time inside the compiled function, in a fresh interpreter, with and without JAX imported
(JAX's pytree registry is C++, which Dynamo cannot call; the test session may have JAX imported
already, so each case runs in its own interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = """
import sys
import torch
if {jax_first}:
    import jax  # imported before functorkit
import functorkit as fk
if {jax_after}:
    import jax  # imported after functorkit: its exports are pending when the trace starts

def check(name, fn, *args):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    assert explanation.graph_break_count == 0, (name, explanation.break_reasons)
    got = torch.compile(fn, fullgraph=True, backend="eager")(*args)
    want = fn(*args)
    if isinstance(want, torch.Tensor):
        torch.testing.assert_close(got, want)
    else:
        assert fk.allclose(got, want), name
    return got

torch.manual_seed(0)
# a fresh module class per check: each is first met inside the traced function
check("norm", lambda n: fk.norm(n), torch.nn.Linear(3, 4))
check("dot", lambda n: fk.dot(n, n), torch.nn.Bilinear(2, 3, 4))
check("normalize", lambda n: fk.normalize(n), torch.nn.Conv1d(2, 3, 2))
assert bool(check("all_finite", lambda n: fk.all_finite(n), torch.nn.LayerNorm(5)))
net = torch.nn.Sequential(torch.nn.Linear(2, 2))
with torch.no_grad():
    net[0].bias[0] = float("nan")
assert not bool(check("all_finite nan", lambda n: fk.all_finite(n), net))
print("ok", "jax" in sys.modules)
"""


@pytest.mark.parametrize("jax", ["none", "before", "after"])
def test_reductions_on_modules_trace_from_the_first_call(jax: str) -> None:
    pytest.importorskip("torch")
    if jax != "none":
        pytest.importorskip("jax")
    script = _SCRIPT.format(jax_first=jax == "before", jax_after=jax == "after")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip() == f"ok {jax != 'none'}", r.stdout[-2000:]
