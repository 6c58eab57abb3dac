"""B3: transport stencils (adv_interior, flux_form_adv, minmod_adv on 10^4
cells) on Csr and ColumnBanded. Each function takes ``ctx``, the run's
:class:`common.Bench`.
"""
from __future__ import annotations

import json
import time

import numpy as np

from esmjac.models.gridded import resized_fixture
from esmjac.runtime.threads import numba_threads

from common import TRANSPORT, point, rel_err, time_calls


def run_transport(ctx) -> None:
    from esmjac.errors import JacError
    from esmjac.layouts.types import ColumnBanded, Csr
    if ctx.fixtures is None:
        ctx.skip("B3", "reference fixtures not found")
        return
    for fx, sizes in TRANSPORT.items():
        doc = resized_fixture(json.loads((ctx.fixtures / f"{fx}.esm").read_text()), sizes)
        ent = ctx.programs((fx, 10_000), doc)
        r, j = ent["r"], ent["j"]
        u, f = point(r, 3)
        ent["point"] = (u, f)
        p = r.p0
        lanes = r.cells if r.kind == "cell" else 1
        npts = r.u_size(lanes)
        rhs_t = {}
        outs = {}
        with numba_threads(1):
            for dt in (np.float64, np.float32):
                dn = np.dtype(dt).name
                uu, ff = u.astype(dt), None if f is None else f.astype(dt)
                out = np.empty_like(uu)
                sc = r.new_buffers()
                med, mn, k = time_calls(lambda: r.eval_into(uu, p, 0.0, ff, out, sc), ctx.calls)
                rhs_t[dn] = med
                ctx.add("B3", fx, "esmjac.rhs", "-", dn, lanes, 1, med, min_s=mn, n_calls=k,
                         unknowns=npts, per_lane_s=None, per_unknown_s=med / npts)
            for lay in (Csr(), ColumnBanded()):
                t0 = time.perf_counter()
                try:
                    plan = j.plan(lay, source=r)
                except JacError as exc:
                    ctx.skip(f"B3 {fx} {lay.name}", str(exc))
                    continue
                tp = time.perf_counter() - t0
                ent["plans"][lay.name] = plan
                nnz = int(plan.info.get("nnz", plan.info.get("size", 0)))
                csr_nnz = int(ent["plans"]["csr"].info["nnz"]) if "csr" in ent["plans"] else 0
                if lay.name.startswith("columnbanded") and csr_nnz and plan.info["size"] > 64 * csr_nnz:
                    ctx.skip(f"B3 {fx} {lay.name} eval_into",
                              f"band storage of {plan.info['size']} slots (kl {plan.info['kl']}, ku "
                              f"{plan.info['ku']}) for {csr_nnz} nonzeros ({plan.info['size'] * 8 / 2**30:.1f} "
                              "GiB per float64 Jacobian): the stencil couples the two ends of the grid "
                              "(periodic), so the band spans the whole column; the plan is accepted anyway")
                    ctx.add("plan", fx, "plan build", lay.name, "-", lanes, 1, tp, nnz=nnz, per_lane_s=None,
                             per_nnz_s=tp / max(nnz, 1))
                    continue
                ctx.add("plan", fx, "plan build", lay.name, "-", lanes, 1, tp, nnz=nnz, per_lane_s=None,
                         per_nnz_s=tp / max(nnz, 1))
                ws = j.new_workspace()
                for dt in (np.float64, np.float32):
                    dn = np.dtype(dt).name
                    uu, ff = u.astype(dt), None if f is None else f.astype(dt)
                    o = np.zeros(plan.out_size(ws.lanes), dtype=dt)
                    j.eval_into(plan, uu, p, 0.0, ff, o, ws)
                    outs[(lay.name, dn)] = o.copy()
                    med, mn, k = time_calls(lambda: j.eval_into(plan, uu, p, 0.0, ff, o, ws), ctx.calls)
                    extra = {}
                    if dn == "float32":
                        extra["f32_vs_f64_err"] = rel_err(o, outs[(lay.name, "float64")], 1e-6)
                    ctx.add("B3", fx, "esmjac.eval_into", lay.name, dn, lanes, 1, med, min_s=mn, n_calls=k,
                             t2_ratio=med / rhs_t[dn], unknowns=npts, per_lane_s=None,
                             per_unknown_s=med / npts, slots=plan.out_size(ws.lanes), **extra)
        if ("columnbanded", "float64") in outs:
            d = verify_banded(j, ent["plans"]["csr"], outs[("csr", "float64")],
                                   ent["plans"]["columnbanded"], outs[("columnbanded", "float64")])
            ctx.log(f"  verify {fx}: ColumnBanded vs Csr max |diff| {d:.3g}")
            for rec in ctx.find(bench="B3", model=fx, method="esmjac.eval_into"):
                rec["layouts_max_abs_diff"] = d


def verify_banded(j, csr_plan, csr_out, band_plan, band_out) -> float:
    info = band_plan.info
    lay = j.layout
    ns = len(lay.states)
    shape = lay.shapes[lay.states[0]]
    N = int(np.prod(shape))
    axis = info["axis"]
    ip = np.asarray(csr_plan.indptr)
    rows = np.repeat(np.arange(ip.size - 1), np.diff(ip))
    cols = np.asarray(csr_plan.indices)

    def split(e):
        s, cell = np.divmod(e, N)
        idx = np.unravel_index(cell, shape)
        rest = [x for d, x in enumerate(idx) if d != axis]
        rshape = [m for d, m in enumerate(shape) if d != axis]
        lane = np.ravel_multi_index(rest, rshape) if rest else np.zeros_like(cell)
        return lane, idx[axis] * ns + s
    rl, ri = split(rows)
    _, ci = split(cols)
    m, ku, C = info["m"], info["ku"], info["columns"]
    pos = ((ku + ri - ci) * m + ci) * C + rl
    b = np.array(band_out, dtype=np.float64)
    d = float(np.max(np.abs(b[pos] - csr_out), initial=0.0))
    b[pos] = 0.0
    return max(d, float(np.max(np.abs(b), initial=0.0)))
