"""Emission: deterministic JSON of the bands and the ``jacobians`` block.

* :func:`band_json` / :func:`entries_json` — the band list as the spec's §4
  entries (deterministic: sorted keys, no whitespace, integral floats as
  integers, reference float spelling).
* :func:`cse_templates` — greedy largest-first extraction of repeated
  coefficient subtrees into zero-parameter ``expression_templates``
  (``jt1``, ``jt2``, … in extraction order; ties go to the subtree met
  first in a post-order walk of the coefficients in band order).
* :func:`block_json` — the whole block: entries after CSE, ``structure``,
  templates, the ``block_diagonal_lu`` factorization when one applies, and
  ``wrt``.

The array-expression op is spelled ``aggregate`` by default, as the
reference goldens spell it (pass ``agg_spelling="faq"`` for esm ≥ 1.1.0).
"""
from __future__ import annotations

from typing import Any

from ..errors import JacError
from ..model.expr import Node, iter_children, map_children, node, node_count, stable_json, to_wire
from ..linalg.factorization import block_lu_plan
from .structure import detect_structure

__all__ = ["band_json", "entries_json", "cse_templates", "expand_templates",
           "block_dict", "block_json"]


def band_json(entry, coef=None, agg_spelling: str = "aggregate") -> dict:
    b = entry.band
    d = {
        "row": entry.row,
        "col": entry.col,
        "rows": [[lo, hi] for lo, hi in b.rows],
        "row_idx": list(b.ridx),
        "col_idx": [to_wire(c, agg_spelling) for c in b.cidx],
        "coef": to_wire(b.coef if coef is None else coef, agg_spelling),
    }
    if b.contracted:
        d["contracted"] = [[n, lo, hi] for n, lo, hi in b.contracted]
    return d


def entries_json(entries, agg_spelling: str = "aggregate") -> str:
    """The band list as deterministic JSON (``*.bands.json``)."""
    return stable_json([band_json(e, agg_spelling=agg_spelling) for e in entries])


def _template_ref(name: str) -> Node:
    return node("apply_expression_template", (), name=name)


def cse_templates(exprs: list, min_nodes: int = 12, prefix: str = "jt"):
    """Factor repeated subtrees (≥ ``min_nodes`` nodes, ≥ 2 occurrences)
    into templates; returns ``(templates: dict name → body, rewritten)``."""
    work = list(exprs)
    nin = len(work)
    names: list = []
    while True:
        order, counts = _census(work)
        best = None
        for x in order:
            if counts[x] < 2 or node_count(x) < min_nodes or x.op == "apply_expression_template":
                continue
            if best is None or node_count(x) > node_count(best):
                best = x
        if best is None:
            break
        name = f"{prefix}{len(names) + 1}"
        names.append(name)
        ref = _template_ref(name)
        work = [_replace(e, best, ref, {}) for e in work]
        work.append(best)      # the body joins the pool: later rounds may factor it
    return {n: work[nin + k] for k, n in enumerate(names)}, work[:nin]


def _census(work):
    """Distinct nodes in first post-order completion order, and each node's
    occurrence count over the trees (multiplicity, not DAG sharing)."""
    order: list = []
    seen: set = set()
    for root in work:
        if not isinstance(root, Node) or root in seen:
            continue
        stack = [(root, False)]
        while stack:
            x, done = stack.pop()
            if done:
                order.append(x)
                continue
            if x in seen:
                continue
            seen.add(x)
            stack.append((x, True))
            kids = [c for c in iter_children(x) if isinstance(c, Node)]
            for c in reversed(kids):
                if c not in seen:
                    stack.append((c, False))
    # With a visited set, each node completes where a plain tree walk would
    # first complete it, so ``order`` is the reference's interning order.
    counts = {x: 0 for x in order}
    for root in work:
        if isinstance(root, Node):
            counts[root] += 1
    for x in reversed(order):          # parents before children
        mult = counts[x]
        if mult:
            for k in iter_children(x):
                if isinstance(k, Node):
                    counts[k] += mult
    return order, counts


def _replace(e, target, ref, memo):
    if e is target:
        return ref
    if not isinstance(e, Node):
        return e
    r = memo.get(e)
    if r is None:
        r = map_children(e, lambda c: _replace(c, target, ref, memo))
        memo[e] = r
    return r


def expand_templates(e, registry: dict):
    """Inverse of :func:`cse_templates`: substitute every reference."""
    if not isinstance(e, Node):
        return e
    if e.op == "apply_expression_template":
        name = e.attr("name")
        if name not in registry:
            raise JacError("bad_argument", f"template reference `{name}` is not in the block")
        return expand_templates(registry[name], registry)
    return map_children(e, lambda c: expand_templates(c, registry))


def block_dict(entries, shapes: dict, wrt: str, *, cse: bool = True,
               cse_min_nodes: int = 12, agg_spelling: str = "aggregate") -> dict:
    """The ``jacobians`` block of one model as a JSON-able dict."""
    structure = detect_structure(entries, shapes)
    coefs = [e.band.coef for e in entries]
    templates: dict = {}
    if cse:
        templates, coefs = cse_templates(coefs, min_nodes=cse_min_nodes)
    block: dict[str, Any] = {
        "wrt": wrt,
        "entries": [band_json(e, c, agg_spelling) for e, c in zip(entries, coefs)],
        "structure": structure,
    }
    if templates:
        block["expression_templates"] = {
            n: {"params": [], "body": to_wire(b, agg_spelling)} for n, b in templates.items()}
    if structure == "block_diagonal":
        block["factorization"] = block_lu_plan(entries).to_json()
    return block


def block_json(entries, shapes: dict, wrt: str, **kw) -> str:
    return stable_json(block_dict(entries, shapes, wrt, **kw))
