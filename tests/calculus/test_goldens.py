"""Byte parity with the reference goldens, and the pinned Jacobian values."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import GOLDEN_FIXTURES, GOLDENS, FIXTURES, need_reference
from esmjac.reference.oracle import assemble


@pytest.mark.parametrize("fx", GOLDEN_FIXTURES)
def test_bands_byte_identical(fx, bandset):
    need_reference()
    want = (GOLDENS / f"{fx}.bands.json").read_text().rstrip("\n")
    assert bandset(fx).entries_json() == want


@pytest.mark.parametrize("fx", GOLDEN_FIXTURES)
def test_block_byte_identical(fx, bandset):
    need_reference()
    want = (GOLDENS / f"{fx}.block.json").read_text().rstrip("\n")
    assert bandset(fx).block_json() == want


@pytest.mark.slow
def test_cli_prints_the_golden_bytes():
    need_reference()
    fx = "contracted_ops"
    for kind in ("bands", "block"):
        out = subprocess.run([sys.executable, "-m", "esmjac", kind, str(FIXTURES / f"{fx}.esm")],
                             capture_output=True, text=True, check=True).stdout
        assert out.rstrip("\n") == (GOLDENS / f"{fx}.{kind}.json").read_text().rstrip("\n")


@pytest.mark.parametrize("fx", GOLDEN_FIXTURES)
def test_jvals_keys_and_values(fx, bandset):
    need_reference()
    g = json.loads((GOLDENS / f"{fx}.jvals.json").read_text())
    a = assemble(bandset(fx), u=g["u"], p=g["params"], t=g["t"])
    m = a.matrix.tocoo()
    scope = bandset(fx).view.scope
    got = {(a.rows[i][len(scope):], a.cols[j][len(scope):]): v for i, j, v in zip(m.row, m.col, m.data)}
    want = {(r, c): v for r, c, v in g["entries"]}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-10, abs=1e-300), k
