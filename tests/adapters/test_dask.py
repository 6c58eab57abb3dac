"""The ``dask`` adapter: esmjac programs mapped over chunks of cells.

Oracle: the same model built at the full grid size in this process, one
``eval_into`` over every lane (``RhsProgram``/``JacobianProgram``, then
``apply``/``apply_transpose`` on that workspace). The chunked results must be
*bitwise* equal for three chunkings, on a 2-process LocalCluster (all workers
and one), on threads, with dask arrays and with xarray in and out.
Also: the spec shipped to workers is a few kB and does not grow with the
grid; a cold process builds once under concurrent demand; global (stencil)
models are refused with a typed error.
"""
from __future__ import annotations

import dataclasses
import pickle
import threading

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")
xr = pytest.importorskip("xarray")

import dask  # noqa: E402
import dask.array as da  # noqa: E402

from esmjac import JacobianProgram, LaneBlocks, LaneSparseBlocks, RhsProgram  # noqa: E402
from esmjac.adapters import dask as ad  # noqa: E402
from esmjac.adapters.dask import _advance as ad_advance, _spec as ad_spec  # noqa: E402
from esmjac.layouts.types import untile  # noqa: E402
from esmjac.errors import JacError  # noqa: E402
from esmjac.models.gridded import diffusion_model, gridded_tropo12  # noqa: E402

N = 240
CHUNKINGS = [N, 64, (50, 90, 7, 93)]     # one chunk, even chunks, ragged chunks


@pytest.fixture(scope="module")
def client():
    """One 2-process cluster for the whole module (start-up is the cost)."""
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                           worker_dashboard_address=None, silence_logs=40)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


@pytest.fixture(scope="module")
def case():
    """The gridded tropo12 model, a varied state, forcing and vectors, and
    the single-process oracle values."""
    doc, _, _ = gridded_tropo12(N)
    r = RhsProgram.build(doc)
    j = JacobianProgram.build(doc)
    rng = np.random.default_rng(7)
    ns = r.n_species
    u = (r.u0 * rng.uniform(0.5, 1.5, r.u0.size)).reshape(ns, N)
    fj = rng.uniform(0.2, 1.0, N)
    v = rng.standard_normal((ns, N))
    lam = rng.standard_normal((ns, N))
    uf = np.ascontiguousarray(u.ravel())
    ref = {"rhs": r.eval_into(uf, r.p0, 0.0, fj, np.empty(uf.size))}
    for lay in (LaneSparseBlocks(), LaneBlocks("natural")):
        pl = j.plan(lay, source=r)
        ws = j.new_workspace()
        out = j.eval_into(pl, uf, j.p0, 0.0, fj, np.zeros(pl.out_size(N)), ws)
        ref[lay.name] = untile(out, int(pl.info["slots_per_lane"]), N, pl.tile_width(N))   # [slot, lane]
        if isinstance(lay, LaneSparseBlocks):
            ref["apply"] = j.apply(pl, ws, np.ascontiguousarray(v.ravel()), np.zeros(uf.size)).reshape(ns, N)
            ref["apply_t"] = j.apply_transpose(pl, ws, np.ascontiguousarray(lam.ravel()),
                                               np.zeros(uf.size)).reshape(ns, N)
    ref["rhs"] = ref["rhs"].reshape(ns, N)
    return dict(doc=doc, u=u, fj=fj, v=v, lam=lam, ref=ref, species=r.layout.states)


def _graphs(case, chunks):
    doc, ns = case["doc"], case["u"].shape[0]
    U = da.from_array(case["u"], chunks=(ns, chunks))
    F = {"fj": da.from_array(case["fj"], chunks=(U.chunks[1],))}
    V = da.from_array(case["v"], chunks=U.chunks)
    lam = da.from_array(case["lam"], chunks=U.chunks)
    return {"rhs": ad.rhs(doc, U, forcing=F),
            "lanesparseblocks": ad.jacobian(doc, U, forcing=F),
            "laneblocks-natural": ad.jacobian(doc, U, forcing=F, layout=LaneBlocks("natural")),
            "apply": ad.apply(doc, U, V, forcing=F),
            "apply_t": ad.apply_transpose(doc, U, lam, forcing=F)}


def _same(got: dict, ref: dict):
    for k, g in got.items():
        assert g.shape == ref[k].shape, k
        assert g.dtype == ref[k].dtype, k
        assert np.array_equal(g, ref[k]), f"{k}: not bitwise equal to one process"


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=["one", "even", "ragged"])
def test_bitwise_on_two_processes(client, case, chunks):
    g = _graphs(case, chunks)
    if chunks == 64:
        assert g["rhs"].numblocks == (1, 4)
    got = dict(zip(g, client.compute(list(g.values()), sync=True)))
    _same(got, case["ref"])


def test_bitwise_on_one_worker_and_on_threads(client, case):
    g = _graphs(case, (50, 90, 7, 93))
    one = client.scheduler_info()["workers"]
    addr = sorted(one)[0]
    got = dict(zip(g, client.compute(list(g.values()), workers=[addr], sync=True)))
    _same(got, case["ref"])
    with dask.config.set(scheduler="threads", num_workers=3):
        got = dict(zip(g, dask.compute(*g.values())))
    _same(got, case["ref"])


def test_float32_follows_input(client, case):
    doc, ns = case["doc"], case["u"].shape[0]
    u32 = case["u"].astype(np.float32)
    r = RhsProgram.build(doc)
    ref = r.eval_into(np.ascontiguousarray(u32.ravel()), r.p0, 0.0, case["fj"].astype(np.float32),
                      np.empty(u32.size, np.float32)).reshape(ns, N)
    out = ad.rhs(doc, da.from_array(u32, chunks=(ns, 64)),
                 forcing={"fj": da.from_array(case["fj"], chunks=64)})
    got = client.compute(out, sync=True)
    assert got.dtype == np.float32 and np.array_equal(got, ref)


# ------------------------------------------------------------------ xarray

def _dataset(case, chunks=None):
    """The state on a (lat, lon) grid, lat descending (an order unstack would sort)."""
    nlat, nlon = 12, 20
    lat = np.linspace(60.0, -60.0, nlat)
    lon = np.arange(nlon) * 18.0
    ds = xr.Dataset({s: (("lat", "lon"), case["u"][i].reshape(nlat, nlon))
                     for i, s in enumerate(case["species"])},
                    coords={"lat": lat, "lon": lon}, attrs={"title": "test"})
    ds["fj"] = (("lat", "lon"), case["fj"].reshape(nlat, nlon))
    return ds.chunk(chunks) if chunks else ds


def test_xarray_dataset_in_dataset_out(client, case):
    ds = _dataset(case, {"lat": 5})
    out = ad.rhs(case["doc"], ds)                 # forcing read from the Dataset's own `fj`
    assert isinstance(out, xr.Dataset)
    assert list(out.data_vars) == list(case["species"])
    res = client.compute(out, sync=True)
    assert list(res["O3"].dims) == ["lat", "lon"]
    np.testing.assert_array_equal(res["lat"].values, ds["lat"].values)
    for i, s in enumerate(case["species"]):
        assert np.array_equal(res[s].values.ravel(), case["ref"]["rhs"][i]), s
    jac = client.compute(ad.jacobian(case["doc"], ds), sync=True)
    assert isinstance(jac, xr.DataArray) and jac.dims == ("slot", "lat", "lon")
    assert np.array_equal(jac.values.reshape(jac.shape[0], -1), case["ref"]["lanesparseblocks"])
    assert all("," in str(s) for s in jac["slot"].values)


def test_xarray_dataarray_and_products(client, case):
    ds = _dataset(case, {"lon": 7})
    arr = xr.concat([ds[s] for s in case["species"]], dim="species")
    forcing = ds[["fj"]]
    out = ad.rhs(case["doc"], arr, forcing=forcing)
    assert isinstance(out, xr.DataArray) and out.dims == ("species", "lat", "lon")
    res = client.compute(out, sync=True)
    assert np.array_equal(res.values.reshape(len(case["species"]), -1), case["ref"]["rhs"])
    vv = xr.DataArray(case["v"].reshape(arr.shape), dims=arr.dims, coords=arr.coords).chunk({"lon": 7})
    y = client.compute(ad.apply(case["doc"], arr, vv, forcing=forcing), sync=True)
    assert np.array_equal(y.values.reshape(len(case["species"]), -1), case["ref"]["apply"])


# ------------------------------------------------------------------ build once, ship small

def test_spec_is_small_and_independent_of_the_grid(case):
    small = ad.model(case["doc"])
    big_doc, _, _ = gridded_tropo12(1_000_000)
    big = ad.model(big_doc)
    a, b = len(pickle.dumps(small.spec)), len(pickle.dumps(big.spec))
    assert a < 8192 and abs(a - b) < 64, (a, b)
    assert big.cells == 1_000_000 and big.spec.template
    # one graph of many chunks carries the spec once, as one key
    U = da.zeros((small.n_species, N), chunks=(small.n_species, 8))
    g = ad.rhs(case["doc"], U, forcing={"fj": da.ones(N, chunks=8)})
    spec_keys = [k for k in dict(g.__dask_graph__()) if "esmjac-spec" in str(k)]
    assert len(spec_keys) == 1


def test_workers_build_each_spec_once(client, case):
    ns = case["u"].shape[0]
    U = da.from_array(case["u"], chunks=(ns, 16))
    client.compute(ad.rhs(case["doc"], U, forcing={"fj": da.from_array(case["fj"], chunks=16)}), sync=True)
    key = ad.model(case["doc"]).spec.key
    counts = client.run(lambda: ad.BUILDS[key])
    assert counts and all(c <= 1 for c in counts.values()), counts


def test_cold_process_builds_once_under_concurrent_tasks(case):
    spec = ad.model(case["doc"]).spec
    cold = dataclasses.replace(spec, key="cold-" + spec.key)
    barrier = threading.Barrier(6)
    got = []

    def task():
        barrier.wait()
        got.append(ad_spec._built(cold))

    ts = [threading.Thread(target=task) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert ad.BUILDS[cold.key] == 1
    assert len({id(b) for b in got}) == 1


def test_one_workspace_per_thread_reused(case):
    ns = case["u"].shape[0]
    U = da.from_array(case["u"], chunks=(ns, 60))
    F = {"fj": da.from_array(case["fj"], chunks=60)}
    with dask.config.set(scheduler="synchronous"):
        ad.jacobian(case["doc"], U, forcing=F).compute()
        before = {k: id(v) for k, v in ad_spec._TLS.ws.items()}
        ad.jacobian(case["doc"], U, forcing=F).compute()
        after = {k: id(v) for k, v in ad_spec._TLS.ws.items()}
    assert before and before == after


def _index_model(n: int) -> dict:
    """Two species whose exchange rate grows with the cell number ``i``: the
    kernels read cell index values, so chunks must see their real cells."""
    def at(x):
        return {"op": "index", "args": [x, "i"]}

    def eq(x, e):
        return {"lhs": {"op": "D", "args": [x], "wrt": "t"},
                "rhs": {"op": "faq", "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}},
                        "expr": e}}
    flow = {"op": "*", "args": ["k", "i", at("A")]}
    return {"esm": "1.1.0", "metadata": {"name": "IndexRate"},
            "index_sets": {"cell": {"kind": "interval", "size": n}},
            "models": {"M": {"variables": {"A": {"type": "unknown", "shape": ["cell"], "default": 1.0},
                                           "B": {"type": "unknown", "shape": ["cell"], "default": 0.5},
                                           "k": {"type": "parameter", "default": 0.1}},
                             "equations": [eq("A", {"op": "+", "args": [{"op": "*", "args": [-1, flow]}, at("B")]}),
                                           eq("B", {"op": "+", "args": [flow, {"op": "*", "args": [-1, at("B")]}]})]}}}


def test_index_dependent_model_sees_its_real_cells(client):
    n = 30
    doc = _index_model(n)
    m = ad.model(doc)
    assert not m.spec.template            # shipped whole: the kernels read the cell index
    r, j = RhsProgram.build(doc), JacobianProgram.build(doc)
    pl = j.plan(LaneSparseBlocks(tile=None), source=r)   # slots × lanes, as dask returns them
    u = np.random.default_rng(5).uniform(0.5, 1.5, (2, n))
    uf = np.ascontiguousarray(u.ravel())
    ref_f = r.eval_into(uf, r.p0, 0.0, None, np.empty(uf.size)).reshape(2, n)
    ref_j = j.eval_into(pl, uf, j.p0, 0.0, None, np.zeros(pl.out_size(n)), j.new_workspace()).reshape(-1, n)
    # by hand: dA/dt = -0.1 i A + B
    assert np.allclose(ref_f[0], -0.1 * np.arange(1, n + 1) * u[0] + u[1], rtol=1e-14)
    U = da.from_array(u, chunks=(2, 7))
    f, jj = client.compute([ad.rhs(doc, U), ad.jacobian(doc, U)], sync=True)
    assert np.array_equal(f, ref_f) and np.array_equal(jj, ref_j)


# ------------------------------------------------------------------ refusals

def test_stencil_model_is_refused():
    with pytest.raises(JacError) as ei:
        ad.model(diffusion_model(6))
    assert ei.value.code == "unsupported_construct"
    assert "operator-split" in ei.value.message


def test_bad_inputs_are_typed(case):
    ns = case["u"].shape[0]
    with pytest.raises(JacError) as ei:
        ad.rhs(case["doc"], da.zeros((ns + 1, N)))
    assert ei.value.code == "bad_argument"
    with pytest.raises(JacError) as ei:
        ad.rhs(case["doc"], da.zeros((ns, N), dtype=np.int64))
    assert ei.value.code == "bad_argument"
    with pytest.raises(JacError) as ei:
        ad.rhs(case["doc"], da.zeros((ns, N)), forcing={"fj": da.zeros(N + 3)})
    assert ei.value.code == "bad_argument"
    with pytest.raises(JacError) as ei:
        ad.rhs(case["doc"], da.zeros((ns, N)), forcing={"nope": da.zeros(N)})
    assert ei.value.code == "bad_argument" and "fj" in ei.value.message


# ------------------------------------------------------------------ advance (the Rosenbrock leaf per chunk)

NA = 48                          # cells integrated
T_SPAN = (0.0, 600.0)
RTOL = 1e-3


def _one_process_advance(doc, u, fj, atol):
    """The oracle: the leaf in this process over every lane of the grid at once."""
    from esmjac.integrators.leaf import rosenbrock as leaf
    lf = leaf(doc, rtol=RTOL, atol=atol, threads=1)
    y = u.ravel().copy()                          # advance works in place
    st = lf.advance(y, T_SPAN[0], T_SPAN[1] - T_SPAN[0], forcing={"fj": fj})
    return y.reshape(u.shape), st.status.copy()


@pytest.fixture(scope="module")
def adv_case(case):
    doc, _, _ = gridded_tropo12(NA)
    u = np.ascontiguousarray(case["u"][:, :NA])
    fj = case["fj"][:NA].copy()
    atol = ad_advance._default_atol(doc, None, case["species"])
    y, status = _one_process_advance(doc, u, fj, atol)
    assert not status.any()
    return dict(doc=doc, u=u, fj=fj, atol=atol, y=y)


@pytest.mark.parametrize("chunks", [NA, 16, (5, 19, 24)], ids=["one", "even", "ragged"])
def test_advance_bitwise_on_two_processes(client, adv_case, chunks):
    ns = adv_case["u"].shape[0]
    U = da.from_array(adv_case["u"], chunks=(ns, chunks))
    res = ad.advance(adv_case["doc"], U, T_SPAN, rtol=RTOL, forcing={"fj": da.from_array(adv_case["fj"],
                                                                                        chunks=U.chunks[1])})
    y, status, nsteps = client.compute([res.u, res.stats["status"], res.stats["nsteps"]], sync=True)
    assert np.array_equal(y, adv_case["y"])
    assert not status.any() and (nsteps > 0).all()
    per = res.chunk_stats()
    assert [c["stop"] - c["start"] for c in per] == list(U.chunks[1])
    assert sum(c["steps"] for c in per) == int(nsteps.sum()) and all(not c["failures"] for c in per)


def test_advance_xarray_in_and_out(client, adv_case):
    ns = adv_case["u"].shape[0]
    species = RhsProgram.build(adv_case["doc"]).layout.states
    ds = xr.Dataset({s: (("x",), adv_case["u"][i]) for i, s in enumerate(species)},
                    coords={"x": np.arange(NA) * 10.0})
    ds["fj"] = ("x", adv_case["fj"])
    res = ad.advance(adv_case["doc"], ds.chunk({"x": 9}), T_SPAN, rtol=RTOL)
    assert isinstance(res.u, xr.Dataset) and isinstance(res.stats["nsteps"], xr.DataArray)
    out = client.compute(res.u, sync=True)
    got = np.stack([out[s].values for s in species])
    assert got.shape == (ns, NA) and np.array_equal(got, adv_case["y"])


def test_failing_cell_is_named_and_does_not_poison_its_chunk(client, adv_case):
    ns = adv_case["u"].shape[0]
    u = adv_case["u"].copy()
    bad = 13
    u[:, bad] = 1e200                                   # overflows: this cell cannot be integrated
    U = da.from_array(u, chunks=(ns, 8))
    res = ad.advance(adv_case["doc"], U, T_SPAN, rtol=RTOL, atol=adv_case["atol"],
                     forcing={"fj": da.from_array(adv_case["fj"], chunks=8)})
    y, status = client.compute([res.u, res.stats["status"]], sync=True)
    assert np.flatnonzero(status) .tolist() == [bad]
    ok = np.arange(NA) != bad
    assert np.isfinite(y[:, ok]).all() and np.array_equal(y[:, ok], adv_case["y"][:, ok])
    per = res.chunk_stats()
    failures = [f for c in per for f in c["failures"]]
    assert [f["cell"] for f in failures] == [bad] and failures[0]["index"] == (bad,)


# ------------------------------------------------------------------ faults (keep last: it kills a worker)

def test_killed_worker_loses_no_result(client, case):
    import os
    import signal
    import time
    ns = case["u"].shape[0]

    def slow(block):                # keeps tasks running long enough to kill a worker under them
        time.sleep(0.5)
        return block

    U = da.from_array(case["u"], chunks=(ns, 20)).map_blocks(slow, dtype=np.float64)
    F = {"fj": da.from_array(case["fj"], chunks=20)}
    fut = client.compute(ad.jacobian(case["doc"], U, forcing=F))
    deadline = time.monotonic() + 60
    victim = None
    while victim is None and time.monotonic() < deadline:
        busy = [w for w, tasks in client.processing().items() if tasks]
        victim = busy[0] if busy and fut.status == "pending" else None
        time.sleep(0.05)
    assert victim is not None, "no task ever ran"
    pid = client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    got = fut.result(timeout=180)
    assert np.array_equal(got, case["ref"]["lanesparseblocks"])
    # the nanny restarted it: the cluster is whole again
    client.wait_for_workers(2, timeout=120)


_DASK_LATER_TASKS = r"""
import dask
import dask.array as da
import numpy as np
from esmjac.adapters import dask as ad
from esmjac.models.gridded import gridded_tropo12
from esmjac.runtime.programs import RhsProgram
dask.config.set(scheduler="synchronous")         # the tasks run in this process, seen by the spy
doc, forcing, _ = gridded_tropo12(8)
u0 = np.asarray(RhsProgram.build(doc).u0, dtype=np.float64).reshape(15, 8)
fj = np.linspace(0.2, 1.0, 8)[None, :]


def run(u, f, w):
    U, F = da.from_array(u, chunks=(15, w)), da.from_array(f, chunks=(1, w))
    return (ad.rhs(doc, U, forcing=F).compute(), ad.jacobian(doc, U, forcing=F).compute(),
            ad.advance(doc, U, (0.0, 600.0), forcing=F).u.compute())


first = run(u0, fj, 4)                           # each process's first tasks build (load) its programs
compiled()
ro, fro = u0.copy(), fj.copy()
ro.setflags(write=False)
fro.setflags(write=False)
again = run(ro, fro, 3)                          # read-only inputs, another chunk width
same = all(np.array_equal(a, b) for a, b in zip(first, again))
print("RESULT " + json.dumps({"new": compiled(), "same": same}))
"""


@pytest.mark.slow
def test_no_numba_specialization_after_the_first_tasks(tmp_path):
    """After a process's first tasks (which build its programs: the dask
    route's build), later tasks compile nothing: read-only input chunks and
    another chunk width reuse the compiled specializations (the block tasks
    hand the kernels contiguous writable copies). Same bits either way."""
    import os
    from tests.support.child import run_child
    from tests.support.compiles import SPY
    res = run_child(SPY + _DASK_LATER_TASKS, os.environ.get("ESMJAC_CACHE_DIR", tmp_path), timeout=900)
    assert res["new"] == [], f"kernels specialized in later tasks: {res['new']}"
    assert res["same"]
