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
* **One pass.** A scalar box (each equation ``D(state) ~ expression``)
  evaluates all 2n perturbed states of a point in one pass of
  earthsci-ast's interpreter, each state bound to a vector; the pass is
  checked against the right-hand side at the point and two perturbed
  states first (else the calls below).
* **Column groups.** Otherwise, columns no row reads together are differenced together
  (Curtis–Powell–Reid: a greedy colouring of the union of the stored pattern
  and earthsci-ast's own structure — which states each equation's expression
  reads, through its observed definitions): each row's difference in a group
  belongs to the one column of the group the row reads, so every entry is
  still compared, with 2·(groups) right-hand-side calls per point instead of
  2n. A random directional difference over all columns at once checks the
  structure (an entry outside it shows up there): where it disagrees, or a
  row outside the structure moves, that point is differenced column by column.
* **Tolerance.** Evaluating row ``i`` of the RHS loses about ``ε·T_i``,
  where ``T_i = |f_i| + Σ_k |J_ik y_k|`` is the size of the terms being
  summed (for mass action each term is a rate times its reactants, which is
  what ``J_ik y_k`` measures). Divided by the step that noise bounds what a
  difference quotient can resolve, so entry ``(i, j)`` passes when
  ``|J_ij − FD_ij| ≤ rtol·max(|J_ij|, |FD_ij|) + atol + 10·ε·T_i / h_j``. An
  entry FD sees above that floor outside the stored pattern is *uncovered*.
  The report counts the entries compared and names the worst one (both
  values, the difference and the tolerance it was held to, split into its
  parts), so a verdict always says what it was relative to.
* **Finiteness.** The right-hand side and the Jacobian are evaluated at the
  document's own state (its defaults, unperturbed) first: a non-finite value
  there fails the check, naming the species and the innermost non-finite
  term of its rate (``k_mt1 / SALAAL = 0/0``); so does a non-finite value at
  any sampled point.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

from ..calculus.bandset import BandSet
from ..compile.cache import record_schema_pass, schema_passed
from ..errors import JacError, typed_errors
from ..model.layout import element_names, ode_states, resolve_point
from ..model.schema import remembering
from ..runtime.progress import Task, task
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
    closest to (or furthest past) its tolerance; ``worst_tolerance`` is
    ``(|exact − fd|, tolerance, rtol part, atol, round-off floor)`` of that
    entry. ``compared`` counts the entries given a verdict (stored entries
    and entries finite differences resolve, at every point). ``ok`` is False
    on any mismatch, uncovered entry or non-finite value (``nonfinite``: what
    was non-finite, where, in words). A model without ODE states has nothing
    to check: ``nothing_to_check`` is True (and ``ok`` stays True: nothing failed).
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
    rtol: float = 1e-5
    atol: float = 0.0
    compared: int = 0
    worst_tolerance: tuple | None = None
    largest_rel: tuple | None = None
    nonfinite: list = field(default_factory=list)
    groups: int = 0
    rhs_calls: int = 0
    ungrouped_points: int = 0
    batched_points: int = 0

    @property
    def nothing_to_check(self) -> bool:
        return self.n_states == 0

    def summary(self) -> str:
        if self.nothing_to_check:
            return "nothing to check: no ODE states (the document integrates no state variables)"
        verdict = "NON-FINITE" if self.nonfinite else ("OK" if self.ok else "MISMATCH")
        out = (f"{verdict}: {self.n_states} states, {self.nnz} stored entries, {self.points} point(s) "
               f"{self.sampling}; {self.compared} entries compared, each held to "
               f"rtol*max(|exact|, |fd|) + atol + its round-off floor (rtol={self.rtol:g}, atol={self.atol:g})")
        if self.batched_points:
            out += (f"; {self.batched_points} point(s) with every column's differences evaluated in one "
                    "pass of earthsci-ast's interpreter (checked against its right-hand side there)")
        if self.groups:
            out += (f"; columns differenced in {self.groups} structurally orthogonal groups "
                    f"({self.rhs_calls} right-hand-side calls")
            out += (f", {self.ungrouped_points} point(s) column by column)" if self.ungrouped_points
                    else ")")
        if self.worst is not None:
            r, c, a, f, rel = self.worst
            what = "furthest outside tolerance" if self.mismatches else "closest to its tolerance"
            out += (f"; {what}: d {r} / d {c} (exact {a:.6e}, finite differences {f:.6e}, relative "
                    f"error {rel:.1e}")
            if self.worst_tolerance is not None:
                d, tol, rpart, apart, floor = self.worst_tolerance
                out += (f"; |difference| {d:.3e} {'>' if d > tol else '<='} tolerance {tol:.3e} = "
                        f"rtol part {rpart:.3e} + atol {apart:.3e} + round-off floor {floor:.3e}")
            out += ")"
        if self.largest_rel is not None:
            r, c, a, f, rel = self.largest_rel
            if self.worst is not None and self.largest_rel[:2] == self.worst[:2]:
                out += f"; largest relative error {rel:.1e} (that entry)"
            else:
                out += (f"; largest relative error {rel:.1e} at d {r} / d {c} (exact {a:.6e}, finite "
                        f"differences {f:.6e})")
        if self.mismatches:
            out += f"; {self.mismatches} entries outside tolerance"
        if self.uncovered:
            out += f"; {len(self.uncovered)} FD entries outside the stored pattern"
        for line in self.nonfinite[:10]:
            out += f"\n  non-finite: {line}"
        if len(self.nonfinite) > 10:
            out += f"\n  ... and {len(self.nonfinite) - 10} more non-finite values"
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


class _Rhs:
    """earthsci-ast's right-hand side at many states of one system: the
    NumPy-interpreter right-hand side :func:`rhs_vector`'s
    ``evaluate_rhs`` builds on every call (0.15 s of CPU at 272 species,
    and a check makes 2n + 1 calls per point) built once here and called per
    state, under the same compiler policy; the values are evaluate_rhs's
    own (tests compare them bit for bit). Where earthsci-ast has no such
    build (another version), or its element names are not exactly ours,
    each call is :func:`rhs_vector`."""

    def __init__(self, flat, names: list, y0: np.ndarray):
        self._flat, self._names = flat, names
        self._build = None
        try:
            from earthsci_ast.compiler import CompilerPolicy, phase_scope, resolve_compiler, use_policy
            from earthsci_ast.simulation_array import _build_numpy_rhs
            chosen = resolve_compiler(None)
            self._scope = lambda: _policy(CompilerPolicy(compiler=chosen, strict=chosen == "native",
                                                         every_tier_off=chosen == "interpreter"),
                                          use_policy, phase_scope)
            with self._scope():
                b = _build_numpy_rhs(self._flat, {}, dict(zip(names, map(float, y0))))
            pos = {n: i for i, n in enumerate(b.elem_names)}
            if sorted(pos) == sorted(names) and len(pos) == len(names) == int(np.size(b.y0)):
                self._perm = np.array([pos[n] for n in names], dtype=np.int64)
                self._build = b
        except Exception:          # noqa: BLE001 - no reusable build: evaluate_rhs per call
            self._build = None

    def __call__(self, y: np.ndarray, t: float) -> np.ndarray:
        if self._build is None:
            return rhs_vector(self._flat, self._names, y, t)
        yb = np.empty(len(self._names))
        yb[self._perm] = np.asarray(y, dtype=float)
        with self._scope():
            dy = self._build.rhs_function(float(t), yb)
        # a copy: earthsci-ast's right-hand side reuses its output buffer
        return np.array([float(v) for v in np.asarray(dy)[self._perm]], dtype=float)



class _Batch:
    """earthsci-ast's right-hand side at many states in one pass: each
    equation's expression evaluated once by earthsci-ast's own interpreter
    (``numpy_interpreter.eval_expr``, what its right-hand side calls per
    equation) with every state bound to a vector of values, one per state.
    A point's 2n perturbed states then cost about one right-hand-side call
    (0.08 s for 544 states of a 272-species mechanism, against 0.076 s per
    state). Only for what that pass surely evaluates alike: scalar states,
    each equation ``D(state) ~ expression``, no observed definitions; and
    each point is checked against the right-hand side itself first
    (:meth:`differences`), so a disagreement means the ordinary calls."""

    def __init__(self, rhs: "_Rhs", flat, names: list):
        from earthsci_ast.numpy_interpreter import EvalContext, eval_expr
        b = rhs._build
        if b is None:
            raise ValueError("no reusable right-hand side build")
        self._eval, self._ctx = eval_expr, EvalContext
        self._b, self._flat, self._names = b, flat, names
        pos = {nm: i for i, nm in enumerate(names)}
        eqs = []
        for e in flat.equations:
            lhs = e.lhs
            if isinstance(lhs, str) or getattr(lhs, "op", None) != "D" or len(lhs.args) != 1 \
                    or not isinstance(lhs.args[0], str) or lhs.args[0] not in pos:
                raise ValueError("not a scalar D(state) equation")
            eqs.append((pos[lhs.args[0]], e.rhs))
        if len({i for i, _ in eqs}) != len(eqs) or b.varying_observed \
                or any(tuple(b.shapes.get(nm, ())) != () for nm in names):
            raise ValueError("not a scalar box")
        self._eqs = eqs

    @classmethod
    def of(cls, rhs: "_Rhs", flat, names: list):
        """A batch evaluator, or None where it does not apply."""
        try:
            return cls(rhs, flat, names)
        except Exception:       # noqa: BLE001 - another shape of system or earthsci-ast: the calls
            return None

    def __call__(self, Y: np.ndarray, t: float) -> np.ndarray:
        """Right-hand sides at the columns of ``Y`` (n × m)."""
        b = self._b
        ctx = self._ctx(state_layout={}, state_shapes={}, param_values=b.param_values,
                        observed_values=dict(b.static_observed_values), y=np.empty(0), t=float(t),
                        locals={nm: Y[i] for i, nm in enumerate(self._names)},
                        index_sets=self._flat.index_sets, derived_rings=dict(b.static_derived_rings))
        out = np.zeros(Y.shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i, e in self._eqs:
                out[i] = self._eval(e, ctx)
        return out

    def differences(self, rhs, y, t, steps, f0, floor):
        """(F, h, calls): central differences of every column alone (the
        quotients of :func:`_column_differences`), all 2n states in one
        batch; or ``(None, None, calls)`` when the batch's value at ``y``
        or at two perturbed states is not the right-hand side's (within
        ``floor``, the round-off the check allows anyway) or is non-finite."""
        n = y.shape[0]
        idx = np.arange(n)
        Y = np.repeat(y[:, None], 2 * n + 1, axis=1)
        Y[idx, 1 + idx] += steps
        Y[idx, 1 + n + idx] -= steps
        h = 0.5 * (Y[idx, 1 + idx] - Y[idx, 1 + n + idx])     # the steps actually taken
        try:
            V = self(Y, t)
        except Exception:       # noqa: BLE001 - what earthsci-ast's pass refuses: the calls
            return None, None, 0
        if not np.isfinite(V).all():
            return None, None, 0
        probes = [(0, f0)]
        for j in {0, n - 1}:
            probes.append((1 + j, rhs(np.ascontiguousarray(Y[:, 1 + j]), t)))
        for col, want in probes:
            if np.any(np.abs(V[:, col] - want) > floor):
                return None, None, len(probes) - 1
        F = (V[:, 1:1 + n] - V[:, 1 + n:]) / (2 * h[None, :])
        return F, h, len(probes) - 1


def _policy(policy, use_policy, phase_scope):
    import contextlib
    stack = contextlib.ExitStack()
    stack.enter_context(warnings.catch_warnings())
    warnings.simplefilter("ignore")
    stack.enter_context(use_policy(policy))
    stack.enter_context(phase_scope("rhs"))
    return stack


def _steps(y: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Each column's central-difference step (before rounding; see the module docstring)."""
    return _STEP * np.maximum(np.abs(y), scale)


def _column_differences(rhs, y: np.ndarray, t: float, steps: np.ndarray, prog: Task) -> tuple:
    """(F, h): central differences column by column (2n calls), and the steps taken."""
    n = y.shape[0]
    F = np.empty((n, n))
    h = np.empty(n)
    for j in range(n):
        yp, ym = y.copy(), y.copy()
        yp[j] += steps[j]
        ym[j] -= steps[j]
        h[j] = 0.5 * (yp[j] - ym[j])              # the step actually taken
        F[:, j] = (rhs(yp, t) - rhs(ym, t)) / (2 * h[j])
        prog.update()
    return F, h


def _structure(flat, names: list) -> np.ndarray:
    """earthsci-ast's own structure: ``S[i, j]`` when the derivative
    equation of element ``i``'s variable names element ``j``'s variable,
    directly or through the definitions (bare-name equations) it reads.
    Independent of esmjac's calculus: it reads the flattened document's
    expressions with earthsci-ast's ``free_variables``. Array variables are
    read whole (every element of one reads every element of the other), an
    equation whose target it cannot tell makes every row read everything:
    a superset of the true structure, never fewer entries (and the
    directional difference of :func:`_grouped_differences` checks it)."""
    from earthsci_ast.expression import free_variables
    n = len(names)
    cols: dict[str, list[int]] = {}
    for j, nm in enumerate(names):
        cols.setdefault(nm.split("[", 1)[0], []).append(j)
    dense = np.ones((n, n), dtype=bool)
    defs: dict[str, set] = {}
    reads: dict[str, set] = {}
    try:
        for e in flat.equations:
            lhs, body = e.lhs, set(free_variables(e.rhs))
            if isinstance(lhs, str):
                defs.setdefault(lhs, set()).update(body)
                continue
            targets = set()
            stack = [lhs]
            while stack:
                node = stack.pop()
                if getattr(node, "op", None) == "D":
                    targets |= set(free_variables(node)) & cols.keys()
                else:
                    stack.extend(a for a in (getattr(node, "args", None) or []) if not isinstance(a, (str, int, float)))
            body |= set(free_variables(lhs))
            if targets:
                for v in targets:
                    reads.setdefault(v, set()).update(body)
            else:
                named = set(free_variables(lhs)) - cols.keys()
                if not named:
                    return dense
                for v in named:
                    defs.setdefault(v, set()).update(body)
    except Exception:           # noqa: BLE001 - an expression this walk does not know: no grouping
        return dense
    memo: dict[str, frozenset] = {}

    def states_of(name: str, seen: frozenset) -> frozenset:
        if name in cols:
            return frozenset((name,))
        if name in memo:
            return memo[name]
        if name in seen or name not in defs:
            return frozenset()
        out = frozenset().union(*(states_of(m, seen | {name}) for m in defs[name])) if defs[name] else frozenset()
        memo[name] = out
        return out

    S = np.zeros((n, n), dtype=bool)
    for v, body in reads.items():
        hit = frozenset().union(*(states_of(m, frozenset()) for m in body)) if body else frozenset()
        rows = cols[v]
        for w in hit:
            S[np.ix_(rows, cols[w])] = True
    return S


def _column_groups(U: np.ndarray) -> list:
    """Curtis–Powell–Reid: columns of pattern ``U`` in groups no row of
    which reads two (greedy, largest column first); each group an index array."""
    order = np.argsort(-U.sum(axis=0), kind="stable")
    used: list[np.ndarray] = []
    members: list[list[int]] = []
    for j in order:
        rj = U[:, j]
        for g, rows in enumerate(used):
            if not (rows & rj).any():
                rows |= rj
                members[g].append(int(j))
                break
        else:
            used.append(rj.copy())
            members.append([int(j)])
    return [np.array(sorted(m), dtype=np.int64) for m in members]


def _grouped_differences(rhs, y, t, steps, groups, U, terms, sizes, atol, rng, prog: Task) -> tuple:
    """(F, h, calls): central differences a group of columns at a time.

    Row ``i``'s difference in a group is the entry of the one column of the
    group that row reads (``U``), divided by that column's step: the same
    quotient as differencing the column alone, up to round-off of the other
    columns' (structurally absent) terms. Two checks of the structure
    follow: no row outside ``U`` moves in any group, and a difference along
    a random direction over every column agrees with ``F`` applied to it
    (an entry ``U`` misses shows up there). Either failing returns
    ``(None, None, calls)``: the caller differences column by column."""
    n = y.shape[0]
    F = np.zeros((n, n))
    h = np.empty(n)
    yp, ym = y + steps, y - steps
    h[:] = 0.5 * (yp - ym)                      # the steps actually taken
    calls = 0
    floor = _NOISE * _EPS * terms
    held = True
    for cols in groups:
        yp, ym = y.copy(), y.copy()
        yp[cols] += steps[cols]
        ym[cols] -= steps[cols]
        diff = rhs(yp, t) - rhs(ym, t)
        calls += 2
        sub = U[:, cols]
        has = sub.any(axis=1)
        owner = cols[np.argmax(sub, axis=1)]
        rows = np.flatnonzero(has)
        F[rows, owner[rows]] = diff[rows] / (2 * h[owner[rows]])
        if np.any(np.abs(0.5 * diff[~has]) > 2 * floor[~has] + atol * np.max(h[cols])):
            held = False
        prog.update(len(cols))
    r = rng.choice((-1.0, 1.0), n) * rng.uniform(0.5, 1.0, n)
    yp, ym = y + steps * r, y - steps * r
    delta = 0.5 * (yp - ym)
    g = 0.5 * (rhs(yp, t) - rhs(ym, t))
    calls += 2
    tol = floor * (sizes + 2) + 1e-8 * (np.abs(F) @ np.abs(delta)) + atol * np.max(np.abs(delta))
    if not held or np.any(np.abs(g - F @ delta) > tol):
        return None, None, calls
    return F, h, calls


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


def _doc_state(view, states: list):
    """The document's own state in ``element_names`` order, or None when it
    gives no usable one."""
    try:
        pt = resolve_point(view, None, None, 0.0, states)
    except JacError:
        return None
    return np.concatenate([np.ravel(np.asarray(pt.values[s], dtype=float)) for s in states])


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x


def _bindings(flat, names, y) -> dict:
    """Scalar values of every name an equation may read at state ``y``:
    the states, the parameters' defaults and (evaluated in dependency
    order, as far as they go) the algebraic/observed definitions."""
    import earthsci_ast as ea
    b = {n: float(v) for n, v in zip(names, y)}
    for name, var in dict(getattr(flat, "parameters", {}) or {}).items():
        v = _num(getattr(var, "default", None))
        if v is not None and name not in b:
            b[name] = v
    b.setdefault("t", 0.0)
    algebraic = [(e.lhs, e.rhs) for e in flat.equations if isinstance(e.lhs, str)]
    for _ in range(len(algebraic)):
        grew = False
        for lhs, rhs in algebraic:
            if lhs in b:
                continue
            try:
                b[lhs] = float(ea.evaluate(rhs, b))
                grew = True
            except Exception:           # noqa: BLE001 - an unbound name: later, or never
                continue
        if not grew:
            break
    return b


def _origin(expr, b: dict):
    """(text, operand values) of the innermost sub-expression of ``expr``
    that is non-finite at bindings ``b`` while its operands are finite;
    None when ``expr`` is finite there (or cannot be evaluated)."""
    import earthsci_ast as ea

    def value(e):
        if isinstance(e, (int, float)):
            return float(e)
        if isinstance(e, str):
            return b.get(e)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                return float(ea.evaluate(e, b))
            except (ZeroDivisionError, OverflowError):
                return float("nan")
            except Exception:           # noqa: BLE001 - not a scalar this evaluator knows
                return None

    v = value(expr)
    if v is None or np.isfinite(v):
        return None
    node = expr
    while True:
        kids = [a for a in (getattr(node, "args", None) or []) if not isinstance(a, (int, float))]
        bad = None
        for k in kids:
            kv = value(k)
            if kv is not None and not np.isfinite(kv):
                bad = k
                break
        if bad is None or isinstance(bad, str):
            break
        node = bad
    try:
        text = ea.to_ascii(node)
    except Exception:                   # noqa: BLE001
        text = str(node)
    ops = {a: b[a] for a in (getattr(node, "args", None) or []) if isinstance(a, str) and a in b}
    return text, ops


def _nonfinite_at_document_state(bs, view, flat, names: list, states: list) -> list:
    """What is non-finite at the document's own state: RHS rows (naming the
    innermost non-finite term of each equation) and Jacobian entries."""
    y = _doc_state(view, states)
    if y is None or y.shape[0] != len(names):
        return []
    out = []
    try:
        f = rhs_vector(flat, names, y, 0.0)
        bad_rows = [names[i] for i in np.flatnonzero(~np.isfinite(f))]
        failed = bool(bad_rows)
    except Exception:                   # noqa: BLE001 - earthsci_ast refuses non-finite derivatives
        bad_rows, failed = [], True
    if failed:
        b = _bindings(flat, names, y)
        named = set()
        for e in flat.equations:
            lhs = e.lhs
            if isinstance(lhs, str) or getattr(lhs, "op", None) != "D":
                continue
            sp = lhs.args[0]
            hit = _origin(e.rhs, b)
            if hit is None:
                continue
            text, ops = hit
            vals = ", ".join(f"{k} = {v:.6g}" for k, v in ops.items())
            out.append(f"the RHS of {sp} at the document's state: {text} is non-finite"
                       + (f" ({vals})" if vals else ""))
            named.add(sp)
        for sp in bad_rows:
            if sp not in named:
                out.append(f"the RHS of {sp} is non-finite at the document's state")
        if not out:
            out.append("the RHS is non-finite at the document's state (earthsci_ast: non-finite "
                       "derivatives)")
    try:
        a = assemble(bs, u=dict(zip(names, y)), t=0.0)
    except JacError as exc:
        if exc.code != "evaluation_error":
            raise
        out.append(f"the Jacobian at the document's state: {exc.message}")
        return out
    m = a.matrix.tocoo()
    for k in np.flatnonzero(~np.isfinite(m.data))[:10]:
        out.append(f"the Jacobian entry d {a.rows[m.row[k]]} / d {a.cols[m.col[k]]} = {m.data[k]} "
                   "at the document's state")
    return out


@typed_errors
def fd_check(source, *, model: str | None = None, points: int = 3, seed: int = 0,
             rtol: float = 1e-5, atol: float = 0.0, lo: float | None = None,
             hi: float | None = None, progress: bool | None = None,
             group_columns: bool = True) -> FDReport:
    """Compare the assembled Jacobian with central differences of
    ``earthsci_ast.evaluate_rhs`` at ``points`` states (parameters at their
    defaults); see the module docstring for where, with which steps and to
    what tolerance (``rtol``, ``atol``). The RHS and the Jacobian must be
    finite at the document's own state. ``lo``/``hi`` (both or neither)
    sample uniformly from [lo, hi] instead of around the document's state.
    ``progress``: the derivation, the document-state check and the
    finite-difference columns shown on stderr (:mod:`esmjac.runtime.progress`:
    None = a bar on a terminal after 2 s). ``group_columns``: the shortcuts
    (the default; every entry is still compared): a scalar box's 2n
    perturbed states in one pass of earthsci-ast's interpreter, else
    structurally orthogonal columns differenced together; False: every
    column alone, 2n right-hand-side calls a point."""
    with task(progress, "check", unit="FD columns") as prog:
        return _fd_check(source, model, points, seed, rtol, atol, lo, hi, prog, group_columns)


def _fd_check(source, model, points, seed, rtol, atol, lo, hi, prog: Task,
              group_columns: bool = True) -> FDReport:
    if (lo is None) != (hi is None):
        raise JacError("bad_option", "give both lo and hi (a uniform range) or neither "
                       "(sample around the document's state)")
    if points < 1:
        raise JacError("bad_option", f"points must be >= 1, not {points}")
    if not (rtol >= 0 and atol >= 0 and np.isfinite(rtol) and np.isfinite(atol)):
        raise JacError("bad_option", f"rtol and atol must be finite and >= 0, not {rtol!r}, {atol!r}")
    prog.phase("deriving the Jacobian")
    if isinstance(source, BandSet):
        bs = source
    else:
        with remembering(schema_passed, record_schema_pass):     # the schema pass once per content
            bs = BandSet.build(source, model, "states")
    view = bs.view
    states = ode_states(view)
    names = element_names(view, states)
    n = len(names)
    prog.set_total(points * n)
    rep = FDReport(n, 0, points, rtol=float(rtol), atol=float(atol))
    if n == 0:          # nothing is integrated: there is no Jacobian to check
        return rep
    flat = _flat(view)
    prog.phase("the right-hand side and the Jacobian at the document's state")
    rep.nonfinite.extend(_nonfinite_at_document_state(bs, view, flat, names, states))
    rng = np.random.default_rng(seed)
    ref, scale = _reference_state(view, states)
    rhs = _Rhs(flat, names, ref)
    batch = _Batch.of(rhs, flat, names) if group_columns else None
    if lo is not None and hi is not None:     # both or neither (checked above)
        rep.sampling = f"uniform in [{lo:g}, {hi:g}]"
        scale = np.full(n, max(abs(lo), abs(hi), 1e-300))
    else:
        rep.sampling = "around the document's state"
    # (score, entry, tolerance): failing/closest, largest relative
    pick: list[tuple[float, tuple | None, tuple | None]] = [(-1.0, None, None), (-1.0, None, None)]
    structure = _structure(flat, names) if group_columns else None
    groups: list = []
    U: np.ndarray | None = None
    sizes = None
    for k in range(points):
        if lo is not None and hi is not None:
            y = rng.uniform(lo, hi, n)
        else:
            m = MAGNITUDES[k % len(MAGNITUDES)]
            base = np.where(ref != 0.0, ref, scale)
            y = base * 10.0 ** (m * rng.uniform(-1.0, 1.0, n))
        t = 0.0 if k == 0 else float(rng.uniform(0.0, 1.0))
        prog.phase(f"point {k + 1} of {points}: the Jacobian and {n} finite-difference columns")
        try:
            a = assemble(bs, u=dict(zip(names, y)), t=t)
        except JacError as exc:
            if exc.code != "evaluation_error":
                raise
            rep.nonfinite.append(f"the Jacobian at sampled point {k + 1}: {exc.message}")
            continue
        if a.rows != names:
            raise JacError("evaluation_error", "the assembled rows are not in evaluate_rhs's order")
        J = a.matrix.toarray()
        P = np.zeros((n, n), dtype=bool)
        coo = a.matrix.tocoo()
        P[coo.row, coo.col] = True
        rep.nnz = int(a.matrix.nnz)
        try:
            f0 = rhs(y, t)
            rep.rhs_calls += 1
            steps = _steps(y, scale)
            F = h = None
            tried = False
            terms0 = np.abs(f0) + np.abs(np.where(np.isfinite(J), J, 0.0)) @ np.abs(y)
            if batch is not None:
                F, h, calls = batch.differences(rhs, y, t, steps, f0, _NOISE * _EPS * terms0)
                rep.rhs_calls += calls
                if F is not None:
                    rep.batched_points += 1
                    prog.update(n)
            if F is None and group_columns:
                if U is None or not np.array_equal(U, P | structure):
                    U = P | structure
                    groups = _column_groups(U)
                    sizes = U.sum(axis=1)
            if F is None and group_columns and len(groups) < n:      # (a group per column saves nothing)
                rep.groups = max(rep.groups, len(groups))
                tried = True
                F, h, calls = _grouped_differences(rhs, y, t, steps, groups, U, terms0, sizes,
                                                   atol, np.random.default_rng([seed, k]), prog)
                rep.rhs_calls += calls
            if F is None:       # not grouped, or the structure did not hold at this point
                if tried:
                    rep.ungrouped_points += 1
                F, h = _column_differences(rhs, y, t, steps, prog)
                rep.rhs_calls += 2 * n
        except Exception as exc:        # noqa: BLE001 - earthsci_ast: non-finite derivatives
            if type(exc).__module__.split(".")[0] != "earthsci_ast":
                raise
            rep.nonfinite.append(f"the RHS (earthsci_ast) at sampled point {k + 1}: {exc}")
            continue
        badJ = ~np.isfinite(J)
        if badJ.any():
            for i, j in list(zip(*np.nonzero(badJ)))[:5]:
                rep.nonfinite.append(f"the Jacobian entry d {names[i]} / d {names[j]} = {J[i, j]} at "
                                     f"sampled point {k + 1}")
            J = np.where(badJ, 0.0, J)
        assert F is not None and h is not None
        terms = np.abs(f0) + np.abs(J) @ np.abs(y)          # size of what each row sums
        floor = _NOISE * _EPS * terms[:, None] / h[None, :]
        mag = np.maximum(np.abs(J), np.abs(F))
        err = np.abs(J - F)
        tol = rtol * mag + atol + floor
        rep.max_abs_err = max(rep.max_abs_err, float(err.max(initial=0.0)))
        significant = mag > floor + atol
        rel = np.where(significant, err / np.where(mag > 0, mag, 1.0), 0.0)
        rep.max_rel_err = max(rep.max_rel_err, float(rel.max(initial=0.0)))
        considered = P | significant
        rep.compared += int(considered.sum())
        ratio = np.where(considered, err / np.where(tol > 0, tol, 1.0), -1.0)
        bad = P & (err > tol)
        # Name the entry a reader should look at: the one furthest past (or
        # closest to) its tolerance, and the largest relative error.
        for key, slot in ((ratio, 0), (rel, 1)):
            i, j = map(int, np.unravel_index(int(np.argmax(key)), key.shape))
            if key[i, j] >= 0 and key[i, j] > pick[slot][0]:
                pick[slot] = (float(key[i, j]),
                              (names[i], names[j], float(J[i, j]), float(F[i, j]), float(rel[i, j])),
                              (float(err[i, j]), float(tol[i, j]), float(rtol * mag[i, j]), float(atol),
                               float(floor[i, j])))
        rep.mismatches += int(bad.sum())
        for i, j in zip(*np.nonzero(~P & (np.abs(F) > tol))):
            rep.uncovered.append((names[i], names[j], float(F[i, j])))
        if bad.any() or rep.uncovered:
            rep.ok = False
    rep.worst, rep.worst_tolerance = pick[0][1], pick[0][2]
    rep.largest_rel = pick[1][1]
    if rep.worst is None:
        rep.worst = pick[1][1]
    if rep.nonfinite:
        rep.ok = False
    return rep
