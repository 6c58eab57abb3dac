"""Every call checks its arguments in Python before compiled code runs:
owned workspaces, no aliasing, argument hygiene, lane limits, and
non-finite results from finite inputs reported (issue #10 items 1, 4, 6-8).

Values are checked against hand derivations of the two-species mechanism
(tests/support/models.chem): f_A = -k1 A + k2 B², f_B = k1 A - 2 k2 B².
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from esmjac.errors import JacError
from esmjac.layouts import Csr, LaneBlocks
from esmjac.models.gridded import diffusion_model
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from tests.support.child import run_child
from tests.support.models import chem

CELLS = 4
K1, K2 = 0.3, 2.0
_P: dict = {}


def _progs(name: str):
    """(Jacobian, RHS) programs, built once per session."""
    if name not in _P:
        if name == "chem":
            doc, opts = chem(cells=CELLS), {}
        elif name == "tape":
            doc, opts = chem(cells=CELLS), {"engine": "tape"}
        elif name == "stencil":
            doc, opts = diffusion_model(12), {}
        _P[name] = (JacobianProgram.build(doc, options=opts), RhsProgram.build(doc, options=opts))
    return _P[name]


def _code(exc) -> str:
    return exc.value.code


def _point(R):
    return np.linspace(1.0, 2.0, R.u_size(R.cells))


@pytest.fixture(params=["chem", "tape"])
def progs(request):
    return _progs(request.param)


# ---------------------------------------------------------------- item 1: owned scratch

def test_a_foreign_scratch_or_workspace_is_refused(progs):
    J, R = progs
    Jo, Ro = _progs("stencil")
    u = _point(R)
    out = np.zeros_like(u)
    with pytest.raises(JacError) as e:
        R.eval_into(u, R.p0, 0.0, None, out, Ro.new_buffers())
    assert _code(e) == "bad_argument" and "another program" in e.value.message
    plan = J.plan(Csr())
    o = np.zeros(plan.out_size(CELLS))
    with pytest.raises(JacError) as e:
        J.eval_into(plan, u, J.p0, 0.0, None, o, Jo.new_workspace())
    assert _code(e) == "bad_argument"


def test_a_workspace_whose_arrays_were_replaced_is_refused(progs):
    J, R = progs
    u = _point(R)
    plan = J.plan(Csr())
    o = np.zeros(plan.out_size(CELLS))
    for attr, val in (("h", np.zeros(0)), ("h", np.zeros(3, np.float32)), ("cix", np.zeros(2, np.int64)),
                      ("cix", np.zeros(2 * CELLS, np.int32)), ("lanes", 8), ("lanes", 2.0)):
        ws = J.new_workspace()
        J.eval_into(plan, u, J.p0, 0.0, None, o, ws)        # bound and verified once ...
        setattr(ws, attr, val)                               # ... then tampered with
        if attr == "h" and J.kernel.n_hoist <= val.shape[0] and val.dtype == np.float64:
            continue
        with pytest.raises(JacError) as e:
            J.eval_into(plan, u, J.p0, 0.0, None, o, ws)
        assert _code(e) == "bad_argument", (attr, val)
        sc = R.new_buffers()
        setattr(sc, attr, val)
        with pytest.raises(JacError) as e:
            R.eval_into(u, R.p0, 0.0, None, np.zeros_like(u), sc)
        assert _code(e) == "bad_argument", (attr, val)


@pytest.mark.slow
def test_a_foreign_scratch_never_crashes_the_process(tmp_path):
    """The issue's reproduction (exit 139 in 2 of 3 runs), in a child so a
    crash fails this test rather than the run."""
    code = """
import numpy as np
from esmjac.errors import JacError
from esmjac.models.gridded import diffusion_model
from esmjac.runtime.programs import RhsProgram
from tests.support.models import chem
a = RhsProgram.build(diffusion_model(12)); b = RhsProgram.build(chem(cells=4))
codes = []
for _ in range(3):
    u = np.ones(a.u_size(1)); out = np.zeros_like(u)
    try:
        a.eval_into(u, a.p0, 0.0, None, out, b.new_buffers(8))
        codes.append("accepted")
    except JacError as exc:
        codes.append(exc.code)
print("RESULT " + json.dumps(codes))
"""
    import os
    assert run_child(code, os.environ.get("ESMJAC_CACHE_DIR", tmp_path)) == ["bad_argument"] * 3


# ---------------------------------------------------------------- item 4: aliasing

def test_aliased_outputs_are_refused():
    J, R = _progs("chem")
    Js, Rs = _progs("stencil")
    for P, Q in ((R, J), (Rs, Js)):
        u = _point(P)
        with pytest.raises(JacError) as e:
            P.eval_into(u, P.p0, 0.0, None, u)                              # out=u
        assert _code(e) == "bad_argument" and "shares memory" in e.value.message
        buf = np.ones(3 * u.size)
        with pytest.raises(JacError) as e:                                  # partial overlap
            P.eval_into(buf[:u.size], P.p0, 0.0, None, buf[u.size // 2:u.size // 2 + u.size])
        assert _code(e) == "bad_argument"
        for lay in (Csr(), LaneBlocks("natural")) if P is R else (Csr(),):
            plan = Q.plan(lay)
            ws = Q.new_workspace()
            n = plan.out_size(ws.lanes)
            big = np.ones(n + u.size)
            with pytest.raises(JacError) as e:                              # out overlapping u
                Q.eval_into(plan, big[n - 1:n - 1 + u.size], Q.p0, 0.0, None, big[:n], ws)
            assert _code(e) == "bad_argument"
            out = np.zeros(n)
            Q.eval_into(plan, u.copy(), Q.p0, 0.0, None, out, ws)
            y = np.ones(Q.u_size(ws.lanes))
            with pytest.raises(JacError) as e:
                Q.apply(plan, ws, y, y)
            assert _code(e) == "bad_argument"
            with pytest.raises(JacError) as e:
                Q.apply_transpose(plan, ws, y, y)
            assert _code(e) == "bad_argument"
            for args in ((y, y.copy(), y), (y.copy(), y, y)):
                with pytest.raises(JacError) as e:
                    Q.contract(plan, ws, *args)
                assert _code(e) == "bad_argument"


def test_a_binding_in_a_solver_loop_still_refuses_aliasing():
    """A bound RHS called as a solver calls it (a new state each call into
    the last call's output: the path that skips re-checking what it checked
    before) refuses ``u`` that is, or is a view into, ``out``, and ``p``
    overlapping ``out``; between the refusals the values are the hand
    derivation's (f_A = -k1 A + k2 B², f_B = k1 A - 2 k2 B²)."""
    J, R = _progs("chem")
    run = R.bind()
    u0 = _point(R)
    out = np.zeros(u0.size)
    A, B = slice(0, CELLS), slice(CELLS, 2 * CELLS)

    def want(u):
        return np.concatenate([-K1 * u[A] + K2 * u[B] ** 2, K1 * u[A] - 2 * K2 * u[B] ** 2])

    for k in range(3):                                       # the solver's loop: fresh states
        u = u0 * (1.0 + 0.1 * k)
        assert run(u, R.p0, 0.0, None, out) is out
        assert np.allclose(out, want(u), rtol=1e-14)
    for bad in (out, out[:], out.reshape(-1)):               # the output itself, views of it
        with pytest.raises(JacError) as e:
            run(bad, R.p0, 0.0, None, out)
        assert _code(e) == "bad_argument" and "shares memory" in e.value.message
    buf = np.ones(3 * u0.size)
    view = buf[:u0.size]
    run(u0.copy(), R.p0, 0.0, None, view)
    with pytest.raises(JacError) as e:                       # out a view; u overlapping it
        run(buf[u0.size // 2:u0.size // 2 + u0.size], R.p0, 0.0, None, view)
    assert _code(e) == "bad_argument"
    if R.p0.size:
        pbuf = np.zeros(u0.size + R.p0.size)
        pbuf[:R.p0.size] = R.p0
        run(u0.copy(), R.p0, 0.0, None, pbuf[R.p0.size:])
        with pytest.raises(JacError) as e:                   # p overlapping out
            run(u0.copy(), pbuf[:R.p0.size + 1][:R.p0.size], 0.0, None, pbuf[R.p0.size - 1:][:u0.size])
        assert _code(e) == "bad_argument"
    u = u0 * 2.0
    assert np.allclose(run(u, R.p0, 0.0, None, out), want(u), rtol=1e-14)

def test_contract_sees_the_point_of_eval_into_not_later_changes_to_u():
    """The four-species model has a diagonal Hessian that depends on u:
    ∂²/∂A² log A = -1/A², ∂²/∂B² k1/B = 2 k1/B³, ∂²/∂C² √C = -C^(-3/2)/4,
    ∂²/∂E² (exp E + t k2 E) = exp E; so out = λ v · diag (k1 = 1)."""
    J, R = _progs_singular()
    plan = J.plan(Csr())
    ws = J.new_workspace()
    u = np.linspace(0.5, 2.0, 8)
    J.eval_into(plan, u, J.p0, 0.0, None, np.zeros(plan.out_size(2)), ws)
    rng = np.random.default_rng(3)
    lam, v = rng.standard_normal(8), rng.standard_normal(8)
    c1 = J.contract(plan, ws, lam, v, np.zeros(8))
    A, B, C, E = u[0:2], u[2:4], u[4:6], u[6:8]
    diag = np.concatenate([-1 / A**2, 2 / B**3, -0.25 * C**-1.5, np.exp(E)])
    assert np.allclose(c1, lam * v * diag, rtol=1e-13, atol=0)
    u[:] = 7.0                                           # the caller reuses its buffer
    c2 = J.contract(plan, ws, lam, v, np.zeros(8))
    assert np.array_equal(c1, c2)


def test_apply_agrees_with_the_hand_jacobian_after_refusing_an_alias():
    J, R = _progs("chem")
    plan = J.plan(Csr())
    ws = J.new_workspace()
    u = _point(R)
    J.eval_into(plan, u, J.p0, 0.0, None, np.zeros(plan.out_size(CELLS)), ws)
    v = np.linspace(-1, 1, u.size)
    y = J.apply(plan, ws, v, np.zeros(u.size))
    A, B = slice(0, CELLS), slice(CELLS, 2 * CELLS)
    want = np.concatenate([-K1 * v[A] + 2 * K2 * u[B] * v[B], K1 * v[A] - 4 * K2 * u[B] * v[B]])
    assert np.allclose(y, want, rtol=1e-14)


# ---------------------------------------------------------------- item 6: argument hygiene

@pytest.mark.parametrize("t", [None, np.zeros(2), "0", 1j, float("inf"), -float("inf"), True, [0.0]])
def test_time_must_be_a_real_finite_or_nan_number(t):
    J, R = _progs("chem")
    u = _point(R)
    with pytest.raises(JacError) as e:
        R.eval_into(u, R.p0, t, None, np.zeros_like(u))
    assert _code(e) == "bad_argument"
    plan = J.plan(Csr())
    with pytest.raises(JacError) as e:
        J.eval_into(plan, u, J.p0, t, None, np.zeros(plan.out_size(CELLS)), J.new_workspace())
    assert _code(e) == "bad_argument"


def test_real_time_spellings_are_accepted():
    J, R = _progs("chem")
    u = _point(R)
    ref = R.eval_into(u, R.p0, 0.0, None, np.zeros_like(u))
    for t in (0, np.float32(0), np.int64(0), np.array(0.0), float("nan")):
        assert np.array_equal(R.eval_into(u, R.p0, t, None, np.zeros_like(u)), ref)


def test_complex_masked_and_read_only_arguments_are_refused():
    J, R = _progs("chem")
    u = _point(R)
    plan = J.plan(Csr())
    ws = J.new_workspace()
    o = np.zeros(plan.out_size(CELLS))
    bad_u = [u.astype(complex), np.ma.masked_array(u, mask=np.zeros(u.size, bool)), u.tolist()]
    for x in bad_u:
        with pytest.raises(JacError) as e:
            R.eval_into(x, R.p0, 0.0, None, np.zeros(u.size))
        assert _code(e) == "bad_argument"
        with pytest.raises(JacError) as e:
            J.eval_into(plan, x, J.p0, 0.0, None, o, ws)
        assert _code(e) == "bad_argument"
    for p in (R.p0.astype(complex), np.ma.masked_array(R.p0), "12", ["a", "b"], None, [1.0]):
        with pytest.raises(JacError) as e:
            R.eval_into(u, p, 0.0, None, np.zeros(u.size))
        assert _code(e) == "bad_argument", p
    ro = np.zeros(u.size)
    ro.flags.writeable = False
    with pytest.raises(JacError) as e:
        R.eval_into(u, R.p0, 0.0, None, ro)
    assert _code(e) == "bad_argument" and "read-only" in e.value.message
    ro2 = np.zeros(plan.out_size(CELLS))
    ro2.flags.writeable = False
    with pytest.raises(JacError) as e:
        J.eval_into(plan, u, J.p0, 0.0, None, ro2, ws)
    assert _code(e) == "bad_argument"
    J.eval_into(plan, u, J.p0, 0.0, None, o, ws)
    for call in (lambda: J.apply(plan, ws, u, ro), lambda: J.apply_transpose(plan, ws, u, ro),
                 lambda: J.contract(plan, ws, u, u.copy(), ro)):
        with pytest.raises(JacError) as e:
            call()
        assert _code(e) == "bad_argument" and "read-only" in e.value.message


@pytest.mark.parametrize("lanes", [2.5, "3", True, 0, -1, [3], 3.0])
def test_lane_counts_must_be_positive_integers(lanes):
    J, R = _progs("chem")
    with pytest.raises(JacError) as e:
        J.new_workspace(lanes)
    assert _code(e) == "bad_argument"
    with pytest.raises(JacError) as e:
        R.new_buffers(lanes)
    assert _code(e) == "bad_argument"


# ---------------------------------------------------------------- item 8: lane limit

def test_a_workspace_over_the_memory_limit_is_refused_with_its_size():
    J, R = _progs("chem")
    with pytest.raises(JacError) as e:
        J.new_workspace(10 ** 13)                       # more than any machine's memory
    assert _code(e) == "bad_argument" and "bytes" in e.value.message
    from esmjac.runtime import checks
    checks.set_workspace_limit(1 << 20)
    try:
        with pytest.raises(JacError) as e:
            J.new_workspace(10 ** 5)
        assert f"{(12 * J.n_fields + 8 * 5) * 10 ** 5:,}" in e.value.message
        with pytest.raises(JacError):
            R.new_buffers(10 ** 5)
        assert J.new_workspace(100).lanes == 100
    finally:
        checks.set_workspace_limit(None)


def test_the_limit_can_be_set_from_the_environment(monkeypatch):
    J, _ = _progs("chem")
    monkeypatch.setenv("ESMJAC_WORKSPACE_LIMIT", "4096")
    with pytest.raises(JacError):
        J.new_workspace(1000)
    monkeypatch.setenv("ESMJAC_WORKSPACE_LIMIT", "lots")
    with pytest.raises(JacError) as e:
        J.new_workspace(10)
    assert _code(e) == "bad_option"


# ---------------------------------------------------------------- item 7: non-finite RHS

def _singular_doc() -> dict:
    """Four species, each with a singular right-hand side at one point:
    D(A) = log(A), D(B) = k1/B, D(C) = sqrt(C), D(E) = exp(E) + t k2 E."""
    doc = chem(cells=2)
    m = doc["models"]["M"]
    cell = m["equations"][0]["rhs"]

    def cellwise(body):
        return {**copy.deepcopy(cell), "expr": body}

    def idx(v):
        return {"op": "index", "args": [v, "i"]}
    m["variables"] = {n: {"type": "unknown", "shape": ["cell"], "default": 1.0} for n in "ABCE"}
    m["variables"].update({"k1": {"type": "parameter", "default": 1.0}, "k2": {"type": "parameter", "default": 1.0}})
    rhs = {"A": {"op": "log", "args": [idx("A")]},
           "B": {"op": "/", "args": ["k1", idx("B")]},
           "C": {"op": "sqrt", "args": [idx("C")]},
           "E": {"op": "+", "args": [{"op": "exp", "args": [idx("E")]}, {"op": "*", "args": ["t", "k2", idx("E")]}]}}
    m["equations"] = [{"lhs": {"op": "D", "args": [n], "wrt": "t"}, "rhs": cellwise(e)} for n, e in rhs.items()]
    return doc


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_rhs_reports_a_non_finite_value_from_finite_inputs(dtype):
    R = _progs_singular()[1]
    base = np.ones(8, dtype=dtype)
    R.eval_into(base, R.p0, 0.0, None, np.zeros(8, dtype))              # finite: fine
    for pos, val in ((0, 0.0), (2, 0.0), (5, -1.0), (7, 1000.0 if dtype == np.float64 else 100.0)):
        u = base.copy()
        u[pos] = val
        with pytest.raises(JacError) as e:
            R.eval_into(u, R.p0, 0.0, None, np.zeros(8, dtype))
        assert _code(e) == "evaluation_error", pos
        assert f"position {pos}" in e.value.message and R.names[pos] in e.value.message
    u = base.copy()
    u[0] = np.nan                                   # non-finite in: the caller's business
    assert np.isnan(R.eval_into(u, R.p0, 0.0, None, np.zeros(8, dtype))[0])


def test_t_nan_is_reported_as_such():
    J, R = _progs_singular()
    u = np.ones(8)
    with pytest.raises(JacError) as e:
        R.eval_into(u, R.p0, float("nan"), None, np.zeros(8))
    assert _code(e) == "evaluation_error" and "`t` is NaN" in e.value.message
    plan = J.plan(Csr())
    with pytest.raises(JacError) as e:           # ∂f_E/∂E = exp(E) + t k2
        J.eval_into(plan, u, J.p0, float("nan"), None, np.zeros(plan.out_size(2)), J.new_workspace())
    assert _code(e) == "evaluation_error" and "`t` is NaN" in e.value.message


def _progs_singular():
    if "singular" not in _P:
        doc = _singular_doc()
        _P["singular"] = (JacobianProgram.build(doc), RhsProgram.build(doc))
    return _P["singular"]
