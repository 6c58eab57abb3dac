"""Build products and the per-call path: RhsProgram, JacobianProgram,
JacWorkspace.

Programs are immutable and safe to share between threads: they hold the
evaluation document, generated kernel source (imported from the on-disk
cache) and read-only index arrays. All mutable scratch (band slab, hoisted
values, the lane→cell map) lives in a :class:`JacWorkspace`, one per thread.

Lane layout (docs/design.rst §4): a ``cell`` program stores states species-major with
lanes fastest, ``u[s*L + l]``; with ``L`` = number of cells this is exactly
``earthsci_ast.evaluate_rhs``'s flat order (variables in declaration order,
elements row-major). A ``global`` program has one lane: ``u`` is that flat
order. Every argument is checked in Python before compiled code runs.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.deep import run_deep
from ..calculus.bandset import BandSet, check_options
from ..compile import content_hash, generate, load_source
from ..errors import JacError, typed_errors
from . import checks as _checks
from ..compile.evaldoc import EvalDoc, ModelLayout, jacobian_doc, model_layout, rhs_doc
from ..model.load import SystemView, load_view

__all__ = ["RhsProgram", "JacobianProgram", "JacWorkspace", "PROGRAM_OPTIONS"]

#: Options of ``JacobianProgram.build`` / ``RhsProgram.build``.
PROGRAM_OPTIONS = {
    "allow_empty": False,     # accept a state-independent array RHS
    "backend": "numba",       # "numba" (the engine) or "numpy" (reference, explicit only)
    "max_stmts": 400,         # statement cap per compiled chunk
    "engine": "auto",         # "codegen" | "tape" | "auto" (tape for large cell programs)
    "tape_above": 1500,       # auto: statements above which a cell program is taped
    "cache": True,            # reuse whole build products from the on-disk cache
    "progress": None,         # build stages: None = a bar on a terminal (runtime.progress), True, False
    "per_lane": (),           # scalar parameters read per lane from `forcing` (cell programs)
}
_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))

#: Below this many state elements a call runs on one thread: the fork/join
#: of a parallel region costs more than the work (measured: 64 cells of a
#: 15-species mechanism, 2-8 ms per call on 2 threads vs 7-30 µs on one).
SERIAL_BELOW = 20000

_NO_SLOTS = np.zeros(0, np.int64)
_NO_SLOTS.setflags(write=False)


def _one_thread() -> bool:
    import numba
    return numba.get_num_threads() == 1


class _Serial:
    """Run small calls on one numba thread (thread-local setting, restored)."""

    __slots__ = ("on", "prev")

    def __init__(self, n: int):
        self.on = n < SERIAL_BELOW
        self.prev = 1

    def __enter__(self):
        if self.on:
            import numba
            self.prev = numba.get_num_threads()
            if self.prev != 1:
                numba.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self.on and self.prev != 1:
            import numba
            numba.set_num_threads(self.prev)


# ------------------------------------------------------------------ helpers

def _stage(opts, msg: str, t0: float, kind: str = "jac") -> None:
    from .progress import stage
    stage(opts, kind, msg, t0)


def lane_cells(cell_shape: tuple, lanes: int, order=None) -> np.ndarray:
    """1-based cell index per dimension per lane (``cix[d*L + l]``); lanes
    past the last cell (padding) duplicate it. ``order`` maps lane → flat
    cell number (a shuffled lane order)."""
    ncell = int(np.prod(cell_shape)) if cell_shape else 1
    if order is None:
        flat = np.minimum(np.arange(lanes), ncell - 1)
    else:
        flat = np.asarray(order, dtype=np.int64)
        if flat.shape != (lanes,) or flat.min(initial=0) < 0 or flat.max(initial=0) >= ncell:
            raise JacError("bad_argument", f"lane order must be {lanes} cell numbers in [0, {ncell})")
    idx = np.unravel_index(flat, cell_shape) if cell_shape else ()
    out = np.empty(len(cell_shape) * lanes, dtype=np.int64)
    for d, a in enumerate(idx):
        out[d * lanes:(d + 1) * lanes] = a + 1
    return out


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
            self._sizes = [lanes] * len(lay.states)
        else:
            self._shapes = [tuple(lay.shapes.get(s, ())) for s in lay.states]
            self._sizes = [int(np.prod(sh)) if sh else 1 for sh in self._shapes]
        self._starts = np.concatenate([[0], np.cumsum(self._sizes)]).astype(np.int64)

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
        ncell = int(np.prod(self._cell))
        idx = np.unravel_index(min(k, ncell - 1), self._cell)
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


def _check_vec(name: str, x, n: int, dtype=None, *, out: bool = False) -> np.ndarray:
    return _checks.vector(name, x, n, dtype, out=out)


def _params(p, n: int) -> np.ndarray:
    return _checks.params(p, n)


def _defaults(view: SystemView, lay: ModelLayout) -> tuple:
    """u0, p0 and forcing0 from the document's defaults/initial values."""
    from ..reference.oracle import resolve_point
    try:
        pt = resolve_point(view, None, None, 0.0, list(lay.states) + list(lay.all_params))
    except JacError:
        return None, None, None
    u0 = np.concatenate([np.ravel(np.asarray(pt.values[s], dtype=np.float64)) for s in lay.states]) \
        if lay.states else np.zeros(0)
    p0 = np.array([float(pt.values[n]) for n in lay.params], dtype=np.float64)
    f0 = np.concatenate([np.broadcast_to(np.ravel(np.asarray(pt.values[n], dtype=np.float64)), (lay.size(n),))
                         for n in lay.forcing]) if lay.forcing else np.zeros(0)
    return u0, p0, f0


# ------------------------------------------------------------------ common

@dataclass(frozen=True, eq=False)
class _Kernel:
    """Generated source + its import (lazy; re-imported after unpickling)."""

    source: str
    key: str
    chunks: tuple
    chunk_kinds: tuple
    n_hoist: int
    n_statements: int
    engine: str = "codegen"
    tapes: tuple = ()          # (prologue tape, body tape) for engine "tape"
    counts_nonfinite: bool = False   # chunks return the non-finite values they stored
    tile_scratch: int = 0      # tiled chunks: scratch per work item (codegen.tile_scratch)

    def module(self):
        if self.engine == "tape":
            return None
        return load_source(self.source, self.key)

    def listing(self) -> str:
        """Readable generated source or tape."""
        if self.engine == "tape":
            pro, body = self.tapes
            return (f"# esmjac tape: prologue {len(pro.code)} instructions, body {len(body.code)} "
                    f"instructions, {body.nreg} registers\n# prologue\n{pro.listing()}\n# body\n"
                    f"{body.listing()}\n")
        return self.source


def _distinct_nodes(exprs: list) -> int:
    from ..model.expr import Node, iter_children
    seen: set = set()
    stack = list(exprs)
    while stack:
        x = stack.pop()
        if isinstance(x, Node) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(iter_children(x))
    return len(seen)


def _compile(doc: EvalDoc, opts: dict) -> _Kernel:
    engine = opts["engine"]
    if engine not in ("auto", "codegen", "tape"):
        raise JacError("bad_option", f"engine must be 'auto', 'codegen' or 'tape'; got {engine!r}")
    if engine == "auto" and doc.kind == "cell":
        # Size decides: generated chunks compile in ~5 s per 400 statements
        # here, the tape interpreter is compiled once for every model. The
        # distinct expression nodes approximate the statement count.
        n = _distinct_nodes([doc.expanded(f.expr) for f in doc.fields])
        engine = "tape" if n > int(opts["tape_above"]) else "codegen"
    if engine == "tape":
        from ..compile.codegen import tape_program
        pro, body, nh = run_deep(tape_program, doc)
        key = content_hash(pro.code.tobytes().hex(), body.code.tobytes().hex())
        return _Kernel("", key, (), (), nh, len(body.code), "tape", (pro, body))
    g = run_deep(generate, doc, max_stmts=int(opts["max_stmts"]))
    key = content_hash(g.source)
    return _Kernel(g.source, key, g.chunks, g.chunk_kinds, g.n_hoist, g.n_statements,
                   counts_nonfinite=g.counts_nonfinite)


class _Base:
    """Shared lane bookkeeping of RhsProgram and JacobianProgram."""

    layout: ModelLayout
    kind: str

    @property
    def cells(self) -> int:
        """Number of cells (lanes of an unpadded cell program); 1 for global."""
        return int(np.prod(self.layout.cell_shape)) if self.kind == "cell" else 1

    @property
    def n_species(self) -> int:
        return len(self.layout.states)

    def element_names(self, lanes: int | None = None) -> ElementNames:
        """Names of the state elements in ``u`` order at ``lanes`` lanes
        (default: the document's cells), computed on access."""
        if self.kind != "cell":
            lanes = 1
        return ElementNames(self.layout, self.kind, self.cells if lanes is None else int(lanes))

    @property
    def names(self) -> ElementNames:
        """Element names in ``u`` order at the document's own cell count."""
        return self.element_names()

    row_names = names

    def defaults(self, lanes: int | None = None) -> tuple:
        """``(u0, p0, forcing0)`` from the document's defaults at ``lanes``
        lanes (cell programs: lane ``l`` takes cell ``min(l, cells-1)``'s
        values, so a box mechanism's defaults broadcast to every lane);
        entries are None where the document gives no default."""
        u0, p0, f0 = self.u0, self.p0, self.forcing0
        if self.kind != "cell" or lanes is None or lanes == self.cells:
            return u0, p0, f0
        flat = np.minimum(np.arange(int(lanes)), self.cells - 1)

        def spread(x, k):
            if x is None:
                return None
            return np.ascontiguousarray(x.reshape(k, self.cells)[:, flat].ravel())
        return spread(u0, len(self.layout.states)), p0, spread(f0, len(self.layout.forcing))

    def u_size(self, lanes: int) -> int:
        if self.kind == "cell":
            return len(self.layout.states) * lanes
        return self.layout.n_state_elements

    def f_size(self, lanes: int) -> int:
        if self.kind == "cell":
            return len(self.layout.forcing) * lanes
        return self.layout.n_forcing_elements

    def _run(self, kern: _Kernel, u, p, t, forcing, out, h, cix, lanes) -> int | None:
        """Run ``kern`` into ``out``: the number of non-finite values stored
        when its chunks count them (cell chunks), else None (scan ``out``)."""
        return _recovering(self._run_once, out, kern, u, p, t, forcing, out, h, cix, lanes)

    def _run_once(self, kern: _Kernel, u, p, t, forcing, out, h, cix, lanes) -> int | None:
        if kern.engine == "tape":
            from ..compile.tape import run_tape
            pro, body = kern.tapes
            run_tape(pro.code, pro.consts, u, forcing, p, float(t), h, cix, h, 1, pro.nreg, 0, 0, 1, _NO_SLOTS)
            run_tape(body.code, body.consts, u, forcing, p, float(t), h, cix, out, lanes, body.nreg,
                     0, 0, lanes, _NO_SLOTS)
            return
        mod = kern.module()
        mod.prologue(p, float(t), h)
        pre = "s" if _one_thread() else ""
        bad = 0
        for name, kind in zip(kern.chunks, kern.chunk_kinds):
            fn = getattr(mod, pre + name)
            if kind == "cell":
                bad += fn(u, forcing, h, cix, out, lanes) or 0
            else:
                fn(u, forcing, h, out)
        return bad if kern.counts_nonfinite else None

    def _warm(self, out_size: int) -> None:
        """Compile (or load from Numba's cache) the float64 kernels now, so a
        build includes compilation and the first call is a warm call."""
        L = 1
        u = np.ones(self.u_size(L))
        f = np.ones(max(self.f_size(L), 1))
        out = np.zeros(max(out_size, 1))
        h = np.zeros(max(self.kernel.n_hoist, 1))
        cix = lane_cells(self.layout.cell_shape, L) if self.kind == "cell" else np.zeros(1, np.int64)
        # Warm the twin (serial or parallel) that calls at the program's own
        # size will run: compiling the other one is wasted build time.
        with _Serial(self.u_size(self.cells) if self.kind == "cell" else self.layout.n_state_elements):
            self._run(self.kernel, u, np.ones(len(self.layout.params)), 0.0, f, out, h, cix, L)

    def _forcing_default(self, lanes: int):
        """The default forcing at ``lanes`` lanes (computed once per lane count)."""
        memo = self.__dict__.setdefault("_fdefault", {})
        if lanes not in memo:
            f0 = self.defaults(lanes)[2]
            if f0 is not None:
                f0.setflags(write=False)
            memo[lanes] = f0
        return memo[lanes]

    def _forcing(self, forcing, lanes: int, dtype) -> np.ndarray:
        n = self.f_size(lanes)
        if forcing is None:
            if n == 0:
                return np.zeros(1, dtype=dtype)
            f0 = self._forcing_default(lanes)
            if f0 is None:
                raise JacError("bad_argument", "`forcing` is required (the document gives no defaults)")
            return f0 if f0.dtype == dtype else np.ascontiguousarray(f0, dtype=dtype)
        if n == 0:
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        return _check_vec("forcing", forcing, n, dtype)


def _recovering(run, out, *args) -> None:
    """``run(*args)``; a Numba cache file that fails to load (corrupt or
    tampered index/data) is purged and the call retried, so Numba recompiles
    instead of the entry breaking every later run (compile/cache.py)."""
    from ..compile.cache import recover_numba_cache
    for _ in range(16):                  # at most one purge per compiled function
        try:
            return run(*args)
        except Exception as exc:
            if not recover_numba_cache(exc):
                raise
            out[:] = 0                   # accumulating (global) kernels restart from zero
    return run(*args)


def _build_doc_cached(kind: str, source, model, wrt, opts, make):
    """Whole-build cache (compile/cache.py): verified JSON + npz products
    for keyable sources; kernels, index arrays and fingerprints are rebuilt
    from the decoded document (:func:`_revive`), never read from disk."""
    from ..compile.cache import document_key, load_product, store_product
    keyed = None
    if opts["cache"]:
        keyed = document_key(source, kind, str(model), str(wrt), str(opts["max_stmts"]),
                             str(opts["allow_empty"]), str(opts["engine"]), str(opts["tape_above"]),
                             str(tuple(opts["per_lane"])))
    if keyed is not None:
        obj = load_product(keyed[0], _product_types())
        if obj is not None:
            try:
                return _revive(obj, opts)
            except Exception as exc:     # a product that does not revive is a miss
                import logging
                logging.getLogger("esmjac.cache").warning(
                    "esmjac cache: stored build does not match its document (%s); rebuilding", exc)
    obj = make()
    if keyed is not None:
        store_product(keyed[0], obj, keyed[1], _product_types(), _PRODUCT_SKIP)
    return obj


#: Fields never read back from a stored product: generated code and index
#: arrays are regenerated from the decoded document (see :func:`_revive`).
_PRODUCT_SKIP = {"_Kernel": ("source", "tapes"), "JacobianProgram": ("meta",)}


def _product_types() -> dict:
    from ..calculus import JacEntry
    from ..calculus.bands import Band
    from ..compile.evaldoc import Field
    return {c.__name__: c for c in (JacobianProgram, RhsProgram, _Kernel, EvalDoc, ModelLayout, Field,
                                    JacEntry, Band)}


def _revive(obj, opts: dict):
    """Regenerate a decoded product's kernel (checked against the stored
    content hash), index arrays and fingerprint."""
    if not isinstance(obj, (JacobianProgram, RhsProgram)) or not isinstance(obj.doc, EvalDoc):
        raise ValueError("not a program")
    stored = obj.kernel
    kern = _compile(obj.doc, {**opts, "engine": stored.engine})
    if kern.key != stored.key:
        raise ValueError("the regenerated kernel differs from the stored one")
    object.__setattr__(obj, "kernel", kern)
    if isinstance(obj, JacobianProgram):
        object.__setattr__(obj, "meta", _field_meta(obj.doc, obj.layout, obj.col_vars, obj.col_base))
        fp = hashlib.sha256((kern.key + obj.doc.to_json()).encode()).hexdigest()
        if fp != obj.fingerprint:
            raise ValueError("fingerprint mismatch")
    return obj


# ------------------------------------------------------------------ RHS

@dataclass(frozen=True, eq=False)
class RhsProgram(_Base):
    """The model's compiled right-hand side on the lane layout."""

    doc: EvalDoc
    layout: ModelLayout
    kind: str
    param_names: tuple
    forcing_names: tuple
    u0: Any
    p0: Any
    forcing0: Any
    kernel: _Kernel
    layout_fingerprint: str
    element_type: str | None = None
    build_seconds: float = 0.0

    @classmethod
    @typed_errors
    def build(cls, source: Any, model: str | None = None, *, options: dict | None = None) -> "RhsProgram":
        opts = check_options(options, PROGRAM_OPTIONS)
        _backend(opts)
        t0 = time.perf_counter()

        def make():
            view = source if isinstance(source, SystemView) else run_deep(load_view, source, model)
            lay = model_layout(view, opts["per_lane"])
            doc = rhs_doc(view, lay)
            _stage(opts, f"rhs document: {len(doc.fields)} pieces, {doc.kind} lanes", t0, "rhs")
            kern = _compile(doc, opts)
            _stage(opts, f"generated {len(kern.chunks)} chunk(s), {kern.n_statements} statements",
                   t0, "rhs")
            u0, p0, f0 = _defaults(view, lay)
            return cls(doc, lay, doc.kind,
                       lay.params, lay.forcing, u0, p0, f0, kern, _layout_fp(lay, doc.kind),
                       view.element_type)

        prog = _build_doc_cached("rhs", source, model, None, opts, make)
        prog._warm(prog.u_size(1))
        from .progress import done
        done(opts, "rhs", t0)
        object.__setattr__(prog, "build_seconds", time.perf_counter() - t0)
        return prog

    @property
    def dtype(self) -> np.dtype:
        """The declared element type (Float32 documents evaluate in float32)."""
        return np.dtype(np.float32) if (self.element_type or "").lower() in ("float32", "f32") \
            else np.dtype(np.float64)

    @cached_property
    def _default_cix(self) -> np.ndarray:
        """The identity lane map at ``cells`` lanes (computed once; kernels only read it)."""
        cix = lane_cells(self.layout.cell_shape, self.cells) if self.kind == "cell" else np.zeros(1, np.int64)
        return cix

    @cached_property
    def _owner(self) -> str:
        """Identity of this program's kernels: scratch made for it carries it."""
        return hashlib.sha256((self.kernel.key + self.layout_fingerprint).encode()).hexdigest()

    def new_buffers(self, lanes: int | None = None):
        """Scratch for one thread (``lanes`` ≥ 1; default: one lane per cell)."""
        default = self.cells if self.kind == "cell" else 1
        if lanes is None:
            lanes = default
        if self.kind == "global" and lanes != 1:
            raise JacError("bad_argument", "a global-lane program has exactly one lane")
        lanes = _checks.lanes(lanes, 8 * (3 * len(self.layout.cell_shape) + 2), "scratch")
        cix = self._default_cix if lanes == default else lane_cells(self.layout.cell_shape, lanes)
        return _RhsScratch(lanes, np.zeros(max(self.kernel.n_hoist, 1)), cix, self._owner)

    def bind(self, lanes: int | None = None, dtype=None, *, scratch: "_RhsScratch | None" = None):
        """A bound call ``run(u, p, t, forcing, out)`` at ``lanes`` lanes
        (default: the document's cells) and ``dtype`` (default: the declared
        element type): checks and kernel choices made once, the first call
        warm (see ``runtime.bound``). One binding per thread."""
        from .bound import BoundRhs
        return BoundRhs(self, lanes, dtype, scratch)

    def eval_into(self, u: np.ndarray, p, t: float, forcing, out: np.ndarray,
                  scratch: "_RhsScratch | None" = None) -> np.ndarray:
        """``out = f(u, p, t, forcing)``; ``u``/``out`` flat, same dtype.

        ``out`` must not share memory with ``u``, ``p`` or ``forcing``
        (refused: ``bad_argument``). A non-finite value computed from finite
        inputs is an ``evaluation_error`` naming the element."""
        if scratch is None:
            sc = self.new_buffers()
        else:
            sc = scratch
            _checks.workspace(sc, self._owner, "scratch", self.kernel.n_hoist,
                              self.layout.cell_shape if self.kind == "cell" else None)
        lanes = sc.lanes
        t = _checks.time(t)
        _check_vec("u", u, self.u_size(lanes))
        _check_vec("out", out, self.u_size(lanes), u.dtype, out=True)
        _checks.disjoint({"out": out}, {"u": u, "p": p, "forcing": forcing, "scratch": sc.h})
        p = _params(p, len(self.param_names))
        f = self._forcing(forcing, lanes, u.dtype)
        if self.kind == "global":
            out[:] = 0
        with _Serial(u.shape[0]):
            bad = self._run(self.kernel, u, p, t, f, out, sc.h, sc.cix, lanes)
            if bad is None:              # cell chunks count while they store
                bad = _checks.any_nonfinite(out)
        if bad:
            _checks.report_nonfinite(out, (u, p, f), t, "right-hand side", self._element_name(lanes))
        return out

    def _element_name(self, lanes: int):
        def name(i: int) -> str:
            if self.kind == "cell" and lanes != self.cells:
                return f"{self.layout.states[i // lanes]} at lane {i % lanes}"
            return self.names[i]
        return name

    def __call__(self, t: float, y: np.ndarray, p=None, forcing=None) -> np.ndarray:
        """``f(t, y)`` with the document's parameter defaults (solver style).

        A user-facing callable: ``y`` may be any float array view (SciPy's
        finite differences pass column views); it is copied to a contiguous
        vector when needed. ``eval_into`` itself stays strict."""
        if isinstance(y, np.ndarray) and y.dtype in _DTYPES and y.ndim == 1:
            y = np.ascontiguousarray(y)
        out = np.empty_like(y)
        return self.eval_into(y, self.p0 if p is None else p, t, forcing, out)


@dataclass
class _RhsScratch:
    """Per-thread scratch of one RhsProgram (``owner``: the program's identity)."""

    lanes: int
    h: np.ndarray
    cix: np.ndarray
    owner: str = ""


def _layout_fp(lay: ModelLayout, kind: str) -> str:
    s = repr((lay.model, lay.states, sorted(lay.shapes.items()), lay.params, lay.forcing,
              lay.cell_shape, kind))
    return hashlib.sha256(s.encode()).hexdigest()


def _backend(opts: dict) -> None:
    b = opts.get("backend")
    if b == "numba":
        try:
            import numba  # noqa: F401
        except ImportError as exc:
            raise JacError("bad_option", "backend='numba' needs numba installed") from exc
        return
    if b == "numpy":
        raise JacError("bad_option",
                       "backend='numpy' is the slow reference path: use esmjac.assemble(...) for "
                       "one-shot NumPy/SciPy evaluation; the compiled programs run on numba only")
    raise JacError("bad_option", f"unknown backend {b!r}; available: 'numba'")


# ------------------------------------------------------------------ Jacobian

@dataclass
class JacWorkspace:
    """Per-thread scratch of one JacobianProgram (never share between threads)."""

    owner: str
    lanes: int
    cix: np.ndarray
    h: np.ndarray
    keep_slab: bool = False
    slabs: dict = field(default_factory=dict)
    last_dtype: Any = None
    last_plan: Any = None
    second: dict = field(default_factory=dict)

    def slab(self, dtype, size: int) -> np.ndarray:
        s = self.slabs.get(dtype)
        if s is None or s.shape[0] != size:
            s = np.zeros(max(size, 1), dtype=dtype)
            self.slabs[dtype] = s
        return s

    def set_lane_order(self, order, cell_shape: tuple) -> None:
        """Lane ``l`` holds flat cell ``order[l]`` (shuffled or padded lanes).
        Written in place: bindings of this workspace read the same array."""
        cix = lane_cells(cell_shape, self.lanes, order)
        if cix.shape == self.cix.shape:
            self.cix[:] = cix
        else:
            self.cix = cix


@dataclass(frozen=True, eq=False)
class JacobianProgram(_Base):
    """Compiled Jacobian of one model w.r.t. ``wrt`` (see module docstring)."""

    doc: EvalDoc
    layout: ModelLayout
    kind: str
    wrt: str
    bands: tuple               # JacEntry, read-only
    structure: str
    col_vars: tuple            # column variables, declaration order
    col_base: dict             # column variable → first global column
    n_cols: int
    kernel: _Kernel
    fingerprint: str
    layout_fingerprint: str
    meta: dict                 # read-only index arrays (see _field_meta)
    u0: Any = None
    p0: Any = None
    forcing0: Any = None
    element_type: str | None = None
    build_seconds: float = 0.0

    @classmethod
    @typed_errors
    def build(cls, source: Any, model: str | None = None, wrt: str = "states",
              options: dict | None = None) -> "JacobianProgram":
        opts = check_options(options, PROGRAM_OPTIONS)
        _backend(opts)
        t0 = time.perf_counter()

        def make():
            view = source if isinstance(source, SystemView) else run_deep(load_view, source, model)
            lay = model_layout(view, opts["per_lane"])
            bs = _bandset(view, wrt, lay, opts)
            _stage(opts, f"calculus: {len(bs.entries)} bands ({bs.structure})", t0)
            rdoc = rhs_doc(view, lay)
            doc = jacobian_doc(bs, lay, rdoc.kind)
            _stage(opts, f"evaluation document: {len(doc.fields)} fields, {doc.kind} lanes", t0)
            kern = _compile(doc, opts)
            _stage(opts, f"generated {len(kern.chunks)} chunk(s), {kern.n_statements} statements", t0)
            cvars, cbase, ncols = _colspace(lay, wrt)
            meta = _field_meta(doc, lay, cvars, cbase)
            u0, p0, f0 = _defaults(view, lay)
            fp = hashlib.sha256((kern.key + doc.to_json()).encode()).hexdigest()
            return cls(doc, lay, doc.kind, wrt, bs.entries, bs.structure,
                       cvars, cbase, ncols, kern, fp,
                       _layout_fp(lay, rdoc.kind), meta, u0, p0, f0, view.element_type)

        prog = _build_doc_cached("jac", source, model, wrt, opts, make)
        prog._warm(prog.slab_size(1))
        from .progress import done
        done(opts, "jac", t0)
        object.__setattr__(prog, "build_seconds", time.perf_counter() - t0)
        return prog

    # -- sizes -------------------------------------------------------------------
    @property
    def n_fields(self) -> int:
        return len(self.doc.fields)

    def slab_size(self, lanes: int) -> int:
        if self.kind == "cell":
            return self.n_fields * lanes
        return int(self.meta["slab_size"])

    def new_workspace(self, lanes: int | None = None, *, keep_slab: bool = False) -> JacWorkspace:
        """Scratch for one thread; ``lanes`` ≥ cells pads (cell programs).

        By default ``eval_into`` writes lane layouts directly, tile by tile
        (no band slab: about half the memory traffic), and ``apply``/
        ``apply_transpose`` evaluate the band slab from the workspace's copy
        of the point when first asked; ``keep_slab=True`` evaluates it in
        every ``eval_into`` instead (the same bits; only when it is spent)."""
        if self.kind == "global":
            if lanes is not None and (isinstance(lanes, bool) or lanes != 1):
                raise JacError("bad_argument", "a global-lane program has exactly one lane")
            lanes = 1
            cix = np.zeros(1, np.int64)
        else:
            # slab (float64, plus float32 when used) + lane map and its temporaries
            per_lane = 12 * self.n_fields + 8 * (3 * len(self.layout.cell_shape) + 2)
            lanes = _checks.lanes(self.cells if lanes is None else lanes, per_lane)
            cix = lane_cells(self.layout.cell_shape, lanes)
        return JacWorkspace(self.fingerprint, lanes, cix, np.zeros(max(self.kernel.n_hoist, 1)),
                            keep_slab=bool(keep_slab))

    def plan(self, layout, source: "RhsProgram | None" = None):
        from ..layouts.plans import build_plan
        return build_plan(self, layout, source)

    # -- evaluation --------------------------------------------------------------
    def _check_ws(self, ws) -> None:
        if not isinstance(ws, JacWorkspace):
            raise JacError("bad_argument", f"expected a JacWorkspace, got {type(ws).__name__}")
        _checks.workspace(ws, self.fingerprint, "workspace", self.kernel.n_hoist,
                          self.layout.cell_shape if self.kind == "cell" else None)

    def _check_plan(self, plan) -> None:
        from ..layouts.plans import ScatterPlan
        if not isinstance(plan, ScatterPlan):
            raise JacError("bad_argument", f"expected a ScatterPlan, got {type(plan).__name__}")
        if plan.fingerprint != self.fingerprint:
            raise JacError("foreign_layout", "this plan was built for another JacobianProgram")

    def bind(self, plan, ws: JacWorkspace, dtype=np.float64, *, keep_point: bool = False):
        """A bound call ``run(u, p, t, forcing, out)`` of ``eval_into`` for
        ``plan``, ``ws`` and ``dtype``: plan, workspace, lanes, sizes and
        dtype checked once, every kernel the calls need compiled now (the
        first call is warm), per call only attribute checks of the
        arguments (see ``runtime.bound``). ``contract`` reads the point of
        the last call on ``ws`` only with ``keep_point=True`` (a copy per
        call into buffers of the binding); by default a bound call leaves no
        point, and ``contract`` asks for an ``eval_into`` first."""
        from .bound import BoundJacobian
        return BoundJacobian(self, plan, ws, dtype, keep_point=keep_point)

    def eval_into(self, plan, u: np.ndarray, p, t: float, forcing, out: np.ndarray,
                  ws: JacWorkspace) -> np.ndarray:
        """Fill ``out`` (layout of ``plan``) with ∂f/∂wrt at (u, p, t, forcing).

        ``out`` must not share memory with ``u``, ``p``, ``forcing`` or the
        workspace (refused: ``bad_argument``). The point is copied into the
        workspace, so changing ``u`` afterwards does not change ``contract``."""
        self._check_plan(plan)
        self._check_ws(ws)
        L = ws.lanes
        plan.check_lanes(L)
        t = _checks.time(t)
        _check_vec("u", u, self.u_size(L))
        _check_vec("out", out, plan.out_size(L), u.dtype, out=True)
        _checks.disjoint({"out": out}, {"u": u, "p": p, "forcing": forcing, "workspace h": ws.h,
                                        "workspace lane map": ws.cix})
        pv = _params(p, len(self.layout.params))
        f = self._forcing(forcing, L, u.dtype)
        with _Serial(u.shape[0]):
            bad = None
            if not ws.keep_slab and plan.kind == "lane" and (self.kernel.engine == "codegen" or plan.tiled):
                bad = self._run_fused(plan, u, pv, t, f, out, ws, L)
                ws.last_dtype = None
            else:
                B = ws.slab(u.dtype, self.slab_size(L))
                self._run(self.kernel, u, pv, t, f, B, ws.h, ws.cix, L)
                plan.scatter(B, L, out)
                ws.last_dtype = u.dtype
            if bad is None:              # the tile kernels count while they store
                bad = _checks.any_nonfinite(out)
        ws.last_plan = plan.fingerprint
        ws.second.pop("state", None)
        su, sp, sf = _snapshot(ws, u, pv, f)
        ws.second["point"] = (su, sp, t, sf)
        if bad:
            _checks.report_nonfinite(out, (u, pv, f), t, "Jacobian")
        return out

    def _fused_kernel(self, plan) -> _Kernel:
        """The plan-specific fused kernel (generated on first use, cached on
        the plan and on disk by content hash)."""
        k = plan._cache.get("fused_kernel")
        if k is None:
            a = plan.arrays
            dest = list(zip(a["fa"].tolist(), a["fb"].tolist(), a["fs"].tolist()))
            zeros = list(zip(a["za"].tolist(), a["zb"].tolist(), a["zs"].tolist()))
            g = run_deep(generate, self.doc, max_stmts=PROGRAM_OPTIONS["max_stmts"],
                         title=f"direct writes for layout {plan.layout.name}"
                               + (f", tile {plan.tile}" if plan.tiled else ""),
                         dest=dest, zeros=zeros, tile=plan.tile if plan.tiled else None,
                         nslots=int(plan.info["slots_per_lane"]))
            k = _Kernel(g.source, content_hash(g.source), g.chunks, g.chunk_kinds, g.n_hoist, g.n_statements,
                        counts_nonfinite=g.counts_nonfinite, tile_scratch=g.tile_scratch)
            plan._cache["fused_kernel"] = k
        return k

    def _fused_tape(self, plan) -> tuple:
        """The tape engine's direct-write body for a tiled plan (slot stores,
        cached on the plan) and the slots no band reaches."""
        k = plan._cache.get("fused_tape")
        if k is None:
            from ..compile.codegen import tape_program
            pro, body, _ = run_deep(tape_program, self.doc, [int(a) for a in plan.arrays["fa"]])
            zs = np.ascontiguousarray(plan.arrays["za"], dtype=np.int64)
            zs.setflags(write=False)
            k = plan._cache["fused_tape"] = (pro, body, zs)
        return k

    def _run_fused(self, plan, u, p, t, f, out, ws, L) -> int | None:
        """Direct writes into ``plan``'s slots; the number of non-finite
        values stored when the kernels count them (tiles), else None."""
        return _recovering(self._run_fused_once, out, plan, u, p, t, f, out, ws, L)

    def _run_fused_once(self, plan, u, p, t, f, out, ws, L):
        if self.kernel.engine == "tape":
            from ..compile.tape import run_tape
            pro, body, zs = self._fused_tape(plan)
            h = ws.h
            run_tape(pro.code, pro.consts, u, f, p, float(t), h, ws.cix, h, 1, pro.nreg, 0, 0, 1, _NO_SLOTS)
            W = plan.tile_width(L)
            run_tape(body.code, body.consts, u, f, p, float(t), h, ws.cix, out, L, body.nreg,
                     W, int(plan.info["slots_per_lane"]), plan.capacity(L), zs)
            return None
        kern = self._fused_kernel(plan)
        mod = kern.module()
        h = ws.h if ws.h.shape[0] >= kern.n_hoist else np.zeros(kern.n_hoist)
        mod.prologue(p, float(t), h)
        pre = "sfl" if _one_thread() else "fl"
        bad = 0
        if kern.tile_scratch:
            from ..compile.codegen import tile_scratch
            S = np.empty(tile_scratch(kern.tile_scratch, L, plan.tile_width(L)), u.dtype)
            for name in kern.chunks:
                bad += getattr(mod, pre + name)(u, f, h, ws.cix, out, L, S)
            return bad
        for name in kern.chunks:
            bad += getattr(mod, pre + name)(u, f, h, ws.cix, out, L) or 0
        return bad if kern.counts_nonfinite else None

    def _slab_of(self, ws: JacWorkspace):
        """The band slab at the point of the last ``eval_into``: kept by it
        (``keep_slab=True``) or evaluated now from the workspace's copy of
        that point (direct writes keep no slab), once per ``eval_into``."""
        if ws.last_dtype is None:
            pt = ws.second.get("point")
            if pt is None:
                raise JacError("bad_argument", "call eval_into first: apply/apply_transpose use the Jacobian "
                               "at its point")
            u, pv, t, f = pt
            B = ws.slab(u.dtype, self.slab_size(ws.lanes))
            with _Serial(u.shape[0]):
                self._run(self.kernel, u, pv, t, f, B, ws.h, ws.cix, ws.lanes)
            ws.last_dtype = u.dtype
        return ws.slabs[ws.last_dtype]

    def apply(self, plan, ws: JacWorkspace, v: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``y += J v`` from the band slab of the last ``eval_into``
        (``y`` sharing memory with ``v`` is refused: ``bad_argument``)."""
        from . import kernels as K
        self._check_plan(plan)
        self._check_ws(ws)
        B = self._slab_of(ws)
        L = ws.lanes
        _check_vec("v", v, self.col_size(L))
        _check_vec("y", y, self.u_size(L), out=True)
        _checks.disjoint({"y": y}, {"v": v, "workspace slab": B})
        m = self.meta
        with _Serial(y.shape[0]):
            if self.kind == "cell":
                K.lane_apply(B, L, m["r_ptr"], m["r_band"], m["r_ca"], m["r_cb"], m["r_cs"], m["r_tgt"], v, y)
            else:
                K.point_apply(B, m["r_ptr"], m["r_src"], m["r_other"], m["r_tgt"], v, y)
        return y

    def apply_transpose(self, plan, ws: JacWorkspace, lam: np.ndarray, gbar: np.ndarray) -> np.ndarray:
        """``gbar += Jᵀ lam`` (float64 accumulation; a gather over the
        transposed plan: each column is owned by one iteration). ``gbar``
        sharing memory with ``lam`` is refused (``bad_argument``)."""
        from . import kernels as K
        self._check_plan(plan)
        self._check_ws(ws)
        B = self._slab_of(ws)
        L = ws.lanes
        _check_vec("lam", lam, self.u_size(L))
        _check_vec("gbar", gbar, self.col_size(L), np.float64, out=True)
        _checks.disjoint({"gbar": gbar}, {"lam": lam, "workspace slab": B})
        m = self.meta
        with _Serial(lam.shape[0]):
            if self.kind == "cell":
                K.lane_apply(B, L, m["c_ptr"], m["c_band"], m["c_ca"], m["c_cb"], m["c_cs"], m["c_tgt"],
                             lam, gbar)
                if m["g_tgt"].shape[0]:
                    off = m["n_lane_cols"] * L
                    K.lane_apply_global(B, L, m["g_ptr"], m["g_band"], m["g_rl"], m["g_tgt"] + off, lam, gbar)
            else:
                K.point_apply(B, m["c_ptr"], m["c_src"], m["c_other"], m["c_tgt"], lam, gbar)
        return gbar

    def col_size(self, lanes: int) -> int:
        """Length of a column-space vector (``v`` of apply, ``gbar``)."""
        if self.kind == "cell":
            return self.meta["n_lane_cols"] * lanes + self.meta["n_glob_cols"]
        return self.n_cols

    def contract(self, plan, ws2: JacWorkspace, lam: np.ndarray, v: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out = Σᵢ λᵢ ∂²fᵢ/∂u∂u · v`` at the point of the last ``eval_into``
        on ``ws2`` (second-order bands, built on first use; that point was
        copied, so later changes to ``u`` do not matter). ``out`` sharing
        memory with ``lam`` or ``v`` is refused (``bad_argument``)."""
        from .second import contract
        return contract(self, plan, ws2, lam, v, out)


def _snapshot(ws: JacWorkspace, u, pv, f) -> tuple:
    """Copies of the point into buffers the workspace keeps (no allocation
    per call): ``contract`` and a lazily evaluated slab see the point of the
    last ``eval_into``, whatever the caller does with its arrays afterwards."""
    snap = ws.second.get("snap")
    if snap is None or any(a.shape != b.shape or a.dtype != b.dtype for a, b in zip(snap, (u, pv, f))):
        snap = (np.empty_like(u), np.empty_like(pv), np.empty_like(f))
        ws.second["snap"] = snap
    for a, b in zip(snap, (u, pv, f)):
        np.copyto(a, b)
    return snap


def _bandset(view, wrt: str, lay: ModelLayout, opts: dict) -> BandSet:
    """The bands of ∂f/∂wrt; with ``per_lane`` parameters, ``forcing``
    columns include them (the calculus sees them as scalar parameters)."""
    if wrt == "forcing" and lay.per_lane:
        import dataclasses
        bs = BandSet.build(view, wrt="parameters", options={"allow_empty": bool(opts["allow_empty"])})
        keep = set(lay.forcing)
        return dataclasses.replace(bs, wrt="forcing", entries=tuple(e for e in bs.entries if e.col in keep))
    return BandSet.build(view, wrt=wrt, options={"allow_empty": bool(opts["allow_empty"])})


def _colspace(lay: ModelLayout, wrt: str) -> tuple:
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
    return tuple(cvars), base, off


def _field_meta(doc: EvalDoc, lay: ModelLayout, cvars: tuple, cbase: dict) -> dict:
    from ..layouts.plans import field_meta
    return field_meta(doc, lay, cvars, cbase)
