"""Native adapter (esmjac's own kernels): kinds ``"native.layouts"`` and ``"native.rosenbrock"``."""
from __future__ import annotations

import importlib.metadata
import importlib.util

from ..hookspecs import AdapterInfo, hookimpl


# TODO(adapters): replaced by the real factory
def layouts(source, *, model=None, **options):
    raise NotImplementedError("the native.layouts factory is not written yet")


# TODO(adapters): replaced by the real factory
def rosenbrock(source, *, model=None, **options):
    raise NotImplementedError("the native.rosenbrock factory is not written yet")


# ---------------------------------------------------------------------------
# esmjac plugin (entry point ``esmjac.adapters: native``) -- keep below
# ---------------------------------------------------------------------------

_KINDS = ("native.layouts", "native.rosenbrock")


def _find(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


@hookimpl
def esmjac_adapter_info() -> AdapterInfo:
    # The solver is esmjac itself (Numba-compiled kernels on NumPy arrays).
    version = _version("esmjac")
    numba, numpy = _version("numba"), _version("numpy")
    if _find("numba") and _find("numpy"):
        return AdapterInfo("native", version, _KINDS, True,
                           f"esmjac's own kernels (numba {numba}, numpy {numpy})")
    missing = " and ".join(m for m in ("numba", "numpy") if not _find(m))
    return AdapterInfo("native", version, _KINDS, False,
                       f"{missing} is not installed; pip install 'numba>=0.58' 'numpy>=1.24', "
                       "or use kind 'scipy.ivp'")


@hookimpl
def esmjac_create(kind, source, options):
    if kind == "native.layouts":
        return layouts(source, **options)
    if kind == "native.rosenbrock":
        return rosenbrock(source, **options)
    return None


# ---------------------------------------------------------------------------
# end of esmjac plugin section
# ---------------------------------------------------------------------------
