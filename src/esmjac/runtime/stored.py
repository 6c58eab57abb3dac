"""Cached programs: what a build stores, and how a stored one is checked
and brought back without its expression DAG.

A program is stored as two verified entries (compile/cache.py: JSON + npz,
hashes beside, never a pickle):

* the **core** under the build key: the program's plain fields (layout,
  defaults, kind, column space, fingerprint), the kernel's metadata, the
  tapes' arrays (tape engine) and one *head* per field (name, row, column,
  box): everything a call, a plan or a workspace reads;
* the **expressions** under a key derived from it: the evaluation document
  and the bands (hash-consed DAG nodes), read and hash-checked with the core
  but decoded only when something asks for them (``contract``, a merged
  plan's fused tape, ``esmjac kernel``), through :class:`LazyDoc` and
  :class:`LazyBands`.

Nothing read back is trusted beyond its hash: a stored tape is checked
instruction by instruction against the program's own sizes
(:func:`compile.tape.check_tape`: opcodes, registers, every operand) before
run_tape, compiled without bounds checks, ever sees it; the kernel key is
recomputed from the tapes; defaults must have the layout's sizes; index
arrays (``meta``, the lane map) are recomputed from the heads, never read.
Anything that fails is a logged cache miss, the entry removed and the
program rebuilt. Generated Numba source is never stored (it would be code
from disk): codegen programs regenerate it from the decoded document.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging

import numpy as np

from .._frozen import FrozenMap
from ..compile.cache import (cache_dir, discard_product, document_key, grid_free_key, load_product,
                             read_product, store_product)
from ..compile.engine import compile_doc, tape_kernel
from ..compile.tape import TapeBounds, check_tape
from ..layouts.plans import field_meta
from ..model.layout import ModelLayout, column_space, layout_fingerprint
from .workspace import lane_cells

__all__ = ["build_key", "cached_build", "fingerprint", "heads_of", "LazyDoc", "LazyBands", "band_rows"]

log = logging.getLogger("esmjac.cache")


def _extra(kind: str, model, wrt, opts: dict) -> tuple:
    """Every option that changes the product (``cache`` and ``progress`` do not)."""
    return (kind, str(model), str(wrt), str(opts["max_stmts"]), str(opts["allow_empty"]),
            str(opts["engine"]), str(opts["tape_above"]), str(tuple(opts["per_lane"])))


def build_key(kind: str, source, model, wrt, opts: dict) -> tuple | None:
    """``(content key, dependency list)`` under which a build of ``source``
    with ``opts`` (checked program options) is stored: the grid-free key
    (:func:`compile.cache.grid_free_key`) when an entry is stored under it,
    else the document's own key; None when the source cannot be keyed."""
    extra = _extra(kind, model, wrt, opts)
    grid = grid_free_key(source, *extra)
    if grid is not None and (cache_dir() / f"b{grid[0][:40]}.json").exists():
        return grid[0], grid[1]
    return document_key(source, *extra)


def _expr_key(key: str) -> str:
    return hashlib.sha256((key + ":expressions").encode()).hexdigest()


# ------------------------------------------------------------------ heads and fingerprints

def heads_of(doc) -> tuple:
    """One plain head per field: (name, row, column, dims, pins) — what
    plans and the index arrays read of a field, without its expression."""
    return tuple((f.name, f.row, f.col, tuple(tuple(d) for d in f.dims), tuple(f.pins)) for f in doc.fields)


def fingerprint(kernel_key: str, layout_fp: str, kind: str, wrt, heads: tuple) -> str:
    """Identity of a Jacobian program's plans and workspaces: its kernel's
    content hash (every value it computes), the layout and the field heads
    (every index array is a function of these)."""
    s = json.dumps([kernel_key, layout_fp, kind, wrt, [list(map(_plain, h)) for h in heads]])
    return hashlib.sha256(s.encode()).hexdigest()


def _plain(x):
    return [_plain(v) for v in x] if isinstance(x, tuple) else x


class _Heads:
    """A document as far as :func:`field_meta` reads a cell program's."""

    def __init__(self, kind: str, heads: tuple):
        from ..compile.evaldoc import Field
        self.kind = kind
        self.fields = tuple(Field(n, r, c, d, p, (), None) for n, r, c, d, p in heads)


# ------------------------------------------------------------------ lazy expressions

class LazyDoc:
    """The evaluation document of a cached program, decoded on first use
    (attribute access passes through to it); ``kind`` and ``n_fields`` are
    known without decoding. Pickles as the decoded document."""

    def __init__(self, stored, kind: str, n_fields: int):
        self._stored, self.kind, self.n_fields = stored, kind, int(n_fields)

    def _get(self):
        return self._stored.get()[0]

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_stored",):
            raise AttributeError(name)
        return getattr(self._get(), name)

    def __reduce__(self):
        return (_same, (self._get(),))


class LazyBands:
    """The bands (``JacEntry`` tuple) of a cached program, decoded on first use."""

    def __init__(self, stored, n: int, rows: tuple | None = None):
        self._stored, self._n = stored, int(n)
        #: The bands' row variables (distinct, sorted), known without
        #: decoding (stored with the core): what a plan's source check reads.
        self.rows = rows

    def _get(self) -> tuple:
        return self._stored.get()[1]

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return iter(self._get())

    def __getitem__(self, i):
        return self._get()[i]

    def __eq__(self, other) -> bool:     # (so unhashable: Python sets __hash__ = None)
        return self._get() == tuple(other)

    def __reduce__(self):
        return (_same, (self._get(),))


def _same(x):
    return x


def band_rows(bands) -> tuple:
    """The distinct row variables of ``bands`` (sorted), from a
    :class:`LazyBands` without decoding it."""
    rows = getattr(bands, "rows", None)
    return rows if rows is not None else tuple(sorted({en.row for en in bands}))


# ------------------------------------------------------------------ store and load

#: Fields never written into a stored core: the expressions (their own
#: entry), generated code, and everything recomputed from the heads.
_SKIP = {"Kernel": ("source", "prologue_source", "tapes"), "JacobianProgram": ("meta", "doc", "bands"),
         "RhsProgram": ("doc", "default_cix")}


def cached_build(kind: str, source, model, wrt, opts: dict, make, types: dict):
    """``make()`` through the on-disk cache (see the module docstring): a
    stored program checked and revived, else built and stored. A cell
    program over a document's one index set is stored under the grid-free
    key: the same model at any cell count loads that one entry, resized
    (:func:`_resize`)."""
    if not opts["cache"]:
        return make()
    extra = _extra(kind, model, wrt, opts)
    grid = grid_free_key(source, *extra)
    if grid is not None:
        prog = _load(grid[0], types, opts, cells=grid[3])
        if prog is not None:
            return prog
    keyed = document_key(source, *extra)
    if keyed is not None:
        prog = _load(keyed[0], types, opts)
        if prog is not None:
            return prog
    prog = make()
    if grid is not None and _grid_free(prog, grid[3]):
        _store((grid[0], grid[1]), prog, types, cells=grid[3])
    elif keyed is not None:
        _store(keyed, prog, types)
    return prog


def _grid_free(prog, n: int) -> bool:
    """Whether ``prog`` (built at ``n`` cells) is the same program at every
    cell count up to relabelling: a cell program whose every field, band
    and array variable spans exactly the ``n`` cells, with defaults equal
    in every cell (so they broadcast)."""
    lay = prog.layout
    if prog.kind != "cell" or lay.box or tuple(lay.cell_shape) != (n,):
        return False
    if any(tuple(v) not in ((), (n,)) for v in lay.shapes.values()):
        return False
    if any(len(f.dims) != 1 or tuple(f.dims[0][1:]) != (1, n) for f in prog.doc.fields):
        return False
    for en in getattr(prog, "bands", ()):
        if tuple(en.band.rows) != ((1, n),) or en.band.contracted:
            return False
    for x, k in ((prog.u0, len(lay.states)), (prog.forcing0, len(lay.forcing))):
        if x is not None and k:
            m = x.reshape(k, n)
            if not np.array_equal(m, np.repeat(m[:, :1], n, axis=1), equal_nan=True):
                return False
    return True


def _store(keyed: tuple, prog, types: dict, cells: int | None = None) -> None:
    key, deps = keyed
    kern = prog.kernel
    tapes = None
    if kern.engine == "tape":
        pro, body = kern.tapes
        tapes = [pro.code, pro.consts, int(pro.nreg), body.code, body.consts, int(body.nreg)]
    bands = tuple(prog.bands) if hasattr(prog, "bands") else ()
    if not store_product(_expr_key(key), (prog.doc, bands), [], types):
        return
    core = {"program": prog, "heads": heads_of(prog.doc), "tapes": tapes, "n_bands": len(bands),
            "rows": band_rows(bands), "cells": cells}
    store_product(key, core, deps, types, _SKIP)


def _load(key: str, types: dict, opts: dict, cells: int | None = None):
    core = load_product(key, types)
    if core is None:
        return None
    try:
        expr = read_product(_expr_key(key), types)
        if expr is None:
            raise ValueError("its expression entry is missing or corrupt")
        if (cells is None) != (core.get("cells") is None):
            raise ValueError("a grid-free entry under a document key, or the reverse")
        if cells is not None and cells != core["cells"]:
            core, expr = _resize(core, expr, core["cells"], cells)
        return _revive(core, expr, types, opts)
    except Exception as exc:        # a product that does not check out is a miss
        log.warning("esmjac cache: stored build b%s refused (%s: %s); rebuilding", key[:40],
                    type(exc).__name__, exc)
        discard_product(key)
        discard_product(_expr_key(key))
        return None


# ------------------------------------------------------------------ one entry, any cell count

def _resize_layout(lay: ModelLayout, n0: int, n: int) -> ModelLayout:
    shapes = FrozenMap({k: ((n,) if tuple(v) == (n0,) else tuple(v)) for k, v in lay.shapes.items()})
    return dataclasses.replace(lay, shapes=shapes, cell_shape=(n,))


def _resize_dims(dims: tuple, n: int) -> tuple:
    (name, lo, _), = dims
    return ((name, lo, n),)


class _Resized:
    """The expressions of an entry stored at ``n0`` cells, as ``n`` cells
    see them (decoded, then relabelled, on first use)."""

    def __init__(self, stored, lay: ModelLayout, n: int):
        self._stored, self._lay, self._n = stored, lay, n
        self._value: list = []

    def get(self) -> tuple:
        if not self._value:
            doc, bands = self._stored.get()
            n = self._n
            fields = tuple(dataclasses.replace(f, dims=_resize_dims(f.dims, n)) for f in doc.fields)
            doc = dataclasses.replace(doc, layout=self._lay, fields=fields)
            bands = tuple(dataclasses.replace(en, band=en.band.with_rows(((1, n),))) for en in bands)
            self._value.append((doc, bands))
        return self._value[0]


def _resize(core: dict, expr, n0: int, n: int) -> tuple:
    """(core, expressions) of a grid-free entry stored at ``n0`` cells,
    relabelled for ``n`` (the checks of :func:`_revive` then run on the
    result: the sizes below are what they compare against)."""
    if isinstance(n0, bool) or not isinstance(n0, int) or n0 < 1:
        raise ValueError("bad stored cell count")
    prog = core["program"]
    if not hasattr(prog, "layout") or not hasattr(prog, "kernel"):
        raise ValueError("not a program")
    lay0 = prog.layout
    if not isinstance(lay0, ModelLayout) or tuple(lay0.cell_shape) != (n0,):
        raise ValueError("a grid-free entry that is not over its cells")
    lay = _resize_layout(lay0, n0, n)

    def spread(x, k):
        if x is None or not k:
            return x
        if not isinstance(x, np.ndarray) or x.shape != (k * n0,):
            raise ValueError("stored defaults do not have the layout's size")
        return np.ascontiguousarray(np.repeat(x.reshape(k, n0)[:, :1], n, axis=1).ravel())

    changes = dict(layout=lay, u0=spread(prog.u0, len(lay0.states)),
                   forcing0=spread(prog.forcing0, len(lay0.forcing)))
    heads = tuple((h[0], h[1], h[2], _resize_dims(tuple(tuple(d) for d in h[3]), n), tuple(h[4]))
                  for h in core["heads"])
    lfp = layout_fingerprint(lay, prog.kind)
    if hasattr(prog, "fingerprint"):
        changes["col_vars"], changes["col_base"], changes["n_cols"] = column_space(lay, prog.wrt)
        changes["layout_fingerprint"] = lfp
        changes["fingerprint"] = fingerprint(prog.kernel.key, lfp, prog.kind, prog.wrt, heads)
    else:
        changes["layout_fingerprint"] = lfp
        changes["owner"] = ""            # recomputed by the constructor
    prog = dataclasses.replace(prog, **changes)
    return {**core, "program": prog, "heads": heads, "cells": n}, _Resized(expr, lay, n)


def _size_ok(x, n: int, name: str) -> None:
    if x is None:
        return
    if not isinstance(x, np.ndarray) or x.dtype.kind != "f" or x.shape != (n,):
        raise ValueError(f"stored {name} does not have the layout's size {n}")


def _revive(core: dict, expr, types: dict, opts: dict):
    """The program of a decoded core (constructor-built, so frozen like a
    fresh one) once every check of the module docstring passed."""
    jac_t, rhs_t = types["JacobianProgram"], types["RhsProgram"]
    if not isinstance(core, dict) or set(core) != {"program", "heads", "tapes", "n_bands", "rows", "cells"}:
        raise ValueError("not a stored program")
    prog = core["program"]
    if not isinstance(prog, (jac_t, rhs_t)) or not isinstance(prog.layout, ModelLayout):
        raise ValueError("not a program")
    lay = dataclasses.replace(prog.layout)        # through __post_init__: frozen shapes
    heads = tuple(tuple(h) for h in core["heads"])
    for h in heads:
        if len(h) != 5 or not all(isinstance(x, str) for x in h[:2]) or not isinstance(h[2], (str, type(None))):
            raise ValueError("bad field head")
    stored = prog.kernel
    kind = prog.kind
    if kind not in ("cell", "global"):
        raise ValueError("bad program kind")
    is_jac = isinstance(prog, jac_t)
    if stored.engine == "tape":
        if kind != "cell" or core["tapes"] is None:
            raise ValueError("a tape kernel of a non-cell program")
        pc, pk, pn, bc, bk, bn = core["tapes"]
        nh = stored.n_hoist
        if isinstance(nh, bool) or not isinstance(nh, int) or not 0 <= nh <= 1 << 24:
            raise ValueError("bad hoisted-value count")
        bounds = functools.partial(TapeBounds, n_hoist=nh, n_params=len(lay.params), n_states=len(lay.states),
                                   n_forcing=len(lay.forcing), n_cix=len(lay.cell_shape))
        pro = check_tape(pc, pk, pn, bounds(stores=0, prologue=True))
        body = check_tape(bc, bk, bn, bounds(stores=len(heads) if is_jac else len(lay.states)))
        kern = tape_kernel(pro, body, nh)
        if kern.key != stored.key:
            raise ValueError("the stored tapes do not match the stored kernel key")
        doc = LazyDoc(expr, kind, len(heads))
        rows = core["rows"]
        if not isinstance(rows, tuple) or not all(isinstance(r, str) for r in rows):
            raise ValueError("bad band rows")
        bands = LazyBands(expr, core["n_bands"], rows)
    else:
        doc, bands = expr.get()
        kern = compile_doc(doc, {**opts, "engine": stored.engine})
        if kern.key != stored.key:
            raise ValueError("the regenerated kernel differs from the stored one")
        if heads_of(doc) != heads:
            raise ValueError("the stored heads differ from the document")
    cells = int(np.prod(lay.cell_shape)) if kind == "cell" and lay.cell_shape else 1
    n_u = len(lay.states) * cells if kind == "cell" else lay.n_state_elements
    n_f = len(lay.forcing) * cells if kind == "cell" else lay.n_forcing_elements
    _size_ok(prog.u0, n_u, "u0")
    _size_ok(prog.p0, len(lay.params), "p0")
    _size_ok(prog.forcing0, n_f, "forcing0")
    if is_jac:
        cvars, cbase, ncols = column_space(lay, prog.wrt)
        if (tuple(prog.col_vars), dict(prog.col_base.items()), prog.n_cols) != (cvars, dict(cbase.items()), ncols):
            raise ValueError("stored column space differs from the layout's")
        src = _Heads(kind, heads) if isinstance(doc, LazyDoc) else doc
        meta = field_meta(src, lay, cvars, cbase)
        fp = fingerprint(kern.key, prog.layout_fingerprint, kind, prog.wrt, heads)
        if fp != prog.fingerprint:
            raise ValueError("fingerprint mismatch")
        return dataclasses.replace(prog, doc=doc, bands=bands, kernel=kern, layout=lay, meta=meta,
                                   col_vars=cvars, col_base=cbase)
    cix = lane_cells(lay.cell_shape, cells) if kind == "cell" else np.zeros(1, np.int64)
    return dataclasses.replace(prog, doc=doc, kernel=kern, layout=lay, default_cix=cix)
