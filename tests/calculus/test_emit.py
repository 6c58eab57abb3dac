"""Emission pieces by hand derivation: CSE round trip, factorization, JSON."""
from __future__ import annotations

from esmjac.calculus.emit import cse_templates, expand_templates
from esmjac.model.expr import format_float, from_wire, stable_json
from esmjac.linalg.factorization import lu_fill, markowitz_ordering


def test_cse_round_trip_and_naming():
    big = {"op": "exp", "args": [{"op": "+", "args": [{"op": "*", "args": ["a", "b", "c"]}, {"op": "/", "args": ["d", "e"]}, 1]}]}
    e1 = from_wire({"op": "+", "args": [big, "x"]})
    e2 = from_wire({"op": "*", "args": [big, big]})
    templates, out = cse_templates([e1, e2], min_nodes=5)
    assert list(templates) == ["jt1"]
    assert stable_json(out[1]) == '{"args":[{"args":[],"name":"jt1","op":"apply_expression_template"},{"args":[],"name":"jt1","op":"apply_expression_template"}],"op":"*"}'
    assert [expand_templates(o, templates) for o in out] == [e1, e2]


def test_markowitz_and_fill_by_hand():
    # arrow matrix with the dense row/col first: eliminating it first fills
    # everything; Markowitz must not start with it, and must produce no fill.
    n = 4
    P = [[i == j or i == 0 or j == 0 for j in range(n)] for i in range(n)]
    order = markowitz_ordering(P)
    assert order[0] != 0 and sorted(order) == list(range(n))
    Pp = [[P[order[i]][order[j]] for j in range(n)] for i in range(n)]
    assert lu_fill(Pp) == Pp
    assert sum(map(sum, lu_fill(P))) == n * n


def test_float_spelling_matches_the_reference_writer():
    assert format_float(1e-05) == "1.0e-5"
    assert format_float(1.8e-12) == "1.8e-12"
    assert format_float(0.1) == "0.1"
    assert format_float(2.5e21) == "2.5e21"
