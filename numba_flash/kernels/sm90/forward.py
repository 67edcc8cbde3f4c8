"""The Hopper forward (wgmma, sm_90a), float32 through 3xTF32: FlashAttention-2's loop, one
warpgroup (128 threads) per 64 query rows, K/V blocks of 64 keys.

    d <= 64:        make_lean_kernel, one warpgroup per block of 64 rows (64 x 64 tiles);
                    96 KiB of shared memory (scale Q, K, V^T staged), two blocks per SM;
                    the next K/V block's K loaded into registers while this block's
                    softmax and P V run, its V copied by cp.async into a raw block (17 KiB
                    more, where v is 16-byte aligned).
    64 < d <= 128:  make_wide_kernel, two warpgroups per block of 128 rows against shared K/V
                    tiles (128 x 64 tiles), the head dim in two halves of 64; the next
                    K/V block copied into shared memory by cp.async while this one is
                    computed (where q, k, v are 16-byte aligned).

Per K/V block: S = (scale Q) K^T (formed as sm90.operands says, as the backward recomputes
it), the online softmax (sm90.softmax), O = O alpha + P V. P is wgmma's A operand straight
from S's accumulator registers: S's C fragment gives a thread keys 2t and 2t + 1 of every
8-key group of its two rows, a register A fragment takes contraction positions t and t + 4 of
a step; staging V^T with each 8-key group permuted (make_stage(permuted=True): position k
holds key 2 (k % 4) + k // 4) makes the C-fragment entries (4s, 4s + 2, 4s + 1, 4s + 3) the
A fragment of step s as they stand. P V runs as products of CHAIN = 4 steps chained in the
tensor core's accumulator (split_p_chain), each added into O in float32.

Loops over steps are written out with constant indices (a loop holding a wgmma is not
unrolled by LLVM, and an array indexed by the step then lives in local memory).
Registers and spills per kernel: tools/ptxas_check.py; figures: docs/performance.md.
"""

import functools

import numpy as np
from numba import cuda, float32

from reference.precision import half_format

from ..mma import split_tf32, split_tf32_nan_elsewhere
from ..support import (ALIGN, NEG_INF, SIMULATOR, U, Launcher, head_index, inlined_device_function,
                       kernel_jit, kv_head, make_block_order,
                       query_block_first_heaviest)
from ..vector_io import AlignedDispatch, make_copies_wait
from .operands import (BLOCK, CHAIN_A, D_PAD, HALF, PER_THREAD, RAW_FLOATS, REGS, TILE, add,
                       clear, make_fetch, make_fetch_raw, make_lean_s, make_stage,
                       make_stage_raw, make_wide_s, raw_floats)
from .softmax import finish_rows, make_online_softmax
from .wgmma import CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, opaque_zero, products

D_WIDE = 2 * D_PAD           # the wide kernels' head dim, zero-padded: two halves of 64
BLOCK_M_WIDE = 2 * BLOCK     # the wide forward's query rows per block: 64 per warpgroup
# global loads in flight per thread while staging K and V (docs/experiments.md: 8, 16, 32)
STAGE_LOADS = 16
copies_wait_all = make_copies_wait(0)

# lean: float offsets of the tiles, each big then small: scale Q, K, V^T permuted
Q_T, K_T, VT_T = 0, 2 * TILE, 4 * TILE
SCRATCH_AT = 6 * TILE          # the simulator's fragment and quad exchange (wgmma.py)
# then, with vector loads, the next block's V as stored (64 x 64, operands.make_fetch_raw):
# 113 KiB a block, two blocks an SM fill its 228 KiB (1 KiB of each block's is the system's)
RAW_V_AT = SCRATCH_AT + (SCRATCH if SIMULATOR else 0)
NBYTES = 4 * RAW_V_AT
NBYTES_RAW_V = 4 * (RAW_V_AT + raw_floats(D_PAD))
# wide: K's two column halves, then V^T's (rows: the head dim), each big then small
WIDE_K_T, WIDE_VT_T = 0, 2 * HALF
WIDE_SCRATCH_AT = 4 * HALF     # the simulator's exchanges, one SCRATCH per warpgroup
# then the next block's K and V as stored (operands.make_fetch_raw), with vector loads
WIDE_RAW_AT = WIDE_SCRATCH_AT + (2 * SCRATCH if SIMULATOR else 0)
WIDE_NBYTES = 4 * (WIDE_RAW_AT + 2 * RAW_FLOATS)


def tiles(d):
    """(block_m, block_n): (64, 64) for d <= 64, (128, 64) for 64 < d <= 128."""
    return (BLOCK, BLOCK) if d <= D_PAD else (BLOCK_M_WIDE, BLOCK)


def check(block_m, block_n, d, dtype):
    """ValueError unless float32 (or a half dtype: float32 arrays of half values), 1 <= d <=
    128 and the tiles of `tiles(d)`."""
    if np.dtype(dtype) != np.float32 and not half_format(dtype):
        raise ValueError(f"the wgmma forward takes float32 and half inputs (widened to "
                         f"float32), got {np.dtype(dtype)}")
    if not 1 <= d <= D_WIDE:
        raise ValueError(f"the wgmma forward needs 1 <= d <= {D_WIDE}, got {d}")
    if (block_m, block_n) != tiles(d):
        raise ValueError(f"the wgmma forward has {tiles(d)[0]} x {tiles(d)[1]} tiles at d = {d}, "
                         f"got block_m={block_m}, block_n={block_n}")


def make_forward_kernel(block_m, block_n, head_dim, causal, dtype):
    """(kernel, threads) of the Hopper forward for head dim d (registry contract): the lean
    kernel for d <= 64, the wide one (with its scalar-load twin where q, k or v is not 16-byte
    aligned) above. For a half dtype the kernel takes float32 arrays holding half values (the
    API widens them) and issues two wgmma a step where 3xTF32 takes three: K and V are exact
    in TF32."""
    check(block_m, block_n, head_dim, dtype)
    half = bool(half_format(dtype))
    if head_dim <= D_PAD:
        return lean_launcher(bool(causal), half)
    return launcher(bool(causal), half)


def _split_chain(split):
    @inlined_device_function
    def split_chain(a_big, a_small, p, s0):
        """The A fragments of X V's steps s0..s0 + CHAIN (X = P here, dS in sm90.dq), split,
        into a_big, a_small (step s0 + s's at 4 s..): X's C-fragment entries 4s, 4s + 2,
        4s + 1, 4s + 3 against the permuted V^T."""
        for s in range(CHAIN):
            for e in range(4):
                a_big[4 * s + e], a_small[4 * s + e] = split(p[4 * (s0 + s) + (e % 2) * 2
                                                               + e // 2])
    return split_chain


# P's NaN reaches out and lse through l, so P may lose it in its split (5 instructions where
# the NaN-keeping split takes 6: the lean forward was 5 % slower with it at d = 64 on an H200,
# 2026-12-03); dS (sm90.dq) has no such path and keeps it
split_p_chain = _split_chain(split_tf32_nan_elsewhere)
split_ds_chain = _split_chain(split_tf32)


@functools.lru_cache(maxsize=None)
def make_lean_kernel(causal, half=False, raw_v=False):
    """The kernel for d <= 64: grid (ceil(Nq / 64), B*H), 128 threads, arguments (q, k, v,
    out, lse, scale, heads, group) on (B*H, N, d) float32 device arrays. scale Q is staged
    once (its big and small parts) and its A fragments read from there; S's steps go two per
    tensor-core wait (each from zero, added in step order); P V as two chained products.
    K a block ahead (operands.make_fetch): the next block's K is loaded into registers (32 a
    thread) once this block's S is formed, so those loads fly during the softmax and P V, and
    is split into shared memory at the next block's start. 1.19-1.31x the kernel that staged
    K and V there from global memory (gpu_time, H100, 2026-12-06). ptxas gives it 255
    registers (2 blocks an SM still fit: 2 x 128 x 256 registers is the SM's 64 Ki); fetching
    V^T into registers too, or K before S, spilled 220-824 bytes.
    Unmasked, the first K/V block's loads are issued before scale Q is staged (EARLY_KV,
    below); causal, after.
    raw_v: V a block ahead too, without registers: the next block's V rows copied as stored
    into a raw 64 x 64 block of shared memory by cp.async (operands.make_fetch_raw) once this
    block's tiles are staged, and V^T split into its tile from there at the next block's start
    (v 16-byte aligned, d % 4 == 0: lean_launcher picks by the arguments; 1.20-1.24x in GPU
    time, H100, 2026-12-07, with 24 bytes of spills at 255 registers); else V^T is staged
    from global memory at each block's start, between the two barriers.
    half: K and V hold half values (exact in TF32): the products with their zero small parts
    are not issued (wgmma.products' exact="b").
    Causal: a head's query blocks heaviest first (support.query_block_first_heaviest; before,
    lightest first: 1.032 / 1.007 / 0.993x forward GPU time at causal 16k / 4k / 1k, H100,
    2026-12-07); round the heads (make_block_order, as the wide kernel) ran 0.930x at 1k and
    spilled 72 bytes (docs/experiments.md rows 45, 46)."""
    # scale Q and K with S's contraction permuted in each step (as the backward reads them)
    stage_q = make_stage(False, permuted=True, loads=STAGE_LOADS)
    fetch_k, put_k = make_fetch(permuted=True)
    stage_vt = make_stage(True, permuted=True, loads=STAGE_LOADS)
    fetch_raw_v = make_fetch_raw(WARPGROUP, D_PAD, column_once=True)
    # (8 shared loads in flight: their latency is short; with STAGE_LOADS = 16 the kernel had
    # about 310 more SASS instructions, 4092 against 3779, ptxas 2026-12-07)
    stage_raw_vt = make_stage_raw(True, permuted=True, loads=8, columns=D_PAD)
    chained_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["chained_3xtf32_regs"]
    s_steps = make_lean_s(K_T, SCRATCH_AT, half)
    online_softmax = make_online_softmax(causal)
    uBM = U(BLOCK)
    # unmasked: the first K/V block's K and V loads issued before scale Q is staged, so that
    # the block's first loads overlap: forward 1.021 / 1.033 / 1.026x at d = 64 N = 1k / 4k /
    # 16k; causal kept Q first: that order spilled 124 bytes there and ran 0.990-0.999x (GPU
    # time, H100, 2026-12-08 00:10, docs/experiments.md row 60)
    EARLY_KV = not causal

    @inlined_device_function
    def start_keys(sm, k_next, k, v, kv, n0, row0, nq, nk, d):
        """(n_end, more): the Q block of rows row0.. runs over keys n0 = 0 .. n_end (causal:
        key j is visible to query i iff j + nq <= i + nk; none past the block); more: there is
        a first K/V block, whose K is then fetched into k_next and (raw_v) V copied into the
        raw block."""
        n_end = nk
        if causal:
            last = row0 + uBM + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        more = n0 < n_end
        if more:
            fetch_k(k_next, k, kv, n0, U(0), d)
            if raw_v:
                fetch_raw_v(sm, U(RAW_V_AT), v, kv, n0, nk, d)
        return n_end, more

    @inlined_device_function
    def pv_chain(sm, o_acc, p, a_big, a_small, s0):
        """o_acc += steps s0..s0 + CHAIN of P V, chained in the tensor core (one wait)."""
        split_p_chain(a_big, a_small, p, s0)
        add(o_acc, chained_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), s0,
                                U(SCRATCH_AT)))

    @kernel_jit(WARPGROUP)
    def forward_wgmma(q, k, v, out, lse, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        row0 = query_block_first_heaviest(causal) * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        # this thread's accumulator entries (wgmma.position): rows row, row + 8 of the block
        # (i0, i1), columns col_t, col_t + 1 of each 8-column group
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        i0, i1 = row0 + row, row0 + row + U(8)
        s_acc = cuda.local.array(REGS, float32)          # S, then P
        o_acc = cuda.local.array(REGS, float32)          # O, unnormalized
        m = cuda.local.array(2, float32)                 # running row max of rows i0, i1
        l = cuda.local.array(2, float32)                 # this thread's share of the row sums
        m_safe = cuda.local.array(2, float32)            # m, or 0 while a row has seen no key
        alpha = cuda.local.array(2, float32)             # exp(m_old - m_new)
        a_big = cuda.local.array(CHAIN_A, float32)       # P's A fragments, split
        a_small = cuda.local.array(CHAIN_A, float32)
        k_next = cuda.local.array(PER_THREAD, float32)   # the next K/V block's K, fetched
        n0 = U(0)
        first = n0
        if EARLY_KV:       # (a constant: Numba prunes the branch it does not take)
            n_end, more = start_keys(sm, k_next, k, v, kv, n0, row0, nq, nk, d)
        # scale Q, staged once as big and small parts; its A fragments are read from there
        stage_q(sm, U(Q_T), q, bh, row0, U(0), d, scale)
        q_at = U(Q_T) + warp * U(1024) + lane     # core_offset(row, t4, 64): see q_fragment
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
        clear(o_acc)

        if not EARLY_KV:
            n_end, more = start_keys(sm, k_next, k, v, kv, n0, row0, nq, nk, d)
        while more:
            if raw_v:
                copies_wait_all()                   # this thread's copies of this block's V
            cuda.syncthreads()                      # every warp is done with the last tiles
            put_k(sm, U(K_T), k_next)
            if raw_v:
                stage_raw_vt(sm, U(VT_T), U(RAW_V_AT), U(0))
            else:
                stage_vt(sm, U(VT_T), v, kv, n0, U(0), d, float32(1.0))
            n1 = n0 + uBM
            fence_proxy_async()
            cuda.syncthreads()
            if raw_v and n1 < n_end:    # the raw block is read: the next block's V into it
                fetch_raw_v(sm, U(RAW_V_AT), v, kv, n1, nk, d)

            # S = (scale Q) K^T, written out (as a loop, which only moves shared-memory
            # addresses, ptxas gave 185 registers, 255 with spills under causal, against 170)
            clear(s_acc)
            s_steps(sm, s_acc, q_at, 0)
            s_steps(sm, s_acc, q_at, 2)
            s_steps(sm, s_acc, q_at, 4)
            s_steps(sm, s_acc, q_at, 6)
            if n1 < n_end:      # the next block's K: its loads fly during the softmax and P V
                fetch_k(k_next, k, kv, n1, U(0), d)

            # every key visible to every row of the block: no masking (most blocks)
            masked = n1 > nk or (causal and n1 - U(1) + nq > row0 + nk)
            online_softmax(sm, U(SCRATCH_AT), s_acc, m, l, m_safe, alpha, masked, n0, i0, i1,
                           col_t, nq, nk)
            for j in range(REGS):
                o_acc[j] *= alpha[(j % 4) // 2]

            # O += P V: P's C fragment is the A fragment against the permuted V^T
            pv_chain(sm, o_acc, s_acc, a_big, a_small, 0)
            pv_chain(sm, o_acc, s_acc, a_big, a_small, CHAIN)
            n0 = n1 if n1 < n_end else U(0)
            more = n0 != first

        # O / l and lse = m + log l
        inv0, inv1 = finish_rows(sm, U(SCRATCH_AT), lse, bh, m, l, i0, i1, t4, nq)
        for j in range(REGS):
            h = (j % 4) // 2
            i = i1 if h else i0
            c = U(8 * (j // 4) + j % 2) + col_t
            if i < nq and c < d:
                out[bh, i, c] = o_acc[j] * (inv1 if h else inv0)

    return Launcher(forward_wgmma, NBYTES_RAW_V if raw_v else NBYTES), WARPGROUP


@functools.lru_cache(maxsize=None)
def lean_launcher(causal, half=False):
    """(kernel, threads) of the lean forward: the kernel with V a block ahead by cp.async
    where v is 16-byte aligned (its data and rows: d % 4 == 0), the one that stages V^T from
    global memory otherwise (vector_io.AlignedDispatch; the same sums, bit for bit)."""
    raw, threads = make_lean_kernel(causal, half, True)
    staged = make_lean_kernel(causal, half, False)[0]
    return AlignedDispatch(raw, staged, (2,)), threads


@functools.lru_cache(maxsize=None)
def make_wide_kernel(causal, vector_loads, half=False):
    """The kernel for 64 < d <= 128: grid (ceil(Nq / 128), B*H), 256 threads, arguments (q, k,
    v, out, lse, scale, heads, group) on (B*H, N, d) float32 device arrays. Warpgroup 0 stages
    K's two halves, warpgroup 1 V^T's; each warpgroup reads its 64 rows of scale Q from global
    memory (L1 / L2) into chained A fragments per K/V block. S as four chained products with
    the contraction permuted (sm90.operands), P V as two per half of O.
    Causal: a warpgroup only stages the K/V blocks past its own last row (for the other
    warpgroup), so it no longer meets those keys' values: an inf in V there made its rows NaN
    (P = 0 times inf), which the lean kernel still does, and standard attention does not.
    With the query blocks heaviest first that made 1.03-1.08x the kernel that computed those
    blocks masked, ascending (gpu_time, H100, 2026-12-06; the lean kernel, reversed then, ran
    3-6 % slower at 4k-16k, and reversed again on 2026-12-07 1.032x at 16k:
    make_lean_kernel). Since 2026-12-07 the blocks go round the heads, every head's last
    query block first, then every head's one before it (support.make_block_order: 1.048 /
    1.052x at 4k / 16k).
    vector_loads: Q's runs of 8 columns read 16 bytes at a time, and K and V a block ahead:
    the next block's rows copied as stored into shared memory by cp.async
    (operands.make_fetch_raw) while this one is computed, split into the tiles from there at
    the next block's start (q, k, v 16-byte aligned, d % 4 == 0: `launcher` picks by the
    arguments); False: element by element, K and V staged from global memory.
    half: as make_lean_kernel's."""
    stage_k = make_stage(False, loads=STAGE_LOADS, per_warpgroup=True, chain_permuted=True)
    stage_vt = make_stage(True, permuted=True, loads=STAGE_LOADS, per_warpgroup=True)
    stage_raw_k = make_stage_raw(False, chain_permuted=True, loads=STAGE_LOADS)
    stage_raw_vt = make_stage_raw(True, permuted=True, loads=STAGE_LOADS)
    fetch_raw = make_fetch_raw(2 * WARPGROUP)
    chained_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["chained_3xtf32_regs"]
    s_chain = make_wide_s(WIDE_K_T, vector_loads, half)
    online_softmax = make_online_softmax(causal)
    block_order = make_block_order(causal)           # heaviest first, round the heads
    uBN = U(BLOCK)

    @inlined_device_function
    def pv_chain(sm, o0, o1, p, p_big, p_small, s0, scratch):
        """O += steps s0..s0 + CHAIN of P V, each half one product chained in the tensor core;
        P's A fragments split into p_big, p_small first."""
        split_p_chain(p_big, p_small, p, s0)
        add(o0, chained_regs(sm, p_big, p_small, U(WIDE_VT_T), U(WIDE_VT_T + TILE), s0,
                             scratch))
        add(o1, chained_regs(sm, p_big, p_small, U(WIDE_VT_T + HALF),
                             U(WIDE_VT_T + HALF + TILE), s0, scratch))

    @kernel_jit(2 * WARPGROUP)
    def forward_wgmma_wide(q, k, v, out, lse, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        x_block, head = block_order(q.shape[0])
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tid = U(cuda.threadIdx.x)
        wg = tid // U(WARPGROUP)
        warp, lane = (tid // U(32)) % U(4), tid % U(32)
        scratch = U(WIDE_SCRATCH_AT) + wg * U(SCRATCH)
        block0 = x_block * U(BLOCK_M_WIDE)
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
        x = cuda.local.array(CHAIN_A, float32)           # scale Q's, unsplit
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
        clear(o0)
        clear(o1)
        # warpgroup 0 stages K's two halves, warpgroup 1 V^T's
        kv_src = k if wg == U(0) else v
        at = U(WIDE_K_T) + wg * U(2 * HALF)

        n_end = nk
        if causal:      # key j is visible to query i iff j + nq <= i + nk; none past the block
            last = block0 + U(BLOCK_M_WIDE) + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        first = n0
        more = n0 < n_end
        if vector_loads and more:   # block 0's K and V on their way (cp.async)
            fetch_raw(sm, U(WIDE_RAW_AT), k, kv, n0, nk, d)
            fetch_raw(sm, U(WIDE_RAW_AT + RAW_FLOATS), v, kv, n0, nk, d)
        while more:
            if vector_loads:
                copies_wait_all()                   # this thread's copies of this block
            cuda.syncthreads()                      # every warp is done with the last tiles
            if vector_loads:    # split from the raw blocks that arrived during the last one
                raw = U(WIDE_RAW_AT) + wg * U(RAW_FLOATS)
                if wg == U(0):
                    stage_raw_k(sm, at, raw, U(0))
                    stage_raw_k(sm, at + U(HALF), raw, U(D_PAD))
                else:
                    stage_raw_vt(sm, at, raw, U(0))
                    stage_raw_vt(sm, at + U(HALF), raw, U(D_PAD))
            elif wg == U(0):
                stage_k(sm, at, kv_src, kv, n0, U(0), d, float32(1.0))
                stage_k(sm, at + U(HALF), kv_src, kv, n0, U(D_PAD), d, float32(1.0))
            else:
                stage_vt(sm, at, kv_src, kv, n0, U(0), d, float32(1.0))
                stage_vt(sm, at + U(HALF), kv_src, kv, n0, U(D_PAD), d, float32(1.0))
            fence_proxy_async()
            cuda.syncthreads()
            if vector_loads and n0 + uBN < n_end:  # the next block's, during this one
                fetch_raw(sm, U(WIDE_RAW_AT), k, kv, n0 + uBN, nk, d)
                fetch_raw(sm, U(WIDE_RAW_AT + RAW_FLOATS), v, kv, n0 + uBN, nk, d)
            # under causal masking a block past this warpgroup's last row (row0 + 63) is
            # only staged (for the other warpgroup): one back edge (a `continue` past the
            # products made ptxas spill 192 bytes in the loop, against 20 without it)
            if not causal or n0 + nq <= row0 + U(BLOCK - 1) + nk:
                # S = (scale Q) K^T, as sm90.backward's wide kernel forms it
                clear(s_acc)
                # Q's rows re-read from L1 / L2 here: without opaque_zero LLVM hoists all 64
                # loads out of the loop and ptxas spills (255 registers, 208-296 bytes of stack)
                q_row0 = row0 + opaque_zero()
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 0, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 1, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 2, x, a_big, a_small,
                        scratch)
                s_chain(sm, s_acc, q, bh, q_row0, scale, d, warp, lane, 3, x, a_big, a_small,
                        scratch)

                # every key visible to every row of the warpgroup: no masking (most blocks)
                masked = n0 + uBN > nk or (causal and n0 + U(BLOCK - 1) + nq > row0 + nk)
                online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1,
                               col_t, nq, nk)
                for j in range(REGS):
                    o0[j] *= alpha[(j % 4) // 2]
                    o1[j] *= alpha[(j % 4) // 2]

                # O += P V
                pv_chain(sm, o0, o1, s_acc, a_big, a_small, 0, scratch)
                pv_chain(sm, o0, o1, s_acc, a_big, a_small, CHAIN, scratch)
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

    return Launcher(forward_wgmma_wide, WIDE_NBYTES if vector_loads else 4 * WIDE_RAW_AT), \
        2 * WARPGROUP


@functools.lru_cache(maxsize=None)
def launcher(causal, half=False):
    """(kernel, threads) of the wide forward: the vector-load kernel where q, k and v are
    16-byte aligned (their data and rows: d % 4 == 0), its scalar-load twin otherwise
    (vector_io.AlignedDispatch; the same sums, bit for bit)."""
    vector, threads = make_wide_kernel(causal, True, half)
    scalar = make_wide_kernel(causal, False, half)[0]
    return AlignedDispatch(vector, scalar, (0, 1, 2)), threads
