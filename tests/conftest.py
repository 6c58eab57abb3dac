"""Shared fixtures. Tests that read ../shared/ skip with a reason when it is
absent (a user's own clone) and fail loudly in CI, where it must exist."""
from __future__ import annotations

import warnings

import pytest

from tests.support.paths import FIXTURES, need_reference

warnings.filterwarnings("ignore", message=".*aggregate.*")


@pytest.fixture(scope="session")
def reference():
    return need_reference()


_bandsets: dict = {}


@pytest.fixture(scope="session")
def bandset():
    """Build (and share across tests) the BandSet of a reference fixture."""
    from esmjac.calculus.bandset import BandSet

    def get(fx: str, wrt: str = "states"):
        need_reference()
        key = (fx, wrt)
        if key not in _bandsets:
            _bandsets[key] = BandSet.build(FIXTURES / f"{fx}.esm", wrt=wrt)
        return _bandsets[key]

    return get
