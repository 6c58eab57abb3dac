"""How a model's values are laid out: states, parameters, element names,
element keys and defaults — the one place every other layer asks.

Invariants (they are ``earthsci_ast.evaluate_rhs``'s):

- ODE states are earthsci-ast's integrated states in its problem order
  (else the variables of kind ``state`` a ``D`` equation writes, in
  declaration order); scalar parameters (the vector ``p``) and
  array-shaped parameters (forcing fields) in declaration order.
- Elements are row-major and 1-based; an element's name is
  ``<scope>name[i,j]`` (bare ``name`` for a scalar).
- A user *key* is a variable name (``O3``, all of its elements) or an
  element name (``Chem.O3[2,3]``), scoped or bare. :func:`parse_key` is the
  one parser of keys; unknown names and out-of-range indices are refused.
- Defaults: an ``ic`` equation first, then the variable's default (a
  number, a per-element array, or an aggregate over the cells);
  expression defaults that need run-time values must be given by the user.

The compiled path (evaluation documents, programs, adapters) and the
reference oracle both read models through this module, so they can never
disagree on numbering.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

import numpy as np

from .._frozen import FrozenMap, readonly
from ..errors import JacError
from .evaluate import Decline, ev
from .expr import AGG, Node, from_ast
from .load import SystemView, lhs_state

__all__ = ["ModelLayout", "model_layout", "ode_states", "element_name", "element_names",
           "local_name", "parse_key", "strides", "Point", "resolve_point", "default_vectors"]


# ------------------------------------------------------------------ numbering

def ode_states(view: SystemView) -> list:
    """The integrated states in earthsci-ast's problem order (``view.integrated``,
    which includes states whose derivative is identically zero); for a view
    without that list, the written states in declaration order."""
    if view.integrated is not None:
        return list(view.integrated)
    written = {lhs_state(l) for l, _ in view.equations}
    return [n for n, v in view.variables.items() if v.kind == "state" and n in written]


def element_name(name: str, idx: tuple) -> str:
    """``name[i,j]`` for a 1-based index tuple, ``name`` for ``()``."""
    return f"{name}[{','.join(str(i) for i in idx)}]" if idx else name


def _points(shape: tuple):
    return itertools.product(*(range(1, n + 1) for n in shape))


def element_names(view: SystemView, names: Iterable[str]) -> list:
    """Scoped element names of ``names`` (row-major elements)."""
    out = []
    for n in names:
        for idx in _points(view.shape(n)):
            out.append(view.scope + element_name(n, idx))
    return out


def strides(shape: tuple) -> tuple:
    """Row-major strides (in elements) of ``shape``."""
    st, acc = [], 1
    for n in reversed(shape):
        st.append(acc)
        acc *= n
    return tuple(st[::-1])


def local_name(scope: str, key: str) -> str:
    """A user key (scoped or bare) without the model's scope."""
    return key[len(scope):] if scope and key.startswith(scope) and key[len(scope):] else key


def parse_key(scope: str, key: str, shapes, what: str = "name") -> tuple:
    """``(variable, index)`` of a user key: ``index`` is the 0-based
    element tuple, or ``None`` for a whole-variable key. ``shapes`` maps the
    known variables to their shapes; anything else is refused."""
    base, _, rest = local_name(scope, key).partition("[")
    if base not in shapes:
        raise JacError("bad_argument", f"unknown {what} `{key}`; known: {', '.join(shapes)}")
    if not rest:
        return base, None
    shape = tuple(shapes[base])
    try:
        if not rest.endswith("]"):
            raise ValueError
        idx = tuple(int(x) - 1 for x in rest[:-1].split(","))
    except ValueError:
        raise JacError("bad_argument", f"cannot read the element index of `{key}`") from None
    if len(idx) != len(shape) or any(not 0 <= i < n for i, n in zip(idx, shape)):
        raise JacError("bad_argument", f"`{key}` is outside the shape {shape} of `{base}`")
    return base, idx


# ------------------------------------------------------------------ the layout

@dataclass(frozen=True)
class ModelLayout:
    """How a model's arrays are laid out (shared by RHS and Jacobians)."""

    model: str
    scope: str
    states: tuple          # ODE states, declaration order
    shapes: FrozenMap      # name → shape for every state / parameter
    params: tuple          # scalar parameters, declaration order (``p``)
    forcing: tuple         # array-shaped parameters, declaration order
    all_params: tuple      # every parameter, declaration order (wrt="parameters")
    cell_shape: tuple      # common state shape, () when states differ
    element_type: str | None

    def __post_init__(self):
        if not isinstance(self.shapes, FrozenMap):
            object.__setattr__(self, "shapes", FrozenMap(self.shapes))

    def size(self, name: str) -> int:
        n = 1
        for s in self.shapes.get(name, ()):
            n *= s
        return n

    @cached_property
    def n_state_elements(self) -> int:
        return sum(self.size(s) for s in self.states)

    @cached_property
    def n_forcing_elements(self) -> int:
        return sum(self.size(s) for s in self.forcing)

    def offsets(self, names: Iterable[str]) -> dict:
        """Base of each of ``names`` in a flat vector holding them in order."""
        out, off = {}, 0
        for s in names:
            out[s] = off
            off += self.size(s)
        return out

    def state_offsets(self) -> dict:
        """Base of each state in the flat ``evaluate_rhs`` order (L = cells)."""
        return self.offsets(self.states)

    def forcing_offsets(self) -> dict:
        return self.offsets(self.forcing)

    def positions(self, names: tuple, key: str, what: str = "name") -> list:
        """Flat positions addressed by ``key`` in a vector holding ``names``
        in order (one element, or every element of a variable)."""
        offs = self.offsets(names)
        base, idx = parse_key(self.scope, key, {n: self.shapes.get(n, ()) for n in names}, what)
        if idx is None:
            return list(range(offs[base], offs[base] + self.size(base)))
        return [offs[base] + sum(i * s for i, s in zip(idx, strides(self.shapes.get(base, ()))))]


def model_layout(view: SystemView) -> ModelLayout:
    """The layout of ``view`` (see the module docstring for the orders)."""
    states = tuple(ode_states(view))
    shapes = {n: v.shape for n, v in view.variables.items() if v.kind in ("state", "parameter")}
    params = tuple(n for n, v in view.variables.items() if v.kind == "parameter" and not v.shape)
    forcing = tuple(n for n, v in view.variables.items() if v.kind == "parameter" and v.shape)
    allp = tuple(n for n, v in view.variables.items() if v.kind == "parameter")
    sh = {shapes.get(s, ()) for s in states}
    cell = next(iter(sh)) if len(sh) == 1 else ()
    return ModelLayout(view.name, view.scope, states, FrozenMap(shapes), params, forcing, allp,
                       tuple(cell), view.element_type)


# ------------------------------------------------------------------ defaults

@dataclass(frozen=True)
class Point:
    """Values of every state and parameter (arrays as nested numpy), and t."""

    values: dict       # local name → float or ndarray (shape = variable shape)
    t: float


def _ic_values(view: SystemView) -> dict:
    out = {}
    for lhs, rhs in view.equations:
        if isinstance(lhs, Node) and lhs.op == "ic" and isinstance(lhs.args[0], str):
            out.setdefault(lhs.args[0], rhs)
    for name, rhs in getattr(view.source, "field_ics", None) or ():
        out.setdefault(name, from_ast(rhs))
    return out


def _fill(expr, shape: tuple):
    """A default/initial value (scalar broadcast, or an aggregate per cell)."""
    if not shape:
        return ev(expr, {"t": 0.0})
    arr = np.empty(shape)
    if isinstance(expr, Node) and expr.op == AGG and expr.attr("output_idx"):
        oidx = list(expr.attr("output_idx"))
        for idx in _points(shape):
            arr[tuple(i - 1 for i in idx)] = ev(expr.body, {n: float(i) for n, i in zip(oidx, idx)})
        return arr
    arr[...] = ev(expr, {"t": 0.0})
    return arr


def resolve_point(view: SystemView, u: dict | None, p: dict | None, t: float,
                  names: list) -> Point:
    """Values for every name in ``names``: defaults (``ic`` first, as
    ``evaluate_rhs`` does), overridden by ``u``/``p`` keyed by element or
    variable name, scoped or bare. Unknown keys are refused."""
    ics = _ic_values(view)
    values: dict = {}
    for n in names:
        var = view.variables[n]
        src = ics.get(n) if var.kind != "parameter" else None
        if src is None:
            src = var.default
        if src is None:         # must then be given in full by u / p
            values[n] = np.full(var.shape, np.nan) if var.shape else math.nan
            continue
        if isinstance(src, (list, tuple)):       # a per-element default array
            arr = np.asarray(src, dtype=float)
            if arr.shape != var.shape:
                raise JacError("bad_argument", f"default of `{n}` has shape {arr.shape}, not {var.shape}")
            values[n] = arr.copy()
            continue
        try:
            values[n] = _fill(from_ast(src) if not isinstance(src, (int, float, Node, str)) else src,
                              var.shape)
        except Decline:         # an expression default: must be given by u / p
            values[n] = np.full(var.shape, np.nan) if var.shape else math.nan
    shapes = {n: view.shape(n) for n in values}
    for overrides in (u or {}), (p or {}):
        for key, val in overrides.items():
            base, idx = parse_key(view.scope, key, shapes, "state or parameter")
            if idx is not None:
                values[base][idx] = float(val)
            elif shapes[base]:
                values[base] = np.broadcast_to(np.asarray(val, dtype=float), shapes[base]).copy()
            else:
                values[base] = float(val)
    for n, v in values.items():
        if np.isnan(v).any():
            raise JacError("bad_argument",
                           f"`{view.scope}{n}` has no usable default or initial value; pass it in u/p")
    return Point(values, float(t))


def default_vectors(view: SystemView, lay: ModelLayout) -> tuple:
    """Read-only ``(u0, p0, forcing0)`` flat vectors of the document's
    defaults (``evaluate_rhs`` order), or ``(None, None, None)`` when some
    value has no usable default."""
    try:
        pt = resolve_point(view, None, None, 0.0, list(lay.states) + list(lay.all_params))
    except JacError:
        return None, None, None

    def flat(names):
        if not names:
            return np.zeros(0)
        return np.concatenate([np.ravel(np.asarray(pt.values[s], dtype=np.float64)) for s in names])

    p0 = np.array([float(pt.values[n]) for n in lay.params], dtype=np.float64)
    return readonly(flat(lay.states)), readonly(p0), readonly(flat(lay.forcing))
