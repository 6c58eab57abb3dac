"""Build products and the per-call path: RhsProgram, JacobianProgram,
JacWorkspace.

Programs are immutable and safe to share between threads: they hold the
evaluation document, generated kernel source (imported from the on-disk
cache) and read-only index arrays. All mutable scratch (band slab, hoisted
values, the lane→cell map) lives in a workspace (:mod:`.workspace`), one
per thread.

Lane layout (docs/design.rst §4): a ``cell`` program stores states species-major with
lanes fastest, ``u[s*L + l]``; with ``L`` = number of cells this is exactly
``earthsci_ast.evaluate_rhs``'s flat order (variables in declaration order,
elements row-major). A ``global`` program has one lane: ``u`` is that flat
order. Every argument is checked in Python before compiled code runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .._frozen import FrozenMap, frozen_arrays, readonly
from ..calculus.bandset import BandSet, check_options
from ..calculus import JacEntry
from ..calculus.bands import Band
from ..compile.engine import ENGINE_OPTIONS, FusedTape, Kernel, compile_doc, fused_tape
from ..compile.tape import rename_stores
from ..compile.evaldoc import EvalDoc, Field, jacobian_doc, rhs_doc
from ..errors import JacError, typed_errors
from ..limits import lane_count
from ..layouts.plans import ScatterPlan, build_plan, field_meta
from ..model.deep import run_deep
from ..model.layout import (ElementNames, ModelLayout, column_space, default_vectors, layout_fingerprint,
                            model_layout)
from ..model.load import SystemView, load_view
from ..model.schema import remembering
from ..model.timefield import explicit_time
from . import checks as _checks
from . import kernels as K
from .workspace import JacWorkspace, RhsScratch, lane_cells, no_forcing
from .progress import done, stage
from ..compile.cache import document_key, load_product, record_schema_pass, schema_passed, store_product
from .stored import LazyDoc, band_rows, build_key, cached_build, fingerprint, heads_of  # noqa: F401  (build_key: re-exported)
from .bound import BoundJacobian, BoundRhs
from .second import contract_at
from .threads import one_thread, serial_below

__all__ = ["RhsProgram", "JacobianProgram", "JacWorkspace", "PROGRAM_OPTIONS", "model_view", "reads_time"]

#: Options of ``JacobianProgram.build`` / ``RhsProgram.build``.
PROGRAM_OPTIONS = {
    "allow_empty": False,     # accept a state-independent array RHS
    "backend": "numba",       # "numba" (the engine) or "numpy" (reference, explicit only)
    **ENGINE_OPTIONS,         # max_stmts, engine, tape_above (see compile.engine)
    "cache": True,            # reuse whole build products from the on-disk cache
    "progress": None,         # build stages: None = a bar on a terminal (runtime.progress), True, False
    "per_lane": (),           # scalar parameters read per lane from `forcing` (cell programs)
}
_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))

#: Read-only default forcing per program and lane count (see ``forcing_default``).
_FORCING_DEFAULTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

# ------------------------------------------------------------------ helpers

def _stage(opts, msg: str, t0: float, kind: str = "jac") -> None:
    stage(opts, kind, msg, t0)


def _check_vec(name: str, x, n: int, dtype=None, *, out: bool = False) -> np.ndarray:
    return _checks.vector(name, x, n, dtype, out=out)


def _params(p, n: int) -> np.ndarray:
    return _checks.params(p, n)


# ------------------------------------------------------------------ common

class _Base:
    """Shared lane bookkeeping of RhsProgram and JacobianProgram."""

    layout: ModelLayout
    kind: str
    kernel: Kernel
    u0: Any
    p0: Any
    forcing0: Any

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
        entries are None where the document gives no default, and the
        forcing is None when the model has no forcing fields (what every
        call takes for "no forcing"; an empty array is accepted too)."""
        u0, p0, f0 = self.u0, self.p0, self.forcing0
        if not self.layout.forcing:
            f0 = None
        if self.kind != "cell" or lanes is None or lanes == self.cells:
            return u0, p0, f0
        flat = np.minimum(np.arange(int(lanes)), self.cells - 1)

        def spread(x, k):
            if x is None:
                return None
            return np.ascontiguousarray(x.reshape(k, self.cells)[:, flat].ravel())
        return spread(u0, len(self.layout.states)), p0, spread(f0, len(self.layout.forcing))

    def u_size(self, lanes: int) -> int:
        lanes = lane_count(lanes)
        if self.kind == "cell":
            return len(self.layout.states) * lanes
        return self.layout.n_state_elements

    def f_size(self, lanes: int) -> int:
        lanes = lane_count(lanes)
        if self.kind == "cell":
            return len(self.layout.forcing) * lanes
        return self.layout.n_forcing_elements

    def _run(self, kern: Kernel, u, p, t, forcing, out, h, cix, lanes) -> int | None:
        return kern.run(u, p, t, forcing, out, h, cix, lanes, one_thread())

    def _warm(self, out_size: int) -> None:
        """Compile (or load from Numba's cache) the float64 kernels now, so a
        build includes compilation and the first call is a warm call. The
        warm call passes what a call at the defaults passes: the read-only
        ``p0`` (a read-only ``p``) and the document's read-only default
        forcing, or the shared read-only "no forcing" (writable ones only
        when the document gives no default: callers then pass their own). Numba compiles one specialization per writability, so a
        writable warm-up compiled signatures the calls never use and left
        theirs — every chunk again — to the first call."""
        L = 1
        u = np.ones(self.u_size(L))
        p = readonly(np.ones(len(self.layout.params)))
        f = self.forcing_default(L) if self.f_size(L) else no_forcing(np.float64)
        if f is None:
            f = np.ones(self.f_size(L))
        out = np.zeros(max(out_size, 1))
        h = np.zeros(max(self.kernel.n_hoist, 1))
        cix = lane_cells(self.layout.cell_shape, L) if self.kind == "cell" else np.zeros(1, np.int64)
        # Warm the twin (serial or parallel) that calls at the program's own
        # size will run: compiling the other one is wasted build time.
        with serial_below(self.u_size(self.cells) if self.kind == "cell" else self.layout.n_state_elements):
            self._run(self.kernel, u, p, 0.0, f, out, h, cix, L)

    def forcing_default(self, lanes: int) -> "np.ndarray | None":
        """The default forcing at ``lanes`` lanes, read-only (None when the
        document gives none): what a call with ``forcing=None`` passes and a
        binding's warm call mirrors. Computed once per lane count and
        process, kept beside the program, not in it: products are never
        changed after construction, and a pickled one carries no memo."""
        memo = _FORCING_DEFAULTS.get(self)
        if memo is None:
            memo = _FORCING_DEFAULTS[self] = {}
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
                return no_forcing(dtype)
            f0 = self.forcing_default(lanes)
            if f0 is None:
                raise JacError("bad_argument", "`forcing` is required (the document gives no defaults)")
            return f0 if f0.dtype == dtype else np.ascontiguousarray(f0, dtype=dtype)
        if n == 0:
            if isinstance(forcing, np.ndarray) and forcing.size == 0:
                return no_forcing(dtype)             # an empty forcing is no forcing
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        return _check_vec("forcing", forcing, n, dtype)


#: The last documents loaded, by content key (compile/cache.py ``document_key``):
#: a Jacobian and an RHS of one document load (parse and schema-validate) it
#: once. Views are read, never changed, by the builds.
_VIEWS: "OrderedDict[tuple, SystemView]" = OrderedDict()
_VIEWS_LOCK = threading.Lock()


def _load_view_once(source, model) -> SystemView:
    """``load_view`` with earthsci-ast's schema pass run once per document
    content (model/schema.py; the record is the signed cache's)."""
    with remembering(schema_passed, record_schema_pass):
        return load_view(source, model)


def _view_layout(source, model, opts: dict) -> tuple:
    """The model's view (``source`` loaded, or a view given as it is) and its layout."""
    view: SystemView | None
    if isinstance(source, SystemView):
        view = source
    else:
        keyed = document_key(source, "view") if opts["cache"] else None
        memo = (keyed[0], str(model)) if keyed is not None else None
        with _VIEWS_LOCK:
            view = _VIEWS.get(memo) if memo is not None else None
        if view is None:
            view = run_deep(_load_view_once if opts["cache"] else load_view, source, model)
            if memo is not None:
                with _VIEWS_LOCK:
                    _VIEWS[memo] = view
                    while len(_VIEWS) > 2:
                        _VIEWS.popitem(last=False)
    return view, model_layout(view, opts["per_lane"])


def model_view(source: Any, model: str | None = None, *, options: dict | None = None) -> tuple:
    """``(view, layout)`` of ``source`` as a build with ``options`` sees it:
    loaded once per process and document (the builds that follow reuse the
    same view), for a caller that must ask the model something before it
    builds (the Rosenbrock leaf: does the right-hand side read ``t``?)."""
    return _view_layout(source, model, check_options(options, PROGRAM_OPTIONS))


def reads_time(source: Any, model: str | None = None, *, options: dict | None = None) -> bool:
    """Whether the model's right-hand side reads ``t``
    (:func:`esmjac.model.timefield.explicit_time` of its view), remembered
    per document content in the cache (a signed entry under the document's
    key, like a build product): a warm build that must ask this first (the
    Rosenbrock leaf) then loads no document — loading and validating a
    272-species one costs tens of seconds."""
    opts = check_options(options, PROGRAM_OPTIONS)
    keyed = None
    if opts["cache"] and not isinstance(source, SystemView):
        keyed = document_key(source, "reads_time", str(model))
    if keyed is not None:
        hit = load_product(keyed[0], {})
        if isinstance(hit, dict) and isinstance(hit.get("reads_time"), bool):
            return hit["reads_time"]
    view, _ = _view_layout(source, model, opts)
    answer = explicit_time(view)
    if keyed is not None:
        store_product(keyed[0], {"reads_time": answer}, keyed[1], {})
    return answer


def _build_doc_cached(kind: str, source, model, wrt, opts, make):
    """``make()`` through the build cache (runtime/stored.py: tapes and
    plain fields apart from the expressions, checked on load)."""
    return cached_build(kind, source, model, wrt, opts, make, _product_types())


def _product_types() -> dict:
    return {c.__name__: c for c in (JacobianProgram, RhsProgram, Kernel, EvalDoc, ModelLayout, Field,
                                    JacEntry, Band)}


# ------------------------------------------------------------------ RHS

def _frozen(value):
    """A field value of a build product made immutable (arrays read-only,
    mappings frozen); other values are immutable already."""
    if isinstance(value, np.ndarray):
        return readonly(value)
    if isinstance(value, (dict, FrozenMap)):
        return frozen_arrays(value)
    return value


class _Product:
    """Frozen build products: every field frozen at construction (also when
    a stored product is revived: ``runtime.stored`` goes through the
    constructor) and again after unpickling (pickle does not keep
    ``writeable=False``)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]   # every subclass is a dataclass

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, _frozen(getattr(self, f.name)))

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({k: _frozen(v) for k, v in state.items()})


@dataclass(frozen=True, eq=False)
class RhsProgram(_Product, _Base):
    """The model's compiled right-hand side on the lane layout."""

    doc: EvalDoc
    layout: ModelLayout
    kind: str
    param_names: tuple
    forcing_names: tuple
    u0: Any
    p0: Any
    forcing0: Any
    kernel: Kernel
    layout_fingerprint: str
    element_type: str | None = None
    build_seconds: float = 0.0
    default_cix: Any = None    # the identity lane map at ``cells`` lanes (kernels only read it)
    owner: str = ""            # identity of the kernels: scratch made for this program carries it

    def __post_init__(self):
        super().__post_init__()
        if not self.owner:
            object.__setattr__(self, "owner", hashlib.sha256(
                (self.kernel.key + self.layout_fingerprint).encode()).hexdigest())

    @classmethod
    @typed_errors
    def build(cls, source: Any, model: str | None = None, *, options: dict | None = None) -> "RhsProgram":
        opts = check_options(options, PROGRAM_OPTIONS)
        _backend(opts)
        t0 = time.perf_counter()

        def make():
            view, lay = _view_layout(source, model, opts)
            doc = rhs_doc(view, lay)
            _stage(opts, f"rhs document: {len(doc.fields)} pieces, {doc.kind} lanes", t0, "rhs")
            kern = compile_doc(doc, opts)
            _stage(opts, f"generated {len(kern.chunks)} chunk(s), {kern.n_statements} statements",
                   t0, "rhs")
            u0, p0, f0 = default_vectors(view, lay)
            cix = lane_cells(lay.cell_shape, _cells(lay)) if doc.kind == "cell" else np.zeros(1, np.int64)
            return cls(doc, lay, doc.kind,
                       lay.params, lay.forcing, u0, p0, f0, kern, layout_fingerprint(lay, doc.kind),
                       view.element_type, 0.0, cix)

        prog = _build_doc_cached("rhs", source, model, None, opts, make)
        prog._warm(prog.u_size(1))
        done(opts, "rhs", t0)
        return dataclasses.replace(prog, build_seconds=time.perf_counter() - t0)

    @property
    def dtype(self) -> np.dtype:
        """The declared element type (Float32 documents evaluate in float32)."""
        return np.dtype(np.float32) if (self.element_type or "").lower() in ("float32", "f32") \
            else np.dtype(np.float64)

    def new_buffers(self, lanes: int | None = None) -> "RhsScratch":
        """Scratch for one thread (``lanes`` ≥ 1; default: one lane per cell)."""
        default = self.cells if self.kind == "cell" else 1
        if lanes is None:
            lanes = default
        if self.kind == "global" and lanes != 1:
            raise JacError("bad_argument", "a global-lane program has exactly one lane")
        lanes = _checks.lanes(lanes, 8 * (3 * len(self.layout.cell_shape) + 2), "scratch")
        # a writable copy of the (read-only) stored map: every other lane map,
        # the build's warm-up included, is writable, and Numba compiles each
        # kernel once per writability of its arguments
        cix = self.default_cix.copy() if lanes == default else lane_cells(self.layout.cell_shape, lanes)
        return RhsScratch(lanes, np.zeros(max(self.kernel.n_hoist, 1)), cix, self.owner)

    def bind(self, lanes: int | None = None, dtype=None, *, scratch: "RhsScratch | None" = None):
        """A bound call ``run(u, p, t, forcing, out)`` at ``lanes`` lanes
        (default: the document's cells) and ``dtype`` (default: the declared
        element type): checks and kernel choices made once, the first call
        warm (see ``runtime.bound``). One binding per thread."""
        return BoundRhs(self, lanes, dtype, scratch)

    def eval_into(self, u: np.ndarray, p, t: float, forcing, out: np.ndarray,
                  scratch: "RhsScratch | None" = None) -> np.ndarray:
        """``out = f(u, p, t, forcing)``; ``u``/``out`` flat, same dtype.

        ``out`` must not share memory with ``u``, ``p`` or ``forcing``
        (refused: ``bad_argument``). A non-finite value computed from finite
        inputs is an ``evaluation_error`` naming the element."""
        if scratch is None:
            sc = self.new_buffers(self._lanes_of(u))
        else:
            sc = scratch
            _checks.workspace(sc, self.owner, "scratch", self.kernel.n_hoist,
                              self.layout.cell_shape if self.kind == "cell" else None)
        lanes = sc.lanes
        t = _checks.time(t)
        try:
            _check_vec("u", u, self.u_size(lanes))
        except JacError as exc:
            if self.kind != "cell" or not isinstance(u, np.ndarray) or u.ndim != 1:
                raise
            whose = "the scratch's" if scratch is not None else "the document's"
            raise JacError(exc.code, f"{exc.message} = {lanes} lanes ({whose}) × {self.n_species} species; "
                           "for another lane count pass scratch=new_buffers(lanes) (or use "
                           "bind(lanes))") from None
        _check_vec("out", out, self.u_size(lanes), u.dtype, out=True)
        _checks.disjoint({"out": out}, {"u": u, "p": p, "forcing": forcing, "scratch": sc.h})
        p = _params(p, len(self.param_names))
        f = self._forcing(forcing, lanes, u.dtype)
        if self.kind == "global":
            out[:] = 0
        with serial_below(u.shape[0]):
            bad = self._run(self.kernel, u, p, t, f, out, sc.h, sc.cix, lanes)
            if bad is None:              # cell chunks count while they store
                bad = _checks.any_nonfinite(out)
        if bad:
            _checks.report_nonfinite(out, (u, p, f), t, "right-hand side", self._element_name(lanes))
        return out

    def _lanes_of(self, u) -> int | None:
        """The lane count ``u`` implies for a cell program (its length over
        the species count) for a box mechanism, whose lanes are all alike;
        None otherwise (the document's cells: a gridded document's lanes are
        its cells, and the length check says how to pass another count)."""
        n = self.n_species
        if self.kind != "cell" or not self.layout.box or n == 0 or not isinstance(u, np.ndarray) \
                or u.ndim != 1:
            return None
        lanes, rest = divmod(u.shape[0], n)
        return lanes if rest == 0 and lanes >= 1 else None

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


def _cells(lay: ModelLayout) -> int:
    return int(np.prod(lay.cell_shape)) if lay.cell_shape else 1


def _backend(opts: dict) -> None:
    b = opts.get("backend")
    if b == "numba":
        return
    if b == "numpy":
        raise JacError("bad_option",
                       "backend='numpy' is the slow reference path: use esmjac.assemble(...) for "
                       "one-shot NumPy/SciPy evaluation; the compiled programs run on numba only")
    raise JacError("bad_option", f"unknown backend {b!r}; available: 'numba'")


# ------------------------------------------------------------------ Jacobian

#: Fused kernels by (program fingerprint, plan key): generated on first use
#: in this process, shared by every workspace (immutable, content-hashed).
_FUSED: dict = {}


@dataclass(frozen=True, eq=False)
class JacobianProgram(_Product, _Base):
    """Compiled Jacobian of one model w.r.t. ``wrt`` (see module docstring)."""

    doc: EvalDoc
    layout: ModelLayout
    kind: str
    wrt: str
    bands: tuple               # JacEntry, read-only
    structure: str
    col_vars: tuple            # column variables, declaration order
    col_base: FrozenMap        # column variable → first global column
    n_cols: int
    kernel: Kernel
    fingerprint: str
    layout_fingerprint: str
    meta: FrozenMap            # read-only index arrays (see layouts.plans.field_meta)
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
            view, lay = _view_layout(source, model, opts)
            bs = _bandset(view, wrt, lay, opts)
            _stage(opts, f"calculus: {len(bs.entries)} bands ({bs.structure})", t0)
            rdoc = rhs_doc(view, lay)
            doc = jacobian_doc(bs, lay, rdoc.kind)
            _stage(opts, f"evaluation document: {len(doc.fields)} fields, {doc.kind} lanes", t0)
            kern = compile_doc(doc, opts)
            _stage(opts, f"generated {len(kern.chunks)} chunk(s), {kern.n_statements} statements", t0)
            cvars, cbase, ncols = column_space(lay, wrt)
            meta = field_meta(doc, lay, cvars, cbase)
            u0, p0, f0 = default_vectors(view, lay)
            lfp = layout_fingerprint(lay, rdoc.kind)
            fp = fingerprint(kern.key, lfp, doc.kind, wrt, heads_of(doc))
            return cls(doc, lay, doc.kind, wrt, tuple(bs.entries), bs.structure,
                       cvars, cbase, ncols, kern, fp, lfp, meta, u0, p0, f0, view.element_type)

        prog = _build_doc_cached("jac", source, model, wrt, opts, make)
        prog._warm(prog.slab_size(1))
        done(opts, "jac", t0)
        return dataclasses.replace(prog, build_seconds=time.perf_counter() - t0)

    # -- sizes -------------------------------------------------------------------
    @property
    def n_fields(self) -> int:
        d = self.doc
        return d.n_fields if isinstance(d, LazyDoc) else len(d.fields)

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

    def plan(self, layout, source: "RhsProgram | None" = None) -> ScatterPlan:
        """The checked scatter plan of this program for ``layout``; with
        ``source``, first check that the RhsProgram is the same model."""
        if source is not None:
            _check_source(self, source)
        return build_plan(self, layout)

    # -- evaluation --------------------------------------------------------------
    def check_workspace(self, ws) -> None:
        """Refuse (``bad_argument``) anything but a workspace made by this
        program (:meth:`new_workspace`) and left intact: the check every
        evaluation, and a binding once, runs before compiled code."""
        if not isinstance(ws, JacWorkspace):
            raise JacError("bad_argument", f"expected a JacWorkspace, got {type(ws).__name__}")
        _checks.workspace(ws, self.fingerprint, "workspace", self.kernel.n_hoist,
                          self.layout.cell_shape if self.kind == "cell" else None)

    def check_plan(self, plan) -> None:
        """Refuse anything but a :class:`ScatterPlan` of this program
        (``bad_argument``; another program's plan: ``foreign_layout``)."""
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
        return BoundJacobian(self, plan, ws, dtype, keep_point=keep_point)

    def eval_into(self, plan, u: np.ndarray, p, t: float, forcing, out: np.ndarray,
                  ws: JacWorkspace) -> np.ndarray:
        """Fill ``out`` (layout of ``plan``) with ∂f/∂wrt at (u, p, t, forcing).

        ``out`` must not share memory with ``u``, ``p``, ``forcing`` or the
        workspace (refused: ``bad_argument``). The point is copied into the
        workspace, so changing ``u`` afterwards does not change ``contract``."""
        self.check_plan(plan)
        self.check_workspace(ws)
        L = ws.lanes
        plan.check_lanes(L)
        t = _checks.time(t)
        _check_vec("u", u, self.u_size(L))
        _check_vec("out", out, plan.out_size(L), u.dtype, out=True)
        _checks.disjoint({"out": out}, {"u": u, "p": p, "forcing": forcing, "workspace h": ws.h,
                                        "workspace lane map": ws.cix})
        pv = _params(p, len(self.layout.params))
        f = self._forcing(forcing, L, u.dtype)
        with serial_below(u.shape[0]):
            bad = None
            if not ws.keep_slab and plan.kind == "lane" and (self.kernel.engine == "codegen" or plan.tiled):
                bad = self._run_fused(plan, u, pv, t, f, out, ws, L)
                ws.last_dtype = None
            else:
                B = ws.slab(u.dtype, self.slab_size(L))
                self._run(self.kernel, u, pv, t, f, B, ws.h, ws.cix, L)
                K.scatter(plan, B, L, out)
                ws.last_dtype = u.dtype
            if bad is None:              # the tile kernels count while they store
                bad = _checks.any_nonfinite(out)
        ws.last_plan = plan.fingerprint
        ws.keep_point(u, pv, t, f)
        if bad:
            _checks.report_nonfinite(out, (u, pv, f), t, "Jacobian")
        return out

    def direct_kernel(self, plan: ScatterPlan, ws: JacWorkspace | None = None) -> Kernel:
        """The plan-specific fused kernel: generated once per process and
        plan (content-hashed on disk), remembered by the workspace."""
        if ws is not None and ws.fused is not None and ws.fused[0] == plan.key:
            return ws.fused[1]
        memo = (self.fingerprint, plan.key)
        k = _FUSED.get(memo)
        if k is None:
            a = plan.arrays
            dest = list(zip(a["fa"].tolist(), a["fb"].tolist(), a["fs"].tolist()))
            zeros = list(zip(a["za"].tolist(), a["zb"].tolist(), a["zs"].tolist()))
            k = compile_doc(self.doc, {**ENGINE_OPTIONS, "engine": "codegen"},
                            title=f"direct writes for layout {plan.layout.name}"
                                  + (f", tile {plan.tile}" if plan.tiled else ""),
                            dest=dest, zeros=zeros, tile=plan.tile if plan.tiled else None,
                            nslots=int(plan.info["slots_per_lane"]))
            _FUSED[memo] = k
        if ws is not None:
            ws.fused = (plan.key, k)
        return k

    def direct_tape(self, plan: ScatterPlan) -> FusedTape:
        """The tape engine's direct-write body for a tiled plan (slot
        stores), generated once per process and plan."""
        memo = (self.fingerprint, plan.key, "tape")
        k = _FUSED.get(memo)
        if k is None:
            a = plan.arrays
            pos = a.get("storage")
            if pos is None:
                k = fused_tape(self.doc, a["fa"], a["za"], self.kernel)
            else:
                # a plan in another slot order (ScatterPlan.in_storage): the tape of
                # its own order with the stores renamed, every instruction in place,
                # so what is cut from it (hoisted rows, the mass-action expansion)
                # and so every value is that plan's, bit for bit
                own = np.argsort(pos)
                ft = fused_tape(self.doc, own[a["fa"]], own[a["za"]], self.kernel)
                k = FusedTape(ft.prologue, rename_stores(ft.body, pos), readonly(np.ascontiguousarray(a["za"])))
            _FUSED[memo] = k
        return k

    def _run_fused(self, plan, u, p, t, f, out, ws, L) -> int | None:
        """Direct writes into ``plan``'s slots; the number of non-finite
        values stored when the kernels count them (tiles), else None."""
        if self.kernel.engine == "tape":
            return self.direct_tape(plan).run(u, p, t, f, out, ws.h, ws.cix, L, plan.tile_width(L),
                                              int(plan.info["slots_per_lane"]), plan.capacity(L))
        return self.direct_kernel(plan, ws).run_fused(u, p, t, f, out, ws.h, ws.cix, L, one_thread())

    def _slab_of(self, ws: JacWorkspace):
        """The band slab at the point of the last ``eval_into``: kept by it
        (``keep_slab=True``) or evaluated now from the workspace's copy of
        that point (direct writes keep no slab), once per ``eval_into``."""
        if ws.last_dtype is None:
            pt = ws.point
            if pt is None:
                raise JacError("bad_argument", "call eval_into first: apply/apply_transpose use the Jacobian "
                               "at its point")
            u, pv, t, f = pt
            B = ws.slab(u.dtype, self.slab_size(ws.lanes))
            with serial_below(u.shape[0]):
                self._run(self.kernel, u, pv, t, f, B, ws.h, ws.cix, ws.lanes)
            ws.last_dtype = u.dtype
        return ws.slabs[ws.last_dtype]

    def apply(self, plan, ws: JacWorkspace, v: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``y += J v`` from the band slab of the last ``eval_into``
        (``y`` sharing memory with ``v`` is refused: ``bad_argument``)."""
        self.check_plan(plan)
        self.check_workspace(ws)
        B = self._slab_of(ws)
        L = ws.lanes
        _check_vec("v", v, self.col_size(L))
        _check_vec("y", y, self.u_size(L), out=True)
        _checks.disjoint({"y": y}, {"v": v, "workspace slab": B})
        m = self.meta
        with serial_below(y.shape[0]):
            if self.kind == "cell":
                K.lane_apply(B, L, m["r_ptr"], m["r_band"], m["r_ca"], m["r_cb"], m["r_cs"], m["r_tgt"], v, y)
            else:
                K.point_apply(B, m["r_ptr"], m["r_src"], m["r_other"], m["r_tgt"], v, y)
        return y

    def apply_transpose(self, plan, ws: JacWorkspace, lam: np.ndarray, gbar: np.ndarray) -> np.ndarray:
        """``gbar += Jᵀ lam`` (float64 accumulation; a gather over the
        transposed plan: each column is owned by one iteration). ``gbar``
        sharing memory with ``lam`` is refused (``bad_argument``)."""
        self.check_plan(plan)
        self.check_workspace(ws)
        B = self._slab_of(ws)
        L = ws.lanes
        _check_vec("lam", lam, self.u_size(L))
        _check_vec("gbar", gbar, self.col_size(L), np.float64, out=True)
        _checks.disjoint({"gbar": gbar}, {"lam": lam, "workspace slab": B})
        m = self.meta
        with serial_below(lam.shape[0]):
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
        self.check_plan(plan)
        self.check_workspace(ws2)
        if self.wrt != "states":
            raise JacError("bad_option", "contract is the state Hessian contraction (wrt='states')")
        if ws2.point is None:
            raise JacError("bad_argument", "call eval_into on this workspace first (contract uses its point)")
        n = self.u_size(ws2.lanes)
        _check_vec("lam", lam, n)
        _check_vec("v", v, n)
        _check_vec("out", out, n, np.float64, out=True)
        _checks.disjoint({"out": out}, {"lam": lam, "v": v})
        return contract_at(self, ws2, lam, v, out)


def _check_source(prog: JacobianProgram, source) -> None:
    """Refuse an RhsProgram of another model as a plan's ``source``."""
    if not isinstance(source, RhsProgram):
        raise JacError("bad_argument", f"source must be an RhsProgram, got {type(source).__name__}")
    names = set(source.layout.states) | set(source.param_names) | set(source.forcing_names) | {"t"}
    for v in prog.col_vars:
        if v not in names:
            raise JacError("unresolvable_column", f"column variable `{v}` does not resolve in the RhsProgram")
    for row in band_rows(prog.bands):
        if row not in names:
            raise JacError("unresolvable_column", f"row variable `{row}` does not resolve in the RhsProgram")
    if source.layout_fingerprint != prog.layout_fingerprint:
        raise JacError("foreign_layout",
                       "the RhsProgram was built from a different model or layout (its fingerprint "
                       "differs from this JacobianProgram's)")


def _bandset(view, wrt: str, lay: ModelLayout, opts: dict) -> BandSet:
    """The bands of ∂f/∂wrt; with ``per_lane`` parameters, ``forcing``
    columns include them (the calculus sees them as scalar parameters)."""
    if wrt == "forcing" and lay.per_lane:
        bs = BandSet.build(view, wrt="parameters", options={"allow_empty": bool(opts["allow_empty"])})
        keep = set(lay.forcing)
        return dataclasses.replace(bs, wrt="forcing", entries=tuple(e for e in bs.entries if e.col in keep))
    return BandSet.build(view, wrt=wrt, options={"allow_empty": bool(opts["allow_empty"])})
