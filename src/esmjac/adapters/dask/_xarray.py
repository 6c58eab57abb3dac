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
    names: tuple = ()              # the Dataset's variable name of each species (short or qualified)

    @property
    def cell_shape(self) -> tuple:
        if self.kind == "dask":
            return (int(self.u.shape[1]),)
        return tuple(int(self.template.sizes[d]) for d in self.cell_dims)


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _lookup(name: str, keys, model_names) -> str | None:
    """The key of ``keys`` that holds model variable ``name``: the qualified
    name itself, or its short name (``BoxNOx.T`` → ``T``) where no other of
    ``model_names`` has the same short name (then the qualified name is needed)."""
    if name in keys:
        return name
    short = _short(name)
    if short != name and short in keys:
        if sum(_short(n) == short for n in model_names) > 1:
            raise JacError("bad_argument", f"{short!r} is ambiguous here (it could be any of "
                                           f"{[n for n in model_names if _short(n) == short]}): "
                                           "name the variable by its qualified name")
        return short
    return None


def _to_model_name(key: str, model_names) -> str | None:
    """The model variable a user's key (qualified or short) names, or None."""
    if key in model_names:
        return key
    hits = [n for n in model_names if _short(n) == key]
    if len(hits) > 1:
        raise JacError("bad_argument", f"{key!r} is ambiguous (it could be any of {hits}): "
                                       "use the qualified name")
    return hits[0] if hits else None


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
    names: tuple = ()
    if isinstance(u, xr.Dataset):
        keys = list(u.data_vars)
        found = [_lookup(s, keys, m.species) for s in m.species]
        missing = [s for s, k in zip(m.species, found) if k is None]
        if missing:
            raise JacError("bad_argument", f"the Dataset lacks species {[_short(s) for s in missing]}; it "
                                           f"needs one variable per species {[_short(s) for s in m.species]} "
                                           "(short or qualified names)")
        names = tuple(found)
        dims = u[names[0]].dims
        for s, k in zip(m.species, names):
            if u[k].dims != dims:
                raise JacError("bad_argument", f"species {k!r} has dims {u[k].dims}; expected {dims}")
        da_ = xr.concat([u[k] for k in names], dim=SPECIES_DIM)
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
    return _Input(_as_dask(_dask_data(st), "u"), kind, u, tuple(dims), st, names)


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
    if inp.kind == "dataset" and (forcing is None or isinstance(forcing, dict)):
        _refuse_scalar_fields(m, inp, inp.template)
    elif inp.kind == "dataset" and _is_dataset(forcing):
        _refuse_scalar_fields(m, inp, forcing)
    if not m.forcing_names:
        if forcing is not None and not (inp.kind == "dataset" and forcing is inp.template):
            named = [k for k in (forcing if isinstance(forcing, dict) else ())
                     if _to_model_name(str(k), m.param_names)]
            hint = (f" ({', '.join(map(repr, named))}: scalar parameter(s); declare them per cell with "
                    "per_cell=[...] to give one value per cell)") if named else ""
            raise JacError("bad_argument", f"this model has no forcing fields; pass forcing=None{hint}")
        return None
    rows = []
    src = forcing
    if isinstance(src, dict):
        given = {}
        for k in src:
            n = _to_model_name(str(k), m.forcing_names)
            if n is None:
                hint = (" (a scalar parameter: declare it per cell with per_cell=[...] to give it one "
                        "value per cell, or pass it in p=)") if _to_model_name(str(k), m.param_names) else ""
                raise JacError("bad_argument", f"unknown forcing field {k!r}{hint}; this model's are "
                                               f"{[_short(x) for x in m.forcing_names]}")
            given[n] = src[k]
        src = given
    elif src is not None and not isinstance(src, (np.ndarray, da.Array)) and \
            not (type(src).__module__.split(".")[0] == "xarray" and hasattr(src, "data_vars")):
        raise JacError("bad_argument", "forcing is a dict of per-cell fields (name → one value per cell), "
                                       "an xarray Dataset, or an array (n_forcing, cells); got "
                                       f"{type(src).__name__}")
    tables = []                                # xarray Datasets to read fields from, in order
    if _is_dataset(src):
        tables.append(src)
    if inp.kind == "dataset" and (src is None or isinstance(src, dict)):
        tables.append(inp.template)            # per-cell fields inside the state Dataset
    for n in m.forcing_names:
        x = src.get(n) if isinstance(src, dict) else None
        for tab in tables:
            if x is None:
                k = _lookup(n, list(tab.data_vars), m.forcing_names)
                x = tab[k] if k is not None else None
        if x is None:
            if isinstance(src, (np.ndarray, da.Array)):
                break
            if n not in m.forcing_defaults:
                raise JacError("bad_argument", f"forcing field {_short(n)!r} is required (no scalar default): "
                                               "pass it in forcing= or as a Dataset variable")
            rows.append(da.full((1, u.shape[1]), m.forcing_defaults[n], dtype=u.dtype, chunks=(1, u.chunks[1])))
            continue
        if type(x).__module__.split(".")[0] == "xarray":
            if inp.kind == "dask":
                raise JacError("bad_argument", "pass forcing as dask arrays when the state is a dask array")
            extra = [d for d in x.dims if d not in inp.cell_dims]
            if extra:
                raise JacError("bad_argument", f"forcing {_short(n)!r} has dims {x.dims}; the cells are "
                                               f"{inp.cell_dims} (a per-cell field may span fewer of them)")
            if set(x.dims) != set(inp.cell_dims):      # e.g. temperature by latitude only: broadcast
                import xarray as xr
                x = xr.broadcast(x, inp.template[inp.names[0]] if inp.names else
                                 inp.template.isel({SPECIES_DIM: 0}, drop=True))[0]
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


def _is_dataset(x) -> bool:
    return type(x).__module__.split(".")[0] == "xarray" and hasattr(x, "data_vars")


def _refuse_scalar_fields(m: DaskModel, inp: _Input, table) -> None:
    """A Dataset variable over the cells that names a scalar parameter would
    be silently ignored (the model reads one number for all cells): refused,
    with the way to read it per cell."""
    cells = set(inp.cell_dims)
    for k in table.data_vars:
        n = _to_model_name(str(k), m.param_names)
        if n is not None and cells & set(table[k].dims):
            raise JacError("bad_argument",
                           f"the Dataset's variable {k!r} varies over the cells, but {n} is a scalar "
                           f"parameter of the model (one value for all cells): declare it per cell "
                           f"(per_cell=[{_short(n)!r}, ...]) to read it from the Dataset, or drop it")


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
    names = inp.names or m.species
    return xr.Dataset({s: x.isel({SPECIES_DIM: i}, drop=True) for i, s in enumerate(names)},
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


