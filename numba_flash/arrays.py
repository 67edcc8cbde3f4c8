"""Array adaptation: NumPy arrays, Numba device arrays, CuPy arrays and PyTorch CUDA tensors.

Device inputs are used in place through __cuda_array_interface__; results come back as the
same kind of array as the inputs. NumPy inputs are copied to the GPU and results back.
Half precision: float16 (NumPy, CuPy, torch) and bfloat16 (torch, and NumPy through
ml_dtypes); a bfloat16 array is handed to Numba as its 16-bit patterns (device_view).

Streams: the kernels run on the stream of the inputs' framework (`launch_stream`): torch's
current stream for torch tensors, CuPy's for CuPy arrays, the default stream otherwise; so
they are ordered after the work that made their inputs on that stream and before the work
that reads their outputs there. Outputs and workspace come from that framework's caching
allocator, on that stream.
"""

import contextlib
import math
import sys
import threading

import ml_dtypes
import numpy as np

from .kernels.launch import DeviceView, note

BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
# the half formats' storage on the device: float16 as it is; bfloat16 as its 16-bit patterns
# (int16), the __cuda_array_interface__ having no bfloat16 type
BFLOAT16_BITS = np.dtype(np.int16)


def kind_of(x):
    """'torch', 'cupy', 'numba' (a device array) or 'numpy'."""
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        return "torch"
    if mod == "cupy":
        return "cupy"
    if hasattr(x, "__cuda_array_interface__") or type(x).__name__ == "FakeCUDAArray":
        return "numba"
    return "numpy"


def dtype_of(name, x):
    """NumPy dtype of any supported array kind (bfloat16 as ml_dtypes'); TypeError naming the
    argument for a torch dtype NumPy has no name for (float8 and the like)."""
    kind = kind_of(x)
    if kind == "torch":
        tname = str(x.dtype).replace("torch.", "")
        if not x.is_cuda:
            raise ValueError(f"{name}: torch tensors must be on a CUDA device, got {x.device}")
        if tname == "bfloat16":
            return BFLOAT16
        try:
            return np.dtype(tname)
        except TypeError:
            raise TypeError(f"{name}: torch.{tname} is not supported (float16, bfloat16, "
                            f"float32 and float64 are)") from None
    if kind == "numpy" and not isinstance(x, np.ndarray):
        x = np.asarray(x)
    return np.dtype(x.dtype)


def device_dtype(dtype):
    """The dtype of a `dtype` array as Numba holds it: bfloat16 as int16 patterns."""
    return BFLOAT16_BITS if np.dtype(dtype) == BFLOAT16 else np.dtype(dtype)


def shape_of(x):
    return tuple(x.shape)


def device_of(x):
    """A hashable name of the device holding x: 'host', or ('cuda', ordinal)."""
    kind = kind_of(x)
    if kind == "torch":
        return ("cuda", x.device.index)
    if kind == "cupy":
        return ("cuda", x.device.id)
    if kind == "numba":
        return ("cuda", _numba_device_ordinal(x))
    return "host"


def _numba_device_ordinal(x):
    try:
        from numba import cuda
        return cuda.get_current_device().id
    except Exception:  # the simulator
        return 0


def is_c_contiguous(x):
    kind = kind_of(x)
    if kind == "torch":
        return x.is_contiguous()
    if kind in ("cupy", "numpy"):
        return x.flags.c_contiguous
    return x.is_c_contiguous()


def check_stored(name, x):
    """ValueError unless the kernels can read device array x as stored: C-contiguous, and of a
    torch tensor no negative bit (torch._neg_view's lazy negation: its memory holds -x, which
    the kernels would read as x). NumPy arrays are copied to the device, so any layout does."""
    kind = kind_of(x)
    if kind == "numpy":
        return
    if not is_c_contiguous(x):
        raise ValueError(f"{name} is a non-contiguous device array; pass a contiguous copy "
                         f"(e.g. .contiguous() in torch, cupy.ascontiguousarray)")
    if kind == "torch" and x.is_neg():
        raise ValueError(f"{name} has torch's negative bit set (a lazy negation); pass "
                         f"{name}.resolve_neg()")


def launch_stream(like):
    """(pointer, stream): the CUDA stream the kernels for input `like` run on, as its raw
    pointer (0: the legacy default stream) and as what a Numba launch takes
    (kernel[grid, block, stream]): torch's current stream on like's device for a torch tensor,
    CuPy's current stream for a CuPy array (cuda.external_stream over it), the default stream
    for anything else and on the simulator."""
    kind = kind_of(like)
    if kind == "torch" and like.is_cuda:
        import torch
        ptr = torch.cuda.current_stream(like.device).cuda_stream
    elif kind == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            ptr = cupy.cuda.get_current_stream().ptr
    else:
        ptr = 0
    if not ptr:
        return 0, 0
    stream = _external_streams.get(ptr)
    if stream is None:
        from numba import cuda
        if len(_external_streams) >= 64:        # a process that made many streams
            _external_streams.clear()
        stream = _external_streams.setdefault(ptr, cuda.external_stream(ptr))
    return ptr, stream


# Numba's wrappers of the streams launch_stream has met, by pointer: a wrapper holds the
# handle only (no context), and making one per call took a context lookup each time
_external_streams = {}


def to_device(x, shape3, stream_ptr=0, as_dtype=None):
    """x as a Numba device array of shape shape3 (a view where x lives on the GPU already),
    for kernels launched on the stream of pointer stream_ptr (launch_stream); a bfloat16 x as
    its int16 patterns; as_dtype: viewed as that dtype (the same item size: uint16 for the
    16-bit kernels' patterns)."""
    from numba import cuda
    kind = kind_of(x)
    if kind == "numpy":
        x = np.ascontiguousarray(x)
        if x.dtype == BFLOAT16:
            x = x.view(BFLOAT16_BITS)
        d_x = cuda.to_device(x.reshape(shape3))
    elif kind == "numba":
        d_x = x.reshape(shape3)
    else:
        if kind == "torch" and x.dtype == _torch_bfloat16():
            x = x.view(_torch_dtype(BFLOAT16_BITS))
        return _import(x, shape3, as_dtype, stream_ptr)
    return d_x if as_dtype is None else d_x.view(as_dtype)


def _import(x, shape, as_dtype, stream_ptr, sync=None):
    """A view of x, a C-contiguous device array with a __cuda_array_interface__ (torch,
    CuPy), of `shape` (the same size) and as_dtype (None: x's; else of x's item size), as a
    kernels.launch.DeviceView: the interface read once, no Numba device array made (making
    one, with its context checks and memory object, was most of an import's 14.8 us and
    numba's launch made one more of it: 2026-12-04, tools/call_time.py). sync: None for
    _must_sync's answer on its stream; when true, the host waits for that stream here, as
    Numba's import would."""
    view = _torch_view(x, shape, as_dtype)
    if view is not None:
        return view
    desc = x.__cuda_array_interface__
    typestr = desc["typestr"]
    item = np.dtype(typestr).itemsize
    dtype = np.dtype(typestr if as_dtype is None else as_dtype)
    if dtype.itemsize != item or math.prod(shape) != math.prod(desc["shape"]):
        raise ValueError(f"cannot view {desc['shape']} {typestr} as {shape} {dtype}")
    if desc.get("strides") is not None and not is_c_contiguous(x):
        raise ValueError("a non-contiguous device array cannot be viewed with another shape")
    if sync is None:
        sync = _must_sync(desc.get("stream"), stream_ptr)
    if sync and desc.get("stream") is not None:
        from numba import cuda
        from numba.cuda import config
        if config.CUDA_ARRAY_INTERFACE_SYNC:
            cuda.external_stream(desc["stream"]).synchronize()
    return DeviceView(desc["data"][0], shape, dtype, owner=x)


def _torch_view(x, shape, as_dtype):
    """_import's answer for a plain torch CUDA tensor (dense, contiguous, no grad required),
    read from the tensor itself; None for anything else (the interface's path then decides,
    errors included). torch's __cuda_array_interface__ (version 2) names no stream, so there
    is nothing to synchronize; building it (a dict, a type string parsed back by NumPy) took
    5.8 of an import's 17.3 us on the H200's host (tools/call_time.py, 2026-12-04)."""
    torch = torch_module()
    if (torch is None or type(x) is not torch.Tensor or not x.is_cuda or x.requires_grad
            or x.layout is not torch.strided or not x.is_contiguous()):
        return None
    dtype = _numpy_of_torch().get(x.dtype)
    if dtype is None:
        return None
    if as_dtype is not None:
        as_dtype = np.dtype(as_dtype)
        if as_dtype.itemsize != dtype.itemsize:
            return None                 # the interface's path raises the error
        dtype = as_dtype
    if math.prod(shape) != x.numel():
        return None
    return DeviceView(x.data_ptr() if x.numel() else 0, shape, dtype, owner=x)


def torch_module():
    """torch if it is imported already (an input can only be a torch tensor then), else None."""
    return sys.modules.get("torch")


_NUMPY_OF_TORCH = {}     # torch dtype -> NumPy dtype, of the dtypes _torch_view reads


def _numpy_of_torch():
    if not _NUMPY_OF_TORCH:
        torch = torch_module()
        _NUMPY_OF_TORCH.update({getattr(torch, n): np.dtype(n) for n in
                                ("float16", "float32", "float64", "int16", "uint16")
                                if hasattr(torch, n)})
    return _NUMPY_OF_TORCH


def _torch_bfloat16():
    import torch
    return torch.bfloat16


def _torch_dtype(dtype):
    """torch's dtype of the same name as NumPy's `dtype` (kept a dtype: a NumPy dtype's name
    is made in Python at every read)."""
    found = _TORCH_OF_NUMPY.get(dtype)
    if found is None:
        import torch
        found = getattr(torch, np.dtype(dtype).name)
        if isinstance(dtype, np.dtype):
            _TORCH_OF_NUMPY[dtype] = found
    return found


_TORCH_OF_NUMPY = {}


def _must_sync(stream, stream_ptr=0):
    """Whether `stream`, the one an array's __cuda_array_interface__ names (its "stream"
    entry), must be synchronized (the host waits) before our kernels on stream stream_ptr read
    the array; Numba does so for every import by default. Not when it names no stream (None)
    or the one our kernels run on: they are ordered after its work already (CAI's 1 is the
    legacy default stream, pointer 0, unless Numba is configured for per-thread default
    streams). That sync made the host wait for the GPU at every call, so a forward+backward
    could not queue the backward while the forward ran."""
    from numba.cuda import config
    if stream is None or stream == stream_ptr:
        return False
    return not (stream == 1 and stream_ptr == 0 and not config.CUDA_PER_THREAD_DEFAULT_STREAM)


class AllocationMeter:
    """Counts the device bytes that numba-flash allocates (outputs and workspace such as D)
    while it is active: `with AllocationMeter() as meter: ...; meter.bytes`. The benchmark
    reports this as numba-flash's extra device memory; inputs passed in are not counted."""
    active = []

    def __enter__(self):
        self.bytes = 0
        AllocationMeter.active.append(self)
        return self

    def __exit__(self, *exc):
        AllocationMeter.active.remove(self)
        return False


_allocating = threading.local()


@contextlib.contextmanager
def allocating_like(x):
    """Within it, empty_device without `like` allocates as with like=x: the API runs its
    kernels' launchers so, so that their workspace (D, the backward's row sums) comes from the
    same pool as the outputs."""
    stack = _allocating.__dict__.setdefault("stack", [])
    stack.append(x)
    try:
        yield
    finally:
        stack.pop()


def empty_device(shape, dtype, like=None, as_dtype=None):
    """An uninitialized Numba device array of `dtype` (bfloat16: its int16 patterns; as_dtype:
    viewed as that dtype of the same item size, e.g. uint16 patterns for the 16-bit kernels);
    like (default: the innermost allocating_like's): an input whose kind says who allocates it
    (torch and CuPy from their caching pools, as a view, where Numba calls cuMemAlloc and
    later frees each time: 0.5-1.1 ms for three 128 MiB outputs on an H200, 2026-12-02)."""
    from numba import cuda
    if like is None and getattr(_allocating, "stack", None):
        like = _allocating.stack[-1]
    kind = kind_of(like) if like is not None else "numba"
    # A pool hands a freed block to the next allocation on its current stream without
    # waiting: safe because our kernels run on that stream too (launch_stream), so a
    # workspace such as D, freed as soon as its kernels are queued, is reused only after them
    dtype = np.dtype(dtype)
    if kind == "torch" and like.is_cuda:
        import torch
        owner = torch.empty(shape, dtype=_torch_dtype(dtype), device=like.device)
        view = owner.view(_torch_dtype(BFLOAT16_BITS)) if dtype == BFLOAT16 else owner
    elif kind == "cupy" and dtype != BFLOAT16:
        import cupy
        with cupy.cuda.Device(like.device.id):
            owner = view = cupy.empty(shape, dtype=dtype)
    else:
        owner = None
    if owner is None:
        arr = cuda.device_array(shape, dtype=device_dtype(dtype))
        if as_dtype is not None:
            arr = arr.view(as_dtype)
    else:
        # new memory: nothing to wait for
        arr = _import(view, shape, as_dtype, 0, sync=False)
        arr.pool_owner = owner      # from_device returns it: the pool's own tensor or array
        note(arr)                   # (listed where a call is recorded: numba_flash.replay)
    for meter in AllocationMeter.active:
        meter.bytes += arr.nbytes
    return arr


def from_device(d_arr, shape, like):
    """A device result returned as the kind of array `like` is, with the given shape: for torch
    and CuPy the pool's own tensor or array that empty_device allocated (so that, say,
    Tensor.record_stream works on it), reshaped."""
    kind = kind_of(like)
    owner = getattr(d_arr, "pool_owner", None)
    if owner is not None and kind in ("torch", "cupy"):
        return owner.reshape(shape)
    d_arr = d_arr.reshape(shape)
    if d_arr.dtype == np.uint16:    # 16-bit patterns (empty_device's as_dtype): like's type
        d_arr = d_arr.view(device_dtype(dtype_of("like", like)))
    if kind == "numpy":
        host = d_arr.copy_to_host()
        # int16 patterns of a bfloat16 result (the inputs are bfloat16; lse is float32)
        bits = host.dtype == BFLOAT16_BITS and dtype_of("like", like) == BFLOAT16
        return host.view(BFLOAT16) if bits else host
    if kind == "cupy":
        import cupy
        return cupy.asarray(d_arr)
    if kind == "torch":
        import torch
        return torch.as_tensor(d_arr, device=like.device)
    return d_arr
