"""The ``esmjac`` command line: --indent keeps the content (the default stays
byte-identical to the goldens), spy needs an explicit output and labels the
species, build progress is quiet in pipes and on request."""
from __future__ import annotations

import importlib.resources
import io
import json

import pytest

from esmjac.cli import main
from tests.support.paths import FIXTURES, GOLDENS, need_reference

TROPO = str(importlib.resources.files("esmjac") / "models" / "tropo12.esm")


@pytest.mark.parametrize("kind", ["bands", "block"])
def test_indent_is_the_golden_content_pretty_printed(kind, capsys):
    need_reference()
    fx = FIXTURES / "contracted_ops.esm"
    golden = (GOLDENS / f"contracted_ops.{kind}.json").read_text().rstrip("\n")
    assert main([kind, str(fx)]) == 0
    assert capsys.readouterr().out.rstrip("\n") == golden
    assert main([kind, str(fx), "--indent", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") > 10 and json.loads(out) == json.loads(golden)


def test_spy_needs_an_output_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["spy", TROPO])
    assert "--output" in capsys.readouterr().err
    assert not (tmp_path / "pattern.png").exists()


def test_spy_labels_species(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure
    seen = {}
    real = matplotlib.figure.Figure.savefig

    def grab(fig, path, **kw):
        ax = fig.axes[0]
        seen["y"] = [t.get_text() for t in ax.get_yticklabels()]
        seen["x"] = [t.get_text() for t in ax.get_xticklabels()]
        return real(fig, path, **kw)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", grab)
    out = tmp_path / "p.png"
    assert main(["spy", TROPO, "-o", str(out), "--wrt", "parameters", "--progress", "off"]) == 0
    assert out.stat().st_size > 0
    assert seen["y"][:3] == ["O3", "O", "O1D"] and "HCHO" in seen["y"]
    assert seen["x"][:2] == ["fj", "T"]


class _Tty(io.StringIO):
    def isatty(self):
        return True


def _build(progress, monkeypatch, stream):
    from esmjac.runtime.programs import RhsProgram
    from tests.support.models import chem
    monkeypatch.setattr("sys.stderr", stream)
    RhsProgram.build(chem(cells=2), options={"progress": progress, "cache": False})
    return stream.getvalue()


def test_progress_lines_on_request_in_a_pipe(monkeypatch):
    text = _build(True, monkeypatch, io.StringIO())
    assert "[esmjac] rhs document" in text and "kernels compiled" in text


@pytest.mark.parametrize("progress", [None, False])
def test_progress_quiet_in_a_pipe_by_default_and_when_off(progress, monkeypatch):
    assert _build(progress, monkeypatch, io.StringIO()) == ""


def test_progress_bar_on_a_terminal(monkeypatch):
    text = _build(True, monkeypatch, _Tty())
    assert "esmjac rhs build: 0/3" in text           # a bar (tqdm), cleared when done
    # Auto mode waits DELAY seconds before showing a bar: a quick build is silent.
    assert _build(None, monkeypatch, _Tty()) == ""
    assert _build(False, monkeypatch, _Tty()) == ""


def test_progress_option_is_checked():
    from esmjac.errors import JacError
    from esmjac.runtime.programs import RhsProgram
    from tests.support.models import chem
    with pytest.raises(JacError) as e:
        RhsProgram.build(chem(cells=2), options={"progress": "yes", "cache": False})
    assert e.value.code == "bad_option"
