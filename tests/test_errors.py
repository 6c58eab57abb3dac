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
