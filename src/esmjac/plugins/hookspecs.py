"""Hook specifications for esmjac solver adapters (pluggy, project ``"esmjac"``).

An *adapter* plugs esmjac's Jacobians into an ODE/DAE solver. Every adapter
is a plain module (or object) with :data:`hookimpl`-marked functions,
registered through the ``esmjac.adapters`` entry-point group -- the built-in
adapters exactly as third-party ones::

    [project.entry-points."esmjac.adapters"]
    mysolver = "mypackage.esmjac_adapter"

Adapters offer one or more *kinds* (dotted names such as ``"scipy.ivp"``);
:func:`esmjac.plugins.create` finds the adapter that provides a kind and
asks it for the solver-facing object. Adapters must import their solver
package lazily, inside the factory, never at module import time.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from typing import Any

import pluggy

__all__ = ["hookspec", "hookimpl", "AdapterInfo", "esmjac_adapter_info", "esmjac_create"]

#: Marks a function as an esmjac hook specification.
hookspec = pluggy.HookspecMarker("esmjac")
#: Marks a function in an adapter module as an esmjac hook implementation.
hookimpl = pluggy.HookimplMarker("esmjac")


@dataclass(frozen=True)
class AdapterInfo:
    """What an adapter plugin is and whether it can be used here.

    ``name``      short adapter name, e.g. ``"scipy"``.
    ``version``   version of the solver package it drives (``""`` if absent).
    ``provides``  the kinds it can create, e.g. ``("sundials.cvode", "sundials.ida")``.
    ``available`` whether its solver package is installed (checked without importing it).
    ``detail``    which package/version it uses, or why it is unavailable and how to fix it.
    """

    name: str
    version: str
    provides: tuple[str, ...]
    available: bool
    detail: str


@hookspec
def esmjac_adapter_info() -> AdapterInfo:
    """Describe this adapter. Every adapter plugin must implement this hook.

    Must be cheap and must not import the solver package: use
    :func:`importlib.util.find_spec` for availability and
    :func:`importlib.metadata.version` for the version.
    """


@hookspec(firstresult=True)
def esmjac_create(kind: str, source: Any, options: dict[str, Any]) -> Any | None:
    """Create the solver-facing object for ``kind`` from ``source``.

    ``source`` is whatever the caller passed (an ``.esm`` path, a
    :class:`esmjac.BandSet`, ...); ``options`` are the keyword options given
    to :func:`esmjac.plugins.create`. The adapter that provides ``kind``
    returns the object (the first non-``None`` result wins); every other
    adapter must return ``None``. :func:`esmjac.plugins.create` refuses a
    kind whose adapter is unavailable before this hook is called, and then
    asks only the chosen adapter. Import the solver package here, lazily.
    """


def module_available(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (for
    ``esmjac_adapter_info``: solver packages are imported only when used)."""
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
