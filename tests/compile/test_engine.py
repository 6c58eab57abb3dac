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
