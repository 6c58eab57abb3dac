"""The native Rosenbrock leaf: what an operator-split host model calls for its
chemistry step (docs/design.rst §12).

``leaf = rosenbrock(source)`` builds the right-hand side and the Jacobian
(LaneSparseBlocks, Markowitz order, fill-in slots) of a per-cell mechanism
once; ``leaf.advance(u, t0, dt, forcing=...)`` then integrates every lane of
``u`` (species-major, lanes fastest: ``u[s*L + l]``, ``L = u.size //
n_species``) over ``[t0, t0 + dt]``, in place or into ``out``, each lane with
its own step size (:mod:`esmjac.integrators.lanestep`). One build serves any
lane count; scratch is allocated once per lane count and reused, so a host
model's time loop allocates nothing per call.

Parallelism and blocking: lanes are split into contiguous blocks of at most
:data:`BLOCK_LANES` (so a block's working set stays in cache through a step),
at least one per worker thread; each thread integrates its blocks one after
the other, each block independently (its own compaction, no barrier per
kernel), in one scratch per thread (memory does not grow with the grid).
The compiled programs run their one-thread twins inside each block. Because
every lane's arithmetic is independent of its neighbours, the bits do not
depend on ``threads``.
"""
from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..compile.cache import one_document
from ..errors import JacError
from ..layouts.types import DEFAULT_TILE, LaneSparseBlocks
from ..linalg.sparse_lu import CHUNK, SparseLaneLU
from ..model.layout import key_base
from ..model.timefield import time_as_parameter
from ..runtime import checks
from ..runtime.programs import JacobianProgram, RhsProgram, model_view, reads_time
from ..runtime import progress as _progress
from ..runtime.progress import Task, task
from ..runtime.threads import numba_threads, pin_one_thread, worker_count
from ..runtime.workspace import lane_cells
from .bound import BoundPrograms, lane_hoist
from .lanestep import RUNNING, STATUS, LaneStepper
from .sensitivity import Sensitivities
from .tableaux import METHODS, Tableau, perm_arrays

__all__ = ["rosenbrock", "RosenbrockLeaf", "LeafStats", "LeafSolution", "ATOL_FRACTION",
           "AUTO_LANES_PER_THREAD", "BLOCK_LANES", "BLOCK_BYTES", "PRECISIONS", "block_lanes"]

#: Default absolute tolerance per species: this fraction of the species'
#: scale (the largest magnitude of its default initial state over the
#: document's cells; species whose default is 0 take 1e-6 of the largest
#: species' scale). Units follow the model's (molecules cm⁻³, ppb, …).
ATOL_FRACTION = 1e-6

#: ``threads="auto"`` gives each worker thread at least this many lanes
#: (below it a second thread costs more in start-up than it saves).
AUTO_LANES_PER_THREAD = 1024

#: Whether a leaf whose Jacobian is taped stores its iteration matrix with
#: ``L`` and ``U`` apart (:class:`~esmjac.linalg.sparse_lu.SparseLaneLU`'s
#: ``storage="split"``: both triangular sweeps of the stage solves stream
#: forward through memory; the same bits). Read when a leaf is built
#: (benchmarks and tests compare both). Generated-code Jacobians keep the
#: pattern's order: their slot stores are compiled constants, and a second
#: order would compile a second module per model.
SPLIT = True

#: A W-method lane's Jacobian serves at most this many accepted steps by
#: default (``max_jac_age``), and its factorisation is kept — the step held
#: at the factorisation's — while the controller proposes a step within
#: ``HOLD`` times it (``hold``). Chosen by measurement on GEOS-Chem fullchem
#: (64 cells, rtol 1e-3; benchmarks/RESULTS.md "W"): older Jacobians (8, 20
#: steps) passed the error test yet left 2–9× the error of a fresh one
#: against the reference — the embedded estimate does not see all of a
#: stale Jacobian's error in the stiff components —; at 5 the error equals
#: Rodas3's at rtol 3e-4 with 0.6 Jacobians+LUs per accepted step.
MAX_JAC_AGE = 5
HOLD = (1.0, 3.0)

#: Lanes per block at most: a block's whole working set (Jacobian, iteration
#: matrix, stages, states: ≈ 1.5 kB per lane for a 15-species mechanism)
#: stays in the core's caches through a step instead of streaming from memory
#: once per kernel; a thread integrates its blocks one after the other, each
#: with its own compaction. Chosen by measurement (benchmarks/leaf.py
#: "per step"); bits do not depend on it (lanes never mix).
BLOCK_LANES = 1024

#: A block's working set at most (bytes): large mechanisms get fewer lanes
#: per block than :data:`BLOCK_LANES` so that the block's Jacobian,
#: iteration matrix and stage vectors stay in the last-level cache through a
#: step (a 272-species cell holds ≈ 90 kB: 64 lanes, not 1,024, whose 90 MB
#: streamed from memory once per stage solve; benchmarks/realworkload.py).
#: Bits do not depend on it.
BLOCK_BYTES = 8 << 20

#: ``precision=`` values: ``"double"`` (float64 throughout) or ``"mixed"``
#: (the iteration matrix stored and factored in float32, its triangular
#: solves accumulated in float64; states, stages, error norm and the
#: Jacobian in float64).
PRECISIONS = {"double": np.float64, "mixed": np.float32}


#: Whether an advance groups its lanes into blocks by their step counts in
#: the previous advance of the same lane count (:func:`_lane_order`). A block
#: steps until its slowest lane is done, and a block attempt's kernels cost
#: much the same on a few lanes as on all of them (on GEOS-Chem fullchem, one
#: RHS call ≈ 66 µs + 1 µs per lane, one Jacobian ≈ 190 µs + 3 µs per lane):
#: lanes that need as many steps finish together. Bits do not depend on it
#: (no kernel mixes lanes), nor do the per-lane statistics.
ORDER_LANES = True


def _lane_order(nsteps: np.ndarray):
    """The lanes by their step counts (stable: ties keep grid order), or None
    when there is no previous advance (all counts 0) or all counts are equal."""
    if nsteps.size < 2:
        return None
    lo, hi = int(nsteps.min()), int(nsteps.max())
    if lo == hi:
        return None
    return np.argsort(nsteps, kind="stable")


def block_lanes(n: int, nnz: int, stages: int, n_forcing: int) -> int:
    """Lanes per block for a mechanism of ``n`` species and ``nnz`` LU slots:
    :data:`BLOCK_LANES`, or fewer (a power of two, at least 16) when a
    block's working set — Jacobian and iteration matrix slots, ``stages``
    stage vectors and about eight state-sized vectors, the forcing — would
    exceed :data:`BLOCK_BYTES`."""
    per_lane = 8 * (2 * nnz + (stages + 8) * n + n_forcing)
    cap = max(16, BLOCK_BYTES // max(per_lane, 1))
    lanes = 16
    while lanes * 2 <= min(cap, BLOCK_LANES):
        lanes *= 2
    return min(lanes, BLOCK_LANES)


#: Lazily compiled paths already run in this process, per leaf programs
#: (:meth:`RosenbrockLeaf._first`): their first call says it compiles.
_LAZY_DONE: set = set()

#: The per-lane counters of :class:`LeafStats` (summed by ``totals``).
_COUNTERS = ("nsteps", "naccept", "nreject", "nfev", "njev", "ndec")


@dataclass
class LeafStats:
    """Per-lane outcome of one :meth:`RosenbrockLeaf.advance` (arrays of
    length ``L``, lane order). They are the leaf's own buffers, overwritten
    by the next call with the same lane count: copy what you keep.

    ``status``: 0 ok, > 0 failed (:data:`esmjac.integrators.lanestep.STATUS`);
    ``nsteps``: step attempts (``naccept + nreject``); ``nfev``/``njev``/
    ``ndec``: right-hand side / Jacobian evaluations / LU factorisations of
    that lane (a W-method that reuses its Jacobian and LU makes fewer than
    one per attempt; the others make one each); ``h``: the step size
    proposed for a continuation (pass it back as ``h0``); ``t``: the time the
    lane's state belongs to (``t0 + dt`` unless it failed).
    """

    status: np.ndarray
    nsteps: np.ndarray
    naccept: np.ndarray
    nreject: np.ndarray
    nfev: np.ndarray
    njev: np.ndarray
    ndec: np.ndarray
    h: np.ndarray
    t: np.ndarray

    @property
    def success(self) -> bool:
        """True when every lane reached the end of the interval."""
        return not bool(np.any(self.status != 0))

    @property
    def failed(self) -> np.ndarray:
        """Lane indices that failed (their state is the last accepted one)."""
        return np.flatnonzero(self.status != 0)

    @property
    def message(self) -> str:
        bad = self.failed
        if bad.size == 0:
            return f"all {self.status.size} lanes reached the end"
        codes = {int(c): int((self.status == c).sum()) for c in np.unique(self.status[bad])}
        parts = ", ".join(f"{k} lane(s): {STATUS.get(c, c)}" for c, k in codes.items())
        return f"{bad.size} of {self.status.size} lanes failed ({parts}); first: lane {bad[0]} at t={self.t[bad[0]]:g}"

    def totals(self) -> dict:
        """Summed counters over all lanes (the total work)."""
        return {k: int(getattr(self, k).sum()) for k in _COUNTERS}

    def _reset(self) -> None:
        self.status[:] = RUNNING
        for k in _COUNTERS:
            getattr(self, k)[:] = 0


@dataclass
class LeafSolution:
    """Result of :meth:`RosenbrockLeaf.solve`. ``y`` is the final flat state
    (``y[s*L + l]``), ``t`` its time; ``t_eval``/``y_eval`` the requested
    output times and the states there (shape ``(len(t_eval), n*L)``); the
    scalar counters are summed over lanes; ``stats`` is per lane (summed over
    the output intervals)."""

    t: float
    y: np.ndarray
    t_eval: np.ndarray
    y_eval: np.ndarray
    stats: LeafStats
    success: bool
    message: str
    nsteps: int
    naccept: int
    nreject: int
    nfev: int
    njev: int
    ndec: int


def _pos_int(name, v) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise JacError("bad_option", f"{name} must be a positive int, got {v!r}")
    return int(v)


class RosenbrockLeaf:
    """A per-cell mechanism ready for operator-split chemistry steps.

    Build with :func:`rosenbrock`; call :meth:`advance` inside the host
    model's time loop, :meth:`solve` for a standalone integration with
    output times. Immutable after construction except for its per-lane-count
    scratch (so one leaf serves one host thread at a time; build one per
    concurrent caller).
    """

    def __init__(self, rhs, jac, plan, p, forcing, *, method, rtol, atol, step, threads,
                 compact, clip_negative, max_steps, max_rejects, h0, time_field=None,
                 reuse=None, max_jac_age=MAX_JAC_AGE, hold=HOLD,
                 max_abs: float = math.inf, nonnegative: bool = False):
        self.rhs_program, self.jac_program, self.plan = rhs, jac, plan
        self.n_species = rhs.n_species
        self.species = tuple(rhs.layout.states)
        # A model whose right-hand side uses t explicitly is built with t as a
        # per-lane field (``time_field``): the leaf sets it to each lane's own
        # stage time; it is not one of the user's forcing fields.
        self._program_forcing = tuple(rhs.forcing_names)
        self.time_field = time_field
        self.forcing_names = tuple(k for k in self._program_forcing if k != time_field)
        self.param_names = tuple(rhs.param_names)
        if method not in METHODS:
            raise JacError("bad_option", f"unknown method {method!r}; choose from {sorted(METHODS)}")
        self.method = method
        self._tab = METHODS[method]
        self.reuse, self.max_jac_age, self.hold = self._reuse_options(reuse, max_jac_age, hold)
        if step not in ("lane", "shared"):
            raise JacError("bad_option", f"step must be 'lane' (per-lane step size) or 'shared', not {step!r}")
        self.step = step
        info = plan.info
        split_lu = SPLIT and jac.kernel.engine == "tape" and plan.kind == "lane"
        self._lu = SparseLaneLU(self.n_species, [tuple(x) for x in info["lu_pattern"]],
                                storage="split" if split_lu else "pattern")
        #: The plan the leaf's Jacobian is written in: ``plan``'s slots in
        #: the LU's storage order (:meth:`ScatterPlan.in_storage`: the one place
        #: the Jacobian routes' target slots — the scatter's, the direct
        #: stores' and zeroed slots of the lane tape, the fused tape and the
        #: mass-action kernel — are permuted, once).
        self.matrix_plan = plan if not split_lu else plan.in_storage(self._lu.position, self._lu.storage)
        self._perm, self._iperm = perm_arrays(tuple(info["ordering"]), self.n_species)
        self.tile = info.get("tile")
        self.p = self._params(p)
        self.rtol = self._rtol(rtol)
        self.atol = self._atol(atol)
        self.forcing = forcing
        worker_count(threads, 1, AUTO_LANES_PER_THREAD)     # validate now
        self.threads = threads
        self.compact = bool(compact)
        self.clip_negative = bool(clip_negative)
        try:
            self.max_abs = float(max_abs)
        except (TypeError, ValueError):
            raise JacError("bad_option", f"max_abs must be a positive number, got {max_abs!r}") from None
        if not self.max_abs > 0:
            raise JacError("bad_option", f"max_abs must be a positive number, got {max_abs!r}")
        if not isinstance(nonnegative, (bool, np.bool_)):
            raise JacError("bad_option", f"nonnegative must be True or False, got {nonnegative!r}")
        self.nonnegative = bool(nonnegative)
        self.max_steps = _pos_int("max_steps", max_steps)
        self.max_rejects = _pos_int("max_rejects", max_rejects)
        self.h0 = None if h0 is None else self._h0(h0)
        self._scratch: dict = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0             # the pool's max_workers (not read from the executor's internals)
        self._lock = threading.Lock()
        self._sens: dict = {}
        self.precision = "double"       # set by rosenbrock(precision=...)
        # what rosenbrock() built from (the sensitivities wrt parameters rebuild from it)
        self.source: Any = None
        self.model: str | None = None
        self.options: dict | None = None
        self.hoist_rates = True         # set by rosenbrock(hoist_rates=...)
        self.progress: bool | None = None   # long calls on stderr (runtime.progress; the build option)

    @property
    def negative(self) -> str:
        """What a negative concentration does to a lane: "allow", "fail" or
        "clip" (:func:`rosenbrock`'s ``negative``)."""
        return "clip" if self.clip_negative else "fail" if self.nonnegative else "allow"

    # -- what the sensitivities read (read-only) ------------------------------
    @property
    def tableau(self) -> Tableau:
        """The method's coefficients (:data:`~esmjac.integrators.tableaux.METHODS`)."""
        return self._tab

    @property
    def lu(self) -> SparseLaneLU:
        """The iteration matrix's straight-line sparse LU (pattern and op lists)."""
        return self._lu

    @property
    def perm(self) -> np.ndarray:
        """The elimination order: permuted position ``k`` is species ``perm[k]``."""
        return self._perm

    @property
    def iperm(self) -> np.ndarray:
        """The inverse of :attr:`perm` (species → permuted position)."""
        return self._iperm

    # -- argument handling (all in Python, before compiled code) ------------
    def _params(self, p) -> np.ndarray:
        names = self.param_names
        base = np.array(self.rhs_program.p0, dtype=np.float64)
        if p is None:
            out = base
        elif isinstance(p, Mapping):
            out = base.copy()
            for k, v in _qualified(p, names + self.forcing_names).items():
                if k in names:
                    try:
                        out[names.index(k)] = float(v)
                    except (TypeError, ValueError):
                        raise JacError("bad_argument", f"parameter {k!r} must be a number, got {v!r}") from None
                elif k in self.forcing_names:
                    raise JacError("unresolvable_column",
                                   f"{k!r} is a per-cell field of this model: pass it in forcing= "
                                   f"(one value per lane), not p=")
                else:
                    raise JacError("unresolvable_column",
                                   f"unknown parameter {k!r}; parameters: {', '.join(names)}")
        else:
            try:
                out = np.array(p, dtype=np.float64).reshape(-1)
            except (TypeError, ValueError):
                raise JacError("bad_argument", f"p must be a dict of names or {len(names)} numbers") from None
            if out.shape != (len(names),):
                raise JacError("bad_argument", f"p must have {len(names)} values ({', '.join(names)}), "
                               f"got {out.size}")
        if not np.all(np.isfinite(out)):
            raise JacError("bad_argument", "p has non-finite values")
        out = np.ascontiguousarray(out)
        out.setflags(write=False)
        return out

    def _reuse_options(self, reuse, max_jac_age, hold) -> tuple:
        """(reuse, max_jac_age, hold), checked: reuse defaults to the method
        being a W-method, and is refused for a method that is not one (its
        order needs the exact Jacobian of every step)."""
        w = bool(self._tab.wmethod)
        if reuse is None:
            reuse = w
        if not isinstance(reuse, (bool, np.bool_)):
            raise JacError("bad_option", f"reuse must be True, False or None, not {reuse!r}")
        if reuse and not w:
            raise JacError("bad_option", f"method {self.method!r} is not a W-method: its order needs a "
                           "new Jacobian every step (reuse=True needs a W-method, e.g. 'ros34pw2')")
        age = _pos_int("max_jac_age", max_jac_age)
        try:
            lo, hi = (float(x) for x in hold)
        except (TypeError, ValueError):
            raise JacError("bad_option", f"hold must be two numbers (lo, hi), not {hold!r}") from None
        if not (0.0 < lo <= 1.0 <= hi < math.inf):
            raise JacError("bad_option", f"hold must satisfy 0 < lo <= 1 <= hi < inf, got {(lo, hi)}")
        return bool(reuse), age, (lo, hi)

    @staticmethod
    def _rtol(rtol) -> float:
        return checks.positive("rtol", rtol, "bad_option")

    def _atol(self, atol) -> np.ndarray:
        n = self.n_species
        if atol is None:
            u0 = np.abs(np.asarray(self.rhs_program.u0, dtype=np.float64)).reshape(n, -1)
            scale = u0.max(axis=1) if u0.size else np.ones(n)
            top = float(scale.max()) if scale.size else 1.0
            top = top if top > 0 else 1.0
            a = ATOL_FRACTION * np.maximum(scale, 1e-6 * top)
        elif isinstance(atol, Mapping):
            a = self._atol(None).copy()
            for k, v in _qualified(atol, self.species).items():
                if k not in self.species:
                    raise JacError("unresolvable_column", f"atol names unknown species {k!r}; "
                                   f"species: {', '.join(self.species)}")
                a[self.species.index(k)] = float(v)
        else:
            try:
                a = np.array(atol, dtype=np.float64)
            except (TypeError, ValueError):
                raise JacError("bad_option", f"atol must be a number, {n} numbers or a dict") from None
            if a.ndim == 0:
                a = np.full(n, float(a))
        if a.shape != (n,) or not np.all(a > 0) or not np.all(np.isfinite(a)):
            raise JacError("bad_option", f"atol must be positive: a scalar, {n} values (species order) "
                           "or a dict species → value")
        a = np.ascontiguousarray(a)
        a.setflags(write=False)
        return a

    @staticmethod
    def _h0(h0):
        if isinstance(h0, np.ndarray):
            if h0.ndim != 1 or not np.all(h0 > 0) or not np.all(np.isfinite(h0)):
                raise JacError("bad_argument", "h0 must be positive (a number or one value per lane)")
            return np.ascontiguousarray(h0, dtype=np.float64)
        return checks.positive("h0", h0)

    def lanes_of(self, u) -> int:
        """The lane count of a state vector (``u.size // n_species``)."""
        n = self.n_species
        if u.size == 0 or u.size % n:
            raise JacError("bad_argument", f"u has {u.size} values: not a multiple of the "
                           f"{n} species (u[s*L + l], species-major, lanes fastest)")
        return u.size // n

    def _check_state(self, name, u, writeable: bool) -> None:
        if not isinstance(u, np.ndarray):
            raise JacError("bad_argument", f"{name} must be a NumPy array, got {type(u).__name__}")
        if u.dtype != np.float64:
            raise JacError("bad_argument", f"{name} must be float64, got {u.dtype}")
        if u.ndim != 1 or not u.flags.c_contiguous:
            raise JacError("bad_argument", f"{name} must be flat and C-contiguous (u[s*L + l])")
        if writeable and not u.flags.writeable:
            raise JacError("bad_argument", f"{name} is read-only (advance writes the new state)")

    def _forcing_arg(self, forcing, L: int, buf: np.ndarray):
        """(flat array or None, callable or None) for ``forcing``."""
        nf = len(self.forcing_names)
        if forcing is None:
            forcing = self.forcing
        if callable(forcing):
            if nf == 0:
                raise JacError("bad_argument", "this model has no forcing fields; a forcing callable "
                               "has nothing to set")
            return None, forcing
        if nf == 0:
            if forcing is not None:
                raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
            return None, None
        if forcing is None:
            f0 = self.rhs_program.forcing0
            if f0 is None or self.rhs_program.cells != L:
                raise JacError("bad_argument",
                               f"forcing= is required: {', '.join(self.forcing_names)} per lane "
                               f"({L} lanes; the document's defaults are for {self.rhs_program.cells})")
            f0 = np.asarray(f0, dtype=np.float64).reshape(len(self._program_forcing), -1)
            if self.time_field is not None:
                f0 = f0[[i for i, k in enumerate(self._program_forcing) if k != self.time_field]]
            buf[:] = f0.reshape(-1)
            return buf, None
        if isinstance(forcing, Mapping):
            forcing = _qualified(forcing, self.forcing_names)
            for k in forcing:
                if k not in self.forcing_names:
                    raise JacError("unresolvable_column", f"unknown forcing field {k!r}; "
                                   f"fields: {', '.join(self.forcing_names)}")
            missing = [k for k in self.forcing_names if k not in forcing]
            if missing:
                raise JacError("bad_argument", f"forcing lacks {', '.join(missing)}")
            for i, k in enumerate(self.forcing_names):
                try:
                    buf[i * L:(i + 1) * L] = np.broadcast_to(np.asarray(forcing[k], dtype=np.float64), (L,))
                except ValueError:
                    raise JacError("bad_argument", f"forcing[{k!r}] must be a number or {L} values") from None
            return buf, None
        a = np.asarray(forcing)
        if a.size != nf * L or not np.issubdtype(a.dtype, np.number):
            raise JacError("bad_argument", f"forcing must hold {nf} field(s) x {L} lanes "
                           f"({', '.join(self.forcing_names)}), got shape {a.shape}")
        if a.dtype == np.float64 and a.flags.c_contiguous and a.ndim == 1:
            return a, None
        buf[:] = a.reshape(-1)
        return buf, None

    def _with_time(self, fz, fcall, L: int):
        """The forcing callable the stepper sees for an explicit-t model: the
        user's fields (constant rows or their callable) with the time field's
        row set to each lane's stage time."""
        names = self._program_forcing
        tpos = names.index(self.time_field)
        user = [i for i, k in enumerate(names) if k != self.time_field]
        nu = len(user)
        rows = None if fz is None or nu == 0 else fz[:nu * L].reshape(nu, L)

        def call(times, lanes):
            out = np.empty((len(names), times.size))
            if fcall is not None:
                out[user] = np.asarray(fcall(times, lanes), dtype=np.float64).reshape(nu, times.size)
            elif rows is not None:
                out[user] = rows[:, lanes]
            out[tpos] = times
            return out
        return call

    # -- scratch --------------------------------------------------------------
    def _scratch_for(self, L: int, nthreads: int):
        key = (L, nthreads)
        sc = self._scratch.get(key)
        if sc is not None:
            return sc
        unit = CHUNK if self.tile is None else int(self.tile)
        per = -(-L // nthreads)
        hz = lane_hoist(self, self.matrix_plan) if self.hoist_rates else None
        rows = 0 if hz is None else hz.rows
        cap = block_lanes(self.n_species, self._lu.nnz, self._tab.stages, len(self._program_forcing) + rows)
        per = -(-min(per, cap) // unit) * unit
        blocks = [(a, min(per, L - a)) for a in range(0, L, per)]
        ncd = len(self.rhs_program.layout.cell_shape)
        cix = lane_cells(self.rhs_program.layout.cell_shape, L)
        # one stepper (scratch and bound programs) per worker thread, sized for
        # the largest block and reused block after block: a stepper keeps
        # nothing from one block's run to the next, and one per block made
        # the scratch grow with the grid (≈ 7 MB per 64-lane block at 272
        # species: 1.1 GB at 10^4 cells, 11 GB at 10^5)
        steppers = []
        for c in [blocks[0][1]] * min(nthreads, len(blocks)):
            b = BoundPrograms(self, self.p, 0.0, c, self.matrix_plan, hoist=hz)
            steppers.append(LaneStepper(self._tab, self._lu, self._perm, self._iperm,
                                        len(self._program_forcing), ncd, c, self.tile, b.rhs, b.jac,
                                        self.step == "shared", self.compact,
                                        (self.max_jac_age, *self.hold) if self.reuse else None,
                                        lu_dtype=PRECISIONS[self.precision],
                                        lane_prologue=b.lane_prologue, n_hoisted=rows,
                                        readonly_fields=b.readonly_fields))
            steppers[-1].engines = dict(b.engines)
        i64 = np.int64
        stats = LeafStats(status=np.zeros(L, np.int8), **{c: np.zeros(L, i64) for c in _COUNTERS},
                          h=np.zeros(L), t=np.zeros(L))
        fbuf = np.zeros(max(len(self.forcing_names) * L, 1))     # the user's fields (not t)
        sc = (blocks, steppers, stats, cix, fbuf)
        if len(self._scratch) > 8:                  # a host model uses one or two lane counts
            self._scratch.pop(next(iter(self._scratch)))
        self._scratch[key] = sc
        return sc

    def _executor(self, nthreads: int):
        if self._pool is None or self._pool_size < nthreads - 1:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
            self._pool_size = max(nthreads - 1, 1)
            self._pool = ThreadPoolExecutor(max_workers=self._pool_size,
                                            thread_name_prefix="esmjac-leaf",
                                            initializer=pin_one_thread)
        return self._pool

    def _warm(self) -> None:
        """Two short advances of two copies of the document's first cell,
        discarded, so that the build compiles (or loads from Numba's cache)
        every stepper kernel a host model's first timed advance runs: one in
        place with writable arrays, one into ``out=`` from a read-only state
        and forcing whose lanes finish at different steps (Numba specializes
        on writability, not on lane counts). A forcing callable (other
        kernels) compiles at its first advance, with progress."""
        L = 2
        nf = len(self.forcing_names)
        f = np.ones(nf * L)
        f0 = self.rhs_program.forcing0
        if nf and f0 is not None:
            f0 = np.asarray(f0, dtype=np.float64).reshape(len(self._program_forcing), -1)[:, 0]
            f = np.repeat([v for k, v in zip(self._program_forcing, f0) if k != self.time_field], L)
        keys = set(self._scratch)
        try:
            u = self.initial_state(lanes=L)
            self._advance(u, 0.0, 1.0, f if nf else None, None, None, None)
            u = self.initial_state(lanes=L)
            u.setflags(write=False)
            f.setflags(write=False)
            # lane 0 ends after one step, lane 1 after eight: the lane
            # compaction's kernels run too
            self._advance(u, 0.0, 1e-3, f if nf else None, np.empty_like(u), np.array([1e-3, 1.25e-4]), None)
        except JacError as exc:             # a document state the model cannot step from:
            if exc.code != "evaluation_error":      # the solve's business, not the build's
                raise
        finally:
            for k in set(self._scratch) - keys:
                self._scratch.pop(k, None)

    # -- the host-model call ------------------------------------------------
    def advance(self, u: np.ndarray, t0: float, dt: float, forcing=None, out: np.ndarray | None = None,
                *, h0=None, cells: np.ndarray | None = None) -> LeafStats:
        """Integrate every lane of ``u`` over ``[t0, t0 + dt]``.

        ``u``: flat float64, ``u[s*L + l]`` (species-major, lanes fastest),
        ``L = u.size // n_species``. The new state is written into ``out``
        (same shape) or, when ``out`` is None, into ``u`` itself.
        ``forcing``: the model's per-cell fields (:attr:`forcing_names`) as a
        flat ``nf*L`` array, an ``(nf, L)`` array, a dict name → number or
        ``L`` values — constant over the step — or a callable
        ``forcing(t, lanes) -> (nf, m) array`` evaluated at every stage time
        (``t``: the lanes' times, ``lanes``: their indices); None: the
        leaf's ``forcing`` (or the document's defaults at its own cell count).
        ``h0``: starting step (a number, or per lane — e.g. the previous
        call's ``stats.h``); None: an estimate per lane.
        ``cells``: the grid cell of each lane for index-dependent expressions,
        1-based per cell dimension (``cells[d*L + l]``, int64, as
        :func:`esmjac.runtime.workspace.lane_cells` makes them); None: lane
        ``l`` is cell ``l`` of the document's grid (a chunk of a larger grid
        passes its own cells).

        Returns per-lane :class:`LeafStats` (the leaf's buffers). A lane that
        fails keeps its last accepted state and is listed in
        ``stats.failed``; other lanes are unaffected. Raises
        :class:`~esmjac.errors.JacError` only for bad arguments.
        """
        with self._task("leaf advance", "lanes") as prog:
            return self._advance(u, t0, dt, forcing, out, h0, None, cells, prog)

    def _task(self, what: str, unit: str = "") -> Task:
        """Progress of a call (``self.progress``: the build option), shown
        only once it has run :data:`~esmjac.runtime.progress.DELAY` seconds
        (a host model calls ``advance`` thousands of times)."""
        return task(self.progress, what, None, unit, min_s=_progress.DELAY)

    def _first(self, what: str) -> str:
        """`` (first ... in this process: compiles its kernels)`` the first
        time a lazily compiled path runs for these programs, else ``""``."""
        key = (what, id(self.rhs_program), id(self.jac_program))
        if key in _LAZY_DONE:
            return ""
        _LAZY_DONE.add(key)
        return f" (first {what} in this process: compiles its kernels)"

    def _cells_arg(self, cells, L: int) -> np.ndarray:
        """``cells`` checked (dtype, size, each index inside its dimension)
        before compiled code reads cell values through it."""
        shape = tuple(self.rhs_program.layout.cell_shape)
        if not isinstance(cells, np.ndarray) or cells.dtype != np.int64 or cells.ndim != 1 \
                or not cells.flags.c_contiguous or cells.size != len(shape) * L:
            raise JacError("bad_argument", f"cells must be a flat C-contiguous int64 array of "
                           f"{len(shape)} x {L} cell indices (cells[d*L + l], 1-based)")
        for d, nd in enumerate(shape):
            c = cells[d * L:(d + 1) * L]
            if c.size and (int(c.min()) < 1 or int(c.max()) > nd):
                raise JacError("bad_argument", f"cells of dimension {d} must lie in 1..{nd}")
        return cells

    def _advance(self, u, t0, dt, forcing, out, h0, records, cells=None, prog: Task | None = None) -> LeafStats:
        self._check_state("u", u, out is None)
        L = self.lanes_of(u)
        if out is None:
            out = u
        else:
            self._check_state("out", out, True)
            if out.shape != u.shape:
                raise JacError("bad_argument", f"out has shape {out.shape}, u has {u.shape}")
        try:
            t0 = float(t0)
            dt = float(dt)
        except (TypeError, ValueError):
            raise JacError("bad_argument", f"t0 and dt must be numbers, got {t0!r}, {dt!r}") from None
        if not (math.isfinite(t0) and math.isfinite(dt)) or dt <= 0:
            raise JacError("bad_argument", f"t0 must be finite and dt finite and > 0 (an advance over no "
                           f"time, or backwards, is not a step), got t0={t0}, dt={dt}")
        if not np.all(np.isfinite(u)):
            raise JacError("bad_argument", "u has non-finite values")
        h0 = self.h0 if h0 is None else self._h0(h0)
        if isinstance(h0, np.ndarray) and h0.shape != (L,):
            raise JacError("bad_argument", f"h0 per lane must have {L} values, got {h0.shape}")
        nth = worker_count(self.threads, L, AUTO_LANES_PER_THREAD)
        with self._lock:
            blocks, steppers, stats, cix, fbuf = self._scratch_for(L, nth)
            if cells is not None:
                cix = self._cells_arg(cells, L)
            fz, fcall = self._forcing_arg(forcing, L, fbuf)
            if self.time_field is not None:
                if records is not None:
                    raise JacError("bad_option", "sensitivities are not available for a model whose "
                                   "right-hand side uses t explicitly (its time enters as a per-stage "
                                   "field; the recorded steps assume forcing constant over the step)")
                fz, fcall = None, self._with_time(fz, fcall, L)
            # lanes grouped into blocks by their step counts in the previous
            # advance of this lane count (ORDER_LANES), before they are reset
            order = _lane_order(stats.nsteps) if ORDER_LANES and records is None else None
            if order is not None:
                for a, c in blocks:             # each block's lanes in grid order (its gathers)
                    order[a:a + c].sort()
            stats._reset()
            for st in steppers:                 # the singularity guards (lanestep._err_guard)
                st.max_abs, st.nonnegative = self.max_abs, self.nonnegative
            tend = t0 + dt
            args = (u, out, L)
            rest = (t0, tend, h0, fz, fcall, cix, self.atol, self.rtol, self.max_steps,
                    self.max_rejects, self.clip_negative, stats)
            if records is not None:
                if fcall is not None:
                    raise JacError("bad_option", "sensitivities need forcing constant over the step "
                                   "(an array or dict), not a callable")
                for a, c in blocks:
                    self._run_one(steppers[0], args, (a, c), rest + (records,))
                records.append((None if fz is None else np.array(fz), cix))
                return stats
            # worker k (stepper k) runs blocks k, k + ns, ... one after the other
            ns = len(steppers)
            work = [[(steppers[k], blocks[i]) for i in range(k, len(blocks), ns)] for k in range(ns)]
            work = [w for w in work if w]
            if prog is not None:
                prog.set_total(L)
                if fcall is not None and self.time_field is None:
                    first = self._first("advance with a forcing callable")
                    if first:
                        prog.phase(f"{L} lanes{first}")
            rest_o = rest + (None, order)       # (record, lanes)
            if len(work) == 1:
                self._run_blocks(work[0], args, rest_o, True, prog)
            else:
                pool = self._executor(len(work))
                futs = [pool.submit(self._run_blocks, w, args, rest_o, False, prog) for w in work[1:]]
                err = None
                try:
                    self._run_blocks(work[0], args, rest_o, True, prog)
                except BaseException as exc:        # noqa: BLE001 - wait for the workers first
                    err = exc
                for fu in futs:
                    try:
                        fu.result()
                    except BaseException as exc:    # noqa: BLE001
                        err = err or exc
                if err is not None:
                    raise err
        return stats

    @staticmethod
    def _run_one(stepper, args, block, rest) -> None:
        with numba_threads(1):       # one worker thread per lane block
            stepper.run(*args, block[0], block[1], *rest)

    @staticmethod
    def _run_blocks(work, args, rest, own_thread: bool = True, prog: Task | None = None) -> None:
        """Integrate the lane blocks ``work`` ((stepper, (first lane, count))
        pairs) one after the other on this thread (a pool worker already runs
        one-thread kernels: ``own_thread=False``), counting their lanes in
        ``prog``."""
        if own_thread:
            with numba_threads(1):
                for st, (a, c) in work:
                    st.run(*args, a, c, *rest)
                    if prog is not None:
                        prog.update(c)
        else:
            for st, (a, c) in work:
                st.run(*args, a, c, *rest)
                if prog is not None:
                    prog.update(c)

    # -- standalone integration --------------------------------------------
    def initial_state(self, y0=None, lanes: int | None = None) -> np.ndarray:
        """A flat float64 state: the document's defaults, an array, or a dict
        species → number or per-lane values (others from the defaults)."""
        n = self.n_species
        base = np.array(self.rhs_program.u0, dtype=np.float64).reshape(-1)
        cells = base.size // n
        L = cells if lanes is None else int(lanes)
        if y0 is None or isinstance(y0, Mapping):
            if L != cells:
                base = np.repeat(base.reshape(n, cells)[:, :1], L, axis=1).reshape(-1) if cells else base
            y = base.copy()
            for k, v in _qualified(y0 or {}, self.species).items():
                if k not in self.species:
                    raise JacError("unresolvable_column", f"y0 names unknown species {k!r}; "
                                   f"species: {', '.join(self.species)}")
                s = self.species.index(k)
                try:
                    y[s * L:(s + 1) * L] = np.broadcast_to(np.asarray(v, dtype=np.float64), (L,))
                except ValueError:
                    raise JacError("bad_argument", f"y0[{k!r}] must be a number or {L} values") from None
            return y
        try:
            y = np.array(y0, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise JacError("bad_argument", "y0 must be an array u[s*L + l] or a dict species → values") from None
        self.lanes_of(y)
        return y

    def solve(self, t_span: Sequence[float], y0=None, *, t_eval=None, forcing=None, rtol=None,
              atol=None, h0=None) -> LeafSolution:
        """Integrate from ``t_span[0]`` to ``t_span[1]`` with output at ``t_eval``.

        ``y0``: see :meth:`initial_state` (default: the document's state).
        ``t_eval``: non-decreasing times inside ``t_span`` (default: the end
        only); each output interval is one :meth:`advance`, step sizes carried
        over per lane, so the outputs are exact states, not interpolants. An
        output at ``t_span[0]`` (or a repeated time) is the state already
        reached, bit for bit; after the last output the solve continues to
        ``t_span[1]``, so ``y`` is always the state at ``t``.
        ``rtol``/``atol`` override the leaf's for this call. Per-lane
        statistics are summed over the intervals.
        """
        t0, tf = checks.time_span(t_span)
        te = np.array([tf] if t_eval is None else t_eval, dtype=np.float64).reshape(-1)
        if te.size == 0 or np.any(np.diff(te) < 0) or te[0] < t0 or te[-1] > tf:
            raise JacError("bad_argument", f"t_eval must be increasing inside {(t0, tf)}")
        y = self.initial_state(y0)
        L = self.lanes_of(y)                # refuses a state that is not whole lanes
        hv = None if h0 is None else self._h0(h0)
        if isinstance(hv, np.ndarray) and hv.shape != (L,):
            raise JacError("bad_argument", f"h0 per lane must have {L} values, got {hv.shape}")
        hinit = np.zeros(L) if hv is None else np.broadcast_to(hv, (L,)).copy()
        saved = self.rtol, self.atol
        if rtol is not None:
            self.rtol = self._rtol(rtol)
        if atol is not None:
            self.atol = self._atol(atol)
        # Output times equal to the time reached (te[0] == t0, repeated
        # times) are zero-length intervals: the state is already there, no
        # step is taken. After the last output the solve goes on to tf, so
        # that ``y`` is the state at ``t`` (as solve_ivp's).
        stops = [float(x) for x in te] + ([tf] if te[-1] < tf else [])
        tot = LeafStats(status=np.zeros(L, np.int8), **{c: np.zeros(L, np.int64) for c in _COUNTERS},
                        h=hinit, t=np.full(L, t0))
        prog = self._task("leaf solve", "output times")
        prog.set_total(len(stops))
        try:
            ys = np.full((te.size, y.size), np.nan)
            t = t0
            h = h0
            for k, tk in enumerate(stops):
                if tk > t:
                    st = self._advance(y, t, tk - t, forcing, None, h, None)
                    for f in _COUNTERS:
                        getattr(tot, f)[:] += getattr(st, f)
                    tot.h[:] = st.h
                    tot.t[:] = st.t
                    tot.status[:] = np.where(tot.status != 0, tot.status, st.status)
                    if not st.success:
                        if k < te.size:
                            ys[k] = y           # failed lanes: their last accepted state
                        break
                    h = np.array(st.h)
                    t = tk
                if k < te.size:
                    ys[k] = y
                prog.update()
        finally:
            self.rtol, self.atol = saved
            prog.close()
        tt = tot.totals()
        return LeafSolution(float(tf if tot.success else tot.t.min()), y, te, ys, tot, tot.success,
                            tot.message, tt["nsteps"], tt["naccept"], tt["nreject"], tt["nfev"],
                            tt["njev"], tt["ndec"])

    # -- sensitivities ---------------------------------------------------------
    def with_params(self, p) -> "RosenbrockLeaf":
        """A leaf sharing this one's programs with other parameter values."""
        other = RosenbrockLeaf(self.rhs_program, self.jac_program, self.plan, p, self.forcing,
                               method=self.method, rtol=self.rtol, atol=self.atol, step=self.step,
                               threads=self.threads, compact=self.compact,
                               clip_negative=self.clip_negative, max_steps=self.max_steps,
                               max_rejects=self.max_rejects, h0=self.h0, time_field=self.time_field,
                               reuse=self.reuse, max_jac_age=self.max_jac_age, hold=self.hold,
                               max_abs=self.max_abs, nonnegative=self.nonnegative)
        other.source, other.model, other.options = self.source, self.model, self.options
        other.progress = self.progress
        return other

    def _sensitivities(self, wrt_parameters: bool):
        if wrt_parameters and self.source is None:
            raise JacError("bad_option", "parameter sensitivities need a leaf built by rosenbrock(source)")
        key = bool(wrt_parameters)
        sens = self._sens.get(key)
        if sens is None:
            sens = self._sens[key] = Sensitivities(self, key)
        return sens

    @property
    def parameter_columns(self) -> tuple:
        """Names of the parameter gradient's entries (``wrt="parameters"``
        columns: per-cell ones, e.g. photolysis scalings, then scalars)."""
        jp = self._sensitivities(True).jp
        return tuple(jp.meta["lane_vars"]) + tuple(jp.meta["glob_vars"])

    def _unpack_params(self, gp, L) -> dict:
        jp = self._sensitivities(True).jp
        nl = int(jp.meta["n_lane_cols"])
        out = {v: gp[i * L:(i + 1) * L].copy() for i, v in enumerate(jp.meta["lane_vars"])}
        out.update({v: float(gp[nl * L + i]) for i, v in enumerate(jp.meta["glob_vars"])})
        return out

    def gradient(self, u0: np.ndarray, t0: float, dt: float, dphi, forcing=None, *,
                 wrt: str | Sequence[str] = ("state", "parameters")):
        """Discrete adjoint: ∂φ/∂u0 and ∂φ/∂p for ``φ`` a scalar function of
        the state at ``t0 + dt`` (KPP's adjoint, Sandu et al. 2003).

        ``dphi``: ``∂φ/∂y(t0+dt)`` as an array like ``u0``, or a callable
        ``dphi(y_final) -> array``. ``forcing`` must be constant over the
        step. Returns ``(y_final, grad_u0, grad_p, stats)``: ``grad_u0`` like
        ``u0``; ``grad_p`` a dict over :attr:`parameter_columns` — per-cell
        columns per lane, scalar parameters summed over lanes (φ sums over
        lanes) — or None without ``"parameters"`` in ``wrt``. Step sizes are
        those of the forward solve (frozen), so this is the exact gradient of
        the computed solution up to the dependence of the step-size control
        on the state.
        """
        wrt = (wrt,) if isinstance(wrt, str) else tuple(wrt)
        bad = [w for w in wrt if w not in ("state", "parameters")]
        if bad or not wrt:
            raise JacError("bad_option", f"wrt must name 'state' and/or 'parameters', got {wrt!r}")
        with self._task("leaf gradient") as prog:
            prog.phase("forward steps, recorded")
            L, y, stats, records, fz, cix = self._forward(u0, t0, dt, forcing)
            lam = np.array(dphi(y.copy()) if callable(dphi) else dphi, dtype=np.float64).reshape(-1)
            if lam.shape != y.shape or not np.all(np.isfinite(lam)):
                raise JacError("bad_argument", f"dphi must give {y.size} finite values (like u0)")
            sens = self._sensitivities("parameters" in wrt)
            gp = np.zeros(sens.jp.col_size(L)) if sens.jp is not None else None
            lam = np.ascontiguousarray(lam)
            prog.phase(f"adjoint over {len(records)} recorded steps{self._first('gradient')}")
            with numba_threads(1):
                sens.adjoint(records, lam, fz if fz is not None else np.zeros(1), cix, L, gp)
        return y, lam, (self._unpack_params(gp, L) if gp is not None else None), stats

    def _forward(self, u0, t0, dt, forcing) -> tuple:
        """The recorded forward solve both sensitivity directions start from:
        (lanes, final state, statistics, step records, last forcing, lane map)."""
        self._check_state("u0", u0, False)
        L = self.lanes_of(u0)
        y = u0.copy()
        records: list = []
        stats = self._advance(y, t0, dt, forcing, None, None, records)
        fz, cix = records.pop()
        return L, y, stats, records, fz, cix

    def tangent(self, u0: np.ndarray, t0: float, dt: float, du0=None, dp: Mapping | None = None,
                forcing=None):
        """Tangent-linear model: the directional derivative of the state at
        ``t0 + dt`` along ``du0`` (like ``u0``; None = 0) and ``dp`` (a dict
        over :attr:`parameter_columns`: a number, or per lane for per-cell
        columns). Returns ``(y_final, dy_final, stats)``."""
        with self._task("leaf tangent") as prog:
            prog.phase("forward steps, recorded")
            L, y, stats, records, fz, cix = self._forward(u0, t0, dt, forcing)
            prog.phase(f"tangent over {len(records)} recorded steps{self._first('tangent')}")
            return self._tangent(L, y, stats, records, fz, cix, du0, dp)

    def _tangent(self, L, y, stats, records, fz, cix, du0, dp):
        dy = np.zeros_like(y) if du0 is None else np.array(du0, dtype=np.float64).reshape(-1)
        if dy.shape != y.shape:
            raise JacError("bad_argument", f"du0 must have {y.size} values (like u0)")
        sens = self._sensitivities(dp is not None)
        dpv = None
        if dp is not None:
            jp = sens.jp
            nl = int(jp.meta["n_lane_cols"])
            dpv = np.zeros(jp.col_size(L))
            lane_vars, glob_vars = list(jp.meta["lane_vars"]), list(jp.meta["glob_vars"])
            for k, v in dp.items():
                if k in lane_vars:
                    i = lane_vars.index(k)
                    dpv[i * L:(i + 1) * L] = np.broadcast_to(np.asarray(v, dtype=np.float64), (L,))
                elif k in glob_vars:
                    dpv[nl * L + glob_vars.index(k)] = float(v)
                else:
                    raise JacError("unresolvable_column", f"unknown parameter column {k!r}; "
                                   f"columns: {', '.join(lane_vars + glob_vars)}")
        dy = np.ascontiguousarray(dy)
        with numba_threads(1):
            sens.tangent(records, dy, dpv, fz if fz is not None else np.zeros(1), cix, L)
        return y, dy, stats

    def close(self) -> None:
        """Stop the worker threads (they also stop when the leaf is collected)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
            self._pool_size = 0

    def __del__(self):
        try:
            self.close()
        except Exception:                           # noqa: BLE001
            pass



def _qualified(mapping: Mapping, names) -> dict:
    """``mapping`` with each short key (``"T"``) replaced by the one name of
    ``names`` it stands for (``"Chem.T"``); other keys are kept, for the
    caller's own refusal (an ambiguous short name is refused here)."""
    return {(key_base("", k, names) or k) if isinstance(k, str) and "[" not in k else k: v
            for k, v in mapping.items()}


#: ``negative=`` of :func:`rosenbrock` → (``nonnegative``, ``clip_negative``)
#: of :class:`RosenbrockLeaf`.
NEGATIVE = {"allow": (False, False), "fail": (True, False), "clip": (False, True)}


def _negative(negative, nonnegative, clip_negative) -> tuple:
    """``(nonnegative, clip_negative)`` for ``negative=`` and the deprecated
    flags it replaces (each still accepted, with a DeprecationWarning)."""
    import warnings
    if not isinstance(negative, str) or negative not in NEGATIVE:
        hint = (" (CVODE's 'read_as_zero' changes what the right-hand side reads; the leaf fails "
                "or clips a lane instead)" if negative == "read_as_zero" else "")
        raise JacError("bad_option", f"negative must be one of {', '.join(map(repr, NEGATIVE))}, "
                       f"not {negative!r}{hint}")
    old = {k: v for k, v in (("nonnegative", nonnegative), ("clip_negative", clip_negative)) if v is not None}
    for k, v in old.items():
        if not isinstance(v, (bool, np.bool_)):
            raise JacError("bad_option", f"{k} must be True or False, got {v!r}")
    if not old:
        return NEGATIVE[negative]
    if negative != "allow":
        raise JacError("bad_option", f"give negative={negative!r} alone, not with the deprecated "
                       f"{' and '.join(old)}")
    new = "clip" if old.get("clip_negative") else "fail" if old.get("nonnegative") else "allow"
    warnings.warn(f"rosenbrock({', '.join(f'{k}={v}' for k, v in old.items())}) is deprecated: use "
                  f"negative={new!r}", DeprecationWarning, stacklevel=3)
    return bool(old.get("nonnegative", False)), bool(old.get("clip_negative", False))


def rosenbrock(source: Any, *, model: str | None = None, p=None, forcing=None, method: str = "rodas3",
               rtol: float = 1e-4, atol=None, step: str = "lane", threads="auto", compact: bool = True,
               clip_negative: bool | None = None, max_steps: int = 100000, max_rejects: int = 50,
               h0=None, tile: int | None = DEFAULT_TILE, options: dict | None = None,
               reuse: bool | None = None, max_jac_age: int = MAX_JAC_AGE,
               hold: tuple = HOLD, precision: str = "double", per_cell=None,
               max_abs: float = math.inf, negative: str = "allow", nonnegative: bool | None = None,
               hoist_rates: bool = True,
               **extra) -> RosenbrockLeaf:
    """Build the native Rosenbrock leaf for a per-cell (``cell``-lane) mechanism.

    Parameters
    ----------
    source : str, os.PathLike or dict
        An ``.esm`` path, a document dict or its JSON text.
    model : str, optional
        The model to build (default: the whole document, flattened).
    p : dict or array_like, optional
        Parameter overrides (dict name → value, or all values in
        :attr:`RosenbrockLeaf.param_names` order); per-cell fields go in
        ``forcing``.
    forcing : dict or array_like, optional
        Per-cell fields (see :meth:`RosenbrockLeaf.advance`).
    method : str
        ``"rodas3"`` (default, stiffly accurate, order 3(2)), ``"ros3"`` or
        ``"ros34pw2"`` (a Rosenbrock–W method, order 3(2), L-stable,
        stiffly accurate: its order holds with an old Jacobian, so each lane
        may reuse its Jacobian and LU over several steps).
    rtol : float
        Relative tolerance.
    atol : float, array_like or dict, optional
        None (default): :data:`ATOL_FRACTION` times each species' scale in
        the document's initial state; or a number, one value per species,
        or a dict species → value.
    step : str
        ``"lane"`` (default; every lane its own step size) or ``"shared"``
        (one step size for all lanes, the stiffest sets it).
    threads : "auto", int or None
        Worker threads over lane blocks, as for ``ivp``/``cvode``:
        ``"auto"`` (default: one per :data:`AUTO_LANES_PER_THREAD` lanes,
        at most the cores), None (Numba's thread count) or an int. Results
        are bitwise the same for any value.
    compact : bool
        Squeeze finished lanes out between steps (default) or mask them.
    clip_negative : bool
        Deprecated: ``negative="clip"``.
    max_steps : int
        Attempts per lane per call.
    max_rejects : int
        Consecutive rejections before a lane gives up.
    h0 : float or ndarray, optional
        The first step size: a positive number or one per lane, e.g. a
        previous solution's ``h`` (default: chosen per lane).
    tile : int or None
        Lane tile width of the Jacobian's slot storage (LaneSparseBlocks'
        ``tile``; default :data:`~esmjac.layouts.types.DEFAULT_TILE`, 16;
        None: one tile of the active lanes). The iteration matrix
        ``I/(hγ) − J`` is written, in the same pass that assembles it, in
        the factorization's own 16-lane tiles
        (:func:`esmjac.integrators.lanestep.lu_tile`). Results are bitwise
        the same for any value; the default measured fastest
        (benchmarks/leaf.py "L4").
    options : dict, optional
        Options of ``RhsProgram.build``/``JacobianProgram.build``.
    per_cell : list or tuple of str, optional
        Scalar parameters read per cell from ``forcing`` (temperature,
        photolysis rates): short names where unambiguous (``"T"``),
        qualified always; the build option ``per_lane`` says the same.
    reuse : bool, optional
        Per-lane Jacobian/LU reuse (W-methods only; None = on for a
        W-method): each lane keeps its Jacobian for at most
        ``max_jac_age`` accepted steps (a new one after a rejection unless
        it is at the current state), and its factorisation — holding its
        step at the factorised one — while the controller proposes a step
        within ``hold`` times it. ``stats.njev``/``stats.ndec`` count each
        lane's Jacobians and LUs.
    max_jac_age : int
        See ``reuse`` (default :data:`MAX_JAC_AGE`).
    hold : tuple of float
        ``(lo, hi)``, see ``reuse`` (default :data:`HOLD`).
    precision : str
        ``"double"`` (default) or ``"mixed"``: the iteration matrix stored
        and factored in float32 (half the bytes the factorisation and every
        stage solve stream), its solves accumulated in float64 into float64
        stages; states, error norm, right-hand sides and the Jacobian stay
        float64, so the step-size control sees float64 errors. The
        factorisation's rounding perturbs the stages like an inexact
        Jacobian (tests/integrators/test_mixed_precision.py measures the
        accuracy); bits are still those of the lane alone, for any thread
        count or block.

    max_abs : float
        A lane whose species grows past it fails (status 7; default: no
        bound). A lane never crosses a singularity silently: a step across
        a pole (a species changing sign while its derivative drove it away
        from zero) fails the lane (status 6; lanestep's module docstring).
        With a W-method, a step on a kept Jacobian that trips one of these
        guards (6, 7, 8) is rejected and retried on a fresh Jacobian; only
        a hit on a fresh one fails the lane.
    negative : str
        What a negative concentration does to a lane: ``"allow"`` (default:
        nothing), ``"fail"`` (the lane fails at its last accepted state,
        status 8) or ``"clip"`` (negative values of accepted steps are set
        to 0; Rosenbrock methods conserve mass and linear invariants only
        without clipping). The same option of ``sundials.cvode``/``ida``
        takes ``"allow"`` or ``"read_as_zero"`` (a solver without lanes
        cannot fail one; see README "Negative concentrations").
    nonnegative : bool
        Deprecated: ``negative="fail"`` (the name meant clipping in
        ``sundials.cvode``).
    hoist_rates : bool
        Evaluate the state-independent values of the right-hand side and
        the Jacobian — rate coefficients such as ``A·exp(-E/T)`` of each
        lane's own temperature — once per :meth:`~RosenbrockLeaf.advance`
        per lane instead of in every stage (default; KPP's
        ``Update_RCONST``). Taped programs (large mechanisms) only; the
        values, and so the results, are bitwise those without it
        (:mod:`esmjac.integrators.lanehoist`). A forcing callable re-evaluates
        them with its fields.

    Returns
    -------
    RosenbrockLeaf
        The leaf; :meth:`RosenbrockLeaf.advance` integrates lanes.

    Raises
    ------
    JacError
        ``bad_option`` for an unknown option; ``nonuniform_pattern`` for a
        model that couples cells (use ``scipy.ivp`` or ``sundials.cvode``);
        ``bad_argument`` for a document with no ODE states.
    """
    if extra:
        raise JacError("bad_option", f"unknown options {sorted(extra)} for native.rosenbrock")
    nonnegative, clip_negative = _negative(negative, nonnegative, clip_negative)
    if not isinstance(hoist_rates, (bool, np.bool_)):
        raise JacError("bad_option", f"hoist_rates must be True or False, got {hoist_rates!r}")
    if precision not in PRECISIONS:
        raise JacError("bad_option", f"precision must be one of {sorted(PRECISIONS)}, not {precision!r}")
    options = checks.cell_options(options, per_cell)
    # One question to the model layer before anything is built: does the
    # right-hand side read t? Lanes sit at different times, so then t becomes
    # a per-lane field the leaf sets to each lane's stage time (a rewritten
    # copy of the document); each program is built once, from what it needs.
    # (Remembered per document in the cache: a warm build loads no document.)
    time_field = None
    with one_document(source):              # (keyed once, not per product)
        if reads_time(source, model, options=options):
            _, lay = model_view(source, model, options=options)
            source, time_field = time_as_parameter(source, set(lay.params) | set(lay.forcing))
            opts = dict(options or {})
            opts["per_lane"] = tuple(opts.get("per_lane", ())) + (time_field,)
            options = opts
        rhs = RhsProgram.build(source, model, options=options)
        jac = JacobianProgram.build(source, model, wrt="states", options=options)
    checks.integrable(rhs)
    if jac.kind != "cell":
        raise JacError("nonuniform_pattern",
                       "the native Rosenbrock leaf integrates per-cell chemistry (LaneSparseBlocks); this "
                       "model couples cells — use kind 'scipy.ivp' or 'sundials.cvode'")
    if tile is not None:
        _pos_int("tile", tile)
    plan = jac.plan(LaneSparseBlocks(tile=tile), source=rhs)
    leaf = RosenbrockLeaf(rhs, jac, plan, p, forcing, method=method, rtol=rtol, atol=atol, step=step,
                          threads=threads, compact=compact, clip_negative=clip_negative,
                          max_steps=max_steps, max_rejects=max_rejects, h0=h0, time_field=time_field,
                          reuse=reuse, max_jac_age=max_jac_age, hold=hold,
                          max_abs=max_abs, nonnegative=nonnegative)
    leaf.precision = precision
    leaf.hoist_rates = bool(hoist_rates)
    leaf.source, leaf.model, leaf.options = source, model, options
    leaf.progress = (options or {}).get("progress")
    leaf._warm()
    return leaf
