"""The two tile products the fa2 kernels are built from, as device functions on one shared
array, reading it in 16-byte vectors (CHUNK elements at a time):

  dot_rows    acc[a, b]  = sum_c A[ty + a TY, c] B[tx + b TX, c]       (S = Q K^T, dP = dO V^T)
  accumulate  acc[a, cc] += sum_t W[ty + a TY, t] X[t, col(cc)]        (O += P V, dK += dS^T Q)

where a thread's head-dim columns col(cc) come in runs of CHUNK: run e, element i is column
e * CHUNK * TX + tx * CHUNK + i. dot_rows sums c in ascending order with one FMA per term, which
is the order the backward must repeat to recompute P bit for bit. On the GPU the functions are
forced inline, so that the accumulators stay in registers.
"""

import functools

from numba import cuda

from .support import ALIGN, SIMULATOR, U  # noqa: F401 (ALIGN: the fa2 kernels')
from .vector_io import VECTOR

CHUNK = 4      # elements per vector load (16 bytes in float32; float64 reads two v2)
# each thread owns runs of CHUNK head-dim columns, which the kernels' vector_io paths read,
# write or add with one access of VECTOR elements
assert CHUNK == VECTOR
PAD = 4        # row padding of arrays read by rows from different lanes (see forward_fa2)
DEVICE = dict(device=True) if SIMULATOR else dict(device=True, forceinline=True)


def lanes_for_head_dim(head_dim):
    """TX, the threads of a row along the head dim: 16, or 8 / 4 when d is small, so that
    little of the padded head dim (a multiple of CHUNK * TX) is padding."""
    tx = 16
    while tx > 4 and tx * CHUNK >= 2 * head_dim:
        tx //= 2
    return tx


@functools.lru_cache(maxsize=None)
def tile_products(T, TA, TB, TY, TX, D_PAD, A_ROW, W_ROW, X_ROW):
    """(dot_rows, accumulate) for accumulators of TA x TB (dot_rows) and TA x D_PAD / TX
    (accumulate) per thread. A and B rows have A_ROW elements (the head dim padded), W rows
    W_ROW, X rows X_ROW; every offset passed in must be a multiple of CHUNK."""
    TE = D_PAD // (CHUNK * TX)
    TD = TE * CHUNK
    uDP, uAR, uWR, uXR, uTX, uTY = (U(x) for x in (D_PAD, A_ROW, W_ROW, X_ROW, TX, TY))
    uCH, uRUN = U(CHUNK), U(CHUNK * TX)

    @cuda.jit(**DEVICE)
    def dot_rows(sm, a_off, b_off, acc, ty, tx):
        """acc[a, b] = sum over the padded head dim of A[ty + a TY, c] B[tx + b TX, c]."""
        bb = cuda.local.array((TB, CHUNK), T)
        for a in range(TA):
            for b in range(TB):
                acc[a, b] = T(0.0)
        c = U(0)
        while c < uDP:
            for b in range(TB):
                base = b_off + (tx + U(b) * uTX) * uAR + c
                for e in range(CHUNK):
                    bb[b, e] = sm[base + U(e)]
            for a in range(TA):
                base = a_off + (ty + U(a) * uTY) * uAR + c
                a0, a1, a2, a3 = sm[base], sm[base + U(1)], sm[base + U(2)], sm[base + U(3)]
                for b in range(TB):
                    acc[a, b] += a0 * bb[b, 0]
                    acc[a, b] += a1 * bb[b, 1]
                    acc[a, b] += a2 * bb[b, 2]
                    acc[a, b] += a3 * bb[b, 3]
            c += uCH

    @cuda.jit(**DEVICE)
    def accumulate(sm, w_off, x_off, length, acc, ty, tx):
        """acc[a, cc] += sum_{t < length} W[ty + a TY, t] X[t, col(cc)]; length % CHUNK == 0."""
        xx = cuda.local.array((CHUNK, TD), T)
        t = U(0)
        while t < length:
            for tt in range(CHUNK):
                for e in range(TE):
                    base = x_off + (t + U(tt)) * uXR + U(e) * uRUN + tx * uCH
                    for i in range(CHUNK):
                        xx[tt, e * CHUNK + i] = sm[base + U(i)]
            for a in range(TA):
                base = w_off + (ty + U(a) * uTY) * uWR + t
                w0, w1, w2, w3 = sm[base], sm[base + U(1)], sm[base + U(2)], sm[base + U(3)]
                for cc in range(TD):
                    acc[a, cc] += w0 * xx[0, cc]
                    acc[a, cc] += w1 * xx[1, cc]
                    acc[a, cc] += w2 * xx[2, cc]
                    acc[a, cc] += w3 * xx[3, cc]
            t += uCH

    return dot_rows, accumulate
