"""Kernels at the real workload's size (issue #25 item 4; DESIGN §10 P3, P4).

    python benchmarks/kernels_p3p4.py --mech /path/to/geoschem_fullchem_v1.esm \\
        --superfast /path/to/superfast.esm [--cells 10000] [--calls 20] [--only P3,P3csr,P3order,P4] \\
        [--json results.json]

Neither mechanism is part of this repository (pass their paths; absent, the
part that needs one says so and is skipped).

* **P3 byte bound** — GEOS-Chem fullchem (272 unknowns; ``benchmarks/gcmech.py``)
  lifted to ``--cells`` cells, ``eval_into`` into LaneSparseBlocks (default
  options: the factorisation's 3,849 slots per cell, fill-in zeroed, lane
  tiles of 16) against its byte bound: the bytes a Jacobian evaluation must
  move (every stored slot written once, the state and the per-cell fields
  read once) at bandwidths measured in the same run, interleaved with the
  kernels (a store-only ``fill`` of an array the size of the output, a read
  of one the size of the inputs: ``np.sum``). Two forms of the model: the
  *kinetics* (KPP's split, ``gcmech.split_rates``: the rate coefficients are
  per-cell inputs, the Jacobian is pure mass action — what the leaf runs)
  and *as published* (rate laws evaluated in the kernel, per lane). Also timed:
  the direct-write body alone on the tape (the route before) and on the
  mass-action route (``compile.polyroute``, what ``eval_into`` runs when the
  body is a polynomial), checked first: the tape against Csr bitwise, the
  route against the tape within 1e-13 of the sum of the terms' magnitudes.
* **P3 store order** (``--only P3order``) — the direct-write body eval_into
  runs (stores in slot order, ``tape.in_store_order``) against the same
  instructions in the SSA order (stores at random places of each tile's
  block), bits checked equal, interleaved on one interpreter.
* **P3 Csr vs CasADi** — the same point, ``eval_into`` into Csr against
  CasADi's C route (``peers.casadi_peer``: the per-cell SX Jacobian mapped
  over cells, generated C, ``-O3``; its own pattern), values checked against
  esmjac's Csr first. CasADi is not a dependency: run with it importable.
* **P4 RHS** — SuperFast (EarthSciModels ``components/gaschem/superfast.esm``,
  a mechanism the kernels were not tuned on) lifted to ``--cells`` cells
  (temperature and photolysis per cell), esmjac's RHS against the
  hand-rolled one (``peers.handrolled``: SymPy from the mechanism's
  equations, rate constants hoisted, one ``@njit`` loop over cells), which is
  first checked against earthsci-ast's own evaluation; the two interleaved.
  Also the RHS cut for the mass-action kernel (its tape's rates and
  monomials, ``run_poly`` over all lanes: a measurement, not a route of
  RhsProgram) when it is polynomial.

CPU time per call (``time.thread_time``), one Numba thread, medians over
``--calls`` timed calls taken in interleaved rounds after warm-up calls; the
load average is recorded before and after each part.
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


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def interleaved(fns: dict, calls: int, rounds: int = 8, warm: int = 2) -> dict:
    """name → {"median", "min"} CPU seconds per call over ``calls`` timed calls
    of each, taken in ``rounds`` interleaved passes after ``warm`` warm-up calls."""
    for fn in fns.values():
        for _ in range(warm):
            fn()
    per = max(1, -(-calls // rounds))
    ts: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.thread_time()
                fn()
                ts[k].append(time.thread_time() - t0)
    return {k: {"median": statistics.median(v), "min": min(v), "n": len(v)} for k, v in ts.items()}


# --------------------------------------------------------------------------
# GEOS-Chem fullchem on cells
# --------------------------------------------------------------------------

class GcCells:
    """GEOS-Chem fullchem on ``L`` cells (``form`` "kinetics" or "published"):
    programs, the realworkload benchmark's conditions, the point (u, p, f)."""

    def __init__(self, mech: str, L: int, form: str):
        from esmjac.models.mechanism import lift
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        from gcmech import split_rates
        from realworkload import box_doc, cell_parameters, conditions

        doc = box_doc(mech)
        cellp = cell_parameters(doc)
        F, U, self.info = conditions(doc, cellp, L)
        self.L, self.form = L, form
        t0 = time.process_time()
        if form == "kinetics":
            kin, rates, knames = split_rates(doc)
            (km,) = kin["models"].values()
            kc = [n for n, v in km["variables"].items() if v["type"] == "parameter"
                  and (n in cellp or n in knames)]
            self.doc = lift(kin, L, cell_parameters=kc)
            rp = RhsProgram.build(lift(rates, L, cell_parameters=cellp), options={"progress": False})
            K = np.empty(rp.u_size(L))
            rp.eval_into(np.zeros(rp.u_size(L)), rp.p0, 0.0, np.ascontiguousarray(F.reshape(-1)), K)
            rn = list(rp.layout.states)
            KK = K.reshape(-1, L)
        else:
            self.doc = lift(doc, L, cell_parameters=cellp)
        self.r = RhsProgram.build(self.doc, options={"progress": False})
        self.j = JacobianProgram.build(self.doc, options={"progress": False})
        self.build_cpu_s = time.process_time() - t0
        names = list(self.r.forcing_names)
        rows = []
        for n in names:
            rows.append(KK[rn.index(n)] if form == "kinetics" and n in rn else F[cellp.index(n)])
        self.f = np.ascontiguousarray(np.array(rows).reshape(-1))
        self.u = np.ascontiguousarray(U.reshape(-1))
        self.p = self.r.p0
        self.n = self.j.n_species


def _bytes_bound(plan, cells: GcCells) -> dict:
    L = cells.L
    return {"store_bytes": 8 * plan.out_size(L), "read_bytes": 8 * (cells.u.size + cells.f.size)}


def p3_bound(mech: str, L: int, calls: int, form: str, res: dict) -> GcCells:
    """eval_into LaneSparseBlocks against its byte bound (bandwidths measured here)."""
    from esmjac.layouts.types import Csr, LaneSparseBlocks, untile
    from common import csr_of

    load0 = _load()
    g = GcCells(mech, L, form)
    j, r = g.j, g.r
    plan = j.plan(LaneSparseBlocks(), source=r)
    ws = j.new_workspace(L)
    out = np.zeros(plan.out_size(L))
    j.eval_into(plan, g.u, g.p, 0.0, g.f, out, ws)
    run = j.bind(plan, j.new_workspace(L))
    ob = np.zeros_like(out)
    run(g.u, g.p, 0.0, g.f, ob)
    if not np.array_equal(ob, out):
        raise AssertionError("bound eval_into differs from eval_into")
    # values: LaneSparseBlocks against the Csr route (a gather of the band slab) on 64 lanes
    csr = j.plan(Csr(), source=r)
    oc = np.zeros(csr.out_size(L))
    j.eval_into(csr, g.u, g.p, 0.0, g.f, oc, j.new_workspace(L, keep_slab=True))
    M = csr_of(csr, oc)
    P = int(plan.info["slots_per_lane"])
    order = plan.info.get("ordering", list(range(g.n)))
    keys = [tuple(x) for x in plan.info["lu_pattern"]]
    sel = np.arange(0, L, max(1, L // 64))
    pr = np.array([order[a] for a, _ in keys])[:, None] * L + sel[None, :]
    pc = np.array([order[b] for _, b in keys])[:, None] * L + sel[None, :]
    R = np.asarray(M.tocsr()[pr.ravel(), pc.ravel()]).reshape(len(keys), sel.size)
    # the tape's direct writes (the route before the mass-action kernel) store the Csr route's bits;
    # the mass-action route (compile.polyroute, when the body is a polynomial) its expanded sums
    ft = j.direct_tape(plan)
    route = ft.route()
    W, C = plan.tile_width(L), plan.capacity(L)
    h = np.zeros(max(j.kernel.n_hoist, 1))
    ot = np.zeros_like(out)
    ft.run_tape(g.u, g.p, 0.0, g.f, ot, h, ws.cix, L, W, P, C)
    if not np.array_equal(untile(ot, P, L, W)[:, sel], R):
        raise AssertionError("LaneSparseBlocks (tape) differs from Csr")
    err = 0.0
    if route is not None:           # |route - tape| against the sum of the terms' magnitudes
        sc = _route_scale(route, g.u, g.f, g.p, h, ws.cix, L, W, P, C, ft.zero_slots, out.size)
        err = float(np.max(np.abs(out - ot) / np.maximum(sc, 1e-300)))
        if not err <= 1e-13:
            raise AssertionError(f"LaneSparseBlocks (eval_into) differs from the tape by {err:.2e} of Σ|terms|")
    b = _bytes_bound(plan, g)
    store = np.zeros(plan.out_size(L))
    reads = np.ones((b["read_bytes"]) // 8)
    ob2 = np.zeros_like(out)
    fns = {"eval_into LaneSparseBlocks": lambda: j.eval_into(plan, g.u, g.p, 0.0, g.f, out, ws),
           "bound eval_into LaneSparseBlocks": lambda: run(g.u, g.p, 0.0, g.f, ob),
           "body on the tape (the route before)": lambda: ft.run_tape(g.u, g.p, 0.0, g.f, ot, h, ws.cix, L, W, P, C),
           "store floor (fill of the output's size)": lambda: store.fill(0.0),
           "read floor (sum over the inputs' size)": lambda: reads.sum()}
    if route is not None:
        fns["body on the mass-action route"] = lambda: ft.run(g.u, g.p, 0.0, g.f, ob2, h, ws.cix, L, W, P, C)
    tm = interleaved(fns, calls)
    st = tm["store floor (fill of the output's size)"]["median"]
    rd = tm["read floor (sum over the inputs' size)"]["median"]
    bound = st + rd
    e = tm["eval_into LaneSparseBlocks"]["median"]
    bb = tm["bound eval_into LaneSparseBlocks"]["median"]
    pro, body = j.kernel.tapes if j.kernel.engine == "tape" else (None, None)
    tb = tm["body on the tape (the route before)"]["median"]
    rb = tm["body on the mass-action route"]["median"] if route is not None else None
    res.setdefault("P3", []).append({
        "form": form, "cells": L, "species": g.n, "slots_per_cell": P, "tile": plan.tile_width(L),
        "engine": j.kernel.engine, "mass_action_route": None if route is None else {
            "rate_rows": route.rows, "monomials": route.body.monomials, "terms": route.body.terms,
            "gathered_field_rows": int(route.src.size), "vs_tape_of_sum_abs_terms": err},
        "tape_body_over_bound": tb / bound, "route_body_over_bound": None if rb is None else rb / bound, "tape_instructions": None if body is None else int(len(body.code)),
        "tape_registers": None if body is None else int(body.nreg), "build_cpu_s": g.build_cpu_s,
        **b, "store_GBps": b["store_bytes"] / st / 1e9, "read_GBps": b["read_bytes"] / rd / 1e9,
        "bound_s": bound, "times": tm, "eval_over_bound": e / bound, "bound_call_over_bound": bb / bound,
        "us_per_cell": e / L * 1e6, "load_before": load0, "load_after": _load()})
    print(f"P3 {form} {L} cells: eval_into {e * 1e3:.2f} ms, bound call {bb * 1e3:.2f} ms; byte bound "
          f"{bound * 1e3:.2f} ms (store {b['store_bytes'] / 1e6:.1f} MB at {b['store_bytes'] / st / 1e9:.2f} GB/s, "
          f"read {b['read_bytes'] / 1e6:.1f} MB at {b['read_bytes'] / rd / 1e9:.2f} GB/s): "
          f"{e / bound:.2f}x / {bb / bound:.2f}x the bound; bodies: tape {tb * 1e3:.2f} ms ({tb / bound:.2f}x)"
          + ("" if rb is None else f", mass-action route {rb * 1e3:.2f} ms ({rb / bound:.2f}x; {route.rows} rate rows)")
          + f"; load {load0} -> {_load()}", flush=True)
    return g


def _route_scale(route, u, f, p, h, cix, L, W, P, C, zs, size):
    """Σ|terms| per stored slot: the mass-action route's monomials with
    |coefficients| on |inputs| and |rate rows| (the rounding scale)."""
    from esmjac.compile.engine import NO_SLOTS
    from esmjac.compile.massaction import PolyBody
    from esmjac.compile.polyroute import PolyRoute
    from esmjac.compile.tape import run_tape
    nf, rows = route.n_forcing, route.rows
    R = np.zeros(max(rows, 1) * L)
    if route.rates is not None:
        rt = route.rates
        run_tape(rt.code, rt.consts, u, f, p, 0.0, h, cix, R, L, rt.nreg, 0, 0, L, NO_SLOTS)
    fz = np.concatenate([f[:nf * L], R[:rows * L]])
    b = route.body
    a = np.abs(b.ocoef)
    a.setflags(write=False)
    ab = PolyRoute(None, nf + rows, 0, PolyBody(b.fptr, b.fkind, b.fidx, b.optr, b.omono, a, b.targets),
                   route.src, route.n_states)
    out = np.full(size, np.nan)
    ab.run(np.abs(u), np.abs(fz), np.abs(p), 0.0, np.abs(h), cix, out, L, W, P, C, zs)
    return out


def p3_store_order(g: GcCells, calls: int, res: dict) -> None:
    """The direct-write body with its stores in slot order (what eval_into
    runs: ``tape.in_store_order``) against the same instructions in the SSA
    order (the program's body with only its targets mapped to slots, as
    before), interleaved on one interpreter; the bits checked equal first."""
    from esmjac.compile.engine import NO_SLOTS, _interpreter
    from esmjac.compile.tape import OPS, Tape
    from esmjac.layouts.types import LaneSparseBlocks

    load0 = _load()
    L, j, r = g.L, g.j, g.r
    plan = j.plan(LaneSparseBlocks(), source=r)
    ft = j.direct_tape(plan)
    pro, body = j.kernel.tapes
    code = body.code.copy()
    st = code[:, 0] == OPS.index("store")
    code[st, 2] = np.asarray(plan.arrays["fa"], np.int64)[code[st, 2]]
    ssa = Tape(code, body.consts, body.nreg)
    run = _interpreter(False)
    W, P, C = plan.tile_width(L), int(plan.info["slots_per_lane"]), plan.capacity(L)
    h = np.zeros(max(j.kernel.n_hoist, 1))
    run(pro.code, pro.consts, g.u, g.f, g.p, 0.0, h, np.zeros(1, np.int64), h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    cix = j.new_workspace(L).cix
    outs = {k: np.full(plan.out_size(L), np.nan) for k in ("slot", "ssa")}

    def body_of(t, out):
        return lambda: run(t.code, t.consts, g.u, g.f, g.p, 0.0, h, cix, out, L, t.nreg, W, P, C, ft.zero_slots)
    fns = {"stores in slot order (eval_into's)": body_of(ft.body, outs["slot"]),
           "stores in SSA order (before)": body_of(ssa, outs["ssa"])}
    for fn in fns.values():
        fn()
    if not np.array_equal(outs["slot"], outs["ssa"]) or not np.isfinite(outs["slot"]).all():
        raise AssertionError("slot-ordered and SSA-ordered tapes differ")
    tm = interleaved(fns, calls)
    a = tm["stores in slot order (eval_into's)"]["median"]
    b = tm["stores in SSA order (before)"]["median"]
    res.setdefault("P3order", []).append({
        "form": g.form, "cells": L, "registers_slot": int(ft.body.nreg), "registers_ssa": int(body.nreg),
        "times": tm, "ssa_over_slot": b / a, "load_before": load0, "load_after": _load()})
    print(f"P3 store order {g.form} {L} cells: slot order {a * 1e3:.2f} ms, SSA order {b * 1e3:.2f} ms "
          f"({b / a:.2f}x; registers {ft.body.nreg} vs {body.nreg}); same bits; load {load0} -> {_load()}",
          flush=True)


def p3_casadi(g: GcCells, calls: int, res: dict) -> None:
    """eval_into Csr against CasADi's C route on the same point."""
    import contextlib
    import io

    import peers
    from esmjac.layouts.types import Csr
    from common import casadi_vs_csr

    load0 = _load()
    L, j = g.L, g.j
    buf = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        cp = peers.casadi_peer(g.doc, L=L)
    if cp is None:
        print(f"P3 Csr vs CasADi skipped: {buf.getvalue().strip()}")
        res["P3csr"] = {"skipped": buf.getvalue().strip()}
        return
    build = time.perf_counter() - t0
    csr = j.plan(Csr(), source=g.r)
    err, M, oj = casadi_vs_csr(cp, j, csr, g.u, g.p, g.f, L)
    # 1e-6, not the 1e-10 of small mechanisms: at 272 species CasADi's SX
    # simplification and esmjac's derivation sum a Jacobian entry's terms in
    # different orders, and entries with cancelling terms differ by a few
    # 1e-7 of their row's largest entry (measured 3.9e-7)
    if not err <= 1e-6:
        raise AssertionError(f"CasADi differs from esmjac's Csr: {err:.3e}")
    ws = j.new_workspace(L)
    oc = np.zeros(csr.out_size(L))
    run = j.bind(csr, j.new_workspace(L))
    ob = np.zeros_like(oc)
    tm = interleaved({"casadi C": lambda: cp.jac(g.u, g.p, g.f, oj, L),
                      "eval_into Csr": lambda: j.eval_into(csr, g.u, g.p, 0.0, g.f, oc, ws),
                      "bound eval_into Csr": lambda: run(g.u, g.p, 0.0, g.f, ob)}, calls)
    ca = tm["casadi C"]["median"]
    e = tm["eval_into Csr"]["median"]
    bb = tm["bound eval_into Csr"]["median"]
    res.setdefault("P3csr", []).append({
        "form": g.form, "cells": L, "casadi_nnz_per_cell": cp.nnz, "csr_nnz": int(csr.out_size(L)),
        "casadi_build_s": build, "verify_err": err, "times": tm, "casadi_over_eval": ca / e,
        "casadi_over_bound_call": ca / bb, "load_before": load0, "load_after": _load()})
    print(f"P3 Csr {g.form} {L} cells: eval_into {e * 1e3:.2f} ms, bound {bb * 1e3:.2f} ms, CasADi C "
          f"{ca * 1e3:.2f} ms ({cp.nnz} nnz/cell vs {csr.out_size(L) // L}): CasADi / esmjac = {ca / e:.2f} "
          f"(bound {ca / bb:.2f}); verified {err:.1e}; load {load0} -> {_load()}", flush=True)


# --------------------------------------------------------------------------
# SuperFast RHS against the hand-rolled one
# --------------------------------------------------------------------------

def p4_rhs(path: str, L: int, calls: int, res: dict) -> None:
    import peers
    from cvode_hetero import case
    from esmjac.runtime.programs import RhsProgram

    load0 = _load()
    doc, y0, forcing = case(path, L)
    r = RhsProgram.build(doc, options={"progress": False})
    t0 = time.perf_counter()
    hr = peers.handrolled(doc)
    hr_build = time.perf_counter() - t0
    # the hand-rolled RHS against earthsci-ast's own evaluation first (8 cells)
    err_es = peers.check_rhs_against_earthsci(hr, doc, L=8, seed=0)
    if not err_es <= 1e-12:
        raise AssertionError(f"hand-rolled RHS vs earthsci-ast: {err_es:.3e}")
    u = np.ascontiguousarray(np.concatenate([np.asarray(y0[s], float) for s in r.layout.states]))
    f = np.ascontiguousarray(np.concatenate([np.asarray(forcing[s], float) for s in r.forcing_names]))
    hp = hr.default_p()
    if not np.array_equal(hp, r.p0):
        raise AssertionError("the hand-rolled peer's parameters differ from the program's")
    if list(hr.model.forcing) != list(r.forcing_names) or list(hr.model.species) != list(r.layout.states):
        raise AssertionError("the hand-rolled peer's species/forcing order differs from the program's")
    o1, o2 = np.empty_like(u), np.empty_like(u)
    r.eval_into(u, r.p0, 0.0, f, o1)
    hr.rhs(u, hp, f, o2, L)
    err = float(np.max(np.abs(o1 - o2) / np.maximum(np.abs(o2), 1e-300 + 1e-12 * np.abs(o2).max())))
    if not err <= 1e-10:       # sums with cancelling terms, summed in other orders
        raise AssertionError(f"esmjac RHS vs hand-rolled: {err:.3e}")
    run = r.bind(L)
    o3 = np.empty_like(u)
    fns = {"hand-rolled RHS": lambda: hr.rhs(u, hp, f, o2, L),
           "esmjac eval_into": lambda: r.eval_into(u, r.p0, 0.0, f, o1),
           "esmjac bound RHS": lambda: run(u, r.p0, 0.0, f, o3)}
    ma = _rhs_mass_action(doc, u, r.p0, f, L)
    route = None
    if ma is not None:
        call, o4, route = ma
        call()
        err_ma = float(np.max(np.abs(o4 - o2) / np.maximum(np.abs(o2), 1e-300 + 1e-12 * np.abs(o2).max())))
        if not err_ma <= 1e-10:
            raise AssertionError(f"the RHS on the mass-action kernel vs hand-rolled: {err_ma:.3e}")
        fns["RHS on the mass-action kernel (rates tape + run_poly)"] = call
    tm = interleaved(fns, calls)
    h = tm["hand-rolled RHS"]["median"]
    e = tm["esmjac eval_into"]["median"]
    b = tm["esmjac bound RHS"]["median"]
    res.setdefault("P4", []).append({
        "cells": L, "species": r.n_species, "engine": r.kernel.engine, "handrolled_build_s": hr_build,
        "verify_vs_handrolled": err, "handrolled_vs_earthsci": err_es, "times": tm,
        "eval_over_hand": e / h, "bound_over_hand": b / h, "load_before": load0, "load_after": _load(),
        "mass_action": None if route is None else {
            "rate_rows": route.rows, "monomials": route.body.monomials, "terms": route.body.terms,
            "over_hand": tm["RHS on the mass-action kernel (rates tape + run_poly)"]["median"] / h}})
    print(f"P4 SuperFast {L} cells: esmjac eval_into {e * 1e6:.1f} us, bound {b * 1e6:.1f} us, hand-rolled "
          f"{h * 1e6:.1f} us: {e / h:.2f}x / {b / h:.2f}x; verified {err:.1e} (hand vs earthsci-ast "
          f"{err_es:.1e}); load {load0} -> {_load()}", flush=True)
    if route is not None:
        m = tm["RHS on the mass-action kernel (rates tape + run_poly)"]["median"]
        print(f"P4 SuperFast {L} cells on the mass-action kernel ({route.rows} rate rows, {route.body.monomials} "
              f"monomials): {m * 1e6:.1f} us, {m / h:.2f}x the hand-rolled", flush=True)


def _rhs_mass_action(doc, u, p, f, L):
    """The RHS of ``doc`` as rates + monomials (its tape cut by
    ``compile.polyroute``; a measurement, not a route of RhsProgram):
    ``(call, out, route)`` with the rate rows computed by the rates tape into
    rows after a copy of the forcing, then ``run_poly`` lanes-fastest over all
    lanes, or None when the RHS is not polynomial over state-free rows."""
    from esmjac.compile.engine import NO_SLOTS, _interpreter
    from esmjac.compile.massaction import BLOCK, PolyBody, run_poly, scratch_size
    from esmjac.compile.polyroute import cut
    from esmjac.runtime.programs import RhsProgram
    rt = RhsProgram.build(doc, options={"progress": False, "engine": "tape"})
    pro, body = rt.kernel.tapes
    route = cut(body)
    if route is None:
        return None
    b, nf, rows = route.body, route.n_forcing, route.rows
    isf = (b.fkind == 1) | (b.fkind == 5)
    fidx = b.fidx.copy()
    fidx[isf] = route.src[b.fidx[isf]]             # back to rows of [forcing; rate rows]
    fidx.setflags(write=False)
    pb = PolyBody(b.fptr, b.fkind, fidx, b.optr, b.omono, b.ocoef, b.targets)
    arrs = pb.arrays()
    run = _interpreter(True)
    h = np.zeros(max(rt.kernel.n_hoist, 1))
    cix = np.zeros(1, np.int64)
    fz = np.zeros((nf + rows) * L)
    R = fz[nf * L:]
    sc = np.empty(scratch_size(pb, 0))
    out = np.empty_like(u)
    rates = route.rates

    def call():
        run(pro.code, pro.consts, u, f, p, 0.0, h, cix, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
        fz[:nf * L] = f[:nf * L]
        if rates is not None:
            run(rates.code, rates.consts, u, f, p, 0.0, h, cix, R, L, rates.nreg, 0, 0, L, NO_SLOTS)
        run_poly(*arrs, u, fz, h, p, out, L, 0, 0, L, NO_SLOTS, BLOCK, sc)
    return call, out, route


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mech", default=os.environ.get("ESMJAC_GC_MECH", "geoschem_fullchem_v1.esm"))
    ap.add_argument("--superfast", default=os.environ.get("ESMJAC_SUPERFAST"))
    ap.add_argument("--cells", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--forms", default="kinetics,published")
    ap.add_argument("--only", default="P3,P3csr,P4")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    import numba
    numba.set_num_threads(1)
    only = set(a.only.split(","))
    res: dict = {"argv": sys.argv[1:], "load_start": _load(),
                 "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if only & {"P4"}:
        if a.superfast and Path(a.superfast).is_file():
            p4_rhs(a.superfast, a.cells, a.calls * 5, res)
        else:
            print("P4 skipped: pass --superfast PATH (EarthSciModels components/gaschem/superfast.esm)")
    if only & {"P3", "P3csr", "P3order"}:
        if not Path(a.mech).is_file():
            print(f"P3 skipped: {a.mech} not found (pass --mech, see benchmarks/gcmech.py)")
        else:
            for form in a.forms.split(","):
                if "P3" in only:
                    g = p3_bound(a.mech, a.cells, a.calls, form, res)
                else:
                    g = GcCells(a.mech, a.cells, form)
                if "P3order" in only:
                    p3_store_order(g, a.calls, res)
                if "P3csr" in only:
                    p3_casadi(g, a.calls, res)
                del g
    res["load_end"] = _load()
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
