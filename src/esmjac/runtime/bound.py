"""Bound calls: the per-call path decided once (``prog.bind(...)``).

``run = jac.bind(plan, ws)`` checks the plan, the workspace, the lane count,
the sizes and the dtype once, resolves every compiled function the calls
need (the plan's direct-write kernel, serial twins when the call is small,
the non-finite scan) and makes one warm call on scratch arrays, so the
first real call is already compiled. Each ``run(u, p, t, forcing, out)``
then costs only attribute checks of its arguments (type, shape, dtype,
contiguity: bad input is still refused before compiled code runs), with no
environment reads, imports, thread-count queries or allocations.

``run = rhs.bind(lanes)`` does the same for a right-hand side.

Why serial twins: below ``SERIAL_BELOW`` state elements the fork/join of a
parallel region costs more than the work, and switching the thread count
per call (``numba.set_num_threads``) costs more still; a serial twin runs
the same per-lane arithmetic, so its bits equal the parallel kernel's.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..compile.codegen import tile_scratch
from ..compile.twins import serial_twin
from .._frozen import readonly, ro
from ..errors import JacError
from . import checks
from . import kernels as K
from .threads import SERIAL_BELOW, one_thread
from .workspace import lane_cells, no_forcing

__all__ = ["BoundJacobian", "BoundRhs", "SERIAL_BELOW"]


def _warm_p(n: int) -> np.ndarray:
    """The parameter vector of a warm call: read-only, as the programs' own
    ``p0`` and the adapters' ``p`` are. Numba specializes on writability, so
    a writable one would compile signatures the real calls never use (and
    leave theirs to compile at the first timed call: ~20 s of CPU for the
    parallel tape interpreter, ~6 s for its serial twin)."""
    p = np.ones(n)
    p.setflags(write=False)
    return p


def _refuse(name: str, x, n: int, dtype) -> None:
    """The typed error for an argument that failed the cheap checks."""
    checks.vector(name, x, n, dtype, out=name == "out")
    raise JacError("bad_argument", f"`{name}` does not fit this binding")   # pragma: no cover


#: The inputs a binding checks against its output, in ``_disjoint``'s order.
_IN_NAMES = ("u", "p", "forcing", "workspace h", "workspace lane map")


class _Bound:
    """Shared argument checks and the call of bound calls (see module docstring)."""

    __slots__ = ("prog", "lanes", "dtype", "n_u", "n_out", "n_p", "n_f", "serial", "ws", "keep_point",
                 "_pv", "_p_src", "_f_none", "_body", "_scan", "_seen", "_ush", "_osh", "_ust", "_fsh",
                 "_what", "_pt", "_last_dtype", "_fp", "_ro")
    # set by _setup and the subclasses' __init__ (``_h``, ``_cix``: the subclasses' slots)
    _body: Callable
    _what: str
    _h: np.ndarray
    _cix: np.ndarray
    _f_none: np.ndarray | None
    _p_src: np.ndarray | None
    _seen: tuple
    _pt: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None   # copies, read-only views
    _last_dtype: np.dtype | None
    _fp: str | None
    _ro: tuple      # (u, p, forcing, and their read-only views): the last call's

    def __call__(self, u: np.ndarray, p, t: float, forcing, out: np.ndarray) -> np.ndarray:
        """Evaluate into ``out`` (and return it); bad input raises a
        ``JacError`` before compiled code runs."""
        sn = self._seen
        dt = self.dtype
        # The repeat call (a solver's loop): the very arrays of the last call
        # (kind, contiguity and aliasing checked then), their shape, dtype and
        # writability re-read (all three can be changed in place), a finite
        # float t. Everything else takes the full checks of _args.
        if sn and out is sn[0] and u is sn[1] and p is sn[2] and t.__class__ is float and t - t == 0.0 \
                and (forcing is sn[3] or (forcing is None and sn[3] is self._f_none)) \
                and u.shape == self._ush and out.shape == self._osh and u.dtype is dt and out.dtype is dt \
                and out.flags.writeable and (forcing is None or (forcing.shape == self._fsh
                                                                 and forcing.dtype is dt)):
            pv, f = p, sn[3]
        elif sn and out is sn[0] and p is sn[2] and u.__class__ is np.ndarray and u.base is None \
                and out.base is None and u is not out and t.__class__ is float and t - t == 0.0 \
                and (forcing is sn[3] or (forcing is None and sn[3] is self._f_none)) \
                and u.dtype is dt and u.shape == self._ush and u.strides == self._ust \
                and out.shape == self._osh and out.dtype is dt and out.flags.writeable \
                and (forcing is None or (forcing.shape == self._fsh and forcing.dtype is dt)):
            # A new state into the last call's output (a solver's next step):
            # both arrays own their memory, so they cannot overlap; the rest
            # is the last call's, checked then.
            self._seen = (out, u) + sn[2:]
            pv, f = p, sn[3]
        else:
            pv, t, f = self._args(u, p, t, forcing, out)
        # The kernels take their inputs read-only (one compiled flavour):
        # the views of the last call's arrays serve again while the caller
        # passes the same ones (a view shares their memory, which does not
        # move; their shape and dtype were re-read above; making a view
        # costs ~0.8 us, a tenth of a small call). One tuple, replaced
        # whole: threads sharing a binding read arrays and views that belong
        # together.
        u0, p0, f0, uv, pvv, fv = self._ro
        if u0 is not u or p0 is not pv or f0 is not f:
            uv = uv if u0 is u else ro(u)
            pvv = pvv if p0 is pv else ro(pv)
            fv = fv if f0 is f else ro(f)      # type: ignore[arg-type]  # (never None here: _args)
            self._ro = (u, pv, f, uv, pvv, fv)
        bad = self._body(uv, pvv, t, fv, out)     # a serial driver counts non-finite values itself
        ws = self.ws
        if ws is not None:
            ws.last_dtype = self._last_dtype
            ws.last_plan = self._fp
            ws.point = None
            if self.keep_point:
                pu, pp, pf, pp_ro, pf_ro = self._pt
                np.copyto(pu, u)
                np.copyto(pp, pv)
                np.copyto(pf, f)
                ws.point = (pu, pp_ro, t, pf_ro)     # read-only, as in JacWorkspace.keep_point
        if bad is None:
            bad = self._scan(out)
        if bad:
            checks.report_nonfinite(out, (u, pv, f), t, self._what)
        return out

    def _setup(self, prog, lanes: int, dtype, n_out: int) -> None:
        self.prog = prog
        self.lanes = int(lanes)
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.dtype(np.float64), np.dtype(np.float32)):
            raise JacError("bad_argument", f"dtype {self.dtype}: use float64 or float32")
        self.n_u = prog.u_size(self.lanes)
        self.n_out = int(n_out)
        self.n_p = len(prog.layout.params)
        self.n_f = prog.f_size(self.lanes)
        self.serial = self.n_u < SERIAL_BELOW
        self.ws = None
        self.keep_point = False
        self._pt = self._last_dtype = self._fp = None
        self._pv = None
        self._p_src = None
        self._seen = ()
        self._ro = (None,) * 6
        self._ush, self._osh, self._fsh = (self.n_u,), (self.n_out,), (self.n_f,)
        self._ust = (self.dtype.itemsize,)
        if self.n_f == 0:
            self._f_none = no_forcing(self.dtype)
        else:
            f0 = prog.forcing_default(self.lanes)
            self._f_none = None if f0 is None else np.ascontiguousarray(f0, dtype=self.dtype)
        self._scan = serial_twin(K.count_nonfinite) if self.serial else K.count_nonfinite

    def _args(self, u, p, t, forcing, out) -> tuple:
        """``(p, t, forcing)`` ready for the kernels, or a typed error.

        (The repeat call never gets here: ``__call__`` checks it inline.)
        A new call costs attribute reads and identity comparisons when it
        passes plain ndarrays of the bound shape and dtype (``dtype is`` the
        bound one: NumPy's native float dtypes are singletons; anything else
        takes the full check), the parameter array of the previous call and
        a float ``t``; new arrays are checked for aliasing once."""
        dt = self.dtype
        sn = self._seen
        if sn and sn[0] is out and sn[1] is u:
            # the arrays of the last call: their kind, contiguity and
            # aliasing were checked then; shape and dtype are re-read
            if u.shape != self._ush or out.shape != self._osh or u.dtype is not dt or out.dtype is not dt:
                self._vec("u", u, self.n_u)
                self._vec("out", out, self.n_out)
        elif u.__class__ is not np.ndarray or out.__class__ is not np.ndarray or u.dtype is not dt \
                or out.dtype is not dt or u.shape != self._ush or out.shape != self._osh \
                or u.strides != self._ust or out.strides != self._ust:
            self._vec("u", u, self.n_u)
            self._vec("out", out, self.n_out)
        if not out.flags.writeable:
            raise JacError("bad_argument", "`out` is read-only; pass a writable array")
        if t.__class__ is not float or not (t - t == 0.0 or t != t):
            t = checks.time(t)
        pv = p if (p is self._p_src and p is not None) else self._params(p)
        if forcing is None:
            f = self._f_none
            if f is None:
                raise JacError("bad_argument", "`forcing` is required (the document gives no defaults)")
        elif sn and forcing is sn[3] and forcing.shape == self._fsh and forcing.dtype is dt:
            f = forcing
        else:
            f = self._force(forcing)
        if not (sn and sn[0] is out and sn[1] is u and sn[2] is pv and sn[3] is f):
            self._disjoint(out, (u, pv, f, self._h, self._cix))
        return pv, t, f

    def _vec(self, name: str, x, n: int) -> None:
        if x.__class__ is not np.ndarray or x.shape != (n,) or x.dtype != self.dtype \
                or not x.flags.c_contiguous:
            _refuse(name, x, n, self.dtype)

    def _params(self, p) -> np.ndarray:
        if p is self._p_src and p is not None:
            return p                    # the same float64 array, checked before: read in place
        pv = checks.params(p, self.n_p)
        if p.__class__ is np.ndarray and p.dtype == np.float64 and p.flags.c_contiguous:
            self._p_src = p             # arrays only (a list may change under the same identity)
            return p
        return pv

    def _disjoint(self, out, ins: tuple) -> None:
        """Aliasing refused (checks.disjoint), re-checked only for what
        differs from the last call: an array whose memory was disjoint from
        ``out`` then still is (an ndarray's memory does not move), so with
        the same ``out`` only the new inputs are checked (a solver's new
        ``y`` each call: one pair, not five)."""
        key = (out,) + ins
        seen = self._seen
        if len(seen) == len(key) and seen[0] is out:
            changed = {n: x for n, x, was in zip(_IN_NAMES, ins, seen[1:]) if x is not was}
            if not changed:
                return
            checks.disjoint({"out": out}, changed)
        else:
            checks.disjoint({"out": out}, dict(zip(_IN_NAMES, ins)))
        self._seen = key

    def _force(self, forcing):
        if forcing is None:
            f = self._f_none
            if f is None:
                raise JacError("bad_argument", "`forcing` is required (the document gives no defaults)")
            return f
        if self.n_f == 0:
            if forcing.__class__ is np.ndarray and forcing.size == 0:
                return self._f_none              # an empty forcing is no forcing (as ``defaults``)
            raise JacError("bad_argument", "this model has no forcing fields; pass forcing=None")
        self._vec("forcing", forcing, self.n_f)
        return forcing


class BoundJacobian(_Bound):
    """``run(u, p, t, forcing, out)``: ``eval_into`` with everything but the
    numbers decided at binding time (``JacobianProgram.bind``)."""

    __slots__ = ("plan", "direct", "_slab", "_h", "_cix")

    def __init__(self, prog, plan, ws, dtype=np.float64, warm: bool = True, keep_point: bool = False):
        prog.check_plan(plan)
        prog.check_workspace(ws)
        plan.check_lanes(ws.lanes)
        self._setup(prog, ws.lanes, dtype, plan.out_size(ws.lanes))
        self._what = "Jacobian"
        self.plan, self.ws = plan, ws
        L = ws.lanes
        self.direct = (not ws.keep_slab) and plan.kind == "lane" and \
            (prog.kernel.engine == "codegen" or plan.tiled)
        self._h = ws.h
        self._cix = ws.cix
        self._slab = None if self.direct else ws.slab(self.dtype, prog.slab_size(L))
        # contract() reads the point of the last call: a copy (preallocated)
        self.keep_point = bool(keep_point)
        if keep_point:
            pu, pp = np.empty(self.n_u, dtype=self.dtype), np.empty(self.n_p)
            pf = np.empty(self.n_f if self.n_f else 1, dtype=self.dtype)
            self._pt = (pu, pp, pf, readonly(pp), readonly(pf))
        else:
            self._pt = None
        self._last_dtype = None if self.direct else self.dtype
        self._fp = plan.fingerprint
        self._body = self._make_body()
        if warm:
            self._warm()

    def _make_body(self) -> Callable:
        prog, plan, L, serial = self.prog, self.plan, self.lanes, self.serial
        kern = prog.kernel
        if self.direct and kern.engine == "tape":
            return self._tape_body()
        if self.direct:
            fk = prog.direct_kernel(plan)
            if self._h.shape[0] < fk.n_hoist:
                self._h = np.zeros(fk.n_hoist)
            tiled = fk.tile_scratch > 0
            S = np.empty(tile_scratch(fk.tile_scratch, L, plan.tile_width(L)), self.dtype) if tiled else None
            return fk.bind(self._h, self._cix, L, serial=serial, one_thread=one_thread, fused=True, scratch=S)
        B = self._slab
        run = kern.bind(self._h, self._cix, L, serial=serial, one_thread=one_thread)
        a = plan.arrays
        if plan.tiled:
            # the slab is lanes-fastest; the tiled layout's padding lanes
            # read the last real lane (the same gather as plan.scatter)
            tg = serial_twin(K.tile_gather) if serial else K.tile_gather
            W, P = plan.tile_width(L), int(plan.info["slots_per_lane"])
            ta = (a["ptr"], a["src"], a["a"])

            def body(u, p, t, f, out):
                run(u, p, t, f, B)
                tg(B, L, W, P, *ta, out)
            return body
        if plan.kind == "lane":
            gather = serial_twin(K.lane_gather) if serial else K.lane_gather
            ga = (a["ptr"], a["src"], a["a"], a["b"], a["stride"])

            def body(u, p, t, f, out):
                run(u, p, t, f, B)
                gather(B, L, *ga, out)
            return body
        if plan.kind == "point" and set(a) >= {"ptr", "src", "pos"}:
            pg = serial_twin(K.point_gather) if serial else K.point_gather
            pa = (a["ptr"], a["src"], a["pos"])
            zero = bool(plan.info.get("zero_first"))

            def body(u, p, t, f, out):
                run(u, p, t, f, B)
                if zero:
                    out[:] = 0
                pg(B, *pa, out)
            return body

        def scattered(u, p, t, f, out):
            run(u, p, t, f, B)
            K.scatter(plan, B, L, out)
        return scattered

    def _tape_body(self) -> Callable:
        """Direct slot stores of the tape engine (a tiled plan): the prologue
        tape into ``h``, then the plan's body tape over every stored lane."""
        plan, L = self.plan, self.lanes
        return self.prog.direct_tape(plan).bind(self._h, self._cix, L, plan.tile_width(L),
                                               int(plan.info["slots_per_lane"]), plan.capacity(L),
                                               serial=self.serial, dtype=self.dtype)

    def _warm(self) -> None:
        """Compile every specialization the calls use, on one-lane scratch
        (Numba specializes on types, not sizes)."""
        prog = self.prog
        if prog.kind != "cell" or self.plan.kind != "lane":
            return self._warm_full()
        saved = (self.lanes, self._body, self._h, self._cix, self._slab, self.n_u)
        try:
            tmp = _OneLane(self)
            tmp.run_once()
        finally:
            self.lanes, self._body, self._h, self._cix, self._slab, self.n_u = saved

    def _warm_full(self) -> None:
        u = np.ones(self.n_u, dtype=self.dtype)
        f = self._f_none if self._f_none is not None else np.ones(max(self.n_f, 1), dtype=self.dtype)
        out = np.zeros(self.n_out, dtype=self.dtype)
        h = self._h.copy()
        self._body(ro(u), _warm_p(self.n_p), 0.0, ro(f), out)
        self._h[:] = h
        self._scan(out)


class _OneLane:
    """A one-lane twin of a binding, for the warm call (same kernels and
    dtype, tiny arrays)."""

    def __init__(self, b: BoundJacobian):
        prog, plan = b.prog, b.plan
        self.b = b
        self.u = np.ones(prog.u_size(1), dtype=b.dtype)
        self.f = np.ones(max(prog.f_size(1), 1), dtype=b.dtype)
        if b._f_none is not None and not b._f_none.flags.writeable:
            self.f.setflags(write=False)      # the document's forcing, as the real calls pass it
        self.out = np.zeros(plan.out_size(1), dtype=b.dtype)
        b.lanes = 1
        b._h = b._h.copy()
        cix = lane_cells(prog.layout.cell_shape, 1)
        cix.setflags(write=b._cix.flags.writeable)      # the types the real calls pass
        b._cix = cix
        b._slab = None if b.direct else np.zeros(max(prog.slab_size(1), 1), dtype=b.dtype)
        b._body = b._make_body()

    def run_once(self) -> None:
        b = self.b
        b._body(ro(self.u), _warm_p(b.n_p), 0.0, ro(self.f), self.out)
        b._scan(self.out)


class BoundRhs(_Bound):
    """``run(u, p, t, forcing, out)``: the right-hand side with everything
    but the numbers decided at binding time (``RhsProgram.bind``)."""

    __slots__ = ("zero_first", "_h", "_cix")
    # (its __call__ is _Bound's: a global program's body zeroes ``out`` first)

    def __init__(self, prog, lanes: int | None = None, dtype=None, scratch=None, warm: bool = True):
        if scratch is not None:
            lanes = scratch.lanes
        lanes = lanes or (prog.cells if prog.kind == "cell" else 1)
        if prog.kind == "global" and lanes != 1:
            raise JacError("bad_argument", "a global-lane program has exactly one lane")
        if int(lanes) < 1:
            raise JacError("bad_argument", "lanes must be >= 1")
        self._setup(prog, lanes, prog.dtype if dtype is None else dtype, prog.u_size(int(lanes)))
        self._what = "right-hand side"
        if scratch is not None:
            checks.workspace(scratch, prog.owner, "scratch", prog.kernel.n_hoist,
                             prog.layout.cell_shape if prog.kind == "cell" else None)
        sc = scratch if scratch is not None else prog.new_buffers(self.lanes)
        self._h, self._cix = sc.h, sc.cix
        self.zero_first = prog.kind == "global"
        self._body = prog.kernel.bind(self._h, self._cix, self.lanes, serial=self.serial,
                                      one_thread=one_thread)
        if self.zero_first:
            run = self._body

            def body(u, p, t, f, out):
                out[:] = 0              # a global program's box chunks accumulate
                return run(u, p, t, f, out)
            self._body = body
        if warm:
            u = np.ones(self.n_u, dtype=self.dtype)
            f = self._f_none if self._f_none is not None else np.ones(max(self.n_f, 1), dtype=self.dtype)
            out = np.zeros(self.n_u, dtype=self.dtype)
            if prog.kind == "cell" and self.lanes > 1:
                c1 = lane_cells(prog.layout.cell_shape, 1)
                c1.setflags(write=self._cix.flags.writeable)     # the types the real calls pass
                f1 = f[:max(prog.f_size(1), 1)].copy()
                f1.setflags(write=f.flags.writeable)            # the document's forcing is read-only
                one = prog.kernel.bind(self._h.copy(), c1, 1, serial=self.serial, one_thread=one_thread)
                one(ro(u[:prog.u_size(1)].copy()), _warm_p(self.n_p), 0.0, ro(f1), out[:prog.u_size(1)].copy())
            else:
                h = self._h.copy()
                self._body(ro(u), _warm_p(self.n_p), 0.0, ro(f), out)
                self._h[:] = h
