"""Is there a real CUDA GPU? Answered without importing numba.cuda, so that the answer can
decide NUMBA_ENABLE_CUDASIM, which numba reads once, at its first import of numba.cuda."""

import ctypes
import os
import sys
import warnings


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


def simulator_on():
    """Whether NUMBA_ENABLE_CUDASIM asks for Numba's CUDA simulator (as numba reads it)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def use_simulator_without_gpu():
    """Turn on Numba's CUDA simulator when no GPU is present and the user has not chosen.

    Must run before numba.cuda is first imported. Returns True when the simulator is on.
    If numba.cuda was imported first (the simulator off) on a machine without a GPU it is too
    late: numba.cuda is bound to the real driver, and setting the variable now would make
    later compilations half simulator (numba re-reads it when it compiles), failing with
    errors about FakeCUDAKernel. Then nothing changes, a RuntimeWarning says what to do, and
    the answer is False (the kernels cannot run in this process).
    """
    if "NUMBA_ENABLE_CUDASIM" not in os.environ and not cuda_gpu_present():
        if "numba.cuda" in sys.modules:
            warnings.warn("numba.cuda was imported before numba_flash and there is no CUDA GPU, "
                          "so the kernels cannot run in this process: import numba_flash "
                          "first, or set NUMBA_ENABLE_CUDASIM=1 before importing numba, to run "
                          "them on Numba's CUDA simulator", RuntimeWarning, stacklevel=3)
            return False
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return simulator_on()


def gpu_missing(what):
    """True, after a message on stderr naming `what`, when this process runs on Numba's CUDA
    simulator: for the commands and tools that time, profile or probe a real GPU, which on the
    simulator would run for minutes and measure nothing."""
    # (numba_flash, a parent of this module, has already set the variable when it had to)
    simulator = simulator_on()
    if simulator:
        print(f"{what} needs a CUDA GPU; none was found (this process runs on Numba's CUDA "
              "simulator)", file=sys.stderr)
    return simulator


def require_gpu(what):
    """Exit (status 2) where gpu_missing(what): for the lab tools' scripts."""
    if gpu_missing(what):
        sys.exit(2)
