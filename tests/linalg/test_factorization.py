"""The block-LU order and fill-in (linalg/factorization.py) against the
plain loops that define them (written out here as the oracle): greedy
Markowitz with ties to the lowest index, and the no-pivoting symbolic LU,
on random patterns of every density, empty and full ones included."""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.linalg.factorization import block_order, lu_fill, markowitz_ordering


def _markowitz_loops(P: list) -> list:
    P = [row[:] for row in P]
    remaining = list(range(len(P)))
    order = []
    while remaining:
        best, bestcost = remaining[0], None
        for i in remaining:
            r = sum(1 for j in remaining if P[i][j]) - 1
            c = sum(1 for j in remaining if P[j][i]) - 1
            if bestcost is None or r * c < bestcost:
                best, bestcost = i, r * c
        order.append(best)
        rest = [i for i in remaining if i != best]
        for i in rest:
            if P[i][best]:
                for j in rest:
                    if P[best][j]:
                        P[i][j] = True
        remaining = rest
    return order


def _lu_fill_loops(P: list) -> list:
    P = [row[:] for row in P]
    n = len(P)
    for k in range(n):
        for i in range(k + 1, n):
            if P[i][k]:
                for j in range(k + 1, n):
                    if P[k][j]:
                        P[i][j] = True
    return P


@pytest.mark.parametrize("n", [0, 1, 2, 7, 23, 41])
@pytest.mark.parametrize("density", [0.0, 0.05, 0.2, 0.6, 1.0])
def test_order_and_fill_are_the_loops(n, density):
    rng = np.random.default_rng(n * 100 + int(density * 10))
    for diag in (True, False):
        A = rng.random((n, n)) < density
        if diag:
            np.fill_diagonal(A, True)
        P = A.tolist()
        order = markowitz_ordering(P)
        assert order == _markowitz_loops(P) and sorted(order) == list(range(n))
        Pp = [[P[order[i]][order[j]] for j in range(n)] for i in range(n)]
        F = lu_fill(Pp)
        assert F == _lu_fill_loops(Pp)
        assert all(type(v) is bool for row in F for v in row)
        assert P == A.tolist()                       # the inputs are not changed


def test_block_order_pairs_are_row_major():
    plan = block_order(["c", "a", "b"], [("a", "b"), ("c", "a"), ("b", "c")])
    n = 3
    assert list(plan.pattern) == sorted(plan.pattern) and all(type(i) is int for p in plan.pattern for i in p)
    assert set(plan.pattern) <= set(plan.lu_pattern) and len(plan.lu_pattern) <= n * n
