"""Hopper warpgroup products (wgmma, sm_90a) for Numba kernels: TF32 operands in shared memory,
float32 accuracy by the 3xTF32 split, one warpgroup (4 consecutive warps, 128 threads, the
first warp's index a multiple of 4) per product. Used by sm90/forward.py, backward.py
and dq.py, the registered "wgmma" pair (docs/performance.md, perf notes versions 13 and 14).

Layout. wgmma reads TF32 operands from shared memory only K-major, as "core matrices" of 8 rows
x 16 bytes (8 x 4 TF32). Here a rows x K tile puts each core matrix's rows next to each other
and K-neighbouring core matrices next to each other (no swizzling): element (r, k) sits at
`core_offset(r, k, K)` floats,

    ((r // 8) * (K // 4) + k // 4) * 32 + (r % 8) * 4 + k % 4,

and its descriptor has LBO = 128 bytes (the next core matrix along K) and SBO = 32 K bytes
(the next 8 rows); a step of 8 along K starts 64 floats further. A kernel stages each operand
once as two such tiles, its big and small TF32 parts (mma.split_tf32), so that no product
loads or splits it again.

`products(n, KA, KB)` gives, for a 64 x n block, A 64 x KA and B n x KB in that layout at
float offsets into the shared array sm (multiples of 32):

    step_3xtf32(sm, a_big, a_small, b_big, b_small, s)
        the block of A[:, 8s:8s+8] B[:, 8s:8s+8]^T as small_a big_b + big_a small_b +
        big_a big_b, summed on the tensor core from zero: a tuple of n / 2 float32 per thread,
        entry j at `position(j, warp, lane)` (warp = the warp's index in its warpgroup).
    step_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch)
        the same with A from registers: a_big, a_small tuples of 4 float32, the thread's
        entries at `a_fragment_index` of the step's 64 x 8 A (mma.m16n8k8's A fragment).
    step2_3xtf32 / step2_3xtf32_regs
        two such products (eight operands) in one fence / commit / wait: 2 x n / 2 entries.
    chained2_3xtf32(sm, <eight operands>)
        two whole products (KA // 8 steps each), chained in the tensor core's accumulators,
        one wait.
    chained_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch)
        steps s..s + CHAIN of one product with A from registers (a_big, a_small: local arrays
        of 4 CHAIN float32, step s + c's fragment at 4 c..), chained in one fresh accumulator,
        one wait: what the registered wide pair and the d <= 64 forward's P V use (perf notes,
        version 16).
Kernels add the steps of step_* (or the chained sums) in float32 themselves; chaining in the
accumulator costs some accuracy (below).

On an H200 (2026-11-29 and -30, tools/wgmma_probe.py, tests/test_wgmma.py): the layout and
descriptor fields give A B^T exactly on TF32 inputs, A from registers too; wgmma m64n128k8 TF32
runs 407-467 TFLOP/s (mma.sync m16n8k8 280-309); 3xTF32 with each step from zero errs 2.2-3.9
units of roundoff of sum |ab| at K = 32 / 64 (NumPy float32 1.2-2.6), chained in the
accumulator 5.3-19; A B^T is not always bitwise (B A^T)^T (2 of 4096 entries differed).

On the simulator (no warpgroup-wide instructions) each thread computes its own entries from the
shared array with reference.precision.step_3xtf32_parts, the same model as fa2_mma's; a register
A operand goes through `SCRATCH` floats of shared memory at `scratch` there (unused on a GPU),
one barrier per product, pair of products or chain (see GATHER).
The chained products are modelled as one exact sum rounded once, not the tensor core's chain.
"""

import functools

import numpy as np
from numba import cuda, float32, types, uint32, uint64

from reference.precision import step_3xtf32_exact, step_3xtf32_parts

from ..support import SIMULATOR, device_function, thread_state, warpgroup_barrier

STEP = 8           # contraction per wgmma for TF32 (K)
CORE = 32          # floats per core matrix (8 rows x 4)
WARPGROUP = 128    # threads


def core_offset_host(r, k, K):
    """core_offset in NumPy (r, k arrays of indices; K the tile's contraction length)."""
    r, k = np.asarray(r), np.asarray(k)
    return ((r // 8) * (K // 4) + k // 4) * CORE + (r % 8) * 4 + k % 4


@device_function
def core_offset(r, k, K):
    """Float offset of element (r, k) of a K-major tile with K columns (see the module)."""
    return ((r // 8) * (K // 4) + k // 4) * CORE + (r % 8) * 4 + k % 4


@device_function
def position(j, warp, lane):
    """(row, column) in the 64 x n block of accumulator entry j of thread `lane` of warp `warp`
    (0-3 within the warpgroup): rows g and g + 8 of the warp's 16, columns 2t and 2t + 1 of
    each 8-column group, as mma.m16n8k8's C fragment."""
    g, t = lane // 4, lane % 4
    return warp * 16 + g + 8 * ((j % 4) // 2), (j // 4) * 8 + 2 * t + j % 2


@device_function
def a_fragment_index(e, warp, lane):
    """(row, k) in the 64 x 8 A operand of a step of entry e (0-3) of the register A fragment
    that thread `lane` of warp `warp` passes: rows g and g + 8 of the warp's 16, k = t for
    e = 0, 1 and t + 4 for e = 2, 3 (mma.m16n8k8's A fragment)."""
    g, t = lane // 4, lane % 4
    return warp * 16 + g + 8 * (e % 2), t + 4 * (e // 2)


# steps of one chained_3xtf32_regs product: 4 keeps the wide forward's A fragments and fresh
# accumulator in registers (with 8 it spilled, and under causal ptxas serialized the wgmma)
CHAIN = 4

# The simulator's exchanges between a warpgroup's threads (it has no warp-wide instructions):
# each thread writes its part into shared memory at `scratch`, one barrier of the warpgroup
# (simulator.warpgroup_barrier: what the warpgroup's instruction orders on a GPU, and no
# more), each reads what it needs. Two buffers of each kind, taken in turn by every thread,
# make a second barrier (before the next write) unnecessary: a thread rewrites a buffer two
# exchanges later, past the barrier of the exchange between, which no thread passes before
# every thread has done its reads of this one. A barrier cost ~6 ms of 128 simulated threads
# (17 ms of 256; ~3 ms of 128 in turns, 2026-12-06); with one exchange per pair of products or
# chain, a simulated wgmma forward + backward at d = 32 took 77 barriers where it took 257
# (most of the time saved came from round_tf32 and cached index arrays).
GATHER = CHAIN * 2 * 64 * STEP   # floats: up to CHAIN steps' register A fragments, big and small
QUAD = WARPGROUP                 # floats: one value a thread
SCRATCH = 2 * GATHER + 2 * QUAD  # floats of shared memory a warpgroup's exchanges need there


# Row reductions over a quad (lanes 4g..4g+3 hold the same two rows of a C fragment) and a
# warp's vote (warp_any): warp shuffles and vote.any on a GPU; the simulator has none, so there
# the quad's values go through shared memory (every thread of the warpgroup must call it). The
# order of the additions is the same both ways: (x0 + x1) + (x2 + x3), in any thread.
if SIMULATOR:
    def exchange_buffer(kind):
        """0, 1, 0, 1, ...: this thread's next buffer of `kind` (from 0 in each block)."""
        turns = thread_state()
        n = turns.get(kind, 0)
        turns[kind] = n + 1
        return n % 2

    @cuda.jit(device=True)
    def exchange_in_warp(sm, at, x):
        """Every thread posts x (one float) in its warpgroup's exchange buffer at `at`, one
        barrier (every thread of the warpgroup calls it); returns where in sm the values of
        this thread's warp begin (lane l's at that + l)."""
        tid = cuda.threadIdx.x % WARPGROUP
        base = at + 2 * GATHER + exchange_buffer("quad") * QUAD
        sm[base + tid] = x
        warpgroup_barrier()
        return base + tid - tid % 32

    @cuda.jit(device=True)
    def _quad_values(sm, at, x):
        lane = cuda.threadIdx.x % 32
        b = exchange_in_warp(sm, at, x) + lane - lane % 4
        return sm[b], sm[b + 1], sm[b + 2], sm[b + 3]

    @cuda.jit(device=True)
    def quad_max(sm, at, x):
        """max of x over the thread's quad."""
        x0, x1, x2, x3 = _quad_values(sm, at, x)
        return max(max(x0, x1), max(x2, x3))

    @cuda.jit(device=True)
    def quad_sum(sm, at, x):
        """sum of x over the thread's quad, (x0 + x1) + (x2 + x3)."""
        x0, x1, x2, x3 = _quad_values(sm, at, x)
        return (x0 + x1) + (x2 + x3)

    @cuda.jit(device=True)
    def warp_any(sm, at, pred):
        """True where pred is true in any thread of this thread's warp."""
        w = exchange_in_warp(sm, at, 1.0 if pred else 0.0)
        return max(sm[w:w + 32]) != 0.0
else:
    @cuda.jit(device=True)
    def quad_max(sm, at, x):
        """max of x over the thread's quad."""
        x = max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 1))
        return max(x, cuda.shfl_xor_sync(0xFFFFFFFF, x, 2))

    @cuda.jit(device=True)
    def quad_sum(sm, at, x):
        """sum of x over the thread's quad, (x0 + x1) + (x2 + x3)."""
        x = x + cuda.shfl_xor_sync(0xFFFFFFFF, x, 1)
        return x + cuda.shfl_xor_sync(0xFFFFFFFF, x, 2)

    @cuda.jit(device=True)
    def warp_any(sm, at, pred):
        """True where pred is true in any thread of this thread's warp (vote.any)."""
        return cuda.any_sync(0xFFFFFFFF, pred)


if SIMULATOR:
    @device_function
    def opaque_zero():
        """0 (on a GPU: a 0 the compiler cannot see through; see there)."""
        return np.uint32(0)

    @device_function
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
    def opaque_zero(typingctx):
        """A uint32 0 from an asm block with side effects: the compiler can neither fold it nor
        move it out of a loop, so an address offset by it is loaded where it is written. For
        loop-invariant global loads LLVM would otherwise hoist out of a loop into registers
        (sm90.forward's wide kernel: Q's fragments for every step, 128 registers, spilled)."""
        def codegen(context, builder, sig, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.IntType(32), []), "mov.u32 $0, 0;", "=r",
                               side_effect=True)
            return builder.call(asm, [])
        return types.uint32(), codegen

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

    def _step_lines(mma, big, small, bb, bs, first, exact):
        """The wgmma lines of one 3xTF32 step: small_a big_b, big_a small_b, big_a big_b (the
        first with scale-d p, a fresh accumulator, when `first`), less the product whose
        operand part is zero: exact "a" (A exact in TF32: its small part is 0) drops the
        first, "b" the second. The dropped product adds exact zeros, so the sum is the same."""
        terms = [(small, bb), (big, bs), (big, bb)]
        if exact == "a":
            terms.pop(0)
        elif exact == "b":
            terms.pop(1)
        return [f"{mma}, {a}, {b}, {'p' if first and i == 0 else '1'}, 1, 1;"
                for i, (a, b) in enumerate(terms)]

    def _steps_intrinsic(n, kinds, exact=None):
        """One 3xTF32 step of len(kinds) products in one wgmma.fence / commit / wait block:
        for each, wgmma m64n{n}k8 TF32 of (a_small, b_big), (a_big, b_small), (a_big, b_big)
        into fresh accumulators (the first with scale-d false). Arguments per product: a_big,
        a_small (shared-memory descriptors for kind "smem", tuples of 4 float32 for "regs": the
        mma.m16n8k8 A fragment of the thread's warp's 16 rows), b_big, b_small (descriptors).
        Returns the products' n / 2 accumulator entries one after the other."""
        regs = n // 2
        outs = len(kinds) * regs
        lines = ["{", ".reg .pred p;", "setp.ne.b32 p, ${zero}, 0;",
                 "wgmma.fence.sync.aligned;"]
        at, constraints, types_in = outs, [], []
        for x, kind in enumerate(kinds):
            acc = "{" + ", ".join(f"${x * regs + i}" for i in range(regs)) + "}"
            mma = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {acc}"
            if kind == "regs":
                big = "{" + ", ".join(f"${at + i}" for i in range(4)) + "}"
                small = "{" + ", ".join(f"${at + 4 + i}" for i in range(4)) + "}"
                constraints += ["r"] * 8
                types_in += [ir.IntType(32)] * 8
                at += 8
            else:
                big, small = f"${at}", f"${at + 1}"
                constraints += ["l"] * 2
                types_in += [ir.IntType(64)] * 2
                at += 2
            bb, bs = f"${at}", f"${at + 1}"
            constraints += ["l"] * 2
            types_in += [ir.IntType(64)] * 2
            at += 2
            lines += _step_lines(mma, big, small, bb, bs, True, exact)
        lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
        text = "\n".join(lines).replace("${zero}", f"${at}")
        constraints = ",".join(["=f"] * outs + constraints + ["r"]
                               + [str(i) for i in range(outs)])
        result = types.UniTuple(types.float32, outs)
        quad = types.UniTuple(types.float32, 4)

        def typing(args):
            want = [quad if k == "regs" else types.uint64 for k in kinds for _ in (0, 1)]
            if any(args[4 * x + y] != want[2 * x + y] for x in range(len(kinds))
                   for y in (0, 1)):
                return None
            return result(*args), codegen

        def codegen(context, builder, sig, llargs):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * outs),
                                 types_in + [i32] + [f32] * outs)
            asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
            ops = []
            for x, kind in enumerate(kinds):
                a_big, a_small, b_big, b_small = llargs[4 * x:4 * x + 4]
                if kind == "regs":
                    ops += [builder.bitcast(builder.extract_value(a, i), i32)
                            for a in (a_big, a_small) for i in range(4)]
                else:
                    ops += [a_big, a_small]
                ops += [b_big, b_small]
            zero = ir.Constant(f32, 0.0)
            res = builder.call(asm, ops + [ir.Constant(i32, 0)] + [zero] * outs)
            return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                        for i in range(outs)])

        if len(kinds) == 1:
            @intrinsic
            def steps(typingctx, a_big, a_small, b_big, b_small):
                return typing((a_big, a_small, b_big, b_small))
        else:
            @intrinsic
            def steps(typingctx, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                      b2_small):
                return typing((a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                               b2_small))
        return steps


    def _chained_intrinsic(n, products_, steps, exact=None):
        """`products_` products of `steps` 3xTF32 steps each, all operands in shared memory,
        chained in the tensor core's accumulators (one fresh accumulator per product, scale-d
        false on its first wgmma) in one fence / commit / wait block. Arguments per product:
        the four descriptors of step 0 (a_big, a_small, b_big, b_small); step s adds 256 s
        bytes (16 s in the descriptors' address field, which counts 16-byte units)."""
        regs = n // 2
        outs = products_ * regs
        lines = ["{", ".reg .pred p;", ".reg .b64 ab, as, bb, bs;",
                 f"setp.ne.b32 p, ${outs + 4 * products_}, 0;", "wgmma.fence.sync.aligned;"]
        for x in range(products_):
            acc = "{" + ", ".join(f"${x * regs + i}" for i in range(regs)) + "}"
            mma = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {acc}"
            a = outs + 4 * x
            for s in range(steps):
                lines += [f"add.s64 {r}, ${a + i}, {16 * s};"
                          for i, r in enumerate(("ab", "as", "bb", "bs"))]
                lines += _step_lines(mma, "ab", "as", "bb", "bs", s == 0, exact)
        lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
        text = "\n".join(lines)
        constraints = ",".join(["=f"] * outs + ["l"] * (4 * products_) + ["r"]
                               + [str(i) for i in range(outs)])
        result = types.UniTuple(types.float32, outs)

        def codegen(context, builder, sig, llargs):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * outs),
                                 [ir.IntType(64)] * (4 * products_) + [i32] + [f32] * outs)
            asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
            zero = ir.Constant(f32, 0.0)
            res = builder.call(asm, list(llargs) + [ir.Constant(i32, 0)] + [zero] * outs)
            return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                        for i in range(outs)])
        assert products_ == 2      # the text is general; the intrinsic below takes two products

        @intrinsic
        def chained(typingctx, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                    b2_small):
            args = (a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big, b2_small)
            if any(x != types.uint64 for x in args):
                return None
            return result(*args), codegen
        return chained

    def _chained_regs_intrinsic(n, steps, exact=None):
        """One product of `steps` 3xTF32 steps with A from registers, chained in a fresh
        accumulator (scale-d false on its first wgmma), in one fence / commit / wait block.
        Arguments: a_big, a_small (local float32 arrays of 4 steps entries: step s's A fragment
        at 4 s..4 s + 3, wgmma.a_fragment_index's order), b_big, b_small (descriptors of step
        0; step s adds 256 s bytes, as _chained_intrinsic's)."""
        regs = n // 2
        n_a = 8 * steps
        lines = ["{", ".reg .pred p;", ".reg .b64 bb, bs;",
                 f"setp.ne.b32 p, ${regs + n_a + 2}, 0;", "wgmma.fence.sync.aligned;"]
        acc = "{" + ", ".join(f"${i}" for i in range(regs)) + "}"
        mma = f"wgmma.mma_async.sync.aligned.m64n{n}k8.f32.tf32.tf32 {acc}"
        for s in range(steps):
            big = "{" + ", ".join(f"${regs + 4 * s + i}" for i in range(4)) + "}"
            small = "{" + ", ".join(f"${regs + 4 * steps + 4 * s + i}" for i in range(4)) + "}"
            lines += [f"add.s64 bb, ${regs + n_a}, {16 * s};",
                      f"add.s64 bs, ${regs + n_a + 1}, {16 * s};",
                      *_step_lines(mma, big, small, "bb", "bs", s == 0, exact)]
        lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
        text = "\n".join(lines)
        constraints = ",".join(["=f"] * regs + ["r"] * n_a + ["l", "l", "r"]
                               + [str(i) for i in range(regs)])
        result = types.UniTuple(types.float32, regs)

        def codegen(context, builder, sig, llargs):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            fn = ir.FunctionType(ir.LiteralStructType([f32] * regs),
                                 [i32] * n_a + [ir.IntType(64)] * 2 + [i32] + [f32] * regs)
            asm = ir.InlineAsm(fn, text, constraints, side_effect=True)
            ops = []
            for x in range(2):          # big, then small: constant indices, kept in registers
                data = context.make_array(sig.args[x])(context, builder, llargs[x]).data
                ops += [builder.bitcast(builder.load(builder.gep(
                    data, [ir.Constant(ir.IntType(64), i)])), i32) for i in range(4 * steps)]
            zero = ir.Constant(f32, 0.0)
            res = builder.call(asm, ops + list(llargs[2:4]) + [ir.Constant(i32, 0)]
                               + [zero] * regs)
            return context.make_tuple(builder, result, [builder.extract_value(res, i)
                                                        for i in range(regs)])

        @intrinsic
        def chained(typingctx, a_big, a_small, b_big, b_small):
            arrays = (a_big, a_small)
            if any(not isinstance(a, types.Array) or a.dtype != types.float32 for a in arrays):
                return None
            if b_big != types.uint64 or b_small != types.uint64:
                return None
            return result(*(a_big, a_small, b_big, b_small)), codegen
        return chained


@functools.lru_cache(maxsize=None)
def products(n, KA, KB, exact=None):
    """dict(step_3xtf32=..., regs=n // 2) for a 64 x n block, A 64 x KA and B n x KB (see the
    module); ValueError unless n is 8..256 in steps of 8 and KA, KB multiples of 8.
    exact: None, or "a" / "b" when that operand holds values exact in TF32 (half inputs
    widened to float32: their small parts are zero), whose product with the zero part is
    then not issued (two wgmma a step where 3xTF32 takes three; the same sums). On the
    simulator the model sums every part either way."""
    if exact not in (None, "a", "b"):
        raise ValueError(f"exact must be None, 'a' or 'b', got {exact!r}")
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

        def gather(sm, scratch, fragments):
            """The warpgroup's register A fragments, one (big, small) pair of 4-entry
            sequences per step, into one of the two gather buffers at sm[scratch:] (step x's
            64 rows x 8 at x * 1024, big then small); one barrier; returns where."""
            warp, lane = (cuda.threadIdx.x % WARPGROUP) // 32, cuda.threadIdx.x % 32
            at = scratch + exchange_buffer("gather") * GATHER
            for x, (big, small) in enumerate(fragments):
                for e in range(4):
                    r, k = a_fragment_index(e, warp, lane)
                    sm[at + x * 2 * 64 * STEP + r * STEP + k] = big[e]
                    sm[at + x * 2 * 64 * STEP + 64 * STEP + r * STEP + k] = small[e]
            warpgroup_barrier()
            return at

        @functools.lru_cache(maxsize=None)
        def step_indices(warp, lane, s):
            """(ka, kb): the thread's A rows in a gathered step, its B entries of step s (index
            arrays, regs x 8, computed once per thread and step: they were a tenth of the
            model's time)."""
            r, c = entries(warp, lane)
            return (r[:, None] * STEP + np.arange(STEP),
                    core_offset_host(c[:, None], STEP * s + np.arange(STEP), KB))

        def exact_step(sm, at, x, b_big, b_small, s):
            """The thread's entries of step s against B, A = gathered step x, exact (float64)."""
            ka, kb = step_indices((cuda.threadIdx.x % WARPGROUP) // 32, cuda.threadIdx.x % 32,
                                  int(s))
            ka = ka + (at + x * 2 * 64 * STEP)
            return step_3xtf32_exact(sm[ka], sm[64 * STEP + ka], sm[b_big + kb],
                                     sm[b_small + kb])

        def rounded(exact):
            """float32 entries of an exact sum as a tuple (what the tensor core returns)."""
            return tuple(exact.astype(np.float32))

        @cuda.jit(device=True)
        def step_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch):
            # step_3xtf32_parts' sums: exact, rounded once
            at = gather(sm, scratch, ((a_big, a_small),))
            return rounded(exact_step(sm, at, 0, b_big, b_small, s))

        @cuda.jit(device=True)
        def step2_3xtf32(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                         b2_small, s):
            return (step_3xtf32(sm, a_big, a_small, b_big, b_small, s)
                    + step_3xtf32(sm, a2_big, a2_small, b2_big, b2_small, s))

        @cuda.jit(device=True)
        def step2_3xtf32_regs(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                              b2_small, s, scratch):
            at = gather(sm, scratch, ((a_big, a_small), (a2_big, a2_small)))
            return rounded(np.concatenate((exact_step(sm, at, 0, b_big, b_small, s),
                                           exact_step(sm, at, 1, b2_big, b2_small, s))))
        @cuda.jit(device=True)
        def chained2_3xtf32(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                            b2_small):
            # modelled as one exact sum over the whole contraction, rounded once (the tensor
            # core's own chained additions are not modelled)
            r, c = entries((cuda.threadIdx.x % WARPGROUP) // 32, cuda.threadIdx.x % 32)
            k = np.arange(KA)
            ka = core_offset_host(r[:, None], k, KA)
            kb = core_offset_host(c[:, None], k, KB)
            out = tuple(step_3xtf32_parts(sm[a_big + ka], sm[a_small + ka], sm[b_big + kb],
                                          sm[b_small + kb]))
            out2 = tuple(step_3xtf32_parts(sm[a2_big + ka], sm[a2_small + ka],
                                           sm[b2_big + kb], sm[b2_small + kb]))
            return tuple(float32(x) for x in out + out2)

        @cuda.jit(device=True)
        def chained_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s0, scratch):
            # modelled as chained2_3xtf32: the exact sum over the steps, rounded once
            at = gather(sm, scratch, [(a_big[4 * s:4 * s + 4], a_small[4 * s:4 * s + 4])
                                      for s in range(CHAIN)])
            return rounded(sum(exact_step(sm, at, s, b_big, b_small, s0 + s)
                               for s in range(CHAIN)))
        return dict(step_3xtf32=step_3xtf32, step_3xtf32_regs=step_3xtf32_regs,
                    step2_3xtf32=step2_3xtf32, step2_3xtf32_regs=step2_3xtf32_regs,
                    chained2_3xtf32=chained2_3xtf32, chained_3xtf32_regs=chained_3xtf32_regs,
                    regs=regs)

    smem1 = _steps_intrinsic(n, ("smem",), exact)
    regs1 = _steps_intrinsic(n, ("regs",), exact)
    smem2 = _steps_intrinsic(n, ("smem", "smem"), exact)
    regs2 = _steps_intrinsic(n, ("regs", "regs"), exact)
    sbo_a, sbo_b = uint64(CORE * 4 * (KA // 4)) >> 4, uint64(CORE * 4 * (KB // 4)) >> 4
    lbo = uint64(CORE * 4) >> 4

    @cuda.jit(device=True)
    def descriptor(base, offset, s, sbo):
        addr = base + uint32(4 * (offset + 2 * CORE * s))    # 2 core matrices per step
        return uint64((addr & 0x3FFFF) >> 4) | (lbo << 16) | (sbo << 32)

    @cuda.jit(device=True)
    def step_3xtf32(sm, a_big, a_small, b_big, b_small, s):
        base = shared_address(sm)
        return smem1(descriptor(base, a_big, s, sbo_a), descriptor(base, a_small, s, sbo_a),
                     descriptor(base, b_big, s, sbo_b), descriptor(base, b_small, s, sbo_b))

    @cuda.jit(device=True)
    def step_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch):
        base = shared_address(sm)
        return regs1(a_big, a_small, descriptor(base, b_big, s, sbo_b),
                     descriptor(base, b_small, s, sbo_b))

    @cuda.jit(device=True)
    def step2_3xtf32(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                     b2_small, s):
        base = shared_address(sm)
        return smem2(descriptor(base, a_big, s, sbo_a), descriptor(base, a_small, s, sbo_a),
                     descriptor(base, b_big, s, sbo_b), descriptor(base, b_small, s, sbo_b),
                     descriptor(base, a2_big, s, sbo_a), descriptor(base, a2_small, s, sbo_a),
                     descriptor(base, b2_big, s, sbo_b), descriptor(base, b2_small, s, sbo_b))

    @cuda.jit(device=True)
    def step2_3xtf32_regs(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                          b2_small, s, scratch):
        base = shared_address(sm)
        return regs2(a_big, a_small, descriptor(base, b_big, s, sbo_b),
                     descriptor(base, b_small, s, sbo_b), a2_big, a2_small,
                     descriptor(base, b2_big, s, sbo_b), descriptor(base, b2_small, s, sbo_b))
    chain2 = _chained_intrinsic(n, 2, KA // STEP, exact) if KA == KB else None
    chain_regs = _chained_regs_intrinsic(n, CHAIN, exact)

    @cuda.jit(device=True)
    def chained_3xtf32_regs(sm, a_big, a_small, b_big, b_small, s, scratch):
        base = shared_address(sm)
        return chain_regs(a_big, a_small, descriptor(base, b_big, s, sbo_b),
                          descriptor(base, b_small, s, sbo_b))


    @cuda.jit(device=True)
    def chained2_3xtf32(sm, a_big, a_small, b_big, b_small, a2_big, a2_small, b2_big,
                        b2_small):
        base = shared_address(sm)
        return chain2(descriptor(base, a_big, 0, sbo_a), descriptor(base, a_small, 0, sbo_a),
                      descriptor(base, b_big, 0, sbo_b), descriptor(base, b_small, 0, sbo_b),
                      descriptor(base, a2_big, 0, sbo_a), descriptor(base, a2_small, 0, sbo_a),
                      descriptor(base, b2_big, 0, sbo_b), descriptor(base, b2_small, 0, sbo_b))
    return dict(step_3xtf32=step_3xtf32, step_3xtf32_regs=step_3xtf32_regs,
                step2_3xtf32=step2_3xtf32, step2_3xtf32_regs=step2_3xtf32_regs,
                chained2_3xtf32=chained2_3xtf32, chained_3xtf32_regs=chained_3xtf32_regs,
                regs=regs)
