"""The targets T1-T7 from the records, the JSON, the plots and RESULTS.md."""
from __future__ import annotations

import os
import pathlib

import numpy as np

from common import (E2E_ATOL, E2E_RTOL, B5_CELLS, DESIGN_CASADI_272, E2E_CELLS, E2E_T_END, FUSED, REF_LANES, fmt,
    fmt_s, md_table)


def evaluate_targets(ctx) -> None:
    T = ctx.targets

    def line(tid, ok, text):
        st = "PASS" if ok else "MISS"
        if ok is None:
            st = "n/a "
        T.append({"target": tid, "status": st.strip(), "text": text})

    L0 = REF_LANES
    ours = {lay: ctx.one(bench="B2", model="tropo12", method="esmjac.eval_into", layout=lay,
                          dtype="float64", lanes=L0, threads=1)
            for lay in ("lanesparseblocks", "laneblocks-natural", "csr")}
    hr = ctx.one(bench="peers", method="handrolled.jac", lanes=L0)
    o = ctx.one(bench="peers", method="esmjac.eval_into", lanes=L0)
    o2 = ctx.one(bench="B2", model="tropo12", method="esmjac.eval_into", layout="lanesparseblocks",
                  dtype="float64", lanes=L0, threads=1)
    if o and hr:
        ratio = o["median_s"] / hr["median_s"]
        sb = ours["lanesparseblocks"]
        others = ", ".join(f"{k} {ours[k]['median_s'] / sb['median_s'] * ratio:.2f}"
                           for k in ("csr", "laneblocks-natural") if ours[k] and sb)
        line("T1", ratio <= 1.5, f"eval_into / hand-rolled Numba = {ratio:.2f} (target <= 1.5; tropo12, "
             f"{L0} cells, LaneSparseBlocks float64, 1 thread, timed interleaved: {fmt_s(o['median_s'])} vs "
             f"{fmt_s(hr['median_s'])}; other layouts, scaled by their B2 time: {others})")
    else:
        line("T1", None, "eval_into / hand-rolled: not measured")
    of = ctx.one(bench="peers", method="esmjac.eval_into" + FUSED, lanes=L0)
    if of and hr:
        ratio = of["median_s"] / hr["median_s"]
        line("T1", ratio <= 1.5, f"eval_into with new_workspace(keep_slab=False) (fused kernels, no band slab) "
             f"/ hand-rolled Numba = {ratio:.2f} (target <= 1.5; same run: {fmt_s(of['median_s'])} vs "
             f"{fmt_s(hr['median_s'])})")
    for meth, need, label in (("casadi.jac", 4, "CasADi C route"), ("jax.jac", 10, "JAX jit(vmap(jacfwd))"),
                              ("scipy_fd(esmjac.rhs)", 1000, "SciPy FD (exact sparsity, our RHS)"),
                              ("scipy_fd(earthsci_ast.rhs)", 1000, "SciPy FD (exact sparsity, earthsci-ast RHS)")):
        pr = ctx.one(bench="peers", method=meth, lanes=L0)
        if o and pr:
            x = pr["median_s"] / o["median_s"]
            line("T1", x >= need, f"{label} / eval_into = {x:.1f}x (target >= {need}x; "
                 f"{fmt_s(pr['median_s'])} vs {fmt_s(o['median_s'])})")
    big = ctx.find(bench="B5", method="esmjac.eval_into")
    if big:
        b = big[-1]
        ca = ctx.one(bench="B5", model=b["model"], method="casadi.jac")
        if ca:
            x = ca["median_s"] / b["median_s"]
            line("T1", x >= 1.0, f"large mechanism ({b['model']}): CasADi C / eval_into = {x:.2f}x "
                 f"(target >= 1; {b['per_lane_s'] * 1e6:.2f} µs/cell vs {ca['per_lane_s'] * 1e6:.2f} µs/cell, "
                 f"{b['lanes']} cells)")
        else:
            x = DESIGN_CASADI_272 / b["per_lane_s"]
            line("T1", x >= 1.0, f"large mechanism ({b['model']}): eval_into {b['per_lane_s'] * 1e6:.2f} µs/cell "
                 f"vs the design's CasADi figure {DESIGN_CASADI_272 * 1e6:.1f} µs/cell at 272 species "
                 f"(not measured in this run) -> {x:.2f}x")
    # T2
    t2 = [r for r in ctx.find(method="esmjac.eval_into", threads=1) if r["bench"] in ("B1", "B2")
          and r.get("t2_ratio")]
    o = o2
    if o:
        rng_ = (min(r["t2_ratio"] for r in t2), max(r["t2_ratio"] for r in t2)) if t2 else (None, None)
        line("T2", o["t2_ratio"] <= 2.0, f"eval_into / rhs = {o['t2_ratio']:.2f} (target <= 2; tropo12, "
             f"{L0} cells, LaneSparseBlocks float64); over B1/B2 models, sizes, layouts and dtypes "
             f"{fmt(rng_[0])} .. {fmt(rng_[1])}")
    of2 = ctx.one(bench="B2", model="tropo12", method="esmjac.eval_into" + FUSED, layout="lanesparseblocks",
                   dtype="float64", lanes=L0, threads=1)
    t2f = [r for r in ctx.find(method="esmjac.eval_into" + FUSED, threads=1) if r["bench"] in ("B1", "B2")]
    if of2:
        line("T2", of2["t2_ratio"] <= 2.0, f"eval_into (keep_slab=False, fused) / rhs = {of2['t2_ratio']:.2f} "
             f"(tropo12, {L0} cells, LaneSparseBlocks float64); over B1/B2 fused runs "
             f"{fmt(min(r['t2_ratio'] for r in t2f))} .. {fmt(max(r['t2_ratio'] for r in t2f))}")
    bd = ctx.one(bench="B1", method="esmjac.eval_into", layout="lanesparseblocks", dtype="float64",
                  lanes=L0, threads=1)
    if bd:
        line("T2", bd["t2_ratio"] <= 2.0, f"eval_into / rhs = {bd['t2_ratio']:.2f} (bd_chem, {L0} cells, "
             "LaneSparseBlocks float64)")
    # T3
    for r3 in ctx.find(bench="T3", method="esmjac.eval_into") + ctx.find(bench="T3", method="esmjac.eval_into" + FUSED):
        rr = ctx.one(bench="T3", model=r3["model"], method="esmjac.rhs", variant=r3.get("variant"))
        default = r3.get("variant") == "default"
        text = (("[keep_slab=False] " if r3["method"].endswith(FUSED) else "") + f"parallel efficiency {r3['efficiency'] * 100:.0f}% (target >= 80%; {r3['model']}, {r3['lanes']} "
                f"cells, LaneSparseBlocks float64, {r3['threads']} threads [{r3.get('threading_layer')}], speedup "
                f"{r3['speedup']:.2f}, from the fastest calls {r3['efficiency_of_mins'] * 100:.0f}%; RHS alone "
                f"{rr['efficiency'] * 100 if rr else float('nan'):.0f}%; load avg at start "
                f"{ctx.env.get('load_start')})")
        if not default:
            text = f"[informative: {r3['variant']}] " + text
        line("T3", r3["efficiency"] >= 0.8, text)
    # T4
    t4 = ctx.find(bench="B4", method="esmjac.apply_transpose")
    if t4:
        worst = max(t4, key=lambda r: r["t4_ratio"])
        detail = ", ".join(f"{r['model']} {r['t4_ratio']:.2f}" for r in t4)
        line("T4", worst["t4_ratio"] <= 1.5, f"apply_transpose / apply = {worst['t4_ratio']:.2f} worst "
             f"(target <= 1.5; {detail})")
    # T5
    cold = ctx.find(bench="B5", method="jacobian build cold")
    if cold:
        c = cold[-1]
        line("T5", c["median_s"] < 30.0, f"cold build of {c['model']} ({c['n_species']} species, "
             f"{c['n_reactions']} reactions) {c['median_s']:.1f} s (target < 30 s; engine {c['engine']})")
        w = ctx.one(bench="B5", model=c["model"], method="jacobian build warm (new process)")
        wi = ctx.one(bench="B5", model=c["model"], method="jacobian build warm (same process)")
        if w:
            worst_w = max(r["median_s"] for r in ctx.find(bench="B5", method="jacobian build warm (new process)"))
            line("T5", worst_w < 1.0, f"warm rebuild (cache hit, new process) {w['median_s']:.2f} s for "
                 f"{c['model']}, worst {worst_w:.2f} s (target well under 1 s); same process "
                 f"{wi['median_s']:.2f} s" if wi else "")
    for series, recs in plan_series(ctx).items():
        if len(recs) >= 2:
            x = np.log([r["nnz"] for r in recs])
            y = np.log([r["median_s"] for r in recs])
            slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else float("nan")
            per = ", ".join(f"{r['nnz']}: {r['per_nnz_s'] * 1e9:.0f} ns/nnz" for r in recs)
            line("T5", slope <= 1.15, f"plan build O(nnz), {series}: log-log slope {slope:.2f} "
                 f"(target <= 1.15, i.e. linear; {per})")


def plan_series(ctx) -> dict:
    """Plan-build series for the O(nnz) fit: Csr against cells (tropo12),
    and every layout against mechanism size at fixed cells (B5)."""
    out = {}
    recs = sorted((r for r in ctx.find(bench="plan", model="tropo12", layout="csr")
                   if not r.get("n_species")), key=lambda r: r["nnz"])
    if len(recs) >= 2:
        out["tropo12 csr against cells"] = recs
    for lay in ("csr", "lanesparseblocks", "laneblocks-natural"):
        recs = sorted([r for r in ctx.find(bench="plan", layout=lay, lanes=B5_CELLS)
                       if r.get("n_species")], key=lambda r: r["nnz"])
        if len(recs) >= 2:
            out[f"{lay} against mechanism size ({B5_CELLS} cells)"] = recs
    return out


def to_json(ctx) -> dict:
    return {"esmjac_bench": 1, "environment": ctx.env, "records": ctx.records, "targets": ctx.targets,
            "skips": ctx.skips, "errors": ctx.errors, "wall_s": ctx.env.get("wall_s")}


def plots(ctx, d: pathlib.Path) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:                         # noqa: BLE001
        ctx.skip("plots", f"matplotlib not importable ({exc}); pip install matplotlib")
        return []
    d.mkdir(parents=True, exist_ok=True)
    files = []
    # 1. B2: time per cell against lanes, every method (float64; float32 in the tables)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
    panels = ({}, {})
    for r in ctx.records:
        if r["model"] != "tropo12" or r["bench"] not in ("B2", "peers") or r["threads"] != 1 \
                or r["dtype"] != "float64":
            continue
        if r["bench"] == "peers" and r["method"].startswith("esmjac."):
            continue                              # the same kernels, timed again beside the peers
        m = r["method"]
        if m.startswith("esmjac.eval_into") and FUSED in m and r["layout"] != "lanesparseblocks":
            continue
        is_rhs = m.endswith(".rhs")
        lab = m + ("" if r["layout"] in ("-", "pattern") or is_rhs else f" [{r['layout']}]")
        panels[1 if is_rhs else 0].setdefault(lab, []).append((r["lanes"], r["median_s"] / r["lanes"]))
    cmap = plt.get_cmap("tab10")
    marks = "os^vD<>phX*"
    for ax, series, title in zip(axes, panels, ("Jacobian", "right-hand side")):
        for i, (lab, pts) in enumerate(sorted(series.items())):
            pts.sort()
            xs, ys = zip(*pts)
            ours = lab.startswith("esmjac")
            ax.plot(xs, np.array(ys) * 1e9, "-" if ours else "--", marker=marks[i % len(marks)],
                    color=cmap(i % 10), lw=2 if ours else 1.2, label=lab)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("lanes (cells)")
        ax.set_title(f"tropo12 (15 species): {title}, float64, 1 thread")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_ylabel("time per cell [ns] (warm median)")
    fig.tight_layout()
    p = d / "b2_time_per_cell.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    files.append(p)
    # 2. B5: build time against model size
    b5 = ctx.find(bench="B5")
    if b5:
        fig, ax = plt.subplots(figsize=(8.5, 5.2))
        meths = ["load", "calculus", "evaldoc", "codegen", "jacobian build cold", "jacobian build warm (new process)",
                 "jacobian build warm (same process)", "rhs build cold"]
        for m in meths:
            pts = sorted((r["n_species"], r["median_s"]) for r in b5 if r["method"] == m)
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=m)
        ax.axhline(30, color="red", lw=0.8, ls=":", label="T5 cold target 30 s")
        ax.axhline(1, color="green", lw=0.8, ls=":", label="T5 warm target 1 s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("species (reactions ≈ 2.7× species)")
        ax.set_ylabel("seconds")
        ax.set_title("B5 build time against mechanism size")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        p = d / "b5_build_time.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)
    # 3. plan build time against nnz
    plans = ctx.find(bench="plan")
    if plans:
        fig, ax = plt.subplots(figsize=(8.5, 5))
        series = plan_series(ctx)
        used = {id(r) for recs in series.values() for r in recs}
        cmap = plt.get_cmap("tab10")
        allx = []
        for i, (lab, recs) in enumerate(series.items()):
            xs = [r["nnz"] for r in recs]
            ys = [r["median_s"] for r in recs]
            allx += xs
            ax.plot(xs, ys, marker="o", color=cmap(i % 10), label=lab)
        rest = [r for r in plans if id(r) not in used]
        if rest:
            ax.scatter([r["nnz"] for r in rest], [r["median_s"] for r in rest], color="0.6", s=14,
                       label="other plans (B1/B3, single points)")
            allx += [r["nnz"] for r in rest]
        if allx:
            xs = np.array([min(allx), max(allx)], dtype=float)
            ax.plot(xs, xs * 1e-7, "k:", lw=0.8, label="slope 1 (100 ns/nnz)")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stored entries (nnz / slots)")
        ax.set_ylabel("plan build [s]")
        ax.set_title("Plan building against nnz (T5)")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        p = d / "plan_build_vs_nnz.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)
    return files


def results_md(ctx, path: pathlib.Path, plots: list, cmdline: str) -> None:
    e = ctx.env
    v = e.get("versions", {})
    out = [f"# esmjac benchmark results ({e.get('mode')} run)", "",
           f"Generated by `{cmdline}` on {e.get('date')}; wall time {e.get('wall_s', 0):.0f} s. "
           "Kernel times are warm medians of >= 50 calls (fewer for the finite-difference peers and "
           "end-to-end solves: `n_calls`), one Numba thread unless stated. Every peer was verified "
           "against esmjac's own values before it was timed (`verify` column: max relative error). "
           "Timings on a shared machine are noisy: compare the columns of one run, and mind the load "
           "average.", "", "## Machine", "",
           md_table(["CPU", "cores", "numba threads", "memory", "load avg start", "load avg end", "platform"],
                     [[e.get("cpu"), e.get("cores"), e.get("numba_threads"), f"{e.get('memory_gib')} GiB",
                       e.get("load_start"), e.get("load_end"), e.get("platform")]]), "",
           "## Versions", "", md_table(list(v), [list(v.values())]), "",
           "## Targets (docs/design.rst §10)", "", "```"]
    out += [f"{t['target']} {t['status']:4s} {t['text']}" for t in ctx.targets]
    out += ["```", ""]

    def tbl(title, recs, cols, note=None):
        if not recs:
            return
        out.append(f"## {title}")
        out.append("")
        if note:
            out.append(note)
            out.append("")
        out.append(md_table([c[0] for c in cols], [[c[1](r) for c in cols] for r in recs]))
        out.append("")

    ms = lambda r: fmt_s(r.get("median_s"))            # noqa: E731
    pc = lambda r: f"{r['per_lane_s'] * 1e9:.1f}" if r.get("per_lane_s") else "-"   # noqa: E731
    chem = [r for r in ctx.records if r["bench"] in ("B1", "B2")]
    tbl("B1/B2 chemistry: Jacobian per layout and RHS, same lanes, 1 thread", chem,
        [("bench", lambda r: r["bench"]), ("model", lambda r: r["model"]), ("method", lambda r: r["method"]),
         ("layout", lambda r: r["layout"]), ("dtype", lambda r: r["dtype"]), ("lanes", lambda r: r["lanes"]),
         ("threads", lambda r: r["threads"]), ("median", ms), ("ns/cell", pc),
         ("eval/rhs (T2)", lambda r: fmt(r.get("t2_ratio"))),
         ("f32 vs f64", lambda r: fmt(r.get("f32_vs_f64_err")))])
    tbl("T3 parallel efficiency", ctx.find(bench="T3"),
        [("variant", lambda r: r.get("variant")), ("layer", lambda r: r.get("threading_layer")),
         ("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("lanes", lambda r: r["lanes"]),
         ("threads", lambda r: r["threads"]), ("1 thread", lambda r: fmt_s(r["t1_s"])), ("all threads", ms),
         ("speedup", lambda r: fmt(r["speedup"])), ("efficiency", lambda r: f"{r['efficiency'] * 100:.0f}%"),
         ("eff. (fastest calls)", lambda r: f"{r['efficiency_of_mins'] * 100:.0f}%"),
         ("load1", lambda r: r.get("load1"))],
        note="Each variant runs in a fresh process (the threading layer is chosen at the first parallel "
             "call); 1-thread and all-thread calls are interleaved in 5 rounds. Only `default` counts "
             "for T3; the others show what the fork/join costs under load.")
    tbl("B3 transport stencils (10^4 cells, global lanes), 1 thread", ctx.find(bench="B3"),
        [("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("layout", lambda r: r["layout"]),
         ("dtype", lambda r: r["dtype"]), ("unknowns", lambda r: r.get("unknowns")), ("median", ms),
         ("ns/unknown", lambda r: f"{r['per_unknown_s'] * 1e9:.1f}"),
         ("eval/rhs", lambda r: fmt(r.get("t2_ratio"))),
         ("layouts agree (max abs diff)", lambda r: fmt(r.get("layouts_max_abs_diff")))])
    tbl("B4 apply and apply_transpose (float64, 1 thread)", ctx.find(bench="B4"),
        [("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("layout", lambda r: r["layout"]),
         ("lanes", lambda r: r["lanes"]), ("nnz", lambda r: r["nnz"]), ("median", ms),
         ("eval_into", lambda r: fmt_s(r["eval_into_s"])), ("transpose/apply (T4)", lambda r: fmt(r.get("t4_ratio"))),
         ("verify", lambda r: fmt(r["verify_err"]))])
    tbl("Peers on B2 tropo12 (1 thread)", ctx.find(bench="peers"),
        [("method", lambda r: r["method"]), ("lanes", lambda r: r["lanes"]), ("median", ms), ("ns/cell", pc),
         ("build", lambda r: fmt_s(r.get("build_s"))),
         ("ours/peer (T1)", lambda r: fmt(r.get("t1_ratio"))),
         ("fused/peer", lambda r: fmt(r.get("t1_ratio_fused"))),
         ("peer/ours", lambda r: fmt(r.get("peer_over_ours"), 1)),
         ("verify vs eval_into", lambda r: fmt(r.get("verify_err"))),
         ("verify vs assemble (8 cells)", lambda r: fmt(r.get("verify_assemble_err")))],
        note="`ours` = `eval_into` on LaneSparseBlocks, float64, same lanes, timed interleaved with the lane "
             "peers (default workspace; `fused` = `new_workspace(keep_slab=False)`). FD errors are of "
             "J·diag(u) (log-scaled), the fair yardstick for 2-point differences.")
    b5 = ctx.find(bench="B5")
    if b5:
        rows = []
        for name in dict.fromkeys(r["model"] for r in b5):
            g = {r["method"]: r for r in b5 if r["model"] == name}
            any_ = next(iter(g.values()))
            gv = lambda k: fmt_s(g[k]["median_s"]) if k in g else "-"    # noqa: E731
            ev = g.get("esmjac.eval_into")
            ca = g.get("casadi.jac")
            rows.append([name, any_["n_species"], any_["n_reactions"], any_["n_fields"],
                         f"{any_['engine']} ({any_['n_statements']})", gv("load"), gv("calculus"), gv("evaldoc"),
                         gv("codegen"), gv("jacobian build cold"),
                         fmt_s(g["jacobian build cold"].get("numba_compile_est_s")) if "jacobian build cold" in g else "-",
                         gv("jacobian build warm (new process)"), gv("jacobian build warm (same process)"),
                         gv("rhs build cold") + (f" ({g['rhs build cold']['engine']}, "
                                                 f"{g['rhs build cold']['n_statements']} stmts)"
                                                 if "rhs build cold" in g else ""),
                         f"{ev['per_lane_s'] * 1e9:.0f}" if ev else "-",
                         f"{ca['per_lane_s'] * 1e9:.0f} (build {ca['build_s']:.1f} s)" if ca else "-"])
        out += ["## B5 build cost against mechanism size (fresh processes, fresh ESMJAC_CACHE_DIR)", "",
                f"Each case is built on {B5_CELLS} cells: stages in one process, the cold build in a "
                "second (empty cache: calculus, code generation and Numba compilation), the warm build "
                "in a third on the same cache. Interpreter imports (earthsci-ast, numba, esmjac) are done "
                "before the clock starts. `load` is `load_view` (earthsci-ast's parse, JSON-schema "
                "validation and structural checks). `numba (est.)` = cold − load − calculus − evaldoc − "
                "codegen.",
                "",
                md_table(["model", "species", "reactions", "fields", "engine (stmts)", "load", "calculus", "evaldoc",
                           "codegen", "cold build", "numba (est.)", "warm (new proc.)", "warm (same proc.)",
                           "rhs cold", "eval_into ns/cell", "CasADi ns/cell"], rows), ""]
    tbl("Plan building (T5)", sorted(ctx.find(bench="plan"), key=lambda r: (r["layout"], r["nnz"])),
        [("model", lambda r: r["model"]), ("layout", lambda r: r["layout"]), ("lanes", lambda r: r["lanes"]),
         ("nnz/slots", lambda r: r["nnz"]), ("time", ms), ("ns per nnz", lambda r: f"{r['per_nnz_s'] * 1e9:.0f}")])
    tbl(f"End to end: tropo12 on {E2E_CELLS} cells, 0..{E2E_T_END / 3600:.0f} h, rtol {E2E_RTOL}, "
        f"atol {E2E_ATOL}", ctx.find(bench="e2e"),
        [("method", lambda r: r["method"]), ("wall (median)", ms), ("runs", lambda r: r["n_calls"]),
         ("steps", lambda r: r.get("nsteps")), ("nfev", lambda r: r.get("nfev")),
         ("njev", lambda r: r.get("njev")), ("LU / lin. iters", lambda r: r.get("nlu", r.get("nlin"))),
         ("err vs reference (tol units)", lambda r: fmt(r.get("err_vs_ref"))),
         ("max rel err (y_ref > 1e3)", lambda r: fmt(r.get("rel_err_vs_ref")))],
        note="Reference: solve_ivp BDF with the analytic Jacobian at rtol 1e-9, atol 1e-4. "
             "Errors at the final time: max |y − y_ref| / (atol + rtol |y_ref|), and max "
             "|y − y_ref| / max(|y_ref|, 1e3 molec cm⁻³). CVODE runs GMRES with scikits.odes' default "
             "Krylov dimension (maxl 5); unpreconditioned, its inexact linear solves cost accuracy "
             "(N2O5) as well as time.")
    if plots:
        out += ["## Plots", ""]
        for p in plots:
            rel = os.path.relpath(p, path.parent)
            out += [f"![{p.stem}]({rel})", ""]
    if ctx.skips:
        out += ["## Not measured", ""] + [f"- {s['what']}: {s['why']}" for s in ctx.skips] + [""]
    if ctx.errors:
        out += ["## Errors", ""] + [f"- {x['what']}: {x['error']}" for x in ctx.errors] + [""]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(out) + "\n")
