"""The half-precision reference (reference/precision.round_half, reference/half.py): the
rounding bit for bit against NumPy's float16 and ml_dtypes' bfloat16; the FlashAttention model
within the rule the half kernels will be held to (2x / 3x standard half attention's error
against float64 truth of the same half inputs, plus a floor of a few half units); the float16
overflow that storing S causes and FlashAttention's rounding avoids; fully masked rows."""

import numpy as np
import pytest

import reference as ref
from reference.half import (attention_backward_half, attention_forward_half,
                            flash_backward_half, flash_forward_half)
from reference.precision import HALF_MAX, HALF_UNIT_ROUNDOFF, round_half

ml_dtypes = pytest.importorskip("ml_dtypes")
NUMPY_TYPE = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
FORMATS = ("float16", "bfloat16")


def edge_values():
    """float32 values around every case of a rounding: ties both ways, the largest finite,
    overflow, subnormals, zeros, infinities, NaN; and a million random bit patterns."""
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 10**6, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 1.0, 1 + 2**-8, 1 + 2**-9, 1 + 3 * 2**-9, 1 + 2**-11,
                        1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, 1e5, 2**-24, 2**-25,
                        2**-14 - 2**-25, 3.3895e38, 3.4e38, np.inf, -np.inf, np.nan],
                       np.float32)
    return np.concatenate([bits.view(np.float32), special, -special])


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_half_is_the_formats_own_rounding_bit_for_bit(fmt):
    x = edge_values()
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(NUMPY_TYPE[fmt]).astype(np.float32)
    got = round_half(x, fmt)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    assert (got[~nan].view(np.uint32) == want[~nan].view(np.uint32)).all()
    assert round_half(np.float32(HALF_MAX[fmt]), fmt) == np.float32(HALF_MAX[fmt])
    with pytest.raises(ValueError, match="fmt must be one of"):
        round_half(x, "float8")


def _truth(q, k, v, dout, fmt, causal):
    """float64 truth of the same half inputs: forward (out, lse) and backward (dq, dk, dv)."""
    q, k, v, dout = (round_half(a, fmt).astype(np.float64) for a in (q, k, v, dout))
    return (ref.attention_forward(q, k, v, causal=causal),
            ref.attention_backward(dout, q, k, v, causal=causal))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed,causal", [(0, False), (1, True), (2, True)])
def test_flash_model_within_the_half_rule(fmt, seed, causal):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((2, 2, 37, 24)).astype(np.float32) for _ in range(4))
    (out64, lse64), grads64 = _truth(q, k, v, dout, fmt, causal)
    out_s, _ = attention_forward_half(q, k, v, fmt, causal=causal)
    grads_s = attention_backward_half(dout, q, k, v, fmt, causal=causal)
    out_f, lse_f = flash_forward_half(q, k, v, fmt, causal=causal)
    grads_f = flash_backward_half(dout, q, k, v, out_f, lse_f, fmt, causal=causal)
    u = HALF_UNIT_ROUNDOFF[fmt]

    def err(a, b):
        return float(np.abs(a.astype(np.float64) - b).max())

    # out: 2x standard's error plus two half units of the largest |out|; lse is float32 here
    assert err(out_f, out64) <= 2 * err(out_s, out64) + 2 * u * np.abs(out64).max()
    assert err(lse_f, lse64) <= 1e-5 * max(1.0, np.abs(lse64).max())
    for g_f, g_s, g64 in zip(grads_f, grads_s, grads64):
        assert err(g_f, g64) <= 3 * err(g_s, g64) + 2 * u * np.abs(g64).max()
    # and the outputs are values of the format
    for a in (out_f, *grads_f):
        assert (round_half(a, fmt) == a).all()


def test_float16_overflow_of_stored_logits_is_avoided_by_flash_rounding():
    # |S| past 65504: standard float16 attention stores S as inf and returns NaN rows; the
    # FlashAttention rounding keeps S in float32 and stays within its rule of the truth
    rng = np.random.default_rng(3)
    q, k, v, dout = (rng.standard_normal((1, 1, 16, 8)).astype(np.float32) for _ in range(4))
    q, k = q * 400, k * 400                   # |S| ~ 1e5 / sqrt(8)... past 65504
    S = (round_half(q, "float16") @ round_half(k, "float16").swapaxes(-1, -2)) / np.sqrt(8)
    assert np.abs(S).max() > HALF_MAX["float16"]
    out_s, _ = attention_forward_half(q, k, v, "float16")
    assert np.isnan(out_s).any()
    (out64, lse64), (dq64, dk64, dv64) = _truth(q, k, v, dout, "float16", False)
    out_f, lse_f = flash_forward_half(q, k, v, "float16")
    dq, dk, dv = flash_backward_half(dout, q, k, v, out_f, lse_f, "float16")
    assert np.isfinite(out_f).all() and np.isfinite(lse_f).all()
    assert np.abs(out_f - out64).max() <= 4 * HALF_UNIT_ROUNDOFF["float16"] * np.abs(v).max()
    assert np.abs(dv - dv64).max() <= 4 * HALF_UNIT_ROUNDOFF["float16"] * np.abs(dv64).max()


@pytest.mark.parametrize("fmt", FORMATS)
def test_fully_masked_rows_give_zeros_and_minus_inf(fmt):
    rng = np.random.default_rng(4)
    q, dout = (rng.standard_normal((1, 1, 9, 8)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((1, 1, 4, 8)).astype(np.float32) for _ in range(2))
    out, lse = flash_forward_half(q, k, v, fmt, causal=True)     # rows 0-4 see no key
    dq, dk, dv = flash_backward_half(dout, q, k, v, out, lse, fmt, causal=True)
    assert np.isneginf(lse[..., :5]).all() and np.isfinite(lse[..., 5:]).all()
    assert (out[..., :5, :] == 0).all() and (dq[..., :5, :] == 0).all()
    assert np.isfinite(dk).all() and np.isfinite(dv).all()
