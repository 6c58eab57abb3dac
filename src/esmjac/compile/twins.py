"""Serial twins and serial drivers: compiled variants of kernels, generated
from their source and imported from the kernel cache by content hash.

A *serial twin* is a fixed ``parallel=True`` kernel's own source with
``prange`` as ``range``, compiled without a parallel region: the same
per-lane arithmetic, so the same bits, without a fork/join per call. A
*serial driver* is one compiled entry that runs a generated module's
prologue, its serial chunks and the non-finite scan in one native call
(each Numba dispatch from Python costs about a microsecond, as much as a
one-cell kernel). Which to use when is the caller's policy
(:mod:`esmjac.runtime.threads`); how a kernel's chunks are called is
:meth:`esmjac.compile.engine.Kernel.bind`.
"""
from __future__ import annotations

import inspect
import textwrap

import numpy as np

from ..errors import JacError
from .cache import load_source
from .tilecall import NVARIANTS, TileCall

__all__ = ["serial_twin", "parallel_copy", "serial_driver"]

_TWINS: dict = {}


def serial_twin(fn):
    """The serial twin of a fixed ``parallel=True`` kernel: the same source
    with ``prange`` as ``range``, compiled without a parallel region (so the
    two never drift and give the same bits). Generated once into the
    kernel cache by content hash, like the model kernels."""
    return _copy(fn, serial=True)


def parallel_copy(fn):
    """A fixed ``parallel=True`` kernel compiled from a copy of its source
    in the kernel cache (by content hash), as its serial twin is: Numba
    keys its cache of a function by the file's path and modification time,
    so the package's own copy compiled again in every install or virtual
    environment of the same esmjac (the tape interpreter: ~15 s of CPU);
    the copy's file is the same wherever esmjac is installed."""
    return _copy(fn, serial=False)


def _copy(fn, serial: bool):
    tw = _TWINS.get((fn, serial))
    if tw is None:
        py = fn.py_func
        lines = textwrap.dedent(inspect.getsource(py)).splitlines()
        body = "\n".join(x for x in lines if not x.startswith("@"))
        if serial:
            body = body.replace("nb.prange(", "range(")
        flags = "cache=True, nogil=True, error_model='numpy'" if serial else \
            "parallel=True, cache=True, nogil=True, error_model='numpy'"
        what = "serial twin" if serial else "parallel copy"
        src = (f"# esmjac: {what} of {py.__module__}.{py.__name__} (generated; do not edit)\n"
               f"# from source {_sources_hash(py.__module__)}\n"
               "import importlib as _il\n"
               "import numba as nb\n"
               f"_m = _il.import_module({py.__module__!r})\n"
               "globals().update({k: v for k, v in vars(_m).items() if not k.startswith('__')})\n"
               f"\n\n@nb.njit({flags})\n{body}\n"
               )
        tw = _TWINS[fn, serial] = getattr(load_source(src), py.__name__)
    return tw


def _sources_hash(modname: str) -> str:
    """SHA-256 of the source files of ``modname`` and of every esmjac module
    whose functions it holds: a twin runs with that module's globals (its
    helpers, inlined into the twin's Numba cache entry), so its cache key —
    the hash of the twin's own source, which names this — must change with
    them, not only with the twinned function's text."""
    import hashlib
    import sys

    mod = sys.modules[modname]
    names = {modname}
    for v in vars(mod).values():
        m = getattr(getattr(v, "py_func", v), "__module__", None)
        if isinstance(m, str) and m.split(".")[0] == "esmjac":
            names.add(m)
    h = hashlib.sha256()
    for name in sorted(names):
        f = getattr(sys.modules.get(name), "__file__", None)
        if f:
            with open(f, "rb") as fh:
                h.update(name.encode() + b"\0" + fh.read() + b"\0")
    return h.hexdigest()[:24]


_DRIVERS: dict = {}


def serial_driver(mod, calls: tuple):
    """One compiled entry for a small call: ``drive(u, f, p, t, h, cix,
    out, L[, S]) -> number of non-finite outputs`` (``S``: the tile scratch)
    runs the prologue, the serial chunks ``calls`` (``(name, "cell" |
    "global" | "cellc" | "tile")``) of the generated module ``mod`` and the
    non-finite scan (``cellc``/``tile`` chunks count while they store: no
    scan when all do) in one native call: each Numba dispatch
    from Python costs about a microsecond, as much as a one-cell kernel.
    Generated next to the kernels by content hash (the module name is that
    hash), so it never outlives the kernels it calls. Tiled chunks
    (:class:`~esmjac.compile.tilecall.TileCall`) run the package's tile
    loops with their tile functions' addresses (a table the driver holds:
    the compiled driver links neither the loops' callees nor the tile
    functions)."""
    key = (mod.__name__, calls)
    d = _DRIVERS.get(key)
    if d is None:
        lines = [f"# esmjac: serial driver of {mod.__name__} (generated; do not edit)",
                 "import sys as _sys", "import numba as nb", "import numpy as np",
                 "import esmjac.compile.tilecall as _tc",
                 f"_k = _sys.modules[{mod.__name__!r}]", "prologue = _k.prologue",
                 "_sfl, _srhs = _tc.serial_loop('fl'), _tc.serial_loop('rhs')   # the tile loops' serial twins"]
        body = ["    prologue(p, t, h)", "    n = 0"]
        check: list = []
        call = {"cell": "c{}(u, f, h, cix, out, L)", "global": "c{}(u, f, h, out)",
                "cellc": "n += c{}(u, f, h, cix, out, L)", "tile": "n += c{}(u, f, h, cix, out, L, S)"}
        tcs: list = []
        for i, (name, kind) in enumerate(calls):
            fn = getattr(mod, name)
            if isinstance(fn, TileCall):
                r = len(tcs)
                tcs.append(fn)
                v = "vf" if fn.kind == "fl" else "vr"
                check += [f"    if A[{r}, {v}] == 0:", f"        return -1 - ({r} * _tc.NVARIANTS + {v})"]
                # The width and scratch size as int64, not literals: Numba
                # compiles a callee once per literal value it is called
                # with (serial_fl per plan and model: ~0.5 s each), and
                # the loops are the package's, one per flavour.
                if fn.kind == "fl":
                    lines.append(f"z{i} = _k.{name}.zr")
                    body.append(f"    n += _sfl(A[{r}], u, f, h, cix, out, L, S, np.int64({fn.w}), "
                                f"np.int64({fn.sz}), z{i})")
                else:
                    body.append(f"    n += _srhs(A[{r}], u, f, h, cix, out, L, np.int64({fn.w}))")
                continue
            lines.append(f"c{i} = _k.{name}")
            body.append("    " + call[kind].format(i))
        tiled = any(kind == "tile" for _, kind in calls)      # only tiles take the scratch
        if any(kind in ("cell", "global") for _, kind in calls):
            body += ["    for i in range(out.shape[0]):", "        if not np.isfinite(out[i]):",
                     "            n += 1"]
        if check:
            check = ["    vf = _tc.variant(u, f, h, out, S)" if tiled else "    vf = 0",
                     "    vr = _tc.variant(u, f, h, out, out)", *check]
        args = f"u, f, p, t, h, cix, out, L{', S' if tiled else ''}{', A' if tcs else ''}"
        src = "\n".join(lines + ["", "", "@nb.njit(cache=True, nogil=True, error_model='numpy')",
                                 f"def drive({args}):", *check, *body, "    return n", ""])
        d = load_source(src).drive
        if tcs:
            d = _TiledDriver(d, tuple(tcs))
        _DRIVERS[key] = d
    return d


class _TiledDriver:
    """A serial driver with tiled chunks: the compiled ``drive`` and the
    table of its tile functions' addresses (one row per tiled chunk, one
    column per dtype variant), resolved when a call first needs them."""

    __slots__ = ("drive", "tiles", "table")

    def __init__(self, drive, tiles: tuple):
        self.drive, self.tiles = drive, tiles
        self.table = np.zeros((len(tiles), NVARIANTS), np.int64)

    def __call__(self, *args):
        r = self.drive(*args, self.table)
        return r if r >= 0 else self.resolve(r, *args)

    def resolve(self, r: int, *args) -> int:
        """``drive(*args, table)`` again after resolving the variant the
        driver returned ``r = -1 - (row * NVARIANTS + variant)`` for (it
        checks every row it needs before it runs anything). A bound call
        (:meth:`~esmjac.compile.engine.Kernel.bind`) calls ``drive`` with
        ``table`` itself and this only on a negative result."""
        while r < 0:
            row, v = divmod(-1 - int(r), NVARIANTS)
            if not 0 <= row < len(self.tiles):
                raise JacError("internal_error", f"a serial driver returned {r}")
            self.table[row, v] = self.tiles[row].address(v)
            r = self.drive(*args, self.table)
        return r
