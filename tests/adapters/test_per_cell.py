"""One way to say "per cell" in every adapter, and the integrators' refusal
of a document with nothing to integrate (the words ``esmjac check`` uses).

Oracles: the per-cell parameter's value is visible in the solution of a
one-reaction box mechanism (A -> B at rate k·A, solved exactly:
A(t) = A0·exp(-k t)) with a different k per cell."""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.errors import JacError
from esmjac.runtime.checks import NOTHING_TO_INTEGRATE

DECAY = {"esm": "1.0.0", "metadata": {"name": "Decay"},
         "reaction_systems": {"Box": {
             "species": {"A": {"default": 1.0}, "B": {"default": 0.0}},
             "parameters": {"k": {"default": 0.5}},
             "reactions": [{"id": "R1", "substrates": [{"species": "A", "stoichiometry": 1}],
                            "products": [{"species": "B", "stoichiometry": 1}], "rate": "k"}]}}}

NO_STATES = {"esm": "1.0.0", "metadata": {"name": "NoStates"},
             "models": {"M": {"variables": {"k": {"type": "parameter", "default": 1.0}},
                              "equations": []}}}


def test_rosenbrock_per_cell_short_name_and_alias():
    from esmjac.integrators.leaf import rosenbrock
    a = rosenbrock(DECAY, per_cell=["k"], rtol=1e-8, threads=1)
    b = rosenbrock(DECAY, options={"per_lane": ("Box.k",)}, rtol=1e-8, threads=1)
    assert a.forcing_names == b.forcing_names == ("Box.k",)
    k = np.array([0.1, 1.0, 3.0])
    u = np.concatenate([np.ones(3), np.zeros(3)])
    st = a.advance(u, 0.0, 1.0, forcing=k)
    assert not st.status.any()
    assert np.allclose(u[:3], np.exp(-k), rtol=1e-5)          # A(1) = exp(-k), per cell
    with pytest.raises(JacError) as e:
        rosenbrock(DECAY, per_cell=["k"], options={"per_lane": ["Box.x"]})
    assert e.value.code == "bad_option"


def test_short_names_in_forcing_p_y0_and_atol_dicts():
    """A(1) = A0·exp(-k) by hand, with k, A0 and atol named by short names."""
    from esmjac.adapters.scipy import ivp
    from esmjac.integrators.leaf import rosenbrock
    for forcing, p in (({"k": 2.0}, None), (None, {"k": 2.0})):        # p names a per-cell field: moved
        s = ivp(DECAY, per_cell=["k"], forcing=forcing, p=p, y0={"A": 3.0}).solve(
            (0.0, 1.0), rtol=1e-10, atol=1e-12)
        assert abs(s.y[0, -1] - 3.0 * np.exp(-2.0)) < 1e-8
    s = ivp(DECAY, p={"k": 0.25}).solve((0.0, 1.0), rtol=1e-10, atol=1e-12)     # a scalar parameter
    assert abs(s.y[0, -1] - np.exp(-0.25)) < 1e-8
    lf = rosenbrock(DECAY, p={"k": 0.25}, atol={"A": 1e-10, "B": 1e-10}, rtol=1e-8, threads=1)
    u = np.array([1.0, 0.0])
    assert not lf.advance(u, 0.0, 1.0).status.any() and abs(u[0] - np.exp(-0.25)) < 1e-6
    lf = rosenbrock(DECAY, per_cell=["k"], rtol=1e-8, threads=1)
    u = np.array([1.0, 1.0, 0.0, 0.0])
    assert not lf.advance(u, 0.0, 1.0, forcing={"k": [1.0, 2.0]}).status.any()
    assert np.allclose(u[:2], np.exp(-np.array([1.0, 2.0])), rtol=1e-5)


def test_ivp_and_layouts_take_per_cell():
    from esmjac.adapters.native import layouts
    from esmjac.adapters.scipy import ivp
    prob = ivp(DECAY, per_cell=("k",))
    assert prob.rhs.forcing_names == ("Box.k",)
    assert layouts(DECAY, per_cell=["k"]).rhs.forcing_names == ("Box.k",)
    with pytest.raises(JacError) as e:
        ivp(DECAY, per_cell="k")
    assert e.value.code == "bad_option"


def test_integrators_refuse_a_document_with_no_states():
    from esmjac.adapters.scipy import ivp
    from esmjac.integrators.leaf import rosenbrock
    for make in (lambda: ivp(NO_STATES), lambda: rosenbrock(NO_STATES)):
        with pytest.raises(JacError) as e:
            make()
        assert e.value.code == "bad_argument" and e.value.message == NOTHING_TO_INTEGRATE
    assert NOTHING_TO_INTEGRATE.split(":", 1)[1] == \
        "nothing to check: no ODE states (the document integrates no state variables)".split(":", 1)[1]


def test_cvode_refuses_a_document_with_no_states():
    pytest.importorskip("scikits.odes")
    from esmjac.adapters.sundials import cvode
    with pytest.raises(JacError) as e:
        cvode(NO_STATES)
    assert e.value.message == NOTHING_TO_INTEGRATE
