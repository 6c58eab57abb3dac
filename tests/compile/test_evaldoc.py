"""The evaluation document (compile/evaldoc.py): lane kind, canonical
index names, hoisting, and values — every Jacobian field evaluated by the
scalar evaluator at every point equals the reference assembly, and every
RHS piece sums to earthsci-ast's ``evaluate_rhs``."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from esmjac.calculus.bandset import BandSet
from esmjac.compile.evaldoc import jacobian_doc, rhs_doc
from esmjac.model.evaluate import ev
from esmjac.model.layout import element_name, element_names, model_layout, ode_states, resolve_point
from esmjac.reference.check import _flat, rhs_vector
from esmjac.reference.oracle import assemble
from tests.support.evaluate import reader as _reader
from tests.support.models import chem, with_observed_chain
from tests.support.paths import FIXTURES, need_reference


def _points(f):
    return itertools.product(*(range(lo, hi + 1) for _, lo, hi in f.dims))


def _values(view):
    pt = resolve_point(view, None, None, 0.0, ode_states(view) + list(view.parameters))
    arrays = {k: np.asarray(v, dtype=float) for k, v in pt.values.items() if np.ndim(v)}
    scalars = {k: float(v) for k, v in pt.values.items() if not np.ndim(v)}
    return arrays, dict(scalars, t=0.0)


def _doc_jacobian(bs, doc) -> dict:
    """{(row element, col element): value} from the document's fields."""
    arrays, env0 = _values(bs.view)
    read = _reader(arrays)
    out: dict = {}
    for f in doc.fields:
        expr = doc.expanded(f.expr)
        for pt in _points(f):
            env = dict(env0, **{n: float(v) for (n, _, _), v in zip(f.dims, pt)})
            ridx = tuple(int(ev(p, env, read)) if not isinstance(p, int) else p for p in f.pins)
            cidx = tuple(int(ev(c, env, read)) for c in f.cidx)
            shape = bs.view.shape(f.col) if f.col != "t" else ()
            if any(not 1 <= c <= n for c, n in zip(cidx, shape)):
                continue
            key = (element_name(f.row, ridx), element_name(f.col, cidx))
            out[key] = out.get(key, 0.0) + ev(expr, env, read)
    return out


def _assert_matches_assembly(bs, doc):
    ours = _doc_jacobian(bs, doc)
    a = assemble(bs)
    M = a.matrix.toarray()
    scope = bs.view.scope
    rpos = {n: i for i, n in enumerate(a.rows)}
    cpos = {n: i for i, n in enumerate(a.cols)}
    R = np.zeros_like(M)
    for (r, c), v in ours.items():
        R[rpos[scope + r], cpos[c if c == "t" else scope + c]] += v
    assert np.allclose(R, M, rtol=1e-13, atol=1e-13 * max(1.0, np.abs(M).max()))


def test_cell_document_by_hand():
    view = chem(cells=4)
    bs = BandSet.build(view)
    lay = model_layout(bs.view)
    doc = jacobian_doc(bs, lay, rhs_doc(bs.view, lay).kind)
    assert doc.kind == "cell"
    # ∂(−k1 A + k2 B²)/∂A = −k1, ∂/∂B = 2 k2 B, ∂(k1 A − 2 k2 B²)/∂A = k1, ∂/∂B = −4 k2 B.
    assert [(f.name, f.row, f.col) for f in doc.fields] == [
        ("J1", "A", "A"), ("J2", "A", "B"), ("J3", "B", "A"), ("J4", "B", "B")]
    for f in doc.fields:                      # canonical cell index names, one box per cell
        assert f.dims == (("_c1", 1, 4),) and f.pins == ("_c1",)
    _assert_matches_assembly(bs, doc)


def test_hoisted_names_are_deterministic_and_expand_back():
    bs = BandSet.build(with_observed_chain(chem(cells=3)))
    lay = model_layout(bs.view)
    d1 = jacobian_doc(bs, lay)
    d2 = jacobian_doc(BandSet.build(with_observed_chain(chem(cells=3))), lay)
    assert d1.to_json() == d2.to_json()
    names = [n for n, _ in d1.observed]
    assert names == [f"jc{k + 1}" for k in range(len(names))]
    _assert_matches_assembly(bs, d1)
    data = json.loads(d1.to_json())
    assert [f["name"] for f in data["fields"]] == [f.name for f in d1.fields]
    assert data["lane_kind"] == "cell"


def test_rhs_document_sums_to_evaluate_rhs():
    bs = BandSet.build(chem(cells=3))
    view = bs.view
    doc = rhs_doc(view)
    assert doc.kind == "cell" and doc.wrt is None and all(f.col is None for f in doc.fields)
    arrays, env0 = _values(view)
    read = _reader(arrays)
    names = element_names(view, ode_states(view))
    pos = {n: k for k, n in enumerate(names)}
    f_doc = np.zeros(len(names))
    for f in doc.fields:
        for pt in _points(f):
            env = dict(env0, **{n: float(v) for (n, _, _), v in zip(f.dims, pt)})
            ridx = tuple(int(env[p]) if isinstance(p, str) else p for p in f.pins)
            f_doc[pos[view.scope + element_name(f.row, ridx)]] += ev(doc.expanded(f.expr), env, read)
    y = np.concatenate([np.ravel(arrays[s]) for s in ode_states(view)])
    assert np.allclose(f_doc, rhs_vector(_flat(view), names, y, 0.0), rtol=1e-13)


@pytest.mark.parametrize("fx,kind", [("bd_chem", "cell"), ("adv_interior", "global"),
                                     ("contracted_ops", "global")])
def test_fixture_fields_match_the_reference_assembly(fx, kind):
    need_reference()
    bs = BandSet.build(str(FIXTURES / f"{fx}.esm"))
    lay = model_layout(bs.view)
    doc = jacobian_doc(bs, lay, rhs_doc(bs.view, lay).kind)
    assert doc.kind == kind
    prefix = "_c" if kind == "cell" else "_g"
    assert all(n.startswith(prefix) for f in doc.fields for n, _, _ in f.dims)
    _assert_matches_assembly(bs, doc)


def test_bare_array_reads_by_hand():
    """An array variable read other than as an ``index`` head makes a piece
    global; the index head itself does not (by hand: ``X`` and ``Y`` are
    arrays, ``k`` a scalar, ``i`` an index name). The expression is a DAG
    sharing one subtree, as hash-consed expressions are."""
    from types import SimpleNamespace

    from esmjac.compile.evaldoc import _bare_names, _has_bare_arrays
    from esmjac.model.expr import node

    lay = SimpleNamespace(shapes={"X": (3,), "Y": (3,), "k": ()})
    xi = node("index", ["X", "i"])
    shared = node("*", ["k", xi])
    only_heads = node("+", [shared, node("exp", [shared]), node("index", ["Y", node("+", ["i", 1])])])
    assert _bare_names(only_heads) == {"k", "i"}
    assert not _has_bare_arrays(lay, only_heads)
    bare_y = node("+", [shared, node("*", ["Y", xi])])       # Y bare, X only as a head
    assert _bare_names(bare_y) == {"k", "i", "Y"}
    assert _has_bare_arrays(lay, bare_y)
    head_and_bare = node("+", [xi, node("sum", ["X"])])      # X both as a head and bare
    assert _bare_names(head_and_bare) == {"i", "X"}
    assert _has_bare_arrays(lay, head_and_bare)
