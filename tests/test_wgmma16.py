"""kernels/sm90/wgmma16.py, forward16.py and backward16.py (the "wgmma16" pair): the 16-bit
core-matrix layout, the register A fragment that an accumulator becomes, the products on
integer inputs (exact: the same answer on the simulator's model and on the tensor core), and
the forward and backward against float64 truth within the half tolerance, simulator and
GPU."""

import inspect

import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32, uint16, uint32

from numba_flash import flash_attention_backward, flash_attention_forward
from numba_flash.kernels.sm90 import forward16, tma, wgmma, wgmma16
from numba_flash.kernels.support import ALIGN, SIMULATOR
from numba_flash.testing.tolerance import (assert_within_tolerance, check_backward,
                                           check_forward)

FORMATS = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}


def host(f):
    """The Python function behind a device function (the function itself on the simulator)."""
    return getattr(f, "py_func", f)


def test_core_offset16_is_a_permutation_with_core_matrices_of_8_rows_by_16_bytes():
    rows, K = 64, 32
    r, k = np.meshgrid(np.arange(rows), np.arange(K), indexing="ij")
    off = wgmma16.core_offset16_host(r, k, K)
    assert sorted(off.ravel()) == list(range(rows * K))
    assert (off[:8, :8] == np.arange(64).reshape(8, 8)).all()   # 8 rows of 8 elements
    assert off[0, 8] == 64 and off[8, 0] == 64 * (K // 8)       # along K, then along rows


def test_s_accumulator_pairs_are_the_register_a_fragment_of_p_v():
    # forward16.pack_p packs entries 2w, 2w + 1 of S's accumulator into word w; word 4 s + e
    # must be element (row, 16 s + k), (row, 16 s + k + 1) of step s's A fragment
    position, fragment = host(wgmma.position), host(wgmma16.a_fragment16)
    for warp in range(4):
        for lane in range(32):
            for w in range(forward16.P_WORDS):
                s, e = divmod(w, 4)
                row, k = fragment(e, warp, lane)
                assert position(2 * w, warp, lane) == (row, 16 * s + k)
                assert position(2 * w + 1, warp, lane) == (row, 16 * s + k + 1)


def test_products16_reject_shapes_wgmma_lacks():
    with pytest.raises(ValueError, match="multiple of 16"):
        wgmma16.products16(64, 24, 64, "bfloat16")
    with pytest.raises(ValueError, match="fmt must be one of"):
        wgmma16.products16(64, 64, 64, "float32")


def tile_offsets(n, K, transposed, swizzle=False):
    """(element offsets of A's 64 x K entries and of B's n x K, or transposed K x n, in row
    order, where the products read them): wgmma16's core matrices, or swizzle=True TMA's boxes
    with the 128-byte swizzle (tma.swizzle128_offset_host)."""
    def offsets(rows, cols):
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        if swizzle:
            return tma.swizzle128_offset_host(r, c, rows).ravel().astype(np.int32)
        return wgmma16.core_offset16_host(r, c, cols).ravel().astype(np.int32)
    return offsets(64, K), offsets(K, n) if transposed else offsets(n, K)


def product_kernel(n, K, fmt, transposed=False, products16=wgmma16.products16,
                   fence=wgmma.fence_proxy_async, swizzle=False):
    """D = A B^T (mma_ss) and E = C + A2 B^T (mma_rs, A2 from registers) by one warpgroup on
    16-bit patterns: A, A2 (64 x K), B (n x K), or transposed B^T (K x n), staged with the
    contraction as its rows and read transposed (b_rows); C, D, E (64 x n) float32; the last
    two arguments tile_offsets(n, K, transposed, swizzle). products16, fence: wgmma16's and
    the async proxy fence, or mma16's and none (the same interface on mma.sync;
    fence.proxy.async does not compile below sm_90). swizzle: the tiles in TMA's layout,
    1024-byte aligned (tma.swizzle_base), and the products told so."""
    prod = products16(n, K, K, fmt, b_rows=n if transposed else None,
                      **(dict(swizzle=True) if swizzle else {}))
    ss, rs, regs = prod["mma_ss"], prod["mma_rs"], prod["regs"]
    pack = wgmma16.make_pack_half2(fmt)
    A_AT, B_AT = 0, 64 * K
    WORDS = 4 * (K // 16)
    PAD = tma.SWIZZLE_ALIGN if swizzle else 0       # bytes to align the tiles
    NBYTES = 2 * (64 * K + n * K) + PAD + (4 * wgmma.SCRATCH if SIMULATOR else 0)
    SCRATCH_AT = (2 * (64 * K + n * K) + PAD) // 4

    @cuda.jit
    def product(A, A2, B, C, D, E, a_off, b_off):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        base = tma.swizzle_base(sh) if swizzle else 0
        for i in range(tid, 64 * K, 128):
            sh[base + A_AT + a_off[i]] = A[i // K, i % K]
        for i in range(tid, n * K, 128):
            if transposed:          # B^T: row k = i // n, column c = i % n
                sh[base + B_AT + b_off[i]] = B[i // n, i % n]
            else:
                sh[base + B_AT + b_off[i]] = B[i // K, i % K]
        fence()
        cuda.syncthreads()
        d = ss(sh, base + A_AT, base + B_AT)
        a = cuda.local.array(WORDS, uint32)
        for w in range(WORDS):
            s, e = w // 4, w % 4
            row, k = wgmma16.a_fragment16(e, warp, lane)
            lo = A2[row, 16 * s + k]
            hi = A2[row, 16 * s + k + 1]
            a[w] = pack(lo, hi)
        acc = cuda.local.array(regs, float32)
        for j in range(regs):
            r, c = wgmma.position(j, warp, lane)
            acc[j] = C[r, c]
        rs(sh, sm, acc, a, base + B_AT, SCRATCH_AT)
        for j in range(regs):
            r, c = wgmma.position(j, warp, lane)
            D[r, c] = d[j]
            E[r, c] = acc[j]
    return product, NBYTES


@pytest.mark.parametrize("swizzle", [False, True])
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n,K,transposed", [(64, 64, False), (128, 64, False), (64, 128, False),
                                            (64, 64, True), (128, 64, True), (64, 128, True)])
def test_products16_on_integers_are_exact(fmt, n, K, transposed, swizzle):
    # integers |x| <= 8: every product and sum exact in float32, so the tensor core, whatever
    # its order of additions, and the model give A B^T exactly; a wrong layout, descriptor or
    # fragment gives other numbers. swizzle: TMA's layout (the wgmma16 forward's tiles)
    rng = np.random.default_rng(n + K)
    A, A2 = (rng.integers(-8, 9, (64, K)).astype(np.float32) for _ in range(2))
    B = rng.integers(-8, 9, (n, K)).astype(np.float32)
    C = rng.integers(-100, 101, (64, n)).astype(np.float32)
    bits = lambda x: x.astype(FORMATS[fmt]).view(np.uint16)         # noqa: E731
    D = np.full((64, n), np.nan, np.float32)
    E = np.full((64, n), np.nan, np.float32)
    kernel, nbytes = product_kernel(n, K, fmt, transposed, swizzle=swizzle)
    stored = np.ascontiguousarray(B.T) if transposed else B
    kernel[1, 128, 0, nbytes](bits(A), A2, bits(stored), C, D, E,
                              *tile_offsets(n, K, transposed, swizzle))
    np.testing.assert_array_equal(D, A @ B.T)
    np.testing.assert_array_equal(E, C + A2 @ B.T)


def in_flight_kernel(misuse, n=64, K=32, fmt="bfloat16"):
    """One warpgroup issues S = A B^T (ss_issue) and E += A2 B^T (rs_issue), both in flight,
    then waits (wait_group 1: S, then 0: E) and writes S to D and E: `misuse` names what it
    does wrong meanwhile (None: nothing)."""
    prod = wgmma16.products16(n, K, K, fmt)
    ss, rs, regs = prod["ss_issue"], prod["rs_issue"], prod["regs"]
    wait_one, _ = wgmma16.make_wait(1, regs)
    wait_s_all, wait_all = wgmma16.make_wait(0, regs)
    WORDS = 4 * (K // 16)
    A_AT, B_AT = 0, 64 * K
    NBYTES = 2 * (64 * K + n * K) + 4 * wgmma.SCRATCH
    SCRATCH_AT = (64 * K + n * K) // 2

    @cuda.jit
    def in_flight(A, B, D, E):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        for i in range(tid, 64 * K, 128):
            sh[A_AT + i] = A[i // K, i % K]
        for i in range(tid, n * K, 128):
            sh[B_AT + i] = B[i // K, i % K]
        cuda.syncthreads()
        a = cuda.local.array(WORDS, uint32)
        for w in range(WORDS):
            a[w] = uint32(0x3F803F80)               # 1.0 in both halves (bfloat16)
        acc = cuda.local.array(regs, float32)
        for j in range(regs):
            acc[j] = float32(0.0)
        s = ss(sh, A_AT, B_AT)
        if misuse == "tile written":
            sh[A_AT + tid] = uint16(0)
        rs(sh, sm, acc, a, B_AT, SCRATCH_AT)
        if misuse == "A written":
            a[0] = uint32(0)
        if misuse == "acc written":
            acc[0] = float32(1.0)
        if misuse == "S read early":        # wait_group 0 for E, then S read with E pending
            s = wait_one(ss(sh, A_AT, B_AT))
        else:
            s = wait_one(s)
        wait_all(acc)
        for j in range(regs):
            D[tid, j] = s[j]
            E[tid, j] = acc[j]
    return in_flight, NBYTES


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's model of products in flight")
@pytest.mark.parametrize("misuse,message", [
    ("tile written", "shared-memory operand changed"),
    ("A written", "register A operand was written"),
    ("acc written", "accumulator was written"),
    ("S read early", "read while it is in flight")])
def test_simulated_products_in_flight_catch_what_a_gpu_would_get_wrong(misuse, message):
    # a GPU's wgmma reads its operands at any time until the wait that retires it: the model
    # computes an issued product at its issue and again at its wait and raises where its
    # operands changed between, or where a wait leaves the product read pending
    rng = np.random.default_rng(7)
    A = rng.integers(-4, 5, (64, 32)).astype(ml_dtypes.bfloat16).view(np.uint16)
    B = rng.integers(-4, 5, (64, 32)).astype(ml_dtypes.bfloat16).view(np.uint16)
    D, E = (np.zeros((128, 32), np.float32) for _ in range(2))
    kernel, nbytes = in_flight_kernel(None)
    kernel[1, 128, 0, nbytes](A, B, D, E)                      # used rightly: no error
    assert np.isfinite(D).all() and (E != 0).any()
    kernel, nbytes = in_flight_kernel(misuse)
    with pytest.raises(wgmma16.InFlightHazard, match=message):
        kernel[1, 128, 0, nbytes](A, B, D, E)
    # the launch raised only when all its threads had ended: none runs on beside the next test
    # (their device calls would find the module's cuda swapped for the kernel's fake one)
    assert wgmma16.cuda is cuda


@pytest.mark.parametrize("threads", [128, pytest.param(256, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("transposed", [True, False])
def test_stmatrix_stores_each_matrix_at_its_lanes_rows(threads, transposed):
    # stmatrix.x4 (the model on the simulator): word m of lane L = 4 g + t holds elements
    # (g, 2t), (g, 2t + 1) of matrix m; lane 8 m + c gives the address of row c of the stored
    # matrix m. store_transposed4 stores matrix m transposed (row c's position g is element
    # (g, c)), store_rows4 as it is (row g's position c is element (g, c)). Each warp stores
    # its four 8 x 8 matrices into 256 elements of its own, matrix m's row c at 8 (8 m + c);
    # load_shared16 reads them back 16 bytes a lane
    n = 8 * threads             # elements stored: 256 a warp
    store4 = wgmma16.store_transposed4 if transposed else wgmma16.store_rows4

    @cuda.jit
    def store(out, loaded):
        sh = cuda.shared.array(0, uint16, alignment=ALIGN)
        sm = cuda.shared.array(0, float32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        words = cuda.local.array(4, uint32)
        for m in range(4):
            lo = m * 64 + g * 8 + 2 * t
            words[m] = uint32(lo | ((lo + 1) << 16))
        # the simulator's exchange at float n / 2 (byte 2 n), past the stored elements
        store4(sh, sm, warp * 256 + lane * 8, words, 0, n // 2 + (tid // 128) * wgmma.SCRATCH)
        cuda.syncthreads()
        for i in range(tid, n, threads):
            out[i] = sh[i]
        chunk = wgmma16.load_shared16(sh, warp * 256 + lane * 8)
        for w in range(4):
            loaded[tid, w] = chunk[w]

    out = np.zeros(n, np.uint16)
    loaded = np.zeros((threads, 4), np.uint32)
    scratch = 4 * wgmma.SCRATCH * (threads // 128) if SIMULATOR else 0    # (> 48 KiB)
    store[1, threads, 0, 2 * n + scratch](out, loaded)
    m, c, g = np.meshgrid(np.arange(4), np.arange(8), np.arange(8), indexing="ij")
    if transposed:
        expected = (m * 64 + g * 8 + c).astype(np.uint16).reshape(256)   # at 8 (8 m + c) + g
    else:
        expected = np.arange(256, dtype=np.uint16)                       # at 8 (8 m + g) + c
    for warp in range(threads // 32):
        np.testing.assert_array_equal(out[256 * warp:256 * (warp + 1)], expected)
    np.testing.assert_array_equal(loaded, out.view(np.uint32).reshape(threads, 4))


def roundtrip_kernel(fmt):
    """bits[i] = pack_half2(x[2i], x[2i + 1]); lo[i], hi[i]: its halves unpacked again."""
    pack, unpack = wgmma16.make_pack_half2(fmt), wgmma16.make_unpack_half(fmt)

    @cuda.jit
    def roundtrip(x, bits, lo, hi):
        i = cuda.grid(1)
        if i < bits.size:
            w = pack(x[2 * i], x[2 * i + 1])
            bits[i] = w
            lo[i] = unpack(uint32(w & uint32(0xFFFF)))    # numba types uint32 & uint32 as uint64
            hi[i] = unpack(uint32(w >> uint32(16)))
    return roundtrip


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_pack_rounds_to_nearest_even_as_ml_dtypes_and_numpy_and_unpack_inverts(fmt):
    # against the formats' own conversions (ml_dtypes' bfloat16, NumPy's float16): ties to
    # even (halfway values drawn on purpose), overflow to inf past the largest, subnormals,
    # signed zeros, inf, NaN (any NaN pattern)
    rng = np.random.default_rng(1)
    dt = FORMATS[fmt]
    base = rng.standard_normal(2000).astype(dt).astype(np.float32)
    ulp = np.abs(np.spacing(base.astype(dt)).astype(np.float32))
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 65504.0, 65520.0, 7e4, -7e4,
                        1e-7, -3e-8, 6e-8, 3.3895314e38, 1e-40], np.float32)
    x = np.concatenate([base + ulp / 2, base - ulp / 2, rng.standard_normal(2000) * 100,
                        special]).astype(np.float32)
    x = np.concatenate([x, x[:1]]) if x.size % 2 else x
    bits = np.zeros(x.size // 2, np.uint32)
    lo, hi = np.zeros(x.size // 2, np.float32), np.zeros(x.size // 2, np.float32)
    roundtrip_kernel(fmt)[(bits.size + 127) // 128, 128](x, bits, lo, hi)
    with np.errstate(over="ignore"):
        want = x.astype(dt)
    got = np.stack([bits & 0xFFFF, bits >> 16], axis=1).ravel().astype(np.uint16).view(dt)
    nan = np.isnan(want.astype(np.float32))
    assert (np.isnan(got.astype(np.float32)) == nan).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    back = np.stack([lo, hi], axis=1).ravel()
    np.testing.assert_array_equal(back, want.astype(np.float32))      # NaN where NaN


def test_wgmma16_forward_rejects_what_it_cannot_take():
    with pytest.raises(ValueError, match="float16 and bfloat16"):
        forward16.make_forward_kernel(64, 64, 64, False, np.dtype(np.float32))
    with pytest.raises(ValueError, match="head dims 1..128"):
        forward16.make_forward_kernel(64, 64, 129, False, np.dtype(np.float16))
    with pytest.raises(ValueError, match="fixed tiles"):
        forward16.make_forward_kernel(64, 64, 64, False, np.dtype(np.float16))


def _check(fmt, shape_q, shape_k, causal, seed=0, scale_logits=1.0, deterministic=False,
           kernel="wgmma16"):
    rng = np.random.default_rng(seed)
    dt = FORMATS[fmt]
    q = (rng.standard_normal(shape_q) * scale_logits).astype(dt)
    k, v = (rng.standard_normal(shape_k).astype(dt) for _ in range(2))
    dout = rng.standard_normal(shape_q).astype(dt)
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel=kernel)
    assert out.dtype == dt and lse.dtype == np.float32
    assert_within_tolerance(check_forward(q, k, v, out, lse, causal=causal))
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel=kernel,
                                     deterministic=deterministic)
    assert all(g.dtype == dt for g in grads)
    assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=causal))


# simulator sizes: a head dim in each padding (64, 128), Nq != Nk, GQA, masked rows (causal,
# Nq > Nk), more than one K/V block
SMALL = [((1, 2, 70, 40), (1, 2, 50, 40), True), ((1, 4, 33, 100), (1, 2, 80, 100), False),
         ((2, 1, 9, 13), (2, 1, 130, 13), True)]
# GPU sizes (q shape, k shape, causal, logit scale): Nq != Nk, GQA, both paddings, large
# logits, and d % 8 != 0 (the synchronous staging)
REAL = [((2, 4, 1000, 64), (2, 4, 1000, 64), False, 1.0),
        ((2, 4, 1000, 64), (2, 2, 1500, 64), True, 1.0),
        ((1, 4, 777, 128), (1, 4, 513, 128), True, 1.0),
        ((1, 2, 1024, 96), (1, 2, 1024, 96), False, 30.0),
        ((1, 2, 300, 100), (1, 2, 260, 100), True, 1.0)]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shape_q,shape_k,causal", SMALL)
def test_wgmma16_within_the_half_tolerance(fmt, shape_q, shape_k, causal):
    _check(fmt, shape_q, shape_k, causal)


# causal blocks whose warpgroups see fewer K/V blocks than the block stages (forward16's n_wg):
# 100 x 160, keys 0..123 for rows 0..63 (two blocks), 0..159 staged for rows 64..99; 250 x 20,
# the second block's first warpgroup (rows 128..191) sees none and only stages for the second
@pytest.mark.parametrize("shape_q,shape_k", [((2, 1, 100, 13), (2, 1, 160, 13)),
                                             ((2, 1, 250, 13), (2, 1, 20, 13))])
def test_wgmma16_causal_warpgroups_stop_at_their_own_diagonal(shape_q, shape_k):
    _check("bfloat16", shape_q, shape_k, True)


def test_wgmma16_dq_in_flight_across_q_blocks_and_heads():
    # backward16 at D = 64 leaves a Q block's dQ product in flight into the next step (dS in
    # two buffers): 3 Q blocks a head and 2 query heads a key head, 6 steps a K/V block, the
    # dQ of each added during the next one's S^T, dP^T (and across a change of head)
    from numba_flash.kernels.sm90 import backward16
    assert backward16.pipelined_dq(64) and backward16.ds_buffers(64) == 2
    _check("bfloat16", (1, 4, 150, 32), (1, 2, 70, 32), False, seed=3)


@pytest.mark.parametrize("d", [72, pytest.param(40, marks=pytest.mark.gpu),
                               pytest.param(128, marks=pytest.mark.gpu)])
def test_wgmma16_asynchronous_and_synchronous_staging_agree_bitwise(d):
    # the same products on the same tiles: staged by TMA (the wgmma16 forward: swizzled
    # tiles), by cp.async (aligned arrays) or element by element (any view) must give the same
    # bits, forward (out, lse) and backward (dq, dk, dv; cp.async or not). d = 72 on the
    # simulator: three warpgroups, whose threads do not divide a tile's chunks (stage16's last
    # round), and chunks past d staged as zeros
    from numba_flash.kernels.sm90 import backward16
    rng = np.random.default_rng(d)
    nq, nk = 100, 150
    q, dout = (rng.standard_normal((2, nq, d)).astype(np.float16).view(np.uint16)
               for _ in range(2))
    k, v = (rng.standard_normal((1, nk, d)).astype(np.float16).view(np.uint16)
            for _ in range(2))
    D = forward16.padded(d)
    Dsum = rng.standard_normal((2, nq)).astype(np.float32)
    results = []
    for staging in ("cp.async", "sync", "tma"):
        out = cuda.to_device(np.zeros((2, nq, d), np.uint16))
        lse = cuda.to_device(np.zeros((2, nq), np.float32))
        args = [cuda.to_device(x) for x in (q, k, v)]
        fwd = forward16.make_kernel(D, True, "float16", staging != "sync", tma=staging == "tma")
        maps = tma.tensor_maps(args) if staging == "tma" else lse
        fwd[(1, 2), forward16.threads(D)](*args, out, lse, np.float32(0.2 * forward16.LOG2E),
                                          2, 2, maps)
        results.append([x.copy_to_host() for x in (out, lse)])
        if staging == "tma":
            continue
        grads = [cuda.to_device(np.zeros(x.shape, np.float32 if x is q else np.uint16))
                 for x in (q, k, v)]              # dq float32, dk and dv rounded patterns
        bwd = backward16.make_dkdv_kernel(D, True, "float16", staging == "cp.async")
        bwd[(2, 1), backward16.THREADS](*args, cuda.to_device(dout), lse, cuda.to_device(Dsum),
                                        grads[1], grads[2], grads[0], np.float32(0.2), 2, 2)
        results[-1] += [x.copy_to_host() for x in grads]
    for name, *got in zip(("out", "lse"), *(r[:2] for r in results)):     # three forwards
        assert all(x.tobytes() == got[0].tobytes() for x in got[1:]), name
    cp_async, sync = (r[2:] for r in results[:2])                           # two backwards
    np.testing.assert_allclose(cp_async[0], sync[0], rtol=1e-5, atol=1e-6)  # dq: atomics, in
    for name, a, b in zip(("dk", "dv"), cp_async[1:], sync[1:]):          # any order
        assert a.tobytes() == b.tobytes(), name


def test_wgmma16_deterministic_backward_is_the_widened_one():
    # no atomic-free dQ of its own yet: wgmma's deterministic backward on the widened inputs,
    # bit for bit what kernel="wgmma" gives from the same out and lse (within the tolerance on
    # the cheapest SMALL case: d = 13, masked rows, three K/V blocks)
    _check("bfloat16", *SMALL[2], deterministic=True)
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal((1, 2, 40, 24)).astype(ml_dtypes.bfloat16)
                     for _ in range(4))
    out, lse = flash_attention_forward(q, k, v, kernel="wgmma16")
    ours = flash_attention_backward(dout, q, k, v, out, lse, kernel="wgmma16",
                                    deterministic=True)
    widened = flash_attention_backward(dout, q, k, v, out, lse, kernel="wgmma",
                                       deterministic=True)
    for a, b in zip(ours, widened):
        assert a.view(np.uint16).tobytes() == b.view(np.uint16).tobytes()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shape_q,shape_k,causal,logits", REAL)
def test_gpu_wgmma16_within_the_half_tolerance(fmt, shape_q, shape_k, causal, logits):
    _check(fmt, shape_q, shape_k, causal, scale_logits=logits)
    _check(fmt, shape_q, shape_k, causal, scale_logits=logits, deterministic=True)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's model of the conversion")
@pytest.mark.parametrize("fmt", ["bfloat16", "float16"])
def test_scalar_conversion_to_half_bits_is_numpys(fmt):
    # wgmma16._encode_scalar takes struct's path; NumPy's / ml_dtypes' conversion is the rule
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32)
    edges = [int(np.float32(v).view(np.uint32)) for v in
             (65504, 65520, 6.1035156e-05, 5.96e-08, 2.98e-08, 3.3895314e38, 1e-45, 0.0)]
    near = np.array([b + d for b in edges for d in range(-40, 41) if b + d >= 0], np.uint32)
    bits = np.concatenate([bits, near, near | np.uint32(0x80000000)])
    values = bits.view(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        want = values.astype(FORMATS[fmt]).view(np.uint16)
    got = np.array([wgmma16._encode_scalar(v, fmt) for v in values])
    finite_or_inf = ~np.isnan(values)
    assert (got[finite_or_inf] == want[finite_or_inf]).all()
    assert np.isnan(wgmma16.decode_host(got[~finite_or_inf].astype(np.uint16), fmt)).all()


@pytest.mark.parametrize("shape_q,shape_k", [
    ((1, 4, 300, 13), (1, 2, 290, 13)),
    pytest.param((2, 3, 1000, 64), (2, 1, 1100, 64), marks=pytest.mark.gpu),     # TMA
    pytest.param((1, 4, 1000, 128), (1, 2, 900, 128), marks=pytest.mark.gpu)])   # TMA
def test_wgmma16_causal_forward_round_the_heads_gives_head_by_head_bits(monkeypatch, shape_q,
                                                                       shape_k):
    """forward16's query blocks go round the heads from ROUND_HEADS_FROM blocks a head (the
    order of blocks only, make_block_order): with the threshold at 1 the round kernels run
    (seen by a spy on them) and give out and lse bit for bit as the head-by-head kernels, over
    several query blocks a head (3, against 4 heads, two to a key head: a rank and a head
    swapped would show), Nq != Nk; on a GPU also the TMA kernels (d = 64 and 128)."""
    rng = np.random.default_rng(5)
    dt = FORMATS["bfloat16"]
    q = rng.standard_normal(shape_q).astype(dt)
    k, v = (rng.standard_normal(shape_k).astype(dt) for _ in range(2))
    d = shape_q[-1]
    launch = forward16.make_forward_kernel(*forward16.tiles(d), d, True, np.dtype(dt),
                                           tma=True)[0]
    assert len(launch.dispatch) == 2 and launch.dispatch[1].vector is forward16.make_kernel(
        forward16.padded(d), True, "bfloat16", True, "wgmma", round_heads=True)
    assert launch.dispatch[0].vector is forward16.make_kernel(
        forward16.padded(d), True, "bfloat16", True, "wgmma", round_heads=False)
    # the kernels' own switch (their block index comes from make_block_order where it is on)
    for which, on in ((0, False), (1, True)):
        for kernel in (launch.dispatch[which].vector, launch.dispatch[which].scalar,
                       launch.tma[which]):
            switch = inspect.getclosurevars(kernel.py_func).nonlocals["ROUND_HEADS"]
            assert switch is on, (which, kernel)
    ran = []

    class Spy:
        def __init__(self, launcher):
            self.launcher = launcher

        def __getitem__(self, config):
            ran.append(config)
            return self.launcher[config]
    for name in ("dispatch", "tma"):
        kernels = getattr(launch, name)
        if kernels[1] is not None:
            monkeypatch.setattr(launch, name, [kernels[0], Spy(kernels[1])])
    results = []
    for first in (10 ** 9, 1):
        monkeypatch.setattr(forward16, "ROUND_HEADS_FROM", first)
        results.append(flash_attention_forward(q, k, v, causal=True, kernel="wgmma16"))
        assert len(ran) == (first == 1)
    (out0, lse0), (out1, lse1) = results
    assert_within_tolerance(check_forward(q, k, v, out1, lse1, causal=True))
    assert np.array_equal(out0.view(np.uint16), out1.view(np.uint16))
    assert np.array_equal(lse0, lse1)
