"""The measurements behind the README's "Performance notes".

    python benchmarks/perf_notes.py [--cells-scipy 1000] [--cells-cvode 100]

Gridded tropo12 (15 species per cell, per-cell photolysis and initial state;
``esmjac.models.gridded``), two hours of chemistry, rtol=1e-6, atol=1e3
molecules cm^-3. Every configuration solves the same problem once after a
warm-up build; wall time per solve (numba and BLAS worker threads are part
of what is measured, so CPU time of one thread would hide them), with the
load average before each line. SciPy's BLAS thread count is fixed when
NumPy loads, so each SciPy line runs in its own process with
``OPENBLAS_NUM_THREADS`` set or unset.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

SPAN, RTOL, ATOL = (0.0, 7200.0), 1e-6, 1e3


def _scipy_one(cells: int, threads, fd: str) -> dict:
    from esmjac.adapters.scipy import ivp
    from esmjac.models.gridded import gridded_tropo12
    doc, forcing, y0 = gridded_tropo12(cells)
    prob = ivp(doc, forcing=forcing, y0=y0, threads=threads)
    kw = dict(rtol=RTOL, atol=ATOL)
    if fd == "sparsity":
        kw.update(jac=None, jac_sparsity=prob.jac_sparsity)
    t0 = time.perf_counter()
    sol = prob.solve(SPAN, **kw)
    return {"wall": time.perf_counter() - t0, "ok": bool(sol.success), "y": sol.y[:, -1].tolist()}


def _cvode_one(cells: int, **kw) -> dict:
    from esmjac.adapters.sundials import cvode
    from esmjac.models.gridded import gridded_tropo12
    doc, forcing, y0 = gridded_tropo12(cells)
    prob = cvode(doc, forcing=forcing, y0=y0, rtol=RTOL, atol=ATOL, max_steps=100000, **kw)
    t0 = time.perf_counter()
    res = prob.solve(np.linspace(*SPAN, 3))
    return {"wall": time.perf_counter() - t0, "ok": res.flag == 0, "y": res.values.y[-1].tolist(),
            "linsolver": prob.linsolver, "precond": prob.precond}


def _child(spec: dict) -> dict:
    env = dict(os.environ)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if spec.pop("blas1", False):
        env["OPENBLAS_NUM_THREADS"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells-scipy", type=int, default=1000)
    ap.add_argument("--cells-cvode", type=int, default=100)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        fn = _scipy_one if spec.pop("what") == "scipy" else _cvode_one
        print(json.dumps(fn(**spec)))
        return 0
    rows = []
    n = args.cells_scipy
    scipy_specs = [
        (f"SciPy BDF, exact Jacobian, {n} cells, OpenBLAS default threads", dict(threads="auto", fd="exact")),
        (f"SciPy BDF, exact Jacobian, {n} cells, OPENBLAS_NUM_THREADS=1", dict(threads="auto", fd="exact", blas1=True)),
        (f"SciPy BDF, exact Jacobian, {n} cells, threads=1", dict(threads=1, fd="exact", blas1=True)),
        (f"SciPy BDF, FD + jac_sparsity, {n} cells, OPENBLAS_NUM_THREADS=1", dict(threads="auto", fd="sparsity", blas1=True)),
        (f"SciPy BDF, FD + jac_sparsity, {n} cells, OpenBLAS default threads", dict(threads="auto", fd="sparsity")),
    ]
    for label, spec in scipy_specs:
        load = os.getloadavg()[0]
        r = _child({"what": "scipy", "cells": n, **spec})
        rows.append((label, r["wall"], load, r["ok"]))
        print(f"{label:70s} {r['wall']:8.2f} s  (load {load:.1f}){'' if r['ok'] else '  FAILED'}", flush=True)
    m = args.cells_cvode
    cvode_specs = [
        (f"CVODE auto (spgmr + block), {m} cells", dict()),
        (f"CVODE spgmr + block, jtimes='setup', {m} cells",
         dict(linsolver="spgmr", precond="block", jtimes="setup")),
        (f"CVODE dense, {m} cells", dict(linsolver="dense")),
    ]
    for label, spec in cvode_specs:
        load = os.getloadavg()[0]
        r = _child({"what": "cvode", "cells": m, **spec})
        rows.append((label, r["wall"], load, r["ok"]))
        print(f"{label:70s} {r['wall']:8.2f} s  (load {load:.1f}){'' if r['ok'] else '  FAILED'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
