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
