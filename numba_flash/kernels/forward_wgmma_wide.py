"""Forward on Hopper warpgroup products (wgmma, sm_90a) for head dims 65..128: float32, two
warpgroups (256 threads) per block of 128 query rows, each warpgroup its own 64 rows against the
block's shared K and V tiles of 64 keys. The "wgmma" forward runs it where 64 < d <= 128
(forward_wgmma.make_forward_kernel) with its REGISTERED options: both products 3xTF32, chained
in the tensor core per CHAIN = 4 steps (make_wide_kernel's s_chained, pv_chained; one step per
wait without them).

S is formed exactly as backward_wgmma_wide forms it, so that the "wgmma" backward recomputes P
bit for bit (the reason forward_wgmma gives): A = scale Q as register fragments read from global
memory and split by the same function (backward_wgmma.make_global_fragment), B = K staged as
its two 64-column halves by the same `stage`; with s_chained the same four chained products of
4 steps added in order (the registered pair), without it the same 16 steps from zero added in
step order (the backward waits once per two steps, this kernel once per step: the same sums).
Registered since 2026-12-02 07:14 UTC: s_permuted with vector_loads, the contraction permuted
within each chained product (backward_wgmma.chain_column, K staged alike) so that a thread's
scale Q entries are runs of 8 contiguous columns read 16 bytes at a time (1.11-1.16x the
unpermuted chained kernel, tests/ab_wide.py time rotated permuted), as the backward forms S.

Per warpgroup (rows i), over K/V blocks (rows j), the online softmax of forward_wgmma:
  S = (scale Q) K^T,  m_new = max(m, rowmax S),  P = exp(S - m_new),
  l = l exp(m - m_new) + rowsum P,  O = O exp(m - m_new) + P V,
with O as two 64 x 64 halves (O's head-dim columns 0..63 and 64..127; 32 registers each) and
P V as two m64n64 products per step (one wait each), A = P straight from S's accumulator registers
(forward_wgmma's permuted V^T), B = V^T's two halves. Q is not staged: K and V^T, big and small
parts, fill 128 KiB; Q's 64 KiB per warpgroup would not fit, and its 32 KiB of float32 rows
per warpgroup are re-read from L1 / L2 per K/V block.

Shared memory: 128 KiB, one block (8 warps) per SM; 208 registers (causal 205); registered
(chained) 255, with 16 bytes of spills under causal.

Measured on an H200 (2026-12-01, numba-flash bench --d 128; notebooks/data/bench-h200-2026-12-01-
wgmma-d128.json): 30.2 / 31.4 / 34.6 / 35.4 TFLOP/s at N = 1k / 2k / 4k / 8k, the fa2 forward
29.3 / 30.0 / 31.8 / 32.9 and torch's efficient backend 44.0-46.0 in the same process; within
the tolerance rule on every GPU case with 64 < d <= 128 (tests/test_forward_wgmma.py), in
`numba-flash verify` and the gpu-profile properties; memcheck and racecheck clean
(tests/sanitize.py wgmma). Its S steps go one per wait (16 waits, and 16 for P V's halves, per
K/V block, against 8 in all at d = 64): what pairing would save, ptxas spilled. Chained per
4 steps (2026-12-02, tests/ab_wide.py; notebooks/data/wgmma-chained-h200-2026-12-02.txt): 4 + 4
waits per K/V block, 1.05-1.16x the steps (29.4-31.0 / 35.1-35.5 / 37.3-37.5 / 38.6-38.9 TFLOP/s
at N = 1k-8k in the A/B; bench 31.8 / 33.5 / 36.8 / 39.2), every check within tolerance,
memcheck and racecheck clean.
"""

import functools

import numpy as np
from numba import cuda, float32

from .backward_wgmma import (BLOCK, CHAIN_A, D_PAD, REGS, STEP_FLOATS, STEPS, TILE, add, add2,
                             add_in_turn, clear, make_chain_fragments, make_global_fragment,
                             make_stage, simulator_launch, split_chain)
from .backward_wgmma_wide import D_WIDE, HALF, THREADS
from .common import (NEG_INF, SIMULATOR, U, DynamicSharedKernel, inlined_device_function,
                     kernel_jit, kv_head)
from .fa2_tiles import ALIGN
from .forward_wgmma import (STAGE_LOADS, finish_rows, first_block, make_online_softmax,
                            split_p_chain)
from .mma import split_tf32
from .vector_io import AlignedDispatch
from .wgmma import CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, opaque_zero, products

BLOCK_M = 2 * BLOCK          # query rows per block: 64 per warpgroup
# float offsets: K's two column halves, then V^T's (rows: the head dim), each big then small
K_T, VT_T = 0, 2 * HALF
SCRATCH_AT = 4 * HALF        # the simulator's exchanges, one SCRATCH per warpgroup
NBYTES = 4 * (4 * HALF + (2 * SCRATCH if SIMULATOR else 0))


def applies(head_dim, dtype, block_m=BLOCK_M, block_n=BLOCK):
    """True when this kernel can run a case here: float32, 64 < head dim <= 128, 128 x 64
    tiles, and an sm_90 GPU or the simulator."""
    if np.dtype(dtype) != np.float32 or not D_PAD < head_dim <= D_WIDE:
        return False
    if (block_m, block_n) != (BLOCK_M, BLOCK):
        return False
    return SIMULATOR or tuple(cuda.get_current_device().compute_capability) == (9, 0)


# what the registered "wgmma" forward runs (forward_wgmma.make_forward_kernel): S and P V chained
# per CHAIN steps, 1.05-1.16x the steps from zero at N = 1k-8k (H200, 2026-12-02, tests/ab_wide.py);
# S's contraction permuted so that Q's fragments load 16 bytes at a time (as the backward's)
REGISTERED = dict(pv_chained=True, s_chained=True, s_permuted=True, vector_loads=True)


@functools.lru_cache(maxsize=None)
def make_wide_kernel(causal, loads=STAGE_LOADS, pv_paired=False, s_paired=False,
                     pv_chained=False, s_chained=False, rotate=False, s_permuted=False,
                     vector_loads=False):
    """The kernel: grid (ceil(Nq / 128), B*H), 256 threads, arguments (q, k, v, out, lse,
    scale, heads, group) on (B*H, N, d) float32 device arrays, d <= 128. loads: global loads
    in flight per thread while staging K and V^T. s_paired / pv_paired: two steps of S, or
    P V's two halves, per tensor-core wait (the same sums either way; S stays bitwise the
    backward's, whose steps are paired). Off by default: ptxas (sm_90a, CUDA 13.0,
    tests/ptxas_check.py) gives 208 registers (causal 205) with neither, and 255 registers
    with spills (8 to 580 bytes) with either one. pv_chained: each half of P V as two products
    of CHAIN steps chained in the tensor core's accumulator from zero (wgmma
    chained_3xtf32_regs), each then added into O: 4 waits per K/V block instead of 16, at the
    accuracy of a chained sum over 32 keys (wgmma.py); S is untouched. s_chained: S in four
    products of CHAIN steps chained in the tensor core (4 waits instead of 16), as
    backward_wgmma_wide.make_wide_kernel(s_chained=True) forms it, the backward that then
    recomputes it bit for bit. rotate: forward_wgmma.make_wgmma_kernel's (each Q block starts at
    another K/V block). s_permuted (with s_chained): S's contraction permuted within each
    chained product, K staged so, as backward_wgmma_wide.make_wide_kernel(s_permuted=True)
    forms it; vector_loads (with s_permuted): Q's runs of 8 columns read 16 bytes at a time
    (q 16-byte aligned, d % 4 == 0; `launcher` picks by the arguments)."""
    if s_permuted and not s_chained:
        raise ValueError("s_permuted is written for s_chained")
    if vector_loads and not s_permuted:
        raise ValueError("vector_loads needs s_permuted")
    ROTATE = rotate
    stage_k, _ = make_stage(False, loads=loads, per_warpgroup=True, chain_permuted=s_permuted)
    stage_vt, _ = make_stage(True, permuted=True, loads=loads, per_warpgroup=True)
    prod = products(BLOCK, D_PAD, D_PAD)
    step_regs, step2_regs = prod["step_3xtf32_regs"], prod["step2_3xtf32_regs"]
    chained_regs = prod["chained_3xtf32_regs"]
    fragment = make_global_fragment(False)
    chain_elements = make_chain_fragments(False, s_permuted, vector_loads)
    online_softmax = make_online_softmax(causal)
    PV_PAIRED, S_PAIRED, PV_CHAINED, S_CHAINED = pv_paired, s_paired, pv_chained, s_chained
    uBN = U(BLOCK)

    @inlined_device_function
    def s_steps(sm, s_acc, q, bh, row0, scale, d, warp, lane, s2, scratch):
        """s_acc += steps 2 s2 and 2 s2 + 1 of (scale Q) K^T, in one wait."""
        s = 2 * s2
        b_at = U(K_T + HALF * (s2 // (STEPS // 2)))
        a_big, a_small = fragment(q, bh, row0, s, scale, d, warp, lane)
        a2_big, a2_small = fragment(q, bh, row0, s + 1, scale, d, warp, lane)
        if S_PAIRED:
            add_in_turn(s_acc, step2_regs(sm, a_big, a_small, b_at, b_at + U(TILE), a2_big,
                                          a2_small, b_at + U(STEP_FLOATS),
                                          b_at + U(TILE + STEP_FLOATS), s % STEPS, scratch))
        else:       # the same sums: each step from zero, added in step order
            add(s_acc, step_regs(sm, a_big, a_small, b_at, b_at + U(TILE), s % STEPS,
                                 scratch))
            add(s_acc, step_regs(sm, a2_big, a2_small, b_at, b_at + U(TILE), s % STEPS + 1,
                                 scratch))

    @inlined_device_function
    def s_chain(sm, s_acc, q, bh, row0, scale, d, warp, lane, g, x, a_big, a_small, scratch):
        """s_acc += steps CHAIN g.. of (scale Q) K^T, chained in the tensor core (one wait)."""
        chain_elements(x, q, bh, row0, U(CHAIN * g), scale, d, warp, lane)
        split_chain(a_big, a_small, x)
        b_at = U(K_T + HALF * (CHAIN * g // STEPS))
        add(s_acc, chained_regs(sm, a_big, a_small, b_at, b_at + U(TILE), (CHAIN * g) % STEPS,
                                scratch))

    @inlined_device_function
    def pv_step(sm, o0, o1, p, s, scratch):
        """O += step s of P V, both halves of O in one wait; P's C-fragment entries 4s, 4s + 2,
        4s + 1, 4s + 3 are the A fragment against the permuted V^T (forward_wgmma)."""
        b0, s0 = split_tf32(p[4 * s])
        b1, s1 = split_tf32(p[4 * s + 2])
        b2, s2 = split_tf32(p[4 * s + 1])
        b3, s3 = split_tf32(p[4 * s + 3])
        a_big, a_small = (b0, b1, b2, b3), (s0, s1, s2, s3)
        if PV_PAIRED:
            add2(o0, o1, step2_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), a_big,
                                    a_small, U(VT_T + HALF), U(VT_T + HALF + TILE), s, scratch))
        else:
            add(o0, step_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), s, scratch))
            add(o1, step_regs(sm, a_big, a_small, U(VT_T + HALF), U(VT_T + HALF + TILE), s,
                              scratch))

    @inlined_device_function
    def pv_chain(sm, o0, o1, p, p_big, p_small, s0, scratch):
        """O += steps s0..s0 + CHAIN of P V, each half one product chained in the tensor core;
        P's A fragments (as pv_step takes them) split into p_big, p_small first."""
        split_p_chain(p_big, p_small, p, s0)
        add(o0, chained_regs(sm, p_big, p_small, U(VT_T), U(VT_T + TILE), s0, scratch))
        add(o1, chained_regs(sm, p_big, p_small, U(VT_T + HALF), U(VT_T + HALF + TILE), s0,
                             scratch))

    @kernel_jit(THREADS)
    def forward_wgmma_wide(q, k, v, out, lse, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        bh = U(cuda.blockIdx.y)
        kv = U(kv_head(cuda.blockIdx.y, heads, group))
        tid = U(cuda.threadIdx.x)
        wg = tid // U(WARPGROUP)
        warp, lane = (tid // U(32)) % U(4), tid % U(32)
        scratch = U(SCRATCH_AT) + wg * U(SCRATCH)
        block0 = U(cuda.blockIdx.x) * U(BLOCK_M)
        row0 = block0 + wg * U(BLOCK)               # this warpgroup's 64 query rows
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        i0, i1 = row0 + row, row0 + row + U(8)
        s_acc = cuda.local.array(REGS, float32)          # S, then P
        o0 = cuda.local.array(REGS, float32)             # O's head-dim columns 0..63
        o1 = cuda.local.array(REGS, float32)             # and 64..127, unnormalized
        m = cuda.local.array(2, float32)                 # running row max of rows i0, i1
        l = cuda.local.array(2, float32)                 # this thread's share of the row sums
        m_safe = cuda.local.array(2, float32)            # m, or 0 while a row has seen no key
        alpha = cuda.local.array(2, float32)             # exp(m_old - m_new)
        a_big = cuda.local.array(CHAIN_A, float32)       # chained products' A fragments,
        a_small = cuda.local.array(CHAIN_A, float32)     # split (P's, or scale Q's)
        x = cuda.local.array(CHAIN_A, float32)           # s_chained: scale Q's, unsplit
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
        clear(o0)
        clear(o1)
        # warpgroup 0 stages K's two halves, warpgroup 1 V^T's
        kv_src = k if wg == U(0) else v
        at = U(K_T) + wg * U(2 * HALF)

        n_end = nk
        if causal:      # key j is visible to query i iff j + nq <= i + nk; none past the block
            last = block0 + U(BLOCK_M) + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = first_block(U(cuda.blockIdx.x), n_end, uBN) if ROTATE else U(0)
        first = n0
        more = n0 < n_end
        while more:         # the K/V blocks from `first` round to the one before it
            cuda.syncthreads()                      # every warp is done with the last tiles
            if wg == U(0):
                stage_k(sm, at, kv_src, kv, n0, U(0), d, float32(1.0))
                stage_k(sm, at + U(HALF), kv_src, kv, n0, U(D_PAD), d, float32(1.0))
            else:
                stage_vt(sm, at, kv_src, kv, n0, U(0), d, float32(1.0))
                stage_vt(sm, at + U(HALF), kv_src, kv, n0, U(D_PAD), d, float32(1.0))
            fence_proxy_async()
            cuda.syncthreads()

            # S = (scale Q) K^T: backward_wgmma_wide's steps (module docstring)
            clear(s_acc)
            # Q's rows re-read from L1 / L2 here: without opaque_zero LLVM hoists all 64 loads
            # out of the loop and ptxas spills (255 registers, 208-296 bytes of stack)
            q_row0 = row0 + opaque_zero()
            if S_CHAINED:
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 0, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 1, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 2, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 3, x, a_big, a_small,
                        scratch)
            else:
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 0, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 1, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 2, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 3, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 4, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 5, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 6, scratch)
                s_steps(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 7, scratch)

            online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, n0, i0, i1, col_t, nq, nk)
            for j in range(REGS):
                o0[j] *= alpha[(j % 4) // 2]
                o1[j] *= alpha[(j % 4) // 2]

            # O += P V, written out with constant steps (forward_wgmma: a loop holding a wgmma
            # is not unrolled, and P, indexed by the step, would live in local memory)
            if PV_CHAINED:
                pv_chain(sm, o0, o1, s_acc, a_big, a_small, 0, scratch)
                pv_chain(sm, o0, o1, s_acc, a_big, a_small, CHAIN, scratch)
            else:
                pv_step(sm, o0, o1, s_acc, 0, scratch)
                pv_step(sm, o0, o1, s_acc, 1, scratch)
                pv_step(sm, o0, o1, s_acc, 2, scratch)
                pv_step(sm, o0, o1, s_acc, 3, scratch)
                pv_step(sm, o0, o1, s_acc, 4, scratch)
                pv_step(sm, o0, o1, s_acc, 5, scratch)
                pv_step(sm, o0, o1, s_acc, 6, scratch)
                pv_step(sm, o0, o1, s_acc, 7, scratch)
            n0 += uBN
            if n0 >= n_end:
                n0 = U(0)
            more = n0 != first

        # O / l and lse = m + log l
        inv0, inv1 = finish_rows(sm, scratch, lse, bh, m, l, i0, i1, t4, nq)
        for j in range(REGS):
            h = (j % 4) // 2
            i = i1 if h else i0
            c = U(8 * (j // 4) + j % 2) + col_t
            if i < nq:
                inv = inv1 if h else inv0
                if c < d:
                    out[bh, i, c] = o0[j] * inv
                if c + U(D_PAD) < d:
                    out[bh, i, c + U(D_PAD)] = o1[j] * inv

    return simulator_launch(DynamicSharedKernel(forward_wgmma_wide, NBYTES)), THREADS


@functools.lru_cache(maxsize=None)
def launcher(causal, **options):
    """(kernel, threads) of make_wide_kernel(causal, **options); with vector_loads, a launcher
    that runs it where q is 16-byte aligned (its data and rows: d % 4 == 0) and the same kernel
    with scalar loads otherwise (vector_io.AlignedDispatch)."""
    if not options.get("vector_loads"):
        return make_wide_kernel(causal, **options)
    kernel, threads = make_wide_kernel(causal, **options)
    scalar = make_wide_kernel(causal, **dict(options, vector_loads=False))[0]
    return AlignedDispatch(kernel, scalar, (0,)), threads
