"""The Rosenbrock leaf's benchmark lines (issue #15, DESIGN §10 T7).

    python benchmarks/leaf.py [--cells 10000] [--cells-300 16] [--sample 20] [--out results-leaf.json]

L1 heterogeneous grid: tropo12 on ``--cells`` cells, half of them "night"
(photolysis off, fj = 0), initial states scaled per cell by 10^U(-1, 1)
(a factor 10² between cells), one 20-minute chemistry step. Routes: per-lane
step size (compacting finished lanes; and masking them), one shared step
size, and one cell at a time (KPP's way: the same leaf called on one lane;
every ``--sample``-th cell, scaled up). Work = lane-step attempts (and the
CPU time per attempt); time = CPU time of one thread.

L2 the ~300-species synthetic mechanism (``synthetic_mechanism(300, 800)``)
on ``--cells-300`` cells: µs per cell per 20-minute step and cells/s of the
leaf against CVODE (BDF, GMRES + esmjac's block preconditioner) on the same
cells, tolerances and initial states.

L3 adjoint cost: ``leaf.gradient`` (state and parameters) against the
forward ``advance`` on tropo12, 1000 cells.

L4 tiles and the per-step lower bound (issue #16): the L1 grid (tropo12 ×
``--cells``) through the leaf with the default lane tiles (LaneSparseBlocks
``tile=16``) and with ``tile=None`` (one tile, the layout before #16): cells/s
of each, and their CPU time against the step's lower bound, i.e. for every
step attempt the leaf made one Jacobian evaluation, one LU factorisation of
``I/(hγ) − J`` (the leaf's fused assembly-and-factorisation call), the
stages' right-hand side calls and the stages' triangular solves (with the
right-hand side combinations fused into them), each timed in place, as the
leaf runs it, in a traced run after each timed one (:class:`StepParts`).
Before timing: the two leaves' final states are bitwise equal and within the
BDF reference's tolerance; the bound's Jacobian equals the untiled one's
and its factor-and-solve matches a dense NumPy solve on sampled lanes.

W  Jacobian and LU reuse (issue #25 item 3): Rodas3 (a new Jacobian and LU
every attempt) against the Rosenbrock–W method ROS34PW2 with per-lane reuse
(``method="ros34pw2"``), each at several rtols, on the L1 grid (tropo12 ×
``--cells-w``, heterogeneous, half night) and on the L2 synthetic mechanism
(``--cells-300`` cells): per route its error against the tight BDF
reference, lane-step attempts and accepted steps, Jacobians and LUs (the
leaf's per-lane ``njev``/``ndec``), Jacobians+LUs per accepted step and in
total, and CPU time (routes interleaved, median of ``--reps``). Compare
routes at equal accuracy (the error column), not at equal rtol.

Every route's final state is checked against a tight BDF reference
(``solve_ivp`` BDF with esmjac's exact sparse Jacobian, rtol 1e-10) on sampled
cells before its time is reported. Timings are ``time.thread_time`` of the
calling thread with ``threads=1`` everywhere (the machine is shared: the
load average is recorded beside each line); routes are interleaved, the
median of ``--reps`` runs is reported.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib.resources import files

import numpy as np

DT = 1200.0
RTOL = 1e-4


def _cpu(fn):
    t0 = time.thread_time()
    r = fn()
    return time.thread_time() - t0, r


def _load():
    return round(os.getloadavg()[0], 2)


def _tropo(cells):
    from esmjac.models.mechanism import lift
    return lift(json.loads(files("esmjac.models").joinpath("tropo12.esm").read_text()), cells)


def _hetero_state(leaf, L, seed=0):
    rng = np.random.default_rng(seed)
    base = leaf.initial_state().reshape(leaf.n_species, -1)[:, :1]
    u = np.ascontiguousarray((base * 10 ** rng.uniform(-1, 1, L)[None, :]).reshape(-1))
    fj = np.where(np.arange(L) % 2 == 0, 0.0, 1.0)
    return u, fj


def _reference(doc_fn, cells_idx, u, forcing_rows, nf, n, L, p=None):
    """Tight BDF (rtol 1e-10, exact sparse Jacobian) on the sampled cells."""
    from esmjac.adapters.scipy import ivp
    k = len(cells_idx)
    doc = doc_fn(k)
    y0 = np.ascontiguousarray(u.reshape(n, L)[:, cells_idx].reshape(-1))
    kw = {}
    if nf:
        kw["forcing"] = np.ascontiguousarray(forcing_rows.reshape(nf, L)[:, cells_idx].reshape(-1))
    prob = ivp(doc, y0=y0, threads=1, **kw)
    sol = prob.solve((0.0, DT), rtol=1e-10, atol=1e-10 * np.maximum(np.abs(y0), 1.0))
    if not sol.success:
        raise RuntimeError(f"reference BDF failed: {sol.message}")
    return sol.y[:, -1].reshape(n, k)


def _err(y, ref, atol_s):
    """Max relative error over species above 1e3·atol (the controlled ones)."""
    big = np.abs(ref) > 1e3 * atol_s[:, None]
    return float(np.max(np.abs(y - ref)[big] / np.abs(ref[big])))


def bench_hetero(cells, sample, reps, out):
    from esmjac.adapters.native import rosenbrock
    doc = _tropo(cells)
    leaves = {"per-lane (compact)": rosenbrock(doc, rtol=RTOL, threads=1),
              "per-lane (mask)": rosenbrock(doc, rtol=RTOL, threads=1, compact=False),
              "shared step": rosenbrock(doc, rtol=RTOL, threads=1, step="shared")}
    lf = leaves["per-lane (compact)"]
    n, L = lf.n_species, cells
    u, fj = _hetero_state(lf, L)
    picks = np.arange(0, L, sample)
    picks = np.minimum(picks + (np.arange(picks.size) % 2), L - 1)   # day and night cells alike
    ref_idx = picks[:: max(1, len(picks) // 20)][:20]
    ref = _reference(_tropo, ref_idx, u, fj, 1, n, L)
    res = {k: {"cpu": [], "load": []} for k in list(leaves) + ["one cell at a time"]}
    finals = {}
    for rep in range(reps + 1):                      # first round warms up (not timed)
        for name, leaf in leaves.items():
            v = u.copy()
            load = _load()
            cpu, st = _cpu(lambda: leaf.advance(v, 0.0, DT, forcing=fj))
            assert st.success, (name, st.message)
            if rep:
                res[name]["cpu"].append(cpu)
                res[name]["load"].append(load)
            res[name]["attempts"] = int(st.nsteps.sum()) if name != "shared step" else int(st.nsteps.sum())
            res[name]["nsteps_max"] = int(st.nsteps.max())
            finals[name] = v
        # one cell at a time: the same leaf on one lane, every sample-th cell
        load = _load()
        t_one, att, ys = 0.0, 0, []
        for l in picks:
            w = np.ascontiguousarray(u.reshape(n, L)[:, l])
            c, st = _cpu(lambda: lf.advance(w, 0.0, DT, forcing=fj[l:l + 1]))
            t_one += c
            att += int(st.nsteps[0])
            ys.append(w.copy())
        if rep:
            res["one cell at a time"]["cpu"].append(t_one * L / len(picks))
            res["one cell at a time"]["load"].append(load)
        res["one cell at a time"]["attempts"] = int(round(att * L / len(picks)))
        one = np.stack(ys, axis=1)
    # bitwise: per-lane results equal the cells alone
    bitwise = bool(np.array_equal(finals["per-lane (compact)"].reshape(n, L)[:, picks], one))
    mask_same = bool(np.array_equal(finals["per-lane (compact)"], finals["per-lane (mask)"]))
    atol_s = np.asarray(lf.atol)
    lines = []
    for name, r in res.items():
        y = one[:, [int(np.flatnonzero(picks == c)[0]) for c in ref_idx]] if name == "one cell at a time" \
            else finals[name].reshape(n, L)[:, ref_idx]
        r.update(cpu_median=statistics.median(r["cpu"]), load=r["load"],
                 err_vs_bdf=_err(y, ref, atol_s))
        lines.append(r | {"route": name})
    pl = res["per-lane (compact)"]
    one_r = res["one cell at a time"]
    sh = res["shared step"]
    summary = {
        "work_ratio_attempts": pl["attempts"] / one_r["attempts"],
        "work_ratio_cpu_per_attempt_vs_shared": (pl["cpu_median"] / pl["attempts"]) / (sh["cpu_median"] / sh["attempts"]),
        "speedup_vs_one_at_a_time": one_r["cpu_median"] / pl["cpu_median"],
        "speedup_vs_shared": sh["cpu_median"] / pl["cpu_median"],
        "mask_vs_compact_cpu": res["per-lane (mask)"]["cpu_median"] / pl["cpu_median"],
        "bitwise_lane_alone": bitwise, "mask_bitwise_equal": mask_same,
        "sampled_one_at_a_time": int(len(picks)),
    }
    out["L1"] = {"cells": cells, "routes": lines, "summary": summary}
    return out


def _synth(cells):
    from esmjac.models.mechanism import synthetic_mechanism
    return synthetic_mechanism(300, 800, cells, seed=0)


def bench_300(cells, reps, out):
    from esmjac.adapters import sundials
    from esmjac.adapters.native import rosenbrock
    doc = _synth(cells)
    t0 = time.perf_counter()
    leaf = rosenbrock(doc, rtol=RTOL, threads=1)
    build = time.perf_counter() - t0
    n = leaf.n_species
    rng = np.random.default_rng(1)
    u = np.ascontiguousarray((leaf.initial_state().reshape(n, cells)
                              * 10 ** rng.uniform(-0.5, 0.5, cells)[None, :]).reshape(-1))
    atol = np.repeat(np.asarray(leaf.atol), cells)
    cv = sundials.cvode(doc, linsolver="spgmr", precond="block", jtimes="setup", rtol=RTOL, atol=atol,
                        y0=u, threads=1, max_steps=100000)
    # 4 sampled cells (a 4-cell document: its programs are usually in the build cache already)
    ref_idx = np.linspace(0, cells - 1, min(4, cells)).round().astype(int)
    t0 = time.perf_counter()
    ref = _reference(_synth, ref_idx, u, None, 0, n, cells)
    ref_wall = time.perf_counter() - t0
    rec = {"leaf": {"cpu": [], "load": []}, "cvode": {"cpu": [], "load": []}}
    # warm-up (kernels loaded, scratch allocated) on a short interval, then timed full steps
    leaf.advance(u.copy(), 0.0, 10.0)
    cv.solve(np.array([0.0, 10.0]))
    for rep in range(1, reps + 1):
        v = u.copy()
        load = _load()
        c, st = _cpu(lambda: leaf.advance(v, 0.0, DT))
        assert st.success, st.message
        if rep:
            rec["leaf"]["cpu"].append(c)
            rec["leaf"]["load"].append(load)
        rec["leaf"]["err_vs_bdf"] = _err(v.reshape(n, cells)[:, ref_idx], ref, np.asarray(leaf.atol))
        rec["leaf"]["attempts"] = int(st.nsteps.sum())
        load = _load()
        cv.reset_counters()
        c, r = _cpu(lambda: cv.solve(np.array([0.0, DT])))
        if r.flag != 0:
            raise RuntimeError(f"CVODE flag {r.flag}: {r.message}")
        if rep:
            rec["cvode"]["cpu"].append(c)
            rec["cvode"]["load"].append(load)
        yc = np.asarray(r.values.y)[-1]
        rec["cvode"]["err_vs_bdf"] = _err(yc.reshape(n, cells)[:, ref_idx], ref, np.asarray(leaf.atol))
        rec["cvode"]["stats"] = {k: v for k, v in cv.stats().items() if isinstance(v, (int, float))}
    for r in rec.values():
        r["cpu_median"] = statistics.median(r["cpu"])
        r["us_per_cell_step"] = r["cpu_median"] / cells * 1e6
        r["cells_per_s"] = cells / r["cpu_median"]
    out["L2"] = {"cells": cells, "species": n, "build_s": build, "routes": rec, "ref_cells": ref_idx.tolist(),
                 "ref_wall_s": ref_wall, "lu_slots": int(leaf.lu.nnz), "lu_flops": list(leaf.lu.flops),
                 "speedup_cells_per_s": rec["cvode"]["cpu_median"] / rec["leaf"]["cpu_median"]}
    return out


def bench_adjoint(cells, reps, out):
    from esmjac.adapters.native import rosenbrock
    leaf = rosenbrock(_tropo(cells), rtol=RTOL, threads=1)
    u, fj = _hetero_state(leaf, cells, 3)
    w = 1.0 / np.abs(u).clip(1.0)
    leaf.gradient(u, 0.0, DT, w, forcing=fj)          # warm (builds the parameter program)
    fw, ad, loads = [], [], []
    for _ in range(reps):
        v = u.copy()
        loads.append(_load())
        c, _ = _cpu(lambda: leaf.advance(v, 0.0, DT, forcing=fj))
        fw.append(c)
        c, (y, g, gp, st) = _cpu(lambda: leaf.gradient(u, 0.0, DT, w, forcing=fj))
        ad.append(c)
        c2, _ = _cpu(lambda: leaf.gradient(u, 0.0, DT, w, forcing=fj, wrt="state"))
        ad[-1] = (ad[-1], c2)
    f = statistics.median(fw)
    a = statistics.median(x[0] for x in ad)
    a_s = statistics.median(x[1] for x in ad)
    out["L3"] = {"cells": cells, "forward_cpu": f, "gradient_cpu": a, "gradient_state_only_cpu": a_s,
                 "ratio": a / f, "ratio_state_only": a_s / f, "load": loads}
    return out


#: The leaf's step, by part: the stepper's calls from Python that
#: :class:`StepParts` times in place (lanestep's module-level kernels, looked up
#: as globals by ``LaneStepper.run`` on every call), grouped as the benchmark
#: reports them. Calls nested inside compiled code are not Python calls and are
#: timed with their caller (``_finish`` holds the error norm, the guards and the
#: step control; ``_prep_and_factor`` the step sizes and the factorisation).
STEP_PARTS = {
    "lu": ("_prep_and_factor", "factor_shifted_rows", "_sub_factor"),
    "solves": ("_stage_solve",),
    "control": ("_finish", "_check_step", "_control", "_aged", "_reuse_plan", "_shared_bad", "_shared_min",
                "_h_start"),
    "compaction": ("_retire", "_squeeze_lane", "_squeeze_rows", "_squeeze_tiled", "_scatter_all"),
    "gathers": ("_gather", "_tiled_copy"),
    "time-dependent forcing": ("_fd_times", "_fd_time", "_times"),
}


def _timer_cost(n=2000) -> float:
    """CPU seconds an empty ``thread_time`` interval reads (the clock is a
    system call here: ≈ 2 µs a read on this machine, not negligible per call)."""
    tt = time.thread_time
    d = []
    for _ in range(n):
        t0 = tt()
        d.append(tt() - t0)
    return statistics.median(d)


class StepParts:
    """Times the leaf's own calls in place during an advance, by part.

    Inside ``with StepParts(steppers) as sp:`` every stepper's ``rhs``,
    ``jac`` and ``lane_prologue`` and every lanestep kernel of
    :data:`STEP_PARTS` that ``LaneStepper.run`` calls from Python is wrapped:
    its CPU time (``time.thread_time``, less the calibrated cost of an empty
    interval) and its number of calls are summed by part. The parts are then
    what actually ran — the stage solves with their fused right-hand sides and
    combinations, the end of each attempt with its error norm — on the states,
    caches and lane counts of the real run. Σ parts is less than the traced
    run's own CPU time by the Python between calls plus the wrappers' and the
    clock's cost (``per_call``, calibrated on a wrapped no-op): :meth:`python`
    is the driver's own Python of the traced run. One thread only (the
    wrappers replace module globals while inside the ``with``)."""

    def __init__(self, steppers):
        from esmjac.integrators import lanestep
        self.mod, self.steppers = lanestep, list(steppers)
        self.cpu: dict = {}
        self.calls: dict = {}
        self.overhead = _timer_cost()
        self._saved: list = []
        # what a wrapped call costs outside every part (the wrapper's Python,
        # the clock's other half): a wrapped no-op, timed as a whole, with the
        # step's mean argument count (≈ 20: RHS 5, a stage solve 26, _finish 50)
        w = self._wrap("_calibration", lambda *a: None)
        tt = time.thread_time
        args = tuple(range(20))
        t0 = tt()
        for _ in range(2000):
            w(*args)
        tot = tt() - t0
        self.per_call = max(tot - self.cpu.pop("_calibration"), 0.0) / 2000
        self.calls.pop("_calibration")

    def _wrap(self, kind, fn):
        tt, cpu, calls, c = time.thread_time, self.cpu, self.calls, self.overhead
        cpu.setdefault(kind, 0.0)
        calls.setdefault(kind, 0)

        def w(*a):
            t0 = tt()
            r = fn(*a)
            cpu[kind] += tt() - t0 - c
            calls[kind] += 1
            return r
        return w

    def __enter__(self):
        for kind, names in STEP_PARTS.items():
            for name in names:
                fn = getattr(self.mod, name)
                self._saved.append((self.mod, name, fn))
                setattr(self.mod, name, self._wrap(kind, fn))
        for st in self.steppers:
            for attr, kind in (("rhs", "rhs"), ("jac", "jac"), ("lane_prologue", "rates")):
                fn = getattr(st, attr)
                if fn is not None:
                    self._saved.append((st, attr, fn))
                    setattr(st, attr, self._wrap(kind, fn))
        return self

    def __exit__(self, *exc):
        for obj, name, fn in reversed(self._saved):
            setattr(obj, name, fn)
        self._saved.clear()

    def python(self, traced_cpu: float) -> float:
        """CPU seconds of a traced run (``traced_cpu``) in none of its parts and
        not the wrappers': the driver's own Python between calls."""
        return traced_cpu - sum(self.cpu.values()) - sum(self.calls.values()) * self.per_call

    def per(self, count: int) -> dict:
        """µs per ``count`` (e.g. per cell-step) of each part that ran, and the
        calls per ``count`` of each."""
        ran = [k for k, n in self.calls.items() if n]
        return ({k: self.cpu[k] / count * 1e6 for k in ran}, {k: self.calls[k] / count for k in ran})


class _Trace:
    """Records, per step attempt of each lane block, the leaf's active lane
    count, the states its Jacobian call saw and the step sizes its
    factorisation used (outside any timing): wraps lanestep's
    ``_prep_and_factor``, after which ``hs`` holds the attempt's steps and Y,
    the fields and the cell indices are still the attempt's."""

    def __init__(self, steppers):
        from esmjac.integrators import lanestep
        self.calls, self.mod = [], lanestep
        self.saved = lanestep._prep_and_factor
        byid = {id(st.hs): (b, st) for b, st in enumerate(steppers)}
        inner = self.saved

        def pf(t, h, tend, done, m, hs, *rest):
            nbad = inner(t, h, tend, done, m, hs, *rest)
            b, st = byid[id(hs)]
            n, nf, ncd = st.n, st.nf, st.ncd
            self.calls.append((b, m, st.Y[:n * m].copy(), st.FZ[:max(nf * m, 1)].copy(),
                               st.cix[:max(ncd * m, 1)].copy(), hs[:m].copy()))
            return nbad
        lanestep._prep_and_factor = pf

    def restore(self):
        self.mod._prep_and_factor = self.saved


def _bound_calls(st, call):
    """The step's kernels on one recorded step attempt of stepper ``st`` (for
    :func:`_verify_bound`'s value checks): rhs at the step point, Jacobian,
    factorisation of ``I/(hγ) − J``."""
    from esmjac.integrators.lanestep import lu_tile
    from esmjac.linalg.sparse_lu import CHUNK, factor_shifted_rows
    _, m, y, fz, cix, hs = call
    lu, tab = st.lu, st.tab
    W = m if st.tile is None else st.tile
    WA = lu_tile(m, st.Wm.dtype)          # the leaf's own tile for its factor dtype
    return [("rhs", lambda: st.rhs(y, fz, cix, m, st.F0)),
            ("jac", lambda: st.jac(y, fz, cix, m, st.J)),
            ("lu", lambda: factor_shifted_rows(st.J, W, st.Wm, WA, hs, tab.gamma, lu.nnz, m, CHUNK,
                                               *st.fops, st.bad, *st.rops))]


def _verify_bound(steppers_t, steppers_u, calls):
    """The bound's calls compute what they claim: the tiled Jacobian equals the
    untiled one (untiled to [slot, lane]), the fused factorisation + solve
    matches a dense NumPy solve of (I/(hγ) − J) x = f on sampled lanes."""
    from esmjac.layouts.types import untile
    call = calls[len(calls) // 2]
    st_t, st_u = steppers_t[call[0]], steppers_u[call[0]]
    _, m, y, fz, cix, hs = call
    lu, nnz, n = st_t.lu, st_t.lu.nnz, st_t.n
    for st in (st_t, st_u):
        for _, fn in _bound_calls(st, call)[:3]:
            fn()
    Jt = untile(st_t.J, nnz, m, st_t.tile)
    Ju = untile(st_u.J, nnz, m, m)
    assert np.array_equal(Jt, Ju), "tiled and untiled Jacobians differ"
    from esmjac.integrators.lanestep import lu_tile
    from esmjac.linalg.sparse_lu import CHUNK, solve_lanes
    perm = st_t.perm                    # stage vectors are in the LU's (permuted) order
    b = np.ascontiguousarray(st_t.F0[:n * m].reshape(n, m)[perm].reshape(-1))
    solve_lanes(st_t.Wm, b, nnz, m, lu_tile(m, st_t.Wm.dtype), CHUNK, *st_t.sops)
    rows = np.array([rc[0] for rc in lu.pattern])
    cols = np.array([rc[1] for rc in lu.pattern])
    for l in np.linspace(0, m - 1, min(m, 8)).round().astype(int):
        A = np.zeros((n, n))
        A[rows, cols] = -Jt[:, l]
        A[np.arange(n), np.arange(n)] += 1.0 / (hs[l] * st_t.tab.gamma)
        f = st_t.F0[:n * m].reshape(n, m)[perm, l]
        x = np.linalg.solve(A, f)
        got = b.reshape(n, m)[:, l]
        assert np.allclose(got, x, rtol=1e-9, atol=1e-12 * np.abs(x).max()), (l, got, x)


def bench_tiles_bound(cells, reps, out):
    """L4: cells/s with and without lane tiles, and per step against its lower bound."""
    from esmjac.adapters.native import rosenbrock
    doc = _tropo(cells)
    leaves = {"default tile": rosenbrock(doc, rtol=RTOL, threads=1),
              "tile=None": rosenbrock(doc, rtol=RTOL, threads=1, tile=None)}
    lt, lu_ = leaves["default tile"], leaves["tile=None"]
    n, L = lt.n_species, cells
    u, fj = _hetero_state(lt, L)
    finals = {}
    for name, lf in leaves.items():                 # warm up; verify
        v = u.copy()
        st = lf.advance(v, 0.0, DT, forcing=fj)
        assert st.success, (name, st.message)
        finals[name] = v
    assert np.array_equal(finals["default tile"], finals["tile=None"]), "tiles changed the bits"
    ref_idx = np.linspace(0, L - 1, 8).round().astype(int)
    ref = _reference(_tropo, ref_idx, u, fj, 1, n, L)
    err = _err(finals["default tile"].reshape(n, L)[:, ref_idx], ref, np.asarray(lt.atol))
    assert err < 1e-2, err
    # the recorded step attempts (one traced run of the default leaf, untimed): the values check
    steppers_t = lt._scratch_for(L, 1)[1]
    steppers_u = lu_._scratch_for(L, 1)[1]
    tr = _Trace(steppers_t)
    v = u.copy()
    try:
        st = lt.advance(v, 0.0, DT, forcing=fj)
    finally:
        tr.restore()
    assert np.array_equal(v, finals["default tile"])
    calls = tr.calls
    _verify_bound(steppers_t, steppers_u, calls)
    # the bound: the step's kernels (RHS, Jacobian, LU, the stage solves with their
    # combinations) timed in place in a traced run after each timed one (StepParts)
    kernels = ("rhs", "jac", "lu", "solves")
    res = {k: {"cpu": [], "bound": []} for k in leaves}
    loads = [_load()]
    for rep in range(reps):
        for name, lf in leaves.items():
            v = u.copy()
            c, _ = _cpu(lambda: lf.advance(v, 0.0, DT, forcing=fj))
            res[name]["cpu"].append(c)
            sts = steppers_t if name == "default tile" else steppers_u
            w = u.copy()
            with StepParts(sts) as sp:
                lf.advance(w, 0.0, DT, forcing=fj)
            assert np.array_equal(w, v)
            res[name]["bound"].append({k: sp.cpu.get(k, 0.0) for k in kernels})
        loads.append(_load())
    lines = {}
    for name, r in res.items():
        cpu = statistics.median(r["cpu"])
        parts = {k: statistics.median(b[k] for b in r["bound"]) for k in r["bound"][0]}
        bound = statistics.median(sum(b.values()) for b in r["bound"])
        lines[name] = {"cpu_median": cpu, "cpu": r["cpu"], "cells_per_s": L / cpu, "bound": bound,
                       "bound_parts": parts, "per_step_vs_bound": cpu / bound}
    out["L4"] = {"cells": L, "tile": lt.tile, "attempts": int(st.nsteps.sum()), "step_calls": len(calls),
                 "routes": lines, "load": loads, "err_vs_bdf": err,
                 "speedup_tiles": lines["tile=None"]["cpu_median"] / lines["default tile"]["cpu_median"]}
    return out


def bench_wmethod(cells, cells_300, reps, out, models=("tropo12", "synthetic300")):
    """W: Rodas3 vs ROS34PW2 with per-lane Jacobian/LU reuse, at several rtols."""
    from esmjac.adapters.native import rosenbrock
    routes = [("rodas3", r, {}) for r in (1e-3, 1e-4, 1e-5)] + \
             [("ros34pw2", r, {}) for r in (1e-3, 1e-4, 1e-5, 1e-6)]
    res = {}
    for label, doc_fn, L in (("tropo12", _tropo, cells), ("synthetic300", _synth, cells_300)):
        if label not in models:
            continue
        doc = doc_fn(L)
        leaves = {f"{m} rtol={r:g}": rosenbrock(doc, method=m, rtol=r, threads=1, **kw)
                  for m, r, kw in routes}
        lf0 = next(iter(leaves.values()))
        n = lf0.n_species
        if label == "tropo12":
            u, fz = _hetero_state(lf0, L)
            nf = 1
        else:
            rng = np.random.default_rng(1)
            u = np.ascontiguousarray((lf0.initial_state().reshape(n, L)
                                      * 10 ** rng.uniform(-0.5, 0.5, L)[None, :]).reshape(-1))
            fz, nf = None, 0
        ref_idx = np.linspace(0, L - 1, min(8 if label == "tropo12" else 4, L)).round().astype(int)
        ref = _reference(doc_fn, ref_idx, u, fz, nf, n, L)
        atol_s = np.asarray(lf0.atol)
        rec = {k: {"cpu": [], "load": []} for k in leaves}
        for rep in range(reps + 1):                  # first round warms up (not timed)
            for name, leaf in leaves.items():
                v = u.copy()
                load = _load()
                cpu, st = _cpu(lambda: leaf.advance(v, 0.0, DT, forcing=fz))
                assert st.success, (label, name, st.message)
                r = rec[name]
                if rep:
                    r["cpu"].append(cpu)
                    r["load"].append(load)
                tt = st.totals()
                r.update(tt, err_vs_bdf=_err(v.reshape(n, L)[:, ref_idx], ref, atol_s),
                         jac_lu_per_accepted=(tt["njev"] + tt["ndec"]) / tt["naccept"])
        for name, r in rec.items():
            r["cpu_median"] = statistics.median(r["cpu"])
            print(f"W {label} x{L} {name}: err {r['err_vs_bdf']:.2e}, {r['naccept']} accepted, "
                  f"{r['nreject']} rejected, J {r['njev']} LU {r['ndec']} "
                  f"({r['jac_lu_per_accepted']:.3f} per accepted step), {r['cpu_median']:.3f} s CPU, "
                  f"load {r['load']}", file=sys.stderr, flush=True)
        res[label] = {"cells": L, "species": n, "routes": rec}
    out["W"] = res
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=10000)
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--cells-300", type=int, default=16)
    ap.add_argument("--cells-adjoint", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cells-w", type=int, default=2000)
    ap.add_argument("--w-models", default="tropo12,synthetic300")
    ap.add_argument("--only", default="L1,L2,L3,L4,W")
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    out = {"load_start": _load(), "cpus": os.cpu_count()}
    only = set(a.only.split(","))
    if "L1" in only:
        bench_hetero(a.cells, a.sample, a.reps, out)
        print(json.dumps(out["L1"]["summary"]), file=sys.stderr)
    if "L3" in only:
        bench_adjoint(a.cells_adjoint, a.reps, out)
        print(json.dumps(out["L3"]), file=sys.stderr)
    if "L4" in only:
        bench_tiles_bound(a.cells, a.reps, out)
        l4 = out["L4"]
        for name, r in l4["routes"].items():
            print(f"L4 {name}: {r['cells_per_s']:.0f} cells/s, {r['cpu_median']:.3f} s CPU; per step "
                  f"{r['per_step_vs_bound']:.2f}x its lower bound ({r['bound']:.3f} s: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["bound_parts"].items())
                  + f"); load {l4['load']}", file=sys.stderr)
        print(f"L4 tiles vs tile=None: {l4['speedup_tiles']:.2f}x cells/s "
              f"({l4['attempts']} lane-step attempts, {l4['step_calls']} block steps)", file=sys.stderr)
    if "W" in only:
        bench_wmethod(a.cells_w, a.cells_300, a.reps, out, tuple(a.w_models.split(",")))
    if "L2" in only:
        bench_300(a.cells_300, a.reps, out)
        print(json.dumps({k: v for k, v in out["L2"].items() if k != "routes"}), file=sys.stderr)
    out["load_end"] = _load()
    txt = json.dumps(out, indent=1, default=float)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(txt)
    print(txt)


if __name__ == "__main__":
    main()
