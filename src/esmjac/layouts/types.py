"""Storage layouts a plan can target (docs/design.rst §4). Plain frozen values.

Lane tiles (the one statement of the formula)
---------------------------------------------
The lane layouts (:class:`LaneBlocks`, :class:`LaneSparseBlocks`,
:class:`ColumnBanded`) store ``nslots`` values per lane and group the lanes
in *tiles* of ``W`` (array-of-structures-of-arrays, as MICM's
vector-ordered matrices)::

    position of slot q of lane l  =  ((l // W) * nslots + q) * W + l % W

so one tile's ``nslots × W`` values are contiguous: a kernel writes a tile
as one short stream instead of ``nslots`` lane-major streams (measured here:
~70 lane-major output streams at ≈ 8 GB/s, the same bytes tile-contiguous
at ≈ 28 GB/s), and each slot's ``W`` lanes are a unit-stride run that the
loop vectorizer packs. ``W`` is the layout's ``tile=`` option, recorded in
the plan (``plan.info["tile"]``, its JSON and so its golden):

* ``tile=None`` is one tile of the whole capacity (``W = lanes``): slot
  ``q`` of lane ``l`` at ``q*L + l``, the lanes-fastest order of earlier
  releases, for consumers that want it;
* otherwise the capacity is ``lanes`` rounded up to a multiple of ``W``
  (:func:`tile_capacity`; a one-lane call stores one tile of ``W``);
  padding lanes hold copies of the last real lane, so every stored value is
  a real cell's and results stay bitwise identical for any thread count,
  lane order and tile width (after the layout permutation, :func:`untile`).

:func:`tile_index` is this formula for code that addresses slots
(the sparse LU, the integrators, the preconditioners); :func:`untile` turns
a tiled output into ``[slot, lane]`` order for checking.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import JacError

__all__ = ["LaneBlocks", "LaneSparseBlocks", "ColumnBanded", "Csr", "Csc", "LAYOUTS", "DEFAULT_TILE",
           "tile_width", "tile_capacity", "tile_index", "tile_strides", "untile"]

#: The default tile width ``W``, chosen by measurement (benchmarks/bench_tiles.py,
#: RESULTS.md "Lane tiles"; tropo12, one thread, float64, CPU time per call):
#: eval_into LaneSparseBlocks at 10⁴ cells, W = 4/8/16/32/64/None:
#: 0.62/0.61/0.57/0.59/0.74/1.79 × the hand-rolled kernel; at 10⁵ lanes,
#: W = 8/16/32/None: 11.97/11.69/12.79/40.53 ms. 16 is also the narrowest
#: tile LLVM's loop vectorizer packs (it leaves loops of fewer than 16 known
#: iterations scalar) and pads least among the fast ones.
DEFAULT_TILE = None   # lanes fastest; tile=16 measured fastest for eval_into but the bound path is not tile-aware yet

_MAX_TILE = 4096


def _check_tile(cls: str, tile) -> None:
    if tile is None:
        return
    if isinstance(tile, bool) or not isinstance(tile, (int, np.integer)) or not 1 <= tile <= _MAX_TILE:
        raise JacError("bad_option", f"{cls}(tile=) must be None or an integer in [1, {_MAX_TILE}]; "
                       f"got {tile!r}")


def tile_width(tile: int | None, lanes: int) -> int:
    """The ``W`` of the formula at ``lanes`` lanes: ``tile``, or the lane
    count for ``tile=None`` (one tile)."""
    return int(lanes) if tile is None else int(tile)


def tile_capacity(tile: int | None, lanes: int) -> int:
    """Stored lanes: ``lanes`` rounded up to a multiple of the effective width."""
    W = max(tile_width(tile, lanes), 1)
    return -(-int(lanes) // W) * W


def tile_index(q, l, nslots: int, W: int):
    """Position of slot ``q`` of lane ``l`` (scalars or integer arrays):
    ``((l // W) * nslots + q) * W + l % W`` (``W`` from :func:`tile_width`)."""
    return ((l // W) * nslots + q) * W + l % W


def tile_strides(nslots: int, W: int) -> tuple:
    """(tile stride, slot stride, lane stride) of the formula: ``nslots*W, W, 1``."""
    return nslots * W, W, 1


def untile(out: np.ndarray, nslots: int, lanes: int, W: int) -> np.ndarray:
    """``[slot, lane]`` view (a copy when tiled) of a tiled output, real lanes only."""
    cap = -(-lanes // W) * W
    a = np.asarray(out)[:nslots * cap].reshape(cap // W, nslots, W)
    return a.transpose(1, 0, 2).reshape(nslots, cap)[:, :lanes]


@dataclass(frozen=True)
class LaneBlocks:
    """Dense ``n×m`` block per lane: element ``(r, c)`` is slot ``r*m + c``
    of its lane (tiled, see the module docstring); ``order="markowitz"``
    permutes rows and columns into the factorization's elimination order
    (square blocks only)."""

    order: str = "natural"
    tile: int | None = DEFAULT_TILE

    def __post_init__(self):
        if self.order not in ("natural", "markowitz"):
            raise JacError("bad_option", f"LaneBlocks(order=) must be 'natural' or 'markowitz'; got {self.order!r}")
        _check_tile("LaneBlocks", self.tile)

    @property
    def name(self) -> str:
        return f"laneblocks-{self.order}"


@dataclass(frozen=True)
class LaneSparseBlocks:
    """KPP-style: the factorization's ``lu_pattern`` slots (Markowitz order,
    fill-in included and zeroed); slot ``q`` is the ``q``-th pattern entry
    of its lane (tiled, see the module docstring)."""

    tile: int | None = DEFAULT_TILE

    def __post_init__(self):
        _check_tile("LaneSparseBlocks", self.tile)

    @property
    def name(self) -> str:
        return "lanesparseblocks"


@dataclass(frozen=True)
class ColumnBanded:
    """Per column (a line of points along ``axis``), the banded matrix in
    LAPACK band storage ``ab[ku + i - j, j]`` over the column's unknowns
    (level-major: ``lev*ns + species``): element ``(k, j)`` is slot
    ``k*m + j`` of lane ``c`` (column ``c`` of ``C``; tiled over columns,
    see the module docstring; ``tile=None``: ``(k*m + j)*C + c``).
    ``axis`` is the dimension position (0-based); ``None`` = the last."""

    axis: int | None = None
    tile: int | None = DEFAULT_TILE

    def __post_init__(self):
        _check_tile("ColumnBanded", self.tile)

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


@dataclass(frozen=True)
class Csc:
    """Global CSC (SciPy's ``csc_matrix`` order: columns in turn, rows
    ascending within each), the form SciPy's stiff solvers factor; written
    directly, no permutation per call. Columns of a cell program: lane
    columns ``c*L + l``, then scalar ones."""

    @property
    def name(self) -> str:
        return "csc"


LAYOUTS = (LaneBlocks, LaneSparseBlocks, ColumnBanded, Csr, Csc)
