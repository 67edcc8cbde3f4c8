"""The Hopper dQ pass without atomics for 64 < d <= 128 (deterministic=True): one block per Q
block, over the K/V blocks it sees, in order; dQ summed in the block's registers and stored
once, so that dq is bitwise the same from run to run. It follows sm90.backward's wide dK/dV
kernel run with dq_out=False. (At d <= 64 the lean dK/dV kernel adds dQ in a fixed order itself,
sm90.backward's ordered=True: no pass; this file's lean kernels went with that, 2026-12-07.)

Per K/V block (rows j): S = (scale Q) K^T formed by the wide forward's own functions on the same
staged tiles (sm90.operands.make_wide_s: P is the forward's bit for bit), dP = dO V^T,
P = exp(S - lse), dS = P (dP - D), dQ += dS K with dS straight from the accumulator registers
as wgmma's A operand against K^T staged with each 8-key group permuted (as the forward's P V
against V^T), chained per CHAIN = 4 steps; at the end dq = scale dQ. 256 threads, 128 query
rows (64 per warpgroup, as the wide forward); K's two halves, V's, K^T's: 192 KiB (225 with
the next block's K as stored, the vector variant)."""

import functools

import numpy as np
from numba import cuda, float32

from ..support import (ALIGN, SIMULATOR, U, Launcher, ceil_div, head_grid, head_index,
                       inlined_device_function, kernel_jit, kv_head, make_recompute_p)
from ..vector_io import AlignedDispatch
from .forward import BLOCK_M_WIDE, STAGE_LOADS, copies_wait_all, split_ds_chain
from .operands import (BLOCK, CHAIN_A, D_PAD, HALF, RAW_FLOATS, REGS, TILE, add, clear,
                       make_fetch_raw, make_stage, make_stage_raw, make_wide_s, row_stats)
from .softmax import causal_key_limits, exp_where
from .wgmma import CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, opaque_zero, products

# wide: K's halves, V's halves (both chain-permuted), K^T's halves (permuted)
WIDE_K_T, WIDE_V_T, WIDE_KT_T = 0, 2 * HALF, 4 * HALF
WIDE_SCRATCH_AT = 6 * HALF
WIDE_NBYTES = 4 * (6 * HALF + (2 * SCRATCH if SIMULATOR else 0))
# then, with vector loads, the next block's K as stored (64 x 128, operands.make_fetch_raw):
# 225 KiB, under the 227 a block may take
WIDE_RAW_K_AT = 6 * HALF + (2 * SCRATCH if SIMULATOR else 0)
WIDE_NBYTES_RAW = 4 * (WIDE_RAW_K_AT + RAW_FLOATS)
DOUT_ARG = 3                # dout's position in the arguments (q's is 0)


@functools.lru_cache(maxsize=None)
def make_ds(causal):
    """ds_in_place(s_acc, dp_acc, lse0, lse1, D0, D1, i0, i1, n0, col_t, nq, nk): S's
    accumulator (rows i0, i1, keys n0 + col_t.., wgmma.position) becomes dS = P (dP - D) with
    P = exp(S - lse) (masked: support.make_recompute_p; causal: softmax.causal_key_limits,
    one bound a row)."""
    recompute_p = make_recompute_p(float32, causal)

    @inlined_device_function
    def ds_in_place(s_acc, dp_acc, lse0, lse1, D0, D1, i0, i1, n0, col_t, nq, nk):
        if causal:
            lim0, lim1 = causal_key_limits(lse0, lse1, i0, i1, n0 + col_t, nq, nk)
        for j in range(REGS):
            hi = (j % 4) // 2
            if causal:
                p = exp_where(s_acc[j], lse1 if hi else lse0, U(8 * (j // 4) + j % 2),
                              lim1 if hi else lim0)
            else:
                # bounds in 32 bits (Numba widens the sums to 64): deterministic fwd+bwd
                # 1.005-1.015x unmasked (H100, 2026-12-07 16:04, docs/experiments.md row 55)
                key = U(n0 + U(8 * (j // 4) + j % 2) + col_t)
                p = recompute_p(s_acc[j], lse1 if hi else lse0, U(i1 if hi else i0), key, nq,
                                nk)
            s_acc[j] = p * (dp_acc[j] - (D1 if hi else D0))
    return ds_in_place


@functools.lru_cache(maxsize=None)
def make_wide_dq_kernel(causal, vector_loads, half=False):
    """The dQ kernel: grid (ceil(Nq / 128), B*H), 256 threads, arguments (q, k, v, dout, lse,
    D, dq, scale, heads, group) on (B*H, N, d) float32 arrays, 64 < d <= 128; writes dq.
    vector_loads: q's and dout's runs of 8 read 16 bytes at a time, and
    K a block ahead: the next block's K copied as stored into a raw block by cp.async once
    this block's tiles are staged, K's and K^T's halves split from there (q, k, dout 16-byte
    aligned, d % 4 == 0: `launcher` picks); else K's halves and K^T's are staged from global
    memory at each block's start. Warpgroup g stages column half g of K, V and K^T. half: k
    and v hold half values (exact in TF32): S, dP and dS K skip the products of their zero
    small parts (wgmma.products' exact="b"), as the forward's S does. K a block ahead:
    deterministic fwd+bwd 1.003-1.033x at d = 128 (H100, 2026-12-07 19:13, docs/experiments.md
    row 58)."""
    RAW_K = vector_loads
    stage = make_stage(False, per_warpgroup=True, chain_permuted=True)   # K, V
    # (column_once: ptxas spills 56 / 40 bytes unmasked / causal, 192 / 212 without it)
    fetch_raw = make_fetch_raw(2 * WARPGROUP, column_once=True)
    stage_raw = make_stage_raw(False, chain_permuted=True, loads=STAGE_LOADS)   # K
    stage_raw_kt = make_stage_raw(True, permuted=True, loads=STAGE_LOADS)       # K^T
    stage_kt = make_stage(True, permuted=True, per_warpgroup=True)       # K^T
    s_chain = make_wide_s(WIDE_K_T, vector_loads, half)     # S: the wide forward's
    dp_chain = make_wide_s(WIDE_V_T, vector_loads, half)    # dP = dO V^T alike
    chained_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["chained_3xtf32_regs"]
    ds_in_place = make_ds(causal)
    uBN = U(BLOCK)

    @kernel_jit(2 * WARPGROUP)
    def dq_wgmma_wide(q, k, v, dout, lse, Dvec, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tid = U(cuda.threadIdx.x)
        wg = tid // U(WARPGROUP)
        warp, lane = (tid // U(32)) % U(4), tid % U(32)
        scratch = U(WIDE_SCRATCH_AT) + wg * U(SCRATCH)
        block0 = U(cuda.blockIdx.x) * U(BLOCK_M_WIDE)
        row0 = block0 + wg * U(BLOCK)               # this warpgroup's 64 query rows
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        i0, i1 = row0 + row, row0 + row + U(8)
        s_acc = cuda.local.array(REGS, float32)          # S, then dS
        dp_acc = cuda.local.array(REGS, float32)         # dP
        dq0 = cuda.local.array(REGS, float32)            # dQ / scale, columns 0..63
        dq1 = cuda.local.array(REGS, float32)            # and 64..127
        a_big = cuda.local.array(CHAIN_A, float32)
        a_small = cuda.local.array(CHAIN_A, float32)
        x = cuda.local.array(CHAIN_A, float32)
        lse0, lse1, D0, D1 = row_stats(lse, Dvec, bh, i0, i1, nq)
        clear(dq0)
        clear(dq1)
        col0 = wg * U(D_PAD)                        # this warpgroup's column half
        n_end = nk
        if causal:
            last = block0 + U(BLOCK_M_WIDE) + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        if RAW_K and n0 < n_end:
            fetch_raw(sm, U(WIDE_RAW_K_AT), k, kv, n0, nk, d)
        while n0 < n_end:
            if RAW_K:
                copies_wait_all()                   # this thread's copies of this block's K
            cuda.syncthreads()
            if RAW_K:       # warpgroup g: column half g of K, K^T (from the raw block), V
                stage_raw(sm, U(WIDE_K_T) + wg * U(HALF), U(WIDE_RAW_K_AT), col0)
                stage_raw_kt(sm, U(WIDE_KT_T) + wg * U(HALF), U(WIDE_RAW_K_AT), col0)
                stage(sm, U(WIDE_V_T) + wg * U(HALF), v, kv, n0, col0, d, float32(1.0))
            else:           # warpgroup 0: K's halves, 1: V's; each one half of K^T
                kv_src = k if wg == U(0) else v
                at = U(WIDE_K_T) + wg * U(2 * HALF)
                stage(sm, at, kv_src, kv, n0, U(0), d, float32(1.0))
                stage(sm, at + U(HALF), kv_src, kv, n0, U(D_PAD), d, float32(1.0))
                stage_kt(sm, U(WIDE_KT_T) + wg * U(HALF), k, kv, n0, col0, d, float32(1.0))
            fence_proxy_async()
            cuda.syncthreads()
            n1 = n0 + uBN
            if RAW_K and n1 < n_end:    # the raw block is read: the next block's K into it
                fetch_raw(sm, U(WIDE_RAW_K_AT), k, kv, n1, nk, d)
            q_row0 = row0 + opaque_zero()           # (re-read from L1 / L2: forward.py)
            clear(s_acc)
            s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 0, x, a_big, a_small,
                    scratch)
            s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 1, x, a_big, a_small,
                    scratch)
            s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 2, x, a_big, a_small,
                    scratch)
            s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 3, x, a_big, a_small,
                    scratch)
            clear(dp_acc)
            one = float32(1.0)
            dp_chain(sm, dp_acc, dout, bh, q_row0, one, d, warp, lane, 0, x, a_big, a_small,
                     scratch)
            dp_chain(sm, dp_acc, dout, bh, q_row0, one, d, warp, lane, 1, x, a_big, a_small,
                     scratch)
            dp_chain(sm, dp_acc, dout, bh, q_row0, one, d, warp, lane, 2, x, a_big, a_small,
                     scratch)
            dp_chain(sm, dp_acc, dout, bh, q_row0, one, d, warp, lane, 3, x, a_big, a_small,
                     scratch)
            ds_in_place(s_acc, dp_acc, lse0, lse1, D0, D1, i0, i1, n0, col_t, nq, nk)
            # dQ += dS K against K^T's halves (written out: a loop holding a wgmma is not
            # unrolled, and dq0 / dq1 picked by its index would live in local memory)
            split_ds_chain(a_big, a_small, s_acc, 0)
            add(dq0, chained_regs(sm, a_big, a_small, U(WIDE_KT_T), U(WIDE_KT_T + TILE), 0,
                                  scratch))
            add(dq1, chained_regs(sm, a_big, a_small, U(WIDE_KT_T + HALF),
                                  U(WIDE_KT_T + HALF + TILE), 0, scratch))
            split_ds_chain(a_big, a_small, s_acc, CHAIN)
            add(dq0, chained_regs(sm, a_big, a_small, U(WIDE_KT_T), U(WIDE_KT_T + TILE), CHAIN,
                                  scratch))
            add(dq1, chained_regs(sm, a_big, a_small, U(WIDE_KT_T + HALF),
                                  U(WIDE_KT_T + HALF + TILE), CHAIN, scratch))
            n0 = n1
        for j in range(REGS):
            i = i1 if (j % 4) // 2 else i0
            c = U(8 * (j // 4) + j % 2) + col_t
            if i < nq:
                if c < d:
                    dq[bh, i, c] = dq0[j] * scale
                if c + U(D_PAD) < d:
                    dq[bh, i, c + U(D_PAD)] = dq1[j] * scale

    return Launcher(dq_wgmma_wide, WIDE_NBYTES_RAW if RAW_K else WIDE_NBYTES), 2 * WARPGROUP


@functools.lru_cache(maxsize=None)
def launcher(causal, half=False):
    """(kernel, threads, block_m): the wide dQ kernel, its vector-load variant (and K a block
    ahead) where q, k and dout are 16-byte aligned (AlignedDispatch; the same sums)."""
    vector, threads = make_wide_dq_kernel(causal, True, half)
    scalar = make_wide_dq_kernel(causal, False, half)[0]
    return AlignedDispatch(vector, scalar, (0, 1, DOUT_ARG)), threads, BLOCK_M_WIDE


def run_dq(dout, q, k, v, lse, D, dq, *, scale, heads, group, causal, stream=0, half=False):
    """dq from the forward's lse and D = rowsum(dO * O), on 3-D float32 device arrays, on
    `stream`; half: as sm90.backward.run_backward's. 64 < d <= 128 (a ValueError at d <= 64,
    where run_backward adds dQ in the lean dK/dV kernel)."""
    bh, nq, d = q.shape
    if d <= D_PAD:
        raise ValueError(f"sm90.dq.run_dq: d = {d}; at d <= {D_PAD} the lean dK/dV kernel "
                         "adds dQ itself (sm90.backward, ordered=True)")
    kernel, threads, block_m = launcher(bool(causal), bool(half))
    kernel[(ceil_div(nq, block_m), *head_grid(bh)), threads, stream](
        q, k, v, dout, lse, D, dq, np.float32(scale), heads, group)
