"""The independent variable ``t`` in a model's right-hand side.

An integrator whose lanes sit at different times (the Rosenbrock leaf) needs
to know, before it builds anything, whether the right-hand side reads ``t``
itself; if it does, ``t`` becomes a per-lane parameter of a rewritten copy
of the document, which the integrator sets to each lane's own stage time.
Both questions are about the document, so they are answered here, once.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ..errors import JacError
from .expr import free_names, lhs_state
from .load import SystemView

__all__ = ["explicit_time", "time_as_parameter"]


def explicit_time(view: SystemView) -> bool:
    """Whether a differential equation's right-hand side names ``t``,
    directly or through the observed variables it reads (transitively, as
    the right-hand side inlines them). An over-approximation is safe (the
    leaf then sets a time nobody reads); a miss is not, so every name is
    followed."""
    obs = view.observed
    stack = [rhs for lhs, rhs in view.equations if lhs_state(lhs) is not None]
    seen: set = set()
    while stack:
        names = free_names(stack.pop())
        if "t" in names:
            return True
        for n in names:
            if n in obs and n not in seen:
                seen.add(n)
                stack.append(obs[n])
    return False


def time_as_parameter(source: Any, taken: set) -> tuple:
    """A copy of ``source`` (an esm dict, JSON text or a path) in which the
    bare name ``t`` on equations' right-hand sides and in variables'
    expressions is a new scalar parameter (returned with its name; the
    caller makes it per lane). Other sources are refused."""
    if isinstance(source, dict):
        doc = copy.deepcopy(source)
    elif isinstance(source, (str, Path)):
        text = str(source)
        try:
            doc = json.loads(text if text.lstrip().startswith("{") else Path(text).read_text())
        except (OSError, ValueError):
            doc = None
    else:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict):
        raise JacError("bad_option",
                       "this model's right-hand side uses t explicitly; the leaf sets t per lane by "
                       "rewriting the document, which needs it as an esm dict, JSON text or a path — "
                       "or pass the time-dependent inputs as forcing fields (forcing=callable(t, lanes))")
    name, k = "t_lane", 0
    names = set(taken) | {v for m in doc["models"].values() for v in m.get("variables", {})}
    while name in names:
        k += 1
        name = f"t_lane{k}"

    def sub(e):
        if isinstance(e, str):
            return name if e == "t" else e
        if isinstance(e, list):
            return [sub(x) for x in e]
        if isinstance(e, dict):
            out = dict(e)
            if isinstance(out.get("args"), list):
                a = out["args"]
                out["args"] = [a[0]] + [sub(x) for x in a[1:]] if out.get("op") == "index" and a else \
                    [sub(x) for x in a]
            if "expr" in out:
                out["expr"] = sub(out["expr"])
            return out
        return e

    for m in doc["models"].values():
        for eq in m.get("equations", []):
            if "rhs" in eq:
                eq["rhs"] = sub(eq["rhs"])
        for v in m.get("variables", {}).values():
            for key in ("expression", "expr"):
                if key in v:
                    v[key] = sub(v[key])
        m.setdefault("variables", {})[name] = {
            "type": "parameter", "default": 0.0, "units": "s",
            "description": "the lane's own time (t), set by the Rosenbrock leaf at every stage"}
    return doc, name
