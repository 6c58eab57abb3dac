"""Progress of long work (esmjac.runtime.progress): plain lines on stderr in
a pipe with progress=True, nothing with False, nothing by default in a
library call, one line per phase longer than DELAY under the command line;
``check`` and the leaf report through it. Oracle: the text on stderr."""
from __future__ import annotations

import io

import pytest

from esmjac.errors import JacError
from esmjac.runtime import progress
from esmjac.runtime.progress import set_pipe_default, task
from tests.support.models import chem


def _run(p, monkeypatch, n=3, phases=("a", "b"), min_s=0.0, pipe="off"):
    err = io.StringIO()                          # not a terminal: a pipe
    monkeypatch.setattr("sys.stderr", err)
    prev = set_pipe_default(pipe)
    try:
        with task(p, "work", unit="items", min_s=min_s) as t:
            t.set_total(n)
            for ph in phases:
                t.phase(ph)
            for _ in range(n):
                t.update()
    finally:
        set_pipe_default(prev)
    return err.getvalue()


def test_lines_in_a_pipe_on_request(monkeypatch):
    text = _run(True, monkeypatch)
    assert "[esmjac] work: a (" in text and "[esmjac] work: b (" in text
    assert "[esmjac] work: 3/3 items (" in text          # the count when done


@pytest.mark.parametrize("p", [None, False])
def test_nothing_in_a_pipe_by_default_or_off(p, monkeypatch):
    assert _run(p, monkeypatch) == ""


def test_command_line_default_in_a_pipe_one_line_per_long_phase(monkeypatch):
    # under the CLI (pipe default "phases"), a phase shorter than DELAY says
    # nothing; with DELAY 0 every phase is "long": one line each, at its end
    assert _run(None, monkeypatch, pipe="phases") == ""
    monkeypatch.setattr(progress, "DELAY", -1.0)
    text = _run(None, monkeypatch, pipe="phases")
    assert text.count("[esmjac] work:") == 2 and "work: a (" in text and "work: b (" in text
    assert _run(False, monkeypatch, pipe="phases") == ""   # off stays off


def test_a_short_call_says_nothing_below_min_s(monkeypatch):
    # a leaf advance (thousands per host run) shows progress only past min_s
    assert _run(True, monkeypatch, min_s=60.0) == ""
    text = _run(True, monkeypatch, phases=(), min_s=1e-9)
    assert "[esmjac] work: 3/3 items" in text


def test_bad_settings_are_refused():
    with pytest.raises(JacError) as e:
        task("yes", "work")
    assert e.value.code == "bad_option"
    with pytest.raises(JacError):
        set_pipe_default("lines")


def test_check_reports_its_phases_and_columns(monkeypatch):
    from esmjac.reference.check import fd_check
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    rep = fd_check(chem(cells=2), points=2, progress=True)
    text = err.getvalue()
    assert rep.ok
    assert "[esmjac] check: deriving the Jacobian" in text
    assert "check: point 2 of 2" in text and f"{2 * rep.n_states}/{2 * rep.n_states} FD columns" in text
    err.truncate(0)
    fd_check(chem(cells=2), points=2, progress=False)
    fd_check(chem(cells=2), points=2)                        # a library call's default: quiet
    assert err.getvalue() == ""


def test_cli_check_in_a_pipe(monkeypatch, tmp_path, capsys):
    import json
    from esmjac.cli import main
    path = tmp_path / "m.esm"
    path.write_text(json.dumps(chem(cells=2)))
    assert main(["check", str(path), "--points", "1", "--progress", "on"]) == 0
    assert "[esmjac] check: point 1 of 1" in capsys.readouterr().err
    assert main(["check", str(path), "--points", "1", "--progress", "off"]) == 0
    assert capsys.readouterr().err == ""
    # the default in a pipe: a line per phase longer than DELAY (all, at DELAY < 0)
    monkeypatch.setattr(progress, "DELAY", -1.0)
    assert main(["check", str(path), "--points", "1"]) == 0
    err = capsys.readouterr().err
    assert "[esmjac] check: deriving the Jacobian" in err and "check: point 1 of 1" in err
    assert progress._PIPE_DEFAULT[0] == "off"                 # restored after the command
