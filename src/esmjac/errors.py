"""Typed errors with stable codes.

Every refusal esmjac makes is a :class:`JacError` whose ``code`` is one of
:data:`CODES`; tools and tests match on the code, people read the message.
Each code has a class that also derives from the Python exception a caller
would naturally catch (NumPy's ``AxisError(ValueError, IndexError)`` is
the model)::

    try:
        prog.eval_into(plan, u, p, t, None, out, ws)
    except ValueError:            # BadArgument is a ValueError
        ...

``JacError(code, message)`` constructs the class of ``code``, so a raise
site only names the code. ``str(exc)`` is the message; the code is
``exc.code`` (and appears once in ``repr`` and in the command line's
``esmjac: error [code]: message``).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable, Iterator

__all__ = ["JacError", "CODES", "typed_errors", "error_class", "LoadError", "ModelNotFound",
           "AmbiguousModel", "Underivable", "Unsupported", "InlineError", "EmptyBands", "BadOption",
           "BadArgument", "UnresolvableColumn", "ForeignLayout", "NonuniformPattern", "EvaluationError",
           "InvalidDocument", "CacheError", "InternalError", "AdapterUnavailable", "SolverFailed",
           "in_equation"]

#: Stable error codes and what each means.
CODES: dict[str, str] = {
    "load_error": "the source could not be loaded or validated by earthsci-ast",
    "model_not_found": "the requested model is not in the document",
    "ambiguous_model": "the document has several models and none was chosen",
    "underivable_operator": "an operator with no derivative rule was reached",
    "unsupported_construct": "a construct the band calculus cannot express",
    "inline_error": "an observed definition could not be inlined",
    "empty_bands": "an operator that writes array states produced zero bands",
    "bad_option": "an unknown or invalid option or argument value",
    "bad_argument": "a call argument of the wrong length, dtype or layout",
    "unresolvable_column": "a parameter or forcing name does not resolve",
    "foreign_layout": "a plan or workspace from a different build",
    "nonuniform_pattern": "a per-cell pattern differs between cells",
    "evaluation_error": "a coefficient could not be evaluated at a point",
    "invalid_document": "a loaded document describes an invalid model (the message names the equation or variable)",
    "cache_error": "the on-disk cache folder cannot be used (the message names the path and the fix)",
    "internal_error": "an unexpected failure inside esmjac (a bug: report it with the traceback, `--debug`)",
    "adapter_unavailable": "the solver adapter for a kind is installed but cannot be used here",
    "solver_failed": "an integrator stopped before the last output time (the message names the solver's "
                     "flag, its message and the time reached)",
}

_CLASSES: dict = {}


class JacError(Exception):
    """An esmjac refusal: ``code`` is stable, ``message`` is for people.

    ``JacError(code, message)`` returns an instance of the code's class
    (:func:`error_class`); subclasses may also be raised as
    ``BadArgument(message)``."""

    code: str = ""

    def __new__(cls, *args, **kwargs):
        code = args[0] if len(args) == 2 else kwargs.get("code")
        if cls is JacError and code in _CLASSES:
            cls = _CLASSES[code]
        return super().__new__(cls)

    def __init__(self, *args):
        if len(args) == 2:
            code, message = args
        elif len(args) == 1 and type(self).code:
            code, message = type(self).code, args[0]
        else:
            raise TypeError("JacError(code, message) or <CodeClass>(message)")
        if code not in CODES:
            raise ValueError(f"unknown JacError code {code!r}")
        if type(self).code and code != type(self).code:
            raise ValueError(f"{type(self).__name__} has code {type(self).code!r}, not {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"

    def __reduce__(self):
        return (JacError, (self.code, self.message))

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.code:
            if cls.code not in CODES:
                raise ValueError(f"unknown JacError code {cls.code!r}")
            _CLASSES.setdefault(cls.code, cls)


def error_class(code: str) -> type:
    """The exception class raised for ``code``."""
    if code not in CODES:
        raise ValueError(f"unknown JacError code {code!r}")
    return _CLASSES[code]


class LoadError(JacError, ValueError):
    code = "load_error"


class ModelNotFound(JacError, LookupError):
    code = "model_not_found"


class AmbiguousModel(JacError, ValueError):
    code = "ambiguous_model"


class Underivable(JacError, NotImplementedError):
    code = "underivable_operator"


class Unsupported(JacError, NotImplementedError):
    code = "unsupported_construct"


class InlineError(JacError, ValueError):
    code = "inline_error"


class EmptyBands(JacError, ValueError):
    code = "empty_bands"


class BadOption(JacError, ValueError):
    code = "bad_option"


class BadArgument(JacError, ValueError):
    code = "bad_argument"


class UnresolvableColumn(JacError, LookupError):
    code = "unresolvable_column"


class ForeignLayout(JacError, ValueError):
    code = "foreign_layout"


class NonuniformPattern(JacError, ValueError):
    code = "nonuniform_pattern"


class EvaluationError(JacError, ArithmeticError):
    code = "evaluation_error"


class AdapterUnavailable(JacError, ImportError):
    code = "adapter_unavailable"


class CacheError(JacError, OSError):
    code = "cache_error"


class InvalidDocument(JacError, ValueError):
    code = "invalid_document"


class InternalError(JacError, RuntimeError):
    code = "internal_error"


class SolverFailed(JacError, RuntimeError):
    """An integrator stopped early; ``result`` (when set) holds what it
    returned (the outputs it reached)."""

    code = "solver_failed"
    result: Any = None

#: Codes whose refusals concern one equation's right-hand side.
_EQUATION_CODES = frozenset({"underivable_operator", "unsupported_construct", "inline_error", "invalid_document",
                             "evaluation_error"})


@contextlib.contextmanager
def in_equation(state: str) -> Iterator[None]:
    """Name the equation in a refusal raised while its right-hand side is
    processed: ``in the equation for D(O3): <message>`` (once; a message
    that already names the state is left as it is). The class and code are
    unchanged, so callers matching on either are unaffected."""
    try:
        yield
    except JacError as exc:
        if exc.code not in _EQUATION_CODES or f"`{state}`" in exc.message \
                or exc.message.startswith("in the equation for "):
            raise
        raise JacError(exc.code, f"in the equation for D({state}): {exc.message}") \
            .with_traceback(exc.__traceback__) from exc.__cause__


def typed_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a public entry point (build, assemble, check) so that every
    exception leaving it is a :class:`JacError`: refusals pass through, an
    exhausted resource or anything unexpected becomes ``internal_error``
    naming what failed (the original stays attached as ``__cause__``)."""

    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:          # a misuse of the call itself, not a bug inside
            raise JacError("bad_argument", f"{fn.__qualname__}{sig}: {exc}") from None
        try:
            return fn(*args, **kwargs)
        except JacError:
            raise
        except MemoryError as exc:
            raise JacError("internal_error", f"{fn.__qualname__} ran out of memory ({exc or 'MemoryError'}); "
                           "the model is too large for this machine") from exc
        except Exception as exc:
            if type(exc).__module__.split(".")[0] == "earthsci_ast":
                raise JacError("load_error", f"earthsci-ast could not handle the document in "
                               f"{fn.__qualname__}: {type(exc).__name__}: {exc}") from exc
            raise JacError("internal_error", f"{fn.__qualname__} failed unexpectedly: "
                           f"{type(exc).__name__}: {exc}") from exc

    return wrapper
