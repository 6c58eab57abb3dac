"""SUNDIALS adapter (via scikits.odes): kinds ``"sundials.cvode"`` and ``"sundials.ida"``."""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys

from ..hookspecs import AdapterInfo, hookimpl


# TODO(adapters): replaced by the real factory
def cvode(source, *, model=None, **options):
    raise NotImplementedError("the sundials.cvode factory is not written yet")


# TODO(adapters): replaced by the real factory
def ida(source, *, model=None, **options):
    raise NotImplementedError("the sundials.ida factory is not written yet")


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: sundials``) -- keep below
# ---------------------------------------------------------------------------

_KINDS = ("sundials.cvode", "sundials.ida")


def _find_odes() -> bool:
    """Whether ``scikits.odes`` can be imported, without importing anything.

    ``find_spec("scikits.odes")`` would import the ``scikits`` namespace
    package; look for the ``odes`` subpackage on its search path instead.
    """
    try:
        if "scikits" in sys.modules:  # often pre-imported by scikits.odes' nspkg .pth
            locations = getattr(sys.modules["scikits"], "__path__", None)
        else:
            parent = importlib.util.find_spec("scikits")
            locations = parent.submodule_search_locations if parent else None
        if not locations:
            return False
        return importlib.machinery.PathFinder.find_spec("scikits.odes", list(locations)) is not None
    except (ImportError, ValueError):
        return False


@hookimpl
def esmjac_adapter_info() -> AdapterInfo:
    try:
        version = importlib.metadata.version("scikits.odes")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    if _find_odes():
        return AdapterInfo("sundials", version, _KINDS, True,
                           f"scikits.odes {version or '(version unknown)'} (SUNDIALS CVODE/IDA)")
    return AdapterInfo("sundials", version, _KINDS, False,
                       "scikits.odes is not installed; pip install 'esmjac[sundials]' "
                       "(needs libsundials-dev), or use kind 'scipy.ivp'")


@hookimpl
def esmjac_create(kind, source, options):
    if kind == "sundials.cvode":
        return cvode(source, **options)
    if kind == "sundials.ida":
        return ida(source, **options)
    return None


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
