"""The leaf's ``precision="mixed"`` (float32 iteration matrix, float64 state,
stages and error norm) and its block sizing (esmjac.integrators.leaf).

Oracles: SciPy's Radau at rtol 1e-10 on the same right-hand side (an
independent integrator; the RHS itself is checked against earthsci-ast in
tests/runtime); the float64 leaf at the same tolerance (the mixed run must
be as accurate against Radau, within the tolerance it was asked for);
bitwise equality of a lane alone and in a grid; hand arithmetic for the
block sizes.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from esmjac.adapters.native import rosenbrock
from esmjac.errors import JacError
from esmjac.integrators import leaf as _leaf
from esmjac.models.mechanism import lift
from tests.support.leafgrid import DT, NS
from tests.support.leafgrid import heterogeneous_grid as _grid
from tests.support.leafgrid import radau_reference as _radau
from tests.support.programs import TROPO12

RTOL = 1e-3


@pytest.fixture(scope="module")
def doc8():
    return lift(json.loads(TROPO12.read_text()), 8)


def test_mixed_precision_is_as_accurate_as_double_at_rtol_1e3(doc8):
    dbl = rosenbrock(doc8, rtol=RTOL, threads=1)
    mix = rosenbrock(doc8, rtol=RTOL, threads=1, precision="mixed")
    assert dbl.precision == "double" and mix.precision == "mixed"
    L = 8
    u, fj = _grid(dbl, L, 3)
    yr = _radau(dbl, u, fj, L)
    big = np.abs(yr) > 1e3 * np.repeat(dbl.atol, L)
    errs = {}
    for name, lf in (("double", dbl), ("mixed", mix)):
        v = u.copy()
        st = lf.advance(v, 0.0, DT, forcing=fj)
        assert st.success, (name, st.message)
        errs[name] = float((np.abs(v - yr)[big] / np.abs(yr[big])).max())
    # the float32 matrix is really used: the runs differ in their bits
    sc = mix._scratch_for(L, 1)[1][0]
    assert sc.Wm.dtype == np.float32
    assert errs["mixed"] < 10 * RTOL, errs
    assert errs["mixed"] < 2 * errs["double"] + RTOL, errs


def test_mixed_precision_lane_alone_equals_lane_in_grid_bitwise(doc8):
    lf = rosenbrock(doc8, rtol=RTOL, threads=1, precision="mixed")
    L = 40
    u, fj = _grid(lf, L, 4)
    v = u.copy()
    assert lf.advance(v, 0.0, DT, forcing=fj).success
    for l in (0, 17, 39):
        w = u.reshape(NS, L)[:, l].copy()
        lf.advance(w, 0.0, DT, forcing=fj[l:l + 1])
        assert np.array_equal(w, v.reshape(NS, L)[:, l])


def test_bad_precision_is_refused(doc8):
    with pytest.raises(JacError) as e:
        rosenbrock(doc8, precision="half")
    assert e.value.code == "bad_option"


def test_block_lanes_shrink_for_large_mechanisms(monkeypatch):
    # tropo12-sized: 15 species, ~60 slots → the cap BLOCK_LANES
    assert _leaf.block_lanes(15, 60, 4, 1) == _leaf.BLOCK_LANES
    # GEOS-Chem fullchem: 272 species, 3,849 LU slots, 4 stages, 450 fields:
    # 8·(2·3849 + 12·272 + 450) = 91,296 B per lane; 8 MiB / 91,296 = 91.9 → 64
    assert _leaf.block_lanes(272, 3849, 4, 450) == 64
    monkeypatch.setattr(_leaf, "BLOCK_BYTES", 1)
    assert _leaf.block_lanes(272, 3849, 4, 450) == 16          # never below 16
    monkeypatch.setattr(_leaf, "BLOCK_LANES", 8)
    assert _leaf.block_lanes(15, 60, 4, 1) == 8


def test_tape_engine_jacobian_stored_straight_into_tiles(doc8, monkeypatch):
    # The leaf's bound Jacobian for the tape engine writes the plan's tile
    # slots directly (no band slab), in its LU's slot order (matrix_plan);
    # oracle: the program's own slab path (keep_slab=True: band slab, then
    # that plan's scatter) at the same state
    # — the same instructions, so the same bits — and, for the leaf as a
    # whole, the codegen engine's leaf (an independently generated kernel).
    from esmjac.integrators import bound
    monkeypatch.setattr(bound, "POLY", False)       # the lane tape's stores (lanepoly: its own tests)
    lf = rosenbrock(doc8, rtol=RTOL, threads=1, options={"engine": "tape"})
    assert lf.jac_program.kernel.engine == "tape"
    L = 8
    u, fj = _grid(lf, L, 6)
    st = lf._scratch_for(L, 1)[1][0]
    out = np.full(st.J.size, np.nan)
    fz = np.zeros(st.nf * L)            # the fields, then the rows the leaf hoists (hoist_rates)
    fz[:st.nfu * L] = fj
    if st.lane_prologue is not None:
        st.lane_prologue(fz, st.cix, L)
    st.jac(u, fz, st.cix, L, out)
    ws = lf.jac_program.new_workspace(L, keep_slab=True)
    ref = np.full(lf.matrix_plan.out_size(L), np.nan)
    lf.jac_program.eval_into(lf.matrix_plan, u, lf.p, 0.0, fj, ref, ws)
    assert np.array_equal(out[:ref.size], ref)
    cg = rosenbrock(doc8, rtol=RTOL, threads=1)
    assert cg.jac_program.kernel.engine == "codegen"
    v1, v2 = u.copy(), u.copy()
    assert lf.advance(v1, 0.0, DT, forcing=fj).success and cg.advance(v2, 0.0, DT, forcing=fj).success
    np.testing.assert_allclose(v1, v2, rtol=1e-6, atol=1e-9 * np.abs(v2).max())
