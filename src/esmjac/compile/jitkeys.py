"""Numba cache keys that follow what a compiled function links in.

Numba keys a ``cache=True`` function's entry by its own file's stamp and its
own bytecode. The jitted helpers it calls from other modules (inlined or
linked into its module) and the constants it reads from them are compiled
into the entry but are not in its key: after an edit of
``compile/tape.rare_op`` a warm cache still served ``lanetape.run_fused``
with the old ``rare_op`` in it (a stale kernel; CI, always cold, cannot see
it). :func:`key_by_callees` gives a module's cached functions a key that
also holds the SHA-256 of every file their jitted callees and intrinsics
come from, transitively, and the values of the constants they read: an edit
of any of those is a cache miss, then a compile.
"""
from __future__ import annotations

import hashlib
import sys
from types import CodeType, ModuleType

import numpy as np
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher
from numba.core.extending import _Intrinsic

__all__ = ["key_by_callees", "linked_files"]

_KEYS: dict = {}


def _names(code: CodeType) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, CodeType):
            out |= _names(c)
    return out


def _closure(py_func) -> tuple[set, list]:
    """(module names, [(name, constant)]) of ``py_func`` and every jitted
    function and intrinsic it reaches through its globals (a module's
    attributes too: ``LS.step``)."""
    mods: set = set()
    consts: list = []
    seen: set = set()
    todo = [py_func]
    while todo:
        f = todo.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        mods.add(f.__module__)
        g = f.__globals__
        names = _names(f.__code__)
        for name in sorted(names):
            v = g.get(name)
            vals = [v]
            if isinstance(v, ModuleType):
                vals = [getattr(v, a, None) for a in sorted(names)]
            for x in vals:
                if isinstance(x, Dispatcher):
                    todo.append(x.py_func)
                elif isinstance(x, _Intrinsic):
                    mods.add(x._defn.__module__)
                elif isinstance(x, (bool, int, float, complex, str, bytes, tuple)) and x is not None:
                    consts.append((name, repr(x)))
                elif isinstance(x, np.ndarray):
                    consts.append((name, f"{x.dtype.str}{x.shape}" + hashlib.sha256(
                        np.ascontiguousarray(x).tobytes()).hexdigest()))
    return mods, consts


def linked_files(dispatcher) -> list[str]:
    """The source files whose bytes key ``dispatcher``'s cache entries:
    its own module's and those of every jitted function and intrinsic it
    reaches."""
    mods, _ = _closure(dispatcher.py_func)
    return sorted(f for f in (getattr(sys.modules.get(m), "__file__", None) for m in mods) if f)


def _key(py_func) -> str:
    k = _KEYS.get(py_func)
    if k is None:
        mods, consts = _closure(py_func)
        h = hashlib.sha256()
        for m in sorted(mods):
            h.update(m.encode() + b"\0")
            f = getattr(sys.modules.get(m), "__file__", None)
            try:
                with open(f, "rb") as fh:             # type: ignore[arg-type]
                    h.update(fh.read())
            except (OSError, TypeError):
                h.update(b"?")                         # no file: the module's name only
            h.update(b"\0")
        for name, v in sorted(set(consts)):
            h.update(f"{name}={v}\0".encode())
        k = _KEYS[py_func] = h.hexdigest()
    return k


class _LinkedCache(FunctionCache):
    """Numba's function cache, its index key extended by :func:`_key`."""

    def _index_key(self, sig, codegen):
        return (*super()._index_key(sig, codegen), _key(self._py_func))


def key_by_callees(namespace: dict) -> None:
    """Key the cached jitted functions defined in the module ``namespace``
    (pass ``globals()`` at the end of the module) by what they link in
    (module docstring)."""
    mod = namespace.get("__name__")
    for v in list(namespace.values()):
        if (isinstance(v, Dispatcher) and v.py_func.__module__ == mod
                and type(getattr(v, "_cache", None)) is FunctionCache):
            v._cache = _LinkedCache(v.py_func)          # type: ignore[attr-defined]
