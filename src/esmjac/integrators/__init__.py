"""Stiff integrators for many independent cells sharing one sparsity pattern.

:class:`SparseLaneLU` is the KPP-style straight-line sparse LU (no pivoting,
fixed fill-in pattern) over lanes-fastest (optionally tiled) storage;
:func:`rosenbrock` is the shared-step Rosenbrock driver for any callables;
:class:`~esmjac.integrators.lanestep.LaneStepper` the per-lane engine behind
the native leaf (each lane its own step size, status and statistics).
"""
from __future__ import annotations

from .lanestep import STATUS, LaneStepper
from .rosenbrock import METHODS, RosenbrockResult, rosenbrock
from ..linalg.sparse_lu import SparseLaneLU

__all__ = ["SparseLaneLU", "rosenbrock", "RosenbrockResult", "METHODS", "LaneStepper", "STATUS"]
