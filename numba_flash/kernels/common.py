"""Pieces every kernel factory shares: dtype mapping, shared-memory budget, GQA indexing."""

import math

import numba
import numpy as np
from numba import cuda

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MAX_HEAD_DIM = 256
# Static shared memory per block. Numba declares shared arrays statically, and CUDA caps
# static shared memory at 48 KiB per block (more needs an opt-in that Numba does not expose).
SHARED_MEMORY_BYTES = 48 * 1024


def numba_type(dtype):
    """numba scalar type for a supported NumPy dtype (float32 or float64)."""
    dtype = np.dtype(dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"kernels support float32 and float64, got {dtype}")
    return numba.from_dtype(dtype)


def check_block(name, value, limit=1024):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 1 <= value <= limit:
        raise ValueError(f"{name} must be an integer in 1..{limit}, got {value!r}")


def check_head_dim(head_dim):
    if not isinstance(head_dim, (int, np.integer)) or not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head dim must be in 1..{MAX_HEAD_DIM}, got {head_dim!r}")


def check_shared_memory(what, nbytes, hint):
    """ValueError when a tile configuration needs more static shared memory than a block has."""
    if nbytes > SHARED_MEMORY_BYTES:
        raise ValueError(
            f"{what} needs {nbytes} bytes of shared memory per block, more than the "
            f"{SHARED_MEMORY_BYTES} a block can have; {hint}")


def ceil_div(a, b):
    return -(-a // b)


@cuda.jit(device=True)
def kv_head(bh, heads, group):
    """Index into the (B*Hk) axis of k/v for index bh of the (B*H) axis of q, where each key
    head serves `group` = H / Hk consecutive query heads (grouped-query attention)."""
    return (bh // heads) * (heads // group) + (bh % heads) // group


NEG_INF = -math.inf

# Unsigned indexing. Numba wraps every array access whose index is a signed integer in a
# negative-index check (i < 0 ? i + size : i); and its `for ... in range()` loops keep an
# iterator state that survives unrolling. In a tile loop that is ~6 integer instructions per
# shared-memory load, which made the tiled forward slower than the row-per-thread one (PTX
# read on 2026-11-29). The fast kernels therefore index with unsigned integers (U(x), and
# factory constants made U) and write their long loops as `while` loops; numba keeps
# unsigned + unsigned unsigned, but unsigned + signed becomes signed (or float64 for 64-bit),
# so every operand of an index expression must be unsigned.
U = np.uint32
