"""Build time of a large mechanism (issue #22, DESIGN §10 P5/T5): cold and warm
builds in fresh processes, with the phase breakdown.

    python benchmarks/buildtime.py [--mech PATH] [--cells 1,64] [--routes box,cell,leaf,check]
                                   [--out buildtime.json]

``--mech`` (or ``$ESMJAC_GC_MECH``; default ``geoschem_fullchem_v1.esm`` in the current folder)
is a box ``models`` document (e.g. the GEOS-Chem fullchem conversion of
benchmarks/gcmech.py; never vendored); absent, the benchmark says so and
exits 0.

Routes, each measured cold (empty ``ESMJAC_CACHE_DIR`` and
``NUMBA_CACHE_DIR``) and then warm (the same folders, a new process):

* ``box``: ``RhsProgram.build`` + ``JacobianProgram.build`` of the file;
* ``cell``: the same for the document lifted to ``--cells`` cells
  (:func:`esmjac.models.mechanism.lift`, the per-cell parameters of
  benchmarks/realworkload.py), the first cell count cold, the others warm
  from its cache (one entry for every cell count);
* ``leaf``: ``rosenbrock(...)`` of the document lifted to one cell, as
  benchmarks/realworkload.py's published route builds it (the cell
  programs, the lane hoist, the leaf's own kernels and its warm advances),
  cold then warm;
* ``check``: ``esmjac check FILE`` (load, calculus, the oracle and the
  finite differences through earthsci-ast).
* ``schema``: earthsci-ast's JSON-schema pass over the document, alone;
* ``venv``: a warm box build from a copy of the esmjac package at another
  path (another install of the same version): it must load, not rebuild.

CPU seconds are ``time.process_time`` of the child (every thread: the
document is loaded on a helper thread with a large stack), wall seconds
beside them, the load average before and after. Phases are measured by
wrapping the build's steps in the child (nothing in esmjac changes):
``load`` (earthsci-ast's parse, schema validation and flatten, and
esmjac's view; the schema pass alone is the route ``schema``), ``calculus`` (the bands),
``evaldoc`` (RHS and Jacobian documents), ``codegen`` (SSA, tape or
source), ``numba`` (the warm-up calls: compiling or loading kernels),
``cache`` (product store and load); the leaf adds ``leaf.hoist`` (cutting
the tapes at the state), ``leaf.direct`` (the Jacobian's direct-store tape
or kernel), ``leaf.warm`` (its discarded advances: the stepper kernels
compiled or loaded); ``other`` is the rest.
Every build's values are checked: the warm and cold programs agree
bit for bit at the document's state (the values' oracle is tests, not here).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MECH = "geoschem_fullchem_v1.esm"    # in the current folder: no machine's path
_HERE = Path(__file__).resolve().parent


# ---------------------------------------------------------------- child side

def _timers():
    """Wrap the build's phases; return the accumulator ``{phase: cpu_s}``."""
    import esmjac.runtime.programs as P
    import esmjac.runtime.stored as S
    from esmjac.calculus.bandset import BandSet

    acc: dict = {}
    depth = {"n": 0}

    def wrap(name, fn):
        def inner(*a, **k):
            outer = depth["n"] == 0
            depth["n"] += 1
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                depth["n"] -= 1
                dt = time.process_time() - t0
                acc[name] = acc.get(name, 0.0) + dt
                if outer:
                    acc["_outer"] = acc.get("_outer", 0.0) + dt
        return inner

    def wrap_inner(name, fn):          # counted inside another phase
        def inner(*a, **k):
            t0 = time.process_time()
            try:
                return fn(*a, **k)
            finally:
                acc[name] = acc.get(name, 0.0) + time.process_time() - t0
        return inner

    P.load_view = wrap("load", P.load_view)
    P.rhs_doc = wrap("evaldoc", P.rhs_doc)
    P.jacobian_doc = wrap("evaldoc", P.jacobian_doc)
    P.compile_doc = wrap("codegen", P.compile_doc)
    S.compile_doc = wrap("codegen", S.compile_doc)
    P._Base._warm = wrap("numba", P._Base._warm)
    S.store_product = wrap("cache", S.store_product)
    S.load_product = wrap("cache", S.load_product)
    S.read_product = wrap("cache", S.read_product)
    bs_build = BandSet.build.__func__
    BandSet.build = classmethod(wrap("calculus", bs_build))
    import esmjac.integrators.bound as IB
    import esmjac.integrators.leaf as IL
    IB.LaneHoist.__init__ = wrap("leaf.hoist", IB.LaneHoist.__init__)
    IL.RosenbrockLeaf._warm = wrap("leaf.warm", IL.RosenbrockLeaf._warm)
    P.JacobianProgram.direct_tape = wrap("leaf.direct", P.JacobianProgram.direct_tape)
    P.JacobianProgram.direct_kernel = wrap("leaf.direct", P.JacobianProgram.direct_kernel)

    import earthsci_ast
    earthsci_ast.flatten = wrap_inner("load.flatten", earthsci_ast.flatten)
    # Numba specializations (compiled, or loaded from its cache) by function,
    # counted inside the phases above: which kernels a phase's time is
    from numba.core.dispatcher import Dispatcher
    real_compile = Dispatcher._compile_for_args

    def compile_for_args(self, *a, **k):
        t0 = time.process_time()
        try:
            return real_compile(self, *a, **k)
        finally:
            key = "jit." + getattr(self, "py_func", self).__qualname__
            acc[key] = acc.get(key, 0.0) + time.process_time() - t0
    Dispatcher._compile_for_args = compile_for_args
    return acc


def _child(spec: dict) -> dict:
    import warnings
    warnings.filterwarnings("ignore")
    t0 = time.process_time()
    w0 = time.perf_counter()
    import numpy as np

    import esmjac  # noqa: F401
    from esmjac.runtime.programs import JacobianProgram, RhsProgram
    res: dict = {"import_cpu_s": time.process_time() - t0}
    acc = _timers()
    route = spec["route"]
    opts = {"progress": False}
    if route == "schema":
        # earthsci-ast's JSON-schema pass alone, on the document as it
        # validates it (measured apart: wrapping the validator's recursion
        # would inflate it)
        import earthsci_ast.parse as eap
        import jsonschema
        data = json.loads(Path(spec["mech"]).read_text())
        eap.prepare_document_ops(data)
        schema = eap._get_schema()
        c0, w1 = time.process_time(), time.perf_counter()
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data))
        res.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - w1, errors=len(errors))
    elif route == "check":
        from esmjac.reference.check import fd_check
        c0, w1 = time.process_time(), time.perf_counter()
        rep = fd_check(spec["mech"])
        res.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - w1, ok=bool(rep.ok),
                   compared=int(rep.compared), nonfinite=len(rep.nonfinite))
    elif route == "leaf":
        sys.path.insert(0, str(_HERE))
        from realworkload import box_doc, lifted

        from esmjac.adapters.native import rosenbrock
        src = lifted(box_doc(spec["mech"]), 1)
        c0, w1 = time.process_time(), time.perf_counter()
        leaf = rosenbrock(src, rtol=1e-3, threads=1, options=opts)
        res.update(cpu_s=time.process_time() - c0, wall_s=time.perf_counter() - w1,
                   engine=[leaf.rhs_program.kernel.engine, leaf.jac_program.kernel.engine])
        # the document's state with its zero species at 1e-2 (as the box route)
        u = leaf.initial_state(lanes=1)       # (the document's fields are for one cell)
        u = np.ascontiguousarray(np.where(u > 0, u, 1e-2))
        c1 = time.process_time()
        st = leaf.advance(u, 0.0, 60.0)
        res["first_advance_cpu_s"] = time.process_time() - c1
        res["digest"] = __import__("hashlib").sha256(u.tobytes()).hexdigest()
        res["ok"] = bool(st.success)
    else:
        src = spec["mech"]
        if route == "cell":
            sys.path.insert(0, str(_HERE))
            from realworkload import box_doc, lifted
            src = lifted(box_doc(spec["mech"]), int(spec["cells"]))
        c0, w1 = time.process_time(), time.perf_counter()
        r = RhsProgram.build(src, options=opts)
        c1 = time.process_time()
        j = JacobianProgram.build(src, options=opts)
        c2 = time.process_time()
        res.update(cpu_s=c2 - c0, wall_s=time.perf_counter() - w1, rhs_cpu_s=c1 - c0, jac_cpu_s=c2 - c1,
                   engine=[r.kernel.engine, j.kernel.engine], n_fields=j.n_fields)
        # the document's state with its zero species at 1e-2 (realworkload.py:
        # published defaults of 0 make rates such as k/SALAAL 0/0)
        u = np.ascontiguousarray(np.where(r.u0 > 0, r.u0, 1e-2))
        f = r.forcing0 if r.forcing0 is not None else np.zeros(0)
        out = np.empty_like(u)
        r.eval_into(u, r.p0, 0.0, f, out)
        from esmjac.layouts.types import Csr
        plan = j.plan(Csr(), source=r)
        jo = np.zeros(plan.out_size(j.cells))
        j.eval_into(plan, u, r.p0, 0.0, f, jo, j.new_workspace())
        res["digest"] = __import__("hashlib").sha256(out.tobytes() + jo.tobytes()).hexdigest()
    jit = sorted(((k, v) for k, v in acc.items() if k.startswith("jit.")), key=lambda kv: -kv[1])
    res["jit"] = dict(jit)
    res["phases"] = {k: v for k, v in acc.items() if not k.startswith(("_", "jit."))}
    res["phases"]["other"] = res["cpu_s"] - acc.get("_outer", 0.0)
    res["total_wall_s"] = time.perf_counter() - w0
    return res


# ---------------------------------------------------------------- parent side

def _run_child(spec: dict, cache: Path, pkg_root: Path | None = None) -> dict:
    env = dict(os.environ, ESMJAC_CACHE_DIR=str(cache / "esmjac"), NUMBA_CACHE_DIR=str(cache / "numba"))
    if pkg_root is not None:
        env["PYTHONPATH"] = str(pkg_root)
    la0 = os.getloadavg()[0]
    code = f"import sys, json; sys.path.insert(0, {str(_HERE)!r}); import buildtime; " \
           f"print('@@' + json.dumps(buildtime._child(json.loads({json.dumps(json.dumps(spec))}))))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"child failed ({spec}):\n{p.stderr[-3000:]}")
    line = [x for x in p.stdout.splitlines() if x.startswith("@@")][-1]
    res = json.loads(line[2:])
    res["load_avg"] = [round(la0, 2), round(os.getloadavg()[0], 2)]
    return res


def _show(label: str, r: dict) -> None:
    ph = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.get("phases", {}).items(), key=lambda kv: -kv[1]))
    jit = ", ".join(f"{k[4:]} {v:.2f}" for k, v in list(r.get("jit", {}).items())[:8])
    print(f"{label:<34} CPU {r['cpu_s']:7.2f} s  wall {r['wall_s']:7.2f} s  (import {r['import_cpu_s']:.2f} s; "
          f"load avg {r['load_avg'][0]}-{r['load_avg'][1]})\n{'':<36}{ph}"
          + (f"\n{'':<36}Numba by kernel: {jit}" if jit else ""), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mech", default=os.environ.get("ESMJAC_GC_MECH", DEFAULT_MECH))
    ap.add_argument("--cells", default="1,64")
    ap.add_argument("--routes", default="box,venv,schema,check,cell,leaf")
    ap.add_argument("--out", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the temporary cache folders")
    a = ap.parse_args(argv)
    if not Path(a.mech).is_file():
        print(f"buildtime: no mechanism at {a.mech} (pass --mech or set ESMJAC_GC_MECH); skipped")
        return 0
    routes = a.routes.split(",")
    cells = [int(x) for x in a.cells.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="esmjac_buildtime_"))
    results: dict = {"mech": a.mech, "routes": {}}
    try:
        if "box" in routes or "venv" in routes:
            c = tmp / "box"
            cold = _run_child({"route": "box", "mech": a.mech}, c)
            _show("box RHS + Jacobian, cold", cold)
            warm = _run_child({"route": "box", "mech": a.mech}, c)
            _show("box RHS + Jacobian, warm", warm)
            assert warm["digest"] == cold["digest"], "warm and cold builds differ"
            results["routes"]["box"] = {"cold": cold, "warm": warm}
            if "venv" in routes:
                import esmjac
                other = tmp / "otherinstall"
                shutil.copytree(Path(esmjac.__file__).parent, other / "esmjac",
                                ignore=shutil.ignore_patterns("__pycache__"))
                v = _run_child({"route": "box", "mech": a.mech}, c, pkg_root=other)
                _show("box, warm, another install", v)
                assert v["digest"] == cold["digest"], "another install's build differs"
                results["routes"]["venv"] = v
        if "cell" in routes:
            c = tmp / "cell"
            runs = []
            for i, n in enumerate(cells):
                r = _run_child({"route": "cell", "mech": a.mech, "cells": n}, c)
                _show(f"cell x{n}, {'cold' if i == 0 else 'warm (cache of x' + str(cells[0]) + ')'}", r)
                runs.append(r)
            r = _run_child({"route": "cell", "mech": a.mech, "cells": cells[0]}, c)
            _show(f"cell x{cells[0]}, warm", r)
            runs.append(r)
            results["routes"]["cell"] = runs
        if "leaf" in routes:
            c = tmp / "leaf"
            cold = _run_child({"route": "leaf", "mech": a.mech}, c)
            _show("leaf (rosenbrock, lifted), cold", cold)
            warm = _run_child({"route": "leaf", "mech": a.mech}, c)
            _show("leaf (rosenbrock, lifted), warm", warm)
            assert warm["digest"] == cold["digest"], "warm and cold leaves differ"
            results["routes"]["leaf"] = {"cold": cold, "warm": warm}
        if "schema" in routes:
            r = _run_child({"route": "schema", "mech": a.mech}, tmp / "schema")
            _show("earthsci-ast schema pass alone", r)
            results["routes"]["schema"] = r
        if "check" in routes:
            c = tmp / "check"
            r = _run_child({"route": "check", "mech": a.mech}, c)
            _show("esmjac check, cold", r)
            results["routes"]["check"] = r
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
