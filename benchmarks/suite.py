"""The benchmark suite of docs/design.rst §10: ``esmjac bench`` / ``benchmarks/run.py``.

One run measures, side by side on the same model, point and machine:

* **B1/B2** per-cell chemistry (``bd_chem`` resized, ``tropo12`` lifted) on
  10⁴ (and 10⁵) cells: ``JacobianProgram.eval_into`` per layout
  (LaneBlocks, LaneSparseBlocks, Csr) in float64 and float32, and one
  ``RhsProgram.eval_into`` on the same lanes (T2), one Numba thread;
  then the same Jacobian on all of Numba's threads (T3).
* **B3** transport stencils (``adv_interior``, ``flux_form_adv``,
  ``minmod_adv`` on 10⁴ cells): Csr and ColumnBanded.
* **B4** ``apply`` / ``apply_transpose`` (T4), chemistry and stencils.
* **B5** build cost against mechanism size (synthetic mechanisms up to
  300 species / 800 reactions, each in fresh processes): calculus,
  evaluation document, code generation, cold build (fresh
  ``ESMJAC_CACHE_DIR``, Numba compile included), warm build (a new process
  on the same cache), plan building against nnz (T5).
* **peers** on tropo12 (hand-rolled SymPy→Numba, SciPy grouped finite
  differences over our RHS and over earthsci-ast's, earthsci-ast's RHS,
  JAX, CasADi), each verified against esmjac before it is timed (T1).
* **end to end**: ``solve_ivp`` BDF with the analytic sparse Jacobian and
  with finite differences, the native Rosenbrock leaf, CVODE GMRES with and
  without the block preconditioner.

Every kernel measurement is the median of ≥ 50 warm calls; each record in
the JSON output names bench, model, method, layout, dtype, lanes, threads
and the median, plus the ratios the targets use. The suite lives in
``benchmarks/`` of a checkout (it is not installed), one module per
section: ``chem_cells`` (B1/B2, T3), ``transport`` (B3), ``apply_ops``
(B4), ``build_cost`` and ``child`` (B5), ``vs_peers`` (with ``peers``),
``end_to_end``; ``common`` holds the timing and the run record,
``report`` the targets, JSON, plots and RESULTS.md. The reference fixtures
are found via ``--fixtures`` / ``$ESMJAC_FIXTURES``, else beside the
checkout (``../shared/reference/fixtures``); without them B1 and B3 are
skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time

from apply_ops import run_apply
from build_cost import run_build
from chem_cells import run_chem
from common import SECTIONS, Bench, load_avg
from end_to_end import run_e2e
from report import evaluate_targets, plots, results_md, to_json
from transport import run_transport
from vs_peers import run_peers

__all__ = ["run", "main", "Bench"]

#: Section name → runner, in run order (``--only`` picks among them).
SECTION_RUNNERS = {"chem": run_chem, "transport": run_transport, "apply": run_apply,
                   "peers": run_peers, "build": run_build, "e2e": run_e2e}
assert tuple(SECTION_RUNNERS) == SECTIONS


def run(quick: bool = False, json_path=None, plots_dir=None, results_path=None, *,
        fixtures=None, only=None, cmdline: str | None = None) -> int:
    """Run the suite; returns 0, or 1 when a section or a verification failed."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    b = Bench(quick=quick, fixtures=fixtures, only=only)
    t0 = time.perf_counter()
    b.log(f"esmjac bench ({b.mode})")
    b.environment()
    try:
        for name, fn in SECTION_RUNNERS.items():
            b.section(name, lambda fn=fn: fn(b))
        b.env["load_end"] = load_avg()
        b.env["wall_s"] = time.perf_counter() - t0
        evaluate_targets(b)
        b.log("\n== targets ==")
        for t in b.targets:
            b.log(f"{t['target']} {t['status']:4s} {t['text']}")
        if b.skips:
            b.log("\nnot measured:")
            for s in b.skips:
                b.log(f"  - {s['what']}: {s['why']}")
        if b.errors:
            b.log("\nerrors:")
            for x in b.errors:
                b.log(f"  - {x['what']}: {x['error']}")
        made = plots(b, pathlib.Path(plots_dir)) if plots_dir else []
        b.env["wall_s"] = time.perf_counter() - t0
        if json_path:
            pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(json_path).write_text(json.dumps(to_json(b), indent=1, default=str) + "\n")
            b.log(f"wrote {json_path}")
        if results_path:
            results_md(b, pathlib.Path(results_path), made, cmdline or "esmjac bench")
            b.log(f"wrote {results_path}")
        for p in made:
            b.log(f"wrote {p}")
        b.log(f"total wall time {time.perf_counter() - t0:.1f} s")
    finally:
        shutil.rmtree(b.tmp, ignore_errors=True)
    return 1 if b.errors else 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true",
                    help="smaller run (10^4 cells only, B5 up to 150 species, no slow peers; < 5 min)")
    ap.add_argument("--json", metavar="FILE", default=None, help="write one record per measurement")
    ap.add_argument("--plots", metavar="DIR", default=None, help="write PNG plots (matplotlib)")
    ap.add_argument("--results", metavar="FILE", default=None, help="write a Markdown report (RESULTS.md)")
    ap.add_argument("--fixtures", default=None, help="folder with the reference fixtures (bd_chem.esm, ...; "
                    "default: ../shared/reference/fixtures or $ESMJAC_FIXTURES)")
    ap.add_argument("--only", default=None,
                    help=f"comma-separated sections to run (of {', '.join(SECTIONS)})")


def run_args(args, cmdline: str) -> int:
    only = [s.strip() for s in args.only.split(",")] if args.only else None
    if only:
        bad = [s for s in only if s not in SECTIONS]
        if bad:
            raise SystemExit(f"unknown section(s) {bad}; choose from {', '.join(SECTIONS)}")
    return run(args.quick, args.json, args.plots, args.results, fixtures=args.fixtures, only=only,
               cmdline=cmdline)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/run.py", description="esmjac benchmark suite (docs/design.rst §10)")
    add_arguments(ap)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    return run_args(args, "python benchmarks/run.py " + " ".join(argv))


if __name__ == "__main__":                                # pragma: no cover
    sys.exit(main())
