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
import shutil
import tempfile
import warnings

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
