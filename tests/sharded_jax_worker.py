"""The JAX process of tests/test_sharded_jax.py: eight host devices, two meshes (Auto and Explicit axes).

Started by tests/sharded_harness.py with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``.
Each check compares a result with NumPy on the same values and reports its shardings. Nothing is
imported at module level (pytest's ``--doctest-modules`` imports this file in sessions without JAX).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import tempfile
import traceback
from collections.abc import Callable
from typing import Any


def main() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    import functorkit as fk

    results: dict[str, Any] = {"devices": len(jax.devices())}

    def check(name: str, f: Callable[[], dict[str, Any]]) -> None:
        try:
            results[name] = f()
        except Exception as e:  # noqa: BLE001 -- reported to the test, which fails on it
            results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}

    rng = np.random.default_rng(0)
    ref = {"a": rng.standard_normal((8, 4)), "b": rng.standard_normal((4, 6)), "c": rng.standard_normal(3)}
    ref2 = {k: rng.standard_normal(v.shape) for k, v in ref.items()}
    specs = {"a": P("x", "y"), "b": P(None, "y"), "c": P()}

    def flat(m: dict[str, Any]) -> Any:
        return np.concatenate([np.asarray(m[k], dtype=np.float64).ravel() for k in m])

    for kind in ("auto", "explicit"):
        if kind == "auto":
            mesh = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
        else:
            mesh = jax.make_mesh((4, 2), ("x", "y"))  # jax's default: Explicit axes
        mesh_kinds = [str(t) for t in mesh.axis_types]

        def put(m: dict[str, Any], mesh: Any = mesh) -> dict[str, Any]:
            return {k: jax.device_put(jnp.asarray(m[k], dtype=jnp.float32), NamedSharding(mesh, specs[k])) for k in m}

        d, e = put(ref), put(ref2)

        def kept(out: Any, model: Any = d) -> bool:
            """Every array has its input's sharding (equivalent specs: P() and P(None,) are one)."""
            return all(
                o.sharding.is_equivalent_to(x.sharding, o.ndim)
                for o, x in zip(fk.leaves(out), fk.leaves(model), strict=True)
            )

        def err(out: Any, want: dict[str, Any]) -> float:
            return max(float(np.abs(np.asarray(out[k], dtype=np.float64) - want[k]).max()) for k in want)

        def elementwise(
            op: Callable[[], Any], want: dict[str, Any], mesh_kinds: list[str] = mesh_kinds
        ) -> dict[str, Any]:
            out = op()
            return {"kept": kept(out), "err": err(out, want), "mesh": mesh_kinds}

        ops: dict[str, tuple[Callable[[], Any], dict[str, Any]]] = {
            "fmap": (lambda d=d: fk.fmap(lambda x: 2 * x, d), {k: 2 * v for k, v in ref.items()}),
            "fmap2": (lambda d=d, e=e: fk.fmap(lambda x, y: x - y, d, e), {k: ref[k] - ref2[k] for k in ref}),
            "add": (lambda d=d, e=e: fk.add(d, e), {k: ref[k] + ref2[k] for k in ref}),
            "sub": (lambda d=d, e=e: fk.sub(d, e), {k: ref[k] - ref2[k] for k in ref}),
            "scale": (lambda d=d: fk.scale(0.5, d), {k: 0.5 * ref[k] for k in ref}),
            "lincomb": (
                lambda d=d, e=e: fk.lincomb([0.25, 0.75], [d, e]),
                {k: 0.25 * ref[k] + 0.75 * ref2[k] for k in ref},
            ),
            "mean": (lambda d=d, e=e: fk.mean([d, e]), {k: (ref[k] + ref2[k]) / 2 for k in ref}),
            "lerp": (lambda d=d, e=e: fk.lerp(d, e, 0.1), {k: ref[k] + 0.1 * (ref2[k] - ref[k]) for k in ref}),
            "copy": (lambda d=d: fk.copy(d), ref),
            "jit_lerp": (
                lambda d=d, e=e: jax.jit(fk.lerp)(d, e, 0.1),
                {k: ref[k] + 0.1 * (ref2[k] - ref[k]) for k in ref},
            ),
        }
        for name, (op, want) in ops.items():
            check(f"{kind}.{name}", lambda op=op, want=want: elementwise(op, want))

        def stack(d: Any = d, e: Any = e) -> dict[str, Any]:
            out = fk.stack([d, e])
            specs_out = {k: tuple(out[k].sharding.spec) for k in out}
            return {
                "specs": {k: [str(s) for s in v] for k, v in specs_out.items()},
                "err": err(out, {k: np.stack([ref[k], ref2[k]]) for k in ref}),
            }

        check(f"{kind}.stack", stack)

        for o in (2, 1, math.inf, -math.inf, 0, 3):
            for how in ("eager", "jit"):

                def norm(o: float = o, how: str = how, d: Any = d) -> dict[str, Any]:
                    f = fk.norm if how == "eager" else jax.jit(fk.norm, static_argnames="ord")
                    r = f(d, ord=o)
                    return {
                        "value": float(r),
                        "ref": float(np.linalg.norm(flat(ref), ord=o)),
                        "devices": len(r.sharding.device_set),
                        "ndim": r.ndim,
                    }

                check(f"{kind}.norm_{o}.{how}", norm)

        for how in ("eager", "jit"):

            def dot(how: str = how, d: Any = d, e: Any = e) -> dict[str, Any]:
                f = fk.dot if how == "eager" else jax.jit(fk.dot)
                r = f(d, e)
                return {"value": float(r), "ref": float(flat(ref) @ flat(ref2)), "devices": len(r.sharding.device_set)}

            check(f"{kind}.dot.{how}", dot)

        def all_finite(d: Any = d) -> dict[str, Any]:
            bad = dict(d)
            a = np.asarray(ref["a"], dtype=np.float32)
            a[7, 3] = np.nan  # on one device's shard only
            bad["a"] = jax.device_put(a, d["a"].sharding)
            return {"bad": bool(fk.all_finite(bad)), "ok": bool(fk.all_finite(d)), "kept": kept(bad)}

        check(f"{kind}.all_finite", all_finite)

        def merges(d: Any = d, e: Any = e, kind: str = kind) -> dict[str, Any]:
            """The merge methods on sharded arrays against the same merge of NumPy arrays."""
            host = {k: np.asarray(v) for k, v in d.items()}
            host2 = {k: np.asarray(v) for k, v in e.items()}
            calls = {
                "slerp": (lambda m, n: fk.slerp(m, n, 0.3)),
                "task_arithmetic": (lambda m, n: fk.task_arithmetic(m, [n, fk.scale(2.0, n)], [0.5, 0.25])),
                "ties": (lambda m, n: fk.ties(m, [n, fk.scale(2.0, n)], [0.5, 0.5], density=0.5)),
                "dare": (lambda m, n: fk.dare(m, [n, fk.scale(2.0, n)], [0.5, 0.5], density=0.5, seed=0)),
                "tensor_dots": (lambda m, n: fk.tensor_dots(m, n)),
            }
            out: dict[str, Any] = {}
            for name, f in calls.items():
                try:
                    got = f(d, e)
                except TypeError as ex:
                    out[name] = {"refused": str(ex)}
                    continue
                want = {k: np.asarray(v, dtype=np.float64) for k, v in f(host, host2).items()}
                out[name] = {"err": err(got, want), "kept": name == "tensor_dots" or kept(got)}
            return out

        check(f"{kind}.merges", merges)

        def compiled(d: Any = d, e: Any = e) -> dict[str, Any]:
            """The collectives XLA compiles into jit(fk.norm) and jit(fk.dot): reductions, no gather."""
            out = {}
            for name, f, args in (("norm", fk.norm, (d,)), ("dot", fk.dot, (d, e))):
                txt = jax.jit(f).lower(*args).compile().as_text()
                out[name] = {
                    "all_reduce": len(re.findall(r" all-reduce(?:-start)?\(", txt)),
                    "all_gather": txt.count("all-gather("),
                    "all_to_all": txt.count("all-to-all("),
                }
            return out

        check(f"{kind}.compiled", compiled)

        def normalize(d: Any = d) -> dict[str, Any]:
            out = fk.normalize(d)
            n = np.linalg.norm(flat(ref))
            return {"kept": kept(out), "err": err(out, {k: v / n for k, v in ref.items()})}

        check(f"{kind}.normalize", normalize)

        def eager_program(d: Any = d, e: Any = e) -> dict[str, Any]:
            """Eager fk.norm/fk.dot of a sharded model run ONE compiled program (the per-array reductions
            and the root traced once, on the first call): on later calls no per-array JAX operation
            (`_part`) runs, and the value is the same as jit(fk.norm)'s."""
            from functorkit.adapters import _jax_sharding

            calls = {"program": 0, "part": 0}
            program, part = _jax_sharding._program, _jax_sharding._part

            def spy_program(*args: Any) -> Any:
                calls["program"] += 1
                return program(*args)

            def spy_part(*args: Any) -> Any:
                calls["part"] += 1
                return part(*args)

            out: dict[str, Any] = {}
            for name, f in (
                ("norm", lambda: fk.norm(d)),
                ("norm_inf", lambda: fk.norm(d, ord=math.inf)),
                ("dot", lambda: fk.dot(d, e)),
            ):
                first = float(f())  # (compiles, or finds the compilation of an earlier call)
                _jax_sharding._program, _jax_sharding._part = spy_program, spy_part
                try:
                    calls.update(program=0, part=0)
                    r = f()
                    seen = dict(calls)
                finally:
                    _jax_sharding._program, _jax_sharding._part = program, part
                out[name] = {"calls": seen, "value": float(r), "first": first, "devices": len(r.sharding.device_set)}
            out["norm"]["jit"] = float(jax.jit(fk.norm)(d))
            out["norm"]["ref"] = float(np.linalg.norm(flat(ref)))
            out["norm_inf"]["ref"] = float(np.max(np.abs(flat(ref))))
            out["dot"]["ref"] = float(flat(ref) @ flat(ref2))
            return out

        check(f"{kind}.eager_program", eager_program)

        check(f"{kind}.destructure", lambda d=d: (fk.destructure(d), {})[1])
        check(f"{kind}.destructure_model", lambda d=d: (fk.destructure(d, policy="model"), {})[1])

        def replicated_destructure(mesh: Any = mesh) -> dict[str, Any]:
            """Whole on every device (data parallel): a flat vector is fine, and `re` keeps the placement."""
            rep = {k: jax.device_put(jnp.asarray(ref[k], dtype=jnp.float32), NamedSharding(mesh, P())) for k in ref}
            flat_v, re = fk.destructure(rep)
            back = re(flat_v * 2)
            return {
                "err": err(back, {k: 2 * v for k, v in ref.items()}),
                "devices": [len(back[k].sharding.device_set) for k in back],
            }

        check(f"{kind}.destructure_replicated", replicated_destructure)

        def save_load(d: Any = d) -> dict[str, Any]:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "ck")
                fk.save(path, d)
                like = fk.load(path, like=d)
                whole = fk.load(path)
                out = {"kept": kept(like), "err": err(like, ref), "whole_err": err(whole, ref), "open_err": None}
                if importlib.util.find_spec("dask") is not None:  # fk.open is lazy on Dask (not in every session)
                    opened = fk.open(path)
                    out["open_err"] = err({k: np.asarray(v.compute()) for k, v in opened.items()}, ref)
                return out

        check(f"{kind}.save_load", save_load)

        def load_into(d: Any = d) -> dict[str, Any]:
            fk.load_into(fk.copy(d), d)
            return {}

        check(f"{kind}.load_into", load_into)

    def two_meshes() -> dict[str, Any]:
        """Arrays of one mesh shape over two device sets: the refusal says which devices each has."""
        devs = jax.devices()
        halves = [jax.sharding.Mesh(np.array(devs[:4]), ("x",)), jax.sharding.Mesh(np.array(devs[4:]), ("x",))]
        a, b = (jax.device_put(jnp.arange(8.0), NamedSharding(m, P("x"))) for m in halves)
        out: dict[str, Any] = {}
        for name, f in (("norm", lambda: fk.norm({"a": a, "b": b})), ("add", lambda: fk.add({"w": a}, {"w": b}))):
            try:
                f()
                out[name] = "no error"
            except fk.PolicyError as e:
                out[name] = str(e)
        return out

    check("two_meshes", two_meshes)

    def replicated_spec_merges() -> dict[str, Any]:
        """Replicated arrays whose spec has their rank (P(None): what jnp operations give on an
        Explicit mesh for a P() input): the merges' 0-d constants are left uncommitted."""
        out: dict[str, Any] = {}
        for kind, axes in (("explicit", None), ("auto", (AxisType.Auto,) * 2)):
            mesh = jax.make_mesh((4, 2), ("x", "y"), **({} if axes is None else {"axis_types": axes}))
            vals = [rng.standard_normal(3) for _ in range(3)]
            rep = NamedSharding(mesh, P(None))
            base, m1, m2 = ({"w": jax.device_put(jnp.asarray(v, jnp.float32), rep)} for v in vals)
            ref = fk.slerp({"w": np.float32(vals[1])}, {"w": np.float32(vals[2])}, 0.3)["w"]
            got = fk.slerp(m1, m2, 0.3)["w"]
            out[f"{kind}.slerp"] = float(np.max(np.abs(np.asarray(got) - ref)))
            if kind == "auto":
                out["auto.ties"] = np.asarray(fk.ties(base, [m1, m2], [0.5, 0.5], density=0.5)["w"]).tolist()
                out["auto.dare"] = np.asarray(fk.dare(base, [m1, m2], [0.5, 0.5], density=0.5, seed=0)["w"]).tolist()
        return out

    check("replicated_spec_merges", replicated_spec_merges)
    print("FK_RESULTS " + json.dumps(results, default=str), flush=True)


if __name__ == "__main__":
    main()
