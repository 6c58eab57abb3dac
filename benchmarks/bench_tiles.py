"""Lane tiles and direct writes (issue #16 items 1-4; targets T1, T2, T6).

    python benchmarks/bench_tiles.py [--quick] [--results benchmarks/RESULTS.md] [--json FILE]

tropo12 (the bundled 15-state tropospheric mechanism) lifted to 10⁴ cells,
one thread, float64, CPU time per call (``time.thread_time``), every route's
values checked against an independent one before it is timed, routes
interleaved (rounds over all of them, so load changes hit each alike),
medians of ≥ 50 warm calls, load average recorded before and after:

* T1: ``eval_into`` LaneSparseBlocks (default options) / the hand-rolled
  SymPy→Numba kernel (benchmarks/peers.py), ≤ 1.0×; the RHS / the
  hand-rolled RHS, ≤ 1.0×; LaneBlocks and Csr beside.
* tile sweep: LaneSparseBlocks(tile=W) for W in 4…64 and None (the
  figures that chose ``layouts.types.DEFAULT_TILE``).
* T2: at 10⁵ and 10⁶ lanes, ``eval_into`` and the RHS / the byte bound:
  bytes per cell (inputs read, outputs written twice: write-allocate) at the
  streaming bandwidth measured here by a triad, ≤ 1.5×.
* T6: one call at 1 cell, ``eval_into`` and the RHS / the hand-rolled
  kernel's call, ≤ 3×.
* C5: the ~300-species synthetic mechanism (``synthetic_mechanism(300,
  800)``) × 1000 cells, ``eval_into`` LaneSparseBlocks (default options:
  the tape engine) and its bound call / CasADi's C route
  (``peers.casadi_peer``: the per-cell SX Jacobian mapped over cells,
  generated as C, ``-O3``), ≥ 1.5× faster (ratio ≤ 1/1.5); the values of
  both checked against esmjac's Csr first. ``--only C5`` runs it alone.

The 10⁵/10⁶-lane runs reuse the 10⁴-cell cell program with a wider
workspace (a cell program's kernels take the lane count), so the build does
not grow with them. Results go to a marked section of RESULTS.md.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import sys
import time

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
BEGIN, END = "<!-- bench_tiles:begin -->", "<!-- bench_tiles:end -->"


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def interleaved(fns: dict, calls: int, rounds: int = 5) -> dict:
    """name → (median, min) CPU seconds per call over ``calls`` timed calls,
    taken in ``rounds`` interleaved passes after two warm-up calls each."""
    for fn in fns.values():
        fn()
        fn()
    per = max(1, -(-calls // rounds))
    ts = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            for _ in range(per):
                t0 = time.thread_time()
                fn()
                ts[k].append(time.thread_time() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in ts.items()}


def triad_bandwidth(n: int = 1 << 23, calls: int = 11) -> float:
    """Streaming bandwidth (bytes/s): ``c = a + s*b`` over arrays far beyond
    the caches, counting 4 × 8 bytes per element (two reads, the write and
    its write-allocate read)."""
    import numba

    @numba.njit(cache=False, nogil=True)
    def triad(a, b, c, s):
        for i in range(a.shape[0]):
            c[i] = a[i] + s * b[i]

    a, b, c = np.ones(n), np.ones(n), np.empty(n)
    (med, _), = interleaved({"triad": lambda: triad(a, b, c, 0.5)}, calls, rounds=1).values()
    return 32.0 * n / med


def _dense_lanes(plan, out, n, L, r):
    """[r, c, lane] values of a Csr output of a cell program (independent of
    the lane layouts: CSR rows are species-major ``s*L + l``)."""
    from scipy.sparse import csr_array
    M = csr_array((out, plan.indices, plan.indptr), shape=tuple(plan.info["shape"])).tocoo()
    D = np.zeros((n, n, L))
    D[M.row // L, M.col // L, M.row % L] = M.data
    return D


class TileBench:
    def __init__(self, quick: bool = False):
        self.quick = quick
        self.calls = 50
        self.lines: list = []
        self.tables: list = []
        self.rec: dict = {"load_before": _load()}

    def log(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def line(self, tid: str, ok: bool, text: str) -> None:
        s = f"- **{tid}** {'PASS' if ok else 'MISS'}: {text}"
        self.lines.append(s)
        self.log(s)

    def run(self, only=None) -> None:
        if only is None or only & {"T1", "T2", "T6"}:
            self.tiles()
        if only is None or "C5" in only:
            self.c5()
        self.rec["load_after"] = _load()

    def c5(self, n_species: int = 300, n_reactions: int = 800, cells: int = 1000) -> None:
        """C5: the large synthetic mechanism against CasADi's C route."""
        import contextlib
        import io

        import numba

        from common import casadi_vs_csr, lane_values
        from esmjac.layouts.types import Csr, LaneSparseBlocks
        from esmjac.models.mechanism import synthetic_mechanism
        from esmjac.runtime.programs import JacobianProgram
        import peers

        numba.set_num_threads(1)
        doc = synthetic_mechanism(n_species, n_reactions, cells, seed=0)
        t0 = time.perf_counter()
        j = JacobianProgram.build(doc)
        self.log(f"C5: built {n_species} species x {cells}: {time.perf_counter() - t0:.1f} s "
                 f"({j.kernel.engine}, {j.n_fields} bands)")
        buf = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(buf):
            cp = peers.casadi_peer(doc, L=cells)
        if cp is None:
            self.log(f"C5 skipped: {buf.getvalue().strip()}")
            self.rec["c5"] = {"skipped": buf.getvalue().strip()}
            return
        self.log(f"C5: CasADi {cp.info.get('route')} built in {time.perf_counter() - t0:.1f} s")
        L, n = cells, j.n_species
        rng = np.random.default_rng(5)
        u0, p, f0 = j.defaults(L)
        u = np.ascontiguousarray(u0 * rng.uniform(0.5, 1.5, u0.shape))
        f = f0 if f0 is not None and f0.size else None
        fe = f if f is not None else np.empty(0)
        err, M, oj = casadi_vs_csr(cp, j, j.plan(Csr()), u, p, f, L)
        if not err <= 1e-10:
            raise AssertionError(f"C5: CasADi differs from esmjac's Csr: {err:.3e}")
        lsb = j.plan(LaneSparseBlocks())
        ws = j.new_workspace(L)
        out = np.zeros(lsb.out_size(L))
        j.eval_into(lsb, u, p, 0.0, f, out, ws)
        run = j.bind(lsb, j.new_workspace(L))
        ob = np.zeros_like(out)
        run(u, p, 0.0, f, ob)
        if not np.array_equal(ob, out):
            raise AssertionError("C5: bound eval_into differs from eval_into")
        # LaneSparseBlocks against the (CasADi-checked) Csr values
        from esmjac.layouts.types import untile
        P = int(lsb.info["slots_per_lane"])
        Vl = untile(out, P, L, lsb.tile_width(L))
        order = lsb.info.get("ordering", list(range(n)))
        keys = [tuple(x) for x in lsb.info["lu_pattern"]]
        R = lane_values(M, [(order[a], order[b]) for a, b in keys], L)
        if not np.array_equal(Vl, R):
            raise AssertionError("C5: LaneSparseBlocks differs from Csr")
        res = interleaved({"casadi C": lambda: cp.jac(u, p, fe, oj, L),
                           "eval_into LaneSparseBlocks": lambda: j.eval_into(lsb, u, p, 0.0, f, out, ws),
                           "bound eval_into LaneSparseBlocks": lambda: run(u, p, 0.0, f, ob)}, self.calls)
        ca_s = res["casadi C"][0]
        self.rec["c5"] = {k: v[0] for k, v in res.items()}
        self.rec["c5"].update(engine=j.kernel.engine, verify_err=err, route=cp.info.get("route"))
        self.tables.append((f"C5: synthetic {n_species} species × {cells} cells, one thread (CPU ms per call)",
                            ["route", "median ms", "min ms", "× CasADi C"],
                            [(k, f"{v[0] * 1e3:.3f}", f"{v[1] * 1e3:.3f}", f"{v[0] / ca_s:.2f}")
                             for k, v in res.items()]))
        e = res["eval_into LaneSparseBlocks"][0]
        b = res["bound eval_into LaneSparseBlocks"][0]
        self.line("C5", e * 1.5 <= ca_s,
                  f"{n_species} species × {cells} cells: eval_into LaneSparseBlocks / CasADi C = {e / ca_s:.2f} "
                  f"({ca_s / e:.2f}× faster; {e * 1e3:.2f} vs {ca_s * 1e3:.2f} ms; bound {b / ca_s:.2f}; engine "
                  f"{j.kernel.engine}; target ≥ 1.5× faster, ratio ≤ 0.67)")

    def tiles(self) -> None:
        import numba

        from esmjac.layouts.types import Csr, LaneBlocks, LaneSparseBlocks, untile
        from esmjac.models.mechanism import lift
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        from peers import handrolled

        numba.set_num_threads(1)
        tropo = json.loads((pathlib.Path(__import__("esmjac.models", fromlist=["x"]).__file__).parent
                            / "tropo12.esm").read_text())
        N = 10_000
        doc = lift(tropo, N)
        t0 = time.perf_counter()
        r = RhsProgram.build(doc)
        j = JacobianProgram.build(doc)
        self.log(f"built tropo12 x {N}: {time.perf_counter() - t0:.1f} s ({j.kernel.engine})")
        hr = handrolled(doc)
        n = j.n_species
        rng = np.random.default_rng(0)

        def point(L):
            u = np.tile(r.u0.reshape(n, N), (1, -(-L // N)))[:, :L]
            u = np.ascontiguousarray(u * rng.uniform(0.5, 1.5, u.shape)).ravel()
            nf = r.forcing0.size // N
            f = np.ascontiguousarray(np.tile(r.forcing0.reshape(nf, N), (1, -(-L // N)))[:, :L]).ravel()
            return u, f

        p = r.p0
        hp = hr.default_p()
        if not np.array_equal(hp, p):
            raise AssertionError("hand-rolled peer's parameters differ from the program's")
        u, f = point(N)

        # -- verify every route (independent: Csr vs hand-rolled, layouts vs Csr)
        csr = j.plan(Csr(), source=r)
        ocsr = np.zeros(csr.out_size(N))
        j.eval_into(csr, u, p, 0.0, f, ocsr, j.new_workspace())
        D = _dense_lanes(csr, ocsr, n, N, r)
        hout = np.zeros(len(hr.pattern) * N)
        hr.jac(u, hp, f, hout, N)
        H = np.zeros_like(D)
        for k, (a, b) in enumerate(hr.pattern):
            H[a, b] = hout[k * N:(k + 1) * N]
        err = np.max(np.abs(H - D)) / np.max(np.abs(D))
        if err > 1e-12:
            raise AssertionError(f"esmjac Csr vs hand-rolled: relative error {err:.3g}")
        rout, hrout = np.empty_like(u), np.empty_like(u)
        r.eval_into(u, p, 0.0, f, rout)
        hr.rhs(u, hp, f, hrout, N)
        rerr = np.max(np.abs(rout - hrout)) / np.max(np.abs(hrout))
        if rerr > 1e-12:
            raise AssertionError(f"esmjac RHS vs hand-rolled: relative error {rerr:.3g}")
        self.log(f"verified: Csr vs hand-rolled {err:.2g}, RHS {rerr:.2g}")

        def lane_route(lay, L, uu, ff):
            plan = j.plan(lay, source=r)
            ws = j.new_workspace(L)
            out = np.zeros(plan.out_size(L))
            j.eval_into(plan, uu, p, 0.0, ff, out, ws)
            return plan, ws, out

        def check_lanes(plan, out, L, Dref):
            P = int(plan.info["slots_per_lane"])
            V = untile(out, P, L, plan.tile_width(L))
            order = plan.info.get("ordering", list(range(n)))
            if "lu_pattern" in plan.info:
                keys = [tuple(x) for x in plan.info["lu_pattern"]]
            else:
                keys = [(a, b) for a in range(n) for b in range(n)]
            R = np.stack([Dref[order[a], order[b]] for a, b in keys])
            e = np.max(np.abs(V - R)) / np.max(np.abs(R))
            if e > 0:
                raise AssertionError(f"{plan.layout} differs from Csr by {e:.3g}")

        routes = {}
        for lay in (LaneSparseBlocks(), LaneBlocks(), Csr()):
            plan, ws, out = lane_route(lay, N, u, f)
            if not isinstance(lay, Csr):
                check_lanes(plan, out, N, D)
            routes[lay.name] = (lambda plan=plan, ws=ws, out=out: j.eval_into(plan, u, p, 0.0, f, out, ws))
        sc = r.new_buffers()
        run_r = r.bind()
        bout = np.empty_like(u)
        run_r(u, p, 0.0, f, bout)
        if not np.array_equal(bout, rout):
            raise AssertionError("bound RHS differs from eval_into")
        lsb = j.plan(LaneSparseBlocks(), source=r)
        run_j = j.bind(lsb, j.new_workspace(N))
        bj = np.zeros(lsb.out_size(N))
        run_j(u, p, 0.0, f, bj)
        check_lanes(lsb, bj, N, D)
        fns = {"hand-rolled jac": lambda: hr.jac(u, hp, f, hout, N),
               "eval_into LaneSparseBlocks": routes["lanesparseblocks"],
               "bound eval_into LaneSparseBlocks": lambda: run_j(u, p, 0.0, f, bj),
               "eval_into LaneBlocks": routes["laneblocks-natural"],
               "eval_into Csr": routes["csr"],
               "hand-rolled rhs": lambda: hr.rhs(u, hp, f, hrout, N),
               "rhs": lambda: r.eval_into(u, p, 0.0, f, rout, sc),
               "bound rhs": lambda: run_r(u, p, 0.0, f, bout)}
        res = interleaved(fns, self.calls)
        self.rec["t1"] = {k: v[0] for k, v in res.items()}
        hj, hrh = res["hand-rolled jac"][0], res["hand-rolled rhs"][0]
        rows = [(k, f"{v[0] * 1e6:.1f}", f"{v[1] * 1e6:.1f}",
                 f"{v[0] / (hj if 'rhs' not in k else hrh):.2f}") for k, v in res.items()]
        self.tables.append(("tropo12 × 10⁴ cells, one thread, float64 (CPU µs per call)",
                            ["route", "median µs", "min µs", "× hand-rolled"], rows))
        lsb = res["eval_into LaneSparseBlocks"][0]
        self.line("T1", lsb <= hj, f"eval_into LaneSparseBlocks (default tile) / hand-rolled = "
                  f"{lsb / hj:.2f} ({lsb * 1e6:.0f} vs {hj * 1e6:.0f} µs; LaneBlocks "
                  f"{res['eval_into LaneBlocks'][0] / hj:.2f}, Csr {res['eval_into Csr'][0] / hj:.2f}; "
                  f"target ≤ 1.0)")
        rh = res["rhs"][0]
        brh = res["bound rhs"][0]
        self.line("T1", rh <= hrh, f"RHS (eval_into) / hand-rolled RHS = {rh / hrh:.2f} ({rh * 1e6:.0f} vs "
                  f"{hrh * 1e6:.0f} µs; bound RHS {brh / hrh:.2f}, {brh * 1e6:.0f} µs; bound eval_into "
                  f"LaneSparseBlocks {res['bound eval_into LaneSparseBlocks'][0] / hj:.2f}; target ≤ 1.0)")

        # -- tile sweep
        sweep = {}
        outs = {}
        for W in (4, 8, 16, 32, 64, None):
            plan, ws, out = lane_route(LaneSparseBlocks(tile=W), N, u, f)
            check_lanes(plan, out, N, D)
            sweep[f"tile={W}"] = (lambda plan=plan, ws=ws, out=out: j.eval_into(plan, u, p, 0.0, f, out, ws))
            outs[W] = out
        sweep["hand-rolled jac"] = fns["hand-rolled jac"]
        sres = interleaved(sweep, self.calls)
        self.rec["sweep"] = {k: v[0] for k, v in sres.items()}
        hj2 = sres["hand-rolled jac"][0]
        self.tables.append(("Tile width sweep: eval_into LaneSparseBlocks(tile=W), tropo12 × 10⁴",
                            ["W", "median µs", "× hand-rolled"],
                            [(k, f"{v[0] * 1e6:.1f}", f"{v[0] / hj2:.2f}") for k, v in sres.items()]))
        best = min((k for k in sres if k.startswith("tile=")), key=lambda k: sres[k][0])
        self.log(f"fastest tile: {best}")
        self.rec["best_tile"] = best

        # -- T2: byte bound at 10^5 / 10^6 lanes
        bw = triad_bandwidth()
        self.rec["bandwidth_GBs"] = bw / 1e9
        lsb_plan = j.plan(LaneSparseBlocks(), source=r)
        P = int(lsb_plan.info["slots_per_lane"])
        nf = r.forcing0.size // N
        for L in ((100_000,) if self.quick else (100_000, 1_000_000)):
            uu, ff = point(L)
            ws = j.new_workspace(L)
            out = np.zeros(lsb_plan.out_size(L))
            j.eval_into(lsb_plan, uu, p, 0.0, ff, out, ws)
            ro = np.empty_like(uu)
            scL = r.new_buffers(L)
            r.eval_into(uu, p, 0.0, ff, ro, scL)
            # the first 10^4 lanes must equal a 10^4-lane call on the same cells (bitwise)
            Vl = untile(out, P, L, lsb_plan.tile_width(L))
            u0 = np.ascontiguousarray(uu.reshape(n, L)[:, :N]).ravel()
            f0 = np.ascontiguousarray(ff.reshape(nf, L)[:, :N]).ravel()
            o0 = np.zeros(lsb_plan.out_size(N))
            j.eval_into(lsb_plan, u0, p, 0.0, f0, o0, j.new_workspace(N))
            if not np.array_equal(untile(o0, P, N, lsb_plan.tile_width(N)), Vl[:, :N]):
                raise AssertionError(f"{L} lanes: the first {N} lanes differ from a {N}-lane call")
            jb = (n + nf) * 8 + 2 * P * 8 * lsb_plan.capacity(L) / L
            rb = (n + nf) * 8 + 2 * n * 8
            calls = 50
            bjL, brL = j.bind(lsb_plan, j.new_workspace(L)), r.bind(L)
            obL, roL = np.zeros_like(out), np.empty_like(ro)
            bjL(uu, p, 0.0, ff, obL)
            brL(uu, p, 0.0, ff, roL)
            if not (np.array_equal(obL, out) and np.array_equal(roL, ro)):
                raise AssertionError(f"bound calls at {L} lanes differ from eval_into")
            t = interleaved({"jac": lambda: j.eval_into(lsb_plan, uu, p, 0.0, ff, out, ws),
                             "rhs": lambda: r.eval_into(uu, p, 0.0, ff, ro, scL),
                             "bound jac": lambda: bjL(uu, p, 0.0, ff, obL),
                             "bound rhs": lambda: brL(uu, p, 0.0, ff, roL)}, calls)
            if not np.all(np.isfinite(Vl)):
                raise AssertionError("non-finite Jacobian at large L")
            if L == 100_000:                 # the tile sweep where the output leaves the caches
                sw = {}
                for W in (8, 16, 32, None):
                    pw = j.plan(LaneSparseBlocks(tile=W), source=r)
                    ow = np.zeros(pw.out_size(L))
                    wsw = j.new_workspace(L)
                    j.eval_into(pw, uu, p, 0.0, ff, ow, wsw)
                    if not np.array_equal(untile(ow, P, L, pw.tile_width(L)), Vl):
                        raise AssertionError(f"tile={W} differs from the default tile at {L} lanes")
                    sw[f"tile={W}"] = (lambda pw=pw, ow=ow, wsw=wsw: j.eval_into(pw, uu, p, 0.0, ff, ow, wsw))
                swr = interleaved(sw, 50)
                self.rec["sweep_1e5"] = {k: v[0] for k, v in swr.items()}
                self.tables.append(("Tile width sweep at 10⁵ lanes (eval_into LaneSparseBlocks(tile=W))",
                                    ["W", "median ms"], [(k, f"{v[0] * 1e3:.2f}") for k, v in swr.items()]))
                del sw, ow, wsw
            # eval_into also copies the point into its workspace (read, and
            # written with write-allocate): bytes the bound leaves out.
            pc = 3 * (n + nf) * 8
            for what, bytes_, (med, _), (bmed, _) in (
                    ("eval_into LaneSparseBlocks", jb, t["jac"], t["bound jac"]),
                    ("RHS", rb, t["rhs"], t["bound rhs"])):
                bound = bytes_ * L / bw
                self.rec[f"t2_{what}_{L}"] = {"median_s": med, "bound_s": bound, "bytes_per_cell": bytes_,
                                              "bound_call_s": bmed}
                extra = (f"; with the point copy counted ({bytes_ + pc:.0f} B/cell) "
                         f"{med / ((bytes_ + pc) * L / bw):.2f}×" if what.startswith("eval") else "")
                self.line("T2", med <= 1.5 * bound,
                          f"{what} at {L:.0e} lanes: {med * 1e3:.2f} ms = {med / bound:.2f}× the byte bound "
                          f"({bytes_:.0f} B/cell at {bw / 1e9:.1f} GB/s = {bound * 1e3:.2f} ms; bound call "
                          f"{bmed * 1e3:.2f} ms = {bmed / bound:.2f}×{extra}; target ≤ 1.5×)")
            del uu, ff, out, ro, ws, scL, bjL, brL, obL, roL

        # -- T6: fixed cost at one cell
        u1, f1 = point(1)
        plan1 = j.plan(LaneSparseBlocks(), source=r)
        ws1 = j.new_workspace(1)
        o1 = np.zeros(plan1.out_size(1))
        h1 = np.zeros(len(hr.pattern))
        ro1, hro1 = np.empty_like(u1), np.empty_like(u1)
        sc1 = r.new_buffers(1)
        j.eval_into(plan1, u1, p, 0.0, f1, o1, ws1)
        hr.jac(u1, hp, f1, h1, 1)
        # the per-call path decided once (#16 item 5): bound calls, verified
        bj1, br1 = j.bind(plan1, j.new_workspace(1)), r.bind(1)
        o1b, ro1b = np.zeros_like(o1), np.empty_like(u1)
        bj1(u1, p, 0.0, f1, o1b)
        br1(u1, p, 0.0, f1, ro1b)
        r.eval_into(u1, p, 0.0, f1, ro1, sc1)
        if not (np.array_equal(o1b, o1) and np.array_equal(ro1b, ro1)):
            raise AssertionError("bound calls at 1 cell differ from eval_into")
        pt = j.plan(LaneSparseBlocks(tile=None), source=r)
        bjn = j.bind(pt, j.new_workspace(1))
        o1n = np.zeros(pt.out_size(1))
        bjn(u1, p, 0.0, f1, o1n)
        if not np.array_equal(untile(o1, int(plan1.info["slots_per_lane"]), 1, plan1.tile_width(1)).ravel(),
                              o1n):
            raise AssertionError("tile=None at 1 cell differs from the default tile")
        t6 = interleaved({"hand jac": lambda: hr.jac(u1, hp, f1, h1, 1),
                          "bound eval_into": lambda: bj1(u1, p, 0.0, f1, o1b),
                          "bound eval_into tile=None": lambda: bjn(u1, p, 0.0, f1, o1n),
                          "eval_into": lambda: j.eval_into(plan1, u1, p, 0.0, f1, o1, ws1),
                          "hand rhs": lambda: hr.rhs(u1, hp, f1, hro1, 1),
                          "bound rhs": lambda: br1(u1, p, 0.0, f1, ro1b),
                          "rhs": lambda: r.eval_into(u1, p, 0.0, f1, ro1, sc1)}, 200)
        self.rec["t6"] = {k: v[0] for k, v in t6.items()}
        for what, a, b, extra in (
                ("bound eval_into", "bound eval_into", "hand jac",
                 f"; the partial tile computes its one real lane and repeats it into the padding; tile=None "
                 f"{t6['bound eval_into tile=None'][0] * 1e6:.2f} µs; unbound eval_into "
                 f"{t6['eval_into'][0] * 1e6:.2f} µs"),
                ("bound RHS", "bound rhs", "hand rhs", f"; unbound eval_into {t6['rhs'][0] * 1e6:.2f} µs")):
            ratio = t6[a][0] / t6[b][0]
            self.line("T6", ratio <= 3.0, f"{what} at 1 cell: {t6[a][0] * 1e6:.2f} µs vs hand-rolled "
                      f"{t6[b][0] * 1e6:.2f} µs = {ratio:.2f}× (target ≤ 3×{extra})")

    def markdown(self) -> str:
        out = [BEGIN, "## Lane tiles and direct writes (T1, T2, T6; `benchmarks/bench_tiles.py`)", "",
               f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one numba thread, "
               f"CPU time per call (`time.thread_time`), interleaved, medians of ≥ 50 warm calls; "
               f"load average before {self.rec['load_before']}, after {self.rec.get('load_after')} "
               "(a machine shared by ~8 engineers: ratios are side by side in one run).", ""]
        out += self.lines + [""]
        out += ["Notes: the byte bound counts the state and forcing read once and every stored output "
                "value twice (write-allocate); `eval_into` also copies the point into its workspace "
                "(`contract` and `apply` use the point of the last `eval_into`, whatever the caller does "
                "with `u` afterwards: (15+1)·8 B read + written twice more per cell), which the bound does "
                "not count. T6 times the bound calls (`prog.bind`, #16 item 5: the per-call path decided "
                "once); the unbound `eval_into` (argument, alias and workspace checks, the point copy) is "
                "printed beside. At one cell the default tile is one partial tile: its one real lane is "
                "computed (a lane loop storing the tile's slots directly) and repeated into the 15 padding "
                "lanes the layout stores; `tile=None` (no padding) is printed beside. Every cell chunk counts the non-finite values it stores "
                "(no second pass over the output).", ""]
        for title, head, rows in self.tables:
            out += [f"**{title}**", "", "| " + " | ".join(head) + " |",
                    "|" + "---|" * len(head)] + ["| " + " | ".join(map(str, r)) + " |" for r in rows] + [""]
        out.append(END)
        return "\n".join(out) + "\n"


def write_section(path: pathlib.Path, text: str) -> None:
    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        a, b = old.index(BEGIN), old.index(END) + len(END)
        new = old[:a] + text.rstrip("\n") + old[b:]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="bench_tiles")
    ap.add_argument("--quick", action="store_true", help="10^5 lanes only for T2")
    ap.add_argument("--results", default=None, help="RESULTS.md to update (a marked section)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="comma-separated parts: T1,T2,T6 (one run) and/or C5")
    a = ap.parse_args(argv)
    b = TileBench(quick=a.quick)
    b.run(None if a.only is None else {x.strip().upper() for x in a.only.split(",")})
    md = b.markdown()
    print(md)
    if a.results:
        write_section(pathlib.Path(a.results), md)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(b.rec, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
