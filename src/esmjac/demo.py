"""The main job, on the bundled model: load, build, verify, summarise, solve.

``esmjac demo`` (what ``make demo`` runs) builds the exact Jacobian of our
15-species tropospheric mechanism, verifies it against finite differences
of ``earthsci_ast.evaluate_rhs``, compiles the right-hand side and Jacobian
programs for a grid of cells (photolysis and initial state varying per cell)
-- timed on their own, and warmed so that no solve pays for compilation --
and then integrates a day of chemistry with SciPy's BDF:

* with esmjac's sparse exact Jacobian,
* with SciPy's finite differences told the sparsity pattern
  (``jac_sparsity``: grouped columns, the fair peer), and
* with SciPy's default (dense finite differences), skipped above
  :data:`DENSE_LIMIT` unknowns (it says so): its dense LU per step grows
  as n³.

What is compared is the Jacobian alone: every route is the same
``solve_ivp`` BDF call with the same compiled right-hand side (esmjac's
``fun``, one thread), the same tolerances and span. Each solve runs twice,
interleaved, and the better CPU time of the calling thread
(``time.thread_time``; the whole solve runs on it) is printed with the call
counts; the solutions are checked against each other (relative to each
species' scale) and the demo fails if they differ by more than
:data:`AGREE`.

A day, not the first hours: a two-hour run is the start-up transient, where
BDF keeps one Jacobian for many steps (7 Jacobians in 153 steps) and
SciPy's own per-step work (its sparse LU and solves, the same on every
route) is most of the time; over a day the chemistry moves on and BDF asks
for a Jacobian about every tenth step, as a user's run does.
"""
from __future__ import annotations

import time
from importlib.resources import files

import numpy as np

from .errors import JacError

__all__ = ["run_demo", "DENSE_LIMIT", "MAX_CELLS", "AGREE"]

#: Unknowns above which the dense finite-difference comparison is skipped:
#: SciPy's BDF factors the dense n×n iteration matrix at every step-size
#: change (about 90 times a day here) and spends n RHS calls per Jacobian.
DENSE_LIMIT = 1000

#: Largest ``cells`` the demo accepts: the sparse solves stay within a few
#: seconds each there (measured: see the README's performance notes).
MAX_CELLS = 1000

#: Largest relative difference (to max(|y|, atol)) allowed between the
#: routes' final states: a few times the tolerance.
AGREE = 1e-4

_RTOL, _ATOL = 1e-6, 1e3              # molec/cm^3: far below every species' level


def _timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    res = fn(*args, **kwargs)
    return res, time.perf_counter() - t0


def _cpu(fn, *args, **kwargs):
    """``fn(...)`` and the CPU seconds of this thread it took."""
    t0 = time.thread_time()
    res = fn(*args, **kwargs)
    return res, time.thread_time() - t0


def run_demo(cells: int = 200, t_end: float = 86400.0, out=print, progress: bool | None = None) -> int:
    """Run the demo on ``cells`` grid cells; returns a process exit code.

    ``progress``: stage progress bars of the build (``None``: when stderr is
    a terminal)."""
    from .adapters.scipy import ivp
    from .calculus.bandset import BandSet
    from .compile.cache import cache_dir
    from .linalg.factorization import block_lu_plan
    from .models.gridded import gridded_tropo12, tropo12_doc
    from .models.mechanism import lift
    from .reference.check import fd_check

    if not isinstance(cells, int) or not 1 <= cells <= MAX_CELLS:
        raise JacError("bad_option", f"--cells must be an integer in 1..{MAX_CELLS}, not {cells!r}")
    path = str(files("esmjac") / "models" / "tropo12.esm")
    bs, t_bands = _timed(BandSet.build, path)
    view = bs.view
    states = list(view.states)
    out(f"model      : {view.name} (bundled tropo12.esm): {len(states)} species, "
        f"{len(view.parameters)} parameters")
    out(f"bands      : {len(bs.entries)} (wrt=states, {bs.structure}), derived in {t_bands:.2f} s")
    if bs.structure == "block_diagonal":
        plan = block_lu_plan(bs.entries)
        n = len(plan.block_vars)
        out(f"block      : {n}x{n} per cell, {len(plan.pattern)} nonzeros; block LU in Markowitz order "
            f"with {plan.fill} fill-in")
    # The mechanism is per cell: two cells of it check every entry of the
    # block at a quarter of the bundled grid's columns (FD cost grows as n²).
    rep, t_check = _timed(fd_check, lift(tropo12_doc(), 2), points=2)
    out(f"verified   : the mechanism ({len(states)} species x 2 cells) against central differences "
        f"of earthsci_ast.evaluate_rhs, in {t_check:.1f} s")
    out(f"             {rep.summary()}")
    if not rep.ok:
        return 1

    doc, forcing, y0 = gridded_tropo12(cells)
    # One numba thread: the solve then runs on this thread alone (SciPy's is
    # single-threaded), so its CPU time is time.thread_time's.
    prob, t_build = _timed(ivp, doc, method="BDF", forcing=forcing, y0=y0, threads=1,
                           build_options=None if progress is None else {"progress": bool(progress)})
    n = prob.n
    out(f"build      : {cells} cells = {n} unknowns ({prob.jacobian.kind} lanes): RHS + Jacobian "
        f"programs compiled and warmed in {t_build:.2f} s")
    out(f"             (once: kernels are cached in {cache_dir()}; the solves below pay nothing for it)")
    span = (0.0, t_end)
    tol = dict(rtol=_RTOL, atol=_ATOL)
    import os
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    out(f"solve      : {cells} cells x {len(states)} species, {t_end / 3600:g} h of chemistry, "
        f"solve_ivp BDF rtol={_RTOL:g} atol={_ATOL:g}; OpenBLAS threads: "
        + (blas if blas else "OpenBLAS's default (OPENBLAS_NUM_THREADS=1 is faster here; see README)"))
    out("             every route: the same BDF call and compiled RHS (esmjac's fun, one thread); "
        "only the Jacobian differs")
    routes = {"exact": {}, "sparsity": dict(jac=None, jac_sparsity=prob.jac_sparsity)}
    dense = n <= DENSE_LIMIT
    if dense:
        routes["dense"] = dict(jac=None)
    best: dict = {}
    for _ in range(2):                      # interleaved; the better of two CPU times each
        for name, kw in routes.items():
            prob.reset_counters()
            r, cpu = _cpu(prob.solve, span, **kw, **tol)
            if not r.success:
                out(f"solve      : {name} failed ({r.message})")
                return 1
            if name not in best or cpu < best[name][1]:
                best[name] = (r, cpu, prob.nfev, prob.njev)
    a, t_a, nfev_a, njev_a = best["exact"]

    def diff(r) -> float:
        ya, yb = a.y[:, -1], r.y[:, -1]
        return float(np.max(np.abs(ya - yb) / np.maximum(np.abs(ya), _ATOL)))

    s, t_s, nfev_s, _ = best["sparsity"]
    out("  CPU seconds of one thread, the better of two interleaved solves:")
    out(f"  esmjac exact Jacobian   : {t_a:8.3f} s  ({nfev_a} RHS calls, {njev_a} Jacobians, "
        f"{a.nlu} LUs, {len(a.t) - 1} steps)")
    out(f"  SciPy FD + jac_sparsity : {t_s:8.3f} s  ({nfev_s} RHS calls, {s.njev} grouped-FD Jacobians, "
        f"{s.nlu} LUs, {len(s.t) - 1} steps); differs by {diff(s):.1e}")
    worst = diff(s)
    if dense:
        d, t_d, nfev_d, _ = best["dense"]
        worst = max(worst, diff(d))
        out(f"  SciPy default (dense FD): {t_d:8.3f} s  ({nfev_d} RHS calls, {d.njev} dense-FD "
            f"Jacobians, {d.nlu} LUs, {len(d.t) - 1} steps); differs by {diff(d):.1e}")
    else:
        out(f"  SciPy default (dense FD): skipped: {n} unknowns > {DENSE_LIMIT} (a dense {n}x{n} LU "
            f"at every step-size change and {n} RHS calls per Jacobian; try --cells "
            f"{DENSE_LIMIT // len(states)})")
    if worst > AGREE:
        out(f"  the solutions disagree: {worst:.1e} > {AGREE:g} (relative to max(|y|, atol))")
        return 1
    line = f"  speed-up : {t_s / t_a:.1f}x over SciPy with jac_sparsity (the fair peer)"
    if dense:
        line += f", {t_d / t_a:.1f}x over SciPy's default"
    out(line + "  (differences: max over species and cells, relative to max(|y|, atol))")
    return 0
