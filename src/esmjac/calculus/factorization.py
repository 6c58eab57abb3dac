"""Symbolic per-cell block LU: greedy Markowitz ordering and fill-in.

For a ``block_diagonal`` Jacobian every cell carries the same ``n×n``
pattern; the plan fixes the elimination order and the no-pivoting LU
pattern (fill-in included) once, so an integrator can allocate and run a
straight-line LU (KPP style) with no symbolic work at run time. The
diagonal is always in the pattern (``W = I − γJ`` needs it).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BlockLUPlan", "block_lu_plan", "markowitz_ordering", "lu_fill"]


@dataclass(frozen=True)
class BlockLUPlan:
    """``block_vars`` in elimination order; patterns as sorted 0-based pairs."""

    block_vars: tuple
    ordering: tuple        # 0-based permutation of the sorted variables
    pattern: tuple         # ((r, c), …) in permuted order
    lu_pattern: tuple      # pattern plus fill-in

    def to_json(self) -> dict:
        return {
            "type": "block_diagonal_lu",
            "block_vars": list(self.block_vars),
            "ordering": [i + 1 for i in self.ordering],
            "pattern": [[r + 1, c + 1] for r, c in self.pattern],
            "lu_pattern": [[r + 1, c + 1] for r, c in self.lu_pattern],
        }

    @property
    def fill(self) -> int:
        return len(self.lu_pattern) - len(self.pattern)


def lu_fill(P: list) -> list:
    """No-pivoting symbolic LU of a boolean pattern (natural order)."""
    P = [row[:] for row in P]
    n = len(P)
    for k in range(n):
        for i in range(k + 1, n):
            if P[i][k]:
                for j in range(k + 1, n):
                    if P[k][j]:
                        P[i][j] = True
    return P


def markowitz_ordering(P: list) -> list:
    """Greedy Markowitz: eliminate the row/column minimising
    (nnz_row − 1)(nnz_col − 1) on the symbolically updated pattern; ties go
    to the lowest index."""
    P = [row[:] for row in P]
    remaining = list(range(len(P)))
    order = []
    while remaining:
        best, bestcost = remaining[0], None
        for i in remaining:
            r = sum(1 for j in remaining if P[i][j]) - 1
            c = sum(1 for j in remaining if P[j][i]) - 1
            cost = r * c
            if bestcost is None or cost < bestcost:
                best, bestcost = i, cost
        order.append(best)
        rest = [i for i in remaining if i != best]
        for i in rest:
            if P[i][best]:
                for j in rest:
                    if P[best][j]:
                        P[i][j] = True
        remaining = rest
    return order


def block_lu_plan(entries) -> BlockLUPlan:
    """The plan for a block-diagonal band list (variables sorted by name)."""
    names = sorted({e.row for e in entries} | {e.col for e in entries})
    slot = {v: i for i, v in enumerate(names)}
    n = len(names)
    P = [[i == j for j in range(n)] for i in range(n)]
    for e in entries:
        P[slot[e.row]][slot[e.col]] = True
    order = markowitz_ordering(P)
    Pp = [[P[order[i]][order[j]] for j in range(n)] for i in range(n)]
    L = lu_fill(Pp)
    pairs = tuple((i, j) for i in range(n) for j in range(n) if Pp[i][j])
    lu = tuple((i, j) for i in range(n) for j in range(n) if L[i][j])
    return BlockLUPlan(tuple(names[i] for i in order), tuple(order), pairs, lu)
