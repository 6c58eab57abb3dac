"""Defaults on a large lifted grid (model/layout.py): a scalar default is
evaluated once and broadcast, element overrides own a copy first.

Oracle: earthsci-ast's own problem (``esm_problem``) of the same document,
its initial state vector in its own order."""
from __future__ import annotations

import json
import warnings

import numpy as np

from esmjac.adapters.scipy import ivp
from esmjac.models.mechanism import lift
from tests.support.programs import TROPO12

CELLS = 40


def _doc(tmp_path):
    with open(TROPO12) as fh:
        doc = lift(json.load(fh), CELLS)
    path = tmp_path / "tropo12_lifted.esm"
    path.write_text(json.dumps(doc))
    return path


def _earthsci_y0(path):
    import earthsci_ast as ea
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prob = ea.esm_problem(str(path), (0.0, 1.0))
    b = prob.build if prob.build is not None else prob.scalar_build
    return np.asarray(b.y0, dtype=float).reshape(-1)


def test_broadcast_defaults_match_earthsci_ast_and_overrides_do_not_leak(tmp_path):
    path = _doc(tmp_path)
    want = _earthsci_y0(path)
    plain = ivp(path, threads=1)
    np.testing.assert_array_equal(plain.y0, want)
    names = list(plain.names)
    key = next(n for n in names if n.endswith("[7]"))         # one element of the first species
    moved = ivp(path, threads=1, y0={key: 123.0})
    i = names.index(key)
    expect = want.copy()
    expect[i] = 123.0
    np.testing.assert_array_equal(moved.y0, expect)
    # the override wrote its own copy: a fresh problem starts at the defaults again
    np.testing.assert_array_equal(ivp(path, threads=1).y0, want)
