"""Scale-out benchmark for the Dask adapter (DESIGN §11, issue #13).

    python benchmarks/scale.py [--quick] [--json benchmarks/scale.json] [--op jacobian|advance]

Measures, on this machine:

* ``kernel``   CPU time per cell of one chunk (``time.thread_time``, one
  thread, interleaved rounds, values verified against one process first):
  RHS, Jacobian (LaneSparseBlocks) and ``J·v`` for tropo12 (15 species), and
  the 20-minute chemistry step (``advance``) per cell;
* ``overhead`` per-task overhead against chunk size on a LocalCluster of two
  worker processes: (2 · wall − Σ kernel CPU) / tasks;
* ``scaling``  strong (fixed 10⁶ cells) and weak (5·10⁵ cells per worker)
  scaling for 1 and 2 worker processes, tasks of ≥ 100 ms; efficiency =
  T₁ / (k · T_k) (strong) or T₁ / T_k (weak), best of 3 interleaved rounds;
* ``bytes``    bytes per lane a worker holds: task inputs and outputs (u,
  forcing, layout or new state + statistics) and its scratch (workspaces,
  buffers, integrator scratch, from ``held_bytes()`` on the worker);
* ``m300``     the per-cell cost of a 300-species synthetic mechanism
  (``synthetic_mechanism(300, 800, cells)``): build time, Jacobian slots per
  cell, RHS / Jacobian / advance CPU time per cell on a few hundred cells.

The load average is recorded before and after every section: this machine
has 2 cores shared with other users, so wall-clock scaling is a lower bound.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np


def _load() -> list:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_per_call(fns: dict, rounds: int = 5, inner: int = 3) -> dict:
    """Best-of-rounds thread CPU seconds per call, the routes interleaved."""
    best = {k: float("inf") for k in fns}
    for f in fns.values():
        f()
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.thread_time()
            for _ in range(inner):
                f()
            best[k] = min(best[k], (time.thread_time() - t0) / inner)
    return best


# ---------------------------------------------------------------- in-process costs

def _tropo(cells: int, seed: int = 0):
    from esmjac.models.gridded import gridded_tropo12
    from esmjac.runtime.programs import RhsProgram
    doc, _, _ = gridded_tropo12(cells)
    r = RhsProgram.build(doc)
    rng = np.random.default_rng(seed)
    u = (r.u0 * rng.uniform(0.5, 1.5, r.u0.size)).reshape(r.n_species, cells)
    fj = rng.uniform(0.2, 1.0, cells)
    return doc, u, fj


def _chunk_costs(doc, u, fj, dt: float) -> dict:
    """CPU seconds per cell of one chunk through the adapter's own block
    tasks (the code a worker runs), verified against one process."""
    from esmjac.adapters import dask as ad
    from esmjac.adapters.dask import _advance as ada, _maps as adm
    from esmjac.layouts.types import LaneSparseBlocks
    m = ad.model(doc, cells=u.shape[1])
    spec, w = m.spec, u.shape[1]
    bi = {None: {"array-location": [(0, u.shape[0]), (0, w)]}}
    f = fj.reshape(1, -1)
    v = np.ones_like(u)
    lay = LaneSparseBlocks()
    fns = {
        "rhs": lambda: adm._rhs_block(u, f, spec, m.p0, 0.0, 1, block_info=bi),
        "jacobian": lambda: adm._jac_block(u, f, spec, lay, m.p0, 0.0, 1, block_info=bi),
        "apply": lambda: adm._apply_block(u, v, f, spec, m.p0, 0.0, 1, False, block_info=bi),
    }
    atol = ada._default_atol(spec.document(), None, m.species)
    fns["advance"] = lambda: ada._advance_block(u, f, spec, m.p0, 0.0, dt, "rodas3", 1e-3, atol,
                                               100000, 1, block_info=bi)
    # verify the block route against one process before timing
    from esmjac.runtime.programs import RhsProgram
    r = RhsProgram.build(doc)
    ref = r.eval_into(np.ascontiguousarray(u.ravel()), r.p0, 0.0, fj, np.empty(u.size))
    assert np.array_equal(fns["rhs"]().ravel(), ref), "rhs block differs from one process"
    cost = _cpu_per_call(fns, rounds=3, inner=1)
    out = {k: c / w for k, c in cost.items()}
    out["cells"] = w
    st = fns["advance"]()[u.shape[0]:]
    out["advance_steps_per_cell"] = float(st[1].mean())
    out["advance_failed"] = int((st[0] != 0).sum())
    out["slots"] = m.slots(lay)
    return out


def m300(cells: int, dt: float) -> dict:
    from esmjac.models.mechanism import synthetic_mechanism
    from esmjac.runtime.programs import JacobianProgram, RhsProgram
    doc = synthetic_mechanism(300, 800, cells, seed=1)
    t0 = time.perf_counter()
    RhsProgram.build(doc)
    JacobianProgram.build(doc)
    build = time.perf_counter() - t0
    rng = np.random.default_rng(3)
    r = RhsProgram.build(doc)
    u = (r.u0 * rng.uniform(0.5, 1.5, r.u0.size)).reshape(r.n_species, cells)
    from esmjac.adapters import dask as ad
    from esmjac.adapters.dask import _advance as ada, _maps as adm
    from esmjac.layouts.types import LaneSparseBlocks
    m = ad.model(doc)
    spec = m.spec
    bi = {None: {"array-location": [(0, 300), (0, cells)]}}
    lay = LaneSparseBlocks()
    fns = {"rhs": lambda: adm._no_forcing(adm._rhs_block)(u, spec, m.p0, 0.0, 1, block_info=bi),
           "jacobian": lambda: adm._no_forcing(adm._jac_block)(u, spec, lay, m.p0, 0.0, 1, block_info=bi)}
    atol = ada._default_atol(spec.document(), None, m.species)
    fns["advance"] = lambda: adm._no_forcing(ada._advance_block)(u, spec, m.p0, 0.0, dt, "rodas3", 1e-3,
                                                               atol, 100000, 1, block_info=bi)
    ref = r.eval_into(np.ascontiguousarray(u.ravel()), r.p0, 0.0, None, np.empty(u.size))
    assert np.array_equal(fns["rhs"]().ravel(), ref), "rhs block differs from one process"
    cost = _cpu_per_call(fns, rounds=2, inner=1)
    out = {"cells": cells, "build_s": build, "slots": m.slots(lay), "jac_bytes_per_cell": 8 * m.slots(lay),
           "species": 300, "reactions": 800, "engine": r.kernel.engine}
    out.update({f"{k}_s_per_cell": c / cells for k, c in cost.items()})
    held = ad.held_bytes()
    out["scratch_bytes_per_cell"] = sum(b for lanes, b in held.items() if lanes == cells) / cells
    st = fns["advance"]()[300:]
    out["advance_steps_per_cell"] = float(st[1].mean())
    out["advance_failed"] = int((st[0] != 0).sum())
    return out


# ---------------------------------------------------------------- cluster

def _cluster(n: int = 2):
    from distributed import Client, LocalCluster
    cl = LocalCluster(n_workers=n, processes=True, threads_per_worker=1, dashboard_address=None,
                      silence_logs=40, memory_limit="6GiB")
    return cl, Client(cl)


def _inputs(client, doc, cells: int, w: int, workers):
    """u and forcing made on the workers (no client → worker transfer), persisted."""
    import dask.array as da
    from distributed import wait
    from esmjac.runtime.programs import RhsProgram
    r = RhsProgram.build(doc)
    u0 = np.asarray(r.u0, dtype=np.float64).reshape(r.n_species, -1)[:, :1]
    U = da.ones((r.n_species, cells), chunks=(r.n_species, w)) * u0
    U = U * (0.5 + da.random.default_rng(0).random((1, cells), chunks=(1, w)))
    F = {"fj": da.linspace(0.2, 1.0, cells, chunks=w)}
    U, Fj = client.persist([U, F["fj"]], workers=workers, allow_other_workers=False)
    wait([U, Fj])
    return U, {"fj": Fj}


def _graph(op, doc, U, F, dt):
    from esmjac.adapters import dask as ad
    if op == "advance":
        return ad.advance(doc, U, (0.0, dt), rtol=1e-3, forcing=F).u
    if op == "apply":
        return ad.apply(doc, U, U, forcing=F)
    if op == "rhs":
        return ad.rhs(doc, U, forcing=F)
    return ad.jacobian(doc, U, forcing=F)


def _cpu(client, workers) -> float:
    """CPU seconds used so far by the worker processes and this process (the
    scheduler and client run here): what a task costs beyond its kernel."""
    return sum(client.run(time.process_time, workers=workers).values()) + time.process_time()


def _run_wall(client, g, workers, cpu: list | None = None) -> float:
    from distributed import wait
    c0 = _cpu(client, workers) if cpu is not None else 0.0
    t0 = time.perf_counter()
    x = client.persist(g, workers=workers, allow_other_workers=False)
    wait(x)
    dt = time.perf_counter() - t0
    if cpu is not None:
        cpu.append(_cpu(client, workers) - c0)
    del x
    return dt


def overhead(client, doc, op: str, widths, tasks: int, per_cell: float, dt: float) -> list:
    """Per-task overhead at each chunk width: ``tasks`` chunks of ``w`` cells on
    two workers, (2·wall − Σ kernel CPU) / tasks (the fixed latency of one
    graph is included, spread over the tasks)."""
    addrs = sorted(client.scheduler_info()["workers"])
    rows = []
    for w in widths:
        n = tasks * w
        U, F = _inputs(client, doc, n, w, addrs)
        g = _graph(op, doc, U, F, dt)
        _run_wall(client, g, addrs)               # warm: build on every worker
        cpu: list = []
        wall = min(_run_wall(client, _graph(op, doc, U, F, dt), addrs, cpu) for _ in range(3))
        kernel = per_cell * n
        rows.append({"chunk": w, "tasks": tasks, "wall_s": wall, "task_s": 2 * wall / tasks,
                     "kernel_task_s": kernel / tasks,
                     "overhead_per_task_ms": 1e3 * max(2 * wall - kernel, 0.0) / tasks,
                     "cpu_overhead_per_task_ms": 1e3 * max(min(cpu) - kernel, 0.0) / tasks, "load": _load()})
        del U, F
    return rows


def scaling(client, doc, op: str, total: int, w: int, dt: float, rounds: int = 3) -> dict:
    addrs = sorted(client.scheduler_info()["workers"])
    one, two = addrs[:1], addrs
    cases = {"strong_1": (total, one), "strong_2": (total, two), "weak_1": (total // 2, one)}
    best = {k: float("inf") for k in cases}
    cpu = {k: [] for k in cases}
    data = {k: _inputs(client, doc, n, w, ws) for k, (n, ws) in cases.items()}
    for k, (n, ws) in cases.items():                # warm
        _run_wall(client, _graph(op, doc, *data[k], dt), ws)
    loads = [_load()]
    for _ in range(rounds):
        for k, (n, ws) in cases.items():
            best[k] = min(best[k], _run_wall(client, _graph(op, doc, *data[k], dt), ws, cpu[k]))
        loads.append(_load())
    t1, t2, tw = best["strong_1"], best["strong_2"], best["weak_1"]
    c1, c2, cw = (min(cpu[k]) for k in ("strong_1", "strong_2", "weak_1"))
    return {"op": op, "cells": total, "chunk": w, "tasks": total // w, "task_s_1worker": t1 / (total // w),
            "wall_s": best, "strong_efficiency": t1 / (2 * t2), "weak_efficiency": tw / t2,
            "cpu_s": {"strong_1": c1, "strong_2": c2, "weak_1": cw},
            # the work itself: CPU seconds for the same cells on 1 vs 2 workers (1.0 = no extra work)
            "strong_cpu_efficiency": c1 / c2, "weak_cpu_efficiency": 2 * cw / c2,
            # the share of a core each worker got (the machine's other users take the rest)
            "core_share_2workers": c2 / (2 * t2), "cells_per_s_2workers": total / t2, "load": loads}


def bytes_per_lane(client, doc, op: str, w: int, dt: float) -> dict:
    from esmjac.adapters import dask as ad
    from esmjac.layouts.types import LaneSparseBlocks
    addrs = sorted(client.scheduler_info()["workers"])
    U, F = _inputs(client, doc, w, w, addrs[:1])
    _run_wall(client, _graph(op, doc, U, F, dt), addrs[:1])
    held = client.run(ad.held_bytes, workers=addrs[:1])[addrs[0]]
    m = ad.model(doc, cells=w)
    ns, nf = m.n_species, len(m.forcing_names)
    out_rows = ns + len(ad.STAT_ROWS) if op == "advance" else (ns if op == "apply" else m.slots(LaneSparseBlocks()))
    scratch = sum(b for lanes, b in held.items() if lanes == w)
    return {"op": op, "lanes": w, "u": 8 * ns, "forcing": 8 * nf, "output": 8 * out_rows,
            "scratch": scratch / w, "total": 8 * (ns + nf + out_rows) + scratch / w}


# ---------------------------------------------------------------- the plan

GRID = (1440, 720, 72)           # 0.25° global, 72 levels
STEP_S = 1200.0                  # the chemistry step (20 minutes)
WALL_S = 60.0                    # ... done in one minute of wall time
NODE_CORES, NODE_GIB = 128, 256  # a typical CPU node (e.g. 2 × 64-core EPYC, 256 GiB)
TASK_S = 0.1                     # tasks of >= 100 ms (Dask's per-task cost is ~1 ms)


def plan(res: dict, efficiency: float = 0.8) -> dict:
    """The 0.25° × 300-species plan from the measured figures (``res["m300"]``,
    ``res["overhead"]``): every number derived; assumed are only the node
    size, the efficiency target and the grid/step/wall-time of the brief.

    Chunking: four tasks per core per step (cells stiffen at dawn and dusk:
    small enough tasks let the scheduler even out the load), each at least
    ``TASK_S`` of work; a task holds its chunk's state in and out, the
    statistics and the leaf's scratch."""
    m = res["m300"]
    ns = int(m["species"])
    cells = int(np.prod(GRID))
    c = m["advance_s_per_cell"]                     # CPU s per cell per 20-minute step, one core
    work = cells * c                                # core-seconds per step
    cores = work / (WALL_S * efficiency)
    nodes = int(np.ceil(cores / NODE_CORES))
    cores_used = nodes * NODE_CORES
    tasks = 4 * cores_used
    chunk = int(np.ceil(cells / tasks))
    if chunk * c < TASK_S:                          # never below the task floor
        chunk = int(np.ceil(TASK_S / c))
        tasks = int(np.ceil(cells / chunk))
    io = 8 * (2 * ns + len(STAT_ROWS_))             # u in, u out, statistics per cell
    per = io + m["scratch_bytes_per_cell"]
    cap = int(0.5 * NODE_GIB * 2**30 / (2 * NODE_CORES * per))   # half the node for tasks in flight
    if chunk > cap:                                 # memory, not the clock, sets the chunk
        chunk = cap
        tasks = int(np.ceil(cells / chunk))
    nodes = max(nodes, int(np.ceil(cells * io / (0.5 * NODE_GIB * 2**30))))
    task_bytes = chunk * per
    resident = cells / nodes * io                   # the step's inputs/outputs spread over the nodes
    mem_node = resident + NODE_CORES * 2 * task_bytes    # a running and a queued task per core
    ov = [r["cpu_overhead_per_task_ms"] for r in res.get("overhead", [])]
    return {"grid": list(GRID), "cells": cells, "species": ns,
            "advance_cpu_s_per_cell": c, "advance_steps_per_cell": m.get("advance_steps_per_cell"),
            "cells_per_s_per_core": 1.0 / c, "core_seconds_per_step": work, "efficiency_assumed": efficiency,
            "cores": cores, "nodes": nodes, "node": f"{NODE_CORES} cores, {NODE_GIB} GiB",
            "tasks_per_step": tasks, "chunk_cells": chunk, "task_cpu_s": chunk * c,
            "task_bytes": task_bytes, "bytes_per_cell_io": io,
            "scratch_bytes_per_cell": m["scratch_bytes_per_cell"],
            "memory_per_node_gib": mem_node / 2**30,
            "scheduler_cpu_s_per_step_at_measured_overhead": tasks * (max(ov) if ov else 1.0) / 1e3,
            "jacobian_bytes_per_cell": m["jac_bytes_per_cell"]}


STAT_ROWS_ = ("status", "nsteps", "naccept", "nreject", "t")


# ---------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--op", default=None, choices=["jacobian", "apply", "advance"],
                    help="the operation scaled (default: advance with the per-lane leaf, else jacobian)")
    ap.add_argument("--only", default="kernel,overhead,scaling,bytes,m300")
    ap.add_argument("--plan-from", default=None, help="only derive the plan from a results JSON")
    a = ap.parse_args(argv)
    if a.plan_from:
        with open(a.plan_from) as fh:
            res = json.load(fh)
        res["plan"] = plan(res)
        print(json.dumps(res["plan"], indent=1))
        if a.json:
            with open(a.json, "w") as fh:
                json.dump(res, fh, indent=1)
        return 0
    op = a.op or "advance"
    dt = 1200.0
    only = set(a.only.split(","))
    res = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                       "platform": platform.platform()}, "op": op,
           "load_start": _load()}
    big = 20_000 if a.quick else 1_000_000
    if "kernel" in only:
        doc, u, fj = _tropo(5000)
        res["kernel"] = _chunk_costs(doc, u, fj, dt)
        res["kernel"]["load"] = _load()
        print("kernel", json.dumps(res["kernel"]), flush=True)
    per_cell = res.get("kernel", {}).get(op)
    rhs_cell = res.get("kernel", {}).get("rhs")
    if only & {"overhead", "scaling", "bytes"}:
        from esmjac.models.gridded import gridded_tropo12
        doc = gridded_tropo12(8)[0]
        cl, client = _cluster(2)
        try:
            if "overhead" in only and rhs_cell:
                widths = [100, 1000, 10_000, 50_000] if not a.quick else [100, 1000]
                res["overhead"] = overhead(client, doc, "rhs", widths, 32, rhs_cell, dt)
                for r in res["overhead"]:
                    print("overhead", json.dumps(r), flush=True)
            if "scaling" in only and per_cell:
                res["scaling"] = {}
                for o, n in ((op, big // 10), ("jacobian", big)):
                    c = res["kernel"][o]
                    w = int(min(max(0.1 / c, 1000), n // 4))      # tasks of >= 100 ms of CPU
                    n -= n % (2 * w)
                    res["scaling"][o] = scaling(client, doc, o, n, w, dt)
                    print("scaling", json.dumps(res["scaling"][o]), flush=True)
            if "bytes" in only:
                res["bytes"] = {o: bytes_per_lane(client, doc, o, 10_000, dt)
                                for o in ("jacobian", "advance")}
                print("bytes", json.dumps(res["bytes"]), flush=True)
        finally:
            client.close()
            cl.close()
    if "m300" in only:
        res["m300"] = m300(64 if a.quick else 256, dt)
        res["m300"]["load"] = _load()
        print("m300", json.dumps(res["m300"]), flush=True)
    if "m300" in res:
        res["plan"] = plan(res)
        print("plan", json.dumps(res["plan"]), flush=True)
    res["load_end"] = _load()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
