"""Time the symbolic half of esmjac on mass-action mechanisms.

For synthetic mechanisms of growing size (see ``mechanism.py``) and for the
bundled ``tropo12`` model, measure

* ``build``: ``BandSet.build(doc)`` — load, differentiate, classify;
* ``emit``:  ``bs.block_json()`` — the emitted block (template CSE and
  factorization included);
* ``emit-noCSE``: the same block with ``cse=False`` (isolates the CSE cost);

and print the median over repeats with seconds per band, to show how each
stage scales with the mechanism's size. The number of cells does not change
the symbolic work (bands are per-cell templates), so every case uses 8.

    python benchmarks/bench_calculus.py            # full run (~2-3 min, 2 cores)
    python benchmarks/bench_calculus.py --quick    # smoke run (< 30 s)

Repeats are adaptive: up to ``--repeats`` (3), but a case whose first run
already exceeds ``--budget`` seconds is measured once (the largest case's CSE
emission alone takes over a minute here).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import statistics
import sys
import time
import warnings

from esmjac.models.mechanism import synthetic_mechanism

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent

FULL_SIZES = [(20, 50), (75, 200), (150, 400), (300, 800)]
QUICK_SIZES = [(10, 25), (20, 50), (40, 100)]
N_CELLS = 8


def _time(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def measure(doc, repeats: int, budget: float, no_cse: bool) -> dict:
    from esmjac.calculus.bandset import BandSet
    text = json.dumps(doc)        # build from JSON text, as a user would pass a file
    builds, emits, plains = [], [], []
    n_bands = None
    for r in range(repeats):
        tb, bs = _time(lambda: BandSet.build(text))
        te, _ = _time(bs.block_json)
        builds.append(tb)
        emits.append(te)
        if no_cse:
            plain = dataclasses.replace(bs, options={**bs.options, "cse": False})
            tp, _ = _time(plain.block_json)
            plains.append(tp)
        n_bands = len(bs.entries)
        if r == 0 and tb + te > budget:
            break
    return {"bands": n_bands, "build": statistics.median(builds), "emit": statistics.median(emits),
            "plain": statistics.median(plains) if plains else float("nan"), "n": len(builds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes only (< 30 s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--budget", type=float, default=15.0,
                    help="a case whose first run takes longer than this is run once")
    ap.add_argument("--no-plain", action="store_true", help="skip the cse=False emission column")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")

    from esmjac.calculus.bandset import BandSet
    BandSet.build(synthetic_mechanism(4, 6, 2, seed=99))           # warm-up (imports, first-call costs)

    cases = []
    tropo = ROOT / "examples" / "tropo12.esm"
    if tropo.exists():
        doc = json.loads(tropo.read_text())
        vs = doc["models"]["Chem"]["variables"]
        n_sp = sum(v["type"] == "unknown" for v in vs.values())
        n_rx = doc["metadata"]["description"].count(" | ") + 1 if "Reactions:" in doc["metadata"]["description"] else -1
        cases.append(("tropo12", n_sp, n_rx, doc))
    for ns, nr in (QUICK_SIZES if args.quick else FULL_SIZES):
        t0 = time.perf_counter()
        doc = synthetic_mechanism(ns, nr, N_CELLS, seed=args.seed)
        gen = time.perf_counter() - t0
        cases.append((f"synthetic (gen {gen * 1e3:.0f} ms)", ns, nr, doc))

    hdr = (f"{'case':<24} {'species':>7} {'rx':>5} {'bands':>6} {'build s':>9} {'emit s':>9} "
           f"{'emit-noCSE s':>12} {'ms/band build':>13} {'ms/band emit':>12} {'reps':>4}")
    print(hdr)
    print("-" * len(hdr))
    t_all = time.perf_counter()
    rows = []
    for name, ns, nr, doc in cases:
        m = measure(doc, args.repeats, args.budget, not args.no_plain)
        b = max(m["bands"], 1)
        rows.append((ns, nr, m))
        print(f"{name:<24} {ns:>7} {nr:>5} {m['bands']:>6} {m['build']:>9.3f} {m['emit']:>9.3f} "
              f"{m['plain']:>12.3f} {1e3 * m['build'] / b:>13.3f} {1e3 * m['emit'] / b:>12.3f} "
              f"{m['n']:>4}", flush=True)
    synth = rows[1:] if tropo.exists() else rows
    if len(synth) >= 2:
        (_, _, a), (_, _, z) = synth[0], synth[-1]
        grow = z["bands"] / a["bands"]
        print(f"\nbands grew x{grow:.1f} from the smallest to the largest synthetic case; "
              f"build time x{z['build'] / a['build']:.1f}, emit x{z['emit'] / a['emit']:.1f}, "
              f"emit without CSE x{z['plain'] / a['plain']:.1f} "
              f"(linear scaling would grow by the same factor as the bands).")
    print(f"total {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
