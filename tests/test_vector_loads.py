"""The fa2 forward's vector_loads option (16-byte global loads, an experiment for tune): the
same arithmetic as the scalar staging, so the same bits; clear errors where it cannot run."""

import numpy as np
import pytest

from numba_flash.kernels import forward_fa2
from numba_flash.kernels.vector_io import aligned
from numba_flash.testing import Case, check_forward


def run(case, dtype, block_m, block_n, **options):
    q, k, v, _ = case.inputs(dtype)
    bh, d = q.shape[0] * q.shape[1], q.shape[-1]
    q3, k3, v3 = (x.reshape(-1, x.shape[2], d) for x in (q, k, v))
    kern, threads = forward_fa2.make_forward_kernel(block_m, block_n, d, case.causal,
                                                    np.dtype(dtype), **options)
    out = np.zeros_like(q3)
    lse = np.zeros(q3.shape[:2], dtype)
    kern[(-(-q3.shape[1] // block_m), bh), threads](q3, k3, v3, out, lse, dtype(d ** -0.5),
                                                    case.H, case.H // case.Hk)
    return (q, k, v), out.reshape(q.shape), lse.reshape(q.shape[:-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("prefetch", [False, True])
def test_vector_loads_give_the_scalar_bits(dtype, prefetch):
    # several K/V tiles (the prefetch runs), a partial last tile, d below its padding
    case = Case("vector", 1, 2, 1, 21, 45, 12, causal=True)
    (q, k, v), out, lse = run(case, dtype, 16, 16, prefetch=prefetch, vector_loads=True)
    _, ref_out, ref_lse = run(case, dtype, 16, 16, prefetch=prefetch)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
    assert all(c.ok for c in check_forward(q, k, v, out, lse, causal=True))


def test_vector_loads_need_d_a_multiple_of_4():
    with pytest.raises(ValueError, match="multiple of 4"):
        forward_fa2.make_forward_kernel(16, 16, 10, False, np.dtype(np.float32),
                                        vector_loads=True)


def test_vector_loads_reject_misaligned_arrays():
    flat = np.zeros(1 + 2 * 16 * 8, np.float32)
    good, bad = flat[:-1].reshape(2, 16, 8), flat[1:].reshape(2, 16, 8)   # bad: 4 bytes off
    assert aligned(good) and not aligned(bad)
    assert not aligned(np.zeros((2, 16, 6), np.float32))                    # 24-byte rows
    kern, threads = forward_fa2.make_forward_kernel(16, 16, 8, False, np.dtype(np.float32),
                                                    vector_loads=True)
    out, lse = np.zeros_like(good), np.zeros((2, 16), np.float32)
    with pytest.raises(ValueError, match="16-byte aligned"):
        kern[(1, 2), threads](bad, good, good, out, lse, np.float32(0.3), 1, 1)


@pytest.mark.gpu
def test_gpu_vector_loads_give_the_scalar_bits():
    case = Case("vector, real size", 2, 4, 2, 1000, 1030, 128, causal=False)
    (q, k, v), out, lse = run(case, np.float32, 128, 64, vector_loads=True)
    _, ref_out, ref_lse = run(case, np.float32, 128, 64)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(lse, ref_lse)
