"""The leaf never crosses a singularity silently (issue #21 item 8).

``u' = u²`` blows up at ``t = 1/u₀`` (u = u₀/(1 − u₀ t)); a linearly
implicit step stays finite across the pole and lands on the other branch
(u < 0) with a small error estimate. Oracle: the closed form. From u₀ = 1
and 0.5 the poles are at t = 1 and 2, inside [0, 3]: those lanes must be
reported failed, never "reached the end". From u₀ = −1 the solution
−1/(1 + t) has no pole: that lane succeeds and matches the closed form.
CVODE (BDF) on the same problem (test below) does not jump: it fails near
the pole with repeated error/convergence test failures.
"""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.errors import JacError

pytestmark = pytest.mark.slow


def _square(cells: int, sign: float = 1.0) -> dict:
    idx = {"op": "index", "args": ["A", "i"]}
    return {
        "esm": "1.1.0", "metadata": {"name": "Pole"},
        "index_sets": {"cell": {"kind": "interval", "size": cells}},
        "models": {"M": {
            "variables": {"A": {"type": "unknown", "shape": ["cell"], "default": 1.0},
                          "k": {"type": "parameter", "default": sign}},
            "equations": [{"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                           "rhs": {"op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}},
                                   "expr": {"op": "*", "args": ["k", idx, idx]}}}]}},
    }


@pytest.fixture(scope="module")
def leaf():
    from esmjac.adapters.native import rosenbrock
    return rosenbrock(_square(4), rtol=1e-6, threads=1)


def test_a_step_across_a_pole_fails_the_lane(leaf):
    u0 = np.array([1.0, 0.5, -1.0, -0.25])
    u = u0.copy()
    st = leaf.advance(u, 0.0, 3.0)
    assert not st.success
    assert st.status[0] != 0 and st.status[1] != 0, st.message
    # the failed lanes stop before their poles, on the right branch
    assert np.all(st.t[:2] < 1 / u0[:2]) and np.all(u[:2] > 0)
    np.testing.assert_allclose(u[:2], u0[:2] / (1 - u0[:2] * st.t[:2]), rtol=1e-3)
    # the lanes without a pole reach the end on the closed form
    assert np.all(st.status[2:] == 0) and np.all(st.t[2:] == 3.0)
    np.testing.assert_allclose(u[2:], u0[2:] / (1 - u0[2:] * 3.0), rtol=1e-4)


def test_a_w_leaf_never_lands_past_a_pole():
    """ROS34PW2 keeping its Jacobians as long as it can (where a guard hit
    on a kept Jacobian is a rejection, not a failure): the pole lanes still
    fail (here its steps shrink to underflow at the pole), on the + branch."""
    from esmjac.adapters.native import rosenbrock
    lf = rosenbrock(_square(4), method="ros34pw2", rtol=1e-6, threads=1, max_jac_age=10_000, hold=(0.5, 4.0))
    u0 = np.array([1.0, 0.5, -1.0, -0.25])
    u = u0.copy()
    st = lf.advance(u, 0.0, 3.0)
    assert st.status[0] != 0 and st.status[1] != 0, st.message
    assert np.all(u[:2] > 1e6) and np.all(st.t[:2] < 1.001 / u0[:2])
    assert np.all(st.status[2:] == 0) and np.all(st.t[2:] == 3.0)
    np.testing.assert_allclose(u[2:], u0[2:] / (1 - u0[2:] * 3.0), rtol=1e-4)


def test_a_guard_hit_fails_the_lane_only_on_a_fresh_jacobian():
    """The guards' decision, lane by lane (lanestep._apply_guard): a hit on a
    step that would be accepted fails the lane (its status the hit's code)
    when the step's Jacobian was evaluated at its own state — new in this
    attempt (newj 1; always so for Rodas3) or after a rejection at the same
    state (jage 0) — and is a rejection (error far above 1) when the
    Jacobian was kept from an earlier accepted state (newj 0, jage > 0)."""
    from esmjac.integrators import lanestep
    m = 6
    code = np.array([6, 6, 7, 8, 6, 0], np.int8)
    newj = np.array([1, 0, 0, 0, 0, 0], np.int8)
    jage = np.array([3, 0, 2, 1, 5, 4], np.int64)
    err = np.array([0.5, 0.9, 1.0, 0.2, 1.5, 0.3])
    bad, done = np.full(m, -1, np.int64), np.zeros(m, np.int8)
    idx = np.arange(m, dtype=np.int64)
    status = np.full(m, -1, np.int8)
    st_h, st_t = np.zeros(m), np.zeros(m)
    t, hs = np.linspace(1.0, 2.0, m), np.full(m, 0.25)
    nfail = lanestep._apply_guard(code, m, err, bad, done, idx, status, st_h, st_t, t, hs, newj, jage)
    assert nfail == 2 and list(done) == [1, 1, 0, 0, 0, 0]
    assert list(status[:2]) == [6, 6] and np.all(status[2:] == -1)
    assert err[2] > 1e299 and err[3] > 1e299                 # kept Jacobians: rejected
    assert list(err[[0, 1, 4, 5]]) == [0.5, 0.9, 1.5, 0.3]      # (lane 4 is rejected by its error anyway)


def test_the_growth_bound_and_non_negativity_are_user_settable():
    from esmjac.adapters.native import rosenbrock
    u0 = np.array([1.0, 0.5, -1.0, -0.25])
    lf = rosenbrock(_square(4), rtol=1e-6, threads=1, max_abs=1.5)
    u = u0.copy()
    st = lf.advance(u, 0.0, 3.0)
    # lane 0 grows past the bound before any step could jump its pole; lane 1
    # (slower) may meet its pole first: failed either way, never past 1.5
    assert st.status[0] == 7 and st.status[1] in (6, 7) and np.all(np.abs(u) <= 1.5)
    assert np.all(st.status[2:] == 0)
    lf = rosenbrock(_square(4), rtol=1e-6, threads=1, negative="fail")
    u = u0.copy()
    st = lf.advance(u, 0.0, 0.5)
    assert list(st.status[2:]) == [8, 8] and np.array_equal(u[2:], u0[2:])    # negative from the start
    assert lf.negative == "fail"
    # the deprecated spellings still work and say which to use
    with pytest.warns(DeprecationWarning, match="negative='fail'"):
        old = rosenbrock(_square(4), rtol=1e-6, threads=1, nonnegative=True)
    assert old.negative == "fail"
    with pytest.warns(DeprecationWarning, match="negative='clip'"):
        assert rosenbrock(_square(4), rtol=1e-6, threads=1, clip_negative=True).negative == "clip"
    for bad in (dict(max_abs=-1.0), dict(negative="read_as_zero"), dict(negative=False),
                dict(negative="fail", nonnegative=True), dict(nonnegative="yes")):
        with pytest.raises(JacError) as exc:
            rosenbrock(_square(4), **bad)
        assert exc.value.code == "bad_option"


def test_what_cvode_does_on_the_same_problem():
    """Documented comparison: CVODE's BDF never lands on the other branch.
    It shrinks its steps towards the pole and stops short of it, with an
    error flag (measured: TOO_MUCH_WORK, mxstep reached at t = 0.99998,
    y ≈ 3·10¹⁰); the leaf instead fails the lane at the start of the step
    that would cross (status 6), on the right branch. With SUNDIALS' own
    500 steps per output (the adapter's default, 100,000 for chemistry,
    spends ~70 s of CPU per solve on steps of 10⁻¹⁷ at the pole)."""
    pytest.importorskip("scikits.odes")
    from esmjac.adapters.sundials import cvode
    prob = cvode(_square(1), linsolver="dense", rtol=1e-6, atol=1e-12, y0=np.array([1.0]), max_steps=500)
    with pytest.raises(JacError) as info:                       # an early stop is never silent
        prob.solve(np.array([0.0, 3.0]))
    assert info.value.code == "solver_failed"
    res = prob.solve(np.array([0.0, 3.0]), allow_failure=True)
    assert int(res.flag.value if hasattr(res.flag, "value") else res.flag) < 0      # not a success
    assert res.errors.t is not None and 0.99 < float(res.errors.t) < 1.0
    assert float(np.ravel(res.errors.y)[0]) > 1e6                                   # still on the + branch
