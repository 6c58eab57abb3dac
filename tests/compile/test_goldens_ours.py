"""Our own goldens (evaluation documents and plans) are stable: rebuilding
them gives the committed bytes, and the documents are valid for the
compiler (every field's values were checked against the reference
assembly in test_program.py)."""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.support.paths import FIXTURES, need_reference

ROOT = pathlib.Path(__file__).resolve().parents[2]
OURS = ROOT / "goldens"


@pytest.fixture(scope="module")
def regenerated():
    need_reference()
    from tests.support.goldens import golden_files
    return golden_files(FIXTURES)


def test_every_golden_is_regenerated_byte_identical(regenerated):
    committed = {p.name for p in OURS.glob("*.json")}
    assert committed == set(regenerated), "run `make goldens` and review"
    for name, text in regenerated.items():
        assert (OURS / name).read_text() == text, name


def test_evaldoc_goldens_cover_all_seven_fixtures(regenerated):
    evaldocs = [n for n in regenerated if n.endswith(".states.evaldoc.json")]
    assert len(evaldocs) == 7
    for name in evaldocs:
        d = json.loads(regenerated[name])
        assert d["fields"], name
        # Source states are inputs only: no differential equation survives.
        assert '"op":"D"' not in regenerated[name]
        assert set(d["inputs"]["states"]) <= set(d["variables"])
        for f in d["fields"]:
            assert f["row"] in d["inputs"]["states"]


def test_contracted_bands_carry_their_extra_axes(regenerated):
    d = json.loads(regenerated["contracted_ops.states.evaldoc.json"])
    rows = [f for f in d["fields"] if len(f["region"]) > len(f["row_index"])]
    assert rows, "contracted_ops has contracted bands"


def test_plan_goldens_cover_layouts(regenerated):
    plans = [n for n in regenerated if n.endswith(".plan.json")]
    kinds = {n.split(".")[2] for n in plans}
    assert {"csr", "laneblocks-natural", "laneblocks-markowitz", "lanesparseblocks",
            "columnbanded"} <= kinds
