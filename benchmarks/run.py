"""Run esmjac's benchmark suite (DESIGN §10, targets T1-T5).

    python benchmarks/run.py [--quick] [--json FILE] [--plots DIR] [--results FILE]

A thin wrapper around :mod:`esmjac.bench` (the same as ``esmjac bench``);
the full report::

    python benchmarks/run.py --json benchmarks/results.json \\
        --plots benchmarks/plots --results benchmarks/RESULTS.md
"""
from __future__ import annotations

import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from esmjac.bench import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
