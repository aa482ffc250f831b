"""Read conformance/cases.toml, build its models and p vectors, and run functorkit on one case.

The data file holds every expectation; this module only builds what a case describes and
reports what happened, normalised so that outcomes compare across backends:
``{path: (dtype, device role, namespace role, memory)}`` or an error class name.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from _backends import BACKENDS, Backend, dtype_name, host, shares_memory

HERE = Path(__file__).resolve().parent
CASES = HERE / "cases.toml"
POLICIES = ("strict", "model", "flat")
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int64")
ERRORS = ("PolicyError", "StructureError", "TypeError", "ValueError")


def load(path: Path = CASES) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


# ---- reading the data -------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    kind: str  # "array", "diagonal", "transpose"
    dtype: str
    shape: tuple[int, ...]
    second: bool
    other: bool


def parse_leaf(spec: str) -> Leaf:
    """``"float32 2x3 second"`` -> Leaf; ``"diagonal float32 3"`` -> a wrapper leaf."""
    words = spec.split()
    kind = "array"
    if words[0] in ("diagonal", "transpose"):
        kind = words.pop(0)
    dtype, shape = words[0], tuple(int(n) for n in words[1].split("x"))
    flags = set(words[2:])
    if dtype not in DTYPES or not flags <= {"second", "other"}:
        msg = f"bad leaf spec {spec!r}"
        raise ValueError(msg)
    return Leaf(kind, dtype, shape, "second" in flags, "other" in flags)


def per_path(value: Any, paths: list[str], default: str | None = None) -> dict[str, str | None]:
    """An outcome field (one string for every parameter, or a table path -> string) per path."""
    if value is None:
        return dict.fromkeys(paths, default)
    if isinstance(value, str):
        return dict.fromkeys(paths, value)
    return {p: value.get(p, default) for p in paths}


def case_needs(data: dict[str, Any], case: dict[str, Any]) -> set[str]:
    """The features a case needs on any policy: its structure's, its dtypes, its own `needs`."""
    st = data["structure"][case["structure"]]
    needs = set(st.get("needs", [])) | set(case.get("needs", []))
    for spec in st.get("leaves", {}).values():
        needs.add(parse_leaf(spec).dtype)
    if "dtype" in st:
        needs.add(st["dtype"])
    if case["p"].get("dtype", "flat") != "flat":
        needs.add(case["p"]["dtype"])
    return needs


def not_applicable(data: dict[str, Any], backend: str, case: dict[str, Any], policy: str | None) -> str | None:
    """The data's reason why a case does not apply to a backend (under a policy, if given), or None."""
    provides = set(data["backend"][backend]["provides"]) | {"float32", "float64", "int64"}
    needs = case_needs(data, case) | (set(case[policy].get("needs", [])) if policy else set())
    missing = sorted(needs - provides)
    if not missing:
        return None
    reasons = {**data["feature"], **data["backend"][backend].get("reasons", {})}
    return "n/a: " + "; ".join(dict.fromkeys(reasons.get(m, f"no {m}") for m in missing))


def _sharded_params(data: dict[str, Any], backend: str, st: dict[str, Any]) -> list[str]:
    """The parameter paths of a structure that are sharded on `backend` (its `refuses.sharded`
    rule: "every array", or "first axis divisible by N": split where the first axis divides)."""
    rule = data["backend"][backend]["refuses"]["sharded"]
    if rule == "every array" or st["kind"] == "torch_module":
        return list(st["params"])
    n = int(rule.rsplit(" ", 1)[-1])
    shapes: dict[str, tuple[int, ...]] = {}
    for k, spec in st.get("leaves", {}).items():
        leaf = parse_leaf(spec)
        shapes[{"diagonal": f"{k}.diag", "transpose": f"{k}.parent"}.get(leaf.kind, k)] = leaf.shape
    for k, (name, spec) in st.get("containers", {}).items():
        index = "[0]" if name in ("UserList", "deque") else ".x"
        shapes[f"{k}{index}"] = parse_leaf(spec).shape
    return [q for q in st["params"] if q in shapes and shapes[q] and shapes[q][0] % n == 0]


def refusal(data: dict[str, Any], backend: str, case: dict[str, Any], policy: str) -> dict[str, Any] | None:
    """On a backend whose `[backend.NAME.refuses]` says `destructure` refuses its sharded arrays
    (SPEC 17 allows it), the outcome that replaces the case's own under `policy`, or None: the
    refusal's error at `destructure` when a parameter is sharded, unless the case's own outcome is a
    StructureError at `destructure` (the definition's unknown-holder check comes first, SPEC 12)."""
    rule = data["backend"][backend].get("refuses")
    if rule is None:
        return None
    own = case[policy]
    if own.get("error") == "StructureError" and own.get("at") == "destructure":
        return None
    st = data["structure"][case["structure"]]
    if not _sharded_params(data, backend, st):
        return None
    return {"error": rule["error"], "at": rule["at"]}


# ---- building ----------------------------------------------------------------------------------


class Holder:
    """An object no registry knows, holding an array (the ``unknown_holder`` structure)."""

    def __init__(self, x: Any) -> None:
        self.x = x


def _container(name: str, x: Any) -> Any:
    """A standard container (a node by default, SPEC 12) holding `x` (the ``containers`` field)."""
    import collections
    import types

    if name == "SimpleNamespace":
        return types.SimpleNamespace(x=x)
    if name == "UserDict":
        return collections.UserDict(x=x)
    if name == "UserList":
        return collections.UserList([x])
    if name == "deque":
        return collections.deque([x], maxlen=3)
    if name == "MappingProxyType":
        return types.MappingProxyType({"x": x})
    if name == "attrs":
        return AttrsBox(x)
    if name == "attrs_frozen":
        return FrozenAttrsBox(x)
    msg = f"unknown container {name!r} in cases.toml"
    raise ValueError(msg)


def _attrs_classes() -> tuple[Any, Any]:
    import attrs

    @attrs.define
    class AttrsBox:
        """An attrs class (a node by default)."""

        x: Any
        tag: str = attrs.field(default="box", metadata={"static": True})

    @attrs.frozen
    class FrozenAttrsBox:
        """A frozen attrs class (a node by default, rebuilt without ``__init__``)."""

        x: Any

    return AttrsBox, FrozenAttrsBox


AttrsBox, FrozenAttrsBox = _attrs_classes()

#: the containers the ``containers`` field of a structure may name
CONTAINERS = ("SimpleNamespace", "UserDict", "UserList", "deque", "MappingProxyType", "attrs", "attrs_frozen")


class JaxPair:
    """The JAX-registered class of the ``jax_registered`` structure (registered with JAX only)."""

    def __init__(self, w: Any, b: Any) -> None:
        self.w, self.b = w, b


_JAX_REGISTERED = False


def _register_jax_pair() -> None:
    global _JAX_REGISTERED
    if _JAX_REGISTERED:
        return
    import jax

    keys = (jax.tree_util.GetAttrKey("w"), jax.tree_util.GetAttrKey("b"))
    jax.tree_util.register_pytree_with_keys(
        JaxPair,
        lambda o: (tuple(zip(keys, (o.w, o.b), strict=True)), None),
        lambda _, c: JaxPair(*c),
        flatten_func=lambda o: ((o.w, o.b), None),
    )
    _JAX_REGISTERED = True


def _leaf(be: Backend, leaf: Leaf, seed: int) -> Any:
    import functorkit as fk

    if leaf.other:
        x = be.other(leaf.shape, leaf.dtype, seed)
    else:
        x = be.array(leaf.shape, leaf.dtype, "second" if leaf.second else "default", seed)
    if leaf.kind == "diagonal":
        return fk.Diagonal(x)
    if leaf.kind == "transpose":
        return fk.Transpose(x)
    return x


def _torch_module(be: Backend, dtype: str) -> Any:
    import torch

    torch.manual_seed(0)
    device = be.array((1,), "float32").device
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    net[1].weight.requires_grad_(False)
    return be.wrap_module(net.to(dtype=getattr(torch, dtype), device=device))


def build_model(be: Backend, st: dict[str, Any]) -> Any:
    """The model a [structure] table describes, built with backend `be`."""
    kind = st["kind"]
    if kind == "torch_module":
        return _torch_module(be, st["dtype"])
    leaves = {k: _leaf(be, parse_leaf(v), i) for i, (k, v) in enumerate(st.get("leaves", {}).items())}
    if kind == "jax_registered":
        _register_jax_pair()
        return JaxPair(leaves["w"], leaves["b"])
    model: dict[str, Any] = dict(leaves)
    for i, (k, v) in enumerate(st.get("holder", {}).items()):
        model[k] = Holder(_leaf(be, parse_leaf(v), 10 + i))
    for i, (k, (name, v)) in enumerate(st.get("containers", {}).items()):
        model[k] = _container(name, _leaf(be, parse_leaf(v), 20 + i))
    for k, v in st.get("ties", {}).items():
        model[k] = model[v]
    model.update(st.get("extras", {}))
    return model


def build_p(be: Backend, spec: dict[str, Any], flat_dtype: str, n: int) -> Any:
    """The p a case describes: dtype ("flat": the flat vector's), device, namespace, length."""
    dtype = flat_dtype if spec.get("dtype", "flat") == "flat" else spec["dtype"]
    shape: tuple[int, ...] = (n + spec.get("length", 0),)
    if spec.get("rank", 1) == 2:
        shape = (1, shape[0])
    if spec.get("namespace", "backend") == "other":
        return be.other(shape, dtype, seed=7)
    return be.array(shape, dtype, spec.get("device", "default"), seed=7)


# ---- running -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one call did: an error (class name and where) or one row per parameter path."""

    error: str | None = None
    at: str | None = None
    leaves: dict[str, tuple[str, str, str, str]] | None = None  # path -> (dtype, device, namespace, memory)
    problems: tuple[str, ...] = ()  # invariants broken (constants, ties, types, p mutated)

    def text(self) -> str:
        if self.error is not None:
            return f"{self.error} ({self.at})"
        return describe_leaves(self.leaves or {})


def describe_leaves(leaves: dict[str, tuple[str, str, str, str]]) -> str:
    """``float32 · view`` when every parameter agrees, else one entry per path."""
    if not leaves:
        return "no parameters"

    def one(row: tuple[str, str, str, str]) -> str:
        dtype, device, ns, memory = row
        where = "" if device == "default" else f" on {device}"
        where += "" if ns == "backend" else " (other namespace)"
        return f"{dtype}{where} · {memory}" if memory != "-" else f"{dtype}{where}"

    rows = {one(r) for r in leaves.values()}
    if len(rows) == 1:
        return rows.pop()
    return ", ".join(f"{p}: {one(r)}" for p, r in leaves.items())


def expected(case: dict[str, Any], policy: str, paths: list[str], instead: dict[str, Any] | None = None) -> Outcome:
    """The outcome the data promises for `case` under `policy`, for the given parameter paths
    (`instead`: a backend's `refusal` that replaces it)."""
    o = case[policy] if instead is None else instead
    if "error" in o:
        return Outcome(error=o["error"], at=o.get("at", "re"))
    keys = paths
    dt = per_path(o["dtype"], keys)
    dev = per_path(o.get("device"), keys, "default")
    ns = per_path(o.get("namespace"), keys, "backend")
    mem = per_path(o["memory"], keys)
    return Outcome(leaves={k: (str(dt[k]), str(dev[k]), str(ns[k]), str(mem[k])) for k in keys})


def facts(be: Backend, x: Any, p: Any) -> tuple[str, str, str, str]:
    """(dtype, device role, namespace role, memory) of a result array `x` rebuilt from `p`."""
    shared = shares_memory(x, p)
    memory = "-" if shared is None else ("view" if shared else "copy")
    own = be.is_own(x)
    return dtype_name(x), be.role(x) if own else "default", "backend" if own else "other", memory


def _snapshot(x: Any) -> tuple[str, np.ndarray] | None:
    h = host(x)
    return None if h is None else (dtype_name(x), np.array(h, copy=True))


def _constants_ok(fk: Any, model: Any, new: Any, params: set[str]) -> list[str]:
    out = []
    for path, leaf in fk.leaves_with_path(model):
        if str(path) not in params and path.get(new) is not leaf:
            out.append(f"constant {path} is not the same object")
    return out


def _flat_problems(be: Backend, st: dict[str, Any], model: Any, flat: Any) -> list[str]:
    """SPEC 4 on the flat vector: its dtype and device, a new array, no autograd history."""
    import functorkit as fk

    out = []
    if "flat_vector" in st:
        dtype, *where = st["flat_vector"].split()
        got = (dtype_name(flat), be.role(flat))
        if got != (dtype, where[0] if where else "default"):
            out.append(f"flat vector is {got[0]} on {got[1]}, expected {st['flat_vector']}")
    if getattr(flat, "requires_grad", False):
        out.append("flat vector carries autograd history")
    leaves = fk.leaves(model) if st["kind"] != "jax_registered" else []
    if any(hasattr(x, "dtype") and shares_memory(flat, x) for x in leaves):
        out.append("flat vector shares memory with the model")
    return out


def _rebuilt_problems(fk: Any, st: dict[str, Any], model: Any, new: Any, paths: list[Any]) -> list[str]:
    """Constants are the same objects, ties kept, node types kept, module slots hold plain tensors."""
    params = {str(q) for q in paths}
    problems = _constants_ok(fk, model, new, params) if st["kind"] != "jax_registered" else []
    for k, v in st.get("ties", {}).items():
        if new[k] is not new[v]:
            problems.append(f"tie {k} = {v} lost")
    if isinstance(model, dict):
        wrapped = [k for k, v in st.get("leaves", {}).items() if parse_leaf(v).kind != "array"]
        problems += [f"{k}: {type(new[k]).__name__}" for k in wrapped if type(new[k]) is not type(model[k])]
        for k in st.get("containers", {}):
            if type(new[k]) is not type(model[k]):
                problems.append(f"{k}: {type(new[k]).__name__}, expected {type(model[k]).__name__}")
            elif getattr(new[k], "maxlen", None) != getattr(model[k], "maxlen", None):
                problems.append(f"{k}: maxlen {new[k].maxlen}, expected {model[k].maxlen}")
    elif type(new) is not type(model):
        problems.append(f"root: {type(new).__name__}, expected {type(model).__name__}")
    if st["kind"] == "torch_module":
        import torch

        problems += [
            f"{q}: a {type(q.get(new)).__name__} in a parameter slot"
            for q in paths
            if type(q.get(new)) is not torch.Tensor
        ]
    return problems


def _refusal_problems(data: dict[str, Any], be: Backend, case: dict[str, Any], e: Exception) -> tuple[str, ...]:
    """A refusal of sharded arrays (`[backend.NAME.refuses]`) must name the path of the first sharded
    parameter and the fix (SPEC 17: "a clear error"; SPEC 7)."""
    rule = data["backend"][be.name].get("refuses")
    if rule is None or type(e).__name__ != rule["error"]:
        return ()
    st = data["structure"][case["structure"]]
    sharded = _sharded_params(data, be.name, st)
    if not sharded:
        return ()
    text, out = str(e), []
    first = sharded[0]
    if not text.startswith(f"at {first}:"):
        out.append(f"the refusal does not begin with the path `at {first}:`: {text[:80]!r}")
    out += [f"the refusal does not name {w!r}" for w in rule["names"] if w not in text]
    return tuple(out)


def run_fk(data: dict[str, Any], be: Backend, case: dict[str, Any], policy: str) -> Outcome:
    """Run destructure + re(p) for one case under one policy on backend `be`."""
    import functorkit as fk

    st = data["structure"][case["structure"]]
    model = build_model(be, st)
    try:
        flat, re = fk.destructure(model, policy=policy)
    except Exception as e:  # noqa: BLE001 - the table records the class of any error
        return Outcome(error=type(e).__name__, at="destructure", problems=_refusal_problems(data, be, case, e))
    problems = _flat_problems(be, st, model, flat)
    p = build_p(be, case["p"], dtype_name(flat), len(re))
    before = _snapshot(p)
    kwargs = {"copy": case["p"]["copy"]} if "copy" in case["p"] else {}
    try:
        new = re(p, **kwargs)
    except Exception as e:  # noqa: BLE001
        return Outcome(error=type(e).__name__, at="re", problems=tuple(problems))
    leaves = {str(path): facts(be, path.get(new), p) for path in re.paths}
    problems += _rebuilt_problems(fk, st, model, new, list(re.paths))
    after = _snapshot(p)
    if before is not None and after is not None and not np.array_equal(before[1], after[1]):
        problems.append("p was mutated")
    return Outcome(leaves=leaves, problems=tuple(problems))


def compare(want: Outcome, got: Outcome) -> str | None:
    """None if `got` meets `want` (memory "-" means not measurable here), else the difference."""
    if (want.error, want.at) != (got.error, got.at):
        return f"expected {want.text()}, got {got.text()}"
    if got.problems:
        return "; ".join(got.problems)
    if got.error is not None:
        return None
    w, g = want.leaves or {}, got.leaves or {}
    if list(w) != list(g):
        return f"expected parameters {list(w)}, got {list(g)}"
    for k in w:
        if w[k][:3] != g[k][:3] or (g[k][3] != "-" and w[k][3] != g[k][3]):
            return f"at {k}: expected {describe_leaves({k: w[k]})}, got {describe_leaves({k: g[k]})}"
    return None


def normalised(got: Outcome) -> str:
    """The outcome with what is not measurable everywhere removed: compared across backends."""
    if got.error is not None:
        return got.text()
    return describe_leaves({k: (*v[:3], "-") for k, v in (got.leaves or {}).items()})


__all__ = [
    "BACKENDS",
    "CASES",
    "POLICIES",
    "Outcome",
    "build_model",
    "build_p",
    "compare",
    "expected",
    "load",
    "not_applicable",
    "refusal",
    "run_fk",
]
