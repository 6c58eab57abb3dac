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
and the median, plus the ratios the targets use. The peers and the
mechanism generator live in ``benchmarks/`` of the source tree (found next
to the package, or via ``--bench-dir`` / ``$ESMJAC_BENCH_DIR``); the
reference fixtures via ``--fixtures`` / ``$ESMJAC_FIXTURES``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.resources
import io
import json
import math
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

from esmjac.models.gridded import resized_fixture

__all__ = ["run", "main", "Bench"]

HERE = pathlib.Path(__file__).resolve().parent          # benchmarks/ of the checkout
TROPO12 = pathlib.Path(importlib.resources.files("esmjac.models") / "tropo12.esm")
MARK = "@@ESMJAC-BENCH@@"

CHEM_SIZES = {"full": (1_000, 10_000, 100_000), "quick": (10_000,)}
REF_LANES = 10_000                        # the lane count the targets read
B5_SIZES = {"full": [(20, 50), (75, 200), (150, 400), (300, 800)],
            "quick": [(20, 50), (75, 200), (150, 400)]}
B5_CELLS = 1000
TRANSPORT = {"adv_interior": {"x": 10_000}, "flux_form_adv": {"x": 10_000, "xe": 10_001},
             "minmod_adv": {"x": 10_000}}
E2E_CELLS = 256
E2E_T_END = 6 * 3600.0
E2E_RTOL, E2E_ATOL = 1e-5, 1e-2          # molec cm^-3 (1e2 .. 1e19)
DESIGN_CASADI_272 = 4.8e-6               # docs/design.rst §10: CasADi C route, 272 species, s per cell

SECTIONS = ("chem", "transport", "apply", "peers", "build", "e2e")


# ═══════════════════════════════════════════════════════════════════════════
#  small helpers
# ═══════════════════════════════════════════════════════════════════════════

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _load() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _time(fn, n: int, warmup: int = 2) -> tuple:
    """(median, min, n) wall seconds of ``fn()`` over ``n`` timed calls."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts), n


def _time_many(fns: dict, n: int, rounds: int = 5, warmup: int = 2) -> dict:
    """Interleaved timing: ``rounds`` passes over ``fns`` (name → callable),
    ``n // rounds`` timed calls of each per pass, so that load changes on a
    shared machine hit every method alike. name → (median, min, calls)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    per = max(1, -(-n // rounds))
    ts: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            fn()
            tt = ts[k]
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                tt.append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), len(v)) for k, v in ts.items()}


@contextlib.contextmanager
def _threads(n: int):
    import numba
    prev = numba.get_num_threads()
    numba.set_num_threads(int(n))
    try:
        yield
    finally:
        numba.set_num_threads(prev)


def _resize_set(doc: dict, sizes: dict) -> dict:
    """A copy of a per-cell document with index sets resized (list defaults
    over a resized set cycled)."""
    import copy
    out = copy.deepcopy(doc)
    for name, n in sizes.items():
        out["index_sets"][name]["size"] = int(n)
    for m in out.get("models", {}).values():
        for var in m.get("variables", {}).values():
            d = var.get("default")
            sh = var.get("shape")
            if isinstance(d, list) and d and isinstance(sh, list) and len(sh) == 1 and sh[0] in sizes:
                n = sizes[sh[0]]
                var["default"] = [d[i % len(d)] for i in range(n)]
    return out


def _point(prog, seed: int):
    """(u, forcing) of a program: the document's defaults with each state
    scaled by exp(U(-0.5, 0.5)); forcing at its defaults (None if none)."""
    rng = np.random.default_rng(seed)
    lanes = prog.cells if prog.kind == "cell" else 1
    n = prog.u_size(lanes)
    u0 = prog.u0 if prog.u0 is not None and prog.u0.size == n else np.ones(n)
    u = u0 * np.exp(rng.uniform(-0.5, 0.5, n))
    u = np.where(u0 == 0, rng.uniform(0.0, 1e-3, n), u)
    nf = prog.f_size(lanes)
    f = None
    if nf:
        f = np.array(prog.forcing0, dtype=np.float64) if prog.forcing0 is not None else np.ones(nf)
    return np.ascontiguousarray(u), f


FUSED = "[fused]"


def _fused_workspace(j, plan):
    """A ``keep_slab=False`` workspace when the program writes this plan's
    slots directly (lane plans of generated kernels), else None."""
    if plan.kind != "lane" or j.kernel.engine != "codegen":
        return None
    try:
        return j.new_workspace(keep_slab=False)
    except TypeError:                       # an esmjac without fused kernels
        return None


def _csr_of(plan, out):
    from scipy.sparse import csr_array
    return csr_array((np.asarray(out, dtype=np.float64), np.asarray(plan.indices), np.asarray(plan.indptr)),
                     shape=tuple(plan.info["shape"]))


def _block_pattern_from_csr(plan, n: int, L: int) -> list:
    """(row, col) species pairs of the per-cell block, read from cell 0 of a
    cell program's Csr plan."""
    ip, ix = np.asarray(plan.indptr), np.asarray(plan.indices)
    pat = []
    for r in range(n):
        for c in ix[ip[r * L]:ip[r * L + 1]]:
            pat.append((r, int(c) // L))
    return sorted(pat)


def _lane_values(M, pattern, L: int) -> np.ndarray:
    """Values of a lane-layout sparse matrix at (r*L + l, c*L + l) for each
    (r, c) of ``pattern`` (0 where it holds no entry): shape (K, L)."""
    if not pattern:
        return np.zeros((0, L))
    pr = np.array([r for r, _ in pattern], dtype=np.int64)
    pc = np.array([c for _, c in pattern], dtype=np.int64)
    lanes = np.arange(L, dtype=np.int64)
    rows = (pr[:, None] * L + lanes[None, :]).ravel()
    cols = (pc[:, None] * L + lanes[None, :]).ravel()
    M = M.tocsr() if hasattr(M, "tocsr") else M
    v = np.asarray(M[rows, cols]).reshape(-1)
    return v.reshape(len(pattern), L)


def _lane_err(A, R, pattern, n: int, floor: float, scale=None) -> float:
    """max |A - R| / max(|R|, floor · max over the row of |R|) over lane
    arrays (K, L); with ``scale`` (K, L) both are multiplied by it first."""
    A = np.asarray(A, dtype=np.float64)
    R = np.asarray(R, dtype=np.float64)
    if scale is not None:
        A, R = A * scale, R * scale
    if R.size == 0:
        return 0.0
    pr = np.array([r for r, _ in pattern], dtype=np.int64)
    rowmax = np.zeros((n, R.shape[1]))
    np.maximum.at(rowmax, pr, np.abs(R))
    den = np.maximum(np.abs(R), floor * rowmax[pr])
    den = np.where(den > 0, den, 1.0)
    return float(np.max(np.abs(A - R) / den))


def _rel(a, b, floor: float = 1e-12) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if b.size == 0:
        return 0.0
    scale = np.abs(b).max()
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), floor * scale + 1e-300)))


def _fmt_s(s) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def _fmt(x, nd=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return str(x)


def _md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def _find_dir(explicit, env: str, candidates, marker: str):
    for c in ([explicit] if explicit else []) + ([os.environ[env]] if os.environ.get(env) else []) + candidates:
        p = pathlib.Path(c)
        if (p / marker).exists():
            return p.resolve()
    return None


# ═══════════════════════════════════════════════════════════════════════════
#  the run
# ═══════════════════════════════════════════════════════════════════════════

class Bench:
    """One benchmark run: records, skips, targets."""

    def __init__(self, quick: bool = False, bench_dir=None, fixtures=None, only=None, out=None):
        self.quick = bool(quick)
        self.mode = "quick" if quick else "full"
        self.out = out or sys.stdout
        root = HERE.parent
        self.bench_dir = _find_dir(bench_dir, "ESMJAC_BENCH_DIR",
                                   [root / "benchmarks", pathlib.Path.cwd() / "benchmarks"], "peers.py")
        self.fixtures = _find_dir(fixtures, "ESMJAC_FIXTURES",
                                  [root.parent / "shared" / "reference" / "fixtures",
                                   pathlib.Path.cwd().parent / "shared" / "reference" / "fixtures"],
                                  "bd_chem.esm")
        self.only = set(only) if only else set(SECTIONS)
        self.records: list = []
        self.skips: list = []
        self.errors: list = []
        self.targets: list = []
        self.calls = 50 if quick else 100
        self.cache: dict = {}
        self.tmp = tempfile.mkdtemp(prefix="esmjac_bench_")
        self.env: dict = {}
        self.t_start = time.perf_counter()
        self.peers = self.mech = None
        if self.bench_dir is not None:
            import peers  # benchmarks/ is the running script's own folder

            from esmjac.models import mechanism
            self.peers, self.mech = peers, mechanism

    # -- bookkeeping ---------------------------------------------------------------
    def log(self, msg: str = "") -> None:
        print(msg, file=self.out, flush=True)

    def add(self, bench, model, method, layout, dtype, lanes, threads, median_s, **extra) -> dict:
        rec = {"bench": bench, "model": model, "method": method, "layout": layout,
               "dtype": dtype, "lanes": lanes, "threads": threads, "median_s": median_s}
        rec.update(extra)
        if median_s is not None and lanes and "per_lane_s" not in rec:
            rec["per_lane_s"] = median_s / lanes
        rec["load1"] = (_load() or [None])[0]
        self.records.append(rec)
        bits = [f"{k}={_fmt(v, 3)}" for k, v in extra.items()
                if k.endswith(("ratio", "err", "efficiency", "speedup", "over_ours")) and v is not None]
        self.log(f"  {bench:5s} {model:14s} {method:30s} {str(layout):20s} {str(dtype):8s} "
                 f"L={lanes!s:7s} thr={threads!s:2s} {_fmt_s(median_s):>12s}"
                 + (f"  ({', '.join(bits)})" if bits else ""))
        return rec

    def skip(self, what: str, why: str) -> None:
        self.skips.append({"what": what, "why": why})
        self.log(f"  SKIP {what}: {why}")

    def error(self, what: str, exc: BaseException) -> None:
        tb = traceback.format_exc(limit=6)
        self.errors.append({"what": what, "error": f"{type(exc).__name__}: {exc}", "traceback": tb})
        self.log(f"  ERROR {what}: {type(exc).__name__}: {exc}")

    def find(self, **kw) -> list:
        return [r for r in self.records if all(r.get(k) == v for k, v in kw.items())]

    def one(self, **kw):
        r = self.find(**kw)
        return r[0] if r else None

    def section(self, name: str, fn) -> None:
        if name not in self.only:
            return
        self.log(f"\n== {name} == (load {_load()}, {time.perf_counter() - self.t_start:.0f} s into the run)")
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except Exception as exc:                       # noqa: BLE001 - report, keep measuring
            self.error(f"section {name}", exc)
        self.log(f"   ({name}: {time.perf_counter() - t0:.1f} s)")

    # -- environment ---------------------------------------------------------------------
    def environment(self) -> None:
        import numba
        from esmjac import __version__
        self.env = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": self.mode,
            "cpu": _cpu_model(),
            "cores": os.cpu_count(),
            "numba_threads": int(numba.config.NUMBA_NUM_THREADS),
            "memory_gib": _mem_gib(),
            "platform": platform.platform(),
            "load_start": _load(),
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "numba": numba.__version__,
                "scipy": _version("scipy"),
                "sympy": _version("sympy"),
                "earthsci-ast": _version("earthsci-ast"),
                "esmjac": __version__,
                "jax": _version("jax"),
                "casadi": _version("casadi"),
                "scikits.odes": _version("scikits.odes"),
                "matplotlib": _version("matplotlib"),
            },
            "bench_dir": str(self.bench_dir) if self.bench_dir else None,
            "fixtures": str(self.fixtures) if self.fixtures else None,
            "xla_flags": os.environ.get("XLA_FLAGS"),
        }
        v = self.env["versions"]
        self.log(f"machine: {self.env['cpu']}, {self.env['cores']} cores, numba threads "
                 f"{self.env['numba_threads']}, load {self.env['load_start']}")
        self.log("versions: " + ", ".join(f"{k} {x}" for k, x in v.items()))
        if self.bench_dir is None:
            self.log("benchmarks/ (peers.py, mechanism.py) not found: peers, B5 and the lifted models "
                     "are skipped; pass --bench-dir")
        if self.fixtures is None:
            self.log("reference fixtures not found: B1 and B3 are skipped; pass --fixtures")

    # -- programs -------------------------------------------------------------------------
    def programs(self, key, doc):
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        if key in self.cache:
            return self.cache[key]
        t0 = time.perf_counter()
        r = RhsProgram.build(doc)
        t1 = time.perf_counter()
        j = JacobianProgram.build(doc)
        t2 = time.perf_counter()
        self.log(f"  built {key}: rhs {t1 - t0:.2f} s, jacobian {t2 - t1:.2f} s ({j.kind} lanes, "
                 f"engine {j.kernel.engine}, {j.kernel.n_statements} statements, {j.n_fields} fields)")
        ent = {"doc": doc, "r": r, "j": j, "plans": {}, "build": (t1 - t0, t2 - t1)}
        self.cache[key] = ent
        return ent

    def chem_doc(self, model: str, N: int) -> dict:
        if model == "tropo12":
            return _resize_set(json.loads(TROPO12.read_text()), {"cell": N})
        if model == "bd_chem":
            return _resize_set(json.loads((self.fixtures / "bd_chem.esm").read_text()), {"z": N})
        raise ValueError(model)

    # ══════════════════════════════════════════════════════════════════════
    #  B1 / B2 chemistry, T2, T3
    # ══════════════════════════════════════════════════════════════════════
    def chem(self) -> None:
        from esmjac.layouts.types import Csr, LaneBlocks, LaneSparseBlocks
        models = [("B2", "tropo12")]
        if self.fixtures is not None:
            models.insert(0, ("B1", "bd_chem"))
        else:
            self.skip("B1 bd_chem", "reference fixtures not found")
        sizes = CHEM_SIZES[self.mode]
        for bench, model in models:
            for N in sizes:
                ent = self.programs((model, N), self.chem_doc(model, N))
                r, j = ent["r"], ent["j"]
                L = r.cells
                u, f = _point(r, 1)
                ent["point"] = (u, f)
                p = r.p0
                n_calls = self.calls if N <= 10_000 else 50
                fns, meta, outs, fused_err = {}, {}, {}, {}
                for dt in (np.float64, np.float32):
                    dn = np.dtype(dt).name
                    uu = u.astype(dt)
                    ff = None if f is None else f.astype(dt)
                    out = np.empty_like(uu)
                    sc = r.new_buffers()
                    fns[("rhs", dn)] = (lambda uu=uu, ff=ff, out=out, sc=sc:
                                        r.eval_into(uu, p, 0.0, ff, out, sc))
                for lay in (LaneBlocks(), LaneSparseBlocks(), Csr()):
                    t0 = time.perf_counter()
                    plan = j.plan(lay, source=r)
                    tp = time.perf_counter() - t0
                    ent["plans"][lay.name] = plan
                    nnz = int(plan.info["nnz"]) if "nnz" in plan.info else plan.out_size(L)
                    self.add("plan", model, "plan build", lay.name, "-", L, 1, tp, nnz=nnz,
                             per_lane_s=None, per_nnz_s=tp / max(nnz, 1))
                    for dt in (np.float64, np.float32):
                        dn = np.dtype(dt).name
                        uu = u.astype(dt)
                        ff = None if f is None else f.astype(dt)
                        o = np.zeros(plan.out_size(L), dtype=dt)
                        ws = j.new_workspace()
                        j.eval_into(plan, uu, p, 0.0, ff, o, ws)
                        outs[(lay.name, dn)] = o.copy()
                        fns[(lay.name, dn)] = (lambda plan=plan, uu=uu, ff=ff, o=o, ws=ws:
                                               j.eval_into(plan, uu, p, 0.0, ff, o, ws))
                        meta[(lay.name, dn)] = plan.out_size(L)
                        wsf = _fused_workspace(j, plan)
                        if wsf is not None:
                            of = np.zeros_like(o)
                            j.eval_into(plan, uu, p, 0.0, ff, of, wsf)
                            fused_err[(lay.name + FUSED, dn)] = _rel(of, o, 1e-6)
                            outs[(lay.name + FUSED, dn)] = of.copy()
                            fns[(lay.name + FUSED, dn)] = (lambda plan=plan, uu=uu, ff=ff, of=of, wsf=wsf:
                                                           j.eval_into(plan, uu, p, 0.0, ff, of, wsf))
                            meta[(lay.name + FUSED, dn)] = plan.out_size(L)
                with _threads(1):
                    res = _time_many(fns, n_calls)
                for dt in ("float64", "float32"):
                    med, mn, k = res[("rhs", dt)]
                    self.add(bench, model, "esmjac.rhs", "-", dt, L, 1, med, min_s=mn, n_calls=k)
                for (lay, dn), (med, mn, k) in res.items():
                    if lay == "rhs":
                        continue
                    extra = {}
                    if dn == "float32":
                        extra["f32_vs_f64_err"] = _rel(outs[(lay, dn)], outs[(lay, "float64")], 1e-6)
                    if (lay, dn) in fused_err:
                        extra["fused_vs_slab_err"] = fused_err[(lay, dn)]
                    rhs_med = res[("rhs", dn)][0]
                    fused = lay.endswith(FUSED)
                    self.add(bench, model, "esmjac.eval_into" + (FUSED if fused else ""),
                             lay[:-len(FUSED)] if fused else lay, dn, L, 1, med, min_s=mn,
                             n_calls=k, t2_ratio=med / rhs_med, rhs_median_s=rhs_med,
                             slots=meta[(lay, dn)], engine=j.kernel.engine,
                             workspace="keep_slab=False" if fused else "default", **extra)
                if N <= REF_LANES:
                    self.verify_layouts(model, j, ent["plans"], outs, L)
        self.t3()

    def t3(self) -> None:
        """T3 in fresh processes (the threading layer is fixed at a process's
        first parallel call): Numba's default, then two informative variants."""
        import numba
        NT = int(numba.config.NUMBA_NUM_THREADS)
        if NT < 2:
            self.skip("T3", "numba has one thread on this machine")
            return
        N = CHEM_SIZES[self.mode][-1]
        d = pathlib.Path(tempfile.mkdtemp(prefix="t3_", dir=self.tmp))
        path = d / "tropo12.esm"
        path.write_text(json.dumps(self.chem_doc("tropo12", N)))
        variants = [("default", {}), ("OMP_WAIT_POLICY=active", {"OMP_WAIT_POLICY": "active"}),
                    ("NUMBA_THREADING_LAYER=workqueue", {"NUMBA_THREADING_LAYER": "workqueue"})]
        for label, extra_env in variants:
            try:
                res = self._child({"doc": str(path), "mode": "t3", "calls": 50, "threads": NT,
                                   "bench_dir": None}, None, extra_env)
            except Exception as exc:                     # noqa: BLE001
                self.error(f"T3 {label}", exc)
                continue
            for meth, key, lay in (("esmjac.eval_into", "eval", "lanesparseblocks"), ("esmjac.rhs", "rhs", "-"),
                                   ("esmjac.eval_into" + FUSED, "eval_fused", "lanesparseblocks")):
                if key not in res:
                    continue
                m1, mN = res[key]["1"], res[key][str(NT)]
                n1, nN = res[key + "_min"]["1"], res[key + "_min"][str(NT)]
                sp = m1 / mN
                self.add("T3", "tropo12", meth, lay, "float64", N, NT, mN, t1_s=m1, n_calls=res["calls"],
                         min_s=nN, t1_min_s=n1, speedup=sp, efficiency=sp / NT,
                         efficiency_of_mins=n1 / nN / NT, variant=label, threading_layer=res["layer"])

    def verify_layouts(self, model, j, plans, outs, L) -> None:
        """The three layouts hold the same numbers (float64)."""
        n = j.n_species
        lb = outs[("laneblocks-natural", "float64")].reshape(n * n, L)
        sp_plan = plans["lanesparseblocks"]
        order = [int(x) for x in sp_plan.info["ordering"]]
        sp = outs[("lanesparseblocks", "float64")].reshape(-1, L)
        from_sp = np.zeros_like(lb)
        for q, (a, b) in enumerate(sp_plan.info["lu_pattern"]):
            from_sp[order[a] * n + order[b]] = sp[q]
        pat = [(r, c) for r in range(n) for c in range(n)]
        M = _csr_of(plans["csr"], outs[("csr", "float64")])
        from_csr = _lane_values(M, pat, L)
        d1 = float(np.max(np.abs(from_sp - lb)))
        d2 = float(np.max(np.abs(from_csr - lb)))
        self.log(f"  verify {model}: LaneSparseBlocks vs LaneBlocks max |diff| {d1:.3g}, Csr vs LaneBlocks {d2:.3g}")
        for rec in self.find(model=model, method="esmjac.eval_into", lanes=L):
            rec["layouts_max_abs_diff"] = max(d1, d2)
        if d1 > 0 or d2 > 0:
            self.errors.append({"what": f"layouts disagree ({model})", "error": f"{d1} {d2}"})

    # ══════════════════════════════════════════════════════════════════════
    #  B3 transport
    # ══════════════════════════════════════════════════════════════════════
    def transport(self) -> None:
        from esmjac.errors import JacError
        from esmjac.layouts.types import ColumnBanded, Csr
        if self.fixtures is None:
            self.skip("B3", "reference fixtures not found")
            return
        for fx, sizes in TRANSPORT.items():
            doc = resized_fixture(json.loads((self.fixtures / f"{fx}.esm").read_text()), sizes)
            ent = self.programs((fx, 10_000), doc)
            r, j = ent["r"], ent["j"]
            u, f = _point(r, 3)
            ent["point"] = (u, f)
            p = r.p0
            lanes = r.cells if r.kind == "cell" else 1
            npts = r.u_size(lanes)
            rhs_t = {}
            outs = {}
            with _threads(1):
                for dt in (np.float64, np.float32):
                    dn = np.dtype(dt).name
                    uu, ff = u.astype(dt), None if f is None else f.astype(dt)
                    out = np.empty_like(uu)
                    sc = r.new_buffers()
                    med, mn, k = _time(lambda: r.eval_into(uu, p, 0.0, ff, out, sc), self.calls)
                    rhs_t[dn] = med
                    self.add("B3", fx, "esmjac.rhs", "-", dn, lanes, 1, med, min_s=mn, n_calls=k,
                             unknowns=npts, per_lane_s=None, per_unknown_s=med / npts)
                for lay in (Csr(), ColumnBanded()):
                    t0 = time.perf_counter()
                    try:
                        plan = j.plan(lay, source=r)
                    except JacError as exc:
                        self.skip(f"B3 {fx} {lay.name}", str(exc))
                        continue
                    tp = time.perf_counter() - t0
                    ent["plans"][lay.name] = plan
                    nnz = int(plan.info.get("nnz", plan.info.get("size", 0)))
                    csr_nnz = int(ent["plans"]["csr"].info["nnz"]) if "csr" in ent["plans"] else 0
                    if lay.name.startswith("columnbanded") and csr_nnz and plan.info["size"] > 64 * csr_nnz:
                        self.skip(f"B3 {fx} {lay.name} eval_into",
                                  f"band storage of {plan.info['size']} slots (kl {plan.info['kl']}, ku "
                                  f"{plan.info['ku']}) for {csr_nnz} nonzeros ({plan.info['size'] * 8 / 2**30:.1f} "
                                  "GiB per float64 Jacobian): the stencil couples the two ends of the grid "
                                  "(periodic), so the band spans the whole column; the plan is accepted anyway")
                        self.add("plan", fx, "plan build", lay.name, "-", lanes, 1, tp, nnz=nnz, per_lane_s=None,
                                 per_nnz_s=tp / max(nnz, 1))
                        continue
                    self.add("plan", fx, "plan build", lay.name, "-", lanes, 1, tp, nnz=nnz, per_lane_s=None,
                             per_nnz_s=tp / max(nnz, 1))
                    ws = j.new_workspace()
                    for dt in (np.float64, np.float32):
                        dn = np.dtype(dt).name
                        uu, ff = u.astype(dt), None if f is None else f.astype(dt)
                        o = np.zeros(plan.out_size(ws.lanes), dtype=dt)
                        j.eval_into(plan, uu, p, 0.0, ff, o, ws)
                        outs[(lay.name, dn)] = o.copy()
                        med, mn, k = _time(lambda: j.eval_into(plan, uu, p, 0.0, ff, o, ws), self.calls)
                        extra = {}
                        if dn == "float32":
                            extra["f32_vs_f64_err"] = _rel(o, outs[(lay.name, "float64")], 1e-6)
                        self.add("B3", fx, "esmjac.eval_into", lay.name, dn, lanes, 1, med, min_s=mn, n_calls=k,
                                 t2_ratio=med / rhs_t[dn], unknowns=npts, per_lane_s=None,
                                 per_unknown_s=med / npts, slots=plan.out_size(ws.lanes), **extra)
            if ("columnbanded", "float64") in outs:
                d = self.verify_banded(j, ent["plans"]["csr"], outs[("csr", "float64")],
                                       ent["plans"]["columnbanded"], outs[("columnbanded", "float64")])
                self.log(f"  verify {fx}: ColumnBanded vs Csr max |diff| {d:.3g}")
                for rec in self.find(bench="B3", model=fx, method="esmjac.eval_into"):
                    rec["layouts_max_abs_diff"] = d

    @staticmethod
    def verify_banded(j, csr_plan, csr_out, band_plan, band_out) -> float:
        info = band_plan.info
        lay = j.layout
        ns = len(lay.states)
        shape = lay.shapes[lay.states[0]]
        N = int(np.prod(shape))
        axis = info["axis"]
        ip = np.asarray(csr_plan.indptr)
        rows = np.repeat(np.arange(ip.size - 1), np.diff(ip))
        cols = np.asarray(csr_plan.indices)

        def split(e):
            s, cell = np.divmod(e, N)
            idx = np.unravel_index(cell, shape)
            rest = [x for d, x in enumerate(idx) if d != axis]
            rshape = [m for d, m in enumerate(shape) if d != axis]
            lane = np.ravel_multi_index(rest, rshape) if rest else np.zeros_like(cell)
            return lane, idx[axis] * ns + s
        rl, ri = split(rows)
        _, ci = split(cols)
        m, ku, C = info["m"], info["ku"], info["columns"]
        pos = ((ku + ri - ci) * m + ci) * C + rl
        b = np.array(band_out, dtype=np.float64)
        d = float(np.max(np.abs(b[pos] - csr_out), initial=0.0))
        b[pos] = 0.0
        return max(d, float(np.max(np.abs(b), initial=0.0)))

    # ══════════════════════════════════════════════════════════════════════
    #  B4 apply / apply_transpose
    # ══════════════════════════════════════════════════════════════════════
    def apply(self) -> None:
        from esmjac.layouts.types import Csr, LaneSparseBlocks
        cases = [("tropo12", 10_000, "lanesparseblocks")]
        if self.fixtures is not None:
            cases += [(fx, 10_000, "csr") for fx in TRANSPORT]
        for model, N, layname in cases:
            key = (model, N)
            if key not in self.cache:
                doc = self.chem_doc(model, N) if model == "tropo12" else \
                    resized_fixture(json.loads((self.fixtures / f"{model}.esm").read_text()), TRANSPORT[model])
                self.programs(key, doc)
            ent = self.cache[key]
            r, j = ent["r"], ent["j"]
            if "point" not in ent:
                ent["point"] = _point(r, 1)
            u, f = ent["point"]
            p = r.p0
            plans = ent["plans"]
            if "csr" not in plans:
                plans["csr"] = j.plan(Csr(), source=r)
            if layname not in plans:
                plans[layname] = j.plan(LaneSparseBlocks(), source=r)
            plan = plans[layname]
            lanes = r.cells if r.kind == "cell" else 1
            wsc = j.new_workspace()
            oc = np.zeros(plans["csr"].out_size(wsc.lanes))
            j.eval_into(plans["csr"], u, p, 0.0, f, oc, wsc)
            M = _csr_of(plans["csr"], oc)
            ws = j.new_workspace()
            o = np.zeros(plan.out_size(ws.lanes))
            j.eval_into(plan, u, p, 0.0, f, o, ws)
            rng = np.random.default_rng(5)
            v = rng.standard_normal(j.col_size(ws.lanes))
            lam = rng.standard_normal(j.u_size(ws.lanes))
            y = np.zeros(j.u_size(ws.lanes))
            g = np.zeros(j.col_size(ws.lanes))
            j.apply(plan, ws, v, y)
            j.apply_transpose(plan, ws, lam, g)
            e1 = _rel(y, M @ v, 1e-12)
            e2 = _rel(g, M.T @ lam, 1e-12)
            self.log(f"  verify {model}: apply vs Csr@v {e1:.2e}, apply_transpose vs Csr.T@lam {e2:.2e}")
            with _threads(1):
                ma, mna, ka = _time(lambda: j.apply(plan, ws, v, y), self.calls)
                mt, mnt, kt = _time(lambda: j.apply_transpose(plan, ws, lam, g), self.calls)
                me, _, _ = _time(lambda: j.eval_into(plan, u, p, 0.0, f, o, ws), self.calls)
            nnz = M.nnz
            self.add("B4", model, "esmjac.apply", layname, "float64", lanes, 1, ma, min_s=mna, n_calls=ka,
                     nnz=nnz, verify_err=e1, eval_into_s=me)
            self.add("B4", model, "esmjac.apply_transpose", layname, "float64", lanes, 1, mt, min_s=mnt,
                     n_calls=kt, nnz=nnz, verify_err=e2, t4_ratio=mt / ma, eval_into_s=me)

    # ══════════════════════════════════════════════════════════════════════
    #  peers (B2 tropo12), T1
    # ══════════════════════════════════════════════════════════════════════
    def peers_section(self) -> None:
        if self.peers is None:
            self.skip("peers", "benchmarks/peers.py not found")
            return
        sizes = CHEM_SIZES[self.mode]
        hr = None
        for N in sizes:
            hr = self.peers_at(N, hr)

    def peers_at(self, L: int, hr):
        from esmjac.layouts.types import Csr
        pe = self.peers
        src = str(TROPO12)
        key = ("tropo12", L)
        if key not in self.cache:
            self.programs(key, self.chem_doc("tropo12", L))
        ent = self.cache[key]
        r, j = ent["r"], ent["j"]
        if "point" not in ent:
            ent["point"] = _point(r, 1)
        u, f = ent["point"]
        p = r.p0
        n = j.n_species
        plans = ent["plans"]
        if "csr" not in plans:
            plans["csr"] = j.plan(Csr(), source=r)
        ws = j.new_workspace()
        oc = np.zeros(plans["csr"].out_size(L))
        j.eval_into(plans["csr"], u, p, 0.0, f, oc, ws)
        M = _csr_of(plans["csr"], oc)
        ours_pattern = _block_pattern_from_csr(plans["csr"], n, L)
        ours_rhs = np.empty_like(u)
        r.eval_into(u, p, 0.0, f, ours_rhs)
        first = L == CHEM_SIZES[self.mode][0]
        big = L > 10_000
        if "lanesparseblocks" not in plans:
            from esmjac.layouts.types import LaneSparseBlocks
            plans["lanesparseblocks"] = j.plan(LaneSparseBlocks(), source=r)
        psb = plans["lanesparseblocks"]
        wsb = j.new_workspace()
        osb = np.zeros(psb.out_size(L))
        orh = np.empty_like(u)
        scr = r.new_buffers()

        def lane_check(peer_pattern, peer_vals, name, floor=1e-8, log_scaled=False, rtol=1e-10):
            union = sorted(set(peer_pattern) | set(ours_pattern))
            pos = {rc: k for k, rc in enumerate(peer_pattern)}
            A = np.zeros((len(union), L))
            for k, rc in enumerate(union):
                if rc in pos:
                    A[k] = peer_vals[pos[rc]]
            R = _lane_values(M, union, L)
            scale = None
            if log_scaled:
                pc = np.array([c for _, c in union], dtype=np.int64)
                scale = np.abs(u.reshape(n, L)[pc])
            err = _lane_err(A, R, union, n, floor, scale)
            if not err <= rtol:
                raise AssertionError(f"{name}: differs from esmjac's eval_into at {L} cells: "
                                     f"max rel err {err:.3e} > {rtol:.0e}")
            return err

        # -- lane-kernel peers: build, verify, then time interleaved with esmjac
        fns = {("esmjac", "jac"): lambda: j.eval_into(psb, u, p, 0.0, f, osb, wsb),
               ("esmjac", "rhs"): lambda: r.eval_into(u, p, 0.0, f, orh, scr)}
        wsf = _fused_workspace(j, psb)
        if wsf is not None:
            osf = np.zeros_like(osb)
            fns[("esmjac", "jac" + FUSED)] = lambda: j.eval_into(psb, u, p, 0.0, f, osf, wsf)
        info: dict = {}
        lane_peers = [("handrolled", None)]
        if not big:                       # JAX and CasADi recompile per lane count: 10^4 cells only
            if self.quick:
                self.skip("peer jax", "--quick (slow peer)")
            else:
                lane_peers.append(("jax", pe.jax_peer))
            lane_peers.append(("casadi", pe.casadi_peer))
        for name, mk in lane_peers:
            try:
                if name == "handrolled":
                    if hr is None:
                        hr = pe.handrolled(src)
                        hr._bench_e8 = pe.check_peer_against_assemble(hr, src)
                        self.log(f"  hand-rolled built in {hr.build_s:.2f} s; vs assemble (8 cells) "
                                 f"{hr._bench_e8:.2e}")
                    peer, e8 = hr, hr._bench_e8
                else:
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        peer = mk(src, L=L)
                    if peer is None:
                        self.skip(f"peer {name}", buf.getvalue().strip() or "not importable")
                        continue
                    e8 = pe.check_peer_against_assemble(peer, src)
                oj = np.empty(peer.nnz * L)
                peer.jac(u, p, f, oj, L)
                err = lane_check(peer.pattern, oj.reshape(peer.nnz, L), name)
                fns[(name, "jac")] = (lambda peer=peer, oj=oj: peer.jac(u, p, f, oj, L))
                info[(name, "jac")] = dict(build_s=peer.build_s, verify_err=err, verify_assemble_err=e8,
                                           nnz_per_cell=peer.nnz,
                                           route=getattr(peer, "info", {}).get("route", "jit")
                                           if name != "handrolled" else "sympy-cse-njit")
                if peer.rhs is not None:
                    orr = np.empty(n * L)
                    peer.rhs(u, p, f, orr, L)
                    info[(name, "rhs")] = dict(verify_err=_rel(orr, ours_rhs, 1e-8))
                    fns[(name, "rhs")] = (lambda peer=peer, orr=orr: peer.rhs(u, p, f, orr, L))
            except Exception as exc:                     # noqa: BLE001
                self.error(f"peer {name} at {L}", exc)
        with _threads(1):
            res = _time_many(fns, self.calls if not big else 50)
        ours_t = res[("esmjac", "jac")][0]
        ours_r = res[("esmjac", "rhs")][0]
        ours_f = res[("esmjac", "jac" + FUSED)][0] if ("esmjac", "jac" + FUSED) in res else None
        for (name, what), (med, mn, k) in res.items():
            if name == "esmjac":
                self.add("peers", "tropo12", "esmjac.eval_into" + what[3:] if what.startswith("jac") else "esmjac.rhs",
                         "lanesparseblocks" if what.startswith("jac") else "-", "float64", L, 1, med, min_s=mn,
                         n_calls=k, note="timed interleaved with the lane peers")
                continue
            extra = dict(info.get((name, what), {}))
            if what == "jac":
                extra["peer_over_ours"] = med / ours_t
                if ours_f:
                    extra["peer_over_ours_fused"] = med / ours_f
                if name == "handrolled":
                    extra["t1_ratio"] = ours_t / med
                    if ours_f:
                        extra["t1_ratio_fused"] = ours_f / med
            else:
                extra["peer_over_ours"] = med / ours_r
            self.add("peers", "tropo12", f"{name}.{what}", "pattern" if what == "jac" else "-", "float64", L, 1,
                     med, min_s=mn, n_calls=k, **extra)

        def vs_ours(rec_t):
            return rec_t / ours_t

        # -- SciPy FD over our RHS, earthsci-ast's RHS and SciPy FD over it
        sparsity = _csr_of(plans["csr"], np.ones(int(plans["csr"].info["nnz"])))
        fd_calls = (5, 3) if not big else (3, 2)
        try:
            fd = pe.scipy_fd(lambda uu: r(0.0, uu), n * L, sparsity)
            if first:
                doc8 = self.chem_doc("tropo12", 8)
                from esmjac.runtime.programs import RhsProgram
                r8 = RhsProgram.build(doc8)
                pat8 = pe.lane_sparsity(ours_pattern, n, 8)
                e8 = pe.check_peer_against_assemble(pe.scipy_fd(lambda uu: r8(0.0, uu), n * 8, pat8), src)
            else:
                e8 = None
            A = fd(u)
            err = lane_check(ours_pattern, _lane_values(A, ours_pattern, L), "scipy_fd(esmjac rhs)",
                             floor=1e-3, log_scaled=True, rtol=1e-4)
            with _threads(1):
                m, mn, k = _time(lambda: fd(u), fd_calls[0], warmup=1)
            self.add("peers", "tropo12", "scipy_fd(esmjac.rhs)", "csr", "float64", L, 1, m, min_s=mn, n_calls=k,
                     groups=fd.n_groups, verify_err=err, verify_assemble_err=e8, peer_over_ours=vs_ours(m))
        except Exception as exc:                         # noqa: BLE001
            self.error(f"peer scipy_fd(esmjac rhs) at {L}", exc)

        if self.quick:
            self.skip("peers earthsci-ast RHS and SciPy FD over it", "--quick (slow peers)")
            return hr
        try:
            doc = ent["doc"]
            er = pe.earthsci_rhs(doc)
            if list(er.names) != list(r.names):
                raise AssertionError("earthsci-ast's element order differs from esmjac's")
            err_r = _rel(er(u), ours_rhs, 1e-8)
            if not err_r <= 1e-10:
                raise AssertionError(f"earthsci-ast RHS differs from esmjac's: {err_r:.2e}")
            m, mn, k = _time(lambda: er(u), 20 if big else 50, warmup=1)
            self.add("peers", "tropo12", "earthsci_ast.rhs", "-", "float64", L, 1, m, min_s=mn, n_calls=k,
                     build_s=er.build_s, verify_err=err_r, peer_over_ours=m / ours_r)
            fde = pe.scipy_fd(er, n * L, sparsity)
            if first:
                er8 = pe.earthsci_rhs(self.chem_doc("tropo12", 8))
                e8 = pe.check_peer_against_assemble(pe.scipy_fd(er8, n * 8, pe.lane_sparsity(ours_pattern, n, 8)),
                                                    src)
            else:
                e8 = None
            A = fde(u)
            err = lane_check(ours_pattern, _lane_values(A, ours_pattern, L), "scipy_fd(earthsci rhs)",
                             floor=1e-3, log_scaled=True, rtol=1e-4)
            m, mn, k = _time(lambda: fde(u), fd_calls[1], warmup=1)
            self.add("peers", "tropo12", "scipy_fd(earthsci_ast.rhs)", "csr", "float64", L, 1, m, min_s=mn,
                     n_calls=k, groups=fde.n_groups, verify_err=err, verify_assemble_err=e8,
                     peer_over_ours=vs_ours(m))
        except Exception as exc:                         # noqa: BLE001
            self.error(f"peer earthsci-ast at {L}", exc)
        return hr

    # ══════════════════════════════════════════════════════════════════════
    #  B5 build cost (fresh processes), T5
    # ══════════════════════════════════════════════════════════════════════
    def build(self) -> None:
        cases = [("tropo12", 15, 30, None)]
        if self.mech is None:
            self.skip("B5 synthetic mechanisms", "benchmarks/mechanism.py not found")
        else:
            cases += [(f"synth{ns}x{nr}", ns, nr, (ns, nr)) for ns, nr in B5_SIZES[self.mode]]
        largest = cases[-1][0]
        if self.quick:
            self.skip("B5 RhsProgram builds", "--quick (Jacobian builds only)")
        for name, ns, nr, synth in cases:
            if synth is None:
                doc = _resize_set(json.loads(TROPO12.read_text()), {"cell": B5_CELLS})
            else:
                doc = self.mech.synthetic_mechanism(ns, nr, B5_CELLS, seed=0)
            d = pathlib.Path(tempfile.mkdtemp(prefix=f"b5_{name}_", dir=self.tmp))
            path = d / f"{name}.esm"
            path.write_text(json.dumps(doc))
            cache = d / "cache"
            cache.mkdir()
            casadi = (not self.quick) and name == largest
            spec = {"doc": str(path), "bench_dir": str(self.bench_dir) if self.bench_dir else None,
                    "cells": B5_CELLS, "calls": 50, "rhs": not self.quick}
            try:
                st = self._child(dict(spec, mode="stages"), cache)
                cold = self._child(dict(spec, mode="cold"), cache)
                warm = self._child(dict(spec, mode="warm", casadi=casadi), cache)
            except Exception as exc:                     # noqa: BLE001
                self.error(f"B5 {name}", exc)
                continue
            numba_s = cold["jac_build_s"] - st["load_s"] - st["calculus_s"] - st["evaldoc_s"] - st["codegen_s"]
            common = dict(n_species=ns, n_reactions=nr, n_fields=st["n_fields"], engine=st["engine"],
                          n_statements=st["n_statements"], per_lane_s=None)
            self.add("B5", name, "load", "-", "-", B5_CELLS, 1, st["load_s"], **common)
            self.add("B5", name, "calculus", "-", "-", B5_CELLS, 1, st["calculus_s"], **common)
            self.add("B5", name, "evaldoc", "-", "-", B5_CELLS, 1, st["evaldoc_s"], **common)
            self.add("B5", name, "codegen", "-", "-", B5_CELLS, 1, st["codegen_s"], **common)
            self.add("B5", name, "jacobian build cold", "-", "-", B5_CELLS, 1, cold["jac_build_s"],
                     numba_compile_est_s=numba_s, **common)
            if "rhs_build_s" in cold:
                self.add("B5", name, "rhs build cold", "-", "-", B5_CELLS, 1, cold["rhs_build_s"],
                         **dict(common, engine=cold["rhs_engine"], n_statements=cold["rhs_statements"],
                                chunks=cold["rhs_chunks"]))
            self.add("B5", name, "jacobian build warm (new process)", "-", "-", B5_CELLS, 1,
                     warm["jac_build_s"], **common)
            self.add("B5", name, "jacobian build warm (same process)", "-", "-", B5_CELLS, 1,
                     warm["jac_rebuild_inproc_s"], **common)
            if "rhs_build_s" in warm:
                self.add("B5", name, "rhs build warm (new process)", "-", "-", B5_CELLS, 1, warm["rhs_build_s"],
                         **common)
            for lay, (tp, nnz) in warm["plans"].items():
                self.add("plan", name, "plan build", lay, "-", B5_CELLS, 1, tp, nnz=nnz, per_lane_s=None,
                         per_nnz_s=tp / max(nnz, 1), n_species=ns)
            ev = warm.get("eval")
            if ev:
                self.add("B5", name, "esmjac.eval_into", "lanesparseblocks", "float64", B5_CELLS, 1, ev["median_s"],
                         min_s=ev["min_s"], n_calls=ev["n_calls"], engine=st["engine"], n_species=ns,
                         n_reactions=nr)
            ca = warm.get("casadi")
            if ca:
                if "error" in ca:
                    self.errors.append({"what": f"B5 casadi {name}", "error": ca["error"]})
                    self.log(f"  ERROR B5 casadi {name}: {ca['error']}")
                else:
                    self.add("B5", name, "casadi.jac", "pattern", "float64", B5_CELLS, 1, ca["median_s"],
                             min_s=ca["min_s"], n_calls=ca["n_calls"], build_s=ca["build_s"],
                             verify_err=ca["verify_err"], route=ca["route"], n_species=ns,
                             peer_over_ours=ca["median_s"] / ev["median_s"] if ev else None)
            elif casadi is False and name == largest:
                self.skip(f"B5 casadi at {name}", "--quick")

    def _child(self, spec: dict, cache, extra_env=None) -> dict:
        env = dict(os.environ)
        if cache is not None:
            env["ESMJAC_CACHE_DIR"] = str(cache)
        env.update(extra_env or {})
        code = "import sys, suite as b; sys.exit(b._child_main(sys.argv[1]))"  # run with cwd=benchmarks/
        for attempt in range(2):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", code, json.dumps(spec)], env=env, cwd=HERE, capture_output=True,
                               text=True, timeout=1800)
            wall = time.perf_counter() - t0
            for line in p.stdout.splitlines():
                if line.startswith(MARK):
                    res = json.loads(line[len(MARK):])
                    res["process_wall_s"] = wall
                    return res
            err = (p.stderr or p.stdout)[-1500:]
            # a source tree edited while we run can fail to import for a moment: retry once
            if attempt == 0 and ("ImportError" in err or "SyntaxError" in err):
                self.log(f"  (build child failed to import esmjac; retrying in 30 s: {err.strip().splitlines()[-1]})")
                time.sleep(30)
                continue
            break
        raise RuntimeError(f"build child ({spec['mode']}) failed with rc {p.returncode}: {err}")

    # ══════════════════════════════════════════════════════════════════════
    #  end to end
    # ══════════════════════════════════════════════════════════════════════
    def e2e(self) -> None:
        from esmjac.adapters.scipy import ivp
        doc = _resize_set(json.loads(TROPO12.read_text()), {"cell": E2E_CELLS})
        rng = np.random.default_rng(42)
        fj = np.linspace(0.1, 1.5, E2E_CELLS)
        base = ivp(doc)
        y0 = base.y0 * rng.uniform(0.5, 2.0, base.y0.shape)
        prob = ivp(doc, method="BDF", forcing={"fj": fj}, y0=y0)
        prob.jac(0.0, prob.y0)
        span = (0.0, E2E_T_END)
        reps = 1 if self.quick else 3
        n = prob.n
        t0 = time.perf_counter()
        ref = prob.solve(span, rtol=1e-9, atol=1e-4)
        self.log(f"  reference (BDF + analytic J, rtol 1e-9, atol 1e-4): {time.perf_counter() - t0:.2f} s, "
                 f"status {ref.status}")
        yref = ref.y[:, -1]

        def err_of(y):
            return float(np.max(np.abs(np.asarray(y) - yref) / (E2E_ATOL + E2E_RTOL * np.abs(yref))))

        def rel_of(y):
            return float(np.max(np.abs(np.asarray(y) - yref) / np.maximum(np.abs(yref), 1e3)))

        def timed(label, make_run, finish):
            try:
                ts, last = [], None
                for _ in range(reps):
                    t0 = time.perf_counter()
                    last = make_run()
                    ts.append(time.perf_counter() - t0)
                info = finish(last)
                self.add("e2e", "tropo12", label, info.pop("layout"), "float64", E2E_CELLS, 1,
                         statistics.median(ts), min_s=min(ts), n_calls=reps, unknowns=n,
                         rtol=E2E_RTOL, atol=E2E_ATOL, t_end=E2E_T_END, **info)
            except NotImplementedError as exc:
                self.skip(f"e2e {label}", f"NotImplementedError: {exc}")
            except Exception as exc:                     # noqa: BLE001
                self.skip(f"e2e {label}", f"{type(exc).__name__}: {exc}")

        def ivp_info(sol, layout):
            return {"layout": layout, "status": int(sol.status), "nsteps": int(sol.t.size - 1),
                    "nfev": int(sol.nfev), "njev": int(sol.njev), "nlu": int(sol.nlu),
                    "err_vs_ref": err_of(sol.y[:, -1]), "rel_err_vs_ref": rel_of(sol.y[:, -1])}

        timed("solve_ivp BDF + esmjac sparse J",
              lambda: prob.solve(span, rtol=E2E_RTOL, atol=E2E_ATOL), lambda s: ivp_info(s, "csc"))
        timed("solve_ivp BDF + FD (jac_sparsity)",
              lambda: prob.solve(span, rtol=E2E_RTOL, atol=E2E_ATOL, jac=None, jac_sparsity=prob.jac_sparsity),
              lambda s: ivp_info(s, "fd-grouped"))

        try:
            from esmjac.adapters.native import rosenbrock
            rb = rosenbrock(doc, forcing=np.ascontiguousarray(fj, dtype=np.float64))
            timed("native Rosenbrock (rodas3)",
                  lambda: rb.solve(span, y0=y0, rtol=E2E_RTOL, atol=E2E_ATOL),
                  lambda res: {"layout": "lanesparseblocks", "status": 0 if res.success else -1,
                               "nsteps": int(res.nsteps), "nfev": int(res.nfev), "njev": int(res.njev),
                               "nlu": int(res.ndec), "err_vs_ref": err_of(res.y), "rel_err_vs_ref": rel_of(res.y),
                               "message": res.message})
        except Exception as exc:                         # noqa: BLE001
            self.skip("e2e native Rosenbrock", f"{type(exc).__name__}: {exc}")

        try:
            from esmjac.adapters import sundials
        except Exception as exc:                         # noqa: BLE001
            self.skip("e2e CVODE", f"esmjac.adapters.sundials: {type(exc).__name__}: {exc}")
            return
        tout = np.array([0.0, E2E_T_END])
        for label, pc in (("CVODE BDF GMRES + esmjac J·v", None),
                          ("CVODE BDF GMRES + J·v + block precond", "block")):
            try:
                cv = sundials.cvode(doc, linsolver="spgmr", precond=pc, rtol=E2E_RTOL, atol=E2E_ATOL,
                                    forcing={"fj": fj}, y0=y0, max_steps=100_000)
            except NotImplementedError as exc:
                self.skip(f"e2e {label}", f"NotImplementedError: {exc}")
                continue
            except Exception as exc:                     # noqa: BLE001
                self.skip(f"e2e {label}", f"{type(exc).__name__}: {exc}")
                continue

            def cv_info(res, cv=cv, pc=pc):
                if res.flag != 0:
                    raise RuntimeError(f"CVODE flag {res.flag}: {res.message}")
                st = cv.stats()
                return {"layout": "csr" + ("+laneblocks" if pc else ""), "status": int(res.flag),
                        "nsteps": int(st.get("NumSteps", -1)), "nfev": int(cv.nfev),
                        "njev": int(cv.counters().get("njtsetup", 0)),
                        "nlin": int(st.get("NumLinIters", -1)), "npsolve": int(cv.counters().get("npsolve", 0)),
                        "err_vs_ref": err_of(np.asarray(res.values.y)[-1]),
                        "rel_err_vs_ref": rel_of(np.asarray(res.values.y)[-1]), "maxl": "default (5)"}

            def once(cv=cv):
                cv.reset_counters()
                return cv.solve(tout)
            timed(label, once, cv_info)

    # ══════════════════════════════════════════════════════════════════════
    #  targets
    # ══════════════════════════════════════════════════════════════════════
    def evaluate_targets(self) -> None:
        T = self.targets

        def line(tid, ok, text):
            st = "PASS" if ok else "MISS"
            if ok is None:
                st = "n/a "
            T.append({"target": tid, "status": st.strip(), "text": text})

        L0 = REF_LANES
        ours = {lay: self.one(bench="B2", model="tropo12", method="esmjac.eval_into", layout=lay,
                              dtype="float64", lanes=L0, threads=1)
                for lay in ("lanesparseblocks", "laneblocks-natural", "csr")}
        hr = self.one(bench="peers", method="handrolled.jac", lanes=L0)
        o = self.one(bench="peers", method="esmjac.eval_into", lanes=L0)
        o2 = self.one(bench="B2", model="tropo12", method="esmjac.eval_into", layout="lanesparseblocks",
                      dtype="float64", lanes=L0, threads=1)
        if o and hr:
            ratio = o["median_s"] / hr["median_s"]
            sb = ours["lanesparseblocks"]
            others = ", ".join(f"{k} {ours[k]['median_s'] / sb['median_s'] * ratio:.2f}"
                               for k in ("csr", "laneblocks-natural") if ours[k] and sb)
            line("T1", ratio <= 1.5, f"eval_into / hand-rolled Numba = {ratio:.2f} (target <= 1.5; tropo12, "
                 f"{L0} cells, LaneSparseBlocks float64, 1 thread, timed interleaved: {_fmt_s(o['median_s'])} vs "
                 f"{_fmt_s(hr['median_s'])}; other layouts, scaled by their B2 time: {others})")
        else:
            line("T1", None, "eval_into / hand-rolled: not measured")
        of = self.one(bench="peers", method="esmjac.eval_into" + FUSED, lanes=L0)
        if of and hr:
            ratio = of["median_s"] / hr["median_s"]
            line("T1", ratio <= 1.5, f"eval_into with new_workspace(keep_slab=False) (fused kernels, no band slab) "
                 f"/ hand-rolled Numba = {ratio:.2f} (target <= 1.5; same run: {_fmt_s(of['median_s'])} vs "
                 f"{_fmt_s(hr['median_s'])})")
        for meth, need, label in (("casadi.jac", 4, "CasADi C route"), ("jax.jac", 10, "JAX jit(vmap(jacfwd))"),
                                  ("scipy_fd(esmjac.rhs)", 1000, "SciPy FD (exact sparsity, our RHS)"),
                                  ("scipy_fd(earthsci_ast.rhs)", 1000, "SciPy FD (exact sparsity, earthsci-ast RHS)")):
            pr = self.one(bench="peers", method=meth, lanes=L0)
            if o and pr:
                x = pr["median_s"] / o["median_s"]
                line("T1", x >= need, f"{label} / eval_into = {x:.1f}x (target >= {need}x; "
                     f"{_fmt_s(pr['median_s'])} vs {_fmt_s(o['median_s'])})")
        big = self.find(bench="B5", method="esmjac.eval_into")
        if big:
            b = big[-1]
            ca = self.one(bench="B5", model=b["model"], method="casadi.jac")
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
        t2 = [r for r in self.find(method="esmjac.eval_into", threads=1) if r["bench"] in ("B1", "B2")
              and r.get("t2_ratio")]
        o = o2
        if o:
            rng_ = (min(r["t2_ratio"] for r in t2), max(r["t2_ratio"] for r in t2)) if t2 else (None, None)
            line("T2", o["t2_ratio"] <= 2.0, f"eval_into / rhs = {o['t2_ratio']:.2f} (target <= 2; tropo12, "
                 f"{L0} cells, LaneSparseBlocks float64); over B1/B2 models, sizes, layouts and dtypes "
                 f"{_fmt(rng_[0])} .. {_fmt(rng_[1])}")
        of2 = self.one(bench="B2", model="tropo12", method="esmjac.eval_into" + FUSED, layout="lanesparseblocks",
                       dtype="float64", lanes=L0, threads=1)
        t2f = [r for r in self.find(method="esmjac.eval_into" + FUSED, threads=1) if r["bench"] in ("B1", "B2")]
        if of2:
            line("T2", of2["t2_ratio"] <= 2.0, f"eval_into (keep_slab=False, fused) / rhs = {of2['t2_ratio']:.2f} "
                 f"(tropo12, {L0} cells, LaneSparseBlocks float64); over B1/B2 fused runs "
                 f"{_fmt(min(r['t2_ratio'] for r in t2f))} .. {_fmt(max(r['t2_ratio'] for r in t2f))}")
        bd = self.one(bench="B1", method="esmjac.eval_into", layout="lanesparseblocks", dtype="float64",
                      lanes=L0, threads=1)
        if bd:
            line("T2", bd["t2_ratio"] <= 2.0, f"eval_into / rhs = {bd['t2_ratio']:.2f} (bd_chem, {L0} cells, "
                 "LaneSparseBlocks float64)")
        # T3
        for r3 in self.find(bench="T3", method="esmjac.eval_into") + self.find(bench="T3", method="esmjac.eval_into" + FUSED):
            rr = self.one(bench="T3", model=r3["model"], method="esmjac.rhs", variant=r3.get("variant"))
            default = r3.get("variant") == "default"
            text = (("[keep_slab=False] " if r3["method"].endswith(FUSED) else "") + f"parallel efficiency {r3['efficiency'] * 100:.0f}% (target >= 80%; {r3['model']}, {r3['lanes']} "
                    f"cells, LaneSparseBlocks float64, {r3['threads']} threads [{r3.get('threading_layer')}], speedup "
                    f"{r3['speedup']:.2f}, from the fastest calls {r3['efficiency_of_mins'] * 100:.0f}%; RHS alone "
                    f"{rr['efficiency'] * 100 if rr else float('nan'):.0f}%; load avg at start "
                    f"{self.env.get('load_start')})")
            if not default:
                text = f"[informative: {r3['variant']}] " + text
            line("T3", r3["efficiency"] >= 0.8, text)
        # T4
        t4 = self.find(bench="B4", method="esmjac.apply_transpose")
        if t4:
            worst = max(t4, key=lambda r: r["t4_ratio"])
            detail = ", ".join(f"{r['model']} {r['t4_ratio']:.2f}" for r in t4)
            line("T4", worst["t4_ratio"] <= 1.5, f"apply_transpose / apply = {worst['t4_ratio']:.2f} worst "
                 f"(target <= 1.5; {detail})")
        # T5
        cold = self.find(bench="B5", method="jacobian build cold")
        if cold:
            c = cold[-1]
            line("T5", c["median_s"] < 30.0, f"cold build of {c['model']} ({c['n_species']} species, "
                 f"{c['n_reactions']} reactions) {c['median_s']:.1f} s (target < 30 s; engine {c['engine']})")
            w = self.one(bench="B5", model=c["model"], method="jacobian build warm (new process)")
            wi = self.one(bench="B5", model=c["model"], method="jacobian build warm (same process)")
            if w:
                worst_w = max(r["median_s"] for r in self.find(bench="B5", method="jacobian build warm (new process)"))
                line("T5", worst_w < 1.0, f"warm rebuild (cache hit, new process) {w['median_s']:.2f} s for "
                     f"{c['model']}, worst {worst_w:.2f} s (target well under 1 s); same process "
                     f"{wi['median_s']:.2f} s" if wi else "")
        for series, recs in self._plan_series().items():
            if len(recs) >= 2:
                x = np.log([r["nnz"] for r in recs])
                y = np.log([r["median_s"] for r in recs])
                slope = float(np.polyfit(x, y, 1)[0]) if np.ptp(x) > 0 else float("nan")
                per = ", ".join(f"{r['nnz']}: {r['per_nnz_s'] * 1e9:.0f} ns/nnz" for r in recs)
                line("T5", slope <= 1.15, f"plan build O(nnz), {series}: log-log slope {slope:.2f} "
                     f"(target <= 1.15, i.e. linear; {per})")

    def _plan_series(self) -> dict:
        """Plan-build series for the O(nnz) fit: Csr against cells (tropo12),
        and every layout against mechanism size at fixed cells (B5)."""
        out = {}
        recs = sorted((r for r in self.find(bench="plan", model="tropo12", layout="csr")
                       if not r.get("n_species")), key=lambda r: r["nnz"])
        if len(recs) >= 2:
            out["tropo12 csr against cells"] = recs
        for lay in ("csr", "lanesparseblocks", "laneblocks-natural"):
            recs = sorted([r for r in self.find(bench="plan", layout=lay, lanes=B5_CELLS)
                           if r.get("n_species")], key=lambda r: r["nnz"])
            if len(recs) >= 2:
                out[f"{lay} against mechanism size ({B5_CELLS} cells)"] = recs
        return out

    # ══════════════════════════════════════════════════════════════════════
    #  outputs
    # ══════════════════════════════════════════════════════════════════════
    def to_json(self) -> dict:
        return {"esmjac_bench": 1, "environment": self.env, "records": self.records, "targets": self.targets,
                "skips": self.skips, "errors": self.errors, "wall_s": self.env.get("wall_s")}

    def plots(self, d: pathlib.Path) -> list:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception as exc:                         # noqa: BLE001
            self.skip("plots", f"matplotlib not importable ({exc}); pip install matplotlib")
            return []
        d.mkdir(parents=True, exist_ok=True)
        files = []
        # 1. B2: time per cell against lanes, every method (float64; float32 in the tables)
        fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), sharey=True)
        panels = ({}, {})
        for r in self.records:
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
        b5 = self.find(bench="B5")
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
        plans = self.find(bench="plan")
        if plans:
            fig, ax = plt.subplots(figsize=(8.5, 5))
            series = self._plan_series()
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

    def results_md(self, path: pathlib.Path, plots: list, cmdline: str) -> None:
        e = self.env
        v = e.get("versions", {})
        out = [f"# esmjac benchmark results ({e.get('mode')} run)", "",
               f"Generated by `{cmdline}` on {e.get('date')}; wall time {e.get('wall_s', 0):.0f} s. "
               "Kernel times are warm medians of >= 50 calls (fewer for the finite-difference peers and "
               "end-to-end solves: `n_calls`), one Numba thread unless stated. Every peer was verified "
               "against esmjac's own values before it was timed (`verify` column: max relative error). "
               "Timings on a shared machine are noisy: compare the columns of one run, and mind the load "
               "average.", "", "## Machine", "",
               _md_table(["CPU", "cores", "numba threads", "memory", "load avg start", "load avg end", "platform"],
                         [[e.get("cpu"), e.get("cores"), e.get("numba_threads"), f"{e.get('memory_gib')} GiB",
                           e.get("load_start"), e.get("load_end"), e.get("platform")]]), "",
               "## Versions", "", _md_table(list(v), [list(v.values())]), "",
               "## Targets (docs/design.rst §10)", "", "```"]
        out += [f"{t['target']} {t['status']:4s} {t['text']}" for t in self.targets]
        out += ["```", ""]

        def tbl(title, recs, cols, note=None):
            if not recs:
                return
            out.append(f"## {title}")
            out.append("")
            if note:
                out.append(note)
                out.append("")
            out.append(_md_table([c[0] for c in cols], [[c[1](r) for c in cols] for r in recs]))
            out.append("")

        ms = lambda r: _fmt_s(r.get("median_s"))            # noqa: E731
        pc = lambda r: f"{r['per_lane_s'] * 1e9:.1f}" if r.get("per_lane_s") else "-"   # noqa: E731
        chem = [r for r in self.records if r["bench"] in ("B1", "B2")]
        tbl("B1/B2 chemistry: Jacobian per layout and RHS, same lanes, 1 thread", chem,
            [("bench", lambda r: r["bench"]), ("model", lambda r: r["model"]), ("method", lambda r: r["method"]),
             ("layout", lambda r: r["layout"]), ("dtype", lambda r: r["dtype"]), ("lanes", lambda r: r["lanes"]),
             ("threads", lambda r: r["threads"]), ("median", ms), ("ns/cell", pc),
             ("eval/rhs (T2)", lambda r: _fmt(r.get("t2_ratio"))),
             ("f32 vs f64", lambda r: _fmt(r.get("f32_vs_f64_err")))])
        tbl("T3 parallel efficiency", self.find(bench="T3"),
            [("variant", lambda r: r.get("variant")), ("layer", lambda r: r.get("threading_layer")),
             ("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("lanes", lambda r: r["lanes"]),
             ("threads", lambda r: r["threads"]), ("1 thread", lambda r: _fmt_s(r["t1_s"])), ("all threads", ms),
             ("speedup", lambda r: _fmt(r["speedup"])), ("efficiency", lambda r: f"{r['efficiency'] * 100:.0f}%"),
             ("eff. (fastest calls)", lambda r: f"{r['efficiency_of_mins'] * 100:.0f}%"),
             ("load1", lambda r: r.get("load1"))],
            note="Each variant runs in a fresh process (the threading layer is chosen at the first parallel "
                 "call); 1-thread and all-thread calls are interleaved in 5 rounds. Only `default` counts "
                 "for T3; the others show what the fork/join costs under load.")
        tbl("B3 transport stencils (10^4 cells, global lanes), 1 thread", self.find(bench="B3"),
            [("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("layout", lambda r: r["layout"]),
             ("dtype", lambda r: r["dtype"]), ("unknowns", lambda r: r.get("unknowns")), ("median", ms),
             ("ns/unknown", lambda r: f"{r['per_unknown_s'] * 1e9:.1f}"),
             ("eval/rhs", lambda r: _fmt(r.get("t2_ratio"))),
             ("layouts agree (max abs diff)", lambda r: _fmt(r.get("layouts_max_abs_diff")))])
        tbl("B4 apply and apply_transpose (float64, 1 thread)", self.find(bench="B4"),
            [("model", lambda r: r["model"]), ("method", lambda r: r["method"]), ("layout", lambda r: r["layout"]),
             ("lanes", lambda r: r["lanes"]), ("nnz", lambda r: r["nnz"]), ("median", ms),
             ("eval_into", lambda r: _fmt_s(r["eval_into_s"])), ("transpose/apply (T4)", lambda r: _fmt(r.get("t4_ratio"))),
             ("verify", lambda r: _fmt(r["verify_err"]))])
        tbl("Peers on B2 tropo12 (1 thread)", self.find(bench="peers"),
            [("method", lambda r: r["method"]), ("lanes", lambda r: r["lanes"]), ("median", ms), ("ns/cell", pc),
             ("build", lambda r: _fmt_s(r.get("build_s"))),
             ("ours/peer (T1)", lambda r: _fmt(r.get("t1_ratio"))),
             ("fused/peer", lambda r: _fmt(r.get("t1_ratio_fused"))),
             ("peer/ours", lambda r: _fmt(r.get("peer_over_ours"), 1)),
             ("verify vs eval_into", lambda r: _fmt(r.get("verify_err"))),
             ("verify vs assemble (8 cells)", lambda r: _fmt(r.get("verify_assemble_err")))],
            note="`ours` = `eval_into` on LaneSparseBlocks, float64, same lanes, timed interleaved with the lane "
                 "peers (default workspace; `fused` = `new_workspace(keep_slab=False)`). FD errors are of "
                 "J·diag(u) (log-scaled), the fair yardstick for 2-point differences.")
        b5 = self.find(bench="B5")
        if b5:
            rows = []
            for name in dict.fromkeys(r["model"] for r in b5):
                g = {r["method"]: r for r in b5 if r["model"] == name}
                any_ = next(iter(g.values()))
                gv = lambda k: _fmt_s(g[k]["median_s"]) if k in g else "-"    # noqa: E731
                ev = g.get("esmjac.eval_into")
                ca = g.get("casadi.jac")
                rows.append([name, any_["n_species"], any_["n_reactions"], any_["n_fields"],
                             f"{any_['engine']} ({any_['n_statements']})", gv("load"), gv("calculus"), gv("evaldoc"),
                             gv("codegen"), gv("jacobian build cold"),
                             _fmt_s(g["jacobian build cold"].get("numba_compile_est_s")) if "jacobian build cold" in g else "-",
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
                    _md_table(["model", "species", "reactions", "fields", "engine (stmts)", "load", "calculus", "evaldoc",
                               "codegen", "cold build", "numba (est.)", "warm (new proc.)", "warm (same proc.)",
                               "rhs cold", "eval_into ns/cell", "CasADi ns/cell"], rows), ""]
        tbl("Plan building (T5)", sorted(self.find(bench="plan"), key=lambda r: (r["layout"], r["nnz"])),
            [("model", lambda r: r["model"]), ("layout", lambda r: r["layout"]), ("lanes", lambda r: r["lanes"]),
             ("nnz/slots", lambda r: r["nnz"]), ("time", ms), ("ns per nnz", lambda r: f"{r['per_nnz_s'] * 1e9:.0f}")])
        tbl(f"End to end: tropo12 on {E2E_CELLS} cells, 0..{E2E_T_END / 3600:.0f} h, rtol {E2E_RTOL}, "
            f"atol {E2E_ATOL}", self.find(bench="e2e"),
            [("method", lambda r: r["method"]), ("wall (median)", ms), ("runs", lambda r: r["n_calls"]),
             ("steps", lambda r: r.get("nsteps")), ("nfev", lambda r: r.get("nfev")),
             ("njev", lambda r: r.get("njev")), ("LU / lin. iters", lambda r: r.get("nlu", r.get("nlin"))),
             ("err vs reference (tol units)", lambda r: _fmt(r.get("err_vs_ref"))),
             ("max rel err (y_ref > 1e3)", lambda r: _fmt(r.get("rel_err_vs_ref")))],
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
        if self.skips:
            out += ["## Not measured", ""] + [f"- {s['what']}: {s['why']}" for s in self.skips] + [""]
        if self.errors:
            out += ["## Errors", ""] + [f"- {x['what']}: {x['error']}" for x in self.errors] + [""]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(out) + "\n")


def _child_main(spec_json: str) -> int:
    """One B5 build measurement in a fresh process (see :meth:`Bench.build`)."""
    warnings.filterwarnings("ignore")
    spec = json.loads(spec_json)
    path, mode = spec["doc"], spec["mode"]
    res: dict = {"mode": mode}
    # Imports a long-running process has done once are not build cost.
    t0 = time.perf_counter()
    import earthsci_ast  # noqa: F401
    import numba  # noqa: F401

    from esmjac.calculus import bandset
    from esmjac.compile import evaldoc
    from esmjac.model import load
    from esmjac.runtime import programs as program  # noqa: F401
    from esmjac.compile import codegen
    from esmjac.compile import tape  # noqa: F401
    res["import_s"] = time.perf_counter() - t0
    if mode == "t3":
        import numba

        from esmjac.layouts.types import LaneSparseBlocks
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        r = RhsProgram.build(path)
        j = JacobianProgram.build(path)
        u, f = _point(r, 1)
        p = r.p0
        plan = j.plan(LaneSparseBlocks(), source=r)
        ws = j.new_workspace()
        o = np.zeros(plan.out_size(j.cells))
        out = np.empty_like(u)
        sc = r.new_buffers()
        NT, calls = int(spec["threads"]), int(spec["calls"])
        fns = {"eval": lambda: j.eval_into(plan, u, p, 0.0, f, o, ws),
               "rhs": lambda: r.eval_into(u, p, 0.0, f, out, sc)}
        wsf = _fused_workspace(j, plan)
        if wsf is not None:
            of = np.zeros_like(o)
            fns["eval_fused"] = lambda: j.eval_into(plan, u, p, 0.0, f, of, wsf)
        ts: dict = {k: {1: [], NT: []} for k in fns}
        rounds = 5
        for _ in range(rounds):             # interleaved rounds: load changes hit both counts
            for nt in (1, NT):
                numba.set_num_threads(nt)
                for k, fn in fns.items():
                    fn()
                    fn()
                    for _ in range(calls // rounds):
                        t0 = time.perf_counter()
                        fn()
                        ts[k][nt].append(time.perf_counter() - t0)
        res["layer"] = numba.threading_layer()
        res["calls"] = calls // rounds * rounds
        for k in fns:
            res[k] = {str(nt): statistics.median(v) for nt, v in ts[k].items()}
            res[k + "_min"] = {str(nt): min(v) for nt, v in ts[k].items()}
    elif mode == "stages":
        from esmjac.model.deep import run_deep
        from esmjac.calculus.bandset import BandSet, check_options
        from esmjac.compile.evaldoc import jacobian_doc, model_layout, rhs_doc
        from esmjac.model.load import load_view
        from esmjac.runtime.programs import PROGRAM_OPTIONS, _compile
        t0 = time.perf_counter()
        view = run_deep(load_view, path, None)
        t1 = time.perf_counter()
        bs = BandSet.build(view, wrt="states")
        t2 = time.perf_counter()
        lay = model_layout(view)
        rdoc = rhs_doc(view, lay)
        jdoc = jacobian_doc(bs, lay, rdoc.kind)
        t3 = time.perf_counter()
        kern = _compile(jdoc, check_options({}, PROGRAM_OPTIONS))
        t4 = time.perf_counter()
        res.update(load_s=t1 - t0, calculus_s=t2 - t1, evaldoc_s=t3 - t2, codegen_s=t4 - t3,
                   engine=kern.engine, n_statements=kern.n_statements, n_fields=len(jdoc.fields),
                   n_bands=len(bs.entries))
    else:
        import numba

        from esmjac.layouts.types import Csr, LaneBlocks, LaneSparseBlocks
        from esmjac.runtime.programs import JacobianProgram, RhsProgram
        j = JacobianProgram.build(path)
        res["jac_build_s"] = j.build_seconds
        if mode == "warm":
            res["jac_rebuild_inproc_s"] = JacobianProgram.build(path).build_seconds
        r = None
        if spec.get("rhs", True):
            r = RhsProgram.build(path)
            res["rhs_build_s"] = r.build_seconds
            res["rhs_engine"] = r.kernel.engine
            res["rhs_statements"] = r.kernel.n_statements
            res["rhs_chunks"] = len(r.kernel.chunks)
        if mode == "warm":
            plans = {}
            pl = {}
            for lay in (LaneSparseBlocks(), LaneBlocks(), Csr()):
                ts = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    plan = j.plan(lay, source=r)
                    ts.append(time.perf_counter() - t0)
                    if ts[-1] > 2.0:
                        break
                pl[lay.name] = plan
                nnz = int(plan.info["nnz"]) if "nnz" in plan.info else plan.out_size(j.cells)
                plans[lay.name] = (statistics.median(ts), nnz)
            res["plans"] = plans
            numba.set_num_threads(1)
            L = j.cells
            u, f = _point(j, 1)
            p = j.p0
            plan = pl["lanesparseblocks"]
            ws = j.new_workspace()
            o = np.zeros(plan.out_size(L))
            j.eval_into(plan, u, p, 0.0, f, o, ws)
            med, mn, k = _time(lambda: j.eval_into(plan, u, p, 0.0, f, o, ws), int(spec.get("calls", 50)))
            res["eval"] = {"median_s": med, "min_s": mn, "n_calls": k}
            if spec.get("casadi"):
                try:
                    import peers as pe
                    buf = io.StringIO()
                    with contextlib.redirect_stdout(buf):
                        cp = pe.casadi_peer(path, L=L)
                    if cp is None:
                        res["casadi"] = {"error": buf.getvalue().strip() or "casadi not importable"}
                    else:
                        if list(cp.model.species) != list(j.layout.states) or \
                                list(cp.model.params) != list(j.layout.params):
                            raise AssertionError("the CasADi peer's species/parameter order differs from esmjac's")
                        wc = j.new_workspace()
                        oc = np.zeros(pl["csr"].out_size(L))
                        j.eval_into(pl["csr"], u, p, 0.0, f, oc, wc)
                        M = _csr_of(pl["csr"], oc)
                        n = j.n_species
                        fe = f if f is not None else np.empty(0)
                        oj = np.empty(cp.nnz * L)
                        cp.jac(u, p, fe, oj, L)
                        ours_pat = _block_pattern_from_csr(pl["csr"], n, L)
                        union = sorted(set(ours_pat) | set(cp.pattern))
                        pos = {rc: q for q, rc in enumerate(cp.pattern)}
                        A = np.zeros((len(union), L))
                        V = oj.reshape(cp.nnz, L)
                        for q, rc in enumerate(union):
                            if rc in pos:
                                A[q] = V[pos[rc]]
                        err = _lane_err(A, _lane_values(M, union, L), union, n, 1e-8)
                        if not err <= 1e-10:
                            raise AssertionError(f"CasADi differs from eval_into: {err:.3e}")
                        med, mn, k = _time(lambda: cp.jac(u, p, fe, oj, L), int(spec.get("calls", 50)))
                        res["casadi"] = {"median_s": med, "min_s": mn, "n_calls": k, "build_s": cp.build_s,
                                         "verify_err": err, "route": cp.info.get("route")}
                except Exception as exc:                 # noqa: BLE001
                    res["casadi"] = {"error": f"{type(exc).__name__}: {exc}"}
    print(MARK + json.dumps(res), flush=True)
    return 0


def run(quick: bool = False, json_path=None, plots_dir=None, results_path=None, *, bench_dir=None,
        fixtures=None, only=None, cmdline: str | None = None) -> int:
    """Run the suite; returns 0, or 1 when a section or a verification failed."""
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    b = Bench(quick=quick, bench_dir=bench_dir, fixtures=fixtures, only=only)
    t0 = time.perf_counter()
    b.log(f"esmjac bench ({b.mode})")
    b.environment()
    try:
        b.section("chem", b.chem)
        b.section("transport", b.transport)
        b.section("apply", b.apply)
        b.section("peers", b.peers_section)
        b.section("build", b.build)
        b.section("e2e", b.e2e)
        b.env["load_end"] = _load()
        b.env["wall_s"] = time.perf_counter() - t0
        b.evaluate_targets()
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
        plots = b.plots(pathlib.Path(plots_dir)) if plots_dir else []
        b.env["wall_s"] = time.perf_counter() - t0
        if json_path:
            pathlib.Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            pathlib.Path(json_path).write_text(json.dumps(b.to_json(), indent=1, default=str) + "\n")
            b.log(f"wrote {json_path}")
        if results_path:
            b.results_md(pathlib.Path(results_path), plots, cmdline or "esmjac bench")
            b.log(f"wrote {results_path}")
        for p in plots:
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
    ap.add_argument("--bench-dir", default=None, help="folder with peers.py and mechanism.py (default: "
                    "benchmarks/ of the source tree, or $ESMJAC_BENCH_DIR)")
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
    return run(args.quick, args.json, args.plots, args.results, bench_dir=args.bench_dir,
               fixtures=args.fixtures, only=only, cmdline=cmdline)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/run.py", description="esmjac benchmark suite (docs/design.rst §10)")
    add_arguments(ap)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    return run_args(args, "python benchmarks/run.py " + " ".join(argv))


if __name__ == "__main__":                                # pragma: no cover
    sys.exit(main())
