"""Where the tests find things: the repository root and the reference data
(``../shared/reference`` beside the checkout), and the skip-or-fail rule for it."""
from __future__ import annotations

import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
REFERENCE = SHARED / "reference"
FIXTURES = REFERENCE / "fixtures"
GOLDENS = REFERENCE / "goldens"
GOLDEN_FIXTURES = ["adv_interior", "bd_chem", "contracted_ops", "flux_form_adv", "minmod_adv"]
ALL_FIXTURES = GOLDEN_FIXTURES + ["adv_react_2d", "coupled_chem_advection"]


def need_reference() -> pathlib.Path:
    """The reference folder; skip when absent (a user's clone), fail in CI where it must exist."""
    if not FIXTURES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the reference data at {REFERENCE}")
        pytest.skip(f"reference fixtures not found at {REFERENCE} (a clone without ../shared)")
    return REFERENCE
