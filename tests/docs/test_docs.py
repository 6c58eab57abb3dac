"""The documentation builds (Sphinx with autodoc over the public modules),
with every warning an error -- a broken docstring or a dangling reference
fails here."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is in the test extra: pip install -e '.[test]'")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-q",
                           "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(tmp_path / "html")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "html" / "api.html").read_text().count("esmjac.adapters.scipy.ivp") > 0


def test_docs_cite_nothing_outside_the_repository():
    # What a user reads: the README, the docs pages, the command line's --help.
    for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.rst")),
              ROOT / "src" / "esmjac" / "cli.py", ROOT / "src" / "esmjac" / "demo.py"]:
        text = p.read_text()
        assert "DESIGN §" not in text and "DESIGN.md" not in text, p
        assert "../shared" not in text, p
