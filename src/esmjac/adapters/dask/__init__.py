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

Modules: ``_spec`` (spec shipping, per-process builds and scratch),
``_xarray`` (marshalling), ``_model`` (the client-side handle), ``_maps``
(RHS, Jacobian, products), ``_advance`` (the leaf per chunk).
"""
from __future__ import annotations

from ...plugins.hookspecs import Adapter, dist_version, hookimpl, module_available
from ._advance import STAT_ROWS, Advanced, advance
from ._maps import apply, apply_transpose, jacobian, rhs
from ._model import DaskModel, model
from ._spec import BUILDS, held_bytes
from ._xarray import CELL_DIM, SLOT_DIM, SPECIES_DIM

__all__ = ["DaskModel", "model", "rhs", "jacobian", "apply", "apply_transpose", "advance", "Advanced",
           "held_bytes", "BUILDS", "STAT_ROWS", "SPECIES_DIM", "SLOT_DIM", "CELL_DIM"]


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
