"""Shared cases for the leaf's integrator tests: a heterogeneous tropo12 grid
and its tight Radau reference (SciPy's Radau on the same compiled RHS, an
independent integrator; the RHS itself is checked against earthsci-ast in
tests/runtime)."""
from __future__ import annotations

import numpy as np
from scipy.integrate import solve_ivp

NS = 15           # tropo12 species
DT = 1200.0       # a 20-minute chemistry step


def heterogeneous_grid(leaf, L, seed=0):
    """Heterogeneous lanes: states scaled by 10^U(-1, 1), half of them night."""
    rng = np.random.default_rng(seed)
    base = leaf.initial_state().reshape(NS, -1)[:, :1]
    u = np.ascontiguousarray((base * 10 ** rng.uniform(-1, 1, L)[None, :]).reshape(-1))
    fj = np.where(np.arange(L) % 2 == 0, 0.0, 1.0)
    return u, fj


def radau_reference(leaf, u, fj, L, dt=DT):
    """The state after ``dt`` from SciPy's Radau at rtol 1e-10."""
    rhs, p = leaf.rhs_program, leaf.p
    sc = rhs.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), p, t, fj, np.empty_like(y), sc)

    ref = solve_ivp(f, (0.0, dt), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(leaf.atol, L))
    assert ref.success
    return ref.y[:, -1]
