"""A published box mechanism on a global grid: one 20-minute chemistry step
on a 2-worker Dask cluster, plotted as a map.

Run: ``python examples/box_on_grid.py [--nlat 90 --nlon 180] [--out map.png]``
(needs ``pip install 'esmjac[dask,plot]'``). Nothing but the installed
``esmjac`` is imported.

The mechanism is ``box_nox.esm``, bundled with esmjac: 12 species and 21
reactions written as chemists publish box mechanisms (one
``reaction_systems`` entry, scalar species and parameters, no grid). esmjac
builds it once as a *cell program* whose lane count is the data's; the grid
is the xarray Dataset's. Temperature and two photolysis frequencies are
declared per cell (``per_cell=["T", "jNO2", "jO1D"]``) and read from the
Dataset's variables of the same names: a temperature that falls off towards
the poles, and photolysis frequencies from the solar zenith angle at 12:00
UTC at equinox (night on the far side of the globe).
"""
from __future__ import annotations

import argparse
import json
from importlib import resources

import numpy as np

MECHANISM = resources.files("esmjac.models").joinpath("box_nox.esm")
PER_CELL = ["T", "jNO2", "jO1D"]


def grid_dataset(nlat: int, nlon: int, u0: dict):
    """The state (the mechanism's defaults everywhere) and the per-cell fields."""
    import xarray as xr
    lat = np.linspace(-90 + 90 / nlat, 90 - 90 / nlat, nlat)       # cell centres
    lon = np.linspace(-180 + 180 / nlon, 180 - 180 / nlon, nlon)
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    cos_sza = np.clip(np.cos(la) * np.cos(lo), 0.0, None)            # sun overhead at (0°, 0°)
    ds = xr.Dataset({s: (("lat", "lon"), np.full((nlat, nlon), x)) for s, x in u0.items()},
                    coords={"lat": lat, "lon": lon})
    ds["T"] = (("lat", "lon"), 300.0 - 60.0 * np.sin(la) ** 2)       # K
    ds["jNO2"] = (("lat", "lon"), 8.8e-3 * cos_sza ** 0.3 * (cos_sza > 0))   # 1/s
    ds["jO1D"] = (("lat", "lon"), 4.0e-5 * cos_sza ** 2)                    # 1/s
    return ds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nlat", type=int, default=90)
    ap.add_argument("--nlon", type=int, default=180)
    ap.add_argument("--chunk-lat", type=int, default=15, help="latitude rows per chunk")
    ap.add_argument("--out", default="box_on_grid.png")
    args = ap.parse_args(argv)

    import dask
    from distributed import Client, LocalCluster

    from esmjac.adapters import dask as ejd

    doc = json.loads(MECHANISM.read_text())
    m = ejd.model(doc, per_cell=PER_CELL)               # builds once here; workers get a few kB
    u0 = {s.rsplit(".", 1)[-1]: x for s, x in m.u0.items()}   # short names: "O3", not "BoxNOx.O3"
    ds = grid_dataset(args.nlat, args.nlon, u0).chunk({"lat": args.chunk_lat})

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=40) as cluster, Client(cluster):
        step = ejd.advance(m, ds, (0.0, 1200.0), rtol=1e-3)    # one 20-minute chemistry step
        new, status, nsteps = dask.compute(step.u, step.stats["status"], step.stats["nsteps"])
        failures = [f for c in step.chunk_stats() for f in c["failures"]]

    cells = args.nlat * args.nlon
    print(f"{cells} cells, {len(step.chunks)} chunks: {int(nsteps.sum())} steps "
          f"(max {int(nsteps.max())} in one cell), {len(failures)} failed cell(s)")
    d_o3 = (new["O3"] - ds["O3"]).compute()
    print(f"O3 change over 20 min: min {float(d_o3.min()):.3e}, max {float(d_o3.max()):.3e} molec/cm^3")
    ratio = new["NO2"] / (new["NO"] + new["NO2"])

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4), constrained_layout=True)
    pc = ax.pcolormesh(ratio["lon"], ratio["lat"], ratio.values, shading="auto", cmap="viridis")
    fig.colorbar(pc, ax=ax, label="NO2 / NOx after 20 min")
    ax.set(xlabel="longitude (°)", ylabel="latitude (°)",
           title=f"box_nox.esm on {args.nlat}×{args.nlon} cells, one 20-minute step (Dask, 2 workers)")
    fig.savefig(args.out, dpi=80)
    print(f"map written to {args.out}")
    return 1 if failures or status.values.any() else 0


if __name__ == "__main__":
    raise SystemExit(main())
