"""Refusals of malformed documents that earthsci-ast accepts but that would
compile to a wrong answer or fail deep inside the build.

Run by :func:`esmjac.model.load.load_view` on every view, before any
calculus. Each refusal is ``JacError("invalid_document")`` naming the index
set, variable or equation (its state, or its position in the document):

* index-set sizes that are not positive integers up to :data:`MAX_SIZE`
  (−1, 0, 10³⁰ …), and state vectors too large to allocate;
* empty variable names, and names that are not valid Unicode (lone
  surrogates);
* non-finite numeric defaults (``1e999`` parses as inf; NaN);
* two derivative equations for one state over the same elements (they
  would be summed silently);
* literal indices out of their dimension's range (``A[99]`` on a size-4 set
  would be clamped) or with the wrong number of indices;
* operators with the wrong number of arguments (``ifelse`` with two,
  ``index`` with none, ``exp`` with two …);
* literals that are not finite or not representable as a float64;
* an unknown with no defining equation and no default (esm-spec §4.9.4,
  ``equation_count_mismatch``): earthsci-ast 0.5 integrates it from zero,
  but the document does not say what it is.
"""
from __future__ import annotations

import math
from typing import Any

from ..errors import JacError
from ..limits import workspace_limit as state_bytes_limit
from .expr import AGG, Node, iter_children, lhs_state, stable_json, to_wire

__all__ = ["validate_view", "MAX_SIZE"]

#: Largest index-set size accepted (lane and slot indices are int64; a set
#: this large is certainly a mistake in a model meant for a Jacobian).
MAX_SIZE = 2**31 - 1

#: Exact argument counts of fixed-arity operators.
_ARITY = {
    "ifelse": (3, 3), "index": (2, None), "D": (1, 1), "ic": (1, 1),
    "exp": (1, 1), "log": (1, 1), "log10": (1, 1), "sqrt": (1, 1), "abs": (1, 1), "sign": (1, 1),
    "sin": (1, 1), "cos": (1, 1), "tan": (1, 1), "asin": (1, 1), "acos": (1, 1), "atan": (1, 2),
    "sinh": (1, 1), "cosh": (1, 1), "tanh": (1, 1), "asinh": (1, 1), "acosh": (1, 1),
    "atanh": (1, 1), "floor": (1, 1), "ceil": (1, 1), "not": (1, 1),
    "atan2": (2, 2), "/": (2, None), "^": (2, 2), "pow": (2, 2), "-": (1, None),
    "<": (2, 2), "<=": (2, 2), ">": (2, 2), ">=": (2, 2), "==": (2, 2), "!=": (2, 2),
    "+": (1, None), "*": (1, None), "min": (1, None), "max": (1, None), "and": (1, None),
    "or": (1, None),
}


def _refuse(msg: str) -> JacError:
    return JacError("invalid_document", msg)


def _show(e: Any, limit: int = 120) -> str:
    try:
        s = stable_json(to_wire(e))
    except Exception:            # a node that does not even print: name its op
        s = getattr(e, "op", repr(e))
    return s if len(s) <= limit else s[:limit] + "…"


def validate_view(view) -> None:
    """Refuse a malformed model (see module docstring)."""
    _index_sets(view)
    _names(view)
    _defaults(view)
    _duplicates(view)
    _undefined(view)
    shapes = {n: v.shape for n, v in view.variables.items()}
    scalars = {n for n, v in view.variables.items() if v.kind in ("state", "parameter") and not v.shape}
    for k, (lhs, rhs) in enumerate(view.equations):
        where = _eq_name(view, k, lhs)
        for e in (lhs, rhs):
            _expression(e, shapes, scalars, where)
    for name, d in view.observed.items():
        _expression(d, shapes, scalars, f"the definition of `{name}`")


def _index_sets(view) -> None:
    src = getattr(view.source, "index_sets", None) or {}
    for name, s in dict(src).items():
        size = s.get("size") if isinstance(s, dict) else getattr(s, "size", None)
        if size is None:
            continue                    # not an interval (earthsci-ast validated its kind)
        if isinstance(size, bool) or not isinstance(size, int):
            raise _refuse(f"index set `{name}` has size {size!r}; a size is a positive integer")
        if not 1 <= size <= MAX_SIZE:
            raise _refuse(f"index set `{name}` has size {size}; sizes must be between 1 and {MAX_SIZE}")
    n = 0
    for v in view.variables.values():
        if v.kind in ("state", "parameter", "algebraic"):
            n += math.prod(v.shape) if v.shape else 1
    if 8 * n > state_bytes_limit():
        raise _refuse(f"the model's states and parameters have {n:,} elements ({8 * n:,} bytes per "
                      f"vector), over the workspace limit of {state_bytes_limit():,} bytes; check the "
                      "index-set sizes")


def _names(view) -> None:
    for name in view.variables:
        if not isinstance(name, str) or not name.strip():
            raise _refuse(f"a variable has an empty name ({name!r})")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise _refuse(f"the variable name {ascii(name)} is not valid Unicode (a lone surrogate); "
                          "a name must be encodable as UTF-8") from None


def _defaults(view) -> None:
    """A numeric default (scalar or nested list) must be finite, like a
    literal: ``1e999`` parses as inf, which no evaluation can use."""
    for name, v in view.variables.items():
        stack = [v.default]
        while stack:
            d = stack.pop()
            if isinstance(d, bool):
                continue
            if isinstance(d, float) and not math.isfinite(d):
                raise _refuse(f"variable `{name}` has a non-finite default ({d!r}); defaults must be "
                              "finite numbers")
            if isinstance(d, (list, tuple)):
                stack.extend(d)


def _eq_name(view, k: int, lhs) -> str:
    s = lhs_state(lhs)
    return f"equation {k + 1} (D({s}))" if s else f"equation {k + 1} ({_show(lhs, 60)})"


def _duplicates(view) -> None:
    seen: dict = {}
    for k, (lhs, _) in enumerate(view.equations):
        s = lhs_state(lhs)
        if s is None:
            continue
        # A bare D(u) covers every element; a lifted aggregate covers its ranges.
        cover = ("all",) if lhs.op != AGG else (lhs.attr("ranges"), lhs.attr("output_idx"))
        for k0, c0 in seen.get(s, ()):
            if c0 == cover or c0 == ("all",) or cover == ("all",):
                raise _refuse(f"state `{s}` has two derivative equations (equations {k0 + 1} and "
                              f"{k + 1}) over the same elements; they would be summed. Merge them "
                              "into one equation")
        seen.setdefault(s, []).append((k, cover))


def _undefined(view) -> None:
    defined = set(view.observed) | set(view.indexed_observed)
    for lhs, _ in view.equations:
        if isinstance(lhs, str):
            defined.add(lhs)
            continue
        s = lhs_state(lhs)
        if s is not None:
            defined.add(s)
        elif isinstance(lhs, Node) and lhs.op == "ic" and lhs.args and isinstance(lhs.args[0], str):
            defined.add(lhs.args[0])
        elif isinstance(lhs, Node) and lhs.op == AGG and isinstance(lhs.body, Node):
            a = lhs.body.args[0] if lhs.body.op in ("index", "ic") and lhs.body.args else lhs.body
            while isinstance(a, Node) and a.op == "index" and a.args:
                a = a.args[0]
            if isinstance(a, str):
                defined.add(a)
    missing = sorted(n for n, v in view.variables.items()
                     if v.kind in ("state", "algebraic") and v.default is None and n not in defined)
    if missing:
        raise _refuse(f"unknown(s) {', '.join(f'`{view.scope}{n}`' for n in missing)} have no defining "
                      "equation and no default (esm-spec §4.9.4: equation_count_mismatch); give each an "
                      "equation, or a default if it is a constant")


def _expression(root, shapes: dict, scalars: set, where: str) -> None:
    stack, seen = [root], set()
    while stack:
        e = stack.pop()
        if isinstance(e, bool):
            continue
        if isinstance(e, float):
            if not math.isfinite(e):
                raise _refuse(f"{where} has a non-finite literal {e!r}")
            continue
        if isinstance(e, int):
            if abs(e) > 2**63 - 1:
                raise _refuse(f"{where} has the integer literal {str(e)[:30]}… that no float64/int64 "
                              "can represent")
            continue
        if isinstance(e, str):
            if not e:
                raise _refuse(f"{where} refers to a variable with an empty name")
            continue
        if not isinstance(e, Node) or id(e) in seen:
            continue
        seen.add(id(e))
        ar = _ARITY.get(e.op)
        if ar is not None:
            lo, hi = ar
            n = len(e.args)
            if n < lo or (hi is not None and n > hi):
                want = f"{lo}" if lo == hi else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
                raise _refuse(f"{where}: `{e.op}` takes {want} argument(s), got {n}: {_show(e)}")
        if e.op == "index":
            if e.args and isinstance(e.args[0], str) and e.args[0] in scalars:
                raise _refuse(f"{where}: `{e.args[0]}` is a scalar and cannot be indexed: {_show(e)}")
            _literal_index(e, shapes, where)
        stack.extend(iter_children(e))


def _literal_index(e: Node, shapes: dict, where: str) -> None:
    arr = e.args[0]
    if not isinstance(arr, str) or arr not in shapes:
        return
    shape = shapes[arr]
    idx = e.args[1:]
    if shape and len(idx) != len(shape):
        raise _refuse(f"{where}: `{arr}` has {len(shape)} dimension(s) but is indexed with {len(idx)}: "
                      f"{_show(e)}")
    for d, i in enumerate(idx):
        if isinstance(i, int) and not isinstance(i, bool) and d < len(shape) and not 1 <= i <= shape[d]:
            raise _refuse(f"{where}: index {i} of `{arr}` is outside 1..{shape[d]} (dimension {d + 1}): "
                          f"{_show(e)}")
