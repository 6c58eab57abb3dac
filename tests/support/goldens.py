"""Our own goldens: evaluation documents and scatter plans of the reference
fixtures, as deterministic JSON. Regenerated only by
``make goldens``; the tests compare byte for byte.

Run from the repository root: ``python -m tests.support.goldens [--write]``
(``make goldens``).

``goldens/<fixture>.<wrt>.evaldoc.json`` for every wrt whose Jacobian has
bands (``states`` always), and ``goldens/<fixture>.states.<layout>.plan.json``
for every layout the fixture's state Jacobian supports.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from esmjac.errors import JacError
from esmjac.layouts import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks
from esmjac.runtime.programs import JacobianProgram, RhsProgram

__all__ = ["golden_files", "FIXTURES", "WRTS", "LAYOUTS"]

FIXTURES = ("adv_interior", "adv_react_2d", "bd_chem", "contracted_ops",
            "coupled_chem_advection", "flux_form_adv", "minmod_adv")
WRTS = ("states", "parameters", "forcing", "time")
LAYOUTS = (LaneBlocks("natural"), LaneBlocks("markowitz"), LaneSparseBlocks(), ColumnBanded(), Csr())


def golden_files(fixtures_dir: Path) -> dict:
    """{file name: content} for every golden (builds the programs)."""
    out: dict = {}
    for fx in FIXTURES:
        src = Path(fixtures_dir) / f"{fx}.esm"
        rhs = RhsProgram.build(src)
        for wrt in WRTS:
            try:
                prog = JacobianProgram.build(src, wrt=wrt, options={"allow_empty": wrt != "states"})
            except JacError as exc:
                if exc.code in ("underivable_operator", "unsupported_construct"):
                    continue            # refused for this wrt: nothing to pin
                raise
            if not prog.bands and wrt != "states":
                continue
            out[f"{fx}.{wrt}.evaldoc.json"] = prog.doc.to_json() + "\n"
            if wrt != "states":
                continue
            for lay in LAYOUTS:
                try:
                    plan = prog.plan(lay, source=rhs)
                except JacError as exc:
                    if exc.code in ("nonuniform_pattern", "bad_option"):
                        continue
                    raise
                out[f"{fx}.{wrt}.{lay.name}.plan.json"] = plan.to_json()
    return out


def main(argv: list | None = None) -> int:
    """Compare the committed goldens with freshly built ones, or ``--write`` them."""
    from .paths import FIXTURES, ROOT
    ap = argparse.ArgumentParser(prog="python -m tests.support.goldens")
    ap.add_argument("--fixtures", default=str(FIXTURES))
    ap.add_argument("--out", default=str(ROOT / "goldens"))
    ap.add_argument("--write", action="store_true", help="regenerate the files (explicit only)")
    args = ap.parse_args(argv)
    files = golden_files(Path(args.fixtures))
    out = Path(args.out)
    stale = []
    for name, text in sorted(files.items()):
        path = out / name
        if args.write:
            out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            stale.append(name)
    if args.write:
        print(f"wrote {len(files)} goldens to {out}")
        return 0
    for name in stale:
        print(f"differs: {name}")
    print(f"{len(files) - len(stale)}/{len(files)} goldens identical")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
