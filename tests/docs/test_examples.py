"""The worked examples run as a user runs them (a fresh interpreter), at a
small size."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_box_on_grid_runs_and_draws_its_map(tmp_path):
    for mod in ("distributed", "xarray", "matplotlib"):
        pytest.importorskip(mod)
    out = tmp_path / "map.png"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "box_on_grid.py"), "--nlat", "6",
                           "--nlon", "12", "--chunk-lat", "2", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "72 cells, 3 chunks" in proc.stdout and "0 failed cell(s)" in proc.stdout
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
