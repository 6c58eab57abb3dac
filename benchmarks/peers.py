"""Peers for the Jacobian benchmark: what esmjac's compiled Jacobian is
compared against.

Every peer works on a *per-cell* chemistry model: ``n`` species on ``L``
independent cells ("lanes"). The layouts are the benchmark's:

* state ``u[s*L + l]`` — species-major, lanes fastest, species in the
  model's declaration order of ODE states (``esmjac.model.layout.ode_states``);
  for a 1-D cell index set this is exactly ``earthsci_ast.evaluate_rhs``'s
  element order ("Chem.O3[1]", …, "Chem.O3[L]", "Chem.O[1]", …);
* forcing ``forcing[f*L + l]`` — the per-cell (array-shaped) parameters in
  declaration order (``fj`` in tropo12);
* ``p`` — the scalar parameters in declaration order;
* a lane-kernel Jacobian fills ``out[k*L + l]`` for entry ``k`` of its
  ``pattern`` (0-based (row, col) species pairs, row-major sorted).

Peers
-----
:func:`handrolled`
    What an expert would write by hand: the RHS bodies in SymPy, lane-invariant
    rate constants hoisted out of the lane loop, ``Matrix.jacobian``,
    ``sympy.cse``, printed into one ``@numba.njit`` function with a single
    straight-line ``for l in range(L):`` loop.
:func:`scipy_fd`
    SciPy's grouped (Curtis-Powell-Reid) 2-point finite differences,
    ``scipy.optimize._numdiff.approx_derivative`` with a sparsity pattern.
:func:`earthsci_rhs`
    earthsci-ast's own compiled (vectorized NumPy) right-hand side.
:func:`jax_peer`, :func:`casadi_peer`
    ``jit(vmap(jacfwd(cell_rhs)))`` and a CasADi SX per-cell Jacobian mapped
    over cells (C code generation + ``gcc -O3`` when a compiler is present,
    else the SX virtual machine). Optional: ``None`` with a printed reason
    when the package is missing.

Checks: :func:`check_peer_against_assemble` evaluates a peer and
``esmjac.assemble`` at one random positive point and returns the maximum
relative error (asserting it is below ``rtol``); :func:`check_rhs_against_earthsci`
does the same for a lane kernel's ``rhs``. Timing: :func:`median_time`,
and ``python benchmarks/peers.py`` for the measurements themselves.

Importing this module has no side effects (SymPy, Numba, JAX and CasADi are
imported lazily).
"""
from __future__ import annotations

import copy
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

__all__ = [
    "PeerError", "PerCellModel", "per_cell_model", "resize_cells",
    "HandRolled", "handrolled",
    "FDJacobian", "scipy_fd", "lane_sparsity",
    "EarthsciRHS", "earthsci_rhs",
    "LanePeer", "jax_peer", "casadi_peer",
    "random_point", "lane_values_to_csr", "max_rel_err",
    "check_peer_against_assemble", "check_rhs_against_earthsci",
    "median_time",
]


class PeerError(ValueError):
    """The model is outside what a peer supports (with the reason)."""


# ═══════════════════════════════════════════════════════════════════════════
#  The per-cell model: species, parameters, forcing and RHS bodies
# ═══════════════════════════════════════════════════════════════════════════

#: ESM ops the peers translate (anything else raises PeerError).
SUPPORTED_OPS = ("+", "-", "*", "/", "^", "pow", "neg", "exp", "log", "log10", "sqrt")


@dataclass
class PerCellModel:
    """One per-cell model, lowered to SymPy.

    ``rhs`` holds one SymPy expression per species over the symbols
    ``s{j}`` (species), ``f{j}`` (forcing, per lane) and ``k{j}`` (lane-
    invariant subexpressions: maximal parameter-only factors of products,
    i.e. rate constants); ``rate_defs`` gives each ``k{j}`` over the scalar
    parameter symbols ``q{j}``. ``rhs_plain`` is the same without hoisting
    (over ``s``, ``q``, ``f``).
    """

    name: str
    cell_set: str
    n_cells: int                    # cells in the loaded document
    species: list                   # ODE states, declaration order
    params: list                    # scalar parameters, declaration order
    forcing: list                   # per-cell parameters, declaration order
    p_default: np.ndarray
    forcing_defaults: list          # per forcing: float or list (cycled)
    species_defaults: list          # per species: float or list or None
    s_syms: list
    q_syms: list
    f_syms: list
    k_syms: list
    rate_defs: list                 # SymPy over q_syms, one per k_sym
    rhs: list                       # SymPy over s, f, k
    rhs_plain: list                 # SymPy over s, f, q
    view: Any = None

    @property
    def n_species(self) -> int:
        return len(self.species)

    def default_p(self) -> np.ndarray:
        return self.p_default.copy()

    def default_forcing(self, L: int) -> np.ndarray:
        out = np.empty(len(self.forcing) * L)
        for j, d in enumerate(self.forcing_defaults):
            out[j * L:(j + 1) * L] = _cycle(d, L)
        return out

    def default_state(self, L: int) -> np.ndarray:
        out = np.empty(self.n_species * L)
        for j, d in enumerate(self.species_defaults):
            out[j * L:(j + 1) * L] = _cycle(1.0 if d is None else d, L)
        return out


def _cycle(d, L: int) -> np.ndarray:
    if isinstance(d, (list, tuple, np.ndarray)):
        a = np.asarray(d, dtype=float).ravel()
        return a[np.arange(L) % len(a)]
    return np.full(L, float(d))


def _num_default(d):
    """A default usable as a number / per-cell list, or None."""
    if isinstance(d, bool):
        return None
    if isinstance(d, (int, float)):
        return float(d)
    if isinstance(d, (list, tuple)) and d and all(isinstance(x, (int, float)) for x in d):
        return [float(x) for x in d]
    return None


def per_cell_model(source, model: str | None = None) -> PerCellModel:
    """Load ``source`` (path, JSON text, dict, EsmFile) and lower its per-cell
    ODEs to SymPy (observed variables inlined). Raises :class:`PeerError`
    for anything that is not a pointwise per-cell system: a read of a
    neighbouring cell, a state that is not 1-D over the cell set, ``t``,
    or an op outside :data:`SUPPORTED_OPS`."""
    import sympy

    from esmjac.calculus.inline import inline_observed
    from esmjac.model.expr import AGG, Node
    from esmjac.model.load import lhs_state, load_view
    from esmjac.model.layout import ode_states

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        view = load_view(source, model)
    species = ode_states(view)
    if not species:
        raise PeerError("the model has no ODE states")
    obs = dict(view.observed)

    bodies: dict = {}
    cell_set = None
    for lhs, rhs in view.equations:
        st = lhs_state(lhs)
        if st is None or st not in species:
            continue
        rhs = inline_observed(rhs, obs)
        if isinstance(lhs, Node) and lhs.op == AGG:          # aggregate{D(index(X, i))} = rhs(i)
            oidx = [str(x) for x in (lhs.attr("output_idx") or ())]
            ranges = dict(lhs.attr("ranges") or ())
            body = rhs
            d = lhs.body.args[0]
            if len(oidx) != 1 or len(d.args) != 2 or d.args[1] != oidx[0]:
                raise PeerError(f"equation of `{st}`: LHS is not a pointwise per-cell derivative")
        elif isinstance(rhs, Node) and rhs.op == AGG:         # D(X) = aggregate{body(i)}
            oidx = [str(x) for x in (rhs.attr("output_idx") or ())]
            ranges = dict(rhs.attr("ranges") or ())
            body = rhs.body
            if len(oidx) != 1 or rhs.attr("reduce") not in (None, "+") or rhs.attr("filter") is not None:
                raise PeerError(f"equation of `{st}`: RHS is not a plain 1-D per-cell aggregate")
        else:
            raise PeerError(f"equation of `{st}`: RHS is not a per-cell aggregate "
                            f"(got `{getattr(rhs, 'op', rhs)}`)")
        idx = oidx[0]
        r = ranges.get(idx)
        rd = dict(r) if isinstance(r, tuple) and r and isinstance(r[0], tuple) else r
        if not (isinstance(rd, dict) and "from" in rd):
            raise PeerError(f"equation of `{st}`: range of `{idx}` is not a whole index set")
        cs = str(rd["from"])
        if cell_set is None:
            cell_set = cs
        elif cs != cell_set:
            raise PeerError(f"equations range over two index sets (`{cell_set}`, `{cs}`)")
        if st in bodies:
            raise PeerError(f"state `{st}` has two equations")
        bodies[st] = (body, idx)
    missing = [s for s in species if s not in bodies]
    if missing:
        raise PeerError(f"states without a per-cell equation: {missing}")
    n_cells = view.index_sets.get(cell_set)
    for s in species:
        if view.variables[s].shape != (n_cells,):
            raise PeerError(f"state `{s}` is not 1-D over `{cell_set}`")

    params, forcing = [], []
    for n, v in view.variables.items():
        if v.kind != "parameter":
            continue
        if v.shape == ():
            params.append(n)
        elif v.shape == (n_cells,):
            forcing.append(n)
        else:
            raise PeerError(f"parameter `{n}` has shape {v.shape}, not scalar or per-cell")
    p_default = []
    for n in params:
        d = _num_default(view.variables[n].default)
        if not isinstance(d, float):
            raise PeerError(f"scalar parameter `{n}` has no numeric default")
        p_default.append(d)
    f_defaults = []
    for n in forcing:
        d = _num_default(view.variables[n].default)
        if d is None:
            raise PeerError(f"per-cell parameter `{n}` has no numeric default")
        f_defaults.append(d)
    s_defaults = [_num_default(view.variables[s].default) for s in species]

    s_syms = [sympy.Symbol(f"s{j}", real=True) for j in range(len(species))]
    q_syms = [sympy.Symbol(f"q{j}", real=True) for j in range(len(params))]
    f_syms = [sympy.Symbol(f"f{j}", real=True) for j in range(len(forcing))]
    conv = _ToSympy(dict(zip(species, s_syms)), dict(zip(params, q_syms)),
                    dict(zip(forcing, f_syms)))
    rhs_h, rhs_p = [], []
    for s in species:
        body, idx = bodies[s]
        try:
            rhs_h.append(conv(body, idx, hoist=True))
            rhs_p.append(conv(body, idx, hoist=False))
        except PeerError as exc:
            raise PeerError(f"equation of `{s}`: {exc}") from None
    return PerCellModel(
        view.name, cell_set, n_cells, species, params, forcing,
        np.asarray(p_default, dtype=float), f_defaults, s_defaults,
        s_syms, q_syms, f_syms, conv.k_syms, conv.k_defs, rhs_h, rhs_p, view)


class _ToSympy:
    """ESM ``Node`` → SymPy, with optional hoisting of lane-invariant
    (parameter-only, non-integer-literal) factors of products into ``k``
    symbols (memoized on the interned node, so one rate constant is one
    symbol wherever it appears)."""

    def __init__(self, species: dict, params: dict, forcing: dict):
        self.species, self.params, self.forcing = species, params, forcing
        self.k_syms: list = []
        self.k_defs: list = []
        self._k_of: dict = {}
        self._pnames = frozenset(params)

    def __call__(self, e, idx: str, hoist: bool):
        self.idx = idx
        self.memo: dict = {}
        return self._go(e, hoist)

    def _invariant(self, e) -> bool:
        from esmjac.model.expr import free_names
        if isinstance(e, (int, float)):
            return True
        return free_names(e) <= self._pnames

    def _k(self, nodes):
        import sympy
        from esmjac.model.expr import node
        key = nodes[0] if len(nodes) == 1 else node("*", nodes)
        k = self._k_of.get(key)
        if k is None:
            expr = self._go(key, hoist=False)
            k = sympy.Symbol(f"k{len(self.k_syms)}", real=True)
            self.k_syms.append(k)
            self.k_defs.append(expr)
            self._k_of[key] = k
        return k

    def _go(self, e, hoist: bool):
        import sympy
        from esmjac.model.expr import Node

        if isinstance(e, bool):
            raise PeerError("boolean literal")
        if isinstance(e, int):
            return sympy.Integer(e)
        if isinstance(e, float):
            return sympy.Float(e)
        if isinstance(e, str):
            if e in self.params:
                return self.params[e]
            if e == "t":
                raise PeerError("explicit time dependence (`t`) is not supported by the peers")
            if e in self.species or e in self.forcing:
                raise PeerError(f"whole-array read of `{e}` (not a per-cell read)")
            raise PeerError(f"unknown name `{e}`")
        if not isinstance(e, Node):
            raise PeerError(f"not an expression: {e!r}")
        key = (id(e), hoist)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        r = self._node(e, hoist)
        self.memo[key] = r
        return r

    def _node(self, e, hoist: bool):
        import sympy
        o = e.op
        if o == "index":
            head, rest = e.args[0], e.args[1:]
            if len(rest) != 1 or rest[0] != self.idx or not isinstance(head, str):
                raise PeerError(f"`index` read {e!r} is not a same-cell read `index(X, {self.idx})`")
            if head in self.species:
                return self.species[head]
            if head in self.forcing:
                return self.forcing[head]
            raise PeerError(f"per-cell read of `{head}`, which is neither a state nor a per-cell parameter")
        if o not in SUPPORTED_OPS:
            raise PeerError(f"op `{o}` is not supported by the peers (supported: {', '.join(SUPPORTED_OPS)})")
        if hoist and self._invariant(e):
            return self._k([e])
        if hoist and o == "*":
            # small integer literals are stoichiometric coefficients: left out
            # so that one rate constant is one symbol in every equation
            grp = [self._invariant(a) and not _small_int(a) for a in e.args]
            inv = [a for a, g in zip(e.args, grp) if g]
            if inv and not (len(inv) == 1 and isinstance(inv[0], (str, float, int))):
                rest = [self._go(a, hoist) for a, g in zip(e.args, grp) if not g]
                return sympy.Mul(*rest, self._k(inv))
        a = [self._go(x, hoist) for x in e.args]
        if o == "+":
            return sympy.Add(*a)
        if o == "*":
            return sympy.Mul(*a)
        if o == "-":
            if len(a) == 1:
                return -a[0]
            r = a[0]
            for x in a[1:]:
                r = r - x
            return r
        if o == "neg":
            return -a[0]
        if o == "/":
            return a[0] / a[1]
        if o in ("^", "pow"):
            return a[0] ** a[1]
        if len(a) != 1:
            raise PeerError(f"`{o}` with {len(a)} arguments")
        if o == "exp":
            return sympy.exp(a[0])
        if o == "log":
            return sympy.log(a[0])
        if o == "log10":
            return sympy.log(a[0]) / sympy.log(10)
        if o == "sqrt":
            return sympy.sqrt(a[0])
        raise PeerError(f"op `{o}`")        # pragma: no cover


def _small_int(a) -> bool:
    return isinstance(a, int) and abs(a) <= 100


def _jacobian_pattern(pcm: PerCellModel):
    """(pattern, entries) of the per-cell Jacobian of the hoisted RHS."""
    import sympy
    J = sympy.Matrix(pcm.rhs).jacobian(pcm.s_syms)
    pattern, entries = [], []
    n = pcm.n_species
    for r in range(n):
        for c in range(n):
            e = J[r, c]
            if e != 0:
                pattern.append((r, c))
                entries.append(e)
    return pattern, entries


def resize_cells(source, L: int, model: str | None = None) -> dict:
    """A copy of ``source`` (path, JSON text or dict) as a dict whose cell
    index set has ``L`` elements; list-valued defaults over it are cycled."""
    pcm = per_cell_model(source, model)
    if isinstance(source, dict):
        doc = copy.deepcopy(source)
    elif isinstance(source, (str, pathlib.Path)) and not str(source).lstrip().startswith("{"):
        doc = json.loads(pathlib.Path(source).read_text())
    elif isinstance(source, str):
        doc = json.loads(source)
    else:
        if pcm.n_cells == L:
            return source
        raise PeerError(f"cannot resize a {type(source).__name__}; pass a path, JSON text or dict")
    doc["index_sets"][pcm.cell_set]["size"] = int(L)
    for m in doc.get("models", {}).values():
        for var in m.get("variables", {}).values():
            d = var.get("default")
            if var.get("shape") == [pcm.cell_set] and isinstance(d, list) and d:
                var["default"] = [d[i % len(d)] for i in range(L)]
    return doc


# ═══════════════════════════════════════════════════════════════════════════
#  1. The hand-rolled Numba kernel
# ═══════════════════════════════════════════════════════════════════════════

def _printer():
    from sympy.printing.pycode import PythonCodePrinter

    class _P(PythonCodePrinter):
        """Python/Numba source: full-precision floats, small integer powers
        as products."""

        def _print_Float(self, e):
            return repr(float(e))

        def _print_Pow(self, e, rational=False):
            b, x = e.args
            if x.is_Integer:
                k = int(x)
                bs = self.parenthesize(b, 100)      # atom-level parentheses
                if k == 2:
                    return f"({bs}*{bs})"
                if k == 3:
                    return f"({bs}*{bs}*{bs})"
                if k == -1:
                    return f"(1.0/{bs})"
                if k == -2:
                    return f"(1.0/({bs}*{bs}))"
            return super()._print_Pow(e, rational=rational)

    return _P({"fully_qualified_modules": True, "standard": "python3"})


@dataclass
class HandRolled:
    """A lane kernel (see module doc) generated like an expert would."""

    pattern: list
    jac: Callable
    rhs: Callable
    build_s: float
    model: PerCellModel
    source_jac: str
    source_rhs: str
    timings: dict = field(default_factory=dict)

    @property
    def n_species(self) -> int:
        return self.model.n_species

    @property
    def nnz(self) -> int:
        return len(self.pattern)

    def default_p(self):
        return self.model.default_p()

    def default_forcing(self, L: int):
        return self.model.default_forcing(L)


def _kernel_source(fname: str, pcm: PerCellModel, outputs: list, hoist_cse: bool = True) -> str:
    """One ``@njit`` function: parameters read and rate constants computed
    before a single ``for l in range(L):`` loop whose straight-line body
    reads the lane's species and forcing, runs the CSE'd temporaries and
    stores ``out[k*L + l]``."""
    import sympy

    pr = _printer()
    # rate constants actually needed (transitively through nothing: k defs are over q only)
    used = set()
    for e in outputs:
        used |= e.free_symbols
    ks = [(k, d) for k, d in zip(pcm.k_syms, pcm.rate_defs) if k in used]
    pre_subs, pre_red = sympy.cse([d for _, d in ks], symbols=sympy.numbered_symbols("c"),
                                  order="none") if ks else ([], [])
    pre_used = set()
    for _, d in pre_subs:
        pre_used |= d.free_symbols
    for d in pre_red:
        pre_used |= d.free_symbols
    subs, red = sympy.cse(outputs, symbols=sympy.numbered_symbols("x"), order="none")
    lines = [
        "@numba.njit(cache=False, fastmath=False, error_model='numpy')",
        f"def {fname}(u, p, forcing, out, L):",
    ]
    for j, q in enumerate(pcm.q_syms):     # every parameter read once, before the loop
        if q in pre_used or q in used:
            lines.append(f"    {q} = p[{j}]")
    for sym, d in pre_subs:
        lines.append(f"    {sym} = {pr.doprint(d)}")
    for (k, _), d in zip(ks, pre_red):
        lines.append(f"    {k} = {pr.doprint(d)}")
    lines.append("    for l in range(L):")
    loop_used = set()
    for _, d in subs:
        loop_used |= d.free_symbols
    for d in red:
        loop_used |= d.free_symbols
    for j, s in enumerate(pcm.s_syms):
        if s in loop_used:
            lines.append(f"        {s} = u[{j}*L + l]")
    for j, f in enumerate(pcm.f_syms):
        if f in loop_used:
            lines.append(f"        {f} = forcing[{j}*L + l]")
    for sym, d in subs:
        lines.append(f"        {sym} = {pr.doprint(d)}")
    for k, d in enumerate(red):
        lines.append(f"        out[{k}*L + l] = {pr.doprint(d)}")
    if not outputs:
        lines.append("        pass")
    return "\n".join(lines) + "\n"


def _compile(src: str, fname: str, tag: str):
    import numba
    ns = {"numba": numba, "math": math}
    code = compile(src, f"<esmjac-peer:{tag}:{fname}>", "exec")
    exec(code, ns)
    return ns[fname]


def handrolled(source, model: str | None = None, *, hoist: bool = True) -> HandRolled:
    """The expert's hand-written kernel, generated.

    The per-cell RHS bodies go to SymPy (species → ``s{j}``, ``index(X, i)``
    → the symbol of ``X``, scalar parameters read from ``p``, per-cell
    parameters from ``forcing`` per lane, observed inlined); with ``hoist``
    (the default, as a human writes ``k = A*exp(-E/T)`` once) maximal
    parameter-only factors are computed once before the lane loop. Then
    ``Matrix.jacobian``, ``sympy.cse`` over all non-zero entries (and
    separately over the RHS), printed into one
    ``@numba.njit(cache=False, fastmath=False, error_model="numpy")``
    function each with a single ``for l in range(L):`` loop; both are compiled
    and warmed up. ``build_s`` covers all of it.

    ``jac(u, p, forcing, out, L)`` fills ``out[k*L + l]`` for ``pattern[k]``;
    ``rhs(u, p, forcing, out, L)`` fills ``out[s*L + l]``. Arrays must be
    C-contiguous float64 (others trigger a new Numba specialization).
    """
    import sympy

    t0 = time.perf_counter()
    pcm = per_cell_model(source, model)
    if not hoist:   # fold the rate constants back in: every k recomputed per lane
        back = dict(zip(pcm.k_syms, pcm.rate_defs))
        pcm.rhs = [sympy.sympify(e).xreplace(back) for e in pcm.rhs]
    t1 = time.perf_counter()
    pattern, entries = _jacobian_pattern(pcm)
    t2 = time.perf_counter()
    src_j = _kernel_source("peer_jac", pcm, entries)
    src_r = _kernel_source("peer_rhs", pcm, list(pcm.rhs))
    t3 = time.perf_counter()
    jac = _compile(src_j, "peer_jac", pcm.name)
    rhs = _compile(src_r, "peer_rhs", pcm.name)
    n, nnz = pcm.n_species, len(pattern)
    L = 2
    u = pcm.default_state(L)
    p = pcm.default_p()
    f = pcm.default_forcing(L)
    jac(u, p, f, np.empty(max(nnz, 1) * L), L)
    rhs(u, p, f, np.empty(n * L), L)
    t4 = time.perf_counter()
    return HandRolled(pattern, jac, rhs, t4 - t0, pcm, src_j, src_r,
                      {"lower_s": t1 - t0, "jacobian_s": t2 - t1, "cse_print_s": t3 - t2,
                       "numba_s": t4 - t3})


# ═══════════════════════════════════════════════════════════════════════════
#  2. SciPy grouped finite differences
# ═══════════════════════════════════════════════════════════════════════════

def lane_sparsity(pattern, n_species: int, L: int):
    """The full (n*L)² sparsity (csr_array of ones) of a per-cell ``pattern``
    in the lane layout: entries ``(r*L + l, c*L + l)``."""
    from scipy.sparse import csr_array
    if not pattern:
        return csr_array((n_species * L, n_species * L))
    pr = np.array([r for r, _ in pattern], dtype=np.int64)
    pc = np.array([c for _, c in pattern], dtype=np.int64)
    lanes = np.arange(L, dtype=np.int64)
    rows = (pr[:, None] * L + lanes[None, :]).ravel()
    cols = (pc[:, None] * L + lanes[None, :]).ravel()
    m = csr_array((np.ones(rows.size), (rows, cols)), shape=(n_species * L, n_species * L))
    m.sort_indices()
    return m


class FDJacobian:
    """``jac(u)`` → the sparse Jacobian by grouped 2-point differences.

    ``n_groups`` RHS evaluations (+1 for f0 unless passed) per call.
    ``jac, n_groups = scipy_fd(...)`` also unpacks."""

    def __init__(self, rhs, n_total: int, sparsity):
        from scipy.optimize._numdiff import group_columns
        from scipy.sparse import csr_array
        self.rhs = rhs
        self.n_total = int(n_total)
        sp = csr_array(sparsity) if not hasattr(sparsity, "tocsc") else sparsity
        if sp.shape != (self.n_total, self.n_total):
            raise ValueError(f"sparsity has shape {sp.shape}, not {(self.n_total,) * 2}")
        self.sparsity = sp
        t0 = time.perf_counter()
        self.groups = group_columns(sp)
        self.group_s = time.perf_counter() - t0
        self.n_groups = int(self.groups.max()) + 1 if self.groups.size else 0

    def __call__(self, u, f0=None):
        from scipy.optimize._numdiff import approx_derivative
        return approx_derivative(self.rhs, np.asarray(u, dtype=float), method="2-point",
                                 f0=f0, sparsity=(self.sparsity, self.groups))

    def __iter__(self):
        return iter((self, self.n_groups))


def scipy_fd(rhs: Callable, n_total: int, sparsity) -> FDJacobian:
    """SciPy's sparse 2-point finite differences of ``rhs`` (u → du, flat,
    length ``n_total``) over ``sparsity`` (an (n_total, n_total) sparse
    matrix or array; see :func:`lane_sparsity`). Columns are grouped once,
    here, by ``scipy.optimize._numdiff.group_columns``; each call is
    ``approx_derivative(rhs, u, method="2-point", sparsity=(sparsity, groups))``.

    ``rhs`` must return a *fresh* array on every call: approx_derivative
    keeps f0 while it evaluates the perturbed points. earthsci-ast's compiled
    ``rhs_function`` returns the same output buffer each time, so wrap it
    with a copy — :func:`earthsci_rhs` does.
    """
    return FDJacobian(rhs, n_total, sparsity)


# ═══════════════════════════════════════════════════════════════════════════
#  3. earthsci-ast's own right-hand side
# ═══════════════════════════════════════════════════════════════════════════

class EarthsciRHS:
    """``rhs(u)`` → du/dt over the full flat vector in evaluate_rhs order
    (``.names``), by earthsci-ast's compiled vectorized-NumPy RHS
    (``esm_problem(...).build.rhs_function``), copied on every call since
    that function reuses its output buffer."""

    def __init__(self, build, t: float, build_s: float):
        self._f = build.rhs_function
        self.names = list(build.elem_names)
        self.n_total = int(build.total_size)
        self.y0 = np.array(build.y0, dtype=float)
        self.t = float(t)
        self.build_s = build_s
        self.build = build

    def __call__(self, u):
        return np.array(self._f(self.t, np.asarray(u, dtype=float)), dtype=float, copy=True)


def earthsci_rhs(source, model: str | None = None, *, p: dict | None = None,
                 t: float = 0.0, compiler: str | None = None) -> EarthsciRHS:
    """earthsci-ast's compiled RHS of ``source`` as ``u → du`` (a fresh copy
    each call) with ``.names`` (element order of ``evaluate_rhs``).

    ``earthsci_ast.esm_problem(...).build.rhs_function`` is the whole-box
    vectorized NumPy evaluator (``compiler="native"``); it is built once
    here and is far faster than ``evaluate_rhs``, which re-builds from the
    document and goes through name-keyed dicts on every call. ``p`` binds
    parameters by bare or scoped name; a per-cell parameter may be given as
    an array of length L (e.g. ``{"fj": forcing}``).
    """
    import earthsci_ast as ea
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prob = ea.esm_problem(source, (float(t), float(t) + 1.0), p=p, model_name=model,
                              compiler=compiler)
        build = prob.build
    return EarthsciRHS(build, t, time.perf_counter() - t0)


# ═══════════════════════════════════════════════════════════════════════════
#  4. Optional peers: JAX and CasADi
# ═══════════════════════════════════════════════════════════════════════════

@dataclass
class LanePeer:
    """A lane kernel from a framework (same call convention as HandRolled)."""

    name: str
    pattern: list
    jac: Callable
    rhs: Callable | None
    build_s: float
    model: PerCellModel
    info: dict = field(default_factory=dict)

    @property
    def n_species(self) -> int:
        return self.model.n_species

    @property
    def nnz(self) -> int:
        return len(self.pattern)


def _sym_eval(exprs, env: dict, fns: dict):
    """Evaluate SymPy expressions over ``env`` (Symbol → framework value)
    with the framework's ``fns`` (exp, log, sqrt), sharing subexpressions."""
    import sympy
    memo: dict = {}

    def go(e):
        hit = memo.get(e)
        if hit is not None:
            return hit
        if e.is_Symbol:
            r = env[e]
        elif e.is_Number:
            r = float(e)
        elif e.is_Add:
            a = [go(x) for x in e.args]
            r = a[0]
            for x in a[1:]:
                r = r + x
        elif e.is_Mul:
            a = [go(x) for x in e.args]
            r = a[0]
            for x in a[1:]:
                r = r * x
        elif e.is_Pow:
            b, x = e.args
            if x.is_Integer and abs(int(x)) <= 3:
                k = int(x)
                bb = go(b)
                r = bb
                for _ in range(abs(k) - 1):
                    r = r * bb
                if k < 0:
                    r = 1.0 / r
            elif x == sympy.Rational(1, 2):
                r = fns["sqrt"](go(b))
            else:
                r = go(b) ** go(x)
        elif isinstance(e, sympy.exp):
            r = fns["exp"](go(e.args[0]))
        elif isinstance(e, sympy.log) and len(e.args) == 1:
            r = fns["log"](go(e.args[0]))
        else:
            raise PeerError(f"cannot evaluate `{e.func.__name__}` in this framework")
        memo[e] = r
        return r

    return [go(sympy.sympify(e)) for e in exprs]


def jax_peer(source, model: str | None = None, *, L: int | None = None):
    """``jit(vmap(jacfwd(cell_rhs)))`` over cells, or None (with a printed
    reason) when JAX is not importable.

    The per-cell RHS is written with ``jax.numpy`` from the same SymPy
    lowering; rate constants are computed from ``p`` inside the jitted
    function but outside ``vmap`` (unbatched). ``jacfwd`` gives the dense
    n×n block per cell; the pattern entries are gathered inside ``jit``.
    Float64 is switched on (``jax_enable_x64``) when the peer is built.
    ``jit`` compiles once per lane count; the build warms up at ``L``
    (default 2).
    For single-threaded timing set ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false
    intra_op_parallelism_threads=1`` before JAX is first imported.
    """
    try:
        import jax
        import jax.numpy as jnp
    except Exception as exc:             # pragma: no cover - depends on the env
        print(f"jax_peer: JAX is not importable ({type(exc).__name__}: {exc}); skipped")
        return None
    t0 = time.perf_counter()
    jax.config.update("jax_enable_x64", True)
    pcm = per_cell_model(source, model)
    pattern, _ = _jacobian_pattern(pcm)
    n, nf = pcm.n_species, len(pcm.f_syms)
    fns = {"exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt}
    rows = np.array([r for r, _ in pattern], dtype=np.int64)
    cols = np.array([c for _, c in pattern], dtype=np.int64)
    flat = rows * n + cols

    def rates(p):
        env = {q: p[j] for j, q in enumerate(pcm.q_syms)}
        return jnp.stack(_sym_eval(pcm.rate_defs, env, fns)) if pcm.k_syms else jnp.zeros(0)

    def cell_rhs(y, k, p, f):
        env = {s: y[j] for j, s in enumerate(pcm.s_syms)}
        env.update({ks: k[j] for j, ks in enumerate(pcm.k_syms)})
        env.update({qs: p[j] for j, qs in enumerate(pcm.q_syms)})
        env.update({fs: f[j] for j, fs in enumerate(pcm.f_syms)})
        vals = _sym_eval(pcm.rhs, env, fns)
        return jnp.stack([jnp.asarray(v, dtype=jnp.float64) for v in vals])

    def _jac(u, p, forcing):
        L = u.shape[0] // n
        U = u.reshape(n, L)
        F = forcing.reshape(nf, L)
        k = rates(p)
        J = jax.vmap(jax.jacfwd(cell_rhs), in_axes=(1, None, None, 1), out_axes=2)(U, k, p, F)  # (n, n, L)
        return J.reshape(n * n, L)[flat].reshape(-1)

    def _rhs(u, p, forcing):
        L = u.shape[0] // n
        k = rates(p)
        R = jax.vmap(cell_rhs, in_axes=(1, None, None, 1), out_axes=1)(u.reshape(n, L), k, p,
                                                                        forcing.reshape(nf, L))
        return R.reshape(-1)

    jj = jax.jit(_jac)
    jr = jax.jit(_rhs)

    def jac(u, p, forcing, out, L):
        out[:] = np.asarray(jj(u, p, forcing))

    def rhs(u, p, forcing, out, L):
        out[:] = np.asarray(jr(u, p, forcing))

    L = int(L or 2)
    u, p, f = pcm.default_state(L), pcm.default_p(), pcm.default_forcing(L)
    jac(u, p, f, np.empty(len(pattern) * L), L)
    rhs(u, p, f, np.empty(n * L), L)
    return LanePeer("jax", pattern, jac, rhs, time.perf_counter() - t0, pcm,
                    {"jit_jac": jj, "jit_rhs": jr, "note": "recompiles once per new L (shape)"})


def casadi_peer(source, model: str | None = None, *, codegen: bool | None = None,
                cc: str | None = None, L: int | None = None):
    """A CasADi SX function of one cell, its Jacobian by ``casadi.jacobian``,
    mapped over cells with ``Function.map(L, "serial")``; or None (printed
    reason) when CasADi is not importable.

    The per-cell functions take each species and each forcing as a separate
    *scalar* input (and the rate constants ``k``, computed once per call by
    their own SX function of ``p``, plus ``p`` itself, as unmapped vector
    inputs), and return each Jacobian nonzero (resp. each du/dt) as a
    separate scalar output. Mapped over ``L`` cells, every mapped input and
    output is then a 1×L row — exactly one contiguous block of the lane
    layout — so no transposition is needed (``k`` and ``p`` are repeated
    per cell into reused buffers, as a plain serial map wants them).

    With ``codegen`` (default: when a C compiler is found) the *mapped*
    function is generated as C (CasADi's own serial loop over cells),
    compiled with ``<cc> -O3 -shared -fPIC`` and called through CasADi's
    generated C API (``f(arg, res, iw, w, mem)``) with ctypes pointers into
    the caller's arrays: zero-copy. Map and compile happen once per new
    ``L`` (the build does it for ``L``, default 2). Without it the mapped SX
    function runs in CasADi's virtual machine with DM conversions.
    The pattern is CasADi's own structural pattern of the Jacobian.
    """
    try:
        import casadi as ca
    except Exception as exc:             # pragma: no cover - depends on the env
        print(f"casadi_peer: CasADi is not importable ({type(exc).__name__}: {exc}); skipped")
        return None
    import ctypes

    t0 = time.perf_counter()
    pcm = per_cell_model(source, model)
    n, nq, nf, nk = pcm.n_species, len(pcm.q_syms), len(pcm.f_syms), len(pcm.k_syms)
    ys = [ca.SX.sym(f"y{j}") for j in range(n)]
    fs = [ca.SX.sym(f"f{j}") for j in range(nf)]
    q = ca.SX.sym("q", nq)
    k = ca.SX.sym("k", nk)
    fns = {"exp": ca.exp, "log": ca.log, "sqrt": ca.sqrt}
    env = dict(zip(pcm.s_syms, ys))
    env.update(zip(pcm.f_syms, fs))
    env.update({ks: k[j] for j, ks in enumerate(pcm.k_syms)})
    env.update({qs: q[j] for j, qs in enumerate(pcm.q_syms)})
    F = ca.vertcat(*_sym_eval(pcm.rhs, env, fns))
    J = ca.jacobian(F, ca.vertcat(*ys))
    Jt = J.T                                    # CCS of Jᵀ = row-major order of J
    tr, tc = Jt.sparsity().get_triplet()        # (col of J, row of J)
    pattern = [(int(r), int(c)) for c, r in zip(tr, tc)]
    if pattern != sorted(pattern):
        raise AssertionError("CasADi nonzeros are not row-major")
    jnz = ca.vertsplit(Jt.nz[:]) if pattern else []
    qenv = {qs: q[j] for j, qs in enumerate(pcm.q_syms)}
    Kx = ca.vertcat(*_sym_eval(pcm.rate_defs, qenv, fns)) if nk else ca.SX(0, 1)
    ins = [*ys, k, q, *fs]
    f_jac = ca.Function("peer_cell_jac", ins, jnz)
    f_rhs = ca.Function("peer_cell_rhs", ins, ca.vertsplit(F))
    f_k = ca.Function("peer_rates", [q], [Kx])
    if codegen is None:
        cc = cc or shutil.which("gcc") or shutil.which("cc")
        codegen = cc is not None
    if codegen:
        cc = cc or shutil.which("gcc") or shutil.which("cc")
        if cc is None:
            raise PeerError("casadi_peer(codegen=True): no C compiler found")
    info: dict = {"route": "codegen" if codegen else "sx-vm", "cc": cc, "compile_s": {}}
    tmpdir = tempfile.mkdtemp(prefix="esmjac_casadi_") if codegen else None
    info["dir"] = tmpdir
    maps: dict = {}

    def _codegen(fn, L):
        # the plain serial Map (CasADi's pointer-stepping loop, no copies);
        # with reduce_in for k and p it would wrap the map in an MX function
        # that copies every input and output through its work vector
        m = fn.map(L, "serial")
        name = m.name()
        tc0 = time.perf_counter()
        gen = ca.CodeGenerator(f"{name}.c", {"with_header": False})
        gen.add(m)
        gen.generate(tmpdir + os.sep)
        so = os.path.join(tmpdir, f"{name}.so")
        subprocess.run([cc, "-O3", "-shared", "-fPIC", "-o", so, os.path.join(tmpdir, f"{name}.c"), "-lm"],
                       check=True, capture_output=True)
        info["compile_s"][name] = time.perf_counter() - tc0
        lib = ctypes.CDLL(so)
        cint = ctypes.c_longlong
        sz = [cint() for _ in range(4)]
        getattr(lib, f"{name}_work")(*(ctypes.byref(s) for s in sz))
        n_arg, n_res, n_iw, n_w = (max(int(s.value), 1) for s in sz)
        f = getattr(lib, name)
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int]
        arg = (ctypes.c_void_p * n_arg)()
        res = (ctypes.c_void_p * n_res)()
        iw = np.zeros(n_iw, dtype=np.int64)
        w = np.zeros(n_w)
        kt = np.zeros((L, max(nk, 1)))      # k and p repeated per cell (nk×L, nq×L column-major)
        qt = np.zeros((L, max(nq, 1)))
        return lib, f, arg, res, iw, w, kt, qt

    def _native(fn, nout):
        def call(u, p, forcing, out, L):
            for a, size in ((u, n * L), (forcing, nf * L), (out, nout * L)):
                if not (isinstance(a, np.ndarray) and a.dtype == np.float64
                        and a.flags.c_contiguous and a.size == size):
                    raise ValueError("casadi peer: u/forcing/out must be C-contiguous float64 "
                                     "arrays of the lane layout's sizes")
            key = (fn.name(), L)
            h = maps.get(key)
            if h is None:
                h = maps[key] = _codegen(fn, L)
            lib, f, arg, res, iw, w, kt, qt = h
            if nk:
                kt[:] = np.asarray(f_k(p), dtype=float).reshape(1, -1)
            if nq:
                qt[:] = np.asarray(p, dtype=float).reshape(1, -1)
            ub, ob, fb = u.ctypes.data, out.ctypes.data, forcing.ctypes.data
            for j in range(n):
                arg[j] = ub + 8 * j * L
            arg[n] = kt.ctypes.data
            arg[n + 1] = qt.ctypes.data
            for j in range(nf):
                arg[n + 2 + j] = fb + 8 * j * L
            for j in range(nout):
                res[j] = ob + 8 * j * L
            if f(arg, res, iw.ctypes.data, w.ctypes.data, 0) != 0:
                raise RuntimeError(f"CasADi function {fn.name()} failed")
        return call

    def _vm(fn, nout):
        def call(u, p, forcing, out, L):
            key = (fn.name(), L)
            m = maps.get(key)
            if m is None:
                m = maps[key] = fn.map(L, "serial")
            kv = f_k(p) if nk else ca.DM(0, 1)
            args = [u[j * L:(j + 1) * L].reshape(1, L) for j in range(n)] + [kv, p] + \
                   [forcing[j * L:(j + 1) * L].reshape(1, L) for j in range(nf)]
            r = m.call(args)
            for j in range(nout):
                out[j * L:(j + 1) * L] = np.asarray(r[j]).reshape(-1)
        return call

    mk = _native if codegen else _vm
    jac = mk(f_jac, len(pattern))
    rhs = mk(f_rhs, n)
    LL = int(L or 2)                     # warm-up (and, with codegen, compile) at L
    u, p0, f0 = pcm.default_state(LL), pcm.default_p(), pcm.default_forcing(LL)
    jac(u, p0, f0, np.empty(len(pattern) * LL), LL)
    rhs(u, p0, f0, np.empty(n * LL), LL)
    return LanePeer("casadi", pattern, jac, rhs, time.perf_counter() - t0, pcm, info)


# ═══════════════════════════════════════════════════════════════════════════
#  5. Verification against esmjac.assemble
# ═══════════════════════════════════════════════════════════════════════════

def random_point(pcm: PerCellModel, L: int, seed: int = 0, *, spread: float = 1.0):
    """(u, forcing) at a random positive point: each species at its default
    times ``exp(U(-spread, spread))`` (``U(0.2, 1)`` without a positive
    default), each forcing at its default times ``U(0.5, 1.5)``."""
    rng = np.random.default_rng(seed)
    u = np.empty(pcm.n_species * L)
    for j, d in enumerate(pcm.species_defaults):
        base = _cycle(d, L) if d is not None else None
        if base is None or not np.all(base > 0):
            u[j * L:(j + 1) * L] = rng.uniform(0.2, 1.0, L)
        else:
            u[j * L:(j + 1) * L] = base * np.exp(rng.uniform(-spread, spread, L))
    f = pcm.default_forcing(L)
    f *= rng.uniform(0.5, 1.5, f.size)
    return u, f


def lane_values_to_csr(pattern, values, n_species: int, L: int):
    """Lane-kernel output (``values[k*L + l]``) as the full csr_array in the
    lane layout (= evaluate_rhs element order)."""
    from scipy.sparse import csr_array
    N = n_species * L
    if not pattern:
        return csr_array((N, N))
    pr = np.array([r for r, _ in pattern], dtype=np.int64)
    pc = np.array([c for _, c in pattern], dtype=np.int64)
    lanes = np.arange(L, dtype=np.int64)
    rows = (pr[:, None] * L + lanes[None, :]).ravel()
    cols = (pc[:, None] * L + lanes[None, :]).ravel()
    return csr_array((np.asarray(values, dtype=float).reshape(-1), (rows, cols)), shape=(N, N))


def max_rel_err(A, R, floor: float = 1e-8, col_scale=None) -> float:
    """max |A - R| / max(|R|, floor · max_row|R|) over all entries (dense or
    sparse inputs): entrywise relative error, with entries far below their
    row's scale judged against that scale (an entry present in only one of
    A and R counts). With ``col_scale`` (e.g. ``|u|``) both matrices are
    first multiplied by ``diag(col_scale)`` on the right: the error of the
    sensitivities ``∂f_i/∂log u_j``, the fair yardstick for finite
    differences, whose step (and error) is proportional to ``|u_j|``."""
    A = A.toarray() if hasattr(A, "toarray") else np.asarray(A, dtype=float)
    R = R.toarray() if hasattr(R, "toarray") else np.asarray(R, dtype=float)
    if A.shape != R.shape:
        raise ValueError(f"shapes differ: {A.shape} vs {R.shape}")
    if col_scale is not None:
        c = np.abs(np.asarray(col_scale, dtype=float))[None, :]
        A, R = A * c, R * c
    if R.size == 0:
        return 0.0
    rowmax = np.abs(R).max(axis=1, keepdims=True)
    den = np.maximum(np.abs(R), floor * rowmax)
    den = np.where(den > 0, den, 1.0)       # an all-zero reference row: absolute error
    return float((np.abs(A - R) / den).max())


def _assemble_at(pcm_L: PerCellModel, doc_L, model, u, forcing, p=None):
    import esmjac
    L = pcm_L.n_cells
    uu = {s: u[j * L:(j + 1) * L] for j, s in enumerate(pcm_L.species)}
    pp = {fn: forcing[j * L:(j + 1) * L] for j, fn in enumerate(pcm_L.forcing)}
    if p is not None:
        pp.update({n: float(v) for n, v in zip(pcm_L.params, p)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = esmjac.assemble(doc_L, model=model, wrt="states", u=uu, p=pp)
    names = [f"{pcm_L.view.scope}{s}[{l + 1}]" for s in pcm_L.species for l in range(L)]
    if a.rows != names or a.cols != names:
        raise AssertionError("assemble's element order is not the lane layout")
    return a.matrix


def check_peer_against_assemble(peer, source, model: str | None = None, L: int = 8, seed: int = 0,
                                *, rtol: float | None = None, floor: float | None = None,
                                log_scaled: bool | None = None) -> float:
    """Evaluate ``peer`` and ``esmjac.assemble`` at one random positive
    point on ``L`` cells and assert ``max_rel_err <= rtol``; return the
    error.

    ``peer`` is either a lane kernel (``.pattern`` and
    ``.jac(u, p, forcing, out, L)``: HandRolled / jax / casadi) — evaluated
    with random forcing at default scalar parameters — or an
    :class:`FDJacobian` (``peer(u)`` → full matrix) whose RHS was built on
    the same ``L``-cell document at default parameters (forcing stays at
    its defaults).

    Defaults: exact peers ``rtol=1e-10``, ``floor=1e-8``, plain entries;
    an FDJacobian ``rtol=1e-4``, ``floor=1e-3``, ``log_scaled`` (errors of
    ``J·diag(u)``; see :func:`max_rel_err`) — 2-point differences of a
    stiff mechanism land around 1e-5 on that yardstick.
    """
    is_fd = isinstance(peer, FDJacobian)
    rtol = (1e-4 if is_fd else 1e-10) if rtol is None else rtol
    floor = (1e-3 if is_fd else 1e-8) if floor is None else floor
    log_scaled = is_fd if log_scaled is None else log_scaled
    doc_L = resize_cells(source, L, model)
    pcm_L = per_cell_model(doc_L, model)
    u, forcing = random_point(pcm_L, L, seed)
    if isinstance(peer, FDJacobian):
        forcing = pcm_L.default_forcing(L)
        if peer.n_total != pcm_L.n_species * L:
            raise ValueError(f"the FD peer has {peer.n_total} unknowns, the {L}-cell model "
                             f"{pcm_L.n_species * L}; build it on resize_cells(source, {L})")
        A = peer(u)
    else:
        p = pcm_L.default_p()
        out = np.full(len(peer.pattern) * L, np.nan)
        peer.jac(np.ascontiguousarray(u), p, np.ascontiguousarray(forcing), out, L)
        A = lane_values_to_csr(peer.pattern, out, pcm_L.n_species, L)
    R = _assemble_at(pcm_L, doc_L, model, u, forcing)
    err = max_rel_err(A, R, floor, u if log_scaled else None)
    if not err <= rtol:
        raise AssertionError(f"{_peer_name(peer)}: max relative error {err:.3e} > rtol {rtol:.1e}")
    return err


def check_rhs_against_earthsci(peer, source, model: str | None = None, L: int = 8, seed: int = 0,
                               *, rtol: float = 1e-12) -> float:
    """A lane kernel's ``rhs`` against :func:`earthsci_rhs` (per-cell
    parameters bound to the same random forcing) at a random point; asserts
    max |Δ|/max(|ref|, 1e-8·max|ref|) ≤ rtol and returns it."""
    doc_L = resize_cells(source, L, model)
    pcm_L = per_cell_model(doc_L, model)
    u, forcing = random_point(pcm_L, L, seed)
    ref_f = earthsci_rhs(doc_L, model, p={fn: forcing[j * L:(j + 1) * L]
                                          for j, fn in enumerate(pcm_L.forcing)} or None)
    ref = ref_f(u)
    out = np.full(pcm_L.n_species * L, np.nan)
    peer.rhs(u, pcm_L.default_p(), forcing, out, L)
    err = max_rel_err(out[None, :], ref[None, :], 1e-8)
    if not err <= rtol:
        raise AssertionError(f"{_peer_name(peer)} rhs: max relative error {err:.3e} > rtol {rtol:.1e}")
    return err


def _peer_name(peer) -> str:
    return getattr(peer, "name", None) or type(peer).__name__


# ═══════════════════════════════════════════════════════════════════════════
#  Timing
# ═══════════════════════════════════════════════════════════════════════════

def median_time(fn: Callable[[], Any], n: int = 50, warmup: int = 3, *,
                with_min: bool = False):
    """Median wall time (s) of ``n`` calls of ``fn()`` after ``warmup``
    (``(median, min)`` with ``with_min``)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return (statistics.median(ts), min(ts)) if with_min else statistics.median(ts)


def _main(argv=None) -> int:                  # pragma: no cover - a measurement script
    import argparse
    ap = argparse.ArgumentParser(description="Time the benchmark peers on one per-cell model.")
    ap.add_argument("source", nargs="?", default=str(pathlib.Path(__file__).resolve().parent.parent
                                                     / "src" / "esmjac" / "models" / "tropo12.esm"))
    ap.add_argument("--model", default=None)
    ap.add_argument("--cells", type=int, default=10_000)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--fd-calls", type=int, default=5)
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-casadi", action="store_true")
    ap.add_argument("--evaluate-rhs", action="store_true",
                    help="also time one earthsci_ast.evaluate_rhs call (dict in, dict out)")
    a = ap.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import numba
    numba.set_num_threads(1)
    L = a.cells
    res = {}

    hr = handrolled(a.source, a.model)
    print(f"handrolled: build {hr.build_s:.2f} s {hr.timings}, nnz {hr.nnz}", flush=True)
    print(f"  check vs assemble: {check_peer_against_assemble(hr, a.source, a.model):.2e}; "
          f"rhs vs earthsci: {check_rhs_against_earthsci(hr, a.source, a.model):.2e}", flush=True)
    pcm = hr.model
    u, forcing = random_point(pcm, L, 1)
    p = pcm.default_p()
    out_j = np.empty(hr.nnz * L)
    out_r = np.empty(pcm.n_species * L)
    res["handrolled_jac"] = median_time(lambda: hr.jac(u, p, forcing, out_j, L), a.calls, with_min=True)
    res["handrolled_rhs"] = median_time(lambda: hr.rhs(u, p, forcing, out_r, L), a.calls, with_min=True)

    doc = resize_cells(a.source, L, a.model)
    er = earthsci_rhs(doc, a.model)
    print(f"earthsci_rhs: build {er.build_s:.2f} s, n_total {er.n_total}", flush=True)
    res["earthsci_rhs"] = median_time(lambda: er(u), a.calls, with_min=True)
    if a.evaluate_rhs:
        from esmjac.reference.check import _flat, rhs_vector
        flat = _flat(per_cell_model(doc, a.model).view)
        t0 = time.perf_counter()
        rhs_vector(flat, er.names, u, 0.0)
        res["evaluate_rhs_1call"] = time.perf_counter() - t0
    fd = scipy_fd(er, er.n_total, lane_sparsity(hr.pattern, pcm.n_species, L))
    print(f"scipy_fd: {fd.n_groups} groups (group_columns {fd.group_s:.3f} s)", flush=True)
    res["scipy_fd_jac"] = median_time(lambda: fd(u), a.fd_calls, warmup=1, with_min=True)

    peers = []
    if not a.no_jax:
        peers.append(("jax", jax_peer))
    if not a.no_casadi:
        peers.append(("casadi", casadi_peer))
    for name, mk in peers:
        pe = mk(a.source, a.model, L=L)
        if pe is None:
            continue
        print(f"{name}: build {pe.build_s:.2f} s {pe.info if name == 'casadi' else ''}, nnz {pe.nnz}; "
              f"check {check_peer_against_assemble(pe, a.source, a.model):.2e}", flush=True)
        oj = np.empty(pe.nnz * L)
        pe.jac(u, p, forcing, oj, L)
        res[f"{name}_jac"] = median_time(lambda: pe.jac(u, p, forcing, oj, L), a.calls, with_min=True)
        if pe.rhs is not None:
            res[f"{name}_rhs"] = median_time(lambda: pe.rhs(u, p, forcing, out_r, L), a.calls, with_min=True)
    print(f"\n{L} cells, {pcm.n_species} species, median wall time (single thread):")
    print(f"  {'':18s} {'median':>10s}    {'min':>10s}    median/cell")
    for k, v in res.items():
        med, mn = v if isinstance(v, tuple) else (v, v)
        print(f"  {k:18s} {med * 1e3:10.3f} ms {mn * 1e3:10.3f} ms {med / L * 1e9:10.1f} ns")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
