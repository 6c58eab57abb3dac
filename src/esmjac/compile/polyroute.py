"""A taped cell body run on the mass-action kernel, lane chunk by lane chunk.

A mass-action mechanism's Jacobian (and right-hand side) is a polynomial in
the state over rate coefficients: every stored value is ``Σ c_i · m_i``
with each monomial a product of states and state-free factors.
:func:`cut` splits a body tape (a program's, or a plan's direct-write
body) at the state — every state-free value that a state-dependent
instruction or a store reads (the *frontier*: ``A·exp(−E/T)``, Troe
fall-offs, photolysis and uptake rates) becomes a per-lane row computed
by a small *rates* tape — and expands what remains with
:func:`esmjac.compile.massaction.expand`. When the expansion succeeds the
result is a :class:`PolyRoute`; otherwise (a division by a sum, a function
of a state, a cell index, an expansion too large) None, and the caller
keeps the tape. The decision is made once per body (content in, content
out: the same tape gives the same route), never per call.

Unlike the leaf's cut (:mod:`esmjac.integrators.lanehoist`, whose rows live
over a step of varying stage times), the time counts as state-free here:
a call evaluates at one ``t``, so a time-dependent rate is a row too.

:meth:`PolyRoute.run` evaluates the route for ``L`` lanes in chunks of
``lanes_per_chunk`` lanes (whole tiles of the plan): the chunk's state
and field rows are copied into chunk buffers (stride = the chunk's lanes),
the rates tape fills the chunk's rate rows, :func:`run_poly` stores the
chunk's tiles, and the non-finite values among them are counted while
they are still in cache (the tape counts while storing; a separate pass
over a 10⁴-cell GEOS-Chem Jacobian would re-read 308 MB). Every lane sees
the same operations whatever its chunk, position, the lane count or the
tile width, so the bits do not depend on them; they differ from the
tape's in the last places (the expanded sum, see ``massaction``).
"""
from __future__ import annotations

import platform
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .._frozen import readonly, ro
from .jitkeys import key_by_callees
from .massaction import _U64, BLOCK, PolyBody, expand, run_poly, scratch_size
from .ssa import UNARY, Block
from .tape import OPS, Tape, encode, run_tape
from .twins import serial_twin

__all__ = ["PolyRoute", "cut", "tape_ssa", "LANES_PER_CHUNK"]

#: Lanes per chunk (rounded down to whole tiles): the chunk's inputs and
#: output tiles stay in cache between the kernel and the non-finite count.
LANES_PER_CHUNK = 64

_LEAVES = ("const", "hoist", "param", "time", "idx", "lane")


def tape_ssa(tape: Tape) -> tuple:
    """``(instructions, stores)`` of a body tape in :class:`Block` form: one
    value per defining row (registers resolved), stores as (value, target)."""
    ins: list = []
    stores: list = []
    cur: dict = {}                      # register -> value id
    consts = tape.consts
    for o, d, a, b, c in tape.code.tolist():
        name = OPS[o]
        if name == "store":
            stores.append((cur[d], a))
            continue
        if name == "storeh":
            raise ValueError("a prologue tape is not a lane body")
        if name == "const":
            ins.append(("const", (float(consts[a]),)))
        elif name in ("hoist", "param", "idx"):
            ins.append((name, (a,)))
        elif name == "time":
            ins.append(("time", ()))
        elif name in ("lane_u", "lane_f"):
            ins.append(("lane", (name[-1], a)))
        elif name == "select":
            ins.append(("select", (cur[a], cur[b], cur[c])))
        elif name in UNARY:
            ins.append((name, (cur[a],)))
        else:
            ins.append((name, (cur[a], cur[b])))
        cur[d] = len(ins) - 1
    return ins, stores


@dataclass(frozen=True, eq=False)
class PolyRoute:
    """A body as rates and monomials; every array read-only.

    ``rates`` (None when no state-free value needs a row) stores frontier
    value ``k`` into rate row ``k`` (``R[k*L + l]``), reading the program's
    own fields. ``body`` is a :class:`PolyBody` whose field rows are the
    chunk's gathered rows: row ``k`` is field row ``src[k]`` of the program
    when ``src[k] < n_forcing``, else rate row ``src[k] - n_forcing``;
    ``n_states`` state rows are gathered (one past the highest read)."""

    rates: Tape | None
    n_forcing: int
    rows: int
    body: PolyBody
    src: np.ndarray
    n_states: int

    def bind(self, L: int, W: int, P: int, C: int, zslots, lanes_per_chunk: int = LANES_PER_CHUNK,
             parts: int | None = 1):
        """``call(u, f, p, t, h, cix, out) -> int``: :meth:`run` on fixed
        lanes and tiles with its scratch allocated here, not per call.

        ``parts``: the most runs of consecutive chunks a call splits into,
        one per thread (``None``: as many as Numba may use); each call uses
        ``min(parts, numba.get_num_threads())`` (the caller's thread
        policy), fewer when there are fewer chunks than
        :data:`LANES_PER_PART` lanes per part. The runs are calls of the one
        compiled :func:`_drive` on Python threads (it releases the GIL), not
        a second jitted function (each jitted caller of ``run_poly``
        compiles its optimisation again); the rates tape runs before them on
        the calling thread (its serial twin: numba's parallel region cost
        more CPU than it saved). A chunk's values do not depend on
        the run or thread that computes it, so the bits are those of one
        part."""
        if W <= 0:
            raise ValueError("PolyRoute stores into a tiled plan's slots (W > 0)")
        L, W, P, C = int(L), int(W), int(P), int(C)
        B = max(W, (int(lanes_per_chunk) // W) * W)
        B = min(B, -(-max(L, 1) // W) * W)
        nc = -(-max(L, 1) // B)
        T = int(nb.config.NUMBA_NUM_THREADS) if parts is None else int(parts)
        T = max(1, min(T, nc * B // LANES_PER_PART, nc))
        arrs, src, nf, rt = self.body.arrays(), self.src, self.n_forcing, self.rates
        R = np.empty(self.rows * L) if rt is not None else _NO_ROWS
        # Every input of _drive (and of run_poly and the rates tape under
        # it) read-only (:func:`ro`): one compiled flavour for every caller.
        Rd, zslots = readonly(R), ro(zslots)
        scr = [(np.empty(self.n_states * B), np.empty(src.shape[0] * B), np.empty(scratch_size(self.body, W)),
                np.empty(P * B)) for _ in range(T)]
        uc, fc, sc, ob = scr[0]

        def one(u, f, p, t, h, cix, out):
            return _drive(*arrs, ro(u), ro(f), Rd, src, nf, h, ro(p), out, L, W, P, C, zslots, B, uc, fc, sc, ob,
                          0, nc)

        def split(u, f, p, t, h, cix, out, n):
            u, f, p = ro(u), ro(f), ro(p)

            def part(k):
                return _drive(*arrs, u, f, Rd, src, nf, h, p, out, L, W, P, C, zslots, B, *scr[k],
                              k * nc // n, (k + 1) * nc // n)
            futs = [_pool(n - 1).submit(part, k) for k in range(1, n)]
            bad = part(0)                   # the caller's thread runs the first part
            return bad + sum(fu.result() for fu in futs)

        if T == 1:
            if rt is None:
                return one
            serial = _serial_run()

            def rated(u, f, p, t, h, cix, out):
                u, f, p = ro(u), ro(f), ro(p)
                serial(rt.code, rt.consts, u, f, p, t, h, cix, R, L, rt.nreg, 0, 0, L, _NO_SLOTS)
                return one(u, f, p, t, h, cix, out)
            return rated
        def call(u, f, p, t, h, cix, out):
            n = min(T, nb.get_num_threads())
            u, f, p = ro(u), ro(f), ro(p)
            if rt is not None:          # on this thread: a parallel region's spin-wait costs more
                _serial_run()(rt.code, rt.consts, u, f, p, t, h, cix, R, L, rt.nreg, 0, 0, L, _NO_SLOTS)
            return split(u, f, p, t, h, cix, out, n) if n > 1 else one(u, f, p, t, h, cix, out)
        return call

    def run(self, u, f, p, t: float, h, cix, out, L: int, W: int, P: int, C: int, zslots,
            lanes_per_chunk: int = LANES_PER_CHUNK, parts: int | None = 1) -> int:
        """Evaluate into a tiled plan's slots (``W`` > 0: slot ``a`` of
        lane ``l`` at ``((l // W)*P + a)*W + l % W``, ``C`` stored lanes,
        padding lanes a copy of lane ``L-1``, slots ``zslots`` zeroed) for
        lanes ``0..L-1`` (``u``, ``f`` float64, lanes-fastest; ``u`` holds
        :attr:`n_states` rows); ``h`` holds the prologue's values. Returns a
        non-zero number when a stored value is not finite. ``parts``: as
        :meth:`bind` (the bits do not depend on it)."""
        return self.bind(L, W, P, C, zslots, lanes_per_chunk, parts)(u, f, p, float(t), h, cix, out)


_NO_SLOTS = np.zeros(0, np.int64)
_NO_SLOTS.setflags(write=False)
_NO_ROWS = np.zeros(1)
_NO_ROWS.setflags(write=False)
_RUN: dict = {}                 # the interpreter's serial twin, made on first use
#: Fewest lanes per part of a split call (:meth:`PolyRoute.bind`): below
#: this a thread's start-up costs more than its chunks.
LANES_PER_PART = 512
_POOL: list = []                # [(the pool, its number of workers)]
_POOL_LOCK = threading.Lock()


def _serial_run():
    if True not in _RUN:
        _RUN[True] = serial_twin(run_tape)
    return _RUN[True]


def _pool(n: int) -> ThreadPoolExecutor:
    """The route's worker threads (at least ``n``): made on first use and
    kept; a wider one replaces a narrower one (which finishes its work)."""
    with _POOL_LOCK:
        if not _POOL or _POOL[0][1] < n:
            old = _POOL[:]
            w = max(n, 1)
            _POOL[:] = [(ThreadPoolExecutor(max_workers=w, thread_name_prefix="esmjac-route"), w)]
            for o, _ in old:
                o.shutdown(wait=False)
        return _POOL[0][0]


#: Doubles per non-temporal store of :func:`_copy_check` (one 64-byte line).
_NT = 8
#: Non-temporal stores and ``sfence`` are x86's; elsewhere ordinary stores.
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@intrinsic
def _copy_check(typingctx, dst, d0, src, n):
    """``dst[d0 : d0+n] = src[0 : n]``; 1 when one of the values is an inf
    or a NaN, else 0 (``v·0`` is NaN exactly for those and a NaN survives
    any sum). A bit copy: the values are stored as read. The whole 64-byte
    lines of ``dst`` are written with non-temporal stores (x86: no read of
    the line first, as an ordinary store's write-allocate does, and the
    line is not kept in cache; the caller ends with :func:`_sfence`), the
    partial lines at either end with ordinary stores. ``src`` is read once
    for both."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.dtype == types.float64 and src.dtype == types.float64):
        return None
    sig = types.int64(dst, d0, src, n)

    def codegen(context, builder, signature, args):
        dt, _, st, _ = signature.args
        dst_, d0_, src_, n_ = args
        i64, dbl = ir.IntType(64), ir.DoubleType()
        vt = ir.VectorType(dbl, _NT)
        dp = builder.gep(context.make_array(dt)(context, builder, dst_).data, [d0_])
        sp = context.make_array(st)(context, builder, src_).data
        addr = builder.ptrtoint(dp, i64)
        # values before the first 64-byte boundary (all of them when dst is
        # not even 8-byte aligned: no vector store then)
        head = builder.lshr(builder.and_(builder.sub(i64(0), addr), i64(63)), i64(3))
        head = builder.select(builder.icmp_unsigned("!=", builder.and_(addr, i64(7)), i64(0)), n_, head)
        head = builder.select(builder.icmp_unsigned("<", n_, head), n_, head)
        nv = builder.lshr(builder.sub(n_, head), i64(3))
        vend = builder.add(head, builder.shl(nv, i64(3)))
        acc = cgutils.alloca_once_value(builder, dbl(0.0))
        vacc = cgutils.alloca_once_value(builder, ir.Constant(vt, [0.0] * _NT))

        def scalar(i):
            x = builder.load(builder.gep(sp, [i]))
            builder.store(x, builder.gep(dp, [i]))
            builder.store(builder.fadd(builder.load(acc), builder.fmul(x, dbl(0.0))), acc)
        with cgutils.for_range_slice(builder, i64(0), head, i64(1), inc=True) as (i, _):
            scalar(i)
        nt = builder.module.add_metadata([ir.IntType(32)(1)])
        with cgutils.for_range_slice(builder, head, vend, i64(_NT), inc=True) as (i, _):
            x = builder.load(builder.bitcast(builder.gep(sp, [i]), vt.as_pointer()))
            x.align = 8
            st_ = builder.store(x, builder.bitcast(builder.gep(dp, [i]), vt.as_pointer()))
            st_.align = 64
            if _X86:
                st_.set_metadata("nontemporal", nt)
            builder.store(builder.fadd(builder.load(vacc), builder.fmul(x, ir.Constant(vt, [0.0] * _NT))), vacc)
        with cgutils.for_range_slice(builder, vend, n_, i64(1), inc=True) as (i, _):
            scalar(i)
        s, v = builder.load(acc), builder.load(vacc)
        for j in range(_NT):
            s = builder.fadd(s, builder.extract_element(v, ir.IntType(32)(j)))
        return builder.zext(builder.fcmp_unordered("uno", s, s), i64)
    return sig, codegen


@intrinsic
def _sfence(typingctx):
    """``sfence`` (x86): the non-temporal stores before it are ordered
    before any later store of this thread (so a thread that sees the later
    one sees them). Once per call, not per copy: each one waits for the
    write-combining buffers to drain (one per copied 64-lane row of the
    point cost ≈ 20 ms per 10⁴-lane call in a trial)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if _X86:
            fence = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                   "llvm.x86.sse.sfence")
            builder.call(fence, [])
        return context.get_dummy_value()
    return sig, codegen


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _drive(fptr, fkind, fidx, optr, omono, ocoef, targets, u, f, R, src, nf, h, p, out, L, W, P, C, zslots, B,
           uc, fc, sc, ob, c0, c1):
    """Chunks ``c0 .. c1-1`` of ``B`` lanes: gather the chunk's state rows
    and field rows (stride = the chunk's lanes), run the kernel into a
    chunk buffer ``ob`` (``P*B`` values: the kernel's scattered tile stores
    stay in cache), copy it into the chunk's tiles (one contiguous run of
    ``out``, :func:`_copy_check`: non-temporal stores, the non-finite check
    in the same pass). Measured on GEOS-Chem kinetics, 10⁴ cells: 96 ms
    with a buffer against 147 with the kernel storing into ``out`` itself.
    The gathers are loops on unsigned offsets, not slice assignments (those
    compile a shape check and its error message, ≈ 5 s of a cold build, and
    each slice is a reference-count increment and decrement: two locked
    atomics per row; a signed offset's wraparound check keeps LLVM's
    vectoriser out)."""
    n_u = uc.shape[0] // B
    nr = src.shape[0]
    bad = 0
    for l0 in range(c0 * B, min(c1 * B, L), B):
        m = min(B, L - l0)
        cm = min(B, C - l0)
        mu = _U64(m)
        for r in range(n_u):
            a, b = _U64(r) * mu, _U64(r * L + l0)
            for j in range(mu):
                uc[a + j] = u[b + j]
        for k in range(nr):
            s = src[k]
            a = _U64(k) * mu
            if s < nf:
                b = _U64(s * L + l0)
                for j in range(mu):
                    fc[a + j] = f[b + j]
            else:
                b = _U64((s - nf) * L + l0)
                for j in range(mu):
                    fc[a + j] = R[b + j]
        n = (cm // W) * P * W
        # BLOCK as a runtime int64, as the leaf passes it from Python: the
        # global itself would be typed Literal[int](16), a specialisation of
        # run_poly of its own (≈ 17 s of cold compile) no other caller shares
        run_poly(fptr, fkind, fidx, optr, omono, ocoef, targets, uc[:n_u * m], fc[:nr * m], h, p, ob[:n], m, W, P,
                 cm, zslots, np.int64(BLOCK), sc)
        bad += _copy_check(out, (l0 // W) * P * W, ob, n)
    _sfence()
    return bad


def _compact(pb: PolyBody) -> tuple[PolyBody, np.ndarray]:
    """``pb`` reading only the field rows it uses, renumbered in order
    (kinds 1 and 5: a field row, a field divisor), and those rows' sources."""
    fk = pb.fkind
    isf = (fk == 1) | (fk == 5)
    src = np.unique(pb.fidx[isf]).astype(np.int64)
    fidx = pb.fidx.copy()
    fidx[isf] = np.searchsorted(src, pb.fidx[isf]).astype(fidx.dtype)
    fidx.setflags(write=False)
    src.setflags(write=False)
    return PolyBody(pb.fptr, pb.fkind, fidx, pb.optr, pb.omono, pb.ocoef, pb.targets), src


def cut(body: Tape) -> PolyRoute | None:
    """``body`` (a cell body tape: ``store`` rows) as a :class:`PolyRoute`,
    or None when what remains after the cut is not a polynomial in the
    state (module docstring)."""
    ins, stores = tape_ssa(body)
    n_forcing = 1 + max((a[1] for op, a in ins if op == "lane" and a[0] == "f"), default=-1)
    n_states = 1 + max((a[1] for op, a in ins if op == "lane" and a[0] == "u"), default=-1)
    # dep: reads the state. mono: state-free and a single monomial (a
    # product or quotient of constants, parameters, prologue values and
    # field rows: ``2·k·M``), which the expansion takes as it is; quot: a
    # monomial with a divisor (the expansion divides by none of those).
    # The other state-free values that a kept value reads (sums, functions
    # of the fields, the time) are the frontier, computed as rows.
    n = len(ins)
    dep, mono, quot = [False] * n, [False] * n, [False] * n
    for v, (op, args) in enumerate(ins):
        if op == "idx":
            return None                 # a cell index: the tape's (chunks would shift the lane map)
        if op == "lane":
            dep[v] = args[0] == "u"
            mono[v] = not dep[v]
        elif op in ("const", "param", "hoist"):
            mono[v] = True
        elif op == "time":
            pass
        else:
            dep[v] = any(dep[a] for a in args)
            if dep[v]:
                continue
            if op == "*":
                mono[v] = mono[args[0]] and mono[args[1]]
                quot[v] = quot[args[0]] or quot[args[1]]
            elif op == "/":
                mono[v] = mono[args[0]] and mono[args[1]] and not quot[args[1]]
                quot[v] = True
            elif op == "neg":
                mono[v], quot[v] = mono[args[0]], quot[args[0]]
    keep = [d or m for d, m in zip(dep, mono)]
    frontier: dict = {}                 # value -> row offset (first use order)

    def mark(v):
        if not keep[v] and v not in frontier:
            frontier[v] = len(frontier)

    for v, (op, args) in enumerate(ins):
        if keep[v] and op not in _LEAVES:
            for a in args:
                mark(a)
    for v, _ in stores:
        mark(v)
    if not frontier:
        pb = expand(ins, stores, int(body.code.shape[0]))
        return None if pb is None else PolyRoute(None, n_forcing, 0, *_compact(pb), n_states=n_states)
    rest = Block()
    for v, (op, args) in enumerate(ins):
        rest.ins.append(("lane", ("f", n_forcing + frontier[v])) if v in frontier else (op, args))
    pb = expand(rest.ins, stores, int(body.code.shape[0]))
    if pb is None:
        return None
    pro = Block()
    pro.ins.extend(ins)
    rates = encode(pro, [(v, k) for v, k in frontier.items()])
    return PolyRoute(rates, n_forcing, len(frontier), *_compact(pb), n_states=n_states)


# Numba keys a cached function by its own file: key these by what they link in from other
# modules too (compile/jitkeys.py), so an edit there is not served stale from a warm cache.
key_by_callees(globals())
