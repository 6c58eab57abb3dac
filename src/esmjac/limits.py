"""Memory limits shared by the document checks and the runtime checks.

A workspace (or a state vector implied by a document's index-set sizes)
whose size would exceed :func:`workspace_limit` is refused with the bytes it
would need, instead of the process spending seconds and gigabytes before
failing. The limit is a quarter of physical memory unless
``$ESMJAC_WORKSPACE_LIMIT`` (bytes) or :func:`set_workspace_limit` says
otherwise.

A document nesting deeper than :func:`document_depth_limit` levels is
refused before it is parsed. A document file (and every file it pulls in through ``ref``) is read only if
it is a regular file of at most :func:`document_limit` bytes (256 MiB unless
``$ESMJAC_DOCUMENT_LIMIT`` says otherwise): a ``ref`` to ``/dev/zero`` or a
FIFO is refused before anything is read.
"""
from __future__ import annotations

import numbers
import os

from .errors import JacError

__all__ = ["workspace_limit", "set_workspace_limit", "document_limit", "document_depth_limit", "lane_count"]

_LIMIT: list = []


def _env_bytes(var: str) -> int | None:
    env = os.environ.get(var)
    if not env:
        return None
    try:
        v = int(float(env))
    except (ValueError, OverflowError):
        v = 0
    if v < 1:
        raise JacError("bad_option", f"{var}={env!r} is not a positive number")
    return v


def document_limit() -> int:
    """Bytes one document file (or one file a ``ref`` pulls in) may have."""
    v = _env_bytes("ESMJAC_DOCUMENT_LIMIT")
    return v if v is not None else 256 << 20


def document_depth_limit() -> int:
    """Deepest JSON nesting a document may have (2,000 levels, about 1,000
    nested binary operators, unless ``$ESMJAC_MAX_DEPTH`` says otherwise):
    earthsci-ast's schema check is quadratic in depth, so this bounds the
    time a document can take to load, and deeper input is refused at once."""
    v = _env_bytes("ESMJAC_MAX_DEPTH")
    return v if v is not None else 2000


def workspace_limit() -> int:
    """Bytes one workspace (or one state vector) may need."""
    if _LIMIT:
        return _LIMIT[0]
    v = _env_bytes("ESMJAC_WORKSPACE_LIMIT")
    if v is not None:
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


def lane_count(n, what: str = "lanes") -> int:
    """``n`` as a lane count for a size query (``u_size``, ``out_size`` …):
    a positive integer, else ``bad_argument`` (a negative count would give a
    negative or zero size that a caller then allocates)."""
    if type(n) is int and n >= 1:           # the common case, cheaply
        return n
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise JacError("bad_argument", f"{what} must be a positive integer, got {n!r} ({type(n).__name__})")
    if int(n) < 1:
        raise JacError("bad_argument", f"{what} must be >= 1, got {int(n)}")
    return int(n)
