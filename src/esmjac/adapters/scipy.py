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

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import JacError
from ..plugins.hookspecs import Adapter, dist_version, hookimpl, module_available

__all__ = ["ivp", "IvpProblem", "METHODS", "AUTO_SERIAL_BELOW"]

#: solve_ivp methods and whether they take a Jacobian.
METHODS = {"BDF": True, "Radau": True, "LSODA": True, "RK45": False, "RK23": False, "DOP853": False}


# ---------------------------------------------------------------------------
# shared helpers (also used by the sundials adapter)
# ---------------------------------------------------------------------------

def _programs(source, model, build_options):
    """(RhsProgram, JacobianProgram wrt states, Csr plan) of ``source``."""
    from ..layouts.types import Csr
    from ..runtime.programs import JacobianProgram, RhsProgram
    # The Jacobian first: a model the calculus refuses is refused with the
    # same code (underivable_operator...) as ``esmjac bands`` gives it.
    try:
        j = JacobianProgram.build(source, model, "states", options=build_options)
    except JacError as exc:
        # A right-hand side that provably reads no state (every observed
        # inlined) has the zero Jacobian; the empty-bands gate guards misreads.
        from ..calculus import state_independent
        from ..model.load import load_view
        if exc.code != "empty_bands" or (build_options or {}).get("allow_empty") is False \
                or not state_independent(load_view(source, model)):
            raise
        j = JacobianProgram.build(source, model, "states",
                                  options={**(build_options or {}), "allow_empty": True})
    r = RhsProgram.build(source, model, options=build_options)
    plan = j.plan(Csr(), source=r)
    return r, j, plan


def _key(layout, key: str) -> str:
    """A user name (scoped or bare) as the layout's local name."""
    sc = layout.scope
    return key[len(sc):] if sc and key.startswith(sc) and key[len(sc):] else key


def _element_index(layout, names: tuple, key: str, what: str) -> list:
    """Flat positions in an ``names``-ordered vector addressed by ``key``:
    ``Model.x[i,j]`` / ``x[i,j]`` (one element) or ``x`` (all of x)."""
    k = _key(layout, key)
    base, _, rest = k.partition("[")
    offs, off = {}, 0
    for n in names:
        offs[n] = off
        off += layout.size(n)
    if base not in offs:
        hint = ""
        if base in getattr(layout, "forcing", ()) and what != "forcing":
            hint = f" (`{base}` is a per-cell parameter: pass it in forcing=)"
        elif base in getattr(layout, "params", ()) and what == "forcing":
            hint = f" (`{base}` is a scalar parameter: pass it in p=)"
        raise JacError("bad_argument", f"unknown {what} `{key}`{hint}; known: {', '.join(names)}")
    shape = layout.shapes.get(base, ())
    if not rest:
        return list(range(offs[base], offs[base] + layout.size(base)))
    try:
        idx = tuple(int(x) - 1 for x in rest.rstrip("]").split(","))
    except ValueError:
        raise JacError("bad_argument", f"cannot read the element index of `{key}`") from None
    if len(idx) != len(shape) or any(not 0 <= i < n for i, n in zip(idx, shape)):
        raise JacError("bad_argument", f"`{key}` is outside the shape {shape} of `{base}`")
    return [offs[base] + int(np.ravel_multi_index(idx, shape))]


def _fill(base: np.ndarray | None, layout, names: tuple, value, n: int, what: str) -> np.ndarray:
    """A flat float64 vector of length ``n``: ``value`` as an array, or a
    dict overriding ``base`` (element keys set one element; variable keys
    take a scalar or an array of the variable's shape)."""
    if value is None:
        if base is None:
            raise JacError("bad_argument",
                           f"the document gives no usable default for the {what}; pass it")
        return np.array(base, dtype=np.float64, copy=True)
    if isinstance(value, dict):
        if base is None:
            raise JacError("bad_argument", f"the document gives no usable default for the {what}; "
                           "pass a full vector instead of a dict")
        out = np.array(base, dtype=np.float64, copy=True)
        for key, val in value.items():
            pos = _element_index(layout, names, str(key), what)
            arr = np.asarray(val, dtype=np.float64)
            if arr.size not in (1, len(pos)):
                raise JacError("bad_argument", f"`{key}` takes 1 or {len(pos)} values, got {arr.size}")
            out[pos] = np.ravel(arr) if arr.size == len(pos) else float(arr.reshape(-1)[0])
        return out
    arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64).reshape(-1))
    if arr.shape[0] != n:
        raise JacError("bad_argument", f"the {what} must have {n} entries, got {arr.shape[0]}")
    return arr.copy()


def _route_cell_parameters(lay, p, forcing):
    """Per-cell parameters are forcing fields of the programs (one value per
    cell); a ``p=`` dict naming one is moved to ``forcing=`` (the same
    override, where the programs take it). A full ``forcing`` vector beside
    such a key is ambiguous and refused."""
    if not isinstance(p, dict):
        return p, forcing
    moved = {k: v for k, v in p.items() if _key(lay, str(k)).partition("[")[0] in lay.forcing}
    if not moved:
        return p, forcing
    if forcing is not None and not isinstance(forcing, dict):
        raise JacError("bad_argument",
                       f"{', '.join(map(str, moved))}: per-cell parameter(s) given in p= while forcing= "
                       "is a full vector; put them in that vector (they are forcing fields) or pass "
                       "forcing as a dict")
    both = set(moved) & set(forcing or {})
    if both:
        raise JacError("bad_argument", f"{', '.join(sorted(map(str, both)))} given in both p= and forcing=")
    return ({k: v for k, v in p.items() if k not in moved}, {**(forcing or {}), **moved})


def _inputs(r, y0, p, forcing, source=None, model=None) -> tuple:
    """(y0, p, forcing) flat float64 vectors (forcing None when the model has none).

    ``p`` may name per-cell parameters (shape ``[cell]``): they are forcing
    fields of the compiled programs and go there (an array of one value per
    cell, or a scalar for all). A ``p`` dict also moves the initial state the
    document derives from parameters (``ic(w) = 2 A``, parameter-defaulted
    states), as earthsci-ast's problem does, unless ``y0`` is a full vector."""
    lay = r.layout
    u0 = r.u0
    if isinstance(p, dict) and p and source is not None and not (y0 is not None and not isinstance(y0, dict)):
        u0 = _derived_initial_state(r, source, model, p, u0)
    p, forcing = _route_cell_parameters(lay, p, forcing)
    y = _fill(u0, lay, lay.states, y0, r.u_size(r.cells if r.kind == "cell" else 1), "initial state")
    pv = _fill(r.p0, lay, lay.params, p, len(lay.params), "parameter vector")
    nf = r.f_size(r.cells if r.kind == "cell" else 1)
    if nf == 0:
        if forcing is not None and not (isinstance(forcing, dict) and not forcing):
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        f = None
    else:
        f = _fill(r.forcing0, lay, lay.forcing, forcing, nf, "forcing")
    return y, pv, f


def _derived_initial_state(r, source, model, p: dict, u0):
    """The document's initial state under the parameter overrides ``p``
    (``reference.oracle.resolve_point``: the same rules as the build's
    defaults); ``u0`` unchanged where the document gives none."""
    from ..model.load import load_view
    from ..reference.oracle import resolve_point
    lay = r.layout
    view = load_view(source, model)
    try:
        pt = resolve_point(view, None, p, 0.0, list(lay.states) + list(lay.all_params))
    except JacError as exc:
        if exc.code == "bad_argument" and u0 is None:
            return None          # still no usable default: _fill says so
        raise
    return np.concatenate([np.ravel(np.asarray(pt.values[s], dtype=np.float64)) for s in lay.states]) \
        if lay.states else np.zeros(0)


def _pattern(plan) -> tuple:
    """(rows, cols, n) of the Csr plan's entries in CSR data order."""
    indptr, cols, shape = plan.csr_index()
    cols = np.asarray(cols, dtype=np.int64)
    n = int(shape[0])
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    return rows, cols, n


#: ``threads="auto"``: the programs themselves run calls below this many
#: unknowns on one thread (``esmjac.program.SERIAL_BELOW``).
from ..runtime.programs import SERIAL_BELOW as AUTO_SERIAL_BELOW  # noqa: E402


def _thread_count(threads, n: int):
    """The numba thread count callbacks run with (None: leave numba's
    setting; ``"measure"``: decide at build time, see :func:`_measure_threads`)."""
    if threads is None:
        return None
    if threads == "auto":
        # Small calls: the programs run them on one thread themselves.
        # Large ones: whichever of one thread or numba's count is faster
        # here, measured once the callbacks exist.
        return None if n < AUTO_SERIAL_BELOW else "measure"
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise JacError("bad_option", f"threads must be 'auto', None or a positive int, not {threads!r}")
    import numba
    return min(int(threads), int(numba.config.NUMBA_NUM_THREADS))


def _measure_threads(call) -> int | None:
    """``threads="auto"`` on a large problem: the measured choice of
    :func:`esmjac.runtime.threads.measure_threads` (one place for it)."""
    from ..runtime.threads import measure_threads
    return measure_threads(call)


def _with_threads(nthreads, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with numba's (thread-local) thread count set to ``nthreads``.

    esmjac's kernels are ``parallel=True``; on small problems the fork/join
    of every call costs far more than the work (milliseconds per call on a
    busy machine, against microseconds serially); the programs run small
    calls serially on their own, this pins an explicit count."""
    if nthreads is None:
        return fn(*args, **kwargs)
    import numba
    prev = numba.get_num_threads()
    if prev == nthreads:
        return fn(*args, **kwargs)
    numba.set_num_threads(nthreads)
    try:
        return fn(*args, **kwargs)
    finally:
        numba.set_num_threads(prev)


def _bandwidths(rows, cols) -> tuple:
    d = rows - cols
    return int(max(0, d.max(initial=0))), int(max(0, (-d).max(initial=0)))


# ---------------------------------------------------------------------------
# the problem object
# ---------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class IvpProblem:
    """What ``scipy.integrate.solve_ivp`` needs, from compiled esmjac programs.

    ``fun(t, y)`` and ``jac(t, y)`` evaluate at the fixed parameter vector
    ``p`` and forcing ``forcing``. One problem object owns its scratch
    buffers: do not share it between threads (build one per thread).
    """

    rhs: Any                   # RhsProgram
    jacobian: Any              # JacobianProgram (wrt="states")
    plan: Any                  # Csr ScatterPlan
    y0: np.ndarray
    names: Any                 # element names (a lazy sequence)
    p: np.ndarray
    forcing: np.ndarray | None
    method: str
    banded: bool
    lband: int | None
    uband: int | None
    jac_sparsity: Any          # scipy.sparse.csc_matrix of ones (structural pattern)
    _st: dict = field(repr=False)

    # -- counters --------------------------------------------------------------
    @property
    def nfev(self) -> int:
        """Calls of ``fun`` since creation / :meth:`reset_counters`."""
        return self._st["nfev"]

    @property
    def njev(self) -> int:
        """Calls of ``jac`` since creation / :meth:`reset_counters`."""
        return self._st["njev"]

    @property
    def n(self) -> int:
        return int(self.y0.shape[0])

    def reset_counters(self) -> None:
        self._st["nfev"] = 0
        self._st["njev"] = 0

    # -- callables -----------------------------------------------------------------
    @property
    def threads(self):
        """numba threads the callbacks run with (None: numba's own setting)."""
        return self._st["threads"]

    def fun(self, t, y) -> np.ndarray:
        """``dy/dt = f(t, y)`` (a new array: the solvers keep it)."""
        st = self._st
        st["nfev"] += 1
        out = _fresh(st["pool_f"], self.n, st["run_f"])
        _with_threads(st["threads"], st["run_f"], np.ascontiguousarray(y, dtype=np.float64),
                      self.p, t, self.forcing, out)
        return out

    def jac_data(self, t, y) -> np.ndarray:
        """The Jacobian's values in CSR order of ``plan`` (a new array)."""
        st = self._st
        data = np.empty(st["nnz"])
        if st["run_csr"] is None:           # BDF/Radau use the Csc plan; CSR only on request
            st["run_csr"] = self.jacobian.bind(self.plan, st["ws"], keep_point=False)
        _with_threads(st["threads"], st["run_csr"], np.ascontiguousarray(y, dtype=np.float64),
                      self.p, t, self.forcing, data)
        return data

    def jac(self, t, y):
        """``∂f/∂y`` at (t, y) in the form ``method`` takes (see module doc)."""
        from scipy.sparse import csc_matrix
        st = self._st
        st["njev"] += 1
        n = self.n
        if self.method == "LSODA":
            data = self.jac_data(t, y)
            if self.banded:
                out = np.zeros((self.lband + self.uband + 1) * n)
                out[st["band_pos"]] = data
                return out.reshape(self.lband + self.uband + 1, n)
            out = np.zeros(n * n)
            out[st["dense_pos"]] = data
            return out.reshape(n, n)
        # The CSC plan writes SciPy's order directly; the (read-only) index
        # arrays are shared by every matrix returned, the values are new.
        data = _fresh(st["pool_j"], st["nnz"], st["run_csc"])
        _with_threads(st["threads"], st["run_csc"], np.ascontiguousarray(y, dtype=np.float64),
                      self.p, t, self.forcing, data)
        return csc_matrix((data, st["csc_indices"], st["csc_indptr"]), shape=(n, n))

    def jac_csr(self, t, y):
        """``∂f/∂y`` at (t, y) as a ``scipy.sparse.csr_array`` (any method)."""
        from scipy.sparse import csr_array
        n = self.n
        ip, ix, _ = self.plan.csr_index(self._st["ws"].lanes)
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
        return _with_threads(self._st["threads"], solve_ivp, self.fun, t_span,
                             np.asarray(y0, dtype=np.float64), method=method, **opts)


def ivp(source, *, model=None, method="BDF", p=None, forcing=None, y0=None, banded=False,
        threads="auto", build_options=None, **options) -> IvpProblem:
    """Build an :class:`IvpProblem` for ``scipy.integrate.solve_ivp``.

    ``source``: an ``.esm`` path, a document dict or JSON text; ``model``
    chooses a model. ``method``: a ``solve_ivp`` method (``BDF`` default,
    ``Radau``, ``LSODA``; explicit ``RK45``/``RK23``/``DOP853`` get no
    Jacobian). ``p``/``forcing``/``y0``: ``None`` (the document's defaults),
    a full flat vector, or a dict of overrides keyed by variable name (a
    scalar or an array of its shape) or element name (``"Chem.O3[3]"``).
    ``banded=True`` (LSODA only): ``jac`` returns LSODA's packed banded form;
    refused when the pattern is not banded (bandwidth > n/2).
    ``threads``: numba threads for ``fun``/``jac`` (``"auto"``: one thread
    below :data:`AUTO_SERIAL_BELOW` unknowns; above, one thread or numba's
    thread count, whichever a timed call at build time finds faster --
    ``prob.threads`` says which; ``None``: numba's setting; an int). ``build_options``: options of
    ``RhsProgram.build``/``JacobianProgram.build``.
    """
    if options:
        raise JacError("bad_option", f"unknown option(s) {', '.join(sorted(options))} of scipy.ivp; "
                       "known: model, method, p, forcing, y0, banded, threads, build_options")
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
    r, j, plan = _programs(source, model, build_options)
    yv, pv, fv = _inputs(r, y0, p, forcing, source, model)
    rows, cols, n = _pattern(plan)
    lband = uband = None
    ws = j.new_workspace(keep_slab=False)
    st: dict = {"nfev": 0, "njev": 0, "ws": ws, "threads": _thread_count(threads, n),
                "nnz": plan.out_size(ws.lanes), "run_f": r.bind(), "pool_f": [], "pool_j": [],
                "run_csr": j.bind(plan, ws, keep_point=False) if method == "LSODA" else None}
    if banded:
        lband, uband = _bandwidths(rows, cols)
        if max(lband, uband) > n / 2:
            raise JacError("bad_option",
                           f"the Jacobian is not banded (lower/upper bandwidth {lband}/{uband} of "
                           f"n = {n}); LSODA's banded form would be mostly zeros. Use the sparse "
                           "Jacobian instead: ivp(..., method='BDF') or method='Radau' "
                           "(or LSODA with banded=False, dense)")
        st["band_pos"] = (uband + rows - cols) * n + cols
    elif method == "LSODA":
        st["dense_pos"] = rows * n + cols
    from ..layouts.types import Csc
    csc = j.plan(Csc(), source=r)
    if METHODS[method] and method != "LSODA":
        st["run_csc"] = j.bind(csc, ws, keep_point=False)
    ip, ix, _ = csc.sparse_index(ws.lanes)
    st["csc_indptr"], st["csc_indices"] = _ro_index(ip), _ro_index(ix)
    pattern = csc_matrix((np.ones(ix.size), st["csc_indices"], st["csc_indptr"]), shape=(n, n))
    prob = IvpProblem(r, j, plan, yv, r.names, pv, fv, method, bool(banded), lband, uband,
                      pattern, st)
    if st["threads"] == "measure":
        st["threads"] = None
        _warm_calls(prob.fun, prob.jac if METHODS[method] else None, yv)   # both twins compiled
        st["threads"] = _measure_threads(lambda: (prob.fun(0.0, yv),
                                                  prob.jac(0.0, yv) if METHODS[method] else None))
    _warm_calls(prob.fun, prob.jac if METHODS[method] else None, yv)
    prob.reset_counters()
    return prob


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


def _fresh(pool: list, n: int, bound=None) -> np.ndarray:
    """An output array no one else holds: one this problem returned before
    and every caller has since dropped (only the pool refers to it: no
    matrix, view or solver state), else a new one. The solvers keep what
    ``fun``/``jac`` return for a while; reusing only released arrays keeps
    them correct and saves the page faults of a fresh megabyte per call."""
    import sys
    seen = getattr(bound, "_seen", ())      # the binding keeps its last output (identity fast path)
    for a in pool:
        # the pool's list, this loop's name, the call's argument (+ the binding's record)
        if sys.getrefcount(a) <= (4 if seen and a is seen[0] else 3):
            return a
    a = np.empty(n)
    if len(pool) < 4:
        pool.append(a)
    return a


def _ro_index(a: np.ndarray) -> np.ndarray:
    """A read-only int32 copy of an index array (SciPy's index dtype below
    2³¹ entries), shared by every matrix a problem returns."""
    out = np.array(a, dtype=np.int32 if a.size < 2**31 - 1 else np.int64)
    out.setflags(write=False)
    return out


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
    return Adapter("scipy", version, kinds, False,
                       "scipy is not installed; pip install 'scipy>=1.10'")




# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
