"""Backward kernels: D = rowsum(dO * O), then dK/dV and dQ, from q, k, v, out, lse only.

Three launches, none with atomics, so results are bitwise reproducible run after run:
  preprocess  D_i = sum_c dO_ic O_ic: a block reads its rows coalesced into shared memory, then
              one thread per query row sums (make_preprocess_kernel; shared by every backward).
  dkdv        grid over K/V blocks (B*Hk of them per block index): the outer loop holds K_j, V_j
              and the dK_j, dV_j accumulators; the inner loop walks the query heads that share
              this key head (GQA) and their Q blocks, recomputes P_ij = exp(S_ij - lse_i) and
              dS_ij = P_ij (dP_ij - D_i), and adds dV_j += P_ij^T dO_i, dK_j += dS_ij^T Q_i.
  dq          grid over Q blocks: recomputes P_ij and dS_ij for each K/V block and adds
              dQ_i += dS_ij K_j (the FlashAttention-2 alternative to atomic adds into dQ).
Both tile kernels use a TY x TX thread block; thread (ty, tx) owns strided rows ty + a*TY and
columns tx + b*TX of each tile, as in forward_tiled.

S must be recomputed bit for bit as the forward computed it: at large logits (|S| ~ 1e6 in
float32 an ulp is 0.06) any other rounding of S shifts P = exp(S - lse) by percents. So Q is
staged pre-multiplied by scale, as in the forward kernels, and summed in the same order;
dK = dS^T (scale Q) then needs no further scaling, and dQ = (dS K) scale.
"""

import functools
import math

import numpy as np

from numba import cuda

from .support import (NEG_INF, U, cached_jit, ceil_div, check_block, check_head_dim,
                      check_shared_memory, head_grid, head_index, inlined_device_function,
                      kv_head, numba_type)

THREADS_X = 16
THREADS_Y = 8
PREPROCESS_THREADS = 128


def thread_shape(block_m, block_n, threads=None):
    """(TY, TX): `threads` if given, else 8 x min(16, block_n / 2) threads, fewer where a block
    is smaller. Chosen by `numba-flash tune` on an H200 (2026-11-29, N = 2048, float32):
    d = 64, (32, 32) ran 14.0 TFLOP/s with 8x16 against 12.9 with 8x8; d = 128, (16, 16) ran
    10.4 with 8x8 against 8.5 with 8x16."""
    if threads is not None:
        return tuple(threads)
    return min(THREADS_Y, block_m, block_n), max(1, min(THREADS_X, block_n // 2))


def shared_bytes(block_m, block_n, head_dim, item, threads=None):
    """Q, dO (block_m rows), K, V (block_n rows), all padded; P and dS tiles; lse and D."""
    _, tx = thread_shape(block_m, block_n, threads)
    d_pad = ceil_div(head_dim, tx) * tx
    return item * ((2 * block_m + 2 * block_n) * (d_pad + 1) + 2 * block_m * (block_n + 1)
                   + 2 * block_m)


def default_blocks(head_dim, dtype):
    """(block_m, block_n) per (d, dtype): the largest square tile that fits 48 KiB."""
    item = np.dtype(dtype).itemsize
    for block in (32, 16, 8, 4):
        if shared_bytes(block, block, head_dim, item) <= 48 * 1024:
            return block, block
    raise ValueError(f"no tile fits head dim {head_dim}")


def preprocess_rows(head_dim, dtype):
    """Query rows per block of the preprocess kernel: 32, fewer where 32 rows of head_dim + 1
    elements would pass 16 KiB of shared memory (d > 127 in float32, d > 63 in float64)."""
    return max(1, min(32, 16384 // ((head_dim + 1) * np.dtype(dtype).itemsize)))


@inlined_device_function
def as_stored(x):
    """An element as it is stored (make_preprocess_kernel's default load)."""
    return x


@functools.lru_cache(maxsize=None)
def make_preprocess_kernel(head_dim, dtype, clear=False, load=as_stored):
    """D = rowsum(dO * O) on (BH, Nq, d) arrays; launch grid (ceil(Nq / rows), BH) with rows =
    preprocess_rows(head_dim, dtype), PREPROCESS_THREADS threads, arguments (dout, out, D, dq);
    `run_preprocess` launches it. clear=True also zeroes dq (a dQ that the dK/dV kernel then
    accumulates with atomics); otherwise dq is not touched. load: a device function from a
    stored element of dout and out to `dtype` (the 16-bit backward's unpacks bfloat16 /
    float16 patterns into float32: sm90.backward16.make_load); D and dq are `dtype`.

    A block's rows are one contiguous run of rows * d elements of each array: its threads read
    it in step (thread t takes elements t, t + 128, ...: coalesced) and put the products
    dO_ic O_ic into shared memory, rows padded to d + 1 elements (so that the row sums read
    without bank conflicts); then thread r sums row r in column order. (One thread per row
    reading global memory, as before 2026-12-02, took 1.8-2.0 ms at B*H*Nq*d = 2^25 float32
    on an H200, most of a millisecond of it per array: every load of a warp touched 32 rows.)"""
    check_head_dim(head_dim)
    T = numba_type(dtype)
    D_, W, R = head_dim, head_dim + 1, preprocess_rows(head_dim, dtype)
    uD, uR, uT = U(head_dim), U(R), U(PREPROCESS_THREADS)
    CLEAR = bool(clear)

    @cached_jit
    def preprocess(dout, out, D, dq):
        products = cuda.shared.array((R, W), T)     # dO_ic O_ic of the block's rows
        head = head_index()
        if head >= out.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        tid = U(cuda.threadIdx.x)
        r0 = U(cuda.blockIdx.x) * uR
        n = U(out.shape[1])
        rows = min(uR, n - r0)
        e = tid
        while e < rows * uD:                        # the rows' elements, in memory order
            r = e // uD
            c = e - r * uD
            products[r, c] = load(dout[bh, r0 + r, c]) * load(out[bh, r0 + r, c])
            if CLEAR:
                dq[bh, r0 + r, c] = T(0.0)
            e += uT
        cuda.syncthreads()
        if tid < rows:
            acc = T(0.0)
            for c in range(D_):
                acc += products[tid, c]
            D[bh, r0 + tid] = acc

    return preprocess, PREPROCESS_THREADS


def run_preprocess(dout, out, D, dq, clear=False, stream=0, load=as_stored):
    """D = rowsum(dO * O) into D (BH, Nq) from dout, out (BH, Nq, d) device arrays; clear:
    dq (BH, Nq, d) zeroed too (else not touched). Launched on `stream` (0: the default).
    load: as make_preprocess_kernel's (then D's dtype is the kernel's)."""
    bh, nq, d = out.shape
    dtype = out.dtype if load is as_stored else D.dtype
    pre, threads = make_preprocess_kernel(d, dtype, clear, load)
    pre[(ceil_div(nq, preprocess_rows(d, dtype)), *head_grid(bh)), threads, stream](
        dout, out, D, dq)


@functools.lru_cache(maxsize=None)
def _tile_functions(block_m, block_n, head_dim, causal, dtype, threads):
    """Device functions shared by the dkdv and dq kernels (same constants, same math).
    Every index is unsigned (common.U says why)."""
    T = numba_type(dtype)
    TY, TX = thread_shape(block_m, block_n, threads)
    D = head_dim
    D_PAD = ceil_div(D, TX) * TX
    TM, TN = block_m // TY, block_n // TX
    uD, uDP, uNT, uTX, uTY = U(D), U(D_PAD), U(TY * TX), U(TX), U(TY)

    @cuda.jit(device=True)
    def stage_rows(src, bh, row0, rows, tile, tid, mult):
        """tile[r, c] = mult * src[bh, row0 + r, c] for r < rows, zero outside the array / past d."""
        n = U(src.shape[1])
        idx = tid
        while idx < rows * uDP:
            r = idx // uDP
            c = idx % uDP
            tile[r, c] = src[bh, row0 + r, c] * mult if (row0 + r < n and c < uD) else T(0.0)
            idx += uNT

    @cuda.jit(device=True)
    def p_and_ds(Q_t, dO_t, K_t, V_t, lse_t, D_t, P_t, dS_t, m0, n0, nq, nk, ty, tx):
        """This thread's entries of P_ij = exp((scale Q_i) K_j^T - lse_i) (0 where masked or
        where the row saw no key) and dS_ij = P_ij (dO_i V_j^T - D_i), into P_t and dS_t."""
        s = cuda.local.array((TM, TN), T)
        dp = cuda.local.array((TM, TN), T)
        for a in range(TM):
            for b in range(TN):
                s[a, b] = T(0.0)
                dp[a, b] = T(0.0)
        c = U(0)
        while c < uDP:
            for a in range(TM):
                q_ac = Q_t[ty + U(a) * uTY, c]
                do_ac = dO_t[ty + U(a) * uTY, c]
                for b in range(TN):
                    s[a, b] += q_ac * K_t[tx + U(b) * uTX, c]
                    dp[a, b] += do_ac * V_t[tx + U(b) * uTX, c]
            c += U(1)
        for a in range(TM):
            r = ty + U(a) * uTY
            i = m0 + r
            lse_i = lse_t[r]
            for b in range(TN):
                j = n0 + tx + U(b) * uTX
                # causal: j <= i + nk - nq, written without a signed difference
                visible = i < nq and j < nk and (not causal or j + nq <= i + nk)
                p = T(0.0)
                if visible and lse_i != T(NEG_INF):       # guard: fully masked row
                    p = math.exp(s[a, b] - lse_i)
                P_t[r, tx + U(b) * uTX] = p
                dS_t[r, tx + U(b) * uTX] = p * (dp[a, b] - D_t[r])

    return stage_rows, p_and_ds


def _check_config(what, block_m, block_n, head_dim, dtype, threads):
    check_block("block_m", block_m, 128)
    check_block("block_n", block_n, 128)
    check_head_dim(head_dim)
    T = numba_type(dtype)
    TY, TX = thread_shape(block_m, block_n, threads)
    if block_m % TY or block_n % TX or block_n % TY:
        raise ValueError(f"{what} needs block_m and block_n multiples of {TY} and block_n a "
                         f"multiple of {TX}, got {block_m} and {block_n}")
    check_shared_memory(f"{what} with block_m={block_m}, block_n={block_n}, d={head_dim}",
                        shared_bytes(block_m, block_n, head_dim, T.bitwidth // 8, threads),
                        "choose smaller blocks")
    return T, TY, TX


@functools.lru_cache(maxsize=None)
def make_dkdv_kernel(block_m, block_n, head_dim, causal, dtype, threads=None):
    """dK, dV. Launch grid (ceil(Nk / block_n), B*Hk), threads (TX, TY), arguments
    (q, k, v, dout, lse, D, dk, dv, scale, heads, group)."""
    T, TY, TX = _check_config("backward", block_m, block_n, head_dim, dtype, threads)
    stage_rows, p_and_ds = _tile_functions(block_m, block_n, head_dim, causal, dtype, threads)
    BLOCK_M, BLOCK_N, D = block_m, block_n, head_dim
    D_PAD = ceil_div(D, TX) * TX
    D_ROW, S_ROW = D_PAD + 1, BLOCK_N + 1   # padded row lengths (shapes must be constants)
    TD, TJ = D_PAD // TX, BLOCK_N // TY            # this thread's columns of d, rows of K/V
    uBM, uBN, uD, uNT, uTX, uTY = (U(x) for x in (BLOCK_M, BLOCK_N, D, TY * TX, TX, TY))

    @cached_jit
    def dkdv(q, k, v, dout, lse, Dvec, dk, dv, scale, heads, group):
        head = head_index()                # index into B*Hk
        if head >= k.shape[0]:      # a block past the last head (support.head_grid)
            return
        kvh = U(head)
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        n0 = U(cuda.blockIdx.x) * uBN
        nq, nk = U(q.shape[1]), U(k.shape[1])

        Q_t = cuda.shared.array((BLOCK_M, D_ROW), T)
        dO_t = cuda.shared.array((BLOCK_M, D_ROW), T)
        K_t = cuda.shared.array((BLOCK_N, D_ROW), T)
        V_t = cuda.shared.array((BLOCK_N, D_ROW), T)
        P_t = cuda.shared.array((BLOCK_M, S_ROW), T)
        dS_t = cuda.shared.array((BLOCK_M, S_ROW), T)
        lse_t = cuda.shared.array(BLOCK_M, T)
        D_t = cuda.shared.array(BLOCK_M, T)
        dk_acc = cuda.local.array((TJ, TD), T)
        dv_acc = cuda.local.array((TJ, TD), T)
        for a in range(TJ):
            for c in range(TD):
                dk_acc[a, c] = T(0.0)
                dv_acc[a, c] = T(0.0)

        stage_rows(k, kvh, n0, uBN, K_t, tid, T(1.0))
        stage_rows(v, kvh, n0, uBN, V_t, tid, T(1.0))
        # causal: query i sees key j iff i >= j - (nk - nq); skip Q blocks that see none of ours
        m_start = U(0)
        if causal and n0 + nq > nk:
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b = U(head // kv_heads)
        for g in range(group):                         # the query heads sharing this key head
            bh = b * U(heads) + U(head % kv_heads) * U(group) + U(g)
            m0 = m_start
            while m0 < nq:
                stage_rows(q, bh, m0, uBM, Q_t, tid, scale)
                stage_rows(dout, bh, m0, uBM, dO_t, tid, T(1.0))
                r = tid
                while r < uBM:
                    inside = m0 + r < nq
                    lse_t[r] = lse[bh, m0 + r] if inside else T(NEG_INF)
                    D_t[r] = Dvec[bh, m0 + r] if inside else T(0.0)
                    r += uNT
                cuda.syncthreads()
                p_and_ds(Q_t, dO_t, K_t, V_t, lse_t, D_t, P_t, dS_t, m0, n0, nq, nk, ty, tx)
                cuda.syncthreads()
                # dV_j += P^T dO_i ; dK_j += dS^T (scale Q_i) (contraction over the block's rows)
                i = U(0)
                while i < uBM:
                    for a in range(TJ):
                        p = P_t[i, ty + U(a) * uTY]
                        ds = dS_t[i, ty + U(a) * uTY]
                        for c in range(TD):
                            dv_acc[a, c] += p * dO_t[i, tx + U(c) * uTX]
                            dk_acc[a, c] += ds * Q_t[i, tx + U(c) * uTX]
                    i += U(1)
                cuda.syncthreads()
                m0 += uBM

        for a in range(TJ):
            j = n0 + ty + U(a) * uTY
            if j < nk:
                for c in range(TD):
                    col = tx + U(c) * uTX
                    if col < uD:
                        dk[kvh, j, col] = dk_acc[a, c]
                        dv[kvh, j, col] = dv_acc[a, c]

    return dkdv, (TX, TY)


@functools.lru_cache(maxsize=None)
def make_dq_kernel(block_m, block_n, head_dim, causal, dtype, threads=None):
    """dQ. Launch grid (ceil(Nq / block_m), B*H), threads (TX, TY), arguments
    (q, k, v, dout, lse, D, dq, scale, heads, group)."""
    T, TY, TX = _check_config("backward", block_m, block_n, head_dim, dtype, threads)
    stage_rows, p_and_ds = _tile_functions(block_m, block_n, head_dim, causal, dtype, threads)
    BLOCK_M, BLOCK_N, D = block_m, block_n, head_dim
    D_PAD = ceil_div(D, TX) * TX
    D_ROW, S_ROW = D_PAD + 1, BLOCK_N + 1   # padded row lengths (shapes must be constants)
    TD, TM = D_PAD // TX, BLOCK_M // TY
    uBM, uBN, uD, uNT, uTX, uTY = (U(x) for x in (BLOCK_M, BLOCK_N, D, TY * TX, TX, TY))

    @cached_jit
    def dq_kernel(q, k, v, dout, lse, Dvec, dq, scale, heads, group):
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kvh = U(kv_head(head, heads, group))
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        m0 = U(cuda.blockIdx.x) * uBM
        nq, nk = U(q.shape[1]), U(k.shape[1])

        Q_t = cuda.shared.array((BLOCK_M, D_ROW), T)
        dO_t = cuda.shared.array((BLOCK_M, D_ROW), T)
        K_t = cuda.shared.array((BLOCK_N, D_ROW), T)
        V_t = cuda.shared.array((BLOCK_N, D_ROW), T)
        P_t = cuda.shared.array((BLOCK_M, S_ROW), T)
        dS_t = cuda.shared.array((BLOCK_M, S_ROW), T)
        lse_t = cuda.shared.array(BLOCK_M, T)
        D_t = cuda.shared.array(BLOCK_M, T)
        dq_acc = cuda.local.array((TM, TD), T)
        for a in range(TM):
            for c in range(TD):
                dq_acc[a, c] = T(0.0)

        stage_rows(q, bh, m0, uBM, Q_t, tid, scale)
        stage_rows(dout, bh, m0, uBM, dO_t, tid, T(1.0))
        r = tid
        while r < uBM:
            inside = m0 + r < nq
            lse_t[r] = lse[bh, m0 + r] if inside else T(NEG_INF)
            D_t[r] = Dvec[bh, m0 + r] if inside else T(0.0)
            r += uNT
        n_end = nk
        if causal:                                     # no key past the block's last row
            last = m0 + uBM + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        while n0 < n_end:
            stage_rows(k, kvh, n0, uBN, K_t, tid, T(1.0))
            stage_rows(v, kvh, n0, uBN, V_t, tid, T(1.0))
            cuda.syncthreads()
            p_and_ds(Q_t, dO_t, K_t, V_t, lse_t, D_t, P_t, dS_t, m0, n0, nq, nk, ty, tx)
            cuda.syncthreads()
            # dQ_i += dS K_j (contraction over the block's keys)
            j = U(0)
            while j < uBN:
                for a in range(TM):
                    ds = dS_t[ty + U(a) * uTY, j]
                    for c in range(TD):
                        dq_acc[a, c] += ds * K_t[j, tx + U(c) * uTX]
                j += U(1)
            cuda.syncthreads()
            n0 += uBN

        for a in range(TM):
            i = m0 + ty + U(a) * uTY
            if i < nq:
                for c in range(TD):
                    col = tx + U(c) * uTX
                    if col < uD:
                        dq[bh, i, col] = dq_acc[a, c] * scale

    return dq_kernel, (TX, TY)


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                 block_m, block_n, threads=None, stream=0):
    """Launch preprocess, dkdv and dq on `stream` on 3-D device arrays: q, dout, out, dq
    (B*H, Nq, d); k, v, dk, dv (B*Hk, Nk, d); lse (B*H, Nq). Allocates only D (B*H, Nq)
    besides. No atomics: bitwise reproducible."""
    from .. import arrays
    bh, nq, d = q.shape
    bhk, nk, _ = k.shape
    dtype = q.dtype
    T = numba_type(dtype)
    scale = T(scale)
    D = arrays.empty_device((bh, nq), dtype)
    run_preprocess(dout, out, D, dq, stream=stream)
    dkdv, tpb = make_dkdv_kernel(block_m, block_n, d, causal, dtype, threads)
    dkdv[(ceil_div(nk, block_n), *head_grid(bhk)), tpb, stream](q, k, v, dout, lse, D, dk, dv,
                                                                scale, heads, group)
    dq_kernel, tpb = make_dq_kernel(block_m, block_n, d, causal, dtype, threads)
    dq_kernel[(ceil_div(nq, block_m), *head_grid(bh)), tpb, stream](q, k, v, dout, lse, D, dq,
                                                                    scale, heads, group)
