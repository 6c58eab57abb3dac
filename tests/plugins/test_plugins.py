"""Adapter plugin system: discovery through the ``esmjac.adapters`` entry
points (built-ins and third-party alike), listing, creation and refusals."""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import subprocess
import sys
import textwrap

import pytest

from esmjac import plugins
from esmjac.errors import JacError
from esmjac.plugins.hookspecs import Adapter

BUILTIN_KINDS = {
    "scipy": ("scipy.ivp",),
    "sundials": ("sundials.cvode", "sundials.ida"),
    "native": ("native.layouts", "native.rosenbrock"),
}
FACTORIES = {
    "scipy.ivp": ("esmjac.adapters.scipy", "ivp"),
    "sundials.cvode": ("esmjac.adapters.sundials", "cvode"),
    "sundials.ida": ("esmjac.adapters.sundials", "ida"),
    "native.layouts": ("esmjac.adapters.native", "layouts"),
    "native.rosenbrock": ("esmjac.adapters.native", "rosenbrock"),
}

THIRDPARTY = "thirdparty_esmjac_demo"
THIRDPARTY_SOURCE = '''
"""A third-party esmjac adapter, as an outside package would ship it."""
from esmjac.plugins.hookspecs import Adapter, hookimpl

AVAILABLE = True


def echo(source, **options):
    return {"kind": "demo.echo", "source": source, "options": options}


@hookimpl
def esmjac_adapter():
    if AVAILABLE:
        return Adapter("demo", "0.1", {"demo.echo": echo}, True, "echoes its arguments")
    return Adapter("demo", "0.1", {"demo.echo": echo}, False,
                   "demo-solver is not installed; pip install demo-solver")
'''


@pytest.fixture
def fresh_plugins():
    """Rediscover adapters for this test, and again (clean) afterwards."""
    plugins.plugin_manager.cache_clear()
    yield
    plugins.plugin_manager.cache_clear()


@pytest.fixture
def thirdparty(tmp_path, monkeypatch, fresh_plugins):
    """Install a third-party adapter the way pip would: a module plus a
    ``.dist-info`` whose ``entry_points.txt`` declares it in ``esmjac.adapters``."""
    (tmp_path / f"{THIRDPARTY}.py").write_text(textwrap.dedent(THIRDPARTY_SOURCE))
    dist = tmp_path / f"{THIRDPARTY}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: thirdparty-esmjac-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[esmjac.adapters]\ndemo = {THIRDPARTY}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    plugins.plugin_manager.cache_clear()
    yield tmp_path
    sys.modules.pop(THIRDPARTY, None)
    importlib.invalidate_caches()


def _by_name(infos):
    return {i.name: i for i in infos}


# ---------------------------------------------------------------- built-ins


def test_builtins_listed(fresh_plugins):
    infos = plugins.adapter_infos()
    assert [i.name for i in infos] == sorted(i.name for i in infos)
    by = _by_name(infos)
    for name, kinds in BUILTIN_KINDS.items():
        info = by[name]
        assert isinstance(info, Adapter)
        assert info.provides == kinds
        assert isinstance(info.available, bool) and info.detail
    assert by["scipy"].available  # a core dependency
    assert by["scipy"].version == importlib.metadata.version("scipy")


def test_builtins_come_only_from_entry_points(fresh_plugins):
    eps = {ep.name: ep.value
           for ep in importlib.metadata.entry_points(group=plugins.ENTRY_POINT_GROUP)}
    for name in BUILTIN_KINDS:
        assert eps[name] == f"esmjac.adapters.{name}"
    pm = plugins.plugin_manager()
    registered = dict(pm.list_name_plugin())
    assert set(registered) == set(eps)
    for name in BUILTIN_KINDS:
        assert registered[name].__name__ == f"esmjac.adapters.{name}"


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_create_dispatches_to_module_factory(kind, fresh_plugins, monkeypatch):
    module, attr = FACTORIES[kind]
    info = _by_name(plugins.adapter_infos())[module.rsplit(".", 1)[1]]
    if not info.available:
        pytest.skip(f"{info.name} unavailable here: {info.detail}")
    calls = []

    def factory(source, *, model=None, **options):
        calls.append((source, model, options))
        return ("made", kind)

    monkeypatch.setattr(importlib.import_module(module), attr, factory)
    assert plugins.create(kind, "m.esm", model="Chem", rtol=1e-6) == ("made", kind)
    assert calls == [("m.esm", "Chem", {"rtol": 1e-6})]


@pytest.mark.slow
def test_cli_lists_adapters_without_importing_solvers():
    code = ("import sys; from esmjac.cli import main; rc = main(['adapters']); "
            "bad = [m for m in ('scikits.odes', 'scipy.integrate') if m in sys.modules]; "
            "print('IMPORTED', bad); raise SystemExit(rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "IMPORTED []" in out.stdout, out.stdout
    res = subprocess.run([sys.executable, "-m", "esmjac", "adapters"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split()[:4] == ["name", "version", "available", "provides"]
    for name, kinds in BUILTIN_KINDS.items():
        row = next(line for line in lines if line.split()[0] == name)
        assert row.split()[2] in ("yes", "no")
        assert ", ".join(kinds) in row


# -------------------------------------------------------------- third party


def test_thirdparty_adapter_registered_like_builtins(thirdparty):
    by = _by_name(plugins.adapter_infos())
    demo = by["demo"]
    assert (demo.name, demo.version, demo.provides, demo.available, demo.detail) == \
        ("demo", "0.1", ("demo.echo",), True, "echoes its arguments")
    assert set(BUILTIN_KINDS) <= set(by)
    got = plugins.create("demo.echo", "model.esm", model="M", atol=1e-9)
    assert got == {"kind": "demo.echo", "source": "model.esm",
                   "options": {"model": "M", "atol": 1e-9}}
    assert plugins.plugin_manager().get_plugin("demo").__name__ == THIRDPARTY


@pytest.mark.slow
def test_thirdparty_listed_by_cli(thirdparty):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(thirdparty), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, "-m", "esmjac", "adapters"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if line.split()[0] == "demo")
    assert "demo.echo" in row and "yes" in row.split()


def test_thirdparty_unavailable(thirdparty, monkeypatch):
    plugins.create("demo.echo", "x")  # loads the module
    monkeypatch.setattr(sys.modules[THIRDPARTY], "AVAILABLE", False)
    with pytest.raises(JacError) as ei:
        plugins.create("demo.echo", "x")
    err = ei.value
    assert err.code == "adapter_unavailable"
    assert "pip install demo-solver" in err.message
    assert "scipy.ivp" in err.message  # names an available alternative
    assert "demo.echo" not in err.message.split("available kinds:")[1]


# ---------------------------------------------------------------- refusals


def test_unknown_kind_is_bad_option(fresh_plugins):
    with pytest.raises(JacError) as ei:
        plugins.create("nosuch.solver", "m.esm")
    assert ei.value.code == "bad_option"
    assert "nosuch.solver" in ei.value.message
    for kinds in BUILTIN_KINDS.values():
        for kind in kinds:
            assert kind in ei.value.message


def test_unavailable_builtin_is_adapter_unavailable(fresh_plugins, monkeypatch):
    import esmjac.adapters.sundials as sundials

    monkeypatch.setattr(sundials, "_find_odes", lambda: False)
    info = _by_name(plugins.adapter_infos())["sundials"]
    assert not info.available
    with pytest.raises(JacError) as ei:
        plugins.create("sundials.ida", "m.esm")
    assert ei.value.code == "adapter_unavailable"
    assert info.detail in ei.value.message
    assert "esmjac[sundials]" in ei.value.message
    assert "scipy.ivp" in ei.value.message.split("available kinds:")[1]
