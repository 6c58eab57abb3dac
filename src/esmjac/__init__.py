"""esmjac: exact analytical Jacobians for EarthSciML ``.esm`` models."""
from __future__ import annotations

from .bandset import BandSet
from .errors import CODES, JacError

__all__ = ["BandSet", "JacError", "CODES", "__version__"]
__version__ = "0.1.0"
