"""SUNDIALS adapter (via scikits.odes): kinds ``"sundials.cvode"`` and ``"sundials.ida"``.

:func:`cvode` and :func:`ida` compile a model's right-hand side and exact
state Jacobian once and return a :class:`SundialsProblem`: a ready
``scikits.odes`` solver plus the callables it was given::

    from esmjac.adapters.sundials import cvode
    prob = cvode("model.esm", linsolver="spgmr", precond="block", rtol=1e-6, atol=1e3)
    res = prob.solve(np.linspace(0, 3600, 7))      # scikits.odes SolverReturn
    res.values.y[-1], prob.stats()

What the solvers get (``jacobian=True``, the default):

* ``linsolver="dense"`` / ``"lapackdense"``: ``jacfn`` -- CVODE
  ``jacfn(t, y, fy, J)`` fills ``J = ∂f/∂y``; IDA ``jacfn(t, y, yp, res, cj,
  J)`` fills ``∂F/∂y + cj ∂F/∂ẏ = cj I − ∂f/∂y`` for the residual
  ``F(t, y, ẏ) = ẏ − f(t, y)``. ``jacobian=False`` leaves SUNDIALS its own
  difference quotients.
* ``"spgmr"``/``"spbcgs"``/``"sptfqmr"`` (IDA: ``"spbcg"``): ``jac_times_setupfn``
  evaluates the Jacobian at the linear solve's (t, y), ``jac_times_vecfn``
  applies it (``JacobianProgram.apply``), no finite differences.
  ``precond="block"`` (per-cell blocks of ``I − γJ``: ``LaneBlocks`` for a
  cell program, the same-point blocks of the CSR Jacobian for a gridded
  global one) or ``precond="banded"`` (per-column banded LU of ``I − γJ`` on
  the ``ColumnBanded`` layout, ``axis=`` its grid axis) adds
  ``prec_setupfn``/``prec_solvefn`` (CVODE only: scikits.odes 2.7's IDA
  preconditioner bridge is broken).
* ``"band"``/``"lapackband"``: ``lband``/``uband`` from the sparsity
  pattern; SUNDIALS forms the banded Jacobian by difference quotients
  (scikits.odes passes no banded Jacobian callback).

``jtv(t, y, lam)`` returns ``Jᵀ λ`` (and ``jv(t, y, v)`` ``J v``) for
adjoint users. Exceptions raised inside a callback are kept and re-raised by
:meth:`SundialsProblem.solve` (scikits.odes would only print them).
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from types import SimpleNamespace
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._frozen import readonly
from ..errors import JacError, SolverFailed
from ..layouts.plans import column_split
from ..layouts.types import ColumnBanded, LaneSparseBlocks
from ..linalg.sparse_lu import CHUNK, SparseLaneLU
from ..plugins.hookspecs import Adapter, dist_version, hookimpl
from ..runtime.threads import measure_threads, one_chunk, thread_count, with_threads
from ..runtime.workspace import JacWorkspace, RhsScratch
from ._common import Counters, Problem, bandwidths, build_programs, cell_options, csr_pattern, inputs

__all__ = ["cvode", "ida", "SundialsProblem", "MAX_STEPS"]

_KRYLOV = {"cvode": ("spgmr", "spbcgs", "sptfqmr"), "ida": ("spgmr", "spbcg", "sptfqmr")}
_DIRECT = ("dense", "lapackdense", "band", "lapackband")
_AVAILABLE: dict = {}

#: Default ``max_steps`` (SUNDIALS' step limit per output interval; its own
#: default, 500, stops a one-hour chemistry box after ~1 h of model time at
#: rtol 1e-4 with a state far off). A guard against runaway stepping, the
#: same figure as the native leaf's per-call limit.
MAX_STEPS = 100_000


def available_linsolvers(kind: str) -> tuple:
    """The linear solvers this scikits.odes build can run for ``kind``
    (``"cvode"``/``"ida"``), found once per process by starting a 2-unknown
    problem with each (milliseconds): builds without LAPACK lack
    ``lapackdense``/``lapackband``, and scikits.odes 2.7's IDA knows neither
    those nor ``spbcg``."""
    if kind in _AVAILABLE:
        return _AVAILABLE[kind]
    ode, dae = _odes()
    ok = []
    for ls in _DIRECT + _KRYLOV[kind]:
        kw: dict = dict(linsolver=ls, old_api=False)
        if "band" in ls:
            kw.update(lband=0, uband=0)
        try:
            if kind == "cvode":
                s = ode("cvode", lambda t, y, yd: yd.fill(0.0), **kw)
                s.init_step(0.0, np.ones(2))
            else:
                s = dae("ida", lambda t, y, yp, r: np.copyto(r, yp), **kw)
                s.init_step(0.0, np.ones(2), np.zeros(2))
        except Exception:           # noqa: BLE001 - "LAPACK not available", "Unknown solver type"
            continue
        ok.append(ls)
    _AVAILABLE[kind] = tuple(ok)
    return _AVAILABLE[kind]
_UNAVAILABLE = ("scikits.odes is not installed (or cannot be imported); pip install "
                "'esmjac[sundials]' (needs libsundials-dev), or use kind 'scipy.ivp' "
                "(esmjac.adapters.scipy.ivp) instead")


def _odes():
    """``scikits.odes`` (``ode``, ``dae``), imported lazily."""
    try:
        from scikits.odes import dae, ode
    except ImportError as exc:
        raise JacError("adapter_unavailable", _UNAVAILABLE) from exc
    return ode, dae


# ---------------------------------------------------------------------------
# preconditioners: P = I - gamma*J (CVODE)
# ---------------------------------------------------------------------------

class _BlockPC:
    """Per-cell blocks of ``I − γJ`` in lane storage, factored once per
    preconditioner setup and solved per Krylov iteration (KPP style: the
    lane-parallel sparse LU of ``linalg.sparse_lu``, no pivoting; these
    blocks are diagonally weighted for the step sizes CVODE takes, and a
    zero/NaN pivot is reported to CVODE as a recoverable failure). A cell
    program's blocks are its ``LaneSparseBlocks`` (Markowitz order, fill-in
    included, written directly by the bound Jacobian in the layout's
    default lane tiles, which the lane LU factors and solves in place: no
    conversion per step); a gridded global program's are its same-point CSR
    entries (dense natural-order blocks, one tile of all points).

    ``layout``: the cell program's block layout (``LaneSparseBlocks()``;
    ``LaneSparseBlocks(tile=None)`` is the lanes-fastest order, the same
    bits)."""

    name = "block"

    def __init__(self, r, j, plan_csr, layout=None):
        self.j = j
        self.lay = r.layout
        self.ns = ns = len(r.layout.states)
        self.W = None                                   # the blocks' lane tile (None: one tile)
        if j.kind == "cell":
            self.plan = j.plan(LaneSparseBlocks() if layout is None else layout, source=r)
            self.N = N = int(j.cells)
            pattern = [tuple(x) for x in self.plan.info["lu_pattern"]]
            self.order = np.asarray(self.plan.info["ordering"], dtype=np.int64)
            self.ws = j.new_workspace(keep_slab=True)       # jtimes='setup' applies its slab
            self.J = np.empty(self.plan.out_size(self.ws.lanes))
            self.buf = self.J
            self.sel = None
            self.W = self.plan.tile_width(N) if self.plan.tiled else None
            C = self.plan.capacity(N)                       # stored lanes (padding repeats the last cell)
        else:
            lay = r.layout
            shapes = {lay.shapes.get(s, ()) for s in lay.states}
            if len(shapes) != 1 or not next(iter(shapes)):
                raise JacError("nonuniform_pattern",
                               "precond='block' needs every state on one grid (per-point blocks); "
                               "this model's states have different shapes: use precond='banded' "
                               "(ColumnBanded) or precond=None")
            self.plan = plan_csr
            rows, cols, _ = csr_pattern(plan_csr)
            self.N = N = int(np.prod(next(iter(shapes))))
            sr, cr = np.divmod(rows, N)
            sc, cc = np.divmod(cols, N)
            keep = cr == cc
            self.sel = np.flatnonzero(keep)
            pattern = [(a, b) for a in range(ns) for b in range(ns)]
            self.order = np.arange(ns, dtype=np.int64)
            self.dest = (sr[keep] * ns + sc[keep]) * N + cr[keep]   # slot q = r*ns + c, lane = point
            self.ws = j.new_workspace(keep_slab=True)
            self.buf = np.empty(plan_csr.out_size(self.ws.lanes))
            self.J = np.zeros(ns * ns * N)
        self.lu = SparseLaneLU(ns, pattern)
        self.M = np.empty_like(self.J)
        diag = np.asarray(self.lu.diag_slots, dtype=np.int64)
        if self.W is None:
            self.diag = (diag[:, None] * N + np.arange(N)[None, :]).ravel()
        else:
            # slot q of lane l at ((l // W) * nnz + q) * W + l % W (padding lanes included)
            lane = np.arange(C)
            self.diag = (((lane // self.W)[None, :] * self.lu.nnz + diag[:, None]) * self.W
                         + (lane % self.W)[None, :]).ravel()
        self.b = np.empty((ns, N))
        self.run = j.bind(self.plan, self.ws, keep_point=False)
        self.evaluated = False
        self.factored = False

    @property
    def ready(self) -> bool:
        return self.evaluated

    def reset(self) -> None:
        """Forget the evaluated Jacobian (its buffers are kept)."""
        self.evaluated = self.factored = False

    def evaluate(self, t, y, p, forcing) -> None:
        self.run(y, p, t, forcing, self.buf)
        if self.sel is not None:
            self.J[self.dest] = self.buf[self.sel]
        self.evaluated = True

    def factor(self, gamma: float) -> None:
        np.multiply(self.J, -gamma, out=self.M)
        self.M[self.diag] += 1.0
        with one_chunk(self.N, CHUNK):
            bad = self.lu.factor_status(self.M, self.N, self.W)
        self.factored = bad is None
        if bad is not None:
            raise np.linalg.LinAlgError(f"zero or NaN pivot in cell {bad[0]} (elimination row {bad[1]})")

    def solve(self, r, z) -> None:
        R = np.asarray(r).reshape(self.ns, self.N)
        np.take(R, self.order, axis=0, out=self.b)
        with one_chunk(self.N, CHUNK):
            self.lu.solve(self.M, self.b.reshape(-1), self.N, self.W)
        z.reshape(self.ns, self.N)[self.order] = self.b


class _BandedPC:
    """Per-column banded LU (LAPACK gbtrf/gbtrs) on the ColumnBanded layout."""

    name = "banded"

    def __init__(self, r, j, axis):
        self.j = j
        self.plan = j.plan(ColumnBanded(axis, tile=None), source=r)   # one column's band per lane
        info = self.plan.info
        self.kl, self.ku = int(info["kl"]), int(info["ku"])
        self.m, self.C = int(info["m"]), int(info["columns"])
        lay = r.layout
        shape = lay.shapes[lay.states[0]]
        ax = int(info["axis"])
        ns, N = len(lay.states), int(np.prod(shape))
        e = np.arange(ns * N)
        lane, local = column_split(e, shape, ns, ax)
        P = np.empty((self.C, self.m), dtype=np.int64)
        P[lane, local] = e
        self.P = P
        self.ws = j.new_workspace()
        self.buf = np.empty(self.plan.out_size(self.ws.lanes))
        self.AB = None
        self.lu = []

    @property
    def ready(self) -> bool:
        return self.AB is not None

    def reset(self) -> None:
        """Forget the evaluated Jacobian and its factors."""
        self.AB = None
        self.lu = []

    def evaluate(self, t, y, p, forcing) -> None:
        self.j.eval_into(self.plan, y, p, t, forcing, self.buf, self.ws)
        self.AB = self.buf.reshape(self.kl + self.ku + 1, self.m, self.C).copy()

    def factor(self, gamma: float) -> None:
        from scipy.linalg import lapack
        kl, ku, m, AB = self.kl, self.ku, self.m, self.AB
        if AB is None:
            raise JacError("internal_error", "the banded preconditioner was factored before it was evaluated")
        lus = []
        for c in range(self.C):
            ab = np.zeros((2 * kl + ku + 1, m), order="F")
            ab[kl:, :] = -gamma * AB[:, :, c]
            ab[kl + ku, :] += 1.0
            lu, piv, info = lapack.dgbtrf(ab, kl, ku, overwrite_ab=1)
            if info != 0:
                raise np.linalg.LinAlgError(f"I - gamma*J is singular in column {c} (gbtrf info {info})")
            lus.append((lu, piv))
        self.lu = lus

    def solve(self, r, z) -> None:
        from scipy.linalg import lapack
        for c, (lu, piv) in enumerate(self.lu):
            x, info = lapack.dgbtrs(lu, self.kl, self.ku, r[self.P[c]], piv)
            z[self.P[c]] = x


# ---------------------------------------------------------------------------
# the problem object
# ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class SundialsProblem(Problem):
    """A ready scikits.odes CVODE/IDA solver and the esmjac callables it uses.

    ``solver`` is the ``scikits.odes.ode``/``dae`` object (its ``solve``,
    ``init_step``, ``step`` work as documented there; ``solve`` here is a
    convenience that supplies ``y0``/``yp0`` and re-raises callback errors).
    Callables not used by the chosen linear solver are ``None``. One problem
    object owns its scratch buffers: do not share it between threads.
    """

    kind: str                  # "cvode" | "ida"
    solver: Any
    linsolver: str
    precond: str | None
    options: dict              # what the scikits.odes solver was given
    rhsfn: Any = None          # CVODE rfn(t, y, ydot)
    resfn: Any = None          # IDA resfn(t, y, yp, result)
    jacfn: Any = None
    jac_times_setupfn: Any = None
    jac_times_vecfn: Any = None
    prec_setupfn: Any = None
    prec_solvefn: Any = None
    _state: _State = field(repr=False, kw_only=True)
    note: str = ""             # why this linear solver (linsolver="auto" says what it chose)

    @property
    def yp0(self) -> np.ndarray:
        """``ẏ(t0) = f(t0, y0)`` at t0 = 0 (IDA's consistent initial derivative)."""
        return self.f(0.0, self.y0)

    def f(self, t, y) -> np.ndarray:
        """``f(t, y)`` as a new array (not counted)."""
        out = np.empty(self.n)
        self._run(self.rhs.eval_into, np.ascontiguousarray(y, dtype=np.float64), self.p, float(t),
                  self.forcing, out, self._state.scratch_user)
        return out

    def _run(self, fn, *args):
        return with_threads(self._state.threads, fn, *args)

    def _eval_user(self, t, y) -> np.ndarray:
        st = self._state
        self._run(self.jacobian.eval_into, self.plan, np.ascontiguousarray(y, dtype=np.float64), self.p,
                  float(t), self.forcing, st.user_buf, st.ws_user)
        return st.user_buf

    def jac_csr(self, t, y):
        """``∂f/∂y`` at (t, y) as a ``scipy.sparse.csr_array``."""
        from scipy.sparse import csr_array
        data = self._eval_user(t, y).copy()
        ip, ix, _ = self.plan.csr_index(self._state.ws_user.lanes)
        return csr_array((data, ix, ip), shape=(self.n, self.n))

    def jv(self, t, y, v) -> np.ndarray:
        """``J v`` at (t, y)."""
        return self._product(self.jacobian.apply, t, y, v)

    def jtv(self, t, y, lam) -> np.ndarray:
        """``Jᵀ λ`` at (t, y) (for adjoint sensitivities)."""
        return self._product(self.jacobian.apply_transpose, t, y, lam)

    def _product(self, op, t, y, x) -> np.ndarray:
        self._eval_user(t, y)
        out = np.zeros(self.n)
        self._run(op, self.plan, self._state.ws_user, np.ascontiguousarray(x, dtype=np.float64), out)
        return out

    # -- running ---------------------------------------------------------------------
    def solve(self, tout, y0=None, yp0=None, *, allow_failure: bool = False):
        """``solver.solve(tout, y0[, yp0])`` (``tout[0]`` is the initial time);
        returns scikits.odes' ``SolverReturn`` (``flag``, ``values.t``,
        ``values.y``, ``message``...). An exception raised in a callback is
        re-raised here. A solver that stops before ``tout[-1]`` raises
        ``solver_failed`` (flag, SUNDIALS' message, the time reached; the
        partial ``SolverReturn`` as ``exc.result``); ``allow_failure=True``
        returns that result instead (its ``flag`` is negative)."""
        tout = np.asarray(tout, dtype=np.float64)
        y = np.array(self.y0 if y0 is None else y0, dtype=np.float64)
        self._state.error = self._state.soft_error = None
        # One thread-count switch for the whole run (callbacks then find it set).
        if self.kind == "ida":
            yp = self.f(tout[0], y) if yp0 is None else np.array(yp0, dtype=np.float64)
            res = self._run(self._ida_solve, tout, y, yp)
        else:
            res = self._run(self.solver.solve, tout, y)
        err = self._state.error
        if err is not None:
            self._state.error = None
            raise err
        if not allow_failure:
            self._raise_if_short(res, tout)
        return res

    def _raise_if_short(self, res, tout) -> None:
        """``solver_failed`` when SUNDIALS stopped before the last output
        time (a negative flag, or fewer outputs than asked for): never a
        silently short state. The message gives SUNDIALS' flag and message,
        the time reached and the step limit; ``exc.result`` is the
        ``SolverReturn`` (the outputs that were reached)."""
        t = np.asarray(getattr(res.values, "t", None) if res.values is not None else [], dtype=np.float64)
        done = res.flag >= 0 and t.size == tout.size and t.size > 0 and t[-1] == tout[-1]
        if done:
            return
        errs = getattr(res, "errors", None)
        reached = getattr(errs, "t", None) if errs is not None else None
        if reached is None or not np.isfinite(reached):
            reached = float(t[-1]) if t.size else float(tout[0])
        name = "CVODE" if self.kind == "cvode" else "IDA"
        msg = (res.message or "").strip()
        hint = ""
        if "mxstep" in msg or "max_steps" in msg or "maximum number of steps" in msg.lower() \
                or res.flag == -1:
            hint = (f"; the step limit is max_steps={self.options.get('max_steps')} steps per output "
                    "interval: raise it (cvode(..., max_steps=...)) or add output times")
        soft = self._state.soft_error
        if soft is not None:
            hint += f"; the last recoverable callback failure: {soft}"
        exc = SolverFailed(f"{name} stopped at t = {float(reached):.6g} before the last output time "
                           f"{float(tout[-1]):.6g} (flag {res.flag}: {msg or 'no message'}){hint}; "
                           f"{t.size} of {tout.size} outputs reached (exc.result holds them; "
                           "solve(..., allow_failure=True) returns the result instead)")
        exc.result = res
        raise exc

    def _ida_solve(self, tout, y, yp):
        """IDA over ``tout``, counting its internal steps.

        scikits.odes 2.7 reports no IDA statistics, so the integration runs
        in IDA's one-step mode with each output time as the stopping time
        (the outputs are IDA's own states there, not interpolants); the
        accepted steps are counted into ``stats()["NumSteps"]``. Returns a
        ``SolverReturn`` like ``solver.solve``'s."""
        s = self.solver
        s.set_options(one_step_compute=True)
        try:
            r = s.init_step(float(tout[0]), y, yp)
            if r.flag < 0:
                return r
            ts, ys, yps = [float(tout[0])], [np.array(r.values.y)], [np.array(r.values.ydot)]
            steps = 0
            limit = int(self.options.get("max_steps") or MAX_STEPS)
            for T in tout[1:]:
                s.set_options(tstop=float(T))
                taken = 0
                while True:
                    if taken >= limit:  # one-step mode: SUNDIALS' own limit counts one step per call
                        r = r._replace(flag=-1, message=f"too many steps: max_steps={limit} taken "
                                       f"before tout = {float(T):g}")
                        break
                    r = s.step(float(T))
                    if r.flag < 0:
                        break
                    steps += 1
                    taken += 1
                    if r.flag != 0:         # 1: reached the stopping time
                        break
                if r.flag < 0:
                    break
                ts.append(float(T))
                ys.append(np.array(r.values.y))
                yps.append(np.array(r.values.ydot))
        finally:
            s.set_options(one_step_compute=False, tstop=None)
        self._state.steps += steps
        values = type(r.values)(t=np.array(ts), y=np.vstack(ys), ydot=np.vstack(yps))
        if r.flag < 0:
            return r._replace(values=values, errors=r.values)
        return r._replace(flag=0, values=values, message="Successful function return.")

    def counters(self) -> dict:
        """esmjac-side call counts since creation / :meth:`reset_counters`."""
        return self._state.counters.as_dict()

    def reset_counters(self) -> None:
        self._state.counters.reset()
        self._state.steps = 0

    @property
    def nfev(self) -> int:
        return self._state.counters.nfev

    @property
    def njev(self) -> int:
        return self._state.counters.njev

    def stats(self) -> dict:
        """The esmjac counters plus SUNDIALS' own statistics.

        CVODE: ``NumSteps``, ``NumRhsEvals``, ``NumLinSolvSetups``... from
        scikits.odes' ``get_info``. IDA: scikits.odes 2.7 has no ``get_info``
        for IDA, so what esmjac counts itself is reported under SUNDIALS'
        names: ``NumSteps`` (IDA's accepted internal steps, counted by
        :meth:`solve`), ``NumResEvals``, ``NumJacEvals``, ``NumJtimesEvals``."""
        out = self.counters()
        out["linsolver"] = self.linsolver
        out["precond"] = self.precond
        get = getattr(self.solver, "get_info", None)
        if get is not None:
            try:
                out.update(get())
            except Exception:       # pragma: no cover - solver not yet initialised
                pass
        elif self.kind == "ida":
            c = self._state.counters
            out["NumSteps"] = self._state.steps
            out["NumResEvals"] = c.nfev
            out["NumJacEvals"] = c.njev + c.njtsetup
            out["NumJtimesEvals"] = c.njtimes
        return out


@dataclass(eq=False)
class _State:
    """A problem's own mutable state: counters, the first callback error,
    and the scratch each callback family writes (one thread)."""

    counters: Counters
    threads: int | None
    run_f: Any                     # bound RHS call of rhsfn / resfn
    scratch_user: RhsScratch       # f(), yp0
    ws_dense: JacWorkspace         # jacfn
    ws_jv: JacWorkspace            # jac_times_setupfn / jac_times_vecfn
    ws_user: JacWorkspace          # jac_csr(), jv(), jtv()
    dense_buf: np.ndarray
    jv_buf: np.ndarray
    user_buf: np.ndarray
    jv_ready: bool = False
    steps: int = 0                 # IDA steps counted by solve() (scikits.odes reports none)
    error: BaseException | None = None
    soft_error: BaseException | None = None   # the last recoverable callback failure
    pc: Any = None                 # the preconditioner, when one is used

    @classmethod
    def new(cls, r, j, plan, threads) -> "_State":
        # jacfn writes CSR values directly; J·v applies the slab of its setup
        ws = [j.new_workspace(keep_slab=False), j.new_workspace(keep_slab=True), j.new_workspace()]
        bufs = [np.empty(plan.out_size(w.lanes)) for w in ws]
        return cls(Counters(), threads, r.bind(), r.new_buffers(), *ws, *bufs)


def _guard(st: _State, fn):
    """Keep a callback's exception (scikits.odes would swallow it) and
    report an unrecoverable failure (-1) to SUNDIALS instead.

    The thread count is read from ``st`` at each call, not when the guard is
    made: ``threads="auto"`` above ``runtime.threads.SERIAL_BELOW`` unknowns is decided
    (measured) only after the callbacks exist."""

    def call(*args):
        try:
            rc = with_threads(st.threads, fn, *args)
        except JacError as exc:
            if exc.code == "evaluation_error":
                # A non-finite value at a trial state (a Newton iterate far
                # off, an overflow): recoverable, SUNDIALS retries with a
                # smaller step; named by solve() only if the solve fails.
                st.soft_error = exc
                st.counters.nrecoverable += 1
                return 1
            if st.error is None:
                st.error = exc
            return -1
        except Exception as exc:        # noqa: BLE001 - re-raised by solve()
            if st.error is None:
                st.error = exc
            return -1
        return 0 if rc is None else rc
    call.__name__ = getattr(fn, "__name__", "callback")
    call.__doc__ = fn.__doc__
    return call


def _build(kind, source, *, model, linsolver, precond, jacobian, rtol, atol, p, forcing, y0,
           axis, precond_type, jtimes, threads, build_options, options, negative="allow",
           nonnegative=None) -> SundialsProblem:
    ode, dae = _odes()

    krylov = _KRYLOV[kind]
    if linsolver != "auto" and linsolver not in _DIRECT + krylov:
        raise JacError("bad_option", f"unknown {kind} linsolver {linsolver!r}; use 'auto' or one of "
                       f"{', '.join(_DIRECT + krylov)}")
    if linsolver != "auto" and linsolver not in available_linsolvers(kind):
        raise JacError("adapter_unavailable",
                       f"this scikits.odes build cannot run {kind} linsolver {linsolver!r} "
                       f"({'built without LAPACK' if 'lapack' in linsolver else 'not implemented there'}); "
                       f"it has: {', '.join(available_linsolvers(kind))}")
    if precond not in (None, "block", "banded"):
        raise JacError("bad_option", f"unknown precond {precond!r}; use 'block', 'banded' or None")
    if precond is not None and linsolver not in krylov and linsolver != "auto":
        raise JacError("bad_option", f"precond={precond!r} needs a Krylov linsolver "
                       f"({', '.join(krylov)}), not {linsolver!r}")
    if precond is not None and kind == "ida":
        raise JacError("bad_option",
                       "scikits.odes 2.7 cannot run an IDA preconditioner (its prec_solvefn bridge "
                       "fails with AttributeError 'r_vec'); use cvode(..., linsolver='spgmr', "
                       f"precond={precond!r}) or ida(..., linsolver='spgmr') / 'dense'")
    if jtimes not in ("newton", "setup"):
        raise JacError("bad_option", f"jtimes must be 'newton' or 'setup', not {jtimes!r}")
    if jtimes == "setup" and linsolver != "auto" and (kind != "cvode" or precond is None or not jacobian):
        raise JacError("bad_option", "jtimes='setup' reuses the preconditioner's Jacobian: it needs "
                       "cvode(..., linsolver='spgmr', precond='block' or 'banded')")
    if axis is not None and precond != "banded" and linsolver != "auto":
        raise JacError("bad_option", "axis= chooses the ColumnBanded grid axis of precond='banded'")
    for k in ("rfn", "Rfn", "jacfn", "jac_times_vecfn", "jac_times_setupfn", "prec_setupfn",
              "prec_solvefn", "linsolver", "old_api"):
        if k in options:
            raise JacError("bad_option", f"option {k!r} is set by the adapter")

    r, j, plan = build_programs(source, model, build_options)
    yv, pv, fv = inputs(r, y0, p, forcing, source, model)
    # Read-only, as the bindings' build-time warm calls pass them (Numba
    # compiles one specialization per writability: writable copies here
    # recompiled the RHS drive inside the first solve).
    pv = readonly(pv)
    fv = None if fv is None else readonly(fv)
    rows, cols, n = csr_pattern(plan)
    linsolver, precond, jtimes, note = _choose(kind, linsolver, precond, jtimes, j, n, jacobian)
    st = _State.new(r, j, plan, thread_count(threads, n))
    run_f = st.run_f                # bound calls: every check and kernel choice made once
    sign = -1.0 if kind == "ida" else 1.0
    diag = np.arange(n)

    binds: dict = {}

    def bound(name):
        b = binds.get(name)
        if b is None:
            b = binds[name] = j.bind(plan, getattr(st, name), keep_point=False)
        return b

    def eval_dense(t, y):
        st.counters.njev += 1
        bound("ws_dense")(np.ascontiguousarray(y), pv, t, fv, st.dense_buf)
        return st.dense_buf

    def eval_jv(t, y):
        st.counters.njtsetup += 1
        bound("ws_jv")(np.ascontiguousarray(y), pv, t, fv, st.jv_buf)
        st.jv_ready = True

    def apply_jv(v, Jv):
        st.counters.njtimes += 1
        Jv.fill(0.0)
        j.apply(plan, st.ws_jv, np.ascontiguousarray(v), Jv)

    clip = _negative(negative, nonnegative)
    ybuf = np.empty(n)

    def clipped(y):
        """``y``, or a copy with its negative values read as 0 (``negative="read_as_zero"``)."""
        if not clip or np.shape(y) != (n,):
            return y                        # (a wrong length: the RHS call refuses it)
        if y.min() >= 0.0:
            return y
        st.counters.nnegative += 1
        return np.maximum(y, 0.0, out=ybuf)

    opts = dict(options)
    opts.setdefault("max_steps", MAX_STEPS)
    opts.update(rtol=rtol, atol=atol, linsolver=linsolver, old_api=False)
    fns: dict = {}
    if kind == "cvode":
        def rhsfn(t, y, ydot):
            st.counters.nfev += 1
            run_f(clipped(y), pv, t, fv, ydot)
            return 0
        fns["rhsfn"] = _guard(st, rhsfn)
    else:
        tmp = np.empty(n)

        def resfn(t, y, yp, result):
            st.counters.nfev += 1
            run_f(clipped(y), pv, t, fv, tmp)
            np.subtract(yp, tmp, out=result)
            return 0
        fns["resfn"] = _guard(st, resfn)

    # CVODE's and IDA's callbacks differ in signature; each is defined per kind below.
    jacfn: Callable[..., int]
    jac_times_setupfn: Callable[..., int]
    jac_times_vecfn: Callable[..., int]
    if linsolver in ("band", "lapackband"):
        lb, ub = bandwidths(rows, cols)
        if max(lb, ub) > n / 2:
            raise JacError("bad_option",
                           f"the Jacobian is not banded (lower/upper bandwidth {lb}/{ub} of n = {n}); "
                           f"use linsolver='spgmr' with precond='block' or 'banded', or 'dense'")
        opts.setdefault("lband", lb)
        opts.setdefault("uband", ub)
    elif linsolver in ("dense", "lapackdense") and jacobian:
        if kind == "cvode":
            def jacfn(t, y, fy, J):
                data = eval_dense(t, y)
                J.fill(0.0)
                J[rows, cols] = data
                return 0
        else:
            def jacfn(t, y, yp, residual, cj, J):
                data = eval_dense(t, y)
                J.fill(0.0)
                J[rows, cols] = -data
                J[diag, diag] += cj
                return 0
        fns["jacfn"] = _guard(st, jacfn)
    elif linsolver in krylov and jacobian and jtimes == "setup":
        # J·v from the Jacobian the preconditioner setup last evaluated (lagged
        # like a direct solver's), on the preconditioner's own workspace.
        def jac_times_vecfn(v, Jv, t, y):
            pc = st.pc
            if not pc.ready:
                st.counters.npeval += 1
                pc.evaluate(float(t), np.ascontiguousarray(y), pv, fv)
            st.counters.njtimes += 1
            Jv.fill(0.0)
            j.apply(pc.plan, pc.ws, np.ascontiguousarray(v), Jv)
            return 0
        fns["jac_times_vecfn"] = _guard(st, jac_times_vecfn)
    elif linsolver in krylov and jacobian:
        if kind == "cvode":
            def jac_times_setupfn(t, y, fy):
                eval_jv(t, y)
                return 0

            def jac_times_vecfn(v, Jv, t, y):
                if not st.jv_ready:
                    eval_jv(t, y)
                apply_jv(v, Jv)
                return 0
        else:
            def jac_times_setupfn(t, y, yp, rr, cj):
                eval_jv(t, y)
                return 0

            def jac_times_vecfn(t, y, yp, rr, v, Jv, cj):
                if not st.jv_ready:
                    eval_jv(t, y)
                apply_jv(v, Jv)
                Jv *= sign                  # ∂F/∂y v = -J v
                Jv += cj * v                # + cj ∂F/∂ẏ v
                return 0
        fns["jac_times_setupfn"] = _guard(st, jac_times_setupfn)
        fns["jac_times_vecfn"] = _guard(st, jac_times_vecfn)

    if precond is not None:
        pc = _BlockPC(r, j, plan) if precond == "block" else _BandedPC(r, j, axis)
        st.pc = pc

        def prec_setupfn(t, y, jok, jcurPtr, gamma):
            st.counters.npsetup += 1
            if jok and pc.ready:
                jcurPtr.value = False           # reuse the saved Jacobian, refactor with gamma
            else:
                st.counters.npeval += 1
                pc.evaluate(float(t), np.ascontiguousarray(y), pv, fv)
                jcurPtr.value = True
            try:
                pc.factor(float(gamma))
            except np.linalg.LinAlgError:
                return 1                    # recoverable: CVODE retries with a smaller step
            return 0

        def prec_solvefn(t, y, r_, z, gamma, delta, lr):
            st.counters.npsolve += 1
            pc.solve(r_, z)
            return 0
        fns["prec_setupfn"] = _guard(st, prec_setupfn)
        fns["prec_solvefn"] = _guard(st, prec_solvefn)
        opts.setdefault("precond_type", precond_type)

    solver_opts = {k: v for k, v in fns.items() if k not in ("rhsfn", "resfn")}
    opts.update(solver_opts)
    try:
        if kind == "cvode":
            solver = ode("cvode", fns["rhsfn"], **opts)
        else:
            solver = dae("ida", fns["resfn"], **opts)
    except ValueError as exc:
        raise JacError("bad_option", f"scikits.odes refused the {kind} options: {exc}") from exc
    shown = {k: v for k, v in opts.items() if not callable(v)}
    prob = SundialsProblem(r, j, plan, yv, tuple(r.names), pv, fv, kind, solver, linsolver, precond,
                           shown, fns.get("rhsfn"), fns.get("resfn"), fns.get("jacfn"),
                           fns.get("jac_times_setupfn"), fns.get("jac_times_vecfn"),
                           fns.get("prec_setupfn"), fns.get("prec_solvefn"), note, _state=st)
    def warm_callbacks() -> None:
        """Each callback the solver was given, once, with arguments as
        SUNDIALS passes them (writable float64 vectors, a float t): binds
        the lazily bound Jacobian calls and compiles what they run, so the
        first solve compiles nothing (Numba specializes on writability)."""
        y = np.array(yv, dtype=np.float64)
        out, v, Jv, z = np.empty(n), np.zeros(n), np.empty(n), np.empty(n)
        yp = np.zeros(n)
        if kind == "cvode":
            fns["rhsfn"](0.0, y, out)
        else:
            fns["resfn"](0.0, y, yp, out)
        if "jacfn" in fns:
            eval_dense(0.0, y)              # jacfn's compiled part (its n x n J is SUNDIALS')
        if "prec_setupfn" in fns:
            fns["prec_setupfn"](0.0, y, False, SimpleNamespace(value=False), 0.0)
        if kind == "cvode":
            if "jac_times_setupfn" in fns:
                fns["jac_times_setupfn"](0.0, y, out)
            if "jac_times_vecfn" in fns:
                fns["jac_times_vecfn"](v, Jv, 0.0, y)
        else:
            if "jac_times_setupfn" in fns:
                fns["jac_times_setupfn"](0.0, y, yp, out, 1.0)
            if "jac_times_vecfn" in fns:
                fns["jac_times_vecfn"](0.0, y, yp, out, v, Jv, 1.0)
        if "prec_solvefn" in fns:
            fns["prec_solvefn"](0.0, y, out, z, 0.0, 0.0, 1)
        st.jv_ready = False

    if st.threads == "measure":
        st.threads = None
        _warm(prob, warm_callbacks)         # compile both twins before timing
        st.threads = measure_threads(lambda: (prob.f(0.0, yv), prob.jv(0.0, yv, yv)))
    _warm(prob, warm_callbacks)
    return prob


#: ``negative=`` of :func:`cvode`/:func:`ida`: whether the right-hand side
#: reads negative states as 0.
NEGATIVE = {"allow": False, "read_as_zero": True}


def _negative(negative, nonnegative) -> bool:
    """Whether the RHS reads negative states as 0 (``negative="read_as_zero"``;
    the deprecated ``nonnegative=True`` says the same, with a
    DeprecationWarning: in the leaf that name fails a lane instead).

    SUNDIALS' advice on unphysical negative values (CVODE guide, "Advice on
    controlling unphysical negative values"): tighter absolute tolerances
    first; else the right-hand side may replace a negative value by zero in
    a temporary copy (never in the solver's ``y``). In chemistry a negative
    radical feeds itself through its own quadratic loss (``d HO2/dt =
    -2k HO2²`` stays negative for HO2 < 0) and runs to −∞. Measured on
    SuperFast over 100 heterogeneous cells, rtol 1e-4 (benchmarks/
    cvode_hetero.py): atol 1e-9 ppb stops CVODE at t ≈ 10 s (835 error-test
    failures in 1,802 steps, then the RHS at −inf in HO2; SciPy BDF stops
    too), with ``negative="read_as_zero"`` it reaches the end but 3.7e3 off the
    Radau reference (relative, 1e-6 ppb floor: negative values sit inert);
    atol 1e-12 solves it (1.1e-4 off) without, in 321 steps, and with it in
    601 steps (2.4e-4 off). So it is off by default."""
    if not isinstance(negative, str) or negative not in NEGATIVE:
        hint = (" (the leaf's 'fail'/'clip' act on a lane's state; CVODE has no lanes: "
                "'read_as_zero' changes what the right-hand side reads)" if negative in ("fail", "clip") else "")
        raise JacError("bad_option", f"negative must be 'allow' or 'read_as_zero', not {negative!r}{hint}")
    if nonnegative is None:
        return NEGATIVE[negative]
    if not isinstance(nonnegative, (bool, np.bool_)):
        raise JacError("bad_option", f"nonnegative must be True or False, not {nonnegative!r}")
    if negative != "allow":
        raise JacError("bad_option", f"give negative={negative!r} alone, not with the deprecated nonnegative")
    import warnings
    warnings.warn(f"nonnegative={bool(nonnegative)} is deprecated: use negative="
                  f"{'read_as_zero' if nonnegative else 'allow'!r} (the leaf's old nonnegative failed "
                  "a lane; the two options now share one name and say what they do)",
                  DeprecationWarning, stacklevel=4)
    return bool(nonnegative)


def _choose(kind, linsolver, precond, jtimes, j, n, jacobian) -> tuple:
    """``linsolver="auto"``: (linsolver, precond, jtimes, the reason in words).

    Measured on the gridded tropo12 mechanism (README, performance notes):
    CVODE with the dense direct solver factors an n×n matrix (n = species ×
    cells) where Krylov + the per-cell block preconditioner factors only
    the cells' small blocks (34 s against 0.6 s at 100 cells; exact J·v at
    every linear solve and J·v from the preconditioner's lagged Jacobian,
    ``jtimes="setup"``, cost the same within 10 %, so ``jtimes`` keeps its
    default). IDA cannot take a preconditioner in scikits.odes 2.7 and
    unpreconditioned GMRES stalls on stiff chemistry, so IDA stays dense."""
    if linsolver != "auto":
        return linsolver, precond, jtimes, f"linsolver={linsolver!r} as requested"
    if precond is not None:
        raise JacError("bad_option", "precond= goes with an explicit Krylov linsolver "
                       "(linsolver='spgmr'); linsolver='auto' chooses the preconditioner itself")
    block = j.structure == "block_diagonal"
    if kind == "cvode" and block and jacobian:
        return ("spgmr", "block", jtimes,
                "auto: the Jacobian is block-diagonal (one block per cell), so CVODE runs "
                "spgmr with the per-cell block preconditioner and the exact J·v")
    if kind == "cvode":
        return ("dense", None, jtimes,
                f"auto: the Jacobian is {j.structure}, not block-diagonal: CVODE's dense direct "
                "solver (for large banded grids try linsolver='spgmr', precond='banded')")
    return ("dense", None, jtimes,
            "auto: IDA's dense direct solver (scikits.odes 2.7 cannot run an IDA "
            "preconditioner" + ("; for block-diagonal chemistry cvode() is much faster)"
                                if block else ")"))


def _warm(prob: "SundialsProblem", callbacks: Callable[[], None]) -> None:
    """Compile every kernel the solver's callbacks reach (RHS, Jacobian
    scatter, J·v, preconditioner blocks) and the user-facing ``f``/``jv``
    before the first timed call, at the thread count the solve runs with;
    counters, the preconditioner and the callbacks' error slots are reset
    afterwards. A point the model cannot be evaluated at is the solve's
    business (``evaluation_error``), any other callback error is raised."""
    y = prob.y0
    st = prob._state
    try:
        prob.f(0.0, y)
        if prob.linsolver in _KRYLOV[prob.kind] or prob.jacfn is not None:
            prob.jv(0.0, y, np.zeros_like(y))
        st.error = None
        callbacks()
    except JacError as exc:
        if exc.code != "evaluation_error":
            raise
    except np.linalg.LinAlgError:
        pass
    err, st.error, st.soft_error = st.error, None, None
    if st.pc is not None:
        st.pc.reset()
    prob.reset_counters()
    if err is not None and not (isinstance(err, JacError) and err.code == "evaluation_error"):
        raise err


def cvode(source, *, model=None, linsolver="auto", precond=None, jacobian=True, rtol=1e-6,
          atol=1e-12, p=None, forcing=None, y0=None, axis=None, precond_type="left",
          jtimes="newton", threads="auto", negative="allow", nonnegative=None, build_options=None,
          per_cell=None, **options) -> SundialsProblem:
    """A CVODE (BDF, Newton) solver for ``source`` with esmjac's exact Jacobian.

    Parameters
    ----------
    source : str, os.PathLike or dict
        An ``.esm`` path, a document dict or its JSON text.
    model : str, optional
        The model to build (default: the whole document, flattened).
    linsolver : str
        ``"auto"`` (default: ``"spgmr"`` + ``precond="block"`` when the
        Jacobian is block-diagonal -- per-cell chemistry -- else
        ``"dense"``; ``problem.note`` says which and why), ``"dense"``
        (analytic ``jacfn``), ``"spgmr"``/``"spbcgs"``/``"sptfqmr"``
        (analytic J·v), ``"band"`` (difference-quotient band Jacobian,
        bandwidths from the pattern).
    precond : str or None
        ``"block"``, ``"banded"`` or None (Krylov solvers only).
    jacobian : bool
        False: give SUNDIALS no Jacobian callbacks (its own difference
        quotients).
    rtol, atol : float
        CVODE's tolerances.
    p, forcing, y0 : array_like or dict, optional
        As in :func:`esmjac.adapters.scipy.ivp`.
    axis : str, optional
        The ColumnBanded axis of ``precond="banded"``.
    precond_type : str
        ``"left"`` (default), ``"right"`` or ``"both"``.
    jtimes : str
        ``"newton"`` evaluates J at every linear solve's (t, y) (exact
        Newton–Krylov); ``"setup"`` (with a preconditioner) reuses the
        Jacobian the preconditioner setup evaluated, so J is evaluated only
        when CVODE asks for a new one (``jok`` false).
    threads : "auto", int or None
        Numba threads of every callback, as in ``ivp`` (``"auto"``
        measures one thread against Numba's count at build time on
        problems above 20,000 unknowns).
    negative : str
        ``"allow"`` (default) or ``"read_as_zero"``: the right-hand side
        reads negative states as 0 (in a copy; the solver's ``y`` is never
        changed; see :func:`_negative`). Off by default (it costs steps
        where the tolerances already keep concentrations in check). The
        leaf's option of the same name fails (``"fail"``) or clips
        (``"clip"``) a lane instead.
    nonnegative : bool
        Deprecated: ``negative="read_as_zero"``.
    build_options : dict, optional
        Options of ``RhsProgram.build``/``JacobianProgram.build``.
    per_cell : list or tuple of str, optional
        Scalar parameters read per cell from ``forcing`` (temperature,
        photolysis rates): short names where unambiguous (``"T"``),
        qualified always; the build option ``per_lane`` says the same.
    **options
        Passed to scikits.odes (``max_steps``, ``maxl``, ``lmm_type``,
        ``max_step_size``...). ``max_steps`` (SUNDIALS' step limit per
        output interval) defaults to :data:`MAX_STEPS` (100,000) instead of
        SUNDIALS' 500; a solve that stops early raises ``solver_failed``.

    Returns
    -------
    SundialsProblem
        The configured solver, its callbacks and counters.
    """
    return _build("cvode", source, model=model, linsolver=linsolver, precond=precond,
                  jacobian=jacobian, rtol=rtol, atol=atol, p=p, forcing=forcing, y0=y0, axis=axis,
                  precond_type=precond_type, jtimes=jtimes, threads=threads,
                  build_options=cell_options(build_options, per_cell, "build_options"), options=options,
                  negative=negative, nonnegative=nonnegative)


def ida(source, *, model=None, linsolver="auto", precond=None, jacobian=True, rtol=1e-6,
        atol=1e-12, p=None, forcing=None, y0=None, axis=None, precond_type="left",
        threads="auto", negative="allow", nonnegative=None, build_options=None, per_cell=None,
        **options) -> SundialsProblem:
    """An IDA solver for the residual ``F(t, y, ẏ) = ẏ − f(t, y)`` of ``source``.

    ``jacfn`` (dense) fills ``cj I − ∂f/∂y``; Krylov solvers
    (``"spgmr"``/``"spbcg"``/``"sptfqmr"``) get the exact ``(cj I − J) v``.
    ``solve(tout)`` starts from ``y0`` and ``ẏ0 = f(t0, y0)``.

    Parameters
    ----------
    source, model, jacobian, rtol, atol, p, forcing, y0, axis, threads, negative, nonnegative, build_options, per_cell
        As in :func:`cvode`.
    linsolver : str
        ``"auto"`` (default, ``"dense"``: see ``precond``), ``"dense"``,
        ``"spgmr"``, ``"spbcg"`` or ``"sptfqmr"``.
    precond : None
        Refused otherwise: scikits.odes 2.7 cannot call an IDA
        preconditioner.
    precond_type : str
        As in :func:`cvode` (unused without a preconditioner).
    **options
        Passed to scikits.odes (``max_steps`` defaults to :data:`MAX_STEPS`,
        counted by :meth:`SundialsProblem.solve`'s one-step loop).

    Returns
    -------
    SundialsProblem
        The configured solver, its callbacks and counters.
    """
    return _build("ida", source, model=model, linsolver=linsolver, precond=precond,
                  jacobian=jacobian, rtol=rtol, atol=atol, p=p, forcing=forcing, y0=y0, axis=axis,
                  precond_type=precond_type, jtimes="newton", threads=threads,
                  build_options=cell_options(build_options, per_cell, "build_options"), options=options,
                  negative=negative, nonnegative=nonnegative)


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: sundials``) -- keep below
# ---------------------------------------------------------------------------



def _find_odes() -> bool:
    """Whether ``scikits.odes`` can be imported, without importing anything.

    ``find_spec("scikits.odes")`` would import the ``scikits`` namespace
    package; look for the ``odes`` subpackage on its search path instead.
    """
    try:
        if "scikits" in sys.modules:  # often pre-imported by scikits.odes' nspkg .pth
            locations = getattr(sys.modules["scikits"], "__path__", None)
        else:
            parent = importlib.util.find_spec("scikits")
            locations = parent.submodule_search_locations if parent else None
        if not locations:
            return False
        return importlib.machinery.PathFinder.find_spec("scikits.odes", list(locations)) is not None
    except (ImportError, ValueError):
        return False


@hookimpl
def esmjac_adapter() -> Adapter:
    version = dist_version("scikits.odes")
    kinds = {"sundials.cvode": cvode, "sundials.ida": ida}
    if _find_odes():
        return Adapter("sundials", version, kinds, True,
                       f"scikits.odes {version or '(version unknown)'} (SUNDIALS CVODE/IDA)")
    return Adapter("sundials", version, kinds, False,
                   "scikits.odes is not installed; pip install 'esmjac[sundials]' "
                   "(needs libsundials-dev), or use kind 'scipy.ivp'")


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
