"""The trimmed evaluation document: what the compiler evaluates, nothing more.

Invariants:

- Source states are *inputs* only; no ``D`` equation survives, so nothing
  ever computes the source's derivative while evaluating its Jacobian.
- One *field* per band (``J1``, ``J2``, …; ``F1``… for right-hand-side
  pieces): a scalar expression over a rectangular box of index points. Row
  dimensions come first, then a contracted band's extra axes.
- Index names are canonical (``_c1…`` for the cells of a ``cell``-lane
  program, ``_g1…`` for a box of a ``global`` one), so equal subexpressions
  of different bands are the same hash-consed node, and common
  subexpressions are hoisted as observed ``jc1``, ``jc2``… in first-use
  order. Helper axes are named ``jcax<size>``.
- Lane kind: ``cell`` when every state has the same shape and every piece
  and band is pointwise over it (reads only its own cell), else ``global``.
- A *box* (every state and parameter a scalar: a 0-D mechanism as chemists
  publish it) is a ``cell`` program over one virtual cell axis: its bare
  state reads become ``X[_c1]`` on a one-cell layout, so the lane count is
  a run-time choice (one build serves 1 or 10⁶ cells). The pieces and bands
  are those of the box itself; only the lane addressing is added.
- ``per_lane`` scalar parameters (temperature, photolysis rates) are read
  per lane from ``forcing``, after the array-valued parameters, instead of
  once per call from ``p``.

The document serializes to deterministic JSON (goldens
``goldens/<fixture>.<wrt>.evaldoc.json``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ..calculus.inline import inline_observed
from ..errors import JacError
from ..model.deep import run_deep
from ..model.expr import (AGG, Node, iter_children, map_children, node, node_count, stable_json,
                          substitute, to_wire)
from ..model.layout import ModelLayout, model_layout
from ..model.load import SystemView
from .lowering import Piece, rhs_pieces

__all__ = ["Field", "EvalDoc", "jacobian_doc", "rhs_doc"]

EVALDOC_VERSION = "1"


@dataclass(frozen=True)
class Field:
    """``name`` over ``dims`` (((index name, lo, hi), …)): row ``row`` at
    ``pins`` (per row dimension: a dim name or a pinned int), column ``col``
    at ``cidx`` (index expressions; empty for a scalar column; ``col`` is
    ``None`` for a right-hand-side piece)."""

    name: str
    row: str
    col: str | None
    dims: tuple
    pins: tuple
    cidx: tuple
    expr: object

    @property
    def npoints(self) -> int:
        n = 1
        for _, lo, hi in self.dims:
            n *= hi - lo + 1
        return n


def _lane_reads(lay: ModelLayout, pins) -> dict:
    """Bare-name → per-lane read substitutions: the states of a box and the
    ``per_lane`` parameters, read at the piece's own cell ``pins``."""
    names = (lay.states if lay.box else ()) + lay.per_lane
    return {n: node("index", [n, *pins]) for n in names}


def _box_rows(lay: ModelLayout, rows, pins):
    """A box piece/band's row region and pins on the virtual cell axis."""
    if lay.box and not rows:
        return ((1, 1),), ("_b1",)
    return tuple(rows), tuple(pins)


@dataclass(frozen=True)
class EvalDoc:
    """The evaluation document of one program (see module docstring)."""

    layout: ModelLayout
    wrt: str | None        # None for the right-hand side
    kind: str              # "cell" | "global"
    observed: tuple        # ((name, expr), …) hoisted common subexpressions
    fields: tuple

    @cached_property
    def _expansion(self) -> dict:
        full: dict = {}
        for n, d in self.observed:      # definitions refer only to earlier names
            full[n] = substitute(d, full)
        return full

    def expanded(self, e):
        """``e`` with the hoisted ``jc…`` names substituted back."""
        return substitute(e, self._expansion) if self.observed else e

    def to_json(self) -> str:
        return run_deep(lambda: stable_json(self.to_dict()))

    def to_dict(self) -> dict:
        lay = self.layout
        axes = {}
        for f in self.fields:
            for _, lo, hi in f.dims:
                axes[f"jcax{hi - lo + 1}"] = {"kind": "interval", "size": hi - lo + 1}
        variables = {}
        for s in lay.states:
            variables[s] = {"type": "parameter", "role": "state_input", "shape": list(lay.shapes.get(s, ()))}
        for s in lay.all_params:
            variables[s] = {"type": "parameter", "shape": list(lay.shapes.get(s, ()))}
        for n, _ in self.observed:
            variables[n] = {"type": "unknown", "role": "hoisted"}
        eqs = [{"lhs": n, "rhs": to_wire(e)} for n, e in self.observed]
        fields = []
        for f in self.fields:
            variables[f.name] = {"type": "unknown", "role": "band_field" if f.col else "rhs_piece",
                                 "shape": [f"jcax{hi - lo + 1}" for _, lo, hi in f.dims]}
            fields.append({
                "name": f.name, "row": f.row, "col": f.col,
                "region": [{"index": n, "from": lo, "to": hi} for n, lo, hi in f.dims],
                "row_index": [to_wire(p) for p in f.pins],
                "col_index": [to_wire(c) for c in f.cidx],
                "expr": to_wire(f.expr),
            })
        return {
            "esmjac_evaldoc": EVALDOC_VERSION,
            "model": lay.model, "wrt": self.wrt, "lane_kind": self.kind,
            "cell_shape": list(lay.cell_shape) if self.kind == "cell" else [],
            **({"box": True} if lay.box else {}),
            "index_sets": dict(sorted(axes.items())),
            "inputs": {"states": list(lay.states), "parameters": list(lay.params),
                       "forcing": list(lay.forcing),
                       **({"per_lane": list(lay.per_lane)} if lay.per_lane else {})},
            "variables": variables,
            "observed": eqs,
            "fields": fields,
        }


# ---------------------------------------------------------------- lane kind

def _reads(e, acc: list) -> None:
    stack, seen = [e], set()
    while stack:
        x = stack.pop()
        if isinstance(x, Node) and id(x) not in seen:
            seen.add(id(x))
            if x.op == "index":
                acc.append(x)
            stack.extend(iter_children(x))


def _pointwise(lay: ModelLayout, rows, pins, cidx, expr, col_shape) -> bool:
    """True when a piece/band covers every cell and reads only its own cell."""
    cell = lay.cell_shape
    if not cell or tuple(rows) != tuple((1, n) for n in cell):
        return False
    if not all(isinstance(p, str) for p in pins) or len(set(pins)) != len(pins):
        return False
    if col_shape and tuple(cidx) != tuple(pins):
        return False
    reads: list = []
    _reads(expr, reads)
    for r in reads:
        head = r.args[0]
        if not isinstance(head, str) or lay.shapes.get(head) != cell or tuple(r.args[1:]) != tuple(pins):
            return False
    return True


def _has_bare_arrays(lay: ModelLayout, e) -> bool:
    """Whether ``e`` reads an array variable other than as the head of an
    ``index`` read."""
    return any(lay.shapes.get(n) for n in _bare_names(e))


def _bare_names(e) -> set:
    """The ``str`` leaves of ``e`` that occur somewhere other than as the
    head of an ``index`` read: one walk over the DAG, each shared node once
    (a walk per name, each unshared, was most of a 272-species build)."""
    out: set = set()
    seen: set = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            out.add(x)
        elif isinstance(x, Node) and id(x) not in seen:
            seen.add(id(x))
            if x.op == "index" and isinstance(x.args[0], str):
                stack.extend(x.args[1:])
            else:
                stack.extend(iter_children(x))
    return out


# ---------------------------------------------------------------- building

def _canon(dims_names: list, prefix: str) -> dict:
    return {n: f"{prefix}{k + 1}" for k, n in enumerate(dims_names)}


def _hoist(fields: list, min_nodes: int = 3) -> tuple:
    """Name subexpressions shared by two or more uses (deterministic order)."""
    uses: dict = {}
    order: list = []

    def count(e):
        stack = [e]
        while stack:
            x = stack.pop()
            if not isinstance(x, Node) or x.op == "index":
                continue
            k = uses.get(x, 0)
            uses[x] = k + 1
            if k == 0:
                stack.extend(iter_children(x))

    for f in fields:
        count(f.expr)
    shared = {x for x, k in uses.items() if k > 1 and node_count(x) >= min_nodes and x.op != AGG}
    if not shared:
        return (), fields
    names: dict = {}

    def visit(e):                    # post-order: inner hoists first
        stack = [(e, False)]
        while stack:
            x, done = stack.pop()
            if not isinstance(x, Node) or x.op == "index":
                continue
            if done:
                if x in shared and x not in names:
                    names[x] = f"jc{len(names) + 1}"
                    order.append(x)
                continue
            if x in names:
                continue
            stack.append((x, True))
            stack.extend((c, False) for c in reversed(list(iter_children(x))))

    for f in fields:
        visit(f.expr)
    repl = {x: names[x] for x in order}
    memo: dict = {}

    def rewrite(e, top=False):
        if not isinstance(e, Node):
            return e
        if not top and e in repl:
            return repl[e]
        r = memo.get(e) if not top else None
        if r is None:
            r = map_children(e, rewrite)
            if not top:
                memo[e] = r
        return r

    observed = tuple((names[x], rewrite(x, top=True)) for x in order)
    out = [Field(f.name, f.row, f.col, f.dims, f.pins, f.cidx, rewrite(f.expr)) for f in fields]
    return observed, out


def rhs_doc(view: SystemView, lay: ModelLayout | None = None) -> EvalDoc:
    """The evaluation document of the right-hand side."""
    lay = lay or model_layout(view)
    pieces = run_deep(rhs_pieces, view)
    if lay.box or lay.per_lane:
        pieces = [_lane_piece(lay, p) for p in pieces]
    kind = "cell" if lay.cell_shape and all(
        _pointwise(lay, p.rows, p.pins, (), p.expr, ()) and not _has_bare_arrays(lay, p.expr)
        for p in pieces) else "global"
    fields = []
    for k, p in enumerate(pieces):
        fields.append(_field(f"F{k + 1}", p.row, None, p.rows, p.pins, (), p.expr, (), kind))
    obs, fields = run_deep(_hoist, fields)
    return EvalDoc(lay, None, kind, obs, tuple(fields))


def _one_cell_pins(lay: ModelLayout, rows, pins) -> bool:
    cell = lay.cell_shape
    return bool(cell) and all(n == 1 for n in cell) and tuple(rows) == tuple((1, 1) for _ in cell) \
        and tuple(pins) == tuple(1 for _ in cell)


def _unpin(e, lay: ModelLayout, lits: tuple, names: tuple):
    """``e`` with every read ``X[1,…]`` of a cell-shaped array as ``X[names]``."""
    cell = lay.cell_shape
    memo: dict = {}

    def go(x):
        if not isinstance(x, Node):
            return x
        r = memo.get(id(x))
        if r is None:
            if x.op == "index" and isinstance(x.args[0], str) and lay.shapes.get(x.args[0]) == cell \
                    and tuple(x.args[1:]) == lits:
                r = node("index", [x.args[0], *names])
            else:
                r = map_children(x, go)
            memo[id(x)] = r
        return r
    return go(e)


def _lane_piece(lay: ModelLayout, p):
    rows, pins = _box_rows(lay, p.rows, p.pins)
    if not all(isinstance(x, str) for x in pins):
        return p                   # not pointwise: stays global
    return Piece(p.row, rows, pins, substitute(p.expr, _lane_reads(lay, pins)))


def jacobian_doc(bs, lay: ModelLayout | None = None, rhs_kind: str | None = None) -> EvalDoc:
    """The evaluation document of a BandSet's Jacobian."""
    view = bs.view
    lay = lay or model_layout(view)
    obs = dict(view.observed)

    def work():
        items = []
        for en in bs.entries:
            b = en.band
            coef = inline_observed(b.coef, obs)
            cidx = tuple(inline_observed(c, obs) for c in b.cidx)
            rows, ridx = b.rows, b.ridx
            if _one_cell_pins(lay, rows, ridx):
                # A one-cell grid: the calculus pins the size-1 index to the
                # literal 1; name it again so the band stays pointwise.
                names = tuple(f"_p{k + 1}" for k in range(len(ridx)))
                coef = _unpin(coef, lay, tuple(ridx), names)
                if tuple(cidx) == tuple(ridx):
                    cidx = names
                ridx = names
            if lay.box or lay.per_lane:
                rows, ridx = _box_rows(lay, rows, ridx)
                if all(isinstance(x, str) for x in ridx):
                    coef = substitute(coef, _lane_reads(lay, ridx))
                    if en.col in lay.per_lane or (lay.box and en.col in lay.states):
                        cidx = tuple(ridx)
            items.append((en, b, rows, ridx, coef, cidx))
        return items

    items = run_deep(work)
    kind = "cell"
    if rhs_kind == "global" or not lay.cell_shape:
        kind = "global"
    else:
        for en, b, rows, ridx, coef, cidx in items:
            cs = lay.shapes.get(en.col, ()) if en.col != "t" else ()
            if b.contracted or not _pointwise(lay, rows, ridx, cidx, coef, cs) \
                    or _has_bare_arrays(lay, coef) or (cs and cs != lay.cell_shape):
                kind = "global"
                break
    fields = []
    for k, (en, b, rows, ridx, coef, cidx) in enumerate(items):
        fields.append(_field(f"J{k + 1}", en.row, en.col, rows, ridx, cidx, coef,
                             b.contracted, kind))
    hobs, fields = run_deep(_hoist, fields)
    return EvalDoc(lay, bs.wrt, kind, hobs, tuple(fields))


def _field(name, row, col, rows, pins, cidx, expr, contracted, kind) -> Field:
    free = [(p, rows[k]) for k, p in enumerate(pins) if isinstance(p, str)]
    if len({p for p, _ in free}) != len(free):
        raise JacError("unsupported_construct", f"a repeated row index in {name} (diagonal region)")
    dims_src = [(p, lo, hi) for p, (lo, hi) in free] + [tuple(c) for c in contracted]
    ren = _canon([d[0] for d in dims_src], "_c" if kind == "cell" else "_g")
    dims = tuple((ren[n], lo, hi) for n, lo, hi in dims_src)
    pins2 = tuple(ren.get(p, p) if isinstance(p, str) else p for p in pins)
    sub = {k: v for k, v in ren.items() if k != v}
    e = substitute(expr, sub) if sub else expr
    c = tuple(substitute(x, sub) if sub else x for x in cidx)
    return Field(name, row, col, dims, pins2, c, e)
