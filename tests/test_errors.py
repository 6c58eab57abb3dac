"""Typed errors (errors.py): one class per stable code, each also the
Python exception a caller would catch; ``JacError(code, message)`` builds
the code's class; the message does not repeat the code."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from esmjac import errors as E
from esmjac.errors import CODES, JacError, error_class

BUILTIN = {"bad_argument": ValueError, "bad_option": ValueError, "unsupported_construct": NotImplementedError,
           "underivable_operator": NotImplementedError, "cache_error": OSError,
           "adapter_unavailable": ImportError, "model_not_found": LookupError,
           "evaluation_error": ArithmeticError}


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_code_has_its_class(code):
    e = JacError(code, "what went wrong")
    cls = error_class(code)
    assert type(e) is cls and cls is not JacError and issubclass(cls, JacError)
    assert e.code == code and cls.code == code
    assert str(e) == "what went wrong" and code not in str(e)
    assert repr(e) == f"{cls.__name__}({code!r}, 'what went wrong')"
    again = pickle.loads(pickle.dumps(e))
    assert type(again) is cls and again.code == code and again.message == e.message
    assert cls("direct").code == code            # a class raises without naming the code


@pytest.mark.parametrize("code,builtin", sorted(BUILTIN.items()))
def test_classes_are_what_a_caller_catches(code, builtin):
    with pytest.raises(builtin):
        raise JacError(code, "x")


def test_refusals_and_misuse():
    with pytest.raises(ValueError, match="unknown JacError code"):
        JacError("no_such_code", "x")
    with pytest.raises(ValueError, match="has code"):
        E.BadArgument("bad_option", "x")
    with pytest.raises(TypeError):
        JacError("just a message")


def test_a_real_raise_site_is_typed():
    # An existing raise site (JacError("bad_argument", ...)) gives a BadArgument
    # that `except ValueError` catches, the code stays stable.
    from esmjac.runtime.workspace import lane_cells
    with pytest.raises(ValueError) as ei:
        lane_cells((3,), 2, order=np.array([0, 7]))
    assert isinstance(ei.value, E.BadArgument) and ei.value.code == "bad_argument"


def _unknown_function_doc(tmp_path):
    import json
    doc = {"esm": "1.1.0", "metadata": {"name": "t"}, "models": {"M": {
        "variables": {"x": {"type": "unknown", "default": 1.0}, "y": {"type": "unknown", "default": 2.0}},
        "equations": [
            {"lhs": {"op": "D", "args": ["x"], "wrt": "t"}, "rhs": {"op": "*", "args": [-1.0, "x"]}},
            {"lhs": {"op": "D", "args": ["y"], "wrt": "t"},
             "rhs": {"op": "fn", "name": "foo.bar", "args": ["x"]}}]}}}
    p = tmp_path / "unknown_fn.esm"
    p.write_text(json.dumps(doc))
    return p


def test_a_refusal_names_its_equation_once(tmp_path):
    """The equation for `y` calls an unknown closed function: every public
    route refuses with the same code, naming D(y) (not D(x)) once."""
    from esmjac import JacobianProgram, assemble
    from esmjac.adapters.scipy import ivp
    path = _unknown_function_doc(tmp_path)
    for route in (lambda: JacobianProgram.build(path), lambda: ivp(path), lambda: assemble(path, u={"x": 1.0, "y": 2.0})):
        with pytest.raises(E.Underivable) as ei:
            route()
        msg = str(ei.value)
        assert msg.startswith("in the equation for D(y): "), msg
        assert msg.count("in the equation for") == 1 and "D(x)" not in msg
        assert "foo.bar" in msg and "underivable_operator" not in msg
    from esmjac import RhsProgram                  # the RHS alone: not compiled, same equation named
    with pytest.raises(E.Unsupported) as ei:
        RhsProgram.build(path)
    assert str(ei.value).startswith("in the equation for D(y): ") and "foo.bar" in str(ei.value)


def test_in_equation_keeps_class_code_and_other_codes():
    with pytest.raises(E.Unsupported) as ei:
        with E.in_equation("O3"):
            raise JacError("unsupported_construct", "a construct")
    assert str(ei.value) == "in the equation for D(O3): a construct"
    with pytest.raises(E.BadArgument) as ei:         # not an equation's refusal: untouched
        with E.in_equation("O3"):
            raise JacError("bad_argument", "u has the wrong length")
    assert str(ei.value) == "u has the wrong length"
    with pytest.raises(E.Unsupported) as ei:         # already names the state: untouched
        with E.in_equation("O3"):
            raise JacError("unsupported_construct", "the equation for `O3` reads observed ['a']")
    assert str(ei.value) == "the equation for `O3` reads observed ['a']"


def test_a_misused_entry_point_is_a_bad_argument_naming_its_signature():
    from esmjac import assemble
    with pytest.raises(E.BadArgument) as ei:
        assemble("model.esm", {"x": 1.0})          # u is keyword-only
    assert "assemble(" in str(ei.value) and "positional" in str(ei.value)
