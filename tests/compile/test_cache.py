"""The cache trusts nothing on disk, and module loading is thread-safe.

Every scenario runs in fresh child processes (tests/support/child.py): the
loaded-kernel memo and ``sys.modules`` start empty as for a new job, and a
crash fails the test instead of the run. Values are checked against the
hand-derived Jacobian of the two-species mechanism (tests/support/models.chem):
per cell, f_A = -k1 A + k2 B², f_B = k1 A - 2 k2 B².
"""
from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import warnings

import numpy as np
import pytest

from esmjac.errors import JacError
from tests.support.child import finish_child, run_child, start_child
from tests.support.models import chem, chem_jacobian, with_observed_chain

CELLS = 4

#: Child code: build the state Jacobian of ``DOC`` and print it dense with p0.
_EVAL = """
import numpy as np
from scipy.sparse import csr_array
from esmjac.runtime.programs import JacobianProgram
from esmjac.layouts import Csr
J = JacobianProgram.build(DOC)
plan = J.plan(Csr())
ws = J.new_workspace()
n = J.u_size(ws.lanes)
u = np.linspace(1.0, 2.0, n)
out = np.zeros(plan.out_size(ws.lanes))
J.eval_into(plan, u, J.p0, 0.0, None, out, ws)
print("RESULT " + json.dumps({"J": csr_array((out, plan.indices, plan.indptr), shape=(n, n)).toarray().tolist(),
                              "p0": J.p0.tolist()}))
"""


def _hand(k1: float, k2: float, cells: int = CELLS) -> np.ndarray:
    return chem_jacobian(np.linspace(1.0, 2.0, 2 * cells), k1, k2)


def _eval(path, cache, **kw) -> dict:
    return run_child(f"DOC = {str(path)!r}\n" + _EVAL, cache, **kw)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """A cache folder holding the compiled two-species model and a second,
    different model (copied per test, so each starts warm)."""
    d = tmp_path_factory.mktemp("warm")
    cache = d / "cache"
    a, b = d / "chem.esm", d / "other.esm"
    a.write_text(json.dumps(chem(cells=CELLS)))
    b.write_text(json.dumps(with_observed_chain(chem(cells=CELLS))))
    r = _eval(a, cache)
    assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0)
    _eval(b, cache)
    return d


@pytest.fixture
def case(warm, tmp_path):
    """(model path, other model path, a private warm cache folder)."""
    shutil.copytree(warm / "cache", tmp_path / "cache", symlinks=False)
    shutil.copy(warm / "chem.esm", tmp_path / "chem.esm")
    shutil.copy(warm / "other.esm", tmp_path / "other.esm")
    return tmp_path / "chem.esm", tmp_path / "other.esm", tmp_path / "cache"


def _products(cache, suffix):
    return sorted(p for p in cache.glob(f"b*{suffix}") if not p.name.endswith(".sig"))


def _stem_of(cache, model_path) -> str:
    """The product file stem of one model (the one built after an isolated build)."""
    from esmjac.runtime.programs import PROGRAM_OPTIONS, build_key
    key = build_key("jac", model_path, None, "states", PROGRAM_OPTIONS)
    return f"b{key[0][:40]}"


# ---------------------------------------------------------------- threads

def test_first_call_from_16_threads_on_an_unpickled_program(case, tmp_path):
    """Item 2: a fresh process unpickles programs and 16 threads make their
    first calls at once; every call succeeds with bitwise the same result."""
    path, _, cache = case
    code = f"""
import pickle, threading, numpy as np
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from esmjac.layouts import Csr
J = JacobianProgram.build({str(path)!r}); R = RhsProgram.build({str(path)!r})
open({str(tmp_path / 'progs.pkl')!r}, 'wb').write(pickle.dumps((J, R, J.plan(Csr()))))
print("RESULT {{}}")
"""
    run_child(code, cache)
    code = f"""
import pickle, threading, numpy as np
J, R, plan = pickle.loads(open({str(tmp_path / 'progs.pkl')!r}, 'rb').read())
N = 16
bar = threading.Barrier(N)
res, errs = [None] * N, []
def work(i):
    try:
        ws = J.new_workspace(); sc = R.new_buffers()
        u = np.linspace(1.0, 2.0, J.u_size(ws.lanes))
        out = np.zeros(plan.out_size(ws.lanes)); f = np.zeros_like(u)
        bar.wait()
        if i % 2:
            J.eval_into(plan, u, J.p0, 0.0, None, out, ws); res[i] = out.tolist()
        else:
            R.eval_into(u, R.p0, 0.0, None, f, sc); res[i] = f.tolist()
    except BaseException as exc:
        errs.append(f"{{type(exc).__name__}}: {{exc}}")
ts = [threading.Thread(target=work, args=(i,)) for i in range(N)]
[t.start() for t in ts]; [t.join() for t in ts]
print("RESULT " + json.dumps({{"errors": errs, "res": res}}))
"""
    r = run_child(code, cache)
    assert r["errors"] == []
    jac = [x for i, x in enumerate(r["res"]) if i % 2]
    rhs = [x for i, x in enumerate(r["res"]) if not i % 2]
    assert all(x == jac[0] for x in jac) and all(x == rhs[0] for x in rhs)
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    A, B = u[:CELLS], u[CELLS:]
    assert np.allclose(rhs[0], np.concatenate([-0.3 * A + 2 * B * B, 0.3 * A - 4 * B * B]), rtol=1e-14)


def test_concurrent_builds_on_a_warm_cache(case):
    """Item 2: 8 threads building at once in a fresh process all succeed."""
    path, _, cache = case
    code = f"""
import threading
from esmjac.runtime.programs import JacobianProgram
N = 8
bar = threading.Barrier(N)
fps, errs = [], []
def work():
    try:
        bar.wait(); fps.append(JacobianProgram.build({str(path)!r}).fingerprint)
    except BaseException as exc:
        errs.append(f"{{type(exc).__name__}}: {{exc}}")
ts = [threading.Thread(target=work) for _ in range(N)]
[t.start() for t in ts]; [t.join() for t in ts]
print("RESULT " + json.dumps({{"errors": errs, "fps": fps}}))
"""
    r = run_child(code, cache)
    assert r["errors"] == [] and len(set(r["fps"])) == 1 and len(r["fps"]) == 8


@pytest.mark.slow
def test_cold_cache_race_between_processes(tmp_path):
    """Three processes build the same model into one empty cache at once."""
    path = tmp_path / "chem.esm"
    doc = chem(cells=CELLS)
    doc["models"]["M"]["variables"]["k1"]["default"] = 0.7      # its own kernels: a cold build
    path.write_text(json.dumps(doc))
    procs = [start_child(f"DOC = {str(path)!r}\n" + _EVAL, tmp_path / "cache") for _ in range(3)]
    for p in procs:
        r = finish_child(p)
        assert np.allclose(r["J"], _hand(0.7, 2.0), rtol=1e-14, atol=0)
    r = _eval(path, tmp_path / "cache")                          # and the result is reusable
    assert np.allclose(r["J"], _hand(0.7, 2.0), rtol=1e-14, atol=0)


# ---------------------------------------------------------------- what is on disk

def _corrupt_kernel_truncate(cache, path, other):
    for k in cache.glob("k*.py"):
        k.write_bytes(k.read_bytes()[: len(k.read_bytes()) // 2])


def _corrupt_kernel_garbage(cache, path, other):
    for k in cache.glob("k*.py"):
        k.write_text("this is not python(\n")


def _corrupt_kernel_edit(cache, path, other):
    # A plausible edit: every literal 2.0/-2 in the generated code changed.
    for k in cache.glob("k*.py"):
        k.write_text(k.read_text().replace("2.0", "7.0").replace("(2)", "(7)").replace(" 2 ", " 7 "))


def _corrupt_product_garbage(cache, path, other):
    for p in _products(cache, ".json") + _products(cache, ".pkl"):
        p.write_bytes(b"\x00garbage")


def _corrupt_product_truncate(cache, path, other):
    for p in _products(cache, ".json") + _products(cache, ".npz") + _products(cache, ".pkl"):
        p.write_bytes(p.read_bytes()[:100])


def _swap(src, dst):
    shutil.copy(src, dst)
    side = src.with_name(src.name + ".sig")
    if side.exists():
        shutil.copy(side, dst.with_name(dst.name + ".sig"))


def _corrupt_product_swap(cache, path, other):
    """Another model's complete, self-consistent entry copied over this key."""
    mine, theirs = _stem_of(cache, path), _stem_of(cache, other)
    for suffix in (".json", ".npz"):
        if (cache / (theirs + suffix)).exists():
            _swap(cache / (theirs + suffix), cache / (mine + suffix))
    pk = _products(cache, ".pkl")           # the pickle format: swap every entry with another
    for a, b in zip(pk, pk[1:] + pk[:1]):
        shutil.copy(b, a.with_suffix(".swap"))
    for a in pk:
        a.with_suffix(".swap").replace(a)


def _numba_files(cache, suffix):
    found = sorted((cache / "__pycache__").glob(f"k*{suffix}"))
    assert found, f"no Numba cache files ({suffix}) to corrupt"
    return found


def _corrupt_numba_index_garbage(cache, path, other):
    for f in _numba_files(cache, ".nbi"):
        f.write_bytes(b"garbage\n")


def _corrupt_numba_index_truncate(cache, path, other):
    for f in _numba_files(cache, ".nbi"):
        f.write_bytes(f.read_bytes()[:20])


def _corrupt_numba_data(cache, path, other):
    for f in _numba_files(cache, ".nbc"):
        f.write_bytes(b"garbage\n")


CORRUPTIONS = {f.__name__[9:]: f for f in (
    _corrupt_kernel_truncate, _corrupt_kernel_garbage, _corrupt_kernel_edit, _corrupt_product_garbage,
    _corrupt_product_truncate, _corrupt_product_swap, _corrupt_numba_index_garbage,
    _corrupt_numba_index_truncate, _corrupt_numba_data)}


_TWICE = {"kernel_garbage", "product_garbage", "numba_index_garbage"}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_a_corrupt_cache_entry_is_a_miss_not_a_wrong_answer(case, how):
    """Item 3: whatever was damaged, the next build is right (and, for one
    garbage case of each file kind, the one after too: nothing is poisoned
    for good)."""
    path, other, cache = case
    CORRUPTIONS[how](cache, path, other)
    # One garbage case of each file kind is run twice: the repair persisted.
    for _ in range(2 if how in _TWICE else 1):
        r = _eval(path, cache)
        assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0), how
        assert r["p0"] == [0.3, 2.0]


def test_a_crafted_pickle_in_the_cache_never_runs(case, tmp_path):
    """Item 3: every build-product file replaced by a pickle that would
    create a marker file when loaded, with SHA-256 hashes beside it (the
    old sidecar format; a signature cannot be forged without the secret)."""
    path, _, cache = case
    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    payload = pickle.dumps(Boom())
    import hashlib
    for p in cache.glob("b*"):
        if p.name.endswith(".sig"):
            continue
        p.write_bytes(payload)
        side = p.with_name(p.name + ".sig")
        if side.exists():
            side.write_text(hashlib.sha256(payload).hexdigest())
    r = _eval(path, cache)
    assert not marker.exists()
    assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0)


def test_no_build_product_is_a_pickle(case):
    _, _, cache = case
    assert _products(cache, ".json") and not list(cache.glob("*.pkl"))
    for p in _products(cache, ".npz"):
        with np.load(p, allow_pickle=False) as z:       # raises on any object array
            [z[k] for k in z.files]


@pytest.mark.slow
def test_editing_a_referenced_file_rebuilds(tmp_path):
    """Item 3: the model is a ``ref`` to another file; editing that file
    changes the next build's Jacobian and defaults."""
    inner = chem(cells=CELLS)
    outer = copy.deepcopy(inner)
    outer["models"] = {"M": {"ref": "inner.esm"}}
    (tmp_path / "inner.esm").write_text(json.dumps(inner))
    (tmp_path / "outer.esm").write_text(json.dumps(outer))
    r = _eval(tmp_path / "outer.esm", tmp_path / "cache")
    assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0)
    inner["models"]["M"]["variables"]["k1"]["default"] = 1.5
    (tmp_path / "inner.esm").write_text(json.dumps(inner))
    r = _eval(tmp_path / "outer.esm", tmp_path / "cache")
    assert r["p0"] == [1.5, 2.0]
    assert np.allclose(r["J"], _hand(1.5, 2.0), rtol=1e-14, atol=0)


def test_dependency_files_follow_refs_recursively(tmp_path):
    from esmjac.compile.cache import dependency_files
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.esm").write_text(json.dumps({"models": {"X": {"ref": "sub/b.esm"}}}))
    (tmp_path / "sub" / "b.esm").write_text(json.dumps({"models": {"Y": {"subsystems": {"Z": {"ref": "c.esm"}}}}}))
    (tmp_path / "sub" / "c.esm").write_text("{}")
    deps = dependency_files(json.loads((tmp_path / "a.esm").read_text()), tmp_path)
    assert [os.path.basename(p) for p, _ in deps] == ["b.esm", "c.esm"]
    assert dependency_files({"models": {"X": {"ref": "https://example.org/m.esm"}}}, tmp_path) is None


# ---------------------------------------------------------------- the environment

def _build(path):
    from esmjac.runtime.programs import JacobianProgram
    return JacobianProgram.build(path)


def test_a_cache_path_that_is_a_file_is_a_cache_error(tmp_path, monkeypatch):
    (tmp_path / "f").write_text("x")
    path = tmp_path / "chem.esm"
    path.write_text(json.dumps(chem(cells=CELLS)))
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path / "f"))
    with pytest.raises(JacError) as e:
        _build(path)
    assert e.value.code == "cache_error" and str(tmp_path / "f") in e.value.message
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path / "f" / "sub"))
    with pytest.raises(JacError) as e:
        _build(path)
    assert e.value.code == "cache_error"


def test_a_read_only_cache_builds_in_memory_with_a_warning(tmp_path, monkeypatch):
    import esmjac.compile.cache as C
    ro = tmp_path / "ro"
    ro.mkdir()
    path = tmp_path / "chem.esm"
    path.write_text(json.dumps(chem(cells=CELLS)))
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(ro))
    real = os.access
    monkeypatch.setattr(C.os, "access", lambda p, m: False if str(p) == str(ro) else real(p, m))
    monkeypatch.setattr(C, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="read-only"):
        J = _build(path)
    assert J.n_cols == 2 * CELLS and not any(ro.iterdir())


def test_a_cache_folder_deleted_during_a_build(tmp_path, monkeypatch):
    import esmjac.runtime.programs as P
    cache = tmp_path / "cache"
    path = tmp_path / "chem.esm"
    doc = chem(cells=CELLS)
    doc["models"]["M"]["variables"]["k2"]["default"] = 3.0
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(cache))
    real = P.compile_doc

    def compile_and_delete(doc, opts, **kw):
        shutil.rmtree(cache, ignore_errors=True)
        return real(doc, opts, **kw)

    monkeypatch.setattr(P, "compile_doc", compile_and_delete)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        J = _build(path)
    assert J.n_cols == 2 * CELLS


def test_a_folder_others_can_write_keeps_kernels_private(tmp_path, monkeypatch):
    import esmjac.compile.cache as C
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    path = tmp_path / "chem.esm"
    path.write_text(json.dumps(chem(cells=CELLS)))
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(shared))
    monkeypatch.setattr(C, "_WARNED", set())
    with pytest.warns(RuntimeWarning, match="writable by other users"):
        _build(path)
    assert not list(shared.glob("k*.py")) and _products(shared, ".json")


@pytest.mark.parametrize("engine", ["codegen", "tape"])
def test_a_stored_build_round_trips_through_json(tmp_path, monkeypatch, engine):
    """The stored product decodes to the same program (same fingerprint,
    regenerated kernel with the stored content hash, same index arrays)."""
    import esmjac.runtime.programs as P
    from esmjac.compile.cache import load_product
    from tests.support.programs import TROPO12
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path))
    a = P.JacobianProgram.build(TROPO12, options={"engine": engine})
    opts = dict(P.PROGRAM_OPTIONS, engine=engine)
    key = P.build_key("jac", TROPO12, None, "states", opts)[0]          # the key the build stored under
    raw = load_product(key, P._product_types())
    assert raw is not None and raw["program"].meta is None        # index arrays are not read back
    assert raw["program"].doc is None and raw["program"].bands is None   # nor the expressions
    assert (raw["tapes"] is not None) == (engine == "tape")      # tapes are; generated source is not
    from esmjac.runtime import stored
    b = stored._load(key, P._product_types(), opts, cells=raw["cells"])
    assert b.fingerprint == a.fingerprint and b.kernel.key == a.kernel.key
    assert b.kernel.engine == engine and b.bands == a.bands
    assert b.doc.to_json() == a.doc.to_json()
    for k, v in a.meta.items():
        assert np.array_equal(np.asarray(v), np.asarray(b.meta[k])), k
    assert np.array_equal(a.u0, b.u0) and np.array_equal(a.p0, b.p0)


# ---------------------------------------------------------------- forgery (issue #21)

@pytest.mark.slow
def test_a_forged_pyc_beside_a_kernel_never_runs(case, tmp_path):
    """Item 3 of #21: a ``__pycache__/k….pyc`` holding the kernel plus a
    command, stamped with the real ``.py``'s mtime and size (what an import
    would accept), is never executed: kernels run from the verified source."""
    import importlib._bootstrap_external as be
    import sys
    path, _, cache = case
    marker = tmp_path / "pwned"
    kernels = sorted(cache.glob("k*.py"))
    assert kernels
    for k in kernels:
        src = k.read_text() + f"\nopen({str(marker)!r}, 'w').close()\n"
        code = compile(src, str(k), "exec")
        st = k.stat()
        pyc = cache / "__pycache__" / f"{k.stem}.{sys.implementation.cache_tag}.pyc"
        pyc.parent.mkdir(exist_ok=True)
        pyc.write_bytes(bytes(be._code_to_timestamp_pyc(code, int(st.st_mtime), st.st_size)))
    r = _eval(path, cache)
    assert not marker.exists()
    assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0)


@pytest.mark.slow
def test_a_forged_product_never_changes_the_answer(case, monkeypatch):
    """Item 2 of #21: another document's complete product copied over this
    document's key, its ``"key"`` rewritten and every hash beside it
    recomputed (what anyone who can write the folder can do) is a miss: the
    build is this document's own Jacobian (hand-derived), not the other's."""
    import hashlib
    path, other, cache = case
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(cache))       # build_key looks for the grid-free entry there
    mine, theirs = _stem_of(cache, path), _stem_of(cache, other)
    assert (cache / (mine + ".json")).exists() and (cache / (theirs + ".json")).exists()
    for suffix in (".json", ".npz"):
        data = (cache / (theirs + suffix)).read_bytes()
        if suffix == ".json":
            from esmjac.runtime.programs import PROGRAM_OPTIONS, build_key
            d = json.loads(data)
            assert d["key"][:40] == theirs[1:]
            d["key"] = build_key("jac", path, None, "states", PROGRAM_OPTIONS)[0]
            data = json.dumps(d, separators=(",", ":")).encode()
        dst = cache / (mine + suffix)
        dst.write_bytes(data)
        for side in (".sig", ".sha256"):
            dst.with_name(dst.name + side).write_text(hashlib.sha256(data).hexdigest())
    r = _eval(path, cache)
    assert np.allclose(r["J"], _hand(0.3, 2.0), rtol=1e-14, atol=0)


def _fresh_secret(monkeypatch, path):
    import esmjac.compile.cache as C
    monkeypatch.setenv("ESMJAC_SECRET_FILE", str(path))
    monkeypatch.setattr(C, "_SECRET", [])
    monkeypatch.setattr(C, "_WARNED", set())
    return C


def test_the_signing_secret_is_created_private_and_reused(tmp_path, monkeypatch):
    C = _fresh_secret(monkeypatch, tmp_path / "cfg" / "esmjac" / "secret")
    key = C._signing_key()
    st = (tmp_path / "cfg" / "esmjac" / "secret").stat()
    assert st.st_mode & 0o777 == 0o600 and len(key) == 32
    assert (tmp_path / "cfg" / "esmjac" / "secret").read_bytes() == key
    monkeypatch.setattr(C, "_SECRET", [])
    assert C._signing_key() == key            # the next process reads the same secret


@pytest.mark.parametrize("how", ["world_readable", "in_cache", "symlink", "fifo"])
def test_an_unsafe_secret_is_not_used(tmp_path, monkeypatch, how):
    secret = tmp_path / "secret"
    if how == "in_cache":
        monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path))
        secret.write_bytes(b"k" * 32)
        secret.chmod(0o600)
    elif how == "world_readable":
        secret.write_bytes(b"k" * 32)
        secret.chmod(0o644)
    elif how == "symlink":
        (tmp_path / "real").write_bytes(b"k" * 32)
        (tmp_path / "real").chmod(0o600)
        secret.symlink_to(tmp_path / "real")
    else:
        os.mkfifo(secret, 0o600)
    C = _fresh_secret(monkeypatch, secret)
    with pytest.warns(RuntimeWarning, match="cannot use its signing secret"):
        key = C._signing_key()
    assert key != b"k" * 32 and len(key) == 32


_EVAL_WARNED = """
import warnings as _w
import numpy as np
from scipy.sparse import csr_array
from esmjac.runtime.programs import JacobianProgram, RhsProgram
from esmjac.layouts import Csr
with _w.catch_warnings(record=True) as seen:
    _w.simplefilter("always")
    R = RhsProgram.build(DOC)
    J = JacobianProgram.build(DOC)
    plan = J.plan(Csr())
    ws = J.new_workspace()
    n = J.u_size(ws.lanes)
    u = np.linspace(1.0, 2.0, n)
    out = np.zeros(plan.out_size(ws.lanes))
    J.eval_into(plan, u, J.p0, 0.0, None, out, ws)
    f = np.zeros(n)
    R.eval_into(u, R.p0, 0.0, None, f)
print("RESULT " + json.dumps({"J": csr_array((out, plan.indices, plan.indptr), shape=(n, n)).toarray().tolist(),
                              "f": f.tolist(), "warned": [str(m.message) for m in seen
                                                          if "Numba's cache file" in str(m.message)]}))
"""


@pytest.mark.slow
def test_every_numba_cache_file_truncated_is_purged_with_a_warning(tmp_path):
    """Issue #22 item 5: truncate every Numba index and data file (the
    kernels' beside the cache folder and esmjac's own helpers' under
    NUMBA_CACHE_DIR, as a full disk or a killed writer leaves them): the next
    build warns naming each unreadable file, removes it and recompiles, with
    the right values; the one after is clean."""
    doc = chem(cells=CELLS)
    doc["models"]["M"]["variables"]["k1"]["default"] = 0.45        # kernels of its own
    path = tmp_path / "chem.esm"
    path.write_text(json.dumps(doc))
    cache, nb = tmp_path / "cache", tmp_path / "numba"
    env = {"NUMBA_CACHE_DIR": str(nb)}
    code = f"DOC = {str(path)!r}\n" + _EVAL_WARNED
    first = run_child(code, cache, env=env)
    files = [f for d in (cache, nb) for f in d.rglob("*") if f.suffix in (".nbi", ".nbc")]
    assert any(f.suffix == ".nbi" for f in files) and any(f.suffix == ".nbc" for f in files)
    for f in files:
        data = f.read_bytes()
        f.write_bytes(data[: len(data) // 2])
    again = run_child(code, cache, env=env)
    u = np.linspace(1.0, 2.0, 2 * CELLS)
    assert np.allclose(again["J"], _hand(0.45, 2.0), rtol=1e-14, atol=0)
    a, b, k1, k2 = u[:CELLS], u[CELLS:], 0.45, 2.0          # chem's RHS by hand
    hand = np.concatenate([-k1 * a + k2 * b * b, k1 * a - 2 * k2 * b * b])
    assert np.allclose(again["f"], hand, rtol=1e-14, atol=0) and again["f"] == first["f"]
    assert again["warned"], "no warning named a purged file"
    assert all(".nbi" in w and "removed it" in w for w in again["warned"])
    third = run_child(code, cache, env=env)
    assert third["warned"] == [] and third["J"] == again["J"]
