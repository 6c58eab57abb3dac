"""Malformed documents are refused with typed errors naming the equation or
variable, before any calculus (issue #10 items 5 and 6); the CLI prints the
code and message once, without a traceback."""
from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from esmjac.calculus.bandset import BandSet
from esmjac.errors import JacError
from esmjac.model.load import load_view
from tests.support.models import chem


def _idx(v, i):
    return {"op": "index", "args": [v, i]}


def _doc(edit) -> dict:
    d = chem(cells=4)
    edit(d["models"]["M"], d)
    return d


def _extra_term(term):
    def edit(m, d):
        m["equations"][0]["rhs"]["expr"]["args"].append(term)
    return edit


#: name → (edit, words the message must contain)
CASES = {
    "duplicate D equation": (lambda m, d: m["equations"].append(copy.deepcopy(m["equations"][0])),
                             ["`A`", "two derivative equations"]),
    "index 99 on a size-4 set": (_extra_term(_idx("A", 99)), ["index 99", "`A`", "D(A)"]),
    "index 0": (_extra_term(_idx("A", 0)), ["index 0", "`A`"]),
    "two indices on a 1-D array": (_extra_term({"op": "index", "args": ["A", 1, 2]}), ["1 dimension"]),
    "index set size -1": (lambda m, d: d["index_sets"]["cell"].update(size=-1), ["`cell`", "-1"]),
    "index set size 0": (lambda m, d: d["index_sets"]["cell"].update(size=0), ["`cell`", "size 0"]),
    "index set size 1e30": (lambda m, d: d["index_sets"]["cell"].update(size=10 ** 30), ["`cell`"]),
    "index set size 1e12": (lambda m, d: d["index_sets"]["cell"].update(size=10 ** 12), ["`cell`"]),
    "state vector over the memory limit": (lambda m, d: d["index_sets"]["cell"].update(size=10 ** 8),
                                           ["bytes"]),
    "indexing a scalar parameter": (_extra_term({"op": "index", "args": ["k1", 1]}), ["`k1`", "scalar"]),
    "ifelse with two arguments": (_extra_term({"op": "ifelse", "args": ["k1", 1]}), ["`ifelse`", "3"]),
    "index with no arguments": (_extra_term({"op": "index", "args": []}), ["`index`"]),
    "exp with two arguments": (_extra_term({"op": "exp", "args": ["k1", "k2"]}), ["`exp`"]),
    "infinite literal": (_extra_term({"op": "*", "args": [float("inf"), "k1"]}), ["non-finite", "D(A)"]),
    "NaN literal": (_extra_term({"op": "*", "args": [float("nan"), "k1"]}), ["non-finite"]),
    "huge integer literal": (_extra_term({"op": "*", "args": [10 ** 400, "k1"]}), ["integer literal"]),
    "empty variable name": (lambda m, d: m["variables"].update({"": {"type": "parameter", "default": 1.0}}),
                            ["empty name"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_malformed_document_is_refused_naming_the_culprit(name, monkeypatch):
    monkeypatch.setenv("ESMJAC_WORKSPACE_LIMIT", str(10 ** 9))     # the same on every machine
    edit, words = CASES[name]
    doc = _doc(edit)
    with pytest.raises(JacError) as e:
        load_view(copy.deepcopy(doc))
    assert e.value.code in ("invalid_document", "load_error"), e.value
    for w in words:
        assert w in e.value.message, (name, e.value.message)
    with pytest.raises(JacError):               # and every entry point says the same
        BandSet.build(copy.deepcopy(doc))


def test_well_formed_documents_pass():
    load_view(chem(cells=4))
    from tests.support.models import with_observed_chain
    load_view(with_observed_chain(chem(cells=4)))


def test_the_reference_fixtures_and_bundled_models_pass(reference):
    from tests.support.paths import ALL_FIXTURES, FIXTURES
    from tests.support.programs import TROPO12
    for fx in ALL_FIXTURES:
        load_view(FIXTURES / f"{fx}.esm")
    load_view(TROPO12)


def test_an_unexpected_failure_in_an_entry_point_is_typed(monkeypatch):
    import esmjac.calculus.bandset as B

    def boom(*a, **k):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(B, "jacobian_bands", boom)
    with pytest.raises(JacError) as e:
        BandSet.build(chem(cells=2))
    assert e.value.code == "internal_error" and "ZeroDivisionError" in e.value.message
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "esmjac", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_cli_prints_code_and_message_once_without_traceback(tmp_path):
    doc = _doc(lambda m, d: d["index_sets"]["cell"].update(size=-1))
    f = tmp_path / "bad.esm"
    f.write_text(json.dumps(doc))
    for cmd in ("check", "bands"):
        r = _cli(cmd, str(f))
        assert r.returncode == 2
        assert r.stderr.count("[invalid_document]") == 1 and "Traceback" not in r.stderr
        assert "OK" not in r.stdout
    r = _cli("--debug", "check", str(f))
    assert r.returncode != 0 and "Traceback" in r.stderr and "InvalidDocument" in r.stderr   # the class names the code since typed errors
