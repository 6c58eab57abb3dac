"""Lane-parallel Rosenbrock integrator (KPP formulation) on LaneSparseBlocks.

Integrates ``L`` independent copies (lanes, e.g. grid cells) of an ``n``-species
stiff system that share one Jacobian sparsity pattern. The per-step linear
algebra is :class:`~esmjac.integrators.sparse_lu.SparseLaneLU`: the iteration
matrix ``W = I/(hγ) − J`` is assembled straight into the pattern's slots,
factored once per step attempt, and every stage is one sparse triangular
solve. All vector work (stage right-hand sides, stage combinations, error
norm) is done by Numba kernels over the flat lanes-fastest arrays, parallel
over fixed lane chunks, so results are bitwise independent of the thread
count.

Methods (coefficients in the transformed "KPP" form of Hairer & Wanner,
*Solving ODEs II*, §IV.7, eqs. (7.24)–(7.25), with ``u_i = Σ_j γ_ij k_j``):

* ``"rodas3"`` — 4 stages, order 3 with embedded order 2, stiffly accurate,
  γ = 1/2. Source: A. Sandu, J. G. Verwer, J. G. Blom, E. J. Spee,
  G. R. Carmichael, F. A. Potra, "Benchmarking stiff ODE solvers for
  atmospheric chemistry problems II: Rosenbrock solvers", *Atmospheric
  Environment* 31 (1997) 3459–3472. The transformed coefficients are derived
  below, exactly, from the published standard-form tableau.
* ``"ros3"`` — 3 stages, order 3(2), L-stable, γ ≈ 0.4358665. Same source;
  the transformed coefficients are the published 32-digit values.

This module's :func:`rosenbrock` is the *shared-step* driver for arbitrary
callables over all lanes: lanes advance in lock-step with one step size,
so the stiffest lane sets the pace (the usual trade of vectorised chemistry,
and NCAR MICM's known weakness). The native leaf
(:func:`esmjac.adapters.native.rosenbrock`) uses the per-lane engine of
:mod:`esmjac.integrators.lanestep` instead — every lane its own step size —
with these same tableaus.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import numba
import numpy as np

from ..errors import JacError
from ..runtime import checks
from ..linalg.sparse_lu import CHUNK, SparseLaneLU, single_chunk_threads

__all__ = ["rosenbrock", "RosenbrockResult", "METHODS", "perm_arrays"]


# --------------------------------------------------------------------------
# Method coefficients.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class _Tableau:
    """A Rosenbrock method in transformed form.

    Stage ``i``: ``(I/(hγ) − J) u_i = f(t + α_i h, y + Σ_j a_ij u_j)
    + Σ_j (c_ij/h) u_j + γ_i h ∂f/∂t``; ``y_new = y + Σ m_i u_i``;
    error estimate ``Σ e_i u_i``. ``newf[i]`` says whether stage ``i`` needs
    a fresh ``f`` (false when its argument equals the previous stage's).
    """

    name: str
    gamma: float            # diagonal γ
    a: tuple                # a[i] = (a_i0, …, a_i,i-1)
    c: tuple                # c[i] likewise
    m: tuple
    e: tuple
    alpha: tuple            # α_i = Σ_j α_ij (stage time offsets)
    gsum: tuple             # γ_i = Σ_{j≤i} γ_ij (∂f/∂t weights)
    newf: tuple
    elo: float              # order of the error estimate's leading term

    @property
    def stages(self) -> int:
        return len(self.m)


def _transform(name, alpha, gam, b, bhat, elo) -> _Tableau:
    """Standard form (α_ij, γ_ij incl. diagonal, b, b̂) → transformed form,
    exactly in rationals: a = α Γ⁻¹, c = diag(1/γ) − Γ⁻¹, m = b Γ⁻¹,
    e = (b − b̂) Γ⁻¹ (Hairer–Wanner II, (7.25))."""
    s = len(b)
    G = [[Fraction(gam[i][j]) if j <= i else Fraction(0) for j in range(s)] for i in range(s)]
    H = [[Fraction(0)] * s for _ in range(s)]           # Γ⁻¹, lower triangular
    for j in range(s):
        for i in range(s):
            acc = Fraction(int(i == j))
            for k in range(j, i):
                acc -= G[i][k] * H[k][j]
            H[i][j] = acc / G[i][i] if i >= j else Fraction(0)
    A = [[Fraction(alpha[i][k]) if k < i else Fraction(0) for k in range(s)] for i in range(s)]

    def rowmul(v):
        return [sum((v[k] * H[k][j] for k in range(s)), Fraction(0)) for j in range(s)]

    a = tuple(tuple(float(x) for x in rowmul(A[i])[:i]) for i in range(s))
    c = tuple(tuple(float(-H[i][j]) for j in range(i)) for i in range(s))
    m = tuple(float(x) for x in rowmul([Fraction(x) for x in b]))
    e = tuple(float(x) for x in rowmul([Fraction(x) - Fraction(y) for x, y in zip(b, bhat)]))
    alph = tuple(float(sum(A[i], Fraction(0))) for i in range(s))
    gs = tuple(float(sum(G[i][: i + 1], Fraction(0))) for i in range(s))
    newf = tuple(i == 0 or a[i] != a[i - 1] + (0.0,) or alph[i] != alph[i - 1] for i in range(s))
    return _Tableau(name, float(G[0][0]), a, c, m, e, alph, gs, newf, elo)


F = Fraction
# Rodas3, standard form (Sandu et al. 1997): γ = 1/2,
#   α = [[], [0], [1, 0], [3/4, −1/4, 1/2]],
#   γ_ij = [[1/2], [1, 1/2], [−1/4, −1/4, 1/2], [1/12, 1/12, −2/3, 1/2]],
#   b = (5/6, −1/6, −1/6, 1/2) (stiffly accurate: b = α_4· + γ_4·),
#   b̂ = (3/4, −1/4, 1/2, 0) (= α_4·, also stiffly accurate).
# Transformed, this gives the familiar a31 = a41 = 2, a43 = 1, c21 = 4,
# c31 = c41 = 1, c32 = c42 = −1, c43 = −8/3, m = (2, 0, 1, 1), e = (0, 0, 0, 1).
_RODAS3 = _transform(
    "rodas3",
    alpha=[[], [0], [1, 0], [F(3, 4), F(-1, 4), F(1, 2)]],
    gam=[[F(1, 2)], [1, F(1, 2)], [F(-1, 4), F(-1, 4), F(1, 2)],
         [F(1, 12), F(1, 12), F(-2, 3), F(1, 2)]],
    b=[F(5, 6), F(-1, 6), F(-1, 6), F(1, 2)],
    bhat=[F(3, 4), F(-1, 4), F(1, 2), 0],
    elo=3.0,
)

# ROS3 (Sandu et al. 1997), already in transformed form; γ is the root of
# 6γ³ − 18γ² + 9γ − 1 = 0 that makes the method L-stable.
_G3 = 0.43586652150845899941601945119356
_ROS3 = _Tableau(
    "ros3",
    gamma=_G3,
    a=((), (1.0,), (1.0, 0.0)),
    c=((), (-1.0156171083877702091975600115545,),
       (4.0759956452537699824805835358067, 9.2076794298330791242156818474003)),
    m=(1.0, 6.1697947043828245592553615689730, -0.42772256543218573326238373806514),
    e=(0.5, -2.9079558716805469821718236208017, 0.22354069897811569627360909276199),
    alpha=(0.0, _G3, _G3),
    gsum=(_G3, 0.24291996454816804366592249683314, 2.1851380027664058511513169485832),
    newf=(True, True, False),
    elo=3.0,
)
del F

#: Available methods by name.
METHODS: dict[str, _Tableau] = {"rodas3": _RODAS3, "ros3": _ROS3}

# Step-size control (the KPP defaults): new h = h·clip(SAFE·err^(−1/elo),
# FAC_MIN, FAC_MAX); after two rejections in a row h shrinks by FAC_REJ.
_FAC_SAFE, _FAC_MIN, _FAC_MAX, _FAC_REJ = 0.9, 0.2, 6.0, 0.1
_MAX_SINGULAR = 5


# --------------------------------------------------------------------------
# Vector kernels over the flat lanes-fastest arrays. ``perm[k]`` is the
# natural species at permuted position k; stage vectors K live in permuted
# order (that of the LU), states and f values in natural order.
# --------------------------------------------------------------------------

# Loops run over unit-stride views indexed from 0 (see sparse_lu): that lets
# LLVM drop negative-index wraparound and vectorise.

@numba.njit(cache=True, parallel=True, error_model="numpy")
def _assemble_w(J, W, diag_slots, shift, L, chunk):
    """W = shift·I − J in slot storage."""
    nnz = J.shape[0] // L
    nchunks = (L + chunk - 1) // chunk
    for c in numba.prange(nchunks):
        l0 = c * chunk
        m = min(L, l0 + chunk) - l0
        for q in range(nnz):
            o = q * L + l0
            w = W[o:o + m]
            j = J[o:o + m]
            for l in range(m):
                w[l] = -j[l]
        for k in range(diag_slots.shape[0]):
            o = diag_slots[k] * L + l0
            w = W[o:o + m]
            for l in range(m):
                w[l] += shift


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _stage_rhs(F, K, i, cidx, cval, gdt, dfdt, perm, L, chunk):
    """K[i] (permuted) = F + Σ_p cval_p K[cidx_p] + gdt·dfdt, left to right."""
    n = perm.shape[0]
    nchunks = (L + chunk - 1) // chunk
    for c in numba.prange(nchunks):
        l0 = c * chunk
        m = min(L, l0 + chunk) - l0
        for k in range(n):
            ko = k * L + l0
            so = perm[k] * L + l0
            ki = K[i, ko:ko + m]
            fs = F[so:so + m]
            for l in range(m):
                ki[l] = fs[l]
            for p in range(cidx.shape[0]):
                kj = K[cidx[p], ko:ko + m]
                cv = cval[p]
                for l in range(m):
                    ki[l] += cv * kj[l]
            if gdt != 0.0:
                ds = dfdt[so:so + m]
                for l in range(m):
                    ki[l] += gdt * ds[l]


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _combine(Y, K, idx, val, perm, L, chunk, out):
    """out (natural) = Y + Σ_p val_p K[idx_p] (permuted), left to right."""
    n = perm.shape[0]
    nchunks = (L + chunk - 1) // chunk
    for c in numba.prange(nchunks):
        l0 = c * chunk
        m = min(L, l0 + chunk) - l0
        for k in range(n):
            ko = k * L + l0
            so = perm[k] * L + l0
            o = out[so:so + m]
            y = Y[so:so + m]
            for l in range(m):
                o[l] = y[l]
            for p in range(idx.shape[0]):
                kj = K[idx[p], ko:ko + m]
                v = val[p]
                for l in range(m):
                    o[l] += v * kj[l]


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _err_norm(Y, Ynew, K, idx, val, atol, rtol, iperm, L, chunk, cmax):
    """cmax[chunk] = max over its lanes of RMS_s(err_s / sc_s), err = Σ val K[idx],
    sc_s = atol_s + rtol·max(|y_s|, |ynew_s|). Species are summed in natural
    order (so the norm does not depend on the permutation); NaN → inf."""
    n = iperm.shape[0]
    nchunks = (L + chunk - 1) // chunk
    for c in numba.prange(nchunks):
        l0 = c * chunk
        m = min(L, l0 + chunk) - l0
        acc = np.zeros(m)
        e = np.empty(m)
        for s in range(n):
            so = s * L + l0
            ko = iperm[s] * L + l0
            y = Y[so:so + m]
            yn = Ynew[so:so + m]
            for l in range(m):
                e[l] = 0.0
            for p in range(idx.shape[0]):
                kj = K[idx[p], ko:ko + m]
                v = val[p]
                for l in range(m):
                    e[l] += v * kj[l]
            a = atol[s]
            for l in range(m):
                r = e[l] / (a + rtol * max(abs(y[l]), abs(yn[l])))
                acc[l] += r * r
        mx = 0.0
        for l in range(m):
            v = math.sqrt(acc[l] / n)
            if not (v <= mx):        # also catches NaN
                mx = v if v == v else np.inf
        cmax[c] = mx


@numba.njit(cache=True, parallel=True, error_model="numpy")
def _fd_time(F1, F0, inv_delta, out, chunk):
    """out = (F1 − F0)/δ: the finite-difference ∂f/∂t (as KPP does)."""
    N = F0.shape[0]
    nchunks = (N + chunk - 1) // chunk
    for c in numba.prange(nchunks):
        l0 = c * chunk
        m = min(N, l0 + chunk) - l0
        o = out[l0:l0 + m]
        a = F1[l0:l0 + m]
        b = F0[l0:l0 + m]
        for l in range(m):
            o[l] = (a[l] - b[l]) * inv_delta


# --------------------------------------------------------------------------
# Driver.
# --------------------------------------------------------------------------

@dataclass
class RosenbrockResult:
    """Outcome of :func:`rosenbrock`. ``y`` is the final state (flat,
    ``y[s*L + l]``, natural species order); ``t`` the time it belongs to."""

    t: float
    y: np.ndarray
    nfev: int
    njev: int
    nsteps: int          # step attempts = naccept + nreject
    naccept: int
    nreject: int
    ndec: int            # LU factorisations (singular retries included)
    nsol: int            # stage solves
    success: bool
    message: str
    h: float = 0.0       # step size proposed for a continuation


def _pos_int(name, v) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise JacError("bad_argument", f"{name} must be a positive int, got {v!r}")
    return int(v)


def perm_arrays(perm, n) -> tuple:
    """``(perm, inverse)`` int64 arrays of a variable order (None: the
    identity); a sequence that is not a permutation of ``range(n)`` is refused."""
    if perm is None:
        p = np.arange(n, dtype=np.int64)
    else:
        try:
            p = np.array([int(x) for x in perm], dtype=np.int64)
        except (TypeError, ValueError):
            raise JacError("bad_argument", f"perm must be a sequence of ints, got {perm!r}") from None
        if p.shape != (n,) or sorted(p.tolist()) != list(range(n)):
            raise JacError("bad_argument", f"perm must be a permutation of 0..{n - 1}, got {tuple(perm)}")
    ip = np.empty(n, dtype=np.int64)
    ip[p] = np.arange(n, dtype=np.int64)
    return p, ip


def _nz(coefs) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the nonzero coefficients (zero terms are skipped,
    as KPP does: they cost time and would only matter for non-finite K)."""
    idx = [j for j, v in enumerate(coefs) if v != 0.0]
    return np.array(idx, dtype=np.int64), np.array([coefs[j] for j in idx], dtype=np.float64)


def rosenbrock(
    f: Callable[[float, np.ndarray, np.ndarray], None],
    jac: Callable[[float, np.ndarray, np.ndarray], None],
    u0: np.ndarray,
    t_span: tuple[float, float],
    *,
    n: int,
    lanes: int,
    lu_pattern: Sequence[tuple[int, int]],
    perm: Sequence[int] | None = None,
    rtol: float = 1e-4,
    atol: float | Sequence[float] | np.ndarray = 1.0,
    h0: float | None = None,
    max_steps: int = 100000,
    method: str = "rodas3",
    autonomous: bool = False,
) -> RosenbrockResult:
    """Integrate ``du/dt = f(t, u)`` for ``lanes`` independent systems.

    Layout: ``u[s*L + l]`` for species ``s`` (natural order) of lane ``l``.
    ``f(t, u, out)`` writes ``du/dt`` into ``out`` in that layout.
    ``jac(t, u, out)`` writes ``∂f/∂u`` into the slot array ``out`` (length
    ``len(lu_pattern)*L``), slot ``q`` = ``lu_pattern[q]`` with rows/columns
    in the *permuted* order: permuted position ``k`` is natural species
    ``perm[k]`` (``None`` = identity). ``out`` is zeroed before each call, so
    slots ``jac`` leaves alone (fill-in, structural zeros) read as 0.
    The one block-LU order gives both: ``plan = esmjac.linalg.factorization.
    block_order(states, pairs)``, ``perm = plan.positions(states)`` (indices
    into the declared, natural order — not ``plan.ordering``, which indexes
    the sorted names), ``lu_pattern = plan.lu_pattern``; a LaneSparseBlocks
    plan's ``info["ordering"]``/``info["lu_pattern"]`` are the same.

    ``lu_pattern`` must be sorted, contain every diagonal and be closed under
    no-pivoting fill-in;
    a prebuilt :class:`SparseLaneLU` is accepted too (its op lists are reused).

    Error control: the error norm is the **maximum over lanes** of the RMS
    over species of ``err_s / (atol_s + rtol·max(|y_old,s|, |y_new,s|))``;
    all lanes share one step size and advance together. ``atol`` is a scalar
    or one value per species (natural order).

    ``autonomous=True`` drops the ``γ_i h ∂f/∂t`` term (and the extra ``f``
    call per step that estimates ``∂f/∂t`` by a forward difference); leave
    it False when ``f`` depends on ``t`` explicitly.

    Failure (step limit, step size underflow, repeated singular ``W``,
    non-finite values) is reported in the result (``success=False`` with a
    message); bad arguments raise :class:`~esmjac.errors.JacError`.
    """
    if method not in METHODS:
        raise JacError("bad_option", f"unknown method {method!r}; choose from {sorted(METHODS)}")
    tab = METHODS[method]
    if not callable(f) or not callable(jac):
        raise JacError("bad_argument", "f and jac must be callables f(t, u, out), jac(t, u, out)")
    n = _pos_int("n", n)
    L = _pos_int("lanes", lanes)
    max_steps = _pos_int("max_steps", max_steps)
    lu = lu_pattern if isinstance(lu_pattern, SparseLaneLU) else SparseLaneLU(n, lu_pattern)
    if lu.n != n:
        raise JacError("bad_argument", f"lu_pattern is for n={lu.n}, not n={n}")
    p, ip = perm_arrays(perm, n)
    N = n * L

    u0a = np.asarray(u0)
    if u0a.ndim != 1 or u0a.shape[0] != N:
        raise JacError("bad_argument", f"u0 must be flat of length n*lanes={N}, got shape {u0a.shape}")
    if not np.issubdtype(u0a.dtype, np.floating) and not np.issubdtype(u0a.dtype, np.integer):
        raise JacError("bad_argument", f"u0 must be real, got dtype {u0a.dtype}")
    Y = np.array(u0a, dtype=np.float64, order="C")
    if not np.all(np.isfinite(Y)):
        raise JacError("bad_argument", "u0 has non-finite values")

    t0, tf = checks.time_span(t_span)
    rtol = checks.positive("rtol", rtol)
    at = np.asarray(atol, dtype=np.float64)
    if at.ndim == 0:
        at = np.full(n, float(at))
    if at.shape != (n,) or not np.all(at > 0.0) or not np.all(np.isfinite(at)):
        raise JacError("bad_argument", f"atol must be a positive scalar or {n} positive values")
    at = np.ascontiguousarray(at)

    if h0 is not None:
        h0 = checks.positive("h0", h0)

    span = tf - t0
    res = RosenbrockResult(t0, Y, 0, 0, 0, 0, 0, 0, 0, True, "", 0.0)
    if span == 0.0:
        res.message = "t_span is empty"
        return res

    S = tab.stages
    K = np.zeros((S, N))
    F0 = np.empty(N)
    Fs = np.empty(N)
    Yst = np.empty(N)
    Ynew = np.empty(N)
    dfdt = np.zeros(N)
    Jm = np.zeros(lu.nnz * L)
    W = np.empty(lu.nnz * L)
    nch = (L + CHUNK - 1) // CHUNK
    cmax = np.empty(nch)
    a_nz = [_nz(tab.a[i]) for i in range(S)]
    c_nz = [_nz(tab.c[i]) for i in range(S)]
    m_idx, m_val = _nz(tab.m)
    e_idx, e_val = _nz(tab.e)
    roundoff = np.finfo(np.float64).eps

    def call_f(t, y, out):
        user(f, t, y, out)
        res.nfev += 1

    def norm(y_a, y_b, k_idx, k_val):
        _err_norm(y_a, y_b, K, k_idx, k_val, at, rtol, ip, L, CHUNK, cmax)
        return float(cmax.max())

    # One chunk of lanes → our kernels run single-threaded (see
    # single_chunk_threads); the user's f and jac still see the caller's
    # thread count.
    outer_threads = numba.get_num_threads()

    def user(fn, t, y, out):
        if L > CHUNK:
            fn(t, y, out)
            return
        numba.set_num_threads(outer_threads)
        try:
            fn(t, y, out)
        finally:
            numba.set_num_threads(1)

    with single_chunk_threads(L):
        t = t0
        # Starting step: the first guess of Hairer–Wanner (I, II.4): 0.01·‖y‖/‖f‖
        # in the error-weighted norm, falling back to 1e-6 when either is tiny.
        if h0 is None:
            call_f(t, Y, F0)
            zeros = np.zeros(1, dtype=np.int64)
            # ‖y‖ and ‖f‖ in the weighted norm, via the error kernel with K ≡ y/f.
            K[0, :] = Y.reshape(n, L)[p].reshape(-1)
            d0 = norm(Y, Y, zeros, np.ones(1))
            K[0, :] = F0.reshape(n, L)[p].reshape(-1)
            d1 = norm(Y, Y, zeros, np.ones(1))
            h = 1e-6 if (d0 < 1e-5 or d1 < 1e-5 or not math.isfinite(d1)) else 0.01 * d0 / d1
            h = min(max(h, 1e-12 * span), span)
            have_f0 = True
        else:
            h = min(h0, span)
            have_f0 = False

        reject_last = reject_more = False
        err = 0.0
        while True:
            if t >= tf:
                res.message = "reached tf"
                break
            if res.nsteps >= max_steps:
                res.success, res.message = False, f"max_steps={max_steps} reached at t={t}"
                break
            if h < 10.0 * roundoff * max(abs(t), span * roundoff):
                res.success = False
                res.message = f"step size underflow (h={h:g}) at t={t}"
                if not math.isfinite(err):
                    res.message += " after a non-finite error estimate (NaN/inf in f, jac or the stages)"
                break
            last = h >= tf - t
            if last:
                h = tf - t
            if not have_f0:
                call_f(t, Y, F0)
            have_f0 = False
            if not autonomous:
                # KPP's forward difference for ∂f/∂t with δ = √eps·max(1e-5, |t|).
                delta = math.sqrt(roundoff) * max(1e-5, abs(t))
                call_f(t + delta, Y, Fs)
                _fd_time(Fs, F0, 1.0 / delta, dfdt, CHUNK)
            Jm.fill(0.0)
            user(jac, t, Y, Jm)
            res.njev += 1

            # Attempts with the same Jacobian until one is accepted.
            while True:
                nsing = 0
                while True:
                    _assemble_w(Jm, W, lu.diag_slots, 1.0 / (h * tab.gamma), L, CHUNK)
                    res.ndec += 1
                    bad = lu._factor_unchecked(W, L)
                    if bad is None:
                        break
                    nsing += 1
                    if nsing > _MAX_SINGULAR:
                        break
                    h *= 0.5
                    last = False
                if bad is not None:
                    res.success = False
                    res.message = (f"W = I/(hγ) − J singular {nsing} times in a row "
                                   f"(lane {bad[0]}, row {bad[1]}) at t={t}")
                    break

                for i in range(S):
                    if i == 0:
                        Fi = F0
                    elif tab.newf[i]:
                        _combine(Y, K, a_nz[i][0], a_nz[i][1], p, L, CHUNK, Yst)
                        call_f(t + tab.alpha[i] * h, Yst, Fs)
                        Fi = Fs
                    ci, cv = c_nz[i]
                    _stage_rhs(Fi, K, i, ci, cv / h, 0.0 if autonomous else tab.gsum[i] * h,
                               dfdt, p, L, CHUNK)
                    lu._solve_unchecked(W, K[i], L)
                    res.nsol += 1
                _combine(Y, K, m_idx, m_val, p, L, CHUNK, Ynew)
                err = norm(Y, Ynew, e_idx, e_val)
                res.nsteps += 1

                if math.isfinite(err):
                    fac = min(_FAC_MAX, max(_FAC_MIN, _FAC_SAFE / err ** (1.0 / tab.elo)))
                else:
                    fac = _FAC_REJ
                hnew = h * fac
                if err <= 1.0:
                    res.naccept += 1
                    Y, Ynew = Ynew, Y
                    t = tf if last else t + h
                    hnew = min(hnew, span)
                    if reject_last:
                        hnew = min(hnew, h)
                    reject_last = reject_more = False
                    h = hnew
                    break
                res.nreject += 1
                if reject_more:
                    hnew = h * _FAC_REJ
                reject_more = reject_last
                reject_last = True
                h = hnew
                last = False
                if res.nsteps >= max_steps:
                    break
                if h < 10.0 * roundoff * max(abs(t), span * roundoff):
                    break
            if not res.success:
                break

    res.t = t
    res.y = Y
    res.h = h
    return res
