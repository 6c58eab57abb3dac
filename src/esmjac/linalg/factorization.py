"""Symbolic per-cell block LU: THE block-LU variable order and its fill-in.

For a ``block_diagonal`` Jacobian every cell carries the same ``n×n``
pattern; the plan fixes the elimination order and the no-pivoting LU
pattern (fill-in included) once, so an integrator can allocate and run a
straight-line LU (KPP style) with no symbolic work at run time. The
diagonal is always in the pattern (``W = I − γJ`` needs it).

The one order (:func:`block_order`; every consumer asks it): the block's
variables are sorted by name, then eliminated greedily by Markowitz cost
on that sorted pattern, ties to the lowest sorted position. The emitted
``factorization`` block (reference goldens), ``LaneBlocks(order=
"markowitz")``, ``LaneSparseBlocks``, :class:`~esmjac.linalg.sparse_lu.SparseLaneLU`
and the Rosenbrock integrator all use it. ``BlockLUPlan.ordering`` indexes
the *sorted* variables (the golden JSON's convention); a state vector is in
declaration order, so consumers take :meth:`BlockLUPlan.positions` of the
declared names — elimination position ``k`` holds declared variable
``positions(declared)[k]`` — never ``ordering`` directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["BlockLUPlan", "block_order", "block_lu_plan", "markowitz_ordering", "lu_fill"]


@dataclass(frozen=True)
class BlockLUPlan:
    """``block_vars`` in elimination order; patterns as sorted 0-based pairs
    in elimination coordinates (the same whatever order the variables were
    declared in)."""

    block_vars: tuple
    ordering: tuple        # 0-based permutation of the sorted variables
    pattern: tuple         # ((r, c), …) in permuted order
    lu_pattern: tuple      # pattern plus fill-in

    def positions(self, declared: Iterable[str]) -> tuple:
        """Elimination order as indices into ``declared`` (e.g. the model's
        states in declaration order: the ``perm`` of the Rosenbrock
        integrator and the ``ordering`` of a LaneSparseBlocks plan)."""
        where = {v: i for i, v in enumerate(declared)}
        return tuple(where[v] for v in self.block_vars)

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
    """No-pivoting symbolic LU of a boolean pattern (natural order): row
    ``i > k`` gains row ``k``'s columns ``> k`` where ``P[i][k]``, ``k``
    ascending (NumPy over whole rows: the same pattern as the triple loop,
    ~n³ Python steps at 272 species otherwise)."""
    A = np.array(P, dtype=bool).reshape(len(P), len(P))
    n = A.shape[0]
    for k in range(n):
        rows = A[k + 1:, k]
        if rows.any():
            A[k + 1:, k + 1:] |= rows[:, None] & A[k, k + 1:][None, :]
    return A.tolist()


def markowitz_ordering(P: list) -> list:
    """Greedy Markowitz: eliminate the row/column minimising
    (nnz_row − 1)(nnz_col − 1) on the symbolically updated pattern; ties go
    to the lowest index. (Counts and fill-in over NumPy rows: the order of
    the plain loops over the remaining indices, each step O(n²) in C.)"""
    A = np.array(P, dtype=bool).reshape(len(P), len(P))
    n = A.shape[0]
    alive = np.ones(n, dtype=bool)
    never = np.int64(n) * n + 1                  # above every cost
    order: list = []
    for _ in range(n):
        r = (A & alive[None, :]).sum(axis=1, dtype=np.int64) - 1    # per row, over remaining columns
        c = (A & alive[:, None]).sum(axis=0, dtype=np.int64) - 1    # per column, over remaining rows
        best = int(np.argmin(np.where(alive, r * c, never)))        # first minimum: lowest index
        order.append(best)
        alive[best] = False
        rows = alive & A[:, best]
        cols = alive & A[best, :]
        if rows.any() and cols.any():
            A |= rows[:, None] & cols[None, :]
    return order


def block_order(variables: Iterable[str], pairs: Iterable[tuple]) -> BlockLUPlan:
    """The block-LU plan of the ``variables`` (any order) whose block holds
    the ``(row name, column name)`` pairs (see the module docstring)."""
    names = sorted(set(variables))
    slot = {v: i for i, v in enumerate(names)}
    n = len(names)
    P = [[i == j for j in range(n)] for i in range(n)]
    for r, c in pairs:
        P[slot[r]][slot[c]] = True
    order = markowitz_ordering(P)
    Pp = [[P[order[i]][order[j]] for j in range(n)] for i in range(n)]
    L = lu_fill(Pp)
    pairs = tuple((i, j) for i, j in np.argwhere(np.array(Pp, dtype=bool).reshape(n, n)).tolist())
    lu = tuple((i, j) for i, j in np.argwhere(np.array(L, dtype=bool).reshape(n, n)).tolist())
    return BlockLUPlan(tuple(names[i] for i in order), tuple(order), pairs, lu)


def block_lu_plan(entries) -> BlockLUPlan:
    """The plan for a block-diagonal band list (the emitted ``factorization``)."""
    names = {e.row for e in entries} | {e.col for e in entries}
    return block_order(names, [(e.row, e.col) for e in entries])
