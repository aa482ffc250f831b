"""Model arithmetic: fk.lincomb, fk.dot and fk.norm on GPT-2-small-shaped models.

Workload: three models with the 148 arrays of GPT-2 small (token and position
embeddings, 12 blocks of layer norms, attention and MLP weights and biases,
final layer norm: 124.4 M float32 values, 498 MB each), as nested dicts, once
as NumPy arrays and once as torch CPU tensors (sharing the NumPy memory).

Contenders, per backend, all interleaved in one process (best of N rounds,
garbage collector off):

- ``fk``: ``fk.lincomb([0.5, -0.25, 2.0], [m1, m2, m3])``, ``fk.dot(m1, m2)``,
  ``fk.norm(m1)``;
- ``hand loop``: what a user writes over the lists of leaves:
  ``[c1*a + c2*b + c3*c for a, b, c in zip(...)]``, ``sum((a*b).sum())``,
  ``sqrt(sum((a*a).sum()))``: the reference of the ratios;
- ``hand loop, BLAS``: the same with the best single calls (``vdot``,
  per-leaf ``vector_norm``);
- ``torch._foreach``: ``_foreach_mul`` then ``_foreach_add_(alpha=c)``, and
  ``_foreach_norm`` (torch only);
- ``optree.tree_map`` with the hand loop's expression (if optree is installed).

The floor is the memory traffic: the bytes every contender must move (read
three models and write one for ``lincomb``; read two for ``dot``, one for
``norm``) divided by this machine's copy bandwidth, measured with
``numpy.copyto`` into memory already touched, in the same interleaved rounds
as each operation's contenders. ``loss-landscapes`` (the peer
with whole-model arithmetic) is not installed here, so it is not timed; its
``ModelWrapper`` arithmetic copies every layer through Python loops.
"""

from __future__ import annotations

import contextlib
import gc
import math
import operator
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import switched_off

import functorkit as fk
from functorkit import _inplace, _lockstep

COEFS = (0.5, -0.25, 2.0)
T_EMA = 0.001
#: calls per timing of the small-model rows, and timings (rounds) per row: many short timings, so
#: that the best of them is one the scheduler did not interrupt on a shared machine
SMALL_CALLS = 20
SMALL_ROUNDS = 40


def gpt2_shapes(d: int = 768, vocab: int = 50257, ctx: int = 1024, layers: int = 12) -> dict[str, Any]:
    """GPT-2 small's parameter shapes as a nested dict (148 arrays)."""

    def ln() -> dict[str, tuple[int, ...]]:
        return {"weight": (d,), "bias": (d,)}

    def block() -> dict[str, Any]:
        return {
            "ln_1": ln(),
            "attn": {"c_attn": {"weight": (d, 3 * d), "bias": (3 * d,)}, "c_proj": {"weight": (d, d), "bias": (d,)}},
            "ln_2": ln(),
            "mlp": {"c_fc": {"weight": (d, 4 * d), "bias": (4 * d,)}, "c_proj": {"weight": (4 * d, d), "bias": (d,)}},
        }

    return {"wte": (vocab, d), "wpe": (ctx, d), "h": [block() for _ in range(layers)], "ln_f": ln()}


def make_models(quick: bool) -> tuple[list[Any], int]:
    shapes = gpt2_shapes(d=192, vocab=12_564, ctx=256) if quick else gpt2_shapes()
    rng = np.random.default_rng(0)
    models = [
        fk.fmap(lambda s: rng.standard_normal(s, dtype=np.float32), shapes, is_leaf=lambda x: type(x) is tuple)
        for _ in range(3)
    ]
    n = sum(x.size for x in fk.leaves(models[0]))
    return models, n


def copy_bandwidth(nbytes: int, rounds: int) -> float:
    """Bytes per second moved by numpy.copyto (one read + one write per byte), best of `rounds`."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def timed(contenders: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best time of each contender, interleaved round by round, in the listed order and then in the
    reverse one (so that no contender always follows the same one)."""
    best = dict.fromkeys(contenders, math.inf)
    gc_was = gc.isenabled()
    gc.disable()
    items = list(contenders.items())
    try:
        for r in range(rounds):
            for name, f in items if r % 2 == 0 else items[::-1]:
                t0 = time.perf_counter()
                out = f()
                dt = time.perf_counter() - t0
                del out
                best[name] = min(best[name], dt)
    finally:
        if gc_was:
            gc.enable()
    return best


def blocked_copy(dst: np.ndarray[Any, Any], src: np.ndarray[Any, Any]) -> None:
    """`src` copied into `dst` in blocks of `BLOCK_COPY` elements. glibc's ``memcpy`` writes
    copies above a size threshold (here between 160 and 192 MB) with non-temporal stores, which
    skip reading the destination into the cache first; ufuncs, torch's kernels and a copy of a
    smaller array write with regular stores, which read it first. This copy moves the same bytes
    with regular stores: the floor of any kernel that writes through the cache."""
    d, s = dst.reshape(-1), src.reshape(-1)
    for i in range(0, s.size, BLOCK_COPY):
        np.copyto(d[i : i + BLOCK_COPY], s[i : i + BLOCK_COPY])


def fresh_copy(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`a` copied into a new array (kept, so its memory is not handed to the next one)."""
    o = np.empty_like(a)
    np.copyto(o, a)
    return o


def numpy_contenders(ms: list[Any]) -> dict[str, dict[str, Callable[[], Any]]]:
    la, lb, lc = (fk.leaves(m) for m in ms)
    c1, c2, c3 = COEFS
    out: dict[str, dict[str, Callable[[], Any]]] = {
        "lincomb": {
            "fk": lambda: fk.lincomb(COEFS, ms),
            "hand loop": lambda: [c1 * a + c2 * b + c3 * c for a, b, c in zip(la, lb, lc, strict=True)],
        },
        "dot": {
            "fk": lambda: fk.dot(ms[0], ms[1]),
            "hand loop": lambda: sum((a * b).sum() for a, b in zip(la, lb, strict=True)),
            "hand loop, BLAS": lambda: sum(np.vdot(a, b) for a, b in zip(la, lb, strict=True)),
        },
        "norm": {
            "fk": lambda: fk.norm(ms[0]),
            "hand loop": lambda: math.sqrt(sum((a * a).sum() for a in la)),
            "hand loop, BLAS": lambda: math.sqrt(sum(np.vdot(a, a) for a in la)),
        },
    }
    dst = fk.copy(ms[0])
    ema = fk.copy(ms[0])
    le = fk.leaves(ema)
    out["lincomb"]["fk, out="] = lambda: fk.lincomb(COEFS, ms, out=dst)
    dl = fk.leaves(dst)
    # what a fresh result costs by itself: one model written into new memory (first-touch page
    # faults) against the same copy into memory already touched
    out["lincomb"]["copy of one model into new memory"] = lambda: [fresh_copy(a) for a in la]
    out["lincomb"]["copy of one model into touched memory"] = lambda: [
        np.copyto(d, a) for d, a in zip(dl, la, strict=True)
    ]
    out["ema step"] = {
        "fk, out=": lambda: fk.lerp(ema, ms[1], T_EMA, out=ema),
        "hand loop": lambda: [np.add(e, (m - e) * T_EMA, out=e) for e, m in zip(le, lb, strict=True)],
        "fk.load_into(fk.lerp)": lambda: fk.load_into(ema, fk.lerp(ema, ms[1], T_EMA)),
    }
    try:
        import optree
    except ImportError:
        return out
    out["lincomb"]["optree.tree_map"] = lambda: optree.tree_map(lambda a, b, c: c1 * a + c2 * b + c3 * c, *ms)
    return out


def torch_contenders(ms: list[Any]) -> dict[str, dict[str, Callable[[], Any]]]:
    import torch

    tms = [fk.fmap(torch.from_numpy, m) for m in ms]
    la, lb, lc = (fk.leaves(m) for m in tms)
    c1, c2, c3 = COEFS

    def foreach_lincomb() -> Any:
        acc = torch._foreach_mul(la, c1)
        torch._foreach_add_(acc, lb, alpha=c2)
        torch._foreach_add_(acc, lc, alpha=c3)
        return acc

    out: dict[str, dict[str, Callable[[], Any]]] = {
        "lincomb": {
            "fk": lambda: fk.lincomb(COEFS, tms),
            "hand loop": lambda: [c1 * a + c2 * b + c3 * c for a, b, c in zip(la, lb, lc, strict=True)],
            "torch._foreach": foreach_lincomb,
        },
        "dot": {
            "fk": lambda: fk.dot(tms[0], tms[1]),
            "hand loop": lambda: sum((a * b).sum() for a, b in zip(la, lb, strict=True)),
            "hand loop, BLAS": lambda: sum(
                torch.vdot(a.reshape(-1), b.reshape(-1)) for a, b in zip(la, lb, strict=True)
            ),
        },
        "norm": {
            "fk": lambda: fk.norm(tms[0]),
            "hand loop": lambda: torch.sqrt(sum((a * a).sum() for a in la)),
            "hand loop, BLAS": lambda: torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(a) for a in la])),
            "torch._foreach": lambda: torch.linalg.vector_norm(torch.stack(torch._foreach_norm(la, 2))),
        },
    }
    dst = fk.copy(tms[0])
    dl = fk.leaves(dst)

    def foreach_lincomb_out() -> Any:
        torch._foreach_copy_(dl, la)
        torch._foreach_mul_(dl, c1)
        torch._foreach_add_(dl, lb, alpha=c2)
        torch._foreach_add_(dl, lc, alpha=c3)
        return dl

    ema = fk.copy(tms[0])
    el = fk.leaves(ema)
    out["lincomb"]["fk, out="] = lambda: fk.lincomb(COEFS, tms, out=dst)
    out["lincomb"]["torch._foreach, into dst"] = foreach_lincomb_out
    out["ema step"] = {
        "fk, out=": lambda: fk.lerp(ema, tms[1], T_EMA, out=ema),
        "fk, out= (per-leaf path)": per_leaf(lambda: fk.lerp(ema, tms[1], T_EMA, out=ema)),
        "hand loop": lambda: [e.lerp_(m, T_EMA) for e, m in zip(el, lb, strict=True)],
        "torch._foreach": lambda: torch._foreach_lerp_(el, lb, T_EMA),
        "fk.load_into(fk.lerp)": lambda: fk.load_into(ema, fk.lerp(ema, tms[1], T_EMA)),
    }
    try:
        import optree
    except ImportError:
        return out
    out["lincomb"]["optree.tree_map"] = lambda: optree.tree_map(lambda a, b, c: c1 * a + c2 * b + c3 * c, *tms)
    return out


def per_leaf(f: Callable[[], Any]) -> Callable[[], Any]:
    """`f` with the column path of ``out=`` off (``functorkit._inplace.FAST``): the per-leaf path."""

    def g() -> Any:
        _inplace.FAST[0] = False
        try:
            return f()
        finally:
            _inplace.FAST[0] = True

    return g


def no_columns(f: Callable[[], Any]) -> Callable[[], Any]:
    """`f` with the lock-step column path off (``functorkit._lockstep.COLUMNS``): the per-leaf path."""

    def g() -> Any:
        _lockstep.COLUMNS[0] = False
        try:
            return f()
        finally:
            _lockstep.COLUMNS[0] = True

    return g


def _checked_ema(ema: list[Any], model: list[Any], t: float) -> None:
    """What a validating in-place EMA of two lists of tensors must do at least, written by hand
    with the fewest C-level passes: SPEC 14's checks on lists (no paths, trees, ties or views): the
    same length, types, shapes, dtypes and devices, floating dtypes, dense tensors in both, no
    inference tensor to write, contiguous tensors whose byte ranges do not meet (no overlap
    between what is written and what is read), then one ``torch._foreach_lerp_`` with autograd
    off (the floor of the checks `fk.lerp(..., out=)` makes, issue #22's MLP row)."""
    import torch

    if type(ema) is not list or type(model) is not list or len(ema) != len(model):
        raise ValueError("the models differ in structure")
    same = operator.eq
    both = [*ema, *model]
    if not (
        all(map(operator.is_, map(type, ema), map(type, model)))
        and all(map(torch.Tensor.is_same_size, ema, model))
        and all(map(same, map(_DTYPE, ema), map(_DTYPE, model)))
        and all(map(same, map(_DEVICE, ema), map(_DEVICE, model)))
    ):
        raise ValueError("the models' tensors differ")
    if not all(map(torch.Tensor.is_floating_point, ema)):
        raise TypeError("a tensor is not floating")
    if list(map(_LAYOUT, both)).count(torch.strided) != len(both) or any(map(_NESTED, both)):
        raise TypeError("a tensor is not dense")
    if any(map(torch.Tensor.is_inference, ema)):
        raise TypeError("an inference tensor cannot be written")
    if not all(map(torch.Tensor.is_contiguous, both)):
        raise ValueError("not contiguous: byte ranges are not enough")
    lo = list(map(torch.Tensor.data_ptr, both))
    hi = sorted(map(operator.add, lo, map(_NBYTES, both)))
    lo.sort()
    if not all(map(operator.le, hi[:-1], lo[1:])):
        raise ValueError("tensors share memory")
    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    try:
        torch._foreach_lerp_(ema, model, t)
    finally:
        torch._C._set_grad_enabled(prev)


_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")
_DEVICE, _LAYOUT = operator.attrgetter("device"), operator.attrgetter("layout")
_NESTED, _NBYTES = operator.attrgetter("is_nested"), operator.attrgetter("nbytes")


def small_contenders() -> dict[str, dict[str, Callable[[], Any]]]:
    """Per-call cost on small models: the 6-array MLP (NumPy and torch) and a 12-block torch
    ``nn.Module`` EMA step; each contender runs `SMALL_CALLS` times per timing."""
    rng = np.random.default_rng(1)
    shapes = [(64, 32), (64,), (64, 64), (64,), (10, 64), (10,)]
    mlps = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    c1, c2, c3 = COEFS
    out: dict[str, dict[str, Callable[[], Any]]] = {}

    def rep(f: Callable[[], Any]) -> Callable[[], Any]:
        def g() -> Any:
            for _ in range(SMALL_CALLS):
                f()

        return g

    from functorkit.adapters import numpy as nad

    npd = fk.copy(mlps[0])
    out["MLP lincomb, NumPy"] = {
        "fk": rep(lambda: fk.lincomb(COEFS, mlps)),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.lincomb(COEFS, mlps))),
        "fk, out=": rep(lambda: fk.lincomb(COEFS, mlps, out=npd)),
        "fk, out= (one adapter call per row)": switched_off(
            nad.Adapter, "arith_many_", lambda *a: False, rep(lambda: fk.lincomb(COEFS, mlps, out=npd))
        ),
        "fk, out= (repeated arrays removed before out_fast)": switched_off(
            nad.Adapter, "out_fast_repeats", False, rep(lambda: fk.lincomb(COEFS, mlps, out=npd))
        ),
        "fk, out= (per-leaf path)": per_leaf(rep(lambda: fk.lincomb(COEFS, mlps, out=npd))),
        "hand loop": rep(lambda: [c1 * a + c2 * b + c3 * c for a, b, c in zip(*mlps, strict=True)]),
    }
    out["MLP add, NumPy"] = {
        "fk": rep(lambda: fk.add(mlps[0], mlps[1])),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.add(mlps[0], mlps[1]))),
        "hand loop": rep(lambda: [a + b for a, b in zip(mlps[0], mlps[1], strict=True)]),
    }
    blocks = [
        {
            f"h{i}": {
                "attn": {"w": m[0] + i, "b": m[1] + i},
                "mlp": {"w": m[2] + i, "b": m[3] + i},
            }
            for i in range(12)
        }
        for m in mlps[:2]
    ]
    lbs = [fk.leaves(b) for b in blocks]
    out["12-block dict add, NumPy"] = {
        "fk": rep(lambda: fk.add(blocks[0], blocks[1])),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.add(blocks[0], blocks[1]))),
        "hand loop": rep(lambda: [a + b for a, b in zip(*lbs, strict=True)]),
    }
    out["MLP norm, NumPy"] = {
        "fk": rep(lambda: fk.norm(mlps[0])),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.norm(mlps[0]))),
        "hand loop": rep(lambda: math.sqrt(sum(float(np.vdot(a, a)) for a in mlps[0]))),
    }
    try:
        import torch
    except ImportError:
        return out
    from functorkit.adapters import _torch_module as tmod
    from functorkit.adapters import torch as tad

    tm = [[torch.from_numpy(x.copy()) for x in m] for m in mlps]
    td = fk.copy(tm[0])
    tema = fk.copy(tm[0])

    def foreach_lc() -> Any:
        acc = torch._foreach_mul(tm[0], c1)
        torch._foreach_add_(acc, tm[1], alpha=c2)
        torch._foreach_add_(acc, tm[2], alpha=c3)
        return acc

    out["MLP lincomb, torch"] = {
        "fk": rep(lambda: fk.lincomb(COEFS, tm)),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.lincomb(COEFS, tm))),
        "fk, out=": rep(lambda: fk.lincomb(COEFS, tm, out=td)),
        "fk, out= (row kernels, no _foreach)": switched_off(
            tad, "foreach_arith_", None, rep(lambda: fk.lincomb(COEFS, tm, out=td))
        ),
        "fk, out= (per-leaf path)": per_leaf(rep(lambda: fk.lincomb(COEFS, tm, out=td))),
        "hand loop": rep(lambda: [c1 * a + c2 * b + c3 * c for a, b, c in zip(*tm, strict=True)]),
        "torch._foreach": rep(foreach_lc),
    }
    out["MLP add, torch"] = {
        "fk": rep(lambda: fk.add(tm[0], tm[1])),
        "fk (lock-step per-leaf path)": no_columns(rep(lambda: fk.add(tm[0], tm[1]))),
        "hand loop": rep(lambda: [a + b for a, b in zip(tm[0], tm[1], strict=True)]),
        "torch._foreach": rep(lambda: torch._foreach_add(tm[0], tm[1])),
    }
    out["MLP EMA step, torch"] = {
        "fk, out=": rep(lambda: fk.lerp(tema, tm[1], T_EMA, out=tema)),
        "hand loop with every check, one _foreach_lerp_": rep(lambda: _checked_ema(tema, tm[1], T_EMA)),
        "fk, out= (torch.no_grad, not _set_grad_enabled)": switched_off(
            tad, "set_grad_enabled_", None, rep(lambda: fk.lerp(tema, tm[1], T_EMA, out=tema))
        ),
        "fk, out= (per-leaf path)": per_leaf(rep(lambda: fk.lerp(tema, tm[1], T_EMA, out=tema))),
        "walk only: fk.leaves of both": rep(lambda: (fk.leaves(tema), fk.leaves(tm[1]))),
        "hand loop": rep(lambda: [e.lerp_(m, T_EMA) for e, m in zip(tema, tm[1], strict=True)]),
        "torch._foreach": rep(lambda: torch._foreach_lerp_(tema, tm[1], T_EMA)),
    }
    tblocks = [fk.fmap(lambda x: torch.from_numpy(x.copy()), b) for b in blocks]
    tbe = fk.copy(tblocks[0])
    tlbe, tlbm = fk.leaves(tbe), fk.leaves(tblocks[1])
    out["12-block dict EMA step, torch"] = {
        "fk, out=": rep(lambda: fk.lerp(tbe, tblocks[1], T_EMA, out=tbe)),
        "hand loop with every check, one _foreach_lerp_": rep(lambda: _checked_ema(tlbe, tlbm, T_EMA)),
        "walk only: fk.leaves of both": rep(lambda: (fk.leaves(tbe), fk.leaves(tblocks[1]))),
        "hand loop": rep(lambda: [e.lerp_(m, T_EMA) for e, m in zip(tlbe, tlbm, strict=True)]),
        "torch._foreach": rep(lambda: torch._foreach_lerp_(tlbe, tlbm, T_EMA)),
    }
    torch.manual_seed(0)

    def block() -> Any:
        return torch.nn.Sequential(
            torch.nn.LayerNorm(64), torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)
        )

    net = torch.nn.Sequential(*[block() for _ in range(12)])
    ema_net = fk.copy(net)
    with torch.no_grad():
        pe, pm = list(ema_net.parameters()), list(net.parameters())

    def hand() -> None:
        with torch.no_grad():
            for e, m in zip(pe, pm, strict=True):
                e.lerp_(m, T_EMA)

    def foreach_ema() -> None:
        with torch.no_grad():
            torch._foreach_lerp_(pe, pm, T_EMA)

    def hand_walking() -> None:
        with torch.no_grad():
            for e, m in zip(ema_net.parameters(), net.parameters(), strict=True):
                e.lerp_(m, T_EMA)

    def foreach_walking() -> None:  # what timm's ModelEmaV3 and torch's swa_utils do each step
        with torch.no_grad():
            torch._foreach_lerp_(list(ema_net.parameters()), list(net.parameters()), T_EMA)

    out["12-block nn.Module EMA step"] = {
        "fk, out=": rep(lambda: fk.lerp(ema_net, net, T_EMA, out=ema_net)),
        "fk, out= (recorded and matched, no lock-step walk)": switched_off(
            tmod, "LOCKSTEP", False, rep(lambda: fk.lerp(ema_net, net, T_EMA, out=ema_net))
        ),
        "fk, out= (per-leaf path)": per_leaf(rep(lambda: fk.lerp(ema_net, net, T_EMA, out=ema_net))),
        "hand loop with every check, one _foreach_lerp_": rep(lambda: _checked_ema(pe, pm, T_EMA)),
        "hand loop with every check over list(parameters())": rep(
            lambda: _checked_ema(list(ema_net.parameters()), list(net.parameters()), T_EMA)
        ),
        "walk only: fk.leaves of both": rep(lambda: (fk.leaves(ema_net), fk.leaves(net))),
        "hand loop": rep(hand),
        "hand loop over ema.parameters(), model.parameters()": rep(hand_walking),
        "torch._foreach": rep(foreach_ema),
        "torch._foreach over list(parameters()) (timm, swa_utils)": rep(foreach_walking),
    }
    return out


#: the small-model rows that switch one fast path off: row -> (the row with it on, a note)
SWITCHED = {
    "fk (lock-step per-leaf path)": ("fk", ""),
    "fk, out= (one adapter call per row)": ("fk, out=", "NumPy `Adapter._rows` off"),
    "fk, out= (repeated arrays removed before out_fast)": ("fk, out=", "NumPy `Adapter.out_fast_repeats` off"),
    "fk, out= (row kernels, no _foreach)": ("fk, out=", "torch `foreach_arith_` off"),
    "fk, out= (torch.no_grad, not _set_grad_enabled)": ("fk, out=", "torch `set_grad_enabled_` off"),
    "fk, out= (per-leaf path)": ("fk, out=", "`_inplace.FAST` off"),
    "fk, out= (recorded and matched, no lock-step walk)": ("fk, out=", "torch `_torch_module.LOCKSTEP` off"),
}

#: the copy timed with each operation's contenders (the floor of its ratios)
FLOOR = "numpy.copyto (the floor)"
#: the same copy in blocks of `BLOCK_COPY` elements: regular stores (see `blocked_copy`)
FLOOR_RS = "numpy.copyto in blocks (regular stores)"
BLOCK_COPY = 1 << 17
# bytes each operation must move, in units of one model's size
TRAFFIC = {"lincomb": 4, "dot": 2, "norm": 1, "ema step": 3}


@contextlib.contextmanager
def single_threaded() -> Any:
    """One thread for NumPy's BLAS and torch: interleaved, their pools would fight over the cores."""
    with contextlib.ExitStack() as stack:
        try:
            from threadpoolctl import threadpool_limits

            stack.enter_context(threadpool_limits(1))
        except ImportError:
            pass
        try:
            import torch
        except ImportError:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(before)


def run(quick: bool) -> str:
    with single_threaded():
        return _run(quick)


def _run(quick: bool) -> str:
    rounds = 3 if quick else 7
    ms, n = make_models(quick)
    model_bytes = 4 * n
    bandwidth = copy_bandwidth(min(model_bytes, 256 << 20), rounds + 2)
    # the floor is timed again inside every operation's rounds (the machine may be shared: a
    # bandwidth measured once, at another moment, would move every ratio to the floor)
    csrc = np.ones(min(model_bytes, 256 << 20) // 4, dtype=np.float32)
    cdst = np.zeros_like(csrc)
    bandwidths: list[float] = []
    bandwidths_rs: list[float] = []
    backends: dict[str, dict[str, dict[str, Callable[[], Any]]]] = {"NumPy": numpy_contenders(ms)}
    with contextlib.suppress(ImportError):
        backends["torch (CPU)"] = torch_contenders(ms)
    rows = []
    ratios: dict[tuple[str, str], float] = {}
    foreach: list[str] = []
    targets: list[str] = []  # issue #22's rows: | row | measured | target |

    def target(row: str, value: float, limit: float) -> None:
        targets.append(f"| {row} | {value:.2f}x | {'<=' if value <= limit else '**>**'} {limit:.1f}x |")

    for backend, ops in backends.items():
        for op, contenders in ops.items():
            best = timed(
                {**contenders, FLOOR: lambda: np.copyto(cdst, csrc), FLOOR_RS: lambda: blocked_copy(cdst, csrc)},
                rounds,
            )
            bw = 2 * csrc.nbytes / best.pop(FLOOR)
            bw_rs = 2 * csrc.nbytes / best.pop(FLOOR_RS)
            bandwidths_rs.append(bw_rs)
            bandwidths.append(bw)
            ref = best["hand loop"]
            if "torch._foreach" in best:
                fe = best["torch._foreach"]
                mine = best.get("fk", best.get("fk, out="))
                foreach.append(f"{op}: {ref / fe:.1f}x faster than the hand loop, fk {mine / fe:.2f}x its time")
            floor = TRAFFIC[op] * model_bytes / bw
            # a kernel writing through the cache reads each destination line before writing it: one
            # more pass over `out` where it is not an input (`lincomb, out=`: read 3, read + write 1)
            floor_rs = (TRAFFIC[op] + 1) * model_bytes / bw
            for name, t in best.items():
                if name == ("fk" if "fk" in best else "fk, out="):
                    ratios[(backend, op)] = t / ref
                rows.append(
                    f"| {op} | {backend} | {'**fk**' if name == 'fk' else name} | {t * 1e3:.1f} | "
                    f"{t / ref:.2f} | {t / floor:.2f} |"
                )
            if op == "lincomb" and backend == "NumPy":
                target("lincomb of 3 models, NumPy, `fk` / traffic floor", best["fk"] / floor, 1.5)
                target("lincomb of 3 models, NumPy, `fk, out=` / traffic floor", best["fk, out="] / floor, 1.5)
                target(
                    "lincomb of 3 models, NumPy, `fk, out=` / traffic floor with regular stores",
                    best["fk, out="] / floor_rs,
                    1.5,
                )
            if op == "lincomb" and "torch._foreach" in best:
                target("lincomb of 3 models, torch, `fk` / `torch._foreach`", best["fk"] / best["torch._foreach"], 1.0)
                into = best["torch._foreach, into dst"]
                target(
                    "lincomb of 3 models, torch, `fk, out=` / `torch._foreach`, into dst", best["fk, out="] / into, 1
                )
                target("lincomb of 3 models, torch, `fk, out=` / traffic floor", best["fk, out="] / floor, 1.5)
                target(
                    "lincomb of 3 models, torch, `fk, out=` / traffic floor with regular stores",
                    best["fk, out="] / floor_rs,
                    1.5,
                )
            if op == "ema step" and "torch._foreach" in best:
                target(
                    "EMA step, torch, `fk, out=` / `torch._foreach_lerp_`",
                    best["fk, out="] / best["torch._foreach"],
                    1.0,
                )
    small_rows = []
    floors: list[str] = []
    switches: list[str] = []
    gains: dict[str, tuple[float, float]] = {}
    small_rounds = 5 if quick else SMALL_ROUNDS
    for op, contenders in small_contenders().items():
        best = timed(contenders, small_rounds)
        if "fk (lock-step per-leaf path)" in best:
            gains[op] = (best["fk"], best["fk (lock-step per-leaf path)"])
        ref = best["hand loop"]
        fe = best.get("torch._foreach")
        if "fk, out=" in best:
            target(f"{op}, `fk, out=` per call / hand loop", best["fk, out="] / ref, 1.5)
        checked = best.get("hand loop with every check, one _foreach_lerp_")
        if checked is not None:
            floors.append(
                f"{op}: the hand loop with every check {checked / ref:.2f}x the hand loop, "
                f"`fk, out=` {best['fk, out='] / checked:.2f}x the hand loop with every check"
            )
        walked = best.get("hand loop with every check over list(parameters())")
        if walked is not None:  # the floor of a call that walks the modules each time
            floors.append(
                f"{op}: the hand loop with every check over `list(parameters())` walked at each call "
                f"{walked / ref:.2f}x the hand loop, `fk, out=` {best['fk, out='] / walked:.2f}x it"
            )
        for name, (on, off) in SWITCHED.items():
            if name in best:
                switches.append(f"{op}: {name} {best[name] / best[on]:.2f}x" + (f" ({off})" if off else ""))
        for name, t in best.items():
            small_rows.append(
                f"| {op} | {'**' + name + '**' if name.startswith('fk') else name} | {t / SMALL_CALLS * 1e6:.1f} | "
                f"{t / ref:.2f} | {'' if fe is None else f'{t / fe:.2f}'} |"
            )
    small = "\n".join(small_rows)
    columns_gain = (
        "Off / on, this run: " + ", ".join(f"{op} {t_off / t_on:.2f}x" for op, (t_on, t_off) in gains.items()) + "."
    )
    table = "\n".join(rows)
    summary = ", ".join(f"{op} on {b}: {r:.2f}x" for (b, op), r in ratios.items())
    n_arrays = len(fk.leaves(ms[0]))
    return f"""## Model arithmetic: lincomb, dot, norm, EMA steps

Three GPT-2-small-shaped models ({n_arrays} float32 arrays, {n / 1e6:.1f} M values, {model_bytes / 1e6:.0f} MB
each; {"**quick**: a scaled-down GPT-2, " if quick else ""}nested dicts of NumPy arrays, and of torch CPU tensors
sharing that memory). `fk.lincomb([0.5, -0.25, 2.0], [m1, m2, m3])`, `fk.dot(m1, m2)`, `fk.norm(m1)`
against the loop a user writes over the lists of leaves (**ratio 1.00**), the same loop with the best
single calls (BLAS `vdot`, per-leaf `vector_norm`), `torch._foreach_*` and `optree.tree_map`. The
`/ traffic floor` column divides each time by the memory-traffic floor: the bytes the operation
must move (lincomb: read 3 models, write 1; dot: read 2; norm: read 1) at this machine's `numpy.copyto` bandwidth (of a
{min(model_bytes, 256 << 20) >> 20} MB array),
timed in the same interleaved rounds as each operation's contenders ({min(bandwidths) / 1e9:.1f} to
{max(bandwidths) / 1e9:.1f} GB/s over the operations; {bandwidth / 1e9:.1f} GB/s measured alone first: a
wide spread means a busy machine, and ratios within one operation's rows are then the numbers to read).
That copy is glibc's `memcpy`, which above a size threshold (here between 160 and 192 MB) writes with
non-temporal stores: they skip reading the destination into the cache before writing it. Every
ufunc, every torch CPU kernel and every copy of a smaller array writes with regular stores, which
read each destination line first: the same copy made in blocks of {BLOCK_COPY >> 10} Ki elements (`blocked_copy`,
timed in the same rounds) moves {min(bandwidths_rs) / 1e9:.1f} to {max(bandwidths_rs) / 1e9:.1f} GB/s by the same count
(with `GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0xffffffffffff` the 256 MB copy slows
to the blocked copy's speed: 12.9 GB/s against 25.3, measured in session 19). So a kernel that
writes into an array it does not read moves one pass more than the traffic counted here: the
target rows `with regular stores` divide by that traffic (lincomb into `out`: read 3 models,
read and write 1) at the same bandwidth. What is left above it on NumPy is work in the cache: each
block of a three-term lincomb goes through five ufuncs (three products, two sums: each operation
rounded once, as the functional form and the other backends round it), and the same ufuncs alone,
over one 160 MB block loop with nothing else, took 1.2-1.4x a 160 MB copy in session 19.
Best of {rounds} interleaved rounds, single-threaded (NumPy's BLAS through
`threadpoolctl`, `torch.set_num_threads(1)`): interleaved, the two libraries' thread pools fight over the
cores and the times stop meaning anything. `loss-landscapes` is not installed
here and is not timed.

fk time / hand loop time: {summary} (target: at most 1.5).

Issue #22's targets, from the rows below (this run):

| row | measured | target |
|---|---:|---:|
{chr(10).join(targets)}

| operation | backend | contender | best (ms) | / hand loop | / traffic floor |
|---|---|---|---:|---:|---:|
{table}

`ema step` is one exponential-moving-average update, `fk.lerp(ema, model, {T_EMA}, out=ema)` (traffic:
read two models, write one), against the hand loop of in-place updates (`e.lerp_(m, t)`; NumPy
`np.add(e, (m - e) * t, out=e)`), `torch._foreach_lerp_` and the only way before `out=` (a new model,
then `fk.load_into`). `fk, out=` rows write into a model allocated once (`fk.copy`); the functional rows
allocate their result on every call (first-touch page faults included; the two `copy of one model`
rows show what writing one model costs into new memory and into memory already touched: the page
faults of new memory are the difference between the functional `fk` row and `fk, out=`, and every
functional contender pays them). `fk, out=
(per-leaf path)` is the same call with `out=`'s column path off (`functorkit._inplace.FAST`): the column
path records each tree once (`out` not again when it is an input) and makes every check over whole
lists of arrays in C-level passes; the per-leaf path checks parameter by parameter (it is what runs
when the column path cannot decide, and it names the path of any failure).

On NumPy the kernels are ufuncs with `out=` over blocks of 128 Ki elements (`adapters/numpy.py`), so a
lincomb reads each input once and writes the result once, with no full-size temporary per term. On
torch, `fk.lincomb` and `fk.mean` accumulate into the result in place (`Tensor.add_(x, alpha=c)`), and
`out=` uses `lerp_`/`mul_`/`add_` on `out`'s own tensors under `torch.no_grad()`, and an in-place
`fk.lerp(ema, model, t, out=ema)` one `torch._foreach_lerp_` (feature-detected; `adapters/torch.py`);
`torch._foreach_*`
({"; ".join(foreach) or "not measured"}) is otherwise a private torch API functorkit does not call. `fk.dot` uses
`Tensor.vdot` on torch (BLAS; `linalg.vecdot` multiplies into a temporary first), and `fk.norm` sums
squares with `vecdot` on NumPy (NumPy's `vector_norm` squares into a temporary).

Small models, per call ({SMALL_CALLS} calls per timing, best of {small_rounds} interleaved rounds): the 6-array MLP
(64x32, 64x64, 10x64 and biases, float32) and an EMA step of a 12-block `nn.Module` (each block
LayerNorm(64), Linear(64, 128), GELU, Linear(128, 64): 48 parameters), a 12-block dict of the MLP's
first four arrays (48 arrays, NumPy and torch; its hand loop runs over their lists of leaves), against
the hand loop (`lerp_` under `no_grad` per parameter, over lists of the tensors made once) and
`torch._foreach_*`; for the module also the same two over `parameters()` walked at each call, as
timm's `ModelEmaV3` and torch's `swa_utils` do (no check at all). `hand loop with every
check` is the floor of what `out=` promises, written by hand over the two lists of tensors in the
fewest C-level passes (`_checked_ema`: the same types, shapes, dtypes and devices, floating and
dense tensors, no inference tensor to write, contiguous tensors whose byte ranges do not meet, then
one `torch._foreach_lerp_` with autograd off; no trees, paths, ties or views): each check is a pass
over every tensor at 40-60 ns per tensor read, about 18 reads per pair of tensors. This run:
{"; ".join(floors) or "not measured"}. Each fast path's row switched off against the row with it on:
{"; ".join(switches) or "not measured"}. `fk, out= (repeated arrays removed
before out_fast)` removes repeated arrays before NumPy's `out_fast` (`out_fast_repeats` off), which
with it on takes them as they come (its `base is None` test does not care). `walk only` is `fk.leaves` of both
models: the part of a call that is recording the trees (the walk itself; `out=` also records the
trainability of an `nn.Module`'s parameters, which `fk.leaves` does not). On two modules `out=`
walks both together (`_torch_module._lockstep`: their `__dict__` sections side by side, names
compared in C, no definition built; tests/test_module_lockstep.py fails when it is not taken);
`fk, out= (recorded and matched, no lock-step walk)` records the first module and matches the
second against its definition instead. `hand loop with every check over list(parameters())` is
the floor of a call that walks both modules at each step: `_checked_ema` over the two lists
`parameters()` gives. `fk (lock-step per-leaf
path)` is the same `fk.add` / `fk.norm` with the lock-step column path off
(`functorkit._lockstep.COLUMNS = [False]`): the column path (`_lockstep._columns`) records the first
model once, matches the others against its definition and compares all types, shapes, dtypes and
devices in C-level passes, where the per-leaf path checks each parameter in the walk's visitor
(tests/test_arith_columns.py fails when the column path is not taken). {columns_gain}

| row | contender | µs per call | / hand loop | / torch._foreach |
|---|---|---:|---:|---:|
{small}
"""


if __name__ == "__main__":
    import sys

    print(run("--quick" in sys.argv))
