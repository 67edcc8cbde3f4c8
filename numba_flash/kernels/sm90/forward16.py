"""The Hopper forward on 16-bit inputs (wgmma, sm_90a): bfloat16 or float16 q, k, v read and
staged as they are stored (no widened copies), products on the tensor core in that format,
FlashAttention-2's loop in float32; the "wgmma16" pair's forward (registry.py).

One warpgroup (128 threads) per 64 query rows, K/V blocks of 64 keys, the head dim zero-padded
to D = 64 or 128. Per K/V block:

    S = Q K^T            wgmma m64n64k16, Q and K staged (sm90.wgmma16's layout), D / 16 steps
                         chained in the tensor core; then S *= scale in float32 (scale Q is not
                         a half value: S is formed from the inputs themselves, as in
                         reference.half's flash model)
    online softmax       sm90.softmax, on the float32 S: m, l, alpha, P = exp(S - m) (l sums
                         the float32 P)
    O = O alpha + P V    P rounded to the input format (FlashAttention's rounding) and packed
                         two to a register: S's accumulator entries 8 s..8 s + 7 are, in pairs,
                         the register A fragment of step s (wgmma16.a_fragment16), so no
                         exchange; V^T staged (head dim as rows, keys along K); wgmma
                         m64nDk16, 4 steps, accumulated into O in the tensor core.

At the end O / l rounded to the input format (out) and lse = m + log l in float32.
"""

import functools

import numpy as np
from numba import cuda, float32, uint16, uint32

from reference.precision import half_format

from ..support import (ALIGN, NEG_INF, SIMULATOR, U, DynamicSharedKernel, head_index,
                       inlined_device_function, kernel_jit, kv_head, simulator_launch)
from .operands import BLOCK, REGS
from .softmax import finish_rows, make_online_softmax
from .wgmma import SCRATCH, WARPGROUP, fence_proxy_async
from .wgmma16 import make_pack_half2, products16

D_MAX = 128          # head dims up to this; zero-padded to 64 or 128
LOADS = 8            # words a thread loads before it stores them (staging)
P_WORDS = REGS // 2  # P's register A fragments: its 32 entries, two to a word


def tiles(d):
    """(block_m, block_n) = (64, 64) for every d it takes."""
    return BLOCK, BLOCK


def check(block_m, block_n, d, dtype):
    """ValueError unless a half dtype, 1 <= d <= 128 and tiles (64, 64)."""
    if not half_format(dtype):
        raise ValueError(f"the wgmma16 forward takes float16 and bfloat16 inputs, got "
                         f"{np.dtype(dtype)}")
    if not 1 <= d <= D_MAX:
        raise ValueError(f"the wgmma16 forward takes head dims 1..{D_MAX}, got d={d}")
    if (block_m, block_n) != (BLOCK, BLOCK):
        raise ValueError(f"the wgmma16 forward has fixed tiles (64, 64), got "
                         f"({block_m}, {block_n})")


def make_stage16(R, K, transposed):
    """stage(sh32, at, src, head, row0, d) for an R x K 16-bit tile (wgmma16's layout) at
    element offset `at` (even) of shared memory, written as 32-bit words (sh32: the uint32
    view): not transposed, element (r, k) = src[head, row0 + r, k] (Q and K: rows are tokens,
    K the head dim); transposed, (r, k) = src[head, row0 + k, r] (V^T: rows the head dim, K
    the keys). Zero past src's rows or the head dim d. src: uint16 patterns. 128 threads; word
    w = tid + 128 x in layout order (a warp writes one 128-byte core-matrix run)."""
    WORDS = R * K // 2
    KC = K // 8                     # core matrices along K
    ITER = WORDS // WARPGROUP
    assert ITER % LOADS == 0

    @cuda.jit(device=True)
    def element(src, head, n, d, row0, r, k):
        if transposed:
            r, k = k, r
        val = U(0)
        if row0 + r < n and k < d:
            val = U(src[head, row0 + r, k])
        return val

    @cuda.jit(device=True)
    def stage(sh32, at, src, head, row0, d):
        n = U(src.shape[1])
        tid = U(cuda.threadIdx.x)
        rr, kk = (tid % U(32)) // U(4), U(2) * (tid % U(4))      # within a core matrix
        words = cuda.local.array(LOADS, uint32)
        for b in range(ITER // LOADS):
            for u in range(LOADS):
                cm = tid // U(32) + U(4 * (b * LOADS + u))        # the word's core matrix
                r = (cm // U(KC)) * U(8) + rr
                k = (cm % U(KC)) * U(8) + kk
                words[u] = (element(src, head, n, d, row0, r, k)
                            | (element(src, head, n, d, row0, r, k + U(1)) << U(16)))
            for u in range(LOADS):
                sh32[at // U(2) + tid + U(WARPGROUP * (b * LOADS + u))] = words[u]
    return stage


@functools.lru_cache(maxsize=None)
def make_kernel(D, causal, fmt):
    """The kernel for head dims up to D (64 or 128): grid (ceil(Nq / 64), B*H), 128 threads,
    arguments (q, k, v, out, lse, scale, heads, group): q, k, v, out (B*H, N, d) uint16 device
    arrays holding `fmt` ("bfloat16" or "float16") patterns, lse (B*H, Nq) float32, scale
    float32. Returns (kernel, threads)."""
    if D not in (64, 128):
        raise ValueError(f"D must be 64 or 128, got {D}")
    Q_AT, K_AT, VT_AT = 0, BLOCK * D, 2 * BLOCK * D          # 16-bit element offsets
    SCRATCH_AT = 3 * BLOCK * D // 2                           # floats: the simulator's exchanges
    NBYTES = 6 * BLOCK * D + (4 * SCRATCH if SIMULATOR else 0)
    O_REGS = D // 2                                           # O's accumulator entries
    s_product = products16(BLOCK, D, BLOCK, fmt)["mma_ss"]   # S = Q K^T: 64 x 64, K = D
    pv_product = products16(D, D, BLOCK, fmt)["mma_rs"]      # O += P V: 64 x D, K = 64 keys
    stage_qk = make_stage16(BLOCK, D, False)
    stage_vt = make_stage16(D, BLOCK, True)
    pack = make_pack_half2(fmt)
    online_softmax = make_online_softmax(causal)
    uBM = U(BLOCK)

    @inlined_device_function
    def pack_p(p_regs, s_acc):
        """P's register A fragments for P V: entries 2w, 2w + 1 rounded into word w."""
        for w in range(P_WORDS):
            p_regs[w] = pack(s_acc[2 * w], s_acc[2 * w + 1])

    @kernel_jit(WARPGROUP)
    def forward16(q, k, v, out, lse, scale, heads, group):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)     # the tiles
        sh32 = cuda.shared.array(0, uint32, alignment=ALIGN)   # the same memory, as words
        sm = cuda.shared.array(0, float32, alignment=ALIGN)    # and as floats (scratch)
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tid = U(cuda.threadIdx.x)
        warp, lane = tid // U(32), tid % U(32)
        row0 = U(cuda.blockIdx.x) * uBM
        nq, nk, d = U(q.shape[1]), U(k.shape[1]), U(q.shape[2])
        g4, t4 = lane // U(4), lane % U(4)
        row, col_t = warp * U(16) + g4, t4 * U(2)
        i0, i1 = row0 + row, row0 + row + U(8)
        s_acc = cuda.local.array(REGS, float32)          # S, then P
        o_acc = cuda.local.array(O_REGS, float32)        # O, unnormalized
        p_regs = cuda.local.array(P_WORDS, uint32)       # P rounded, two to a word
        m = cuda.local.array(2, float32)
        l = cuda.local.array(2, float32)
        m_safe = cuda.local.array(2, float32)
        alpha = cuda.local.array(2, float32)
        stage_qk(sh32, U(Q_AT), q, bh, row0, d)
        for h in range(2):
            m[h] = float32(NEG_INF)
            l[h] = float32(0.0)
        for j in range(O_REGS):
            o_acc[j] = float32(0.0)

        n_end = nk
        if causal:      # key j is visible to query i iff j + nq <= i + nk; none past the block
            last = row0 + uBM + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        first = n0
        more = n0 < n_end
        while more:
            cuda.syncthreads()                      # every warp is done with the last tiles
            stage_qk(sh32, U(K_AT), k, kv, n0, d)
            stage_vt(sh32, U(VT_AT), v, kv, n0, d)
            fence_proxy_async()
            cuda.syncthreads()
            n1 = n0 + uBM

            s = s_product(sh, U(Q_AT), U(K_AT))
            for j in range(REGS):
                s_acc[j] = s[j] * scale
            online_softmax(sm, U(SCRATCH_AT), s_acc, m, l, m_safe, alpha, n0, i0, i1, col_t,
                           nq, nk)
            for j in range(O_REGS):
                o_acc[j] *= alpha[(j % 4) // 2]
            pack_p(p_regs, s_acc)
            pv_product(sh, sm, o_acc, p_regs, U(VT_AT), U(SCRATCH_AT))
            n0 = n1 if n1 < n_end else U(0)
            more = n0 != first

        inv0, inv1 = finish_rows(sm, U(SCRATCH_AT), lse, bh, m, l, i0, i1, t4, nq)
        for j in range(0, O_REGS, 2):           # entries j, j + 1: columns c, c + 1 of a row
            h = (j % 4) // 2
            i = i1 if h else i0
            inv = inv1 if h else inv0
            c = U(8 * (j // 4)) + col_t
            word = pack(o_acc[j] * inv, o_acc[j + 1] * inv)
            if i < nq and c < d:
                out[bh, i, c] = uint16(word & U(0xFFFF))
                if c + U(1) < d:
                    out[bh, i, c + U(1)] = uint16(word >> U(16))

    return simulator_launch(DynamicSharedKernel(forward16, NBYTES)), WARPGROUP


def make_forward_kernel(block_m, block_n, head_dim, causal, dtype):
    """(launch, threads) for the registry: the kernel for head_dim's padded D and the format
    of dtype (check() first)."""
    check(block_m, block_n, head_dim, dtype)
    return make_kernel(64 if head_dim <= 64 else 128, bool(causal), half_format(dtype))
