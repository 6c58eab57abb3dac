"""SciPy adapter: kind ``"scipy.ivp"`` (``scipy.integrate.solve_ivp``)."""
from __future__ import annotations

import importlib.metadata
import importlib.util

from ..hookspecs import AdapterInfo, hookimpl


# TODO(adapters): replaced by the real factory
def ivp(source, *, model=None, **options):
    raise NotImplementedError("the scipy.ivp factory is not written yet")


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: scipy``) -- keep below
# ---------------------------------------------------------------------------

_KINDS = ("scipy.ivp",)


def _find(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


@hookimpl
def esmjac_adapter_info() -> AdapterInfo:
    try:
        version = importlib.metadata.version("scipy")
    except importlib.metadata.PackageNotFoundError:
        version = ""
    if _find("scipy"):  # top level only: find_spec("scipy.integrate") would import scipy
        return AdapterInfo("scipy", version, _KINDS, True,
                           f"scipy {version or '(version unknown)'} (scipy.integrate.solve_ivp)")
    return AdapterInfo("scipy", version, _KINDS, False,
                       "scipy is not installed; pip install 'scipy>=1.10'")


@hookimpl
def esmjac_create(kind, source, options):
    if kind == "scipy.ivp":
        return ivp(source, **options)
    return None


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
