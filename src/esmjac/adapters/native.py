"""Native adapter (esmjac's own kernels): kinds ``"native.layouts"`` and ``"native.rosenbrock"``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import JacError
from ..layouts.types import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from ..plugins.hookspecs import Adapter, dist_version, hookimpl, module_available
from ..runtime.checks import cell_options
from ..runtime.programs import JacobianProgram, RhsProgram
from ..integrators.leaf import LeafSolution, LeafStats, RosenbrockLeaf, rosenbrock  # noqa: F401  (the leaf, re-exported)


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


def layouts(source, *, model=None, options=None, per_cell=None, **extra):
    """Build the RHS and Jacobian programs and a plan for every layout that
    applies (LaneBlocks natural/markowitz, LaneSparseBlocks, ColumnBanded,
    Csr); the others are listed in ``refused`` with the reason."""
    if extra:
        raise JacError("bad_option", f"unknown options {sorted(extra)} for native.layouts")
    options = cell_options(options, per_cell)
    rhs = RhsProgram.build(source, model, options=options)
    jac = JacobianProgram.build(source, model, wrt="states", options=options)
    plans, refused = {}, {}
    for lay in (LaneBlocks("natural"), LaneBlocks("markowitz"), LaneSparseBlocks(), ColumnBanded(), Csr()):
        try:
            plans[lay.name] = jac.plan(lay, source=rhs)
        except JacError as exc:
            refused[lay.name] = str(exc)
    return NativeLayouts(rhs, jac, plans, refused)



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
