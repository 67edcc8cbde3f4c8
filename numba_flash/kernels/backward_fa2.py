"""Backward kernels, FA2 variants: backward.py's three launches (preprocess D, dK/dV, dQ; no
atomics, bitwise reproducible: "fa2") rebuilt with what made forward_fa2.py fast, and the
two-launch "fa2-atomic" (dq_atomic=True: the dK/dV kernel also adds dQ up with atomics, no dQ
kernel), the default backward since its GPU runs on an H200 (verified, sanitizer-clean and
timed faster than fa2, with its dQ atomics 16 bytes at a time faster still, `vector_atomics`;
figures in docs/performance.md, "Figures that were in the kernel docstrings").

  * One dynamic shared allocation (launch.Launcher), so that d = 128 can use 64 x 64
    tiles instead of backward.py's 16 x 16.
  * Every product reads shared memory in 16-byte vectors: dot products walk the head dim four
    at a time along rows (rows padded by 4, as in forward_fa2), accumulations walk the
    contracted index four at a time, each thread's head-dim columns coming in runs of four.
  * The rows of P^T and dS^T (dK/dV kernel) and of dS (dQ kernel) that a thread reads are
    written by its own warp, so they need a warp barrier only.

dK/dV kernel, per K/V block (rows j owned by ty), over the query heads sharing its key head and
their Q blocks (columns i owned by tx):
  S^T = K (scale Q)^T and dP^T = V dO^T; P^T = exp(S^T - lse_i), dS^T = P^T (dP^T - D_i) into
  shared; dV += P^T dO, dK += dS^T (scale Q).
dQ kernel, per Q block (rows i owned by ty), over K/V blocks (columns j owned by tx):
  S = (scale Q) K^T, dP = dO V^T, dS = P (dP - D_i) into shared; dQ += dS K, times scale at the
  end.
S is summed in the forward's order (head dim ascending, one FMA per term, Q pre-scaled), so P
is recomputed bit for bit (backward.py's docstring says why that matters at large logits).
In float32 fa2-atomic's dV, dK and dQ products run on tensor cores (3xTF32, fa2_mma.py;
`tensor_cores`, on by default there: a tie to a few per cent ahead of FFMA on an H200,
docs/performance.md). dP on tensor cores and P kept in registers were measured and removed
(docs/experiments.md).
"""

import functools

import numpy as np

from numba import cuda

from .backward import run_preprocess
from .support import (NEG_INF, U, Launcher, ceil_div, check_block, check_head_dim,
                      check_shared_memory, dynamic_shared_limit, kernel_jit, head_grid,
                      head_index, kv_head, make_recompute_p, numba_type, warp_barrier)
from .fa2_tiles import ALIGN, CHUNK, DEVICE, PAD, lanes_for_head_dim, tile_products
from .fa2_mma import WARP, mma_products
from .vector_io import VECTOR, AlignedDispatch, add4, require_aligned


def thread_shape(block_m, block_n, head_dim, threads=None):
    """(TY, TX): `threads` if given, else TX = 16 along the head dim (fewer for small d or
    blocks) and TY = 16 (fewer for small blocks)."""
    if threads is not None:
        return tuple(threads)
    tx = lanes_for_head_dim(head_dim)
    while tx > 1 and (block_m % tx or block_n % tx):
        tx //= 2
    ty = 16
    while ty > 1 and (block_m % ty or block_n % ty):
        ty //= 2
    return ty, tx


def _layout(rows_ty, rows_tx, block_m, block_n, head_dim, threads, w_tiles, ds_tile=False):
    """Shared-memory offsets (elements) shared by both kernels: K, V (block_n rows), Q, dO
    (block_m rows), all with padded rows; lse and D (block_m); W, w_tiles tiles of rows_ty
    rows of rows_tx + PAD (P^T and dS^T, or dS); with ds_tile, dS as block_m rows of
    block_n + PAD (the dK/dV kernel that also accumulates dQ)."""
    ty, tx = thread_shape(block_m, block_n, head_dim, threads)
    d_pad = ceil_div(head_dim, CHUNK * tx) * CHUNK * tx
    d_row, w_row = d_pad + PAD, rows_tx + PAD
    m_pad = ceil_div(block_m, CHUNK) * CHUNK
    sizes = dict(k=block_n * d_row, v=block_n * d_row, q=block_m * d_row, do=block_m * d_row,
                 lse=m_pad, D=m_pad, w=w_tiles * rows_ty * w_row,
                 ds=block_m * (block_n + PAD) if ds_tile else 0)
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += size
    return ty, tx, d_pad, d_row, w_row, offsets, total


def shared_bytes(block_m, block_n, head_dim, item, threads=None, dq_atomic=False):
    """Bytes of dynamic shared memory of the larger of the two kernels (the dK/dV one)."""
    return item * _layout(block_n, block_m, block_m, block_n, head_dim, threads, 2,
                          dq_atomic)[-1]


def default_blocks(head_dim, dtype):
    """(block_m, block_n): 64 x 64 in float32 up to d = 128, the fastest of `numba-flash tune`'s
    configurations at d = 64 and 128 on an H200 (16 x 16 threads; figures in
    docs/performance.md)."""
    item = np.dtype(dtype).itemsize
    if item == 4:
        choices = ((64, 64),) if head_dim <= 128 else ((32, 32),)
    else:
        choices = ((32, 32),) if head_dim <= 128 else ((16, 16),)
    for block_m, block_n in choices + ((16, 16),):
        if shared_bytes(block_m, block_n, head_dim, item) <= dynamic_shared_limit():
            return block_m, block_n
    raise ValueError(f"no tile fits head dim {head_dim}")


def default_blocks_atomic(head_dim, dtype):
    """(block_m, block_n) for the dQ-by-atomics dK/dV kernel, which also keeps dS in shared
    memory: 64 x 128 (64 query rows, 128 key rows per block) where it fits, else
    default_blocks' choice, else smaller. 64 x 128 fits float32 up to d = 64: `numba-flash tune`
    on an H200 (16 x 16 threads) timed it fastest at d = 64 and 64 x 64 fastest at d = 128
    (64 x 128 does not fit there; figures in docs/performance.md); more key rows per block
    means fewer atomic adds into each dQ row. Float64 is untuned."""
    item = np.dtype(dtype).itemsize
    for block_m, block_n in ((64, 128), default_blocks(head_dim, dtype), (32, 32), (16, 16)):
        if shared_bytes(block_m, block_n, head_dim, item, dq_atomic=True) <= \
                dynamic_shared_limit():
            return block_m, block_n
    raise ValueError(f"no tile fits head dim {head_dim}")


def _check(block_m, block_n, head_dim, dtype, threads, dq_atomic=False):
    """Validate a configuration (against the dK/dV kernel, the larger); return what the
    compiled kernels are keyed on: (d_pad, d_const, (TY, TX)). One compilation serves every
    head dim that pads to the same D_PAD (the kernels read d from q), except d == D_PAD, which
    is compiled with d constant (see forward_fa2.make_forward_kernel)."""
    check_block("block_m", block_m, 256)
    check_block("block_n", block_n, 256)
    check_head_dim(head_dim)
    T = numba_type(dtype)
    item = T.bitwidth // 8
    TY, TX, D_PAD, D_ROW, W_ROW, off, total = _layout(block_n, block_m, block_m, block_n,
                                                      head_dim, threads, 2, dq_atomic)
    if TX not in (1, 2, 4, 8, 16, 32) or TY * TX > 1024:
        raise ValueError(f"fa2 backward needs TX dividing 32 (rows stay inside a warp) and at "
                         f"most 1024 threads, got (TY, TX) = ({TY}, {TX})")
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        if b % TY or b % TX or b % CHUNK:
            raise ValueError(f"fa2 backward needs {name} a multiple of {TY}, {TX} and "
                             f"{CHUNK}, got {b}")
    check_shared_memory(
        f"fa2 backward{' (dQ by atomics)' if dq_atomic else ''} with block_m={block_m}, "
        f"block_n={block_n}, d={head_dim}", item * total,
        "choose smaller blocks",
        dynamic_shared_limit())
    return D_PAD, head_dim if head_dim == D_PAD else 0, (TY, TX)


@functools.lru_cache(maxsize=None)
def _pieces(rows_ty, rows_tx, block_m, block_n, d_pad, d_const, dtype, threads, w_tiles,
            ds_tile=False):
    """Constants and device functions of one kernel, whose tiles have rows_ty rows owned by ty
    (TA = rows_ty / TY per thread) and rows_tx rows owned by tx (TB = rows_tx / TX), with
    w_tiles rows_ty x rows_tx tiles in shared memory (P^T and dS^T, or dS); arguments as
    _check returns them."""
    T = numba_type(dtype)
    item = T.bitwidth // 8
    TY, TX, D_PAD, D_ROW, W_ROW, off, total = _layout(rows_ty, rows_tx, block_m, block_n,
                                                      d_pad, threads, w_tiles, ds_tile)
    TA, TB = rows_ty // TY, rows_tx // TX
    TE = D_PAD // (CHUNK * TX)
    TD = TE * CHUNK
    uDP, uDR, uWR, uNT, uTX, uTY = (U(x) for x in (D_PAD, D_ROW, W_ROW, TY * TX, TX, TY))
    uCH, uRUN = U(CHUNK), U(CHUNK * TX)
    dot_rows, accumulate = tile_products(T, TA, TB, TY, TX, D_PAD, D_ROW, W_ROW, D_ROW)

    @cuda.jit(**DEVICE)
    def stage(sm, dst, src, head, row0, rows, tid, d, mult):
        """sm[dst + r * D_ROW + c] = mult * src[head, row0 + r, c] for r < rows, c < D_PAD;
        zero past the rows of src or past the head dim d."""
        n = U(src.shape[1])
        idx = tid
        while idx < rows * uDP:
            r = idx // uDP
            c = idx % uDP
            x = T(0.0)
            if row0 + r < n and c < d:
                x = src[head, row0 + r, c] * mult
            sm[dst + r * uDR + c] = x
            idx += uNT

    LOADS = ceil_div(block_m * D_PAD, TY * TX)    # elements of a block_m-row tile per thread

    @cuda.jit(**DEVICE)
    def fetch(regs, src, head, row0, tid, d, mult):
        """regs[it] = what stage(..., rows=block_m, ...) would put in the it-th slot this
        thread stages: the global loads of a block_m-row tile, issued ahead of time."""
        # stage's loop body again, on purpose: folding the two into one device function left
        # the PTX equivalent but changed ptxas's SASS for the default kernel (2 instructions,
        # rescheduled), which was timed on the GPU as it is
        n = U(src.shape[1])
        for it in range(LOADS):
            idx = tid + U(it) * uNT
            r = idx // uDP
            c = idx % uDP
            x = T(0.0)
            if row0 + r < n and c < d:
                x = src[head, row0 + r, c] * mult
            regs[it] = x

    @cuda.jit(**DEVICE)
    def put(sm, dst, regs, tid):
        """The tile that fetch loaded into registers, into shared memory as stage lays it."""
        for it in range(LOADS):
            idx = tid + U(it) * uNT
            if idx < U(block_m) * uDP:
                sm[dst + (idx // uDP) * uDR + idx % uDP] = regs[it]

    @cuda.jit(**DEVICE)
    def store_rows(dst, head, row0, n, d, acc, mult, ty, tx):
        """dst[head, row0 + ty + a TY, col(cc)] = mult * acc[a, cc] inside the array (rows
        below n, columns below d)."""
        for a in range(TA):
            r = row0 + ty + U(a) * uTY
            if r < n:
                for e in range(TE):
                    for i in range(CHUNK):
                        col = U(e) * uRUN + tx * uCH + U(i)
                        if col < d:
                            dst[head, r, col] = acc[a, e * CHUNK + i] * mult

    @cuda.jit(**DEVICE)
    def row_vectors(sm, lse_off, D_off, lse, Dvec, bh, m0, rows, tid):
        """lse and D of `rows` query rows into shared memory (-inf and 0 past the end)."""
        nq = U(lse.shape[1])
        r = tid
        while r < rows:
            inside = m0 + r < nq
            sm[lse_off + r] = lse[bh, m0 + r] if inside else T(NEG_INF)
            sm[D_off + r] = Dvec[bh, m0 + r] if inside else T(0.0)
            r += uNT

    sizes = dict(T=T, TY=TY, TX=TX, TA=TA, TB=TB, TD=TD, TE=TE, W_ROW=W_ROW, D_ROW=D_ROW,
                 D_PAD=D_PAD, off=off, nbytes=item * total, LOADS=LOADS, fetch=fetch, put=put)
    return sizes, stage, dot_rows, accumulate, store_rows, row_vectors


def make_dkdv_kernel(block_m, block_n, head_dim, causal, dtype, threads=None, dq_atomic=False,
                     vector_atomics=None, prefetch=False, tensor_cores=False):
    """dK, dV. Launch grid (ceil(Nk / block_n), B*Hk), threads (TX, TY), arguments
    (q, k, v, dout, lse, D, dk, dv, dq, scale, heads, group). With dq_atomic the kernel also
    adds scale dS K into dq (which must hold zeros) with atomics, and no dQ kernel is needed:
    5 matmuls' work instead of 7, at the price of bitwise reproducibility. Without it dq is
    not touched.
    vector_atomics (dq_atomic only): add each thread's run of 4 dQ columns with one 16-byte
    vector atomic (vector_io.add4, sm_90) instead of 4 scalar ones: a warp's scalar atomics
    touch four times the 32-byte sectors they change (ncu: 51 % of the kernel's global sectors
    were excess). float32 with d % 4 == 0 only (else ValueError). True: the launcher rejects a
    dq whose rows are not 16-byte aligned; None (the default): vectors where they can run and dq
    is aligned (vector_io.AlignedDispatch), scalar atomics otherwise; False: scalar atomics.
    prefetch: load the next Q and dO tiles of a head into registers while this one is computed,
    as forward_fa2 does with K and V (one block per SM leaves nothing else to hide the loads
    behind); run_backward turns it on where it was timed (prefetch_by_default). Off, the kernel
    is the same code as without the option (the new code is under `if PREFETCH`).
    tensor_cores: the products that accumulate (dV += P^T dO, dK += dS^T Q and, with dq_atomic,
    dQ += dS K) on tensor cores, float32-accurate by the 3xTF32 split (fa2_mma.py); S and dP
    stay FFMA sums in the forward's order, so P is recomputed as before. float32 only, tiles
    that split into 16 x 8 fragments over whole warps (True: else ValueError; None: where they
    can, FFMA elsewhere). dQ is added from the fragments, which hold pairs of adjacent columns:
    vector_atomics there means one red.global.add.v2.f32 per pair (vector_io.add2; same
    conditions and alignment check as above). False here by default; run_backward turns it on
    where it was timed (tensor_cores_by_default: float32 with dq_atomic)."""
    d_pad, d_const, threads = _check(block_m, block_n, head_dim, dtype, threads, dq_atomic)
    if tensor_cores or tensor_cores is None:
        try:
            _check_tensor_cores(block_m, block_n, d_pad, dtype, threads, dq_atomic)
            tensor_cores = True
        except ValueError:
            if tensor_cores:
                raise
            tensor_cores = False
    possible = bool(dq_atomic) and np.dtype(dtype) == np.float32 and head_dim % VECTOR == 0
    if vector_atomics and not possible:
        raise ValueError(f"vector_atomics needs dq_atomic, float32 and d a multiple of {VECTOR}, "
                         f"got dq_atomic={dq_atomic}, {np.dtype(dtype)}, d={head_dim}")
    build = functools.partial(_dkdv, block_m, block_n, d_pad, d_const, bool(causal),
                              np.dtype(dtype), threads, bool(dq_atomic), prefetch=bool(prefetch),
                              tensor_cores=bool(tensor_cores))
    if vector_atomics is None and possible:
        (vector, threads_per_block), (scalar, _) = build(True), build(False)
        return AlignedDispatch(vector, scalar, positions=(DQ_ARG,)), threads_per_block
    return build(bool(vector_atomics))


DQ_ARG = 8      # dq's position among the dK/dV kernel's arguments


def _check_tensor_cores(block_m, block_n, d_pad, dtype, threads, dq_atomic):
    """ValueError unless the dK/dV kernel's tiles can go through fa2_mma: float32, whole warps,
    and the dK/dV (block_n x d_pad) and dQ (block_m x d_pad) tiles in 16 x 8 fragments."""
    if np.dtype(dtype) != np.float32:
        raise ValueError(f"tensor_cores needs float32, got {np.dtype(dtype)}")
    ty, tx = threads
    if (ty * tx) % WARP:
        raise ValueError(f"tensor_cores needs whole warps, got {ty} x {tx} threads")
    if block_m % 8 or block_n % 8:
        raise ValueError(f"tensor_cores needs block_m and block_n multiples of 8, got "
                         f"{block_m} x {block_n}")
    _tensor_core_products(block_m, block_n, d_pad, threads, dq_atomic)


def _tensor_core_products(block_m, block_n, d_pad, threads, dq_atomic):
    """fa2_mma device functions for dK and dV (block_n x d_pad) and dQ (block_m x d_pad)."""
    warps = threads[0] * threads[1] // WARP
    d_row = d_pad + PAD
    kv = mma_products(block_n, d_pad, warps, block_m + PAD, d_row)
    q = mma_products(block_m, d_pad, warps, block_n + PAD, d_row) if dq_atomic else None
    return kv, q


@functools.lru_cache(maxsize=None)
def _dkdv(block_m, block_n, d_pad, d_const, causal, dtype, threads, dq_atomic, vector_atomics,
          prefetch=False, tensor_cores=False):
    c, stage, dot_rows, accumulate, store_rows, row_vectors = _pieces(
        block_n, block_m, block_m, block_n, d_pad, d_const, dtype, threads, 2, dq_atomic)
    DQ_ATOMIC = dq_atomic
    RED4 = vector_atomics
    PREFETCH = prefetch
    fetch, put = c["fetch"], c["put"]
    NEXT = c["LOADS"] if prefetch else 1
    # dQ += dS K: rows i of dS (block_m of them, owned by ty) against the K tile
    TQ = block_m // c["TY"]
    accumulate_dq = tile_products(c["T"], TQ, 1, c["TY"], c["TX"], c["D_PAD"], c["D_ROW"],
                                  block_n + PAD, c["D_ROW"])[1]
    uSR = U(block_n + PAD)
    D_CONST, uD = d_const, U(d_const)
    recompute_p = make_recompute_p(c["T"], causal)
    T, TA, TB, TD, TX, TY = c["T"], c["TA"], c["TB"], c["TD"], c["TX"], c["TY"]
    TE = c["TE"]
    o = {k_: U(v_) for k_, v_ in c["off"].items()}
    uK, uV, uQ, udO, uL, uDv, uW = o["k"], o["v"], o["q"], o["do"], o["lse"], o["D"], o["w"]
    uWR, uBM, uBN, uTX, uTY, uNT = (U(x) for x in (c["W_ROW"], block_m, block_n, TX, TY, TX * TY))
    uPT, udST, udS = uW, uW + U(block_n * c["W_ROW"]), o["ds"]
    uRUN = U(CHUNK * TX)
    TC = tensor_cores
    FK = FQ = (1, 1, 1)                                # fragment arrays (tensor cores only)
    if TC:
        mma_kv, mma_q = _tensor_core_products(block_m, block_n, c["D_PAD"], threads, dq_atomic)
        assert c["W_ROW"] == block_m + PAD
        FK = mma_kv["shape"]
        FQ = mma_q["shape"] if DQ_ATOMIC else FK
        acc_kv, store_kv, clear_kv = mma_kv["accumulate"], mma_kv["store"], mma_kv["clear"]
        if DQ_ATOMIC:
            acc_q, clear_q = mma_q["accumulate"], mma_q["clear"]
            add_q = mma_q["add_pairs"] if RED4 else mma_q["add"]

    @kernel_jit(TX * TY)
    def dkdv_fa2(q, k, v, dout, lse, Dvec, dk, dv, dq, scale, heads, group):
        sm = cuda.shared.array(0, T, alignment=ALIGN)
        head = head_index()                # index into B*Hk
        if head >= k.shape[0]:      # a block past the last head (support.head_grid)
            return
        kvh = U(head)
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        n0 = U(cuda.blockIdx.x) * uBN
        nq, nk = U(q.shape[1]), U(k.shape[1])
        d = U(q.shape[2])
        if D_CONST:                                    # the head dim as a constant (d == D_PAD)
            d = uD
        s = cuda.local.array((TA, TB), T)
        dp = cuda.local.array((TA, TB), T)
        dk_acc = cuda.local.array((TA, TD), T)
        dv_acc = cuda.local.array((TA, TD), T)
        dq_acc = cuda.local.array((TQ if DQ_ATOMIC else 1, TD), T)
        q_next = cuda.local.array(NEXT, T)            # this thread's share of the next Q tile
        do_next = cuda.local.array(NEXT, T)           # and of the next dO tile
        dk_frag = cuda.local.array(FK, T)             # tensor cores: the warp's fragments
        dv_frag = cuda.local.array(FK, T)
        dq_frag = cuda.local.array(FQ, T)
        warp, lane = tid // U(WARP), tid % U(WARP)
        if TC:
            clear_kv(dk_frag)
            clear_kv(dv_frag)
        else:
            for a in range(TA):
                for cc in range(TD):
                    dk_acc[a, cc] = T(0.0)
                    dv_acc[a, cc] = T(0.0)

        stage(sm, uK, k, kvh, n0, uBN, tid, d, T(1.0))
        stage(sm, uV, v, kvh, n0, uBN, tid, d, T(1.0))
        # causal: query i sees key j iff j + nq <= i + nk; skip Q blocks that see none of ours
        m_start = U(0)
        if causal and n0 + nq > nk:
            m_start = (n0 + nq - nk) // uBM * uBM
        kv_heads = heads // group
        b_idx = U(head // kv_heads)
        for g in range(group):                         # the query heads sharing this key head
            bh = b_idx * U(heads) + U(head % kv_heads) * U(group) + U(g)
            m0 = m_start
            if PREFETCH and m0 < nq:                   # a head's first tiles: no prefetch
                stage(sm, uQ, q, bh, m0, uBM, tid, d, scale)
                stage(sm, udO, dout, bh, m0, uBM, tid, d, T(1.0))
            while m0 < nq:
                if not PREFETCH:
                    stage(sm, uQ, q, bh, m0, uBM, tid, d, scale)
                    stage(sm, udO, dout, bh, m0, uBM, tid, d, T(1.0))
                row_vectors(sm, uL, uDv, lse, Dvec, bh, m0, uBM, tid)
                cuda.syncthreads()
                m1 = m0 + uBM
                if PREFETCH and m1 < nq:               # lands while this tile is computed
                    fetch(q_next, q, bh, m1, tid, d, scale)
                    fetch(do_next, dout, bh, m1, tid, d, T(1.0))
                dot_rows(sm, uK, uQ, s, ty, tx)        # S^T[j, i], summed as the forward did
                dot_rows(sm, uV, udO, dp, ty, tx)      # dP^T[j, i]
                for a in range(TA):
                    jl = ty + U(a) * uTY
                    j = n0 + jl
                    for b in range(TB):
                        il = tx + U(b) * uTX
                        i = m0 + il
                        p = recompute_p(s[a, b], sm[uL + il], i, j, nq, nk)
                        sm[uPT + jl * uWR + il] = p
                        ds = p * (dp[a, b] - sm[uDv + il])
                        sm[udST + jl * uWR + il] = ds
                        if DQ_ATOMIC:
                            sm[udS + il * uSR + jl] = ds
                if TC:
                    # a warp's fragments take rows of P^T, dS^T (and dS) from other warps
                    cuda.syncthreads()
                    acc_kv(sm, uPT, udO, uBM, dv_frag, warp, lane)     # dV += P^T dO
                    acc_kv(sm, udST, uQ, uBM, dk_frag, warp, lane)     # dK += dS^T (scale Q)
                    if DQ_ATOMIC:
                        clear_q(dq_frag)
                        acc_q(sm, udS, uK, uBN, dq_frag, warp, lane)   # dQ_i += dS_i K
                        add_q(dq, bh, m0, nq, d, dq_frag, scale, warp, lane)
                else:
                    warp_barrier()
                    accumulate(sm, uPT, udO, uBM, dv_acc, ty, tx)    # dV += P^T dO
                    accumulate(sm, udST, uQ, uBM, dk_acc, ty, tx)    # dK += dS^T (scale Q)
                    if DQ_ATOMIC:
                        # dS rows i come from every warp: a block barrier, then dQ_i += dS_i K
                        # for this K/V block only, added into dq (zeroed by the preprocess kernel)
                        cuda.syncthreads()
                        for a in range(TQ):
                            for cc in range(TD):
                                dq_acc[a, cc] = T(0.0)
                        accumulate_dq(sm, udS, uK, uBN, dq_acc, ty, tx)
                        for a in range(TQ):
                            i = m0 + ty + U(a) * uTY
                            if i < nq:
                                for e in range(TE):
                                    if RED4:               # the run of CHUNK == VECTOR columns
                                        col = U(e) * uRUN + tx * U(CHUNK)
                                        if col < d:
                                            add4(dq, bh, i, col,
                                                 (dq_acc[a, e * CHUNK] * scale,
                                                  dq_acc[a, e * CHUNK + 1] * scale,
                                                  dq_acc[a, e * CHUNK + 2] * scale,
                                                  dq_acc[a, e * CHUNK + 3] * scale))
                                        continue
                                    for cc in range(CHUNK):
                                        col = U(e) * uRUN + tx * U(CHUNK) + U(cc)
                                        if col < d:
                                            cuda.atomic.add(dq, (bh, i, col),
                                                            dq_acc[a, e * CHUNK + cc] * scale)
                cuda.syncthreads()                     # every warp is done with Q and dO
                if PREFETCH and m1 < nq:
                    put(sm, uQ, q_next, tid)
                    put(sm, udO, do_next, tid)
                m0 += uBM

        if TC:
            store_kv(dk, kvh, n0, nk, d, dk_frag, T(1.0), warp, lane)
            store_kv(dv, kvh, n0, nk, d, dv_frag, T(1.0), warp, lane)
        else:
            store_rows(dk, kvh, n0, nk, d, dk_acc, T(1.0), ty, tx)
            store_rows(dv, kvh, n0, nk, d, dv_acc, T(1.0), ty, tx)

    check = require_aligned((DQ_ARG,), "vector_atomics needs dq")
    return Launcher(dkdv_fa2, c["nbytes"], check=check if RED4 else None), (TX, TY)


def make_dq_kernel(block_m, block_n, head_dim, causal, dtype, threads=None):
    """dQ. Launch grid (ceil(Nq / block_m), B*H), threads (TX, TY), arguments
    (q, k, v, dout, lse, D, dq, scale, heads, group)."""
    d_pad, d_const, threads = _check(block_m, block_n, head_dim, dtype, threads)
    return _dq(block_m, block_n, d_pad, d_const, bool(causal), np.dtype(dtype), threads)


@functools.lru_cache(maxsize=None)
def _dq(block_m, block_n, d_pad, d_const, causal, dtype, threads):
    c, stage, dot_rows, accumulate, store_rows, row_vectors = _pieces(
        block_m, block_n, block_m, block_n, d_pad, d_const, dtype, threads, 1)
    D_CONST, uD = d_const, U(d_const)
    recompute_p = make_recompute_p(c["T"], causal)
    T, TA, TB, TD, TX, TY = c["T"], c["TA"], c["TB"], c["TD"], c["TX"], c["TY"]
    o = {k_: U(v_) for k_, v_ in c["off"].items()}
    uK, uV, uQ, udO, uL, uDv, udS = o["k"], o["v"], o["q"], o["do"], o["lse"], o["D"], o["w"]
    uWR, uBM, uBN, uTX, uTY, uNT = (U(x) for x in (c["W_ROW"], block_m, block_n, TX, TY, TX * TY))

    @kernel_jit(TX * TY)
    def dq_fa2(q, k, v, dout, lse, Dvec, dq, scale, heads, group):
        sm = cuda.shared.array(0, T, alignment=ALIGN)
        head = head_index()
        if head >= q.shape[0]:      # a block past the last head (support.head_grid)
            return
        bh = U(head)
        kvh = U(kv_head(head, heads, group))
        tx = U(cuda.threadIdx.x)
        ty = U(cuda.threadIdx.y)
        tid = ty * uTX + tx
        m0 = U(cuda.blockIdx.x) * uBM
        nq, nk = U(q.shape[1]), U(k.shape[1])
        d = U(q.shape[2])
        if D_CONST:                                    # the head dim as a constant (d == D_PAD)
            d = uD
        s = cuda.local.array((TA, TB), T)
        dp = cuda.local.array((TA, TB), T)
        dq_acc = cuda.local.array((TA, TD), T)
        for a in range(TA):
            for cc in range(TD):
                dq_acc[a, cc] = T(0.0)

        stage(sm, uQ, q, bh, m0, uBM, tid, d, scale)
        stage(sm, udO, dout, bh, m0, uBM, tid, d, T(1.0))
        row_vectors(sm, uL, uDv, lse, Dvec, bh, m0, uBM, tid)
        n_end = nk
        if causal:                                     # no key past the block's last row
            last = m0 + uBM + nk
            n_end = min(nk, last - nq) if last > nq else U(0)
        n0 = U(0)
        while n0 < n_end:
            stage(sm, uK, k, kvh, n0, uBN, tid, d, T(1.0))
            stage(sm, uV, v, kvh, n0, uBN, tid, d, T(1.0))
            cuda.syncthreads()
            dot_rows(sm, uQ, uK, s, ty, tx)            # S[i, j], the forward's sum exactly
            dot_rows(sm, udO, uV, dp, ty, tx)          # dP[i, j]
            for a in range(TA):
                il = ty + U(a) * uTY
                i = m0 + il
                lse_i = sm[uL + il]
                for b in range(TB):
                    jl = tx + U(b) * uTX
                    j = n0 + jl
                    p = recompute_p(s[a, b], lse_i, i, j, nq, nk)
                    sm[udS + il * uWR + jl] = p * (dp[a, b] - sm[uDv + il])
            warp_barrier()
            accumulate(sm, udS, uK, uBN, dq_acc, ty, tx)         # dQ += dS K
            cuda.syncthreads()
            n0 += uBN

        store_rows(dq, bh, m0, nq, d, dq_acc, scale, ty, tx)

    return Launcher(dq_fa2, c["nbytes"]), (TX, TY)


def prefetch_by_default(dtype, dq_atomic):
    """Whether run_backward prefetches when not told: float32 with dQ by atomics (fa2-atomic),
    where `numba-flash tune` on an H200 (three runs, N = 1k and 2k, default tiles) timed it
    faster at d = 128 and level at d = 64 (figures in docs/performance.md). The fa2 backward
    and float64 were not timed with it."""
    return np.dtype(dtype) == np.float32 and bool(dq_atomic)


def tensor_cores_by_default(dtype, dq_atomic):
    """run_backward's tensor_cores when not told: None (where they can run) in float32 with dQ
    by atomics (fa2-atomic), False elsewhere. Timed on an H200 (tests/ab_tensor_cores.py, now tools/ab.py,
    N = 1k / 2k, against the FFMA products): a tie to a few per cent ahead at d = 64 and 128,
    never behind by more than the noise (figures in docs/performance.md). The fa2 backward and
    float64 have no tensor-core path timed (float64 has none)."""
    return None if np.dtype(dtype) == np.float32 and bool(dq_atomic) else False


def check_tiles(block_m, block_n, head_dim, dtype, deterministic=False):
    """ValueError unless run_backward takes these tiles: its dK/dV kernel adding dQ with
    atomics, or (deterministic=True) without, and its dQ kernel."""
    make_dkdv_kernel(block_m, block_n, head_dim, False, dtype, dq_atomic=not deterministic)
    if deterministic:
        make_dq_kernel(block_m, block_n, head_dim, False, dtype)


def run_backward(dout, q, k, v, lse, out, dq, dk, dv, *, scale, heads, group, causal,
                 block_m, block_n, threads=None, dq_atomic=False, vector_atomics=None,
                 prefetch=None, tensor_cores="default", stream=0):
    """Launch preprocess, dkdv and dq on 3-D device arrays (same contract as
    backward.run_backward, launched on `stream`). Allocates only D (B*H, Nq) besides the
    outputs.
    dq_atomic: the dK/dV kernel also accumulates dQ with atomics (no dQ kernel; the
    "fa2-atomic" variant, which the API replaces by "fa2" when deterministic=True);
    vector_atomics (with dq_atomic only), prefetch (None: prefetch_by_default), tensor_cores
    ("default": tensor_cores_by_default): see make_dkdv_kernel."""
    from .. import arrays
    bh, nq, d = q.shape
    bhk, nk, _ = k.shape
    dtype = q.dtype
    scale = numba_type(dtype)(scale)
    atomic = bool(dq_atomic)
    if prefetch is None:
        prefetch = prefetch_by_default(dtype, atomic)
    if tensor_cores == "default":
        tensor_cores = tensor_cores_by_default(dtype, atomic)
    D = arrays.empty_device((bh, nq), dtype)
    run_preprocess(dout, out, D, dq, clear=atomic, stream=stream)
    dkdv, tpb = make_dkdv_kernel(block_m, block_n, d, causal, dtype, threads, atomic,
                                 vector_atomics if atomic else False, prefetch, tensor_cores)
    dkdv[(ceil_div(nk, block_n), *head_grid(bhk)), tpb, stream](q, k, v, dout, lse, D, dk, dv,
                                                                dq, scale, heads, group)
    if not atomic:
        dq_kernel, tpb = make_dq_kernel(block_m, block_n, d, causal, dtype, threads)
        dq_kernel[(ceil_div(nq, block_m), *head_grid(bh)), tpb, stream](
            q, k, v, dout, lse, D, dq, scale, heads, group)
