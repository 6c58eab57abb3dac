"""Whether a right-hand side reads t (esmjac.model.timefield).

Oracle: the evaluation document the right-hand side is compiled from
(``compile.evaldoc.rhs_doc``, observed variables inlined) — ``t`` among the
free names of its fields — on hand-made variants of a small model: t in a
state's equation, t reached only through a chain of observed variables, t
only in an observed variable no equation reads, and no t at all.
"""
from __future__ import annotations

import copy

import pytest

from esmjac.compile.evaldoc import rhs_doc
from esmjac.errors import JacError
from esmjac.model.expr import free_names
from esmjac.model.load import load_view
from esmjac.model.timefield import explicit_time, time_as_parameter
from tests.support.models import chem, with_observed_chain


def _reads_t(doc) -> bool:
    ed = rhs_doc(load_view(doc))
    return any("t" in free_names(ed.expanded(f.expr)) for f in ed.fields)


def _variants():
    base = with_observed_chain(chem())
    direct = copy.deepcopy(base)
    body = direct["models"]["M"]["equations"][1]["rhs"]["expr"]
    body["args"].append({"op": "sin", "args": ["t"]})
    through = copy.deepcopy(base)             # Q = k1 * t, read by D(B) directly and through R
    q = next(e for e in through["models"]["M"]["equations"] if e["lhs"] == "Q")
    q["rhs"] = {"op": "*", "args": ["k1", "t"]}
    unread = copy.deepcopy(base)              # Z = 2 t, read by no equation
    unread["models"]["M"]["variables"]["Z"] = {"type": "unknown"}
    unread["models"]["M"]["equations"].append({"lhs": "Z", "rhs": {"op": "*", "args": [2, "t"]}})
    return {"none": (base, False), "direct": (direct, True), "through observed": (through, True),
            "unread observed": (unread, False)}


@pytest.mark.parametrize("name", list(_variants()))
def test_explicit_time_matches_the_evaluation_document(name):
    doc, expected = _variants()[name]
    assert _reads_t(doc) is expected          # the oracle agrees with the construction
    assert explicit_time(load_view(doc)) is expected


def test_time_as_parameter_rewrites_t_into_a_free_parameter_name():
    doc, _ = _variants()["through observed"]
    new, name = time_as_parameter(doc, {"t_lane"})
    assert name == "t_lane1" and doc is not new
    assert not explicit_time(load_view(new))   # t is gone from the right-hand side ...
    v = load_view(new).variables[name]
    assert v.kind == "parameter"               # ... and is a parameter instead
    with pytest.raises(JacError) as e:
        time_as_parameter(object(), set())
    assert e.value.code == "bad_option"
