"""earthsci-ast's schema pass once per document content (model/schema.py).

Oracle: jsonschema's own validator, counted (each pass over a whole
document calls ``Draft202012Validator.iter_errors`` with it), and earthsci-ast's verdict on
an invalid document. A recorded instance loads with no pass and gives the
same view; another instance, a load outside the block, or a record that is
not this user's signed entry (compile.cache) is validated as before; an
invalid document is refused and never recorded.
"""
from __future__ import annotations

import copy

import jsonschema
import pytest

from esmjac.compile.cache import record_schema_pass, schema_passed
from esmjac.errors import JacError
from esmjac.model.load import load_view
from esmjac.model.schema import remembering
from tests.support.models import chem


@pytest.fixture
def passes(monkeypatch):
    """jsonschema's whole-document passes, counted (jsonschema-rs's shortcut
    off unless a test turns it on)."""
    import esmjac.model.schema as schema_mod
    monkeypatch.setattr(schema_mod, "FAST", False)
    n = {"passes": 0}
    real = jsonschema.Draft202012Validator.iter_errors

    def counted(self, instance, *a, **k):
        if isinstance(instance, dict) and "esm" in instance:     # a pass over a whole document
            n["passes"] += 1
        return real(self, instance, *a, **k)
    monkeypatch.setattr(jsonschema.Draft202012Validator, "iter_errors", counted)
    return n


def _memo():
    seen: set = set()
    return seen, (lambda d: d in seen), seen.add


def test_a_recorded_document_loads_without_the_schema_pass(passes):
    doc = chem()
    seen, ask, record = _memo()
    with remembering(ask, record):
        v1 = load_view(doc)
    assert passes["passes"] == 1 and len(seen) == 1
    with remembering(ask, record):
        v2 = load_view(doc)
    assert passes["passes"] == 1                       # recorded: no pass
    assert v2.equations == v1.equations and v2.variables == v1.variables
    load_view(doc)                                     # outside the block: validated
    assert passes["passes"] == 2
    other = copy.deepcopy(doc)
    other["models"]["M"]["variables"]["k1"]["default"] = 2.5
    with remembering(ask, record):
        load_view(other)                               # other content: validated, recorded
    assert passes["passes"] == 3 and len(seen) == 2


def test_an_invalid_document_is_refused_and_never_recorded(passes):
    bad = chem()
    bad["models"]["M"]["variables"]["k1"]["type"] = 5
    with pytest.raises(JacError) as plain:
        load_view(bad)
    seen, ask, record = _memo()
    for _ in range(2):
        with remembering(ask, record), pytest.raises(JacError) as e:
            load_view(bad)
        assert e.value.code == plain.value.code and str(e.value) == str(plain.value)
    assert not seen and passes["passes"] == 3


def test_the_record_is_the_signed_cache(tmp_path, monkeypatch, passes):
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path))
    doc = chem()
    with remembering(schema_passed, record_schema_pass):
        load_view(doc)
        load_view(doc)
    assert passes["passes"] == 1
    (entry,) = tmp_path.glob("b*.json")
    sig = entry.with_name(entry.name + ".sig")
    sig.write_text("0" * 64)                           # not this user's signature
    with remembering(schema_passed, record_schema_pass):
        load_view(doc)                                 # validated again, recorded again
        load_view(doc)
    assert passes["passes"] == 2
    assert not schema_passed("0" * 64)


# ------------------------------------------- jsonschema-rs (issue #22: the first cold load)

@pytest.fixture
def fast(monkeypatch):
    """The jsonschema-rs path on (skipped where it is not installed)."""
    pytest.importorskip("jsonschema_rs")
    import esmjac.model.schema as schema_mod
    monkeypatch.setattr(schema_mod, "FAST", True)
    return schema_mod


def test_a_document_jsonschema_rs_accepts_skips_the_pure_python_pass(passes, fast):
    """Oracle: jsonschema's own pass accepts the same document (outside
    the block); inside, jsonschema-rs's verdict records it with no pass of
    jsonschema's, and the view is the same."""
    doc = chem()
    plain = load_view(doc)                             # outside the block: jsonschema validates
    assert passes["passes"] == 1
    seen, ask, record = _memo()
    with remembering(ask, record):
        v = load_view(doc)
    assert passes["passes"] == 1 and len(seen) == 1    # jsonschema-rs passed it, recorded
    assert v.equations == plain.equations and v.variables == plain.variables


def test_a_document_jsonschema_rs_refuses_gets_jsonschemas_errors(passes, fast):
    """An invalid document: jsonschema-rs says no, so jsonschema's pass
    runs and earthsci-ast refuses it with its own message; nothing recorded."""
    bad = chem()
    bad["models"]["M"]["variables"]["k1"]["type"] = 5
    seen, ask, record = _memo()
    with remembering(ask, record), pytest.raises(JacError):
        load_view(bad)
    assert passes["passes"] == 1 and not seen


def test_a_failing_fast_validator_falls_back_to_jsonschema(passes, fast, monkeypatch):
    def broken(schema):
        def is_valid(instance):
            raise RuntimeError("boom")
        return is_valid
    monkeypatch.setattr(fast, "_fast_valid", broken)
    seen, ask, record = _memo()
    with remembering(ask, record):
        load_view(chem())
    assert passes["passes"] == 1 and len(seen) == 1    # jsonschema's pass decided, and recorded
