"""A tiled plan's tape stores its slots in increasing slot order
(compile/tape.py ``in_store_order``, applied by ``retarget``): the same
instructions on the same operands in another topological order, so the same
bits, with each tile's block written front to back."""
from __future__ import annotations

import json

import numpy as np

from esmjac.compile.engine import NO_SLOTS, run_tapes
from esmjac.compile.tape import OPS, Tape, in_store_order, retarget, run_tape
from esmjac.compile.twins import serial_twin
from esmjac._frozen import ro
from esmjac.layouts import LaneSparseBlocks
from esmjac.models.mechanism import box
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from tests.support.programs import TROPO12

_O = {o: i for i, o in enumerate(OPS)}


def _hand_tape() -> Tape:
    """out[3] = u0*u1, out[0] = u0*u1 + 2, out[2] = u1/u0 - u0, out[1] = u0*u1
    (four stores out of target order, one value stored twice, a shared product)."""
    rows = [(_O["lane_u"], 0, 0, -1, -1), (_O["lane_u"], 1, 1, -1, -1),
            (_O["*"], 2, 0, 1, -1), (_O["store"], 2, 3, -1, -1),
            (_O["const"], 3, 0, -1, -1), (_O["+"], 3, 2, 3, -1), (_O["store"], 3, 0, -1, -1),
            (_O["/"], 4, 1, 0, -1), (_O["-"], 4, 4, 0, -1), (_O["store"], 4, 2, -1, -1),
            (_O["store"], 2, 1, -1, -1)]
    return Tape(np.array(rows, np.int64), np.array([2.0]), 5)


def _run(tape: Tape, u: np.ndarray, L: int, nout: int) -> np.ndarray:
    out = np.full(nout * L, np.nan)
    h = np.zeros(1)
    # the serial twin and read-only inputs: the flavour the package compiles
    bad = serial_twin(run_tape)(ro(tape.code), ro(tape.consts), ro(u), ro(np.zeros(1)), ro(np.zeros(1)), 0.0, h,
                                np.zeros(1, np.int64), out, L, tape.nreg, 0, 0, L, NO_SLOTS)
    assert bad == 0
    return out


def _targets(code: np.ndarray) -> np.ndarray:
    return code[code[:, 0] == _O["store"], 2]


def test_hand_tape_in_store_order_computes_the_hand_values():
    t = _hand_tape()
    code, nreg = in_store_order(t.code)
    assert list(_targets(code)) == [0, 1, 2, 3]
    # every instruction but none extra: the same count of each opcode
    assert sorted(code[:, 0].tolist()) == sorted(t.code[:, 0].tolist())
    L = 300                                   # two chunks of run_tape, the second partial
    rng = np.random.default_rng(3)
    u = rng.uniform(0.1, 2.0, 2 * L)
    got = _run(Tape(code, t.consts, nreg), u, L, 4).reshape(4, L)
    a, b = u[:L], u[L:]
    # oracle: the formulas by hand in NumPy (one correctly rounded operation each, as the tape)
    assert np.array_equal(got[3], a * b) and np.array_equal(got[1], a * b)
    assert np.array_equal(got[0], a * b + 2.0)
    assert np.array_equal(got[2], b / a - a)
    assert np.array_equal(got, _run(t, u, L, 4).reshape(4, L))


def test_a_tape_with_an_unknown_or_no_store_is_left_alone():
    prologue = Tape(np.array([(_O["const"], 0, 0, -1, -1), (_O["storeh"], 0, 0, -1, -1)], np.int64),
                    np.ones(1), 1)
    assert in_store_order(prologue.code) is None
    assert in_store_order(np.array([(_O["const"], 0, 0, -1, -1)], np.int64)) is None


def test_retargeted_tape_stores_in_slot_order_with_the_same_bits():
    # tropo12 as a box on the tape engine, tiled LaneSparseBlocks: the
    # direct-write body (retargeted) against the program's own body tape into
    # the band slab, gathered into the plan's slots by the plan's scatter
    # (itself checked against the reference assembly in tests/layouts)
    d = box(json.loads(TROPO12.read_text()))
    r = RhsProgram.build(d, options={"engine": "tape"})
    j = JacobianProgram.build(d, options={"engine": "tape"})
    plan = j.plan(LaneSparseBlocks(), source=r)
    ft = j.direct_tape(plan)
    tg = _targets(ft.body.code)
    assert tg.size > 1 and np.all(np.diff(tg) >= 0)
    assert not np.all(np.diff(_targets(j.kernel.tapes[1].code)) >= 0)  # the SSA order was not
    again = retarget(j.kernel.tapes[1], plan.arrays["fa"])
    assert np.array_equal(again.code, ft.body.code)
    rng = np.random.default_rng(5)
    for lanes in (7, 40):
        u0, p0, _ = r.defaults(lanes)
        u = u0 * rng.uniform(0.5, 1.5, u0.size)
        ref = np.full(plan.out_size(lanes), np.nan)
        j.eval_into(plan, u, p0, 0.0, None, ref, j.new_workspace(lanes, keep_slab=True))
        got = np.full(plan.out_size(lanes), np.nan)
        h = np.zeros(max(j.kernel.n_hoist, 1))
        W, P, C = plan.tile_width(lanes), int(plan.info["slots_per_lane"]), plan.capacity(lanes)
        run_tapes(serial_twin(run_tape), (ft.prologue, ft.body), u, np.zeros(1), p0, 0.0, h, np.zeros(1, np.int64), got,
                  lanes, W, P, C, ft.zero_slots)
        assert np.isfinite(ref).all() and np.array_equal(got, ref), lanes
