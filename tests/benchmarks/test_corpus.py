"""The corpus run (benchmarks/corpus.py) on the documents a fresh machine
has: our own hand-written documents in tests/support/documents (one per
coverage class of issue #11) and the documents shipped in installed packages.

The oracle is earthsci-ast's own problem (``earthsci_ast.esm_problem``): its
state names and order, its initial state, its right-hand side, and central
differences of that right-hand side for the Jacobian.
"""
from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest

from benchmarks import corpus

DOCS = pathlib.Path(__file__).resolve().parents[1] / "support" / "documents"
SAMPLE = corpus.discover(corpus.default_roots())


def test_the_sample_holds_our_documents_and_the_shipped_model():
    names = {pathlib.Path(p).name for _, p in SAMPLE}
    assert {"catalyst_species.esm", "two_models.esm", "nested_observed.esm", "ic_from_parameters.esm",
            "state_free_tendency.esm", "bare_broadcast.esm", "interp_tables.esm", "datetime_clock.esm",
            "aggregate_placement.esm", "function_table.esm", "prefix_sums.esm", "categorical_geometry.esm", "running_max.esm",
            "tropo12.esm"} <= names


#: Documents of the sample that are typed refusals, with the reason's start.
REFUSED: dict = {}


@pytest.mark.parametrize("family,path", SAMPLE, ids=[pathlib.Path(p).stem for _, p in SAMPLE])
def test_document_matches_earthsci_ast(family, path):
    r = corpus.check_document(path, family)
    want = REFUSED.get(pathlib.Path(path).name)
    if want:
        assert r.outcome == "refusal" and r.detail.startswith(want), f"{r.outcome}: {r.detail}"
    else:
        assert r.outcome == "match", f"{r.outcome}: {r.detail}"


def test_initial_values_the_format_derives():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "ic_from_parameters.esm"
    prob = ivp(path)
    # by hand: ic(w) = 2 A, z its default, ic(u)[i] = amp i, ic(v)[i] = exp(-i/2)
    want = {"M.w": 4.0, "M.z": 7.0, "M.u[1]": 0.5, "M.u[2]": 1.0, "M.u[3]": 1.5,
            "M.v[1]": np.exp(-0.5), "M.v[2]": np.exp(-1.0), "M.v[3]": np.exp(-1.5)}
    got = dict(zip(prob.names, prob.y0))
    assert got == pytest.approx(want, rel=1e-15)
    np.testing.assert_array_equal(prob.y0, _eco(path).y0)


def test_parameter_overrides_move_the_initial_values_they_define():
    """ivp(p=…) starts where earthsci-ast's problem with the same p starts:
    ic(w) = 2 A and ic(u)[i] = amp i follow the overrides; z keeps its default."""
    import earthsci_ast as ea
    from esmjac.adapters.scipy import ivp
    path = DOCS / "ic_from_parameters.esm"
    p = {"M.A": 3.0, "amp": 1.0}
    prob = ivp(path, p=p)
    got = dict(zip(prob.names, prob.y0))
    assert got["M.w"] == 6.0 and got["M.z"] == 7.0
    assert [got[f"M.u[{i}]"] for i in (1, 2, 3)] == [1.0, 2.0, 3.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eco = ea.esm_problem(str(path), (0.0, 1.0), p={"M.A": 3.0, "M.amp": 1.0})
    b = eco.build or eco.scalar_build
    np.testing.assert_array_equal(prob.y0, np.asarray(b.y0, dtype=float).reshape(-1))
    # an explicit y0 entry still wins over the derived value
    assert dict(zip(prob.names, ivp(path, p=p, y0={"M.w": 0.5}).y0))["M.w"] == 0.5


def test_a_state_free_tendency_has_the_zero_jacobian():
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "state_free_tendency.esm")
    assert prob.jac_csr(0.0, prob.y0).nnz == 0
    np.testing.assert_allclose(prob.fun(0.0, prob.y0), 3.0 * np.cos((np.arange(1, 5) - 0.5) / 4), rtol=1e-14)


def _eco(path):
    eco = corpus.ecosystem(str(path))
    assert isinstance(eco, corpus._Eco), eco
    return eco


def test_zero_derivative_species_are_in_the_state_vector():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "catalyst_species.esm"
    prob = ivp(path)
    assert list(prob.names) == _eco(path).names == ["Chem.A", "Chem.B", "Chem.C", "Chem.D"]
    J = prob.jac_csr(0.0, prob.y0).toarray()
    # C is a catalyst, D a spectator: zero rows; A's row reads C (k1*A*C).
    assert not J[2].any() and not J[3].any()
    assert J[0, 2] == pytest.approx(-0.7 * 1.0)
    np.testing.assert_array_equal(prob.fun(0.0, prob.y0)[2:], [0.0, 0.0])


def test_several_models_build_the_whole_document_and_model_picks_one():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "two_models.esm"
    assert list(ivp(path).names) == _eco(path).names == ["Decay.x", "Logistic.y"]
    one = ivp(path, model="Decay")
    assert list(one.names) == ["Decay.x"]
    assert one.jac_csr(0.0, one.y0).toarray()[0, 0] == pytest.approx(-0.4)


def test_observed_of_a_nested_subsystem_is_inlined():
    from esmjac.adapters.scipy import ivp
    path = DOCS / "nested_observed.esm"
    prob = ivp(path)
    eco = _eco(path)
    assert list(prob.names) == eco.names
    i, j = eco.names.index("Host.h"), eco.names.index("Host.Sub.s")
    h, s = prob.y0[i], prob.y0[j]
    J = prob.jac_csr(0.0, prob.y0).toarray()
    # dh/dt = rate h - c h^2 with rate = k s^2: d/ds = 2 k s h, by hand
    assert J[i, j] == pytest.approx(2 * 2.0 * s * h)
    assert J[i, i] == pytest.approx(2.0 * s * s - 2 * 0.3 * h)


def test_an_aggregate_result_is_placed_from_1_and_a_singleton_axis_broadcasts():
    """Hand derivation of aggregate_placement.esm (the proxy27 class): with
    c[i,j] = 1 + i/10 + 3j/100, f[r,s] = a c[r,2] c[r,3] + k c[r,s]^2 - kappa c[r,s]
    (term 1 broadcast over s from its j = 2 box, term 2 shifted from i in [2,4])."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "aggregate_placement.esm")
    a, k, kappa = 0.7, 0.2, 0.05
    c = 1.0 + 0.1 * np.arange(1, 4)[:, None] + 0.03 * np.arange(1, 5)[None, :]
    np.testing.assert_allclose(prob.y0.reshape(3, 4), c, rtol=1e-15)
    f = a * c[:, [1]] * c[:, [2]] + k * c ** 2 - kappa * c
    np.testing.assert_allclose(prob.fun(0.0, prob.y0).reshape(3, 4), f, rtol=1e-14)
    J = prob.jac_csr(0.0, prob.y0).toarray()
    want = np.zeros((12, 12))
    for r in range(3):
        for s in range(4):
            row = 4 * r + s
            want[row, row] += 2 * k * c[r, s] - kappa
            want[row, 4 * r + 1] += a * c[r, 2]
            want[row, 4 * r + 2] += a * c[r, 1]
    np.testing.assert_allclose(J, want, rtol=1e-14, atol=0)


def test_an_aggregate_range_of_the_wrong_extent_is_refused(tmp_path):
    """i in [2,3] for an axis of 4: earthsci-ast's evaluator refuses the
    shape (3 vs 4); esmjac refuses it typed, before compiling anything."""
    import json
    from esmjac.adapters.scipy import ivp
    from esmjac.errors import JacError
    doc = {"esm": "1.0.0", "metadata": {"name": "m", "authors": ["esmjac"]},
           "index_sets": {"x": {"kind": "interval", "size": 4}},
           "models": {"M": {"variables": {"u": {"type": "unknown", "shape": ["x"], "default": 1.0}},
                            "equations": [{"lhs": {"op": "D", "args": ["u"], "wrt": "t"},
                                           "rhs": {"op": "aggregate", "output_idx": ["i"], "args": ["u"],
                                                   "ranges": {"i": [2, 3]},
                                                   "expr": {"op": "index", "args": ["u", "i"]}}}]}}}
    path = tmp_path / "short.esm"
    path.write_text(json.dumps(doc))
    assert isinstance(corpus.ecosystem(str(path)), str)       # earthsci-ast cannot evaluate it either
    with pytest.raises(JacError) as err:
        ivp(path)
    assert err.value.code == "invalid_document" and "[2, 3]" in str(err.value)


def test_function_tables_by_hand():
    """function_table.esm at x = 1.3, z = 1.1, by hand: rate(z) on the knot
    interval [0.7, 1.5] (values 0.5, 0.4) is 0.45 with slope -1/8; the
    bilinear tables on the cell a in [1, 2.5], b in [1, 2] (weights 0.2, 0.1)."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "function_table.esm")
    x, z = 1.3, 1.1
    y = np.array([x, z])
    lo = np.array([[1.9, 2.1], [1.7, 2.6]])      # output "lo" at a in {1, 2.5}, b in {1, 2}
    hi = np.array([[2.2, 1.4], [2.0, 1.0]])
    g = hi - 0.5 * lo
    wa, wb = (x - 1.0) / 1.5, (z - 1.0) / 1.0
    val = (g[0, 0] * (1 - wa) * (1 - wb) + g[1, 0] * wa * (1 - wb) + g[0, 1] * (1 - wa) * wb + g[1, 1] * wa * wb)
    dga = ((g[1, 0] - g[0, 0]) * (1 - wb) + (g[1, 1] - g[0, 1]) * wb) / 1.5
    dgb = (g[0, 1] - g[0, 0]) * (1 - wa) + (g[1, 1] - g[1, 0]) * wa
    np.testing.assert_allclose(prob.fun(0.0, y), [-0.45 * x, val], rtol=1e-14)
    np.testing.assert_allclose(prob.jac_csr(0.0, y).toarray(), [[-0.45, x / 8], [dga, dgb]], rtol=1e-13)


def test_filtered_prefix_sums_by_hand():
    """prefix_sums.esm: f_u[i] = -k B_i u_i with B_i = Σ_{j<=i} w u_j, and
    f_v[i] = Σ_{j<i} u_j. By hand: ∂f_u[i]/∂u_j = -k w u_i (j < i),
    -k (B_i + w u_i) on the diagonal; ∂f_v[i]/∂u_j = 1 for j < i."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "prefix_sums.esm")
    k, w = 0.3, 2.0
    u = 1.0 + 0.25 * np.arange(1, 5)
    y = np.concatenate([u, np.zeros(4)])
    np.testing.assert_allclose(prob.y0, y, rtol=1e-15)
    B = np.cumsum(w * u)
    f = np.concatenate([-k * B * u, np.concatenate([[0.0], np.cumsum(u)[:-1]])])
    np.testing.assert_allclose(prob.fun(0.0, y), f, rtol=1e-14)
    want = np.zeros((8, 8))
    for i in range(4):
        want[i, :i] = -k * w * u[i]
        want[i, i] = -k * (B[i] + w * u[i])
        want[4 + i, :i] = 1.0
    np.testing.assert_allclose(prob.jac_csr(0.0, y).toarray(), want, rtol=1e-14, atol=0)


def test_bare_operands_align_by_index_set_name():
    """bare_broadcast.esm by hand: f_p[i,j] = 10 j - q[j] p[i,j] + 0.1 r[j,i]
    (w over b replicated along a; q over b; r over (b, a) read transposed)."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "bare_broadcast.esm")
    names = list(prob.names)
    rng = np.random.default_rng(1)
    y = rng.uniform(0.5, 1.5, len(names))
    at = {n: k for k, n in enumerate(names)}
    P = lambda i, j: at[f"M.p[{i},{j}]"]
    Q = lambda j: at[f"M.q[{j}]"]
    R = lambda j, i: at[f"M.r[{j},{i}]"]
    f = prob.fun(0.0, y)
    J = prob.jac_csr(0.0, y).toarray()
    for i in (1, 2):
        for j in (1, 2, 3):
            row = P(i, j)
            assert f[row] == pytest.approx(10 * j - y[Q(j)] * y[P(i, j)] + 0.1 * y[R(j, i)], rel=1e-14)
            want = np.zeros(len(names))
            want[P(i, j)], want[Q(j)], want[R(j, i)] = -y[Q(j)], -y[P(i, j)], 0.1
            np.testing.assert_allclose(J[row], want, rtol=1e-14, atol=0)


def test_categorical_lookup_and_constant_geometry_by_hand():
    """categorical_geometry.esm: r = [4, 8][sea = 2] = 8, the squares
    [0,2]x[0,1] and [1,3]x[0.5,2] overlap in 1 x 0.5, so
    f = 0.5 / 8 - 0.1 x^2 and J = -0.2 x."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "categorical_geometry.esm")
    for x in (2.0, 0.3):
        y = np.array([x])
        assert prob.fun(0.0, y)[0] == pytest.approx(0.5 / 8 - 0.1 * x * x, rel=1e-14)
        assert prob.jac_csr(0.0, y).toarray()[0, 0] == pytest.approx(-0.2 * x, rel=1e-14)


def test_running_max_and_column_min_by_hand():
    """running_max.esm: f_m[i] = max_{j<=i} u_j^2 and f_lo = -min_j u_j; the
    Jacobian is the arg-extremum term's: 2 u_j* at (m_i, u_j*), -1 at (lo, u_argmin)."""
    from esmjac.adapters.scipy import ivp
    prob = ivp(DOCS / "running_max.esm")
    names = list(prob.names)
    u = np.array([1.2, 0.4, 1.9, 0.7])          # arg-max of u_j^2 over j <= i: 1, 1, 3, 3; arg-min: 2
    y = np.concatenate([u, np.zeros(5)])
    f = prob.fun(0.0, y)
    J = prob.jac_csr(0.0, y).toarray()
    arg = [0, 0, 2, 2]
    for i in range(4):
        row = names.index(f"R.m[{i + 1}]")
        assert f[row] == pytest.approx(u[arg[i]] ** 2, rel=1e-15)
        want = np.zeros(len(names))
        want[arg[i]] = 2 * u[arg[i]]
        np.testing.assert_allclose(J[row], want, rtol=1e-15, atol=0)
    row = names.index("R.lo")
    assert f[row] == -0.4
    want = np.zeros(len(names))
    want[1] = -1.0
    np.testing.assert_array_equal(J[row], want)


def test_table_counts_and_headline():
    rs = [corpus.Outcome("a", "x", "match"), corpus.Outcome("a", "y", "refusal", "[empty_bands] …"),
          corpus.Outcome("b", "z", "not_evaluable", "SchemaValidationError")]
    t = corpus.table(rs)
    assert "| a | 1 | 1 | 0 | 0 | 0 | 0 |" in t
    assert "| b | 0 | 0 | 0 | 0 | 1 | 0 |" in t
    assert "1 of 2 models" in t and "(50.0%)" in t


def test_a_wrong_jacobian_is_reported_as_a_mismatch(monkeypatch):
    """The check can fail: a compiled Jacobian scaled by 1.01 is caught."""
    from esmjac.adapters import scipy as sp
    real = sp.IvpProblem.jac_csr

    def off(self, t, y):
        return real(self, t, y) * 1.01

    monkeypatch.setattr(sp.IvpProblem, "jac_csr", off)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = corpus.check_document(str(DOCS / "two_models.esm"), oracle=False)
    assert r.outcome == "mismatch" and "Jacobian entry" in r.detail


@pytest.mark.parametrize("x,z", [(-1.0, 0.25), (0.0, -3.0), (0.5, 0.5), (1.0, 0.75), (2.0, 1.0),
                                 (3.0, 0.1), (4.0, 2.0), (7.0, 0.5)])
def test_closed_interp_functions_at_knots_and_outside(x, z):
    """Compiled interp.linear/bilinear/searchsorted against earthsci-ast's own
    evaluation at knots (ties), between knots and outside the axes; the
    Jacobian against central differences away from the knots."""
    from esmjac.adapters.scipy import ivp
    path = DOCS / "interp_tables.esm"
    prob = ivp(path)
    eco = _eco(path)
    assert list(prob.names) == eco.names == ["T.x", "T.z", "T.y"]
    y = np.array([x, z, 1.7])
    np.testing.assert_allclose(prob.fun(0.0, y), np.array(eco.rhs(0.0, y.copy())), rtol=1e-13, atol=1e-15)
    h = 1e-7
    yp, ym = y + [h, 0, 0], y - [h, 0, 0]
    if float(x) not in (0.0, 0.5, 1.0, 2.0, 3.0, 4.0):     # a kink: one-sided slopes differ
        fd = (np.array(eco.rhs(0.0, yp)) - np.array(eco.rhs(0.0, ym))) / (2 * h)
        np.testing.assert_allclose(prob.jac_csr(0.0, y).toarray()[:, 0], fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("t", [0.0, -1.0, 86399.0, 951782400.0, 951868799.0, 1709164800.0,
                               1709251199.5, 4102444800.0, -2208988800.0, 1234567890.25])
def test_datetime_functions_of_t_compiled(t):
    """Compiled datetime.* of t (leap days, year and day boundaries, pre-epoch)
    against earthsci-ast's RHS; the Jacobian is the (piecewise constant)
    coefficient of y."""
    from esmjac.adapters.scipy import ivp
    path = DOCS / "datetime_clock.esm"
    prob = ivp(path)
    eco = _eco(path)
    y = np.array([1.3])
    f = prob.fun(t, y)
    np.testing.assert_allclose(f, np.array(eco.rhs(t, y.copy())), rtol=1e-14, atol=0)
    assert prob.jac_csr(t, y).toarray()[0, 0] == pytest.approx(f[0] / y[0], rel=1e-14)


def test_datetime_expansion_equals_earthsci_ast():
    """The primitive expansion (model/closed.py), evaluated by the oracle,
    equals earthsci-ast's closed functions exactly over many times."""
    from earthsci_ast.registered_functions import evaluate_closed_function
    from esmjac.model.closed import expand_closed
    from esmjac.model.evaluate import ev
    from esmjac.model.expr import node
    rng = np.random.default_rng(3)
    ts = [0.0, -1.0, 86400.0, 951782400.0, 4102444800.0] + list(rng.uniform(-3e9, 5e9, 300))
    for f in ("year", "month", "day", "hour", "minute", "second", "day_of_year", "julian_day",
              "is_leap_year"):
        e = expand_closed(node("fn", ["t"], name=f"datetime.{f}"))
        for t in ts:
            assert ev(e, {"t": float(t)}) == float(evaluate_closed_function(f"datetime.{f}", [float(t)])), (f, t)
