"""The fa2 dK/dV kernel's prefetch option (the next Q and dO tiles loaded into registers while
one is computed; an experiment for tune, off by default): the same arithmetic on the same
values, so the same bits."""

import numpy as np
import pytest

from numba_flash import flash_attention_forward
from numba_flash.kernels import backward_fa2
from numba_flash.testing import Case, check_backward


def run(case, dtype, dq_atomic, prefetch, block_m=8, block_n=16):
    q, k, v, dout = case.inputs(dtype)
    out, lse = flash_attention_forward(q, k, v, causal=case.causal)
    d = q.shape[-1]
    q3, k3, v3, dout3, out3 = (x.reshape(-1, x.shape[2], d) for x in (q, k, v, dout, out))
    dq, dk, dv = np.zeros_like(q3), np.zeros_like(k3), np.zeros_like(v3)
    backward_fa2.run_backward(dout3, q3, k3, v3, lse.reshape(q3.shape[:2]), out3, dq, dk, dv,
                              scale=d ** -0.5, heads=case.H, group=case.H // case.Hk,
                              causal=case.causal, block_m=block_m, block_n=block_n,
                              dq_atomic=dq_atomic, prefetch=prefetch)
    return (dout, q, k, v), [x.reshape(y.shape) for x, y in ((dq, q), (dk, k), (dv, v))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dq_atomic", [False, True])
def test_prefetch_gives_the_same_bits(dtype, dq_atomic):
    # several Q tiles per head (the prefetch runs), a partial last one, two query heads per
    # key head (a new head restarts without prefetch), causal (Q blocks skipped at the start)
    case = Case("prefetch", 1, 2, 1, 21, 30, 12, causal=True)
    inputs, got = run(case, dtype, dq_atomic, prefetch=True)
    _, ref = run(case, dtype, dq_atomic, prefetch=False)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=True))
    for g, r in zip(got if not dq_atomic else got[1:], ref if not dq_atomic else ref[1:]):
        np.testing.assert_array_equal(g, r)
    if dq_atomic:                                   # atomics: the same sums in another order
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_gpu_prefetch_gives_the_same_bits():
    case = Case("prefetch, real size", 1, 4, 2, 700, 1030, 64, causal=True)
    inputs, got = run(case, np.float32, False, True, block_m=64, block_n=128)
    _, ref = run(case, np.float32, False, False, block_m=64, block_n=128)
    assert all(c.ok for c in check_backward(*inputs, *got, causal=True))
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
