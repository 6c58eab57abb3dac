"""Shared fixtures. Tests that read ../shared/ skip with a reason when it is
absent (a user's own clone) and fail loudly in CI, where it must exist.

The cache: tests never touch the user's ``~/.cache/esmjac``. Unless
``ESMJAC_CACHE_DIR`` is set (``make test``/``make check`` set a project
folder, so a second run is warm), this module — imported by the controller
before pytest-xdist starts its workers, which inherit the environment —
points it at one temporary folder for the whole session, removed at exit:
every worker and child process shares the kernels and products built
there, compiled once. Numba's cache files of kernel modules live beside the
modules (compile/cache.py), so they are session-scoped with it; Numba's
files for esmjac's own compiled functions stay beside their source, as a
user's do (an inherited ``NUMBA_CACHE_DIR`` is honoured; child processes
drop it, tests/support/child.py).
"""
from __future__ import annotations

import atexit
import os
import resource
import time
import shutil
import tempfile
import warnings
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, need_reference

warnings.filterwarnings("ignore", message=".*aggregate.*")


def _session_cache() -> None:
    if os.environ.get("ESMJAC_CACHE_DIR"):
        return
    d = tempfile.mkdtemp(prefix="esmjac-tests-")
    os.environ["ESMJAC_CACHE_DIR"] = d
    atexit.register(shutil.rmtree, d, True)      # only in the process that made it


_session_cache()


def pytest_report_header(config) -> str:
    return f"esmjac cache: {os.environ['ESMJAC_CACHE_DIR']}"


#: What `make check` (``-m "not slow"``) leaves out, besides single tests
#: that start a child process (each marked ``@pytest.mark.slow`` itself):
#: whole files — the corpus, the peers, the docs build, the fuzz (a child
#: process) — and every test using a fixture that starts processes: the
#: two-process Dask cluster (``client``) and the cache tests' warm cache
#: built by child processes (``warm``).
SLOW_FILES = ("docs/", "benchmarks/test_corpus.py", "benchmarks/test_peers.py", "runtime/test_fuzz.py")
SLOW_FIXTURES = frozenset({"client", "warm"})


@pytest.hookimpl(tryfirst=True)          # before ``-m`` deselects by marker
def pytest_collection_modifyitems(config, items) -> None:
    here = Path(__file__).parent
    for item in items:
        try:
            rel = Path(str(item.fspath)).resolve().relative_to(here).as_posix()
        except ValueError:
            continue
        if rel.startswith(SLOW_FILES) or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


#: Files that build the same programs and plans (tropo12's Jacobian on
#: every lane layout: ~16 s of Numba CPU per layout) run on one xdist worker
#: under ``--dist loadfile``, which compiles them once. Two workers starting
#: both files at once compiled each of these kernels twice (measured: 36 s of
#: CPU in a cold run), before either could reach the other's disk cache.
SHARED_SCOPES = {f"tests/{f}": "tests/runtime/test_programs.py + tests/layouts/test_plans.py"
                 for f in ("runtime/test_programs.py", "layouts/test_plans.py")}


class _SharedScopes:
    """``pytest_xdist_make_scheduler``: loadfile's scheduling, with the files
    of :data:`SHARED_SCOPES` as one scope (registered only where xdist is
    loaded: the hook is xdist's)."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadfile":
            return None
        from xdist.scheduler import LoadFileScheduling

        class _Scheduling(LoadFileScheduling):
            def _split_scope(self, nodeid: str) -> str:
                scope = super()._split_scope(nodeid)
                return SHARED_SCOPES.get(scope, scope)

        return _Scheduling(config, log)


def pytest_configure(config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_SharedScopes(), "esmjac-shared-scopes")


@pytest.fixture(scope="session")
def reference():
    return need_reference()


_bandsets: dict = {}


@pytest.fixture(scope="session")
def bandset():
    """Build (and share across tests) the BandSet of a reference fixture."""
    from esmjac.calculus.bandset import BandSet

    def get(fx: str, wrt: str = "states"):
        need_reference()
        key = (fx, wrt)
        if key not in _bandsets:
            _bandsets[key] = BandSet.build(FIXTURES / f"{fx}.esm", wrt=wrt)
        return _bandsets[key]

    return get


# ---------------------------------------------------------------- CPU time per test
# ``--durations`` reports wall time, which on a shared, loaded machine says
# more about the neighbours than about the test. ``--cpu-durations=N`` lists
# the N tests that used the most CPU (this process and the child processes
# it waited for: Numba compiles, children, sphinx), setup + call + teardown.

def pytest_addoption(parser) -> None:
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that used the most CPU time (with their children)")


def _cpu() -> float:
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + c.ru_utime + c.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    t0 = item.__dict__.pop("_esmjac_cpu0", None)
    if t0 is not None:
        outcome.get_result().user_properties.append(("cpu_s", _cpu() - t0))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    item._esmjac_cpu0 = _cpu()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item) -> None:
    item._esmjac_cpu0 = _cpu()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item) -> None:
    item._esmjac_cpu0 = _cpu()


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    n = config.getoption("--cpu-durations")
    if not n:
        return
    total: dict = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            for k, v in getattr(r, "user_properties", ()):
                if k == "cpu_s":
                    total[r.nodeid] = total.get(r.nodeid, 0.0) + v
    load = os.getloadavg() if hasattr(os, "getloadavg") else ()
    terminalreporter.write_sep("=", f"{min(n, len(total))} tests by CPU time (all: {sum(total.values()):.0f} s; "
                               f"load average now {' '.join(f'{x:.1f}' for x in load)})")
    for nodeid, v in sorted(total.items(), key=lambda kv: -kv[1])[:n]:
        terminalreporter.write_line(f"{v:8.2f}s {nodeid}")
