"""The package's surface: the solver factories are re-exported from
``esmjac`` lazily (importing esmjac imports no adapter or solver package)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import esmjac

FACTORIES = {"ivp": "esmjac.adapters.scipy", "cvode": "esmjac.adapters.sundials",
             "ida": "esmjac.adapters.sundials", "rosenbrock": "esmjac.integrators.leaf",
             "create": "esmjac.plugins.manager"}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_each_factory_is_the_adapters_own(name):
    import importlib
    assert getattr(esmjac, name) is getattr(importlib.import_module(FACTORIES[name]), name)
    assert name in esmjac.__all__ and name in dir(esmjac)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        esmjac.nope  # noqa: B018
    assert not hasattr(esmjac, "scipy")


@pytest.mark.slow
def test_importing_esmjac_imports_no_adapter_until_a_factory_is_used():
    code = ("import json, sys, esmjac\n"
            "def seen(): return sorted(m for m in sys.modules if m.startswith(('esmjac.adapters', "
            "'esmjac.plugins', 'scipy.integrate', 'scikits.odes')))\n"
            "before = seen(); esmjac.ivp; print(json.dumps([before, seen()]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == []
    assert "esmjac.adapters.scipy" in after


def test_the_version_has_one_source():
    """pyproject.toml reads the version from esmjac/_version.py (dynamic),
    and the installed metadata agrees with it."""
    tomllib = pytest.importorskip("tomllib")
    from importlib.metadata import PackageNotFoundError, version

    from tests.support.paths import ROOT

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "esmjac._version.__version__"}
    try:
        assert version("esmjac") == esmjac.__version__
    except PackageNotFoundError:          # run from a source tree without an install
        pass


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_each_factory_documents_every_parameter_numpydoc_style(name):
    """A ``Parameters`` section (numpydoc, rendered by napoleon) naming each
    parameter of the factory's signature."""
    import inspect
    import re
    fn = getattr(esmjac, name)
    doc = inspect.getdoc(fn)
    assert "\nParameters\n----------\n" in doc
    section = doc.split("\nParameters\n----------\n", 1)[1]
    section = re.split(r"\n\S[^\n]*\n-{3,}\n", section)[0]      # up to the next section
    documented = set()
    for line in section.splitlines():
        if line and not line[0].isspace():
            head = line.split(" : ")[0]
            documented |= {n.strip().lstrip("*") for n in head.split(",")}
    want = {p.name for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD or name in ("cvode", "ida", "create")}
    assert want <= documented, sorted(want - documented)
