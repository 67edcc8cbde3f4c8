"""The Hopper forward on 16-bit inputs (wgmma, sm_90a): bfloat16 or float16 q, k, v read and
staged as they are stored (no widened copies), products on the tensor core in that format,
FlashAttention-2's loop in float32; the "wgmma16" pair's forward (registry.py).

Blocks of 64 query rows a warpgroup sharing the K/V blocks of 64 keys (half the K/V traffic
of a 64-row block, which kept L2 70 % busy): two warpgroups (128 rows, 256 threads) at D = 64,
three (192 rows, 384 threads) at D = 128, the head dim zero-padded to D = 64 or 128. Q and
STAGES = 3 K/V blocks in shared memory (sm90.stage16): K of this block and V of the last one
are read while the next block arrives by cp.async (16-byte copies that the threads do not wait
for, each thread's worked out once by a stage16.Plan; where q, k, v are not 16-byte aligned,
staged synchronously instead). One barrier a block: this block's copies are waited for and
fenced for wgmma before it, the next block's started after it.

With tma=True (the "wgmma16" pairs' forward, where q, k, v pass tma.tma_ready; cp.async
elsewhere, and in the mma16 pair) the copy engine stages instead: thread 0 starts Q (one box
of 64 x 64 a warpgroup and 64 columns) with the first K/V block, and each K/V block (two or
four boxes) two blocks ahead, into TMA_STAGES = 4 stages with the 128-byte swizzle that the
products read (wgmma16, swizzle=True); each stage's mbarrier counts its bytes in. Still one
barrier a block: past it every warp is done with the stage two blocks back, which thread 0
refills; then every thread waits for this block's mbarrier phase. No thread issues a copy
instruction but thread 0, and nothing waits for a copy but the block that needs it (the
cp.async kernel's fence waits for every copy in flight, so it could not prefetch deeper).
Under causal masking the
query blocks run heaviest first (the last rows see the most keys), and a warpgroup computes
only the K/V blocks its own rows see, staging the rest for the warpgroups below it; one whose
rows all lie past Nq (in the last query block, where block_m does not divide Nq) only stages.
Not so without masking: there such a warpgroup computes rows nobody reads, because the
stage-only tail cost the non-causal loop 13 to 50 SASS instructions and, at D = 64, 143
registers (one block an SM; 0.66x, H100, 2026-12-05).
Per K/V block:

    S = Q K^T            wgmma m64n64k16, Q and K K-major (sm90.wgmma16's layout), D / 16 steps
                         chained in the tensor core, left unscaled (scale Q is not a half value:
                         S is formed from the inputs themselves, as in reference.half's flash
                         model)
    online softmax       sm90.softmax's lazy step in units of log2: with c = scale log2(e),
                         m the running max of S, P = 2^(S c - m c) by one FFMA and ex2.approx
                         (FA2's scale in the exponent; l sums the float32 P); m moves only when
                         a row max passes it by 2^8 in P (FA4's lazy rescaling: O *= alpha
                         skipped otherwise); masking only in the blocks that hold a key past nk
                         or, causal, past the diagonal
    O = O alpha + P V    P rounded to the input format (FlashAttention's rounding) and packed
                         two to a register: S's accumulator entries 8 s..8 s + 7 are, in pairs,
                         the register A fragment of step s (wgmma16.a_fragment16), so no
                         exchange; V staged as K is, read transposed by wgmma (wgmma16's
                         b_rows); m64nDk16, 4 steps, accumulated into O in the tensor core.

At the end O / l rounded to the input format (out) and lse = m c ln 2 + log l in float32.
In the asynchronous wgmma kernel a warp puts its 16 rows of out into its warpgroup's Q tile
(free by then) by stmatrix and writes them out 16 bytes a lane (stage16.make_store_rows);
elsewhere each thread stores its entries two bytes at a time.
"""

import functools

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from reference.precision import half_format

from ..support import (ALIGN, NEG_INF, SIMULATOR, U, Launcher, head_index, inlined_device_function,
                       kernel_jit, kv_head, make_block_order,
                       query_block_first_heaviest)
from ..vector_io import AlignedDispatch, aligned, make_copies_wait
from .operands import BLOCK, REGS
from .softmax import FLT_MAX, LAZY_LOG2, LOG2E, make_finish_rows, make_online_softmax_lazy
from .stage16 import make_plan, make_stage16, make_stage_pair, make_store_rows
from .tma import (BOX, BOX_BYTES, MBARRIER_BYTES, SWIZZLE_ALIGN, mbarrier_expect_tx,
                  mbarrier_fence_init, mbarrier_init, mbarrier_wait, swizzle_base, tensor_maps,
                  tensormap_acquire, tma_load, tma_ready)
from ..mma16 import engine
from .wgmma import SCRATCH, WARPGROUP, fence_proxy_async
from .wgmma16 import make_pack_half2, make_wait, products16

D_MAX = 128          # head dims up to this; zero-padded to 64 or 128
P_WORDS = REGS // 2  # P's register A fragments: its 32 entries, two to a word
STAGES = 3           # K/V blocks in shared memory: K of this block and V of the last one
                     # read, the next block arriving
TMA_STAGES = 4       # with TMA: two blocks arriving (PREFETCH = TMA_STAGES - 2 ahead)
copies_wait_all = make_copies_wait(0)


def padded(d):
    """D, the head dim the kernel for d computes with: 64 or 128."""
    return 64 if d <= 64 else 128


def warpgroups(D):
    """Consumers of each K/V block, 64 query rows each: 2 at D = 64 (two blocks an SM fit),
    3 at D = 128, where one block an SM is all that fits (128 KiB of shared memory with two,
    140 registers a thread): 12 warps an SM to hide latency instead of 8."""
    return 3 if D == 128 else 2


def threads(D):
    """Threads of the kernel for D: its warpgroups."""
    return warpgroups(D) * WARPGROUP


def tiles(d):
    """(block_m, block_n): (128, 64) for d <= 64, (192, 64) above."""
    return warpgroups(padded(d)) * BLOCK, BLOCK


def check(block_m, block_n, d, dtype):
    """ValueError unless a half dtype, 1 <= d <= 128 and tiles(d)."""
    if not half_format(dtype):
        raise ValueError(f"the wgmma16 forward takes float16 and bfloat16 inputs, got "
                         f"{np.dtype(dtype)}")
    if not 1 <= d <= D_MAX:
        raise ValueError(f"the wgmma16 forward takes head dims 1..{D_MAX}, got d={d}")
    if (block_m, block_n) != tiles(d):
        raise ValueError(f"the wgmma16 forward has fixed tiles {tiles(d)} at d={d}, got "
                         f"({block_m}, {block_n})")


def shared_bytes(D, tma=False):
    """Bytes of shared memory the kernel for D takes on a GPU: the warpgroups' Q tiles and
    STAGES K/V blocks (64 rows x D, 16-bit); with TMA, TMA_STAGES blocks, their mbarriers and
    room to align the tiles for the swizzle."""
    if tma:
        return (2 * BLOCK * D * (warpgroups(D) + TMA_STAGES * 2) + MBARRIER_BYTES * TMA_STAGES
                + SWIZZLE_ALIGN)
    return 2 * BLOCK * D * (warpgroups(D) + STAGES * 2)


@functools.lru_cache(maxsize=None)
def make_kernel(D, causal, fmt, asynchronous, products="wgmma", tma=False, round_heads=False):
    """The kernel for head dims up to D (64 or 128): grid (ceil(Nq / block_m), B*H) and
    threads(D) threads (tiles(d): 128 rows and 256 threads at D = 64, 192 and 384 at 128),
    arguments (q, k, v, out, lse, scale_log2, heads, group): q, k, v, out (B*H, N, d) uint16
    device arrays holding `fmt` ("bfloat16" or "float16") patterns, lse (B*H, Nq) float32,
    scale_log2 = scale log2(e) float32; asynchronous: tiles staged with cp.async (q, k, v
    16-byte aligned, d a multiple of 8), else element by element (stage16); products: the
    tensor-core engine, "wgmma" (sm_90a) or "mma" (mma.sync, sm_80+; kernels.mma16); tma:
    Q, K and V staged by the copy engine instead (sm90.tma: boxes with the 128-byte swizzle,
    landing on an mbarrier a stage, TMA_STAGES stages, two blocks ahead; asynchronous wgmma
    only), the kernel taking a tenth argument, `maps` (tma.tensor_maps of q, k, v).
    round_heads (causal): the query blocks taken round the heads, every head's heaviest, then
    every head's next (support.make_block_order), not each head's heaviest first in turn
    (_Launch picks it by shape: ROUND_HEADS_FROM). Returns the launchable kernel."""
    if D not in (64, 128):
        raise ValueError(f"D must be 64 or 128, got {D}")
    if tma and not (asynchronous and products == "wgmma"):
        raise ValueError("TMA staging is the asynchronous wgmma kernel's")
    WARPGROUPS = warpgroups(D)
    BLOCK_M, THREADS = WARPGROUPS * BLOCK, threads(D)
    TILE = BLOCK * D                          # elements of a 64-row Q, K or V tile
    Q_AT, KV_AT = 0, WARPGROUPS * TILE        # warpgroup w's Q at TILE w; K of stage b at
    NBYTES = shared_bytes(D, tma)             # KV_AT + 2 TILE b, its V one TILE further
    SCRATCH_AT = NBYTES // 4                  # floats: the simulator's exchanges, per warpgroup
    N_STAGES = TMA_STAGES if tma else STAGES
    PREFETCH = N_STAGES - 2                   # blocks in flight past this one (TMA)
    # TMA: stage b's mbarrier at byte MBAR_AT + 8 b past the aligned base; the bytes a stage
    # and Q bring (whole boxes of 64 x 64, zeros past the arrays included)
    MBAR_AT = 2 * (KV_AT + N_STAGES * 2 * TILE)
    KV_BYTES, Q_BYTES = 2 * (D // BOX) * BOX_BYTES, WARPGROUPS * (D // BOX) * BOX_BYTES
    NBYTES += 4 * WARPGROUPS * SCRATCH if SIMULATOR else 0
    O_REGS = D // 2                                           # O's accumulator entries
    eng = engine(products, (products16, make_wait, fence_proxy_async))
    fence = eng.fence
    swizzled = dict(swizzle=True) if tma else {}                  # (the layout TMA writes)
    s_issue = eng.products16(BLOCK, D, BLOCK, fmt, **swizzled)["ss_issue"]   # S = Q K^T
    pv = eng.products16(D, D, BLOCK, fmt, b_rows=D, **swizzled)    # O += P V, V as staged
    pv_product, pv_issue, pv_descriptor = pv["mma_rs"], pv["rs_issue"], pv["rs_descriptor"]
    wait_s_but_pv, _ = eng.make_wait(1, O_REGS)                   # S done, P V may still run
    wait_s_alone, wait_o = eng.make_wait(0, O_REGS)
    stage_q = make_stage16(BLOCK_M, D, asynchronous, THREADS)   # every warpgroup's rows
    stage_kv = make_stage_pair(BLOCK, D, False, THREADS)   # K, then V, element by element
    plan = make_plan(BLOCK, D, THREADS)                           # K, then V (cp.async)
    PER, plan_start, plan_stage_pair = plan.PER, plan.start, plan.stage_pair
    pack = make_pack_half2(fmt)
    online_softmax = make_online_softmax_lazy(causal)
    finish_rows = make_finish_rows(base2=True)
    uBM = U(BLOCK)
    # out through shared memory, 16 bytes a store (stmatrix: sm_90; d a multiple of 8 and out
    # 16-byte aligned: the asynchronous kernel's dispatch)
    chunked_out = asynchronous and eng.stmatrix
    store_rows = make_store_rows(D, fmt)

    @inlined_device_function
    def pack_p(p_regs, s_acc):
        """P's register A fragments for P V: entries 2w, 2w + 1 rounded into word w."""
        for w in range(P_WORDS):
            p_regs[w] = pack(s_acc[2 * w], s_acc[2 * w + 1])

    @inlined_device_function
    def stage_block(sh, at, k, v, kv, n0, nk, d, kv_at, row_bytes, rows, offsets, shared):
        """K and V of keys n0.. into the stage at `at`: by the plan (cp.async, one group), or
        element by element."""
        if asynchronous:
            plan_stage_pair(sh, at, k, v, kv_at + uint64(n0) * row_bytes, nk - n0, rows,
                            offsets, shared)
        else:
            stage_kv(sh, at, k, v, kv, n0, nk, d)

    @inlined_device_function
    def tma_block(sh, base, maps, k, v, kv, stage, n0, extra_bytes):
        """(TMA, thread 0) K and V of keys n0.. into `stage`, landing on its mbarrier, which
        also waits for extra_bytes more (Q's, with the first block)."""
        bar = U(2) * base + U(MBAR_AT) + stage * U(MBARRIER_BYTES)
        mbarrier_expect_tx(sh, bar, U(KV_BYTES) + extra_bytes)
        at = base + U(KV_AT) + stage * U(2 * TILE)
        for h in range(D // BOX):           # the tile's 64-column boxes
            tma_load(sh, at + U(h * BOX * BOX), maps, 1, k, U(h * BOX), n0, kv, bar)
            tma_load(sh, at + U(TILE + h * BOX * BOX), maps, 2, v, U(h * BOX), n0, kv, bar)

    @inlined_device_function
    def arrive(sh, k, v, kv, b, n1, n_end, nk, d, kv_at, row_bytes, rows, offsets, shared,
               base, maps):
        """Block n1 - 64's tiles in stage b ready for wgmma, and the copies of a block ahead
        started. cp.async: this block's copies (started a step ago; none newer: a fence waits
        for every copy in flight) are waited for and fenced for wgmma before the one barrier;
        past it every thread's have landed, and every warp is done with the stage the next
        block overwrites (its last reader, P V of block n1 - 192, was waited for in the step
        before); then the next block's copies. TMA: past the barrier every warp is done with
        the stage of block n1 - 192 (K read by S two steps ago, V by P V a step ago, both
        waited for), so thread 0 starts block n1 - 64 + 64 PREFETCH into it; then every
        thread waits for this block's mbarrier phase (stage b's (n1 / 64 - 1) / N_STAGES-th)."""
        if tma:
            cuda.syncthreads()
            ahead = n1 + U(BLOCK * (PREFETCH - 1))
            if cuda.threadIdx.x == 0 and ahead < n_end:
                tma_block(sh, base, maps, k, v, kv, (b + U(PREFETCH)) % U(N_STAGES), ahead,
                          U(0))
            mbarrier_wait(sh, U(2) * base + U(MBAR_AT) + b * U(MBARRIER_BYTES),
                          (n1 // U(BLOCK) - U(1)) // U(N_STAGES) % U(2))
            return
        if asynchronous:
            copies_wait_all()
        fence()
        cuda.syncthreads()
        if n1 < n_end:
            stage_block(sh, U(KV_AT) + (b + U(1)) % U(STAGES) * U(2 * TILE), k, v, kv, n1, nk,
                        d, kv_at, row_bytes, rows, offsets, shared)

    @inlined_device_function
    def softmax_block(sm, scratch, s, s_acc, m, l, m_safe, alpha, scale_log2, tau, n0, row0,
                      i0, i1, col_t, nq, nk):
        """S of keys n0.. into s_acc, then the online softmax's step: P in s_acc; returns
        whether the rows' reference max moved (O to be rescaled by alpha)."""
        for j in range(REGS):
            s_acc[j] = s[j]
        # every key visible to every row of the warpgroup: no masking (most blocks)
        n1 = n0 + U(BLOCK)
        masked = n1 > nk or (causal and n1 - U(1) + nq > row0 + nk)
        return online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1,
                              col_t, nq, nk, scale_log2, tau)

    ROUND_HEADS = round_heads and causal
    block_order = make_block_order(True)

    @kernel_jit(THREADS)
    def forward16(q, k, v, out, lse, scale_log2, heads, group, maps):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)     # the tiles
        sm = cuda.shared.array(0, float32, alignment=ALIGN)    # the same memory as floats
        if ROUND_HEADS:
            x_block, head = block_order(q.shape[0])
        else:
            head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = kv_head(U(head), U(heads), U(group))      # 32-bit divisions, not 64-bit
        wg = U(cuda.threadIdx.x) // U(WARPGROUP)    # this thread's warpgroup and its rows
        tid = U(cuda.threadIdx.x) % U(WARPGROUP)
        warp, lane = tid // U(32), tid % U(32)
        if ROUND_HEADS:
            block0 = x_block * U(BLOCK_M)
        else:
            block0 = query_block_first_heaviest(causal) * U(BLOCK_M)
        row0 = block0 + wg * uBM
        # TMA: the tiles from the first 1024-byte aligned element of sh (the swizzle's period)
        base = swizzle_base(sh) if tma else U(0)
        q_at = base + U(Q_AT) + wg * U(TILE)
        kv0 = base + U(KV_AT)                   # stage 0's K
        scratch = U(SCRATCH_AT) + wg * U(SCRATCH)
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        i0, i1 = row0 + row, row0 + row + U(8)
        s_acc = cuda.local.array(REGS, float32)          # S, then P
        o_acc = cuda.local.array(O_REGS, float32)        # O, unnormalized
        p_regs = cuda.local.array(P_WORDS, uint32)       # P rounded, two to a word
        m = cuda.local.array(2, float32)                 # reference max of S (unscaled)
        l = cuda.local.array(2, float32)
        m_safe = cuda.local.array(2, float32)            # m scale log2 e, 0 while m = -inf
        alpha = cuda.local.array(2, float32)
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
            m_safe[h] = float32(0.0)
        # the lazy rescale's threshold in units of S (LAZY_LOG2 in log2 units); finite
        tau = min(float32(LAZY_LOG2) / scale_log2, float32(FLT_MAX))
        for j in range(O_REGS):
            o_acc[j] = float32(0.0)
        # where this thread's K / V chunks come from and go to (stage16.Plan)
        rows = cuda.local.array(PER, uint32)
        offsets = cuda.local.array(PER, uint32)
        shared = cuda.local.array(PER, uint32)
        row_bytes = uint64(k.strides[1])
        kv_at = uint64(kv) * uint64(k.strides[0])
        if asynchronous and not tma:
            plan_start(rows, offsets, shared, U(k.strides[1]), d)
        if tma and cuda.threadIdx.x == 0:     # visible to the others past arrive's barrier
            for st in range(N_STAGES):
                mbarrier_init(sh, U(2) * base + U(MBAR_AT + st * MBARRIER_BYTES), U(1))
            mbarrier_fence_init()
            for i in range(3):                  # q's, k's and v's maps, as the host wrote them
                tensormap_acquire(maps, i)

        n_end = nk      # the keys of every warpgroup's rows: the blocks staged
        n_wg = nk       # the keys of this warpgroup's rows: the blocks it computes
        if causal:      # key j is visible to query i iff j + nq <= i + nk; none past the block
            last = block0 + U(BLOCK_M) + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
            last = row0 + uBM + nk
            n_wg = min(n_end, last - nq) if last > nq else U(0)
            if row0 >= nq:  # rows all past Nq: nothing to compute
                n_wg = U(0)
        # the pipeline: Q and the first K/V block in flight, then each step waits for its own
        # copies (arrive: one barrier) and starts the next block's into a free stage. In
        # the tensor core, S of this block is issued, then P V of the last one, and the
        # softmax of this block runs while P V does (FlashAttention-3's overlap within a
        # warpgroup): O is rescaled by this block's alpha once P V is in. The first block
        # (no P V before it) is peeled off the loop, and P V of the last block follows it:
        # no branch between the two issues (ptxas serializes wgmma across one, C7513).
        # Causal: a warpgroup computes the blocks its own rows see (n_wg), then only helps
        # stage the rest of the block's (n_end) for the warpgroups below the diagonal.
        b = U(0)                                # this block's stage; the last one's: b_last
        if n_end > U(0):        # (a block whose rows see no key stages nothing)
            if not tma:
                stage_q(sh, U(Q_AT), q, bh, block0, nq, d)
                stage_block(sh, U(KV_AT), k, v, kv, U(0), nk, d, kv_at, row_bytes, rows,
                            offsets, shared)
            elif cuda.threadIdx.x == 0:     # Q with block 0 (its mbarrier), then blocks ahead
                tma_block(sh, base, maps, k, v, kv, U(0), U(0), U(Q_BYTES))
                for w in range(WARPGROUPS):
                    for h in range(D // BOX):
                        tma_load(sh, base + U(Q_AT + w * TILE + h * BOX * BOX), maps, 0, q,
                                 U(h * BOX), block0 + U(w * BLOCK), bh,
                                 U(2) * base + U(MBAR_AT))
                for j in range(1, PREFETCH):
                    if U(j * BLOCK) < n_end:
                        tma_block(sh, base, maps, k, v, kv, U(j), U(j * BLOCK), U(0))
            arrive(sh, k, v, kv, b, U(BLOCK), n_end, nk, d, kv_at, row_bytes, rows, offsets,
                   shared, base, maps)
            if n_wg > U(0):
                s = wait_s_alone(s_issue(sh, q_at, kv0))
                softmax_block(sm, scratch, s, s_acc, m, l, m_safe, alpha, scale_log2, tau,
                              U(0), row0, i0, i1, col_t, nq, nk)
                pack_p(p_regs, s_acc)
        n0 = U(BLOCK)
        b_last = b
        b = U(1)
        while n0 < n_wg:
            n1 = n0 + uBM
            arrive(sh, k, v, kv, b, n1, n_end, nk, d, kv_at, row_bytes, rows, offsets, shared,
                   base, maps)
            v_desc = pv_descriptor(sh, kv0 + b_last * U(2 * TILE) + U(TILE))
            s = s_issue(sh, q_at, kv0 + b * U(2 * TILE))
            pv_issue(sh, sm, o_acc, p_regs, v_desc, scratch)
            s = wait_s_but_pv(s)
            rescaled = softmax_block(sm, scratch, s, s_acc, m, l, m_safe, alpha, scale_log2,
                                     tau, n0, row0, i0, i1, col_t, nq, nk)
            wait_o(o_acc)
            if rescaled:        # the same in every thread of a warp (warp_any)
                for j in range(O_REGS):
                    o_acc[j] *= alpha[(j % 4) // 2]
            pack_p(p_regs, s_acc)
            n0 = n1
            b_last = b
            b = (b + U(1)) % U(N_STAGES)
        if n_wg > U(0):     # (waited for: past it this warpgroup reads no stage)
            pv_product(sh, sm, o_acc, p_regs, kv0 + b_last * U(2 * TILE) + U(TILE), scratch)
        if causal:          # blocks past this warpgroup's rows, staged for the others
            while n0 < n_end:
                arrive(sh, k, v, kv, b, n0 + uBM, n_end, nk, d, kv_at, row_bytes, rows,
                       offsets, shared, base, maps)
                n0 += uBM
                b = (b + U(1)) % U(N_STAGES)

        for h in range(2):
            m[h] *= scale_log2              # lse in units of log2: m c
        inv0, inv1 = finish_rows(sm, scratch, lse, bh, m, l, i0, i1, t4, nq)
        if chunked_out:     # (this warpgroup's Q tile: its S products are all waited for)
            store_rows(sh, sm, out, o_acc, p_regs, inv0, inv1, q_at, bh, row0, warp, lane, nq,
                       d, scratch)
        else:
            for j in range(0, O_REGS, 2):       # entries j, j + 1: columns c, c + 1 of a row
                h = (j % 4) // 2
                i = i1 if h else i0
                inv = inv1 if h else inv0
                c = U(8 * (j // 4)) + col_t
                word = pack(o_acc[j] * inv, o_acc[j + 1] * inv)
                if i < nq and c < d:
                    out[bh, i, c] = uint16(word & U(0xFFFF))
                    if c + U(1) < d:
                        out[bh, i, c + U(1)] = uint16(word >> U(16))

    return Launcher(forward16, NBYTES)


# Under causal masking the forward's query blocks go round the heads (make_kernel's
# round_heads) from this many query blocks a head: bf16 forward GPU time round the heads over
# head by head, H100, 2026-12-07, two runs (docs/experiments.md row 47): 0.92-0.94x at 1k (6
# and 8 blocks a head: the round order reads Q, K, V from DRAM 3x, ~2.5 TB/s there, likely
# near bound), 0.973 / 0.985x at d = 64 4k (32 blocks), 1.034 / 1.032x at d = 128 4k (22),
# 1.035-1.078x at 16k (86 and 128 blocks). Provisional: nothing measured between 32 and 86
# blocks, and only at B*N = 16k.
ROUND_HEADS_FROM = 64


class _Launch:
    """kernel[grid, threads, stream](q, k, v, out, lse, scale, heads, group) as the registry
    launches a forward: scale turned into scale log2(e) (S is formed in units of log2); with
    tma, the TMA kernel where q, k, v allow it (tma.tma_ready; out 16-byte aligned) and its
    tensor maps; else the asynchronous kernel where q, k, v allow it
    (vector_io.AlignedDispatch), else the synchronous one; products: make_kernel's. Kernels
    without TMA take lse in place of `maps` (unused there)."""

    def __init__(self, D, causal, fmt, products, tma=False):
        self.block_m = tiles(D)[0]
        # (kernels head by head, kernels round the heads): the second only causal on wgmma
        self.tma, self.dispatch = [], []
        for round_heads in (False, True) if causal and products == "wgmma" else (False,):
            self.tma.append(make_kernel(D, causal, fmt, True, products, tma=True,
                                        round_heads=round_heads) if tma else None)
            self.dispatch.append(AlignedDispatch(
                make_kernel(D, causal, fmt, True, products, round_heads=round_heads),
                make_kernel(D, causal, fmt, False, products, round_heads=round_heads),
                positions=range(4), same_strides=[(1, 2)]))

    def which(self, nq):
        """0: the kernels head by head, 1: round the heads (causal wgmma, from
        ROUND_HEADS_FROM query blocks a head), for nq query rows."""
        return int(len(self.dispatch) > 1 and -(-nq // self.block_m) >= ROUND_HEADS_FROM)

    def __getitem__(self, config):
        stream = (*config, 0)[2]

        def launch(q, k, v, out, lse, scale, heads, group):
            which = self.which(q.shape[1])
            tma = self.tma[which]
            # in float32, as the backward forms it on the device
            scale_log2 = np.float32(scale) * np.float32(LOG2E)
            if tma is not None and tma_ready(q, k, v) and aligned(out):
                tma[config](q, k, v, out, lse, scale_log2, heads, group,
                            tensor_maps((q, k, v), stream))
            else:
                self.dispatch[which][config](q, k, v, out, lse, scale_log2, heads, group, lse)
        return launch


def make_forward_kernel(block_m, block_n, head_dim, causal, dtype, products="wgmma",
                        tma=False):
    """(launch, threads) for the registry: the kernel for head_dim's padded D and the format
    of dtype (check() first), its products on `products` ("wgmma": the wgmma16 pair; "mma":
    the mma16 pair); tma: Q, K, V staged by TMA where the arrays allow it (the wgmma16
    pairs)."""
    check(block_m, block_n, head_dim, dtype)
    return _launcher(padded(head_dim), bool(causal), half_format(dtype), products, tma), \
        threads(padded(head_dim))


@functools.lru_cache(maxsize=None)
def _launcher(D, causal, fmt, products, tma):
    """One _Launch a configuration (the API asks for it at every call)."""
    return _Launch(D, causal, fmt, products, tma)
