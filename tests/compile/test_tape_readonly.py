"""Tapes are read-only build products from construction on, so a fresh tape
and one loaded from the cache (checked, read-only) reach the interpreter
with one Numba signature (compile/tape.py ``Tape``)."""
from __future__ import annotations

import numpy as np
import pytest

from esmjac.compile.tape import Tape, retarget
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from tests.support.models import chem


@pytest.mark.parametrize("build", [RhsProgram.build, JacobianProgram.build])
def test_a_fresh_tape_is_read_only(build):
    prog = build(chem(), options={"cache": False, "engine": "tape"})
    assert prog.kernel.engine == "tape"
    for t in prog.kernel.tapes:
        assert not t.code.flags.writeable and not t.consts.flags.writeable
        with pytest.raises(ValueError):
            t.code[0, 0] = 0


def test_retargeted_and_hand_made_tapes_are_read_only():
    code = np.zeros((1, 5), np.int64)
    t = Tape(code, np.ones(1), 1)
    assert not t.code.flags.writeable and not t.consts.flags.writeable
    r = retarget(t, [0])
    assert r is not None and not r.code.flags.writeable
