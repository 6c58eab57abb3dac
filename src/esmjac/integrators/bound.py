"""The leaf's programs bound to fixed parameters and time for one worker
thread (the Rosenbrock leaf's steps and its sensitivities both run them):
one-thread kernels on the first ``m`` compact lanes, parameter-only values
(the prologue) hoisted once per binding, not per call. How a kernel is
called is the kernel's own (:meth:`esmjac.compile.engine.Kernel.bind_params`);
what is decided here is the leaf's: which kernel, and the scratch."""
from __future__ import annotations

import numpy as np

from ..compile.codegen import tile_scratch
from ..runtime import kernels as K

__all__ = ["bind_kernel", "BoundPrograms"]


def bind_kernel(kern, p: np.ndarray, t: float):
    """``f(u, fz, cix, m, out)``: ``kern`` on the first ``m`` lanes with
    parameters ``p`` and time ``t`` fixed, one-thread kernels; the
    parameter-only values (the prologue) are hoisted once here, not per
    call. ``out`` is the kernel's natural output (f values, or band slabs)."""
    return kern.bind_params(p, t, np.zeros(max(kern.n_hoist, 1)))


class BoundPrograms:
    """The programs bound to fixed parameters and time for one worker thread:
    ``rhs(u, fz, cix, m, out)`` and ``jac(u, fz, cix, m, out)`` on the first
    ``m`` compact lanes, one-thread kernels, parameter-only values hoisted
    once here (not per call)."""

    def __init__(self, leaf, p: np.ndarray, t: float, capacity: int, plan=None):
        rhs, jac = leaf.rhs_program, leaf.jac_program
        plan = leaf.plan if plan is None else plan
        self.rhs = bind_kernel(rhs.kernel, p, t)

        if jac.kernel.engine == "codegen":
            fk = jac.direct_kernel(plan)
            run = fk.bind_params(p, t, np.zeros(max(fk.n_hoist, 1)), fused=True)
            if fk.tile_scratch:         # tiled chunks take their scratch (one section: serial)
                W = plan.tile_width(capacity)
                scr = [np.empty(tile_scratch(fk.tile_scratch, capacity, W))]

                def j(u, fz, cix, m, out):
                    if scr[0].size < tile_scratch(fk.tile_scratch, m, W):   # a replay of more lanes
                        scr[0] = np.empty(tile_scratch(fk.tile_scratch, m, W))
                    run(u, fz, cix, m, out, scr[0])
            else:
                j = run
        elif plan.kind == "lane" and plan.tiled:
            # The tape engine's direct writes: the Jacobian tape stores
            # straight into the plan's tile slots (no band slab, no scatter
            # pass: on a 272-species mechanism the slab alone is ~24 kB per
            # lane written and read again), serial twin, one lane chunk per
            # call. Same instructions as the slab tape, so the same bits.
            j = jac.direct_tape(plan).bind_lanes(p, t, np.zeros(max(jac.kernel.n_hoist, 1)),
                                                 int(plan.info["slots_per_lane"]), plan.tile_width,
                                                 plan.capacity)
        else:
            slab = bind_kernel(jac.kernel, p, t)
            slabs = [np.zeros(max(jac.n_fields * capacity, 1))]

            def j(u, fz, cix, m, out):
                if slabs[0].size < jac.n_fields * m:          # a replay of more lanes than planned
                    slabs[0] = np.zeros(jac.n_fields * m)
                slab(u, fz, cix, m, slabs[0])
                K.scatter(plan, slabs[0], m, out)
        self.jac = j
