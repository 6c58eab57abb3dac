"""Build products are immutable: every public attribute of a program, a
plan and a model layout refuses assignment, every array it holds refuses
writes, every mapping refuses item assignment — also after a pickle round
trip (the on-disk build cache)."""
from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping

import numpy as np
import pytest

from esmjac.errors import JacError
from esmjac.layouts.types import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from tests.support.programs import jac_prog, rhs_prog


def _public(obj) -> dict:
    names = [f.name for f in dataclasses.fields(obj)] if dataclasses.is_dataclass(obj) else []
    props = [n for n in dir(type(obj)) if isinstance(getattr(type(obj), n, None), property)]
    out = {n: getattr(obj, n) for n in names if not n.startswith("_")}
    for n in props:
        if not n.startswith("_"):
            try:
                out[n] = getattr(obj, n)
            except (KeyError, JacError):  # e.g. a lane plan has no CSR indptr
                pass
    return out


def _assert_frozen_value(where: str, v, seen: set) -> int:
    """Try to write through ``v``; return how many writes were refused."""
    if id(v) in seen:
        return 0
    seen.add(id(v))
    if isinstance(v, np.ndarray):
        if v.size == 0:
            assert not v.flags.writeable, where
            return 1
        with pytest.raises(ValueError, match="read-only"):
            v.flat[0] = v.flat[0]
        return 1
    n = 0
    if isinstance(v, Mapping):
        with pytest.raises(TypeError):
            v["__new__"] = 1                      # type: ignore[index]
        n += 1
        for k, x in v.items():
            n += _assert_frozen_value(f"{where}[{k!r}]", x, seen)
    elif isinstance(v, tuple):
        for i, x in enumerate(v):
            n += _assert_frozen_value(f"{where}[{i}]", x, seen)
    elif isinstance(v, list):
        pytest.fail(f"{where} is a mutable list")
    return n


def _assert_frozen(obj) -> int:
    n = 0
    for name, v in _public(obj).items():
        if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
            with pytest.raises(dataclasses.FrozenInstanceError):
                setattr(obj, name, v)
            n += 1
        n += _assert_frozen_value(f"{type(obj).__name__}.{name}", v, set())
    return n


def _products():
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    plans = [j.plan(lay, source=r) for lay in (LaneBlocks(), LaneBlocks("markowitz"),
                                               LaneSparseBlocks(), Csr(), ColumnBanded())]
    return [r, j, r.layout, j.layout, *plans]


@pytest.mark.parametrize("roundtrip", [False, True], ids=["built", "unpickled"])
def test_every_public_attribute_refuses_writes(roundtrip):
    refused = 0
    for obj in _products():
        if roundtrip:
            obj = pickle.loads(pickle.dumps(obj))
        refused += _assert_frozen(obj)
    assert refused > 100          # the walk really reached the arrays and mappings


def test_meta_arrays_and_defaults_are_read_only():
    j = jac_prog("tropo12")
    assert j.meta["r_ptr"].flags.writeable is False
    assert j.u0.flags.writeable is False and j.p0.flags.writeable is False
    with pytest.raises(TypeError):
        j.col_base["extra"] = 3                   # type: ignore[index]
    plan = j.plan(Csr())
    with pytest.raises(TypeError):
        plan.info["slots_per_lane"] = 0           # would change out_size
    assert plan.out_size(j.cells) == plan.info["nnz"] == plan.info["slots_per_lane"] * j.cells


def test_eval_into_leaves_the_plan_untouched():
    # The fused kernel lives in the workspace / a process memo, not the plan.
    j = jac_prog("tropo12")
    plan = j.plan(LaneSparseBlocks())
    before = pickle.dumps(plan)
    ws = j.new_workspace(keep_slab=False)
    out = np.empty(plan.out_size(ws.lanes))
    j.eval_into(plan, j.u0.copy(), j.p0, 0.0, None, out, ws)
    assert pickle.dumps(plan) == before
    assert ws.fused is not None and ws.fused[0] == plan.key


def test_calls_set_nothing_on_a_program_and_a_pickled_one_runs_at_new_lane_counts():
    # Per-lane-count defaults are remembered beside the program, not in it:
    # calls leave the product's attributes as they were, and a pickled
    # program (dask ships them) evaluates its default forcing at a lane
    # count it has not seen.
    import json

    from esmjac.runtime.programs import RhsProgram
    from tests.support.programs import TROPO12
    r = RhsProgram.build(json.loads(TROPO12.read_text()), options={"per_lane": ["T"]})
    before = dict(vars(r))
    u = r.u0.copy()
    a = np.empty_like(u)
    r.eval_into(u, r.p0, 0.0, None, a)
    assert vars(r).keys() == before.keys() and all(vars(r)[k] is v for k, v in before.items())
    r2 = pickle.loads(pickle.dumps(r))
    L = r.cells + 3
    u3 = r2.defaults(L)[0]
    b = np.empty_like(u3)
    r2.eval_into(u3, r2.p0, 0.0, None, b, r2.new_buffers(L))
    c = np.empty_like(u3)
    r.eval_into(u3, r.p0, 0.0, None, c, r.new_buffers(L))
    assert np.array_equal(b, c)


def test_element_names_hold_nothing_writable():
    # The names a program computes on access (rhs.names, rhs.row_names,
    # jac.row_names, element_names(L)) keep their element offsets in a
    # read-only array and their shapes and sizes in tuples: a caller cannot
    # change which name an index gets.
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    for names in (r.names, r.row_names, j.row_names, r.element_names(3)):
        before = list(names)
        refused = 0
        for slot in type(names).__slots__:
            refused += _assert_frozen_value(f"ElementNames.{slot}", getattr(names, slot), set())
        assert refused >= 1 and list(names) == before
        with pytest.raises(ValueError, match="read-only"):
            names._starts[1] = 0
