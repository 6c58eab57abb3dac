"""The leaf's iteration matrix with L and U stored apart (leaf.SPLIT: a taped
Jacobian's leaf builds ``SparseLaneLU(storage="split")`` and has every
Jacobian route write that slot order, ``ScatterPlan.in_storage``).

Oracle: the same leaf with the pattern's slot order (``SPLIT = False``),
today's storage: the storage order moves slots, never operations, so every
value, counter and sensitivity is bitwise the same, through every route that
writes the matrix (the mass-action kernel with hoisted rates, in place; the
lane tape's direct stores; the slab scatter of an untiled plan; the float32
factors of precision="mixed"). The split leaf's gradient is checked against
finite differences of its own forward map too.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from esmjac.adapters.native import rosenbrock
from esmjac.integrators import leaf as leafmod
from esmjac.models.mechanism import lift
from tests.support.leafgrid import DT, replay_case
from tests.support.leafgrid import heterogeneous_grid as _grid
from tests.support.programs import TROPO12

L = 19                                        # a 16-lane tile and a partial one
TAPE = {"engine": "tape", "progress": False}


@pytest.fixture(scope="module")
def doc():
    return lift(json.loads(TROPO12.read_text()), L)


def _pair(doc, monkeypatch, **kw):
    """(pattern-order leaf, split leaf) of the same build."""
    out = []
    for split in (False, True):
        monkeypatch.setattr(leafmod, "SPLIT", split)
        out.append(rosenbrock(doc, rtol=1e-4, threads=1, options=TAPE, **kw))
    assert out[0].lu.storage == "pattern" and out[1].lu.storage == "split"
    assert out[1].matrix_plan.info["storage"] == "split" and out[0].matrix_plan is out[0].plan
    return out


@pytest.mark.parametrize("kw", [{}, {"hoist_rates": False}, {"tile": None}, {"precision": "mixed"},
                                {"method": "ros34pw2"}], ids=["poly-in-place", "lane-tape", "untiled-scatter",
                                                              "mixed", "w-method"])
def test_split_leaf_is_bitwise_the_pattern_leaf(doc, monkeypatch, kw):
    a, b = _pair(doc, monkeypatch, **kw)
    u, fj = _grid(a, L, seed=5)
    va, vb = u.copy(), u.copy()
    sa = a.advance(va, 0.0, DT, forcing=fj)
    sb = b.advance(vb, 0.0, DT, forcing=fj)
    assert sa.totals() == sb.totals() and np.all(sa.status == 0)
    assert np.array_equal(va.view(np.int64), vb.view(np.int64))
    assert np.array_equal(sa.h, sb.h)


def test_split_leaf_sensitivities_are_the_pattern_leafs(monkeypatch):
    # the adjoint (gradient) and the tangent replay the recorded steps' LU and
    # stage solves and form Jᵀu on the stored slots: bitwise the pattern
    # leaf's; the split leaf's gradient against finite differences of its
    # replayed forward map (tests/support/leafgrid.replay_case)
    a, b = _pair(lift(json.loads(TROPO12.read_text()), 2), monkeypatch)
    u, fj = a.initial_state(), np.array([0.3, 1.0])
    w = np.random.default_rng(1).uniform(0.5, 1.5, u.size) / np.abs(u).clip(1.0)
    ga = a.gradient(u, 0.0, 300.0, w, forcing=fj)
    gb = b.gradient(u, 0.0, 300.0, w, forcing=fj)
    assert np.array_equal(ga[0], gb[0]) and np.array_equal(ga[1], gb[1])
    assert ga[2].keys() == gb[2].keys() and all(np.array_equal(ga[2][k], gb[2][k]) for k in ga[2])
    d = np.random.default_rng(2).standard_normal(u.size) * np.abs(u)
    ta = a.tangent(u, 0.0, 300.0, du0=d, dp={"T": 1.0}, forcing=fj)
    tb = b.tangent(u, 0.0, 300.0, du0=d, dp={"T": 1.0}, forcing=fj)
    assert np.array_equal(ta[0], tb[0]) and np.array_equal(ta[1], tb[1])
    _, y, phi = replay_case(b, fj, w, 300.0)
    assert np.array_equal(y, gb[0])
    eps = 1e-6
    fd = (phi(u + eps * d) - phi(u - eps * d)) / (2 * eps)
    assert abs(gb[1] @ d - fd) <= 1e-6 * abs(fd), (gb[1] @ d, fd)


def test_the_split_plans_jacobian_tape_is_the_pattern_tape_with_its_stores_renamed(doc, monkeypatch):
    # ScatterPlan.in_storage permutes every destination once (a, fa, za), and
    # the program's direct tape of it keeps the pattern plan's instructions in
    # their order: so the leaf's hoisted rows and the mass-action expansion
    # are numbered as the pattern leaf's (on GEOS-Chem fullchem a tape
    # re-ordered by the new slots numbered the hoisted rows differently, and
    # the expansion's products of three factors changed their order: 234 of
    # 123,168 Jacobian values at 32 lanes moved in their last bits)
    from esmjac.compile.tape import OPS
    from esmjac.integrators.bound import lane_hoist
    a, b = _pair(doc, monkeypatch)
    pos = b.lu.position
    pa, pb = a.plan, b.matrix_plan
    assert pb.key != pa.key and pb.fingerprint == pa.fingerprint
    for k in ("a", "fa", "za"):
        assert np.array_equal(pb.arrays[k], pos[pa.arrays[k]])
    ta, tb = a.jac_program.direct_tape(pa), b.jac_program.direct_tape(pb)
    st = ta.body.code[:, 0] == OPS.index("store")
    want = ta.body.code.copy()
    want[st, 2] = pos[want[st, 2]]
    assert np.array_equal(tb.body.code, want) and np.array_equal(tb.body.consts, ta.body.consts)
    assert np.array_equal(np.sort(tb.zero_slots), np.sort(pos[ta.zero_slots]))
    ha, hb = lane_hoist(a, pa), lane_hoist(b, pb)
    assert hb.rows == ha.rows and np.array_equal(hb.jac.prologue.code, ha.jac.prologue.code)
    with pytest.raises(Exception, match="own slot order"):
        pb.in_storage(pos, "split")
