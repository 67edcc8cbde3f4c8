"""The Hopper backward on 16-bit inputs (wgmma, sm_90a): bfloat16 or float16 q, k, v, dO, O
read as stored, the five products on the tensor core in that format (sums in float32), P and
dS rounded to the format before they multiply (FlashAttention's rounding); the "wgmma16"
pair's backward (registry.py), after its forward (sm90/forward16.py).

    preprocess          D = rowsum(dO * O) in float32 and dq zeroed: every backward's
                        (kernels.backward.run_preprocess: a block's rows read coalesced),
                        with the 16-bit patterns unpacked (make_load)
    dK/dV kernel        two warpgroups per block of 128 keys, 64 keys each, over the query
                        heads that share its key head and their Q blocks (rows i), which
                        both read (half the Q/dO traffic of 64-key blocks):
      S^T = K Q^T       wgmma m64n64k16 (M = the keys, as FlashAttention's backward has it, so
                        that P^T and dS^T come out as register A operands), then scaled in
                        float32 as the forward scales S: the same products, the forward's
                        S bit for bit up to the tensor core's order of additions
      dP^T = V dO^T
      P = exp(S - lse_i), dS = P (dP - D_i)   (float32; 0 where masked; the exponential in
                        units of log2 by ex2.approx, as the forward's)
      dV += P^T dO      A = P^T rounded and packed (wgmma16.a_fragment16), B = dO read
                        transposed from its tile (wgmma16's b_rows: no transposed copies)
      dK += dS^T Q      A = dS^T likewise, B = Q likewise; dK times scale at the end
      dQ += dS K        both warpgroups' dS written to one 64 x 128 tile in shared memory
                        (queries as rows, the block's 128 keys as the contraction; on wgmma
                        the rounded words of dK's A operand stored transposed by stmatrix,
                        four a thread, wgmma16.store_transposed4), B = K of
                        both (one 128-row tile) read transposed; warpgroup w computes
                        head-dim columns w D / 2 .. (w + 1) D / 2 - 1 over all 128 keys,
                        times scale, added into dq (float32) with atomics: once per block of
                        128 keys, half the atomics of a dQ per warpgroup. At D = 64 the
                        product is issued at the next step's first barrier and waited for,
                        and its atomics issued, while that step's S^T and dP^T run (dS in
                        two tiles in turn: pipelined_dq)
K and V staged once, Q and dO in two stages (sm90.stage16): the next Q block arrives by
cp.async while this one is computed on (synchronously where the arrays are not 16-byte
aligned).
dK and dV are summed in registers over every Q block and head of the group and stored once,
rounded to the inputs' format in the kernel (the rounding the API gave float32 results:
nearest even; no float32 copies, no conversion kernels); in the asynchronous wgmma kernel
through the Q/dO stages, free by then, 16 bytes a store (stage16.make_store_rows); dq stays
float32 (added by atomics) and the API rounds it.

deterministic=True (no atomics) runs wgmma's widened backward instead (run_widened, which is
also the "wgmma16-tf32bwd" pair's backward: on the H200 the pair with this kernel was
1.02-1.97x that pair in forward+backward at 05:49 UTC, 2026-12-04, with one warpgroup a block
and P in base e; docs/performance.md).
"""

import functools

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from ..backward_fa2 import (check_tiles as fa2_check, run_backward as run_fa2,
                            shared_bytes as fa2_shared_bytes)
from ..mma16 import engine
from ..support import (ALIGN, NEG_INF, SHARED_PER_BLOCK_LEAST, SIMULATOR, U, Launcher, ceil_div,
                       exp2_approx, head_grid, head_index, inlined_device_function, kernel_jit,
                       make_recompute_p)
from ..vector_io import AlignedDispatch, add2, make_copies_wait
from ..backward import run_preprocess
from .backward import check_tiles, run_backward as run_tf32, tiles
from .operands import BLOCK, REGS
from .softmax import LOG2E
from .stage16 import make_plan, make_stage_pair, make_store_rows
from .wgmma import SCRATCH, WARPGROUP, fence_proxy_async
from .wgmma16 import (core_offset16, core_offset16_host, make_pack_half2, make_unpack_half,
                      make_wait, products16, store_transposed4)

P_WORDS = REGS // 2         # a 64 x 64 accumulator rounded, two entries to a word
HALF_D = 64                 # dK's and dV's head-dim columns per written-out group
STAGES = 2                  # Q/dO blocks in shared memory: one computed on, the next arriving
WARPGROUPS = 2              # consumers of each Q/dO block, 64 keys each
BLOCK_N = WARPGROUPS * BLOCK
THREADS = WARPGROUPS * WARPGROUP
copies_wait_all = make_copies_wait(0)


@functools.lru_cache(maxsize=None)
def make_load(fmt):
    """load(x) -> float32: the value of a stored 16-bit pattern of `fmt` (uint16), the
    preprocess's load (backward.run_preprocess: D = rowsum(dO * O) in float32, coalesced)."""
    unpack = make_unpack_half(fmt)

    @inlined_device_function
    def load(x):
        return unpack(U(x))
    return load


def pipelined_dq(D):
    """Whether the dK/dV kernel for D leaves a Q block's dQ product in flight into the next
    step (issued after the step's last barrier, waited for and added into dq while the next
    block's S^T and dP^T run on the tensor core; dS in two buffers): at D = 64. At D = 128
    the kernel holds 254 registers without it, and dQ's 32 accumulators more would spill."""
    return D == 64


def ds_buffers(D):
    """dS tiles in shared memory: two where a dQ product reads one while the next step's dS
    is written (pipelined_dq), else one."""
    return 2 if pipelined_dq(D) else 1


def shared_bytes(D):
    """Bytes of shared memory the dK/dV kernel for D takes on a GPU: K and V of both
    warpgroups, STAGES Q/dO blocks, the block's dS (64 queries x 128 keys, 16-bit; ds_buffers
    of them), a Q block's lse and D."""
    return 2 * (2 * WARPGROUPS * BLOCK * D + STAGES * 2 * BLOCK * D
                + ds_buffers(D) * BLOCK * BLOCK_N) + 4 * 2 * BLOCK


@functools.lru_cache(maxsize=None)
def make_dkdv_kernel(D, causal, fmt, asynchronous, products="wgmma"):
    """The dK/dV kernel for head dims up to D (64 or 128): grid (ceil(Nk / 128), B*Hk), 256
    threads, arguments (q, k, v, dout, lse, Dsum, dk, dv, dq, scale, heads, group): q, k, v,
    dout (B*H or B*Hk, N, d) uint16 patterns of `fmt`, lse and Dsum (B*H, Nq) float32, dk, dv
    (B*Hk, Nk, d) uint16 patterns of `fmt` (written rounded) and dq (B*H, Nq, d) float32
    (zeroed: added into); asynchronous: tiles
    staged with cp.async and, on wgmma, dq added in column pairs (q, k, v, dout, dq 16-byte
    aligned, d a multiple of 8), else element by element (stage16); products: the
    tensor-core engine, "wgmma" (sm_90a) or "mma" (mma.sync, sm_80+; kernels.mma16). Returns
    the launchable kernel."""
    if D not in (64, 128):
        raise ValueError(f"D must be 64 or 128, got {D}")
    # 16-bit element offsets: K, V of both warpgroups' keys once (warpgroup w's TILE w on);
    # Q and dO of a Q block in two stages; dS of both warpgroups' keys
    TILE = BLOCK * D
    K_AT, V_AT = 0, WARPGROUPS * TILE
    QDO_AT = 2 * WARPGROUPS * TILE              # Q of stage b at QDO_AT + 2 TILE b, dO TILE on
    DS_AT = QDO_AT + STAGES * 2 * TILE          # dS buffer u at DS_AT + DS_TILE u
    DS_TILE = BLOCK * BLOCK_N
    PIPELINED = pipelined_dq(D)
    # steps whose entries are all visible skip p_ds's tests (14 % of the loop's instructions
    # at D = 64, 13 % at 128); not at D = 128, where the second copy of the entries' code
    # made ptxas spill at 255 registers
    VISIBLE_STEPS = D == 64
    ELEMENTS = DS_AT + ds_buffers(D) * DS_TILE
    LSE_AT = ELEMENTS // 2                # floats: the Q block's lse and D (-inf, 0 past Nq)
    DSUM_AT = LSE_AT + BLOCK
    SCRATCH_AT = DSUM_AT + BLOCK          # the simulator's exchanges, per warpgroup
    NBYTES = shared_bytes(D) + (4 * WARPGROUPS * SCRATCH if SIMULATOR else 0)
    assert shared_bytes(D) == 2 * ELEMENTS + 4 * 2 * BLOCK
    ACC = D // 2                                              # dK's and dV's entries
    eng = engine(products, (products16, make_wait, fence_proxy_async))
    fence = eng.fence
    vector_dq = asynchronous and eng.vector_dq      # red.global.add.v2.f32 is sm_90's
    transposed_ds = eng.stmatrix                    # dS stored by stmatrix (sm_90)
    score = eng.products16(BLOCK, D, BLOCK, fmt)["ss_issue"]     # 64 keys x 64 queries, K = D
    # 64 keys x D, K = 64 queries, B = dO or Q read transposed from its tile
    grad = eng.products16(D, D, BLOCK, fmt, b_rows=D)
    grad_issue, grad_descriptor = grad["rs_issue"], grad["rs_descriptor"]
    # 64 queries x D / 2 head-dim columns, K = the block's 128 keys, B = K of both
    # warpgroups (one 128-row tile) read transposed
    DQ_N = D // 2
    dq_part = eng.products16(DQ_N, BLOCK_N, BLOCK_N, fmt, b_rows=D)["ss_issue"]
    # the products are issued in pairs and waited for in turn (wgmma.wait_group 1, then 0):
    # S^T and dP^T; dV and dK (dS stored meanwhile)
    wait_s_first, wait_acc_first = eng.make_wait(1, D // 2)
    wait_s_last, wait_acc_last = eng.make_wait(0, D // 2)
    wait_dq_before, _ = eng.make_wait(2, D // 2)     # pipelined: dQ, then S^T and dP^T issued
    KT_PART = int(core_offset16_host(0, DQ_N, D))          # column D / 2 of the K tile
    stage_kv = make_stage_pair(BLOCK_N, D, asynchronous, THREADS)  # K, then V: tokens x d
    stage_q_block = make_stage_pair(BLOCK, D, asynchronous, THREADS)      # Q, then dO (the first)
    plan = make_plan(BLOCK, D, THREADS)            # Q, then dO each step (cp.async)
    PER, plan_start, plan_stage_pair = plan.PER, plan.start, plan.stage_pair
    pack = make_pack_half2(fmt)
    recompute_p = make_recompute_p(float32, causal, base2=True)   # S, lse in log2 units
    # dK and dV through the Q/dO stages, 16 bytes a store (stmatrix: sm_90; dk, dv 16-byte
    # aligned, d a multiple of 8: the asynchronous kernel's dispatch)
    chunked_dkdv = asynchronous and eng.stmatrix
    store_rows = make_store_rows(D, fmt)
    assert STAGES >= WARPGROUPS         # a dK and a dV tile a warpgroup in the stages
    uBM = U(BLOCK)

    @inlined_device_function
    def zero(acc, nt):
        for e in range(4):
            acc[4 * nt + e] = float32(0.0)

    @inlined_device_function
    def zero_halves(dk_acc, dv_acc, c0):
        """Entries of head-dim columns c0 .. c0 + 63 of dK and dV, zeroed."""
        for nt in range(8):
            zero(dk_acc, c0 // 8 + nt)
            zero(dv_acc, c0 // 8 + nt)

    @inlined_device_function
    def store_dkdv(dk, dv, dk_acc, dv_acc, nt, hk, j0, j1, col_t, nk, d, scale):
        """dK (times scale) and dV entries 4 nt.. (keys j0, j1; columns 8 nt + col_t + 0, 1),
        rounded to the format, two columns to a word."""
        for h in range(2):
            key = j1 if h else j0
            c = U(8 * nt) + col_t
            e = 4 * nt + 2 * h
            wk = pack(dk_acc[e] * scale, dk_acc[e + 1] * scale)
            wv = pack(dv_acc[e], dv_acc[e + 1])
            if key < nk and c < d:
                dk[hk, key, c] = uint16(wk & U(0xFFFF))
                dv[hk, key, c] = uint16(wv & U(0xFFFF))
                if c + U(1) < d:
                    dk[hk, key, c + U(1)] = uint16(wk >> U(16))
                    dv[hk, key, c + U(1)] = uint16(wv >> U(16))

    # The per-entry work below goes 8 columns (4 entries) per call, each call written out with
    # a constant group nt: a loop over all 32 entries is not unrolled by LLVM (its body is too
    # large), and an array or tuple indexed by its counter then lives in local memory (ptxas:
    # 256 / 768 bytes of stack at d = 64 / 128 before this)

    @inlined_device_function
    def p_ds(st, dpt, s, dp, nt, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible):
        """Entries 4 nt..4 nt + 3 (keys j0, j1; queries m0 + 8 nt + col_t + 0, 1): P^T =
        exp(S^T - lse) = 2^(S^T scale log2 e - lse log2 e) where visible (the staged lse is
        in log2 units), dS^T = P^T (dP^T - D). visible (a constant at each call): every
        entry is, and no test is made."""
        for e in range(4):
            jj = 4 * nt + e
            c = U(8 * nt + e % 2) + col_t
            if visible:
                p = exp2_approx(s[jj] * scale_log2 - sm[U(LSE_AT) + c])
            else:
                p = recompute_p(s[jj] * scale_log2, sm[U(LSE_AT) + c], m0 + c,
                                j1 if e // 2 else j0, nq, nk)
            st[jj] = p
            dpt[jj] = p * (dp[jj] - sm[U(DSUM_AT) + c])

    @inlined_device_function
    def p_ds_all(st, dpt, s, dp, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible):
        """p_ds of the 8 groups, written out."""
        p_ds(st, dpt, s, dp, 0, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 1, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 2, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 3, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 4, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 5, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 6, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)
        p_ds(st, dpt, s, dp, 7, sm, m0, col_t, j0, j1, nq, nk, scale_log2, visible)

    @inlined_device_function
    def store_ds(sh, ds_at, dpt, nt, key, col_t):
        """Entries 4 nt.. of dS^T (block keys key, key + 8: the warpgroup's rows), rounded,
        into the block's dS tile at ds_at (queries as rows, K-major over the 128 keys), as
        dQ = dS K's A operand."""
        for e in range(4):
            word = pack(dpt[4 * nt + e], dpt[4 * nt + e])
            sh[ds_at + core_offset16(U(8 * nt + e % 2) + col_t, key + U(8 * (e // 2)),
                                     U(BLOCK_N))] = uint16(word & U(0xFFFF))

    @inlined_device_function
    def store_ds4(sh, sm, ds_at, words_ds, i, wg, warp, lane, scratch):
        """dS^T's rounded words 4 i..4 i + 3 (entries of column groups 2 i, 2 i + 1, rows g
        and g + 8, packed in pairs: four 8 x 8 matrices) into the block's dS tile by one
        stmatrix.trans (wgmma16.store_transposed4): lane L gives the row of matrix m = L // 8
        that holds query 8 (2 i + m // 2) + L % 8, at the warp's keys 8 (m % 2) on."""
        m = lane // U(8)
        query = U(16 * i) + (m // U(2)) * U(8) + lane % U(8)
        key = wg * uBM + warp * U(16) + (m % U(2)) * U(8)
        store_transposed4(sh, sm, ds_at + core_offset16(query, key, U(BLOCK_N)), words_ds,
                          4 * i, scratch)

    @inlined_device_function
    def add_dq(dq, part, nt, bh, m0, c0, row, col_t, nq, d, scale):
        """dq[bh, m0 + row.., c0 + col..] += scale * entries 4 nt.. of part, atomically: in
        pairs of adjacent columns (one red.global.add.v2.f32, vector_io.add2) on the
        asynchronous path of the wgmma engine (d a multiple of 8, dq 16-byte aligned:
        dispatch), else one by one."""
        if vector_dq:
            for h in range(2):
                i = m0 + row + U(8 * h)
                c = c0 + U(8 * nt) + col_t
                if i < nq and c < d:
                    add2(dq, bh, i, c, (part[4 * nt + 2 * h] * scale,
                                        part[4 * nt + 2 * h + 1] * scale))
        else:
            for e in range(4):
                i = m0 + row + U(8 * (e // 2))
                c = c0 + U(8 * nt + e % 2) + col_t
                if i < nq and c < d:
                    cuda.atomic.add(dq, (bh, i, c), part[4 * nt + e] * scale)

    @inlined_device_function
    def add_dq_all(dq, part, bh, m0, c0, row, col_t, nq, d, scale):
        """add_dq of the D / 16 groups of a warpgroup's D / 2 columns, written out."""
        add_dq(dq, part, 0, bh, m0, c0, row, col_t, nq, d, scale)
        add_dq(dq, part, 1, bh, m0, c0, row, col_t, nq, d, scale)
        add_dq(dq, part, 2, bh, m0, c0, row, col_t, nq, d, scale)
        add_dq(dq, part, 3, bh, m0, c0, row, col_t, nq, d, scale)
        if D > 64:
            add_dq(dq, part, 4, bh, m0, c0, row, col_t, nq, d, scale)
            add_dq(dq, part, 5, bh, m0, c0, row, col_t, nq, d, scale)
            add_dq(dq, part, 6, bh, m0, c0, row, col_t, nq, d, scale)
            add_dq(dq, part, 7, bh, m0, c0, row, col_t, nq, d, scale)

    @inlined_device_function
    def store_dkdv_half(dk, dv, dk_acc, dv_acc, g0, hk, j0, j1, col_t, nk, d, scale):
        """store_dkdv of the 8 groups g0.. (64 head-dim columns), written out."""
        store_dkdv(dk, dv, dk_acc, dv_acc, g0, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 1, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 2, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 3, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 4, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 5, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 6, hk, j0, j1, col_t, nk, d, scale)
        store_dkdv(dk, dv, dk_acc, dv_acc, g0 + 7, hk, j0, j1, col_t, nk, d, scale)

    @kernel_jit(THREADS)
    def dkdv16(q, k, v, dout, lse, Dsum, dk, dv, dq, scale, heads, group):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        kvh = head_index()
        if kvh >= k.shape[0]:
            return
        hk = U(kvh)
        wg = U(cuda.threadIdx.x) // U(WARPGROUP)     # this thread's warpgroup and its keys
        tid = U(cuda.threadIdx.x) % U(WARPGROUP)
        warp, lane = tid // U(32), tid % U(32)
        block0 = U(cuda.blockIdx.x) * U(BLOCK_N)
        n0 = block0 + wg * uBM                        # this warpgroup's keys n0 .. n0 + 63
        k_at, v_at = U(K_AT) + wg * U(TILE), U(V_AT) + wg * U(TILE)
        scratch = U(SCRATCH_AT) + wg * U(SCRATCH)
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        scale_log2 = scale * float32(LOG2E)
        dq_scale = scale                # dQ = scale dS K, added where each block's is in
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        j0, j1 = n0 + row, n0 + row + U(8)            # this thread's keys (accumulator rows)
        key = wg * uBM + row            # the same keys in the block's dS tile (and key + 8)
        st = cuda.local.array(REGS, float32)          # S^T, then P^T
        dpt = cuda.local.array(REGS, float32)         # dP^T, then dS^T
        words = cuda.local.array(P_WORDS, uint32)     # P^T rounded and packed
        words_ds = cuda.local.array(P_WORDS, uint32)  # dS^T rounded and packed
        dk_acc = cuda.local.array(ACC, float32)
        dv_acc = cuda.local.array(ACC, float32)
        zero_halves(dk_acc, dv_acc, 0)
        if D > HALF_D:
            zero_halves(dk_acc, dv_acc, HALF_D)
        # the query heads of this key head: b * heads + (hk % (heads / group)) * group + t,
        # each over its Q blocks from m_start: one sequence of `total` (head, Q block) steps
        heads_k = U(heads) // U(group)
        first_head = (hk // heads_k) * U(heads) + (hk % heads_k) * U(group)
        m_start = U(0)                  # the first Q block either warpgroup's keys need
        if causal and block0 + nq > nk:     # query i sees key j iff j + nq <= i + nk
            m_start = ((block0 + nq - nk) // uBM) * uBM
        blocks = (nq - m_start + uBM - U(1)) // uBM if nq > m_start else U(0)
        total = blocks * U(group)
        # the pipeline: K, V and the first Q block in flight; each step waits for its own
        # copies (one barrier), then starts the next Q block's (and loads its lse and D into
        # registers)
        stage_kv(sh, U(K_AT), k, v, hk, block0, nk, d)
        # where this thread's Q / dO chunks come from and go to (stage16.Plan)
        rows = cuda.local.array(PER, uint32)
        offsets = cuda.local.array(PER, uint32)
        shared = cuda.local.array(PER, uint32)
        row_bytes, head_bytes = uint64(q.strides[1]), uint64(q.strides[0])
        if asynchronous:
            plan_start(rows, offsets, shared, U(q.strides[1]), d)
        lse_next, d_next = float32(NEG_INF), float32(0.0)
        if total > U(0):
            stage_q_block(sh, U(QDO_AT), q, dout, first_head, m_start, nq, d)
            if wg == U(0) and tid < uBM and m_start + tid < nq:
                lse_next = lse[first_head, m_start + tid]
                d_next = Dsum[first_head, m_start + tid]
        step = U(0)
        b = U(0)
        ds_at = U(DS_AT)                # this step's dS tile (pipelined: two in turn)
        ds_last = U(DS_AT + DS_TILE) if PIPELINED else U(DS_AT)   # the step before's
        bh_last, m0_last = U(0), U(0)   # the Q block of the step before
        bh, m0 = first_head, m_start    # this step's query head and Q block (the heads' Q
        m_end = m_start + blocks * uBM  # blocks in turn, counted on: no division a step)
        while step < total:
            if PIPELINED:
                # the last block's dQ product (both warpgroups' dS stored and fenced for
                # wgmma before this barrier) issued here and waited for once this block's
                # S^T and dP^T are issued: it runs while they wait for this block's copies,
                # and its atomics while they run. Nothing is in flight across the loop's
                # back edge (ptxas serializes every wgmma of a kernel whose accumulators
                # cross it: C7514). At the first step it reads the other dS tile, unwritten,
                # and is not added.
                fence()
                cuda.syncthreads()
                part = dq_part(sh, ds_last, U(K_AT) + wg * U(KT_PART))
            # this Q block's lse and D for every warp: the last block's were last read before
            # the barrier above dQ in the step before
            if wg == U(0) and tid < uBM:
                sm[U(LSE_AT) + tid] = lse_next * float32(LOG2E)
                sm[U(DSUM_AT) + tid] = d_next
            # this Q block's copies (and K's, V's) waited for and fenced for wgmma before the
            # one barrier (none newer in flight: a fence waits for every copy); past it every
            # thread's have landed, and the last block's tiles and dS are read (the stage the
            # next block overwrites is free)
            if asynchronous:
                copies_wait_all()
            fence()
            cuda.syncthreads()
            step += U(1)
            bh1, m1 = bh, m0 + uBM          # the next step's
            if m1 == m_end:
                bh1, m1 = bh + U(1), m_start
            if step < total:
                at = U(QDO_AT) + (b ^ U(1)) * U(2 * TILE)
                if asynchronous:        # by the plan: where this thread's chunks go, once
                    plan_stage_pair(sh, at, q, dout, uint64(bh1) * head_bytes
                                    + uint64(m1) * row_bytes, nq - m1, rows, offsets, shared)
                else:
                    stage_q_block(sh, at, q, dout, bh1, m1, nq, d)
                lse_next, d_next = float32(NEG_INF), float32(0.0)
                if wg == U(0) and tid < uBM and m1 + tid < nq:
                    lse_next = lse[bh1, m1 + tid]
                    d_next = Dsum[bh1, m1 + tid]
            q_at = U(QDO_AT) + b * U(2 * TILE)
            do_at = q_at + U(TILE)

            s = score(sh, k_at, q_at)
            dp = score(sh, v_at, do_at)
            if PIPELINED:
                part = wait_dq_before(part)         # wait_group 2: S^T, dP^T stay in flight
                if step > U(1):                     # (step counts this block already)
                    add_dq_all(dq, part, bh_last, m0_last, wg * U(DQ_N), row, col_t, nq, d,
                               dq_scale)
            s = wait_s_first(s)
            dp = wait_s_last(dp)
            # entries: keys (rows) j0, j1; queries (columns) 8 nt + col_t + 0, 1. Every entry
            # visible (most steps): no tests; a row past nq or seeing no key (lse -inf) lies
            # in a block that fails this test (its last key is past the diagonal). At D = 64
            # (VISIBLE_STEPS)
            if VISIBLE_STEPS and m0 + uBM <= nq and n0 + uBM <= nk and \
                    (not causal or n0 + uBM - U(1) + nq <= m0 + nk):
                p_ds_all(st, dpt, s, dp, sm, m0, col_t, j0, j1, nq, nk, scale_log2, True)
            else:
                p_ds_all(st, dpt, s, dp, sm, m0, col_t, j0, j1, nq, nk, scale_log2, False)
            # dV += P^T dO, dK += dS^T Q (A from registers: entries 2w, 2w + 1 -> word w)
            for w in range(P_WORDS):
                words[w] = pack(st[2 * w], st[2 * w + 1])
                words_ds[w] = pack(dpt[2 * w], dpt[2 * w + 1])
            do_desc, q_desc = grad_descriptor(sh, do_at), grad_descriptor(sh, q_at)
            grad_issue(sh, sm, dv_acc, words, do_desc, scratch)
            grad_issue(sh, sm, dk_acc, words_ds, q_desc, scratch)
            # dS (rows: the queries) into shared memory for dQ = dS K: the words of dK's
            # A operand, transposed by stmatrix on sm_90 (4 a thread); element by element
            # on mma.sync (sm_80)
            if transposed_ds:
                store_ds4(sh, sm, ds_at, words_ds, 0, wg, warp, lane, scratch)
                store_ds4(sh, sm, ds_at, words_ds, 1, wg, warp, lane, scratch)
                store_ds4(sh, sm, ds_at, words_ds, 2, wg, warp, lane, scratch)
                store_ds4(sh, sm, ds_at, words_ds, 3, wg, warp, lane, scratch)
            else:
                store_ds(sh, ds_at, dpt, 0, key, col_t)
                store_ds(sh, ds_at, dpt, 1, key, col_t)
                store_ds(sh, ds_at, dpt, 2, key, col_t)
                store_ds(sh, ds_at, dpt, 3, key, col_t)
                store_ds(sh, ds_at, dpt, 4, key, col_t)
                store_ds(sh, ds_at, dpt, 5, key, col_t)
                store_ds(sh, ds_at, dpt, 6, key, col_t)
                store_ds(sh, ds_at, dpt, 7, key, col_t)
            wait_acc_first(dv_acc)
            wait_acc_last(dk_acc)
            if not PIPELINED:
                fence()
                cuda.syncthreads()
                # dQ of the block's 128 keys: this warpgroup's D / 2 head-dim columns
                part = dq_part(sh, ds_at, U(K_AT) + wg * U(KT_PART))
                add_dq_all(dq, wait_s_last(part), bh, m0, wg * U(DQ_N), row, col_t, nq, d,
                           dq_scale)
            else:       # the dS tiles in turn: this one is read by the next step's dQ
                ds_at, ds_last = ds_last, ds_at
            bh_last, m0_last = bh, m0
            bh, m0 = bh1, m1
            b ^= U(1)
        if PIPELINED and total > U(0):      # the last block's dQ
            fence()
            cuda.syncthreads()
            part = dq_part(sh, ds_last, U(K_AT) + wg * U(KT_PART))
            add_dq_all(dq, wait_s_last(part), bh_last, m0_last, wg * U(DQ_N), row, col_t, nq,
                       d, dq_scale)
        if asynchronous and total == U(0):
            copies_wait_all()               # K's and V's copies, never waited for

        if chunked_dkdv:
            # the Q/dO stages are free: every warpgroup's dV and dK products were waited for
            # before the last barrier (the last dQ's, or the last step's), and no copy is in
            # flight (none started at the last step; none at all when total is 0)
            tile = U(QDO_AT) + wg * U(2 * TILE)
            store_rows(sh, sm, dk, dk_acc, words, scale, scale, tile, hk, n0, warp, lane, nk,
                       d, scratch)
            store_rows(sh, sm, dv, dv_acc, words, float32(1.0), float32(1.0), tile + U(TILE), hk,
                       n0, warp, lane, nk, d, scratch)
            return
        store_dkdv_half(dk, dv, dk_acc, dv_acc, 0, hk, j0, j1, col_t, nk, d, scale)
        if D > HALF_D:
            store_dkdv_half(dk, dv, dk_acc, dv_acc, 8, hk, j0, j1, col_t, nk, d, scale)

    return Launcher(dkdv16, NBYTES)


@functools.lru_cache(maxsize=None)
def dkdv_launcher(D, causal, fmt, products="wgmma"):
    """The dK/dV kernel as run_backward launches it: the asynchronous one where q, k, v, dout
    and dq are 16-byte aligned, else the synchronous one (vector_io.AlignedDispatch); one a
    configuration (run_backward asks for it at every call)."""
    return AlignedDispatch(make_dkdv_kernel(D, causal, fmt, True, products),
                           make_dkdv_kernel(D, causal, fmt, False, products),
                           positions=(0, 1, 2, 3, 8), same_strides=[(0, 3)])


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal, fmt,
                 block_m=BLOCK, block_n=BLOCK, deterministic=False, stream=0,
                 products="wgmma"):
    """The 16-bit backward (registry contract, with the inputs as stored): dout, q, k, v, out
    (B*H or B*Hk, N, d) uint16 device arrays of `fmt` patterns, lse (B*H, Nq) float32; dq
    float32, dk, dv uint16 (`fmt` patterns) device arrays, written. The preprocess (D, dq
    zeroed), then the dK/dV kernel adding dQ with atomics, on `stream`; its products on
    `products` ("wgmma" or "mma", as make_dkdv_kernel), its blocks fixed (block_m, block_n
    are the widened backward's). deterministic=True: run_widened (no atomics; this kernel
    has no dQ pass yet)."""
    from ... import arrays
    check_widened_tiles(block_m, block_n, q.shape[2], products, deterministic)
    if deterministic:
        run_widened(dout, q, k, v, lse, out, dq, dk, dv, scale=scale, heads=heads, group=group,
                    causal=causal, fmt=fmt, block_m=block_m, block_n=block_n,
                    deterministic=True, stream=stream, products=products)
        return
    bh, nq, d = q.shape
    bhk, nk, _ = k.shape
    Dsum = arrays.empty_device((bh, nq), np.float32)
    run_preprocess(dout, out, Dsum, dq, clear=True, stream=stream, load=make_load(fmt))
    kernel = dkdv_launcher(64 if d <= 64 else 128, bool(causal), fmt, products)
    kernel[(ceil_div(nk, BLOCK_N), *head_grid(bhk)), THREADS, stream](
        q, k, v, dout, lse, Dsum, dk, dv, dq, np.float32(scale), heads, group)


def widened_tiles(d, products, deterministic):
    """(block_m, block_n) of the widened backward that run_widened runs: wgmma's tiles, or
    for products="mma" fa2's (deterministic: its dQ kernel; else with dQ atomics), the
    largest square tiles whose shared memory fits every sm_80+ GPU (fa2's own defaults are
    sized for the H200's 227 KiB: 64 x 64 at d = 128 takes 170 KB, more than an A100's 163)."""
    if products == "wgmma":
        return tiles(d)
    for block in (64, 32, 16):
        if fa2_shared_bytes(block, block, d, 4, dq_atomic=not deterministic) \
                <= SHARED_PER_BLOCK_LEAST:
            return block, block
    raise ValueError(f"no fa2 tile fits head dim {d}")


def check_widened_tiles(block_m, block_n, d, products, deterministic):
    """ValueError unless the widened backward of `products` takes these tiles."""
    if products == "wgmma":
        check_tiles(block_m, block_n, d, np.float32)
    else:
        fa2_check(block_m, block_n, d, np.float32, deterministic)


def run_widened(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal, fmt,
                block_m=BLOCK, block_n=BLOCK, deterministic=False, stream=0,
                products="wgmma"):
    """wgmma's backward (3xTF32, two products a step for half values; products="mma": fa2's,
    for GPUs without wgmma) on the 16-bit inputs widened to float32 on the device: the
    "wgmma16-tf32bwd" pair's backward, and run_backward's with deterministic=True.
    Arguments as run_backward's: its float32 dK and dV are rounded into dk, dv."""
    from ... import arrays
    from .. import convert
    wide = []
    for x in (dout, q, k, v, out):
        w = arrays.empty_device(x.shape, np.float32)
        convert.widen(x.view(arrays.device_dtype(fmt)), w, fmt, stream)
        wide.append(w)
    dk32, dv32 = (arrays.empty_device(x.shape, np.float32) for x in (dk, dv))
    if products == "mma":
        run_fa2(*wide[:4], lse, wide[4], dq, dk32, dv32, scale=scale, heads=heads,
                group=group, causal=causal, block_m=block_m, block_n=block_n,
                dq_atomic=not deterministic, stream=stream)
    else:
        run_tf32(*wide[:4], lse, wide[4], dq, dk32, dv32, scale=scale, heads=heads,
                 group=group, causal=causal, block_m=block_m, block_n=block_n,
                 deterministic=deterministic, stream=stream, half=True)
    for wide_grad, grad in ((dk32, dk), (dv32, dv)):
        convert.narrow(wide_grad, grad.view(arrays.device_dtype(fmt)), fmt, stream)
