"""Quotients and log10 as the lowering emits them (compile/ssa.py
``Block.emit``): ``a / d`` over a computed ``d`` is ``a · (1/d)`` with one
reciprocal per divisor, ``log10(x)`` is ``ln(x) · (1/ln 10)``; a literal
divisor stays a division. Both engines lower through the same block, so they
agree bit for bit; values against NumPy's own quotients and log10 (a hand
evaluation) within a few ulp."""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.compile.tape import OPS
from esmjac.models.mechanism import lift
from esmjac.runtime.programs import RhsProgram


def _doc() -> dict:
    # D(A) = -(300/T)·A/B,  D(B) = A/T - B/7,  D(C) = log10(T)·C
    T = "T"
    eqs = [("A", {"op": "neg", "args": [{"op": "/", "args": [{"op": "*", "args": [
               {"op": "/", "args": [300.0, T]}, "A"]}, "B"]}]}),
           ("B", {"op": "-", "args": [{"op": "/", "args": ["A", T]}, {"op": "/", "args": ["B", 7.0]}]}),
           ("C", {"op": "*", "args": [{"op": "log10", "args": [T]}, "C"]})]
    var = {s: {"type": "unknown", "default": 1.0} for s in ("A", "B", "C")}
    var["T"] = {"type": "parameter", "default": 280.0}
    return {"esm": "1.1.0", "metadata": {"name": "Quot", "authors": ["esmjac"]},
            "models": {"Quot": {"variables": var, "equations": [
                {"lhs": {"op": "D", "args": [s], "wrt": "t"}, "rhs": e} for s, e in eqs]}}}


@pytest.fixture(scope="module")
def progs():
    L = 37
    doc = lift(_doc(), L, cell_parameters=["T"])
    return L, {e: RhsProgram.build(doc, options={"engine": e, "progress": False, "cache": False})
               for e in ("tape", "codegen")}


def test_one_reciprocal_per_divisor_and_log10_as_log(progs):
    _, ps = progs
    code = ps["tape"].kernel.tapes[1].code
    ops = [OPS[o] for o in code[:, 0]]
    # 1/T (shared by 300/T and A/T), 1/B and B/7 (a literal divisor stays a division)
    assert ops.count("/") == 3, ps["tape"].kernel.listing()
    assert ops.count("log10") == 0 and ops.count("log") == 1
    assert "math.log10" not in ps["codegen"].kernel.listing()      # (the prologue module included)


def test_values_against_numpy_and_engines_bit_for_bit(progs):
    L, ps = progs
    rng = np.random.default_rng(4)
    r = ps["tape"]
    u = rng.uniform(0.5, 2.0, r.u_size(L))
    f = rng.uniform(200.0, 320.0, r.f_size(L))
    out = {e: p.eval_into(u, p.p0, 0.0, f, np.empty_like(u)) for e, p in ps.items()}
    assert np.array_equal(out["tape"], out["codegen"])
    A, B, C = u.reshape(3, L)
    want = np.array([-(300.0 / f) * A / B, A / f - B / 7.0, np.log10(f) * C])
    # each quotient and the log10 within a few ulp of NumPy's correctly rounded ones
    np.testing.assert_allclose(out["tape"].reshape(3, L), want, rtol=1e-15, atol=0)
