"""Per-thread scratch of the programs: everything a call writes.

Programs (:mod:`.programs`) are immutable and shared; a workspace is owned
by one thread and carries its program's identity (``owner``), which every
call checks (:func:`esmjac.runtime.checks.workspace`). The lane → cell map
(``cix``) says which cell each lane evaluates: the identity, a shuffled
order, or padding lanes that repeat the last cell.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._frozen import readonly
from ..errors import JacError

__all__ = ["JacWorkspace", "RhsScratch", "lane_cells", "no_forcing"]


def _zero(dtype) -> np.ndarray:
    z = np.zeros(1, dtype=dtype)
    z.setflags(write=False)
    return z


_NO_FORCING = {np.dtype(np.float64): _zero(np.float64), np.dtype(np.float32): _zero(np.float32)}


def no_forcing(dtype) -> np.ndarray:
    """What the kernels read for "no forcing" (a model without forcing
    fields, or an empty forcing given): one shared read-only zero of
    ``dtype``. Read-only like a document's default forcing, so calls with
    either reach a model-independent kernel (the tape interpreter, ~20 s of
    CPU to compile) with one Numba signature, not one per writability."""
    z = _NO_FORCING.get(np.dtype(dtype))
    return z if z is not None else _zero(dtype)


def lane_cells(cell_shape: tuple, lanes: int, order=None) -> np.ndarray:
    """1-based cell index per dimension per lane (``cix[d*L + l]``); lanes
    past the last cell (padding) duplicate it. ``order`` maps lane → flat
    cell number (a shuffled lane order)."""
    ncell = int(np.prod(cell_shape)) if cell_shape else 1
    if order is None:
        flat = np.minimum(np.arange(lanes), ncell - 1)
    else:
        flat = np.asarray(order, dtype=np.int64)
        if flat.shape != (lanes,) or flat.min(initial=0) < 0 or flat.max(initial=0) >= ncell:
            raise JacError("bad_argument", f"lane order must be {lanes} cell numbers in [0, {ncell})")
    idx = np.unravel_index(flat, cell_shape) if cell_shape else ()
    out = np.empty(len(cell_shape) * lanes, dtype=np.int64)
    for d, a in enumerate(idx):
        out[d * lanes:(d + 1) * lanes] = a + 1
    return out


@dataclass
class RhsScratch:
    """Per-thread scratch of one RhsProgram: hoisted values and the lane map
    (``owner``: the program's identity)."""

    lanes: int
    h: np.ndarray
    cix: np.ndarray
    owner: str = ""
    verified: Any = field(default=None, repr=False, compare=False)   # what runtime.checks.workspace verified


@dataclass
class JacWorkspace:
    """Per-thread scratch of one JacobianProgram (never share between threads).

    Everything a call writes lives here: the band slab per dtype, hoisted
    values, the lane→cell map, the point of the last ``eval_into`` (read by
    ``contract``), the second-order slab and the fused kernel of the plan
    last evaluated without a slab."""

    owner: str
    lanes: int
    cix: np.ndarray
    h: np.ndarray
    keep_slab: bool = False
    slabs: dict = field(default_factory=dict)
    last_dtype: Any = None
    last_plan: Any = None
    point: Any = None              # (u, p, t, forcing) of the last eval_into (copies, see keep_point)
    second_slab: Any = None        # contract's second-order band values
    fused: Any = None              # (plan key, Kernel) of the last fused eval_into
    verified: Any = field(default=None, repr=False, compare=False)   # what runtime.checks.workspace verified
    _snap: Any = None              # the buffers ``point`` is copied into

    def slab(self, dtype, size: int) -> np.ndarray:
        s = self.slabs.get(dtype)
        if s is None or s.shape[0] != size:
            s = np.zeros(max(size, 1), dtype=dtype)
            self.slabs[dtype] = s
        return s

    def keep_point(self, u: np.ndarray, p: np.ndarray, t: float, f: np.ndarray) -> None:
        """Copy the point of an ``eval_into`` into buffers this workspace
        keeps (no allocation per call): ``contract`` and a lazily evaluated
        slab see that point, whatever the caller does with its arrays."""
        snap = self._snap
        if snap is None or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(snap, (u, p, f))):
            bufs = (np.empty_like(u), np.empty_like(p), np.empty_like(f))
            # p and forcing are read through read-only views, as the build's
            # warm call passes them: Numba compiles one specialization per
            # writability, so writable copies compiled the slab kernel again
            # at the first lazily evaluated slab (~16 s of CPU for tropo12)
            snap = self._snap = bufs + (readonly(bufs[1]), readonly(bufs[2]))
        for a, b in zip(snap, (u, p, f)):
            np.copyto(a, b)
        self.point = (snap[0], snap[3], t, snap[4])

    def set_lane_order(self, order, cell_shape: tuple) -> None:
        """Lane ``l`` holds flat cell ``order[l]`` (shuffled or padded lanes).
        Written in place: bindings of this workspace read the same array."""
        cix = lane_cells(cell_shape, self.lanes, order)
        if cix.shape == self.cix.shape:
            self.cix[:] = cix
        else:
            self.cix = cix
