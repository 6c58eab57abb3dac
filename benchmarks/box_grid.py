"""A box mechanism on a grid through the Dask adapter's block tasks (issue #23).

    python benchmarks/box_grid.py [--cells 2700] [--rounds 5]

The bundled ``box_nox.esm`` (12 species, 21 reactions; per-cell T, jNO2,
jO1D) on one chunk of ``cells`` cells (the README example's chunk: 15
latitude rows of 180). Per route, thread CPU seconds per call and per cell
(``time.thread_time``, one thread, best of interleaved rounds) after
checking that the routes give the same bits:

* ``rhs``: ``RhsProgram.eval_into`` over the chunk's lanes in this process,
  against the adapter's block task (``_maps._rhs_block``: spec lookup,
  per-thread scratch, forcing rows);
* ``advance``: the leaf (``integrators.leaf.rosenbrock``) over the chunk,
  against ``_advance._advance_block`` (the same leaf per chunk, plus the
  per-cell statistics rows), one 20-minute step.

The load average is recorded before and after (2 shared cores).
"""
from __future__ import annotations

import argparse
import json
import os
from importlib import resources

import numpy as np

PER_CELL = ["T", "jNO2", "jO1D"]


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def _best(fns: dict, rounds: int) -> dict:
    import time
    best = {k: float("inf") for k in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.thread_time()
            f()
            best[k] = min(best[k], time.thread_time() - t0)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=2700)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)

    from esmjac.adapters import dask as ejd
    from esmjac.adapters.dask import _advance, _maps
    from esmjac.integrators.leaf import rosenbrock
    from esmjac.runtime.programs import RhsProgram

    doc = json.loads(resources.files("esmjac.models").joinpath("box_nox.esm").read_text())
    W = args.cells
    r = RhsProgram.build(doc, options={"per_lane": PER_CELL})
    m = ejd.model(doc, per_cell=PER_CELL, cell_shape=(W,))
    rng = np.random.default_rng(0)
    u0 = np.asarray(r.u0).reshape(-1)
    u = u0[:, None] * rng.uniform(0.5, 1.5, (u0.size, W))
    f = np.stack([rng.uniform(240, 310, W), rng.uniform(0, 9e-3, W), rng.uniform(0, 4e-5, W)])
    bi = {None: {"array-location": [(0, u0.size), (0, W)]}}
    uf, ff = np.ascontiguousarray(u.ravel()), np.ascontiguousarray(f.ravel())
    sc = r.new_buffers(W)
    out = np.empty_like(uf)
    leaf = rosenbrock(doc, options={"per_lane": PER_CELL}, rtol=1e-3, threads=1)
    atol = _advance._box_atol(m)
    y = np.empty_like(uf)

    def one_rhs():
        return r.eval_into(uf, r.p0, 0.0, ff, out, sc)

    def block_rhs():
        return _maps._rhs_block(u, f, m.spec, m.p0, 0.0, 1, block_info=bi)

    def one_adv():
        y[:] = uf
        leaf.advance(y, 0.0, 1200.0, forcing=ff)
        return y

    def block_adv():
        return _advance._advance_block(u, f, m.spec, m.p0, 0.0, 1200.0, "rodas3", 1e-3, atol, 100000, 1,
                                       block_info=bi)

    # the same bits first
    assert np.array_equal(one_rhs().reshape(u.shape), block_rhs())
    assert np.array_equal(leaf._atol(None), atol), "the leaf's default atol differs from the adapter's"
    assert np.array_equal(one_adv().reshape(u.shape), block_adv()[:u0.size])
    load0 = _load()
    t = _best({"rhs_one_process": one_rhs, "rhs_block_task": block_rhs,
               "advance_one_process": one_adv, "advance_block_task": block_adv}, args.rounds)
    res = {"cells": W, "species": int(u0.size), "spec_bytes": len(m.spec.doc),
           "cpu_s_per_call": {k: round(v, 6) for k, v in t.items()},
           "cpu_us_per_cell": {k: round(v / W * 1e6, 3) for k, v in t.items()},
           "block_over_one_process": {"rhs": round(t["rhs_block_task"] / t["rhs_one_process"], 3),
                                      "advance": round(t["advance_block_task"] / t["advance_one_process"], 3)},
           "load_before": load0, "load_after": _load()}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
