"""Half inputs (float16, bfloat16): the device conversions to float32 and back give the bits
NumPy and ml_dtypes give, and the API takes half arrays of every kind, returns out and the
gradients in that dtype (lse in float32) within the half tolerance rule, and leaves its
inputs untouched. On the simulator and (gpu) on a GPU."""

import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import numba_flash
from numba_flash import flash_attention_backward, flash_attention_forward, registry
from numba_flash.kernels import convert
from numba_flash.testing import Case, check_backward, check_forward

FORMATS = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def special_and_random_floats(n=4000, seed=0):
    """float32 values: every class a rounding must get right (NaN of both signs, +-inf, +-0,
    the half formats' largest and just past it, ties, float32 and half subnormals), then
    random bit patterns."""
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 65504.0, 65519.0, 65520.0,
                        -65520.0, 3.3895e38, 3.4028e38, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
                        1.0 + 2.0 ** -11, 6.0e-8, 3.0e-8, 2.9e-8, 1e-40, -1e-45, 6.1e-5],
                       dtype=np.float32)
    bits = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([special, bits.view(np.float32)])


def same_bits(a, b):
    """Equal bit patterns, or both NaN (a NaN's payload is free)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    return (a.view(np.uint16) == b.view(np.uint16)) | (np.isnan(a32) & np.isnan(b32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_narrow_rounds_as_numpy_and_widen_is_exact(fmt):
    dtype = FORMATS[fmt]
    x = special_and_random_floats(600 if numba_flash.SIMULATOR else 1 << 20)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(dtype)
    storage = np.int16 if fmt == "bfloat16" else np.float16
    narrow = cuda.device_array(x.shape, storage)
    convert.narrow(cuda.to_device(x), narrow, fmt)
    got = narrow.copy_to_host().view(dtype)
    assert same_bits(got, want).all(), x[~same_bits(got, want)][:10]
    wide = cuda.device_array(x.shape, np.float32)
    convert.widen(cuda.to_device(want.view(storage)), wide, fmt)
    np.testing.assert_array_equal(wide.copy_to_host(), want.astype(np.float32))


@pytest.mark.parametrize("fmt", FORMATS)
def test_numpy_half_inputs_run_and_stay_untouched(fmt):
    case = Case("GQA, causal, Nq != Nk", 1, 2, 1, 6, 9, 8, causal=True)
    q, k, v, dout = case.inputs(FORMATS[fmt])
    before = [a.copy() for a in (q, k, v, dout)]
    out, lse = flash_attention_forward(q, k, v, causal=True)
    dq, dk, dv = flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    for a, b in zip((q, k, v, dout), before):
        assert a.dtype == b.dtype and (a.view(np.uint16) == b.view(np.uint16)).all()
    assert out.dtype == dq.dtype == dk.dtype == dv.dtype == FORMATS[fmt]
    assert lse.dtype == np.float32 and dk.shape == k.shape
    results = (check_forward(q, k, v, out, lse, causal=True)
               + check_backward(dout, q, k, v, dq, dk, dv, causal=True))
    assert all(c.ok for c in results), [str(c) for c in results]


def test_half_lse_and_outputs_are_checked_for_their_dtypes():
    q, k, v, dout = Case("small", 1, 1, 1, 4, 4, 8).inputs(np.float16)
    out, lse = flash_attention_forward(q, k, v)
    with pytest.raises(TypeError, match="lse must have dtype float32"):
        flash_attention_backward(dout, q, k, v, out, lse.astype(np.float16))
    with pytest.raises(TypeError, match="out must have dtype float16"):
        flash_attention_backward(dout, q, k, v, out.astype(np.float32), lse)
    # the scale is the float32 kernels': 1e5 is fine for float16 inputs (past 65504)
    flash_attention_forward(q, k, v, scale=1e5)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["float16"])
def test_gpu_cupy_half_arrays(fmt):
    cupy = pytest.importorskip("cupy")
    q, k, v, dout = Case("odd", 2, 3, 3, 97, 131, 64).inputs(FORMATS[fmt])
    out, lse = flash_attention_forward(*(cupy.asarray(a) for a in (q, k, v)))
    assert isinstance(out, cupy.ndarray) and out.dtype == np.float16 and lse.dtype == np.float32
    results = check_forward(q, k, v, cupy.asnumpy(out), cupy.asnumpy(lse))
    assert all(c.ok for c in results), [str(c) for c in results]


@pytest.mark.gpu
@pytest.mark.parametrize("d,causal", [(40, True), (64, False), (100, True), (128, False)])
def test_gpu_wgmma_half_kernels_give_the_float32_kernels_bits(d, causal):
    # the wgmma pair's half-input kernels skip the products of the inputs' zero small parts
    # (registry.Pair.half_inputs): the same sums, so the same bits as its float32 kernels on
    # the widened values, forward and backward (deterministic dQ: no atomics' order)
    if registry.current_device() != "sm_90":
        pytest.skip("the wgmma pair runs on sm_90")
    q, k, v, dout = Case("gqa", 2, 4, 2, 150, 203, d, causal=causal).inputs(FORMATS["bfloat16"])
    wide = [a.astype(np.float32) for a in (q, k, v, dout)]
    out, lse = flash_attention_forward(q, k, v, causal=causal, kernel="wgmma")
    out32, lse32 = flash_attention_forward(*wide[:3], causal=causal, kernel="wgmma")
    np.testing.assert_array_equal(lse, lse32)
    assert (out.view(np.uint16) == out32.astype(FORMATS["bfloat16"]).view(np.uint16)).all()
    grads = flash_attention_backward(dout, q, k, v, out, lse, causal=causal, kernel="wgmma",
                                     deterministic=True)
    # the float32 backward from the same out (rounded to bfloat16) and lse
    grads32 = flash_attention_backward(wide[3], *wide[:3], out.astype(np.float32), lse,
                                       causal=causal, kernel="wgmma", deterministic=True)
    for g, g32 in zip(grads, grads32):
        assert (g.view(np.uint16) == g32.astype(FORMATS["bfloat16"]).view(np.uint16)).all()
