"""Calls on a published box mechanism (``box_nox.esm``, a ``reaction_systems``
document): per-cell names, the lane count taken from ``u``, and one meaning
of "no forcing" for ``defaults`` and every call.

Oracles: one-lane evaluations of each lane on its own (a lane's result
depends on its values only), and the mechanism's own rate laws by hand."""
from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

from esmjac import JacError
from esmjac.model.layout import resolve_names
from esmjac.runtime.programs import RhsProgram

BOX = json.loads(resources.files("esmjac.models").joinpath("box_nox.esm").read_text())
_built: dict = {}


def rhs(per_lane=()):
    key = tuple(per_lane)
    if key not in _built:
        _built[key] = RhsProgram.build(BOX, options={"per_lane": list(per_lane)})
    return _built[key]


def test_short_per_lane_names_resolve_to_the_qualified_parameter():
    r = rhs(("T", "jNO2"))
    assert r.forcing_names == ("BoxNOx.T", "BoxNOx.jNO2")
    assert r.kind == "cell" and r.layout.box and "BoxNOx.T" not in r.param_names


def test_resolve_names_refuses_ambiguous_and_unknown_names():
    assert resolve_names(("T", "B.k"), ["A.T", "B.k"]) == ["A.T", "B.k"]
    with pytest.raises(JacError) as e:
        resolve_names(["T"], ["A.T", "B.T"], "per_lane")
    assert e.value.code == "bad_option" and "A.T" in e.value.message and "B.T" in e.value.message
    with pytest.raises(JacError) as e:
        resolve_names(["Tx"], ["A.T"], "per_lane", "scalar parameter")
    assert e.value.code == "bad_option" and "A.T" in e.value.message
    with pytest.raises(JacError):
        resolve_names("T", ["A.T"])


def test_rhs_of_a_box_takes_its_lane_count_from_u():
    r = rhs(("T", "jNO2"))
    L, n = 40, r.n_species
    rng = np.random.default_rng(3)
    u0, p0, _ = r.defaults(L)
    u = u0 * rng.uniform(0.5, 1.5, u0.size)
    T, j = rng.uniform(240, 310, L), rng.uniform(0, 9e-3, L)
    f = np.concatenate([T, j])
    out = r.eval_into(u, p0, 0.0, f, np.empty_like(u))            # no scratch: L from u
    U = u.reshape(n, L)
    for lane in (0, 17, L - 1):                                    # each lane on its own
        one = r.eval_into(np.ascontiguousarray(U[:, lane]), p0, 0.0, np.array([T[lane], j[lane]]),
                          np.empty(n))
        assert np.array_equal(out.reshape(n, L)[:, lane], one)
    # by hand: d[HNO3]/dt = 1.1e-11 [OH][NO2] - jHNO3 [HNO3] (R10, R20)
    sp = [s.split(".")[-1] for s in r.layout.states]
    jHNO3 = p0[list(r.param_names).index("BoxNOx.jHNO3")]
    want = 1.1e-11 * U[sp.index("OH")] * U[sp.index("NO2")] - jHNO3 * U[sp.index("HNO3")]
    assert np.allclose(out.reshape(n, L)[sp.index("HNO3")], want, rtol=1e-12, atol=0)


def test_wrong_length_with_scratch_says_what_to_pass():
    r = rhs()
    u = np.ones(r.n_species * 5)
    with pytest.raises(JacError) as e:
        r.eval_into(u, r.p0, 0.0, None, np.empty_like(u), r.new_buffers(4))
    assert e.value.code == "bad_argument" and "new_buffers" in e.value.message
    with pytest.raises(JacError) as e:
        r.eval_into(np.ones(r.n_species * 5 + 1), r.p0, 0.0, None, np.empty(r.n_species * 5 + 1))
    assert e.value.code == "bad_argument"


def test_no_forcing_means_the_same_to_defaults_eval_into_and_bound_calls():
    r = rhs()                                 # no per-lane parameters: no forcing fields
    assert r.forcing_names == ()
    L = 6
    u0, p0, f0 = r.defaults(L)
    assert f0 is None
    ref = r.eval_into(u0, p0, 0.0, None, np.empty_like(u0))
    for f in (f0, np.empty(0)):
        assert np.array_equal(r.eval_into(u0, p0, 0.0, f, np.empty_like(u0)), ref)
        b = r.bind(L)
        assert np.array_equal(b(u0, p0, 0.0, f, np.empty_like(u0)), ref)
    with pytest.raises(JacError) as e:
        r.eval_into(u0, p0, 0.0, np.ones(3), np.empty_like(u0))
    assert e.value.code == "bad_argument"
