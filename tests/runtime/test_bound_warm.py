"""A binding's warm call compiles the very specializations its real calls
run: Numba specializes on writability too, and the programs' ``p0`` (like
the adapters' ``p``) is read-only, so a warm call with a writable parameter
vector compiled signatures nobody used and left the real ones to the first
timed call (runtime/bound.py ``_warm_p``). The same for a built program's
own warm-up and its first unbound call at the defaults (read-only ``p0``
and default forcing; runtime/programs.py ``_warm``)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from esmjac.compile.tape import run_tape
from esmjac.layouts import LaneSparseBlocks
from esmjac.compile.twins import parallel_copy, serial_twin
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from tests.support.models import chem, chem_jacobian

CELLS = 3
OPTS = {"cache": False, "engine": "tape"}


def _signatures() -> tuple:
    return len(parallel_copy(run_tape).signatures), len(serial_twin(run_tape).signatures)


def test_a_bound_rhs_first_call_compiles_nothing():
    r = RhsProgram.build(chem(cells=CELLS), options=OPTS)
    assert r.kernel.engine == "tape" and not r.p0.flags.writeable
    run = r.bind()
    before = _signatures()
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    out = run(u, r.p0, 0.0, None, np.zeros_like(u))
    assert _signatures() == before
    A, B = u[:CELLS], u[CELLS:]                 # the hand derivation (k1 = 0.3, k2 = 2)
    np.testing.assert_allclose(out, np.concatenate([-0.3 * A + 2 * B * B, 0.3 * A - 4 * B * B]), rtol=1e-14)


def test_a_bound_jacobian_first_call_compiles_nothing():
    r = RhsProgram.build(chem(cells=CELLS), options=OPTS)
    j = JacobianProgram.build(chem(cells=CELLS), options=OPTS)
    plan = j.plan(LaneSparseBlocks(), source=r)
    ws = j.new_workspace()
    run = j.bind(plan, ws)
    before = _signatures()
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    run(u, j.p0, 0.0, None, np.zeros(plan.out_size(ws.lanes)))
    assert _signatures() == before
    # and the values: eval_into into Csr against the hand Jacobian
    from esmjac.layouts import Csr
    from scipy.sparse import csr_array
    pc = j.plan(Csr(), source=r)
    o = np.zeros(pc.out_size(ws.lanes))
    j.eval_into(pc, u, j.p0, 0.0, None, o, j.new_workspace())
    J = csr_array((o, pc.indices, pc.indptr), shape=(u.size, u.size)).toarray()
    np.testing.assert_allclose(J, chem_jacobian(u, 0.3, 2.0), rtol=1e-14, atol=0)


def _forced_chem() -> dict:
    """:func:`chem` with ``k1`` a per-cell field (a forcing with a default)."""
    d = copy.deepcopy(chem(cells=CELLS))
    m = d["models"]["M"]
    m["variables"]["k1"] = {"type": "parameter", "shape": ["cell"], "default": 0.3}

    def sub(e):
        if e == "k1":
            return {"op": "index", "args": ["k1", "i"]}
        if isinstance(e, list):
            return [sub(x) for x in e]
        if isinstance(e, dict):
            return {k: sub(v) for k, v in e.items()}
        return e
    m["equations"] = sub(m["equations"])
    return d


def _module_signatures(prog) -> dict:
    mod = prog.kernel.module()
    return {n: len(f.signatures) for n, f in vars(mod).items() if hasattr(f, "signatures")}


@pytest.mark.parametrize("forced", [False, True])
def test_a_built_programs_first_call_at_the_defaults_compiles_nothing(forced):
    doc = _forced_chem() if forced else chem(cells=CELLS)
    opts = {"cache": False, "engine": "codegen"}
    r = RhsProgram.build(doc, options=opts)
    j = JacobianProgram.build(doc, options=opts)
    assert bool(r.layout.forcing) == forced and not r.p0.flags.writeable
    from esmjac.layouts import Csr
    from scipy.sparse import csr_array
    plan = j.plan(Csr(), source=r)
    before = _module_signatures(r), _module_signatures(j)
    assert sum(before[0].values()) and sum(before[1].values())      # the build compiled the chunks
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    out = r.eval_into(u, r.p0, 0.0, None, np.zeros_like(u))
    o = np.zeros(plan.out_size(CELLS))
    j.eval_into(plan, u, j.p0, 0.0, None, o, j.new_workspace())
    assert (_module_signatures(r), _module_signatures(j)) == before
    A, B = u[:CELLS], u[CELLS:]                 # the hand derivation (k1 = 0.3, k2 = 2)
    np.testing.assert_allclose(out, np.concatenate([-0.3 * A + 2 * B * B, 0.3 * A - 4 * B * B]), rtol=1e-14)
    J = csr_array((o, plan.indices, plan.indptr), shape=(u.size, u.size)).toarray()
    np.testing.assert_allclose(J, chem_jacobian(u, 0.3, 2.0), rtol=1e-14, atol=0)


def test_no_forcing_and_the_default_forcing_share_one_tape_interpreter_signature():
    """A model without forcing fields and one at its document's forcing
    defaults pass the kernels the same kind of forcing array (read-only:
    runtime.workspace.no_forcing), so the model-independent tape
    interpreter (~20 s of CPU per signature) compiles once for both."""
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    A, B = u[:CELLS], u[CELLS:]                 # the hand derivation (k1 = 0.3, k2 = 2)
    ref = np.concatenate([-0.3 * A + 2 * B * B, 0.3 * A - 4 * B * B])
    plain = RhsProgram.build(chem(cells=CELLS), options=OPTS)
    assert not plain.layout.forcing
    np.testing.assert_allclose(plain.eval_into(u, plain.p0, 0.0, None, np.zeros_like(u)), ref, rtol=1e-14)
    before = len(run_tape.signatures)
    forced = RhsProgram.build(_forced_chem(), options=OPTS)
    assert forced.kernel.engine == "tape" and forced.layout.forcing
    np.testing.assert_allclose(forced.eval_into(u, forced.p0, 0.0, None, np.zeros_like(u)), ref, rtol=1e-14)
    assert len(run_tape.signatures) == before


@pytest.mark.parametrize("forced", [False, True])
def test_a_slab_evaluated_after_direct_writes_compiles_nothing(forced):
    """Direct writes keep no band slab: ``apply`` evaluates it from the
    workspace's copy of the point, whose ``p`` and forcing are read-only
    views (JacWorkspace.keep_point), as the build's warm call passed them.
    Writable copies compiled the slab kernel a second time there."""
    doc = _forced_chem() if forced else chem(cells=CELLS)
    opts = {"cache": False, "engine": "codegen"}
    r = RhsProgram.build(doc, options=opts)
    j = JacobianProgram.build(doc, options=opts)
    plan = j.plan(LaneSparseBlocks(), source=r)
    ws = j.new_workspace()
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    j.eval_into(plan, u, j.p0, 0.0, None, np.zeros(plan.out_size(CELLS)), ws)     # direct writes
    assert ws.last_dtype is None and not ws.point[1].flags.writeable and not ws.point[3].flags.writeable
    before = _module_signatures(j)
    v = np.linspace(-1.0, 1.0, u.size)
    y = j.apply(plan, ws, v, np.zeros_like(u))
    assert _module_signatures(j) == before
    np.testing.assert_allclose(y, chem_jacobian(u, 0.3, 2.0) @ v, rtol=1e-13, atol=1e-13)
