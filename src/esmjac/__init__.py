"""esmjac: exact analytical Jacobians for EarthSciML ``.esm`` models.

The programs, layouts and errors are imported with the package; the solver
factories (:func:`ivp`, :func:`cvode`, :func:`ida`, :func:`rosenbrock`,
:func:`create`) are re-exported lazily (PEP 562): ``esmjac.ivp`` imports the
SciPy adapter on first use, so ``import esmjac`` imports no adapter and no
solver package.
"""
from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__

from .calculus.bandset import BandSet
from .errors import CODES, JacError
from .layouts.types import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from .reference.oracle import Assembled, assemble
from .layouts.plans import ScatterPlan
from .runtime.programs import JacobianProgram, RhsProgram
from .runtime.workspace import JacWorkspace

#: Lazily re-exported factories: name → the module that defines it.
_LAZY = {
    "ivp": "esmjac.adapters.scipy",
    "cvode": "esmjac.adapters.sundials",
    "ida": "esmjac.adapters.sundials",
    "rosenbrock": "esmjac.adapters.native",
    "create": "esmjac.plugins.manager",
}

__all__ = ["BandSet", "JacError", "CODES", "assemble", "Assembled", "RhsProgram", "JacobianProgram",
           "JacWorkspace", "ScatterPlan", "LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr",
           "ivp", "cvode", "ida", "rosenbrock", "create", "__version__"]


def __getattr__(name: str) -> Any:
    """The factory ``name`` of :data:`_LAZY`, its module imported now (once)."""
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'esmjac' has no attribute {name!r}")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY))
