"""Plugins: the hook specifications adapters implement and the manager that
finds them through the ``esmjac.adapters`` entry-point group."""
from __future__ import annotations

from .hookspecs import Adapter, hookimpl, hookspec
from .manager import ENTRY_POINT_GROUP, adapter_infos, create, plugin_manager

__all__ = ["Adapter", "hookimpl", "hookspec", "ENTRY_POINT_GROUP", "adapter_infos", "create",
           "plugin_manager"]
