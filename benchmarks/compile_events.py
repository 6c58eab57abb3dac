"""Where a test run's Numba compile time goes: a pytest plugin and its report.

Record (one JSON-lines file per process, xdist workers included)::

    ESMJAC_COMPILE_EVENTS=/tmp/ev python -m pytest -p benchmarks.compile_events -n 2 --dist loadfile

Every Numba compile ("numba:compile" events: a cache miss) with its inclusive and
*exclusive* thread CPU and wall seconds (a kernel's compile includes the compiles of
the callees it links; exclusive is what is left: for a wrapper, mostly LLVM
re-optimising the callees linked into its module), the function, its signature and
the test node id; every Numba cache load (hit or miss, with its CPU); and each test's
own CPU, its children's CPU and its wall time. Report::

    python -m benchmarks.compile_events /tmp/ev [N]

prints per worker the tests' CPU and the compile CPU, the functions by exclusive
compile CPU (generated kernel modules grouped by kind), repeated compiles of the
same function and signature (across workers or in one), the tests by CPU and the
files by CPU. Measure cold: fresh ``ESMJAC_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` (or no
``__pycache__`` under src/ when it is unset).
"""
from __future__ import annotations

import collections
import glob
import json
import os
import re
import resource
import sys
import time

import pytest

_ENV = "ESMJAC_COMPILE_EVENTS"
_cur = {"node": "<collect>", "phase": ""}
_stack: list = []
_fh = None


def _out(rec: dict) -> None:
    global _fh
    if _fh is None:
        d = os.environ[_ENV]
        os.makedirs(d, exist_ok=True)
        wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
        _fh = open(os.path.join(d, f"{wid}-{os.getpid()}.jsonl"), "a", buffering=1)
    _fh.write(json.dumps(rec) + "\n")


def _install() -> None:
    from numba.core import caching
    from numba.core import event as ev

    class Listener(ev.Listener):
        def on_start(self, event):
            _stack.append([time.thread_time(), time.perf_counter(), 0.0, 0.0])

        def on_end(self, event):
            c0, w0, cc, cw = _stack.pop()
            ci, wi = time.thread_time() - c0, time.perf_counter() - w0
            if _stack:
                _stack[-1][2] += ci
                _stack[-1][3] += wi
            d = event.data or {}
            py = getattr(d.get("dispatcher"), "py_func", None)
            _out(dict(k="compile", fn=f"{getattr(py, '__module__', '?')}.{getattr(py, '__qualname__', '?')}",
                      sig=str(d.get("args")), ci=ci, wi=wi, ce=ci - cc, we=wi - cw, depth=len(_stack),
                      node=_cur["node"], ph=_cur["phase"], t=time.time()))

    ev.register("numba:compile", Listener())
    orig = caching.Cache.load_overload

    def load_overload(self, sig, target_context):
        c0, w0 = time.thread_time(), time.perf_counter()
        r = orig(self, sig, target_context)
        ci, wi = time.thread_time() - c0, time.perf_counter() - w0
        if _stack:
            _stack[-1][2] += ci
            _stack[-1][3] += wi
        _out(dict(k="load", fn=getattr(self, "_name", "?"), hit=r is not None, ci=ci, wi=wi,
                  node=_cur["node"], ph=_cur["phase"], t=time.time()))
        return r
    caching.Cache.load_overload = load_overload


def pytest_configure(config) -> None:
    if os.environ.get(_ENV):
        _install()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _cur["node"] = item.nodeid
    w0, p0 = time.perf_counter(), time.process_time()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    yield
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if os.environ.get(_ENV):
        _out(dict(k="test", node=item.nodeid, cpu=time.process_time() - p0,
                  child=(r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
                  wall=time.perf_counter() - w0, t=time.time()))
    _cur["node"] = "<between>"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    _cur["phase"] = "setup"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    _cur["phase"] = "call"
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    _cur["phase"] = "teardown"
    yield


def report(d: str, top: int = 25) -> None:
    recs = []
    for fn in glob.glob(os.path.join(d, "*.jsonl")):
        w = os.path.basename(fn).split("-")[0]
        with open(fn) as fh:
            for line in fh:
                r = json.loads(line)
                r["w"] = w
                recs.append(r)
    comp = [r for r in recs if r["k"] == "compile"]
    loads = [r for r in recs if r["k"] == "load"]
    tests = [r for r in recs if r["k"] == "test"]
    for w in sorted({r["w"] for r in recs}):
        print(f"{w}: {sum(r['w'] == w for r in tests)} tests, CPU {sum(r['cpu'] for r in tests if r['w'] == w):.0f} s "
              f"+ children {sum(r['child'] for r in tests if r['w'] == w):.0f} s, wall "
              f"{sum(r['wall'] for r in tests if r['w'] == w):.0f} s; Numba compile "
              f"{sum(r['ce'] for r in comp if r['w'] == w):.0f} s, cache loads "
              f"{sum(r['ci'] for r in loads if r['w'] == w):.1f} s")
    kind: dict = collections.defaultdict(lambda: [0.0, 0])
    for r in comp:
        k = re.sub(r"\d+$", "N", re.sub(r"esmjac_k[0-9a-f]{40}\.", "<generated>.", r["fn"]))
        kind[k][0] += r["ce"]
        kind[k][1] += 1
    print(f"\nexclusive compile CPU by function ({len(comp)} compiles, {sum(r['ce'] for r in comp):.0f} s)")
    for k, (v, n) in sorted(kind.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{v:8.1f} s  n={n:4d}  {k}")
    same = collections.defaultdict(list)
    for r in comp:
        same[r["fn"], r["sig"]].append(r)
    rows = [(sum(x["ce"] for x in rs) - min(x["ce"] for x in rs), len(rs), ",".join(sorted({x["w"] for x in rs})), k[0])
            for k, rs in same.items() if len(rs) > 1]
    print(f"\nrepeated compiles of one function and signature: {sum(r[0] for r in rows):.0f} s beyond the first")
    for row in sorted(rows, reverse=True)[:10]:
        print(f"{row[0]:8.1f} s  n={row[1]}  {row[2]}  {row[3]}")
    ct: dict = collections.defaultdict(float)
    for r in comp:
        ct[r["node"]] += r["ce"]
    print("\ntests by CPU (own + children): compile, wall")
    for r in sorted(tests, key=lambda r: -(r["cpu"] + r["child"]))[:top]:
        print(f"{r['cpu'] + r['child']:8.1f} s  compile {ct[r['node']]:6.1f}  wall {r['wall']:6.1f}  {r['w']}  {r['node']}")
    files: dict = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for r in tests:
        f = files[r["node"].split("::")[0]]
        f[0] += r["cpu"] + r["child"]
        f[1] += r["wall"]
        f[2] += 1
    print("\nfiles by CPU (own + children): wall, tests")
    for f, (c, wl, n) in sorted(files.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{c:8.1f} s  wall {wl:7.1f}  n={n:4d}  {f}")


if __name__ == "__main__":
    report(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25)
