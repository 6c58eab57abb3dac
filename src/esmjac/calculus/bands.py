"""The array-level band calculus: differentiate an array-valued right-hand
side with respect to one variable into structured *bands*.

A band is one rectangular block of ∂(rhs of ``row``)/∂(``col``): for every
index point ``r`` in ``rows`` (and every point ``c`` of the ``contracted``
box), ``J[row[r], col[col_idx(r, c)]] += coef(r, c)``. Bands are additive.

Invariants: sites are visited in sorted canonical-key order, sub-ranges in
ascending order, so the band list is deterministic; coefficients go through
the reference's simplifier (:func:`simp`); a coefficient that simplifies to
a literal zero is dropped; anything the calculus cannot express raises a
typed :class:`JacError` (never a silent zero).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import JacError
from ..model.expr import (AGG, Node, add, is_array_expr, free_names, is_zero, iter_children, map_children, mul, node, op,
                          substitute)
from .clip import clip_regions
from .inline import range_of, region_bound
from .rules import Site, dscalar
from .simplify import canon_lits, simp, simplify

__all__ = ["Band", "Ctx", "bands", "normalize_band", "sorted_sites"]


@dataclass(frozen=True)
class Band:
    """One structured block of the Jacobian (see module docstring)."""

    rows: tuple            # ((lo, hi), …) per row dimension, inclusive, 1-based
    ridx: tuple            # per dimension: free index name (str) or pinned int
    cidx: tuple            # column index expressions, one per column dimension
    coef: object           # scalar coefficient expression
    contracted: tuple = ()  # ((name, lo, hi), …) free contracted column dims

    def with_rows(self, rows) -> "Band":
        return replace(self, rows=tuple(tuple(r) for r in rows))


@dataclass(frozen=True)
class Ctx:
    """Differentiation context: index-set sizes, array shapes, parameters."""

    index_sets: dict
    shapes: dict
    params: frozenset

    def is_array(self, name) -> bool:
        return name in self.shapes


def sorted_sites(e, v: str) -> list:
    """Distinct sites of ``v`` in ``e`` (bare or ``index(v, …)``), sorted by
    canonical key."""
    found: dict = {}
    seen: set = set()
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            if x == v:
                s = Site(x)
                found[s.key] = s
            continue
        if not isinstance(x, Node) or x in seen or v not in free_names(x):
            continue
        seen.add(x)
        if x.op == "index" and x.args[0] == v:
            s = Site(x)
            found[s.key] = s
            continue
        stack.extend(iter_children(x))
    return [found[k] for k in sorted(found)]


def bands(rhs, v: str, ctx: Ctx, shape_u=()) -> list:
    """All bands of ∂rhs/∂v for an equation whose variable has ``shape_u``."""
    out: list = []
    if not shape_u:
        for s in sorted_sites(rhs, v):
            coef = simp(dscalar(rhs, s))
            if is_zero(coef):
                continue
            out.append(Band((), (), tuple(s.cidx), coef))
        return out
    _array(out, rhs, v, ctx, tuple(shape_u), (1,))
    return out


def _names(shape_u) -> list:
    return [f"_r{k + 1}" for k in range(len(shape_u))]


def _scalar_bands(out, e, v, rows, ridx, scale) -> None:
    for rows2, body in clip_regions(e, ridx, rows):
        for s in sorted_sites(body, v):
            coef = simp(mul(dscalar(body, s), *scale))
            if is_zero(coef):
                continue
            out.append(Band(tuple(tuple(r) for r in rows2), tuple(ridx), tuple(s.cidx), coef))


def _array(out, e, v, ctx, shape_u, scale) -> None:
    if isinstance(e, str):
        if e == v:
            same_rank(e, len(shape_u), ctx)
            names = _names(shape_u)
            out.append(Band(tuple((1, n) for n in shape_u), tuple(names),
                            tuple(names), mul(*scale)))
        return
    if not isinstance(e, Node):
        return
    o = e.op
    if o == "+":
        for x in e.args:
            _array(out, x, v, ctx, shape_u, scale)
    elif o == "-":
        # Unary minus negates; n-ary minus is a0 - a1 - a2 - ... (the
        # reference drops the sign of a unary minus here, and every operand
        # past the second: both silently wrong).
        if len(e.args) == 1:
            _array(out, e.args[0], v, ctx, shape_u, scale + (-1,))
        else:
            _array(out, e.args[0], v, ctx, shape_u, scale)
            for x in e.args[1:]:
                _array(out, x, v, ctx, shape_u, scale + (-1,))
    elif o == "neg":
        _array(out, e.args[0], v, ctx, shape_u, scale + (-1,))
    elif o == "*":
        arr = [x for x in e.args if is_array_expr(x, ctx)]
        sc = tuple(x for x in e.args if not is_array_expr(x, ctx))
        if len(arr) != 1:
            raise JacError("unsupported_construct",
                           f"elementwise product of {len(arr)} array-valued factors at "
                           "array level; wrap it in an aggregate")
        if any(v in free_names(x) for x in sc):
            raise JacError("unsupported_construct",
                           f"a scalar factor depends on `{v}` in an array-level product")
        _array(out, arr[0], v, ctx, shape_u, scale + sc)
    elif o == "/":
        if is_array_expr(e.args[1], ctx):
            raise JacError("unsupported_construct", "array-valued divisor at array level")
        _array(out, e.args[0], v, ctx, shape_u, scale + (op("/", 1, e.args[1]),))
    elif o == "makearray":
        _makearray(out, e, v, ctx, scale)
    elif o == AGG:
        _aggregate(out, e, v, ctx, shape_u, scale)
    elif o == "index":
        names = _names(shape_u)
        _scalar_bands(out, e, v, [(1, n) for n in shape_u], names, scale)
    elif is_array_expr(e, ctx):
        if o in ("broadcast", "reshape", "transpose", "concat", "arrayop"):
            raise JacError("unsupported_construct", f"`{o}` operands have no band form")
        # Generic elementwise op over whole arrays: push the index inward.
        names = _names(shape_u)
        body = push_index(e, list(names), ctx)
        agg = node(AGG, (), body, output_idx=list(names),
                   ranges={n: [1, shape_u[k]] for k, n in enumerate(names)})
        _array(out, agg, v, ctx, shape_u, scale)
    else:
        names = _names(shape_u)
        _scalar_bands(out, e, v, [(1, n) for n in shape_u], names, scale)


def aggregate_box(e: Node, ctx, shape) -> tuple:
    """``(output indices, their row ranges, ranges)`` of an array-level
    aggregate over an array of ``shape``, or the refusal both array walks
    (this calculus and the RHS lowering) give for it: one construct, one
    error code."""
    output_idx = e.attr("output_idx") or ()
    if any(not isinstance(x, str) for x in output_idx):
        raise JacError("unsupported_construct", "singleton `1` output_idx entries have no band form")
    oidx = list(output_idx)
    if e.attr("filter") is not None:
        raise JacError("underivable_operator",
                       "filtered aggregates are not differentiated (the filter gate would be dropped)")
    if e.attr("join") or e.attr("key") is not None or e.attr("arg"):
        raise JacError("underivable_operator",
                       "relational joins, keyed and argmin/argmax aggregates are not differentiated")
    semiring = e.attr("semiring")
    if (e.attr("reduce") not in (None, "+")) or semiring not in (None, "sum_product"):
        raise JacError("underivable_operator",
                       f"reduce={e.attr('reduce') or semiring!r}: non-`+` semiring reductions have no bands")
    ranges = dict(e.attr("ranges") or ())
    rows = []
    for k, n in enumerate(oidx):
        if n in ranges:
            rows.append(range_of(ranges[n], ctx.index_sets))
        elif k < len(shape):
            rows.append((1, shape[k]))
        else:
            raise JacError("unsupported_construct", f"output index `{n}` has no range")
    return oidx, rows, ranges


def _aggregate(out, e: Node, v, ctx, shape_u, scale) -> None:
    oidx, rows, ranges = aggregate_box(e, ctx, shape_u)
    cnames = sorted(n for n in ranges if n not in oidx)
    crange = tuple((n, *range_of(ranges[n], ctx.index_sets)) for n in cnames)
    cset = frozenset(cnames)
    for rows2, body in clip_regions(e.body, oidx, rows):
        rows2 = tuple(tuple(r) for r in rows2)
        for s in sorted_sites(body, v):
            d = dscalar(body, s)
            if isinstance(s.expr, str) and ctx.is_array(v):
                raise JacError("unsupported_construct",
                               f"whole-array reference to `{v}` inside an aggregate body")
            cidx = tuple(s.cidx)
            if not crange:
                coef = simp(mul(d, *scale))
                if not is_zero(coef):
                    out.append(Band(rows2, tuple(oidx), cidx, coef))
            elif not any(free_names(c) & cset for c in cidx):
                # Column independent of the contraction: one band whose
                # coefficient is the scalar ``reduce: "+"`` of the derivative.
                red = node(AGG, (), d, output_idx=[], reduce="+",
                           ranges={n: [lo, hi] for n, lo, hi in crange})
                coef = simp(mul(red, *scale))
                if not is_zero(coef):
                    out.append(Band(rows2, tuple(oidx), cidx, coef))
            else:
                coef = simp(mul(d, *scale))
                if not is_zero(coef):
                    out.append(Band(rows2, tuple(oidx), cidx, coef, crange))


def _makearray(out, e: Node, v, ctx, scale) -> None:
    for region, val in zip(e.attr("regions") or (), e.values or ()):
        rows = [(region_bound(r[0]), region_bound(r[1])) for r in region]
        if any(hi < lo for lo, hi in rows):
            continue
        nonsing = [k for k, (lo, hi) in enumerate(rows) if hi > lo]
        if is_array_expr(val, ctx):
            sub: list = []
            fullrank = (isinstance(val, Node) and val.op == AGG
                        and len(val.attr("output_idx") or ()) == len(rows))
            sub_shape = tuple(hi - lo + 1 for lo, hi in rows) if fullrank else \
                tuple(rows[k][1] - rows[k][0] + 1 for k in nonsing)
            _array(sub, val, v, ctx, sub_shape, scale)
            if isinstance(val, Node) and val.op == AGG:
                vr = dict(val.attr("ranges") or ())
                origins = [range_of(vr[n], ctx.index_sets)[0] if n in vr else 1
                           for n in (val.attr("output_idx") or ())]
            else:
                origins = [1] * len(nonsing)
            for b in sub:
                ridx, rows2, subst = place_subregion(rows, len(b.ridx) == len(rows), origins,
                                                     b.rows, b.ridx)
                coef = substitute(b.coef, subst) if subst else b.coef
                cidx = tuple(substitute(c, subst) for c in b.cidx) if subst else b.cidx
                out.append(Band(tuple(rows2), tuple(ridx), cidx, coef, b.contracted))
        else:
            _scalar_bands(out, val, v, rows, [lo for lo, _ in rows], scale)


def place_subregion(rows, full: bool, origins, sub_rows, sub_idx) -> tuple:
    """Place a sub-array's region (rows ``sub_rows``, indices ``sub_idx``,
    origin ``origins``) into a ``makearray`` region ``rows``: singleton
    dimensions pin (unless ``full``), the others shift. Returns (row
    indices, row ranges, substitution of shifted index names)."""
    ridx, rows2, subst = [], [], {}
    kk = 0
    for lo, hi in rows:
        if full or hi > lo:
            r = sub_idx[kk]
            rlo, rhi = sub_rows[kk]
            shift = lo - origins[kk]
            kk += 1
            if isinstance(r, str):
                ridx.append(r)
                if shift:
                    subst[r] = add(r, -shift)
                rows2.append((rlo + shift, rhi + shift))
            else:
                ridx.append(r + shift)
                rows2.append((r + shift, r + shift))
        else:
            ridx.append(lo)
            rows2.append((lo, lo))
    return ridx, rows2, subst


def push_index(e, idx: list, ctx: Ctx):
    if isinstance(e, str):
        if not ctx.is_array(e):
            return e
        same_rank(e, len(idx), ctx)
        return node("index", [e, *idx])
    if isinstance(e, Node):
        if e.op in (AGG, "makearray", "index"):
            raise JacError("unsupported_construct",
                           f"cannot push an index into `{e.op}` nested under an elementwise op")
        return map_children(e, lambda x: push_index(x, idx, ctx))
    return e


def same_rank(name: str, rank: int, ctx: Ctx) -> None:
    """A bare array operand must have the rank of the array it is combined
    with; bare-axis broadcasting (aligning axes by index-set name, esm-spec
    §4.7) is not expressed by the calculus, and a silent positional read
    would be wrong."""
    have = len(ctx.shapes.get(name, ()))
    if have != rank:
        raise JacError("unsupported_construct",
                       f"bare array `{name}` (rank {have}) is broadcast against a rank-{rank} array; "
                       "bare-axis broadcasting is not compiled (index it explicitly in an faq)")


def normalize_band(b: Band) -> Band:
    """Pin free row indices (and contractions) whose range is one value."""
    subst, ridx = {}, []
    for k, r in enumerate(b.ridx):
        lo, hi = b.rows[k]
        if isinstance(r, str) and lo == hi:
            subst[r] = lo
            ridx.append(lo)
        else:
            ridx.append(r)
    contracted = []
    for n, lo, hi in b.contracted:
        if lo == hi:
            subst[n] = lo
        else:
            contracted.append((n, lo, hi))
    if not subst:
        return b
    return Band(b.rows, tuple(ridx),
                tuple(canon_lits(simplify(substitute(c, subst))) for c in b.cidx),
                simp(substitute(b.coef, subst)), tuple(contracted))
