"""B1/B2 and T3: per-cell chemistry (bd_chem resized, tropo12 lifted) on 10^4
(10^5) lanes, every lane layout, float64/float32, the RHS beside it; then
all of Numba's threads. Each function takes ``ctx``, the run's
:class:`common.Bench`.
"""
from __future__ import annotations

import json
import pathlib
import tempfile
import time

import numpy as np

from esmjac.runtime.threads import numba_threads

from common import (CHEM_SIZES, FUSED, REF_LANES, csr_of, fused_workspace, lane_values, point,
                    rel_err, time_many)


def run_chem(ctx) -> None:
    from esmjac.layouts.types import Csr, LaneBlocks, LaneSparseBlocks
    models = [("B2", "tropo12")]
    if ctx.fixtures is not None:
        models.insert(0, ("B1", "bd_chem"))
    else:
        ctx.skip("B1 bd_chem", "reference fixtures not found")
    sizes = CHEM_SIZES[ctx.mode]
    for bench, model in models:
        for N in sizes:
            ent = ctx.programs((model, N), ctx.chem_doc(model, N))
            r, j = ent["r"], ent["j"]
            L = r.cells
            u, f = point(r, 1)
            ent["point"] = (u, f)
            p = r.p0
            n_calls = ctx.calls if N <= 10_000 else 50
            fns, meta, outs, fused_err = {}, {}, {}, {}
            for dt in (np.float64, np.float32):
                dn = np.dtype(dt).name
                uu = u.astype(dt)
                ff = None if f is None else f.astype(dt)
                out = np.empty_like(uu)
                sc = r.new_buffers()
                fns[("rhs", dn)] = (lambda uu=uu, ff=ff, out=out, sc=sc:
                                    r.eval_into(uu, p, 0.0, ff, out, sc))
            for lay in (LaneBlocks(), LaneSparseBlocks(), Csr()):
                t0 = time.perf_counter()
                plan = j.plan(lay, source=r)
                tp = time.perf_counter() - t0
                ent["plans"][lay.name] = plan
                nnz = int(plan.info["nnz"]) if "nnz" in plan.info else plan.out_size(L)
                ctx.add("plan", model, "plan build", lay.name, "-", L, 1, tp, nnz=nnz,
                         per_lane_s=None, per_nnz_s=tp / max(nnz, 1))
                for dt in (np.float64, np.float32):
                    dn = np.dtype(dt).name
                    uu = u.astype(dt)
                    ff = None if f is None else f.astype(dt)
                    o = np.zeros(plan.out_size(L), dtype=dt)
                    ws = j.new_workspace()
                    j.eval_into(plan, uu, p, 0.0, ff, o, ws)
                    outs[(lay.name, dn)] = o.copy()
                    fns[(lay.name, dn)] = (lambda plan=plan, uu=uu, ff=ff, o=o, ws=ws:
                                           j.eval_into(plan, uu, p, 0.0, ff, o, ws))
                    meta[(lay.name, dn)] = plan.out_size(L)
                    wsf = fused_workspace(j, plan)
                    if wsf is not None:
                        of = np.zeros_like(o)
                        j.eval_into(plan, uu, p, 0.0, ff, of, wsf)
                        fused_err[(lay.name + FUSED, dn)] = rel_err(of, o, 1e-6)
                        outs[(lay.name + FUSED, dn)] = of.copy()
                        fns[(lay.name + FUSED, dn)] = (lambda plan=plan, uu=uu, ff=ff, of=of, wsf=wsf:
                                                       j.eval_into(plan, uu, p, 0.0, ff, of, wsf))
                        meta[(lay.name + FUSED, dn)] = plan.out_size(L)
            with numba_threads(1):
                res = time_many(fns, n_calls)
            for dt in ("float64", "float32"):
                med, mn, k = res[("rhs", dt)]
                ctx.add(bench, model, "esmjac.rhs", "-", dt, L, 1, med, min_s=mn, n_calls=k)
            for (lay, dn), (med, mn, k) in res.items():
                if lay == "rhs":
                    continue
                extra = {}
                if dn == "float32":
                    extra["f32_vs_f64_err"] = rel_err(outs[(lay, dn)], outs[(lay, "float64")], 1e-6)
                if (lay, dn) in fused_err:
                    extra["fused_vs_slab_err"] = fused_err[(lay, dn)]
                rhs_med = res[("rhs", dn)][0]
                fused = lay.endswith(FUSED)
                ctx.add(bench, model, "esmjac.eval_into" + (FUSED if fused else ""),
                         lay[:-len(FUSED)] if fused else lay, dn, L, 1, med, min_s=mn,
                         n_calls=k, t2_ratio=med / rhs_med, rhs_median_s=rhs_med,
                         slots=meta[(lay, dn)], engine=j.kernel.engine,
                         workspace="keep_slab=False" if fused else "default", **extra)
            if N <= REF_LANES:
                verify_layouts(ctx, model, j, ent["plans"], outs, L)
    t3(ctx)


def t3(ctx) -> None:
    """T3 in fresh processes (the threading layer is fixed at a process's
    first parallel call): Numba's default, then two informative variants."""
    import numba
    NT = int(numba.config.NUMBA_NUM_THREADS)
    if NT < 2:
        ctx.skip("T3", "numba has one thread on this machine")
        return
    N = CHEM_SIZES[ctx.mode][-1]
    d = pathlib.Path(tempfile.mkdtemp(prefix="t3_", dir=ctx.tmp))
    path = d / "tropo12.esm"
    path.write_text(json.dumps(ctx.chem_doc("tropo12", N)))
    variants = [("default", {}), ("OMP_WAIT_POLICY=active", {"OMP_WAIT_POLICY": "active"}),
                ("NUMBA_THREADING_LAYER=workqueue", {"NUMBA_THREADING_LAYER": "workqueue"})]
    for label, extra_env in variants:
        try:
            res = ctx._child({"doc": str(path), "mode": "t3", "calls": 50, "threads": NT,
                               "bench_dir": None}, None, extra_env)
        except Exception as exc:                     # noqa: BLE001
            ctx.error(f"T3 {label}", exc)
            continue
        for meth, key, lay in (("esmjac.eval_into", "eval", "lanesparseblocks"), ("esmjac.rhs", "rhs", "-"),
                               ("esmjac.eval_into" + FUSED, "eval_fused", "lanesparseblocks")):
            if key not in res:
                continue
            m1, mN = res[key]["1"], res[key][str(NT)]
            n1, nN = res[key + "_min"]["1"], res[key + "_min"][str(NT)]
            sp = m1 / mN
            ctx.add("T3", "tropo12", meth, lay, "float64", N, NT, mN, t1_s=m1, n_calls=res["calls"],
                     min_s=nN, t1_min_s=n1, speedup=sp, efficiency=sp / NT,
                     efficiency_of_mins=n1 / nN / NT, variant=label, threading_layer=res["layer"])


def verify_layouts(ctx, model, j, plans, outs, L) -> None:
    """The three layouts hold the same numbers (float64)."""
    n = j.n_species
    lb = outs[("laneblocks-natural", "float64")].reshape(n * n, L)
    sp_plan = plans["lanesparseblocks"]
    order = [int(x) for x in sp_plan.info["ordering"]]
    sp = outs[("lanesparseblocks", "float64")].reshape(-1, L)
    from_sp = np.zeros_like(lb)
    for q, (a, b) in enumerate(sp_plan.info["lu_pattern"]):
        from_sp[order[a] * n + order[b]] = sp[q]
    pat = [(r, c) for r in range(n) for c in range(n)]
    M = csr_of(plans["csr"], outs[("csr", "float64")])
    from_csr = lane_values(M, pat, L)
    d1 = float(np.max(np.abs(from_sp - lb)))
    d2 = float(np.max(np.abs(from_csr - lb)))
    ctx.log(f"  verify {model}: LaneSparseBlocks vs LaneBlocks max |diff| {d1:.3g}, Csr vs LaneBlocks {d2:.3g}")
    for rec in ctx.find(model=model, method="esmjac.eval_into", lanes=L):
        rec["layouts_max_abs_diff"] = max(d1, d2)
    if d1 > 0 or d2 > 0:
        ctx.errors.append({"what": f"layouts disagree ({model})", "error": f"{d1} {d2}"})
