"""Measurements in a fresh process (B5 build stages, cold and warm builds; T3
thread scaling): run by Bench._child as ``python -c "import child;
child.main(spec)"`` in benchmarks/. Each function takes ``ctx``, the run's
:class:`common.Bench`.
"""
from __future__ import annotations

import contextlib
import io
import json
import statistics
import time
import warnings

import numpy as np

from common import MARK, casadi_vs_csr, fused_workspace, point, time_calls


def main(spec_json: str) -> int:
    """One B5 build measurement in a fresh process (see :meth:`Bench.build`)."""
    warnings.filterwarnings("ignore")
    spec = json.loads(spec_json)
    path, mode = spec["doc"], spec["mode"]
    res: dict = {"mode": mode}
    # Imports a long-running process has done once are not build cost.
    t0 = time.perf_counter()
    import earthsci_ast  # noqa: F401
    import numba  # noqa: F401

    from esmjac.calculus import bandset  # noqa: F401
    from esmjac.compile import evaldoc  # noqa: F401
    from esmjac.model import load  # noqa: F401
    from esmjac.runtime import programs as program  # noqa: F401
    from esmjac.compile import codegen  # noqa: F401
    from esmjac.compile import tape  # noqa: F401
    res["import_s"] = time.perf_counter() - t0
    if mode == "t3":
        import numba

        from esmjac.layouts.types import LaneSparseBlocks
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        r = RhsProgram.build(path)
        j = JacobianProgram.build(path)
        u, f = point(r, 1)
        p = r.p0
        plan = j.plan(LaneSparseBlocks(), source=r)
        ws = j.new_workspace()
        o = np.zeros(plan.out_size(j.cells))
        out = np.empty_like(u)
        sc = r.new_buffers()
        NT, calls = int(spec["threads"]), int(spec["calls"])
        fns = {"eval": lambda: j.eval_into(plan, u, p, 0.0, f, o, ws),
               "rhs": lambda: r.eval_into(u, p, 0.0, f, out, sc)}
        wsf = fused_workspace(j, plan)
        if wsf is not None:
            of = np.zeros_like(o)
            fns["eval_fused"] = lambda: j.eval_into(plan, u, p, 0.0, f, of, wsf)
        ts: dict = {k: {1: [], NT: []} for k in fns}
        rounds = 5
        for _ in range(rounds):             # interleaved rounds: load changes hit both counts
            for nt in (1, NT):
                numba.set_num_threads(nt)
                for k, fn in fns.items():
                    fn()
                    fn()
                    for _ in range(calls // rounds):
                        t0 = time.perf_counter()
                        fn()
                        ts[k][nt].append(time.perf_counter() - t0)
        res["layer"] = numba.threading_layer()
        res["calls"] = calls // rounds * rounds
        for k in fns:
            res[k] = {str(nt): statistics.median(v) for nt, v in ts[k].items()}
            res[k + "_min"] = {str(nt): min(v) for nt, v in ts[k].items()}
    elif mode == "stages":
        from esmjac.model.deep import run_deep
        from esmjac.calculus.bandset import BandSet, check_options
        from esmjac.compile.engine import ENGINE_OPTIONS, compile_doc
        from esmjac.compile.evaldoc import jacobian_doc, rhs_doc
        from esmjac.model.layout import model_layout
        from esmjac.model.load import load_view
        t0 = time.perf_counter()
        view = run_deep(load_view, path, None)
        t1 = time.perf_counter()
        bs = BandSet.build(view, wrt="states")
        t2 = time.perf_counter()
        lay = model_layout(view)
        rdoc = rhs_doc(view, lay)
        jdoc = jacobian_doc(bs, lay, rdoc.kind)
        t3 = time.perf_counter()
        kern = compile_doc(jdoc, check_options({}, ENGINE_OPTIONS))
        t4 = time.perf_counter()
        res.update(load_s=t1 - t0, calculus_s=t2 - t1, evaldoc_s=t3 - t2, codegen_s=t4 - t3,
                   engine=kern.engine, n_statements=kern.n_statements, n_fields=len(jdoc.fields),
                   n_bands=len(bs.entries))
    else:
        import numba

        from esmjac.layouts.types import Csr, LaneBlocks, LaneSparseBlocks
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        j = JacobianProgram.build(path)
        res["jac_build_s"] = j.build_seconds
        if mode == "warm":
            res["jac_rebuild_inproc_s"] = JacobianProgram.build(path).build_seconds
        r = None
        if spec.get("rhs", True):
            r = RhsProgram.build(path)
            res["rhs_build_s"] = r.build_seconds
            res["rhs_engine"] = r.kernel.engine
            res["rhs_statements"] = r.kernel.n_statements
            res["rhs_chunks"] = len(r.kernel.chunks)
        if mode == "warm":
            plans = {}
            pl = {}
            for lay in (LaneSparseBlocks(), LaneBlocks(), Csr()):
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    plan = j.plan(lay, source=r)
                    ts.append(time.perf_counter() - t0)
                    if ts[-1] > 2.0:
                        break
                pl[lay.name] = plan
                nnz = int(plan.info["nnz"]) if "nnz" in plan.info else plan.out_size(j.cells)
                plans[lay.name] = (statistics.median(ts), nnz)
            res["plans"] = plans
            numba.set_num_threads(1)
            L = j.cells
            u, f = point(j, 1)
            p = j.p0
            plan = pl["lanesparseblocks"]
            ws = j.new_workspace()
            o = np.zeros(plan.out_size(L))
            j.eval_into(plan, u, p, 0.0, f, o, ws)
            med, mn, k = time_calls(lambda: j.eval_into(plan, u, p, 0.0, f, o, ws), int(spec.get("calls", 50)))
            res["eval"] = {"median_s": med, "min_s": mn, "n_calls": k}
            if spec.get("casadi"):
                try:
                    import peers as pe
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        cp = pe.casadi_peer(path, L=L)
                    if cp is None:
                        res["casadi"] = {"error": buf.getvalue().strip() or "casadi not importable"}
                    else:
                        fe = f if f is not None else np.empty(0)
                        err, _, oj = casadi_vs_csr(cp, j, pl["csr"], u, p, f, L)
                        if not err <= 1e-10:
                            raise AssertionError(f"CasADi differs from eval_into: {err:.3e}")
                        med, mn, k = time_calls(lambda: cp.jac(u, p, fe, oj, L), int(spec.get("calls", 50)))
                        res["casadi"] = {"median_s": med, "min_s": mn, "n_calls": k, "build_s": cp.build_s,
                                         "verify_err": err, "route": cp.info.get("route")}
                except Exception as exc:                 # noqa: BLE001
                    res["casadi"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(MARK + json.dumps(res), flush=True)
    return 0
