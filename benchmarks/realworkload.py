"""The real workload (issue #25, DESIGN §10 P1): GEOS-Chem fullchem on 10³–10⁵ cells.

    python benchmarks/realworkload.py [--mech PATH] [--cells 1000,10000] [--reps 2]
                                      [--rtol 1e-3] [--cvode-cells 64] [--out results-rw.json]

``--mech`` (or ``$ESMJAC_GC_MECH``; default ``geoschem_fullchem.esm`` in the current folder)
is the published EarthSciML/EarthSciModels file (esm 0.4.0
``reaction_systems``; never vendored) or its conversion
(``benchmarks/gcmech.py``); absent, the benchmark says so and exits 0.

Per-cell conditions (seeded, plausible; :func:`conditions`): temperature
260–300 K, pressure 500–1013 hPa (``num_density = P/(R T)`` in mol m⁻³, the
mechanism's unit), solar zenith angle 0–180° — a cell whose angle is ≥ 90°
is night (every ``j_* = 0``), by day ``j = j_noon · cos(SZA)`` with clear-sky
noon values by photolysed species (NO2 8e-3 s⁻¹, NO3 0.17/0.02, O3→O(¹D)
3e-5, …, 1e-5 for the rest); aerosol mass-transfer ``k_mt*`` and cloud
``k_cld*`` uptake rates > 0. The published defaults of all of these are 0,
and with the published species defaults (SALAAL, SALCAL, SO2 = 0) the rate
laws ``k_mt1/SALAAL`` (R1), ``k_mt4/SALCAL`` (R4) and ``k_cld6/SO2`` (R12)
are 0/0 = NaN: a new user's first run produces NaN. Here every species the
source leaves at 0 starts at 1e-2 ppb (scaled per cell by 10^U(−½, ½) like
every other species), so those divisions are finite. One 20-minute chemistry
step (``leaf.advance(u, 0, 1200)``), ``rtol`` 1e-3, one thread.

Definitions. A *cell-step* is one step attempt of one cell (what KPP's and
MICM's per-step figures count: one Jacobian, one factorisation, the stages'
solves and right-hand sides); "per 20 min" is per cell per chemistry step.
Parts: every call the leaf's step driver makes from Python — RHS, Jacobian,
LU (with ``I/(hγ) − J``), the stage solves (each with its right-hand side
combination and the next stage's argument fused in), error norm + step
control, lane compaction, gathers, the rate rows — timed in place during
one more, traced, run (benchmarks/leaf.py ``StepParts``: ``thread_time``
around each call, less the calibrated cost of an empty interval); "driver
Python" is that traced run's own total less its parts and the wrappers'
calibrated cost: the driver's Python between calls (each part includes its
own call's dispatch). ``untraced_minus_parts`` (the timed total less the
parts) differs from it by run-to-run variation. Engines: ``rhs_engine``/``jac_engine`` say what runs the bodies
in the step (with hoisted rates: ``poly``, the mass-action kernel, or the
lane tape), ``program_engines`` the programs' own. Accuracy:
max relative error over species above 1e3·atol against a tight BDF solve
(``solve_ivp`` BDF, esmjac's exact sparse Jacobian, rtol 1e-7) of sampled
cells. Byte and flop bounds per cell-step: the LU (Markowitz order with
fill-in; one division per multiplier, one multiply-subtract per update) and
the stages' solves in flops, and the slots a step must write and read once
(J, the iteration matrix, stage vectors) in bytes, against the measured
streaming bandwidth of this machine (a NumPy copy) and its scalar double
peak.

Anchors (measured on this machine class by the issue's author, one thread,
quoted from DESIGN §10 — not vendored, not rerun here): KPP 3.x Rodas3 on
GEOS-Chem fullchem (291 species) ≈ 100 µs per cell-step; NCAR MICM 3.13 on
TS1 (209 species) 41 µs per cell-step at 64 cells, 98–128 µs at 1,024.

CVODE (BDF, GMRES with esmjac's block preconditioner) runs on the first
``--cvode-cells`` cells (its cost per cell grows with the grid; measured
where it runs in reasonable time).
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

DT = 1200.0
R_GAS = 8.314462618
DEFAULT_MECH = "geoschem_fullchem.esm"       # in the current folder: no machine's path
ANCHORS = [
    {"route": "KPP 3.x Rodas3 (anchor, GEOS-Chem fullchem 291 sp., 1 cell/call)", "us_per_cell_step": 100.0},
    {"route": "NCAR MICM 3.13 (anchor, TS1 209 sp., 64 cells vector4)", "us_per_cell_step": 41.0},
    {"route": "NCAR MICM 3.13 (anchor, TS1 209 sp., 1,024 cells)", "us_per_cell_step": "98-128"},
]
#: Clear-sky noon photolysis frequencies (s⁻¹) by photolysed species (and,
#: where a species has two channels, by j index); everything else 1e-5.
J_NOON = {"NO2": 8e-3, "O3": {2: 4e-4, 3: 3e-5}, "NO3": {12: 0.17, 13: 0.02}, "HNO2": 1.5e-3,
          "H2O2": 7e-6, "CH2O": {7: 3e-5, 8: 4e-5}, "MP": 5e-6, "HNO3": 6e-7, "N2O5": 3e-5,
          "HNO4": 1e-5, "O2": 1e-11, "ClNO3": 3e-5, "Cl2": 2e-3, "Br2": 3e-2, "BrO": 4e-2, "IO": 0.1,
          "I2": 0.1, "HOBr": 2e-3, "HOCl": 2e-4, "ClNO2": 3e-4, "HOI": 5e-3, "GLYX": 8e-5, "MGLY": 1e-4}
J_DEFAULT = 1e-5


def _cpu(fn):
    t0 = time.thread_time()
    r = fn()
    return time.thread_time() - t0, r


def _load():
    return round(os.getloadavg()[0], 2)


# --------------------------------------------------------------------------
# the document and the conditions
# --------------------------------------------------------------------------

def box_doc(path: str) -> dict:
    """The scalar box model (converted from the published file when needed)."""
    doc = json.loads(Path(path).read_text())
    if "reaction_systems" in doc:
        from gcmech import box_document
        doc = box_document(doc)
    return doc


def cell_parameters(doc: dict) -> list:
    """The parameters that vary per cell: T, num_density, photolysis, uptake."""
    (m,) = doc["models"].values()
    return [n for n, v in m["variables"].items() if v["type"] == "parameter"
            and (n in ("T", "num_density") or n.startswith(("j_", "k_mt", "k_cld")))]


def _photolysed(doc: dict) -> dict:
    """j name → the species it photolyses (from the rate terms ``j_k * X``)."""
    (m,) = doc["models"].values()
    out = {}

    def walk(e):
        if isinstance(e, dict):
            a = e.get("args", [])
            if e.get("op") == "*" and len(a) >= 2:
                js = [x for x in a if isinstance(x, str) and x.startswith("j_")]
                sp = [x for x in a if isinstance(x, str) and not x.startswith("j_")
                      and m["variables"].get(x, {}).get("type") in ("unknown", "parameter")]
                if len(js) == 1 and sp:
                    out.setdefault(js[0], sp[-1])
            for x in a:
                walk(x)
    for eq in m["equations"]:
        walk(eq["rhs"])
    return out


def conditions(doc: dict, names: list, L: int, seed: int = 0) -> tuple:
    """(forcing (len(names), L), initial states (n, L) in the document's species
    order, info) for ``L`` cells."""
    rng = np.random.default_rng(seed)
    T = rng.uniform(260.0, 300.0, L)
    P = rng.uniform(50_000.0, 101_325.0, L)
    nd = P / (R_GAS * T)
    sza = rng.uniform(0.0, 180.0, L)
    mu = np.maximum(np.cos(np.radians(sza)), 0.0)
    phot = _photolysed(doc)
    F = np.empty((len(names), L))
    for i, n in enumerate(names):
        if n == "T":
            F[i] = T
        elif n == "num_density":
            F[i] = nd
        elif n.startswith("j_"):
            sp = phot.get(n)
            v = J_NOON.get(sp, J_DEFAULT)
            if isinstance(v, dict):
                v = v.get(int(n[2:]), J_DEFAULT)
            F[i] = v * mu
        elif n.startswith("k_mt"):
            F[i] = 10 ** rng.uniform(-7.0, -5.0, L)     # mass transfer, per ppb per s
        else:
            F[i] = 10 ** rng.uniform(-7.0, -5.0, L)     # cloud uptake
    (m,) = doc["models"].values()
    species = [n for n, v in m["variables"].items() if v["type"] == "unknown"]
    base = np.array([float(m["variables"][s]["default"]) or 1e-2 for s in species])
    U = base[:, None] * 10 ** rng.uniform(-0.5, 0.5, (len(species), L))
    info = {"night_cells": int(np.sum(mu == 0.0)), "T_range": [float(T.min()), float(T.max())],
            "num_density_range": [float(nd.min()), float(nd.max())],
            "zero_default_species_set_to_1e-2": int(np.sum(base == 1e-2))}
    return np.ascontiguousarray(F), np.ascontiguousarray(U), info


def lifted(doc: dict, k: int) -> dict:
    from esmjac.models.mechanism import lift
    return lift(doc, k, cell_parameters=cell_parameters(doc))


# --------------------------------------------------------------------------
# reference and routes
# --------------------------------------------------------------------------

def reference(doc: dict, idx, U, F, rtol_ref: float = 1e-8):
    """Tight BDF (exact sparse Jacobian) on cells ``idx``: (n, k) final states."""
    from esmjac.adapters.scipy import ivp
    k = len(idx)
    y0 = np.ascontiguousarray(U[:, idx].reshape(-1))
    prob = ivp(lifted(doc, k), y0=y0, threads=1, forcing=np.ascontiguousarray(F[:, idx].reshape(-1)),
               build_options={"progress": False})
    sol = prob.solve((0.0, DT), rtol=rtol_ref, atol=rtol_ref * 1e-6 * np.maximum(np.abs(y0), 1e-2))
    if not sol.success:
        raise RuntimeError(f"reference BDF failed: {sol.message}")
    return sol.y[:, -1].reshape(-1, k)


def rel_err(y, ref, atol_s):
    big = np.abs(ref) > 1e3 * atol_s[:, None]
    return float(np.max(np.abs(y - ref)[big] / np.abs(ref[big])))


def _bandwidth() -> float:
    a = np.ones(16_000_000)
    b = np.empty_like(a)
    best = 1e9
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.nbytes / best


def bench_leaf(doc, L, reps, rtol, out, label="leaf Rodas3", leaf_kw=None, trace=True, ref=None,
               hoisted=False):
    """One leaf route on ``L`` cells: its CPU time per cell-step, its parts and accuracy."""
    from esmjac.adapters.native import rosenbrock
    from leaf import StepParts
    names = cell_parameters(doc)
    t0 = time.process_time()
    if hoisted:
        obj = HoistedRates(doc, rtol, leaf_kw)
        leaf = obj.leaf
    else:
        obj = leaf = rosenbrock(lifted(doc, 1), rtol=rtol, threads=1, options={"progress": False},
                                **(leaf_kw or {}))
        assert list(leaf.forcing_names) == names, (leaf.forcing_names[:4], names[:4])
    build = time.process_time() - t0
    n = leaf.n_species
    F, U, info = conditions(doc, names, L)
    u0 = np.ascontiguousarray(U.reshape(-1))
    fz = np.ascontiguousarray(F.reshape(-1))
    v = u0.copy()
    st = obj.advance(v, 0.0, DT, forcing=fz)               # warm-up (scratch, first calls)
    if not st.success:
        raise RuntimeError(f"{label}: {st.message}")
    final = v.copy()
    res = {"route": label, "rtol": rtol, "cells": L, "species": n, "build_cpu_s": build, "cpu": [], "load": [],
           "attempts": int(st.nsteps.sum()), "accepted": int(st.naccept.sum()),
           "rejected": int(st.nreject.sum()), "njev": int(st.njev.sum()), "nfev": int(st.nfev.sum()),
           "ndec": int(st.ndec.sum()) if hasattr(st, "ndec") else None,
           "conditions": info, "lu_slots": int(leaf._lu.nnz), "lu_flops": list(leaf._lu.flops),
           "block_lanes": int(leaf._scratch_for(L, 1)[0][0][1]), "precision": leaf.precision}
    # what runs the bodies in the leaf's step (the bound programs: with hoisted rates
    # the mass-action kernel "poly" or the lane tape), and the programs' own engines
    eng = leaf._scratch_for(L, 1)[1][0].engines
    res.update(rhs_engine=eng.get("rhs"), jac_engine=eng.get("jac"),
               program_engines={"rhs": leaf.rhs_program.kernel.engine, "jac": leaf.jac_program.kernel.engine})
    if hoisted:
        res["n_rate_fields"] = len(obj.rnames)
    for _ in range(reps):
        v = u0.copy()
        load = _load()
        c, st = _cpu(lambda: obj.advance(v, 0.0, DT, forcing=fz))
        assert np.array_equal(v, final), "the leaf is not deterministic run to run"
        res["cpu"].append(c)
        res["load"].append(load)
    cpu = statistics.median(res["cpu"])
    res["cpu_median"] = cpu
    res["us_per_cell_step"] = cpu / res["attempts"] * 1e6
    res["us_per_cell_20min"] = cpu / L * 1e6
    res["cell_steps_per_s"] = res["attempts"] / cpu
    res["cells_per_s"] = L / cpu
    res["steps_per_cell"] = res["attempts"] / L
    if trace:
        # the parts: every call of the step timed in place in one more (traced) run
        lf_fz = obj.forcing_of(fz, L) if hoisted else fz
        steppers = leaf._scratch_for(L, 1)[1]
        v = u0.copy()
        sp = StepParts(steppers)                # (its calibration outside the traced time)
        t0 = time.thread_time()
        with sp:
            leaf.advance(v, 0.0, DT, forcing=lf_fz)
        traced = time.thread_time() - t0
        assert np.array_equal(v, final)
        cpu_parts, calls = sp.per(res["attempts"])
        names_ = {"rhs": "rhs", "jac": "jac", "lu": "lu", "solves": "stage solves (with their combinations)",
                  "control": "error norm + step control", "compaction": "lane compaction",
                  "gathers": "gathers", "rates": "rate coefficients in the leaf (once per advance)"}
        parts = {names_.get(k, k): val for k, val in cpu_parts.items()}
        if hoisted:
            c, _ = _cpu(lambda: obj.forcing_of(fz, L))
            parts["rate coefficients (once per 20 min)"] = c / res["attempts"] * 1e6
        # the driver's Python between calls, in the traced run itself (its total less
        # the parts and the wrappers' calibrated cost); what the untraced total has
        # beyond the traced run's parts + Python is run-to-run variation (load)
        parts["driver Python"] = sp.python(traced) / res["attempts"] * 1e6
        res["untraced_minus_parts_us_per_cell_step"] = res["us_per_cell_step"] - sum(parts.values())
        res["parts_us_per_cell_step"] = parts
        res["calls_per_cell_step"] = {names_.get(k, k): val for k, val in calls.items()}
        res["block_attempts"] = sp.calls.get("solves", 0) // leaf._tab.stages
        res["calls_per_block_attempt"] = sum(sp.calls.values()) / max(res["block_attempts"], 1)
        res["traced_run_us_per_cell_step"] = traced / res["attempts"] * 1e6
        res["timer_overhead_us_per_call"] = sp.overhead * 1e6
        res["wrapper_cost_us_per_call"] = sp.per_call * 1e6
    if ref is not None:
        idx, yref = ref
        res["err_vs_bdf"] = rel_err(final.reshape(n, L)[:, idx], yref, np.asarray(leaf.atol))
    # bounds per cell-step: LU + stage solves in flops; J + W written, W read by the solves, in bytes
    fac, sol = leaf._lu.flops
    stages = leaf._tab.stages
    nnz = leaf._lu.nnz
    res["bounds"] = {"lu_solve_flops": 2 * fac + stages * 2 * sol,
                     "bytes_min_streamed": 8 * (nnz + 2 * nnz + stages * nnz + 6 * stages * n)}
    out.setdefault("routes", []).append(res)
    return obj, res, (u0, fz, final)


class HoistedRates:
    """The KPP split: rate coefficients once per chemistry step (per cell),
    then a leaf on the pure mass-action kinetics (:func:`gcmech.split_rates`).
    ``advance(u, fz)`` evaluates the rates program on the cells' conditions
    and runs the kinetics leaf with them as its per-lane fields; the rates'
    CPU time is part of every timing of this route."""

    def __init__(self, doc, rtol, leaf_kw=None):
        from esmjac.adapters.native import rosenbrock
        from esmjac.models.mechanism import lift
        from esmjac.runtime.programs import RhsProgram
        from gcmech import split_rates
        kin, rates, knames = split_rates(doc)
        self.cellp = cell_parameters(doc)
        (km,) = kin["models"].values()
        kin_cell = [n for n, v in km["variables"].items() if v["type"] == "parameter"
                    and (n in self.cellp or n in knames)]
        self.leaf = rosenbrock(lift(kin, 1, cell_parameters=kin_cell), rtol=rtol, threads=1,
                               options={"progress": False}, **(leaf_kw or {}))
        self.rates = RhsProgram.build(lift(rates, 1, cell_parameters=self.cellp), options={"progress": False})
        assert list(self.rates.forcing_names) == self.cellp
        self.rnames = list(self.rates.layout.states)
        fn = list(self.leaf.forcing_names)
        # leaf field i comes from the user's conditions (src 0) or the rates (src 1)
        self.rows = [(1, self.rnames.index(n)) if n in self.rnames else (0, self.cellp.index(n)) for n in fn]
        self.n_species, self.atol, self._lu, self._tab = (self.leaf.n_species, self.leaf.atol, self.leaf._lu,
                                                         self.leaf._tab)
        self.plan = self.leaf.plan
        self._bufs = {}

    def forcing_of(self, fz, L):
        """The kinetics leaf's per-lane fields for conditions ``fz`` (nf·L)."""
        b = self._bufs.get(L)
        if b is None:
            nk = len(self.rnames)
            b = (np.zeros(nk * L), np.empty(nk * L), np.empty(len(self.rows) * L), self.rates.bind(L))
            self._bufs[L] = b
        dummy, K, out, run = b
        run(dummy, self.rates.p0, 0.0, fz, K)
        F = fz.reshape(-1, L)
        KK = K.reshape(-1, L)
        O = out.reshape(-1, L)
        for i, (src, j) in enumerate(self.rows):
            O[i] = KK[j] if src else F[j]
        return out

    def advance(self, u, t0, dt, forcing):
        L = u.size // self.n_species
        return self.leaf.advance(u, t0, dt, forcing=self.forcing_of(forcing, L))

    def verify(self, doc, U, F) -> float:
        """Max relative difference between the published model's right-hand
        side and the split one's (rates program + kinetics) on these cells."""
        from esmjac.runtime.programs import RhsProgram
        L = U.shape[1]
        pub = RhsProgram.build(lifted(doc, 1), options={"progress": False})
        u = np.ascontiguousarray(U.reshape(-1))
        f0 = pub.bind(L)(u, pub.p0, 0.0, np.ascontiguousarray(F.reshape(-1)), np.empty_like(u))
        kin = self.leaf.rhs_program
        f1 = kin.bind(L)(u, kin.p0, 0.0, self.forcing_of(np.ascontiguousarray(F.reshape(-1)), L),
                         np.empty_like(u))
        scale = np.maximum(np.abs(f0), 1e-30 + 1e-12 * np.abs(f0).max())
        return float(np.max(np.abs(f1 - f0) / scale))


def bench_cvode(doc, L, rtol, out, ref=None, u0=None, fz=None, nall=None):
    from esmjac.adapters import sundials
    names = cell_parameters(doc)
    d = lifted(doc, L)
    n = u0.size // nall
    U = u0.reshape(n, nall)[:, :L]
    F = fz.reshape(len(names), nall)[:, :L]
    y0 = np.ascontiguousarray(U.reshape(-1))
    atol = np.repeat(1e-6 * np.maximum(np.abs(U).max(axis=1), 1e-6 * np.abs(U).max()), L)
    t0 = time.process_time()
    cv = sundials.cvode(d, linsolver="spgmr", precond="block", jtimes="setup", rtol=rtol, atol=atol, y0=y0,
                        threads=1, max_steps=100000, forcing=np.ascontiguousarray(F.reshape(-1)),
                        build_options={"progress": False})
    build = time.process_time() - t0
    cv.solve(np.array([0.0, 10.0]))
    cv.reset_counters()
    load = _load()
    c, r = _cpu(lambda: cv.solve(np.array([0.0, DT])))
    if r.flag != 0:
        raise RuntimeError(f"CVODE flag {r.flag}: {r.message}")
    stats = {k: v for k, v in cv.stats().items() if isinstance(v, (int, float))}
    res = {"route": "CVODE BDF + GMRES, block preconditioner", "cells": L, "build_cpu_s": build, "cpu_median": c,
           "load": [load], "us_per_cell_20min": c / L * 1e6, "cells_per_s": L / c, "stats": stats}
    steps = stats.get("NumSteps") or stats.get("nsteps")
    if steps:
        res["us_per_cell_step"] = c / L / steps * 1e6
        res["steps_per_cell"] = steps
    if ref is not None:
        idx, yref = ref
        sel = [i for i, j in enumerate(idx) if j < L]
        if sel:
            yc = np.asarray(r.values.y)[-1].reshape(n, L)
            res["err_vs_bdf"] = rel_err(yc[:, [idx[i] for i in sel]], yref[:, sel], atol[::L])
    out.setdefault("routes", []).append(res)
    return res


#: Routes: key → (label, rates hoisted, rosenbrock() keywords).
ROUTES = {
    "hoisted": ("leaf Rodas3, rates hoisted (KPP split)", True, {}),
    "hoisted-mixed": ("leaf Rodas3, rates hoisted, precision=mixed", True, {"precision": "mixed"}),
    "published": ("leaf Rodas3, the published document (rates hoisted inside the leaf)", False, {}),
    "published-nohoist": ("leaf Rodas3, as published, hoist_rates=False (rates in every call)", False,
                          {"hoist_rates": False}),
    "published-mixed": ("leaf Rodas3, the published document, precision=mixed", False, {"precision": "mixed"}),
    "hoisted-oldblock": ("leaf Rodas3, rates hoisted, 1,024-lane blocks (before #25)", True,
                         {"_block_bytes": 1 << 40}),
    # the hoisted bodies on the lane tape instead of the mass-action kernel (compile.massaction)
    "published-tape": ("leaf Rodas3, as published, hoisted bodies on the lane tape (before lanepoly)", False,
                       {"_poly": False}),
    "published-mixed-tape": ("leaf Rodas3, as published, precision=mixed, bodies on the lane tape", False,
                             {"precision": "mixed", "_poly": False}),
    # not in the default list (not run for RESULTS.md yet): the W-method with per-lane reuse
    "hoisted-w": ("leaf ROS34PW2 (W-method, per-lane J/LU reuse), rates hoisted", True, {"method": "ros34pw2"}),
    "published-w": ("leaf ROS34PW2 (W-method, per-lane J/LU reuse), the published document", False,
                    {"method": "ros34pw2"}),
    "published-w-age2": ("leaf ROS34PW2 (W-method, max_jac_age=2), the published document", False,
                         {"method": "ros34pw2", "max_jac_age": 2}),
    "published-w-hold": ("leaf ROS34PW2 (W-method, hold=(1, 1.5)), the published document", False,
                         {"method": "ros34pw2", "hold": (1.0, 1.5)}),
}


def route_spec(spec: str, rtol: float) -> tuple:
    """``key`` or ``key@rtol`` (a route at its own rtol, e.g. a W-method at the
    tolerance that matches Rodas3's error) → (key, label, hoisted, kw, rtol)."""
    key, _, rt = spec.partition("@")
    label, hz, kw = ROUTES[key]
    if rt:
        rtol = float(rt)
        label = f"{label}, rtol {rt}"
    return key, label, hz, dict(kw), rtol


class _block_bytes:
    """Temporarily set the leaf's block budget (None: leave it)."""

    def __init__(self, v):
        self.v = v

    def __enter__(self):
        from esmjac.integrators import leaf as _leaf
        self.old = _leaf.BLOCK_BYTES
        if self.v is not None:
            _leaf.BLOCK_BYTES = self.v

    def __exit__(self, *exc):
        from esmjac.integrators import leaf as _leaf
        _leaf.BLOCK_BYTES = self.old


class _poly:
    """Temporarily choose the hoisted bodies' kernel (None: leave it)."""

    def __init__(self, v):
        self.v = v

    def __enter__(self):
        from esmjac.integrators import bound
        self.old = bound.POLY
        if self.v is not None:
            bound.POLY = self.v

    def __exit__(self, *exc):
        from esmjac.integrators import bound
        bound.POLY = self.old


def _cached_reference(doc, mech, L, idx, U, F, cache_dir):
    """The BDF reference, stored by (mechanism file, cells, sampled cells)."""
    import hashlib
    key = hashlib.sha256(Path(mech).read_bytes() + repr((L, idx.tolist(), REF_RTOL)).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"realworkload-ref-{key}.npy"
    if path.exists():
        return np.load(path), 0.0
    t0 = time.perf_counter()
    y = reference(doc, idx, U, F, REF_RTOL)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, y)
    return y, time.perf_counter() - t0


REF_RTOL = 1e-7


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mech", default=os.environ.get("ESMJAC_GC_MECH", DEFAULT_MECH))
    ap.add_argument("--cells", default="1000,10000")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--ref-cells", type=int, default=4)
    ap.add_argument("--cvode-cells", type=int, default=64)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--routes", default="published,published-mixed,published-nohoist",
                    help="comma list of " + ", ".join(ROUTES) + " (key@RTOL: that route at its own rtol)")
    ap.add_argument("--trace-max", type=int, default=10000, help="time the parts up to this many cells")
    ap.add_argument("--ref-cache", default=os.path.join(os.environ.get("ESMJAC_CACHE_DIR", "/tmp"), "bench-ref"))
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    if not Path(a.mech).exists():
        print(f"realworkload: skipped — no mechanism at {a.mech} (set --mech or ESMJAC_GC_MECH to the "
              "GEOS-Chem fullchem .esm from EarthSciML/EarthSciModels)", file=sys.stderr)
        return 0
    doc = box_doc(a.mech)
    out = {"mech": a.mech, "load_start": _load(), "cpus": os.cpu_count(), "rtol": a.rtol,
           "anchors": ANCHORS, "bandwidth_Bps": _bandwidth()}
    for L in [int(x) for x in a.cells.split(",")]:
        names = cell_parameters(doc)
        F, U, _ = conditions(doc, names, L)
        idx = np.unique(np.linspace(0, L - 1, a.ref_cells).round().astype(int))
        finals = []
        for spec in a.routes.split(","):
            key, label, hz, kw, rtol = route_spec(spec, a.rtol)
            with _block_bytes(kw.pop("_block_bytes", None)), _poly(kw.pop("_poly", None)):
                obj, r, (u0, fz, fin) = bench_leaf(doc, L, a.reps, rtol, out, label=label,
                                                   trace=not a.no_trace and L <= a.trace_max, hoisted=hz,
                                                   leaf_kw=kw)
            finals.append((r, fin, np.asarray(obj.atol)))
            print(json.dumps({k: v for k, v in r.items() if k not in ("conditions",)}, default=float),
                  file=sys.stderr, flush=True)
        yref, out[f"ref_wall_s_{L}"] = _cached_reference(doc, a.mech, L, idx, U, F, a.ref_cache)
        for r, fin, atol in finals:
            r["err_vs_bdf"] = rel_err(fin.reshape(-1, L)[:, idx], yref, atol)
            print(f"{r['route']} @ {L}: max rel err vs BDF {r['err_vs_bdf']:.3g}", file=sys.stderr, flush=True)
        byroute = dict(zip(a.routes.split(","), finals))
        if "published" in byroute and "published-tape" in byroute:
            # the mass-action kernel against the lane tape: last places only
            (_, y0, at), (_, y1, _) = byroute["published"], byroute["published-tape"]
            d = float(np.max(np.abs(y0 - y1) / (np.repeat(at, L) + a.rtol * np.abs(y1))))
            out[f"poly_vs_tape_max_diff_in_tolerances_{L}"] = d
            print(f"mass-action kernel vs lane tape @ {L}: max |diff| {d:.3g} of the tolerance",
                  file=sys.stderr, flush=True)
        if "published-tape" in byroute and "published-nohoist" in byroute:
            # the leaf's own rate hoisting on the lane tape computes the same bits as no hoisting
            same = bool(np.array_equal(byroute["published-tape"][1], byroute["published-nohoist"][1]))
            out[f"hoist_rates_bitwise_equal_{L}"] = same
            print(f"hoist_rates on/off bitwise equal @ {L}: {same}", file=sys.stderr, flush=True)
            if not same:
                out.setdefault("errors", []).append({"route": "published-tape",
                                                     "error": "hoist_rates changed the bits"})
        hz = [o for o in out["routes"] if o.get("n_rate_fields") and o["cells"] == L]
        if hz and "published" in a.routes.split(","):
            # the split model is the published one: right-hand sides agree on fresh cells
            Fv, Uv, _ = conditions(doc, names, 16, seed=7)
            out["split_rhs_max_rel_diff"] = split = HoistedRates(doc, a.rtol).verify(doc, Uv, Fv)
            print(f"split vs published RHS: max rel diff {split:.3g}", file=sys.stderr, flush=True)
            if not split < 1e-10:
                out.setdefault("errors", []).append({"route": "split", "error": f"RHS differs by {split:.3g}"})
        if a.cvode_cells and L == int(a.cells.split(",")[0]):
            try:
                c = bench_cvode(doc, min(a.cvode_cells, L), a.rtol, out, ref=(idx, yref), u0=u0, fz=fz, nall=L)
                print(json.dumps(c, default=float), file=sys.stderr)
            except Exception as exc:            # noqa: BLE001 — reported, not hidden
                out.setdefault("errors", []).append({"route": "cvode", "error": f"{type(exc).__name__}: {exc}"})
                print(f"cvode: {exc}", file=sys.stderr)
    out["load_end"] = _load()
    return emit_json(out, a.out)


def emit_json(res: dict, out: str | None) -> int:
    """Print a benchmark's results as JSON (and write them to ``out`` when
    given); the exit status. Shared by the real-workload scripts."""
    txt = json.dumps(res, indent=1, default=float)
    if out:
        Path(out).write_text(txt)
    print(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
