"""Scalar derivative rules against complex-step derivatives (hypothesis),
plus the non-smooth policies and refusals, each by hand derivation."""
from __future__ import annotations

import cmath
import math

import pytest
from hypothesis import assume, given, settings, strategies as st

from esmjac.calculus.rules import Site, dscalar
from esmjac.calculus.simplify import simp
from esmjac.errors import JacError
from esmjac.model.evaluate import ev
from esmjac.model.expr import from_wire, op

# ── an independent complex evaluator for the smooth core ──────────────────
_C1 = {"exp": cmath.exp, "log": cmath.log, "sin": cmath.sin, "cos": cmath.cos,
       "tanh": cmath.tanh, "sqrt": cmath.sqrt, "atan": cmath.atan, "sinh": cmath.sinh,
       "cosh": cmath.cosh, "tan": cmath.tan, "asinh": cmath.asinh}


def cev(w, env):
    if isinstance(w, str):
        return env[w]
    if isinstance(w, (int, float)):
        return complex(w)
    a = [cev(x, env) for x in w["args"]]
    o = w["op"]
    if o == "+":
        return sum(a)
    if o == "*":
        r = 1
        for x in a:
            r *= x
        return r
    if o == "-":
        return -a[0] if len(a) == 1 else a[0] - a[1]
    if o == "/":
        return a[0] / a[1]
    if o == "^":
        return a[0] ** a[1]
    return _C1[o](a[0])


leaf = st.one_of(st.sampled_from(["x", "y"]), st.integers(-3, 3), st.floats(0.25, 2.5))


def _pos(e):  # a strictly positive wrapper, so logs, roots and powers stay real
    return {"op": "+", "args": [1.5, {"op": "*", "args": [e, e]}]}


def extend(children):
    return st.one_of(
        st.tuples(st.sampled_from(["+", "*"]), st.lists(children, min_size=2, max_size=3)).map(
            lambda t: {"op": t[0], "args": t[1]}),
        st.tuples(children, children).map(lambda t: {"op": "-", "args": list(t)}),
        children.map(lambda c: {"op": "-", "args": [c]}),
        st.tuples(children, children).map(lambda t: {"op": "/", "args": [t[0], _pos(t[1])]}),
        st.tuples(children, st.integers(2, 3)).map(lambda t: {"op": "^", "args": [t[0], t[1]]}),
        st.tuples(children, children).map(lambda t: {"op": "^", "args": [_pos(t[0]), {"op": "*", "args": [0.5, t[1]]}]}),
        st.tuples(st.sampled_from(["sin", "cos", "tanh", "atan", "sinh", "asinh"]), children).map(
            lambda t: {"op": t[0], "args": [{"op": "*", "args": [0.3, t[1]]}]}),
        st.tuples(st.sampled_from(["log", "sqrt"]), children).map(lambda t: {"op": t[0], "args": [_pos(t[1])]}),
        children.map(lambda c: {"op": "exp", "args": [{"op": "*", "args": [0.2, c]}]}),
    )


exprs = st.recursive(leaf, extend, max_leaves=12)


@settings(max_examples=250, deadline=None)
@given(w=exprs, x=st.floats(-1.5, 1.5), y=st.floats(-1.5, 1.5))
def test_smooth_core_matches_complex_step(w, x, y):
    e = from_wire(w)
    d = simp(dscalar(e, Site("x")))
    h = 1e-30
    try:            # a generated tower like exp(0.2 (1.5+…)^13.5) overflows: no reference value
        ref = cev(w, {"x": complex(x, h), "y": complex(y, 0)})
    except OverflowError:
        assume(False)
    want = ref.imag / h
    assume(cmath.isfinite(ref) and math.isfinite(want))
    got = ev(d, {"x": x, "y": y})
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)


def _d(w, site="x", **env):
    return ev(simp(dscalar(from_wire(w), Site(site))), env)


def test_ifelse_differentiates_branches_not_condition():
    w = {"op": "ifelse", "args": [{"op": ">", "args": ["x", 1]}, {"op": "*", "args": [3, "x"]}, {"op": "^", "args": ["x", 2]}]}
    assert _d(w, x=2.0) == 3.0
    assert _d(w, x=0.5) == 1.0   # 2x at 0.5


def test_max_min_ties_go_to_the_earlier_argument():
    mx = {"op": "max", "args": [{"op": "*", "args": [2, "x"]}, {"op": "*", "args": [3, "x"]}]}
    assert _d(mx, x=0.0) == 2.0      # tie: first argument's derivative
    assert _d(mx, x=1.0) == 3.0
    assert _d(mx, x=-1.0) == 2.0
    mn = {"op": "min", "args": ["x", {"op": "*", "args": [5, "x"]}, 0.25]}
    assert _d(mn, x=0.0) == 1.0
    assert _d(mn, x=1.0) == 0.0      # min is the constant 0.25
    assert _d(mn, x=-1.0) == 5.0


def test_abs_subgradient_is_plus_one_at_zero():
    w = {"op": "abs", "args": ["x"]}
    assert _d(w, x=0.0) == 1.0
    assert _d(w, x=-2.0) == -1.0


@pytest.mark.parametrize("o", ["<", ">=", "==", "sign", "floor", "ceil"])
def test_zero_rules(o):
    args = ["x", 1] if o in ("<", ">=", "==") else ["x"]
    w = {"op": "*", "args": [{"op": o, "args": args}, "x"]}
    # d[(cmp)·x] = cmp·1 + 0 : only the value of the comparison survives
    val = ev(from_wire({"op": o, "args": args}), {"x": 0.3})
    assert _d(w, x=0.3) == val


def test_interp_linear_slope_and_flat_extrapolation():
    tab = {"op": "const", "args": [], "value": [0.0, 2.0, 3.0]}
    ax = {"op": "const", "args": [], "value": [0.0, 1.0, 3.0]}
    w = {"op": "fn", "name": "interp.linear", "args": [tab, ax, {"op": "*", "args": [2, "x"]}]}
    assert _d(w, x=0.25) == 4.0      # slope 2 on [0,1], times 2
    assert _d(w, x=1.0) == 1.0       # slope 0.5 on [1,3], times 2
    assert _d(w, x=-1.0) == 0.0
    assert _d(w, x=2.0) == 0.0


def test_interp_bilinear_partials_against_differences():
    from esmjac.model.evaluate import interp_bilinear
    T = [[0.0, 1.0, 4.0], [2.0, 3.0, 1.0]]
    ax, ay = [0.0, 2.0], [0.0, 1.0, 3.0]
    w = {"op": "fn", "name": "interp.bilinear", "args": [
        {"op": "const", "args": [], "value": T}, {"op": "const", "args": [], "value": ax},
        {"op": "const", "args": [], "value": ay}, "x", "y"]}
    for x, y in [(0.5, 0.3), (1.5, 2.0), (-1.0, 0.5), (0.7, 5.0)]:
        h = 1e-6
        fx = (interp_bilinear(T, ax, ay, x + h, y) - interp_bilinear(T, ax, ay, x - h, y)) / (2 * h)
        fy = (interp_bilinear(T, ax, ay, x, y + h) - interp_bilinear(T, ax, ay, x, y - h)) / (2 * h)
        assert _d(w, "x", x=x, y=y) == pytest.approx(fx, abs=1e-7)
        assert _d(w, "y", x=x, y=y) == pytest.approx(fy, abs=1e-7)


def test_site_identity_is_canonical():
    a = from_wire({"op": "index", "args": ["u", {"op": "+", "args": ["i", 1]}]})
    b = from_wire({"op": "index", "args": ["u", {"op": "+", "args": [1, "i"]}]})
    assert dscalar(op("*", 3, b), Site(a)) == 3


@pytest.mark.parametrize("w", [
    {"op": "grad", "args": ["x"], "dim": "lon"},
    {"op": "D", "args": ["x"], "wrt": "lon"},
    {"op": "laplacian", "args": ["x"]},
    {"op": "table_lookup", "args": ["x"]},
    {"op": "fn", "name": "mystery.f", "args": ["x"]},
    {"op": "fn", "name": "interp.linear", "args": ["tab", "ax", "x"]},
])
def test_underivable_operators_are_refused(w):
    with pytest.raises(JacError) as ei:
        dscalar(op("+", 1, from_wire(w)), Site("x"))
    assert ei.value.code == "underivable_operator"


def test_structural_sparsity_never_probes_values():
    # x - x is structurally present: a zero coefficient value, not a dropped band
    w = {"op": "-", "args": [{"op": "*", "args": ["y", "x"]}, {"op": "*", "args": ["y", "x"]}]}
    d = simp(dscalar(from_wire(w), Site("x")))
    assert d != 0 and ev(d, {"y": 2.0, "x": 1.0}) == 0.0


def test_no_log_of_base_for_constant_exponent():
    d = simp(dscalar(from_wire({"op": "^", "args": ["x", 3]}), Site("x")))
    assert "log" not in repr(d)
    assert math.isclose(ev(d, {"x": 2.0}), 12.0)


def test_same_condition_is_pruned_along_a_path():
    from esmjac.calculus.simplify import simplify_branches
    c = {"op": ">", "args": ["x", 0]}
    inner = {"op": "ifelse", "args": [c, "a", "b"]}
    w = {"op": "ifelse", "args": [c, {"op": "+", "args": [inner, 1]}, {"op": "*", "args": [inner, 2]}]}
    want = {"op": "ifelse", "args": [c, {"op": "+", "args": ["a", 1]}, {"op": "*", "args": ["b", 2]}]}
    assert simplify_branches(from_wire(w)) is from_wire(want)
