"""CVODE on a published mechanism over heterogeneous cells, against the
native leaf and SciPy BDF (issue #22).

The case: a box ``reaction_systems`` mechanism (SuperFast from
EarthSciModels; pass its path, it is not part of this repository) over N
cells, temperature uniform in 260-310 K, half the cells at night (every
photolysis rate 0), each initial concentration the document's times
10**U(-0.5, 0.5), one hour with outputs every 10 minutes, rtol 1e-4.

Every route is checked against a tight reference (SciPy Radau, rtol 1e-10)
on a 16-cell subset of the same cells before its CPU time (``time.thread_time``,
one thread, each route once, in the order CVODE, leaf, BDF) is reported with
the load average::

    PYTHONPATH=src python benchmarks/cvode_hetero.py --mech superfast.esm --cells 1000
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import time
import warnings

import numpy as np

from esmjac.models.mechanism import box, lift, mechanism_doc

RTOL = 1e-4
TOUT = np.linspace(0.0, 3600.0, 7)
FLOOR = 1e-6                    # ppb: relative errors below this level are not counted


def _subst(e, env):
    if isinstance(e, str):
        return env.get(e, e)
    if isinstance(e, list):
        return [_subst(x, env) for x in e]
    if isinstance(e, dict):
        return {k: _subst(v, env) for k, v in e.items()}
    return e


def _expand(e, templates):
    if isinstance(e, list):
        return [_expand(x, templates) for x in e]
    if isinstance(e, dict):
        if e.get("op") == "apply_expression_template":
            body = copy.deepcopy(templates[e["name"]]["body"])
            return _expand(_subst(body, e["bindings"]), templates)
        return {k: _expand(v, templates) for k, v in e.items()}
    return e


def box_mechanism(path: str) -> tuple:
    """(box document, species defaults, parameter defaults) of the first
    reaction system of an esm ``reaction_systems`` file: constant species
    become parameters, expression templates are expanded."""
    with open(path) as fh:
        rs = next(iter(json.load(fh)["reaction_systems"].values()))
    tmpl = rs.get("expression_templates", {})
    species = {k: float(v["default"]) for k, v in rs["species"].items() if not v.get("constant")}
    params = {k: float(v["default"]) for k, v in rs["species"].items() if v.get("constant")}
    params.update({k: float(v["default"]) for k, v in rs["parameters"].items()})
    rx = []
    for r in rs["reactions"]:
        reac = [s["species"] for s in r["substrates"] for _ in range(int(s["stoichiometry"]))]
        prods: dict = {}
        for s in r["products"]:
            prods[s["species"]] = prods.get(s["species"], 0) + s["stoichiometry"]
        rx.append({"id": r["id"], "reactants": reac, "products": prods, "rate": _expand(r["rate"], tmpl)})
    return box(mechanism_doc("Mech", species, params, rx, 1)), species, params


def case(path: str, n: int, seed: int = 0) -> tuple:
    """(document over n cells, y0 dict, forcing dict) of the heterogeneous case."""
    bdoc, species, params = box_mechanism(path)
    photo = [p for p in params if p.startswith("j")]
    doc = lift(bdoc, n, cell_parameters=["T"] + photo)
    rng = np.random.default_rng(seed)
    night = np.zeros(n, dtype=bool)
    night[rng.permutation(n)[: n // 2]] = True
    forcing = {"T": rng.uniform(260.0, 310.0, n)}
    for p in photo:
        forcing[p] = np.where(night, 0.0, params[p])
    y0 = {s: v * 10 ** rng.uniform(-0.5, 0.5, n) for s, v in species.items()}
    return doc, y0, forcing


def _subset(path, n, idx, seed):
    doc, y0, forcing = case(path, n, seed)
    sub = lift(doc, len(idx))
    return sub, {k: v[idx] for k, v in y0.items()}, {k: v[idx] for k, v in forcing.items()}


def _err(y, ref):
    return float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), FLOOR)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mech", required=True, help="a reaction_systems .esm file (e.g. SuperFast)")
    ap.add_argument("--cells", type=int, default=1000)
    ap.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance (the document's units)")
    ap.add_argument("--routes", default="cvode,cvode-nonneg,leaf,bdf")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from esmjac.adapters.native import rosenbrock
    from esmjac.adapters.scipy import ivp
    from esmjac.adapters.sundials import cvode
    n = args.cells
    doc, y0, forcing = case(args.mech, n)
    idx = np.linspace(0, n - 1, 16).astype(int)
    sdoc, sy0, sforcing = _subset(args.mech, n, idx, 0)
    ref = ivp(sdoc, y0=sy0, forcing=sforcing, method="Radau").solve(
        (TOUT[0], TOUT[-1]), t_eval=TOUT[[-1]], rtol=1e-10, atol=1e-16)
    assert ref.status == 0, ref.message
    yref = ref.y[:, -1]
    ns = yref.size // len(idx)
    print(f"cells {n}, species {ns}, rtol {RTOL}, atol {args.atol}, load {os.getloadavg()}")
    for route in args.routes.split(","):
        t0 = time.thread_time()
        try:
            if route.startswith("cvode"):
                prob = cvode(doc, y0=y0, forcing=forcing, rtol=RTOL, atol=args.atol, threads=1,
                             negative="read_as_zero" if route.endswith("nonneg") else "allow")
                t0 = time.thread_time()
                res = prob.solve(TOUT)
                y = np.asarray(res.values.y)[-1]
                info = {k: prob.stats()[k] for k in ("NumSteps", "NumErrTestFails", "NumPrecEvals",
                                                     "NumLinIters", "nnegative")}
            elif route == "leaf":
                leaf = rosenbrock(doc, rtol=RTOL, threads=1)      # atol: relative to each species' scale
                t0 = time.thread_time()
                sol = leaf.solve((TOUT[0], TOUT[-1]), y0=y0, t_eval=TOUT, forcing=forcing)
                assert sol.success, sol.message
                y = np.asarray(sol.y)
                info = {"nsteps": sol.nsteps, "njev": sol.njev}
            else:
                prob = ivp(doc, y0=y0, forcing=forcing, threads=1)
                t0 = time.thread_time()
                sol = prob.solve((TOUT[0], TOUT[-1]), t_eval=TOUT, method="BDF", rtol=RTOL, atol=args.atol)
                assert sol.status == 0, sol.message
                y = sol.y[:, -1]
                info = {"nfev": sol.nfev, "njev": sol.njev}
            cpu = time.thread_time() - t0
            got = y.reshape(ns, n)[:, idx].ravel()
            print(f"{route:18s} CPU {cpu:8.2f} s  max rel err vs Radau (16 cells, floor {FLOOR:g}) "
                  f"{_err(got, yref):.1e}  {info}", flush=True)
        except Exception as exc:            # noqa: BLE001 - a route that fails is reported, not fatal
            print(f"{route:18s} FAILED after {time.thread_time() - t0:.2f} s CPU: "
                  f"{type(exc).__name__}: {str(exc)[:300]}", flush=True)
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
