"""Peers (T1) on tropo12: hand-rolled SymPy->Numba, SciPy grouped finite
differences, earthsci-ast's RHS, JAX, CasADi, each verified against esmjac
before it is timed. Each function takes ``ctx``, the run's
:class:`common.Bench`.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np

from esmjac.runtime.threads import numba_threads

from common import (CHEM_SIZES, FUSED, TROPO12, block_pattern_from_csr, csr_of, fused_workspace,
                    lane_err, lane_values, point, rel_err, time_calls, time_many)


def run_peers(ctx) -> None:
    if ctx.peers is None:
        ctx.skip("peers", "benchmarks/peers.py not found")
        return
    sizes = CHEM_SIZES[ctx.mode]
    hr = None
    for N in sizes:
        hr = peers_at(ctx, N, hr)


def peers_at(ctx, L: int, hr):
    from esmjac.layouts.types import Csr
    pe = ctx.peers
    src = str(TROPO12)
    key = ("tropo12", L)
    if key not in ctx.cache:
        ctx.programs(key, ctx.chem_doc("tropo12", L))
    ent = ctx.cache[key]
    r, j = ent["r"], ent["j"]
    if "point" not in ent:
        ent["point"] = point(r, 1)
    u, f = ent["point"]
    p = r.p0
    n = j.n_species
    plans = ent["plans"]
    if "csr" not in plans:
        plans["csr"] = j.plan(Csr(), source=r)
    ws = j.new_workspace()
    oc = np.zeros(plans["csr"].out_size(L))
    j.eval_into(plans["csr"], u, p, 0.0, f, oc, ws)
    M = csr_of(plans["csr"], oc)
    ours_pattern = block_pattern_from_csr(plans["csr"], n, L)
    ours_rhs = np.empty_like(u)
    r.eval_into(u, p, 0.0, f, ours_rhs)
    first = L == CHEM_SIZES[ctx.mode][0]
    big = L > 10_000
    if "lanesparseblocks" not in plans:
        from esmjac.layouts.types import LaneSparseBlocks
        plans["lanesparseblocks"] = j.plan(LaneSparseBlocks(), source=r)
    psb = plans["lanesparseblocks"]
    wsb = j.new_workspace()
    osb = np.zeros(psb.out_size(L))
    orh = np.empty_like(u)
    scr = r.new_buffers()

    def lane_check(peer_pattern, peer_vals, name, floor=1e-8, log_scaled=False, rtol=1e-10):
        union = sorted(set(peer_pattern) | set(ours_pattern))
        pos = {rc: k for k, rc in enumerate(peer_pattern)}
        A = np.zeros((len(union), L))
        for k, rc in enumerate(union):
            if rc in pos:
                A[k] = peer_vals[pos[rc]]
        R = lane_values(M, union, L)
        scale = None
        if log_scaled:
            pc = np.array([c for _, c in union], dtype=np.int64)
            scale = np.abs(u.reshape(n, L)[pc])
        err = lane_err(A, R, union, n, floor, scale)
        if not err <= rtol:
            raise AssertionError(f"{name}: differs from esmjac's eval_into at {L} cells: "
                                 f"max rel err {err:.3e} > {rtol:.0e}")
        return err

    # -- lane-kernel peers: build, verify, then time interleaved with esmjac
    fns = {("esmjac", "jac"): lambda: j.eval_into(psb, u, p, 0.0, f, osb, wsb),
           ("esmjac", "rhs"): lambda: r.eval_into(u, p, 0.0, f, orh, scr)}
    wsf = fused_workspace(j, psb)
    if wsf is not None:
        osf = np.zeros_like(osb)
        fns[("esmjac", "jac" + FUSED)] = lambda: j.eval_into(psb, u, p, 0.0, f, osf, wsf)
    info: dict = {}
    lane_peers = [("handrolled", None)]
    if not big:                       # JAX and CasADi recompile per lane count: 10^4 cells only
        if ctx.quick:
            ctx.skip("peer jax", "--quick (slow peer)")
        else:
            lane_peers.append(("jax", pe.jax_peer))
        lane_peers.append(("casadi", pe.casadi_peer))
    for name, mk in lane_peers:
        try:
            if name == "handrolled":
                if hr is None:
                    hr = pe.handrolled(src)
                    hr._bench_e8 = pe.check_peer_against_assemble(hr, src)
                    ctx.log(f"  hand-rolled built in {hr.build_s:.2f} s; vs assemble (8 cells) "
                             f"{hr._bench_e8:.2e}")
                peer, e8 = hr, hr._bench_e8
            else:
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    peer = mk(src, L=L)
                if peer is None:
                    ctx.skip(f"peer {name}", buf.getvalue().strip() or "not importable")
                    continue
                e8 = pe.check_peer_against_assemble(peer, src)
            oj = np.empty(peer.nnz * L)
            peer.jac(u, p, f, oj, L)
            err = lane_check(peer.pattern, oj.reshape(peer.nnz, L), name)
            fns[(name, "jac")] = (lambda peer=peer, oj=oj: peer.jac(u, p, f, oj, L))
            info[(name, "jac")] = dict(build_s=peer.build_s, verify_err=err, verify_assemble_err=e8,
                                       nnz_per_cell=peer.nnz,
                                       route=getattr(peer, "info", {}).get("route", "jit")
                                       if name != "handrolled" else "sympy-cse-njit")
            if peer.rhs is not None:
                orr = np.empty(n * L)
                peer.rhs(u, p, f, orr, L)
                info[(name, "rhs")] = dict(verify_err=rel_err(orr, ours_rhs, 1e-8))
                fns[(name, "rhs")] = (lambda peer=peer, orr=orr: peer.rhs(u, p, f, orr, L))
        except Exception as exc:                     # noqa: BLE001
            ctx.error(f"peer {name} at {L}", exc)
    with numba_threads(1):
        res = time_many(fns, ctx.calls if not big else 50)
    ours_t = res[("esmjac", "jac")][0]
    ours_r = res[("esmjac", "rhs")][0]
    ours_f = res[("esmjac", "jac" + FUSED)][0] if ("esmjac", "jac" + FUSED) in res else None
    for (name, what), (med, mn, k) in res.items():
        if name == "esmjac":
            ctx.add("peers", "tropo12", "esmjac.eval_into" + what[3:] if what.startswith("jac") else "esmjac.rhs",
                     "lanesparseblocks" if what.startswith("jac") else "-", "float64", L, 1, med, min_s=mn,
                     n_calls=k, note="timed interleaved with the lane peers")
            continue
        extra = dict(info.get((name, what), {}))
        if what == "jac":
            extra["peer_over_ours"] = med / ours_t
            if ours_f:
                extra["peer_over_ours_fused"] = med / ours_f
            if name == "handrolled":
                extra["t1_ratio"] = ours_t / med
                if ours_f:
                    extra["t1_ratio_fused"] = ours_f / med
        else:
            extra["peer_over_ours"] = med / ours_r
        ctx.add("peers", "tropo12", f"{name}.{what}", "pattern" if what == "jac" else "-", "float64", L, 1,
                 med, min_s=mn, n_calls=k, **extra)

    def vs_ours(rec_t):
        return rec_t / ours_t

    # -- SciPy FD over our RHS, earthsci-ast's RHS and SciPy FD over it
    sparsity = csr_of(plans["csr"], np.ones(int(plans["csr"].info["nnz"])))
    fd_calls = (5, 3) if not big else (3, 2)
    try:
        fd = pe.scipy_fd(lambda uu: r(0.0, uu), n * L, sparsity)
        if first:
            doc8 = ctx.chem_doc("tropo12", 8)
            from esmjac.runtime.programs import RhsProgram
            r8 = RhsProgram.build(doc8)
            pat8 = pe.lane_sparsity(ours_pattern, n, 8)
            e8 = pe.check_peer_against_assemble(pe.scipy_fd(lambda uu: r8(0.0, uu), n * 8, pat8), src)
        else:
            e8 = None
        A = fd(u)
        err = lane_check(ours_pattern, lane_values(A, ours_pattern, L), "scipy_fd(esmjac rhs)",
                         floor=1e-3, log_scaled=True, rtol=1e-4)
        with numba_threads(1):
            m, mn, k = time_calls(lambda: fd(u), fd_calls[0], warmup=1)
        ctx.add("peers", "tropo12", "scipy_fd(esmjac.rhs)", "csr", "float64", L, 1, m, min_s=mn, n_calls=k,
                 groups=fd.n_groups, verify_err=err, verify_assemble_err=e8, peer_over_ours=vs_ours(m))
    except Exception as exc:                         # noqa: BLE001
        ctx.error(f"peer scipy_fd(esmjac rhs) at {L}", exc)

    if ctx.quick:
        ctx.skip("peers earthsci-ast RHS and SciPy FD over it", "--quick (slow peers)")
        return hr
    try:
        doc = ent["doc"]
        er = pe.earthsci_rhs(doc)
        if list(er.names) != list(r.names):
            raise AssertionError("earthsci-ast's element order differs from esmjac's")
        err_r = rel_err(er(u), ours_rhs, 1e-8)
        if not err_r <= 1e-10:
            raise AssertionError(f"earthsci-ast RHS differs from esmjac's: {err_r:.2e}")
        m, mn, k = time_calls(lambda: er(u), 20 if big else 50, warmup=1)
        ctx.add("peers", "tropo12", "earthsci_ast.rhs", "-", "float64", L, 1, m, min_s=mn, n_calls=k,
                 build_s=er.build_s, verify_err=err_r, peer_over_ours=m / ours_r)
        fde = pe.scipy_fd(er, n * L, sparsity)
        if first:
            er8 = pe.earthsci_rhs(ctx.chem_doc("tropo12", 8))
            e8 = pe.check_peer_against_assemble(pe.scipy_fd(er8, n * 8, pe.lane_sparsity(ours_pattern, n, 8)),
                                                src)
        else:
            e8 = None
        A = fde(u)
        err = lane_check(ours_pattern, lane_values(A, ours_pattern, L), "scipy_fd(earthsci rhs)",
                         floor=1e-3, log_scaled=True, rtol=1e-4)
        m, mn, k = time_calls(lambda: fde(u), fd_calls[1], warmup=1)
        ctx.add("peers", "tropo12", "scipy_fd(earthsci_ast.rhs)", "csr", "float64", L, 1, m, min_s=mn,
                 n_calls=k, groups=fde.n_groups, verify_err=err, verify_assemble_err=e8,
                 peer_over_ours=vs_ours(m))
    except Exception as exc:                         # noqa: BLE001
        ctx.error(f"peer earthsci-ast at {L}", exc)
    return hr
