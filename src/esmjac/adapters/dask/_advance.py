"""The advance path: the native Rosenbrock leaf per chunk of cells (the
operator-split chemistry step), with per-cell statistics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import JacError
from ...layouts.types import LaneSparseBlocks
from ...model.expr import free_names
from ...runtime import checks
from ...integrators.leaf import ATOL_FRACTION, RosenbrockLeaf
from ._maps import _delayed_spec, _map, _no_forcing, _prepare
from ._model import DaskModel, _client_built
from ._spec import _Built, _built, _cix, _scratch, _start, _Threads
from ._xarray import _out_rows, _out_states

#: Per-lane statistics rows appended below the new state by the advance task.
STAT_ROWS = ("status", "nsteps", "naccept", "nreject", "t")


def _default_atol(doc: dict, model_name, species) -> np.ndarray:
    """The leaf's default absolute tolerance (``ATOL_FRACTION`` of each
    species' largest default over the document's cells), from the document
    itself so that every chunk and one process use the same values."""
    models = doc.get("models") or {}
    m: dict[str, Any] | None = (models.get(model_name.split(".")[0]) if model_name
                                 else next(iter(models.values()), {}))
    var = (m or {}).get("variables") or {}
    scale = np.array([float(np.max(np.abs(np.asarray(var.get(s, {}).get("default", 0.0), dtype=np.float64)),
                                  initial=0.0)) for s in species])
    top = float(scale.max()) if scale.size else 1.0
    top = top if top > 0 else 1.0
    return ATOL_FRACTION * np.maximum(scale, 1e-6 * top)


def _box_atol(m: DaskModel) -> np.ndarray:
    """The leaf's default absolute tolerance for a box mechanism: from the
    species' scalar defaults (the document's one cell)."""
    scale = np.abs(np.array([m.u0[s] for s in m.species], dtype=np.float64))
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
    _n: int = field(default=0, repr=False)      # rows of _raw that are states (the stats follow)

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


def advance(source, u, t_span, *, rtol: float = 1e-4, atol=None, method: str = "rodas3", p=None,
            forcing=None, model: str | None = None, max_steps: int = 100000,
            threads: int | None = 1, per_cell=None, options: dict | None = None) -> Advanced:
    """The native Rosenbrock leaf per chunk over ``t_span = (t0, t1)`` (the
    operator-split chemistry step of a host model): every cell its own step
    size, so a cell's result does not depend on the chunking. Float64
    (``u`` is converted). ``atol``: None = the leaf's default from the
    document's initial state, a number, or one value per species.
    ``per_cell``/``options``: as for :func:`rhs` (per-cell temperature,
    photolysis rates... from ``forcing`` or the Dataset)."""
    m, inp, f, pv = _prepare(source, u, model, forcing, p, options, per_cell)
    t0, t1 = checks.time_span(t_span)
    if atol is None:
        at = _box_atol(m) if m.box else _default_atol(m.spec.document(), model, m.species)
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
    return Advanced(unew, stats, tuple(u64.chunks[1]), tuple(m.spec.cell_shape), raw, n)


