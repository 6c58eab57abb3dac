"""Dask / xarray adapter: esmjac's programs mapped over chunks of cells.

The state is a ``dask.array`` of shape ``(n_species, cells)`` chunked along
cells only -- each chunk is a lane block in the species-major lane layout
(docs/design.rst §4: ``u[s*w + l]`` for a chunk of ``w`` cells) -- or an
``xarray.Dataset`` with one variable per species over any cell dimensions
(stacked to one lane axis, unstacked on return), or a ``DataArray`` with a
leading ``species`` dimension. Every function returns the kind it was given.

Build once, ship small. The client never pickles a program: it ships a
:class:`_Spec` -- the model document resized to a two-cell *template*
(zlib-compressed JSON, a few kB), the build options, the real grid's cell
shape and a content hash -- once per graph, as one dependency key. Each
worker process builds the template programs the first time a task needs
them (from the on-disk content-hash cache, so compiled code is loaded, not
compiled), under a process lock so that many simultaneous tasks build once;
each worker thread keeps one workspace per (program, chunk width), reused
by every later task. A cell program's kernels do not depend on the cell
count (checked at spec time: the templates at two and three cells must give
the same kernel hashes, and the kernels must not read cell index values),
so the template evaluates any number of lanes. A model whose expressions
read the cell index is shipped whole instead: each worker builds the full
grid once and each chunk's lane map names its real cells.

The same bits: every chunk runs the same kernels on the same lane values as
one process does over the whole grid, so results are bitwise those of
``eval_into`` / ``RhsProgram.eval_into`` / the Rosenbrock leaf on those
lanes for any chunking, worker count, thread count, processes or threads.
Numba runs on one thread inside a task (``threads=1``): Dask's workers are
the parallelism.

Stencils: a ``global`` program (transport couples cells across the grid)
is refused with ``unsupported_construct`` before any task is made; no edge
cell is ever evaluated without its neighbours.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import zlib
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compile.tape import OPS
from ..errors import JacError
from ..layouts.types import LaneSparseBlocks, untile
from ..model.expr import free_names
from ..runtime import checks
from ..runtime.programs import JacobianProgram, RhsProgram
from ..runtime.workspace import lane_cells
from ..integrators.leaf import ATOL_FRACTION, RosenbrockLeaf
from ..plugins.hookspecs import Adapter, dist_version, hookimpl, module_available

__all__ = ["DaskModel", "model", "rhs", "jacobian", "apply", "apply_transpose", "advance", "Advanced",
           "held_bytes", "SPECIES_DIM", "SLOT_DIM", "CELL_DIM"]

#: Dimension names of the DataArray forms.
SPECIES_DIM = "species"
SLOT_DIM = "slot"
#: Name of the stacked lane axis while an xarray input is being evaluated.
CELL_DIM = "_esmjac_cell"

_TEMPLATE_CELLS = 2          # a one-cell grid is degenerate (its Jacobian is a global program)


# ---------------------------------------------------------------- the spec

@dataclass(frozen=True)
class _Spec:
    """What a worker needs to rebuild the programs: small and content-keyed.

    ``doc`` is the zlib-compressed canonical JSON of the template document
    (the model with its cell index sets resized to two cells) or, when the
    model cannot be resized, of the full document (``template=False``)."""

    doc: bytes
    model: str | None
    options: tuple               # sorted (name, value) build options
    cell_shape: tuple            # the real grid's cell shape (row-major lanes)
    template: bool
    key: str

    def document(self) -> dict:
        return json.loads(zlib.decompress(self.doc))


def _load_doc(source) -> dict:
    if isinstance(source, dict):
        return copy.deepcopy(source)
    if isinstance(source, (str, os.PathLike)):
        text = str(source)
        if isinstance(source, str) and text.lstrip().startswith("{"):
            return json.loads(text)
        try:
            with open(source, "rb") as fh:
                return json.loads(fh.read())
        except OSError as exc:
            raise JacError("load_error", f"cannot read {source!r}: {exc}") from None
        except ValueError as exc:
            raise JacError("load_error", f"{source!r} is not JSON: {exc}") from None
    raise JacError("bad_argument",
                   f"the dask adapter ships the model document to its workers: pass an .esm path, "
                   f"JSON text or a dict, not a {type(source).__name__}")


def _cell_sets(doc: dict, model: str | None) -> tuple | None:
    """The index-set names that make up the unknowns' common shape, or None."""
    models = doc.get("models") or {}
    if model is None:
        if len(models) != 1:
            return None
        model = next(iter(models))
    m = models.get(model.split(".")[0]) if isinstance(model, str) else None
    if not isinstance(m, dict):
        return None
    shapes = {tuple(v.get("shape") or ()) for v in (m.get("variables") or {}).values()
              if isinstance(v, dict) and v.get("type") in ("unknown", "state")}
    if len(shapes) != 1:
        return None
    sets = next(iter(shapes))
    if not sets or not all(isinstance(s, str) and s in (doc.get("index_sets") or {}) for s in sets):
        return None
    return sets


def _resized(doc: dict, sets: tuple, n: int) -> dict:
    out = copy.deepcopy(doc)
    for s in sets:
        out["index_sets"][s]["size"] = n
    for mod in out.get("models", {}).values():
        for var in mod.get("variables", {}).values():
            if isinstance(var, dict) and isinstance(var.get("default"), list):
                var["default"] = var["default"][0] if var["default"] else 0.0
    return out


def _pack(doc: dict) -> bytes:
    return zlib.compress(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), 9)


def _spec_key(doc_bytes: bytes, model, options, template: bool) -> str:
    h = hashlib.sha256(doc_bytes)
    h.update(repr((model, options, template)).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- per process

@dataclass
class _Built:
    """The programs of one spec in this process (shared by its threads)."""

    rhs: Any
    jac: Any
    plans: dict = field(default_factory=dict)
    lock: Any = field(default_factory=threading.Lock)

    def plan(self, layout):
        p = self.plans.get(layout)
        if p is None:
            with self.lock:
                p = self.plans.get(layout)
                if p is None:
                    p = self.jac.plan(layout, source=self.rhs)
                    self.plans[layout] = p
        return p


_BUILD_LOCK = threading.Lock()
_BUILT: dict = {}
#: Builds per spec key in this process (a worker builds each spec once).
BUILDS: Counter = Counter()
_TLS = threading.local()
_WS_PER_THREAD = 8
_CACHES: list = []            # every thread's scratch cache (for held_bytes)


def _built(spec: _Spec) -> _Built:
    """This process's programs for ``spec``: built by the first task that
    needs them while the others wait on the lock (compile once, never per task)."""
    b = _BUILT.get(spec.key)
    if b is None:
        with _BUILD_LOCK:
            b = _BUILT.get(spec.key)
            if b is None:
                b = _build(spec)
                _BUILT[spec.key] = b
                BUILDS[spec.key] += 1
    return b


def _build(spec: _Spec) -> _Built:
    doc = spec.document()
    opts = dict(spec.options)
    return _Built(RhsProgram.build(doc, spec.model, options=opts),
                  JacobianProgram.build(doc, spec.model, wrt="states", options=opts))


def _scratch(spec: _Spec, what: str, lanes: int, make):
    """One scratch object per (thread, spec, role, lanes), reused across tasks."""
    cache = getattr(_TLS, "ws", None)
    if cache is None:
        cache = _TLS.ws = OrderedDict()
        with _BUILD_LOCK:
            _CACHES.append(cache)
    key = (spec.key, what, lanes)
    s = cache.get(key)
    if s is None:
        s = make()
        cache[key] = s
        while len(cache) > _WS_PER_THREAD:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return s


_BUILD_PRODUCTS = ("_Built", "RhsProgram", "JacobianProgram", "ScatterPlan", "SparseLaneLU")


def held_bytes() -> dict:
    """Bytes of scratch this process holds, by lane count: every worker
    thread's workspaces, buffers and integrator scratch (NumPy arrays reached
    from them, each counted once). For the scale benchmark's bytes per lane;
    run it on the workers with ``client.run(held_bytes)``."""
    seen: set = set()
    out: Counter = Counter()

    def walk(x, depth, lanes):
        if isinstance(x, np.ndarray):
            base = x if x.base is None else x.base
            if id(base) not in seen and isinstance(base, np.ndarray):
                seen.add(id(base))
                out[lanes] += base.nbytes
            return
        if depth > 5 or isinstance(x, (str, bytes, int, float, type(None))):
            return
        if isinstance(x, dict):
            for v in x.values():
                walk(v, depth + 1, lanes)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v, depth + 1, lanes)
        elif hasattr(x, "__dict__") and not isinstance(x, type) and type(x).__module__.startswith("esmjac") \
                and type(x).__name__ not in _BUILD_PRODUCTS:
            for v in vars(x).values():
                walk(v, depth + 1, lanes)

    with _BUILD_LOCK:
        caches = list(_CACHES)
    for cache in caches:
        for (key, role, lanes), obj in list(cache.items()):
            walk(obj, 0, lanes)
    return dict(out)


class _Threads:
    """Numba on ``n`` threads for the duration of a task (thread-local)."""

    def __init__(self, n: int | None):
        self.n, self.prev = n, None

    def __enter__(self):
        if self.n:
            import numba
            self.prev = numba.get_num_threads()
            numba.set_num_threads(min(int(self.n), numba.config.NUMBA_NUM_THREADS))
        return self

    def __exit__(self, *exc):
        if self.prev is not None:
            import numba
            numba.set_num_threads(self.prev)


def _cix(spec: _Spec, start: int, lanes: int) -> np.ndarray | None:
    """The chunk's lane → grid-cell map, or None where the kernels never read
    cell indices (template specs: the workspace's own map then serves)."""
    if spec.template:
        return None
    return lane_cells(spec.cell_shape, lanes, np.arange(start, start + lanes))


def _reads_cells(prog) -> bool:
    """Whether a program's kernels read cell index values (``cix``)."""
    k = prog.kernel
    if k.engine == "tape":
        idx = OPS.index("idx")                  # the opcode of a cell-index read (public op table)
        return any(bool(np.any(t.code[:, 0] == idx)) for t in k.tapes)
    return "cix[" in k.source


def _flat(block: np.ndarray | None, dtype) -> np.ndarray | None:
    if block is None:
        return None
    return np.ascontiguousarray(block, dtype=dtype).reshape(-1)


def _start(block_info) -> int:
    return int(block_info[None]["array-location"][1][0])


def _jac_ws(spec: _Spec, b: _Built, lanes: int, start: int):
    ws = _scratch(spec, "jac", lanes, lambda: b.jac.new_workspace(lanes))
    cix = _cix(spec, start, lanes)
    if cix is not None:
        ws.cix = cix
    return ws


# ---------------------------------------------------------------- block tasks

def _rhs_block(u, f, spec, p, t, threads, block_info=None):
    b = _built(spec)
    w = u.shape[1]
    uu = _flat(u, u.dtype)
    out = np.empty_like(uu)
    sc = _scratch(spec, "rhs", w, lambda: b.rhs.new_buffers(w))
    cix = _cix(spec, _start(block_info), w)
    if cix is not None:
        sc.cix = cix
    with _Threads(threads):
        b.rhs.eval_into(uu, p, t, _flat(f, u.dtype), out, sc)
    return out.reshape(u.shape)


def _jac_block(u, f, spec, layout, p, t, threads, block_info=None):
    b = _built(spec)
    plan = b.plan(layout)
    w = u.shape[1]
    uu = _flat(u, u.dtype)
    out = np.zeros(plan.out_size(w), dtype=u.dtype)
    ws = _jac_ws(spec, b, w, _start(block_info))
    with _Threads(threads):
        b.jac.eval_into(plan, uu, p, t, _flat(f, u.dtype), out, ws)
    if plan.tiled:             # [slot, lane] blocks: undo the lane tiles
        return untile(out, int(plan.info["slots_per_lane"]), w, plan.tile_width(w))
    return out.reshape(-1, w)


def _apply_block(u, v, f, spec, p, t, threads, transpose, block_info=None):
    b = _built(spec)
    plan = b.plan(LaneSparseBlocks())     # tiled default: eval_into 2x faster, apply's bits unchanged
    w = u.shape[1]
    uu = _flat(u, u.dtype)
    ws = _jac_ws(spec, b, w, _start(block_info))
    jbuf = _scratch(spec, ("jbuf", u.dtype.str), w, lambda: np.zeros(plan.out_size(w), dtype=u.dtype))
    with _Threads(threads):
        b.jac.eval_into(plan, uu, p, t, _flat(f, u.dtype), jbuf, ws)
        if transpose:
            g = np.zeros(b.jac.col_size(w), dtype=np.float64)
            b.jac.apply_transpose(plan, ws, _flat(v, u.dtype), g)
            return g.reshape(-1, w)
        y = np.zeros(b.rhs.u_size(w), dtype=u.dtype)
        b.jac.apply(plan, ws, _flat(v, u.dtype), y)
    return y.reshape(-1, w)


# ---------------------------------------------------------------- the model handle

@dataclass(frozen=True, eq=False)
class DaskModel:
    """A model ready to map over chunks: the spec the workers rebuild from,
    and the client-side facts the graph needs (names, sizes, defaults).

    Build it once with :func:`model` and pass it wherever a ``source`` is
    accepted; the module functions do so implicitly (memoised per source)."""

    spec: _Spec
    species: tuple
    forcing_names: tuple
    param_names: tuple
    p0: np.ndarray
    forcing_defaults: dict        # forcing name → scalar default (those that have one)
    cells: int                    # cells of the real grid
    u0: dict = field(default_factory=dict)   # species → the document's default (its first cell)
    lu_pattern: tuple = ()
    kind: str = "cell"
    _built: Any = field(default=None, repr=False)

    @property
    def n_species(self) -> int:
        return len(self.species)

    def slots(self, layout) -> int:
        """Slots per lane of ``layout`` (rows of :func:`jacobian`'s output)."""
        plan = _client_built(self).plan(layout)
        return _lane_slots(plan)

    def slot_labels(self, layout) -> list:
        """``"row,col"`` species names of each slot (for xarray coordinates)."""
        plan = _client_built(self).plan(layout)
        info = plan.info
        sp = self.species
        if "lu_pattern" in info and isinstance(layout, _lsb()):
            perm = info.get("ordering") or list(range(len(sp)))
            return [f"{sp[perm[r]]},{sp[perm[c]]}" for r, c in info["lu_pattern"]]
        n = len(sp)
        k = _lane_slots(plan)
        if k == n * n:
            perm = info.get("ordering") if getattr(layout, "order", "natural") == "markowitz" else None
            perm = perm or list(range(n))
            return [f"{sp[perm[q // n]]},{sp[perm[q % n]]}" for q in range(k)]
        return [str(q) for q in range(k)]


def _lsb():
    return LaneSparseBlocks


def _lane_slots(plan) -> int:
    if plan.kind != "lane":
        raise JacError("bad_option",
                       f"layout {plan.layout.name} is one global matrix, not a block per lane; chunks "
                       "of cells need a lane layout (LaneSparseBlocks, LaneBlocks)")
    w = plan.info.get("tile") or 1          # a tiled layout stores whole tiles of w lanes
    k = plan.out_size(w) // w
    if plan.out_size(3 * w) != 3 * w * k:
        raise JacError("bad_option", f"layout {plan.layout.name} does not store slots × lanes")
    return k


def _client_built(m: DaskModel) -> _Built:
    return _built(m.spec)


_MODELS: dict = {}
_MODELS_LOCK = threading.Lock()


def model(source, model: str | None = None, *, cells: int | None = None,
          options: dict | None = None) -> DaskModel:
    """Prepare ``source`` (an .esm path, JSON text or dict) for chunked
    evaluation over ``cells`` grid cells (default: the document's own).

    Refuses a model that couples cells (``unsupported_construct``): a
    chunk's edge cells would miss their neighbours."""
    if isinstance(source, DaskModel):
        return source
    doc = _load_doc(source)
    opts = tuple(sorted((options or {}).items()))
    raw = _pack(doc)
    memo = (hashlib.sha256(raw).hexdigest(), model, opts, cells)
    with _MODELS_LOCK:
        hit = _MODELS.get(memo)
    if hit is not None:
        return hit
    m = _make_model(doc, model, dict(opts), cells)
    with _MODELS_LOCK:
        _MODELS[memo] = m
    return m


def _make_model(doc: dict, model_name, opts: dict, cells: int | None) -> DaskModel:
    sets = _cell_sets(doc, model_name)
    otup = tuple(sorted(opts.items()))
    built = spec = None
    if sets is not None:
        full_shape = tuple(int(doc["index_sets"][s]["size"]) for s in sets)
        try:
            tdoc = _resized(doc, sets, _TEMPLATE_CELLS)
            r2 = RhsProgram.build(tdoc, model_name, options=opts)
            j2 = JacobianProgram.build(tdoc, model_name, options=opts)
            if r2.kind == "cell" and j2.kind == "cell" and not (_reads_cells(r2) or _reads_cells(j2)):
                t3 = _resized(doc, sets, _TEMPLATE_CELLS + 1)
                r3 = RhsProgram.build(t3, model_name, options=opts)
                j3 = JacobianProgram.build(t3, model_name, options=opts)
                if (r3.kernel.key, j3.kernel.key) == (r2.kernel.key, j2.kernel.key):
                    packed = _pack(tdoc)
                    spec = _Spec(packed, model_name, otup, full_shape, True,
                                 _spec_key(packed, model_name, otup, True))
                    built = _Built(r2, j2)
        except JacError:
            spec = None
    if spec is None:                   # not resizable: the workers build the full document
        r2 = RhsProgram.build(doc, model_name, options=opts)
        j2 = JacobianProgram.build(doc, model_name, options=opts)
        full_shape = tuple(r2.layout.cell_shape)
        packed = _pack(doc)
        spec = _Spec(packed, model_name, otup, full_shape, False, _spec_key(packed, model_name, otup, False))
        built = _Built(r2, j2)
    if built.rhs.kind != "cell" or built.jac.kind != "cell":
        raise JacError("unsupported_construct",
                       "this model couples cells across the grid (a transport stencil: its programs "
                       "have lane kind 'global'), so a chunk's edge cells would miss their neighbours. "
                       "The dask adapter maps cell-local chemistry only: operator-split the model "
                       "(chemistry per cell through esmjac.adapters.dask, transport in the host model) "
                       "or integrate the coupled system in one process with kind 'scipy.ivp' or "
                       "'sundials.cvode'")
    n_real = int(np.prod(full_shape)) if full_shape else 1
    if cells is not None and int(cells) != n_real:
        if not spec.template or len(full_shape) != 1:
            raise JacError("bad_argument",
                           f"the document's grid has {n_real} cells; the data has {cells} (only a "
                           "one-dimensional cell grid of a resizable model follows the data)")
        full_shape, n_real = (int(cells),), int(cells)
        spec = _Spec(spec.doc, spec.model, spec.options, full_shape, spec.template,
                     _spec_key(spec.doc, spec.model, spec.options, spec.template))
    with _BUILD_LOCK:
        _BUILT.setdefault(spec.key, built)
    lay = built.rhs.layout
    fdef = _forcing_defaults(doc, model_name, lay.forcing)
    lsb = built.plan(_lsb()())
    u0 = np.asarray(built.rhs.u0, dtype=np.float64).reshape(len(lay.states), -1)[:, 0] \
        if built.rhs.u0 is not None else np.zeros(len(lay.states))
    return DaskModel(spec, tuple(lay.states), tuple(lay.forcing), tuple(lay.params),
                     np.array(built.rhs.p0, dtype=np.float64), fdef, n_real,
                     dict(zip(lay.states, u0.tolist())), tuple(tuple(x) for x in lsb.info["lu_pattern"]),
                     "cell")


def _forcing_defaults(doc: dict, model_name, names) -> dict:
    models = doc.get("models") or {}
    m = models.get(model_name.split(".")[0]) if model_name else next(iter(models.values()), {})
    out = {}
    for n in names:
        d = ((m or {}).get("variables") or {}).get(n, {}).get("default")
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            out[n] = float(d)
    return out


# ---------------------------------------------------------------- inputs

@dataclass
class _Input:
    """A state as a dask array (n_species, cells) plus how to give it back."""

    u: Any
    kind: str                      # "dask" | "dataset" | "dataarray"
    template: Any = None           # the xarray object, for unstacking
    cell_dims: tuple = ()
    stacked: Any = None            # the stacked index (a MultiIndex) or None


def _as_dask(x, name: str):
    import dask.array as da
    if isinstance(x, da.Array):
        return x
    if isinstance(x, np.ndarray):
        return da.from_array(x, chunks=(x.shape[0], x.shape[1]) if x.ndim == 2 else -1)
    raise JacError("bad_argument", f"`{name}` must be a dask array, a NumPy array or an xarray object, "
                                   f"got {type(x).__name__}")


def _state(m: DaskModel, u) -> _Input:
    mod = type(u).__module__.split(".")[0]
    if mod == "xarray":
        return _xr_state(m, u)
    a = _as_dask(u, "u")
    if a.ndim != 2 or a.shape[0] != m.n_species:
        raise JacError("bad_argument", f"`u` must have shape (n_species={m.n_species}, cells); got {a.shape}")
    if np.dtype(a.dtype) not in (np.dtype(np.float64), np.dtype(np.float32)):
        raise JacError("bad_argument", f"`u` has dtype {a.dtype}; use float64 or float32")
    if len(a.chunks[0]) != 1:
        a = a.rechunk({0: -1})        # chunks follow cells only: every chunk holds whole lanes
    return _Input(a, "dask")


def _xr_state(m: DaskModel, u) -> _Input:
    import xarray as xr
    if isinstance(u, xr.Dataset):
        missing = [s for s in m.species if s not in u.data_vars]
        if missing:
            raise JacError("bad_argument", f"the Dataset lacks species {missing}; it needs one variable "
                                           f"per species {list(m.species)}")
        first = u[m.species[0]]
        dims = first.dims
        for s in m.species:
            if u[s].dims != dims:
                raise JacError("bad_argument", f"species {s!r} has dims {u[s].dims}; expected {dims}")
        da_ = xr.concat([u[s] for s in m.species], dim=SPECIES_DIM)
        kind = "dataset"
    elif isinstance(u, xr.DataArray):
        if u.dims[0] != SPECIES_DIM or u.sizes[SPECIES_DIM] != m.n_species:
            raise JacError("bad_argument", f"a DataArray state needs a leading {SPECIES_DIM!r} dimension of "
                                           f"length {m.n_species}; got dims {u.dims}")
        da_ = u
        dims = u.dims[1:]
        kind = "dataarray"
    else:
        raise JacError("bad_argument", f"unsupported xarray type {type(u).__name__}")
    st = _stack(da_, dims)
    return _Input(_as_dask(_dask_data(st), "u"), kind, u, tuple(dims), st)


def _stack(x, dims):
    if not dims:
        raise JacError("bad_argument", "the state has no cell dimensions")
    x = x.transpose(SPECIES_DIM, *dims) if SPECIES_DIM in x.dims else x.transpose(*dims)
    return x.stack({CELL_DIM: list(dims)}) if len(dims) > 1 else x.rename({dims[0]: CELL_DIM})


def _dask_data(x):
    import dask.array as da
    d = x.data
    if not isinstance(d, da.Array):
        d = da.from_array(np.asarray(d), chunks=-1)
    if d.ndim == 2 and len(d.chunks[0]) != 1:
        d = d.rechunk({0: -1})
    return d


def _forcing(m: DaskModel, forcing, inp: _Input):
    """Forcing as a dask array (n_forcing, cells) chunked like ``u``, or None."""
    import dask.array as da
    u = inp.u
    if not m.forcing_names:
        if forcing is not None and not (inp.kind == "dataset" and forcing is inp.template):
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        return None
    rows = []
    src = forcing
    if isinstance(src, dict):
        extra = sorted(set(src) - set(m.forcing_names))
        if extra:
            raise JacError("bad_argument", f"unknown forcing fields {extra}; this model's are "
                                           f"{list(m.forcing_names)}")
    if src is None and inp.kind == "dataset":
        src = inp.template                     # forcing variables inside the state Dataset
    for n in m.forcing_names:
        x = None
        if src is not None and not isinstance(src, (np.ndarray, da.Array)):
            try:
                x = src[n]
            except KeyError:
                x = None
        if x is None:
            if isinstance(src, (np.ndarray, da.Array)):
                break
            if n not in m.forcing_defaults:
                raise JacError("bad_argument", f"forcing field {n!r} is required (no scalar default)")
            rows.append(da.full((1, u.shape[1]), m.forcing_defaults[n], dtype=u.dtype, chunks=(1, u.chunks[1])))
            continue
        if type(x).__module__.split(".")[0] == "xarray":
            if inp.kind == "dask":
                raise JacError("bad_argument", "pass forcing as dask arrays when the state is a dask array")
            st = _stack(x.transpose(*inp.cell_dims), inp.cell_dims)
            a = _dask_data(st)
        else:
            a = _as_dask(np.asarray(x) if not isinstance(x, da.Array) else x, f"forcing[{n!r}]")
        if a.ndim != 1 or a.shape[0] != u.shape[1]:
            raise JacError("bad_argument", f"forcing {n!r} must have one value per cell ({u.shape[1]}); "
                                           f"got shape {a.shape}")
        rows.append(a.astype(u.dtype).reshape(1, -1).rechunk((1, u.chunks[1])))
    else:
        return da.concatenate(rows, axis=0).rechunk((len(rows), u.chunks[1]))
    a = _as_dask(src, "forcing")
    if a.shape != (len(m.forcing_names), u.shape[1]):
        raise JacError("bad_argument", f"forcing must have shape ({len(m.forcing_names)}, {u.shape[1]}) "
                                       f"(fields {list(m.forcing_names)}); got {a.shape}")
    return a.astype(u.dtype).rechunk((len(m.forcing_names), u.chunks[1]))


def _p(m: DaskModel, p) -> np.ndarray:
    if p is None:
        return m.p0
    a = np.ascontiguousarray(np.asarray(p, dtype=np.float64))
    if a.shape != (len(m.param_names),):
        raise JacError("bad_argument", f"`p` must have {len(m.param_names)} entries {list(m.param_names)}")
    return a


def _prepare(source, u, model_name, forcing, p):
    first = _state_probe(u)
    m = model(source, model_name, cells=first)
    inp = _state(m, u)
    if inp.u.shape[1] != m.cells:
        m = model(source, model_name, cells=inp.u.shape[1])
    return m, inp, _forcing(m, forcing, inp), _p(m, p)


def _state_probe(u) -> int | None:
    """The number of cells in ``u`` (for the grid size), before checks."""
    try:
        import xarray as xr
        if isinstance(u, xr.Dataset):
            v = next(iter(u.data_vars.values()))
            return int(np.prod([u.sizes[d] for d in v.dims]))
        if isinstance(u, xr.DataArray):
            return int(np.prod([u.sizes[d] for d in u.dims[1:]]))
    except ImportError:
        pass
    shape = getattr(u, "shape", None)
    return int(shape[1]) if shape is not None and len(shape) == 2 else None


def _delayed_spec(m: DaskModel):
    import dask
    return dask.delayed(m.spec, pure=True, name=f"esmjac-spec-{m.spec.key[:16]}")


def _map(fn, rows: int, dtype, arrays, *args, **kw):
    import dask.array as da
    u = arrays[0]
    return da.map_blocks(fn, *arrays, *args, chunks=((rows,), u.chunks[1]), dtype=dtype,
                         meta=np.empty((0, 0), dtype=dtype), **kw)


# ---------------------------------------------------------------- outputs

def _out_states(inp: _Input, a, m: DaskModel):
    """(n_species, cells) → the input's kind."""
    if inp.kind == "dask":
        return a
    import xarray as xr
    st = inp.stacked
    coords = {k: v for k, v in st.coords.items() if CELL_DIM in v.dims}
    x = xr.DataArray(a, dims=(SPECIES_DIM, CELL_DIM), coords=coords)
    x = _unstack(x, inp)
    if inp.kind == "dataarray":
        return x.assign_coords({SPECIES_DIM: inp.template[SPECIES_DIM]}) \
            if SPECIES_DIM in inp.template.coords else x
    return xr.Dataset({s: x.isel({SPECIES_DIM: i}, drop=True) for i, s in enumerate(m.species)},
                      attrs=dict(inp.template.attrs))


def _out_rows(inp: _Input, a, dim: str, labels):
    if inp.kind == "dask":
        return a
    import xarray as xr
    st = inp.stacked
    coords = {k: v for k, v in st.coords.items() if CELL_DIM in v.dims}
    coords[dim] = labels
    return _unstack(xr.DataArray(a, dims=(dim, CELL_DIM), coords=coords), inp)


def _unstack(x, inp: _Input):
    if len(inp.cell_dims) > 1:
        x = x.unstack(CELL_DIM).transpose(x.dims[0], *inp.cell_dims)
        # unstack sorts by coordinate: restore the input's own order, and
        # drop the integer coordinates stacking invented for bare dims
        have = [d for d in inp.cell_dims if d in inp.template.coords]
        x = x.reindex({d: inp.template[d] for d in have})
        return x.drop_vars([d for d in inp.cell_dims if d not in have])
    return x.rename({CELL_DIM: inp.cell_dims[0]})


# ---------------------------------------------------------------- public functions

def rhs(source, u, *, p=None, t: float = 0.0, forcing=None, model: str | None = None,
        threads: int | None = 1):
    """``du/dt`` per chunk: a dask array ``(n_species, cells)`` (or the input's xarray kind)."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p)
    arrays = [inp.u] + ([f] if f is not None else [])
    fn = _rhs_block if f is not None else _no_forcing(_rhs_block)
    out = _map(fn, m.n_species, inp.u.dtype, arrays, _delayed_spec(m), pv, float(t), threads)
    return _out_states(inp, out, m)


def jacobian(source, u, *, layout=None, p=None, t: float = 0.0, forcing=None,
             model: str | None = None, threads: int | None = 1):
    """∂f/∂u per chunk, exactly what ``eval_into`` writes for the chunk's
    lanes laid out slot × lane: a dask array ``(slots, cells)``; for xarray
    input a DataArray ``(slot, *cell_dims)`` with ``"row,col"`` slot labels."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p)
    layout = layout if layout is not None else _lsb()()
    k = m.slots(layout)
    arrays = [inp.u] + ([f] if f is not None else [])
    fn = _jac_block if f is not None else _no_forcing(_jac_block)
    out = _map(fn, k, inp.u.dtype, arrays, _delayed_spec(m), layout, pv, float(t), threads)
    return _out_rows(inp, out, SLOT_DIM, m.slot_labels(layout) if inp.kind != "dask" else None)


def apply(source, u, v, *, p=None, t: float = 0.0, forcing=None, model: str | None = None,
          threads: int | None = 1):
    """``J(u)·v`` per chunk (``v`` shaped and chunked like ``u``)."""
    return _products(source, u, v, p, t, forcing, model, threads, False)


def apply_transpose(source, u, lam, *, p=None, t: float = 0.0, forcing=None,
                    model: str | None = None, threads: int | None = 1):
    """``J(u)ᵀ·λ`` per chunk, accumulated in float64 (as ``apply_transpose``)."""
    return _products(source, u, lam, p, t, forcing, model, threads, True)


def _products(source, u, v, p, t, forcing, model_name, threads, transpose):
    m, inp, f, pv = _prepare(source, u, model_name, forcing, p)
    vin = _state(m, v)
    if vin.u.shape != inp.u.shape:
        raise JacError("bad_argument", f"the vector has shape {vin.u.shape}; the state {inp.u.shape}")
    va = vin.u.astype(inp.u.dtype).rechunk(inp.u.chunks)
    arrays = [inp.u, va] + ([f] if f is not None else [])
    fn = _apply_block if f is not None else _no_forcing(_apply_block, at=2)
    dtype = np.float64 if transpose else inp.u.dtype
    out = _map(fn, m.n_species, dtype, arrays, _delayed_spec(m), pv, float(t), threads, transpose)
    return _out_states(inp, out, m)


def _no_forcing(fn, at: int = 1):
    """``fn`` with ``None`` forcing inserted at argument ``at`` (no forcing array to map)."""
    def g(*args, block_info=None):
        return fn(*args[:at], None, *args[at:], block_info=block_info)
    g.__name__ = fn.__name__
    return g


# ---------------------------------------------------------------- advance

#: Per-lane statistics rows appended below the new state by the advance task.
STAT_ROWS = ("status", "nsteps", "naccept", "nreject", "t")


def _default_atol(doc: dict, model_name, species) -> np.ndarray:
    """The leaf's default absolute tolerance (``ATOL_FRACTION`` of each
    species' largest default over the document's cells), from the document
    itself so that every chunk and one process use the same values."""
    models = doc.get("models") or {}
    m = models.get(model_name.split(".")[0]) if model_name else next(iter(models.values()), {})
    var = (m or {}).get("variables") or {}
    scale = np.array([float(np.max(np.abs(np.asarray(var.get(s, {}).get("default", 0.0), dtype=np.float64)),
                                  initial=0.0)) for s in species])
    top = float(scale.max()) if scale.size else 1.0
    top = top if top > 0 else 1.0
    return ATOL_FRACTION * np.maximum(scale, 1e-6 * top)


class _Leaf:
    """The per-lane Rosenbrock leaf (:mod:`esmjac.integrators.leaf`) on one thread."""

    def __init__(self, b: _Built, p, method, rtol, atol, max_steps):
        self.leaf = RosenbrockLeaf(b.rhs, b.jac, b.plan(LaneSparseBlocks()), p, None, method=method,
                                   rtol=rtol, atol=atol, step="lane", threads=1, compact=True,
                                   clip_negative=False, max_steps=max_steps, max_rejects=50, h0=None)

    def advance(self, u, t0, dt, forcing, cix):
        # the leaf numbers its lanes from cell 0 of the grid: a chunk gives
        # it its own cells, for index-dependent expressions
        st = self.leaf.advance(u, t0, dt, forcing=forcing, cells=cix)
        return np.stack([st.status, st.nsteps, st.naccept, st.nreject, st.t]).astype(np.float64)


def _integrator(spec, b, p, method, rtol, atol, max_steps, lanes):
    key = ("leaf", p.tobytes(), method, rtol, atol.tobytes(), max_steps)

    return _scratch(spec, key, lanes, lambda: _Leaf(b, p, method, rtol, atol, max_steps))


def _advance_block(u, f, spec, p, t0, dt, method, rtol, atol, max_steps, threads, block_info=None):
    b = _built(spec)
    n, w = u.shape
    y = np.array(u, dtype=np.float64, order="C").reshape(-1)
    fz = None if f is None else np.array(f, dtype=np.float64, order="C").reshape(-1)
    cix = _cix(spec, _start(block_info), w)
    leaf = _integrator(spec, b, p, method, rtol, atol, max_steps, w)
    with _Threads(threads):
        stats = leaf.advance(y, t0, dt, fz, cix)
    return np.concatenate([y.reshape(n, w), stats], axis=0)


def _check_autonomous(m: DaskModel) -> None:
    rhs = _client_built(m).rhs
    if any("t" in free_names(rhs.doc.expanded(f.expr)) for f in rhs.doc.fields):
        raise JacError("bad_option",
                       "this model's right-hand side uses t explicitly; the leaf steps cells at different "
                       "times, so pass time-dependent inputs as forcing fields")


@dataclass
class Advanced:
    """Result of :func:`advance`: the new state (the input's kind) and per-cell
    statistics (lazy, the same kind: dask arrays, or DataArrays over the
    cell dimensions): ``status`` (0 ok, else the leaf's status code),
    ``nsteps``, ``naccept``, ``nreject`` and ``t`` (the time each cell's
    state belongs to). A failed cell keeps its last accepted state; the
    other cells of its chunk are untouched by its failure."""

    u: Any
    stats: dict
    chunks: tuple                    # cell chunk sizes
    cell_shape: tuple
    _raw: Any = field(default=None, repr=False)

    def chunk_stats(self, compute=None) -> list:
        """One dict per chunk: cells ``[start, stop)``, summed steps,
        rejections, and the failing cells (flat index, grid index, status)."""
        import dask
        raw = self._raw[self._n:]
        vals = (compute or dask.compute)(raw)[0]
        out, a = [], 0
        for w in self.chunks:
            s = vals[:, a:a + w]
            bad = np.flatnonzero(s[0] != 0)
            out.append({"start": a, "stop": a + w, "steps": int(s[1].sum()), "max_steps": int(s[1].max()),
                        "accepted": int(s[2].sum()), "rejected": int(s[3].sum()),
                        "failures": [{"cell": int(a + i),
                                      "index": tuple(int(x) for x in np.unravel_index(a + i, self.cell_shape)),
                                      "status": int(s[0, i]), "t": float(s[4, i])} for i in bad]})
            a += w
        return out

    _n: int = 0


def advance(source, u, t_span, *, rtol: float = 1e-4, atol=None, method: str = "rodas3", p=None,
            forcing=None, model: str | None = None, max_steps: int = 100000,
            threads: int | None = 1) -> Advanced:
    """The native Rosenbrock leaf per chunk over ``t_span = (t0, t1)`` (the
    operator-split chemistry step of a host model): every cell its own step
    size, so a cell's result does not depend on the chunking. Float64
    (``u`` is converted). ``atol``: None = the leaf's default from the
    document's initial state, a number, or one value per species."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p)
    t0, t1 = checks.time_span(t_span)
    if atol is None:
        at = _default_atol(m.spec.document(), model, m.species)
    else:
        at = np.asarray(atol, dtype=np.float64)
        at = np.full(m.n_species, float(at)) if at.ndim == 0 else at
    if at.shape != (m.n_species,) or not np.all(at > 0) or not np.all(np.isfinite(at)):
        raise JacError("bad_argument", f"atol must be positive: a number or {m.n_species} values")
    rtol = float(rtol)
    if not (rtol > 0 and np.isfinite(rtol)):
        raise JacError("bad_argument", f"rtol must be positive, got {rtol}")
    _check_autonomous(m)
    u64 = inp.u.astype(np.float64)
    arrays = [u64] + ([f] if f is not None else [])
    fn = _advance_block if f is not None else _no_forcing(_advance_block)
    n = m.n_species
    raw = _map(fn, n + len(STAT_ROWS), np.float64, arrays, _delayed_spec(m), pv, t0, t1 - t0, method,
               rtol, at, int(max_steps), threads)
    unew = _out_states(inp, raw[:n], m)
    stats = {k: raw[n + i] for i, k in enumerate(STAT_ROWS)}
    if inp.kind != "dask":
        stats = {k: _out_rows(inp, v[None, :], "_one", [0]).isel(_one=0, drop=True) for k, v in stats.items()}
    res = Advanced(unew, stats, tuple(u64.chunks[1]), tuple(m.spec.cell_shape), raw)
    res._n = n
    return res


# ---------------------------------------------------------------- plugin

@hookimpl
def esmjac_adapter() -> Adapter:
    need = ("dask", "distributed", "xarray")
    missing = [x for x in need if not module_available(x)]
    version = dist_version("dask")
    kinds = {"dask.arrays": model}
    if not missing:
        return Adapter("dask", version, kinds, True,
                       f"dask {version}, distributed {dist_version('distributed')}, "
                       f"xarray {dist_version('xarray')}")
    return Adapter("dask", version, kinds, False,
                   f"{', '.join(missing)} not installed; pip install 'esmjac[dask]'")
