"""Kernel launches with little host work, safe under threads.

`Launcher(dispatcher, nbytes, check)[grid, block, stream](*args)` runs a Numba CUDA kernel as
`dispatcher[grid, block, stream, nbytes](*args)` does, with three differences:

* **Cheap lookup.** The compiled specialization is found by a key of the arguments' types
  that costs a few attribute reads (an array's dtype, rank and layout; a scalar's Python
  type), where Numba's dispatcher types every argument (numba.typeof) on every call. Numba
  types them once per key.
* **One load, under a lock.** numba-cuda 0.30 loads a kernel's module on its first launch
  without a lock: two threads launching a fresh kernel at once both load it, registering one
  CUlibrary twice ("key already in dictionary: <CUlibrary ...>", then a double free;
  tests/test_inputs.py::test_gpu_two_threads_at_once on an H200, 2026-12-04). Here the first
  launch of each specialization compiles, loads and (above 48 KiB of dynamic shared memory,
  cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES), which numba-cuda does not expose) opts
  it in, all under one lock.
* **Packing without Numba's views.** A `DeviceView` (a pointer, a shape, a dtype: how
  numba_flash.arrays imports torch and CuPy arrays) is packed as Numba's launch packs an
  array argument: meminfo, parent, size, itemsize, data pointer, shape, strides in bytes (the
  layout of Numba's array struct), scalars as ctypes values; cuda.core then launches. Other
  arrays (Numba's DeviceNDArray) go through the specialization's own Numba launch.
* **Launches listed on request.** Within `recording()`, this thread's launches are listed with
  their packed arguments, and the API's allocations beside them (numba_flash.replay makes an
  API call's plan of them).
* **Nothing made twice.** The specialization is keyed by the current context's handle (one
  cuCtxGetCurrent, where Numba's get_context() took a lock and several driver calls); the
  normalized grid and block and cuda.core's LaunchConfig are kept a (grid, block), and
  cuda.core's wrapper of a stream a handle (Numba's _to_core_stream made one a launch).

Host time of one API forward on the H200's host before this: about 0.4-0.8 ms, most of it in
the dispatcher's typing, the opt-in's typing and the per-argument device-array views
(tools/call_time.py --profile, 2026-12-04). On the simulator a Launcher runs `check` and then
the dispatcher as it is (the simulator has no modules, limits or argument packing).
"""

import contextlib
import ctypes
import math
import threading
from dataclasses import dataclass

import numpy as np
from numba import cuda

# Which numba.cuda this process imported (fixed at its first import): the simulator's or the
# GPU's. The kernels' modules take it from here (support, cache).
SIMULATOR = cuda.jit.__module__.startswith("numba.cuda.simulator")

# Dynamic shared memory a launch may use without opting in (CUDA's static limit too)
SHARED_MEMORY_BYTES = 48 * 1024


class DeviceView:
    """A C-contiguous array in device memory as the kernels take it: data pointer `ptr`,
    `shape`, `dtype`, and `owner`, the object whose memory it is (kept alive with the view,
    e.g. a torch tensor). It has the little of a Numba device array that numba_flash's launch
    code uses (shape, dtype, size, nbytes, strides, reshape, view) and a
    __cuda_array_interface__ (no stream: work on it is ordered by the caller), so that Numba,
    torch or CuPy can take it too."""

    __slots__ = ("ptr", "shape", "dtype", "owner", "pool_owner", "_strides")

    def __init__(self, ptr, shape, dtype, owner=None):
        self.ptr = int(ptr)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.owner = owner
        self.pool_owner = None
        self._strides = None

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    @property
    def strides(self):
        """C-contiguous strides in bytes (made at the first read: a launch reads them a few
        times a view, for alignment, tensor maps and packing)."""
        if self._strides is None:
            strides, step = [], self.dtype.itemsize
            for s in reversed(self.shape):
                strides.append(step)
                step *= s
            self._strides = tuple(reversed(strides))
        return self._strides

    def reshape(self, *shape):
        """The same memory with another shape of the same size (a tuple or sizes)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return DeviceView(self.ptr, shape, self.dtype, self.owner)

    def view(self, dtype):
        """The same memory as another dtype; the last axis scales with the item sizes (as
        NumPy's view of a contiguous array)."""
        dtype = np.dtype(dtype)
        last = self.shape[-1] * self.dtype.itemsize if self.shape else self.dtype.itemsize
        if last % dtype.itemsize:
            raise ValueError(f"cannot view {self.shape} {self.dtype} as {dtype}")
        return DeviceView(self.ptr, (*self.shape[:-1], last // dtype.itemsize), dtype,
                          self.owner)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3, "strides": None, "stream": None}

    def __repr__(self):
        return f"DeviceView(0x{self.ptr:x}, {self.shape}, {self.dtype})"


def _layout(a):
    """Numba's layout letter for a DeviceNDArray (its _numba_type_ rule, without making the
    type): C or F when contiguous and not broadcast, else A."""
    flags = a.flags
    if 0 in a.strides and a.size:
        return "A"
    return "C" if flags["C_CONTIGUOUS"] else "F" if flags["F_CONTIGUOUS"] else "A"


def _device_ndarray():
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    return DeviceNDArray


def arg_key(a):
    """A hashable key that determines the Numba type of launch argument a (equal keys, equal
    types), cheap to compute: Numba's typeof is called only when a key is new, and for
    arguments of kinds not listed here."""
    t = type(a)
    if t is DeviceView:
        return (DeviceView, a.dtype, len(a.shape))
    if t is int:
        # 0 for 0 <= a < 2**63, -1 below 0 (both int64 as numba types them), 1 for uint64
        # (2**63 <= a < 2**64), another key for what numba refuses
        return (int, a >> 63)
    if t in (float, bool):
        return t
    if isinstance(a, np.generic):
        return (t, a.dtype)                       # datetime64 units, record and string sizes
    if isinstance(a, _device_ndarray()):
        return (t, a.dtype, len(a.shape), _layout(a))
    from numba.cuda.typing.typeof import Purpose, typeof
    return ("typeof", typeof(a, Purpose.argument))


def _pack_view(a, out):
    out += (0, 0, a.size, a.dtype.itemsize, a.ptr, *a.shape, *a.strides)


VIEW_PTR = 4        # where _pack_view puts a view's data pointer among its values


def _packer(ty, value):
    """How an argument of Numba type ty, given as `value`'s kind, is packed for the launch
    (Numba's _Kernel._prepare_args does the same for these types); None where the
    specialization's own Numba launch must pack it."""
    from numba.cuda import types
    if isinstance(ty, types.Array):
        return _pack_view if type(value) is DeviceView and ty.layout == "C" else None
    if isinstance(ty, types.Integer):
        ctype = getattr(ctypes, f"c_{ty}")
        return lambda v, out: out.append(ctype(v))
    if ty == types.float32:
        return lambda v, out: out.append(ctypes.c_float(v))
    if ty == types.float64:
        return lambda v, out: out.append(ctypes.c_double(v))
    if ty == types.boolean:
        return lambda v, out: out.append(v)
    return None


@dataclass(frozen=True)
class Launch:
    """One launch as recording() lists it: the cuda.core kernel, LaunchConfig and Stream it
    ran with, its arguments as given and as packed, and where each argument's packed values
    start (a DeviceView's data pointer is packed[starts[i] + VIEW_PTR])."""
    kernel: object
    config: object
    stream: object
    args: tuple
    packed: tuple
    starts: tuple


_recording = threading.local()


@contextlib.contextmanager
def recording(on=True):
    """Lists, in order, what this thread does within it (yields the list): each launch
    through a Launcher (a Launch; None for a launch Numba packed) and each allocation that
    numba_flash.arrays.empty_device takes from a framework's pool (its DeviceView, with
    pool_owner). The list holds them, and so the memory of each, until it is dropped. With
    on=False it lists nothing and yields None. Nothing is listed on the simulator (it
    launches through Numba)."""
    if not on:
        yield None
        return
    outer = getattr(_recording, "events", None)
    _recording.events = events = []
    try:
        yield events
    finally:
        _recording.events = outer


def note(event):
    """List `event` in the innermost recording() of this thread, if any."""
    events = getattr(_recording, "events", None)
    if events is not None:
        events.append(event)


_compile_lock = threading.RLock()


class Launcher:
    """dispatcher as launcher[grid, block](*args) or launcher[grid, block, stream](*args),
    with `nbytes` of dynamic shared memory (module docstring). check, if given, is called
    with the launch arguments first (to reject arrays the kernel cannot take, e.g. misaligned
    ones for vector loads). Attributes it does not have are the dispatcher's (py_func,
    targetoptions, compile, ...), so tools that read a kernel read it through its launcher."""

    # launches packed by Numba's own launch (an argument of a kind _packer does not take),
    # over the process: the API's calls on torch and CuPy arrays make none (tests/test_launch.py)
    numba_launches = 0

    def __init__(self, dispatcher, nbytes=0, check=None):
        if isinstance(dispatcher, Launcher):
            dispatcher = dispatcher.kernel
        self.kernel = dispatcher
        self.nbytes = int(nbytes)
        self.check = check
        self._compiled = {}     # (context, argument keys) -> (kernel, cuda.core kernel, packers)
        self._configs = {}      # (grid, block) as given -> _launch_config's

    def __getattr__(self, name):
        if name == "kernel":                # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, config):
        if not 2 <= len(config) <= 3:
            raise ValueError(f"launch as launcher[grid, block] or [grid, block, stream] (the "
                             f"dynamic shared memory is the launcher's, {self.nbytes} bytes), "
                             f"got {len(config)} values")
        grid, block, stream = (*config, 0)[:3]
        # (hashable: a launch's normalized dimensions are kept by them)
        grid, block = (tuple(x) if isinstance(x, list) else x for x in (grid, block))

        def launch(*args):
            if self.check is not None:
                self.check(args)
            if SIMULATOR:
                self.kernel[grid, block, stream, self.nbytes](*args)
            else:
                self.launch(args, grid, block, stream)
        return launch

    def specialization(self, args):
        """(compiled Numba kernel, its cuda.core kernel, packers or None) for these
        arguments in the current CUDA context: compiled, loaded and opted in on first use,
        under one lock."""
        key = (current_context(), tuple(map(arg_key, args)))
        entry = self._compiled.get(key)
        if entry is not None:
            return entry
        with _compile_lock:
            entry = self._compiled.get(key)
            if entry is None:
                entry = self._load(args)
                self._compiled[key] = entry
        return entry

    def _load(self, args):
        sig = tuple(self.kernel.typeof_pyval(a) for a in args)
        kern = self.kernel.compile(sig)
        cufunc = kern._codelibrary.get_cufunc()
        if self.nbytes > SHARED_MEMORY_BYTES:
            from numba.cuda.cudadrv.driver import binding, driver
            attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            driver.cuKernelSetAttribute(attr, self.nbytes, cufunc.handle, cufunc.device.id)
        packers = tuple(_packer(t, a) for t, a in zip(sig, args))
        if None in packers or kern.debug or kern.cooperative:
            packers = None
        return kern, cufunc.kernel, packers

    def launch(self, args, grid, block, stream=0):
        """Launch on the GPU (what launcher[grid, block, stream](*args) does after check)."""
        from cuda.core import launch
        kern, cukernel, packers = self.specialization(args)
        dims = self._configs.get((grid, block))
        if dims is None:
            dims = _launch_config(grid, block, self.nbytes)
            if len(self._configs) >= 1024:      # a process that met many shapes
                self._configs.clear()
            self._configs[(grid, block)] = dims
        grid, block, config = dims
        events = getattr(_recording, "events", None)       # (recording())
        if packers is None:
            Launcher.numba_launches += 1
            kern.launch(args, grid, block, _core_stream(stream), self.nbytes)
            if events is not None:
                events.append(None)
            return
        packed, starts = [], []
        for pack, a in zip(packers, args):
            starts.append(len(packed))
            pack(a, packed)
        core_stream = _core_stream(stream)
        launch(core_stream, config, cukernel, *packed)
        if events is not None:
            events.append(Launch(cukernel, config, core_stream, tuple(args), tuple(packed),
                                 tuple(starts)))


def current_context():
    """The current CUDA context's handle (an int), made current as Numba makes it when there
    is none: what a loaded kernel belongs to. cuCtxGetCurrent alone, where Numba's
    get_context() took a lock and several driver calls at every launch."""
    from cuda.bindings import driver
    err, ctx = driver.cuCtxGetCurrent()
    handle = int(ctx) if err == driver.CUresult.CUDA_SUCCESS and ctx is not None else 0
    if not handle:
        from numba.cuda.cudadrv import devices
        handle = int(devices.get_context().handle)
    return handle


def _launch_config(grid, block, nbytes):
    """(grid, block, cuda.core's LaunchConfig) of a launch as Numba takes grid and block
    (ints or tuples of up to three), the first two as Numba normalizes them."""
    from cuda.core import LaunchConfig
    from numba.cuda.errors import normalize_kernel_dimensions
    grid, block = normalize_kernel_dimensions(grid, block)
    return grid, block, LaunchConfig(grid=grid, block=block, shmem_size=nbytes)


_core_streams = {}      # (context, CUstream handle) -> cuda.core's Stream over it


def _core_stream(stream):
    """cuda.core's Stream of a Numba stream or 0 (the default stream), one wrapper a handle
    and context: Numba's _to_core_stream makes a new one at every call."""
    from numba.cuda.cudadrv.driver import Stream, _to_core_stream
    if stream and type(stream) is not Stream:
        return _to_core_stream(stream)
    key = (current_context(), int(stream.handle or 0) if stream else 0)
    core = _core_streams.get(key)
    if core is None:
        if len(_core_streams) >= 64:        # a process that made many streams
            _core_streams.clear()
        core = _core_streams[key] = _to_core_stream(stream)
    return core
