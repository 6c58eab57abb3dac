"""Build progress: the stages of a long build, shown while it runs.

A large mechanism takes minutes to derive and compile; a build that says
nothing looks hung. The ``progress`` build option decides what is shown:

* ``None`` (the default, "auto"): a `tqdm <https://tqdm.github.io>`_ bar on
  stderr when stderr is a terminal, appearing only once the build has run
  for :data:`DELAY` seconds (short and cached builds stay silent); nothing
  in pipes, files or CI logs;
* ``True``: always -- the bar on a terminal, one plain line per stage
  elsewhere (``[esmjac] stage (1.23 s)``);
* ``False``: nothing.

Stages are reported by the build itself (:func:`stage`); :func:`done` closes
the bar. The bar lives in the build's own option dict, so concurrent builds
never share one.
"""
from __future__ import annotations

import sys
import time

from ..errors import JacError

__all__ = ["stage", "done", "DELAY", "STAGES"]

#: Seconds a build runs before the automatic bar appears.
DELAY = 2.0

#: Stages of each build kind (the bar's total).
STAGES = {"rhs": 3, "jac": 4}

_KEY = "_progress"


def _mode(opts: dict) -> str:
    p = opts.get("progress")
    if p not in (None, True, False):
        raise JacError("bad_option", f"progress must be None (a bar on a terminal), True or False, "
                       f"not {p!r}")
    if p is False:
        return "off"
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if p is None:
        return "bar" if tty else "off"
    return "bar" if tty else "lines"


def _bar(opts: dict, kind: str, t0: float):
    state = opts.get(_KEY)
    if state is None:
        mode = _mode(opts)
        bar = None
        if mode == "bar":
            try:
                from tqdm import tqdm
            except ImportError:         # tqdm is a dependency; degrade to lines without it
                mode = "lines"
            else:
                bar = tqdm(total=STAGES.get(kind, 4), desc=f"esmjac {kind} build", file=sys.stderr,
                           delay=DELAY if opts.get("progress") is None else 0.0, leave=False,
                           bar_format="{desc}: {n}/{total} {bar} {elapsed} {postfix}")
        state = opts[_KEY] = {"mode": mode, "bar": bar, "kind": kind, "t0": t0}
    return state


def stage(opts: dict, kind: str, msg: str, t0: float) -> None:
    """Report that a stage of a ``kind`` build (``"rhs"``/``"jac"``) finished."""
    if opts.get("progress") is False:
        return
    state = _bar(opts, kind, t0)
    if state["mode"] == "lines":
        print(f"[esmjac] {msg} ({time.perf_counter() - t0:.2f} s)", file=sys.stderr, flush=True)
    elif state["bar"] is not None:
        state["bar"].set_postfix_str(msg, refresh=False)
        state["bar"].update(1)


def done(opts: dict, kind: str, t0: float, msg: str = "kernels compiled") -> None:
    """The build finished: last stage, close the bar."""
    if opts.get("progress") is False:
        return
    stage(opts, kind, msg, t0)
    bar = opts[_KEY]["bar"]
    if bar is not None:
        bar.close()
    opts.pop(_KEY, None)
