"""Mass-action chemistry mechanisms as per-cell ``.esm`` documents.

* :func:`mechanism_doc` writes any reaction list (reactants, products, a
  scalar rate-constant expression) as one ``faq`` ODE per species over the
  index set ``cell``; sums are n-ary ``+`` nodes, never binary chains.
* :func:`synthetic_mechanism` draws a random but chemically plausible
  mechanism (unimolecular decays/photolyses and bimolecular reactions, a few
  with a constant third body, each with an Arrhenius rate ``k0*exp(-E/T)``
  over scalar parameters) — deterministic for a seed.
* :func:`lift` resizes the ``cell`` index set of any per-cell document, or
  lifts a scalar box mechanism (:func:`box`) onto ``n_cells`` cells.
* :func:`box` writes a per-cell document as the scalar (0-D) box mechanism
  chemists publish: no index set, every variable a scalar.

A reaction is a dict ``{"id", "reactants": [names, repeated for
multiplicity], "products": {name: coefficient}, "rate": <scalar AST>}``.
Reactants that are parameters (constant species such as O2, M, H2O) only
multiply the rate; every other name is an unknown with a ``D(X)`` equation.
"""
from __future__ import annotations

import copy
import numbers
import random
from collections import Counter
from typing import Any

from ..errors import JacError

__all__ = ["mechanism_doc", "synthetic_mechanism", "lift", "box", "couplings", "CELL"]

#: The index set every generated document is defined over.
CELL = "cell"


def _idx(name: str) -> dict:
    return {"op": "index", "args": [name, "i"]}


def _num(x: float):
    """A JSON number; integral floats as ints (``2`` rather than ``2.0``)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return int(x)
    return x


def net_stoichiometry(rx: dict) -> Counter:
    """Net coefficient (products − reactants) of each name in a reaction."""
    net: Counter[str] = Counter()
    for r in rx["reactants"]:
        net[r] -= 1
    for p, c in rx["products"].items():
        net[p] += c
    return net


def couplings(reactions: list, species) -> set:
    """The (row, column) pairs of the Jacobian of the mass-action ODEs, from
    the reaction list alone: a species whose net coefficient in a reaction is
    non-zero couples to every unknown reactant of that reaction."""
    species = set(species)
    out: set[tuple[str, str]] = set()
    for rx in reactions:
        cols = {r for r in rx["reactants"] if r in species}
        for s, c in net_stoichiometry(rx).items():
            if c != 0 and s in species:
                out.update((s, col) for col in cols)
    return out


def _rate_term(coef, rx: dict, species: set, cell_params: set):
    """``coef * k * Π reactants`` as one flat ``*`` node (per cell)."""
    factors = [] if coef == 1 else [_num(coef)]
    k = rx["rate"]
    if isinstance(k, dict) and k.get("op") == "*":
        factors.extend(k["args"])
    else:
        factors.append(k)
    for r in rx["reactants"]:
        factors.append(_idx(r) if (r in species or r in cell_params) else r)
    return factors[0] if len(factors) == 1 else {"op": "*", "args": factors}


def mechanism_doc(name: str, species: dict, parameters: dict, reactions: list, n_cells: int,
                  *, description: str = "", cell_parameters: dict | None = None,
                  units: dict | None = None, metadata: dict | None = None) -> dict:
    """An esm 1.1.0 document with one model ``name``: ``species`` maps each
    unknown to its default, ``parameters`` each scalar parameter to its
    default, ``cell_parameters`` each per-cell parameter (shape ``[cell]``)."""
    cell_parameters = cell_parameters or {}
    units = units or {}
    sp = set(species)
    terms: dict[str, list[object]] = {s: [] for s in species}
    for rx in reactions:
        for s, c in net_stoichiometry(rx).items():
            if c != 0 and s in sp:
                terms[s].append(_rate_term(c, rx, sp, set(cell_parameters)))
    variables = {}
    for s, d in species.items():
        variables[s] = {"type": "unknown", "shape": [CELL], "default": d}
        if s in units:
            variables[s]["units"] = units[s]
    for p, d in cell_parameters.items():
        variables[p] = {"type": "parameter", "shape": [CELL], "default": d}
        if p in units:
            variables[p]["units"] = units[p]
    for p, d in parameters.items():
        variables[p] = {"type": "parameter", "default": d}
        if p in units:
            variables[p]["units"] = units[p]
    equations = []
    for s in species:
        ts = terms[s]
        if not ts:
            raise ValueError(f"species {s!r} takes part in no reaction")
        body = ts[0] if len(ts) == 1 else {"op": "+", "args": ts}
        equations.append({
            "lhs": {"op": "D", "args": [s], "wrt": "t"},
            "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                    "ranges": {"i": {"from": CELL}}, "expr": body},
        })
    meta = {"name": name}
    if description:
        meta["description"] = description
    meta.update(metadata or {})
    return {
        "esm": "1.1.0",
        "metadata": meta,
        "index_sets": {CELL: {"kind": "interval", "size": int(n_cells)}},
        "models": {name: {"variables": variables, "equations": equations}},
    }


def arrhenius(k0, e) -> dict:
    """``k0 * exp(-e / T)`` (``k0``, ``e``: parameter names or numbers)."""
    if isinstance(e, (int, float)):
        if e == 0:
            return k0
        neg = _num(-float(e))
    else:
        neg = {"op": "*", "args": [-1, e]}
    return {"op": "*", "args": [k0, {"op": "exp", "args": [{"op": "/", "args": [neg, "T"]}]}]}


def synthetic_mechanism(n_species: int, n_reactions: int, n_cells: int, seed: int = 0,
                        return_reactions: bool = False):
    """A random mass-action mechanism as an esm dict (deterministic in
    ``seed``). With ``return_reactions`` the result is ``(doc, reactions)``.

    About 25 % of the reactions are unimolecular (``A -> products``, k0 in
    1e-4..1 s^-1), about 10 % bimolecular with a constant partner (``A + M``
    or ``A + O2``), the rest bimolecular between two unknowns (k0 in
    1e-13..1e-10 cm^3 s^-1, a few self-reactions ``A + A``). Activation
    temperatures E lie in -500..2500 K; products are 1-3 unknowns distinct
    from the reactants. Every species is the first reactant of some reaction
    when ``n_reactions >= n_species``, and takes part in at least one.
    """
    if n_species < 2 or n_reactions < 1 or n_cells < 1:
        raise ValueError("need n_species >= 2, n_reactions >= 1, n_cells >= 1")
    rng = random.Random(seed)
    names = [f"S{i:03d}" for i in range(n_species)]
    order = names[:]
    rng.shuffle(order)
    reactions: list[dict[str, Any]] = []   # JSON reaction records
    params = {"T": 298.0, "M": 2.46e19, "O2": 5.15e18}
    for r in range(n_reactions):
        a = order[r % n_species] if r < n_species else rng.choice(names)
        u = rng.random()
        if u < 0.25:
            reactants = [a]
            k0 = 10 ** rng.uniform(-4, 0)
        elif u < 0.35:
            reactants = [a, rng.choice(["M", "O2"])]
            k0 = 10 ** rng.uniform(-17, -14)
        else:
            b = a if rng.random() < 0.05 else rng.choice([n for n in names if n != a])
            reactants = [a, b]
            k0 = 10 ** rng.uniform(-13, -10)
        e = round(rng.uniform(-500.0, 2500.0), 1)
        pool = [n for n in names if n not in reactants]
        n_prod = min(len(pool), rng.choice((1, 1, 2, 2, 3)))
        prods = rng.sample(pool, n_prod)
        products = {p: (2 if rng.random() < 0.1 else 1) for p in prods}
        rid = f"R{r + 1:04d}"
        params[f"k0_{rid}"] = float(f"{k0:.3e}")
        params[f"E_{rid}"] = e
        reactions.append({"id": rid, "reactants": reactants, "products": products,
                          "rate": arrhenius(f"k0_{rid}", f"E_{rid}")})
    seen = {n for rx in reactions for n in list(rx["reactants"]) + list(rx["products"])}
    for s in names:                                      # n_reactions < n_species
        if s not in seen:
            rx = rng.choice(reactions)
            if s not in rx["reactants"]:
                rx["products"][s] = 1
    species = {s: float(f"{10 ** rng.uniform(8, 12):.3e}") for s in names}
    doc = mechanism_doc(
        "Chem", species, params, reactions, n_cells,
        description=(f"Synthetic mass-action mechanism (seed {seed}): {n_species} species, "
                     f"{n_reactions} reactions, {n_cells} cells; concentrations in molecules cm^-3, "
                     "Arrhenius rates k0*exp(-E/T)."))
    return (doc, reactions) if return_reactions else doc


def lift(doc: dict, n_cells: int, cell_parameters=()) -> dict:
    """A copy of a per-cell document with its ``cell`` index set resized, or
    of a box mechanism (no ``cell`` index set, scalar variables; see
    :func:`box`) lifted onto ``n_cells`` cells: every unknown becomes a
    ``[cell]`` array and each ``D(X) = rhs`` a ``faq`` over the cells.

    ``cell_parameters`` (box mechanisms only) names scalar parameters that
    become ``[cell]`` arrays too (the array twin of ``options={"per_lane":
    [...]}``). Array-valued defaults of ``cell``-shaped variables are cycled
    or cut to the new length; scalar defaults are kept (they broadcast)."""
    if isinstance(n_cells, bool) or not isinstance(n_cells, numbers.Integral) or n_cells < 1:
        raise JacError("bad_argument", f"lift: n_cells must be an integer >= 1, got {n_cells!r}")
    models = doc.get("models") if isinstance(doc, dict) else None
    if not models:
        what = "a reaction_systems document" if isinstance(doc, dict) and doc.get("reaction_systems") \
            else "a document without models"
        raise JacError("bad_argument",
                       f"lift: {what} has no model equations to lift (lift rewrites `models` only and "
                       "would return it unchanged). A box mechanism needs no lifting: it is a cell "
                       "program of any lane count -- RhsProgram/JacobianProgram.build(doc, "
                       "options={'per_lane': ['T', ...]}) with new_buffers(lanes)/new_workspace(lanes), "
                       "or esmjac.adapters.dask with per_cell=[...] over a gridded Dataset")
    if doc.get("reaction_systems"):
        raise JacError("bad_argument", "lift: the document has reaction_systems beside its models; lift "
                                       "rewrites models only (the reaction systems would stay one box): "
                                       "build it as a cell program instead (options={'per_lane': [...]})")
    out = copy.deepcopy(doc)
    sets = out.setdefault("index_sets", {})
    if CELL not in sets:
        _lift_box(out, set(cell_parameters))
    elif cell_parameters:
        raise JacError("bad_argument", "lift: cell_parameters applies to box mechanisms only")
    sets[CELL]["size"] = int(n_cells)
    for model in out.get("models", {}).values():
        for var in model.get("variables", {}).values():
            d = var.get("default")
            if var.get("shape") == [CELL] and isinstance(d, list) and d:
                var["default"] = [d[i % len(d)] for i in range(n_cells)]
    return out


def _map_names(e, fn):
    """``e`` (esm JSON expression) with every bare name ``n`` replaced by ``fn(n)``."""
    if isinstance(e, str):
        return fn(e)
    if isinstance(e, list):
        return [_map_names(x, fn) for x in e]
    if isinstance(e, dict):
        out = dict(e)
        if "args" in out:
            if out.get("op") == "index":
                out["args"] = [out["args"][0]] + [_map_names(x, fn) for x in out["args"][1:]]
            elif out.get("op") != "D":
                out["args"] = [_map_names(x, fn) for x in out["args"]]
        if "expr" in out:
            out["expr"] = _map_names(out["expr"], fn)
        return out
    return e


def _lift_box(doc: dict, cell_params: set) -> None:
    """In place: a box mechanism as a one-cell per-cell document."""
    doc["index_sets"][CELL] = {"kind": "interval", "size": 1}
    for model in doc.get("models", {}).values():
        vs = model.get("variables", {})
        if any(v.get("shape") for v in vs.values()):
            raise JacError("bad_argument",
                           "lift: a document without a `cell` index set must be a scalar box mechanism")
        unknowns = {n for n, v in vs.items() if v.get("type") in ("unknown", "state")}
        missing = cell_params - {n for n, v in vs.items() if v.get("type") == "parameter"}
        if missing:
            raise JacError("bad_argument", f"lift: {sorted(missing)} are not parameters")
        unknowns |= cell_params
        for n in unknowns:
            vs[n]["shape"] = [CELL]
        eqs = []
        for eq in model.get("equations", []):
            lhs = eq["lhs"]
            if not (isinstance(lhs, dict) and lhs.get("op") == "D"):
                raise JacError("bad_argument", "lift: only D(X) = rhs equations are lifted")
            body = _map_names(eq["rhs"], lambda n: _idx(n) if n in unknowns else n)
            eqs.append({**eq, "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                      "ranges": {"i": {"from": CELL}}, "expr": body}})
        model["equations"] = eqs


def box(doc: dict) -> dict:
    """A per-cell document (one ``faq`` over ``cell`` per equation) as a
    scalar box mechanism: the ``cell`` index set dropped, every ``[cell]``
    variable a scalar (an array default keeps its first value), reads
    ``X[i]`` as ``X``. ``lift(box(doc), n)`` is ``lift(doc, n)`` up to the
    per-cell defaults."""
    out = copy.deepcopy(doc)
    out.get("index_sets", {}).pop(CELL, None)
    if not out.get("index_sets"):
        out.pop("index_sets", None)

    def unindex(e):
        if isinstance(e, list):
            return [unindex(x) for x in e]
        if isinstance(e, dict):
            if e.get("op") == "index" and len(e.get("args", ())) == 2 and e["args"][1] == "i":
                return e["args"][0]
            d = dict(e)
            if "args" in d:
                d["args"] = unindex(d["args"])
            if "expr" in d:
                d["expr"] = unindex(d["expr"])
            return d
        return e

    for model in out.get("models", {}).values():
        for var in model.get("variables", {}).values():
            if var.get("shape") == [CELL]:
                del var["shape"]
                if isinstance(var.get("default"), list):
                    var["default"] = var["default"][0]
        eqs = []
        for eq in model.get("equations", []):
            rhs = eq["rhs"]
            if isinstance(rhs, dict) and rhs.get("op") in ("faq", "aggregate") and \
                    rhs.get("output_idx") == ["i"]:
                rhs = rhs["expr"]
            eqs.append({**eq, "rhs": unindex(rhs)})
        model["equations"] = eqs
    return out


if __name__ == "__main__":                               # quick smoke run
    import json
    import sys
    import time
    t0 = time.perf_counter()
    d = synthetic_mechanism(300, 800, 8)
    dt = time.perf_counter() - t0
    txt = json.dumps(d)
    print(f"300 species / 800 reactions generated in {dt * 1e3:.1f} ms, {len(txt)} bytes",
          file=sys.stderr)
