"""Verify a model's Jacobian against central finite differences of the
ecosystem's own right-hand side (``earthsci_ast.evaluate_rhs``).

This is the independent oracle: esmjac's bands and reference assembly on one
side, earthsci-ast's NumPy evaluator on the other. The stored pattern must
cover every entry the differences see.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ..calculus.bandset import BandSet
from ..model.layout import element_names, ode_states
from .oracle import assemble

__all__ = ["FDReport", "fd_check", "rhs_vector"]


@dataclass
class FDReport:
    """Worst disagreement over the checked points, and any uncovered entries."""

    n_states: int
    nnz: int
    points: int
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    uncovered: list = field(default_factory=list)
    ok: bool = True

    def summary(self) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        return (f"{verdict}: {self.n_states} states, {self.nnz} stored entries, {self.points} points; "
                f"max |J - FD| = {self.max_abs_err:.3e} (relative {self.max_rel_err:.3e}); "
                f"{len(self.uncovered)} FD entries outside the stored pattern")


def _flat(view):
    import earthsci_ast as ea
    from earthsci_ast.flatten import FlattenedSystem
    src = view.source
    if isinstance(src, FlattenedSystem):
        return src
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ea.flatten(src)


def rhs_vector(flat, names: list, y: np.ndarray, t: float, params: dict | None = None) -> np.ndarray:
    """``evaluate_rhs`` at state vector ``y`` (ordered like ``names``)."""
    import earthsci_ast as ea
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = ea.evaluate_rhs(flat, dict(zip(names, map(float, y))), t, params or {})
    return np.array([out[n] for n in names], dtype=float)


def fd_check(source, *, model: str | None = None, points: int = 3, seed: int = 0,
             rtol: float = 1e-5, lo: float = 0.2, hi: float = 1.0) -> FDReport:
    """Compare the assembled Jacobian with central differences at ``points``
    random states drawn from [lo, hi] (parameters at their defaults)."""
    bs = source if isinstance(source, BandSet) else BandSet.build(source, model, "states")
    view = bs.view
    names = element_names(view, ode_states(view))
    flat = _flat(view)
    rng = np.random.default_rng(seed)
    n = len(names)
    rep = FDReport(n, 0, points)
    if n == 0:          # nothing is integrated: there is no Jacobian to check
        return rep
    for _ in range(points):
        y = rng.uniform(lo, hi, n)
        t = float(rng.uniform(0.0, 1.0))
        a = assemble(bs, u=dict(zip(names, y)), t=t)
        assert a.rows == names, "row order differs from evaluate_rhs"
        J = a.matrix.toarray()
        pattern = a.matrix.copy()
        pattern.data[:] = 1.0
        P = pattern.toarray() != 0
        rep.nnz = int(a.matrix.nnz)
        F = np.empty((n, n))
        for j in range(n):
            h = 1e-6 * max(1.0, abs(y[j]))
            yp, ym = y.copy(), y.copy()
            yp[j] += h
            ym[j] -= h
            F[:, j] = (rhs_vector(flat, names, yp, t) - rhs_vector(flat, names, ym, t)) / (2 * h)
        scale = np.maximum(np.abs(F).max(axis=1, keepdims=True), 1e-300)
        err = np.abs(J - F)
        rep.max_abs_err = max(rep.max_abs_err, float(err.max(initial=0.0)))
        rel = err / np.maximum(np.abs(F), scale * 1e-3)
        rep.max_rel_err = max(rep.max_rel_err, float(rel.max(initial=0.0)))
        bad = err > rtol * scale + 1e-12
        seen = np.abs(F) > 1e-7 * scale
        for i, j in zip(*np.nonzero(seen & ~P)):
            rep.uncovered.append((names[i], names[j], float(F[i, j])))
        if bad.any() or rep.uncovered:
            rep.ok = False
    return rep
