"""The adapter plugin manager: discovery, listing and creation.

Adapters (see :mod:`esmjac.plugins.hookspecs`) are found only through the
``esmjac.adapters`` entry-point group; esmjac's own ``scipy``, ``sundials``
and ``native`` adapters are registered there exactly as third-party ones.
Nothing here imports a solver package: adapters import theirs lazily when
:func:`create` asks them for an object.
"""
from __future__ import annotations

import functools
from typing import Any

import pluggy

from ..errors import JacError
from . import hookspecs
from .hookspecs import Adapter

__all__ = ["ENTRY_POINT_GROUP", "plugin_manager", "adapter_infos", "create"]

#: The entry-point group adapters are registered under.
ENTRY_POINT_GROUP = "esmjac.adapters"


@functools.cache
def plugin_manager() -> pluggy.PluginManager:
    """The (cached) plugin manager with every installed adapter registered.

    ``plugin_manager.cache_clear()`` forces a fresh discovery, e.g. after
    installing an adapter in the running process.
    """
    pm = pluggy.PluginManager("esmjac")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


def _adapters() -> list[Adapter]:
    """Every registered adapter, in hook-call order (later-registered first)."""
    out = []
    for impl in reversed(plugin_manager().hook.esmjac_adapter.get_hookimpls()):
        info = impl.function()
        if not isinstance(info, Adapter):
            raise TypeError(
                f"esmjac adapter {impl.plugin_name!r}: esmjac_adapter returned "
                f"{type(info).__name__}, not Adapter")
        out.append(info)
    return out


def adapter_infos() -> list[Adapter]:
    """Every installed adapter, sorted by name."""
    return sorted(_adapters(), key=lambda a: (a.name, a.provides))


def _kinds(adapters) -> list[str]:
    return sorted({k for a in adapters for k in a.kinds})


def create(kind: str, source: Any, **options: Any) -> Any:
    """Create the solver-facing object of ``kind`` (e.g. ``"scipy.ivp"``) for ``source``.

    The latest-registered usable provider's factory is called.

    Parameters
    ----------
    kind : str
        An adapter kind, ``"<adapter>.<factory>"``: ``"scipy.ivp"``,
        ``"sundials.cvode"``, ``"native.rosenbrock"``... (``esmjac
        adapters`` lists those installed).
    source : str, os.PathLike or dict
        An ``.esm`` path, a document dict or its JSON text.
    **options
        The factory's own options.

    Returns
    -------
    object
        What the factory returns (an ``IvpProblem``, a ``SundialsProblem``,
        a ``RosenbrockLeaf``...).

    Raises
    ------
    JacError
        ``bad_option`` when no installed adapter provides ``kind``;
        ``adapter_unavailable`` when the adapter that provides it cannot be
        used here (its solver package is missing).
    """
    adapters = _adapters()
    providers = [a for a in adapters if kind in a.kinds]
    if not providers:
        kinds = _kinds(adapters)
        raise JacError("bad_option",
                       f"no installed adapter provides kind {kind!r}; installed kinds: "
                       f"{', '.join(kinds) if kinds else '(none)'}")
    usable = [a for a in providers if a.available]
    if not usable:
        alternatives = _kinds(a for a in adapters if a.available)
        details = "; ".join(f"{a.name}: {a.detail}" for a in providers)
        raise JacError("adapter_unavailable",
                       f"kind {kind!r} is provided by an adapter that is unavailable here "
                       f"({details}); available kinds: "
                       f"{', '.join(alternatives) if alternatives else '(none)'}")
    return usable[0].kinds[kind](source, **options)
