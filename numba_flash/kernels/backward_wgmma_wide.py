"""Backward on Hopper warpgroup products (wgmma, sm_90a) for head dims 65..128: float32,
64 x 64 tiles, two warpgroups (256 threads) per K/V block of 64 rows. The "wgmma" backward runs
it where 64 < d <= 128 (backward_wgmma.run_or_fallback) with its REGISTERED options; the lean
kernel of backward_wgmma.py covers d <= 64 with one warpgroup. Every product is 3xTF32
(wgmma.py), two steps per wait, or (registered: s_chained, w_chained) chained in the tensor
core per CHAIN = 4 steps, S as the registered wide forward chains it. Registered also (since
2026-12-02): rotate (each K/V block starts at another Q block), vector_atomics (dQ by pairs of
columns) and s_permuted with vector_loads (S and dP's contraction permuted within each chained
product, backward_wgmma.chain_column, so that Q's and dO's A fragments load 16 bytes at a time;
K and V staged alike; the forward permutes S the same way).

Why two warpgroups. At d = 128 one warpgroup would hold dK^T and dV^T (128 x 64 each: 64
registers per thread apiece) beside S and dP, more than 255 registers; and K and V alone, as
big and small TF32 parts, are 128 KiB. So the head dim is cut in two halves of 64 and every
tile is the lean kernel's 64 x 64: K and V are staged as four tiles (K's columns 0..63 and
64..127, V's likewise), and warpgroup w (0 or 1) owns the head-dim rows 64 w.. of dK^T, dV^T
and of this Q block's dQ^T (32 registers each).

Per K/V block (rows j), over the query heads sharing its key head and their Q blocks (rows i):
  1. warpgroup 0: S = (scale Q) K^T; warpgroup 1: dP = dO V^T (M = i, K = the whole head dim:
     16 steps over the two column halves; A from global memory into registers, as in lean);
  2. warpgroup 0: P = exp(S - lse_i), written as P^T (big, small) to shared memory; barrier;
  3. warpgroup 1: P read back as big + small (the value dV's product sees; within 2^-22 of P),
     dS = P (dP - D_i), written as dS^T and as dS (i-major);
     both: dV^T[half w] += dO^T[half w] P (M = 64 head-dim rows, K = i, B = P^T); barrier;
  4. both: dK^T[half w] += (scale Q)^T[half w] dS (B = dS^T), dQ^T[half w] = K^T[half w] dS^T
     (A = the K tile of half w read transposed, B = dS), added into dq with atomics.
Two barriers per Q block: P^T is rewritten (step 2 of the next block) only after the barrier
that ends its last reads (step 3), and dS^T, dS (step 3 of the next block) only after the
next block's first barrier, which every warpgroup reaches after its step 4.

Shared memory: seven 64 x 64 tiles, each big and small (K's two halves, V's, P^T, dS^T, dS):
224 KiB, one block (8 warps) per SM: two warps per scheduler, as lean's two blocks of 4.

Measured on an H200 (2026-12-01, tests/ab_wgmma.py time --d 128; notebooks/data/wgmma-wide-
h200-2026-12-01.txt and wgmma-ahead-h200-2026-12-01.txt), backward TFLOP/s at d = 128, N = 1k /
2k / 4k: 24.6-25.4 / 29.7-30.7 / 32.4-32.8, with `ahead` (the registered choice) 25.9-27.4 /
31.7-32.2 / 34.1-34.6, against fa2-atomic's 20.4-20.7 / 23.9-24.8 / 26.3-26.6 in the same
processes. 242 registers (252 with ahead), no local memory. Within the tolerance rule on every
GPU case with 64 < d <= 128 and at N = 2k, after the fa2 forward and after the wide wgmma
forward (tests/test_backward_wgmma.py, test_forward_wgmma.py), in `numba-flash verify`;
memcheck 0 errors and racecheck 0 hazards (tests/sanitize.py wgmma; with ahead, tests/ab_wgmma.py
check). Chained (2026-12-02, tests/ab_wide.py): 25.6-26.7 / 30.7-31.0 / 35.0-35.3 / 33.6-33.9
TFLOP/s at N = 1k-8k against 26.3-26.9 / 30.6-30.7 / 33.8-34.2 / 34.0-34.1 with steps (a tie;
254 registers), registered because S must be chained as the faster chained forward forms it;
every check within tolerance, memcheck and racecheck clean. Nsight Compute (N = 2k): issue
slots 32 % busy, 0.39 of 2 warps per scheduler eligible: latency-bound (perf notes, version 16).
"""

import functools

import numpy as np
from numba import cuda, float32

from .backward_fa2 import _recompute_p
from .backward_wgmma import (BLOCK, CHAIN_A, D_PAD, DQ_ARG, REGS, STEP_FLOATS, STEPS, TILE, add,
                             add_dq, add_dq_pairs, add_dq_pairs_by_element, add_in_turn, clear,
                             make_accumulate_w, make_accumulate_w_chained, make_chain_fragments,
                             make_global_fragment, make_stage, row_stats, split_chain,
                             split_fragment, store_dkdv, transposed_fragment,
                             transposed_fragment_chain_paired, transposed_fragment_paired)
from .common import (DYNAMIC_SHARED_MEMORY_BYTES, SIMULATOR, U, DynamicSharedKernel,
                     kernel_jit)
from .fa2_tiles import ALIGN
from .mma import split_tf32
from .vector_io import AlignedDispatch
from .wgmma import CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, products

D_WIDE = 2 * D_PAD          # the head dim, zero-padded: two halves of 64
THREADS = 2 * WARPGROUP
HALF = 2 * TILE             # floats of one staged tile, big then small
# float offsets: K's halves, V's halves, then P^T, dS^T (rows j, K-major over i), dS (rows i)
K_T, V_T, PT_T, DST_T, DS_T = 0, 2 * HALF, 4 * HALF, 5 * HALF, 6 * HALF
SCRATCH_AT = 7 * HALF       # the simulator's fragment exchange, one SCRATCH per warpgroup
NBYTES = 4 * (7 * HALF + (2 * SCRATCH if SIMULATOR else 0))
assert 7 * HALF * 4 <= DYNAMIC_SHARED_MEMORY_BYTES


def applies(head_dim, dtype, block_m=BLOCK, block_n=BLOCK):
    """True when this kernel can run a case here: float32, 64 < head dim <= 128, 64 x 64 tiles,
    and an sm_90 GPU or the simulator (as backward_wgmma.applies)."""
    if np.dtype(dtype) != np.float32 or not D_PAD < head_dim <= D_WIDE:
        return False
    if (block_m, block_n) != (BLOCK, BLOCK):
        return False
    return SIMULATOR or tuple(cuda.get_current_device().compute_capability) == (9, 0)


def check(head_dim, dtype, block_m=BLOCK, block_n=BLOCK):
    """ValueError unless float32, head dim 1..128 and 64 x 64 tiles (d <= 64 runs here too,
    half the work on zeros: for tests; the registry sends it to the lean kernel)."""
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"the wide wgmma backward is float32 only, got {np.dtype(dtype)}")
    if not 1 <= head_dim <= D_WIDE:
        raise ValueError(f"the wide wgmma backward needs head_dim <= {D_WIDE}, got {head_dim}")
    if (block_m, block_n) != (BLOCK, BLOCK):
        raise ValueError(f"the wide wgmma backward has 64 x 64 tiles only, got "
                         f"block_m={block_m}, block_n={block_n}")


# what the registered "wgmma" backward runs (backward_wgmma.run_or_fallback): fragments ahead,
# and S chained as the registered forward chains it (forward_wgmma_wide.REGISTERED; dP and the
# accumulating products chained too: 0.95-1.04x the steps from zero, H200 2026-12-02), the Q
# blocks taken in rotated order (a head's K/V blocks had all read the same Q and dO rows and
# added into the same dQ rows at once: 1.15-1.19x at N = 1k-8k in one A/B, H200 2026-12-02
# 06:14 UTC, 1.11-1.17x with the dQ atomics left out; 1.02-1.09x in a second, 06:37, against
# the Q loop in its new form; tests/ab_backward_parts.py), dQ by pairs of columns (1.02-1.04x),
# S and dP's contraction permuted for 16-byte loads of Q and dO (1.04-1.20x, 07:14 UTC,
# tests/ab_wide.py time rotated permuted; as forward_wgmma_wide.REGISTERED forms S)
REGISTERED = dict(ahead=True, s_chained=True, w_chained=True, rotate=True, vector_atomics=True,
                  s_permuted=True, vector_loads=True)


@functools.lru_cache(maxsize=None)
def make_wide_kernel(causal, ahead=False, s_chained=False, w_chained=False, rotate=False,
                     dq_atomics=True, vector_atomics=False, s_permuted=False,
                     vector_loads=False):
    """The kernel: grid (ceil(Nk / 64), B*Hk), 256 threads, arguments (q, k, v, dout, lse, D,
    dk, dv, dq, scale, heads, group) on (B*H, N, d) float32 arrays, d <= 128, dq holding zeros
    (dQ is added with atomics). ahead: the A fragments from global memory (S, dP, dV^T, dK^T)
    loaded one pair of steps ahead, so that their latency overlaps the tensor core's (8 more
    registers live; the same values and sums). s_chained: S and dP as four products of CHAIN
    steps, each chained in the tensor core (4 waits instead of 8), S exactly as
    forward_wgmma_wide.make_wide_kernel(s_chained=True) forms it. w_chained: dV^T, dK^T and
    dQ^T each as two such products (2 waits instead of 4). rotate: K/V block x takes its Q
    blocks starting at the x-th (mod their number), so that the blocks of a head, which run at
    once, add into different dQ rows instead of all into the same ones (the same sums in another
    order). dq_atomics=False: dQ is not added into dq (wrong dq; to time what the atomics
    cost). vector_atomics: backward_wgmma.make_lean_kernel's (dQ by pairs of columns).
    s_permuted (with s_chained): S and dP's contraction (the head dim)
    permuted within each chained product (backward_wgmma.chain_column; K and V staged so), so
    that a thread's A entries are runs of 8 contiguous columns of Q or dO, as
    forward_wgmma_wide.make_wide_kernel(s_permuted=True) forms S; vector_loads (with
    s_permuted): those runs read 16 bytes at a time (q and dout 16-byte aligned, d % 4 == 0:
    run_backward's AlignedDispatch)."""
    if s_permuted and not s_chained:
        raise ValueError("s_permuted is written for s_chained")
    if vector_loads and not s_permuted:
        raise ValueError("vector_loads needs s_permuted")
    AHEAD, S_CHAINED, W_CHAINED, ROTATE, DQ_ATOMICS = (ahead, s_chained, w_chained, rotate,
                                                       dq_atomics)
    dq_fragment = transposed_fragment_paired if vector_atomics else transposed_fragment
    add_dq_acc = add_dq_pairs if vector_atomics else add_dq
    if s_permuted:      # K's tile columns permuted: dQ^T's A rows read where they are, paired
        dq_fragment = transposed_fragment_chain_paired
        if not vector_atomics:
            add_dq_acc = add_dq_pairs_by_element
    prod = products(BLOCK, D_PAD, D_PAD)
    step2_regs, chained_regs = prod["step2_3xtf32_regs"], prod["chained_3xtf32_regs"]
    chain_elements = make_chain_fragments(False, s_permuted, vector_loads)
    recompute_p = _recompute_p(float32, causal)
    fragment = make_global_fragment(False)
    elements = make_global_fragment(False, split=False)
    stage, _ = make_stage(False, per_warpgroup=True, chain_permuted=s_permuted)
    uBM = U(BLOCK)

    # acc += X^T W with X^T's rows this warpgroup's half (rows = warp + 4 w): lean's helper
    accumulate_w = make_accumulate_w(True, AHEAD)
    accumulate_w_chained = make_accumulate_w_chained(AHEAD)

    @kernel_jit(THREADS)
    def dkdv_wgmma_wide(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        kvh = U(cuda.blockIdx.y)
        tid = U(cuda.threadIdx.x)
        wg = tid // U(WARPGROUP)                    # 0: S and P; 1: dP and dS
        warp, lane = (tid // U(32)) % U(4), tid % U(32)
        rows = warp + U(4) * wg                     # the warp's head-dim rows: 16 rows..
        scratch = U(SCRATCH_AT) + wg * U(SCRATCH)
        n0 = U(cuda.blockIdx.x) * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        acc = cuda.local.array(REGS, float32)        # S, then P (wg 0); dP, then dS (wg 1)
        dk_acc = cuda.local.array(REGS, float32)     # dK^T, head-dim rows of half wg
        dv_acc = cuda.local.array(REGS, float32)     # dV^T, the same rows
        dq_acc = cuda.local.array(REGS, float32)     # dQ^T of this Q block, the same rows
        x = cuda.local.array(CHAIN_A, float32)       # s_chained: A fragments, unsplit
        a_big = cuda.local.array(CHAIN_A, float32)   # and split
        a_small = cuda.local.array(CHAIN_A, float32)
        clear(dk_acc)
        clear(dv_acc)
        # warpgroup 0 stages K's two column halves (S's B), warpgroup 1 V's (dP's B)
        kv_src = k if wg == U(0) else v
        b_at = U(K_T) + wg * U(2 * HALF)
        stage(sm, b_at, kv_src, kvh, n0, U(0), d, float32(1.0))
        stage(sm, b_at + U(HALF), kv_src, kvh, n0, U(D_PAD), d, float32(1.0))
        a_src = q if wg == U(0) else dout            # S's A: scale Q; dP's: dO
        a_mult = scale if wg == U(0) else float32(1.0)
        m_start = U(0)
        if causal and n0 + nq > nk:     # query i sees key j iff j + nq <= i + nk
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b_idx = U(cuda.blockIdx.y // kv_heads)
        # the thread's accumulator entries (wgmma.position): rows row, row + 8, columns col_t,
        # col_t + 1 of each 8-column group; P^T / dS^T at core_offset(col_t, row, 64) and dS
        # at core_offset(row, col_t, 64) (the lean kernel's bases)
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        pt_base = (warp * U(4) + g4 // U(4)) * U(32) + t4 * U(8) + g4 % U(4)
        ds_base = warp * U(1024) + (t4 // U(2)) * U(32) + g4 * U(4) + (t4 % U(2)) * U(2)
        k_half = U(K_T) + wg * U(HALF)               # dQ^T's A: K^T of this half
        fence_proxy_async()
        cuda.syncthreads()
        for g in range(group):
            bh = b_idx * U(heads) + U(cuda.blockIdx.y % kv_heads) * U(group) + U(g)
            # the Q blocks m_start.. in turn, from `first` round to the one before it
            first = m_start
            if ROTATE:
                first += U(cuda.blockIdx.x) % ((nq - m_start + uBM - U(1)) // uBM) * uBM
            m0 = first
            while True:
                i0, i1 = m0 + row, m0 + row + U(8)
                lse0, lse1, D0, D1 = row_stats(lse, Dvec, bh, i0, i1, nq)
                # 1. S (wg 0) or dP (wg 1): 16 steps, 8 per column half, two per wait, or
                # (S_CHAINED) four chained products of 4 steps (the loop below then runs none)
                clear(acc)
                if S_CHAINED:   # four chained products of CHAIN steps, 2 per column half
                    if AHEAD:
                        chain_elements(x, a_src, bh, m0, U(0), a_mult, d, warp, lane)
                    for g in range(2 * STEPS // CHAIN):
                        if AHEAD:   # past the last: zeros (columns >= d), nothing loaded
                            split_chain(a_big, a_small, x)
                            chain_elements(x, a_src, bh, m0, U(CHAIN * (g + 1)), a_mult, d,
                                           warp, lane)
                        else:
                            chain_elements(x, a_src, bh, m0, U(CHAIN * g), a_mult, d, warp,
                                           lane)
                            split_chain(a_big, a_small, x)
                        at = b_at + U(HALF) * U(CHAIN * g // STEPS)
                        add(acc, chained_regs(sm, a_big, a_small, at, at + U(TILE),
                                              (CHAIN * g) % STEPS, scratch))
                if AHEAD and not S_CHAINED:
                    x1 = elements(a_src, bh, m0, 0, a_mult, d, warp, lane)
                    x2 = elements(a_src, bh, m0, 1, a_mult, d, warp, lane)
                for s2 in range(0 if S_CHAINED else STEPS):
                    s = 2 * s2
                    at = b_at + U(HALF) * U(s2 // (STEPS // 2))
                    sl = s % STEPS
                    if AHEAD:   # past the last step: zeros (columns >= d), nothing loaded
                        f_big, f_small = split_fragment(x1)
                        f2_big, f2_small = split_fragment(x2)
                        x1 = elements(a_src, bh, m0, s + 2, a_mult, d, warp, lane)
                        x2 = elements(a_src, bh, m0, s + 3, a_mult, d, warp, lane)
                    else:
                        f_big, f_small = fragment(a_src, bh, m0, s, a_mult, d, warp, lane)
                        f2_big, f2_small = fragment(a_src, bh, m0, s + 1, a_mult, d, warp,
                                                    lane)
                    add_in_turn(acc, step2_regs(sm, f_big, f_small, at, at + U(TILE), f2_big,
                                                f2_small, at + U(STEP_FLOATS),
                                                at + U(TILE + STEP_FLOATS), sl, scratch))
                # 2. P = exp(S - lse) and P^T into shared memory
                if wg == U(0):
                    for nt in range(REGS // 4):
                        for e in range(4):
                            j = 4 * nt + e
                            hi, b = e // 2, e % 2
                            il = row + U(8 * hi)
                            jl = U(8 * nt + b) + col_t
                            p = recompute_p(acc[j], lse1 if hi else lse0, m0 + il, n0 + jl,
                                            nq, nk)
                            off = pt_base + U(512 * nt + 64 * hi + 4 * b)
                            pb, ps = split_tf32(p)
                            sm[U(PT_T) + off] = pb
                            sm[U(PT_T + TILE) + off] = ps
                    fence_proxy_async()
                cuda.syncthreads()
                # 3. dS = P (dP - D) from P^T's parts (wg 1), then both: dV^T += dO^T P
                if wg == U(1):
                    for nt in range(REGS // 4):
                        for e in range(4):
                            j = 4 * nt + e
                            hi, b = e // 2, e % 2
                            off = pt_base + U(512 * nt + 64 * hi + 4 * b)
                            p = sm[U(PT_T) + off] + sm[U(PT_T + TILE) + off]
                            db, dsm = split_tf32(p * (acc[j] - (D1 if hi else D0)))
                            sm[U(DST_T) + off] = db
                            sm[U(DST_T + TILE) + off] = dsm
                            off_ds = ds_base + U(512 * hi + 64 * nt + b)
                            sm[U(DS_T) + off_ds] = db
                            sm[U(DS_T + TILE) + off_ds] = dsm
                    fence_proxy_async()
                if W_CHAINED:
                    accumulate_w_chained(sm, dv_acc, U(PT_T), dout, bh, m0, float32(1.0), d,
                                         rows, lane, scratch, x, a_big, a_small)
                else:
                    accumulate_w(sm, dv_acc, U(PT_T), dout, bh, m0, float32(1.0), d, rows,
                                 lane, scratch)
                cuda.syncthreads()
                # 4. dK^T += (scale Q)^T dS and dQ^T = K^T dS^T, each over this half's rows
                clear(dq_acc)
                if W_CHAINED:
                    accumulate_w_chained(sm, dk_acc, U(DST_T), q, bh, m0, scale, d, rows, lane,
                                         scratch, x, a_big, a_small)
                    for g in range(STEPS // CHAIN):
                        for s in range(CHAIN):
                            f_big, f_small = dq_fragment(sm, k_half, CHAIN * g + s, warp,
                                                         lane)
                            for e in range(4):
                                a_big[4 * s + e] = f_big[e]
                                a_small[4 * s + e] = f_small[e]
                        add(dq_acc, chained_regs(sm, a_big, a_small, U(DS_T), U(DS_T + TILE),
                                                 CHAIN * g, scratch))
                else:
                    accumulate_w(sm, dk_acc, U(DST_T), q, bh, m0, scale, d, rows, lane,
                                 scratch)
                for s2 in range(0 if W_CHAINED else STEPS // 2):
                    s = 2 * s2
                    f_big, f_small = dq_fragment(sm, k_half, s, warp, lane)
                    f2_big, f2_small = dq_fragment(sm, k_half, s + 1, warp, lane)
                    add_in_turn(dq_acc, step2_regs(sm, f_big, f_small, U(DS_T),
                                                   U(DS_T + TILE), f2_big, f2_small,
                                                   U(DS_T + STEP_FLOATS),
                                                   U(DS_T + TILE + STEP_FLOATS), s, scratch))
                if DQ_ATOMICS:
                    add_dq_acc(dq, bh, m0, nq, d, dq_acc, scale, rows, lane)
                m0 += uBM
                if m0 >= nq:
                    m0 = m_start
                if m0 == first:
                    break

        store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, rows, lane)

    return DynamicSharedKernel(dkdv_wgmma_wide, NBYTES), THREADS


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                 block_m=BLOCK, block_n=BLOCK, ahead=False, s_chained=False,
                 w_chained=False, rotate=False, dq_atomics=True, vector_atomics=False,
                 s_permuted=False, vector_loads=False):
    """Launch the preprocess kernel (D = rowsum(dO * O), dq zeroed) and the wide kernel on 3-D
    float32 device arrays (backward.run_backward's contract); ValueError where `check` does
    not allow the case. dQ comes from atomics: not bitwise reproducible. ahead, s_chained,
    w_chained, rotate, dq_atomics, s_permuted: make_wide_kernel's; vector_atomics (and
    vector_loads): make_wide_kernel's where dq (and q, dout) are 16-byte aligned (their data and
    rows: d % 4 == 0), scalar atomics (and loads) otherwise."""
    from .backward_wgmma import launch_with_preprocess
    check(q.shape[2], q.dtype, block_m, block_n)
    options = (bool(causal), bool(ahead), bool(s_chained), bool(w_chained), bool(rotate),
               bool(dq_atomics))
    if s_permuted:      # the scalar variant must permute S alike (its dQ pairs: by element)
        kernel, threads = make_wide_kernel(*options, False, True, False)
        if vector_atomics or vector_loads:
            vector = make_wide_kernel(*options, bool(vector_atomics), True, bool(vector_loads))[0]
            kernel = AlignedDispatch(vector, kernel, (0, 3, DQ_ARG))
    else:
        kernel, threads = make_wide_kernel(*options)
        if vector_atomics:
            kernel = AlignedDispatch(make_wide_kernel(*options, True)[0], kernel, (DQ_ARG,))
    launch_with_preprocess(kernel, threads, dout, q, k, v, lse, out, dq, dk, dv, scale=scale,
                           heads=heads, group=group)
