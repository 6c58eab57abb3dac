"""RHS lowering (compile/lowering.py): the pieces of every equation, summed
at every row point by the scalar evaluator, equal earthsci-ast's own
``evaluate_rhs`` (the independent oracle); refusals carry the calculus's
error codes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from esmjac.compile.lowering import rhs_pieces
from esmjac.errors import JacError
from esmjac.model.evaluate import ev
from esmjac.model.layout import element_name, element_names, ode_states
from esmjac.model.load import load_view
from esmjac.reference.check import _flat, rhs_vector
from tests.support.evaluate import reader as _reader
from tests.support.models import chem
from tests.support.paths import FIXTURES, need_reference


def _pieces_rhs(view, y: np.ndarray) -> np.ndarray:
    states = ode_states(view)
    names = element_names(view, states)
    pos = {n: k for k, n in enumerate(names)}
    values, off = {}, 0
    for s in states:
        shape = view.shape(s)
        size = int(np.prod(shape)) if shape else 1
        values[s] = y[off:off + size].reshape(shape) if shape else y[off]
        off += size
    scal = {n: float(view.variables[n].default) for n in view.parameters
            if not view.shape(n) and isinstance(view.variables[n].default, (int, float))}
    read = _reader({k: v for k, v in values.items() if isinstance(v, np.ndarray)})
    env0 = dict(scal, t=0.0, **{k: float(v) for k, v in values.items() if not isinstance(v, np.ndarray)})
    f = np.zeros(len(names))
    for pc in rhs_pieces(view):
        free = [(k, p) for k, p in enumerate(pc.pins) if isinstance(p, str)]
        for pt in itertools.product(*(range(pc.rows[k][0], pc.rows[k][1] + 1) for k, _ in free)):
            env = dict(env0, **{p: float(v) for (_, p), v in zip(free, pt)})
            idx = list(pc.pins)
            for (k, _), v in zip(free, pt):
                idx[k] = v
            f[pos[view.scope + element_name(pc.row, tuple(idx))]] += ev(pc.expr, env, read)
    return f


def _check(view, seed=0):
    rng = np.random.default_rng(seed)
    names = element_names(view, ode_states(view))
    y = rng.uniform(0.5, 1.5, len(names))
    f_ours = _pieces_rhs(view, y)
    f_ref = rhs_vector(_flat(view), names, y, 0.0)
    scale = max(1.0, float(np.max(np.abs(f_ref))))
    assert np.max(np.abs(f_ours - f_ref)) <= 1e-12 * scale


def test_chemistry_pieces_by_hand():
    view = load_view(chem(cells=3))
    pieces = rhs_pieces(view)
    # D(A) = -k1 A + k2 B²: one cellwise piece per equation over cells 1..3.
    assert [(p.row, p.rows) for p in pieces] == [("A", ((1, 3),)), ("B", ((1, 3),))]
    assert all(len(p.pins) == 1 and isinstance(p.pins[0], str) for p in pieces)
    _check(view)


@pytest.mark.parametrize("fx", ["adv_interior", "flux_form_adv", "minmod_adv", "contracted_ops",
                                "bd_chem", "coupled_chem_advection", "adv_react_2d"])
def test_pieces_sum_to_evaluate_rhs(fx):
    need_reference()
    _check(load_view(str(FIXTURES / f"{fx}.esm")), seed=len(fx))


def _scalar_doc(rhs) -> dict:
    return {"esm": "1.1.0", "metadata": {"name": "S"},
            "index_sets": {"cell": {"kind": "interval", "size": 3}},
            "models": {"M": {"variables": {
                "x": {"type": "unknown", "default": 1.0},
                "A": {"type": "unknown", "shape": ["cell"], "default": 1.0},
                "k": {"type": "parameter", "default": 2.0}},
                "equations": [
                    {"lhs": {"op": "D", "args": ["x"], "wrt": "t"}, "rhs": rhs},
                    {"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                     "rhs": {"op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}},
                             "expr": {"op": "*", "args": [-1, {"op": "index", "args": ["A", "i"]}]}}}]}}}


def test_scalar_equation_is_one_unindexed_piece():
    # D(x) = −k x + 3: one piece, no rows, evaluated by hand at x = 1, k = 2.
    view = load_view(_scalar_doc({"op": "+", "args": [{"op": "*", "args": [-1, "k", "x"]}, 3]}))
    _check(view)
    (px,) = [p for p in rhs_pieces(view) if p.row == "x"]
    assert px.rows == () and px.pins == ()
    assert ev(px.expr, {"x": 1.0, "k": 2.0, "t": 0.0}) == pytest.approx(1.0)


def test_array_valued_rhs_of_a_scalar_is_refused():
    view = load_view(_scalar_doc("A"))
    with pytest.raises(JacError) as ei:
        rhs_pieces(view)
    assert ei.value.code == "unsupported_construct"
    assert isinstance(ei.value, NotImplementedError)


@pytest.mark.parametrize("change", [{"filter": {"op": ">", "args": ["i", 1]}, "reduce": "*"},
                                    {"reduce": "*"}],
                         ids=["filtered_product", "product"])
def test_one_construct_one_error_code(change):
    # The RHS lowering and the band calculus walk arrays the same way, so an
    # aggregate neither can express is refused with the same code by both.
    from esmjac.calculus.bandset import BandSet
    doc = chem(cells=3)
    doc["models"]["M"]["equations"][0]["rhs"].update(change)
    with pytest.raises(JacError) as lowering:
        rhs_pieces(load_view(doc))
    with pytest.raises(JacError) as calculus:
        BandSet.build(doc)
    assert lowering.value.code == calculus.value.code == "underivable_operator"


def test_a_filtered_sum_is_a_gated_sum():
    # D(A)[i] = Σ_{j : j <= i} A[j] over 3 cells (a prefix sum), by hand.
    doc = chem(cells=3)
    doc["models"]["M"]["equations"][0]["rhs"] = {
        "op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}, "j": {"from": "cell"}},
        "filter": {"op": "<=", "args": ["j", "i"]}, "expr": {"op": "index", "args": ["A", "j"]}}
    view = load_view(doc)
    y = np.array([2.0, 3.0, 5.0, 0.5, 0.5, 0.5])        # A, then B
    f = _pieces_rhs(view, y)
    np.testing.assert_allclose(f[:3], [2.0, 5.0, 10.0], rtol=1e-15)
