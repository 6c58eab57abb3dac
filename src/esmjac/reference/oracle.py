"""The reference assembly: slow, simple, obviously right.

Walks every band, every row point and every contracted point, evaluates the
column index and the coefficient with the scalar evaluator (observed fully
inlined first, so only states, parameters, ``t`` and literal tables remain),
and accumulates ``J[row, col] += coef`` into a dict. Column indices outside
the column variable's extent contribute nothing (spec §4). This is the
oracle the compiled kernels are tested against; it is not a fast path.

Element names and order follow ``earthsci_ast.evaluate_rhs``: states in
declaration order, elements row-major, 1-based, ``Model.var[i,j]``.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..model.deep import run_deep
from ..calculus.bandset import BandSet
from ..calculus.inline import inline_observed
from ..errors import JacError, typed_errors
from ..model.evaluate import Decline, ev
from ..model.expr import AGG, Node, from_ast, node
from ..model.load import SystemView, lhs_state

__all__ = ["Point", "element_names", "resolve_point", "oracle_entries", "assemble", "Assembled"]


def _elem(name: str, idx: tuple) -> str:
    return f"{name}[{','.join(str(i) for i in idx)}]" if idx else name


def _points(shape: tuple):
    return itertools.product(*(range(1, n + 1) for n in shape))


def ode_states(view: SystemView) -> list:
    """The integrated states in earthsci-ast's problem order (``view.integrated``,
    which includes states whose derivative is identically zero); for a view
    without that list, the written states in declaration order."""
    if view.integrated is not None:
        return list(view.integrated)
    written = {lhs_state(l) for l, _ in view.equations}
    return [n for n, v in view.variables.items() if v.kind == "state" and n in written]


def element_names(view: SystemView, names: list) -> list:
    """Scoped element names of ``names`` (row-major elements)."""
    out = []
    for n in names:
        for idx in _points(view.shape(n)):
            out.append(view.scope + _elem(n, idx))
    return out


@dataclass(frozen=True)
class Point:
    """Values of every state and parameter (arrays as nested numpy), and t."""

    values: dict       # local name → float or ndarray (shape = variable shape)
    t: float


def _ic_values(view: SystemView) -> dict:
    out = {}
    for lhs, rhs in view.equations:
        if isinstance(lhs, Node) and lhs.op == "ic" and isinstance(lhs.args[0], str):
            out.setdefault(lhs.args[0], rhs)
    for name, rhs in getattr(view.source, "field_ics", None) or ():
        out.setdefault(name, from_ast(rhs))
    return out


def _fill(view: SystemView, name: str, expr, shape: tuple, env: dict, index_fn=None):
    """A default/initial value (scalar broadcast, or an aggregate per cell),
    evaluated under ``env`` (t and the parameters resolved so far)."""
    if not shape:
        return ev(expr, env, index_fn)
    from ..calculus import context
    ctx = context(view)
    arr = np.empty(shape)
    for idx in _points(shape):
        arr[tuple(i - 1 for i in idx)] = _ev_at(expr, env, idx, ctx, index_fn)
    return arr


def _ev_at(e, env: dict, idx: tuple, ctx, index_fn) -> float:
    """Element ``idx`` (1-based) of an array-valued expression: a whole array
    name reads that element, an aggregate evaluates its body there, and an
    elementwise operation applies to its operands' elements; a scalar
    expression broadcasts."""
    from ..calculus.bands import is_array_expr
    from ..model.expr import map_children
    if isinstance(e, str) and ctx.is_array(e):
        return index_fn(node("index", [e, *idx]), env)
    if not (isinstance(e, Node) and is_array_expr(e, ctx)):
        return ev(e, env, index_fn)
    if e.op == AGG and e.attr("output_idx"):
        oidx = list(e.attr("output_idx"))
        if len(oidx) != len(idx):
            raise Decline("aggregate rank differs from the variable's")
        env2 = dict(env)
        env2.update((n, float(i)) for n, i in zip(oidx, idx) if isinstance(n, str))
        return ev(e.body, env2, index_fn)
    if e.op in (AGG, "makearray", "arrayop", "broadcast", "reshape", "transpose", "concat"):
        raise Decline(f"`{e.op}` initial values are not evaluated here")
    return ev(map_children(e, lambda x: _ev_at(x, env, idx, ctx, index_fn)
                           if is_array_expr(x, ctx) else x), env, index_fn)


def _initial(view: SystemView, n: str, src, env: dict, values: dict):
    """The value of ``n`` from ``src`` (a literal, list, or expression), NaN
    where it cannot be evaluated yet."""
    var = view.variables[n]
    if src is None:
        return np.full(var.shape, np.nan) if var.shape else math.nan
    if isinstance(src, (list, tuple)):       # a per-element default array
        arr = np.asarray(src, dtype=float)
        if arr.shape != var.shape:
            raise JacError("bad_argument", f"default of `{n}` has shape {arr.shape}, not {var.shape}")
        return arr.copy()
    try:
        e = from_ast(src) if not isinstance(src, (int, float, Node, str)) else src
        return _fill(view, n, e, var.shape, env, _index_fn(values))
    except Decline:         # not evaluable (yet): must be given by u / p
        return np.full(var.shape, np.nan) if var.shape else math.nan


def resolve_point(view: SystemView, u: dict | None, p: dict | None, t: float,
                  names: list) -> Point:
    """Values for every name in ``names``, as earthsci-ast's problem starts:
    parameters from their defaults (which may be expressions of other
    parameters) and the ``p``/``u`` overrides of parameters; then states from
    their ``ic`` equation (an expression of parameters, inline or per-cell),
    else their default, then the state overrides. Overrides are keyed by
    element or variable name, scoped or bare. Unknown keys are refused."""
    ics = _ic_values(view)
    values: dict = {}
    pnames = [n for n in names if view.variables[n].kind == "parameter"]
    snames = [n for n in names if view.variables[n].kind != "parameter"]
    overrides = [(k, v) for d in ((p or {}), (u or {})) for k, v in d.items()]
    env: dict = {"t": 0.0}
    pending = list(pnames)
    for _ in range(len(pending) + 1):        # defaults may read other parameters
        still = []
        for n in pending:
            values[n] = _initial(view, n, view.variables[n].default, env, values)
            if np.isnan(values[n]).any():
                still.append(n)
            elif not view.variables[n].shape:
                env[n] = float(values[n])
        if len(still) == len(pending):
            break
        pending = still
    pset = set(pnames)
    for key, val in overrides:
        if _base(view, key) in pset:
            _apply(view, values, key, val)
    env.update((n, float(values[n])) for n in pnames if not view.variables[n].shape)
    for n in snames:
        src = ics.get(n)
        if src is None:
            src = view.variables[n].default
        values[n] = _initial(view, n, src, env, values)
    for key, val in overrides:
        if _base(view, key) not in pset:
            _apply(view, values, key, val)
    for n, v in values.items():
        if np.isnan(v).any():
            raise JacError("bad_argument",
                           f"`{view.scope}{n}` has no usable default or initial value; pass it in u/p")
    return Point(values, float(t))


def _base(view: SystemView, key: str) -> str:
    k = key[len(view.scope):] if view.scope and key.startswith(view.scope) else key
    return k.partition("[")[0]


def _apply(view: SystemView, values: dict, key: str, val) -> None:
    k = key[len(view.scope):] if view.scope and key.startswith(view.scope) else key
    base, _, rest = k.partition("[")
    if base not in values:
        raise JacError("bad_argument", f"unknown name `{key}` (not a state or parameter of this model)")
    shape = view.shape(base)
    if rest:
        idx = tuple(int(x) - 1 for x in rest.rstrip("]").split(","))
        if len(idx) != len(shape) or any(not 0 <= i < n for i, n in zip(idx, shape)):
            raise JacError("bad_argument", f"`{key}` is outside the shape {shape} of `{base}`")
        values[base][idx] = float(val)
    elif shape:
        values[base] = np.broadcast_to(np.asarray(val, dtype=float), shape).copy()
    else:
        values[base] = float(val)


def _index_fn(values: dict):
    def read(e: Node, env: dict) -> float:
        head = e.args[0]
        idx = [ev(x, env, read) for x in e.args[1:]]
        ii = []
        for x in idx:
            if x != math.floor(x):
                raise Decline(f"non-integer subscript {x}")
            ii.append(int(x) - 1)
        if isinstance(head, str):
            arr = values.get(head)
            if arr is None or not isinstance(arr, np.ndarray) or arr.ndim != len(ii):
                raise Decline(f"`{head}` is not an array of rank {len(ii)} here")
            if any(not 0 <= i < n for i, n in zip(ii, arr.shape)):
                raise Decline(f"read of `{head}` outside its extent")
            return float(arr[tuple(ii)])
        if isinstance(head, Node) and head.op == "const":
            v = head.attr("value")
            for i in ii:
                if not 0 <= i < len(v):
                    raise Decline("const table read out of range")
                v = v[i]
            return float(v)
        raise Decline(f"cannot read an index of `{getattr(head, 'op', head)}`")
    return read


def oracle_entries(bs: BandSet, point: Point) -> dict:
    """{(row element, col element): value} over every band (accumulated)."""
    return run_deep(_oracle, bs, point)


def _oracle(bs: BandSet, point: Point) -> dict:
    view = bs.view
    read = _index_fn(point.values)
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
                key = (_elem(en.row, tuple(ridx)), _elem(en.col, ci))
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
