"""Document text never becomes code (issue #21 items 1 and 6).

Every name a document gives (model, species, parameter) reaches generated
source only as an ASCII identifier or through ``codegen.escape`` in a
comment/docstring. The oracle for "nothing leaked into the code" is the
shape of the module: a document with hostile names generates a module whose
syntax tree has exactly the node types, and whose text exactly the lines, of
the same document with plain names; the docstring reads back the name as
the document wrote it. Values are checked against the hand-derived RHS of
tests/support/models.chem (f_A = -k1 A + k2 B², f_B = k1 A - 2 k2 B²).
"""
from __future__ import annotations

import ast
import json
import re

import numpy as np
import pytest

from esmjac.compile.codegen import escape, generate
from esmjac.compile.evaldoc import jacobian_doc, rhs_doc
from esmjac.errors import JacError
from esmjac.model.load import load_view
from tests.support.child import run_child
from tests.support.models import chem

INJECT = 'M""";getattr(__import__("os"),"system")("touch {marker}");"""'

HOSTILE = [
    'M""";getattr(__import__("os"),"system")("touch /nonexistent/x");"""',
    "M''';import os;'''", "a\nimport os\n#", "a\r\nb", "a\u2028b", "a\x0cb", "a\\", "a\\\n",
    "a\ud800", "x # y", "out", "ｏｕｔ", "ﬁ", "Ö₃", "r", "b", "v1", "hv0", "chunk0", "tile_chunk0",
    "class", "match", "_", "__", "1a", "p_k1", "u", "math", "S", "bad", "💥", "\u200bA",
]


def _doc(model="M", A="A", B="B", k1="k1", k2="k2"):
    """The two-species document with its names replaced (JSON-level: every
    reference to a name follows it)."""
    d = json.dumps(chem(cells=3))
    for old, new in (("M", model), ("A", A), ("B", B), ("k1", k1), ("k2", k2)):
        d = d.replace(json.dumps(old), json.dumps(new))
    return json.loads(d)


def _sources(doc) -> list:
    from esmjac.calculus.bandset import BandSet

    view = load_view(doc)
    gs = [generate(rhs_doc(view)), generate(jacobian_doc(BandSet.build(doc)))]
    return [g.source for g in gs] + [g.prologue_source for g in gs]


def _shape(src: str) -> tuple:
    """What a module *does*: its node types, its line count, its lines with
    comments, identifiers and the docstring blanked (each sorted: a name's
    sort position may order a Jacobian's bands differently)."""
    tree = ast.parse(src)
    code = re.sub(r"#.*", "#", src.split('"""', 2)[2])
    code = re.sub(r"\d+", "0", re.sub(r"\b[A-Za-z_]\w*\b", "N", code))
    return sorted(type(n).__name__ for n in ast.walk(tree)), src.count("\n"), sorted(code.splitlines())


_PLAIN = {}


def _plain_shapes():
    if not _PLAIN:
        _PLAIN["s"] = [_shape(s) for s in _sources(_doc())]
    return _PLAIN["s"]


def _loads(doc) -> bool:
    try:
        load_view(doc)
    except JacError:
        return False
    return True


@pytest.mark.parametrize("where", ["model", "A", "k1"])
@pytest.mark.parametrize("name", HOSTILE, ids=[ascii(h)[:24] for h in HOSTILE])
def test_a_hostile_name_never_changes_the_generated_code(where, name):
    doc = _doc(**{where: name})
    if not _loads(doc):
        pytest.skip("the document is refused before code generation (a typed error)")
    for i, (src, plain) in enumerate(zip(_sources(doc), _plain_shapes())):
        assert _shape(src) == plain, f"{where}={name!r} changed the module's code"
        if where == "model" and i < 2:           # (a prologue's module names no model: shared)
            text = ast.get_docstring(ast.parse(src), clean=False)
            assert f"\n\nmodel: {name}   program: " in text


def test_escape_leaves_no_way_out_of_a_comment_or_string():
    for name in HOSTILE:
        e = escape(name)
        assert all(c.isprintable() and c not in "\"'" for c in e)
        assert "\\" not in e.replace("\\x", "").replace("\\u", "").replace("\\U", "")
        # the escapes decode back to the name (as a docstring reads them)
        assert ast.literal_eval('"""' + e + '"""') == name


def test_names_python_would_merge_stay_distinct_identifiers():
    """``ﬁ`` and ``fi`` are one identifier to Python (NFKC); ``ｏｕｔ`` is the
    generator's ``out``: each species keeps its own variable."""
    for a, b in (("ﬁ", "fi"), ("fi", "ﬁ"), ("ｏｕｔ", "out"), ("Ö₃", "_3"), ("A", "\uff21")):
        doc = _doc(A=a, B=b)
        src = _sources(doc)[0]
        reads = {}
        for n in ast.walk(ast.parse(src)):
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript) and \
                    isinstance(n.value.value, ast.Name) and n.value.value.id == "u":
                reads.setdefault(ast.unparse(n.value.slice), set()).add(n.targets[0].id)
        names = [next(iter(v)) for v in reads.values()]
        assert len(names) == 2 and len(set(names)) == 2, (a, b, reads)
        assert all(x.isascii() and x.isidentifier() for x in names)


_RHS = """
import numpy as np
from esmjac.runtime.programs import RhsProgram
r = RhsProgram.build(DOC)
u = np.array([1.0, 2.0, 3.0, 0.5, 0.25, 2.0])
out = np.zeros(6)
r.eval_into(u, r.p0, 0.0, None, out)
print("RESULT " + json.dumps({"f": out.tolist(), "p0": r.p0.tolist()}))
"""


@pytest.mark.slow
def test_a_hostile_document_builds_right_and_runs_nothing(tmp_path):
    """Issue #21 items 1 and 6 end to end, in a fresh process: the model
    name carries a shell command, the species are ``ﬁ``/``fi`` (one name to
    Python) and the parameters ``ｏｕｔ``/``Ö₃`` (the generator's ``out``; a
    subscript Python refuses). The command never runs and the RHS is the
    hand-derived one."""
    marker = tmp_path / "pwned"
    doc = _doc(model=INJECT.format(marker=marker), A="ﬁ", B="fi", k1="ｏｕｔ", k2="Ö₃")
    path = tmp_path / "hostile.esm"
    path.write_text(json.dumps(doc))
    r = run_child(f"DOC = {str(path)!r}\n" + _RHS, tmp_path / "cache")
    assert not marker.exists()
    k1, k2 = r["p0"]
    assert (k1, k2) == (0.3, 2.0)
    A, B = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.25, 2.0])
    want = np.concatenate([-k1 * A + k2 * B * B, k1 * A - 2 * k2 * B * B])
    np.testing.assert_allclose(r["f"], want, rtol=1e-15, atol=0)


@pytest.mark.slow
def test_arbitrary_unicode_names_never_change_the_code():
    """Hypothesis: any Unicode (surrogates and control characters
    included) as the model, a species or a parameter name."""
    hyp = pytest.importorskip("hypothesis")
    st = hyp.strategies

    @hyp.settings(max_examples=60, deadline=None, derandomize=True,
                  suppress_health_check=list(hyp.HealthCheck))
    @hyp.given(where=st.sampled_from(["model", "A", "k1"]), name=st.text(min_size=1, max_size=10))
    def check(where, name):
        doc = _doc(**{where: name})
        hyp.assume(name not in ("M", "A", "B", "k1", "k2", "i", "cell", "t") and _loads(doc))
        for src, plain in zip(_sources(doc), _plain_shapes()):
            assert _shape(src) == plain

    check()
