"""Two code-size choices of the lowering and the chunker (issue #25 item 4:
the RHS against the hand-rolled one on SuperFast).

* A reaction's term ``k(T)·A·B`` is one chain of products whatever order
  each equation writes its factors in (the rate constant depends on the
  cell's temperature, so it is not hoisted): the tape of ``D(A) = -k·A·B``,
  ``D(B) = -B·k·A``, ``D(C) = A·B·k`` multiplies ``k·A·B`` once.
* A chunk absorbs a short tail of outputs (up to ``TAIL_SLACK`` × the cap)
  instead of starting a chunk that recomputes what they share.

Values against a NumPy evaluation of the same formulas (a hand derivation).
"""
from __future__ import annotations

import numpy as np

from esmjac.compile.codegen import TAIL_SLACK
from esmjac.models.mechanism import lift
from esmjac.runtime.programs import RhsProgram


def _box(n_extra: int = 0) -> dict:
    k = {"op": "*", "args": [2.5, {"op": "exp", "args": [{"op": "/", "args": [300.0, "T"]}]}]}
    eqs = [("A", {"op": "neg", "args": [{"op": "*", "args": [k, "A", "B"]}]}),
           ("B", {"op": "neg", "args": [{"op": "*", "args": ["B", k, "A"]}]}),
           ("C", {"op": "*", "args": ["A", "B", k]})]
    var = {s: {"type": "unknown", "default": 1.0} for s in ("A", "B", "C")}
    for i in range(n_extra):        # independent decays: a chunk's worth of statements each
        var[f"X{i}"] = {"type": "unknown", "default": 1.0}
        eqs.append((f"X{i}", {"op": "*", "args": [-1e-3, {"op": "exp", "args": [{"op": "/", "args": [
            float(100 + i), "T"]}]}, f"X{i}"]}))
    var["T"] = {"type": "parameter", "default": 280.0}
    return {"esm": "1.1.0", "metadata": {"name": "Prod", "authors": ["esmjac"]},
            "models": {"Prod": {"variables": var, "equations": [
                {"lhs": {"op": "D", "args": [s], "wrt": "t"}, "rhs": e} for s, e in eqs]}}}


def _point(r, L, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.5, 2.0, r.u_size(L))
    f = rng.uniform(250.0, 310.0, r.f_size(L))
    f.setflags(write=False)     # as the build's warm call passes it: no second specialization to compile
    return np.ascontiguousarray(u), f


def test_a_reactions_product_is_computed_once_whatever_the_factor_order():
    L = 5
    r = RhsProgram.build(lift(_box(), L, cell_parameters=["T"]), options={"engine": "tape", "progress": False})
    code = r.kernel.tapes[1].code
    from esmjac.compile.tape import OPS
    muls = int(np.sum(code[:, 0] == OPS.index("*")))
    # k = 2.5·exp(300/T): 300·(1/T) (a quotient is a product by the shared
    # reciprocal, compile/ssa.py) and one product (2.5 hoisted with it or
    # folded), then k·A·B: two — not 2 per equation
    assert muls <= 4, r.kernel.listing()
    u, f = _point(r, L)
    out = np.empty_like(u)
    r.eval_into(u, r.p0, 0.0, f, out)
    A, B = u.reshape(3, L)[0], u.reshape(3, L)[1]
    rate = 2.5 * np.exp(300.0 / f) * A * B
    np.testing.assert_allclose(out.reshape(3, L), [-rate, -rate, rate], rtol=1e-14)


def test_a_short_tail_joins_the_chunk_and_a_long_one_does_not():
    L = 4
    for n_extra, cap in ((1, 14), (3, 14)):      # 16 statements in 1 chunk; 30 in 3
        doc = lift(_box(n_extra), L, cell_parameters=["T"])
        r = RhsProgram.build(doc, options={"engine": "codegen", "max_stmts": cap, "progress": False})
        n = r.kernel.n_statements
        if n_extra == 1:
            assert len(r.kernel.chunks) == 1       # the tail fits within TAIL_SLACK × cap
        else:
            assert len(r.kernel.chunks) >= 2 and n > TAIL_SLACK * cap
        u, f = _point(r, L, seed=n_extra)
        out = np.empty_like(u)
        r.eval_into(u, r.p0, 0.0, f, out)
        U = u.reshape(-1, L)
        rate = 2.5 * np.exp(300.0 / f) * U[0] * U[1]
        want = [-rate, -rate, rate] + [-1e-3 * np.exp((100.0 + i) / f) * U[3 + i] for i in range(n_extra)]
        np.testing.assert_allclose(out.reshape(-1, L), want, rtol=1e-14)
