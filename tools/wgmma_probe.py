"""Hopper wgmma probe, for a GPU (not a pytest module): can a Numba kernel issue
`wgmma.mma_async.m64nNk8.f32.tf32.tf32` (sm_90a; numba-cuda compiles for sm_90a on a CC 9.0
device) with both operands in shared memory, which shared-memory layout and descriptor fields
give the right product, and how fast it runs beside mma.sync (280-309 TFLOP/s, tools/mma_probe.py).
What a wgmma version of the fa2 kernels would rest on:

    python tools/wgmma_probe.py

Operands are K-major (the only layout wgmma takes for tf32 from shared memory): A is M x K and
B is stored as N x K, each as "core matrices" of 8 rows x 16 bytes (8 x 4 tf32), a core
matrix's rows contiguous, without swizzling. A descriptor holds the start address, LBO and SBO
(bytes >> 4; PTX ISA "Matrix Descriptor"), read here as LBO the distance between core matrices
adjacent along K and SBO along M (or N). Two placements of the core matrices are tried, with the
fields set by that reading: K-neighbours next to each other (LBO = 128, SBO = 256) and
M-neighbours next to each other (LBO = 128 * M / 8, SBO = 128).

On an H200 (2026-11-29 23:42 UTC, numba-cuda 0.30.4): both placements give A B^T to 8e-7 on
TF32-rounded normal inputs (|A B^T| up to 14) at N = 8, 64 and 128, so that reading holds; the
SASS has HGMMA.64x128x8.F32.TF32 with gdesc operands; throughput 407 TFLOP/s with one warpgroup
per SM (m64n128k8, 8 per commit and wait), 464-467 with two, 443-446 with two at m64n64k8,
against 280-309 for mma.sync m16n8k8 (mma_probe.py). One wgmma does the work of 64 mma.sync of a
warpgroup's 4 warps and reads its operands from shared memory itself. A from registers (each
warp's 16 rows as the mma.m16n8k8 A fragment) gives the same products (23:45 UTC). 3xTF32 with A
and B split once into big and small parts in shared memory, 10 draws each, max error in units of
roundoff of sum |ab| (M = 64, N = 16): each 8-long step from zero and added in float32 2.2-2.3
(normal) and 3.5-3.9 (all positive) at K = 32 and 64; the steps chained in the accumulator 5.3-8.1
and 11-19, growing with K; NumPy float32 1.2-2.6. So, as with mma.sync, each step is summed from
zero and added outside the tensor core. (shared_address and fence_proxy_async were defined here
for those runs and have since moved, unchanged, to numba_flash/kernels/sm90/wgmma.py.)
"""
import time

from numba_flash._gpu import require_gpu  # first: numba_flash picks GPU or simulator

require_gpu("tools/wgmma_probe.py (wgmma, sm_90a)")

import numpy as np
from llvmlite import ir
from numba import cuda, types, uint32, uint64
from numba.cuda.extending import intrinsic

from numba_flash.kernels.mma import round_tf32_host, split_tf32
from numba_flash.kernels.sm90.wgmma import core_offset, fence_proxy_async, shared_address


def _wgmma_intrinsic(n, chain, a_in_registers=False):
    """wgmma m64n{n}k8 tf32, `chain` times on the same accumulators, then commit and wait; A
    from a shared-memory descriptor (u64) or, with a_in_registers, from a tuple of 4 float32
    per thread (the mma.m16n8k8 A fragment of the thread's warp's 16 rows)."""
    regs = n // 2
    outs = ", ".join(f"${i}" for i in range(regs))
    a_operand = (f"{{${regs}, ${regs + 1}, ${regs + 2}, ${regs + 3}}}" if a_in_registers
                 else f"${regs}")
    b_at = regs + (4 if a_in_registers else 1)
    lines = ["{", ".reg .pred p;", f"setp.ne.b32 p, ${b_at + 1}, 0;", "wgmma.fence.sync.aligned;"]
    for c in range(chain):
        scale = "p" if c == 0 else "1"
        lines.append(f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 "
                     f"{{{outs}}}, {a_operand}, ${b_at}, {scale}, 1, 1;")
    lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
    text = "\n".join(lines)
    a_constraints = ["r"] * 4 if a_in_registers else ["l"]
    constraints = ",".join(["=f"] * regs + a_constraints + ["l", "r"]
                           + [str(i) for i in range(regs)])
    a_types = [ir.IntType(32)] * 4 if a_in_registers else [ir.IntType(64)]

    result = types.UniTuple(types.float32, regs)

    def emit(context, builder, acc_in, a, desc_b, accumulate):
        f32 = ir.FloatType()
        fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                             a_types + [ir.IntType(64), ir.IntType(32)] + [f32] * regs)
        asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
        if a_in_registers:
            a = [builder.bitcast(builder.extract_value(a, i), ir.IntType(32)) for i in range(4)]
        else:
            a = [a]
        res = builder.call(asm, a + [desc_b, accumulate] + acc_in)
        return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                    for i in range(regs)])

    @intrinsic
    def wgmma(typingctx, acc, desc_a, desc_b, accumulate):
        """acc (a tuple of n / 2 float32) += A B^T, or = A B^T where accumulate is 0."""
        if acc != result:
            return None

        def codegen(context, builder, sig, args):
            acc_in = [builder.extract_value(args[0], i) for i in range(regs)]
            return emit(context, builder, acc_in, args[1], args[2], args[3])
        return result(acc, desc_a, desc_b, accumulate), codegen

    @intrinsic
    def wgmma_first(typingctx, desc_a, desc_b):
        """A B^T into a fresh tuple of n / 2 float32."""
        def codegen(context, builder, sig, args):
            zero = ir.Constant(ir.FloatType(), 0.0)
            return emit(context, builder, [zero] * regs, args[0], args[1],
                        ir.Constant(ir.IntType(32), 0))
        return result(desc_a, desc_b), codegen
    return wgmma, wgmma_first


def descriptor_fields(rows, mode):
    """(LBO, SBO) in bytes and the byte offsets of the next core matrix along rows and along K
    for a rows x 8 K-major tile; mode 0 puts K-neighbours next to each other."""
    if mode == 0:
        return 128, 256, 256, 128
    return 128 * (rows // 8), 128, 128, 128 * (rows // 8)


@cuda.jit(device=True)
def desc(addr, lbo, sbo):
    """A shared-memory matrix descriptor: start address, LBO and SBO in bytes (>> 4 each)."""
    return (uint64((addr & 0x3FFFF) >> 4) | (uint64(lbo >> 4) << 16)
            | (uint64(sbo >> 4) << 32))


def make_product_kernel(n, mode):
    _, wgmma_first = _wgmma_intrinsic(n, 1)
    lbo_a, sbo_a, ra, ka = descriptor_fields(64, mode)
    lbo_b, sbo_b, rb, kb = descriptor_fields(n, mode)
    regs = n // 2
    A_FLOATS = 64 * 8

    @cuda.jit
    def product(A, B, D):
        """D (64 x n) = A (64 x 8) B^T (B: n x 8), one warpgroup."""
        sm = cuda.shared.array(64 * 8 + 128 * 8, types.float32, alignment=128)
        tid = cuda.threadIdx.x
        for i in range(tid, 64 * 8, 128):
            r, k = i // 8, i % 8
            sm[((r // 8) * ra + (k // 4) * ka + (r % 8) * 16 + (k % 4) * 4) // 4] = A[r, k]
        for i in range(tid, n * 8, 128):
            r, k = i // 8, i % 8
            sm[A_FLOATS + ((r // 8) * rb + (k // 4) * kb + (r % 8) * 16 + (k % 4) * 4) // 4] = B[r, k]
        fence_proxy_async()
        cuda.syncthreads()
        base = shared_address(sm)
        acc = wgmma_first(desc(base, lbo_a, sbo_a),
                          desc(base + uint32(4 * A_FLOATS), lbo_b, sbo_b))
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        for j in range(regs):
            row = warp * 16 + g + 8 * ((j % 4) // 2)
            col = (j // 4) * 8 + 2 * t + j % 2
            D[row, col] = acc[j]
    return product


def make_register_a_kernel(n):
    """As make_product_kernel (placement 0), A from registers: each thread loads the mma.m16n8k8
    A fragment of its warp's 16 rows."""
    _, first = _wgmma_intrinsic(n, 1, a_in_registers=True)
    lbo_b, sbo_b, rb, kb = descriptor_fields(n, 0)
    regs = n // 2

    @cuda.jit
    def product(A, B, D):
        sm = cuda.shared.array(128 * 8, types.float32, alignment=128)
        tid = cuda.threadIdx.x
        for i in range(tid, n * 8, 128):
            r, k = i // 8, i % 8
            sm[((r // 8) * rb + (k // 4) * kb + (r % 8) * 16 + (k % 4) * 4) // 4] = B[r, k]
        fence_proxy_async()
        cuda.syncthreads()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        r0 = warp * 16 + g
        a = (A[r0, t], A[r0 + 8, t], A[r0, t + 4], A[r0 + 8, t + 4])
        base = shared_address(sm)
        desc_b = (uint64((base & 0x3FFFF) >> 4) | (uint64(lbo_b >> 4) << 16)
                  | (uint64(sbo_b >> 4) << 32))
        acc = first(a, desc_b)
        for j in range(regs):
            D[warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2] = acc[j]
    return product


def make_accuracy_kernel(n, K, chained):
    """D (64 x n) = A (64 x K) B^T (B: n x K) by 3xTF32 on wgmma: A and B split once into big and
    small TF32 parts in shared memory (placement 0, K / 4 core matrices along K); each 8-long
    step as small*big + big*small + big*big on the tensor core, then either added into a float32
    running sum (each step from zero, as fa2_mma does) or, chained, left in the accumulator."""
    wgmma, first = _wgmma_intrinsic(n, 1)
    regs = n // 2
    KC = K // 4                                    # core matrices along K
    A_F, B_F = 64 * K, n * K                       # floats per part
    SBO_A = SBO_B = 128 * KC

    @cuda.jit(device=True)
    def offset(r, k):
        return core_offset(r, k, K)

    @cuda.jit
    def product(A, B, D):
        sm = cuda.shared.array(2 * (64 * 64 + 16 * 64), types.float32, alignment=128)
        tid = cuda.threadIdx.x
        for i in range(tid, A_F, 128):
            big, small = split_tf32(A[i // K, i % K])
            sm[offset(i // K, i % K)] = big
            sm[A_F + offset(i // K, i % K)] = small
        for i in range(tid, B_F, 128):
            big, small = split_tf32(B[i // K, i % K])
            sm[2 * A_F + offset(i // K, i % K)] = big
            sm[2 * A_F + B_F + offset(i // K, i % K)] = small
        fence_proxy_async()
        cuda.syncthreads()
        base = shared_address(sm)
        total = cuda.local.array(64, types.float32)
        for j in range(regs):
            total[j] = types.float32(0.0)
        acc = first(desc(base + uint32(4 * A_F), 128, SBO_A), desc(base + uint32(8 * A_F), 128, SBO_B))
        for s in range(K // 8):
            step = uint32(256 * s)                 # two core matrices along K per step
            a_big = desc(base + step, 128, SBO_A)
            a_small = desc(base + uint32(4 * A_F) + step, 128, SBO_A)
            b_big = desc(base + uint32(8 * A_F) + step, 128, SBO_B)
            b_small = desc(base + uint32(8 * A_F + 4 * B_F) + step, 128, SBO_B)
            if chained:
                if s > 0:
                    acc = wgmma(acc, a_small, b_big, uint32(1))
            else:
                acc = first(a_small, b_big)
            acc = wgmma(acc, a_big, b_small, uint32(1))
            acc = wgmma(acc, a_big, b_big, uint32(1))
            if not chained:
                for j in range(regs):
                    total[j] += acc[j]
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        for j in range(regs):
            D[warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2] = (
                acc[j] if chained else total[j])
    return product


def make_throughput_kernel(n, chain):
    wgmma, wgmma_first = _wgmma_intrinsic(n, chain)
    regs = n // 2

    @cuda.jit
    def spin(out, iters):
        sm = cuda.shared.array(64 * 8 + 256 * 8, types.float32, alignment=128)
        tid = cuda.threadIdx.x
        for i in range(tid, sm.size, cuda.blockDim.x):
            sm[i] = types.float32(1.0 / (1 + i % 7))
        fence_proxy_async()
        cuda.syncthreads()
        base = shared_address(sm)
        da = uint64((base & 0x3FFFF) >> 4) | (uint64(8) << 16) | (uint64(16) << 32)
        db = uint64(((base + uint32(2048)) & 0x3FFFF) >> 4) | (uint64(8) << 16) | (uint64(16) << 32)
        acc = wgmma_first(da, db)
        for it in range(1, iters):
            acc = wgmma(acc, da, db, uint32(1))
        s = types.float32(0.0)
        for j in range(regs):
            s += acc[j]
        out[cuda.blockIdx.x * cuda.blockDim.x + tid] = s
    return spin


def main():
    rng = np.random.default_rng(0)
    for n in (8, 64, 128):
        A = round_tf32_host(rng.standard_normal((64, 8)).astype(np.float32))
        B = round_tf32_host(rng.standard_normal((n, 8)).astype(np.float32))
        truth = A.astype(np.float64) @ B.astype(np.float64).T
        for mode in (0, 1):
            D = cuda.to_device(np.full((64, n), np.nan, np.float32))
            make_product_kernel(n, mode)[1, 128](cuda.to_device(A), cuda.to_device(B), D)
            err = np.nanmax(np.abs(D.copy_to_host() - truth)) if not np.isnan(D.copy_to_host()).all() else np.nan
            print(f"m64n{n}k8 layout {mode} (LBO, SBO) = {descriptor_fields(64, mode)[:2]} for A: "
                  f"max |D - A B^T| = {err:.3g} (|A B^T| up to {np.abs(truth).max():.3g})",
                  flush=True)
    for n in (8, 64):
        A = round_tf32_host(rng.standard_normal((64, 8)).astype(np.float32))
        B = round_tf32_host(rng.standard_normal((n, 8)).astype(np.float32))
        truth = A.astype(np.float64) @ B.astype(np.float64).T
        D = cuda.to_device(np.full((64, n), np.nan, np.float32))
        make_register_a_kernel(n)[1, 128](cuda.to_device(A), cuda.to_device(B), D)
        print(f"m64n{n}k8, A from registers: max |D - A B^T| = "
              f"{np.max(np.abs(D.copy_to_host() - truth)):.3g}", flush=True)
    u = 2.0 ** -24
    n = 16
    for K in (32, 64):
        for regime in ("normal", "positive"):
            worst = {}
            for trial in range(10):
                A = rng.standard_normal((64, K)); B = rng.standard_normal((n, K))
                if regime == "positive":
                    A, B = np.abs(A), np.abs(B)
                A, B = A.astype(np.float32), B.astype(np.float32)
                truth = A.astype(np.float64) @ B.astype(np.float64).T
                scale = u * (np.abs(A).astype(np.float64) @ np.abs(B).astype(np.float64).T)
                for chained in (False, True):
                    D = cuda.to_device(np.zeros((64, n), np.float32))
                    make_accuracy_kernel(n, K, chained)[1, 128](cuda.to_device(A),
                                                                cuda.to_device(B), D)
                    err = np.max(np.abs(D.copy_to_host() - truth) / scale)
                    worst[chained] = max(worst.get(chained, 0), err)
                err = np.max(np.abs((A @ B.T).astype(np.float64) - truth) / scale)
                worst["numpy"] = max(worst.get("numpy", 0), err)
            print(f"3xTF32 on wgmma, K = {K}, {regime}: max error / (u sum|ab|): steps from zero "
                  f"{worst[False]:.2f}, chained {worst[True]:.2f}, NumPy float32 "
                  f"{worst['numpy']:.2f}", flush=True)
    # does the tensor core give S = Q K^T and S^T = K Q^T the same bits? (the backward could
    # then form S^T where the forward formed S; perf notes, version 12)
    K = 32
    A = rng.standard_normal((64, K)).astype(np.float32)
    B = rng.standard_normal((64, K)).astype(np.float32)
    kern = make_accuracy_kernel(64, K, False)
    D1, D2 = (cuda.to_device(np.zeros((64, 64), np.float32)) for _ in range(2))
    kern[1, 128](cuda.to_device(A), cuda.to_device(B), D1)
    kern[1, 128](cuda.to_device(B), cuda.to_device(A), D2)
    D1, D2 = D1.copy_to_host(), D2.copy_to_host()
    print(f"3xTF32 on wgmma, A B^T against (B A^T)^T: bitwise equal {np.array_equal(D1, D2.T)}, "
          f"{int(np.sum(D1 != D2.T))} of {D1.size} entries differ", flush=True)
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    for n, chain, warpgroups in ((128, 8, 1), (128, 8, 2), (64, 8, 2)):
        kern = make_throughput_kernel(n, chain)
        threads = 128 * warpgroups
        out = cuda.device_array(sms * threads, np.float32)
        kern[sms, threads](out, 10)
        cuda.synchronize()
        iters = 4000
        t0 = time.perf_counter()
        kern[sms, threads](out, iters)
        cuda.synchronize()
        dt = time.perf_counter() - t0
        flops = 2.0 * 64 * n * 8 * chain * iters * sms * warpgroups
        print(f"wgmma m64n{n}k8 tf32, {chain} per wait, {warpgroups} warpgroup(s) per SM: "
              f"{flops / dt / 1e12:.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
