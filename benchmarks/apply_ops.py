"""B4 (T4): apply / apply_transpose against eval_into, chemistry and stencils."""
from __future__ import annotations

import json

import numpy as np

from esmjac.models.gridded import resized_fixture
from esmjac.runtime.threads import numba_threads

from common import TRANSPORT, csr_of, point, rel_err, time_calls


def run_apply(ctx) -> None:
    from esmjac.layouts.types import Csr, LaneSparseBlocks
    cases = [("tropo12", 10_000, "lanesparseblocks")]
    if ctx.fixtures is not None:
        cases += [(fx, 10_000, "csr") for fx in TRANSPORT]
    for model, N, layname in cases:
        key = (model, N)
        if key not in ctx.cache:
            doc = ctx.chem_doc(model, N) if model == "tropo12" else \
                resized_fixture(json.loads((ctx.fixtures / f"{model}.esm").read_text()), TRANSPORT[model])
            ctx.programs(key, doc)
        ent = ctx.cache[key]
        r, j = ent["r"], ent["j"]
        if "point" not in ent:
            ent["point"] = point(r, 1)
        u, f = ent["point"]
        p = r.p0
        plans = ent["plans"]
        if "csr" not in plans:
            plans["csr"] = j.plan(Csr(), source=r)
        if layname not in plans:
            plans[layname] = j.plan(LaneSparseBlocks(), source=r)
        plan = plans[layname]
        lanes = r.cells if r.kind == "cell" else 1
        wsc = j.new_workspace()
        oc = np.zeros(plans["csr"].out_size(wsc.lanes))
        j.eval_into(plans["csr"], u, p, 0.0, f, oc, wsc)
        M = csr_of(plans["csr"], oc)
        ws = j.new_workspace()
        o = np.zeros(plan.out_size(ws.lanes))
        j.eval_into(plan, u, p, 0.0, f, o, ws)
        rng = np.random.default_rng(5)
        v = rng.standard_normal(j.col_size(ws.lanes))
        lam = rng.standard_normal(j.u_size(ws.lanes))
        y = np.zeros(j.u_size(ws.lanes))
        g = np.zeros(j.col_size(ws.lanes))
        j.apply(plan, ws, v, y)
        j.apply_transpose(plan, ws, lam, g)
        e1 = rel_err(y, M @ v, 1e-12)
        e2 = rel_err(g, M.T @ lam, 1e-12)
        ctx.log(f"  verify {model}: apply vs Csr@v {e1:.2e}, apply_transpose vs Csr.T@lam {e2:.2e}")
        with numba_threads(1):
            ma, mna, ka = time_calls(lambda: j.apply(plan, ws, v, y), ctx.calls)
            mt, mnt, kt = time_calls(lambda: j.apply_transpose(plan, ws, lam, g), ctx.calls)
            me, _, _ = time_calls(lambda: j.eval_into(plan, u, p, 0.0, f, o, ws), ctx.calls)
        nnz = M.nnz
        ctx.add("B4", model, "esmjac.apply", layname, "float64", lanes, 1, ma, min_s=mna, n_calls=ka,
                 nnz=nnz, verify_err=e1, eval_into_s=me)
        ctx.add("B4", model, "esmjac.apply_transpose", layname, "float64", lanes, 1, mt, min_s=mnt,
                 n_calls=kt, nnz=nnz, verify_err=e2, t4_ratio=mt / ma, eval_into_s=me)
