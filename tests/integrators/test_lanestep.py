"""The lane integrator's engine (esmjac.integrators.lanestep), its methods
(tableaux) and the sparse lane LU it factors with.

The LU is checked against dense NumPy solves on random closed patterns, for
bitwise thread-count independence, and for argument validation that happens
before any compiled code runs. The methods' coefficients are checked against
the order conditions. The engine (:class:`LaneStepper`, per-lane and shared
step, driven here by hand-written callables instead of compiled programs) is
checked on Robertson's stiff kinetics (lane-varying rates, with and without a
permuted elimination order) against a tight SciPy Radau reference, and on
linear and non-autonomous stiff problems with exact solutions.
"""
from __future__ import annotations

from fractions import Fraction

import numba
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.linalg import expm

from esmjac.errors import JacError
from esmjac.linalg.factorization import lu_fill, markowitz_ordering
from esmjac.integrators import METHODS, LaneStepper, SparseLaneLU
from esmjac.integrators.lanestep import RUNNING
from esmjac.integrators.leaf import LeafStats
from esmjac.integrators.tableaux import perm_arrays
from esmjac.linalg import sparse_lu as sparse_lu_mod
from tests.support.leafgrid import standard_form


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def _closed_pattern(n: int, density: float, seed: int):
    """A random pattern, Markowitz-ordered and closed under fill-in."""
    rng = np.random.default_rng(seed)
    P = [[i == j or bool(rng.random() < density) for j in range(n)] for i in range(n)]
    order = markowitz_ordering(P)
    Pp = [[P[order[i]][order[j]] for j in range(n)] for i in range(n)]
    F = lu_fill(Pp)
    return tuple((i, j) for i in range(n) for j in range(n) if F[i][j]), order


def _random_system(lu: SparseLaneLU, L: int, dtype, seed: int):
    """Diagonally dominant lane matrices on the pattern, dense and packed."""
    rng = np.random.default_rng(seed)
    n = lu.n
    M = np.zeros((L, n, n))
    for r, c in lu.pattern:
        M[:, r, c] = rng.uniform(-1.0, 1.0, L)
    M[:, np.arange(n), np.arange(n)] += np.sign(rng.uniform(-1, 1, (L, n))) * (n + rng.uniform(0, 2, (L, n)))
    M = M.astype(dtype)
    b = rng.standard_normal((L, n)).astype(dtype)
    return M, lu.pack(M), np.ascontiguousarray(b.T).reshape(-1)


@pytest.fixture
def threads():
    """Set the Numba thread count for a test and restore it afterwards."""
    saved = numba.get_num_threads()
    yield lambda k: numba.set_num_threads(min(k, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(saved)


# ---------------------------------------------------------------------------
# SparseLaneLU
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("seed", [1, 2])
def test_lu_matches_numpy(dtype, tol, seed):
    pattern, _ = _closed_pattern(12, 0.25, seed)
    lu = SparseLaneLU(12, pattern)
    L = 2 * sparse_lu_mod.CHUNK + 37          # several chunks, a ragged last one
    M, A, b = _random_system(lu, L, dtype, seed)
    x_ref = np.linalg.solve(M.astype(np.float64), b.reshape(12, L).T.astype(np.float64)[..., None])[..., 0]
    lu.factor(A, L)
    # The slots hold unit-lower L and U, U's diagonal as its reciprocal:
    # their product is M, lane by lane.
    LU = np.zeros((L, 12, 12))
    for q, (r, c) in enumerate(pattern):
        LU[:, r, c] = A[q * L:(q + 1) * L]
    k = np.arange(12)
    LU[:, k, k] = 1.0 / LU[:, k, k].astype(np.float64)
    Lo = np.tril(LU, -1) + np.eye(12)
    Up = np.triu(LU)
    np.testing.assert_allclose(Lo @ Up, M, rtol=0, atol=tol * 40)
    lu.solve(A, b, L)
    assert b.dtype == dtype
    x = b.reshape(12, L).T
    np.testing.assert_allclose(x, x_ref, rtol=tol, atol=tol)


def test_lu_identity_pattern_and_flops():
    lu = SparseLaneLU(3, ((0, 0), (1, 1), (2, 2)))
    A = np.array([2.0, 4.0, 8.0, 16.0, 0.5, 0.25])     # L = 2
    b = np.ones(6)
    lu.factor(A, 2)
    lu.solve(A, b, 2)
    np.testing.assert_array_equal(b, [0.5, 0.25, 0.125, 0.0625, 2.0, 4.0])
    assert lu.flops == (0, 3)


def test_lu_pattern_validation():
    with pytest.raises(JacError) as e:
        SparseLaneLU(2, ((0, 0), (0, 1)))                       # no (1, 1)
    assert e.value.code == "bad_argument"
    with pytest.raises(JacError, match="not closed"):
        SparseLaneLU(3, ((0, 0), (0, 2), (1, 0), (1, 1), (2, 2)))  # needs (1, 2)
    with pytest.raises(JacError, match="sorted"):
        SparseLaneLU(2, ((1, 1), (0, 0)))
    with pytest.raises(JacError, match="outside"):
        SparseLaneLU(2, ((0, 0), (1, 1), (1, 2)))
    with pytest.raises(JacError):
        SparseLaneLU(0, ())


def test_lu_deterministic_across_thread_counts(threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    pattern, _ = _closed_pattern(15, 0.2, 7)
    lu = SparseLaneLU(15, pattern)
    L = 5 * sparse_lu_mod.CHUNK + 3
    _, A0, b0 = _random_system(lu, L, np.float64, 7)
    out = []
    for k in (1, 2, 1):
        threads(k)
        A, b = A0.copy(), b0.copy()
        lu.factor(A, L)
        lu.solve(A, b, L)
        out.append((A, b))
    for A, b in out[1:]:
        assert np.array_equal(A, out[0][0]) and np.array_equal(b, out[0][1])
    # A lane's result does not depend on where it sits (vector body or scalar
    # remainder of a chunk): a sub-batch of lanes gives the same bits.
    n_sub = 7
    idx = np.arange(n_sub) + 300
    A_sub = np.ascontiguousarray(A0.reshape(-1, L)[:, idx]).reshape(-1)
    b_sub = np.ascontiguousarray(b0.reshape(-1, L)[:, idx]).reshape(-1)
    lu.factor(A_sub, n_sub)
    lu.solve(A_sub, b_sub, n_sub)
    assert np.array_equal(A_sub.reshape(-1, n_sub), out[0][0].reshape(-1, L)[:, idx])
    assert np.array_equal(b_sub.reshape(-1, n_sub), out[0][1].reshape(-1, L)[:, idx])


def test_lu_bad_input_raises_before_compiled_code(monkeypatch):
    lu = SparseLaneLU(2, ((0, 0), (0, 1), (1, 0), (1, 1)))

    def boom(*args):
        raise AssertionError("compiled kernel reached")

    monkeypatch.setattr(sparse_lu_mod, "_factor_kernel", boom)
    monkeypatch.setattr(sparse_lu_mod, "_solve_kernel", boom)
    L = 3
    good = np.ones(4 * L)
    bad_cases = [
        (lambda: lu.factor(np.ones(4 * L - 1), L), "length"),
        (lambda: lu.factor(np.ones(4 * L, dtype=np.int64), L), "float64 or float32"),
        (lambda: lu.factor(np.ones(4 * L, dtype=np.float16), L), "float64 or float32"),
        (lambda: lu.factor(np.ones(8 * L)[::2], L), "contiguous"),
        (lambda: lu.factor(np.ones((4, L)), L), "1-D"),
        (lambda: lu.factor(list(good), L), "NumPy"),
        (lambda: lu.factor(good, 0), "lane count"),
        (lambda: lu.factor(good, 3.0), "lane count"),
        (lambda: lu.solve(good, np.ones(2 * L + 1), L), "length"),
        (lambda: lu.solve(good, np.ones(2 * L, dtype=np.float32), L), "dtype"),
        (lambda: lu.solve(good, np.ones(4 * L)[::2], L), "contiguous"),
    ]
    ro = np.ones(4 * L)
    ro.setflags(write=False)
    bad_cases.append((lambda: lu.factor(ro, L), "writeable"))
    for call, what in bad_cases:
        with pytest.raises(JacError, match=what) as e:
            call()
        assert e.value.code == "bad_argument"


def test_lu_zero_pivot_names_the_lane():
    lu = SparseLaneLU(2, ((0, 0), (0, 1), (1, 0), (1, 1)))
    L = 300                                             # two chunks
    M = np.tile(np.array([[2.0, 1.0], [1.0, 3.0]]), (L, 1, 1))
    M[261] = [[1.0, 1.0], [1.0, 1.0]]                  # u_11 = 0 exactly
    M[270, 0, 0] = np.nan
    A = lu.pack(M)
    with pytest.raises(JacError, match="lane 261 at elimination row 1") as e:
        lu.factor(A, L)
    assert e.value.code == "evaluation_error"
    A = lu.pack(M)
    assert lu.factor_status(A, L) == (261, 1)
    ok = np.ones(L, bool)
    ok[[261, 270]] = False
    b = np.ones(2 * L)
    lu.solve(A, b, L)                                   # healthy lanes are fine
    x_ref = np.linalg.solve(M[ok], np.ones((ok.sum(), 2, 1)))[..., 0]
    np.testing.assert_allclose(b.reshape(2, L)[:, ok].T, x_ref, rtol=1e-14)


# ---------------------------------------------------------------------------
# Method coefficients
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_order_conditions(name):
    tab = METHODS[name]
    alpha, G, b, bh = standard_form(tab)
    g = tab.gamma
    beta = alpha + G - np.diag(np.diag(G))           # β_ij = α_ij + γ_ij, j < i
    bp = beta.sum(1)
    ai = alpha.sum(1)
    np.testing.assert_allclose(ai, tab.alpha, atol=1e-14)
    np.testing.assert_allclose(G.sum(1), tab.gsum, atol=1e-13)
    # Order 3 for b, order 2 for b̂ (Hairer–Wanner II, Table IV.7.1).
    for w, order in ((b, 3), (bh, 2)):
        assert abs(w.sum() - 1) < 1e-13
        assert abs(w @ bp - (0.5 - g)) < 1e-13
        if order == 3:
            assert abs(w @ ai**2 - 1 / 3) < 1e-13
            assert abs(w @ beta @ bp - (1 / 6 - g + g * g)) < 1e-13
    assert tab.newf[0] and all(len(tab.a[i]) == i for i in range(tab.stages))


def test_rodas3_transformed_coefficients_are_the_published_ones():
    tab = METHODS["rodas3"]
    assert tab.a == ((), (0.0,), (2.0, 0.0), (2.0, 0.0, 1.0))
    assert tab.c == ((), (4.0,), (1.0, -1.0), (1.0, -1.0, float(Fraction(-8, 3))))
    assert tab.m == (2.0, 0.0, 1.0, 1.0) and tab.e == (0.0, 0.0, 0.0, 1.0)
    assert tab.alpha == (0.0, 0.0, 1.0, 1.0) and tab.gsum == (0.5, 1.5, 0.0, 0.0)
    assert tab.newf == (True, False, True, True)


# ---------------------------------------------------------------------------
# The engine, driven by hand-written callables
# ---------------------------------------------------------------------------

def _integrate(f, jac, u0, t_span, *, n, lanes, pattern, perm=None, fields=None, fcall=None, nf=0,
               rtol=1e-4, atol=1.0, method="rodas3", step="shared", max_steps=100000, max_rejects=50):
    """Run one :class:`LaneStepper` block over all lanes of ``u0``.

    ``f(u, fz, m, out)`` and ``jac(u, fz, m, J)`` see the first ``m`` compact
    lanes (``fz[k*m + j]``: field ``k`` of compact lane ``j``); ``jac`` writes
    the slots of ``pattern`` (permuted order) untiled, ``J[q*m + j]``.
    ``fields``: constant per-lane fields (``nf*L``, lane order); ``fcall``:
    fields as a function of the lanes' times instead. Returns (y, stats)."""
    L = lanes
    lu = SparseLaneLU(n, pattern)
    p, ip = perm_arrays(perm, n)
    nnz = lu.nnz

    def rhs(u, fz, cix, m, out):
        f(u, fz, m, out)

    def jacobian(u, fz, cix, m, J):
        J[:nnz * m] = 0.0
        jac(u, fz, m, J)

    st = LeafStats(np.full(L, RUNNING, np.int8), *(np.zeros(L, np.int64) for _ in range(6)),   # nsteps … ndec
                   np.zeros(L), np.zeros(L))
    stepper = LaneStepper(METHODS[method], lu, p, ip, nf, 0, L, None, rhs, jacobian,
                          step == "shared", True)
    y = np.array(u0, dtype=np.float64)
    at = np.ascontiguousarray(np.broadcast_to(np.asarray(atol, dtype=np.float64), (n,)))
    at.setflags(write=False)            # as the leaf's atol: one flavour of the lane-step kernels
    forcing = np.zeros(1) if fields is None else np.ascontiguousarray(fields, dtype=np.float64)
    stepper.run(y, y, L, 0, L, float(t_span[0]), float(t_span[1]), None, forcing, fcall,
                np.zeros(1, np.int64), at, float(rtol), max_steps, max_rejects, False, st)
    return y, st


# ---------------------------------------------------------------------------
# Robertson
# ---------------------------------------------------------------------------

ROB_L = 16
ROB_T = 40.0
_lane = np.arange(ROB_L)
ROB_K1 = 0.04 * (0.5 + _lane / ROB_L)
ROB_K2 = 3e7 * (1.5 - _lane / ROB_L)
ROB_K3 = 1e4 * (1.0 + 0.5 * np.sin(_lane))
ROB_RATES = np.concatenate([ROB_K1, ROB_K2, ROB_K3])     # per-lane fields k1, k2, k3
# Natural pattern of ∂f/∂y (plus the diagonal).
ROB_NAT = [[True, True, True], [True, True, True], [False, True, True]]


def _robertson(perm):
    """(f, jac, lu_pattern) with the Jacobian in the permuted order; the
    rates are the lanes' fields."""
    n = 3
    ip = np.argsort(perm)
    Pp = [[ROB_NAT[perm[i]][perm[j]] for j in range(n)] for i in range(n)]
    F = lu_fill(Pp)
    pattern = tuple((i, j) for i in range(n) for j in range(n) if F[i][j])
    slot = {rc: q for q, rc in enumerate(pattern)}

    def f(u, fz, m, out):
        k1, k2, k3 = fz[:m], fz[m:2 * m], fz[2 * m:3 * m]
        y1, y2, y3 = u[:m], u[m:2 * m], u[2 * m:3 * m]
        r1 = k1 * y1
        r2 = k2 * y2 * y2
        r3 = k3 * y2 * y3
        out[:m] = -r1 + r3
        out[m:2 * m] = r1 - r2 - r3
        out[2 * m:3 * m] = r2

    def jac(u, fz, m, J):
        k1, k2, k3 = fz[:m], fz[m:2 * m], fz[2 * m:3 * m]
        y2, y3 = u[m:2 * m], u[2 * m:3 * m]

        def put(r, c, v):                   # natural (r, c) → permuted slot
            q = slot[(ip[r], ip[c])]
            J[q * m:(q + 1) * m] = v

        put(0, 0, -k1)
        put(0, 1, k3 * y3)
        put(0, 2, k3 * y2)
        put(1, 0, k1)
        put(1, 1, -2 * k2 * y2 - k3 * y3)
        put(1, 2, -k3 * y2)
        put(2, 1, 2 * k2 * y2)

    return f, jac, pattern


@pytest.fixture(scope="module")
def robertson_reference():
    out = np.empty((3, ROB_L))
    for l in range(ROB_L):
        k1, k2, k3 = ROB_K1[l], ROB_K2[l], ROB_K3[l]

        def fl(t, y):
            return [-k1 * y[0] + k3 * y[1] * y[2],
                    k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                    k2 * y[1] ** 2]

        def jl(t, y):
            return [[-k1, k3 * y[2], k3 * y[1]],
                    [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
                    [0.0, 2 * k2 * y[1], 0.0]]

        s = solve_ivp(fl, (0.0, ROB_T), [1.0, 0.0, 0.0], method="Radau",
                      rtol=1e-8, atol=1e-12, jac=jl)
        assert s.success
        out[:, l] = s.y[:, -1]
    return out


def _run_robertson(perm, rtol=1e-6, method="rodas3", step="shared", **kw):
    f, jac, pattern = _robertson(perm)
    u0 = np.zeros(3 * ROB_L)
    u0[:ROB_L] = 1.0
    atol = np.array([1e-3, 1e-7, 1e-3]) * rtol     # y2 lives around 1e-5
    return _integrate(f, jac, u0, (0.0, ROB_T), n=3, lanes=ROB_L, pattern=pattern,
                      perm=None if perm == (0, 1, 2) else perm, fields=ROB_RATES, nf=3,
                      rtol=rtol, atol=atol, method=method, step=step, **kw)


@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
@pytest.mark.parametrize("method", ["rodas3", "ros3"])
@pytest.mark.parametrize("step", ["shared", "lane"])
def test_robertson_matches_radau(robertson_reference, perm, method, step):
    rtol = 1e-6
    y, st = _run_robertson(perm, rtol, method, step)
    assert st.success, st.message
    assert np.all(st.t == ROB_T)
    assert np.array_equal(st.naccept + st.nreject, st.nsteps)
    if step == "shared":                            # lock-step: one step sequence for all lanes
        assert np.all(st.nsteps == st.nsteps[0]) and np.all(st.naccept == st.naccept[0])
    Y = y.reshape(3, ROB_L)
    rel = np.abs(Y - robertson_reference) / np.abs(robertson_reference)
    assert rel.max() < 30 * rtol, rel.max(axis=1)
    # Mass is conserved by every Rosenbrock step up to rounding.
    np.testing.assert_allclose(Y.sum(0), 1.0, rtol=0, atol=1e-12)


def test_robertson_tolerance_proportionality(robertson_reference):
    errs = []
    for rtol in (1e-4, 1e-7):
        y, st = _run_robertson((0, 1, 2), rtol)
        assert st.success
        errs.append(np.max(np.abs(y.reshape(3, ROB_L) - robertson_reference) / robertson_reference))
    assert errs[1] < errs[0] / 100


def test_robertson_deterministic_across_thread_counts(threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    out = []
    for k in (1, 2):
        threads(k)
        y, st = _run_robertson((2, 0, 1), 1e-5)
        out.append((y.copy(), st.nsteps.copy()))
    assert np.array_equal(out[0][1], out[1][1]) and np.array_equal(out[0][0], out[1][0])


# ---------------------------------------------------------------------------
# Problems with exact solutions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("step", ["shared", "lane"])
def test_linear_stiff_system_matches_expm(step):
    # y' = M_l y with a sparse 4×4 M_l per lane, eigenvalues from −0.5 to
    # about −1e4: stiff, and exactly expm(M_l t) y0. M_l's entries are the
    # lanes' fields.
    n, L, T = 4, 8, 2.0
    rng = np.random.default_rng(3)
    nat = [(0, 0), (0, 1), (1, 1), (1, 2), (2, 0), (2, 2), (3, 1), (3, 3)]
    Ms = np.zeros((L, n, n))
    for l in range(L):
        for r, c in nat:
            Ms[l, r, c] = rng.uniform(0.1, 1.0)
        Ms[l, np.arange(n), np.arange(n)] = -np.array([0.5, 30.0, 1e3, 1e4]) * (1 + l / L) - 1.0
    P = [[(r, c) in nat or r == c for c in range(n)] for r in range(n)]
    perm = tuple(markowitz_ordering(P))
    ip = np.argsort(perm)
    Pp = [[P[perm[i]][perm[j]] for j in range(n)] for i in range(n)]
    F = lu_fill(Pp)
    pattern = tuple((i, j) for i in range(n) for j in range(n) if F[i][j])
    slot = {rc: q for q, rc in enumerate(pattern)}
    fields = np.concatenate([Ms[:, r, c] for r, c in nat])

    def f(u, fz, m, out):
        out[:n * m] = 0.0
        for k, (r, c) in enumerate(nat):
            out[r * m:(r + 1) * m] += fz[k * m:(k + 1) * m] * u[c * m:(c + 1) * m]

    def jac(u, fz, m, J):
        for k, (r, c) in enumerate(nat):
            q = slot[(ip[r], ip[c])]
            J[q * m:(q + 1) * m] = fz[k * m:(k + 1) * m]

    y0 = rng.uniform(0.5, 1.5, (n, L))
    y, st = _integrate(f, jac, y0.reshape(-1), (0.0, T), n=n, lanes=L, pattern=pattern, perm=perm,
                       fields=fields, nf=len(nat), rtol=1e-6, atol=1e-9, step=step)
    assert st.success, st.message
    exact = np.stack([expm(Ms[l] * T) @ y0[:, l] for l in range(L)], axis=1)
    np.testing.assert_allclose(y.reshape(n, L), exact, rtol=2e-5, atol=1e-8)


@pytest.mark.parametrize("step", ["shared", "lane"])
def test_nonautonomous_stiff_forcing(step):
    # y0' = −λ(y0 − sin t) + cos t  →  y0 = sin t + c0 e^{−λt}
    # y1' = −μ(y1 − cos t) − sin t  →  y1 = cos t + (c1 − 1) e^{−μt}
    # t enters as a field set to each lane's stage time (a forcing callable).
    n, L, T = 2, 4, 3.0
    lam = np.array([10.0, 1e2, 1e3, 1e4])
    mu = lam[::-1].copy()
    c0, c1 = 0.7, 2.0
    pattern = ((0, 0), (1, 1))

    def fcall(times, lanes):
        return np.stack([times, lam[lanes], mu[lanes]])

    def f(u, fz, m, out):
        t, la, mu_ = fz[:m], fz[m:2 * m], fz[2 * m:3 * m]
        out[:m] = -la * (u[:m] - np.sin(t)) + np.cos(t)
        out[m:2 * m] = -mu_ * (u[m:2 * m] - np.cos(t)) - np.sin(t)

    def jac(u, fz, m, J):
        J[:m] = -fz[m:2 * m]
        J[m:2 * m] = -fz[2 * m:3 * m]

    u0 = np.concatenate([np.full(L, c0), np.full(L, c1)])
    exact = np.concatenate([np.sin(T) + c0 * np.exp(-lam * T), np.cos(T) + (c1 - 1) * np.exp(-mu * T)])
    y, st = _integrate(f, jac, u0, (0.0, T), n=n, lanes=L, pattern=pattern, fcall=fcall, nf=3,
                       rtol=1e-6, atol=1e-8, step=step)
    assert st.success, st.message
    np.testing.assert_allclose(y, exact, rtol=0, atol=2e-6)
    assert np.all(st.nfev >= 2 * st.naccept)          # the ∂f/∂t difference costs an f call


# ---------------------------------------------------------------------------
# Failure reporting
# ---------------------------------------------------------------------------

def test_perm_arrays_refuses_non_permutations():
    p, ip = perm_arrays((2, 0, 1), 3)
    assert p.tolist() == [2, 0, 1] and ip.tolist() == [1, 2, 0]
    assert not p.flags.writeable and not ip.flags.writeable       # build products
    for bad in ((0, 0, 1), (0, 1), ("a", 1, 2)):
        with pytest.raises(JacError) as e:
            perm_arrays(bad, 3)
        assert e.value.code == "bad_argument"


@pytest.mark.parametrize("step", ["shared", "lane"])
def test_reports_step_limit(step):
    y, st = _run_robertson((0, 1, 2), 1e-4, step=step, max_steps=5)
    assert np.all(st.status == 2) and np.all(st.nsteps == 5) and np.all(st.t < ROB_T)


def test_non_finite_jacobian_lane_is_contained():
    # Lane 3's Jacobian has a NaN in slot 0 on every call: its iteration
    # matrix is never usable, so it fails as non-finite (h halves to
    # underflow) at its initial state; per-lane steps leave every other lane
    # bitwise as in a run where lane 3 is healthy. With one shared step no
    # lane gets anywhere. A fourth field carries each lane's number.
    f, jac, pattern = _robertson((0, 1, 2))
    fields = np.concatenate([ROB_RATES, np.arange(ROB_L, dtype=np.float64)])

    def bad_jac(u, fz, m, J):
        jac(u, fz, m, J)
        J[np.flatnonzero(fz[3 * m:4 * m] == 3.0)] = np.nan     # slot 0 of lane 3, wherever it sits

    u0 = np.r_[np.ones(ROB_L), np.zeros(2 * ROB_L)]
    atol = np.array([1e-3, 1e-7, 1e-3]) * 1e-4
    kw = dict(n=3, lanes=ROB_L, pattern=pattern, fields=fields, nf=4, rtol=1e-4, atol=atol,
              max_rejects=1000)
    ok, st0 = _integrate(f, jac, u0, (0.0, 1.0), step="lane", **kw)
    assert st0.success
    others = np.arange(ROB_L) != 3
    for step in ("lane", "shared"):
        y, st = _integrate(f, bad_jac, u0, (0.0, 1.0), step=step, **kw)
        assert st.status[3] == 4 and st.naccept[3] == 0
        assert np.array_equal(y.reshape(3, ROB_L)[:, 3], u0.reshape(3, ROB_L)[:, 3])
        if step == "lane":
            assert np.all(st.status[others] == 0)
            assert np.array_equal(y.reshape(3, ROB_L)[:, others], ok.reshape(3, ROB_L)[:, others])
        else:
            assert np.all(st.status[others] != 0) and np.all(st.naccept == 0)


@pytest.mark.parametrize("L", [40, 5])
def test_iteration_matrix_formed_in_place_keeps_the_bits_and_the_singular_statuses(L):
    # With 16-lane tiles and float64 factors the stepper has the Jacobian
    # written straight into the iteration matrix's buffer and factored there
    # (LaneStepper.inplace); the oracle is the same stepper with the copy
    # route (J kept, the matrix formed from it): the same bits and per-lane
    # statistics, 40 lanes (two vector tiles and a partial one) and 5 (one
    # partial tile). Two lanes never get a usable matrix: lane 3's J has a
    # NaN (status 4), lane 6's a finite J whose iteration matrix is exactly
    # singular at every attempted step (J_00 = 1/(h gamma) of that attempt:
    # a zero pivot, status 5). _control tells them apart by reading J, which
    # the in-place factorisation overwrote: a singular attempt evaluates J
    # again (without that, lane 3 would read as status 5).
    from esmjac.layouts.types import tile_index
    f, jac, pattern = _robertson((0, 1, 2))
    lu = SparseLaneLU(3, pattern)
    nnz, tab, W, tend = lu.nnz, METHODS["rodas3"], 16, 1.0
    fields = np.concatenate([np.resize(k, L) for k in (ROB_K1, ROB_K2, ROB_K3)] + [np.arange(L, dtype=np.float64)])
    cell = []

    def tiled_jac(u, fz, cix, m, out):
        Ju = np.zeros(nnz * m)
        jac(u, fz, m, Ju)
        ids = fz[3 * m:4 * m]
        Ju[np.flatnonzero(ids == 3.0)] = np.nan                 # slot 0 of lane 3
        st = cell[0]
        for j in np.flatnonzero(ids == 6.0):                   # lane 6: a zero pivot at its step
            hl = st.h[j] if st.h[j] < tend - st.t[j] else tend - st.t[j]
            Ju[j] = 1.0 / (hl * tab.gamma)
        C = -(-m // W) * W
        ln = np.arange(C)
        src = np.minimum(ln, m - 1)                             # padding lanes: the last lane's
        out[tile_index(np.arange(nnz)[:, None], ln[None, :], nnz, W)] = Ju.reshape(nnz, m)[:, src]

    p, ip = perm_arrays(None, 3)
    u0 = np.r_[np.ones(L), np.zeros(2 * L)]
    at = np.array([1e-3, 1e-7, 1e-3]) * 1e-4
    at.setflags(write=False)            # as the leaf's atol: one flavour of the lane-step kernels
    res = []
    for inplace in (True, False):
        st = LeafStats(np.full(L, RUNNING, np.int8), *(np.zeros(L, np.int64) for _ in range(6)),
                       np.zeros(L), np.zeros(L))
        stepper = LaneStepper(tab, lu, p, ip, 4, 0, L, W, lambda u, fz, cix, m, out: f(u, fz, m, out), tiled_jac,
                              False, True)
        assert stepper.inplace
        stepper.inplace = inplace
        cell[:] = [stepper]
        y = u0.copy()
        stepper.run(y, y, L, 0, L, 0.0, tend, None, fields, None, np.zeros(1, np.int64), at, 1e-4, 100000,
                    1000, False, st)
        res.append((y, st))
    (ya, sa), (yb, sb) = res
    assert sa.status[3] == 4 and (L <= 6 or sa.status[6] == 5)
    ok = np.setdiff1d(np.arange(L), [3, 6])
    assert np.all(sa.status[ok] == 0) and np.all(sa.t[ok] == tend)
    assert np.array_equal(ya.view(np.int64), yb.view(np.int64))
    for k in ("status", "nsteps", "naccept", "nreject", "njev", "h", "t"):
        assert np.array_equal(getattr(sa, k), getattr(sb, k)), k


@pytest.mark.parametrize("m, dtype, gdt", [(37, np.float64, 0.0), (300, np.float64, 0.25), (64, np.float32, 0.0),
                                           (10, np.float64, 0.0), (48, np.float64, 0.25)])
def test_stage_solve_in_one_pass_per_direction_gives_the_separate_passes_bits(m, dtype, gdt):
    # the leaf's stage call forms each row's right-hand side inside the forward
    # substitution and each row of the next combination inside the backward
    # one (sparse_lu.vlin over whole groups of 16 lanes, loops for the rest),
    # each row's substitution tile by tile (lu_tile: pairs of whole float64
    # 16-lane tiles through sparse_lu.rowdot2, a whole tile left over (48) and
    # float32's 32-lane tiles through rowdot, a partial last tile through the loops);
    # oracle (bitwise): stage_rhs, then solve_lanes, then combine — the
    # separate kernels the sensitivity replays use — on the same inputs, over
    # Rodas3's four stages, the oracle's matrix in one tile of m lanes (the
    # scalar loops: never a whole 16-lane tile)
    from esmjac.integrators import lanestep as LS
    from esmjac.linalg.sparse_lu import CHUNK, factor_lanes, solve_lanes, tiled_size
    rng = np.random.default_rng(11)
    n = 9
    P = [[i == j or bool(rng.random() < 0.35) for j in range(n)] for i in range(n)]
    order = markowitz_ordering(P)
    Fl = lu_fill([[P[order[i]][order[j]] for j in range(n)] for i in range(n)])
    lu = SparseLaneLU(n, tuple((i, j) for i in range(n) for j in range(n) if Fl[i][j]))
    WA = LS.lu_tile(m, dtype)
    V = 16 if dtype == np.float64 else 32                       # sparse_lu.vec_lanes
    assert WA == (V if m >= V else m)
    A = rng.uniform(-1, 1, (lu.nnz, m))
    A[lu.diag_slots] += n + 1.0
    Wm = np.zeros(tiled_size(lu.nnz, m, WA), dtype)
    ln = np.arange(m)
    Wm[((ln // WA)[None, :] * lu.nnz + np.arange(lu.nnz)[:, None]) * WA + (ln % WA)[None, :]] = A
    factor_lanes(Wm, lu.nnz, m, WA, CHUNK, *lu.factor_ops(), np.empty(m, np.int64))
    Wr = np.ascontiguousarray(A.reshape(-1).astype(dtype))     # the oracle's: one tile of m lanes
    factor_lanes(Wr, lu.nnz, m, m, CHUNK, *lu.factor_ops(), np.empty(m, np.int64))
    perm = rng.permutation(n).astype(np.int64)
    perm.setflags(write=False)          # read-only, as perm_arrays gives it: the kernels' one flavour
    tab = METHODS["rodas3"]
    hs, F, Y, dfdt = rng.uniform(0.1, 10, m), rng.standard_normal(n * m), rng.random(n * m), rng.standard_normal(n * m)
    K0 = rng.standard_normal((tab.stages, n * m))
    out = []
    for fused in (True, False):
        K, nout, ch = K0.copy(), np.zeros(n * m), np.empty(tab.stages * m)
        for i in range(tab.stages):
            ci, cv = LS.nonzero_terms(tab.c[i])
            nx, nv = LS.nonzero_terms(tab.m if i + 1 == tab.stages else tab.a[i + 1])
            if fused:
                LS._stage_solve(F, K, i, ci, cv, hs, gdt, dfdt, perm, m, ch, Wm, lu.nnz, WA, *lu.solve_ops(),
                                Y, nx, nv, nout, True)
            else:
                LS.stage_rhs(F, K, i, ci, cv, hs, gdt, dfdt, perm, m, ch)
                solve_lanes(Wr, K[i], lu.nnz, m, m, CHUNK, *lu.solve_ops())
                LS.combine(Y, K, nx, nv, perm, m, nout)
            out.append((K[i].copy(), nout.copy()))
    half = len(out) // 2
    for (k1, o1), (k2, o2) in zip(out[:half], out[half:]):
        assert np.array_equal(k1, k2) and np.array_equal(o1, o2)
    assert np.all(np.isfinite(out[half - 1][1])) and not np.array_equal(out[half - 1][1], Y)
