"""Sensitivities replay on the leaf's own tiled storage (issue #25 item 4).

The adjoint and the tangent replay every recorded step with the Jacobian in
the leaf's lane tiles (its LaneSparseBlocks plan) and the iteration matrix
in the factorization's tiles, as the forward step stores them. Oracles: the
untiled leaf (``tile=None``: one tile of a record's lanes) gives the same
bits — each lane's arithmetic does not depend on the tiling — and central
finite differences of the replayed forward map (the function the discrete
adjoint differentiates).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from esmjac.adapters.native import rosenbrock
from esmjac.models.mechanism import lift
from tests.support.leafgrid import heterogeneous_grid
from tests.support.programs import TROPO12

LANES = 40          # three tiles of 16 (the last padded), eight of 5
T_END = 300.0


@pytest.fixture(scope="module")
def doc40():
    return lift(json.loads(TROPO12.read_text()), LANES)


def _phi(lf, u, fj, w):
    """φ(u0) = w·y(T) over the forward solve's recorded steps (replayed)."""
    rec: list = []
    y = u.copy()
    lf._advance(y, 0.0, T_END, fj, None, None, rec)
    fz, cix = rec.pop()
    sens = lf._sensitivities(False)

    def phi(u0):
        a = u0.copy()
        sens.replay(rec, a, fz, cix, LANES)
        return float(w @ a)
    return rec, phi


@pytest.mark.slow
@pytest.mark.parametrize("method", ["rodas3", "ros34pw2"])
def test_tiled_sensitivities_are_the_untiled_bits_and_match_fd(doc40, method):
    leaves = {tile: rosenbrock(doc40, method=method, rtol=1e-4, threads=1, tile=tile) for tile in (16, 5, None)}
    u, fj = heterogeneous_grid(leaves[None], LANES, seed=3)
    rng = np.random.default_rng(4)
    w = rng.uniform(0.5, 1.5, u.size) / np.abs(u).clip(1.0)
    d = rng.standard_normal(u.size) * np.abs(u)
    got = {}
    for tile, lf in leaves.items():
        sens = lf._sensitivities(True)
        assert sens.plan is lf.plan                        # the leaf's own storage, no untiled copy
        assert sens.plan.tile == tile
        y, g, gp, st = lf.gradient(u, 0.0, T_END, w, forcing=fj)
        assert st.success
        _, dy, _ = lf.tangent(u, 0.0, T_END, du0=d, dp={"T": 1.0}, forcing=fj)
        got[tile] = (y, g, gp, dy)
    y0, g0, gp0, dy0 = got[None]
    for tile in (16, 5):
        y, g, gp, dy = got[tile]
        assert np.array_equal(y, y0) and np.array_equal(g, g0) and np.array_equal(dy, dy0), tile
        assert gp.keys() == gp0.keys()
        assert all(np.array_equal(gp[k], gp0[k]) for k in gp0), tile
    # the tiled gradient and tangent against finite differences of the replayed map
    lf = leaves[16]
    rec, phi = _phi(lf, u, fj, w)
    if method == "ros34pw2":
        assert sum(int((~r[3]).sum()) for r in rec) > 20       # many steps on a kept Jacobian
    assert phi(u) == float(w @ got[16][0])                     # the replay is the forward solve
    _, g, gp, dy = got[16]
    for _ in range(2):
        e = rng.standard_normal(u.size) * np.abs(u)
        eps = 1e-6
        fd = (phi(u + eps * e) - phi(u - eps * e)) / (2 * eps)
        assert abs(g @ e - fd) <= 1e-6 * abs(fd), (g @ e, fd)
    _, dy2, _ = lf.tangent(u, 0.0, T_END, du0=e, forcing=fj)
    assert abs(w @ dy2 - fd) <= 1e-6 * abs(fd), (w @ dy2, fd)
    assert abs(w @ dy - (g @ d + gp["T"])) <= 1e-10 * abs(w @ dy)     # the two are exact transposes
