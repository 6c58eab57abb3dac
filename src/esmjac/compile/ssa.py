"""Straight-line SSA of scalar expressions over one evaluation point.

A :class:`Block` holds instructions ``(op, args)``; ``args`` are value ids,
except for the immediates of leaves (constants, loads). Structurally equal
subexpressions are one value (the expression nodes are hash-consed, so the
memo is by identity). *Uniform* subexpressions (no index name, no state or
forcing read: only scalar parameters, ``t`` and literals) are not computed
per point: they go to the program-wide prologue block and are read back as
``hoist(j)``, so parameter-only terms cost once per call.

Leaves: ``const(x)``, ``param(j)``, ``time()``, ``idx(d)`` (value of box
dimension ``d``; for cell lanes the cell index), ``lane(src, s)`` (the
lane-local read ``src[s*L + l]``, ``src`` ∈ ``u``/``f``), ``gload(src, base,
sizes, strides, *index value ids)`` (a clamped read of a flat array at an
index computed per point), ``hoist(j)``.

Constant folding happens as instructions are emitted (:meth:`Block.emit`):
an arithmetic operation on literals is its literal value (IEEE double, the
same bits the compiled code would compute), ``(-1)·x`` is ``-x`` and
``1·x`` is ``x`` (both exact), and a uniform value that folds to a literal
is that literal in the point code, never a slot of ``h``.
"""
from __future__ import annotations

import itertools
import math

from ..errors import JacError
from ..model.closed import expand_closed
from ..model.expr import AGG, Node, free_names, is_lit, node, substitute
from ..model.layout import strides as row_major_strides

__all__ = ["Block", "Lowering", "UNARY", "BINARY", "LEAVES", "operands", "const_table"]

UNARY = {"exp", "log", "log10", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan",
         "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "abs", "sign", "floor", "ceil",
         "neg", "not"}
BINARY = {"+", "*", "-", "/", "pow", "<", "<=", ">", ">=", "==", "!=", "and", "or",
          "min", "max", "atan2"}
#: Instructions whose arguments are immediates (an index, a constant), not values.
LEAVES = frozenset(("const", "hoist", "param", "time", "idx", "lane"))
MAX_UNROLL = 20000
#: 1/ln(10), the factor of log10 (:meth:`Block.emit`).
_INV_LN10 = 1.0 / math.log(10.0)


def operands(op: str, args: tuple) -> tuple:
    """The value ids instruction ``(op, args)`` reads: none for a leaf
    (:data:`LEAVES`), the offset and operands of a computed-offset read
    (``gload``: after its four immediates; ``table``: after two)."""
    if op in LEAVES:
        return ()
    if op == "gload":
        return tuple(args[4:])
    if op == "table":
        return tuple(args[2:])
    return tuple(args)


class Block:
    """An instruction list with value numbering (see module docstring)."""

    def __init__(self):
        self.ins: list = []
        self._memo: dict = {}

    def emit(self, op: str, *args) -> int:
        folded = self._fold(op, args)
        if folded is not None:
            return folded
        if op == "/" and len(args) == 2 and self.const_of(args[1]) is None and self.const_of(args[0]) != 1.0:
            # a / d as a · (1/d): one reciprocal per divisor, shared by
            # every quotient over it (a rate law's c/T and x/(R·T) in every
            # reaction: SuperFast 43 -> 12 divisions per cell); a division
            # costs 4-13 multiplications. One more rounding (a · (1/d) is
            # within about 1 ulp of a / d), the same on every lane, engine
            # and chunking (it is made here, before both engines).
            return self.emit("*", args[0], self.emit("/", self.emit("const", 1.0), args[1]))
        if op == "log10" and len(args) == 1:
            # log10(x) as ln(x) · (1/ln 10): glibc's log10 costs 10 ns here
            # against 6 for log (SuperFast's three fall-off factors); within
            # about 1 ulp of log10, the same on every lane and engine.
            return self.emit("*", self.emit("log", args[0]), self.emit("const", _INV_LN10))
        key = (op, args)
        v = self._memo.get(key)
        if v is None:
            v = len(self.ins)
            self.ins.append((op, args))
            self._memo[key] = v
        return v

    def __len__(self) -> int:
        return len(self.ins)

    def truncate(self, n: int) -> None:
        """Forget every instruction from ``n`` on (a lowering tried and
        withdrawn): value numbers below ``n`` and their memo entries stay,
        so the block is as it was when it held ``n`` instructions."""
        del self.ins[n:]
        self._memo = {k: v for k, v in self._memo.items() if v < n}

    def const_of(self, v: int):
        """The literal value of ``v``, or None."""
        op, args = self.ins[v]
        return float(args[0]) if op == "const" else None

    def _fold(self, op: str, args: tuple):
        if op in ("+", "-", "*", "/") and len(args) == 2:
            a, b = (self.const_of(x) for x in args)
            if a is not None and b is not None:
                try:
                    r = {"+": a + b, "-": a - b, "*": a * b}[op] if op != "/" else a / b
                except ZeroDivisionError:
                    return None        # left to the compiled code (inf/nan per IEEE)
                return self.emit("const", r)
            if op == "*":
                for c, x in ((a, args[1]), (b, args[0])):
                    if c == -1.0:
                        return self.emit("neg", x)      # exact: (-1)·x == -x
                    if c == 1.0:
                        return x                        # exact
        elif op == "neg":
            a = self.const_of(args[0])
            if a is not None:
                return self.emit("const", -a)
            iop, iargs = self.ins[args[0]]
            if iop == "neg":
                return iargs[0]                         # -(-x) == x
        return None


class Lowering:
    """Lowers expressions of one program into a uniform prologue block and
    per-chunk point blocks.

    ``sources`` maps an array name to ``(src, index, shape)``: ``src`` is
    ``"u"`` (states) or ``"f"`` (forcing), ``index`` its species/field
    number (cell lanes) or flat base (global lanes). ``params`` maps scalar
    parameter names to positions in ``p``; ``scalars`` maps scalar states to
    flat positions in ``u`` (global lanes only).
    """

    def __init__(self, kind: str, sources: dict, params: dict, scalars: dict,
                 cell_dims: tuple = ()):
        self.kind = kind
        self.sources = sources
        self.params = params
        self.scalars = scalars
        self.cell_dims = cell_dims
        self.prologue = Block()
        self._pmemo: dict = {}
        self.uniform_names = frozenset(params) | {"t"}

    # -- uniform (prologue) values -------------------------------------------
    def _is_uniform(self, e) -> bool:
        if isinstance(e, str):
            return e in self.uniform_names
        if not isinstance(e, Node):
            return True
        if e.op == "index":
            return False
        names = free_names(e)
        if e.op == AGG:          # bound names are not free here
            bound = {n for n, _ in (e.attr("ranges") or ())}
            names = names - bound
            if bound & free_names(e.body) and _reads_index(e.body):
                return False
        return names <= self.uniform_names

    def uniform(self, e) -> int:
        """Prologue value of a uniform expression."""
        key = e if isinstance(e, Node) else ("leaf", e)
        v = self._pmemo.get(key)
        if v is None:
            v = self._lower(self.prologue, e, {}, uniform_block=True)
            self._pmemo[key] = v
        return v

    def _hoist(self, blk: Block, e) -> int:
        """A point block's reference to uniform ``e``: its literal when it
        folds to one, else ``hoist(j)`` (read from ``h``)."""
        j = self.uniform(e)
        c = self.prologue.const_of(j)
        return blk.emit("const", c) if c is not None else blk.emit("hoist", j)

    # -- point values ------------------------------------------------------------
    def point(self, blk: Block, e, dims: dict) -> int:
        """Value of ``e`` at a point of a box whose dimension names are
        ``dims`` (name → position)."""
        return self._lower(blk, e, dims, uniform_block=False)

    def _lower(self, blk: Block, e, dims: dict, uniform_block: bool) -> int:
        memo: dict = {}
        stack = [(e, False)]
        while stack:
            x, ready = stack.pop()
            if not isinstance(x, Node):
                memo[("leaf", x)] = self._leaf(blk, x, dims, uniform_block)
                continue
            if x in memo:
                continue
            if x.op == "fn":        # interp.* over literal tables: primitive arithmetic
                memo[x] = self._lower(blk, expand_closed(x), dims, uniform_block)
                continue
            if not uniform_block and self._is_uniform(x):
                memo[x] = self._hoist(blk, x)
                continue
            if x.op in ("index", AGG):
                memo[x] = self._special(blk, x, dims, uniform_block)
                continue
            kids = list(x.args)
            if not ready:
                stack.append((x, True))
                stack.extend((k, False) for k in kids if (k if isinstance(k, Node) else ("leaf", k)) not in memo)
                continue
            vals = [memo[k if isinstance(k, Node) else ("leaf", k)] for k in kids]
            memo[x] = self._op(blk, x, vals)
        return memo[e if isinstance(e, Node) else ("leaf", e)]

    def _leaf(self, blk: Block, x, dims: dict, uniform_block: bool) -> int:
        if is_lit(x):
            return blk.emit("const", float(x))
        if isinstance(x, str):
            if x in dims:
                return blk.emit("idx", dims[x])
            if x in self.params:
                return blk.emit("param", self.params[x]) if uniform_block else self._hoist(blk, x)
            if x == "t":
                return blk.emit("time") if uniform_block else self._hoist(blk, x)
            if x in self.scalars and not uniform_block:
                return blk.emit("gload", "u", self.scalars[x], (), ())
            raise JacError("unsupported_construct", f"`{x}` has no value in the compiled program")
        raise JacError("unsupported_construct", f"cannot compile the leaf {x!r}")

    def _op(self, blk: Block, x: Node, vals: list) -> int:
        o = x.op
        if o in ("+", "*") and blk is not self.prologue and len(vals) >= 2:
            # Gather the uniform operands of an n-ary sum/product into one
            # prologue value (a rate constant times its stoichiometry), so
            # the per-point work is only what varies. Order kept otherwise.
            uni = [a for a in x.args if self._is_uniform(a)]
            if 1 <= len(uni) < len(x.args) and (len(uni) > 1 or o == "*"):
                rest = [v for a, v in zip(x.args, vals) if not self._is_uniform(a)]
                if o == "*":
                    # A sign in the stoichiometry (±1 · k · A·B) is not
                    # multiplied into the hoisted rate constant: k·A·B is one
                    # value shared by every species the reaction moves, and
                    # the sign becomes a subtraction in the species' sum
                    # (exact: (-k)·y == -(k·y), a + (-y) == a - y).
                    c = 1.0
                    for a in uni:
                        if is_lit(a):
                            c *= float(a)
                    others = [a for a in uni if not is_lit(a)]
                    sign = 1.0
                    if others and c < 0.0:
                        sign = -1.0
                        uni = others if c == -1.0 else [-c] + others
                    h = self._hoist(blk, node(o, uni) if len(uni) > 1 else uni[0])
                    # Varying factors first, in one order (:func:`_lanes_last`):
                    # k1*A*B, k1*B*A share A*B (a reaction's concentration product).
                    v = blk.emit("*", _fold(blk, o, _lanes_last(blk, rest)), h) if rest else h
                    return blk.emit("neg", v) if sign == -1.0 else v
                h = self._hoist(blk, node(o, uni) if len(uni) > 1 else uni[0])
                return _fold(blk, o, [h] + rest)
        if o == "+":
            return _fold(blk, "+", vals) if vals else blk.emit("const", 0.0)
        if o == "*":
            if blk is not self.prologue:
                vals = _lanes_last(blk, vals)
            return _fold(blk, "*", vals) if vals else blk.emit("const", 1.0)
        if o in ("-", "neg"):
            if len(vals) == 1:
                return blk.emit("neg", vals[0])
            return _fold(blk, "-", vals)
        if o in ("^", "pow"):
            return blk.emit("pow", *vals)
        if o == "ifelse":
            return blk.emit("select", *vals)
        if o in ("min", "max") and len(vals) >= 1:
            return _fold(blk, o, vals)
        if o in ("and", "or") and len(vals) >= 1:
            return _fold(blk, o, vals)
        if o == "atan" and len(vals) == 2:
            return blk.emit("atan2", *vals)
        if o in UNARY and len(vals) == 1:
            return blk.emit(o, vals[0])
        if o in BINARY and len(vals) == 2:
            return blk.emit(o, *vals)
        if o in ("pi", "π") and not vals:
            return blk.emit("const", math.pi)
        if o == "e" and not vals:
            return blk.emit("const", math.e)
        if o == "fn":
            raise JacError("unsupported_construct",
                           f"closed function `{x.attr('name')}` is not compiled yet")
        raise JacError("unsupported_construct", f"operator `{o}` is not compiled")

    def _special(self, blk: Block, x: Node, dims: dict, uniform_block: bool) -> int:
        if x.op == AGG:
            return self._sum(blk, x, dims, uniform_block)
        head, args = x.args[0], x.args[1:]
        if isinstance(head, Node) and head.op == "const":
            v = head.attr("value")
            if not all(is_lit(a) for a in args):
                flat, shape = const_table(v)
                if len(flat) > 4096:
                    raise JacError("unsupported_construct", "a data table of more than 4096 entries read "
                                   "at a computed index is not compiled")
                ivals = tuple(self._lower(blk, a, dims, uniform_block) for a in args)
                return blk.emit("table", flat, shape, *ivals)
            for a in args:
                v = v[int(a) - 1]
            return blk.emit("const", float(v))
        src = self.sources.get(head) if isinstance(head, str) else None
        if src is None or uniform_block:
            raise JacError("unsupported_construct", f"cannot compile the read {x!r}")
        kind, where, shape = src
        if len(args) != len(shape):
            raise JacError("unsupported_construct", f"`{head}` read with {len(args)} indices; shape {shape}")
        if self.kind == "cell":
            if tuple(args) != tuple(self.cell_dims):
                raise JacError("unsupported_construct", f"non-local read {x!r} in a cell-lane program")
            return blk.emit("lane", kind, where)
        ivals = tuple(self._lower(blk, a, dims, False) for a in args)
        return blk.emit("gload", kind, where, tuple(shape), row_major_strides(shape), *ivals)

    def _sum(self, blk: Block, x: Node, dims: dict, uniform_block: bool) -> int:
        if x.attr("output_idx") or x.attr("filter") is not None or \
                x.attr("reduce") not in (None, "+") or x.attr("semiring") not in (None, "sum_product"):
            raise JacError("unsupported_construct", "only closed `+` reductions are compiled inside a scalar")
        names, spans = [], []
        for n, r in x.attr("ranges") or ():
            if not (isinstance(r, tuple) and len(r) == 2 and all(isinstance(v, int) for v in r)):
                raise JacError("unsupported_construct", "a reduction over a non-literal range")
            names.append(n)
            spans.append(range(r[0], r[1] + 1))
        total = 1
        for s in spans:
            total *= len(s)
        if total > MAX_UNROLL:
            raise JacError("unsupported_construct",
                           f"a reduction over {total} points is too large to unroll (limit {MAX_UNROLL})")
        terms = [self._lower(blk, substitute(x.body, dict(zip(names, pt))), dims, uniform_block)
                 for pt in itertools.product(*spans)]
        return _fold(blk, "+", terms) if terms else blk.emit("const", 0.0)


def const_table(v) -> tuple:
    """Row-major flat values and shape of a nested literal table."""
    shape = []
    x = v
    while isinstance(x, (list, tuple)):
        shape.append(len(x))
        x = x[0] if x else 0.0
    flat: list = []

    def go(y):
        if isinstance(y, (list, tuple)):
            for z in y:
                go(z)
        else:
            flat.append(float(y))
    go(v)
    return tuple(flat), tuple(shape)


def _lanes_last(blk: Block, vals: list) -> list:
    """A product's factors in one order whatever the equation wrote: the
    computed factors first, as written, then the lane reads by (array,
    species). A reaction's term ``k(T)·A·B`` is then one chain of values
    shared by every species the reaction moves (``B·A·k`` and ``k·A·B`` used
    to be two: on SuperFast's right-hand side, where every rate constant
    depends on the cell's temperature, a quarter of the products were
    recomputed). The order depends only on the expression, never on value
    numbers, so every chunking and engine associates a product alike."""
    if len(vals) < 2:
        return vals

    def key(iv):
        i, v = iv
        op, args = blk.ins[v]
        return (1, str(args[0]), int(args[1]), i) if op == "lane" else (0, "", 0, i)
    return [v for _, v in sorted(enumerate(vals), key=key)]


def _fold(blk: Block, o: str, vals: list) -> int:
    """Left fold of an n-ary operation; in a sum ``a + (-y)`` is ``a - y``
    (exact)."""
    acc = vals[0]
    for v in vals[1:]:
        if o == "+" and blk.ins[v][0] == "neg":
            acc = blk.emit("-", acc, blk.ins[v][1][0])
        else:
            acc = blk.emit(o, acc, v)
    return acc


def _reads_index(e) -> bool:
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Node):
            if x.op == "index":
                return True
            stack.extend(x.args)
            if x.body is not None:
                stack.append(x.body)
    return False
