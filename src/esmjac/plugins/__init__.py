"""Plugins: the hook specifications adapters implement and the manager that
finds them through the ``esmjac.adapters`` entry-point group."""
from __future__ import annotations

from .hookspecs import AdapterInfo, hookimpl, hookspec
from .manager import ENTRY_POINT_GROUP, adapter_infos, create, plugin_manager

__all__ = ["AdapterInfo", "hookimpl", "hookspec", "ENTRY_POINT_GROUP", "adapter_infos", "create",
           "plugin_manager"]
