"""Scatter plans: the checked map from a program's band slab to a storage
layout (docs/design.rst §4–§6).

A plan is a *gather*: every output slot lists the slab entries that sum
into it, in plan order (band order, then point order), so accumulation is
deterministic and a slot is written by exactly one loop iteration. Slots
no band reaches are written as zero. ``lane`` plans (cell programs) are
per-slot lists of bands, evaluated for every lane at ``a*L + b + l*stride``;
``point`` plans (global programs, and layouts that mix lanes) list slab
positions. Plans are built once in time linear in the entries (points for
CSR), are immutable, picklable and serialize to deterministic JSON.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._frozen import FrozenMap, frozen_arrays
from ..compile.ssa import const_table
from ..errors import JacError
from ..limits import lane_count
from ..linalg.factorization import block_order
from ..model.expr import Node, is_lit
from ..model.layout import strides
from .types import ColumnBanded, Csc, Csr, LaneBlocks, LaneSparseBlocks, tile_capacity, tile_index, tile_width

__all__ = ["ScatterPlan", "build_plan", "field_meta", "column_split"]

_I = np.int64

#: Index arrays a lane-count agnostic plan derives per lane count
#: (``csr_index``), read-only, kept beside the plan (never in it).
_INDEX_MEMO: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# ------------------------------------------------------------------ metadata

def _ival(e, env: dict):
    """Vectorized value of an integer index expression over box points."""
    if isinstance(e, str):
        if e not in env:
            raise JacError("unsupported_construct", f"index `{e}` is not a box dimension")
        return env[e]
    if is_lit(e):
        return float(e)
    if not isinstance(e, Node):
        raise JacError("unsupported_construct", f"cannot evaluate the index {e!r}")
    if e.op == "index" and isinstance(e.args[0], Node) and e.args[0].op == "const":
        flat, shape = const_table(e.args[0].attr("value"))
        idx = [np.asarray(_ival(x, env), dtype=float) for x in e.args[1:]]
        f = _flat(idx, shape, max([np.size(i) for i in idx] + [1]))
        if np.any(f < 0):
            raise JacError("evaluation_error", "a table read outside the table")
        return np.asarray(flat)[f]
    a = [_ival(x, env) for x in e.args]
    o = e.op
    if o == "+":
        return sum(a[1:], a[0])
    if o == "*":
        r = a[0]
        for x in a[1:]:
            r = r * x
        return r
    if o == "-":
        return -a[0] if len(a) == 1 else a[0] - sum(a[1:], 0.0)
    if o == "/":
        return a[0] / a[1]
    if o in ("mod", "%"):
        return np.mod(a[0], a[1])
    if o == "ifelse":
        return np.where(np.asarray(a[0]) != 0, a[1], a[2])
    if o in ("min", "max"):
        f = np.minimum if o == "min" else np.maximum
        r = a[0]
        for x in a[1:]:
            r = f(r, x)
        return r
    cmp = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
           "==": np.equal, "!=": np.not_equal}
    if o in cmp:
        return cmp[o](a[0], a[1]).astype(float)
    raise JacError("unsupported_construct",
                   f"a column index computed with `{o}` (data-dependent or unsupported) is not compiled")


def _flat(idx: list, shape: tuple, npts: int):
    """Row-major flat index of 1-based ``idx`` arrays; -1 outside ``shape``."""
    flat = np.zeros(npts, dtype=_I)
    ok = np.ones(npts, dtype=bool)
    for x, n, st in zip(idx, shape, strides(shape)):
        x = np.broadcast_to(np.asarray(x, dtype=float), (npts,))
        xi = np.rint(x)
        if np.any(xi != x):
            raise JacError("evaluation_error", "a non-integer column index")
        ok &= (xi >= 1) & (xi <= n)
        flat += (xi.astype(_I) - 1) * st
    return np.where(ok, flat, -1)


def _box(dims) -> tuple:
    """Row-major points of a box: ({name: values}, npoints)."""
    axes = [np.arange(lo, hi + 1, dtype=float) for _, lo, hi in dims]
    if not axes:
        return {}, 1
    grids = np.meshgrid(*axes, indexing="ij")
    return {n: g.ravel() for (n, _, _), g in zip(dims, grids)}, grids[0].size


def _csr_order(key1, key2, n):
    o = np.lexsort((np.arange(n), key2, key1))
    return o


def _gather(tgt_key, other, src, order):
    """Group sorted entries by target: (targets, ptr, src, other)."""
    t = tgt_key[order]
    if t.size == 0:
        return np.zeros(0, _I), np.zeros(1, _I), np.zeros(0, _I), np.zeros(0, _I)
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    ptr = np.r_[starts, t.size].astype(_I)
    return t[starts].astype(_I), ptr, src[order].astype(_I), other[order].astype(_I)


def field_meta(doc, lay, cvars: tuple, cbase) -> FrozenMap:
    """Read-only index arrays of a Jacobian program (rows, columns, gathers)."""
    if doc.kind == "cell":
        return frozen_arrays(_cell_meta(doc, lay, cvars))
    return frozen_arrays(_global_meta(doc, lay, cbase))


def _cell_meta(doc, lay, cvars: tuple) -> dict:
    sidx = {n: s for s, n in enumerate(lay.states)}
    lane_vars = [v for v in cvars if v != "t" and lay.shapes.get(v) == lay.cell_shape]
    glob_vars = [v for v in cvars if v not in lane_vars]
    lpos = {v: i for i, v in enumerate(lane_vars)}
    gpos = {v: i for i, v in enumerate(glob_vars)}
    frow = np.array([sidx[f.row] for f in doc.fields], dtype=_I)
    flane = np.array([f.col in lpos for f in doc.fields], dtype=bool)
    fcid = np.array([lpos[f.col] if f.col in lpos else gpos[f.col] for f in doc.fields], dtype=_I)
    K = len(doc.fields)
    ks = np.arange(K, dtype=_I)
    nl = len(lane_vars)
    # y[r] += B_k · v[col]: lane columns at c*L + l, scalar ones after all lanes.
    ca = np.where(flane, fcid, nl)
    cb = np.where(flane, 0, fcid)
    cs = flane.astype(_I)
    o = _csr_order(frow, ks, K)
    r_tgt, r_ptr, r_band, r_ca = _gather(frow, ca, ks, o)
    r_cb, r_cs = cb[o], cs[o]
    lk = ks[flane]
    o2 = _csr_order(fcid[flane], lk, lk.size)
    c_tgt, c_ptr, c_band, c_ca = _gather(fcid[flane], frow[flane], lk, o2)
    gk = ks[~flane]
    o3 = _csr_order(fcid[~flane], gk, gk.size)
    g_tgt, g_ptr, g_band, g_rl = _gather(fcid[~flane], frow[~flane], gk, o3)
    return dict(kind="cell", lane_vars=tuple(lane_vars), glob_vars=tuple(glob_vars),
                n_lane_cols=nl, n_glob_cols=len(glob_vars), frow=frow, flane=flane, fcid=fcid,
                r_tgt=r_tgt, r_ptr=r_ptr, r_band=r_band, r_ca=r_ca, r_cb=r_cb, r_cs=r_cs,
                c_tgt=c_tgt, c_ptr=c_ptr, c_band=c_band, c_ca=c_ca,
                c_cb=np.zeros(c_band.size, _I), c_cs=np.ones(c_band.size, _I),
                g_tgt=g_tgt, g_ptr=g_ptr, g_band=g_band, g_rl=g_rl)


def _global_meta(doc, lay, cbase: dict) -> dict:
    soff = lay.state_offsets()
    rows, cols = [], []
    for f in doc.fields:
        env, n = _box(f.dims)
        rshape = lay.shapes.get(f.row, ())
        ridx = [env[p] if isinstance(p, str) else float(p) for p in f.pins]
        r = _flat(ridx, rshape, n)
        if np.any(r < 0):
            raise JacError("evaluation_error", f"{f.name} has rows outside `{f.row}`")
        rows.append(r + soff[f.row])
        if f.col == "t" or not lay.shapes.get(f.col):
            cols.append(np.full(n, cbase[f.col], dtype=_I))
        else:
            c = _flat([_ival(x, env) for x in f.cidx], lay.shapes[f.col], n)
            cols.append(np.where(c >= 0, c + cbase[f.col], -1))
    row = np.concatenate(rows) if rows else np.zeros(0, _I)
    col = np.concatenate(cols) if cols else np.zeros(0, _I)
    j = np.arange(row.size, dtype=_I)
    ok = col >= 0
    jr, rr, cc = j[ok], row[ok], col[ok]
    o = _csr_order(rr, jr, jr.size)
    r_tgt, r_ptr, r_src, r_other = _gather(rr, cc, jr, o)
    o2 = _csr_order(cc, jr, jr.size)
    c_tgt, c_ptr, c_src, c_other = _gather(cc, rr, jr, o2)
    return dict(kind="global", slab_size=int(row.size), pt_row=row, pt_col=col,
                r_tgt=r_tgt, r_ptr=r_ptr, r_src=r_src, r_other=r_other,
                c_tgt=c_tgt, c_ptr=c_ptr, c_src=c_src, c_other=c_other)


def _points(prog) -> tuple:
    """(slab position, row element, col element) of every valid entry, with
    L = cells for a cell program (the flat evaluate_rhs numbering)."""
    m = prog.meta
    if prog.kind == "global":
        ok = m["pt_col"] >= 0
        j = np.arange(m["pt_row"].size, dtype=_I)
        return j[ok], m["pt_row"][ok], m["pt_col"][ok]
    N = prog.cells
    K = prog.n_fields
    ks = np.repeat(np.arange(K, dtype=_I), N)
    ls = np.tile(np.arange(N, dtype=_I), K)
    frow, flane, fcid = m["frow"][ks], m["flane"][ks], m["fcid"][ks]
    row = frow * N + ls
    lane_base = np.array([prog.col_base[v] for v in m["lane_vars"]] or [0], dtype=_I)
    glob_base = np.array([prog.col_base[v] for v in m["glob_vars"]] or [0], dtype=_I)
    col = np.where(flane, lane_base[np.where(flane, fcid, 0)] + ls, glob_base[np.where(flane, 0, fcid)])
    return ks * N + ls, row, col


# ------------------------------------------------------------------ the plan

@dataclass(frozen=True, eq=False)
class ScatterPlan:
    """A checked, immutable scatter map (see module docstring): arrays are
    read-only, ``info`` is a frozen mapping, ``key`` hashes the plan's
    content (layout, kind, lanes, info, arrays)."""

    fingerprint: str           # the JacobianProgram it belongs to
    layout: Any
    kind: str                  # "lane" | "point"
    arrays: FrozenMap          # read-only index arrays
    info: FrozenMap            # JSON-able facts (shape, ordering, lu_pattern, bands…)
    lanes: int | None = None   # required lane count (None: any)
    key: str = ""              # content hash (set by build_plan)

    def __post_init__(self):
        object.__setattr__(self, "arrays", frozen_arrays(self.arrays))
        object.__setattr__(self, "info", frozen_arrays(self.info))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__post_init__()           # pickle does not keep writeable=False

    @property
    def tiled(self) -> bool:
        """Whether this is a lane plan stored in tiles (LaneBlocks, LaneSparseBlocks)."""
        return self.kind == "lane" and "tile" in self.info

    @property
    def tile(self) -> int | None:
        """The layout's tile width option (None: one tile of the whole capacity)."""
        return self.info.get("tile")

    def tile_width(self, lanes: int) -> int:
        """The tile width ``W`` at ``lanes`` lanes: slot ``q`` of lane ``l``
        is at ``((l // W)*nslots + q)*W + l % W`` (layouts.types)."""
        if self.kind == "lane":
            return tile_width(self.info.get("tile"), lanes) if self.tiled else lanes
        return int(self.info.get("tile_width", lanes))

    def capacity(self, lanes: int) -> int:
        """Stored lanes at ``lanes`` workspace lanes (padded to a multiple of the tile)."""
        lanes = lane_count(lanes)
        return tile_capacity(self.info.get("tile"), lanes) if self.tiled else lanes

    def out_size(self, lanes: int) -> int:
        lane_count(lanes)
        if self.kind == "lane":
            return int(self.info["slots_per_lane"]) * self.capacity(lanes)
        return int(self.info["size"])

    def check_lanes(self, lanes: int) -> None:
        if self.lanes is not None and lanes != self.lanes:
            raise JacError("bad_argument",
                           f"the {self.layout.name} plan addresses exactly {self.lanes} lanes; "
                           f"the workspace has {lanes}")

    # -- serialization --------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"esmjac_plan": 2, "layout": self.layout.name, "kind": self.kind,
                "lanes": self.lanes,
                "info": _plain(self.info),
                "arrays": {k: v.tolist() for k, v in sorted(self.arrays.items())}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")) + "\n"

    def csr_index(self, lanes: int | None = None) -> tuple:
        """``(indptr, indices, shape)`` of a Csr plan at ``lanes`` lanes (a
        cell program's default: its document's cells). Lane-count agnostic
        plans build them on first use per lane count (read-only, cached)."""
        if "indptr" in self.arrays:
            return self.arrays["indptr"], self.arrays["indices"], tuple(self.info["shape"])
        if "csr_clane" not in self.arrays and "csc_rpos" not in self.arrays:
            raise JacError("bad_option", f"the {self.layout.name} plan has no compressed index arrays")
        L = int(self.info["cells"] if lanes is None else lanes)
        key = ("csr_index", L)
        memo = _INDEX_MEMO.get(self)
        if memo is None:
            memo = _INDEX_MEMO[self] = {}
        got = memo.get(key)
        if got is None:
            got = _csr_lanes(self.arrays, self.info, L) if "csr_clane" in self.arrays else \
                _csc_lanes(self.arrays, self.info, L)
            memo[key] = got
        return got

    def in_storage(self, position: np.ndarray, name: str) -> "ScatterPlan":
        """This lane plan with slot ``q`` stored at ``position[q]`` instead
        (a permutation of the slots: e.g. a factorisation's own slot order,
        :class:`~esmjac.linalg.sparse_lu.SparseLaneLU`'s ``storage``; its
        ``name`` recorded as ``info["storage"]``). Every destination (``a``,
        ``fa``, ``za``) is permuted here, once, and ``position`` is kept as
        ``arrays["storage"]``: a program's direct tape of it is this plan's
        with the stores renamed (the same instructions in the same order, so
        the same bits). Not for a plan that has a storage order already."""
        if self.kind != "lane" or "storage" in self.arrays:
            raise JacError("bad_argument", "in_storage takes a lane plan in its own slot order")
        pos = np.ascontiguousarray(position, dtype=_I)
        nslots = int(self.info["slots_per_lane"])
        if pos.shape != (nslots,) or not np.array_equal(np.sort(pos), np.arange(nslots)):
            raise JacError("bad_argument", f"position must be a permutation of the plan's {nslots} slots")
        arrays = {k: (pos[v] if k in ("a", "fa", "za") else v) for k, v in self.arrays.items()}
        arrays["storage"] = pos
        info = {**self.info, "storage": str(name)}
        return ScatterPlan(self.fingerprint, self.layout, self.kind, frozen_arrays(arrays), frozen_arrays(info),
                           self.lanes, _plan_key(self.layout, self.kind, self.lanes, info, arrays))

    #: The compressed (indptr, indices, shape) of a Csr or Csc plan.
    sparse_index = csr_index

    @property
    def indptr(self) -> np.ndarray:
        return self.csr_index()[0]

    @property
    def indices(self) -> np.ndarray:
        return self.csr_index()[1]

    def shape_at(self, lanes: int | None = None) -> tuple:
        """The matrix shape of a Csr plan at ``lanes`` lanes."""
        return self.csr_index(lanes)[2]


def _csr_lanes(arrays: Mapping, info: Mapping, L: int) -> tuple:
    """indptr/indices of a cell program's CSR matrix at ``L`` lanes: row
    (species s, lane l) holds s's columns in order; a lane column ``c`` of
    lane ``l`` is ``c*L + l``, a scalar column ``g`` is ``n_lane_cols*L + g``."""
    cnt = np.asarray(info["row_nnz"], dtype=_I)
    n = cnt.size
    indptr = np.zeros(n * L + 1, _I)
    indptr[1:] = np.cumsum(np.repeat(cnt, L))
    clane, cpos = arrays["csr_clane"], arrays["csr_cpos"]
    start = np.concatenate([[0], np.cumsum(cnt)]).astype(_I)
    lanes = np.arange(L, dtype=_I)[:, None]
    parts = []
    for s in range(n):
        ln = clane[start[s]:start[s + 1]]
        base = np.where(ln == 1, cpos[start[s]:start[s + 1]] * L, int(info["n_lane_cols"]) * L +
                        cpos[start[s]:start[s + 1]])
        parts.append((base[None, :] + lanes * ln[None, :]).ravel())
    indices = np.concatenate(parts) if parts else np.zeros(0, _I)
    indptr.setflags(write=False)
    indices.setflags(write=False)
    ncols = int(info["n_lane_cols"]) * L + int(info["n_glob_cols"])
    return indptr, indices, (n * L, ncols)


def _csc_lanes(arrays: Mapping, info: Mapping, L: int) -> tuple:
    """indptr/indices (rows) of a cell program's CSC matrix at ``L`` lanes:
    lane column (c, l) holds rows ``r*L + l`` for c's rows r ascending; a
    scalar column holds rows ``r*L + l`` for its rows r, each over every lane."""
    lcnt = np.asarray(info["col_nnz"], dtype=_I)
    gcnt = np.asarray(info["glob_col_nnz"], dtype=_I)
    counts = np.concatenate([np.repeat(lcnt, L), gcnt * L])
    indptr = np.zeros(counts.size + 1, _I)
    indptr[1:] = np.cumsum(counts)
    rpos = arrays["csc_rpos"]
    lanes = np.arange(L, dtype=_I)
    parts, k = [], 0
    for m in lcnt:
        rows = rpos[k:k + m]
        parts.append((rows[None, :] * L + lanes[:, None]).ravel())
        k += m
    for m in gcnt:
        rows = rpos[k:k + m]
        parts.append((rows[:, None] * L + lanes[None, :]).ravel())
        k += m
    indices = np.concatenate(parts) if parts else np.zeros(0, _I)
    indptr.setflags(write=False)
    indices.setflags(write=False)
    return indptr, indices, (int(info["n_rows_per_lane"]) * L, lcnt.size * L + gcnt.size)


def _csc(prog) -> tuple:
    """A plan writing SciPy's CSC order directly (see ``types.Csc``)."""
    nrows = sum(prog.layout.size(s) for s in prog.layout.states)
    if prog.kind == "cell":
        rc, n, m = _block_pattern(prog)
        cols = list(prog.col_vars)
        cpos = {v: i for i, v in enumerate(cols)}
        lane_vars, glob_vars = prog.meta["lane_vars"], prog.meta["glob_vars"]
        rows_of = {c: sorted({r for r, cc in rc if cc == c}) for c in range(m)}
        keys, a, b, stride, rpos = [], [], [], [], []
        Q = 0
        for v in lane_vars:             # lane column (c, l): Q_c*L + l*m_c + j
            c = cpos[v]
            for j, r in enumerate(rows_of[c]):
                keys.append((r, c))
                a.append(Q)
                b.append(j)
                stride.append(len(rows_of[c]))
                rpos.append(r)
            Q += len(rows_of[c])
        for v in glob_vars:             # scalar column: (Q + rank)*L + l
            c = cpos[v]
            for r in rows_of[c]:
                keys.append((r, c))
                a.append(Q)
                b.append(0)
                stride.append(1)
                rpos.append(r)
                Q += 1
        ptr, src = _slots_from(keys, rc)
        info = {"shape": [nrows, prog.n_cols], "nnz": int(Q * prog.cells), "slots_per_lane": Q,
                "cells": prog.cells, "n_rows_per_lane": n,
                "col_nnz": [len(rows_of[cpos[v]]) for v in lane_vars],
                "glob_col_nnz": [len(rows_of[cpos[v]]) for v in glob_vars]}
        arrays = dict(ptr=ptr, src=src, a=np.array(a, _I), b=np.array(b, _I),
                      stride=np.array(stride, _I), csc_rpos=np.array(rpos, _I))
        arrays.update(_fused(arrays, prog.n_fields))
        return "lane", arrays, info, None
    return _compressed_points(prog, nrows, by_column=True)


def _plain(x):
    """JSON-able copy of frozen metadata (FrozenMap → dict, tuple → list)."""
    if isinstance(x, (dict, FrozenMap)):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def build_plan(prog, layout) -> ScatterPlan:
    """Build and check a plan of ``prog`` for ``layout`` (docs/design.rst §5–§6)."""
    if isinstance(layout, (LaneBlocks, LaneSparseBlocks)):
        if prog.kind != "cell":
            raise JacError("nonuniform_pattern",
                           f"{type(layout).__name__} needs the same per-cell block in every cell; this "
                           "model's Jacobian couples different cells or differs between cells "
                           "(use Csr() or ColumnBanded())")
        kind, arrays, info, lanes = _lane_blocks(prog, layout)
    elif isinstance(layout, Csr):
        kind, arrays, info, lanes = _csr(prog)
    elif isinstance(layout, Csc):
        kind, arrays, info, lanes = _csc(prog)
    elif isinstance(layout, ColumnBanded):
        kind, arrays, info, lanes = _column_banded(prog, layout)
    else:
        raise JacError("bad_option", f"unknown layout {layout!r}; use LaneBlocks, LaneSparseBlocks, "
                       "ColumnBanded, Csr or Csc")
    return ScatterPlan(prog.fingerprint, layout, kind, arrays, info, lanes, _plan_key(layout, kind, lanes, info, arrays))


def _plan_key(layout, kind: str, lanes, info, arrays) -> str:
    """A plan's content hash (layout, kind, lanes, info, arrays)."""
    h = hashlib.sha256(repr((layout.name, kind, lanes, sorted(info.items()))).encode())
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(np.ascontiguousarray(arrays[k], dtype=_I).tobytes())
    return h.hexdigest()


def _block_pattern(prog) -> tuple:
    """Per-lane block: rows = species, columns = column variables in order."""
    m = prog.meta
    cols = list(prog.col_vars)
    cpos = {v: i for i, v in enumerate(cols)}
    lane_vars, glob_vars = m["lane_vars"], m["glob_vars"]
    fcolvar = [lane_vars[c] if ln else glob_vars[c] for ln, c in zip(m["flane"], m["fcid"])]
    rc = [(int(r), cpos[v]) for r, v in zip(m["frow"], fcolvar)]
    return rc, len(prog.layout.states), len(cols)


def _slots_from(keys: list, rc: list) -> tuple:
    """ptr/src over slots ``keys`` (list of (r, c)) from field (r, c) list."""
    where = {k: i for i, k in enumerate(keys)}
    lists: list = [[] for _ in keys]
    for k, key in enumerate(rc):
        lists[where[key]].append(k)
    ptr = np.zeros(len(keys) + 1, _I)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    src = np.array([k for x in lists for k in x], dtype=_I)
    return ptr, src


def markowitz(prog) -> tuple:
    """(ordering, lu_pattern) of a square cell block: the one block-LU order
    (:func:`esmjac.linalg.factorization.block_order`) as indices into the
    declared states — elimination position ``k`` is state ``ordering[k]``."""
    rc, n, m = _block_pattern(prog)
    if n != m or prog.wrt != "states":
        raise JacError("bad_option", "a Markowitz ordering needs a square block (wrt='states')")
    states = prog.layout.states
    plan = block_order(states, [(states[r], states[c]) for r, c in rc])
    return plan.positions(states), plan.lu_pattern


def _lane_blocks(prog, layout) -> tuple:
    rc, n, m = _block_pattern(prog)
    info: dict[str, Any] = {"block": [n, m], "rows": list(prog.layout.states), "cols": list(prog.col_vars)}
    if isinstance(layout, LaneSparseBlocks) or layout.order == "markowitz":
        order, lu = markowitz(prog)
        inv = {s: i for i, s in enumerate(order)}
        rcp = [(inv[r], inv[c]) for r, c in rc]
        info["ordering"] = list(order)
        if isinstance(layout, LaneSparseBlocks):
            keys = list(lu)
            info["lu_pattern"] = [list(x) for x in lu]
            info["fill"] = len(lu) - len({*rcp} | {(i, i) for i in range(n)})
        else:
            keys = [(i, j) for i in range(n) for j in range(n)]
        ptr, src = _slots_from(keys, rcp)
        if isinstance(layout, LaneSparseBlocks):
            a = np.arange(len(keys), dtype=_I)
        else:
            a = np.array([i * n + j for i, j in keys], dtype=_I)
    else:
        keys = [(i, j) for i in range(n) for j in range(m)]
        ptr, src = _slots_from(keys, rc)
        a = np.arange(len(keys), dtype=_I)
    info["slots_per_lane"] = len(keys)
    info["unit_stride"] = True
    info["tile"] = layout.tile
    arrays = dict(ptr=ptr, src=src, a=a, b=np.zeros(len(keys), _I), stride=np.ones(len(keys), _I))
    arrays.update(_fused(arrays, prog.n_fields))
    return "lane", arrays, info, None


def _fused(arrays: dict, nfields: int) -> dict:
    """Per-band destinations (``fa/fb/fs``) for the fused kernels, and the
    slots no band reaches (``za/zb/zs``), zeroed separately."""
    ptr, src = arrays["ptr"], arrays["src"]
    slot_of = np.full(nfields, -1, _I)
    for s in range(len(ptr) - 1):
        slot_of[src[ptr[s]:ptr[s + 1]]] = s
    empty = np.flatnonzero(ptr[1:] == ptr[:-1])
    return dict(fa=arrays["a"][slot_of], fb=arrays["b"][slot_of], fs=arrays["stride"][slot_of],
                za=arrays["a"][empty], zb=arrays["b"][empty], zs=arrays["stride"][empty],
                zptr=np.zeros(empty.size + 1, _I))


def _csr(prog) -> tuple:
    nrows = sum(prog.layout.size(s) for s in prog.layout.states)
    if prog.kind == "cell":
        # Every cell has the same block: row (s, cell) holds that species'
        # columns in column order, so the slot of (s, j-th column, cell) is
        # N*P_s + cell*n_s + j — a lane plan with stride n_s.
        rc, n, m = _block_pattern(prog)
        N = prog.cells
        per = {s: sorted({c for r, c in rc if r == s}) for s in range(n)}
        lane_vars = set(prog.meta["lane_vars"])
        cols = list(prog.col_vars)
        keys, a, b, stride = [], [], [], []
        P = 0
        for s in range(n):
            for j, c in enumerate(per[s]):
                keys.append((s, c))
                a.append(P)
                b.append(j)
                stride.append(len(per[s]))
            P += len(per[s])
        ptr, src = _slots_from(keys, rc)
        # indptr/indices depend on the lane count: built per lane count on
        # demand (csr_index) from these per-slot recipes, never stored per cell.
        lane_pos = {v: i for i, v in enumerate(prog.meta["lane_vars"])}
        glob_pos = {v: i for i, v in enumerate(prog.meta["glob_vars"])}
        clane = np.array([cols[c] in lane_vars for s in range(n) for c in per[s]], dtype=_I)
        cpos = np.array([lane_pos[cols[c]] if cols[c] in lane_vars else glob_pos[cols[c]]
                         for s in range(n) for c in per[s]], dtype=_I)
        info = {"shape": [nrows, prog.n_cols], "nnz": int(P * N), "slots_per_lane": P,
                "cells": N, "n_lane_cols": int(prog.meta["n_lane_cols"]),
                "n_glob_cols": int(prog.meta["n_glob_cols"]),
                "row_nnz": [len(per[s]) for s in range(n)]}
        arrays = dict(ptr=ptr, src=src, a=np.array(a, _I), b=np.array(b, _I),
                      stride=np.array(stride, _I), csr_clane=clane, csr_cpos=cpos)
        arrays.update(_fused(arrays, prog.n_fields))
        return "lane", arrays, info, None
    return _compressed_points(prog, nrows, by_column=False)


def _compressed_points(prog, nrows: int, by_column: bool) -> tuple:
    """A point plan in compressed order: ``(kind, arrays, info, lanes)``
    with SciPy's CSR (``by_column=False``: rows major) or CSC (columns
    major) ``indptr``/``indices``; the bands of one entry are summed in
    field order (``ptr``/``src``), each entry stored once (``pos``)."""
    j, row, col = _points(prog)
    major, minor = (col, row) if by_column else (row, col)
    o = _csr_order(major, minor, j.size)
    a, b, jj = major[o], minor[o], j[o]
    new = np.r_[True, (a[1:] != a[:-1]) | (b[1:] != b[:-1])] if a.size else np.zeros(0, bool)
    nnz = int(new.sum())
    ptr = np.r_[np.flatnonzero(new), a.size].astype(_I) if a.size else np.zeros(1, _I)
    indptr = np.zeros((prog.n_cols if by_column else nrows) + 1, _I)
    np.add.at(indptr, a[new] + 1, 1)
    indptr = np.cumsum(indptr).astype(_I)
    info = {"shape": [nrows, prog.n_cols], "nnz": nnz, "size": nnz}
    arrays = dict(ptr=ptr, src=jj.astype(_I), pos=np.arange(nnz, dtype=_I),
                  indptr=indptr, indices=b[new].astype(_I))
    return "point", arrays, info, 1


def column_split(e: np.ndarray, shape: tuple, ns: int, axis: int) -> tuple:
    """ColumnBanded coordinates of flat state elements ``e`` (species-major,
    cells row-major): the column (lane) each lies in, and its unknown within
    the column, level-major (``level*ns + species``)."""
    N = int(np.prod(shape))
    s, cell = np.divmod(e, N)
    idx = np.unravel_index(cell, shape)
    rest = [x for d, x in enumerate(idx) if d != axis]
    rshape = [n for d, n in enumerate(shape) if d != axis]
    lane = np.ravel_multi_index(rest, rshape) if rest else np.zeros_like(cell)
    return lane, idx[axis] * ns + s


def _column_banded(prog, layout: ColumnBanded) -> tuple:
    lay = prog.layout
    if prog.wrt != "states":
        raise JacError("bad_option", "ColumnBanded stores a square state Jacobian (wrt='states')")
    shapes = {lay.shapes.get(s, ()) for s in lay.states}
    if len(shapes) != 1 or not next(iter(shapes)):
        raise JacError("nonuniform_pattern", "ColumnBanded needs every state on the same grid")
    shape = next(iter(shapes))
    axis = len(shape) - 1 if layout.axis is None else layout.axis
    if not 0 <= axis < len(shape):
        raise JacError("bad_option", f"ColumnBanded axis {axis} is outside the grid rank {len(shape)}")
    ns, N = len(lay.states), int(np.prod(shape))
    nz = shape[axis]
    C = N // nz
    j, row, col = _points(prog)

    rl, ri = column_split(row, shape, ns, axis)
    cl, ci = column_split(col, shape, ns, axis)
    if np.any(rl != cl):
        raise JacError("nonuniform_pattern",
                       f"the Jacobian couples different columns along axis {axis}; ColumnBanded "
                       "needs couplings only within a column (use Csr())")
    m = nz * ns
    kl = int(max(0, (ri - ci).max(initial=0)))
    ku = int(max(0, (ci - ri).max(initial=0)))
    if kl + ku + 1 > max(2 * ns + 1, m // 2):   # wider than a level's block and half the column
        raise JacError("nonuniform_pattern",
                       f"the Jacobian is not banded along axis {axis} (bandwidths {kl}/{ku} of {m} "
                       "unknowns per column, e.g. a periodic wrap-around); band storage would be "
                       "mostly zeros — use Csr()")
    nslots = (kl + ku + 1) * m
    Wc = tile_width(layout.tile, C)
    cap = tile_capacity(layout.tile, C)
    q = (ku + ri - ci) * m + ci
    j = j.astype(_I)
    if cap > C:                 # padding columns: copies of the last real column
        last = rl == C - 1
        extra = np.arange(C, cap, dtype=_I)
        q = np.concatenate([q, np.tile(q[last], extra.size)])
        j = np.concatenate([j, np.tile(j[last], extra.size)])
        rl = np.concatenate([rl, np.repeat(extra, int(last.sum()))])
    pos = tile_index(q, rl, nslots, Wc)
    o = _csr_order(pos, j, j.size)
    p_sorted = pos[o]
    new = np.r_[True, p_sorted[1:] != p_sorted[:-1]] if p_sorted.size else np.zeros(0, bool)
    ptr = np.r_[np.flatnonzero(new), p_sorted.size].astype(_I) if p_sorted.size else np.zeros(1, _I)
    arrays = dict(ptr=ptr, src=j[o].astype(_I), pos=p_sorted[new].astype(_I))
    size = nslots * cap
    info = {"axis": axis, "columns": C, "m": m, "kl": kl, "ku": ku, "size": size, "zero_first": True,
            "unknown_order": "level-major (lev*ns + species)", "tile": layout.tile,
            "tile_width": Wc, "capacity": cap}
    return "point", arrays, info, 1 if prog.kind == "global" else N
