"""The published GEOS-Chem fullchem box mechanism as a document esmjac loads.

The EarthSciML/EarthSciModels file (``geoschem_fullchem.esm``, esm 0.4.0,
one ``reaction_systems`` entry: 275 species of which 3 are held constant,
819 reactions, 10 ``expression_templates``) is never vendored here: pass its
path. earthsci-ast 0.5 refuses it as it is (0.x documents are not migrated
across the 1.0.0 break; the 0.4.0 ``examples`` block is not in the 1.x
schema) and, once those are mended, its ``flatten`` recurses past Python's
limit on the reaction system's mass-action lowering (one binary ``+`` chain
per species, hundreds of terms deep). :func:`convert` therefore writes the
mass-action ODEs itself, with earthsci-ast 0.5's own semantics
(``earthsci_ast.reactions.lower_reactions_to_equations``: rate =
``k · Π Sᵢ^nᵢ`` without factorials, net stoichiometry per species, constant
species get no equation but still multiply rates) as n-ary sums, and inlines
the expression templates (pure substitution of their bindings). The result is
a scalar box model (esm 1.1.0, one ``models`` entry; unknowns in the source's
species order) that :func:`esmjac.models.mechanism.lift` puts on cells.

    python benchmarks/gcmech.py [SRC] [DST]

defaults: ``$ESMJAC_GC_MECH`` or ``geoschem_fullchem.esm`` (the current folder) →
``geoschem_fullchem_v1.esm`` beside it.

Units are the source's: species in ppb-like mixing ratios scaled by
``num_density`` (mol m⁻³) inside the rate laws; photolysis ``j_*`` in s⁻¹;
the published defaults of every ``j_*``, ``k_mt*`` (aerosol mass transfer)
and ``k_cld*`` (cloud uptake) are 0, and several species default to 0 — with
those defaults rates such as ``k_mt1/SALAAL`` (R1) and ``k_cld6/SO2`` are
0/0: the benchmark sets them (see realworkload.py).
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

DEFAULT_SRC = "geoschem_fullchem.esm"        # in the current folder: no machine's path
DEFAULT_DST = "geoschem_fullchem_v1.esm"


def _subst(e, bind: dict):
    if isinstance(e, str):
        return bind.get(e, e)
    if isinstance(e, list):
        return [_subst(x, bind) for x in e]
    if isinstance(e, dict):
        return {k: (_subst(v, bind) if k in ("args", "expr") else v) for k, v in e.items()}
    return e


def _inline(e, templates: dict):
    """``e`` with every ``apply_expression_template`` replaced by its body."""
    if isinstance(e, list):
        return [_inline(x, templates) for x in e]
    if not isinstance(e, dict):
        return e
    if e.get("op") == "apply_expression_template":
        t = templates[e["name"]]
        if e.get("args"):
            raise ValueError(f"template {e['name']}: positional args are not handled")
        bind = {k: _inline(v, templates) for k, v in e.get("bindings", {}).items()}
        if set(bind) != set(t["params"]):
            raise ValueError(f"template {e['name']}: bindings {sorted(bind)} != params {t['params']}")
        return _inline(_subst(t["body"], bind), templates)
    out = dict(e)
    if "args" in out:
        out["args"] = [_inline(x, templates) for x in out["args"]]
    if "expr" in out:
        out["expr"] = _inline(out["expr"], templates)
    return out


def _num(x):
    return int(x) if isinstance(x, float) and x.is_integer() and abs(x) < 1e15 else x


def box_document(src: dict) -> dict:
    """The esm 1.1.0 scalar box model of a one-system ``reaction_systems`` document."""
    (name, rs), = src["reaction_systems"].items()
    templates = rs.get("expression_templates", {})
    species = rs["species"]
    const = {s for s, v in species.items() if v.get("constant")}
    variables = {}
    for s, v in species.items():
        variables[s] = {"type": "parameter" if s in const else "unknown", "default": v.get("default", 0)}
    for p, v in rs["parameters"].items():
        if p in variables:
            raise ValueError(f"{p} is both a species and a parameter")
        variables[p] = {"type": "parameter", "default": v.get("default", 0)}
    terms = {s: [] for s in species if s not in const}
    for rx in rs["reactions"]:
        k = _inline(rx["rate"], templates)
        subs = Counter()
        for s in rx.get("substrates") or []:
            subs[s["species"]] += s["stoichiometry"]
        prods = Counter()
        for s in rx.get("products") or []:
            prods[s["species"]] += s["stoichiometry"]
        factors = list(k["args"]) if isinstance(k, dict) and k.get("op") == "*" else [k]
        for s, c in subs.items():
            factors.append(s if c == 1 else {"op": "^", "args": [s, _num(c)]})
        for s in set(subs) | set(prods):
            net = prods[s] - subs[s]
            if net == 0 or s in const:
                continue
            f = factors if net == 1 else [_num(net)] + factors
            terms[s].append(f[0] if len(f) == 1 else {"op": "*", "args": list(f)})
    eqs = []
    for s, ts in terms.items():
        if not ts:
            continue
        rhs = ts[0] if len(ts) == 1 else {"op": "+", "args": ts}
        eqs.append({"lhs": {"op": "D", "args": [s], "wrt": "t"}, "rhs": rhs})
    # species with no net rate would be states without an equation: keep them as parameters
    for s in species:
        if s not in const and not terms[s]:
            variables[s]["type"] = "parameter"
    meta = dict(src.get("metadata", {}))
    meta["description"] = (f"{meta.get('description', '')} [Converted for esmjac's benchmarks from the esm "
                           f"{src.get('esm')} reaction system `{name}`: mass-action ODEs written as n-ary sums, "
                           "expression templates inlined (benchmarks/gcmech.py).]").strip()
    return {"esm": "1.1.0", "metadata": meta, "models": {name: {"variables": variables, "equations": eqs}}}


def convert(src: str | os.PathLike = DEFAULT_SRC, dst: str | os.PathLike | None = DEFAULT_DST) -> dict:
    """Read the published file at ``src``, write the box model to ``dst``
    (unless None) and return it."""
    doc = box_document(json.loads(Path(src).read_text()))
    if dst is not None:
        Path(dst).write_text(json.dumps(doc))
    return doc


def summary(doc: dict) -> dict:
    (m,) = doc["models"].values()
    vs = m["variables"]
    return {"unknowns": sum(v["type"] == "unknown" for v in vs.values()),
            "parameters": sum(v["type"] == "parameter" for v in vs.values()),
            "equations": len(m["equations"])}


if __name__ == "__main__":
    a = sys.argv[1:]
    src = a[0] if a else os.environ.get("ESMJAC_GC_MECH", DEFAULT_SRC)
    dst = a[1] if len(a) > 1 else str(Path(src).with_name(DEFAULT_DST))     # beside the source
    if not Path(src).exists():
        sys.exit(f"gcmech: no mechanism at {src} (fetch geoschem_fullchem.esm from EarthSciML/EarthSciModels)")
    d = convert(src, dst)
    print(f"wrote {dst}: {summary(d)}")


# --------------------------------------------------------------------------
# Rate coefficients once per chemistry step (KPP's Update_RCONST)
# --------------------------------------------------------------------------

def _free(e, out):
    if isinstance(e, str):
        out.add(e)
    elif isinstance(e, list):
        for x in e:
            _free(x, out)
    elif isinstance(e, dict):
        for k in ("args", "expr"):
            if k in e:
                _free(e[k], out)
    return out


def split_rates(doc: dict, prefix: str = "kr_") -> tuple:
    """A box model split as KPP splits it: (kinetics, rates, names).

    ``kinetics``: the same model whose every parameter-only factor of a rate
    term (e.g. ``A·exp(B/T)·num_density``, or a Troe fall-off) is a new
    parameter ``kr_<i>`` — its right-hand side and Jacobian are then pure
    mass-action polynomials. ``rates``: a box model with one unknown per
    hoisted factor whose right-hand side *is* that factor (``D(kr_i) =
    expr_i``), so the programs esmjac compiles for it evaluate every rate
    coefficient of every cell in one call, once per chemistry step while the
    conditions are constant. Identical factors are hoisted once. ``names``:
    the hoisted parameter names, in the ``rates`` model's unknown order.
    """
    (mname, m), = doc["models"].items()
    vs = m["variables"]
    states = {n for n, v in vs.items() if v["type"] in ("unknown", "state")}
    exprs: dict = {}

    def hoist(e):
        key = json.dumps(e, sort_keys=True)
        if key not in exprs:
            exprs[key] = (f"{prefix}{len(exprs)}", e)
        return exprs[key][0]

    def rewrite(e):
        if not isinstance(e, dict):
            return e
        op, a = e.get("op"), e.get("args", [])
        if op == "*":
            pure = [x for x in a if not isinstance(x, (int, float)) and not (_free(x, set()) & states)]
            rest = [rewrite(x) for x in a if isinstance(x, (int, float)) or (_free(x, set()) & states)]
            if len(pure) >= 1 and not (len(pure) == 1 and isinstance(pure[0], str)):
                k = hoist(pure[0] if len(pure) == 1 else {"op": "*", "args": pure})
                return {"op": "*", "args": [*rest, k]} if rest else k
            return {**e, "args": rest + pure}
        if "args" in e and not (_free(e, set()) & states) and op not in ("D",):
            return hoist(e)
        out = dict(e)
        if "args" in out:
            out["args"] = [rewrite(x) for x in a]
        return out

    eqs = [{**eq, "rhs": rewrite(eq["rhs"])} for eq in m["equations"]]
    used = set()
    for eq in eqs:
        _free(eq["rhs"], used)
    kin_vars = {n: v for n, v in vs.items() if n in states or n in used}
    for name, _ in exprs.values():
        kin_vars[name] = {"type": "parameter", "default": 0.0}
    kinetics = {**doc, "models": {mname: {"variables": kin_vars, "equations": eqs}}}
    rvars = {n: v for n, v in vs.items() if v["type"] == "parameter"}
    req = []
    for name, e in exprs.values():
        rvars[name] = {"type": "unknown", "default": 0.0}
        req.append({"lhs": {"op": "D", "args": [name], "wrt": "t"}, "rhs": e})
    rates = {**doc, "models": {mname + "Rates": {"variables": rvars, "equations": req}}}
    return kinetics, rates, [n for n, _ in exprs.values()]
