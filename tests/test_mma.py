"""The tensor-core primitives (kernels/mma.py): TF32 rounding and the 3xTF32 split on the
simulator and the GPU, and mma_tf32's fragment layout on the GPU."""

import numpy as np
import pytest
from numba import cuda

import numba_flash

from numba_flash.kernels.mma import TF32_DROPPED_BITS, round_tf32_host, split_tf32

LOW = np.uint32((1 << TF32_DROPPED_BITS) - 1)


def test_round_tf32_host_rounds_to_nearest_ties_away():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000)).astype(np.float32)
    r = round_tf32_host(x)
    assert not np.any(r.view(np.uint32) & LOW)                  # 10 mantissa bits left
    # within half a unit of TF32's last place (2^-11 relative) and no farther than the
    # neighbours: the nearest TF32 value
    assert np.all(np.abs(r.astype(np.float64) - x) <= np.abs(x.astype(np.float64)) * 2.0 ** -11)
    one_and_half_ulp = np.float32(1 + 2.0 ** -11)               # exactly between 1 and 1 + 2^-10
    assert round_tf32_host(one_and_half_ulp) == np.float32(1 + 2.0 ** -10)
    assert round_tf32_host(-one_and_half_ulp) == -np.float32(1 + 2.0 ** -10)
    assert round_tf32_host(np.float32(1 + 2.0 ** -12)) == 1
    special = np.array([np.inf, -np.inf, 0.0, -0.0], np.float32)
    np.testing.assert_array_equal(round_tf32_host(special), special)
    assert np.isnan(round_tf32_host(np.float32(np.nan)))


@pytest.mark.skipif(not numba_flash.SIMULATOR, reason="the simulator's scalar round_tf32")
def test_simulator_round_tf32_gives_the_host_models_bits():
    """The simulator's scalar round_tf32 (plain Python bit arithmetic, for speed) against the
    NumPy model it replaces, bit for bit: random bit patterns (every exponent, NaNs with
    payloads, infinities, subnormals), Python floats, and values past float32's range."""
    import warnings
    from numba_flash.kernels.mma import round_tf32
    rng = np.random.default_rng(0)
    bits = np.concatenate([rng.integers(0, 2 ** 32, 50_000, dtype=np.uint64).astype(np.uint32),
                           np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000,
                                     0x7F800001, 0xFFC00001, 0x7F7FFFFF, 0x7F7FF000, 1, 0xFFF,
                                     0x1000], np.uint32)])
    x = bits.view(np.float32)
    got = np.array([round_tf32(v) for v in x], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), round_tf32_host(x).view(np.uint32))
    floats = [float(v) for v in rng.standard_normal(2000) * 1e3] + [1e39, -1e39, 3.4028236e38]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # NumPy's overflow warning for 1e39
        want = np.array([round_tf32_host(np.float32(v)) for v in floats], np.float32)
        got = np.array([round_tf32(v) for v in floats], np.float32)
        assert all(type(round_tf32(v)) is np.float32 for v in (1.5, np.float32(2.5), 1e39))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@cuda.jit
def split_kernel(x, big, small):
    i = cuda.grid(1)
    if i < x.size:
        big[i], small[i] = split_tf32(x[i])


def split(x):
    big, small = np.zeros_like(x), np.zeros_like(x)
    split_kernel[(x.size + 63) // 64, 64](x, big, small)
    return big, small


def check_split(x):
    big, small = split(x)
    for part in (big, small):
        assert not np.any(part.view(np.uint32) & LOW)
    np.testing.assert_array_equal(big, round_tf32_host(x))
    # x - big has up to 13 significant bits, small keeps 11 of them: big + small is x to
    # 2^-22 relative (half of TF32's last place, 2^-11, of a remainder below 2^-11 |x|)
    err = np.abs(big.astype(np.float64) + small - x)
    assert np.all(err <= np.abs(x.astype(np.float64)) * 2.0 ** -22)
    assert np.any(err > np.abs(x.astype(np.float64)) * 2.0 ** -24)   # the bound is not loose
    assert np.any(small != 0)


def test_split_tf32_keeps_float32_accuracy():
    rng = np.random.default_rng(1)
    check_split((rng.standard_normal(200) * 1e3).astype(np.float32))


def test_split_tf32_special_values():
    """Zeros, subnormals and the largest finite values split to the model's bits (small as
    round_tf32_host(x - big), the sign of a zero included); NaN (NumPy's, the GPU's
    canonical 0x7fffffff and its negation, whose rounding carries into the sign bit) and
    infinities give a NaN small part, so that every product with them is NaN. (x within half a
    TF32 place of float32's largest rounds to inf in both; left out: small is then -inf or
    NaN by implementation.)"""
    bits = np.array([0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00000, 0xFFC00000, 0x7FBFFFFF], np.uint32)
    nonfinite = np.concatenate([bits.view(np.float32), np.float32([np.inf, -np.inf])])
    finite = np.float32([0.0, -0.0, 1e-45, -1e-45, 1e-40, -3e-39, 1.1754944e-38, 1.0,
                         -1.0009766, 3.4e38, -3.4e38, 6e-8, 65504.0, 1 + 2.0 ** -12])
    big, small = split(np.concatenate([finite, nonfinite]))
    n = finite.size
    np.testing.assert_array_equal(big[:n].view(np.uint32), round_tf32_host(finite).view(np.uint32))
    want_small = round_tf32_host((finite - big[:n]).astype(np.float32))
    np.testing.assert_array_equal(small[:n].view(np.uint32), want_small.view(np.uint32))
    assert np.all(np.isnan(small[n:])), small[n:]


@pytest.mark.gpu
def test_gpu_split_tf32_keeps_float32_accuracy():
    rng = np.random.default_rng(2)
    check_split((rng.standard_normal(1 << 16) * 10.0 ** rng.integers(-20, 20, 1 << 16))
                .astype(np.float32))


@pytest.mark.gpu
def test_gpu_mma_tf32_fragment_layout():
    from numba_flash.kernels.mma import mma_tf32

    @cuda.jit
    def one_mma(A, B, C, D):
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        a = (A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4])
        b = (B[t, g], B[t + 4, g])
        c = (C[g, 2 * t], C[g, 2 * t + 1], C[g + 8, 2 * t], C[g + 8, 2 * t + 1])
        d = mma_tf32(a, b, c)
        D[g, 2 * t], D[g, 2 * t + 1] = d[0], d[1]
        D[g + 8, 2 * t], D[g + 8, 2 * t + 1] = d[2], d[3]

    rng = np.random.default_rng(3)
    A = round_tf32_host(rng.standard_normal((16, 8)).astype(np.float32))   # exact in TF32
    B = round_tf32_host(rng.standard_normal((8, 8)).astype(np.float32))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.zeros((16, 8), np.float32)
    one_mma[1, 32](A, B, C, D)
    truth = A.astype(np.float64) @ B + C
    # products of TF32 numbers are exact in float32; only the accumulation rounds
    np.testing.assert_allclose(D, truth, rtol=0, atol=8 * 2.0 ** -24 * np.abs(truth).max())
