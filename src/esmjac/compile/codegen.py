"""Generated Numba source for an evaluation document.

One module per program: a header (model, fields, generator version), a
prologue computing the uniform values into ``h`` once per call, and point
*chunks*: small ``@njit(parallel=True)`` functions, each a ``prange`` over
lanes (cell programs) or box points (global programs) with a straight-line
body, one statement per line with named temporaries. Chunks are capped at
``max_stmts`` statements so no compiled unit grows with the model (the
shared values a chunk needs are recomputed, not spilled). Index arrays and
sizes are arguments; nothing is a captured global.

Cell chunk signature: ``(u, f, h, cix, out, L)``; global chunk: ``(u, f, h,
out)``; prologue: ``(p, t, h)``. Each chunk also has a serial twin
``s<chunk>`` (one thread). A lane plan gets its own module (``dest=``) whose
``fl<chunk>``/``sfl<chunk>`` write the plan's slots directly. ``out`` is the band slab (Jacobians) or the
right-hand side (then global programs accumulate with ``+=``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .._version import __version__
from ..errors import JacError
from ..model.expr import add, format_float
from ..model.layout import strides as row_major_strides
from .ssa import Block, Lowering

__all__ = ["generate", "Generated", "GENERATOR"]

GENERATOR = f"esmjac-codegen {__version__}"

_FN = {"exp": "math.exp", "log": "math.log", "log10": "math.log10", "sqrt": "math.sqrt",
       "sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "asin": "math.asin",
       "acos": "math.acos", "atan": "math.atan", "sinh": "math.sinh", "cosh": "math.cosh",
       "tanh": "math.tanh", "asinh": "math.asinh", "acosh": "math.acosh",
       "atanh": "math.atanh", "abs": "abs", "floor": "math.floor", "ceil": "math.ceil"}
_BIN = {"+": "{} + {}", "*": "{} * {}", "-": "{} - {}", "/": "{} / {}",
        "<": "1.0 if {} < {} else 0.0", "<=": "1.0 if {} <= {} else 0.0",
        ">": "1.0 if {} > {} else 0.0", ">=": "1.0 if {} >= {} else 0.0",
        "==": "1.0 if {} == {} else 0.0", "!=": "1.0 if {} != {} else 0.0",
        "and": "1.0 if ({} != 0.0 and {} != 0.0) else 0.0",
        "or": "1.0 if ({} != 0.0 or {} != 0.0) else 0.0",
        "min": "min({}, {})", "max": "max({}, {})", "atan2": "math.atan2({}, {})"}


@dataclass(frozen=True)
class Generated:
    source: str
    chunks: tuple          # names of the point functions, in call order
    chunk_kinds: tuple     # per chunk: "cell" or ("global", npoints)
    n_hoist: int
    n_statements: int


def _lit(x: float) -> str:
    if x != x:
        return "math.nan"
    if x in (float("inf"), float("-inf")):
        return "math.inf" if x > 0 else "-math.inf"
    s = format_float(x) if x != int(x) or abs(x) >= 1e16 else repr(float(x))
    return f"({s})" if s.startswith("-") else s


class _Printer:
    """Prints one block's instructions as Python statements."""

    def __init__(self, blk: Block, prefix: str, lane_expr: str, dimvars: list):
        self.blk = blk
        self.prefix = prefix
        self.lane = lane_expr
        self.dimvars = dimvars
        self.names: dict = {}
        self.lines: list = []
        self.hoisted: set = set()

    def ref(self, v: int) -> str:
        name = self.names.get(v)
        if name is not None:
            return name
        op, args = self.blk.ins[v]
        if op == "const":
            return _lit(args[0])
        raise AssertionError("value used before definition")

    def run(self, upto: int | None = None) -> None:
        for v, (op, args) in enumerate(self.blk.ins):
            if v in self.names or op == "const":
                continue
            rhs = self.expr(op, args)
            name = f"{self.prefix}{v}"
            self.lines.append(f"{name} = {rhs}")
            self.names[v] = name

    def expr(self, op: str, args: tuple) -> str:
        r = self.ref
        if op == "param":
            return f"p[{args[0]}]"
        if op == "time":
            return "t"
        if op == "hoist":
            if self.prefix == "w":
                return f"h[{args[0]}]"
            self.hoisted.add(args[0])
            return f"hv{args[0]}"
        if op == "idx":
            return self.dimvars[args[0]]
        if op == "lane":
            src, s = args
            return f"{src}[{s} * L + {self.lane}]"
        if op == "gload":
            src, base, shape, strides = args[:4]
            terms = [str(base)]
            for n, st, iv in zip(shape, strides, args[4:]):
                # Clamp: a ghost read at a boundary stays inside the array;
                # such points are never scattered (their column is outside).
                terms.append(f"(min(max(int({r(iv)}), 1), {n}) - 1) * {st}")
            return f"{src}[{' + '.join(terms)}]"
        if op == "table":
            flat, shape = args[:2]
            terms = []
            for n, s, iv in zip(shape, row_major_strides(shape), args[2:]):
                terms.append(f"(min(max(int({r(iv)}), 1), {n}) - 1) * {s}")
            return f"({', '.join(_lit(x) for x in flat)},)[{' + '.join(terms)}]"
        if op == "neg":
            return f"-{r(args[0])}"
        if op == "not":
            return f"0.0 if {r(args[0])} != 0.0 else 1.0"
        if op == "sign":
            a = r(args[0])
            return f"1.0 if {a} > 0.0 else (-1.0 if {a} < 0.0 else 0.0)"
        if op == "pow":
            base, ex = args
            eop, eargs = self.blk.ins[ex]
            if eop == "const" and float(eargs[0]).is_integer() and abs(eargs[0]) <= 8:
                return f"{r(base)} ** {int(eargs[0])}"
            return f"{r(base)} ** {r(ex)}"
        if op == "select":
            c, a, b = args
            return f"{r(a)} if {r(c)} != 0.0 else {r(b)}"
        if op in _FN:
            return f"{_FN[op]}({r(args[0])})"
        if op in _BIN:
            return _BIN[op].format(r(args[0]), r(args[1]))
        raise JacError("unsupported_construct", f"no code for `{op}`")


def generate(doc, *, max_stmts: int = 400, title: str = "", dest=None, zeros=()) -> Generated:
    """Source for ``doc`` (an :class:`~esmjac.evaldoc.EvalDoc`).

    With ``dest`` (per field: the plan slot ``(a, b, stride)`` it lands in)
    and ``zeros`` (slots no band reaches), a cell Jacobian is generated for
    one lane plan: ``fl<chunk>``/``sfl<chunk>`` write
    ``out[a*L + b + l*stride]`` with the addresses as literals — the fused
    path at the speed of the plain slab kernel."""
    lay = doc.layout
    low = _lowering(doc)
    rhs = doc.wrt is None
    head = [
        f'"""Generated by {GENERATOR}: do not edit.',
        "",
        f"model: {lay.model}   program: {'rhs' if rhs else 'jacobian wrt=' + doc.wrt}",
        f"lane kind: {doc.kind}   fields: {len(doc.fields)}   states: {len(lay.states)}",
        title,
        '"""',
        "import math",
        "import numba as nb",
        "",
        "_JIT = dict(cache=True, error_model='numpy', nogil=True)",
        "",
    ]
    body: list = []
    chunks: list = []
    kinds: list = []
    nstmt = 0
    if doc.kind == "cell":
        groups = [(None, _cell_outputs(doc))]
    else:
        groups = _global_groups(doc)
    for gi, (dims, outputs) in enumerate(groups):
        pending = list(outputs)
        while pending:
            blk = Block()
            dimpos = {} if dims is None else {n: k for k, (n, _, _) in enumerate(dims)}
            if dims is None:
                dimpos = {n: k for k, n in enumerate(_cell_names(doc))}
            taken = []
            while pending:
                o = pending[0]
                before = len(blk.ins)
                vals = [low.point(blk, e, dimpos) for e in o[1]]
                if taken and len(blk.ins) > max_stmts:
                    del blk.ins[before:]          # does not fit: next chunk
                    blk._memo = {k: v for k, v in blk._memo.items() if v < before}
                    break
                taken.append((o, vals))
                pending.pop(0)
            name = f"chunk{len(chunks)}"
            if dest is not None:
                lines, n = _literal_chunk(name, blk, taken, doc, dest, zeros if not chunks else ())
            else:
                lines, n = _chunk(name, blk, taken, doc, dims)
            nstmt += n
            body.extend(lines)
            chunks.append(name)
            kinds.append("cell" if dims is None else ("global", _npoints(dims)))
    pro = _prologue(low.prologue)
    nstmt += len(pro) - 2
    src = "\n".join(head + pro + [""] + body) + "\n"
    return Generated(src, tuple(chunks), tuple(kinds), len(low.prologue.ins), nstmt)


def tape_program(doc):
    """(prologue tape, body tape, n_hoist) of a cell document (engine "tape")."""
    from .tape import encode
    if doc.kind != "cell":
        raise JacError("bad_option", "the tape engine runs cell-lane programs only")
    low = _lowering(doc)
    blk = Block()
    dimpos = {n: k for k, n in enumerate(_cell_names(doc))}
    stores = []
    for target, exprs in _cell_outputs(doc):
        stores.append((low.point(blk, exprs[0], dimpos), target[1]))
    body = encode(blk, stores)
    pro = low.prologue
    ptape = encode(pro, [(v, v) for v in range(len(pro.ins))], "storeh")
    return ptape, body, len(pro.ins)


def _cell_names(doc) -> list:
    return [f"_c{k + 1}" for k in range(len(doc.layout.cell_shape))]


def _npoints(dims) -> int:
    n = 1
    for _, lo, hi in dims:
        n *= hi - lo + 1
    return n


def _lowering(doc) -> Lowering:
    lay = doc.layout
    sources, scalars = {}, {}
    if doc.kind == "cell":
        for s, name in enumerate(lay.states):
            sources[name] = ("u", s, lay.cell_shape)
        for j, name in enumerate(lay.forcing):
            sources[name] = ("f", j, lay.shapes[name])
    else:
        for name, off in lay.state_offsets().items():
            if lay.shapes.get(name):
                sources[name] = ("u", off, lay.shapes[name])
            else:
                scalars[name] = off
        for name, off in lay.forcing_offsets().items():
            sources[name] = ("f", off, lay.shapes[name])
    params = {n: j for j, n in enumerate(lay.params)}
    return Lowering(doc.kind, sources, params, scalars, tuple(_cell_names(doc)))


def _cell_outputs(doc) -> list:
    """(target, [expressions]) per output: band k, or state s (sum of pieces)."""
    if doc.wrt is not None:
        return [(("slab", k), [doc.expanded(f.expr)]) for k, f in enumerate(doc.fields)]
    per: dict = {s: [] for s in range(len(doc.layout.states))}
    sidx = {n: s for s, n in enumerate(doc.layout.states)}
    for f in doc.fields:
        per[sidx[f.row]].append(doc.expanded(f.expr))
    return [(("state", s), [add(*es) if es else 0]) for s, es in per.items()]


def _global_groups(doc) -> list:
    """Fields grouped by box, in first-appearance order."""
    groups: dict = {}
    off = 0
    lay = doc.layout
    soff = lay.state_offsets()
    for k, f in enumerate(doc.fields):
        if doc.wrt is not None:
            target = ("slab", off)
            off += f.npoints
        else:
            target = ("row", soff[f.row], lay.shapes.get(f.row, ()), f.pins)
        groups.setdefault(f.dims, []).append((target, [doc.expanded(f.expr)]))
    return list(groups.items())


def _prologue(blk: Block) -> list:
    pr = _Printer(blk, "w", "", [])
    lines = ["@nb.njit(**_JIT)", "def prologue(p, t, h):"]
    pr.run()
    lines += ["    " + ln for ln in pr.lines]
    for v, (op, _) in enumerate(blk.ins):
        lines.append(f"    h[{v}] = {pr.ref(v)}")
    if len(lines) == 2:
        lines.append("    pass")
    return lines


def _variants(name: str, args: str, loop: str, pre: list, body: list, serial: bool = True) -> list:
    """The parallel (``prange``) function and, optionally, its serial twin
    ``s<name>`` (a plain ``range``: no parfor scheduling, measured ~30%
    faster on one thread). Numba compiles each only when first called."""
    par = loop.replace("range(", "nb.prange(", 1)
    out = ["@nb.njit(parallel=True, **_JIT)", f"def {name}({args}):", *pre,
           f"    {par}", *["        " + ln for ln in body]]
    if serial:
        out += ["", "@nb.njit(**_JIT)", f"def s{name}({args}):", *pre,
                f"    {loop}", *["        " + ln for ln in body]]
    return out


def _chunk(name: str, blk: Block, taken: list, doc, dims) -> tuple:
    if dims is None:
        args, loop = "u, f, h, cix, out, L", "for l in range(L):"
        ncd = len(doc.layout.cell_shape)
        dimvars = [f"c{d}" for d in range(ncd)]
        pre = [f"c{d} = float(cix[{d} * L + l])" for d in range(ncd) if _uses_idx(blk, d)]
        pr = _Printer(blk, "v", "l", dimvars)
    else:
        npts = _npoints(dims)
        args, loop = "u, f, h, out", f"for q in range({npts}):"
        dimvars = [f"d{d}" for d in range(len(dims))]
        pre, stride = [], 1
        strides = []
        for _, lo, hi in reversed(dims):
            strides.append(stride)
            stride *= hi - lo + 1
        strides.reverse()
        for d, ((_, lo, hi), st) in enumerate(zip(dims, strides)):
            n = hi - lo + 1
            q = "q" if st == 1 else f"(q // {st})"
            pre.append(f"d{d} = float({lo} + {q} % {n})" if d else f"d{d} = float({lo} + {q})")
        pr = _Printer(blk, "v", "q", dimvars)
    pr.run()
    # Uniform values into locals before the loop: inside it they would be
    # reloaded after every store (``out`` may alias ``h``).
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    body = pre + pr.lines
    for (target, _), vals in taken:
        if target[0] == "slab":
            pos = f"{target[1]} * L + l" if dims is None else f"{target[1]} + q"
            body.append(f"out[{pos}] = {pr.ref(vals[0])}")
        elif target[0] == "state":
            body.append(f"out[{target[1]} * L + l] = {pr.ref(vals[0])}")
        else:
            _, base, shape, pins = target
            pos = _row_pos(base, shape, pins, dims)
            body.append(f"out[{pos}] += {pr.ref(vals[0])}")
    return _variants(name, args, loop, hv, body) + [""], len(pr.lines)


def _literal_chunk(name: str, blk: Block, taken: list, doc, dest, zeros) -> tuple:
    ncd = len(doc.layout.cell_shape)
    dimvars = [f"c{d}" for d in range(ncd)]
    pre = [f"c{d} = float(cix[{d} * L + l])" for d in range(ncd) if _uses_idx(blk, d)]
    pr = _Printer(blk, "v", "l", dimvars)
    pr.run()
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    body = pre + pr.lines
    first = _first_of_pair(doc)

    def addr(a, b, st):
        s = f"{a} * L"
        s += f" + {b}" if b else ""
        return s + (" + l" if st == 1 else f" + l * {st}")

    body += [f"out[{addr(a, b, st)}] = 0.0" for a, b, st in zeros]
    for (target, _), vals in taken:
        k = target[1]
        op = "=" if first[k] else "+="
        body.append(f"out[{addr(*dest[k])}] {op} {pr.ref(vals[0])}")
    return _variants("fl" + name, "u, f, h, cix, out, L", "for l in range(L):", hv, body), len(pr.lines)


def _first_of_pair(doc) -> list:
    seen: set = set()
    out = []
    for f in doc.fields:
        out.append((f.row, f.col) not in seen)
        seen.add((f.row, f.col))
    return out


def _uses_idx(blk: Block, d: int) -> bool:
    return any(op == "idx" and args[0] == d for op, args in blk.ins)


def _row_pos(base: int, shape: tuple, pins: tuple, dims) -> str:
    names = {n: k for k, (n, _, _) in enumerate(dims)}
    terms = [str(base)]
    for p, s in zip(pins, row_major_strides(shape)):
        if isinstance(p, str):
            terms.append(f"(int(d{names[p]}) - 1) * {s}")
        else:
            terms.append(str((int(p) - 1) * s))
    return " + ".join(terms)
