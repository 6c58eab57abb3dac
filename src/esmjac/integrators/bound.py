"""The leaf's programs bound to fixed parameters and time for one worker
thread (the Rosenbrock leaf's steps and its sensitivities both run them):
one-thread kernels on the first ``m`` compact lanes, parameter-only values
(the prologue) hoisted once per binding, not per call."""
from __future__ import annotations

import numpy as np

from ..compile.codegen import tile_scratch
from ..runtime import kernels as K

__all__ = ["bind_kernel", "BoundPrograms"]


def bind_kernel(prog, kern, p: np.ndarray, t: float):
    """``f(u, fz, cix, m, out)``: ``kern`` of ``prog`` on the first ``m``
    lanes with parameters ``p`` and time ``t`` fixed, one-thread kernels;
    the parameter-only values (the prologue) are hoisted once here, not per
    call. ``out`` is the kernel's natural output (f values, or band slabs)."""
    h = np.zeros(max(kern.n_hoist, 1))
    if kern.engine == "codegen":
        mod = kern.module()
        mod.prologue(p, float(t), h)
        fns = [(getattr(mod, "s" + name), kind == "cell") for name, kind in zip(kern.chunks, kern.chunk_kinds)]

        def f(u, fz, cix, m, out):
            for fn, cell in fns:
                if cell:
                    fn(u, fz, h, cix, out, m)
                else:
                    fn(u, fz, h, out)
        return f

    if kern.engine == "tape":
        # The serial twin of the tape interpreter (the program's own run
        # launches the parallel one, whose region start-up and barrier cost
        # more than a 64-lane block's arithmetic — measured 10x on a loaded
        # machine); the same instructions, so the same bits.
        from ..compile.tape import run_tape
        from ..runtime.bound import serial_twin
        tape = serial_twin(run_tape)
        pro, body = kern.tapes
        tf = float(t)
        none = np.zeros(0, np.int64)

        def f(u, fz, cix, m, out):
            tape(pro.code, pro.consts, u, fz, p, tf, h, cix, h, 1, pro.nreg, 0, 0, 1, none)
            tape(body.code, body.consts, u, fz, p, tf, h, cix, out, m, body.nreg, 0, 0, m, none)
        return f

    def f(u, fz, cix, m, out):
        prog._run(kern, u, p, t, fz, out, h, cix, m)
    return f


class BoundPrograms:
    """The programs bound to fixed parameters and time for one worker thread:
    ``rhs(u, fz, cix, m, out)`` and ``jac(u, fz, cix, m, out)`` on the first
    ``m`` compact lanes, one-thread kernels, parameter-only values hoisted
    once here (not per call)."""

    def __init__(self, leaf, p: np.ndarray, t: float, capacity: int, plan=None):
        rhs, jac = leaf.rhs_program, leaf.jac_program
        plan = leaf.plan if plan is None else plan
        self.rhs = bind_kernel(rhs, rhs.kernel, p, t)

        if jac.kernel.engine == "codegen":
            fk = jac._fused_kernel(plan)
            mod = fk.module()
            hj = np.zeros(max(fk.n_hoist, 1))
            mod.prologue(p, float(t), hj)
            jfns = [getattr(mod, "sfl" + name) for name in fk.chunks]
            if fk.tile_scratch:         # tiled chunks take their scratch (one section: serial)
                W = plan.tile_width(capacity)
                scr = [np.empty(tile_scratch(fk.tile_scratch, capacity, W))]

                def j(u, fz, cix, m, out):
                    if scr[0].size < tile_scratch(fk.tile_scratch, m, W):   # a replay of more lanes
                        scr[0] = np.empty(tile_scratch(fk.tile_scratch, m, W))
                    for fn in jfns:
                        fn(u, fz, hj, cix, out, m, scr[0])
            else:
                def j(u, fz, cix, m, out):
                    for fn in jfns:
                        fn(u, fz, hj, cix, out, m)
        elif plan.kind == "lane" and plan.tiled:
            # The tape engine's direct writes: the Jacobian tape stores
            # straight into the plan's tile slots (no band slab, no scatter
            # pass: on a 272-species mechanism the slab alone is ~24 kB per
            # lane written and read again), serial twin, one lane chunk per
            # call. Same instructions as the slab tape, so the same bits.
            from ..compile.tape import run_tape
            from ..runtime.bound import serial_twin
            ft = jac._fused_tape(plan)
            tape = serial_twin(run_tape)
            pro, tb, zs = ft.prologue, ft.body, ft.zero_slots
            hj = np.zeros(max(jac.kernel.n_hoist, 1))
            P = int(plan.info["slots_per_lane"])
            tf = float(t)

            def j(u, fz, cix, m, out):
                tape(pro.code, pro.consts, u, fz, p, tf, hj, cix, hj, 1, pro.nreg, 0, 0, 1, zs[:0])
                tape(tb.code, tb.consts, u, fz, p, tf, hj, cix, out, m, tb.nreg, plan.tile_width(m), P,
                     plan.capacity(m), zs)
        else:
            jk = jac.kernel
            hj = np.zeros(max(jk.n_hoist, 1))
            slabs = [np.zeros(max(jac.n_fields * capacity, 1))]

            def j(u, fz, cix, m, out):
                if slabs[0].size < jac.n_fields * m:          # a replay of more lanes than planned
                    slabs[0] = np.zeros(jac.n_fields * m)
                jac._run(jk, u, p, t, fz, slabs[0], hj, cix, m)
                K.scatter(plan, slabs[0], m, out)
        self.jac = j
