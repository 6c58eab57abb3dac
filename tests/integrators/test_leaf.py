"""The native Rosenbrock leaf (esmjac.integrators.leaf; kind "native.rosenbrock").

Oracles: SciPy's Radau at rtol 1e-10 on the same right-hand side (the RHS
itself is checked against earthsci-ast in tests/runtime); bitwise equality
of a lane's result alone, in a grid, in another position, with other
neighbours, threads or masking — the lane-independence contract; hand-set
failures (a NaN forcing, a step limit) for containment.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from esmjac.adapters.native import rosenbrock
from esmjac.errors import JacError
from esmjac.integrators.lanestep import STATUS
from esmjac.models.mechanism import lift
from tests.support.leafgrid import lane_blocks, replay_case
from tests.support.programs import TROPO12

NS = 15           # tropo12 species
DT = 1200.0       # a 20-minute chemistry step


@pytest.fixture(scope="module")
def doc8():
    return lift(json.loads(TROPO12.read_text()), 8)


@pytest.fixture(scope="module")
def leaf(doc8):
    return rosenbrock(doc8, rtol=1e-6, threads=1)


def _grid(leaf, L, seed=0):
    """Heterogeneous lanes: states scaled by 10^U(-1, 1), half of them night."""
    rng = np.random.default_rng(seed)
    base = leaf.initial_state().reshape(NS, -1)[:, :1]
    u = np.ascontiguousarray((base * 10 ** rng.uniform(-1, 1, L)[None, :]).reshape(-1))
    fj = np.where(np.arange(L) % 2 == 0, 0.0, 1.0)
    return u, fj


def _cols(u, L):
    return u.reshape(NS, L)


def test_matches_tight_radau(leaf):
    L = 4
    u, fj = _grid(leaf, L, 1)
    v = u.copy()
    st = leaf.advance(v, 0.0, DT, forcing=fj)
    assert st.success, st.message
    assert np.all(st.t == DT) and np.all(st.naccept + st.nreject == st.nsteps)
    rhs = leaf.rhs_program
    p = leaf.p

    sc = rhs.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), p, t, fj, np.empty_like(y), sc)

    ref = solve_ivp(f, (0.0, DT), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(leaf.atol, L),
                    jac_sparsity=lane_blocks(NS, L))
    assert ref.success
    yr = ref.y[:, -1]
    big = np.abs(yr) > 1e3 * np.repeat(leaf.atol, L)
    rel = np.abs(v - yr)[big] / np.abs(yr[big])
    assert rel.max() < 5e-4, rel.max()


def test_permutations_are_read_only_products(leaf):
    """The elimination order the sensitivities read (``perm``/``iperm``) is
    the plan's ordering and, like every build product, cannot be written:
    a caller scribbling on it would silently permute every later step."""
    order = list(leaf.plan.info["ordering"])
    assert leaf.perm.tolist() == order and sorted(order) == list(range(NS))
    assert np.array_equal(leaf.iperm[leaf.perm], np.arange(NS))
    for a in (leaf.perm, leaf.iperm):
        assert not a.flags.writeable
        with pytest.raises(ValueError):
            a[0] = a[1]


def test_lane_alone_equals_lane_in_grid_bitwise(doc8):
    lf = rosenbrock(doc8, threads=1)
    L = 300                                     # two LU chunks, ragged
    u, fj = _grid(lf, L, 2)
    v = u.copy()
    st = lf.advance(v, 0.0, DT, forcing=fj)
    assert st.success
    steps = st.nsteps.copy()
    assert len(set(steps.tolist())) > 3         # lanes really took different step counts
    for l in (0, 1, 137, 299):
        w = _cols(u, L)[:, l].copy()
        s1 = lf.advance(w, 0.0, DT, forcing=fj[l:l + 1])
        assert np.array_equal(w, _cols(v, L)[:, l]) and s1.nsteps[0] == steps[l]
    # reversed lane order, other neighbours, two threads, masking: same bits
    perm = np.arange(L)[::-1].copy()
    w = np.ascontiguousarray(_cols(u, L)[:, perm]).reshape(-1)
    for other in (rosenbrock(doc8, threads=2), rosenbrock(doc8, threads=1, compact=False)):
        w2 = w.copy()
        other.advance(w2, 0.0, DT, forcing=fj[perm])
        assert np.array_equal(_cols(w2, L), _cols(v, L)[:, perm])
        other.close()


def test_one_stiff_lane_neither_slows_nor_changes_the_others(doc8, leaf):
    L = 6
    u, fj = _grid(leaf, L, 3)
    v = u.copy()
    st = leaf.advance(v, 0.0, DT, forcing=fj)
    calm = (st.nsteps.copy(), v.copy())
    # Lane 2 gets 1e4 times the photolysis (and 100x NOx): far stiffer.
    u2, fj2 = u.copy(), fj.copy()
    fj2[2] = 1e4
    for s in (3, 4):                            # NO, NO2
        u2[s * L + 2] *= 100
    v2 = u2.copy()
    st2 = leaf.advance(v2, 0.0, DT, forcing=fj2)
    assert st2.success, st2.message
    assert st2.nsteps[2] > 2 * calm[0][2]
    others = [l for l in range(L) if l != 2]
    assert np.array_equal(st2.nsteps[others], calm[0][others])
    assert np.array_equal(_cols(v2, L)[:, others], _cols(calm[1], L)[:, others])
    # The shared-step mode is slowed by it: every lane takes the stiff lane's steps.
    sh = rosenbrock(doc8, step="shared", rtol=1e-6, threads=1)
    st3 = sh.advance(u2.copy(), 0.0, DT, forcing=fj2)
    assert np.all(st3.nsteps >= st2.nsteps[2])


def test_shared_mode_is_lock_step(doc8, leaf):
    sh = rosenbrock(doc8, rtol=1e-6, step="shared", threads=1)
    L = 6
    u, fj = _grid(leaf, L, 4)
    v, w = u.copy(), u.copy()
    s_lane = leaf.advance(v, 0.0, DT, forcing=fj)
    lane_steps = s_lane.nsteps.copy()
    s_sh = sh.advance(w, 0.0, DT, forcing=fj)
    assert s_sh.success and len(set(s_sh.nsteps.tolist())) == 1
    assert s_sh.nsteps[0] >= lane_steps.max()
    big = np.abs(w) > 1e3 * np.repeat(leaf.atol, L)
    assert np.max(np.abs(v - w)[big] / np.abs(w[big])) < 1e-3


def test_failing_lane_is_contained_and_reported(doc8, leaf):
    L = 5
    u, fj = _grid(leaf, L, 5)
    v = u.copy()
    leaf.advance(v, 0.0, DT, forcing=fj)
    good = v.copy()
    fj_bad = fj.copy()
    fj_bad[3] = np.nan                          # this cell's photolysis is garbage
    w = u.copy()
    st = leaf.advance(w, 0.0, DT, forcing=fj_bad)
    assert not st.success and st.failed.tolist() == [3]
    assert st.status[3] == 4 and "non-finite" in STATUS[4] and "lane 3" in st.message
    assert np.array_equal(_cols(w, L)[:, 3], _cols(u, L)[:, 3])    # last accepted = initial
    ok = [0, 1, 2, 4]
    assert np.array_equal(_cols(w, L)[:, ok], _cols(good, L)[:, ok])
    assert np.all(st.status[ok] == 0)
    # A step limit: status 2, state at the last accepted point, time before the end.
    lim = rosenbrock(doc8, rtol=1e-6, threads=1, max_steps=3)
    x = u.copy()
    st = lim.advance(x, 0.0, DT, forcing=fj)
    assert np.all(st.status == 2) and np.all(st.t < DT) and np.all(st.nsteps == 3)


def test_out_t_eval_and_continuation(leaf):
    L = 3
    u, fj = _grid(leaf, L, 6)
    out = np.empty_like(u)
    st = leaf.advance(u, 0.0, DT, forcing=fj, out=out)
    assert st.success and not np.array_equal(out, u)         # u untouched, out written
    sol = leaf.solve((0.0, DT), y0=u, t_eval=[300.0, 600.0, DT], forcing=fj)
    assert sol.success and sol.y_eval.shape == (3, u.size) and sol.t == DT
    # each output interval is one advance with the step size carried over
    v = u.copy()
    s1 = leaf.advance(v, 0.0, 300.0, forcing=fj)
    assert np.array_equal(v, sol.y_eval[0])
    h = s1.h.copy()
    leaf.advance(v, 300.0, 300.0, forcing=fj, h0=h)
    assert np.array_equal(v, sol.y_eval[1])
    # output stops change the steps, not the answer (beyond the tolerance)
    assert np.max(np.abs(sol.y - out) / (np.abs(out) + 1e3 * np.repeat(leaf.atol, L))) < 1e-4


def test_callable_forcing_at_stage_times(leaf):
    # fj ramps linearly over the step (sunrise); reference: Radau with fj(t).
    L = 2
    u, _ = _grid(leaf, L, 7)
    ramp = lambda t: np.clip(t / DT, 0.0, 1.0)  # noqa: E731
    calls = []

    def forcing(t, lanes):
        calls.append(len(lanes))
        return ramp(np.asarray(t))[None, :] * np.array([1.0, 0.5])[lanes][None, :]

    v = u.copy()
    st = leaf.advance(v, 0.0, DT, forcing=forcing)
    assert st.success and calls
    rhs, p = leaf.rhs_program, leaf.p

    sc = rhs.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), p, t, ramp(t) * np.array([1.0, 0.5]), np.empty_like(y), sc)

    ref = solve_ivp(f, (0.0, DT), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(leaf.atol, L),
                    jac_sparsity=lane_blocks(NS, L))
    yr = ref.y[:, -1]
    big = np.abs(yr) > 1e3 * np.repeat(leaf.atol, L)
    assert np.max(np.abs(v - yr)[big] / np.abs(yr[big])) < 1e-3


def test_tile_width_does_not_change_a_bit(doc8):
    # LaneSparseBlocks tiles of 16 lanes (the default; compaction leaves partial
    # tiles) vs one tile of the active lanes: the same arithmetic per lane, so
    # the same bits.
    L = 40
    doc = lift(json.loads(TROPO12.read_text()), L)
    a = rosenbrock(doc, rtol=1e-4, threads=1, tile=None)
    b = rosenbrock(doc, rtol=1e-4, threads=1)
    assert a.tile is None and b.tile == 16
    u, fj = _grid(a, L, 3)
    va, vb = u.copy(), u.copy()
    sa, sb = a.advance(va, 0.0, DT, forcing=fj), b.advance(vb, 0.0, DT, forcing=fj)
    assert sa.success and sb.success and np.array_equal(va, vb)
    assert np.array_equal(sa.nsteps, sb.nsteps) and np.array_equal(sa.h, sb.h)
    w = 1.0 / np.abs(u).clip(1.0)
    ga, gb = a.gradient(u, 0.0, 300.0, w, forcing=fj, wrt="state"), b.gradient(u, 0.0, 300.0, w, forcing=fj,
                                                                              wrt="state")
    assert np.array_equal(ga[1], gb[1])
    with pytest.raises(JacError):
        rosenbrock(doc, tile=0)


def test_lane_blocks_and_lu_tiles_do_not_change_a_bit(monkeypatch):
    # 600 lanes: the iteration matrix spans several CHUNK-lane LU tiles (the
    # last one partial); lane blocks of BLOCK_LANES (here forced to 100, i.e.
    # 7 blocks of 96 lanes, run one after the other or on two threads) vs one
    # block; tiled default vs tile=None. Oracle: the untiled single-block
    # leaf's bits (itself checked against Radau above) and its per-lane stats.
    from esmjac.integrators import leaf as _leaf
    L = 600
    doc = lift(json.loads(TROPO12.read_text()), L)
    ref = rosenbrock(doc, rtol=1e-4, threads=1, tile=None)
    u, fj = _grid(ref, L, 5)
    v0 = u.copy()
    s0 = ref.advance(v0, 0.0, DT, forcing=fj)
    assert s0.success and np.any(v0 != u)
    n0 = s0.nsteps.copy()
    tiled = rosenbrock(doc, rtol=1e-4, threads=1)
    # the W-method keeps Jacobians and LUs between attempts: a block must not
    # see the previous block's (one stepper per thread serves its blocks in turn)
    wm = rosenbrock(doc, rtol=1e-4, threads=1, method="ros34pw2")
    w0 = u.copy()
    sw = wm.advance(w0, 0.0, DT, forcing=fj)
    assert sw.success and int(sw.njev.sum()) < int(sw.naccept.sum())       # it did reuse
    nw = sw.nsteps.copy()
    for blocks, threads in ((_leaf.BLOCK_LANES, 1), (100, 1), (100, 2)):
        monkeypatch.setattr(_leaf, "BLOCK_LANES", blocks)
        for leaf, vref, nref in ((tiled, v0, n0), (ref, v0, n0), (wm, w0, nw)):
            leaf._scratch.clear()
            leaf.threads = threads
            v = u.copy()
            st = leaf.advance(v, 0.0, DT, forcing=fj)
            assert np.array_equal(v, vref), (blocks, threads, leaf.tile)
            assert np.array_equal(st.nsteps, nref)
            # scratch per worker thread, not per block: it does not grow with the grid
            (blk, steppers, *_), = leaf._scratch.values()
            assert len(steppers) == threads and (blocks > L or len(blk) > threads), (len(steppers), len(blk))


def test_lanes_grouped_by_previous_step_counts_do_not_change_a_bit(monkeypatch):
    # An advance groups its lanes into blocks by their step counts in the
    # previous advance of the same lane count (leaf.ORDER_LANES). Oracle: the
    # same advance with grid-order blocks (ORDER_LANES off, fresh scratch):
    # the same bits and the same per-lane statistics, for Rodas3 (tiled and
    # tile=None) and the W-method (kept Jacobians follow their lanes), on one
    # and two threads. The order is checked to be in use (a permutation, not
    # the identity, whose blocks hold lanes of like step counts).
    from esmjac.integrators import leaf as _leaf
    from esmjac.integrators.lanestep import LaneStepper
    L = 600
    doc = lift(json.loads(TROPO12.read_text()), L)
    monkeypatch.setattr(_leaf, "BLOCK_LANES", 100)
    seen = []
    run = LaneStepper.run

    def spy(self, *a, **kw):
        seen.append(a[18] if len(a) == 19 else kw.get("lanes"))
        return run(self, *a, **kw)
    monkeypatch.setattr(LaneStepper, "run", spy)
    for kw, threads in (({}, 1), ({"tile": None}, 1), ({"method": "ros34pw2"}, 1), ({}, 2)):
        leaf = rosenbrock(doc, rtol=1e-4, threads=threads, **kw)
        u, fj = _grid(leaf, L, 7)
        monkeypatch.setattr(_leaf, "ORDER_LANES", False)
        leaf._scratch.clear()
        v0 = u.copy()
        s0 = leaf.advance(v0, 0.0, DT, forcing=fj)
        ref = {k: np.array(getattr(s0, k)) for k in ("status", "nsteps", "naccept", "nreject", "nfev", "njev",
                                                        "ndec", "h", "t")}
        assert s0.success and len(set(ref["nsteps"].tolist())) > 3
        monkeypatch.setattr(_leaf, "ORDER_LANES", True)
        for call in range(2):               # the first call in grid order, the second grouped
            seen.clear()
            v = u.copy()
            st = leaf.advance(v, 0.0, DT, forcing=fj)
            assert np.array_equal(v, v0), (kw, threads, call)
            for k, a in ref.items():
                assert np.array_equal(getattr(st, k), a), (kw, threads, call, k)
        lanes = seen[0]
        assert lanes is not None and sorted(lanes.tolist()) == list(range(L)) \
            and not np.array_equal(lanes, np.arange(L))
        # the first block holds the lanes that needed the fewest steps
        (blocks, *_), = leaf._scratch.values()
        c0 = blocks[0][1]
        assert c0 < L and ref["nsteps"][lanes[:c0]].max() <= np.sort(ref["nsteps"])[c0 - 1]


def _with_explicit_t(doc):
    """tropo12 with a diurnal O3 source that names t: + 1e8·(1 + sin(t/300))."""
    import copy
    d = copy.deepcopy(doc)
    m = next(iter(d["models"].values()))
    eq = next(e for e in m["equations"] if e["lhs"]["args"] == ["O3"])
    eq["rhs"]["expr"]["args"].append(
        {"op": "*", "args": [1e8, {"op": "+", "args": [1, {"op": "sin", "args": [{"op": "/", "args": ["t", 300]}]}]}]})
    return d


def test_explicit_t_in_the_rhs_is_each_lanes_own_time():
    # Oracle: the t-program of the unmodified document (scalar t) under tight
    # Radau, per lane from its own start; the leaf sets t per lane and stage.
    from esmjac.runtime.programs import RhsProgram
    L = 2
    doc = _with_explicit_t(lift(json.loads(TROPO12.read_text()), L))
    lf = rosenbrock(doc, rtol=1e-6, threads=1)
    assert lf.time_field and lf.forcing_names == ("fj",)
    u, fj = _grid(lf, L, 5)
    t0 = 5000.0
    v = u.copy()
    st = lf.advance(v, t0, DT, forcing=fj)
    assert st.success, st.message
    rhs = RhsProgram.build(doc)
    sc = rhs.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), rhs.p0, t, fj, np.empty_like(y), sc)

    ref = solve_ivp(f, (t0, t0 + DT), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(lf.atol, L))
    yr = ref.y[:, -1]
    big = np.abs(yr) > 1e3 * np.repeat(lf.atol, L)
    assert np.max(np.abs(v - yr)[big] / np.abs(yr[big])) < 1e-3
    # t matters here (another start time gives another answer) and a lane alone is bitwise the same
    w = u.copy()
    lf.advance(w, 0.0, DT, forcing=fj)
    assert not np.allclose(w, v, rtol=1e-3)
    one = np.ascontiguousarray(_cols(u, L)[:, 1])
    lf.advance(one, t0, DT, forcing=fj[1:])
    assert np.array_equal(one, _cols(v, L)[:, 1])
    # the user's own forcing callable beside the leaf's t: the same values, the same bits
    z = u.copy()
    lf.advance(z, t0, DT, forcing=lambda t, lanes: fj[lanes][None, :])
    assert np.array_equal(z, v)
    with pytest.raises(JacError) as e:
        lf.gradient(u, t0, DT, np.ones_like(u), forcing=fj)
    assert e.value.code == "bad_option"


def test_dicts_defaults_and_refusals(doc8, leaf):
    lf = rosenbrock(doc8, p={"T": 290.0}, threads=1)
    assert lf.p[lf.param_names.index("T")] == 290.0
    y = lf.initial_state({"O3": 2e12})
    assert np.all(y[:8] == 2e12)
    # default atol scales with the species (ppb- or molecule-unit models alike)
    assert lf.atol[lf.species.index("CH4")] > 1e5 * lf.atol[lf.species.index("O1D")]
    cases = [
        (lambda: rosenbrock(doc8, p={"nope": 1.0}), "unresolvable_column"),
        (lambda: rosenbrock(doc8, p={"fj": 1.0}), "unresolvable_column"),
        (lambda: rosenbrock(doc8, p=[1.0, 2.0]), "bad_argument"),
        (lambda: rosenbrock(doc8, step="global"), "bad_option"),
        (lambda: rosenbrock(doc8, threads=0), "bad_option"),
        (lambda: rosenbrock(doc8, atol=-1.0), "bad_option"),
        (lambda: rosenbrock(doc8, atol={"XX": 1.0}), "unresolvable_column"),
        (lambda: rosenbrock(doc8, method="rk4"), "bad_option"),
        (lambda: rosenbrock(doc8, bogus=1), "bad_option"),
        (lambda: leaf.initial_state({"XX": 1.0}), "unresolvable_column"),
        (lambda: leaf.advance(np.ones(NS * 2 + 1), 0.0, DT, forcing=np.ones(2)), "bad_argument"),
        (lambda: leaf.advance(np.ones(NS * 2, np.float32), 0.0, DT, forcing=np.ones(2)), "bad_argument"),
        (lambda: leaf.advance(np.ones(NS * 2), 0.0, -1.0, forcing=np.ones(2)), "bad_argument"),
        (lambda: leaf.advance(np.ones(NS * 2), 0.0, DT, forcing=np.ones(3)), "bad_argument"),
        (lambda: leaf.advance(np.ones(NS * 2), 0.0, DT), "bad_argument"),     # 2 lanes: no defaults
        (lambda: leaf.advance(np.ones(NS * 2), 0.0, DT, forcing={"fx": 1.0}), "unresolvable_column"),
        (lambda: leaf.advance(np.ones(NS * 2), 0.0, DT, forcing=np.ones(2), out=np.ones(NS)), "bad_argument"),
    ]
    for call, code in cases:
        with pytest.raises(JacError) as e:
            call()
        assert e.value.code == code
    # dict forcing and the document's own defaults at its cell count work
    v = np.ones(NS * 2) * 1e6
    assert leaf.advance(v, 0.0, 10.0, forcing={"fj": [0.0, 1.0]}).success
    assert leaf.advance(leaf.initial_state(), 0.0, 10.0).success


# ---------------------------------------------------------------------------
# Sensitivities: discrete adjoint and tangent linear vs finite differences of
# the forward solve over the same (recorded) steps
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sens_case(doc8):
    lf = rosenbrock(lift(json.loads(TROPO12.read_text()), 2), rtol=1e-6, threads=1)
    u = lf.initial_state()
    fj = np.array([0.3, 1.0])
    rng = np.random.default_rng(11)
    w = rng.uniform(0.5, 1.5, u.size) / np.abs(u).clip(1.0)      # φ = w·y(T)
    _, y, phi = replay_case(lf, fj, w, 300.0)
    return lf, u, fj, w, phi, y


def test_replay_is_the_forward_solve(sens_case):
    lf, u, fj, w, phi, y = sens_case
    v = u.copy()
    lf.advance(v, 0.0, 300.0, forcing=fj)
    assert np.array_equal(v, y) and phi(u) == float(w @ y)


def test_adjoint_gradient_matches_finite_differences(sens_case):
    lf, u, fj, w, phi, y = sens_case
    yf, g, gp, st = lf.gradient(u, 0.0, 300.0, w, forcing=fj)
    assert st.success and np.array_equal(yf, y)
    rng = np.random.default_rng(12)
    for _ in range(3):                       # directional derivatives along scaled directions
        d = rng.standard_normal(u.size) * np.abs(u)
        eps = 1e-6
        fd = (phi(u + eps * d) - phi(u - eps * d)) / (2 * eps)
        assert abs(g @ d - fd) <= 1e-6 * abs(fd), (g @ d, fd)
    for name in ("T", "j_NO2", "j_O3_O1D"):
        k = lf.param_names.index(name)
        p0 = lf.p[k]
        pp, pm = lf.p.copy(), lf.p.copy()
        pp[k] += 1e-5 * p0
        pm[k] -= 1e-5 * p0
        fd = (phi(u, pp) - phi(u, pm)) / (2e-5 * p0)
        assert abs(gp[name] - fd) <= 1e-6 * abs(fd), (name, gp[name], fd)
    # the per-cell photolysis scaling: a gradient per lane (forcing in the leaf)
    assert gp["fj"].shape == (2,) and np.all(np.isfinite(gp["fj"]))
    for lane in range(2):
        fp, fm = fj.copy(), fj.copy()
        fp[lane] += 1e-5 * fj[lane]
        fm[lane] -= 1e-5 * fj[lane]
        fd = (phi(u, fzv=fp) - phi(u, fzv=fm)) / (2e-5 * fj[lane])
        assert abs(gp["fj"][lane] - fd) <= 1e-6 * abs(fd), (lane, gp["fj"][lane], fd)


def test_tangent_linear_agrees_with_adjoint_and_fd(sens_case):
    lf, u, fj, w, phi, y = sens_case
    _, g, gp, _ = lf.gradient(u, 0.0, 300.0, w, forcing=fj)
    d = np.random.default_rng(13).standard_normal(u.size) * np.abs(u)
    yf, dy, _ = lf.tangent(u, 0.0, 300.0, du0=d, dp={"T": 1.0}, forcing=fj)
    lhs, rhs = w @ dy, g @ d + gp["T"]
    assert abs(lhs - rhs) <= 1e-10 * abs(rhs)     # the two are exact transposes
    yf2, dy2, _ = lf.tangent(u, 0.0, 300.0, du0=d, forcing=fj)
    eps = 1e-6
    fd = (phi(u + eps * d) - phi(u - eps * d)) / (2 * eps)
    assert abs(w @ dy2 - fd) <= 1e-6 * abs(fd)
    with pytest.raises(JacError) as e:
        lf.gradient(u, 0.0, 300.0, w, forcing=lambda t, lanes: np.ones((1, lanes.size)))
    assert e.value.code == "bad_option"


def test_cells_are_checked_before_compiled_code(doc8, leaf):
    # A chunk of a larger grid passes its lanes' cells; they are checked in
    # Python (dtype, size, each index inside its dimension). Oracle: the
    # default map, passed explicitly, gives the bits of cells=None.
    from esmjac.runtime.workspace import lane_cells
    shape = tuple(leaf.rhs_program.layout.cell_shape)
    u, fj = _grid(leaf, 8, 3)
    v0, v1 = u.copy(), u.copy()
    leaf.advance(v0, 0.0, DT, forcing=fj)
    leaf.advance(v1, 0.0, DT, forcing=fj, cells=lane_cells(shape, 8))
    assert np.array_equal(v0, v1)
    good = lane_cells(shape, 8)
    too_big = good.copy()
    too_big[-1] = (shape[-1] if shape else 1) + 1
    for cells in (good.astype(np.int32), good[:-1], np.zeros_like(good), too_big, list(good)):
        with pytest.raises(JacError) as e:
            leaf.advance(u.copy(), 0.0, DT, forcing=fj, cells=cells)
        assert e.value.code == "bad_argument"


def test_solve_outputs_at_t0_and_repeated_times(leaf):
    """An output at t_span[0] is y0 itself and a repeated output time the same
    state again (zero-length intervals take no step; they used to leave every
    lane RUNNING, status -1); the other outputs are those of the same solve
    without them, bit for bit; after the last output the solve goes on to
    t_span[1]. Oracle: the outputs of leaf.advance calls chained by hand."""
    L = 3
    u, fj = _grid(leaf, L, 11)
    plain = leaf.solve((0.0, DT), y0=u, t_eval=[300.0, DT], forcing=fj)
    sol = leaf.solve((0.0, DT), y0=u, t_eval=[0.0, 300.0, 300.0, DT], forcing=fj)
    assert sol.success, sol.message
    assert np.all(sol.stats.status == 0) and sol.t == DT
    assert np.array_equal(sol.y_eval[0], u)
    assert np.array_equal(sol.y_eval[1], plain.y_eval[0]) and np.array_equal(sol.y_eval[2], sol.y_eval[1])
    assert np.array_equal(sol.y_eval[3], plain.y_eval[1]) and np.array_equal(sol.y, plain.y)
    assert sol.nsteps == plain.nsteps
    # the last output before the end: y is the state at t_span[1]
    early = leaf.solve((0.0, DT), y0=u, t_eval=[0.0, 300.0], forcing=fj)
    v = u.copy()
    s1 = leaf.advance(v, 0.0, 300.0, forcing=fj)
    assert early.success and np.array_equal(early.y_eval[1], v)
    leaf.advance(v, 300.0, DT - 300.0, forcing=fj, h0=s1.h.copy())
    assert early.t == DT and np.array_equal(early.y, v)
    # an empty span: nothing to do, y0 back, no step
    empty = leaf.solve((5.0, 5.0), y0=u, forcing=fj)
    assert empty.success and empty.t == 5.0 and empty.nsteps == 0
    assert np.array_equal(empty.y, u) and np.array_equal(empty.y_eval[0], u)


_LEAF_FIRST_CALLS = r"""
import numpy as np
from esmjac.adapters.native import rosenbrock
from esmjac.models.gridded import gridded_tropo12
doc, forcing, y0 = gridded_tropo12(8)
out = {}
leaf = rosenbrock(doc, forcing=forcing, rtol=1e-4, threads=1)
compiled()                                           # the build's own compiles
u = leaf.initial_state()
st = leaf.advance(u, 0.0, 600.0)
out["advance"] = compiled()
ok = bool(st.success)
st = leaf.advance(u, 600.0, 600.0, h0=st.h.copy())
ro = u.copy()
ro.setflags(write=False)
fj = np.array(forcing["fj"])
fj.setflags(write=False)
st2 = leaf.advance(ro, 1200.0, 600.0, forcing=fj, out=np.empty_like(u))
big = np.repeat(u.reshape(15, -1), 40, axis=1).reshape(-1)
st3 = leaf.advance(big, 0.0, 600.0, forcing={"fj": 0.5}, h0=10.0)
sol = leaf.solve((0.0, 1200.0), t_eval=[0.0, 600.0, 1200.0])
out["later calls"] = compiled()
ok = ok and st.success and st2.success and st3.success and sol.success
print("RESULT " + json.dumps({"new": out, "ok": ok}))
"""


@pytest.mark.slow
def test_no_numba_specialization_after_build(tmp_path):
    """rosenbrock() compiles what the first advance runs: in a fresh process
    no Numba dispatcher resolves a new signature in the first advance, nor
    in later ones with other argument kinds (h0 per lane or scalar, a
    read-only state into out=, a read-only forcing, a dict forcing, 320
    lanes whose cells finish at different steps) or solve. Before, the
    first advance compiled the whole stepper (18 s on a cold cache at
    10,000 cells)."""
    import os
    from tests.support.child import run_child
    from tests.support.compiles import SPY
    res = run_child(SPY + _LEAF_FIRST_CALLS, os.environ.get("ESMJAC_CACHE_DIR", tmp_path), timeout=900)
    assert res["ok"]
    for phase, new in res["new"].items():
        assert new == [], f"{phase}: kernels specialized after the build: {new}"


def test_long_calls_report_progress(doc8, leaf, monkeypatch):
    """With the build option progress=True, an advance or solve that runs
    past DELAY prints plain lines on stderr in a pipe (lanes done, output
    times done); a short one says nothing (a host model calls advance
    thousands of times); the default (None) says nothing in a pipe."""
    import io
    from esmjac.runtime import progress
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    loud = rosenbrock(doc8, rtol=1e-6, threads=1, options={"progress": True})
    u, fj = _grid(loud, 8, 3)
    err.seek(0)
    err.truncate(0)
    loud.advance(u.copy(), 0.0, DT, forcing=fj)
    assert err.getvalue() == ""                      # shorter than DELAY
    monkeypatch.setattr(progress, "DELAY", 0.0)      # every call is "long"
    loud.advance(u.copy(), 0.0, DT, forcing=fj)
    assert "[esmjac] leaf advance: 8/8 lanes" in err.getvalue()
    loud.solve((0.0, DT), y0=u, t_eval=[0.0, 600.0], forcing=fj)
    assert "[esmjac] leaf solve: 3/3 output times" in err.getvalue()
    loud.gradient(u.copy(), 0.0, 600.0, np.ones(u.size), forcing=fj, wrt="state")
    assert "[esmjac] leaf gradient: forward steps, recorded" in err.getvalue()
    assert "[esmjac] leaf gradient: adjoint over" in err.getvalue()
    err.seek(0)
    err.truncate(0)
    leaf.advance(u.copy(), 0.0, DT, forcing=fj)      # progress=None: quiet in a pipe
    leaf.solve((0.0, DT), y0=u, t_eval=[0.0, 600.0], forcing=fj)
    assert err.getvalue() == ""
