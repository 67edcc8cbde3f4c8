"""Backward on Hopper warpgroup products (wgmma, sm_90a; kernels/wgmma.py). float32, head dim up
to 64, 64 x 64 tiles, one warpgroup (128 threads) per K/V block of 64 rows; every product is
3xTF32 with its operands split once into big and small TF32 parts (notebooks/data/perf-notes.md,
versions 12-15). Its lean kernel with paired steps and fragments loaded ahead is registered as
the "wgmma" backward (run_or_fallback: backward_wgmma_wide's two-warpgroup kernel for
64 < d <= 128, fa2-atomic where neither applies), which follows the "wgmma" forward
(forward_wgmma.py computes S as the lean kernel does, bit for bit; forward_wgmma_wide.py as
the wide one does).

Per K/V block (rows j), over the query heads sharing its key head and their Q blocks (rows i),
with the forward's operand roles (M = i, the warpgroup's 64 rows):
  S = (scale Q) K^T and dP = dO V^T, both operands in shared memory;
  P = exp(S - lse_i), dS = P (dP - D_i) in the accumulators' registers, then P^T and dS^T
  written to shared memory as the B operands of
  dV^T += dO^T P and dK^T += (scale Q)^T dS (M = d), A read from the staged dO and Q tiles;
  dQ_i += dS K (M = i), A read from the dS^T tile, B = K^T staged once; added into dq with
  atomics.
The A operands of the last three come from shared memory through registers (wgmma's register A
fragment), because TF32 operands in shared memory must be K-major and the staged tiles are
K-major over the other index; their big and small parts are staged already, so nothing is
split twice.

S here is a 3xTF32 sum on the tensor core, not the forward's FFMA sum: P is not recomputed bit
for bit (the fa2 kernels' rule). Its error is a few units of roundoff of sum |q k| (wgmma.py),
so at large logits P's rows sum to 1 only as well as the NumPy reference's do.

Shared memory: 14 tiles of 64 x 64 floats (K, V, K^T, Q, dO, P^T, dS^T, each as big and small
parts): 224 KiB of the 227 an H200 block can have, so one block (4 warps) per SM.

Measured on an H200 (2026-11-30, tests/ab_wgmma.py; notebooks/data/wgmma-backward-h200-2026-11-
30.txt), backward TFLOP/s at d = 64, N = 1k / 2k / 4k: 18.3-18.9 / 21.9-22.5 / 24.5-25.2 with
the defaults (chained S and dP), against the fa2-atomic default's 23.4-23.7 / 26.1-27.2 /
28.4-29.2 in the same processes: 0.78-0.89x. Correct: within the tolerance rule on every GPU
case with d <= 64 and at N = 2k (tests/test_backward_wgmma.py, each option), memcheck and
racecheck clean. Why it is not faster (Nsight Compute, N = 2k): one warp per scheduler (the
shared memory allows no second block) issues an instruction on 30 % of cycles and waits on
fixed-latency dependencies, loads and barriers the rest: latency-bound, with nothing to hide
it. `make_lean_kernel` (run_backward's lean=True) takes that away: 96 KiB of shared memory, two
blocks per SM, and 26.8 / 29.7-29.9 / 33.8 TFLOP/s at N = 1k / 2k / 4k (the default fa2-atomic
26.1-26.6 at 2k, 29.1-29.2 at 4k in the same process): 1.12-1.16x. Within tolerance on every GPU
case with d <= 64. With two steps per tensor-core wait (paired_steps, 2026-12-01): 27.0-27.9 /
31.6 / 35.0-35.2 against the default's 22.9-23.0 / 26.1-26.2 / 28.8-28.9 (1.17-1.22x), every
gpu test passing, compute-sanitizer memcheck 0 errors and racecheck 0 hazards
(tests/sanitize.py wgmma). perf-notes versions 13 and 14 have the numbers.
"""

import contextlib
import functools
import sys

import numpy as np
from numba import cuda, float32

from . import backward_fa2
from .backward import run_preprocess
from .backward_fa2 import _recompute_p
from .common import (DYNAMIC_SHARED_MEMORY_BYTES, NEG_INF, SIMULATOR, U, DynamicSharedKernel,
                     ceil_div, device_function, kernel_jit)
from .fa2_tiles import ALIGN
from .mma import split_tf32
from .vector_io import AlignedDispatch, load4
from .vector_io import add2 as red_add2    # (this module has its own add2)
from .wgmma import (CHAIN, SCRATCH, STEP, WARPGROUP,
                    fence_proxy_async, position, products)

BLOCK = 64                  # block_m = block_n
D_PAD = 64                  # the head dim, zero-padded
TILE = BLOCK * D_PAD        # floats per tile
STEPS = 64 // STEP          # 8-long steps of every product (K = d, i or j: all 64)
REGS = 32                   # accumulator entries per thread of a 64 x 64 product
LOADS = 8                   # global loads a thread has in flight when staging a tile
STEP_FLOATS = 64            # floats from one 8-long step of a staged tile to the next
CHAIN_A = 4 * CHAIN         # a thread's A-fragment entries of one chained product (wgmma.py)
# float offsets of the tiles in shared memory: big part, small part
K_T, V_T, KT_T, Q_T, DO_T, PT_T, DST_T = (2 * TILE * x for x in range(7))
SCRATCH_AT = 14 * TILE      # the simulator's fragment exchange (wgmma.step_3xtf32_regs)
NBYTES = 4 * (14 * TILE + (SCRATCH if SIMULATOR else 0))
assert 14 * TILE * 4 <= DYNAMIC_SHARED_MEMORY_BYTES


def default_blocks(head_dim, dtype):
    """(64, 64): the only tiles this kernel has."""
    return BLOCK, BLOCK


def check(head_dim, dtype, block_m=BLOCK, block_n=BLOCK):
    """ValueError unless float32, head dim 1..64 and 64 x 64 tiles."""
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"the wgmma backward is float32 only, got {np.dtype(dtype)}")
    if not 1 <= head_dim <= D_PAD:
        raise ValueError(f"the wgmma backward needs head_dim <= {D_PAD}, got {head_dim}")
    if (block_m, block_n) != (BLOCK, BLOCK):
        raise ValueError(f"the wgmma backward has 64 x 64 tiles only, got block_m={block_m}, "
                         f"block_n={block_n}")


@device_function
def chain_column(c):
    """The source column that column c of a chain-permuted tile holds. Within each 32 columns
    (one chained product of CHAIN = 4 steps of 8), contraction index 8 s + t + 4 e (step s,
    t = lane % 4 of the register A fragment, e = 0 or 1 its two k entries) is column
    8 t + 2 s + e: each thread's 8 entries of a row are then 8 contiguous columns."""
    k = c % U(32)
    return c - k + U(8) * (k % U(4)) + U(2) * (k // U(8)) + (k % U(8)) // U(4)


def make_stage(transposed, permuted=False, loads=LOADS, per_warpgroup=False,
               chain_permuted=False):
    """stage and fetch for tiles K-major over the head dim (transposed: over the rows).
    permuted (with transposed): within each 8-group of the contraction, position k holds row
    2 (k % 4) + k // 4, so that a C fragment is a register A fragment against this tile
    (forward_wgmma: O += P V with V^T so staged). loads: stage's batch of global loads in
    flight (a divisor of 32). per_warpgroup: stage runs in a block of several warpgroups, each
    staging its own tiles (thread index taken modulo 128; a separate option because that
    one instruction moved ptxas's allocation of the timed one-warpgroup forward, 170 -> 188
    registers). chain_permuted (not transposed): the tile's column c holds the source's column
    chain_column(c), so that a chained product's register A fragments, loaded by
    make_chain_fragments(permuted=True), are runs of 8 contiguous columns (see there)."""
    BATCH = loads
    GROUPS = per_warpgroup
    CHAIN_PERMUTED = chain_permuted and not transposed
    @device_function
    def contraction_index(c_t):
        if permuted:
            return c_t - c_t % U(8) + U(2) * (c_t % U(4)) + (c_t % U(8)) // U(4)
        return c_t

    @cuda.jit(device=True)
    def load(src, head, row0, col0, n, d, mult, x, r_t, c_t):
        """Element x * 128 + tid of the tile (see stage), or zero outside src."""
        r = U(8 * (x // 4)) + r_t
        c = U(16 * (x % 4)) + c_t
        if CHAIN_PERMUTED:
            c = chain_column(c)
        if transposed:
            r, c = c, r
        c += col0
        val = float32(0.0)
        if row0 + r < n and c < d:
            val = src[head, row0 + r, c] * mult
        return val

    @cuda.jit(device=True)
    def stage(sm, at, src, head, row0, col0, d, mult):
        """Rows row0.. and head-dim columns col0..col0 + 63 of src[head] (times mult; zero
        past its rows or the head dim) as a 64 x 64 tile, K-major over the head dim
        (transposed: over the rows, the tile's rows being the head dim), at sm[at] (big) and
        sm[at + TILE] (small), by 128 threads (per_warpgroup: those of the caller's).
        Thread-index order is the layout's own, so a warp writes one 512-byte run; the loads
        go in batches of `loads`, so that a batch is in flight at once (one warp per
        scheduler has nothing else to hide a load's latency behind)."""
        n = U(src.shape[1])
        tid = U(cuda.threadIdx.x)
        if GROUPS:
            tid %= U(WARPGROUP)
        # element idx = tid + 128 x of the layout is (r, c) = (8 (x // 4) + r_t,
        # 16 (x % 4) + c_t): core_offset's inverse, with the thread's part computed once
        # (uint32 index math throughout: Python ints are int64 in Numba, and signed
        # division and index wraparound cost instructions in every iteration)
        r_t = (tid // U(4)) % U(8)
        c_t = contraction_index((tid // U(32)) * U(4) + tid % U(4))
        vals = cuda.local.array(BATCH, float32)
        for b in range(TILE // WARPGROUP // BATCH):
            for u in range(BATCH):
                vals[u] = load(src, head, row0, col0, n, d, mult, b * BATCH + u, r_t, c_t)
            for u in range(BATCH):
                idx = tid + U((b * BATCH + u) * WARPGROUP)
                big, small = split_tf32(vals[u])
                sm[at + idx] = big
                sm[at + TILE + idx] = small

    @cuda.jit(device=True)
    def fetch(vals, src, head, row0, d, mult):
        """stage's loads (head-dim columns 0..63), all of them, into vals (TILE / 128
        registers), to be put later."""
        tid = U(cuda.threadIdx.x)
        r_t = (tid // U(4)) % U(8)
        c_t = contraction_index((tid // U(32)) * U(4) + tid % U(4))
        for x in range(TILE // WARPGROUP):
            vals[x] = load(src, head, row0, U(0), U(src.shape[1]), d, mult, x, r_t, c_t)
    return stage, fetch

(stage, fetch), (stage_kt, _) = make_stage(False), make_stage(True)

@cuda.jit(device=True)
def put(sm, at, vals):
    """The tile fetch loaded, into shared memory as stage lays it."""
    tid = U(cuda.threadIdx.x)
    for x in range(TILE // WARPGROUP):
        idx = tid + U(x * WARPGROUP)
        big, small = split_tf32(vals[x])
        sm[at + idx] = big
        sm[at + TILE + idx] = small

@device_function
def set2(acc, acc2, part):
    for j in range(REGS):
        acc[j] = part[j]
    for j in range(REGS):
        acc2[j] = part[REGS + j]

@device_function
def add(acc, part):
    for j in range(REGS):
        acc[j] += part[j]

@device_function
def add2(acc, acc2, part):
    for j in range(REGS):
        acc[j] += part[j]
    for j in range(REGS):
        acc2[j] += part[REGS + j]

@device_function
def add_in_turn(acc, part):
    """acc += part[:REGS], then acc += part[REGS:] (two steps of one product, in step order)."""
    for j in range(REGS):
        acc[j] += part[j]
    for j in range(REGS):
        acc[j] += part[REGS + j]

@device_function
def clear(acc):
    for j in range(REGS):
        acc[j] = float32(0.0)

@device_function
def transposed_fragment(sm, at, s, warp, lane):
    """The register A fragment (big, small) of step s of X^T, X the 64 x 64 tile at sm[at]
    (K-major: element (a, b) at core_offset(a, b, 64)): X^T's rows are b, its contraction
    a; entries in wgmma.a_fragment_index's order."""
    # core_offset(8 s + t (+ 4), 16 warp + g (+ 8), 64): a base plus 16 and 64
    g, t = lane // U(4), lane % U(4)
    o0 = at + U(512) * U(s) + (warp * U(4) + g // U(4)) * U(32) + t * U(4) + g % U(4)
    o1, o2, o3 = o0 + U(64), o0 + U(16), o0 + U(80)
    return ((sm[o0], sm[o1], sm[o2], sm[o3]),
            (sm[o0 + U(TILE)], sm[o1 + U(TILE)], sm[o2 + U(TILE)], sm[o3 + U(TILE)]))


@device_function
def transposed_fragment_paired(sm, at, s, warp, lane):
    """transposed_fragment with the thread's two rows paired: rows g and g + 8 of the warp's 16
    are X^T's rows 16 warp + 2 g and 16 warp + 2 g + 1 (not 16 warp + g and + 8). A product
    with this A has those rows in its accumulator's entries e and e + 2 (wgmma.position): for
    dQ^T = K^T dS^T, two adjacent head-dim columns of one dq row, added by one vector atomic
    (add_dq_pairs)."""
    # core_offset(8 s + t (+ 4), 16 warp + 2 g (+ 1), 64): a base plus 1 and 16
    g, t = lane // U(4), lane % U(4)
    o0 = at + U(512) * U(s) + (warp * U(4) + g // U(2)) * U(32) + t * U(4) + (g % U(2)) * U(2)
    o1, o2, o3 = o0 + U(1), o0 + U(16), o0 + U(17)
    return ((sm[o0], sm[o1], sm[o2], sm[o3]),
            (sm[o0 + U(TILE)], sm[o1 + U(TILE)], sm[o2 + U(TILE)], sm[o3 + U(TILE)]))


@device_function
def transposed_fragment_chain_paired(sm, at, s, warp, lane):
    """transposed_fragment_paired for a chain-permuted tile (make_stage's chain_permuted: its
    column b holds source column chain_column(b)): the thread's rows g and g + 8 are source
    columns 16 warp + 2 g and + 1 again, read from the tile's columns that hold them (the
    second 4 after the first)."""
    # core_offset(8 s + t (+ 4), b (+ 4), 64) with b = 32 (warp // 2) + 8 (g % 4)
    # + 2 (warp % 2) + g // 4, the column holding source column 16 warp + 2 g
    g, t = lane // U(4), lane % U(4)
    o0 = (at + U(512) * U(s) + (U(8) * (warp // U(2)) + U(2) * (g % U(4))) * U(32) + t * U(4)
          + U(2) * (warp % U(2)) + g // U(4))
    o1, o2, o3 = o0 + U(32), o0 + U(16), o0 + U(48)
    return ((sm[o0], sm[o1], sm[o2], sm[o3]),
            (sm[o0 + U(TILE)], sm[o1 + U(TILE)], sm[o2 + U(TILE)], sm[o3 + U(TILE)]))


@cuda.jit(device=True)     # (cuda.atomic: not a plain function on the simulator)
def add_dq(dq, bh, m0, nq, d, dq_acc, scale, rows, lane):
    """dQ^T's accumulator (rows: the head dim 16 rows.., columns: queries m0..; A read by
    transposed_fragment) times scale, added into dq[bh] by scalar atomics."""
    g4, t4 = lane // U(4), lane % U(4)
    for nt in range(REGS // 4):
        for e in range(4):                     # dQ^T entry (head dim c, query i)
            c = U(16) * rows + g4 + U(8 * (e // 2))
            i = m0 + U(8 * nt + e % 2) + t4 * U(2)
            if i < nq and c < d:
                cuda.atomic.add(dq, (bh, i, c), dq_acc[4 * nt + e] * scale)


def _make_add_dq_pairs(vector):
    """add_dq_pairs (vector: one red.global.add.v2.f32 per pair) or add_dq_pairs_by_element
    (two scalar atomics per pair)."""
    VECTOR = vector

    @cuda.jit(device=True)     # (cuda.atomic: not a plain function on the simulator)
    def add_pairs(dq, bh, m0, nq, d, dq_acc, scale, rows, lane):
        g4, t4 = lane // U(4), lane % U(4)
        c = U(16) * rows + U(2) * g4
        for nt in range(REGS // 4):
            for b in range(2):
                i = m0 + U(8 * nt + b) + t4 * U(2)
                x0, x1 = dq_acc[4 * nt + b] * scale, dq_acc[4 * nt + 2 + b] * scale
                if VECTOR:
                    if i < nq and c < d:
                        red_add2(dq, bh, i, c, (x0, x1))
                else:
                    if i < nq and c < d:
                        cuda.atomic.add(dq, (bh, i, c), x0)
                    if i < nq and c + U(1) < d:
                        cuda.atomic.add(dq, (bh, i, c + U(1)), x1)
    return add_pairs


# add_dq for an accumulator whose A was read by transposed_fragment_paired (or _chain_paired):
# entries e and e + 2 are head-dim columns c and c + 1 (c even) of one dq row.
# add_dq_pairs: one red.global.add.v2.f32 per pair (vector_io.add2: d even and dq's rows 8-byte
# aligned, the caller's promise): half the atomic instructions, each changing 8 bytes.
# add_dq_pairs_by_element: two scalar atomics per pair (any d, any alignment).
add_dq_pairs = _make_add_dq_pairs(True)
add_dq_pairs_by_element = _make_add_dq_pairs(False)


@device_function
def row_stats(lse, Dvec, bh, i0, i1, nq):
    """lse and D of query rows i0 and i1 (-inf and 0 past nq)."""
    lse0 = lse[bh, i0] if i0 < nq else float32(NEG_INF)
    lse1 = lse[bh, i1] if i1 < nq else float32(NEG_INF)
    D0 = Dvec[bh, i0] if i0 < nq else float32(0.0)
    D1 = Dvec[bh, i1] if i1 < nq else float32(0.0)
    return lse0, lse1, D0, D1


@device_function
def store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, warp, lane):
    """dK^T and dV^T's accumulators (rows: the head dim, columns: keys n0..) into dk, dv."""
    for j in range(REGS):
        c, jl = position(j, warp, lane)
        if n0 + U(jl) < nk and U(c) < d:
            dk[kvh, n0 + U(jl), U(c)] = dk_acc[j]
            dv[kvh, n0 + U(jl), U(c)] = dv_acc[j]


@functools.lru_cache(maxsize=None)
def make_dkdv_kernel(causal, paired=True, chained=True, prefetch=False):
    """dK, dV and (atomics into dq, which must hold zeros) dQ. Launch grid
    (ceil(Nk / 64), B*Hk), 128 threads, arguments (q, k, v, dout, lse, D, dk, dv, dq, scale,
    heads, group) on (B*H, N, d) float32 arrays, d <= 64.
    paired: S and dP, and dV and dK, each step of the two in one wgmma wait (fewer round trips
    to the tensor core); False: one product per wait. Same sums either way. (H200: +-2 %.)
    chained: S and dP each summed over the whole head dim in the tensor core's accumulators
    (one wait for both; wgmma.py: 2-5x the error of steps from zero added in float32).
    (H200: +3-5 %, the default.)
    prefetch: load the next Q and dO tiles of a head into registers while this one is
    computed (64 registers per thread), put them into shared memory at the end. (H200: -15 %,
    spills at 255 registers.)"""
    prod = products(BLOCK, D_PAD, D_PAD)
    step, step_regs = prod["step_3xtf32"], prod["step_3xtf32_regs"]
    step2, step2_regs = prod["step2_3xtf32"], prod["step2_3xtf32_regs"]
    PAIRED, CHAINED, PREFETCH = paired, chained, prefetch
    NEXT = TILE // WARPGROUP if prefetch else 1
    chain2 = prod["chained2_3xtf32"]
    recompute_p = _recompute_p(float32, causal)
    uBM = U(BLOCK)

    @kernel_jit(WARPGROUP)
    def dkdv_wgmma(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        kvh = U(cuda.blockIdx.y)
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        n0 = U(cuda.blockIdx.x) * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        s_acc = cuda.local.array(REGS, float32)      # S, then P
        dp_acc = cuda.local.array(REGS, float32)     # dP
        dk_acc = cuda.local.array(REGS, float32)     # dK^T (rows: head dim, columns: j)
        dv_acc = cuda.local.array(REGS, float32)     # dV^T
        dq_acc = cuda.local.array(REGS, float32)     # this block's share of dQ_i
        q_next = cuda.local.array(NEXT, float32)      # prefetch: the next Q tile's elements
        do_next = cuda.local.array(NEXT, float32)     # and the next dO tile's
        clear(dk_acc)
        clear(dv_acc)
        stage(sm, U(K_T), k, kvh, n0, U(0), d, float32(1.0))
        stage(sm, U(V_T), v, kvh, n0, U(0), d, float32(1.0))
        stage_kt(sm, U(KT_T), k, kvh, n0, U(0), d, float32(1.0))   # K^T: rows the head dim
        # causal: query i sees key j iff j + nq <= i + nk; skip Q blocks that see none of ours
        m_start = U(0)
        if causal and n0 + nq > nk:
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b_idx = U(cuda.blockIdx.y // kv_heads)
        # this thread's accumulator entries (wgmma.position): rows row and row + 8, columns
        # col_t and col_t + 1 of each 8-column group; pt_base: core_offset(col_t, row, 64)
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        pt_base = (warp * U(4) + g4 // U(4)) * U(32) + t4 * U(8) + g4 % U(4)
        for g in range(group):
            bh = b_idx * U(heads) + U(cuda.blockIdx.y % kv_heads) * U(group) + U(g)
            m0 = m_start
            if PREFETCH and m0 < nq:                   # a head's first tiles: no prefetch
                stage(sm, U(Q_T), q, bh, m0, U(0), d, scale)
                stage(sm, U(DO_T), dout, bh, m0, U(0), d, float32(1.0))
            while m0 < nq:
                if not PREFETCH:
                    stage(sm, U(Q_T), q, bh, m0, U(0), d, scale)
                    stage(sm, U(DO_T), dout, bh, m0, U(0), d, float32(1.0))
                i0, i1 = m0 + row, m0 + row + U(8)
                lse0, lse1, D0, D1 = row_stats(lse, Dvec, bh, i0, i1, nq)
                fence_proxy_async()
                cuda.syncthreads()
                m1 = m0 + uBM
                if PREFETCH and m1 < nq:               # lands while this tile is computed
                    fetch(q_next, q, bh, m1, d, scale)
                    fetch(do_next, dout, bh, m1, d, float32(1.0))
                if CHAINED:
                    set2(s_acc, dp_acc, chain2(sm, U(Q_T), U(Q_T + TILE), U(K_T),
                                               U(K_T + TILE), U(DO_T), U(DO_T + TILE),
                                               U(V_T), U(V_T + TILE)))
                else:
                    clear(s_acc)
                    clear(dp_acc)
                for s in range(0 if CHAINED else STEPS):
                    if PAIRED:
                        add2(s_acc, dp_acc, step2(sm, U(Q_T), U(Q_T + TILE), U(K_T),
                                                  U(K_T + TILE), U(DO_T), U(DO_T + TILE),
                                                  U(V_T), U(V_T + TILE), s))
                    else:
                        add(s_acc, step(sm, U(Q_T), U(Q_T + TILE), U(K_T), U(K_T + TILE), s))
                        add(dp_acc, step(sm, U(DO_T), U(DO_T + TILE), U(V_T), U(V_T + TILE),
                                         s))
                for nt in range(REGS // 4):            # nested: LLVM unrolls both
                    for e in range(4):                 # entry j at wgmma.position(j, ...)
                        j = 4 * nt + e
                        hi, b = e // 2, e % 2
                        il = row + U(8 * hi)
                        jl = U(8 * nt + b) + col_t
                        p = recompute_p(s_acc[j], lse1 if hi else lse0, m0 + il, n0 + jl,
                                        nq, nk)
                        ds = p * (dp_acc[j] - (D1 if hi else D0))
                        # P^T, dS^T (rows j, K-major over i): core_offset(jl, il, 64)
                        off = pt_base + U(512 * nt + 64 * hi + 4 * b)
                        pb, ps = split_tf32(p)
                        db, dsm = split_tf32(ds)
                        sm[U(PT_T) + off] = pb
                        sm[U(PT_T + TILE) + off] = ps
                        sm[U(DST_T) + off] = db
                        sm[U(DST_T + TILE) + off] = dsm
                fence_proxy_async()
                cuda.syncthreads()
                clear(dq_acc)
                for s in range(STEPS):
                    do_big, do_small = transposed_fragment(sm, U(DO_T), s, warp, lane)
                    q_big, q_small = transposed_fragment(sm, U(Q_T), s, warp, lane)
                    if PAIRED:
                        add2(dv_acc, dk_acc, step2_regs(sm, do_big, do_small, U(PT_T),
                                                        U(PT_T + TILE), q_big, q_small,
                                                        U(DST_T), U(DST_T + TILE), s,
                                                        U(SCRATCH_AT)))
                    else:
                        add(dv_acc, step_regs(sm, do_big, do_small, U(PT_T), U(PT_T + TILE),
                                              s, U(SCRATCH_AT)))
                        add(dk_acc, step_regs(sm, q_big, q_small, U(DST_T), U(DST_T + TILE),
                                              s, U(SCRATCH_AT)))
                    a_big, a_small = transposed_fragment(sm, U(DST_T), s, warp, lane)
                    add(dq_acc, step_regs(sm, a_big, a_small, U(KT_T), U(KT_T + TILE), s,
                                          U(SCRATCH_AT)))
                for nt in range(REGS // 4):
                    for e in range(4):
                        i = i1 if e // 2 else i0
                        c = U(8 * nt + e % 2) + col_t
                        if i < nq and c < d:
                            cuda.atomic.add(dq, (bh, i, c), dq_acc[4 * nt + e] * scale)
                cuda.syncthreads()                     # every warp is done with the tiles
                if PREFETCH and m1 < nq:
                    put(sm, U(Q_T), q_next)
                    put(sm, U(DO_T), do_next)
                m0 = m1

        store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, warp, lane)

    return DynamicSharedKernel(dkdv_wgmma, NBYTES), WARPGROUP


DQ_ARG = 8                  # dq's position in the dK/dV/dQ kernels' arguments

# lean: shared memory for K, V and one per-Q-block tile only (P^T, then dS^T, then dS), 96 KiB,
# so that two blocks fit on an SM; the A operands of every product come through registers
W_T = 4 * TILE             # after K (0) and V (2 TILE), each big + small
LEAN_SCRATCH_AT = 6 * TILE
LEAN_NBYTES = 4 * (6 * TILE + (SCRATCH if SIMULATOR else 0))


def make_global_fragment(transposed, split=True):
    """global_fragment (below); split=False: its four elements as loaded (times mult), to be
    split later by split_fragment (backward_wgmma_wide loads a step ahead of its use)."""
    @device_function
    def element(src, head, row0, r, c, mult, n, d):
        if transposed:                         # X^T[r, c] = src[row0 + c, r]
            r, c = c, r
        x = float32(0.0)
        if row0 + r < n and c < d:
            x = src[head, row0 + r, c] * mult
        return x

    @device_function
    def global_fragment(src, head, row0, s, mult, d, warp, lane):
        """The register A fragment (big, small) of step s of X = mult src[head, row0:row0+64, :]
        (transposed: of X^T), read from global memory and split, entries in
        wgmma.a_fragment_index's order; zero outside src."""
        n = U(src.shape[1])
        r = warp * U(16) + lane // U(4)
        c = U(STEP * s) + lane % U(4)
        b0, s0 = split_tf32(element(src, head, row0, r, c, mult, n, d))
        b1, s1 = split_tf32(element(src, head, row0, r + U(8), c, mult, n, d))
        b2, s2 = split_tf32(element(src, head, row0, r, c + U(4), mult, n, d))
        b3, s3 = split_tf32(element(src, head, row0, r + U(8), c + U(4), mult, n, d))
        return (b0, b1, b2, b3), (s0, s1, s2, s3)

    @device_function
    def global_elements(src, head, row0, s, mult, d, warp, lane):
        n = U(src.shape[1])
        r = warp * U(16) + lane // U(4)
        c = U(STEP * s) + lane % U(4)
        return (element(src, head, row0, r, c, mult, n, d),
                element(src, head, row0, r + U(8), c, mult, n, d),
                element(src, head, row0, r, c + U(4), mult, n, d),
                element(src, head, row0, r + U(8), c + U(4), mult, n, d))
    return global_fragment if split else global_elements


@functools.lru_cache(maxsize=None)
def make_chain_fragments(transposed, permuted=False, vector=False):
    """chain_elements(x, src, head, row0, s0, mult, d, warp, lane): the elements of the register
    A fragments of steps s0..s0 + CHAIN of X (make_global_fragment's X) into the local array
    x, step s0 + s's four at 4 s..; with split_chain(a_big, a_small, x), the A operand of
    wgmma's chained_3xtf32_regs (the same TF32 parts as global_fragment's).
    permuted (not transposed): X's contraction index permuted by chain_column, against a B tile
    staged so (make_stage's chain_permuted): a thread's 8 entries of each of its two rows are
    then 8 contiguous columns, 8 (lane % 4).. of the chain's 32, read as one run. vector (with
    permuted): each run as two 16-byte loads (vector_io.load4: src's data and rows 16-byte
    aligned, d % 4 == 0, the caller's promise), else element by element."""
    elements = make_global_fragment(transposed, split=False)
    PERMUTED, VECTOR = permuted and not transposed, vector and permuted and not transposed
    zeros = (float32(0.0), float32(0.0), float32(0.0), float32(0.0))

    @device_function
    def run_of_8(src, head, row, c, mult, n, d, x, h):
        """src[head, row, c:c + 8] * mult (zero outside src) into x as rows h (0: the
        thread's first row, 1: the one 8 below) of a chain's fragments: column c + 2 s + e is
        step s's entry of k index lane % 4 + 4 e (chain_column)."""
        if VECTOR:      # d % 4 == 0 and c % 8 == 0: each run of 4 is all inside or all out
            lo = load4(src, head, row, c) if row < n and c < d else zeros
            hi = load4(src, head, row, c + U(4)) if row < n and c + U(4) < d else zeros
            for u in range(4):
                x[4 * (u // 2) + 2 * (u % 2) + h] = lo[u] * mult
                x[4 * (2 + u // 2) + 2 * (u % 2) + h] = hi[u] * mult
        else:
            for u in range(8):
                val = float32(0.0)
                if row < n and c + U(u) < d:
                    val = src[head, row, c + U(u)] * mult
                x[4 * (u // 2) + 2 * (u % 2) + h] = val

    @device_function
    def chain_elements(x, src, head, row0, s0, mult, d, warp, lane):
        if PERMUTED:
            n = U(src.shape[1])
            r = row0 + warp * U(16) + lane // U(4)
            c = U(STEP) * s0 + U(8) * (lane % U(4))
            run_of_8(src, head, r, c, mult, n, d, x, 0)
            run_of_8(src, head, r + U(8), c, mult, n, d, x, 1)
        else:
            for s in range(CHAIN):
                e4 = elements(src, head, row0, s0 + s, mult, d, warp, lane)
                for e in range(4):
                    x[4 * s + e] = e4[e]
    return chain_elements


@device_function
def split_chain(a_big, a_small, x):
    """a_big, a_small = the TF32 parts of x, entry by entry (CHAIN_A entries)."""
    for j in range(CHAIN_A):
        a_big[j], a_small[j] = split_tf32(x[j])


@device_function
def split_fragment(x):
    """(big, small) of a fragment's four elements: what global_fragment returns."""
    b0, s0 = split_tf32(x[0])
    b1, s1 = split_tf32(x[1])
    b2, s2 = split_tf32(x[2])
    b3, s3 = split_tf32(x[3])
    return (b0, b1, b2, b3), (s0, s1, s2, s3)


@functools.lru_cache(maxsize=None)
def make_accumulate_w(paired_steps, ahead):
    """accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch): acc += X^T W
    over 8 steps, W the 64 x 64 tile at sm[w_at] (K-major over i), X = mult src[head,
    row0:row0+64] from global memory, X^T's rows the head-dim rows 16 warp.. (backward_wgmma_wide
    passes warp + 4 w: its warpgroup's half). paired_steps: two steps per wait (the same sums);
    ahead (with paired_steps): each pair's elements loaded while the pair before is computed."""
    PAIRED_STEPS, AHEAD = paired_steps, ahead and paired_steps
    prod = products(BLOCK, D_PAD, D_PAD)
    step_regs, step2_regs = prod["step_3xtf32_regs"], prod["step2_3xtf32_regs"]
    fragment_t = make_global_fragment(True)
    elements_t = make_global_fragment(True, split=False)

    @cuda.jit(device=True)
    def accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch):
        if AHEAD:
            x = elements_t(src, head, row0, 0, mult, d, warp, lane)
            x2 = elements_t(src, head, row0, 1, mult, d, warp, lane)
        if PAIRED_STEPS:
            for s2 in range(STEPS // 2):
                s = 2 * s2
                if AHEAD:   # (past the last pair: the next Q block's rows; loaded, not used)
                    a_big, a_small = split_fragment(x)
                    a2_big, a2_small = split_fragment(x2)
                    x = elements_t(src, head, row0, s + 2, mult, d, warp, lane)
                    x2 = elements_t(src, head, row0, s + 3, mult, d, warp, lane)
                else:
                    a_big, a_small = fragment_t(src, head, row0, s, mult, d, warp, lane)
                    a2_big, a2_small = fragment_t(src, head, row0, s + 1, mult, d, warp, lane)
                add_in_turn(acc, step2_regs(sm, a_big, a_small, w_at, w_at + U(TILE), a2_big,
                                            a2_small, w_at + U(STEP_FLOATS),
                                            w_at + U(TILE + STEP_FLOATS), s, scratch))
        else:
            for s in range(STEPS):
                a_big, a_small = fragment_t(src, head, row0, s, mult, d, warp, lane)
                add(acc, step_regs(sm, a_big, a_small, w_at, w_at + U(TILE), s, scratch))
    return accumulate_w


@functools.lru_cache(maxsize=None)
def make_accumulate_w_chained(ahead):
    """accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch, x, a_big,
    a_small): make_accumulate_w's acc += X^T W as STEPS // CHAIN products of CHAIN steps, each
    chained in the tensor core (one wait each), through the local arrays x, a_big, a_small
    (CHAIN_A entries); ahead: each product's elements loaded while the one before is computed
    (past the last: the next Q block's rows, loaded, not used)."""
    AHEAD = ahead
    chained_regs = products(BLOCK, D_PAD, D_PAD)["chained_3xtf32_regs"]
    chain_elements_t = make_chain_fragments(True)

    @cuda.jit(device=True)
    def accumulate_w(sm, acc, w_at, src, head, row0, mult, d, warp, lane, scratch, x, a_big,
                     a_small):
        if AHEAD:
            chain_elements_t(x, src, head, row0, U(0), mult, d, warp, lane)
        for g in range(STEPS // CHAIN):
            if AHEAD:
                split_chain(a_big, a_small, x)
                chain_elements_t(x, src, head, row0, U(CHAIN * (g + 1)), mult, d, warp, lane)
            else:
                chain_elements_t(x, src, head, row0, U(CHAIN * g), mult, d, warp, lane)
                split_chain(a_big, a_small, x)
            add(acc, chained_regs(sm, a_big, a_small, w_at, w_at + U(TILE), CHAIN * g,
                                  scratch))
    return accumulate_w


@functools.lru_cache(maxsize=None)
def make_lean_kernel(causal, paired_steps=False, ahead=False, rotate=False,
                     vector_atomics=False):
    """make_dkdv_kernel's kernel with 96 KiB of shared memory (two blocks per SM): K and V staged,
    every A operand read from global memory (Q, dO and their transposes) or from the K tile (K^T)
    into registers, and one 64 x 64 tile that holds P^T for dV^T += dO^T P, then dS^T for
    dK^T += Q^T dS, then dS for dQ^T = K^T dS^T (M = d; dQ added with atomics). Five barriers
    per Q block instead of three; steps from zero, S and dP paired. Same launch and arguments.
    paired_steps: dV^T, dK^T and dQ^T two steps per tensor-core wait (each from zero, added in
    step order: the same sums). ahead (with paired_steps): the A fragments from global memory
    loaded a step (S, dP) or a pair of steps (dV^T, dK^T) before their product, as
    backward_wgmma_wide's ahead (the same values). rotate: backward_wgmma_wide's (each K/V block
    starts at another Q block). vector_atomics: dQ^T's A rows paired (transposed_fragment_paired)
    and dQ added by add_dq_pairs, one vector atomic per two columns (d even and dq's rows
    8-byte aligned: run_backward's AlignedDispatch checks)."""
    PAIRED_STEPS, AHEAD, ROTATE = paired_steps, ahead and paired_steps, rotate
    dq_fragment = transposed_fragment_paired if vector_atomics else transposed_fragment
    add_dq_acc = add_dq_pairs if vector_atomics else add_dq
    elements = make_global_fragment(False, split=False)
    prod = products(BLOCK, D_PAD, D_PAD)
    step_regs, step2_regs = prod["step_3xtf32_regs"], prod["step2_3xtf32_regs"]
    recompute_p = _recompute_p(float32, causal)
    fragment = make_global_fragment(False)
    uBM = U(BLOCK)

    accumulate_w = make_accumulate_w(PAIRED_STEPS, AHEAD)

    @kernel_jit(WARPGROUP)
    def dkdv_wgmma_lean(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        kvh = U(cuda.blockIdx.y)
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        n0 = U(cuda.blockIdx.x) * uBM
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
        b_idx = U(cuda.blockIdx.y // kv_heads)
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        pt_base = (warp * U(4) + g4 // U(4)) * U(32) + t4 * U(8) + g4 % U(4)
        # dS (rows i, K-major over j): core_offset(row, col_t, 64)
        ds_base = warp * U(1024) + (t4 // U(2)) * U(32) + g4 * U(4) + (t4 % U(2)) * U(2)
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
                clear(s_acc)
                clear(dp_acc)
                if AHEAD:
                    xq = elements(q, bh, m0, 0, scale, d, warp, lane)
                    xdo = elements(dout, bh, m0, 0, float32(1.0), d, warp, lane)
                for s in range(STEPS):
                    if AHEAD:   # (past the last step: zeros, columns >= d; nothing loaded)
                        q_big, q_small = split_fragment(xq)
                        do_big, do_small = split_fragment(xdo)
                        xq = elements(q, bh, m0, s + 1, scale, d, warp, lane)
                        xdo = elements(dout, bh, m0, s + 1, float32(1.0), d, warp, lane)
                    else:
                        q_big, q_small = fragment(q, bh, m0, s, scale, d, warp, lane)
                        do_big, do_small = fragment(dout, bh, m0, s, float32(1.0), d, warp,
                                                    lane)
                    add2(s_acc, dp_acc, step2_regs(sm, q_big, q_small, U(K_T), U(K_T + TILE),
                                                   do_big, do_small, U(V_T), U(V_T + TILE), s,
                                                   U(LEAN_SCRATCH_AT)))
                for nt in range(REGS // 4):
                    for e in range(4):
                        j = 4 * nt + e
                        hi, b = e // 2, e % 2
                        il = row + U(8 * hi)
                        jl = U(8 * nt + b) + col_t
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
                accumulate_w(sm, dv_acc, U(W_T), dout, bh, m0, float32(1.0), d, warp, lane,
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
                for nt in range(REGS // 4):
                    for e in range(4):
                        off = ds_base + U(512 * (e // 2) + 64 * nt + e % 2)
                        db, dsm = split_tf32(dp_acc[4 * nt + e])
                        sm[U(W_T) + off] = db
                        sm[U(W_T + TILE) + off] = dsm
                fence_proxy_async()
                cuda.syncthreads()
                clear(dq_acc)
                for s in range(0 if PAIRED_STEPS else STEPS):
                    a_big, a_small = dq_fragment(sm, U(K_T), s, warp, lane)
                    add(dq_acc, step_regs(sm, a_big, a_small, U(W_T), U(W_T + TILE), s,
                                          U(LEAN_SCRATCH_AT)))
                for s2 in range(STEPS // 2 if PAIRED_STEPS else 0):
                    s = 2 * s2
                    a_big, a_small = dq_fragment(sm, U(K_T), s, warp, lane)
                    a2_big, a2_small = dq_fragment(sm, U(K_T), s + 1, warp, lane)
                    add_in_turn(dq_acc, step2_regs(sm, a_big, a_small, U(W_T), U(W_T + TILE),
                                                   a2_big, a2_small, U(W_T + STEP_FLOATS),
                                                   U(W_T + TILE + STEP_FLOATS), s,
                                                   U(LEAN_SCRATCH_AT)))
                add_dq_acc(dq, bh, m0, nq, d, dq_acc, scale, warp, lane)
                cuda.syncthreads()                     # dS read by every warp
                m0 += uBM
                if m0 >= nq:
                    m0 = m_start
                if m0 == first:
                    break

        store_dkdv(dk, dv, kvh, n0, nk, d, dk_acc, dv_acc, warp, lane)

    return DynamicSharedKernel(dkdv_wgmma_lean, LEAN_NBYTES), WARPGROUP


def applies(head_dim, dtype, block_m=BLOCK, block_n=BLOCK):
    """True when the lean wgmma kernel can run a case here: float32, head dim <= 64, 64 x 64
    tiles, and either a GPU of compute capability 9.0 (wgmma exists on sm_90a only; numba-cuda
    compiles for sm_90a there) or the simulator (its products modelled in wgmma.py)."""
    if np.dtype(dtype) != np.float32 or not 1 <= head_dim <= D_PAD:
        return False
    if (block_m, block_n) != (BLOCK, BLOCK):
        return False
    return SIMULATOR or tuple(cuda.get_current_device().compute_capability) == (9, 0)


def default_blocks_or_fallback(head_dim, dtype):
    """(64, 64) where `applies` or backward_wgmma_wide.applies, else the fa2-atomic backward's
    default tiles."""
    from . import backward_wgmma_wide
    if applies(head_dim, dtype) or backward_wgmma_wide.applies(head_dim, dtype):
        return BLOCK, BLOCK
    return backward_fa2.default_blocks_atomic(head_dim, dtype)


def run_or_fallback(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                    block_m, block_n):
    """The registered "wgmma" backward: the lean kernel with paired steps and fragments loaded
    ahead, its Q blocks in rotated order (run_backward(lean=True, paired_steps=True, ahead=True,
    rotate=True): paired steps 1.05-1.10x lean's steps one per wait, ahead 1.04-1.08x paired
    steps, H200 2026-12-01; rotate 1.11-1.13x at N = 1k-8k in one A/B and 0.98-1.01x in a
    second, vector_atomics 1.07x, 2026-12-02, tests/ab_backward_parts.py) where
    `applies` (float32, d <= 64, 64 x 64 tiles, an sm_90 GPU or the simulator), the two-
    warpgroup kernel of backward_wgmma_wide where 64 < d <= 128 (the same conditions
    otherwise) with its REGISTERED options (ahead: 1.03-1.09x without; S chained as the
    registered wide forward chains it), the fa2-atomic backward (mma.sync tensor
    cores in float32) everywhere else, e.g. d > 128, float64, other tiles or another GPU.
    Either way dQ comes from atomics (not bitwise reproducible)."""
    from . import backward_wgmma_wide          # here: that module imports this one
    if applies(q.shape[2], q.dtype, block_m, block_n):
        run_backward(dout, q, k, v, lse, out, dq, dk, dv, scale=scale, heads=heads,
                     group=group, causal=causal, lean=True, paired_steps=True, ahead=True,
                     rotate=True, vector_atomics=True)
    elif backward_wgmma_wide.applies(q.shape[2], q.dtype, block_m, block_n):
        backward_wgmma_wide.run_backward(dout, q, k, v, lse, out, dq, dk, dv, scale=scale,
                                         heads=heads, group=group, causal=causal,
                                         **backward_wgmma_wide.REGISTERED)
    else:
        backward_fa2.run_backward(dout, q, k, v, lse, out, dq, dk, dv, scale=scale,
                                  heads=heads, group=group, causal=causal, block_m=block_m,
                                  block_n=block_n, dq_atomic=True)


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                 block_m=BLOCK, block_n=BLOCK, paired=True, chained=True, prefetch=False,
                 lean=False, paired_steps=False, ahead=False, rotate=False,
                 vector_atomics=False):
    """Launch the preprocess kernel (D = rowsum(dO * O), dq zeroed) and the wgmma dK/dV/dQ
    kernel on 3-D float32 device arrays (backward.run_backward's contract); ValueError where
    `check` does not allow the case. dQ comes from atomics: not bitwise reproducible.
    lean: make_lean_kernel (two blocks per SM; the fastest measured) instead of
    make_dkdv_kernel(causal, paired, chained, prefetch); paired_steps, ahead, rotate:
    make_lean_kernel's; vector_atomics (lean): make_lean_kernel's where dq is 16-byte aligned
    (its data and rows: d % 4 == 0), scalar atomics otherwise (vector_io.AlignedDispatch).
    """
    check(q.shape[2], q.dtype, block_m, block_n)
    if lean:                                   # make_lean_kernel: its own choices
        options = (bool(causal), bool(paired_steps), bool(ahead), bool(rotate))
        kernel, tpb = make_lean_kernel(*options)
        if vector_atomics:
            kernel = AlignedDispatch(make_lean_kernel(*options, True)[0], kernel, (DQ_ARG,))
    else:
        kernel, tpb = make_dkdv_kernel(bool(causal), bool(paired), bool(chained),
                                       bool(prefetch))
    launch_with_preprocess(kernel, tpb, dout, q, k, v, lse, out, dq, dk, dv, scale=scale,
                           heads=heads, group=group)


def launch_with_preprocess(kernel, threads, dout, q, k, v, lse, out, dq, dk, dv, *, scale,
                           heads, group):
    """The preprocess kernel (D = rowsum(dO * O), dq zeroed), then `kernel` (a dK/dV/dQ kernel
    of this module's or backward_wgmma_wide's launch and arguments) on grid
    (ceil(Nk / 64), B*Hk) with `threads` threads."""
    from .. import arrays
    bh, nq, d = q.shape
    bhk, nk, _ = k.shape
    D = arrays.empty_device((bh, nq), q.dtype)
    run_preprocess(dout, out, D, dq, clear=True)
    with _simulator_switch_interval():
        kernel[(ceil_div(nk, BLOCK), bhk), threads](q, k, v, dout, lse, D, dk, dv, dq,
                                                    np.float32(scale), heads, group)


@contextlib.contextmanager
def _simulator_switch_interval(seconds=1e-4):
    """On the simulator: a 0.1 ms GIL switch interval while this kernel runs (none on a GPU).
    The simulator runs one Python thread per CUDA thread, and every device-function call takes
    a per-module lock (numba-cuda's swapped_cuda_module); with the default 5 ms interval a
    preempted lock holder stalls the block's other threads for a whole interval, and these
    kernels' 128 threads with many small device calls took minutes per tile (19 s for a whole
    problem at 0.1 ms). Not for other kernels: the simulator creates a static shared array per
    (file, line) without a lock, so a finer interleaving lets two threads get different arrays
    (the tiled kernels failed three tests in a CI run with the interval set for the whole
    suite, 2026-11-30; at 1 us the tiled forward overflows, and with that allocation under a
    lock it passes); these kernels use dynamic shared memory only."""
    if not SIMULATOR:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


class _SwitchIntervalLaunch:
    """kernel[grid, block](*args) run under _simulator_switch_interval."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, config):
        launch = self.kernel[config]

        def run(*args):
            with _simulator_switch_interval():
                launch(*args)
        return run


def simulator_launch(kernel):
    """A launchable kernel that runs under _simulator_switch_interval on the simulator (the
    kernel itself on a GPU): for the other wgmma kernels (forward_wgmma)."""
    return _SwitchIntervalLaunch(kernel) if SIMULATOR else kernel
