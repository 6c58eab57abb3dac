"""Forward (tangent-linear) and discrete adjoint sensitivities of the leaf's
Rosenbrock steps, per lane (Sandu, Daescu, Carmichael, "Direct and adjoint
sensitivity analysis of chemical kinetic systems with KPP", Atmos. Environ.
37 (2003) 5083–5096).

The forward solve records every accepted step of every lane (its state and
step size); the sensitivities then differentiate *those* steps exactly (the
discrete adjoint: step sizes are frozen, as in KPP). One Rosenbrock step
(transformed form, autonomous)::

    W = I/(hγ) − J(y),   Y_i = y + Σ_j a_ij k_j,
    W k_i = f(Y_i) + Σ_j (c_ij/h) k_j,   y⁺ = y + Σ_i m_i k_i.

Tangent-linear (direction δy, δp)::

    W δk_i = J(Y_i) δY_i + J_p(Y_i) δp + Σ_j (c_ij/h) δk_j
             + ∂_y(J(y) k_i) δy + ∂_p(J(y) k_i) δp,     δy⁺ = δy + Σ m_i δk_i.

Adjoint (λ = ∂φ/∂y⁺), stages in reverse::

    u_i = W⁻ᵀ (m_i λ + Σ_{l>i} [a_li J(Y_l)ᵀ u_l + (c_li/h) u_l])
    λ⁻  = λ + Σ_i [J(Y_i)ᵀ u_i + ∇_y(u_iᵀ J(y) k_i)]
    ḡ_p += Σ_i [J_p(Y_i)ᵀ u_i + ∇_p(u_iᵀ J(y) k_i)].

``J(Y)ᵀu`` and ``J_p(Y)ᵀu`` are the programs' ``apply_transpose`` (``apply``
for the tangent); the second-order terms use the second-order fields behind
``contract`` (evaluated once per step at ``y``, contracted here for both the
state and the mixed state–parameter terms). ``W⁻ᵀ`` is the transposed sparse
LU solve. Each recorded step is replayed on exactly its own lanes (compact), and
the Jacobians are evaluated once per distinct stage point.
"""
from __future__ import annotations

import numba
import numpy as np

from ..errors import JacError

__all__ = ["Sensitivities"]

_JIT = dict(cache=True, nogil=True, error_model="numpy")


@numba.njit(**_JIT)
def _hess_adj(D, L, row, site, pcol, lam, v, out):
    """out[site] += lam[row]·v[pcol]·D (= contract: ∇(λᵀ J v))."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        for l in range(L):
            out[w * L + l] += lam[r * L + l] * v[c * L + l] * D[q * L + l]


@numba.njit(**_JIT)
def _hess_tlm(D, L, row, site, pcol, v, dy, out):
    """out[row] += D·v[pcol]·dy[site] (= ∂_y(J(y) v)·dy)."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        for l in range(L):
            out[r * L + l] += D[q * L + l] * v[c * L + l] * dy[w * L + l]


@numba.njit(**_JIT)
def _hessp_adj(D, L, row, site, pcol, plane, nl, lam, v, gp):
    """gp[col] += lam[row]·v[site]·D for the parameter column of each field
    (lane columns at c*L + l, scalar ones after them: summed over lanes)."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        if plane[q]:
            for l in range(L):
                gp[c * L + l] += lam[r * L + l] * v[w * L + l] * D[q * L + l]
        else:
            acc = 0.0
            for l in range(L):
                acc += lam[r * L + l] * v[w * L + l] * D[q * L + l]
            gp[nl * L + c] += acc


@numba.njit(**_JIT)
def _hessp_tlm(D, L, row, site, pcol, plane, nl, v, dp, out):
    """out[row] += D·v[site]·dp[col] (= ∂_p(J(y) v)·dp)."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        for l in range(L):
            d = dp[c * L + l] if plane[q] else dp[nl * L + c]
            out[r * L + l] += D[q * L + l] * v[w * L + l] * d


def _slab_eval(prog, plan, ws, y, p, fz, m, out):
    """Fill ``ws``'s band slab at ``y`` for ``apply``/``apply_transpose``.

    The products only read the slab, so the plan's scatter into ``out`` (and
    its checks) is skipped when the program exposes its kernel runner; the
    public ``eval_into`` is the fallback."""
    run = getattr(prog, "_run", None)
    if run is None or not hasattr(ws, "slab") or prog.kernel.engine not in ("codegen", "tape"):
        prog.eval_into(plan, y, p, 0.0, fz if prog.f_size(m) else None, out, ws)
        return
    dt = np.dtype(np.float64)
    B = ws.slab(dt, prog.slab_size(m))
    run(prog.kernel, y, p, 0.0, fz, B, ws.h, ws.cix, m)
    ws.last_dtype = dt
    ws.last_plan = plan.fingerprint


class _Second:
    """Second-order fields of one program evaluated at a point, as arrays."""

    def __init__(self, prog):
        from ..runtime.second import second_order
        s = second_order(prog)
        self.prog, self.s = prog, s
        m = s.meta
        self.row, self.site, self.pcol = (np.ascontiguousarray(m[k], np.int64) for k in ("row", "site", "pcol"))
        self.plane = np.ascontiguousarray(m.get("plane", np.ones(self.row.size, bool)))
        self.nf = len(s.doc.fields)
        self.h = np.zeros(max(s.kernel.n_hoist, 1))

    def eval(self, y, p, fz, cix, L, D):
        self.prog._run(self.s.kernel, y, p, 0.0, fz, D, self.h, cix, L)


class Sensitivities:
    """Tangent-linear and adjoint replays of a leaf's recorded steps."""

    def __init__(self, leaf, wrt_parameters: bool):
        from ..layouts.types import LaneBlocks
        from ..runtime.programs import JacobianProgram
        from ._leaf import _Bound
        self.leaf = leaf
        self.jac = leaf.jac_program
        self.plan = leaf.plan
        self.sec = _Second(self.jac)
        self.jp = None
        if wrt_parameters:
            self.jp = JacobianProgram.build(leaf.source, leaf.model, wrt="parameters", options=leaf.options)
            self.plan_p = self.jp.plan(LaneBlocks("natural", tile=None))
            self.sec_p = _Second(self.jp)
            self.nl = int(self.jp.meta["n_lane_cols"])
        self.bound = _Bound(leaf, leaf.p, 0.0, 1)
        self._ws: dict = {}
        tab = leaf._tab
        pts, cur = [], 0
        for i in range(tab.stages):               # stage i's f argument: that of stage _point[i]
            if i == 0 or tab.newf[i]:
                cur = i
            pts.append(cur)
        self._point = tuple(pts)

    # -- per lane-count scratch ----------------------------------------------
    def _scratch(self, m: int):
        sc = self._ws.get(m)
        if sc is None:
            if len(self._ws) > 32:                 # lane counts vary call to call: keep a few
                self._ws.clear()
            n, S = self.leaf.n_species, self.leaf._tab.stages
            sc = {"ws": self.jac.new_workspace(m), "Jp": np.zeros(self.plan.out_size(m)),
                  "K": np.zeros((S, n * m)), "Ys": np.zeros((S, n * m)), "F": np.zeros(n * m),
                  "Fs": np.zeros(n * m), "J": np.zeros(self.plan.out_size(m)), "W": np.zeros(self.plan.out_size(m)),
                  "D": np.zeros(max(self.sec.nf * m, 1)), "bad": np.zeros(m, np.int64)}
            if self.jp is not None:
                sc["wsp"] = self.jp.new_workspace(m)
                sc["Pp"] = np.zeros(self.plan_p.out_size(m))
                sc["Dp"] = np.zeros(max(self.sec_p.nf * m, 1))
            self._ws[m] = sc
        return sc

    def _forward_stages(self, y, hs, fz, cix, m, sc, second: bool = True):
        """Recompute one step's stages (exactly the forward's arithmetic)."""
        from ..integrators import lanestep as LS
        from ..linalg.sparse_lu import CHUNK, factor_lanes, solve_lanes
        leaf, tab, lu = self.leaf, self.leaf._tab, self.leaf._lu
        n = leaf.n_species
        b = self.bound
        K, Ys, F, Fs = sc["K"], sc["Ys"], sc["F"], sc["Fs"]
        b.rhs(y, fz, cix, m, F)
        b.jac(y, fz, cix, m, sc["J"])
        LS._assemble_w(sc["J"], sc["W"], lu.diag_slots, hs, tab.gamma, m, m, lu.nnz)
        factor_lanes(sc["W"], lu.nnz, m, m, CHUNK, *lu._factor_ops(), sc["bad"])
        if np.any(sc["bad"][:m] >= 0):
            raise JacError("evaluation_error", "singular iteration matrix while replaying a recorded step")
        if cix.size == len(leaf.rhs_program.layout.cell_shape) * m and cix.size:
            for w in (sc["ws"], sc.get("wsp")):
                if w is not None:
                    w.cix = cix                   # the record's own cells (index-dependent models)
        Ys[0, :n * m] = y[:n * m]
        Fi = F
        for i in range(tab.stages):
            if i > 0:
                if tab.newf[i]:
                    ai, av = LS._nz(tab.a[i])
                    LS._combine(y, K, ai, av, leaf._perm, m, Ys[i])
                    b.rhs(Ys[i], fz, cix, m, Fs)
                    Fi = Fs
                else:
                    Ys[i, :n * m] = Ys[i - 1, :n * m]
            ci, cv = LS._nz(tab.c[i])
            LS._stage_rhs(Fi, K, i, ci, cv, hs, 0.0, sc["F"], leaf._perm, m)
            solve_lanes(sc["W"], K[i], lu.nnz, m, m, CHUNK, *lu._solve_ops())
        if not second:
            return
        self.sec.eval(y, leaf.p, fz, cix, m, sc["D"])
        if self.jp is not None:
            self.sec_p.eval(y, leaf.p, fz, cix, m, sc["Dp"])

    def _pad(self, lanes, ys, hs, fz_full, cix_full, L):
        """Compact copies of one record's lanes (y, h, forcing, cell indices)."""
        n, nf = self.leaf.n_species, len(self.leaf.forcing_names)
        k = m = lanes.size
        y = np.ascontiguousarray(ys.reshape(-1))
        h = np.ascontiguousarray(hs)
        fz = np.ascontiguousarray(fz_full.reshape(nf, L)[:, lanes].reshape(-1)) if nf else np.zeros(1)
        ncd = cix_full.size // L
        cix = np.ascontiguousarray(cix_full.reshape(ncd, L)[:, lanes].reshape(-1)) if ncd else np.zeros(1, np.int64)
        return m, k, y, h, fz, cix

    # -- adjoint ---------------------------------------------------------------
    def adjoint(self, records, lam, fz_full, cix_full, L, gp):
        """λ ← ∂φ/∂y(t0) in place (``lam[s*L + l]``); ``gp`` (the parameter
        program's column space at L lanes) accumulates ∂φ/∂p."""
        leaf, tab = self.leaf, self.leaf._tab
        n = leaf.n_species
        perm = leaf._perm
        S = tab.stages
        from ..linalg.sparse_lu import solve_transpose_lanes
        lu = leaf._lu
        for lanes, ys, hs in reversed(records):
            m, k, y, h, fz, cix = self._pad(lanes, ys, hs, fz_full, cix_full, L)
            sc = self._scratch(m)
            self._forward_stages(y, h, fz, cix, m, sc)
            lamk = np.zeros(n * m)
            lamk.reshape(n, m)[:, :k] = lam.reshape(n, L)[:, lanes]
            lam_new = lamk.copy()
            acc = np.zeros((S, n * m))            # permuted order
            K = sc["K"]
            hh = np.tile(h, n)
            at = -1
            for i in range(S - 1, -1, -1):
                kap = tab.m[i] * lamk.reshape(n, m)[perm].reshape(-1) + acc[i]
                solve_transpose_lanes(sc["W"], kap, lu.nnz, m, m, *lu._solve_ops())
                u_nat = np.empty(n * m)
                u_nat.reshape(n, m)[perm] = kap.reshape(n, m)
                g = np.zeros(n * m)
                pt = self._point[i]
                if pt != at:                      # J(Y_i) (and J_p) once per distinct stage point
                    at = pt
                    Yi = np.ascontiguousarray(sc["Ys"][i, :n * m])
                    _slab_eval(self.jac, self.plan, sc["ws"], Yi, leaf.p, fz, m, sc["Jp"])
                    if self.jp is not None:
                        _slab_eval(self.jp, self.plan_p, sc["wsp"], Yi, leaf.p, fz, m, sc["Pp"])
                self.jac.apply_transpose(self.plan, sc["ws"], u_nat, g)
                lam_new += g
                gperm = g.reshape(n, m)[perm].reshape(-1)
                for j in range(i):
                    a, c = tab.a[i][j], tab.c[i][j]
                    if a != 0.0:
                        acc[j] += a * gperm
                    if c != 0.0:
                        acc[j] += (c / hh) * kap
                k_nat = np.empty(n * m)
                k_nat.reshape(n, m)[perm] = K[i, :n * m].reshape(n, m)
                sec = self.sec
                _hess_adj(sc["D"], m, sec.row, sec.site, sec.pcol, u_nat, k_nat, lam_new)
                if self.jp is not None:
                    gpm = np.zeros(self.jp.col_size(m))
                    self.jp.apply_transpose(self.plan_p, sc["wsp"], u_nat, gpm)
                    sp = self.sec_p
                    _hessp_adj(sc["Dp"], m, sp.row, sp.site, sp.pcol, sp.plane, self.nl, u_nat, k_nat, gpm)
                    self._add_params(gp, gpm, lanes, k, m, L)
            lam.reshape(n, L)[:, lanes] = lam_new.reshape(n, m)[:, :k]

    def _add_params(self, gp, gpm, lanes, k, m, L):
        nl = self.nl
        if nl:
            gp[:nl * L].reshape(nl, L)[:, lanes] += gpm[:nl * m].reshape(nl, m)[:, :k]
        gp[nl * L:] += gpm[nl * m:]

    # -- frozen-step forward ----------------------------------------------------
    def replay(self, records, y, fz_full, cix_full, L, p=None):
        """Re-run the recorded steps (same lanes, same step sizes) from ``y``
        in place, optionally with other parameters: the map the tangent and
        adjoint differentiate (finite differences of it are their oracle)."""
        from ._leaf import _Bound
        leaf = self.leaf
        n = leaf.n_species
        saved = self.bound
        if p is not None:
            self.bound = _Bound(leaf, np.ascontiguousarray(p, dtype=np.float64), 0.0, 1)
        try:
            tab = leaf._tab
            for lanes, _, hs in records:
                k = lanes.size
                ys = y.reshape(n, L)[:, lanes]
                m, k, yc, h, fz, cix = self._pad(lanes, ys, hs, fz_full, cix_full, L)
                sc = self._scratch(m)
                self._forward_stages(yc, h, fz, cix, m, sc, second=False)
                from ..integrators import lanestep as LS
                mi, mv = LS._nz(tab.m)
                out = np.empty(n * m)
                LS._combine(yc, sc["K"], mi, mv, leaf._perm, m, out)
                y.reshape(n, L)[:, lanes] = out.reshape(n, m)[:, :k]
        finally:
            self.bound = saved

    # -- tangent linear --------------------------------------------------------
    def tangent(self, records, dy, dp, fz_full, cix_full, L):
        """dy ← δy(t0 + dt) in place given δy(t0) = dy and the parameter
        direction ``dp`` (parameter column space at L lanes, or None)."""
        leaf, tab = self.leaf, self.leaf._tab
        n = leaf.n_species
        perm = leaf._perm
        S = tab.stages
        from ..linalg.sparse_lu import CHUNK, solve_lanes
        lu = leaf._lu
        for lanes, ys, hs in records:
            m, k, y, h, fz, cix = self._pad(lanes, ys, hs, fz_full, cix_full, L)
            sc = self._scratch(m)
            self._forward_stages(y, h, fz, cix, m, sc)
            d = np.zeros(n * m)
            d.reshape(n, m)[:, :k] = dy.reshape(n, L)[:, lanes]
            dpm = None
            if dp is not None and self.jp is not None:
                nl = self.nl
                dpm = np.zeros(self.jp.col_size(m))
                if nl:
                    dpm[:nl * m].reshape(nl, m)[:, :k] = dp[:nl * L].reshape(nl, L)[:, lanes]
                dpm[nl * m:] = dp[nl * L:]
            dk = np.zeros((S, n * m))              # permuted
            K = sc["K"]
            d_new = d.copy()
            hh = np.tile(h, n)
            at = -1
            for i in range(S):
                dY = d.copy()
                for j in range(i):
                    a = tab.a[i][j]
                    if a != 0.0:
                        dkn = np.empty(n * m)
                        dkn.reshape(n, m)[perm] = dk[j].reshape(n, m)
                        dY += a * dkn
                r = np.zeros(n * m)
                if self._point[i] != at:
                    at = self._point[i]
                    Yi = np.ascontiguousarray(sc["Ys"][i, :n * m])
                    _slab_eval(self.jac, self.plan, sc["ws"], Yi, leaf.p, fz, m, sc["Jp"])
                    if dpm is not None:
                        _slab_eval(self.jp, self.plan_p, sc["wsp"], Yi, leaf.p, fz, m, sc["Pp"])
                self.jac.apply(self.plan, sc["ws"], dY, r)
                k_nat = np.empty(n * m)
                k_nat.reshape(n, m)[perm] = K[i, :n * m].reshape(n, m)
                sec = self.sec
                _hess_tlm(sc["D"], m, sec.row, sec.site, sec.pcol, k_nat, d, r)
                if dpm is not None:
                    self.jp.apply(self.plan_p, sc["wsp"], dpm, r)
                    sp = self.sec_p
                    _hessp_tlm(sc["Dp"], m, sp.row, sp.site, sp.pcol, sp.plane, self.nl, k_nat, dpm, r)
                rp = r.reshape(n, m)[perm].reshape(-1)
                for j in range(i):
                    c = tab.c[i][j]
                    if c != 0.0:
                        rp += (c / hh) * dk[j]
                solve_lanes(sc["W"], rp, lu.nnz, m, m, CHUNK, *lu._solve_ops())
                dk[i] = rp
                if tab.m[i] != 0.0:
                    dkn = np.empty(n * m)
                    dkn.reshape(n, m)[perm] = rp.reshape(n, m)
                    d_new += tab.m[i] * dkn
            dy.reshape(n, L)[:, lanes] = d_new.reshape(n, m)[:, :k]
