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
