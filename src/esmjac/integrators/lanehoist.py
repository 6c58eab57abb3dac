"""Lane hoisting: a cell tape split into the part that depends on the state
and the part that does not (KPP's ``Update_RCONST``, done on the tape).

A mechanism's rate coefficients — ``A·exp(-E/T)``, Troe fall-offs,
photolysis and uptake rates — depend on per-cell fields (temperature,
number density) but not on the concentrations. An integrator that holds a
lane's fields constant over a chemistry step evaluates the right-hand side
and the Jacobian many times per step (Rodas3: three right-hand sides and
one Jacobian per attempt) and would recompute every rate each time.
:func:`split` cuts a body tape at that boundary: the *lane prologue*
computes each state-independent value that a state-dependent instruction
(or a store) reads — the frontier — into an extra per-lane field row, and
the new body reads that row (``lane_f``) where it used to compute the value.

The lane prologue runs the original instructions on the same operands, so
every value, and therefore every stored result, has the same bits as the
unsplit tape's. Leaves (constants, parameters, hoisted parameter-only
values, fields, cell indices, time) are not rows: reading them costs what
reading a row would. Time counts as state-dependent (a lane's stage time
changes within a step), so nothing that reads it is hoisted.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..compile.ssa import Block
from ..compile.tape import OPS, Tape, encode
from ..compile.massaction import PolyBody, expand
from .lanetape import encode_fused

__all__ = ["LaneSplit", "split"]

_LEAVES = {"const", "hoist", "param", "time", "idx", "lane_u", "lane_f"}
_UNARY = {"neg", "not", "exp", "log", "log10", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
          "cosh", "tanh", "abs", "sign", "floor", "ceil", "asinh", "acosh", "atanh"}


@dataclass(frozen=True, eq=False)
class LaneSplit:
    """A body tape cut at the state: ``prologue`` (None when nothing is
    hoisted) stores frontier value ``k`` into field row ``row0 + k``
    (lanes-fastest, ``f[(row0 + k)*L + l]``); ``body`` reads those rows
    instead of computing them; ``rows`` is the number of rows added."""

    prologue: Tape | None
    body: Tape
    row0: int
    rows: int
    scheduled: Tape | None = None   # ``body`` re-scheduled for few registers (integrators.lanetape)
    poly: PolyBody | None = None    # ``body`` as a sum of monomials, when it is one (compile.massaction)


def _ssa(tape: Tape) -> tuple:
    """(instructions, stores) of ``tape`` in :class:`Block` form: one value
    per defining row (registers resolved), stores as (value, target)."""
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
        elif name in _UNARY:
            ins.append((name, (cur[a],)))
        else:
            ins.append((name, (cur[a], cur[b])))
        cur[d] = len(ins) - 1
    return ins, stores


def _is_leaf(op: str) -> bool:
    return op in ("const", "hoist", "param", "time", "idx", "lane")


def _args(op: str, args: tuple) -> tuple:
    return () if _is_leaf(op) else args


def split(tape: Tape, row0: int) -> LaneSplit:
    """``tape`` (a cell body: ``store`` rows, no ``storeh``) cut at the state
    (module docstring); the hoisted rows start at field row ``row0``."""
    ins, stores = _ssa(tape)
    var = [False] * len(ins)
    for v, (op, args) in enumerate(ins):
        if op == "time" or (op == "lane" and args[0] == "u"):
            var[v] = True
        elif not _is_leaf(op):
            var[v] = any(var[a] for a in args)
    frontier: dict = {}                 # value -> row offset (first use order)

    def mark(v):
        if not var[v] and not _is_leaf(ins[v][0]) and v not in frontier:
            frontier[v] = len(frontier)

    for v, (op, args) in enumerate(ins):
        if var[v]:
            for a in _args(op, args):
                mark(a)
    for v, _ in stores:
        mark(v)
    if not frontier:
        blk = Block()
        blk.ins.extend(ins)
        sched = encode_fused(blk, stores, fuse=False)
        return LaneSplit(None, tape, int(row0), 0, sched, expand(ins, stores, sched.code.shape[0]))
    # the body: frontier values become row reads, everything they alone
    # needed drops out (encode keeps only what the stores need)
    body = Block()
    for v, (op, args) in enumerate(ins):
        if v in frontier:
            body.ins.append(("lane", ("f", int(row0) + frontier[v])))
        else:
            body.ins.append((op, args))
    pro = Block()
    pro.ins.extend(ins)
    sched = encode_fused(body, stores, fuse=False)
    return LaneSplit(encode(pro, [(v, int(row0) + k) for v, k in frontier.items()]),
                     encode(body, stores), int(row0), len(frontier), sched,
                     expand(body.ins, stores, sched.code.shape[0]))

