"""Numba thread counts: the one place that reads or switches them.

esmjac's kernels are ``parallel=True``. Results never depend on the thread
count (docs/design.rst §7), but cost does: on small calls the fork/join of a
parallel region costs more than the work (measured: 64 cells of a
15-species mechanism, 2–8 ms per call on 2 threads against 7–30 µs on
one). So programs run calls below :data:`SERIAL_BELOW` state elements on
one thread, integrators run single-chunk work on one thread, and adapters
may pin an explicit count for a whole solve. Numba's setting is
thread-local; every switch here restores it.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import numba
import numpy as np

from ..errors import JacError

__all__ = ["SERIAL_BELOW", "one_thread", "numba_threads", "serial_below", "with_threads",
           "thread_count"]

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


def with_threads(nthreads: int | None, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)`` under :func:`numba_threads` ``(nthreads)``."""
    with numba_threads(nthreads):
        return fn(*args, **kwargs)


def thread_count(threads) -> int | None:
    """An adapter's ``threads=`` option as a numba thread count: ``"auto"``
    and ``None`` leave numba's setting (each program call then picks serial
    or parallel itself); a positive int is capped at numba's pool size."""
    if threads is None or threads == "auto":
        return None
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise JacError("bad_option", f"threads must be 'auto', None or a positive int, not {threads!r}")
    return min(int(threads), int(numba.config.NUMBA_NUM_THREADS))
