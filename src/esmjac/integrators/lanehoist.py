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

A cut is a pure function of the tape's content and ``row0`` (and of this
module's, :mod:`~esmjac.integrators.lanetape`'s and
:mod:`~esmjac.compile.massaction`'s code), and on GEOS-Chem fullchem it
costs ≈ 1 s of CPU (the re-scheduling, the encodings, the mass-action
expansion): :func:`split` stores it in the build cache under a key of that
content (:func:`esmjac.compile.cache.content_hash`), as plain arrays in a
signed entry (no pickle). What is read back is used only once it verifies
(the cache's signature and hashes: written by this user) and every array
checks against the input tape's own sizes — each tape instruction by
:func:`esmjac.compile.tape.check_tape`, each mass-action factor, term and
target by :func:`_check_poly` — since the kernels that run them do not
check bounds; anything else is a logged miss, removed and cut again.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from ..compile.cache import content_hash, discard_product, load_product, module_hash, store_product
from ..compile.polyroute import tape_ssa
from ..compile.ssa import LEAVES, Block, operands
from ..compile.massaction import PolyBody, expand
from ..compile.tape import OPS, Tape, TapeBounds, check_tape, encode
from ..errors import JacError
from .lanetape import encode_fused

log = logging.getLogger("esmjac.cache")

__all__ = ["LaneSplit", "split"]



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


def split(tape: Tape, row0: int, cache: bool = True) -> LaneSplit:
    """``tape`` (a cell body: ``store`` rows, no ``storeh``) cut at the state
    (module docstring); the hoisted rows start at field row ``row0``.
    Through the build cache unless ``cache`` is false (module docstring)."""
    if not cache:
        return _split(tape, row0)
    key = _key(tape, int(row0))
    hit = load_product(key, {})
    if hit is not None:
        try:
            return _revive(hit, tape, int(row0))
        except (JacError, ValueError, TypeError, KeyError, IndexError) as exc:   # (check_tape: cache_error)
            log.warning("esmjac cache: stored lane split b%s refused (%s: %s); cutting again", key[:40],
                        type(exc).__name__, exc)
            discard_product(key)
    cut = _split(tape, row0)
    store_product(key, _stored(cut), [], {})
    return cut


#: The modules a cut is computed by, beyond ``compile`` (which every
#: :func:`content_hash` covers).
_CODE = ("integrators/lanehoist.py", "integrators/lanetape.py")
_FORMAT = 1


def _key(tape: Tape, row0: int) -> str:
    h = hashlib.sha256()
    for a in (tape.code, tape.consts):
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return content_hash("lane-split", str(_FORMAT), module_hash(*_CODE), h.hexdigest(), str(int(tape.nreg)),
                        str(row0))


def _tape_parts(t: Tape | None):
    return None if t is None else (t.code, t.consts, int(t.nreg))


def _stored(cut: LaneSplit) -> dict:
    poly = None if cut.poly is None else {f.name: getattr(cut.poly, f.name) for f in dataclasses.fields(cut.poly)}
    return {"lane_split": _FORMAT, "rows": int(cut.rows), "prologue": _tape_parts(cut.prologue),
            "body": None if cut.prologue is None else _tape_parts(cut.body),
            "scheduled": _tape_parts(cut.scheduled), "poly": poly}


def _max1(code: np.ndarray, op: str) -> int:
    """One more than the largest operand ``a`` of ``op`` rows (0: none)."""
    sel = code[:, 0] == OPS.index(op)
    return int(code[sel, 2].max()) + 1 if sel.any() else 0


def _revive(hit, tape: Tape, row0: int) -> LaneSplit:
    """The stored cut of ``tape`` once every array checks against ``tape``'s
    own sizes (module docstring); a ValueError names what does not."""
    if not isinstance(hit, dict) or set(hit) != {"lane_split", "rows", "prologue", "body", "scheduled", "poly"} \
            or hit["lane_split"] != _FORMAT:
        raise ValueError("not a stored lane split")
    rows = hit["rows"]
    if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= 1 << 24:
        raise ValueError("bad row count")
    code = tape.code
    n_states, n_f, n_params = _max1(code, "lane_u"), _max1(code, "lane_f"), _max1(code, "param")
    n_hoist, n_cix, n_out = _max1(code, "hoist"), _max1(code, "idx"), _max1(code, "store")
    n_rows = max(n_f, row0 + rows)

    def tape_of(parts, forcing, stores):
        if not isinstance(parts, tuple) or len(parts) != 3:
            raise ValueError("bad stored tape")
        return check_tape(*parts, TapeBounds(n_hoist=n_hoist, n_params=n_params, n_states=n_states,
                                             n_forcing=forcing, n_cix=n_cix, stores=stores))

    sched = tape_of(hit["scheduled"], n_rows, n_out)
    if rows == 0:
        if hit["prologue"] is not None or hit["body"] is not None:
            raise ValueError("tapes stored for a cut that hoists nothing")
        pro, body = None, tape
    else:
        pro = tape_of(hit["prologue"], n_f, row0 + rows)
        tg = pro.code[pro.code[:, 0] == OPS.index("store"), 2]
        if not np.array_equal(np.unique(tg), np.arange(row0, row0 + rows)):
            raise ValueError("the prologue does not store exactly the hoisted rows")
        body = tape_of(hit["body"], n_rows, n_out)
    poly = None
    if hit["poly"] is not None:
        poly = _check_poly(hit["poly"], (n_states, n_rows, n_hoist, n_params), n_out)
    return LaneSplit(pro, body, row0, rows, sched, poly)


def _check_poly(fields, sizes: tuple, n_out: int) -> PolyBody:
    """A :class:`PolyBody` of the stored ``fields`` once its pointers are
    monotone and every factor, term and target is within ``sizes`` (rows of
    u, f, h, p) and ``n_out``; a ValueError otherwise."""
    names = [f.name for f in dataclasses.fields(PolyBody)]
    if not isinstance(fields, dict) or sorted(fields) != sorted(names):
        raise ValueError("not a stored mass-action body")
    want = {"fptr": np.int32, "fkind": np.int32, "fidx": np.int32, "optr": np.int32, "omono": np.int32,
            "ocoef": np.float64, "targets": np.int32}
    arr = {}
    for n in names:
        a = fields[n]
        if n not in want or not isinstance(a, np.ndarray) or a.dtype != want[n] or a.ndim != 1:
            raise ValueError(f"bad mass-action array {n}")
        a = np.array(a, order="C")
        a.setflags(write=False)
        arr[n] = a
    fptr, fkind, fidx, optr, omono = (arr[n] for n in ("fptr", "fkind", "fidx", "optr", "omono"))
    targets = arr["targets"]

    def ptr(p, n, what):
        if p.size < 1 or p[0] != 0 or p[-1] != n or (np.diff(p) < 0).any():
            raise ValueError(f"bad {what} pointers")

    ptr(fptr, fkind.size, "factor")
    ptr(optr, omono.size, "term")
    if fidx.size != fkind.size or arr["ocoef"].size != omono.size or targets.size != optr.size - 1:
        raise ValueError("mass-action arrays of mismatched sizes")
    if ((fkind < 0) | (fkind > 7)).any():
        raise ValueError("bad factor kind")
    hi = np.asarray(sizes, np.int64)[fkind % 4]
    if ((fidx < 0) | (fidx >= hi)).any():
        raise ValueError("a factor outside its rows")
    if ((omono < 0) | (omono >= fptr.size - 1)).any() or ((targets < 0) | (targets >= n_out)).any():
        raise ValueError("a term or target out of range")
    return PolyBody(**arr)


def _split(tape: Tape, row0: int) -> LaneSplit:
    """:func:`split`, computed."""
    ins, stores = tape_ssa(tape)
    var = [False] * len(ins)
    for v, (op, args) in enumerate(ins):
        if op == "time" or (op == "lane" and args[0] == "u"):
            var[v] = True
        elif op not in LEAVES:
            var[v] = any(var[a] for a in args)
    frontier: dict = {}                 # value -> row offset (first use order)

    def mark(v):
        if not var[v] and ins[v][0] not in LEAVES and v not in frontier:
            frontier[v] = len(frontier)

    for v, (op, args) in enumerate(ins):
        if var[v]:
            for a in operands(op, args):
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

