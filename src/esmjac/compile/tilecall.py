"""Tile loops that call a generated tile function through its address.

A generated module's tiled chunk is a *tile function* (``tile_<name>``: the
model's arithmetic over one tile of lanes, compile/codegen.py) and a loop
over the tiles. Written as one jitted wrapper per chunk, Numba linked the
tile function's LLVM module into the wrapper's and re-ran the whole O3
pipeline and the machine-code generation on it: the wrapper cost 0.7-1.0x
the tile function's own compile again, for a loop that does nothing but
call it (benchmarks/compile_events.py: ``sflchunk``/``schunk``/``_chunk``,
≈ 425 s of a cold test run's 1,595 s of Numba compile).

Here the loops are written once, for every model and chunk: the loop of a
direct-write chunk (:func:`parallel_fl`) and of a right-hand side chunk
(:func:`parallel_rhs`), cached by Numba (``cache=True``) beside the package
like any of its kernels, and their serial twins (:func:`serial_loop`: the
same text with ``prange`` as ``range``, compiled from the kernel cache by
content hash, as the tape interpreter's twin is). They call the tile function through the address
of its C-ABI wrapper (Numba writes one for every function it compiles):
an integer argument, so their modules link nothing and their type does
not name the callee. The tile function is compiled (or loaded from Numba's
cache) for one canonical signature per dtype *variant* — its arrays 1-D,
C-contiguous, of the dtypes the call passes, its integers int64 — when a
call first needs that variant (:class:`TileCall`).

Trust: an address comes only from :meth:`TileCall.address`, which asks the
dispatcher of a tile function of the verified, executed kernel module
(compile/cache.py) for the compile result of that exact signature; the
table of addresses is private to the call object (and to a serial driver,
compile/twins.py). The loops check the entry of the call's variant before
calling (zero: not resolved yet; the loop returns ``-1 - variant`` and the
caller resolves it and calls again), so an unresolved variant never jumps
to address zero. The arithmetic is the tile function's, unchanged: the
same bits as a linked call, for any tile width, thread count or lane order.
"""
from __future__ import annotations

import numba as nb
import numpy as np
from llvmlite import ir
from numba import types
from numba.core.typing import signature
from numba.extending import intrinsic

from ..errors import JacError

__all__ = ["TileCall", "parallel_fl", "parallel_rhs", "serial_loop", "variant",
           "NVARIANTS", "TILES_PER_ITEM"]

#: Tiles per parallel work item of a direct-write chunk (one scratch section each).
TILES_PER_ITEM = 64

#: Float arrays whose dtype picks the variant (float64 or float32 each): the
#: state, the forcing, the hoisted values, the output and the tile scratch.
_NFLOAT = 5
NVARIANTS = 1 << _NFLOAT
_CODE = {types.float64: 0, types.float32: 1}
_DT = {0: types.float64, 1: types.float32}


def _is_vec(x, dtype=None) -> bool:
    return isinstance(x, types.Array) and x.ndim == 1 and x.layout == "C" and \
        (x.dtype in _CODE if dtype is None else x.dtype == dtype)


def _variant_of(floats) -> int:
    return sum(_CODE[x.dtype] << i for i, x in enumerate(floats))


@intrinsic
def variant(typingctx, u, f, h, out, S):
    """The dtype variant of a call (a constant of its types): bit ``i`` set
    when float array ``i`` of (``u``, ``f``, ``h``, ``out``, ``S``) is float32."""
    floats = (u, f, h, out, S)
    if not all(_is_vec(x) for x in floats):
        return None
    v = _variant_of(floats)

    def codegen(context, builder, sig, args):
        return context.get_constant(types.int64, v)
    return types.int64(u, f, h, out, S), codegen


def _fl_args(u, f, h, out, S) -> tuple:
    """A direct-write tile function's canonical argument types:
    ``(u, f, h, cix, out, L, w, t, S)``."""
    C = (lambda x: types.Array(x, 1, "C"))
    return (C(u), C(f), C(h), C(types.int64), C(out), types.int64, types.int64, types.int64, C(S))


def _rhs_args(u, f, h, out) -> tuple:
    """A right-hand side tile function's canonical argument types:
    ``(u, f, cix, L, l0, h, out, Lo, lo, j0, m)``."""
    C = (lambda x: types.Array(x, 1, "C"))
    i = types.int64
    return (C(u), C(f), C(types.int64), i, i, C(h), C(out), i, i, i, i)


def _call_codegen(canon):
    def codegen(context, builder, sig, args):
        vals = []
        for ty, cty, v in zip(sig.args[1:], canon, args[1:]):
            # An array's data model is the same struct whatever its
            # read-only flag: passed as it is; integers become int64.
            vals.append(v if isinstance(cty, types.Array) else context.cast(builder, v, ty, cty))
        fnty = ir.FunctionType(context.get_value_type(types.int64),
                               [context.get_value_type(c) for c in canon])
        addr = context.cast(builder, args[0], sig.args[0], types.int64)
        return builder.call(builder.inttoptr(addr, fnty.as_pointer()), vals)
    return codegen


@intrinsic
def call_fl(typingctx, a, u, f, h, cix, out, L, w, t, S):
    """``tile(u, f, h, cix, out, L, w, t, S)`` at address ``a`` (a
    direct-write tile function's C wrapper for these dtypes)."""
    if not (all(_is_vec(x) for x in (u, f, h, out, S)) and _is_vec(cix, types.int64)
            and all(isinstance(x, types.Integer) for x in (a, L, w, t))):
        return None
    canon = _fl_args(u.dtype, f.dtype, h.dtype, out.dtype, S.dtype)
    return types.int64(a, u, f, h, cix, out, L, w, t, S), _call_codegen(canon)


@intrinsic
def call_rhs(typingctx, a, u, f, cix, L, l0, h, out, Lo, lo, j0, m):
    """``tile(u, f, cix, L, l0, h, out, Lo, lo, j0, m)`` at address ``a``
    (a right-hand side tile function's C wrapper for these dtypes)."""
    if not (all(_is_vec(x) for x in (u, f, h, out)) and _is_vec(cix, types.int64)
            and all(isinstance(x, types.Integer) for x in (a, L, l0, Lo, lo, j0, m))):
        return None
    canon = _rhs_args(u.dtype, f.dtype, h.dtype, out.dtype)
    return types.int64(a, u, f, cix, L, l0, h, out, Lo, lo, j0, m), _call_codegen(canon)


_JIT = dict(cache=True, nogil=True, error_model="numpy")

@nb.njit(parallel=True, **_JIT)
def parallel_fl(A, u, f, h, cix, out, L, S, w, sz, zr):
    """A direct-write chunk over ``L`` lanes in tiles of ``w``: per work
    item of :data:`TILES_PER_ITEM` tiles (a ``prange``: each item its own
    scratch section, so the same bits for any thread count) its scratch
    section ``sz`` of ``S``, the runs ``zr`` (``[[first, past_last], ...]``,
    elements) of it zeroed (the output sections no band of the chunk
    stores), then each tile; the number of non-finite values stored
    (``-1 - variant`` when the tile function's address for this call's
    variant is not in ``A`` yet). Its serial twin: :func:`serial_loop`."""
    v = variant(u, f, h, out, S)
    a = A[v]
    if a == 0:
        return -1 - v
    nt = (L + w - 1) // w
    bad = 0
    for it in nb.prange((nt + TILES_PER_ITEM - 1) // TILES_PER_ITEM):
        Sv = S[it * sz:(it + 1) * sz]
        for k in range(zr.shape[0]):
            z0 = nb.uint64(zr[k, 0])     # unsigned: no wraparound select per store (a memset)
            for j in range(zr[k, 1] - zr[k, 0]):
                Sv[z0 + nb.uint64(j)] = 0.0
        for t in range(it * TILES_PER_ITEM, min(nt, (it + 1) * TILES_PER_ITEM)):
            bad += call_fl(a, u, f, h, cix, out, L, w, t, Sv)
    return bad


@nb.njit(parallel=True, **_JIT)
def parallel_rhs(A, u, f, h, cix, out, L, w):
    """A right-hand side chunk over ``L`` lanes in tiles of ``w`` (a
    ``prange``; the last tile shifted back to end at lane ``L - 1``; fewer
    than ``w`` lanes in one call over them); the number of non-finite values
    stored (``-1 - variant``: the address is not in ``A`` yet). Its serial
    twin: :func:`serial_loop`."""
    v = variant(u, f, h, out, out)
    a = A[v]
    if a == 0:
        return -1 - v
    if L < w:
        return call_rhs(a, u, f, cix, L, 0, h, out, L, 0, 0, L)
    bad = 0
    for t in nb.prange((L + w - 1) // w):
        l0 = min(t * w, L - w)
        bad += call_rhs(a, u, f, cix, L, l0, h, out, L, l0, t * w - l0, w)
    return bad


def serial_loop(kind: str):
    """The serial twin of :func:`parallel_fl` (``kind`` ``"fl"``) or
    :func:`parallel_rhs` (``"rhs"``): the same source with ``prange`` as
    ``range`` (compile/twins.py, from the kernel cache by content hash), so
    the serial and the parallel loop are one text and give the same bits."""
    from .twins import serial_twin      # (twins imports this module)

    return serial_twin(parallel_fl if kind == "fl" else parallel_rhs)


def _floats(v: int) -> tuple:
    return tuple(_DT[(v >> i) & 1] for i in range(_NFLOAT))


class TileCall:
    """A tiled chunk of a generated module, called like the jitted chunk it
    replaces: ``call(u, f, h, cix, out, L[, S])`` -> non-finite values
    stored. ``tile`` is the chunk's tile function (a dispatcher of the
    module), ``kind`` ``"fl"`` (direct writes, scratch ``S``) or ``"rhs"``,
    ``w`` the tile width, ``sz`` and ``zr`` a direct-write chunk's scratch
    section and zeroed runs. ``table`` holds the tile function's addresses
    per dtype variant (0: not resolved yet)."""

    __slots__ = ("tile", "kind", "parallel", "w", "sz", "zr", "table", "loop", "__name__")

    def __init__(self, tile, kind: str, parallel: bool, w: int, sz: int = 0, zr=()):
        self.tile, self.kind, self.parallel, self.w, self.sz = tile, kind, bool(parallel), int(w), int(sz)
        z = np.asarray(zr, dtype=np.int64).reshape(-1, 2)
        z.setflags(write=False)
        self.zr = z
        self.table = np.zeros(NVARIANTS, np.int64)
        self.loop = (parallel_fl if kind == "fl" else parallel_rhs) if self.parallel else serial_loop(kind)
        self.__name__ = f"{'' if self.parallel else 's'}{getattr(tile, '__name__', 'tile_')[5:]}"

    @property
    def signatures(self) -> list:
        """The argument types the chunk's loop is compiled for, in the
        chunk's own order ``(u, f, h, cix, out, L[, S])`` (as a jitted
        chunk's ``signatures``): the loop is the package's, shared by every
        model's chunks of this kind, so these are all its calls' flavours.
        The tile function itself compiles for one canonical signature per
        dtype variant (:meth:`address`)."""
        n = 7 if self.kind == "fl" else 6
        return [tuple(sig[1:1 + n]) for sig in self.loop.signatures]

    def address(self, v: int) -> int:
        """The address of the tile function's C wrapper for variant ``v``
        (compiled, or loaded from Numba's cache, for that signature)."""
        return resolve(self.tile, self.kind, v)

    def fill(self, table: np.ndarray, r: int) -> None:
        """Resolve the variant a loop returned ``r = -1 - variant`` for into ``table``."""
        v = -1 - int(r)
        if not 0 <= v < NVARIANTS:
            raise JacError("internal_error", f"a tile loop returned {r}")
        table[v] = self.address(v)

    def __call__(self, u, f, h, cix, out, L, S=None):
        if self.kind == "fl":
            r = self.loop(self.table, u, f, h, cix, out, L, S, self.w, self.sz, self.zr)
            if r < 0:
                self.fill(self.table, r)
                r = self.loop(self.table, u, f, h, cix, out, L, S, self.w, self.sz, self.zr)
        else:
            r = self.loop(self.table, u, f, h, cix, out, L, self.w)
            if r < 0:
                self.fill(self.table, r)
                r = self.loop(self.table, u, f, h, cix, out, L, self.w)
        return r


_ADDR: dict = {}


def resolve(tile, kind: str, v: int) -> int:
    """The C wrapper address of ``tile`` (a dispatcher) compiled for the
    canonical signature of ``kind`` at dtype variant ``v`` (memoized)."""
    key = (tile, kind, v)
    a = _ADDR.get(key)
    if a is None:
        fu, ff, fh, fo, fs = _floats(v)
        args = _fl_args(fu, ff, fh, fo, fs) if kind == "fl" else _rhs_args(fu, ff, fh, fo)
        cres = tile.get_compile_result(signature(types.int64, *args))
        if cres.signature.return_type != types.int64:
            raise JacError("internal_error", f"tile function returns {cres.signature.return_type}")
        a = int(cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name))
        if a <= 0:
            raise JacError("internal_error", "a tile function without a C wrapper")
        _ADDR[key] = a
    return a
