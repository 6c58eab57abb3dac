"""Structure classification, read off the bands' column indices (never
probed numerically): ``block_diagonal`` | ``banded`` | ``general``."""
from __future__ import annotations

from ..model.expr import Node, is_lit

__all__ = ["detect_structure"]


def _offset_class(c, r) -> str:
    if isinstance(r, str):
        if c == r and isinstance(c, str):
            return "diag"
        if isinstance(c, Node) and c.op in ("+", "-") and len(c.args) == 2:
            a, b = c.args
            if a == r and isinstance(a, str) and is_lit(b):
                return "affine"
            if c.op == "+" and b == r and isinstance(b, str) and is_lit(a):
                return "affine"
        if is_lit(c):
            return "fixed"
        return "other"
    if is_lit(c):
        return "diag" if int(round(c)) == r else "fixed"
    return "other"


def detect_structure(entries, shapes: dict) -> str:
    """Classify the exact pattern (see module docstring); ``empty`` when no band."""
    if not entries:
        return "empty"
    seen_affine = False
    for en in entries:
        if (en.row in shapes) != (en.col in shapes):
            return "general"           # scalar ↔ array coupling
        b = en.band
        if not b.cidx:
            continue
        per = [_offset_class(c, r) for c, r in zip(b.cidx, b.ridx)]
        if "other" in per or "fixed" in per:
            return "general"
        seen_affine |= "affine" in per
    return "banded" if seen_affine else "block_diagonal"
