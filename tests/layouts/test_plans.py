"""Scatter plans and the products: apply / apply_transpose against the
assembled matrix, contract against finite differences of apply_transpose,
determinism (threads, lane order, padding, Python threads), refusals and
bad input (each rejected in Python before compiled code runs)."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from scipy.sparse import csr_array

from tests.support.programs import TROPO12, close, jac_prog, point, rhs_prog

from esmjac import JacError
from esmjac.layouts import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from esmjac.layouts.types import tile_capacity, tile_index, tile_width, untile
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from esmjac.runtime.threads import numba_threads

PRODUCT_FX = ["tropo12", "bd_chem", "adv_react_2d", "contracted_ops", "flux_form_adv"]


def csr_at(fx, u, wrt="states"):
    j, r = jac_prog(fx, wrt), rhs_prog(fx)
    plan = j.plan(Csr(), source=r)
    ws = j.new_workspace(keep_slab=True)
    out = np.zeros(plan.out_size(ws.lanes))
    j.eval_into(plan, u, r.p0, 0.0, None, out, ws)
    return j, plan, ws, csr_array((out, plan.indices, plan.indptr), shape=tuple(plan.info["shape"]))


@pytest.mark.parametrize("fx", PRODUCT_FX)
def test_apply_and_transpose_match_the_matrix(fx):
    r = rhs_prog(fx)
    u = point(r, 4)
    j, plan, ws, M = csr_at(fx, u)
    rng = np.random.default_rng(1)
    v = rng.standard_normal(j.col_size(ws.lanes))
    y0 = rng.standard_normal(j.u_size(ws.lanes))
    y = y0.copy()
    j.apply(plan, ws, v, y)
    assert close(y - y0, M @ v, 1e-13)
    lam = rng.standard_normal(j.u_size(ws.lanes))
    g = np.zeros(j.col_size(ws.lanes))
    j.apply_transpose(plan, ws, lam, g)
    assert close(g, M.T @ lam, 1e-13)


def test_apply_transpose_accumulates_in_float64_for_float32_storage():
    r = rhs_prog("tropo12")
    j = jac_prog("tropo12")
    plan = j.plan(LaneBlocks(), source=r)
    ws = j.new_workspace(keep_slab=True)
    out = np.zeros(plan.out_size(ws.lanes), np.float32)
    j.eval_into(plan, point(r, 0).astype(np.float32), r.p0, 0.0, None, out, ws)
    lam = np.ones(j.u_size(ws.lanes), np.float32)
    with pytest.raises(JacError):
        j.apply_transpose(plan, ws, lam, np.zeros(j.col_size(ws.lanes), np.float32))
    g = np.zeros(j.col_size(ws.lanes))
    j.apply_transpose(plan, ws, lam, g)
    assert g.dtype == np.float64 and np.all(np.isfinite(g))


def test_parameter_columns_apply_transpose():
    """Scalar (global) and per-cell (lane) columns together: wrt parameters."""
    r = rhs_prog("tropo12")
    u = point(r, 2)
    j, plan, ws, M = csr_at("tropo12", u, "parameters")
    # apply works in the lane column layout: lane columns first, then scalars
    lam = np.random.default_rng(3).standard_normal(j.u_size(ws.lanes))
    g = np.zeros(j.col_size(ws.lanes))
    j.apply_transpose(plan, ws, lam, g)
    ref = M.T @ lam
    m = j.meta
    N = ws.lanes
    for i, var in enumerate(m["lane_vars"]):
        b = j.col_base[var]
        assert close(g[i * N:(i + 1) * N], ref[b:b + N], 1e-13)
    for i, var in enumerate(m["glob_vars"]):
        assert close(g[m["n_lane_cols"] * N + i:m["n_lane_cols"] * N + i + 1],
                     ref[j.col_base[var]:j.col_base[var] + 1], 1e-13)


@pytest.mark.parametrize("fx", ["tropo12", "bd_chem", "adv_react_2d", "flux_form_adv"])
def test_contract_matches_finite_differences_of_apply_transpose(fx):
    r = rhs_prog(fx)
    j = jac_prog(fx)
    plan = j.plan(Csr(), source=r)
    u = point(r, 5)
    rng = np.random.default_rng(2)
    lam = rng.standard_normal(u.size)
    v = rng.standard_normal(u.size) * np.abs(u)

    def jt(x):
        ws = j.new_workspace(keep_slab=True)
        o = np.zeros(plan.out_size(ws.lanes))
        j.eval_into(plan, x, r.p0, 0.0, None, o, ws)
        g = np.zeros(u.size)
        j.apply_transpose(plan, ws, lam, g)
        return g

    ws2 = j.new_workspace()
    o = np.zeros(plan.out_size(ws2.lanes))
    j.eval_into(plan, u, r.p0, 0.0, None, o, ws2)
    out = np.zeros(u.size)
    # tropo12 on one numba thread (the second-order kernel's serial twin):
    # its parallel lane chunk is one parfor compile of ~30 s, the same
    # generated code as the smaller models', whose contraction runs on the
    # parallel chunks here
    with numba_threads(1 if fx == "tropo12" else None):
        j.contract(plan, ws2, lam, v, out)
    eps = 1e-4      # central differences: truncation O(eps²), round-off ~1e-16/eps
    fd = (jt(u + eps * v) - jt(u - eps * v)) / (2 * eps)
    scale = np.max(np.abs(fd)) + 1e-300
    assert np.max(np.abs(out - fd)) <= 1e-6 * scale, np.max(np.abs(out - fd)) / scale


# ------------------------------------------------------------------ determinism

def _lane_eval(j, r, lay, u_lanes, f_lanes, L, order=None, keep_slab=False, dtype=np.float64):
    """[slot, lane] values of one eval_into (the tile permutation undone)."""
    plan = j.plan(lay, source=r)
    ws = j.new_workspace(L, keep_slab=keep_slab)
    if order is not None:
        ws.set_lane_order(order, j.layout.cell_shape)
    out = np.full(plan.out_size(L), np.nan, dtype)
    f = f_lanes.astype(dtype)
    # float64 forcing read-only, as a call with the document's default passes
    # it: the specialization the build compiled (Numba compiles one per
    # writability: ~16 s of CPU per tropo12 Jacobian chunk)
    f.setflags(write=dtype != np.float64)
    j.eval_into(plan, u_lanes.astype(dtype), r.p0, 0.0, f, out, ws)
    P = int(plan.info["slots_per_lane"])
    W = plan.tile_width(L)
    cap = plan.capacity(L)
    full = untile(out, P, cap, W)
    # padding lanes (capacity past L) hold copies of the last lane
    assert np.array_equal(full[:, L:], np.repeat(full[:, L - 1:L], cap - L, axis=1))
    return full[:, :L].ravel()


@pytest.mark.parametrize("lay", [LaneBlocks(), LaneBlocks("markowitz"), LaneSparseBlocks(),
                                 LaneSparseBlocks(tile=4), LaneBlocks(tile=None)])
def test_shuffled_lanes_and_padding_are_bitwise_identical(lay):
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    N, n = j.cells, j.n_species
    u = point(r, 9)
    f = r.forcing0 * np.random.default_rng(1).uniform(0.5, 1.5, r.forcing0.size)
    nf = f.size // N

    def lanes_of(x, k, idx):
        return np.ascontiguousarray(x.reshape(k, N)[:, idx]).ravel()

    base = _lane_eval(j, r, lay, u, f, N).reshape(-1, N)
    perm = np.random.default_rng(0).permutation(N)
    shuf = _lane_eval(j, r, lay, lanes_of(u, n, perm), lanes_of(f, nf, perm), N, perm).reshape(-1, N)
    assert np.array_equal(shuf, base[:, perm])
    P = N + 5                                   # padding lanes duplicate the last cell
    pidx = np.minimum(np.arange(P), N - 1)
    pad = _lane_eval(j, r, lay, lanes_of(u, n, pidx), lanes_of(f, nf, pidx), P).reshape(-1, P)
    assert np.array_equal(pad[:, :N], base)
    assert np.array_equal(pad[:, N:], np.repeat(base[:, -1:], 5, axis=1))


def test_python_threads_sharing_one_program():
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    plan = j.plan(LaneSparseBlocks(), source=r)
    pts = [point(r, s) for s in range(8)]

    def work(u):
        ws = j.new_workspace()
        out = np.zeros(plan.out_size(ws.lanes))
        for _ in range(20):
            j.eval_into(plan, u, r.p0, 0.0, None, out, ws)
        return out.copy()

    serial = [work(u) for u in pts]
    with ThreadPoolExecutor(4) as ex:
        threaded = list(ex.map(work, pts))
    for a, b in zip(serial, threaded):
        assert np.array_equal(a, b)


_THREADS_SCRIPT = r"""
import sys, json, hashlib, numpy as np, numba
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from esmjac.layouts import LaneBlocks, Csr, LaneSparseBlocks
doc = json.load(open(sys.argv[2]))
r = RhsProgram.build(doc); j = JacobianProgram.build(doc)
u = r.u0 * np.random.default_rng(0).uniform(0.5, 1.5, r.u0.size)
res = {}
for n in (1, 2, 7, 16):
    numba.set_num_threads(n)
    hs = []
    for lay in (LaneBlocks(), LaneSparseBlocks(), Csr()):
        plan = j.plan(lay, source=r); ws = j.new_workspace(keep_slab=True)
        out = np.zeros(plan.out_size(ws.lanes)); j.eval_into(plan, u, r.p0, 0.0, None, out, ws)
        g = np.zeros(j.col_size(ws.lanes)); j.apply_transpose(plan, ws, u, g)
        direct = np.zeros_like(out); j.eval_into(plan, u, r.p0, 0.0, None, direct, j.new_workspace())
        assert np.array_equal(direct, out)
        hs.append(hashlib.sha256(out.tobytes() + g.tobytes()).hexdigest())
    f = np.empty_like(u); r.eval_into(u, r.p0, 0.0, None, f)
    hs.append(hashlib.sha256(f.tobytes()).hexdigest())
    res[n] = hs
print(json.dumps(res))
"""


@pytest.mark.slow
def test_bitwise_identical_for_1_2_7_16_threads(tmp_path):
    """The parallel kernels (RHS, Jacobian slab and direct writes, the
    scatter and apply_transpose) over 3,000 cells — six work items of the
    lane chunks — give the same bits on 1, 2, 7 and 16 threads. The model
    is the Chapman cycle with a per-cell photolysis rate (a forcing field
    read per lane): what is checked is the partition of lanes among
    threads, which does not depend on the model, and its parallel kernels
    compile in seconds where tropo12's took over a minute of CPU."""
    from tests.support.models import chapman
    from esmjac.models.mechanism import box, lift
    doc = tmp_path / "chapman3000.esm"
    doc.write_text(json.dumps(lift(box(chapman(cells=1)), 3000, cell_parameters=["j_O3"])))
    env = dict(os.environ, NUMBA_NUM_THREADS="16")
    p = subprocess.run([sys.executable, "-c", _THREADS_SCRIPT, "-", str(doc)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(res) == 4
    first = res["1"]
    for n, hs in res.items():
        assert hs == first, n


# ------------------------------------------------------------------ refusals

def test_laneblocks_refuse_a_stencil():
    with pytest.raises(JacError) as e:
        jac_prog("adv_interior").plan(LaneBlocks())
    assert e.value.code == "nonuniform_pattern"
    with pytest.raises(JacError) as e:
        jac_prog("adv_interior").plan(LaneSparseBlocks())
    assert e.value.code == "nonuniform_pattern"


def test_foreign_source_and_foreign_plan():
    import copy
    r8, j8 = rhs_prog("tropo12"), jac_prog("tropo12")
    doc = json.loads(TROPO12.read_text())
    doc16 = copy.deepcopy(doc)
    doc16["index_sets"]["cell"]["size"] = 16
    r16 = RhsProgram.build(doc16)
    with pytest.raises(JacError) as e:
        j8.plan(Csr(), source=r16)
    assert e.value.code == "foreign_layout"
    with pytest.raises(JacError) as e:
        j8.plan(Csr(), source=rhs_prog("bd_chem"))
    assert e.value.code == "unresolvable_column"
    j16 = JacobianProgram.build(doc16)
    plan16 = j16.plan(Csr(), source=r16)
    ws = j8.new_workspace()
    with pytest.raises(JacError) as e:
        j8.eval_into(plan16, point(r8, 0), r8.p0, 0.0, None, np.zeros(plan16.out_size(16)), ws)
    assert e.value.code == "foreign_layout"
    with pytest.raises(JacError) as e:
        j8.eval_into(j8.plan(Csr()), point(r8, 0), r8.p0, 0.0, None,
                     np.zeros(j8.plan(Csr()).out_size(8)), j16.new_workspace())
    assert e.value.code == "bad_argument" and "another" in str(e.value)


def test_empty_bands_gate_still_applies_to_programs(tmp_path):
    doc = {"esm": "1.1.0", "metadata": {"name": "flat"}, "index_sets": {"c": {"kind": "interval", "size": 3}},
           "models": {"M": {"variables": {"A": {"type": "unknown", "shape": ["c"], "default": 1.0},
                                          "k": {"type": "parameter", "default": 2.0}},
                            "equations": [{"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                                           "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                                   "ranges": {"i": {"from": "c"}}, "expr": "k"}}]}}}
    with pytest.raises(JacError) as e:
        JacobianProgram.build(doc)
    assert e.value.code == "empty_bands"


def test_plans_pickle_and_serialize():
    j, r = jac_prog("tropo12"), rhs_prog("tropo12")
    for lay in (LaneBlocks(), LaneSparseBlocks(), Csr(), ColumnBanded()):
        plan = j.plan(lay, source=r)
        again = pickle.loads(pickle.dumps(plan))
        assert again.to_json() == plan.to_json()
        json.loads(plan.to_json())
        u = point(r, 0)
        ws = j.new_workspace()
        a = np.zeros(plan.out_size(ws.lanes))
        b = np.zeros(plan.out_size(ws.lanes))
        j.eval_into(plan, u, r.p0, 0.0, None, a, ws)
        j.eval_into(again, u, r.p0, 0.0, None, b, ws)
        assert np.array_equal(a, b)
    assert plan.arrays["ptr"].flags.writeable is False


# ------------------------------------------------------------------ bad input

@pytest.fixture(scope="module")
def setup():
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    plan = j.plan(LaneBlocks(), source=r)
    ws = j.new_workspace()
    u = point(r, 0)
    out = np.zeros(plan.out_size(ws.lanes))
    return r, j, plan, ws, u, out


@pytest.mark.parametrize("case", ["short_u", "u_2d", "u_int", "u_strided", "out_short", "out_dtype",
                                  "mixed_dtype", "p_short", "forcing_short", "not_array", "ws_type",
                                  "plan_type", "readonly_out"])
def test_bad_arguments_are_rejected_in_python(setup, case):
    r, j, plan, ws, u, out = setup
    args = dict(plan=plan, u=u, p=r.p0, t=0.0, forcing=None, out=out, ws=ws)
    if case == "short_u":
        args["u"] = u[:-1].copy()
    elif case == "u_2d":
        args["u"] = u.reshape(j.n_species, -1)
    elif case == "u_int":
        args["u"] = u.astype(np.int64)
    elif case == "u_strided":
        args["u"] = np.repeat(u, 2)[::2]
    elif case == "out_short":
        args["out"] = out[:-3].copy()
    elif case == "out_dtype":
        args["out"] = out.astype(np.float32)
    elif case == "mixed_dtype":
        args["u"] = u.astype(np.float32)
    elif case == "p_short":
        args["p"] = r.p0[:-1]
    elif case == "forcing_short":
        args["forcing"] = np.ones(3)
    elif case == "not_array":
        args["u"] = list(u)
    elif case == "ws_type":
        args["ws"] = object()
    elif case == "plan_type":
        args["plan"] = "csr"
    elif case == "readonly_out":
        o = out.copy()
        o.setflags(write=False)
        args["out"] = o
    with pytest.raises(JacError) as e:
        j.eval_into(args["plan"], args["u"], args["p"], args["t"], args["forcing"], args["out"], args["ws"])
    assert e.value.code == "bad_argument"


def test_apply_before_eval_and_wrong_vectors():
    r, j = rhs_prog("bd_chem"), jac_prog("bd_chem")
    plan = j.plan(Csr(), source=r)
    ws = j.new_workspace(keep_slab=True)
    with pytest.raises(JacError) as e:
        j.apply(plan, ws, np.zeros(j.col_size(ws.lanes)), np.zeros(j.u_size(ws.lanes)))
    assert "eval_into first" in str(e.value)
    out = np.zeros(plan.out_size(ws.lanes))
    j.eval_into(plan, point(r, 0), r.p0, 0.0, None, out, ws)
    with pytest.raises(JacError):
        j.apply(plan, ws, np.zeros(j.col_size(ws.lanes) + 1), np.zeros(j.u_size(ws.lanes)))


def test_nan_from_finite_inputs_is_reported():
    doc = {"esm": "1.1.0", "metadata": {"name": "logmodel"},
           "index_sets": {"c": {"kind": "interval", "size": 4}},
           "models": {"M": {"variables": {"A": {"type": "unknown", "shape": ["c"], "default": 1.0}},
                            "equations": [{"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                                           "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                                   "ranges": {"i": {"from": "c"}},
                                                   "expr": {"op": "log", "args": [{"op": "index", "args": ["A", "i"]}]}}}]}}}
    j = JacobianProgram.build(doc)
    for lay in (Csr(), LaneSparseBlocks(), LaneBlocks(tile=3)):   # lane loop, tiles (counted while stored)
        plan = j.plan(lay)
        ws = j.new_workspace()
        out = np.zeros(plan.out_size(ws.lanes))
        u = np.array([1.0, 2.0, 0.0, 3.0])
        with pytest.raises(JacError) as e:
            j.eval_into(plan, u, np.zeros(0), 0.0, None, out, ws)
        pos = 2 if isinstance(lay, Csr) else tile_index(0, 2, 1, plan.tile_width(4))
        assert e.value.code == "evaluation_error" and f"position {pos}" in str(e.value), lay
        u[2] = np.nan                     # non-finite in: passed through, not an error
        j.eval_into(plan, u, np.zeros(0), 0.0, None, out, ws)
        assert np.isnan(out[pos]) and out[0] == 1.0


@pytest.mark.parametrize("fx", ["tropo12", "bd_chem"])
def test_fused_lane_kernels_equal_the_slab_path_bitwise(fx):
    r, j = rhs_prog(fx), jac_prog(fx)
    u = point(r, 6)
    # float32 on one layout per kernel family (dense and sparse lane
    # blocks), on bd_chem: each (layout, dtype) is a kernel compile of its
    # own, the same generated code for every model, and tropo12's float32
    # twins cost ~14 s of cold compile for no code path of their own
    # (tropo12 in float32: the float32 tests of test_programs and above)
    f32 = (np.float32,) if fx != "tropo12" else ()
    for lay, dtypes in ((LaneBlocks(), (np.float64,)), (LaneBlocks("markowitz"), (np.float64, *f32)),
                        (LaneSparseBlocks(), (np.float64, *f32)), (Csr(), (np.float64,))):
        plan = j.plan(lay, source=r)
        for dtype in dtypes:
            outs = []
            for keep in (True, False):
                ws = j.new_workspace(keep_slab=keep)
                out = np.full(plan.out_size(ws.lanes), np.nan, dtype)
                j.eval_into(plan, u.astype(dtype), r.p0, 0.0, None, out, ws)
                outs.append(out)
            assert np.array_equal(outs[0], outs[1]), (lay, dtype)



# ------------------------------------------------------------------ lane tiles

_small: dict = {}


def chapman_progs():
    """The Chapman cycle on 8 cells (4 species: a 4×4 lane block with zero
    entries), for a layout test where the model does not matter: each tile
    width is a kernel of its own, compiled in about a second here, where
    tropo12's dense 15×15 lane blocks take ~15 s of CPU each."""
    if not _small:
        from tests.support.models import chapman
        d = chapman(cells=8)
        _small["c"] = (RhsProgram.build(d), JacobianProgram.build(d))
    return _small["c"]


def chapman_forced_progs():
    """The Chapman cycle lifted to 8 cells with a per-cell photolysis rate
    (a forcing field read per lane, as tropo12's ``fj``): for the tile tests
    where the lanes of the forcing move with those of the state."""
    if "f" not in _small:
        from tests.support.models import chapman
        from esmjac.models.mechanism import box, lift
        d = lift(box(chapman(cells=1)), 8, cell_parameters=["j_O3"])
        _small["f"] = (RhsProgram.build(d), JacobianProgram.build(d))
    return _small["f"]


def test_tile_formula_against_a_direct_reading_of_the_matrix():
    """Slot (r, c) of lane l of LaneBlocks(tile=W) is J[r*L + l, c*L + l] of
    the assembled CSR (an independent route), at ((l//W)*n² + r*n + c)*W + l%W."""
    r, j = chapman_progs()
    u = point(r, 3)
    pc = j.plan(Csr(), source=r)
    ws = j.new_workspace(keep_slab=True)
    o = np.zeros(pc.out_size(ws.lanes))
    j.eval_into(pc, u, r.p0, 0.0, None, o, ws)
    M = csr_array((o, pc.indices, pc.indptr), shape=tuple(pc.info["shape"])).toarray()
    N, n = j.cells, j.n_species
    block = M[::N, ::N][:n, :n]                 # lane 0's block
    assert np.count_nonzero(block) and (block == 0).any()     # zero entries are read as such too
    for W in (1, 3, 4, None):
        plan = j.plan(LaneBlocks(tile=W), source=r)
        ws = j.new_workspace()
        out = np.full(plan.out_size(N), np.nan)
        j.eval_into(plan, u, r.p0, 0.0, None, out, ws)
        w = tile_width(W, N)
        assert plan.tile_width(N) == w and out.size == n * n * tile_capacity(W, N)
        for l in range(N):
            for rr in range(n):
                for c in range(n):
                    assert out[tile_index(rr * n + c, l, n * n, w)] == M[rr * N + l, c * N + l]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tile_widths_give_the_same_bits(dtype):
    """Tile widths 16 (the default) and 5 (a ragged last tile) against one
    tile (None), direct writes and the slab path, padded capacities: one set
    of bits per lane. (Widths 1/2/3/8 are covered by test_bound and the
    ColumnBanded test below; float32 on the sparse blocks only: each tile
    width and dtype is a kernel compile of its own, hence the Chapman cells
    with a per-cell forcing, whose kernels compile in about a second where
    tropo12's dense 15×15 blocks take ~15 s each.)"""
    r, j = chapman_forced_progs()
    N = j.cells
    P = N + 13                                  # padded workspace: lanes past N repeat the last cell
    pidx = np.minimum(np.arange(P), N - 1)
    u = point(r, 11)
    f = r.forcing0 * np.random.default_rng(2).uniform(0.5, 1.5, r.forcing0.size)
    n, nf = j.n_species, f.size // N
    ul = np.ascontiguousarray(u.reshape(n, N)[:, pidx]).ravel()
    fl = np.ascontiguousarray(f.reshape(nf, N)[:, pidx]).ravel()
    makers = [LaneSparseBlocks]
    if dtype == np.float64:      # float32 on the sparse family (the leaf's); the dense one's in the fused test
        makers.append(lambda tile: LaneBlocks("markowitz", tile=tile))
    for make in makers:
        ref = _lane_eval(j, r, make(None), ul, fl, P, keep_slab=True, dtype=dtype)
        for W in (5, 16):                       # a ragged last tile; the default width
            for keep in (False, True):
                got = _lane_eval(j, r, make(W), ul, fl, P, keep_slab=keep, dtype=dtype)
                assert np.array_equal(got, ref), (W, keep)


def test_tiled_column_banded_equals_the_untiled_one():
    r, j = rhs_prog("bd_chem"), jac_prog("bd_chem")
    u = point(r, 1)
    outs = {}
    for W in (None, 1, 2, 16):
        plan = j.plan(ColumnBanded(tile=W), source=r)
        ws = j.new_workspace()
        out = np.full(plan.out_size(ws.lanes), np.nan)
        j.eval_into(plan, u, r.p0, 0.0, None, out, ws)
        C, w, cap = plan.info["columns"], plan.tile_width(ws.lanes), plan.info["capacity"]
        nslots = (plan.info["kl"] + plan.info["ku"] + 1) * plan.info["m"]
        assert out.size == nslots * cap and not np.isnan(out).any()
        full = untile(out, nslots, cap, w)
        assert np.array_equal(full[:, C:], np.repeat(full[:, C - 1:C], cap - C, axis=1))
        outs[W] = full[:, :C]
    for W, v in outs.items():
        assert np.array_equal(v, outs[None]), W


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "16", 10**6])
def test_bad_tile_options_are_refused(bad):
    for make in (lambda: LaneBlocks(tile=bad), lambda: LaneSparseBlocks(tile=bad),
                 lambda: ColumnBanded(tile=bad)):
        with pytest.raises(JacError) as e:
            make()
        assert e.value.code == "bad_option"


def test_the_tile_is_recorded_in_the_plan():
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    a, b = j.plan(LaneSparseBlocks(tile=8), source=r), j.plan(LaneSparseBlocks(tile=None), source=r)
    assert a.info["tile"] == 8 and b.info["tile"] is None and a.to_json() != b.to_json()
    assert json.loads(a.to_json())["info"]["tile"] == 8


def test_apply_after_direct_writes_uses_the_point_of_eval_into():
    """A direct-write workspace keeps no slab: apply/apply_transpose evaluate
    it from the workspace's copy of the point, so they equal the eager slab
    (keep_slab=True) bit for bit even after the caller overwrites u."""
    r, j = rhs_prog("tropo12"), jac_prog("tropo12")
    rng = np.random.default_rng(4)
    for lay in (LaneSparseBlocks(), Csr()):
        plan = j.plan(lay, source=r)
        res = []
        for keep in (True, False):
            ws = j.new_workspace(keep_slab=keep)
            u = point(r, 0)
            j.eval_into(plan, u, r.p0, 0.0, None, np.zeros(plan.out_size(ws.lanes)), ws)
            u[:] = 7.0                                   # the caller reuses its buffer
            v = rng.standard_normal(j.col_size(ws.lanes))
            y = j.apply(plan, ws, v, np.zeros(j.u_size(ws.lanes)))
            g = j.apply_transpose(plan, ws, v, np.zeros(j.col_size(ws.lanes)))
            res.append((y, g))
            rng = np.random.default_rng(4)
        assert np.array_equal(res[0][0], res[1][0]) and np.array_equal(res[0][1], res[1][1]), lay
