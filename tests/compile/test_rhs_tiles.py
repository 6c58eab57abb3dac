"""The tiled right-hand side (compile/codegen.py ``_rhs_tile_chunk``): the
same bits as the scalar lane loop it replaced, for every tile width, lane
count (ragged last tiles, fewer lanes than a tile), dtype and twin
(serial/parallel); the same non-finite count; the earthsci_ast output
order; and packed SIMD instructions in the compiled tile loop."""
from __future__ import annotations

import json
import platform
import re

import numpy as np
import pytest

from tests.support.programs import TROPO12, close

from esmjac._frozen import ro
from esmjac.compile.codegen import RHS_TILE, generate
from esmjac.models.mechanism import lift
from esmjac.reference.check import _flat, rhs_vector
from esmjac.model.load import load_view
from esmjac.runtime.programs import RhsProgram
from esmjac.runtime.workspace import lane_cells

_built: dict = {}


def _prog():
    if "r" not in _built:
        doc = lift(json.loads(TROPO12.read_text()), 9)
        _built["doc"] = doc
        _built["r"] = RhsProgram.build(doc)
    return _built["r"]


def _module(tile):
    """The generated module of the tropo12 RHS with ``rhs_tile=tile``."""
    key = ("mod", tile)
    if key not in _built:
        g = generate(_prog().doc, rhs_tile=tile)
        _built[key] = (g, g.load())
    return _built[key]


def _run(tile, u, p, f, L, serial=True):
    g, mod = _module(tile)
    r = _prog()
    h = np.zeros(max(g.n_hoist, 1))
    cix = lane_cells(r.layout.cell_shape, L)
    out = np.full(u.shape[0], -7.0, dtype=u.dtype)
    # inputs read-only, as the engine passes them (its one compiled flavour)
    mod.prologue(ro(p), 0.0, h)
    bad = 0
    for name in g.chunks:
        bad += getattr(mod, ("s" if serial else "") + name)(ro(u), ro(f), h, cix, out, L)
    return out, bad


def _point(L, dtype, seed=0):
    r = _prog()
    n, nf = len(r.layout.states), r.forcing0.size // r.cells
    rng = np.random.default_rng(seed)
    u = np.tile(r.u0.reshape(n, r.cells)[:, :1], (1, L)) * rng.uniform(0.5, 1.5, (n, L))
    f = np.tile(r.forcing0.reshape(nf, r.cells)[:, :1], (1, L)) * rng.uniform(0.9, 1.1, (nf, L))
    return (np.ascontiguousarray(u, dtype).ravel(), np.ascontiguousarray(f, dtype).ravel(),
            r.p0.astype(np.float64))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tiles_give_the_scalar_loops_bits(dtype):
    """Tile widths 8 and the default against the old one-lane-per-iteration
    loop (``rhs_tile=None``): bitwise, at lane counts below, at and around
    tile multiples, serial and parallel twins."""
    for L in (1, 3, 8, 9, 63, 64, 65, 130, 200):
        u, f, p = _point(L, dtype, L)
        ref, rbad = _run(None, u, p, f, L)
        assert rbad == 0 and np.all(np.isfinite(ref))
        for tile in (8, RHS_TILE):
            for serial in ((True, False) if dtype == np.float64 else (True,)):
                out, bad = _run(tile, u, p, f, L, serial)
                assert out.dtype == ref.dtype
                assert np.array_equal(out, ref), (L, tile, serial, np.max(np.abs(out - ref)))
                assert bad == 0


def test_default_rhs_is_tiled_and_in_earthsci_order():
    """The default build runs the tiled chunks (stack scratch, tiles of
    RHS_TILE lanes) and its output is in the earthsci_ast order, equal to the
    reference right-hand side element by element."""
    r = _prog()
    # the tile loop is the package's (compile/tilecall.py), over tiles of RHS_TILE lanes
    assert "stack_empty" in r.kernel.source and f"_tc.TileCall(tile_chunk0, 'rhs', False, {RHS_TILE})" in r.kernel.source
    flat = _flat(load_view(_built["doc"]))
    u, f, p = _point(r.cells, np.float64, 5)
    out = np.empty_like(u)
    r.eval_into(u, r.p0, 0.0, None, out)
    ref = rhs_vector(flat, list(r.names), u, 0.0, None)
    assert close(out, ref, 1e-12)
    scalar, _ = _run(None, u, r.p0, r.forcing0, r.cells)
    assert np.array_equal(out, scalar)


def test_nonfinite_count_matches_the_scalar_loop():
    """A non-finite input in the shifted last tile (its first lanes are
    recomputed, not stored again) and in the small (< tile) path: the same
    count as the scalar loop, and the same stored bits (NaN positions)."""
    for L in (5, RHS_TILE + 3, 3 * RHS_TILE - 1):
        u, f, p = _point(L, np.float64, 1)
        n = len(_prog().layout.states)
        for lane in (0, L - 1, max(L - 4, 0)):
            v = u.copy()
            v[0 * L + lane] = np.inf          # O3 at one lane
            v[(n - 1) * L + lane] = np.nan
            ref, rbad = _run(None, v, p, f, L)
            out, bad = _run(RHS_TILE, v, p, f, L)
            assert rbad > 0 and bad == rbad, (L, lane, bad, rbad)
            assert np.array_equal(np.isnan(out), np.isnan(ref))
            ok = np.isfinite(ref)
            assert np.array_equal(out[ok], ref[ok])


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 assembly check")
def test_tile_loop_compiles_to_packed_simd():
    """The tile loop's multiplies are packed (``mulpd`` on xmm/ymm/zmm)
    — at least as many as scalar ones (the remainder loop for short calls):
    compiled afresh (cached code cannot be inspected)."""
    import numba
    _, mod = _module(RHS_TILE)
    fn = numba.njit(cache=False, error_model="numpy", nogil=True)(mod.tile_chunk0.py_func)
    u, f, p = _point(RHS_TILE, np.float64)
    h = np.zeros(64)
    cix = np.zeros(RHS_TILE, np.int64)
    out = np.zeros_like(u)
    fn(u, f, cix, RHS_TILE, 0, h, out, RHS_TILE, 0, 0, RHS_TILE)
    asm = fn.inspect_asm(fn.signatures[0])
    packed = re.findall(r"^\s+v?mulpd\s", asm, re.M)
    scalar = re.findall(r"^\s+v?mulsd\s", asm, re.M)
    assert len(packed) >= 20, (len(packed), len(scalar))
    # every multiply of the body has a packed form (the scalar copies are
    # the remainder loop, for lane counts below a tile)
    assert len(packed) >= len(scalar)
