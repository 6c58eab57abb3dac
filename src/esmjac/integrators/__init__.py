"""The lane integrator: many independent cells sharing one sparsity pattern.

:func:`rosenbrock` builds the native Rosenbrock leaf
(:class:`~esmjac.integrators.leaf.RosenbrockLeaf`: lane blocks, scratch,
worker threads; ``step="lane"`` or ``"shared"``) on
:class:`~esmjac.integrators.lanestep.LaneStepper`, the one per-lane engine,
with a method's :class:`~esmjac.integrators.tableaux.Tableau` and the
KPP-style straight-line :class:`SparseLaneLU`; sensitivities (tangent-linear
and discrete adjoint) are :mod:`esmjac.integrators.sensitivity`.
"""
from __future__ import annotations

from .lanestep import STATUS, LaneStepper
from .leaf import LeafSolution, LeafStats, RosenbrockLeaf, rosenbrock
from .tableaux import METHODS, Tableau
from ..linalg.sparse_lu import SparseLaneLU

__all__ = ["rosenbrock", "RosenbrockLeaf", "LeafStats", "LeafSolution", "METHODS", "Tableau",
           "SparseLaneLU", "LaneStepper", "STATUS"]
