"""Call-surface fuzz (tests/support/fuzz.py) in a child process: a segfault
fails this test instead of killing the run. Bounded (a fixed, derandomized
number of hypothesis examples per category), so it takes tens of seconds."""
from __future__ import annotations

import os

import pytest

from tests.support.child import run_child

EXAMPLES = 150


def test_the_call_surface_fuzz_finds_no_crash_no_bare_traceback_and_no_wrong_answer(tmp_path):
    pytest.importorskip("hypothesis")
    res = run_child(f"from tests.support.fuzz import main\nmain({EXAMPLES})",
                    os.environ.get("ESMJAC_CACHE_DIR", tmp_path / "cache"), timeout=600)
    lines = []
    for cat, r in sorted(res.items()):
        lines.append(f"{cat}: {r['tried']} tried, {r['ok']} ok, refused {r['refused']}, "
                     f"{len(r['bare'])} bare, {len(r['wrong'])} wrong")
    print("\n".join(lines))
    assert {"rhs.eval_into", "jac.eval_into", "lanes", "documents"} <= set(res)
    for cat, r in res.items():
        assert r["bare"] == [], (cat, r["bare"][:5])
        assert r["wrong"] == [], (cat, r["wrong"][:5])
    assert res["rhs.eval_into"]["ok"] > 10 and res["jac.eval_into"]["ok"] > 10   # not all refusals
