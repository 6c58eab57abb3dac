"""Run esmjac's benchmark suite (targets T1-T7).

    python benchmarks/run.py [--quick] [--json FILE] [--plots DIR] [--results FILE] [--only SECTIONS]

The full report::

    python benchmarks/run.py --json benchmarks/results.json \\
        --plots benchmarks/plots --results benchmarks/RESULTS.md

``esmjac bench`` runs this script from a checkout. The suite is not part of
the installed package: it needs this folder (peers, the suite) and the
reference fixtures beside the checkout (``../shared/reference/fixtures`` or
``--fixtures``).
"""
from __future__ import annotations

import sys

from suite import main  # this script's own folder is first on sys.path

if __name__ == "__main__":
    sys.exit(main())
