"""Instructions and simulated cache misses per call of the mass-action
kernel (esmjac.compile.massaction.run_poly) on the leaf's hoisted GEOS-Chem
fullchem bodies: counts that do not depend on the machine's load.

    python benchmarks/poly_counts.py [--mech PATH] [--lanes 64] [--calls 200] [--jac-blocks 32] [--out F]

On the shared 2-core VM of issue #25 the same operations compiled in two
modules timed 0.69-1.38x each other at load 5-7 (2026-12-02): a 10-25 %
change to the kernel cannot be timed there. This counts instead, under
valgrind's callgrind with a simulated 512 kB 8-way last level (the VM's L2
per core): per call, instructions (Ir), data reads and writes (Dr, Dw), L1
and L2 misses (D1mr, D1mw, DLmr, DLmw). One valgrind run per phase: the
set-up and one warm-up call of every phase, then ``--calls`` calls of its
own phase made inside a ctypes callback, and callgrind collects only while
that callback runs (``--collect-atstart=no --toggle-collect=closure_fcn``,
CPython's ctypes callback entry). The figures are therefore the calls'
alone, Python's call and Numba's dispatch included (a few thousand
instructions). Until 2026-12-02 the tool subtracted a run with no calls
instead: the set-up differs between runs by tens of millions of
instructions, so the same RHS code read 308k, 360k and 403k instructions
per call in three runs; collected this way it reads the same to 0.4 %.

The inputs are built natively first (the leaf and its lane prologue, as
``lanepoly_micro.py``), and the kernel is compiled natively for the host's
CPU name and features, which the runs under valgrind then name too
(``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES``): valgrind reports another CPU,
and the kernel would otherwise compile again under it (tens of minutes).
Needs ``valgrind`` on PATH; ≈ 2 minutes per phase.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent)) if __name__ == "__main__" else None  # noqa: E702

ARRAYS = ("fptr", "fkind", "fidx", "optr", "omono", "ocoef", "targets")


def _inputs(mech: str, L: int, path: Path) -> None:
    """The leaf's hoisted bodies and inputs on ``L`` lanes, saved to ``path``."""
    from lanepoly_micro import hoisted_inputs
    from realworkload import box_doc

    from esmjac.compile.massaction import expand
    from esmjac.compile.polyroute import tape_ssa
    got = hoisted_inputs(box_doc(mech), L)
    if got is None:
        raise SystemExit("poly_counts: the leaf's programs are not taped (nothing hoisted)")
    leaf, hz, ft, u, fz, hr, hj, _ = got
    d = dict(u=u, fz=fz, hr=hr, hj=hj, p=leaf.p, L=L, P=int(leaf.plan.info["slots_per_lane"]),
             W=int(leaf.plan.tile_width(L)), C=int(leaf.plan.capacity(L)), zs=ft.zero_slots)
    for name, cut in (("r", hz.rhs), ("j", hz.jac)):
        ins, stores = tape_ssa(cut.body)
        pb = expand(ins, stores, cut.scheduled.code.shape[0])
        if pb is None:
            raise SystemExit(f"poly_counts: the {name} body is not a polynomial in the state")
        for k, a in zip(ARRAYS, pb.arrays()):
            d[name + k] = a
    np.savez(path, **d)


def _phases(path: Path, jac_blocks: list[int]) -> dict:
    """Phase name -> a no-argument call of run_poly on the saved inputs (as
    the leaf binds them: :mod:`esmjac.integrators.bound`)."""
    from esmjac.compile.engine import NO_SLOTS
    from esmjac.compile.massaction import UNTILED_BLOCK, PolyBody, run_poly, scratch_size
    d = np.load(path)
    L, P, W, C = (int(d[k]) for k in ("L", "P", "W", "C"))
    ra, ja = (tuple(d[n + k] for k in ARRAYS) for n in "rj")
    u, fz, hr, hj, p, zs = d["u"], d["fz"], d["hr"], d["hj"], d["p"], d["zs"]
    sc = np.empty(max(scratch_size(PolyBody(*ja), W, max(jac_blocks)),
                      scratch_size(PolyBody(*ra), 0, UNTILED_BLOCK)))
    ro, jo = np.zeros(ra[6].size * L), np.zeros(P * C)
    fns = {f"rhs B={UNTILED_BLOCK}": lambda: run_poly(*ra, u, fz, hr, p, ro, L, 0, 0, L, NO_SLOTS, UNTILED_BLOCK, sc)}
    for B in jac_blocks:
        fns[f"jacobian B={B}"] = lambda B=B: run_poly(*ja, u, fz, hj, p, jo, L, W, P, C, zs, B, sc)
    return fns


def _child(path: Path, jac_blocks: list[int], phase: int, calls: int) -> None:
    """Set-up, one warm-up call of every phase, then ``calls`` of phase
    number ``phase`` inside a ctypes callback (what callgrind collects)."""
    import ctypes
    fns = list(_phases(path, jac_blocks).values())
    for f in fns:
        f()
    one = fns[phase]

    def counted() -> None:
        for _ in range(calls):
            one()
    ctypes.CFUNCTYPE(None)(counted)()


def _counts(out: Path) -> dict:
    """Event -> count of a callgrind output file."""
    txt = out.read_text(errors="replace")
    ev = re.search(r"^events: (.*)$", txt, re.M)
    tot = re.search(r"^(?:summary|totals): (.*)$", txt, re.M)
    if ev is None or tot is None:
        raise SystemExit(f"poly_counts: no counts in {out}")
    return dict(zip(ev.group(1).split(), (int(x) for x in tot.group(1).split())))


def main(argv=None):
    from realworkload import DEFAULT_MECH, emit_json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mech", default=os.environ.get("ESMJAC_GC_MECH", DEFAULT_MECH))
    ap.add_argument("--lanes", type=int, default=64)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--jac-blocks", default="32")
    ap.add_argument("--out", default="")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("--phase", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    blocks = [int(x) for x in a.jac_blocks.split(",")]
    if a.child:
        _child(Path(a.child), blocks, a.phase, a.calls)
        return 0
    if not Path(a.mech).exists():
        print(f"poly_counts: skipped — no mechanism at {a.mech}", file=sys.stderr)
        return 0
    import llvmlite.binding as llb
    env = dict(os.environ, NUMBA_CPU_NAME=llb.get_host_cpu_name(),
               NUMBA_CPU_FEATURES=llb.get_host_cpu_features().flatten(),
               PYTHONHASHSEED="0")      # the same set-up in every run (hash order changes import work)
    res: dict = {"mech": a.mech, "lanes": a.lanes, "calls": a.calls, "load_start": round(os.getloadavg()[0], 2),
                 "last_level": "512 kB, 8-way, 64 B lines (simulated)", "per_call": {}}
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "inputs.npz"
        _inputs(a.mech, a.lanes, data)
        names = list(_phases(data, blocks))
        me = [sys.executable, str(Path(__file__).resolve()), "--jac-blocks", a.jac_blocks, "--child", str(data)]
        subprocess.run(me + ["--calls", "0"], env=env, check=True)      # compiled natively for the named CPU

        def counted(phase: int, calls: int) -> dict:
            out = Path(tmp) / f"cg.{phase}.{calls}"
            subprocess.run(["valgrind", "--tool=callgrind", "--cache-sim=yes", "--LL=524288,8,64",
                            "--collect-atstart=no", "--toggle-collect=closure_fcn",
                            f"--callgrind-out-file={out}"] + me + ["--phase", str(phase), "--calls", str(calls)],
                           env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            c = _counts(out)
            if c.get("Ir", 0) < calls:
                raise SystemExit("poly_counts: nothing collected inside the calls (no ctypes closure_fcn symbol?)")
            return c
        for k, name in enumerate(names):
            c = counted(k, a.calls)
            res["per_call"][name] = {e: round(v / a.calls) for e, v in c.items()}
            print(name, json.dumps(res["per_call"][name]), file=sys.stderr, flush=True)
    res["load_end"] = round(os.getloadavg()[0], 2)
    return emit_json(res, a.out)


if __name__ == "__main__":
    sys.exit(main())
