"""functorkit on a GPU: the torch-CUDA and CuPy cases, as one command.

    python conformance/gpu_check.py                 # on a machine with an NVIDIA GPU
    python conformance/gpu_check.py --cpu-standin   # the same torch cases, CPU as the "GPU"

Prints a pass/fail table and exits non-zero if any case fails. Cases whose
library or device is missing print SKIP (without CUDA and CuPy every row is a
SKIP and the exit status is 0). It takes seconds; the budget is 5 minutes.

``--cpu-standin`` exercises this script's own logic on a machine without a
GPU: the torch cases run with the CPU as the device that computes values, and
with torch's ``meta`` device as the second device wherever only placement
matters (a meta tensor has a device but no values). Cases that would read
values from the second device are SKIPs there.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import functorkit as fk
except ImportError:  # run from a checkout: the package is the parent directory's
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import functorkit as fk


class Skip(Exception):
    """A case that cannot run here (library or device missing)."""


class CheckFailed(AssertionError):
    """A check of a case failed."""


def check(condition: Any, message: Any = "check failed") -> None:
    """Like ``assert``, but also under ``python -O``."""
    if not condition:
        raise CheckFailed(str(message))


@dataclass
class Row:
    group: str
    case: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    seconds: float


@dataclass
class Devices:
    """Where the torch cases run.

    ``value``: the device that computes (CUDA, or the CPU as a stand-in);
    ``other``: a device that is not the CPU, for placement (CUDA, or ``meta``);
    ``readable``: whether ``other`` holds values (False for ``meta``).
    """

    torch: Any
    value: Any
    other: Any
    readable: bool
    real_cuda: bool


# --------------------------------------------------------------------------- helpers


def _net(torch: Any, device: Any = "cpu", seed: int = 0) -> Any:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))
    return net.to(device)


def _expect_raises(exc: type[BaseException], fn: Callable[[], Any], *needles: str) -> str:
    caught: BaseException | None = None
    try:
        fn()
    except exc as e:
        caught = e
    check(caught is not None, f"expected {exc.__name__}, nothing was raised")
    msg = str(caught)
    missing = [n for n in needles if n not in msg]
    check(not missing, f"{type(caught).__name__} raised but its message lacks {missing}: {msg}")
    return f"{type(caught).__name__} names {', '.join(needles)}"


def _devices_of(module: Any) -> list[str]:
    return [p.device.type for p in module.parameters()]


def _same_storage(a: Any, b: Any) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


# --------------------------------------------------------------------------- torch cases


def policy_p_on_other_into_cpu_model(d: Devices) -> str:
    """A p on the other device into a CPU model: strict raises, model moves to the CPU, flat stays on p's."""
    torch = d.torch
    net = _net(torch)
    _, re = fk.destructure(net)
    p = torch.randn(len(re)).to(d.other)
    other = str(torch.device(d.other))
    out = [_expect_raises(fk.PolicyError, lambda: re(p), "[0].weight", "cpu", other, "policy='model'", "policy='flat'")]
    flat_out = re(p, policy="flat")
    check(set(_devices_of(flat_out)) == {p.device.type}, _devices_of(flat_out))
    if d.readable:
        check(_same_storage(flat_out[0].weight, p), "flat: expected views of p")
        model_out = re(p, policy="model")
        check(_devices_of(model_out) == ["cpu"] * 4, _devices_of(model_out))
        torch.testing.assert_close(model_out[2].bias, p[-2:].cpu())
        out.append("model -> cpu, flat -> p's device (views)")
    else:
        out.append("flat -> p's device; model: SKIP (meta p holds no values to move)")
    return "; ".join(out)


def policy_cpu_p_into_model_on_other(d: Devices) -> str:
    """A CPU p into a model on the other device ("and back"): strict raises, model moves there, flat stays on CPU."""
    torch = d.torch
    net = _net(torch, d.other)
    _, re = fk.destructure(net)
    p = torch.randn(len(re))
    other = str(torch.device(d.other))
    msg = _expect_raises(fk.PolicyError, lambda: re(p), "[0].weight", "cpu", other)
    model_out = re(p, policy="model")
    check(set(_devices_of(model_out)) == {torch.device(d.other).type}, _devices_of(model_out))
    if d.readable:
        torch.testing.assert_close(model_out[2].bias.cpu(), p[-2:])
    flat_out = re(p, policy="flat")
    check(_devices_of(flat_out) == ["cpu"] * 4)
    check(_same_storage(flat_out[0].weight, p), "flat: expected views of p")
    return f"{msg}; model -> {other}, flat -> cpu (views)"


def policy_mixed_model(d: Devices) -> str:
    """A model on two devices: strict destructure raises; model/flat put each parameter where the policy says."""
    torch = d.torch
    net = _net(torch)
    net[0].to(d.other)  # first parameter on the other device: the flat vector goes there
    other = str(torch.device(d.other))
    msg = _expect_raises(fk.PolicyError, lambda: fk.destructure(net), "[0].weight and [2].weight", "cpu", other)
    if torch.device(d.other).type == "meta":  # the CPU stand-in: a flat vector there would lose the cpu values
        lost = _expect_raises(
            fk.PolicyError, lambda: fk.destructure(net, policy="model"), "[2].weight", "holds values on cpu"
        )
        return f"{msg}; model on meta first: {lost}"
    flat, re = fk.destructure(net, policy="model")
    check(flat.device == torch.device(d.other), flat.device)
    p = torch.randn(len(re))
    back = re(p)
    want = [torch.device(d.other).type] * 2 + ["cpu"] * 2
    check(_devices_of(back) == want, _devices_of(back))
    check(_same_storage(back[2].weight, p), "model: a parameter already on p's device should be a view")
    check(_devices_of(re(p, policy="flat")) == ["cpu"] * 4)
    return f"{msg}; model -> each leaf's device, flat -> p's device"


def walks_keep_the_device(d: Devices) -> str:
    """fmap, destructure, re(p) and arithmetic on the other device keep it (nothing moves to the host)."""
    torch = d.torch
    dev = torch.device(d.other)
    net = _net(torch, d.other)
    results = {
        "fmap": fk.fmap(lambda t: t * 2, net),
        "re": fk.destructure(net)[1](fk.destructure(net)[0]),
        "add": fk.add(net, net),
        "lincomb": fk.lincomb([0.5, 0.5], [net, net]),
        "copy": fk.copy(net),
    }
    for name, m in results.items():
        devs = {t.device for t in m.state_dict().values()}
        check(devs == {dev}, f"{name}: {devs}")
    flat, _ = fk.destructure(net)
    check(flat.device == dev)
    return f"fmap, re, add, lincomb, copy stay on {dev}"


def views_on_device(d: Devices) -> str:
    """re(p) returns views sharing p's storage, on the device."""
    torch = d.torch
    net = _net(torch, d.value)
    flat, re = fk.destructure(net)
    out = re(flat)
    for name, t in out.named_parameters():
        check(t.device == flat.device, name)
        check(_same_storage(t, flat), f"{name} is not a view of p")
    with torch.no_grad():
        flat[0] = 123.0
    check(float(out[0].weight[0, 0]) == 123.0)
    check(re(flat, copy=True)[0].weight.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr())
    return f"every parameter a view of p on {flat.device}; copy=True copies"


def autograd_on_device(d: Devices) -> str:
    """Gradients w.r.t. a p on the device equal torch.func.functional_call's."""
    torch = d.torch
    net = _net(torch, d.value).double()
    x = torch.randn(6, 3, dtype=torch.float64, device=d.value)
    flat, re = fk.destructure(net)
    p = flat.clone().requires_grad_(True)
    re(p)(x).pow(2).sum().backward()
    check(p.grad is not None)
    check(p.grad.device == flat.device)
    names = [n for n, _ in net.named_parameters()]
    vals = {n: t.detach().clone().requires_grad_(True) for n, t in net.named_parameters()}
    loss = torch.func.functional_call(net, vals, (x,)).pow(2).sum()
    want = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, [vals[n] for n in names])])
    torch.testing.assert_close(p.grad, want, rtol=1e-12, atol=1e-12)
    g = torch.func.grad(lambda q: re(q)(x).pow(2).sum())(flat)
    torch.testing.assert_close(g, want, rtol=1e-12, atol=1e-12)
    return f"backward and torch.func.grad on {flat.device} match functional_call"


def load_into_across_devices(d: Devices) -> str:
    """load_into keeps dst's device (and its nn.Parameter objects) whatever src's."""
    torch = d.torch
    dst = _net(torch, d.other, seed=0)
    src = _net(torch, "cpu", seed=1)
    params = [id(t) for t in dst.parameters()]
    if not d.readable:
        # a device without storage (meta) cannot hold the values: load_into refuses, naming the path
        try:
            fk.load_into(dst, src)
        except ValueError as e:
            check("[0].weight" in str(e))
            return "cpu src into meta dst: refused (meta holds no values); meta src into cpu dst: SKIP"
        check(False)
    fk.load_into(dst, src)
    check([id(t) for t in dst.parameters()] == params)
    check(set(_devices_of(dst)) == {torch.device(d.other).type})
    out = [f"cpu src into {torch.device(d.other)} dst: stays on {torch.device(d.other)}"]
    if d.readable:
        torch.testing.assert_close(dst[0].weight.cpu(), src[0].weight.detach())
        back = _net(torch, "cpu", seed=2)
        fk.load_into(back, dst)
        check(_devices_of(back) == ["cpu"] * 4)
        torch.testing.assert_close(back[2].bias, dst[2].bias.detach().cpu())
        out.append(f"{torch.device(d.other)} src into cpu dst: stays on cpu")
    else:
        out.append("meta src into cpu dst: SKIP (meta holds no values)")
    return "; ".join(out)


def norm_is_a_device_scalar(d: Devices) -> str:
    """fk.norm and fk.dot return 0-d tensors on the parameters' device."""
    torch = d.torch
    out = []
    for dev in dict.fromkeys([torch.device(d.value), torch.device(d.other)]):
        net = _net(torch, dev)
        n = fk.norm(net)
        check(n.ndim == 0, n.shape)
        check(n.device == dev, n.device)
        check(fk.dot(net, net).device == dev)
        if dev.type != "meta":
            want = torch.cat([t.detach().reshape(-1) for t in net.parameters()]).norm()
            torch.testing.assert_close(n.detach(), want)
        out.append(str(dev))
    return "0-d on " + ", ".join(out)


def no_host_sync(d: Devices) -> str:
    """On CUDA: norm, dot, destructure and re(p) run with torch's sync debug mode set to error."""
    torch = d.torch
    if not d.real_cuda:
        raise Skip("needs CUDA (torch.cuda.set_sync_debug_mode)")
    net = _net(torch, d.value)
    flat, re = fk.destructure(net)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fk.norm(net)
        fk.dot(net, net)
        re(flat)
        fk.lincomb([0.5, 0.5], [net, net])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "norm, dot, re(p), lincomb: no synchronising call"


def strict_mixed_destructure_raises(d: Devices) -> str:
    """Strict destructure of a model with CPU and device parameters raises, naming both paths and devices."""
    torch = d.torch
    model = {"a": torch.zeros(2), "b": torch.zeros(3, device=d.other)}
    return _expect_raises(fk.PolicyError, lambda: fk.destructure(model), "a and b", "cpu", str(torch.device(d.other)))


def alias_on_device(d: Devices) -> str:
    """A tensor and its transpose on the device are refused (StructureError naming both); interleaved views pass."""
    torch = d.torch
    t = torch.randn(3, 2, device=d.value)
    msg = _expect_raises(fk.StructureError, lambda: fk.destructure({"w": t, "wt": t.t()}), "w and wt", "fk.Transpose")
    _expect_raises(fk.StructureError, lambda: fk.load_into({"w": t, "wt": t.t()}, {"w": t * 0, "wt": t.t() * 0}), "w")
    base = torch.arange(8.0, device=d.value)
    flat, _ = fk.destructure({"even": base[::2], "odd": base[1::2]})
    torch.testing.assert_close(flat.cpu(), torch.tensor([0.0, 2, 4, 6, 1, 3, 5, 7]))
    return f"{msg}; a[::2] and a[1::2] pass"


TORCH_CASES: list[tuple[str, Callable[[Devices], str]]] = [
    ("policy: p on the device into a CPU model", policy_p_on_other_into_cpu_model),
    ("policy: CPU p into a model on the device", policy_cpu_p_into_model_on_other),
    ("policy: model on two devices", policy_mixed_model),
    ("strict destructure of a cpu/device model raises", strict_mixed_destructure_raises),
    ("walks keep the device", walks_keep_the_device),
    ("re(p): views of p on the device", views_on_device),
    ("autograd on the device", autograd_on_device),
    ("load_into across devices keeps dst's device", load_into_across_devices),
    ("norm/dot: 0-d tensors on the device", norm_is_a_device_scalar),
    ("no host synchronisation", no_host_sync),
    ("alias detection on the device", alias_on_device),
]


# --------------------------------------------------------------------------- CuPy cases


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as e:
        raise Skip("CuPy is not installed") from e
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, no device
        raise Skip(f"CuPy sees no GPU ({type(e).__name__})") from e
    if count < 1:
        raise Skip("CuPy sees no GPU")
    return cupy


def cupy_views(_: Any) -> str:
    cp = _cupy()
    model = {"w": cp.arange(6.0).reshape(2, 3), "b": cp.ones(3), "steps": cp.asarray([3])}
    flat, re = fk.destructure(model)
    check(isinstance(flat, cp.ndarray))
    check(flat.device == model["w"].device)
    out = re(flat)
    for k in ("w", "b"):
        check(isinstance(out[k], cp.ndarray))
        check(cp.shares_memory(out[k], flat), f"{k} is not a view of p")
    check(out["steps"] is model["steps"])
    cp.testing.assert_array_equal(out["w"], model["w"])
    check(not cp.shares_memory(re(flat, copy=True)["w"], flat))
    return f"views of p on {flat.device} (cupy.shares_memory); copy=True copies"


def cupy_alias(_: Any) -> str:
    cp = _cupy()
    a = cp.arange(6.0).reshape(3, 2)
    msg = _expect_raises(fk.StructureError, lambda: fk.destructure({"a": a, "at": a.T}), "a and at", "fk.Transpose")
    _expect_raises(fk.StructureError, lambda: fk.load_into({"a": a, "at": a.T}, {"a": a * 0, "at": a.T * 0}), "a")
    base = cp.arange(8.0)
    fk.destructure({"even": base[::2], "odd": base[1::2]})
    flat, re = fk.destructure({"a": a, "at": fk.Transpose(a)})
    check(len(re) == 6)
    tied = re(flat)
    check(tied["at"].parent is tied["a"], "fk.Transpose(a) did not come back tied")
    return f"{msg}; interleaved views pass; fk.Transpose(a) is one parameter"


def cupy_diagonal(_: Any) -> str:
    cp = _cupy()
    d = cp.asarray([1.0, 2.0, 3.0])
    x = cp.arange(6.0).reshape(3, 2)
    got = fk.Diagonal(d) @ x
    check(isinstance(got, cp.ndarray))
    cp.testing.assert_array_equal(got, d[:, None] * x)
    cp.testing.assert_array_equal(x.T @ fk.Diagonal(d), (d[:, None] * x).T)
    flat, re = fk.destructure({"D": fk.Diagonal(d)})
    check(len(re) == 3)
    cp.testing.assert_array_equal(re(flat * 2)["D"].dense(), cp.diag(2 * d))
    return "Diagonal @ x == d[:, None] * x, on the device; 3 parameters, not 9"


def cupy_norm(_: Any) -> str:
    cp = _cupy()
    model = {"w": cp.asarray([3.0, 4.0])}
    n = fk.norm(model)
    check(isinstance(n, cp.ndarray))
    check(n.ndim == 0)
    check(float(n) == 5.0)
    return f"0-d CuPy array on {n.device}"


CUPY_CASES: list[tuple[str, Callable[[Any], str]]] = [
    ("destructure/re: views (cupy.shares_memory)", cupy_views),
    ("alias detection: a and a.T", cupy_alias),
    ("Diagonal @ x", cupy_diagonal),
    ("norm: a 0-d device array", cupy_norm),
]


# --------------------------------------------------------------------------- running


def _torch_devices(standin: bool) -> Devices:
    try:
        import torch
    except ImportError as e:
        raise Skip("torch is not installed") from e
    if standin:
        return Devices(torch, value=torch.device("cpu"), other=torch.device("meta"), readable=False, real_cuda=False)
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA device (use --cpu-standin to exercise the cases on the CPU)")
    cuda = torch.device("cuda", torch.cuda.current_device())
    return Devices(torch, value=cuda, other=cuda, readable=True, real_cuda=True)


def _run_case(group: str, name: str, fn: Callable[[Any], str], arg: Any) -> Row:
    t0 = time.perf_counter()
    try:
        detail = fn(arg)
        status = "PASS"
    except Skip as e:
        status, detail = "SKIP", str(e)
    except Exception as e:  # noqa: BLE001 - every failure becomes a FAIL row
        status = "FAIL"
        detail = f"{type(e).__name__}: {e}".splitlines()[0]
        tb = traceback.extract_tb(e.__traceback__)
        if tb:
            detail += f" ({Path(tb[-1].filename).name}:{tb[-1].lineno})"
    return Row(group, name, status, detail, time.perf_counter() - t0)


def run(*, cpu_standin: bool = False) -> list[Row]:
    """Run every case; return the rows of the table."""
    rows: list[Row] = []
    try:
        devices: Any = _torch_devices(cpu_standin)
        group = "torch (cpu standin, meta)" if cpu_standin else f"torch {devices.value}"
    except Skip as e:
        devices, group = e, "torch"
    for name, fn in TORCH_CASES:
        if isinstance(devices, Skip):
            rows.append(Row(group, name, "SKIP", str(devices), 0.0))
        else:
            rows.append(_run_case(group, name, fn, devices))
    for name, cfn in CUPY_CASES:
        if cpu_standin:
            rows.append(Row("cupy", name, "SKIP", "CuPy has no CPU stand-in", 0.0))
        else:
            rows.append(_run_case("cupy", name, cfn, None))
    return rows


def format_table(rows: list[Row]) -> str:
    head = ("group", "case", "result", "time", "detail")
    table = [head] + [(r.group, r.case, r.status, f"{r.seconds:.2f}s", r.detail) for r in rows]
    widths = [max(len(row[j]) for row in table) for j in range(4)]
    lines = []
    for i, row in enumerate(table):
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)), row[4]]).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  ------")
    counts = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    lines.append(f"{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--cpu-standin",
        action="store_true",
        help="run the torch cases with the CPU as the device and meta as the second device (no GPU needed)",
    )
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    rows = run(cpu_standin=args.cpu_standin)
    print(format_table(rows))
    print(f"functorkit {fk.__version__}; {time.perf_counter() - t0:.1f} s")
    return 1 if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
