"""``esmjac`` command line: bands, block, check, kernel, goldens, demo, adapters."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .errors import JacError

__all__ = ["main"]


_PROGRESS = {"auto": None, "on": True, "off": False}


def _progress_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", choices=list(_PROGRESS), default="auto",
                   help="progress of long work on stderr: auto (a bar on a terminal, after 2 s; "
                        "in a pipe, one line per phase longer than 2 s), on (a bar, or a line "
                        "per stage), off")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="an .esm document")
    p.add_argument("--model", default=None, help="model to differentiate (documents with several)")
    p.add_argument("--wrt", default="states", choices=["states", "parameters", "forcing", "time"])
    p.add_argument("--faq", action="store_true",
                   help="spell the array op `faq` (esm >= 1.1.0) instead of the reference's `aggregate`")
    p.add_argument("--indent", type=int, default=None, metavar="N",
                   help="pretty-print with N-space indentation (default: the compact, "
                        "byte-deterministic form the goldens use)")


def _bandset(args):
    from .calculus.bandset import BandSet
    return BandSet.build(args.file, args.model, args.wrt,
                         {"agg_spelling": "faq" if args.faq else "aggregate"})


def _emit_json(text: str, indent) -> None:
    """The deterministic JSON as is (byte-identical to the goldens), or
    re-indented for reading (same content, key order kept)."""
    if indent is not None:
        import json
        text = json.dumps(json.loads(text), indent=indent, ensure_ascii=False)
    sys.stdout.write(text + "\n")


def cmd_bands(args) -> int:
    _emit_json(_bandset(args).entries_json(), args.indent)
    return 0


def cmd_block(args) -> int:
    _emit_json(_bandset(args).block_json(), args.indent)
    return 0


#: ``esmjac check`` exit codes.
CHECK_EXIT = {0: "the Jacobian agrees with finite differences at every point",
              1: "a mismatch, or an entry finite differences see outside the stored pattern",
              2: "the document or an option was refused (a typed esmjac error on stderr)",
              3: "an internal error (a bug: rerun with --debug for the traceback)",
              4: "nothing to check: the document has no ODE states",
              5: "the right-hand side or the Jacobian is non-finite at the document's own state "
                 "or at a sampled point (the species and the term are named)"}


def cmd_check(args) -> int:
    from .reference.check import fd_check
    rep = fd_check(args.file, model=args.model, points=args.points, lo=args.lo, hi=args.hi,
                   rtol=args.rtol, atol=args.atol, seed=args.seed, progress=_PROGRESS[args.progress])
    print(rep.summary())
    for r, c, v in rep.uncovered[:10]:
        print(f"  uncovered: d {r} / d {c} = {v:.6g} (finite differences; not in the stored pattern)")
    if rep.nothing_to_check:
        return 4
    if rep.nonfinite:
        return 5
    return 0 if rep.ok else 1


def cmd_demo(args) -> int:
    """The main job on the bundled model: build, verify, summarise, solve."""
    from .demo import run_demo
    return run_demo(cells=args.cells, progress=_PROGRESS[args.progress])


def cmd_spy(args) -> int:
    """Draw the Jacobian's sparsity pattern (structural, from the Csr plan)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise JacError("adapter_unavailable", "esmjac spy needs matplotlib: pip install 'esmjac[plot]'")
    from scipy.sparse import csr_array

    from .layouts.types import Csr
    from .runtime.programs import JacobianProgram
    prog = JacobianProgram.build(args.file, args.model, wrt=args.wrt,
                                 options={"progress": _PROGRESS[args.progress],
                                          "allow_empty": args.wrt != "states"})
    plan = prog.plan(Csr())
    shape = tuple(plan.info["shape"])
    m = csr_array((np.ones(plan.indices.size), plan.indices, plan.indptr), shape=shape)
    ratio = min(max(shape[0] / max(shape[1], 1), 0.5), 2.0)
    fig, ax = plt.subplots(figsize=(7, 7 * ratio))
    ax.spy(m, markersize=max(0.5, min(4.0, 400.0 / max(shape))), aspect="auto")
    rows = _blocks(prog.layout, prog.layout.states)
    cols = rows if args.wrt == "states" else _blocks(prog.layout, prog.col_vars)
    for (ticks, labels, edges), axis, lines in ((rows, ax.yaxis, ax.axhline), (cols, ax.xaxis, ax.axvline)):
        axis.set_ticks(ticks)
        axis.set_ticklabels(labels, fontsize=max(4, min(8, 600 // max(len(labels), 1))))
        for e in edges[1:-1]:
            lines(e - 0.5, color="0.85", linewidth=0.4)
    ax.tick_params(axis="x", labelrotation=90)
    ax.set_title(f"{prog.layout.model}: d f / d {args.wrt}  ({shape[0]}x{shape[1]}, nnz {m.nnz}, "
                 f"{prog.structure})", fontsize=9)
    fig.savefig(args.output, dpi=150, bbox_inches="tight")
    print(f"wrote {args.output} ({shape[0]}x{shape[1]}, {m.nnz} nonzeros)")
    return 0


def _blocks(layout, names) -> tuple:
    """(tick positions, labels, block edges) of variables laid out one block
    each, in order (a cell program's species-major rows: each species' cells
    together; a per-cell parameter takes a column per cell, a scalar one)."""
    edges = [0]
    for v in names:
        edges.append(edges[-1] + (1 if v == "t" else layout.size(v)))
    ticks = [(a + b - 1) / 2 for a, b in zip(edges, edges[1:])]
    return ticks, [str(v) for v in names], edges


def cmd_adapters(args) -> int:
    """Table of installed solver adapters (no solver package is imported)."""
    from .plugins.manager import adapter_infos

    head = ("name", "version", "available", "provides", "detail")
    rows = [(i.name, i.version or "-", "yes" if i.available else "no",
             ", ".join(i.provides), i.detail) for i in adapter_infos()]
    widths = [max(len(r[k]) for r in [head, *rows]) for k in range(4)]
    for r in [head, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    return 0


def cmd_kernel(args) -> int:
    from .runtime.programs import JacobianProgram, RhsProgram
    opts = {"engine": args.engine, "allow_empty": True}
    if args.rhs:
        prog = RhsProgram.build(args.file, args.model, options={**opts, "progress": _PROGRESS[args.progress]})
    else:
        prog = JacobianProgram.build(args.file, args.model, wrt=args.wrt,
                                     options={**opts, "progress": _PROGRESS[args.progress]})
    if args.evaldoc:
        sys.stdout.write(prog.doc.to_json() + "\n")
    else:
        sys.stdout.write(prog.kernel.listing())
    return 0


def cmd_bench(args) -> int:
    """Run the benchmark suite from a checkout (it is not installed with the package)."""
    import os
    import pathlib
    import subprocess
    here = pathlib.Path(args.bench_dir or pathlib.Path.cwd() / "benchmarks")
    script = here / "run.py"
    if not script.is_file():
        raise JacError("bad_argument", f"the benchmark suite is not installed with esmjac; run this from a "
                       f"checkout of the repository (no {script}), or pass --bench-dir DIR")
    return subprocess.call([sys.executable, str(script), *args.rest], env=dict(os.environ))


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="esmjac", description="Exact analytical Jacobians for .esm models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("bands", help="print the band entries as deterministic JSON")
    _common(p)
    p.set_defaults(fn=cmd_bands)
    p = sub.add_parser("block", help="print the emitted `jacobians` block as deterministic JSON")
    _common(p)
    p.set_defaults(fn=cmd_block)
    p = sub.add_parser(
        "check", help="verify a model's Jacobian against finite differences",
        description="Compare esmjac's Jacobian with central finite differences of "
                    "earthsci_ast.evaluate_rhs at states sampled around the document's own state "
                    "(relative perturbations of a few per cent up to a factor of ten), with a "
                    "relative step per column and a round-off floor per row, so badly scaled "
                    "mechanisms (1e17 molecules/cm^3 beside 0.1) check without false alarms.",
        epilog="exit codes: " + "; ".join(f"{k}: {v}" for k, v in CHECK_EXIT.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="an .esm document")
    p.add_argument("--model", default=None,
                   help="the model (or reaction system) to check, for documents with several; "
                        "a name the document does not have is refused (model_not_found)")
    p.add_argument("--points", type=int, default=3,
                   help="sampled states (default 3: perturbations of 0.02, 0.5 and 1 decade)")
    p.add_argument("--rtol", type=float, default=1e-5,
                   help="relative tolerance per entry, on top of the round-off floor (default 1e-5)")
    p.add_argument("--atol", type=float, default=0.0,
                   help="absolute tolerance per entry, on top of the round-off floor (default 0)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the sampled states")
    p.add_argument("--lo", type=float, default=None,
                   help="with --hi: draw states uniformly from [lo, hi] instead")
    p.add_argument("--hi", type=float, default=None)
    _progress_arg(p)
    p.set_defaults(fn=cmd_check)
    p = sub.add_parser("demo", help="build, verify and solve the bundled example model (analytic vs FD)")
    p.add_argument("--cells", type=int, default=200, help="grid cells of the solve (default 200, at most 1000)")
    _progress_arg(p)
    p.set_defaults(fn=cmd_demo)
    p = sub.add_parser("kernel", help="print the generated kernel source (or tape) of a model")
    p.add_argument("file")
    p.add_argument("--model", default=None)
    p.add_argument("--wrt", default="states", choices=["states", "parameters", "forcing", "time"])
    p.add_argument("--rhs", action="store_true", help="the right-hand side instead of a Jacobian")
    p.add_argument("--engine", default="auto", choices=["auto", "codegen", "tape"])
    p.add_argument("--evaldoc", action="store_true", help="print the evaluation document instead")
    _progress_arg(p)
    p.set_defaults(fn=cmd_kernel)
    p = sub.add_parser("spy", help="draw the sparsity pattern (needs matplotlib: esmjac[plot])")
    p.add_argument("file")
    p.add_argument("--model", default=None)
    p.add_argument("--wrt", default="states", choices=["states", "parameters", "forcing", "time"])
    p.add_argument("-o", "--output", required=True, help="the image to write (png, svg, pdf...)")
    _progress_arg(p)
    p.set_defaults(fn=cmd_spy)
    p = sub.add_parser("adapters", help="list the installed solver adapters and the kinds they provide")
    p.set_defaults(fn=cmd_adapters)
    p = sub.add_parser("bench", help="run the benchmark suite from a checkout (benchmarks/run.py)")
    p.add_argument("--bench-dir", default=None, help="the checkout's benchmarks/ folder (default ./benchmarks)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="arguments for benchmarks/run.py (--quick, --only ...)")
    p.set_defaults(fn=cmd_bench)
    ap.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    args = ap.parse_args(argv)
    from .runtime.progress import set_pipe_default
    # --progress auto in a pipe: one line per phase longer than 2 s (a
    # library call's default there is silence); restored on return
    prev = set_pipe_default("phases" if getattr(args, "progress", "off") == "auto" else "off")
    try:
        return args.fn(args)
    except JacError as exc:
        if args.debug:
            raise
        print(f"esmjac: error [{exc.code}]: {exc.message}", file=sys.stderr)
        return 2
    except Exception as exc:        # never a bare traceback: --debug shows it
        if args.debug:
            raise
        print(f"esmjac: error [internal_error]: {type(exc).__name__}: {exc} (rerun with --debug for "
              "the traceback)", file=sys.stderr)
        return 3
    finally:
        set_pipe_default(prev)
