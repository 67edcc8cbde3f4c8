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


# The tolerance rule for half kernels (numba_flash.testing.tolerance.half_format): the
# FlashAttention model, standing in for a correct half kernel, passes it; careless ones fail.

from numba_flash.testing.tolerance import (backward_truth, check_backward,  # noqa: E402
                                           check_forward, forward_truth)


def _half_inputs(fmt, shape_q, shape_kv, seed, logit_scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(shape_q) * logit_scale
    k = rng.standard_normal(shape_kv) * logit_scale
    v, dout = rng.standard_normal(shape_kv), rng.standard_normal(shape_q)
    return tuple(a.astype(np.float32).astype(NUMPY_TYPE[fmt]) for a in (q, k, v, dout))


def _flash_stand_in(q, k, v, dout, fmt, causal):
    """What a half kernel following reference.half returns: out and gradients in the half
    dtype, lse in float32 (GQA by repeated key heads, dk and dv summed back)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    q32, k32, v32, do32 = (a.astype(np.float32) for a in (q, k, v, dout))
    k32, v32 = ref.repeat_kv(k32, heads), ref.repeat_kv(v32, heads)
    out, lse = flash_forward_half(q32, k32, v32, fmt, causal=causal)
    dq, dk, dv = flash_backward_half(do32, q32, k32, v32, out, lse, fmt, causal=causal)
    dk, dv = (round_half(ref.sum_kv_groups(g, kv_heads), fmt) for g in (dk, dv))
    t = NUMPY_TYPE[fmt]
    return out.astype(t), lse, (dq.astype(t), dk.astype(t), dv.astype(t))


HALF_PROBLEMS = [  # (name, q shape, k/v shape, causal, logit scale)
    ("ordinary", (1, 2, 40, 16), (1, 2, 40, 16), False, 1.0),
    ("GQA, causal, Nq < Nk", (2, 4, 23, 24), (2, 2, 37, 24), True, 1.0),
    ("fully masked rows", (1, 1, 30, 8), (1, 1, 12, 8), True, 1.0),
    ("large logits", (1, 2, 33, 32), (1, 2, 33, 32), False, 8.0),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name,qs,kvs,causal,logits", HALF_PROBLEMS, ids=lambda x: str(x))
def test_flash_stand_in_passes_the_half_rule(fmt, name, qs, kvs, causal, logits):
    q, k, v, dout = _half_inputs(fmt, qs, kvs, seed=len(name), logit_scale=logits)
    out, lse, grads = _flash_stand_in(q, k, v, dout, fmt, causal)
    checks = check_forward(q, k, v, out, lse, causal=causal) + check_backward(
        dout, q, k, v, *grads, causal=causal)
    assert all(c.ok for c in checks), "\n".join(map(str, checks))
    # the half floor is tight: at most a few percent of what the rule allows (not 12 %)
    assert checks[0].allowed < 0.5 * np.abs(v.astype(np.float32)).max()


def test_careless_half_kernels_fail_the_rule():
    # 1. S stored in float16 (standard attention's rounding): NaN where |S| > 65504
    q, k, v, dout = _half_inputs("float16", (1, 1, 16, 8), (1, 1, 16, 8), seed=3,
                                 logit_scale=400.0)
    out, lse = attention_forward_half(*(a.astype(np.float32) for a in (q, k, v)), "float16")
    checks = check_forward(q, k, v, out.astype(np.float16), lse)
    assert not checks[0].ok and "NaN" in checks[0].note
    # 2. the output accumulator held in half (O rounded after every key added): the roundings
    # pile up with Nk
    q, k, v, dout = _half_inputs("float16", (1, 1, 512, 16), (1, 1, 512, 16), seed=5)
    q32, k32, v32, do32 = (a.astype(np.float32) for a in (q, k, v, dout))
    out, lse = flash_forward_half(q32, k32, v32, "float16")
    P = np.exp((q32 @ k32.swapaxes(-1, -2)) / np.float32(4.0) - lse[..., None])
    acc = np.zeros_like(q32)
    for j in range(k.shape[-2]):                 # O += P_j v_j, held in float16
        acc = round_half(acc + P[..., :, j, None] * v32[..., j, None, :], "float16")
    forward = check_forward(q, k, v, acc.astype(np.float16), lse)
    assert not forward[0].ok and forward[1].ok, forward
    # and the truth is of the half inputs, in float64
    t = forward_truth(q, k, v)
    assert t.dtype == np.float16 and t.out.dtype == np.float64
    bt = backward_truth(dout, q, k, v)
    assert all(g.dtype == np.float64 for g in bt.grads)
