"""Generated Numba source for an evaluation document.

One module per program: a header (model, fields, generator version), a
prologue computing the uniform values into ``h`` once per call, and point
*chunks*. The prologue is a module of its own (``Generated.prologue_source``,
named by its content hash and imported first): a program's kernel and each
plan's direct-write kernel have the same prologue, so Numba compiles it once
for all of them. A chunk is a straight-line body capped at ``max_stmts``
statements so no compiled unit grows with the model (the shared values a chunk needs are
recomputed, not spilled). Index arrays and sizes are arguments; nothing is a
captured global. The code reads like the model: lane reads are named after
their species (``O3 = S[2*16 + j]``), parameters after themselves
(``k_NO_O3 = p[3]``), literals are literals, and every store says which
derivative it is (``# ∂HO2/∂NO``).

A tiled plan's chunks (``fl<chunk>``, direct writes) run over *tiles* of
``W`` lanes (docs/design.rst §4): per tile the lanes' inputs are copied into a small
scratch ``S``, the body runs
as one ``for j in range(W)`` loop whose reads and writes all address ``S`` at
literal offsets, so LLVM proves them independent and vectorizes it without
runtime alias checks (it leaves loops of fewer than 16 known iterations
scalar: hence the default ``W``), and the tile's slots — one contiguous run
of ``nslots × W`` values, ``((l // W)*nslots + q)*W + l % W`` — are copied
out. The last tile, when partial (``r < W`` real lanes), computes its ``r``
lanes only, in a lane loop that reads the state and stores the tile's slots
directly (the same printed expressions: the same per-lane IEEE operations,
so the same bits), then stores lane ``r-1``'s values into the padding lanes,
which the layout defines as repeats of the last real lane: a one-cell call
does one cell's arithmetic, not a tile's.
A cell right-hand side (``tile_chunk<i>``) runs the same way over tiles
of :data:`RHS_TILE` lanes but keeps its earthsci_ast output order
(``out[s*L + l]``): the tile loop reads the state straight from ``u`` at
unsigned offsets (no wraparound selects: plain vector loads) and writes a
*stack* scratch (compile/stackbuf.py), which LLVM knows aliases nothing,
then copies each output out in a contiguous run. Both vectorize with Numba's
default loop vectorizer — SLP stays off and no Numba setting is changed.
The band slab and untiled plans are written lanes-fastest (``out[k*L + l]``)
by a plain loop over lanes: with a few flops per stored value the scratch
copies cost more than SIMD saves (measured). Global chunks are a loop over
box points.

A tiled chunk's arithmetic is one jitted function, ``tile_<name>``, compiled
once; the loops over its tiles are the package's (compile/tilecall.py),
written once for every model: ``chunk<i>`` (parallel, ``prange`` over work
items) and its serial twin ``schunk<i>`` are
:class:`~esmjac.compile.tilecall.TileCall` objects that run those loops with
the address of the tile function's C wrapper, so no compiled module links
the model's arithmetic a second time (a wrapper that called it directly made
Numba optimise and generate the linked function again inside each). Other
chunks are written once as ``_<name>`` and compiled twice: ``chunk<i>``
(``parallel=True``) and its serial twin ``schunk<i>`` (the same Python
function under another name, where ``prange`` is a plain ``range``: no
parfor scheduling for one thread).

Signatures: cell chunk ``(u, f, h, cix, out, L)``; global chunk ``(u, f, h,
out)``; prologue ``(p, t, h)``. With ``dest=`` a cell Jacobian is generated
for one plan (``fl<chunk>``: its slots written directly, no band slab); a
tiled plan's chunks take the caller's tile scratch as a last argument ``S``
(:func:`tile_scratch` elements of ``u.dtype``; nothing allocated per call).
"""
from __future__ import annotations

import functools
import keyword
import re
import unicodedata
from dataclasses import dataclass

from .._version import __version__
from ..errors import JacError, in_equation
from ..model.expr import add, format_float
from ..model.layout import strides as row_major_strides
from .ssa import Block, Lowering, operands
from .tape import encode
from .tilecall import TILES_PER_ITEM

__all__ = ["generate", "Generated", "GENERATOR", "tile_scratch", "escape"]

#: Tiles per parallel work item (one scratch allocation per item).
_TILES_PER_ITEM = TILES_PER_ITEM

#: Lanes per tile of a cell right-hand side (``None``: one lane per loop
#: iteration, the old scalar loop). A literal trip count LLVM vectorizes;
#: chosen by measurement (benchmarks/bench_tiles.py).
RHS_TILE = 64

GENERATOR = f"esmjac-codegen {__version__}"

_FN = {"exp": "math.exp", "log": "math.log", "log10": "math.log10", "sqrt": "math.sqrt",
       "sin": "math.sin", "cos": "math.cos", "tan": "math.tan", "asin": "math.asin",
       "acos": "math.acos", "atan": "math.atan", "sinh": "math.sinh", "cosh": "math.cosh",
       "tanh": "math.tanh", "asinh": "math.asinh", "acosh": "math.acosh",
       "atanh": "math.atanh", "abs": "abs", "floor": "math.floor", "ceil": "math.ceil"}
_SRC = {"u": "u", "f": "f"}     # the arrays a lane or grid read addresses

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
    counts_nonfinite: bool = False   # chunks return how many non-finite values they stored
    tile_scratch: int = 0    # tiled chunks: scratch elements per work item (their last argument ``S``)
    reads_cells: bool = False  # some cell chunk reads cell index values (``cix``)
    prologue_source: str = ""  # the prologue's own module (imported before ``source``: :func:`prologue_module`)

    def load(self):
        """The generated module (from the kernel cache, compile/cache.py),
        its prologue's module imported first."""
        from .cache import load_source

        if self.prologue_source:
            load_source(self.prologue_source)
        return load_source(self.source)


def tile_scratch(per_item: int, lanes: int, W: int) -> int:
    """Elements of the scratch ``S`` tiled chunks take at ``lanes`` lanes in
    tiles of ``W``: one section of ``per_item`` per work item of
    ``_TILES_PER_ITEM`` tiles (so parallel items never share scratch)."""
    nt = -(-int(lanes) // int(W))
    return max(-(-nt // _TILES_PER_ITEM), 1) * int(per_item)


def _lit(x: float) -> str:
    x = float(x)            # a number, whatever a document put there (never text in the source)
    if x != x:
        return "math.nan"
    if x in (float("inf"), float("-inf")):
        return "math.inf" if x > 0 else "-math.inf"
    s = format_float(x) if x != int(x) or abs(x) >= 1e16 else repr(float(x))
    return f"({s})" if s.startswith("-") else s


#: Names the generator itself writes (arguments, loop variables, scratch,
#: module globals, builtins): a model identifier is never one of these,
#: nor matches :data:`_GENERATED` (tests/compile/test_codegen_names.py
#: checks every name a generated module binds or reads is covered).
_RESERVED = {"u", "f", "h", "p", "t", "cix", "out", "L", "S", "j", "l", "q", "m", "w", "l0", "ob",
             "nb", "np", "math", "min", "max", "abs", "int", "float", "range", "blk", "it", "Lm1",
             "x", "o", "s", "a", "b", "r", "n", "i", "bad", "Lo", "lo", "j0", "U", "F", "C", "Sv", "nt",
             "ju", "stack_empty", "types", "prologue", "drive", "inf", "nan", "True", "False",
             "None", "print", "len", "sum", "round", "bool", "complex", "pow", "divmod", "isinstance",
             "globals", "locals", "vars", "getattr", "setattr", "exec", "eval", "compile", "open",
             "type", "object", "super", "np_", "numba", "esmjac", "import", "self", "cls"}

#: Generator-made names (values, hoists, dims, views, chunks, twins).
_GENERATED = re.compile(r"(v|w|hv|c|d|e|g|k|z|_[a-z]\w*|(tile_|s|fl|sfl|tile_fl|_)?chunk|"
                        r"(tile_|s|_)?flchunk)\d*")


def escape(text) -> str:
    """Document text made safe for a comment or a docstring of generated
    source: printable characters stay (so names read as themselves), every
    other character — line breaks of any kind, control and format
    characters, lone surrogates — and quotes and backslashes are written as
    ``\\xNN``/``\\uNNNN``/``\\UNNNNNNNN`` escapes. The result cannot end a
    comment or a string literal, whatever the document says."""
    out = []
    for c in str(text):
        if c.isprintable() and c not in "\\\"'":
            out.append(c)
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


def _ascii_ident(name: str) -> str:
    """``name`` as a plain ASCII identifier fragment: NFKC-normalised first
    (what Python itself would do), then every character outside
    ``[A-Za-z0-9_]`` as ``_``."""
    try:
        norm = unicodedata.normalize("NFKC", name)
    except (TypeError, ValueError):
        norm = name
    return re.sub(r"[^A-Za-z0-9_]", "_", norm)


class _Names:
    """Python identifiers for model names (species, parameters), unique per
    module: the name itself when it is a plain ASCII identifier, else a
    sanitized one (``NO_2`` for ``NO-2``, ``fi_2`` for the ligature ``ﬁ``
    beside ``fi``); never a generator name (``v12``, ``hv3``, ``out``).

    Every identifier is ASCII, so Python's NFKC normalisation of
    identifiers is the identity on them and distinct model names stay
    distinct variables (two names NFKC would merge, like ``ﬁ`` and ``fi``,
    get ``fi`` and ``fi_2``)."""

    def __init__(self):
        self.taken: set = set()
        self.of: dict = {}

    def __call__(self, kind: str, name: str) -> str:
        key = (kind, name)
        if key in self.of:
            return self.of[key]
        base = _ascii_ident(str(name)).strip("_") or "x"
        if base[0].isdigit() or keyword.iskeyword(base) or keyword.issoftkeyword(base) or \
                base in _RESERVED or _GENERATED.fullmatch(base) or base.startswith("_"):
            base = f"{kind}_{base}"
        ident, k = base, 2
        while ident in self.taken:
            ident, k = f"{base}_{k}", k + 1
        self.taken.add(ident)
        self.of[key] = ident
        return ident


class _Printer:
    """Prints one block's instructions as Python statements.

    ``lane(src, s)`` is the expression of a lane read; ``hint(op, args)``
    names a value after the model (a species, a parameter) or returns None."""

    def __init__(self, blk: Block, prefix: str, lane, dimvars: list, hint=None):
        self.blk = blk
        self.prefix = prefix
        self.lane = lane
        self.dimvars = dimvars
        self.hint = hint or (lambda op, args: None)
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

    def run(self, roots=None) -> None:
        """Print every value (``roots=None``) or only those ``roots`` need."""
        need = None if roots is None else _live(self.blk, roots)
        for v, (op, args) in enumerate(self.blk.ins):
            if v in self.names or op == "const" or (need is not None and v not in need):
                continue
            if op == "hoist" and self.prefix != "w":
                self.hoisted.add(args[0])
                self.names[v] = f"hv{args[0]}"      # read into a local before the loop
                continue
            rhs = self.expr(op, args)
            name = self.hint(op, args) or f"{self.prefix}{v}"
            self.lines.append(f"{name} = {rhs}")
            self.names[v] = name

    def expr(self, op: str, args: tuple) -> str:
        r = self.ref
        if op == "param":
            return f"p[{args[0]}]"
        if op == "time":
            return "t"
        if op == "hoist":
            return f"h[{args[0]}]"
        if op == "idx":
            return self.dimvars[args[0]]
        if op == "lane":
            return self.lane(*args)
        if op == "gload":
            src, base, shape, strides = args[:4]
            terms = [str(int(base))]
            for n, st, iv in zip(shape, strides, args[4:]):
                # Clamp: a ghost read at a boundary stays inside the array;
                # such points are never scattered (their column is outside).
                terms.append(f"(min(max(int({r(iv)}), 1), {int(n)}) - 1) * {int(st)}")
            return f"{_SRC[src]}[{' + '.join(terms)}]"
        if op == "table":
            flat, shape = args[:2]
            terms = []
            for n, s, iv in zip(shape, row_major_strides(shape), args[2:]):
                terms.append(f"(min(max(int({r(iv)}), 1), {int(n)}) - 1) * {int(s)}")
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
                k = int(eargs[0])
                # Numba raises ZeroDivisionError for 0.0 ** -k (whatever the
                # error model); 1/x**k is the same value bit for bit (Numba
                # inverts the positive power) and inf at 0, as x ** -1.5 is.
                return f"{r(base)} ** {k}" if k >= 0 else f"1.0 / {r(base)} ** {-k}"
            return f"{r(base)} ** {r(ex)}"
        if op == "select":
            c, a, b = args
            return f"{r(a)} if {r(c)} != 0.0 else {r(b)}"
        if op in _FN:
            return f"{_FN[op]}({r(args[0])})"
        if op in _BIN:
            return _BIN[op].format(r(args[0]), r(args[1]))
        raise JacError("unsupported_construct", f"no code for `{op}`")


def _failing_row(doc) -> str | None:
    """The state whose field first fails to lower alone (None: none does)."""
    low = _lowering(doc)
    cells = {n: k for k, n in enumerate(_cell_names(doc))}
    for f in doc.fields:
        dimpos = cells if doc.kind == "cell" else {n: k for k, (n, _, _) in enumerate(f.dims)}
        try:
            low.point(Block(), doc.expanded(f.expr), dimpos)
        except JacError:
            return f.row
    return None


def _names_equation(fn):
    """A refusal while compiling names the equation it came from (found by
    lowering each field alone, only after a failure)."""

    @functools.wraps(fn)
    def wrapper(doc, *args, **kwargs):
        try:
            return fn(doc, *args, **kwargs)
        except JacError as exc:
            row = _failing_row(doc) if exc.code in ("unsupported_construct", "underivable_operator") else None
            if row is None:
                raise
            with in_equation(row):
                raise

    return wrapper


#: A chunk may grow to this multiple of ``max_stmts`` when that takes every
#: remaining output: a short tail chunk recomputes the shared values it
#: reads (the rate coefficients a species' terms share), which on SuperFast's
#: right-hand side cost 13 % of the call (1.33 → 1.17× the hand-rolled RHS at
#: 10⁴ cells). Bounded, so compiled units still do not grow with the model.
TAIL_SLACK = 1.5


def _absorb_tail(low, blk, pending, dimpos, limit):
    """Lower every output of ``pending`` into ``blk`` while it stays within
    ``limit`` instructions: the ``(output, values, slot)`` entries when all
    fit, else None with ``blk`` restored (as on entry)."""
    start = len(blk.ins)
    out = []
    for o, i in pending:
        out.append((o, [low.point(blk, e, dimpos) for e in o[1]], i))
        if len(blk.ins) > limit:
            blk.truncate(start)
            return None
    return out


@_names_equation
def generate(doc, *, max_stmts: int = 400, title: str = "", dest=None, zeros=(),
             tile: int | None = None, nslots: int | None = None,
             rhs_tile: int | None = RHS_TILE) -> Generated:
    """Source for ``doc`` (an :class:`~esmjac.compile.evaldoc.EvalDoc`).

    With ``dest`` (per field: the plan slot ``(a, b, stride)`` it lands in)
    a cell Jacobian is generated for one lane plan: ``fl<chunk>`` writes the
    plan's slots directly (no band slab). Unit-stride plans (LaneBlocks,
    LaneSparseBlocks) are written tile by tile with the plan's ``tile`` and
    ``nslots``; strided ones (a cell program's Csr) per lane, with ``zeros``
    (slots no band reaches) written as zero."""
    lay = doc.layout
    low = _lowering(doc)
    rhs = doc.wrt is None
    names = _Names()
    head = [
        f'"""Generated by {GENERATOR}: do not edit.',
        "",
        f"model: {escape(lay.model)}   program: {'rhs' if rhs else 'jacobian wrt=' + escape(doc.wrt)}",
        f"lane kind: {escape(doc.kind)}   fields: {len(doc.fields)}   states: {len(lay.states)}",
        escape(title),
        '"""',
        "import math",
        "import types",
        "",
        "import numba as nb",
        "import numpy as np",
        "",
        "import sys as _sys",
        "",
        "import esmjac.compile.tilecall as _tc",
        "from esmjac.compile.stackbuf import stack_empty",
        "",
        "_JIT = dict(cache=True, error_model='numpy', nogil=True)",
        "",
        "",
        "def _twin(fn, name):",
        "    \"\"\"The same function under another name: its serial compilation gets its own cache entry.\"\"\"",
        "    g = types.FunctionType(fn.__code__.replace(co_name=name, co_qualname=name), fn.__globals__, name)",
        "    g.__qualname__ = name",
        "    return g",
        "",
    ]
    body: list = []
    chunks: list = []
    kinds: list = []
    nstmt = 0
    scratch = 0
    hoisted: set = set()
    reads_cells = False
    unit = dest is not None and all(b == 0 and st == 1 for _, b, st in dest)
    if doc.kind == "cell":
        outputs = _cell_outputs(doc)
        if dest is None:
            mode, idx = "lanes", [t[1] for t, _ in outputs]
            P = len(doc.fields) if not rhs else len(lay.states)
        elif unit:
            if nslots is None:
                raise JacError("internal_error", "a unit-stride plan's chunks need its slot count (nslots)")
            mode = "tile" if tile is not None else "lanes"
            idx = [dest[t[1]][0] for t, _ in outputs]
            P = int(nslots)
            order = sorted(range(len(outputs)), key=lambda i: idx[i])    # stable: plan order per slot
            outputs, idx = [outputs[i] for i in order], [idx[i] for i in order]
        else:
            mode, idx, P = "strided", [t[1] for t, _ in outputs], 0   # (strided chunks do not use P)
        groups = [(None, list(zip(outputs, idx)))]
    else:
        mode = "global"
        groups = [(dims, [(o, None) for o in outs]) for dims, outs in _global_groups(doc)]
    for gi, (dims, outputs) in enumerate(groups):
        pending = list(outputs)
        # A plan with no bands still gets one chunk: it writes the zeros.
        empty_plan = dest is not None and not pending and mode in ("tile", "lanes")
        while pending or empty_plan:
            empty_plan = False
            blk = Block()
            dimpos = {} if dims is None else {n: k for k, (n, _, _) in enumerate(dims)}
            if dims is None:
                dimpos = {n: k for k, n in enumerate(_cell_names(doc))}
            taken: list[tuple] = []           # (output, its lowered values, its slot or None)
            while pending:
                o, i = pending[0]
                before = len(blk.ins)
                vals = [low.point(blk, e, dimpos) for e in o[1]]
                # A chunk ends between slots only: the bands summed into one
                # slot stay in one chunk (they accumulate in its scratch).
                if taken and len(blk.ins) > max_stmts and (i is None or i != taken[-1][2]):
                    rest = _absorb_tail(low, blk, pending, dimpos, int(TAIL_SLACK * max_stmts))
                    if rest is not None:          # the whole rest fits in the slack: no tail chunk
                        taken.extend(rest)
                        pending.clear()
                        break
                    blk.truncate(before)          # does not fit: next chunk
                    break
                taken.append((o, vals, i))
                pending.pop(0)
            name = f"chunk{len(chunks)}"
            if mode == "tile":
                a0 = 0 if not chunks or not taken else taken[0][2]
                a1 = pending[0][1] if pending else P
                if tile is None or a1 is None:      # (mode "tile": a unit plan's int slots and width)
                    raise JacError("internal_error", "a tiled chunk without its tile width or slots")
                lines, n, hv, sz = _tile_chunk("fl" + name, blk, taken, doc, names, mode, a0, a1, P, tile)
                scratch = max(scratch, sz)
            elif mode == "lanes" and rhs and dest is None and rhs_tile:
                lines, n, hv = _rhs_tile_chunk(name, blk, taken, doc, names, int(rhs_tile))
            elif mode == "lanes":
                empty = [] if chunks or dest is None else sorted(set(range(P)) - set(idx))
                lines, n, hv = _lane_chunk(name if dest is None else "fl" + name, blk, taken, doc, names,
                                           _lanes_stores(taken), [f"{k} * L + l" for k in empty])
            elif mode == "strided":
                first = _first_of_pair(doc)
                stores = [(_slot_addr(*dest[t[1]]), "=" if first[t[1]] else "+=") for (t, _), _, _ in taken]
                lines, n, hv = _lane_chunk("fl" + name, blk, taken, doc, names, stores,
                                           [] if chunks else [_slot_addr(*z) for z in zeros])
            else:
                lines, n, hv = _chunk(name, blk, taken, doc, dims, names)
            hoisted |= hv
            reads_cells = reads_cells or (dims is None and any(op == "idx" for op, _ in blk.ins))
            nstmt += n
            body.extend(lines)
            chunks.append(name)
            kinds.append("cell" if dims is None else ("global", _npoints(dims)))
    # The prologue in a module of its own, named after its content hash:
    # the kernels of one program (its own, each plan's direct writes) share
    # its text, so Numba compiles (and caches) it once for all of them, not
    # once per module (a cold test run compiled 66 prologues of 24 texts).
    # Its names are its own (a fresh _Names): the same values give the
    # same text whatever the chunks named.
    pro = _prologue(low.prologue, hoisted, _Names(), lay)
    nstmt += len(pro) - 2
    pro_src = "\n".join(_PROLOGUE_HEAD + pro) + "\n"
    src = "\n".join(head + [f"prologue = _sys.modules[{prologue_module(pro_src)!r}].prologue  "
                            "# (the prologue's own module, shared: imported first)", ""] + body) + "\n"
    # Cell chunks count the non-finite values they store (global ones
    # accumulate over box points: their callers scan the output).
    return Generated(src, tuple(chunks), tuple(kinds), len(low.prologue.ins), nstmt, mode != "global",
                     scratch, reads_cells, pro_src)


#: The prologue module's header: nothing of the model (its text is what
#: the kernels that share it have in common).
_PROLOGUE_HEAD = [
    f'"""Generated by {GENERATOR}: do not edit.',
    "",
    "The prologue of a program's kernels: the values that depend on the",
    "parameters and time only, into ``h`` once per call (named by content",
    "hash and shared by every kernel whose prologue is this text).",
    '"""',
    "import math",
    "",
    "import numba as nb",
    "import numpy as np",
    "",
    "_JIT = dict(cache=True, error_model='numpy', nogil=True)",
    "",
    "",
]


def prologue_module(pro_src: str) -> str:
    """The module name a prologue's source is imported under (the kernel
    cache's name for its content hash: compile/cache.py load_source)."""
    from .cache import kernel_key, module_name

    return module_name(kernel_key(pro_src))


@_names_equation
def tape_program(doc, dest=None):
    """(prologue tape, body tape, n_hoist) of a cell document (engine "tape").

    With ``dest`` (per field: its slot of a unit-stride lane plan) the body
    stores slots directly: the bands of one slot are summed in plan order
    (field order) first, so each slot is stored once."""
    if doc.kind != "cell":
        raise JacError("bad_option", "the tape engine runs cell-lane programs only")
    low = _lowering(doc)
    blk = Block()
    dimpos = {n: k for k, n in enumerate(_cell_names(doc))}
    stores = []
    if dest is None:
        for target, exprs in _cell_outputs(doc):
            stores.append((low.point(blk, exprs[0], dimpos), target[1]))
    else:
        per: dict = {}
        for target, exprs in _cell_outputs(doc):
            per.setdefault(dest[target[1]], []).append(low.point(blk, exprs[0], dimpos))
        for slot in sorted(per):
            acc = per[slot][0]
            for v in per[slot][1:]:
                acc = blk.emit("+", acc, v)
            stores.append((acc, slot))
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
    target: tuple                        # ("slab", offset) or ("row", offset, shape, pins)
    for k, f in enumerate(doc.fields):
        if doc.wrt is not None:
            target = ("slab", off)
            off += f.npoints
        else:
            target = ("row", soff[f.row], lay.shapes.get(f.row, ()), f.pins)
        groups.setdefault(f.dims, []).append((target, [doc.expanded(f.expr)]))
    return list(groups.items())




def _live(blk: Block, roots) -> set:
    """Values ``roots`` depend on (what a chunk prints; folding leaves dead
    values behind, e.g. a ``-x`` absorbed into a subtraction)."""
    need: set = set()
    stack = list(roots)
    while stack:
        v = stack.pop()
        if v in need:
            continue
        need.add(v)
        stack.extend(operands(*blk.ins[v]))
    return need


def _prologue(blk: Block, hoisted: set, names: _Names, lay) -> list:
    """``h[j]`` for the uniform values the chunks read (parameters named after
    themselves; literals stay literals in the chunks)."""
    def hint(op, args):
        return names("p", lay.params[args[0]]) if op == "param" else None

    pr = _Printer(blk, "w", None, [], hint)
    lines = ["@nb.njit(**_JIT)", "def prologue(p, t, h):"]
    pr.run(hoisted)
    lines += ["    " + ln for ln in pr.lines]
    for v in sorted(hoisted):
        lines.append(f"    h[{v}] = {pr.ref(v)}")
    if len(lines) == 2:
        lines.append("    pass")
    return lines


def _variants(name: str, args: str, loop: str, pre: list, body: list, ret: str | None = None) -> list:
    """The chunk written once as ``_<name>``, compiled as ``<name>``
    (``parallel=True``: ``prange``) and as its serial twin ``s<name>``
    (``prange`` is a plain ``range`` there: measured ~30% faster on one
    thread). Numba compiles each only when first called."""
    par = loop.replace("range(", "nb.prange(", 1)
    return ["", f"def _{name}({args}):", *pre, f"    {par}", *["        " + ln for ln in body or ["pass"]],
            *([f"    return {ret}"] if ret else []), "",
            f"{name} = nb.njit(parallel=True, **_JIT)(_{name})",
            f"s{name} = nb.njit(**_JIT)(_twin(_{name}, 's{name}'))", ""]


def _hint(doc, names: _Names):
    lay = doc.layout

    def hint(op, args):
        if op == "lane":
            src, s = args
            return names("s" if src == "u" else "f", (lay.states if src == "u" else lay.forcing)[s])
        if op == "param":
            return names("p", lay.params[args[0]])
        return None
    return hint


def _what(doc, target) -> str:
    """A store's comment: ``∂row/∂col`` of a band, ``d row/dt`` of the RHS."""
    if target[0] == "state":
        return f"  # d{escape(doc.layout.states[target[1]])}/dt"
    if target[0] == "slab" and doc.kind == "cell":
        f = doc.fields[target[1]]
        return f"  # ∂{escape(f.row)}/∂{escape(f.col)}"
    return ""


def _chunk(name: str, blk: Block, taken: list, doc, dims, names: _Names) -> tuple:
    """A global chunk: a loop over the box points."""
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
    pr = _Printer(blk, "v", None, dimvars, _hint(doc, names))
    pr.run([vals[0] for _, vals, _ in taken])
    # Uniform values into locals before the loop: inside it they would be
    # reloaded after every store (``out`` may alias ``h``).
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    body = pre + pr.lines
    for (target, _), vals, _i in taken:
        if target[0] == "slab":
            body.append(f"out[{target[1]} + q] = {pr.ref(vals[0])}")
        else:
            _, base, shape, pins = target
            pos = _row_pos(base, shape, pins, dims)
            body.append(f"out[{pos}] += {pr.ref(vals[0])}")
    return _variants(name, args, loop, hv, body), len(pr.lines), pr.hoisted


def _tile_chunk(name: str, blk: Block, taken: list, doc, names: _Names, mode: str,
                a0: int, a1: int, P: int, TW: int) -> tuple:
    """A cell chunk over tiles of ``TW`` lanes (module docstring): slots
    ``a0 ≤ k < a1`` of a tiled plan with ``P`` slots per lane."""
    lay = doc.layout
    need = _live(blk, [vals[0] for _, vals, _ in taken])
    reads = []                                  # scratch sections of the inputs, first-use order
    for v, (op, args) in enumerate(blk.ins):
        if op == "lane" and v in need and args not in reads:
            reads.append(args)
    ncd = len(lay.cell_shape)
    cdims = [d for d in range(ncd) if any(blk.ins[v] == ("idx", (d,)) for v in need)]
    sec = {r: i for i, r in enumerate(reads)}
    nin = len(reads) + len(cdims)
    hint = _hint(doc, names)

    def lane(src, s):
        return f"S[{sec[(src, s)]} * {TW} + j]"

    pr = _Printer(blk, "v", lane, [f"c{d}" for d in range(ncd)], hint)
    pr.run([vals[0] for _, vals, _ in taken])
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    first: set = set()
    stores = []
    for (target, _), vals, i in taken:
        k = i - a0
        op = "+=" if k in first else "="
        first.add(k)
        stores.append(f"S[{nin + k} * {TW} + j] {op} {pr.ref(vals[0])}{_what(doc, target)}")
    nout = a1 - a0
    size = (nin + nout) * TW
    copy_in = []
    for (src, s), i in sec.items():
        copy_in.append(f"S[{i} * {TW} + j] = {src}[{s} * L + l0 + j]")
    for i, d in enumerate(cdims):
        copy_in.append(f"S[{len(reads) + i} * {TW} + j] = cix[{d} * L + l0 + j]")
    cvals = [f"c{d} = S[{len(reads) + i} * {TW} + j]" for i, d in enumerate(cdims)]
    body_j = cvals + pr.lines + stores or ["pass"]
    copy = f"x = S[({nin} + a) * {TW} + j]"
    # A full tile runs the body over TW lanes (a literal trip count: one
    # vectorized loop, no remainder) in the scratch, then copies the tile out.
    tb = [
        f"l0 = t * {TW}",        # (w == TW: a literal, for LLVM's address arithmetic)
        "bad = 0",
        f"ob = t * {P * TW}",
        f"if l0 + {TW} <= L:",
        *[f"    {x}" for x in ([f"for j in range({TW}):", *["    " + c for c in copy_in]] if copy_in else [])],
        f"    for j in range({TW}):", *["        " + x for x in body_j],
        f"    for a in range({nout}):", f"        for j in range({TW}):", f"            {copy}",
        # Copy out, counting non-finite values while they are in cache (x - x
        # is NaN for inf and NaN): the caller needs no second pass over out.
        f"            out[ob + (a + {a0}) * {TW} + j] = x",
        "            if x - x != 0.0:", "                bad += 1",
        "    return bad",
        *_partial_tile(blk, taken, doc, names, a0, nout, TW, first, cdims, len(reads)),
    ]
    tile_fn = ["", "@nb.njit(**_JIT)", f"def tile_{name}(u, f, h, cix, out, L, w, t, S):",
               f'    """Tile t of {name}: outputs {a0}..{a1 - 1} (tiled slots)."""',
               *hv, *["    " + x for x in tb]]
    # The scratch is the caller's (``S``: tile_scratch(...) elements of
    # u.dtype, one section per work item): nothing is allocated per call.
    # Output sections no band of this chunk stores are zeroed once per item
    # (the tiles never write them).
    sz = max(size, 1)
    # Zeroed as runs of adjacent sections, one loop each: a loop per section
    # (148 in tropo12's Jacobian) cost 30 % of the chunk's compile time.
    zr = tuple(((nin + k0) * TW, (nin + k1) * TW) for k0, k1 in _runs(sorted(set(range(nout)) - first)))
    return (tile_fn + _tile_calls(name, "fl", TW, sz, zr), len(pr.lines), pr.hoisted, sz)


def _tile_calls(name: str, kind: str, TW: int, sz: int = 0, zr: tuple = ()) -> list:
    """The chunk ``<name>`` (parallel) and its serial twin ``s<name>``: the
    package's tile loops (compile/tilecall.py) over ``tile_<name>``, called
    through its address: the loops' compiled modules link nothing, so Numba
    does not optimise the tile function a second time inside each."""
    extra = f", {sz}, {zr!r}" if kind == "fl" else ""
    return ["", f"{name} = _tc.TileCall(tile_{name}, {kind!r}, True, {TW}{extra})",
            f"s{name} = _tc.TileCall(tile_{name}, {kind!r}, False, {TW}{extra})", ""]


def _runs(ks: list) -> list:
    """``[(first, past_last), ...]``: the sorted integers ``ks`` as runs of consecutive values."""
    runs: list = []
    for k in ks:
        if runs and runs[-1][1] == k:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1])
    return [tuple(r) for r in runs]


def _rhs_tile_chunk(name: str, blk: Block, taken: list, doc, names: _Names, TW: int) -> tuple:
    """A cell right-hand side chunk over tiles of ``TW`` lanes (output
    ``out[s*L + l]``, the earthsci_ast order, unchanged).

    ``tile_<name>`` computes lanes ``l0 .. l0+m-1`` (``m = TW`` for every
    whole tile): one ``for j in range(m)`` loop reading the caller's arrays at
    unit stride and writing a stack scratch ``S`` (compile/stackbuf.py) at
    literal offsets. LLVM knows a stack slot aliases no argument, so the
    loop vectorizes without run-time alias checks (packed ``vmulpd``/
    ``vaddpd``); then each output is copied to ``out`` by a contiguous loop
    of its own (one stream at a time: lane-major stores to many streams at
    once are slow), counting non-finite values while they are in cache.
    The per-lane arithmetic is the scalar loop's, operation for operation
    (fastmath stays off, no contraction), so the bits are the same for any
    tile width and lane count. The last tile of a lane count that is not a
    multiple of ``TW`` is shifted back to end at lane ``L - 1`` (its first
    lanes are recomputed, bit-identically, and not stored again); fewer
    than ``TW`` lanes run the same loop over their ``L`` lanes."""
    lay = doc.layout
    need = _live(blk, [vals[0] for _, vals, _ in taken])
    reads = []
    for v, (op, args) in enumerate(blk.ins):
        if op == "lane" and v in need and args not in reads:
            reads.append(args)
    ncd = len(lay.cell_shape)
    cdims = [d for d in range(ncd) if any(blk.ins[v] == ("idx", (d,)) for v in need)]
    # Unsigned offsets of the tile's first lane (``_u3 = nb.uint64(3 * L +
    # l0)``, read at ``u[_u3 + ju]``): Numba adds no negative-index
    # wraparound for unsigned indices, so the reads are plain unit-stride
    # vector loads (``u[3 * L + l0 + j]`` leaves a select per read, which
    # LLVM turns into gathers; views ``u[3 * L + l0:]`` cost a reference
    # count per view and tile, measured slower).
    view = {r: f"_{r[0]}{r[1]}" for r in reads}
    pr = _Printer(blk, "v", lambda src, s: f"{src}[{view[(src, s)]} + ju]", [f"c{d}" for d in range(ncd)],
                  _hint(doc, names))
    pr.run([vals[0] for _, vals, _ in taken])
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    cvals = ["ju = nb.uint64(j)"] + [f"c{d} = float(cix[_c{d} + ju])" for d in cdims]
    views = [f"    {view[r]} = nb.uint64({r[1]} * L + l0)" for r in reads]
    views += [f"    _c{d} = nb.uint64({d} * L + l0)" for d in cdims]
    stores: list[str] = []
    slot: dict[int, int] = {}           # output index -> its row of the tile scratch
    copy: list[str] = []
    for (target, _), vals, i in taken:
        op = "+=" if i in slot else "="
        k = slot.setdefault(i, len(slot))
        stores.append(f"S[{k} * {TW} + j] {op} {pr.ref(vals[0])}{_what(doc, target)}")
    for i, k in slot.items():
        copy += [f"o = nb.uint64({i} * Lo + lo + j0)", f"s = nb.uint64({k} * {TW} + j0)",
                 "for j in range(m - j0):", "    ju = nb.uint64(j)",
                 "    x = S[s + ju]", "    out[o + ju] = x", "    if x - x != 0.0:", "        bad += 1"]
    nsl = max(len(slot), 1)
    tile_fn = ["", "@nb.njit(**_JIT)", f"def tile_{name}(u, f, cix, L, l0, h, out, Lo, lo, j0, m):",
               f'    """Lanes l0..l0+{TW - 1} of {name} (inputs ``x[s*L + l0 + j]``) into '
               f'``out[s*Lo + lo + j]`` for j0 <= j < m; the number of non-finite values stored."""',
               *hv, f"    S = stack_empty({nsl * TW}, out.dtype)", *views,
               "    for j in range(m):", *["        " + x for x in (cvals + pr.lines + stores or ["pass"])],
               "    bad = 0", *["    " + x for x in copy], "    return bad"]
    # The tile loop (compile/tilecall.py): fewer lanes than a tile run the
    # same loop over the L real lanes (a runtime trip count: vectorized with
    # a scalar remainder), so a one-cell call does one cell's arithmetic.
    return tile_fn + _tile_calls(name, "rhs", TW), len(pr.lines), pr.hoisted

def _partial_tile(blk: Block, taken: list, doc, names: _Names, a0: int, nout: int, TW: int,
                  stored: set, cdims: list, nreads: int) -> list:
    """The last, partial tile of a tiled chunk (``r = L - l0 < TW`` real
    lanes): a lane loop that reads the state and stores the tile's slots
    directly (no scratch round trip: at one cell that round trip and the
    padding cost more than the cell's arithmetic), then every slot's padding
    lanes get lane ``r-1``'s value (the layout's padding repeats the last
    real lane). The same printed expressions as the full tile's body, the
    cell indices converted through the scratch as there: the same bits."""
    ncd = len(doc.layout.cell_shape)
    pr = _Printer(blk, "v", lambda src, s: f"{src}[{s} * L + l]", [f"c{d}" for d in range(ncd)],
                  _hint(doc, names))
    pr.run([vals[0] for _, vals, _ in taken])
    lines = []
    for i, d in enumerate(cdims):      # int -> the scratch dtype, as the full tile converts them
        lines += [f"S[{nreads + i} * {TW}] = cix[{d} * L + l]", f"c{d} = S[{nreads + i} * {TW}]"]
    lines += pr.lines
    first: set = set()
    for (target, _), vals, i in taken:
        k = i - a0
        op = "+=" if k in first else "="
        first.add(k)
        lines.append(f"out[ob + {i * TW} + l - l0] {op} {pr.ref(vals[0])}{_what(doc, target)}")
    lines += [f"out[ob + {(k + a0) * TW} + l - l0] = 0.0" for k in sorted(set(range(nout)) - stored)]
    # Count the stored values (after accumulation, in the output's dtype)
    # and repeat lane r-1 into the padding (a slice store: vectorized).
    return ["r = L - l0", "for l in range(l0, L):", *["    " + x for x in lines or ["pass"]],
            f"for a in range({nout}):", f"    b = ob + (a + {a0}) * {TW}",
            "    for j in range(r):", "        x = out[b + j]", "        if x - x != 0.0:", "            bad += 1",
            f"    out[b + r:b + {TW}] = x", "return bad"]


def _lane_chunk(name: str, blk: Block, taken: list, doc, names: _Names, stores: list, zeros=()) -> tuple:
    """A cell chunk looping over lanes, one lane per iteration: ``stores``
    gives per output its address (``out[...]``, in ``L`` and ``l``) and
    ``=``/``+=``; ``zeros`` the addresses written as zero. Used for the
    lanes-fastest outputs (band slab, right-hand side, untiled plans) —
    measured faster than tiles for these few-flop-per-store outputs (no
    scratch copies) — and for a cell program's Csr (strided slots)."""
    ncd = len(doc.layout.cell_shape)
    dimvars = [f"c{d}" for d in range(ncd)]
    pre = [f"c{d} = float(cix[{d} * L + l])" for d in range(ncd) if _uses_idx(blk, d)]
    pr = _Printer(blk, "v", lambda src, s: f"{src}[{s} * L + l]", dimvars, _hint(doc, names))
    pr.run([vals[0] for _, vals, _ in taken])
    hv = [f"    hv{j} = h[{j}]" for j in sorted(pr.hoisted)]
    body = pre + pr.lines + [f"out[{z}] = 0.0" for z in zeros]
    for ((target, _), vals, _i), (where, op) in zip(taken, stores):
        body.append(f"out[{where}] {op} {pr.ref(vals[0])}{_what(doc, target)}")
    # Count non-finite stored values while they are in registers (x - x is
    # NaN for inf and NaN): the caller needs no second pass over ``out``.
    # An accumulated (``+=``) value is re-read after its store; a value
    # that is non-finite once stays so (NaN/inf absorb finite addends), so
    # a zero count means every final value is finite.
    for (where, op), ((_, vals, _i)) in zip(stores, taken):
        x = pr.ref(vals[0]) if op == "=" else f"out[{where}]"
        body += [f"if {x} - {x} != 0.0:", "    bad += 1"]
    # (Not through a lane function's address like the tiles: a lane
    # function over lanes l0..l1-1 ran 1.05-1.25x slower than this loop
    # over range(L), measured.)
    return (_variants(name, "u, f, h, cix, out, L", "for l in range(L):", hv + ["    bad = 0"], body, "bad"),
            len(pr.lines), pr.hoisted)


def _lanes_stores(taken: list) -> list:
    """``out[i*L + l]`` per output index ``i``; repeats of an index add."""
    seen: set = set()
    out = []
    for _, _, i in taken:
        out.append((f"{i} * L + l", "+=" if i in seen else "="))
        seen.add(i)
    return out


def _slot_addr(a: int, b: int, st: int) -> str:
    """The address ``a*L + b + l*stride`` of a lane plan's slot."""
    s = f"{a} * L" + (f" + {b}" if b else "")
    return s + (" + l" if st == 1 else f" + l * {st}")


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
