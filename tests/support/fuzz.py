"""The call-surface fuzz driven by hypothesis (run in a child process by
tests/runtime/test_fuzz.py, so a segfault fails that test).

Every call gets arguments drawn from good and bad kinds (wrong length,
dtype, layout, complex, masked, read-only, aliased, foreign or tampered
workspaces, odd ``t`` and lane counts), plus mutated documents. Outcomes per
category: ``ok`` (accepted, and the result equals the hand-derived oracle of
the two-species mechanism of tests/support/models.chem), ``refused`` (a
``JacError``, by code), ``bare`` (any other exception: a failure),
``wrong`` (accepted with a wrong result, or accepted although the input
must be refused: a failure). Prints ``RESULT {json}``.

Oracle: per cell f_A = -k1 A + k2 B², f_B = k1 A - 2 k2 B²; J as in
tests/compile/test_cache.py; contract out_B = (2 k2 λ_A − 4 k2 λ_B) v_B.
"""
from __future__ import annotations

import copy
import json
import sys
import warnings
from collections import Counter, defaultdict

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esmjac.errors import JacError
from esmjac.layouts import Csr
from esmjac.models.gridded import diffusion_model
from esmjac.runtime.programs import JacobianProgram, RhsProgram

from .models import chem, chem_jacobian

CELLS = 4
N = 2 * CELLS
OUT: dict = defaultdict(lambda: {"tried": 0, "ok": 0, "refused": Counter(), "bare": [], "wrong": []})

ARRAY_KINDS = ["good", "good", "good", "f32", "wrong_len", "int", "complex", "masked", "2d", "noncontig",
               "list", "none", "readonly"]
MUST_REFUSE_IN = {"wrong_len", "int", "complex", "masked", "2d", "noncontig", "list", "none"}
VALUES = st.one_of(st.floats(0.1, 10.0), st.sampled_from([0.0, -1.0, 1e300, np.nan, np.inf]))
T_KINDS = [0.0, 1, 2.5, "f32", "i64", "0d", "nan", "inf", None, "0", 1j, "arr", True]
T_BAD = {"inf", None, "0", 1j, "arr", True}


def _t(kind):
    return {"f32": np.float32(1.5), "i64": np.int64(3), "0d": np.array(0.5), "nan": float("nan"),
            "inf": float("inf"), "arr": np.zeros(2)}.get(kind, kind) if isinstance(kind, str) or kind is None \
        else kind


def _array(kind: str, vals: list, n: int, dtype=np.float64):
    base = np.array((vals * (n // max(len(vals), 1) + 1))[:n], dtype=dtype)
    if kind in ("good", "readonly"):
        a = base.copy()
        if kind == "readonly":
            a.flags.writeable = False
        return a
    return {"f32": lambda: base.astype(np.float32), "wrong_len": lambda: np.ones(n + 1),
            "int": lambda: base.astype(np.int64), "complex": lambda: base.astype(complex),
            "masked": lambda: np.ma.masked_array(base, mask=np.zeros(n, bool)),
            "2d": lambda: base.reshape(1, n), "noncontig": lambda: np.repeat(base, 2)[::2],
            "list": lambda: base.tolist(), "none": lambda: None}[kind]()


def _rhs_oracle(u, p):
    u = np.asarray(u, dtype=np.float64)
    k1, k2 = p
    L = u.size // 2
    A, B = u[:L], u[L:]
    return np.concatenate([-k1 * A + k2 * B * B, k1 * A - 2 * k2 * B * B])


def _jac_oracle(u, p):
    return chem_jacobian(u, *p)


def _same(got, want, dtype) -> bool:
    tol = 1e-12 if dtype == np.float64 else 2e-5
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        fin = np.isfinite(want)
        if dtype == np.float32:         # values past float32's range overflow by design
            fin &= np.abs(want) < 1e38
        return bool(np.all(np.isfinite(got[fin]) & (np.abs(got[fin] - want[fin]) <= tol * (1 + np.abs(want[fin])))))


def _record(cat: str, fn, check, must_refuse: bool, desc) -> None:
    rec = OUT[cat]
    rec["tried"] += 1
    try:
        res = fn()
    except JacError as exc:
        rec["refused"][exc.code] += 1
        return
    except Exception as exc:            # noqa: BLE001 - this is what the fuzz looks for
        rec["bare"].append(f"{desc}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    if must_refuse:
        rec["wrong"].append(f"{desc}: accepted")
    elif not check(res):
        rec["wrong"].append(f"{desc}: wrong result")
    else:
        rec["ok"] += 1


def main(examples: int = 150) -> None:
    warnings.simplefilter("ignore")
    J = JacobianProgram.build(chem(cells=CELLS))
    R = RhsProgram.build(chem(cells=CELLS))
    Jo = JacobianProgram.build(diffusion_model(12))
    Ro = RhsProgram.build(diffusion_model(12))
    plan = J.plan(Csr())
    cfg = settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                   suppress_health_check=list(HealthCheck))

    scratch_kinds = ["none", "own", "own", "own8", "foreign", "tamper_h", "tamper_cix", "tamper_lanes"]

    def scratch(kind, prog_ws, foreign_ws):
        if kind == "none":
            return None, False
        if kind == "foreign":
            return foreign_ws(), True
        ws = prog_ws(8 if kind == "own8" else None)
        if kind == "tamper_h":
            ws.h = np.zeros(0)
        elif kind == "tamper_cix":
            ws.cix = np.zeros(max(ws.cix.shape[0] // 2, 1), np.int64)
        elif kind == "tamper_lanes":
            ws.lanes = ws.lanes * 3
        return ws, kind.startswith("tamper")

    # One fault per example (or none), so each outcome is attributable.
    RHS_FAULTS = [None] * 6 + ["u:" + k for k in ARRAY_KINDS if k != "good"] + [
        "out:" + k for k in ("wrong_len", "readonly", "f32", "int", "complex", "masked", "2d", "noncontig",
                             "list", "none", "alias", "overlap")] + [
        "p:" + k for k in ("complex", "masked", "short", "str", "none", "nan")] + [
        "t:" + repr(k) for k in T_KINDS] + ["scratch:" + k for k in scratch_kinds if k != "own"]
    OK_FAULTS = {"u:f32", "u:readonly", "p:nan", "t:0.0", "t:1", "t:2.5", "t:'f32'", "t:'i64'", "t:'0d'", "t:'nan'",
                 "scratch:none", "scratch:own8"}

    def setup(fault, vals, n_default, make_ws, foreign_ws):
        kind, _, what = (fault or "none:").partition(":")
        ws, bad_ws = scratch(what if kind == "scratch" else "own", make_ws, foreign_ws)
        return kind, what, ws, bad_ws

    @cfg
    @given(fault=st.sampled_from(RHS_FAULTS), vals=st.lists(VALUES, min_size=1, max_size=8))
    def rhs(fault, vals):
        kind, what, sc, bad_sc = setup(fault, vals, CELLS, lambda L: R.new_buffers(L), lambda: Ro.new_buffers())
        L = 8 if fault == "scratch:own8" else CELLS
        n = 2 * L
        dtype = np.float32 if fault in ("u:f32",) else np.float64
        u = _array(what if kind == "u" else "good", vals, n)
        out = np.zeros(n, dtype)
        if kind == "out":
            if what == "alias":
                out = u
            elif what == "overlap":
                buf = np.ones(2 * n)
                u, out = buf[:n], buf[n // 2:n // 2 + n]
                u[:] = _array("good", vals, n)
            else:
                out = _array(what, [0.0], n)
        p = [0.3, 2.0]
        if kind == "p":
            p = {"complex": np.array([0.3, 2.0], complex), "masked": np.ma.masked_array([0.3, 2.0]),
                 "short": [0.3], "str": "ab", "none": None, "nan": [np.nan, 2.0]}[what]
        t = 0.0
        if kind == "t":
            t = _t(eval(what))           # noqa: S307 - our own repr() of T_KINDS
        pv = [np.nan, 2.0] if fault == "p:nan" else [0.3, 2.0]
        must = fault is not None and fault not in OK_FAULTS

        def check(res):
            with np.errstate(all="ignore"):
                want = _rhs_oracle(u, pv)
            return _same(res, want, dtype)
        _record("rhs.eval_into", lambda: R.eval_into(u, p, t, None, out, sc), check, must, fault)
        OUT["rhs.eval_into"].setdefault("faults", Counter())[str(fault)] += 1

    JAC_FAULTS = [None] * 6 + ["u:" + k for k in ARRAY_KINDS if k not in ("good", "readonly")] + [
        "out:" + k for k in ("wrong_len", "readonly", "f32", "int", "complex", "masked", "overlap")] + [
        "t:" + repr(k) for k in T_KINDS] + ["scratch:" + k for k in scratch_kinds if k not in ("own", "none")]
    JAC_OK = {"t:0.0", "t:1", "t:2.5", "t:'f32'", "t:'i64'", "t:'0d'", "t:'nan'", "scratch:own8"}

    @cfg
    @given(fault=st.sampled_from(JAC_FAULTS), vals=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=8))
    def jac(fault, vals):
        kind, what, ws, bad_ws = setup(fault, vals, CELLS, lambda L: J.new_workspace(L), lambda: Jo.new_workspace())
        L = 8 if fault == "scratch:own8" else CELLS
        n = 2 * L
        m = plan.out_size(L)
        dtype = np.float32 if fault == "u:f32" else np.float64
        u = _array(what if kind == "u" else "good", vals, n)
        out = np.zeros(m, dtype)
        if kind == "out":
            if what == "overlap":
                buf = np.ones(m + n)
                u, out = buf[m - 1:m - 1 + n], buf[:m]
                u[:] = _array("good", vals, n)
            else:
                out = _array(what, [0.0], m)
        t = _t(eval(what)) if kind == "t" else 0.0       # noqa: S307
        must = fault is not None and fault not in JAC_OK and fault != "u:f32"
        if fault == "u:f32":
            out = np.zeros(m, np.float32)

        def check(res):
            if L != CELLS:
                return True                 # padded lanes: covered by the plan tests
            from scipy.sparse import csr_array
            got = csr_array((res, plan.indices, plan.indptr), shape=(N, N)).toarray()
            return _same(got, _jac_oracle(np.asarray(u, np.float64), (0.3, 2.0)), dtype)
        _record("jac.eval_into", lambda: J.eval_into(plan, u, J.p0, t, None, out, ws), check, must, fault)

    @cfg
    @given(vk=st.sampled_from(["good"] * 10 + ARRAY_KINDS + ["alias"]),
           yk=st.sampled_from(["good"] * 8 + ["readonly", "wrong_len", "f32", "complex", "masked"]),
           which=st.sampled_from(["apply", "apply_transpose", "contract_out_v", "contract_out_lam", "contract",
                                  "contract"]),
           fresh=st.sampled_from([False] * 5 + [True]), vals=st.lists(st.floats(-5, 5), min_size=1, max_size=8))
    def products(vk, yk, which, fresh, vals):
        ws = J.new_workspace()
        u = np.linspace(1.0, 2.0, N)
        if not fresh:
            J.eval_into(plan, u, J.p0, 0.0, None, np.zeros(plan.out_size(CELLS)), ws)
        y = _array(yk, [0.0], N)
        v = y if vk == "alias" else _array(vk, vals, N)
        must = fresh or vk in MUST_REFUSE_IN or vk == "alias" or yk in ("readonly", "wrong_len", "complex",
                                                                        "masked")
        if yk == "f32" and which != "apply":
            must = True                     # gbar and contract's out accumulate in float64
        Jd = _jac_oracle(u, (0.3, 2.0))
        if which == "apply":
            call, want = (lambda: J.apply(plan, ws, v, y)), lambda: Jd @ np.asarray(v, float)
        elif which == "apply_transpose":
            call, want = (lambda: J.apply_transpose(plan, ws, v, y)), lambda: Jd.T @ np.asarray(v, float)
        else:
            lam = np.linspace(-1, 1, N)
            if which == "contract_out_v":
                args = (lam, v, v)
                must = True
            elif which == "contract_out_lam":
                args = (v, lam, v)
                must = True
            else:
                args = (lam, v, y)
            call = lambda: J.contract(plan, ws, *args)  # noqa: E731

            def want():
                w = np.zeros(N)
                vv = np.asarray(v, float)
                w[CELLS:] = (2 * 2.0 * lam[:CELLS] - 4 * 2.0 * lam[CELLS:]) * vv[CELLS:]
                return w
        dtype = np.float32 if "f32" in (yk, vk) else np.float64
        _record(f"jac.{which.split('_out')[0]}", call, lambda res: _same(res, want(), dtype), must,
                (vk, yk, which, fresh))

    @cfg
    @given(lanes=st.one_of(st.integers(-3, 70), st.sampled_from([2.5, "3", True, False, None, 10**13, np.int64(5),
                                                                 np.float64(4.0), [2], 1j]),
                           st.integers(10**12, 10**18)),
           which=st.sampled_from(["new_workspace", "new_buffers"]))
    def lanes(lanes, which):
        fn = J.new_workspace if which == "new_workspace" else R.new_buffers
        ok_kind = lanes is None or (isinstance(lanes, (int, np.integer)) and not isinstance(lanes, bool)
                                    and 1 <= lanes < 10**8)
        _record("lanes", lambda: fn(lanes), lambda ws: ws.lanes == (CELLS if lanes is None else lanes),
                not ok_kind, (lanes, which))

    def mutate(doc, how, x):
        m = doc["models"]["M"]
        body = m["equations"][0]["rhs"]["expr"]["args"]
        if how == "size":
            doc["index_sets"]["cell"]["size"] = x
        elif how == "literal":
            body.append({"op": "*", "args": [x, "k1"]})
        elif how == "index":
            body.append({"op": "index", "args": ["A", x]})
        elif how == "arity":
            body.append({"op": ["ifelse", "index", "exp", "/", "log"][x % 5], "args": ["k1"] * (x % 4)})
        elif how == "dup":
            m["equations"].append(copy.deepcopy(m["equations"][x % 2]))
        elif how == "name":
            m["variables"][["", " ", "k1"][x % 3]] = {"type": "parameter", "default": 1.0}
        return doc

    @cfg
    @given(how=st.sampled_from(["size", "literal", "index", "arity", "dup", "name"]),
           x=st.one_of(st.integers(-5, 10), st.sampled_from([10**9, 10**30, 10**400, float("inf"), float("nan"),
                                                             1e308, -0.0, 2**53 + 1])))
    def documents(how, x):
        from esmjac.calculus.bandset import BandSet
        if how in ("index", "arity", "dup", "name") and not isinstance(x, int):
            x = 3
        doc = mutate(chem(cells=CELLS), how, x)
        bad = {"size": not (isinstance(x, int) and 1 <= x <= 10**8), "literal": isinstance(x, float) and not np.isfinite(x)
               or isinstance(x, int) and abs(x) > 2**63,
               "index": not (isinstance(x, int) and 1 <= x <= CELLS), "arity": x % 5 in (0, 1) and x % 4 != {0: 3, 1: 2}[x % 5]
               or x % 5 in (2, 4) and x % 4 != 1 or x % 5 == 3 and x % 4 < 2,
               "dup": True, "name": x % 3 in (0, 1)}[how]
        if how == "arity" and x % 5 == 1 and x % 4 >= 2:
            bad = True          # index("k1", …): indexing a scalar parameter
        _record("documents", lambda: BandSet.build(doc), lambda b: True, bad, (how, repr(x)[:30]))

    for fn in (rhs, jac, products, lanes, documents):
        fn()
    res = {k: {**v, "refused": dict(v["refused"])} for k, v in OUT.items()}
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
