"""Argument, alias and workspace checks: everything a call verifies in
Python before compiled code runs (docs/design.rst §6: never a segfault, never a
silently wrong result).

* **Arrays** (:func:`vector`): a plain 1-D C-contiguous ``float64``/``float32``
  ``ndarray`` of the expected length; masked arrays (whose masks compiled
  code would ignore) and complex data (which would be cast, dropping the
  imaginary part) are refused; outputs must be writable.
* **Scalars**: ``t`` a real number, finite or NaN (:func:`time`); the
  parameter vector ``p`` real, length-checked and copied (:func:`params`).
* **Aliasing** (:func:`disjoint`): an output sharing memory with any input
  (or with the workspace) is refused; every call that writes ``out`` from
  other arrays refuses rather than computing from half-overwritten inputs.
* **Workspaces** (:func:`workspace`): a workspace carries its program's
  fingerprint and is checked for the sizes and dtypes the program's kernels
  index (the lane map's length: its values are data); the verified arrays are remembered (by identity,
  holding references so an id cannot be reused), so a bound workspace costs
  a few identity comparisons per call.
* **Lane counts** (:func:`lanes`): a positive ``int``, and the workspace it
  implies must fit under :func:`workspace_limit` (a quarter of physical
  memory unless ``$ESMJAC_WORKSPACE_LIMIT`` or :func:`set_workspace_limit`
  says otherwise).
"""
from __future__ import annotations

import math
import numbers
import numpy as np

from ..errors import JacError
from ..limits import set_workspace_limit, workspace_limit
from . import kernels as K

__all__ = ["vector", "time", "params", "disjoint", "workspace", "lanes", "workspace_limit",
           "set_workspace_limit", "report_nonfinite", "integrable", "NOTHING_TO_INTEGRATE",
           "cell_options"]

#: Why a document with no ODE states is refused by the integrators (the
#: words of ``esmjac check``'s "nothing to check").
NOTHING_TO_INTEGRATE = "nothing to integrate: no ODE states (the document integrates no state variables)"

DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


def _refuse(msg: str) -> JacError:
    return JacError("bad_argument", msg)


def _kind_error(name: str, x) -> JacError | None:
    if isinstance(x, np.ma.MaskedArray):
        return _refuse(f"`{name}` is a masked array; compiled kernels would ignore its mask. Pass "
                       f"{name}.filled(value) or a plain ndarray")
    if isinstance(x, np.ndarray) and np.iscomplexobj(x):
        return _refuse(f"`{name}` is complex ({x.dtype}); the programs evaluate real values only")
    return None


def vector(name: str, x, n: int, dtype=None, *, out: bool = False) -> np.ndarray:
    """``x`` if it is a plain 1-D contiguous float64/float32 array of length
    ``n`` (dtype ``dtype`` when given; writable when ``out``)."""
    err = _kind_error(name, x)
    if err is not None:
        raise err
    if not isinstance(x, np.ndarray):
        raise _refuse(f"`{name}` must be a NumPy array, got {type(x).__name__}")
    if x.ndim != 1:
        raise _refuse(f"`{name}` must be 1-D (flat lane layout), got shape {x.shape}")
    if dtype is not None and x.dtype != dtype:
        raise _refuse(f"`{name}` has dtype {x.dtype}; this call needs {np.dtype(dtype)}")
    if x.dtype not in DTYPES:
        raise _refuse(f"`{name}` has dtype {x.dtype}; use float64 or float32")
    if not x.flags.c_contiguous:
        raise _refuse(f"`{name}` is not contiguous; pass np.ascontiguousarray({name})")
    if x.shape[0] != n:
        raise _refuse(f"`{name}` has length {x.shape[0]}; expected {n}")
    if out and not x.flags.writeable:
        raise _refuse(f"`{name}` is read-only; pass a writable array")
    return x


def time(t) -> float:
    """``t`` as a float: a real number, finite or NaN (never a string, an
    array, ``None``, a complex number or a boolean)."""
    if type(t) is float and t - t == 0.0:        # the per-call fast path: a finite float
        return t
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Real):
        if isinstance(t, np.ndarray) and t.ndim == 0 and t.dtype.kind in "iuf":
            t = t.item()
        else:
            raise _refuse(f"`t` must be a real number, got {type(t).__name__}"
                          + (" (complex)" if isinstance(t, numbers.Complex) else ""))
    v = float(t)
    if math.isinf(v):
        raise _refuse(f"`t` is {v}; pass a finite time (NaN is accepted and reported if it matters)")
    return v


def positive(name: str, x, code: str = "bad_argument") -> float:
    """``x`` as a positive finite float (a step size, a tolerance)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise JacError(code, f"{name} must be a number, got {x!r}") from None
    if not (v > 0.0 and math.isfinite(v)):
        raise JacError(code, f"{name} must be positive, got {x!r}")
    return v


def time_span(span) -> tuple:
    """``(t0, t1)`` of an integration span: finite, ``t1 >= t0``."""
    try:
        t0, t1 = (float(x) for x in span)
    except (TypeError, ValueError):
        raise _refuse(f"t_span must be (t0, t1), got {span!r}") from None
    if not (math.isfinite(t0) and math.isfinite(t1)) or t1 < t0:
        raise _refuse(f"t_span must be finite with t1 >= t0, got {(t0, t1)}")
    return t0, t1


def params(p, n: int) -> np.ndarray:
    """``p`` as a contiguous float64 vector of ``n`` entries (``p`` itself
    when it already is one; a converted copy otherwise)."""
    if type(p) is np.ndarray and p.dtype == np.float64 and p.ndim == 1 and p.shape[0] == n \
            and p.flags.c_contiguous:
        return p
    if p is None:
        raise _refuse("`p` is required (the program's parameter vector, see .param_names)")
    err = _kind_error("p", p)
    if err is not None:
        raise err
    if isinstance(p, (str, bytes)):
        raise _refuse("`p` must be a sequence of numbers, got a string")
    try:
        a = np.array(p, copy=True)
    except (TypeError, ValueError) as exc:
        raise _refuse(f"`p` must be a sequence of real numbers ({exc})") from None
    if a.dtype.kind == "c":
        raise _refuse("`p` is complex; the programs evaluate real values only")
    if a.dtype.kind not in "biuf":
        raise _refuse(f"`p` must hold real numbers, got dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a is p:
        a = a.copy()
    if a.ndim != 1 or a.shape[0] != n:
        raise _refuse(f"`p` must have {n} entries (scalar parameters in declaration order), got "
                      f"shape {a.shape}")
    return a


def disjoint(outputs: dict, inputs: dict) -> None:
    """Refuse any output that shares memory with an input or another output."""
    outs = list(outputs.items())
    for k, (on, o) in enumerate(outs):
        if type(o) is not np.ndarray:
            continue
        ro = None
        for name, x in list(inputs.items()) + outs[k + 1:]:
            if not isinstance(x, np.ndarray):
                continue            # converted to a fresh array by the call: cannot alias
            if x is not o and x.base is None and o.base is None:
                continue            # two arrays each owning its memory: no overlap possible
            if ro is None:
                ro = _root(o)
            rx = _root(x)
            if rx is not ro and type(rx) is np.ndarray and type(ro) is np.ndarray:
                continue            # two arrays owning distinct memory: no overlap possible
            if np.may_share_memory(o, x) and np.shares_memory(o, x):
                raise _refuse(f"`{on}` shares memory with `{name}`; this call does not work in "
                              f"place: pass a separate output array")


def _root(a):
    """The object that owns ``a``'s memory (an ndarray, or a foreign buffer)."""
    while type(a) is not np.ndarray or a.base is not None:
        b = getattr(a, "base", None)
        if b is None:
            return a
        a = b
    return a


def any_nonfinite(x: np.ndarray) -> bool:
    """Whether ``x`` holds a NaN or an infinity. A NaN or infinity makes the
    sum non-finite, so one cheap reduction answers the common all-finite
    case; only a non-finite sum (possibly a mere overflow) pays for the
    exact elementwise scan."""
    if math.isfinite(x.sum()):
        return False
    return not bool(np.isfinite(x).all())


def workspace(ws, owner: str, what: str, n_hoist: int, cell_shape: tuple | None) -> None:
    """Check a workspace/scratch against the program that is about to index it.

    ``ws`` needs ``owner``, ``lanes``, ``h`` (hoisted values, float64, at
    least ``n_hoist``) and ``cix`` (int64 lane map of ``len(cell_shape) *
    lanes`` entries; ``cell_shape`` None for a global program). Verified
    arrays are remembered by identity in ``ws.verified`` (with references
    held)."""
    if getattr(ws, "owner", None) != owner:
        raise JacError("bad_argument", f"this {what} belongs to another program; make one with this "
                       "program's own new_workspace()/new_buffers()")
    seen = getattr(ws, "verified", None)
    h, cix, L = ws.h, ws.cix, ws.lanes
    if seen is not None and seen[0] is h and seen[1] is cix and seen[2] == L and \
            h.shape[0] >= n_hoist and cix.shape[0] == seen[3]:
        return
    if isinstance(L, (bool, np.bool_)) or not isinstance(L, (int, np.integer)) or L < 1:
        raise _refuse(f"the {what}'s lane count {L!r} is not a positive integer")
    for name, a, dt in (("h", h, np.float64), ("cix", cix, np.int64)):
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.dtype != dt or not a.flags.c_contiguous:
            raise _refuse(f"the {what}'s `{name}` array was replaced by one of the wrong kind; make a "
                          "new workspace")
    if not h.flags.writeable:
        raise _refuse(f"the {what}'s `h` array is read-only")
    if h.shape[0] < max(n_hoist, 1):
        raise _refuse(f"the {what}'s `h` holds {h.shape[0]} values; this program hoists {n_hoist}")
    if cell_shape is None:
        need = 0
    else:
        need = len(cell_shape) * int(L)
    if cix.shape[0] < max(need, 1):
        raise _refuse(f"the {what}'s lane map has {cix.shape[0]} entries; {L} lanes need {need}")
    # The lane map's values are only read as numbers (a cell's index in
    # index-dependent coefficients), never used as addresses, so only its
    # length matters for memory safety; a chunked grid (the dask adapter)
    # legitimately runs a small template program on far-away cells.
    ws.verified = (h, cix, L, cix.shape[0])


def lanes(n, bytes_per_lane: int, what: str = "workspace") -> int:
    """``n`` as a lane count: a positive integer whose workspace fits the limit."""
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
        raise _refuse(f"lanes must be a positive integer, got {n!r} ({type(n).__name__})")
    n = int(n)
    if n < 1:
        raise _refuse(f"lanes must be >= 1, got {n}")
    need = n * int(bytes_per_lane)
    lim = workspace_limit()
    if need > lim:
        raise _refuse(f"a {what} of {n} lanes needs about {need:,} bytes, over the limit of {lim:,} "
                      "bytes (a quarter of physical memory by default; raise it with "
                      "esmjac.runtime.checks.set_workspace_limit or $ESMJAC_WORKSPACE_LIMIT, or use "
                      "fewer lanes per workspace)")
    return n


def report_nonfinite(out: np.ndarray, inputs: tuple, t: float, what: str, name_of=None) -> None:
    """Called when ``out`` has a non-finite value: ``evaluation_error`` unless
    an input was already non-finite (then it is the caller's business)."""
    if any(x.size and K.count_nonfinite(np.ascontiguousarray(x)) for x in inputs):
        return
    i = K.first_nonfinite(out)
    where = f"`{name_of(i)}` (output position {i})" if name_of is not None else f"output position {i}"
    if math.isnan(t):
        raise JacError("evaluation_error",
                       f"the {what} has a non-finite value {out[i]} at {where}: `t` is NaN")
    raise JacError("evaluation_error",
                   f"the {what} has a non-finite value {out[i]} at {where} although every input is "
                   "finite (a singular coefficient such as 1/0, log(0), sqrt of a negative number or "
                   "an overflow at this point)")


def integrable(prog) -> None:
    """Refuse a program with no ODE states before an integrator "solves" it
    (a solver would report success on an empty state)."""
    if not prog.layout.states:
        raise JacError("bad_argument", NOTHING_TO_INTEGRATE)


def cell_options(options: dict | None, per_cell=None, what: str = "options") -> dict | None:
    """Build options with the per-cell parameters said one way.

    ``per_cell=[...]`` (every adapter's keyword) is the build option
    ``per_lane`` (the programs' name, still accepted in ``options``); names
    may be short (``"T"``) where unambiguous or qualified (``"Chem.T"``:
    resolved by ``esmjac.model.layout.resolve_names`` at build time),
    as a list or a tuple. Both spellings naming different parameters are
    refused. Returns a new dict (or None: no options at all)."""
    if options is not None and not isinstance(options, dict):
        raise JacError("bad_option", f"{what} is a dict of build options, got {type(options).__name__}")
    out = dict(options or {})
    for key, val in (("per_lane", out.get("per_lane")), ("per_cell", per_cell)):
        if isinstance(val, str):
            raise JacError("bad_option", f"{key} is a list of parameter names, e.g. ['T', 'j_NO2'], "
                                         f"not the string {val!r}")
        if val is not None and not isinstance(val, (list, tuple)):
            raise JacError("bad_option", f"{key} is a list or tuple of parameter names, "
                                         f"got {type(val).__name__}")
    if "per_lane" in out:
        out["per_lane"] = tuple(out["per_lane"] or ())
    if per_cell is not None:
        pc = tuple(per_cell)
        if out.get("per_lane") and out["per_lane"] != pc:
            raise JacError("bad_option", f"per_cell={list(pc)} and {what}['per_lane']="
                                         f"{list(out['per_lane'])} disagree; say it once (per_cell=)")
        out["per_lane"] = pc
    return out if (out or options is not None) else None
