"""Numba compiles seen from inside a fresh process.

:data:`SPY` is Python source to put at the top of a child's code (see
``tests/support/child.py``): it records every call of a Numba dispatcher
that finds no compiled version for its argument types (a new
specialization: compiled, or loaded from Numba's cache), and defines
``compiled()``, which returns the names recorded since its last call. A
build promises that the first calls after it compile nothing: the tests
call ``compiled()`` after the build (to reset it) and expect ``[]`` after
each later phase."""
from __future__ import annotations

__all__ = ["SPY"]

SPY = r'''
from numba.core.dispatcher import Dispatcher as _Dispatcher

_NEW = []
_orig_compile = _Dispatcher._compile_for_args


def _spy(self, *args, **kws):
    _NEW.append(getattr(self, "py_func", self).__qualname__)
    return _orig_compile(self, *args, **kws)


_Dispatcher._compile_for_args = _spy

from numba.core import sigutils as _sigutils

_orig_dcompile = _Dispatcher.compile


def _spy_compile(self, sig):
    # a compile by signature (a tiled chunk's tile function is compiled by
    # its address, compile/tilecall.py: no _compile_for_args); an overload
    # the dispatcher already holds is no new specialization
    args, _ = _sigutils.normalize_signature(sig)
    if tuple(args) not in self.overloads:
        _NEW.append(getattr(self, "py_func", self).__qualname__)
    return _orig_dcompile(self, sig)


_Dispatcher.compile = _spy_compile


def compiled():
    out = sorted(set(_NEW))
    _NEW.clear()
    return out
'''
