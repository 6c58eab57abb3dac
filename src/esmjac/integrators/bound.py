"""The leaf's programs bound to fixed parameters and time for one worker
thread (the Rosenbrock leaf's steps and its sensitivities both run them):
one-thread kernels on the first ``m`` compact lanes, parameter-only values
(the prologue) hoisted once per binding, not per call. How a kernel is
called is the kernel's own (:meth:`esmjac.compile.engine.Kernel.bind_params`);
what is decided here is the leaf's: which kernel, and the scratch."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..compile.codegen import tile_scratch
from ..compile.engine import NO_SLOTS, run_tapes
from .lanehoist import LaneSplit, split
from ..compile.massaction import BLOCK, UNTILED_BLOCK, run_poly, scratch_size
from .lanetape import run_fused
from ..compile.tape import run_tape
from ..compile.twins import serial_twin
from .._frozen import ro
from ..errors import JacError
from ..runtime import kernels as K

__all__ = ["bind_kernel", "BoundPrograms", "LaneHoist", "lane_hoist", "POLY"]

#: Whether a hoisted body that is a polynomial in the state runs on the
#: mass-action kernel (:mod:`esmjac.compile.massaction`) instead of the
#: lane tape; read when a leaf binds its programs (benchmarks compare both).
POLY = True


def bind_kernel(kern, p: np.ndarray, t: float):
    """``f(u, fz, cix, m, out)``: ``kern`` on the first ``m`` lanes with
    parameters ``p`` and time ``t`` fixed, one-thread kernels; the
    parameter-only values (the prologue) are hoisted once here, not per
    call. ``out`` is the kernel's natural output (f values, or band slabs)."""
    return kern.bind_params(p, t, np.zeros(max(kern.n_hoist, 1)))


class LaneHoist:
    """The leaf's tapes cut at the state (:mod:`esmjac.integrators.lanehoist`):
    the right-hand side's and the Jacobian's state-independent values (rate
    coefficients) become per-lane field rows after the program's own
    ``n_forcing`` rows — the right-hand side's first, then the Jacobian's —
    computed once per chemistry step by :meth:`BoundPrograms.lane_prologue`
    instead of in every call. ``rows`` is the number of rows added; the
    bodies read them, so their values keep the unsplit tapes' bits."""

    def __init__(self, rhs_tapes: tuple, jac_body, n_forcing: int, cache: bool = True):
        self.n_forcing = int(n_forcing)
        self.rhs: LaneSplit = split(rhs_tapes[1], self.n_forcing, cache)
        self.jac: LaneSplit = split(jac_body, self.n_forcing + self.rhs.rows, cache)
        self.rows = self.rhs.rows + self.jac.rows


def _per_m(fn: Callable[[int], int]) -> Callable[[int], int]:
    """``fn(m)`` remembered per lane count (a plan's tile width and capacity,
    asked on every Jacobian call with the block's few lane counts)."""
    memo: dict = {}

    def f(m: int) -> int:
        v = memo.get(m)
        if v is None:
            v = memo[m] = fn(m)
        return v
    return f


def lane_hoist(leaf, plan) -> LaneHoist | None:
    """The :class:`LaneHoist` of ``leaf``'s programs on ``plan``, or None
    when there is nothing to cut: generated-code programs (their rates are
    compiled inline; only taped programs are split) or no state-independent
    value. Cut once per leaf and plan (a Python pass over the tapes)."""
    rhs, jac = leaf.rhs_program, leaf.jac_program
    if rhs.kernel.engine != "tape" or jac.kernel.engine != "tape":
        return None
    memo = leaf.__dict__.setdefault("_lane_hoist", {})
    key = id(plan)
    if key not in memo:
        body = jac.direct_tape(plan).body if _direct(plan) else jac.kernel.tapes[1]
        hz = LaneHoist(rhs.kernel.tapes, body, len(rhs.forcing_names),
                       cache=bool((getattr(leaf, "options", None) or {}).get("cache", True)))
        memo[key] = (plan, hz if hz.rows else None)
    return memo[key][1]


def _direct(plan) -> bool:
    """Whether the tape Jacobian stores straight into ``plan``'s tile slots."""
    return plan.kind == "lane" and bool(plan.tiled)


class BoundPrograms:
    """The programs bound to fixed parameters and time for one worker thread:
    ``rhs(u, fz, cix, m, out)`` and ``jac(u, fz, cix, m, out)`` on the first
    ``m`` compact lanes, one-thread kernels, parameter-only values hoisted
    once here (not per call). With ``hoist`` (a :class:`LaneHoist`) the
    programs read the state-independent values from ``fz``'s rows after the
    program's own fields, which :meth:`lane_prologue` fills."""

    def __init__(self, leaf, p: np.ndarray, t: float, capacity: int, plan=None,
                 hoist: LaneHoist | None = None):
        rhs, jac = leaf.rhs_program, leaf.jac_program
        plan = leaf.plan if plan is None else plan
        p = ro(p)           # the one flavour every kernel takes its parameters in
        self.hoist = hoist
        self.lane_prologue: Callable[[np.ndarray, np.ndarray, int], None] | None = None
        #: Whether ``rhs`` takes its fields read-only (the program's own
        #: kernel: its build compiled that signature); the hoisted tapes
        #: run on the leaf's writable field rows.
        self.readonly_fields = hoist is None
        #: What runs the bodies: "poly" (the mass-action kernel), "lane tape"
        #: (``lanetape.run_fused``), or the programs' own engine ("tape",
        #: "codegen"); the Jacobian's with how it stores (benchmarks report it).
        self.engines = {"rhs": rhs.kernel.engine, "jac": jac.kernel.engine}
        if hoist is not None:
            self._bind_hoisted(leaf, p, t, plan, hoist, capacity)
            return
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
            self.engines["jac"] = "codegen, direct tile stores"
        elif plan.kind == "lane" and plan.tiled:
            # The tape engine's direct writes: the Jacobian tape stores
            # straight into the plan's tile slots (no band slab, no scatter
            # pass: on a 272-species mechanism the slab alone is ~24 kB per
            # lane written and read again), serial twin, one lane chunk per
            # call. Same instructions as the slab tape, so the same bits.
            j = jac.direct_tape(plan).bind_lanes(p, t, np.zeros(max(jac.kernel.n_hoist, 1)),
                                                 int(plan.info["slots_per_lane"]), plan.tile_width,
                                                 plan.capacity)
            self.engines["jac"] = "tape, direct tile stores"
        else:
            slab = bind_kernel(jac.kernel, p, t)
            slabs = [np.zeros(max(jac.n_fields * capacity, 1))]

            def j(u, fz, cix, m, out):
                if slabs[0].size < jac.n_fields * m:          # a replay of more lanes than planned
                    slabs[0] = np.zeros(jac.n_fields * m)
                slab(u, fz, cix, m, slabs[0])
                K.scatter(plan, slabs[0], m, out)
            self.engines["jac"] = f"{jac.kernel.engine}, slab + scatter"
        self.jac = j

    def _bind_hoisted(self, leaf, p, t, plan, hz: LaneHoist, capacity: int) -> None:
        """The split tapes bound like the unsplit ones (serial interpreter),
        and the lane prologue. The programs' own prologues (their
        parameter-only values, of ``p`` and ``t``, both fixed here) run once
        at the end of the binding, not in every call: on GEOS-Chem fullchem
        they were ≈ 36 µs per call, 2.7 µs per cell-step (same values, so the
        same bits)."""
        rhs, jac = leaf.rhs_program, leaf.jac_program
        run, t = serial_twin(run_tape), float(t)
        rpro = rhs.kernel.tapes[0]
        hr = np.zeros(max(rhs.kernel.n_hoist, 1))
        hj = np.zeros(max(jac.kernel.n_hoist, 1))
        rf, jf = hz.rhs.scheduled, hz.jac.scheduled
        if rf is None or jf is None:
            raise JacError("internal_error", "a hoisted leaf binding without its re-scheduled body tapes")

        def r(u, fz, cix, m, out):
            run_fused(rf.code, rf.consts, u, fz, p, t, hr, cix, out, m, rf.nreg, 0, 0, m, NO_SLOTS)
        self.rhs = r
        self.engines = {"rhs": "lane tape (hoisted rates)", "jac": "lane tape (hoisted rates)"}
        # -- the mass-action kernel's call sites (compile.massaction) ----
        rp, jp = (hz.rhs.poly, hz.jac.poly) if POLY else (None, None)
        if rp is not None:
            ra, rs = rp.arrays(), np.empty(scratch_size(rp, 0, UNTILED_BLOCK))

            def r(u, fz, cix, m, out):
                run_poly(*ra, u, fz, hr, p, out, m, 0, 0, m, NO_SLOTS, UNTILED_BLOCK, rs)
            self.rhs = r
            self.engines["rhs"] = "poly (mass-action kernel, hoisted rates)"
        if jp is not None and _direct(plan):
            ft = jac.direct_tape(plan)
            jpro, zs = ft.prologue, ft.zero_slots
            P, tile_width, cap = int(plan.info["slots_per_lane"]), _per_m(plan.tile_width), _per_m(plan.capacity)
            ja, js = jp.arrays(), np.empty(scratch_size(jp, tile_width(capacity)))

            def j(u, fz, cix, m, out):
                run_poly(*ja, u, fz, hj, p, out, m, tile_width(m), P, cap(m), zs, BLOCK, js)
            self.engines["jac"] = "poly (mass-action kernel, hoisted rates), direct tile stores"
        # -- the lane tape's ---------------------------------------------------
        elif _direct(plan):
            ft = jac.direct_tape(plan)
            jpro, zs = ft.prologue, ft.zero_slots
            P, tile_width, cap = int(plan.info["slots_per_lane"]), _per_m(plan.tile_width), _per_m(plan.capacity)

            def j(u, fz, cix, m, out):
                run_fused(jf.code, jf.consts, u, fz, p, t, hj, cix, out, m, jf.nreg, tile_width(m), P, cap(m),
                          zs)
            self.engines["jac"] = "lane tape (hoisted rates), direct tile stores"
        else:
            jpro = jac.kernel.tapes[0]
            slabs = [np.zeros(max(jac.n_fields * capacity, 1))]

            def j(u, fz, cix, m, out):
                if slabs[0].size < jac.n_fields * m:
                    slabs[0] = np.zeros(jac.n_fields * m)
                run_fused(jf.code, jf.consts, u, fz, p, t, hj, cix, slabs[0], m, jf.nreg, 0, 0, m, NO_SLOTS)
                K.scatter(plan, slabs[0], m, out)
            self.engines["jac"] = "lane tape (hoisted rates), slab + scatter"
        self.jac = j
        # the programs' prologues, once (one lane; they read neither state nor fields)
        u1, f1 = ro(np.zeros(max(leaf.n_species, 1))), ro(np.zeros(max(len(rhs.forcing_names) + hz.rows, 1)))
        c1 = np.zeros(max(len(rhs.layout.cell_shape), 1), dtype=np.int64)
        for pro, h in ((rpro, hr), (jpro, hj)):
            run(pro.code, pro.consts, u1, f1, p, t, h, c1, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
        parts = [(pro, cut.prologue, h) for cut, pro, h in ((hz.rhs, rpro, hr), (hz.jac, jpro, hj))
                 if cut.prologue is not None]

        def lane_prologue(fz, cix, m):
            """Rows ``n_forcing..`` of ``fz`` (stride ``m``) from its first rows."""
            for pro, lp, h in parts:
                run_tapes(run, (pro, lp), fz, fz, p, t, h, cix, fz, m)
        self.lane_prologue = lane_prologue
