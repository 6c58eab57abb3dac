"""Every public entry point raises only ``JacError`` (issue #21 item 7):
division by zero in a kernel, a lone-surrogate name, a non-finite default,
negative lane counts, an advance over no time."""
from __future__ import annotations

import json

import numpy as np
import pytest

from esmjac.errors import JacError
from tests.support.models import chem


def _inverse_doc() -> dict:
    """D(A) = A^-1 per cell (at A = 0: inf, which numpy-model arithmetic
    gives for 1/0; Numba's integer power raised ZeroDivisionError)."""
    d = chem(cells=2)
    d["models"]["M"]["equations"][0]["rhs"]["expr"] = {"op": "^", "args": [{"op": "index", "args": ["A", "i"]}, -1]}
    return d


def test_a_negative_integer_power_of_zero_is_a_typed_error_and_elsewhere_exact():
    from esmjac.runtime.programs import RhsProgram
    r = RhsProgram.build(_inverse_doc())
    u = np.array([0.5, 4.0, 1.0, 1.0])                # A = (0.5, 4), B = (1, 1)
    out = np.zeros(4)
    r.eval_into(u, r.p0, 0.0, None, out)
    assert out[0] == 2.0 and out[1] == 0.25           # 1/A, exactly
    u[0] = 0.0
    with pytest.raises(JacError) as ei:
        r.eval_into(u, r.p0, 0.0, None, out)
    assert ei.value.code == "evaluation_error"


def test_a_lone_surrogate_name_is_invalid_document():
    from esmjac.model.load import load_view
    d = json.loads(json.dumps(chem()).replace('"A"', '"A\\ud800"'))
    with pytest.raises(JacError) as ei:
        load_view(d)
    assert ei.value.code == "invalid_document" and "surrogate" in str(ei.value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_a_non_finite_default_is_refused(value):
    from esmjac.model.load import load_view
    d = chem()
    d["models"]["M"]["variables"]["k1"]["default"] = value
    with pytest.raises(JacError) as ei:
        load_view(d)
    assert ei.value.code in ("invalid_document", "load_error")


def test_a_default_written_1e999_is_refused():
    from esmjac.model.load import load_view
    text = json.dumps(chem()).replace('"default": 0.3', '"default": 1e999')
    with pytest.raises(JacError) as ei:
        load_view(text)
    assert ei.value.code == "invalid_document" and "non-finite" in str(ei.value)


@pytest.fixture(scope="module")
def jac():
    from esmjac.runtime.programs import JacobianProgram
    return JacobianProgram.build(chem(cells=2))


@pytest.mark.parametrize("n", [-1, 0, 1.5, True, "2"])
def test_sizes_of_bad_lane_counts_are_refused(jac, n):
    from esmjac.layouts import Csr, LaneBlocks
    for call in (jac.u_size, jac.f_size, jac.plan(Csr()).out_size, jac.plan(LaneBlocks()).out_size):
        with pytest.raises(JacError) as ei:
            call(n)
        assert ei.value.code == "bad_argument"
    assert jac.u_size(3) == 6


@pytest.mark.slow
@pytest.mark.parametrize("dt", [0.0, -1.0])
def test_advance_over_no_time_is_refused_clearly(dt):
    from esmjac.adapters.native import rosenbrock
    leaf = rosenbrock(chem(cells=2), rtol=1e-6, threads=1)
    u = leaf.initial_state().copy()
    assert leaf.advance(u, 0.0, 1.0).success
    with pytest.raises(JacError) as ei:
        leaf.advance(u, 1.0, dt)
    assert ei.value.code == "bad_argument" and "dt" in str(ei.value)
