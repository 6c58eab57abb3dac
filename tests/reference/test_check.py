"""``fd_check``: every reference fixture against central finite differences of
the ecosystem's own RHS (earthsci_ast.evaluate_rhs), and the properties a
chemist relies on -- no false alarm on badly scaled mechanisms, a real error
found and named, "nothing to check" where nothing is integrated, and the
``esmjac check`` command's exit codes and --model validation."""
from __future__ import annotations

import dataclasses
import importlib.resources
import json

import numpy as np
import pytest

import esmjac.reference.check as check_mod
from esmjac.cli import main
from esmjac.errors import JacError
from esmjac.reference.check import fd_check
from tests.support.models import chapman
from tests.support.paths import ALL_FIXTURES, FIXTURES, need_reference

TROPO = str(importlib.resources.files("esmjac") / "models" / "tropo12.esm")


@pytest.mark.parametrize("fx", ALL_FIXTURES)
def test_fixture_matches_finite_differences(fx, bandset):
    rep = fd_check(bandset(fx), points=3, seed=7)
    assert not rep.uncovered, rep.uncovered[:5]
    assert rep.ok, rep.summary()
    assert rep.nnz > 0


def test_badly_scaled_mechanism_checks_without_false_alarm():
    rep = fd_check(chapman(), points=3)
    assert rep.ok, rep.summary()
    assert not rep.uncovered
    # The state really is in the cancelling regime: some entry's difference
    # quotient is off by more than rtol (round-off of 1e9-sized row terms),
    # and the round-off floor is what keeps it from being an alarm.
    assert rep.max_rel_err > 1e-5, rep.summary()


def test_sampling_stays_around_the_document_state(monkeypatch):
    seen = []
    real = check_mod.assemble

    def spy(bs, u, t):
        seen.append(dict(u))
        return real(bs, u=u, t=t)
    monkeypatch.setattr(check_mod, "assemble", spy)
    fd_check(chapman(cells=2), points=3)
    for u in seen:
        o2 = np.array([v for k, v in u.items() if ".O2[" in k])
        o1d = np.array([v for k, v in u.items() if ".O1D[" in k])
        assert np.all((o2 > 5e16) & (o2 < 5e18)) and np.all((o1d > 0.01) & (o1d < 1.0))


def _sabotaged(monkeypatch, row_has: str, col_has: str, factor: float):
    """Scale one assembled entry: the check must see the wrong Jacobian."""
    real = check_mod.assemble

    def wrong(bs, u, t):
        a = real(bs, u=u, t=t)
        m = a.matrix.tocoo()
        for k, (i, j) in enumerate(zip(m.row, m.col)):
            if row_has in a.rows[i] and col_has in a.cols[j]:
                m.data[k] *= factor
        return dataclasses.replace(a, matrix=m.tocsr())
    monkeypatch.setattr(check_mod, "assemble", wrong)


def test_a_wrong_entry_is_found_and_named(monkeypatch):
    _sabotaged(monkeypatch, ".O3[2]", ".O[2]", 1.0 + 1e-3)
    rep = fd_check(chapman(), points=1)
    assert not rep.ok and rep.mismatches >= 1
    row, col, exact, fd, rel = rep.worst
    assert ".O3[2]" in row and col.endswith(".O[2]")
    assert rel == pytest.approx(1e-3, rel=0.05)
    assert "MISMATCH" in rep.summary() and row in rep.summary()


def test_a_dropped_entry_is_uncovered(monkeypatch):
    _sabotaged(monkeypatch, ".O1D[1]", ".O3[1]", 0.0)
    real = check_mod.assemble

    def pruned(bs, u, t):
        a = real(bs, u=u, t=t)
        m = a.matrix.copy()
        m.eliminate_zeros()
        return dataclasses.replace(a, matrix=m)
    monkeypatch.setattr(check_mod, "assemble", pruned)
    rep = fd_check(chapman(), points=1)
    assert not rep.ok
    assert any(".O1D[1]" in r and c.endswith(".O3[1]") for r, c, _ in rep.uncovered)


def test_tropo12_uniform_range_still_available():
    rep = fd_check(TROPO, points=1, lo=1e6, hi=1e12)
    assert rep.ok and "uniform" in rep.summary()
    with pytest.raises(JacError) as e:
        fd_check(TROPO, points=1, lo=1.0)
    assert e.value.code == "bad_option"


def _obs_only() -> dict:
    return {"esm": "1.1.0", "metadata": {"name": "Obs"}, "models": {"M": {"variables": {
        "y": {"type": "unknown"}, "k": {"type": "parameter", "default": 2.0}},
        "equations": [{"lhs": "y", "rhs": {"op": "*", "args": ["k", 3]}}]}}}


def test_nothing_to_check_is_said_not_ok(tmp_path, capsys):
    rep = fd_check(_obs_only(), points=1)
    assert rep.nothing_to_check and "nothing to check" in rep.summary()
    assert not rep.summary().startswith("OK")
    f = tmp_path / "obs.esm"
    f.write_text(json.dumps(_obs_only()))
    assert main(["check", str(f)]) == 4
    assert "nothing to check: no ODE states" in capsys.readouterr().out


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    f = tmp_path / "chapman.esm"
    f.write_text(json.dumps(chapman()))
    assert main(["check", str(f), "--points", "1"]) == 0
    assert capsys.readouterr().out.startswith("OK")
    assert main(["check", str(f), "--model", "Nope"]) == 2
    err = capsys.readouterr().err
    assert "model_not_found" in err and "Chapman" in err
    _sabotaged(monkeypatch, ".O3[1]", ".O3[1]", 2.0)
    assert main(["check", str(f), "--points", "1"]) == 1
    assert "MISMATCH" in capsys.readouterr().out


def test_model_is_validated_on_reaction_system_documents(capsys):
    need_reference()
    doc = FIXTURES / "coupled_chem_advection.esm"
    assert main(["check", str(doc), "--model", "Nope", "--points", "1"]) == 2
    err = capsys.readouterr().err
    assert "model_not_found" in err and "SimpleOzone" in err
    from esmjac.adapters.scipy import ivp
    with pytest.raises(JacError) as e:
        ivp(str(doc), model="Nope")
    assert e.value.code == "model_not_found"


def test_check_help_documents_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["check", "--help"])
    out = capsys.readouterr().out
    for word in ("--model", "--points", "--rtol", "exit codes", "nothing to check"):
        assert word in out
