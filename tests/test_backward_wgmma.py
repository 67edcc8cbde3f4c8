"""The Hopper backward (kernels/sm90/backward.py, dq.py) after the Hopper forward, atomic and
deterministic: against float64 truth within the tolerance rule, on the simulator (its products
modelled by sm90/wgmma.py) and on a GPU; the deterministic dQ pass bitwise reproducible and P
recomputed exactly; clear errors for what the pair does not cover."""

import numpy as np
import pytest

from numba_flash import SIMULATOR, flash_attention_backward, flash_attention_forward, registry
from numba_flash.kernels.sm90 import backward as sm90_backward
from numba_flash.kernels.sm90 import forward as sm90_forward
from numba_flash.testing import GPU_CASES, Case, assert_within_tolerance, check_backward


def check_case(case, deterministic=False):
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel="wgmma")
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=case.causal,
                                     kernel="wgmma", deterministic=deterministic)
    assert_within_tolerance(check_backward(dout, q, k, v, *grads, causal=case.causal),
                            f"wgmma backward {case}")
    return grads


SMALL = (Case("GQA, two Q blocks, Nq != Nk", 1, 2, 1, 70, 45, 12),
         Case("causal, fully masked rows", 1, 1, 1, 21, 7, 5, causal=True),
         Case("logits x1e3", 1, 1, 1, 17, 17, 8, logit_scale=1e3))


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_wgmma_backward_within_tolerance(case):
    check_case(case)


WIDE_SMALL = (Case("d = 72, GQA, two Q blocks, Nq != Nk", 1, 2, 1, 70, 45, 72),
              Case("d = 128, causal, two K/V blocks", 1, 1, 1, 20, 70, 128, causal=True))


@pytest.mark.parametrize("case", WIDE_SMALL, ids=lambda c: c.name)
def test_wide_backward_within_tolerance(case):
    check_case(case)


# deterministic=True on the simulator: small (the kernels' threads are Python threads), over
# two K/V blocks (the loops), masked rows; d <= 64 the lean kernel's ordered dQ, d = 72 the
# wide kernel and the dQ pass (256 threads)
DQ_PASS = (Case("causal, fully masked rows", 1, 1, 1, 21, 7, 5, causal=True),
           Case("two K/V blocks, GQA", 1, 2, 1, 5, 66, 4),
           Case("d = 72, two K/V blocks, causal", 1, 1, 1, 5, 66, 72, causal=True))


@pytest.mark.parametrize("case", DQ_PASS, ids=lambda c: c.name)
def test_deterministic_within_tolerance_and_dk_dv_as_the_atomic_path(case):
    """deterministic=True changes only how dQ is summed (d > 64: the dK/dV kernel without its
    dQ, then the dQ pass; d <= 64: dQ added in order, the Q blocks taken without rotation,
    the same sums for dk and dv where there is one Q block, as in these cases): dk and dv bit
    for bit; dq within tolerance either way."""
    atomic, exact = check_case(case), check_case(case, deterministic=True)
    assert np.array_equal(atomic[1], exact[1]) and np.array_equal(atomic[2], exact[2])


# d <= 64 with deterministic=True: the lean dK/dV kernel adds dQ in a fixed order, the last
# K/V block first (make_lean_kernel's ordered). On the simulator blocks run one at a time in
# index order, so each count is there when a block asks, and a wrong one raises (checked by
# making the count one off); dk and dv are summed over Q blocks without the atomic path's
# rotation (within tolerance, check_case)
ORDERED = (Case("causal, Nq < Nk, GQA, B = 2, three K/V blocks", 2, 2, 1, 70, 130, 12,
                causal=True),
           Case("causal, Nq > Nk: Q blocks that no K/V block adds into", 1, 1, 1, 200, 60, 12,
                causal=True),
           Case("Nq > Nk, GQA, three Q blocks", 1, 2, 1, 130, 70, 12))


@pytest.mark.skipif(not SIMULATOR, reason="the simulator runs blocks in index order")
@pytest.mark.parametrize("case", ORDERED, ids=lambda c: c.name)
def test_ordered_dq_adds_within_tolerance_and_counted_right_on_the_simulator(case):
    check_case(case, deterministic=True)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator runs blocks in index order")
def test_ordered_dq_adds_give_the_atomic_paths_dq_where_two_blocks_add():
    """Two K/V blocks: each dq entry is 0 + a + b in one order or the other, the same float,
    so the ordered kernel's dq is the atomic path's bit for bit (it fails if the ordered
    kernel adds what the atomic one does not, or the dQ pass runs instead)."""
    case = ORDERED[2]
    atomic, ordered = check_case(case), check_case(case, deterministic=True)
    assert np.array_equal(atomic[0], ordered[0])


@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
def test_dq_pass_twins_give_the_staged_twins_bits(causal):
    """The dQ pass (d > 64) for 16-byte aligned inputs copies the next block's K by cp.async
    into a raw block and splits K and K^T from there; its scalar twin stages K and K^T from
    global memory. Same operands, each step's product added in the same order, so the same dq
    bit for bit: two K/V blocks, the last partial (zeros past Nk from the copies' zero fill),
    unmasked or causal (Nq < Nk: rows 14-19 see part of the second), GQA, d = 68 (4 columns in
    the upper half), zeros past d. (The simulator's copies land at once: a missing wait or
    barrier shows only on the GPU, under racecheck.)"""
    d = 68
    from numba_flash.kernels.sm90 import dq as sm90_dq
    from numba_flash.kernels.support import head_grid
    from numba_flash.kernels.vector_io import aligned
    case = Case("two K/V blocks, GQA", 1, 2, 1, 20, 70, d, causal=causal)
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel="wgmma")
    q3, k3, v3, do3, o3 = (x.reshape(-1, x.shape[2], case.d) for x in (q, k, v, dout, out))
    lse2 = lse.reshape(q3.shape[:2]).astype(np.float32)
    D = (do3.astype(np.float64) * o3).sum(-1).astype(np.float32)
    assert aligned(q3, k3, v3, do3)
    dispatch, threads, _ = sm90_dq.launcher(causal)
    results = []
    for kernel in (dispatch.vector, dispatch.scalar):
        dq = np.zeros_like(q3)
        kernel[(1, *head_grid(q3.shape[0])), threads](
            q3, k3, v3, do3, lse2, D, dq, np.float32(case.d ** -0.5), case.H,
            case.H // case.Hk)
        results.append(dq)
    np.testing.assert_array_equal(results[0], results[1])
    assert np.abs(results[0]).max() > 0


@pytest.mark.parametrize("case", (Case("lean, GQA, two Q blocks", 1, 2, 1, 70, 45, 12),
                                  Case("wide, causal, two Q blocks", 1, 1, 1, 70, 45, 68,
                                       causal=True)),
                         ids=lambda c: c.name)
def test_vector_dkdv_kernels_give_the_scalar_kernels_bits(case):
    """The dK/dV kernels' vector twins read dV's and dK's A (dO^T, Q^T) as pairs of adjacent
    head-dim columns, 8 bytes at a time, where the scalar kernels read them element by
    element into the same paired rows: the same dk and dv bit for bit, over two Q blocks
    (GQA: two query heads per key head; causal: masked rows in the first), d = 12 (lean) and
    68 (wide: 4 columns in the upper half, zeros past d)."""
    from numba_flash.kernels.support import head_grid
    from numba_flash.kernels.vector_io import aligned
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel="wgmma")
    q3, k3, v3, do3, o3 = (x.reshape(-1, x.shape[2], case.d) for x in (q, k, v, dout, out))
    lse2 = lse.reshape(q3.shape[:2]).astype(np.float32)
    D = (do3.astype(np.float64) * o3).sum(-1).astype(np.float32)
    assert aligned(q3, do3)
    dispatch, threads = sm90_backward.dkdv_launcher(case.d > 64, case.causal, False)
    results = []
    for kernel in (dispatch.vector, dispatch.scalar):
        dk, dv = np.zeros_like(k3), np.zeros_like(v3)
        kernel[(1, *head_grid(k3.shape[0])), threads](
            q3, k3, v3, do3, lse2, D, dk, dv, np.zeros_like(q3),
            np.float32(case.d ** -0.5), case.H, case.H // case.Hk)
        results.append((dk, dv))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    assert np.abs(results[0][0]).max() > 0 and np.abs(results[0][1]).max() > 0


@pytest.mark.parametrize("case", (Case("GQA, two Q blocks, Nq != Nk", 1, 2, 1, 70, 45, 12),
                                  Case("causal, three Q blocks, two K/V blocks", 1, 1, 1, 150,
                                       80, 8, causal=True)),
                         ids=lambda c: c.name)
def test_lean_kernel_with_dq_vector_twin_gives_the_scalar_twins_bits(case):
    """The lean kernel with dQ adds dQ by vector atomics and, under causal masking, reads S's
    and dP's step-permuted A pairs from Q's and dO's row views 8 bytes at a time
    (vector_io.load2_row), where its scalar twin reads and adds element by element (the
    unmasked vector kernel reads them per step too): the same dq, dk and dv, bit for bit (the
    simulator adds in the grid's order either way), rows past Nq of dq left alone."""
    from numba_flash.kernels.support import head_grid
    from numba_flash.kernels.vector_io import aligned
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal, kernel="wgmma")
    q3, k3, v3, do3, o3 = (x.reshape(-1, x.shape[2], case.d) for x in (q, k, v, dout, out))
    lse2 = lse.reshape(q3.shape[:2]).astype(np.float32)
    D = (do3.astype(np.float64) * o3).sum(-1).astype(np.float32)
    dispatch, threads = sm90_backward.dkdv_launcher(False, case.causal, True)
    results = []
    for kernel in (dispatch.vector, dispatch.scalar):
        dk, dv = np.zeros_like(k3), np.zeros_like(v3)
        # dq with rows past Nq (the kernel reads Nq from q) holding a sentinel to leave alone
        dq = np.full((q3.shape[0], q3.shape[1] + 3, case.d), 7.0, np.float32)
        dq[:, :q3.shape[1]] = 0
        assert aligned(q3, do3, dq)
        grid = (-(-k3.shape[1] // 64), *head_grid(k3.shape[0]))
        kernel[grid, threads](q3, k3, v3, do3, lse2, D, dk, dv, dq,
                              np.float32(case.d ** -0.5), case.H, case.H // case.Hk)
        assert np.all(dq[:, q3.shape[1]:] == 7.0)
        results.append((dq, dk, dv))
    for vector, scalar in zip(*results):
        np.testing.assert_array_equal(vector, scalar)
    assert np.abs(results[0][0]).max() > 0


def test_wgmma_rejects_tiles_it_does_not_have_and_falls_back_where_it_cannot_run():
    with pytest.raises(ValueError, match="64 x 64 tiles"):
        sm90_backward.check_tiles(32, 64, 64, np.float32)
    with pytest.raises(ValueError, match="takes float32 and half inputs"):
        sm90_forward.check(64, 64, 64, np.float64)
    sm90_forward.check(64, 64, 64, np.float16)        # half inputs, widened: taken
    with pytest.raises(ValueError, match="128 x 64 tiles at d = 100"):
        sm90_forward.check(64, 64, 100, np.float32)
    q = np.ones((1, 1, 4, 8), np.float32)
    with pytest.raises(ValueError, match="64 x 64 tiles"):
        flash_attention_backward(q, q, q, q, q, q[..., 0], kernel="wgmma", block_m=32)
    for d, dtype in ((129, np.float32), (64, np.float64)):
        assert registry.resolve("wgmma", d, dtype, "sm_90").name == "fa2"
    assert registry.resolve("wgmma", 64, np.float32, "sm_80").name == "fa2"
    assert registry.resolve("wgmma", 128, np.float32, "sm_90").name == "wgmma"
    assert registry.resolve("wgmma", 128, "bfloat16", "sm_90").name == "wgmma"


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic dQ", "deterministic"])
@pytest.mark.parametrize("case", [c for c in GPU_CASES if c.d <= 128]
                         + [Case("N = 2048", 1, 4, 4, 2048, 2048, 64),
                            Case("N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 64, causal=True),
                            Case("d = 128, N = 2048, causal, GQA", 1, 4, 2, 2048, 2048, 128,
                                 causal=True),
                            Case("d = 128, logits x1e3", 1, 2, 2, 256, 256, 128,
                                 logit_scale=1e3),
                            Case("d = 96, odd, causal", 2, 3, 1, 197, 131, 96, causal=True)],
                         ids=lambda c: c.name)
def test_gpu_wgmma_backward_within_tolerance(case, deterministic):
    check_case(case, deterministic)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [64, 128])
def test_gpu_wgmma_deterministic_backward_is_bitwise_reproducible(d):
    case = Case("det", 2, 4, 2, 300, 333, d, causal=True)
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=True, kernel="wgmma")
    first = flash_attention_backward(dout, q, k, v, out, lse, causal=True, kernel="wgmma",
                                     deterministic=True)
    for _ in range(19):
        again = flash_attention_backward(dout, q, k, v, out, lse, causal=True, kernel="wgmma",
                                         deterministic=True)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("causal", [False, True], ids=["unmasked", "causal"])
def test_gpu_ordered_dq_adds_finish_and_repeat_with_more_blocks_than_fit(causal):
    """d = 64 deterministic with 1024 dK/dV blocks (more than an H100 or H200 holds at once,
    two a SM): every block's wait ends (a hang is this test's failure, at its timeout) and
    three calls give the same bits."""
    case = Case("many blocks", 2, 32, 8, 4096, 4096, 64, causal=causal)
    q, k, v, dout = case.inputs(np.float32)
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel="wgmma")
    first = flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel="wgmma",
                                     deterministic=True)
    for _ in range(2):
        again = flash_attention_backward(dout, q, k, v, out, lse, causal=causal,
                                         kernel="wgmma", deterministic=True)
        assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_dq_pass_refuses_lean_head_dims():
    """The dQ pass is the wide one only (d > 64): at d <= 64 run_backward adds dQ in the
    lean dK/dV kernel, and a direct call says so instead of launching a kernel that is not
    there."""
    from numba_flash.kernels.sm90.dq import run_dq
    q = np.zeros((1, 4, 64), np.float32)
    lse = np.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="d = 64"):
        run_dq(q, q, q, q, lse, lse, q.copy(), scale=0.125, heads=1, group=1, causal=False)
