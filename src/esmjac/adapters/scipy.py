"""SciPy adapter: kind ``"scipy.ivp"`` (``scipy.integrate.solve_ivp``).

:func:`ivp` compiles a model's right-hand side and its exact state Jacobian
once and hands ``scipy.integrate.solve_ivp`` what it wants::

    from esmjac.adapters.scipy import ivp
    prob = ivp("model.esm")                       # method="BDF"
    sol = prob.solve((0.0, 3600.0), rtol=1e-6)    # solve_ivp(fun, span, y0, method, jac=jac)
    prob.nfev, prob.njev

``jac(t, y)`` returns what the chosen method takes: a sparse CSC matrix for
``BDF``/``Radau``, a dense array for ``LSODA``, or -- with
``banded=True`` -- LSODA's packed banded form ``J_packed[uband + i - j, j]
= J[i, j]`` (the ``lband``/``uband`` to pass are attributes of the problem,
and :meth:`IvpProblem.solve` passes them). Element order is
``earthsci_ast.evaluate_rhs``'s (see ``names``).

Nothing here imports SciPy at module import time; :func:`ivp` does.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._frozen import readonly
from ..errors import JacError
from ..layouts.types import Csc
from ..plugins.hookspecs import Adapter, dist_version, hookimpl, module_available
from ..runtime.workspace import JacWorkspace
from ..runtime.threads import SERIAL_BELOW, measure_threads, thread_count, with_threads
from ._common import (Counters, Problem, bandwidths, build_programs, cell_options, csr_pattern, fresh_array,
                      inputs,
                      readonly_index)

__all__ = ["ivp", "IvpProblem", "METHODS", "AUTO_SERIAL_BELOW"]

#: solve_ivp methods and whether they take a Jacobian.
METHODS = {"BDF": True, "Radau": True, "LSODA": True, "RK45": False, "RK23": False, "DOP853": False}


#: ``threads="auto"``: the programs themselves run calls below this many
#: unknowns on one thread (:data:`esmjac.runtime.threads.SERIAL_BELOW`).
AUTO_SERIAL_BELOW = SERIAL_BELOW


@dataclass(frozen=True)
class _JacForms:
    """Where the Jacobian's values go for the chosen method (read-only,
    fixed at build time): the CSC plan's index arrays (SciPy's order,
    written directly), or LSODA's dense / packed banded positions of the
    CSR values."""

    csc_indices: np.ndarray
    csc_indptr: np.ndarray
    dense_pos: np.ndarray | None = None
    band_pos: np.ndarray | None = None
    csr_from_csc: np.ndarray | None = None     # CSR entry k is the Csc plan's value csr_from_csc[k]

    def __post_init__(self):
        for f in ("csc_indices", "csc_indptr", "dense_pos", "band_pos", "csr_from_csc"):
            v = getattr(self, f)
            if v is not None:
                object.__setattr__(self, f, readonly(v))


@dataclass(eq=False)
class _Calls:
    """The bound calls of one problem and the output arrays they recycle
    (mutable, owned by the problem: one thread)."""

    ws: JacWorkspace
    nnz: int                   # values per Jacobian (plan.out_size at the workspace's lanes)
    run_f: Any                 # bound RHS call
    run_csc: Any = None        # bound Jacobian into the Csc plan (BDF/Radau)
    run_csr: Any = None        # bound Jacobian into the Csr plan (LSODA; BDF/Radau reorder run_csc's)
    csc_buf: Any = None        # run_csc's values for jac_data (BDF/Radau)
    pool_f: list = field(default_factory=list)    # fun's outputs (fresh_array)
    pool_j: list = field(default_factory=list)    # jac's (csc_matrix, values, indices, indptr) (_free_matrix)
    pool_d: list = field(default_factory=list)    # jac_data's outputs (fresh_array)
    csc_matrix: Any = None     # scipy.sparse.csc_matrix, imported once by ivp()


# ---------------------------------------------------------------------------
# the problem object
# ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class IvpProblem(Problem):
    """What ``scipy.integrate.solve_ivp`` needs, from compiled esmjac programs.

    ``fun(t, y)`` and ``jac(t, y)`` evaluate at the fixed parameter vector
    ``p`` and forcing ``forcing``. One problem object owns its scratch
    buffers: do not share it between threads (build one per thread).
    """

    method: str
    banded: bool
    lband: int | None
    uband: int | None
    jac_sparsity: Any          # scipy.sparse.csc_matrix of ones (structural pattern)
    threads: int | None        # numba threads the callbacks run with (None: numba's own setting)
    counters: Counters         # nfev / njev since creation or reset_counters()
    _forms: _JacForms
    _calls: _Calls
    _f_threads: int | None = field(init=False, default=None, repr=False)   # set by __post_init__

    # -- counters --------------------------------------------------------------
    @property
    def nfev(self) -> int:
        """Calls of ``fun`` since creation / :meth:`reset_counters`."""
        return self.counters.nfev

    @property
    def njev(self) -> int:
        """Calls of ``jac`` since creation / :meth:`reset_counters`."""
        return self.counters.njev

    def reset_counters(self) -> None:
        self.counters.reset()

    # -- callables -----------------------------------------------------------------
    def fun(self, t, y) -> np.ndarray:
        """``dy/dt = f(t, y)``: an array that is the caller's for as long as
        it holds it (or a view of it). The solvers keep what ``fun`` returns
        for a while; ``fun`` writes into an array it returned before only
        once nothing but the problem refers to it (``_common.fresh_array``),
        which saves a fresh megabyte-scale allocation and its page faults
        per call."""
        c = self._calls
        self.counters.nfev += 1
        out = fresh_array(c.pool_f, self.n, c.run_f)
        with_threads(self._f_threads, c.run_f, _state(y),
                     self.p, float(t), self.forcing, out)
        return out

    def jac_data(self, t, y) -> np.ndarray:
        """The Jacobian's values in CSR order of ``plan`` (the caller's for
        as long as it holds them, as ``fun``'s output)."""
        c = self._calls
        if c.run_csr is None:
            # BDF/Radau: the Csc plan's values (the kernel the build
            # compiled), reordered -- no second kernel to compile on first use
            data = fresh_array(c.pool_d, c.nnz)
            if c.run_csc is None:           # an explicit method: no jac, bound on request
                c.run_csc = self.jacobian.bind(self.jacobian.plan(Csc(), source=self.rhs), c.ws,
                                               keep_point=False)
            with_threads(self.threads, c.run_csc, _state(y),
                         self.p, float(t), self.forcing, c.csc_buf)
            perm = self._forms.csr_from_csc
            assert perm is not None                 # set at build for every method but LSODA
            np.take(c.csc_buf, perm, out=data)
            return data
        data = fresh_array(c.pool_d, c.nnz, c.run_csr)
        with_threads(self.threads, c.run_csr, _state(y),
                     self.p, float(t), self.forcing, data)
        return data

    def __post_init__(self):
        # Decided once, at build: the instance's own ``jac`` is the form
        # ``method`` takes, so a call neither branches on the method nor
        # imports SciPy (``dataclasses.replace`` decides again for the copy).
        object.__setattr__(self, "jac", self._jac_form())
        # ``fun``'s thread count, decided once: a serial binding (below
        # SERIAL_BELOW unknowns: serial twins only) runs no Numba parallel
        # region, so switching the calling thread's count around each call
        # (two set_num_threads, ~10 us at 3,000 unknowns) changes nothing
        object.__setattr__(self, "_f_threads",
                           None if getattr(self._calls.run_f, "serial", False) else self.threads)

    def _jac_form(self):
        if self.method != "LSODA":
            return self._jac_csc
        return self._jac_banded if self.banded else self._jac_dense

    def jac(self, t, y):
        """``∂f/∂y`` at (t, y) in the form ``method`` takes (see module doc):
        a ``scipy.sparse.csc_matrix`` (BDF, Radau), a dense array (LSODA) or
        LSODA's packed banded form (``banded=True``). A built problem's
        ``jac`` is that form's method itself, chosen at build."""
        return self._jac_form()(t, y)

    def _jac_dense(self, t, y):
        self.counters.njev += 1
        n = self.n
        data = self.jac_data(t, y)
        out = np.zeros(n * n)
        out[self._forms.dense_pos] = data
        return out.reshape(n, n)

    def _jac_banded(self, t, y):
        if self.lband is None or self.uband is None:
            raise JacError("internal_error", "a banded Jacobian of a problem built without bandwidths")
        self.counters.njev += 1
        n, w = self.n, self.lband + self.uband + 1
        data = self.jac_data(t, y)
        out = np.zeros(w * n)
        out[self._forms.band_pos] = data
        return out.reshape(w, n)

    def _jac_csc(self, t, y):
        self.counters.njev += 1
        n, fm, c = self.n, self._forms, self._calls
        # The CSC plan writes SciPy's order directly; the (read-only) index
        # arrays are shared by every matrix returned. A matrix returned
        # before is refilled only when nobody holds it, its values or a
        # view of them (a solver keeps its last Jacobian), and it is
        # intact: building a csc_matrix costs 40-100 µs of SciPy's checks
        # per call at 10⁴ cells, ~8% of the Jacobian itself.
        m, d = _free_matrix(c.pool_j, c.run_csc, (n, n))
        if m is None:
            m = c.csc_matrix((np.empty(c.nnz), fm.csc_indices, fm.csc_indptr), shape=(n, n))
            d = m.data
            if len(c.pool_j) < 4:
                c.pool_j.append((m, d, m.indices, m.indptr))
        with_threads(self.threads, c.run_csc, _state(y),
                     self.p, float(t), self.forcing, d)
        return m

    def jac_csr(self, t, y):
        """``∂f/∂y`` at (t, y) as a ``scipy.sparse.csr_array`` (any method)."""
        from scipy.sparse import csr_array
        n = self.n
        ip, ix, _ = self.plan.csr_index(self._calls.ws.lanes)
        return csr_array((self.jac_data(t, y), ix, ip), shape=(n, n))

    # -- convenience --------------------------------------------------------------------
    def solve(self, t_span, **kwargs):
        """``scipy.integrate.solve_ivp(fun, t_span, y0, method=method, jac=jac, ...)``.

        ``kwargs`` go to ``solve_ivp`` and override the defaults (``y0=``,
        ``jac=None`` for SciPy's own finite differences, ``rtol``, ``t_eval``…).
        """
        from scipy.integrate import solve_ivp
        opts: dict = {}
        if METHODS[self.method]:
            opts["jac"] = self.jac
            if self.banded:
                opts["lband"], opts["uband"] = self.lband, self.uband
        opts.update(kwargs)
        y0 = opts.pop("y0", self.y0)
        method = opts.pop("method", self.method)
        if method != self.method:
            raise JacError("bad_option", f"this problem's jac is shaped for method {self.method!r}; "
                           f"build ivp(..., method={method!r}) for {method!r}")
        # One thread-count switch for the whole run (fun/jac then find it set).
        return with_threads(self.threads, solve_ivp, self.fun, t_span,
                            np.asarray(y0, dtype=np.float64), method=method, **opts)


def _state(y) -> np.ndarray:
    """``y`` in the one signature the build warmed: C-contiguous float64 and
    writable. A read-only ``y`` (solve_ivp's first calls pass the problem's
    read-only ``y0`` as is) would make Numba compile every kernel again for
    ``Array(..., readonly=True)`` inside the first solve (12 s CPU cold on
    the demo); a copy of one vector is nothing next to that."""
    y = np.ascontiguousarray(y, dtype=np.float64)
    return y if y.flags.writeable else y.copy()


def _free_matrix(pool: list, bound, shape: tuple) -> tuple:
    """``(matrix, values)`` of a pooled record ``(matrix, values, indices,
    indptr)`` (as ``jac`` built it) that nobody but the pool refers to --
    not the matrix, not its values (no view, no SciPy wrapper sharing them,
    which is what BDF keeps), not the array under them -- and that is
    still as built (the same arrays, writable values, the same shape), so
    its values are safe to overwrite; ``(None, None)`` if there is none."""
    seen = getattr(bound, "_seen", ())     # the binding keeps its last output (identity fast path)
    last = seen[0] if seen else None
    for rec in pool:
        m, d, ix, ip = rec
        # references to m: the record, this name, the argument
        if sys.getrefcount(m) > 3:
            continue
        # to d: the matrix, the record, this name, the argument (+ the binding's record)
        if sys.getrefcount(d) > (5 if d is last else 4):
            continue
        b = d.base                         # SciPy may keep a view of the array it was given
        # to b: d's base, this name, the argument
        if b is not None and (sys.getrefcount(b) > 3 or b.base is not None):
            continue
        if m.__dict__.get("data") is d and m.indices is ix and m.indptr is ip and d.flags.writeable \
                and d.flags.c_contiguous and m.shape == shape:
            return m, d
    return None, None


def ivp(source, *, model=None, method="BDF", p=None, forcing=None, y0=None, banded=False,
        threads="auto", build_options=None, per_cell=None, **options) -> IvpProblem:
    """Build an :class:`IvpProblem` for ``scipy.integrate.solve_ivp``.

    The right-hand side and the exact state Jacobian are compiled once;
    ``prob.solve(t_span)`` (or ``solve_ivp(prob.fun, ..., jac=prob.jac)``)
    then integrates.

    Parameters
    ----------
    source : str, os.PathLike or dict
        An ``.esm`` path, a document dict or its JSON text.
    model : str, optional
        The model to build (default: the whole document, flattened).
    method : str
        A ``solve_ivp`` method: ``"BDF"`` (default), ``"Radau"``,
        ``"LSODA"``; the explicit ``"RK45"``/``"RK23"``/``"DOP853"`` get
        no Jacobian.
    p, forcing, y0 : array_like or dict, optional
        None (the document's defaults), a full flat vector, or a dict of
        overrides keyed by variable name (a scalar or an array of its
        shape) or element name (``"Chem.O3[3]"``).
    banded : bool
        LSODA only: ``jac`` returns LSODA's packed banded form; refused
        when the pattern is not banded (bandwidth > n/2).
    threads : "auto", int or None
        Numba threads for ``fun``/``jac``. ``"auto"``: one thread below
        :data:`AUTO_SERIAL_BELOW` unknowns; above, one thread or Numba's
        thread count, whichever a timed call at build time finds faster
        (``prob.threads`` says which). None: Numba's setting.
    build_options : dict, optional
        Options of ``RhsProgram.build``/``JacobianProgram.build``.
    per_cell : list or tuple of str, optional
        Scalar parameters read per cell from ``forcing`` (temperature,
        photolysis rates): short names where unambiguous (``"T"``),
        qualified always; the build option ``per_lane`` says the same.

    Returns
    -------
    IvpProblem
        ``fun``, ``jac`` (in the form ``method`` takes, chosen here),
        ``y0``, ``jac_sparsity``, ``solve`` and call counters.

    Raises
    ------
    JacError
        ``bad_option`` for an unknown option or method, or ``banded`` with
        a method other than LSODA or an unbanded pattern; the build's own
        codes for a document that cannot be compiled; ``bad_argument`` for a
        document with no ODE states (nothing to integrate).
    """
    build_options = cell_options(build_options, per_cell, "build_options")
    if options:
        raise JacError("bad_option", f"unknown option(s) {', '.join(sorted(options))} of scipy.ivp; "
                       "known: model, method, p, forcing, y0, banded, threads, build_options, per_cell")
    if method not in METHODS:
        raise JacError("bad_option",
                       f"unknown solve_ivp method {method!r}; use one of {', '.join(METHODS)}")
    if banded and method != "LSODA":
        raise JacError("bad_option", f"banded=True is LSODA's packed banded Jacobian; method "
                       f"{method!r} takes a sparse Jacobian (leave banded=False)")
    try:
        import scipy.integrate  # noqa: F401  (fail here, not inside solve)
        from scipy.sparse import csc_matrix
    except ImportError as exc:  # pragma: no cover - scipy is a core dependency
        raise JacError("adapter_unavailable",
                       "scipy is not installed; pip install 'scipy>=1.10'") from exc
    r, j, plan = build_programs(source, model, build_options)
    yv, pv, fv = inputs(r, y0, p, forcing, source, model)
    rows, cols, n = csr_pattern(plan)
    nthreads = thread_count(threads, n)
    lband = uband = None
    band_pos = dense_pos = None
    if banded:
        lband, uband = bandwidths(rows, cols)
        if max(lband, uband) > n / 2:
            raise JacError("bad_option",
                           f"the Jacobian is not banded (lower/upper bandwidth {lband}/{uband} of "
                           f"n = {n}); LSODA's banded form would be mostly zeros. Use the sparse "
                           "Jacobian instead: ivp(..., method='BDF') or method='Radau' "
                           "(or LSODA with banded=False, dense)")
        band_pos = (uband + rows - cols) * n + cols
    elif method == "LSODA":
        dense_pos = rows * n + cols
    ws = j.new_workspace(keep_slab=False)
    calls = _Calls(ws, plan.out_size(ws.lanes), r.bind(),
                   run_csr=j.bind(plan, ws, keep_point=False) if method == "LSODA" else None,
                   csc_matrix=csc_matrix)
    csc = j.plan(Csc(), source=r)
    ip, ix, _ = csc.sparse_index(ws.lanes)
    csr_from_csc = None
    if method != "LSODA":
        # jac_data/jac_csr reorder the Csc plan's values (BDF/Radau: the
        # binding jac uses, warmed below; the explicit methods bind it on
        # their first jac_data call)
        if METHODS[method]:
            calls.run_csc = j.bind(csc, ws, keep_point=False)
        calls.csc_buf = np.empty(calls.nnz)
        csr_from_csc = _csr_from_csc(rows, cols, ix, ip, n)
    forms = _JacForms(readonly_index(ix), readonly_index(ip), dense_pos, band_pos, csr_from_csc)
    pattern = csc_matrix((np.ones(ix.size), forms.csc_indices, forms.csc_indptr), shape=(n, n))
    prob = IvpProblem(r, j, plan, readonly(yv), r.names, readonly(pv),
                      None if fv is None else readonly(fv), method, bool(banded), lband, uband,
                      pattern, None if nthreads == "measure" else nthreads, Counters(), forms, calls)
    if nthreads == "measure":
        _warm_calls(prob.fun, prob.jac if METHODS[method] else None, yv)   # both twins compiled
        prob = dataclasses.replace(prob, threads=measure_threads(
            lambda: (prob.fun(0.0, yv), prob.jac(0.0, yv) if METHODS[method] else None)))
    _warm_calls(prob.fun, prob.jac if METHODS[method] else None, yv)
    prob.reset_counters()
    return prob


def _csr_from_csc(rows, cols, csc_indices, csc_indptr, n: int) -> np.ndarray:
    """For each CSR entry (``rows``/``cols`` in CSR data order), its position
    in the Csc plan's values: the same pattern in the other order (columns
    ascending, rows ascending within each)."""
    counts = np.diff(np.asarray(csc_indptr, dtype=np.int64)).astype(np.int64)
    ccols = np.repeat(np.arange(n, dtype=np.int64), counts)
    key_csc = ccols * n + np.asarray(csc_indices, dtype=np.int64)
    key_csr = cols * n + rows
    perm = np.searchsorted(key_csc, key_csr)
    if perm.size != key_csc.size or np.any(np.diff(key_csc) <= 0) or not np.array_equal(key_csc[perm], key_csr):
        raise JacError("internal_error", "the Csc and Csr plans of one Jacobian differ in pattern")
    return perm


def _warm_calls(fun, jac, y0) -> None:
    """Call ``fun`` (and ``jac``) once at ``y0`` with the thread count the
    solve will use, so that every kernel and dispatch path a solve takes --
    serial or parallel twins, scatter plans, the non-finite scan -- is
    compiled (or loaded from Numba's cache) during the build and the first
    timed call is a warm one. A point the model cannot be evaluated at is
    the solve's business, not the build's."""
    try:
        fun(0.0, y0)
        if jac is not None:
            jac(0.0, y0)
    except JacError as exc:
        if exc.code != "evaluation_error":
            raise


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: scipy``) -- keep below
# ---------------------------------------------------------------------------

@hookimpl
def esmjac_adapter() -> Adapter:
    version = dist_version("scipy")
    kinds = {"scipy.ivp": ivp}
    if module_available("scipy"):  # top level only: find_spec("scipy.integrate") would import scipy
        return Adapter("scipy", version, kinds, True,
                       f"scipy {version or '(version unknown)'} (scipy.integrate.solve_ivp)")
    return Adapter("scipy", version, kinds, False, "scipy is not installed; pip install 'scipy>=1.10'")


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
