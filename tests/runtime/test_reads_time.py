"""Whether the right-hand side reads t, remembered per document
(runtime.programs.reads_time): the answer the view gives
(model.timefield.explicit_time, itself checked against the evaluation
document in tests/model/test_timefield.py) on the first call, then the same
answer from the cache without loading the document; a damaged or forged
entry is a miss (the document is loaded again), never a different answer.
"""
from __future__ import annotations

import pytest

import esmjac.runtime.programs as P
from esmjac.model.load import load_view
from esmjac.model.timefield import explicit_time
from tests.model.test_timefield import _variants


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ESMJAC_CACHE_DIR", str(tmp_path))
    P._VIEWS.clear()
    yield tmp_path
    P._VIEWS.clear()


@pytest.fixture
def loads(monkeypatch):
    """Counts the documents loaded through the programs' view memo."""
    n = {"loads": 0}
    real = P.load_view

    def counted(*a, **k):
        n["loads"] += 1
        return real(*a, **k)
    monkeypatch.setattr(P, "load_view", counted)
    return n


@pytest.mark.parametrize("name", list(_variants()))
def test_reads_time_is_the_views_answer_then_loads_nothing(name, cache, loads):
    doc, expected = _variants()[name]
    assert explicit_time(load_view(doc)) is expected
    assert P.reads_time(doc) is expected
    assert loads["loads"] == 1
    P._VIEWS.clear()
    assert P.reads_time(doc) is expected          # from the cache: no document loaded
    assert loads["loads"] == 1
    assert P.reads_time(doc, options={"cache": False}) is expected
    assert loads["loads"] == 2


def test_a_damaged_or_forged_entry_is_a_miss(cache, loads):
    doc, expected = _variants()["direct"]
    assert P.reads_time(doc) is True
    (entry,) = [p for p in cache.glob("b*.json") if b"reads_time" in p.read_bytes()]
    entry.write_bytes(entry.read_bytes().replace(b"true", b"false"))   # signature no longer verifies
    P._VIEWS.clear()
    assert P.reads_time(doc) is True
    assert loads["loads"] == 2
    P._VIEWS.clear()
    assert P.reads_time(doc) is True                  # stored again, read back
    assert loads["loads"] == 2
