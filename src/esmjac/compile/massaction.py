"""The mass-action kernel: a body run as a sum of monomials.

Mechanism-independent, below the runtime and the integrators so that
both can use it (the leaf binds it in :mod:`esmjac.integrators.lanehoist`,
each hoisted body's ``poly``, and :mod:`esmjac.integrators.bound`, the
call sites).

After lane hoisting (:mod:`esmjac.integrators.lanehoist`) a mass-action
body is a polynomial in the state: every stored value (a right-hand side
entry, a Jacobian slot) is ``Σ_i c_i · m_i``, each monomial ``m_i`` a
product of hoisted field rows, parameter-only scalars and states
(``k·A·B``; its Jacobian's ``∂/∂A = k·B``). :func:`expand` tries, at
build time, to rewrite a body's SSA in that form, each distinct monomial
once — a reaction's rate computed once and summed with its ± coefficient
into every species it moves. A division by a single monomial keeps that
monomial's factors as divisors (GEOS-Chem's uptake rates ``k_mt1/SALAAL``
times ``SALAAL``: ``k·A/A`` is not cancelled, so at ``A = 0`` the value is
NaN as on the tape). Anything else — a division by a sum, a non-integer
power, a function of a state, the time, a cell index — or an expansion of
more than :data:`MAX_GROWTH` × the body's instructions gives None, and the
caller keeps the tape (the leaf: :func:`esmjac.integrators.lanetape.run_fused`).

:func:`run_poly` runs the result: one generic kernel compiled once per
machine, data-driven by read-only int32 / float64 arrays (nothing
compiled per mechanism). Per block of :data:`BLOCK` lanes (whole tiles of
the Jacobian's plan) it computes every monomial's row, then each output's
terms summed in a fixed order, left to right, and stored once. Pairs of
adjacent whole groups of :data:`VEC` lanes (two 16-lane tiles of the
Jacobian, or 32 lanes of an untiled output) run as LLVM vector IR
(:func:`_vrow`, :func:`_vsum2`: a row's product or an output's sum over
both groups held in registers, one walk of the tables for the two; no
alias checks, no accumulator in memory); an odd group and the other lanes
of a block through plain loops (up to four terms per pass). Measured on
GEOS-Chem fullchem (``benchmarks/RESULTS.md``): the output-major form beat
computing each monomial and scattering it at once (read-modify-write of
the outputs, 2.5× slower on the Jacobian); the Jacobian's blocks of one
pair (32 lanes) beat one group (16 lanes, a half-size block of rows but
twice the walks of the tables). Every lane sees the same operations in the same order,
so a lane's bits do not depend on the lane count, its position, the tile
width, the block or the thread count.

The bits differ from the tape's in the last places: the tape evaluates
the expression as written (``k·(A − B)``, sums in the document's order),
this kernel the expanded sum in its own order; where terms cancel the
two differ by rounding of the terms' size. Stores go where the tape's go:
``out[a*L + l]`` (``W = 0``) or slot ``a`` of the tiled plan, the slots
``zslots`` zeroed and the padding lanes ``L..C-1`` of the last tile
holding lane ``L-1``'s values (as :func:`run_fused` stores them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from .ssa import operands
from .tape import live

__all__ = ["PolyBody", "expand", "run_poly", "scratch_size", "MAX_GROWTH", "BLOCK", "UNTILED_BLOCK", "VEC"]

#: The expansion is refused when its terms (output terms plus monomial
#: factors) exceed this multiple of the body's instructions.
MAX_GROWTH = 4
#: Lanes per block (rounded to whole tiles): the monomial rows of a block.
#: A tiled output (the leaf's Jacobian) runs blocks of two 16-lane tiles, its
#: rows and sums in vector IR over both (one walk of the tables) with the
#: block's rows in L2; an untiled one (the right-hand side, 793 rows against
#: the Jacobian's 1,203) :data:`UNTILED_BLOCK`.
BLOCK = 32
#: Lanes per block of an untiled output: its rows through loops that read
#: each input row's 64 lanes in one pass (measured: as fast as 16-lane
#: blocks alone, faster in the leaf under load, where the inputs are not in cache).
UNTILED_BLOCK = 64

# factor kinds: a state row, a field row, a prologue scalar, a parameter;
# plus _DIV: the same, divided by (a monomial over a monomial)
_U, _F, _H, _P, _DIV = 0, 1, 2, 3, 4
_LEAF_KIND = {"hoist": _H, "param": _P}


@dataclass(frozen=True, eq=False)
class PolyBody:
    """A body as monomials (module docstring); every array read-only.

    Monomial ``i``'s factors are ``fkind/fidx[fptr[i]:fptr[i+1]]`` (kind 0 a
    state row, 1 a field row, 2 a prologue value ``h``, 3 a parameter ``p``,
    4–7 a divisor of kind 0–3; none: the constant 1), applied left to right.
    Output ``targets[k]`` is ``Σ ocoef[e]·m[omono[e]]`` over
    ``e in optr[k]:optr[k+1]`` in that order (none: 0)."""

    fptr: np.ndarray
    fkind: np.ndarray
    fidx: np.ndarray
    optr: np.ndarray
    omono: np.ndarray
    ocoef: np.ndarray
    targets: np.ndarray

    @property
    def monomials(self) -> int:
        return int(self.fptr.size - 1)

    @property
    def terms(self) -> int:
        """Output terms plus monomial factors: the kernel's row operations."""
        return int(self.omono.size + self.fkind.size)

    def arrays(self) -> tuple:
        """The kernel's first seven arguments."""
        return (self.fptr, self.fkind, self.fidx, self.optr, self.omono, self.ocoef, self.targets)


def scratch_size(body: PolyBody, W: int, B: int = BLOCK) -> int:
    """Scratch values :func:`run_poly` needs for ``body`` at tile width ``W``
    (0: untiled) and block ``B``."""
    if W > 0:
        B = max(W, (B // W) * W)
    return (body.monomials + 1) * max(B, 1)


class _NotPolynomial(Exception):
    pass


def _mul(a: dict, b: dict, cap: int) -> dict:
    if len(a) * len(b) > cap:
        raise _NotPolynomial("expansion too large")
    out: dict = {}
    for ka, ca in a.items():
        for kb, cb in b.items():
            k = tuple(sorted(ka + kb))
            out[k] = out.get(k, 0.0) + ca * cb
    return {k: c for k, c in out.items() if c != 0.0}


def _add(a: dict, b: dict, sign: float, inplace: bool) -> dict:
    out = a if inplace else dict(a)
    for k, c in b.items():
        v = out.get(k, 0.0) + sign * c
        if v != 0.0:
            out[k] = v
        else:
            out.pop(k, None)
    return out


def expand(ins: list, stores: list, n_instructions: int | None = None) -> PolyBody | None:
    """The monomial form of a body in :class:`~esmjac.compile.ssa.Block` form
    (``ins``: (op, args) per value; ``stores``: (value, target)), or None
    when a stored value is not a polynomial in the state or the expansion
    would exceed :data:`MAX_GROWTH` × ``n_instructions`` terms (default
    ``len(ins)``)."""
    budget = MAX_GROWTH * max(int(n_instructions if n_instructions is not None else len(ins)), 16)
    try:
        polys = _polynomials(ins, stores, budget)
    except _NotPolynomial:
        return None
    return _encode(polys, stores, budget)


def _polynomials(ins: list, stores: list, budget: int) -> dict:
    """value → {monomial key: coefficient} for every value the stores need;
    a key is the sorted tuple of its factors ``8*index + kind`` (a kind
    ``_DIV + k`` divides by the row or scalar of kind ``k``); a division by a
    monomial keeps its factors as divisors (``k/A·A`` stays ``k·A/A``: at
    ``A = 0`` it is NaN, as on the tape)."""
    need = live(ins, stores, strict=False)
    uses = [0] * len(ins)
    for v, (op, args) in enumerate(ins):
        if need[v]:
            for a in operands(op, args):
                uses[a] += 1
    for v, _ in stores:
        uses[v] += 1
    val: dict = {}

    def recip(b: dict) -> dict:
        """1/b for a single monomial ``b`` (its factors as divisors)."""
        if len(b) != 1:
            raise _NotPolynomial("division by a sum")
        ((k, c),) = b.items()
        if any(x % 8 >= _DIV for x in k):
            raise _NotPolynomial("division by a quotient")
        return {tuple(x + _DIV for x in k): 1.0 / c}

    def take(a):
        """Operand ``a``'s polynomial and whether this is its last use."""
        uses[a] -= 1
        return val[a], uses[a] == 0

    r: dict[tuple, float]
    for v, (op, args) in enumerate(ins):
        if not need[v]:
            continue
        if op == "const":
            c = float(args[0])
            r = {(): c} if c != 0.0 else {}
        elif op in _LEAF_KIND:
            r = {(8 * int(args[0]) + _LEAF_KIND[op],): 1.0}
        elif op == "lane":
            r = {(8 * int(args[1]) + (_U if args[0] == "u" else _F),): 1.0}
        elif op in ("+", "-"):
            (a, la), (b, _) = take(args[0]), take(args[1])
            r = _add(a, b, 1.0 if op == "+" else -1.0, la)
        elif op == "neg":
            a, _ = take(args[0])
            r = {k: -c for k, c in a.items()}
        elif op == "*":
            (a, _), (b, _) = take(args[0]), take(args[1])
            r = _mul(a, b, budget)
        elif op == "/":
            (a, _), (b, _) = take(args[0]), take(args[1])
            r = _mul(a, recip(b), budget)
        elif op == "pow":
            (a, _), (b, _) = take(args[0]), take(args[1])
            e = b.get((), 0.0) if set(b) <= {()} else 0.5
            if e != int(e) or not -4 <= e <= 4:
                raise _NotPolynomial("a power that is not a small integer")
            base = a if e >= 0 else recip(a)
            r = {(): 1.0}
            for _ in range(abs(int(e))):
                r = _mul(r, base, budget)
        else:
            raise _NotPolynomial(f"{op} of the state")
        if len(r) > budget:
            raise _NotPolynomial("expansion too large")
        val[v] = r
        for a in set(operands(op, args)):
            if uses[a] == 0:
                val.pop(a, None)        # keep memory at the live values
    return {v: val[v] for v, _ in stores}


def _encode(polys: dict, stores: list, budget: int) -> PolyBody | None:
    """The kernel's arrays: monomials numbered in order of first use by the
    stores, factors sorted (fields and scalars, then states, then divisors:
    ``k·A·B``), each output's terms in :func:`_order`."""
    mono: dict = {}             # key -> index
    terms: dict = {}            # target -> [(monomial, coefficient)]
    for v, tgt in stores:
        p = polys[v]
        lst = terms.setdefault(int(tgt), [])
        for k in sorted(p, key=_order):
            i = mono.get(k)
            if i is None:
                i = mono[k] = len(mono)
            lst.append((i, p[k]))
    nfac = sum(len(k) for k in mono)
    nterm = sum(len(t) for t in terms.values())
    if nfac + nterm > budget:
        return None
    fptr = np.zeros(len(mono) + 1, np.int32)
    fkind = np.empty(nfac, np.int32)
    fidx = np.empty(nfac, np.int32)
    q = 0
    for i, k in enumerate(mono):
        for x in sorted(k, key=lambda x: (x % 8 >= _DIV, x % 4 == _U, x % 8, x // 8)):
            fkind[q], fidx[q] = x % 8, x // 8
            q += 1
        fptr[i + 1] = q
    targets = np.array(sorted(terms), np.int32)
    optr = np.zeros(targets.size + 1, np.int32)
    omono = np.empty(nterm, np.int32)
    ocoef = np.empty(nterm, np.float64)
    q = 0
    for k, t in enumerate(targets.tolist()):
        for i, c in terms[t]:
            omono[q], ocoef[q] = i, c
            q += 1
        optr[k + 1] = q
    arrs = (fptr, fkind, fidx, optr, omono, ocoef, targets)
    for a in arrs:
        a.setflags(write=False)
    return PolyBody(*arrs)


def _order(k: tuple) -> tuple:
    """Monomials of one output in a fixed order: by their state factors, then
    the rest (any fixed order gives every lane the same bits)."""
    return (tuple(x for x in k if x % 4 == _U), k)


#: Offsets into the flat arrays are unsigned: Numba indexes a signed offset
#: through a negative-index wraparound that keeps LLVM from vectorising the
#: lane loops.
_U64 = np.uint64


#: Lanes of one group: a 16-lane tile, 4 AVX2 registers of float64 (a
#: vector sum or row, :func:`_vsum2`, :func:`_vrow`, holds two).
VEC = 16


def _to_i64(builder, v):
    """An index loaded from an int32 (or int64) array, as i64 (indices are
    non-negative)."""
    return v if v.type.width == 64 else builder.zext(v, ir.IntType(64))


def _f64(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.dtype == types.float64 for a in arrays)


@intrinsic
def _vsum2(typingctx, out, ob, S, sb, omono, ocoef, e0, e1, B, d):
    """``out[ob : ob+VEC]`` and ``out[ob+d : ob+d+VEC]`` = lanes ``0..VEC-1``
    and ``VEC..2*VEC-1`` of ``Σ ocoef[e]·S[omono[e]*B + sb : +2*VEC]`` over
    ``e`` in ``e0 .. e1-1``: one output's sum over two adjacent groups of
    :data:`VEC` lanes (8 AVX2 registers), one walk of its terms for both;
    the two halves stored apart (``d = VEC``: untiled, contiguous; a tiled
    plan: the next group's run of the slot, in this tile or the next).
    Added left to right from the first product (0 when empty), held in
    registers and stored once. Emitted as LLVM vector IR on
    ``<2*VEC x double>``: no alias check, no remainder loop, no accumulator
    row in memory. ``fmul`` then ``fadd`` with no contraction flags: each
    lane's bits are those of the scalar loop ``a = c0*x0; a = a + c1*x1; ...``
    (a pass of four terms, ``c0*x0 + c1*x1 + c2*x2 + c3*x3``, is that same
    sequence): a lane's operations do not depend on its neighbours."""
    if not _f64(out, S, ocoef):
        return None
    return types.void(out, ob, S, sb, omono, ocoef, e0, e1, B, d), _vsum2_codegen


def _vsum2_codegen(context, builder, signature, args):
    n, h = 2 * VEC, VEC
    ot, _, st, _, mt, ct, _, _, _, _ = signature.args
    out_, ob_, S_, sb_, om_, oc_, e0_, e1_, B_, d_ = args
    i64, i32 = ir.IntType(64), ir.IntType(32)
    vt = ir.VectorType(ir.DoubleType(), n)
    ht = ir.VectorType(ir.DoubleType(), h)
    od = context.make_array(ot)(context, builder, out_).data
    sd = context.make_array(st)(context, builder, S_).data
    md = context.make_array(mt)(context, builder, om_).data
    cd = context.make_array(ct)(context, builder, oc_).data
    zero32 = ir.Constant(ir.VectorType(i32, n), [0] * n)

    def term(e):
        c = builder.load(builder.gep(cd, [e]))
        cv = builder.shuffle_vector(builder.insert_element(ir.Constant(vt, ir.Undefined), c, i32(0)),
                                    ir.Constant(vt, ir.Undefined), zero32)
        i = _to_i64(builder, builder.load(builder.gep(md, [e])))
        xp = builder.bitcast(builder.gep(sd, [builder.add(builder.mul(i, B_), sb_)]), vt.as_pointer())
        x = builder.load(xp)
        x.align = 8
        return builder.fmul(cv, x)
    acc = cgutils.alloca_once(builder, vt)
    with builder.if_else(builder.icmp_unsigned(">", e1_, e0_)) as (some, none):
        with some:
            builder.store(term(e0_), acc)
            with cgutils.for_range_slice(builder, builder.add(e0_, i64(1)), e1_, i64(1), inc=True) as (e, _):
                builder.store(builder.fadd(builder.load(acc), term(e)), acc)
        with none:
            builder.store(ir.Constant(vt, [0.0] * n), acc)
    a = builder.load(acc)
    und = ir.Constant(vt, ir.Undefined)
    for off, lanes in ((ob_, range(h)), (builder.add(ob_, d_), range(h, n))):
        half = builder.shuffle_vector(a, und, ir.Constant(ir.VectorType(i32, h), list(lanes)))
        builder.store(half, builder.bitcast(builder.gep(od, [off]), ht.as_pointer())).align = 8
    return context.get_dummy_value()


@intrinsic
def _vrow(typingctx, S, r, fkind, fidx, a0, a1, u, f, h, p, L, lo):
    """``S[r : r+2*VEC]`` = the product of factors ``a0 .. a1-1`` (kinds as in
    :class:`PolyBody`) over lanes ``lo .. lo+2*VEC-1`` of the input rows
    (two adjacent groups, as :func:`_vsum2` sums them),
    applied left to right from the first (1 when none; a divisor first:
    ``1/x``), held in registers and stored once. LLVM vector IR as
    :func:`_vsum2`: each lane's bits are those of the scalar loops."""
    if not _f64(S, u, f, h, p):
        return None
    sig = types.void(S, r, fkind, fidx, a0, a1, u, f, h, p, L, lo)

    def codegen(context, builder, signature, args):
        st, _, kt, it, _, _, ut, ft, ht, pt, _, _ = signature.args
        S_, r_, k_, i_, a0_, a1_, u_, f_, h_, p_, L_, lo_ = args
        i64, i32 = ir.IntType(64), ir.IntType(32)
        vt = ir.VectorType(ir.DoubleType(), 2 * VEC)
        vp = vt.as_pointer()
        sd, kd, idd, ud, fd, hd, pd = (context.make_array(t)(context, builder, v).data for t, v in
                                       ((st, S_), (kt, k_), (it, i_), (ut, u_), (ft, f_), (ht, h_), (pt, p_)))
        zero32 = ir.Constant(ir.VectorType(i32, 2 * VEC), [0] * (2 * VEC))
        one = ir.Constant(vt, [1.0] * (2 * VEC))
        acc = cgutils.alloca_once(builder, vt)
        builder.store(one, acc)
        with cgutils.for_range_slice(builder, a0_, a1_, i64(1), inc=True) as (q, _):
            kind = builder.load(builder.gep(kd, [q]))
            idx = _to_i64(builder, builder.load(builder.gep(idd, [q])))
            odd = builder.icmp_unsigned("!=", builder.and_(kind, kind.type(1)), kind.type(0))
            xv = cgutils.alloca_once(builder, vt)
            with builder.if_else(builder.icmp_unsigned("==", builder.and_(kind, kind.type(2)),
                                                       kind.type(0))) as (row, scalar):
                with row:                       # kinds 0, 1, 4, 5: a state or field row
                    base = builder.select(odd, fd, ud)
                    xp = builder.bitcast(builder.gep(base, [builder.add(builder.mul(idx, L_), lo_)]), vp)
                    x = builder.load(xp)
                    x.align = 8
                    builder.store(x, xv)
                with scalar:                    # kinds 2, 3, 6, 7: a prologue value or parameter
                    c = builder.load(builder.gep(builder.select(odd, pd, hd), [idx]))
                    builder.store(builder.shuffle_vector(builder.insert_element(ir.Constant(vt, ir.Undefined), c,
                                                                                i32(0)),
                                                         ir.Constant(vt, ir.Undefined), zero32), xv)
            x = builder.load(xv)
            div = builder.icmp_unsigned(">=", kind, kind.type(4))
            first = builder.icmp_unsigned("==", q, a0_)
            with builder.if_else(div) as (d, m):
                with d:
                    with builder.if_else(first) as (f1, f2):
                        with f1:
                            builder.store(builder.fdiv(one, x), acc)
                        with f2:
                            builder.store(builder.fdiv(builder.load(acc), x), acc)
                with m:
                    with builder.if_else(first) as (f1, f2):
                        with f1:
                            builder.store(x, acc)
                        with f2:
                            builder.store(builder.fmul(builder.load(acc), x), acc)
        op = builder.bitcast(builder.gep(sd, [r_]), vp)
        builder.store(builder.load(acc), op).align = 8
        return context.get_dummy_value()
    return sig, codegen


@nb.njit(cache=True, nogil=True, error_model="numpy")
def run_poly(fptr, fkind, fidx, optr, omono, ocoef, targets, u, f, h, p, out, L, W, P, C, zslots, B, scratch):
    """Evaluate a :class:`PolyBody` for lanes ``0..L-1`` (inputs ``u``, ``f``
    lanes-fastest with stride ``L``; ``h`` the prologue's values, ``p`` the
    parameters) into ``out``: ``out[a*L + l]`` when ``W == 0``, else slot
    ``a`` of the tiled plan (``P`` slots, ``C`` stored lanes, the slots
    ``zslots`` zeroed, padding lanes ``L..C-1`` a copy of lane ``L-1``).
    Per block of ``B`` lanes (a multiple of ``W`` when tiled): every
    monomial's row into a buffer, then each output's terms summed in their
    order, left to right, and stored once. The block's whole groups of
    :data:`VEC` lanes (when ``W`` is 0 or a multiple of ``VEC``) run in
    pairs: :func:`_vsum2`, each output's sum over two adjacent groups per
    walk of its terms, straight into its slot (the two halves stored apart
    when tiled), and :func:`_vrow` for the rows when the block is one pair;
    the rest of the block (an odd group: when tiled, the last whole tile;
    lanes past the last whole group or tile) runs the loops below: up to four terms per pass over the lanes
    (``a + t1 + t2`` is ``(a + t1) + t2``, the bits of one term per pass)
    into an accumulator row, copied into the output's tiles (a padded last
    tile: lane ``L-1``'s value). This path serves a block's tail only (the
    leaf: a lane count off the 32-lane pairs), so it is kept small: one
    loop nest per case, no direct-store variants, whose compile time it
    would not repay. ``scratch``: at least :func:`scratch_size`
    values (the monomial rows and the accumulator; a smaller one is
    replaced by an allocation).

    No Numba helpers and no slices (the two intrinsics are inlined IR that
    takes no reference): every array is indexed by an
    unsigned offset into its flat storage. A Numba slice (or an array passed
    to a helper, inlined or not) is a reference-count increment and
    decrement, two atomic operations that drain the store buffer; taken per
    monomial and per output they were most of this kernel's time (GEOS-Chem
    fullchem, 64 lanes: RHS 1.9 -> 1.3 µs per lane, Jacobian 5.0 -> 3.4).
    Divisions (tile of a lane) are per block, not per output."""
    nm = fptr.shape[0] - 1
    if W > 0:
        B = max(W, (B // W) * W)
    B = max(1, min(B, max(L, 1)) if W == 0 else B)
    if scratch.shape[0] < (nm + 1) * B:
        scratch = np.empty((nm + 1) * B, dtype=np.float64)
    S = scratch                         # monomial i's row at i*B, the accumulator at nm*B
    Bu = _U64(B)
    Lu = _U64(L)
    acc = _U64(nm) * Bu
    Wu = _U64(max(W, 0))
    PWu = _U64(max(P, 0)) * Wu
    Cs = C if W > 0 else L
    for l0 in range(0, Cs, B):
        m = max(min(L, l0 + B) - l0, 0)         # real lanes of this block
        ms = min(Cs, l0 + B) - l0               # stored lanes
        if m == 0:
            break
        l0u = _U64(l0)
        # pairs of whole groups of VEC lanes summed by _vsum2 (whole tiles
        # when tiled: a group is VEC contiguous values of a slot); the rest
        # of the block's lanes, from lane ls on (a tile's first lane), by
        # the loops below: an odd group, lanes past the last whole group
        if W == 0:
            ng = m // VEC
            ng -= ng % 2
        elif W % VEC == 0:
            ng = (m // W) * (W // VEC)
            if ng % 2 == 1:                     # the last whole tile by the loops
                ng -= W // VEC
        else:
            ng = 0
        ls = ng * VEC
        mg = m - ls
        lsu = _U64(ls)
        mgu = _U64(mg)
        l0g = l0 + ls
        l0gu = _U64(l0g)
        if W > 0:                               # the rest's tiles: nt stored, full of real lanes
            tile0 = l0g // W
            nt = (ms - ls) // W
            full = mg // W
        else:                                   # untiled: the rest's lanes of each row
            tile0 = nt = full = 0
        # -- the monomials' rows: leading field and state rows in one pass
        # (fields first, as the expansion sorts them: f·f·f, f·f·u, f·u·u,
        # u·u·u, or two of them), then each further factor, left to right:
        # the same bits as one factor per pass
        # (by _vrow when a block is one pair of groups: the block's rows from
        # L2, while a wider block's rows stream a row's lanes in one pass)
        ngr = ng if B <= 2 * VEC else 0
        rs = ngr * VEC
        rsu = _U64(rs)
        rmu = _U64(m - rs)
        rl0u = _U64(l0 + rs)
        for g in range(0, ngr, 2):
            lo = l0u + _U64(g * VEC)
            sb = _U64(g * VEC)
            for i in range(nm):
                _vrow(S, _U64(i) * Bu + sb, fkind, fidx, _U64(fptr[i]), _U64(fptr[i + 1]), u, f, h, p, Lu, lo)
        for i in range(nm if m > rs else 0):
            a0 = fptr[i]
            a1 = fptr[i + 1]
            r = _U64(i) * Bu + rsu
            nf = a1 - a0
            k0 = fkind[a0] if nf > 0 else 9
            k1 = fkind[a0 + 1] if nf > 1 else 9
            k2 = fkind[a0 + 2] if nf > 2 else 9
            q0 = a0
            if k0 <= 1 and k1 <= 1 and k0 >= k1:
                o0 = _U64(fidx[a0]) * Lu + rl0u
                o1 = _U64(fidx[a0 + 1]) * Lu + rl0u
                if k2 <= 1 and k1 >= k2:
                    o2 = _U64(fidx[a0 + 2]) * Lu + rl0u
                    if k2 == 1:
                        for j in range(rmu):
                            S[r + j] = f[o0 + j] * f[o1 + j] * f[o2 + j]
                    elif k1 == 1:
                        for j in range(rmu):
                            S[r + j] = f[o0 + j] * f[o1 + j] * u[o2 + j]
                    elif k0 == 1:
                        for j in range(rmu):
                            S[r + j] = f[o0 + j] * u[o1 + j] * u[o2 + j]
                    else:
                        for j in range(rmu):
                            S[r + j] = u[o0 + j] * u[o1 + j] * u[o2 + j]
                    q0 = a0 + 3
                else:
                    if k1 == 1:
                        for j in range(rmu):
                            S[r + j] = f[o0 + j] * f[o1 + j]
                    elif k0 == 1:
                        for j in range(rmu):
                            S[r + j] = f[o0 + j] * u[o1 + j]
                    else:
                        for j in range(rmu):
                            S[r + j] = u[o0 + j] * u[o1 + j]
                    q0 = a0 + 2
            elif nf == 0:
                for j in range(rmu):
                    S[r + j] = 1.0
            for q in range(q0, a1):
                kind = fkind[q]
                idx = fidx[q]
                first = q == a0
                if kind == 0 or kind == 1 or kind == 4 or kind == 5:
                    o = _U64(idx) * Lu + rl0u
                    if kind == 0:
                        if first:
                            for j in range(rmu):
                                S[r + j] = u[o + j]
                        else:
                            for j in range(rmu):
                                S[r + j] = S[r + j] * u[o + j]
                    elif kind == 1:
                        if first:
                            for j in range(rmu):
                                S[r + j] = f[o + j]
                        else:
                            for j in range(rmu):
                                S[r + j] = S[r + j] * f[o + j]
                    elif kind == 4:
                        if first:
                            for j in range(rmu):
                                S[r + j] = 1.0 / u[o + j]
                        else:
                            for j in range(rmu):
                                S[r + j] = S[r + j] / u[o + j]
                    elif first:
                        for j in range(rmu):
                            S[r + j] = 1.0 / f[o + j]
                    else:
                        for j in range(rmu):
                            S[r + j] = S[r + j] / f[o + j]
                else:
                    c = h[idx] if kind == 2 or kind == 6 else p[idx]
                    if kind <= 3:
                        if first:
                            for j in range(rmu):
                                S[r + j] = c
                        else:
                            for j in range(rmu):
                                S[r + j] = S[r + j] * c
                    elif first:
                        for j in range(rmu):
                            S[r + j] = 1.0 / c
                    else:
                        for j in range(rmu):
                            S[r + j] = S[r + j] / c
        # -- each output over the pairs of whole groups: _vsum2 straight into
        # its slot, one walk of the output's terms for both groups
        for g in range(0, ng, 2):
            lg = l0 + g * VEC
            if W == 0:
                gb = _U64(lg)
                ts = Lu
                d = _U64(VEC)
            else:
                gb = _U64((lg // W) * P * W + lg % W)
                ts = Wu
                d = _U64(((lg + VEC) // W) * P * W + (lg + VEC) % W) - gb
            sb = _U64(g * VEC)
            for k in range(targets.shape[0]):
                _vsum2(out, gb + _U64(targets[k]) * ts, S, sb, omono, ocoef, _U64(optr[k]), _U64(optr[k + 1]), Bu, d)
        # -- each output: its terms into the accumulator, then stored
        for k in range(targets.shape[0] if mg > 0 else 0):
            e0 = optr[k]
            e1 = optr[k + 1]
            n = e1 - e0
            e = e0
            if n == 0:
                for j in range(mgu):
                    S[acc + j] = 0.0
            elif n == 1:
                c0 = ocoef[e]
                x0 = _U64(omono[e]) * Bu + lsu
                for j in range(mgu):
                    S[acc + j] = c0 * S[x0 + j]
            elif n == 2:
                c0 = ocoef[e]
                x0 = _U64(omono[e]) * Bu + lsu
                c1 = ocoef[e + 1]
                x1 = _U64(omono[e + 1]) * Bu + lsu
                for j in range(mgu):
                    S[acc + j] = c0 * S[x0 + j] + c1 * S[x1 + j]
            elif n == 3:
                c0 = ocoef[e]
                x0 = _U64(omono[e]) * Bu + lsu
                c1 = ocoef[e + 1]
                x1 = _U64(omono[e + 1]) * Bu + lsu
                c2 = ocoef[e + 2]
                x2 = _U64(omono[e + 2]) * Bu + lsu
                for j in range(mgu):
                    S[acc + j] = c0 * S[x0 + j] + c1 * S[x1 + j] + c2 * S[x2 + j]
            else:
                while e1 - e >= 4:
                    c0 = ocoef[e]
                    x0 = _U64(omono[e]) * Bu + lsu
                    c1 = ocoef[e + 1]
                    x1 = _U64(omono[e + 1]) * Bu + lsu
                    c2 = ocoef[e + 2]
                    x2 = _U64(omono[e + 2]) * Bu + lsu
                    c3 = ocoef[e + 3]
                    x3 = _U64(omono[e + 3]) * Bu + lsu
                    if e == e0:
                        for j in range(mgu):
                            S[acc + j] = c0 * S[x0 + j] + c1 * S[x1 + j] + c2 * S[x2 + j] + c3 * S[x3 + j]
                    else:
                        for j in range(mgu):
                            S[acc + j] = S[acc + j] + c0 * S[x0 + j] + c1 * S[x1 + j] + c2 * S[x2 + j] \
                                + c3 * S[x3 + j]
                    e += 4
                rr = e1 - e
                if rr == 3:
                    c0 = ocoef[e]
                    x0 = _U64(omono[e]) * Bu + lsu
                    c1 = ocoef[e + 1]
                    x1 = _U64(omono[e + 1]) * Bu + lsu
                    c2 = ocoef[e + 2]
                    x2 = _U64(omono[e + 2]) * Bu + lsu
                    for j in range(mgu):
                        S[acc + j] = S[acc + j] + c0 * S[x0 + j] + c1 * S[x1 + j] + c2 * S[x2 + j]
                elif rr == 2:
                    c0 = ocoef[e]
                    x0 = _U64(omono[e]) * Bu + lsu
                    c1 = ocoef[e + 1]
                    x1 = _U64(omono[e + 1]) * Bu + lsu
                    for j in range(mgu):
                        S[acc + j] = S[acc + j] + c0 * S[x0 + j] + c1 * S[x1 + j]
                elif rr == 1:
                    c0 = ocoef[e]
                    x0 = _U64(omono[e]) * Bu + lsu
                    for j in range(mgu):
                        S[acc + j] = S[acc + j] + c0 * S[x0 + j]
            t = targets[k]
            if W == 0:
                ob = _U64(t) * Lu + l0gu
                for j in range(mgu):
                    out[ob + j] = S[acc + j]
            else:                                       # into the block's tiles
                ob = _U64(tile0 * P + t) * Wu
                a = acc
                for tt in range(full):
                    for j in range(Wu):
                        out[ob + j] = S[a + j]
                    ob += PWu
                    a += Wu
                if full < nt:                           # padding lanes: lane L-1's value
                    for j in range(W):
                        out[ob + _U64(j)] = S[acc + _U64(min(full * W + j, mg - 1))]
        if W > 0:
            for tt in range(ms // W):
                base = _U64((l0 // W + tt) * P) * Wu
                for z in range(zslots.shape[0]):
                    ob = base + _U64(zslots[z]) * Wu
                    for j in range(Wu):
                        out[ob + j] = 0.0
    return 0
