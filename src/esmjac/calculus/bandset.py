"""The build product of the symbolic half: a model's bands for one ``wrt``.

``BandSet.build`` loads (earthsci-ast), differentiates (``calculus``) and
classifies once; the result is immutable and cheap to serialize in either of
the reference's forms (the ``entries`` list, or the whole ``jacobians`` block).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.deep import run_deep
from . import WRT, jacobian_bands
from .emit import block_dict, entries_json
from ..errors import JacError, typed_errors
from ..model.expr import stable_json
from ..model.load import SystemView, load_view
from .structure import detect_structure

__all__ = ["BandSet", "BUILD_OPTIONS"]

#: Options accepted by ``BandSet.build`` (anything else is refused).
BUILD_OPTIONS = {
    "allow_empty": False,       # accept a state-independent array RHS (no bands)
    "cse": True,                # template CSE in the emitted block
    "cse_min_nodes": 12,        # smallest subtree worth a template
    "agg_spelling": "aggregate",  # spelling of the array op in emitted JSON
}


def check_options(options: dict | None, allowed: dict) -> dict:
    opts = dict(allowed)
    for k, v in (options or {}).items():
        if k not in allowed:
            raise JacError("bad_option",
                           f"unknown option {k!r}; accepted: {', '.join(sorted(allowed))}")
        opts[k] = v
    return opts


@dataclass(frozen=True)
class BandSet:
    """Bands of ∂f/∂``wrt`` for one system view (immutable)."""

    view: SystemView
    wrt: str
    entries: tuple
    structure: str
    options: dict

    @classmethod
    @typed_errors
    def build(cls, source: Any, model: str | None = None, wrt: str = "states",
              options: dict | None = None) -> "BandSet":
        if wrt not in WRT:
            raise JacError("bad_option", f"wrt must be one of {', '.join(WRT)}; got {wrt!r}")
        opts = check_options(options, BUILD_OPTIONS)
        if opts["agg_spelling"] not in ("aggregate", "faq"):
            raise JacError("bad_option", "agg_spelling must be 'aggregate' or 'faq'")

        def work():
            view = source if isinstance(source, SystemView) else load_view(source, model)
            entries = tuple(jacobian_bands(view, wrt, allow_empty=bool(opts["allow_empty"])))
            shapes = {n: v.shape for n, v in view.variables.items() if v.shape}
            return cls(view, wrt, entries, detect_structure(entries, shapes), opts)

        return run_deep(work)

    @property
    def shapes(self) -> dict:
        return {n: v.shape for n, v in self.view.variables.items() if v.shape}

    def entries_json(self) -> str:
        return run_deep(entries_json, self.entries, self.options["agg_spelling"])

    def block(self) -> dict:
        return run_deep(block_dict, self.entries, self.shapes, self.wrt,
                        cse=bool(self.options["cse"]),
                        cse_min_nodes=int(self.options["cse_min_nodes"]),
                        agg_spelling=self.options["agg_spelling"])

    def block_json(self) -> str:
        return run_deep(lambda: stable_json(self.block()))
