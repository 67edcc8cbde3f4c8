"""The online softmax of the Hopper family, on a warpgroup's 64 x 64 accumulator of S
(wgmma.position: a thread holds rows i0 = row and i1 = row + 8 of its warp's 16, columns
col_t, col_t + 1 of each 8-column group; a row's entries live in the 4 threads of a quad).

Per K/V block (FlashAttention-2's forward): S masked, m_new = max(m, rowmax S),
alpha = exp(m - m_new), l = l alpha + rowsum P with P = exp(S - m_new); the caller rescales O
by alpha. At the end lse = m + log l (-inf for a row that saw no key) and O / l.
The backward recomputes P = exp(S - lse) (support.make_recompute_p; the causal wide kernel:
causal_key_limits, exp_where), with S formed as the forward formed it (sm90.operands).
"""

import functools
import math

import numpy as np
from numba import float32

from ..support import NEG_INF, SIMULATOR, U, exp2_approx, inlined_device_function
from .operands import REGS
from .wgmma import quad_max, quad_sum, warp_any


LOG2E = math.log2(math.e)
LN2 = math.log(2.0)
FLT_MAX = float(np.finfo(np.float32).max)
# Lazy rescaling (make_online_softmax_lazy): the reference max of a row moves only when a new
# row max passes it by more than LAZY_LOG2 units of log2, so P <= 2^LAZY_LOG2 = 256 (exact in
# bfloat16 and float16, far inside float32 and fp16's 65504 for P and for l, O's sums); past
# |m scale log2 e| >= LAZY_OFF the rounding of fma(S, c, -m c) is ~2^-4 units and the max
# moves every block as it would without laziness
LAZY_LOG2 = 8.0
LAZY_OFF = float(2 ** 20)


@inlined_device_function
def visible_end(i, nq, nk):
    """Causal: the keys row i sees are those below min(nk, i + nk - nq + 1) (key j visible
    iff j + nq <= i + nk; 0 for a row that sees none). Unsigned: for a row below nq,
    i + nk + 1 < nq + nk < 2^32 (api.MAX_LENGTH); a padding row's may wrap near 2^32, but
    its entries are never stored (the backward's: lse = -inf there, causal_key_limits)."""
    t = i + nk + U(1)
    return min(t - nq, nk) if t > nq else U(0)


@inlined_device_function
def causal_key_limits(lse0, lse1, i0, i1, key0, nq, nk):
    """(lim0, lim1), uint32: the causal backward's mask of a thread's two rows i0, i1 as one
    bound each, so that row i_h sees the key key0 + c (c >= 0, the entry's offset among the
    thread's columns, a constant) iff c < lim_h: the keys below visible_end(i_h), none on a
    row with lse = -inf (past nq, row_stats; or one that saw no key). The entries
    support.make_recompute_p's test keeps, with one 32-bit compare an entry where that test
    was four in 64 bits. Timed in the wide float32 backward (causal: 1.01-1.025x GPU time, H200,
    2026-12-06); the same bound in the unmasked kernels (key < nk) and in the lean one ran
    0.96-0.99x, so those keep recompute_p."""
    k0 = U(key0)
    end0, end1 = U(visible_end(i0, nq, nk)), U(visible_end(i1, nq, nk))
    lim0 = U(end0 - k0) if end0 > k0 and lse0 != float32(NEG_INF) else U(0)
    lim1 = U(end1 - k0) if end1 > k0 and lse1 != float32(NEG_INF) else U(0)
    return lim0, lim1


def _exp_where(s, lse, c, lim):
    """exp(s - lse) where c < lim (causal_key_limits), else 0: the exp of every entry, a masked
    one's discarded by a select (a branch around the exp made each entry a chain of its own
    between convergence barriers, which ptxas did not interleave: Nsight Compute, 2026-12-06)."""
    p = math.exp(s - lse)
    return p if c < lim else float32(0.0)


def _exp_where_branch(s, lse, c, lim):
    """_exp_where on the simulator: math.exp there raises on a masked entry's large s - lse."""
    return math.exp(s - lse) if c < lim else float32(0.0)


# exp_where(s, lse, c, lim): P_ij of one entry, c = U(its constant column offset)
exp_where = inlined_device_function(_exp_where_branch if SIMULATOR else _exp_where)


def row_max_fn(causal):
    """row_max(s_acc, masked, n0, i0, i1, col_t, nq, nk): the masked row max of a tile over
    the thread's 16 entries of each of its two rows (masked entries set to -inf in s_acc);
    masked: False for a block whose keys every row sees (nothing masked)."""
    @inlined_device_function
    def row_max_causal(s_acc, masked, n0, i0, i1, col_t, nq, nk):
        if masked:
            # one compare and a select an entry against the row's bound: the test written
            # per entry as `key >= nk or (causal and key + nq > i + nk)` compiled to a
            # branch an entry (ptxas's BSSY / BSYNC), in every block of the causal kernels
            end0, end1 = visible_end(i0, nq, nk), visible_end(i1, nq, nk)
            for nt in range(REGS // 4):
                for e in range(4):
                    j = 4 * nt + e
                    key = n0 + U(8 * nt + e % 2) + col_t
                    s_acc[j] = s_acc[j] if key < (end1 if e // 2 else end0) else float32(NEG_INF)
        mx0, mx1 = float32(NEG_INF), float32(NEG_INF)
        for nt in range(REGS // 4):
            for e in range(4):
                x = s_acc[4 * nt + e]
                if e // 2:
                    mx1 = max(mx1, x)
                else:
                    mx0 = max(mx0, x)
        return mx0, mx1

    @inlined_device_function
    def row_max(s_acc, masked, n0, i0, i1, col_t, nq, nk):
        # unmasked kernels keep the one-loop form (one compare an entry, no branch): a tree
        # with the two-loop form above in them (and forward16's causal-only loop compiled in,
        # dead) ran them 0.97-0.99x at d = 64 (GPU time, tools/gpu_time.py, 2026-12-04)
        mx0, mx1 = float32(NEG_INF), float32(NEG_INF)
        for nt in range(REGS // 4):
            for e in range(4):
                j = 4 * nt + e
                x = s_acc[j]
                if masked:
                    key = n0 + U(8 * nt + e % 2) + col_t
                    if key >= nk:
                        x = float32(NEG_INF)
                    s_acc[j] = x
                if e // 2:
                    mx1 = max(mx1, x)
                else:
                    mx0 = max(mx0, x)
        return mx0, mx1
    return row_max_causal if causal else row_max


@functools.lru_cache(maxsize=None)
def make_online_softmax(causal):
    """online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1, col_t, nq, nk):
    one K/V block's step of the online softmax on a warpgroup's 64 x 64 S (the accumulator
    entries s_acc of rows i0, i1 and keys n0 + col_t.., wgmma.position), in place: S masked
    (keys past nk; causal), m = max(m, rowmax S), alpha = exp(m_old - m_new), l = l alpha +
    rowsum P, and s_acc = P = exp(S - m); the caller rescales O by alpha. m, l, m_safe,
    alpha: the thread's two rows' (l its share of the row sum, m_safe m or 0 while a row has
    seen no key); the row max over the quad by quad_max (scratch: the simulator's exchange).
    Shared by both forward kernels (sm90.forward). masked: False for a block in which every
    key is visible to every row (neither past nk nor, causal, past the diagonal), whose
    masking is skipped (the forwards pass it per block: most blocks of a long row need
    none; in the float32 forward 1.003-1.037x, H100, 2026-12-07). The 16-bit
    forward's step, in units of log2, is make_online_softmax_lazy's."""
    exp = math.exp
    row_max = row_max_fn(causal)

    @inlined_device_function
    def online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1, col_t, nq,
                       nk):
        # mask, then the row max of this tile: the thread's 16 entries, then its quad's
        mx0, mx1 = row_max(s_acc, masked, n0, i0, i1, col_t, nq, nk)
        mx0 = quad_max(sm, scratch, mx0)
        mx1 = quad_max(sm, scratch, mx1)
        for h in range(2):
            m_new = max(m[h], mx1 if h else mx0)
            # guard: a row that has seen no key yet keeps m = -inf, P = 0, O = 0
            m_safe[h] = m_new if m_new != float32(NEG_INF) else float32(0.0)
            alpha[h] = exp(m[h] - m_safe[h])
            m[h] = m_new
            l[h] *= alpha[h]
        for j in range(REGS):
            h = (j % 4) // 2
            p = exp(s_acc[j] - m_safe[h])
            s_acc[j] = p
            l[h] += p
    return online_softmax


@functools.lru_cache(maxsize=None)
def make_online_softmax_lazy(causal):
    """online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1, col_t, nq,
    nk, c, tau) -> rescaled: make_online_softmax's step for sm90.forward16, in units of log2
    (every exponential exp2_approx; lse = m c ln 2 + log l: make_finish_rows(base2=True)), with
    two changes from FlashAttention-2 and -4.
    The scale in the exponent (FA2): s_acc holds S = Q K^T unscaled, m its running max
    unscaled, and P = 2^(S c - m c) = ex2(fma(S, c, -m c)) with c = scale log2 e > 0 (the max
    of S c is c times the max of S): one FFMA an entry where scaling S first costs an FMUL and
    an FADD; lse = m c ln 2 + log l (the caller passes m c to finish_rows).
    Lazy rescaling (FA4): m is a reference max that moves only when a row max of this block
    passes it by more than tau = LAZY_LOG2 / c (the caller's, capped at FLT_MAX so that a tiny
    c gives no inf), or once |m c| >= LAZY_OFF; a warp moves all its rows' references when any
    row needs it (warp_any: no divergence). Otherwise P <= 2^LAZY_LOG2, alpha = 1, l and O
    stay as they are: returns False and the caller skips O *= alpha (D / 2 FMUL a thread) and
    the exponentials of alpha. m_safe holds m c (0 while a row has seen no key): the caller
    sets it to 0 with m = -inf. lse is the same: l is the sum of 2^(S c - m c) for whichever m.
    NaN in S stays NaN (max ignores it; P = ex2(NaN) = NaN); +inf moves m to +inf (P NaN)."""
    row_max = row_max_fn(causal)

    @inlined_device_function
    def far(m, c):
        """|m c| >= LAZY_OFF for a finite m (a row that has seen no key keeps m = -inf)."""
        x = abs(m) * c
        return x >= float32(LAZY_OFF) and x != float32(np.inf)

    @inlined_device_function
    def online_softmax(sm, scratch, s_acc, m, l, m_safe, alpha, masked, n0, i0, i1, col_t, nq,
                       nk, c, tau):
        mx0, mx1 = row_max(s_acc, masked, n0, i0, i1, col_t, nq, nk)
        mx0 = quad_max(sm, scratch, mx0)
        mx1 = quad_max(sm, scratch, mx1)
        # mx - m: inf where a row meets its first key (m = -inf), NaN (no move) while it
        # has seen none
        move = mx0 - m[0] > tau or mx1 - m[1] > tau or far(m[0], c) or far(m[1], c)
        rescaled = warp_any(sm, scratch, move)
        if rescaled:
            for h in range(2):
                m_new = max(m[h], mx1 if h else mx0)
                # a row that has seen no key yet keeps m = -inf, P = 0, O = 0
                m_safe[h] = m_new * c if m_new != float32(NEG_INF) else float32(0.0)
                alpha[h] = exp2_approx(m[h] * c - m_safe[h])
                m[h] = m_new
                l[h] = l[h] * alpha[h]
        for j in range(REGS):
            h = (j % 4) // 2
            p = exp2_approx(s_acc[j] * c - m_safe[h])
            s_acc[j] = p
            l[h] += p
        return rescaled
    return online_softmax


@functools.lru_cache(maxsize=None)
def make_finish_rows(base2=False):
    """finish_rows(sm, scratch, lse, bh, m, l, i0, i1, t4, nq): the end of the online softmax
    for the thread's rows i0, i1: l summed over the quad, lse = m + log l stored (m ln 2 +
    log l when m is in units of log2, base2; -inf for a row that saw no key, l = 0; l >= 1
    wherever m is finite, the max entry giving exp 0; NaN for a row that met a NaN or +inf
    logit, l NaN); returns 1 / l of both rows (0 for a row that saw no key), O's factors."""
    @inlined_device_function
    def natural(x):
        return x * float32(LN2) if base2 else x

    @inlined_device_function
    def finish_rows(sm, scratch, lse, bh, m, l, i0, i1, t4, nq):
        l0 = quad_sum(sm, scratch, l[0])
        l1 = quad_sum(sm, scratch, l[1])
        if t4 == U(0):
            if i0 < nq:
                lse[bh, i0] = (natural(m[0]) + math.log(l0) if l0 != float32(0.0)
                               else float32(NEG_INF))
            if i1 < nq:
                lse[bh, i1] = (natural(m[1]) + math.log(l1) if l1 != float32(0.0)
                               else float32(NEG_INF))
        inv0 = float32(1.0) / l0 if l0 != float32(0.0) else float32(0.0)
        inv1 = float32(1.0) / l1 if l1 != float32(0.0) else float32(0.0)
        return inv0, inv1
    return finish_rows


finish_rows = make_finish_rows()
