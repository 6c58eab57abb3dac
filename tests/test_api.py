"""The public surface: loading forms, model choice, assemble() names and
values (against earthsci_ast.evaluate_rhs), wrt=parameters/time, depth."""
from __future__ import annotations

import copy
import json
import sys
import warnings

import numpy as np
import pytest

import earthsci_ast as ea
from tests.support.models import chem
from esmjac.calculus.bandset import BandSet
from esmjac.errors import JacError
from esmjac.reference.oracle import assemble


def _rhs(doc, state, t, params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ea.evaluate_rhs(ea.load_document(doc), state, t, params)


def test_all_input_forms_agree(tmp_path):
    d = chem()
    p = tmp_path / "m.esm"
    p.write_text(json.dumps(d))
    f = ea.load_document(d)
    forms = [d, json.dumps(d), str(p), p, f, ea.flatten(f)]
    outs = [BandSet.build(x) for x in forms]
    # the flattened view is scoped ("M.A"); the others use the model's names
    assert len({o.entries_json() for o in outs[:5]}) == 1
    assert outs[5].entries_json() == outs[0].entries_json().replace('"A"', '"M.A"').replace(
        '"B"', '"M.B"').replace('"k1"', '"M.k1"').replace('"k2"', '"M.k2"')


def test_model_selection():
    d = chem()
    d["models"]["Other"] = copy.deepcopy(d["models"]["M"])
    # Without model=, the whole document (both models, flattened and scoped),
    # as earthsci_ast's problem builds it.
    whole = BandSet.build(d)
    assert len(whole.entries) == 8
    assert {e.row for e in whole.entries} == {"M.A", "M.B", "Other.A", "Other.B"}
    assert len(BandSet.build(d, model="Other").entries) == 4
    with pytest.raises(JacError) as ei:
        BandSet.build(d, model="Nope")
    assert ei.value.code == "model_not_found"


def test_load_errors_are_typed(tmp_path):
    with pytest.raises(JacError) as ei:
        BandSet.build(tmp_path / "missing.esm")
    assert ei.value.code == "load_error"
    with pytest.raises(JacError) as ei:
        BandSet.build({"esm": "1.1.0", "models": {"M": {"variables": 3}}})
    assert ei.value.code == "load_error"


def test_assemble_names_and_values_match_evaluate_rhs():
    d = chem()
    u = {"M.A[1]": 0.7, "M.A[2]": 0.2, "M.B[3]": 0.9}
    a = assemble(d, u=u, p={"M.k2": 1.5}, t=0.0)
    keys = list(_rhs(d, {}, 0.0, {}).keys())
    assert a.rows == keys and a.cols == keys
    # hand derivation: dA/dB[i] = 2 k2 B[i]; dB/dA[i] = k1
    J = a.matrix.toarray()
    assert J[keys.index("M.A[3]"), keys.index("M.B[3]")] == pytest.approx(2 * 1.5 * 0.9)
    assert J[keys.index("M.B[1]"), keys.index("M.A[1]")] == pytest.approx(0.3)
    assert J[keys.index("M.A[1]"), keys.index("M.B[2]")] == 0.0
    assert a.matrix.nnz == 12
    # bare names are accepted too, unknown names are refused
    b = assemble(d, u={"A[1]": 0.7, "A[2]": 0.2, "B[3]": 0.9}, p={"k2": 1.5})
    assert (b.matrix != a.matrix).nnz == 0
    with pytest.raises(JacError) as ei:
        assemble(d, u={"M.C[1]": 1.0})
    assert ei.value.code == "bad_argument"


def test_structural_zeros_are_kept():
    a = assemble(chem(), u={"M.B": 0.0})
    # dA/dB = 2 k2 B and dB/dB = -4 k2 B vanish at B = 0 but stay stored
    assert a.matrix.nnz == 12 and (a.matrix.data == 0).sum() == 6


def test_wrt_parameters_against_differences():
    d = chem()
    base = {"M.k1": 0.3, "M.k2": 2.0}
    a = assemble(d, wrt="parameters", u={"M.A": 0.8, "M.B": 0.4})
    assert a.cols == ["M.k1", "M.k2"]
    state = {"M.A": 0.8, "M.B": 0.4}
    rows = a.rows
    for j, k in enumerate(a.cols):
        h = 1e-6
        up = dict(base, **{k: base[k] + h})
        dn = dict(base, **{k: base[k] - h})
        fp, fm = _rhs(d, state, 0.0, up), _rhs(d, state, 0.0, dn)
        fd = np.array([(fp[r] - fm[r]) / (2 * h) for r in rows])
        np.testing.assert_allclose(a.matrix.toarray()[:, j], fd, rtol=1e-6, atol=1e-9)


def test_wrt_time_against_differences():
    d = chem()
    body = d["models"]["M"]["equations"][0]["rhs"]["expr"]
    body["args"].append({"op": "*", "args": [{"op": "sin", "args": [{"op": "*", "args": [3, "t"]}]},
                                             {"op": "index", "args": ["A", "i"]}]})
    t = 0.4
    a = assemble(d, wrt="time", t=t)
    assert a.cols == ["t"]
    fp, fm = _rhs(d, {}, t + 1e-6, {}), _rhs(d, {}, t - 1e-6, {})
    fd = np.array([(fp[r] - fm[r]) / 2e-6 for r in a.rows])
    np.testing.assert_allclose(a.matrix.toarray()[:, 0], fd, rtol=1e-6, atol=1e-9)


def test_deep_expression_trees_do_not_hit_the_recursion_limit():
    """A 400-level left-nested binary sum under a recursion limit of 600:
    the check a 700-level sum makes under Python's default 1000 (a pass that
    recursed on the caller's stack at ~1.3 frames per level or more fails
    either way), at a quarter of the CPU: earthsci-ast's loader is quadratic
    in depth (700 levels: ~10 s)."""
    d = chem(cells=2)
    term = {"op": "index", "args": ["A", "i"]}
    e = term
    depth = 400
    for k in range(depth):
        e = {"op": "+", "args": [e, {"op": "*", "args": [1e-4, term]}]}
    d["models"]["M"]["equations"][0]["rhs"]["expr"] = e
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(600)
    try:
        bs = BandSet.build(d)
        a = assemble(bs, u={"M.A": 1.0})
    finally:
        sys.setrecursionlimit(limit)
    J = a.matrix.toarray()
    assert J[0, 0] == pytest.approx(1 + depth * 1e-4)


@pytest.mark.parametrize("mutate,code", [
    (lambda b: b.update(reduce="*", ranges={"i": {"from": "cell"}, "j": [1, 2]}), "underivable_operator"),
    (lambda b: b.update(filter={"op": ">", "args": ["i", 1]}, reduce="*",
                        ranges={"i": {"from": "cell"}, "j": [1, 2]}), "underivable_operator"),
])
def test_document_level_refusals(mutate, code):
    d = chem()
    mutate(d["models"]["M"]["equations"][0]["rhs"])
    with pytest.raises(JacError) as ei:
        BandSet.build(d)
    assert ei.value.code == code


def test_bad_wrt():
    with pytest.raises(JacError) as ei:
        BandSet.build(chem(), wrt="state")
    assert ei.value.code == "bad_option"


def _one_state(rhs_body):
    return {"esm": "1.1.0", "metadata": {"name": "Neg"},
            "index_sets": {"x": {"kind": "interval", "size": 3}},
            "models": {"M": {"variables": {
                "q": {"type": "unknown", "shape": ["x"], "default": 0.5},
                "b": {"type": "unknown", "shape": ["x"], "default": 0.25},
                "c": {"type": "unknown", "shape": ["x"], "default": 0.75}},
                "equations": [
                    {"lhs": {"op": "D", "args": ["q"], "wrt": "t"}, "rhs": rhs_body},
                    {"lhs": {"op": "D", "args": ["b"], "wrt": "t"}, "rhs": {"op": "*", "args": [0, "b"]}},
                    {"lhs": {"op": "D", "args": ["c"], "wrt": "t"}, "rhs": {"op": "*", "args": [0, "c"]}}]}}}


@pytest.mark.parametrize("body", [
    {"op": "-", "args": ["q"]},                                   # array-level unary minus
    {"op": "-", "args": [{"op": "*", "args": [2, "q"]}]},
    {"op": "-", "args": ["q", "b", "c"]},                         # n-ary minus
    {"op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "x"}},
     "expr": {"op": "-", "args": [{"op": "index", "args": ["q", "i"]}, {"op": "index", "args": ["b", "i"]},
                                  {"op": "index", "args": ["c", "i"]}]}},
])
def test_minus_signs_match_finite_differences(body):
    # Regression: the reference drops an array-level unary minus and every
    # operand past the second of an n-ary minus (a silently wrong matrix).
    from esmjac.reference.check import fd_check
    rep = fd_check(_one_state(body), points=1)
    assert rep.ok and not rep.uncovered, rep.summary()


def test_check_on_a_model_without_states_is_not_a_crash():
    from esmjac.reference.check import fd_check
    d = {"esm": "1.1.0", "metadata": {"name": "Obs"}, "models": {"M": {"variables": {
        "y": {"type": "unknown"}, "k": {"type": "parameter", "default": 2.0}},
        "equations": [{"lhs": "y", "rhs": {"op": "*", "args": ["k", 3]}}]}}}
    rep = fd_check(d, points=1)
    assert rep.n_states == 0 and rep.ok


def test_states_without_defaults_can_be_given_explicitly():
    d = chem()
    del d["models"]["M"]["variables"]["A"]["default"]
    with pytest.raises(JacError) as ei:
        assemble(d)
    assert ei.value.code == "bad_argument"
    a = assemble(d, u={"M.A": 0.4})
    assert a.matrix.nnz == 12
