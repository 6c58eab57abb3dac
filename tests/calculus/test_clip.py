"""Region clipping and band re-merging (calculus/clip.py).

Oracles: hand-derived breakpoints, and pointwise evaluation of the
unclipped guard by the scalar evaluator — every clipped piece must agree
with the original expression at every row of its sub-range."""
from __future__ import annotations

import itertools

import pytest

from esmjac.calculus.bands import Band
from esmjac.calculus.clip import clip_regions, merge_bands
from esmjac.model.evaluate import ev
from esmjac.model.expr import from_wire


def _ifelse(cond, a, b):
    return {"op": "ifelse", "args": [cond, a, b]}


def _c(o, *args):
    return {"op": o, "args": list(args)}


VALUES = {"x": 1.5, "y": -2.0, "z": 7.0}


def _agrees_pointwise(body, ridx, rows, pieces):
    """Each piece covers its rows exactly once and equals ``body`` there."""
    covered = []
    for prow, pbody in pieces:
        for pt in itertools.product(*(range(lo, hi + 1) for lo, hi in prow)):
            env = dict(VALUES, **{n: float(v) for n, v in zip(ridx, pt) if isinstance(n, str)})
            assert ev(pbody, env) == ev(body, env), (pt, pbody)
            covered.append(pt)
    full = list(itertools.product(*(range(lo, hi + 1) for lo, hi in rows)))
    assert sorted(covered) == full


def test_one_guard_splits_at_its_breakpoint():
    # i > 2 on 1..5: false on 1..2, true on 3..5.
    body = from_wire(_ifelse(_c(">", "i", 2), "x", "y"))
    pieces = clip_regions(body, ["i"], [(1, 5)])
    assert pieces == [([(1, 2)], "y"), ([(3, 5)], "x")]
    _agrees_pointwise(body, ["i"], [(1, 5)], pieces)


def test_conjunction_of_affine_guards():
    # 2 <= i and i + 1 <= 4, i.e. 2 <= i <= 3: y, x, y on 1 | 2..3 | 4..5.
    body = from_wire(_ifelse(_c("and", _c(">=", "i", 2), _c("<=", _c("+", "i", 1), 4)), "x", "y"))
    pieces = clip_regions(body, ["i"], [(1, 5)])
    assert [p[0] for p in pieces] == [[(1, 1)], [(2, 3)], [(4, 5)]]
    assert [p[1] for p in pieces] == ["y", "x", "y"]
    _agrees_pointwise(body, ["i"], [(1, 5)], pieces)


def test_scaled_index_and_disjunction():
    # 2i >= 7 (i >= 4) or i < 2: true on 1, false on 2..3, true on 4..6.
    body = from_wire(_ifelse(_c("or", _c(">=", _c("*", 2, "i"), 7), _c("<", "i", 2)), "x", "z"))
    pieces = clip_regions(body, ["i"], [(1, 6)])
    assert [p[1] for p in pieces] == ["x", "z", "x"]
    _agrees_pointwise(body, ["i"], [(1, 6)], pieces)


def test_two_dimensions_cut_independently():
    body = from_wire(_c("+", _ifelse(_c(">", "i", 1), "x", "y"), _ifelse(_c("<=", "j", 2), "z", 0)))
    rows = [(1, 3), (1, 4)]
    pieces = clip_regions(body, ["i", "j"], rows)
    assert len(pieces) == 4
    _agrees_pointwise(body, ["i", "j"], rows, pieces)


def test_undecidable_guard_is_left_in_place():
    # A guard on a parameter (not a row index) cannot be decided statically:
    # one piece, the original expression (branch union, never wrong).
    body = from_wire(_ifelse(_c(">", "x", 0), "x", "y"))
    assert clip_regions(body, ["i"], [(1, 5)]) == [([(1, 5)], body)]
    # No row index at all (a scalar equation).
    assert clip_regions(body, [3], [(3, 3)]) == [([(3, 3)], body)]


def test_breakpoints_outside_the_range_do_not_cut():
    body = from_wire(_ifelse(_c(">", "i", 10), "x", "y"))
    pieces = clip_regions(body, ["i"], [(1, 5)])
    assert pieces == [([(1, 5)], "y")]


# ---------------------------------------------------------------- merging

def _band(rows, coef="x", ridx=("i",), cidx=("i",)):
    return Band(tuple(rows), tuple(ridx), tuple(cidx), coef)


def test_adjacent_equal_bands_merge_order_kept():
    a, b, c = _band([(1, 2)]), _band([(3, 5)]), _band([(6, 6)])
    other = _band([(1, 6)], coef="y")
    out = merge_bands([a, other, b, c])
    assert [(x.rows, x.coef) for x in out] == [(((1, 6),), "x"), (((1, 6),), "y")]


def test_gap_or_different_coefficient_does_not_merge():
    a, gap = _band([(1, 2)]), _band([(4, 5)])
    assert merge_bands([a, gap]) == [a, gap]
    b = _band([(3, 5)], coef="y")
    assert merge_bands([a, b]) == [a, b]


def test_merge_needs_exactly_one_differing_dimension():
    a = _band([(1, 2), (1, 1)], ridx=("i", "j"), cidx=("i", "j"))
    b = _band([(3, 4), (2, 2)], ridx=("i", "j"), cidx=("i", "j"))   # diagonal neighbour
    assert merge_bands([a, b]) == [a, b]
    c = _band([(3, 4), (1, 1)], ridx=("i", "j"), cidx=("i", "j"))
    (m,) = merge_bands([a, c])
    assert m.rows == ((1, 4), (1, 1))


@pytest.mark.parametrize("n", [0, 1])
def test_trivial_lists(n):
    bs = [_band([(1, 1)])] * n
    assert merge_bands(bs) == bs
