"""Storage layouts a plan can target (docs/design.rst §4). Plain frozen values."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import JacError

__all__ = ["LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr", "LAYOUTS"]


@dataclass(frozen=True)
class LaneBlocks:
    """Dense ``n×m`` block per lane, ``(r, c)`` at ``(r*m + c)*L + l``;
    ``order="markowitz"`` permutes rows and columns into the factorization's
    elimination order (square blocks only)."""

    order: str = "natural"

    def __post_init__(self):
        if self.order not in ("natural", "markowitz"):
            raise JacError("bad_option", f"LaneBlocks(order=) must be 'natural' or 'markowitz'; got {self.order!r}")

    @property
    def name(self) -> str:
        return f"laneblocks-{self.order}"


@dataclass(frozen=True)
class LaneSparseBlocks:
    """KPP-style: the factorization's ``lu_pattern`` slots (Markowitz order,
    fill-in included and zeroed), slot ``q`` at ``q*L + l``."""

    @property
    def name(self) -> str:
        return "lanesparseblocks"


@dataclass(frozen=True)
class ColumnBanded:
    """Per column (a line of points along ``axis``), the banded matrix in
    LAPACK band storage ``ab[ku + i - j, j]`` over the column's unknowns
    (level-major: ``lev*ns + species``), element ``(k, j)`` at
    ``(k*m + j)*C + c`` for column ``c`` of ``C`` (lanes fastest).
    ``axis`` is the dimension position (0-based); ``None`` = the last."""

    axis: int | None = None

    @property
    def name(self) -> str:
        return "columnbanded" if self.axis is None else f"columnbanded-{self.axis}"


@dataclass(frozen=True)
class Csr:
    """Global CSR over ``evaluate_rhs``'s element order (rows sorted,
    columns ascending); a thread owns whole rows."""

    @property
    def name(self) -> str:
        return "csr"


LAYOUTS = (LaneBlocks, LaneSparseBlocks, ColumnBanded, Csr)
