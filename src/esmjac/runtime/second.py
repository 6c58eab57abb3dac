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

import numpy as np

from ..model.deep import run_deep
from ..calculus.bands import Ctx, bands
from ..errors import JacError
from ..compile.evaldoc import EvalDoc, Field
from ..model.expr import free_names

__all__ = ["contract", "second_order"]

_BUILT: dict = {}
_LOCK = threading.Lock()


class _Second:
    def __init__(self, doc, kernel, parent_of, meta):
        self.doc = doc
        self.kernel = kernel
        self.parent_of = parent_of      # second-order field → parent field
        self.meta = meta


def second_order(prog) -> _Second:
    """The compiled second-order fields of ``prog`` (cached per program)."""
    with _LOCK:
        s = _BUILT.get(prog.fingerprint)
        if s is None:
            s = run_deep(_build, prog)
            _BUILT[prog.fingerprint] = s
        return s


def _build(prog) -> _Second:
    from ..layouts.plans import field_meta
    from .programs import PROGRAM_OPTIONS, _compile
    lay = prog.layout
    doc = prog.doc
    states = set(lay.states)
    ctx = Ctx({}, dict(lay.shapes), frozenset(lay.all_params))
    fields, parent_of = [], []
    for k, f in enumerate(doc.fields):
        coef = doc.expanded(f.expr)
        for w in sorted(free_names(coef) & states):
            for b in bands(coef, w, ctx, ()):
                fields.append(Field(f"H{len(fields) + 1}", f.row, w, f.dims, f.pins, tuple(b.cidx), b.coef))
                parent_of.append(k)
    doc2 = EvalDoc(lay, "second", doc.kind, (), tuple(fields))
    kern = _compile(doc2, dict(PROGRAM_OPTIONS))
    parent_of = np.array(parent_of, dtype=np.int64)
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
    return _Second(doc2, kern, parent_of, meta)


def contract(prog, plan, ws2, lam: np.ndarray, v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = Σᵢ λᵢ ∂²fᵢ/∂u∂u · v`` at the point of ``ws2``'s last ``eval_into``."""
    from .programs import _check_vec
    prog._check_plan(plan)
    prog._check_ws(ws2)
    if prog.wrt != "states":
        raise JacError("bad_option", "contract is the state Hessian contraction (wrt='states')")
    pt = ws2.second.get("point")
    if pt is None:
        raise JacError("bad_argument", "call eval_into on this workspace first (contract uses its point)")
    u, p, t, f = pt
    L = ws2.lanes
    n = prog.u_size(L)
    _check_vec("lam", lam, n)
    _check_vec("v", v, n)
    _check_vec("out", out, n, np.float64, out=True)
    from . import checks
    checks.disjoint({"out": out}, {"lam": lam, "v": v})
    s = second_order(prog)
    m = s.meta
    size = len(s.doc.fields) * L if prog.kind == "cell" else int(m["slab_size"])
    D = ws2.second.get("slab")
    if D is None or D.shape[0] != max(size, 1):
        D = np.zeros(max(size, 1))
        ws2.second["slab"] = D
    h = np.zeros(max(s.kernel.n_hoist, 1))
    prog._run(s.kernel, np.ascontiguousarray(u, dtype=np.float64), p, t,
              np.ascontiguousarray(f, dtype=np.float64), D, h, ws2.cix, L)
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
