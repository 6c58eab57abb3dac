"""Tiled chunks called through their tile function's address
(compile/tilecall.py): the same bits as the lane loop, every dtype variant
resolved before it runs, an unresolved variant never called, and the serial
driver resolving its own table. The Chapman cycle on 8 cells (a 4x4 lane
block): each kernel compiles in about a second."""
from __future__ import annotations

import numpy as np
import pytest

from tests.support.models import chapman

from esmjac.compile import tilecall as tc
from esmjac.compile.codegen import generate, tile_scratch
from esmjac.compile.twins import serial_driver
from esmjac.layouts import LaneBlocks
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from esmjac.runtime.workspace import lane_cells

_built: dict = {}


def _progs():
    if not _built:
        d = chapman(cells=8)
        _built["p"] = (RhsProgram.build(d), JacobianProgram.build(d, options={"engine": "codegen"}))
    return _built["p"]


def _rhs_modules():
    """(tiled, lane loop) generated modules of the Chapman RHS; tile width 4."""
    if "rhs" not in _built:
        r, _ = _progs()
        g, g0 = generate(r.doc, rhs_tile=4), generate(r.doc, rhs_tile=None)
        _built["rhs"] = (g, g.load(), g0, g0.load())
    return _built["rhs"]


def _inputs(L, dtype):
    r, _ = _progs()
    n = len(r.layout.states)
    rng = np.random.default_rng(L)
    u = rng.uniform(0.5, 1.5, n * L).astype(dtype)
    f = np.zeros(1, dtype)
    return r, n, u, f, lane_cells(r.layout.cell_shape, L)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_rhs_through_the_address_equals_the_lane_loop(dtype):
    g, mod, g0, mod0 = _rhs_modules()
    assert all(isinstance(getattr(mod, p + c), tc.TileCall) for c in g.chunks for p in ("", "s"))
    for L in (1, 3, 4, 9, 13):
        r, n, u, f, cix = _inputs(L, dtype)
        h = np.zeros(max(g.n_hoist, 1))
        mod.prologue(r.p0, 0.0, h)
        ref = np.full(n * L, -7.0, dtype)
        for c in g0.chunks:                               # the untiled lane loop: the oracle
            getattr(mod0, "s" + c)(u, f, h, cix, ref, L)
        for pre in ("s", ""):
            out = np.full(n * L, -7.0, dtype)
            bad = sum(getattr(mod, pre + c)(u, f, h, cix, out, L) for c in g.chunks)
            assert bad == 0
            assert np.array_equal(out.view(np.uint8), ref.view(np.uint8)), (L, pre)


def test_an_unresolved_variant_is_never_called():
    """A zero table entry: the loop returns ``-1 - variant`` before it
    writes anything; the call object resolves exactly that entry."""
    g, mod, _, _ = _rhs_modules()
    sc = getattr(mod, "s" + g.chunks[0])
    for dtype, v in ((np.float64, 0), (np.float32, 0b11011)):    # u, f, out float32; h float64
        r, n, u, f, cix = _inputs(5, dtype)
        h = np.zeros(max(g.n_hoist, 1))
        out = np.full(n * 5, -7.0, dtype)
        table = np.zeros(tc.NVARIANTS, np.int64)
        assert tc.serial_loop("rhs")(table, u, f, h, cix, out, 5, sc.w) == -1 - v
        assert tc.parallel_rhs(table, u, f, h, cix, out, 5, sc.w) == -1 - v
        assert np.all(out == -7.0)
        sc.table[:] = 0
        sc(u, f, h, cix, out, 5)
        assert np.flatnonzero(sc.table).tolist() == [v]
        assert sc.table[v] == sc.address(v) > 0


def test_direct_writes_and_the_serial_driver_resolve_their_tables():
    """A tiled plan's chunks (scratch, zeroed runs) through the serial
    driver: it resolves its own table per variant (float64, then float32)
    and gives the bits of the chunks called one by one."""
    r, j = _progs()
    plan = j.plan(LaneBlocks(tile=4), source=r)
    k = j.direct_kernel(plan)
    mod = k.module()
    calls = tuple(("sfl" + c, "tile") for c in k.chunks)
    drive = serial_driver(mod, calls)
    assert drive.table.shape == (len(k.chunks), tc.NVARIANTS) and not drive.table.any()
    for dtype in (np.float64, np.float32):
        L = 9
        _, n, u, f, cix = _inputs(L, dtype)
        S = np.zeros(tile_scratch(k.tile_scratch, L, plan.tile), dtype)
        h = np.zeros(max(k.n_hoist, 1))
        out = np.full(plan.out_size(L), np.nan, dtype)
        bad = drive(u, f, j.p0, 0.0, h, cix, out, L, S)
        one = np.full(plan.out_size(L), np.nan, dtype)
        h1 = np.zeros(max(k.n_hoist, 1))
        mod.prologue(j.p0, 0.0, h1)
        bad1 = sum(getattr(mod, "sfl" + c)(u, f, h1, cix, one, L, np.zeros_like(S)) for c in k.chunks)
        assert bad == bad1 == 0
        assert np.array_equal(out.view(np.uint8), one.view(np.uint8))
        v = 0 if dtype == np.float64 else 0b11011
        assert (drive.table[:, v] > 0).all()
        # the document's 8 lanes against the slab path (lane chunks + scatter)
        ws = j.new_workspace(keep_slab=True)
        L = ws.lanes
        _, n, u, f, cix = _inputs(L, dtype)
        ref = np.full(plan.out_size(L), np.nan, dtype)
        j.eval_into(plan, u, j.p0, 0.0, None, ref, ws)
        out = np.full(plan.out_size(L), np.nan, dtype)
        S = np.zeros(tile_scratch(k.tile_scratch, L, plan.tile), dtype)
        assert drive(u, f, j.p0, 0.0, np.zeros(max(k.n_hoist, 1)), cix, out, L, S) == 0
        assert np.array_equal(out.view(np.uint8), ref.view(np.uint8))
    assert np.count_nonzero(drive.table) == 2 * len(k.chunks)
    # The driver passes the tile width and scratch size to the package's
    # loop as int64: literals compiled the loop once per plan and model
    # (no caller passes a literal: this holds for every signature).
    from numba.core import types as nt
    sigs = tc.serial_loop("fl").signatures
    assert sigs and not any(isinstance(t, nt.Literal) for s in sigs for t in s), sigs
