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


def test_a_too_loose_tolerance_passes_and_says_what_it_was_held_to(monkeypatch):
    """A 1e-3 relative error passes at rtol=1e-2 (and the summary says it
    was held to 1e-2, names the entry, both values and the tolerance), fails
    at the default 1e-5, and passes again under a large enough atol."""
    _sabotaged(monkeypatch, ".O3[2]", ".O[2]", 1.0 + 1e-3)
    loose = fd_check(chapman(), points=1, rtol=1e-2)
    assert loose.ok and loose.mismatches == 0
    text = loose.summary()
    assert text.startswith("OK") and "rtol=0.01" in text and "atol=0" in text
    assert f"{loose.compared} entries compared" in text and loose.compared >= loose.nnz
    row, col, exact, fd, rel = loose.worst
    assert ".O3[2]" in row and col.endswith(".O[2]")     # the sabotaged entry is the closest to failing
    d, tol, rpart, apart, floor = loose.worst_tolerance
    assert d == pytest.approx(abs(exact - fd)) and tol == pytest.approx(rpart + apart + floor)
    assert rpart == pytest.approx(1e-2 * max(abs(exact), abs(fd)))
    assert d < tol and f"{exact:.6e}" in text and f"{tol:.3e}" in text
    strict = fd_check(chapman(), points=1)
    assert not strict.ok and "MISMATCH" in strict.summary() and "rtol=1e-05" in strict.summary()
    absolute = fd_check(chapman(), points=1, atol=10 * d)
    assert absolute.ok and f"atol={10 * d:g}" in absolute.summary()
    with pytest.raises(JacError) as e:
        fd_check(chapman(), points=1, atol=-1.0)
    assert e.value.code == "bad_option"


def _nonfinite_doc() -> dict:
    """Z is a species whose document value is 0 and the rate of A -> B is
    k / Z with k = 0 as well: 0/0 at the document's own state only (the
    sampled states give Z a non-zero value)."""
    from esmjac.models.mechanism import box, mechanism_doc
    rx = [{"id": "R1", "reactants": ["A"], "products": {"B": 1}, "rate": {"op": "/", "args": ["k", "Z"]}},
          {"id": "R2", "reactants": ["B"], "products": {"A": 1, "Z": 1}, "rate": "k2"},
          {"id": "R3", "reactants": ["Z"], "products": {}, "rate": "k2"}]
    return box(mechanism_doc("M", {"A": 1.0, "B": 2.0, "Z": 0.0}, {"k": 0.0, "k2": 1.0}, rx, 1))


def test_a_non_finite_document_state_fails_naming_species_and_rate(tmp_path, capsys):
    import earthsci_ast as ea
    doc = _nonfinite_doc()
    # the oracle agrees: earthsci_ast refuses the derivatives at the document's state
    flat = ea.flatten(ea.load_string(json.dumps(doc)))
    with pytest.raises(Exception, match="(?i)non-finite"):
        ea.evaluate_rhs(flat, {"M.A": 1.0, "M.B": 2.0, "M.Z": 0.0}, 0.0, {})
    rep = fd_check(doc, points=2)
    assert not rep.ok and rep.nonfinite
    assert rep.mismatches == 0                          # the sampled points themselves agree
    text = rep.summary()
    assert text.startswith("NON-FINITE")
    assert any("RHS of M.A" in s and "M.k / M.Z" in s and "M.Z = 0" in s for s in rep.nonfinite), rep.nonfinite
    assert any("RHS of M.B" in s for s in rep.nonfinite)
    f = tmp_path / "nf.esm"
    f.write_text(json.dumps(doc))
    assert main(["check", str(f), "--points", "1"]) == 5
    out = capsys.readouterr().out
    assert out.startswith("NON-FINITE") and "M.k / M.Z" in out


@pytest.mark.parametrize("fx", ["tropo12", "chapman2", *ALL_FIXTURES[:4]])
def test_the_reused_rhs_is_evaluate_rhs_bit_for_bit(fx, bandset):
    """The check's finite differences call earthsci-ast's right-hand side
    built once (check._Rhs); oracle: ``evaluate_rhs`` itself
    (check.rhs_vector), which builds it anew per call, at random states and
    times."""
    from esmjac.calculus.bandset import BandSet
    from esmjac.model.layout import element_names, ode_states

    bs = BandSet.build(TROPO) if fx == "tropo12" else BandSet.build(chapman(cells=2)) \
        if fx == "chapman2" else bandset(fx)
    states = ode_states(bs.view)
    names = element_names(bs.view, states)
    flat = check_mod._flat(bs.view)
    ref, scale = check_mod._reference_state(bs.view, states)
    rhs = check_mod._Rhs(flat, names, ref)
    assert rhs._build is not None                   # the reused build, not the per-call fallback
    rng = np.random.default_rng(3)
    for k in range(3):
        y = np.where(ref != 0, ref, scale) * 10.0 ** rng.uniform(-1, 1, len(names))
        t = float(rng.uniform(0, 1)) if k else 0.0
        want = check_mod.rhs_vector(flat, names, y, t)
        got = rhs(y, t)
        assert got.tobytes() == want.tobytes(), (fx, k)
        y[0] *= 1.5                                  # another state: not a stale buffer
        assert rhs(y, t).tobytes() == check_mod.rhs_vector(flat, names, y, t).tobytes()


# ------------------------------------------------ column groups (issue #22: check on 272 species)

def _chain_box(n: int = 14) -> dict:
    """A scalar box of ``n`` species S0..S{n-1}: S_k + S_{k+1} -> S_{k+2}
    and S_k -> S_{k+1} (photolysis-like), defaults spread over six decades:
    a banded Jacobian, so a few columns per group."""
    from esmjac.models.mechanism import box, mechanism_doc
    species = {f"S{k}": 10.0 ** (k % 7) for k in range(n)}
    params = {f"k{k}": 1e-3 * (1 + k) for k in range(n)} | {f"j{k}": 0.05 * (1 + k % 3) for k in range(n)}
    rx = [{"id": f"R{k}", "reactants": [f"S{k}", f"S{k + 1}"], "products": {f"S{k + 2}": 1}, "rate": f"k{k}"}
          for k in range(n - 2)]
    rx += [{"id": f"P{k}", "reactants": [f"S{k}"], "products": {f"S{k + 1}": 1}, "rate": f"j{k}"}
           for k in range(n - 1)]
    return box(mechanism_doc("C", species, params, rx, 1))


def _differences_both_ways(src, seed=5):
    """(grouped F, column-by-column F, floor, U, groups) at one sampled point
    of ``src``, as fd_check computes them."""
    from esmjac.calculus.bandset import BandSet
    from esmjac.model.layout import element_names, ode_states
    from esmjac.runtime.progress import task
    bs = BandSet.build(src)
    states = ode_states(bs.view)
    names = element_names(bs.view, states)
    flat = check_mod._flat(bs.view)
    ref, scale = check_mod._reference_state(bs.view, states)
    rhs = check_mod._Rhs(flat, names, ref)
    y = ref * 10.0 ** (0.5 * np.random.default_rng(seed).uniform(-1, 1, len(names)))
    a = check_mod.assemble(bs, u=dict(zip(names, y)), t=0.0)
    J = a.matrix.toarray()
    U = (J != 0) | check_mod._structure(flat, names)
    groups = check_mod._column_groups(U)
    f0 = rhs(y, 0.0)
    terms = np.abs(f0) + np.abs(J) @ np.abs(y)
    steps = check_mod._steps(y, scale)
    with task(False, "check") as prog:
        Fg, hg, _ = check_mod._grouped_differences(rhs, y, 0.0, steps, groups, U, terms, U.sum(1), 0.0,
                                                   np.random.default_rng(1), prog)
        Fc, hc = check_mod._column_differences(rhs, y, 0.0, steps, prog)
    return Fg, hg, Fc, hc, check_mod._NOISE * check_mod._EPS * terms[:, None] / hc[None, :], U, groups


@pytest.mark.parametrize("src", ["chain", "tropo12", "chapman"])
def test_grouped_differences_are_the_column_by_column_ones(src):
    """Oracle: each column differenced alone through earthsci-ast. Grouped,
    every entry agrees within the round-off floor both are held to, an
    entry outside the structure is exactly zero in both, the steps are the
    same bits, and no row reads two columns of one group."""
    doc = _chain_box() if src == "chain" else TROPO if src == "tropo12" else chapman()
    Fg, hg, Fc, hc, floor, U, groups = _differences_both_ways(doc)
    assert Fg is not None                                   # the structure held (no fallback)
    assert np.array_equal(hg, hc)
    assert np.all(np.abs(Fg - Fc) <= floor + 1e-9 * np.abs(Fc))
    assert np.all(Fc[~U] == 0.0) and np.all(Fg[~U] == 0.0)
    assert sorted(np.concatenate(groups).tolist()) == list(range(U.shape[1]))
    for g in groups:
        assert U[:, g].sum(axis=1).max() <= 1
    if src == "chain":
        assert len(groups) < U.shape[1] / 2                 # grouping pays on a banded box


@pytest.fixture
def no_batch(monkeypatch):
    """The grouped differences, not the one-pass batch (which a scalar box takes first)."""
    monkeypatch.setattr(check_mod._Batch, "of", classmethod(lambda cls, *a: None))


@pytest.mark.parametrize("src", ["chain", "chapman"])
def test_grouped_check_reports_what_the_column_by_column_check_reports(src, no_batch):
    doc = _chain_box() if src == "chain" else chapman()
    g = fd_check(doc, points=3, seed=7)
    c = fd_check(doc, points=3, seed=7, group_columns=False)
    assert g.ok and c.ok, (g.summary(), c.summary())
    assert g.compared == c.compared and g.nnz == c.nnz and g.mismatches == c.mismatches == 0
    assert g.worst[:2] == c.worst[:2] and g.worst[2] == c.worst[2]
    assert g.max_rel_err == pytest.approx(c.max_rel_err, rel=1e-3, abs=1e-9)
    assert g.ungrouped_points == 0
    if src == "chain":
        assert 1 <= g.groups < g.n_states and g.rhs_calls < c.rhs_calls
        assert f"{g.groups} structurally orthogonal groups" in g.summary()
    else:       # every cell reads every cell as earthsci-ast's structure is read: a group per column
        assert g.groups == 0 and g.rhs_calls == c.rhs_calls


@pytest.mark.parametrize("how", ["grouped", "batch"])
def test_grouped_check_finds_a_planted_error_and_an_entry_moved_to_another_column(monkeypatch, how):
    """A 1e-3 error in one entry is found and named with grouping on; so is
    a derivative stored under the wrong species (d S5/d S4's value moved to
    d S5/d S9, a column no row of the stored pattern shares with S4: the
    stored pattern alone would put both columns in one group). The same
    with every column's differences in one batch."""
    doc = _chain_box()

    def no_batch():
        if how == "grouped":
            monkeypatch.setattr(check_mod._Batch, "of", classmethod(lambda cls, *a: None))
    no_batch()
    _sabotaged(monkeypatch, "C.S5", "C.S4", 1.0 + 1e-3)
    rep = fd_check(doc, points=1)
    assert not rep.ok and rep.mismatches >= 1
    assert (rep.groups, rep.batched_points) == ((0, 1) if how == "batch" else (rep.groups, 0)) and \
        (how == "batch" or rep.groups)
    assert rep.worst[0] == "C.S5" and rep.worst[1] == "C.S4"
    assert rep.worst[4] == pytest.approx(1e-3, rel=0.05)
    monkeypatch.undo()
    no_batch()
    real = check_mod.assemble

    def moved(bs, u, t):
        a = real(bs, u=u, t=t)
        m = a.matrix.tolil()
        i, j, k = a.rows.index("C.S5"), a.cols.index("C.S4"), a.cols.index("C.S9")
        m[i, k], m[i, j] = m[i, j], 0.0
        m = m.tocsr()
        m.eliminate_zeros()
        return dataclasses.replace(a, matrix=m)
    monkeypatch.setattr(check_mod, "assemble", moved)
    rep = fd_check(doc, points=1)
    assert not rep.ok and (rep.groups or how == "batch") and rep.ungrouped_points == 0
    assert ("C.S5", "C.S4") in {(r, c) for r, c, _ in rep.uncovered}
    assert rep.mismatches >= 1 and rep.worst[:2] in {("C.S5", "C.S9"), ("C.S5", "C.S4")}


def test_a_structure_that_misses_an_entry_falls_back_to_column_by_column(monkeypatch, no_batch):
    """If earthsci-ast's structure as read here missed a dependency (and the
    stored pattern did too), the grouped differences would see zero there;
    the checks of the structure (rows outside it move; the directional
    difference) send that point to column-by-column differences, which
    find the entry uncovered."""
    doc = _chain_box()
    real_structure = check_mod._structure

    def missing(flat, names):
        S = real_structure(flat, names)
        S[names.index("C.S6"), names.index("C.S5")] = False
        return S
    monkeypatch.setattr(check_mod, "_structure", missing)
    _sabotaged(monkeypatch, "C.S6", "C.S5", 0.0)
    real = check_mod.assemble

    def pruned(bs, u, t):
        a = real(bs, u=u, t=t)
        m = a.matrix.copy()
        m.eliminate_zeros()
        return dataclasses.replace(a, matrix=m)
    monkeypatch.setattr(check_mod, "assemble", pruned)
    rep = fd_check(doc, points=2)
    assert not rep.ok and rep.ungrouped_points == 2
    assert ("C.S6", "C.S5") in {(r, c) for r, c, _ in rep.uncovered}


@pytest.mark.parametrize("points", [1, 3])
def test_the_batch_pass_gives_the_column_by_column_check(points):
    """A scalar box takes every column's differences in one pass of
    earthsci-ast's interpreter over all perturbed states; oracle: the same
    check with each perturbed state through earthsci-ast's right-hand side
    (2n calls a point). Same entries compared, same worst entry and values
    (mass action: the same operations on the same operands, so the same
    bits), and about three right-hand-side calls a point instead of 2n + 1."""
    doc = _chain_box()
    b = fd_check(doc, points=points, seed=3)
    c = fd_check(doc, points=points, seed=3, group_columns=False)
    assert b.ok and c.ok and b.batched_points == points and c.batched_points == 0
    assert (b.compared, b.nnz, b.mismatches, b.max_rel_err, b.max_abs_err) == \
        (c.compared, c.nnz, c.mismatches, c.max_rel_err, c.max_abs_err)
    assert b.worst == c.worst and b.worst_tolerance == c.worst_tolerance
    assert b.rhs_calls <= 3 * points < c.rhs_calls
    assert "one pass of earthsci-ast's interpreter" in b.summary()


def test_a_batch_that_disagrees_with_the_right_hand_side_is_not_used(monkeypatch):
    """Where the one-pass values are not the right-hand side's at the
    point, that point is differenced by the right-hand-side calls."""
    real = check_mod._Batch.__call__

    def off(self, Y, t):
        V = real(self, Y, t)
        V[0] *= 1.0 + 1e-9
        return V
    monkeypatch.setattr(check_mod._Batch, "__call__", off)
    rep = fd_check(_chain_box(), points=2)
    assert rep.ok and rep.batched_points == 0 and rep.groups
