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
from typing import Any, Callable, TypeVar

import numpy as np

from .._frozen import ro
from ..errors import JacError
from ..model.deep import run_deep
from ..model.expr import Node, iter_children
from .cache import kernel_key, load_source, recover_numba_cache
from .codegen import generate, tape_program, tile_scratch
from .polyroute import PolyRoute, cut
from .tape import OPS, Tape, retarget, run_tape
from .twins import parallel_copy, serial_driver, serial_twin

_R = TypeVar("_R")

__all__ = ["Kernel", "FusedTape", "compile_doc", "fused_tape", "tape_kernel", "tape_key", "ENGINE_OPTIONS",
           "NO_SLOTS", "run_tapes"]

#: run_tape's zero-slot list when it writes no tiles (lanes-fastest stores).
NO_SLOTS = np.zeros(0, np.int64)
NO_SLOTS.setflags(write=False)

# A generated module's chunk functions, by (fused, serial): ``<name>`` the
# parallel chunk, ``s<name>`` its serial twin, ``fl<name>``/``sfl<name>`` a
# plan's direct writes (codegen). Spelled here only.
_PREFIX = {(False, False): "", (False, True): "s", (True, False): "fl", (True, True): "sfl"}


def _interpreter(serial: bool):
    """The tape interpreter to call: :func:`~esmjac.compile.tape.run_tape`'s
    serial twin or its parallel copy, both compiled from the kernel cache
    (compile/twins.py), so one Numba cache entry serves every install."""
    return serial_twin(run_tape) if serial else parallel_copy(run_tape)


def run_tapes(run, tapes: tuple, u, f, p, t: float, h, cix, out, lanes: int, tile: int = 0,
              slots_per_lane: int = 0, capacity: int = 0, zero_slots: np.ndarray = NO_SLOTS) -> int:
    """The prologue tape into ``h``, then the body tape over ``lanes`` lanes
    into ``out`` (``tile``/``slots_per_lane``/``capacity``/``zero_slots``: a
    tiled plan's direct slot stores; 0: lanes-fastest, capacity ``lanes``).
    ``run`` is :func:`_interpreter`'s (run_tape's parallel copy or serial twin).
    The one place run_tape's arguments are written; returns the number of
    non-finite values stored. The inputs go in read-only (:func:`ro`), the
    one flavour every caller compiles."""
    pro, body = tapes
    u, f, p, zero_slots = ro(u), ro(f), ro(p), ro(zero_slots)
    run(pro.code, pro.consts, u, f, p, t, h, cix, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
    return run(body.code, body.consts, u, f, p, t, h, cix, out, lanes, body.nreg, tile, slots_per_lane,
               capacity or lanes, zero_slots)

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
    reads_cells: bool = True   # whether the chunks read cell index values (``cix``); known at generation
    prologue_source: str = ""  # the prologue's own module (codegen: shared by the kernels of equal prologues)

    def module(self):
        if self.engine == "tape":
            return None
        mod = self.__dict__.get("_module")
        if mod is None:
            if self.prologue_source:       # the module imports its prologue's module by name
                load_source(self.prologue_source)
            mod = load_source(self.source, self.key)
            object.__setattr__(self, "_module", mod)     # a memo, not a field: frozen stays frozen
        return mod

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_module", None)                       # modules do not pickle; re-imported on use
        state.pop("_calls", None)
        return state

    def chunk_calls(self, *, serial: bool, fused: bool = False) -> tuple:
        """``((function, is_cell), ...)``: the generated chunks in call order,
        the serial twins or the parallel ones, a plan's direct writes
        (``fused``) or the program's own outputs (memoized on the instance)."""
        memo = self.__dict__.get("_calls")
        if memo is None:
            memo = {}
            object.__setattr__(self, "_calls", memo)
        calls = memo.get((fused, serial))
        if calls is None:
            mod, pre = self.module(), _PREFIX[fused, serial]
            kinds = ("cell",) * len(self.chunks) if fused else self.chunk_kinds
            calls = memo[fused, serial] = tuple((getattr(mod, pre + n), k == "cell")
                                                for n, k in zip(self.chunks, kinds))
        return calls

    def driver(self, *, fused: bool = False):
        """The serial driver (:func:`~esmjac.compile.twins.serial_driver`) of
        this kernel's serial chunks: ``drive(u, f, p, t, h, cix, out, L[, S])``
        runs the prologue, the chunks and the non-finite scan in one native
        call and returns how many non-finite values it stored."""
        if fused:
            kind = "tile" if self.tile_scratch else ("cellc" if self.counts_nonfinite else "cell")
            calls = tuple((_PREFIX[True, True] + n, kind) for n in self.chunks)
        else:
            cell = "cellc" if self.counts_nonfinite else "cell"
            calls = tuple((_PREFIX[False, True] + n, cell if k == "cell" else "global")
                          for n, k in zip(self.chunks, self.chunk_kinds))
        return serial_driver(self.module(), calls)

    def bind(self, h: np.ndarray, cix: np.ndarray, lanes: int, *, serial: bool,
             one_thread: Callable[[], bool] | None = None, fused: bool = False,
             scratch: np.ndarray | None = None) -> Callable:
        """``call(u, p, t, f, out) -> int | None``: this kernel on ``lanes``
        lanes with its hoisted values in ``h`` and lane map ``cix`` (fixed
        here, the numbers per call; nothing checked per call: the caller
        checked the arrays). ``serial``: one compiled call (the serial driver,
        non-finite scan included; the tape's serial twin); otherwise the
        parallel chunks, or their serial twins while ``one_thread()`` says
        numba runs on one thread (the caller's thread policy). ``fused``: a
        plan's direct writes, ``scratch`` the tiled chunks' scratch. The call
        returns the number of non-finite values stored, or None when the
        chunks do not count them (the caller scans ``out``). The caller
        passes ``u``, ``p`` and ``f`` read-only (the one flavour the chunks
        are compiled for, :func:`~esmjac._frozen.ro`): a binding keeps its
        read-only views while its caller passes the same arrays
        (runtime/bound.py), so no call here makes one."""
        L = int(lanes)
        if self.engine == "tape":
            run = _interpreter(serial)
            tapes = self.tapes

            def call(u, p, t, f, out):
                return run_tapes(run, tapes, u, f, p, t, h, cix, out, L)
            return call
        extra = () if scratch is None else (scratch,)
        if serial:
            drive = self.driver(fused=fused)
            table = getattr(drive, "table", None)
            if table is not None:
                # Tiled chunks (compile/tilecall.py): the compiled driver and
                # its address table straight, no Python layer per call.
                run, resolve = drive.drive, drive.resolve
                if extra:
                    def call(u, p, t, f, out):
                        r = run(u, f, p, t, h, cix, out, L, scratch, table)
                        return r if r >= 0 else resolve(r, u, f, p, t, h, cix, out, L, scratch)
                    return call

                def call(u, p, t, f, out):
                    r = run(u, f, p, t, h, cix, out, L, table)
                    return r if r >= 0 else resolve(r, u, f, p, t, h, cix, out, L)
                return call
            if extra:
                def call(u, p, t, f, out):
                    return drive(u, f, p, t, h, cix, out, L, scratch)
                return call

            def call(u, p, t, f, out):
                return drive(u, f, p, t, h, cix, out, L)
            return call
        pro = self.module().prologue
        par = self.chunk_calls(serial=False, fused=fused)
        ser = self.chunk_calls(serial=True, fused=fused) if one_thread is not None else par
        counts = self.counts_nonfinite
        if one_thread is None:
            def one_thread():
                return False
        if fused:
            par_f, ser_f = tuple(fn for fn, _ in par), tuple(fn for fn, _ in ser)

            def call(u, p, t, f, out):
                pro(p, t, h)
                bad = 0
                for fn in (ser_f if one_thread() else par_f):
                    bad += fn(u, f, h, cix, out, L, *extra)
                return bad if counts else None
            return call

        def chunked(u, p, t, f, out):
            pro(p, t, h)
            bad = 0
            for fn, is_cell in (ser if one_thread() else par):
                if is_cell:
                    bad += fn(u, f, h, cix, out, L) or 0
                else:
                    fn(u, f, h, out)
            return bad if counts else None
        return chunked

    def bind_params(self, p: np.ndarray, t: float, h: np.ndarray, *, fused: bool = False) -> Callable:
        """``call(u, f, cix, lanes, out[, scratch])``: the serial chunks with
        parameters ``p`` and time ``t`` fixed — the prologue (parameter-only
        values into ``h``) runs here, once, not per call — on the first
        ``lanes`` lanes with the call's own lane map (an integrator's
        compacted lanes on one worker thread). The tape engine runs its
        prologue tape with every call, on the interpreter's serial twin (the
        parallel one's region start-up and barrier cost more than a 64-lane
        block's arithmetic; the same instructions, so the same bits).
        Returns nothing (the caller checks the values it integrates)."""
        call: Callable[..., None]       # the fused variant also takes the tiles' scratch
        if self.engine == "tape":
            run, tapes, t = _interpreter(True), self.tapes, float(t)

            def call(u, f, cix, lanes, out):
                run_tapes(run, tapes, u, f, p, t, h, cix, out, lanes)
            return call
        self.module().prologue(ro(p), float(t), h)
        calls = self.chunk_calls(serial=True, fused=fused)
        if fused:
            fns = tuple(fn for fn, _ in calls)

            def call(u, f, cix, lanes, out, *scratch):
                u, f = ro(u), ro(f)
                for fn in fns:
                    fn(u, f, h, cix, out, lanes, *scratch)
            return call

        def chunked(u, f, cix, lanes, out):
            u, f = ro(u), ro(f)
            for fn, is_cell in calls:
                if is_cell:
                    fn(u, f, h, cix, out, lanes)
                else:
                    fn(u, f, h, out)
        return chunked

    def listing(self) -> str:
        """Readable generated source or tape."""
        if self.engine == "tape":
            pro, body = self.tapes
            return (f"# esmjac tape: prologue {len(pro.code)} instructions, body {len(body.code)} "
                    f"instructions, {body.nreg} registers\n# prologue\n{pro.listing()}\n# body\n"
                    f"{body.listing()}\n")
        return self.prologue_source + "\n\n" + self.source if self.prologue_source else self.source

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
        if self.engine == "tape":       # the tape counts the non-finite values it stores
            return run_tapes(_interpreter(False), self.tapes, u, forcing, p, float(t), h, cix, out, lanes)
        u, forcing = ro(u), ro(forcing)
        self.module().prologue(ro(p), float(t), h)
        bad = 0
        for fn, is_cell in self.chunk_calls(serial=serial):
            if is_cell:
                bad += fn(u, forcing, h, cix, out, lanes) or 0
            else:
                fn(u, forcing, h, out)
        return bad if self.counts_nonfinite else None

    def _run_fused_once(self, u, p, t, forcing, out, h, cix, lanes: int, serial: bool) -> int | None:
        if h.shape[0] < self.n_hoist:
            h = np.zeros(self.n_hoist)
        u, forcing = ro(u), ro(forcing)
        self.module().prologue(ro(p), float(t), h)
        bad = 0
        extra: tuple[np.ndarray, ...] = ()
        if self.tile_scratch:
            W = self.tile_scratch_width
            extra = (np.empty(tile_scratch(self.tile_scratch, lanes, W), u.dtype),)
        for fn, _ in self.chunk_calls(serial=serial, fused=True):
            bad += fn(u, forcing, h, cix, out, lanes, *extra) or 0
        return bad if self.counts_nonfinite else None


@dataclass(frozen=True, eq=False)
class FusedTape:
    """The tape engine's direct-write body for a tiled plan: slot stores
    (``prologue``, ``body``) and the slots no band reaches (``zero_slots``,
    read-only). :meth:`run` and :meth:`bind` evaluate a body that is a
    polynomial in the state on the mass-action kernel instead
    (:mod:`esmjac.compile.polyroute`: float64 tiles; the bits differ from
    the tape's in the last places, the same for any lanes, tiles or
    threads); :meth:`bind_lanes` (the leaf's) keeps the tape."""

    prologue: Tape
    body: Tape
    zero_slots: np.ndarray

    def run(self, u, p, t, forcing, out, h, cix, lanes: int, tile: int, slots_per_lane: int,
            capacity: int) -> int:
        """Evaluate straight into ``out``'s tile slots (arguments checked by
        the caller); non-zero when a stored value is not finite (the tape:
        how many)."""
        return _recovering(self._run_once, out, u, p, t, forcing, out, h, cix, lanes, tile, slots_per_lane,
                           capacity)

    def route(self) -> PolyRoute | None:
        """The body on the mass-action kernel (:func:`polyroute.cut`), or
        None when it is not a polynomial in the state over state-free rows:
        cut once per instance, on first use (a memo, not a field)."""
        memo = self.__dict__.get("_route", False)
        if memo is False:
            memo = cut(self.body)
            object.__setattr__(self, "_route", memo)
        return memo

    def _run_once(self, u, p, t, forcing, out, h, cix, lanes, tile, slots_per_lane, capacity) -> int:
        rt = self.route() if tile > 0 and out.dtype == np.float64 and u.dtype == np.float64 else None
        if rt is not None:
            pro = self.prologue
            u, forcing, p = ro(u), ro(forcing), ro(p)
            _interpreter(False)(pro.code, pro.consts, u, forcing, p, float(t), h, cix, h, 1, pro.nreg, 0, 0, 1,
                                NO_SLOTS)
            # in as many runs of chunks as Numba's threads are set to (same bits)
            return rt.run(u, forcing, p, float(t), h, cix, out, lanes, tile, slots_per_lane, capacity,
                          self.zero_slots, parts=None)
        return self.run_tape(u, p, t, forcing, out, h, cix, lanes, tile, slots_per_lane, capacity)

    def run_tape(self, u, p, t, forcing, out, h, cix, lanes: int, tile: int, slots_per_lane: int,
                 capacity: int) -> int:
        """:meth:`run` on the tape interpreter whatever :meth:`route` says
        (the route before the mass-action kernel; benchmarks compare them)."""
        return run_tapes(_interpreter(False), (self.prologue, self.body), u, forcing, p, float(t), h, cix, out, lanes,
                         tile, slots_per_lane, capacity, self.zero_slots)

    def bind_lanes(self, p: np.ndarray, t: float, h: np.ndarray, slots_per_lane: int,
                   tile_width: Callable[[int], int], capacity: Callable[[int], int]) -> Callable:
        """``call(u, f, cix, lanes, out) -> int``: the direct slot stores with
        parameters ``p`` and time ``t`` fixed, the lanes and their lane map
        per call (an integrator's compacted lanes on one worker thread: the
        interpreter's serial twin); ``tile_width(lanes)``/``capacity(lanes)``
        give the plan's tiles at that lane count. The number of non-finite
        values stored."""
        run = _interpreter(True)
        tapes, zs, t, P = (self.prologue, self.body), self.zero_slots, float(t), int(slots_per_lane)

        def call(u, f, cix, lanes, out):
            return run_tapes(run, tapes, u, f, p, t, h, cix, out, lanes, tile_width(lanes), P, capacity(lanes), zs)
        return call

    def bind(self, h: np.ndarray, cix: np.ndarray, lanes: int, tile: int, slots_per_lane: int,
             capacity: int, *, serial: bool, dtype=np.float64, route: bool = True) -> Callable:
        """``call(u, p, t, f, out) -> int``: the direct slot stores on fixed
        lanes, tiles, hoisted values and lane map, non-zero when a stored
        value is not finite: float64 tiles on the mass-action kernel when
        :meth:`route` has one (and ``route``), its scratch allocated here;
        else the tape (the serial twin of the interpreter when ``serial``).
        ``u``, ``p`` and ``f`` come read-only (as :meth:`Kernel.bind`'s)."""
        run = _interpreter(serial)
        tapes, zs = (self.prologue, self.body), self.zero_slots
        L, W, P, C = int(lanes), int(tile), int(slots_per_lane), int(capacity)
        rt = self.route() if route and W > 0 and np.dtype(dtype) == np.float64 else None
        if rt is not None:
            # not serial: a run of chunks per thread Numba uses at the call
            pro, poly = self.prologue, rt.bind(L, W, P, C, zs, parts=1 if serial else None)

            def call(u, p, t, f, out):
                run(pro.code, pro.consts, u, f, p, t, h, cix, h, 1, pro.nreg, 0, 0, 1, NO_SLOTS)
                return poly(u, f, p, t, h, cix, out)
            return call

        def tape_call(u, p, t, f, out):
            return run_tapes(run, tapes, u, f, p, t, h, cix, out, L, W, P, C, zs)
        return tape_call


def fused_tape(doc, dest_slots, zero_slots, kernel: "Kernel | None" = None) -> FusedTape:
    """The :class:`FusedTape` of ``doc`` storing field ``i`` into slot
    ``dest_slots[i]``; ``zero_slots`` are zeroed. With the program's tape
    ``kernel`` and one slot per field (every lane plan but a merged one),
    its body retargeted (:func:`tape.retarget`: the same instructions, no
    expression document needed: a program loaded from the cache never
    decodes it); else generated from ``doc``."""
    body = None
    if kernel is not None and kernel.engine == "tape":
        pro, body = kernel.tapes[0], retarget(kernel.tapes[1], dest_slots)
    if body is None:
        pro, body, _ = run_deep(tape_program, doc, [int(a) for a in dest_slots])
    zs = np.ascontiguousarray(zero_slots, dtype=np.int64)
    zs.setflags(write=False)
    return FusedTape(pro, body, zs)


def _recovering(run: Callable[..., _R], out: np.ndarray, *args: Any) -> _R:
    """``run(*args)``; a Numba cache file that fails to load (corrupt or
    tampered index/data) is purged and the call retried, so Numba recompiles
    instead of the entry breaking every later run (compile/cache.py)."""
    while True:                          # each retry removed a broken file: finitely many
        try:
            return run(*args)
        except Exception as exc:
            if not recover_numba_cache(exc):
                raise
            out[:] = 0                   # accumulating (global) kernels restart from zero


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


_IDX = OPS.index("idx")        # the tape's cell-index read


def tape_kernel(pro, body, n_hoist: int) -> Kernel:
    """The tape-engine :class:`Kernel` of a prologue and a body tape."""
    reads = any(bool(np.any(tp.code[:, 0] == _IDX)) for tp in (pro, body) if len(tp.code))
    return Kernel("", tape_key(pro, body), (), (), int(n_hoist), len(body.code), "tape", (pro, body),
                  reads_cells=reads)


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
                  tile_scratch_width=int(generate_kw.get("tile") or 0), reads_cells=bool(g.reads_cells),
                  prologue_source=g.prologue_source)
