"""Hopper warpgroup products on 16-bit operands (wgmma, sm_90a): bfloat16 or float16 inputs,
products exact, sums in float32 on the tensor core, one product where 3xTF32 (wgmma.py) issues
three. Used by sm90/forward16.py (the "wgmma16" pair's forward).

Layout. A 16-bit operand in shared memory is K-major, in core matrices of 8 rows x 16 bytes
(8 x 8 elements), as wgmma.py's TF32 tiles are (no swizzling): element (r, k) of a rows x K
tile sits at `core_offset16(r, k, K)` elements,

    ((r // 8) * (K // 8) + k // 8) * 64 + (r % 8) * 8 + k % 8,

its descriptor has LBO = 128 bytes (the next core matrix along K) and SBO = 16 K bytes (the
next 8 rows), and a k16 step spans two core matrices along K: step s starts 256 s bytes
further (16 s in the descriptor's address field, which counts 16-byte units).

Transposed B (`b_rows=W`). A B operand (n x K) may instead be read from a tile staged as
above with the contraction as its rows: a K-major W-column tile of K rows (W >= n), B's
element (c, k) being the tile's (k, c) at core_offset16(k, c, W). So V (keys x head dim) is
the B of P V, and Q, dO, K the B of dS^T Q, P^T dO, dS K, as they are staged for S = Q K^T
and dP = dO V^T: no transposed copies. wgmma reads it MN-major (its transpose-B flag): PTX's
canonical MN-major layout without swizzling, ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)) in 16-byte
units (T = 8 elements), with core matrices of 8 K rows x 16 bytes of N (the tile's own),
SBO = 128 bytes (the next 8 of N: the next core matrix of the row group) and LBO = 16 W bytes
(the next 8 of K: the next row group); a k16 step is two row groups, 32 W bytes.

Swizzled tiles (`swizzle=True`: what TMA writes, sm90/tma.py). Each tile is 64-column boxes
of its rows x 128 bytes, row r of a box at 128 r bytes with its 16-byte chunk j at chunk
j ^ (r % 8) (tma.swizzle128_offset_host(r, c, R): box h of an R-row tile at 64 R h elements),
the tile 1024-byte aligned. Descriptors in swizzle mode 1 (128 bytes, bits 62-63): K-major A
and B with SBO = 1024 bytes (8 rows), LBO unused, a k16 step 32 bytes into a box, the next box
R rows x 128 bytes further (PTX's ((8,m),(T,2k)):((8T,SBO),(1,T)) under Swizzle<3,4,3>); a
transposed B (MN-major, the tile's rows the contraction) with LBO = the next 64 columns
(R x 128 bytes), SBO = 1024 bytes, a k16 step 16 rows (2048 bytes): ((T,8,m),(8,k)):
((1,T,LBO),(8T,SBO)). On the simulator the models read the same offsets.

    mma_ss(sh, a_at, b_at)      A B^T, A (64 x K) and B (n x K) 16-bit tiles at element
                                offsets a_at, b_at of the shared array sh, K // 16 steps
                                chained in a fresh accumulator, one wait: a tuple of n / 2
                                float32, entry j at wgmma.position(j, warp, lane).
    mma_rs(sh, sm, acc, a, b_at, scratch)
                                acc += A B^T with A from registers: a, a local uint32 array of
                                4 K / 16 entries, step s's fragment at 4 s.. (a_fragment16),
                                each the two 16-bit values of its (row, k), (row, k + 1), the
                                lower k in the low half (pack_half2); acc a local float32
                                array of n / 2 entries, accumulated in the tensor core.
    store_transposed4(sh, sm, at, words, first, scratch)
                                stmatrix.x4.trans (sm_90): four 8 x 8 16-bit matrices, words
                                first..first + 3 of each thread (matrix m's element (g, 2t),
                                (g, 2t + 1) in word first + m: an accumulator's fragment packed
                                in pairs), stored transposed: its column c becomes the 16 bytes
                                at element offset `at` of lane 8 m + c, row position g.
    store_rows4(sh, sm, at, words, first, scratch)
                                stmatrix.x4 (sm_90), not transposed: matrix m's row g goes
                                to the 16 bytes at element offset `at` of lane 8 m + g
                                (as it stands in the fragment: O's rows into a tile).
    load_shared16(sh, at)       the 16 bytes at element offset `at` (16-byte aligned) of the
                                16-bit shared array sh as four uint32 words (ld.shared.v4).
    pack_half2(lo, hi)          two float32 rounded to the format (nearest even) in one uint32.
    unpack_half(bits)           the float32 value of a 16-bit pattern (uint32, low half).

On the simulator (no warpgroup-wide instructions) each thread computes its own entries with
NumPy: the exact sum (float64) of the exact products, rounded to float32 once (the tensor
core's own order of additions is not modelled), added to acc for mma_rs. A register A operand
goes through `wgmma.SCRATCH` floats of the float32 view `sm` of shared memory at `scratch`
(one barrier per product; unused on a GPU), as wgmma.py's register operands do. Products
issued asynchronously (ss_issue, rs_issue) are computed at their issue and again at the wait
that retires them, and the model raises InFlightHazard where an operand changed meanwhile or
an accumulator is read before its wait (`InFlight`): what a GPU, which reads the operands at
any time in between, would get wrong.
"""

import functools

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from reference.precision import HALF_FORMATS

from ..support import SIMULATOR, device_function, thread_state, warpgroup_barrier
from .wgmma import GATHER, WARPGROUP

STEP16 = 16        # contraction per wgmma for 16-bit operands (K)
CORE16 = 64        # elements per core matrix (8 rows x 8)


def core_offset16_host(r, k, K):
    """core_offset16 in NumPy (r, k arrays of indices; K the tile's contraction length)."""
    r, k = np.asarray(r), np.asarray(k)
    return ((r // 8) * (K // 8) + k // 8) * CORE16 + (r % 8) * 8 + k % 8


@device_function
def core_offset16(r, k, K):
    """Element offset of (r, k) of a K-major 16-bit tile with K columns (see the module)."""
    return ((r // 8) * (K // 8) + k // 8) * CORE16 + (r % 8) * 8 + k % 8


@device_function
def a_fragment16(e, warp, lane):
    """(row, k) in the 64 x 16 A operand of a step of word e (0-3) of the register fragment
    that thread `lane` of warp `warp` passes; the word holds k and k + 1: rows g and g + 8 of
    the warp's 16 (e odd: g + 8), k = 2t (e < 2) or 2t + 8 (mma.m16n8k16's A fragment). So the
    accumulator entries 8 s .. 8 s + 7 of a 64 x n product (wgmma.position) are, packed in
    pairs, word by word the A fragment of step s of a product over its n columns."""
    g, t = lane // 4, lane % 4
    return warp * 16 + g + 8 * (e % 2), 2 * t + 8 * (e // 2)


def _check(fmt, n, K):
    if fmt not in HALF_FORMATS:
        raise ValueError(f"fmt must be one of {HALF_FORMATS}, got {fmt!r}")
    if n % 8 or not 8 <= n <= 256 or K % STEP16 or K <= 0:
        raise ValueError(f"16-bit wgmma products need n in 8..256 in steps of 8 and a "
                         f"contraction length that is a multiple of {STEP16}, got n={n}, K={K}")


if SIMULATOR:
    import struct

    import ml_dtypes

    from .tma import SWIZZLE_ALIGN, swizzle128_offset_host
    from .wgmma import exchange_buffer, exchange_in_warp

    def decode_host(bits, fmt):
        """float32 values of 16-bit patterns (uint16 array) in format fmt."""
        bits = np.asarray(bits, np.uint16)
        if fmt == "bfloat16":
            return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
        return bits.view(np.float16).astype(np.float32)

    _FORMAT_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}

    _F32, _U32, _F16 = struct.Struct("<f"), struct.Struct("<I"), struct.Struct("<e")

    def _encode_scalar(x, fmt):
        """The 16-bit pattern of float32 x rounded to fmt (ml_dtypes' and NumPy's conversions:
        to nearest, ties to even; past the largest inf), a Python integer: the simulator calls
        it per entry, so not NaN goes through struct (16x faster than a NumPy scalar
        conversion; the same bits for 3M random float32 patterns and those around each
        format's limits, 2026-12-06): bfloat16 rounds float32's bits to nearest even by
        arithmetic (an overflow carries into inf), float16 is struct's IEEE half, which raises
        where the result is inf."""
        if x == x:
            if fmt == "bfloat16":
                bits = _U32.unpack(_F32.pack(x))[0]
                return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            try:
                return _U32.unpack(_F16.pack(x) + b"\0\0")[0]
            except OverflowError:
                pass
        with np.errstate(over="ignore", invalid="ignore"):      # inf, NaN: silently, as cvt
            return int(np.float32(x).astype(_FORMAT_DTYPES[fmt]).view(np.uint16))

    def _entries(regs, warp, lane):
        g, t = lane // 4, lane % 4
        j = np.arange(regs)
        return warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2

    @functools.lru_cache(maxsize=None)
    def make_pack_half2(fmt):
        @device_function
        def pack_half2(lo, hi):
            return np.uint32(_encode_scalar(lo, fmt) | (_encode_scalar(hi, fmt) << 16))
        return pack_half2

    @functools.lru_cache(maxsize=None)
    def make_unpack_half(fmt):
        @device_function
        def unpack_half(bits):
            return float32(decode_host(np.array([np.uint32(bits) & 0xFFFF], np.uint16), fmt)[0])
        return unpack_half

    @cuda.jit(device=True)
    def _stmatrix4(sh, sm, at, words, first, scratch, transposed):
        # the warp's row offsets exchanged (one barrier), then each thread stores its own
        # halves where the lanes that give those rows point: transposed, element (g, 2t + h)
        # of matrix m is position g of the row lane 8 m + 2t + h gives; else positions
        # 2t + h of the row lane 8 m + g gives
        lane0 = exchange_in_warp(sm, scratch, at)
        lane = cuda.threadIdx.x % 32
        g, t = lane // 4, lane % 4
        for m in range(4):
            word = int(words[first + m])
            for half in range(2):
                if transposed:
                    sh[int(sm[lane0 + 8 * m + 2 * t + half]) + g] = (word >> (16 * half)) & 0xFFFF
                else:
                    sh[int(sm[lane0 + 8 * m + g]) + 2 * t + half] = (word >> (16 * half)) & 0xFFFF

    @cuda.jit(device=True)
    def store_transposed4(sh, sm, at, words, first, scratch):
        _stmatrix4(sh, sm, at, words, first, scratch, True)

    @cuda.jit(device=True)
    def store_rows4(sh, sm, at, words, first, scratch):
        _stmatrix4(sh, sm, at, words, first, scratch, False)

    @device_function
    def load_shared16(sh, at):
        return tuple(np.uint32(int(sh[at + 2 * w]) | (int(sh[at + 2 * w + 1]) << 16))
                     for w in range(4))

    def _products16(n, KA, KB, fmt, b_rows, swizzle):
        """products16 on the simulator: NumPy models."""
        regs = n // 2

        def a_offset(r, k, K):
            return swizzle128_offset_host(r, k, 64) if swizzle else core_offset16_host(r, k, K)

        def b_offset(c, k, K):
            if swizzle:         # B's rows n, or transposed the contraction's K
                return swizzle128_offset_host(c, k, n) if b_rows is None else \
                    swizzle128_offset_host(k, c, K)
            return core_offset16_host(c, k, K) if b_rows is None else \
                core_offset16_host(k, c, b_rows)

        def check_aligned(*offsets):
            """A swizzled tile starts at a multiple of 1024 bytes (tma.SWIZZLE_ALIGN), else a
            GPU's swizzle, which follows address bits, reads other elements."""
            if swizzle and any((2 * int(at)) % SWIZZLE_ALIGN for at in offsets):
                raise ValueError(f"a swizzled wgmma operand at element offsets {offsets}: not "
                                 f"{SWIZZLE_ALIGN}-byte aligned")

        # index arrays of a thread's entries, computed once per (warp, lane): with them
        # vectorized, one NumPy model call per product and thread (128 Python threads)
        @functools.lru_cache(maxsize=None)
        def ss_indices(warp, lane):
            r, c = _entries(regs, warp, lane)
            k = np.arange(KA)
            return a_offset(r[:, None], k, KA), b_offset(c[:, None], k, KA)

        @functools.lru_cache(maxsize=None)
        def rs_indices(warp, lane):
            """(where the thread's A words go in the gathered 64 x KB A, low halves; the A
            rows and B offsets of its entries)."""
            w = np.arange(4 * (KB // STEP16))
            rows, ks = a_fragment16(w % 4, warp, lane)
            r, c = _entries(regs, warp, lane)
            k = np.arange(KB)
            return (rows * KB + ks + STEP16 * (w // 4), r[:, None] * KB + k,
                    b_offset(c[:, None], k, KB))

        def ss_entries(sh, a_at, b_at, tid):
            """Thread tid's entries of A B^T, A and B read from sh now (float32 array)."""
            check_aligned(a_at, b_at)
            ka, kb = ss_indices((tid % WARPGROUP) // 32, tid % 32)
            a = decode_host(sh[a_at + ka], fmt)
            b = decode_host(sh[b_at + kb], fmt)
            exact = (a.astype(np.float64) * b.astype(np.float64)).sum(axis=1)
            return exact.astype(np.float32)

        @cuda.jit(device=True)
        def rs_gather(sh, sm, a, b_at, scratch):
            """The warpgroup's register A (64 x KB, through a gather buffer: one barrier) and
            a function of it giving this thread's entries of A B^T, B read from sh when it
            is called (float64 array: the exact sums, added to acc by accumulate)."""
            check_aligned(b_at)
            words, ka, kb = rs_indices((cuda.threadIdx.x % WARPGROUP) // 32,
                                       cuda.threadIdx.x % 32)
            at = scratch + exchange_buffer("gather") * GATHER
            bits = np.asarray(a, np.uint32)
            sm[at + words] = decode_host((bits & 0xFFFF).astype(np.uint16), fmt)
            sm[at + words + 1] = decode_host((bits >> 16).astype(np.uint16), fmt)
            warpgroup_barrier()
            av = sm[at + ka].astype(np.float64)

            def entries():
                bv = decode_host(sh[b_at + kb], fmt)
                return (av * bv.astype(np.float64)).sum(axis=1)
            return entries

        def accumulate(acc, exact):
            """acc += the exact sums, rounded to float32 once."""
            for j in range(regs):
                acc[j] = float32(np.float64(acc[j]) + exact[j])

        @cuda.jit(device=True)
        def mma_ss(sh, a_at, b_at):
            wait_all()                  # the instruction's own wait_group 0 retires every group
            return tuple(float32(x) for x in ss_entries(sh, a_at, b_at, cuda.threadIdx.x))

        @cuda.jit(device=True)
        def mma_rs(sh, sm, acc, a, b_at, scratch):
            wait_all()
            accumulate(acc, rs_gather(sh, sm, a, b_at, scratch)())

        @cuda.jit(device=True)
        def ss_issue(sh, a_at, b_at):
            tid = cuda.threadIdx.x
            return InFlight.issue(lambda: ss_entries(sh, a_at, b_at, tid))

        @cuda.jit(device=True)
        def rs_issue(sh, sm, acc, a, b_at, scratch):
            InFlight.issue(rs_gather(sh, sm, a, b_at, scratch), acc, a, accumulate)
        return dict(mma_ss=mma_ss, mma_rs=mma_rs, ss_issue=ss_issue, rs_issue=rs_issue,
                    rs_descriptor=lambda sh, b_at: b_at, regs=regs)

    class InFlightHazard(AssertionError):
        """A kernel used a product in flight as a GPU does not allow (the simulator's model
        below): an AssertionError, a failed check of the kernel as a wrong number is."""

    class InFlight:
        """Products issued asynchronously (ss_issue, rs_issue: one wgmma group each) on the
        simulator. A GPU's wgmma reads its shared-memory operands at some time between its
        issue and the wait_group that retires it, and its registers (A, and the accumulator
        it adds into) must be left alone until then. So the model computes an issued product
        twice, at its issue and at its retirement, and raises InFlightHazard where the two
        differ (a tile written, or not yet ready, while it was in flight) or its registers
        changed meanwhile; what ss_issue returns becomes the accumulators only at a wait that
        retires it. Each simulated thread keeps its own groups in issue order (a
        warpgroup's are the same in each of its threads) in its thread_state, as
        exchange_buffer its turns."""

        __slots__ = ("compute", "early", "acc", "acc_early", "a", "a_early", "add", "value")

        def __init__(self, compute, acc=None, a=None, add=None):
            self.compute, self.acc, self.a, self.add = compute, acc, a, add
            self.early = compute()
            self.acc_early = None if acc is None else np.array(acc, np.float32)
            self.a_early = None if a is None else np.array(a, np.uint32)
            self.value = None

        @classmethod
        def groups(cls):
            """This simulated thread's groups in flight, oldest first."""
            return thread_state().setdefault("wgmma groups", [])

        @classmethod
        def issue(cls, compute, acc=None, a=None, add=None):
            """A new group: compute() -> the product's entries (an array); add(acc, entries)
            where it accumulates into the array acc from register A words a."""
            group = cls(compute, acc, a, add)
            cls.groups().append(group)
            return group

        def retire(self):
            late = self.compute()
            if not np.array_equal(late, self.early, equal_nan=True):
                raise InFlightHazard("a wgmma's shared-memory operand changed between its "
                                     "issue and its wait (written, or not yet ready, while "
                                     "the product was in flight)")
            if self.acc is not None and not np.array_equal(
                    np.asarray(self.acc, np.float32).view(np.uint32),
                    self.acc_early.view(np.uint32)):
                raise InFlightHazard("a wgmma's accumulator was written while it was in "
                                     "flight")
            if self.a is not None and not np.array_equal(np.asarray(self.a, np.uint32),
                                                         self.a_early):
                raise InFlightHazard("a wgmma's register A operand was written while it was "
                                     "in flight")
            if self.add is None:
                self.value = tuple(float32(x) for x in late)
            else:
                self.add(self.acc, late)

    def wait_groups(pending):
        """wgmma.wait_group pending on the simulator: every group of this thread but the
        `pending` newest retired, oldest first."""
        groups = InFlight.groups()
        while len(groups) > pending:
            groups.pop(0).retire()

    def wait_all():
        wait_groups(0)

    @functools.lru_cache(maxsize=None)
    def make_wait(pending, acc_regs):
        """(wait_s, wait_acc) for wgmma.wait_group pending: the model's groups retired
        (above); wait_s(s) -> the accumulators of ss_issue's s, which must be retired by then;
        wait_acc(acc): no group left in flight adds into acc."""
        @device_function
        def wait_s(s):
            wait_groups(pending)
            if not isinstance(s, InFlight):
                raise TypeError(f"wait_s takes what ss_issue returned, got {type(s).__name__}")
            if s.value is None:
                raise InFlightHazard(f"a wgmma's accumulators read while it is in flight "
                                     f"(wait_group {pending} leaves it pending)")
            return s.value

        @device_function
        def wait_acc(acc):
            wait_groups(pending)
            if any(group.acc is acc for group in InFlight.groups()):
                raise InFlightHazard(f"a wgmma's accumulator array read while it is in "
                                     f"flight (wait_group {pending} leaves it pending)")
        return wait_s, wait_acc
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from .wgmma import shared_address

    _CVT = {"bfloat16": "cvt.rn.bf16x2.f32", "float16": "cvt.rn.f16x2.f32"}
    _PTX_TYPE = {"bfloat16": "bf16", "float16": "f16"}

    @functools.lru_cache(maxsize=None)
    def make_pack_half2(fmt):
        """pack_half2(lo, hi) -> uint32: lo and hi rounded to fmt, lo in the low half."""
        # cvt.rn.{bf16,f16}x2.f32 d, a, b puts a in the upper half, b in the lower
        text = f"{_CVT[fmt]} $0, $2, $1;"

        @intrinsic
        def pack_half2(typingctx, lo, hi):
            if lo != types.float32 or hi != types.float32:
                return None

            def codegen(context, builder, sig, args):
                fn = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
                return builder.call(ir.InlineAsm(fn, text, "=r,f,f"), list(args))
            return types.uint32(lo, hi), codegen
        return pack_half2

    # a bfloat16 is the high half of a float32; a float16 converts exactly
    _UNPACK = {"bfloat16": "shl.b32 $0, $1, 16;",
               "float16": "{ .reg .b16 h; cvt.u16.u32 h, $1; cvt.f32.f16 $0, h; }"}

    @functools.lru_cache(maxsize=None)
    def make_unpack_half(fmt):
        """unpack_half(bits: uint32) -> float32: the value of the 16-bit pattern in the low half."""
        text = _UNPACK[fmt]

        @intrinsic
        def unpack_half(typingctx, bits):
            if bits != types.uint32:
                return None

            def codegen(context, builder, sig, args):
                fn = ir.FunctionType(ir.FloatType(), [ir.IntType(32)])
                return builder.call(ir.InlineAsm(fn, text, "=f,r"), list(args))
            return types.float32(bits), codegen
        return unpack_half

    def _stmatrix_x4(transposed):
        """stmatrix.x4 (.trans where transposed) of four words at a shared address (u32)."""
        text = ("stmatrix.sync.aligned.m8n8.x4" + (".trans" if transposed else "")
                + ".shared.b16 [$0], {$1, $2, $3, $4};")

        @intrinsic
        def stmatrix(typingctx, address, w0, w1, w2, w3):
            if not all(x == types.uint32 for x in (address, w0, w1, w2, w3)):
                return None

            def codegen(context, builder, sig, args):
                i32 = ir.IntType(32)
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [i32] * 5), text,
                                   "r,r,r,r,r,~{memory}", side_effect=True)
                builder.call(asm, list(args))
                return context.get_dummy_value()
            return types.void(address, w0, w1, w2, w3), codegen
        return stmatrix

    def _store4(transposed):
        stmatrix = _stmatrix_x4(transposed)

        @cuda.jit(device=True, forceinline=True)
        def store4(sh, sm, at, words, first, scratch):
            # (numba types uint32 arithmetic as 64-bit: the address cast back)
            stmatrix(uint32(shared_address(sh) + uint32(2) * uint32(at)), uint32(words[first]),
                     uint32(words[first + 1]), uint32(words[first + 2]),
                     uint32(words[first + 3]))
        return store4

    store_transposed4, store_rows4 = _store4(True), _store4(False)

    @intrinsic
    def _ld_shared_v4(typingctx, address):
        if address != types.uint32:
            return None
        result = types.UniTuple(types.uint32, 4)

        def codegen(context, builder, sig, args):
            i32 = ir.IntType(32)
            # a side effect and the memory clobber: not moved across the stores and the
            # barrier before it
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([i32] * 4), [i32]),
                               "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];",
                               "=r,=r,=r,=r,r,~{memory}", side_effect=True)
            res = builder.call(asm, list(args))
            return context.make_tuple(builder, result,
                                      [builder.extract_value(res, i) for i in range(4)])
        return result(address), codegen

    @cuda.jit(device=True, forceinline=True)
    def load_shared16(sh, at):
        return _ld_shared_v4(uint32(shared_address(sh) + uint32(2) * uint32(at)))

    _OPERAND = {types.uint32: (ir.IntType(32), "r"), types.uint64: (ir.IntType(64), "l")}

    def tuple_asm(text, regs, operand, constants=(), clobber=False):
        """intrinsic(x, y) -> UniTuple(float32, regs): the PTX block `text`, its outputs
        $0 .. $(regs - 1) the accumulators, tied to inputs that start them at zero; x, y of
        numba type `operand` (uint32 or uint64) at $regs, $regs + 1, then the i32 `constants`
        ("r"). clobber: it reads memory the compiler must not move across it. A product of
        wgmma16 or mma16 from a fresh accumulator."""
        ll, c = _OPERAND[operand]
        constraints = ",".join(["=f"] * regs + [c, c] + ["r"] * len(constants)
                               + [str(i) for i in range(regs)]
                               + (["~{memory}"] if clobber else []))
        result = types.UniTuple(types.float32, regs)

        def codegen(context, builder, sig, llargs):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                                 [ll] * 2 + [i32] * len(constants) + [f32] * regs)
            asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
            res = builder.call(asm, list(llargs) + [ir.Constant(i32, k) for k in constants]
                               + [ir.Constant(f32, 0.0)] * regs)
            return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                        for i in range(regs)])

        @intrinsic
        def product(typingctx, x, y):
            if x != operand or y != operand:
                return None
            return result(x, y), codegen
        return product

    def array_asm(text, regs, n_a, operand, clobber=False):
        """intrinsic(acc, a, b) -> None: the PTX block `text` with acc (a local float32 array
        of regs entries) read and written back as its outputs $0 .. $(regs - 1), the words of
        a (a local uint32 array of n_a: $regs ..) and b of numba type `operand` (uint32 or
        uint64: $(regs + n_a)) as inputs; constant indices, so the arrays stay in registers
        once inlined. A product of wgmma16 or mma16 with A from registers."""
        ll, c = _OPERAND[operand]
        constraints = ",".join(["=f"] * regs + ["r"] * n_a + [c]
                               + [str(i) for i in range(regs)]
                               + (["~{memory}"] if clobber else []))

        def codegen(context, builder, sig, llargs):
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                                 [i32] * n_a + [ll] + [f32] * regs)
            asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
            acc_data = context.make_array(sig.args[0])(context, builder, llargs[0]).data
            a_data = context.make_array(sig.args[1])(context, builder, llargs[1]).data
            acc_ptrs = [builder.gep(acc_data, [ir.Constant(i64, i)]) for i in range(regs)]
            words = [builder.load(builder.gep(a_data, [ir.Constant(i64, i)]))
                     for i in range(n_a)]
            res = builder.call(asm, words + [llargs[2]]
                               + [builder.load(p) for p in acc_ptrs])
            for i, p in enumerate(acc_ptrs):
                builder.store(builder.extract_value(res, i), p)
            return context.get_dummy_value()

        @intrinsic
        def product(typingctx, acc, a, b):
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32
                    and isinstance(a, types.Array) and a.dtype == types.uint32
                    and b == operand):
                return None
            return types.void(acc, a, b), codegen
        return product

    def _ss_intrinsic(n, a_steps, b_steps, fmt, b_trans, wait=True):
        """A B^T over len(a_steps) k16 steps, both operands by descriptor (step 0's; step s
        adds a_steps[s] to A's, b_steps[s] to B's: 16-byte units of the address field), B
        transposed (MN-major) if b_trans, chained in a fresh accumulator (scale-d false on the
        first), one wait."""
        regs = n // 2
        t = _PTX_TYPE[fmt]
        lines = ["{", ".reg .pred p;", ".reg .b64 ad, bd;",
                 f"setp.ne.b32 p, ${regs + 2}, 0;", "wgmma.fence.sync.aligned;"]
        acc = "{" + ", ".join(f"${i}" for i in range(regs)) + "}"
        for s, (a_step, b_step) in enumerate(zip(a_steps, b_steps)):
            lines += [f"add.s64 ad, ${regs}, {a_step};",
                      f"add.s64 bd, ${regs + 1}, {b_step};",
                      f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {acc}, ad, bd, "
                      f"{'p' if s == 0 else '1'}, 1, 1, 0, {int(b_trans)};"]
        lines += ["wgmma.commit_group.sync.aligned;"]
        lines += ["wgmma.wait_group.sync.aligned 0;", "}"] if wait else ["}"]
        # operands: the two descriptors, then the scale-d predicate's 0 (a fresh accumulator)
        return tuple_asm("\n".join(lines), regs, types.uint64, constants=(0,))

    def _rs_intrinsic(n, b_steps, fmt, b_trans, wait=True):
        """acc += A B^T over len(b_steps) k16 steps, A from registers (a local uint32 array, 4
        words a step), B by descriptor (step 0's; step s adds b_steps[s]), transposed
        (MN-major) if b_trans, accumulated in the tensor core into acc (a local float32 array
        of n / 2, read and written back), one wait."""
        regs = n // 2
        n_a = 4 * len(b_steps)
        t = _PTX_TYPE[fmt]
        lines = ["{", ".reg .b64 bd;", "wgmma.fence.sync.aligned;"]
        acc = "{" + ", ".join(f"${i}" for i in range(regs)) + "}"
        for s, b_step in enumerate(b_steps):
            a = "{" + ", ".join(f"${regs + 4 * s + i}" for i in range(4)) + "}"
            lines += [f"add.s64 bd, ${regs + n_a}, {b_step};",
                      f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {acc}, {a}, bd, "
                      f"1, 1, 1, {int(b_trans)};"]
        lines += ["wgmma.commit_group.sync.aligned;"]
        lines += ["wgmma.wait_group.sync.aligned 0;", "}"] if wait else ["}"]
        return array_asm("\n".join(lines), regs, n_a, types.uint64)

    def _products16(n, KA, KB, fmt, b_rows, swizzle):
        """products16 on a GPU: the wgmma instructions."""
        trans = b_rows is not None
        if swizzle:
            # 128-byte swizzle (mode 1 in bits 62-63): K-major, SBO = 1024 bytes (8 rows of
            # 128), LBO unused (1), a k16 step 32 bytes into a 64-column box, the next box R
            # rows x 128 bytes further (R: the tile's rows, 64 for A, n for B); transposed
            # (MN-major), LBO = the next 64 columns (R 128 bytes, R the tile's rows: the
            # contraction), SBO = 1024 bytes, a k16 step 16 rows (2048 bytes)
            mode = uint64(1) << uint64(62)
            k_steps = lambda R, K: tuple((s // 4) * 8 * R + 2 * (s % 4)      # noqa: E731
                                         for s in range(K // STEP16))
            a_ss = (uint64(1), uint64(64), mode)
            a_steps = k_steps(64, KA)
            if trans:
                b_ss, b_rs = ((uint64(8 * K), uint64(64), mode) for K in (KA, KB))
                b_ss_steps, b_rs_steps = (tuple(128 * s for s in range(K // STEP16))
                                          for K in (KA, KB))
            else:
                b_ss = b_rs = a_ss
                b_ss_steps, b_rs_steps = k_steps(n, KA), k_steps(n, KB)
        else:
            # descriptor fields in 16-byte units: (LBO, SBO) of a K-major tile, K-major A (K
            # columns) and B; a transposed B's (see the module); the steps
            k_major = lambda K: (uint64(128 >> 4), uint64(16 * K >> 4), uint64(0))  # noqa: E731
            a_ss, b_ss, b_rs = k_major(KA), k_major(KA), k_major(KB)
            b_step = 16
            if trans:
                b_ss = b_rs = (uint64(16 * b_rows >> 4), uint64(128 >> 4), uint64(0))
                b_step = 2 * b_rows
            a_steps = tuple(16 * s for s in range(KA // STEP16))
            b_ss_steps = tuple(b_step * s for s in range(KA // STEP16))
            b_rs_steps = tuple(b_step * s for s in range(KB // STEP16))
        ss = _ss_intrinsic(n, a_steps, b_ss_steps, fmt, trans)
        rs = _rs_intrinsic(n, b_rs_steps, fmt, trans)
        ss_async = _ss_intrinsic(n, a_steps, b_ss_steps, fmt, trans, wait=False)
        rs_async = _rs_intrinsic(n, b_rs_steps, fmt, trans, wait=False)

        @cuda.jit(device=True)
        def descriptor(base, at, lbo_sbo):
            addr = base + uint32(2 * at)            # at: a 16-bit element offset
            return (uint64((addr & 0x3FFFF) >> 4) | (lbo_sbo[0] << uint64(16))
                    | (lbo_sbo[1] << uint64(32)) | lbo_sbo[2])

        @cuda.jit(device=True)
        def mma_ss(sh, a_at, b_at):
            base = shared_address(sh)
            return ss(descriptor(base, a_at, a_ss), descriptor(base, b_at, b_ss))

        @cuda.jit(device=True)
        def mma_rs(sh, sm, acc, a, b_at, scratch):
            rs(acc, a, descriptor(shared_address(sh), b_at, b_rs))

        @cuda.jit(device=True)
        def ss_issue(sh, a_at, b_at):
            base = shared_address(sh)
            return ss_async(descriptor(base, a_at, a_ss), descriptor(base, b_at, b_ss))

        @cuda.jit(device=True)
        def rs_issue(sh, sm, acc, a, b_desc, scratch):
            rs_async(acc, a, b_desc)

        @cuda.jit(device=True)
        def rs_descriptor(sh, b_at):
            return descriptor(shared_address(sh), b_at, b_rs)
        return dict(mma_ss=mma_ss, mma_rs=mma_rs, ss_issue=ss_issue, rs_issue=rs_issue,
                    rs_descriptor=rs_descriptor, regs=n // 2)

    def _wait_tuple(pending):
        """wait_s(s) -> s: wgmma.wait_group pending, a tuple of accumulators passed through
        (tied), so that their uses come after it."""
        text = f"wgmma.wait_group.sync.aligned {int(pending)};"

        @intrinsic
        def wait_s(typingctx, s):
            if not (isinstance(s, types.UniTuple) and s.dtype == types.float32):
                return None
            regs = s.count

            def codegen(context, builder, sig, args):
                f32 = ir.FloatType()
                fn = ir.FunctionType(ir.LiteralStructType([f32] * regs), [f32] * regs)
                asm = ir.InlineAsm(fn, text, ",".join(["=f"] * regs
                                                      + [str(i) for i in range(regs)]),
                                   side_effect=True)
                res = builder.call(asm, [builder.extract_value(args[0], i)
                                         for i in range(regs)])
                return context.make_tuple(builder, sig.return_type,
                                          [builder.extract_value(res, i) for i in range(regs)])
            return s(s), codegen
        return wait_s

    def _wait_array(pending, regs):
        """wait_acc(acc): wgmma.wait_group pending, the `regs` accumulators of a local float32
        array passed through (tied), read and written back at constant indices."""
        text = f"wgmma.wait_group.sync.aligned {int(pending)};"

        @intrinsic
        def wait_acc(typingctx, acc):
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32):
                return None

            def codegen(context, builder, sig, args):
                f32, i64 = ir.FloatType(), ir.IntType(64)
                data = context.make_array(sig.args[0])(context, builder, args[0]).data
                ptrs = [builder.gep(data, [ir.Constant(i64, i)]) for i in range(regs)]
                fn = ir.FunctionType(ir.LiteralStructType([f32] * regs), [f32] * regs)
                asm = ir.InlineAsm(fn, text, ",".join(["=f"] * regs
                                                      + [str(i) for i in range(regs)]),
                                   side_effect=True)
                res = builder.call(asm, [builder.load(p) for p in ptrs])
                for i, p in enumerate(ptrs):
                    builder.store(builder.extract_value(res, i), p)
                return context.get_dummy_value()
            return types.void(acc), codegen
        return wait_acc

    @functools.lru_cache(maxsize=None)
    def make_wait(pending, acc_regs):
        """(wait_s, wait_acc) for wgmma.wait_group pending: wait_s(s) -> s for an issued
        ss_issue's tuple, wait_acc(acc) for an issued rs_issue's accumulator array of
        acc_regs entries."""
        return _wait_tuple(pending), _wait_array(pending, acc_regs)


@functools.lru_cache(maxsize=None)
def products16(n, KA, KB, fmt, b_rows=None, swizzle=False):
    """dict(mma_ss=..., mma_rs=..., regs=n // 2) for a 64 x n block of 16-bit products in
    format fmt: mma_ss with A 64 x KA and B n x KA tiles, mma_rs with a register A 64 x KB and
    B an n x KB tile; b_rows=W: B read transposed from a W-column tile whose rows are the
    contraction (see the module); swizzle: every tile in TMA's 128-byte swizzled layout, 1024-
    byte aligned (the module; contractions and a transposed n multiples of 64); ValueError for
    shapes wgmma lacks."""
    _check(fmt, n, KA)
    _check(fmt, n, KB)
    if b_rows is not None and (b_rows % 8 or b_rows < n):
        raise ValueError(f"a transposed B needs a tile of at least n={n} columns, a multiple "
                         f"of 8, got b_rows={b_rows}")
    if swizzle and (KA % 64 or KB % 64 or (b_rows is not None and n % 64)):
        raise ValueError(f"swizzled tiles are 64-column boxes: the contractions (KA={KA}, "
                         f"KB={KB}) and a transposed B's n={n} must be multiples of 64")
    return _products16(n, KA, KB, fmt, b_rows, swizzle)
