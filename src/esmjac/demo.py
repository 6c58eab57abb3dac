"""The main job, on the bundled model: load, build, verify, summarise, solve.

``esmjac demo`` (what ``make demo`` runs) builds the exact Jacobian of our
15-species tropospheric mechanism, verifies it against finite differences
of ``earthsci_ast.evaluate_rhs``, compiles the right-hand side and Jacobian
programs for a grid of cells (photolysis and initial state varying per cell)
-- timed on their own, and warmed so that no solve pays for compilation --
and then integrates two hours of chemistry with SciPy's BDF three ways:

* with esmjac's sparse exact Jacobian,
* with SciPy's finite differences told the sparsity pattern
  (``jac_sparsity``: grouped columns, the fair peer), and
* with SciPy's default (dense finite differences), skipped where its dense
  n×n matrices would not fit in :data:`DENSE_LIMIT` unknowns (it says so).

It prints each solve's time and call counts, the speed-ups and how far the
solutions differ (relative to each species' scale).
"""
from __future__ import annotations

import time
from importlib.resources import files

import numpy as np

from .errors import JacError

__all__ = ["run_demo", "DENSE_LIMIT", "MAX_CELLS"]

#: Unknowns above which the dense finite-difference comparison is skipped:
#: SciPy's BDF keeps the dense Jacobian and its LU (2 × n² doubles, 100 MB at
#: 2500 unknowns) and spends n RHS calls per Jacobian.
DENSE_LIMIT = 2500

#: Largest ``cells`` the demo accepts: the sparse solves stay within a few
#: seconds each there (measured: see the README's performance notes).
MAX_CELLS = 1000

_RTOL, _ATOL = 1e-6, 1e3              # molec/cm^3: far below every species' level


def _timed(fn, *args, **kwargs):
    t0 = time.perf_counter()
    res = fn(*args, **kwargs)
    return res, time.perf_counter() - t0


def run_demo(cells: int = 48, t_end: float = 7200.0, out=print, progress: bool | None = None) -> int:
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
    prob, t_build = _timed(ivp, doc, method="BDF", forcing=forcing, y0=y0,
                           build_options=None if progress is None else {"progress": bool(progress)})
    n = prob.n
    out(f"build      : {cells} cells = {n} unknowns ({prob.jacobian.kind} lanes): RHS + Jacobian "
        f"programs compiled and warmed in {t_build:.2f} s")
    out(f"             (once: kernels are cached in {cache_dir()}; the solves below pay nothing for it)")
    span = (0.0, t_end)
    tol = dict(rtol=_RTOL, atol=_ATOL)
    import os
    blas = os.environ.get("OPENBLAS_NUM_THREADS")
    out(f"solve      : {cells} cells x {len(states)} species, {t_end:.0f} s of chemistry, "
        f"solve_ivp BDF rtol={_RTOL:g} atol={_ATOL:g}; OpenBLAS threads: "
        + (blas if blas else "OpenBLAS's default (OPENBLAS_NUM_THREADS=1 is faster here; see README)"))

    a, t_a = _timed(prob.solve, span, **tol)
    nfev_a, njev_a = prob.nfev, prob.njev
    prob.reset_counters()
    s, t_s = _timed(prob.solve, span, jac=None, jac_sparsity=prob.jac_sparsity, **tol)
    nfev_s = prob.nfev
    runs = [a, s]
    dense = n <= DENSE_LIMIT
    if dense:
        prob.reset_counters()
        d, t_d = _timed(prob.solve, span, jac=None, **tol)
        nfev_d = prob.nfev
        runs.append(d)
    if not all(r.success for r in runs):
        out("solve      : failed (" + " / ".join(r.message for r in runs) + ")")
        return 1

    def diff(r) -> float:
        ya, yb = a.y[:, -1], r.y[:, -1]
        return float(np.max(np.abs(ya - yb) / np.maximum(np.abs(ya), _ATOL)))

    out(f"  esmjac exact Jacobian   : {t_a:8.3f} s  ({nfev_a} RHS calls, {njev_a} Jacobians)")
    out(f"  SciPy FD + jac_sparsity : {t_s:8.3f} s  ({nfev_s} RHS calls, {s.njev} grouped-FD Jacobians)"
        f"; differs by {diff(s):.1e}")
    if dense:
        out(f"  SciPy default (dense FD): {t_d:8.3f} s  ({nfev_d} RHS calls, {d.njev} dense-FD "
            f"Jacobians); differs by {diff(d):.1e}")
    else:
        out(f"  SciPy default (dense FD): skipped: {n} unknowns > {DENSE_LIMIT} (its dense Jacobian "
            f"and LU would take {2 * 8 * n * n / 2**30:.1f} GiB and {n} RHS calls per Jacobian)")
    line = f"  speed-up : {t_s / t_a:.1f}x over SciPy with jac_sparsity (the fair peer)"
    if dense:
        line += f", {t_d / t_a:.1f}x over SciPy's default"
    out(line + "  (differences: max over species and cells, relative to max(|y|, atol))")
    return 0
