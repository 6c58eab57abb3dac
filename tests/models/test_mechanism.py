"""Chemistry mechanisms: the bundled tropo12 model and the synthetic
mass-action generator of benchmarks/mechanism.py, against finite differences
and against a coupling pattern computed from the reaction list alone."""
from __future__ import annotations

import json
import importlib.resources
import pathlib

import pytest

from esmjac.calculus.bandset import BandSet
from esmjac.models import mechanism
from esmjac.models.mechanism import lift, synthetic_mechanism
from esmjac.reference.check import fd_check

ROOT = pathlib.Path(__file__).resolve().parents[2]

TROPO12 = ROOT / "examples" / "tropo12.esm"
TROPO12_PKG = pathlib.Path(importlib.resources.files("esmjac.models") / "tropo12.esm")


def _unknowns(doc) -> list:
    (model,) = doc["models"].values()
    return [n for n, v in model["variables"].items() if v["type"] == "unknown"]


def expected_couplings(reactions, species) -> set:
    """(row, column) pairs of a mass-action Jacobian, from reactions only:
    a species with a non-zero net coefficient in a reaction depends on every
    reactant (that is an unknown) of that reaction."""
    species = set(species)
    pairs = set()
    for rx in reactions:
        net = {}
        for r in rx["reactants"]:
            net[r] = net.get(r, 0) - 1
        for p, c in rx["products"].items():
            net[p] = net.get(p, 0) + c
        cols = {r for r in rx["reactants"] if r in species}
        for s, c in net.items():
            if c and s in species:
                pairs.update((s, col) for col in cols)
    return pairs


def _sum_depth(e) -> int:
    """Longest chain of directly nested ``+`` nodes."""
    if not isinstance(e, dict):
        return 0
    kids = [a for a in e.get("args", []) if isinstance(a, dict)]
    if "expr" in e:
        kids.append(e["expr"])
    inner = max((_sum_depth(k) for k in kids), default=0)
    if e.get("op") == "+":
        plus_kids = [k for k in kids if k.get("op") == "+"]
        return 1 + max((_sum_depth(k) for k in plus_kids), default=0) if plus_kids else max(1, inner)
    return inner


def test_generator_is_deterministic():
    a = synthetic_mechanism(30, 80, 4, seed=3)
    b = synthetic_mechanism(30, 80, 4, seed=3)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = synthetic_mechanism(30, 80, 4, seed=4)
    assert json.dumps(a, sort_keys=True) != json.dumps(c, sort_keys=True)
    doc, rxs = synthetic_mechanism(30, 80, 4, seed=3, return_reactions=True)
    assert json.dumps(doc, sort_keys=True) == json.dumps(a, sort_keys=True)
    assert len(rxs) == 80 and len(_unknowns(doc)) == 30


def test_large_mechanism_is_flat():
    """Sums are n-ary (generation speed is a benchmark matter, not a test's)."""
    doc = synthetic_mechanism(300, 800, 8)
    for eq in doc["models"]["Chem"]["equations"]:
        body = eq["rhs"]["expr"]
        assert _sum_depth(body) <= 1, "sums must be n-ary, not nested binary chains"


def test_lift_resizes_cells():
    doc = json.loads(TROPO12.read_text())
    big = lift(doc, 32)
    assert big["index_sets"]["cell"]["size"] == 32
    assert doc["index_sets"]["cell"]["size"] == 8            # the input is not modified
    assert big["models"] == doc["models"]


def test_lift_refuses_what_it_would_return_unchanged():
    from esmjac.errors import JacError
    box = json.loads((importlib.resources.files("esmjac.models") / "box_nox.esm").read_text())
    with pytest.raises(JacError) as e:                 # reaction_systems: lift rewrites models only
        lift(box, 10)
    assert e.value.code == "bad_argument" and "per_lane" in e.value.message
    with pytest.raises(JacError) as e:
        lift({"esm": "1.0.0", "metadata": {"name": "Empty"}}, 10)
    assert e.value.code == "bad_argument"
    with pytest.raises(JacError):
        lift(json.loads(TROPO12.read_text()), 0)
    import numpy as np
    assert lift(json.loads(TROPO12.read_text()), np.int64(3))["index_sets"]["cell"]["size"] == 3


def test_tropo12_files_identical_and_shape():
    assert TROPO12.read_bytes() == TROPO12_PKG.read_bytes()
    doc = json.loads(TROPO12.read_text())
    assert doc["esm"] == "1.1.0"
    assert 12 <= len(_unknowns(doc)) <= 15
    assert all(eq["rhs"]["op"] == "faq" for eq in doc["models"]["Chem"]["equations"])


@pytest.fixture(scope="module")
def tropo12():
    return BandSet.build(TROPO12)


def test_tropo12_builds(tropo12):
    assert tropo12.structure == "block_diagonal"
    rows = {e.row for e in tropo12.entries}
    assert rows == set(_unknowns(json.loads(TROPO12.read_text())))


@pytest.mark.parametrize("lo,hi", [(0.2, 1.0), (1e6, 1e12)])
def test_tropo12_matches_finite_differences(tropo12, lo, hi):
    rep = fd_check(tropo12, points=1, lo=lo, hi=hi)
    assert not rep.uncovered, rep.uncovered[:5]
    assert rep.ok, rep.summary()


def test_synthetic_matches_finite_differences():
    doc = synthetic_mechanism(10, 20, 3, seed=1)
    rep = fd_check(doc, points=1, lo=1e8, hi=1e12)
    assert not rep.uncovered, rep.uncovered[:5]
    assert rep.ok, rep.summary()


@pytest.mark.parametrize("seed", [0, 5])
def test_band_count_equals_couplings(seed):
    doc, rxs = synthetic_mechanism(12, 30, 2, seed=seed, return_reactions=True)
    want = expected_couplings(rxs, _unknowns(doc))
    bs = BandSet.build(doc)
    assert len(bs.entries) == len(want)
    assert {(e.row, e.col) for e in bs.entries} == want


def test_helper_couplings_agree_with_test_oracle():
    doc, rxs = synthetic_mechanism(20, 40, 2, seed=2, return_reactions=True)
    assert mechanism.couplings(rxs, _unknowns(doc)) == expected_couplings(rxs, _unknowns(doc))
