"""kernels/sm90/wgmma.py: the core-matrix layout, and a warpgroup's 3xTF32 product through it against
the NumPy model (simulator: the same sums bit for bit) and on a GPU (the tensor core's own
additions: a few units of roundoff of sum |ab|)."""

import numpy as np
import pytest
from numba import cuda, float32

import reference as ref
from numba_flash.kernels.sm90 import wgmma
from numba_flash.kernels.support import SIMULATOR
from numba_flash.kernels.support import ALIGN
from numba_flash.kernels.mma import split_tf32


def test_core_offset_is_a_permutation_with_core_matrices_of_8_rows_by_16_bytes():
    rows, K = 64, 16
    r, k = np.meshgrid(np.arange(rows), np.arange(K), indexing="ij")
    off = wgmma.core_offset_host(r, k, K)
    assert sorted(off.ravel()) == list(range(rows * K))
    # a core matrix: 8 rows of 4 consecutive floats, the rows next to each other
    assert (off[:8, :4] == np.arange(32).reshape(8, 4)).all()
    assert off[0, 4] == 32 and off[8, 0] == 32 * (K // 4)     # along K, then along rows


def test_products_reject_shapes_wgmma_lacks():
    with pytest.raises(ValueError, match="steps of 8"):
        wgmma.products(12, 16, 16)
    with pytest.raises(ValueError, match="multiples of 8"):
        wgmma.products(8, 12, 16)


def product_kernel(n, K):
    """D (64 x n) = A (64 x K) B^T (B: n x K) by one warpgroup: A and B split once into big and
    small TF32 parts in wgmma's layout, each 8-long step by products()'s step_3xtf32, the steps
    added in float32."""
    prod = wgmma.products(n, K, K)
    step, regs = prod["step_3xtf32"], prod["regs"]
    A_F, B_F = 64 * K, n * K

    @cuda.jit
    def product(A, B, D):
        sm = cuda.shared.array(2 * (64 * 16 + 16 * 16), float32, alignment=ALIGN)
        tid = cuda.threadIdx.x
        for i in range(tid, A_F, 128):
            big, small = split_tf32(A[i // K, i % K])
            sm[wgmma.core_offset(i // K, i % K, K)] = big
            sm[A_F + wgmma.core_offset(i // K, i % K, K)] = small
        for i in range(tid, B_F, 128):
            big, small = split_tf32(B[i // K, i % K])
            sm[2 * A_F + wgmma.core_offset(i // K, i % K, K)] = big
            sm[2 * A_F + B_F + wgmma.core_offset(i // K, i % K, K)] = small
        wgmma.fence_proxy_async()
        cuda.syncthreads()
        total = cuda.local.array(8, float32)
        for j in range(regs):
            total[j] = float32(0.0)
        for s in range(K // 8):
            part = step(sm, 0, A_F, 2 * A_F, 2 * A_F + B_F, s)
            for j in range(regs):
                total[j] += part[j]
        warp, lane = tid // 32, tid % 32
        for j in range(regs):
            r, c = wgmma.position(j, warp, lane)
            D[r, c] = total[j]
    return product


def run_product(n, K, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((64, K)).astype(np.float32)
    B = rng.standard_normal((n, K)).astype(np.float32)
    D = np.full((64, n), np.nan, np.float32)
    product_kernel(n, K)[1, 128](A, B, D)
    return A, B, D


@pytest.mark.skipif(not SIMULATOR, reason="the model's bits are the simulator's; on a GPU the "
                    "tensor core adds (test_gpu_warpgroup_product_is_float32_accurate)")
@pytest.mark.parametrize("n", [8, 16])
def test_warpgroup_product_is_the_3xtf32_model(n):
    A, B, D = run_product(n, 16)
    np.testing.assert_array_equal(D, ref.matmul_3xtf32(A, B.T))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8, 16])
def test_gpu_warpgroup_product_is_float32_accurate(n):
    A, B, D = run_product(n, 16)
    truth = A.astype(np.float64) @ B.astype(np.float64).T
    scale = 2.0 ** -24 * (np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64).T)
    assert np.max(np.abs(D - truth) / scale) < 6      # tools/wgmma_probe.py: 2.2-3.9
    assert np.max(np.abs(D - ref.matmul_3xtf32(A, B.T)) / scale) < 6
