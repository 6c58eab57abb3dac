"""Typed errors with stable codes.

Every refusal esmjac makes is a :class:`JacError` whose ``code`` is one of
:data:`CODES`; tools and tests match on the code, people read the message.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

__all__ = ["JacError", "CODES", "typed_errors"]

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
}


class JacError(Exception):
    """An esmjac refusal: ``code`` is stable, ``message`` is for people."""

    def __init__(self, code: str, message: str):
        if code not in CODES:
            raise ValueError(f"unknown JacError code {code!r}")
        super().__init__(f"[{code}] {message}")
        self.code = code
        self.message = message

    def __reduce__(self):
        return (JacError, (self.code, self.message))


def typed_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a public entry point (build, assemble, check) so that every
    exception leaving it is a :class:`JacError`: refusals pass through, an
    exhausted resource or anything unexpected becomes ``internal_error``
    naming what failed (the original stays attached as ``__cause__``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
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
