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


def _system(n=10, L=203, seed=4):
    rng = np.random.default_rng(seed)
    P = [[i == j or bool(rng.random() < 0.3) for j in range(n)] for i in range(n)]
    order = markowitz_ordering(P)
    F = lu_fill([[P[order[i]][order[j]] for j in range(n)] for i in range(n)])
    lu = SparseLaneLU(n, tuple((i, j) for i in range(n) for j in range(n) if F[i][j]))
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
