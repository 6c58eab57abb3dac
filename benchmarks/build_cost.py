"""B5 (T5): build cost against mechanism size, each measurement in fresh processes (child.py)."""
from __future__ import annotations

import json
import pathlib
import tempfile

from common import B5_CELLS, B5_SIZES, TROPO12, resize_set


def run_build(ctx) -> None:
    cases = [("tropo12", 15, 30, None)]
    if ctx.mech is None:
        ctx.skip("B5 synthetic mechanisms", "benchmarks/mechanism.py not found")
    else:
        cases += [(f"synth{ns}x{nr}", ns, nr, (ns, nr)) for ns, nr in B5_SIZES[ctx.mode]]
    largest = cases[-1][0]
    if ctx.quick:
        ctx.skip("B5 RhsProgram builds", "--quick (Jacobian builds only)")
    for name, ns, nr, synth in cases:
        if synth is None:
            doc = resize_set(json.loads(TROPO12.read_text()), {"cell": B5_CELLS})
        else:
            doc = ctx.mech.synthetic_mechanism(ns, nr, B5_CELLS, seed=0)
        d = pathlib.Path(tempfile.mkdtemp(prefix=f"b5_{name}_", dir=ctx.tmp))
        path = d / f"{name}.esm"
        path.write_text(json.dumps(doc))
        cache = d / "cache"
        cache.mkdir()
        casadi = (not ctx.quick) and name == largest
        spec = {"doc": str(path), "bench_dir": str(ctx.bench_dir) if ctx.bench_dir else None,
                "cells": B5_CELLS, "calls": 50, "rhs": not ctx.quick}
        try:
            st = ctx._child(dict(spec, mode="stages"), cache)
            cold = ctx._child(dict(spec, mode="cold"), cache)
            warm = ctx._child(dict(spec, mode="warm", casadi=casadi), cache)
        except Exception as exc:                     # noqa: BLE001
            ctx.error(f"B5 {name}", exc)
            continue
        numba_s = cold["jac_build_s"] - st["load_s"] - st["calculus_s"] - st["evaldoc_s"] - st["codegen_s"]
        common = dict(n_species=ns, n_reactions=nr, n_fields=st["n_fields"], engine=st["engine"],
                      n_statements=st["n_statements"], per_lane_s=None)
        ctx.add("B5", name, "load", "-", "-", B5_CELLS, 1, st["load_s"], **common)
        ctx.add("B5", name, "calculus", "-", "-", B5_CELLS, 1, st["calculus_s"], **common)
        ctx.add("B5", name, "evaldoc", "-", "-", B5_CELLS, 1, st["evaldoc_s"], **common)
        ctx.add("B5", name, "codegen", "-", "-", B5_CELLS, 1, st["codegen_s"], **common)
        ctx.add("B5", name, "jacobian build cold", "-", "-", B5_CELLS, 1, cold["jac_build_s"],
                 numba_compile_est_s=numba_s, **common)
        if "rhs_build_s" in cold:
            ctx.add("B5", name, "rhs build cold", "-", "-", B5_CELLS, 1, cold["rhs_build_s"],
                     **dict(common, engine=cold["rhs_engine"], n_statements=cold["rhs_statements"],
                            chunks=cold["rhs_chunks"]))
        ctx.add("B5", name, "jacobian build warm (new process)", "-", "-", B5_CELLS, 1,
                 warm["jac_build_s"], **common)
        ctx.add("B5", name, "jacobian build warm (same process)", "-", "-", B5_CELLS, 1,
                 warm["jac_rebuild_inproc_s"], **common)
        if "rhs_build_s" in warm:
            ctx.add("B5", name, "rhs build warm (new process)", "-", "-", B5_CELLS, 1, warm["rhs_build_s"],
                     **common)
        for lay, (tp, nnz) in warm["plans"].items():
            ctx.add("plan", name, "plan build", lay, "-", B5_CELLS, 1, tp, nnz=nnz, per_lane_s=None,
                     per_nnz_s=tp / max(nnz, 1), n_species=ns)
        ev = warm.get("eval")
        if ev:
            ctx.add("B5", name, "esmjac.eval_into", "lanesparseblocks", "float64", B5_CELLS, 1, ev["median_s"],
                     min_s=ev["min_s"], n_calls=ev["n_calls"], engine=st["engine"], n_species=ns,
                     n_reactions=nr)
        ca = warm.get("casadi")
        if ca:
            if "error" in ca:
                ctx.errors.append({"what": f"B5 casadi {name}", "error": ca["error"]})
                ctx.log(f"  ERROR B5 casadi {name}: {ca['error']}")
            else:
                ctx.add("B5", name, "casadi.jac", "pattern", "float64", B5_CELLS, 1, ca["median_s"],
                         min_s=ca["min_s"], n_calls=ca["n_calls"], build_s=ca["build_s"],
                         verify_err=ca["verify_err"], route=ca["route"], n_species=ns,
                         peer_over_ours=ca["median_s"] / ev["median_s"] if ev else None)
        elif casadi is False and name == largest:
            ctx.skip(f"B5 casadi at {name}", "--quick")
