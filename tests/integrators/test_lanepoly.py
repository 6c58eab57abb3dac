"""The leaf's mass-action kernel (esmjac.compile.massaction): hoisted bodies
expanded into sums of monomials and run by one generic kernel.

Oracles: NumPy evaluations of hand-written formulas (the expansion of a
small body, divisions and powers included); the programs' own unsplit
tapes (checked against earthsci-ast in tests/runtime) to a stated
rounding — 1e-13 of the sum of the terms' magnitudes, which the kernel
itself computes with |coefficients| on |inputs| — and central finite
differences of the right-hand side for the Jacobian; the kernel on other
lane counts, positions and tile widths (bitwise: every lane gets the same
operations). A body that is not polynomial in the state falls back to the
lane tape (the leaf's bits are then those of the tape).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from esmjac.adapters.native import rosenbrock
from esmjac.compile.engine import NO_SLOTS, run_tapes
from esmjac.compile.tape import run_tape
from esmjac.compile.twins import serial_twin
from esmjac._frozen import ro
from esmjac.integrators import bound
from esmjac.integrators.bound import BoundPrograms, lane_hoist
from esmjac.compile.massaction import MAX_GROWTH, PolyBody, expand, run_poly, scratch_size
from esmjac.models.mechanism import lift
from tests.support.programs import TROPO12

TAPE = {"engine": "tape", "progress": False}
ROUND = 1e-13           # |poly - tape| <= ROUND * sum |terms|
#: The oracle interpreter, in the flavour the package calls it (serial twin,
#: read-only inputs: engine.run_tapes): no specialisation of its own.
RUN = serial_twin(run_tape)


def _run(pb: PolyBody, u, f, h, p, L, W=0, P=0, C=None, zslots=NO_SLOTS, B=64, size=None):
    C = L if C is None else C
    out = np.full(size if size is not None else (int(pb.targets.max()) + 1) * L, np.nan)
    run_poly(*pb.arrays(), u, f, h, ro(p), out, L, W, P, C, zslots, B, np.empty(scratch_size(pb, W, B)))
    return out


def _abs(pb: PolyBody) -> PolyBody:
    """The same monomials with |coefficients| (run on |inputs|: Σ|terms|)."""
    a = np.abs(pb.ocoef)
    a.setflags(write=False)
    return PolyBody(pb.fptr, pb.fkind, pb.fidx, pb.optr, pb.omono, a, pb.targets)


# -- the expansion, by hand ---------------------------------------------------

def _body():
    """u0..u2 states, f0..f1 fields, h0 a prologue value, p0 a parameter;
    stores 0..5 (see the formulas in the test)."""
    ins: list = []

    def add(op, *args):
        ins.append((op, tuple(args)))
        return len(ins) - 1

    A, B, C = (add("lane", "u", i) for i in range(3))
    k1, k2 = add("lane", "f", 0), add("lane", "f", 1)
    h0, p0 = add("hoist", 0), add("param", 0)
    two, half, c3 = add("const", 2.0), add("const", 0.5), add("const", 3.0)
    kab = add("*", add("*", k1, A), B)                       # k1·A·B
    s0 = add("-", add("*", two, kab), add("*", k2, add("-", A, C)))   # 2k1AB - k2(A - C)
    s1 = add("/", add("*", add("*", k2, A), B), A)          # k2·A·B / A  (not cancelled)
    s2 = add("*", add("pow", add("+", A, B), two), half)     # (A + B)²/2
    s3 = add("-", kab, add("*", B, add("*", A, k1)))         # 0: the terms cancel
    s4 = add("neg", add("*", add("*", h0, p0), add("/", C, c3)))   # -h0·p0·C/3
    s5 = add("*", add("pow", A, add("const", -2.0)), k1)     # k1/A²
    return ins, [(s0, 0), (s1, 1), (s2, 2), (s3, 3), (s4, 4), (s5, 5)]


def test_expansion_matches_the_formulas():
    ins, stores = _body()
    pb = expand(ins, stores)
    assert pb is not None
    # k1·A·B is one monomial, shared by outputs 0 and 3 (which cancels to no term)
    assert pb.optr[4] - pb.optr[3] == 0
    L = 7
    rng = np.random.default_rng(0)
    u = rng.uniform(0.5, 2.0, 3 * L)
    u[L - 1] = 0.0                                    # A = 0 in the last lane: k2·A·B/A is NaN there
    f = rng.uniform(0.1, 3.0, 2 * L)
    h, p = np.array([1.7]), np.array([0.3])
    out = _run(pb, u, f, h, p, L).reshape(6, L)
    A, B, C = u.reshape(3, L)
    k1, k2 = f.reshape(2, L)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = [2 * k1 * A * B - k2 * (A - C), k2 * A * B / A, (A + B) ** 2 / 2, 0 * A,
                -1.7 * 0.3 * C / 3, k1 / A ** 2]
    for got, w in zip(out, want):
        np.testing.assert_allclose(got[:-1], w[:-1], rtol=1e-12)
    assert np.isnan(out[1, -1]) and np.isinf(out[5, -1]) and out[3, -1] == 0.0


@pytest.mark.parametrize("what", ["exp", "div_sum", "sqrt_pow", "time", "growth"])
def test_not_a_polynomial_gives_none(what):
    ins: list = []

    def add(op, *args):
        ins.append((op, tuple(args)))
        return len(ins) - 1

    A, B = add("lane", "u", 0), add("lane", "u", 1)
    if what == "exp":
        v = add("exp", A)
    elif what == "div_sum":
        v = add("/", B, add("+", A, B))
    elif what == "sqrt_pow":
        v = add("pow", A, add("const", 0.5))
    elif what == "time":
        v = add("*", A, add("time"))
    else:                           # (A + B + ... )^4: 5^4-ish terms from a few instructions
        s = A
        for i in range(2, 6):
            s = add("+", s, add("lane", "u", i))
        v = add("pow", s, add("const", 4.0))
    assert expand(ins, [(add("*", v, B), 0)]) is None
    if what == "growth":            # the same body under a larger budget expands
        assert expand(ins, [(add("*", v, B), 0)], n_instructions=10_000 // MAX_GROWTH) is not None


# -- tropo12 on the tape engine ----------------------------------------------

L = 13


@pytest.fixture(scope="module")
def leaf13():
    doc = lift(json.loads(TROPO12.read_text()), L)
    return rosenbrock(doc, rtol=1e-3, threads=1, per_cell=["T"], options=TAPE)


def _state(lf, L, seed):
    rng = np.random.default_rng(seed)
    n = lf.n_species
    base = lf.initial_state(lanes=L).reshape(n, L)
    u = np.ascontiguousarray((base * 10 ** rng.uniform(-1, 1, (n, L))).reshape(-1))
    rows = {"fj": np.where(np.arange(L) % 3 == 0, 0.0, rng.uniform(0.2, 1.0, L)),
            "T": rng.uniform(250.0, 310.0, L)}
    f = np.ascontiguousarray(np.concatenate([rows[k.split(".")[-1]] for k in lf.forcing_names]))
    return u, f


def _hoisted_inputs(lf, hz, u, f, L):
    rhs = lf.rhs_program
    nfu = len(rhs.forcing_names)
    fz = np.zeros((nfu + hz.rows) * L)
    fz[:nfu * L] = f
    b = BoundPrograms(lf, lf.p, 0.0, L, hoist=hz)
    cix = np.zeros(1, np.int64)
    b.lane_prologue(fz, cix, L)
    return fz, cix, b


def test_tropo12_bodies_against_the_tape_and_finite_differences(leaf13):
    lf = leaf13
    hz = lane_hoist(lf, lf.plan)
    rp, jp = hz.rhs.poly, hz.jac.poly
    assert rp is not None and jp is not None
    u, f = _state(lf, L, 1)
    fz, cix, b = _hoisted_inputs(lf, hz, u, f, L)
    rhs, jac = lf.rhs_program, lf.jac_program
    # right-hand side: the unsplit tape, to the stated rounding
    h = np.zeros(max(rhs.kernel.n_hoist, 1))
    ref = np.full(u.size, np.nan)
    run_tapes(RUN, rhs.kernel.tapes, u, f, lf.p, 0.0, h, cix, ref, L)
    got = np.full(u.size, np.nan)
    b.rhs(u, fz, cix, L, got)
    hr = np.zeros_like(h)
    pro = rhs.kernel.tapes[0]
    RUN(pro.code, pro.consts, ro(u), ro(fz), lf.p, 0.0, hr, cix, hr, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    scale = _run(_abs(rp), np.abs(u), np.abs(fz), np.abs(hr), np.abs(lf.p), L, size=u.size)
    assert np.all(np.isfinite(ref)) and np.all(np.abs(got - ref) <= ROUND * scale)
    assert not np.array_equal(got, ref)                 # expanded: other roundings somewhere
    # Jacobian (tile slots): the unsplit tape likewise, then central differences of the RHS
    plan = lf.plan
    ft = jac.direct_tape(plan)
    W, P, C = plan.tile_width(L), int(plan.info["slots_per_lane"]), plan.capacity(L)
    assert C > L                                        # 13 lanes in tiles of 16: padding lanes
    jref = np.full(P * C, np.nan)
    hj = np.zeros(max(jac.kernel.n_hoist, 1))
    run_tapes(RUN, (ft.prologue, ft.body), u, f, lf.p, 0.0, hj, cix, jref, L, W, P, C, ft.zero_slots)
    jgot = np.full(P * C, np.nan)
    b.jac(u, fz, cix, L, jgot)
    jscale = _run(_abs(jp), np.abs(u), np.abs(fz), np.abs(hj), np.abs(lf.p), L, W, P, C, ft.zero_slots,
                  size=P * C)
    jscale[np.isnan(jscale)] = 0.0                      # fill-in slots: stored 0 by both
    assert np.all(np.isfinite(jgot)) and np.all(np.abs(jgot - jref) <= ROUND * jscale)
    n = lf.n_species
    dense = np.zeros((L, n, n))
    order = lf.plan.info["ordering"]                   # slot q: LU position (i, j) of states order[i], order[j]
    for q, (i, j) in enumerate(lf.plan.info["lu_pattern"]):
        for lane in range(L):
            dense[lane, order[i], order[j]] = jgot[(lane // W * P + q) * W + lane % W]
    eps = 1e-6
    for j in range(n):
        up, dn = u.copy(), u.copy()
        d = eps * np.maximum(np.abs(u[j * L:(j + 1) * L]), 1e-3)
        up[j * L:(j + 1) * L] += d
        dn[j * L:(j + 1) * L] -= d
        fu, fd = np.empty_like(u), np.empty_like(u)
        b.rhs(up, fz, cix, L, fu)
        b.rhs(dn, fz, cix, L, fd)
        # J·d against the central difference (fu - fd)/2, per (lane, species):
        # truncation ~d², rounding ~eps·Σ|terms| of the RHS row
        obs = ((fu - fd) / 2).reshape(n, L).T
        pred = dense[:, :, j] * d[:, None]
        tol = 1e-5 * np.abs(obs) + 1e-12 * scale.reshape(n, L).T
        assert np.all(np.abs(pred - obs) <= tol), (j, np.max(np.abs(pred - obs) / tol))


def test_lanes_positions_and_tiles_give_the_same_bits(leaf13):
    lf = leaf13
    hz = lane_hoist(lf, lf.plan)
    jp = hz.jac.poly
    u, f = _state(lf, L, 2)
    fz, cix, b = _hoisted_inputs(lf, hz, u, f, L)
    jac = lf.jac_program
    hj = np.zeros(max(jac.kernel.n_hoist, 1))
    pro = jac.direct_tape(lf.plan).prologue
    RUN(pro.code, pro.consts, ro(u), ro(fz), lf.p, 0.0, hj, cix, hj, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    P = int(lf.plan.info["slots_per_lane"])
    zs = jac.direct_tape(lf.plan).zero_slots

    def dense(W, B, uu=u, ff=fz, LL=L):
        C = -(-LL // W) * W
        o = _run(jp, uu, ff, hj, lf.p, LL, W, P, C, zs, B, size=P * C)
        lanes = np.arange(C)
        v = o.reshape(C // W, P, W).transpose(1, 0, 2).reshape(P, C)
        assert np.array_equal(v[:, lanes >= LL], np.repeat(v[:, LL - 1:LL], C - LL, axis=1))   # padding
        assert np.all(v[zs] == 0.0)
        return v[:, :LL]

    ref = dense(16, 64)
    for W, B in ((16, 16), (4, 64), (5, 7), (13, 13), (1, 64)):
        assert np.array_equal(dense(W, B), ref), (W, B)
    # a lane alone, and the lanes in reverse order
    k = 6
    nu, nf = u.size // L, fz.size // L
    one = dense(16, 64, np.ascontiguousarray(u.reshape(nu, L)[:, k]), np.ascontiguousarray(fz.reshape(nf, L)[:, k]),
                1)
    assert np.array_equal(one[:, 0], ref[:, k])
    rev = dense(16, 64, np.ascontiguousarray(u.reshape(nu, L)[:, ::-1]).reshape(-1),
                np.ascontiguousarray(fz.reshape(nf, L)[:, ::-1]).reshape(-1))
    assert np.array_equal(rev[:, ::-1], ref)
    # the right-hand side's blocks
    rp = hz.rhs.poly
    hr = np.zeros(max(lf.rhs_program.kernel.n_hoist, 1))
    r64 = _run(rp, u, fz, hr, lf.p, L, B=64, size=u.size)
    assert np.array_equal(_run(rp, u, fz, hr, lf.p, L, B=3, size=u.size), r64)


def test_the_vector_groups_give_the_loops_bits(leaf13):
    """Pairs of whole 16-lane groups run as vector IR (_vrow, _vsum2), an odd
    group, other lanes and tile widths through the loops: 40 lanes (two
    tiles as a pair and a padded tile; the RHS a pair and 8 lanes) against
    tile width 5 and 3-lane blocks, which never form a group, 16-lane blocks
    (each tile alone: the loops), 32-lane tiles (a pair inside one tile) and
    each lane alone; on 56 lanes (the RHS: a pair, an odd group, 8 lanes; the
    Jacobian: a pair, an odd tile, a padded tile) and the Jacobian on 96
    lanes of 48-lane tiles (a pair across a tile's end, stored apart)
    against those lanes of the 40."""
    lf = leaf13
    hz = lane_hoist(lf, lf.plan)
    u13, f13 = _state(lf, L, 3)
    fz13, cix, _ = _hoisted_inputs(lf, hz, u13, f13, L)
    LL = 40
    cols = np.arange(LL) % L
    cols[L:2 * L] = np.arange(L)[::-1]                # not a plain repeat of the lanes
    nu, nf = u13.size // L, fz13.size // L
    u = np.ascontiguousarray(u13.reshape(nu, L)[:, cols]).reshape(-1)
    u[5 * LL + 17] = 0.0                               # a zero state inside a vector group
    fz = np.ascontiguousarray(fz13.reshape(nf, L)[:, cols]).reshape(-1)
    jac = lf.jac_program
    hj = np.zeros(max(jac.kernel.n_hoist, 1))
    pro = jac.direct_tape(lf.plan).prologue
    RUN(pro.code, pro.consts, ro(u), ro(fz), lf.p, 0.0, hj, cix, hj, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    P = int(lf.plan.info["slots_per_lane"])
    zs = jac.direct_tape(lf.plan).zero_slots
    jp, rp = hz.jac.poly, hz.rhs.poly

    def dense(W, B, n=LL, uu=u, ff=fz):
        C = -(-n // W) * W
        o = _run(jp, uu, ff, hj, lf.p, n, W, P, C, zs, B, size=P * C)
        return o.reshape(C // W, P, W).transpose(1, 0, 2).reshape(P, C)[:, :n]

    def lanes(c):
        return (np.ascontiguousarray(u.reshape(nu, LL)[:, c]).reshape(-1),
                np.ascontiguousarray(fz.reshape(nf, LL)[:, c]).reshape(-1))

    vec = dense(16, 32)
    for W, B in ((5, 15), (16, 16), (16, 64), (32, 32)):
        assert np.array_equal(dense(W, B), vec), (W, B)
    hr = np.zeros(max(lf.rhs_program.kernel.n_hoist, 1))
    r = _run(rp, u, fz, hr, lf.p, LL, B=64, size=u.size).reshape(nu, LL)
    assert np.array_equal(_run(rp, u, fz, hr, lf.p, LL, B=3, size=u.size).reshape(nu, LL), r, equal_nan=True)
    c56 = (np.arange(56) * 7) % LL                     # every lane of the 40, in another order
    u56, f56 = lanes(c56)
    assert np.array_equal(dense(16, 64, 56, u56, f56), vec[:, c56])
    c96 = (np.arange(96) * 11) % LL
    assert np.array_equal(dense(48, 96, 96, *lanes(c96)), vec[:, c96])
    r56 = _run(rp, u56, f56, hr, lf.p, 56, B=64, size=nu * 56).reshape(nu, 56)
    assert np.array_equal(r56, r[:, c56], equal_nan=True)
    for k in (0, 17, 31, 39):                         # each lane alone: one lane, the loops
        uk = np.ascontiguousarray(u.reshape(nu, LL)[:, k])
        fk = np.ascontiguousarray(fz.reshape(nf, LL)[:, k])
        assert np.array_equal(_run(rp, uk, fk, hr, lf.p, 1, size=nu), r[:, k], equal_nan=True)
        one = _run(jp, uk, fk, hj, lf.p, 1, 16, P, 16, zs, 16, size=P * 16).reshape(P, 16)[:, 0]
        assert np.array_equal(one, vec[:, k], equal_nan=True)


def test_the_leaf_on_the_kernel_is_bitwise_the_same_for_any_thread_count():
    # 40 lanes: two threads split them into blocks of 32 and 8 (a partial tile)
    Lt = 40
    doc = lift(json.loads(TROPO12.read_text()), Lt)
    one = rosenbrock(doc, rtol=1e-3, threads=1, per_cell=["T"], options=TAPE)
    two = rosenbrock(doc, rtol=1e-3, threads=2, per_cell=["T"], options=TAPE)
    hz = lane_hoist(one, one.plan)
    assert hz is not None and hz.rhs.poly is not None and hz.jac.poly is not None
    u, f = _state(one, Lt, 9)
    v1, v2 = u.copy(), u.copy()
    s1 = one.advance(v1, 0.0, 1200.0, forcing=f)
    s2 = two.advance(v2, 0.0, 1200.0, forcing=f)
    assert s1.success and s2.success and np.array_equal(v1, v2) and s1.totals() == s2.totals()


# -- a body that is not polynomial: the tape, same bits as before ---------------

def _nonpoly_doc(L, poly: bool = False):
    """A SuperFast-like box (T-dependent rate, a photolysis field, a
    stoichiometric 2 and 0.5, a self-reaction) plus one rate that depends on
    a state through exp: not a polynomial (``poly``: without that rate)."""
    k = {"op": "*", "args": [2.5e-3, {"op": "exp", "args": [{"op": "/", "args": [300.0, "T"]}]}]}
    self_ = {"op": "*", "args": [1e-3, "B", "B"]}
    nonpoly = ({"op": "*", "args": [1e-4, "C", "A"]} if poly else
               {"op": "*", "args": [1e-4, "C", {"op": "exp", "args": [{"op": "neg", "args": ["A"]}]}]})
    eqs = [("A", {"op": "+", "args": [{"op": "neg", "args": [{"op": "*", "args": [k, "A", "B"]}]},
                                      {"op": "*", "args": ["j", "C"]}]}),
           ("B", {"op": "-", "args": [{"op": "*", "args": [0.5, "j", "C"]},
                                      {"op": "+", "args": [{"op": "*", "args": [k, "A", "B"]},
                                                           {"op": "*", "args": [2.0, self_]}]}]}),
           ("C", {"op": "-", "args": [{"op": "*", "args": [k, "A", "B"]},
                                      {"op": "+", "args": [{"op": "*", "args": ["j", "C"]}, nonpoly]}]})]
    var = {s: {"type": "unknown", "default": 1.0} for s in ("A", "B", "C")}
    var["T"] = {"type": "parameter", "default": 280.0}
    var["j"] = {"type": "parameter", "default": 1e-3}
    doc = {"esm": "1.1.0", "metadata": {"name": "NonPoly", "authors": ["esmjac"]},
           "models": {"NonPoly": {"variables": var, "equations": [
               {"lhs": {"op": "D", "args": [s], "wrt": "t"}, "rhs": e} for s, e in eqs]}}}
    return lift(doc, L, cell_parameters=["T", "j"])


def test_a_body_that_is_not_polynomial_falls_back_to_the_tape(monkeypatch):
    Ln = 6
    doc = _nonpoly_doc(Ln)
    lf = rosenbrock(doc, rtol=1e-4, threads=1, options=TAPE)
    hz = lane_hoist(lf, lf.plan)
    assert hz is not None and hz.rhs.poly is None and hz.jac.poly is None
    rng = np.random.default_rng(3)
    u = rng.uniform(0.5, 2.0, 3 * Ln)
    f = np.ascontiguousarray(np.concatenate([rng.uniform(260, 300, Ln) if n.endswith("T")
                                             else rng.uniform(0, 1e-3, Ln) for n in lf.forcing_names]))
    v1 = u.copy()
    s1 = lf.advance(v1, 0.0, 600.0, forcing=f)
    monkeypatch.setattr(bound, "POLY", False)
    tape = rosenbrock(doc, rtol=1e-4, threads=1, options=TAPE)
    v2 = u.copy()
    s2 = tape.advance(v2, 0.0, 600.0, forcing=f)
    assert s1.success and s2.success and np.array_equal(v1, v2) and s1.totals() == s2.totals()


def test_superfast_like_box_against_hand_formulas():
    # the same box with the state-dependent exp replaced by 1e-4·C·A: polynomial.
    # Oracle: NumPy evaluation of the written rate laws and their derivatives.
    Ln = 5
    lf = rosenbrock(_nonpoly_doc(Ln, poly=True), rtol=1e-4, threads=1, options=TAPE)
    hz = lane_hoist(lf, lf.plan)
    assert hz is not None and hz.rhs.poly is not None and hz.jac.poly is not None
    rng = np.random.default_rng(8)
    u = np.ascontiguousarray(rng.uniform(0.5, 2.0, 3 * Ln))
    rows = {"T": rng.uniform(260, 300, Ln), "j": rng.uniform(0, 1e-3, Ln)}
    f = np.ascontiguousarray(np.concatenate([rows[n.split(".")[-1]] for n in lf.forcing_names]))
    fz, cix, b = _hoisted_inputs(lf, hz, u, f, Ln)
    got = np.full(u.size, np.nan)
    b.rhs(u, fz, cix, Ln, got)
    A, B, C = u.reshape(3, Ln)
    T, j = rows["T"], rows["j"]
    k = 2.5e-3 * np.exp(300.0 / T)
    want = [-k * A * B + j * C, 0.5 * j * C - (k * A * B + 2e-3 * B * B), k * A * B - (j * C + 1e-4 * C * A)]
    np.testing.assert_allclose(got.reshape(3, Ln), want, rtol=1e-13)
    # Jacobian, dense per lane from the tile slots
    P, W, Cp = int(lf.plan.info["slots_per_lane"]), lf.plan.tile_width(Ln), lf.plan.capacity(Ln)
    jg = np.full(P * Cp, np.nan)
    b.jac(u, fz, cix, Ln, jg)
    order = lf.plan.info["ordering"]
    J = np.zeros((Ln, 3, 3))
    for q, (r, c) in enumerate(lf.plan.info["lu_pattern"]):
        for lane in range(Ln):
            J[lane, order[r], order[c]] = jg[(lane // W * P + q) * W + lane % W]
    z = np.zeros(Ln)
    Jw = np.array([[-k * B, -k * A, j],
                   [-k * B, -k * A - 4e-3 * B, 0.5 * j],
                   [k * B - 1e-4 * C, k * A, -j - 1e-4 * A + z]]).transpose(2, 0, 1)
    np.testing.assert_allclose(J, Jw, rtol=1e-13, atol=1e-300)


# -- GEOS-Chem fullchem, when its converted document is given --------------------

@pytest.mark.slow
def test_geoschem_bodies_expand_and_match_the_tape():
    """$ESMJAC_GC_MECH: the converted GEOS-Chem fullchem box document
    (benchmarks/gcmech.py; never vendored). Both bodies expand (its uptake
    rates divide by a state: kept as divisors) and match the unsplit tapes
    to the stated rounding on plausible states."""
    path = os.environ.get("ESMJAC_GC_MECH")
    if not path or not os.path.exists(path):
        pytest.skip("ESMJAC_GC_MECH (GEOS-Chem fullchem box document) not given")
    doc = json.loads(open(path).read())
    if "reaction_systems" in doc:
        pytest.skip("ESMJAC_GC_MECH is the published file; give its conversion (benchmarks/gcmech.py)")
    (m,) = doc["models"].values()
    cellp = [n for n, v in m["variables"].items() if v["type"] == "parameter"
             and (n in ("T", "num_density") or n.startswith(("j_", "k_mt", "k_cld")))]
    Lg = 8
    lf = rosenbrock(lift(doc, 1, cell_parameters=cellp), rtol=1e-3, threads=1, options={"progress": False})
    hz = lane_hoist(lf, lf.plan)
    assert hz is not None and hz.rhs.poly is not None and hz.jac.poly is not None
    rng = np.random.default_rng(4)
    n = lf.n_species
    u = np.ascontiguousarray((lf.initial_state(lanes=Lg).reshape(n, Lg) + 1e-2)
                             * 10 ** rng.uniform(-0.5, 0.5, (n, Lg))).reshape(-1)
    f = np.ascontiguousarray(np.concatenate([rng.uniform(260, 300, Lg) if k == "T" else
                                             rng.uniform(20, 40, Lg) if k == "num_density" else
                                             10 ** rng.uniform(-7, -4, Lg)
                                             for k in (x.split(".")[-1] for x in lf.forcing_names)]))
    fz, cix, b = _hoisted_inputs(lf, hz, u, f, Lg)
    rhs = lf.rhs_program
    h = np.zeros(max(rhs.kernel.n_hoist, 1))
    ref = np.full(u.size, np.nan)
    run_tapes(RUN, rhs.kernel.tapes, u, f, lf.p, 0.0, h, cix, ref, Lg)
    got = np.full(u.size, np.nan)
    b.rhs(u, fz, cix, Lg, got)
    pro = rhs.kernel.tapes[0]
    RUN(pro.code, pro.consts, ro(u), ro(fz), lf.p, 0.0, h, cix, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    scale = _run(_abs(hz.rhs.poly), np.abs(u), np.abs(fz), np.abs(h), np.abs(lf.p), Lg, size=u.size)
    assert np.all(np.isfinite(ref)) and np.all(np.abs(got - ref) <= ROUND * scale)


_FIRST_CALLS = r"""
import numpy as np
from esmjac.adapters.native import rosenbrock
from esmjac.integrators.bound import lane_hoist
from esmjac.models.mechanism import lift
from tests.support.programs import TROPO12
doc = lift(json.loads(TROPO12.read_text()), 8)
lf = rosenbrock(doc, rtol=1e-4, threads=1, per_cell=["T"], options={"engine": "tape", "progress": False})
hz = lane_hoist(lf, lf.plan)
out = {"poly": hz.rhs.poly is not None and hz.jac.poly is not None}
compiled()                                           # the build's own compiles
u = lf.initial_state()
ok = bool(lf.advance(u, 0.0, 600.0).success)
ro = u.copy()
ro.setflags(write=False)
ok = ok and bool(lf.advance(ro, 600.0, 600.0, out=np.empty_like(u)).success)
big = np.repeat(u.reshape(15, -1), 40, axis=1).reshape(-1)
ok = ok and bool(lf.advance(big, 0.0, 600.0, forcing={"fj": 0.5, "T": 290.0}, h0=10.0).success)
out["new"] = compiled()
out["ok"] = ok
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_no_compile_after_the_build_on_the_mass_action_kernel(tmp_path):
    """In a fresh process the leaf's build compiles (or loads) run_poly; its
    advances (in place, into out= from a read-only state, 320 lanes with
    other forcing) specialize nothing new."""
    from tests.support.child import run_child
    from tests.support.compiles import SPY
    res = run_child(SPY + _FIRST_CALLS, os.environ.get("ESMJAC_CACHE_DIR", tmp_path), timeout=900)
    assert res["poly"] and res["ok"] and res["new"] == [], res
