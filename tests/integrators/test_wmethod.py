"""The Rosenbrock–W method (ROS34PW2) and per-lane Jacobian/LU reuse.

Oracles: the W-method order conditions (derived by hand from the stage
equations with an arbitrary matrix ``A`` in place of ∂f/∂y: every rooted
tree with ``A`` nodes must have weight 0, every tree of ``f`` nodes its
Runge–Kutta weight 1/γ(t)); fixed-step convergence on a stiff problem with a
known solution, with the exact Jacobian, a frozen one and a perturbed one
(NumPy dense steps from the tableau's coefficients); and, for the leaf, a
tight SciPy Radau solve and bitwise equality of a lane alone and in a batch.
"""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.integrators.tableaux import METHODS


def _standard(tab):
    """Standard form (α, Γ incl. its diagonal, b, b̂) back from the transformed
    coefficients: Γ⁻¹ = diag(1/γ) − C, α = A Γ, b = M Γ, b̂ = b − E Γ."""
    s = tab.stages
    A = np.zeros((s, s))
    C = np.zeros((s, s))
    for i in range(s):
        A[i, :i] = tab.a[i]
        C[i, :i] = tab.c[i]
    G = np.linalg.inv(np.eye(s) / tab.gamma - C)
    b = np.array(tab.m) @ G
    return A @ G, G, b, b - np.array(tab.e) @ G


def _w_conditions(alpha, G, w, order):
    """Residuals of the W-method order conditions up to ``order`` (≤ 3) for
    weights ``w``. Stage i: k_i = h f(y + Σ α_ij k_j) + h A Σ_{j≤i} γ_ij k_j;
    a tree's stage weight: Φ_i(f-node[t1..tm]) = Π_k Σ_j α_ij Φ_j(t_k),
    Φ_i(A-node[t]) = Σ_{j≤i} γ_ij Φ_j(t)."""
    one = np.ones(len(w))
    ai, gi = alpha @ one, G @ one
    res = {"•": w @ one - 1.0}
    if order >= 2:
        res["[•]f"] = w @ ai - 0.5
        res["[•]A"] = w @ gi
    if order >= 3:
        res["[•,•]f"] = w @ ai**2 - 1.0 / 3.0
        res["[[•]f]f"] = w @ alpha @ ai - 1.0 / 6.0
        res["[[•]A]f"] = w @ alpha @ gi
        res["[[•]f]A"] = w @ G @ ai
        res["[[•]A]A"] = w @ G @ gi
    return res


def test_ros34pw2_meets_the_w_order_conditions():
    tab = METHODS["ros34pw2"]
    assert tab.wmethod and tab.stages == 4 and tab.elo == 3.0
    alpha, G, b, bh = _standard(tab)
    for w, order in ((b, 3), (bh, 2)):
        res = _w_conditions(alpha, G, w, order)
        assert max(abs(v) for v in res.values()) < 1e-14, res
    # b̂ is not of order 3 (else the estimate would vanish)
    assert abs(_w_conditions(alpha, G, bh, 3)["[•,•]f"]) > 1e-3
    # stiffly accurate: b is the last row of α + Γ (so y⁺ = Y_4 + u_4), and
    # the stability function R(z) = 1 + z bᵀ(I − zβ)⁻¹𝟙, β = α + Γ, vanishes
    # at infinity (L-stable): R(∞) = 1 − bᵀβ⁻¹𝟙 = 0
    np.testing.assert_allclose(b, alpha[-1] + G[-1], atol=1e-15)
    assert abs(1.0 - b @ np.linalg.solve(alpha + G, np.ones(4))) < 1e-14


def test_rodas3_is_not_a_w_method():
    """The check can fail: Rodas3 (a Rosenbrock method for the exact
    Jacobian) violates the W-conditions."""
    tab = METHODS["rodas3"]
    assert not tab.wmethod
    alpha, G, b, _ = _standard(tab)
    res = _w_conditions(alpha, G, b, 3)
    assert max(abs(v) for v in res.values()) > 0.1


# ---------------------------------------------------------------------------
# Fixed-step convergence with exact, frozen and perturbed Jacobians
# ---------------------------------------------------------------------------

LAM = 10.0


def _f(y):
    # y2 = e^{-t}, y1 = e^{-2t} from y(0) = (1, 1); y1 relaxes at rate LAM
    return np.array([-LAM * (y[0] - y[1] ** 2) - 2.0 * y[1] ** 2, -y[1]])


def _jac(y):
    return np.array([[-LAM, 2.0 * LAM * y[1] - 4.0 * y[1]], [0.0, -1.0]])


def _step(tab, y, h, A):
    """One step of the transformed form with matrix A: (I/(hγ) − A) u_i =
    f(y + Σ a_ij u_j) + Σ (c_ij/h) u_j, y⁺ = y + Σ m_i u_i."""
    Wm = np.eye(2) / (h * tab.gamma) - A
    K = []
    for i in range(tab.stages):
        Y = y + sum(tab.a[i][j] * K[j] for j in range(i))
        K.append(np.linalg.solve(Wm, _f(Y) + sum(tab.c[i][j] / h * K[j] for j in range(i))))
    return y + sum(tab.m[i] * K[i] for i in range(tab.stages))


def _orders(name, mode):
    tab = METHODS[name]
    exact = np.array([np.exp(-2.0), np.exp(-1.0)])
    errs = []
    for N in (16, 32, 64, 128):
        y = np.array([1.0, 1.0])
        A0 = _jac(y)
        for _ in range(N):
            A = {"exact": _jac(y), "frozen": A0,
                 "perturbed": _jac(y) + np.array([[3.0, 1.0], [-2.0, 2.0]])}[mode]
            y = _step(tab, y, 1.0 / N, A)
        errs.append(np.abs(y - exact).max())
    e = np.array(errs)
    return np.log2(e[:-1] / e[1:])


@pytest.mark.parametrize("mode", ["exact", "frozen", "perturbed"])
def test_ros34pw2_is_third_order_with_any_jacobian(mode):
    p = _orders("ros34pw2", mode)
    assert p[-1] > 2.75 and p[-2] > 2.6, p


def test_rodas3_loses_its_order_with_a_frozen_jacobian():
    p = _orders("rodas3", "exact")
    assert p[-1] > 2.75, p
    assert _orders("rodas3", "frozen")[-1] < 1.2
