"""Bound calls on lane tiles (``prog.bind`` with tiled plans): every tile
width, ragged and partial tiles, direct writes and the band slab give the
unbound slab path's bits (the slab gather is itself checked against the
reference assembly in tests/layouts). Split from test_bound.py so the two
files run on different test workers. The model is the Chapman box (4
species, a 4×4 lane block with zero entries): the tests are about tiles,
lanes and bits, and each (layout, tile, dtype) is a kernel compile of its
own -- about a second here against ~15 s for tropo12's 15×15 blocks."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.models import chapman

from esmjac import JacError
from esmjac.layouts import LaneBlocks, LaneSparseBlocks
from esmjac.layouts.types import untile
from esmjac.models.mechanism import box
from esmjac.runtime.programs import JacobianProgram, RhsProgram

_built: dict = {}


def boxed():
    if "b" not in _built:
        d = box(chapman(cells=1))
        _built["b"] = (RhsProgram.build(d), JacobianProgram.build(d))
    return _built["b"]


def _boxed_tape():
    if "bt" not in _built:
        d = box(chapman(cells=1))
        _built["bt"] = (RhsProgram.build(d, options={"engine": "tape"}),
                        JacobianProgram.build(d, options={"engine": "tape"}))
    return _built["bt"]


@pytest.mark.parametrize("engine", ["codegen", "tape"])
def test_bound_calls_on_tiled_layouts_give_the_unbound_bits(engine):
    """Every tile width (ragged last tiles, padding lanes, one tile of the
    whole capacity), direct writes and the band slab, float64 and float32:
    a bound call stores the very bits of the unbound slab path (gather of
    the lanes-fastest band slab, itself checked against the reference
    assembly in tests/layouts), padding lanes included."""
    r, j = boxed() if engine == "codegen" else _boxed_tape()
    assert j.kernel.engine == engine
    rng = np.random.default_rng(21)
    for lanes in (1, 7, 33):
        u0, p0, _ = r.defaults(lanes)
        u = u0 * rng.uniform(0.5, 1.5, u0.size)
        # float32 on two layouts (one per kernel family); tile=5 is covered by
        # the partial-tile test below
        for lay, dts in ((LaneSparseBlocks(), (np.float64, np.float32)),
                         (LaneSparseBlocks(tile=None), (np.float64,)),
                         (LaneBlocks(tile=3), (np.float64, np.float32)),
                         (LaneBlocks("markowitz"), (np.float64,))):
            plan = j.plan(lay, source=r)
            for dt in dts:
                uu = u.astype(dt)
                ref = np.full(plan.out_size(lanes), np.nan, dt)
                j.eval_into(plan, uu, p0, 0.0, None, ref, j.new_workspace(lanes, keep_slab=True))
                assert np.isfinite(ref).all()
                for keep in (False, True):
                    run = j.bind(plan, j.new_workspace(lanes, keep_slab=keep), dt)
                    got = np.full(plan.out_size(lanes), np.nan, dt)
                    run(uu, p0, 0.0, None, got)
                    assert np.array_equal(got, ref), (engine, lanes, lay, dt, keep)
                    got[:] = np.nan
                    run(uu, p0, 0.0, None, got)          # the second call reuses the scratch
                    assert np.array_equal(got, ref), (engine, lanes, lay, dt, keep)


def test_tiled_bound_call_refuses_an_untiled_output_size():
    """At 7 lanes in tiles of 16 the layout stores 16 lanes per slot: an
    output of ``nslots * 7`` is refused before compiled code runs."""
    r, j = boxed()
    plan = j.plan(LaneSparseBlocks(tile=16))
    P = int(plan.info["slots_per_lane"])
    assert plan.out_size(7) == P * 16
    run = j.bind(plan, j.new_workspace(lanes=7))
    u, p, _ = r.defaults(7)
    short = np.full(P * 7, np.nan)
    with pytest.raises(JacError) as e:
        run(u, p, 0.0, None, short)
    assert e.value.code == "bad_argument" and np.isnan(short).all()


@pytest.mark.parametrize("engine", ["codegen", "tape"])
def test_partial_tiles_give_the_bits_of_full_tiles(engine):
    """The last, partial tile computes only its real lanes and repeats the
    last one into the padding: at 1, 3 and 17 lanes (tiles of 16: one
    partial tile, a full and a partial one; tiles of 5: full ones and a
    partial one) every real lane holds exactly the bits that lane gets in a
    full tile (the same cells among 32 lanes) and in the untiled layout, and
    every padding lane the bits of the last real lane; float64 and float32."""
    r, j = boxed() if engine == "codegen" else _boxed_tape()
    rng = np.random.default_rng(5)
    u32, p0, _ = r.defaults(32)
    u32 = u32 * rng.uniform(0.5, 1.5, u32.size)
    ns = len(r.layout.states)
    for lay in (LaneSparseBlocks(), LaneSparseBlocks(tile=5)):
        plan, flat = j.plan(lay, source=r), j.plan(LaneSparseBlocks(tile=None), source=r)
        P = int(plan.info["slots_per_lane"])
        for dt in (np.float64, np.float32):
            full = np.full(plan.out_size(32), np.nan, dt)
            j.bind(plan, j.new_workspace(32), dt)(u32.astype(dt), p0, 0.0, None, full)
            ref = untile(full, P, 32, plan.tile_width(32))
            for lanes in (1, 3, 17):
                u = u32.reshape(ns, 32)[:, :lanes].ravel().astype(dt)     # the first lanes' cells
                got = np.full(plan.out_size(lanes), np.nan, dt)
                j.bind(plan, j.new_workspace(lanes), dt)(u, p0, 0.0, None, got)
                W = plan.tile_width(lanes)
                cap = plan.capacity(lanes)
                V = untile(got, P, cap, W)                              # padding lanes included
                assert np.array_equal(V[:, :lanes], ref[:, :lanes]), (engine, lay, dt, lanes)
                assert all(np.array_equal(V[:, k], V[:, lanes - 1]) for k in range(lanes, cap))
                g2 = np.full(flat.out_size(lanes), np.nan, dt)
                j.bind(flat, j.new_workspace(lanes), dt)(u, p0, 0.0, None, g2)
                assert np.array_equal(g2.reshape(P, lanes), ref[:, :lanes]), (engine, lay, dt, lanes)
