"""esmjac: exact analytical Jacobians for EarthSciML ``.esm`` models."""
from __future__ import annotations

__version__ = "0.1.0"

from .bandset import BandSet
from .errors import CODES, JacError
from .oracle import Assembled, assemble

__all__ = ["BandSet", "JacError", "CODES", "assemble", "Assembled", "__version__"]
