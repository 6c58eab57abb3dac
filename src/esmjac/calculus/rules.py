"""Scalar derivative rules: one rule per evaluable-core operator.

This is the derivative table of the ESM Jacobian spec §3 (smooth core,
non-smooth policy, zero rules, closed functions). Invariants:

* Sparsity is structural: a subtree in which the site does not occur
  differentiates to the literal ``0`` without descent; branches of
  ``ifelse``/``min``/``max`` are unioned, never probed numerically.
* Ties in ``max``/``min`` resolve to the earlier argument (``>=``/``<=``);
  ``abs`` has subgradient -1/+1 split at ``x < 0``.
* Everything without a rule raises ``JacError("underivable_operator")`` —
  never a silent zero.

A *site* is a bare variable (``"u"``) or an ``index(v, …)`` node; two sites
are the same iff their RFC §5.4 canonical JSON agrees (so ``u[i+1]`` and
``u[1+i]`` are one site).
"""
from __future__ import annotations

from ..errors import JacError
from ..model.expr import (AGG, Expr, Node, add, free_names, is_zero, iter_children, mul,
                    neg, op, stable_json, to_wire)

__all__ = ["Site", "site_key", "dscalar", "occurs", "ZERO_DERIV_OPS",
           "UNDERIVABLE_OPS"]

ZERO_DERIV_OPS = frozenset([
    "<", "<=", ">", ">=", "==", "!=", "and", "or", "not",
    "sign", "floor", "ceil", "pi", "π", "e", "true", "false", "const", "enum",
    "Pre",
])

#: Operators the spec names as rewrite targets (no derivative may exist).
UNDERIVABLE_OPS = frozenset([
    "D", "grad", "div", "laplacian", "integral", "table_lookup",
])


def site_key(e) -> str:
    """RFC §5.4 canonical JSON of a site node (memoized on the node)."""
    if isinstance(e, str):
        return '"' + e + '"' if '"' not in e else stable_json(e)
    c = e.cache()
    k = c.get("ckey")
    if k is None:
        from earthsci_ast.canonicalize import canonical_json
        from earthsci_ast.parse import _parse_expression
        try:
            k = canonical_json(_parse_expression(to_wire(e, "faq")))
        except Exception:  # a node canonical form cannot express: exact key
            k = stable_json(to_wire(e))
        c["ckey"] = k
    return k


class Site:
    """What a derivative is taken with respect to (see module docstring)."""

    __slots__ = ("expr", "key", "name", "rank")

    def __init__(self, e):
        self.expr = e
        self.key = site_key(e)
        if isinstance(e, str):
            self.name, self.rank = e, -1
        elif isinstance(e, Node) and e.op == "index" and isinstance(e.args[0], str):
            self.name, self.rank = e.args[0], len(e.args) - 1
        else:
            self.name, self.rank = "", -2

    @property
    def cidx(self) -> list:
        """The site's column index expressions (``[]`` for a bare variable)."""
        return [] if isinstance(self.expr, str) else list(self.expr.args[1:])


def is_site(e, s: Site) -> bool:
    if e is s.expr:
        return True
    if isinstance(e, str):
        return s.rank == -1 and e == s.name
    if isinstance(e, Node) and e.op == "index":
        if s.rank == -2:
            return site_key(e) == s.key
        if s.rank < 0 or len(e.args) != s.rank + 1 or e.args[0] != s.name:
            return False
        return site_key(e) == s.key
    return False


def occurs(e, s: Site, memo: dict) -> bool:
    """Structural occurrence of site ``s`` in ``e`` (THE sparsity primitive)."""
    if is_site(e, s):
        return True
    if not isinstance(e, Node):
        return False
    r = memo.get(e)
    if r is None:
        # Cheap negative filter: the variable's name must occur at all.
        if s.name and s.name not in free_names(e):
            r = False
        else:
            r = False
            for c in iter_children(e):
                if occurs(c, s, memo):
                    r = True
                    break
        memo[e] = r
    return r


def dscalar(e, s: Site, memo: dict | None = None):
    """Derivative of the scalar expression ``e`` w.r.t. site ``s``."""
    if memo is None:
        memo = {}
    return _d(e, s, memo)


def _d(e, s: Site, memo: dict):
    if is_site(e, s):
        return 1
    if not isinstance(e, Node):
        return 0
    if not occurs(e, s, memo):
        return 0
    o, a = e.op, e.args

    def d(x):
        return _d(x, s, memo)

    if o == "+":
        return add(*(d(x) for x in a))
    if o == "-":
        if len(a) == 1:
            return neg(d(a[0]))
        return add(d(a[0]), *(neg(d(x)) for x in a[1:]))   # a0 - a1 - a2 - …
    if o == "neg":
        return neg(d(a[0]))
    if o == "*":
        terms = []
        for i, x in enumerate(a):
            dx = d(x)
            if is_zero(dx):
                continue
            terms.append(mul(dx, *(a[j] for j in range(len(a)) if j != i)))
        return add(*terms)
    if o == "/":
        n, m = a
        dn, dm = d(n), d(m)
        t1: Expr = 0 if is_zero(dn) else op("/", dn, m)
        t2: Expr = 0 if is_zero(dm) else neg(op("/", mul(n, dm), op("^", m, 2)))
        return add(t1, t2)
    if o in ("^", "pow"):
        b, x = a
        db, dx = d(b), d(x)
        t1 = 0 if is_zero(db) else mul(x, op("^", b, add(x, -1)), db)
        t2 = 0 if is_zero(dx) else mul(op("^", b, x), op("log", b), dx)
        return add(t1, t2)
    if o == "exp":
        return mul(e, d(a[0]))
    if o == "log":
        return op("/", d(a[0]), a[0])
    if o == "log10":
        return op("/", d(a[0]), mul(a[0], op("log", 10)))
    if o == "sqrt":
        return op("/", d(a[0]), mul(2, e))
    if o == "sin":
        return mul(op("cos", a[0]), d(a[0]))
    if o == "cos":
        return neg(mul(op("sin", a[0]), d(a[0])))
    if o == "tan":
        return mul(add(1, op("^", e, 2)), d(a[0]))
    if o == "tanh":
        return mul(add(1, neg(op("^", e, 2))), d(a[0]))
    if o == "sinh":
        return mul(op("cosh", a[0]), d(a[0]))
    if o == "cosh":
        return mul(op("sinh", a[0]), d(a[0]))
    if o == "asin":
        return op("/", d(a[0]), op("sqrt", add(1, neg(op("^", a[0], 2)))))
    if o == "acos":
        return neg(op("/", d(a[0]), op("sqrt", add(1, neg(op("^", a[0], 2))))))
    if o == "asinh":
        return op("/", d(a[0]), op("sqrt", add(op("^", a[0], 2), 1)))
    if o == "acosh":
        return op("/", d(a[0]), op("sqrt", add(op("^", a[0], 2), -1)))
    if o == "atanh":
        return op("/", d(a[0]), add(1, neg(op("^", a[0], 2))))
    if o == "atan" and len(a) == 1:
        return op("/", d(a[0]), add(1, op("^", a[0], 2)))
    if o in ("atan", "atan2"):
        y, x = a
        den = add(op("^", x, 2), op("^", y, 2))
        return op("/", add(mul(x, d(y)), neg(mul(y, d(x)))), den)
    if o == "abs":
        return mul(op("ifelse", op("<", a[0], 0), -1, 1), d(a[0]))
    if o == "ifelse":
        return op("ifelse", a[0], d(a[1]), d(a[2]))
    if o in ("max", "min"):
        acc, dacc = a[0], d(a[0])
        cmp = ">=" if o == "max" else "<="
        for x in a[1:]:
            dacc = op("ifelse", op(cmp, acc, x), dacc, d(x))
            acc = op(o, acc, x)
        return dacc
    if o in ZERO_DERIV_OPS:
        return 0
    if o == "fn":
        return _dfn(e, s, memo)
    if o == "index":
        raise JacError(
            "underivable_operator",
            "`index` of a non-variable array expression (or an index that "
            f"depends on the differentiation variable) has no scalar rule: {stable_json(to_wire(e))[:200]}")
    if o == AGG:
        raise JacError(
            "unsupported_construct",
            "an array aggregate in scalar position (e.g. a semiring or "
            "filtered reduction nested in a product) has no scalar rule")
    raise JacError(
        "underivable_operator",
        f"no derivative rule for operator `{o}`"
        + (" (a rewrite-target operator: it must be lowered before differentiation)"
           if o in UNDERIVABLE_OPS else ""))


# ── closed functions (esm-spec §9.2) ──────────────────────────────────────

def _const_vector(e):
    if not (isinstance(e, Node) and e.op == "const"):
        return None
    v = e.attr("value")
    if not isinstance(v, tuple) or not all(_isnum(x) for x in v):
        return None
    return [float(x) for x in v]


def _const_matrix(e):
    if not (isinstance(e, Node) and e.op == "const"):
        return None
    v = e.attr("value")
    if not isinstance(v, tuple) or not v:
        return None
    rows = []
    for r in v:
        if not (isinstance(r, tuple) and all(_isnum(x) for x in r)):
            return None
        rows.append([float(x) for x in r])
    if any(len(r) != len(rows[0]) for r in rows):
        return None
    return rows


def _isnum(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _bilinear_partial(T, xv, yv, xe, ye):
    """∂(bilinear blend)/∂x as a nested segment ``ifelse`` (flat-zero outside
    ``xv``; leaves blend the x-slopes with the clamped y-weight)."""
    nx, ny = len(xv), len(yv)
    out: Expr = 0
    for i in range(nx - 2, -1, -1):
        def sl(j, i=i):
            return (T[i + 1][j] - T[i][j]) / (xv[i + 1] - xv[i])
        leaf = sl(ny - 1)
        for j in range(ny - 2, -1, -1):
            wy = op("/", add(ye, -yv[j]), yv[j + 1] - yv[j])
            ex = add(sl(j), mul(wy, add(sl(j + 1), neg(sl(j)))))
            leaf = op("ifelse", op("<", ye, yv[j + 1]), ex, leaf)
        leaf = op("ifelse", op("<", ye, yv[0]), sl(0), leaf)
        out = op("ifelse", op("<", xe, xv[i + 1]), leaf, out)
    return op("ifelse", op("<", xe, xv[0]), 0, out)


def _dfn(e: Node, s: Site, memo: dict):
    name = e.attr("name") or ""
    a = e.args
    if name.startswith("datetime.") or name == "interp.searchsorted":
        return 0
    if name == "interp.linear":
        table, axis, x = a
        dx = _d(x, s, memo)
        if is_zero(dx):
            return 0
        yv, xv = _const_vector(table), _const_vector(axis)
        if yv is None or xv is None:
            raise JacError("underivable_operator",
                           "interp.linear table/axis must be literal `const` arrays")
        n = len(xv)
        if n != len(yv) or n < 2:
            raise JacError("underivable_operator",
                           "interp.linear table/axis length mismatch or fewer than 2 knots")
        slopes = [(yv[k + 1] - yv[k]) / (xv[k + 1] - xv[k]) for k in range(n - 1)]
        slope: Expr = 0
        for k in range(n - 2, -1, -1):
            slope = op("ifelse", op("<", x, xv[k + 1]), slopes[k], slope)
        slope = op("ifelse", op("<", x, xv[0]), 0, slope)
        return mul(slope, dx)
    if name == "interp.bilinear":
        table, ax, ay, x, y = a
        dx, dy = _d(x, s, memo), _d(y, s, memo)
        if is_zero(dx) and is_zero(dy):
            return 0
        T, xv, yv = _const_matrix(table), _const_vector(ax), _const_vector(ay)
        if T is None or xv is None or yv is None:
            raise JacError("underivable_operator",
                           "interp.bilinear table/axes must be literal `const` arrays")
        if len(T) != len(xv) or len(T[0]) != len(yv) or len(xv) < 2 or len(yv) < 2:
            raise JacError("underivable_operator",
                           "interp.bilinear table/axis shape mismatch or fewer than 2 knots")
        terms = []
        if not is_zero(dx):
            terms.append(mul(_bilinear_partial(T, xv, yv, x, y), dx))
        if not is_zero(dy):
            TT = [list(r) for r in zip(*T)]
            terms.append(mul(_bilinear_partial(TT, yv, xv, y, x), dy))
        return add(*terms)
    raise JacError("underivable_operator", f"no derivative rule for closed function `{name}`")
