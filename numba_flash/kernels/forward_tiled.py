"""Forward kernel, tiled variant: every thread computes a small tile of S and of O.

Why: in the row-per-thread kernel each value loaded from shared memory feeds one FMA, so it
runs at shared-memory speed, about a quarter of the FMA rate. Here a block of TY x TX threads
owns block_m query rows; thread (ty, tx) owns rows ty + a*TY (a < TM) and, of S, columns
tx + b*TX (b < TN), of O, columns tx + c*TX (c < TD). Each shared-memory load then feeds TN
(or TM, TD) FMAs. Rows and columns are strided, not contiguous, so that the lanes of a warp
read consecutive words (no bank conflicts) and shared rows (broadcasts).

One K/V tile, in four phases separated by barriers:
  1. S = (scale Q) K^T from Q (staged once) and K^T in shared memory; masked entries -inf.
  2. one thread per row: m_new = max(m, rowmax S), alpha = exp(m - m_new); V replaces K^T.
  3. every thread: P = exp(S - m_new) (from its registers) into shared; O *= alpha.
  4. one thread per row: l = alpha l + rowsum P; every thread: O += P V.
"""

import functools
import math

import numpy as np

# numba_flash before numba.cuda: without a GPU, importing it turns the simulator on first
from numba_flash.kernels.support import (NEG_INF, cached_jit, U, ceil_div, check_block,
                                         check_head_dim, check_shared_memory, head_index,
                                         kv_head, numba_type)
from numba import cuda

THREADS_X = 16   # TX: threads along the key / head-dim axis
THREADS_Y = 8    # TY: threads along the query axis


def thread_shape(block_m, block_n, threads=None):
    """(TY, TX): `threads` if given, else 8 x 16 threads (8 x 8 for block_m >= 64, so that each
    thread owns an 8 x 4 tile of S), fewer where a block is smaller. Chosen by `numba-flash
    tune` on an H200 (2026-11-29, N = 2048, float32): d = 64 ran 22.9 TFLOP/s with (64, 32, 8x8)
    against 19.3 with (32, 64, 8x16); d = 128 ran best with (32, 32, 8x16), 16.1."""
    if threads is not None:
        return tuple(threads)
    tx = 8 if block_m >= 64 else THREADS_X
    return min(THREADS_Y, block_m), min(tx, block_n)


def shared_bytes(block_m, block_n, head_dim, item, threads=None):
    """Shared memory of one block: Q (padded), K^T or V (one buffer), S/P (padded), m, l, alpha."""
    _, tx = thread_shape(block_m, block_n, threads)
    d_pad = ceil_div(head_dim, tx) * tx
    kv = max(d_pad * (block_n + 1), block_n * d_pad)
    return item * (block_m * (d_pad + 1) + kv + block_m * (block_n + 1) + 3 * block_m)


def default_blocks(head_dim, dtype):
    """(block_m, block_n) chosen per (d, dtype) to fit 48 KiB: larger tiles where d is small."""
    item = np.dtype(dtype).itemsize
    for block_m, block_n in ((64, 32), (32, 64), (32, 32), (16, 32), (16, 16), (8, 16), (8, 8)):
        if shared_bytes(block_m, block_n, head_dim, item) <= 48 * 1024:
            return block_m, block_n
    raise ValueError(f"no tile fits head dim {head_dim}")


@functools.lru_cache(maxsize=None)
def make_forward_kernel(block_m, block_n, head_dim, causal, dtype, threads=None):
    """Compile-time constants in, (kernel, threads_per_block) out. Launch with grid
    (ceil(Nq / block_m), B*H) and arguments (q, k, v, out, lse, scale, heads, group).
    threads = (TY, TX) overrides the thread shape (each thread then owns a
    block_m/TY x block_n/TX tile of S), for tuning."""
    check_block("block_m", block_m, 128)
    check_block("block_n", block_n, 128)
    check_head_dim(head_dim)
    T = numba_type(dtype)
    TY, TX = thread_shape(block_m, block_n, threads)
    if block_m % TY or block_n % TX:
        raise ValueError(f"tiled forward needs block_m a multiple of {TY} and block_n a multiple "
                         f"of {TX}, got {block_m} and {block_n}")
    check_shared_memory(f"tiled forward with block_m={block_m}, block_n={block_n}, d={head_dim}",
                        shared_bytes(block_m, block_n, head_dim, T.bitwidth // 8, threads),
                        "choose smaller blocks")
    BLOCK_M, BLOCK_N, D = block_m, block_n, head_dim
    TM, TN = BLOCK_M // TY, BLOCK_N // TX
    D_PAD = ceil_div(D, TX) * TX                       # head dim padded with zeros to TX*TD
    TD = D_PAD // TX
    D_ROW, S_ROW = D_PAD + 1, BLOCK_N + 1              # padded rows: no bank conflicts
    KV_SIZE = max(D_PAD * S_ROW, BLOCK_N * D_PAD)
    # unsigned copies for every index expression (common.U says why)
    uBM, uBN, uD, uDP, uNT, uTX, uTY, uSR = (U(x) for x in (BLOCK_M, BLOCK_N, D, D_PAD,
                                                           TY * TX, TX, TY, S_ROW))

    @cached_jit
    def forward_tiled(q, k, v, out, lse, scale, heads, group):
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        m0 = U(cuda.blockIdx.x) * uBM
        nq, nk = U(q.shape[1]), U(k.shape[1])
        # causal: key j visible to query i iff j <= i + nk - nq, i.e. j + nq <= i + nk

        Q_tile = cuda.shared.array((BLOCK_M, D_ROW), T)
        KV_tile = cuda.shared.array(KV_SIZE, T)        # K^T [c * S_ROW + j], then V [j * D_PAD + c]
        S_tile = cuda.shared.array((BLOCK_M, S_ROW), T)
        m_row = cuda.shared.array(BLOCK_M, T)
        l_row = cuda.shared.array(BLOCK_M, T)
        alpha_row = cuda.shared.array(BLOCK_M, T)
        s = cuda.local.array((TM, TN), T)
        o = cuda.local.array((TM, TD), T)

        # Q tile, pre-multiplied by scale, zero outside the problem
        idx = tid
        while idx < uBM * uDP:
            r = idx // uDP
            c = idx % uDP
            inside = m0 + r < nq and c < uD
            Q_tile[r, c] = q[bh, m0 + r, c] * T(scale) if inside else T(0.0)
            idx += uNT
        r = tid
        while r < uBM:
            m_row[r] = T(NEG_INF)
            l_row[r] = T(0.0)
            r += uNT
        for a in range(TM):
            for c in range(TD):
                o[a, c] = T(0.0)
        cuda.syncthreads()        # m_row, l_row are read at the end even if no tile is visited

        n_end = nk
        if causal:                                     # no key past the block's last row
            last = m0 + uBM + nk                       # keys j < last - nq are visible to some row
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        while n0 < n_end:
            # stage K^T
            idx = tid
            while idx < uBN * uDP:
                j = idx // uDP
                c = idx % uDP
                inside = n0 + j < nk and c < uD
                KV_tile[c * uSR + j] = k[kv, n0 + j, c] if inside else T(0.0)
                idx += uNT
            cuda.syncthreads()

            # phase 1: this thread's TM x TN scores
            for a in range(TM):
                for b in range(TN):
                    s[a, b] = T(0.0)
            c = U(0)
            while c < uDP:
                for a in range(TM):
                    q_ac = Q_tile[ty + U(a) * uTY, c]
                    for b in range(TN):
                        s[a, b] += q_ac * KV_tile[c * uSR + tx + U(b) * uTX]
                c += U(1)
            for a in range(TM):
                r = ty + U(a) * uTY
                for b in range(TN):
                    j = n0 + tx + U(b) * uTX
                    if j >= nk or (causal and j + nq > m0 + r + nk):
                        s[a, b] = T(NEG_INF)
                    S_tile[r, tx + U(b) * uTX] = s[a, b]
            cuda.syncthreads()

            # phase 2: row statistics (one thread per row); the others stage V over K^T
            r = tid
            while r < uBM:
                m_old = m_row[r]
                m_new = m_old
                j = U(0)
                while j < uBN:
                    m_new = max(m_new, S_tile[r, j])
                    j += U(1)
                # guard: while a row has seen no visible key, m stays -inf and alpha is moot
                alpha_row[r] = math.exp(m_old - m_new) if m_new != T(NEG_INF) else T(0.0)
                m_row[r] = m_new
                r += uNT
            idx = tid
            while idx < uBN * uDP:
                j = idx // uDP
                c = idx % uDP
                inside = n0 + j < nk and c < uD
                KV_tile[j * uDP + c] = v[kv, n0 + j, c] if inside else T(0.0)
                idx += uNT
            cuda.syncthreads()

            # phase 3: P = exp(S - m_new) from registers; rescale O by alpha
            for a in range(TM):
                r = ty + U(a) * uTY
                m_new = m_row[r]
                m_safe = m_new if m_new != T(NEG_INF) else T(0.0)
                for b in range(TN):
                    S_tile[r, tx + U(b) * uTX] = math.exp(s[a, b] - m_safe)
                alpha = alpha_row[r]
                for c in range(TD):
                    o[a, c] *= alpha
            cuda.syncthreads()

            # phase 4: l = alpha l + rowsum P (one thread per row); O += P V (all)
            r = tid
            while r < uBM:
                l_sum = T(0.0)
                j = U(0)
                while j < uBN:
                    l_sum += S_tile[r, j]
                    j += U(1)
                l_row[r] = alpha_row[r] * l_row[r] + l_sum
                r += uNT
            j = U(0)
            while j < uBN:
                for a in range(TM):
                    p = S_tile[ty + U(a) * uTY, j]
                    for c in range(TD):
                        o[a, c] += p * KV_tile[j * uDP + tx + U(c) * uTX]
                j += U(1)
            cuda.syncthreads()
            n0 += uBN

        # out = O / l; rows that saw no key give out = 0 and lse = -inf (l = 0), rows that
        # met a NaN or +inf logit NaN (l NaN)
        for a in range(TM):
            r = ty + U(a) * uTY
            i = m0 + r
            if i < nq:
                l_i = l_row[r]
                inv_l = T(1.0) / l_i if l_i != T(0.0) else T(0.0)     # NaN l: NaN out
                for c in range(TD):
                    col = tx + U(c) * uTX
                    if col < uD:
                        out[bh, i, col] = o[a, c] * inv_l
                if tx == U(0):
                    lse[bh, i] = m_row[r] + math.log(l_i) if l_i != T(0.0) else T(NEG_INF)

    return forward_tiled, (TX, TY)
