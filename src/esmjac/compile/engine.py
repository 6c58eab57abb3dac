"""Engine choice: one evaluation document → one runnable :class:`Kernel`.

Two engines evaluate a document: ``codegen`` (generated Numba source,
imported from the on-disk cache by content hash) and ``tape`` (a compact
instruction tape run by one interpreter compiled once for every model).
``auto`` decides at build time, by size: generated chunks compile in about
5 s per 400 statements, the tape interpreter not at all, so large cell
programs are taped. The decision is stored in the kernel; calls never
re-decide.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import JacError
from ..model.deep import run_deep
from ..model.expr import Node, iter_children
from .cache import kernel_key, load_source, recover_numba_cache
from .codegen import generate, tape_program, tile_scratch
from .tape import retarget, run_tape

__all__ = ["Kernel", "FusedTape", "compile_doc", "fused_tape", "tape_kernel", "tape_key", "ENGINE_OPTIONS"]

_NO_SLOTS = np.zeros(0, np.int64)       # run_tape's zero-slot list when it writes no tiles
_NO_SLOTS.setflags(write=False)

#: Compiler options (a subset of the programs' build options).
ENGINE_OPTIONS = {
    "max_stmts": 400,         # statement cap per compiled chunk
    "engine": "auto",         # "codegen" | "tape" | "auto" (tape for large cell programs)
    "tape_above": 1500,       # auto: statements above which a cell program is taped
}


@dataclass(frozen=True, eq=False)
class Kernel:
    """Generated source (or tapes) of one document; the imported module is
    memoized on the instance on first use (no cache lookup or environment
    read per call; dropped when pickled, re-imported after)."""

    source: str
    key: str
    chunks: tuple
    chunk_kinds: tuple
    n_hoist: int
    n_statements: int
    engine: str = "codegen"
    tapes: tuple = ()          # (prologue tape, body tape) for engine "tape"
    counts_nonfinite: bool = False   # cell chunks return the non-finite values they stored
    tile_scratch: int = 0      # tiled chunks: scratch elements per work item (codegen.tile_scratch)
    tile_scratch_width: int = 0   # ... and their tile width W

    def module(self):
        if self.engine == "tape":
            return None
        mod = self.__dict__.get("_module")
        if mod is None:
            mod = load_source(self.source, self.key)
            object.__setattr__(self, "_module", mod)     # a memo, not a field: frozen stays frozen
        return mod

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_module", None)                       # modules do not pickle; re-imported on use
        return state

    def listing(self) -> str:
        """Readable generated source or tape."""
        if self.engine == "tape":
            pro, body = self.tapes
            return (f"# esmjac tape: prologue {len(pro.code)} instructions, body {len(body.code)} "
                    f"instructions, {body.nreg} registers\n# prologue\n{pro.listing()}\n# body\n"
                    f"{body.listing()}\n")
        return self.source

    def run(self, u, p, t, forcing, out, h, cix, lanes: int, serial: bool) -> int | None:
        """Evaluate into ``out`` (arguments already checked by the caller);
        ``serial`` picks the one-thread twins of the generated chunks. The
        number of non-finite values stored when the chunks count them (cell
        chunks), else None (the caller scans ``out``)."""
        return _recovering(self._run_once, out, u, p, t, forcing, out, h, cix, lanes, serial)

    def run_fused(self, u, p, t, forcing, out, h, cix, lanes: int, serial: bool) -> int | None:
        """Run a plan-specific fused kernel (chunks write layout slots); the
        number of non-finite values stored when the chunks count them, else
        None. Tiled chunks get a fresh scratch (:func:`codegen.tile_scratch`;
        bound calls preallocate theirs)."""
        return _recovering(self._run_fused_once, out, u, p, t, forcing, out, h, cix, lanes, serial)

    def _run_once(self, u, p, t, forcing, out, h, cix, lanes: int, serial: bool) -> int | None:
        if self.engine == "tape":
            pro, body = self.tapes
            run_tape(pro.code, pro.consts, u, forcing, p, float(t), h, cix, h, 1, pro.nreg, 0, 0, 1, _NO_SLOTS)
            return run_tape(body.code, body.consts, u, forcing, p, float(t), h, cix, out, lanes, body.nreg,
                            0, 0, lanes, _NO_SLOTS)      # the tape counts the non-finite values it stores
        mod = self.module()
        mod.prologue(p, float(t), h)
        pre = "s" if serial else ""
        bad = 0
        for name, kind in zip(self.chunks, self.chunk_kinds):
            fn = getattr(mod, pre + name)
            if kind == "cell":
                bad += fn(u, forcing, h, cix, out, lanes) or 0
            else:
                fn(u, forcing, h, out)
        return bad if self.counts_nonfinite else None

    def _run_fused_once(self, u, p, t, forcing, out, h, cix, lanes: int, serial: bool) -> int | None:
        mod = self.module()
        if h.shape[0] < self.n_hoist:
            h = np.zeros(self.n_hoist)
        mod.prologue(p, float(t), h)
        pre = "sfl" if serial else "fl"
        bad = 0
        extra = ()
        if self.tile_scratch:
            W = self.tile_scratch_width
            extra = (np.empty(tile_scratch(self.tile_scratch, lanes, W), u.dtype),)
        for name in self.chunks:
            bad += getattr(mod, pre + name)(u, forcing, h, cix, out, lanes, *extra) or 0
        return bad if self.counts_nonfinite else None


@dataclass(frozen=True, eq=False)
class FusedTape:
    """The tape engine's direct-write body for a tiled plan: slot stores
    (``prologue``, ``body``) and the slots no band reaches (``zero_slots``,
    read-only)."""

    prologue: object
    body: object
    zero_slots: np.ndarray

    def run(self, u, p, t, forcing, out, h, cix, lanes: int, tile: int, slots_per_lane: int,
            capacity: int) -> int:
        """Evaluate straight into ``out``'s tile slots (arguments checked by
        the caller); the number of non-finite values stored."""
        return _recovering(self._run_once, out, u, p, t, forcing, out, h, cix, lanes, tile, slots_per_lane,
                           capacity)

    def _run_once(self, u, p, t, forcing, out, h, cix, lanes, tile, slots_per_lane, capacity) -> int:
        pro, body = self.prologue, self.body
        run_tape(pro.code, pro.consts, u, forcing, p, float(t), h, cix, h, 1, pro.nreg, 0, 0, 1, _NO_SLOTS)
        return run_tape(body.code, body.consts, u, forcing, p, float(t), h, cix, out, lanes, body.nreg,
                 tile, slots_per_lane, capacity, self.zero_slots)


def fused_tape(doc, dest_slots, zero_slots, kernel: "Kernel | None" = None) -> FusedTape:
    """The :class:`FusedTape` of ``doc`` storing field ``i`` into slot
    ``dest_slots[i]``; ``zero_slots`` are zeroed. With the program's tape
    ``kernel`` and one slot per field (every lane plan but a merged one),
    its body retargeted (:func:`tape.retarget`: the same instructions, no
    expression document needed: a program loaded from the cache never
    decodes it); else generated from ``doc``."""
    body = retarget(kernel.tapes[1], dest_slots) if kernel is not None and kernel.engine == "tape" else None
    if body is not None:
        pro = kernel.tapes[0]
    else:
        pro, body, _ = run_deep(tape_program, doc, [int(a) for a in dest_slots])
    zs = np.ascontiguousarray(zero_slots, dtype=np.int64)
    zs.setflags(write=False)
    return FusedTape(pro, body, zs)


def _recovering(run, out, *args) -> None:
    """``run(*args)``; a Numba cache file that fails to load (corrupt or
    tampered index/data) is purged and the call retried, so Numba recompiles
    instead of the entry breaking every later run (compile/cache.py)."""
    for _ in range(16):                  # at most one purge per compiled function
        try:
            return run(*args)
        except Exception as exc:
            if not recover_numba_cache(exc):
                raise
            out[:] = 0                   # accumulating (global) kernels restart from zero
    return run(*args)


def _distinct_nodes(exprs: list) -> int:
    seen: set = set()
    stack = list(exprs)
    while stack:
        x = stack.pop()
        if isinstance(x, Node) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(iter_children(x))
    return len(seen)


def tape_key(pro, body) -> str:
    """Content hash of a tape kernel: instructions, constants and register
    counts of both tapes (two models that differ only in a rate constant
    get different keys)."""
    return kernel_key("tape", *pro.digest_parts(), *body.digest_parts())


def tape_kernel(pro, body, n_hoist: int) -> Kernel:
    """The tape-engine :class:`Kernel` of a prologue and a body tape."""
    return Kernel("", tape_key(pro, body), (), (), int(n_hoist), len(body.code), "tape", (pro, body))


def compile_doc(doc, opts: dict, **generate_kw) -> Kernel:
    """The kernel of ``doc`` under ``opts`` (keys of :data:`ENGINE_OPTIONS`);
    ``generate_kw`` (``title``, ``dest``, ``zeros``, ``tile``, ``nslots``: a
    plan's direct writes) forces ``codegen``."""
    engine = opts["engine"]
    if engine not in ("auto", "codegen", "tape"):
        raise JacError("bad_option", f"engine must be 'auto', 'codegen' or 'tape'; got {engine!r}")
    if generate_kw:
        engine = "codegen"
    if engine == "auto" and doc.kind == "cell":
        # The distinct expression nodes approximate the statement count.
        n = _distinct_nodes([doc.expanded(f.expr) for f in doc.fields])
        engine = "tape" if n > int(opts["tape_above"]) else "codegen"
    if engine == "tape":
        pro, body, nh = run_deep(tape_program, doc)
        return tape_kernel(pro, body, nh)
    g = run_deep(generate, doc, max_stmts=int(opts["max_stmts"]), **generate_kw)
    return Kernel(g.source, kernel_key(g.source), g.chunks, g.chunk_kinds, g.n_hoist, g.n_statements,
                  counts_nonfinite=bool(g.counts_nonfinite), tile_scratch=int(g.tile_scratch),
                  tile_scratch_width=int(generate_kw.get("tile") or 0))
