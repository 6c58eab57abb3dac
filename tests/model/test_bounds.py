"""Documents are bounded before anything is read or allocated (issue #21
items 4 and 5): ``ref`` resolves local regular files only, within a size
limit, cycles refused; index-set sizes are checked against the memory
limit; nesting depth is bounded; a deep pass leaves the process's recursion
limit as it found it.

Each hostile case runs in a child process under a 2 GiB address-space limit
and a timeout (tests/support/child.py): the old behaviour (reading
``/dev/zero`` until killed, allocating 10⁹ elements) fails the test instead
of taking the machine down."""
from __future__ import annotations

import json
import socket
import sys
import threading

import pytest

from esmjac.errors import JacError
from tests.support.child import run_child
from tests.support.models import chem

_LIMITED = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
from esmjac.errors import JacError
from esmjac.model.load import load_view
try:
    load_view(SRC)
    out = {"code": None}
except JacError as e:
    out = {"code": e.code, "msg": str(e)}
except BaseException as e:
    out = {"code": "bare " + type(e).__name__, "msg": str(e)[:300]}
print("RESULT " + json.dumps(out))
"""


def _load_in_child(src, tmp_path, timeout=180) -> dict:
    return run_child(f"SRC = {src!r}\n" + _LIMITED, tmp_path / "cache", timeout=timeout)


def _with_ref(ref: str) -> dict:
    return {"esm": "1.1.0", "metadata": {"name": "R"}, "models": {"M": {"ref": ref}}}


def test_a_ref_to_a_device_is_refused_before_reading(tmp_path):
    r = _load_in_child(_with_ref("/dev/zero"), tmp_path)
    assert r["code"] == "load_error" and "regular file" in r["msg"]


def test_a_document_path_that_is_a_device_is_refused(tmp_path):
    r = _load_in_child("/dev/zero", tmp_path)
    assert r["code"] == "load_error" and "regular file" in r["msg"]


def test_a_ref_over_the_size_limit_is_refused(tmp_path, monkeypatch):
    from esmjac.model.load import load_view
    big = tmp_path / "big.esm"
    big.write_text(json.dumps(chem()) + " " * 5000)
    monkeypatch.setenv("ESMJAC_DOCUMENT_LIMIT", "4096")
    with pytest.raises(JacError) as ei:
        load_view(_with_ref(str(big)))
    assert ei.value.code == "load_error" and "document limit" in str(ei.value)


def test_a_url_ref_makes_no_request(tmp_path):
    """A ``ref`` to a listening local port: no connection is ever made."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    hits = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                hits.append(1)
                c.close()
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{srv.getsockname()[1]}/x.esm"
        r = _load_in_child(_with_ref(url), tmp_path)
    finally:
        stop.set()
        th.join()
        srv.close()
    assert hits == []
    assert r["code"] == "load_error" and "URL" in r["msg"]


def test_a_cycle_of_refs_is_refused(tmp_path):
    a, b = tmp_path / "a.esm", tmp_path / "b.esm"
    a.write_text(json.dumps(_with_ref("b.esm")))
    b.write_text(json.dumps(_with_ref("a.esm")))
    r = _load_in_child(str(a), tmp_path)
    assert r["code"] == "invalid_document" and "cycle" in r["msg"], r


def test_an_index_set_over_the_memory_limit_is_refused_before_loading(tmp_path):
    d = chem()
    d["index_sets"]["cell"]["size"] = 10**9
    r = _load_in_child(d, tmp_path)
    assert r["code"] == "invalid_document" and "memory limit" in r["msg"], r


@pytest.mark.parametrize("depth", [2_500, 200_000])
def test_a_deep_document_is_a_quick_typed_error_even_after_a_build(tmp_path, depth):
    """Item 4: after a deep pass (which raises the recursion limit while it
    runs) a deeply nested file is a typed error, never a C stack overflow,
    and a deep expression nest is refused without running for minutes."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * depth + "]" * depth)
    d = chem()
    d["models"]["M"]["equations"][0]["rhs"]["expr"] = "HOLE"
    n = depth // 2
    e = '{"op": "+", "args": [' * n + '{"op": "index", "args": ["A", "i"]}' + ', 1]}' * n
    nest = tmp_path / "nest.esm"
    nest.write_text(json.dumps(d).replace('"HOLE"', e))     # written as text: no deep recursion here
    code = f"""
import sys
from esmjac.calculus.bandset import BandSet
from esmjac.errors import JacError
from tests.support.models import chem
before = sys.getrecursionlimit()
BandSet.build(chem())                     # runs deep passes
after = sys.getrecursionlimit()
codes = []
for src in ({str(deep)!r}, {str(nest)!r}):
    try:
        BandSet.build(src)
        codes.append(None)
    except JacError as e:
        codes.append(e.code)
print("RESULT " + json.dumps({{"before": before, "after": after, "codes": codes}}))
"""
    r = run_child(code, tmp_path / "cache", timeout=240)
    assert r["after"] == r["before"]
    assert r["codes"] == ["invalid_document", "invalid_document"]


def test_run_deep_restores_the_recursion_limit():
    from esmjac.model.deep import run_deep
    before = sys.getrecursionlimit()
    seen = run_deep(sys.getrecursionlimit)
    assert seen > before and sys.getrecursionlimit() == before
