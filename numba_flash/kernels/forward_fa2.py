"""Forward kernel, FA2 variant: the tiled kernel's thread tiles with FlashAttention-2's split of
the work, vector shared-memory loads and tiles larger than 48 KiB.

What changes against forward_tiled.py, and why:
  * Each query row belongs to one warp (thread (ty, tx) owns rows ty + a*TY, and a warp holds
    whole ty rows), so row statistics and P never leave the warp: the row max goes through a
    small shared buffer with warp barriers only, P is written and read by the same warp, and l
    is kept as per-thread partial sums (alpha is the same for the whole row) that are added up
    once, at the end. Two block barriers per K/V tile instead of four.
  * Shared-memory reads are 16-byte vectors (ld.shared.v4.f32): the S loop walks the head dim
    four at a time along rows of Q and K, the PV loop four keys at a time along rows of P, and
    each thread's O columns come in runs of four. Each vector load feeds 8 to 32 FMAs.
  * The shared arrays are carved from one dynamic allocation, which may exceed the 48 KiB
    Numba's static arrays are capped at (launch.Launcher), so d = 128 can use
    64 x 64 tiles.
Rows of Q and K are padded by 4 elements so that the 8 lanes of a quarter-warp reading 8
different rows at the same column hit 8 different groups of 4 banks.

Per K/V tile (the first one is staged before the loop):
  1. issue the global loads of the next K and V tile into registers.
  2. S = (scale Q) K^T in registers; masked entries -inf; each thread's partial row max into
     the shared row buffer; warp barrier.
  3. m_new = max(m, row max); alpha = exp(m - m_new); P = exp(S - m_new) into shared;
     l = alpha l + rowsum(P) (partial); O *= alpha; warp barrier.
  4. O += P V; block barrier.
  5. the next K and V from registers into shared memory; block barrier.
"""

import functools
import math

import numpy as np

from numba import cuda

from .support import (NEG_INF, U, Launcher, ceil_div, check_block,
                      check_shared_memory, check_head_dim, dynamic_shared_limit, kernel_jit,
                      head_index, kv_head, numba_type, warp_barrier)
from .fa2_tiles import ALIGN, CHUNK, PAD, lanes_for_head_dim, tile_products
from .vector_io import VECTOR, AlignedDispatch, load4, require_aligned, store4

SM_SHARED_BYTES = 228 * 1024   # shared memory of one Hopper SM (H100, H200)


def thread_shape(block_m, block_n, head_dim, threads=None, item=4):
    """(TY, TX): `threads` if given, else TX from fa2_tiles.lanes_for_head_dim (fewer if
    block_n is small) and TY = block_m / TM, where each thread owns TM = 8 query rows (4 for
    d > 128 or float64, whose O accumulators would not fit in registers)."""
    if threads is not None:
        return tuple(threads)
    tx = lanes_for_head_dim(head_dim)
    while tx > 1 and block_n % tx:
        tx //= 2
    rows = 8 if head_dim <= 128 and item == 4 else 4
    return max(1, block_m // rows), tx


def _layout(block_m, block_n, head_dim, threads=None, item=4):
    """Offsets (in elements) of Q, K, V, P and the row buffer inside the dynamic allocation."""
    ty, tx = thread_shape(block_m, block_n, head_dim, threads, item)
    d_pad = ceil_div(head_dim, CHUNK * tx) * CHUNK * tx
    d_row, s_row = d_pad + PAD, block_n + PAD
    sizes = dict(q=block_m * d_row, k=block_n * d_row, v=block_n * d_pad, p=block_m * s_row,
                 r=block_m * ceil_div(tx, CHUNK) * CHUNK)
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += size
    return ty, tx, d_pad, d_row, s_row, offsets, total


def shared_bytes(block_m, block_n, head_dim, item, threads=None):
    """Bytes of dynamic shared memory one block uses."""
    return item * _layout(block_m, block_n, head_dim, threads, item)[-1]


def default_blocks(head_dim, dtype):
    """(block_m, block_n), chosen by `numba-flash tune` on an H200 (float32): (128, 128) at
    d = 64, (128, 64) at d = 128, both with 16 x 16 threads and the prefetch; smaller tiles for
    larger d and for float64 (figures in docs/performance.md, "Figures that were in the kernel
    docstrings")."""
    item = np.dtype(dtype).itemsize
    if item == 4:
        choices = ((64, 32),) if head_dim <= 16 else ((64, 64),) if head_dim <= 32 else \
            ((128, 128),) if head_dim <= 64 else ((128, 64),) if head_dim <= 128 else ((64, 32),)
    else:
        choices = ((64, 32),) if head_dim <= 128 else ((32, 32),)
    for block_m, block_n in choices + ((32, 32), (16, 16)):
        if shared_bytes(block_m, block_n, head_dim, item) <= dynamic_shared_limit():
            return block_m, block_n
    raise ValueError(f"no tile fits head dim {head_dim}")


def vector_loads_by_default(head_dim, dtype):
    """Whether vector_loads=None (the default) means the vector path: float32 with
    64 < d <= 128 and d % 4 == 0, where `numba-flash tune` timed it faster on an H200 (d = 128,
    128 x 64 tiles, prefetch on, with and without the vector O store); at d = 64 it was slower
    in both tunes, elsewhere untimed (figures in docs/performance.md)."""
    return np.dtype(dtype).itemsize == 4 and 64 < head_dim <= 128 and head_dim % VECTOR == 0


@functools.lru_cache(maxsize=None)
def make_forward_kernel(block_m, block_n, head_dim, causal, dtype, threads=None, prefetch=None,
                        vector_loads=None):
    """Compile-time constants in, (launcher, threads_per_block) out. Launch as
    launcher[grid, threads](q, k, v, out, lse, scale, heads, group) with grid
    (ceil(Nq / block_m), B*H); the launcher adds the dynamic shared memory.
    threads = (TY, TX) overrides the thread shape (TX must divide 32), for tuning.
    prefetch: load the next K/V tile into registers while this one is computed. By default on
    when a block needs more than half an SM's shared memory (no second block on the SM then
    hides the loads) and the registers allow it: it costs 2 * block_n * d / threads registers
    per thread, on top of the S and O accumulators; 160 of the 255 for both is what compiled
    without spills (ptxas -v, sm_90).
    vector_loads: stage Q, K and V with 16-byte global loads and write O with 16-byte stores
    (vector_io.load4, store4; d a multiple of 4, else ValueError). True: the launcher rejects
    arrays whose rows are not 16-byte aligned. None (the default): where
    vector_loads_by_default says so, the launcher takes the vector path for aligned arrays and
    the scalar one otherwise (vector_io.AlignedDispatch); elsewhere the scalar path. Why it
    helps at d = 128: a block stages its Q tile and first K/V tile before any compute, 64 + 64
    scalar loads per thread that ptxas issues eight at a time; vectors make that 16 + 16; and
    the scalar O store of a warp touches four times the 32-byte sectors it writes (ncu).
    False: the scalar path, whose PTX is the same as before the option existed (the vector
    path is separate code under `if VEC`)."""
    check_block("block_m", block_m, 256)
    check_block("block_n", block_n, 256)
    check_head_dim(head_dim)
    if vector_loads is None:
        if not vector_loads_by_default(head_dim, dtype):
            vector_loads = False
        else:
            build = functools.partial(make_forward_kernel, block_m, block_n, head_dim, causal,
                                      dtype, threads, prefetch)
            (vector, threads_per_block), (scalar, _) = build(True), build(False)
            return AlignedDispatch(vector, scalar, positions=range(4)), threads_per_block
    T = numba_type(dtype)
    item = T.bitwidth // 8
    TY, TX, D_PAD, D_ROW, S_ROW, off, total = _layout(block_m, block_n, head_dim, threads, item)
    if TX not in (1, 2, 4, 8, 16, 32) or TY * TX > 1024:
        raise ValueError(f"fa2 forward needs TX dividing 32 (rows stay inside a warp) and at "
                         f"most 1024 threads, got (TY, TX) = ({TY}, {TX})")
    if block_m % TY or block_n % TX or block_n % CHUNK:
        raise ValueError(f"fa2 forward needs block_m a multiple of {TY} and block_n a multiple "
                         f"of {max(TX, CHUNK)}, got {block_m} and {block_n}")
    if vector_loads and head_dim % VECTOR:
        raise ValueError(f"fa2 forward with vector_loads needs d a multiple of {VECTOR}, "
                         f"got {head_dim}")
    check_shared_memory(
        f"fa2 forward with block_m={block_m}, block_n={block_n}, d={head_dim}", item * total,
        "choose smaller blocks",
        dynamic_shared_limit())
    BLOCK_M, BLOCK_N, D = block_m, block_n, head_dim
    TM, TN = BLOCK_M // TY, BLOCK_N // TX
    TE = D_PAD // (CHUNK * TX)                       # runs of CHUNK O columns per thread
    TD = TE * CHUNK
    NT = TY * TX
    Q_LOADS, KV_LOADS = ceil_div(BLOCK_M * D_PAD, NT), ceil_div(BLOCK_N * D_PAD, NT)
    # with vector loads: loads of VECTOR elements per thread per tile
    VEC = bool(vector_loads)
    Q_VECS = ceil_div(BLOCK_M * D_PAD, NT * VECTOR)
    KV_VECS = ceil_div(BLOCK_N * D_PAD, NT * VECTOR)
    Q_VEVEN = Q_VECS * NT * VECTOR == BLOCK_M * D_PAD
    KV_VEVEN = KV_VECS * NT * VECTOR == BLOCK_N * D_PAD
    if prefetch is None:
        words = item // 4
        prefetch = (item * total > SM_SHARED_BYTES // 2
                    and words * (TM * TN + TM * TD + 2 * KV_LOADS) <= 160)
    PREFETCH = bool(prefetch)
    Q_EVEN, KV_EVEN = Q_LOADS * NT == BLOCK_M * D_PAD, KV_LOADS * NT == BLOCK_N * D_PAD
    NEXT = (KV_VECS * VECTOR if VEC else KV_LOADS) if PREFETCH else 1
    R_ROW = ceil_div(TX, CHUNK) * CHUNK
    uBM, uBN, uD, uDP, uDR, uSR, uRR, uNT, uTX, uTY = (
        U(x) for x in (BLOCK_M, BLOCK_N, D, D_PAD, D_ROW, S_ROW, R_ROW, NT, TX, TY))
    uQ, uK, uV, uP, uR = (U(off[x]) for x in "qkvpr")
    uCH, uRUN = U(CHUNK), U(CHUNK * TX)
    dot_rows, accumulate = tile_products(T, TM, TN, TY, TX, D_PAD, D_ROW, S_ROW, D_PAD)

    @cuda.jit(device=True)
    def slot(it, tid):
        """(row, column) of the it-th element this thread stages of a tile with D_PAD columns."""
        idx = tid + U(it) * uNT
        return idx // uDP, idx % uDP

    @cuda.jit(device=True)
    def element(src, head, row0, r, c, mult):
        """mult * src[head, row0 + r, c], zero past the rows of src or past the head dim."""
        if row0 + r < U(src.shape[1]) and c < uD:
            return src[head, row0 + r, c] * mult
        return T(0.0)

    uDV = U(D_PAD // VECTOR)

    @cuda.jit(device=True)
    def vector_slot(it, tid):
        """(row, first column) of the it-th vector this thread stages of a tile."""
        idx = tid + U(it) * uNT
        return idx // uDV, (idx % uDV) * U(VECTOR)

    @cuda.jit(device=True)
    def load_vector(src, head, row0, r, c):
        """src[head, row0 + r, c : c + 4] (one 16-byte load), zeros past the rows or the head
        dim (d % 4 == 0: the four are all inside or all outside)."""
        if row0 + r < U(src.shape[1]) and c < uD:
            return load4(src, head, row0 + r, c)
        return T(0.0), T(0.0), T(0.0), T(0.0)

    @cuda.jit(device=True)
    def store_vector(sm, at, x, mult):
        for e in range(VECTOR):
            sm[at + U(e)] = x[e] * mult

    @cuda.jit(device=True)
    def stage_vector(sm, dst, row_len, src, head, row0, r, c, mult):
        """sm[dst + r * row_len + c ...] = mult * src[head, row0 + r, c : c + 4]."""
        store_vector(sm, dst + r * row_len + c, load_vector(src, head, row0, r, c), mult)

    @kernel_jit(NT)
    def forward_fa2(q, k, v, out, lse, scale, heads, group):
        sm = cuda.shared.array(0, T, alignment=ALIGN)
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kv = U(kv_head(head, heads, group))
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        m0 = U(cuda.blockIdx.x) * uBM
        nq, nk = U(q.shape[1]), U(k.shape[1])
        # causal: key j visible to query i iff j <= i + nk - nq, i.e. j + nq <= i + nk

        s = cuda.local.array((TM, TN), T)
        o = cuda.local.array((TM, TD), T)
        m = cuda.local.array(TM, T)              # running row max
        l = cuda.local.array(TM, T)              # this thread's share of the running row sum
        k_next = cuda.local.array(NEXT, T)       # this thread's share of the next K/V tile
        v_next = cuda.local.array(NEXT, T)

        # Q tile, pre-multiplied by scale, zero outside the problem
        if VEC:
            for it in range(Q_VECS):
                r, c = vector_slot(it, tid)
                if Q_VEVEN or r < uBM:
                    stage_vector(sm, uQ, uDR, q, bh, m0, r, c, T(scale))
        else:
            for it in range(Q_LOADS):
                r, c = slot(it, tid)
                if Q_EVEN or r < uBM:
                    sm[uQ + r * uDR + c] = element(q, bh, m0, r, c, T(scale))
        for a in range(TM):
            m[a] = T(NEG_INF)
            l[a] = T(0.0)
            for c in range(TD):
                o[a, c] = T(0.0)

        n_end = nk
        if causal:                                 # no key past the block's last row
            last = m0 + uBM + nk                   # keys j < last - nq are visible to some row
            n_end = min(nk, last - nq) if last > nq else U(0)
        # the first K/V tile goes straight to shared memory (later ones too without PREFETCH)
        n0 = U(0)
        if VEC and n0 < n_end:
            for it in range(KV_VECS):
                j, c = vector_slot(it, tid)
                if KV_VEVEN or j < uBN:
                    stage_vector(sm, uK, uDR, k, kv, n0, j, c, T(1.0))
                    stage_vector(sm, uV, uDP, v, kv, n0, j, c, T(1.0))
        elif n0 < n_end:
            for it in range(KV_LOADS):
                j, c = slot(it, tid)
                if KV_EVEN or j < uBN:
                    sm[uK + j * uDR + c] = element(k, kv, n0, j, c, T(1.0))
                    sm[uV + j * uDP + c] = element(v, kv, n0, j, c, T(1.0))
        cuda.syncthreads()
        while n0 < n_end:
            # 1. issue the loads of the next K/V tile into registers; they land while this
            # tile is computed (one block per SM leaves no other block to hide them behind)
            n1 = n0 + uBN
            if VEC and PREFETCH and n1 < n_end:
                for it in range(KV_VECS):
                    j, c = vector_slot(it, tid)
                    if KV_VEVEN or j < uBN:
                        x, y = load_vector(k, kv, n1, j, c), load_vector(v, kv, n1, j, c)
                        for e in range(VECTOR):
                            k_next[it * VECTOR + e] = x[e]
                            v_next[it * VECTOR + e] = y[e]
            elif PREFETCH and n1 < n_end:
                for it in range(KV_LOADS):
                    j, c = slot(it, tid)
                    if KV_EVEN or j < uBN:
                        k_next[it] = element(k, kv, n1, j, c, T(1.0))
                        v_next[it] = element(v, kv, n1, j, c, T(1.0))

            # 2. S = Q K^T, CHUNK columns of the head dim at a time (vector loads)
            dot_rows(sm, uQ, uK, s, ty, tx)
            for a in range(TM):
                r = ty + U(a) * uTY
                row_max = T(NEG_INF)
                for b in range(TN):
                    j = n0 + tx + U(b) * uTX
                    if j >= nk or (causal and j + nq > m0 + r + nk):
                        s[a, b] = T(NEG_INF)
                    row_max = max(row_max, s[a, b])
                sm[uR + r * uRR + tx] = row_max
            warp_barrier()

            # 3. statistics (every thread of a row computes the same m_new), P, O *= alpha
            for a in range(TM):
                r = ty + U(a) * uTY
                m_new = m[a]
                for t in range(TX):
                    m_new = max(m_new, sm[uR + r * uRR + U(t)])
                # guard: while a row has seen no visible key, m stays -inf and alpha is moot
                alpha = math.exp(m[a] - m_new) if m_new != T(NEG_INF) else T(0.0)
                m_safe = m_new if m_new != T(NEG_INF) else T(0.0)
                row_sum = T(0.0)
                for b in range(TN):
                    p = math.exp(s[a, b] - m_safe)
                    sm[uP + r * uSR + tx + U(b) * uTX] = p
                    row_sum += p
                l[a] = alpha * l[a] + row_sum
                m[a] = m_new
                for c in range(TD):
                    o[a, c] *= alpha
            warp_barrier()

            # 4. O += P V, CHUNK keys at a time; this thread's columns are runs of CHUNK
            accumulate(sm, uP, uV, uBN, o, ty, tx)
            cuda.syncthreads()                     # every warp is done with K, V and P

            # 5. the next tile into shared memory, from registers or straight from memory
            if VEC and n1 < n_end:
                for it in range(KV_VECS):
                    j, c = vector_slot(it, tid)
                    if KV_VEVEN or j < uBN:
                        if PREFETCH:
                            for e in range(VECTOR):
                                sm[uK + j * uDR + c + U(e)] = k_next[it * VECTOR + e]
                                sm[uV + j * uDP + c + U(e)] = v_next[it * VECTOR + e]
                        else:
                            stage_vector(sm, uK, uDR, k, kv, n1, j, c, T(1.0))
                            stage_vector(sm, uV, uDP, v, kv, n1, j, c, T(1.0))
                cuda.syncthreads()
            elif n1 < n_end:
                for it in range(KV_LOADS):
                    j, c = slot(it, tid)
                    if KV_EVEN or j < uBN:
                        if PREFETCH:
                            sm[uK + j * uDR + c] = k_next[it]
                            sm[uV + j * uDP + c] = v_next[it]
                        else:
                            sm[uK + j * uDR + c] = element(k, kv, n1, j, c, T(1.0))
                            sm[uV + j * uDP + c] = element(v, kv, n1, j, c, T(1.0))
                cuda.syncthreads()
            n0 = n1

        # l = sum of the row's partial sums; out = O / l; rows that saw no key give 0, -inf
        for a in range(TM):
            sm[uR + (ty + U(a) * uTY) * uRR + tx] = l[a]
        warp_barrier()
        for a in range(TM):
            r = ty + U(a) * uTY
            i = m0 + r
            if i < nq:
                l_i = T(0.0)
                for t in range(TX):
                    l_i += sm[uR + r * uRR + U(t)]
                inv_l = T(1.0) / l_i if l_i != T(0.0) else T(0.0)   # l NaN: out NaN
                for e in range(TE):
                    if VEC:                    # the run of CHUNK == VECTOR columns in one store
                        col = U(e) * uRUN + tx * uCH
                        if col < uD:
                            store4(out, bh, i, col, (o[a, e * CHUNK] * inv_l,
                                                     o[a, e * CHUNK + 1] * inv_l,
                                                     o[a, e * CHUNK + 2] * inv_l,
                                                     o[a, e * CHUNK + 3] * inv_l))
                        continue
                    for cc in range(CHUNK):
                        col = U(e) * uRUN + tx * uCH + U(cc)
                        if col < uD:
                            out[bh, i, col] = o[a, e * CHUNK + cc] * inv_l
                if tx == U(0):
                    lse[bh, i] = m[a] + math.log(l_i) if l_i != T(0.0) else T(NEG_INF)

    check = require_aligned(range(4), "fa2 forward with vector_loads needs q, k, v and out")
    launcher = Launcher(forward_fa2, item * total, check=check if VEC else None)
    return launcher, (TX, TY)
