"""Bound calls (``prog.bind``): the per-call path decided once.

Values against the reference assembly / earthsci-ast (independent oracles);
refusals before compiled code; serial twins equal to the parallel kernels
bit for bit; nothing read from the environment or allocated per call."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from tests.support.models import chapman
from tests.support.programs import TROPO12, close, point

from esmjac import JacError, assemble
from esmjac.layouts import Csr, LaneBlocks, LaneSparseBlocks
from esmjac.layouts.types import untile
from esmjac.models.mechanism import box
from esmjac.runtime.bound import SERIAL_BELOW
from esmjac.runtime.programs import JacobianProgram, RhsProgram

_built: dict = {}


def tropo():
    if "t" not in _built:
        _built["t"] = (RhsProgram.build(TROPO12), JacobianProgram.build(TROPO12))
    return _built["t"]


def boxed():
    """The Chapman box (4 species): for the tests of lanes, twins and
    allocations, where the model does not matter -- its kernels compile in
    about a second each, tropo12's 15×15 lane blocks in ~15 s."""
    if "b" not in _built:
        d = box(chapman(cells=1))
        _built["b"] = (RhsProgram.build(d), JacobianProgram.build(d))
    return _built["b"]


def _dense(j, plan, out, N):
    from scipy.sparse import csr_array
    if isinstance(plan.layout, Csr):
        ip, ix, shape = plan.csr_index(N)
        return csr_array((out, ix, ip), shape=shape).toarray()
    n = len(j.layout.states)
    M = np.zeros((n * N, n * N))
    order = plan.info.get("ordering") or list(range(n))
    keys = [tuple(x) for x in plan.info["lu_pattern"]] if "lu_pattern" in plan.info else \
        [(a, b) for a in range(n) for b in range(n)]
    lanes = np.arange(N)
    V = untile(out, len(keys), N, plan.tile_width(N))     # [slot, lane]
    for q, (a, b) in enumerate(keys):
        M[order[a] * N + lanes, order[b] * N + lanes] = V[q]
    return M


@pytest.mark.parametrize("keep_slab", [True, False])
def test_bound_jacobian_matches_reference_assembly(keep_slab):
    r, j = tropo()
    u = point(r, 11)
    A = assemble(TROPO12, u={n: float(x) for n, x in zip(r.names, u)}).matrix.toarray()
    for lay in (LaneSparseBlocks(), LaneBlocks(), Csr()):
        plan = j.plan(lay, source=r)
        run = j.bind(plan, j.new_workspace(keep_slab=keep_slab))
        out = np.full(plan.out_size(j.cells), np.nan)
        for _ in range(2):                      # the second call reuses everything
            run(u, r.p0, 0.0, None, out)
            assert close(_dense(j, plan, out, j.cells), A, 1e-13), lay


def test_bound_rhs_matches_earthsci_and_eval_into():
    from esmjac.model.load import load_view
    from esmjac.reference.check import _flat, rhs_vector
    r, _ = tropo()
    run = r.bind()
    u = point(r, 12)
    out = np.empty_like(u)
    run(u, r.p0, 0.0, None, out)
    ref = rhs_vector(_flat(load_view(TROPO12)), list(r.names), u, 0.0, None)
    assert close(out, ref, 1e-12)
    again = np.empty_like(u)
    r.eval_into(u, r.p0, 0.0, None, again)
    assert np.array_equal(out, again)


def test_float32_binding():
    r, j = tropo()
    plan = j.plan(LaneSparseBlocks())
    u = point(r, 13)
    o64 = np.zeros(plan.out_size(j.cells))
    o32 = np.zeros(plan.out_size(j.cells), dtype=np.float32)
    j.bind(plan, j.new_workspace())(u, r.p0, 0.0, None, o64)
    run32 = j.bind(plan, j.new_workspace(), np.float32)
    run32(u.astype(np.float32), r.p0, 0.0, None, o32)
    assert close(o32.astype(np.float64), o64, 1e-5)
    with pytest.raises(JacError):
        run32(u, r.p0, 0.0, None, o32)          # float64 into a float32 binding


def test_serial_twins_give_the_parallel_bits():
    """A small binding runs serial twins, a large one the parallel kernels;
    the same cells give the same bits."""
    r, j = boxed()
    small, big = 8, SERIAL_BELOW // len(j.layout.states) + 64
    rng = np.random.default_rng(5)
    u0, p0, _ = r.defaults(big)
    u = u0 * rng.uniform(0.5, 1.5, u0.size)
    us = np.ascontiguousarray(u.reshape(-1, big)[:, :small].ravel())
    for keep in (True, False):
        plan = j.plan(LaneSparseBlocks())
        rb = j.bind(plan, j.new_workspace(lanes=big, keep_slab=keep))
        rs = j.bind(plan, j.new_workspace(lanes=small, keep_slab=keep))
        assert rs.serial and not rb.serial
        ob, os_ = np.zeros(plan.out_size(big)), np.zeros(plan.out_size(small))
        rb(u, p0, 0.0, None, ob)
        rs(us, p0, 0.0, None, os_)
        P = int(plan.info["slots_per_lane"])
        assert np.array_equal(untile(ob, P, big, plan.tile_width(big))[:, :small],
                              untile(os_, P, small, plan.tile_width(small)))
    fb, fs = np.zeros(u.size), np.zeros(us.size)
    r.bind(big)(u, p0, 0.0, None, fb)
    r.bind(small)(us, p0, 0.0, None, fs)
    assert np.array_equal(fb.reshape(-1, big)[:, :small], fs.reshape(-1, small))


def test_bad_input_is_refused_before_compiled_code():
    r, j = tropo()
    plan = j.plan(LaneSparseBlocks())
    run = j.bind(plan, j.new_workspace())
    rr = r.bind()
    u = point(r, 14)
    n_out = plan.out_size(j.cells)
    bad = [
        (u[:-1], r.p0, None, np.full(n_out, np.nan)),
        (u.tolist(), r.p0, None, np.full(n_out, np.nan)),
        (np.repeat(u, 2)[::2], r.p0, None, np.full(n_out, np.nan)),
        (u.astype(np.float32), r.p0, None, np.full(n_out, np.nan)),
        (u, r.p0[:-1], None, np.full(n_out, np.nan)),
        (u, r.p0, np.ones(3), np.full(n_out, np.nan)),
        (u, r.p0, None, np.full(n_out - 1, np.nan)),
        (u, None, None, np.full(n_out, np.nan)),
    ]
    for args in bad:
        uu, pp, ff, oo = args
        with pytest.raises(JacError) as e:
            run(uu, pp, 0.0, ff, oo)
        assert e.value.code == "bad_argument"
        assert np.isnan(oo).all()                  # nothing ran
    ro = np.full(n_out, np.nan)
    ro.setflags(write=False)
    with pytest.raises(JacError):
        run(u, r.p0, 0.0, None, ro)
    out = np.full(u.size, np.nan)
    with pytest.raises(JacError):
        rr(u[:-1], r.p0, 0.0, None, out)
    assert np.isnan(out).all()


def test_binding_refuses_foreign_plans_and_workspaces():
    r, j = tropo()
    _, jb = boxed()
    plan = j.plan(LaneSparseBlocks())
    with pytest.raises(JacError) as e:
        j.bind(jb.plan(LaneSparseBlocks()), j.new_workspace())
    assert e.value.code == "foreign_layout"
    with pytest.raises(JacError):
        j.bind(plan, jb.new_workspace())
    with pytest.raises(JacError):
        j.bind(plan, object())


def test_parameters_mutated_in_place_are_seen():
    r, j = tropo()
    plan = j.plan(LaneSparseBlocks())
    run = j.bind(plan, j.new_workspace())
    u = point(r, 15)
    p = r.p0.copy()
    a, b, c = (np.zeros(plan.out_size(j.cells)) for _ in range(3))
    run(u, p, 0.0, None, a)
    p[list(r.param_names).index("T")] += 20.0
    run(u, p, 0.0, None, b)
    j.bind(plan, j.new_workspace())(u, p.copy(), 0.0, None, c)
    assert not np.array_equal(a, b) and np.array_equal(b, c)


_ALLOC_CHILD = """
import gc, os, tracemalloc
import numpy as np
from esmjac.layouts import LaneSparseBlocks
from esmjac.models.mechanism import box
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from tests.support.models import chapman


class CountingEnviron(dict):
    reads = 0

    def __getitem__(self, k):
        type(self).reads += 1
        return super().__getitem__(k)

    def get(self, k, d=None):
        type(self).reads += 1
        return super().get(k, d)


d = box(chapman(cells=1))
r, j = RhsProgram.build(d), JacobianProgram.build(d)
N = 16
plan = j.plan(LaneSparseBlocks())
run = j.bind(plan, j.new_workspace(lanes=N))
rr = r.bind(N)
u, p, _ = r.defaults(N)
out, du = np.zeros(plan.out_size(N)), np.zeros(u.size)
run(u, p, 0.0, None, out)
rr(u, p, 0.0, None, du)
env = CountingEnviron(os.environ)
os.environ = env
gc.collect()
gc.disable()
grown = []
for _window in range(3):
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for _ in range(50):
        run(u, p, 0.0, None, out)
        rr(u, p, 0.0, None, du)
    grown.append(tracemalloc.get_traced_memory()[1] - base)
    tracemalloc.stop()
print("RESULT " + json.dumps({"reads": env.reads, "grown": grown, "out_nbytes": int(out.nbytes)}))
"""


def test_no_environment_reads_or_allocations_per_call():
    """100 bound calls (a Jacobian and a right-hand side) read no environment
    variable and allocate no buffer. Measured in a fresh process: tracemalloc
    sees every thread, and threads an earlier test left in a worker (a
    cluster's event loop) allocated 2.4-3.6 kB in every window of a cold CI
    run. The quietest of three windows (a collection or a finalizer can still
    run in one); an array the size of the output per call shows in all."""
    from tests.support.child import run_child

    env = {k: os.environ[k] for k in ("NUMBA_CACHE_DIR",) if k in os.environ}   # reuse this run's caches
    res = run_child(_ALLOC_CHILD, os.environ.get("ESMJAC_CACHE_DIR") or tempfile.mkdtemp(), env=env)
    assert res["reads"] == 0
    assert min(res["grown"]) < min(res["out_nbytes"], 4096), res["grown"]


def test_bound_calls_run_on_read_only_views_of_the_callers_arrays():
    """A binding hands its kernels read-only views of ``u``, ``p`` and the
    forcing (the one flavour they are compiled for), kept while the caller
    passes the same arrays and made anew for new ones. Oracles: chem's
    hand-derived right-hand side at every call (a stale view would give an
    earlier array's values; an array changed in place must be seen) and the
    compiled driver's signatures (no writable input compiled)."""
    from tests.support.models import chem

    doc = chem(cells=4)
    doc["metadata"]["name"] = "BoundViews"       # a module of its own: no other test calls its driver
    r = RhsProgram.build(doc)
    rr = r.bind(4)
    rng = np.random.default_rng(3)

    def want(u, p):
        A, B = u[:4], u[4:]
        return np.concatenate([-p[0] * A + p[1] * B * B, p[0] * A - 2 * p[1] * B * B])

    u1, u2, p = rng.uniform(0.5, 2.0, 8), rng.uniform(0.5, 2.0, 8), np.array([0.3, 2.0])
    out = np.zeros(8)
    for u in (u1, u1, u2, u1):
        np.testing.assert_allclose(rr(u, p, 0.0, None, out), want(u, p), rtol=1e-14)
        u *= 1.5                                  # in place: the next call with this array sees it
    p[0] = 0.7
    np.testing.assert_allclose(rr(u1, p, 0.0, None, out), want(u1, p), rtol=1e-14)
    drv = r.kernel.driver()
    sigs = getattr(drv, "drive", drv).signatures    # drive(u, f, p, ...)
    assert sigs and all(not s[0].mutable and not s[1].mutable and not s[2].mutable for s in sigs), sigs
