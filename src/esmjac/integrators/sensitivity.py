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

A W-method lane that reuses its Jacobian steps with ``W = I/(hγ) − J(y_J)``,
``y_J`` the state of the earlier step where it was evaluated (a record's
``fresh`` flag marks those steps). The derivative of the computed solution
then goes through ``y_J``: the tangent's second-order term is
``∂_y(J(y_J) k_i) δy_J`` (``δy_J`` kept per lane from that step), and the
adjoint's ``∇_y(u_iᵀ J(y_J) k_i)`` of every step sharing the Jacobian is
accumulated per lane (it is linear in the stage pair products ``u_i ⊗ k_i``)
and contracted with the second-order fields when the sweep reaches ``y_J``'s
step. The parameter terms follow the same way.

``J(Y)ᵀu`` and ``J_p(Y)ᵀu`` are the programs' ``apply_transpose`` (``apply``
for the tangent); the second-order terms use the second-order fields behind
``contract`` (evaluated once per step at ``y``, contracted here for both the
state and the mixed state–parameter terms). ``W⁻ᵀ`` is the transposed sparse
LU solve. Each recorded step is replayed on exactly its own lanes (compact), and
the Jacobians are evaluated once per distinct stage point.

Storage is the forward's: the Jacobian in the leaf's lane tiles (its
LaneSparseBlocks plan, ``tile``), the iteration matrix ``I/(hγ) − J``
formed while it is factored, in the factorization's own tiles
(:func:`~esmjac.integrators.lanestep.lu_tile`), by the forward's own kernel
(:func:`~esmjac.linalg.sparse_lu.factor_shifted_lanes`). Each lane's
arithmetic does not depend on the tiling, so a replay reproduces the
forward solve bit for bit and the sensitivities are the same bits for any
``tile`` (tests/integrators/test_sensitivity_tiles.py).
"""
from __future__ import annotations

import numba
import numpy as np

from ..compile.jitkeys import key_by_callees
from ..errors import JacError
from . import lanestep as LS
from ..layouts.types import LaneBlocks
from ..linalg.sparse_lu import CHUNK, factor_shifted_lanes, solve_lanes, solve_transpose_lanes, tiled_size
from ..runtime.kernels import lane_apply
from ..runtime.programs import JacobianProgram
from ..runtime.second import second_order
from ..runtime.threads import one_thread
from .bound import BoundPrograms, bind_kernel

__all__ = ["Sensitivities"]

_JIT = dict(cache=True, nogil=True, error_model="numpy")


@numba.njit(**_JIT)
def _hess_tlm(D, L, row, site, pcol, v, dy, out):
    """out[row] += D·v[pcol]·dy[site] (= ∂_y(J(y) v)·dy)."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        for l in range(L):
            out[r * L + l] += D[q * L + l] * v[c * L + l] * dy[w * L + l]


@numba.njit(**_JIT)
def _hessp_tlm(D, L, row, site, pcol, plane, nl, v, dp, out):
    """out[row] += D·v[site]·dp[col] (= ∂_p(J(y) v)·dp)."""
    for q in range(row.shape[0]):
        r, w, c = row[q], site[q], pcol[q]
        for l in range(L):
            d = dp[c * L + l] if plane[q] else dp[nl * L + c]
            out[r * L + l] += D[q * L + l] * v[w * L + l] * d



# -- the adjoint's fused kernels (permuted order: that of the LU and of K) ----

@numba.njit(**_JIT)
def _gather_perm(src, L, lanes, perm, m, dst):
    """dst[k*m + j] = src[perm[k]*L + lanes[j]] (natural, all lanes → permuted, compact)."""
    for k in range(perm.shape[0]):
        sk = src[perm[k] * L:(perm[k] + 1) * L]
        dk = dst[k * m:(k + 1) * m]
        for j in range(m):
            dk[j] = sk[lanes[j]]


@numba.njit(**_JIT)
def _scatter_perm(src, L, lanes, perm, m, dst):
    """dst[perm[k]*L + lanes[j]] = src[k*m + j] (the inverse of :func:`_gather_perm`)."""
    for k in range(perm.shape[0]):
        sk = src[k * m:(k + 1) * m]
        dk = dst[perm[k] * L:(perm[k] + 1) * L]
        for j in range(m):
            dk[lanes[j]] = sk[j]


@numba.njit(**_JIT)
def _sum_points(U, ptslot, perm, m, out):
    """out[p] (natural order) = Σ_{i at point p} U[i] (permuted), m lanes."""
    n = perm.shape[0]
    for p in range(out.shape[0]):
        o = out[p]
        for k in range(n * m):
            o[k] = 0.0
    for i in range(U.shape[0]):
        o = out[ptslot[i]]
        u = U[i]
        for k in range(n):
            uk = u[k * m:(k + 1) * m]
            ok = o[perm[k] * m:(perm[k] + 1) * m]
            for l in range(m):
                ok[l] += uk[l]


@numba.njit(**_JIT)
def _adjoint_stages(lamP, lamN, acc, U, UND, JP, WJ, ptslot, direct, A, C, mv, hs, sq, pr, pc, g, Wm, WA, nnz,
                    n, m, piv_slot, fwd_ptr, fwd_slot, fwd_col, bwd_ptr, bwd_slot, bwd_col):
    """One recorded step's stages in reverse (all permuted, m lanes):
    u_i = W⁻ᵀ(m_i λ + acc_i); λ⁻ += J(Y_i)ᵀ u_i; acc_j += a_ij J(Y_i)ᵀu_i + (c_ij/h) u_i.
    ``JP`` in the Jacobian's tiles of ``WJ`` lanes, ``Wm`` (factored) in the
    factorization's tiles of ``WA``, both in the LU's storage order
    (pattern entry ``q``, ``(pr_q, pc_q)``, in slot ``sq[q]``).

    A stage whose argument Y_i takes no a_ij K_j terms (rodas3's first two,
    both at y) needs J(Y_i)ᵀu_i only in the sum λ⁻: those u_i are summed per
    stage point (``UND``) and multiplied once. ``U[i]`` keeps every u_i for
    the second-order and parameter terms."""
    S = mv.shape[0]
    N = n * m
    ch = np.empty(m)
    for i in range(S):
        a = acc[i]
        for k in range(N):
            a[k] = 0.0
    for p in range(UND.shape[0]):
        a = UND[p]
        for k in range(N):
            a[k] = 0.0
    for k in range(N):
        lamN[k] = lamP[k]
    for i in range(S - 1, -1, -1):
        kap = U[i]
        ai = acc[i]
        mi = mv[i]
        for k in range(N):
            kap[k] = mi * lamP[k] + ai[k]
        solve_transpose_lanes(Wm, kap, nnz, m, WA, piv_slot, fwd_ptr, fwd_slot, fwd_col,
                              bwd_ptr, bwd_slot, bwd_col)
        ps = ptslot[i]
        if direct[i]:
            for k in range(N):
                g[k] = 0.0
            _slot_madd_tiled(JP[ps], m, WJ, nnz, sq, pr, pc, kap, g)
            for k in range(N):
                lamN[k] += g[k]
            for j in range(i):
                aij = A[i, j]
                if aij != 0.0:
                    aj = acc[j]
                    for k in range(N):
                        aj[k] += aij * g[k]
        else:
            und = UND[ps]
            for k in range(N):
                und[k] += kap[k]
        for j in range(i):
            cij = C[i, j]
            if cij != 0.0:
                aj = acc[j]
                for l in range(m):
                    ch[l] = cij / hs[l]
                for s in range(n):
                    ajs = aj[s * m:(s + 1) * m]
                    ks = kap[s * m:(s + 1) * m]
                    for l in range(m):
                        ajs[l] += ch[l] * ks[l]
    for p in range(UND.shape[0]):
        _slot_madd_tiled(JP[p], m, WJ, nnz, sq, pr, pc, UND[p], lamN)


@numba.njit(**_JIT)
def _pair_products(U, K, pa, pb, m, P):
    """P[e] = Σ_i U_i[pa_e]·K_i[pb_e] per lane: the stage sums the second-order
    terms need, once per (row, column) pair however many fields share it."""
    S = U.shape[0]
    for e in range(pa.shape[0]):
        p = P[e * m:(e + 1) * m]
        for l in range(m):
            p[l] = 0.0
        for i in range(S):
            u = U[i, pa[e] * m:(pa[e] + 1) * m]
            k = K[i, pb[e] * m:(pb[e] + 1) * m]
            for l in range(m):
                p[l] += u[l] * k[l]


@numba.njit(**_JIT)
def _slot_madd(D, m, pidx, tgt, P, out):
    """out[tgt_q] += P[pidx_q]·D_q per lane, q over D's slots (unit-stride
    views indexed from 0, so LLVM vectorises). Serves Jᵀu on the LU's slots
    (D = J, pidx = slot rows, tgt = slot columns; fill-in slots hold 0) and
    the contraction of second-order fields (P = the stage pair products;
    ``tgt`` = the site for ∇_y, the parameter's per-lane row for ∇_p)."""
    for q in range(pidx.shape[0]):
        d = D[q * m:(q + 1) * m]
        p = P[pidx[q] * m:(pidx[q] + 1) * m]
        o = out[tgt[q] * m:(tgt[q] + 1) * m]
        for l in range(m):
            o[l] += p[l] * d[l]


@numba.njit(**_JIT)
def _slot_madd_tiled(D, m, W, nnz, sq, pidx, tgt, P, out):
    """out[tgt_q] += P[pidx_q]·D[sq_q] per lane, q over the LU's pattern
    entries in order (``sq``: their storage slots), with ``D`` in lane
    tiles of ``W`` (slot s of lane l at ((l // W)·nnz + s)·W + l % W): Jᵀu
    on the Jacobian as the leaf stores it. Each lane adds the same terms in
    the same order as :func:`_slot_madd` (the same bits; ``W = m`` and
    ``sq = 0, 1, …`` is that layout), whatever the storage order."""
    for t0 in range(0, m, W):
        r = min(W, m - t0)
        base = (t0 // W) * nnz * W
        for q in range(pidx.shape[0]):
            d = D[base + sq[q] * W:base + sq[q] * W + r]
            po = pidx[q] * m + t0
            p = P[po:po + r]
            oo = tgt[q] * m + t0
            o = out[oo:oo + r]
            for l in range(r):
                o[l] += p[l] * d[l]


@numba.njit(**_JIT)
def _cols_apply_lanes(B, m, ptr, band, rl, tgt, nl, lam, gpl):
    """gpl[nl + tgt[c]] += Σ_j B[band_j]·lam[rl_j] per lane: columns of
    J_pᵀλ kept per lane, unit stride, serial (per-lane columns with
    ``nl = 0``; the scalar ones after them, summed over lanes once)."""
    for c in range(tgt.shape[0]):
        go = (nl + tgt[c]) * m
        gc = gpl[go:go + m]
        for j in range(ptr[c], ptr[c + 1]):
            bj = B[band[j] * m:(band[j] + 1) * m]
            lj = lam[rl[j] * m:(rl[j] + 1) * m]
            for l in range(m):
                gc[l] += bj[l] * lj[l]


@numba.njit(**_JIT)
def _add_lanes(src, rows, m, lanes, L, dst):
    """dst[r*L + lanes[j]] += src[r*m + j]."""
    for r in range(rows):
        sr = src[r * m:(r + 1) * m]
        dr = dst[r * L:(r + 1) * L]
        for j in range(m):
            dr[lanes[j]] += sr[j]


def _slab_eval(prog, plan, ws, y, p, fz, m, out):
    """Fill ``ws``'s band slab at ``y`` for ``apply``/``apply_transpose``
    (the products only read the slab: the plan's scatter into ``out`` and
    its checks are skipped)."""
    dt = np.dtype(np.float64)
    B = ws.slab(dt, prog.slab_size(m))
    prog.kernel.run(y, p, 0.0, fz, B, ws.h, ws.cix, m, one_thread())
    ws.last_dtype = dt
    ws.last_plan = plan.fingerprint


class _Second:
    """Second-order fields of one program evaluated at a point, as arrays."""

    def __init__(self, prog):
        s = second_order(prog)
        self.prog, self.s = prog, s
        m = s.meta
        self.row, self.site, self.pcol = (np.ascontiguousarray(m[k], np.int64) for k in ("row", "site", "pcol"))
        self.plane = np.ascontiguousarray(m.get("plane", np.ones(self.row.size, bool)))
        self.nf = len(s.doc.fields)
        self.h = np.zeros(max(s.kernel.n_hoist, 1))

    def eval(self, y, p, fz, cix, L, D):
        self.s.kernel.run(y, p, 0.0, fz, D, self.h, cix, L, one_thread())


class Sensitivities:
    """Tangent-linear and adjoint replays of a leaf's recorded steps."""

    def __init__(self, leaf, wrt_parameters: bool):
        self.leaf = leaf
        self.jac = leaf.jac_program
        # the replays store as the forward does: the leaf's tiled plan in its LU's slot order (J),
        # the LU's tiles (W)
        self.plan = leaf.matrix_plan
        self.tile = leaf.tile
        self.sec = _Second(self.jac)
        self.jp = None
        if wrt_parameters:
            self.jp = JacobianProgram.build(leaf.source, leaf.model, wrt="parameters", options=leaf.options)
            self.plan_p = self.jp.plan(LaneBlocks("natural", tile=None))
            self.sec_p = _Second(self.jp)
            self.nl = int(self.jp.meta["n_lane_cols"])
        self.bound = BoundPrograms(leaf, leaf.p, 0.0, 1, self.plan)
        self._ws: dict = {}
        tab = leaf.tableau
        pts, cur = [], 0
        for i in range(tab.stages):               # stage i's f argument: that of stage _point[i]
            if i == 0 or tab.newf[i]:
                cur = i
            pts.append(cur)
        self._point = tuple(pts)

    def _tiles(self, m: int) -> tuple:
        """(WJ, WA): the Jacobian's and the iteration matrix's lane tiles at
        ``m`` compact lanes, those of the forward step (lanestep)."""
        return (m if self.tile is None else int(self.tile)), LS.lu_tile(m)

    # -- per lane-count scratch ----------------------------------------------
    def _scratch(self, m: int):
        sc = self._ws.get(m)
        if sc is None:
            if len(self._ws) > 32:                 # lane counts vary call to call: keep a few
                self._ws.clear()
            n, S = self.leaf.n_species, self.leaf.tableau.stages
            sc = {"ws": self.jac.new_workspace(m), "Jp": np.zeros(self.plan.out_size(m)),
                  "K": np.zeros((S, n * m)), "Ys": np.zeros((S, n * m)), "F": np.zeros(n * m),
                  "Fs": np.zeros(n * m), "J": np.zeros(self.plan.out_size(m)),
                  "W": np.zeros(tiled_size(self.leaf.lu.nnz, m, LS.lu_tile(m))),
                  "D": np.zeros(max(self.sec.nf * m, 1)), "bad": np.zeros(m, np.int64),
                  "ch": np.zeros(S * m)}
            if self.jp is not None:
                sc["wsp"] = self.jp.new_workspace(m)
                sc["Pp"] = np.zeros(self.plan_p.out_size(m))
                sc["Dp"] = np.zeros(max(self.sec_p.nf * m, 1))
            self._ws[m] = sc
        return sc

    def _forward_stages(self, y, hs, fz, cix, m, sc, second: bool = True, yj=None):
        """Recompute one step's stages (exactly the forward's arithmetic);
        ``yj``: the states the lanes' Jacobians were evaluated at (None: ``y``)."""
        leaf, tab, lu = self.leaf, self.leaf.tableau, self.leaf.lu
        n = leaf.n_species
        b = self.bound
        K, Ys, F, Fs = sc["K"], sc["Ys"], sc["F"], sc["Fs"]
        yj = y if yj is None else yj
        WJ, WA = self._tiles(m)
        b.rhs(y, fz, cix, m, F)
        b.jac(yj, fz, cix, m, sc["J"])
        factor_shifted_lanes(sc["J"], WJ, sc["W"], WA, hs, tab.gamma, lu.nnz, m, CHUNK, *lu.factor_ops(),
                             sc["bad"])
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
                    ai, av = LS.nonzero_terms(tab.a[i])
                    LS.combine(y, K, ai, av, leaf.perm, m, Ys[i])
                    b.rhs(Ys[i], fz, cix, m, Fs)
                    Fi = Fs
                else:
                    Ys[i, :n * m] = Ys[i - 1, :n * m]
            ci, cv = LS.nonzero_terms(tab.c[i])
            LS.stage_rhs(Fi, K, i, ci, cv, hs, 0.0, sc["F"], leaf.perm, m, sc["ch"])
            solve_lanes(sc["W"], K[i], lu.nnz, m, WA, CHUNK, *lu.solve_ops())
        if not second:
            return
        self.sec.eval(yj, leaf.p, fz, cix, m, sc["D"])
        if self.jp is not None:
            self.sec_p.eval(yj, leaf.p, fz, cix, m, sc["Dp"])

    def _pad(self, lanes, ys, hs, fz_full, cix_full, L):
        """Compact copies of one record's lanes (y, h, forcing, cell indices)."""
        nf = len(self.leaf.forcing_names)
        k = m = lanes.size
        y = np.ascontiguousarray(ys.reshape(-1))
        h = np.ascontiguousarray(hs)
        fz = np.ascontiguousarray(fz_full.reshape(nf, L)[:, lanes].reshape(-1)) if nf else np.zeros(1)
        ncd = cix_full.size // L
        cix = np.ascontiguousarray(cix_full.reshape(ncd, L)[:, lanes].reshape(-1)) if ncd else np.zeros(1, np.int64)
        return m, k, y, h, fz, cix

    # -- adjoint ---------------------------------------------------------------
    def _adjoint_setup(self) -> dict:
        """Build-time index arrays of the fused adjoint (once per Sensitivities):
        the LU slots' permuted (row, col), the tableau as dense arrays, the
        distinct stage points, and the second-order fields in permuted order."""
        leaf, tab, lu = self.leaf, self.leaf.tableau, self.leaf.lu
        S = tab.stages
        iperm = leaf.iperm
        pts = sorted(set(self._point))
        A = np.zeros((S, S))
        C = np.zeros((S, S))
        for i in range(S):
            for j in range(i):
                A[i, j], C[i, j] = tab.a[i][j], tab.c[i][j]
        pat = np.asarray(lu.pattern, dtype=np.int64).reshape(-1, 2)
        sec = self.sec
        ad = {"pts": tuple(pts), "ptslot": np.array([pts.index(p) for p in self._point], np.int64),
              "direct": np.array([bool(np.any(A[i, :i] != 0.0)) for i in range(S)]),
              "A": A, "C": C, "mv": np.array(tab.m, dtype=np.float64),
              "pr": np.ascontiguousarray(pat[:, 0]), "pc": np.ascontiguousarray(pat[:, 1]), "sq": lu.position,
              "h_site": iperm[sec.site],
              "a_nz": tuple(LS.nonzero_terms(tab.a[i]) for i in range(S)),
              "c_nz": tuple(LS.nonzero_terms(tab.c[i]) for i in range(S))}
        # (u-row, k-column) pairs of the second-order terms, permuted; each field names its pair
        pairs = list(zip(iperm[sec.row].tolist(), iperm[sec.pcol].tolist()))
        if self.jp is not None:
            sp, m = self.sec_p, self.jp.meta
            pairs += list(zip(iperm[sp.row].tolist(), iperm[sp.site].tolist()))
            ad.update(hp_col=np.where(sp.plane, sp.pcol, self.nl + sp.pcol).astype(np.int64),
                      ncols=self.nl + int(m["n_glob_cols"]), nfp=int(self.jp.n_fields))
        uniq = sorted(set(pairs))
        at = {pq: e for e, pq in enumerate(uniq)}
        pid = np.array([at[pq] for pq in pairs], dtype=np.int64)
        ad["pa"] = np.array([pq[0] for pq in uniq], dtype=np.int64)
        ad["pb"] = np.array([pq[1] for pq in uniq], dtype=np.int64)
        ad["h_pid"] = pid[:sec.row.size]
        if self.jp is not None:
            ad["hp_pid"] = pid[sec.row.size:]
        for k, v in ad.items():
            if isinstance(v, np.ndarray):
                ad[k] = np.ascontiguousarray(v)
        ad["sec"] = bind_kernel(self.sec.s.kernel, leaf.p, 0.0)
        if self.jp is not None:
            ad["jp"] = bind_kernel(self.jp.kernel, leaf.p, 0.0)
            ad["sec_p"] = bind_kernel(self.sec_p.s.kernel, leaf.p, 0.0)
        return ad

    def _adj_scratch(self, C: int) -> dict:
        """Scratch for records of up to ``C`` lanes (prefixes of it serve any
        smaller record: nothing is allocated per record)."""
        sc = self._ws.get(("adj", C))
        if sc is not None:
            return sc
        self._ws = {k: v for k, v in self._ws.items() if not isinstance(k, tuple)}
        n, S, nnz = self.leaf.n_species, self.leaf.tableau.stages, self.leaf.lu.nnz
        npt = len(self._ad["pts"])
        sc = {"K": np.zeros((S, n * C)), "Ys": np.zeros((S, n * C)), "F": np.zeros(n * C),
              "Fs": np.zeros(n * C), "JP": np.zeros((npt, self.plan.out_size(C))),
              "W": np.zeros(tiled_size(nnz, C, LS.lu_tile(C))), "JW": np.zeros(self.plan.out_size(C)),
              "D": np.zeros(max(self.sec.nf * C, 1)), "bad": np.zeros(C, np.int64), "ch": np.zeros(S * C),
              "U": np.zeros((S, n * C)), "UND": np.zeros((npt, n * C)), "acc": np.zeros((S, n * C)),
              "g": np.zeros(n * C), "lamP": np.zeros(n * C), "lamN": np.zeros(n * C),
              "y": np.zeros(n * C), "h": np.zeros(C), "P": np.zeros(max(self._ad["pa"].size * C, 1))}
        if self.jp is not None:
            ad = self._ad
            sc.update(Bp=np.zeros(max(ad["nfp"] * C, 1)), Dp=np.zeros(max(self.sec_p.nf * C, 1)),
                      gpl=np.zeros(ad["ncols"] * C))
        self._ws[("adj", C)] = sc
        return sc

    def adjoint(self, records, lam, fz_full, cix_full, L, gp):
        """λ ← ∂φ/∂y(t0) in place (``lam[s*L + l]``); ``gp`` (the parameter
        program's column space at L lanes) accumulates ∂φ/∂p.

        Per record: the step is replayed (its stages, J(y), the LU of W), the
        Jacobian is evaluated at the other stage points into the LU's slots,
        and the reverse stage sweep, Jᵀu products and transposed solves run
        in one compiled call in the LU's permuted order; the second-order
        terms of all stages are contracted in one pass over the fields. The
        scalar parameters' gradients are kept per lane and summed over lanes
        once at the end (unit-stride loops instead of a reduction per call)."""
        if not records:
            return
        leaf, tab, lu = self.leaf, self.leaf.tableau, self.leaf.lu
        if getattr(self, "_ad", None) is None:
            self._ad = self._adjoint_setup()
        ad = self._ad
        n, S, nnz = leaf.n_species, tab.stages, lu.nnz
        perm = leaf.perm
        nfz = len(leaf.forcing_names)
        ncd = cix_full.size // L if L else 0
        C = max(r[0].size for r in records)
        sc = self._adj_scratch(C)
        # W-method reuse: each record's Jacobian states (None where all fresh) and
        # the per-lane sums of the stage pair products of steps sharing a Jacobian
        yjs: list[np.ndarray | None] = [None] * len(records)
        reused = any(not r[3].all() for r in records)
        if reused:
            YJ = np.empty((n, L))
            for q, (lanes, ys, _, fresh) in enumerate(records):
                YJ[:, lanes[fresh]] = ys[:, fresh]
                if not fresh.all():
                    yjs[q] = np.ascontiguousarray(YJ[:, lanes].reshape(-1))
        npair = ad["pa"].size
        Pacc = np.zeros((npair, L)) if reused else None
        K, Ys, F, Fs, JP, Wm = sc["K"], sc["Ys"], sc["F"], sc["Fs"], sc["JP"], sc["W"]
        b = self.bound
        jp = self.jp
        fops, sops = lu.factor_ops(), lu.solve_ops()
        fzb = np.zeros(max(nfz * C, 1))
        cxb = np.zeros(max(ncd * C, 1), np.int64)
        if jp is not None:
            ncols = ad["ncols"]
            GPL = np.zeros(ncols * L)
            jm = jp.meta
            lane_args_full = (jm["c_ptr"], jm["c_band"], jm["c_ca"], jm["c_cb"], jm["c_cs"], jm["c_tgt"])
            # entries reading λ[row*m + l] (offset 0, stride 1): the serial per-lane kernel serves them
            unit_lanes = bool(np.all(jm["c_cb"] == 0) and np.all(jm["c_cs"] == 1))
            lane_args = (jm["c_ptr"], jm["c_band"], jm["c_ca"], jm["c_tgt"])
            glob_args = (jm["g_ptr"], jm["g_band"], jm["g_rl"], jm["g_tgt"])
            Bp, Dp, gpl = sc["Bp"], sc["Dp"], sc["gpl"]
            jp_at, secp_at = ad["jp"], ad["sec_p"]
        for rec in range(len(records) - 1, -1, -1):
            lanes, ys, hs, fresh = records[rec]
            yj = yjs[rec]
            m = lanes.size
            N = n * m
            y = sc["y"][:N]
            y[:] = ys.reshape(-1)
            h = sc["h"][:m]
            h[:] = hs
            if nfz:
                LS.gather(fz_full, L, lanes, nfz, m, fzb)
            if ncd:
                LS.gather(cix_full, L, lanes, ncd, m, cxb)
            fz, cix = fzb, cxb
            # replay: exactly the forward's arithmetic (same kernels, same order, same tiles)
            WJ, WA = self._tiles(m)
            b.rhs(y, fz, cix, m, F)
            b.jac(y, fz, cix, m, JP[0])
            JW = JP[0]
            if yj is not None:                    # the W-method's kept Jacobian J(y_J)
                JW = sc["JW"]
                b.jac(yj, fz, cix, m, JW)
            factor_shifted_lanes(JW, WJ, Wm, WA, h, tab.gamma, nnz, m, CHUNK, *fops, sc["bad"])
            if np.any(sc["bad"][:m] >= 0):
                raise JacError("evaluation_error", "singular iteration matrix while replaying a recorded step")
            Ys[0, :N] = y
            Fi = F
            for i in range(S):
                if i > 0:
                    if tab.newf[i]:
                        LS.combine(y, K, *ad["a_nz"][i], perm, m, Ys[i])
                        b.rhs(Ys[i], fz, cix, m, Fs)
                        Fi = Fs
                    else:
                        Ys[i, :N] = Ys[i - 1, :N]
                LS.stage_rhs(Fi, K, i, *ad["c_nz"][i], h, 0.0, F, perm, m, sc["ch"])
                solve_lanes(Wm, K[i], nnz, m, WA, CHUNK, *sops)
            for k, pt in enumerate(ad["pts"][1:], 1):
                b.jac(Ys[pt], fz, cix, m, JP[k])
            ad["sec"](y, fz, cix, m, sc["D"])
            # the reverse sweep (permuted order)
            lamP, lamN = sc["lamP"], sc["lamN"]
            _gather_perm(lam, L, lanes, perm, m, lamP)
            _adjoint_stages(lamP, lamN, sc["acc"], sc["U"], sc["UND"], JP, WJ, ad["ptslot"], ad["direct"],
                            ad["A"], ad["C"], ad["mv"], h, ad["sq"], ad["pr"], ad["pc"], sc["g"], Wm, WA, nnz, n, m,
                            *sops)
            P = sc["P"]
            _pair_products(sc["U"], K, ad["pa"], ad["pb"], m, P)
            if Pacc is not None and npair:
                # a step on an older Jacobian adds its pair products to the lane's
                # sum; the step that evaluated it contracts the sum at its state
                Pm = P[:npair * m].reshape(npair, m)
                old = ~fresh
                if old.any():
                    Pacc[:, lanes[old]] += Pm[:, old]
                    Pm[:, old] = 0.0
                if fresh.any():
                    lf_ = lanes[fresh]
                    Pm[:, fresh] += Pacc[:, lf_]
                    Pacc[:, lf_] = 0.0
            _slot_madd(sc["D"], m, ad["h_pid"], ad["h_site"], P, lamN)
            _scatter_perm(lamN, L, lanes, perm, m, lam)
            if jp is None:
                continue
            # parameters: J_p(Y_i)ᵀ u_i, summed per stage point, and the mixed second order
            gpl[:ncols * m] = 0.0
            Upt = sc["UND"]                       # reused: Σ u_i per stage point (natural order)
            _sum_points(sc["U"], ad["ptslot"], perm, m, Upt)
            for k, pt in enumerate(ad["pts"]):
                jp_at(Ys[pt], fz, cix, m, Bp)
                if unit_lanes:
                    _cols_apply_lanes(Bp, m, *lane_args, 0, Upt[k], gpl)
                else:
                    lane_apply(Bp, m, *lane_args_full, Upt[k], gpl)
                _cols_apply_lanes(Bp, m, *glob_args, self.nl, Upt[k], gpl)
            secp_at(y, fz, cix, m, Dp)
            _slot_madd(Dp, m, ad["hp_pid"], ad["hp_col"], P, gpl)
            _add_lanes(gpl, ncols, m, lanes, L, GPL)
        if jp is not None:
            nl = self.nl
            G = GPL.reshape(ncols, L)
            gp[:nl * L] += G[:nl].reshape(-1)
            gp[nl * L:] += G[nl:].sum(axis=1)

    # -- frozen-step forward ----------------------------------------------------
    def replay(self, records, y, fz_full, cix_full, L, p=None):
        """Re-run the recorded steps (same lanes, same step sizes) from ``y``
        in place, optionally with other parameters: the map the tangent and
        adjoint differentiate (finite differences of it are their oracle)."""
        leaf = self.leaf
        n = leaf.n_species
        saved = self.bound
        if p is not None:
            self.bound = BoundPrograms(leaf, np.ascontiguousarray(p, dtype=np.float64), 0.0, 1, self.plan)
        try:
            tab = leaf.tableau
            YJ = np.empty((n, L))                  # the replayed state each lane's Jacobian is at
            for lanes, _, hs, fresh in records:
                k = lanes.size
                ys = y.reshape(n, L)[:, lanes]
                YJ[:, lanes[fresh]] = ys[:, fresh]
                m, k, yc, h, fz, cix = self._pad(lanes, ys, hs, fz_full, cix_full, L)
                sc = self._scratch(m)
                yj = None if fresh.all() else np.ascontiguousarray(YJ[:, lanes].reshape(-1))
                self._forward_stages(yc, h, fz, cix, m, sc, second=False, yj=yj)
                mi, mv = LS.nonzero_terms(tab.m)
                out = np.empty(n * m)
                LS.combine(yc, sc["K"], mi, mv, leaf.perm, m, out)
                y.reshape(n, L)[:, lanes] = out.reshape(n, m)[:, :k]
        finally:
            self.bound = saved

    # -- tangent linear --------------------------------------------------------
    def tangent(self, records, dy, dp, fz_full, cix_full, L):
        """dy ← δy(t0 + dt) in place given δy(t0) = dy and the parameter
        direction ``dp`` (parameter column space at L lanes, or None)."""
        leaf, tab = self.leaf, self.leaf.tableau
        n = leaf.n_species
        perm = leaf.perm
        S = tab.stages
        lu = leaf.lu
        YJ, DYJ = np.empty((n, L)), np.empty((n, L))   # each lane's Jacobian state and its tangent
        for lanes, ys, hs, fresh in records:
            m, k, y, h, fz, cix = self._pad(lanes, ys, hs, fz_full, cix_full, L)
            sc = self._scratch(m)
            YJ[:, lanes[fresh]] = ys[:, fresh]
            DYJ[:, lanes[fresh]] = dy.reshape(n, L)[:, lanes[fresh]]
            allf = bool(fresh.all())
            yj = None if allf else np.ascontiguousarray(YJ[:, lanes].reshape(-1))
            self._forward_stages(y, h, fz, cix, m, sc, yj=yj)
            d = np.zeros(n * m)
            d.reshape(n, m)[:, :k] = dy.reshape(n, L)[:, lanes]
            dj = d if allf else np.ascontiguousarray(DYJ[:, lanes].reshape(-1))
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
                _hess_tlm(sc["D"], m, sec.row, sec.site, sec.pcol, k_nat, dj, r)
                if dpm is not None and self.jp is not None:     # (dpm is set only with jp)
                    self.jp.apply(self.plan_p, sc["wsp"], dpm, r)
                    sp = self.sec_p
                    _hessp_tlm(sc["Dp"], m, sp.row, sp.site, sp.pcol, sp.plane, self.nl, k_nat, dpm, r)
                rp = r.reshape(n, m)[perm].reshape(-1)
                for j in range(i):
                    c = tab.c[i][j]
                    if c != 0.0:
                        rp += (c / hh) * dk[j]
                solve_lanes(sc["W"], rp, lu.nnz, m, self._tiles(m)[1], CHUNK, *lu.solve_ops())
                dk[i] = rp
                if tab.m[i] != 0.0:
                    dkn = np.empty(n * m)
                    dkn.reshape(n, m)[perm] = rp.reshape(n, m)
                    d_new += tab.m[i] * dkn
            dy.reshape(n, L)[:, lanes] = d_new.reshape(n, m)[:, :k]


# Numba keys a cached function by its own file: key these by what they link in from other
# modules too (compile/jitkeys.py), so an edit there is not served stale from a warm cache.
key_by_callees(globals())
