"""docs/design.rst §3 catch-up items, each a regression test that fails on the old
behaviour (zero bands, declared types, un-pruned inlining, silent success)."""
from __future__ import annotations


import pytest

from tests.support.models import chem, with_observed_chain
from esmjac.calculus.bandset import BandSet
from esmjac.errors import JacError
from esmjac.model.expr import free_names
from esmjac.reference.check import fd_check


def test_faq_and_aggregate_spellings_give_the_same_nonempty_bands():
    a = BandSet.build(chem("faq"))
    b = BandSet.build(chem("aggregate"))
    assert len(a.entries) == 4
    assert a.entries_json() == b.entries_json()
    assert {(e.row, e.col) for e in a.entries} == {("A", "A"), ("A", "B"), ("B", "A"), ("B", "B")}
    assert a.structure == "block_diagonal"


def test_states_come_from_the_equations_not_a_declared_type():
    d = chem()
    # esm 1.0.0 declares only `unknown`; a state is an unknown under D(.)
    assert all(v["type"] in ("unknown", "parameter") for v in d["models"]["M"]["variables"].values())
    bs = BandSet.build(d)
    assert bs.view.states == ["A", "B"]
    assert bs.view.parameters == ["k1", "k2"]


def test_pruning_keeps_target_independent_observed_as_names():
    bs = BandSet.build(with_observed_chain(chem()))
    bb = [e for e in bs.entries if e.row == "B" and e.col == "A"]
    assert len(bb) == 1
    names = free_names(bb[0].band.coef)
    assert "Q" in names            # Q = 2 k1 cannot move with a state: kept as a name
    assert "R" not in names        # R = Q A[i] depends on A: inlined
    assert fd_check(with_observed_chain(chem()), points=1).ok


def test_pruning_is_seeded_by_wrt():
    bs = BandSet.build(with_observed_chain(chem()), wrt="parameters")
    # Q depends on k1: for wrt=parameters it must be inlined, so d/dk1 sees it
    cols = {(e.row, e.col) for e in bs.entries}
    assert ("B", "k1") in cols
    assert all("Q" not in free_names(e.band.coef) for e in bs.entries)


def test_empty_bands_is_an_error_not_a_silent_success():
    d = chem()
    for eq in d["models"]["M"]["equations"]:
        eq["rhs"]["expr"] = {"op": "*", "args": ["k1", 2]}
    with pytest.raises(JacError) as ei:
        BandSet.build(d)
    assert ei.value.code == "empty_bands"
    assert BandSet.build(d, options={"allow_empty": True}).entries == ()


def test_target_scan_is_by_intersection():
    # a state that no equation reads produces no column, even with many states
    d = chem()
    m = d["models"]["M"]
    for k in range(200):
        m["variables"][f"S{k}"] = {"type": "unknown", "shape": ["cell"], "default": 0.0}
        m["equations"].append({"lhs": {"op": "D", "args": [f"S{k}"], "wrt": "t"},
                               "rhs": {"op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}},
                                       "expr": {"op": "*", "args": [-1, {"op": "index", "args": [f"S{k}", "i"]}]}}})
    bs = BandSet.build(d)
    assert len(bs.entries) == 4 + 200
    assert all(e.row == e.col for e in bs.entries if e.row.startswith("S"))


def test_unknown_option_is_refused():
    with pytest.raises(JacError) as ei:
        BandSet.build(chem(), options={"cse_min_node": 3})
    assert ei.value.code == "bad_option"
