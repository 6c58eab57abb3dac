"""Chunk-mapped evaluations: the block tasks (RHS, Jacobian, products) and
the public functions that build their graphs."""
from __future__ import annotations

import numpy as np

from ...errors import JacError
from ...layouts.types import LaneSparseBlocks, untile
from ._model import DaskModel, _lsb, model, on_grid
from ._spec import _built, _cix, _flat, _jac_ws, _scratch, _start, _Threads
from ._xarray import SLOT_DIM, _forcing, _out_rows, _out_states, _short, _state, _to_model_name

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


def _p(m: DaskModel, p) -> np.ndarray:
    if p is None:
        return m.p0
    if isinstance(p, dict):                    # {name: value}, short or qualified names
        out = np.array(m.p0, dtype=np.float64)
        for k, v in p.items():
            n = _to_model_name(str(k), m.param_names)
            if n is None:
                hint = " (a per-cell field: pass it in forcing= or as a Dataset variable)" \
                    if _to_model_name(str(k), m.forcing_names) else ""
                raise JacError("bad_argument", f"`p`: {k!r} is not a scalar parameter{hint}; this model's "
                                               f"are {[_short(x) for x in m.param_names]}")
            out[m.param_names.index(n)] = float(v)
        return out
    a = np.ascontiguousarray(np.asarray(p, dtype=np.float64))
    if a.shape != (len(m.param_names),):
        raise JacError("bad_argument", f"`p` must have {len(m.param_names)} entries {list(m.param_names)} "
                                       "(or be a dict of the ones to change)")
    return a


def _prepare(source, u, model_name, forcing, p, options=None, per_cell=None):
    """The model on the data's grid, the state, its forcing and ``p``."""
    m = model(source, model_name, options=options, per_cell=per_cell)
    if isinstance(source, DaskModel) and (options is not None or per_cell is not None):
        raise JacError("bad_option", "options/per_cell are given when the model is built "
                                     "(esmjac.adapters.dask.model(...)), not with a DaskModel")
    inp = _state(m, u)
    m = on_grid(m, inp.cell_shape)
    return m, inp, _forcing(m, forcing, inp), _p(m, p)


def _delayed_spec(m: DaskModel):
    import dask
    return dask.delayed(m.spec, pure=True, name=f"esmjac-spec-{m.spec.key[:16]}")


def _map(fn, rows: int, dtype, arrays, *args, **kw):
    import dask.array as da
    u = arrays[0]
    return da.map_blocks(fn, *arrays, *args, chunks=((rows,), u.chunks[1]), dtype=dtype,
                         meta=np.empty((0, 0), dtype=dtype), **kw)


# ---------------------------------------------------------------- public functions

def rhs(source, u, *, p=None, t: float = 0.0, forcing=None, model: str | None = None,
        threads: int | None = 1, per_cell=None, options: dict | None = None):
    """``du/dt`` per chunk: a dask array ``(n_species, cells)`` (or the input's xarray kind).

    ``source``: an .esm path, JSON text, a dict or a :class:`DaskModel`; a box
    mechanism takes its grid from ``u``. ``per_cell``: scalar parameters read
    per cell from ``forcing`` or the Dataset's variables of the same names
    (short or qualified; the build option ``options={"per_lane": [...]}``
    is the same)."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p, options, per_cell)
    arrays = [inp.u] + ([f] if f is not None else [])
    fn = _rhs_block if f is not None else _no_forcing(_rhs_block)
    out = _map(fn, m.n_species, inp.u.dtype, arrays, _delayed_spec(m), pv, float(t), threads)
    return _out_states(inp, out, m)


def jacobian(source, u, *, layout=None, p=None, t: float = 0.0, forcing=None,
             model: str | None = None, threads: int | None = 1, per_cell=None, options: dict | None = None):
    """∂f/∂u per chunk, exactly what ``eval_into`` writes for the chunk's
    lanes laid out slot × lane: a dask array ``(slots, cells)``; for xarray
    input a DataArray ``(slot, *cell_dims)`` with ``"row,col"`` slot labels."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p, options, per_cell)
    layout = layout if layout is not None else _lsb()()
    k = m.slots(layout)
    arrays = [inp.u] + ([f] if f is not None else [])
    fn = _jac_block if f is not None else _no_forcing(_jac_block)
    out = _map(fn, k, inp.u.dtype, arrays, _delayed_spec(m), layout, pv, float(t), threads)
    return _out_rows(inp, out, SLOT_DIM, m.slot_labels(layout) if inp.kind != "dask" else None)


def apply(source, u, v, *, p=None, t: float = 0.0, forcing=None, model: str | None = None,
          threads: int | None = 1, per_cell=None, options: dict | None = None):
    """``J(u)·v`` per chunk (``v`` shaped and chunked like ``u``)."""
    return _products(source, u, v, p, t, forcing, model, threads, False, options, per_cell)


def apply_transpose(source, u, lam, *, p=None, t: float = 0.0, forcing=None,
                    model: str | None = None, threads: int | None = 1, per_cell=None,
                    options: dict | None = None):
    """``J(u)ᵀ·λ`` per chunk, accumulated in float64 (as ``apply_transpose``)."""
    return _products(source, u, lam, p, t, forcing, model, threads, True, options, per_cell)


def _products(source, u, v, p, t, forcing, model_name, threads, transpose, options, per_cell):
    m, inp, f, pv = _prepare(source, u, model_name, forcing, p, options, per_cell)
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


