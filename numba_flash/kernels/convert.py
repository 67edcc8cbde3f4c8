"""Half storage to float32 and back, on the device: what lets every float32 kernel pair take
float16 and bfloat16 arrays (api.py), until pairs with half tensor-core products exist.

    widen(src, dst, fmt, stream)       dst (float32) = src (float16, or bfloat16 as its bits)
    narrow(src, dst, fmt, stream)      dst (float16, or bfloat16 bits) = src (float32) rounded
                                       to nearest, ties to even (NaN stays NaN, overflow to inf)

src and dst: contiguous Numba device arrays of one size, any shape (viewed flat). bfloat16
arrays travel as their 16-bit patterns (int16: the __cuda_array_interface__ has no bfloat16
type), which is also all a conversion needs: a bfloat16 is the high half of a float32, so
widening shifts the bits up 16 and narrowing rounds the low 16 away (the same bits as
ml_dtypes' and torch's conversions, tests/test_half.py). float16 uses the hardware conversion
(cvt.rn.f16.f32 and back).

Each kernel is memory-bound: 2 bytes read and 4 written per element (or the reverse), a
grid-stride loop over the flat array.
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from .support import cached_jit

THREADS = 256
BLOCKS = 1024            # a grid-stride loop: enough blocks to fill any GPU, fewer past it


@functools.lru_cache(maxsize=None)
def _kernels():
    """(widen_f16, widen_bf16, narrow_f16, narrow_bf16), compiled on first use (and cached on
    disk, as every kernel)."""

    @cached_jit
    def widen_f16(src, dst):
        for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            dst[i] = float32(src[i])

    @cached_jit
    def widen_bf16(bits, dst_bits):
        # bits: int16 patterns; dst_bits: the float32 output viewed as uint32
        for i in range(cuda.grid(1), bits.size, cuda.gridsize(1)):
            dst_bits[i] = (uint32(bits[i]) & uint32(0xFFFF)) << uint32(16)

    @cached_jit
    def narrow_f16(src, dst):
        for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            dst[i] = src[i]                    # float32 -> float16, round to nearest even

    @cached_jit
    def narrow_bf16(src_bits, dst_bits):
        # src_bits: the float32 input viewed as uint32; dst_bits: uint16 patterns
        for i in range(cuda.grid(1), src_bits.size, cuda.gridsize(1)):
            b = src_bits[i]
            if (b & uint32(0x7FFFFFFF)) > uint32(0x7F800000):
                dst_bits[i] = (b >> uint32(16)) | uint32(0x40)          # NaN, kept quiet
            else:
                # round half to even on the 16 bits dropped; a carry into the exponent is
                # the right rounding (up to the next binade, or to inf past bfloat16's max)
                dst_bits[i] = (b + uint32(0x7FFF) + ((b >> uint32(16)) & uint32(1))) >> uint32(16)

    return widen_f16, widen_bf16, narrow_f16, narrow_bf16


def _grid(n):
    return max(1, min(BLOCKS, -(-n // THREADS)))


def widen(src, dst, fmt, stream=0):
    """dst[...] = src as float32; fmt "float16" (src float16) or "bfloat16" (src int16 bits)."""
    widen_f16, widen_bf16, _, _ = _kernels()
    s, t = src.reshape(src.size), dst.reshape(dst.size)
    if fmt == "bfloat16":
        widen_bf16[_grid(src.size), THREADS, stream](s, t.view(np.uint32))
    else:
        widen_f16[_grid(src.size), THREADS, stream](s, t)


def narrow(src, dst, fmt, stream=0):
    """dst[...] = float32 src rounded to fmt ("float16", or "bfloat16" into int16 bits)."""
    _, _, narrow_f16, narrow_bf16 = _kernels()
    s, t = src.reshape(src.size), dst.reshape(dst.size)
    if fmt == "bfloat16":
        narrow_bf16[_grid(src.size), THREADS, stream](s.view(np.uint32), t.view(np.uint16))
    else:
        narrow_f16[_grid(src.size), THREADS, stream](s, t)
