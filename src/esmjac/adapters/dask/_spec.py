"""Spec shipping: what a worker needs to rebuild a model's programs, and the
per-process build, scratch and thread state the block tasks run on.

The client ships a :class:`_Spec` (the model document, resized to a two-cell
template where the kernels allow it, zlib-compressed: a few kB) once per
graph; each worker process builds its programs from it once, under a lock,
and each worker thread keeps its scratch per (spec, role, lanes)."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import threading
import zlib
from collections import Counter, OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import JacError
from ...runtime.programs import JacobianProgram, RhsProgram
from ...runtime.threads import numba_threads, thread_count
from ...runtime.workspace import lane_cells

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


def _scratch(spec: _Spec, what: Hashable, lanes: int, make):
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


def _Threads(n: int | None):
    """Numba on ``n`` threads for the duration of a task (thread-local; None
    or 0: numba's setting is left alone)."""
    return numba_threads(thread_count(n) if n else None)


def _cix(spec: _Spec, start: int, lanes: int) -> np.ndarray | None:
    """The chunk's lane → grid-cell map, or None where the kernels never read
    cell indices (template specs: the workspace's own map then serves)."""
    if spec.template:
        return None
    return lane_cells(spec.cell_shape, lanes, np.arange(start, start + lanes))


def _reads_cells(prog) -> bool:
    """Whether a program's kernels read cell index values (``cix``)."""
    return prog.kernel.reads_cells


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

