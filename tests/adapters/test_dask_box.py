"""A published box mechanism on a gridded dataset through the Dask adapter.

The bundled ``box_nox.esm`` is a box mechanism as chemists publish it (one
``reaction_systems`` entry, scalar species and parameters, no grid). Given an
xarray Dataset over (lat, lon) -- or a dask array (n_species, cells) -- the
adapter takes the grid from the data and reads temperature and photolysis
rates per cell (``per_cell=``) from the Dataset's variables of the same
(short) names or from ``forcing=``.

Oracles: the same cell program in this process over every cell at once
(bitwise, for three chunkings, on a 2-process LocalCluster), and rate laws
written out by hand from the mechanism's text for the per-cell inputs
(d[O1D]/dt and ∂(d[O1D]/dt)/∂[O3] = jO1D, cell by cell).
"""
from __future__ import annotations

import json
from importlib import resources

import numpy as np
import pytest

pytest.importorskip("dask.array")
pytest.importorskip("distributed")
xr = pytest.importorskip("xarray")

import dask.array as da  # noqa: E402

from esmjac import JacobianProgram, LaneSparseBlocks, RhsProgram  # noqa: E402
from esmjac.adapters import dask as ad  # noqa: E402
from esmjac.errors import JacError  # noqa: E402
from esmjac.layouts.types import untile  # noqa: E402

pytestmark = pytest.mark.slow

BOX = json.loads(resources.files("esmjac.models").joinpath("box_nox.esm").read_text())
PER_CELL = ["T", "jNO2", "jO1D"]          # short names: the document's are BoxNOx.T, ...
NLAT, NLON = 6, 16
N = NLAT * NLON
DS_CHUNKS = [{"lat": NLAT}, {"lat": 2}, {"lat": (1, 4, 1), "lon": 8}]
DA_CHUNKS = [N, 32, (10, 50, 36)]
T_SPAN = (0.0, 1200.0)
RTOL = 1e-3


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                           worker_dashboard_address=None, silence_logs=40)
    c = Client(cluster)
    yield c
    c.close()
    cluster.close()


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


@pytest.fixture(scope="module")
def grid():
    """A varied state over (lat, lon), per-cell fields, vectors, and the
    one-process results at the same lanes (row-major cells)."""
    opts = {"per_lane": PER_CELL}
    r = RhsProgram.build(BOX, options=opts)
    j = JacobianProgram.build(BOX, options=opts)
    species = [_short(s) for s in r.layout.states]
    rng = np.random.default_rng(11)
    u0 = np.asarray(r.u0).reshape(len(species))
    u = u0[:, None] * rng.uniform(0.5, 1.5, (len(species), N))
    lat = np.linspace(-75.0, 75.0, NLAT)
    fields = {"T": (260.0 + 40.0 * np.cos(np.deg2rad(lat))[:, None] * np.ones(NLON)).ravel()
              + rng.uniform(-3, 3, N),
              "jNO2": rng.uniform(0.0, 9e-3, N), "jO1D": rng.uniform(0.0, 4e-5, N)}
    f = np.concatenate([fields[_short(n)] for n in r.forcing_names])
    v = rng.standard_normal(u.shape)
    uf = np.ascontiguousarray(u.ravel())
    ref = {"rhs": r.eval_into(uf, r.p0, 0.0, f, np.empty(uf.size), r.new_buffers(N)).reshape(u.shape)}
    pl = j.plan(LaneSparseBlocks(), source=r)
    ws = j.new_workspace(N)
    out = j.eval_into(pl, uf, j.p0, 0.0, f, np.zeros(pl.out_size(N)), ws)
    ref["jac"] = untile(out, int(pl.info["slots_per_lane"]), N, pl.tile_width(N))
    ref["apply"] = j.apply(pl, ws, np.ascontiguousarray(v.ravel()), np.zeros(uf.size)).reshape(u.shape)
    ref["apply_t"] = j.apply_transpose(pl, ws, np.ascontiguousarray(v.ravel()),
                                       np.zeros(uf.size)).reshape(u.shape)
    from esmjac.integrators.leaf import rosenbrock
    leaf = rosenbrock(BOX, rtol=RTOL, threads=1, options=opts)
    y = uf.copy()
    st = leaf.advance(y, T_SPAN[0], T_SPAN[1] - T_SPAN[0], forcing=f)
    assert not st.status.any()
    ref["advance"] = y.reshape(u.shape)
    labels = ad.model(BOX, per_cell=PER_CELL).slot_labels(LaneSparseBlocks())
    return dict(species=species, u=u, v=v, fields=fields, ref=ref, labels=labels,
                lat=lat, lon=np.arange(NLON) * 22.5, p=dict(zip(r.param_names, r.p0)))


def _dataset(g, chunks) -> xr.Dataset:
    sh = (NLAT, NLON)
    ds = xr.Dataset({s: (("lat", "lon"), g["u"][i].reshape(sh)) for i, s in enumerate(g["species"])},
                    coords={"lat": g["lat"], "lon": g["lon"]})
    for k, x in g["fields"].items():
        ds[k] = (("lat", "lon"), x.reshape(sh))
    return ds.chunk(chunks)


def _stack(ds: xr.Dataset, names) -> np.ndarray:
    return np.stack([ds[s].values.reshape(-1) for s in names])


def test_hand_rate_laws_per_cell(grid):
    """d[O1D]/dt = jO1D·O3 − (k_q(T) + k_w(T)·H2O)·O1D with the cell's own T
    and jO1D (the mechanism's R4, R5, R6), and ∂/∂O3 = jO1D."""
    u, fl, p = grid["u"], grid["fields"], grid["p"]
    sp = grid["species"]
    O3, O1D = u[sp.index("O3")], u[sp.index("O1D")]
    T, M, H2O = fl["T"], p["BoxNOx.M"], p["BoxNOx.H2O"]
    kq = 3.3e-11 * np.exp(55 / T) * 0.21 * M + 2.15e-11 * np.exp(110 / T) * 0.79 * M
    kw = 1.63e-10 * np.exp(60 / T) * H2O
    want = fl["jO1D"] * O3 - (kq + kw) * O1D
    got = grid["ref"]["rhs"][sp.index("O1D")]
    assert np.allclose(got, want, rtol=1e-12, atol=0)
    q = grid["labels"].index("BoxNOx.O1D,BoxNOx.O3")
    assert np.allclose(grid["ref"]["jac"][q], fl["jO1D"], rtol=1e-14, atol=0)


@pytest.mark.parametrize("chunks", DS_CHUNKS, ids=["one", "even", "ragged"])
def test_dataset_bitwise_on_two_processes(client, grid, chunks):
    ds = _dataset(grid, chunks)
    vs = _dataset({**grid, "u": grid["v"]}, chunks)[grid["species"]]
    g = {"rhs": ad.rhs(BOX, ds, per_cell=PER_CELL),
         "jac": ad.jacobian(BOX, ds, per_cell=PER_CELL),
         "apply": ad.apply(BOX, ds, vs, per_cell=PER_CELL),
         "apply_t": ad.apply_transpose(BOX, ds, vs, options={"per_lane": PER_CELL}),
         "advance": ad.advance(BOX, ds, T_SPAN, rtol=RTOL, per_cell=PER_CELL).u}
    got = dict(zip(g, client.compute(list(g.values()), sync=True)))
    for k in ("rhs", "apply", "apply_t", "advance"):
        out = got[k]
        assert isinstance(out, xr.Dataset) and list(out.data_vars) == grid["species"], k
        assert out["O3"].dims == ("lat", "lon") and np.array_equal(out["lat"], grid["lat"])
        assert np.array_equal(_stack(out, grid["species"]), grid["ref"][k]), f"{k}: not bitwise"
    jac = got["jac"]
    assert jac.dims == ("slot", "lat", "lon") and list(jac["slot"].values) == grid["labels"]
    assert np.array_equal(jac.values.reshape(len(grid["labels"]), N), grid["ref"]["jac"])


@pytest.mark.parametrize("chunks", DA_CHUNKS, ids=["one", "even", "ragged"])
def test_dask_array_bitwise_on_two_processes(client, grid, chunks):
    ns = len(grid["species"])
    U = da.from_array(grid["u"], chunks=(ns, chunks))
    V = da.from_array(grid["v"], chunks=U.chunks)
    F = {k: da.from_array(x, chunks=(U.chunks[1],)) for k, x in grid["fields"].items()}
    m = ad.model(BOX, per_cell=tuple(PER_CELL))          # a tuple says the same as a list
    g = {"rhs": ad.rhs(m, U, forcing=F), "jac": ad.jacobian(m, U, forcing=F),
         "apply": ad.apply(m, U, V, forcing=F), "apply_t": ad.apply_transpose(m, U, V, forcing=F)}
    adv = ad.advance(m, U, T_SPAN, rtol=RTOL, forcing=F)
    g["advance"] = adv.u
    got = dict(zip(g, client.compute(list(g.values()), sync=True)))
    for k, x in got.items():
        assert np.array_equal(x, grid["ref"][k]), f"{k}: not bitwise equal to one process"
    per = adv.chunk_stats()
    assert [c["stop"] - c["start"] for c in per] == list(U.chunks[1])
    assert all(not c["failures"] for c in per) and sum(c["steps"] for c in per) > 0


def test_bitwise_on_threads(grid):
    """The threaded scheduler (3 threads sharing one process's programs and
    each its own workspaces) gives the same bits."""
    import dask
    ds = _dataset(grid, DS_CHUNKS[2])
    g = [ad.rhs(BOX, ds, per_cell=PER_CELL), ad.advance(BOX, ds, T_SPAN, rtol=RTOL, per_cell=PER_CELL).u]
    with dask.config.set(scheduler="threads", num_workers=3):
        f, y = dask.compute(*g)
    assert np.array_equal(_stack(f, grid["species"]), grid["ref"]["rhs"])
    assert np.array_equal(_stack(y, grid["species"]), grid["ref"]["advance"])


def test_workers_build_the_box_once_from_a_small_spec(client, grid):
    m = ad.model(BOX, per_cell=PER_CELL)
    assert m.box and m.spec.template and len(m.spec.doc) < 8192
    ds = _dataset(grid, {"lat": 1})
    client.compute(ad.rhs(BOX, ds, per_cell=PER_CELL), sync=True)
    counts = client.run(lambda: ad.BUILDS[m.spec.key])
    assert counts and all(c <= 1 for c in counts.values()), counts


def test_failing_cell_is_named_on_the_grid(client, grid):
    bad = (3, 5)
    u = grid["u"].copy()
    u[grid["species"].index("O3"), bad[0] * NLON + bad[1]] = 1e200   # overflows: cannot be integrated
    ds = _dataset({**grid, "u": u}, {"lat": 2})
    res = ad.advance(BOX, ds, T_SPAN, rtol=RTOL, per_cell=PER_CELL)
    status = client.compute(res.stats["status"], sync=True)
    assert status.dims == ("lat", "lon") and np.argwhere(status.values != 0).tolist() == [list(bad)]
    fails = [f for c in res.chunk_stats() for f in c["failures"]]
    assert [f["index"] for f in fails] == [bad] and fails[0]["cell"] == bad[0] * NLON + bad[1]


def test_per_cell_names_and_refusals(grid):
    ds = _dataset(grid, {"lat": 2})
    # qualified names and short ones build the same programs
    a = ad.model(BOX, per_cell=["BoxNOx.T", "jNO2", "jO1D"])
    assert a.forcing_names == ("BoxNOx.T", "BoxNOx.jNO2", "BoxNOx.jO1D")
    # a Dataset field naming a parameter that is not per cell would be ignored: refused
    with pytest.raises(JacError) as e:
        ad.rhs(BOX, ds, per_cell=["jNO2", "jO1D"])
    assert e.value.code == "bad_argument" and "per_cell" in e.value.message and "'T'" in e.value.message
    # per-cell fields from a separate forcing= Dataset: the same bits as from the state's own
    got = ad.rhs(BOX, ds[grid["species"]], forcing=ds[["T", "jNO2", "jO1D"]],
                 per_cell=PER_CELL).compute(scheduler="sync")
    assert np.array_equal(_stack(got, grid["species"]), grid["ref"]["rhs"])
    with pytest.raises(JacError) as e:                     # the same refusal in a forcing= Dataset
        ad.rhs(BOX, ds[grid["species"]], forcing=ds[["T", "jNO2", "jO1D"]], per_cell=["jNO2", "jO1D"])
    assert e.value.code == "bad_argument" and "'T'" in e.value.message
    with pytest.raises(JacError) as e:                     # nothing per cell at all: refused too
        ad.rhs(BOX, ds)
    assert e.value.code == "bad_argument" and "per_cell" in e.value.message
    with pytest.raises(JacError) as e:
        ad.model(BOX, per_cell=["Tx"])
    assert e.value.code == "bad_option" and "BoxNOx.T" in e.value.message
    with pytest.raises(JacError) as e:
        ad.model(BOX, per_cell="T")
    assert e.value.code == "bad_option"
    with pytest.raises(JacError) as e:
        ad.model(BOX, per_cell=["T"], options={"per_lane": ["jNO2"]})
    assert e.value.code == "bad_option"
    # forcing by a name the model reads as a scalar: the message says how to make it per cell
    U = da.from_array(grid["u"], chunks=(len(grid["species"]), 32))
    with pytest.raises(JacError) as e:
        ad.rhs(BOX, U, forcing={"M": da.ones(N, chunks=32)})
    assert e.value.code == "bad_argument" and "per_cell" in e.value.message
