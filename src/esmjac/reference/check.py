"""Verify a model's Jacobian against central finite differences of the
ecosystem's own right-hand side (``earthsci_ast.evaluate_rhs``).

This is the independent oracle: esmjac's bands and reference assembly on one
side, earthsci-ast's NumPy evaluator on the other. The stored pattern must
cover every entry the differences see.

Chemistry is badly scaled (10¹⁷ molecules cm⁻³ of O₂ beside 0.1 of a
radical), so nothing here is absolute:

* **Where.** States are sampled *around the document's own state*: every
  element is its default (or initial value) times ``10**(m·ξ)``, ``ξ`` uniform
  in [-1, 1], with the magnitude ``m`` cycling through :data:`MAGNITUDES`
  (a few per cent, a factor of three, a factor of ten). An element whose
  default is zero takes its variable's largest default as its scale (1 if
  the whole variable is zero). ``lo``/``hi`` draw uniformly from [lo, hi]
  instead (the explicit, unscaled mode).
* **Steps.** Column ``j`` is differenced with ``h_j = ε^(1/3)·max(|y_j|,
  s_j)`` (the step that balances truncation and round-off for central
  differences; ``s_j`` the column's scale), rounded so that ``y_j ± h_j`` is
  exact.
* **Tolerance.** Evaluating row ``i`` of the RHS loses about ``ε·T_i``,
  where ``T_i = |f_i| + Σ_k |J_ik y_k|`` is the size of the terms being
  summed (for mass action each term is a rate times its reactants, which is
  what ``J_ik y_k`` measures). Divided by the step that noise bounds what a
  difference quotient can resolve, so entry ``(i, j)`` passes when
  ``|J_ij − FD_ij| ≤ rtol·max(|J_ij|, |FD_ij|) + 10·ε·T_i / h_j``. An entry
  FD sees above that floor outside the stored pattern is *uncovered*.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ..calculus.bandset import BandSet
from ..errors import JacError, typed_errors
from ..model.layout import element_names, ode_states, resolve_point
from .oracle import assemble

__all__ = ["FDReport", "fd_check", "rhs_vector", "MAGNITUDES"]

#: Relative perturbation magnitudes (decades) of successive check points.
MAGNITUDES = (0.02, 0.5, 1.0)

_EPS = float(np.finfo(np.float64).eps)
_STEP = _EPS ** (1.0 / 3.0)     # ≈ 6e-6: central differences' optimal relative step
_NOISE = 10.0                   # safety factor on the round-off floor


@dataclass
class FDReport:
    """Worst disagreement over the checked points, and any uncovered entries.

    ``worst`` is ``(row, column, exact, fd, relative error)`` of the entry
    closest to (or furthest past) its tolerance; ``ok`` is False on any
    mismatch or uncovered entry. A model without ODE states has nothing to
    check: ``nothing_to_check`` is True (and ``ok`` stays True: nothing failed).
    """

    n_states: int
    nnz: int
    points: int
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    uncovered: list = field(default_factory=list)
    ok: bool = True
    worst: tuple | None = None
    mismatches: int = 0
    sampling: str = "around the document's state"

    @property
    def nothing_to_check(self) -> bool:
        return self.n_states == 0

    def summary(self) -> str:
        if self.nothing_to_check:
            return "nothing to check: no ODE states (the document integrates no state variables)"
        verdict = "OK" if self.ok else "MISMATCH"
        out = (f"{verdict}: {self.n_states} states, {self.nnz} stored entries, {self.points} point(s) "
               f"{self.sampling}")
        if self.worst is not None:
            r, c, a, f, rel = self.worst
            what = "furthest outside tolerance" if self.mismatches else "largest relative error"
            out += (f"; {what} {rel:.1e} at d {r} / d {c} (exact {a:.6e}, "
                    f"finite differences {f:.6e})")
        if self.mismatches:
            out += f"; {self.mismatches} entries outside tolerance"
        if self.uncovered:
            out += f"; {len(self.uncovered)} FD entries outside the stored pattern"
        return out


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


def _reference_state(view, states: list) -> tuple:
    """(document state, per-element scale) in ``element_names`` order."""
    try:
        pt = resolve_point(view, None, None, 0.0, states)
        parts = [np.ravel(np.asarray(pt.values[s], dtype=float)) for s in states]
    except JacError:            # no usable defaults: unit scale
        parts = [np.ones(max(int(np.prod(view.shape(s))), 1)) for s in states]
    ref, scale = [], []
    for a in parts:
        big = float(np.max(np.abs(a), initial=0.0))
        ref.append(a)
        scale.append(np.where(a != 0.0, np.abs(a), big if big > 0 else 1.0))
    return np.concatenate(ref), np.concatenate(scale)


@typed_errors
def fd_check(source, *, model: str | None = None, points: int = 3, seed: int = 0,
             rtol: float = 1e-5, lo: float | None = None, hi: float | None = None) -> FDReport:
    """Compare the assembled Jacobian with central differences of
    ``earthsci_ast.evaluate_rhs`` at ``points`` states (parameters at their
    defaults); see the module docstring for where, with which steps and to
    what tolerance. ``lo``/``hi`` (both or neither) sample uniformly from
    [lo, hi] instead of around the document's state."""
    if (lo is None) != (hi is None):
        raise JacError("bad_option", "give both lo and hi (a uniform range) or neither "
                       "(sample around the document's state)")
    if points < 1:
        raise JacError("bad_option", f"points must be >= 1, not {points}")
    bs = source if isinstance(source, BandSet) else BandSet.build(source, model, "states")
    view = bs.view
    states = ode_states(view)
    names = element_names(view, states)
    n = len(names)
    rep = FDReport(n, 0, points)
    if n == 0:          # nothing is integrated: there is no Jacobian to check
        return rep
    flat = _flat(view)
    rng = np.random.default_rng(seed)
    ref, scale = _reference_state(view, states)
    if lo is not None:
        rep.sampling = f"uniform in [{lo:g}, {hi:g}]"
        scale = np.full(n, max(abs(lo), abs(hi), 1e-300))
    else:
        rep.sampling = "around the document's state"
    pick = [(-1.0, None), (-1.0, None)]        # (score, entry): failing, largest relative
    for k in range(points):
        if lo is not None:
            y = rng.uniform(lo, hi, n)
        else:
            m = MAGNITUDES[k % len(MAGNITUDES)]
            base = np.where(ref != 0.0, ref, scale)
            y = base * 10.0 ** (m * rng.uniform(-1.0, 1.0, n))
        t = 0.0 if k == 0 else float(rng.uniform(0.0, 1.0))
        a = assemble(bs, u=dict(zip(names, y)), t=t)
        if a.rows != names:
            raise JacError("evaluation_error", "the assembled rows are not in evaluate_rhs's order")
        J = a.matrix.toarray()
        P = np.zeros((n, n), dtype=bool)
        coo = a.matrix.tocoo()
        P[coo.row, coo.col] = True
        rep.nnz = int(a.matrix.nnz)
        F = np.empty((n, n))
        h = np.empty(n)
        for j in range(n):
            hj = _STEP * max(abs(y[j]), scale[j])
            yp, ym = y.copy(), y.copy()
            yp[j] += hj
            ym[j] -= hj
            hj = 0.5 * (yp[j] - ym[j])              # the step actually taken
            h[j] = hj
            F[:, j] = (rhs_vector(flat, names, yp, t) - rhs_vector(flat, names, ym, t)) / (2 * hj)
        f0 = rhs_vector(flat, names, y, t)
        terms = np.abs(f0) + np.abs(J) @ np.abs(y)          # size of what each row sums
        floor = _NOISE * _EPS * terms[:, None] / h[None, :]
        mag = np.maximum(np.abs(J), np.abs(F))
        err = np.abs(J - F)
        tol = rtol * mag + floor
        rep.max_abs_err = max(rep.max_abs_err, float(err.max(initial=0.0)))
        significant = mag > floor
        rel = np.where(significant, err / np.where(mag > 0, mag, 1.0), 0.0)
        rep.max_rel_err = max(rep.max_rel_err, float(rel.max(initial=0.0)))
        ratio = np.where(P | significant, err / np.where(tol > 0, tol, 1.0), 0.0)
        bad = P & (err > tol)
        # Name the entry a reader should look at: the one furthest past its
        # tolerance when something fails, else the largest relative error.
        for key, slot, only in ((ratio, 0, bad), (rel, 1, None)):
            masked = key if only is None else np.where(only, key, -1.0)
            i, j = np.unravel_index(int(np.argmax(masked)), masked.shape)
            if masked[i, j] >= 0 and masked[i, j] > pick[slot][0]:
                pick[slot] = (float(masked[i, j]),
                              (names[i], names[j], float(J[i, j]), float(F[i, j]), float(rel[i, j])))
        rep.mismatches += int(bad.sum())
        for i, j in zip(*np.nonzero(~P & (np.abs(F) > tol))):
            rep.uncovered.append((names[i], names[j], float(F[i, j])))
        if bad.any() or rep.uncovered:
            rep.ok = False
    rep.worst = pick[0][1] or pick[1][1]
    return rep
