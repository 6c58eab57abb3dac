"""Immutable containers for build products (a leaf module).

Programs and plans are shared between threads and cached on disk; nothing
they hold may change after construction. :class:`FrozenMap` is a read-only
mapping that still pickles (``types.MappingProxyType`` does not), and
:func:`readonly` makes an array (or every array in a mapping) read-only.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["FrozenMap", "readonly", "ro", "frozen_arrays"]


class FrozenMap(Mapping):
    """A read-only ``dict`` (insertion order kept; no item assignment)."""

    __slots__ = ("_d",)
    _d: dict[Any, Any]

    def __init__(self, *args, **kwargs):
        object.__setattr__(self, "_d", dict(*args, **kwargs))

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __setattr__(self, name, value):
        raise AttributeError("a FrozenMap is immutable")

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Mapping) and dict(self._d) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(self._d.items()))

    def __reduce__(self):
        return (FrozenMap, (self._d,))


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the caller's own flags are left alone)."""
    v = np.asarray(a).view()
    v.setflags(write=False)
    return v


def ro(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it is read-only, else a read-only view: the one
    flavour compiled kernels take their input arrays in. Numba compiles a
    separate specialization per writability (of the kernel and of every
    jitted function it calls), so inputs passed as they come — a
    program's read-only ``p0`` in one call, a caller's writable array in
    the next — compiled every kernel twice."""
    return readonly(a) if a.flags.writeable else a


def frozen_arrays(d: Mapping[str, Any]) -> FrozenMap:
    """A :class:`FrozenMap` of ``d`` with every array read-only and every
    list a tuple (metadata of a build product)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, np.ndarray):
            v = readonly(v)
        elif isinstance(v, list):
            v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        elif isinstance(v, dict):
            v = frozen_arrays(v)
        out[k] = v
    return FrozenMap(out)
