"""kernels/mma16.py (the "mma16" pair: forward16 and backward16 on mma.sync.m16n8k16, for
sm_80+ GPUs without wgmma): its products on integer inputs (exact, so a wrong fragment load
gives other numbers), which GPUs the pair takes, and the pair within the half tolerance.

On the simulator mma16's products are wgmma16's NumPy model, so there these check the plumbing
(engine, registry, the fa2 deterministic backward); the fragment loads and mma.sync only the
gpu-marked tests do, on the GPU at hand (here an H200: mma.sync compiled for sm_90; for sm_80
the kernels are only assembled, by tools/ptxas_check.py)."""

import ml_dtypes
import numpy as np
import pytest

from numba_flash import registry
from numba_flash.kernels import mma16
from test_wgmma16 import FORMATS, REAL, SMALL, _check, product_kernel, tile_offsets


@pytest.mark.gpu           # on the simulator mma16.products16 is wgmma16's model, tested there
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("n,K,transposed", [(64, 64, False), (128, 64, False), (64, 128, False),
                                            (64, 64, True), (128, 64, True), (64, 128, True),
                                            (32, 64, True)])
def test_mma16_products_on_integers_are_exact(fmt, n, K, transposed):
    # integers |x| <= 8: every product and partial sum exact in float32 (as in test_wgmma16)
    rng = np.random.default_rng(n + K + transposed)
    A, A2 = (rng.integers(-8, 9, (64, K)).astype(np.float32) for _ in range(2))
    B = rng.integers(-8, 9, (n, K)).astype(np.float32)
    C = rng.integers(-100, 101, (64, n)).astype(np.float32)
    bits = lambda x: x.astype(FORMATS[fmt]).view(np.uint16)         # noqa: E731
    D = np.full((64, n), np.nan, np.float32)
    E = np.full((64, n), np.nan, np.float32)
    kernel, nbytes = product_kernel(n, K, fmt, transposed, products16=mma16.products16,
                                    fence=mma16.no_fence)
    stored = np.ascontiguousarray(B.T) if transposed else B
    kernel[1, 128, 0, nbytes](bits(A), A2, bits(stored), C, D, E,
                              *tile_offsets(n, K, transposed))
    np.testing.assert_array_equal(D, A @ B.T)
    np.testing.assert_array_equal(E, C + A2 @ B.T)


def test_mma16_engine_names_and_shapes():
    wgmma = ("products16", "make_wait", "fence")
    assert mma16.engine("mma", wgmma).vector_dq is False
    assert mma16.engine("wgmma", wgmma).products16 == "products16"
    with pytest.raises(ValueError, match="engine must be"):
        mma16.engine("tf32", wgmma)
    with pytest.raises(ValueError, match="multiple of 16"):
        mma16.products16(64, 24, 64, "bfloat16")


def test_mma16_runs_where_its_shared_memory_fits():
    bf16 = ml_dtypes.bfloat16
    can_run = registry.PAIRS["mma16"].can_run
    assert can_run(128, bf16, "sm_80") and can_run(128, bf16, "sm_90")
    assert can_run(64, bf16, "sm_86") and not can_run(65, bf16, "sm_86")   # 99 KiB a block
    assert not can_run(64, bf16, "sm_75") and not can_run(64, np.float32, "sm_80")
    assert not can_run(129, np.float16, "sm_80")
    assert registry.resolve("mma16", 128, bf16, "sm_89").name == "fa2"


def test_mma16_deterministic_backward_is_reproducible_and_fits_every_sm80_gpu():
    # fa2's widened backward, with tiles that fit 99 KiB of shared memory (fa2's own defaults
    # are sized for the H200); two calls give the same bits
    from numba_flash import flash_attention_backward, flash_attention_forward
    from numba_flash.kernels import backward_fa2
    from numba_flash.kernels.sm90 import backward16
    from numba_flash.kernels.support import SHARED_PER_BLOCK_LEAST
    for d in (1, 64, 65, 128):
        for det in (False, True):
            bm, bn = backward16.widened_tiles(d, "mma", det)
            assert backward_fa2.shared_bytes(bm, bn, d, 4, dq_atomic=not det) \
                <= SHARED_PER_BLOCK_LEAST
    rng = np.random.default_rng(5)
    q, k, v, dout = (rng.standard_normal((1, 2, 30, 24)).astype(ml_dtypes.bfloat16)
                     for _ in range(4))
    out, lse = flash_attention_forward(q, k, v, kernel="mma16")
    a, b = (flash_attention_backward(dout, q, k, v, out, lse, kernel="mma16", deterministic=True)
            for _ in range(2))
    for x, y in zip(a, b):
        assert x.view(np.uint16).tobytes() == y.view(np.uint16).tobytes()


# on the simulator mma16's products are wgmma16's model (test_wgmma16 runs every SMALL case):
# here the pair's own wiring, atomic and deterministic, on the two cheaper cases (SMALL[1], d =
# 100 with the deterministic backward, took 85 s of CI)
@pytest.mark.parametrize("fmt,case,deterministic", [("bfloat16", SMALL[0], False),
                                                    ("float16", SMALL[2], True)])
def test_mma16_within_the_half_tolerance(fmt, case, deterministic):
    _check(fmt, *case, deterministic=deterministic, kernel="mma16")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shape_q,shape_k,causal,logits", REAL)
def test_gpu_mma16_within_the_half_tolerance(fmt, shape_q, shape_k, causal, logits):
    _check(fmt, shape_q, shape_k, causal, scale_logits=logits, kernel="mma16")
    _check(fmt, shape_q, shape_k, causal, scale_logits=logits, deterministic=True,
           kernel="mma16")
