"""A box (0-D) mechanism is a cell program whose lane count is chosen at run
time, with per-lane scalar parameters read from ``forcing``.

Oracles: earthsci-ast's own right-hand side and the reference assembly
(``esmjac.assemble``) of the *lifted* array document of the same mechanism
(``mechanism.lift(box, N, cell_parameters=...)``), whose per-cell defaults
carry the very values the box program gets per lane (earthsci-ast's RHS gets
them bound as arrays, ``p=``, and the states per call)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.sparse import csr_array

from tests.support.programs import TROPO12, close

from esmjac import JacError, assemble
from esmjac.layouts import Csr, LaneBlocks, LaneSparseBlocks
from esmjac.layouts.types import untile
from esmjac.models.mechanism import box, lift
from esmjac.runtime.programs import JacobianProgram, RhsProgram

PER_LANE = ["T", "j_NO2"]
_built: dict = {}


def box_doc() -> dict:
    return box(json.loads(TROPO12.read_text()))


def progs(per_lane=tuple(PER_LANE), wrt="states", engine="auto"):
    key = (tuple(per_lane), wrt, engine)
    if key not in _built:
        opts = {"per_lane": list(per_lane), "engine": engine}
        _built[key] = (RhsProgram.build(box_doc(), options=opts),
                       JacobianProgram.build(box_doc(), wrt=wrt, options={**opts, "allow_empty": True}))
    return _built[key]


def lane_point(r, N, seed):
    """Random per-lane states and per-lane T, j_NO2 (independent per cell)."""
    rng = np.random.default_rng(seed)
    u0, p0, f0 = r.defaults(N)
    u = u0 * rng.uniform(0.5, 1.5, u0.size)
    f = np.concatenate([rng.uniform(240.0, 310.0, N), rng.uniform(1e-3, 1e-2, N)])
    # read-only, as the build's warm call passes the default forcing: Numba
    # compiles one specialization per writability (~16 s of CPU per dense
    # tropo12 Jacobian chunk), so a writable one would compile every chunk again
    f.setflags(write=False)
    return u, p0, f


def lifted_with(u, f, N) -> dict:
    """The lifted array document whose defaults are this lane point."""
    d = lift(box_doc(), N, cell_parameters=PER_LANE)
    vs = d["models"]["Chem"]["variables"]
    names = [n for n, v in vs.items() if v["type"] == "unknown"]
    for k, n in enumerate(names):
        vs[n]["default"] = u[k * N:(k + 1) * N].tolist()
    for k, n in enumerate(PER_LANE):
        vs[n]["default"] = f[k * N:(k + 1) * N].tolist()
    return d


def test_box_mechanism_is_a_cell_program():
    """A cell program with the per-lane parameters as forcing (its values on
    every lane layout: against the reference assembly of the lifted
    document, test_box_jacobian_per_lane_matches_reference_assembly_on_lift)."""
    r, j = progs()
    assert r.kind == j.kind == "cell" and j.cells == 1
    assert r.forcing_names == ("T", "j_NO2") and "T" not in r.param_names


def test_box_rhs_per_lane_matches_earthsci_on_the_lifted_document():
    from benchmarks import peers
    r, _ = progs()
    N = 10_000
    u, p, f = lane_point(r, N, 1)
    out = np.empty_like(u)
    r.eval_into(u, p, 0.0, f, out, r.new_buffers(N))
    # the per-cell T and j_NO2 bound as arrays (p=), the states given per
    # call: the same oracle as the lifted document with 10^4-long defaults,
    # whose JSON-schema validation cost ~25 s of earthsci-ast's load
    ref_rhs = peers.earthsci_rhs(lift(box_doc(), N, cell_parameters=PER_LANE),
                                 p={n: f[k * N:(k + 1) * N] for k, n in enumerate(PER_LANE)})
    assert list(ref_rhs.names) == list(r.element_names(N))
    ref = ref_rhs(u)
    assert close(out, ref, 1e-12), np.max(np.abs(out - ref))


def _dense_lanes(j, plan, out, N):
    """Per-lane dense blocks (N, n, m) from a lane layout's output."""
    n, m = len(j.layout.states), len(j.col_vars)
    B = np.zeros((N, n, m))
    info = plan.info
    if isinstance(plan.layout, Csr):
        ip, ix, shape = plan.csr_index(N)
        A = csr_array((out, ix, ip), shape=shape).toarray()
        for r_ in range(n):
            for c in range(m):
                B[:, r_, c] = np.diag(A[r_ * N:(r_ + 1) * N, c * N:(c + 1) * N])
        return B
    order = info.get("ordering") or list(range(n))
    keys = [tuple(x) for x in info["lu_pattern"]] if "lu_pattern" in info else \
        [(a, b) for a in range(n) for b in range(m)]
    V = untile(out, len(keys), N, plan.tile_width(N))     # [slot, lane]
    for q, (a, b) in enumerate(keys):
        B[:, order[a], order[b]] = V[q]
    return B


@pytest.mark.parametrize("wrt", ["states", "forcing"])
def test_box_jacobian_per_lane_matches_reference_assembly_on_lift(wrt):
    """Every lane layout on the tape engine (one interpreter for every
    layout), and the generated code on one layout (the leaf's
    LaneSparseBlocks; Csr for the forcing columns): a plan's generated
    kernels are compiled per layout (~35 s of CPU each for this box), and
    tests/layouts/test_plans.py checks them on every layout."""
    r, j = progs(wrt=wrt)
    rt, jt = progs(wrt=wrt, engine="tape")
    assert jt.kernel.engine == "tape" and j.kernel.engine == "codegen"
    N = 12
    u, p, f = lane_point(r, N, 2)
    A = assemble(lifted_with(u, f, N), wrt=wrt).matrix.toarray()
    ref = np.stack([A[np.arange(len(j.layout.states))[:, None] * N + lane,
                      np.arange(len(j.col_vars))[None, :] * N + lane] for lane in range(N)])
    layouts = [Csr(), LaneBlocks()] + ([LaneBlocks("markowitz"), LaneSparseBlocks()] if wrt == "states" else [])
    for rr, jj, lay in [(rt, jt, lay) for lay in layouts] + [(r, j, layouts[-1] if wrt == "states" else Csr())]:
        plan = jj.plan(lay, source=rr)
        ws = jj.new_workspace(lanes=N)
        out = np.full(plan.out_size(N), np.nan)
        jj.eval_into(plan, u, p, 0.0, f, out, ws)
        got = _dense_lanes(jj, plan, out, N)
        assert close(got, ref, 1e-12), (jj.kernel.engine, lay, np.max(np.abs(got - ref)))


def test_box_program_equals_the_lifted_program_bit_for_bit():
    """The same mechanism built from the box (lanes chosen at run time) and
    from its lifted N-cell document gives the same bits."""
    r, j = progs()
    N = 50
    u, p, f = lane_point(r, N, 3)
    d = lift(box_doc(), N, cell_parameters=PER_LANE)
    rl = RhsProgram.build(d)
    jl = JacobianProgram.build(d)
    assert rl.forcing_names == r.forcing_names
    a, b = np.empty_like(u), np.empty_like(u)
    r.eval_into(u, p, 0.0, f, a, r.new_buffers(N))
    rl.eval_into(u, p, 0.0, f, b)
    assert np.array_equal(a, b)
    for lay in (LaneSparseBlocks(), Csr()):
        pa, pb = j.plan(lay), jl.plan(lay)
        oa, ob = np.zeros(pa.out_size(N)), np.zeros(pb.out_size(N))
        j.eval_into(pa, u, p, 0.0, f, oa, j.new_workspace(lanes=N))
        jl.eval_into(pb, u, p, 0.0, f, ob, jl.new_workspace())
        assert np.array_equal(oa, ob), lay
    ia, ib = pa.csr_index(N), pb.csr_index()
    assert np.array_equal(ia[0], ib[0]) and np.array_equal(ia[1], ib[1])


def test_tape_engine_runs_box_mechanisms():
    r, j = progs()
    rt, jt = progs(engine="tape")
    assert jt.kernel.engine == "tape" and rt.kernel.engine == "tape"
    N = 33
    u, p, f = lane_point(r, N, 4)
    a, b = np.empty_like(u), np.empty_like(u)
    r.eval_into(u, p, 0.0, f, a, r.new_buffers(N))
    rt.eval_into(u, p, 0.0, f, b, rt.new_buffers(N))
    assert close(a, b, 1e-14)
    pa, pb = j.plan(LaneSparseBlocks()), jt.plan(LaneSparseBlocks())
    oa, ob = np.zeros(pa.out_size(N)), np.zeros(pb.out_size(N))
    j.eval_into(pa, u, p, 0.0, f, oa, j.new_workspace(lanes=N))
    jt.eval_into(pb, u, p, 0.0, f, ob, jt.new_workspace(lanes=N))
    assert close(oa, ob, 1e-14)


def test_defaults_broadcast_to_any_lane_count():
    r, _ = progs()
    d = lift(box_doc(), 5, cell_parameters=PER_LANE)
    rl = RhsProgram.build(d)
    u0, p0, f0 = r.defaults(5)
    assert np.array_equal(u0, rl.u0) and np.array_equal(p0, rl.p0) and np.array_equal(f0, rl.forcing0)
    # forcing=None at any lane count reads the broadcast defaults
    a, b = np.empty_like(u0), np.empty_like(u0)
    r.eval_into(u0, p0, 0.0, None, a, r.new_buffers(5))
    rl.eval_into(u0, p0, 0.0, None, b)
    assert np.array_equal(a, b)


def test_scalar_box_without_per_lane_keeps_parameters_hoisted():
    r, j = progs(per_lane=())
    assert r.kind == "cell" and r.forcing_names == () and "T" in r.param_names
    N = 4
    u0, p0, _ = r.defaults(N)
    out = np.empty_like(u0)
    r.eval_into(u0, p0, 0.0, None, out, r.new_buffers(N))
    # every lane holds the same default cell: the same numbers per lane
    blocks = out.reshape(-1, N)
    assert np.all(blocks == blocks[:, :1])
    assert list(r.names) == [f"Chem.{s}" for s in r.layout.states]


@pytest.mark.parametrize("bad", [["O3"], ["nope"], "T", ["T", "T"]])
def test_per_lane_refuses_what_is_not_a_scalar_parameter(bad):
    with pytest.raises(JacError) as e:
        RhsProgram.build(box_doc(), options={"per_lane": bad, "cache": False})
    assert e.value.code == "bad_option"


def test_per_lane_forcing_is_checked_before_compiled_code():
    r, j = progs()
    u, p, f = lane_point(r, 6, 5)
    out = np.empty_like(u)
    with pytest.raises(JacError) as e:
        r.eval_into(u, p, 0.0, f[:-1], out, r.new_buffers(6))
    assert e.value.code == "bad_argument"
    plan = j.plan(LaneSparseBlocks())
    with pytest.raises(JacError):
        j.eval_into(plan, u, p, 0.0, f.astype(np.float32), np.zeros(plan.out_size(6)),
                    j.new_workspace(lanes=6))


def test_element_names_are_computed_not_stored():
    import pickle
    r, j = progs()
    names = r.element_names(10**6)
    assert len(names) == 15 * 10**6
    assert names[0] == "Chem.O3[1]" and names[-1] == "Chem.HCHO[1000000]"
    assert names[10**6] == "Chem.O[1]"
    # the product stores no per-element strings, at any lane count
    assert len(pickle.dumps(names)) < 4096
    assert "names" not in vars(r) and "row_names" not in vars(j)


def test_one_cell_lifted_document_is_a_cell_program():
    """Lifted to a single cell, the calculus pins the cell index to 1; the
    program is still a cell program and matches the reference assembly."""
    doc = lift(json.loads(TROPO12.read_text()), 1)
    j = JacobianProgram.build(doc)
    r = RhsProgram.build(doc)
    assert j.kind == r.kind == "cell"
    plan = j.plan(Csr(), source=r)
    out = np.zeros(plan.out_size(1))
    j.eval_into(plan, r.u0, r.p0, 0.0, None, out, j.new_workspace())
    ip, ix, shape = plan.csr_index(1)
    A = assemble(doc).matrix.toarray()
    assert close(csr_array((out, ix, ip), shape=shape).toarray(), A, 1e-13)


def test_per_lane_defaults_on_a_gridded_document_cover_every_cell():
    # A per-lane parameter of a gridded document: its scalar default is
    # every cell's value, so the defaults (forcing=None) evaluate the same
    # right-hand side as the program that reads it as a scalar parameter.
    doc = json.loads(TROPO12.read_text())
    plain = RhsProgram.build(doc)
    lanes = RhsProgram.build(doc, options={"per_lane": ["T"]})
    N = plain.cells
    assert N > 1 and lanes.forcing0.shape == (lanes.f_size(N),)
    T = plain.p0[list(plain.param_names).index("T")]
    k = list(lanes.forcing_names).index("T")
    assert np.all(lanes.forcing0[k * N:(k + 1) * N] == T)
    u = plain.u0.copy()
    a, b = np.empty_like(u), np.empty_like(u)
    plain.eval_into(u, plain.p0, 0.0, None, a)
    lanes.eval_into(u, lanes.p0, 0.0, None, b)
    assert close(b, a, 1e-12)
