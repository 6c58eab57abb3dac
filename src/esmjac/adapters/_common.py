"""What the solver adapters share: building the programs, reading the
user's ``y0``/``p``/``forcing``, the CSR pattern, and call counters.

Element keys (``"Chem.O3[3]"``, ``"O3"``) are parsed by
:mod:`esmjac.model.layout`, the same parser the oracle uses; thread counts
are :mod:`esmjac.runtime.threads`'.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from ..calculus import state_independent
from ..errors import JacError
from ..layouts.types import Csr
from ..model.layout import key_base, local_name, resolve_point
from ..model.load import load_view
from ..runtime.checks import cell_options, integrable
from ..runtime.programs import JacobianProgram, RhsProgram

__all__ = ["cell_options", "build_programs", "fill_vector", "inputs", "csr_pattern", "bandwidths", "fresh_array",
           "readonly_index", "Counters", "Problem"]


def build_programs(source, model, build_options) -> tuple:
    """(RhsProgram, JacobianProgram wrt states, Csr plan) of ``source``."""
    # The Jacobian first: a model the calculus refuses is refused with the
    # same code (underivable_operator...) as ``esmjac bands`` gives it.
    try:
        j = JacobianProgram.build(source, model, "states", options=build_options)
    except JacError as exc:
        # A right-hand side that provably reads no state (every observed
        # inlined) has the zero Jacobian; the empty-bands gate guards misreads.
        if exc.code != "empty_bands" or (build_options or {}).get("allow_empty") is False \
                or not state_independent(load_view(source, model)):
            raise
        j = JacobianProgram.build(source, model, "states",
                                  options={**(build_options or {}), "allow_empty": True})
    r = RhsProgram.build(source, model, options=build_options)
    integrable(r)
    return r, j, j.plan(Csr(), source=r)


def _hint(layout, key: str, what: str) -> str:
    """Why a key is unknown here when it names a parameter of the other kind."""
    base = key_base(layout.scope, key, layout.forcing + layout.params) or \
        local_name(layout.scope, key).partition("[")[0]
    if base in layout.forcing and what != "forcing":
        return f" (`{base}` is a per-cell parameter: pass it in forcing=)"
    if base in layout.params and what == "forcing":
        return f" (`{base}` is a scalar parameter: pass it in p=)"
    return ""


def fill_vector(base: np.ndarray | None, layout, names: tuple, value, n: int, what: str) -> np.ndarray:
    """A new flat float64 vector of length ``n``: ``value`` as an array, or
    a dict overriding ``base`` (element keys set one element; variable keys
    take a scalar or an array of the variable's shape)."""
    if value is None:
        if base is None:
            raise JacError("bad_argument",
                           f"the document gives no usable default for the {what}; pass it")
        return np.array(base, dtype=np.float64, copy=True)
    if isinstance(value, dict):
        if base is None:
            raise JacError("bad_argument", f"the document gives no usable default for the {what}; "
                           "pass a full vector instead of a dict")
        out = np.array(base, dtype=np.float64, copy=True)
        for key, val in value.items():
            try:
                pos = layout.positions(names, str(key), what)
            except JacError as exc:
                hint = _hint(layout, str(key), what)
                if not hint:
                    raise
                raise JacError(exc.code, f"{exc.message}{hint}") from None
            arr = np.asarray(val, dtype=np.float64)
            if arr.size not in (1, len(pos)):
                raise JacError("bad_argument", f"`{key}` takes 1 or {len(pos)} values, got {arr.size}")
            out[pos] = np.ravel(arr) if arr.size == len(pos) else float(arr.reshape(-1)[0])
        return out
    arr = np.ascontiguousarray(np.asarray(value, dtype=np.float64).reshape(-1))
    if arr.shape[0] != n:
        raise JacError("bad_argument", f"the {what} must have {n} entries, got {arr.shape[0]}")
    return arr.copy()


def _route_cell_parameters(lay, p, forcing):
    """Per-cell parameters are forcing fields of the programs (one value per
    cell); a ``p=`` dict naming one is moved to ``forcing=`` (the same
    override, where the programs take it). A full ``forcing`` vector beside
    such a key is ambiguous and refused."""
    if not isinstance(p, dict):
        return p, forcing
    moved = {k: v for k, v in p.items()
             if local_name(lay.scope, str(k)).partition("[")[0] not in lay.params
             and key_base(lay.scope, str(k), lay.forcing) is not None}
    if not moved:
        return p, forcing
    if forcing is not None and not isinstance(forcing, dict):
        raise JacError("bad_argument",
                       f"{', '.join(map(str, moved))}: per-cell parameter(s) given in p= while forcing= "
                       "is a full vector; put them in that vector (they are forcing fields) or pass "
                       "forcing as a dict")
    both = set(moved) & set(forcing or {})
    if both:
        raise JacError("bad_argument", f"{', '.join(sorted(map(str, both)))} given in both p= and forcing=")
    return ({k: v for k, v in p.items() if k not in moved}, {**(forcing or {}), **moved})


def inputs(r: RhsProgram, y0, p, forcing, source=None, model=None) -> tuple:
    """(y0, p, forcing) flat float64 vectors (forcing None when the model has none).

    ``p`` may name per-cell parameters (shape ``[cell]``): they are forcing
    fields of the compiled programs and go there (an array of one value per
    cell, or a scalar for all). A ``p`` dict also moves the initial state the
    document derives from parameters (``ic(w) = 2 A``, parameter-defaulted
    states), as earthsci-ast's problem does, unless ``y0`` is a full vector
    (``source``/``model``: the document, re-read for that)."""
    lay = r.layout
    u0 = r.u0
    if isinstance(p, dict) and p and source is not None and (y0 is None or isinstance(y0, dict)):
        u0 = _derived_initial_state(r, source, model, p, u0)
    p, forcing = _route_cell_parameters(lay, p, forcing)
    lanes = r.cells if r.kind == "cell" else 1
    y = fill_vector(u0, lay, lay.states, y0, r.u_size(lanes), "initial state")
    pv = fill_vector(r.p0, lay, lay.params, p, len(lay.params), "parameter vector")
    nf = r.f_size(lanes)
    if nf == 0:
        if forcing is not None and not (isinstance(forcing, dict) and not forcing):
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        return y, pv, None
    return y, pv, fill_vector(r.forcing0, lay, lay.forcing, forcing, nf, "forcing")


def _derived_initial_state(r: RhsProgram, source, model, p: dict, u0):
    """The document's initial state under the parameter overrides ``p``, by
    the rules the build's defaults follow (``model.layout.resolve_point``);
    ``u0`` where the document still gives none."""
    lay = r.layout
    try:
        pt = resolve_point(load_view(source, model), None, p, 0.0, list(lay.states) + list(lay.all_params))
    except JacError as exc:
        if exc.code == "bad_argument" and u0 is None:
            return None          # still no usable default: fill_vector says so
        raise
    if not lay.states:
        return np.zeros(0)
    return np.concatenate([np.ravel(np.asarray(pt.values[s], dtype=np.float64)) for s in lay.states])


def csr_pattern(plan) -> tuple:
    """(rows, cols, n) of the Csr plan's entries in CSR data order."""
    indptr, cols, shape = plan.csr_index()
    cols = np.asarray(cols, dtype=np.int64)
    n = int(shape[0])
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    return rows, cols, n


def fresh_array(pool: list, n: int, bound=None) -> np.ndarray:
    """An output array no one else holds: one this problem returned before
    and every caller has since dropped (only the pool refers to it: no
    matrix, view or solver state), else a new one. The solvers keep what
    ``fun``/``jac`` return for a while; reusing only released arrays keeps
    them correct and saves the page faults of a fresh megabyte per call."""
    seen = getattr(bound, "_seen", ())      # the binding keeps its last output (identity fast path)
    for a in pool:
        # the pool's list, this loop's name, the call's argument (+ the binding's record)
        if sys.getrefcount(a) <= (4 if seen and a is seen[0] else 3):
            return a
    a = np.empty(n)
    if len(pool) < 4:
        pool.append(a)
    return a


def readonly_index(a: np.ndarray) -> np.ndarray:
    """A read-only int32 copy of an index array (SciPy's index dtype below
    2³¹ entries), shared by every matrix a problem returns."""
    out = np.array(a, dtype=np.int32 if a.size < 2**31 - 1 else np.int64)
    out.setflags(write=False)
    return out


def bandwidths(rows, cols) -> tuple:
    """(lower, upper) bandwidth of a pattern."""
    d = rows - cols
    return int(max(0, d.max(initial=0))), int(max(0, (-d).max(initial=0)))


@dataclass(frozen=True, eq=False)
class Problem:
    """What every solver problem holds: the compiled programs, the Csr plan
    and the fixed inputs (read-only vectors in ``evaluate_rhs`` order)."""

    rhs: RhsProgram
    jacobian: JacobianProgram  # wrt="states"
    plan: Any                  # Csr ScatterPlan
    y0: np.ndarray
    names: Any                 # element names of y (a lazy sequence, model.layout.ElementNames)
    p: np.ndarray
    forcing: np.ndarray | None

    @property
    def n(self) -> int:
        """Number of unknowns."""
        return int(self.y0.shape[0])


@dataclass
class Counters:
    """esmjac-side call counts of one problem (mutable, owned by it)."""

    nfev: int = 0              # right-hand side evaluations
    njev: int = 0              # Jacobian evaluations (matrix)
    njtsetup: int = 0          # Jacobian evaluations for J·v (Krylov setup)
    njtimes: int = 0           # J·v products
    npsetup: int = 0           # preconditioner setups
    npeval: int = 0            # Jacobian evaluations by the preconditioner
    npsolve: int = 0           # preconditioner solves
    nrecoverable: int = 0      # callbacks that reported a recoverable failure (a non-finite value)
    nnegative: int = 0         # RHS calls that read a negative state as 0 (sundials nonnegative)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def reset(self) -> None:
        for f in fields(self):
            setattr(self, f.name, 0)
