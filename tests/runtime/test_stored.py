"""Cached programs (runtime/stored.py): loaded without their expressions,
checked before use, one entry for every cell count.

Oracles: the hand-derived Jacobian and right-hand side of the two-species
mechanism (tests/support/models.chem: per cell f_A = -k1 A + k2 B²,
f_B = k1 A - 2 k2 B²) and a fresh build with the cache off.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import esmjac.runtime.programs as P
from esmjac.compile.cache import load_product, store_product
from esmjac.compile.tape import OPS, TapeBounds, check_tape
from esmjac.errors import JacError
from esmjac.layouts import Csr, LaneSparseBlocks
from esmjac.models.mechanism import box
from esmjac.runtime import stored
from tests.support.models import chem, chem_jacobian

K1, K2 = 0.3, 2.0
TAPE = {"engine": "tape", "progress": False}


@pytest.fixture(scope="module")
def _kernels(tmp_path_factory):
    """One cache folder for the module: Numba's compiled kernels (run_tape
    among them) stay warm between tests."""
    return tmp_path_factory.mktemp("stored-cache")


@pytest.fixture
def cache(_kernels, monkeypatch):
    """The module's cache folder with no build products in it."""
    for p in _kernels.glob("b*"):
        p.unlink()
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(_kernels))
    return _kernels


@pytest.fixture
def builds(monkeypatch):
    """Counts the builds that ran (each loads the model's view; a program
    from the cache does not)."""
    n = {"builds": 0}
    view_layout = P._view_layout

    def counted(*a, **k):
        n["builds"] += 1
        return view_layout(*a, **k)
    monkeypatch.setattr(P, "_view_layout", counted)
    return n


def _dense(j, u, plan_layout=Csr()):
    plan = j.plan(plan_layout)
    ws = j.new_workspace(len(u) // 2)
    out = np.zeros(plan.out_size(ws.lanes))
    j.eval_into(plan, u, j.p0, 0.0, None, out, ws)
    if isinstance(plan_layout, Csr):
        from scipy.sparse import csr_array
        return out, csr_array((out, plan.indices, plan.indptr), shape=(u.size, u.size)).toarray()
    return out, None


def _rhs(r, u):
    du = np.zeros(u.size)
    return r.eval_into(u, r.p0, 0.0, None, du, r.new_buffers(u.size // 2))


def _hand_rhs(u):
    n = u.size // 2
    a, b = u[:n], u[n:]
    return np.concatenate([-K1 * a + K2 * b * b, K1 * a - 2 * K2 * b * b])


def _point(cells):
    return np.linspace(1.0, 2.0, 2 * cells)


@pytest.mark.parametrize("engine", ["tape", "codegen"])
def test_a_loaded_program_gives_a_fresh_builds_bits(cache, builds, engine):
    doc = chem(cells=6)
    opts = {"engine": engine, "progress": False}
    P.JacobianProgram.build(doc, options=opts)
    P.RhsProgram.build(doc, options=opts)
    j = P.JacobianProgram.build(doc, options=opts)              # from the cache
    r = P.RhsProgram.build(doc, options=opts)
    assert builds["builds"] == 2
    if engine == "tape":                                         # the DAG was not decoded to load it
        assert isinstance(j.doc, stored.LazyDoc) and isinstance(r.doc, stored.LazyDoc)
    jf = P.JacobianProgram.build(doc, options={**opts, "cache": False})
    rf = P.RhsProgram.build(doc, options={**opts, "cache": False})
    u = _point(6)
    (a, dense), (b, _) = _dense(j, u), _dense(jf, u)
    assert np.array_equal(a, b)
    assert np.allclose(dense, chem_jacobian(u, K1, K2), rtol=1e-14, atol=0)
    for lay in (LaneSparseBlocks(), LaneSparseBlocks(tile=None)):
        assert np.array_equal(_dense(j, u, lay)[0], _dense(jf, u, lay)[0])
    assert np.array_equal(_rhs(r, u), _rhs(rf, u))
    assert np.allclose(_rhs(r, u), _hand_rhs(u), rtol=1e-14, atol=0)
    assert j.fingerprint == jf.fingerprint and r.owner == rf.owner
    # the expressions decode on demand, equal to the fresh build's
    assert j.doc.to_json() == jf.doc.to_json() and tuple(j.bands) == tuple(jf.bands)


def _stored_core(kind="jac", doc=None):
    key = P.build_key(kind, doc, None, "states" if kind == "jac" else None, P.check_options(TAPE, P.PROGRAM_OPTIONS))
    return key, load_product(key[0], P._product_types())


def _tamper_body(core, fn):
    t = list(core["tapes"])
    code = np.array(t[3])
    t[3] = fn(code)
    return {**core, "tapes": t}


_STATE_ROW = OPS.index("lane_u")
_STORE = OPS.index("store")

TAMPERS = {
    "opcode": lambda c: _set(c, 0, 0, len(OPS) + 3),
    "negative_opcode": lambda c: _set(c, 0, 0, -1),
    "register": lambda c: _set(c, 0, 1, 10 ** 6),
    "state_read": lambda c: _set(c, _row(c, _STATE_ROW), 2, 99),
    "store_target": lambda c: _set(c, _row(c, _STORE), 2, 10 ** 9),
    "operand_register": lambda c: _set(c, _row(c, OPS.index("*")), 3, -7),
    "float_code": lambda c: c.astype(np.float64),
    "wrong_shape": lambda c: c[:, :4].copy(),
    "truncated": lambda c: c[: len(c) // 2],         # still in bounds, but no longer the stored kernel
}


def _row(c, op):
    return int(np.flatnonzero(c[:, 0] == op)[0])


def _set(c, i, k, v):
    c = c.copy()
    c[i, k] = v
    return c


@pytest.mark.parametrize("how", sorted(TAMPERS))
def test_a_tampered_stored_tape_is_refused_and_rebuilt(cache, builds, how, caplog):
    """An attacker who rewrites the stored tape *and* its hashes: the build
    refuses the tape before run_tape sees it, rebuilds, stores a good entry."""
    doc = chem(cells=4)
    P.JacobianProgram.build(doc, options=TAPE)
    (key, deps), core = _stored_core("jac", doc)
    bad = _tamper_body(core, TAMPERS[how])
    assert store_product(key, bad, deps, P._product_types(), stored._SKIP)
    with caplog.at_level(logging.WARNING, logger="esmjac.cache"):
        j = P.JacobianProgram.build(doc, options=TAPE)
    assert builds["builds"] == 2 and "refused" in caplog.text
    assert not isinstance(j.doc, stored.LazyDoc)
    u = _point(4)
    assert np.allclose(_dense(j, u)[1], chem_jacobian(u, K1, K2), rtol=1e-14, atol=0)
    j2 = P.JacobianProgram.build(doc, options=TAPE)               # the rebuilt entry is good again
    assert builds["builds"] == 2 and isinstance(j2.doc, stored.LazyDoc)


@pytest.mark.parametrize("how", sorted(k for k in TAMPERS if k != "truncated"))
def test_check_tape_refuses_out_of_bound_tapes_with_a_cache_error(how):
    lay = P.JacobianProgram.build(chem(cells=2), options={**TAPE, "cache": False})
    pro, body = lay.kernel.tapes
    b = TapeBounds(n_hoist=lay.kernel.n_hoist, n_params=2, n_states=2, n_forcing=0, n_cix=1,
                   stores=lay.n_fields)
    check_tape(body.code, body.consts, body.nreg, b)                 # the real one passes
    with pytest.raises(JacError) as e:
        check_tape(TAMPERS[how](np.array(body.code)), body.consts, body.nreg, b)
    assert e.value.code == "cache_error"
    with pytest.raises(JacError):                                    # a body is not a prologue
        check_tape(body.code, body.consts, body.nreg,
                   TapeBounds(n_hoist=lay.kernel.n_hoist, n_params=2, n_states=2, n_forcing=0, n_cix=1,
                              stores=0, prologue=True))
    with pytest.raises(JacError):                                    # constants out of range
        check_tape(body.code, np.zeros(0), body.nreg, b)


def test_a_truncated_expression_file_is_a_miss(cache, builds):
    doc = chem(cells=4)
    P.JacobianProgram.build(doc, options=TAPE)
    for p in cache.glob("b*.json"):
        p.write_bytes(p.read_bytes()[:100])          # hashes now mismatch: both entries are misses
    j = P.JacobianProgram.build(doc, options=TAPE)
    assert builds["builds"] == 2
    u = _point(4)
    assert np.allclose(_dense(j, u)[1], chem_jacobian(u, K1, K2), rtol=1e-14, atol=0)


@pytest.mark.parametrize("engine", ["tape", "codegen"])
def test_two_cell_counts_share_one_entry(cache, builds, engine):
    opts = {"engine": engine, "progress": False}
    P.JacobianProgram.build(chem(cells=4), options=opts)
    P.RhsProgram.build(chem(cells=4), options=opts)
    n_entries = len(list(cache.glob("b*.json")))
    big = chem(cells=10_000)
    j = P.JacobianProgram.build(big, options=opts)
    r = P.RhsProgram.build(big, options=opts)
    assert builds["builds"] == 2
    assert len(list(cache.glob("b*.json"))) == n_entries
    assert j.cells == 10_000 and j.u0.shape == (20_000,) and r.default_cix.shape == (10_000,)
    jf = P.JacobianProgram.build(big, options={**opts, "cache": False})
    rf = P.RhsProgram.build(big, options={**opts, "cache": False})
    assert j.fingerprint == jf.fingerprint and np.array_equal(j.u0, jf.u0)
    u = np.random.default_rng(1).uniform(0.5, 2.0, 20_000)
    a, b = _dense(j, u, LaneSparseBlocks())[0], _dense(jf, u, LaneSparseBlocks())[0]
    assert np.array_equal(a, b)
    assert np.array_equal(_rhs(r, u), _rhs(rf, u))
    assert np.allclose(_rhs(r, u), _hand_rhs(u), rtol=1e-14, atol=0)
    small = _point(3)
    assert np.allclose(_dense(P.JacobianProgram.build(chem(cells=3), options=opts), small)[1],
                       chem_jacobian(small, K1, K2), rtol=1e-14, atol=0)
    assert builds["builds"] == 4        # the two cache=False builds above, nothing more


def test_a_cell_program_with_per_cell_defaults_keeps_its_own_entry(cache, builds):
    """Defaults that differ between cells do not broadcast: such a document
    is stored under its own key, and another cell count builds again."""
    def doc(n):
        d = chem(cells=n)
        d["models"]["M"]["variables"]["A"]["default"] = [1.0 + i for i in range(n)]
        return d
    P.JacobianProgram.build(doc(4), options=TAPE)
    j = P.JacobianProgram.build(doc(5), options=TAPE)
    assert builds["builds"] == 2 and np.array_equal(j.u0[:5], [1.0, 2.0, 3.0, 4.0, 5.0])


def test_a_box_mechanism_is_one_entry_at_any_lane_count(cache, builds):
    """A scalar box mechanism: one build, one entry; the lane count is the
    workspace's (4 and 10⁴ lanes give the bits of the mechanism lifted to
    as many cells, itself checked against the hand Jacobian)."""
    b = box(chem(cells=1))
    P.JacobianProgram.build(b, options=TAPE)
    j = P.JacobianProgram.build(b, options=TAPE)
    assert builds["builds"] == 1 and isinstance(j.doc, stored.LazyDoc)
    for lanes in (4, 10_000):
        u = np.random.default_rng(lanes).uniform(0.5, 2.0, 2 * lanes)
        lifted = P.JacobianProgram.build(chem(cells=lanes), options=TAPE)
        assert np.array_equal(_dense(j, u, LaneSparseBlocks())[0], _dense(lifted, u, LaneSparseBlocks())[0])
    u4 = _point(4)                     # and the lifted program against the hand Jacobian
    assert np.allclose(_dense(P.JacobianProgram.build(chem(cells=4), options=TAPE), u4)[1],
                       chem_jacobian(u4, K1, K2), rtol=1e-14, atol=0)


def test_a_range_with_explicit_bounds_keeps_the_size_in_the_key(cache):
    """``ranges`` with explicit bounds may follow the index set's size: no
    grid-free key (each size its own entry); whole-set ranges get one."""
    from esmjac.compile.cache import grid_free_key
    d = chem(cells=4)
    assert grid_free_key(d, "x") is not None and grid_free_key(d, "x")[0] == grid_free_key(chem(cells=9), "x")[0]
    d["models"]["M"]["equations"][0]["rhs"]["ranges"]["i"] = {"from": 1, "to": 4}
    assert grid_free_key(d, "x") is None
