"""SparseLaneLU on tiled LaneSparseBlocks storage (docs/design.rst §4 lane tiles).

Oracle: the untiled factorisation of the same matrices (itself checked
against NumPy in tests/integrators/test_rosenbrock.py) — bitwise, since a
lane's arithmetic must not depend on where its slots sit — and a dense
NumPy solve.
"""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.linalg.factorization import lu_fill, markowitz_ordering
from esmjac.errors import JacError
from esmjac.linalg.sparse_lu import SparseLaneLU, tiled_size


def _system(n=10, L=203, seed=4, storage="pattern"):
    rng = np.random.default_rng(seed)
    P = [[i == j or bool(rng.random() < 0.3) for j in range(n)] for i in range(n)]
    order = markowitz_ordering(P)
    F = lu_fill([[P[order[i]][order[j]] for j in range(n)] for i in range(n)])
    lu = SparseLaneLU(n, tuple((i, j) for i in range(n) for j in range(n) if F[i][j]), storage=storage)
    M = np.zeros((L, n, n))
    for r, c in lu.pattern:
        M[:, r, c] = rng.uniform(-1, 1, L)
    M[:, np.arange(n), np.arange(n)] += n + 1.0
    b = rng.standard_normal((n, L))
    return lu, M, b


def _tile(A, nnz, L, W):
    """Untiled q*L + l → ((l // W) * nnz + q) * W + l % W (last tile padded)."""
    out = np.zeros(tiled_size(nnz, L, W))
    q = np.arange(nnz)[:, None]
    l = np.arange(L)[None, :]
    out[((l // W) * nnz + q) * W + l % W] = A.reshape(nnz, L)
    return out


@pytest.mark.parametrize("W", [8, 64, 100, 203, 256])
def test_tiled_factor_and_solve_match_untiled_bitwise(W):
    lu, M, b = _system()
    L = M.shape[0]
    A = lu.pack(M)
    At = _tile(A, lu.nnz, L, W)
    x, xt = b.reshape(-1).copy(), b.reshape(-1).copy()
    lu.factor(A, L)
    lu.solve(A, x, L)
    lu.factor(At, L, tile=W)
    lu.solve(At, xt, L, tile=W)
    assert np.array_equal(_tile(A, lu.nnz, L, W), At)
    assert np.array_equal(x, xt)
    ref = np.linalg.solve(M, b.T[..., None])[..., 0].T
    np.testing.assert_allclose(xt.reshape(b.shape), ref, rtol=1e-12, atol=1e-12)


def test_tiled_bad_pivot_and_sizes():
    lu, M, b = _system(L=40)
    M[33] = 0.0                                    # a lane with an all-zero block
    At = _tile(lu.pack(M), lu.nnz, 40, 16)
    assert lu.factor_status(At, 40, tile=16) == (33, 0)
    with pytest.raises(JacError, match="length"):
        lu.factor(np.ones(lu.nnz * 40), 40, tile=16)   # 40 lanes in tiles of 16 need 48 per slot
    with pytest.raises(JacError, match="tile"):
        lu.factor(np.ones(lu.nnz * 40), 40, tile=0)


def _shifted(kernel, lu):
    """The fused assembly-and-factorisation kernels, one signature: the
    separate copy pass (factor_shifted_lanes) or row by row inside the
    elimination (factor_shifted_rows)."""
    from esmjac.linalg.sparse_lu import factor_shifted_lanes, factor_shifted_rows
    if kernel == "lanes":
        return factor_shifted_lanes
    return lambda *a: factor_shifted_rows(*a, *lu.row_ops())


@pytest.mark.parametrize("storage", ["pattern", "split"])
@pytest.mark.parametrize("wa", ["chunk", "vec"])
@pytest.mark.parametrize("kernel", ["lanes", "rows"])
@pytest.mark.parametrize("L, WJ", [(3, None), (203, 16), (600, 5), (600, None)])
def test_fused_shift_and_factor_matches_dense_and_separate_assembly(L, WJ, kernel, wa, storage):
    # factor_shifted_lanes / _rows read J in the Jacobian's tiles (WJ) and write
    # I/(h_l γ) − J in the LU's own tiles (WA = CHUNK, or one tile below it; or
    # VEC: whole tiles through the vector intrinsics, a partial last tile
    # through the loops, J's rows copied as runs when WJ = WA);
    # oracles: a dense NumPy solve per lane, and (bitwise) the separate
    # assembly followed by the serial factor_lanes on untiled storage (the
    # scalar loops: one tile of L lanes is never a whole VEC-lane tile here),
    # in either storage order of the slots.
    from esmjac.linalg.sparse_lu import CHUNK, VEC, factor_lanes, solve_lanes
    lu, M, b = _system(L=L, seed=7, storage=storage)
    factor_shifted_lanes = _shifted(kernel, lu)
    rng = np.random.default_rng(1)
    J = -lu.pack(M)                                     # so that −J is the well-conditioned M
    hs = rng.uniform(0.5, 50.0, L)
    gamma = 0.5
    W = L if WJ is None else WJ
    Jt = _tile(J, lu.nnz, L, W)
    WA = (CHUNK if L >= CHUNK else L) if wa == "chunk" else (VEC if L >= VEC else L)
    A = np.full(tiled_size(lu.nnz, L, WA), np.nan)      # nothing may read what is not written
    bad = np.zeros(L, np.int64)
    factor_shifted_lanes(Jt, W, A, WA, hs, gamma, lu.nnz, L, CHUNK, *lu.factor_ops(), bad)
    assert np.all(bad == -1)
    x = b.reshape(-1).copy()
    solve_lanes(A, x, lu.nnz, L, WA, CHUNK, *lu.solve_ops())
    Md = M + np.eye(lu.n)[None] / (hs * gamma)[:, None, None]
    ref = np.linalg.solve(Md, b.T[..., None])[..., 0].T
    np.testing.assert_allclose(x.reshape(b.shape), ref, rtol=1e-12, atol=1e-12)
    # separate assembly (−J, then += 1/(hγ) on the diagonal), untiled, serial
    B = -J.copy()
    B.reshape(lu.nnz, L)[lu.diag_slots] += 1.0 / (hs * gamma)
    factor_lanes(B, lu.nnz, L, L, CHUNK, *lu.factor_ops(), bad)
    y = b.reshape(-1).copy()
    solve_lanes(B, y, lu.nnz, L, L, CHUNK, *lu.solve_ops())
    from esmjac.layouts.types import untile
    assert np.array_equal(untile(A, lu.nnz, L, WA), B.reshape(lu.nnz, L))   # real lanes only
    assert np.array_equal(x, y)


@pytest.mark.parametrize("L, WJ, storage", [(203, 16, "pattern"), (600, 5, "pattern"), (20, 16, "pattern"),
                                            (203, 16, "split")])
def test_float32_factors_on_their_32_lane_vector_tiles(L, WJ, storage):
    # precision="mixed": float64 J in 16-lane tiles, float32 factors in tiles
    # of vec_lanes(float32) = 32 (whole tiles through the vector intrinsics
    # on <32 x float>, J's 16-lane runs negated and narrowed by one vector op
    # per slot; runs of 5 lanes, the partial last tile and a block below 32
    # lanes through the loops), then the mixed stage solve's float64
    # right-hand side. Oracles: a dense NumPy solve per lane, and bitwise the
    # separate assembly (−J rounded to float32, then + 1/(hγ) in float64,
    # rounded) factored and solved by the untiled scalar loops.
    from esmjac.layouts.types import untile
    from esmjac.linalg.sparse_lu import CHUNK, VEC, factor_lanes, factor_shifted_rows, solve_lanes, vec_lanes
    assert vec_lanes(np.float32) == 2 * VEC and vec_lanes(np.float64) == VEC
    lu, M, b = _system(L=L, seed=5, storage=storage)
    rng = np.random.default_rng(2)
    J = -lu.pack(M)
    hs, gamma = rng.uniform(0.5, 50.0, L), 0.5
    WA = 32 if L >= 32 else L
    A = np.full(tiled_size(lu.nnz, L, WA), np.nan, np.float32)
    bad = np.zeros(L, np.int64)
    factor_shifted_rows(_tile(J, lu.nnz, L, WJ), WJ, A, WA, hs, gamma, lu.nnz, L, CHUNK, *lu.factor_ops(), bad,
                        *lu.row_ops())
    assert np.all(bad == -1)
    B = (-J).astype(np.float32)                         # −J rounded, then the shift added in float64, rounded
    Bd = B.reshape(lu.nnz, L)
    Bd[lu.diag_slots] = (Bd[lu.diag_slots].astype(np.float64) + 1.0 / (hs * gamma)).astype(np.float32)
    factor_lanes(B, lu.nnz, L, L, CHUNK, *lu.factor_ops(), bad)
    assert np.array_equal(untile(A, lu.nnz, L, WA).view(np.int32), B.reshape(lu.nnz, L).view(np.int32))
    x, y = b.reshape(-1).copy(), b.reshape(-1).copy()
    solve_lanes(A, x, lu.nnz, L, WA, CHUNK, *lu.solve_ops())
    solve_lanes(B, y, lu.nnz, L, L, CHUNK, *lu.solve_ops())
    assert np.array_equal(x, y)
    Md = M + np.eye(lu.n)[None] / (hs * gamma)[:, None, None]
    ref = np.linalg.solve(Md, b.T[..., None])[..., 0].T
    np.testing.assert_allclose(x.reshape(b.shape), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("WA", [40, 16])
def test_row_by_row_assembly_reports_the_same_bad_pivots(WA):
    # a NaN Jacobian entry (lane 7) and a zero pivot (lane 30: J = I/(hγ) on
    # row 0, so its shifted diagonal is 0): both kernels flag the same lanes
    # and rows, and leave the other lanes bitwise equal (WA = 16: lanes 7 and
    # 30 in whole 16-lane tiles, the vector path; lanes 32-39 a partial tile)
    from esmjac.layouts.types import untile
    from esmjac.linalg.sparse_lu import CHUNK
    L, WJ, gamma = 40, 16, 0.5
    lu, M, b = _system(L=L, seed=3)
    J = -lu.pack(M)
    hs = np.full(L, 2.0)
    Jv = J.reshape(lu.nnz, L)
    Jv[lu.diag_slots[4], 7] = np.nan
    Jv[lu.diag_slots[0], 30] = 1.0 / (hs[30] * gamma)
    Jt = _tile(J, lu.nnz, L, WJ)
    out = []
    for kernel in ("lanes", "rows"):
        A = np.zeros(tiled_size(lu.nnz, L, WA))
        bad = np.zeros(L, np.int64)
        _shifted(kernel, lu)(Jt, WJ, A, WA, hs, gamma, lu.nnz, L, CHUNK, *lu.factor_ops(), bad)
        out.append((untile(A, lu.nnz, L, WA), bad))
    (A0, b0), (A1, b1) = out
    assert b0[7] >= 0 and b0[30] == 0 and np.sum(b0 >= 0) == 2
    assert np.array_equal(b0, b1)
    ok = b0 < 0
    assert np.array_equal(A0[:, ok], A1[:, ok])


@pytest.mark.parametrize("W", [5, 16])
def test_serial_narrow_tiles_match_untiled_bitwise(W):
    # the serial kernels the leaf runs: narrow tiles go through groups of
    # whole tiles (one op-list pass per CHUNK lanes); same bits per lane
    from esmjac.linalg.sparse_lu import CHUNK, factor_lanes, solve_lanes
    lu, M, b = _system(L=600, seed=9)
    L = 600
    A = lu.pack(M)
    At = _tile(A, lu.nnz, L, W)
    bad, badt = np.zeros(L, np.int64), np.zeros(L, np.int64)
    factor_lanes(A, lu.nnz, L, L, CHUNK, *lu.factor_ops(), bad)
    factor_lanes(At, lu.nnz, L, W, CHUNK, *lu.factor_ops(), badt)
    assert np.array_equal(_tile(A, lu.nnz, L, W), At) and np.array_equal(bad, badt)
    x, xt = b.reshape(-1).copy(), b.reshape(-1).copy()
    solve_lanes(A, x, lu.nnz, L, L, CHUNK, *lu.solve_ops())
    solve_lanes(At, xt, lu.nnz, L, W, CHUNK, *lu.solve_ops())
    assert np.array_equal(x, xt)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_transpose_solve_on_vector_tiles_matches_dense_and_untiled(dtype):
    # the adjoint's (LU)ᵀ x = b: vector tiles (vec_lanes: 16 lanes in float64,
    # 32 in float32; whole tiles through the rowscatter intrinsic, the
    # partial last tile of 5 lanes through the loops; float32 factors with a
    # float64 right-hand side, as the mixed leaf's replays) against a dense
    # NumPy solve of Mᵀ x = b per lane and, bitwise, the untiled scalar
    # loops on the same factors
    from esmjac.linalg.sparse_lu import CHUNK, factor_lanes, solve_transpose_lanes, vec_lanes
    V = vec_lanes(dtype)
    L = 2 * V + 5
    lu, M, b = _system(L=L, seed=12)
    A = lu.pack(M).astype(dtype)
    At = _tile(A, lu.nnz, L, V).astype(dtype)
    bad, badt = np.zeros(L, np.int64), np.zeros(L, np.int64)
    factor_lanes(A, lu.nnz, L, L, CHUNK, *lu.factor_ops(), bad)
    factor_lanes(At, lu.nnz, L, V, CHUNK, *lu.factor_ops(), badt)
    assert np.all(bad == -1) and np.all(badt == -1)
    x, xt = b.reshape(-1).copy(), b.reshape(-1).copy()
    solve_transpose_lanes(A, x, lu.nnz, L, L, *lu.solve_ops())
    solve_transpose_lanes(At, xt, lu.nnz, L, V, *lu.solve_ops())
    assert np.array_equal(x, xt)
    ref = np.linalg.solve(np.transpose(M, (0, 2, 1)), b.T[..., None])[..., 0].T
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(xt.reshape(b.shape), ref, rtol=tol, atol=tol)


def test_split_storage_layout_and_in_place_factor_and_solves_match_dense():
    # L and U stored apart (storage="split"), on a pattern with fill-in. The
    # layout as documented, built here from the pattern alone: L's entries
    # row by row, then rows n-1 .. 0 each with its strict upper entries and
    # its diagonal last; slot(), pack() and every op list in that order.
    # Then the leaf's path: J written in the LU's order straight into the
    # factorisation's 16-lane tiles and formed, shifted and factored in place
    # (J is A), the stage solves (rowdot2 pairs, a single rowdot tile, a
    # partial tile) and the transposed solves. Oracles: a dense NumPy solve
    # per lane, and bitwise the pattern storage's factors and solutions.
    from esmjac.integrators.lanestep import _stage_solve
    from esmjac.linalg.sparse_lu import CHUNK, factor_shifted_rows, solve_lanes, solve_transpose_lanes
    n, L, gamma = 10, 53, 0.5
    lp, M, b = _system(n=n, L=L, seed=21)
    ls = SparseLaneLU(n, lp.pattern, storage="split")
    pat = lp.pattern
    assert len(pat) > sum(1 for r, c in pat if r == c) + 10            # off-diagonal entries, fill-in among them
    want = [rc for rc in pat if rc[1] < rc[0]]
    for i in range(n - 1, -1, -1):
        want += [rc for rc in pat if rc[0] == i and rc[1] > i] + [(i, i)]
    assert [ls.slot(r, c) for r, c in want] == list(range(len(pat)))
    assert [lp.slot(r, c) for r, c in pat] == list(range(len(pat)))   # the default: the pattern's order
    assert ls.storage == "split" and np.array_equal(ls.position, [ls.slot(r, c) for r, c in pat])
    assert np.array_equal(ls.pack(M).reshape(len(pat), L), lp.pack(M).reshape(len(pat), L)[np.argsort(ls.position)])
    with pytest.raises(JacError, match="storage"):
        SparseLaneLU(n, pat, storage="columns")
    hs = np.random.default_rng(3).uniform(0.5, 50.0, L)
    Md = M + np.eye(n)[None] / (hs * gamma)[:, None, None]
    refx = np.linalg.solve(Md, b.T[..., None])[..., 0].T
    reft = np.linalg.solve(np.transpose(Md, (0, 2, 1)), b.T[..., None])[..., 0].T
    got = {}
    for lu in (lp, ls):
        A = _tile(-lu.pack(M), lu.nnz, L, 16)                         # J in the LU's order, 16-lane tiles
        bad = np.zeros(L, np.int64)
        factor_shifted_rows(A, 16, A, 16, hs, gamma, lu.nnz, L, CHUNK, *lu.factor_ops(), bad, *lu.row_ops())
        assert np.all(bad == -1)
        x, xt = b.reshape(-1).copy(), b.reshape(-1).copy()
        solve_lanes(A, x, lu.nnz, L, 16, CHUNK, *lu.solve_ops())
        solve_transpose_lanes(A, xt, lu.nnz, L, 16, *lu.solve_ops())
        np.testing.assert_allclose(x.reshape(b.shape), refx, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(xt.reshape(b.shape), reft, rtol=1e-12, atol=1e-12)
        # one stage solve as the leaf runs it (K0 = F, no other stage): K0 = W⁻¹ F
        K = np.zeros((1, n * L))
        ch, none, nz = np.zeros(L), np.zeros(0, np.int64), np.zeros(0)
        perm = np.arange(n, dtype=np.int64)
        perm.setflags(write=False)                                      # as perm_arrays gives it: one flavour
        _stage_solve(b.reshape(-1), K, 0, none, nz, hs, 0.0, np.zeros(n * L), perm, L, ch, A, lu.nnz, 16,
                     *lu.solve_ops(), b.reshape(-1), none, nz, np.zeros(n * L), False)
        np.testing.assert_allclose(K[0].reshape(b.shape), refx, rtol=1e-12, atol=1e-12)
        nt = -(-L // 16)
        got[lu.storage] = (A.reshape(nt, lu.nnz, 16)[:, lu.position], x, xt, K[0])
    for a, c in zip(got["pattern"], got["split"]):
        assert np.array_equal(a, c)
