"""The bounded hostile-document fuzz (issue #21): hypothesis mutations of a
small document (tests/support/docfuzz.py) in a child process under a 3 GiB
address-space limit. No example may run code, crash the process, hang past
its budget, raise anything but a ``JacError``, or change generated code by
renaming; the counts per category are printed for the issue's note."""
from __future__ import annotations

import pytest

from tests.support.child import run_child

_CODE = """
import resource
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from tests.support.docfuzz import main
main(EXAMPLES)
"""


@pytest.mark.slow
def test_hostile_documents_are_refused_or_built_never_anything_else(tmp_path):
    pytest.importorskip("hypothesis")
    counts = run_child(_CODE.replace("EXAMPLES", "150"), tmp_path / "cache", timeout=1500)
    print("docfuzz outcomes:", dict(sorted(counts.items())))
    bad = {k: v for k, v in counts.items() if not (k == "ok" or k.startswith("refused:"))}
    assert bad == {}, counts
    assert counts.get("ok", 0) > 0 and sum(counts.values()) == 150
