"""Lane-parallel sparse LU and Rosenbrock integrator (esmjac.integrators).

The LU is checked against dense NumPy solves on random closed patterns, for
bitwise thread-count independence, and for argument validation that happens
before any compiled code runs. The integrator is checked on Robertson's
stiff kinetics (lane-varying rates, with and without a permuted elimination
order) against a tight SciPy Radau reference, and on linear and
non-autonomous stiff problems with exact solutions.
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
from esmjac.integrators import METHODS, SparseLaneLU, rosenbrock
from esmjac.linalg import sparse_lu as sparse_lu_mod


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
    # The slots hold unit-lower L and U: their product is M, lane by lane.
    LU = np.zeros((L, 12, 12))
    for q, (r, c) in enumerate(pattern):
        LU[:, r, c] = A[q * L:(q + 1) * L]
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

def _standard_form(tab):
    """Back-transform KPP-form coefficients: Γ⁻¹ = diag(1/γ) − C, α = A Γ,
    b = M Γ, b̂ = b − E Γ (Hairer–Wanner II, (7.25))."""
    s = tab.stages
    A = np.zeros((s, s))
    C = np.zeros((s, s))
    for i in range(s):
        A[i, :i] = tab.a[i]
        C[i, :i] = tab.c[i]
    G = np.linalg.inv(np.eye(s) / tab.gamma - C)
    b = np.array(tab.m) @ G
    return A @ G, G, b, b - np.array(tab.e) @ G


@pytest.mark.parametrize("name", sorted(METHODS))
def test_method_order_conditions(name):
    tab = METHODS[name]
    alpha, G, b, bh = _standard_form(tab)
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
# Robertson
# ---------------------------------------------------------------------------

ROB_L = 16
ROB_T = 40.0
_lane = np.arange(ROB_L)
ROB_K1 = 0.04 * (0.5 + _lane / ROB_L)
ROB_K2 = 3e7 * (1.5 - _lane / ROB_L)
ROB_K3 = 1e4 * (1.0 + 0.5 * np.sin(_lane))
# Natural pattern of ∂f/∂y (plus the diagonal).
ROB_NAT = [[True, True, True], [True, True, True], [False, True, True]]


def _robertson(perm):
    """(f, jac, lu_pattern) with the Jacobian in the permuted order."""
    L = ROB_L
    n = 3
    ip = np.argsort(perm)
    Pp = [[ROB_NAT[perm[i]][perm[j]] for j in range(n)] for i in range(n)]
    F = lu_fill(Pp)
    pattern = tuple((i, j) for i in range(n) for j in range(n) if F[i][j])
    slot = {rc: q for q, rc in enumerate(pattern)}

    def f(t, u, out):
        y1, y2, y3 = u[:L], u[L:2 * L], u[2 * L:]
        r1 = ROB_K1 * y1
        r2 = ROB_K2 * y2 * y2
        r3 = ROB_K3 * y2 * y3
        out[:L] = -r1 + r3
        out[L:2 * L] = r1 - r2 - r3
        out[2 * L:] = r2

    def jac(t, u, J):
        y2, y3 = u[L:2 * L], u[2 * L:]

        def put(r, c, v):                   # natural (r, c) → permuted slot
            q = slot[(ip[r], ip[c])]
            J[q * L:(q + 1) * L] = v

        put(0, 0, -ROB_K1)
        put(0, 1, ROB_K3 * y3)
        put(0, 2, ROB_K3 * y2)
        put(1, 0, ROB_K1)
        put(1, 1, -2 * ROB_K2 * y2 - ROB_K3 * y3)
        put(1, 2, -ROB_K3 * y2)
        put(2, 1, 2 * ROB_K2 * y2)

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


def _run_robertson(perm, rtol=1e-6, method="rodas3"):
    f, jac, pattern = _robertson(perm)
    u0 = np.zeros(3 * ROB_L)
    u0[:ROB_L] = 1.0
    atol = np.array([1e-3, 1e-7, 1e-3]) * rtol     # y2 lives around 1e-5
    return rosenbrock(f, jac, u0, (0.0, ROB_T), n=3, lanes=ROB_L, lu_pattern=pattern,
                      perm=None if perm == (0, 1, 2) else perm, rtol=rtol, atol=atol,
                      method=method, autonomous=True)


@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 2, 0)])
@pytest.mark.parametrize("method", ["rodas3", "ros3"])
def test_robertson_matches_radau(robertson_reference, perm, method):
    rtol = 1e-6
    r = _run_robertson(perm, rtol, method)
    assert r.success, r.message
    assert r.t == ROB_T
    assert r.naccept + r.nreject == r.nsteps and r.njev == r.naccept
    Y = r.y.reshape(3, ROB_L)
    rel = np.abs(Y - robertson_reference) / np.abs(robertson_reference)
    assert rel.max() < 30 * rtol, rel.max(axis=1)
    # Mass is conserved by every Rosenbrock step up to rounding.
    np.testing.assert_allclose(Y.sum(0), 1.0, rtol=0, atol=1e-12)


def test_robertson_tolerance_proportionality(robertson_reference):
    errs = []
    for rtol in (1e-4, 1e-7):
        r = _run_robertson((0, 1, 2), rtol)
        assert r.success
        errs.append(np.max(np.abs(r.y.reshape(3, ROB_L) - robertson_reference) / robertson_reference))
    assert errs[1] < errs[0] / 100


def test_robertson_deterministic_across_thread_counts(threads):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    out = []
    for k in (1, 2):
        threads(k)
        r = _run_robertson((2, 0, 1), 1e-5)
        out.append((r.y.copy(), r.nsteps))
    assert out[0][1] == out[1][1] and np.array_equal(out[0][0], out[1][0])


# ---------------------------------------------------------------------------
# Problems with exact solutions
# ---------------------------------------------------------------------------

def test_linear_stiff_system_matches_expm():
    # y' = M_l y with a sparse 4×4 M_l per lane, eigenvalues from −0.5 to
    # about −1e4: stiff, and exactly expm(M_l t) y0.
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

    def f(t, u, out):
        U = u.reshape(n, L)
        out.reshape(n, L)[:] = np.einsum("lrc,cl->rl", Ms, U)

    def jac(t, u, J):
        for r, c in nat:
            q = slot[(ip[r], ip[c])]
            J[q * L:(q + 1) * L] = Ms[:, r, c]

    y0 = rng.uniform(0.5, 1.5, (n, L))
    r = rosenbrock(f, jac, y0.reshape(-1), (0.0, T), n=n, lanes=L, lu_pattern=pattern,
                   perm=perm, rtol=1e-6, atol=1e-9)
    assert r.success, r.message
    exact = np.stack([expm(Ms[l] * T) @ y0[:, l] for l in range(L)], axis=1)
    np.testing.assert_allclose(r.y.reshape(n, L), exact, rtol=2e-5, atol=1e-8)


def test_nonautonomous_stiff_forcing():
    # y0' = −λ(y0 − sin t) + cos t  →  y0 = sin t + c0 e^{−λt}
    # y1' = −μ(y1 − cos t) − sin t  →  y1 = cos t + (c1 − 1) e^{−μt}
    n, L, T = 2, 4, 3.0
    lam = np.array([10.0, 1e2, 1e3, 1e4])
    mu = lam[::-1].copy()
    c0, c1 = 0.7, 2.0
    pattern = ((0, 0), (1, 1))

    def f(t, u, out):
        out[:L] = -lam * (u[:L] - np.sin(t)) + np.cos(t)
        out[L:] = -mu * (u[L:] - np.cos(t)) - np.sin(t)

    def jac(t, u, J):
        J[:L] = -lam
        J[L:] = -mu

    u0 = np.concatenate([np.full(L, c0), np.full(L, c1)])
    exact = np.concatenate([np.sin(T) + c0 * np.exp(-lam * T), np.cos(T) + (c1 - 1) * np.exp(-mu * T)])
    r = rosenbrock(f, jac, u0, (0.0, T), n=n, lanes=L, lu_pattern=pattern, rtol=1e-6, atol=1e-8)
    assert r.success, r.message
    np.testing.assert_allclose(r.y, exact, rtol=0, atol=2e-6)
    assert r.nfev >= 2 * r.naccept                     # the ∂f/∂t difference costs an f call


# ---------------------------------------------------------------------------
# Integrator arguments and failure reporting
# ---------------------------------------------------------------------------

def test_rosenbrock_bad_arguments():
    f, jac, pattern = _robertson((0, 1, 2))
    u0 = np.r_[np.ones(ROB_L), np.zeros(2 * ROB_L)]
    kw = dict(n=3, lanes=ROB_L, lu_pattern=pattern)
    cases = [
        (dict(u0=u0[:-1]), "bad_argument"),
        (dict(perm=(0, 0, 1)), "bad_argument"),
        (dict(atol=[1.0, 1.0]), "bad_argument"),
        (dict(atol=0.0), "bad_argument"),
        (dict(rtol=-1.0), "bad_argument"),
        (dict(method="rk4"), "bad_option"),
        (dict(t_span=(1.0, 0.0)), "bad_argument"),
        (dict(h0=-1.0), "bad_argument"),
        (dict(n=4), "bad_argument"),
    ]
    for over, code in cases:
        args = dict(kw, u0=u0, t_span=(0.0, 1.0))
        args.update(over)
        with pytest.raises(JacError) as e:
            rosenbrock(f, jac, args.pop("u0"), args.pop("t_span"), **args)
        assert e.value.code == code, over


def test_rosenbrock_reports_step_limit():
    f, jac, pattern = _robertson((0, 1, 2))
    u0 = np.r_[np.ones(ROB_L), np.zeros(2 * ROB_L)]
    r = rosenbrock(f, jac, u0, (0.0, ROB_T), n=3, lanes=ROB_L, lu_pattern=pattern,
                   max_steps=5, autonomous=True)
    assert not r.success and "max_steps" in r.message and r.nsteps == 5 and r.t < ROB_T


def test_rosenbrock_reports_singular_iteration_matrix():
    f, jac, pattern = _robertson((0, 1, 2))

    def bad_jac(t, u, J):
        jac(t, u, J)
        J[3] = np.nan                                  # slot 0, lane 3

    u0 = np.r_[np.ones(ROB_L), np.zeros(2 * ROB_L)]
    r = rosenbrock(f, bad_jac, u0, (0.0, 1.0), n=3, lanes=ROB_L, lu_pattern=pattern,
                   autonomous=True)
    assert not r.success and "singular" in r.message and "lane 3" in r.message
    assert r.naccept == 0 and r.ndec == 6
