"""The Hopper backward (wgmma, sm_90a), float32 through 3xTF32, 64 x 64 tiles: one block per
K/V block of 64 keys, over the query heads sharing its key head and their Q blocks, which it
walks round from a block of its own (K/V block x starts at Q block x mod their number, so that
the blocks of a head, running at once, add into different dQ rows).

    d <= 64:        make_lean_kernel, one warpgroup (128 threads), 96 KiB of shared memory
                    (K, V and one 64 x 64 score tile), two blocks per SM.
    64 < d <= 128:  make_wide_kernel, two warpgroups (256 threads), the head dim in two halves
                    of 64, P and dS formed by each on half the keys; 224 KiB (K's halves,
                    V's, P^T, dS^T, dS), one block per SM.

Per Q block (rows i), with the forward's operand roles (M = i):
  S = (scale Q) K^T formed as the forward formed it (sm90.operands), dP = dO V^T;
  P = exp(S - lse_i) (support.make_recompute_p; the causal wide kernel: softmax.causal_key_limits,
  exp_where),
  dS = P (dP - D_i), D = rowsum(dO * O)
  (kernels/backward.py's preprocess);
  dV^T += dO^T P and dK^T += (scale Q)^T dS (M = the head dim, B = P^T, dS^T staged);
  dQ^T = K^T dS^T (A: the K tile read transposed, B = dS staged), times scale, added into dq
  with atomics: two adjacent head-dim columns of a dq row per red.global.add.v2.f32 where dq
  is 8-byte aligned (vector_atomics; AlignedDispatch runs the scalar twin otherwise).

deterministic=True, d <= 64: the lean kernel adds dQ itself in a fixed order, the K/V blocks'
(make_lean_kernel's ordered: a count per (head, Q block), each block waiting for the ones
before it); d > 64: the wide dK/dV kernel without its dQ (dq_out=False), then the dQ pass
(sm90/dq.py): one block per Q block, over the K/V blocks, recomputing S with the forward's
own code (sm90.forward's S formation on the same staged tiles), dP, dS, and dQ = dS K summed
in the block's registers in a fixed order: no atomics. Both bitwise reproducible.
Registers and spills: tools/ptxas_check.py; figures: docs/performance.md.
"""

import functools

import numpy as np
from numba import cuda, float32

from ..backward import run_preprocess
from ..mma import split_tf32
from ..support import (ALIGN, SIMULATOR, U, Launcher, ceil_div, device_function, head_grid,
                       head_index, inlined_device_function, kernel_jit, make_recompute_p)
from ..vector_io import AlignedDispatch
from ..vector_io import add2_if_below as red_add2_if_below
from .dq import run_dq
from .operands import (BLOCK, CHAIN_A, D_PAD, HALF, REGS, STEP_FLOATS, STEPS, TILE, add, add2,
                       add_in_turn, clear, make_chain_fragments, make_global_fragment,
                       make_row_elements_permuted, make_stage, row_stats, row_views, split_chain,
                       split_fragment, transposed_fragment_chain_paired,
                       transposed_fragment_paired_permuted)
from .softmax import causal_key_limits, exp_where
from .wgmma import CHAIN, SCRATCH, WARPGROUP, fence_proxy_async, position, products

D_WIDE = 2 * D_PAD          # the wide kernel's head dim, zero-padded: two halves of 64
DQ_ARG = 8                  # dq's position in the dK/dV kernels' arguments
# lean: K (0) and V (2 TILE), then one per-Q-block tile (P^T, then dS^T, then dS), each big +
# small
K_T, V_T, W_T = 0, 2 * TILE, 4 * TILE
LEAN_SCRATCH_AT = 6 * TILE  # the simulator's fragment exchange (wgmma.step_3xtf32_regs)
LEAN_NBYTES = 4 * (6 * TILE + (SCRATCH if SIMULATOR else 0))
# wide: K's halves, V's halves, then P^T, dS^T (rows j, K-major over i), dS (rows i)
WIDE_K_T, WIDE_V_T, PT_T, DST_T, DS_T = 0, 2 * HALF, 4 * HALF, 5 * HALF, 6 * HALF
WIDE_SCRATCH_AT = 7 * HALF  # one SCRATCH per warpgroup
WIDE_NBYTES = 4 * (7 * HALF + (2 * SCRATCH if SIMULATOR else 0))


def tiles(d):
    """(block_m, block_n): (64, 64), the only tiles the Hopper backward has."""
    return BLOCK, BLOCK


def check_tiles(block_m, block_n, d, dtype, deterministic=False):
    """ValueError unless float32, 1 <= d <= 128 and 64 x 64 tiles."""
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"the wgmma backward is float32 only, got {np.dtype(dtype)}")
    if not 1 <= d <= D_WIDE:
        raise ValueError(f"the wgmma backward needs 1 <= d <= {D_WIDE}, got {d}")
    if (block_m, block_n) != (BLOCK, BLOCK):
        raise ValueError(f"the wgmma backward has 64 x 64 tiles only, got block_m={block_m}, "
                         f"block_n={block_n}")


def _make_add_dq_pairs(vector):
    """add_dq_pairs (vector: one red.global.add.v2.f32 per pair) or add_dq_pairs_by_element
    (two scalar atomics per pair)."""
    VECTOR = vector

    @cuda.jit(device=True)     # (cuda.atomic: not a plain function on the simulator)
    def add_pairs(dq, bh, m0, nq, d, dq_acc, scale, rows, lane):
        g4, t4 = lane // U(4), lane % U(4)
        c = U(16) * rows + U(2) * g4
        i0 = U(m0 + t4 * U(2))
        for nt in range(REGS // 4):
            for b in range(2):
                i = U(i0 + U(8 * nt + b))
                x0, x1 = dq_acc[4 * nt + b] * scale, dq_acc[4 * nt + 2 + b] * scale
                if VECTOR:      # rows i0 + 8 nt + b as offsets below one address
                    red_add2_if_below(dq, bh, i0, c, U(8 * nt + b), (x0, x1),
                                      i < nq and c < d)
                else:
                    if i < nq and c < d:
                        cuda.atomic.add(dq, (bh, i, c), x0)
                    if i < nq and c + U(1) < d:
                        cuda.atomic.add(dq, (bh, i, c + U(1)), x1)
    return add_pairs


# dQ for an accumulator whose A was read by transposed_fragment_paired_permuted (lean) or
# _chain_paired (wide): entries e and e + 2 are head-dim columns c and c + 1 (c even) of one dq
# row.
# add_dq_pairs: one predicated red.global.add.v2.f32 per pair (vector_io.add2_if_below: d even
# and dq's rows 8-byte aligned, the caller's promise), its rows offsets below one address:
# half the atomic instructions, each changing 8 bytes, and no branch around them.
# add_dq_pairs_by_element: two scalar atomics per pair (any d, any alignment).
add_dq_pairs = _make_add_dq_pairs(True)
add_dq_pairs_by_element = _make_add_dq_pairs(False)


@device_function
def store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, warp, lane):
    """dK^T and dV^T's accumulators (rows: the head dim, columns: keys n0..) into dk, dv, their
    rows paired (make_accumulate_w's A is paired): the thread's entries e and e + 2 of each
    4 are head-dim columns 16 warp + 2 g and + 1 (g = lane // 4), where wgmma.position has
    rows 16 warp + g and + 8."""
    g = lane // U(4)
    for j in range(REGS):
        _, jl = position(j, warp, lane)
        c = warp * U(16) + U(2) * g + U((j % 4) // 2)
        if n0 + U(jl) < nk and c < d:
            dk[kvh, n0 + U(jl), c] = dk_acc[j]
            dv[kvh, n0 + U(jl), c] = dv_acc[j]


@functools.lru_cache(maxsize=None)
def make_accumulate_w(x_exact=False, vector=False):
    """accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch): acc += X^T W
    over 8 steps, two per wait, W the 64 x 64 tile at sm[w_at] (K-major over i), X = mult
    src[head, row0:row0+64] from global memory, X^T's rows the head-dim rows 16 warp.., paired
    (make_global_fragment's paired: acc's rows as store_dkdv reads them); each pair's elements
    loaded while the pair before is computed. x_exact: X holds values exact in TF32 (half dO,
    mult 1): its zero small part's products are not issued. vector: 8-byte loads (src 16-byte
    aligned, d % 4 == 0)."""
    step2_regs = products(BLOCK, D_PAD, D_PAD, "a" if x_exact else None)["step2_3xtf32_regs"]
    elements_t = make_global_fragment(True, split=False, paired=True, vector=vector)

    @cuda.jit(device=True)
    def accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch):
        x = elements_t(src, head, row0, 0, d, warp, lane)
        x2 = elements_t(src, head, row0, 1, d, warp, lane)
        for s2 in range(STEPS // 2):
            s = 2 * s2
            # (past the last pair: the next Q block's rows; loaded, not used)
            a_big, a_small = split_fragment(x, mult)
            a2_big, a2_small = split_fragment(x2, mult)
            x = elements_t(src, head, row0, s + 2, d, warp, lane)
            x2 = elements_t(src, head, row0, s + 3, d, warp, lane)
            add_in_turn(acc, step2_regs(sm, a_big, a_small, w_at, w_at + U(TILE), a2_big,
                                        a2_small, w_at + U(STEP_FLOATS),
                                        w_at + U(TILE + STEP_FLOATS), s, scratch))
    return accumulate_w


@functools.lru_cache(maxsize=None)
def make_accumulate_w_chained(x_exact=False, vector=False):
    """accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch, x, a_big,
    a_small): make_accumulate_w's acc += X^T W as STEPS // CHAIN products of CHAIN steps, each
    chained in the tensor core (one wait each), through the local arrays x, a_big, a_small
    (CHAIN_A entries); each product's elements loaded while the one before is computed
    (past the last: the next Q block's rows, loaded, not used). x_exact, vector and the
    paired rows: as make_accumulate_w's."""
    chained_regs = products(BLOCK, D_PAD, D_PAD,
                            "a" if x_exact else None)["chained_3xtf32_regs"]
    chain_elements_t = make_chain_fragments(True, vector=vector, paired=True)

    @cuda.jit(device=True)
    def accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch, x, a_big,
                     a_small):
        chain_elements_t(x, src, head, row0, U(0), d, warp, lane)
        for g in range(STEPS // CHAIN):
            split_chain(a_big, a_small, x, mult)
            chain_elements_t(x, src, head, row0, U(CHAIN * (g + 1)), d, warp, lane)
            add(acc, chained_regs(sm, a_big, a_small, w_at, w_at + U(TILE), CHAIN * g,
                                  scratch))
    return accumulate_w


@functools.lru_cache(maxsize=None)
def make_sdp_elements(views, vector=False):
    """(rows, step_elements): how the lean kernel reads the A elements of S's and dP's steps
    (Q's and dO's rows i0, i1 of a Q block, make_global_fragment's global_elements):
    rows(src, bh, i0, i1) once a Q block, then step_elements(row0, row1, src, bh, m0, valid0,
    valid1, s, d, warp, lane) a step. views: from two 1-D row views indexed by column
    (operands.row_views: the S/dP step 233 -> 203 SASS instructions), else from (head, row,
    column) at every step, element by element. Both are step-permuted (make_global_fragment's
    step_permuted, as the K and V tiles are staged); vector (views): each row's pair one 8-byte
    load (per step, 8-byte pairs spilled and ran slower, below). Which kernel takes
    which (GPU time at d = 64 against the unpermuted kernels, H100, 2026-12-07): the causal
    kernel with dQ the views and 8-byte pairs (1.03x forward+backward); the unmasked one with
    dQ the per-step form, 4-byte (1.003-1.006x; with the views and pairs it spilled 8 bytes
    and ran 0.97-0.98x); the deterministic path's (no dQ) the per-step form, 4-byte (with
    8-byte pairs its causal one ran 0.97-0.98x; with views it spilled, 40 -> 64 bytes)."""
    elements = make_global_fragment(False, split=False, step_permuted=True)
    if views:
        def rows(src, bh, i0, i1):
            return row_views(src, bh, i0, i1)

        row_elements_permuted = make_row_elements_permuted(vector)

        def step_elements(row0, row1, src, bh, m0, valid0, valid1, s, d, warp, lane):
            return row_elements_permuted(row0, row1, valid0, valid1, s, d, lane)
    else:
        def rows(src, bh, i0, i1):
            return src, src                      # (unused)

        def step_elements(row0, row1, src, bh, m0, valid0, valid1, s, d, warp, lane):
            return elements(src, bh, m0, s, d, warp, lane)
    return inlined_device_function(rows), inlined_device_function(step_elements)


@functools.lru_cache(maxsize=None)
def make_lean_kernel(causal, vector_atomics=False, vector_loads=False, dq_out=True,
                     half=False, ordered=False):
    """The dK/dV/dQ kernel for d <= 64: grid (ceil(Nk / 64), B*Hk), 128 threads, arguments (q,
    k, v, dout, lse, D, dk, dv, dq, scale, heads, group) on (B*H, N, d) float32 arrays, dq
    holding zeros. K and V staged, every A operand read from global memory (Q, dO and their
    transposes) or from the K tile (K^T) into registers, and one 64 x 64 tile that holds P^T
    for dV^T += dO^T P, then dS^T for dK^T += Q^T dS, then dS for dQ^T = K^T dS^T. S and dP
    one step each per wait, the accumulating products two steps per wait; the A fragments
    from global memory loaded a step (S, dP) or a pair of steps ahead.
    S's and dP's contraction is permuted within each step (K, V staged with make_stage(False,
    permuted=True), Q's and dO's A pairs read by make_sdp_elements), as the forward forms S.
    dQ^T's A rows paired (transposed_fragment_paired_permuted), its entries e and e + 2 two
    adjacent columns of a dq row. vector_atomics: dQ added by add_dq_pairs, one vector atomic
    per two columns (d even, dq's rows 8-byte aligned: run_backward's AlignedDispatch checks),
    else add_dq_pairs_by_element. vector_loads: S's and dP's A pairs (the causal kernel with
    dQ: make_sdp_elements says why) and dV's and dK's A (dO^T, Q^T, as pairs of adjacent head-dim
    columns) read 8 bytes at a time (q, dout 16-byte aligned, d % 4 == 0: the dispatch).
    dq_out=False: dQ is neither formed nor added (the deterministic path's dK/dV kernel; dq is
    not read).
    half: q, k, v, dout hold half values (exact in TF32): S and dP skip the products of K's
    and V's zero small parts, dV those of dO's, dQ those of K^T's (wgmma.products' exact);
    dK's A is scale Q, not exact, and keeps all three.
    ordered (with dq_out; the deterministic backward at d <= 64): dQ added in a fixed order,
    FlashAttention-3's deterministic mode. The K/V blocks are taken last first (block x of the
    grid holds K/V block kb = gridDim.x - 1 - x) and each from its m_start up (no rotation);
    into Q block b they add in that order, from the last K/V block that adds there (kmax, below
    the causal diagonal's) down, each waiting until sem[bh, b] (int32, zeros at launch) counts
    the ones before it (kmax - kb), adding, then counting itself in. A K/V block higher than kb
    starts at or after kb's m_start, so it reaches Q block b no later than kb does (causal: kb
    seldom waits more than for the adds); it is also launched before kb, so no block waits on
    one launched after it. The kernel takes sem after group. On the simulator blocks run one
    at a time in index order: the count is there when a block asks, and a wrong one raises."""
    DQ_OUT = dq_out
    ORDERED = ordered and dq_out
    # K's tile step-permuted: dQ^T's A rows read where they are, paired
    dq_fragment = transposed_fragment_paired_permuted
    add_dq_acc = add_dq_pairs if vector_atomics else add_dq_pairs_by_element
    rows, step_elements = make_sdp_elements(causal and dq_out, vector_loads and causal and dq_out)
    step2_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["step2_3xtf32_regs"]
    step2_regs_dq = products(BLOCK, D_PAD, D_PAD, "a" if half else None)["step2_3xtf32_regs"]
    # the causal kernel's P indices and causal sums in 32 bits where it writes dQ (by atomics)
    # and loads by vectors (Numba widens a sum of uint32s to 64): fwd+bwd 1.016 / 1.019 /
    # 1.005x at d = 64 causal N = 1k / 4k / 16k, unmasked 0.997-1.002x (A/B on its own against
    # main, H100, 2026-12-07 13:57, docs/experiments.md row 54); in the unmasked kernel its
    # backward (fwd+bwd less fwd, row 53's tree) ran 0.96-0.97x, and the scalar and
    # deterministic kernels spilled with it (docs/performance.md History 12-07 10:35, 11:35)
    SUMS32 = causal and dq_out and vector_loads
    recompute_p = make_recompute_p(float32, causal, select=True, sums32=SUMS32)
    stage = make_stage(False, permuted=True)    # K and V: S's and dP's contraction permuted
    uBM = U(BLOCK)
    accumulate_dv = make_accumulate_w(half, vector_loads)
    accumulate_w = make_accumulate_w(False, vector_loads)

    @inlined_device_function
    def lean(sm, q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group, sem):
        head = head_index()                # index into B*Hk
        if head >= k.shape[0]:      # a block past the last head (support.head_grid)
            return
        kvh = U(head)
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        if ORDERED:     # the last K/V block first (see above)
            kb = U(cuda.gridDim.x) - U(1) - U(cuda.blockIdx.x)
        else:
            kb = U(cuda.blockIdx.x)
        n0 = kb * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        s_acc = cuda.local.array(REGS, float32)      # S, then P
        dp_acc = cuda.local.array(REGS, float32)     # dP, then dS
        dk_acc = cuda.local.array(REGS, float32)     # dK^T (rows: head dim, columns: j)
        dv_acc = cuda.local.array(REGS, float32)     # dV^T
        dq_acc = cuda.local.array(REGS, float32)     # dQ^T of this block (rows: head dim)
        clear(dk_acc)
        clear(dv_acc)
        stage(sm, U(K_T), k, kvh, n0, U(0), d, float32(1.0))
        stage(sm, U(V_T), v, kvh, n0, U(0), d, float32(1.0))
        m_start = U(0)
        if causal and n0 + nq > nk:
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b_idx = U(head // kv_heads)
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        pt_base = (warp * U(4) + g4 // U(4)) * U(32) + t4 * U(8) + g4 % U(4)
        # dS (rows i, K-major over j): core_offset(row, col_t, 64)
        ds_base = warp * U(1024) + (t4 // U(2)) * U(32) + g4 * U(4) + (t4 % U(2)) * U(2)
        fence_proxy_async()
        cuda.syncthreads()
        for g in range(group):
            bh = b_idx * U(heads) + U(head % kv_heads) * U(group) + U(g)
            # the Q blocks m_start.. in turn, from `first` round to the one before it
            first = m_start
            if not ORDERED:
                first += U(cuda.blockIdx.x) % ((nq - m_start + uBM - U(1)) // uBM) * uBM
            m0 = first
            while True:
                i0, i1 = m0 + row, m0 + row + U(8)
                lse0, lse1, D0, D1 = row_stats(lse, Dvec, bh, i0, i1, nq)
                clear(s_acc)
                clear(dp_acc)
                v0, v1 = i0 < nq, i1 < nq     # rows past nq: zeros, as before (P = 0 there)
                q0, q1 = rows(q, bh, i0, i1)
                do0, do1 = rows(dout, bh, i0, i1)
                xq = step_elements(q0, q1, q, bh, m0, v0, v1, 0, d, warp, lane)
                xdo = step_elements(do0, do1, dout, bh, m0, v0, v1, 0, d, warp, lane)
                for s in range(STEPS):
                    # (past the last step: zeros, columns >= d; nothing loaded)
                    q_big, q_small = split_fragment(xq, scale)
                    do_big, do_small = split_fragment(xdo, float32(1.0))
                    xq = step_elements(q0, q1, q, bh, m0, v0, v1, s + 1, d, warp, lane)
                    xdo = step_elements(do0, do1, dout, bh, m0, v0, v1, s + 1, d, warp, lane)
                    add2(s_acc, dp_acc, step2_regs(sm, q_big, q_small, U(K_T), U(K_T + TILE),
                                                   do_big, do_small, U(V_T), U(V_T + TILE), s,
                                                   U(LEAN_SCRATCH_AT)))
                for nt in range(REGS // 4):
                    for e in range(4):
                        j = 4 * nt + e
                        hi, b = e // 2, e % 2
                        il = row + U(8 * hi)
                        jl = U(8 * nt + b) + col_t
                        if SUMS32:
                            p = recompute_p(s_acc[j], lse1 if hi else lse0, U(m0 + il),
                                            U(n0 + jl), nq, nk)
                        else:
                            p = recompute_p(s_acc[j], lse1 if hi else lse0, m0 + il, n0 + jl,
                                            nq, nk)
                        s_acc[j] = p
                        dp_acc[j] = p * (dp_acc[j] - (D1 if hi else D0))
                        off = pt_base + U(512 * nt + 64 * hi + 4 * b)
                        pb, ps = split_tf32(p)
                        sm[U(W_T) + off] = pb
                        sm[U(W_T + TILE) + off] = ps
                fence_proxy_async()
                cuda.syncthreads()
                accumulate_dv(sm, dv_acc, U(W_T), dout, bh, m0, float32(1.0), d, warp, lane,
                             U(LEAN_SCRATCH_AT))
                cuda.syncthreads()                     # P^T read by every warp
                for nt in range(REGS // 4):
                    for e in range(4):
                        off = pt_base + U(512 * nt + 64 * (e // 2) + 4 * (e % 2))
                        db, dsm = split_tf32(dp_acc[4 * nt + e])
                        sm[U(W_T) + off] = db
                        sm[U(W_T + TILE) + off] = dsm
                fence_proxy_async()
                cuda.syncthreads()
                accumulate_w(sm, dk_acc, U(W_T), q, bh, m0, scale, d, warp, lane,
                             U(LEAN_SCRATCH_AT))
                cuda.syncthreads()                     # dS^T read by every warp
                if DQ_OUT:
                    for nt in range(REGS // 4):
                        for hi in range(2):
                            off = ds_base + U(512 * hi + 64 * nt)
                            db0, dsm0 = split_tf32(dp_acc[4 * nt + 2 * hi])
                            db1, dsm1 = split_tf32(dp_acc[4 * nt + 2 * hi + 1])
                            sm[U(W_T) + off] = db0
                            sm[U(W_T) + off + U(1)] = db1
                            sm[U(W_T + TILE) + off] = dsm0
                            sm[U(W_T + TILE) + off + U(1)] = dsm1
                    fence_proxy_async()
                    cuda.syncthreads()
                    clear(dq_acc)
                    for s2 in range(STEPS // 2):
                        s = 2 * s2
                        a_big, a_small = dq_fragment(sm, U(K_T), s, warp, lane)
                        a2_big, a2_small = dq_fragment(sm, U(K_T), s + 1, warp, lane)
                        add_in_turn(dq_acc, step2_regs_dq(sm, a_big, a_small, U(W_T),
                                                       U(W_T + TILE), a2_big, a2_small,
                                                       U(W_T + STEP_FLOATS),
                                                       U(W_T + TILE + STEP_FLOATS), s,
                                                       U(LEAN_SCRATCH_AT)))
                    if ORDERED:     # wait for the K/V blocks above this one (see above)
                        kmax = U(cuda.gridDim.x) - U(1)
                        if causal:  # the last K/V block that adds into this Q block
                            kmax = min(kmax, (m0 + uBM + nk - nq - U(1)) // uBM)
                        if tid == U(0):
                            if SIMULATOR:
                                if cuda.atomic.add(sem, (bh, m0 // uBM), 0) != kmax - kb:
                                    raise RuntimeError("ordered dQ adds: a count is wrong")
                            else:
                                while cuda.atomic.add(sem, (bh, m0 // uBM), 0) != kmax - kb:
                                    pass
                            cuda.threadfence()
                        cuda.syncthreads()
                    add_dq_acc(dq, bh, m0, nq, d, dq_acc, scale, warp, lane)
                    if ORDERED:     # every thread's adds done and visible, then count in
                        cuda.threadfence()
                        cuda.syncthreads()
                        if tid == U(0):
                            cuda.atomic.add(sem, (bh, m0 // uBM), 1)
                    cuda.syncthreads()                 # dS read by every warp
                m0 += uBM
                if m0 >= nq:
                    m0 = m_start
                if m0 == first:
                    break

        store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, warp, lane)

    if ORDERED:
        @kernel_jit(WARPGROUP)
        def dkdv_wgmma_lean_ordered(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group,
                                    sem):
            sm = cuda.shared.array(0, float32, alignment=ALIGN)
            lean(sm, q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group, sem)

        return Launcher(dkdv_wgmma_lean_ordered, LEAN_NBYTES), WARPGROUP

    @kernel_jit(WARPGROUP)
    def dkdv_wgmma_lean(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        lean(sm, q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group, dq)  # (no sem)

    return Launcher(dkdv_wgmma_lean, LEAN_NBYTES), WARPGROUP


@functools.lru_cache(maxsize=None)
def make_wide_kernel(causal, vector_atomics=False, vector_loads=False, dq_out=True,
                     half=False):
    """The dK/dV/dQ kernel for 64 < d <= 128: grid (ceil(Nk / 64), B*Hk), 256 threads, the
    lean kernel's arguments. Warpgroup 0 forms S, warpgroup 1 dP; each then forms P and dS
    on half the keys; warpgroup w owns the head-dim rows 64 w.. of dK^T, dV^T and dQ^T (32
    registers each). Every product is chained in the tensor core per CHAIN = 4 steps, S and dP
    with their contraction permuted (sm90.operands); A fragments from global memory loaded
    one product ahead.
      1. wg 0: S = (scale Q) K^T; wg 1: dP = dO V^T (four chained products each);
      2. barrier; the halves swapped through shared memory (where P^T's big part goes):
         warpgroup w gets S and dP on keys 32 w..; barrier;
      3. each: P = exp(S - lse_i), dS = P (dP - D_i) on its keys, written as P^T (big,
         small), dS^T and dS (i-major); barrier; both: dV^T[half w] += dO^T[half w] P;
      4. both: dK^T[half w] += (scale Q)^T[half w] dS, dQ^T[half w] = K^T[half w] dS^T,
         added into dq with atomics.
    Three barriers per Q block: the first orders the last block's reads of P^T (dV, step 3),
    dS^T and dS (step 4) before the swap's and step 3's writes. The split keeps the two
    warpgroups' work equal between barriers (before, warpgroup 1 waited while 0 formed P,
    and 0 while 1 formed dS: a quarter of the kernel's stall samples, docs/performance.md).
    vector_atomics: dQ by add_dq_pairs (else add_dq_pairs_by_element); vector_loads: Q's and
    dO's runs of 8 columns read 16 bytes at a time, and dV's and dK's A (dO^T, Q^T) as pairs
    of adjacent head-dim columns 8 bytes at a time (q, dout 16-byte aligned, d % 4 == 0:
    run_backward's AlignedDispatch). dq_out=False: dQ neither formed nor added (the
    deterministic path's dK/dV kernel). half: as make_lean_kernel's."""
    DQ_OUT = dq_out
    # K's tile columns permuted: dQ^T's A rows read where they are, paired
    dq_fragment = transposed_fragment_chain_paired
    add_dq_acc = add_dq_pairs if vector_atomics else add_dq_pairs_by_element
    chained_regs = products(BLOCK, D_PAD, D_PAD, "b" if half else None)["chained_3xtf32_regs"]
    chained_regs_dq = products(BLOCK, D_PAD, D_PAD,
                               "a" if half else None)["chained_3xtf32_regs"]
    chain_elements = make_chain_fragments(False, True, vector_loads)
    # causal: P's mask as one bound a row (softmax.causal_key_limits, 1.01-1.025x); unmasked,
    # recompute_p's per-entry test (this kernel ran 0.986x with the bound there; GPU time, H200,
    # 2026-12-06)
    recompute_p = make_recompute_p(float32, causal, select=True)
    stage = make_stage(False, per_warpgroup=True, chain_permuted=True)
    uBM = U(BLOCK)
    # acc += X^T W with X^T's rows this warpgroup's half (rows = warp + 4 w)
    accumulate_dv_chained = make_accumulate_w_chained(half, vector_loads)
    accumulate_w_chained = make_accumulate_w_chained(False, vector_loads)

    @kernel_jit(2 * WARPGROUP)
    def dkdv_wgmma_wide(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        head = head_index()                # index into B*Hk
        if head >= k.shape[0]:      # a block past the last head (support.head_grid)
            return
        kvh = U(head)
        tid = U(cuda.threadIdx.x)
        wg = tid // U(WARPGROUP)                    # 0: S; 1: dP; each P, dS on half the keys
        warp, lane = (tid // U(32)) % U(4), tid % U(32)
        rows = warp + U(4) * wg                     # the warp's head-dim rows: 16 rows..
        scratch = U(WIDE_SCRATCH_AT) + wg * U(SCRATCH)
        n0 = U(cuda.blockIdx.x) * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        acc = cuda.local.array(REGS, float32)        # S (wg 0) or dP (wg 1)
        dk_acc = cuda.local.array(REGS, float32)     # dK^T, head-dim rows of half wg
        dv_acc = cuda.local.array(REGS, float32)     # dV^T, the same rows
        dq_acc = cuda.local.array(REGS, float32)     # dQ^T of this Q block, the same rows
        x = cuda.local.array(CHAIN_A, float32)       # A fragments, unsplit
        a_big = cuda.local.array(CHAIN_A, float32)   # and split
        a_small = cuda.local.array(CHAIN_A, float32)
        clear(dk_acc)
        clear(dv_acc)
        # warpgroup 0 stages K's two column halves (S's B), warpgroup 1 V's (dP's B)
        kv_src = k if wg == U(0) else v
        b_at = U(WIDE_K_T) + wg * U(2 * HALF)
        stage(sm, b_at, kv_src, kvh, n0, U(0), d, float32(1.0))
        stage(sm, b_at + U(HALF), kv_src, kvh, n0, U(D_PAD), d, float32(1.0))
        a_src = q if wg == U(0) else dout            # S's A: scale Q; dP's: dO
        a_mult = scale if wg == U(0) else float32(1.0)
        m_start = U(0)
        if causal and n0 + nq > nk:     # query i sees key j iff j + nq <= i + nk
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b_idx = U(head // kv_heads)
        # the thread's accumulator entries (wgmma.position): rows row, row + 8, columns col_t,
        # col_t + 1 of each 8-column group; P^T / dS^T at core_offset(col_t, row, 64) and dS
        # at core_offset(row, col_t, 64) (the lean kernel's bases)
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        pt_base = (warp * U(4) + g4 // U(4)) * U(32) + t4 * U(8) + g4 % U(4)
        ds_base = warp * U(1024) + (t4 // U(2)) * U(32) + g4 * U(4) + (t4 % U(2)) * U(2)
        # this warpgroup's keys 32 wg.. (P^T's rows, dS's columns; nt = 4 wg..), the other's
        key0 = wg * U(BLOCK // 2)
        pt_half = pt_base + wg * U(2048)
        pt_other = pt_base + (U(1) - wg) * U(2048)
        ds_half = ds_base + wg * U(256)
        k_half = U(WIDE_K_T) + wg * U(HALF)          # dQ^T's A: K^T of this half
        fence_proxy_async()
        cuda.syncthreads()
        for g in range(group):
            bh = b_idx * U(heads) + U(head % kv_heads) * U(group) + U(g)
            # the Q blocks m_start.. in turn, from `first` round to the one before it
            first = m_start
            first += U(cuda.blockIdx.x) % ((nq - m_start + uBM - U(1)) // uBM) * uBM
            m0 = first
            while True:
                i0, i1 = U(m0 + row), U(m0 + row + U(8))
                lse0, lse1, D0, D1 = row_stats(lse, Dvec, bh, i0, i1, nq)
                # 1. S (wg 0) or dP (wg 1): four chained products of CHAIN steps, two per
                # column half
                clear(acc)
                chain_elements(x, a_src, bh, m0, U(0), d, warp, lane)
                for g in range(2 * STEPS // CHAIN):
                    # (past the last: zeros, columns >= d; nothing loaded)
                    split_chain(a_big, a_small, x, a_mult)
                    chain_elements(x, a_src, bh, m0, U(CHAIN * (g + 1)), d, warp, lane)
                    at = b_at + U(HALF) * U(CHAIN * g // STEPS)
                    add(acc, chained_regs(sm, a_big, a_small, at, at + U(TILE),
                                          (CHAIN * g) % STEPS, scratch))
                # 2. the halves swapped: warpgroup w keeps its entries of keys 32 w.. (the
                # accumulator's j = 16 w + jh) and takes the other's there. The thread at the
                # same position (wgmma.position) of the other warpgroup puts each where this
                # thread will write the entry's P^T big part, and this thread reads it there
                # before writing it (no barrier between). The first barrier: every warpgroup
                # past the last block's dV (its reads of P^T).
                cuda.syncthreads()
                for nt in range(REGS // 8):
                    for e in range(4):
                        jh = 4 * nt + e
                        off = U(PT_T) + pt_other + U(512 * nt + 64 * (e // 2) + 4 * (e % 2))
                        sm[off] = acc[REGS // 2 + jh] if wg == U(0) else acc[jh]
                cuda.syncthreads()
                # 3. P = exp(S - lse_i) and dS = P (dP - D_i) on this warpgroup's keys, written
                # as P^T, dS^T and dS (i-major); then both: dV^T[half w] += dO^T P
                if causal:
                    lim0, lim1 = causal_key_limits(lse0, lse1, i0, i1, n0 + key0 + col_t, nq,
                                                   nk)
                for nt in range(REGS // 8):
                    for hi in range(2):
                        # entries b = 0, 1: keys col_t and col_t + 1 of one row, adjacent in dS
                        ds_big = cuda.local.array(2, float32)
                        ds_small = cuda.local.array(2, float32)
                        for b in range(2):
                            jh = 4 * nt + 2 * hi + b
                            off = pt_half + U(512 * nt + 64 * hi + 4 * b)
                            theirs = sm[U(PT_T) + off]
                            s_ij = acc[jh] if wg == U(0) else theirs
                            dp_ij = theirs if wg == U(0) else acc[REGS // 2 + jh]
                            if causal:
                                p = exp_where(s_ij, lse1 if hi else lse0, U(8 * nt + b),
                                              lim1 if hi else lim0)
                            else:
                                il = row + U(8 * hi)
                                jl = key0 + U(8 * nt + b) + col_t
                                p = recompute_p(s_ij, lse1 if hi else lse0, U(m0 + il),
                                                U(n0 + jl), nq, nk)
                            pb, ps = split_tf32(p)
                            sm[U(PT_T) + off] = pb
                            sm[U(PT_T + TILE) + off] = ps
                            db, dsm = split_tf32(p * (dp_ij - (D1 if hi else D0)))
                            sm[U(DST_T) + off] = db
                            sm[U(DST_T + TILE) + off] = dsm
                            ds_big[b] = db
                            ds_small[b] = dsm
                        if DQ_OUT:       # the pair side by side: one 8-byte store each
                            off_ds = ds_half + U(512 * hi + 64 * nt)
                            sm[U(DS_T) + off_ds] = ds_big[0]
                            sm[U(DS_T) + off_ds + U(1)] = ds_big[1]
                            sm[U(DS_T + TILE) + off_ds] = ds_small[0]
                            sm[U(DS_T + TILE) + off_ds + U(1)] = ds_small[1]
                fence_proxy_async()
                cuda.syncthreads()
                accumulate_dv_chained(sm, dv_acc, U(PT_T), dout, bh, m0, float32(1.0), d,
                                     rows, lane, scratch, x, a_big, a_small)
                # 4. dK^T += (scale Q)^T dS and dQ^T = K^T dS^T, each over this half's rows
                if DQ_OUT:
                    clear(dq_acc)
                accumulate_w_chained(sm, dk_acc, U(DST_T), q, bh, m0, scale, d, rows, lane,
                                     scratch, x, a_big, a_small)
                if DQ_OUT:
                    for g in range(STEPS // CHAIN):
                        for s in range(CHAIN):
                            f_big, f_small = dq_fragment(sm, k_half, CHAIN * g + s, warp,
                                                         lane)
                            for e in range(4):
                                a_big[4 * s + e] = f_big[e]
                                a_small[4 * s + e] = f_small[e]
                        add(dq_acc, chained_regs_dq(sm, a_big, a_small, U(DS_T),
                                                    U(DS_T + TILE), CHAIN * g, scratch))
                    add_dq_acc(dq, bh, m0, nq, d, dq_acc, scale, rows, lane)
                m0 += uBM
                if m0 >= nq:
                    m0 = m_start
                if m0 == first:
                    break

        store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, rows, lane)

    return Launcher(dkdv_wgmma_wide, WIDE_NBYTES), 2 * WARPGROUP


@functools.lru_cache(maxsize=None)
def dkdv_launcher(d_wide, causal, dq_out=True, half=False, ordered=False):
    """(kernel, threads) of the dK/dV(/dQ) kernel: the vector variant (dQ pairs by one vector
    atomic; dV's and dK's A read 8 bytes at a time; wide: Q and dO 16 bytes at a time) where
    q, dout and dq are 16-byte aligned (their data and rows: d % 4 == 0; dq only when dQ is
    added), the scalar twin otherwise (vector_io.AlignedDispatch; the same sums). ordered
    (lean, with dQ): make_lean_kernel's ordered dQ adds, the kernels taking sem last."""
    if d_wide:
        scalar, threads = make_wide_kernel(causal, False, False, dq_out, half)
        vector = make_wide_kernel(causal, True, True, dq_out, half)[0]
        return AlignedDispatch(vector, scalar, (0, 3, DQ_ARG) if dq_out else (0, 3)), threads
    scalar, threads = make_lean_kernel(causal, False, False, dq_out, half, ordered)
    vector = make_lean_kernel(causal, dq_out, True, dq_out, half, ordered)[0]  # no dQ: no atomics
    return AlignedDispatch(vector, scalar, (0, 3, DQ_ARG) if dq_out else (0, 3)), threads


@kernel_jit()
def _clear_counts(sem):
    """sem[:, :] = 0 (the ordered dQ adds' counts, int32 (B*H, Q blocks))."""
    i = cuda.grid(1)
    if i < sem.size:
        sem[i // sem.shape[1], i % sem.shape[1]] = 0


clear_counts = Launcher(_clear_counts)    # (a Launcher: recorded and replayed with the rest)


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                 block_m=BLOCK, block_n=BLOCK, deterministic=False, stream=0, half=False):
    """The Hopper backward on 3-D float32 device arrays (registry contract): the preprocess
    kernel (D = rowsum(dO * O); dq zeroed unless deterministic at d > 64), the dK/dV kernel
    (lean for d <= 64, wide above) adding dQ with atomics; with deterministic=True at d <= 64
    the lean kernel adding dQ in a fixed order (counts in an int32 (B*H, Q blocks) array of its
    own, cleared first), above it the wide kernel without dQ and then the dQ pass (sm90/dq.py:
    no atomics). All on `stream`.
    half: q, k, v, dout hold half values (the API's widened half inputs; registry.Pair.
    half_inputs): the products of their zero small parts are not issued (the same sums)."""
    from ... import arrays
    check_tiles(block_m, block_n, q.shape[2], q.dtype)
    bh, nq, d = q.shape
    bhk, nk, _ = k.shape
    D = arrays.empty_device((bh, nq), q.dtype)
    ordered = deterministic and d <= D_PAD      # d <= 64: dQ adds in a fixed order
    run_preprocess(dout, out, D, dq, clear=not deterministic or ordered, stream=stream)
    grid = (ceil_div(nk, BLOCK), *head_grid(bhk))
    args = (q, k, v, dout, lse, D, dk, dv, dq, np.float32(scale), heads, group)
    if ordered:
        sem = arrays.empty_device((bh, ceil_div(nq, BLOCK)), np.int32)
        clear_counts[ceil_div(bh * ceil_div(nq, BLOCK), 256), 256, stream](sem)
        kernel, threads = dkdv_launcher(False, bool(causal), True, bool(half), True)
        kernel[grid, threads, stream](*args, sem)
        return
    kernel, threads = dkdv_launcher(d > D_PAD, bool(causal), not deterministic, bool(half))
    kernel[grid, threads, stream](*args)
    if deterministic:
        run_dq(dout, q, k, v, lse, D, dq, scale=scale, heads=heads, group=group,
               causal=causal, stream=stream, half=half)
