"""Run tree passes on a deep stack.

Large mechanisms and long stencil sums give expression trees hundreds to
thousands of levels deep; the recursive passes run in a worker thread with a
large stack and a matching recursion limit instead of hitting Python's
default limit.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

__all__ = ["run_deep"]

_STACK_BYTES = 512 * 1024 * 1024
_RECURSION = 200_000
_local = threading.local()


def run_deep(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` on a deep stack (re-entrant: nested calls run inline)."""
    if getattr(_local, "deep", False):
        return fn(*args, **kwargs)
    box: dict = {}

    def target():
        _local.deep = True
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    old_limit = sys.getrecursionlimit()
    old_size = threading.stack_size()
    sys.setrecursionlimit(max(old_limit, _RECURSION))
    threading.stack_size(_STACK_BYTES)
    try:
        t = threading.Thread(target=target, name="esmjac-deep")
        t.start()
    finally:
        threading.stack_size(old_size)
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("value")
