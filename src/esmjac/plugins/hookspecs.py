"""Hook specifications for esmjac solver adapters (pluggy, project ``"esmjac"``).

An *adapter* plugs esmjac's Jacobians into an ODE/DAE solver. Every adapter
is a plain module (or object) with :data:`hookimpl`-marked functions,
registered through the ``esmjac.adapters`` entry-point group -- the built-in
adapters exactly as third-party ones::

    [project.entry-points."esmjac.adapters"]
    mysolver = "mypackage.esmjac_adapter"

An adapter answers one hook, :func:`esmjac_adapter`, with an
:class:`Adapter`: its name, whether its solver package is usable here, and
a mapping *kind* → factory (kinds are dotted names such as
``"scipy.ivp"``). :func:`esmjac.plugins.create` finds the adapter whose
mapping holds a kind and calls that factory as ``factory(source,
**options)``; nothing else dispatches on kinds. Adapters must import their
solver package lazily, inside the factory, never at module import time.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pluggy

from .._frozen import FrozenMap

__all__ = ["hookspec", "hookimpl", "Adapter", "esmjac_adapter", "module_available", "dist_version"]

#: Marks a function as an esmjac hook specification.
hookspec = pluggy.HookspecMarker("esmjac")
#: Marks a function in an adapter module as an esmjac hook implementation.
hookimpl = pluggy.HookimplMarker("esmjac")


@dataclass(frozen=True)
class Adapter:
    """What an adapter plugin is, whether it can be used here, and what it makes.

    ``name``      short adapter name, e.g. ``"scipy"``.
    ``version``   version of the solver package it drives (``""`` if absent).
    ``kinds``     kind → factory, e.g. ``{"sundials.ida": ida}``; ``factory(source, **options)``.
    ``available`` whether its solver package is installed (checked without importing it).
    ``detail``    which package/version it uses, or why it is unavailable and how to fix it.
    """

    name: str
    version: str
    kinds: Mapping[str, Callable[..., Any]] = field(compare=False)
    available: bool
    detail: str

    def __post_init__(self):
        object.__setattr__(self, "kinds", FrozenMap(self.kinds))

    @property
    def provides(self) -> tuple[str, ...]:
        """The kinds this adapter creates, in its own order."""
        return tuple(self.kinds)


@hookspec
def esmjac_adapter() -> Adapter:
    """Describe this adapter and map each kind it provides to its factory.
    Every adapter plugin implements exactly this hook.

    Must be cheap and must not import the solver package: use
    :func:`module_available` for availability and :func:`dist_version`
    for the version. The factories import the solver package when called.
    """
    raise NotImplementedError   # a specification: pluggy calls the plugins' implementations


def module_available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (for
    ``esmjac_adapter``: solver packages are imported only when used)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def dist_version(dist: str) -> str:
    """Installed version of distribution ``dist``, or ``""``."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""
