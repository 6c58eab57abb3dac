"""``esmjac demo``: what it prints is what it did (cells solved, build time
apart, both SciPy peers, relative differences), and it refuses or skips what
would not fit."""
from __future__ import annotations

import pytest

import esmjac.demo as demo
from esmjac.errors import JacError


def test_demo_reports_build_peers_and_cells(monkeypatch):
    lines: list = []
    assert demo.run_demo(cells=3, t_end=600.0, out=lines.append) == 0
    text = "\n".join(lines)
    assert "3 cells = 45 unknowns" in text and "3 cells x 15 species" in text
    assert "compiled and warmed in" in text
    assert "SciPy FD + jac_sparsity" in text and "SciPy default (dense FD)" in text
    assert "over SciPy with jac_sparsity" in text and "over SciPy's default" in text
    assert "largest relative error" in text
    # what is compared, and how it is timed
    assert "only the Jacobian differs" in text and "CPU seconds of one thread" in text
    assert "0.166667 h of chemistry" in text


def test_demo_fails_when_the_routes_disagree(monkeypatch):
    """The routes' final states are compared; a disagreement beyond AGREE is
    a failed demo, not a speed-up (AGREE 0: every real solve differs a bit)."""
    monkeypatch.setattr(demo, "AGREE", 0.0)
    monkeypatch.setattr(demo, "DENSE_LIMIT", 30)
    lines: list = []
    assert demo.run_demo(cells=3, t_end=600.0, out=lines.append) == 1
    text = "\n".join(lines)
    assert "the solutions disagree" in text and "speed-up" not in text


def test_demo_skips_the_dense_comparison_where_it_would_not_fit(monkeypatch):
    monkeypatch.setattr(demo, "DENSE_LIMIT", 30)
    lines: list = []
    assert demo.run_demo(cells=3, t_end=600.0, out=lines.append) == 0
    text = "\n".join(lines)
    assert "SciPy default (dense FD): skipped: 45 unknowns > 30" in text and "try --cells 2" in text
    assert "over SciPy's default" not in text


@pytest.mark.parametrize("cells", [0, demo.MAX_CELLS + 1])
def test_demo_refuses_grids_it_cannot_solve_in_a_minute(cells):
    with pytest.raises(JacError) as e:
        demo.run_demo(cells=cells, out=lambda s: None)
    assert e.value.code == "bad_option"
