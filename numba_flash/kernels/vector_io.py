"""16-byte global loads for Numba kernels (an experiment of the fa2 forward, not yet measured).

load4(src, head, row, col) returns src[head, row, col : col + 4] as a 4-tuple with one vector
load instruction (ld.global.v4.f32 in float32; two ld.global.v2.f64 in float64). Numba emits
one scalar load per element and cannot vectorize them itself: it does not know that the
address is 16-byte aligned. Here the caller promises it: the array's data pointer and its row
stride in bytes are multiples of 16 and col is a multiple of 4 (the launcher checks the first
two, the kernel's staging loop the third). Nothing checks it at run time on the GPU: a
misaligned address is a CUDA error (misaligned address), not a wrong answer.

On the simulator it reads the four elements one by one.
"""

from numba import cuda

from .common import SIMULATOR

VECTOR = 4
ALIGN_BYTES = 16


def aligned(*arrays):
    """True when every array's data pointer and row stride allow load4: both multiples of 16
    bytes (CUDA allocations are; a view into one may not be)."""
    for a in arrays:
        ptr = a.__cuda_array_interface__["data"][0] if hasattr(a, "__cuda_array_interface__") \
            else a.ctypes.data
        if ptr % ALIGN_BYTES or (a.strides[-2] % ALIGN_BYTES if a.ndim >= 2 else False):
            return False
    return True


if SIMULATOR:
    @cuda.jit(device=True)
    def load4(src, head, row, col):
        return (src[head, row, col], src[head, row, col + 1], src[head, row, col + 2],
                src[head, row, col + 3])
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load4(typingctx, src, head, row, col):
        if not (isinstance(src, types.Array) and src.ndim == 3):
            return None
        sig = types.UniTuple(src.dtype, VECTOR)(src, head, row, col)

        def codegen(context, builder, sig, args):
            array_type, index_types = sig.args[0], sig.args[1:]
            array = context.make_array(array_type)(context, builder, value=args[0])
            indices = [context.cast(builder, value, ty, types.intp)
                       for value, ty in zip(args[1:], index_types)]
            first = cgutils.get_item_pointer(context, builder, array_type, array, indices,
                                             wraparound=False)
            vector = ir.VectorType(context.get_data_type(array_type.dtype), VECTOR)
            loaded = builder.load(builder.bitcast(first, vector.as_pointer()), align=ALIGN_BYTES)
            values = [builder.extract_element(loaded, ir.Constant(ir.IntType(32), e))
                      for e in range(VECTOR)]
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen
