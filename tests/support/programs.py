"""Programs built once per test session (building compiles kernels), the
random points the tests evaluate at, and a scaled closeness check."""
from __future__ import annotations

import importlib.resources
import pathlib

import numpy as np

from esmjac.runtime.programs import JacobianProgram, RhsProgram

from .paths import FIXTURES, need_reference

TROPO12 = pathlib.Path(importlib.resources.files("esmjac.models") / "tropo12.esm")

_progs: dict = {}


def src_of(fx: str):
    if fx == "tropo12":
        return TROPO12
    need_reference()
    return FIXTURES / f"{fx}.esm"


def rhs_prog(fx):
    key = ("rhs", fx)
    if key not in _progs:
        _progs[key] = RhsProgram.build(src_of(fx))
    return _progs[key]


def jac_prog(fx, wrt="states", **opts):
    key = ("jac", fx, wrt, tuple(sorted(opts.items())))
    if key not in _progs:
        _progs[key] = JacobianProgram.build(src_of(fx), wrt=wrt,
                                            options={"allow_empty": True, **opts})
    return _progs[key]


def point(prog, seed):
    rng = np.random.default_rng(seed)
    u0 = prog.u0 if prog.u0 is not None else np.ones(prog.u_size(prog.cells))
    return u0 * rng.uniform(0.5, 1.5, u0.size) + rng.uniform(0, 1e-3, u0.size) * (u0 == 0)


def close(a, b, rtol):
    scale = np.max(np.abs(b)) if b.size else 0.0
    return np.all(np.abs(a - b) <= rtol * np.abs(b) + rtol * 1e-2 * scale)


