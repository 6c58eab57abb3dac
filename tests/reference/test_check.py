"""Every reference fixture against central finite differences of the
ecosystem's own RHS (earthsci_ast.evaluate_rhs) at three random points."""
from __future__ import annotations

import pytest

from tests.support.paths import ALL_FIXTURES
from esmjac.reference.check import fd_check


@pytest.mark.parametrize("fx", ALL_FIXTURES)
def test_fixture_matches_finite_differences(fx, bandset):
    rep = fd_check(bandset(fx), points=3, seed=7)
    assert not rep.uncovered, rep.uncovered[:5]
    assert rep.ok, rep.summary()
    assert rep.nnz > 0
