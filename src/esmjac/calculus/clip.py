"""Static region clipping and band re-merging.

Region reads lower to membership ``ifelse`` guards whose conditions are
affine in one row index with literal bounds. Splitting the row range at the
guards' breakpoints makes every guard uniformly true or false on each piece,
so the bands come out exact per sub-range: no membership guards in
coefficients, no branch-union slack in the pattern (spec §2, "region
exactness"). Anything not decidable this way is left in place (the result
degrades to the branch union, never to a wrong answer).

:func:`merge_bands` re-coalesces bands that clipping split needlessly
(same row names, columns, coefficient and contraction; adjacent along one
dimension), preserving first-occurrence order.
"""
from __future__ import annotations

import itertools

from ..model.expr import Node, free_names, iter_children, map_children, op

__all__ = ["clip_regions", "merge_bands"]

_CMP = ("<", "<=", ">", ">=")


def _affine(e, name: str):
    """``e`` as (α, β) with e = α·name + β over integers, or ``None``."""
    if isinstance(e, str):
        return (1, 0) if e == name else None
    if isinstance(e, bool):
        return None
    if isinstance(e, int):
        return (0, e)
    if isinstance(e, float):
        return (0, int(e)) if e.is_integer() else None
    if not isinstance(e, Node):
        return None
    a = e.args
    if e.op == "+":
        al = be = 0
        for x in a:
            t = _affine(x, name)
            if t is None:
                return None
            al += t[0]
            be += t[1]
        return al, be
    if e.op == "-" and len(a) == 1:
        t = _affine(a[0], name)
        return None if t is None else (-t[0], -t[1])
    if e.op == "-" and len(a) >= 2:
        t = _affine(a[0], name)
        if t is None:
            return None
        al, be = t
        for x in a[1:]:
            u = _affine(x, name)
            if u is None:
                return None
            al, be = al - u[0], be - u[1]
        return al, be
    if e.op == "*":
        al, be = 0, 1
        for x in a:
            t = _affine(x, name)
            if t is None:
                return None
            if t[0] == 0:
                al *= t[1]
                be *= t[1]
            elif al == 0 and be != 0:
                al, be = be * t[0], be * t[1]
            else:
                return None
        return al, be
    return None


def _sole_name(e, names) -> str | None:
    hit = free_names(e) & names
    return next(iter(hit)) if len(hit) == 1 else None


def _truth(o: str, al: int, be: int, i: int) -> bool:
    v = al * i + be
    return v < 0 if o == "<" else v <= 0 if o == "<=" else v > 0 if o == ">" else v >= 0


def _breakpoints(e, names, bp: dict, seen: set) -> None:
    if not isinstance(e, Node) or e in seen:
        return
    seen.add(e)
    if e.op in _CMP and len(e.args) == 2:
        n = _sole_name(e, names)
        if n is not None:
            t = _affine(op("-", e.args[0], e.args[1]), n)
            if t is not None and t[0] != 0:
                q = (-t[1]) // t[0]              # floor of the rational root
                for c in (q, q + 1):
                    if _truth(e.op, t[0], t[1], c - 1) != _truth(e.op, t[0], t[1], c):
                        bp.setdefault(n, set()).add(c)
    for c in iter_children(e):
        _breakpoints(c, names, bp, seen)


def _uniform(cond, env: dict):
    """Truth of ``cond`` over the box ``env`` (name → (lo, hi)): True/False
    when uniform, ``None`` when not statically decidable."""
    if not isinstance(cond, Node):
        return None
    if cond.op in _CMP and len(cond.args) == 2:
        n = _sole_name(cond, frozenset(env))
        if n is None:
            return None
        t = _affine(op("-", cond.args[0], cond.args[1]), n)
        if t is None:
            return None
        lo, hi = env[n]
        a, b = t[0] * lo + t[1], t[0] * hi + t[1]
        fa, fb = _truth(cond.op, 1, a, 0), _truth(cond.op, 1, b, 0)
        return fa if fa == fb else None
    if cond.op in ("and", "or"):
        # One operand equal to the short-circuit value decides; otherwise
        # undecided if any operand is, else the identity (all true / false).
        short = cond.op == "or"
        und = False
        for x in cond.args:
            u = _uniform(x, env)
            if u is short:
                return short
            und |= u is None
        return None if und else not short
    if cond.op == "not" and len(cond.args) == 1:
        u = _uniform(cond.args[0], env)
        return None if u is None else not u
    return None


def _decide(e, env: dict, memo: dict):
    if not isinstance(e, Node):
        return e
    r = memo.get(e)
    if r is not None:
        return r
    r = None
    if e.op == "ifelse" and len(e.args) == 3:
        u = _uniform(e.args[0], env)
        if u is True:
            r = _decide(e.args[1], env, memo)
        elif u is False:
            r = _decide(e.args[2], env, memo)
    elif e.op in _CMP:
        u = _uniform(e, env)
        if u is not None:
            r = 1 if u else 0
    if r is None:
        r = map_children(e, lambda x: _decide(x, env, memo))
    memo[e] = r
    return r


def clip_regions(body, ridx, rows):
    """Split ``rows`` at the breakpoints of decidable guards in ``body`` and
    collapse the guards on each piece; returns ``[(rows′, body′), …]`` in
    ascending order per dimension."""
    rows = [tuple(r) for r in rows]
    names = frozenset(r for r in ridx if isinstance(r, str))
    if not names:
        return [(rows, body)]
    bp: dict = {}
    _breakpoints(body, names, bp, set())
    if not bp:
        return [(rows, body)]
    dims, dimname = [], []
    for k, r in enumerate(ridx):
        lo, hi = rows[k]
        if isinstance(r, str) and r in bp:
            cuts = sorted(c for c in bp[r] if lo < c <= hi)
            ivs, a = [], lo
            for c in cuts:
                ivs.append((a, c - 1))
                a = c
            ivs.append((a, hi))
            dims.append(ivs)
        else:
            dims.append([(lo, hi)])
        dimname.append(r if isinstance(r, str) else None)
    out = []
    for cell in itertools.product(*dims):
        env = {dimname[k]: cell[k] for k in range(len(cell)) if dimname[k] is not None}
        out.append((list(cell), _decide(body, env, {})))
    return out


def merge_bands(bs: list) -> list:
    """Coalesce bands equal in (ridx, cidx, coef, contracted) whose row
    boxes are adjacent along exactly one dimension; order-preserving."""
    if len(bs) < 2:
        return bs
    buckets: dict = {}
    for i, b in enumerate(bs):
        key = (tuple(b.ridx), tuple(_ident(c) for c in b.cidx), _ident(b.coef),
               tuple(b.contracted))
        buckets.setdefault(key, []).append(i)
    out = list(bs)
    alive = [True] * len(out)
    for idxs in buckets.values():
        if len(idxs) < 2:
            continue
        changed = True
        while changed:
            changed = False
            for ai, a in enumerate(idxs):
                if not alive[a]:
                    continue
                for b in idxs[ai + 1:]:
                    if not alive[b]:
                        continue
                    ra, rb = out[a].rows, out[b].rows
                    if len(ra) != len(rb):
                        continue
                    d, ok = -1, True
                    for k in range(len(ra)):
                        if ra[k] == rb[k]:
                            continue
                        if d < 0 and (ra[k][1] + 1 == rb[k][0] or rb[k][1] + 1 == ra[k][0]):
                            d = k
                        else:
                            ok = False
                            break
                    if not ok or d < 0:
                        continue
                    rows = list(ra)
                    rows[d] = (min(ra[d][0], rb[d][0]), max(ra[d][1], rb[d][1]))
                    out[a] = out[a].with_rows(rows)
                    alive[b] = False
                    changed = True
    return [b for b, keep in zip(out, alive) if keep]


def _ident(e):
    # Interned nodes compare by identity; literals by (type, value).
    return e if isinstance(e, Node) else (type(e).__name__, e)
