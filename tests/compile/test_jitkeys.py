"""Numba's cache of a jitted function is keyed by its own file; what it
links in from other modules must key it too (compile/jitkeys.py), or a warm
cache serves a stale kernel after an edit of a helper."""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import textwrap
from pathlib import Path

import esmjac
from esmjac.compile import jitkeys, polyroute
from esmjac.integrators import lanestep, lanetape
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

HELPER = "import numba as nb\nK = {k}\n\n\n@nb.njit(cache=True, inline='always')\ndef helper(x):\n    return x + K\n"
CALLER = textwrap.dedent("""\
    import numba as nb
    from esmjac.compile.jitkeys import key_by_callees
    from {pkg}.helper import helper


    @nb.njit(cache=True)
    def caller(x):
        return helper(x) * 10.0


    key_by_callees(globals())
    """)


def _load(pkg: str, root: Path):
    for m in [m for m in sys.modules if m == pkg or m.startswith(pkg + ".")]:
        del sys.modules[m]
    importlib.invalidate_caches()
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(f"{pkg}.caller")
    finally:
        sys.path.remove(str(root))


def test_an_edit_of_a_linked_helper_is_a_cache_miss(tmp_path):
    """A warm entry of ``caller`` (on disk beside it) is not used once the
    helper it inlines has changed: a fresh import of both (as a new
    process) computes the new value, where Numba's own key (the caller's
    file, untouched) would load the old code. Then a second fresh import
    with the same files loads the entry (a hit: the key is stable)."""
    pkg = "esmjac_jitkeys_probe"
    d = tmp_path / pkg
    d.mkdir()
    (d / "__init__.py").write_text("")
    (d / "helper.py").write_text(HELPER.format(k="1.0"))
    (d / "caller.py").write_text(CALLER.format(pkg=pkg))
    try:
        m = _load(pkg, tmp_path)
        assert m.caller(1.0) == 20.0
        assert m.caller.stats.cache_misses and not m.caller.stats.cache_hits
        (d / "helper.py").write_text(HELPER.format(k="2.5"))      # a new helper, same caller file
        m = _load(pkg, tmp_path)
        assert m.caller(1.0) == 35.0
        assert m.caller.stats.cache_misses and not m.caller.stats.cache_hits
        m = _load(pkg, tmp_path)
        assert m.caller(1.0) == 35.0
        assert m.caller.stats.cache_hits and not m.caller.stats.cache_misses
    finally:
        for name in [n for n in sys.modules if n == pkg or n.startswith(pkg + ".")]:
            del sys.modules[name]


def test_the_kernels_that_inline_other_modules_are_keyed_by_them():
    """The cases that were stale: the leaf's tape interpreter inlines
    compile/tape.py's helpers, the mass-action route's driver links
    compile/massaction.run_poly, the step driver links linalg/sparse_lu's
    kernels and intrinsics."""
    root = Path(esmjac.__file__).parent
    files = {Path(f).relative_to(root).as_posix() for f in jitkeys.linked_files(lanetape.run_fused)}
    assert {"integrators/lanetape.py", "compile/tape.py"} <= files
    files = {Path(f).relative_to(root).as_posix() for f in jitkeys.linked_files(polyroute._drive)}
    assert {"compile/polyroute.py", "compile/massaction.py"} <= files
    linked = set()
    for v in vars(lanestep).values():
        if isinstance(v, Dispatcher):
            linked |= {Path(f).relative_to(root).as_posix() for f in jitkeys.linked_files(v)}
    assert "linalg/sparse_lu.py" in linked


def test_every_cached_kernel_that_links_another_module_is_keyed_by_it():
    """Each cached jitted function of the package whose callees (jitted
    functions, intrinsics) come from another module has the extended key:
    a new cross-module call without ``key_by_callees`` fails here."""
    bare = []
    for info in pkgutil.walk_packages(esmjac.__path__, "esmjac."):
        if info.name.endswith("__main__"):
            continue                    # the command line: runs on import
        mod = importlib.import_module(info.name)
        for name, v in vars(mod).items():
            if not (isinstance(v, Dispatcher) and v.py_func.__module__ == info.name):
                continue
            if isinstance(v._cache, FunctionCache) and len(jitkeys.linked_files(v)) > 1 \
                    and type(v._cache) is FunctionCache:
                bare.append(f"{info.name}.{name}")
    assert not bare, f"cached kernels that link other modules without key_by_callees: {bare}"


def test_the_key_holds_the_constants_read():
    """A constant a kernel reads from another module is compiled into it:
    its value is in the key."""
    mods, consts = jitkeys._closure(lanetape.run_fused.py_func)
    assert ("CHUNK", repr(lanetape.CHUNK)) in consts
