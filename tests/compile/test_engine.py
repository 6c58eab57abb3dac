"""The one kernel runner's build-time facts (esmjac.compile.engine).

``Kernel.reads_cells`` is decided when the kernel is generated; the oracle is
the generated artefact itself, read here and only here: a codegen module
whose source indexes the lane map (``cix[``), a tape whose instructions
include the cell-index read. Documents: a per-cell model whose rate grows
with the cell number (reads cells) and the same model without it (does not),
on both engines.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from esmjac._frozen import readonly
from esmjac.compile.engine import ENGINE_OPTIONS, NO_SLOTS, compile_doc
from esmjac.compile.evaldoc import rhs_doc
from esmjac.compile.tape import OPS
from esmjac.model.load import load_view
from tests.support.models import chem


def _index_rate(doc: dict) -> dict:
    """chem with A -> B at rate k1 * i (i: the cell number)."""
    d = copy.deepcopy(doc)
    text = repr(d["models"]["M"]["equations"])
    assert "'k1'" in text
    for eq in d["models"]["M"]["equations"]:
        eq["rhs"] = _sub(eq["rhs"])
    return d


def _sub(e):
    if e == "k1":
        return {"op": "*", "args": ["k1", "i"]}
    if isinstance(e, list):
        return [_sub(x) for x in e]
    if isinstance(e, dict):
        out = dict(e)
        if isinstance(out.get("args"), list):
            out["args"] = [_sub(x) for x in out["args"]]
        if "expr" in out:
            out["expr"] = _sub(out["expr"])
        return out
    return e


def _oracle(kern) -> bool:
    if kern.engine == "tape":
        idx = OPS.index("idx")
        return any(bool(np.any(t.code[:, 0] == idx)) for t in kern.tapes if len(t.code))
    return "cix[" in kern.source


@pytest.mark.parametrize("engine", ["codegen", "tape"])
@pytest.mark.parametrize("indexed", [False, True])
def test_reads_cells_is_known_at_generation(engine, indexed):
    doc = _index_rate(chem(cells=4)) if indexed else chem(cells=4)
    kern = compile_doc(rhs_doc(load_view(doc)), {**ENGINE_OPTIONS, "engine": engine})
    assert kern.engine == engine
    assert kern.reads_cells is indexed
    assert _oracle(kern) is indexed


def test_no_slots_is_read_only():
    assert NO_SLOTS.size == 0 and not NO_SLOTS.flags.writeable


def test_generated_chunks_take_their_inputs_in_one_flavour():
    """Numba compiles a kernel once per writability of each argument: the
    engine passes the inputs (state, fields, parameters) read-only whatever
    the caller holds, so a writable call and a read-only one share every
    compiled chunk. Oracle: the chunks' own signatures (every one with
    read-only inputs, none added by the second flavour) and the values
    (the hand-derived right-hand side of chem)."""
    kern = compile_doc(rhs_doc(load_view(chem(cells=4))), {**ENGINE_OPTIONS, "engine": "codegen"})
    u = np.array([1.0, 2.0, 0.5, 0.25, 0.5, 1.5, 2.0, 4.0])
    p = np.array([0.3, 2.0])
    k1, k2 = p
    A, B = u[:4], u[4:]
    want = np.concatenate([-k1 * A + k2 * B * B, k1 * A - 2 * k2 * B * B])
    h, cix = np.zeros(max(kern.n_hoist, 1)), np.zeros(1, np.int64)
    fns = [fn for fn, _ in kern.chunk_calls(serial=True)] + [kern.module().prologue]
    # Tiled chunks run the package's tile loops, shared by every model: other
    # tests in this process may have compiled flavours of their own, so only
    # the signatures these calls add are this engine's.
    before = [set(fn.signatures) for fn in fns]
    for args in ((u, p, np.zeros(1)), (readonly(u), readonly(p), readonly(np.zeros(1)))):
        out = np.full(8, np.nan)
        kern.run(args[0], args[1], 0.0, args[2], out, h, cix, 4, True)
        np.testing.assert_allclose(out, want, rtol=1e-15)
        if args[0].flags.writeable:
            n = [len(fn.signatures) for fn in fns]
    assert [len(fn.signatures) for fn in fns] == n
    added = [set(fn.signatures) - b for fn, b in zip(fns, before)]
    for new in added[:-1]:              # chunks: (u, f, h, cix, out, L)
        assert all(not s[0].mutable and not s[1].mutable for s in new), new
    assert all(not s[0].mutable for s in added[-1])                   # prologue(p, t, h)
