"""Numba thread counts: the one place that reads or switches them.

esmjac's kernels are ``parallel=True``. Results never depend on the thread
count (docs/design.rst §7), but cost does: on small calls the fork/join of a
parallel region costs more than the work (measured: 64 cells of a
15-species mechanism, 2–8 ms per call on 2 threads against 7–30 µs on
one). So programs run calls below :data:`SERIAL_BELOW` state elements on
one thread, single-chunk work (one ``prange`` iteration) runs on one
thread, the lane integrator's worker threads each run one-thread kernels,
and adapters may pin an explicit count for a whole solve. Numba's setting
is thread-local; every switch here restores it. No other module reads or
sets numba's thread count.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import numba
import numpy as np

from ..errors import JacError

__all__ = ["SERIAL_BELOW", "one_thread", "numba_threads", "serial_below", "one_chunk", "with_threads",
           "thread_count", "worker_count", "pin_one_thread", "measure_threads"]

#: Below this many state elements a program call runs on one thread.
SERIAL_BELOW = 20000


def one_thread() -> bool:
    """Whether numba runs on one thread here (the generated serial twins apply)."""
    return numba.get_num_threads() == 1


@contextmanager
def numba_threads(n: int | None) -> Iterator[None]:
    """Run the enclosed calls with numba's thread count set to ``n``
    (``None``: leave the setting alone); the previous count is restored."""
    if n is None:
        yield
        return
    prev = numba.get_num_threads()
    if prev == n:
        yield
        return
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(prev)


def serial_below(n: int, limit: int = SERIAL_BELOW):
    """One thread for the enclosed calls when ``n < limit`` (a small call)."""
    return numba_threads(1 if n < limit else None)


def one_chunk(lanes: int, chunk: int):
    """One thread for the enclosed calls when ``lanes`` fit in one ``chunk``:
    a single ``prange`` iteration, so extra threads would only add a pool
    wake-up (tens of µs, far more on a loaded machine) per call. The
    chunking never depends on the thread count, so neither do the bits."""
    return numba_threads(1 if lanes <= chunk else None)


def pin_one_thread() -> None:
    """Numba on one thread in the calling thread (a worker pool's
    initializer: each worker integrates its lane blocks with one-thread
    kernels, the parallelism is across workers)."""
    numba.set_num_threads(1)


def worker_count(threads, lanes: int, lanes_per_thread: int) -> int:
    """Worker threads over lane blocks for an integrator's ``threads=``:
    ``"auto"``: one per ``lanes_per_thread`` lanes, at most the cores and
    numba's pool size; None: numba's current thread count; a positive int,
    capped at numba's pool size."""
    cap = int(numba.config.NUMBA_NUM_THREADS)
    if threads is None:
        return max(1, min(numba.get_num_threads(), cap))
    if threads == "auto":
        return max(1, min(cap, os.cpu_count() or 1, lanes // lanes_per_thread))
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise JacError("bad_option", f"threads must be 'auto', None or a positive int, not {threads!r}")
    return min(int(threads), cap)


def with_threads(nthreads: int | None, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` under :func:`numba_threads` ``(nthreads)``
    (a plain call when there is nothing to switch: the adapters' per-call
    case, where a context manager per call is measurable at 1 cell)."""
    if nthreads is None or numba.get_num_threads() == nthreads:
        return fn(*args, **kwargs)
    with numba_threads(nthreads):
        return fn(*args, **kwargs)


def thread_count(threads, n: int = 0):
    """An adapter's ``threads=`` option for a problem of ``n`` unknowns as a
    numba thread count: ``None`` leaves numba's setting; ``"auto"`` too
    below :data:`SERIAL_BELOW` (each program call then runs small calls on
    one thread itself) and ``"measure"`` above (the adapter decides at build
    time with :func:`measure_threads`); a positive int is capped at numba's
    pool size."""
    if threads is None:
        return None
    if threads == "auto":
        return None if n < SERIAL_BELOW else "measure"
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise JacError("bad_option", f"threads must be 'auto', None or a positive int, not {threads!r}")
    return min(int(threads), int(numba.config.NUMBA_NUM_THREADS))


def measure_threads(call: Callable[[], object]) -> int:
    """``threads="auto"`` on a large problem: time ``call()`` (one RHS and
    one Jacobian evaluation) on one thread and on numba's thread count,
    interleaved, best of three, and keep the parallel kernels only where
    they are clearly faster (by 10 %). On a busy or small machine a parallel
    region's threads wait for cores and one thread wins by orders of
    magnitude (measured: 2000 cells of tropo12 at load 16 on 2 cores, RHS
    66 ms on two threads, 0.4 ms on one). Results are bitwise the same for
    any thread count, so the choice changes only the time."""
    nmax = int(numba.config.NUMBA_NUM_THREADS)
    if nmax <= 1:
        return 1
    best = {1: float("inf"), nmax: float("inf")}
    for _ in range(3):
        for k in (1, nmax):
            t0 = time.perf_counter()
            with_threads(k, call)
            best[k] = min(best[k], time.perf_counter() - t0)
    return nmax if best[nmax] * 1.1 < best[1] else 1
