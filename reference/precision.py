"""Products on tensor cores in float32 precision, as NumPy models: TF32 rounding, the 3xTF32
split and a 3xTF32 matrix product (what numba_flash/kernels/fa2_mma.py computes); and the two
half formats' rounding (float16: 10 mantissa bits, largest finite 65504; bfloat16: 7 mantissa
bits, float32's range), which the half-precision models of reference/half.py use.

TF32 keeps 10 of float32's 23 mantissa bits (float32's range). A product of two TF32 numbers is
exact in float32, so tensor cores multiply TF32 inputs exactly; rounding the inputs is the error
(~2^-11 relative each). Splitting x = big + small with big = tf32(x), small = tf32(x - big) keeps
x to 2^-22 relative, and a b ~ big_a big_b + big_a small_b + small_a big_b (small_a small_b is
below 2^-22 |a b|) makes a float32-accurate product from three TF32 ones ("3xTF32").
"""

import numpy as np

HALF_FORMATS = ("float16", "bfloat16")
HALF_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
HALF_UNIT_ROUNDOFF = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}   # half a unit in the last place


def half_format(dtype):
    """"float16" or "bfloat16" for a half dtype (NumPy's float16, ml_dtypes' bfloat16), else
    None."""
    try:
        return _half_formats[dtype]
    except (KeyError, TypeError):       # (TypeError: an unhashable description of a dtype)
        pass
    name = np.dtype(dtype).name         # (a dtype's name is made in Python at every read)
    found = name if name in HALF_FORMATS else None
    if isinstance(dtype, np.dtype):
        _half_formats[dtype] = found
    return found


_half_formats = {}      # np.dtype -> half_format's answer (the API asks a few times a call)


TF32_DROPPED_BITS = 13      # float32's low mantissa bits that TF32 drops
TF32_STEP = 8               # the contraction length of one mma.m16n8k8 TF32


def round_tf32(x):
    """float32 array x rounded to TF32 (nearest, ties away from zero, as cvt.rna.tf32.f32):
    add half of the dropped part's weight to the magnitude bits, then clear them. inf and NaN
    are returned unchanged."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    half = np.uint32(1 << (TF32_DROPPED_BITS - 1))
    mask = np.uint32(~((1 << TF32_DROPPED_BITS) - 1) & 0xFFFFFFFF)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    rounded = np.where(finite, (bits + half) & mask, bits)
    return rounded.astype(np.uint32).view(np.float32)


def split_tf32(x):
    """(big, small), both TF32 values in float32 arrays: big = round_tf32(x), small =
    round_tf32(x - big); |x - big - small| <= 2^-22 |x|."""
    x = np.asarray(x, dtype=np.float32)
    big = round_tf32(x)
    return big, round_tf32(x - big)


def step_3xtf32(w, x):
    """One contraction step (last axis of w and x, TF32_STEP long or shorter) as the tensor core
    forms it from the split inputs: big_w big_x + big_w small_x + small_w big_x, the products
    exact, summed in float64 and rounded once to float32 (an idealized tensor core: the real one
    truncates while it adds, so it can be a few units of roundoff off this)."""
    return step_3xtf32_parts(*split_tf32(w), *split_tf32(x))


def step_3xtf32_exact(w_big, w_small, x_big, x_small):
    """big_w big_x + big_w small_x + small_w big_x over the last axis of inputs already split
    (TF32 values in float32 arrays), the products exact, summed in float64, not rounded: what
    step_3xtf32_parts rounds once, and what a model of steps chained in the tensor core adds up
    before rounding once (numba_flash/kernels/wgmma.py)."""
    wb = np.asarray(w_big, dtype=np.float64)
    exact = wb * x_big + wb * x_small + np.asarray(w_small, dtype=np.float64) * x_big
    return exact.sum(axis=-1)


def step_3xtf32_parts(w_big, w_small, x_big, x_small):
    """step_3xtf32 of inputs already split (TF32 values in float32 arrays, as a kernel stages
    them once): step_3xtf32_exact rounded once to float32."""
    return step_3xtf32_exact(w_big, w_small, x_big, x_small).astype(np.float32)


def matmul_3xtf32(a, b, step=TF32_STEP):
    """a @ b for float32 a (M, K) and b (K, N) as fa2_mma.accumulate computes it: each step of
    `step` contraction indices by step_3xtf32, from zero, then added into a float32 accumulator
    in ascending order. Returns float32 (M, N)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k in range(0, a.shape[1], step):
        acc += step_3xtf32(a[:, None, k:k + step], b[k:k + step, :].T[None, :, :])
    return acc


def matmul_fma_order(a, b):
    """a @ b for float32 a (M, K) and b (K, N) in the order of the fa2 kernels' dot products (S =
    Q K^T, dP = dO V^T): one float32 FMA per term, contraction index ascending. Each FMA is
    emulated as the exact product (48 bits, exact in float64) added in float64, then rounded to
    float32: that is a true FMA except where the float64 sum lands exactly on a float32 tie
    (double rounding; rare). Returns float32 (M, N)."""
    a = np.asarray(a, dtype=np.float32)
    b = np.asarray(b, dtype=np.float32)
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for c in range(a.shape[1]):
        acc = (acc + np.outer(a[:, c].astype(np.float64), b[c])).astype(np.float32)
    return acc


def round_half(x, fmt):
    """float32 array x rounded to the half format `fmt` ("float16" or "bfloat16"), to nearest
    with ties to even (as cvt.rn.f16.f32 / cvt.rn.bf16.f32 and torch's .to(dtype) round),
    returned as float32 holding the rounded values. float16: values past 65504 become +-inf
    (NumPy's float16 cast); bfloat16: the low 16 bits of float32 rounded off in integer
    arithmetic (float32's range; only values within half a unit of float32's largest round up
    to inf). inf and NaN stay."""
    if fmt not in HALF_FORMATS:
        raise ValueError(f"fmt must be one of {HALF_FORMATS}, got {fmt!r}")
    x = np.asarray(x, dtype=np.float32)
    if fmt == "float16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32)
    # round to nearest even: add 0x7FFF plus the lowest kept bit, then clear the low 16 bits
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)
    finite = (bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)
    return np.where(finite, rounded, bits).astype(np.uint32).view(np.float32)
