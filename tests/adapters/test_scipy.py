"""The ``scipy.ivp`` adapter: solve_ivp callables from compiled programs.

Checked: ``jac(t, y)`` equals the reference assembly (``esmjac.assemble``)
at a point, for a cell program and a gridded global one; BDF with the
analytic Jacobian reaches the finite-difference / tight Radau solution with
far fewer ``fun`` calls; LSODA's dense and packed banded forms; refusals.
"""
from __future__ import annotations

import importlib.resources
import warnings
import weakref

import numpy as np

from esmjac.models.gridded import column_model, diffusion_model
import pytest
import scipy.sparse as sp

from esmjac import assemble
from esmjac.adapters.scipy import IvpProblem, ivp
from esmjac.errors import JacError

warnings.filterwarnings("ignore", message=".*aggregate.*")

TROPO = str(importlib.resources.files("esmjac") / "models" / "tropo12.esm")
T_END = 2 * 3600.0
RTOL, ATOL = 1e-7, 1e-3


def varied(prob: IvpProblem, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return prob.y0 * rng.uniform(0.5, 2.0, size=prob.y0.shape)


FJ = np.linspace(0.2, 1.5, 8)


@pytest.fixture(scope="module")
def tropo():
    base = ivp(TROPO)
    return ivp(TROPO, forcing={"fj": FJ}, y0=varied(base))


@pytest.fixture(scope="module")
def reference(tropo):
    """A tight Radau solve (analytic Jacobian) of the varied 8-cell problem."""
    prob = ivp(TROPO, method="Radau", forcing={"fj": FJ}, y0=tropo.y0)
    sol = prob.solve((0.0, T_END), rtol=1e-11, atol=1e-6)
    assert sol.status == 0
    return sol.y[:, -1]


def _close(y, ref, rtol):
    scale = np.maximum(np.abs(ref), ATOL / RTOL)
    return float(np.max(np.abs(y - ref) / scale)) < rtol


# ------------------------------------------------------------------ Jacobian values

def test_problem_shape(tropo):
    n = 15 * 8
    assert tropo.y0.shape == (n,) and len(tropo.names) == n
    assert tropo.names[0] == "Chem.O3[1]" and tropo.names[8] == "Chem.O[1]"
    assert tropo.p.shape == (len(tropo.rhs.param_names),)
    assert np.array_equal(tropo.forcing, FJ)
    assert sp.issparse(tropo.jac_sparsity) and tropo.jac_sparsity.format == "csc"
    assert tropo.jac_sparsity.shape == (n, n) and tropo.jac_sparsity.nnz == tropo.plan.info["nnz"]
    assert tropo.rhs.kind == "cell" and tropo.jacobian.wrt == "states"


def test_jac_equals_assemble_cell(tropo):
    y = tropo.y0
    J = tropo.jac(30.0, y)
    assert sp.issparse(J) and J.format == "csc"
    ref = assemble(TROPO, u=dict(zip(tropo.names, y)), p={"fj": FJ}, t=30.0).matrix
    np.testing.assert_allclose(J.toarray(), ref.toarray(), rtol=1e-12, atol=0)
    # The pattern is what jac_sparsity announces.
    assert (abs(J) > 0).astype(int).multiply(1 - tropo.jac_sparsity.toarray()).sum() == 0


def test_jac_equals_assemble_global():
    doc = column_model(2, 3)
    prob = ivp(doc)
    assert prob.rhs.kind == "global"
    y = varied(prob, 3)
    ref = assemble(doc, u=dict(zip(prob.names, y))).matrix
    np.testing.assert_allclose(prob.jac(0.0, y).toarray(), ref.toarray(), rtol=1e-12, atol=0)


def test_fun_matches_rhs_program(tropo):
    y = tropo.y0
    out = np.empty_like(y)
    tropo.rhs.eval_into(y, tropo.p, 5.0, tropo.forcing, out)
    np.testing.assert_array_equal(tropo.fun(5.0, y), out)
    serial = ivp(TROPO, forcing={"fj": FJ}, y0=y, threads=1)
    free = ivp(TROPO, forcing={"fj": FJ}, y0=y, threads=None)
    np.testing.assert_array_equal(serial.fun(5.0, y), free.fun(5.0, y))
    np.testing.assert_array_equal(serial.jac(5.0, y).toarray(), free.jac(5.0, y).toarray())


# ------------------------------------------------------------------ solves

def test_bdf_analytic_matches_fd_with_fewer_calls(tropo, reference):
    tropo.reset_counters()
    a = tropo.solve((0.0, T_END), rtol=RTOL, atol=ATOL)
    nfev_a, njev_a = tropo.nfev, tropo.njev
    tropo.reset_counters()
    f = tropo.solve((0.0, T_END), rtol=RTOL, atol=ATOL, jac=None)
    nfev_f, njev_f = tropo.nfev, tropo.njev
    assert a.status == 0 and f.status == 0
    assert njev_a == a.njev > 0 and njev_f == 0
    assert nfev_a == a.nfev                               # every fun call is solve_ivp's own
    assert nfev_f >= f.nfev + f.njev * tropo.n            # FD columns cost n calls per Jacobian
    assert nfev_a < nfev_f - f.njev * tropo.n // 2
    assert _close(a.y[:, -1], f.y[:, -1], 1e-4)
    assert _close(a.y[:, -1], reference, 1e-4)
    assert _close(f.y[:, -1], reference, 1e-4)


def test_radau_sparse(tropo, reference):
    prob = ivp(TROPO, method="Radau", forcing={"fj": FJ}, y0=tropo.y0)
    sol = prob.solve((0.0, T_END), rtol=RTOL, atol=ATOL)
    assert sol.status == 0 and prob.njev > 0
    assert sp.issparse(prob.jac(0.0, prob.y0))
    assert _close(sol.y[:, -1], reference, 1e-4)


def test_lsoda_dense(tropo, reference):
    prob = ivp(TROPO, method="LSODA", forcing={"fj": FJ}, y0=tropo.y0)
    J = prob.jac(1.0, prob.y0)
    assert isinstance(J, np.ndarray) and J.shape == (prob.n, prob.n)
    np.testing.assert_array_equal(J, tropo.jac_csr(1.0, prob.y0).toarray())
    sol = prob.solve((0.0, T_END), rtol=RTOL, atol=ATOL)
    assert sol.status == 0 and prob.njev > 0
    assert _close(sol.y[:, -1], reference, 1e-4)


def test_lsoda_banded_packing():
    doc = diffusion_model(12)
    prob = ivp(doc, method="LSODA", banded=True)
    assert (prob.lband, prob.uband) == (1, 1)
    y = prob.y0 * 1.3
    packed = prob.jac(0.5, y)
    dense = ivp(doc, method="LSODA").jac(0.5, y)
    n = prob.n
    assert packed.shape == (prob.lband + prob.uband + 1, n)
    rebuilt = np.zeros((n, n))
    for i in range(n):
        for j in range(max(0, i - prob.lband), min(n, i + prob.uband + 1)):
            rebuilt[i, j] = packed[prob.uband + i - j, j]
    np.testing.assert_array_equal(rebuilt, dense)
    # Band storage is scipy.linalg.solve_banded's: solving with it solves the dense system.
    from scipy.linalg import solve_banded
    b = np.arange(1.0, n + 1)
    M = np.eye(n) - 0.01 * dense
    Mb = -0.01 * packed
    Mb[prob.uband] += 1.0
    np.testing.assert_allclose(solve_banded((prob.lband, prob.uband), Mb, b), np.linalg.solve(M, b),
                               rtol=1e-12)
    ref = ivp(doc, method="Radau").solve((0.0, 2.0), rtol=1e-11, atol=1e-12).y[:, -1]
    sol = prob.solve((0.0, 2.0), rtol=1e-8, atol=1e-10)
    assert sol.status == 0 and prob.njev > 0
    np.testing.assert_allclose(sol.y[:, -1], ref, rtol=1e-5)


def test_banded_refused_for_unbanded_pattern():
    with pytest.raises(JacError) as exc:
        ivp(TROPO, method="LSODA", banded=True)
    assert exc.value.code == "bad_option"
    assert "BDF" in exc.value.message and "sparse" in exc.value.message


# ------------------------------------------------------------------ inputs, options, plugin

def test_inputs_by_name(tropo):
    prob = ivp(TROPO, p={"T": 280.0}, y0={"Chem.O3[2]": 7.0, "NO": 3.0}, forcing={"fj[3]": 0.25})
    i_t = prob.rhs.param_names.index("T")
    assert prob.p[i_t] == 280.0
    assert prob.y0[prob.names.index("Chem.O3[2]")] == 7.0
    assert all(prob.y0[i] == 3.0 for i, nm in enumerate(prob.names) if nm.startswith("Chem.NO["))
    assert prob.forcing[2] == 0.25 and prob.forcing[0] == 1.0
    full = ivp(TROPO, p=prob.p, y0=prob.y0, forcing=prob.forcing)
    np.testing.assert_array_equal(full.fun(0.0, full.y0), prob.fun(0.0, prob.y0))
    for bad in ({"nope": 1.0}, {"O3[9]": 1.0}):
        with pytest.raises(JacError) as exc:
            ivp(TROPO, y0=bad)
        assert exc.value.code == "bad_argument"
    with pytest.raises(JacError) as exc:
        ivp(TROPO, p=np.ones(3))
    assert exc.value.code == "bad_argument"


@pytest.mark.parametrize("kwargs", [dict(method="Euler"), dict(method="BDF", banded=True),
                                    dict(rtol=1e-6), dict(threads=0)])
def test_bad_options(kwargs):
    with pytest.raises(JacError) as exc:
        ivp(TROPO, **kwargs)
    assert exc.value.code == "bad_option"


def test_solve_refuses_another_method(tropo):
    with pytest.raises(JacError) as exc:
        tropo.solve((0.0, 1.0), method="LSODA")
    assert exc.value.code == "bad_option"


def test_explicit_method_gets_no_jacobian():
    prob = ivp(diffusion_model(12), method="RK45")
    sol = prob.solve((0.0, 0.01))
    assert sol.status == 0 and prob.njev == 0 and prob.nfev > 0
    # jac_csr still works on request (bound then): BDF's jac, in CSR form
    ref = ivp(diffusion_model(12)).jac(0.0, prob.y0).toarray()
    np.testing.assert_array_equal(prob.jac_csr(0.0, prob.y0).toarray(), ref)


def test_plugin_create():
    from esmjac import plugins
    prob = plugins.create("scipy.ivp", TROPO, method="Radau")
    assert isinstance(prob, IvpProblem) and prob.method == "Radau"


def test_jac_writes_csc_directly_and_shares_index_arrays(tropo):
    """jac's values come from a Csc plan (no permutation per call): they equal
    the CSR plan's values converted by SciPy; index arrays are shared and
    read-only, the values are fresh per call."""
    y = tropo.y0
    J1, J2 = tropo.jac(1.0, y), tropo.jac(1.0, y * 1.1)
    ref = tropo.jac_csr(1.0, y).tocsc()
    ref.sort_indices()
    assert np.array_equal(J1.indptr, ref.indptr) and np.array_equal(J1.indices, ref.indices)
    np.testing.assert_array_equal(J1.data, ref.data)
    assert np.shares_memory(J1.indices, J2.indices) and not J1.indices.flags.writeable
    assert not np.shares_memory(J1.data, J2.data)


def test_box_mechanism_through_ivp():
    """A box (0-D) mechanism runs through the adapter as a one-cell program
    (the Chapman cycle: 4 species, its kernels compile in about a second
    where tropo12's box took ~15 s of CPU)."""
    from esmjac.models.mechanism import box
    from tests.support.models import chapman
    doc = box(chapman(cells=1))
    prob = ivp(doc)
    assert prob.rhs.kind == "cell" and prob.n == 4
    J = prob.jac(0.0, prob.y0).toarray()
    ref = assemble(doc, u=dict(zip(prob.names, prob.y0))).matrix.toarray()
    np.testing.assert_allclose(J, ref, rtol=1e-12, atol=0)


# ------------------------------------------------------------------ one vocabulary

def test_per_cell_parameters_through_p_are_the_forcing_override():
    a = ivp(TROPO, p={"fj": FJ})
    b = ivp(TROPO, forcing={"fj": FJ})
    np.testing.assert_array_equal(a.forcing, b.forcing)
    np.testing.assert_array_equal(a.fun(0.0, a.y0), b.fun(0.0, b.y0))
    with pytest.raises(JacError) as e:
        ivp(TROPO, p={"fj": FJ}, forcing={"fj": FJ})
    assert e.value.code == "bad_argument" and "both" in e.value.message


def test_misplaced_names_point_to_the_right_argument():
    with pytest.raises(JacError) as e:
        ivp(TROPO, y0={"fj": 1.0})
    assert e.value.code == "bad_argument" and "forcing=" in e.value.message
    with pytest.raises(JacError) as e:
        ivp(TROPO, forcing={"T": 290.0})
    assert e.value.code == "bad_argument" and "p=" in e.value.message


def test_user_facing_callables_take_column_views():
    from esmjac import RhsProgram
    r = RhsProgram.build(TROPO)
    Y = np.tile(r.u0[:, None], (1, 3))              # columns are strided views
    np.testing.assert_array_equal(r(0.0, Y[:, 1]), r(0.0, r.u0.copy()))
    prob = ivp(TROPO)
    np.testing.assert_array_equal(prob.fun(0.0, Y[:, 2]), prob.fun(0.0, r.u0.copy()))
    np.testing.assert_array_equal(prob.jac(0.0, Y[:, 2]).toarray(), prob.jac(0.0, r.u0.copy()).toarray())


def test_an_underivable_operator_gets_the_same_code_as_the_cli():
    from esmjac.calculus.bandset import BandSet
    from tests.support.models import chem
    d = chem(cells=2)
    d["models"]["M"]["equations"][0]["rhs"]["expr"]["args"][0]["args"].append(
        {"op": "erf", "args": [{"op": "index", "args": ["A", "i"]}]})
    with pytest.raises(JacError) as cli:
        BandSet.build(d)
    with pytest.raises(JacError) as py:
        ivp(d)
    assert py.value.code == cli.value.code == "underivable_operator"


def test_auto_threads_on_a_large_problem_is_decided_by_measurement(monkeypatch):
    # The size threshold lowered so that tropo12's 120 unknowns count as large:
    # the build then times both thread counts and keeps one of them.
    import numba
    import esmjac.adapters.scipy as sc
    import esmjac.runtime.threads as th
    calls = []
    real = th.measure_threads
    monkeypatch.setattr(th, "SERIAL_BELOW", 10)
    monkeypatch.setattr(sc, "measure_threads", lambda call: calls.append(1) or real(call))
    auto = ivp(TROPO)
    one = ivp(TROPO, threads=1)
    assert calls == [1]
    assert auto.threads in (1, int(numba.config.NUMBA_NUM_THREADS)) and one.threads == 1
    np.testing.assert_array_equal(auto.fun(0.0, auto.y0), one.fun(0.0, one.y0))
    np.testing.assert_array_equal(auto.jac_data(0.0, auto.y0), one.jac_data(0.0, one.y0))
    monkeypatch.setattr(th, "SERIAL_BELOW", 20000)
    assert ivp(TROPO).threads is None            # small: the programs' own one-thread policy


def test_fun_on_a_serial_binding_switches_no_threads(monkeypatch):
    """threads=1 on a problem below SERIAL_BELOW: fun's binding runs serial
    twins only, so fun leaves Numba's thread count alone (decided once at
    build, not switched twice per call); its values are those of the
    threads=None problem, bit for bit, and the Jacobian still runs under
    the problem's thread count."""
    import numba
    one = ivp(TROPO, threads=1)
    free = ivp(TROPO)
    assert one.threads == 1 and one._calls.run_f.serial
    switched = []
    real = numba.set_num_threads
    monkeypatch.setattr(numba, "set_num_threads", lambda n: switched.append(n) or real(n))
    y = varied(one)
    for k in range(3):
        np.testing.assert_array_equal(one.fun(0.0, y * (1 + k)), free.fun(0.0, y * (1 + k)))
    assert switched == []
    one.jac(0.0, y)
    assert switched == ([] if numba.get_num_threads() == 1 else [1, numba.get_num_threads()])

def test_outputs_the_caller_still_holds_are_never_reused(tropo):
    """fun/jac recycle only arrays every caller has released: values a
    solver keeps stay as they were returned."""
    y = tropo.y0
    f1 = tropo.fun(0.0, y)
    keep = f1.copy()
    f2 = tropo.fun(0.0, y * 1.5)
    assert f2 is not f1 and np.array_equal(f1, keep)
    J1 = tropo.jac(0.0, y)
    d1 = J1.data.copy()
    J2 = tropo.jac(0.0, y * 1.5)
    assert not np.shares_memory(J1.data, J2.data) and np.array_equal(J1.data, d1)


def test_a_recycled_jacobian_is_never_one_someone_still_reads(tropo):
    """jac refills a matrix it returned before only when nothing else refers
    to it or its values: a view of the values, SciPy's own wrapper sharing
    them (what BDF keeps) or the matrix itself keep it out of the pool;
    once all are dropped it is refilled, with the values of a fresh call."""
    y = tropo.y0
    ref = tropo.jac_csr(0.0, y * 1.25).tocsc()
    ref.sort_indices()
    holders = []
    for hold in (lambda J: J, lambda J: J.data[3:9], lambda J: sp.csc_matrix(J), lambda J: J.data):
        J = tropo.jac(0.0, y)
        keep = J.data.copy()
        h = hold(J)
        w = weakref.ref(J)
        del J
        J2 = tropo.jac(0.0, y * 1.25)
        assert J2 is not w()                               # the held one was not refilled
        held = h.data if sp.issparse(h) else h
        assert np.array_equal(held, keep[3:9] if held.size == 6 else keep)
        np.testing.assert_array_equal(J2.data, ref.data)
        holders.append(h)
        del J2
    holders.clear()
    del h, held
    J = tropo.jac(0.0, y)
    w = weakref.ref(J)
    del J
    assert w() is not None                                 # released: kept to be refilled
    again = [tropo.jac(0.0, y * 1.25) for _ in range(4)]   # (the pool holds at most 4)
    assert any(J3 is w() for J3 in again)
    for J3 in again:
        np.testing.assert_array_equal(J3.data, ref.data)


def test_the_jacobian_form_is_decided_at_build():
    """Each method's ``jac`` is its form's own function, fixed at build (no
    per-call branch on the method), and a copy decides again."""
    import dataclasses
    doc = diffusion_model(12)
    forms = {("BDF", False): "_jac_csc", ("Radau", False): "_jac_csc", ("LSODA", False): "_jac_dense",
             ("LSODA", True): "_jac_banded"}
    for (method, banded), name in forms.items():
        prob = ivp(doc, method=method, banded=banded)
        assert prob.jac.__func__ is getattr(IvpProblem, name) and prob.jac.__self__ is prob
        copy = dataclasses.replace(prob, threads=1)
        assert copy.jac.__self__ is copy
        n0 = prob.njev
        prob.jac(0.0, prob.y0)
        assert prob.njev == n0 + 1


_FIRST_CALLS = r"""
import numpy as np
from numba.core.dispatcher import Dispatcher
from esmjac.adapters.scipy import ivp
prob = ivp(TROPO, forcing={"fj": np.linspace(0.2, 1.5, 8)})
new = []
_orig = Dispatcher._compile_for_args
def _spy(self, *args, **kws):
    new.append(getattr(self, "py_func", self).__qualname__)
    return _orig(self, *args, **kws)
Dispatcher._compile_for_args = _spy      # every call no compiled signature matches
y = prob.y0                              # read-only, as solve_ivp's first calls pass it
f0, j0 = prob.fun(0.0, y).copy(), prob.jac(0.0, y).toarray()
y1 = np.array(y) * 1.1                   # writable; an int time
f1, j1 = prob.fun(np.float64(1), y1), prob.jac(1, y1)
sol = prob.solve((0.0, 600.0), rtol=1e-6, atol=1e-3)
sol_fd = prob.solve((0.0, 600.0), rtol=1e-6, atol=1e-3, jac=None, jac_sparsity=prob.jac_sparsity)
assert sol.success and sol_fd.success
assert np.all(np.isfinite(f0)) and np.all(np.isfinite(j0)) and np.any(f1 != f0)
# the CSR values (the Csc plan's, reordered) are jac's, in CSR order
csr = prob.jac_csr(0.0, y)
assert np.array_equal(csr.toarray(), j0) and np.array_equal(prob.jac_data(0.0, y), csr.data)
first = list(new)
lsoda = ivp(TROPO, method="LSODA", forcing={"fj": np.linspace(0.2, 1.5, 8)})
del new[:]                               # (LSODA's build compiles its own CSR kernel)
assert lsoda.solve((0.0, 600.0), rtol=1e-6, atol=1e-3).success
print("NEW", sorted(set(first + new)))
"""


@pytest.mark.slow
def test_no_numba_specialization_after_build():
    # ivp() promises the first solve pays no compile: in a fresh process
    # (no other test's calls), the first fun/jac calls -- with solve_ivp's
    # read-only y0, a writable y, an integer t -- two BDF solves, the first
    # jac_csr/jac_data (they used to bind and compile a CSR kernel on first
    # use) and an LSODA solve after its build make no Numba dispatcher
    # resolve a new signature (compiled or loaded from Numba's cache).
    # Before the fix, the read-only y0 compiled every RHS and Jacobian
    # kernel again inside the first solve (12 s CPU cold).
    import subprocess
    import sys
    code = f"TROPO = {TROPO!r}\n" + _FIRST_CALLS
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("NEW")][-1]
    assert line == "NEW []", f"kernels specialized after the build: {line}"
