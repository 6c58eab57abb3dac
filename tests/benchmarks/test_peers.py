"""The benchmark peers (benchmarks/peers.py) against esmjac's reference
assembly: the hand-rolled Numba kernel exactly (rtol 1e-10), SciPy's
grouped finite differences over earthsci-ast's RHS approximately."""
from __future__ import annotations

import importlib.resources
import pathlib

import numpy as np
import pytest

from benchmarks import peers
from tests.support.paths import FIXTURES

ROOT = pathlib.Path(__file__).resolve().parents[2]

TROPO12 = pathlib.Path(importlib.resources.files("esmjac.models") / "tropo12.esm")
BD_CHEM = FIXTURES / "bd_chem.esm"


@pytest.fixture(scope="module")
def tropo12_hr():
    return peers.handrolled(TROPO12)


def test_handrolled_tropo12_matches_assemble(tropo12_hr):
    hr = tropo12_hr
    assert hr.n_species == 15
    assert hr.pattern == sorted(hr.pattern) and len(set(hr.pattern)) == hr.nnz
    for seed in (0, 1):
        err = peers.check_peer_against_assemble(hr, TROPO12, L=8, seed=seed)
        assert err <= 1e-10
    # a lane count that is not the document's: the kernel is per cell
    assert peers.check_peer_against_assemble(hr, TROPO12, L=5, seed=2) <= 1e-10
    # its RHS against earthsci-ast's own
    assert peers.check_rhs_against_earthsci(hr, TROPO12, L=8, seed=0) <= 1e-12


def test_handrolled_bd_chem_matches_assemble():
    if not BD_CHEM.is_file():
        pytest.skip(f"reference fixture {BD_CHEM} not found (a clone without ../shared)")
    hr = peers.handrolled(BD_CHEM)
    assert hr.pattern == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 1)]
    assert peers.check_peer_against_assemble(hr, BD_CHEM, L=8, seed=0) <= 1e-10
    assert peers.check_rhs_against_earthsci(hr, BD_CHEM, L=4, seed=1) <= 1e-12


def test_earthsci_rhs_is_evaluate_rhs_order_and_copies():
    from esmjac.reference.check import _flat, rhs_vector
    er = peers.earthsci_rhs(TROPO12)
    pcm = peers.per_cell_model(TROPO12)
    assert er.names == [f"Chem.{s}[{l + 1}]" for s in pcm.species for l in range(8)]
    u, _ = peers.random_point(pcm, 8, 3)
    a = er(u)
    b = er(u * 1.5)
    assert a is not b and not np.allclose(a, b)          # fresh arrays, no shared buffer
    ref = rhs_vector(_flat(pcm.view), er.names, u, 0.0)
    np.testing.assert_allclose(a, ref, rtol=1e-12, atol=0)


def test_scipy_fd_over_earthsci_rhs_tropo12(tropo12_hr):
    hr = tropo12_hr
    er = peers.earthsci_rhs(TROPO12)
    fd, n_groups = peers.scipy_fd(er, er.n_total, peers.lane_sparsity(hr.pattern, hr.n_species, 8))
    assert 1 <= n_groups <= hr.n_species
    err = peers.check_peer_against_assemble(fd, TROPO12, L=8, seed=0)   # log-scaled, rtol 1e-4
    assert err < 1e-4


def test_unsupported_models_are_refused_clearly():
    doc = {
        "esm": "1.1.0", "metadata": {"name": "x"},
        "index_sets": {"cell": {"kind": "interval", "size": 3}},
        "models": {"M": {"variables": {"A": {"type": "unknown", "shape": ["cell"], "default": 1.0}},
                         "equations": [{"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                                        "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                                "ranges": {"i": {"from": "cell"}},
                                                "expr": {"op": "sin", "args": [
                                                    {"op": "index", "args": ["A", "i"]}]}}}]}},
    }
    with pytest.raises(peers.PeerError, match="op `sin`"):
        peers.handrolled(doc)


@pytest.mark.parametrize("kind", ["jax", "casadi"])
def test_optional_framework_peers_match_assemble(kind):
    pytest.importorskip(kind)
    mk = peers.jax_peer if kind == "jax" else peers.casadi_peer
    peer = mk(TROPO12, L=8)              # warm-up / compile at the checked lane count
    assert peer is not None
    assert peers.check_peer_against_assemble(peer, TROPO12, L=8, seed=0) <= 1e-10
    assert peers.check_rhs_against_earthsci(peer, TROPO12, L=8, seed=1) <= 1e-12
