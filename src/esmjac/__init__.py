"""esmjac: exact analytical Jacobians for EarthSciML ``.esm`` models."""
from __future__ import annotations

from ._version import __version__

from .calculus.bandset import BandSet
from .errors import CODES, JacError
from .layouts.types import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from .reference.oracle import Assembled, assemble
from .layouts.plans import ScatterPlan
from .runtime.programs import JacobianProgram, RhsProgram
from .runtime.workspace import JacWorkspace

__all__ = ["BandSet", "JacError", "CODES", "assemble", "Assembled", "RhsProgram", "JacobianProgram",
           "JacWorkspace", "ScatterPlan", "LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr",
           "__version__"]
