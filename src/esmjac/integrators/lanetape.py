"""The leaf's body tapes: re-scheduled for few live registers, optionally with
fused operands (arithmetic that reads a state or field row, or a constant,
in place instead of a copy in a register), and the one-thread interpreter
that runs them.

What the leaf uses (measured on GEOS-Chem fullchem, 64 lanes, load 12–15,
``benchmarks/RESULTS.md``): the plain instructions in the register-frugal
order (:func:`encode_fused` with ``fuse=False``) on :func:`run_fused`,
whose registers are rows of the call's own lane count, not of
``tape.CHUNK`` (0.5 MB instead of 3.3 MB of registers for the RHS): the RHS
6.4 µs per lane per call against 9.1 on ``run_tape``'s serial twin. Fused
operands cut the instructions by 20 % but measured 10–25 % slower than the
plain instructions on the same interpreter, so they are not the default.

After lane hoisting (:mod:`esmjac.integrators.lanehoist`) a mass-action
body is mostly ``k·A·B`` products and their sums: on the plain tape
(:mod:`esmjac.compile.tape`) each operand ``A``, ``B``, ``k`` is a load
instruction — a copy of the lane row into a register — before the multiply,
so about half of the instructions move data and every instruction pays the
interpreter's dispatch. :func:`encode_fused` encodes a body so that ``+``,
``-``, ``*`` and ``/`` take either operand from a register, a state row
(``u``) or a field row (``f``); a load survives only where another kind of
instruction (a power, a function, a store) reads the value.
:func:`run_fused` runs such a tape on one thread. Each lane sees the same
operations on the same operands as on the plain tape, so the bits are
those of :func:`esmjac.compile.tape.run_tape`.

Lanes: arithmetic runs over the ``L`` real lanes only; a tiled store also
fills the padding lanes ``L..C-1`` of the last tile with lane ``L-1``'s
value (what the plain tape computes there: its reads clamp to lane
``L-1``).
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..compile.jitkeys import key_by_callees
from ..compile.ssa import Block, operands
from ..compile.tape import CHUNK, OPS, Tape, live, rare_op, zero_slots

__all__ = ["encode_fused", "run_fused", "FUSED_BASE", "CONST_BASE"]

_OPC = {o: i for i, o in enumerate(OPS)}
#: Fused arithmetic: opcode FUSED_BASE + 9*k + 3*ka + kb, k the operation
#: (+, -, *, /), ka/kb each operand's source (0 register, 1 state row, 2
#: field row; not both registers: that is the plain instruction); with a
#: constant operand CONST_BASE + 6*k + kx (``x op c``, operand ``a`` the row
#: or register, ``b`` the constant) or CONST_BASE + 6*k + 3 + kx (``c op x``,
#: ``a`` the constant).
FUSED_BASE = 100
CONST_BASE = 200
_ARITH = {"+": 0, "-": 1, "*": 2, "/": 3}


def encode_fused(blk: Block, stores: list, fuse: bool = True) -> Tape:
    """The fused tape of ``blk`` storing values ``stores`` ((value, target),
    …); see the module docstring. Register allocation as
    :func:`esmjac.compile.tape.encode` (a register is reused after its
    value's last use)."""
    ins = blk.ins

    consts: list = []
    cpos: dict = {}

    def const_index(x: float) -> int:
        k = cpos.get(x)
        if k is None:
            k = cpos[x] = len(consts)
            consts.append(x)
        return k

    def src(v):
        """(kind, index) when value ``v`` is read in place: a state or field
        row, or a constant."""
        op, args = ins[v]
        if not fuse:
            return None
        if op == "lane":
            return (1 if args[0] == "u" else 2), int(args[1])
        if op == "const":
            return 3, const_index(float(args[0]))
        return None

    def reads(v):
        """The values instruction ``v`` reads from registers."""
        op, args = ins[v]
        if op in _ARITH:
            return tuple(a for a in args if src(a) is None)
        return operands(op, args)

    need = live(ins, stores, strict=False)        # every operand's value is computed (rows are free)
    # a lane or constant leaf read only through fused operands needs no register
    regd = [False] * len(ins)
    for v, _ in stores:
        regd[v] = True
    for v in range(len(ins)):
        if need[v]:
            for a in reads(v):
                regd[a] = True
    for v, (op, _) in enumerate(ins):
        if need[v] and op not in ("lane", "const"):
            regd[v] = True
    # two schedules, the one needing fewer registers kept
    order = min((_schedule(ins, stores, regd, reads, terms) for terms in (False, True)),
                key=lambda o: _registers(o, reads))
    last: dict = {}
    for v in order:
        for a in reads(v):
            last[a] = v
    store_at: dict = {}
    for v, tgt in stores:
        store_at.setdefault(v, []).append(tgt)
    reg: dict = {}
    free: list = []
    nreg = 0
    rows: list = []
    for v in order:
        op, args = ins[v]
        rd = reads(v)
        for a in set(rd):
            if last.get(a) == v:
                free.append(reg[a])
        if free:
            d = free.pop()
        else:
            d = nreg
            nreg += 1
        reg[v] = d
        if op in _ARITH and len(rd) < 2:
            kinds, opnd = [], []
            for a in args:
                s = src(a)
                kinds.append(0 if s is None else s[0])
                opnd.append(reg[a] if s is None else s[1])
            if kinds[0] == 3 and kinds[1] == 3:         # folded at emission; never both
                raise ValueError("an operation on two constants")
            if kinds[1] == 3:
                rows.append((CONST_BASE + 6 * _ARITH[op] + kinds[0], d, opnd[0], opnd[1], -1))
            elif kinds[0] == 3:
                rows.append((CONST_BASE + 6 * _ARITH[op] + 3 + kinds[1], d, opnd[0], opnd[1], -1))
            else:
                rows.append((FUSED_BASE + 9 * _ARITH[op] + 3 * kinds[0] + kinds[1], d, opnd[0], opnd[1], -1))
        else:
            rows.append(_plain_row(op, args, d, [reg[a] for a in rd], const_index))
        for tgt in store_at.get(v, ()):
            rows.append((_OPC["store"], d, tgt, -1, -1))
        if v not in last:
            free.append(d)
    code = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return Tape(code, np.array(consts or [0.0], dtype=np.float64), max(nreg, 1))


def _registers(order, reads) -> int:
    """Registers the linear-scan allocation of ``order`` needs (its peak of
    live values)."""
    last: dict = {}
    for v in order:
        for a in reads(v):
            last[a] = v
    live = peak = 0
    for v in order:
        live += 1
        peak = max(peak, live)
        live -= sum(1 for a in set(reads(v)) if last.get(a) == v)
        if v not in last:
            live -= 1
    return peak


def _term_order(live, ops, ins) -> list:
    """Terms of the sums (``+``/``-`` chains: the operands that are not a
    chain's own partial sum) in an order every chain agrees with (Kahn's
    algorithm over consecutive terms of each chain, SSA order on ties;
    where chains disagree, the rest in SSA order): a mechanism's sums list
    their reactions in one order, so computing terms in it lets every sum
    take each term as soon as it exists."""
    import heapq

    chain = {v for v in live if ins[v][0] in ("+", "-") and len(ops[v]) == 2}
    seqs = []
    used_as_acc = {ops[v][0] for v in chain if ops[v][0] in chain}
    for v in chain:
        if v in used_as_acc:
            continue                                    # not a chain's end
        seq = []
        c = v
        while c in chain:
            a, b = ops[c]
            seq.append(b)
            if a not in chain:
                seq.append(a)
                break
            c = a
        seqs.append(seq[::-1])
    succ: dict = {}
    indeg: dict = {}
    for seq in seqs:
        for t in seq:
            indeg.setdefault(t, 0)
        for a, b in zip(seq, seq[1:]):
            if b not in succ.setdefault(a, set()):
                succ[a].add(b)
                indeg[b] += 1
    heap = [t for t, k in indeg.items() if k == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        t = heapq.heappop(heap)
        out.append(t)
        for b in succ.get(t, ()):
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(heap, b)
    if len(out) < len(indeg):                           # chains disagree somewhere
        seen = set(out)
        out.extend(sorted(t for t in indeg if t not in seen))
    return out


def _schedule(ins, stores, regd, reads, terms: bool = False) -> list:
    """A topological order of the register instructions that keeps few
    values live (any topological order computes the same values, so the
    same bits). The SSA order computes a mechanism's terms species by
    species, and a term shared by several species' sums waits in a register
    until the last of them: about 1,600 live values at 272 species (0.8 MB
    of registers at 64 lanes, past L2). Greedy instead: first any ready
    instruction that frees a register (a sum's next term is there) or is
    stored only; else the value the most partly computed instructions wait
    for, with its operands depth first; else the first ready instruction in
    SSA order."""
    import heapq

    n = len(ins)
    live = [v for v in range(n) if regd[v]]
    ops = {v: reads(v) for v in live}
    users: dict = {v: [] for v in live}
    for v in live:
        for a in ops[v]:
            users[a].append(v)
    left = {v: len(users[v]) for v in live}          # consumers not yet scheduled
    pending = {v: len(set(ops[v])) for v in live}    # distinct operands not yet computed
    done = [False] * n
    started = [False] * n                            # some operand computed
    want = [0] * n
    frees_h: list = []                               # ready and frees a register (or stored only)
    ready_h: list = []                               # ready
    want_h: list = []                                # (-want, v)
    order: list = []

    def frees(v) -> bool:
        return not users[v] or any(left[a] == 1 for a in ops[v])

    def ready(v):
        heapq.heappush(frees_h if frees(v) else ready_h, v)

    def emit(v):
        done[v] = True
        order.append(v)
        for a in set(ops[v]):
            left[a] -= ops[v].count(a)
            if left[a] == 1:                         # its last consumer now frees it
                for c in users[a]:
                    if not done[c] and pending[c] == 0:
                        heapq.heappush(frees_h, c)
        for c in dict.fromkeys(users[v]):
            pending[c] -= 1
            if pending[c] == 0:
                ready(c)
            elif not started[c]:
                started[c] = True
                for a in ops[c]:
                    if not done[a]:
                        want[a] += 1
                        heapq.heappush(want_h, (-want[a], a))

    def subtree(root):
        stack = [(root, 0)]
        while stack:
            v, k = stack.pop()
            if done[v]:
                continue
            rd = ops[v]
            while k < len(rd) and done[rd[k]]:
                k += 1
            if k < len(rd):
                stack.append((v, k + 1))
                stack.append((rd[k], 0))
                continue
            emit(v)

    for v in live:
        if pending[v] == 0:
            ready(v)
    tord = _term_order(live, ops, ins) if terms else []
    ti = 0
    while len(order) < len(live):
        while frees_h:
            v = heapq.heappop(frees_h)
            if not done[v] and pending[v] == 0:
                emit(v)
        while ti < len(tord) and done[tord[ti]]:
            ti += 1
        if ti < len(tord):
            subtree(tord[ti])
            continue
        while want_h:
            w, v = heapq.heappop(want_h)
            if not done[v] and -w == want[v]:
                subtree(v)
                break
        else:
            while ready_h:
                v = heapq.heappop(ready_h)
                if not done[v]:
                    emit(v)
                    break
            else:
                for v in live:                       # nothing ready: cannot happen in a DAG
                    if not done[v]:
                        subtree(v)
                        break
    del stores
    return order


def _plain_row(op, args, d, srcs, const_index) -> tuple:
    if op == "const":
        return (_OPC["const"], d, const_index(float(args[0])), -1, -1)
    if op in ("hoist", "param", "idx"):
        return (_OPC[op], d, int(args[0]), -1, -1)
    if op == "time":
        return (_OPC["time"], d, -1, -1, -1)
    if op == "lane":
        return (_OPC["lane_u" if args[0] == "u" else "lane_f"], d, int(args[1]), -1, -1)
    s = list(srcs) + [-1, -1, -1]
    return (_OPC[op], d, s[0], s[1], s[2])


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _bin(k, x, xo, y, yo, r, ro, m):
    """r[ro + j] = x[xo + j] (op k) y[yo + j], j < m (k: + - * /)."""
    if k == 2:
        for j in range(m):
            r[ro + j] = x[xo + j] * y[yo + j]
    elif k == 0:
        for j in range(m):
            r[ro + j] = x[xo + j] + y[yo + j]
    elif k == 1:
        for j in range(m):
            r[ro + j] = x[xo + j] - y[yo + j]
    else:
        for j in range(m):
            r[ro + j] = x[xo + j] / y[yo + j]


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _bin_s(k, x, xo, c, r, ro, m, rev):
    """r[ro + j] = x[xo + j] (op k) c, or c (op k) x[xo + j] when ``rev``."""
    if k == 2:
        for j in range(m):
            r[ro + j] = x[xo + j] * c      # (multiplication commutes bitwise)
    elif k == 0:
        for j in range(m):
            r[ro + j] = x[xo + j] + c
    elif rev:
        if k == 1:
            for j in range(m):
                r[ro + j] = c - x[xo + j]
        else:
            for j in range(m):
                r[ro + j] = c / x[xo + j]
    elif k == 1:
        for j in range(m):
            r[ro + j] = x[xo + j] - c
    else:
        for j in range(m):
            r[ro + j] = x[xo + j] / c


@nb.njit(cache=True, nogil=True, error_model="numpy")
def run_fused(code, consts, u, f, p, t, h, cix, out, L, nreg, W, P, C, zslots):
    """Execute a fused tape (:func:`encode_fused`) for lanes ``0..C-1`` on one
    thread; arguments as :func:`esmjac.compile.tape.run_tape` (``h`` holds
    the prologue's values: run the prologue tape first). The number of
    non-finite values stored."""
    nbad = 0
    CW = min(CHUNK, max(L, 1))                  # register row: the chunk's lanes
    R = np.empty((nreg, CW), dtype=np.float64)
    Rf = R.reshape(-1)                          # the same registers, flat (fused operands)
    pos = np.empty(CHUNK + W + 1, dtype=np.int64)
    for l0 in range(0, L, CHUNK):
        m = min(L, l0 + CHUNK) - l0             # real lanes: the arithmetic
        ms = (C - l0) if l0 + CHUNK >= L else m  # stored lanes: the last chunk pads to C
        whole = W > 0 and l0 % W == 0 and ms % W == 0
        if W > 0:
            for j in range(ms):
                ll = l0 + j
                pos[j] = (ll // W) * P * W + ll % W
            zero_slots(out, zslots, l0, ms, W, P)     # runs of zero slots: one block per tile
        for i in range(code.shape[0]):
            o = code[i, 0]
            d = code[i, 1]
            a = code[i, 2]
            b = code[i, 3]
            c = code[i, 4]
            if o >= 200:                       # one operand a constant
                q = o - 200
                k = q // 6
                kx = q % 3
                if (q % 6) < 3:                # x op c: x is operand a
                    sc = consts[b]
                    if kx == 0:
                        _bin_s(k, Rf, a * CW, sc, Rf, d * CW, m, False)
                    elif kx == 1:
                        _bin_s(k, u, a * L + l0, sc, Rf, d * CW, m, False)
                    else:
                        _bin_s(k, f, a * L + l0, sc, Rf, d * CW, m, False)
                else:                          # c op y: y is operand b
                    sc = consts[a]
                    if kx == 0:
                        _bin_s(k, Rf, b * CW, sc, Rf, d * CW, m, True)
                    elif kx == 1:
                        _bin_s(k, u, b * L + l0, sc, Rf, d * CW, m, True)
                    else:
                        _bin_s(k, f, b * L + l0, sc, Rf, d * CW, m, True)
            elif o >= 100:
                q = o - 100
                k = q // 9
                mode = q % 9
                oa = a * CW if mode < 3 else a * L + l0
                ob = b * CW if mode % 3 == 0 else b * L + l0
                if mode == 1:
                    _bin(k, Rf, oa, u, ob, Rf, d * CW, m)
                elif mode == 2:
                    _bin(k, Rf, oa, f, ob, Rf, d * CW, m)
                elif mode == 3:
                    _bin(k, u, oa, Rf, ob, Rf, d * CW, m)
                elif mode == 4:
                    _bin(k, u, oa, u, ob, Rf, d * CW, m)
                elif mode == 5:
                    _bin(k, u, oa, f, ob, Rf, d * CW, m)
                elif mode == 6:
                    _bin(k, f, oa, Rf, ob, Rf, d * CW, m)
                elif mode == 7:
                    _bin(k, f, oa, u, ob, Rf, d * CW, m)
                else:
                    _bin(k, f, oa, f, ob, Rf, d * CW, m)
            elif o == 11:
                for j in range(m):
                    R[d, j] = R[a, j] * R[b, j]
            elif o == 9:
                for j in range(m):
                    R[d, j] = R[a, j] + R[b, j]
            elif o == 10:
                for j in range(m):
                    R[d, j] = R[a, j] - R[b, j]
            elif o == 7:
                if W == 0:
                    for j in range(m):
                        out[a * L + l0 + j] = R[d, j]
                    for j in range(m, ms):
                        out[a * L + l0 + j] = R[d, m - 1]
                elif whole:                    # tile by tile: W contiguous lanes per store
                    rb = d * CW
                    for tt in range(ms // W):
                        ob = ((l0 // W + tt) * P + a) * W
                        jb = tt * W
                        if jb + W <= m:
                            for k in range(W):
                                out[ob + k] = Rf[rb + jb + k]
                        else:
                            for k in range(W):
                                out[ob + k] = Rf[rb + min(jb + k, m - 1)]
                else:
                    aw = a * W
                    for j in range(m):
                        out[pos[j] + aw] = R[d, j]
                    for j in range(m, ms):
                        out[pos[j] + aw] = R[d, m - 1]
                for j in range(m):
                    x = R[d, j]
                    if x - x != 0.0:
                        nbad += 1
                if ms > m:
                    x = R[d, m - 1]
                    if x - x != 0.0:
                        nbad += ms - m
            elif o == 14:
                for j in range(m):
                    R[d, j] = -R[a, j]
            elif o == 0:
                x = consts[a]
                for j in range(m):
                    R[d, j] = x
            elif o == 1:
                x = h[a]
                for j in range(m):
                    R[d, j] = x
            elif o == 2:
                x = p[a]
                for j in range(m):
                    R[d, j] = x
            elif o == 3:
                for j in range(m):
                    R[d, j] = t
            elif o == 4:
                for j in range(m):
                    R[d, j] = cix[a * L + l0 + j]
            elif o == 5:
                for j in range(m):
                    R[d, j] = u[a * L + l0 + j]
            elif o == 6:
                for j in range(m):
                    R[d, j] = f[a * L + l0 + j]
            elif o == 12:
                for j in range(m):
                    R[d, j] = R[a, j] / R[b, j]
            else:                              # pow, select, comparisons, functions: as run_tape
                rare_op(o, R, d, a, b, c, m)
    return nbad


# Numba keys a cached function by its own file: key these by what they link in from other
# modules too (compile/jitkeys.py), so an edit there is not served stale from a warm cache.
key_by_callees(globals())
