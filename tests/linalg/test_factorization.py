"""The one block-LU variable order (linalg/factorization.py), by hand and
as every consumer sees it."""
from __future__ import annotations

import numpy as np

from esmjac.calculus.bandset import BandSet
from esmjac.layouts.types import LaneBlocks, LaneSparseBlocks
from esmjac.linalg.factorization import block_lu_plan, block_order
from esmjac.linalg.sparse_lu import SparseLaneLU
from tests.support.programs import TROPO12, jac_prog


def test_order_by_hand_ties_go_to_the_lowest_sorted_name():
    # Declared z, a, m; z and a couple each other, m stands alone.
    # Markowitz costs (nnz_row−1)(nnz_col−1): z 1·1, a 1·1, m 0 → m first;
    # then z and a tie at cost 0 and the lower *sorted* name (a) goes first.
    plan = block_order(["z", "a", "m"], [("z", "a"), ("a", "z")])
    assert plan.block_vars == ("m", "a", "z")
    assert plan.ordering == (1, 0, 2)               # into the sorted names a, m, z
    assert plan.positions(["z", "a", "m"]) == (2, 1, 0)   # into the declared order
    # Elimination coordinates: m, a, z → the a/z coupling at (1, 2) and (2, 1).
    assert plan.lu_pattern == ((0, 0), (1, 1), (1, 2), (2, 1), (2, 2))
    # The declared order never changes the plan.
    assert block_order(["m", "z", "a"], [("a", "z"), ("z", "a")]) == plan


def test_fill_in_by_hand():
    # A hub h coupled both ways to leaves x and y. Costs on the full
    # pattern: h 2·2, x 1·1, y 1·1 → x (lower sorted name than y). On the
    # updated pattern {h, y}: h 1·1, y 1·1 → h (sorted first). Eliminating
    # x then h fills nothing (h↔y already coupled).
    pairs = [("h", "x"), ("x", "h"), ("h", "y"), ("y", "h")]
    plan = block_order(["h", "x", "y"], pairs)
    assert plan.block_vars == ("x", "h", "y")
    assert plan.fill == 0
    # Eliminating the hub first would fill x↔y: two extra slots.
    assert len(block_order(["h", "x", "y"], pairs + [("x", "y"), ("y", "x")]).lu_pattern) == \
        len(plan.lu_pattern) + 2


def test_every_consumer_uses_the_emitted_order():
    # tropo12 declares its species in an order that is not sorted and on
    # which a declaration-order Markowitz breaks ties differently: the plans
    # must follow the emitted factorization (the goldens' order).
    bs = BandSet.build(TROPO12)
    emitted = block_lu_plan(bs.entries)
    prog = jac_prog("tropo12")
    states = prog.layout.states
    assert list(states) != sorted(states)
    for layout in (LaneSparseBlocks(), LaneBlocks("markowitz")):
        info = prog.plan(layout).info
        assert tuple(states[i] for i in info["ordering"]) == emitted.block_vars, layout
    sparse = prog.plan(LaneSparseBlocks()).info
    assert tuple(map(tuple, sparse["lu_pattern"])) == emitted.lu_pattern
    assert tuple(sparse["ordering"]) == emitted.positions(states)
    # The sparse LU accepts the pattern as it is (sorted, diagonal, closed).
    lu = SparseLaneLU(len(states), emitted.lu_pattern)
    assert lu.nnz == len(emitted.lu_pattern)


def test_permuted_block_is_the_natural_block_reordered():
    # LaneBlocks("markowitz") holds J[perm[i], perm[j]] at (i, j).
    prog = jac_prog("tropo12")
    nat, mk = prog.plan(LaneBlocks()), prog.plan(LaneBlocks("markowitz"))
    perm = np.asarray(mk.info["ordering"])
    L = prog.cells
    ws = prog.new_workspace()
    rng = np.random.default_rng(3)
    u = prog.u0 * rng.uniform(0.5, 1.5, prog.u0.size)
    a, b = np.empty(nat.out_size(L)), np.empty(mk.out_size(L))
    prog.eval_into(nat, u, prog.p0, 0.0, None, a, ws)
    prog.eval_into(mk, u, prog.p0, 0.0, None, b, ws)
    n = len(perm)
    A = a.reshape(n, n, L)
    B = b.reshape(n, n, L)
    assert np.array_equal(B, A[perm][:, perm])
