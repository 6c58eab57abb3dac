"""Our own goldens: evaluation documents and scatter plans of the reference
fixtures, as deterministic JSON. Regenerated only by ``esmjac goldens
--write``; the tests compare byte for byte.

``goldens/<fixture>.<wrt>.evaldoc.json`` for every wrt whose Jacobian has
bands (``states`` always), and ``goldens/<fixture>.states.<layout>.plan.json``
for every layout the fixture's state Jacobian supports.
"""
from __future__ import annotations

from pathlib import Path

from .errors import JacError
from .layouts import ColumnBanded, Csr, LaneBlocks, LaneSparseBlocks

__all__ = ["golden_files", "FIXTURES", "WRTS", "LAYOUTS"]

FIXTURES = ("adv_interior", "adv_react_2d", "bd_chem", "contracted_ops",
            "coupled_chem_advection", "flux_form_adv", "minmod_adv")
WRTS = ("states", "parameters", "forcing", "time")
LAYOUTS = (LaneBlocks("natural"), LaneBlocks("markowitz"), LaneSparseBlocks(), ColumnBanded(), Csr())


def golden_files(fixtures_dir: Path) -> dict:
    """{file name: content} for every golden (builds the programs)."""
    from .program import JacobianProgram, RhsProgram
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
