"""The ``sundials.cvode`` / ``sundials.ida`` adapters (scikits.odes).

Every configuration (CVODE dense + analytic jacfn, CVODE GMRES + block or
banded preconditioner, IDA dense + jacfn, IDA GMRES) reaches the tight
SciPy Radau solution; the callables are checked one by one against the
assembled Jacobian; ``jtv`` is ``Jᵀλ``; a missing scikits.odes is refused
with ``adapter_unavailable``. These tests run wherever scikits.odes is
installed, and must run in CI (libsundials-dev is installed there).
"""
from __future__ import annotations

import importlib.resources
import os
import sys
import warnings

import numpy as np

from esmjac.models.gridded import column_model, diffusion_model
import pytest

from esmjac.errors import JacError

warnings.filterwarnings("ignore", message=".*aggregate.*")

try:
    import scikits.odes  # noqa: F401
    HAVE_ODES = True
except ImportError:          # pragma: no cover - CI has it
    HAVE_ODES = False
    if os.environ.get("CI"):
        raise RuntimeError("CI must have scikits.odes installed (pip install 'esmjac[sundials]')")

needs_odes = pytest.mark.skipif(not HAVE_ODES,
                                reason="scikits.odes is not installed (pip install 'esmjac[sundials]')")

from esmjac.adapters import sundials  # noqa: E402  (imports no solver package)
from esmjac.adapters.scipy import ivp  # noqa: E402

TROPO = str(importlib.resources.files("esmjac") / "models" / "tropo12.esm")
FJ = np.linspace(0.2, 1.5, 8)
TOUT = np.linspace(0.0, 2 * 3600.0, 5)
RTOL, ATOL = 1e-8, 1e-3
FLOOR = 1e3                  # relative-error floor (molec cm^-3) for near-zero species


def _y0(seed=0):
    base = ivp(TROPO)
    return base.y0 * np.random.default_rng(seed).uniform(0.5, 2.0, size=base.y0.shape)


@pytest.fixture(scope="module")
def y0():
    return _y0()


@pytest.fixture(scope="module")
def reference(y0):
    """Tight SciPy Radau (analytic sparse Jacobian) at the output times."""
    prob = ivp(TROPO, method="Radau", forcing={"fj": FJ}, y0=y0)
    sol = prob.solve((TOUT[0], TOUT[-1]), t_eval=TOUT, rtol=1e-11, atol=1e-6)
    assert sol.status == 0
    return sol.y.T


@pytest.fixture(scope="module")
def column():
    doc = column_model(2, 3)
    base = ivp(doc)
    y = base.y0 * np.random.default_rng(5).uniform(0.5, 2.0, size=base.y0.shape)
    fj = np.linspace(0.3, 1.4, 6).reshape(2, 3)
    ref = ivp(doc, method="Radau", y0=y, forcing={"fj": fj}).solve(
        (TOUT[0], TOUT[-1]), t_eval=TOUT, rtol=1e-11, atol=1e-6)
    assert ref.status == 0
    return doc, y, fj, ref.y.T


def _rel(y, ref):
    return float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), FLOOR)))


def _dense_j(prob, t, y):
    return prob.jac_csr(t, y).toarray()


CONFIGS = {
    "cvode-dense-jacfn": (sundials.cvode, dict(linsolver="dense")),
    "cvode-dense-dq": (sundials.cvode, dict(linsolver="dense", jacobian=False)),
    "cvode-spgmr-block": (sundials.cvode, dict(linsolver="spgmr", precond="block")),
    "cvode-spgmr-banded": (sundials.cvode, dict(linsolver="spgmr", precond="banded")),
    "cvode-spgmr-block-lagged": (sundials.cvode, dict(linsolver="spgmr", precond="block", jtimes="setup")),
    "ida-dense-jacfn": (sundials.ida, dict(linsolver="dense")),
    "ida-spgmr": (sundials.ida, dict(linsolver="spgmr", maxl=15)),
}


# ------------------------------------------------------------------ solves

@needs_odes
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_reaches_radau_solution(name, y0, reference):
    make, kw = CONFIGS[name]
    prob = make(TROPO, rtol=RTOL, atol=ATOL, forcing={"fj": FJ}, y0=y0, max_steps=20000, **kw)
    res = prob.solve(TOUT)
    assert res.flag == 0, res.message
    assert np.allclose(res.values.t, TOUT)
    assert _rel(np.asarray(res.values.y), reference) < 1e-5
    c = prob.counters()
    assert c["nfev"] > 0
    if kw["linsolver"] == "dense":
        assert (c["njev"] > 0) == kw.get("jacobian", True)
    if kw["linsolver"] == "spgmr":
        assert c["njtimes"] > 0
        assert (c["njtsetup"] > 0) == (kw.get("jtimes", "newton") == "newton")
    if "precond" in kw:
        assert c["npsetup"] > 0 and c["npsolve"] > 0 and c["npeval"] <= c["npsetup"]
        st = prob.stats()
        assert st["NumPrecSolves"] == c["npsolve"] and st["NumJtimesEvals"] == c["njtimes"]


@needs_odes
def test_analytic_jacfn_needs_fewer_rhs_calls(y0):
    kw = dict(rtol=RTOL, atol=ATOL, forcing={"fj": FJ}, y0=y0, max_steps=20000)
    a = sundials.cvode(TROPO, linsolver="dense", **kw)
    d = sundials.cvode(TROPO, linsolver="dense", jacobian=False, **kw)
    ra, rd = a.solve(TOUT), d.solve(TOUT)
    assert ra.flag == 0 and rd.flag == 0
    assert a.jacfn is not None and d.jacfn is None
    # DQ: n extra f calls per Jacobian, on top of the integrator's own.
    assert d.nfev > d.stats()["NumRhsEvals"] + a.n
    assert a.nfev <= a.stats()["NumRhsEvals"] + 1
    assert a.nfev < d.nfev


@needs_odes
@pytest.mark.parametrize("precond", ["block", "banded"])
def test_column_model_preconditioned(precond, column):
    doc, y, fj, ref = column
    prob = sundials.cvode(doc, linsolver="spgmr", precond=precond, rtol=RTOL, atol=ATOL, y0=y,
                          forcing={"fj": fj}, max_steps=20000)
    assert prob.jacobian.kind == "global"
    res = prob.solve(TOUT)
    assert res.flag == 0, res.message
    assert _rel(np.asarray(res.values.y), ref) < 1e-5


@needs_odes
def test_band_linsolver_and_refusal():
    with pytest.raises(JacError) as exc:
        sundials.cvode(TROPO, linsolver="band")
    assert exc.value.code == "bad_option" and "spgmr" in exc.value.message
    doc = diffusion_model(12)
    prob = sundials.cvode(doc, linsolver="band", rtol=1e-9, atol=1e-12)
    assert (prob.options["lband"], prob.options["uband"]) == (1, 1)
    res = prob.solve(np.linspace(0.0, 1.0, 3))
    ref = ivp(doc, method="Radau").solve((0.0, 1.0), rtol=1e-11, atol=1e-13).y[:, -1]
    assert res.flag == 0
    np.testing.assert_allclose(res.values.y[-1], ref, rtol=1e-6)


# ------------------------------------------------------------------ callables

@needs_odes
def test_cvode_jacfn_and_jv(y0):
    prob = sundials.cvode(TROPO, linsolver="dense", forcing={"fj": FJ}, y0=y0)
    t, y = 100.0, y0 * 1.1
    J = np.full((prob.n, prob.n), 7.0)                   # stale values must be overwritten
    assert prob.jacfn(t, y, prob.f(t, y), J) == 0
    ref = _dense_j(prob, t, y)
    from esmjac import assemble
    asm = assemble(TROPO, u=dict(zip(prob.names, y)), p={"fj": FJ}, t=t).matrix.toarray()
    np.testing.assert_allclose(ref, asm, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(J, ref)
    v = np.random.default_rng(1).standard_normal(prob.n)
    np.testing.assert_allclose(prob.jv(t, y, v), ref @ v, rtol=1e-12, atol=1e-12 * np.abs(ref).max())

    k = sundials.cvode(TROPO, linsolver="spgmr", forcing={"fj": FJ}, y0=y0)
    assert k.jacfn is None and k.jac_times_vecfn is not None and k.prec_setupfn is None
    Jv = np.empty(k.n)
    assert k.jac_times_setupfn(t, y, k.f(t, y)) == 0
    assert k.jac_times_vecfn(v, Jv, t, y) == 0
    np.testing.assert_allclose(Jv, ref @ v, rtol=1e-12, atol=1e-12 * np.abs(ref @ v).max())


@needs_odes
def test_ida_jacfn_sign_convention(y0):
    prob = sundials.ida(TROPO, forcing={"fj": FJ}, y0=y0)
    t, y, cj = 50.0, y0 * 0.9, 123.0
    f = prob.f(t, y)
    yp = f + 1.0
    res = np.empty(prob.n)
    assert prob.resfn(t, y, yp, res) == 0
    np.testing.assert_allclose(res, yp - f, rtol=1e-15)
    J = np.zeros((prob.n, prob.n))
    assert prob.jacfn(t, y, yp, res, cj, J) == 0
    np.testing.assert_array_equal(J, cj * np.eye(prob.n) - _dense_j(prob, t, y))

    k = sundials.ida(TROPO, linsolver="spgmr", forcing={"fj": FJ}, y0=y0)
    v = np.random.default_rng(2).standard_normal(k.n)
    Jv = np.empty(k.n)
    assert k.jac_times_setupfn(t, y, yp, res, cj) == 0
    assert k.jac_times_vecfn(t, y, yp, res, v, Jv, cj) == 0
    expect = cj * v - _dense_j(prob, t, y) @ v
    np.testing.assert_allclose(Jv, expect, rtol=1e-10, atol=1e-12 * np.abs(expect).max())


@needs_odes
def test_jtv_is_transpose_product(y0):
    prob = sundials.cvode(TROPO, forcing={"fj": FJ}, y0=y0)
    t, y = 10.0, y0 * 1.2
    lam = np.random.default_rng(3).standard_normal(prob.n)
    J = _dense_j(prob, t, y)
    np.testing.assert_allclose(prob.jtv(t, y, lam), J.T @ lam, rtol=1e-12,
                               atol=1e-12 * np.abs(J.T @ lam).max())


@needs_odes
@pytest.mark.parametrize("precond", ["block", "banded"])
def test_preconditioner_solves(precond, y0, column):
    gamma = 35.0
    rng = np.random.default_rng(4)
    cases = [(TROPO, {"fj": FJ}, y0)]
    doc, yc, fj, _ = column
    cases.append((doc, {"fj": fj}, yc))
    for src, forcing, y in cases:
        prob = sundials.cvode(src, linsolver="spgmr", precond=precond, forcing=forcing, y0=y)
        flag = type("Flag", (), {"value": None})()
        assert prob.prec_setupfn(0.0, y, False, flag, gamma) == 0 and flag.value is True
        r = rng.standard_normal(prob.n)
        z = np.empty(prob.n)
        assert prob.prec_solvefn(0.0, y, r, z, gamma, 1e-3, 1) == 0
        J = _dense_j(prob, 0.0, y)
        if precond == "block":               # same-grid-point couplings only
            N = prob.n // 15
            same = (np.arange(prob.n)[:, None] % N) == (np.arange(prob.n)[None, :] % N)
            J = np.where(same, J, 0.0)
        np.testing.assert_allclose((np.eye(prob.n) - gamma * J) @ z, r, atol=1e-9 * np.abs(r).max())
        # jok=True reuses the saved Jacobian (new gamma only).
        assert prob.prec_setupfn(0.0, y * 3.0, True, flag, gamma / 2) == 0 and flag.value is False
        assert prob.counters()["npeval"] == 1


@needs_odes
def test_block_preconditioner_on_lane_tiles_gives_the_untiled_bits(y0):
    """The block preconditioner factors and solves the tiled default layout
    in place: its solutions equal, bit for bit, those of the lanes-fastest
    blocks (tile=None) and of tiles of 5 (8 cells: a full and a partial
    tile), and solve (I - gamma*J_block) z = r (dense oracle)."""
    from esmjac.adapters.sundials import _BlockPC
    from esmjac.layouts import LaneSparseBlocks
    prob = sundials.cvode(TROPO, linsolver="spgmr", precond="block", forcing={"fj": FJ}, y0=y0)
    pc = prob._state.pc
    assert pc.plan.tiled and pc.W is not None and pc.J.size == pc.plan.out_size(8)
    flat = _BlockPC(prob.rhs, prob.jacobian, prob.plan, LaneSparseBlocks(tile=None))
    five = _BlockPC(prob.rhs, prob.jacobian, prob.plan, LaneSparseBlocks(tile=5))
    assert flat.plan.tile_width(8) == 8 and five.W == 5          # one tile of all lanes: q*L + l
    rng = np.random.default_rng(7)
    n, y = prob.n, y0 * 1.3
    J = _dense_j(prob, 0.0, y)
    N = n // 15
    J = np.where((np.arange(n)[:, None] % N) == (np.arange(n)[None, :] % N), J, 0.0)
    for gamma in (35.0, 900.0):
        zs = []
        for p in (pc, flat, five):
            p.evaluate(0.0, y, prob.p, prob.forcing)
            p.factor(gamma)
        r = rng.standard_normal(n)
        for p in (pc, flat, five):
            z = np.full(n, np.nan)
            p.solve(r, z)
            zs.append(z)
        assert np.array_equal(zs[0], zs[1]) and np.array_equal(zs[0], zs[2])
        np.testing.assert_allclose((np.eye(n) - gamma * J) @ zs[0], r, atol=1e-9 * np.abs(r).max())


# ------------------------------------------------------------------ refusals, errors

@needs_odes
@pytest.mark.parametrize("make,kwargs", [
    (sundials.cvode, dict(linsolver="dense", precond="block")),
    (sundials.cvode, dict(linsolver="spgmr", precond="ilu")),
    (sundials.cvode, dict(linsolver="klu")),
    (sundials.cvode, dict(linsolver="spgmr", axis=0)),
    (sundials.ida, dict(linsolver="spgmr", precond="block")),
    (sundials.cvode, dict(jacfn=lambda *a: 0)),
    (sundials.cvode, dict(linsolver="spgmr", jtimes="setup")),
    (sundials.cvode, dict(linsolver="spgmr", jtimes="always")),
    (sundials.cvode, dict(no_such_option=1)),
])
def test_bad_options(make, kwargs):
    with pytest.raises(JacError) as exc:
        make(TROPO, **kwargs)
    assert exc.value.code == "bad_option"


@needs_odes
def test_callback_errors_are_reraised(y0):
    prob = sundials.cvode(TROPO, forcing={"fj": FJ}, y0=y0, max_steps=20000)
    out = np.empty(3)
    assert prob.rhsfn(0.0, np.ones(3), out) == -1       # wrong length: refused inside
    assert isinstance(prob._state.error, JacError)
    with pytest.raises(JacError) as exc:
        prob.solve(TOUT, y0=np.ones(5))
    assert exc.value.code == "bad_argument"
    assert prob.solve(TOUT).flag == 0                     # usable again


@needs_odes
def test_plugin_create(y0):
    from esmjac import plugins
    prob = plugins.create("sundials.cvode", TROPO, linsolver="spgmr", precond="block")
    assert isinstance(prob, sundials.SundialsProblem) and prob.kind == "cvode"
    prob = plugins.create("sundials.ida", TROPO)
    assert prob.kind == "ida" and prob.jacfn is not None


@pytest.mark.parametrize("factory", ["cvode", "ida"])
def test_adapter_unavailable_without_scikits_odes(factory, monkeypatch):
    monkeypatch.setitem(sys.modules, "scikits.odes", None)   # import now raises ImportError
    with pytest.raises(JacError) as exc:
        getattr(sundials, factory)(TROPO)
    assert exc.value.code == "adapter_unavailable"
    assert "esmjac[sundials]" in exc.value.message and "scipy.ivp" in exc.value.message


# ------------------------------------------------------------------ defaults

@needs_odes
def test_auto_linsolver_on_block_diagonal_chemistry(y0):
    prob = sundials.cvode(TROPO, forcing={"fj": FJ}, y0=y0, rtol=1e-6, atol=1e3)
    assert (prob.linsolver, prob.precond) == ("spgmr", "block")
    assert "block-diagonal" in prob.note and "spgmr" in prob.note
    res = prob.solve(np.linspace(0.0, 3600.0, 3))
    assert res.flag == 0
    ref = sundials.cvode(TROPO, linsolver="dense", forcing={"fj": FJ}, y0=y0, rtol=1e-9, atol=1.0,
                         max_steps=100000)
    yr = ref.solve(np.linspace(0.0, 3600.0, 3)).values.y[-1]
    assert np.max(np.abs(res.values.y[-1] - yr) / np.maximum(np.abs(yr), 1e3)) < 1e-3
    st = prob.stats()
    assert st["NumSteps"] > 0 and st["npsetup"] > 0 and st["njev"] == 0


@needs_odes
def test_auto_linsolver_elsewhere_is_dense_and_says_why():
    prob = sundials.cvode(diffusion_model(12))
    assert prob.linsolver == "dense" and "not block-diagonal" in prob.note
    q = sundials.ida(TROPO)
    assert q.linsolver == "dense" and "preconditioner" in q.note


@needs_odes
def test_unavailable_linsolvers_are_refused_with_what_there_is():
    have = sundials.available_linsolvers("cvode")
    assert "dense" in have and "spgmr" in have
    for ls in ("lapackdense", "lapackband"):
        if ls in have:
            continue
        with pytest.raises(JacError) as e:
            sundials.cvode(TROPO, linsolver=ls)
        assert e.value.code == "adapter_unavailable"
        assert ", ".join(have) in e.value.message
    if "spbcg" not in sundials.available_linsolvers("ida"):
        with pytest.raises(JacError) as e:
            sundials.ida(TROPO, linsolver="spbcg")
        assert e.value.code == "adapter_unavailable"


@needs_odes
def test_ida_reports_statistics(y0):
    prob = sundials.ida(TROPO, forcing={"fj": FJ}, y0=y0, rtol=1e-6, atol=1e3)
    assert prob.solve(np.linspace(0.0, 600.0, 3)).flag == 0
    st = prob.stats()
    assert st["NumResEvals"] == prob.nfev > 0 and st["NumJacEvals"] > 0
    assert isinstance(st["NumSteps"], int) and 0 < st["NumSteps"] <= st["NumResEvals"]


@needs_odes
def test_dict_overrides_mean_the_same_as_in_scipy(y0):
    from esmjac.adapters.scipy import ivp
    s = ivp(TROPO, p={"fj": FJ, "T": 290.0}, y0={"O3": 2e12})
    c = sundials.cvode(TROPO, p={"fj": FJ, "T": 290.0}, y0={"O3": 2e12})
    np.testing.assert_array_equal(s.p, c.p)
    np.testing.assert_array_equal(s.forcing, c.forcing)
    np.testing.assert_array_equal(s.y0, c.y0)
    for bad in (dict(p={"Nope": 1.0}), dict(y0={"fj": 1.0})):
        with pytest.raises(JacError) as e1:
            ivp(TROPO, **bad)
        with pytest.raises(JacError) as e2:
            sundials.cvode(TROPO, **bad)
        assert e1.value.code == e2.value.code == "bad_argument"
        assert e1.value.message == e2.value.message


# ------------------------------------------------------------------ early stops, big problems

@needs_odes
@pytest.mark.parametrize("make", [sundials.cvode, sundials.ida])
def test_an_early_stop_is_a_typed_error(make, y0, reference):
    prob = make(TROPO, forcing={"fj": FJ}, y0=y0, rtol=RTOL, atol=ATOL, max_steps=40)
    with pytest.raises(JacError) as exc:
        prob.solve(TOUT)
    e = exc.value
    assert e.code == "solver_failed" and isinstance(e, RuntimeError)
    name = "CVODE" if make is sundials.cvode else "IDA"
    assert f"{name} stopped at t = " in e.message and "flag -1" in e.message
    assert "max_steps=40" in e.message
    reached = float(e.message.split("stopped at t = ")[1].split()[0])
    assert TOUT[0] < reached < TOUT[-1]
    res = e.result
    assert res.flag < 0 and 1 <= len(res.values.t) < len(TOUT)
    k = len(res.values.t)
    assert np.allclose(res.values.t, TOUT[:k])
    assert _rel(np.asarray(res.values.y), reference[:k]) < 1e-5   # what it reached is right
    again = prob.solve(TOUT, allow_failure=True)          # explicit: the flag, no raise
    assert again.flag < 0 and len(again.values.t) == k


@needs_odes
def test_default_step_limit_is_for_chemistry(y0, reference):
    # SUNDIALS' own 500 steps per output interval stop this 2-hour run early
    # at rtol 1e-8; the adapter's default does not.
    prob = sundials.cvode(TROPO, forcing={"fj": FJ}, y0=y0, rtol=RTOL, atol=ATOL)
    assert prob.options["max_steps"] == sundials.MAX_STEPS >= 10_000
    res = prob.solve(TOUT[[0, -1]])
    assert res.flag == 0
    assert _rel(np.asarray(res.values.y)[-1], reference[-1]) < 1e-5
    assert prob.stats()["NumSteps"] > 500


@needs_odes
def test_cvode_above_the_serial_threshold_with_default_threads(y0, reference, monkeypatch):
    """Above the serial threshold with threads="auto": the thread count is
    measured after the callbacks are made (it used to reach numba as the
    string "measure"). The threshold (runtime.threads.SERIAL_BELOW, read
    when the problem is built) is lowered below this problem's unknowns, so
    the 8-cell problem takes the route of one with 20,000+ unknowns."""
    from esmjac.runtime import threads
    monkeypatch.setattr(threads, "SERIAL_BELOW", y0.size - 1)
    assert threads.thread_count("auto", y0.size) == "measure"
    prob = sundials.cvode(TROPO, forcing={"fj": FJ}, y0=y0, rtol=1e-6, atol=ATOL)
    assert isinstance(prob._state.threads, int)
    res = prob.solve(TOUT[:2])
    assert res.flag == 0
    assert _rel(np.asarray(res.values.y)[-1], reference[1]) < 1e-3


@needs_odes
@pytest.mark.parametrize("make", [sundials.cvode, sundials.ida])
def test_negative_read_as_zero_reads_negative_states_as_zero(make, y0):
    """negative="read_as_zero": the callbacks evaluate the RHS at max(y, 0)
    in a copy, never touching the solver's y; off by default. The deprecated
    nonnegative=True says the same, with a DeprecationWarning; the leaf's
    values ("fail", "clip") are refused with a typed error."""
    y = y0.copy()
    y[::7] *= -1.0
    want_clipped = ivp(TROPO, forcing={"fj": FJ}, y0=y0).fun(0.0, np.maximum(y, 0.0))
    want_raw = ivp(TROPO, forcing={"fj": FJ}, y0=y0).fun(0.0, y)
    assert not np.allclose(want_clipped, want_raw)
    for kw, want in ((dict(negative="read_as_zero"), want_clipped), (dict(), want_raw),
                     (dict(nonnegative=True), want_clipped)):
        if "nonnegative" in kw:
            with pytest.warns(DeprecationWarning, match="read_as_zero"):
                prob = make(TROPO, forcing={"fj": FJ}, y0=y0, **kw)
        else:
            prob = make(TROPO, forcing={"fj": FJ}, y0=y0, **kw)
        seen = y.copy()
        out = np.empty_like(y)
        if make is sundials.cvode:
            assert prob.rhsfn(0.0, seen, out) == 0
        else:
            assert prob.resfn(0.0, seen, np.zeros_like(y), out) == 0
            out = -out                              # F = y' - f with y' = 0
        np.testing.assert_array_equal(seen, y)      # the solver's state is untouched
        np.testing.assert_allclose(out, want, rtol=1e-13)
        assert prob.counters()["nnegative"] == (1 if kw else 0)
    for bad in (dict(negative="fail"), dict(negative=True), dict(nonnegative="yes"),
                dict(negative="read_as_zero", nonnegative=True)):
        with pytest.raises(JacError) as exc:
            make(TROPO, **bad)
        assert exc.value.code == "bad_option"

_SUNDIALS_FIRST_SOLVES = r"""
import numpy as np
from esmjac.adapters.sundials import cvode, ida
from esmjac.models.gridded import gridded_tropo12
doc, forcing, y0 = gridded_tropo12(8)
ref = None
out = {}
for kind, ls in (("cvode", "auto"), ("cvode", "dense"), ("ida", "auto"), ("ida", "spgmr")):
    make = cvode if kind == "cvode" else ida
    prob = make(doc, forcing=forcing, y0=y0, linsolver=ls, rtol=1e-8, atol=1e-3)
    compiled()                                   # the build's own compiles
    res = prob.solve(np.linspace(0.0, 600.0, 4))
    y = np.asarray(res.values.y)[-1]
    ref = y if ref is None else ref
    out[f"{kind} {ls}"] = [compiled(), float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), 1e3)))]
print("RESULT " + json.dumps(out))
"""


@needs_odes
@pytest.mark.slow
def test_no_numba_specialization_after_build(tmp_path):
    """cvode()/ida() compile what their first solve runs: in a fresh process
    no Numba dispatcher resolves a new signature inside the first solve of
    CVODE (spgmr + block preconditioner; dense) or IDA (dense; spgmr). Before,
    the callbacks' writable p/forcing recompiled the RHS drive, and the
    lazily bound dense/J·v Jacobian calls compiled their kernels (drive,
    lane_gather) inside the first solve. The four solutions agree."""
    from tests.support.child import run_child
    from tests.support.compiles import SPY
    res = run_child(SPY + _SUNDIALS_FIRST_SOLVES, os.environ.get("ESMJAC_CACHE_DIR", tmp_path), timeout=900)
    for route, (new, diff) in res.items():
        assert new == [], f"{route}: kernels specialized inside the first solve: {new}"
        assert diff < 1e-5, f"{route} differs from cvode auto by {diff:.1e}"
