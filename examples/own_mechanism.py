"""Your own mechanism, from a reaction list to a checked Jacobian and a solve.

Run: ``python examples/own_mechanism.py`` (from anywhere; nothing but the
installed ``esmjac`` is imported). Writes ``my_mechanism.esm`` beside the
current directory's other files, checks esmjac's Jacobian against finite
differences of ``earthsci_ast.evaluate_rhs``, and solves two hours of the
NO-NO2-O3 photostationary cycle on 4 cells with SciPy's BDF.
"""
from __future__ import annotations

import json

import numpy as np

from esmjac.adapters.scipy import ivp
from esmjac.models.mechanism import mechanism_doc
from esmjac.reference.check import fd_check


def main() -> int:
    species = {"O3": 1e12, "NO": 2.5e10, "NO2": 1.2e11}          # molecules cm^-3
    params = {"j_NO2": 8e-3, "k_NO_O3": 1.8e-14}                  # 1/s, cm^3/s
    reactions = [
        {"id": "R1", "reactants": ["NO2"], "products": {"NO": 1, "O3": 1}, "rate": "j_NO2"},
        {"id": "R2", "reactants": ["NO", "O3"], "products": {"NO2": 1}, "rate": "k_NO_O3"},
    ]
    doc = mechanism_doc("Chem", species, params, reactions, n_cells=4,
                        units={s: "molec/cm^3" for s in species})
    with open("my_mechanism.esm", "w") as fh:
        json.dump(doc, fh, indent=1)
    rep = fd_check("my_mechanism.esm")
    print(rep.summary())
    if not rep.ok:
        return 1
    prob = ivp("my_mechanism.esm", y0={"NO": np.array([1e10, 2e10, 3e10, 4e10])})
    sol = prob.solve((0.0, 7200.0), rtol=1e-6, atol=1e3)
    print(f"solved: {sol.success}, {prob.nfev} RHS calls, {prob.njev} Jacobians")
    for name, value in zip(prob.names, sol.y[:, -1]):
        print(f"  {name:14s} {value:.4e}")
    return 0 if sol.success else 1


if __name__ == "__main__":
    raise SystemExit(main())
