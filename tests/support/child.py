"""Run test code in a fresh Python process: a segfault or a hang fails the
test instead of killing the run, and module-level state (the loaded-kernel
memo, ``sys.modules``) starts empty, as it does for a user's new job."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

__all__ = ["run_child", "start_child", "finish_child"]

_PRELUDE = "import json, sys, warnings\nwarnings.simplefilter('ignore')\n"


def start_child(code: str, cache: str | os.PathLike, env: dict | None = None) -> subprocess.Popen:
    """Start ``code`` in a child with ``ESMJAC_CACHE_DIR=cache``; the child
    reports by printing one JSON line prefixed ``RESULT``. An inherited
    ``NUMBA_CACHE_DIR`` is dropped (unless ``env`` names it): children see
    the layout a user gets, Numba's files beside the kernel modules."""
    from .paths import ROOT
    e = dict(os.environ, ESMJAC_CACHE_DIR=str(cache), **(env or {}))
    if "NUMBA_CACHE_DIR" not in (env or {}):
        e.pop("NUMBA_CACHE_DIR", None)
    return subprocess.Popen([sys.executable, "-c", _PRELUDE + textwrap.dedent(code)], env=e, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish_child(proc: subprocess.Popen, timeout: float = 300) -> dict:
    """The child's RESULT (asserts a clean exit: no signal, no traceback)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child timed out after {timeout} s\n{err[-3000:]}")
    assert proc.returncode == 0, f"child exited with {proc.returncode}\n{err[-4000:]}"
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError(f"child printed no RESULT\n{out[-2000:]}\n{err[-2000:]}")


def run_child(code: str, cache: str | os.PathLike, env: dict | None = None, timeout: float = 300) -> dict:
    return finish_child(start_child(code, cache, env), timeout)
