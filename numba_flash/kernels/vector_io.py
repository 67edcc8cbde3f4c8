"""16-byte global memory access for Numba kernels: four elements of one row in one instruction.

load4(src, head, row, col) returns src[head, row, col : col + 4] as a 4-tuple (ld.global.v4.f32
in float32; two ld.global.v2.f64 in float64).
load2(src, head, row, col) returns the pair src[head, row, col : col + 2] (ld.global.v2.f32;
float32, col even, rows 8-byte aligned): tensor-core fragments hold pairs of adjacent columns.
load2_row(row, col) the same from a 1-D row view, row[col : col + 2].
load2_below(src, head, row, col, k) is load2 of src[head, row + k, col:] and load4_below(src,
head, row, col, down, right) load4 of src[head, row + down, col + right:] (float32), each
address that of [head, row, col] plus a 32-bit offset: reads of one (head, row, col) at several
offsets share one 64-bit index computation (the wide float32 kernels' A fragments; the lean
backward's paired loads stay load2: the offsets' form cost its loop 0.8 % SASS).
store4(dst, head, row, col, x) writes the 4-tuple x there (st.global.v4.f32).
store_words(dst, head, row, col, w) writes the four uint32 words w (16 bytes: 8 elements of a
16-bit dst, their low halves first) at dst[head, row, col:] (st.global.v4.u32).
add4(dst, head, row, col, x) adds x there atomically, one red.global.add.v4.f32 (float32 only;
sm_90 and newer): dst[..., col + e] += x[e], each element its own atomic add.
add2(dst, head, row, col, x) the same for a pair, dst[head, row, col : col + 2] (red.global.add.v2.f32;
col even), for tensor-core fragments, which hold pairs of adjacent columns.
add2_if_below(dst, head, row, col, k, x, ok) the same at dst[head, row + k, col:] (load2_below's
address) where ok (an integer, nonzero: add), as one predicated instruction: no branch around
it, whose convergence barriers cost the float32 backward's dQ additions (the address is formed
either way, so it may be past dst's end).
copy16(sh, at, src, head, row, col, nbytes) starts an asynchronous copy (cp.async, sm_80 and
newer) of the 16 bytes at src[head, row, col:] into the shared array sh at element offset `at`
(16-byte aligned), the bytes past nbytes (0 or 16) zero: the thread goes on while the copy runs.
copy16_at(sh, at, src, offset, nbytes) the same for the 16 bytes `offset` bytes (a uint64) into
src's data: no index math (the pipelines work their chunks' offsets out once, stage16.make_plan).
copies_commit() closes the thread's copies started so far into a group; make_copies_wait(n)()
waits until at most n of the thread's groups are still running (then a block barrier, and for wgmma
operands sm90.wgmma.fence_proxy_async, before other threads read them).

Numba emits one scalar access per element and cannot vectorize them itself: it does not know
that the address is 16-byte aligned. Here the caller promises it: the array's data pointer and
its row stride in bytes are multiples of 16 and col is a multiple of 4 (the launchers check the
first two with `aligned`, the kernels' loops guarantee the third). Nothing checks it at run time
on the GPU: a misaligned address is a CUDA error (misaligned address), not a wrong answer.

On the simulator each accesses the four elements one by one (add4 with cuda.atomic.add).
"""

import functools

from numba import cuda

from .launch import DeviceView
from .support import SIMULATOR

VECTOR = 4
ALIGN_BYTES = 16


def data_pointer(a):
    """The device (or host) address of array a's first element: a DeviceView's pointer, the
    __cuda_array_interface__'s, or a NumPy array's."""
    if type(a) is DeviceView:       # (its interface is a dict made per read)
        return a.ptr
    if hasattr(a, "__cuda_array_interface__"):
        return a.__cuda_array_interface__["data"][0]
    return a.ctypes.data


def aligned(*arrays):
    """True when every array allows 16-byte accesses along its rows: data pointer and every
    stride but the last (rows, heads, batches) multiples of 16 bytes (CUDA allocations are; a
    view into one may not be), and each row contiguous and a whole number of 16 bytes long (so
    a 16-byte access at a multiple of 16 bytes never reaches past the row's last element: a
    view d < its parent's width fails), and no stride negative (the offset accessors add
    32-bit offsets, zero-extended: load2_below, load4_below, add2_if_below)."""
    for a in arrays:
        if data_pointer(a) % ALIGN_BYTES:
            return False
        last = a.ndim - 1       # (the simulator's shapes take no negative index)
        item = a.dtype.itemsize  # (Numba's DeviceNDArray has no .itemsize of its own)
        if any(stride < 0 for stride in a.strides):
            return False
        if last >= 1 and (any(a.strides[i] % ALIGN_BYTES for i in range(last))
                          or a.strides[last] != item or a.shape[last] * item % ALIGN_BYTES):
            return False
    return True


def require_aligned(positions, what):
    """A launch check (launch.Launcher's `check`) that raises ValueError unless the
    arguments at `positions` pass `aligned`; `what` names the kernel option and the arrays."""
    positions = tuple(positions)

    def check(args):
        if not aligned(*(args[i] for i in positions)):
            raise ValueError(f"{what} with 16-byte aligned data pointers and rows (d * itemsize "
                             f"a multiple of 16)")
    return check


class AlignedDispatch:
    """A launcher, launcher[grid, block](*args), that runs `vector` (a kernel using these
    accesses) when the arguments at `positions` pass `aligned`, else `scalar` (the same kernel
    with scalar accesses): so a caller's misaligned view still works, at scalar speed.
    same_strides: groups of positions whose arrays the vector kernel addresses with one set of
    strides (stage16.Plan: K and V, Q and dO), each among `positions` (so none negative:
    `aligned`); it runs only where each group's strides are equal."""

    def __init__(self, vector, scalar, positions, same_strides=()):
        self.vector, self.scalar, self.positions = vector, scalar, tuple(positions)
        self.same_strides = tuple(tuple(group) for group in same_strides)
        if not all(set(group) <= set(self.positions) for group in self.same_strides):
            raise ValueError("same_strides' groups must be among the aligned positions")

    def pick(self, args):
        if not aligned(*(args[i] for i in self.positions)):
            return self.scalar
        for group in self.same_strides:
            if len({tuple(args[i].strides) for i in group}) > 1:
                return self.scalar
        return self.vector

    def __getitem__(self, config):
        def launch(*args):
            self.pick(args)[config](*args)
        return launch


if SIMULATOR:
    @cuda.jit(device=True)
    def load4(src, head, row, col):
        return (src[head, row, col], src[head, row, col + 1], src[head, row, col + 2],
                src[head, row, col + 3])

    @cuda.jit(device=True)
    def load2(src, head, row, col):
        return src[head, row, col], src[head, row, col + 1]

    @cuda.jit(device=True)
    def load2_row(row, col):
        return row[col], row[col + 1]

    @cuda.jit(device=True)
    def load2_below(src, head, row, col, k):
        return src[head, row + k, col], src[head, row + k, col + 1]

    @cuda.jit(device=True)
    def load4_below(src, head, row, col, down, right):
        return load4(src, head, row + down, col + right)

    @cuda.jit(device=True)
    def store4(dst, head, row, col, x):
        for e in range(VECTOR):
            dst[head, row, col + e] = x[e]

    @cuda.jit(device=True)
    def store_words(dst, head, row, col, w):
        per = 4 // dst.dtype.itemsize               # elements a word
        for e in range(VECTOR * per):
            dst[head, row, col + e] = (int(w[e // per]) >> (8 * dst.dtype.itemsize * (e % per))
                                       ) & ((1 << (8 * dst.dtype.itemsize)) - 1)

    @cuda.jit(device=True)
    def add4(dst, head, row, col, x):
        for e in range(VECTOR):
            cuda.atomic.add(dst, (head, row, col + e), x[e])

    @cuda.jit(device=True)
    def add2(dst, head, row, col, x):
        cuda.atomic.add(dst, (head, row, col), x[0])
        cuda.atomic.add(dst, (head, row, col + 1), x[1])

    @cuda.jit(device=True)
    def add2_if_below(dst, head, row, col, k, x, ok):
        if ok:
            add2(dst, head, row + k, col, x)

    @cuda.jit(device=True)
    def copy16(sh, at, src, head, row, col, nbytes):
        """At once on the simulator (element by element)."""
        n = 16 // src.itemsize
        for e in range(n):
            sh[at + e] = src[head, row, col + e] if nbytes else 0

    @cuda.jit(device=True)
    def copy16_at(sh, at, src, offset, nbytes):
        """At once on the simulator: offset taken apart by src's strides (element by element)."""
        offset = int(offset)    # (a uint64 with Python ints is a float in NumPy 1.x)
        head, rest = offset // src.strides[0], offset % src.strides[0]
        copy16(sh, at, src, head, rest // src.strides[1],
               rest % src.strides[1] // src.itemsize, nbytes)

    def copies_commit():
        pass

    @functools.lru_cache(maxsize=None)
    def make_copies_wait(n):
        def copies_wait():
            pass
        return copies_wait
else:
    from llvmlite import ir
    from numba import types
    from numba.cuda import cgutils
    from numba.cuda.extending import intrinsic

    def _element_pointer(context, builder, arg_types, args):
        """Pointer to array[head, row, col] (args: the array, then the three indices)."""
        array_type, index_types = arg_types[0], arg_types[1:4]
        array = context.make_array(array_type)(context, builder, value=args[0])
        indices = [context.cast(builder, value, ty, types.intp)
                   for value, ty in zip(args[1:4], index_types)]
        return cgutils.get_item_pointer(context, builder, array_type, array, indices,
                                        wraparound=False)

    def _first(context, builder, sig, args):
        """Pointer to array[head, row, col] (args[0] the array, args[1:4] the indices)."""
        return _element_pointer(context, builder, sig.args[:4], args[:4])

    def _array3(array):
        return isinstance(array, types.Array) and array.ndim == 3

    def _tuple_of(x, dtype):
        return isinstance(x, types.UniTuple) and x.count == VECTOR and x.dtype == dtype

    def _store_vector(context, builder, sig, args, element):
        """One 16-byte store of the VECTOR-tuple args[4] (LLVM type `element` each) at
        args[0][args[1], args[2], args[3]]."""
        vector = ir.VectorType(element, VECTOR)
        value = ir.Constant(vector, ir.Undefined)
        for e in range(VECTOR):
            value = builder.insert_element(value, builder.extract_value(args[4], e),
                                           ir.Constant(ir.IntType(32), e))
        builder.store(value, builder.bitcast(_first(context, builder, sig, args),
                                             vector.as_pointer()), align=ALIGN_BYTES)

    @intrinsic
    def load4(typingctx, src, head, row, col):
        if not _array3(src):
            return None
        sig = types.UniTuple(src.dtype, VECTOR)(src, head, row, col)

        def codegen(context, builder, sig, args):
            values = _load_vector(builder, _first(context, builder, sig, args),
                                  context.get_data_type(sig.args[0].dtype), VECTOR, ALIGN_BYTES)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    @intrinsic
    def load2_row(typingctx, row, col):
        # load2 from a 1-D float32 row view (operands.row_views): row[col : col + 2]
        if not (isinstance(row, types.Array) and row.ndim == 1 and row.dtype == types.float32):
            return None
        sig = types.UniTuple(row.dtype, 2)(row, col)

        def codegen(context, builder, sig, args):
            values = _load_vector(builder, _element_pointer(context, builder, sig.args, args),
                                  context.get_data_type(sig.args[0].dtype), 2, 8)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    def _below_pointer(context, builder, sig, args, down, right=None):
        """Pointer to args[0][head, row + down, col + right] (args: the array, head, row, col;
        down, right: args' indices of those two, right None for 0) as that of [head, row, col]
        plus down row strides and right elements, in 32 bits: callers reading several (down,
        right) of one (head, row, col) share its 64-bit index arithmetic, formed once."""
        array_type = sig.args[0]
        first = _element_pointer(context, builder, sig.args[:4], args[:4])
        array = context.make_array(array_type)(context, builder, value=args[0])
        i32 = ir.IntType(32)
        stride = builder.trunc(cgutils.unpack_tuple(builder, array.strides, 3)[1], i32)
        offset = builder.mul(context.cast(builder, args[down], sig.args[down], types.uint32),
                             stride)
        if right is not None:
            itemsize = context.get_abi_sizeof(context.get_data_type(array_type.dtype))
            offset = builder.add(offset, builder.mul(
                context.cast(builder, args[right], sig.args[right], types.uint32),
                ir.Constant(i32, itemsize)))
        byte = builder.bitcast(first, ir.IntType(8).as_pointer())
        return builder.gep(byte, [builder.zext(offset, ir.IntType(64))], inbounds=True)

    def _load_vector(builder, pointer, element, n, align):
        """The n elements (LLVM type element) at pointer as one vector load, a list."""
        vector = ir.VectorType(element, n)
        loaded = builder.load(builder.bitcast(pointer, vector.as_pointer()), align=align)
        return [builder.extract_element(loaded, ir.Constant(ir.IntType(32), e))
                for e in range(n)]

    @intrinsic
    def load2(typingctx, src, head, row, col):
        if not (_array3(src) and src.dtype == types.float32):
            return None
        sig = types.UniTuple(src.dtype, 2)(src, head, row, col)

        def codegen(context, builder, sig, args):
            values = _load_vector(builder, _first(context, builder, sig, args),
                                  context.get_data_type(sig.args[0].dtype), 2, 8)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    @intrinsic
    def load2_below(typingctx, src, head, row, col, k):
        # load2 of src[head, row + k, col:col + 2] (_below_pointer)
        if not (_array3(src) and src.dtype == types.float32):
            return None
        sig = types.UniTuple(src.dtype, 2)(src, head, row, col, k)

        def codegen(context, builder, sig, args):
            values = _load_vector(builder, _below_pointer(context, builder, sig, args, 4),
                                  context.get_data_type(sig.args[0].dtype), 2, 8)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    @intrinsic
    def load4_below(typingctx, src, head, row, col, down, right):
        # load4 of src[head, row + down, col + right:] (float32: one 16-byte load;
        # _below_pointer)
        if not (_array3(src) and src.dtype == types.float32):
            return None
        sig = types.UniTuple(src.dtype, VECTOR)(src, head, row, col, down, right)

        def codegen(context, builder, sig, args):
            values = _load_vector(builder, _below_pointer(context, builder, sig, args, 4, 5),
                                  context.get_data_type(sig.args[0].dtype), VECTOR,
                                  ALIGN_BYTES)
            return context.make_tuple(builder, sig.return_type, values)

        return sig, codegen

    @intrinsic
    def store4(typingctx, dst, head, row, col, x):
        if not (_array3(dst) and _tuple_of(x, dst.dtype)):
            return None
        sig = types.void(dst, head, row, col, x)

        def codegen(context, builder, sig, args):
            _store_vector(context, builder, sig, args,
                          context.get_data_type(sig.args[0].dtype))
            return context.get_dummy_value()

        return sig, codegen

    @intrinsic
    def store_words(typingctx, dst, head, row, col, w):
        if not (_array3(dst) and _tuple_of(w, types.uint32)):
            return None
        sig = types.void(dst, head, row, col, w)

        def codegen(context, builder, sig, args):
            _store_vector(context, builder, sig, args, ir.IntType(32))
            return context.get_dummy_value()

        return sig, codegen

    # PTX ISA 8.1, sm_90: vector reductions exist for global memory only, hence the conversion
    # of the generic address Numba holds into a global one. Like the scalar float atomic add
    # (cuda.atomic.add), it flushes subnormals to zero (REDG.E.ADD.F32x4.FTZ.RN in the SASS).
    def _red_add(width, if_below=False):
        """An intrinsic adding a float32 width-tuple at dst[head, row, col:col + width] with one
        red.global.add.v{width}.f32 (the address's alignment is the caller's promise);
        if_below: two more arguments, k after col (the tuple added at dst[head, row + k, col:],
        _below_pointer's address) and ok last (an integer or bool), the instruction issued
        under the predicate ok != 0 (no branch around it)."""
        regs = ", ".join(f"${e + 1}" for e in range(width))
        guard = (f".reg .pred p; setp.ne.u32 p, ${width + 1}, 0; ", "@p ") if if_below \
            else ("", "")
        asm_text = (f"{{ .reg .u64 g; {guard[0]}cvta.to.global.u64 g, $0; "
                    f"{guard[1]}red.global.add.v{width}.f32 [g], {{{regs}}}; }}")

        def typing(dst, x, ok):
            return (_array3(dst) and dst.dtype == types.float32 and isinstance(x, types.UniTuple)
                    and x.count == width and x.dtype == types.float32
                    and (ok is None or isinstance(ok, (types.Integer, types.Boolean))))

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            flag = [i32] if if_below else []
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(),
                                               [ir.IntType(64)] + [f32] * width + flag),
                               asm_text, "l" + ",f" * width + ",r" * len(flag) + ",~{memory}",
                               side_effect=True)
            at = _below_pointer(context, builder, sig, args, 4) if if_below else _first(
                context, builder, sig, args)
            x = 5 if if_below else 4            # the tuple's argument, then ok's
            address = builder.ptrtoint(at, ir.IntType(64))
            ops = [address] + [builder.extract_value(args[x], e) for e in range(width)]
            if if_below:
                ops.append(context.cast(builder, args[x + 1], sig.args[x + 1], types.uint32))
            builder.call(asm, ops)
            return context.get_dummy_value()

        if if_below:
            @intrinsic
            def red_add_if_below(typingctx, dst, head, row, col, k, x, ok):
                if not typing(dst, x, ok):
                    return None
                return types.void(dst, head, row, col, k, x, ok), codegen
            return red_add_if_below

        @intrinsic
        def red_add(typingctx, dst, head, row, col, x):
            if not typing(dst, x, None):
                return None
            return types.void(dst, head, row, col, x), codegen
        return red_add

    add4 = _red_add(VECTOR)
    add2 = _red_add(2)
    add2_if_below = _red_add(2, if_below=True)

    def _emit_copy16(context, builder, sig, args, source):
        """cp.async of the 16 bytes at the generic address source() emits (an i64) into the
        shared array args[0] at element offset args[1], the last argument's count of them read
        (the rest zero)."""
        i32, i64 = ir.IntType(32), ir.IntType(64)
        shared = context.make_array(sig.args[0])(context, builder, args[0])
        offset = builder.mul(context.cast(builder, args[1], sig.args[1], types.intp),
                             ir.Constant(i64, sig.args[0].dtype.bitwidth // 8))
        dst = builder.add(builder.ptrtoint(shared.data, i64), offset)
        src_ptr = source()
        size = context.cast(builder, args[-1], sig.args[-1], types.uint32)
        asm = ir.InlineAsm(
            ir.FunctionType(ir.VoidType(), [i64, i64, i32]),
            "{ .reg .u64 s, g; .reg .u32 d; cvta.to.shared.u64 s, $0; cvt.u32.u64 d, s; "
            "cvta.to.global.u64 g, $1; cp.async.cg.shared.global [d], [g], 16, $2; }",
            "l,l,r,~{memory}", side_effect=True)
        builder.call(asm, [dst, src_ptr, size])
        return context.get_dummy_value()

    @intrinsic
    def copy16(typingctx, sh, at, src, head, row, col, nbytes):
        # .cg: cached in L2 only (each tile is read once per block); src-size = nbytes zero-fills
        # the rest, so rows past the end are staged as zeros without a branch around the copy
        if not (_array3(src) and isinstance(sh, types.Array) and sh.dtype == src.dtype):
            return None
        sig = types.void(sh, at, src, head, row, col, nbytes)

        def codegen(context, builder, sig, args):
            return _emit_copy16(context, builder, sig, args, lambda: builder.ptrtoint(
                _element_pointer(context, builder, sig.args[2:6], args[2:6]), ir.IntType(64)))

        return sig, codegen

    @intrinsic
    def copy16_at(typingctx, sh, at, src, offset, nbytes):
        # copy16 with the source address given as a byte offset into src's data
        if not (_array3(src) and isinstance(sh, types.Array) and sh.dtype == src.dtype):
            return None
        sig = types.void(sh, at, src, offset, nbytes)

        def codegen(context, builder, sig, args):
            def source():
                array = context.make_array(sig.args[2])(context, builder, args[2])
                return builder.add(builder.ptrtoint(array.data, ir.IntType(64)),
                                   context.cast(builder, args[3], sig.args[3], types.uint64))
            return _emit_copy16(context, builder, sig, args, source)

        return sig, codegen

    def _statement(text):
        """An intrinsic of no arguments that emits the PTX `text` (a memory clobber: no load or
        store moves across it)."""
        @intrinsic
        def statement(typingctx):
            def codegen(context, builder, sig, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text,
                                          "~{memory}", side_effect=True), [])
                return context.get_dummy_value()
            return types.void(), codegen
        return statement

    copies_commit = _statement("cp.async.commit_group;")

    @functools.lru_cache(maxsize=None)
    def make_copies_wait(n):
        """copies_wait(): cp.async.wait_group n (n a constant of the instruction)."""
        return _statement(f"cp.async.wait_group {int(n)};")
