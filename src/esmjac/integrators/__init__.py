"""Stiff integrators for many independent cells sharing one sparsity pattern.

:class:`SparseLaneLU` is the KPP-style straight-line sparse LU (no pivoting,
fixed fill-in pattern) over lanes-fastest storage; :func:`rosenbrock` is the
lane-parallel Rosenbrock driver built on it.
"""
from __future__ import annotations

from .rosenbrock import METHODS, RosenbrockResult, rosenbrock
from ..linalg.sparse_lu import SparseLaneLU

__all__ = ["SparseLaneLU", "rosenbrock", "RosenbrockResult", "METHODS"]
