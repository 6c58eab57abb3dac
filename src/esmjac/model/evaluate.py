"""Scalar evaluation semantics, shared by literal folding and the oracle.

:func:`ev` evaluates a scalar expression to a float under ``env`` (names →
values); ``index`` reads go to ``index_fn(node, env)``. Anything it cannot
evaluate raises :class:`Decline` — the literal folder treats that as "leave
the node alone", the oracle as an error. Comparisons and logicals yield
1.0/0.0; ``ifelse`` evaluates only the taken branch; a closed
``reduce: "+"`` aggregate sums its body over its literal ranges.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable

from ..errors import JacError
from .closed import expand_closed
from .expr import AGG, Node, is_lit

__all__ = ["Decline", "ev", "interp_linear", "interp_bilinear"]


class Decline(Exception):
    """The expression cannot be evaluated here (unbound, out of domain, …)."""


def _sign(x):
    return float((x > 0) - (x < 0))


_FUN1: dict[str, Callable[[float], float]] = {
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


def ev(e, env: dict, index_fn=None) -> float:
    """Evaluate ``e`` to a float (see module docstring)."""
    if isinstance(e, str):
        v = env.get(e)
        if v is None:
            raise Decline(f"unbound name `{e}`")
        return v
    if is_lit(e):
        return float(e)
    if not isinstance(e, Node):
        raise Decline(f"not a scalar expression: {e!r}")
    o = e.op
    if o == AGG:
        return _aggregate(e, env, index_fn)
    if o == "index":
        if index_fn is None:
            raise Decline("index read without a resolver")
        return index_fn(e, env)
    if o == "ifelse":
        c = ev(e.args[0], env, index_fn)
        return ev(e.args[1] if c != 0.0 else e.args[2], env, index_fn)
    if o == "fn":
        return _fn(e, env, index_fn)
    a = [ev(x, env, index_fn) for x in e.args]
    try:
        if o == "+":
            r = 0.0
            for x in a:
                r += x
            return r
        if o == "*":
            r = 1.0
            for x in a:
                r *= x
            return r
        if o == "-":
            if len(a) == 1:
                return -a[0]
            r = a[0]
            for x in a[1:]:
                r -= x
            return r
        if o == "neg":
            return -a[0]
        if o == "/":
            if a[1] == 0.0:
                raise Decline("division by zero")
            return a[0] / a[1]
        if o in ("^", "pow"):
            r = a[0] ** a[1]
            if isinstance(r, complex):
                raise Decline("complex power")
            return float(r)
        if o in _CMP:
            return 1.0 if _CMP[o](a[0], a[1]) else 0.0
        if o == "and":
            return 1.0 if all(x != 0.0 for x in a) else 0.0
        if o == "or":
            return 1.0 if any(x != 0.0 for x in a) else 0.0
        if o == "not":
            return 0.0 if a[0] != 0.0 else 1.0
        if o == "max" and a:
            return max(a)
        if o == "min" and a:
            return min(a)
        if o in ("pi", "π") and not a:
            return math.pi
        if o == "e" and not a:
            return math.e
        if (o == "atan" and len(a) == 2) or o == "atan2":
            return math.atan2(a[0], a[1])
        f = _FUN1.get(o)
        if f is not None and len(a) == 1:
            return float(f(a[0]))
    except (ValueError, OverflowError, ZeroDivisionError) as exc:
        raise Decline(str(exc))
    raise Decline(f"no evaluation rule for `{o}`")


def _aggregate(e: Node, env: dict, index_fn) -> float:
    if e.attr("output_idx") or e.attr("filter") is not None:
        raise Decline("array-valued or filtered aggregate in scalar position")
    if e.attr("reduce") not in (None, "+") or e.attr("semiring") not in (None, "sum_product"):
        raise Decline("non-`+` reduction")
    names, spans = [], []
    for name, r in e.attr("ranges") or ():
        if not (isinstance(r, tuple) and len(r) == 2 and all(isinstance(x, int) for x in r)):
            raise Decline("non-literal aggregate range")
        names.append(name)
        spans.append(range(r[0], r[1] + 1))
    total = 0.0
    for pt in itertools.product(*spans):
        env2 = dict(env)
        env2.update(zip(names, (float(x) for x in pt)))
        total += ev(e.body, env2, index_fn)
    return total


def _const_floats(e):
    if isinstance(e, Node) and e.op == "const":
        return e.attr("value")
    raise Decline("interp tables must be literal const arrays")


def interp_linear(table, axis, x: float) -> float:
    """Piecewise-linear interpolation, flat outside the axis (esm-spec §9.2)."""
    if x <= axis[0]:
        return float(table[0])
    if x >= axis[-1]:
        return float(table[-1])
    k = bisect.bisect_right(axis, x) - 1
    w = (x - axis[k]) / (axis[k + 1] - axis[k])
    return table[k] + w * (table[k + 1] - table[k])


def _cell(axis, x):
    xc = min(max(x, axis[0]), axis[-1])
    k = min(max(bisect.bisect_right(axis, xc) - 1, 0), len(axis) - 2)
    return k, (xc - axis[k]) / (axis[k + 1] - axis[k])


def interp_bilinear(T, ax, ay, x: float, y: float) -> float:
    """Bilinear interpolation with per-axis clamping (esm-spec §9.2)."""
    i, wx = _cell(ax, x)
    j, wy = _cell(ay, y)
    return ((1 - wx) * (1 - wy) * T[i][j] + wx * (1 - wy) * T[i + 1][j]
            + (1 - wx) * wy * T[i][j + 1] + wx * wy * T[i + 1][j + 1])


def _fn(e: Node, env: dict, index_fn) -> float:
    name = e.attr("name") or ""
    a = e.args
    if name == "interp.linear":
        return interp_linear(_const_floats(a[0]), _const_floats(a[1]), ev(a[2], env, index_fn))
    if name == "interp.bilinear":
        return interp_bilinear(_const_floats(a[0]), _const_floats(a[1]), _const_floats(a[2]),
                               ev(a[3], env, index_fn), ev(a[4], env, index_fn))
    if name.startswith("datetime.") or name == "interp.searchsorted":
        # The same primitive arithmetic the compiler runs (model/closed.py),
        # checked against earthsci-ast's own closed functions in the tests.
        try:
            return ev(expand_closed(e), env, index_fn)
        except JacError as exc:
            raise Decline(exc.message) from None
    raise Decline(f"closed function `{name}` is not evaluated by esmjac's oracle")
