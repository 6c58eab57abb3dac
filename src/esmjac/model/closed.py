"""Closed functions (esm-spec §9.2) as primitive expressions, for the compiler.

The compiled path has no table-lookup instruction; an ``interp.*`` call over
literal ``const`` tables is rewritten into ``ifelse``/``min``/``max``
arithmetic that evaluates to exactly what the oracle
(:mod:`esmjac.model.evaluate`) and earthsci-ast compute, with the same tie
and boundary rules:

* ``interp.linear(table, axis, x)``: flat outside the axis; inside, the
  segment ``k`` with ``axis[k] <= x < axis[k+1]`` (a knot belongs to the
  segment on its right, as ``bisect_right`` chooses; the value is continuous).
* ``interp.bilinear(T, ax, ay, x, y)``: each coordinate clamped to its axis,
  cell chosen as above and clamped to the last cell.
* ``interp.searchsorted(x, xs)``: the smallest 1-based ``i`` with
  ``xs[i] >= x`` (left bias): ``1 + #{k: xs[k] < x}``; NaN ``x`` gives
  ``N + 1``.

* ``datetime.*(t)``: ``t`` is UTC seconds since the Unix epoch, proleptic
  Gregorian, no leap seconds (earthsci-ast's ``_to_datetime``); the civil
  date comes from the day number by Hinnant's ``civil_from_days`` in
  ``floor`` arithmetic, exact in float64 for any realistic ``t``.
  ``julian_day`` is the day number plus 2440588 (the JDN of 1970-01-01) plus
  ``(seconds of day - 43200) / 86400``, the reference's own formula. (The
  reference rounds ``t`` to microseconds first; within a microsecond below a
  whole second the two may differ by that second.)
"""
from __future__ import annotations

from ..errors import JacError
from .expr import Node, is_lit, node

__all__ = ["expand_closed", "CLOSED_COMPILED"]

CLOSED_COMPILED = ("interp.linear", "interp.bilinear", "interp.searchsorted",
                   "datetime.year", "datetime.month", "datetime.day", "datetime.hour",
                   "datetime.minute", "datetime.second", "datetime.day_of_year",
                   "datetime.julian_day", "datetime.is_leap_year")


def _op(o, *args):
    return node(o, list(args))


def _vector(e, what: str) -> list:
    v = e.attr("value") if isinstance(e, Node) and e.op == "const" else None
    if not isinstance(v, (list, tuple)) or not v or not all(is_lit(x) for x in v):
        raise JacError("unsupported_construct", f"{what} must be a literal `const` vector")
    return [float(x) for x in v]


def _matrix(e, what: str) -> list:
    v = e.attr("value") if isinstance(e, Node) and e.op == "const" else None
    if not isinstance(v, (list, tuple)) or not v or \
            not all(isinstance(r, (list, tuple)) and r and all(is_lit(x) for x in r) for r in v):
        raise JacError("unsupported_construct", f"{what} must be a literal `const` matrix")
    return [[float(x) for x in r] for r in v]


def _increasing(xv: list, name: str) -> None:
    if len(xv) < 2 or any(b <= a for a, b in zip(xv, xv[1:])):
        raise JacError("unsupported_construct", f"{name}: the axis must have at least 2 strictly increasing knots")


def _linear(table, axis, x):
    yv, xv = _vector(table, "interp.linear table"), _vector(axis, "interp.linear axis")
    _increasing(xv, "interp.linear")
    if len(yv) != len(xv):
        raise JacError("unsupported_construct", "interp.linear: table and axis lengths differ")
    n = len(xv)
    out = yv[-1]
    for k in range(n - 2, -1, -1):
        s = (yv[k + 1] - yv[k]) / (xv[k + 1] - xv[k])
        piece = _op("+", yv[k], _op("*", s, _op("-", x, xv[k])))
        out = _op("ifelse", _op("<", x, xv[k + 1]), piece, out)
    return _op("ifelse", _op("<", x, xv[0]), yv[0], out)


def _cells(xv: list, xc, value_of):
    """``value_of(k, w)`` for the clamped cell k of ``xc`` and its weight w."""
    n = len(xv)
    out = None
    for k in range(n - 2, -1, -1):
        w = _op("/", _op("-", xc, xv[k]), xv[k + 1] - xv[k])
        v = value_of(k, w)
        out = v if out is None else _op("ifelse", _op("<", xc, xv[k + 1]), v, out)
    return out


def _bilinear(table, ax, ay, x, y):
    T = _matrix(table, "interp.bilinear table")
    xv, yv = _vector(ax, "interp.bilinear x axis"), _vector(ay, "interp.bilinear y axis")
    _increasing(xv, "interp.bilinear")
    _increasing(yv, "interp.bilinear")
    if len(T) != len(xv) or any(len(r) != len(yv) for r in T):
        raise JacError("unsupported_construct", "interp.bilinear: table shape differs from the axes")
    xc = _op("min", _op("max", x, xv[0]), xv[-1])
    yc = _op("min", _op("max", y, yv[0]), yv[-1])

    def in_x(i, wx):
        def in_y(j, wy):
            ux, uy = _op("-", 1, wx), _op("-", 1, wy)
            return _op("+", _op("*", ux, uy, T[i][j]), _op("*", wx, uy, T[i + 1][j]),
                       _op("*", ux, wy, T[i][j + 1]), _op("*", wx, wy, T[i + 1][j + 1]))
        return _cells(yv, yc, in_y)
    return _cells(xv, xc, in_x)


def _searchsorted(x, xs):
    xv = _vector(xs, "interp.searchsorted table")
    if any(b < a for a, b in zip(xv, xv[1:])):
        raise JacError("unsupported_construct", "interp.searchsorted: the table must be non-decreasing")
    count = _op("+", 1, *[_op("<", v, x) for v in xv])
    return _op("ifelse", _op("!=", x, x), len(xv) + 1, count)


def _floor(x):
    return _op("floor", x)


def _fdiv(a, b):
    return _floor(_op("/", a, b))


def _divisible(y, k: int):
    return _op("==", _op("-", y, _op("*", k, _fdiv(y, k))), 0)


def _datetime(name: str, t):
    days = _fdiv(t, 86400)
    sod = _op("-", t, _op("*", 86400, days))
    if name == "julian_day":
        return _op("+", _op("+", days, 2440588), _op("/", _op("-", sod, 43200), 86400))
    hour = _fdiv(sod, 3600)
    if name == "hour":
        return hour
    rest = _op("-", sod, _op("*", 3600, hour))
    minute = _fdiv(rest, 60)
    if name == "minute":
        return minute
    if name == "second":
        return _floor(_op("-", rest, _op("*", 60, minute)))
    # civil_from_days (H. Hinnant), days since 1970-01-01
    z = _op("+", days, 719468)
    era = _fdiv(z, 146097)
    doe = _op("-", z, _op("*", era, 146097))
    yoe = _fdiv(_op("+", _op("-", doe, _fdiv(doe, 1460)), _op("-", _fdiv(doe, 36524), _fdiv(doe, 146096))), 365)
    doy = _op("-", doe, _op("-", _op("+", _op("*", 365, yoe), _fdiv(yoe, 4)), _fdiv(yoe, 100)))
    mp = _fdiv(_op("+", _op("*", 5, doy), 2), 153)
    day = _op("+", _op("-", doy, _fdiv(_op("+", _op("*", 153, mp), 2), 5)), 1)
    month = _op("ifelse", _op("<", mp, 10), _op("+", mp, 3), _op("-", mp, 9))
    year = _op("+", _op("+", yoe, _op("*", era, 400)), _op("<=", month, 2))
    if name == "day":
        return day
    if name == "month":
        return month
    if name == "year":
        return year
    leap = _op("and", _divisible(year, 4), _op("or", _op("not", _divisible(year, 100)), _divisible(year, 400)))
    if name == "is_leap_year":
        return leap
    if name == "day_of_year":   # doy counts from March 1
        return _op("ifelse", _op(">=", mp, 10), _op("-", doy, 305), _op("+", _op("+", doy, 60), leap))
    raise JacError("unsupported_construct", f"closed function `datetime.{name}` is not compiled yet")


def expand_closed(e: Node):
    """``e`` (an ``fn`` node) as a primitive expression, or a typed refusal."""
    name = e.attr("name") or ""
    a = list(e.args)
    if name == "interp.linear" and len(a) == 3:
        return _linear(*a)
    if name == "interp.bilinear" and len(a) == 5:
        return _bilinear(*a)
    if name == "interp.searchsorted" and len(a) == 2:
        return _searchsorted(*a)
    if name.startswith("datetime.") and len(a) == 1:
        return _datetime(name[len("datetime."):], a[0])
    raise JacError("unsupported_construct", f"closed function `{name}` is not compiled yet")
