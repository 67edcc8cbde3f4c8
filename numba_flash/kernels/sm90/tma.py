"""The tensor memory accelerator (TMA) and mbarriers (sm_90): 16-bit tiles copied from global
into shared memory by the copy engine, not by the threads, each copy landing on an mbarrier
that the threads wait on (FlashAttention-3's producer side). One thread starts a box with one
instruction; no thread waits for a copy it did not need yet, and wgmma reads what TMA wrote
without a proxy fence (both are the async proxy).

Boxes. A tensor map (made on the host, `tensor_maps`) describes a (B*H, N, d) 16-bit array
(q, k or v as stored) as a 3-D tensor (d, N, B*H), innermost first, and a box of BOX x BOX
elements: 64 rows of 64 columns (128 bytes a row, the widest the 128-byte swizzle takes). A
box starting at (column c0, row c1, head c2) lands in shared memory with the 128-byte swizzle:
row r at 128 r bytes, its 16-byte chunk j at chunk j ^ (r % 8). A tile of R rows and 64 h..
columns is h boxes, box h at 64 R h elements (`swizzle128_offset`), the layout wgmma reads
with its 128-byte swizzle mode (sm90.wgmma16, swizzle=True). Elements past the array (rows past
N, columns past d) arrive as zeros and still count as bytes of the box. A swizzled tile must
start at a multiple of SWIZZLE_ALIGN bytes of the shared window (the pattern follows address
bits); `swizzle_base` gives the offset that aligns a dynamic shared array.

mbarriers (8 bytes of shared memory each, at byte offsets `at` of the shared array):

    mbarrier_init(sh, at, count)      thread 0, before a block barrier: `count` arrivals a phase
    mbarrier_fence_init()             after the inits, so that the copy engine sees them
    tensormap_acquire(maps, i)        before a block's first copy by map i: the map was written
                                      by a host copy, which the copy engine's view of global
                                      memory (the tensormap proxy) is to see (.sys scope, as
                                      the CUDA programming guide asks for maps a cudaMemcpy
                                      wrote)
    mbarrier_expect_tx(sh, at, n)     one arrival, and n more bytes for the phase to wait for
    tma_load(sh, at, maps, i, src, c0, c1, c2, bar)
                                      the box at (c0, c1, c2) of the array of map i of `maps`
                                      into the shared tile at element offset `at`; its bytes
                                      complete on the mbarrier at byte offset `bar`. src: the
                                      array itself (read by the simulator; unused on a GPU)
    mbarrier_wait(sh, at, parity)     until the phase of that parity has completed (phases
                                      alternate 0, 1, 0, ...; a waiter must not fall two behind)

On the simulator a box is copied when it is started (so a tile overwritten while a wgmma reads
it fails wgmma16's in-flight check) and the mbarriers are Python objects with the same phase
rule; a wait that would hang on a GPU raises MbarrierHang: at once when no other thread of
the block is left to run, else after HANG_SECONDS.
"""

import collections
import functools
import sys
import threading
import time

import numpy as np
from numba import cuda, int32, types, uint32, uint64

from ..launch import DeviceView
from ..simulator import yield_turn
from ..support import SIMULATOR, U, device_function
from ..vector_io import aligned, data_pointer

BOX = 64                    # rows and columns of a box (16-bit elements)
BOX_ELEMENTS = BOX * BOX
BOX_BYTES = 2 * BOX_ELEMENTS
SWIZZLE_ALIGN = 1024        # bytes: 8 rows of 128, the period of the swizzle
MAP_BYTES = 128             # a CUtensorMap
MBARRIER_BYTES = 8
HANG_SECONDS = 60.0


def swizzle128_offset_host(r, c, R):
    """Element offset of (r, c) in a tile of R rows staged as 64-column boxes with the 128-byte
    swizzle (the module): NumPy, r and c index arrays."""
    r, c = np.asarray(r), np.asarray(c)
    return (c // BOX) * (R * BOX) + r * BOX + (((c % BOX) // 8) ^ (r % 8)) * 8 + c % 8


def tma_ready(*arrays):
    """Whether TMA can address each (B*H, N, d) 16-bit array: data pointer and every stride
    but the last (which must be 2 bytes) multiples of 16 bytes."""
    for a in arrays:
        if not aligned(a) or any(s % 16 or s <= 0 for s in a.strides[:-1]):
            return False
    return True


_MAPS_CACHED = 256
_maps = collections.OrderedDict()
_maps_lock = threading.Lock()
_torch_streams = {}         # (CUstream handle, device) -> torch.cuda.ExternalStream


def _encode(a):
    """The 16 uint64 words of a tensor map of the (B*H, N, d) 16-bit array a (GPU only)."""
    from cuda.bindings import driver
    heads, n, d = (int(x) for x in a.shape)
    err, tmap = driver.cuTensorMapEncodeTiled(
        driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_UINT16, 3, int(data_pointer(a)),
        [driver.cuuint64_t(x) for x in (d, n, heads)],
        [driver.cuuint64_t(int(s)) for s in (a.strides[1], a.strides[0])],
        [driver.cuuint32_t(x) for x in (BOX, BOX, 1)],
        [driver.cuuint32_t(1)] * 3,
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed ({err.name}) for an array of shape "
                           f"{a.shape}, strides {a.strides}")
    return np.array([int(w) for w in tmap.opaque], np.uint64)


def _stream_key(stream):
    """The CUstream handle of a Numba stream (0 for the default stream; the simulator's
    streams have none: the object's id)."""
    if not stream:
        return 0
    handle = getattr(stream, "handle", None)
    return id(stream) if handle is None else int(handle or 0)


class MapsMemory:
    """The owner of a tensor_maps view: `array`, the memory holding the maps (a torch tensor
    from its pool or a Numba device array: _to_device);
    the `stream` they were copied on; and `arrays`, what they map: (data pointer, shape,
    dtype, strides) of each array, in order (numba_flash.replay remakes them for arrays at
    other addresses)."""

    __slots__ = ("array", "stream", "arrays")

    def __init__(self, array, stream, arrays):
        self.array, self.stream, self.arrays = array, stream, arrays


def _to_device(words, stream):
    """(device pointer, owner) of a copy of words (a uint8 array) made on `stream`.
    Where torch runs CUDA in this process, through its caching allocators: the memory from
    its device pool on that stream, the copy from a pinned block of its host pool,
    asynchronous (torch keeps the block until the copy is done), freed back to the pool when
    the owner goes. Numba's to_device instead allocates with cuMemAlloc, copies from pageable
    memory, and frees with cuMemFree in batches, each of which waits for the device: in a
    training loop whose tensors come at new addresses, that made the host wait for the GPU
    every few steps. Else (CuPy, Numba, the simulator) Numba's to_device."""
    torch = sys.modules.get("torch")     # (arrays.torch_module's answer; kernels import no API)
    if SIMULATOR or torch is None or not torch.cuda.is_initialized():
        array = cuda.to_device(words, stream=stream)
        return (None if SIMULATOR else array.device_ctypes_pointer.value), array
    handle, device = _stream_key(stream), cuda.get_current_device().id
    on = _torch_streams.get((handle, device))
    if on is None:
        if len(_torch_streams) >= 64:           # a process that made many streams
            _torch_streams.clear()
        on = _torch_streams.setdefault((handle, device), (
            torch.cuda.ExternalStream(handle, device=device) if handle else
            torch.cuda.default_stream(device)))     # (0: the legacy default stream)
    host = torch.from_numpy(words)
    try:
        host = host.pin_memory()
    except RuntimeError:        # no pinned memory to be had: the copy from pageable memory
        pass
    with torch.cuda.stream(on):
        owner = torch.empty(words.shape, dtype=torch.uint8, device=on.device)
        owner.copy_(host, non_blocking=True)
    return owner.data_ptr(), owner


def tensor_maps(arrays, stream=0):
    """A device array (len(arrays), MAP_BYTES) uint8 (a launch.DeviceView on the GPU): row i
    the tensor map of arrays[i], a (B*H, N, d) 16-bit array passing tma_ready, boxes BOX x BOX
    with the 128-byte swizzle.
    The last _MAPS_CACHED sets are kept, keyed by pointers, shapes and strides (a map is a
    function of them) and the stream, so repeated calls on the same arrays copy nothing; a
    caller holds the view until its launch is queued (the cache may evict it). The view's owner
    is a MapsMemory, which records what the maps map (numba_flash.replay remakes them for a
    replay's own tensors). A new set is encoded on the host and copied on `stream`
    (_to_device: through torch's pools where torch runs CUDA), ahead of the kernels that
    stream runs next (the copy may still be landing when this returns: a kernel on another
    stream gets a copy of its own, not this one). On the simulator the rows are zeros (its
    tma_load reads the array it is given)."""
    key = (_stream_key(stream),) + tuple((data_pointer(a), tuple(a.shape), tuple(a.strides))
                                          for a in arrays)
    with _maps_lock:
        maps = _maps.get(key)
        if maps is not None:
            _maps.move_to_end(key)
            return maps
    if SIMULATOR:
        words = np.zeros((len(arrays), MAP_BYTES // 8), np.uint64)
    else:
        words = np.stack([_encode(a) for a in arrays])
    pointer, maps = _to_device(words.view(np.uint8), stream)
    if not SIMULATOR:
        # a DeviceView, which launch.Launcher packs itself: a Numba device array among a
        # launch's arguments sends the whole launch through Numba's own (a few hundred us of
        # host a call: tools/call_time.py, 2026-12-06)
        mapped = tuple((data_pointer(a), tuple(a.shape), np.dtype(a.dtype), tuple(a.strides))
                       for a in arrays)
        maps = DeviceView(pointer, words.view(np.uint8).shape, np.uint8,
                          owner=MapsMemory(maps, stream, mapped))
    with _maps_lock:
        _maps[key] = maps
        while len(_maps) > _MAPS_CACHED:
            _maps.popitem(last=False)
    return maps


if SIMULATOR:
    class MbarrierHang(AssertionError):
        """A wait on an mbarrier phase that never completes: a GPU would hang there."""

    class _Mbarrier:
        """An mbarrier's state: arrivals a phase, arrivals and bytes still pending, phases
        completed (the current phase's parity is completed % 2)."""

        def __init__(self, count):
            self.count, self.pending, self.tx, self.completed = count, count, 0, 0
            self.lock = threading.Lock()

        def update(self, arrivals, tx):
            with self.lock:
                self.pending -= arrivals
                self.tx += tx
                if self.pending < 0:
                    raise MbarrierHang("more arrivals on an mbarrier than its count")
                if self.pending == 0 and self.tx == 0:
                    self.completed += 1
                    self.pending = self.count

    _mbarriers = {}
    _mbarriers_lock = threading.Lock()

    def _key(sh, at):
        return sh.__array_interface__["data"][0], int(at)

    def _get(sh, at):
        with _mbarriers_lock:
            bar = _mbarriers.get(_key(sh, at))
        if bar is None:
            raise MbarrierHang(f"an mbarrier at byte {int(at)} used before mbarrier_init")
        return bar

    @device_function
    def swizzle_base(sh):
        """0: the simulator's tiles start where the kernel puts them."""
        return U(0)

    @device_function
    def mbarrier_init(sh, at, count):
        if int(at) % MBARRIER_BYTES:
            raise ValueError(f"an mbarrier at byte {int(at)}: not 8-byte aligned")
        with _mbarriers_lock:
            _mbarriers[_key(sh, at)] = _Mbarrier(int(count))

    @device_function
    def mbarrier_fence_init():
        pass

    @device_function
    def tensormap_acquire(maps, index):
        pass

    @device_function
    def mbarrier_expect_tx(sh, at, nbytes):
        _get(sh, at).update(1, int(nbytes))

    @device_function
    def mbarrier_wait(sh, at, parity):
        # the block's other threads take their turns until the phase completes; it never
        # will when none is left to run, or after HANG_SECONDS of turns
        bar = _get(sh, at)
        deadline = time.monotonic() + HANG_SECONDS
        while bar.completed % 2 == int(parity):
            if not yield_turn() or time.monotonic() > deadline:
                raise MbarrierHang(f"the mbarrier at byte {int(at)}: phase of parity "
                                   f"{int(parity)} never completed ({bar.completed} phases "
                                   f"done, {bar.pending} arrivals and {bar.tx} bytes pending)")

    @functools.lru_cache(maxsize=None)
    def _box_offsets():
        r, c = np.meshgrid(np.arange(BOX), np.arange(BOX), indexing="ij")
        return swizzle128_offset_host(r, c, BOX).ravel(), r.ravel(), c.ravel()

    @device_function
    def tma_load(sh, at, maps, index, src, c0, c1, c2, bar):
        at, c0, c1, c2 = int(at), int(c0), int(c1), int(c2)
        if (2 * at) % SWIZZLE_ALIGN:
            raise ValueError(f"a TMA box at element {at}: not {SWIZZLE_ALIGN}-byte aligned")
        offsets, r, c = _box_offsets()
        rows, cols = c1 + r, c0 + c
        inside = (rows < src.shape[1]) & (cols < src.shape[2]) & (c2 < src.shape[0])
        box = np.zeros(BOX_ELEMENTS, np.uint16)
        if c2 < src.shape[0]:
            head = np.asarray(src[c2])
            box[inside] = head[rows[inside], cols[inside]]
        sh[at + offsets] = box
        _get(sh, bar).update(0, -BOX_BYTES)
else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    from .wgmma import shared_address

    _LL = {types.uint32: ir.IntType(32), types.uint64: ir.IntType(64),
           types.int32: ir.IntType(32)}

    def _codegen(text, constraints, ret, operand_types):
        """Codegen emitting the PTX `text` with a memory clobber (no access moves across it);
        ret: the numba result type (types.void, or types.uint32 for "=r")."""
        def codegen(context, builder, sig, llargs):
            out = ir.VoidType() if ret == types.void else _LL[ret]
            fn = ir.FunctionType(out, [_LL[t] for t in operand_types])
            clobber = (constraints + ",~{memory}") if constraints else "~{memory}"
            res = builder.call(ir.InlineAsm(fn, text, clobber, side_effect=True), list(llargs))
            return context.get_dummy_value() if ret == types.void else res
        return ret(*operand_types), codegen

    def _matches(args, operand_types):
        return all(a == t for a, t in zip(args, operand_types))

    _U32x2 = (types.uint32, types.uint32)

    @intrinsic
    def _init(typingctx, address, count):
        if _matches((address, count), _U32x2):
            return _codegen("mbarrier.init.shared::cta.b64 [$0], $1;", "r,r", types.void,
                            _U32x2)

    @intrinsic
    def _expect_tx(typingctx, address, nbytes):
        if _matches((address, nbytes), _U32x2):
            return _codegen("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], $1;", "r,r",
                            types.void, _U32x2)

    @intrinsic
    def _try_wait(typingctx, address, parity):
        if _matches((address, parity), _U32x2):
            return _codegen("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, "
                            "[$1], $2; selp.u32 $0, 1, 0, p; }", "=r,r,r", types.uint32,
                            _U32x2)

    _LOAD3D = (types.uint32, types.uint64, types.int32, types.int32, types.int32, types.uint32)

    @intrinsic
    def _load3d(typingctx, dst, tmap, c0, c1, c2, bar):
        if _matches((dst, tmap, c0, c1, c2, bar), _LOAD3D):
            return _codegen("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::"
                            "complete_tx::bytes [$0], [$1, {$2, $3, $4}], [$5];",
                            "r,l,r,r,r,r", types.void, _LOAD3D)

    @intrinsic
    def mbarrier_fence_init(typingctx):
        return _codegen("fence.mbarrier_init.release.cluster;", "", types.void, ())

    @intrinsic
    def _tensormap_fence(typingctx, address):
        if address == types.uint64:
            return _codegen(f"fence.proxy.tensormap::generic.acquire.sys [$0], {MAP_BYTES};",
                            "l", types.void, (types.uint64,))

    @intrinsic
    def _data_address(typingctx, arr):
        """The generic address (u64) of an array's first element."""
        if not isinstance(arr, types.Array):
            return None

        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            return builder.ptrtoint(data, ir.IntType(64))
        return types.uint64(arr), codegen

    @cuda.jit(device=True, forceinline=True)
    def swizzle_base(sh):
        """Elements from the start of the 16-bit shared array sh to its first SWIZZLE_ALIGN-byte
        aligned address (allocate that much more)."""
        return ((U(SWIZZLE_ALIGN) - shared_address(sh) % U(SWIZZLE_ALIGN)) % U(SWIZZLE_ALIGN)
                ) // U(2)

    @cuda.jit(device=True, forceinline=True)
    def mbarrier_init(sh, at, count):
        _init(uint32(shared_address(sh) + uint32(at)), uint32(count))

    @cuda.jit(device=True, forceinline=True)
    def mbarrier_expect_tx(sh, at, nbytes):
        _expect_tx(uint32(shared_address(sh) + uint32(at)), uint32(nbytes))

    @cuda.jit(device=True, forceinline=True)
    def mbarrier_wait(sh, at, parity):
        address = uint32(shared_address(sh) + uint32(at))
        while _try_wait(address, uint32(parity)) == U(0):
            pass

    @cuda.jit(device=True, forceinline=True)
    def tensormap_acquire(maps, index):
        _tensormap_fence(_data_address(maps) + uint64(MAP_BYTES) * uint64(index))

    @cuda.jit(device=True, forceinline=True)
    def tma_load(sh, at, maps, index, src, c0, c1, c2, bar):
        base = shared_address(sh)
        _load3d(uint32(base + uint32(2) * uint32(at)),
                _data_address(maps) + uint64(MAP_BYTES) * uint64(index),
                int32(c0), int32(c1), int32(c2), uint32(base + uint32(bar)))
