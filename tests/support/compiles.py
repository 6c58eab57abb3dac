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


def compiled():
    out = sorted(set(_NEW))
    _NEW.clear()
    return out
'''
