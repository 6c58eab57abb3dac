"""Coefficient simplification, exactly as the reference applies it.

Byte parity with the reference goldens pins the *reference's* algebra, so
this module reproduces the Julia format library's ``simplify`` (constant
folding of all-literal nodes; strip literal 0/1 identities, order-preserving;
``x^0``, ``x^1``, ``0^x``, ``1^x``, ``x-0``, ``x/1``, ``0.0/x``) rather than
``earthsci_ast.simplify`` (which reorders and combines constants).

Literal kinds matter: folds of all-integer inputs give integers, anything
mixed gives floats, and the identity rules return the float ``0.0``/``1.0``
the reference returns. :func:`canon_lits` turns integral floats back into
integers at the end (the wire-canonical form), as the reference does.

:func:`simplify_branches` is the ``ifelse``-aware pass (literal conditions,
equal branches, same-condition pruning along a path). Because nodes are
interned (``expr.py``), "structurally equal" is ``is`` here.
"""
from __future__ import annotations

import math
from typing import Any

from ..model.evaluate import Decline as _Decline, ev as _ev
from ..model.expr import AGG, Node, is_lit, map_children, node, with_args

__all__ = ["simplify", "simplify_branches", "canon_lits", "simp", "fold_literal"]


# Ops whose all-literal form is not a foldable scalar (arrays, references).
_NO_FOLD = {"const", "makearray", "index", "apply_expression_template", "fn",
            "enum", "Pre", "D", "grad", "div", "laplacian", "integral",
            "table_lookup", "reshape", "transpose", "concat", "broadcast"}


def fold_literal(e: Node):
    """Fold an all-literal node the way the reference's ``simplify`` does:
    an integer when every input is an integer and the value is integral,
    else a float; ``None`` when it declines."""
    if e.op in _NO_FOLD or not all(is_lit(a) for a in e.args):
        return None
    if e.op == AGG and e.body is None:
        return None
    try:
        v = _ev(e, {})
    except _Decline:
        return None
    if not math.isfinite(v):
        return None
    if all(isinstance(a, int) for a in e.args) and v == math.trunc(v) \
            and abs(v) < 2.0 ** 63:
        return int(v)
    return float(v)


def _is_val(x, v: float) -> bool:
    return is_lit(x) and float(x) == v


def _without_unit(e: Node, args: tuple, unit: float):
    """``e`` (a sum or product) without operands equal to its ``unit``
    (0 for ``+``, 1 for ``*``): the unit itself when none is left, the
    operand when one is, ``e`` unchanged when nothing was dropped."""
    keep = [a for a in args if not _is_val(a, unit)]
    if not keep:
        return unit
    if len(keep) == 1:
        return keep[0]
    return e if len(keep) == len(args) else with_args(e, keep)


def simplify(e):
    """The reference's algebraic ``simplify`` (see module docstring)."""
    if not isinstance(e, Node):
        return e
    memo: dict[Node, Any] = {}
    return _simplify(e, memo)


def _simplify(e, memo):
    if not isinstance(e, Node):
        return e
    r = memo.get(e)
    if r is not None:
        return r
    r = _simplify_node(map_children(e, lambda c: _simplify(c, memo)))
    memo[e] = r
    return r


def _simplify_node(e: Node):
    args = e.args
    f = fold_literal(e)
    if f is not None:
        return f
    o = e.op
    if o == "+":
        return _without_unit(e, args, 0.0)
    if o == "*":
        if any(_is_val(a, 0.0) for a in args):
            return 0.0
        return _without_unit(e, args, 1.0)
    if o == "^" and len(args) == 2:
        b, x = args
        if _is_val(x, 0.0):
            return 1.0
        if _is_val(x, 1.0):
            return b
        if _is_val(b, 0.0) and is_lit(x) and float(x) > 0.0:
            return 0.0
        if _is_val(b, 1.0):
            return 1.0
        return e
    if o == "-" and len(args) == 2:
        return args[0] if _is_val(args[1], 0.0) else e
    if o == "/" and len(args) == 2:
        if _is_val(args[1], 1.0):
            return args[0]
        if isinstance(args[0], float) and args[0] == 0.0:
            return 0.0
        return e
    return e


# ── branch-aware pass ──────────────────────────────────────────────────────

def simplify_branches(e):
    """``ifelse`` simplification: literal conditions, equal branches, and
    same-condition pruning along a path. Exact and point-independent."""
    if not isinstance(e, Node):
        return e
    seen: set = set()      # conditions with a surviving ifelse already built
    memo: dict = {}
    return _sbr(e, seen, memo)


def _sbr(e, seen, memo):
    if not isinstance(e, Node):
        return e
    r = memo.get(e)
    if r is not None:
        return r
    e2 = map_children(e, lambda c: _sbr(c, seen, memo))
    r = e2
    if e2.op == "ifelse" and len(e2.args) == 3:
        c, a, b = e2.args
        if is_lit(c):
            r = b if c == 0 else a
        else:
            if c in seen:
                a2 = _assume(a, c, True, {})
                b2 = _assume(b, c, False, {})
            else:
                a2, b2 = a, b
            if a2 is b2:
                r = a2
            else:
                seen.add(c)
                r = e2 if (a2 is a and b2 is b) else node("ifelse", (c, a2, b2))
    memo[e] = r
    return r


def _assume(e, c, val: bool, memo: dict):
    """``e`` with every ``ifelse`` on condition ``c`` collapsed to ``val``."""
    if not isinstance(e, Node):
        return e
    r = memo.get(e)
    if r is not None:
        return r
    if e.op == "ifelse" and len(e.args) == 3 and e.args[0] is c:
        r = _assume(e.args[1 if val else 2], c, val, memo)
    else:
        r = map_children(e, lambda x: _assume(x, c, val, memo))
    memo[e] = r
    return r


def canon_lits(e):
    """Integral floats become integer literals (wire-canonical form)."""
    if isinstance(e, float):
        if math.isfinite(e) and e.is_integer() and -2.0 ** 63 <= e < 2.0 ** 63:
            return int(e)
        return e
    if not isinstance(e, Node):
        return e
    memo: dict[Node, Any] = {}

    def go(x):
        if isinstance(x, float):
            return canon_lits(x)
        if not isinstance(x, Node):
            return x
        r = memo.get(x)
        if r is None:
            r = map_children(x, go)
            memo[x] = r
        return r

    return go(e)


def simp(e):
    """The coefficient simplifier of the band calculus: algebra, branches,
    algebra again, then wire-canonical literals."""
    return canon_lits(simplify(simplify_branches(simplify(e))))
