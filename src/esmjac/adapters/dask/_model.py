"""The client-side model handle: the spec the workers rebuild from and the
facts the graph needs (names, sizes, defaults), memoised per source."""
from __future__ import annotations

import dataclasses
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import JacError
from ...layouts.types import LaneSparseBlocks
from ...runtime.programs import JacobianProgram, RhsProgram
from .._common import cell_options
from ._spec import (_BUILD_LOCK, _BUILT, _TEMPLATE_CELLS, _Built, _Spec, _built, _cell_sets, _load_doc,
                    _pack, _reads_cells, _resized, _spec_key)

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
    box: bool = False             # a box mechanism: its grid is the data's
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
          options: dict | None = None, per_cell=None, cell_shape: tuple | None = None) -> DaskModel:
    """Prepare ``source`` (an .esm path, JSON text or dict) for chunked
    evaluation over ``cells`` grid cells (default: the document's own).

    A box mechanism (scalar species and parameters, the form chemists
    publish) is a cell program: its grid is the data's, any cell count and
    any ``cell_shape``. ``per_cell`` names the scalar parameters read per
    cell from the data (temperature, photolysis rates...): short names where
    unambiguous (``"T"``), qualified always (``"Chem.T"``); the build option
    ``options={"per_lane": [...]}`` is the same thing.

    Refuses a model that couples cells (``unsupported_construct``): a
    chunk's edge cells would miss their neighbours."""
    if isinstance(source, DaskModel):
        return source
    doc = _load_doc(source)
    opts = cell_options(options, per_cell) or {}
    okey = tuple(sorted((k, v) for k, v in opts.items()))
    try:
        hash(okey)
    except TypeError:
        raise JacError("bad_option", "build options must be plain values (names, numbers, tuples); "
                                     f"got {okey!r}") from None
    raw = _pack(doc)
    shape = tuple(int(x) for x in cell_shape) if cell_shape is not None else None
    memo = (hashlib.sha256(raw).hexdigest(), model, okey, cells, shape)
    with _MODELS_LOCK:
        hit = _MODELS.get(memo)
    if hit is not None:
        return hit
    m = _make_model(doc, model, dict(okey), cells, shape)
    with _MODELS_LOCK:
        _MODELS[memo] = m
    return m


def _make_model(doc: dict, model_name, opts: dict, cells: int | None, cell_shape=None) -> DaskModel:
    sets = _cell_sets(doc, model_name)
    otup = tuple(sorted(opts.items()))
    built: _Built | None = None
    spec: _Spec | None = None
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
        except JacError as exc:
            if exc.code == "bad_option":       # a misspelt per_cell name: say so now
                raise
            spec = None
    if spec is None or built is None:  # not resizable: the workers build the full document
        r2 = RhsProgram.build(doc, model_name, options=opts)
        j2 = JacobianProgram.build(doc, model_name, options=opts)
        full_shape = tuple(r2.layout.cell_shape)
        packed = _pack(doc)
        # A box mechanism is a cell program of any lane count: it is its own template.
        box = bool(r2.layout.box) and r2.kind == j2.kind == "cell" and \
            not (_reads_cells(r2) or _reads_cells(j2))
        spec = _Spec(packed, model_name, otup, full_shape, box, _spec_key(packed, model_name, otup, box))
        built = _Built(r2, j2)
    if built.rhs.kind != "cell" or built.jac.kind != "cell":
        raise JacError("unsupported_construct",
                       "this model couples cells across the grid (a transport stencil: its programs "
                       "have lane kind 'global'), so a chunk's edge cells would miss their neighbours. "
                       "The dask adapter maps cell-local chemistry only: operator-split the model "
                       "(chemistry per cell through esmjac.adapters.dask, transport in the host model) "
                       "or integrate the coupled system in one process with kind 'scipy.ivp' or "
                       "'sundials.cvode'")
    lay = built.rhs.layout
    n_real = int(np.prod(full_shape)) if full_shape else 1
    want = int(cells) if cells is not None else None
    if cell_shape is not None and spec.template:
        if want is not None and int(np.prod(cell_shape)) != want:
            raise JacError("bad_argument", f"cell_shape {cell_shape} does not hold {want} cells")
        want = int(np.prod(cell_shape))
    if want is not None and (want != n_real or (cell_shape is not None and spec.template)):
        if not spec.template:
            raise JacError("bad_argument",
                           f"the document's grid has {n_real} cells; the data has {want}. This model's "
                           "kernels read cell index values, so its grid is the document's; a box "
                           "mechanism or a model whose cells are independent of their index follows "
                           "the data")
        full_shape = tuple(cell_shape) if cell_shape is not None else (want,)
        n_real = want
        spec = _Spec(spec.doc, spec.model, spec.options, full_shape, spec.template,
                     _spec_key(spec.doc, spec.model, spec.options, spec.template))
    with _BUILD_LOCK:
        _BUILT.setdefault(spec.key, built)
    if lay.box:                       # the document's own (scalar) defaults, per forcing field
        f0 = built.rhs.defaults(1)[2]
        fdef = {} if f0 is None else {n: float(v) for n, v in zip(lay.forcing, np.asarray(f0).ravel())}
    else:
        fdef = _forcing_defaults(doc, model_name, lay.forcing)
    lsb = built.plan(_lsb()())
    u0 = np.asarray(built.rhs.u0, dtype=np.float64).reshape(len(lay.states), -1)[:, 0] \
        if built.rhs.u0 is not None else np.zeros(len(lay.states))
    return DaskModel(spec, tuple(lay.states), tuple(lay.forcing), tuple(lay.params),
                     np.array(built.rhs.p0, dtype=np.float64), fdef, n_real,
                     dict(zip(lay.states, u0.tolist())), tuple(tuple(x) for x in lsb.info["lu_pattern"]),
                     "cell", box=bool(lay.box))


def on_grid(m: DaskModel, cell_shape: tuple) -> DaskModel:
    """``m`` on the data's cell grid: a box mechanism or a model whose
    kernels do not read cell indices (a template spec) takes the data's
    shape, the same programs and spec key; any other keeps the document's
    grid, which the data must match."""
    shape = tuple(int(x) for x in cell_shape)
    n = int(np.prod(shape)) if shape else 1
    if tuple(m.spec.cell_shape) == shape:
        return m
    if m.spec.template:
        return dataclasses.replace(m, spec=dataclasses.replace(m.spec, cell_shape=shape), cells=n)
    if n == m.cells:
        return m
    raise JacError("bad_argument",
                   f"the document's grid has {m.cells} cells; the data has {n}. This model's kernels read "
                   "cell index values, so its grid is the document's; a box mechanism or a model whose "
                   "cells are independent of their index follows the data")


def _forcing_defaults(doc: dict, model_name, names) -> dict:
    models = doc.get("models") or {}
    m: dict[str, Any] | None = (models.get(model_name.split(".")[0]) if model_name
                                 else next(iter(models.values()), {}))
    out = {}
    for n in names:
        d = ((m or {}).get("variables") or {}).get(n, {}).get("default")
        if isinstance(d, (int, float)) and not isinstance(d, bool):
            out[n] = float(d)
    return out


