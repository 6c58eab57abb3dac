"""Shared cases for the leaf's integrator tests: a heterogeneous tropo12 grid
and its tight Radau reference (SciPy's Radau on the same compiled RHS, an
independent integrator; the RHS itself is checked against earthsci-ast in
tests/runtime)."""
from __future__ import annotations

import numpy as np
from scipy.integrate import solve_ivp
from scipy.sparse import identity, kron

NS = 15           # tropo12 species
DT = 1200.0       # a 20-minute chemistry step


def heterogeneous_grid(leaf, L, seed=0):
    """Heterogeneous lanes: states scaled by 10^U(-1, 1), half of them night."""
    rng = np.random.default_rng(seed)
    base = leaf.initial_state().reshape(NS, -1)[:, :1]
    u = np.ascontiguousarray((base * 10 ** rng.uniform(-1, 1, L)[None, :]).reshape(-1))
    fj = np.where(np.arange(L) % 2 == 0, 0.0, 1.0)
    return u, fj


def lane_blocks(n, L):
    """SciPy's ``jac_sparsity`` for ``n`` species on ``L`` independent lanes
    (states species-major, ``s*L + l``): a full n×n block per lane. Radau's
    finite-difference Jacobian then takes n grouped RHS calls, not n·L (the
    tropo12 grids' reference: 4.3 -> 1.4 s of CPU, the same state to 2e-14);
    it only steers Newton's iteration, the solution is the RHS's."""
    return kron(np.ones((n, n)), identity(L), format="csr")


def radau_reference(leaf, u, fj, L, dt=DT):
    """The state after ``dt`` from SciPy's Radau at rtol 1e-10."""
    rhs, p = leaf.rhs_program, leaf.p
    sc = rhs.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), p, t, fj, np.empty_like(y), sc)

    ref = solve_ivp(f, (0.0, dt), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(leaf.atol, L),
                    jac_sparsity=lane_blocks(u.size // L, L))
    assert ref.success
    return ref.y[:, -1]


def standard_form(tab):
    """Back-transform a tableau's KPP-form coefficients to the standard form
    (α, Γ incl. its diagonal, b, b̂): Γ⁻¹ = diag(1/γ) − C, α = A Γ, b = M Γ,
    b̂ = b − E Γ (Hairer–Wanner II, (7.25))."""
    s = tab.stages
    A = np.zeros((s, s))
    C = np.zeros((s, s))
    for i in range(s):
        A[i, :i] = tab.a[i]
        C[i, :i] = tab.c[i]
    G = np.linalg.inv(np.eye(s) / tab.gamma - C)
    b = np.array(tab.m) @ G
    return A @ G, G, b, b - np.array(tab.e) @ G


def replay_case(lf, fj, w, t_end):
    """Record one forward solve of ``lf`` over [0, t_end] and return
    ``(rec, y, phi)``: the recorded steps, the final state, and φ(u0) = w·y(T)
    replayed over the same steps (for finite differences of the adjoint)."""
    u = lf.initial_state()
    rec: list = []
    y = u.copy()
    lf._advance(y, 0.0, t_end, fj, None, None, rec)
    fz, cix = rec.pop()
    sens = lf._sensitivities(True)
    lanes = fj.size

    def phi(u0, p=None, fzv=None):
        a = u0.copy()
        sens.replay(rec, a, fz if fzv is None else fzv, cix, lanes, p)
        return float(w @ a)

    return rec, y, phi
