"""Tensor-core probe, for a GPU (not a pytest module): mma_tf32's fragment layout, round_tf32
against its NumPy model, the accuracy of 3xTF32 products in three accumulation orders (chained
on the tensor core; each 8-long step from zero, added in float32; the correction products in a
second accumulator) and of plain TF32 against float64 truth, beside NumPy's float32 matmul, and
mma.sync TF32 throughput. What kernels/fa2_mma.py's design rests on:

    python tools/mma_probe.py
"""
import os
import sys
import time

from numba_flash._gpu import require_gpu  # first: numba_flash picks GPU or simulator

require_gpu("tools/mma_probe.py (mma.sync TF32)")

import numpy as np
from numba import cuda, float32
from numba_flash.kernels.mma import mma_tf32, split_tf32, round_tf32, round_tf32_host

# the fragment-layout check is the gpu test's (tests/test_mma.py)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_mma import test_gpu_mma_tf32_fragment_layout  # noqa: E402

@cuda.jit
def round_kernel(x, y):
    i = cuda.grid(1)
    if i < x.size:
        y[i] = round_tf32(x[i])

@cuda.jit
def product_kernel(A, B, D, mode):
    """D (16x8) = A (16xK) B (Kx8) by 3xTF32; mode 0 chained, 1 fresh per k-step, 2 two accumulators, 3 plain tf32."""
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    acc = (float32(0), float32(0), float32(0), float32(0))
    cor = (float32(0), float32(0), float32(0), float32(0))
    zero = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, A.shape[1], 8):
        a0h, a0l = split_tf32(A[g, k0 + t]); a1h, a1l = split_tf32(A[g + 8, k0 + t])
        a2h, a2l = split_tf32(A[g, k0 + t + 4]); a3h, a3l = split_tf32(A[g + 8, k0 + t + 4])
        b0h, b0l = split_tf32(B[k0 + t, g]); b1h, b1l = split_tf32(B[k0 + t + 4, g])
        ah = (a0h, a1h, a2h, a3h); al = (a0l, a1l, a2l, a3l); bh = (b0h, b1h); bl = (b0l, b1l)
        if mode == 0:
            acc = mma_tf32(al, bh, acc); acc = mma_tf32(ah, bl, acc); acc = mma_tf32(ah, bh, acc)
        elif mode == 1:
            tmp = mma_tf32(al, bh, zero); tmp = mma_tf32(ah, bl, tmp); tmp = mma_tf32(ah, bh, tmp)
            acc = (acc[0] + tmp[0], acc[1] + tmp[1], acc[2] + tmp[2], acc[3] + tmp[3])
        elif mode == 2:
            cor = mma_tf32(al, bh, cor); cor = mma_tf32(ah, bl, cor); acc = mma_tf32(ah, bh, acc)
        else:
            acc = mma_tf32(ah, bh, acc)
    acc = (acc[0] + cor[0], acc[1] + cor[1], acc[2] + cor[2], acc[3] + cor[3])
    D[g, 2 * t] = acc[0]; D[g, 2 * t + 1] = acc[1]; D[g + 8, 2 * t] = acc[2]; D[g + 8, 2 * t + 1] = acc[3]

@cuda.jit
def throughput_kernel(x, reps, out):
    a = (x[0], x[1], x[2], x[3]); b = (x[4], x[5])
    c0 = (float32(0), float32(0), float32(0), float32(0)); c1 = c0; c2 = c0; c3 = c0
    for r in range(reps):
        c0 = mma_tf32(a, b, c0); c1 = mma_tf32(a, b, c1); c2 = mma_tf32(a, b, c2); c3 = mma_tf32(a, b, c3)
    s = c0[0] + c1[1] + c2[2] + c3[3]
    if s == 12345.0:
        out[0] = s

rng = np.random.default_rng(0)
# 1. layout (the gpu test's check: D = A B + C with TF32-exact A, B, to float32 accumulation)
test_gpu_mma_tf32_fragment_layout()
print("layout: mma_tf32 fragments as documented")
D = cuda.device_array((16, 8), np.float32)
# 2. rounding matches host model
x = rng.standard_normal(1 << 20).astype(np.float32) * np.float32(1e3)
x[:4] = [0.0, -0.0, 1.0000001, 3.4e38]
y = cuda.device_array_like(x)
round_kernel[(x.size + 255) // 256, 256](x, y)
print("round_tf32 == host model:", np.array_equal(y.copy_to_host().view(np.uint32), round_tf32_host(x).view(np.uint32)))
# 3. accuracy
u = 2.0 ** -24
for K in (64, 128):
    for regime in ("normal", "positive", "dominant", "offset"):
        worst = np.zeros(5)
        for trial in range(20):
            if regime == "normal":
                A = rng.standard_normal((16, K)); B = rng.standard_normal((K, 8))
            elif regime == "positive":
                A = rng.uniform(0, 1, (16, K)); B = rng.uniform(0, 1, (K, 8))
            elif regime == "dominant":
                A = rng.standard_normal((16, K)) * 0.1; B = rng.standard_normal((K, 8)) * 0.1
                A[:, 3] = 1e3; B[3, :] = 1.0
            else:
                A = rng.standard_normal((16, K)) + 30; B = rng.standard_normal((K, 8))
            A = A.astype(np.float32); B = B.astype(np.float32)
            truth = A.astype(np.float64) @ B.astype(np.float64)
            scale = np.abs(A.astype(np.float64)) @ np.abs(B.astype(np.float64))
            errs = []
            for mode in range(4):
                product_kernel[1, 32](A, B, D, mode)
                errs.append((np.abs(D.copy_to_host() - truth) / scale).max() / u)
            errs.append((np.abs((A @ B) - truth) / scale).max() / u)
            worst = np.maximum(worst, errs)
        print(f"K={K} {regime:9s} max err / (u sum|ab|): chained {worst[0]:.2f} fresh {worst[1]:.2f} two-acc {worst[2]:.2f} tf32 {worst[3]:.0f} numpy-f32 {worst[4]:.2f}")
# 4. throughput
xs = cuda.to_device(np.ones(8, np.float32)); out = cuda.device_array(1, np.float32)
sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
for warps in (4, 8, 16):
    reps = 4096
    throughput_kernel[sms * 4, 32 * warps](xs, reps, out); cuda.synchronize()
    t0 = time.perf_counter(); throughput_kernel[sms * 4, 32 * warps](xs, reps, out); cuda.synchronize(); dt = time.perf_counter() - t0
    flops = sms * 4 * warps * reps * 4 * 2 * 16 * 8 * 8
    print(f"mma.sync tf32 m16n8k8, {warps} warps/block, {sms*4} blocks: {flops / dt / 1e12:.0f} TFLOP/s")
