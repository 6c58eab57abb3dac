"""The hostile-document fuzz driven by hypothesis (run in a child process
under a memory limit by tests/model/test_docfuzz.py, so a crash or an
exhausted machine fails that test instead of the run).

Each example mutates the two-species document of tests/support/models.chem
— names (arbitrary Unicode, code-injection attempts), ``ref``s (devices,
FIFOs, URLs, cycles, missing files, folders), index-set sizes, defaults,
literals and nesting depth — then loads it and generates its RHS and
Jacobian source (no Numba compile: the generated module is parsed and its
shape compared with the plain document's). Outcomes per category:

* ``ok``: loaded and generated; the module has the plain document's code
  shape (tests/compile/test_codegen_names._shape) when only names changed;
* ``refused:<code>``: a ``JacError``;
* ``bare:<type>`` (a failure): any other exception;
* ``hang`` (a failure): an example over its time budget (``SIGALRM``);
* ``exec`` (a failure): the injection marker file appeared;
* ``changed`` (a failure): a names-only mutation changed the module's code.

Prints ``RESULT {json}`` with the counts.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from esmjac.errors import JacError
from tests.support.models import chem

WORK = Path(tempfile.mkdtemp(prefix="esmjac-docfuzz-"))
MARKER = WORK / "pwned"
COUNTS: Counter = Counter()
BUDGET_S = 120

INJECT = [f'M""";open({str(MARKER)!r},"w");"""', f"x\nopen({str(MARKER)!r},'w')\n#",
          f"x'''+open({str(MARKER)!r},'w')+'''", "a\\", "a\ud800", "ｏｕｔ", "ﬁ", "Ö₃", "out", "h", "u"]

(WORK / "fifo").exists() or os.mkfifo(WORK / "fifo")
(WORK / "dir").mkdir(exist_ok=True)
(WORK / "self.esm").write_text(json.dumps({"esm": "1.1.0", "metadata": {"name": "s"},
                                           "models": {"M": {"ref": "self.esm"}}}))
(WORK / "ok.esm").write_text(json.dumps(chem()))
REFS = ["/dev/zero", "/dev/urandom", str(WORK / "fifo"), str(WORK / "dir"), "self.esm", "ok.esm",
        "missing.esm", "http://127.0.0.1:9/x.esm", "https://example.invalid/x.esm", "file:///dev/zero",
        "${HOME}/x.esm", "../../../../../../dev/zero", ""]

names = st.one_of(st.sampled_from(INJECT), st.text(min_size=1, max_size=12))
sizes = st.one_of(st.integers(-5, 10), st.sampled_from([10**9, 10**12, 2**31, 2**63, 10**30]),
                  st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text(max_size=3))
literals = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70),
                     st.sampled_from([0, -1, 1e308, 1e-320]), st.text(max_size=4))


def _rename(doc: dict, old: str, new: str) -> dict:
    return json.loads(json.dumps(doc).replace(json.dumps(old), json.dumps(new)))


@st.composite
def documents(draw):
    """(document as text or dict, names-only?) of one mutation."""
    kind = draw(st.sampled_from(["names", "ref", "size", "default", "literal", "depth", "op"]))
    d = chem(cells=3)
    if kind == "names":
        for old in draw(st.lists(st.sampled_from(["M", "A", "B", "k1", "k2"]), min_size=1, max_size=3,
                                 unique=True)):
            new = draw(names)
            if new in ("M", "A", "B", "k1", "k2", "i", "cell", "t"):
                continue
            d = _rename(d, old, new)
        return d, True
    if kind == "ref":
        return {"esm": "1.1.0", "metadata": {"name": "R"}, "models": {"M": {"ref": draw(st.sampled_from(REFS))}}}, False
    if kind == "size":
        d["index_sets"]["cell"]["size"] = draw(sizes)
        return d, False
    if kind == "default":
        d["models"]["M"]["variables"][draw(st.sampled_from(["A", "k1"]))]["default"] = draw(
            st.one_of(literals, st.lists(literals, max_size=4)))
        return d, False
    if kind == "literal":
        d["models"]["M"]["equations"][0]["rhs"]["expr"]["args"][0]["args"][0] = draw(literals)
        return json.dumps(d, allow_nan=True), False
    if kind == "depth":
        n = draw(st.sampled_from([10, 300, 1500, 5000, 100_000]))
        d["models"]["M"]["equations"][0]["rhs"]["expr"] = "HOLE"
        e = '{"op": "+", "args": [' * n + '{"op": "index", "args": ["A", "i"]}' + ', 1]}' * n
        return json.dumps(d).replace('"HOLE"', e), False
    op = draw(st.one_of(st.sampled_from(["^", "/", "exp", "log", "ifelse", "index", "D", "faq", "max", "sign",
                                         "atan2", "pow", "table_lookup", "grad", "call", "__import__"]),
                        st.text(max_size=6)))
    args = draw(st.lists(st.one_of(literals, st.sampled_from(["A", "k1", "t", "i"])), max_size=4))
    d["models"]["M"]["equations"][0]["rhs"]["expr"]["args"][0] = {"op": op, "args": args}
    return d, False


def _alarm(signum, frame):
    raise TimeoutError("example over its time budget")


def _run(doc, names_only: bool) -> str:
    from esmjac.calculus.bandset import BandSet
    from esmjac.compile.codegen import generate
    from esmjac.compile.evaldoc import jacobian_doc, rhs_doc
    from esmjac.model.deep import run_deep
    from esmjac.model.load import load_view
    from tests.compile.test_codegen_names import _plain_shapes, _shape

    cwd = os.getcwd()
    os.chdir(WORK)                   # relative refs resolve here
    signal.alarm(BUDGET_S)
    try:
        view = run_deep(load_view, doc)
        gs = [generate(run_deep(rhs_doc, view)), generate(run_deep(jacobian_doc, run_deep(BandSet.build, doc)))]
        # the modules and their prologues' modules, as test_codegen_names._sources lists them
        srcs = [g.source for g in gs] + [g.prologue_source for g in gs]
        if names_only and [_shape(s) for s in srcs] != _plain_shapes():
            return "changed"
        return "ok"
    except JacError as exc:
        return f"refused:{exc.code}"
    except TimeoutError:
        return "hang"
    except BaseException as exc:    # noqa: BLE001 - counted as a failure
        return f"bare:{type(exc).__name__}:{str(exc)[:80]}"
    finally:
        signal.alarm(0)
        os.chdir(cwd)


def main(examples: int) -> None:
    signal.signal(signal.SIGALRM, _alarm)

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(documents())
    def fuzz(case):
        doc, names_only = case
        outcome = _run(doc, names_only)
        if MARKER.exists():
            outcome = "exec"
            MARKER.unlink()
        COUNTS[outcome] += 1

    fuzz()
    print("RESULT " + json.dumps(dict(COUNTS)))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 150)
