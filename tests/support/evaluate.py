"""Scalar evaluation helpers for the tests (an oracle independent of the
compiler: esmjac's scalar evaluator over plain NumPy values)."""
from __future__ import annotations

from esmjac.model.evaluate import Decline, ev
from esmjac.model.expr import Node


def reader(values: dict):
    """``index`` reads of state/parameter arrays (1-based, out of range
    reads decline: the piece's region must never reach them)."""
    def read(e: Node, env: dict) -> float:
        head = e.args[0]
        idx = [int(ev(x, env, read)) - 1 for x in e.args[1:]]
        if isinstance(head, str):
            arr = values[head]
            if any(not 0 <= i < n for i, n in zip(idx, arr.shape)):
                raise Decline(f"read of {head}{idx} outside its extent")
            return float(arr[tuple(idx)])
        v = head.attr("value")
        for i in idx:
            v = v[i]
        return float(v)
    return read
