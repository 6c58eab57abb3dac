"""The on-disk cache: generated kernel modules and whole build products,
each verified on every read.

Nothing read back from the cache folder is trusted:

* **Signatures**: every file esmjac writes to the cache (kernel modules,
  product JSON and arrays) has ``<name>.sig`` beside it, an HMAC-SHA256 of
  its name and bytes keyed by a per-user secret (:func:`_signing_key`:
  ``$XDG_CONFIG_HOME/esmjac/secret`` or ``~/.config/esmjac/secret``, 32
  random bytes created ``0600`` on first use, outside the cache folder;
  ``$ESMJAC_SECRET_FILE`` overrides the path). A file whose signature does
  not verify — damaged, or written by anyone without the secret, even with
  a self-consistent key and hashes — is a logged cache miss, removed and
  rebuilt: a forged entry can never change an answer. A secret that is not
  a private regular file of this user is not used (a warning; a key for the
  process only, so nothing is reused across processes). Cache files are
  read only if they are regular files (no links followed) within the
  memory limit.
* **Kernel modules** ``k<hash>.py``: the key is the content hash of the
  generated source, which the caller always holds in memory; the file on
  disk is compared with it byte for byte (and its signature checked), and
  rewritten when either fails (a logged cache miss; Numba's files of it
  purged). The module is then executed from the in-memory source (compiled
  here), never imported from the file: a forged ``__pycache__/k….pyc``
  beside it is never read. A module is registered in
  ``sys.modules`` only once ``exec_module`` has finished, under a lock, so
  concurrent first calls and builds never see a half-executed module.
* **Build products** ``b<key>.json`` + ``b<key>.npz``: plain JSON and a
  NumPy archive read with ``allow_pickle=False`` — a data format that cannot
  execute code, so a cache folder shared between users or jobs cannot run
  anything. Only whitelisted dataclasses, expression nodes, containers,
  numbers and non-object arrays decode. Every file is signed (above) and
  the JSON names its own key and the SHA-256 of its arrays, so a truncated,
  edited, forged or copied-over entry is a logged cache miss followed by a
  rebuild, never an error that persists. Generated source is never stored in a product: the
  caller regenerates it (cheap) from the decoded evaluation document.
* **Keys are what the content depends on.** A product's key
  (:func:`document_key`) covers every file a document pulls in (``ref``
  mounts, subsystems, template and coupling libraries, found by walking the
  JSON), the options, the esmjac, Numba, NumPy and earthsci-ast versions, and
  a hash of the modules that compute products (:data:`PRODUCT_CODE`,
  :func:`code_version`). A kernel module's key (:func:`kernel_key`) is its
  generated source, :data:`KERNEL_FORMAT`, the Numba/NumPy versions and the
  few modules it runs with (:data:`KERNEL_CODE`): an edit of the CLI, an
  adapter or a docstring in the calculus recompiles no kernel.

What stays trusted, and why that is safe: Numba's own cache files
(``cache=True`` writes a pickled index ``.nbi`` and compiled code ``.nbc``
per function into ``__pycache__`` beside each kernel module, or under
``$NUMBA_CACHE_DIR``). Numba unpickles them and runs the machine code they
hold, so they can run anything; esmjac does not sign them (Numba reads them
itself). They are read only from a kernel folder owned by the current user
and writable by no one else (folder and its ``__pycache__``): whoever can
write there is already this user and could run code as this user anyway.
Any other folder gets its kernels compiled in a private temporary folder for
the process (a warning says so); a ``$NUMBA_CACHE_DIR`` writable by others
gets a warning (esmjac cannot move Numba's cache once Numba is imported).
Numba checks an index against the kernel module's modification time and
size, and a rewritten (re-signed) module purges its entries. A corrupt Numba
index is caught at the first call (:func:`numba_cache_failure`), purged and
recompiled.

Environment failures (the path is a file, no permission, the folder deleted
during a build) are :class:`~esmjac.errors.JacError` ``cache_error`` naming
the path and what to do; a read-only folder falls back to building in a
private temporary folder with a warning. The folder is ``$ESMJAC_CACHE_DIR``,
else ``~/.cache/esmjac``.
"""
from __future__ import annotations

import atexit
import contextlib
import contextvars
import dataclasses
import hashlib
import hmac
import importlib.metadata
import io
import json
import logging
import math
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from .._frozen import FrozenMap
from .._version import __version__
from ..errors import JacError
from ..limits import document_limit, workspace_limit
from ..model.deep import run_deep
from ..model.load import ref_strings
from ..model.expr import Node, _FDict, iter_children, node

__all__ = ["cache_dir", "content_hash", "kernel_key", "load_source", "code_version", "module_hash", "document_key", "one_document",
           "grid_free_key", "dependency_files", "store_product", "load_product", "read_product", "discard_product",
           "StoredProduct", "numba_cache_failure",
           "purge_numba_cache", "schema_passed", "record_schema_pass"]

log = logging.getLogger("esmjac.cache")

_LOCK = threading.RLock()     # module loading, folder set-up and product files
_CODE: list = []              # (files, hash) of _code_hash, memoized
_DEPS: list = []              # _dep_versions, memoized
_LOADED: dict = {}            # (cache folder, module name) → fully executed module
_PRIVATE: list = []           # this process's private fallback folder (created lazily)
_WARNED: set = set()
PRODUCT_FORMAT = 3             # 2: programs stored as tapes/arrays apart from their expressions; 3: signed


# ------------------------------------------------------------------ folders

def _configured() -> Path:
    d = os.environ.get("ESMJAC_CACHE_DIR")
    return Path(d) if d else Path.home() / ".cache" / "esmjac"


def _warn_once(tag: str, msg: str) -> None:
    if tag not in _WARNED:
        _WARNED.add(tag)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
        log.warning(msg)


def _private_dir() -> Path:
    """A process-private folder (removed at exit): the in-memory fallback."""
    with _LOCK:
        if not _PRIVATE:
            d = Path(tempfile.mkdtemp(prefix="esmjac-private-"))
            atexit.register(shutil.rmtree, d, True)
            _PRIVATE.append(d)
        return _PRIVATE[0]


def _usable(p: Path) -> Path | None:
    """``p`` created if needed and writable, else None (with a warning);
    ``cache_error`` when the configuration itself is wrong."""
    try:
        if p.exists() and not p.is_dir():
            raise JacError("cache_error",
                           f"the cache path {p} exists and is not a folder; set ESMJAC_CACHE_DIR to a "
                           "folder (or remove the file)")
        p.mkdir(parents=True, exist_ok=True)
    except JacError:
        raise
    except (FileExistsError, NotADirectoryError) as exc:
        raise JacError("cache_error", f"the cache path {p} (or a parent) is a file, not a folder; set "
                       "ESMJAC_CACHE_DIR to a folder") from exc
    except OSError as exc:
        _warn_once(f"mkdir:{p}", f"esmjac cannot create its cache folder {p} ({exc.strerror or exc}); "
                   "building in memory for this process. Set ESMJAC_CACHE_DIR to a writable folder "
                   "to reuse builds.")
        return None
    if not os.access(p, os.W_OK | os.X_OK):
        _warn_once(f"ro:{p}", f"the esmjac cache folder {p} is read-only; building in memory for this "
                   "process. Set ESMJAC_CACHE_DIR to a writable folder to reuse builds.")
        return None
    return p


def cache_dir() -> Path:
    """The cache folder for build products (a private temporary folder when
    the configured one is read-only; see the module docstring)."""
    return _usable(_configured()) or _private_dir()


def _owned_privately(p: Path) -> bool:
    try:
        st = p.stat()
    except OSError:
        return False
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return False
    return not (st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def _check_numba_cache_dir() -> None:
    d = os.environ.get("NUMBA_CACHE_DIR")
    if d and Path(d).exists() and not _owned_privately(Path(d)):
        _warn_once(f"numba:{d}", f"NUMBA_CACHE_DIR={d} is writable by other users (or not yours): "
                   "Numba's cache files there are pickles it loads and runs; point it at a private "
                   "folder")


def kernel_dir() -> Path:
    """Where kernel modules (and so Numba's pickled cache files) live: the
    cache folder when only this user can write to it, else a private one."""
    p = cache_dir()
    _check_numba_cache_dir()
    pyc = p / "__pycache__"
    if p in _PRIVATE or (_owned_privately(p) and (not os.path.lexists(pyc) or
                                                 (pyc.is_dir() and not pyc.is_symlink()
                                                  and _owned_privately(pyc)))):
        return p
    _warn_once(f"shared:{p}", f"the esmjac cache folder {p} is writable by other users (or not yours); "
               "its build products are used (they are verified data), but kernels are compiled in a "
               "private folder for this process, since Numba's cache files are pickles")
    return _private_dir()


# ------------------------------------------------------------------ hashes

#: Bump when what a kernel module or tape *means* changes beyond its text
#: (e.g. how the loader imports it, or the tape's instruction encoding as
#: written in digests): every kernel key changes with it.
KERNEL_FORMAT = 1

#: esmjac files a compiled kernel depends on beyond its own text: generated
#: modules import ``stack_empty`` (Numba inlines it into each kernel's cache
#: entry, which Numba keys by the kernel file alone), their tiled chunks run
#: the tile loops of ``tilecall.py`` (serial drivers link them), and tapes
#: mean what the interpreter in ``tape.py`` does with them.
KERNEL_CODE = ("compile/stackbuf.py", "compile/tape.py", "compile/tilecall.py")

#: esmjac files a stored build product is computed by: every module
#: ``runtime/programs.py`` and ``runtime/stored.py`` import, directly or not
#: (a test checks this list against the import graph). An edit of anything
#: else (the CLI, adapters, integrators, plugins, docs) keeps every product.
PRODUCT_CODE = ("_frozen.py", "_version.py", "errors.py", "limits.py",
                "model", "calculus", "compile", "layouts", "linalg", "runtime")

_ROOT = Path(__file__).resolve().parent.parent      # the esmjac package folder


def _code_hash(rels: tuple) -> str:
    """SHA-256 (24 hex digits) over the ``.py`` files at ``rels`` (files or
    folders relative to the esmjac package, folders recursively), each with
    its relative path; memoized per process (the installed source does not
    change under a running process)."""
    for k, v in _CODE:
        if k == rels:
            return v
    h = hashlib.sha256()
    for rel in rels:
        p = _ROOT / rel
        files = sorted(p.rglob("*.py")) if p.is_dir() else [p]
        for f in files:
            if "__pycache__" in f.parts:
                continue
            h.update(f.relative_to(_ROOT).as_posix().encode() + b"\0")
            h.update(f.read_bytes())
            h.update(b"\0")
    v = h.hexdigest()[:24]
    _CODE.append((rels, v))
    return v


def module_hash(*rels: str) -> str:
    """Hash of the esmjac modules ``rels`` (paths relative to the package,
    as :data:`PRODUCT_CODE`): for a product computed by modules outside
    :data:`PRODUCT_CODE` (the leaf's lane split), a part of its key."""
    return _code_hash(tuple(rels))


def code_version() -> str:
    """Hash of the esmjac modules that compute a build product
    (:data:`PRODUCT_CODE`): a product stored by an esmjac whose calculus,
    compiler or runtime differs, even by an unreleased edit, is never reused;
    an edit elsewhere reuses it."""
    return _code_hash(PRODUCT_CODE)


def _dep_versions() -> tuple:
    """Versions of the libraries a product or kernel is computed with,
    memoized per process. earthsci-ast's is its installed distribution's
    version (what its ``__version__`` reads), so a warm build that loads no
    document never imports it (≈ 1.3 s of CPU on this machine class)."""
    if not _DEPS:
        import numba

        try:
            ast_version = importlib.metadata.version("earthsci-ast")
        except importlib.metadata.PackageNotFoundError:   # pragma: no cover - earthsci-ast is a dependency
            ast_version = "none"
        _DEPS.append((numba.__version__, np.__version__, str(ast_version)))
    return _DEPS[0]


def content_hash(*parts: str) -> str:
    """A build product's key: SHA-256 over ``parts``, the esmjac version,
    the versions of Numba, NumPy and earthsci-ast, and the hash of the
    modules that compute products (:func:`code_version`)."""
    h = hashlib.sha256()
    for s in (__version__, *_dep_versions(), code_version(), *parts):
        h.update(s.encode())
        h.update(b"\0")
    return h.hexdigest()


def kernel_key(*parts: str) -> str:
    """A compiled kernel's key: SHA-256 over ``parts`` (a generated module's
    source, which names the esmjac version in its header, or a tape's
    digest), :data:`KERNEL_FORMAT`, the Numba and NumPy versions and the hash
    of :data:`KERNEL_CODE` — and nothing else of esmjac's source, so an
    unrelated edit reuses every compiled kernel."""
    h = hashlib.sha256()
    for s in ("kernel", str(KERNEL_FORMAT), *_dep_versions()[:2], _code_hash(KERNEL_CODE), *parts):
        h.update(s.encode())
        h.update(b"\0")
    return h.hexdigest()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ------------------------------------------------------------------ documents

def _expand_ref(ref: str) -> str:
    try:
        from earthsci_ast.json_walk import expand_ref_env
        return expand_ref_env(ref)
    except ImportError:         # pragma: no cover - earthsci-ast is a dependency
        return ref


def dependency_files(doc: Any, base: Path) -> list | None:
    """``[(path, sha256)]`` of every local file ``doc`` pulls in through a
    ``ref`` (recursively, each relative to the file that names it), or None
    when a ref is a URL (remote content cannot be keyed: no caching)."""
    seen: dict = {}
    todo = [(doc, base)]
    while todo:
        d, b = todo.pop()
        for ref in ref_strings(d):
            ref = _expand_ref(ref)
            if "://" in ref:
                return None
            p = Path(os.path.normpath(os.path.join(str(b), ref)))
            try:
                key = str(p.resolve()) if p.exists() else str(p)
            except (OSError, RuntimeError):
                key = str(p)
            if key in seen:
                continue            # each file once: a cycle of refs ends here
            try:
                data = _read_file(p, document_limit())
            except OSError:
                data = None         # missing, not a regular file or too large: the load refuses it
            seen[key] = _sha(data) if data is not None else "missing"
            if data is not None:
                try:
                    todo.append((json.loads(data), p.parent))
                except (ValueError, RecursionError):
                    pass            # not JSON (or too deep): hashed, nothing further to follow
    return sorted(seen.items())


#: (source, its :func:`_document`) inside :func:`one_document`'s block.
_ONE: contextvars.ContextVar = contextvars.ContextVar("esmjac_one_document", default=None)


@contextlib.contextmanager
def one_document(source: Any):
    """Within the block (one thread's, or a task's), ``source`` — the same
    object — is read and serialized for its keys once, not once per key:
    a caller that builds several products of one document (the Rosenbrock
    leaf: whether it reads ``t``, its RHS and its Jacobian; each key of a
    272-species dict dumps 2.3 MB of JSON) and holds it unchanged meanwhile."""
    token = _ONE.set([source, None])
    try:
        yield
    finally:
        _ONE.reset(token)


def _document(source: Any) -> tuple[bytes, Any, Path] | None:
    """(bytes, JSON tree or None, base folder) of a document given as a
    path, JSON text or dict; None when it cannot be keyed."""
    one = _ONE.get()
    if one is not None and one[0] is source:
        if one[1] is None:
            one[1] = (_read_document(source),)
        return one[1][0]
    return _read_document(source)


def _read_document(source: Any) -> tuple[bytes, Any, Path] | None:
    if isinstance(source, (str, os.PathLike)) and not str(source).lstrip().startswith("{"):
        p = Path(source)
        try:
            data = _read_file(p, document_limit())
            base = p.resolve().parent
        except (OSError, RuntimeError, ValueError):
            return None             # not keyed: the load says why (missing, a device, too large)
    elif isinstance(source, str):
        data, base = source.encode(), Path.cwd()
    elif isinstance(source, dict):
        try:
            data = json.dumps(source, sort_keys=True, allow_nan=True).encode()
        except (TypeError, ValueError):
            return None
        return data, source, Path.cwd()      # serializable (just dumped): walked as it is
    else:
        return None
    try:
        tree = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        tree = None                 # not JSON (or too deep): the build will say why; no refs to follow
    return data, tree, base


#: What a document's text alone decides, by its SHA-256 (a few documents:
#: one build keys its document three or four times, and each walk of a
#: 272-species document's tree costs ≈ 0.1–0.3 s): whether it has a ``ref``
#: key (without one its dependency list is empty whatever the files hold;
#: with one, they are read and hashed again for every key), and per index
#: set the grid-free facts (:func:`grid_free_key`).
_FACTS: dict = {}


def _facts(data: bytes, tree: Any, dumped: bool) -> tuple[str, dict]:
    """(SHA-256 of ``data``, its facts): ``refs`` is whether the parse of
    ``data`` has a ``ref`` key — for text this module dumped (``dumped``:
    ``json.dumps`` spells every key literally) whether ``"ref"`` occurs in
    it at all, else a walk of the parsed ``tree``."""
    digest = _sha(data)
    with _LOCK:
        f = _FACTS.get(digest)
        if f is None:
            while len(_FACTS) >= 4:
                _FACTS.pop(next(iter(_FACTS)))
            f = _FACTS[digest] = {}
    if "refs" not in f:
        f["refs"] = tree is not None and (b'"ref"' in data if dumped else bool(ref_strings(tree)))
    return digest, f


def _keyed(digest: str, tree: Any, base: Path, extra: tuple, facts: dict) -> tuple | None:
    deps = dependency_files(tree, base) if facts["refs"] else []
    if deps is None:
        return None
    parts = [digest] + [f"{p}={h}" for p, h in deps] + list(extra)
    return content_hash(*parts), deps


def document_key(source: Any, *extra: str) -> tuple | None:
    """(content key, dependency list) of a document given as a path, JSON
    text or dict, or None when it cannot be keyed (a live object, a URL
    ref). The key covers the document, every file it pulls in, ``extra``
    and the esmjac/Numba/code versions."""
    d = _document(source)
    if d is None:
        return None
    digest, facts = _facts(d[0], d[1], isinstance(source, dict))
    return _keyed(digest, d[1], d[2], extra, facts)


def _whole_set_ranges(tree: Any, name: str) -> bool:
    """Whether every ``ranges`` entry of a document runs over the whole
    index set ``name`` (``{"from": name}``): explicit bounds may depend on
    the set's size, so such a document keeps its size in its key."""
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            r = x.get("ranges")
            if r is not None:
                if not isinstance(r, dict) or any(v != {"from": name} for v in r.values()):
                    return False
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):       # (a dict source's tuples dump as lists)
            stack.extend(x)
    return True


def grid_free_key(source: Any, *extra: str) -> tuple | None:
    """(key, dependency list, index set, size) of a document with exactly
    one index set of an integer size: the key covers everything
    :func:`document_key` does except that size, so the same document at any
    size has one key. None for other documents, and for documents with a
    range other than the whole set (explicit bounds may follow the size).
    (Whether a build of it is the same at every size is the caller's to
    check: a cell program is.)"""
    d = _document(source)
    if d is None or not isinstance(d[1], dict):
        return None
    data, tree, base = d
    sets = tree.get("index_sets")
    if not isinstance(sets, dict) or len(sets) != 1:
        return None
    (name, spec), = sets.items()
    size = spec.get("size") if isinstance(spec, dict) else None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return None
    _, facts = _facts(data, tree, isinstance(source, dict))
    ndigest = facts.get(("grid-free", name))       # (the text decides both)
    if ndigest is None:
        if not _whole_set_ranges(tree, name):
            ndigest = facts[("grid-free", name)] = ""
        else:
            norm = dict(tree)
            norm["index_sets"] = {name: {**spec, "size": None}}
            try:
                ndigest = _sha(json.dumps(norm, sort_keys=True, allow_nan=True).encode())
            except (TypeError, ValueError):
                ndigest = ""
            facts[("grid-free", name)] = ndigest
    if not ndigest:
        return None
    k = _keyed(ndigest, tree, base, ("grid-free", str(name)) + extra, facts)
    return None if k is None else (k[0], k[1], str(name), size)


# ------------------------------------------------------------------ signatures

_SECRET: list = []            # this process's signing key (read or created once)
_SIG = ".sig"


def _secret_path() -> Path:
    """Where the per-user signing secret lives: ``$ESMJAC_SECRET_FILE`` (for
    tests), else ``$XDG_CONFIG_HOME/esmjac/secret``, else
    ``~/.config/esmjac/secret`` — outside any cache folder."""
    env = os.environ.get("ESMJAC_SECRET_FILE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return (Path(xdg) if xdg else Path.home() / ".config") / "esmjac" / "secret"


def _read_secret(path: Path) -> bytes | None:
    """The secret in ``path`` if it is a regular file of this user that no
    one else can read or write, else None (``FileNotFoundError`` when absent)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) \
                or st.st_mode & 0o077 or not 32 <= st.st_size <= 4096:
            return None
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    return data if len(data) >= 32 else None


def _create_secret(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, os.urandom(32))
        os.fsync(fd)
    finally:
        os.close(fd)


def _within(p: Path, folder: Path) -> bool:
    try:
        p.resolve().relative_to(folder.resolve())
        return True
    except (ValueError, OSError):
        return False


def _signing_key() -> bytes:
    """This user's secret (created ``0600`` on first use), or — when it
    cannot be read or created safely, or lies inside the cache folder — a
    random key for this process only (a warning says so): then nothing
    another process wrote verifies, and every entry is rebuilt."""
    if _SECRET:
        return _SECRET[0]
    with _LOCK:
        if _SECRET:
            return _SECRET[0]
        path = _secret_path()
        key, why = None, ""
        if _within(path, _configured()):
            why = "it lies inside the cache folder"
        else:
            for attempt in range(3):
                try:
                    key = _read_secret(path)
                    if key is None and attempt < 2:
                        time.sleep(0.1)     # another process may be between creating and writing it
                        continue
                    if key is None:
                        why = "it is not a private file of this user of 32+ bytes (want mode 0600)"
                    break
                except FileNotFoundError:
                    try:
                        _create_secret(path)
                    except FileExistsError:
                        continue            # another process created it: read that one
                    except OSError as exc:
                        why = f"it cannot be created ({exc.strerror or exc})"
                        break
                except OSError as exc:
                    why = f"it cannot be read ({exc.strerror or exc})"
                    break
        if key is None:
            _warn_once(f"secret:{path}", f"esmjac cannot use its signing secret {path}: {why}; cached "
                       "builds are verified with a key of this process only, so nothing cached by "
                       "another process is reused. Remove or fix that file (or set "
                       "ESMJAC_SECRET_FILE) to reuse builds.")
            key = os.urandom(32)
        _SECRET.append(key)
        return key


def _sign(name: str, data: bytes) -> str:
    """HMAC-SHA256 of a cache file's name and bytes under this user's key:
    only someone holding the secret can produce it, and an entry signed
    for one name does not verify under another."""
    return hmac.new(_signing_key(), name.encode() + b"\0" + data, hashlib.sha256).hexdigest()


# ------------------------------------------------------------------ files

def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)       # atomic: concurrent writers agree on one complete file
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path`` if it is a regular file (no link followed: a
    cache entry pointing at ``/dev/zero`` or a FIFO is refused) of at most
    ``limit`` bytes (default: the memory limit), else ``OSError``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        cap = workspace_limit() if limit is None else limit
        if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
            raise OSError(f"not a regular file of at most {cap} bytes")
        with os.fdopen(os.dup(fd), "rb") as fh:
            data = fh.read(cap + 1)
    finally:
        os.close(fd)
    if len(data) > cap:
        raise OSError(f"larger than {cap} bytes")
    return data


def _write_verified(path: Path, data: bytes) -> None:
    """``path`` and its signature ``.sig`` beside it (written last)."""
    _write_atomic(path, data)
    _write_atomic(path.with_name(path.name + _SIG), _sign(path.name, data).encode())


def _read_verified(path: Path) -> bytes | None:
    """The bytes of ``path`` if its signature verifies, else None (and the
    entry is removed: a damaged or forged file is a logged cache miss and a
    rebuild, never a lasting error and never used)."""
    side = path.with_name(path.name + _SIG)
    try:
        data = _read_file(path)
        want = _read_file(side, 1024).strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("esmjac cache: cannot read %s (%s); rebuilding", path, exc)
        return None
    if not hmac.compare_digest(_sign(path.name, data).encode(), want):
        time.sleep(0.05)            # a concurrent writer may be between the file and its signature
        try:
            data, want = _read_file(path), _read_file(side, 1024).strip()
        except OSError:
            return None
    if not hmac.compare_digest(_sign(path.name, data).encode(), want):
        log.warning("esmjac cache: %s does not carry this user's signature (damaged, or written by "
                    "someone else); discarding it and rebuilding", path)
        _remove(path, side)
        return None
    return data


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except OSError:
            pass


# ------------------------------------------------------------------ kernel modules

def module_name(key: str) -> str:
    """The name a kernel module of content hash ``key`` is imported under."""
    return f"esmjac_k{key[:40]}"


def load_source(source: str, key: str | None = None):
    """Import ``source`` as a module stored under its content hash.

    The file on disk must equal ``source`` byte for byte (else it is
    rewritten); the module enters ``sys.modules`` only after it has fully
    executed (Numba's cache needs it there before the first call compiles)."""
    key = key or kernel_key(source)
    modname = module_name(key)
    memo = (os.environ.get("ESMJAC_CACHE_DIR"), modname)
    mod = _LOADED.get(memo)
    if mod is not None:          # the per-call path: no file-system access, no lock
        return mod
    with _LOCK:
        mod = _LOADED.get(memo)
        if mod is not None:
            return mod
        path = _kernel_file(source, key)
        mod = sys.modules.get(modname)
        if mod is None:
            mod = _exec_source(modname, source, path)
            sys.modules[modname] = mod
        _LOADED[memo] = mod
        return mod


def _exec_source(modname: str, source: str, path: Path) -> ModuleType:
    """A module executed from ``source`` itself — the text the caller holds
    and the file was checked against — compiled here and never imported from
    ``path``: no bytecode file beside it (``__pycache__/*.pyc``, which an
    import would prefer when its stamp matches) can stand in for it. The
    functions' ``co_filename`` is ``path``, where Numba keys its cache."""
    mod = ModuleType(modname)
    mod.__file__ = str(path)
    code = compile(source, str(path), "exec", dont_inherit=True)
    exec(code, mod.__dict__)            # noqa: S102 - the verified, generated source
    return mod


def _kernel_file(source: str, key: str) -> Path:
    data = source.encode()
    for attempt in range(2):
        d = kernel_dir() if attempt == 0 else _private_dir()
        path = d / f"k{key[:40]}.py"
        try:
            if path.exists() or path.is_symlink():
                if _read_verified(path) == data:
                    return path
                log.warning("esmjac cache: %s differs from the generated source or is not signed by "
                            "this user; rewriting it", path)
                purge_numba_cache(path)
            _write_verified(path, data)
            return path
        except OSError as exc:
            if attempt:
                raise JacError("cache_error", f"cannot write the kernel module {path}: {exc}; set "
                               "ESMJAC_CACHE_DIR to a writable folder") from exc
            _warn_once(f"write:{d}", f"esmjac cannot write to its cache folder {d} ({exc}); "
                       "building in memory for this process")
    raise AssertionError("unreachable")


def purge_numba_cache(module_file: Path) -> None:
    """Remove Numba's cache files of one kernel module (index and data)."""
    pyc = module_file.parent / "__pycache__"
    stem = module_file.stem + "."
    try:
        for f in pyc.iterdir():
            if f.name.startswith(stem) and f.suffix in (".nbi", ".nbc"):
                _remove(f)
    except OSError:
        pass


def numba_cache_failure(exc: BaseException):
    """Numba's cache file object (``numba.core.caching.IndexDataCacheFile``)
    whose index or data failed to load in ``exc`` (a truncated, unreadable or
    tampered ``.nbi``/``.nbc``), else None. The innermost one: a kernel that
    calls a helper compiles the helper inside its own compile, and it is the
    helper's file that failed (purging the caller's instead, as before,
    left the broken file in place and the build failing)."""
    tb = exc.__traceback__
    found = None
    while tb is not None:
        fr = tb.tb_frame
        fn = fr.f_code.co_filename.replace("\\", "/")
        if fn.endswith("numba/core/caching.py"):
            s = fr.f_locals.get("self")
            if s is not None and hasattr(s, "_index_path") and hasattr(s, "_cache_path"):
                found = s
            elif s is not None and hasattr(getattr(s, "_cache_file", None), "_index_path"):
                found = s._cache_file
        tb = tb.tb_next
    return found


def recover_numba_cache(exc: BaseException) -> bool:
    """Purge the broken Numba cache entry named by ``exc`` (its index and
    data files), with a warning naming the file; True if one was removed
    (the caller then retries, and Numba recompiles that function)."""
    cf = numba_cache_failure(exc)
    if cf is None:
        return False
    try:
        path = Path(cf._cache_path)
        index = Path(cf._index_path)
        stem = Path(cf._index_name).stem + "."
    except (AttributeError, TypeError):
        return False                          # a Numba whose cache we cannot purge: not ours to retry
    removed = []
    try:
        for f in path.iterdir():
            if f.name.startswith(stem) and f.suffix in (".nbi", ".nbc"):
                _remove(f)
                removed.append(f.name)
    except OSError:
        return False
    if removed:
        msg = (f"esmjac: Numba's cache file {index} could not be read ({type(exc).__name__}: {exc}); "
               f"removed it ({', '.join(sorted(removed))}) and recompiling")
        log.warning("%s", msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)
    return bool(removed)


# ------------------------------------------------------------------ products

class _Unstorable(Exception):
    """A value the product format does not represent (the build is then not cached)."""


class _Corrupt(Exception):
    """A stored product that does not decode (a cache miss)."""


def _encode(obj: Any, types: dict, skip: dict) -> tuple:
    """(JSON-ready tree, arrays) of ``obj`` (see module docstring)."""
    arrays: list = []
    nodes: list = []
    ids: dict = {}
    names = {cls: name for name, cls in types.items()}

    def add_nodes(root) -> None:            # iterative post-order: children get ids first
        stack = [(root, False)]
        while stack:
            x, done = stack.pop()
            if not isinstance(x, Node) or id(x) in ids:
                continue
            if done:
                ids[id(x)] = len(nodes)
                nodes.append([x.op, enc(x.args), enc(x.body), enc(x.extra)])
                continue
            stack.append((x, True))
            for c in iter_children(x):
                if isinstance(c, Node) and id(c) not in ids:
                    stack.append((c, False))

    def enc(x):
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int) and type(x) is int:
            return x
        if isinstance(x, float) and type(x) is float:
            return x if math.isfinite(x) else {"f": repr(x)}
        if isinstance(x, Node):
            if id(x) not in ids:
                add_nodes(x)
            return {"n": ids[id(x)]}
        if isinstance(x, _FDict):
            return {"fd": [[k, enc(v)] for k, v in x]}
        if isinstance(x, FrozenMap):
            return {"fm": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, tuple):
            return {"t": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            return {"d": [[enc(k), enc(v)] for k, v in x.items()]}
        if isinstance(x, frozenset):
            return {"fs": [enc(v) for v in sorted(x, key=repr)]}
        if isinstance(x, np.ndarray):
            if x.dtype.hasobject or x.dtype.fields is not None:
                raise _Unstorable(f"array of dtype {x.dtype}")
            arrays.append(x)
            return {"a": len(arrays) - 1, "w": bool(x.flags.writeable)}
        if isinstance(x, np.generic):
            return {"g": x.dtype.str, "v": enc(x.item())}
        if isinstance(x, np.dtype):
            return {"dt": x.str}
        name = names.get(type(x))
        if name is not None and dataclasses.is_dataclass(x):
            omit = skip.get(name, ())
            return {"c": name, "f": {f.name: enc(getattr(x, f.name))
                                     for f in dataclasses.fields(x) if f.name not in omit}}
        raise _Unstorable(f"a {type(x).__name__}")

    body = enc(obj)
    return {"nodes": nodes, "body": body}, arrays


def _decode(tree: dict, arrays, types: dict) -> Any:
    built: list = []

    def dec(x):
        if x is None or isinstance(x, (bool, str, int, float)):
            return x
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict) or len(x) not in (1, 2):
            raise _Corrupt("unexpected value")
        if "n" in x:
            i = x["n"]
            if not isinstance(i, int) or not 0 <= i < len(built):
                raise _Corrupt("node reference out of order")
            return built[i]
        if "t" in x:
            return tuple(dec(v) for v in x["t"])
        if "fd" in x:
            return _FDict((str(k), dec(v)) for k, v in x["fd"])
        if "fm" in x:
            return FrozenMap((_key(dec(k)), dec(v)) for k, v in x["fm"])
        if "d" in x:
            return {_key(dec(k)): dec(v) for k, v in x["d"]}
        if "fs" in x:
            return frozenset(_key(dec(v)) for v in x["fs"])
        if "f" in x and "c" not in x:
            if x["f"] not in ("nan", "inf", "-inf"):
                raise _Corrupt("bad float")
            return float(x["f"])
        if "a" in x:
            a = arrays[f"a{int(x['a'])}"]
            if a.dtype.hasobject:
                raise _Corrupt("object array")
            a = np.array(a)
            a.flags.writeable = bool(x.get("w", False))
            return a
        if "g" in x:
            dt = np.dtype(str(x["g"]))
            if dt.hasobject:
                raise _Corrupt("object scalar")
            return dt.type(dec(x["v"]))
        if "dt" in x:
            dt = np.dtype(str(x["dt"]))
            if dt.hasobject:
                raise _Corrupt("object dtype")
            return dt
        if "c" in x:
            cls = types.get(x["c"])
            if cls is None:
                raise _Corrupt(f"type {x['c']!r} is not a build product type")
            vals = x["f"]
            if not isinstance(vals, dict):
                raise _Corrupt("bad fields")
            known = {f.name: f for f in dataclasses.fields(cls)}
            if set(vals) - set(known):
                raise _Corrupt(f"unknown fields of {x['c']}")
            obj = object.__new__(cls)
            for name, f in known.items():
                if name in vals:
                    v = dec(vals[name])
                elif f.default is not dataclasses.MISSING:
                    v = f.default
                elif f.default_factory is not dataclasses.MISSING:
                    v = f.default_factory()
                else:
                    v = None                  # rebuilt by the caller
                object.__setattr__(obj, name, v)
            return obj
        raise _Corrupt("unknown tag")

    def _key(k):
        if isinstance(k, list):
            raise _Corrupt("unhashable key")
        return k

    for row in tree["nodes"]:
        op, args, body, extra = row
        if not isinstance(op, str):
            raise _Corrupt("bad node")
        built.append(node(op, dec(args), dec(body), **dict(dec(extra))))
    return dec(tree["body"])


def store_product(key: str, obj: Any, deps: list, types: dict, skip: dict | None = None) -> bool:
    """Write ``obj`` under ``key`` (JSON + npz, hashes beside). False (and
    nothing written) when ``obj`` holds something the format does not
    represent, or the folder cannot be written (then a warning)."""
    try:
        tree, arrays = run_deep(_encode, obj, types, skip or {})
    except _Unstorable as exc:
        log.info("esmjac cache: build product not stored (%s)", exc)
        return False
    buf = io.BytesIO()
    np.savez(buf, **{f"a{i}": a for i, a in enumerate(arrays)})
    npz = buf.getvalue()
    doc = {"esmjac_product": PRODUCT_FORMAT, "key": key, "deps": deps, "npz": _sha(npz), **tree}
    data = json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()
    d = cache_dir()
    stem = d / f"b{key[:40]}"
    try:
        with _LOCK:
            _write_verified(stem.with_suffix(".npz"), npz)
            _write_verified(stem.with_suffix(".json"), data)
    except FileNotFoundError:
        _warn_once(f"gone:{d}", f"the esmjac cache folder {d} disappeared during a build; the result "
                   "is used but not stored")
        return False
    except OSError as exc:
        _warn_once(f"write:{d}", f"esmjac cannot write to its cache folder {d} ({exc}); the result is "
                   "used but not stored")
        return False
    return True


def _discard(key: str) -> None:
    stem = cache_dir() / f"b{key[:40]}"
    with _LOCK:
        for p in (stem.with_suffix(".json"), stem.with_suffix(".npz")):
            _remove(p, p.with_name(p.name + _SIG))


def _read_entry(key: str, check_deps: bool) -> tuple[dict, bytes] | None:
    """(parsed JSON, npz bytes) of the entry under ``key``, both verified
    against their stored hashes, or None (a logged miss; corrupt files removed)."""
    stem = cache_dir() / f"b{key[:40]}"
    jpath, npath = stem.with_suffix(".json"), stem.with_suffix(".npz")
    data = _read_verified(jpath)
    if data is None:
        return None
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("esmjac_product") != PRODUCT_FORMAT or doc.get("key") != key:
            raise _Corrupt("written for another key or format")
        if check_deps:
            for p, h in doc.get("deps", []):
                try:
                    now = _sha(_read_file(Path(p), document_limit()))
                except OSError:
                    now = "missing"
                if now != h:
                    log.info("esmjac cache: %s changed since %s was stored; rebuilding", p, jpath.name)
                    return None
        npz = _read_verified(npath)
        if npz is None or _sha(npz) != doc.get("npz"):
            raise _Corrupt("array file missing or mismatched")
        return doc, npz
    except Exception as exc:
        log.warning("esmjac cache: discarding %s (%s: %s); rebuilding", jpath, type(exc).__name__, exc)
        _discard(key)
        return None


def _decode_entry(doc: dict, npz: bytes, types: dict) -> Any:
    with np.load(io.BytesIO(npz), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return run_deep(_decode, doc, arrays, types)


def load_product(key: str, types: dict) -> Any | None:
    """The product stored under ``key``, or None (missing, corrupt, stale or
    from another key: each a logged cache miss; corrupt files are removed)."""
    entry = _read_entry(key, check_deps=True)
    if entry is None:
        return None
    try:
        return _decode_entry(*entry, types)
    except Exception as exc:        # any failure to decode is a miss, never a lasting error
        log.warning("esmjac cache: discarding b%s (%s: %s); rebuilding", key[:40], type(exc).__name__, exc)
        _discard(key)
        return None


class StoredProduct:
    """A product read and verified now, decoded on first :meth:`get` (the
    expression DAG of a cached program: calls that never need it never pay
    for decoding it). The bytes are held in memory, so what is decoded is
    what was verified, whatever happens to the file meanwhile."""

    def __init__(self, key: str, data: bytes, npz: bytes, types: dict):
        self._key, self._types = key, types
        self._raw: tuple[bytes, bytes] | None = (data, npz)
        self._value: list = []
        self._lock = threading.Lock()

    def get(self) -> Any:
        """The decoded product; ``cache_error`` (and the entry removed, so
        the next build rebuilds it) when verified bytes do not decode."""
        if self._value:
            return self._value[0]
        with self._lock:
            if not self._value:
                try:
                    assert self._raw is not None       # held until the first decode succeeds
                    data, npz = self._raw
                    doc = json.loads(data)
                    if not isinstance(doc, dict) or doc.get("esmjac_product") != PRODUCT_FORMAT \
                            or doc.get("key") != self._key or doc.get("npz") != _sha(npz):
                        raise _Corrupt("written for another key or format, or its arrays mismatched")
                    self._value.append(_decode_entry(doc, npz, self._types))
                except Exception as exc:
                    _discard(self._key)
                    raise JacError("cache_error", f"the cached expression document b{self._key[:40]} in "
                                   f"{cache_dir()} does not decode ({type(exc).__name__}: {exc}); it was "
                                   "removed: build the program again") from exc
                self._raw = None
        return self._value[0]


def read_product(key: str, types: dict) -> StoredProduct | None:
    """The entry under ``key``, its files checked against their stored
    hashes now, parsed and decoded on first use (:class:`StoredProduct`);
    None when a file is missing or fails its hash (a miss). No dependency
    check: the caller's core entry, stored with it, made that."""
    stem = cache_dir() / f"b{key[:40]}"
    data = _read_verified(stem.with_suffix(".json"))
    npz = _read_verified(stem.with_suffix(".npz")) if data is not None else None
    return None if data is None or npz is None else StoredProduct(key, data, npz, types)


def _schema_key(digest: str) -> str:
    return content_hash("schema-pass", digest)


def schema_passed(digest: str) -> bool:
    """Whether this user's esmjac recorded (a signed entry) that the
    instance with ``digest`` passed earthsci-ast's schema pass
    (:mod:`esmjac.model.schema`)."""
    hit = load_product(_schema_key(digest), {})
    return isinstance(hit, dict) and hit.get("schema_passed") == digest


def record_schema_pass(digest: str) -> None:
    """Record (signed) that the instance with ``digest`` passed the schema pass."""
    store_product(_schema_key(digest), {"schema_passed": digest}, [], {})


def discard_product(key: str) -> None:
    """Remove the entry under ``key`` (a product that failed validation)."""
    _discard(key)
