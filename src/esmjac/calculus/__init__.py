"""The symbolic half: bands of ∂f/∂(states | parameters | t).

Pipeline per differential equation: inline the observed the targets can
move (pruned, docs/design.rst §3.3), intersect the right-hand side's names with the
target set, and run the band calculus for each hit in sorted order. The
non-empty gate (docs/design.rst §3.4) refuses a build that writes array states yet
produced no band at all.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import JacError, in_equation
from ..model.expr import free_names
from ..model.load import SystemView, lhs_state
from .bands import Band, Ctx, bands, normalize_band
from .clip import merge_bands
from .inline import inline_observed, inlinable_observed

__all__ = ["JacEntry", "Band", "Ctx", "jacobian_bands", "context", "state_independent", "WRT"]

WRT = ("states", "parameters", "forcing", "time")


@dataclass(frozen=True)
class JacEntry:
    """One band of ∂(equation for ``row``)/∂``col``."""

    row: str
    col: str
    band: Band


def context(view: SystemView) -> Ctx:
    shapes = {n: v.shape for n, v in view.variables.items() if v.shape}
    params = frozenset(view.parameters)
    dims = {n: tuple(v.shape_names) for n, v in view.variables.items()
            if v.shape and len(v.shape_names) == len(v.shape) and all(isinstance(x, str) for x in v.shape_names)}
    return Ctx(dict(view.index_sets), shapes, params, dims)


def targets_of(view: SystemView, wrt: str) -> list:
    if wrt == "time":
        return ["t"]
    if wrt == "forcing":
        return [n for n in view.parameters if view.shape(n)]
    if wrt == "states":
        return view.states
    if wrt == "parameters":
        return view.parameters
    raise JacError("bad_option", f"wrt must be one of {', '.join(WRT)}; got {wrt!r}")


def state_independent(view: SystemView) -> bool:
    """True when no differential equation's right-hand side, with every
    observed inlined, names a state: the state Jacobian is then identically
    zero by construction, not by a misread (the empty-bands gate's concern).
    A right-hand side reading an observed defined only through an indexed
    left-hand side cannot be inlined, so it is never proven independent."""
    states = frozenset(view.states)
    obs = dict(view.observed)
    diff = [r for l, r in view.equations if lhs_state(l) is not None]
    if not diff:
        return False
    for rhs in diff:
        names = free_names(inline_observed(rhs, obs))
        if names & states or names & view.indexed_observed:
            return False
    return True


def jacobian_bands(view: SystemView, wrt: str = "states", *,
                   allow_empty: bool = False) -> list:
    """Every band of the system's Jacobian with respect to ``wrt``."""
    targets = targets_of(view, wrt)
    tset = frozenset(targets)
    ctx = context(view)
    lhs = [(lhs_state(l), r) for l, r in view.equations]
    diff_eqs = [(u, r) for u, r in lhs if u is not None]
    obs = dict(view.observed)
    if wrt != "time":
        # Time also enters through externally supplied data: `{t}` is not a
        # sound seed for pruning, so wrt="time" inlines everything.
        obs = inlinable_observed(obs, [r for _, r in diff_eqs], tset)
    entries: list = []
    for u, rhs in diff_eqs:
        with in_equation(u):
            shape_u = ctx.shapes.get(u, ())
            rhs = inline_observed(rhs, obs)
            names = free_names(rhs)
            hidden = names & view.indexed_observed
            if hidden:
                raise JacError(
                    "unsupported_construct",
                    f"the equation for `{u}` reads observed {sorted(hidden)} defined only "
                    "through an indexed left-hand side, which cannot be inlined")
            for v in sorted(names & tset):
                for b in merge_bands(bands(rhs, v, ctx.walking(u), shape_u)):
                    entries.append(JacEntry(u, v, normalize_band(b)))
    if not entries and not allow_empty and wrt == "states":
        writes_arrays = [u for u, _ in diff_eqs if ctx.shapes.get(u)]
        if writes_arrays:
            raise JacError(
                "empty_bands",
                f"the model writes array states ({', '.join(sorted(set(writes_arrays)))}) but the "
                "calculus found no state coupling at all; this usually means the model "
                "was misread. Pass options={'allow_empty': True} if a state-independent "
                "right-hand side is intended.")
    return entries
