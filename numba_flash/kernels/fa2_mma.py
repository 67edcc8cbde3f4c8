"""Tile products on tensor cores for the fa2 kernels: a block's R x C accumulator tile spread
over its warps in mma fragments (mma.py), each product float32-accurate by the 3xTF32 split.

    accumulate(sm, w_off, x_off, length, acc, warp, lane)
        acc += W[rows, 0:length] X[0:length, cols]        (dV += P^T dO, dK += dS^T Q, dQ += dS K)

W and X live in one shared array, both row-major, W rows W_ROW apart, X rows X_ROW apart. Warp
`warp` owns MT x NT fragments: row tiles of 16 starting at (warp // WN) * 16 * MT, column tiles of
8 starting at (warp % WN) * 8 * NT; acc is its (MT, NT, 4) local array, acc[mt, nt, e] holding
row row(mt, e), column col(nt, e) (see `position`). length % 8 == 0.

Accuracy: each 8-long step of the contraction is summed on the tensor core from zero, as
A_big B_big + A_big B_small + A_small B_big (mma.split_tf32), and only then added into acc with a
float32 add. Chaining the mma's accumulator across steps instead lets the tensor core's
truncating additions pile up (the errors measured on an H200 both ways: docs/performance.md).

On the simulator (no warp-wide mma) each lane computes its own fragment entries from shared
memory with the NumPy model of a step (reference.precision.step_3xtf32: the same split, each
step's sum rounded once), so the kernels' indexing is checked there; the tensor core's own
rounding only on a GPU.
"""

import functools

import numpy as np
from numba import cuda, float32

from reference.precision import step_3xtf32

from .support import SIMULATOR, U
from .fa2_tiles import DEVICE
from .mma import split_tf32
from .vector_io import add2

if not SIMULATOR:
    from .mma import mma_tf32

WARP = 32
MMA_M, MMA_N, MMA_K = 16, 8, 8


def warp_grid(rows, cols, warps):
    """(WM, WN, MT, NT): warps arranged WM x WN over an R x C tile, each owning MT row tiles of
    16 and NT column tiles of 8; ValueError when the tile does not split that way."""
    if rows % MMA_M or cols % MMA_N:
        raise ValueError(f"tensor-core tiles need rows a multiple of {MMA_M} and columns of "
                         f"{MMA_N}, got {rows} x {cols}")
    wm = warps
    while wm > 1 and (rows // MMA_M) % wm:
        wm //= 2
    wn = warps // wm
    if wm * wn != warps or (cols // MMA_N) % wn:
        raise ValueError(f"{warps} warps do not split a {rows} x {cols} tile into 16 x 8 tiles")
    return wm, wn, rows // (MMA_M * wm), cols // (MMA_N * wn)


@cuda.jit(**DEVICE)
def position(row0, col0, mt, nt, e, lane):
    """(row, column) in the block's tile of fragment entry acc[mt, nt, e] of the warp whose
    tiles start at row0, col0: rows g and g + 8, columns 2t and 2t + 1 of each 16 x 8 tile."""
    g, t = lane // U(4), lane % U(4)
    row = row0 + U(mt) * U(MMA_M) + g + (U(8) if e >= 2 else U(0))
    col = col0 + U(nt) * U(MMA_N) + U(2) * t + (U(1) if e % 2 else U(0))
    return row, col


@functools.lru_cache(maxsize=None)
def mma_products(rows, cols, warps, W_ROW, X_ROW):
    """Device functions for a rows x cols accumulator tile over `warps` warps, as a dict:
    accumulate (above), store, add and add_pairs (the warp's fragments into a global array,
    plainly, with scalar atomics or with one 8-byte vector atomic per pair of columns), clear
    (zero them), and shape, the (MT, NT, 4) of each warp's local array."""
    WM, WN, MT, NT = warp_grid(rows, cols, warps)
    uWR, uXR, uWN, uMT, uNT = (U(x) for x in (W_ROW, X_ROW, WN, MT, NT))

    @cuda.jit(**DEVICE)
    def origin(warp):
        return (warp // uWN) * uMT * U(MMA_M), (warp % uWN) * uNT * U(MMA_N)

    def accumulator():
        """accumulate (X row-major: X[k, c] at x_off + k * X_ROW + c)."""
        XK, XC = X_ROW, 1                                       # X's strides along k and c
        # The step's 8 contraction indices fill the fragments' slots t and t + 4 (any order
        # is the same product if W and X agree on it): indices k + 2t and k + 2t + 1, so that
        # a warp's loads of one X row (rows 4 more than a multiple of 32 banks apart) hit 32
        # distinct banks (in the fragments' order, k + t, they were 2-way conflicts: 22 % of
        # the shared wavefronts in ncu, d = 64), at the price of 2-way conflicts on W's fewer
        # loads.
        KS, KH = 2, 1
        uXK, uXC, uKS, uKH = U(XK), U(XC), U(KS), U(KH)

        if SIMULATOR:
            # plain NumPy on the shared array (a Python array there): device-function calls
            # per element made the simulated kernel ~20x slower. Every step of every entry of
            # the lane's fragments at once: step_3xtf32 over the last axis (8 long) of
            # (MT, NT, 4, steps, 8) arrays gives the same bits as one call an entry and step
            # (an 8-long sum is the same pairwise sum either way), and the steps go into acc in
            # order, as the loop over k did
            e = np.arange(4)
            rows = np.arange(MT)[:, None, None] * MMA_M + 8 * (e // 2)     # (MT, 1, 4)
            cols = np.arange(NT)[None, :, None] * MMA_N + e % 2            # (1, NT, 4)

            @cuda.jit(**DEVICE)
            def accumulate(sm, w_off, x_off, length, acc, warp, lane):
                row0, col0 = origin(warp)
                g, t = int(lane) // 4, int(lane) % 4
                steps, k = int(length) // MMA_K, np.arange(int(length))
                r = int(row0) + g + rows
                c = int(col0) + 2 * t + cols
                w = sm[int(w_off) + (r * W_ROW)[..., None] + k]
                x = sm[int(x_off) + k * XK + (c * XC)[..., None]]
                shape = (MT, NT, 4, steps, MMA_K)
                parts = step_3xtf32(np.broadcast_to(w, shape[:3] + (int(length),)).reshape(shape),
                                    np.broadcast_to(x, shape[:3] + (int(length),)).reshape(shape))
                for step in range(steps):
                    acc[:, :, :] += parts[..., step]
            return accumulate

        zero = float32(0.0)

        @cuda.jit(**DEVICE)
        def accumulate(sm, w_off, x_off, length, acc, warp, lane):
            row0, col0 = origin(warp)
            g, t = lane // U(4), lane % U(4)
            k = U(0)
            while k < length:
                for mt in range(MT):
                    w_row = w_off + (row0 + U(mt) * U(MMA_M) + g) * uWR + k + uKS * t
                    a0, s0 = split_tf32(sm[w_row])
                    a1, s1 = split_tf32(sm[w_row + U(8) * uWR])
                    a2, s2 = split_tf32(sm[w_row + uKH])
                    a3, s3 = split_tf32(sm[w_row + U(8) * uWR + uKH])
                    big, small = (a0, a1, a2, a3), (s0, s1, s2, s3)
                    for nt in range(NT):
                        x0 = x_off + (k + uKS * t) * uXK + (col0 + U(nt) * U(MMA_N) + g) * uXC
                        b0, r0 = split_tf32(sm[x0])
                        b1, r1 = split_tf32(sm[x0 + uKH * uXK])
                        step = mma_tf32(small, (b0, b1), (zero, zero, zero, zero))
                        step = mma_tf32(big, (r0, r1), step)
                        step = mma_tf32(big, (b0, b1), step)
                        for e in range(4):
                            acc[mt, nt, e] += step[e]
                k += U(MMA_K)
        return accumulate

    accumulate = accumulator()

    def writer(atomic, pairs=False):
        @cuda.jit(**DEVICE)
        def write(dst, head, row_base, n, d, acc, mult, warp, lane):
            """dst[head, row_base + row, col] = (or +=, atomically) mult * acc[mt, nt, e] for the
            warp's entries inside the array (row_base + row < n, col < d); with pairs, the
            atomic adds of the two adjacent columns a lane holds (e, e + 1) as one vector add
            (vector_io.add2: dst's rows 8-byte aligned)."""
            row0, col0 = origin(warp)
            for mt in range(MT):
                for nt in range(NT):
                    for e in range(4):
                        r, c = position(row0, col0, mt, nt, e, lane)
                        if row_base + r < n and c < d:
                            if pairs:
                                if e % 2 == 0:
                                    add2(dst, head, row_base + r, c,
                                         (acc[mt, nt, e] * mult, acc[mt, nt, e + 1] * mult))
                            elif atomic:
                                cuda.atomic.add(dst, (head, row_base + r, c), acc[mt, nt, e] * mult)
                            else:
                                dst[head, row_base + r, c] = acc[mt, nt, e] * mult
        return write

    @cuda.jit(**DEVICE)
    def clear(acc):
        for mt in range(MT):
            for nt in range(NT):
                for e in range(4):
                    acc[mt, nt, e] = float32(0.0)

    return dict(accumulate=accumulate, store=writer(False), add=writer(True),
                add_pairs=writer(True, pairs=True), clear=clear, shape=(MT, NT, 4))

