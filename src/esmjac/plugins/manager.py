"""The adapter plugin manager: discovery, listing and creation.

Adapters (see :mod:`esmjac.hookspecs`) are found only through the
``esmjac.adapters`` entry-point group; esmjac's own ``scipy``, ``sundials``
and ``native`` adapters are registered there exactly as third-party ones.
Nothing here imports a solver package: adapters import theirs lazily when
:func:`create` asks them for an object.
"""
from __future__ import annotations

import functools
from typing import Any

import pluggy

from . import hookspecs
from ..errors import JacError
from .hookspecs import AdapterInfo

__all__ = ["ENTRY_POINT_GROUP", "plugin_manager", "adapter_infos", "create"]

#: The entry-point group adapters are registered under.
ENTRY_POINT_GROUP = "esmjac.adapters"


@functools.lru_cache(maxsize=None)
def plugin_manager() -> pluggy.PluginManager:
    """The (cached) plugin manager with every installed adapter registered.

    ``plugin_manager.cache_clear()`` forces a fresh discovery, e.g. after
    installing an adapter in the running process.
    """
    pm = pluggy.PluginManager("esmjac")
    pm.add_hookspecs(hookspecs)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    return pm


def _plugin_infos() -> list[tuple[object, AdapterInfo]]:
    """(plugin, info) for every registered adapter, in hook-call order."""
    pm = plugin_manager()
    out = []
    # Hook-call order: later-registered implementations first.
    for impl in reversed(pm.hook.esmjac_adapter_info.get_hookimpls()):
        info = impl.function()
        if not isinstance(info, AdapterInfo):
            raise TypeError(
                f"esmjac adapter {impl.plugin_name!r}: esmjac_adapter_info returned "
                f"{type(info).__name__}, not AdapterInfo")
        out.append((impl.plugin, info))
    return out


def adapter_infos() -> list[AdapterInfo]:
    """Every installed adapter's :class:`AdapterInfo`, sorted by name."""
    return sorted((info for _, info in _plugin_infos()), key=lambda i: (i.name, i.provides))


def _installed_kinds(infos) -> list[str]:
    return sorted({k for info in infos for k in info.provides})


def create(kind: str, source: Any, **options: Any) -> Any:
    """Create the solver-facing object of ``kind`` (e.g. ``"scipy.ivp"``) for ``source``.

    Raises :class:`~esmjac.errors.JacError` ``bad_option`` when no installed
    adapter provides ``kind``, and ``adapter_unavailable`` when the adapter
    that provides it cannot be used here (its solver package is missing).
    """
    pairs = _plugin_infos()
    providers = [(plugin, info) for plugin, info in pairs if kind in info.provides]
    if not providers:
        kinds = _installed_kinds(info for _, info in pairs)
        raise JacError("bad_option",
                       f"no installed adapter provides kind {kind!r}; installed kinds: "
                       f"{', '.join(kinds) if kinds else '(none)'}")
    usable = [(plugin, info) for plugin, info in providers if info.available]
    if not usable:
        alternatives = _installed_kinds(info for _, info in pairs if info.available)
        details = "; ".join(f"{info.name}: {info.detail}" for _, info in providers)
        raise JacError("adapter_unavailable",
                       f"kind {kind!r} is provided by an adapter that is unavailable here "
                       f"({details}); available kinds: "
                       f"{', '.join(alternatives) if alternatives else '(none)'}")
    # The latest-registered usable provider wins; only it is asked.
    plugin, info = usable[0]
    pm = plugin_manager()
    others = [p for p in pm.get_plugins() if p is not plugin]
    result = pm.subset_hook_caller("esmjac_create", remove_plugins=others)(
        kind=kind, source=source, options=dict(options))
    if result is None:
        raise JacError("bad_option",
                       f"adapter {info.name!r} lists kind {kind!r} but created nothing for it")
    return result
