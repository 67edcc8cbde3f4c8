"""Is there a real CUDA GPU? Answered without importing numba.cuda, so that the answer can
decide NUMBA_ENABLE_CUDASIM, which numba reads once, at its first import of numba.cuda."""

import ctypes
import os


def cuda_gpu_present():
    """True when the CUDA driver loads and reports at least one device."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    count = ctypes.c_int(0)
    if libcuda.cuInit(0) != 0 or libcuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return False
    return count.value > 0


def use_simulator_without_gpu():
    """Turn on Numba's CUDA simulator when no GPU is present and the user has not chosen.

    Must run before numba.cuda is first imported. Returns True when the simulator is on.
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not cuda_gpu_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
