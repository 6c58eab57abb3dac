"""Xarray and dask marshalling: a state (dask array, Dataset, DataArray) and
its forcing as dask arrays ``(rows, cells)`` chunked along cells, and the
results given back in the input's kind (cell dimensions unstacked)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import JacError

if TYPE_CHECKING:
    from ._model import DaskModel

#: Dimension names of the DataArray forms.
SPECIES_DIM = "species"
SLOT_DIM = "slot"
#: Name of the stacked lane axis while an xarray input is being evaluated.
CELL_DIM = "_esmjac_cell"


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


