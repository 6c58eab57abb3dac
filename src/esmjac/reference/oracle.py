"""The reference assembly: slow, simple, obviously right.

Walks every band, every row point and every contracted point, evaluates the
column index and the coefficient with the scalar evaluator (observed fully
inlined first, so only states, parameters, ``t`` and literal tables remain),
and accumulates ``J[row, col] += coef`` into a dict. Column indices outside
the column variable's extent contribute nothing (spec §4). This is the
oracle the compiled kernels are tested against; it is not a fast path.

Element names, order and defaults come from :mod:`esmjac.model.layout`
(``earthsci_ast.evaluate_rhs``'s: states in declaration order, elements
row-major, 1-based, ``Model.var[i,j]``), the same module the compiled path
asks.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from ..calculus.bandset import BandSet
from ..calculus.inline import inline_observed
from ..errors import JacError, typed_errors
from ..model.deep import run_deep
from ..model.evaluate import Decline, ev

from ..model.layout import Point, element_name, element_names, index_reader, ode_states, resolve_point

__all__ = ["oracle_entries", "assemble", "Assembled", "column_names"]


def oracle_entries(bs: BandSet, point: Point) -> dict:
    """{(row element, col element): value} over every band (accumulated)."""
    return run_deep(_oracle, bs, point)


def _oracle(bs: BandSet, point: Point) -> dict:
    view = bs.view
    read = index_reader(point.values)
    base_env = {n: v for n, v in point.values.items() if not isinstance(v, np.ndarray)}
    base_env["t"] = point.t
    out: dict = {}
    obs = dict(view.observed)
    for en in bs.entries:
        b = en.band
        coef = inline_observed(b.coef, obs)
        cidx = [inline_observed(c, obs) for c in b.cidx]
        col_shape = view.shape(en.col) if en.col != "t" else ()
        free = [(k, r) for k, r in enumerate(b.ridx) if isinstance(r, str)]
        boxes = [range(b.rows[k][0], b.rows[k][1] + 1) for k, _ in free]
        cboxes = [range(lo, hi + 1) for _, lo, hi in b.contracted]
        for rpt in itertools.product(*boxes):
            env = dict(base_env)
            ridx = list(b.ridx)
            for (k, r), v in zip(free, rpt):
                env[r] = float(v)
                ridx[k] = v
            for cpt in itertools.product(*cboxes):
                for (n, _, _), v in zip(b.contracted, cpt):
                    env[n] = float(v)
                try:
                    cols = [ev(c, env, read) for c in cidx]
                except Decline as exc:
                    raise JacError("evaluation_error", f"column index of {en.row}/{en.col}: {exc}")
                if any(c != int(c) for c in cols):
                    raise JacError("evaluation_error", f"non-integer column index {cols}")
                ci = tuple(int(c) for c in cols)
                if any(not 1 <= c <= n for c, n in zip(ci, col_shape)):
                    continue           # a ghost/boundary read: not a column
                try:
                    val = ev(coef, env, read)
                except Decline as exc:
                    raise JacError("evaluation_error", f"coefficient of {en.row}/{en.col}: {exc}")
                key = (element_name(en.row, tuple(ridx)), element_name(en.col, ci))
                out[key] = out.get(key, 0.0) + val
    return out


@dataclass(frozen=True)
class Assembled:
    """A Jacobian at a point: CSR matrix (structural zeros kept) and names."""

    matrix: object
    rows: list
    cols: list
    structure: str
    bands: BandSet


def column_names(bs: BandSet) -> list:
    view = bs.view
    if bs.wrt == "time":
        return ["t"]
    if bs.wrt == "parameters":
        return element_names(view, [n for n, v in view.variables.items() if v.kind == "parameter"])
    if bs.wrt == "forcing":
        return element_names(view, [n for n, v in view.variables.items()
                                     if v.kind == "parameter" and v.shape])
    return element_names(view, ode_states(view))


@typed_errors
def assemble(source, *, model: str | None = None, wrt: str = "states",
             u: dict | None = None, p: dict | None = None, t: float = 0.0,
             options: dict | None = None) -> Assembled:
    """One-shot Jacobian of ``source`` at (u, p, t) as a ``csr_array`` whose
    row and column names are ``earthsci_ast.evaluate_rhs``'s element names."""
    from scipy.sparse import csr_array

    bs = source if isinstance(source, BandSet) else BandSet.build(source, model, wrt, options)
    view = bs.view
    states = ode_states(view)
    params = [n for n, v in view.variables.items() if v.kind == "parameter"]
    point = resolve_point(view, u, p, t, states + params)
    vals = oracle_entries(bs, point)
    rows = element_names(view, states)
    cols = column_names(bs)
    rpos = {n: i for i, n in enumerate(rows)}
    cpos = {n: i for i, n in enumerate(cols)}
    ri, ci, data = [], [], []
    for (r, c), v in sorted(vals.items(), key=lambda kv: (rpos[view.scope + kv[0][0]],
                                                          cpos[_colname(view, bs, kv[0][1])])):
        ri.append(rpos[view.scope + r])
        ci.append(cpos[_colname(view, bs, c)])
        data.append(v)
    m = csr_array((np.asarray(data, dtype=float), (np.asarray(ri, dtype=np.int64), np.asarray(ci, dtype=np.int64))),
                  shape=(len(rows), len(cols)))
    m.sort_indices()
    return Assembled(m, rows, cols, bs.structure, bs)


def _colname(view, bs, c):
    return c if bs.wrt == "time" else view.scope + c
