"""Memory limits shared by the document checks and the runtime checks.

A workspace (or a state vector implied by a document's index-set sizes)
whose size would exceed :func:`workspace_limit` is refused with the bytes it
would need, instead of the process spending seconds and gigabytes before
failing. The limit is a quarter of physical memory unless
``$ESMJAC_WORKSPACE_LIMIT`` (bytes) or :func:`set_workspace_limit` says
otherwise.
"""
from __future__ import annotations

import os

from .errors import JacError

__all__ = ["workspace_limit", "set_workspace_limit"]

_LIMIT: list = []


def workspace_limit() -> int:
    """Bytes one workspace (or one state vector) may need."""
    if _LIMIT:
        return _LIMIT[0]
    env = os.environ.get("ESMJAC_WORKSPACE_LIMIT")
    if env:
        try:
            v = int(float(env))
        except ValueError:
            v = 0
        if v < 1:
            raise JacError("bad_option", f"ESMJAC_WORKSPACE_LIMIT={env!r} is not a positive number of bytes")
        return v
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        phys = 16 << 30
    return phys // 4


def set_workspace_limit(nbytes: int | None) -> None:
    """Override the limit for this process (``None``: back to the default)."""
    _LIMIT.clear()
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise JacError("bad_option", "the workspace limit must be a positive number of bytes")
        _LIMIT.append(int(nbytes))
