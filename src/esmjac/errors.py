"""Typed errors with stable codes.

Every refusal esmjac makes is a :class:`JacError` whose ``code`` is one of
:data:`CODES`; tools and tests match on the code, people read the message.
"""
from __future__ import annotations

__all__ = ["JacError", "CODES"]

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
    "cache_error": "the on-disk cache folder cannot be used (the message names the path and the fix)",
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
