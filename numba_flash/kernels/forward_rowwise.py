"""Forward kernel, readable variant: one thread per query row.

It mirrors reference.flash_forward(outer="q") line by line. Each thread keeps its row of Q,
its running max m and sum l, and its (unnormalized) output row in registers; the block walks
over K/V in tiles of block_n rows staged in shared memory; per tile each thread computes its
block_n scores, raises m, rescales l and O by exp(m_old - m_new), and adds P V.

The template for a kernel of your own: copy this file anywhere (its imports are absolute),
change it, and register it (README, "Changing a kernel").
"""

import functools
import math

import numpy as np

# numba_flash before numba.cuda: without a GPU, importing it turns the simulator on first
from numba_flash.kernels.support import (NEG_INF, cached_jit, check_block, check_head_dim,
                                         check_shared_memory, head_index, kv_head,
                                         numba_type)
from numba import cuda


def default_blocks(head_dim, dtype):
    """(block_m, block_n): 64 threads per block; K/V tiles as deep as 48 KiB allows."""
    item = np.dtype(dtype).itemsize
    block_n = 32
    while block_n > 1 and 2 * block_n * head_dim * item > 48 * 1024:
        block_n //= 2
    return 64, block_n


@functools.lru_cache(maxsize=None)
def make_forward_kernel(block_m, block_n, head_dim, causal, dtype):
    """Compile-time constants in, (kernel, threads_per_block) out. Launch with grid
    (ceil(Nq / block_m), B*H) and arguments (q, k, v, out, lse, scale, heads, group)."""
    check_block("block_m", block_m)
    check_block("block_n", block_n)
    check_head_dim(head_dim)
    T = numba_type(dtype)
    item = T.bitwidth // 8
    check_shared_memory(f"rowwise forward with block_n={block_n}, d={head_dim}",
                        2 * block_n * head_dim * item, "choose a smaller block_n")
    BLOCK_M, BLOCK_N, D = block_m, block_n, head_dim

    @cached_jit
    def forward_rowwise(q, k, v, out, lse, scale, heads, group):
        bh = head_index()
        if bh >= q.shape[0]:                           # past the last head (support.head_grid)
            return
        kv = kv_head(bh, heads, group)
        tid = cuda.threadIdx.x
        i = cuda.blockIdx.x * BLOCK_M + tid          # this thread's query row
        nq, nk = q.shape[1], k.shape[1]
        offset = nk - nq                               # causal: key j visible iff j <= i + offset

        K_tile = cuda.shared.array((BLOCK_N, D), T)
        V_tile = cuda.shared.array((BLOCK_N, D), T)
        q_i = cuda.local.array(D, T)
        o_i = cuda.local.array(D, T)
        s = cuda.local.array(BLOCK_N, T)

        for c in range(D):
            q_i[c] = q[bh, i, c] * T(scale) if i < nq else T(0.0)
            o_i[c] = T(0.0)
        m = T(NEG_INF)
        l = T(0.0)

        n_end = nk
        if causal:                                     # no key past the block's last row
            n_end = min(nk, (cuda.blockIdx.x + 1) * BLOCK_M + offset)
        for n0 in range(0, n_end, BLOCK_N):
            # all threads stage the K/V tile
            for idx in range(tid, BLOCK_N * D, BLOCK_M):
                r = idx // D
                c = idx % D
                inside = n0 + r < nk
                K_tile[r, c] = k[kv, n0 + r, c] if inside else T(0.0)
                V_tile[r, c] = v[kv, n0 + r, c] if inside else T(0.0)
            cuda.syncthreads()

            if i < nq:
                # S_ij = scale q_i . k_j for this tile, and the tile's row max
                m_new = m
                for jj in range(BLOCK_N):
                    j = n0 + jj
                    if j < nk and (not causal or j <= i + offset):
                        acc = T(0.0)
                        for c in range(D):
                            acc += q_i[c] * K_tile[jj, c]
                        s[jj] = acc
                        m_new = max(m_new, acc)
                    else:
                        s[jj] = T(NEG_INF)
                # guard: while a row has seen no finite logit, m = -inf and exp(-inf - -inf)
                # would be NaN; subtracting 0 instead keeps P = 0 for masked keys and lets a
                # NaN logit (max() passes over it) make l NaN, as IEEE says
                m_safe = m_new if m_new != T(NEG_INF) else T(0.0)
                alpha = math.exp(m - m_safe)           # rescales what was summed under m
                l *= alpha
                for c in range(D):
                    o_i[c] *= alpha
                for jj in range(BLOCK_N):
                    p = math.exp(s[jj] - m_safe)       # P_ij, 0 for masked keys
                    l += p
                    for c in range(D):
                        o_i[c] += p * V_tile[jj, c]
                m = m_new
            cuda.syncthreads()

        if i < nq:
            # normalize once; a row that saw no key gives out = 0, lse = -inf (l = 0), a row
            # that met a NaN or +inf logit NaN (l is NaN: NaN != 0)
            inv_l = T(1.0) / l if l != T(0.0) else T(0.0)
            for c in range(D):
                out[bh, i, c] = o_i[c] * inv_l
            lse[bh, i] = m + math.log(l) if l != T(0.0) else T(NEG_INF)

    return forward_rowwise, BLOCK_M
