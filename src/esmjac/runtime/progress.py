"""Progress of long work: build stages, ``check``, first calls that compile,
long leaf advances and solves -- shown while they run.

A large mechanism takes minutes to derive, compile and check; a call that
says nothing looks hung. The ``progress`` setting (the build option of the
same name, ``fd_check(progress=)``, the CLI's ``--progress``) decides what
is shown, on stderr:

* ``None`` (the default, "auto"): a `tqdm <https://tqdm.github.io>`_ bar
  when stderr is a terminal, appearing only once the work has run for
  :data:`DELAY` seconds (short and cached work stays silent); in pipes,
  files and CI logs nothing -- except under the command line, which sets
  :func:`set_pipe_default` ``("phases")``: one plain line per phase that
  took longer than :data:`DELAY` seconds;
* ``True``: always -- the bar on a terminal, plain lines elsewhere
  (``[esmjac] what: stage (1.23 s)``, ``[esmjac] what: 3/8 lane blocks
  (4.56 s)``);
* ``False``: nothing.

Builds report their stages with :func:`stage` and :func:`done` (the bar
lives in the build's own option dict, so concurrent builds never share
one); other long work opens a :func:`task` (counted steps and named phases).
"""
from __future__ import annotations

import sys
import threading
import time

from ..errors import JacError

__all__ = ["stage", "done", "task", "Task", "set_pipe_default", "DELAY", "STAGES", "LINE_EVERY"]

#: Seconds work runs before the automatic bar appears (and, under the
#: command line in a pipe, the shortest phase worth a line).
DELAY = 2.0

#: Seconds between two plain progress lines of one counted task.
LINE_EVERY = 5.0

#: Stages of each build kind (the bar's total).
STAGES = {"rhs": 3, "jac": 4}

_KEY = "_progress"

#: What ``progress=None`` shows when stderr is not a terminal: "off" (a
#: library's default) or "phases" (the command line's).
_PIPE_DEFAULT = ["off"]


def set_pipe_default(mode: str) -> str:
    """What ``progress=None`` shows when stderr is not a terminal: ``"off"``
    (the library default) or ``"phases"`` (one line per phase longer than
    :data:`DELAY`; the command line sets it while it runs). Returns the
    previous setting."""
    if mode not in ("off", "phases"):
        raise JacError("bad_option", f"the pipe default must be 'off' or 'phases', not {mode!r}")
    prev, _PIPE_DEFAULT[0] = _PIPE_DEFAULT[0], mode
    return prev


def _check(p) -> None:
    if p is not None and p is not True and p is not False:
        raise JacError("bad_option", f"progress must be None (a bar on a terminal), True or False, "
                       f"not {p!r}")


def _mode_of(p) -> str:
    """"off", "bar", "lines" or "phases" for a ``progress`` setting."""
    _check(p)
    if p is False:
        return "off"
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    if tty:
        return "bar"
    return "lines" if p is True else _PIPE_DEFAULT[0]


def _line(what: str, msg: str, seconds: float) -> None:
    print(f"[esmjac] {what}: {msg} ({seconds:.2f} s)", file=sys.stderr, flush=True)


def _new_bar(total, desc: str, delay: float):
    try:
        from tqdm import tqdm
    except ImportError:         # tqdm is a dependency; degrade to lines without it
        return None
    return tqdm(total=total, desc=desc, file=sys.stderr, delay=delay, leave=False,
                bar_format="{desc}: {n}/{total} {bar} {elapsed} {postfix}" if total else
                "{desc}: {elapsed} {postfix}")


# ---------------------------------------------------------------- builds

def _mode(opts: dict) -> str:
    return _mode_of(opts.get("progress"))


def _bar(opts: dict, kind: str, t0: float):
    state = opts.get(_KEY)
    if state is None:
        mode = _mode(opts)
        bar = None
        if mode == "bar":
            bar = _new_bar(STAGES.get(kind, 4), f"esmjac {kind} build",
                           DELAY if opts.get("progress") is None else 0.0)
            if bar is None:
                mode = "lines"
        state = opts[_KEY] = {"mode": mode, "bar": bar, "kind": kind, "t0": t0, "last": t0}
    return state


def stage(opts: dict, kind: str, msg: str, t0: float) -> None:
    """Report that a stage of a ``kind`` build (``"rhs"``/``"jac"``) finished."""
    if opts.get("progress") is False:
        return
    state = _bar(opts, kind, t0)
    now = time.perf_counter()
    if state["mode"] == "lines":
        print(f"[esmjac] {msg} ({now - t0:.2f} s)", file=sys.stderr, flush=True)
    elif state["mode"] == "phases":
        if now - state["last"] > DELAY:
            print(f"[esmjac] {kind} build: {msg} ({now - state['last']:.2f} s)", file=sys.stderr, flush=True)
    elif state["bar"] is not None:
        state["bar"].set_postfix_str(msg, refresh=False)
        state["bar"].update(1)
    state["last"] = now


def done(opts: dict, kind: str, t0: float, msg: str = "kernels compiled") -> None:
    """The build finished: last stage, close the bar."""
    if opts.get("progress") is False:
        return
    stage(opts, kind, msg, t0)
    bar = opts[_KEY]["bar"]
    if bar is not None:
        bar.close()
    opts.pop(_KEY, None)


# ---------------------------------------------------------------- other long work

class Task:
    """Progress of one piece of long work (:func:`task`): ``update(n)``
    counts steps out of ``total``, ``phase(msg)`` names what runs now;
    ``close()`` (or leaving the ``with`` block) ends it. Thread-safe
    (workers of a leaf advance count their lane blocks)."""

    def __init__(self, mode: str, what: str, total: int | None, unit: str, delay: float,
                 min_s: float = 0.0):
        self.mode, self.what, self.total, self.unit = mode, what, total, unit
        self.min_s = min_s
        self.n = 0
        self.t0 = self._last_line = self._phase_t0 = time.perf_counter()
        self._phase = ""
        self._printed = False
        self._lock = threading.Lock()
        self._bar = _new_bar(total, f"esmjac {what}", max(delay, min_s)) if mode == "bar" else None
        if mode == "bar" and self._bar is None:
            self.mode = "lines"

    def _count(self) -> str:
        return f"{self.n}/{self.total} {self.unit}".rstrip() if self.total else f"{self.n} {self.unit}".rstrip()

    def update(self, n: int = 1) -> None:
        if self.mode == "off":
            return
        with self._lock:
            self.n += n
            now = time.perf_counter()
            if self._bar is not None:
                self._bar.update(n)
            elif self.mode == "lines" and now - self.t0 >= self.min_s and (
                    now - self._last_line >= LINE_EVERY or (self.total and self.n >= self.total)):
                self._last_line = now
                self._printed = True
                _line(self.what, self._count(), now - self.t0)

    def set_total(self, total: int) -> None:
        """The number of counted steps, once known."""
        with self._lock:
            self.total = int(total)
            if self._bar is not None:
                self._bar.total = self.total
                self._bar.refresh()

    def phase(self, msg: str) -> None:
        """A new phase begins (the previous one ends: in "phases" mode its
        line is printed when it took longer than :data:`DELAY`)."""
        if self.mode == "off":
            return
        with self._lock:
            if self._phase:             # (the lead-in before the first phase counts as part of it)
                self._end_phase()
            self._phase = msg
            if self._bar is not None:
                self._bar.set_postfix_str(msg)
            elif self.mode == "lines" and time.perf_counter() - self.t0 >= self.min_s:
                self._printed = True
                _line(self.what, msg, time.perf_counter() - self.t0)

    def _end_phase(self) -> None:
        now = time.perf_counter()
        if self.mode == "phases" and now - self._phase_t0 > DELAY:
            msg = self._phase or (self._count() if self.total else "done")
            _line(self.what, msg, now - self._phase_t0)
        self._phase_t0 = now

    def close(self) -> None:
        if self.mode == "off":
            return
        with self._lock:
            if self.mode == "phases":
                self._end_phase()
                self.mode = "off"
            elif self.mode == "lines":
                # a call shown only past min_s: one line at its end if none came before
                took = time.perf_counter() - self.t0
                if not self._printed and self.min_s and took >= self.min_s:
                    _line(self.what, (self._phase + "; " if self._phase else "") + self._count()
                          if self.total else self._phase or "done", took)
                self.mode = "off"
            elif self._bar is not None:
                self._bar.close()
                self._bar = None
                self.mode = "off"

    def __enter__(self) -> "Task":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def task(progress, what: str, total: int | None = None, unit: str = "", min_s: float = 0.0) -> Task:
    """A :class:`Task` shown as ``progress`` says (see the module docstring):
    ``what`` names the work (``"check"``, ``"leaf advance"``), ``total`` and
    ``unit`` its counted steps (None: phases only). ``min_s``: show nothing
    of a call shorter than this, whatever ``progress`` says (a call a host
    model makes thousands of times: :data:`DELAY`)."""
    return Task(_mode_of(progress), what, total, unit, DELAY if progress is None else 0.0, min_s)
