"""Lane hoisting in the leaf (``hoist_rates``, esmjac.integrators.lanehoist): the
state-independent values of the taped right-hand side and Jacobian (rate
coefficients of each lane's own temperature) computed once per advance.

Oracles: the unsplit tapes (the programs as built, run by the same
interpreter: the split must reproduce their bits), the leaf with
``hoist_rates=False`` (bitwise, every lane and counter, when the cut bodies
run on the lane tape; within 1e-9 of the tolerance and the same counters
when they run on the mass-action kernel, esmjac.compile.massaction, whose
sums are expanded: its own tests are tests/integrators/test_lanepoly.py),
SciPy's Radau at rtol 1e-10 on the program's right-hand side (an
independent integrator).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from esmjac.adapters.native import rosenbrock
from esmjac.compile.engine import run_tapes
from esmjac.integrators.lanehoist import split
from esmjac.compile.engine import NO_SLOTS
from esmjac.compile.ssa import Block
from esmjac.compile.polyroute import tape_ssa as _ssa
from esmjac.integrators.lanetape import FUSED_BASE, encode_fused, run_fused
from esmjac.compile.tape import OPS, run_tape
from esmjac.compile.twins import serial_twin
from esmjac.errors import JacError
from esmjac.integrators import bound
from esmjac.integrators.bound import BoundPrograms, lane_hoist
from esmjac.models.mechanism import lift
from tests.support.leafgrid import DT, NS, lane_blocks
from tests.support.leafgrid import heterogeneous_grid as _grid
from tests.support.programs import TROPO12

#: The oracle interpreter: run_tape's serial twin, the one the engine's one-thread calls
#: compile (the package's parallel run_tape would be a dispatcher of its own).
RUN = serial_twin(run_tape)

RTOL = 1e-3
L = 8
TAPE = {"engine": "tape", "progress": False}


@pytest.fixture(scope="module")
def doc8():
    return lift(json.loads(TROPO12.read_text()), L)


def _leaf(doc, **kw):
    return rosenbrock(doc, rtol=RTOL, threads=1, per_cell=["T"], options=TAPE, **kw)


@pytest.fixture(scope="module")
def leaves(doc8):
    return _leaf(doc8), _leaf(doc8, hoist_rates=False)


@pytest.fixture
def tape_kernel(monkeypatch):
    """The cut bodies on the lane tape, not the mass-action kernel (the
    bitwise checks of the split)."""
    monkeypatch.setattr(bound, "POLY", False)


def _same_or_close(v1, s1, v2, s2, leaf, poly: bool, frac: float = 1e-9):
    """Bitwise on the tape; on the mass-action kernel the same counters and
    every value within ``frac`` of the tolerance (atol + rtol·|v|)."""
    if not poly:
        return np.array_equal(v1, v2) and s1.totals() == s2.totals()
    tol = np.repeat(leaf.atol, v1.size // leaf.n_species) + RTOL * np.abs(v2)
    return s1.totals() == s2.totals() and float(np.max(np.abs(v1 - v2) / tol)) <= frac


def _forcing(lf, fj, seed=0):
    """(fj, T) per lane in the leaf's field order: temperatures 250–310 K."""
    T = np.random.default_rng(seed).uniform(250.0, 310.0, fj.size)
    rows = {"fj": fj, "T": T}
    return np.ascontiguousarray(np.concatenate([rows[k.split(".")[-1]] for k in lf.forcing_names]))


def test_the_split_tapes_compute_the_unsplit_bits(leaves):
    on, _ = leaves
    hz = lane_hoist(on, on.plan)
    assert hz is not None and hz.rhs.rows > 0 and hz.jac.rows > 0
    rhs = on.rhs_program
    pro, body = rhs.kernel.tapes
    # the exponentials of temperature left the body: only the prologue has them
    exp = OPS.index("exp")
    assert np.any(body.code[:, 0] == exp) and not np.any(hz.rhs.body.code[:, 0] == exp)
    assert np.any(hz.rhs.prologue.code[:, 0] == exp)
    u, fj = _grid(on, L, 1)
    nfu = len(rhs.forcing_names)
    f = _forcing(on, fj, 1)
    cix = np.zeros(1, np.int64)
    h = np.zeros(max(rhs.kernel.n_hoist, 1))
    ref = np.full(u.size, np.nan)
    run_tapes(RUN, (pro, body), u, f, on.p, 0.0, h, cix, ref, L)
    fz = np.zeros((nfu + hz.rhs.rows) * L)
    fz[:nfu * L] = f
    run_tapes(RUN, (pro, hz.rhs.prologue), fz, fz, on.p, 0.0, h, cix, fz, L)
    out = np.full(u.size, np.nan)
    run_tapes(RUN, (pro, hz.rhs.body), u, fz, on.p, 0.0, h, cix, out, L)
    assert np.all(np.isfinite(ref)) and np.array_equal(out, ref)


@pytest.mark.parametrize("lanes", [13, 16])
def test_scheduled_and_fused_tapes_compute_the_plain_bits(leaves, lanes, tape_kernel):
    # the leaf runs the cut bodies re-scheduled on integrators.lanetape's
    # interpreter; oracle: the programs' own unsplit tapes, right-hand side (lanes-fastest)
    # and Jacobian (tile slots, zeroed fill-in, padding lanes past the last
    # real one: 13 lanes fill 16), on fresh states and fields
    on, _ = leaves
    hz = lane_hoist(on, on.plan)
    # the leaf runs the cut bodies re-scheduled for few registers (the same
    # instructions in another topological order)
    for cut in (hz.rhs, hz.jac):
        assert cut.scheduled.code.shape == cut.body.code.shape and cut.scheduled.nreg <= cut.body.nreg
    rhs, jac = on.rhs_program, on.jac_program
    doc = lift(json.loads(TROPO12.read_text()), lanes)
    lf = _leaf(doc)
    u, fj = _grid(lf, lanes, 7)
    nfu = len(rhs.forcing_names)
    f = _forcing(lf, fj, 7)
    cix = np.zeros(1, np.int64)
    fz = np.zeros((nfu + hz.rows) * lanes)
    fz[:nfu * lanes] = f
    b = BoundPrograms(on, on.p, 0.0, lanes, hoist=hz)
    b.lane_prologue(fz, cix, lanes)
    h = np.zeros(max(rhs.kernel.n_hoist, 1))
    ref = np.full(u.size, np.nan)
    run_tapes(RUN, rhs.kernel.tapes, u, f, on.p, 0.0, h, cix, ref, lanes)
    got = np.full(u.size, np.nan)
    b.rhs(u, fz, cix, lanes, got)
    assert np.all(np.isfinite(ref)) and np.array_equal(got, ref)
    plan = on.plan
    ft = jac.direct_tape(plan)
    W, P, C = plan.tile_width(lanes), int(plan.info["slots_per_lane"]), plan.capacity(lanes)
    jref = np.full(P * C, np.nan)
    hj = np.zeros(max(jac.kernel.n_hoist, 1))
    run_tapes(RUN, (ft.prologue, ft.body), u, f, on.p, 0.0, hj, cix, jref, lanes, W, P, C, ft.zero_slots)
    jgot = np.full(P * C, np.nan)
    b.jac(u, fz, cix, lanes, jgot)
    assert np.all(np.isfinite(jref)) and np.array_equal(jgot, jref)
    # fused operands (rows and constants read in place; not the leaf's default)
    ins, stores = _ssa(hz.rhs.body)
    blk = Block()
    blk.ins.extend(ins)
    ft_ = encode_fused(blk, stores)
    assert np.any(ft_.code[:, 0] >= FUSED_BASE) and ft_.code.shape[0] < hz.rhs.body.code.shape[0]
    got2 = np.full(u.size, np.nan)
    run_fused(ft_.code, ft_.consts, u, fz, on.p, 0.0, h, cix, got2, lanes, ft_.nreg, 0, 0, lanes, NO_SLOTS)
    assert np.array_equal(got2, ref)


def test_a_tape_without_state_independent_values_is_not_split(leaves):
    on, _ = leaves
    hz = lane_hoist(on, on.plan)
    again = split(hz.rhs.body, 99)      # the cut body has nothing left to hoist
    assert again.prologue is None and again.rows == 0 and again.body is hz.rhs.body


@pytest.mark.parametrize("poly", [False, True])
@pytest.mark.parametrize("kw", [{}, {"tile": None}, {"method": "ros34pw2"}, {"step": "shared"}])
def test_hoisted_leaf_equals_unhoisted(doc8, kw, poly, monkeypatch):
    monkeypatch.setattr(bound, "POLY", poly)
    on, off = _leaf(doc8, **kw), _leaf(doc8, hoist_rates=False, **kw)
    hz = lane_hoist(on, on.plan)
    assert hz is not None and (hz.rhs.poly is not None and hz.jac.poly is not None)    # tropo12 is mass action
    u, fj = _grid(on, L, 2)
    F = _forcing(on, fj, 2)
    v1, v2 = u.copy(), u.copy()
    s1 = on.advance(v1, 0.0, DT, forcing=F)
    s2 = off.advance(v2, 0.0, DT, forcing=F)
    assert s1.success and s2.success and s1.totals()["nsteps"] > L
    assert _same_or_close(v1, s1, v2, s2, on, poly)
    if poly:                        # the kernel changed the bits: the oracle sees it
        assert not np.array_equal(v1, v2)


@pytest.mark.parametrize("poly", [False, True])
def test_hoisted_leaf_with_a_forcing_callable_equals_unhoisted(doc8, poly, monkeypatch):
    # the fields change per stage: the hoisted rows are recomputed with them
    monkeypatch.setattr(bound, "POLY", poly)
    on, off = _leaf(doc8), _leaf(doc8, hoist_rates=False)
    u, fj = _grid(on, L, 4)
    F = _forcing(on, fj, 4).reshape(-1, L)

    def fcall(t, lanes):
        G = F[:, lanes].copy()
        G[-1] = G[-1] + 1e-3 * t          # the last field drifts in time
        return G

    v1, v2 = u.copy(), u.copy()
    s1 = on.advance(v1, 0.0, DT, forcing=fcall)
    s2 = off.advance(v2, 0.0, DT, forcing=fcall)
    # 1e-4 of the tolerance, not 1e-9: the leaf's finite-difference ∂f/∂t
    # divides the right-hand sides' last-place differences by a small time step
    assert s1.success and s2.success and _same_or_close(v1, s1, v2, s2, on, poly, 1e-4)


def test_hoisted_lane_alone_equals_lane_in_batch(doc8):
    on = _leaf(doc8)
    u, fj = _grid(on, L, 5)
    F = _forcing(on, fj, 5)
    v = u.copy()
    assert on.advance(v, 0.0, DT, forcing=F).success
    one = _leaf(lift(json.loads(TROPO12.read_text()), 1))
    k = 5
    w = np.ascontiguousarray(u.reshape(NS, L)[:, k])
    assert one.advance(w, 0.0, DT, forcing=np.ascontiguousarray(F.reshape(-1, L)[:, k])).success
    assert np.array_equal(w, v.reshape(NS, L)[:, k])


def test_hoisted_leaf_against_radau(leaves):
    on, _ = leaves
    u, fj = _grid(on, L, 6)
    F = _forcing(on, fj, 6)
    v = u.copy()
    assert on.advance(v, 0.0, DT, forcing=F).success
    rhs, sc = on.rhs_program, on.rhs_program.new_buffers(L)

    def f(t, y):
        return rhs.eval_into(np.ascontiguousarray(y), on.p, t, F, np.empty_like(y), sc)

    ref = solve_ivp(f, (0.0, DT), u, method="Radau", rtol=1e-10, atol=1e-6 * np.repeat(on.atol, L),
                    jac_sparsity=lane_blocks(NS, L))
    assert ref.success
    y = ref.y[:, -1]
    atol = np.repeat(on.atol, L)
    err = np.max(np.abs(v - y) / (atol + RTOL * np.abs(y)))
    assert err < 10.0, err          # within a few tolerances (a 3rd-order method at rtol 1e-3)


def test_hoist_rates_option_checked(doc8):
    with pytest.raises(JacError) as e:
        _leaf(doc8, hoist_rates="yes")
    assert e.value.code == "bad_option"


def _cut_arrays(cut) -> list:
    """Every array of a cut, in a fixed order (None where a part is absent)."""
    out: list = [cut.row0, cut.rows]
    for t in (cut.prologue, cut.body, cut.scheduled):
        out += [None] if t is None else [t.code, t.consts, t.nreg]
    out += [None] if cut.poly is None else list(cut.poly.arrays())
    return out


def _same_cut(a, b) -> bool:
    xa, xb = _cut_arrays(a), _cut_arrays(b)
    return len(xa) == len(xb) and all(
        (x is None and y is None) or (isinstance(x, np.ndarray) and isinstance(y, np.ndarray)
                                     and x.dtype == y.dtype and np.array_equal(x, y))
        or (not isinstance(x, np.ndarray) and x == y) for x, y in zip(xa, xb))


def test_a_stored_cut_is_the_computed_cut_and_a_damaged_one_is_cut_again(leaves, tmp_path, monkeypatch):
    # a warm build reads the cut from the build cache (lanehoist.split);
    # oracle: the cut computed without the cache. Every array read back is
    # read-only, and an entry whose arrays address past the input tape's
    # sizes (signed by this user, so only the bounds checks can refuse it)
    # is a logged miss, removed and cut again.
    from esmjac.compile import cache
    from esmjac.integrators import lanehoist as LH
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path))
    on, _ = leaves
    body = on.rhs_program.kernel.tapes[1]
    row0 = len(on.rhs_program.forcing_names)
    fresh = split(body, row0, cache=False)
    assert fresh.rows > 0 and fresh.poly is not None
    assert not list(tmp_path.glob("b*.json"))
    first = split(body, row0)               # computed and stored
    assert len(list(tmp_path.glob("b*.json"))) == 1 and _same_cut(first, fresh)
    again = split(body, row0)               # read back
    assert _same_cut(again, fresh) and again.scheduled is not first.scheduled
    for x in _cut_arrays(again):
        assert not (isinstance(x, np.ndarray) and x.flags.writeable)
    key = LH._key(body, row0)
    good = cache.load_product(key, {})
    for part, damage in (("scheduled", lambda d: d["scheduled"][0].__setitem__((0, 2), 10 ** 6)),
                         ("poly", lambda d: d["poly"]["fidx"].__setitem__(0, 10 ** 6)),
                         ("prologue", lambda d: d["prologue"][0].__setitem__(   # a hoisted row never stored
                             (int(np.flatnonzero(d["prologue"][0][:, 0] == OPS.index("store"))[0]), 2), row0 - 1))):
        bad = cache.load_product(key, {})
        for k in ("scheduled", "prologue", "body"):
            bad[k] = tuple(np.array(x) if isinstance(x, np.ndarray) else x for x in bad[k])
        bad["poly"] = {k: np.array(v) for k, v in bad["poly"].items()}
        damage(bad)
        assert cache.store_product(key, bad, [], {})
        with pytest.raises((ValueError, JacError)):
            LH._revive(cache.load_product(key, {}), body, row0)
        redone = split(body, row0)          # refused, removed, cut again and stored
        assert _same_cut(redone, fresh), part
        assert _same_cut(LH._revive(cache.load_product(key, {}), body, row0), fresh)
    assert good is not None
    # another row offset or another tape is another entry
    assert LH._key(body, row0 + 1) != key and LH._key(on.jac_program.kernel.tapes[1], row0) != key
