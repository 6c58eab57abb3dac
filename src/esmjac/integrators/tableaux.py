"""Rosenbrock methods: their coefficients in transformed ("KPP") form.

A method here is data (Diffrax's solver takes its tableau): the one lane
integrator (:mod:`esmjac.integrators.lanestep`, driven by the leaf in
:mod:`esmjac.integrators.leaf`, per-lane or shared step) and its
sensitivities (:mod:`esmjac.integrators.sensitivity`) read a
:class:`Tableau`, never a method name.

Methods (coefficients in the transformed "KPP" form of Hairer & Wanner,
*Solving ODEs II*, §IV.7, eqs. (7.24)–(7.25), with ``u_i = Σ_j γ_ij k_j``):

* ``"rodas3"`` — 4 stages, order 3 with embedded order 2, stiffly accurate,
  γ = 1/2. Source: A. Sandu, J. G. Verwer, J. G. Blom, E. J. Spee,
  G. R. Carmichael, F. A. Potra, "Benchmarking stiff ODE solvers for
  atmospheric chemistry problems II: Rosenbrock solvers", *Atmospheric
  Environment* 31 (1997) 3459–3472. The transformed coefficients are derived
  below, exactly, from the published standard-form tableau.
* ``"ros3"`` — 3 stages, order 3(2), L-stable, γ ≈ 0.4358665. Same source;
  the transformed coefficients are the published 32-digit values.
* ``"ros34pw2"`` — a Rosenbrock–W method: 4 stages, order 3(2) with any
  matrix in place of the Jacobian, L-stable, stiffly accurate, γ ≈ 0.4358665
  (Rang & Angermann 2005); the leaf lets each lane reuse its Jacobian and
  factorisation over steps with it (``reuse``).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..errors import JacError

__all__ = ["Tableau", "METHODS", "perm_arrays"]


# --------------------------------------------------------------------------
# Method coefficients.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Tableau:
    """A Rosenbrock method in transformed form.

    Stage ``i``: ``(I/(hγ) − J) u_i = f(t + α_i h, y + Σ_j a_ij u_j)
    + Σ_j (c_ij/h) u_j + γ_i h ∂f/∂t``; ``y_new = y + Σ m_i u_i``;
    error estimate ``Σ e_i u_i``. ``newf[i]`` says whether stage ``i`` needs
    a fresh ``f`` (false when its argument equals the previous stage's).
    """

    name: str
    gamma: float            # diagonal γ
    a: tuple                # a[i] = (a_i0, …, a_i,i-1)
    c: tuple                # c[i] likewise
    m: tuple
    e: tuple
    alpha: tuple            # α_i = Σ_j α_ij (stage time offsets)
    gsum: tuple             # γ_i = Σ_{j≤i} γ_ij (∂f/∂t weights)
    newf: tuple
    elo: float              # order of the error estimate's leading term
    wmethod: bool = False   # order holds for any matrix in place of J (W-conditions)

    @property
    def stages(self) -> int:
        return len(self.m)


def _transform(name, alpha, gam, b, bhat, elo, wmethod=False) -> Tableau:
    """Standard form (α_ij, γ_ij incl. diagonal, b, b̂) → transformed form,
    exactly in rationals: a = α Γ⁻¹, c = diag(1/γ) − Γ⁻¹, m = b Γ⁻¹,
    e = (b − b̂) Γ⁻¹ (Hairer–Wanner II, (7.25))."""
    s = len(b)
    G = [[Fraction(gam[i][j]) if j <= i else Fraction(0) for j in range(s)] for i in range(s)]
    H = [[Fraction(0)] * s for _ in range(s)]           # Γ⁻¹, lower triangular
    for j in range(s):
        for i in range(s):
            acc = Fraction(int(i == j))
            for k in range(j, i):
                acc -= G[i][k] * H[k][j]
            H[i][j] = acc / G[i][i] if i >= j else Fraction(0)
    A = [[Fraction(alpha[i][k]) if k < i else Fraction(0) for k in range(s)] for i in range(s)]

    def rowmul(v):
        return [sum((v[k] * H[k][j] for k in range(s)), Fraction(0)) for j in range(s)]

    a = tuple(tuple(float(x) for x in rowmul(A[i])[:i]) for i in range(s))
    c = tuple(tuple(float(-H[i][j]) for j in range(i)) for i in range(s))
    m = tuple(float(x) for x in rowmul([Fraction(x) for x in b]))
    e = tuple(float(x) for x in rowmul([Fraction(x) - Fraction(y) for x, y in zip(b, bhat)]))
    alph = tuple(float(sum(A[i], Fraction(0))) for i in range(s))
    gs = tuple(float(sum(G[i][: i + 1], Fraction(0))) for i in range(s))
    newf = tuple(i == 0 or a[i] != a[i - 1] + (0.0,) or alph[i] != alph[i - 1] for i in range(s))
    return Tableau(name, float(G[0][0]), a, c, m, e, alph, gs, newf, elo, wmethod)


F = Fraction
# Rodas3, standard form (Sandu et al. 1997): γ = 1/2,
#   α = [[], [0], [1, 0], [3/4, −1/4, 1/2]],
#   γ_ij = [[1/2], [1, 1/2], [−1/4, −1/4, 1/2], [1/12, 1/12, −2/3, 1/2]],
#   b = (5/6, −1/6, −1/6, 1/2) (stiffly accurate: b = α_4· + γ_4·),
#   b̂ = (3/4, −1/4, 1/2, 0) (= α_4·, also stiffly accurate).
# Transformed, this gives the familiar a31 = a41 = 2, a43 = 1, c21 = 4,
# c31 = c41 = 1, c32 = c42 = −1, c43 = −8/3, m = (2, 0, 1, 1), e = (0, 0, 0, 1).
_RODAS3 = _transform(
    "rodas3",
    alpha=[[], [0], [1, 0], [F(3, 4), F(-1, 4), F(1, 2)]],
    gam=[[F(1, 2)], [1, F(1, 2)], [F(-1, 4), F(-1, 4), F(1, 2)],
         [F(1, 12), F(1, 12), F(-2, 3), F(1, 2)]],
    b=[F(5, 6), F(-1, 6), F(-1, 6), F(1, 2)],
    bhat=[F(3, 4), F(-1, 4), F(1, 2), 0],
    elo=3.0,
)

# ROS3 (Sandu et al. 1997), already in transformed form; γ is the root of
# 6γ³ − 18γ² + 9γ − 1 = 0 that makes the method L-stable.
_G3 = 0.43586652150845899941601945119356
_ROS3 = Tableau(
    "ros3",
    gamma=_G3,
    a=((), (1.0,), (1.0, 0.0)),
    c=((), (-1.0156171083877702091975600115545,),
       (4.0759956452537699824805835358067, 9.2076794298330791242156818474003)),
    m=(1.0, 6.1697947043828245592553615689730, -0.42772256543218573326238373806514),
    e=(0.5, -2.9079558716805469821718236208017, 0.22354069897811569627360909276199),
    alpha=(0.0, _G3, _G3),
    gsum=(_G3, 0.24291996454816804366592249683314, 2.1851380027664058511513169485832),
    newf=(True, True, False),
    elo=3.0,
)

# ROS34PW2 (J. Rang, L. Angermann, "New Rosenbrock W-methods of order 3 for
# partial differential algebraic equations of index 1", BIT Numer. Math. 45
# (2005) 761–787), standard form: a W-method of order 3 (embedded 2) — its
# order conditions hold with *any* matrix in place of ∂f/∂y, so a lane may
# keep a Jacobian (and its factorisation) over several steps —, L-stable,
# stiffly accurate (b = α_4· + γ_4·). The published 17-digit values;
# tests/integrators/test_wmethod.py checks every W-method order condition to
# order 3 (2 for b̂) on them.
_G34 = F("0.43586652150845900")
_ROS34PW2 = _transform(
    "ros34pw2",
    alpha=[[], [F("0.87173304301691801")],
           [F("0.84457060015369423"), F("-0.11299064236484185")],
           [0, 0, 1]],
    gam=[[_G34], [F("-0.87173304301691801"), _G34],
         [F("-0.90338057013044082"), F("0.054180672388095326"), _G34],
         [F("0.24212380706095346"), F("-1.2232505839045147"), F("0.54526025533510214"), _G34]],
    b=[F("0.24212380706095346"), F("-1.2232505839045147"), F("1.5452602553351020"), _G34],
    bhat=[F("0.37810903145819369"), F("-0.096042292212423178"), F("0.5"), F("0.21793326075422950")],
    elo=3.0,
    wmethod=True,
)
del F

#: Available methods by name.
METHODS: dict[str, Tableau] = {"rodas3": _RODAS3, "ros3": _ROS3, "ros34pw2": _ROS34PW2}


def perm_arrays(perm, n) -> tuple:
    """``(perm, inverse)`` int64 arrays of a variable order (None: the
    identity), read-only like every build product (every caller then hands
    the lane-step kernels the same Numba signature); a sequence that is not
    a permutation of ``range(n)`` is refused."""
    if perm is None:
        p = np.arange(n, dtype=np.int64)
    else:
        try:
            p = np.array([int(x) for x in perm], dtype=np.int64)
        except (TypeError, ValueError):
            raise JacError("bad_argument", f"perm must be a sequence of ints, got {perm!r}") from None
        if p.shape != (n,) or sorted(p.tolist()) != list(range(n)):
            raise JacError("bad_argument", f"perm must be a permutation of 0..{n - 1}, got {tuple(perm)}")
    ip = np.empty(n, dtype=np.int64)
    ip[p] = np.arange(n, dtype=np.int64)
    p.setflags(write=False)
    ip.setflags(write=False)
    return p, ip
