"""Forward on Hopper warpgroup products (wgmma, sm_90a; kernels/wgmma.py): float32, head dim up
to 64, 64 x 64 tiles, one warpgroup (128 threads) per Q block of 64 rows; both products 3xTF32,
each 8-long step of S summed from zero on the tensor core and added in float32, P V's steps
chained in the tensor core four at a time (REGISTERED pv_chained, since 2026-12-02).

Per Q block (rows i), over K/V blocks (rows j), FlashAttention's online softmax:
  S = (scale Q) K^T          A = scale Q, staged once (big and small parts) and read into
                             registers per step, B = K staged (K-major over the head dim);
  m_new = max(m, rowmax S),  P = exp(S - m_new), l = l exp(m - m_new) + rowsum P,
  O = O exp(m - m_new) + P V A = P straight from S's accumulator registers, B = V^T staged
                             (K-major over the keys, each 8 keys permuted; below);
and at the end O / l and lse = m + log l (rows that saw no key: O = 0, lse = -inf).

Why S is computed exactly as the lean wgmma backward computes it: the backward recomputes P
from S and lse, and at logits of 1e4 an ulp of S moves P by percents. Both pass A = scale Q as
register fragments holding the same TF32 parts (q * scale in float32, then mma.split_tf32; the
backward reads them from global memory, this kernel from its staged Q tile) and B = the K tile of
the same `stage`, and issue the same three wgmma per step, added into an accumulator that starts
at zero in step order; so the backward's S is this S bit for bit. Neither kernel exposes S;
the test is its effect at logits x1e3 (|S| ~ 1e6, an ulp of 0.06): on the H200 the backward's dv
erred 8.3e-07 after this forward and 5.6 after the fa2 forward's FFMA S (tests/
test_forward_wgmma.py checks the same on the simulator). (A B^T and (B A^T)^T are not always
bitwise on the tensor core, perf-notes version 13: the roles must match, and they do.)

P as wgmma's A operand without a trip through shared memory. S's accumulator (mma.m16n8k8's C
fragment, wgmma.position) gives a thread the keys 2t and 2t + 1 of every 8-key group of its two
rows; a register A fragment (wgmma.a_fragment_index) takes the contraction positions t and
t + 4 of the step. Staging V^T with each 8-key group permuted, position k holding key
2 (k % 4) + k // 4, makes the C fragment's entries (4s, 4s + 2, 4s + 1, 4s + 3) the A fragment
of step s as they stand (the trick of perf-notes version 12).

The row max and sum of a row live in the 4 threads of a quad (lanes 4g..4g+3): two warp shuffles
on a GPU; the simulator, which has no shuffles, exchanges them through shared memory (wgmma.py).

Shared memory: scale Q, K and V^T, each as big and small TF32 parts: 96 KiB, so two blocks share
an SM (170 registers, 168 with P V chained, no local memory; keeping Q's fragments in registers
instead took 255 registers with spills).

Measured on an H200 (2026-12-01, numba-flash bench, d = 64, not causal; notebooks/data/
wgmma-forward-h200-2026-12-01.txt): 26.1 / 30.4 / 34.4 / 35.0 TFLOP/s at N = 1k / 2k / 4k / 8k,
the fa2 forward 23.7 / 27.3 / 29.6 / 29.9 and torch's efficient backend 33.5-34.9 in the same
process; within the tolerance rule on every GPU case with d <= 64 in float32 (float64 and the
other cases run fa2), under the gpu-profile properties, memcheck and racecheck clean. Nsight Compute (N = 2k,
before the 16 loads): 2 warps per scheduler, 0.81 eligible, an instruction issued on 56 % of
cycles: latency-bound, as the backward was with one warp.
"""

import functools
import math

from numba import cuda, float32

from . import forward_fa2
from .backward_wgmma import (BLOCK, CHAIN_A, D_PAD, REGS, STEP_FLOATS, TILE, add, add_in_turn,
                             applies, clear, make_stage, put, simulator_launch)
from .common import (NEG_INF, SIMULATOR, U, DynamicSharedKernel, inlined_device_function,
                     kernel_jit, kv_head)
from .fa2_tiles import ALIGN
from .mma import split_tf32
from .wgmma import (CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, products, quad_max,
                    quad_sum)

# float offsets of the tiles, each big then small: scale Q, K, V^T permuted
Q_T, K_T, VT_T = 0, 2 * TILE, 4 * TILE
SCRATCH_AT = 6 * TILE          # the simulator's fragment and quad exchange (wgmma.py)
NBYTES = 4 * (6 * TILE + (SCRATCH if SIMULATOR else 0))

NEXT = TILE // WARPGROUP       # a thread's elements of a tile (prefetch)
# global loads in flight per thread while staging K and V: 16 ran 1.07-1.16x the 8 of the
# backward's staging (H200, 2026-12-01, tests/ab_forward_wgmma.py); 32 spills (255 registers)
STAGE_LOADS = 16


@inlined_device_function
def first_block(x, n_end, block):
    """The first K/V block (its first key) that Q block x takes under `rotate`: the x-th of
    the ceil(n_end / block) it sees, modulo their number (0 if none)."""
    blocks = (n_end + block - U(1)) // block
    return x % blocks * block if blocks > U(0) else U(0)


@inlined_device_function
def split_p_chain(a_big, a_small, p, s0):
    """The A fragments of P V's steps s0..s0 + CHAIN, split, into a_big, a_small (step s0 + s's
    at 4 s..): P's C-fragment entries 4s, 4s + 2, 4s + 1, 4s + 3 against the permuted V^T."""
    for s in range(CHAIN):
        for e in range(4):
            a_big[4 * s + e], a_small[4 * s + e] = split_tf32(p[4 * (s0 + s) + (e % 2) * 2
                                                                + e // 2])


@functools.lru_cache(maxsize=None)
def make_online_softmax(causal):
    """online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, n0, i0, i1, col_t, nq, nk): one
    K/V block's step of the online softmax on a warpgroup's 64 x 64 S (the accumulator entries
    s_acc of rows i0, i1 and keys n0 + col_t.., wgmma.position), in place: S masked (keys past
    nk; causal), m = max(m, rowmax S), alpha = exp(m_old - m_new), l = l alpha + rowsum P, and
    s_acc = P = exp(S - m); the caller rescales O by alpha. m, l, m_safe, alpha: the thread's
    two rows' (l its share of the row sum, m_safe m or 0 while a row has seen no key); the row
    max over the quad by quad_max (scratch: the simulator's exchange). Shared by forward_wgmma
    and forward_wgmma_wide."""
    @inlined_device_function
    def online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, n0, i0, i1, col_t, nq, nk):
        # mask, then the row max of this tile: the thread's 16 entries, then its quad's
        mx0, mx1 = float32(NEG_INF), float32(NEG_INF)
        for nt in range(REGS // 4):
            for e in range(4):
                j = 4 * nt + e
                key = n0 + U(8 * nt + e % 2) + col_t
                i = i1 if e // 2 else i0
                x = s_acc[j]
                if key >= nk or (causal and key + nq > i + nk):
                    x = float32(NEG_INF)
                s_acc[j] = x
                if e // 2:
                    mx1 = max(mx1, x)
                else:
                    mx0 = max(mx0, x)
        mx0 = quad_max(sm, scratch, mx0)
        mx1 = quad_max(sm, scratch, mx1)
        for h in range(2):
            m_new = max(m[h], mx1 if h else mx0)
            # guard: a row that has seen no key yet keeps m = -inf, P = 0, O = 0
            m_safe[h] = m_new if m_new != float32(NEG_INF) else float32(0.0)
            alpha[h] = math.exp(m[h] - m_safe[h])
            m[h] = m_new
            l[h] *= alpha[h]
        for j in range(REGS):
            h = (j % 4) // 2
            p = math.exp(s_acc[j] - m_safe[h])
            s_acc[j] = p
            l[h] += p
    return online_softmax


@inlined_device_function
def finish_rows(sm, scratch, lse, bh, m, l, i0, i1, t4, nq):
    """The end of the online softmax for the thread's rows i0, i1: l summed over the quad,
    lse = m + log l stored (-inf for a row that saw no key; l >= 1 wherever m is finite, the
    max entry giving exp 0); returns 1 / l of both rows (0 for such a row), O's factors."""
    l0 = quad_sum(sm, scratch, l[0])
    l1 = quad_sum(sm, scratch, l[1])
    if t4 == U(0):
        if i0 < nq:
            lse[bh, i0] = m[0] + math.log(l0) if l0 > float32(0.0) else float32(NEG_INF)
        if i1 < nq:
            lse[bh, i1] = m[1] + math.log(l1) if l1 > float32(0.0) else float32(NEG_INF)
    inv0 = float32(1.0) / l0 if l0 > float32(0.0) else float32(0.0)
    inv1 = float32(1.0) / l1 if l1 > float32(0.0) else float32(0.0)
    return inv0, inv1


# what the registered "wgmma" forward runs at d <= 64 (make_forward_kernel): P V chained,
# 1.00-1.04x its paired steps (H200, 2026-12-02, tests/ab_forward_wgmma.py; 168 registers)
REGISTERED = dict(pv_chained=True)


@functools.lru_cache(maxsize=None)
def make_wgmma_kernel(causal, prefetch=False, paired=True, loads=STAGE_LOADS, pv_chained=False,
                      rotate=False):
    """The kernel: grid (ceil(Nq / 64), B*H), 128 threads, arguments (q, k, v, out, lse, scale,
    heads, group) on (B*H, N, d) float32 device arrays, d <= 64 (the registry's contract).
    prefetch: the next K and V tiles are loaded into registers (2 x 32 per thread) while this
    one is computed, and split into shared memory after the barrier; False: each tile is
    loaded and staged after the barrier (its loads' latency in series with the compute).
    paired: two steps of a product per tensor-core wait (each from zero, added in step order:
    the same sums, half the round trips). loads: global loads in flight while staging.
    pv_chained: P V as two products of CHAIN steps chained in the tensor core (2 waits instead
    of 4 paired; forward_wgmma_wide's pv_chained); S is untouched. rotate (not with prefetch):
    Q block x takes its K/V blocks starting at the x-th (mod their number), so that the blocks
    of a head, which run at once, do not all read the same K and V rows at once (the same S
    and P, summed into l and O in another order)."""
    if prefetch and rotate:
        raise ValueError("rotate is not written for prefetch")
    PREFETCH, PAIRED, PV_CHAINED, ROTATE = prefetch, paired, pv_chained, rotate
    stage_k, fetch_k = make_stage(False, loads=loads)
    stage_vt, fetch_vt = make_stage(True, permuted=True, loads=loads)
    prod = products(BLOCK, D_PAD, D_PAD)
    step_regs, step2_regs = prod["step_3xtf32_regs"], prod["step2_3xtf32_regs"]
    chained_regs = prod["chained_3xtf32_regs"]
    online_softmax = make_online_softmax(causal)
    uBM = U(BLOCK)

    @inlined_device_function
    def q_fragment(sm, o):
        """scale Q's register A fragment (big, small) of step s, o = q_at + 64 s: q_at is
        Q_T + core_offset(row, t, 64), the fragment's other entries 32, 512 and 544 floats on
        (wgmma.a_fragment_index: k + 4, row + 8, both)."""
        return ((sm[o], sm[o + U(512)], sm[o + U(32)], sm[o + U(544)]),
                (sm[o + U(TILE)], sm[o + U(TILE + 512)], sm[o + U(TILE + 32)],
                 sm[o + U(TILE + 544)]))

    @inlined_device_function
    def p_fragment(p, s):
        """P's register A fragment (big, small) of step s: the C-fragment entries 4s, 4s + 2,
        4s + 1, 4s + 3, against the permuted V^T (module docstring)."""
        b0, s0 = split_tf32(p[4 * s])
        b1, s1 = split_tf32(p[4 * s + 2])
        b2, s2 = split_tf32(p[4 * s + 1])
        b3, s3 = split_tf32(p[4 * s + 3])
        return (b0, b1, b2, b3), (s0, s1, s2, s3)

    @inlined_device_function
    def s_steps(sm, s_acc, q_at, s):
        """s_acc += steps s (and s + 1 if PAIRED) of (scale Q) K^T."""
        a_big, a_small = q_fragment(sm, q_at + U(STEP_FLOATS * s))
        if PAIRED:
            a2_big, a2_small = q_fragment(sm, q_at + U(STEP_FLOATS * (s + 1)))
            add_in_turn(s_acc, step2_regs(sm, a_big, a_small, U(K_T), U(K_T + TILE), a2_big,
                                          a2_small, U(K_T + STEP_FLOATS),
                                          U(K_T + TILE + STEP_FLOATS), s, U(SCRATCH_AT)))
        else:
            add(s_acc, step_regs(sm, a_big, a_small, U(K_T), U(K_T + TILE), s, U(SCRATCH_AT)))

    @inlined_device_function
    def pv_steps(sm, o_acc, p, s):
        """o_acc += steps s (and s + 1 if PAIRED) of P V."""
        a_big, a_small = p_fragment(p, s)
        if PAIRED:
            a2_big, a2_small = p_fragment(p, s + 1)
            add_in_turn(o_acc, step2_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), a2_big,
                                          a2_small, U(VT_T + STEP_FLOATS),
                                          U(VT_T + TILE + STEP_FLOATS), s, U(SCRATCH_AT)))
        else:
            add(o_acc, step_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), s,
                                 U(SCRATCH_AT)))

    @inlined_device_function
    def pv_chain(sm, o_acc, p, a_big, a_small, s0):
        """o_acc += steps s0..s0 + CHAIN of P V, chained in the tensor core (one wait)."""
        split_p_chain(a_big, a_small, p, s0)
        add(o_acc, chained_regs(sm, a_big, a_small, U(VT_T), U(VT_T + TILE), s0,
                                U(SCRATCH_AT)))

    @kernel_jit(WARPGROUP)
    def forward_wgmma(q, k, v, out, lse, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        bh = U(cuda.blockIdx.y)
        kv = U(kv_head(cuda.blockIdx.y, heads, group))
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        row0 = U(cuda.blockIdx.x) * uBM
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
        k_next = cuda.local.array(NEXT, float32)         # prefetch: the next K/V tiles
        v_next = cuda.local.array(NEXT, float32)
        a_big = cuda.local.array(CHAIN_A, float32)       # pv_chained: P's A fragments, split
        a_small = cuda.local.array(CHAIN_A, float32)
        # scale Q, staged once as big and small parts; its A fragments are read from there
        stage_k(sm, U(Q_T), q, bh, row0, U(0), d, scale)
        q_at = U(Q_T) + warp * U(1024) + lane     # core_offset(row, t4, 64): see q_fragment
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
        clear(o_acc)

        n_end = nk
        if causal:      # key j is visible to query i iff j + nq <= i + nk; none past the block
            last = row0 + uBM + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = first_block(U(cuda.blockIdx.x), n_end, uBM) if ROTATE else U(0)
        first = n0
        if PREFETCH and n0 < n_end:
            fetch_k(k_next, k, kv, n0, d, float32(1.0))
            fetch_vt(v_next, v, kv, n0, d, float32(1.0))
        more = n0 < n_end
        while more:         # the K/V blocks from `first` round to the one before it
            cuda.syncthreads()                      # every warp is done with the last tiles
            if PREFETCH:
                put(sm, U(K_T), k_next)
                put(sm, U(VT_T), v_next)
            else:
                stage_k(sm, U(K_T), k, kv, n0, U(0), d, float32(1.0))
                stage_vt(sm, U(VT_T), v, kv, n0, U(0), d, float32(1.0))
            fence_proxy_async()
            cuda.syncthreads()
            n1 = n0 + uBM
            if PREFETCH and n1 < n_end:             # lands while this tile is computed
                fetch_k(k_next, k, kv, n1, d, float32(1.0))
                fetch_vt(v_next, v, kv, n1, d, float32(1.0))

            # S = (scale Q) K^T, the lean backward's steps (module docstring), written out
            # like P V's below: as a loop (which only moves shared-memory addresses) ptxas gave
            # 185 registers, 255 with spills under causal, against 170 and 172 as written
            clear(s_acc)
            s_steps(sm, s_acc, q_at, 0)
            if not PAIRED:
                s_steps(sm, s_acc, q_at, 1)
            s_steps(sm, s_acc, q_at, 2)
            if not PAIRED:
                s_steps(sm, s_acc, q_at, 3)
            s_steps(sm, s_acc, q_at, 4)
            if not PAIRED:
                s_steps(sm, s_acc, q_at, 5)
            s_steps(sm, s_acc, q_at, 6)
            if not PAIRED:
                s_steps(sm, s_acc, q_at, 7)

            online_softmax(sm, U(SCRATCH_AT), s_acc, m, l, m_safe, alpha, n0, i0, i1, col_t,
                           nq, nk)
            for j in range(REGS):
                o_acc[j] *= alpha[(j % 4) // 2]

            # O += P V: P's C fragment is the A fragment against the permuted V^T. Written out
            # with constant s: LLVM does not unroll a loop that holds a wgmma, and P (indexed
            # by the step) then lived in local memory (384 bytes of stack; common.py)
            if PV_CHAINED:
                pv_chain(sm, o_acc, s_acc, a_big, a_small, 0)
                pv_chain(sm, o_acc, s_acc, a_big, a_small, CHAIN)
            else:
                pv_steps(sm, o_acc, s_acc, 0)
                if not PAIRED:
                    pv_steps(sm, o_acc, s_acc, 1)
                pv_steps(sm, o_acc, s_acc, 2)
                if not PAIRED:
                    pv_steps(sm, o_acc, s_acc, 3)
                pv_steps(sm, o_acc, s_acc, 4)
                if not PAIRED:
                    pv_steps(sm, o_acc, s_acc, 5)
                pv_steps(sm, o_acc, s_acc, 6)
                if not PAIRED:
                    pv_steps(sm, o_acc, s_acc, 7)
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

    return simulator_launch(DynamicSharedKernel(forward_wgmma, NBYTES)), WARPGROUP


def make_forward_kernel(block_m, block_n, head_dim, causal, dtype, **options):
    """The registered "wgmma" forward: make_wgmma_kernel(causal) with its REGISTERED options
    (and **options over them) where
    backward_wgmma.applies (float32, d <= 64, 64 x 64 tiles, an sm_90 GPU or the simulator),
    forward_wgmma_wide's two-warpgroup kernel with its REGISTERED options (S and P V chained)
    where 64 < d <= 128 (128 x 64 tiles, the same conditions otherwise), the fa2 forward
    (FFMA) everywhere else."""
    from . import forward_wgmma_wide          # here: that module imports this one
    if applies(head_dim, dtype, block_m, block_n):
        return make_wgmma_kernel(bool(causal), **{**REGISTERED, **options})
    if forward_wgmma_wide.applies(head_dim, dtype, block_m, block_n):
        return forward_wgmma_wide.launcher(bool(causal),
                                           **{**forward_wgmma_wide.REGISTERED, **options})
    return forward_fa2.make_forward_kernel(block_m, block_n, head_dim, causal, dtype)


def default_blocks_or_fallback(head_dim, dtype):
    """(64, 64) where the wgmma kernel applies, (128, 64) where forward_wgmma_wide's does,
    else the fa2 forward's default tiles."""
    from . import forward_wgmma_wide
    if applies(head_dim, dtype):
        return BLOCK, BLOCK
    if forward_wgmma_wide.applies(head_dim, dtype):
        return forward_wgmma_wide.BLOCK_M, BLOCK
    return forward_fa2.default_blocks(head_dim, dtype)

