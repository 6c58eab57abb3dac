"""Shared fixtures. Tests that read ../shared/ skip with a reason when it is
absent (a user's own clone) and fail loudly in CI, where it must exist."""
from __future__ import annotations

import os
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
FIXTURES = REFERENCE / "fixtures"
GOLDENS = REFERENCE / "goldens"
GOLDEN_FIXTURES = ["adv_interior", "bd_chem", "contracted_ops", "flux_form_adv", "minmod_adv"]
ALL_FIXTURES = GOLDEN_FIXTURES + ["adv_react_2d", "coupled_chem_advection"]

warnings.filterwarnings("ignore", message=".*aggregate.*")


def need_reference() -> pathlib.Path:
    if not FIXTURES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the reference data at {REFERENCE}")
        pytest.skip(f"reference fixtures not found at {REFERENCE} (a clone without ../shared)")
    return REFERENCE


@pytest.fixture(scope="session")
def reference() -> pathlib.Path:
    return need_reference()


_bandsets: dict = {}


@pytest.fixture(scope="session")
def bandset():
    """Build (and share across tests) the BandSet of a reference fixture."""
    from esmjac.bandset import BandSet

    def get(fx: str, wrt: str = "states"):
        need_reference()
        key = (fx, wrt)
        if key not in _bandsets:
            _bandsets[key] = BandSet.build(FIXTURES / f"{fx}.esm", wrt=wrt)
        return _bandsets[key]

    return get
