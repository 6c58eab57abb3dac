"""Shared pieces of the benchmark suite: sizes, timing (CPU time per call,
interleaved), verification helpers, formatting, and the Bench record of one
run.
"""
from __future__ import annotations

import datetime
import importlib.metadata
import importlib.resources
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np


import peers  # noqa: E402  (a sibling module: benchmarks/ is the script folder)
from esmjac.models import mechanism  # noqa: E402


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

def dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mem_gib() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_avg() -> list:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def time_calls(fn, n: int, warmup: int = 2) -> tuple:
    """(median, min, n) wall seconds of ``fn()`` over ``n`` timed calls."""
    med, mn = peers.median_time(fn, n, warmup, with_min=True)
    return med, mn, n


def time_many(fns: dict, n: int, rounds: int = 5, warmup: int = 2) -> dict:
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


def resize_set(doc: dict, sizes: dict) -> dict:
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


def point(prog, seed: int):
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


def fused_workspace(j, plan):
    """A ``keep_slab=False`` workspace when the program writes this plan's
    slots directly (lane plans of generated kernels), else None."""
    if plan.kind != "lane" or j.kernel.engine != "codegen":
        return None
    try:
        return j.new_workspace(keep_slab=False)
    except TypeError:                       # an esmjac without fused kernels
        return None


def csr_of(plan, out):
    from scipy.sparse import csr_array
    return csr_array((np.asarray(out, dtype=np.float64), np.asarray(plan.indices), np.asarray(plan.indptr)),
                     shape=tuple(plan.info["shape"]))


def block_pattern_from_csr(plan, n: int, L: int) -> list:
    """(row, col) species pairs of the per-cell block, read from cell 0 of a
    cell program's Csr plan."""
    ip, ix = np.asarray(plan.indptr), np.asarray(plan.indices)
    pat = []
    for r in range(n):
        for c in ix[ip[r * L]:ip[r * L + 1]]:
            pat.append((r, int(c) // L))
    return sorted(pat)


def lane_values(M, pattern, L: int) -> np.ndarray:
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


def lane_err(A, R, pattern, n: int, floor: float, scale=None) -> float:
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


def rel_err(a, b, floor: float = 1e-12) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if b.size == 0:
        return 0.0
    scale = np.abs(b).max()
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), floor * scale + 1e-300)))


def fmt_s(s) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} µs"


def fmt(x, nd=2) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
            return f"{x:.2e}"
        return f"{x:.{nd}f}"
    return str(x)


def md_table(headers, rows) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(out)


def find_dir(explicit, env: str, candidates, marker: str):
    for c in ([explicit] if explicit else []) + ([os.environ[env]] if os.environ.get(env) else []) + candidates:
        p = pathlib.Path(c)
        if (p / marker).exists():
            return p.resolve()
    return None

class Bench:
    """One benchmark run: the records, skips, errors and targets, and the
    programs built for it. The sections (chem, transport, apply, peers,
    build, e2e) are functions of a Bench in their own modules."""

    def __init__(self, quick: bool = False, fixtures=None, only=None, out=None):
        self.quick = bool(quick)
        self.mode = "quick" if quick else "full"
        self.out = out or sys.stdout
        root = HERE.parent
        self.bench_dir = HERE
        self.fixtures = find_dir(fixtures, "ESMJAC_FIXTURES",
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
        self.peers, self.mech = peers, mechanism

    def log(self, msg: str = "") -> None:
        print(msg, file=self.out, flush=True)

    def add(self, bench, model, method, layout, dtype, lanes, threads, median_s, **extra) -> dict:
        rec = {"bench": bench, "model": model, "method": method, "layout": layout,
               "dtype": dtype, "lanes": lanes, "threads": threads, "median_s": median_s}
        rec.update(extra)
        if median_s is not None and lanes and "per_lane_s" not in rec:
            rec["per_lane_s"] = median_s / lanes
        rec["load1"] = (load_avg() or [None])[0]
        self.records.append(rec)
        bits = [f"{k}={fmt(v, 3)}" for k, v in extra.items()
                if k.endswith(("ratio", "err", "efficiency", "speedup", "over_ours")) and v is not None]
        self.log(f"  {bench:5s} {model:14s} {method:30s} {str(layout):20s} {str(dtype):8s} "
                 f"L={lanes!s:7s} thr={threads!s:2s} {fmt_s(median_s):>12s}"
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
        self.log(f"\n== {name} == (load {load_avg()}, {time.perf_counter() - self.t_start:.0f} s into the run)")
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except Exception as exc:                       # noqa: BLE001 - report, keep measuring
            self.error(f"section {name}", exc)
        self.log(f"   ({name}: {time.perf_counter() - t0:.1f} s)")

    def environment(self) -> None:
        import numba
        from esmjac import __version__
        self.env = {
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "mode": self.mode,
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "numba_threads": int(numba.config.NUMBA_NUM_THREADS),
            "memory_gib": mem_gib(),
            "platform": platform.platform(),
            "load_start": load_avg(),
            "versions": {
                "python": platform.python_version(),
                "numpy": np.__version__,
                "numba": numba.__version__,
                "scipy": dist_version("scipy"),
                "sympy": dist_version("sympy"),
                "earthsci-ast": dist_version("earthsci-ast"),
                "esmjac": __version__,
                "jax": dist_version("jax"),
                "casadi": dist_version("casadi"),
                "scikits.odes": dist_version("scikits.odes"),
                "matplotlib": dist_version("matplotlib"),
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
            return resize_set(json.loads(TROPO12.read_text()), {"cell": N})
        if model == "bd_chem":
            return resize_set(json.loads((self.fixtures / "bd_chem.esm").read_text()), {"z": N})
        raise ValueError(model)

    def _child(self, spec: dict, cache, extra_env=None) -> dict:
        env = dict(os.environ)
        if cache is not None:
            env["ESMJAC_CACHE_DIR"] = str(cache)
        env.update(extra_env or {})
        code = "import sys, child; sys.exit(child.main(sys.argv[1]))"  # run with cwd=benchmarks/
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



def casadi_vs_csr(cp, j, csr_plan, u, p, f, L: int) -> tuple:
    """``(err, M, oj)``: the max relative error of the CasADi peer ``cp``'s Jacobian against
    esmjac's ``eval_into`` into ``csr_plan`` (a Csr plan of ``j``) at
    (u, p, f) on ``L`` lanes, over the union of both patterns: the check
    every CasADi route passes before it is timed. Refuses a peer whose
    species/parameter order differs from esmjac's. ``M``: esmjac's matrix;
    ``oj``: the peer's output buffer (reused by the timing loops)."""
    if list(cp.model.species) != list(j.layout.states) or list(cp.model.params) != list(j.layout.params):
        raise AssertionError("the CasADi peer's species/parameter order differs from esmjac's")
    oc = np.zeros(csr_plan.out_size(L))
    j.eval_into(csr_plan, u, p, 0.0, f, oc, j.new_workspace(L))
    M = csr_of(csr_plan, oc)
    oj = np.empty(cp.nnz * L)
    cp.jac(u, p, f if f is not None else np.empty(0), oj, L)
    union = sorted(set(block_pattern_from_csr(csr_plan, j.n_species, L)) | set(cp.pattern))
    pos = {rc: q for q, rc in enumerate(cp.pattern)}
    A = np.zeros((len(union), L))
    V = oj.reshape(cp.nnz, L)
    for q, rc in enumerate(union):
        if rc in pos:
            A[q] = V[pos[rc]]
    return lane_err(A, lane_values(M, union, L), union, j.n_species, 1e-8), M, oj
