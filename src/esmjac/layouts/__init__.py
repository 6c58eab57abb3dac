"""Storage layouts (value types) and the checked scatter plans that map bands
onto them."""
from __future__ import annotations

from .plans import ScatterPlan
from .types import LAYOUTS, ColumnBanded, Csc, Csr, LaneBlocks, LaneSparseBlocks

__all__ = ["LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr", "Csc", "LAYOUTS", "ScatterPlan"]
