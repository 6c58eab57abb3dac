"""esmjac: exact analytical Jacobians for EarthSciML ``.esm`` models."""
from __future__ import annotations

__version__ = "0.1.0"

from .bandset import BandSet
from .errors import CODES, JacError
from .layouts import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from .oracle import Assembled, assemble
from .plans import ScatterPlan
from .program import JacobianProgram, JacWorkspace, RhsProgram

__all__ = ["BandSet", "JacError", "CODES", "assemble", "Assembled", "RhsProgram", "JacobianProgram",
           "JacWorkspace", "ScatterPlan", "LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr",
           "__version__"]
