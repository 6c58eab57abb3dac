"""End to end: solve_ivp BDF with the analytic Jacobian and with finite
differences, the native Rosenbrock leaf, CVODE GMRES with and without the
block preconditioner. Each function takes ``ctx``, the run's
:class:`common.Bench`.
"""
from __future__ import annotations

import json
import statistics
import time

import numpy as np

from common import E2E_ATOL, E2E_RTOL, E2E_CELLS, E2E_T_END, TROPO12, resize_set


def run_e2e(ctx) -> None:
    from esmjac.adapters.scipy import ivp
    doc = resize_set(json.loads(TROPO12.read_text()), {"cell": E2E_CELLS})
    rng = np.random.default_rng(42)
    fj = np.linspace(0.1, 1.5, E2E_CELLS)
    base = ivp(doc)
    y0 = base.y0 * rng.uniform(0.5, 2.0, base.y0.shape)
    prob = ivp(doc, method="BDF", forcing={"fj": fj}, y0=y0)
    prob.jac(0.0, prob.y0)
    span = (0.0, E2E_T_END)
    reps = 1 if ctx.quick else 3
    n = prob.n
    t0 = time.perf_counter()
    ref = prob.solve(span, rtol=1e-9, atol=1e-4)
    ctx.log(f"  reference (BDF + analytic J, rtol 1e-9, atol 1e-4): {time.perf_counter() - t0:.2f} s, "
             f"status {ref.status}")
    yref = ref.y[:, -1]

    def err_of(y):
        return float(np.max(np.abs(np.asarray(y) - yref) / (E2E_ATOL + E2E_RTOL * np.abs(yref))))

    def rel_of(y):
        return float(np.max(np.abs(np.asarray(y) - yref) / np.maximum(np.abs(yref), 1e3)))

    def timed(label, make_run, finish):
        try:
            ts, last = [], None
            for _ in range(reps):
                t0 = time.perf_counter()
                last = make_run()
                ts.append(time.perf_counter() - t0)
            info = finish(last)
            ctx.add("e2e", "tropo12", label, info.pop("layout"), "float64", E2E_CELLS, 1,
                     statistics.median(ts), min_s=min(ts), n_calls=reps, unknowns=n,
                     rtol=E2E_RTOL, atol=E2E_ATOL, t_end=E2E_T_END, **info)
        except NotImplementedError as exc:
            ctx.skip(f"e2e {label}", f"NotImplementedError: {exc}")
        except Exception as exc:                     # noqa: BLE001
            ctx.skip(f"e2e {label}", f"{type(exc).__name__}: {exc}")

    def ivp_info(sol, layout):
        return {"layout": layout, "status": int(sol.status), "nsteps": int(sol.t.size - 1),
                "nfev": int(sol.nfev), "njev": int(sol.njev), "nlu": int(sol.nlu),
                "err_vs_ref": err_of(sol.y[:, -1]), "rel_err_vs_ref": rel_of(sol.y[:, -1])}

    timed("solve_ivp BDF + esmjac sparse J",
          lambda: prob.solve(span, rtol=E2E_RTOL, atol=E2E_ATOL), lambda s: ivp_info(s, "csc"))
    timed("solve_ivp BDF + FD (jac_sparsity)",
          lambda: prob.solve(span, rtol=E2E_RTOL, atol=E2E_ATOL, jac=None, jac_sparsity=prob.jac_sparsity),
          lambda s: ivp_info(s, "fd-grouped"))

    try:
        from esmjac.adapters.native import rosenbrock
        rb = rosenbrock(doc, forcing=np.ascontiguousarray(fj, dtype=np.float64))
        timed("native Rosenbrock (rodas3)",
              lambda: rb.solve(span, y0=y0, rtol=E2E_RTOL, atol=E2E_ATOL),
              lambda res: {"layout": "lanesparseblocks", "status": 0 if res.success else -1,
                           "nsteps": int(res.nsteps), "nfev": int(res.nfev), "njev": int(res.njev),
                           "nlu": int(res.ndec), "err_vs_ref": err_of(res.y), "rel_err_vs_ref": rel_of(res.y),
                           "message": res.message})
    except Exception as exc:                         # noqa: BLE001
        ctx.skip("e2e native Rosenbrock", f"{type(exc).__name__}: {exc}")

    try:
        from esmjac.adapters import sundials
    except Exception as exc:                         # noqa: BLE001
        ctx.skip("e2e CVODE", f"esmjac.adapters.sundials: {type(exc).__name__}: {exc}")
        return
    tout = np.array([0.0, E2E_T_END])
    for label, pc in (("CVODE BDF GMRES + esmjac J·v", None),
                      ("CVODE BDF GMRES + J·v + block precond", "block")):
        try:
            cv = sundials.cvode(doc, linsolver="spgmr", precond=pc, rtol=E2E_RTOL, atol=E2E_ATOL,
                                forcing={"fj": fj}, y0=y0, max_steps=100_000)
        except NotImplementedError as exc:
            ctx.skip(f"e2e {label}", f"NotImplementedError: {exc}")
            continue
        except Exception as exc:                     # noqa: BLE001
            ctx.skip(f"e2e {label}", f"{type(exc).__name__}: {exc}")
            continue

        def cv_info(res, cv=cv, pc=pc):
            if res.flag != 0:
                raise RuntimeError(f"CVODE flag {res.flag}: {res.message}")
            st = cv.stats()
            return {"layout": "csr" + ("+laneblocks" if pc else ""), "status": int(res.flag),
                    "nsteps": int(st.get("NumSteps", -1)), "nfev": int(cv.nfev),
                    "njev": int(cv.counters().get("njtsetup", 0)),
                    "nlin": int(st.get("NumLinIters", -1)), "npsolve": int(cv.counters().get("npsolve", 0)),
                    "err_vs_ref": err_of(np.asarray(res.values.y)[-1]),
                    "rel_err_vs_ref": rel_of(np.asarray(res.values.y)[-1]), "maxl": "default (5)"}

        def once(cv=cv):
            cv.reset_counters()
            return cv.solve(tout)
        timed(label, once, cv_info)
