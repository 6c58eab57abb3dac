"""Every Python snippet of the README and of docs/ runs, as written.

Each ```` ```python ```` block of ``README.md`` and each ``.. code-block::
python`` block of ``docs/*.rst`` is executed in a fresh namespace (so a
snippet must import and define what it uses) in a scratch directory. A
block whose first line is ``# needs: module`` is skipped where that module
cannot be imported (optional extras)."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _markdown_blocks(path: pathlib.Path):
    text = path.read_text()
    for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
        yield text[:m.start()].count("\n") + 1, m.group(1)


def _rst_blocks(path: pathlib.Path):
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == ".. code-block:: python":
            start, body = i + 1, []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                body.append(lines[i])
                i += 1
            indent = min((len(l) - len(l.lstrip()) for l in body if l.strip()), default=0)
            yield start, "\n".join(l[indent:] for l in body).strip("\n") + "\n"
        else:
            i += 1


def _snippets():
    out = []
    readme = ROOT / "README.md"
    for line, code in _markdown_blocks(readme):
        out.append(pytest.param(code, id=f"README.md:{line}"))
    for rst in sorted((ROOT / "docs").glob("*.rst")):
        for line, code in _rst_blocks(rst):
            out.append(pytest.param(code, id=f"docs/{rst.name}:{line}"))
    return out


SNIPPETS = _snippets()


def test_there_are_snippets():
    assert len(SNIPPETS) >= 6


@pytest.mark.parametrize("code", SNIPPETS)
def test_snippet_runs(code, tmp_path, monkeypatch):
    first = code.splitlines()[0]
    if first.startswith("# needs:"):
        mod = first.split(":", 1)[1].strip()
        try:
            found = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            pytest.skip(f"{mod} is not installed (an optional extra)")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "<snippet>", "exec"), {"__name__": "__snippet__"})
