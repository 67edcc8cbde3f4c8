"""Hopper warpgroup products (wgmma, sm_90a) for Numba kernels: TF32 operands in shared memory,
float32 accuracy by the 3xTF32 split, one warpgroup (4 consecutive warps, 128 threads, the
first warp's index a multiple of 4) per product. Not used by a registered kernel yet: the
building block of the next backward (notebooks/data/perf-notes.md, version 12).

Layout. wgmma reads TF32 operands from shared memory only K-major, as "core matrices" of 8 rows
x 16 bytes (8 x 4 TF32). Here a rows x K tile puts each core matrix's rows next to each other
and K-neighbouring core matrices next to each other (no swizzling): element (r, k) sits at
`core_offset(r, k, K)` floats,

    ((r // 8) * (K // 4) + k // 4) * 32 + (r % 8) * 4 + k % 4,

and its descriptor has LBO = 128 bytes (the next core matrix along K) and SBO = 32 K bytes
(the next 8 rows); a step of 8 along K starts 64 floats further. A kernel stages each operand
once as two such tiles, its big and small TF32 parts (mma.split_tf32), so that no product
loads or splits it again.

    step_3xtf32(sm, a_big, a_small, b_big, b_small, s)  (from `products(n, KA, KB)`)
        the warpgroup's 64 x n block of A[:, 8s:8s+8] B[:, 8s:8s+8]^T as small_a big_b +
        big_a small_b + big_a big_b, summed on the tensor core from zero: a tuple of n / 2
        float32 per thread, entry j at `position(j, warp, lane)` (warp = the warp's index in
        its warpgroup). A is 64 x KA, B is n x KB, both in the layout above, at the given
        float offsets into the shared array sm (multiples of 32). Kernels add the steps in
        float32 themselves: letting the tensor core chain them costs accuracy (below).

On an H200 (2026-11-29, tests/wgmma_probe.py): the layout and descriptor fields give A B^T
exactly on TF32 inputs; wgmma m64n128k8 TF32 runs 407-467 TFLOP/s (mma.sync m16n8k8 280-309);
3xTF32 with each step from zero errs 2.2-3.9 units of roundoff of sum |ab| at K = 32 / 64 (NumPy
float32 1.2-2.6), chained in the accumulator 5.3-19.

On the simulator (no warpgroup-wide instructions) each thread computes its own entries from the
shared array with reference.precision.step_3xtf32_parts, the same model as fa2_mma's.

Status (2026-11-29): the probe's intrinsics, moved here; what is new here, the three products of
a step in one fence / commit / wait block and the descriptors' step offsets, assembles for
sm_90a to HGMMA (ptxas) and matches the model on the simulator, but has not run on a GPU yet:
tests/test_wgmma.py's gpu tests are the check to run first.
"""

import functools

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from reference.precision import step_3xtf32_parts

from .common import SIMULATOR

STEP = 8           # contraction per wgmma for TF32 (K)
CORE = 32          # floats per core matrix (8 rows x 4)
WARPGROUP = 128    # threads


def core_offset_host(r, k, K):
    """core_offset in NumPy (r, k arrays of indices; K the tile's contraction length)."""
    r, k = np.asarray(r), np.asarray(k)
    return ((r // 8) * (K // 4) + k // 4) * CORE + (r % 8) * 4 + k % 4


@cuda.jit(device=True)
def core_offset(r, k, K):
    """Float offset of element (r, k) of a K-major tile with K columns (see the module)."""
    return ((r // 8) * (K // 4) + k // 4) * CORE + (r % 8) * 4 + k % 4


@cuda.jit(device=True)
def position(j, warp, lane):
    """(row, column) in the 64 x n block of accumulator entry j of thread `lane` of warp `warp`
    (0-3 within the warpgroup): rows g and g + 8 of the warp's 16, columns 2t and 2t + 1 of
    each 8-column group, as mma.m16n8k8's C fragment."""
    g, t = lane // 4, lane % 4
    return warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2


@cuda.jit(device=True)
def a_fragment_index(e, warp, lane):
    """(row, k) in the 64 x 8 A operand of a step of entry e (0-3) of the register A fragment
    that thread `lane` of warp `warp` passes: rows g and g + 8 of the warp's 16, k = t for
    e = 0, 1 and t + 4 for e = 2, 3 (mma.m16n8k8's A fragment)."""
    g, t = lane // 4, lane % 4
    return warp * 16 + g + 8 * (e % 2), t + 4 * (e // 2)


SCRATCH = 2 * 64 * STEP   # floats of shared memory step_3xtf32_regs needs on the simulator


if SIMULATOR:
    @cuda.jit(device=True)
    def fence_proxy_async():
        """Nothing to fence on the simulator (its products read the shared array directly)."""
        pass
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def _shared_address_codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        generic = builder.ptrtoint(ary.data, ir.IntType(64))
        asm = ir.InlineAsm(ir.FunctionType(ir.IntType(64), [ir.IntType(64)]),
                           "cvta.to.shared.u64 $0, $1;", "=l,l")
        return builder.trunc(builder.call(asm, [generic]), ir.IntType(32))

    @intrinsic
    def shared_address(typingctx, arr):
        """The shared-window byte address (u32) of a shared array's first element."""
        return types.uint32(arr), _shared_address_codegen

    @intrinsic
    def fence_proxy_async(typingctx):
        """Make this thread's shared-memory writes visible to wgmma (the async proxy); then a
        block barrier, then the wgmma."""
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []),
                               "fence.proxy.async.shared::cta;", "", side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()
        return types.void(), codegen

    def _three_step_intrinsic(n):
        """wgmma m64n{n}k8 TF32 three times into fresh accumulators (the first with scale-d
        false), then commit and wait: (a1 b1 + a2 b2 + a3 b3) for six descriptors."""
        regs = n // 2
        outs = ", ".join(f"${i}" for i in range(regs))
        mma = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{outs}}}"
        text = "\n".join([
            "{", ".reg .pred p;", f"setp.ne.b32 p, ${regs + 6}, 0;", "wgmma.fence.sync.aligned;",
            f"{mma}, ${regs}, ${regs + 1}, p, 1, 1;",
            f"{mma}, ${regs + 2}, ${regs + 3}, 1, 1, 1;",
            f"{mma}, ${regs + 4}, ${regs + 5}, 1, 1, 1;",
            "wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"])
        constraints = ",".join(["=f"] * regs + ["l"] * 6 + ["r"]
                               + [str(i) for i in range(regs)])
        result = types.UniTuple(types.float32, regs)

        @intrinsic
        def three_steps(typingctx, d1, e1, d2, e2, d3, e3):
            def codegen(context, builder, sig, args):
                f32 = ir.FloatType()
                fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                                     [ir.IntType(64)] * 6 + [ir.IntType(32)] + [f32] * regs)
                asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
                zero = ir.Constant(f32, 0.0)
                res = builder.call(asm, list(args) + [ir.Constant(ir.IntType(32), 0)]
                                   + [zero] * regs)
                return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                            for i in range(regs)])
            return result(d1, e1, d2, e2, d3, e3), codegen
        return three_steps

    def _three_step_regs_intrinsic(n):
        """As _three_step_intrinsic with A from registers: wgmma m64n{n}k8 TF32 of (a_small,
        b_big), (a_big, b_small), (a_big, b_big) into fresh accumulators, then commit and wait;
        a_big, a_small are tuples of 4 float32 (the mma.m16n8k8 A fragment of the thread's warp's
        16 rows), b_big, b_small descriptors."""
        regs = n // 2
        outs = ", ".join(f"${i}" for i in range(regs))
        mma = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {{{outs}}}"
        big = "{" + ", ".join(f"${regs + i}" for i in range(4)) + "}"
        small = "{" + ", ".join(f"${regs + 4 + i}" for i in range(4)) + "}"
        bb, bs, pred = f"${regs + 8}", f"${regs + 9}", f"${regs + 10}"
        text = "\n".join([
            "{", ".reg .pred p;", f"setp.ne.b32 p, {pred}, 0;", "wgmma.fence.sync.aligned;",
            f"{mma}, {small}, {bb}, p, 1, 1;",
            f"{mma}, {big}, {bs}, 1, 1, 1;",
            f"{mma}, {big}, {bb}, 1, 1, 1;",
            "wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"])
        constraints = ",".join(["=f"] * regs + ["r"] * 8 + ["l"] * 2 + ["r"]
                               + [str(i) for i in range(regs)])
        result = types.UniTuple(types.float32, regs)
        quad = types.UniTuple(types.float32, 4)

        @intrinsic
        def three_steps_regs(typingctx, a_big, a_small, b_big, b_small):
            if a_big != quad or a_small != quad:
                return None

            def codegen(context, builder, sig, args):
                f32, i32 = ir.FloatType(), ir.IntType(32)
                fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                                     [i32] * 8 + [ir.IntType(64)] * 2 + [i32] + [f32] * regs)
                asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
                a = [builder.bitcast(builder.extract_value(args[x], i), i32)
                     for x in (0, 1) for i in range(4)]
                zero = ir.Constant(f32, 0.0)
                res = builder.call(asm, a + [args[2], args[3], ir.Constant(i32, 0)]
                                   + [zero] * regs)
                return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                            for i in range(regs)])
            return result(a_big, a_small, b_big, b_small), codegen
        return three_steps_regs


@functools.lru_cache(maxsize=None)
def products(n, KA, KB):
    """dict(step_3xtf32=..., regs=n // 2) for a 64 x n block, A 64 x KA and B n x KB (see the
    module); ValueError unless n is 8..256 in steps of 8 and KA, KB multiples of 8."""
    if n % 8 or not 8 <= n <= 256 or KA % STEP or KB % STEP:
        raise ValueError(f"wgmma products need n in 8..256 in steps of 8 and contraction "
                         f"lengths multiples of {STEP}, got n={n}, {KA}, {KB}")
    regs = n // 2
    if SIMULATOR:
        # index arrays (regs x 8) of each thread's entries, vectorized: one NumPy model call
        # per step and thread (the simulator runs 128 Python threads)
        def entries(warp, lane):
            g, t = lane // 4, lane % 4
            j = np.arange(regs)
            return warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2

        @cuda.jit(device=True)
        def step_3xtf32(sm, a_big, a_small, b_big, b_small, s):
            r, c = entries((cuda.threadIdx.x % WARPGROUP) // 32, cuda.threadIdx.x % 32)
            k = STEP * s + np.arange(STEP)
            ka = core_offset_host(r[:, None], k, KA)
            kb = core_offset_host(c[:, None], k, KB)
            out = step_3xtf32_parts(sm[a_big + ka], sm[a_small + ka], sm[b_big + kb],
                                    sm[b_small + kb])
            return tuple(float32(x) for x in out)

        @cuda.jit(device=True)
        def step_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch):
            # the warpgroup's A fragments, gathered through sm[scratch:scratch + SCRATCH]
            # (64 rows x 8, big then small) so that each thread can model its own entries
            warp, lane = (cuda.threadIdx.x % WARPGROUP) // 32, cuda.threadIdx.x % 32
            for e in range(4):
                r, k = a_fragment_index(e, warp, lane)
                sm[scratch + r * STEP + k] = a_big[e]
                sm[scratch + 64 * STEP + r * STEP + k] = a_small[e]
            cuda.syncthreads()
            r, c = entries(warp, lane)
            ka = scratch + r[:, None] * STEP + np.arange(STEP)
            kb = core_offset_host(c[:, None], STEP * s + np.arange(STEP), KB)
            out = step_3xtf32_parts(sm[ka], sm[64 * STEP + ka], sm[b_big + kb],
                                    sm[b_small + kb])
            cuda.syncthreads()
            return tuple(float32(x) for x in out)
        return dict(step_3xtf32=step_3xtf32, step_3xtf32_regs=step_3xtf32_regs, regs=regs)

    three_steps = _three_step_intrinsic(n)
    sbo_a, sbo_b = uint64(CORE * 4 * (KA // 4)) >> 4, uint64(CORE * 4 * (KB // 4)) >> 4
    lbo = uint64(CORE * 4) >> 4

    @cuda.jit(device=True)
    def descriptor(base, offset, s, sbo):
        addr = base + uint32(4 * (offset + 2 * CORE * s))    # 2 core matrices per step
        return uint64((addr & 0x3FFFF) >> 4) | (lbo << 16) | (sbo << 32)

    three_steps_regs = _three_step_regs_intrinsic(n)

    @cuda.jit(device=True)
    def step_3xtf32(sm, a_big, a_small, b_big, b_small, s):
        base = shared_address(sm)
        ab, as_ = descriptor(base, a_big, s, sbo_a), descriptor(base, a_small, s, sbo_a)
        bb, bs = descriptor(base, b_big, s, sbo_b), descriptor(base, b_small, s, sbo_b)
        return three_steps(as_, bb, ab, bs, ab, bb)

    @cuda.jit(device=True)
    def step_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch):
        base = shared_address(sm)
        bb, bs = descriptor(base, b_big, s, sbo_b), descriptor(base, b_small, s, sbo_b)
        return three_steps_regs(a_big, a_small, bb, bs)
    return dict(step_3xtf32=step_3xtf32, step_3xtf32_regs=step_3xtf32_regs, regs=regs)
