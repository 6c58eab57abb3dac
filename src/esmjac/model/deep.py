"""Run tree passes on a deep stack.

Large mechanisms and long stencil sums give expression trees hundreds to
thousands of levels deep; the recursive passes run in a worker thread with a
large stack and a matching recursion limit instead of hitting Python's
default limit.

The recursion limit is process-wide (one per interpreter in CPython 3.11),
so it is raised only while a deep pass runs and restored to the caller's
value when the last concurrent pass ends: after a build, a deeply nested
input parsed on an ordinary 8 MiB thread stack (``json.loads`` of
``"[" * 200000``) is a ``RecursionError`` again, never a C stack overflow.
(While a pass runs, other threads of the process see the raised limit.)
"""
from __future__ import annotations

import contextvars
import sys
import threading
from typing import Any, Callable

__all__ = ["run_deep"]

_STACK_BYTES = 512 * 1024 * 1024
_RECURSION = 200_000
_local = threading.local()
_lock = threading.Lock()
_active: list = [0, None]       # [passes running, the limit to restore when none is]


def _enter() -> None:
    with _lock:
        if _active[0] == 0:
            _active[1] = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_active[1], _RECURSION))
        _active[0] += 1


def _leave() -> None:
    with _lock:
        _active[0] -= 1
        if _active[0] == 0:
            sys.setrecursionlimit(_active[1])


def _run(fn, args, kwargs, box: dict) -> None:
    _local.deep = True
    try:
        box["value"] = fn(*args, **kwargs)
    except BaseException as exc:  # re-raised in the caller's thread
        box["error"] = exc
    finally:
        _leave()                  # by the worker itself: the limit stays raised while it runs,
                                  # even when the caller stopped waiting (Ctrl-C, an alarm)


def run_deep(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a deep stack (re-entrant: nested calls run
    inline); the process's recursion limit is back to its value on return."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    box: dict = {}
    ctx = contextvars.copy_context()      # the worker runs in the caller's context

    def target():
        ctx.run(_run, fn, args, kwargs, box)

    _enter()
    started = False
    try:
        with _lock:                   # threading.stack_size is process-wide too
            old_size = threading.stack_size()
            threading.stack_size(_STACK_BYTES)
            try:
                t = threading.Thread(target=target, name="esmjac-deep", daemon=True)
                t.start()
                started = True
            finally:
                threading.stack_size(old_size)
    finally:
        if not started:
            _leave()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")
