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

from ..expr import AGG, Node, is_lit, map_children, node, with_args

__all__ = ["simplify", "simplify_branches", "canon_lits", "simp", "fold_literal"]


class _Decline(Exception):
    """The literal folder cannot evaluate this node (reference: decline)."""


def _num(x) -> float:
    if not is_lit(x):
        raise _Decline
    return float(x)


def _ev(e, env: dict) -> float:
    """Evaluate a closed scalar tree to a float, as the reference evaluator
    would; raise :class:`_Decline` for anything unbound or out of domain."""
    if isinstance(e, str):
        if e in env:
            return env[e]
        raise _Decline
    if is_lit(e):
        return float(e)
    if not isinstance(e, Node):
        raise _Decline
    o = e.op
    if o == AGG:
        return _ev_aggregate(e, env)
    a = [_ev(x, env) for x in e.args] if o != "ifelse" else None
    try:
        if o == "+":
            return math.fsum(a) if len(a) > 2 else sum(a, 0.0)
        if o == "*":
            r = 1.0
            for x in a:
                r *= x
            return r
        if o == "-":
            return -a[0] if len(a) == 1 else a[0] - a[1]
        if o == "neg":
            return -a[0]
        if o == "/":
            if a[1] == 0.0:
                raise _Decline
            return a[0] / a[1]
        if o in ("^", "pow"):
            r = a[0] ** a[1]
            if isinstance(r, complex):
                raise _Decline
            return float(r)
        if o == "ifelse":
            c = _ev(e.args[0], env)
            return _ev(e.args[1], env) if c != 0.0 else _ev(e.args[2], env)
        if o in _CMP:
            return 1.0 if _CMP[o](a[0], a[1]) else 0.0
        if o == "and":
            return 1.0 if all(x != 0.0 for x in a) else 0.0
        if o == "or":
            return 1.0 if any(x != 0.0 for x in a) else 0.0
        if o == "not":
            return 0.0 if a[0] != 0.0 else 1.0
        if o == "max":
            return max(a)
        if o == "min":
            return min(a)
        if o in ("pi", "π") and not a:
            return math.pi
        if o == "e" and not a:
            return math.e
        if o == "atan" and len(a) == 2 or o == "atan2":
            return math.atan2(a[0], a[1])
        f = _FUN1.get(o)
        if f is not None and len(a) == 1:
            return float(f(a[0]))
    except (ValueError, OverflowError, ZeroDivisionError):
        raise _Decline
    raise _Decline


def _ev_aggregate(e: Node, env: dict) -> float:
    # A closed scalar ``reduce: "+"`` aggregate over literal ranges.
    if e.attr("output_idx") or e.attr("filter") is not None:
        raise _Decline
    if e.attr("reduce") not in (None, "+") or e.attr("semiring") is not None:
        raise _Decline
    ranges = e.attr("ranges") or ()
    names, spans = [], []
    for name, r in ranges:
        if not (isinstance(r, tuple) and len(r) == 2 and all(isinstance(x, int) for x in r)):
            raise _Decline
        names.append(name)
        spans.append(range(r[0], r[1] + 1))
    import itertools
    total = 0.0
    for pt in itertools.product(*spans):
        env2 = dict(env)
        env2.update(zip(names, (float(x) for x in pt)))
        total += _ev(e.body, env2)
    return total


def _sign(x):
    return (x > 0) - (x < 0)


_FUN1 = {
    "exp": math.exp, "log": math.log, "log10": math.log10, "sqrt": math.sqrt,
    "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin,
    "acos": math.acos, "atan": math.atan, "sinh": math.sinh, "cosh": math.cosh,
    "tanh": math.tanh, "asinh": math.asinh, "acosh": math.acosh,
    "atanh": math.atanh, "abs": abs, "sign": _sign, "floor": math.floor,
    "ceil": math.ceil,
}
_CMP = {
    "<": lambda x, y: x < y, "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y, ">=": lambda x, y: x >= y,
    "==": lambda x, y: x == y, "!=": lambda x, y: x != y,
}
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


def simplify(e):
    """The reference's algebraic ``simplify`` (see module docstring)."""
    if not isinstance(e, Node):
        return e
    memo = {}
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
        nz = [a for a in args if not _is_val(a, 0.0)]
        if not nz:
            return 0.0
        if len(nz) == 1:
            return nz[0]
        return e if len(nz) == len(args) else _with_args(e, nz)
    if o == "*":
        if any(_is_val(a, 0.0) for a in args):
            return 0.0
        no = [a for a in args if not _is_val(a, 1.0)]
        if not no:
            return 1.0
        if len(no) == 1:
            return no[0]
        return e if len(no) == len(args) else _with_args(e, no)
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


def _with_args(e: Node, args) -> Node:
    return with_args(e, args)


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
    memo = {}

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
