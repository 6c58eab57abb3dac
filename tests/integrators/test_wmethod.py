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
from tests.support.leafgrid import replay_case, standard_form


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
    alpha, G, b, bh = standard_form(tab)
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
    alpha, G, b, _ = standard_form(tab)
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


# ---------------------------------------------------------------------------
# The leaf with method="ros34pw2": per-lane Jacobian and LU reuse
# ---------------------------------------------------------------------------

import inspect  # noqa: E402
import json  # noqa: E402

from esmjac.adapters.native import rosenbrock  # noqa: E402
from esmjac.errors import JacError  # noqa: E402
from esmjac.integrators import lanestep  # noqa: E402
from esmjac.models.mechanism import lift  # noqa: E402
from tests.support.leafgrid import DT, NS  # noqa: E402
from tests.support.leafgrid import heterogeneous_grid as _grid  # noqa: E402
from tests.support.leafgrid import radau_reference as _radau  # noqa: E402
from tests.support.programs import TROPO12  # noqa: E402


@pytest.fixture(scope="module")
def doc8():
    return lift(json.loads(TROPO12.read_text()), 8)


@pytest.mark.parametrize("kw", [{}, {"max_jac_age": 10_000, "hold": (0.5, 4.0)}],
                         ids=["default-reuse", "stale-jacobians"])
def test_w_leaf_matches_tight_radau(doc8, kw):
    """Convergence to the known (tight Radau) solution with reuse on, also
    with Jacobians kept as long as the lanes accept steps (stale J)."""
    L = 4
    lf = rosenbrock(doc8, method="ros34pw2", rtol=1e-6, threads=1, **kw)
    u, fj = _grid(lf, L, 1)
    yr = _radau(lf, u, fj, L)
    big = np.abs(yr) > 1e3 * np.repeat(lf.atol, L)
    v = u.copy()
    st = lf.advance(v, 0.0, DT, forcing=fj)
    assert st.success, st.message
    assert np.all(st.njev < st.naccept) and np.all(st.ndec < st.nsteps)
    rel = np.abs(v - yr)[big] / np.abs(yr[big])
    assert rel.max() < 5e-4, rel.max()
    # the error shrinks with the tolerances (the method converges with reuse)
    errs = []
    for rtol in (1e-4, 1e-7):
        w = u.copy()
        rosenbrock(doc8, method="ros34pw2", rtol=rtol, atol=lf.atol * (rtol / 1e-4), threads=1,
                   **kw).advance(w, 0.0, DT, forcing=fj)
        errs.append((np.abs(w - yr)[big] / np.abs(yr[big])).max())
    assert errs[1] < 0.05 * errs[0], errs


def test_w_leaf_counts_its_jacobians_and_lus(doc8, monkeypatch):
    """stats.njev / stats.ndec equal the lanes the Jacobian kernel and the
    factorisation actually ran on (counted by wrapping them)."""
    calls = {"jac": 0, "lu": 0}
    real_sub = lanestep._sub_factor

    def sub(*a):
        calls["lu"] += int(a[9])                  # k: the lanes factored
        return real_sub(*a)

    monkeypatch.setattr(lanestep, "_sub_factor", sub)
    lf = rosenbrock(doc8, method="ros34pw2", rtol=1e-4, threads=1)
    L = 40
    u, fj = _grid(lf, L, 4)
    lf.advance(u.copy(), 0.0, 1.0, forcing=fj)    # build the steppers
    for stp in lf._scratch_for(L, 1)[1]:
        real_jac = stp.jac

        def jac(y, fz, cix, m, out, _real=real_jac):
            calls["jac"] += m
            return _real(y, fz, cix, m, out)
        stp.jac = jac
    calls.update(jac=0, lu=0)
    st = lf.advance(u.copy(), 0.0, DT, forcing=fj)
    assert st.success
    assert int(st.njev.sum()) == calls["jac"] and int(st.ndec.sum()) == calls["lu"]
    assert np.all(st.njev >= 1) and np.all(st.njev <= st.ndec) and np.all(st.ndec <= st.nsteps)
    tot = st.totals()
    assert tot["njev"] + tot["ndec"] < 0.8 * tot["naccept"], tot      # far fewer than 2 per step
    assert len(set(st.ndec.tolist())) > 3         # lanes decided for themselves
    # without reuse (and for Rodas3): one of each per attempt
    for other in (rosenbrock(doc8, method="ros34pw2", reuse=False, rtol=1e-4, threads=1),
                  rosenbrock(doc8, rtol=1e-4, threads=1)):
        s2 = other.advance(u.copy(), 0.0, DT, forcing=fj)
        assert np.array_equal(s2.njev, s2.nsteps) and np.array_equal(s2.ndec, s2.nsteps)


def test_w_leaf_lane_alone_equals_lane_in_batch_bitwise(doc8):
    lf = rosenbrock(doc8, method="ros34pw2", threads=1)
    L = 300                                     # two LU chunks, ragged
    u, fj = _grid(lf, L, 2)
    v = u.copy()
    st = lf.advance(v, 0.0, DT, forcing=fj)
    assert st.success
    njev, ndec, steps = st.njev.copy(), st.ndec.copy(), st.nsteps.copy()
    assert len(set(ndec.tolist())) > 3 and np.any(ndec < steps)
    cols = lambda a, k: a.reshape(NS, k)       # noqa: E731
    for l in (0, 1, 137, 299):
        w = cols(u, L)[:, l].copy()
        s1 = lf.advance(w, 0.0, DT, forcing=fj[l:l + 1])
        assert np.array_equal(w, cols(v, L)[:, l])
        assert (s1.nsteps[0], s1.njev[0], s1.ndec[0]) == (steps[l], njev[l], ndec[l])
    perm = np.arange(L)[::-1].copy()
    w = np.ascontiguousarray(cols(u, L)[:, perm]).reshape(-1)
    for other in (rosenbrock(doc8, method="ros34pw2", threads=2),
                  rosenbrock(doc8, method="ros34pw2", threads=1, compact=False),
                  rosenbrock(doc8, method="ros34pw2", threads=1, tile=None)):
        w2 = w.copy()
        s2 = other.advance(w2, 0.0, DT, forcing=fj[perm])
        assert np.array_equal(cols(w2, L), cols(v, L)[:, perm])
        assert np.array_equal(s2.ndec, ndec[perm]) and np.array_equal(s2.njev, njev[perm])
        other.close()


class _GuardLog:
    """Wraps ``lanestep._finish`` (looked up as a global by the stepper on every
    attempt): every guard hit on an otherwise accepted step, as ``(lane,
    code, jacobian kept, failed)`` — kept: evaluated at an earlier accepted
    state (``newj`` 0, ``jage`` > 0), the W-method's reuse."""

    def __init__(self, monkeypatch):
        real = lanestep._finish
        names = list(inspect.signature(real.py_func).parameters)
        self.hits: list = []

        def fin(*a):
            b = dict(zip(names, a))
            m = b["m"]
            kept = (b["newj"][:m] == 0) & (b.get("jage", np.zeros(m, np.int64))[:m] > 0)
            live = b["done"][:m] == 0
            r = real(*a)
            for l in np.flatnonzero(live & (b["code"][:m] != 0) & (b["bad"][:m] < 0)):
                g = int(b["idx"][l])
                failed = bool(b["done"][l] != 0 and b["st_status"][g] == b["code"][l])
                if failed or b["err"][l] > 1e299:         # failed, or refused as an error far above 1
                    self.hits.append((g, int(b["code"][l]), bool(kept[l]), failed))
            return r

        monkeypatch.setattr(lanestep, "_finish", fin)


def _overshoot_lanes(lf):
    """Lanes on which a step on a kept Jacobian overshoots a species across
    zero within its error test (found on a tropo12 grid with states spread
    by 10^U(-2, 2) more: before the fix these failed as pole crossings)."""
    L = 2000
    u, fj = _grid(lf, L, 0)
    u = (u.reshape(NS, L) * 10 ** np.random.default_rng(100).uniform(-2, 2, (NS, L))).reshape(-1)
    lanes = [302, 1830, 0]
    return np.ascontiguousarray(u.reshape(NS, L)[:, lanes]).reshape(-1), fj[lanes].copy()


def test_a_guard_hit_on_a_kept_jacobian_is_a_rejection_not_a_failure(doc8, monkeypatch):
    """A W step on a kept Jacobian that turns a growing species negative (a
    guard hit, status 6 before) is rejected and retried on a fresh Jacobian:
    the lane completes, on the tight Radau solution. Rodas3 on the same lanes
    (its Jacobian is always fresh) completes too."""
    lf = rosenbrock(doc8, method="ros34pw2", rtol=1e-3, threads=1)
    u, fj = _overshoot_lanes(lf)
    L = fj.size
    yr = _radau(lf, u, fj, L)
    log = _GuardLog(monkeypatch)
    v = u.copy()
    st = lf.advance(v, 0.0, DT, forcing=fj)
    assert st.success, st.message
    # the guard fired on a kept Jacobian (the case), and no lane failed
    assert {g for g, code, kept, failed in log.hits if kept and not failed} >= {0, 1}, log.hits
    assert not any(failed for *_, failed in log.hits)
    big = np.abs(yr) > 1e3 * np.repeat(lf.atol, L)
    rel = np.abs(v - yr)[big] / np.abs(yr[big])
    assert rel.max() < 2e-2, rel.max()
    w = u.copy()
    assert rosenbrock(doc8, rtol=1e-3, threads=1).advance(w, 0.0, DT, forcing=fj).success
    # a lane alone is the lane in the batch, bitwise (the rejection is the lane's own)
    for l in range(L):
        a = np.ascontiguousarray(u.reshape(NS, L)[:, l])
        s1 = lf.advance(a, 0.0, DT, forcing=fj[l:l + 1])
        assert np.array_equal(a, v.reshape(NS, L)[:, l]) and s1.nsteps[0] == st.nsteps[l]


def test_w_leaf_option_refusals(doc8):
    for kw in ({"reuse": True},                                   # rodas3 is not a W-method
               {"method": "ros34pw2", "reuse": "yes"},
               {"method": "ros34pw2", "max_jac_age": 0},
               {"method": "ros34pw2", "hold": (1.2, 2.0)},
               {"method": "ros34pw2", "hold": (0.5,)},
               {"method": "ros34pw2", "hold": (0.5, float("inf"))}):
        with pytest.raises(JacError) as e:
            rosenbrock(doc8, **kw)
        assert e.value.code == "bad_option", kw


# ---------------------------------------------------------------------------
# Sensitivities of the W-method with reused Jacobians: finite differences of
# the frozen-step forward map (the replay of the recorded steps)
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wsens():
    lf = rosenbrock(lift(json.loads(TROPO12.read_text()), 2), method="ros34pw2", rtol=1e-4, threads=1)
    u = lf.initial_state()
    fj = np.array([0.3, 1.0])
    w = np.random.default_rng(11).uniform(0.5, 1.5, u.size) / np.abs(u).clip(1.0)
    rec, y, phi = replay_case(lf, fj, w, 300.0)
    assert sum(int((~r[3]).sum()) for r in rec) > 20        # many steps on an older Jacobian
    return lf, u, fj, w, phi, y


def test_w_replay_is_the_forward_solve(wsens):
    lf, u, fj, w, phi, y = wsens
    v = u.copy()
    lf.advance(v, 0.0, 300.0, forcing=fj)
    assert np.array_equal(v, y) and phi(u) == float(w @ y)


def test_w_adjoint_and_tangent_match_finite_differences(wsens):
    lf, u, fj, w, phi, y = wsens
    yf, g, gp, st = lf.gradient(u, 0.0, 300.0, w, forcing=fj)
    assert st.success and np.array_equal(yf, y)
    rng = np.random.default_rng(12)
    eps = 1e-6
    for _ in range(3):
        d = rng.standard_normal(u.size) * np.abs(u)
        fd = (phi(u + eps * d) - phi(u - eps * d)) / (2 * eps)
        assert abs(g @ d - fd) <= 1e-6 * abs(fd), (g @ d, fd)
    for name in ("T", "j_NO2"):
        k = lf.param_names.index(name)
        p0 = lf.p[k]
        pp, pm = lf.p.copy(), lf.p.copy()
        pp[k] += 1e-5 * p0
        pm[k] -= 1e-5 * p0
        fd = (phi(u, pp) - phi(u, pm)) / (2e-5 * p0)
        assert abs(gp[name] - fd) <= 1e-6 * abs(fd), (name, gp[name], fd)
    for lane in range(2):
        fp, fm = fj.copy(), fj.copy()
        fp[lane] += 1e-5 * fj[lane]
        fm[lane] -= 1e-5 * fj[lane]
        fd = (phi(u, fzv=fp) - phi(u, fzv=fm)) / (2e-5 * fj[lane])
        assert abs(gp["fj"][lane] - fd) <= 1e-6 * abs(fd), (lane, gp["fj"][lane], fd)
    d = rng.standard_normal(u.size) * np.abs(u)
    _, dy, _ = lf.tangent(u, 0.0, 300.0, du0=d, dp={"T": 1.0}, forcing=fj)
    assert abs(w @ dy - (g @ d + gp["T"])) <= 1e-10 * abs(w @ dy)       # exact transposes
    _, dy2, _ = lf.tangent(u, 0.0, 300.0, du0=d, forcing=fj)
    fd = (phi(u + eps * d) - phi(u - eps * d)) / (2 * eps)
    assert abs(w @ dy2 - fd) <= 1e-6 * abs(fd)
