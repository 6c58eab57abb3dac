"""Small hand-written .esm documents for the tests (our own)."""
from __future__ import annotations

import copy


def chem(op_tag: str = "faq", cells: int = 3) -> dict:
    """A two-species per-cell mechanism A -> B (k1), B + B -> A (k2)."""
    def idx(v):
        return {"op": "index", "args": [v, "i"]}

    def cellwise(body):
        return {"op": op_tag, "output_idx": ["i"], "args": [], "ranges": {"i": {"from": "cell"}}, "expr": body}

    return {
        "esm": "1.1.0" if op_tag == "faq" else "1.0.0",
        "metadata": {"name": "TwoSpecies"},
        "index_sets": {"cell": {"kind": "interval", "size": cells}},
        "models": {"M": {
            "variables": {
                "A": {"type": "unknown", "shape": ["cell"], "default": 1.0},
                "B": {"type": "unknown", "shape": ["cell"], "default": 0.5},
                "k1": {"type": "parameter", "default": 0.3},
                "k2": {"type": "parameter", "default": 2.0},
            },
            "equations": [
                {"lhs": {"op": "D", "args": ["A"], "wrt": "t"},
                 "rhs": cellwise({"op": "+", "args": [
                     {"op": "*", "args": [-1, "k1", idx("A")]},
                     {"op": "*", "args": ["k2", idx("B"), idx("B")]}]})},
                {"lhs": {"op": "D", "args": ["B"], "wrt": "t"},
                 "rhs": cellwise({"op": "+", "args": [
                     {"op": "*", "args": ["k1", idx("A")]},
                     {"op": "*", "args": [-2, "k2", idx("B"), idx("B")]}]})},
            ]}},
    }


def with_observed_chain(doc: dict) -> dict:
    """Add observed Q = k1 * 2 (target-independent) and R = Q * A[i] (dependent)."""
    d = copy.deepcopy(doc)
    m = d["models"]["M"]
    m["variables"]["Q"] = {"type": "unknown"}
    m["variables"]["R"] = {"type": "unknown", "shape": ["cell"]}
    m["equations"].append({"lhs": "Q", "rhs": {"op": "*", "args": ["k1", 2]}})
    m["equations"].append({"lhs": "R", "rhs": {"op": "faq", "output_idx": ["i"], "args": [],
                                               "ranges": {"i": {"from": "cell"}},
                                               "expr": {"op": "*", "args": ["Q", {"op": "index", "args": ["A", "i"]}]}}})
    # D(B) gains + R[i] * Q
    body = m["equations"][1]["rhs"]["expr"]
    body["args"].append({"op": "*", "args": [{"op": "index", "args": ["R", "i"]}, "Q"]})
    return d


def chapman(cells: int = 3) -> dict:
    """The Chapman cycle with O(¹D), stratospheric levels, molecules cm⁻³:
    O₂ at 5·10¹⁷ beside O(¹D) at 0.1 -- the badly scaled case a finite
    difference check must not false-alarm on (rates: JPL-style magnitudes)."""
    from esmjac.models.mechanism import mechanism_doc
    species = {"O2": 5.0e17, "O": 1.0e7, "O3": 3.0e12, "O1D": 0.1}
    params = {"M": 6.3e17, "j_O2": 1.0e-11, "j_O3": 4.0e-4, "j_O3_O1D": 3.0e-3,
              "k_O_O2": 6.0e-34, "k_O_O3": 8.0e-15, "k_O1D_M": 3.0e-11, "k_O1D_O3": 1.2e-10}
    reactions = [
        {"id": "R1", "reactants": ["O2"], "products": {"O": 2}, "rate": "j_O2"},
        {"id": "R2", "reactants": ["O", "O2", "M"], "products": {"O3": 1}, "rate": "k_O_O2"},
        {"id": "R3", "reactants": ["O3"], "products": {"O": 1, "O2": 1}, "rate": "j_O3"},
        {"id": "R4", "reactants": ["O", "O3"], "products": {"O2": 2}, "rate": "k_O_O3"},
        {"id": "R5", "reactants": ["O3"], "products": {"O1D": 1, "O2": 1}, "rate": "j_O3_O1D"},
        {"id": "R6", "reactants": ["O1D", "M"], "products": {"O": 1}, "rate": "k_O1D_M"},
        {"id": "R7", "reactants": ["O1D", "O3"], "products": {"O2": 2}, "rate": "k_O1D_O3"},
    ]
    return mechanism_doc("Chapman", species, params, reactions, cells,
                         description="Chapman cycle with O(1D), molecules cm^-3",
                         units={s: "molec/cm^3" for s in species})


def chem_jacobian(u, k1: float, k2: float):
    """Hand-derived state Jacobian of :func:`chem` at ``u`` (species-major,
    ``u = [A_1..A_n, B_1..B_n]``): per cell ∂f_A/∂A = -k1, ∂f_A/∂B = 2 k2 B,
    ∂f_B/∂A = k1, ∂f_B/∂B = -4 k2 B."""
    import numpy as np
    u = np.asarray(u, dtype=float)
    cells = u.size // 2
    J = np.zeros((u.size, u.size))
    for c in range(cells):
        a, b = c, cells + c
        J[a, a], J[a, b], J[b, a], J[b, b] = -k1, 2 * k2 * u[b], k1, -4 * k2 * u[b]
    return J
