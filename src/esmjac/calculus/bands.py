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

from dataclasses import dataclass, field, replace

from ..errors import JacError
from ..model.expr import (AGG, Expr, Node, thaw, add, free_names, is_array_expr, is_zero, iter_children, map_children, mul, node, op,
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
    coef: Expr             # scalar coefficient expression
    contracted: tuple = ()  # ((name, lo, hi), …) free contracted column dims

    def with_rows(self, rows) -> "Band":
        return replace(self, rows=tuple(tuple(r) for r in rows))


@dataclass(frozen=True)
class Ctx:
    """Differentiation context: index-set sizes, array shapes, parameters."""

    index_sets: dict
    shapes: dict
    params: frozenset
    #: index-set names per axis of the arrays that declare them (esm-spec
    #: §4.3.4: operands with declared index sets align by name)
    dims: dict = field(default_factory=dict)
    #: index-set names of the array being walked (None: anonymous axes)
    target: tuple | None = None

    def is_array(self, name) -> bool:
        return name in self.shapes

    def walking(self, u: str) -> "Ctx":
        """This context while walking the equation of ``u``."""
        return replace(self, target=self.dims.get(u))

    def sub(self, keep) -> "Ctx":
        """This context for a sub-array made of the target's axes ``keep``."""
        t = self.target
        return replace(self, target=None if t is None else tuple(t[k] for k in keep))


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
            names = _names(shape_u)
            out.append(Band(tuple((1, n) for n in shape_u), tuple(names),
                            tuple(aligned(e, names, ctx)), mul(*scale)))
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
    elif o == "broadcast":
        _array(out, unbroadcast(e), v, ctx, shape_u, scale)
    elif o == "*" and sum(is_array_expr(x, ctx) for x in e.args) != 1:
        _elementwise(out, e, v, ctx, shape_u, scale)
    elif o == "*":
        arr = [x for x in e.args if is_array_expr(x, ctx)]
        sc = tuple(x for x in e.args if not is_array_expr(x, ctx))
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
        if o in ("reshape", "transpose", "concat", "arrayop"):
            raise JacError("unsupported_construct", f"`{o}` operands have no band form")
        _elementwise(out, e, v, ctx, shape_u, scale)
    else:
        names = _names(shape_u)
        _scalar_bands(out, e, v, [(1, n) for n in shape_u], names, scale)


def _elementwise(out, e, v, ctx, shape_u, scale) -> None:
    """A generic elementwise op over whole arrays: push the index inward."""
    names = _names(shape_u)
    body = push_index(e, list(names), ctx)
    agg = node(AGG, (), body, output_idx=list(names),
               ranges={n: [1, shape_u[k]] for k, n in enumerate(names)})
    _array(out, agg, v, ctx, shape_u, scale)


def unbroadcast(e: Node):
    """``broadcast(fn, args)`` is ``fn(args)`` applied elementwise
    (esm-spec §4.3.4): the array walks already broadcast elementwise ops."""
    fn = e.attr("fn")
    if not isinstance(fn, str) or not fn:
        raise JacError("invalid_document", "a `broadcast` node without an `fn`")
    return node(fn, e.args)


def _axis_sets(e: Node) -> list:
    """The index set each output axis of an aggregate ranges over (None
    where the range is literal: an anonymous axis)."""
    ranges = dict(e.attr("ranges") or ())
    out = []
    for n in e.attr("output_idx") or ():
        r = ranges.get(n)
        d = dict(r) if isinstance(r, tuple) and r and isinstance(r[0], tuple) else {}
        out.append(d.get("from") if set(d) == {"from"} else None)
    return out


def aligned(name_or_sets, names: list, ctx: Ctx, rank: int | None = None):
    """The target's index names that an operand's axes read, in the
    operand's axis order (esm-spec §4.3.4): by index-set name when the
    operand and the target both declare theirs (an operand over a subset of
    the target's sets replicates along the others, a permuted one reads
    transposed), else positionally at equal rank. Refused otherwise: a
    positional read of a lower-rank operand would be silently wrong."""
    if isinstance(name_or_sets, str):
        sets = ctx.dims.get(name_or_sets)
        rank = len(ctx.shapes.get(name_or_sets, ()))
        what = f"bare array `{name_or_sets}`"
    else:
        sets = name_or_sets
        rank = len(sets) if rank is None else rank
        what = f"a rank-{rank} aggregate"
    tgt = ctx.target
    if (tgt is not None and sets is not None and len(tgt) == len(names) and None not in sets
            and len(set(sets)) == len(sets) and len(set(tgt)) == len(tgt) and set(sets) <= set(tgt)):
        return [names[tgt.index(d)] for d in sets]
    if rank == len(names):
        return list(names)
    raise JacError("unsupported_construct",
                   f"{what} (rank {rank}) is broadcast against a rank-{len(names)} array whose axes "
                   "it cannot be aligned to by index-set name; index it explicitly in an faq")


def _lift(e: Node, ctx: Ctx, shape) -> Node:
    """A lower-rank aggregate broadcast into the target: the same body with
    the target's missing axes added as output indices it does not read."""
    names = _names(shape)
    sets = _axis_sets(e)
    try:
        sub = aligned(sets, names, ctx, len(sets))
    except JacError:
        return e
    oidx = list(e.attr("output_idx"))
    by_target = dict(zip(sub, oidx))
    ranges = dict(e.attr("ranges") or ())
    new_oidx = []
    for k, n in enumerate(names):
        if n in by_target:
            new_oidx.append(by_target[n])
        else:
            fresh = f"_b{k + 1}"
            new_oidx.append(fresh)
            ranges[fresh] = (1, shape[k])
    fields = {k: v for k, v in e.extra if k not in ("output_idx", "ranges")}
    return node(AGG, e.args, e.body, output_idx=new_oidx,
                ranges={k: thaw(r) for k, r in ranges.items()}, **fields)


def aggregate_box(e: Node, ctx, shape, *, absolute: bool = False) -> tuple:
    """``(output indices, their row ranges, ranges, body)`` of an array-level
    aggregate over an array of ``shape``, or the refusal both array walks
    (this calculus and the RHS lowering) give for it: one construct, one
    error code.

    The format's aggregate result is *compact* (earthsci-ast's evaluators,
    esm-spec §4.3.1/§4.3.4): along an output axis whose range is ``[lo, hi]``
    element ``r`` (1-based) is the body at index ``lo + r - 1``; it is placed
    into the target from 1, and an axis of extent 1 broadcasts over the
    target's axis. So a range with the target's extent but origin ``lo > 1``
    shifts the body, a singleton range pins the index and spans the whole
    axis, and any other extent is a shape mismatch (refused, as earthsci-ast
    refuses it). ``absolute=True`` keeps the range's own positions: the
    ``makearray`` walks place an aggregate value themselves (its origin is
    the region's)."""
    output_idx = e.attr("output_idx") or ()
    if any(not isinstance(x, str) for x in output_idx):
        raise JacError("unsupported_construct", "singleton `1` output_idx entries have no band form")
    if not absolute and 0 < len(output_idx) < len(shape):
        e = _lift(e, ctx, shape)
        output_idx = e.attr("output_idx")
    oidx = list(output_idx)
    if e.attr("filter") is not None:
        # Filtered sums arrive as gated sums and small extrema unrolled
        # (model.load); what is left is a large extremum, a join or a key.
        raise JacError("underivable_operator",
                       f"a filtered reduce={e.attr('reduce') or e.attr('semiring') or '+'!r} aggregate "
                       "(running max/min) has no derivative rule here; filtered sums do")
    if e.attr("join") or e.attr("key") is not None or e.attr("arg"):
        raise JacError("underivable_operator",
                       "relational joins, keyed and argmin/argmax aggregates are not differentiated")
    semiring = e.attr("semiring")
    if (e.attr("reduce") not in (None, "+")) or semiring not in (None, "sum_product"):
        raise JacError("underivable_operator",
                       f"reduce={e.attr('reduce') or semiring!r}: non-`+` semiring reductions have no bands")
    ranges = dict(e.attr("ranges") or ())
    rows, subst = [], {}
    for k, n in enumerate(oidx):
        if n in ranges:
            lo, hi = range_of(ranges[n], ctx.index_sets)
            if absolute or len(oidx) != len(shape) or (lo, hi) == (1, shape[k]):
                rows.append((lo, hi))
            elif hi - lo + 1 == shape[k]:
                rows.append((1, shape[k]))
                subst[n] = add(n, lo - 1)
            elif hi == lo:
                rows.append((1, shape[k]))
                subst[n] = lo
            else:
                raise JacError("invalid_document",
                               f"an aggregate's output index `{n}` ranges over [{lo}, {hi}] "
                               f"({hi - lo + 1} elements) for an axis of {shape[k]}; an aggregate's "
                               "result is placed from 1 and only a one-element axis broadcasts "
                               "(place a sub-range with `makearray`)")
        elif k < len(shape):
            rows.append((1, shape[k]))
        else:
            raise JacError("unsupported_construct", f"output index `{n}` has no range")
    body = substitute(e.body, subst) if subst else e.body
    return oidx, rows, ranges, body


def _aggregate(out, e: Node, v, ctx, shape_u, scale, absolute: bool = False) -> None:
    oidx, rows, ranges, body0 = aggregate_box(e, ctx, shape_u, absolute=absolute)
    cnames = sorted(n for n in ranges if n not in oidx)
    crange = tuple((n, *range_of(ranges[n], ctx.index_sets)) for n in cnames)
    cset = frozenset(cnames)
    for rows2, body in clip_regions(body0, oidx, rows):
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
            sctx = ctx.sub(range(len(rows)) if fullrank else nonsing)
            if isinstance(val, Node) and val.op == AGG:
                _aggregate(sub, val, v, sctx, sub_shape, scale, absolute=True)
            else:
                _array(sub, val, v, sctx, sub_shape, scale)
            origins = value_origins(val, ctx, len(nonsing))
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
        return node("index", [e, *aligned(e, idx, ctx)])
    if isinstance(e, Node):
        if e.op == "broadcast":
            return push_index(unbroadcast(e), idx, ctx)
        if e.op == AGG:
            return _agg_at(e, idx, ctx)
        if e.op in ("makearray", "index"):
            raise JacError("unsupported_construct",
                           f"cannot push an index into `{e.op}` nested under an elementwise op")
        return map_children(e, lambda x: push_index(x, idx, ctx))
    return e


def _agg_at(e: Node, idx: list, ctx: Ctx):
    """An aggregate operand of an elementwise op, read at the target's point
    ``idx`` (β-reduction): its output indices bound to the target's aligned
    names. Only a whole-axis map (every output range from 1, nothing
    contracted, no filter or other semiring) reads that simply."""
    oidx = list(e.attr("output_idx") or ())
    ranges = dict(e.attr("ranges") or ())
    plain = (oidx and all(isinstance(n, str) for n in oidx) and set(ranges) <= set(oidx)
             and e.attr("filter") is None and e.attr("reduce") in (None, "+")
             and e.attr("semiring") in (None, "sum_product") and not e.attr("join")
             and e.attr("key") is None and not e.attr("arg")
             and all(range_of(ranges[n], ctx.index_sets)[0] == 1 for n in oidx if n in ranges))
    if not plain:
        raise JacError("unsupported_construct",
                       "cannot push an index into `aggregate` nested under an elementwise op "
                       "(it contracts, filters or starts past 1)")
    sub = aligned(_axis_sets(e), idx, ctx, len(oidx))
    return substitute(e.body, dict(zip(oidx, sub)))


def value_origins(val, ctx: Ctx, axes: int) -> list:
    """Where the indices of a value placed into a sub-region start: an
    aggregate's output ranges' lower bounds (1 for an output index without a
    range), else 1 on each of ``axes`` (shared by the calculus and the RHS
    lowering, so both place a sub-region the same way)."""
    if isinstance(val, Node) and val.op == AGG:
        vr = dict(val.attr("ranges") or ())
        return [range_of(vr[n], ctx.index_sets)[0] if n in vr else 1 for n in (val.attr("output_idx") or ())]
    return [1] * axes


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
