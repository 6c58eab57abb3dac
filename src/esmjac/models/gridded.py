"""Gridded models built from the bundled mechanism and the fixtures, shared
by the demo, the examples, the benchmarks and the tests: tropo12 on a grid of
cells, tropo12 on an (x, lev) grid with transport between levels, and a 1-D
fixture put on a longer grid.
"""
from __future__ import annotations

import copy
import importlib.resources
import json

import numpy as np

__all__ = ["gridded_tropo12", "column_model", "diffusion_model", "resized_fixture", "tropo12_doc"]


def tropo12_doc() -> dict:
    """The bundled 15-species mechanism as a fresh document dict."""
    return json.loads((importlib.resources.files("esmjac") / "models" / "tropo12.esm").read_text())


def gridded_tropo12(cells: int, seed: int = 0) -> tuple:
    """(document, forcing fj per cell, y0 overrides) for tropo12 on ``cells``."""
    doc = tropo12_doc()
    doc["index_sets"]["cell"]["size"] = cells
    rng = np.random.default_rng(seed)
    fj = np.linspace(0.2, 1.0, cells)                 # dawn-to-noon photolysis across the grid
    y0 = {"NO": 2.5e10 * rng.uniform(0.3, 3.0, cells), "NO2": 1.2e11 * rng.uniform(0.3, 3.0, cells),
          "CO": 3.7e12 * rng.uniform(0.8, 1.2, cells)}
    return doc, {"fj": fj}, y0


def column_model(nx: int, nz: int, k_adv: float = 2e-4) -> dict:
    """tropo12 on an (x, lev) grid with upwind transport along ``lev`` (a global program)."""
    doc = tropo12_doc()
    doc["index_sets"] = {"x": {"kind": "interval", "size": nx}, "lev": {"kind": "interval", "size": nz}}
    chem = doc["models"]["Chem"]
    for var in chem["variables"].values():
        if var.get("shape") == ["cell"]:
            var["shape"] = ["x", "lev"]
    chem["variables"]["k_adv"] = {"type": "parameter", "default": k_adv, "units": "1/s"}

    def two_d(e):
        if isinstance(e, dict):
            if e.get("op") == "index" and len(e["args"]) == 2 and e["args"][1] == "i":
                return {**e, "args": [e["args"][0], "i", "k"]}
            return {key: two_d(val) for key, val in e.items()}
        if isinstance(e, list):
            return [two_d(x) for x in e]
        return e

    for eq in chem["equations"]:
        x = eq["lhs"]["args"][0]
        rhs = two_d(eq["rhs"])
        rhs["output_idx"] = ["i", "k"]
        rhs["ranges"] = {"i": {"from": "x"}, "k": {"from": "lev"}}
        below = {"op": "index", "args": [x, "i", {"op": "max", "args": [{"op": "-", "args": ["k", 1]}, 1]}]}
        here = {"op": "index", "args": [x, "i", "k"]}
        rhs["expr"] = {"op": "+", "args": [rhs["expr"], {"op": "*", "args": [
            "k_adv", {"op": "-", "args": [below, here]}]}]}
        eq["rhs"] = rhs
    return doc


def resized_fixture(doc: dict, sizes: dict) -> dict:
    """A transport fixture on a longer 1-D grid. The fixtures spell their
    boundary regions with literal bounds: index-set sizes grow by ``delta``
    and so do the literal region/range bounds and pinned subscripts in the
    upper half of the old grid (as ``tests/test_program.py`` does)."""
    doc = copy.deepcopy(doc)
    old = min(doc["index_sets"][n]["size"] for n in sizes)
    delta = min(sizes.values()) - old
    for name, n in sizes.items():
        doc["index_sets"][name]["size"] = n

    def bump(v):
        return v + delta if isinstance(v, int) and not isinstance(v, bool) and v > old // 2 else v

    def walk(x):
        if isinstance(x, dict):
            if "regions" in x:
                x["regions"] = [[[bump(a) for a in r] for r in reg] for reg in x["regions"]]
            if isinstance(x.get("ranges"), dict):
                for k, r in x["ranges"].items():
                    if isinstance(r, list):
                        x["ranges"][k] = [bump(a) for a in r]
            if x.get("op") == "index":
                x["args"] = [x["args"][0]] + [bump(a) for a in x["args"][1:]]
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)
    walk(doc["models"])
    return doc


def diffusion_model(n: int = 12) -> dict:
    """One species on a line: diffusion with zero-flux ends and c² decay (tridiagonal)."""
    def at(e):
        return {"op": "index", "args": ["c", e]}
    expr = {"op": "+", "args": [
        {"op": "*", "args": ["D", {"op": "+", "args": [
            at({"op": "max", "args": [{"op": "-", "args": ["i", 1]}, 1]}),
            {"op": "*", "args": [-2, at("i")]},
            at({"op": "min", "args": [{"op": "+", "args": ["i", 1]}, n]})]}]},
        {"op": "*", "args": [-1, "k", {"op": "^", "args": [at("i"), 2]}]}]}
    return {"esm": "1.1.0", "metadata": {"name": "Diffusion1D", "description": "adapter tests"},
            "index_sets": {"x": {"kind": "interval", "size": n}},
            "models": {"Tr": {"variables": {
                "c": {"type": "unknown", "shape": ["x"], "default": [1.0 + float(np.sin(i)) for i in range(n)]},
                "D": {"type": "parameter", "default": 50.0},
                "k": {"type": "parameter", "default": 0.3}},
                "equations": [{"lhs": {"op": "D", "args": ["c"], "wrt": "t"},
                               "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                       "ranges": {"i": {"from": "x"}}, "expr": expr}}]}}}
