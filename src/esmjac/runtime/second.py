"""Second order: ``contract`` = Σᵢ λᵢ ∂²fᵢ/∂u∂u · v = ∇ᵤ(λᵀ J(u) v).

Every band coefficient is differentiated again by the same calculus (its
state sites, in sorted order), giving *second-order fields* over the parent
band's box. Their values are compiled like any band slab; the contraction
then adds ``λ[row] · v[parent column] · ∂coef/∂u[site]`` into ``out[site]``
in field order, point order — sequential, so deterministic. Built on first
use per program (most users never ask for second order).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._frozen import FrozenMap, frozen_arrays
from ..calculus.bands import Ctx, bands
from ..compile.engine import ENGINE_OPTIONS, Kernel, compile_doc
from ..compile.evaldoc import EvalDoc, Field
from ..layouts.plans import field_meta
from ..model.deep import run_deep
from ..model.expr import free_names
from .threads import one_thread

__all__ = ["contract_at", "second_order", "SecondOrder"]

_BUILT: dict = {}
_LOCK = threading.Lock()


@dataclass(frozen=True, eq=False)
class SecondOrder:
    """The compiled second-order fields of one program (immutable)."""

    doc: EvalDoc
    kernel: Kernel
    parent_of: Any             # read-only: second-order field → parent field
    meta: FrozenMap            # read-only index arrays (row, site, pcol[, slab_size])


def second_order(prog) -> SecondOrder:
    """The compiled second-order fields of ``prog`` (cached per program)."""
    with _LOCK:
        s = _BUILT.get(prog.fingerprint)
        if s is None:
            s = run_deep(_build, prog)
            _BUILT[prog.fingerprint] = s
        return s


def _build(prog) -> SecondOrder:
    lay = prog.layout
    doc = prog.doc
    states = set(lay.states)
    ctx = Ctx({}, dict(lay.shapes), frozenset(lay.all_params))
    fields: list[Field] = []
    parents: list[int] = []
    for k, f in enumerate(doc.fields):
        coef = doc.expanded(f.expr)
        for w in sorted(free_names(coef) & states):
            for b in bands(coef, w, ctx, ()):
                fields.append(Field(f"H{len(fields) + 1}", f.row, w, f.dims, f.pins, tuple(b.cidx), b.coef))
                parents.append(k)
    doc2 = EvalDoc(lay, "second", doc.kind, (), tuple(fields))
    kern = compile_doc(doc2, ENGINE_OPTIONS)
    parent_of = np.array(parents, dtype=np.int64)
    if doc.kind == "cell":
        sidx = {n: s for s, n in enumerate(lay.states)}
        meta = {"row": np.array([sidx[f.row] for f in fields], np.int64),
                "site": np.array([sidx[f.col] for f in fields], np.int64),
                # the parent band's column: a state (wrt="states") or, for other
                # programs, its column id (lane column c*L + l, or a scalar one)
                "pcol": (np.array([sidx[doc.fields[k].col] for k in parent_of], np.int64)
                         if prog.wrt == "states" else
                         np.asarray(prog.meta["fcid"], np.int64)[parent_of]),
                "plane": np.asarray(prog.meta["flane"], bool)[parent_of]}
    else:
        soff = lay.state_offsets()
        cbase = {s: soff[s] for s in lay.states}
        m2 = field_meta(doc2, lay, lay.states, cbase)
        pm = prog.meta
        offs = np.cumsum([0] + [f.npoints for f in doc.fields])
        pcol = np.concatenate([pm["pt_col"][offs[k]:offs[k + 1]] for k in parent_of]) \
            if len(parent_of) else np.zeros(0, np.int64)
        meta = {"row": m2["pt_row"], "site": m2["pt_col"], "pcol": pcol,
                "slab_size": m2["slab_size"]}
    parent_of.setflags(write=False)
    return SecondOrder(doc2, kern, parent_of, frozen_arrays(meta))


def contract_at(prog, ws2, lam: np.ndarray, v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = Σᵢ λᵢ ∂²fᵢ/∂u∂u · v`` at ``ws2.point`` (the last
    ``eval_into``); arguments already checked by ``JacobianProgram.contract``."""
    u, p, t, f = ws2.point
    L = ws2.lanes
    s = second_order(prog)
    m = s.meta
    size = len(s.doc.fields) * L if prog.kind == "cell" else int(m["slab_size"])
    D = ws2.second_slab
    if D is None or D.shape[0] != max(size, 1):
        D = np.zeros(max(size, 1))
        ws2.second_slab = D
    h = np.zeros(max(s.kernel.n_hoist, 1))
    s.kernel.run(np.ascontiguousarray(u, dtype=np.float64), p, t,
                 np.ascontiguousarray(f, dtype=np.float64), D, h, ws2.cix, L, one_thread())
    out[:] = 0.0
    lam = lam.astype(np.float64, copy=False)
    v = v.astype(np.float64, copy=False)
    if prog.kind == "cell":
        for q in range(len(s.doc.fields)):
            r, w, c = m["row"][q], m["site"][q], m["pcol"][q]
            out[w * L:(w + 1) * L] += lam[r * L:(r + 1) * L] * v[c * L:(c + 1) * L] * D[q * L:(q + 1) * L]
    else:
        ok = (m["site"] >= 0) & (m["pcol"] >= 0)
        contrib = lam[m["row"][ok]] * v[m["pcol"][ok]] * D[:size][ok]
        np.add.at(out, m["site"][ok], contrib)     # sequential in index order
    return out
