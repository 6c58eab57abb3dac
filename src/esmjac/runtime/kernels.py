"""Fixed Numba kernels shared by every program: scatter, products, checks.

They are compiled once (``cache=True``) and take every index array as an
argument. Each output element is owned by one loop iteration, and its sum
runs in plan order, so results are bitwise identical for any thread count
(no atomics, no reductions across threads). Lane kernels address
``a[s]*L + b[s] + l*stride[s]``: that covers lane-blocked storage
(``stride = 1``) and a global CSR of a cell program (``stride`` = row
length).
"""
from __future__ import annotations

import numba as nb
import numpy as np

_JIT = dict(cache=True, nogil=True, error_model="numpy")


CHUNK = 512   # lanes per work item: long unit-stride inner loops, few items


@nb.njit(parallel=True, **_JIT)
def lane_gather(B, L, ptr, src, a, b, stride, out):
    """out[a*L + b + l*stride] = Σ B[src*L + l] per slot (plan order).

    Work items are lane chunks; inside one, each slot is a unit-stride loop
    over the chunk's lanes (vectorizable)."""
    nslot = a.shape[0]
    nch = (L + CHUNK - 1) // CHUNK
    for ch in nb.prange(nch):
        l0 = ch * CHUNK
        l1 = min(L, l0 + CHUNK)
        for s in range(nslot):
            base = a[s] * L + b[s]
            st = stride[s]
            j0 = ptr[s]
            j1 = ptr[s + 1]
            if st == 1:          # lane-blocked storage: unit stride, vectorizable
                if j0 == j1:
                    out[base + l0:base + l1] = 0
                else:
                    k0 = src[j0] * L
                    out[base + l0:base + l1] = B[k0 + l0:k0 + l1]
                    for j in range(j0 + 1, j1):
                        k = src[j] * L
                        for l in range(l0, l1):
                            out[base + l] += B[k + l]
            elif j0 == j1:
                for l in range(l0, l1):
                    out[base + l * st] = 0
            else:
                k0 = src[j0] * L
                for l in range(l0, l1):
                    out[base + l * st] = B[k0 + l]
                for j in range(j0 + 1, j1):
                    k = src[j] * L
                    for l in range(l0, l1):
                        out[base + l * st] += B[k + l]


@nb.njit(parallel=True, **_JIT)
def tile_gather(B, L, W, P, ptr, src, a, out):
    """out[((l // W)*P + a)*W + l % W] = Σ B[src*L + l] per slot (plan order)
    for every stored lane ``l`` of the padded capacity; padding lanes read
    the last real lane. One work item per tile."""
    nslot = a.shape[0]
    nt = (L + W - 1) // W
    for t in nb.prange(nt):
        l0 = t * W
        for s in range(nslot):
            base = (t * P + a[s]) * W
            j0 = ptr[s]
            j1 = ptr[s + 1]
            if j0 == j1:
                for j in range(W):
                    out[base + j] = 0
            else:
                for j in range(W):
                    l = min(l0 + j, L - 1)
                    acc = B[src[j0] * L + l]
                    for k in range(j0 + 1, j1):
                        acc += B[src[k] * L + l]
                    out[base + j] = acc


@nb.njit(parallel=True, **_JIT)
def point_gather(B, ptr, src, pos, out):
    """out[pos[s]] = Σ B[src[j]] for j in slot s (plan order)."""
    for s in nb.prange(pos.shape[0]):
        j0 = ptr[s]
        j1 = ptr[s + 1]
        if j0 == j1:
            out[pos[s]] = 0
        else:
            acc = B[src[j0]]
            for j in range(j0 + 1, j1):
                acc += B[src[j]]
            out[pos[s]] = acc


@nb.njit(parallel=True, **_JIT)
def lane_apply(B, L, ptr, band, ca, cb, cs, tgt, v, y):
    """y[tgt[r]*L + l] += Σ B[band*L + l] · v[ca*L + cb + l*cs] per row r
    (float64 accumulator per lane, terms in plan order)."""
    nch = (L + CHUNK - 1) // CHUNK
    for ch in nb.prange(nch):
        l0 = ch * CHUNK
        l1 = min(L, l0 + CHUNK)
        acc = np.empty(l1 - l0, dtype=np.float64)
        for r in range(tgt.shape[0]):
            acc[:] = 0.0
            for j in range(ptr[r], ptr[r + 1]):
                kb = band[j] * L
                vb = ca[j] * L + cb[j]
                st = cs[j]
                for l in range(l0, l1):
                    acc[l - l0] += np.float64(B[kb + l]) * np.float64(v[vb + l * st])
            yb = tgt[r] * L
            for l in range(l0, l1):
                y[yb + l] += acc[l - l0]


@nb.njit(parallel=True, **_JIT)
def lane_apply_global(B, L, ptr, band, rl, tgt, lam, g):
    """g[tgt[c]] += Σ_l Σ B[band*L + l] · lam[rl*L + l] (a scalar column:
    one iteration owns it and sums the lanes in order)."""
    for c in nb.prange(tgt.shape[0]):
        acc = 0.0
        for l in range(L):
            for j in range(ptr[c], ptr[c + 1]):
                acc += np.float64(B[band[j] * L + l]) * np.float64(lam[rl[j] * L + l])
        g[tgt[c]] += acc


@nb.njit(parallel=True, **_JIT)
def point_apply(B, ptr, src, other, tgt, v, y):
    """y[tgt[r]] += Σ B[src[j]] · v[other[j]] (rows, or columns for Jᵀ)."""
    for r in nb.prange(tgt.shape[0]):
        acc = 0.0
        for j in range(ptr[r], ptr[r + 1]):
            acc += np.float64(B[src[j]]) * np.float64(v[other[j]])
        y[tgt[r]] += acc


@nb.njit(parallel=True, **_JIT)
def count_nonfinite(x):
    n = 0
    for i in nb.prange(x.shape[0]):
        if not np.isfinite(x[i]):
            n += 1
    return n


def first_nonfinite(x: np.ndarray) -> int:
    return int(np.flatnonzero(~np.isfinite(x))[0])


def scatter(plan, B, L: int, out) -> None:
    """``out`` = ``plan``'s gather of the band slab ``B`` at ``L`` lanes
    (tiled, lanes-fastest or point plans; the one dispatch every caller
    uses)."""
    a = plan.arrays
    if plan.tiled:
        tile_gather(B, L, plan.tile_width(L), int(plan.info["slots_per_lane"]), a["ptr"], a["src"], a["a"], out)
    elif plan.kind == "lane":
        lane_gather(B, L, a["ptr"], a["src"], a["a"], a["b"], a["stride"], out)
    else:
        if plan.info.get("zero_first"):
            out[:] = 0
        point_gather(B, a["ptr"], a["src"], a["pos"], out)
