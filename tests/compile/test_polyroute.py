"""A taped body on the mass-action kernel (esmjac.compile.polyroute): the cut
at the state, the rate rows, chunked evaluation into a tiled plan's slots.

Oracles: the tape interpreter on the same body (run_tape's serial twin, the
interpreter the engine and the route run on one thread: a separate kernel
whose values tests/runtime checks against the reference assembly) to a
stated rounding — 1e-13 of the sum of the terms' magnitudes, computed by
the route itself with |coefficients| on |inputs| — with the NaN/inf pattern
equal; the route on other chunkings, lane counts and lane orders (bitwise:
every lane gets the same operations); and, through ``eval_into`` on a
tape-engine program, the band slab route (keep_slab) and central finite
differences of the right-hand side.
"""
from __future__ import annotations

import numpy as np
import pytest

from esmjac._frozen import ro
from esmjac.compile.engine import NO_SLOTS
from esmjac.compile.massaction import PolyBody
from esmjac.compile.polyroute import PolyRoute, cut
from esmjac.compile.ssa import Block
from esmjac.compile.tape import encode, run_tape
from esmjac.compile.twins import serial_twin
from esmjac.errors import JacError
from esmjac.layouts.types import LaneSparseBlocks, untile

ROUND = 1e-13          # |route - tape| <= ROUND * sum |terms|
W, NS, NF = 4, 3, 3    # tile width, state rows, field rows


def _tape(kind: str = "mass"):
    """A body: u0..u2 states (A, B, C), f0..f2 fields, h0, p0, the time; stores
    0..7 into slots 1..8 of 10 (slots 0 and 9 are fill-in, zeroed)."""
    blk = Block()

    def add(op, *args):
        blk.ins.append((op, tuple(args)))
        return len(blk.ins) - 1

    A, B, C = (add("lane", "u", i) for i in range(NS))
    k1, T, M = (add("lane", "f", i) for i in range(NF))
    h0, p0, t = add("hoist", 0), add("param", 0), add("time")
    two = add("const", 2.0)
    arr = add("*", h0, add("exp", add("/", add("const", -300.0), T)))     # a rate row: h0·exp(-300/T)
    ksum = add("+", k1, add("*", p0, M))                                  # a rate row: k1 + p0·M
    kt = add("*", add("const", 1e-3), add("+", t, T))                     # a rate row: 1e-3·(t + T)
    s = [add("neg", add("*", add("*", arr, A), B)),                       # -arr·A·B
         add("*", two, add("*", add("*", k1, M), C)),                     # 2·k1·M·C (a kept monomial)
         add("-", add("*", ksum, A), add("*", kt, B)),                    # ksum·A - kt·B
         add("/", add("*", add("*", k1, A), B), A),                      # k1·A·B/A (not cancelled)
         add("*", add("pow", add("+", A, B), two), p0),                  # (A + B)²·p0
         add("-", add("*", arr, A), add("*", A, arr)),                   # 0: cancels
         arr,                                                            # a state-free store
         add("/", k1, M)]                                                # a state-free monomial
    if kind == "div_sum":
        s[2] = add("/", A, add("+", A, B))
    elif kind == "exp_state":
        s[2] = add("exp", A)
    elif kind == "idx":
        s[2] = add("*", A, add("idx", 0))
    return encode(blk, [(v, 1 + i) for i, v in enumerate(s)])


P = 10
ZS = np.array([0, 9], np.int64)
ZS.setflags(write=False)          # read-only, as a plan's zero slots: the kernels' usual specialisation


def _point(L, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.5, 2.0, NS * L)
    f = np.concatenate([rng.uniform(0.1, 3.0, L), rng.uniform(250.0, 300.0, L), rng.uniform(0.5, 1.5, L)])
    return u, f, np.array([0.7]), np.array([1.3])


def _cap(L):
    return -(-L // W) * W


def _tape_out(tape, u, f, p, h, L, t=5.0):
    out = np.full(P * _cap(L), np.nan)
    run = serial_twin(run_tape)
    # read-only inputs, as the route passes them: the interpreter's one flavour
    run(tape.code, tape.consts, ro(u), ro(f), ro(p), t, h, np.zeros(1, np.int64), out, L, tape.nreg, W, P, _cap(L), ZS)
    return out


def _route_out(rt, u, f, p, h, L, t=5.0, chunk=256):
    out = np.full(P * _cap(L), np.nan)
    bad = rt.run(u, f, p, t, h, np.zeros(1, np.int64), out, L, W, P, _cap(L), ZS, lanes_per_chunk=chunk)
    return out, bad


def _scale(rt, u, f, p, h, L, t=5.0):
    """Σ|terms| per slot: the route's monomials with |coefficients| on
    |inputs| and its own rate rows (also |.|)."""
    R = np.zeros(max(rt.rows, 1) * L)
    run = serial_twin(run_tape)
    run(rt.rates.code, rt.rates.consts, ro(u), ro(f), ro(p), t, h, np.zeros(1, np.int64), R, L, rt.rates.nreg, 0, 0, L,
        NO_SLOTS)
    fz = np.concatenate([f[:rt.n_forcing * L], R[:rt.rows * L]])
    b = rt.body
    a = np.abs(b.ocoef)
    a.setflags(write=False)
    ab = PolyRoute(None, rt.n_forcing + rt.rows, 0, PolyBody(b.fptr, b.fkind, b.fidx, b.optr, b.omono, a, b.targets),
                   rt.src, rt.n_states)
    return _route_out(ab, np.abs(u), np.abs(fz), np.abs(p), np.abs(h), L, t)[0]


def test_one_flavour_whatever_the_caller_passes():
    """Numba compiles a kernel once per writability of each argument (and
    every jitted function it calls again): the route passes its inputs
    read-only whatever the caller holds, so writable and read-only calls
    share _drive, run_poly and the interpreter. Oracles: the dispatchers'
    signatures (none added by the second flavour; in this process, every
    signature's input arrays read-only: a call site passing another flavour
    fails here) and the bits (equal for both flavours)."""
    from esmjac.compile import polyroute
    from esmjac.compile.massaction import run_poly
    rt = cut(_tape())
    L = 5
    u, f, h, p = _point(L)
    ref, _ = _route_out(rt, u, f, p, h, L)
    kernels = {polyroute._drive: (7, 8, 9, 10, 13, 19),           # u f R src p zslots
               run_poly: (0, 1, 2, 3, 4, 5, 6, 10, 16),           # the body's arrays, p, zslots
               serial_twin(run_tape): (0, 1, 2, 3, 4, 14)}        # code consts u f p zslots
    n = [len(k.signatures) for k in kernels]
    got, _ = _route_out(rt, ro(u), ro(f), ro(p), h, L)
    assert np.array_equal(got.view(np.uint64), ref.view(np.uint64))
    assert [len(k.signatures) for k in kernels] == n
    for k, inputs in kernels.items():
        for sig in k.signatures:
            assert all(not sig[i].mutable for i in inputs), (k, sig)


def test_the_cut_keeps_monomials_and_hoists_the_rest():
    rt = cut(_tape())
    assert rt is not None
    # three rate rows: the Arrhenius value, the sum, the time-dependent one;
    # 2·k1·M and k1/M stay monomials of the field rows
    assert rt.rows == 3 and rt.rates is not None and rt.n_forcing == NF and rt.n_states == NS
    assert sorted(rt.src.tolist()) == rt.src.tolist() and set(rt.src.tolist()) >= {0, 2}
    for a in (rt.src, *rt.body.arrays()):
        assert not a.flags.writeable


@pytest.mark.parametrize("kind", ["div_sum", "exp_state", "idx"])
def test_not_a_polynomial_keeps_the_tape(kind):
    assert cut(_tape(kind)) is None


@pytest.mark.parametrize("L", [1, 3, 4, 13])
def test_values_against_the_tape(L):
    tape, rt = _tape(), cut(_tape())
    u, f, h, p = _point(L)
    want = _tape_out(tape, u, f, p, h, L)
    got, bad = _route_out(rt, u, f, p, h, L)
    sc = _scale(rt, u, f, p, h, L)
    assert bad == 0 and np.isfinite(got).all()
    assert np.all(np.abs(got - want) <= ROUND * sc)
    V = untile(got, P, _cap(L), W)
    assert np.all(V[[0, 9]] == 0.0) and np.all(V[6] == 0.0)             # fill-in zeroed; the cancelling slot
    assert all(np.array_equal(V[:, k], V[:, L - 1]) for k in range(L, _cap(L)))   # padding: lane L-1


def test_the_bits_do_not_depend_on_chunks_lanes_or_order():
    rt = cut(_tape())
    L = 29
    u, f, h, p = _point(L, 3)
    ref, _ = _route_out(rt, u, f, p, h, L, chunk=4)
    for chunk in (8, 12, 64, 256):
        assert np.array_equal(_route_out(rt, u, f, p, h, L, chunk=chunk)[0], ref)
    V = untile(ref, P, _cap(L), W)
    perm = np.random.default_rng(1).permutation(L)
    up = u.reshape(NS, L)[:, perm].ravel()
    fp = f.reshape(NF, L)[:, perm].ravel()
    Vp = untile(_route_out(rt, up, fp, p, h, L, chunk=8)[0], P, _cap(L), W)
    assert np.array_equal(Vp[:, :L], V[:, perm])
    for lane in (0, 17, L - 1):                                           # a lane alone
        one = untile(_route_out(rt, u.reshape(NS, L)[:, lane].copy(), f.reshape(NF, L)[:, lane].copy(), p, h, 1)[0],
                     P, W, W)
        assert np.array_equal(one[:, 0], V[:, lane])


def test_non_finite_values_are_reported_and_match_the_tape():
    tape, rt = _tape(), cut(_tape())
    L = 9
    u, f, h, p = _point(L)
    u[4] = 0.0                          # A = 0 in lane 4: k1·A·B/A is NaN there
    want = _tape_out(tape, u, f, p, h, L)
    got, bad = _route_out(rt, u, f, p, h, L, chunk=4)
    assert bad != 0
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))


def test_the_bits_do_not_depend_on_threads(monkeypatch):
    """Runs of chunks on Python threads (PolyRoute.bind's parts): the same
    bits and the same non-finite count as one run, for any split and
    thread count; every chunk run exactly once."""
    import numba

    from esmjac.compile import polyroute
    rt = cut(_tape())
    L = 61
    u, f, h, p = _point(L, 5)
    u[30] = 0.0                         # A = 0 in lane 30 (a middle chunk): NaN there
    ref, bad1 = _route_out(rt, u, f, p, h, L, chunk=8)
    assert bad1 == 1
    monkeypatch.setattr(polyroute, "LANES_PER_PART", 1)
    drive, runs = polyroute._drive, []

    def spy(*a):
        runs.append(a[-2:])
        return drive(*a)
    monkeypatch.setattr(polyroute, "_drive", spy)
    nc = -(-L // 8)
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS), numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(threads)
            for parts in (2, 3, 8, 50, None):
                runs.clear()
                out = np.full(P * _cap(L), np.nan)
                bad = rt.run(u, f, p, 5.0, h, np.zeros(1, np.int64), out, L, W, P, _cap(L), ZS, lanes_per_chunk=8,
                             parts=parts)
                assert np.array_equal(out.view(np.uint64), ref.view(np.uint64)) and bad == bad1
                want = min(threads, nc, numba.config.NUMBA_NUM_THREADS if parts is None else parts)
                assert len(runs) == want
                assert sorted(c for r in runs for c in range(*r)) == list(range(nc))
    finally:
        numba.set_num_threads(before)


def test_the_copy_stores_the_bits_and_finds_non_finite_values():
    """polyroute._copy_check (non-temporal stores on whole 64-byte lines,
    ordinary ones at either end): the destination holds the source's bits
    (signed zeros, subnormals, NaN payloads) for every alignment and length,
    nothing outside it is written, and an inf or NaN anywhere is reported."""
    import numba

    from esmjac.compile.polyroute import _copy_check, _sfence

    @numba.njit
    def copy(dst, d0, src, n):
        bad = _copy_check(dst, d0, src, n)
        _sfence()
        return bad

    rng = np.random.default_rng(7)
    src = rng.standard_normal(200) * 10.0 ** rng.integers(-300, 300, 200)
    src[[3, 50, 77]] = [-0.0, 5e-324, -2.2e-310]
    for d0 in range(9):
        for n in (0, 1, 5, 8, 9, 16, 23, 64, 131):
            dst = np.full(160, 7.0)
            where = (d0, n, dst.ctypes.data % 64)
            assert copy(dst, d0, src, n) == 0, where
            assert np.array_equal(dst[d0:d0 + n].view(np.uint64), src[:n].view(np.uint64)), where
            assert np.all(dst[:d0] == 7.0) and np.all(dst[d0 + n:] == 7.0), where
    nan = np.array([0x7FF8_0000_0000_0123], np.uint64).view(np.float64)[0]     # a NaN with a payload
    for bad in (np.inf, -np.inf, nan):
        for at in (0, 6, 7, 8, 40, 129, 130):
            s = src.copy()
            s[at] = bad
            for d0 in (0, 3):
                dst = np.zeros(160)
                where = (bad, at, d0, dst.ctypes.data % 64)
                assert copy(dst, d0, s, 131) == 1, where
                assert np.array_equal(dst[d0:d0 + 131].view(np.uint64), s[:131].view(np.uint64)), where
        s = src.copy()
        s[129] = bad                    # past the copied values: not reported
        assert copy(np.zeros(160), 0, s, 129) == 0


# -- through eval_into on a tape-engine program -----------------------------------

@pytest.fixture(scope="module")
def tropo_tape():
    from esmjac.runtime.programs import JacobianProgram, RhsProgram
    from tests.support.programs import TROPO12
    opts = {"engine": "tape", "progress": False}
    return RhsProgram.build(TROPO12, options=opts), JacobianProgram.build(TROPO12, options=opts)


def _lanes(r, L, seed):
    u0, p0, f0 = r.defaults(L)
    rng = np.random.default_rng(seed)
    return u0 * rng.uniform(0.5, 1.5, u0.size), p0, f0


def test_eval_into_takes_the_route_and_agrees_with_the_slab(tropo_tape):
    r, j = tropo_tape
    plan = j.plan(LaneSparseBlocks(), source=r)
    assert j.direct_tape(plan).route() is not None
    L = 37
    u, p, f = _lanes(r, L, 2)
    got = np.full(plan.out_size(L), np.nan)
    j.eval_into(plan, u, p, 0.0, f, got, j.new_workspace(L))
    ref = np.full_like(got, np.nan)
    j.eval_into(plan, u, p, 0.0, f, ref, j.new_workspace(L, keep_slab=True))      # the tape's band slab
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())
    # the bound call stores the bits of the unbound one, also at other lanes
    run = j.bind(plan, j.new_workspace(L))
    b = np.full_like(got, np.nan)
    run(u, p, 0.0, f, b)
    assert np.array_equal(b, got)
    P = int(plan.info["slots_per_lane"])
    V = untile(got, P, plan.capacity(L), plan.tile_width(L))
    for lanes in (1, 5):
        ns = len(r.layout.states)
        us = np.ascontiguousarray(u.reshape(ns, L)[:, :lanes].ravel())
        fs = None if f is None else np.ascontiguousarray(f.reshape(-1, L)[:, :lanes].ravel())
        o = np.full(plan.out_size(lanes), np.nan)
        j.bind(plan, j.new_workspace(lanes))(us, p, 0.0, fs, o)
        assert np.array_equal(untile(o, P, plan.capacity(lanes), plan.tile_width(lanes))[:, :lanes], V[:, :lanes])
    # apply reads the tape's band slab of the same point, whichever route stored the tiles
    v = np.random.default_rng(3).uniform(-1, 1, j.col_size(L))
    ys = []
    for keep in (False, True):
        ws = j.new_workspace(L, keep_slab=keep)
        j.eval_into(plan, u, p, 0.0, f, np.zeros_like(got), ws)
        ys.append(j.apply(plan, ws, v, np.zeros(u.size)))
    assert np.array_equal(ys[0], ys[1]) and np.isfinite(ys[0]).all()


def test_eval_into_against_finite_differences(tropo_tape):
    r, j = tropo_tape
    plan = j.plan(LaneSparseBlocks(), source=r)
    L = 6
    u, p, f = _lanes(r, L, 5)
    out = np.zeros(plan.out_size(L))
    j.eval_into(plan, u, p, 0.0, f, out, j.new_workspace(L))
    P = int(plan.info["slots_per_lane"])
    V = untile(out, P, plan.capacity(L), plan.tile_width(L))
    order = plan.info.get("ordering", list(range(j.n_species)))
    keys = [tuple(x) for x in plan.info["lu_pattern"]]
    ns = j.n_species
    for c in range(ns):
        d = 1e-3 * np.maximum(np.abs(u[c * L:(c + 1) * L]), 1e-3)   # mass action: central differences exact but rounding
        e = np.zeros_like(u)
        e[c * L:(c + 1) * L] = d
        hi, lo = np.empty_like(u), np.empty_like(u)
        r.eval_into(u + e, p, 0.0, f, hi, r.new_buffers(L))
        r.eval_into(u - e, p, 0.0, f, lo, r.new_buffers(L))
        col = ((hi - lo).reshape(ns, L) / (2 * d))                        # d f_a / d u_c, per lane
        for q, (a, b) in enumerate(keys):
            if order[b] == c:
                np.testing.assert_allclose(V[q, :L], col[order[a]], rtol=1e-5,
                                           atol=1e-6 * np.abs(col).max() + 1e-300)


def test_a_non_finite_jacobian_is_refused(tropo_tape):
    r, j = tropo_tape
    plan = j.plan(LaneSparseBlocks(), source=r)
    L = 5
    u, p, f = _lanes(r, L, 1)
    u.reshape(-1, L)[:, 2] = 1e300      # finite, but the products overflow
    p = np.full_like(p, 1e300)
    out = np.zeros(plan.out_size(L))
    with pytest.raises(JacError) as e:
        j.eval_into(plan, u, p, 0.0, f, out, j.new_workspace(L))
    assert e.value.code == "evaluation_error"
