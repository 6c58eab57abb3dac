"""The corpus run (benchmarks/corpus.py) on the documents a fresh machine
has: our own hand-written documents in tests/support/documents (one per
coverage class of issue #11) and the documents shipped in installed packages.

The oracle is earthsci-ast's own problem (``earthsci_ast.esm_problem``): its
state names and order, its initial state, its right-hand side, and central
differences of that right-hand side for the Jacobian.
"""
from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

from benchmarks import corpus

DOCS = pathlib.Path(__file__).resolve().parents[1] / "support" / "documents"
SAMPLE = corpus.discover(corpus.default_roots())


def test_the_sample_holds_our_documents_and_the_shipped_model():
    names = {pathlib.Path(p).name for _, p in SAMPLE}
    assert {"catalyst_species.esm", "two_models.esm", "nested_observed.esm", "tropo12.esm"} <= names


@pytest.mark.parametrize("family,path", SAMPLE, ids=[pathlib.Path(p).stem for _, p in SAMPLE])
def test_document_matches_earthsci_ast(family, path):
    r = corpus.check_document(path, family)
    assert r.outcome == "match", f"{r.outcome}: {r.detail}"


def _eco(path):
    eco = corpus.ecosystem(str(path))
    assert isinstance(eco, corpus._Eco), eco
    return eco


def test_zero_derivative_species_are_in_the_state_vector():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "catalyst_species.esm"
    prob = ivp(path)
    assert list(prob.names) == _eco(path).names == ["Chem.A", "Chem.B", "Chem.C", "Chem.D"]
    J = prob.jac_csr(0.0, prob.y0).toarray()
    # C is a catalyst, D a spectator: zero rows; A's row reads C (k1*A*C).
    assert not J[2].any() and not J[3].any()
    assert J[0, 2] == pytest.approx(-0.7 * 1.0)
    np.testing.assert_array_equal(prob.fun(0.0, prob.y0)[2:], [0.0, 0.0])


def test_several_models_build_the_whole_document_and_model_picks_one():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "two_models.esm"
    assert list(ivp(path).names) == _eco(path).names == ["Decay.x", "Logistic.y"]
    one = ivp(path, model="Decay")
    assert list(one.names) == ["Decay.x"]
    assert one.jac_csr(0.0, one.y0).toarray()[0, 0] == pytest.approx(-0.4)


def test_observed_of_a_nested_subsystem_is_inlined():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "nested_observed.esm"
    prob = ivp(path)
    eco = _eco(path)
    assert list(prob.names) == eco.names
    i, j = eco.names.index("Host.h"), eco.names.index("Host.Sub.s")
    h, s = prob.y0[i], prob.y0[j]
    J = prob.jac_csr(0.0, prob.y0).toarray()
    # dh/dt = rate h - c h^2 with rate = k s^2: d/ds = 2 k s h, by hand
    assert J[i, j] == pytest.approx(2 * 2.0 * s * h)
    assert J[i, i] == pytest.approx(2.0 * s * s - 2 * 0.3 * h)


def test_table_counts_and_headline():
    rs = [corpus.Outcome("a", "x", "match"), corpus.Outcome("a", "y", "refusal", "[empty_bands] …"),
          corpus.Outcome("b", "z", "not_evaluable", "SchemaValidationError")]
    t = corpus.table(rs)
    assert "| a | 1 | 1 | 0 | 0 | 0 | 0 |" in t
    assert "| b | 0 | 0 | 0 | 0 | 1 | 0 |" in t
    assert "1 of 2 models" in t and "(50.0%)" in t


def test_a_wrong_jacobian_is_reported_as_a_mismatch(monkeypatch):
    """The check can fail: a compiled Jacobian scaled by 1.01 is caught."""
    from esmjac.adapters import scipy as sp
    real = sp.IvpProblem.jac_csr

    def off(self, t, y):
        return real(self, t, y) * 1.01

    monkeypatch.setattr(sp.IvpProblem, "jac_csr", off)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = corpus.check_document(str(DOCS / "two_models.esm"), oracle=False)
    assert r.outcome == "mismatch" and "Jacobian entry" in r.detail
