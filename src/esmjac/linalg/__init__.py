"""Lane-parallel linear algebra over many cells sharing one pattern (the
KPP-style straight-line sparse LU)."""
from __future__ import annotations

from .sparse_lu import SparseLaneLU

__all__ = ["SparseLaneLU"]
