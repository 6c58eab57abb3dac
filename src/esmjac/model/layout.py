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

import hashlib
import itertools
import math
from dataclasses import dataclass
from functools import cached_property
from collections.abc import Sequence
from typing import Iterable

import numpy as np

from .._frozen import FrozenMap, readonly
from ..errors import JacError
from .evaluate import Decline, ev
from .expr import AGG, ARRAY_OPS, Expr, Node, from_ast, is_array_expr, map_children, node
from .load import SystemView, lhs_state

__all__ = ["ModelLayout", "model_layout", "is_box", "ElementNames", "ode_states", "element_name", "element_names",
           "local_name", "key_base", "parse_key", "strides", "Point", "resolve_point", "default_vectors",
           "index_reader", "layout_fingerprint", "column_space"]


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


def key_base(scope: str, key: str, names) -> str | None:
    """The variable of ``names`` a user key names (scoped, bare, or -- where
    unambiguous -- short: ``T`` for ``SuperFast.T``), element index dropped;
    None when it names none of them. A short name shared by several is
    refused with the qualified names to choose from."""
    base = local_name(scope, key).partition("[")[0]
    if base in names:
        return base
    hits = [n for n in names if n.endswith("." + base)]
    if len(hits) > 1:
        raise JacError("bad_argument", f"`{key}` is ambiguous; qualify it as one of {', '.join(hits)}")
    return hits[0] if hits else None


def parse_key(scope: str, key: str, shapes, what: str = "name") -> tuple:
    """``(variable, index)`` of a user key: ``index`` is the 0-based
    element tuple, or ``None`` for a whole-variable key. ``shapes`` maps the
    known variables to their shapes; anything else is refused. A short name
    is accepted where it is unambiguous (:func:`key_base`)."""
    base, _, rest = local_name(scope, key).partition("[")
    if base not in shapes:
        hit = key_base(scope, key, shapes)
        if hit is None:
            raise JacError("bad_argument", f"unknown {what} `{key}`; known: {', '.join(shapes)}")
        base = hit
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
    box: bool = False      # a scalar box mechanism on one virtual cell axis
    per_lane: tuple = ()   # scalar parameters read per lane from forcing

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


def is_box(view: SystemView) -> bool:
    """Whether ``view`` is a scalar box mechanism (states, all scalar, and no
    array-valued variable at all)."""
    return bool(ode_states(view)) and not any(v.shape for v in view.variables.values())


def resolve_names(names, known, what: str = "name", kind: str = "name") -> list:
    """``names`` (qualified, or short where unambiguous) as names of ``known``.

    A flattened document qualifies its variables (``SuperFast.T``); a user
    writes ``T``. A short name resolves to the one known name that is it or
    ends in ``.name``; several matches are refused with the qualified names
    to choose from, and an unknown name with the list of known ones."""
    if isinstance(names, str):
        raise JacError("bad_option", f"{what} is a list of names, e.g. ['T', 'j_NO2'], not a string")
    known = list(known)
    have = set(known)
    out = []
    for n in names:
        if not isinstance(n, str):
            raise JacError("bad_option", f"{what}: names are strings, got {type(n).__name__}")
        if n in have:
            out.append(n)
            continue
        hits = [k for k in known if k.endswith("." + n)]
        if len(hits) == 1:
            out.append(hits[0])
        elif hits:
            raise JacError("bad_option", f"{what}: `{n}` is ambiguous; qualify it as one of {', '.join(hits)}")
        else:
            raise JacError("bad_option", f"{what}: `{n}` is not a {kind} of the model "
                           f"({kind}s: {', '.join(known) or 'none'})")
    return out


def model_layout(view: SystemView, per_lane=()) -> ModelLayout:
    """The layout of ``view`` (see the module docstring for the orders);
    ``per_lane`` names scalar parameters to read per lane from ``forcing``
    (cell programs). A box mechanism gets one virtual cell axis: its states
    and per-lane parameters have shape ``(1,)`` in the layout."""
    states = tuple(ode_states(view))
    shapes = {n: v.shape for n, v in view.variables.items() if v.kind in ("state", "parameter")}
    scalars = [n for n, v in view.variables.items() if v.kind == "parameter" and not v.shape]
    per_lane = tuple(resolve_names(per_lane or (), scalars, "per_lane", "scalar parameter"))
    if len(set(per_lane)) != len(per_lane):
        raise JacError("bad_option", "per_lane names a parameter twice")
    box = is_box(view)
    if box:
        shapes = {n: ((1,) if n in states or n in per_lane else ()) for n in shapes}
    sh = {shapes.get(s, ()) for s in states}
    cell = next(iter(sh)) if len(sh) == 1 else ()
    if per_lane and not cell:
        raise JacError("bad_option", "per_lane parameters need a cell program (every state on one grid)")
    for n in per_lane:
        shapes[n] = tuple(cell)
    params = tuple(n for n, v in view.variables.items() if v.kind == "parameter" and not shapes[n])
    forcing = tuple(n for n, v in view.variables.items() if v.kind == "parameter" and shapes[n])
    allp = tuple(n for n, v in view.variables.items() if v.kind == "parameter")
    return ModelLayout(view.name, view.scope, states, FrozenMap(shapes), params, forcing, allp,
                       tuple(cell), view.element_type, box, per_lane)


def layout_fingerprint(lay: ModelLayout, kind: str) -> str:
    """Content hash of what a program's kernels assume about ``lay`` (its
    states, shapes, parameters, forcing and cell grid) for a ``kind``
    ("cell" or "global") program."""
    s = repr((lay.model, lay.states, sorted(lay.shapes.items()), lay.params, lay.forcing,
              lay.cell_shape, kind))
    return hashlib.sha256(s.encode()).hexdigest()


def column_space(lay: ModelLayout, wrt: str) -> tuple:
    """``(variables, first column of each, column count)`` of a Jacobian with
    respect to ``wrt`` ("states", "parameters", "forcing" or "t")."""
    if wrt == "states":
        cvars = lay.states
    elif wrt == "parameters":
        cvars = lay.all_params
        if lay.per_lane:
            # Per-lane columns first, as the cell kernels number them
            # (lane columns c*L + l, scalar ones after every lane).
            cvars = lay.forcing + tuple(v for v in lay.all_params if v not in lay.forcing)
    elif wrt == "forcing":
        cvars = lay.forcing
    else:
        cvars = ("t",)
    base, off = {}, 0
    for v in cvars:
        base[v] = off
        off += lay.size(v) if v != "t" else 1
    return tuple(cvars), FrozenMap(base), off


class ElementNames(Sequence):
    """Element names of the state vector at a lane count, computed on access
    (a 10⁶-cell program stores no 12 M strings): ``"Chem.O3[5]"`` — the names
    ``earthsci_ast.evaluate_rhs`` gives the document (``lanes`` = its cell
    count) or its lift to ``lanes`` cells (a box mechanism at ``lanes`` > 1).
    Lanes past the document's cells (padding) repeat its last cell."""

    __slots__ = ("_scope", "_states", "_shapes", "_cell", "_lanes", "_box", "_sizes", "_starts")

    def __init__(self, lay: ModelLayout, kind: str, lanes: int):
        self._scope = lay.scope
        self._states = lay.states
        self._box = lay.box
        self._cell = tuple(lay.cell_shape) if kind == "cell" else None
        self._lanes = lanes
        if kind == "cell":
            self._shapes = None
            self._sizes = (lanes,) * len(lay.states)
        else:
            self._shapes = tuple(tuple(lay.shapes.get(s, ())) for s in lay.states)
            self._sizes = tuple(int(np.prod(sh)) if sh else 1 for sh in self._shapes)
        self._starts = readonly(np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64))

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _name(self, i: int) -> str:
        s = int(np.searchsorted(self._starts, i, side="right")) - 1
        k = i - int(self._starts[s])
        n = self._scope + self._states[s]
        if self._shapes is not None:
            sh = self._shapes[s]
            return f"{n}[{','.join(str(x + 1) for x in np.unravel_index(k, sh))}]" if sh else n
        if self._box:
            return n if self._lanes == 1 else f"{n}[{k + 1}]"
        cell = self._cell
        if cell is None:                # (set for kind "cell"; the other kinds have shapes)
            raise JacError("internal_error", "ElementNames: a cell-lane name without the cell shape")
        ncell = int(np.prod(cell))
        idx = np.unravel_index(min(k, ncell - 1), cell)
        return f"{n}[{','.join(str(x + 1) for x in idx)}]"

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._name(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return self._name(int(i))

    def __iter__(self):
        for i in range(len(self)):
            yield self._name(i)

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (Sequence, ElementNames)) else NotImplemented

    def __repr__(self) -> str:
        return f"ElementNames({len(self)} elements)"


# ------------------------------------------------------------------ defaults

@dataclass(frozen=True)
class Point:
    """Values of every state and parameter (arrays as nested numpy), and t."""

    values: dict       # local name → float or ndarray (shape = variable shape)
    t: float


def _ic_values(view: SystemView) -> dict:
    out: dict[str, Expr] = {}
    for lhs, rhs in view.equations:
        if isinstance(lhs, Node) and lhs.op == "ic" and isinstance(lhs.args[0], str):
            out.setdefault(lhs.args[0], rhs)
    for name, rhs in getattr(view.source, "field_ics", None) or ():
        out.setdefault(name, from_ast(rhs))
    return out


def index_reader(values: dict):
    """The scalar evaluator's ``index`` reader over resolved ``values``
    (arrays by local name; ``const`` tables read in place). Reads that
    cannot be answered here decline (non-integer subscripts, out-of-extent
    reads, names without an array value)."""
    def read(e: Node, env: dict) -> float:
        head = e.args[0]
        idx = [ev(x, env, read) for x in e.args[1:]]
        ii = []
        for x in idx:
            if x != math.floor(x):
                raise Decline(f"non-integer subscript {x}")
            ii.append(int(x) - 1)
        if isinstance(head, str):
            arr = values.get(head)
            if arr is None or not isinstance(arr, np.ndarray) or arr.ndim != len(ii):
                raise Decline(f"`{head}` is not an array of rank {len(ii)} here")
            if any(not 0 <= i < n for i, n in zip(ii, arr.shape)):
                raise Decline(f"read of `{head}` outside its extent")
            return float(arr[tuple(ii)])
        if isinstance(head, Node) and head.op == "const":
            v = head.attr("value")
            for i in ii:
                if not 0 <= i < len(v):
                    raise Decline("const table read out of range")
                v = v[i]
            return float(v)
        raise Decline(f"cannot read an index of `{getattr(head, 'op', head)}`")
    return read


class _Arrays:
    """The array names of a view, as :func:`~esmjac.model.expr.is_array_expr` asks."""

    __slots__ = ("shapes",)

    def __init__(self, view: SystemView):
        self.shapes = {n: v.shape for n, v in view.variables.items() if v.shape}

    def is_array(self, name) -> bool:
        return name in self.shapes


def _fill(view: SystemView, expr, shape: tuple, env: dict, index_fn=None):
    """A default/initial value (scalar broadcast, or an aggregate per cell),
    evaluated under ``env`` (t and the parameters resolved so far)."""
    if not shape:
        return ev(expr, env, index_fn)
    arrays = _Arrays(view)
    if not is_array_expr(expr, arrays):
        # A scalar default broadcasts: evaluated once and held as a read-only
        # broadcast view, so a 10⁶-cell grid costs neither 10⁶ evaluations nor
        # an array per variable (``_apply`` copies before an override writes).
        return np.broadcast_to(np.float64(ev(expr, env, index_fn)), shape)
    arr = np.empty(shape)
    for idx in _points(shape):
        arr[tuple(i - 1 for i in idx)] = _ev_at(expr, env, idx, arrays, index_fn)
    return arr


def _ev_at(e, env: dict, idx: tuple, arrays: _Arrays, index_fn) -> float:
    """Element ``idx`` (1-based) of an array-valued expression: a whole array
    name reads that element, an aggregate evaluates its body there, and an
    elementwise operation applies to its operands' elements; a scalar
    expression broadcasts."""
    if isinstance(e, str) and arrays.is_array(e):
        return index_fn(node("index", [e, *idx]), env)
    if not (isinstance(e, Node) and is_array_expr(e, arrays)):
        return ev(e, env, index_fn)
    if e.op == AGG and e.attr("output_idx"):
        oidx = list(e.attr("output_idx"))
        if len(oidx) != len(idx):
            raise Decline("aggregate rank differs from the variable's")
        env2 = dict(env)
        env2.update((n, float(i)) for n, i in zip(oidx, idx) if isinstance(n, str))
        return ev(e.body, env2, index_fn)
    if e.op in ARRAY_OPS:
        raise Decline(f"`{e.op}` initial values are not evaluated here")
    return ev(map_children(e, lambda x: _ev_at(x, env, idx, arrays, index_fn)
                           if is_array_expr(x, arrays) else x), env, index_fn)


def _initial(view: SystemView, n: str, src, env: dict, values: dict):
    """The value of ``n`` from ``src`` (a literal, list, or expression), NaN
    where it cannot be evaluated yet."""
    var = view.variables[n]
    if src is None:
        return np.full(var.shape, np.nan) if var.shape else math.nan
    if isinstance(src, (list, tuple)):       # a per-element default array
        arr = np.asarray(src, dtype=float)
        if arr.shape != var.shape:
            raise JacError("bad_argument", f"default of `{n}` has shape {arr.shape}, not {var.shape}")
        return arr.copy()
    try:
        e = from_ast(src) if not isinstance(src, (int, float, Node, str)) else src
        return _fill(view, e, var.shape, env, index_reader(values))
    except Decline:         # not evaluable (yet): must be given by u / p
        return np.full(var.shape, np.nan) if var.shape else math.nan


def resolve_point(view: SystemView, u: dict | None, p: dict | None, t: float,
                  names: list) -> Point:
    """Values for every name in ``names``, as earthsci-ast's problem starts:
    parameters from their defaults (which may be expressions of other
    parameters) and the ``p``/``u`` overrides of parameters; then states from
    their ``ic`` equation (an expression of parameters, inline or per-cell),
    else their default, then the state overrides. Overrides are keyed by
    element or variable name, scoped or bare. Unknown keys are refused."""
    ics = _ic_values(view)
    values: dict = {}
    pnames = [n for n in names if view.variables[n].kind == "parameter"]
    snames = [n for n in names if view.variables[n].kind != "parameter"]
    shapes = {n: view.shape(n) for n in names}
    overrides = [(parse_key(view.scope, k, shapes, "state or parameter"), v)
                 for d in ((p or {}), (u or {})) for k, v in d.items()]
    env: dict = {"t": 0.0}
    pending = list(pnames)
    for _ in range(len(pending) + 1):        # defaults may read other parameters
        still = []
        for n in pending:
            values[n] = _initial(view, n, view.variables[n].default, env, values)
            if np.isnan(values[n]).any():
                still.append(n)
            elif not view.variables[n].shape:
                env[n] = float(values[n])
        if len(still) == len(pending):
            break
        pending = still
    pset = set(pnames)
    for key, val in overrides:
        if key[0] in pset:
            _apply(values, shapes, key, val)
    env.update((n, float(values[n])) for n in pnames if not view.variables[n].shape)
    for n in snames:
        src = ics.get(n)
        if src is None:
            src = view.variables[n].default
        values[n] = _initial(view, n, src, env, values)
    for key, val in overrides:
        if key[0] not in pset:
            _apply(values, shapes, key, val)
    for n, v in values.items():
        if np.isnan(v).any():
            raise JacError("bad_argument",
                           f"`{view.scope}{n}` has no usable default or initial value; pass it in u/p")
    return Point(values, float(t))


def _apply(values: dict, shapes: dict, key: tuple, val) -> None:
    """Override one parsed key (``(variable, index or None)``) in ``values``."""
    base, idx = key
    if idx is not None:
        if not values[base].flags.writeable:       # a broadcast default: own it first
            values[base] = values[base].copy()
        values[base][idx] = float(val)
    elif shapes[base]:
        values[base] = np.broadcast_to(np.asarray(val, dtype=float), shapes[base]).copy()
    else:
        values[base] = float(val)


def default_vectors(view: SystemView, lay: ModelLayout) -> tuple:
    """Read-only ``(u0, p0, forcing0)`` flat vectors of the document's
    defaults (``evaluate_rhs`` order), or ``(None, None, None)`` when some
    value has no usable default."""
    try:
        pt = resolve_point(view, None, None, 0.0, list(lay.states) + list(lay.all_params))
    except JacError:
        return None, None, None

    def flat(names):
        # Filled in place, one variable at a time: the values may be broadcast
        # views (ravelling them would copy), so the peak is the vector itself.
        out = np.empty(sum(lay.size(s) for s in names), dtype=np.float64)
        o = 0
        for s in names:
            n = lay.size(s)
            v = np.asarray(pt.values[s], dtype=np.float64)
            if v.size and not any(v.strides):     # one value broadcast: a fill, not a strided copy
                out[o:o + n] = v.flat[0]
            elif v.size == n:
                out[o:o + n].reshape(v.shape)[...] = v
            else:       # a per-lane parameter's default is a scalar: broadcast to its cells
                out[o:o + n] = v
            o += n
        return out

    p0 = np.array([float(pt.values[n]) for n in lay.params], dtype=np.float64)
    return readonly(flat(lay.states)), readonly(p0), readonly(flat(lay.forcing))
