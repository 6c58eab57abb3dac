"""The leaf's hoisted bodies on GEOS-Chem fullchem: the mass-action kernel
(esmjac.compile.massaction.run_poly) against the lane tape
(esmjac.integrators.lanetape.run_fused), per lane per call.

    python benchmarks/lanepoly_micro.py [--mech PATH] [--lanes 64] [--calls 200] [--leaf-cells 1000 --rounds 4]

Both kernels run on the same hoisted inputs (plausible per-cell conditions
from benchmarks/realworkload.py, the leaf's own lane prologue), one thread,
CPU time (``time.thread_time``) of each call, the two routes interleaved
call by call; the load average is recorded. Values are checked first: the
kernel against the tape to 1e-13 of the sum of the terms' magnitudes (the
kernel's expanded sums round differently), and the NaN pattern must agree.
Also reported: the expansion's CPU time at build (:func:`massaction.expand`
on both bodies), monomials and terms against the tape's instructions.

``--leaf-cells N``: then the whole leaf on N cells, one 20-minute advance,
the two kernels in two leaves of one process (``bound.POLY`` on / off at
their first advance), advances alternating, the order swapped every round;
µs per cell-step (CPU), results compared (within 1e-6 of the tolerance).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent)) if __name__ == "__main__" else None  # noqa: E702


def hoisted_inputs(doc, L: int):
    """The leaf's hoisted bodies on ``L`` lanes of the benchmark's conditions,
    as the leaf binds them (:mod:`esmjac.integrators.bound`): ``(leaf, hoist,
    direct Jacobian tape, u, fz, hr, hj, cix)`` with the forcing and rate rows
    in ``fz`` and the prologues' values in ``hr``/``hj``; None when nothing is
    hoisted. Shared with ``poly_counts.py``."""
    from realworkload import cell_parameters, conditions, lifted

    from esmjac.adapters.native import rosenbrock
    from esmjac.compile.engine import NO_SLOTS, run_tapes
    from esmjac.compile.tape import run_tape
    from esmjac.compile.twins import serial_twin
    from esmjac.integrators.bound import lane_hoist
    leaf = rosenbrock(lifted(doc, 1), rtol=1e-3, threads=1, options={"progress": False})
    hz = lane_hoist(leaf, leaf.plan)
    if hz is None:
        return None
    F, U, _ = conditions(doc, cell_parameters(doc), L)
    u = np.ascontiguousarray(U.reshape(-1))
    rhs, jac = leaf.rhs_program, leaf.jac_program
    run = serial_twin(run_tape)
    nfu = len(rhs.forcing_names)
    fz = np.zeros((nfu + hz.rows) * L)
    fz[:nfu * L] = F.reshape(-1)
    cix = np.zeros(1, np.int64)
    ft = jac.direct_tape(leaf.plan)
    hr, hj = np.zeros(max(rhs.kernel.n_hoist, 1)), np.zeros(max(jac.kernel.n_hoist, 1))
    for pro, cut, h in ((rhs.kernel.tapes[0], hz.rhs, hr), (ft.prologue, hz.jac, hj)):
        if cut.prologue is not None:
            run_tapes(run, (pro, cut.prologue), fz, fz, leaf.p, 0.0, h, cix, fz, L)
        run(pro.code, pro.consts, u, fz, leaf.p, 0.0, h, cix, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    return leaf, hz, ft, u, fz, hr, hj, cix


def main(argv=None):
    from realworkload import DEFAULT_MECH, box_doc, emit_json

    from esmjac.compile.engine import NO_SLOTS
    from esmjac.compile.polyroute import tape_ssa as _ssa
    from esmjac.compile.massaction import BLOCK, UNTILED_BLOCK, PolyBody, expand, run_poly, scratch_size
    from esmjac.integrators.lanetape import run_fused

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mech", default=os.environ.get("ESMJAC_GC_MECH", DEFAULT_MECH))
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--leaf-cells", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if not Path(a.mech).exists():
        print(f"lanepoly_micro: skipped — no mechanism at {a.mech}", file=sys.stderr)
        return 0
    doc = box_doc(a.mech)
    L = a.lanes
    got = hoisted_inputs(doc, L)
    if got is None:
        print("lanepoly_micro: the leaf's programs are not taped (nothing hoisted)", file=sys.stderr)
        return 1
    leaf, hz, ft, u, fz, hr, hj, cix = got
    res = {"mech": a.mech, "lanes": L, "calls": a.calls, "load_start": round(os.getloadavg()[0], 2)}
    P, W, C = int(leaf.plan.info["slots_per_lane"]), leaf.plan.tile_width(L), leaf.plan.capacity(L)
    zs = ft.zero_slots
    p = leaf.p
    for name, cut, h, size, tiled in (("rhs", hz.rhs, hr, u.size, False), ("jacobian", hz.jac, hj, P * C, True)):
        ins, stores = _ssa(cut.body)
        t0 = time.process_time()
        pb = expand(ins, stores, cut.scheduled.code.shape[0])
        ex = time.process_time() - t0
        if pb is None:
            res[name] = {"expanded": False, "expand_cpu_s": ex}
            continue
        Bk = BLOCK if tiled else UNTILED_BLOCK          # as the leaf binds them (integrators.bound)
        sc = np.empty(scratch_size(pb, W if tiled else 0, Bk))
        tp = cut.scheduled
        Wt, Pt, Ct, zt = (W, P, C, zs) if tiled else (0, 0, L, NO_SLOTS)

        def tape(out, tp=tp, h=h, Wt=Wt, Pt=Pt, Ct=Ct, zt=zt):
            run_fused(tp.code, tp.consts, u, fz, p, 0.0, h, cix, out, L, tp.nreg, Wt, Pt, Ct, zt)

        def poly(out, pb=pb, h=h, Wt=Wt, Pt=Pt, Ct=Ct, zt=zt, sc=sc, Bk=Bk):
            run_poly(*pb.arrays(), u, fz, h, p, out, L, Wt, Pt, Ct, zt, Bk, sc)

        o1, o2 = np.full(size, np.nan), np.full(size, np.nan)
        tape(o1)
        poly(o2)
        ab = PolyBody(pb.fptr, pb.fkind, pb.fidx, pb.optr, pb.omono, np.abs(pb.ocoef), pb.targets)
        scale = np.zeros(size)
        run_poly(*ab.arrays(), np.abs(u), np.abs(fz), np.abs(h), np.abs(p), scale, L, Wt, Pt, Ct, zt, Bk, sc)
        fin = np.isfinite(o1)
        ok = bool(np.array_equal(fin, np.isfinite(o2)))
        dev = float(np.max(np.abs(o1 - o2)[fin] / np.maximum(scale[fin], 1e-300)))
        if not ok or dev > 1e-13:
            raise SystemExit(f"{name}: kernel differs from the tape (finite pattern {ok}, {dev:.3g} of the terms)")
        ta, tb = [], []
        for _ in range(a.calls):
            t0 = time.thread_time()
            tape(o1)
            ta.append(time.thread_time() - t0)
            t0 = time.thread_time()
            poly(o2)
            tb.append(time.thread_time() - t0)
        us = 1e6 / L
        res[name] = {"expanded": True, "expand_cpu_s": ex, "tape_instructions": int(tp.code.shape[0]),
                     "tape_registers": int(tp.nreg), "monomials": pb.monomials, "monomial_factors": int(pb.fkind.size),
                     "output_terms": int(pb.omono.size), "max_dev_of_terms": dev,
                     "tape_us_per_lane_best": min(ta) * us, "tape_us_per_lane_median": statistics.median(ta) * us,
                     "poly_us_per_lane_best": min(tb) * us, "poly_us_per_lane_median": statistics.median(tb) * us,
                     "speedup_best": min(ta) / min(tb), "speedup_median": statistics.median(ta) / statistics.median(tb)}
        print(name, json.dumps(res[name]), file=sys.stderr, flush=True)
    if a.leaf_cells:
        res["leaf"] = _leaf_ab(doc, a.leaf_cells, a.rounds)
        print("leaf", json.dumps(res["leaf"]), file=sys.stderr, flush=True)
    res["load_end"] = round(os.getloadavg()[0], 2)
    return emit_json(res, a.out)


def _leaf_ab(doc, L: int, rounds: int) -> dict:
    """The leaf on ``L`` cells with the bodies on the kernel and on the tape,
    interleaved (module docstring)."""
    from realworkload import DT, cell_parameters, conditions, lifted

    from esmjac.adapters.native import rosenbrock
    from esmjac.integrators import bound
    F, U, _ = conditions(doc, cell_parameters(doc), L)
    u0, fz = np.ascontiguousarray(U.reshape(-1)), np.ascontiguousarray(F.reshape(-1))
    leaves, finals = {}, {}
    old = bound.POLY
    try:
        for key, flag in (("poly", True), ("tape", False)):
            bound.POLY = flag
            lf = rosenbrock(lifted(doc, 1), rtol=1e-3, threads=1, options={"progress": False})
            v = u0.copy()
            st = lf.advance(v, 0.0, DT, forcing=fz)         # binds the kernels (scratch for L lanes)
            if not st.success:
                raise SystemExit(f"leaf ({key}) failed: {st.message}")
            leaves[key], finals[key] = (lf, int(st.nsteps.sum())), v
    finally:
        bound.POLY = old
    tol = np.repeat(np.asarray(leaves["tape"][0].atol), L) + 1e-3 * np.abs(finals["tape"])
    diff = float(np.max(np.abs(finals["poly"] - finals["tape"]) / tol))
    if diff > 1e-6:
        raise SystemExit(f"leaf: kernel and tape differ by {diff:.3g} of the tolerance")
    cpu: dict = {"poly": [], "tape": []}
    loads = []
    for r in range(rounds):
        for key in (("poly", "tape") if r % 2 == 0 else ("tape", "poly")):
            lf, _ = leaves[key]
            v = u0.copy()
            loads.append(round(os.getloadavg()[0], 2))
            t0 = time.thread_time()
            lf.advance(v, 0.0, DT, forcing=fz)
            cpu[key].append(time.thread_time() - t0)
            if not np.array_equal(v, finals[key]):
                raise SystemExit(f"leaf ({key}) not deterministic run to run")
    out = {"cells": L, "rounds": rounds, "loads": loads, "max_diff_in_tolerances": diff}
    for key, (_, att) in leaves.items():
        out[key] = {"attempts": att, "us_per_cell_step": [c / att * 1e6 for c in cpu[key]],
                    "best": min(cpu[key]) / att * 1e6, "median": statistics.median(cpu[key]) / att * 1e6}
    out["speedup_best"] = out["tape"]["best"] / out["poly"]["best"]
    out["speedup_median"] = out["tape"]["median"] / out["poly"]["median"]
    return out


if __name__ == "__main__":
    sys.exit(main())
