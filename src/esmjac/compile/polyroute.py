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

from dataclasses import dataclass

import numba as nb
import numpy as np

from .jitkeys import key_by_callees
from .massaction import BLOCK, PolyBody, expand, run_poly, scratch_size
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

    def bind(self, L: int, W: int, P: int, C: int, zslots, lanes_per_chunk: int = LANES_PER_CHUNK):
        """``call(u, f, p, t, h, cix, out) -> int``: :meth:`run` on fixed
        lanes and tiles with its scratch allocated here, not per call."""
        if W <= 0:
            raise ValueError("PolyRoute stores into a tiled plan's slots (W > 0)")
        L, W, P, C = int(L), int(W), int(P), int(C)
        B = max(W, (int(lanes_per_chunk) // W) * W)
        B = min(B, -(-max(L, 1) // W) * W)
        arrs, src, nf, rt = self.body.arrays(), self.src, self.n_forcing, self.rates
        R = np.empty(self.rows * L) if rt is not None else _NO_ROWS
        uc, fc = np.empty(self.n_states * B), np.empty(src.shape[0] * B)
        sc = np.empty(scratch_size(self.body, W))
        ob = np.empty(P * B)

        def call(u, f, p, t, h, cix, out):
            return _drive(*arrs, u, f, R, src, nf, h, p, out, L, W, P, C, zslots, B, uc, fc, sc, ob)
        if rt is None:
            return call
        run = _serial_run()

        def rated(u, f, p, t, h, cix, out):
            run(rt.code, rt.consts, u, f, p, t, h, cix, R, L, rt.nreg, 0, 0, L, _NO_SLOTS)
            return _drive(*arrs, u, f, R, src, nf, h, p, out, L, W, P, C, zslots, B, uc, fc, sc, ob)
        return rated

    def run(self, u, f, p, t: float, h, cix, out, L: int, W: int, P: int, C: int, zslots,
            lanes_per_chunk: int = LANES_PER_CHUNK) -> int:
        """Evaluate into a tiled plan's slots (``W`` > 0: slot ``a`` of
        lane ``l`` at ``((l // W)*P + a)*W + l % W``, ``C`` stored lanes,
        padding lanes a copy of lane ``L-1``, slots ``zslots`` zeroed) for
        lanes ``0..L-1`` (``u``, ``f`` float64, lanes-fastest; ``u`` holds
        :attr:`n_states` rows); ``h`` holds the prologue's values. Returns a
        non-zero number when a stored value is not finite. One thread."""
        return self.bind(L, W, P, C, zslots, lanes_per_chunk)(u, f, p, float(t), h, cix, out)


_NO_SLOTS = np.zeros(0, np.int64)
_NO_SLOTS.setflags(write=False)
_NO_ROWS = np.zeros(1)
_NO_ROWS.setflags(write=False)
_RUN: list = []                 # the interpreter's serial twin, made on first use


def _serial_run():
    if not _RUN:
        _RUN.append(serial_twin(run_tape))
    return _RUN[0]


@nb.njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _nonfinite(x):
    """Non-zero when ``x`` holds an inf or a NaN (``v·0`` is NaN exactly for
    those, and a NaN survives any sum: reassociated, the loop vectorises)."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * 0.0
    return 0 if s == 0.0 else 1


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _drive(fptr, fkind, fidx, optr, omono, ocoef, targets, u, f, R, src, nf, h, p, out, L, W, P, C, zslots, B,
           uc, fc, sc, ob):
    """Chunks of ``B`` lanes: gather the chunk's state rows and field rows
    (stride = the chunk's lanes), run the kernel into a chunk buffer ``ob``
    (``P*B`` values: the kernel's scattered tile stores stay in cache),
    check it, copy it into the chunk's tiles (one contiguous run of ``out``).
    Measured on GEOS-Chem kinetics, 10⁴ cells: 96 ms this way against 147
    with the kernel storing into ``out`` itself."""
    n_u = uc.shape[0] // B
    nr = src.shape[0]
    bad = 0
    for l0 in range(0, L, B):
        m = min(B, L - l0)
        cm = min(B, C - l0)
        ucm = uc[:n_u * m]
        fcm = fc[:nr * m]
        for r in range(n_u):
            ucm[r * m:(r + 1) * m] = u[r * L + l0:r * L + l0 + m]
        for k in range(nr):
            s = src[k]
            if s < nf:
                fcm[k * m:(k + 1) * m] = f[s * L + l0:s * L + l0 + m]
            else:
                fcm[k * m:(k + 1) * m] = R[(s - nf) * L + l0:(s - nf) * L + l0 + m]
        n = (cm // W) * P * W
        o = ob[:n]
        run_poly(fptr, fkind, fidx, optr, omono, ocoef, targets, ucm, fcm, h, p, o, m, W, P, cm, zslots,
                 BLOCK, sc)
        bad += _nonfinite(o)
        out[(l0 // W) * P * W:(l0 // W) * P * W + n] = o
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
