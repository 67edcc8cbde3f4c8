"""Tensor-core products for Numba kernels: one warp's 16x8x8 TF32 matrix multiply-accumulate,
and the split of a float32 into two TF32 parts that keeps float32 accuracy.

mma_tf32(a, b, c) -> d: one `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` (PTX ISA 7.0,
sm_80 and newer): D = A B + C for a 16x8 A, an 8x8 B and a 16x8 C spread over the 32 lanes of
a warp. With g = lane // 4 and t = lane % 4, lane holds
    a = (A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4])
    b = (B[t, g], B[t + 4, g])
    c, d = (C[g, 2t], C[g, 2t + 1], C[g + 8, 2t], C[g + 8, 2t + 1])
(PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32). All 32 lanes must call it together.

TF32 keeps 10 of float32's 23 mantissa bits, so one TF32 product is off by ~1e-3 relative.
split_tf32(x) -> (big, small), with big = x rounded to TF32 (as cvt.rna.tf32.f32) and small =
(x - big) rounded to TF32: big + small is x to ~2^-22 relative, and
    A B ~ A_big B_big + A_big B_small + A_small B_big
(three products; A_small B_small is below float32's roundoff) is float32-accurate up to the
tensor core's own accumulation ("3xTF32", as in CUTLASS). `round_tf32` is the first half.

On the simulator a warp's lanes are Python threads that cannot see each other's registers,
so there is no mma_tf32 there; kernels compute each lane's share of D directly instead
(see the kernel using it). round_tf32 works there too (NumPy bit arithmetic, same rounding).
"""

import numpy as np
from numba import cuda

# the NumPy model of the rounding (cvt.rna.tf32.f32: nearest, ties away from zero)
from reference.precision import TF32_DROPPED_BITS
from reference.precision import round_tf32 as round_tf32_host

from .support import SIMULATOR

if SIMULATOR:
    import struct

    _F32, _U32 = struct.Struct("<f"), struct.Struct("<I")

    # plain functions: no lock per call (common.device_function). round_tf32_host's bit
    # arithmetic on one scalar, in plain Python: 0.6 us a call where the NumPy array path took
    # 5-6 (it was half of a simulated wgmma kernel's busy time); the same bits as
    # round_tf32_host (tests/test_mma.py compares 50k random bit patterns and Python floats).
    # NaN, whose payload a trip through a Python float could change, and |x| beyond float32
    # take the array path.
    def round_tf32(x):
        if x != x:
            return np.float32(round_tf32_host(np.float32(x))[()])
        try:
            bits = _U32.unpack(_F32.pack(x))[0]
        except OverflowError:
            return np.float32(round_tf32_host(np.float32(x))[()])
        if bits & 0x7F800000 != 0x7F800000:
            bits = (bits + (1 << (TF32_DROPPED_BITS - 1))) & (0xFFFFFFFF << TF32_DROPPED_BITS
                                                              & 0xFFFFFFFF)
        return np.float32(_F32.unpack(_U32.pack(bits))[0])

    def split_tf32(x):
        big = round_tf32(x)
        return big, round_tf32(np.float32(x - big))

    split_tf32_nan_elsewhere = split_tf32        # the model: NaN parts either way
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    def _tf32_rounding(keep_nonfinite):
        """An intrinsic rounding a float32 to TF32 (round_tf32's bit arithmetic); with
        keep_nonfinite inf and NaN pass unchanged (the select), else a NaN whose mantissa's
        high bits are all ones (the GPU's canonical 0x7fffffff) carries into the sign bit and
        comes out -0.0: two instructions (IADD, LOP3) where the select makes it five."""
        @intrinsic
        def rounding(typingctx, x):
            if x != types.float32:
                return None
            sig = types.float32(x)

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                bits = builder.bitcast(args[0], i32)
                half = ir.Constant(i32, 1 << (TF32_DROPPED_BITS - 1))
                mask = ir.Constant(i32, -(1 << TF32_DROPPED_BITS))
                rounded = builder.and_(builder.add(bits, half), mask)
                if keep_nonfinite:
                    exponent = ir.Constant(i32, 0x7F800000)
                    finite = builder.icmp_unsigned("!=", builder.and_(bits, exponent), exponent)
                    rounded = builder.select(finite, rounded, bits)
                return builder.bitcast(rounded, ir.FloatType())

            return sig, codegen
        return rounding

    # Integer arithmetic on the bits, as the NumPy model: add half of the dropped part's weight,
    # clear the dropped bits. inf and NaN pass unchanged (a select): the sum would carry a NaN
    # whose mantissa is all ones, the GPU's canonical NaN (0x7fffffff, what q * scale makes of
    # a NaN q), into the sign bit and make it -0.0, a finite logit where truth is NaN
    # (2026-12-02). Its split leaves inf's small part NaN (inf - inf): the tensor-core kernels
    # give NaN rows where an input is infinite (README, "What bad input gets").
    round_tf32 = _tf32_rounding(keep_nonfinite=True)
    # only for split_tf32, which puts the NaN back
    _round_tf32_carrying = _tf32_rounding(keep_nonfinite=False)

    @intrinsic
    def _keep_nan(typingctx, residual, small):
        """fma(residual, 0, small) as one FFMA that no fast-math pass may fold: small itself
        for finite residual (the zero carries small's own sign, so even a zero small keeps its
        bits), NaN where residual is NaN or infinite."""
        if residual != types.float32 or small != types.float32:
            return None
        sig = types.float32(residual, small)

        def codegen(context, builder, sig, args):
            f32 = ir.FloatType()
            asm = ir.InlineAsm(ir.FunctionType(f32, [f32, f32]),
                               "fma.rn.f32 $0, $1, 0f00000000, $2;", "=f,f,f")
            return builder.call(asm, list(args))

        return sig, codegen

    @cuda.jit(device=True)
    def split_tf32(x):
        """(big, small), the bits of the NumPy model's split for every finite x and inf; for a
        NaN x big may be a zero (the carrying rounding) but small is NaN, so every product
        with x is NaN. 6 instructions where rounding both parts with round_tf32 took 10 (the
        select cost the tensor-core kernels 3-14 % on an H200, 2026-12-03)."""
        big = _round_tf32_carrying(x)
        residual = x - big                 # NaN for a NaN or infinite x
        return big, _keep_nan(residual, _round_tf32_carrying(residual))

    @cuda.jit(device=True)
    def split_tf32_nan_elsewhere(x):
        """split_tf32 without putting a NaN back (5 instructions): the same bits for finite x
        and inf, but a NaN x with an all-ones mantissa (the GPU's canonical NaN) splits into
        two zeros. Only where the NaN reaches the result another way: the forward's P, whose
        row sum l (added from the unsplit P) is then NaN, and with it out = O / l and lse."""
        big = _round_tf32_carrying(x)
        return big, _round_tf32_carrying(x - big)

    _MMA = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
            "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")

    def _float_tuple(x, n):
        return isinstance(x, types.UniTuple) and x.count == n and x.dtype == types.float32

    @intrinsic
    def mma_tf32(typingctx, a, b, c):
        if not (_float_tuple(a, 4) and _float_tuple(b, 2) and _float_tuple(c, 4)):
            return None
        sig = types.UniTuple(types.float32, 4)(a, b, c)

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([f32] * 4),
                                               [i32] * 6 + [f32] * 4),
                               _MMA, "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
            operands = [builder.bitcast(builder.extract_value(args[0], e), i32) for e in range(4)]
            operands += [builder.bitcast(builder.extract_value(args[1], e), i32) for e in range(2)]
            operands += [builder.extract_value(args[2], e) for e in range(4)]
            result = builder.call(asm, operands)
            return context.make_tuple(builder, sig.return_type,
                                      [builder.extract_value(result, e) for e in range(4)])

        return sig, codegen
