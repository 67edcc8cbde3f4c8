"""What every kernel needs from Numba: dtype mapping, shared-memory budget and dynamic shared
memory above 48 KiB, unsigned indices, device-function inlining, GQA indexing, simulator shims,
and P recomputed from lse (every backward's)."""

import contextlib
import functools
import math
import threading

import numba
import numpy as np
from numba import cuda, float32

from .cache import cached_jit  # noqa: F401  (the kernels' jit: cuda.jit with the disk cache)
# SIMULATOR: whether this process runs the simulator's numba.cuda; Launcher: how every kernel
# is launched
from .launch import SIMULATOR, Launcher  # noqa: F401
# 48 KiB: static shared memory per block (Numba's shared arrays); more is dynamic, opted in
from .launch import SHARED_MEMORY_BYTES  # noqa: F401
# the simulator as numba_flash runs it (patched at import); warpgroup_barrier: a warpgroup's
# barrier there, thread_state: a simulated thread's own state
from .simulator import WARPGROUP_THREADS, thread_state, warpgroup_barrier  # noqa: F401


SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
MAX_HEAD_DIM = 256


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


def check_shared_memory(what, nbytes, hint, limit=SHARED_MEMORY_BYTES):
    """ValueError when a tile configuration needs more shared memory than a block can have:
    `limit` is the 48 KiB of static shared memory, or dynamic_shared_limit() for kernels
    launched through launch.Launcher."""
    if nbytes > limit:
        raise ValueError(
            f"{what} needs {nbytes} bytes of shared memory per block, more than the "
            f"{limit} a block can have; {hint}")


def device_function(fn):
    """cuda.jit(device=True) on a GPU; on the simulator the plain Python function, for device
    functions that use nothing of `cuda` (no thread index, shared array or barrier). numba-cuda
    wrapped every device-function call in a per-module lock (swapped_cuda_module, which swaps
    the module's `cuda` for the calling thread's; simulator.py now swaps once a launch, and a
    plain function still saves the call through FakeCUDAKernel); with 128
    threads calling small helpers per element, most of a simulated wgmma kernel's time was
    threads queueing on that lock (sampled 2026-12-01: 19.5k of 15k samples' frames, the lock
    in every stack). A function that needs no swap can skip it; the result is the same."""
    return fn if SIMULATOR else cuda.jit(device=True)(fn)


def inlined_device_function(fn):
    """device_function, inlined into its caller on a GPU (forceinline): for helpers called with
    constant indices into the caller's local arrays, which stay in registers only when every
    index is a constant after inlining (LLVM does not unroll a loop whose body holds a wgmma,
    so such loops are written out as calls; sm90/forward.py)."""
    return fn if SIMULATOR else cuda.jit(device=True, forceinline=True)(fn)


@cuda.jit(device=True) if SIMULATOR else cuda.jit(device=True, forceinline=True)
def warp_barrier():
    """Barrier for data that stays inside a warp (rows owned by one warp); the simulator has
    no syncwarp, so there it is its warpgroup's barrier (every thread of the warpgroup calls
    it)."""
    if SIMULATOR:
        warpgroup_barrier()
    else:
        cuda.syncwarp()


def ceil_div(a, b):
    return -(-a // b)


# Grid y and z hold at most 65535 blocks each (x: 2^31 - 1). The query blocks sit in x (the
# blocks of one head run next to each other, sharing its K/V in L2) and the B*H heads in y,
# spilling into z past GRID_Y_LIMIT: head_grid(n) is (y, z) with y * z >= n, and a kernel
# reads its head as head_index() and returns at once when that is n or more.
GRID_Y_LIMIT = 65535


def head_grid(n):
    """(y, z) of a grid covering n heads: n in y when it fits, else GRID_Y_LIMIT in y and the
    rest in z (at most 65535 * 65535 heads)."""
    y = min(n, GRID_Y_LIMIT)
    return y, ceil_div(n, y)


@cuda.jit(device=True)
def head_index():
    """The head this block works on: blockIdx.y + blockIdx.z * gridDim.y (head_grid)."""
    return cuda.blockIdx.y + cuda.blockIdx.z * cuda.gridDim.y


@cuda.jit(device=True) if SIMULATOR else cuda.jit(device=True, forceinline=True)
def query_block_first_heaviest(causal):
    """The query block this block computes: blockIdx.x, or under causal masking (where the
    last query blocks see the most keys) gridDim.x - 1 - blockIdx.x, so that the heavy blocks
    of a head start first and the light ones fill the grid's tail (FlashAttention-2's
    order)."""
    x = U(cuda.blockIdx.x)
    if causal:
        x = U(cuda.gridDim.x) - U(1) - x
    return x


# Under causal masking the query blocks of a grid differ in work (each sees the keys up to
# its diagonal). Blocks start in launch order (x fastest, then the head), so with each head's
# query blocks heaviest first (query_block_first_heaviest) the last heads' heaviest blocks
# still start last and run alone in the grid's tail (tools/block_schedule.py's list
# schedule: 7 % past the even share for the d = 128 causal forward at N = 1k and 4k).
# make_block_order takes the launch order round the heads instead: CAUSAL_CHUNK query blocks
# of one head, heaviest first, then the same of the next head, and so on. Measured (H100,
# 2026-12-07, docs/experiments.md row 44): chunks of 1 (every head's heaviest block, then
# every head's next) made the wide float32 forward 1.002 / 1.048 / 1.052x at causal 1k / 4k
# / 16k, d = 128 (not what the schedule says: its gain is not the tail's alone). The
# backward's K/V blocks taken so ran 0.92-0.99x (chunks of 4: 0.99x): the blocks of one
# head, side by side, share Q and dO in L2. The chunked form is the timed one: written for
# chunks of 1 alone (rank = L // n, head = L - rank * n) the wide causal vector kernel's SASS
# moved (606 instructions differ, registers aside), so it stays until that is timed. The lean
# float32 forward takes query_block_first_heaviest instead (round the heads there: 0.930x at
# causal 1k, 72 bytes of spills; experiments rows 45, 46); forward16 takes this order from 64
# query blocks a head, heaviest first below (round the heads: 0.92-0.94x at causal 1k, where
# it reads K and V from DRAM 3x, 1.035-1.078x at 16k; row 47, forward16.ROUND_HEADS_FROM).
CAUSAL_CHUNK = 1


def make_block_order(causal):
    """order(n_heads) -> (x, head): the query block (grid x, uint32) and the head this block
    of a forward computes; head >= n_heads for a block past the last one (the caller
    returns). Unmasked: blockIdx.x and head_index(), the launch order. Causal: the linear
    launch index L = blockIdx.x + gridDim.x * head_index() taken as chunks of CAUSAL_CHUNK
    ranks, each chunk every head's in turn; rank 0 is the heaviest block, the last query
    block: x = gridDim.x - 1 - rank. (L fits 32 bits for any q a GPU holds: gridDim.x *
    n_heads <= (Nq / 128 + 1) n_heads reaches 2^32 only past 2^38 elements of q, and
    head_grid's z adds padding heads, under 65535 of them, only past 65535 heads.)"""
    jit = cuda.jit(device=True) if SIMULATOR else cuda.jit(device=True, forceinline=True)
    if not causal:
        @jit
        def launch_order(n_heads):
            return U(cuda.blockIdx.x), head_index()
        return launch_order

    @jit
    def order(n_heads):
        n = U(n_heads)
        X = U(cuda.gridDim.x)
        L = U(cuda.blockIdx.x) + X * U(head_index())
        if L >= X * n:
            return U(0), n
        base = L // (n * U(CAUSAL_CHUNK)) * U(CAUSAL_CHUNK)      # the chunk's first rank
        size = min(U(CAUSAL_CHUNK), X - base)                    # (the last may be short)
        within = L - base * n
        rank = base + within % size
        return X - U(1) - rank, within // size
    return order


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

# Dynamic shared memory. A block may use up to 227 KiB of shared memory on Hopper (H100/H200),
# 163 KiB on an A100, 99 KiB on sm_86/89, but only the first 48 KiB without an opt-in, and only
# when it is declared dynamic (cuda.shared.array(0, T), sized at launch).
DYNAMIC_SHARED_MEMORY_BYTES = 227 * 1024


def dynamic_shared_limit():
    """Bytes of dynamic shared memory a block may opt in to on this process's GPU (the
    driver's figure), what tile choices are sized against; Hopper's 227 KiB on the simulator
    and when there is no GPU to ask (tools/ptxas_check.py compiles without one)."""
    if SIMULATOR:
        return DYNAMIC_SHARED_MEMORY_BYTES
    return _device_shared_limit()


@functools.lru_cache(maxsize=None)
def _device_shared_limit():
    from numba.cuda.cudadrv.error import CudaSupportError
    try:
        return cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    except CudaSupportError:
        return DYNAMIC_SHARED_MEMORY_BYTES
# opt-in shared memory per block (bytes) by compute capability, for GPUs other than this
# process's (registry.shared_per_block asks the driver for the current one); an sm_80+ GPU
# not listed is taken to have the least (sm_86, sm_89, sm_120: 99 KiB)
SHARED_PER_BLOCK = {"sm_80": 166912, "sm_87": 166912, "sm_90": 232448, "sm_100": 232448}
SHARED_PER_BLOCK_LEAST = 101376



REGISTERS = 65536        # 32-bit registers per SM (sm_80 and sm_90)
REGISTER_UNIT = 256      # a warp's registers are allocated in multiples of this


def max_registers(threads):
    """The most registers a thread of a `threads`-thread block may take for one block to fit
    on an SM. An SM's registers are four partitions of 16384, its warps spread over them, and
    a warp's registers are allocated in units of 256 (REGISTER_UNIT): so the block's warps
    count as rounded up to a multiple of four, and the warp's share is rounded down to a unit
    (CUDA's occupancy calculator, cudaOccMaxBlocksPerSMRegsLimit). 128 at 512 threads, 168 at
    384 (not 65536 // 384 = 170: mma16's forward at 384 threads failed to launch so,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, H200, 2026-12-04), 168 at 288 or 320 too."""
    warps = -(-threads // 32)
    warps = -(-warps // 4) * 4
    return min(255, REGISTERS // warps // REGISTER_UNIT * REGISTER_UNIT // 32)


def kernel_jit(threads=None):
    """cuda.jit for a kernel of `threads` threads per block: above 256 threads, with
    max_registers(threads), so that one block fits on an SM at all (ptxas takes up to 255 per
    thread when not told, which 384 or 512 threads cannot have: the launch would fail); at
    256 or fewer, plain cuda.jit (the default kernels' code is as it was timed).
    On a GPU the kernel is cached on disk across processes (cache.cached_jit; threads=None:
    no register cap, for the kernels that used to be plain @cuda.jit)."""
    if SIMULATOR:
        return cuda.jit
    if threads is not None and threads > 256:
        return cached_jit(max_registers=max_registers(threads))
    return cached_jit


ALIGN = None if SIMULATOR else 16      # of the dynamic shared array; the simulator rejects one


# 2^x below this is subnormal in float32: ex2.approx.ftz gives 0 there
EXP2_FTZ_BELOW = -126.0

if SIMULATOR:
    @device_function
    def exp2_approx(x):
        """2^x in float32, subnormal results flushed to 0 (exactly rounded otherwise on the
        simulator; ex2.approx.ftz.f32 on a GPU)."""
        if x < float32(EXP2_FTZ_BELOW):
            return float32(0.0)
        with np.errstate(over="ignore"):
            return float32(np.exp2(np.float32(x)))
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def exp2_approx(typingctx, x):
        """2^x in float32: one ex2.approx.ftz.f32 (MUFU.EX2; relative error below 2^-22,
        2^-inf = 0, NaN stays NaN), where math.exp costs a range reduction and a scaling around
        it (libdevice's expf). ftz: results below 2^-126 are 0 (a P that small is below every
        tolerance: l >= 1 wherever P is summed); without it ptxas wraps each MUFU.EX2 in a
        compare and two multiplies to keep subnormal results (forward16 at d = 64: 3 of its
        ~7.6 instructions an element of S, ncu, 2026-12-04)."""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            fn = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            return builder.call(ir.InlineAsm(fn, "ex2.approx.ftz.f32 $0, $1;", "=f,f"),
                                list(args))
        return types.float32(x), codegen


@functools.lru_cache(maxsize=None)
def make_recompute_p(T, causal, base2=False, select=False, sums32=False):
    """recompute_p(s_ij, lse_i, i, j, nq, nk), every backward's P from the forward's lse;
    base2 (float32, sm90.backward16): S and lse in units of log2 (times log2 e), P by
    exp2_approx. select (on a GPU): the exp computed for every entry and a masked one's
    discarded by a select, not a branch around the exp (the same P): sm90.backward's, where
    it was timed (2026-12-06); the other kernels keep the branch (with the select their SASS
    moved, fa2's backward to fewer instructions, backward16's to more: neither was timed).
    sums32 (with select; i, j uint32): the causal test's sums in 32 bits, not the 64 Numba
    widens a sum of uint32s to (lengths are below 2^31): sm90.backward's causal lean kernel
    with dQ out and vector loads, where it paid (2026-12-07: timed in a tree of three such
    changes, its backward's time as fwd+bwd less fwd; on its own at 13:57, fwd+bwd
    1.005-1.019x at d = 64 causal, docs/experiments.md row 54)."""
    if sums32 and not select:
        raise ValueError("make_recompute_p: sums32 is a form of the select variant (select=True)")
    exp = exp2_approx if base2 else math.exp

    def recompute_p(s_ij, lse_i, i, j, nq, nk):
        """P_ij = exp(S_ij - lse_i) where query i sees key j (causal: j + nq <= i + nk), 0
        elsewhere and on rows that saw no key (lse = -inf)."""
        if i < nq and j < nk and (not causal or j + nq <= i + nk) and lse_i != T(NEG_INF):
            return exp(s_ij - lse_i)
        return T(0.0)

    def recompute_p_select(s_ij, lse_i, i, j, nq, nk):
        """recompute_p, the exp first and then a select: a branch around the exp made each
        entry a chain of its own between convergence barriers, which ptxas did not interleave
        (the float32 backward's P phase, Nsight Compute, 2026-12-06); a masked entry's exp is
        discarded."""
        p = exp(s_ij - lse_i)
        if sums32:
            seen = (i < nq and j < nk and (not causal or U(j + nq) <= U(i + nk))
                    and lse_i != T(NEG_INF))
        else:
            seen = (i < nq and j < nk and (not causal or j + nq <= i + nk)
                    and lse_i != T(NEG_INF))
        return p if seen else T(0.0)
    # on the simulator a plain function: no lock per call (device_function); no select there
    # either (math.exp raises on a masked entry's large S - lse)
    if SIMULATOR:
        return recompute_p
    return cuda.jit(device=True, forceinline=True)(recompute_p_select if select else recompute_p)


_simulator_lock = threading.RLock()


@contextlib.contextmanager
def simulator_exclusive():
    """On the simulator, one API call at a time in this process (nothing on a GPU): numba-cuda's
    simulator runs one kernel at a time and fails a second thread's launch ("concurrent
    simulated kernel not supported"), so calls from several threads queue here instead."""
    if not SIMULATOR:
        yield
        return
    with _simulator_lock:
        yield
