"""Per-lane Rosenbrock stepping: every lane its own step size, time and fate.

A shared-step driver advances all lanes with one ``h``: the stiffest cell
sets the pace of the whole grid (NCAR MICM's known weakness). Here each lane (grid cell) carries
its own ``t``, ``h``, error norm, accept/reject history and status, exactly
as if it were integrated alone (KPP's way), while the arithmetic still runs
as unit-stride loops over many lanes at once.

How lanes come and go. The working arrays hold only the *active* lanes,
compacted (species-major, stride = active count ``m``): after each step
attempt, lanes that reached the end of the interval or failed are written
back to the caller's array and squeezed out, so finished lanes cost nothing
(the alternative, masking them inside their tile, is ``compact=False``;
``benchmarks`` measures both). Lane independence is exact: no kernel mixes
lanes, fastmath is off (no FMA contraction), so a lane's floating-point
operations — and its bits — do not depend on where it sits, on which lanes
share its block, on the thread count or on the chunking.

Failures are per lane (status codes :data:`STATUS`): a lane whose step size
underflows, that exceeds ``max_steps`` attempts or ``max_rejects``
consecutive rejections, whose iteration matrix stays singular or whose
values turn non-finite stops at its last accepted state with its status
set; every other lane carries on untouched.

A singularity is never crossed silently (:func:`_err_guard`, before a step is
accepted): a linearly implicit step stays finite across a pole, so ``u' =
u²`` from ``u = 1`` would step over ``t = 1`` onto the negative branch with
a small error estimate. A step that passes the error test is refused, and
its lane failed at its last accepted state, when a species changes sign
although its derivative at the step's start pointed away from zero (it
went through infinity: status 6), grows past ``max_abs`` (status 7), or —
with ``nonnegative`` and without ``clip_negative`` — turns negative
(status 8). (CVODE on the same problem shrinks its step towards the pole
until its error test fails repeatedly: a failure, not a wrong branch.)
Only a step on a Jacobian evaluated at its own starting state fails the
lane: a W-method step on a *kept* Jacobian (evaluated at an earlier
accepted state) that trips a guard may be the stale matrix's overshoot, not
a pole, so it is rejected instead — its step shrunk by ``_FAC_MIN``, as for
an error far above tolerance, and the next attempt evaluated on a fresh
Jacobian and factorisation (:func:`_reuse_plan` after a rejection); a hit
on that one fails the lane as above. (Rodas3 never keeps a Jacobian: its
guards are unchanged.)

``step="shared"`` runs the same engine with the error norm maximised over
the active lanes, which keeps all lanes in lock-step (for comparison).

The engine is model-agnostic: it calls ``rhs(u, forcing, cix, m, out)`` and
``jac(u, forcing, cix, m, out)`` on the first ``m`` compact lanes (the
native adapter binds the compiled programs to these), with ``jac`` writing
the factorization's LaneSparseBlocks slots in lane tiles of ``tile`` (None:
one tile of ``m`` lanes). Nothing converts that storage on the step path:
the one pass a Rosenbrock step makes over ``J`` anyway, ``I/(h_l γ) − J``,
is fused into the factorization, row by row (:func:`~esmjac.linalg.sparse_lu.factor_shifted_rows`)
and writes the iteration matrix in the factorization's own lane tiles
(:func:`lu_tile`: :data:`~esmjac.linalg.sparse_lu.VEC` lanes, so each
elimination and solve op of a whole tile is one vector op, the same tile as
the Jacobian's default, whose rows are then copied as contiguous runs).
With that default tile and float64 factors (``LaneStepper.inplace``) there
is no copy: ``jac`` writes straight into the iteration matrix's buffer,
and each row is negated, shifted and eliminated where it lies. ``jac``
therefore writes every slot of its lanes' tiles on every call (the
fill-in slots zero), as the bound programs do.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from ..compile.jitkeys import key_by_callees
from ..errors import JacError
from ..linalg.sparse_lu import (CHUNK, VEC, SparseLaneLU, factor_shifted_rows, rowdot, rowdot2, tiled_size,
                                vec_lanes, vlin)

__all__ = ["STATUS", "LaneStepper", "RUNNING", "lu_tile", "gather", "assemble_w", "combine",
           "stage_rhs", "nonzero_terms"]

#: Per-lane status codes (``stats.status``) and their meaning.
STATUS = {
    0: "ok",
    1: "step size underflow",
    2: "too many step attempts (max_steps)",
    3: "too many consecutive rejections (max_rejects)",
    4: "non-finite values (NaN/inf in f, J or the stages)",
    5: "iteration matrix I/(hγ) − J singular",
    6: "crossed a pole: a species changed sign while its derivative drove it away from zero "
       "(1/u changed sign through infinity; the solution blows up in this step)",
    7: "a species grew past max_abs",
    8: "a species turned negative (negative='fail')",
}
RUNNING = -1

# Step-size control (the KPP defaults): new h = h·clip(SAFE·err^(−1/elo),
# FAC_MIN, FAC_MAX); after two rejections in a row h shrinks by FAC_REJ; a
# singular iteration matrix halves h.
_FAC_SAFE, _FAC_MIN, _FAC_MAX, _FAC_REJ = 0.9, 0.2, 6.0, 0.1
_EPS = float(np.finfo(np.float64).eps)
# The error norm a guard hit on a kept (W-method) Jacobian is given: finite
# (not status 4's inf) and far above 1, so _control rejects the step with
# the largest shrink of its rule (_FAC_MIN; _FAC_REJ after two in a row).
_GUARD_REJECT_ERR = 1e300

_JIT = dict(cache=True, nogil=True, error_model="numpy")


# --------------------------------------------------------------------------
# Kernels over the first m compact lanes (vectors: v[s*m + l]). Stage vectors
# K live in the LU's permuted order, states and f values in natural order.
# --------------------------------------------------------------------------

@numba.njit(**_JIT)
def _gather(src, L, idx, rows, m, dst):
    """dst[r*m + j] = src[r*L + idx[j]] for r < rows."""
    for r in range(rows):
        s = src[r * L:(r + 1) * L]
        d = dst[r * m:(r + 1) * m]
        for j in range(m):
            d[j] = s[idx[j]]


@numba.njit(**_JIT)
def _prep_h(t, h, tend, done, m, hs, last):
    """The step to attempt: h, cut to land exactly on tend."""
    for l in range(m):
        hl = h[l]
        if done[l] == 0 and hl >= tend - t[l]:
            hl = tend - t[l]
            last[l] = 1
        else:
            last[l] = 0
        hs[l] = hl


@numba.njit(**_JIT)
def _shared_min(x, m):
    v = x[0]
    for l in range(1, m):
        if x[l] < v:
            v = x[l]
    for l in range(m):
        x[l] = v


def lu_tile(m: int, dtype=np.float64) -> int:
    """Lane tile of the iteration matrix's storage at ``m`` active lanes for
    factors of ``dtype``: :func:`~esmjac.linalg.sparse_lu.vec_lanes` lanes
    (16 in float64, 32 in float32: each elimination and solve op of a whole
    tile one vector op of the tile's lanes, the row held in registers; a
    partial last tile runs the general loops), or one tile of ``m`` lanes
    when fewer."""
    v = vec_lanes(dtype)
    return v if m >= v else max(int(m), 1)


@numba.njit(**_JIT)
def _assemble_w(J, Wm, diag_slots, hs, gamma, m, W, nnz):
    """Wm = I/(h_l γ) − J in (tiled) slot storage, per lane h_l."""
    N = ((m + W - 1) // W) * W * nnz
    for i in range(N):
        Wm[i] = -J[i]
    for l in range(m):
        shift = 1.0 / (hs[l] * gamma)
        base = (l // W) * nnz * W + l % W
        for k in range(diag_slots.shape[0]):
            Wm[base + diag_slots[k] * W] += shift


@numba.njit(**_JIT)
def _stage_rhs(F, K, i, cidx, cval, hs, gdt, dfdt, perm, m, ch):
    """K[i] (permuted) = F + Σ_p (cval_p/h_l) K[cidx_p] + gdt·h_l·dfdt, left to right.

    ``ch`` is scratch (at least ``len(cidx) × m``): the factors ``cval_p/h_l``
    are computed once per lane here, not once per species (the same
    division, so the same bits)."""
    n = perm.shape[0]
    P = cidx.shape[0]
    for p in range(P):
        c = ch[p * m:(p + 1) * m]
        cv = cval[p]
        for l in range(m):
            c[l] = cv / hs[l]
    for k in range(n):
        ki = K[i, k * m:(k + 1) * m]
        so = perm[k] * m
        fs = F[so:so + m]
        for l in range(m):
            ki[l] = fs[l]
        for p in range(P):
            kj = K[cidx[p], k * m:(k + 1) * m]
            c = ch[p * m:(p + 1) * m]
            for l in range(m):
                ki[l] += c[l] * kj[l]
        if gdt != 0.0:
            ds = dfdt[so:so + m]
            for l in range(m):
                ki[l] += (gdt * hs[l]) * ds[l]


@numba.njit(**_JIT)
def _combine(Y, K, idx, val, perm, m, out):
    """out (natural) = Y + Σ_p val_p K[idx_p] (permuted), left to right."""
    n = perm.shape[0]
    for k in range(n):
        so = perm[k] * m
        o = out[so:so + m]
        y = Y[so:so + m]
        for l in range(m):
            o[l] = y[l]
        for p in range(idx.shape[0]):
            kj = K[idx[p], k * m:(k + 1) * m]
            v = val[p]
            for l in range(m):
                o[l] += v * kj[l]


@numba.njit(**_JIT)
def _shared_max(err, m):
    v = 0.0
    for l in range(m):
        if not (err[l] <= v):
            v = err[l]
    for l in range(m):
        err[l] = v


@numba.njit(**_JIT)
def _shared_bad(bad, m):
    k = -1
    for l in range(m):
        if bad[l] >= 0:
            k = bad[l]
    if k >= 0:
        for l in range(m):
            bad[l] = k


@numba.njit(**_JIT)
def _h_start(Y, F, atol, rtol, span, m, n, h):
    """Hairer–Wanner's first guess 0.01·‖y‖/‖f‖ per lane (weighted RMS), 1e-6
    when either is tiny, within [1e-12·span, span]."""
    for l in range(m):
        d0 = 0.0
        d1 = 0.0
        for s in range(n):
            sc = atol[s] + rtol * abs(Y[s * m + l])
            d0 += (Y[s * m + l] / sc) ** 2
            d1 += (F[s * m + l] / sc) ** 2
        d0 = math.sqrt(d0 / n)
        d1 = math.sqrt(d1 / n)
        if d0 < 1e-5 or d1 < 1e-5 or not (d1 < np.inf):
            hl = 1e-6
        else:
            hl = 0.01 * d0 / d1
        h[l] = min(max(hl, 1e-12 * span), span)


@numba.njit(**_JIT)
def _fd_time(F1, F0, t, m, n, out):
    """out = (F1 − F0)/δ_l: KPP's forward difference ∂f/∂t, δ = √eps·max(1e-5, |t|)."""
    for s in range(n):
        for l in range(m):
            d = math.sqrt(2.220446049250313e-16) * max(1e-5, abs(t[l]))
            out[s * m + l] = (F1[s * m + l] - F0[s * m + l]) / d


@numba.njit(**_JIT)
def _times(t, hs, alpha, m, out):
    for l in range(m):
        out[l] = t[l] + alpha * hs[l]


@numba.njit(**_JIT)
def _fd_times(t, m, out):
    for l in range(m):
        out[l] = t[l] + math.sqrt(2.220446049250313e-16) * max(1e-5, abs(t[l]))


@numba.njit(**_JIT)
def _control(Y, Ynew, n, m, err, bad, J, nnz, W, hs, last, t, h, tend, span, rl, rm, crej, nonfin,
             done, idx, elo, max_steps, max_rejects, clip, nfev_step, newj, newlu,
             st_status, st_steps, st_acc, st_rej, st_nfev, st_njev, st_ndec, st_h, st_t, acc):
    """Per-lane accept/reject after one attempt; returns how many lanes finished.

    Accepted lanes take Ynew (optionally clipped at 0) and advance; rejected
    lanes shrink h. A lane is *done* when it reaches tend (status 0) or fails
    (status > 0, state left at its last accepted point). ``acc`` (scratch,
    ``m`` flags) marks the accepted lanes; their states are copied after the
    per-lane decisions, species by species over lanes (unit stride).
    ``newj``/``newlu`` flag the lanes whose Jacobian / factorisation this
    attempt computed (all of them, unless a W-method reuses them)."""
    ndone = 0
    for l in range(m):
        acc[l] = 0
        if done[l] != 0:
            continue
        g = idx[l]
        st_nfev[g] += nfev_step
        st_njev[g] += newj[l]
        st_ndec[g] += newlu[l]
        st_steps[g] += 1
        hl = hs[l]
        e = err[l]
        sing = bad[l] >= 0
        if sing:
            hnew = 0.5 * hl
            # a NaN/inf Jacobian entry makes a NaN pivot: report it as non-finite
            base = (l // W) * nnz * W + l % W
            fin = True
            for q in range(nnz):
                v = J[base + q * W]
                if not (abs(v) < np.inf):
                    fin = False
        elif e < np.inf:
            fac = _FAC_SAFE / e ** (1.0 / elo)
            hnew = hl * min(_FAC_MAX, max(_FAC_MIN, fac))
            fin = True
        else:
            hnew = hl * _FAC_REJ
            fin = False
        if not sing and e <= 1.0:
            st_acc[g] += 1
            acc[l] = 1
            t[l] = tend if last[l] != 0 else t[l] + hl
            hnew = min(hnew, span)
            if rl[l] != 0:
                hnew = min(hnew, hl)
            rl[l] = 0
            rm[l] = 0
            crej[l] = 0
            nonfin[l] = 0
            h[l] = hnew
        else:
            st_rej[g] += 1
            crej[l] += 1
            if rm[l] != 0:
                hnew = hl * _FAC_REJ
            rm[l] = rl[l]
            rl[l] = 1
            h[l] = hnew
            nonfin[l] = 4 if not fin else (5 if sing else 0)
        code = RUNNING
        if t[l] >= tend:
            code = 0
        elif st_steps[g] >= max_steps:
            code = 2
        elif crej[l] >= max_rejects:
            code = 3
        elif h[l] < 10.0 * _EPS * max(abs(t[l]), span * _EPS):
            code = nonfin[l] if nonfin[l] != 0 else 1
        st_h[g] = h[l]
        st_t[g] = t[l]
        if code != RUNNING:
            st_status[g] = code
            done[l] = 1
            ndone += 1
    for s in range(n):
        y = Y[s * m:(s + 1) * m]
        yn = Ynew[s * m:(s + 1) * m]
        for l in range(m):
            if acc[l] != 0:
                v = yn[l]
                if clip and v < 0.0:
                    v = 0.0
                y[l] = v
    return ndone


@numba.njit(**_JIT)
def _err_guard(Y, Ynew, F0, K, idx, val, atol, rtol, iperm, n, m, err, eb, code, max_abs, nonneg):
    """Every lane's error norm and singularity-guard code in one pass over
    the species (species outer, lanes inner: unit stride).

    ``err[l] = RMS_s(e_s / (atol_s + rtol·max(|y_s|, |ynew_s|)))``, ``e = Σ
    val K[idx]``, species summed in natural order, non-finite → inf (each
    lane's operations and their order are those of the scalar formula; ``eb``
    is scratch for one species' ``e``).

    ``code[l]`` is 0, or 6/7/8 for the first species (in natural order) that
    crosses a pole, grows past ``max_abs`` or (``nonneg``) turns negative —
    the first hit of the per-lane scan this replaces, so the same lanes fail
    with the same codes. A sign change counts as a pole crossing only when
    the new value is above the species' ``atol`` (a round-off overshoot to a
    tiny negative concentration is not one)."""
    e = eb[:m]
    for l in range(m):
        err[l] = 0.0
        code[l] = 0
    for s in range(n):
        ko = iperm[s] * m
        y = Y[s * m:(s + 1) * m]
        yn = Ynew[s * m:(s + 1) * m]
        f0 = F0[s * m:(s + 1) * m]
        a = atol[s]
        for l in range(m):
            e[l] = 0.0
        for p in range(idx.shape[0]):
            kp = K[idx[p], ko:ko + m]
            v = val[p]
            for l in range(m):
                e[l] += v * kp[l]
        for l in range(m):
            # branch-free (selects), so the lane loop vectorises
            yl, ynl, fl = y[l], yn[l], f0[l]
            r = e[l] / (a + rtol * max(abs(yl), abs(ynl)))
            err[l] += r * r
            pole = (((yl > 0.0) & (ynl < 0.0) & (fl > 0.0)) | ((yl < 0.0) & (ynl > 0.0) & (fl < 0.0))) \
                & (abs(ynl) > a)
            hit = 6 if pole else (7 if abs(ynl) > max_abs else (8 if nonneg & (ynl < 0.0) else 0))
            c = code[l]
            code[l] = c if c != 0 else hit
    for l in range(m):
        v = math.sqrt(err[l] / n)
        err[l] = v if v == v and v < np.inf else np.inf


@numba.njit(**_JIT)
def _apply_guard(code, m, err, bad, done, idx, st_status, st_h, st_t, t, hs, newj, jage):
    """Fail (status ``code[l]``, see the module docstring) every lane whose step
    would be accepted (``err <= 1``, factorization regular) but crosses a
    singularity; returns how many. The lane keeps its last accepted state.

    A lane whose step ran on a kept Jacobian (``newj`` 0 and ``jage`` > 0:
    evaluated at an earlier accepted state; only a W-method's reuse) is not
    failed: its ``err`` is set to ``_GUARD_REJECT_ERR``, so the step is
    rejected and the lane's next attempt evaluates a fresh Jacobian."""
    nfail = 0
    for l in range(m):
        if done[l] != 0 or bad[l] >= 0 or not err[l] <= 1.0 or code[l] == 0:
            continue
        if newj[l] == 0 and jage[l] > 0:
            err[l] = _GUARD_REJECT_ERR
            continue
        g = idx[l]
        st_status[g] = code[l]
        st_h[g] = hs[l]
        st_t[g] = t[l]
        done[l] = 1
        nfail += 1
    return nfail


@numba.njit(**_JIT)
def _check_step(Y, Ynew, F0, K, eidx, eval_, atol, rtol, iperm, n, m, err, eb, code, max_abs, nonneg,
                shared, bad, done, idx, st_status, st_h, st_t, t, hs, newj, jage):
    """The attempt's error norms (maximised over lanes for a shared step) and
    its singularity guards (:func:`_err_guard`, :func:`_apply_guard`);
    returns how many lanes the guards failed. A shared step is maximised
    again after the guards: a lane's guard rejection rejects all (lock-step)."""
    _err_guard(Y, Ynew, F0, K, eidx, eval_, atol, rtol, iperm, n, m, err, eb, code, max_abs, nonneg)
    if shared:
        _shared_max(err, m)
    nfail = _apply_guard(code, m, err, bad, done, idx, st_status, st_h, st_t, t, hs, newj, jage)
    if shared:
        _shared_max(err, m)
    return nfail


@numba.njit(**_JIT)
def _finish(Y, Ynew, F0, K, eidx, eval_, atol, rtol, iperm, n, m, err, eb, code, max_abs, nonneg,
            shared, bad, done, idx, t, hs, J, nnz, W, last, h, tend, span, rl, rm, crej, nonfin,
            elo, max_steps, max_rejects, clip, nfev_step, newj, newlu, jage,
            st_status, st_steps, st_acc, st_rej, st_nfev, st_njev, st_ndec, st_h, st_t, acc):
    """The end of an attempt in one compiled call: :func:`_check_step`, then
    :func:`_control`; returns how many lanes finished (guards included)."""
    nguard = _check_step(Y, Ynew, F0, K, eidx, eval_, atol, rtol, iperm, n, m, err, eb, code, max_abs,
                         nonneg, shared, bad, done, idx, st_status, st_h, st_t, t, hs, newj, jage)
    return nguard + _control(Y, Ynew, n, m, err, bad, J, nnz, W, hs, last, t, h, tend, span, rl, rm, crej,
                             nonfin, done, idx, elo, max_steps, max_rejects, clip, nfev_step, newj, newlu,
                             st_status, st_steps, st_acc, st_rej, st_nfev, st_njev, st_ndec, st_h, st_t, acc)


@numba.njit(**_JIT)
def _retire(Y, n, m, done, idx, out, L):
    """Write the done lanes' states to ``out[s*L + lane]``; compact the rest of
    Y (stride m → m_new, stable order). Returns m_new."""
    mn = 0
    for l in range(m):
        if done[l] != 0:
            g = idx[l]
            for s in range(n):
                out[s * L + g] = Y[s * m + l]
        else:
            mn += 1
    if mn == m:
        return mn
    for s in range(n):
        j = 0
        for l in range(m):
            if done[l] == 0:
                Y[s * mn + j] = Y[s * m + l]
                j += 1
    return mn


@numba.njit(**_JIT)
def _squeeze_rows(A, rows, m, mn, done):
    """Compact a rows-major lane array (stride m → mn) dropping done lanes."""
    for r in range(rows):
        j = 0
        for l in range(m):
            if done[l] == 0:
                A[r * mn + j] = A[r * m + l]
                j += 1


@numba.njit(**_JIT)
def _squeeze_lane(a, m, done):
    j = 0
    for l in range(m):
        if done[l] == 0:
            a[j] = a[l]
            j += 1


@numba.njit(**_JIT)
def _scatter_all(Y, n, m, idx, out, L):
    for s in range(n):
        for l in range(m):
            out[s * L + idx[l]] = Y[s * m + l]


# --------------------------------------------------------------------------
# Jacobian and factorisation reuse (W-methods), per lane. A lane keeps its
# Jacobian (``jage`` ≥ 0: accepted steps since it was evaluated; −1: none)
# and the factorisation of its iteration matrix at the step ``hlu`` (0: none)
# across steps; each attempt decides, from the lane's own history only:
#
# * a new Jacobian when it has none, when it has served ``max_age`` accepted
#   steps, or after a rejection if it is not already at the current state
#   (a rejection with a fresh Jacobian keeps it: re-evaluating at the same
#   state would give the same matrix);
# * the old factorisation when the controller's proposal lies within
#   [lo, hi]·hlu: the lane then *holds* its step at hlu (a W-method's order
#   holds for any matrix, but reusing the LU needs the same h·γ), unless the
#   step must be cut to land on the end of the interval;
# * otherwise a new factorisation (of the kept or the new Jacobian).
#
# Lanes that need a new Jacobian or LU are gathered into a compact sub-batch
# (their arithmetic is that of any other lane position, so the bits do not
# depend on which neighbours also needed one), evaluated/factored there and
# scattered back into their tile slots.
# --------------------------------------------------------------------------

@numba.njit(**_JIT)
def _reuse_plan(t, h, tend, done, m, hs, last, jage, hlu, rl, max_age, lo, hi, newj, newlu, selj, sellu):
    """The step each lane attempts and whether it needs a new Jacobian /
    factorisation; ``selj``/``sellu`` list those lanes. Returns their counts."""
    kj = 0
    k = 0
    for l in range(m):
        if done[l] != 0:
            hs[l] = h[l]
            last[l] = 0
            newj[l] = 0
            newlu[l] = 0
            continue
        ja = jage[l]
        nj = ja < 0 or ja >= max_age or (rl[l] != 0 and ja > 0)
        hl = h[l]
        hold = hlu[l]
        if not nj and rl[l] == 0 and hold > 0.0 and hl >= lo * hold and hl <= hi * hold:
            hl = hold
        if hl >= tend - t[l]:
            hl = tend - t[l]
            last[l] = 1
        else:
            last[l] = 0
        hs[l] = hl
        nl = nj or hl != hold
        newj[l] = 1 if nj else 0
        newlu[l] = 1 if nl else 0
        if nj:
            selj[kj] = l
            kj += 1
        if nl:
            sellu[k] = l
            k += 1
    return kj, k


@numba.njit(**_JIT)
def _tiled_copy(src, nnz, Ws, sidx, dst, Wd, didx, k):
    """dst slots of lane didx[j] (tiles of Wd) = src slots of lane sidx[j]
    (tiles of Ws), j < k (a gather passes didx = 0, 1, …; a scatter sidx)."""
    for j in range(k):
        a = sidx[j]
        b = didx[j]
        so = (a // Ws) * nnz * Ws + a % Ws
        do = (b // Wd) * nnz * Wd + b % Wd
        for q in range(nnz):
            dst[do + q * Wd] = src[so + q * Ws]


@numba.njit(**_JIT)
def _sub_factor(J, WJ, Wm, WA, hs, gamma, nnz, m, sel, k, ar, Jk, Wk, Wmk, WAk, hk, badk, chunk,
                piv, mul_ptr, mul_slot, upd_ptr, upd_tgt, upd_src, bad, hlu, row_ptr, mrow_ptr):
    """LU(I/(h_l γ) − J) of the ``k`` lanes ``sel`` only: their Jacobian
    slots gathered into a compact sub-batch ``Jk`` (tiles of ``Wk``),
    factored into ``Wmk`` (tiles of ``WAk``), scattered back into ``Wm``;
    ``bad`` set for every lane (−1 for those that kept their LU); ``hlu`` =
    the new factorisations' steps (0 when singular). ``ar`` = 0, 1, 2, …"""
    for l in range(m):
        bad[l] = -1
    if k == 0:
        return
    if k == m:
        factor_shifted_rows(J, WJ, Wm, WA, hs, gamma, nnz, m, chunk, piv, mul_ptr, mul_slot,
                            upd_ptr, upd_tgt, upd_src, bad, row_ptr, mrow_ptr)
    else:
        _tiled_copy(J, nnz, WJ, sel, Jk, Wk, ar, k)
        for j in range(k):
            hk[j] = hs[sel[j]]
        factor_shifted_rows(Jk, Wk, Wmk, WAk, hk, gamma, nnz, k, chunk, piv, mul_ptr, mul_slot,
                            upd_ptr, upd_tgt, upd_src, badk, row_ptr, mrow_ptr)
        _tiled_copy(Wmk, nnz, WAk, ar, Wm, WA, sel, k)
        for j in range(k):
            bad[sel[j]] = badk[j]
    for j in range(k):
        l = sel[j]
        hlu[l] = hs[l] if bad[l] < 0 else 0.0


@numba.njit(**_JIT)
def _aged(acc, newj, m, jage):
    """After an attempt: a new Jacobian is 0 steps old; an accepted step
    ages the lane's Jacobian by one."""
    for l in range(m):
        if newj[l] != 0:
            jage[l] = 0
        if acc[l] != 0 and jage[l] >= 0:
            jage[l] += 1


@numba.njit(**_JIT)
def _squeeze_tiled(A, nnz, m, W, mn, Wn, done, tmp):
    """Compact tiled slot storage (tiles of W, m lanes → tiles of Wn, mn
    lanes) dropping done lanes, through ``tmp``."""
    j = 0
    for l in range(m):
        if done[l] == 0:
            so = (l // W) * nnz * W + l % W
            do = (j // Wn) * nnz * Wn + j % Wn
            for q in range(nnz):
                tmp[do + q * Wn] = A[so + q * W]
            j += 1
    N = ((mn + Wn - 1) // Wn) * Wn * nnz
    for i in range(N):
        A[i] = tmp[i]


# Fused sequences of the step (one call from Python each, not three or four:
# a Numba dispatch with a dozen array arguments costs microseconds, which at
# a few hundred lanes per block is a visible share of a step). Each runs the
# kernels above in the same order, so the bits are theirs.

@numba.njit(**_JIT)
def _prep_and_factor(t, h, tend, done, m, hs, last, J, WJ, Wm, WA, gamma, nnz, chunk,
                     piv, mul_piv, mul_slot, upd_ptr, upd_tgt, upd_src, bad, row_ptr, mrow_ptr):
    """The step sizes to attempt (:func:`_prep_h`), then ``Wm = LU(I/(h_l γ) − J)``
    (``J`` may be ``Wm`` itself, in the same tiles: formed in place); returns
    how many lanes have a zero/NaN pivot."""
    _prep_h(t, h, tend, done, m, hs, last)
    factor_shifted_rows(J, WJ, Wm, WA, hs, gamma, nnz, m, chunk, piv, mul_piv, mul_slot,
                        upd_ptr, upd_tgt, upd_src, bad, row_ptr, mrow_ptr)
    nbad = 0
    for l in range(m):
        if bad[l] >= 0:
            nbad += 1
    return nbad


@numba.njit(**_JIT)
def _stage_solve(F, K, i, cidx, cval, hs, gdt, dfdt, perm, m, ch, Wm, nnz, WA,
                 piv, fwd_ptr, fwd_slot, fwd_col, bwd_ptr, bwd_slot, bwd_col,
                 Y, nidx, nval, nout, comb):
    """Stage ``i``: its right-hand side (:func:`_stage_rhs`) and solve; with
    ``comb``, then the next combination ``nout = Y + Σ nval K[nidx]`` (the
    next stage's argument, or the new state after the last stage).

    One pass per direction: each row's stage right-hand side is formed right
    before its forward substitution, and each row of the combination right
    after its backward substitution (while the row is in L1), over all ``m``
    lanes, the row's substitution tile by tile of ``WA`` lanes in between
    (a whole vector tile, :func:`~esmjac.linalg.sparse_lu.vec_lanes` lanes, as one
    :func:`~esmjac.linalg.sparse_lu.rowdot`: the row held in registers
    across its ops; two whole float64 tiles as one
    :func:`~esmjac.linalg.sparse_lu.rowdot2`, which reads each op's slot and
    column once for both). A row's right-hand side and combination are each
    one :func:`~esmjac.linalg.sparse_lu.vlin` over the whole groups of VEC
    lanes (the sum held in registers, stored once), indexed loops for the
    rest. Every value sees the operations of :func:`_stage_rhs`,
    the triangular solves and :func:`_combine` in the same order (the same
    bits): a row's forward step reads only rows already substituted, the
    combination only rows already solved, and ``nout`` is neither ``F`` nor
    ``Y``."""
    n = perm.shape[0]
    P = cidx.shape[0]
    Q = nidx.shape[0]
    Ki = K[i]
    for p in range(P):
        c = ch[p * m:(p + 1) * m]
        cv = cval[p]
        for l in range(m):
            c[l] = cv / hs[l]
    nv = m // VEC                               # whole groups of VEC lanes: vector ops, then the rest
    mv = nv * VEC
    vw = VEC * 8 // Wm.itemsize                 # a whole vector tile of the matrix (vec_lanes)
    pair = vw == VEC                            # float64 tiles: two per call (rowdot2; float32's would spill)
    for r in range(n):
        ro = r * m
        so = perm[r] * m
        vlin(Ki, ro, F, so, K, cidx, ro, ch, m, 0, nv)      # F + Σ c_p/h K[cidx_p], in registers
        for l in range(mv, m):                  # the rest, indexed (a slice per row costs more)
            v = F[so + l]
            for p in range(P):
                v += ch[p * m + l] * K[cidx[p], ro + l]
            Ki[ro + l] = v
        if gdt != 0.0:
            for l in range(m):
                Ki[ro + l] += (gdt * hs[l]) * dfdt[so + l]
        l0 = 0
        while l0 < m:
            mt = min(WA, m - l0)
            base = (l0 // WA) * nnz * WA
            if mt == vw and WA == vw:
                if pair and m - l0 >= 2 * WA:   # two whole float64 tiles: one rowdot2
                    rowdot2(Ki, r * m + l0, Wm, base, nnz * WA, fwd_slot, fwd_col, fwd_ptr[r], fwd_ptr[r + 1], Ki,
                            m, l0, -1)
                    l0 += 2 * WA
                    continue
                rowdot(Ki, r * m + l0, Wm, base, fwd_slot, fwd_col, fwd_ptr[r], fwd_ptr[r + 1], Ki, m, l0, -1)
                l0 += WA
                continue
            bt = Ki[r * m + l0:r * m + l0 + mt]
            for q in range(fwd_ptr[r], fwd_ptr[r + 1]):
                ao = base + fwd_slot[q] * WA
                a = Wm[ao:ao + mt]
                jo = fwd_col[q] * m + l0
                bj = Ki[jo:jo + mt]
                for l in range(mt):
                    bt[l] -= a[l] * bj[l]
            l0 += WA
    for r in range(n - 1, -1, -1):
        l0 = 0
        while l0 < m:
            mt = min(WA, m - l0)
            base = (l0 // WA) * nnz * WA
            if mt == vw and WA == vw:
                if pair and m - l0 >= 2 * WA:
                    rowdot2(Ki, r * m + l0, Wm, base, nnz * WA, bwd_slot, bwd_col, bwd_ptr[r], bwd_ptr[r + 1], Ki,
                            m, l0, piv[r])
                    l0 += 2 * WA
                    continue
                rowdot(Ki, r * m + l0, Wm, base, bwd_slot, bwd_col, bwd_ptr[r], bwd_ptr[r + 1], Ki, m, l0,
                       piv[r])
                l0 += WA
                continue
            bt = Ki[r * m + l0:r * m + l0 + mt]
            for q in range(bwd_ptr[r], bwd_ptr[r + 1]):
                ao = base + bwd_slot[q] * WA
                a = Wm[ao:ao + mt]
                jo = bwd_col[q] * m + l0
                bj = Ki[jo:jo + mt]
                for l in range(mt):
                    bt[l] -= a[l] * bj[l]
            do = base + piv[r] * WA
            d = Wm[do:do + mt]
            for l in range(mt):
                bt[l] = bt[l] * d[l]
            l0 += WA
        if comb:
            so = perm[r] * m
            vlin(nout, so, Y, so, K, nidx, r * m, nval, 0, 0, nv)   # Y + Σ nval_p K[nidx_p]
            for l in range(mv, m):
                v = Y[so + l]
                for p in range(Q):
                    v += nval[p] * K[nidx[p], r * m + l]
                nout[so + l] = v


#: Byte alignment of the stepper's scratch (:func:`_buf`): a cache line.
ALIGN = 64


def _buf(size: int, dtype=np.float64, fill=None) -> np.ndarray:
    """A 1-D array of ``size`` elements whose data start on an :data:`ALIGN`
    boundary (a view into a slightly larger byte buffer).

    NumPy's allocator returns 16-byte aligned memory, so one stepper's rows
    and tiles started 16 or 48 bytes into a cache line and another's on it:
    on a recorded 64-lane GEOS-Chem block (60 interleaved rounds, load 4)
    the factorisation cost 7.3 µs per lane on aligned arrays against 8.5–8.8
    16 bytes off, and the 4 stage solves 7.7 against 9.4–9.5 — a lottery
    per scratch instance (one per lane count and thread). The same
    arithmetic on the same values, so the same bits."""
    dt = np.dtype(dtype)
    raw = np.empty(size * dt.itemsize + ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    a = raw[off:off + size * dt.itemsize].view(dt)
    if fill is not None:
        a.fill(fill)
    return a


def _nz(coefs) -> tuple[np.ndarray, np.ndarray]:
    idx = [j for j, v in enumerate(coefs) if v != 0.0]
    return np.array(idx, dtype=np.int64), np.array([coefs[j] for j in idx], dtype=np.float64)


# The step's kernels the sensitivities replay recorded steps with
# (:mod:`esmjac.integrators.sensitivity`): the same arithmetic, so the same bits.
gather, assemble_w, combine, stage_rhs, nonzero_terms = _gather, _assemble_w, _combine, _stage_rhs, _nz


class LaneStepper:
    """Scratch and driver for one block of lanes (one per worker thread).

    Built once for a capacity ``C`` (the largest block it will see) and reused
    for every call: nothing is allocated per step or per call except what the
    user's forcing callable returns.
    """

    def __init__(self, tab, lu: SparseLaneLU, perm: np.ndarray, iperm: np.ndarray,
                 n_forcing: int, n_cdims: int, capacity: int, tile: int | None,
                 rhs, jac, shared: bool, compact: bool, reuse: tuple | None = None,
                 lu_dtype=np.float64, lane_prologue=None, n_hoisted: int = 0,
                 readonly_fields: bool = False):
        self.tab, self.lu = tab, lu
        # reuse: None (a new Jacobian and LU every attempt) or (max_age, lo, hi)
        # for a W-method's per-lane reuse (see _reuse_plan)
        self.reuse = reuse
        self.perm, self.iperm = perm, iperm
        n, C, S = lu.n, int(capacity), tab.stages
        # FZ holds the program's fields (nfu rows: the user's, or a forcing
        # callable's) and, after them, n_hoisted rows of state-independent
        # values (rate coefficients) that ``lane_prologue(FZ, cix, m)``
        # computes from them whenever they change (bound.LaneHoist)
        self.nfu = int(n_forcing)
        self.lane_prologue = lane_prologue if n_hoisted else None
        self.n, self.C, self.nf, self.ncd = n, C, int(n_forcing) + int(n_hoisted), int(n_cdims)
        self.tile = tile
        self.rhs, self.jac = rhs, jac
        self.shared, self.compact = bool(shared), bool(compact)
        # every array starts on a cache line (_buf): a full block's rows and
        # tiles are then 64-byte aligned whatever the allocator returned
        i64, i8 = np.int64, np.int8
        self.Y, self.Ynew, self.Yst = _buf(n * C), _buf(n * C), _buf(n * C)
        self.F0, self.Fs, self.dfdt = _buf(n * C), _buf(n * C), _buf(n * C, fill=0)
        self.K = _buf(S * n * C, fill=0).reshape(S, n * C)
        W = C if tile is None else tile
        self.J = _buf(tiled_size(lu.nnz, C, W), fill=0)
        #: Whether the iteration matrix is formed in place (:meth:`run`): ``jac``
        #: writes J straight into ``Wm`` (the factorisation's own 16-lane
        #: tiles), which is negated, shifted and eliminated where it lies.
        #: Not for float32 factors (a conversion is a copy anyway), nor a
        #: W-method (it keeps J across steps), nor other tile widths.
        self.inplace = reuse is None and np.dtype(lu_dtype) == np.float64 and tile == VEC
        # the iteration matrix (float32 for precision="mixed": factored in
        # float32, solved with float64 accumulation into float64 stages)
        self.Wm = _buf(tiled_size(lu.nnz, C, W if self.inplace else lu_tile(C, lu_dtype)), lu_dtype, fill=0)
        self.FZ = _buf(max(self.nf * C, 1), fill=0)
        # what ``rhs`` reads the fields through: with ``readonly_fields`` a
        # read-only view, the signature the program's build compiled (a
        # writable one makes Numba compile generated chunks again)
        self.FZr = self.FZ
        if readonly_fields:
            self.FZr = self.FZ.view()
            self.FZr.flags.writeable = False
        self.cix = _buf(max(self.ncd * C, 1), i64, fill=0)
        self.idx = _buf(C, i64)
        self.t, self.h, self.hs = _buf(C), _buf(C), _buf(C)
        self.tst = _buf(C)
        self.err = _buf(C)
        self.eb = _buf(C)                       # _err_guard's one-species scratch
        self.ch = _buf(S * C)                   # _stage_rhs' c/h factors
        self.bad = _buf(C, i64)
        self.last, self.rl, self.rm = _buf(C, i8), _buf(C, i8), _buf(C, i8)
        self.crej = _buf(C, i64)
        self.nonfin, self.done = _buf(C, i8), _buf(C, i8)
        self.acc = _buf(C, i8)                    # _control's accepted-lane flags
        self.gcode = _buf(C, i8)                  # _err_guard's per-lane guard codes
        self.newj, self.newlu = _buf(C, i8, fill=1), _buf(C, i8, fill=1)    # this attempt's new J / LU
        # accepted steps on each lane's Jacobian (the guards read it; 0 without reuse: never kept)
        self.jage = _buf(C, i64, fill=0)
        if reuse is not None:
            self.hlu = _buf(C)
            self.selj, self.sellu = _buf(C, i64), _buf(C, i64)
            self.ar = np.arange(C, dtype=i64)
            self.Ysub = _buf(n * C)
            self.FZsub = _buf(max(self.nf * C, 1), fill=0)
            self.cixsub = _buf(max(self.ncd * C, 1), i64, fill=0)
            self.Jk = _buf(tiled_size(lu.nnz, C, W), fill=0)     # also compaction scratch
            self.Wmk = _buf(tiled_size(lu.nnz, C, lu_tile(C, lu_dtype)), lu_dtype, fill=0)
            self.hk, self.badk = _buf(C), _buf(C, i64)
        self.a_nz = [_nz(tab.a[i]) for i in range(S)]
        self.c_nz = [_nz(tab.c[i]) for i in range(S)]
        self.m_nz, self.e_nz = _nz(tab.m), _nz(tab.e)
        # what each stage's call combines after its solve: the next stage's
        # argument (when that stage needs a new f) or, after the last, Ynew
        self._next = []
        for i in range(S):
            if i + 1 == S:
                self._next.append((*self.m_nz, self.Ynew, True))
            elif tab.newf[i + 1]:
                self._next.append((*self.a_nz[i + 1], self.Yst, True))
            else:
                self._next.append((*self.m_nz, self.Ynew, False))
        self.nf_stage = sum(1 for i in range(S) if tab.newf[i])
        self.fops, self.sops, self.rops = lu.factor_ops(), lu.solve_ops(), lu.row_ops()
        #: Singularity guards (:func:`_err_guard`): |u| bound, and whether a
        #: negative value fails the lane (the leaf sets both).
        self.max_abs, self.nonnegative = math.inf, False
        #: What runs ``rhs`` and ``jac`` (the binding's word, for reports).
        self.engines: dict = {}

    # -- forcing ------------------------------------------------------------
    def _forcing_at(self, fcall, times, m):
        """Evaluate a forcing callable at per-lane ``times`` into FZ."""
        val = np.asarray(fcall(times[:m], self.idx[:m]), dtype=np.float64)
        nfu = self.nfu
        if val.size != nfu * m:
            raise JacError("bad_argument",
                           f"forcing(t, lanes) returned {val.size} values; expected "
                           f"{nfu} fields x {m} lanes (shape ({nfu}, {m}))")
        self.FZ[:nfu * m] = val.reshape(-1)
        if self.lane_prologue is not None:
            self.lane_prologue(self.FZ, self.cix, m)

    def _w_matrices(self, t, h, tend, m, W, WA, nonauto, fcall):
        """A W-method attempt's f(y), Jacobians and factorisations, each lane
        deciding for itself what to reuse (:func:`_reuse_plan`): F0 at the
        lanes' states (and ∂f/∂t for a forcing callable), new Jacobians for
        the lanes that need one (all lanes in one call when all do, else a
        gathered sub-batch), new LUs likewise."""
        if self.reuse is None:
            raise JacError("internal_error", "a W-method attempt on a stepper built without reuse")
        max_age, lo, hi = self.reuse
        lu, n, Y = self.lu, self.n, self.Y
        kj, k = _reuse_plan(t, h, tend, self.done, m, self.hs, self.last, self.jage, self.hlu, self.rl,
                            max_age, lo, hi, self.newj, self.newlu, self.selj, self.sellu)
        if nonauto:
            _fd_times(t, m, self.tst)
            self._forcing_at(fcall, self.tst, m)
            self.rhs(Y, self.FZr, self.cix, m, self.Fs)
            self._forcing_at(fcall, t, m)
            self.rhs(Y, self.FZr, self.cix, m, self.F0)
            _fd_time(self.Fs, self.F0, t, m, n, self.dfdt)
        else:
            self.rhs(Y, self.FZr, self.cix, m, self.F0)
        if kj == m:
            self.jac(Y, self.FZ, self.cix, m, self.J)
        elif kj > 0:
            sel = self.selj
            _gather(Y, m, sel, n, kj, self.Ysub)
            if self.nf:
                _gather(self.FZ, m, sel, self.nf, kj, self.FZsub)
            if self.ncd:
                _gather(self.cix, m, sel, self.ncd, kj, self.cixsub)
            Wk = kj if self.tile is None else self.tile
            self.jac(self.Ysub, self.FZsub, self.cixsub, kj, self.Jk)
            _tiled_copy(self.Jk, lu.nnz, Wk, self.ar, self.J, W, sel, kj)
        Wk = k if self.tile is None else self.tile
        _sub_factor(self.J, W, self.Wm, WA, self.hs, self.tab.gamma, lu.nnz, m, self.sellu, k, self.ar,
                    self.Jk, max(Wk, 1), self.Wmk, lu_tile(k, self.Wm.dtype), self.hk, self.badk, CHUNK, *self.fops,
                    self.bad, self.hlu, *self.rops)

    # -- driver ---------------------------------------------------------------
    def run(self, u, out, L, lane0, c, t0, tend, h0, forcing, fcall, cix_full, atol, rtol,
            max_steps, max_rejects, clip, st, record=None, lanes=None):
        """Integrate lanes ``lane0 .. lane0+c-1`` of ``u`` (stride L) over
        [t0, tend], results into ``out`` (may be ``u``); per-lane stats in
        ``st`` (arrays indexed by global lane). With ``lanes`` (a permutation
        of the ``L`` lanes), the block is lanes ``lanes[lane0:lane0+c]``
        instead. With ``record`` (a list), every accepted step is appended as
        ``(lanes, y (n, k), h (k,))`` — the trajectory the sensitivity
        replays need."""
        tab, lu = self.tab, self.lu
        n, S = self.n, tab.stages
        m = int(c)
        idx = self.idx
        if lanes is None:
            idx[:m] = np.arange(lane0, lane0 + m)
        else:
            idx[:m] = lanes[lane0:lane0 + m]
        _gather(u, L, idx, n, m, self.Y)
        if self.nfu and fcall is None:
            _gather(forcing, L, idx, self.nfu, m, self.FZ)
        if self.ncd:
            _gather(cix_full, L, idx, self.ncd, m, self.cix)
        if self.lane_prologue is not None and fcall is None:
            self.lane_prologue(self.FZ, self.cix, m)       # once per call: the fields are constant
        span = float(tend - t0)
        t, h, hs = self.t, self.h, self.hs
        t[:m] = t0
        for a in (self.rl, self.rm, self.done, self.nonfin):
            a[:m] = 0
        self.crej[:m] = 0
        reuse = self.reuse
        if reuse is not None:
            self.jage[:m] = -1
            self.hlu[:m] = 0.0
        nonauto = fcall is not None
        if span <= 0.0:
            _scatter_all(self.Y, n, m, idx, out, L)
            return
        if h0 is None:
            if nonauto:
                self._forcing_at(fcall, t, m)
            self.rhs(self.Y, self.FZr, self.cix, m, self.F0)
            st.nfev[idx[:m]] += 1
            _h_start(self.Y, self.F0, atol, rtol, span, m, n, h)
            if self.shared:
                _shared_min(h, m)
        else:
            h[:m] = np.minimum(h0[idx[:m]], span) if isinstance(h0, np.ndarray) else min(float(h0), span)
        gamma = tab.gamma
        K, Y, Ynew, Yst, F0, Fs = self.K, self.Y, self.Ynew, self.Yst, self.F0, self.Fs
        nfev_step = self.nf_stage + (1 if nonauto else 0)
        inplace = self.inplace
        # in place, the Jacobian's buffer is the iteration matrix's (its tiles)
        Jd = self.Wm if inplace else self.J
        while m > 0:
            W = m if self.tile is None else self.tile
            WA = W if inplace else lu_tile(m, self.Wm.dtype)
            if reuse is not None:
                self._w_matrices(t, h, tend, m, W, WA, nonauto, fcall)
            elif nonauto:
                _prep_h(t, h, tend, self.done, m, hs, self.last)
                # ∂f/∂t by a forward difference in t (the forcing's time dependence).
                _fd_times(t, m, self.tst)
                self._forcing_at(fcall, self.tst, m)
                self.rhs(Y, self.FZr, self.cix, m, Fs)
                self._forcing_at(fcall, t, m)
                self.rhs(Y, self.FZr, self.cix, m, F0)
                _fd_time(Fs, F0, t, m, n, self.dfdt)
                self.jac(Y, self.FZ, self.cix, m, Jd)
                factor_shifted_rows(Jd, W, self.Wm, WA, hs, gamma, lu.nnz, m, CHUNK, *self.fops,
                                    self.bad, *self.rops)
                if inplace and (self.bad[:m] >= 0).any():
                    self.jac(Y, self.FZ, self.cix, m, self.J)       # for _control (see below)
            else:
                self.rhs(Y, self.FZr, self.cix, m, F0)
                self.jac(Y, self.FZ, self.cix, m, Jd)
                if _prep_and_factor(t, h, tend, self.done, m, hs, self.last, Jd, W, self.Wm, WA, gamma,
                                    lu.nnz, CHUNK, *self.fops, self.bad, *self.rops) and inplace:
                    # a lane with a zero/NaN pivot: _control reads its J (a
                    # non-finite entry is status 4, else 5), which the
                    # factorisation overwrote; the same call at the same
                    # state gives the same J (rare: a singular attempt)
                    self.jac(Y, self.FZ, self.cix, m, self.J)
            if self.shared:
                _shared_bad(self.bad, m)
            Fi = F0
            for i in range(S):
                if i > 0 and tab.newf[i]:
                    # Yst (this stage's argument) was combined by the previous stage's call
                    if nonauto:
                        _times(t, hs, tab.alpha[i], m, self.tst)
                        self._forcing_at(fcall, self.tst, m)
                    self.rhs(Yst, self.FZr, self.cix, m, Fs)
                    Fi = Fs
                # (a stage without newf has the previous stage's argument, so the same f)
                ci, cv = self.c_nz[i]
                nx, nv, no, comb = self._next[i]
                _stage_solve(Fi, K, i, ci, cv, hs, tab.gsum[i] if nonauto else 0.0, self.dfdt,
                             self.perm, m, self.ch, self.Wm, lu.nnz, WA, *self.sops,
                             Y, nx, nv, no, comb)
            mx, nonneg = float(self.max_abs), bool(self.nonnegative and not clip)
            if record is None:
                ndone = _finish(Y, Ynew, F0, K, self.e_nz[0], self.e_nz[1], atol, rtol, self.iperm, n, m,
                                self.err, self.eb, self.gcode, mx, nonneg, self.shared, self.bad, self.done, idx,
                                t, hs, self.J, lu.nnz, W, self.last, h, tend, span, self.rl, self.rm, self.crej,
                                self.nonfin, tab.elo, max_steps, max_rejects, clip, nfev_step, self.newj,
                                self.newlu, self.jage, st.status, st.nsteps, st.naccept, st.nreject, st.nfev, st.njev,
                                st.ndec, st.h, st.t, self.acc)
            else:
                ndone = _check_step(Y, Ynew, F0, K, self.e_nz[0], self.e_nz[1], atol, rtol, self.iperm, n, m,
                                    self.err, self.eb, self.gcode, mx, nonneg, self.shared, self.bad, self.done,
                                    idx, st.status, st.h, st.t, t, hs, self.newj, self.jage)
                acc = np.flatnonzero((self.bad[:m] < 0) & (self.err[:m] <= 1.0) & (self.done[:m] == 0))
                if acc.size:
                    # fresh: the lane's Jacobian was evaluated at this step's state
                    fresh = (np.ones(acc.size, bool) if reuse is None else
                             (self.newj[acc] != 0) | (self.jage[acc] == 0))
                    record.append((idx[acc].copy(), Y[:n * m].reshape(n, m)[:, acc].copy(), hs[acc].copy(),
                                   fresh))
                ndone += _control(Y, Ynew, n, m, self.err, self.bad, self.J, lu.nnz, W, hs, self.last, t, h,
                                  tend, span, self.rl, self.rm, self.crej, self.nonfin, self.done, idx, tab.elo,
                                  max_steps, max_rejects, clip, nfev_step, self.newj, self.newlu,
                                  st.status, st.nsteps, st.naccept, st.nreject, st.nfev, st.njev, st.ndec,
                                  st.h, st.t, self.acc)
            if reuse is not None:
                _aged(self.acc, self.newj, m, self.jage)
            if ndone == 0:
                continue
            if not self.compact:
                if int(self.done[:m].sum()) == m:
                    _scatter_all(Y, n, m, idx, out, L)
                    return
                continue
            done = self.done
            mn = _retire(Y, n, m, done, idx, out, L)
            if mn == 0:
                return
            for arr in (t, h, self.rl, self.rm, self.nonfin):
                _squeeze_lane(arr, m, done)
            _squeeze_lane(self.crej, m, done)
            if reuse is not None:
                # the kept Jacobians and factorisations follow their lanes
                _squeeze_lane(self.jage, m, done)
                _squeeze_lane(self.hlu, m, done)
                _squeeze_tiled(self.J, lu.nnz, m, W, mn, mn if self.tile is None else self.tile, done, self.Jk)
                _squeeze_tiled(self.Wm, lu.nnz, m, WA, mn, lu_tile(mn, self.Wm.dtype), done, self.Wmk)
            if self.nf and fcall is None:
                _squeeze_rows(self.FZ, self.nf, m, mn, done)
            if self.ncd:
                _squeeze_rows(self.cix, self.ncd, m, mn, done)
            _squeeze_lane(idx, m, done)
            done[:mn] = 0
            m = mn


# Numba keys a cached function by its own file: key these by what they link in from other
# modules too (compile/jitkeys.py), so an edit there is not served stale from a warm cache.
key_by_callees(globals())
