"""The model as data: an instruction tape over lane vectors.

Generated source compiles in time that grows with the model (≈5 s per
400-statement chunk here), so large mechanisms run as a *tape* instead: the
same SSA, register-allocated (linear scan: a register is reused after its
value's last use) and encoded as rows ``(op, dst, a, b, c)``, executed by one
interpreter kernel compiled once and cached forever. Each work item is a
chunk of lanes, and each instruction is a unit-stride loop over the chunk,
so dispatch is amortized over :data:`CHUNK` lanes. Cell programs only
(global programs read at computed offsets and stay generated code).

Stores go lanes-fastest (``out[a*L + l]``: the band slab, the right-hand
side; ``W = 0``) or straight into a tiled plan's slots (``W > 0``: slot
``a`` of lane ``l`` at ``((l // W)*P + a)*W + l % W``, docs/design.rst §4), for all
``C`` stored lanes (``C`` ≥ ``L``: padding lanes read the last lane), with
the slots ``zslots`` no band reaches written as zero.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from ..errors import JacError
from .ssa import Block, operands

__all__ = ["Tape", "encode", "run_tape", "check_tape", "retarget", "in_store_order", "TapeBounds", "CHUNK", "OPS",
           "unary_op", "rare_op", "zero_slots"]

CHUNK = 256
OPS = ["const", "hoist", "param", "time", "idx", "lane_u", "lane_f", "store", "storeh",
       "+", "-", "*", "/", "pow", "neg", "select", "<", "<=", ">", ">=", "==", "!=",
       "and", "or", "not", "min", "max", "exp", "log", "log10", "sqrt", "sin", "cos", "tan",
       "asin", "acos", "atan", "sinh", "cosh", "tanh", "abs", "sign", "floor", "ceil",
       "atan2", "asinh", "acosh", "atanh"]
_OPC = {o: i for i, o in enumerate(OPS)}


class Tape:
    """Encoded instructions (``code``: int64 rows), constants and register
    count. Both arrays are read-only from construction on: a tape is a build
    product, and a fresh tape and one loaded from the cache (read-only) then
    reach :func:`run_tape` with the same Numba signature — one compile (about
    20 s of CPU for the parallel interpreter), not one per writability."""

    def __init__(self, code: np.ndarray, consts: np.ndarray, nreg: int):
        code.setflags(write=False)
        consts.setflags(write=False)
        self.code = code
        self.consts = consts
        self.nreg = nreg

    def digest_parts(self) -> tuple:
        """The tape's content (instructions, constants, register count) as
        strings for a content hash: two tapes with equal parts compute the
        same values."""
        return (self.code.tobytes().hex(), self.consts.tobytes().hex(), str(int(self.nreg)))

    def listing(self) -> str:
        """Readable form (``esmjac kernel --tape``)."""
        out = []
        for i, (o, d, a, b, c) in enumerate(self.code.tolist()):
            name = OPS[o]
            if name == "const":
                out.append(f"{i:6d}  r{d} = {self.consts[a]!r}")
            elif name in ("hoist", "param", "idx"):
                out.append(f"{i:6d}  r{d} = {name}[{a}]")
            elif name in ("lane_u", "lane_f"):
                out.append(f"{i:6d}  r{d} = {name[-1]}[{a}*L + l]")
            elif name == "store":
                out.append(f"{i:6d}  out[{a}*L + l] = r{d}")
            elif name == "storeh":
                out.append(f"{i:6d}  h[{a}] = r{d}")
            elif name == "select":
                out.append(f"{i:6d}  r{d} = r{b} if r{a} else r{c}")
            else:
                out.append(f"{i:6d}  r{d} = {name}(r{a}" + (f", r{b})" if b >= 0 else ")"))
        return "\n".join(out)


def encode(blk: Block, stores: list, store_op: str = "store") -> Tape:
    """Tape of ``blk`` whose values ``stores`` ((value id, target), …) are
    written out; unused values are dropped."""
    ins = blk.ins
    need = live(ins, stores)
    last = {}
    for v, (op, args) in enumerate(ins):
        if need[v]:
            for a in _operands(op, args):
                last[a] = v
    store_at: dict = {}
    for v, tgt in stores:
        store_at.setdefault(v, []).append(tgt)
    consts: list = []
    cpos: dict = {}
    reg: dict = {}
    free: list = []
    nreg = 0
    rows: list = []
    for v, (op, args) in enumerate(ins):
        if not need[v]:
            continue
        srcs = [reg[a] for a in _operands(op, args)]
        for a in set(_operands(op, args)):        # operands dying here
            if last.get(a) == v:
                free.append(reg[a])
        if free:
            d = free.pop()
        else:
            d = nreg
            nreg += 1
        reg[v] = d
        rows.append(_row(op, args, d, srcs, consts, cpos))
        for tgt in store_at.get(v, ()):
            rows.append((_OPC[store_op], d, tgt, -1, -1))
        if v not in last:                         # stored only: dead now
            free.append(d)
    code = np.array(rows, dtype=np.int64).reshape(-1, 5)
    return Tape(code, np.array(consts or [0.0], dtype=np.float64), max(nreg, 1))


# ------------------------------------------------------------------ stored tapes
#
# A tape read back from the cache is data that drives an interpreter compiled
# without bounds checks, so every operand is checked against the arrays the
# program will pass before the tape is used: a tampered or truncated file can
# make :func:`check_tape` refuse it (a cache miss and a rebuild), never make
# run_tape read or write outside its arrays.

_REG1 = [_OPC[o] for o in ("neg", "not", "exp", "log", "log10", "sqrt", "sin", "cos", "tan", "asin",
                            "acos", "atan", "sinh", "cosh", "tanh", "abs", "sign", "floor", "ceil",
                            "asinh", "acosh", "atanh")]
_REG2 = [_OPC[o] for o in ("+", "-", "*", "/", "pow", "<", "<=", ">", ">=", "==", "!=", "and", "or",
                            "min", "max", "atan2")]
#: Every instruction check_tape knows the operands of (a new instruction must
#: be added to its checks, else stored tapes using it are refused).
_KNOWN = [_OPC[o] for o in ("const", "hoist", "param", "time", "idx", "lane_u", "lane_f", "store", "storeh",
                             "select")] + _REG1 + _REG2
#: Register count above which a stored tape is refused (a register row is
#: CHUNK float64 values: this caps run_tape's scratch at 512 MiB).
MAX_REGISTERS = 1 << 18


class TapeBounds:
    """What one tape may address: the sizes of the arrays run_tape gets
    (constants are the tape's own). ``stores`` bounds ``store`` targets
    (output rows of a lanes-fastest store, ``out[a*L + l]``); a prologue
    (``prologue=True``) may only read parameters, time, constants and
    hoisted values and write hoisted values."""

    __slots__ = ("n_hoist", "n_params", "n_states", "n_forcing", "n_cix", "stores", "prologue")

    def __init__(self, *, n_hoist: int, n_params: int, n_states: int, n_forcing: int, n_cix: int,
                 stores: int, prologue: bool = False):
        self.n_hoist, self.n_params, self.n_states = int(n_hoist), int(n_params), int(n_states)
        self.n_forcing, self.n_cix, self.stores = int(n_forcing), int(n_cix), int(stores)
        self.prologue = bool(prologue)


def _refused(why: str) -> JacError:
    return JacError("cache_error", f"a stored tape was refused: {why}")


def check_tape(code, consts, nreg, bounds: TapeBounds) -> Tape:
    """A :class:`Tape` of ``code``/``consts``/``nreg`` once every
    instruction is checked against ``bounds``; otherwise the first violation
    named (dtype, shape, opcode, register or operand
    out of range), a ``cache_error``: a stored tape that fails is never
    run. Arrays are copied into fresh read-only ones."""
    if not isinstance(code, np.ndarray) or code.dtype != np.int64 or code.ndim != 2 or code.shape[1] != 5:
        raise _refused("tape code must be an int64 array of shape (n, 5)")
    if not isinstance(consts, np.ndarray) or consts.dtype != np.float64 or consts.ndim != 1 \
            or consts.shape[0] < 1:
        raise _refused("tape constants must be a non-empty float64 vector")
    if isinstance(nreg, bool) or not isinstance(nreg, (int, np.integer)) or not 1 <= nreg <= MAX_REGISTERS:
        raise _refused(f"tape register count {nreg!r} out of range")
    code = np.array(code, dtype=np.int64, order="C")
    consts = np.array(consts, dtype=np.float64, order="C")
    o, d, a, b, c = (code[:, k] for k in range(5))

    def need(mask, x, hi, what):
        bad = mask & ((x < 0) | (x >= hi))
        if bad.any():
            i = int(np.argmax(bad))
            raise _refused(f"tape row {i} ({OPS[o[i]]}): {what} {int(x[i])} outside [0, {hi})")

    if ((o < 0) | (o >= len(OPS))).any():
        i = int(np.argmax((o < 0) | (o >= len(OPS))))
        raise _refused(f"tape row {i}: opcode {int(o[i])} is not an instruction")
    unknown = ~np.isin(o, _KNOWN)          # an instruction whose operands are not checked here
    if unknown.any():
        i = int(np.argmax(unknown))
        raise _refused(f"tape row {i}: instruction {OPS[o[i]]} has no operand check")
    everything = np.ones(o.shape, bool)
    need(everything, d, nreg, "register")
    B = bounds
    need(o == _OPC["const"], a, consts.shape[0], "constant")
    need(o == _OPC["hoist"], a, B.n_hoist, "hoisted value")
    need(o == _OPC["param"], a, B.n_params, "parameter")
    need(o == _OPC["storeh"], a, B.n_hoist, "hoisted value")
    lane = np.isin(o, [_OPC["idx"], _OPC["lane_u"], _OPC["lane_f"], _OPC["store"]])
    if B.prologue and lane.any():
        i = int(np.argmax(lane))
        raise _refused(f"tape row {i} ({OPS[o[i]]}): a prologue reads and writes no lanes")
    need(o == _OPC["idx"], a, B.n_cix, "cell dimension")
    need(o == _OPC["lane_u"], a, B.n_states, "state")
    need(o == _OPC["lane_f"], a, B.n_forcing, "forcing field")
    need(o == _OPC["store"], a, B.stores, "output row")
    one = np.isin(o, _REG1)
    two = np.isin(o, _REG2)
    sel = o == _OPC["select"]
    need(one | two | sel, a, nreg, "register")
    need(two | sel, b, nreg, "register")
    need(sel, c, nreg, "register")
    code.setflags(write=False)
    consts.setflags(write=False)
    return Tape(code, consts, int(nreg))


def retarget(tape: Tape, dest) -> Tape | None:
    """``tape`` with store ``k`` writing ``dest[k]`` instead (a plan's slot),
    or None when two stores would land in one slot (then the slot needs a
    sum: :func:`codegen.tape_program` with ``dest``), its instructions in
    slot order (:func:`in_store_order`). Bit-identical to the tape generated
    with ``dest``: the same instructions on the same operands; only the
    targets, the order and the register numbers differ."""
    dest = np.asarray(dest, dtype=np.int64)
    code = tape.code.copy()
    st = code[:, 0] == _OPC["store"]
    tgt = code[st, 2]
    if tgt.size and (tgt.min() < 0 or tgt.max() >= dest.shape[0]):
        return None
    if np.unique(dest).shape[0] != dest.shape[0]:
        return None
    code[st, 2] = dest[tgt]
    ordered = in_store_order(code)
    if ordered is not None:
        code, nreg = ordered
    else:
        nreg = tape.nreg
    code.setflags(write=False)
    return Tape(code, tape.consts, nreg)


def rename_stores(tape: Tape, slot) -> Tape:
    """``tape`` with store ``k``'s target ``a`` written to ``slot[a]``
    instead, every instruction kept in its place (unlike :func:`retarget`):
    what is cut from or expanded out of the tape (the leaf's hoisted rows,
    the mass-action expansion) then numbers everything as for ``tape``, so
    the bits are ``tape``'s in every route. For a storage order of the same
    slots (``slot`` a permutation)."""
    slot = np.asarray(slot, dtype=np.int64)
    code = tape.code.copy()
    st = code[:, 0] == _OPC["store"]
    code[st, 2] = slot[code[st, 2]]
    code.setflags(write=False)
    return Tape(code, tape.consts, tape.nreg)


#: Instructions that read no register (their operand is an index).
_LEAF = [_OPC[o] for o in ("const", "hoist", "param", "time", "idx", "lane_u", "lane_f")]


def in_store_order(code: np.ndarray) -> tuple | None:
    """``(code, nreg)``: the instructions of ``code`` (a body tape's rows)
    re-ordered so that its stores come in increasing target order, each
    value computed when the first store that needs it is due, and the
    registers allocated again (linear scan, as :func:`encode`); None when
    the tape has an instruction this pass does not know the operands of.
    Every value is the same instruction on the same operand values, so the
    bits are those of ``code``. Why: a tiled plan's slot ``a`` of a tile is
    ``W`` lanes at ``a*W`` in a block of ``P*W`` values per tile, so stores
    in the SSA order (species by species) land in random places of a block
    far larger than a cache (GEOS-Chem: 3,849 slots, 492 kB per tile of 16
    lanes, 16 tiles per 256-lane chunk) and each misses; in slot order each
    tile is written front to back, a stream the prefetcher follows
    (GEOS-Chem fullchem kinetics at 2,000 cells: 27.5 -> 19 ms per call)."""
    n = code.shape[0]
    o = code[:, 0]
    if not np.isin(o, _LEAF + _REG1 + _REG2 + [_OPC["store"], _OPC["select"]]).all():
        return None
    rows = code.tolist()
    cur: dict = {}                      # register -> the row now holding its value
    args: list = [()] * n               # row -> the rows whose values it reads
    stores: list = []                   # (target, value row, store row)
    one, two, sel, store = set(_REG1), set(_REG2), _OPC["select"], _OPC["store"]
    for i, (op, d, a, b, c) in enumerate(rows):
        if op == store:
            stores.append((a, cur[d], i))
            continue
        if op in one:
            args[i] = (cur[a],)
        elif op in two:
            args[i] = (cur[a], cur[b])
        elif op == sel:
            args[i] = (cur[a], cur[b], cur[c])
        cur[d] = i
    if not stores:
        return None
    stores.sort()                       # by target; equal targets keep their order
    done = [False] * n
    order: list = []                    # value rows; a store row k as ~k after its value
    for _, v, si in stores:
        stack = [(v, 0)]
        while stack:                    # its operands first, depth first
            x, k = stack.pop()
            if done[x]:
                continue
            ax = args[x]
            while k < len(ax) and done[ax[k]]:
                k += 1
            if k < len(ax):
                stack.append((x, k + 1))
                stack.append((ax[k], 0))
                continue
            done[x] = True
            order.append(x)
        order.append(~si)
    value_of = {si: v for _, v, si in stores}
    last: dict = {}                     # value row -> position of its last reader
    for pos, x in enumerate(order):
        for a in (args[x] if x >= 0 else (value_of[~x],)):
            last[a] = pos
    reg: dict = {}
    free: list = []
    nreg = 0
    out = []
    for pos, x in enumerate(order):
        if x < 0:
            v = value_of[~x]
            out.append((store, reg[v], rows[~x][2], -1, -1))
            if last[v] == pos:
                free.append(reg[v])
            continue
        ax = args[x]
        srcs = [reg[a] for a in ax]
        for a in set(ax):               # operands dying here
            if last[a] == pos:
                free.append(reg[a])
        if free:
            d = free.pop()
        else:
            d = nreg
            nreg += 1
        reg[x] = d
        op, _, a, b, c = rows[x]
        s3 = srcs + [-1, -1, -1]
        out.append((op, d, a, b, c) if not ax else (op, d, s3[0], s3[1], s3[2]))
    return np.array(out, dtype=np.int64).reshape(-1, 5), max(nreg, 1)


def live(ins: list, stores: list, strict: bool = True) -> list:
    """Which of the SSA values ``ins`` the stores ((value id, target), …)
    need, transitively through every argument of a non-leaf instruction;
    ``strict`` refuses computed-offset reads (what a tape cannot run)."""
    need = [False] * len(ins)
    stack = [v for v, _ in stores]
    while stack:
        v = stack.pop()
        if need[v]:
            continue
        need[v] = True
        op, args = ins[v]
        if strict:
            stack.extend(_operands(op, args))
        else:
            stack.extend(operands(op, args))
    return need


def _operands(op: str, args: tuple) -> tuple:
    if op in ("gload", "table"):
        raise JacError("unsupported_construct", "computed-offset reads are not taped")
    return operands(op, args)


def _row(op, args, d, srcs, consts, cpos) -> tuple:
    if op == "const":
        x = float(args[0])
        k = cpos.get(x)
        if k is None:
            k = cpos[x] = len(consts)
            consts.append(x)
        return (_OPC["const"], d, k, -1, -1)
    if op in ("hoist", "param", "idx"):
        return (_OPC[op], d, int(args[0]), -1, -1)
    if op == "time":
        return (_OPC["time"], d, -1, -1, -1)
    if op == "lane":
        return (_OPC["lane_u" if args[0] == "u" else "lane_f"], d, int(args[1]), -1, -1)
    if op not in _OPC:
        raise JacError("unsupported_construct", f"`{op}` has no tape instruction")
    s = list(srcs) + [-1, -1, -1]
    return (_OPC[op], d, s[0], s[1], s[2])


@nb.njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def run_tape(code, consts, u, f, p, t, h, cix, out, L, nreg, W, P, C, zslots):
    """Execute ``code`` for lanes ``0..C-1`` (see module docstring); the
    number of non-finite values stored into ``out`` (counted while they are
    in registers, ``x - x`` is NaN for inf and NaN: the caller needs no
    second pass over ``out``, which with LU fill-in can be most of a call's
    memory traffic). The parallel loop is only this: each work item is one
    call of :func:`_run_chunk` (compiled once, shared with the serial twin;
    a chunk body inside the ``prange`` made Numba's parfor passes take most
    of a cold build)."""
    nch = (C + CHUNK - 1) // CHUNK
    bad = np.zeros(nch, dtype=np.int64)          # per work item (no parfor reduction)
    for ch in nb.prange(nch):
        # ch as int64: a prange index is uint64, the serial twin's int64, and
        # each type compiled its own _run_chunk (~10 s of CPU when a process
        # runs both interpreters)
        bad[ch] = _run_chunk(code, consts, u, f, p, t, h, cix, out, L, nreg, W, P, C, zslots, nb.int64(ch))
    return bad.sum()


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _run_chunk(code, consts, u, f, p, t, h, cix, out, L, nreg, W, P, C, zslots, ch):
    """Work item ``ch`` of :func:`run_tape`: lanes ``ch*CHUNK`` up to
    ``C``, every instruction a unit-stride loop over them; the number of
    non-finite values stored."""
    nbad = 0
    l0 = ch * CHUNK
    m = min(C, l0 + CHUNK) - l0
    R = np.empty((nreg, CHUNK), dtype=np.float64)
    # The same registers as one flat row-major vector, addressed with unsigned
    # offsets in the arithmetic and lane reads: no negative-index wraparound
    # per access (≈ 7 % each on GEOS-Chem's Jacobian body; the same values).
    F = R.reshape(nreg * CHUNK)
    # Tiled stores: lane j of this chunk lands at pos[j] + slot*W; the
    # divisions by W are done once per chunk here, not once per store
    # instruction and lane (a runtime divide costs tens of cycles).
    pos = np.empty(CHUNK, dtype=np.int64)
    if W > 0:
        for j in range(m):
            l = l0 + j
            pos[j] = (l // W) * P * W + l % W
    # Slots no band reaches, zeroed
    if W > 0:
        zero_slots(out, zslots, l0, m, W, P)
    # whole tiles in this chunk: stores go tile by tile, W contiguous lanes
    whole = W > 0 and l0 % W == 0 and m % W == 0
    inside = l0 + m <= L             # no padding lane in this chunk: lane reads need no clamp
    for i in range(code.shape[0]):
        o = code[i, 0]
        d = code[i, 1]
        a = code[i, 2]
        b = code[i, 3]
        c = code[i, 4]
        if o == 0:
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
                R[d, j] = cix[a * L + min(l0 + j, L - 1)]
        elif o == 5:
            if inside:                   # a plain copy (vectorised), no clamp
                ub = nb.uint64(a * L + l0)
                db = nb.uint64(d * CHUNK)
                for j in range(m):
                    F[db + nb.uint64(j)] = u[ub + nb.uint64(j)]
            else:
                for j in range(m):
                    R[d, j] = u[a * L + min(l0 + j, L - 1)]
        elif o == 6:
            if inside:
                ub = nb.uint64(a * L + l0)
                db = nb.uint64(d * CHUNK)
                for j in range(m):
                    F[db + nb.uint64(j)] = f[ub + nb.uint64(j)]
            else:
                for j in range(m):
                    R[d, j] = f[a * L + min(l0 + j, L - 1)]
        elif o == 7:
            if W == 0:
                for j in range(m):
                    out[a * L + l0 + j] = R[d, j]
            elif whole:
                for tt in range(m // W):
                    ob = nb.uint64(((l0 // W + tt) * P + a) * W)
                    jb = tt * W
                    for k in range(W):
                        out[ob + nb.uint64(k)] = R[d, jb + k]
            else:
                aw = a * W
                for j in range(m):
                    out[pos[j] + aw] = R[d, j]
            for j in range(m):
                x = R[d, j]
                if x - x != 0.0:
                    nbad += 1
        elif o == 8:
            h[a] = R[d, 0]
        elif o == 9:
            do, ao, bo = nb.uint64(d * CHUNK), nb.uint64(a * CHUNK), nb.uint64(b * CHUNK)
            for j in range(m):
                ju = nb.uint64(j)
                F[do + ju] = F[ao + ju] + F[bo + ju]
        elif o == 10:
            do, ao, bo = nb.uint64(d * CHUNK), nb.uint64(a * CHUNK), nb.uint64(b * CHUNK)
            for j in range(m):
                ju = nb.uint64(j)
                F[do + ju] = F[ao + ju] - F[bo + ju]
        elif o == 11:
            do, ao, bo = nb.uint64(d * CHUNK), nb.uint64(a * CHUNK), nb.uint64(b * CHUNK)
            for j in range(m):
                ju = nb.uint64(j)
                F[do + ju] = F[ao + ju] * F[bo + ju]
        elif o == 12:
            do, ao, bo = nb.uint64(d * CHUNK), nb.uint64(a * CHUNK), nb.uint64(b * CHUNK)
            for j in range(m):
                ju = nb.uint64(j)
                F[do + ju] = F[ao + ju] / F[bo + ju]
        else:
            rare_op(o, R, d, a, b, c, m)
    return nbad


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def zero_slots(out, zslots, l0, m, W, P):
    """Slots ``zslots`` (sorted) of lanes ``l0..l0+m-1`` of a tiled plan's
    ``out`` (``W`` > 0 lanes per tile, ``P`` slots) set to zero: per tile, a
    run of consecutive zero slots is one contiguous block of run × W values
    (a memset, not one indexed store per slot and lane: LU fill-in can be
    most slots). Shared by both tape interpreters."""
    nz = zslots.shape[0]
    if nz == 0 or m <= 0:
        return
    for tt in range(l0 // W, (l0 + m - 1) // W + 1):
        a0 = max(l0, tt * W) - tt * W
        a1 = min(l0 + m, (tt + 1) * W) - tt * W
        base = tt * P * W
        z = 0
        while z < nz:
            s0 = zslots[z]
            s1 = s0 + 1
            z += 1
            while z < nz and zslots[z] == s1:
                s1 += 1
                z += 1
            # unsigned offsets: no wraparound select per store (vector stores)
            if a0 == 0 and a1 == W:
                zb = nb.uint64(base + s0 * W)
                for k in range((s1 - s0) * W):
                    out[zb + nb.uint64(k)] = 0.0
            else:
                for s in range(s0, s1):
                    zb = nb.uint64(base + s * W + a0)
                    for k in range(a1 - a0):
                        out[zb + nb.uint64(k)] = 0.0


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def rare_op(o, R, d, a, b, c, m):
    """Register row ``d`` of ``R`` (lanes ``0..m-1``) for the instructions
    past the arithmetic and the loads — ``pow``, ``neg``, ``select``, the
    comparisons and logic, ``min``/``max``, ``atan2`` and the unary
    functions — from rows ``a``, ``b``, ``c``: shared by both tape
    interpreters (this one and the leaf's ``integrators/lanetape``), so an
    instruction means the same bits everywhere."""
    if o == 13:
        for j in range(m):
            R[d, j] = R[a, j] ** R[b, j]
    elif o == 14:
        for j in range(m):
            R[d, j] = -R[a, j]
    elif o == 15:
        for j in range(m):
            R[d, j] = R[b, j] if R[a, j] != 0.0 else R[c, j]
    elif o <= 21:
        for j in range(m):
            x = R[a, j]
            y = R[b, j]
            if o == 16:
                r = x < y
            elif o == 17:
                r = x <= y
            elif o == 18:
                r = x > y
            elif o == 19:
                r = x >= y
            elif o == 20:
                r = x == y
            else:
                r = x != y
            R[d, j] = 1.0 if r else 0.0
    elif o == 22:
        for j in range(m):
            R[d, j] = 1.0 if (R[a, j] != 0.0 and R[b, j] != 0.0) else 0.0
    elif o == 23:
        for j in range(m):
            R[d, j] = 1.0 if (R[a, j] != 0.0 or R[b, j] != 0.0) else 0.0
    elif o == 24:
        for j in range(m):
            R[d, j] = 0.0 if R[a, j] != 0.0 else 1.0
    elif o == 25:
        for j in range(m):
            R[d, j] = min(R[a, j], R[b, j])
    elif o == 26:
        for j in range(m):
            R[d, j] = max(R[a, j], R[b, j])
    elif o == 44:
        for j in range(m):
            R[d, j] = np.arctan2(R[a, j], R[b, j])
    else:
        for j in range(m):
            R[d, j] = unary_op(o, R[a, j])


@nb.njit(cache=True, nogil=True, error_model="numpy", inline="always")
def unary_op(o, x):
    """The unary op ``o`` (27-47 in :data:`OPS`) of one value: shared by every
    tape interpreter (this one and the leaf's ``integrators/lanetape``), so an
    op means the same bits everywhere."""
    if o == 27:
        return np.exp(x)
    if o == 28:
        return np.log(x)
    if o == 29:
        return np.log10(x)
    if o == 30:
        return np.sqrt(x)
    if o == 31:
        return np.sin(x)
    if o == 32:
        return np.cos(x)
    if o == 33:
        return np.tan(x)
    if o == 34:
        return np.arcsin(x)
    if o == 35:
        return np.arccos(x)
    if o == 36:
        return np.arctan(x)
    if o == 37:
        return np.sinh(x)
    if o == 38:
        return np.cosh(x)
    if o == 39:
        return np.tanh(x)
    if o == 40:
        return abs(x)
    if o == 41:
        return 1.0 if x > 0.0 else (-1.0 if x < 0.0 else 0.0)
    if o == 42:
        return np.floor(x)
    if o == 43:
        return np.ceil(x)
    if o == 45:
        return np.arcsinh(x)
    if o == 46:
        return np.arccosh(x)
    return np.arctanh(x)
