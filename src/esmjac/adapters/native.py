"""Native adapter (esmjac's own kernels): kinds ``"native.layouts"`` and ``"native.rosenbrock"``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import JacError
from ..integrators.rosenbrock import rosenbrock as integrate
from ..layouts.types import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from ..model.expr import free_names
from ..plugins.hookspecs import Adapter, dist_version, hookimpl, module_available
from ..runtime.programs import JacobianProgram, RhsProgram


@dataclass(frozen=True)
class NativeLayouts:
    """Programs, one checked plan per applicable layout, and buffer makers
    for an integrator that owns its storage."""

    rhs: Any
    jacobian: Any
    plans: dict                 # layout name → ScatterPlan
    refused: dict               # layout name → why it does not apply

    def buffer(self, layout: str, lanes: int | None = None, dtype=np.float64) -> np.ndarray:
        """A zeroed output array for ``layout`` (``plans[layout].out_size``)."""
        plan = self._plan(layout)
        return np.zeros(plan.out_size(lanes or self.jacobian.cells), dtype=dtype)

    def _plan(self, layout: str):
        if layout not in self.plans:
            why = self.refused.get(layout, "unknown layout")
            raise JacError("bad_option", f"layout {layout!r} is not available for this model ({why}); "
                           f"available: {', '.join(sorted(self.plans))}")
        return self.plans[layout]

    def eval_into(self, layout: str, u, p, t, forcing, out, ws):
        return self.jacobian.eval_into(self._plan(layout), u, p, t, forcing, out, ws)


def layouts(source, *, model=None, options=None, **extra):
    """Build the RHS and Jacobian programs and a plan for every layout that
    applies (LaneBlocks natural/markowitz, LaneSparseBlocks, ColumnBanded,
    Csr); the others are listed in ``refused`` with the reason."""
    if extra:
        raise JacError("bad_option", f"unknown options {sorted(extra)} for native.layouts")
    rhs = RhsProgram.build(source, model, options=options)
    jac = JacobianProgram.build(source, model, wrt="states", options=options)
    plans, refused = {}, {}
    for lay in (LaneBlocks("natural"), LaneBlocks("markowitz"), LaneSparseBlocks(), ColumnBanded(), Csr()):
        try:
            plans[lay.name] = jac.plan(lay, source=rhs)
        except JacError as exc:
            refused[lay.name] = str(exc)
    return NativeLayouts(rhs, jac, plans, refused)


@dataclass
class RosenbrockProblem:
    """A per-cell model ready for the lane-parallel Rosenbrock integrator:
    the Jacobian lands directly in the LaneSparseBlocks slots its sparse LU
    factors (the integrator's ``block_lu`` leaf in miniature)."""

    rhs: Any
    jacobian: Any
    plan: Any
    y0: np.ndarray
    p: np.ndarray
    forcing: Any
    autonomous: bool
    ws: Any = field(default=None, repr=False)
    nfev: int = 0
    njev: int = 0

    def f(self, t, u, out):
        self.nfev += 1
        self.rhs.eval_into(u, self.p, t, self.forcing, out)

    def jac(self, t, u, out):
        self.njev += 1
        self.jacobian.eval_into(self.plan, u, self.p, t, self.forcing, out, self.ws)

    def solve(self, t_span, y0=None, *, rtol: float = 1e-4, atol=1.0, method: str = "rodas3", **kw):
        info = self.plan.info
        return integrate(self.f, self.jac, np.array(self.y0 if y0 is None else y0, dtype=np.float64),
                         t_span, n=self.jacobian.n_species, lanes=self.jacobian.cells,
                         lu_pattern=[tuple(x) for x in info["lu_pattern"]],
                         perm=tuple(info["ordering"]), rtol=rtol, atol=atol, method=method,
                         autonomous=self.autonomous, **kw)


def rosenbrock(source, *, model=None, p=None, forcing=None, options=None, **extra):
    """A :class:`RosenbrockProblem` for a per-cell (``cell``-lane) model."""
    if extra:
        raise JacError("bad_option", f"unknown options {sorted(extra)} for native.rosenbrock")
    rhs = RhsProgram.build(source, model, options=options)
    jac = JacobianProgram.build(source, model, wrt="states", options=options)
    if jac.kind != "cell":
        raise JacError("nonuniform_pattern",
                       "the native Rosenbrock leaf integrates per-cell chemistry (LaneSparseBlocks); this "
                       "model couples cells — use kind 'scipy.ivp' or 'sundials.cvode'")
    plan = jac.plan(LaneSparseBlocks(), source=rhs)
    pv = rhs.p0 if p is None else np.asarray(p, dtype=np.float64)
    auto = not any("t" in free_names(rhs.doc.expanded(f.expr)) for f in rhs.doc.fields)
    return RosenbrockProblem(rhs, jac, plan, rhs.u0.copy(), pv, forcing, auto, jac.new_workspace())


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: native``) -- keep below
# ---------------------------------------------------------------------------

@hookimpl
def esmjac_adapter() -> Adapter:
    # The solver is esmjac itself (Numba-compiled kernels on NumPy arrays).
    version = dist_version("esmjac")
    kinds = {"native.layouts": layouts, "native.rosenbrock": rosenbrock}
    numba, numpy = dist_version("numba"), dist_version("numpy")
    if module_available("numba") and module_available("numpy"):
        return Adapter("native", version, kinds, True,
                       f"esmjac's own kernels (numba {numba}, numpy {numpy})")
    missing = " and ".join(m for m in ("numba", "numpy") if not module_available(m))
    return Adapter("native", version, kinds, False,
                   f"{missing} is not installed; pip install 'numba>=0.58' 'numpy>=1.24', "
                   "or use kind 'scipy.ivp'")


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
