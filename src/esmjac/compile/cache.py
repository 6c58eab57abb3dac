"""The on-disk kernel cache: generated modules stored by content hash.

Numba cannot cache functions compiled from ``exec``'d strings, so each
generated module is written once to ``<cache>/k<sha256>.py`` and imported
from there; ``cache=True`` then keeps Numba's compiled code beside it. The
hash covers the generated source (which spells out model, layout and
dtype-independent code) and the esmjac and Numba versions. The folder is
``$ESMJAC_CACHE_DIR``, else ``~/.cache/esmjac``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from .._version import __version__

__all__ = ["cache_dir", "content_hash", "load_source"]


def cache_dir() -> Path:
    d = os.environ.get("ESMJAC_CACHE_DIR")
    p = Path(d) if d else Path.home() / ".cache" / "esmjac"
    p.mkdir(parents=True, exist_ok=True)
    return p


_CODE: list = []
_LOADED: dict = {}


def code_version() -> str:
    """Hash of the esmjac source files that shape a build product: a build
    cached by an older esmjac (even an unreleased edit) is never reused.
    Adapters, integrators and the command line do not count."""
    if not _CODE:
        h = hashlib.sha256()
        root = Path(__file__).resolve().parent.parent
        skip = ("adapters/", "integrators/", "cli.py", "demo.py", "bench.py", "plugins.py",
                "hookspecs.py", "check.py", "goldens.py", "__main__.py")
        for p in sorted(root.rglob("*.py")):
            if p.relative_to(root).as_posix().startswith(skip):
                continue
            h.update(p.relative_to(root).as_posix().encode())
            h.update(p.read_bytes())
        _CODE.append(h.hexdigest()[:16])
    return _CODE[0]


def content_hash(*parts: str) -> str:
    import numba

    h = hashlib.sha256()
    for s in (__version__, numba.__version__, code_version(), *parts):
        h.update(s.encode())
        h.update(b"\0")
    return h.hexdigest()


def load_source(source: str, key: str | None = None):
    """Import ``source`` as a module stored under its content hash."""
    key = key or content_hash(source)
    modname = f"esmjac_k{key[:40]}"
    memo = (os.environ.get("ESMJAC_CACHE_DIR"), modname)
    mod = _LOADED.get(memo)
    if mod is not None:          # the per-call path: no file-system access
        return mod
    path = cache_dir() / f"k{key[:40]}.py"
    if not path.exists():
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)          # atomic: concurrent builders agree
    mod = sys.modules.get(modname)
    if mod is None:
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod
        spec.loader.exec_module(mod)
    _LOADED[memo] = mod
    return mod
