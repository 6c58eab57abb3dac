"""Chain rule through algebraic intermediates: observed inlining, pruning,
and ``index``-of-array-expression β-reduction.

* A scalar observed inlines by substitution; an array observed defined by an
  aggregate inlines at each read by β-reduction (``F[e…]`` → body with the
  output indices bound to ``e…``); a ``makearray`` read lowers to nested
  region-membership ``ifelse`` folded from the first region outward (later
  regions override, esm-spec §4.3.2); a ``const`` table read stays a closed
  ``index(const, …)`` gather.
* Pruning (docs/design.rst §3.3): only observed that can move with a differentiation
  target (transitively), or that a subscript needs at build time, are
  inlined. The target scan is a set intersection per definition.
"""
from __future__ import annotations

from ..errors import JacError
from ..model.expr import (AGG, Expr, Node, thaw, free_names, from_wire, iter_children, map_children, node, op,
                          substitute, walk)
from ..model.evaluate import Decline as _Decline, ev as _ev

__all__ = ["inline_observed", "inlinable_observed", "region_bound", "range_of"]

MAX_INLINE_PASSES = 64


def region_bound(b) -> int:
    """A literal region/range bound (already folded to a closed form)."""
    if isinstance(b, bool):
        raise JacError("unsupported_construct", "boolean region bound")
    if isinstance(b, int):
        return b
    if isinstance(b, float):
        return int(round(b))
    try:
        return int(round(_ev(from_wire(thaw(b)), {})))
    except (_Decline, TypeError, KeyError):
        raise JacError("unsupported_construct", f"region bound {b!r} is not a closed integer expression")


def range_of(r, index_sets: dict) -> tuple[int, int]:
    """(lo, hi) of an aggregate range spec: ``[lo, hi]``, ``[lo, 1, hi]`` or
    ``{"from": set}``."""
    if isinstance(r, tuple) and not hasattr(r, "keys") and r and not isinstance(r[0], tuple):
        if len(r) == 2:
            return region_bound(r[0]), region_bound(r[1])
        if len(r) == 3 and region_bound(r[1]) == 1:
            return region_bound(r[0]), region_bound(r[2])
        raise JacError("unsupported_construct",
                       f"strided aggregate range {list(r)} has no band form")
    d = dict(r) if isinstance(r, tuple) else r
    if isinstance(d, dict) and "from" in d:
        name = d["from"]
        if "of" in d or name not in index_sets:
            raise JacError("unsupported_construct",
                           f"range over index set `{name}` that is not a sized interval")
        return 1, index_sets[name]
    raise JacError("unsupported_construct", f"unsupported range spec {r!r}")


def _makearray_read(ma: Node, idx: list, obs: dict):
    result: Expr = 0
    regions = ma.attr("regions") or ()
    for region, val in zip(regions, ma.values or ()):
        conds, sub_idx = [], []
        for k, r in enumerate(region):
            lo, hi = region_bound(r[0]), region_bound(r[1])
            conds.append(op(">=", idx[k], lo))
            conds.append(op("<=", idx[k], hi))
            if hi > lo:
                sub_idx.append(idx[k])
        if isinstance(val, Node) and val.op == AGG:
            oidx = [str(x) for x in (val.attr("output_idx") or ())]
            if len(oidx) == len(idx):
                tgt = idx
            elif len(oidx) == len(sub_idx):
                tgt = sub_idx
            else:
                raise JacError(
                    "inline_error",
                    f"makearray value rank {len(oidx)} matches neither the region "
                    f"rank {len(idx)} nor its free rank {len(sub_idx)}")
            v = substitute(val.body, dict(zip(oidx, tgt)))
        elif isinstance(val, str) or (isinstance(val, Node) and val.op in ("makearray", "index")):
            v = _inline_once(node("index", [val, *sub_idx]), obs)
        else:
            v = val                      # scalar broadcast over the region
        cond = conds[0] if len(conds) == 1 else node("and", conds)
        result = op("ifelse", cond, v, result)
    return result


def _beta(defn: Node, index_args, obs: dict):
    oidx = [str(x) for x in (defn.attr("output_idx") or ())]
    if len(oidx) != len(index_args):
        raise JacError("inline_error",
                       f"index arity {len(index_args)} does not match the rank {len(oidx)} of an aggregate")
    return substitute(defn.body, {n: _inline_once(x, obs) for n, x in zip(oidx, index_args)})


def _inline_once(e, obs: dict):
    if isinstance(e, str):
        return obs.get(e, e)
    if not isinstance(e, Node):
        return e
    if e.op == "index":
        head, rest = e.args[0], e.args[1:]
        if isinstance(head, Node) and head.op == "makearray":
            return _makearray_read(head, [_inline_once(x, obs) for x in rest], obs)
        if isinstance(head, Node) and head.op == AGG:
            return _inline_once(_beta(head, rest, obs), obs)
        if isinstance(head, str) and head in obs:
            d = obs[head]
            if isinstance(d, Node) and d.op == AGG:
                return _beta(d, rest, obs)
            if isinstance(d, Node) and d.op == "makearray":
                return _makearray_read(d, [_inline_once(x, obs) for x in rest], obs)
            if isinstance(d, Node) and d.op == "const":
                return node("index", [d, *(_inline_once(x, obs) for x in rest)])
            raise JacError(
                "inline_error",
                f"index into observed `{head}` whose definition is not an aggregate, makearray or const")
    return map_children(e, lambda c: _inline_once(c, obs))


def _needs_inline(e) -> bool:
    if not isinstance(e, Node):
        return False
    c = e.cache()
    r = c.get("needs_inline")
    if r is None:
        if e.op == "index" and isinstance(e.args[0], Node):
            r = True
        else:
                    r = any(_needs_inline(x) for x in iter_children(e))
        c["needs_inline"] = r
    return r


def inline_observed(e, obs: dict):
    """Inline the observed ``obs`` (name → definition) into ``e`` and
    β-reduce array reads, to a fixpoint. Cyclic definitions are refused."""
    if not obs and not _needs_inline(e):
        return e
    names = frozenset(obs)
    for _ in range(MAX_INLINE_PASSES):
        if not (free_names(e) & names) and not _needs_inline(e):
            return e
        e2 = _inline_once(e, obs)
        if e2 is e:         # interned: identity is structural equality
            return e
        e = e2
    raise JacError("inline_error",
                   f"no fixpoint after {MAX_INLINE_PASSES} inlining passes (cyclic observed definitions?)")


def _index_arg_names(e, acc: set) -> None:
    """Names occurring under a subscript (``args[1:]`` of an ``index``)."""
    if not isinstance(e, Node):
        return
    if e.op == "index":
        _index_arg_names(e.args[0], acc)
        for x in e.args[1:]:
            acc |= free_names(x)
        return
    for c in iter_children(e):
        _index_arg_names(c, acc)


def inlinable_observed(obs: dict, rhss: list, targets: frozenset) -> dict:
    """The observed the calculus must inline for these targets: those that
    can move with a target (closure over readers, seeded by intersecting
    each definition's names with the target set), plus those a subscript
    needs evaluated at build time (fixpoint over the kept bodies)."""
    fvs = {n: free_names(e) for n, e in obs.items()}
    readers: dict = {}
    work = []
    for n, fv in fvs.items():
        if fv & targets or _opaque(obs[n]):
            work.append(n)
        for m in fv:
            if m in obs:
                readers.setdefault(m, []).append(n)
    keep = set(work)
    while work:
        for r in readers.get(work.pop(), ()):
            if r not in keep:
                keep.add(r)
                work.append(r)
    while True:
        acc: set = set()
        for e in rhss:
            _index_arg_names(e, acc)
        for n in keep:
            _index_arg_names(obs[n], acc)
        fresh = [n for n in acc if n in obs and n not in keep]
        if not fresh:
            break
        keep.update(fresh)
    return {n: obs[n] for n in obs if n in keep}


def _opaque(e) -> bool:
    # A surviving template reference hides its body's names: treat as
    # target-dependent so it is inlined (and rejected loudly), never pruned.
    return any(isinstance(x, Node) and x.op == "apply_expression_template" for x in walk(e))
