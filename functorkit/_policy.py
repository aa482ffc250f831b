"""The conversion policies of destructure/restructure: one table of rules.

Three policies, each with one rule per situation and no middle ground:

``"strict"`` (the default)
    Nothing is ever converted: ``destructure`` needs every parameter in one
    namespace, dtype and device, and ``re(p)`` needs ``p`` to match each
    parameter exactly.
``"model"``
    Every rebuilt parameter keeps the model's own dtype, device and namespace
    (``p``'s slices are cast and moved).
``"flat"``
    Every rebuilt parameter takes ``p``'s dtype, device and namespace (plain
    views of ``p``, never a conversion).

`RULES` is the whole policy: ``RULES[situation][policy]`` is what
happens. The code in ``_flat.py`` only reads this table; the messages and
``re.explain`` rows are written here too, so that a reader finds every rule
in one place.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._errors import PolicyError
from ._keypath import KeyPath
from ._xp import (
    Kind,
    describe_device,
    describe_dtype,
    describe_kind,
    describe_namespace,
    is_complex,
    same_device,
)
from .adapters import adapter_for

__all__ = [
    "POLICIES",
    "RULES",
    "Decision",
    "Kind",
    "check_policy",
    "decide_flatten",
    "decide_mixed",
    "decide_unknown_holder",
    "decide_rebuild",
    "describe_device",
    "describe_dtype",
    "describe_namespace",
    "is_complex",
    "mixed_model_error",
    "same_device",
]

POLICIES = ("strict", "model", "flat")

# ---- actions -----------------------------------------------------------------
RAISE = "raise PolicyError"
PROMOTE = "flat dtype = result_type of all parameters"
FIRST = "flat on the first parameter's device (walk order)"
TO_LEAF = "convert p's slice to the parameter's own"
KEEP_P = "the parameter takes p's"
REAL_IF_COMPLEX_MODEL = "take the real part if the model had complex parameters, else raise PolicyError"
TO_FLAT = "convert the parameter to the flat vector's"
REFUSE = "raise StructureError naming the path and how to register it"
CONSTANT = "carry it unchanged as a constant"

# ---- situations --------------------------------------------------------------
MIXED_DTYPE = "destructure: parameters differ in dtype"
MIXED_DEVICE = "destructure: parameters differ in device"
MIXED_NAMESPACE = "destructure: parameters differ in namespace"
UNKNOWN_HOLDER = "destructure: an object no registry knows holds arrays"
P_DTYPE = "re(p): p's dtype differs from a parameter's"
P_DEVICE = "re(p): p's device differs from a parameter's"
P_NAMESPACE = "re(p): p's namespace differs from a parameter's"
P_COMPLEX = "re(p): complex p, real parameter"
F_DTYPE = "re.flatten(m): a parameter's dtype differs from the flat vector's"
F_DEVICE = "re.flatten(m): a parameter's device differs from the flat vector's"
F_NAMESPACE = "re.flatten(m): a parameter's namespace differs from the flat vector's"
F_COMPLEX = "re.flatten(m): complex parameter, real flat vector"

#: The one table: ``RULES[situation][policy] -> action``.
RULES: dict[str, dict[str, str]] = {
    MIXED_DTYPE: {"strict": RAISE, "model": PROMOTE, "flat": PROMOTE},
    MIXED_DEVICE: {"strict": RAISE, "model": FIRST, "flat": FIRST},
    MIXED_NAMESPACE: {"strict": RAISE, "model": RAISE, "flat": RAISE},
    UNKNOWN_HOLDER: {"strict": REFUSE, "model": REFUSE, "flat": REFUSE},  # SPEC 12: every operation refuses
    P_DTYPE: {"strict": RAISE, "model": TO_LEAF, "flat": KEEP_P},
    P_DEVICE: {"strict": RAISE, "model": TO_LEAF, "flat": KEEP_P},
    P_NAMESPACE: {"strict": RAISE, "model": TO_LEAF, "flat": KEEP_P},
    P_COMPLEX: {"strict": RAISE, "model": REAL_IF_COMPLEX_MODEL, "flat": KEEP_P},
    F_DTYPE: {"strict": RAISE, "model": TO_FLAT, "flat": TO_FLAT},
    F_DEVICE: {"strict": RAISE, "model": TO_FLAT, "flat": TO_FLAT},
    F_NAMESPACE: {"strict": RAISE, "model": RAISE, "flat": RAISE},
    F_COMPLEX: {"strict": RAISE, "model": RAISE, "flat": RAISE},
}

_FIX = {
    "strict": "pass policy='model' (each parameter keeps its own dtype/device, p's slices are converted) "
    "or policy='flat' (every parameter takes p's dtype/device)",
    "model": "pass policy='flat' (every parameter takes p's dtype/device), or convert p yourself",
    "flat": "convert p yourself",
}


def check_policy(policy: Any, where: str) -> str:
    """Return `policy` if it is one of `POLICIES`; TypeError for a non-str, else ValueError."""
    if type(policy) is not str:
        msg = f"{where}: `policy` must be a str, one of 'strict', 'model' or 'flat'; got {type(policy).__name__}."
        raise TypeError(msg)
    if policy in POLICIES:
        return policy
    msg = f"{where}: unknown policy {policy!r}; expected one of 'strict', 'model' or 'flat'."
    raise ValueError(msg)


# ---- facts about arrays (the helpers live in _xp; re-exported for _flat) -------


def describe(kind: Kind) -> str:
    """``float32 on cpu (torch)``."""
    return describe_kind(kind)


def _same_dtype(a: Kind, b: Kind) -> bool:
    if a.xp is b.xp:
        return bool(a.dtype == b.dtype)
    return describe_dtype(a.dtype) == describe_dtype(b.dtype)


def _platform(device: Any) -> str:
    """A device's kind, comparable across libraries: "cpu", "cuda", "meta", or its name."""
    name = str(getattr(device, "platform", None) or getattr(device, "type", None) or device).lower()
    if "cpu" in name:
        return "cpu"
    if "cuda" in name or "gpu" in name:
        return "cuda"
    return name


def _same_device_kind(a: Kind, b: Kind) -> bool:
    if a.xp is b.xp:
        return same_device(a.device, b.device)
    if a.device is None or b.device is None:
        return True
    return _platform(a.device) == _platform(b.device)


# ---- decisions -----------------------------------------------------------------


class Decision(NamedTuple):
    """What happens to one parameter: result kind, conversions, rule text, or the error."""

    result: Kind | None
    convert: bool
    real_part: bool
    to_namespace: bool
    to_dtype: bool
    to_device: bool
    rule: str
    error: str | None  # the reason re(p) / re.flatten raises (None: no error)


def _differences(leaf: Kind, other: Kind) -> list[str]:
    out = []
    if leaf.xp is not other.xp:
        out.append("namespace")
    if not _same_dtype(leaf, other):
        out.append("dtype")
    if not _same_device_kind(leaf, other):
        out.append("device")
    return out


def decide_mixed(policy: str, what: str) -> bool:
    """Whether ``destructure`` raises for parameters that differ in `what` ("dtype", "device" or
    "namespace") under `policy` (reads `RULES`; otherwise the flat vector promotes the dtype
    and lives on the first parameter's device)."""
    situation = {"dtype": MIXED_DTYPE, "device": MIXED_DEVICE, "namespace": MIXED_NAMESPACE}[what]
    return RULES[situation][policy] == RAISE


def decide_unknown_holder(policy: str) -> bool:
    """Whether ``destructure`` refuses an object that no registry knows but that holds arrays
    (reads `RULES`; otherwise it is a constant)."""
    return RULES[UNKNOWN_HOLDER][policy] == REFUSE


def decide_rebuild(policy: str, leaf: Kind, p: Kind, model_has_complex: bool) -> Decision:
    """How ``re(p)`` rebuilds a parameter of kind `leaf` from `p` under `policy` (reads `RULES`)."""
    diffs = _differences(leaf, p)
    if not diffs:
        return Decision(leaf, False, False, False, False, False, f"{policy}: p matches the parameter", None)
    real = is_complex(p) and not is_complex(leaf)
    situations = [{"namespace": P_NAMESPACE, "dtype": P_DTYPE, "device": P_DEVICE}[d] for d in diffs]
    if real:
        situations.append(P_COMPLEX)
    actions = {s: RULES[s][policy] for s in situations}
    what = ", ".join(f"{d} {_show(d, p)} vs the parameter's {_show(d, leaf)}" for d in diffs)
    if RAISE in actions.values():
        return Decision(None, False, False, False, False, False, f"{policy}: {what}: {RAISE}", "strict")
    if all(a == KEEP_P for a in actions.values()):
        return Decision(p, False, False, False, False, False, f"{policy}: takes p's {' and '.join(diffs)}", None)
    # every other action converts p's slice to the parameter's own kind (TO_LEAF)
    if actions.get(P_COMPLEX) == REAL_IF_COMPLEX_MODEL and not model_has_complex:
        return Decision(
            None, False, False, False, False, False, f"{policy}: complex p into real parameter: {RAISE}", "complex"
        )
    unreadable = not adapter_for(p.xp).readable(p.device)  # a meta p: no values to read
    if unreadable and ("namespace" in diffs or ("device" in diffs and adapter_for(leaf.xp).readable(leaf.device))):
        # into another library, or onto a device with memory, p's values would be read (a cast on meta is not)
        why = f"{policy}: p on {describe_device(p.device)} holds no values: {RAISE}"
        return Decision(None, False, False, False, False, False, why, "no values")
    steps = []
    if real:
        steps.append("real part")
    if "namespace" in diffs:
        steps.append(f"to {describe_namespace(leaf.xp)}")
    if "dtype" in diffs:
        steps.append(f"cast {describe_dtype(p.dtype)} -> {describe_dtype(leaf.dtype)}")
    if "device" in diffs:
        steps.append(f"move {describe_device(p.device)} -> {describe_device(leaf.device)}")
    return Decision(
        leaf,
        True,
        real,
        "namespace" in diffs,
        "dtype" in diffs or real,
        "device" in diffs,
        f"{policy}: " + ", ".join(steps),
        None,
    )


def decide_flatten(policy: str, leaf: Kind, flat: Kind) -> Decision:
    """How ``re.flatten`` copies a parameter of kind `leaf` into the flat vector of kind `flat`."""
    diffs = _differences(leaf, flat)
    if not diffs:
        return Decision(flat, False, False, False, False, False, f"{policy}: same kind as the flat vector", None)
    situations = [{"namespace": F_NAMESPACE, "dtype": F_DTYPE, "device": F_DEVICE}[d] for d in diffs]
    if is_complex(leaf) and not is_complex(flat):
        situations.append(F_COMPLEX)
    actions = {s: RULES[s][policy] for s in situations}
    if RAISE in actions.values():
        reason = next(s for s, a in actions.items() if a == RAISE)
        return Decision(None, False, False, False, False, False, f"{policy}: {reason}: {RAISE}", reason)
    return Decision(
        flat, True, False, False, "dtype" in diffs, "device" in diffs, f"{policy}: converted to the flat kind", None
    )


def _show(diff: str, kind: Kind) -> str:
    if diff == "namespace":
        return describe_namespace(kind.xp)
    if diff == "dtype":
        return describe_dtype(kind.dtype)
    return describe_device(kind.device)


# ---- messages ------------------------------------------------------------------


def rebuild_error(policy: str, path: KeyPath, leaf: Kind, p: Kind, reason: str) -> PolicyError:
    """The PolicyError ``re(p)`` raises for the parameter at `path`."""
    if reason == "complex":
        msg = (
            f"at {path.display}: re(p) under policy='model' got a complex p ({describe(p)}) for the real "
            f"parameter ({describe(leaf)}), and the model has no complex parameters, so the imaginary part "
            "would be silently dropped. Expected a real p. Fix: pass p.real yourself, or policy='flat' "
            "(every parameter becomes complex)."
        )
        return PolicyError(msg)
    if reason == "no values":
        msg = (
            f"at {path.display}: re(p) under policy={policy!r} would convert p ({describe(p)}) into the "
            f"parameter's kind ({describe(leaf)}), but p is on {describe_device(p.device)} and holds no values. "
            "Expected a p with values; fix: pass p of the parameter's own kind, or materialise p first."
        )
        return PolicyError(msg)
    diffs = _differences(leaf, p)
    msg = (
        f"at {path.display}: re(p) under policy={policy!r} would need a conversion: the model's parameter is "
        f"{describe(leaf)} and p is {describe(p)} (different {' and '.join(diffs)}). "
        f"Expected p of the parameter's namespace, dtype and device. Fix: {_FIX[policy]}."
    )
    return PolicyError(msg)


def flatten_error(policy: str, path: KeyPath, leaf: Kind, flat: Kind, reason: str) -> PolicyError:
    """The PolicyError ``re.flatten`` raises for the parameter at `path`."""
    if reason == F_COMPLEX:
        fix = "pass a real model, or destructure this model itself (its flat vector will be complex)"
    elif reason == F_NAMESPACE:
        fix = "convert the model to the namespace of the flat vector, or destructure it itself"
    else:
        fix = "pass policy='model' or policy='flat' to convert it into the flat vector"
    msg = (
        f"at {path.display}: re.flatten under policy={policy!r}: the parameter is {describe(leaf)} but the "
        f"flat vector is {describe(flat)} ({reason}). Fix: {fix}."
    )
    return PolicyError(msg)


def mixed_model_error(policy: str, what: str, path_a: KeyPath, a: Kind, path_b: KeyPath, b: Kind) -> PolicyError:
    """The PolicyError ``destructure`` raises for two parameters that differ in `what`."""
    if what == "namespace":
        msg = (
            f"at {path_a.display} and {path_b.display}: fk.destructure found parameters of two array "
            f"namespaces ({describe(a)} vs {describe(b)}); one flat vector cannot hold both, under any "
            "policy. Expected every parameter in one namespace. Fix: convert the model to one namespace first."
        )
        return PolicyError(msg)
    msg = (
        f"at {path_a.display} and {path_b.display}: fk.destructure(policy={policy!r}) found parameters that "
        f"differ in {what} ({describe(a)} vs {describe(b)}); 'strict' builds the flat vector without any "
        "conversion. Expected every parameter of one dtype and device. Fix: make them equal, or pass "
        "policy='model' (re(p) gives each parameter back its own dtype/device) or policy='flat' (re(p) gives "
        "every parameter p's dtype/device)."
    )
    return PolicyError(msg)
