"""Corpus run: every ``.esm`` document under the given directories through
earthsci-ast's own problem and through esmjac's compiled path.

For each document this builds ``earthsci_ast.esm_problem(path, tspan)`` (the
ecosystem's state vector, initial state, parameters and right-hand side) and
``esmjac.adapters.scipy.ivp(path)`` (esmjac's compiled RHS and Jacobian, the
path users call), then checks, in this order:

1. ``ivp.names`` are earthsci-ast's state element names in its order;
2. ``ivp.y0`` is earthsci-ast's initial state;
3. the compiled RHS equals earthsci-ast's RHS at a perturbed state;
4. the compiled Jacobian equals central differences of earthsci-ast's RHS
   (every column for small models, a fixed sample of columns for large ones);
5. for models small enough, the reference assembly (``assemble``) equals the
   compiled Jacobian.

Outcomes per document: ``match`` (all checks pass), ``refusal`` (esmjac
raised a typed :class:`~esmjac.errors.JacError`), ``mismatch`` (a check
failed), ``crash`` (any other exception, or a timeout), and — not counted
against esmjac — ``not_evaluable`` (earthsci-ast builds no problem, or its
RHS raises) and ``no_states`` (nothing is integrated).

Usage::

    python -m benchmarks.corpus [DIR ...] [--json out.json] [--timeout S] [--limit N] [--recheck prev.json]

With no directory: the documents shipped in installed packages (esmjac's own
bundled models, any ``.esm`` inside the earthsci_ast wheel) and the tests' own
documents (``tests/support/documents``). Families are the first two path
components under each directory given.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import pathlib
import signal
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Outcome", "check_document", "discover", "default_roots", "run", "table", "main"]

OUTCOMES = ("match", "refusal", "mismatch", "crash", "not_evaluable", "no_states")
#: Above this many state elements the Jacobian is checked on a column sample.
FULL_FD_BELOW = 300
SAMPLE_COLUMNS = 40
#: Above this many elements the reference assembly is not run (it is slow by design;
#: every evaluable corpus model is below: the largest, 343 elements, assembles in 0.6 s).
ORACLE_BELOW = 5000


@dataclass
class Outcome:
    """One document's result (``detail`` says why, for anything but a match)."""

    family: str
    path: str
    outcome: str
    detail: str = ""
    n: int = 0
    seconds: float = 0.0


class _Timeout(BaseException):
    """Raised by the alarm; a BaseException so no ``except Exception`` in the
    code under test turns it into a refusal."""


def _alarm(*_):
    raise _Timeout()


# ----------------------------------------------------------------------------- discovery

def default_roots() -> list:
    """Documents shipped in installed packages plus the tests' own documents."""
    import importlib.resources
    roots = []
    for pkg in ("esmjac.models", "earthsci_ast"):
        try:
            roots.append(pathlib.Path(str(importlib.resources.files(pkg))))
        except (ModuleNotFoundError, TypeError):
            pass
    here = pathlib.Path(__file__).resolve().parents[1] / "tests" / "support" / "documents"
    if here.is_dir():
        roots.append(here)
    return roots


def discover(roots: list) -> list:
    """``(family, path)`` for every ``*.esm`` under ``roots`` (sorted, deduplicated)."""
    out, seen = [], set()
    for root in roots:
        root = pathlib.Path(root)
        files = [root] if root.is_file() else sorted(root.rglob("*.esm"))
        for p in files:
            rp = p.resolve()
            if rp in seen:
                continue
            seen.add(rp)
            rel = p.relative_to(root) if p != root else pathlib.Path(p.name)
            parts = rel.parts[:-1]
            fam = "/".join(parts[:2]) if parts else root.name
            out.append((fam, str(p)))
    return out


# ----------------------------------------------------------------------------- earthsci-ast side

@dataclass
class _Eco:
    names: list
    y0: np.ndarray
    rhs: object


def _eco_names(build) -> list:
    """Element names (``Model.x[i,j]``, row-major, 1-based) in the build's order."""
    names = list(build.state_names)
    shapes = getattr(build, "shapes", None) or {}
    layout = getattr(build, "state_layout", None) or {}
    if not layout:
        return names
    out = []
    for n in sorted(names, key=lambda s: layout[s].start):
        shape = tuple(shapes.get(n, ()))
        if not shape:
            out.append(n)
            continue
        for idx in np.ndindex(*shape):
            out.append(f"{n}[{','.join(str(i + 1) for i in idx)}]")
    return out


#: Documents whose declared state vector is larger than this are not built
#: (earthsci-ast allocates them whole; ISRM-sized grids do not fit a CI box).
MAX_ELEMENTS = 200_000


def _declared_size(path: str):
    """Total declared state elements (None when it cannot be read cheaply)."""
    import earthsci_ast as ea
    try:
        flat = ea.flatten(ea.load_path(path, base_path=str(pathlib.Path(path).parent)))
    except Exception:
        return None
    sizes = {}
    for n, s in (flat.index_sets or {}).items():
        size = s.get("size") if isinstance(s, dict) else getattr(s, "size", None)
        if isinstance(size, int):
            sizes[str(n)] = size
    total = 0
    for var in flat.state_variables.values():
        k = 1
        for d in var.shape or ():
            k *= d if isinstance(d, int) else sizes.get(d, 1)
        total += k
    return total


def ecosystem(path: str, tspan=(0.0, 1.0)):
    """earthsci-ast's problem of the document, or a string saying why there is none."""
    import earthsci_ast as ea
    size = _declared_size(path)
    if size is not None and size > MAX_ELEMENTS:
        return f"too large for this run: {size} declared state elements (> {MAX_ELEMENTS})"
    try:
        prob = ea.esm_problem(path, tspan)
    except _Timeout:
        raise
    except Exception as exc:  # not ours to judge: the ecosystem cannot build it
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    b = prob.build if prob.build is not None else prob.scalar_build
    if b is None or b.rhs_function is None:
        return None
    names = _eco_names(b)
    y0 = np.asarray(b.y0, dtype=float).reshape(-1)
    if len(names) != y0.size:
        return f"earthsci_ast's state names ({len(names)}) and y0 ({y0.size}) disagree"
    if y0.size == 0:
        return None
    try:
        f = np.asarray(b.rhs_function(tspan[0], y0.copy()), dtype=float).reshape(-1)
    except Exception as exc:
        return f"its RHS raises {type(exc).__name__}: {str(exc)[:120]}"
    if f.size != y0.size:
        return "its RHS has the wrong length"
    return _Eco(names, y0, b.rhs_function)


# ----------------------------------------------------------------------------- the checks

def _close(a, b, rtol, atol=1e-12) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(b)
    if not np.array_equal(np.isfinite(a) | ~ok, np.ones_like(ok)):
        return False
    scale = max(float(np.abs(b[ok]).max(initial=0.0)), 1e-300)
    return bool(np.all(np.abs(a[ok] - b[ok]) <= rtol * np.maximum(np.abs(b[ok]), scale * 1e-6) + atol))


def _point(y0: np.ndarray, rng) -> np.ndarray:
    """A state near y0: relative perturbation, zero entries moved off zero a little."""
    y = y0 * (1.0 + 0.05 * rng.uniform(-1, 1, y0.size))
    z = y0 == 0.0
    y[z] = 1e-3 * rng.uniform(0.5, 1.0, int(z.sum()))
    return y


def _fd_columns(rhs, t, y, cols) -> np.ndarray:
    out = np.empty((y.size, len(cols)))
    for k, j in enumerate(cols):
        h = 1e-6 * max(1e-3, abs(y[j]))
        yp, ym = y.copy(), y.copy()
        yp[j] += h
        ym[j] -= h
        # earthsci-ast's RHS returns one reused buffer: copy before the next call
        fp = np.array(rhs(t, yp), dtype=float).reshape(-1)
        fm = np.array(rhs(t, ym), dtype=float).reshape(-1)
        out[:, k] = (fp - fm) / (yp[j] - ym[j])
    return out


def _check_jacobian(prob, eco: _Eco, t: float, y: np.ndarray) -> str:
    n = y.size
    J = prob.jac_csr(t, y).toarray()
    if n <= FULL_FD_BELOW:
        cols = list(range(n))
    else:
        rng = np.random.default_rng(n)
        cols = sorted(rng.choice(n, SAMPLE_COLUMNS, replace=False).tolist())
    F = _fd_columns(eco.rhs, t, y, cols)
    Jc = J[:, cols]
    ok = np.isfinite(F)
    if not np.all(np.isfinite(Jc[ok])):
        return "the compiled Jacobian is not finite where differences are"
    scale = np.maximum(np.abs(F).max(axis=1, keepdims=True, initial=0.0), np.abs(Jc).max(axis=1, keepdims=True, initial=0.0))
    err = np.where(ok, np.abs(Jc - F), 0.0)
    bad = err > 1e-4 * np.maximum(scale, 1e-8) + 1e-9
    if bad.any():
        i, k = map(int, np.argwhere(bad)[0])
        return (f"Jacobian entry ({prob.names[i]}, {prob.names[cols[k]]}) is {Jc[i, k]:.6g}, "
                f"differences give {F[i, k]:.6g} ({int(bad.sum())} entries off)")
    return ""


def _check_oracle(path: str, prob, t: float, y: np.ndarray) -> str:
    from esmjac.calculus.bandset import BandSet
    from esmjac.reference.oracle import assemble
    from esmjac.errors import JacError
    try:
        bs = BandSet.build(path, None, "states")
    except JacError as exc:
        if exc.code != "empty_bands" or prob.jac_csr(t, y).nnz:
            raise
        # ivp proved the RHS state-independent; the oracle must agree: no bands.
        bs = BandSet.build(path, None, "states", options={"allow_empty": True})
    a = assemble(bs, u=dict(zip(prob.names, y)), p=None, t=t)
    if list(a.rows) != list(prob.names):
        return "the reference assembly orders rows differently"
    A = a.matrix.toarray()
    J = prob.jac_csr(t, y).toarray()
    if not _close(J, A, 1e-9, 1e-12):
        i, j = np.unravel_index(int(np.argmax(np.abs(J - A))), J.shape)
        return f"compiled and reference assembly differ at ({prob.names[i]}, {prob.names[j]}): {J[i, j]!r} vs {A[i, j]!r}"
    return ""


def check_document(path: str, family: str = "", *, oracle: bool = True) -> Outcome:
    """Run one document through both sides (see module docstring)."""
    from esmjac.adapters.scipy import ivp
    from esmjac.errors import JacError
    t0 = time.perf_counter()
    out = Outcome(family, path, "match")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eco = ecosystem(path)
        if eco is None or isinstance(eco, str):
            out.outcome = "no_states" if eco is None else "not_evaluable"
            out.detail = eco or ""
            return out
        out.n = len(eco.names)
        try:
            prob = ivp(path)
            names = list(prob.names)
            if names != eco.names:
                extra = sorted(set(names) - set(eco.names))[:3]
                missing = sorted(set(eco.names) - set(names))[:3]
                out.outcome = "mismatch"
                out.detail = (f"state vector: esmjac {len(names)} vs earthsci_ast {len(eco.names)}"
                              + (f"; missing {missing}" if missing else "")
                              + (f"; extra {extra}" if extra else "")
                              + ("; order differs" if not (extra or missing) else ""))
                return out
            if not _close(prob.y0, eco.y0, 1e-12, 1e-300):
                i = int(np.argmax(np.abs(prob.y0 - eco.y0)))
                out.outcome = "mismatch"
                out.detail = f"initial state: {names[i]} = {prob.y0[i]!r}, earthsci_ast {eco.y0[i]!r}"
                return out
            rng = np.random.default_rng(0)
            y = _point(eco.y0, rng)
            t = 0.0
            fe = np.array(eco.rhs(t, y.copy()), dtype=float).reshape(-1)
            fj = prob.fun(t, y.copy())
            if not _close(fj, fe, 1e-9, 1e-12):
                i = int(np.nanargmax(np.abs(fj - fe)))
                out.outcome = "mismatch"
                out.detail = f"RHS: d{names[i]}/dt = {fj[i]!r}, earthsci_ast {fe[i]!r}"
                return out
            why = _check_jacobian(prob, eco, t, y)
            if not why and oracle and len(names) <= ORACLE_BELOW:
                why = _check_oracle(path, prob, t, y)
            if why:
                out.outcome, out.detail = "mismatch", why
        except JacError as exc:
            # internal_error is esmjac's wrapper of an unexpected exception: a crash
            out.outcome = "crash" if exc.code == "internal_error" else "refusal"
            msg = getattr(exc, "message", None) or str(exc)
            out.detail = f"[{exc.code}] {msg.splitlines()[0] if msg else ''}"[:240]
        except _Timeout:
            raise
        except Exception as exc:  # a bare exception is a crash: esmjac's bug
            out.outcome = "crash"
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            out.detail = (f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                          f" at {pathlib.Path(tb.filename).name}:{tb.lineno}")
        finally:
            out.seconds = round(time.perf_counter() - t0, 2)
    return out


# ----------------------------------------------------------------------------- driver

def run(docs: list, *, timeout: float = 300.0, progress=None, oracle: bool = True) -> list:
    """:func:`check_document` over ``docs`` (``(family, path)``), each under a timeout."""
    results = []
    use_alarm = hasattr(signal, "SIGALRM") and timeout > 0
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    try:
        for fam, path in docs:
            t0 = time.perf_counter()
            if use_alarm:
                signal.alarm(int(math.ceil(timeout)))
            try:
                r = check_document(path, fam, oracle=oracle)
            except _Timeout:
                r = Outcome(fam, path, "crash", f"timeout after {timeout:.0f} s",
                            seconds=round(time.perf_counter() - t0, 2))
            finally:
                if use_alarm:
                    signal.alarm(0)
            results.append(r)
            if progress:
                progress(r)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
    return results


def table(results: list) -> str:
    """The per-family table (markdown) with totals and the headline ratio."""
    fams = collections.OrderedDict()
    for r in sorted(results, key=lambda r: r.family):
        fams.setdefault(r.family, collections.Counter())[r.outcome] += 1
    head = "| family | " + " | ".join(OUTCOMES) + " |"
    lines = [head, "|" + "---|" * (len(OUTCOMES) + 1)]
    tot = collections.Counter()
    for fam, c in fams.items():
        tot.update(c)
        lines.append(f"| {fam} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |")
    lines.append("| **total** | " + " | ".join(f"**{tot[o]}**" for o in OUTCOMES) + " |")
    evaluable = sum(tot[o] for o in ("match", "refusal", "mismatch", "crash"))
    pct = 100.0 * tot["match"] / evaluable if evaluable else 0.0
    lines.append("")
    lines.append(f"{tot['match']} of {evaluable} models earthsci_ast can evaluate get a correct "
                 f"Jacobian from the compiled path ({pct:.1f}%); {tot['refusal']} typed refusals, "
                 f"{tot['mismatch']} mismatches, {tot['crash']} crashes.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.corpus", description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", help="directories (or files) to walk; default: shipped + tests' documents")
    ap.add_argument("--json", help="write every outcome to this file")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per document")
    ap.add_argument("--limit", type=int, default=0, help="check at most this many documents")
    ap.add_argument("--no-oracle", action="store_true", help="skip the reference-assembly comparison")
    ap.add_argument("--max-memory-gb", type=float, default=12.0,
                    help="address-space cap of this process (a document earthsci-ast cannot fit is not evaluable)")
    ap.add_argument("--skip", default="", help="skip paths containing any of these comma-separated words")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each document's outcome")
    ap.add_argument("--recheck", help="a previous run's --json: re-run only the documents it found "
                    "earthsci-ast can evaluate; carry the others' earthsci-ast-only outcomes "
                    "(not_evaluable, no_states) over unchanged")
    a = ap.parse_args(argv)
    docs = discover([pathlib.Path(d) for d in a.dirs] if a.dirs else default_roots())
    carried: list = []
    if a.recheck:
        prev = {r["path"]: Outcome(**r) for r in json.loads(pathlib.Path(a.recheck).read_text())}
        carried = [prev[p] for _, p in docs if p in prev and prev[p].outcome in ("not_evaluable", "no_states")]
        docs = [(f, p) for f, p in docs if not (p in prev and prev[p].outcome in ("not_evaluable", "no_states"))]
    skip = [w for w in a.skip.split(",") if w]
    docs = [(f, p) for f, p in docs if not any(w in p for w in skip)]
    if a.max_memory_gb > 0:
        try:
            import resource
            cap = int(a.max_memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        except (ImportError, ValueError, OSError):
            pass
    if a.limit:
        docs = docs[:a.limit]

    def progress(r):
        if a.verbose or r.outcome in ("mismatch", "crash", "refusal"):
            print(f"{r.outcome:13s} {r.seconds:7.2f}s {r.path}: {r.detail}", file=sys.stderr, flush=True)

    results = run(docs, timeout=a.timeout, progress=progress, oracle=not a.no_oracle) + carried
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(table(results))
    print(f"\nload average {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 1 if any(r.outcome in ("mismatch", "crash") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
