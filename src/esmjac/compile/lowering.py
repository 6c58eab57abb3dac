"""Scalar pieces of a model's right-hand side (the value, not a derivative).

The compiled right-hand side needs what the band calculus needs for
derivatives: every array-level equation ``D(u) = rhs`` rewritten as additive
*pieces*, each a rectangular row region with one scalar expression in the
region's index names. ``f[u][r] = Σ pieces covering r``. This mirrors the
band calculus's array walk (``calculus/bands.py``) without differentiating:
sums split, scalar factors scale, ``makearray`` regions shift, aggregates
give their output box, and whole-array elementwise operations push the
index inward. Contractions are kept as closed scalar ``reduce: "+"``
aggregates in the piece's expression (the compiler unrolls them).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..calculus import context
from ..calculus.bands import (Ctx, aggregate_box, aligned, is_array_expr, place_subregion,
                              push_index, unbroadcast, value_origins)
from ..calculus.inline import inline_observed, range_of, region_bound
from ..errors import JacError, in_equation
from ..model.expr import AGG, Node, free_names, mul, node, op, substitute
from ..model.load import SystemView, lhs_state

__all__ = ["Piece", "rhs_pieces"]


@dataclass(frozen=True)
class Piece:
    """``f[row][pins] += expr`` for every point of ``rows`` (see module doc)."""

    row: str
    rows: tuple        # ((lo, hi), …) per dimension of ``row``, 1-based inclusive
    pins: tuple        # per dimension: free index name or pinned int
    expr: object


def _names(shape) -> list:
    return [f"_r{k + 1}" for k in range(len(shape))]


def rhs_pieces(view: SystemView) -> list:
    """Pieces of every differential equation, in equation order."""
    ctx = context(view)
    obs = dict(view.observed)
    out: list = []
    for lhs, rhs in view.equations:
        u = lhs_state(lhs)
        if u is None:
            continue
        with in_equation(u):
            rhs = inline_observed(rhs, obs)
            hidden = free_names(rhs) & view.indexed_observed
            if hidden:
                raise JacError("unsupported_construct",
                               f"the equation for `{u}` reads observed {sorted(hidden)} defined only "
                               "through an indexed left-hand side")
            shape = ctx.shapes.get(u, ())
            found: list = []
            if not shape:
                if is_array_expr(rhs, ctx):
                    if isinstance(rhs, Node) and rhs.op == AGG and not rhs.attr("output_idx"):
                        aggregate_box(rhs, ctx, ())     # a join, filter or semiring: its own refusal
                        raise JacError("unsupported_construct",
                                       f"a scalar contraction (an aggregate with no output index) as the "
                                       f"whole right-hand side of scalar `{u}` is not compiled")
                    raise JacError("unsupported_construct", f"array-valued right-hand side for scalar `{u}`")
                found.append(((), (), rhs))
            else:
                _walk(found, rhs, ctx.walking(u), tuple(shape), ())
        for rows, pins, e in found:
            out.append(Piece(u, tuple(tuple(r) for r in rows), tuple(pins), e))
    return out


def _full(shape):
    names = _names(shape)
    return [(1, n) for n in shape], names


def _walk(out: list, e, ctx: Ctx, shape: tuple, scale: tuple) -> None:
    if not is_array_expr(e, ctx):
        rows, names = _full(shape)
        out.append((rows, names, mul(e, *scale)))
        return
    if isinstance(e, str):
        rows, names = _full(shape)
        out.append((rows, names, mul(node("index", [e, *aligned(e, names, ctx)]), *scale)))
        return
    o = e.op
    if o == "+":
        for x in e.args:
            _walk(out, x, ctx, shape, scale)
    elif o == "-" and len(e.args) == 1 or o == "neg":
        _walk(out, e.args[0], ctx, shape, scale + (-1,))
    elif o == "-":
        _walk(out, e.args[0], ctx, shape, scale)
        for x in e.args[1:]:
            _walk(out, x, ctx, shape, scale + (-1,))
    elif o == "*" and sum(is_array_expr(x, ctx) for x in e.args) == 1:
        arr = [x for x in e.args if is_array_expr(x, ctx)][0]
        _walk(out, arr, ctx, shape, scale + tuple(x for x in e.args if not is_array_expr(x, ctx)))
    elif o == "/" and not is_array_expr(e.args[1], ctx):
        _walk(out, e.args[0], ctx, shape, scale + (op("/", 1, e.args[1]),))
    elif o == "broadcast":
        _walk(out, unbroadcast(e), ctx, shape, scale)
    elif o == AGG:
        _aggregate(out, e, ctx, shape, scale)
    elif o == "makearray":
        _makearray(out, e, ctx, scale)
    elif o in ("reshape", "transpose", "concat", "arrayop"):
        raise JacError("unsupported_construct", f"`{o}` has no compiled form")
    else:
        # Elementwise over whole arrays: push the index inward.
        names = _names(shape)
        body = push_index(e, list(names), ctx)
        out.append(([(1, n) for n in shape], names, mul(body, *scale)))


def _aggregate(out: list, e: Node, ctx: Ctx, shape: tuple, scale: tuple, absolute: bool = False) -> None:
    oidx, rows, ranges, body = aggregate_box(e, ctx, shape, absolute=absolute)
    if len(oidx) != len(shape):
        raise JacError("unsupported_construct",
                       f"a rank-{len(oidx)} aggregate is broadcast into a rank-{len(shape)} array; "
                       "bare-axis broadcasting is not compiled (give the aggregate every output index)")
    contracted = {n: list(range_of(r, ctx.index_sets)) for n, r in ranges.items() if n not in oidx}
    if contracted:
        body = node(AGG, (), body, output_idx=[], reduce="+", ranges=contracted)
    out.append((rows, oidx, mul(body, *scale)))


def _makearray(out: list, e: Node, ctx: Ctx, scale: tuple) -> None:
    for region, val in zip(e.attr("regions") or (), e.values or ()):
        rows = [(region_bound(r[0]), region_bound(r[1])) for r in region]
        if any(hi < lo for lo, hi in rows):
            continue
        if not is_array_expr(val, ctx):
            names = [f"_m{k + 1}" for k in range(len(rows))]
            out.append((rows, names, mul(val, *scale)))
            continue
        fullrank = isinstance(val, Node) and val.op == AGG and len(val.attr("output_idx") or ()) == len(rows)
        nonsing = [k for k, (lo, hi) in enumerate(rows) if hi > lo]
        keep = list(range(len(rows))) if fullrank else nonsing
        sub_shape = tuple(rows[k][1] - rows[k][0] + 1 for k in keep)
        sub: list = []
        if isinstance(val, Node) and val.op == AGG:
            _aggregate(sub, val, ctx.sub(keep), sub_shape, scale, absolute=True)
        else:
            _walk(sub, val, ctx.sub(keep), sub_shape, scale)
        origins = value_origins(val, ctx, len(keep))
        for srows, spins, expr in sub:
            pins, rows2, subst = place_subregion(rows, fullrank, origins, srows, spins)
            out.append((rows2, pins, substitute(expr, subst) if subst else expr))
